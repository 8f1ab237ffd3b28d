/* backend.h: where the forward pass's ops run and where its tensors live.
 *
 * A backend is a vtable over one kind of memory and the ops the forward pass (context.c) uses:
 * buffers with byte accounting, upload/download/copy, and the ops themselves. There is no graph
 * and no scheduler: PowerInfer's placement is decided offline (powerinfer.gpu_split), so context.c takes
 * each block's backend from a per-layer placement table filled once by pi_context_offload and
 * calls the same ops whatever the backend is.
 *
 * Three implementations:
 *  - cpu       (backend_cpu.c): today's ops on host memory, the thread pool, one scratch area;
 *  - emulated  (backend_cpu.c): a "device" whose memory is separate host allocations counted
 *              against a capacity (POWERINFER_EMULATED_GPU_MIB=N, read once), whose uploads and
 *              downloads really copy, and whose ops are the CPU kernels: the whole hybrid path runs
 *              without a GPU, with the same placement, budget checks and logs as a GPU build;
 *  - cuda/hip  (core/cuda/backend_vt.c): the pi_cuda_* device API of core/cuda/pi_cuda.h.
 *
 * Tensors passed to a backend's ops are pi_tensor views over that backend's memory (device
 * pointers for a device). Ops are asynchronous where the backend is (CUDA: one stream); download
 * returns when the host copy is complete; sync waits for everything issued.
 */
#ifndef PI_BACKEND_H
#define PI_BACKEND_H

#include "internal.h"

typedef struct pi_backend pi_backend;

enum {   /* op ids for supports_op */
    PI_BOP_MUL_MAT, PI_BOP_RMS_NORM, PI_BOP_LAYER_NORM, PI_BOP_ROPE, PI_BOP_ROPE_FREQS, PI_BOP_ATTENTION,
    PI_BOP_BINARY, PI_BOP_GLU, PI_BOP_SCALE, PI_BOP_FILL, PI_BOP_GET_ROWS, PI_BOP_SET_ROWS, PI_BOP_COPY_2D,
    PI_BOP_PREDICTOR, PI_BOP_SPARSE_FFN, PI_BOP_SPARSE_BIAS, PI_BOP_NEURON_COUNTS,
    PI_BOP_KV_CACHE   /* a KV cache of `type`: set_rows into it, attention over it */
};

/* What one backend's scratch area must hold for a model at T tokens and n_ctx KV cells. */
typedef struct pi_scratch_need {
    const struct pi_model *model;
    int64_t T, n_ctx;
    int32_t file_layout;   /* 1: the backend computes with the file's tensor layout (devices) */
} pi_scratch_need;

typedef struct pi_backend_i {
    const char *name;
    /* memory */
    pi_status (*alloc)(pi_backend *be, size_t bytes, void **out);   /* counted; 64-byte aligned at least */
    void      (*free)(pi_backend *be, void *ptr, size_t bytes);
    pi_status (*upload)(pi_backend *be, void *dst, const void *src, size_t bytes);     /* host -> backend */
    pi_status (*download)(pi_backend *be, void *dst, const void *src, size_t bytes);   /* backend -> host, waits */
    pi_status (*copy)(pi_backend *be, void *dst, const void *src, size_t bytes);       /* within the backend */
    pi_status (*sync)(pi_backend *be);
    int32_t   (*supports_op)(pi_backend *be, int32_t op, int32_t type);
    size_t    (*scratch_bytes)(pi_backend *be, const pi_scratch_need *need);
    void      (*release)(pi_backend *be);
    /* optional (NULL: none): one device allocation of `bytes` that the following allocs are carved from
     * (256-byte aligned), so the device holds exactly the counted bytes (no per-buffer rounding) */
    pi_status (*reserve)(pi_backend *be, size_t bytes);
    /* ops: the semantics of the pi_op_* functions of powerinfer.h */
    pi_status (*mul_mat)(pi_backend *be, const pi_tensor *w, const pi_tensor *x, pi_tensor *y);
    /* optional (NULL: mul_mat each): y[i] = w[i] x for n <= PI_MUL_MATS_MAX weights of one input */
    pi_status (*mul_mats)(pi_backend *be, int n, const pi_tensor *const *w, const pi_tensor *x, pi_tensor *const *y);
    pi_status (*rms_norm)(pi_backend *be, const pi_tensor *x, const pi_tensor *w, float eps, pi_tensor *out);
    pi_status (*layer_norm)(pi_backend *be, const pi_tensor *x, const pi_tensor *w, const pi_tensor *b, float eps,
                            pi_tensor *out);
    /* cos and sin times mscale (hparams.rope_mscale) */
    pi_status (*rope)(pi_backend *be, const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode,
                      float base, float scale, const float *freq_factors, float mscale, pi_tensor *out);
    /* softcap: 0, or the scores' soft cap (pi_op_attention_softcap); sinks: [n_head] f32 in the backend's memory, or
     * NULL (pi_op_attention_sinks) */
    pi_status (*attention)(pi_backend *be, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                           const pi_tensor *mask, float scale, float softcap, const float *sinks, pi_tensor *out);
    pi_status (*binary)(pi_backend *be, int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out);
    /* up = act(gate) * up (PI_FFN_PAR), act(gate) * act(up) (SYM), act(up) (SEQ, gate unused); in place */
    pi_status (*glu)(pi_backend *be, int32_t act, int32_t mode, const pi_tensor *gate, pi_tensor *up);
    pi_status (*scale)(pi_backend *be, pi_tensor *x, float s);                  /* x *= s (f32) */
    pi_status (*fill)(pi_backend *be, pi_tensor *x, float value);               /* f32 */
    pi_status (*get_rows)(pi_backend *be, const pi_tensor *table, const int32_t *ids, int64_t n, pi_tensor *out);
    /* dst[:, rows[t]] = src[:, t] converted to dst's type (f32/f16): the KV-cache store */
    pi_status (*set_rows)(pi_backend *be, pi_tensor *dst, const pi_tensor *src, const int32_t *rows);
    /* dst = src for two f32 2-d views of the same shape with any row strides (nb[1]) */
    pi_status (*copy_2d)(pi_backend *be, const pi_tensor *src, pi_tensor *dst);
    pi_status (*predictor)(pi_backend *be, const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                           pi_tensor *scores);
    /* The sparse FFN over the n_rows rows of w (compact [E, k] with bucket[j] = neuron of row j, or the
     * whole layer with bucket NULL), reading scores [n_ff, T]; skip[i] != 0 (host mask over neurons,
     * NULL: none) leaves neuron i out. n_active (host) is incremented by the pairs computed, by the
     * backend's next sync at the latest (so an asynchronous device need not wait here); neuron_counts
     * (host [n_ff] or NULL) is incremented per neuron by the tokens that computed it. */
    pi_status (*sparse_ffn)(pi_backend *be, const pi_sparse_ffn_weights *w, const int32_t *bucket, int32_t act,
                            int32_t mode, const pi_tensor *x, const pi_tensor *scores, float threshold,
                            const uint8_t *skip, pi_tensor *out, int64_t *n_active, int64_t *neuron_counts);
} pi_backend_i;

