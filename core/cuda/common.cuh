/* common.cuh: what every file of the GPU backend includes: the runtime (CUDA or HIP), error
 * checking that returns pi_status, reductions and launch helpers. */
#ifndef PI_CUDA_COMMON_CUH
#define PI_CUDA_COMMON_CUH

#include <math.h>
#include <stdint.h>

#if defined(PI_HIP)
#include "hip_compat.h"
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define PI_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), 32)
#endif

#include "pi_cuda.h"

#define PI_WARP 32   /* lanes per reduction group (a CUDA warp; half a CDNA wavefront) */

/* Records the CUDA error as the library's last error and maps it to a pi_status. */
pi_status pi_cuda_fail(cudaError_t err, const char *what, const char *file, int line);

#define PI_CU(call)                                                                      \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) return pi_cuda_fail(e_, #call, __FILE__, __LINE__);       \
    } while (0)
/* After a kernel launch: configuration errors show up here (execution errors at the next sync). */
#define PI_CU_LAUNCH(name) PI_CU(cudaGetLastError())
#define PI_TRY(expr)                                                                     \
    do {                                                                                 \
        pi_status st_ = (expr);                                                          \
        if (st_ != PI_OK) return st_;                                                    \
    } while (0)

cudaStream_t pi_cuda_raw_stream(pi_cuda_stream *s);   /* NULL -> cudaStreamPerThread */
/* Quantizes x [K, T] (f32 rows, K a multiple of 32) into T rows of K/32 q8_0 blocks at q (mul_mat.cu). */
pi_status pi_cuda_quantize_q8_0(cudaStream_t st, const pi_tensor *x, void *q);

static inline int64_t pi_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- reductions ---- */

__device__ __forceinline__ float pi_warp_sum(float v) {
#pragma unroll
    for (int m = PI_WARP / 2; m > 0; m >>= 1) v += PI_SHFL_XOR(v, m);
    return v;
}

__device__ __forceinline__ float pi_warp_max(float v) {
#pragma unroll
    for (int m = PI_WARP / 2; m > 0; m >>= 1) v = fmaxf(v, PI_SHFL_XOR(v, m));
    return v;
}

/* Block-wide sum / max (blockDim.x a multiple of 32, at most 1024). Every thread gets the result.
 * The order of the additions is fixed for a given block size: results are reproducible. */
__device__ __forceinline__ float pi_block_sum(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x % PI_WARP, w = threadIdx.x / PI_WARP, nw = blockDim.x / PI_WARP;
    v = pi_warp_sum(v);
    __syncthreads();                 /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return pi_warp_sum(v);
}

__device__ __forceinline__ float pi_block_max(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x % PI_WARP, w = threadIdx.x / PI_WARP, nw = blockDim.x / PI_WARP;
    v = pi_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return pi_warp_max(v);
}

/* ---- f32 tensor views passed to kernels by value ---- */

typedef struct pi_dview {
    char   *data;
    int64_t ne[4];
    int64_t nb[4];
} pi_dview;

static inline pi_dview pi_view_of(const pi_tensor *t) {
    pi_dview v;
    v.data = (char *)t->data;
    for (int i = 0; i < 4; i++) { v.ne[i] = t->ne[i]; v.nb[i] = t->nb[i]; }
    return v;
}

/* Row r (over dims 1..3, dim 1 fastest) of a view. */
__device__ __forceinline__ char *pi_row(const pi_dview &v, int64_t r) {
    const int64_t i1 = r % v.ne[1], i2 = (r / v.ne[1]) % v.ne[2], i3 = r / (v.ne[1] * v.ne[2]);
    return v.data + i1 * v.nb[1] + i2 * v.nb[2] + i3 * v.nb[3];
}

static inline int64_t pi_rows(const pi_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

/* ---- elementwise activations: the CPU formulas of ops.c ---- */

__device__ __forceinline__ float pi_dev_activation(int op, float x) {
    switch (op) {
        case PI_UNARY_SILU: return x / (1.0f + expf(-x));
        case PI_UNARY_RELU: return x > 0.0f ? x : 0.0f;
        default: {
            const float c = 0.7978845608028654f;
            return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
        }
    }
}

#endif
