/* context.c: contexts and the forward pass (llama, bamboo, qwen2, gemma3; falcon and opt sparse files).
 *
 * One pi_decode runs the whole model over a batch of T tokens:
 *   x = token_embd[tokens] (* embd_scale)
 *   for each layer:
 *       h = rms_norm(x) * attn_norm
 *       q, k, v = Wq h, Wk h, Wv h  (+ biases)   (q, k: per-head rms_norm with qk_norm)
 *       rope(q), rope(k)  (normal or NEOX pairs; local layers their own base)
 *       store k, v in the cache
 *       a = Wo attention(q, cached k, cached v)   (local layers: the last n_swa positions only)
 *       x += a                    (post_norms: x += rms_norm(a) * post_attention_norm)
 *       h = rms_norm(x) * ffn_norm
 *       f = W_down (act(W_gate h) * (W_up h))      (gate mode per hparams)
 *       x += f                    (post_norms: x += rms_norm(f) * post_ffw_norm)
 *   logits = W_out (rms_norm(x) * output_norm)      only for the rows asked for
 * The architectures differ only in the pi_hparams flags read here, except for
 *   falcon: LayerNorm (+ bias), fused attn_qkv, and the parallel block
 *           x += attn(LN_2(x) or LN(x)) + FFN(LN(x)), the predictor reading x (falcon_layer);
 *   opt:    LayerNorm (+ bias) everywhere, biases on q/k/v/o and on the FFN's up and down, no rope,
 *           x = token_embd[tok] + position_embd[pos + 2], logits from token_embd.
 */
#include "context.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

pi_context_params pi_context_default_params(void) {
    return (pi_context_params){ .n_ctx = 512, .n_batch = 512, .n_seq_max = 1, .n_threads = 0, .kv_type = PI_TYPE_F16,
                                .sparse_threshold = 0.0f, .sparse_mode = PI_SPARSE_PREDICT };
}

static void free_buffers(pi_buffers *b) {
    free(b->x); free(b->cur); free(b->q); free(b->k); free(b->v); free(b->att);
    free(b->gate); free(b->up); free(b->scratch); free(b->cells);
    free(b->scores); free(b->pred); free(b->sparse); free(b->qkv); free(b->ln);
    memset(b, 0, sizeof *b);
}

static pi_status alloc_buffers(pi_buffers *b, const pi_model *m, int32_t T) {
    const pi_hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd, F = (size_t)hp->n_ff, hd = (size_t)pi_head_dim(hp);
    const size_t Eq = hd * (size_t)hp->n_head, Ekv = hd * (size_t)hp->n_head_kv;
    const size_t R = (size_t)m->max_rank;
    const size_t t = (size_t)T, f = sizeof(float);
    b->x = pi_alloc_lines(t * E * f);
    b->cur = pi_alloc_lines(t * E * f);
    b->q = pi_alloc_lines(t * Eq * f);
    b->k = pi_alloc_lines(t * Ekv * f);
    b->v = pi_alloc_lines(t * Ekv * f);
    b->att = pi_alloc_lines(t * PI_MAX(E, Eq) * f);
    b->gate = pi_alloc_lines(t * F * f);
    b->up = pi_alloc_lines(t * F * f);
    b->scratch = pi_alloc_lines(t * PI_MAX(PI_MAX(E, F), PI_MAX(R, Eq)) * f);
    b->cells = pi_alloc_lines(t * sizeof(int32_t));
    bool sparse_ok = true;
    if (hp->arch == PI_ARCH_FALCON) {   /* fused q/k/v output, FFN input beside the attention's */
        b->qkv = pi_alloc_lines(t * (Eq + 2 * Ekv) * f);
        b->ln = pi_alloc_lines(t * E * f);
        sparse_ok = b->qkv && b->ln;
    }
    if (hp->sparse) {
        size_t sbytes = 0;
        for (int32_t il = 0; il < hp->n_layer; il++) {   /* layers may mix dtypes */
            const pi_layer *L = &m->layers[il];
            pi_sparse_ffn_weights w = { .gate = L->ffn_gate, .up = L->ffn_up, .down_t = L->ffn_down_t };
            sbytes = PI_MAX(sbytes, pi_sparse_ffn_scratch(&w, (int64_t)E, (int64_t)F, T));
        }
        b->scores = pi_alloc_lines(t * F * f);
        b->pred = pi_alloc_lines(t * PI_MAX(R, 1) * f);
        b->sparse = pi_alloc_lines(sbytes);
        sparse_ok = sparse_ok && b->scores && b->pred && b->sparse;
    }
    if (!b->x || !b->cur || !b->q || !b->k || !b->v || !b->att || !b->gate || !b->up || !b->scratch || !b->cells ||
        !sparse_ok) {
        free_buffers(b);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for activations of %d tokens", T);
    }
    return PI_OK;
}

