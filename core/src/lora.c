/* lora.c: LoRA adapters: their tensors checked against the model (pi_adapter_create), the context's active list
 * (pi_context_set_adapters) and the low-rank terms the forward pass adds (lora.h). */
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr) do { pi_status st_ = (expr); if (st_ != PI_OK) return st_; } while (0)
#define OP(e, name, ...) ((e)->be->i->name((e)->be, __VA_ARGS__))
#define MAX_ADAPTERS 64
/* A term of at most this many multiply-adds runs on the calling thread alone: the pool runs per adapted weight cost
 * more than the work at one token (Gemma 3 270M, rank 16 on its 126 linear weights: 0.73x the plain decode speed
 * through the pool, bench/README.md) */
#define INLINE_MACS ((int64_t)1 << 18)

/* the layer weights' GGUF names (blk.N.<part>.weight), in PI_LORA_* order */
static const char *const layer_parts[PI_LORA_LAYER_N] = {
    "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "inp_gate", "proj"
};

static const pi_tensor *layer_weight(const pi_layer *L, int32_t w) {
    switch (w) {
    case PI_LORA_Q: return &L->wq;
    case PI_LORA_K: return &L->wk;
    case PI_LORA_V: return &L->wv;
    case PI_LORA_QKV: return &L->wqkv;
    case PI_LORA_O: return &L->wo;
    case PI_LORA_GATE: return &L->ffn_gate;
    case PI_LORA_UP: return &L->ffn_up;
    case PI_LORA_PLE_GATE: return &L->ple_gate;
    case PI_LORA_PLE_PROJ: return &L->ple_proj;
    default: return &L->ffn_down;
    }
}

/* The pair slot of base name `base` (a model weight's GGUF name) and the model's tensor it adapts (file layout);
 * NULL when the model has no such weight. */
static pi_lora_pair *pair_of(pi_adapter *ad, const char *base, const pi_tensor **weight, int32_t *w_out) {
    const pi_model *m = ad->model;
    *w_out = -1;
    if (strcmp(base, "token_embd.weight") == 0) {
        *weight = &m->token_embd;
        return &ad->tok_embd;
    }
    if (strcmp(base, "output.weight") == 0) {   /* tied embeddings: the model has no output.weight */
        *weight = &m->output_file;
        return m->output_file.data != m->token_embd.data ? &ad->output : NULL;
    }
    int il = -1, n = 0;
    char part[32];
    if (sscanf(base, "blk.%d.%31[a-z_].weight%n", &il, part, &n) != 2 || base[n] != '\0' || il < 0 ||
        il >= m->hp.n_layer)
        return NULL;
    for (int32_t w = 0; w < PI_LORA_LAYER_N; w++) {
        if (strcmp(part, layer_parts[w]) != 0) continue;
        *weight = layer_weight(&m->file_layers[il], w);
        if (!(*weight)->data) return NULL;
        *w_out = w;
        return &ad->layers[il * PI_LORA_LAYER_N + w];
    }
    return NULL;
}

