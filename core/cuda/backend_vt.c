/* backend_vt.c: the CUDA/HIP device backend of core/src/backend.h, over the pi_cuda_* device API
 * (pi_cuda.h). Compiled by the C compiler into GPU builds (-DPI_CUDA=ON / -DPI_HIP=ON); stub.c
 * stands in otherwise. Ops are launched on one stream per context; download waits for the copy;
 * upload waits too (the forward pass reuses its host buffers right away). What the kernels do not
 * have (LayerNorm, rope frequency factors, per-neuron counts, strided copies)
 * is reported by supports_op, so pi_context_offload refuses those placements with a clear error
 * instead of failing in the middle of a decode. */
#include "backend.h"
#include "model.h"
#include "pi_cuda.h"

#include <stdio.h>

#define N_COUNTERS 256   /* sparse FFN calls between two syncs before one is forced */

typedef struct {
    pi_cuda_stream *stream;
    uint64_t       *counter;   /* device [N_COUNTERS]: (neuron, token) pairs of each sparse FFN call */
    uint64_t       *pairs;     /* pinned host [N_COUNTERS]: their asynchronous copies */
    int64_t        *dst[N_COUNTERS];   /* where each is added at the next sync */
    int32_t         n_pending;
    char           *arena;     /* reserve(): one allocation the buffers are carved from */
    size_t          arena_bytes, arena_used;
} cuda_impl;

#define S(be) (((cuda_impl *)(be)->impl)->stream)
#define UNSUP(what) pi_fail(PI_ERR_UNSUPPORTED, "CUDA backend: %s is not supported on the GPU", what)

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static pi_status cu_alloc(pi_backend *be, size_t bytes, void **out) {
    cuda_impl *c = be->impl;
    if (!c->arena) return pi_cuda_malloc(out, PI_MAX(bytes, 1));
    const size_t n = align_up(PI_MAX(bytes, 1), 256);
    if (c->arena_used + n > c->arena_bytes)
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "CUDA backend: the reserved %zu bytes are used up (%zu more asked)",
                       c->arena_bytes, n);
    *out = c->arena + c->arena_used;
    c->arena_used += n;
    return PI_OK;
}

static void cu_free(pi_backend *be, void *ptr, size_t bytes) {
    cuda_impl *c = be->impl;
    if (ptr && !(c->arena && (char *)ptr >= c->arena && (char *)ptr < c->arena + c->arena_bytes)) pi_cuda_free(ptr);
}

static pi_status cu_reserve(pi_backend *be, size_t bytes) {
    cuda_impl *c = be->impl;
    if (c->arena) return pi_fail(PI_ERR_INVALID_ARG, "CUDA backend: memory is already reserved");
    pi_status st = pi_cuda_malloc((void **)&c->arena, PI_MAX(bytes, 256));
    if (st == PI_OK) c->arena_bytes = PI_MAX(bytes, 256);
    return st;
}
/* Waits for the stream, then adds the pending sparse FFN counts where they belong. */
static pi_status cu_sync(pi_backend *be) {
    cuda_impl *c = be->impl;
    pi_status st = pi_cuda_stream_sync(c->stream);
    for (int32_t i = 0; i < c->n_pending; i++) *c->dst[i] += st == PI_OK ? (int64_t)c->pairs[i] : 0;
    c->n_pending = 0;
    return st;
}

static pi_status cu_upload(pi_backend *be, void *dst, const void *src, size_t bytes) {
    pi_status st = pi_cuda_upload(S(be), dst, src, bytes);
    return st == PI_OK ? cu_sync(be) : st;
}

static pi_status cu_download(pi_backend *be, void *dst, const void *src, size_t bytes) {
    pi_status st = pi_cuda_download(S(be), dst, src, bytes);
    return st == PI_OK ? cu_sync(be) : st;
}

static pi_status cu_copy(pi_backend *be, void *dst, const void *src, size_t bytes) {
    return dst == src ? PI_OK : pi_cuda_copy_d2d(S(be), dst, src, bytes);
}

static int32_t cu_supports(pi_backend *be, int32_t op, int32_t type) {
    switch (op) {
        case PI_BOP_MUL_MAT: case PI_BOP_GET_ROWS: case PI_BOP_PREDICTOR: case PI_BOP_SPARSE_FFN:
            return type < 0 || pi_cuda_type_supported(type);
        case PI_BOP_LAYER_NORM: case PI_BOP_ROPE_FREQS: case PI_BOP_NEURON_COUNTS: case PI_BOP_COPY_2D:
        case PI_BOP_SPARSE_BIAS:
            return 0;
        case PI_BOP_KV_CACHE:   /* the attention kernel reads f16 and f32 rows */
            return type == PI_TYPE_F16 || type == PI_TYPE_F32;
        default:
            return 1;
    }
}

static size_t cu_scratch(pi_backend *be, const pi_scratch_need *need);

