/* backend_cpu.c: the CPU backend, the emulated device, and the device list of powerinfer.h.
 *
 * Both backends here run the CPU kernels (ops.c, sparse_ffn.c) on the thread pool. They differ in
 * memory only: the CPU backend's buffers are ordinary host memory; the emulated device's are
 * separate host allocations counted against its capacity (POWERINFER_EMULATED_GPU_MIB, read once),
 * its uploads and downloads are real copies, and its weights are the file's layout (what a GPU
 * receives), so a hybrid run on it exercises the placement, the transfers and the budget exactly
 * as a CUDA build does. The device's byte counters are the device's state (as cudaMalloc's are),
 * readable with pi_device_allocated_bytes / pi_device_peak_bytes. */
#include "backend.h"
#include "model.h"
#include "powerinfer_cuda.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define EMU_ENV   "POWERINFER_EMULATED_GPU_MIB"
#define EMU_ALIGN 256   /* a device buffer's bytes as the planner counts them (gpu_split.padded) */

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ---- scratch sizes ---- */

size_t pi_cpu_scratch_bytes(const pi_scratch_need *need) {
    const pi_model *m = need->model;
    const pi_hparams *hp = &m->hp;
    const int64_t T = need->T, E = hp->n_embd, R = m->max_rank;
    const int64_t F = m->max_ff, Eq = m->max_q;   /* the largest layer's */
    const pi_layer *layers = need->file_layout ? m->file_layers : m->layers;
    /* mul_mat's converted activations: the largest K of any weight in its vec_dot type (f32 at most) */
    size_t mm = (size_t)(T * PI_MAX(PI_MAX(E, F), PI_MAX(R, Eq))) * sizeof(float);
    const pi_tensor *out = need->file_layout ? &m->output_file : &m->output;
    mm = PI_MAX(mm, pi_mul_mat_scratch(out->type, out->ne[0], T));
    if (m->ple_model_proj.data) mm = PI_MAX(mm, pi_mul_mat_scratch(m->ple_model_proj.type, E, T));   /* the CPU's */
    size_t sparse = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi_layer *L = &layers[il];
        const pi_tensor *w[] = { &L->wq, &L->wk, &L->wv, &L->wqkv, &L->wo, &L->fc1, &L->fc2, &L->ffn_gate,
                                 &L->ffn_up, &L->ffn_down, &L->ple_gate, &L->ple_proj, &L->wq_a, &L->wq_b,
                                 &L->wkv_a, &L->wk_b, &L->wv_b };   /* MLA's stacks: per head, K = ne[0] */
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]->data) mm = PI_MAX(mm, pi_mul_mat_scratch(w[i]->type, w[i]->ne[0], T));
        if (hp->sparse) {
            pi_sparse_ffn_weights sw = { .gate = L->ffn_gate, .up = L->ffn_up, .down_t = L->ffn_down_t };
            sparse = PI_MAX(sparse, pi_sparse_ffn_scratch(&sw, E, F, T));
        }
        if (hp->gate_sparse) {
            const pi_sparse_ffn_weights wg = m->layers[il].act_gate;   /* the input-sparse gate */
            sparse = PI_MAX(sparse, pi_sparse_ffn_scratch(&m->layers[il].act_ffn, E, F, T));
            if (wg.down_t.data) sparse = PI_MAX(sparse, pi_sparse_ffn_scratch(&wg, E, E, T));
            for (int k = 0; k < 4; k++) {   /* the input-sparse q, k, v, wo: n_in rows of their layout by input */
                const pi_sparse_ffn_weights *wa = &m->layers[il].act_attn[k];
                if (wa->down_t.data) sparse = PI_MAX(sparse, pi_sparse_ffn_scratch(wa, wa->down_t.ne[1], wa->down_t.ne[1], T));
            }
        }
    }
    mm = align_up(mm, 64);
    size_t need_b = mm + align_up((size_t)(T * PI_MAX(R, 1)) * sizeof(float), 64);   /* predictor: hidden + mm */
    if (hp->sparse || hp->gate_sparse)   /* a bucket's gathered scores [k, T] and counts [k], then pi_sparse_ffn's own scratch */
        need_b = PI_MAX(need_b, align_up((size_t)(T * F) * sizeof(float), 64) +
                                    align_up((size_t)F * sizeof(int64_t), 64) + align_up(sparse, 64));
    return need_b + 64;
}