void pi_context_free(pi_context *ctx) {
    if (!ctx) return;
    pi_threadpool_free(ctx->pool);
    pi_kv_release(&ctx->kv);
    free_buffers(&ctx->buf);
    free(ctx->mask);
    free(ctx->mask_swa);
    free(ctx->logits);
    free(ctx->output_row);
    free(ctx->sparse_active);
    free(ctx->neuron_counts);
    free(ctx);
}

pi_status pi_context_create(pi_model *model, const pi_context_params *params, pi_context **out) {
    if (!out) return pi_fail(PI_ERR_INVALID_ARG, "pi_context_create: out is NULL");
    *out = NULL;
    if (!model || !params) return pi_fail(PI_ERR_INVALID_ARG, "pi_context_create: NULL model or params");
    pi_context_params p = *params;
    if (p.n_ctx < 1 || p.n_ctx > (1 << 24)) return pi_fail(PI_ERR_INVALID_ARG, "n_ctx = %d is out of range", p.n_ctx);
    if (p.n_batch < 1) return pi_fail(PI_ERR_INVALID_ARG, "n_batch = %d must be >= 1", p.n_batch);
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (p.n_seq_max < 1 || p.n_seq_max > PI_MAX_SEQ)
        return pi_fail(PI_ERR_INVALID_ARG, "n_seq_max = %d must be in [1, %d]", p.n_seq_max, PI_MAX_SEQ);
    if (p.kv_type != PI_TYPE_F16 && p.kv_type != PI_TYPE_F32)
        return pi_fail(PI_ERR_INVALID_ARG, "kv_type must be f16 or f32");

    pi_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    ctx->model = model;
    const pi_hparams *hp = &model->hp;
    pi_status st = pi_threadpool_create(p.n_threads, &ctx->pool);
    if (st == PI_OK) p.n_threads = pi_threadpool_size(ctx->pool);
    ctx->params = p;
    if (st == PI_OK) st = pi_kv_init(&ctx->kv, p.n_ctx, hp->n_layer, pi_head_dim(hp) * hp->n_head_kv, p.kv_type);
    if (st == PI_OK) st = alloc_buffers(&ctx->buf, model, p.n_batch);
    if (st == PI_OK && !(ctx->sparse_active = calloc((size_t)hp->n_layer, sizeof(int64_t))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == PI_OK && p.count_neurons && hp->sparse &&
        !(ctx->neuron_counts = calloc((size_t)(hp->n_layer * (int64_t)hp->n_ff), sizeof(int64_t))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == PI_OK && (p.sparse_mode != PI_SPARSE_PREDICT && p.sparse_mode != PI_SPARSE_ALL))
        st = pi_fail(PI_ERR_INVALID_ARG, "sparse_mode = %d is not PI_SPARSE_PREDICT or PI_SPARSE_ALL", p.sparse_mode);
    if (st == PI_OK && isnan(p.sparse_threshold)) st = pi_fail(PI_ERR_INVALID_ARG, "sparse_threshold is NaN");
    if (st == PI_OK && !(ctx->output_row = malloc((size_t)p.n_batch * sizeof(int32_t))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != PI_OK) { pi_context_free(ctx); return st; }
    *out = ctx;
    return PI_OK;
}

void pi_set_abort_callback(pi_context *ctx, pi_abort_callback cb, void *user_data) {
    if (!ctx) return;
    ctx->abort_cb = cb;
    ctx->abort_data = user_data;
}

pi_status pi_set_n_threads(pi_context *ctx, int32_t n_threads) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "context is NULL");
    pi_threadpool *pool;
    pi_status st = pi_threadpool_create(n_threads, &pool);
    if (st != PI_OK) return st;
    pi_threadpool_free(ctx->pool);
    ctx->pool = pool;
    ctx->params.n_threads = pi_threadpool_size(pool);
    return PI_OK;
}

/* ---- forward pass helpers ---- */

static pi_tensor f32_2d(float *data, int64_t ne0, int64_t ne1) {
    return pi_tensor_view(PI_TYPE_F32, data, 2, (int64_t[]){ ne0, ne1 });
}

/* y [N, T] = W [K, N] x [K, T] */
static void matmul(pi_context *ctx, const pi_tensor *w, float *x, float *y, int64_t T) {
    pi_tensor xt = f32_2d(x, w->ne[0], T), yt = f32_2d(y, w->ne[1], T);
    pi_mul_mat(ctx->pool, w, &xt, &yt, ctx->buf.scratch);
}

static void rms_norm(pi_context *ctx, const float *x, const pi_tensor *w, float *out, int64_t T) {
    pi_tensor xt = f32_2d((float *)x, w->ne[0], T), ot = f32_2d(out, w->ne[0], T);
    pi_op_rms_norm(ctx->pool, &xt, w, ctx->model->hp.norm_eps, &ot);
}

/* The block norm: RMSNorm, or LayerNorm with an optional bias (falcon, opt). */
static void norm(pi_context *ctx, const float *x, const pi_tensor *w, const pi_tensor *b, float *out, int64_t T) {
    if (!pi_uses_layer_norm(&ctx->model->hp)) { rms_norm(ctx, x, w, out, T); return; }
    pi_tensor xt = f32_2d((float *)x, w->ne[0], T), ot = f32_2d(out, w->ne[0], T);
    pi_op_layer_norm(ctx->pool, &xt, w, b && b->data ? b : NULL, ctx->model->hp.norm_eps, &ot);
}

static void add_inplace(pi_context *ctx, float *x, float *y, int64_t D, int64_t T) {
    pi_tensor xt = f32_2d(x, D, T), yt = f32_2d(y, D, T);
    pi_op_binary(ctx->pool, PI_BINARY_ADD, &xt, &yt, &xt);
}

/* mask[t][c] = 0 if cell c belongs to token t's sequence at a position <= pos[t], else -inf.
 * With a sliding window (n_swa > 0), mask_swa additionally hides cells with pos[t] - pos >= n_swa. */
static pi_status build_mask(pi_context *ctx, const pi_batch *b, int32_t n_kv) {
    const int32_t n_swa = ctx->model->hp.n_swa;
    const size_t need = (size_t)n_kv * (size_t)b->n_tokens;
    if (need > ctx->mask_cap) {
        float *m = realloc(ctx->mask, need * sizeof(float));
        if (m) ctx->mask = m;
        float *ms = n_swa > 0 && m ? realloc(ctx->mask_swa, need * sizeof(float)) : NULL;
        if (ms) ctx->mask_swa = ms;
        if (!m || (n_swa > 0 && !ms)) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the attention mask");
        ctx->mask_cap = need;
    }
    for (int32_t t = 0; t < b->n_tokens; t++) {
        float *row = ctx->mask + (size_t)t * n_kv;
        float *row_swa = n_swa > 0 ? ctx->mask_swa + (size_t)t * n_kv : NULL;
        const uint64_t bit = (uint64_t)1 << b->seq_id[t];
        for (int32_t c = 0; c < n_kv; c++) {
            const pi_kv_cell *cell = &ctx->kv.cells[c];
            row[c] = (cell->seqs & bit) && cell->pos <= b->pos[t] ? 0.0f : -INFINITY;
            if (row_swa) row_swa[c] = (int64_t)b->pos[t] - cell->pos < n_swa ? row[c] : -INFINITY;
        }
    }
    return PI_OK;
}

/* y [D, T] += bias [D] */
static void add_bias(pi_context *ctx, float *y, const pi_tensor *bias, int64_t T) {
    pi_tensor yt = f32_2d(y, bias->ne[0], T);
    pi_op_binary(ctx->pool, PI_BINARY_ADD, &yt, bias, &yt);
}

/* x += (post_norms ? rms_norm(y) * post_norm : y), y [n_embd, T] (y is overwritten) */
static void residual_add(pi_context *ctx, float *y, const pi_tensor *post_norm, int64_t T) {
    if (ctx->model->hp.post_norms) rms_norm(ctx, y, post_norm, y, T);
    add_inplace(ctx, ctx->buf.x, y, ctx->model->hp.n_embd, T);
}

/* Attention of one layer over the normed input in B->cur: q/k/v, rope, KV store, attention, wo (+ bias),
 * the result in B->cur. */
static pi_status attention_core(pi_context *ctx, const pi_layer *L, int32_t il, const pi_batch *b, int32_t n_kv) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_buffers *B = &ctx->buf;
    const int64_t T = b->n_tokens, hd = pi_head_dim(hp), Ekv = hd * hp->n_head_kv, Eq = hd * hp->n_head;
    const bool local = pi_layer_is_swa(hp, il);
    pi_kv_cache *kv = &ctx->kv;

    if (L->wqkv.data) {   /* falcon: one matmul, rows = all Q heads, then all K heads, then all V heads */
        const int64_t W = Eq + 2 * Ekv;
        matmul(ctx, &L->wqkv, B->cur, B->qkv, T);
        for (int64_t t = 0; t < T; t++) {
            const float *r = B->qkv + t * W;
            memcpy(B->q + t * Eq, r, (size_t)Eq * sizeof(float));
            memcpy(B->k + t * Ekv, r + Eq, (size_t)Ekv * sizeof(float));
            memcpy(B->v + t * Ekv, r + Eq + Ekv, (size_t)Ekv * sizeof(float));
        }
    } else {
        matmul(ctx, &L->wq, B->cur, B->q, T);
        matmul(ctx, &L->wk, B->cur, B->k, T);
        matmul(ctx, &L->wv, B->cur, B->v, T);
    }
    if (hp->qkv_bias) {
        add_bias(ctx, B->q, &L->bq, T);
        add_bias(ctx, B->k, &L->bk, T);
        add_bias(ctx, B->v, &L->bv, T);
    }

    pi_tensor q = pi_tensor_view(PI_TYPE_F32, B->q, 3, (int64_t[]){ hd, hp->n_head, T });
    pi_tensor k = pi_tensor_view(PI_TYPE_F32, B->k, 3, (int64_t[]){ hd, hp->n_head_kv, T });
    if (hp->qk_norm) {   /* RMSNorm of each head's vector */
        pi_op_rms_norm(ctx->pool, &q, &L->q_norm, hp->norm_eps, &q);
        pi_op_rms_norm(ctx->pool, &k, &L->k_norm, hp->norm_eps, &k);
    }
    const float base = local && hp->rope_freq_base_swa > 0.0f ? hp->rope_freq_base_swa : hp->rope_freq_base;
    const float fscale = local && hp->rope_freq_scale_swa > 0.0f ? hp->rope_freq_scale_swa : hp->rope_freq_scale;
    const float *ff = ctx->model->rope_freqs.data;   /* NULL unless the file has rope_freqs.weight */
    if (hp->arch != PI_ARCH_OPT) {   /* opt: learned position embeddings, no rope */
        pi_rope(ctx->pool, &q, b->pos, hp->n_rot, hp->rope_mode, base, fscale, ff, &q);
        pi_rope(ctx->pool, &k, b->pos, hp->n_rot, hp->rope_mode, base, fscale, ff, &k);
    }

    const pi_type_traits *kvt = pi_traits(kv->type);
    for (int64_t t = 0; t < T; t++) {
        kvt->from_f32(B->k + t * Ekv, pi_kv_row(kv, kv->k, il, B->cells[t]), Ekv);
        kvt->from_f32(B->v + t * Ekv, pi_kv_row(kv, kv->v, il, B->cells[t]), Ekv);
    }

    /* views over cells [0, n_kv) of this layer: [hd, n_head_kv, n_kv] */
    pi_tensor kc = pi_tensor_view(kv->type, pi_kv_row(kv, kv->k, il, 0), 3, (int64_t[]){ hd, hp->n_head_kv, n_kv });
    pi_tensor vc = pi_tensor_view(kv->type, pi_kv_row(kv, kv->v, il, 0), 3, (int64_t[]){ hd, hp->n_head_kv, n_kv });
    pi_tensor mask = f32_2d(local ? ctx->mask_swa : ctx->mask, n_kv, T);
    pi_tensor att = pi_tensor_view(PI_TYPE_F32, B->att, 3, (int64_t[]){ hd, hp->n_head, T });
    const float scale = hp->attn_scale > 0.0f ? hp->attn_scale : 1.0f / sqrtf((float)hd);
    pi_status st = pi_attention(ctx->pool, &q, &kc, &vc, &mask, scale, &att);
    if (st != PI_OK) return st;

    matmul(ctx, &L->wo, B->att, B->cur, T);
    if (L->bo.data) add_bias(ctx, B->cur, &L->bo, T);
    return PI_OK;
}

