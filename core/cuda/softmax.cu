/* softmax.cu: row-wise softmax over dim 0, one block per row; an all -inf row gives zeros (as the CPU). */
#include "common.cuh"

__global__ void k_softmax(pi_dview x, pi_dview out) {
    const int64_t D = x.ne[0], r = blockIdx.x;
    const float *xr = (const float *)pi_row(x, r);
    float *yr = (float *)pi_row(out, r);
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = pi_block_max(m);
    if (m == -INFINITY) {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        const float e = expf(xr[i] - m);
        yr[i] = e;
        sum += e;
    }
    sum = pi_block_sum(sum);
    const float inv = 1.0f / sum;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] *= inv;
}

pi_status pi_cuda_softmax(pi_cuda_stream *s, const pi_tensor *x, pi_tensor *out) {
    const int64_t R = pi_rows(x);
    if (R < 1 || R > 0x7fffffff) return pi_fail(PI_ERR_INVALID_ARG, "GPU softmax: %lld rows", (long long)R);
    k_softmax<<<(unsigned)R, 256, 0, pi_cuda_raw_stream(s)>>>(pi_view_of(x), pi_view_of(out));
    PI_CU_LAUNCH("softmax");
    return PI_OK;
}