/* ---- the CPU ops ---- */

static pi_status cpu_mul_mat(pi_backend *be, const pi_tensor *w, const pi_tensor *x, pi_tensor *y) {
    return pi_mul_mat(be->pool, w, x, y, be->scratch);
}

static pi_status cpu_mul_mats(pi_backend *be, int n, const pi_tensor *const *w, const pi_tensor *x,
                              pi_tensor *const *y) {
    return pi_mul_mats(be->pool, n, w, x, y, be->scratch);
}

static pi_status cpu_rms_norm(pi_backend *be, const pi_tensor *x, const pi_tensor *w, float eps, pi_tensor *out) {
    return pi_op_rms_norm(be->pool, x, w, eps, out);
}

static pi_status cpu_layer_norm(pi_backend *be, const pi_tensor *x, const pi_tensor *w, const pi_tensor *b,
                                float eps, pi_tensor *out) {
    return pi_op_layer_norm(be->pool, x, w, b && b->data ? b : NULL, eps, out);
}

static pi_status cpu_rope(pi_backend *be, const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode,
                          float base, float scale, const float *ff, float mscale, pi_tensor *out) {
    return pi_rope(be->pool, x, pos, n_rot, mode, base, scale, ff, mscale, be->impl, out);   /* impl: the CPU's rope tables */
}

static pi_status cpu_attention(pi_backend *be, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                               const pi_tensor *mask, float scale, float softcap, const float *sinks, pi_tensor *out) {
    return pi_attention(be->pool, q, k, v, mask, scale, softcap, sinks, out);
}

static pi_status cpu_binary(pi_backend *be, int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out) {
    return pi_op_binary(be->pool, op, a, b, out);
}

typedef struct { const float *gate; float *up; int64_t n; int32_t act, mode; } glu_args;

static void glu_task(void *p, int ith, int nth) {
    glu_args *a = p;
    const int64_t per = (a->n + nth - 1) / nth, i0 = PI_MIN(a->n, per * ith), i1 = PI_MIN(a->n, i0 + per);
    float g[256];   /* act(gate) of a stretch of elements */
    for (int64_t i = i0; i < i1; i += 256) {
        const int64_t n = PI_MIN(256, i1 - i);
        float *up = a->up + i;
        if (a->mode == PI_FFN_SEQ) { pi_cpu()->activation_row(a->act, n, up, up); continue; }
        pi_cpu()->activation_row(a->act, n, a->gate + i, g);
        if (a->mode == PI_FFN_SYM) pi_cpu()->activation_row(a->act, n, up, up);
        for (int64_t k = 0; k < n; k++) up[k] = g[k] * up[k];
    }
}

static pi_status cpu_glu(pi_backend *be, int32_t act, int32_t mode, const pi_tensor *gate, pi_tensor *up) {
    glu_args a = { gate && gate->data ? gate->data : NULL, up->data, pi_nelements(up), act, mode };
    pi_threadpool_run(be->pool, glu_task, &a);
    return PI_OK;
}

static pi_status cpu_scale(pi_backend *be, pi_tensor *x, float s) {
    float *d = x->data;
    for (int64_t i = 0, n = pi_nelements(x); i < n; i++) d[i] *= s;
    return PI_OK;
}

static pi_status cpu_fill(pi_backend *be, pi_tensor *x, float value) {
    float *d = x->data;
    for (int64_t i = 0, n = pi_nelements(x); i < n; i++) d[i] = value;
    return PI_OK;
}

static pi_status cpu_get_rows(pi_backend *be, const pi_tensor *table, const int32_t *ids, int64_t n, pi_tensor *out) {
    return pi_op_get_rows(be->pool, table, ids, n, out);
}

static pi_status cpu_set_rows(pi_backend *be, pi_tensor *dst, const pi_tensor *src, const int32_t *rows) {
    const pi_type_traits *tr = pi_traits(dst->type);
    if (!tr || !tr->from_f32) return pi_fail(PI_ERR_UNSUPPORTED, "set_rows: type %s", pi_type_name(dst->type));
    for (int64_t t = 0; t < src->ne[1]; t++) {
        if (rows[t] < 0 || rows[t] >= dst->ne[1])
            return pi_fail(PI_ERR_INVALID_ARG, "set_rows: row %d is out of range", rows[t]);
        tr->from_f32((const float *)((const char *)src->data + t * src->nb[1]),
                     (char *)dst->data + rows[t] * dst->nb[1], src->ne[0]);
    }
    return PI_OK;
}