static pi_status attention_block(pi_context *ctx, const pi_layer *L, int32_t il, const pi_batch *b, int32_t n_kv) {
    pi_buffers *B = &ctx->buf;
    const int64_t T = b->n_tokens;
    norm(ctx, B->x, &L->attn_norm, &L->attn_norm_b, B->cur, T);
    pi_status st = attention_core(ctx, L, il, b, n_kv);
    if (st != PI_OK) return st;
    residual_add(ctx, B->cur, &L->post_attn_norm, T);
    return PI_OK;
}

typedef struct { float *gate, *up; int64_t n; int32_t act, mode; } ffn_act_args;

static void ffn_act_task(void *p, int ith, int nth) {
    ffn_act_args *a = p;
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

/* PowerInfer FFN of the normed input `in` into `out` (both [T][n_embd]); the predictor reads `pred_in`. */
static pi_status sparse_ffn(pi_context *ctx, const pi_layer *L, int32_t il, int64_t T, float *in, float *pred_in,
                            float *out) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_buffers *B = &ctx->buf;
    const int64_t E = hp->n_embd, F = hp->n_ff;
    pi_tensor scores = f32_2d(B->scores, F, T);
    float threshold = ctx->params.sparse_threshold;
    if (ctx->params.sparse_mode == PI_SPARSE_ALL) {
        memset(B->scores, 0, (size_t)(F * T) * sizeof(float));
        threshold = -INFINITY;
    } else {
        pi_tensor xt = f32_2d(pred_in, E, T);
        pi_status st = pi_predictor(ctx->pool, &L->fc1, &L->fc2, &xt, &scores, B->pred, B->scratch);
        if (st != PI_OK) return st;
    }
    pi_sparse_ffn_weights w = { L->ffn_gate, L->ffn_up, L->ffn_down_t, L->ffn_up_b.data, L->ffn_down_t_b.data };
    pi_tensor it = f32_2d(in, E, T), ot = f32_2d(out, E, T);
    int64_t n_active = 0;
    int64_t *counts = ctx->neuron_counts ? ctx->neuron_counts + il * F : NULL;
    pi_status st = pi_sparse_ffn(ctx->pool, &w, hp->ffn_act, hp->ffn_gate, &it, &scores, threshold, &ot, &n_active,
                                 counts, B->sparse);
    if (st != PI_OK) return st;
    ctx->sparse_active[il] += n_active;
    return PI_OK;
}