static void cu_release(pi_backend *be) {
    cuda_impl *c = be->impl;
    if (be->scratch) pi_cuda_free(be->scratch);
    if (c) {
        if (c->counter) pi_cuda_free(c->counter);
        if (c->pairs) pi_cuda_host_free(c->pairs);
        if (c->arena) pi_cuda_free(c->arena);
        if (c->stream) pi_cuda_stream_free(c->stream);
        free(c);
    }
}

static pi_status cu_mul_mat(pi_backend *be, const pi_tensor *w, const pi_tensor *x, pi_tensor *y) {
    return pi_cuda_mul_mat(S(be), w, x, y, be->scratch);
}

static pi_status cu_rms_norm(pi_backend *be, const pi_tensor *x, const pi_tensor *w, float eps, pi_tensor *out) {
    return pi_cuda_rms_norm(S(be), x, w, eps, out);
}

static pi_status cu_layer_norm(pi_backend *be, const pi_tensor *x, const pi_tensor *w, const pi_tensor *b, float eps,
                               pi_tensor *out) {
    return UNSUP("LayerNorm");
}

static pi_status cu_rope(pi_backend *be, const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode,
                         float base, float scale, const float *ff, float mscale, pi_tensor *out) {
    if (ff) return UNSUP("rope with frequency factors");
    return pi_cuda_rope(S(be), x, pos, n_rot, mode, base, scale, mscale, out);
}

static pi_status cu_attention(pi_backend *be, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                              const pi_tensor *mask, float scale, float softcap, const float *sinks, pi_tensor *out) {
    return pi_cuda_attention(S(be), q, k, v, mask, scale, softcap, sinks, out, be->scratch);
}

static pi_status cu_binary(pi_backend *be, int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out) {
    return pi_cuda_binary(S(be), op, a, b, out);
}

/* act(gate) * up, act(gate) * act(up) or act(up), in place (gate is overwritten: it is a scratch buffer) */
static pi_status cu_glu(pi_backend *be, int32_t act, int32_t mode, const pi_tensor *gate, pi_tensor *up) {
    const int32_t op = act == PI_ACT_SILU ? PI_UNARY_SILU : act == PI_ACT_RELU ? PI_UNARY_RELU : PI_UNARY_GELU;
    if (mode == PI_FFN_SEQ) return pi_cuda_unary(S(be), op, up, up);
    pi_tensor g = *gate;
    pi_status st = pi_cuda_unary(S(be), op, &g, &g);
    if (st == PI_OK && mode == PI_FFN_SYM) st = pi_cuda_unary(S(be), op, up, up);
    return st == PI_OK ? pi_cuda_binary(S(be), PI_BINARY_MUL, &g, up, up) : st;
}

static pi_status cu_scale(pi_backend *be, pi_tensor *x, float s) { return pi_cuda_scale(S(be), x, s); }

static pi_status cu_fill(pi_backend *be, pi_tensor *x, float value) {
    if (value != 0.0f) return UNSUP("fill with a non-zero value");
    return pi_cuda_memset(S(be), x->data, 0, (size_t)pi_nelements(x) * sizeof(float));
}

static pi_status cu_get_rows(pi_backend *be, const pi_tensor *table, const int32_t *ids, int64_t n, pi_tensor *out) {
    return pi_cuda_get_rows(S(be), table, ids, n, out);
}

static pi_status cu_set_rows(pi_backend *be, pi_tensor *dst, const pi_tensor *src, const int32_t *rows) {
    return pi_cuda_set_rows(S(be), dst, src, rows);
}

static pi_status cu_copy_2d(pi_backend *be, const pi_tensor *src, pi_tensor *dst) { return UNSUP("strided copy"); }

static pi_status cu_predictor(pi_backend *be, const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                              pi_tensor *scores) {
    return pi_cuda_predictor(S(be), fc1, fc2, x, scores, be->scratch);
}

static pi_status cu_sparse_ffn(pi_backend *be, const pi_sparse_ffn_weights *w, const int32_t *bucket, int32_t act,
                               int32_t mode, const pi_tensor *x, const pi_tensor *scores, float threshold,
                               const uint8_t *skip, pi_tensor *out, int64_t *n_active, int64_t *neuron_counts) {
    cuda_impl *c = be->impl;
    if (skip) return UNSUP("a skip mask (the GPU computes hot neurons only)");
    if (neuron_counts) return UNSUP("per-neuron counts");
    if (w->up_bias || w->down_bias) return UNSUP("FFN biases");
    if (c->n_pending == N_COUNTERS) {
        pi_status st = cu_sync(be);
        if (st != PI_OK) return st;
    }
    const int32_t i = c->n_pending;
    pi_status st = pi_cuda_memset(S(be), c->counter + i, 0, sizeof(uint64_t));
    if (st == PI_OK)
        st = pi_cuda_sparse_ffn(S(be), w, bucket, act, mode, x, scores, threshold, out, c->counter + i, be->scratch);
    if (st == PI_OK && n_active) {   /* read at the next sync: the kernel runs while the CPU goes on */
        st = pi_cuda_download(S(be), c->pairs + i, c->counter + i, sizeof(uint64_t));
        if (st == PI_OK) c->dst[c->n_pending++] = n_active;
    }
    return st;
}