static pi_status cpu_copy_2d(pi_backend *be, const pi_tensor *src, pi_tensor *dst) {
    for (int64_t t = 0; t < src->ne[1]; t++)
        memcpy((char *)dst->data + t * dst->nb[1], (const char *)src->data + t * src->nb[1],
               (size_t)src->ne[0] * sizeof(float));
    return PI_OK;
}

static pi_status cpu_predictor(pi_backend *be, const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                               pi_tensor *scores) {
    const size_t hidden = align_up((size_t)(fc1->ne[1] * x->ne[1]) * sizeof(float), 64);
    return pi_predictor(be->pool, fc1, fc2, x, scores, be->scratch, (char *)be->scratch + hidden);
}

static pi_status cpu_sparse_ffn(pi_backend *be, const pi_sparse_ffn_weights *w, const int32_t *bucket, int32_t act,
                                int32_t mode, const pi_tensor *x, const pi_tensor *scores, float threshold,
                                const uint8_t *skip, pi_tensor *out, int64_t *n_active, int64_t *neuron_counts) {
    const int64_t T = x->ne[1], F = scores->ne[0];
    int64_t pairs = 0;
    if (!bucket) {
        pi_status r = pi_sparse_ffn_skip(be->pool, w, act, mode, x, scores, threshold, skip, out, &pairs, neuron_counts,
                                         (char *)be->scratch + align_up((size_t)(T * F) * sizeof(float), 64) +
                                             align_up((size_t)F * sizeof(int64_t), 64));
        if (n_active) *n_active += pairs;
        return r;
    }
    /* compact rows: the scores of the bucket's neurons, gathered in bucket order, so row j reads neuron bucket[j] */
    if (skip) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn: a bucket and a skip mask together");
    const int64_t k = w->up.ne[1];
    float *sc = be->scratch;
    int64_t *cnt = (int64_t *)((char *)be->scratch + align_up((size_t)(T * F) * sizeof(float), 64));
    for (int64_t t = 0; t < T; t++) {
        const float *s = (const float *)((const char *)scores->data + t * scores->nb[1]);
        for (int64_t j = 0; j < k; j++) sc[t * k + j] = s[bucket[j]];
    }
    pi_tensor st = pi_tensor_view(PI_TYPE_F32, sc, 2, (int64_t[]){ k, T });
    if (neuron_counts) memset(cnt, 0, (size_t)k * sizeof(int64_t));
    pi_status r = pi_sparse_ffn_skip(be->pool, w, act, mode, x, &st, threshold, NULL, out, &pairs,
                                     neuron_counts ? cnt : NULL, (char *)cnt + align_up((size_t)F * sizeof(int64_t), 64));
    if (n_active) *n_active += pairs;
    if (r == PI_OK && neuron_counts)
        for (int64_t j = 0; j < k; j++) neuron_counts[bucket[j]] += cnt[j];
    return r;
}

static int32_t cpu_supports(pi_backend *be, int32_t op, int32_t type) {
    PI_UNUSED(be);
    if (op == PI_BOP_MUL_MAT || op == PI_BOP_GET_ROWS || op == PI_BOP_PREDICTOR || op == PI_BOP_SPARSE_FFN)
        return type < 0 || pi_traits(type) != NULL;
    return 1;
}

static size_t cpu_scratch(pi_backend *be, const pi_scratch_need *need) { PI_UNUSED(be); return pi_cpu_scratch_bytes(need); }

/* ---- CPU memory ---- */

static pi_status host_alloc(pi_backend *be, size_t bytes, void **out) {
    *out = pi_alloc_lines(bytes);
    return *out ? PI_OK : pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory (%zu bytes)", bytes);
}
static void host_free(pi_backend *be, void *ptr, size_t bytes) { free(ptr); }
static pi_status host_copy(pi_backend *be, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memcpy(dst, src, bytes);
    return PI_OK;
}
static pi_status host_sync(pi_backend *be) { return PI_OK; }
static void cpu_release(pi_backend *be) {
    free(be->scratch);
    pi_rope_cache_free(be->impl);
    free(be->impl);
}

