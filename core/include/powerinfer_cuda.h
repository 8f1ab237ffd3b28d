/*
 * powerinfer_cuda.h: the public C API of libpowerinfer's GPU backend (CUDA, or ROCm/HIP).
 *
 * Every build of the library exports these functions. A build without
 * -DPI_CUDA=ON / -DPI_HIP=ON exports stubs: pi_cuda_available() returns 0 and
 * the other calls fail with PI_ERR_UNSUPPORTED, so Python can always ask.
 *
 * Like powerinfer.h, the text between PI_CUDA_CDEF_BEGIN and PI_CUDA_CDEF_END
 * is handed to cffi (after powerinfer.h's region) and compiled with the
 * library's sources: keep it free of macros and inline functions.
 *
 * The pi_cuda_op_* functions are test entry points: they take host tensors
 * (the same views and the same semantics as the CPU pi_op_* functions), copy
 * them to the device, run one kernel family there, copy the result back and
 * synchronize. They exist to compare every GPU op with its CPU twin; the
 * forward pass uses the device-level API in core/cuda/pi_cuda.h instead.
 */
#ifndef POWERINFER_CUDA_H
#define POWERINFER_CUDA_H

#include "powerinfer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PI_CUDA_CDEF_BEGIN */

enum {
    PI_ERR_DEVICE = -100    /* a CUDA/HIP runtime error (launch failure, illegal address, ...): see pi_last_error() */
};

enum {  /* what pi_cuda_compiled() returns */
    PI_GPU_NONE = 0,
    PI_GPU_CUDA = 1,
    PI_GPU_HIP  = 2
};

typedef struct pi_cuda_device_props {
    char    name[256];
    int32_t device;
    int32_t cc_major;          /* compute capability (CUDA) or gfx major/minor (HIP) */
    int32_t cc_minor;
    int32_t n_sm;              /* multiprocessors / compute units */
    int32_t warp_size;
    int64_t total_bytes;       /* device memory */
    int64_t free_bytes;        /* free device memory now (cudaMemGetInfo) */
} pi_cuda_device_props;

/* Which GPU backend this library was built with (PI_GPU_*). */
PI_API int32_t   pi_cuda_compiled(void);
/* Number of usable devices; 0 when the build has no GPU backend, no driver or no device. Never fails. */
PI_API int32_t   pi_cuda_available(void);
PI_API pi_status pi_cuda_device_info(int32_t device, pi_cuda_device_props *out);
/* Selects the device of the calling thread (default 0). */
PI_API pi_status pi_cuda_set_device(int32_t device);
/* Free and total memory of the current device, in bytes. */
PI_API pi_status pi_cuda_mem_get_info(int64_t *free_bytes, int64_t *total_bytes);
/* Device bytes held by the library's allocator now, and the most it held since the last reset. */
PI_API int64_t   pi_cuda_allocated_bytes(void);
PI_API int64_t   pi_cuda_peak_allocated_bytes(void);
PI_API void      pi_cuda_reset_peak(void);

/* ---- test entry points: one op on host buffers (copy in, run, copy out) ---- */

PI_API pi_status pi_cuda_op_get_rows(const pi_tensor *table, const int32_t *ids, int64_t n, pi_tensor *out);
/* dst[:, rows[t]] = src[:, t] converted to dst's type (f32, f16 or bf16, rounded as pi_quantize_row): the
 * KV-cache store. src [E, T] f32, dst [E, n_rows]; rows[t] < n_rows; other rows of dst are kept. */
PI_API pi_status pi_cuda_op_set_rows(pi_tensor *dst, const pi_tensor *src, const int32_t *rows);
PI_API pi_status pi_cuda_op_mul_mat(const pi_tensor *w, const pi_tensor *x, pi_tensor *y);
PI_API pi_status pi_cuda_op_rms_norm(const pi_tensor *x, const pi_tensor *weight, float eps, pi_tensor *out);
PI_API pi_status pi_cuda_op_rope(const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode,
                                 float freq_base, float freq_scale, pi_tensor *out);
