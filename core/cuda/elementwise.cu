/* elementwise.cu: unary activations, broadcasting binary add/mul and scaling over f32 views. */
#include "common.cuh"

__global__ void k_unary(int op, pi_dview x, pi_dview out, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i0 = e % x.ne[0], r = e / x.ne[0];
        ((float *)pi_row(out, r))[i0] = pi_dev_activation(op, ((const float *)pi_row(x, r))[i0]);
    }
}

__global__ void k_binary(int op, pi_dview a, pi_dview b, pi_dview out, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i0 = e % a.ne[0], r = e / a.ne[0];
        const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
        const float *br = (const float *)(b.data + (i1 % b.ne[1]) * b.nb[1] + (i2 % b.ne[2]) * b.nb[2] +
                                          (i3 % b.ne[3]) * b.nb[3]);
        const float x = ((const float *)pi_row(a, r))[i0], y = br[b.ne[0] == 1 ? 0 : i0];
        ((float *)pi_row(out, r))[i0] = op == PI_BINARY_ADD ? x + y : x * y;
    }
}

__global__ void k_scale(pi_dview x, float s, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i0 = e % x.ne[0], r = e / x.ne[0];
        ((float *)pi_row(x, r))[i0] *= s;
    }
}

static unsigned grid_for(int64_t n) {
    const int64_t g = pi_ceil_div(n, 256);
    return (unsigned)(g < 65536 ? (g > 0 ? g : 1) : 65536);
}

pi_status pi_cuda_unary(pi_cuda_stream *s, int32_t op, const pi_tensor *x, pi_tensor *out) {
    const int64_t n = x->ne[0] * pi_rows(x);
    k_unary<<<grid_for(n), 256, 0, pi_cuda_raw_stream(s)>>>(op, pi_view_of(x), pi_view_of(out), n);
    PI_CU_LAUNCH("unary");
    return PI_OK;
}

pi_status pi_cuda_binary(pi_cuda_stream *s, int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out) {
    const int64_t n = a->ne[0] * pi_rows(a);
    k_binary<<<grid_for(n), 256, 0, pi_cuda_raw_stream(s)>>>(op, pi_view_of(a), pi_view_of(b), pi_view_of(out), n);
    PI_CU_LAUNCH("binary");
    return PI_OK;
}

pi_status pi_cuda_scale(pi_cuda_stream *s, pi_tensor *x, float v) {
    const int64_t n = x->ne[0] * pi_rows(x);
    k_scale<<<grid_for(n), 256, 0, pi_cuda_raw_stream(s)>>>(pi_view_of(x), v, n);
    PI_CU_LAUNCH("scale");
    return PI_OK;
}