const pi_backend_i pi_cpu_ops_template = {
    .name = "CPU", .alloc = host_alloc, .free = host_free, .upload = host_copy, .download = host_copy,
    .copy = host_copy, .sync = host_sync, .supports_op = cpu_supports, .scratch_bytes = cpu_scratch,
    .release = cpu_release, .mul_mat = cpu_mul_mat, .mul_mats = cpu_mul_mats, .rms_norm = cpu_rms_norm,
    .layer_norm = cpu_layer_norm, .rope = cpu_rope, .attention = cpu_attention, .binary = cpu_binary, .glu = cpu_glu,
    .scale = cpu_scale, .fill = cpu_fill, .get_rows = cpu_get_rows, .set_rows = cpu_set_rows, .copy_2d = cpu_copy_2d,
    .predictor = cpu_predictor, .sparse_ffn = cpu_sparse_ffn,
};

pi_status pi_backend_cpu_create(pi_threadpool *pool, const pi_scratch_need *need, pi_backend **out) {
    *out = NULL;
    pi_backend *be = calloc(1, sizeof *be);
    if (!be) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    *be = (pi_backend){ .i = &pi_cpu_ops_template, .host = 1, .device = -1, .pool = pool };
    be->scratch_bytes = pi_cpu_scratch_bytes(need);
    be->impl = calloc(1, sizeof(pi_rope_cache));   /* the emulated device keeps none: a GPU computes its own */
    if (!(be->scratch = pi_alloc_lines(be->scratch_bytes)) || !be->impl) {
        const size_t bytes = be->scratch_bytes;
        free(be->scratch);
        free(be->impl);
        free(be);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for %zu bytes of scratch", bytes);
    }
    *out = be;
    return PI_OK;
}

void pi_backend_free(pi_backend *be) {
    if (!be) return;
    if (be->i->release) be->i->release(be);
    free(be);
}

/* ---- the emulated device ---- */

static pthread_once_t emu_once = PTHREAD_ONCE_INIT;
static int64_t emu_capacity;                     /* bytes; 0: no emulated device */
static atomic_llong emu_allocated, emu_peak;

static void emu_read_env(void) {
    const char *s = getenv(EMU_ENV);
    if (!s || !*s) return;
    char *end;
    const double mib = strtod(s, &end);
    if (end == s || *end || !(mib > 0) || mib > (double)(1 << 30)) {
        fprintf(stderr, "powerinfer: %s=%s is not a positive number of MiB: no emulated device\n", EMU_ENV, s);
        return;
    }
    emu_capacity = (int64_t)(mib * 1048576.0);
}

int64_t pi_emulated_capacity(void) {
    pthread_once(&emu_once, emu_read_env);
    return emu_capacity;
}

static pi_status emu_alloc(pi_backend *be, size_t bytes, void **out) {
    *out = NULL;
    const long long n = (long long)align_up(PI_MAX(bytes, 1), EMU_ALIGN);
    const long long now = atomic_fetch_add(&emu_allocated, n) + n;
    if (now > pi_emulated_capacity()) {
        atomic_fetch_sub(&emu_allocated, n);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "emulated GPU: out of device memory: %lld bytes asked, %lld of %lld in use",
                       n, now - n, (long long)pi_emulated_capacity());
    }
    long long peak = atomic_load(&emu_peak);
    while (now > peak && !atomic_compare_exchange_weak(&emu_peak, &peak, now)) {}
    if (!(*out = pi_alloc_lines((size_t)n))) {
        atomic_fetch_sub(&emu_allocated, n);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "emulated GPU: host out of memory for %lld bytes", n);
    }
    return PI_OK;
}

static void emu_free(pi_backend *be, void *ptr, size_t bytes) {
    if (!ptr) return;
    free(ptr);
    atomic_fetch_sub(&emu_allocated, (long long)align_up(PI_MAX(bytes, 1), EMU_ALIGN));
}

static void emu_release(pi_backend *be) { emu_free(be, be->scratch, be->scratch_bytes); }