PI_API pi_status pi_cuda_op_softmax(const pi_tensor *x, pi_tensor *out);
PI_API pi_status pi_cuda_op_unary(int32_t op, const pi_tensor *x, pi_tensor *out);
PI_API pi_status pi_cuda_op_binary(int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out);
PI_API pi_status pi_cuda_op_attention(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                      const pi_tensor *mask, float scale, pi_tensor *out);
/* pi_op_attention_softcap on the device (tanhf: within a few ulp of the CPU's exp-based tanh) */
PI_API pi_status pi_cuda_op_attention_softcap(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                              const pi_tensor *mask, float scale, float softcap, pi_tensor *out);
/* pi_op_attention_sinks on the device (expf) */
PI_API pi_status pi_cuda_op_attention_sinks(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                            const pi_tensor *mask, float scale, float softcap, const pi_tensor *sinks,
                                            pi_tensor *out);
PI_API pi_status pi_cuda_op_predictor(const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                                      pi_tensor *scores);
/* The whole FFN on the device (every row of w is "hot"): same result as pi_op_sparse_ffn. */
PI_API pi_status pi_cuda_op_sparse_ffn(const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode,
                                       const pi_tensor *x, const pi_tensor *scores, float threshold,
                                       pi_tensor *out, int64_t *n_active);
/* The GPU half of a hybrid FFN. w_hot holds the k hot rows of gate/up/down_t as compact [n_embd, k]
 * matrices; bucket[j] (ascending, < n_ff) is the neuron of compact row j. scores is the full
 * [n_ff, T] predictor output. out [n_embd, T] = the sum over hot, active neurons only; adding the
 * CPU's sum over the other neurons gives pi_op_sparse_ffn's result. */
PI_API pi_status pi_cuda_op_sparse_ffn_hot(const pi_sparse_ffn_weights *w_hot, const int32_t *bucket, int64_t n_ff,
                                           int32_t act, int32_t gate_mode, const pi_tensor *x,
                                           const pi_tensor *scores, float threshold, pi_tensor *out,
                                           int64_t *n_active);
/* Gathered matvec over hot rows: for compact row j of w_hot [K, k] and token t,
 * y[bucket[j], t] = w_hot[:, j] . x[:, t] if scores[bucket[j], t] >= threshold, else 0.
 * y is [N, T] (N >= every bucket entry); rows not in the bucket are left as they are.
 * bucket NULL means the identity (k == N). scores NULL computes every row. */
PI_API pi_status pi_cuda_op_mul_mat_sparse(const pi_tensor *w_hot, const int32_t *bucket, const pi_tensor *x,
                                           const pi_tensor *scores, float threshold, pi_tensor *y);
/* Sparse axpy over hot rows: out[:, t] = sum over j with scores[bucket[j], t] >= threshold and
 * h[bucket[j], t] != 0 of h[bucket[j], t] * down_hot[:, j].  down_hot [E, k], h and scores [N, T], out [E, T].
 * bucket NULL means the identity; scores NULL skips only zero h. */
PI_API pi_status pi_cuda_op_axpy_sparse(const pi_tensor *down_hot, const int32_t *bucket, const pi_tensor *h,
                                        const pi_tensor *scores, float threshold, pi_tensor *out);
/* Device scratch bytes of that axpy for down [E, k] and T tokens (its partial sums when the rows are
 * split into chunks, else 0): a function of the shapes only, answered by every build (a build without
 * a GPU backend too), so a VRAM plan can be made on any machine. */
PI_API size_t    pi_cuda_axpy_sparse_scratch(int64_t E, int64_t k, int64_t T);

/* ---- micro-benchmark: device-resident random data, timed with events ---- */

enum {
    PI_CUDA_BENCH_MUL_MAT    = 0,   /* y = W x, W [n_embd, n_ff] of `type`, T tokens */
    PI_CUDA_BENCH_SPARSE_FFN = 1,   /* hot FFN: k = hot_fraction * n_ff rows, active_fraction of them active */
    PI_CUDA_BENCH_ATTENTION  = 2    /* n_ff is the number of KV cells, n_embd / 128 heads of 128, f16 KV */
};

typedef struct pi_cuda_bench_result {
    double ms_per_iter;       /* mean over iters after one warm-up */
    double weight_gbps;       /* weight (or KV) bytes that had to be read / time */
    int64_t bytes_per_iter;
} pi_cuda_bench_result;

PI_API pi_status pi_cuda_bench(int32_t op, int32_t type, int64_t n_embd, int64_t n_ff, int64_t n_tokens,
                               float hot_fraction, float active_fraction, int32_t iters,
                               pi_cuda_bench_result *out);

/* PI_CUDA_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* POWERINFER_CUDA_H */