static pi_status add_tensor(pi_adapter *ad, const pi_tensor_desc *d) {
    const pi_hparams *hp = &ad->model->hp;
    const size_t len = d->name ? strlen(d->name) : 0;
    const bool is_a = len > 7 && strcmp(d->name + len - 7, ".lora_a") == 0;
    if (!is_a && !(len > 7 && strcmp(d->name + len - 7, ".lora_b") == 0))
        return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s' of a LoRA adapter is neither a .lora_a nor a .lora_b tensor",
                       d->name ? d->name : "(null)");
    char base[128];
    if (len - 7 >= sizeof base) return pi_fail(PI_ERR_BAD_MODEL, "LoRA tensor name '%s' is too long", d->name);
    memcpy(base, d->name, len - 7);
    base[len - 7] = '\0';
    const pi_tensor *weight = NULL;
    int32_t w = -1;
    pi_lora_pair *p = pair_of(ad, base, &weight, &w);
    if (!p)
        return pi_fail(PI_ERR_BAD_MODEL, "LoRA tensor '%s' adapts '%s', which this model does not have (hint: maybe "
                       "the wrong base model?)", d->name, base);
    if ((w == PI_LORA_GATE || w == PI_LORA_UP || w == PI_LORA_DOWN) && (hp->sparse || hp->gate_sparse))
        return pi_fail(PI_ERR_UNSUPPORTED, "LoRA tensor '%s': adapters of the FFN are not supported on a %s file (its "
                       "FFN computes only the neurons it selects); the attention's and the output's are", d->name,
                       hp->sparse ? "PowerInfer (sparse)" : "gate-sparse");
    if ((w == PI_LORA_Q || w == PI_LORA_O) && hp->mla_kv_rank > 0)   /* mla_attention applies no adapter terms */
        return pi_fail(PI_ERR_UNSUPPORTED, "LoRA tensor '%s': adapters of the MLA attention (deepseek2) are not "
                       "supported; the dense FFNs' and the output's are", d->name);
    if (w == PI_LORA_Q && hp->attn_output_gate)   /* attn_q's rows hold the queries and their gates (gdn.c) */
        return pi_fail(PI_ERR_UNSUPPORTED, "LoRA tensor '%s': adapters of attn_q with an output gate (qwen35, "
                       "qwen3next) are not supported; attn_k / attn_v / attn_output's and the FFNs' are", d->name);
    pi_tensor *t = is_a ? &p->a : &p->b;
    if (t->data) return pi_fail(PI_ERR_BAD_MODEL, "LoRA tensor '%s' appears twice", d->name);
    return pi_tensor_desc_view(d, 2, NULL, t);
}

/* both halves present and their shapes those of the weight they adapt (llama.cpp's checks) */
static pi_status check_pair(const pi_adapter *ad, const pi_lora_pair *p, const pi_tensor *weight, const char *base,
                            bool embd) {
    if (!p->a.data && !p->b.data) return PI_OK;
    if (!p->a.data || !p->b.data)
        return pi_fail(PI_ERR_BAD_MODEL, "LoRA pair for '%s' is missing its %s", base, p->a.data ? "lora_b" : "lora_a");
    const bool ok = embd ? weight->ne[0] == p->b.ne[1] && weight->ne[1] == p->a.ne[1] && p->a.ne[0] == p->b.ne[0]
                         : weight->ne[0] == p->a.ne[0] && weight->ne[1] == p->b.ne[1] && p->a.ne[1] == p->b.ne[0];
    if (!ok)
        return pi_fail(PI_ERR_BAD_MODEL, "LoRA pair for '%s' has shapes a [%lld, %lld], b [%lld, %lld] for a weight of "
                       "[%lld, %lld] (hint: maybe the wrong base model?)", base, (long long)p->a.ne[0],
                       (long long)p->a.ne[1], (long long)p->b.ne[0], (long long)p->b.ne[1], (long long)weight->ne[0],
                       (long long)weight->ne[1]);
    return PI_OK;
}

/* p->bt: b [r, n_out] transposed into r rows of n_out, f16 kept (its axpy kernels), any other type as f32 */
static pi_status transpose_b(pi_lora_pair *p) {
    const int64_t r = p->b.ne[0], N = p->b.ne[1];
    const int32_t type = p->b.type == PI_TYPE_F16 ? PI_TYPE_F16 : PI_TYPE_F32;
    const size_t elt = type == PI_TYPE_F16 ? 2 : 4;
    char *dst = pi_alloc_lines((size_t)(r * N) * elt);
    float *row = malloc((size_t)r * sizeof(float));
    if (!dst || !row) {
        free(dst);
        free(row);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for a LoRA pair");
    }
    const pi_type_traits *tr = pi_traits(p->b.type);
    for (int64_t i = 0; i < N; i++) {
        const char *src = (const char *)p->b.data + i * p->b.nb[1];
        if (type == PI_TYPE_F16) {
            for (int64_t j = 0; j < r; j++) memcpy(dst + (size_t)(j * N + i) * 2, src + j * 2, 2);
            continue;
        }
        tr->to_f32(src, row, r);
        for (int64_t j = 0; j < r; j++) ((float *)dst)[j * N + i] = row[j];
    }
    free(row);
    p->bt = pi_tensor_view(type, dst, 2, (int64_t[]){ N, r });
    return PI_OK;
}