/* Pre-norm sparse FFN (llama, bamboo, opt): the predictor reads the pre-norm residual x, the FFN the normed input. */
static pi_status sparse_ffn_block(pi_context *ctx, const pi_layer *L, int32_t il, int64_t T) {
    pi_buffers *B = &ctx->buf;
    norm(ctx, B->x, &L->ffn_norm, &L->ffn_norm_b, B->cur, T);
    pi_status st = sparse_ffn(ctx, L, il, T, B->cur, B->x, B->att);
    if (st != PI_OK) return st;
    add_inplace(ctx, B->x, B->att, ctx->model->hp.n_embd, T);
    return PI_OK;
}

/* Falcon's parallel block: x = attn(LN_2(x) or LN(x)) + FFN(LN(x); predictor on x) + x. */
static pi_status falcon_layer(pi_context *ctx, const pi_layer *L, int32_t il, const pi_batch *b, int32_t n_kv) {
    pi_buffers *B = &ctx->buf;
    const int64_t T = b->n_tokens, E = ctx->model->hp.n_embd;
    norm(ctx, B->x, &L->attn_norm, &L->attn_norm_b, B->ln, T);
    if (L->attn_norm_2.data) norm(ctx, B->x, &L->attn_norm_2, &L->attn_norm_2_b, B->cur, T);
    else memcpy(B->cur, B->ln, (size_t)(T * E) * sizeof(float));
    pi_status st = attention_core(ctx, L, il, b, n_kv);   /* -> B->cur */
    if (st != PI_OK) return st;
    st = sparse_ffn(ctx, L, il, T, B->ln, B->x, B->att);   /* -> B->att */
    if (st != PI_OK) return st;
    add_inplace(ctx, B->cur, B->att, E, T);                /* attn_out + FFN, then + inpL */
    add_inplace(ctx, B->x, B->cur, E, T);
    return PI_OK;
}