static size_t emu_scratch(pi_backend *be, const pi_scratch_need *need) {
    pi_scratch_need n = *need;
    n.file_layout = 1;
    return pi_cpu_scratch_bytes(&n);
}

static pi_backend_i emu_ops;
static pthread_once_t emu_ops_once = PTHREAD_ONCE_INIT;
static void emu_ops_init(void) {
    emu_ops = pi_cpu_ops_template;
    emu_ops.name = "emulated GPU";
    emu_ops.alloc = emu_alloc;
    emu_ops.free = emu_free;
    emu_ops.scratch_bytes = emu_scratch;
    emu_ops.release = emu_release;
}

pi_status pi_backend_device_create(int32_t device, pi_threadpool *pool, const pi_scratch_need *need,
                                   pi_backend **out) {
    *out = NULL;
    if (device < 0 || device >= pi_device_count())
        return pi_fail(PI_ERR_INVALID_ARG, "GPU device %d does not exist (%d devices)", device, pi_device_count());
    if (pi_emulated_capacity() <= 0) return pi_backend_cuda_create(device, need, out);
    pthread_once(&emu_ops_once, emu_ops_init);
    pi_backend *be = calloc(1, sizeof *be);
    if (!be) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    *be = (pi_backend){ .i = &emu_ops, .host = 0, .device = device, .pool = pool };
    be->scratch_bytes = emu_scratch(be, need);
    pi_status st = emu_alloc(be, be->scratch_bytes, &be->scratch);
    if (st != PI_OK) { free(be); return st; }
    *out = be;
    return PI_OK;
}

size_t pi_backend_device_scratch_bytes(int32_t device, const pi_scratch_need *need) {
    if (device < 0 || device >= pi_device_count()) return 0;
    return pi_backend_plan_scratch_bytes(need);
}

size_t pi_backend_plan_scratch_bytes(const pi_scratch_need *need) {
    if (pi_emulated_capacity() <= 0 && pi_cuda_compiled() != PI_GPU_NONE) return pi_backend_cuda_scratch_bytes(need);
    return align_up(emu_scratch(NULL, need), EMU_ALIGN);
}

/* ---- the device list (powerinfer.h) ---- */

int32_t pi_device_count(void) {
    return pi_emulated_capacity() > 0 ? 1 : pi_backend_cuda_devices();
}

pi_status pi_device_get_info(int32_t device, pi_device_info *out) {
    if (!out) return pi_fail(PI_ERR_INVALID_ARG, "pi_device_get_info: out is NULL");
    memset(out, 0, sizeof *out);
    if (device < 0 || device >= pi_device_count())
        return pi_fail(PI_ERR_INVALID_ARG, "GPU device %d does not exist (%d devices)", device, pi_device_count());
    out->device = device;
    if (pi_emulated_capacity() > 0) {
        snprintf(out->backend, sizeof out->backend, "emulated");
        snprintf(out->name, sizeof out->name, "emulated GPU (%s=%.0f)", EMU_ENV, (double)emu_capacity / 1048576.0);
        out->total_bytes = emu_capacity;
        out->free_bytes = emu_capacity - atomic_load(&emu_allocated);
        return PI_OK;
    }
    snprintf(out->backend, sizeof out->backend, "%s", pi_backend_cuda_name() ? pi_backend_cuda_name() : "none");
    return pi_backend_cuda_info(device, out->name, sizeof out->name, &out->free_bytes, &out->total_bytes);
}

int64_t pi_device_allocated_bytes(void) {
    return pi_emulated_capacity() > 0 ? (int64_t)atomic_load(&emu_allocated) : pi_backend_cuda_allocated();
}

int64_t pi_device_peak_bytes(void) {
    return pi_emulated_capacity() > 0 ? (int64_t)atomic_load(&emu_peak) : pi_backend_cuda_peak();
}

void pi_device_reset_peak(void) {
    if (pi_emulated_capacity() > 0) atomic_store(&emu_peak, atomic_load(&emu_allocated));
    else pi_backend_cuda_reset_peak();
}

const char *pi_gpu_backend_name(void) {
    return pi_emulated_capacity() > 0 ? "emulated" : pi_backend_cuda_name() ? pi_backend_cuda_name() : "none";
}
