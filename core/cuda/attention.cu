/* attention.cu: scaled dot-product attention over the KV cache with grouped KV heads (GQA).
 *
 * One block per (query head, token). Phase 1: a warp per KV cell computes q.k (lanes over head_dim)
 * (times the scale; with a softcap, softcap * tanhf(s / softcap), Gemma 2) plus the mask; masked (-inf) cells are
 * skipped. Phase 2: max, exp, sum (with sinks, gpt-oss: the head's sink logit joins the max and the sum as a column
 * without a value). Phase 3: threads over
 * head_dim accumulate p * v over the visible cells in cell order. The scores live in a global
 * scratch [T * n_head][n_kv] (pi_cuda_attention_scratch), so any context length works.
 * K and V are f32 or f16 (the KV cache types). */
#include "dtype.cuh"

#define ATT_THREADS 128

template <class KT, class VT>
__global__ void k_attention(pi_dview q, pi_dview k, pi_dview v, const char *__restrict__ mask, int64_t m_nb1,
                            float scale, float softcap, const float *__restrict__ sinks, pi_dview out,
                            float *__restrict__ scratch) {
    extern __shared__ float qs[];   /* [head_dim] */
    const int64_t H = q.ne[1], hd = q.ne[0], n_kv = k.ne[2], Hkv = k.ne[1];
    const int64_t h = blockIdx.x % H, t = blockIdx.x / H, hk = h / (H / Hkv);
    const int lane = threadIdx.x % PI_WARP, wid = threadIdx.x / PI_WARP, nw = blockDim.x / PI_WARP;
    float *sc = scratch + (int64_t)blockIdx.x * n_kv;
    const float *qr = (const float *)(q.data + h * q.nb[1] + t * q.nb[2]);
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qr[d];
    __syncthreads();
    const float *mrow = mask ? (const float *)(mask + t * m_nb1) : NULL;
    float mx = -INFINITY;
    for (int64_t c = wid; c < n_kv; c += nw) {
        const float m = mrow ? mrow[c] : 0.0f;
        float s = -INFINITY;
        if (m != -INFINITY) {
            const char *kr = k.data + hk * k.nb[1] + c * k.nb[2];
            float dot = 0.0f;
            for (int64_t d = lane; d < hd; d += PI_WARP) dot += KT::get(kr, d) * qs[d];
            s = pi_warp_sum(dot) * scale;
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
            s += m;
        }
        if (lane == 0) sc[c] = s;
        mx = fmaxf(mx, s);
    }
    mx = pi_block_max(mx);      /* includes a __syncthreads: sc is complete */
    if (mx == -INFINITY) {
        for (int64_t d = threadIdx.x; d < hd; d += blockDim.x)
            ((float *)(out.data + h * out.nb[1] + t * out.nb[2]))[d] = 0.0f;
        return;
    }
    if (sinks) mx = fmaxf(mx, sinks[h]);
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < n_kv; c += blockDim.x) {
        const float s = sc[c];
        const float p = s == -INFINITY ? 0.0f : expf(s - mx);
        sc[c] = s == -INFINITY ? -1.0f : p;   /* -1 marks a masked cell */
        sum += p;
    }
    sum = pi_block_sum(sum);    /* synchronizes: sc holds the probabilities */
    if (sinks) sum += expf(sinks[h] - mx);
    const float inv = 1.0f / sum;
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int64_t c = 0; c < n_kv; c++) {
            const float p = sc[c];
            if (p < 0.0f) continue;
            acc += p * inv * VT::get(v.data + hk * v.nb[1] + c * v.nb[2], d);
        }
        ((float *)(out.data + h * out.nb[1] + t * out.nb[2]))[d] = acc;
    }
}

size_t pi_cuda_attention_scratch(int64_t n_head, int64_t T, int64_t n_kv) {
    return (size_t)(n_head * T * n_kv) * sizeof(float);
}

template <class KT, class VT>
static pi_status launch_attention(cudaStream_t st, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                  const pi_tensor *mask, float scale, float softcap, const float *sinks, pi_tensor *out,
                                  void *scratch) {
    const int64_t blocks = q->ne[1] * q->ne[2];
    k_attention<KT, VT><<<(unsigned)blocks, ATT_THREADS, (size_t)q->ne[0] * sizeof(float), st>>>(
        pi_view_of(q), pi_view_of(k), pi_view_of(v), mask ? (const char *)mask->data : NULL, mask ? mask->nb[1] : 0,
        scale, softcap, sinks, pi_view_of(out), (float *)scratch);
    PI_CU_LAUNCH("attention");
    return PI_OK;
}

pi_status pi_cuda_attention(pi_cuda_stream *s, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                            const pi_tensor *mask, float scale, float softcap, const float *sinks, pi_tensor *out,
                            void *scratch) {
    const int64_t blocks = q->ne[1] * q->ne[2];
    if (blocks < 1 || blocks > 0x7fffffff) return pi_fail(PI_ERR_INVALID_ARG, "GPU attention: too many heads x tokens");
    if (q->ne[0] > 8192) return pi_fail(PI_ERR_UNSUPPORTED, "GPU attention: head_dim %lld", (long long)q->ne[0]);
    if (!scratch) return pi_fail(PI_ERR_INVALID_ARG, "GPU attention: scratch is NULL");
    cudaStream_t st = pi_cuda_raw_stream(s);
    const bool k16 = k->type == PI_TYPE_F16, v16 = v->type == PI_TYPE_F16;
    if (k16 && v16) return launch_attention<pi_dt_f16<1>, pi_dt_f16<1>>(st, q, k, v, mask, scale, softcap, sinks, out, scratch);
    if (k16) return launch_attention<pi_dt_f16<1>, pi_dt_f32<1>>(st, q, k, v, mask, scale, softcap, sinks, out, scratch);
    if (v16) return launch_attention<pi_dt_f32<1>, pi_dt_f16<1>>(st, q, k, v, mask, scale, softcap, sinks, out, scratch);
    return launch_attention<pi_dt_f32<1>, pi_dt_f32<1>>(st, q, k, v, mask, scale, softcap, sinks, out, scratch);
}
