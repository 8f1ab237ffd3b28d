/* mul_mat.cu: y = W x for every dtype (one kernel template over the dtype traits), dense or gathered
 * over a row map with a score threshold, and the q8_0 quantization of activations.
 *
 * One warp per weight row: lane l takes units l, l+32, ... of the row, applies each unit to up to
 * NT tokens while it is in registers, and the warp sums. With a row map (the sparse form), row j
 * writes output row row_map[j] and is skipped for tokens whose score is below the threshold
 * (output 0), and entirely when no token of its tile needs it. */
#include "dtype.cuh"

#define MM_WARPS 4        /* rows per block */

/* q8_0 quantization of activation rows, bit-identical to the CPU's (Q8_0S: d = amax / 127,
 * q = rint(x * (127 / amax)), ties to even). */
__global__ void k_quantize_q8_0(const char *__restrict__ x, int64_t x_nb1, int64_t nblk,
                                pi_dblock_q8_0 *__restrict__ out) {
    const int lane = threadIdx.x % PI_WARP;
    const int64_t ib = (int64_t)blockIdx.x * (blockDim.x / PI_WARP) + threadIdx.x / PI_WARP;
    const int64_t t = blockIdx.y;
    if (ib >= nblk) return;
    const float v = ((const float *)(x + t * x_nb1))[ib * 32 + lane];
    const float amax = pi_warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    pi_dblock_q8_0 *b = out + t * nblk + ib;
    b->qs[lane] = (int8_t)rintf(v * id);
    if (lane == 0) b->d = pi_f2h(d);
}

template <class T, int NT, bool RELU>
__global__ void k_mul_mat(const char *__restrict__ w, int64_t w_nb1, int64_t n_rows, int64_t nblk,
                          const char *__restrict__ x, int64_t x_nb1, int64_t n_tok,
                          char *__restrict__ y, int64_t y_nb1,
                          const int32_t *__restrict__ row_map, const char *__restrict__ scores, int64_t s_nb1,
                          float thr) {
    typedef typename T::block_t block_t;
    typedef typename T::act_t act_t;
    const int lane = threadIdx.x % PI_WARP;
    const int64_t r = (int64_t)blockIdx.x * MM_WARPS + threadIdx.x / PI_WARP;
    if (r >= n_rows) return;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int64_t orow = row_map ? row_map[r] : r;
    bool act[NT];
    bool any = false;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        act[t] = t0 + t < n_tok && (!scores || ((const float *)(scores + (t0 + t) * s_nb1))[orow] >= thr);
        any |= act[t];
    }
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (any) {
        const block_t *wr = (const block_t *)(w + r * w_nb1);
        for (int64_t ib = lane; ib < nblk; ib += PI_WARP) {
            const block_t wb = wr[ib];
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (act[t]) acc[t] += T::dot(wb, ((const act_t *)(x + (t0 + t) * x_nb1))[ib]);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = pi_warp_sum(acc[t]);
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t0 + t >= n_tok) break;
            float v = act[t] ? acc[t] : 0.0f;
            if (RELU) v = v > 0.0f ? v : 0.0f;
            ((float *)(y + (t0 + t) * y_nb1))[orow] = v;
        }
    }
}

size_t pi_cuda_mul_mat_scratch(int32_t wtype, int64_t K, int64_t T) {
    if (wtype != PI_TYPE_Q4_0 && wtype != PI_TYPE_Q8_0) return 0;
    return (size_t)(K / 32) * sizeof(pi_dblock_q8_0) * (size_t)T;
}

pi_status pi_cuda_quantize_q8_0(cudaStream_t st, const pi_tensor *x, void *q) {
    const int64_t nblk = x->ne[0] / 32;
    const dim3 grid((unsigned)pi_ceil_div(nblk, 8), (unsigned)x->ne[1]);
    k_quantize_q8_0<<<grid, 8 * PI_WARP, 0, st>>>((const char *)x->data, x->nb[1], nblk, (pi_dblock_q8_0 *)q);
    PI_CU_LAUNCH("quantize_q8_0");
    return PI_OK;
}

template <class T, int NT>
static pi_status launch_mul_mat(cudaStream_t st, const pi_tensor *w, const pi_tensor *x, pi_tensor *y,
                                const int32_t *row_map, const pi_tensor *scores, float thr, bool relu,
                                void *scratch) {
    const int64_t K = w->ne[0], N = w->ne[1], Tn = x->ne[1];
    const char *xa = (const char *)x->data;
    int64_t x_nb1 = x->nb[1];
    if (T::QUANT_ACT) {
        if (!scratch) return pi_fail(PI_ERR_INVALID_ARG, "GPU mul_mat: %s weights need scratch", pi_type_name(T::TYPE));
        PI_TRY(pi_cuda_quantize_q8_0(st, x, scratch));
        xa = (const char *)scratch;
        x_nb1 = (K / 32) * (int64_t)sizeof(pi_dblock_q8_0);
    }
    const dim3 grid((unsigned)pi_ceil_div(N, MM_WARPS), (unsigned)pi_ceil_div(Tn, NT));
    const char *sc = scores ? (const char *)scores->data : NULL;
    const int64_t s_nb1 = scores ? scores->nb[1] : 0;
    if (relu)
        k_mul_mat<T, NT, true><<<grid, MM_WARPS * PI_WARP, 0, st>>>((const char *)w->data, w->nb[1], N, K / T::QK, xa,
                                                                   x_nb1, Tn, (char *)y->data, y->nb[1], row_map, sc,
                                                                   s_nb1, thr);
    else
        k_mul_mat<T, NT, false><<<grid, MM_WARPS * PI_WARP, 0, st>>>((const char *)w->data, w->nb[1], N, K / T::QK, xa,
                                                                    x_nb1, Tn, (char *)y->data, y->nb[1], row_map, sc,
                                                                    s_nb1, thr);
    PI_CU_LAUNCH("mul_mat");
    return PI_OK;
}

pi_status pi_cuda_mul_mat_ex(pi_cuda_stream *s, const pi_tensor *w, const pi_tensor *x, pi_tensor *y,
                             const int32_t *row_map_dev, const pi_tensor *scores, float threshold, int32_t relu,
                             void *scratch) {
    const int64_t K = w->ne[0], Tn = x->ne[1];
    if (Tn < 1 || Tn > 65535) return pi_fail(PI_ERR_INVALID_ARG, "GPU mul_mat: %lld tokens (1..65535)", (long long)Tn);
    const bool vec = pi_cuda_vec_ok(w->type, w->data, K, w->nb[1]) && (uintptr_t)x->data % 16 == 0 &&
                     x->nb[1] % 16 == 0;
    cudaStream_t st = pi_cuda_raw_stream(s);
    return pi_cuda_dispatch_type(w->type, vec, [&](auto tr) -> pi_status {
        typedef decltype(tr) T;
        if (K % T::QK) return pi_fail(PI_ERR_INVALID_ARG, "GPU mul_mat: K = %lld", (long long)K);
        if (Tn == 1) return launch_mul_mat<T, 1>(st, w, x, y, row_map_dev, scores, threshold, relu != 0, scratch);
        return launch_mul_mat<T, 8>(st, w, x, y, row_map_dev, scores, threshold, relu != 0, scratch);
    });
}

pi_status pi_cuda_mul_mat(pi_cuda_stream *s, const pi_tensor *w, const pi_tensor *x, pi_tensor *y, void *scratch) {
    return pi_cuda_mul_mat_ex(s, w, x, y, NULL, NULL, 0.0f, 0, scratch);
}
