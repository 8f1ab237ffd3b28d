/* sparse_ffn.cu: PowerInfer's FFN over the hot rows that live on the GPU.
 *
 *   h[j, t]   = act(gate_j . x_t) * (up_j . x_t)      for hot row j whose neuron bucket[j] is active
 *               for token t (scores[bucket[j], t] >= threshold), else 0        (k_ffn_hidden)
 *   out[:, t] = sum_j h[j, t] * down_t[j, :]                                      (k_axpy_sparse)
 *
 * Rows are compact: row j of the hot gate/up/down_t matrices is neuron bucket[j] (ascending), so
 * the CPU can skip exactly those neurons and the two partial sums add up to the whole FFN. A layer
 * that is entirely on the GPU passes its original matrices with bucket NULL.
 *
 * The axpy splits the output columns between blocks (a thread per column, reading element c of
 * each row through the dtype traits) and the rows into R chunks; each chunk writes its own partial
 * vector and a second kernel adds the R partials in chunk order. No atomics: results are
 * reproducible run to run. Rows whose h is zero for every token of the tile are skipped. */
#include "axpy_chunks.h"   /* AXPY_COLS, AXPY_NT, the row chunks (shared with stub.c) */
#include "dtype.cuh"

#define FFN_WARPS   4      /* hot rows per block in k_ffn_hidden */
#define AXPY_TILE   64     /* rows staged in shared memory at a time */

template <class T, int NT>
__global__ void k_ffn_hidden(const char *__restrict__ gate, int64_t g_nb1, const char *__restrict__ up, int64_t u_nb1,
                             int64_t k, int64_t nblk, const char *__restrict__ x, int64_t x_nb1, int64_t n_tok,
                             const int32_t *__restrict__ bucket, const char *__restrict__ scores, int64_t s_nb1,
                             float thr, int act_fn, int mode, float *__restrict__ h,
                             unsigned long long *__restrict__ n_active) {
    typedef typename T::block_t block_t;
    typedef typename T::act_t act_t;
    const int lane = threadIdx.x % PI_WARP;
    const int64_t j = (int64_t)blockIdx.x * FFN_WARPS + threadIdx.x / PI_WARP;
    if (j >= k) return;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int64_t neuron = bucket ? bucket[j] : j;
    bool act[NT];
    int n_act = 0;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        act[t] = t0 + t < n_tok && ((const float *)(scores + (t0 + t) * s_nb1))[neuron] >= thr;
        n_act += act[t];
    }
    float g[NT], u[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) g[t] = u[t] = 0.0f;
    if (n_act) {
        const block_t *ur = (const block_t *)(up + j * u_nb1);
        const block_t *gr = gate ? (const block_t *)(gate + j * g_nb1) : NULL;
        for (int64_t ib = lane; ib < nblk; ib += PI_WARP) {
            const block_t ub = ur[ib];
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (act[t]) u[t] += T::dot(ub, ((const act_t *)(x + (t0 + t) * x_nb1))[ib]);
            if (gr) {
                const block_t gb = gr[ib];
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (act[t]) g[t] += T::dot(gb, ((const act_t *)(x + (t0 + t) * x_nb1))[ib]);
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            u[t] = pi_warp_sum(u[t]);
            if (gr) g[t] = pi_warp_sum(g[t]);
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t0 + t >= n_tok) break;
            float v = 0.0f;
            if (act[t]) {
                if (mode == PI_FFN_PAR) v = pi_dev_activation(act_fn, g[t]) * u[t];
                else if (mode == PI_FFN_SYM) v = pi_dev_activation(act_fn, g[t]) * pi_dev_activation(act_fn, u[t]);
                else v = pi_dev_activation(act_fn, u[t]);
            }
            h[(t0 + t) * k + j] = v;
        }
        if (n_active && n_act) atomicAdd(n_active, (unsigned long long)n_act);
    }
}

/* part[chunk][t][c] (or out directly when R == 1): sum over rows j of the chunk of hv(j, t) * down[j][c],
 * hv(j, t) = h[t][map(j)], zeroed when scores[t][map(j)] < thr. */