static pi_status finish_pair(pi_lora_pair *p, float alpha, int32_t *n_pairs) {
    if (!p->a.data) return PI_OK;
    p->rank_scale = alpha != 0.0f ? alpha / (float)p->b.ne[0] : 1.0f;
    (*n_pairs)++;
    return transpose_b(p);
}

static pi_status build(pi_adapter *ad, int32_t n, const pi_tensor_desc *tensors) {
    const pi_model *m = ad->model;
    for (int32_t i = 0; i < n; i++) TRY(add_tensor(ad, &tensors[i]));
    TRY(check_pair(ad, &ad->tok_embd, &m->token_embd, "token_embd.weight", true));
    TRY(check_pair(ad, &ad->output, &m->output_file, "output.weight", false));
    TRY(finish_pair(&ad->tok_embd, ad->alpha, &ad->n_pairs));
    TRY(finish_pair(&ad->output, ad->alpha, &ad->n_pairs));
    for (int32_t il = 0; il < m->hp.n_layer; il++)
        for (int32_t w = 0; w < PI_LORA_LAYER_N; w++) {
            char base[64];
            snprintf(base, sizeof base, "blk.%d.%s.weight", il, layer_parts[w]);
            pi_lora_pair *p = &ad->layers[il * PI_LORA_LAYER_N + w];
            TRY(check_pair(ad, p, layer_weight(&m->file_layers[il], w), base, false));
            TRY(finish_pair(p, ad->alpha, &ad->n_pairs));
        }
    if (ad->n_pairs == 0) return pi_fail(PI_ERR_BAD_MODEL, "the LoRA adapter has no tensors");
    return PI_OK;
}

pi_status pi_adapter_create(const pi_model *model, float alpha, int32_t n_tensors, const pi_tensor_desc *tensors,
                            pi_adapter **out) {
    if (!model || !out || n_tensors < 0 || (n_tensors > 0 && !tensors))
        return pi_fail(PI_ERR_INVALID_ARG, "pi_adapter_create: bad arguments");
    if (!isfinite(alpha)) return pi_fail(PI_ERR_BAD_MODEL, "LoRA alpha is not a finite number");
    *out = NULL;
    pi_adapter *ad = calloc(1, sizeof *ad);
    if (ad) ad->layers = calloc((size_t)model->hp.n_layer * PI_LORA_LAYER_N, sizeof *ad->layers);
    if (!ad || !ad->layers) {
        pi_adapter_free(ad);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    }
    ad->model = model;
    ad->n_layer = model->hp.n_layer;
    ad->alpha = alpha;
    pi_status st = build(ad, n_tensors, tensors);
    if (st != PI_OK) {
        pi_adapter_free(ad);
        return st;
    }
    *out = ad;
    return PI_OK;
}

void pi_adapter_free(pi_adapter *adapter) {
    if (!adapter) return;
    if (adapter->layers)
        for (int64_t i = 0; i < (int64_t)adapter->n_layer * PI_LORA_LAYER_N; i++)
            free(adapter->layers[i].bt.data);
    free(adapter->output.bt.data);
    free(adapter->tok_embd.bt.data);
    free(adapter->layers);
    free(adapter);
}

int32_t pi_adapter_n_pairs(const pi_adapter *adapter) { return adapter ? adapter->n_pairs : 0; }

/* whether adapter ad adapts a weight of layer il's attention (ffn = false) or FFN (true) */
static bool adapts(const pi_adapter *ad, int32_t il, bool ffn) {
    for (int32_t w = ffn ? PI_LORA_GATE : 0; w < (ffn ? PI_LORA_LAYER_N : PI_LORA_GATE); w++)
        if (ad->layers[il * PI_LORA_LAYER_N + w].a.data) return true;
    return false;
}

