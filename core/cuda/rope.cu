/* rope.cu: rotary embedding of the first n_rot dims of each head (NORMAL: pairs (2i, 2i+1), NEOX:
 * (i, i + n_rot/2)); the angle is computed in double, as the CPU does. One block per token. */
#include "common.cuh"

__global__ void k_rope(pi_dview x, const int32_t *__restrict__ pos, int n_rot, int neox, float base, float scale,
                       float mscale, pi_dview out, int copy_rest) {
    const int64_t t = blockIdx.x, H = x.ne[1], hd = x.ne[0], half = n_rot / 2;
    for (int64_t w = threadIdx.x; w < H * half; w += blockDim.x) {
        const int64_t h = w / half, i = w % half;
        const double theta = (double)pos[t] * (double)scale * pow((double)base, -2.0 * (double)i / n_rot);
        const float c = (float)cos(theta) * mscale, sn = (float)sin(theta) * mscale;
        const float *xr = (const float *)(x.data + h * x.nb[1] + t * x.nb[2]);
        float *yr = (float *)(out.data + h * out.nb[1] + t * out.nb[2]);
        const int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = xr[i0], x1 = xr[i1];
        yr[i0] = x0 * c - x1 * sn;
        yr[i1] = x0 * sn + x1 * c;
    }
    if (copy_rest)
        for (int64_t w = threadIdx.x; w < H * (hd - n_rot); w += blockDim.x) {
            const int64_t h = w / (hd - n_rot), i = n_rot + w % (hd - n_rot);
            ((float *)(out.data + h * out.nb[1] + t * out.nb[2]))[i] = ((const float *)(x.data + h * x.nb[1] + t * x.nb[2]))[i];
        }
}

pi_status pi_cuda_rope(pi_cuda_stream *s, const pi_tensor *x, const int32_t *pos_dev, int32_t n_rot, int32_t mode,
                       float freq_base, float freq_scale, float mscale, pi_tensor *out) {
    const int64_t T = x->ne[2];
    if (T < 1 || T > 0x7fffffff) return pi_fail(PI_ERR_INVALID_ARG, "GPU rope: %lld tokens", (long long)T);
    const int copy_rest = n_rot < x->ne[0] &&
                          (out->data != x->data || out->nb[1] != x->nb[1] || out->nb[2] != x->nb[2]);
    k_rope<<<(unsigned)T, 256, 0, pi_cuda_raw_stream(s)>>>(pi_view_of(x), pos_dev, n_rot, mode == PI_ROPE_NEOX,
                                                           freq_base, freq_scale, mscale, pi_view_of(out),
                                                           copy_rest);
    PI_CU_LAUNCH("rope");
    return PI_OK;
}