template <class T, int NT>
__global__ void k_axpy_sparse(const char *__restrict__ down, int64_t d_nb1, int64_t k, int64_t E,
                              const char *__restrict__ h, int64_t h_nb1, const int32_t *__restrict__ map,
                              const char *__restrict__ scores, int64_t s_nb1, float thr, int64_t n_tok,
                              int64_t rows_per_chunk, float *__restrict__ part, int64_t part_chunk_stride,
                              int64_t part_tok_stride) {
    __shared__ float sh[AXPY_TILE][NT];
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t j0 = (int64_t)blockIdx.y * rows_per_chunk;
    const int64_t j1 = j0 + rows_per_chunk < k ? j0 + rows_per_chunk : k;
    const int64_t t0 = (int64_t)blockIdx.z * NT;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t jt = j0; jt < j1; jt += AXPY_TILE) {
        for (int idx = threadIdx.x; idx < AXPY_TILE * NT; idx += blockDim.x) {
            const int jj = idx / NT, t = idx % NT;
            const int64_t j = jt + jj;
            float v = 0.0f;
            if (j < j1 && t0 + t < n_tok) {
                const int64_t i = map ? map[j] : j;
                v = ((const float *)(h + (t0 + t) * h_nb1))[i];
                if (scores && !(((const float *)(scores + (t0 + t) * s_nb1))[i] >= thr)) v = 0.0f;
            }
            sh[jj][t] = v;
        }
        __syncthreads();
        const int64_t nj = j1 - jt < AXPY_TILE ? j1 - jt : AXPY_TILE;
        if (c < E) {
            for (int jj = 0; jj < nj; jj++) {
                bool any = false;
#pragma unroll
                for (int t = 0; t < NT; t++) any |= sh[jj][t] != 0.0f;
                if (!any) continue;   /* the same decision in every thread of the block */
                const float w = T::get(down + (jt + jj) * d_nb1, c);
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (sh[jj][t] != 0.0f) acc[t] += sh[jj][t] * w;
            }
        }
        __syncthreads();
    }
    if (c < E) {
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t0 + t < n_tok) part[blockIdx.y * part_chunk_stride + (t0 + t) * part_tok_stride + c] = acc[t];
    }
}

__global__ void k_sum_chunks(const float *__restrict__ part, int64_t R, int64_t E, int64_t n_tok,
                             char *__restrict__ out, int64_t o_nb1) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t t = blockIdx.y;
    if (c >= E) return;
    float s = 0.0f;
    for (int64_t r = 0; r < R; r++) s += part[(r * n_tok + t) * E + c];
    ((float *)(out + t * o_nb1))[c] = s;
}

/* Row chunks (axpy_chunks.h): a pure function of (E, k, T), so scratch sizes and results depend on
 * the shapes only. */
static int64_t axpy_chunks(int64_t E, int64_t k, int64_t T) { return pi_axpy_chunks(E, k, T); }

size_t pi_cuda_axpy_sparse_scratch(int64_t E, int64_t k, int64_t T) { return pi_axpy_partials_bytes(E, k, T); }

template <class T, int NT>
static pi_status launch_axpy(cudaStream_t st, const pi_tensor *down, const int32_t *map, const char *h, int64_t h_nb1,
                             const pi_tensor *scores, float thr, pi_tensor *out, void *scratch) {
    const int64_t E = down->ne[0], k = down->ne[1], Tn = out->ne[1];
    const int64_t R = axpy_chunks(E, k, Tn), rows = pi_ceil_div(k, R);
    const dim3 grid((unsigned)pi_ceil_div(E, AXPY_COLS), (unsigned)R, (unsigned)pi_ceil_div(Tn, NT));
    const char *sc = scores ? (const char *)scores->data : NULL;
    const int64_t s_nb1 = scores ? scores->nb[1] : 0;
    if (R == 1) {
        k_axpy_sparse<T, NT><<<grid, AXPY_COLS, 0, st>>>((const char *)down->data, down->nb[1], k, E, h, h_nb1, map, sc,
                                                         s_nb1, thr, Tn, rows, (float *)out->data, 0,
                                                         out->nb[1] / (int64_t)sizeof(float));
        PI_CU_LAUNCH("axpy_sparse");
        return PI_OK;
    }
    if (!scratch) return pi_fail(PI_ERR_INVALID_ARG, "GPU axpy_sparse: scratch is NULL");
    float *part = (float *)scratch;
    k_axpy_sparse<T, NT><<<grid, AXPY_COLS, 0, st>>>((const char *)down->data, down->nb[1], k, E, h, h_nb1, map, sc,
                                                     s_nb1, thr, Tn, rows, part, Tn * E, E);
    PI_CU_LAUNCH("axpy_sparse");
    k_sum_chunks<<<dim3((unsigned)pi_ceil_div(E, 256), (unsigned)Tn), 256, 0, st>>>(part, R, E, Tn, (char *)out->data,
                                                                                   out->nb[1]);
    PI_CU_LAUNCH("sum_chunks");
    return PI_OK;
}

static pi_status axpy_dispatch(cudaStream_t st, const pi_tensor *down, const int32_t *map, const char *h,
                               int64_t h_nb1, const pi_tensor *scores, float thr, pi_tensor *out, void *scratch) {
    const int64_t Tn = out->ne[1];
    if (Tn < 1 || pi_ceil_div(Tn, pi_axpy_nt(Tn)) > 65535)
        return pi_fail(PI_ERR_INVALID_ARG, "GPU axpy_sparse: %lld tokens", (long long)Tn);
    return pi_cuda_dispatch_type(down->type, false, [&](auto tr) -> pi_status {
        typedef decltype(tr) T;
        if (Tn == 1) return launch_axpy<T, 1>(st, down, map, h, h_nb1, scores, thr, out, scratch);
        return launch_axpy<T, AXPY_NT>(st, down, map, h, h_nb1, scores, thr, out, scratch);
    });
}

