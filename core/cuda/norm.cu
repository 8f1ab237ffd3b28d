/* norm.cu: RMSNorm over dim 0, one block per row: out = x / sqrt(mean(x^2) + eps) * weight. */
#include "common.cuh"

__global__ void k_rms_norm(pi_dview x, const float *__restrict__ w, float eps, pi_dview out) {
    const int64_t D = x.ne[0], r = blockIdx.x;
    const float *xr = (const float *)pi_row(x, r);
    float *yr = (float *)pi_row(out, r);
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    ss = pi_block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}

pi_status pi_cuda_rms_norm(pi_cuda_stream *s, const pi_tensor *x, const pi_tensor *weight, float eps, pi_tensor *out) {
    const int64_t R = pi_rows(x);
    if (R < 1 || R > 0x7fffffff) return pi_fail(PI_ERR_INVALID_ARG, "GPU rms_norm: %lld rows", (long long)R);
    k_rms_norm<<<(unsigned)R, 256, 0, pi_cuda_raw_stream(s)>>>(pi_view_of(x), weight ? (const float *)weight->data : NULL,
                                                               eps, pi_view_of(out));
    PI_CU_LAUNCH("rms_norm");
    return PI_OK;
}
