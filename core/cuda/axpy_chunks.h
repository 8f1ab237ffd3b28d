/* axpy_chunks.h: how the GPU's sparse axpy (sparse_ffn.cu) splits its rows, as a pure function of the
 * shapes. sparse_ffn.cu launches with it; stub.c answers pi_cuda_axpy_sparse_scratch with it in a
 * build without a GPU backend, so the planner can size a device's buffers on any machine. Plain C,
 * included by both compilers. */
#ifndef PI_AXPY_CHUNKS_H
#define PI_AXPY_CHUNKS_H

#include <stddef.h>
#include <stdint.h>

#define AXPY_COLS   256    /* output columns per block (threads) */
#define AXPY_NT     8      /* tokens per block when T > 1 */

static inline int64_t pi_axpy_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static inline int64_t pi_axpy_nt(int64_t T) { return T == 1 ? 1 : AXPY_NT; }

/* Row chunks: enough blocks to fill a large GPU (~1024), chunks of at least 64 rows. */
static inline int64_t pi_axpy_chunks(int64_t E, int64_t k, int64_t T) {
    const int64_t base = pi_axpy_ceil_div(E, AXPY_COLS) * pi_axpy_ceil_div(T, pi_axpy_nt(T));
    int64_t R = pi_axpy_ceil_div(1024, base);
    const int64_t rmax = pi_axpy_ceil_div(k, 64);
    if (R > rmax) R = rmax;
    if (R > 65535) R = 65535;
    return R < 1 ? 1 : R;
}

/* The partial sums of more than one chunk: [R, T, E] floats. */
static inline size_t pi_axpy_partials_bytes(int64_t E, int64_t k, int64_t T) {
    const int64_t R = pi_axpy_chunks(E, k, T);
    return R > 1 ? (size_t)(R * T * E) * sizeof(float) : 0;
}

#endif