static void ffn_block(pi_context *ctx, const pi_layer *L, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_buffers *B = &ctx->buf;
    norm(ctx, B->x, &L->ffn_norm, &L->ffn_norm_b, B->cur, T);
    if (hp->ffn_gate != PI_FFN_SEQ) matmul(ctx, &L->ffn_gate, B->cur, B->gate, T);
    matmul(ctx, &L->ffn_up, B->cur, B->up, T);
    ffn_act_args a = { B->gate, B->up, (int64_t)hp->n_ff * T, hp->ffn_act, hp->ffn_gate };
    pi_threadpool_run(ctx->pool, ffn_act_task, &a);     /* h = up (in place) */
    matmul(ctx, &L->ffn_down, B->up, B->cur, T);
    residual_add(ctx, B->cur, &L->post_ffn_norm, T);
}

static pi_status check_batch(const pi_context *ctx, const pi_batch *b) {
    const pi_hparams *hp = &ctx->model->hp;
    if (!b || !b->token || !b->pos || !b->seq_id) return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: incomplete batch");
    if (b->n_tokens < 1 || b->n_tokens > ctx->params.n_batch)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: batch of %d tokens, must be 1..n_batch (%d)", b->n_tokens,
                       ctx->params.n_batch);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (b->token[i] < 0 || b->token[i] >= hp->n_vocab)
            return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: token %d at %d is out of range [0, %d)", b->token[i], i,
                           hp->n_vocab);
        if (b->pos[i] < 0) return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: negative position %d at %d", b->pos[i], i);
        if (ctx->model->pos_embd.data && (int64_t)b->pos[i] + PI_OPT_POS_OFFSET >= ctx->model->pos_embd.ne[1])
            return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: position %d at %d is past the %lld learned positions",
                           b->pos[i], i, (long long)(ctx->model->pos_embd.ne[1] - PI_OPT_POS_OFFSET));
        if (b->seq_id[i] < 0 || b->seq_id[i] >= ctx->params.n_seq_max)
            return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: sequence id %d at %d is out of range [0, %d)",
                           b->seq_id[i], i, ctx->params.n_seq_max);
    }
    return PI_OK;
}

