/* stub.c: the GPU API of a library built without -DPI_CUDA=ON / -DPI_HIP=ON. pi_cuda_available()
 * returns 0 and every other call fails with PI_ERR_UNSUPPORTED, so callers can always ask. */
#include "axpy_chunks.h"
#include "internal.h"
#include "powerinfer_cuda.h"

#include <string.h>

#define NO_GPU(what) pi_fail(PI_ERR_UNSUPPORTED, "%s: this libpowerinfer was built without a GPU backend " \
                                                 "(configure with -DPI_CUDA=ON or -DPI_HIP=ON)", what)

int32_t   pi_cuda_compiled(void) { return PI_GPU_NONE; }
int32_t   pi_cuda_available(void) { return 0; }
int64_t   pi_cuda_allocated_bytes(void) { return 0; }
int64_t   pi_cuda_peak_allocated_bytes(void) { return 0; }
/* A size, not a device call: the same answer as a GPU build's (axpy_chunks.h). */
size_t    pi_cuda_axpy_sparse_scratch(int64_t E, int64_t k, int64_t T) { return pi_axpy_partials_bytes(E, k, T); }
void      pi_cuda_reset_peak(void) {}

pi_status pi_cuda_device_info(int32_t device, pi_cuda_device_props *out) {
    if (out) memset(out, 0, sizeof *out);
    return NO_GPU("cuda_device_info");
}
pi_status pi_cuda_set_device(int32_t device) { return NO_GPU("cuda_set_device"); }
pi_status pi_cuda_mem_get_info(int64_t *free_bytes, int64_t *total_bytes) {
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return NO_GPU("cuda_mem_get_info");
}

pi_status pi_cuda_op_get_rows(const pi_tensor *table, const int32_t *ids, int64_t n, pi_tensor *out) {
    return NO_GPU("cuda get_rows");
}
pi_status pi_cuda_op_set_rows(pi_tensor *dst, const pi_tensor *src, const int32_t *rows) {
    return NO_GPU("cuda set_rows");
}
pi_status pi_cuda_op_mul_mat(const pi_tensor *w, const pi_tensor *x, pi_tensor *y) { return NO_GPU("cuda mul_mat"); }
pi_status pi_cuda_op_rms_norm(const pi_tensor *x, const pi_tensor *weight, float eps, pi_tensor *out) {
    return NO_GPU("cuda rms_norm");
}
pi_status pi_cuda_op_rope(const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode, float freq_base,
                          float freq_scale, pi_tensor *out) {
    return NO_GPU("cuda rope");
}
pi_status pi_cuda_op_softmax(const pi_tensor *x, pi_tensor *out) { return NO_GPU("cuda softmax"); }
pi_status pi_cuda_op_unary(int32_t op, const pi_tensor *x, pi_tensor *out) { return NO_GPU("cuda unary"); }
pi_status pi_cuda_op_binary(int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out) {
    return NO_GPU("cuda binary");
}
pi_status pi_cuda_op_attention(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v, const pi_tensor *mask,
                               float scale, pi_tensor *out) {
    return NO_GPU("cuda attention");
}
pi_status pi_cuda_op_attention_softcap(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                       const pi_tensor *mask, float scale, float softcap, pi_tensor *out) {
    return NO_GPU("cuda attention");
}
pi_status pi_cuda_op_attention_sinks(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                     const pi_tensor *mask, float scale, float softcap, const pi_tensor *sinks,
                                     pi_tensor *out) {
    return NO_GPU("cuda attention");
}
pi_status pi_cuda_op_predictor(const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x, pi_tensor *scores) {
    return NO_GPU("cuda predictor");
}
pi_status pi_cuda_op_sparse_ffn(const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode, const pi_tensor *x,
                                const pi_tensor *scores, float threshold, pi_tensor *out, int64_t *n_active) {
    return NO_GPU("cuda sparse_ffn");
}
pi_status pi_cuda_op_sparse_ffn_hot(const pi_sparse_ffn_weights *w_hot, const int32_t *bucket, int64_t n_ff,
                                    int32_t act, int32_t gate_mode, const pi_tensor *x, const pi_tensor *scores,
                                    float threshold, pi_tensor *out, int64_t *n_active) {
    return NO_GPU("cuda sparse_ffn_hot");
}
pi_status pi_cuda_op_mul_mat_sparse(const pi_tensor *w_hot, const int32_t *bucket, const pi_tensor *x,
                                    const pi_tensor *scores, float threshold, pi_tensor *y) {
    return NO_GPU("cuda mul_mat_sparse");
}
pi_status pi_cuda_op_axpy_sparse(const pi_tensor *down_hot, const int32_t *bucket, const pi_tensor *h,
                                 const pi_tensor *scores, float threshold, pi_tensor *out) {
    return NO_GPU("cuda axpy_sparse");
}
pi_status pi_cuda_bench(int32_t op, int32_t type, int64_t n_embd, int64_t n_ff, int64_t n_tokens, float hot_fraction,
                        float active_fraction, int32_t iters, pi_cuda_bench_result *out) {
    if (out) memset(out, 0, sizeof *out);
    return NO_GPU("cuda_bench");
}

/* ---- the device backend of backend.h: none in this build ---- */
#include "backend.h"

pi_status pi_backend_cuda_create(int32_t device, const pi_scratch_need *need, pi_backend **out) {
    if (out) *out = NULL;
    return NO_GPU("GPU backend");
}
size_t    pi_backend_cuda_scratch_bytes(const pi_scratch_need *need) { return 0; }
int32_t   pi_backend_cuda_devices(void) { return 0; }
pi_status pi_backend_cuda_info(int32_t device, char *name, size_t name_len, int64_t *free_b, int64_t *total_b) {
    return NO_GPU("GPU device info");
}
int64_t   pi_backend_cuda_allocated(void) { return 0; }
int64_t   pi_backend_cuda_peak(void) { return 0; }
void      pi_backend_cuda_reset_peak(void) {}
const char *pi_backend_cuda_name(void) { return NULL; }
