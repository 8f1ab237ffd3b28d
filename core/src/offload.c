/* offload.c: pi_context_offload, the placement of a context's layers on a device.
 *
 * The placement itself is decided by the caller (Python's gpu_split: budget -> plan -> hot neurons
 * from the .gpuidx file; or -ngl for dense files). Here it is checked, its device bytes are counted
 * (weights in the file's layout, hot rows gathered into compact [n_embd, n_hot] matrices and their
 * bucket, the KV cache of the device's layers, the compute buffers and scratch) and compared with the
 * budget before anything is allocated; then the device backend is created, the tensors are uploaded
 * and the per-layer table (ctx->lx) is pointed at them. The forward pass (context.c) reads only that
 * table. Any failure leaves the context as it was (all on the CPU). */
#include "context.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

struct pi_device_state {
    pi_layer *dl;            /* [n_layer] device views */
    pi_tensor out_w, out_norm, out_norm_b;
    void    **ptr;           /* every device allocation, for the release */
    size_t   *bytes;
    int32_t   n, cap;
    uint8_t **masks;         /* [n_layer] host hot masks */
    int32_t   n_layer;       /* (the release must not read the model: it may be gone at process exit) */
};

static size_t pad(size_t n) { return (n + 255) / 256 * 256; }

static size_t tensor_bytes(const pi_tensor *t) {
    if (!t->data) return 0;
    return (size_t)pi_row_bytes(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

/* The fields of a layer that go to the device with its attention, with a sparse FFN's main part,
 * and with a dense FFN. */
#define F(name) offsetof(pi_layer, name)
static const size_t ATTN_FIELDS[] = { F(attn_norm), F(attn_norm_b), F(attn_norm_2), F(attn_norm_2_b), F(wqkv),
                                      F(wq), F(wk), F(wv), F(bq), F(bk), F(bv), F(q_norm), F(k_norm), F(wo),
                                      F(bo), F(attn_sinks), F(post_attn_norm) };
static const size_t SPARSE_IO_FIELDS[] = { F(fc1), F(fc2), F(ffn_norm), F(ffn_norm_b), F(post_ffn_norm) };
static const size_t DENSE_IO_FIELDS[] = { F(ffn_norm), F(ffn_norm_b), F(post_ffn_norm), F(ple_gate), F(ple_proj),
                                          F(ple_norm) };   /* the per-layer embedding runs after the FFN, there */
static const size_t DENSE_FFN_FIELDS[] = { F(ffn_gate), F(ffn_up), F(ffn_down) };
static const size_t HOT_FIELDS[] = { F(ffn_gate), F(ffn_up), F(ffn_down_t) };
#undef F
#define N(a) (sizeof(a) / sizeof((a)[0]))
#define FIELD(L, off) ((pi_tensor *)((char *)(L) + (off)))

static size_t fields_bytes(const pi_layer *L, const size_t *fields, size_t n) {
    size_t b = 0;
    for (size_t i = 0; i < n; i++) b += pad(tensor_bytes(FIELD(L, fields[i])));
    return b;
}

static size_t hot_bytes(const pi_layer *L, int64_t k, int64_t F) {
    size_t b = 0;
    for (size_t i = 0; i < N(HOT_FIELDS); i++) {
        const pi_tensor *t = FIELD(L, HOT_FIELDS[i]);
        if (t->data) b += pad(k == F ? tensor_bytes(t) : (size_t)t->nb[1] * (size_t)k);
    }
    return b + (k < F ? pad((size_t)k * sizeof(int32_t)) : 0);
}

static pi_status dalloc(pi_context *ctx, size_t bytes, void **out) {
    pi_device_state *ds = ctx->ds;
    if (ds->n == ds->cap) {
        const int32_t cap = ds->cap ? 2 * ds->cap : 64;
        void **p = realloc(ds->ptr, (size_t)cap * sizeof *p);
        if (p) ds->ptr = p;
        size_t *b = p ? realloc(ds->bytes, (size_t)cap * sizeof *b) : NULL;
        if (b) ds->bytes = b;
        if (!p || !b) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
        ds->cap = cap;
    }
    pi_backend *be = ctx->dev.be;
    pi_status st = be->i->alloc(be, bytes, out);
    if (st != PI_OK) return st;
    ds->ptr[ds->n] = *out;
    ds->bytes[ds->n++] = bytes;
    return PI_OK;
}

/* dst = a device copy of src (the file's layout); an absent tensor stays absent. */
static pi_status upload(pi_context *ctx, const pi_tensor *src, pi_tensor *dst) {
    *dst = *src;
    if (!src->data) return PI_OK;
    pi_backend *be = ctx->dev.be;
    int32_t op = src->type == PI_TYPE_F32 && src->ne[1] == 1 ? PI_BOP_BINARY : PI_BOP_MUL_MAT;
    if (!be->i->supports_op(be, op, src->type))
        return pi_fail(PI_ERR_UNSUPPORTED, "%s: no kernels for a %s weight", be->i->name, pi_type_name(src->type));
    void *p;
    const size_t bytes = tensor_bytes(src);
    {
        pi_status st = dalloc(ctx, bytes, &p);
        if (st != PI_OK) return st;
        st = be->i->upload(be, p, src->data, bytes);
        if (st != PI_OK) return st;
    }
    dst->data = p;
    return PI_OK;
}

static pi_status upload_fields(pi_context *ctx, const pi_layer *src, pi_layer *dst, const size_t *fields, size_t n) {
    for (size_t i = 0; i < n; i++) {
        pi_status st = upload(ctx, FIELD(src, fields[i]), FIELD(dst, fields[i]));
        if (st != PI_OK) return st;
    }
    return PI_OK;
}

/* The hot rows of gate/up/down_t (file layout) gathered on the host into compact matrices, uploaded. */
static pi_status upload_hot(pi_context *ctx, int32_t il, const pi_layer_placement *pl, pi_layer_exec *lx) {
    const pi_model *m = ctx->model;
    const pi_layer *FL = &m->file_layers[il];
    const int64_t F = m->hp.n_ff, k = pl->n_hot;
    pi_layer *DL = &ctx->ds->dl[il];
    pi_status st = PI_OK;
    if (k == F) {
        st = upload_fields(ctx, FL, DL, HOT_FIELDS, N(HOT_FIELDS));
        if (st != PI_OK) return st;
    } else {
        for (size_t i = 0; i < N(HOT_FIELDS) && st == PI_OK; i++) {
            const pi_tensor *t = FIELD(FL, HOT_FIELDS[i]);
            pi_tensor *d = FIELD(DL, HOT_FIELDS[i]);
            *d = *t;
            if (!t->data) continue;
            if (!ctx->dev.be->i->supports_op(ctx->dev.be, PI_BOP_SPARSE_FFN, t->type))
                return pi_fail(PI_ERR_UNSUPPORTED, "%s: no sparse FFN kernels for %s", ctx->dev.be->i->name,
                               pi_type_name(t->type));
            const size_t rb = (size_t)t->nb[1];
            char *stage = malloc(rb * (size_t)k);
            if (!stage) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for %lld hot rows", (long long)k);
            for (int64_t j = 0; j < k; j++) memcpy(stage + (size_t)j * rb, (const char *)t->data + (size_t)pl->hot[j] * rb, rb);
            void *p = NULL;
            st = dalloc(ctx, rb * (size_t)k, &p);
            if (st == PI_OK) st = ctx->dev.be->i->upload(ctx->dev.be, p, stage, rb * (size_t)k);
            free(stage);
            d->ne[1] = k;
            d->nb[2] = d->nb[3] = (int64_t)rb * k;
            d->data = p;
        }
        if (st != PI_OK) return st;
        void *b = NULL;
        st = dalloc(ctx, (size_t)k * sizeof(int32_t), &b);
        if (st == PI_OK) st = ctx->dev.be->i->upload(ctx->dev.be, b, pl->hot, (size_t)k * sizeof(int32_t));
        if (st != PI_OK) return st;
        lx->bucket = b;
    }
    lx->n_hot = k;
    lx->hot = (pi_sparse_ffn_weights){ .gate = DL->ffn_gate, .up = DL->ffn_up, .down_t = DL->ffn_down_t };
    if (k < F) {
        uint8_t *mask = calloc((size_t)F, 1);
        if (!mask) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
        for (int64_t j = 0; j < k; j++) mask[pl->hot[j]] = 1;
        ctx->ds->masks[il] = mask;
        lx->hot_mask = mask;
    }
    return PI_OK;
}

void pi_offload_release(pi_context *ctx) {
    pi_device_state *ds = ctx->ds;
    if (ds) {
        for (int32_t i = ds->n - 1; i >= 0; i--) ctx->dev.be->i->free(ctx->dev.be, ds->ptr[i], ds->bytes[i]);
        for (int32_t il = 0; ds->masks && il < ds->n_layer; il++) free(ds->masks[il]);
        free(ds->masks);
        free(ds->ptr);
        free(ds->bytes);
        free(ds->dl);
        free(ds);
        ctx->ds = NULL;
    }
    pi_buffers_free(&ctx->dev);
    pi_backend_free(ctx->dev.be);
    ctx->dev.be = NULL;
    memset(&ctx->ostats, 0, sizeof ctx->ostats);
    ctx->ostats.device = -1;
}

static pi_scratch_need need_of(const pi_model *m, int32_t n_ctx, int32_t n_batch) {
    return (pi_scratch_need){ .model = m, .T = PI_MIN(n_batch, n_ctx), .n_ctx = n_ctx, .file_layout = 1 };
}

int64_t pi_offload_compute_bytes(const pi_model *model, int32_t device, int32_t n_ctx, int32_t n_batch) {
    if (!model) { pi_fail(PI_ERR_INVALID_ARG, "pi_offload_compute_bytes: model is NULL"); return -1; }
    if (n_ctx < 1 || n_batch < 1) { pi_fail(PI_ERR_INVALID_ARG, "pi_offload_compute_bytes: n_ctx, n_batch >= 1"); return -1; }
    if (device < 0 || device >= pi_device_count()) {
        pi_fail(PI_ERR_INVALID_ARG, "GPU device %d does not exist (%d devices)", device, pi_device_count());
        return -1;
    }
    const pi_scratch_need need = need_of(model, n_ctx, n_batch);
    return (int64_t)(pi_buffers_bytes(model, need.T, n_ctx, true) + pad(pi_backend_device_scratch_bytes(device, &need)));
}

int64_t pi_offload_plan_compute_bytes(const pi_model *model, int32_t n_ctx, int32_t n_batch) {
    if (!model) { pi_fail(PI_ERR_INVALID_ARG, "pi_offload_plan_compute_bytes: model is NULL"); return -1; }
    if (n_ctx < 1 || n_batch < 1) {
        pi_fail(PI_ERR_INVALID_ARG, "pi_offload_plan_compute_bytes: n_ctx, n_batch >= 1");
        return -1;
    }
    const pi_scratch_need need = need_of(model, n_ctx, n_batch);
    return (int64_t)(pi_buffers_bytes(model, need.T, n_ctx, true) + pad(pi_backend_plan_scratch_bytes(&need)));
}

pi_status pi_context_offload_stats(const pi_context *ctx, pi_offload_stats *out) {
    if (!ctx || !out) return pi_fail(PI_ERR_INVALID_ARG, "pi_context_offload_stats: NULL argument");
    *out = ctx->ostats;
    return PI_OK;
}

static pi_status check_params(const pi_context *ctx, const pi_offload_params *p, bool *any) {
    const pi_model *m = ctx->model;
    const pi_hparams *hp = &m->hp;
    *any = false;
    if (p->n_layer != hp->n_layer)
        return pi_fail(PI_ERR_INVALID_ARG, "offload: %d layer placements for a model of %d layers", p->n_layer, hp->n_layer);
    if (!p->layers) return pi_fail(PI_ERR_INVALID_ARG, "offload: layers is NULL");
    if (p->output != PI_PLACE_CPU && p->output != PI_PLACE_DEVICE)
        return pi_fail(PI_ERR_INVALID_ARG, "offload: output placement %d is not PI_PLACE_CPU or PI_PLACE_DEVICE", p->output);
    *any = p->output == PI_PLACE_DEVICE;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi_layer_placement *pl = &p->layers[il];
        if ((pl->attn != PI_PLACE_CPU && pl->attn != PI_PLACE_DEVICE) || (pl->ffn != PI_PLACE_CPU && pl->ffn != PI_PLACE_DEVICE))
            return pi_fail(PI_ERR_INVALID_ARG, "offload: layer %d: placements must be PI_PLACE_CPU or PI_PLACE_DEVICE", il);
        if (!hp->sparse && pl->n_hot != 0)
            return pi_fail(PI_ERR_INVALID_ARG, "offload: layer %d: hot neurons need a sparse (PowerInfer) model; "
                           "place a dense FFN with ffn = PI_PLACE_DEVICE", il);
        if (hp->sparse && pl->ffn != PI_PLACE_CPU)
            return pi_fail(PI_ERR_INVALID_ARG, "offload: layer %d: a sparse FFN is placed by n_hot, not ffn", il);
        if (pl->n_hot < 0 || pl->n_hot > hp->n_ff)
            return pi_fail(PI_ERR_INVALID_ARG, "offload: layer %d: n_hot = %d is out of [0, %d]", il, pl->n_hot, hp->n_ff);
        if (pl->n_hot > 0 && pl->attn != PI_PLACE_DEVICE)
            return pi_fail(PI_ERR_INVALID_ARG, "offload: layer %d: hot neurons need the layer's attention and "
                           "predictor on the device", il);
        if (pl->n_hot > 0 && pl->n_hot < hp->n_ff) {
            if (!pl->hot) return pi_fail(PI_ERR_INVALID_ARG, "offload: layer %d: hot is NULL", il);
            for (int32_t j = 0; j < pl->n_hot; j++)
                if (pl->hot[j] < 0 || pl->hot[j] >= hp->n_ff || (j > 0 && pl->hot[j] <= pl->hot[j - 1]))
                    return pi_fail(PI_ERR_INVALID_ARG, "offload: layer %d: hot neuron ids must be ascending, distinct "
                                   "and in [0, %d) (entry %d is %d)", il, hp->n_ff, j, pl->hot[j]);
        }
        *any = *any || pl->attn == PI_PLACE_DEVICE || pl->ffn == PI_PLACE_DEVICE;
    }
    if (*any && (hp->arch == PI_ARCH_FALCON || hp->arch == PI_ARCH_OPT))
        return pi_fail(PI_ERR_UNSUPPORTED, "offload: falcon and opt models run on the CPU only so far");
    if (*any && hp->ffn_act == PI_ACT_XIELU)
        return pi_fail(PI_ERR_UNSUPPORTED, "offload: the xIELU activation (apertus) runs on the CPU only so far");
    if (*any && (hp->parallel_block || hp->layer_norm))
        return pi_fail(PI_ERR_UNSUPPORTED, "offload: models with parallel blocks and LayerNorm (command-r, cohere2) "
                       "run on the CPU only so far (the device backend has no LayerNorm)");
    if (*any && hp->shortconv)   /* shortconv.c: host scratch, no device kernels */
        return pi_fail(PI_ERR_UNSUPPORTED, "offload: lfm2 models run on the CPU only so far (their short conv layers "
                       "and recurrent states)");
    if (*any && (hp->ssm_d_state > 0 || hp->attn_output_gate))   /* gdn.c: host scratch, no device kernels */
        return pi_fail(PI_ERR_UNSUPPORTED, "offload: qwen35 / qwen35moe / qwen3next models run on the CPU only so far "
                       "(their gated delta net layers and recurrent states, and the gated attention)");
    for (int32_t il = 0; *any && hp->mla_kv_rank > 0 && il < hp->n_layer; il++)
        if (p->layers[il].attn != PI_PLACE_CPU)   /* mla_attention's per-head products and strided views */
            return pi_fail(PI_ERR_UNSUPPORTED, "offload: layer %d: the MLA attention of deepseek2 models runs on the "
                           "CPU only (place its attention on the CPU, or run without -ngl)", il);
    for (int32_t il = 0; *any && il < hp->n_layer; il++) {   /* a shared KV cache lives with its layers' attention */
        const int32_t src = m->geom[il].kv_source;
        if (src != il && p->layers[il].attn != p->layers[src].attn)
            return pi_fail(PI_ERR_UNSUPPORTED, "offload: layer %d attends over layer %d's KV cache: place both "
                           "attentions on the device or both on the CPU", il, src);
    }
    if (*any && (p->device < 0 || p->device >= pi_device_count()))
        return pi_fail(PI_ERR_UNSUPPORTED, "offload: GPU device %d does not exist (%d devices; set "
                       "POWERINFER_EMULATED_GPU_MIB=N for an emulated one)", p->device, pi_device_count());
    return PI_OK;
}

pi_status pi_context_offload(pi_context *ctx, const pi_offload_params *p) {
    if (!ctx || !p) return pi_fail(PI_ERR_INVALID_ARG, "pi_context_offload: NULL argument");
    if (ctx->dev.be) return pi_fail(PI_ERR_INVALID_ARG, "pi_context_offload: the context is already offloaded");
    if (pi_kv_used_cells(ctx) > 0)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_context_offload: call it before the first decode (the KV cache is in use)");
    bool any;
    pi_status st = check_params(ctx, p, &any);
    if (st != PI_OK || !any) return st;
    if (pi_is_encoder(&ctx->model->hp))
        return pi_fail(PI_ERR_UNSUPPORTED, "offload: encoder models (bert family) run on the CPU only");
    const pi_model *m = ctx->model;
    const pi_hparams *hp = &m->hp;
    const int64_t F = hp->n_ff;

    /* count every device byte first */
    pi_offload_stats s = { .device = p->device, .output = p->output };
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi_layer_placement *pl = &p->layers[il];
        const pi_layer *FL = &m->file_layers[il];
        if (pl->attn == PI_PLACE_DEVICE) {
            s.n_attn_layers++;
            s.model_bytes += (int64_t)fields_bytes(FL, ATTN_FIELDS, N(ATTN_FIELDS));
            if (ctx->kv.layer[il].own)   /* a shared layer's is its source's */
                s.kv_bytes += (int64_t)(pad((size_t)ctx->kv.n_ctx * (size_t)ctx->kv.layer[il].k_row_bytes) +
                                        pad((size_t)ctx->kv.n_ctx * (size_t)ctx->kv.layer[il].v_row_bytes));
            if (hp->sparse) s.model_bytes += (int64_t)fields_bytes(FL, SPARSE_IO_FIELDS, N(SPARSE_IO_FIELDS));
        }
        if (!hp->sparse && pl->ffn == PI_PLACE_DEVICE) {
            s.n_ffn_layers++;
            s.model_bytes += (int64_t)fields_bytes(FL, DENSE_IO_FIELDS, N(DENSE_IO_FIELDS));
            s.ffn_bytes += (int64_t)fields_bytes(FL, DENSE_FFN_FIELDS, N(DENSE_FFN_FIELDS));
        }
        if (hp->sparse && pl->n_hot > 0) {
            s.n_ffn_layers++;
            s.n_hot += pl->n_hot;
            s.ffn_bytes += (int64_t)hot_bytes(FL, pl->n_hot, F);
        }
    }
    if (s.n_attn_layers > 0 && m->rope_freqs.data) s.model_bytes += (int64_t)pad(tensor_bytes(&m->rope_freqs));
    if (p->output == PI_PLACE_DEVICE)
        s.model_bytes += (int64_t)(pad(tensor_bytes(&m->output_norm)) + pad(tensor_bytes(&m->output_norm_b)) +
                                   pad(tensor_bytes(&m->output_file)));
    s.compute_bytes = pi_offload_compute_bytes(m, p->device, ctx->params.n_ctx, ctx->params.n_batch);
    if (s.compute_bytes < 0) return PI_ERR_INVALID_ARG;
    s.total_bytes = s.model_bytes + s.ffn_bytes + s.kv_bytes + s.compute_bytes;
    if (p->budget_bytes > 0 && s.total_bytes > p->budget_bytes)
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "offload: the placement needs %lld device bytes (weights %lld, FFN %lld, "
                       "KV cache %lld, compute %lld), more than the budget of %lld", (long long)s.total_bytes,
                       (long long)s.model_bytes, (long long)s.ffn_bytes, (long long)s.kv_bytes,
                       (long long)s.compute_bytes, (long long)p->budget_bytes);

    /* allocate and upload */
    const pi_scratch_need need = need_of(m, ctx->params.n_ctx, ctx->params.n_batch);
    st = pi_backend_device_create(p->device, ctx->pool, &need, &ctx->dev.be);
    if (st != PI_OK) return st;
    if (!(ctx->ds = calloc(1, sizeof *ctx->ds)) || !(ctx->ds->dl = calloc((size_t)hp->n_layer, sizeof(pi_layer))) ||
        !(ctx->ds->masks = calloc((size_t)hp->n_layer, sizeof(uint8_t *)))) {
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    ctx->ds->n_layer = hp->n_layer;
    pi_backend *be = ctx->dev.be;
    /* the rest in one device allocation where the backend can (the scratch is allocated already) */
    const size_t created = pi_backend_device_scratch_bytes(p->device, &need);
    if (be->i->reserve && (st = be->i->reserve(be, (size_t)s.total_bytes - created)) != PI_OK) goto fail;
    if (ctx->neuron_counts && s.n_hot > 0 && !be->i->supports_op(be, PI_BOP_NEURON_COUNTS, -1)) {
        st = pi_fail(PI_ERR_UNSUPPORTED, "offload: %s cannot count neurons (count_neurons)", be->i->name);
        goto fail;
    }
    for (int half = 0; half < 2 && s.n_attn_layers > 0; half++) {
        const int32_t type = half ? ctx->kv.type_v : ctx->kv.type_k;
        if (!be->i->supports_op(be, PI_BOP_KV_CACHE, type)) {
            st = pi_fail(PI_ERR_UNSUPPORTED, "offload: %s has no %s cache of type %s (layers whose attention is on "
                         "the device keep their KV cache there): use f16 or f32, or keep attention on the CPU",
                         be->i->name, half ? "V" : "K", pi_type_name(type));
            goto fail;
        }
    }
    if (hp->post_norms_only && !be->i->supports_op(be, PI_BOP_COPY_2D, -1)) {
        st = pi_fail(PI_ERR_UNSUPPORTED, "offload: %s cannot run blocks without pre-norms (olmo2: their input is a "
                     "copy of the residual stream)", be->i->name);
        goto fail;
    }
    if (s.n_attn_layers > 0 && m->rope_freqs.data && !be->i->supports_op(be, PI_BOP_ROPE_FREQS, -1)) {
        st = pi_fail(PI_ERR_UNSUPPORTED, "offload: %s has no rope with frequency factors (rope_freqs)", be->i->name);
        goto fail;
    }
    if ((st = pi_buffers_alloc(&ctx->dev, m, need.T, ctx->params.n_ctx, true)) != PI_OK) goto fail;
    const float *rope_freqs = NULL;
    if (s.n_attn_layers > 0 && m->rope_freqs.data) {
        pi_tensor rf;
        if ((st = upload(ctx, pi_context_rope_freqs(ctx), &rf)) != PI_OK) goto fail;
        rope_freqs = rf.data;
    }
    pi_layer_exec *lx = calloc((size_t)hp->n_layer, sizeof *lx);
    if (!lx) { st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory"); goto fail; }
    memcpy(lx, ctx->lx, (size_t)hp->n_layer * sizeof *lx);   /* the CPU placement, changed where placed */
    for (int32_t il = 0; il < hp->n_layer && st == PI_OK; il++) {
        const pi_layer_placement *pl = &p->layers[il];
        const pi_layer *FL = &m->file_layers[il];
        pi_layer *DL = &ctx->ds->dl[il];
        if (pl->attn == PI_PLACE_DEVICE) {
            st = upload_fields(ctx, FL, DL, ATTN_FIELDS, N(ATTN_FIELDS));
            if (st == PI_OK && hp->sparse) st = upload_fields(ctx, FL, DL, SPARSE_IO_FIELDS, N(SPARSE_IO_FIELDS));
            const int32_t src = m->geom[il].kv_source;   /* placed before il, on the device too (check_params) */
            void *k = lx[src].k, *v = lx[src].v;
            if (st == PI_OK && src == il)
                st = dalloc(ctx, (size_t)ctx->kv.n_ctx * (size_t)ctx->kv.layer[il].k_row_bytes, &k);
            if (st == PI_OK && src == il)
                st = dalloc(ctx, (size_t)ctx->kv.n_ctx * (size_t)ctx->kv.layer[il].v_row_bytes, &v);
            lx[il].attn = &ctx->dev;
            lx[il].attn_w = DL;
            lx[il].k = k;
            lx[il].v = v;
            lx[il].rope_freqs = rope_freqs;
        }
        if (st == PI_OK && !hp->sparse && pl->ffn == PI_PLACE_DEVICE) {
            st = upload_fields(ctx, FL, DL, DENSE_IO_FIELDS, N(DENSE_IO_FIELDS));
            if (st == PI_OK) st = upload_fields(ctx, FL, DL, DENSE_FFN_FIELDS, N(DENSE_FFN_FIELDS));
            lx[il].ffn = &ctx->dev;
            lx[il].ffn_w = DL;
        }
        if (st == PI_OK && hp->sparse && pl->n_hot > 0) st = upload_hot(ctx, il, pl, &lx[il]);
    }
    if (st == PI_OK && p->output == PI_PLACE_DEVICE) {
        pi_device_state *ds = ctx->ds;
        st = upload(ctx, &m->output_norm, &ds->out_norm);
        if (st == PI_OK) st = upload(ctx, &m->output_norm_b, &ds->out_norm_b);
        if (st == PI_OK) st = upload(ctx, &m->output_file, &ds->out_w);
    }
    if (st == PI_OK) st = be->i->sync(be);
    if (st != PI_OK) { free(lx); goto fail; }
    memcpy(ctx->lx, lx, (size_t)hp->n_layer * sizeof *lx);
    free(lx);
    if (p->output == PI_PLACE_DEVICE) {
        ctx->out = &ctx->dev;
        ctx->out_w = &ctx->ds->out_w;
        ctx->out_norm = &ctx->ds->out_norm;
        ctx->out_norm_b = &ctx->ds->out_norm_b;
    }
    ctx->ostats = s;
    return PI_OK;
fail:
    pi_offload_release(ctx);
    pi_context_place_cpu(ctx);   /* the table still points at the CPU (it is replaced only on success) */
    return st;
}

int32_t pi_context_hot_neurons(pi_context *ctx, int32_t il, int32_t *ids) {
    if (!ctx) { pi_fail(PI_ERR_INVALID_ARG, "pi_context_hot_neurons: context is NULL"); return -1; }
    const pi_hparams *hp = &ctx->model->hp;
    if (il < 0 || il >= hp->n_layer) {
        pi_fail(PI_ERR_INVALID_ARG, "pi_context_hot_neurons: layer %d is out of range [0, %d)", il, hp->n_layer);
        return -1;
    }
    const pi_layer_exec *lx = &ctx->lx[il];
    if (ids && lx->n_hot > 0) {
        if (lx->bucket) {
            pi_status st = ctx->dev.be->i->download(ctx->dev.be, ids, lx->bucket, (size_t)lx->n_hot * sizeof(int32_t));
            if (st != PI_OK) return -1;
        } else {
            for (int32_t i = 0; i < hp->n_ff; i++) ids[i] = i;
        }
    }
    return (int32_t)lx->n_hot;
}