struct pi_backend {
    const pi_backend_i *i;
    int32_t         host;       /* 1: the memory is the process's own (no copy needed to read it) */
    int32_t         device;     /* device index, -1 for the CPU */
    pi_threadpool  *pool;       /* CPU kernels (cpu and emulated) */
    void           *scratch;    /* one area, carved by the ops (never two ops at once) */
    size_t          scratch_bytes;
    void           *impl;       /* backend-private state (CUDA: the stream; CPU: its pi_rope_cache) */
};

/* The CPU backend over `pool` (not owned). Its scratch is sized for `need` and owned. */
pi_status pi_backend_cpu_create(pi_threadpool *pool, const pi_scratch_need *need, pi_backend **out);
/* The device backend of device `device` (emulated or CUDA/HIP, see pi_device_count), with scratch
 * for `need` allocated on the device; pool runs the emulated device's CPU kernels. */
pi_status pi_backend_device_create(int32_t device, pi_threadpool *pool, const pi_scratch_need *need,
                                   pi_backend **out);
void      pi_backend_free(pi_backend *be);
/* Bytes pi_backend_device_create would allocate as scratch for `need` (0 without a device). */
size_t    pi_backend_device_scratch_bytes(int32_t device, const pi_scratch_need *need);
/* The same for the device kind of this build when none is present: CUDA/HIP, else emulated. */
size_t    pi_backend_plan_scratch_bytes(const pi_scratch_need *need);

/* The CPU ops' scratch for a model (mul_mat activations, predictor hidden, sparse FFN with or
 * without a bucket); file_layout: for the weights as they are in the file (no repacked copies). */
size_t    pi_cpu_scratch_bytes(const pi_scratch_need *need);

/* The CPU implementations shared by the cpu and emulated backends (backend_cpu.c). */
extern const pi_backend_i pi_cpu_ops_template;

/* The emulated device (backend_cpu.c): capacity from POWERINFER_EMULATED_GPU_MIB (read once), 0 if unset. */
int64_t   pi_emulated_capacity(void);
/* CUDA/HIP device backend (core/cuda/backend_vt.c; core/cuda/stub.c without a GPU build). */
pi_status pi_backend_cuda_create(int32_t device, const pi_scratch_need *need, pi_backend **out);
size_t    pi_backend_cuda_scratch_bytes(const pi_scratch_need *need);
int32_t   pi_backend_cuda_devices(void);
pi_status pi_backend_cuda_info(int32_t device, char *name, size_t name_len, int64_t *free_b, int64_t *total_b);
int64_t   pi_backend_cuda_allocated(void);
int64_t   pi_backend_cuda_peak(void);
void      pi_backend_cuda_reset_peak(void);
const char *pi_backend_cuda_name(void);   /* "CUDA", "HIP" or NULL */

/* pi_sparse_ffn with a skip mask (sparse_ffn.c): neurons with skip[i] != 0 are not computed. */
pi_status pi_sparse_ffn_skip(pi_threadpool *pool, const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode,
                             const pi_tensor *x, const pi_tensor *scores, float threshold, const uint8_t *skip,
                             pi_tensor *out, int64_t *n_active, int64_t *neuron_counts, void *scratch);

#endif