static const pi_backend_i cuda_ops = {
    .alloc = cu_alloc, .free = cu_free, .upload = cu_upload, .download = cu_download, .copy = cu_copy,
    .sync = cu_sync, .supports_op = cu_supports, .scratch_bytes = cu_scratch, .release = cu_release,
    .mul_mat = cu_mul_mat, .rms_norm = cu_rms_norm, .layer_norm = cu_layer_norm, .rope = cu_rope,
    .attention = cu_attention, .binary = cu_binary, .glu = cu_glu, .scale = cu_scale, .fill = cu_fill,
    .get_rows = cu_get_rows, .set_rows = cu_set_rows, .copy_2d = cu_copy_2d, .predictor = cu_predictor,
    .sparse_ffn = cu_sparse_ffn, .reserve = cu_reserve, .name = "CUDA",
};

/* The largest scratch any op needs: mul_mat's q8 activations, attention's scores, the predictor, the FFN. */
static size_t cu_scratch(pi_backend *be, const pi_scratch_need *need) {
    const pi_model *m = need->model;
    const pi_hparams *hp = &m->hp;
    const int64_t T = need->T;
    size_t b = pi_cuda_mul_mat_scratch(m->output_file.type, m->output_file.ne[0], T);
    b = PI_MAX(b, pi_cuda_attention_scratch(hp->n_head, T, need->n_ctx));
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi_layer *L = &m->file_layers[il];
        const pi_tensor *w[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_gate, &L->ffn_up, &L->ffn_down,
                                 &L->ple_gate, &L->ple_proj };
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]->data) b = PI_MAX(b, pi_cuda_mul_mat_scratch(w[i]->type, w[i]->ne[0], T));
        if (hp->sparse) {
            b = PI_MAX(b, pi_cuda_predictor_scratch(&L->fc1, &L->fc2, T));
            pi_sparse_ffn_weights sw = { .gate = L->ffn_gate, .up = L->ffn_up, .down_t = L->ffn_down_t };
            b = PI_MAX(b, pi_cuda_sparse_ffn_scratch(&sw, hp->n_embd, hp->n_ff, T));
        }
    }
    return align_up(b, 256) + align_up(N_COUNTERS * sizeof(uint64_t), 256);   /* + the pairs counters */
}

size_t pi_backend_cuda_scratch_bytes(const pi_scratch_need *need) { return cu_scratch(NULL, need); }

pi_status pi_backend_cuda_create(int32_t device, const pi_scratch_need *need, pi_backend **out) {
    *out = NULL;
    pi_status st = pi_cuda_init(device);
    if (st != PI_OK) return st;
    pi_backend *be = calloc(1, sizeof *be);
    cuda_impl *c = calloc(1, sizeof *c);
    if (!be || !c) { free(be); free(c); return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory"); }
    *be = (pi_backend){ .i = &cuda_ops, .host = 0, .device = device, .impl = c };
    be->scratch_bytes = cu_scratch(be, need) - align_up(N_COUNTERS * sizeof(uint64_t), 256);
    st = pi_cuda_stream_create(&c->stream);
    if (st == PI_OK) st = pi_cuda_malloc(&be->scratch, be->scratch_bytes);
    if (st == PI_OK) st = pi_cuda_malloc((void **)&c->counter, N_COUNTERS * sizeof(uint64_t));
    if (st == PI_OK) st = pi_cuda_host_alloc((void **)&c->pairs, N_COUNTERS * sizeof(uint64_t));
    if (st != PI_OK) { cu_release(be); free(be); return st; }
    *out = be;
    return PI_OK;
}

int32_t pi_backend_cuda_devices(void) { return pi_cuda_available(); }

pi_status pi_backend_cuda_info(int32_t device, char *name, size_t name_len, int64_t *free_b, int64_t *total_b) {
    pi_cuda_device_props p;
    pi_status st = pi_cuda_device_info(device, &p);
    if (st != PI_OK) return st;
    snprintf(name, name_len, "%s (cc %d.%d, %d SMs)", p.name, p.cc_major, p.cc_minor, p.n_sm);
    *free_b = p.free_bytes;
    *total_b = p.total_bytes;
    return PI_OK;
}

int64_t pi_backend_cuda_allocated(void) { return pi_cuda_allocated_bytes(); }
int64_t pi_backend_cuda_peak(void) { return pi_cuda_peak_allocated_bytes(); }
void    pi_backend_cuda_reset_peak(void) { pi_cuda_reset_peak(); }
const char *pi_backend_cuda_name(void) { return pi_cuda_compiled() == PI_GPU_HIP ? "HIP" : "CUDA"; }
