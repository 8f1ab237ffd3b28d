/*
 * pi_cuda.h: the device-level API of the GPU backend, for the forward pass (context.c).
 * C linkage; internal to libpowerinfer (not installed, not exported).
 *
 * Tensors are the usual pi_tensor views, but their data pointers are device
 * pointers. All ops are asynchronous on a stream (NULL: the calling thread's
 * per-thread default stream) and have the semantics of their CPU twins in
 * ops.c / sparse_ffn.c (see powerinfer.h). Ops that need temporary device
 * memory take a `scratch` pointer of at least the bytes their *_scratch()
 * function returns, so a context allocates everything once and the VRAM
 * budget (bindings/powerinfer/gpu_split/plan.py) can count it in advance.
 * Every function returns a pi_status and never aborts: CUDA errors become
 * PI_ERR_DEVICE / PI_ERR_OUT_OF_MEMORY / PI_ERR_UNSUPPORTED with a message.
 */
#ifndef PI_CUDA_INTERNAL_H
#define PI_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "powerinfer_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "internal.h"

typedef struct pi_cuda_stream pi_cuda_stream;

/* ---- device, memory, streams (backend.cu) ---- */
pi_status pi_cuda_init(int32_t device);                      /* select the device, create the context */
pi_status pi_cuda_malloc(void **ptr, size_t bytes);          /* counted in pi_cuda_allocated_bytes() */
void      pi_cuda_free(void *ptr);
pi_status pi_cuda_host_alloc(void **ptr, size_t bytes);      /* pinned host memory (fast async copies) */
void      pi_cuda_host_free(void *ptr);
pi_status pi_cuda_stream_create(pi_cuda_stream **out);
void      pi_cuda_stream_free(pi_cuda_stream *s);
pi_status pi_cuda_stream_sync(pi_cuda_stream *s);
pi_status pi_cuda_upload(pi_cuda_stream *s, void *dst, const void *src, size_t bytes);
pi_status pi_cuda_download(pi_cuda_stream *s, void *dst, const void *src, size_t bytes);
pi_status pi_cuda_copy_d2d(pi_cuda_stream *s, void *dst, const void *src, size_t bytes);
pi_status pi_cuda_memset(pi_cuda_stream *s, void *dst, int value, size_t bytes);
/* Bytes a device buffer of n bytes really takes inside an arena (256-byte alignment). */
size_t    pi_cuda_padded(size_t bytes);
/* 1 when the GPU kernels accept this weight type (F32, F16, BF16, Q4_0, Q8_0). */
int32_t   pi_cuda_type_supported(int32_t type);

/* ---- ops (one family per file) ---- */
pi_status pi_cuda_get_rows(pi_cuda_stream *s, const pi_tensor *table, const int32_t *ids_dev, int64_t n,
                           pi_tensor *out);                                                    /* get_rows.cu */
/* dst[:, rows[t]] = src[:, t] (src f32 [E, T]; dst f32/f16/bf16 [E, n_rows]): the KV-cache store. */
pi_status pi_cuda_set_rows(pi_cuda_stream *s, pi_tensor *dst, const pi_tensor *src, const int32_t *rows_dev);

size_t    pi_cuda_mul_mat_scratch(int32_t wtype, int64_t K, int64_t T);                        /* mul_mat.cu */
pi_status pi_cuda_mul_mat(pi_cuda_stream *s, const pi_tensor *w, const pi_tensor *x, pi_tensor *y, void *scratch);
/* The gathered form: row j of w computes output row row_map[j] (NULL: j), only for (j, t) with
 * scores[row_map[j], t] >= threshold (scores NULL: all); relu != 0 applies ReLU to the result. */
pi_status pi_cuda_mul_mat_ex(pi_cuda_stream *s, const pi_tensor *w, const pi_tensor *x, pi_tensor *y,
                             const int32_t *row_map_dev, const pi_tensor *scores, float threshold, int32_t relu,
                             void *scratch);

pi_status pi_cuda_rms_norm(pi_cuda_stream *s, const pi_tensor *x, const pi_tensor *weight, float eps,
                           pi_tensor *out);                                                    /* norm.cu */
pi_status pi_cuda_rope(pi_cuda_stream *s, const pi_tensor *x, const int32_t *pos_dev, int32_t n_rot, int32_t mode,
                       float freq_base, float freq_scale, float mscale, pi_tensor *out);                     /* rope.cu */
pi_status pi_cuda_softmax(pi_cuda_stream *s, const pi_tensor *x, pi_tensor *out);             /* softmax.cu */
pi_status pi_cuda_unary(pi_cuda_stream *s, int32_t op, const pi_tensor *x, pi_tensor *out);   /* elementwise.cu */
pi_status pi_cuda_binary(pi_cuda_stream *s, int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out);
pi_status pi_cuda_scale(pi_cuda_stream *s, pi_tensor *x, float v);          /* x *= v (elementwise.cu) */

size_t    pi_cuda_attention_scratch(int64_t n_head, int64_t T, int64_t n_kv);                 /* attention.cu */
pi_status pi_cuda_attention(pi_cuda_stream *s, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                            const pi_tensor *mask, float scale, float softcap, const float *sinks, pi_tensor *out,
                            void *scratch);   /* sinks: [n_head] device floats or NULL */

size_t    pi_cuda_predictor_scratch(const pi_tensor *fc1, const pi_tensor *fc2, int64_t T);   /* predictor.cu */
pi_status pi_cuda_predictor(pi_cuda_stream *s, const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                            pi_tensor *scores, void *scratch);

/* sparse_ffn.cu. w_hot: compact [E, k] gate/up/down_t of the hot rows (k == n_ff and bucket NULL for a
 * layer that is entirely on the GPU). scores: the full [n_ff, T] predictor output on the device.
 * out [E, T] receives the sum over hot active neurons. n_active_dev, if not NULL, is a device
 * uint64 that is *incremented* by the number of (neuron, token) pairs computed. */
size_t    pi_cuda_sparse_ffn_scratch(const pi_sparse_ffn_weights *w_hot, int64_t E, int64_t k, int64_t T);
pi_status pi_cuda_sparse_ffn(pi_cuda_stream *s, const pi_sparse_ffn_weights *w_hot, const int32_t *bucket_dev,
                             int32_t act, int32_t gate_mode, const pi_tensor *x, const pi_tensor *scores,
                             float threshold, pi_tensor *out, uint64_t *n_active_dev, void *scratch);
/* out [E, T] = sum_j [scores[map(j), t] >= thr, h[map(j), t] != 0] h[map(j), t] * down[:, j]
 * (map = bucket or identity; h/scores NULL-able as in pi_cuda_op_axpy_sparse); its scratch:
 * pi_cuda_axpy_sparse_scratch (powerinfer_cuda.h). */
pi_status pi_cuda_axpy_sparse(pi_cuda_stream *s, const pi_tensor *down, const int32_t *bucket_dev,
                              const pi_tensor *h, const pi_tensor *scores, float threshold, pi_tensor *out,
                              void *scratch);

#ifdef __cplusplus
}
#endif

#endif