pi_status pi_cuda_axpy_sparse(pi_cuda_stream *s, const pi_tensor *down, const int32_t *bucket_dev, const pi_tensor *h,
                              const pi_tensor *scores, float threshold, pi_tensor *out, void *scratch) {
    return axpy_dispatch(pi_cuda_raw_stream(s), down, bucket_dev, (const char *)h->data, h->nb[1], scores, threshold,
                         out, scratch);
}

/* ---- the fused GPU half of the FFN ---- */

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

size_t pi_cuda_sparse_ffn_scratch(const pi_sparse_ffn_weights *w_hot, int64_t E, int64_t k, int64_t T) {
    return align256(pi_cuda_mul_mat_scratch(w_hot->up.type, E, T)) +   /* q8_0 activations */
           align256((size_t)(k * T) * sizeof(float)) +                   /* h [T][k] */
           align256(pi_cuda_axpy_sparse_scratch(E, k, T));               /* axpy partials */
}

template <class T, int NT>
static pi_status launch_hidden(cudaStream_t st, const pi_sparse_ffn_weights *w, const int32_t *bucket, int32_t act,
                               int32_t mode, const char *x, int64_t x_nb1, int64_t Tn, const pi_tensor *scores,
                               float thr, float *h, unsigned long long *n_active) {
    const int64_t E = w->up.ne[0], k = w->up.ne[1];
    const dim3 grid((unsigned)pi_ceil_div(k, FFN_WARPS), (unsigned)pi_ceil_div(Tn, NT));
    const bool gated = mode != PI_FFN_SEQ;
    k_ffn_hidden<T, NT><<<grid, FFN_WARPS * PI_WARP, 0, st>>>(
        gated ? (const char *)w->gate.data : NULL, gated ? w->gate.nb[1] : 0, (const char *)w->up.data, w->up.nb[1], k,
        E / T::QK, x, x_nb1, Tn, bucket, (const char *)scores->data, scores->nb[1], thr, act, mode, h, n_active);
    PI_CU_LAUNCH("ffn_hidden");
    return PI_OK;
}

pi_status pi_cuda_sparse_ffn(pi_cuda_stream *s, const pi_sparse_ffn_weights *w, const int32_t *bucket_dev, int32_t act,
                             int32_t gate_mode, const pi_tensor *x, const pi_tensor *scores, float threshold,
                             pi_tensor *out, uint64_t *n_active_dev, void *scratch) {
    const int64_t E = x->ne[0], Tn = x->ne[1], k = w->up.ne[1];
    cudaStream_t st = pi_cuda_raw_stream(s);
    if (Tn < 1 || Tn > 65535) return pi_fail(PI_ERR_INVALID_ARG, "GPU sparse_ffn: %lld tokens (1..65535)", (long long)Tn);
    if (gate_mode != PI_FFN_SEQ && w->gate.type != w->up.type)
        return pi_fail(PI_ERR_UNSUPPORTED, "GPU sparse_ffn: gate (%s) and up (%s) must have the same type",
                       pi_type_name(w->gate.type), pi_type_name(w->up.type));
    if (!scratch) return pi_fail(PI_ERR_INVALID_ARG, "GPU sparse_ffn: scratch is NULL");
    if (k == 0) return pi_cuda_memset(s, out->data, 0, (size_t)(out->nb[1] * Tn));
    char *p = (char *)scratch;
    void *xq = p;
    p += align256(pi_cuda_mul_mat_scratch(w->up.type, E, Tn));
    float *h = (float *)p;
    p += align256((size_t)(k * Tn) * sizeof(float));
    void *part = p;
    const bool vec = pi_cuda_vec_ok(w->up.type, w->up.data, E, w->up.nb[1]) &&
                     (gate_mode == PI_FFN_SEQ || pi_cuda_vec_ok(w->gate.type, w->gate.data, E, w->gate.nb[1])) &&
                     (uintptr_t)x->data % 16 == 0 && x->nb[1] % 16 == 0;
    PI_TRY(pi_cuda_dispatch_type(w->up.type, vec, [&](auto tr) -> pi_status {
        typedef decltype(tr) T;
        if (E % T::QK) return pi_fail(PI_ERR_INVALID_ARG, "GPU sparse_ffn: n_embd = %lld", (long long)E);
        const char *xa = (const char *)x->data;
        int64_t x_nb1 = x->nb[1];
        if (T::QUANT_ACT) {
            PI_TRY(pi_cuda_quantize_q8_0(st, x, xq));
            xa = (const char *)xq;
            x_nb1 = E / 32 * (int64_t)sizeof(pi_dblock_q8_0);
        }
        unsigned long long *cnt = (unsigned long long *)n_active_dev;
        if (Tn == 1) return launch_hidden<T, 1>(st, w, bucket_dev, act, gate_mode, xa, x_nb1, Tn, scores, threshold, h, cnt);
        return launch_hidden<T, 8>(st, w, bucket_dev, act, gate_mode, xa, x_nb1, Tn, scores, threshold, h, cnt);
    }));
    /* h is compact [T][k] and already zero for inactive pairs: no map, no scores */
    return axpy_dispatch(st, &w->down_t, NULL, (const char *)h, k * (int64_t)sizeof(float), NULL, 0.0f, out, part);
}