pi_status pi_context_set_adapters(pi_context *ctx, int32_t n, pi_adapter *const *adapters, const float *scales) {
    if (!ctx || n < 0 || n > MAX_ADAPTERS || (n > 0 && (!adapters || !scales)))
        return pi_fail(PI_ERR_INVALID_ARG, "pi_context_set_adapters: bad arguments (at most %d adapters)",
                       MAX_ADAPTERS);
    for (int32_t i = 0; i < n; i++) {
        const pi_adapter *ad = adapters[i];
        if (!ad || ad->model != ctx->model)
            return pi_fail(PI_ERR_INVALID_ARG, "LoRA adapter %d was not made for this context's model", i);
        if (!isfinite(scales[i])) return pi_fail(PI_ERR_INVALID_ARG, "LoRA adapter %d: scale is not finite", i);
        for (int32_t il = 0; il < ctx->model->hp.n_layer; il++) {
            const pi_layer_exec *lx = &ctx->lx[il];
            if ((adapts(ad, il, false) && lx->attn != &ctx->cpu) || (adapts(ad, il, true) && lx->ffn != &ctx->cpu))
                return pi_fail(PI_ERR_UNSUPPORTED, "LoRA adapters run on the CPU only, and layer %d, which adapter %d "
                               "adapts, is offloaded to a device", il, i);
        }
        if (ad->output.a.data && ctx->out != &ctx->cpu)
            return pi_fail(PI_ERR_UNSUPPORTED, "LoRA adapters run on the CPU only, and the output head, which adapter "
                           "%d adapts, is offloaded to a device", i);
    }
    pi_lora_use *list = NULL;
    if (n > 0 && !(list = malloc((size_t)n * sizeof *list))) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < n; i++) list[i] = (pi_lora_use){ adapters[i], scales[i] };
    free(ctx->lora);
    ctx->lora = list;
    ctx->n_lora = n;
    return PI_OK;
}

void pi_lora_release(pi_context *ctx) {
    free(ctx->lora);
    free(ctx->lora_mid);
    free(ctx->lora_conv);
    ctx->lora = NULL;
    ctx->lora_mid = NULL;
    ctx->lora_conv = NULL;
    ctx->n_lora = 0;
    ctx->lora_mid_n = 0;
    ctx->lora_conv_bytes = 0;
}

/* *buf holds at least n floats */
static pi_status scratch(float **buf, int64_t *cap, int64_t n) {
    if (n <= *cap) return PI_OK;
    float *p = realloc(*buf, (size_t)n * sizeof(float));
    if (!p) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for a LoRA term of %lld floats", (long long)n);
    *buf = p;
    *cap = n;
    return PI_OK;
}

static pi_tensor f32_2d(float *data, int64_t ne0, int64_t ne1) {
    return pi_tensor_view(PI_TYPE_F32, data, 2, (int64_t[]){ ne0, ne1 });
}

static pi_status on_cpu(pi_context *ctx, pi_exec *e) {
    if (e == &ctx->cpu) return PI_OK;
    return pi_fail(PI_ERR_UNSUPPORTED, "LoRA adapters run on the CPU only, and an adapted weight is on %s",
                   e->be->i->name);
}

/* y = w x on e's pool, or on the calling thread alone (alone: the same bits, mul_mat's rows do not depend on the
 * threads) */
static pi_status product(pi_context *ctx, pi_exec *e, bool alone, const pi_tensor *w, const pi_tensor *x,
                         pi_tensor *y) {
    if (!alone) return OP(e, mul_mat, w, x, y);
    return pi_mul_mat_grow(NULL, w, x, y, &ctx->lora_conv, &ctx->lora_conv_bytes);
}

typedef struct up_job {
    const pi_lora_pair *p;
    float               s;
    const float        *mid;   /* [T][r] */
    float              *y;     /* [T][N] */
    int64_t             T;
} up_job;