/* Final norm and output head for the rows that asked for logits. */
static pi_status compute_logits(pi_context *ctx, const pi_batch *b) {
    const pi_model *m = ctx->model;
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
    int32_t n_out = 0;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const bool want = b->logits ? b->logits[t] != 0 : t == b->n_tokens - 1;
        ctx->output_row[t] = want ? n_out : -1;
        if (want) memcpy(ctx->buf.cur + (size_t)n_out++ * E, ctx->buf.x + (size_t)t * E, (size_t)E * sizeof(float));
    }
    if (n_out == 0) return PI_OK;
    if (n_out > ctx->logits_cap) {
        float *l = realloc(ctx->logits, (size_t)n_out * (size_t)V * sizeof(float));
        if (!l) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for logits of %d rows", n_out);
        ctx->logits = l;
        ctx->logits_cap = n_out;
    }
    norm(ctx, ctx->buf.cur, &m->output_norm, &m->output_norm_b, ctx->buf.cur, n_out);
    matmul(ctx, &m->output, ctx->buf.cur, ctx->logits, n_out);
    return PI_OK;
}

pi_status pi_decode(pi_context *ctx, const pi_batch *batch) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: context is NULL");
    ctx->n_batch_last = 0;
    pi_status st = check_batch(ctx, batch);
    if (st != PI_OK) return st;
    const pi_model *m = ctx->model;
    const int32_t T = batch->n_tokens;
    pi_buffers *B = &ctx->buf;

    st = pi_kv_claim(&ctx->kv, T, batch->pos, batch->seq_id, B->cells);
    if (st != PI_OK) return st;
    const int32_t n_kv = pi_kv_span(&ctx->kv);
    st = build_mask(ctx, batch, n_kv);

    if (st == PI_OK) {
        pi_tensor x = f32_2d(B->x, m->hp.n_embd, T);
        st = pi_op_get_rows(ctx->pool, &m->token_embd, batch->token, T, &x);
        if (st == PI_OK && m->hp.embd_scale > 0.0f && m->hp.embd_scale != 1.0f)   /* gemma: * sqrt(n_embd) */
            for (int64_t i = 0; i < (int64_t)T * m->hp.n_embd; i++) B->x[i] *= m->hp.embd_scale;
        if (st == PI_OK && m->pos_embd.data) {   /* opt: + position_embd[pos + 2] */
            pi_tensor pe = f32_2d(B->cur, m->hp.n_embd, T);
            for (int32_t t = 0; st == PI_OK && t < T; t++) {
                const int32_t id = batch->pos[t] + PI_OPT_POS_OFFSET;
                pi_tensor one = f32_2d(B->cur + (size_t)t * m->hp.n_embd, m->hp.n_embd, 1);
                st = pi_op_get_rows(NULL, &m->pos_embd, &id, 1, &one);
            }
            if (st == PI_OK) add_inplace(ctx, B->x, pe.data, m->hp.n_embd, T);
        }
    }
    for (int32_t il = 0; st == PI_OK && il < m->hp.n_layer; il++) {
        if (ctx->abort_cb && ctx->abort_cb(ctx->abort_data)) {
            st = pi_fail(PI_ERR_ABORTED, "decode aborted by the abort callback");
            break;
        }
        if (m->hp.arch == PI_ARCH_FALCON) {
            st = falcon_layer(ctx, &m->layers[il], il, batch, n_kv);
            continue;
        }
        st = attention_block(ctx, &m->layers[il], il, batch, n_kv);
        if (st != PI_OK) break;
        if (m->hp.sparse) st = sparse_ffn_block(ctx, &m->layers[il], il, T);
        else ffn_block(ctx, &m->layers[il], T);
    }
    if (st == PI_OK && m->hp.sparse) ctx->sparse_total += (int64_t)T * m->hp.n_ff;
    if (st == PI_OK) st = compute_logits(ctx, batch);
    if (st != PI_OK) {
        pi_kv_unclaim(&ctx->kv, T, B->cells);   /* leave the cache as it was */
        return st;
    }
    ctx->n_batch_last = T;
    return PI_OK;
}