/* the threads' tokens t = ith, ith + nth, ...: y_t += sum over j of (s mid_t[j]) bt[j], 8 rows of bt at a time */
static void up_task(void *arg, int ith, int nth) {
    const up_job *j = arg;
    const pi_tensor *bt = &j->p->bt;
    const int64_t N = bt->ne[0], r = bt->ne[1];
    const pi_type_traits *tr = pi_traits(bt->type);
    for (int64_t t = ith; t < j->T; t += nth)
        for (int64_t k0 = 0; k0 < r; k0 += 8) {
            const int n = (int)PI_MIN(8, r - k0);
            float c[8];
            const void *rows[8];
            for (int k = 0; k < n; k++) {
                c[k] = j->s * j->mid[t * r + k0 + k];
                rows[k] = (const char *)bt->data + (k0 + k) * bt->nb[1];
            }
            pi_axpy_rows(tr, N, n, c, rows, j->y + t * N);
        }
}

/* y [N, T] += s * b mid, mid [r, T] = the low-rank input: the tokens shared among e's threads, or on the calling
 * thread alone (the same bits: a token's row is one thread's) */
static pi_status up_term(pi_context *ctx, pi_exec *e, bool alone, const pi_lora_pair *p, float s, float *y,
                         int64_t T) {
    up_job job = { p, s, ctx->lora_mid, y, T };
    pi_threadpool_run(alone ? NULL : e->be->pool, up_task, &job);
    return PI_OK;
}

/* y [N, T] += s * b (a x) */
static pi_status term(pi_context *ctx, pi_exec *e, const pi_lora_pair *p, float s, float *x, float *y, int64_t T) {
    const int64_t K = p->a.ne[0], r = p->a.ne[1], N = p->b.ne[1];
    const bool alone = (K + N) * r * T <= INLINE_MACS;
    TRY(scratch(&ctx->lora_mid, &ctx->lora_mid_n, r * T));
    pi_tensor xt = f32_2d(x, K, T), mid = f32_2d(ctx->lora_mid, r, T);
    TRY(product(ctx, e, alone, &p->a, &xt, &mid));
    return up_term(ctx, e, alone, p, s, y, T);
}

pi_status pi_lora_add(pi_context *ctx, pi_exec *e, int32_t il, int32_t w, float *x, float *y, int64_t T) {
    for (int32_t i = 0; i < ctx->n_lora; i++) {
        const pi_lora_pair *p = &ctx->lora[i].adapter->layers[il * PI_LORA_LAYER_N + w];
        if (!p->a.data) continue;
        TRY(on_cpu(ctx, e));
        TRY(term(ctx, e, p, ctx->lora[i].scale * p->rank_scale, x, y, T));
    }
    return PI_OK;
}

pi_status pi_lora_add_output(pi_context *ctx, pi_exec *e, float *x, float *logits, int64_t T) {
    const int64_t E = ctx->model->hp.n_embd, V = ctx->model->hp.n_vocab;
    const int64_t chunk = PI_MAX(1, ((int64_t)4 << 20) / V);   /* tokens per term: at most 16 MiB of logits */
    for (int32_t i = 0; i < ctx->n_lora; i++) {
        const pi_lora_pair *p = &ctx->lora[i].adapter->output;
        if (!p->a.data) continue;
        TRY(on_cpu(ctx, e));
        for (int64_t t = 0; t < T; t += chunk)
            TRY(term(ctx, e, p, ctx->lora[i].scale * p->rank_scale, x + t * E, logits + t * V, PI_MIN(chunk, T - t)));
    }
    return PI_OK;
}

pi_status pi_lora_add_embd(pi_context *ctx, pi_exec *e, const int32_t *tokens, float *x, int64_t T) {
    for (int32_t i = 0; i < ctx->n_lora; i++) {
        const pi_lora_pair *p = &ctx->lora[i].adapter->tok_embd;
        if (!p->a.data) continue;
        TRY(on_cpu(ctx, e));
        TRY(scratch(&ctx->lora_mid, &ctx->lora_mid_n, p->a.ne[0] * T));
        pi_tensor mid = f32_2d(ctx->lora_mid, p->a.ne[0], T);
        TRY(OP(e, get_rows, &p->a, tokens, T, &mid));   /* the tokens' rows of a [r, n_vocab] */
        TRY(up_term(ctx, e, false, p, ctx->lora[i].scale * p->rank_scale, x, T));
    }
    return PI_OK;
}