const float *pi_get_logits(pi_context *ctx, int32_t i) {
    if (!ctx) { pi_fail(PI_ERR_INVALID_ARG, "pi_get_logits: context is NULL"); return NULL; }
    if (i < 0 || i >= ctx->n_batch_last || ctx->output_row[i] < 0) {
        pi_fail(PI_ERR_INVALID_ARG, "pi_get_logits: no logits for batch row %d", i);
        return NULL;
    }
    return ctx->logits + (size_t)ctx->output_row[i] * (size_t)ctx->model->hp.n_vocab;
}

pi_status pi_sparse_stats(pi_context *ctx, int64_t *active, int64_t *total) {
    if (!ctx || !active || !total) return pi_fail(PI_ERR_INVALID_ARG, "pi_sparse_stats: NULL argument");
    memcpy(active, ctx->sparse_active, (size_t)ctx->model->hp.n_layer * sizeof(int64_t));
    *total = ctx->sparse_total;
    return PI_OK;
}

void pi_sparse_stats_reset(pi_context *ctx) {
    if (!ctx) return;
    memset(ctx->sparse_active, 0, (size_t)ctx->model->hp.n_layer * sizeof(int64_t));
    if (ctx->neuron_counts)
        memset(ctx->neuron_counts, 0, (size_t)(ctx->model->hp.n_layer * (int64_t)ctx->model->hp.n_ff) * sizeof(int64_t));
    ctx->sparse_total = 0;
}

pi_status pi_neuron_counts(pi_context *ctx, int32_t il, int64_t *counts) {
    if (!ctx || !counts) return pi_fail(PI_ERR_INVALID_ARG, "pi_neuron_counts: NULL argument");
    const pi_hparams *hp = &ctx->model->hp;
    if (!ctx->neuron_counts)
        return pi_fail(PI_ERR_INVALID_ARG, hp->sparse ? "pi_neuron_counts: the context was made without count_neurons"
                                                      : "pi_neuron_counts: not a sparse (PowerInfer) model");
    if (il < 0 || il >= hp->n_layer)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_neuron_counts: layer %d is out of range [0, %d)", il, hp->n_layer);
    memcpy(counts, ctx->neuron_counts + il * (int64_t)hp->n_ff, (size_t)hp->n_ff * sizeof(int64_t));
    return PI_OK;
}
