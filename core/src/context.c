/* context.c: contexts and the forward pass (llama, bamboo, qwen2, gemma2, gemma3, gpt-oss; falcon and opt sparse files).
 *
 * One pi_decode runs the whole model over a batch of T tokens:
 *   x = token_embd[tokens] (* embd_scale)
 *   for each layer:
 *       h = rms_norm(x) * attn_norm
 *       q, k, v = Wq h, Wk h, Wv h  (+ biases)   (q, k: per-head rms_norm with qk_norm)
 *       rope(q), rope(k)  (normal or NEOX pairs; local layers their own base)
 *       store k, v in the cache
 *       a = Wo attention(q, cached k, cached v)   (local layers: the last n_swa positions only; attn_softcap:
 *                                                  scores capped before the mask and the softmax; attn_sinks: a
 *                                                  logit per head in each softmax row, without a value)
 *           (+ bo: opt, attn_out_bias)
 *       x += a                    (post_norms: x += rms_norm(a) * post_attention_norm)
 *       h = rms_norm(x) * ffn_norm
 *       f = W_down (act(W_gate h) * (W_up h))      (gate mode per hparams; n_expert: moe.c's experts)
 *       x += f                    (post_norms: x += rms_norm(f) * post_ffw_norm)
 *   logits = W_out (rms_norm(x) * output_norm)      only for the rows asked for (pi_set_outputs: or/and
 *                                                    the embeddings rms_norm(x) * output_norm, no head);
 *                                                    final_softcap: cap tanh(logits / cap)
 * parallel_block (command-r, cohere2): x += attn(h) + ffn(h), h = norm(x) * attn_norm (parallel_layer);
 * attn_temp_scale (mistral3): q scaled per position after rope; qk_norm_after_rope (hunyuan-dense); ffn_act_square
 * (arcee: ReLU^2) and PI_ACT_XIELU (apertus) in dense_ffn.
 * The architectures differ only in the pi_hparams flags read here, except for
 *   falcon: LayerNorm (+ bias), fused attn_qkv, and the parallel block
 *           x += attn(LN_2(x) or LN(x)) + FFN(LN(x)), the predictor reading x (parallel_layer);
 *   opt:    LayerNorm (+ bias) everywhere, biases on q/k/v/o and on the FFN's up and down, no rope,
 *           x = token_embd[tok] + position_embd[pos + 2], logits from token_embd;
 *   deepseek2 (hparams.mla_kv_rank): the attention is mla_attention's multi-head latent attention.
 *
 * Every op goes to a backend (backend.h) taken from the per-layer placement table ctx->lx (all CPU
 * unless pi_context_offload placed parts on a device; offload.c). There is one path for every
 * placement: a block runs on its backend's buffers, the residual stream x moves between backends only
 * where consecutive blocks differ (move_x), and a sparse layer with hot neurons on the device runs
 * them there and its cold ones on the CPU (sparse_ffn).
 */
#include "context.h"
#include "imatrix.h"
#include "lora.h"
#include "moe.h"
#include "gdn.h"
#include "shortconv.h"
#include "recurrent.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

pi_context_params pi_context_default_params(void) {
    return (pi_context_params){ .n_ctx = 512, .n_batch = 512, .n_seq_max = 1, .n_threads = 0, .type_k = PI_TYPE_F16,
                                .type_v = PI_TYPE_F16, .sparse_threshold = 0.0f, .sparse_mode = PI_SPARSE_PREDICT,
                                .sparse_gather_max = 1 };
}

/* ---- buffers ---- */

typedef struct { void **ptr; size_t bytes; } buf_slot;

/* The buffers of one backend and their sizes; device buffers include the logits. */
static int buffer_slots(pi_buffers *b, const pi_model *m, int64_t T, int64_t n_ctx, bool device, buf_slot *s) {
    const pi_hparams *hp = &m->hp;   /* sized for the largest layer */
    const size_t E = (size_t)hp->n_embd, F = (size_t)m->max_ff, Eq = (size_t)m->max_q, Ekv = (size_t)m->max_kv;
    const size_t t = (size_t)T, f = sizeof(float);
    int n = 0;
#define SLOT(field, nbytes) do { s[n].ptr = (void **)&b->field; s[n].bytes = (nbytes); n++; } while (0)
    SLOT(x, t * E * f);
    SLOT(cur, t * E * f);
    SLOT(q, t * Eq * f);
    SLOT(k, t * Ekv * f);
    SLOT(v, t * Ekv * f);
    SLOT(att, t * PI_MAX(E, Eq) * f);
    if (!hp->sparse) { SLOT(gate, t * F * f); SLOT(up, t * F * f); }
    if (hp->sparse) { SLOT(scores, t * F * f); SLOT(ffn_hot, t * E * f); }
    if (hp->arch == PI_ARCH_FALCON) SLOT(qkv, t * (Eq + 2 * Ekv) * f);
    if (hp->arch == PI_ARCH_FALCON || hp->parallel_block) SLOT(ln, t * E * f);
    SLOT(mask, t * (size_t)n_ctx * f);
    if (hp->n_swa > 0) SLOT(mask_swa, t * (size_t)n_ctx * f);
    SLOT(pos, t * sizeof(int32_t));
    SLOT(cells, t * sizeof(int32_t));
    SLOT(ids, t * sizeof(int32_t));
    const size_t P = (size_t)hp->n_embd_per_layer, L = (size_t)hp->n_layer;
    if (P) { SLOT(ple, t * L * P * f); SLOT(ple_g, 2 * t * P * f); }
    if (P && !device) { SLOT(ple_tok, t * L * P * f); SLOT(ple_x, t * L * P * f); }
    if (hp->mla_kv_rank > 0) {   /* mla_attention's q, values, and per-head input and output */
        const size_t R = (size_t)hp->mla_kv_rank, nope = (size_t)(hp->mla_head_k - hp->n_rot);
        const size_t Vd = (size_t)hp->mla_head_v, H = (size_t)hp->n_head;
        const size_t per_token = H * ((size_t)hp->mla_head_k + Vd) + PI_MAX(nope, R) + PI_MAX(R, Vd) +
                                 (size_t)hp->q_lora_rank;
        SLOT(mla, t * per_token * f);
    }
    if (device) SLOT(logits, t * (size_t)hp->n_vocab * f);
#undef SLOT
    return n;
}

size_t pi_buffers_bytes(const pi_model *m, int64_t T, int64_t n_ctx, bool device) {
    pi_buffers b;
    buf_slot s[24];
    const int n = buffer_slots(&b, m, T, n_ctx, device, s);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (s[i].bytes + 255) / 256 * 256;   /* as a device counts them */
    return total;
}

void pi_buffers_free(pi_exec *e) {
    for (int32_t i = 0; i < e->n_slots; i++)
        if (*e->slot[i]) e->be->i->free(e->be, *e->slot[i], e->slot_bytes[i]);
    memset(&e->buf, 0, sizeof e->buf);
    e->n_slots = 0;
}

pi_status pi_buffers_alloc(pi_exec *e, const pi_model *m, int64_t T, int64_t n_ctx, bool device) {
    memset(&e->buf, 0, sizeof e->buf);
    buf_slot s[24];
    e->n_slots = buffer_slots(&e->buf, m, T, n_ctx, device, s);
    for (int32_t i = 0; i < e->n_slots; i++) {
        e->slot[i] = s[i].ptr;
        e->slot_bytes[i] = s[i].bytes;
    }
    for (int32_t i = 0; i < e->n_slots; i++) {
        pi_status st = e->be->i->alloc(e->be, s[i].bytes, s[i].ptr);
        if (st != PI_OK) {
            pi_buffers_free(e);
            return st;
        }
    }
    return PI_OK;
}

void pi_context_free(pi_context *ctx) {
    if (!ctx) return;
    pi_imatrix_end(ctx);
    pi_offload_release(ctx);
    pi_buffers_free(&ctx->cpu);
    pi_backend_free(ctx->cpu.be);
    pi_threadpool_free(ctx->pool);
    pi_kv_release(&ctx->kv);
    free(ctx->lx);
    free(ctx->logits);
    free(ctx->embd);
    free(ctx->output_row);
    free(ctx->sparse_active);
    free(ctx->neuron_counts);
    free(ctx->layer_threshold);
    free(ctx->act_hist);
    free(ctx->act_usum);
    free(ctx->act_utokens);
    free(ctx->input_threshold);
    free(ctx->input_active);
    free(ctx->attn_threshold);
    free(ctx->attn_active);
    pi_lora_release(ctx);
    pi_moe_release(ctx);
    pi_rs_free(ctx->rs);
    free(ctx->gdn);
    free(ctx->cvec);
    free(ctx);
}

/* The rope frequency factors of this context: phi3's long factors where a sequence may hold more positions than the
 * model's original context (n_ctx / n_seq_max > n_ctx_orig, llama.cpp's n_ctx_seq), else rope_freqs (data NULL: none). */
const pi_tensor *pi_context_rope_freqs(const pi_context *ctx) {
    const pi_model *m = ctx->model;
    const int64_t n_ctx_seq = ctx->params.n_ctx / PI_MAX(ctx->params.n_seq_max, 1);
    if (m->rope_freqs_long.data && n_ctx_seq > m->hp.n_ctx_orig) return &m->rope_freqs_long;
    return &m->rope_freqs;
}

/* Every layer on the CPU, over the model's (possibly repacked) weights and the host KV cache. */
void pi_context_place_cpu(pi_context *ctx) {
    const pi_model *m = ctx->model;
    for (int32_t il = 0; il < m->hp.n_layer; il++)
        ctx->lx[il] = (pi_layer_exec){ .attn = &ctx->cpu, .ffn = &ctx->cpu, .attn_w = &m->layers[il],
                                       .ffn_w = &m->layers[il], .k = pi_kv_k_row(&ctx->kv, il, 0),
                                       .v = pi_kv_v_row(&ctx->kv, il, 0),
                                       .rope_freqs = pi_context_rope_freqs(ctx)->data };
    ctx->out = &ctx->cpu;
    ctx->out_w = &m->output;
    ctx->out_norm = &m->output_norm;
    ctx->out_norm_b = &m->output_norm_b;
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
    if (model->hp.mla_kv_rank > 0 && p.type_v != p.type_k)   /* as llama.cpp */
        return pi_fail(PI_ERR_INVALID_ARG, "deepseek2 (MLA) reads V from the K cache: the V cache type (%s) must be "
                       "the K cache type (%s)", pi_type_name(p.type_v), pi_type_name(p.type_k));
    for (int32_t il = 0; il < model->hp.n_layer; il++) {   /* every layer's head size */
        pi_status type_st = pi_kv_type_check(p.type_k, model->geom[il].head_dim, "K");
        if (type_st == PI_OK) type_st = pi_kv_type_check(p.type_v, model->geom[il].head_dim, "V");
        if (type_st != PI_OK) return type_st;
    }
    if (p.act_histogram && !model->uniform)
        return pi_fail(PI_ERR_UNSUPPORTED, "act_histogram: the model's layers differ in shape (per-layer n_ff)");

    pi_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    ctx->model = model;
    ctx->ostats.device = -1;
    const pi_hparams *hp = &model->hp;
    ctx->outputs = pi_is_encoder(hp) ? PI_OUTPUT_EMBD : PI_OUTPUT_LOGITS;
    if (p.n_threads <= 0) p.n_threads = pi_physical_cores();
    if (p.n_threads_batch <= 0) p.n_threads_batch = p.n_threads;
    pi_status st = pi_threadpool_create(PI_MAX(p.n_threads, p.n_threads_batch), &ctx->pool);
    if (st == PI_OK) pi_threadpool_set_active(ctx->pool, p.n_threads);
    ctx->params = p;
    if (st == PI_OK) st = pi_kv_init(&ctx->kv, p.n_ctx, model, p.type_k, p.type_v);
    if (st == PI_OK) st = pi_rs_create(ctx);
    const pi_scratch_need need = { .model = model, .T = p.n_batch, .n_ctx = p.n_ctx };
    if (st == PI_OK) st = pi_backend_cpu_create(ctx->pool, &need, &ctx->cpu.be);
    if (st == PI_OK) st = pi_buffers_alloc(&ctx->cpu, model, p.n_batch, p.n_ctx, false);
    if (st == PI_OK && !(ctx->lx = calloc((size_t)hp->n_layer, sizeof *ctx->lx)))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == PI_OK && !(ctx->sparse_active = calloc((size_t)hp->n_layer, sizeof(int64_t))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == PI_OK && !(ctx->layer_threshold = malloc((size_t)hp->n_layer * sizeof(float))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t il = 0; st == PI_OK && il < hp->n_layer; il++) ctx->layer_threshold[il] = p.sparse_threshold;
    if (st == PI_OK && p.act_histogram &&
        (!(ctx->act_hist = calloc((size_t)hp->n_layer * PI_ACT_HIST_KINDS * PI_ACT_HIST_BINS, sizeof(int64_t))) ||
         !(ctx->act_usum = calloc((size_t)hp->n_layer * (size_t)hp->n_ff, sizeof(double))) ||
         !(ctx->act_utokens = calloc((size_t)hp->n_layer, sizeof(int64_t)))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == PI_OK && (!(ctx->input_threshold = calloc((size_t)hp->n_layer, sizeof(float))) ||
                        !(ctx->input_active = calloc((size_t)hp->n_layer, sizeof(int64_t))) ||
                        !(ctx->attn_threshold = calloc((size_t)hp->n_layer * 2, sizeof(float))) ||
                        !(ctx->attn_active = calloc((size_t)hp->n_layer, sizeof(int64_t)))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == PI_OK && p.count_neurons && (hp->sparse || hp->gate_sparse) &&
        !(ctx->neuron_counts = calloc((size_t)(hp->n_layer * (int64_t)hp->n_ff), sizeof(int64_t))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == PI_OK && (p.sparse_mode != PI_SPARSE_PREDICT && p.sparse_mode != PI_SPARSE_ALL))
        st = pi_fail(PI_ERR_INVALID_ARG, "sparse_mode = %d is not PI_SPARSE_PREDICT or PI_SPARSE_ALL", p.sparse_mode);
    if (st == PI_OK && isnan(p.sparse_threshold)) st = pi_fail(PI_ERR_INVALID_ARG, "sparse_threshold is NaN");
    if (st == PI_OK && p.sparse_batch_max < 0)
        st = pi_fail(PI_ERR_INVALID_ARG, "sparse_batch_max = %d must be >= 0 (0: no limit)", p.sparse_batch_max);
    if (st == PI_OK && p.sparse_gather_max < 0)
        st = pi_fail(PI_ERR_INVALID_ARG, "sparse_gather_max = %d must be >= 0 (0: no limit)", p.sparse_gather_max);
    if (st == PI_OK && !(ctx->output_row = malloc((size_t)p.n_batch * sizeof(int32_t))))
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != PI_OK) { pi_context_free(ctx); return st; }
    pi_context_place_cpu(ctx);
    *out = ctx;
    return PI_OK;
}

void pi_set_abort_callback(pi_context *ctx, pi_abort_callback cb, void *user_data) {
    if (!ctx) return;
    ctx->abort_cb = cb;
    ctx->abort_data = user_data;
}

/* dst[il] = src[il] for every layer (src NULL: fallback), after refusing a NaN; what names the value. */
static pi_status set_per_layer(pi_context *ctx, float *dst, const float *src, float fallback, const char *what) {
    const int32_t n = ctx->model->hp.n_layer;
    for (int32_t il = 0; src && il < n; il++)
        if (isnan(src[il])) return pi_fail(PI_ERR_INVALID_ARG, "%s of layer %d is NaN", what, il);
    for (int32_t il = 0; il < n; il++) dst[il] = src ? src[il] : fallback;
    return PI_OK;
}

pi_status pi_set_sparse_thresholds(pi_context *ctx, const float *thresholds) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "context is NULL");
    return set_per_layer(ctx, ctx->layer_threshold, thresholds, ctx->params.sparse_threshold, "sparse threshold");
}

pi_status pi_set_gate_input_thresholds(pi_context *ctx, const float *thresholds) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "context is NULL");
    return set_per_layer(ctx, ctx->input_threshold, thresholds, 0.0f, "gate input threshold");
}

pi_status pi_gate_input_stats(pi_context *ctx, int64_t *active, int64_t *total) {
    if (!ctx || !active || !total) return pi_fail(PI_ERR_INVALID_ARG, "pi_gate_input_stats: NULL argument");
    memcpy(active, ctx->input_active, (size_t)ctx->model->hp.n_layer * sizeof(int64_t));
    *total = ctx->input_total;
    return PI_OK;
}

pi_status pi_set_attn_input_thresholds(pi_context *ctx, const float *qkv, const float *out) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "context is NULL");
    const int32_t n = ctx->model->hp.n_layer;
    for (int32_t il = 0; il < n; il++)
        if ((qkv && isnan(qkv[il])) || (out && isnan(out[il])))
            return pi_fail(PI_ERR_INVALID_ARG, "attention %s threshold of layer %d is NaN",
                           qkv && isnan(qkv[il]) ? "input" : "output", il);
    for (int32_t il = 0; il < n; il++) {
        ctx->attn_threshold[2 * il] = qkv ? qkv[il] : 0.0f;
        ctx->attn_threshold[2 * il + 1] = out ? out[il] : 0.0f;
    }
    return PI_OK;
}

pi_status pi_attn_input_stats(pi_context *ctx, int64_t *active, int64_t *total) {
    if (!ctx || !active || !total) return pi_fail(PI_ERR_INVALID_ARG, "pi_attn_input_stats: NULL argument");
    memcpy(active, ctx->attn_active, (size_t)ctx->model->hp.n_layer * sizeof(int64_t));
    *total = ctx->attn_total;
    return PI_OK;
}

pi_status pi_set_n_threads(pi_context *ctx, int32_t n_threads) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "context is NULL");
    pi_threadpool *pool;
    pi_status st = pi_threadpool_create(n_threads, &pool);
    if (st != PI_OK) return st;
    pi_threadpool_free(ctx->pool);
    ctx->pool = pool;
    ctx->cpu.be->pool = pool;
    if (ctx->dev.be) ctx->dev.be->pool = pool;
    ctx->params.n_threads = ctx->params.n_threads_batch = pi_threadpool_size(pool);
    return PI_OK;
}

/* ---- forward pass helpers: every op goes to the backend of the block that runs it ---- */

#define TRY(expr) do { pi_status st_ = (expr); if (st_ != PI_OK) return st_; } while (0)
#define OP(e, name, ...) ((e)->be->i->name((e)->be, __VA_ARGS__))

static pi_tensor f32_2d(float *data, int64_t ne0, int64_t ne1) {
    return pi_tensor_view(PI_TYPE_F32, data, 2, (int64_t[]){ ne0, ne1 });
}

/* bytes from src (on backend s) to dst (on backend d); nothing when they are the same memory */
static pi_status transfer(pi_exec *d, void *dst, pi_exec *s, const void *src, size_t bytes) {
    if (d == s) return dst == src ? PI_OK : OP(d, copy, dst, src, bytes);
    if (s->be->host) return OP(d, upload, dst, src, bytes);
    if (d->be->host) return OP(s, download, dst, src, bytes);
    return pi_fail(PI_ERR_UNSUPPORTED, "copies between two devices are not supported");
}

/* The residual stream x moves to the backend of the next block when it is elsewhere. */
static pi_status move_x(pi_context *ctx, pi_exec **at, pi_exec *e, int64_t T) {
    if (*at == e) return PI_OK;
    TRY(transfer(e, e->buf.x, *at, (*at)->buf.x, (size_t)(T * ctx->model->hp.n_embd) * sizeof(float)));
    *at = e;
    return PI_OK;
}

pi_status pi_scratch_product(pi_context *ctx, pi_exec *e, const pi_tensor *w, const float *x, float *y, int64_t T) {
    if (e->imatrix) TRY(pi_imatrix_observe(e->imatrix, w, x, T));
    pi_tensor xt = f32_2d((float *)x, w->ne[0], T), yt = f32_2d(y, w->ne[1], T);
    return pi_mul_mat_grow(e->be->pool, w, &xt, &yt, &ctx->moe_conv, &ctx->moe_conv_bytes);
}

/* y [N, T] = W [K, N] x [K, T] */
static pi_status matmul(pi_exec *e, const pi_tensor *w, float *x, float *y, int64_t T) {
    if (e->imatrix) TRY(pi_imatrix_observe(e->imatrix, w, x, T));
    pi_tensor xt = f32_2d(x, w->ne[0], T), yt = f32_2d(y, w->ne[1], T);
    return OP(e, mul_mat, w, &xt, &yt);
}

/* y[i] [N_i, T] = W[i] x for n weights of one input x [K, T] (q, k, v; gate, up): one op where the backend has it */
static pi_status matmuls(pi_exec *e, int n, const pi_tensor *const *w, float *x, float *const *y, int64_t T) {
    if (!e->be->i->mul_mats) {
        for (int i = 0; i < n; i++) TRY(matmul(e, w[i], x, y[i], T));
        return PI_OK;
    }
    if (e->imatrix)
        for (int i = 0; i < n; i++) TRY(pi_imatrix_observe(e->imatrix, w[i], x, T));
    pi_tensor xt = f32_2d(x, w[0]->ne[0], T), yt[PI_MUL_MATS_MAX];
    pi_tensor *yp[PI_MUL_MATS_MAX];
    for (int i = 0; i < n; i++) { yt[i] = f32_2d(y[i], w[i]->ne[1], T); yp[i] = &yt[i]; }
    return OP(e, mul_mats, n, w, &xt, yp);
}

static pi_status rms_norm(pi_context *ctx, pi_exec *e, const float *x, const pi_tensor *w, float *out, int64_t T) {
    pi_tensor xt = f32_2d((float *)x, w->ne[0], T), ot = f32_2d(out, w->ne[0], T);
    return OP(e, rms_norm, &xt, w, ctx->model->hp.norm_eps, &ot);
}

/* The block norm: RMSNorm, or LayerNorm with an optional bias (falcon, opt). */
static pi_status norm(pi_context *ctx, pi_exec *e, const float *x, const pi_tensor *w, const pi_tensor *b, float *out,
                      int64_t T) {
    if (!pi_uses_layer_norm(&ctx->model->hp)) return rms_norm(ctx, e, x, w, out, T);
    pi_tensor xt = f32_2d((float *)x, w->ne[0], T), ot = f32_2d(out, w->ne[0], T);
    return OP(e, layer_norm, &xt, w, b, ctx->model->hp.norm_eps, &ot);
}

/* A block's input: x normed, or x itself where the model has no pre-norms (olmo2: w->data NULL) */
static pi_status block_input(pi_context *ctx, pi_exec *e, const float *x, const pi_tensor *w, const pi_tensor *b,
                             float *out, int64_t T) {
    if (w->data) return norm(ctx, e, x, w, b, out, T);
    const int64_t E = ctx->model->hp.n_embd;
    pi_tensor xt = f32_2d((float *)x, E, T), ot = f32_2d(out, E, T);
    return OP(e, copy_2d, &xt, &ot);
}

static pi_status add_inplace(pi_exec *e, float *x, float *y, int64_t D, int64_t T) {
    pi_tensor xt = f32_2d(x, D, T), yt = f32_2d(y, D, T);
    return OP(e, binary, PI_BINARY_ADD, &xt, &yt, &xt);
}

/* y [D, T] += bias [D] */
static pi_status add_bias(pi_exec *e, float *y, const pi_tensor *bias, int64_t T) {
    pi_tensor yt = f32_2d(y, bias->ne[0], T);
    return OP(e, binary, PI_BINARY_ADD, &yt, bias, &yt);
}

/* x += (post_norms ? rms_norm(y) * post_norm : y) * residual_scale, y [n_embd, T] (y is overwritten) */
static pi_status residual_add(pi_context *ctx, pi_exec *e, float *y, const pi_tensor *post_norm, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    if (hp->post_norms) TRY(rms_norm(ctx, e, y, post_norm, y, T));
    if (hp->residual_scale != 0.0f && hp->residual_scale != 1.0f) {
        pi_tensor yt = f32_2d(y, hp->n_embd, T);
        TRY(OP(e, scale, &yt, hp->residual_scale));
    }
    return add_inplace(e, e->buf.x, y, hp->n_embd, T);
}

/* pi_batch.span: rows t, u of one span (id > 0) and sequence see each other's cells whatever their positions; the
 * sliding window hides pos[t] - pos[u] >= n_swa only (a later row is never hidden by it), as llama.cpp's mask does
 * when the decode is non-causal. O(T^2) over the span's rows (256 for a gemma3 image). */
static void span_mask(pi_context *ctx, const pi_batch *b, int32_t n_kv) {
    const int32_t n_swa = ctx->model->hp.n_swa;
    const int32_t *cells = ctx->cpu.buf.cells;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        if (b->span[t] <= 0) continue;
        float *row = ctx->cpu.buf.mask + (size_t)t * n_kv;
        float *row_swa = n_swa > 0 ? ctx->cpu.buf.mask_swa + (size_t)t * n_kv : NULL;
        for (int32_t u = 0; u < b->n_tokens; u++) {
            if (b->span[u] != b->span[t] || b->seq_id[u] != b->seq_id[t]) continue;
            row[cells[u]] = 0.0f;
            if (row_swa) row_swa[cells[u]] = (int64_t)b->pos[t] - b->pos[u] < n_swa ? 0.0f : -INFINITY;
        }
    }
}

/* mask[t][c] = 0 if cell c belongs to token t's sequence at a position <= pos[t], else -inf.
 * With a sliding window (n_swa > 0), mask_swa additionally hides cells with pos[t] - pos >= n_swa.
 * Built in the CPU's buffers; each backend that runs attention gets a copy per batch. */
static void build_mask(pi_context *ctx, const pi_batch *b, int32_t n_kv) {
    const int32_t n_swa = ctx->model->hp.n_swa;
    if (pi_is_encoder(&ctx->model->hp)) {   /* each token sees the tokens of its sequence in this batch, all of them */
        const int32_t *cells = ctx->cpu.buf.cells;
        for (int32_t t = 0; t < b->n_tokens; t++) {
            float *row = ctx->cpu.buf.mask + (size_t)t * n_kv;
            for (int32_t c = 0; c < n_kv; c++) row[c] = -INFINITY;
            for (int32_t u = 0; u < b->n_tokens; u++)
                if (b->seq_id[u] == b->seq_id[t]) row[cells[u]] = 0.0f;
        }
        return;
    }
    for (int32_t t = 0; t < b->n_tokens; t++) {
        float *row = ctx->cpu.buf.mask + (size_t)t * n_kv;
        float *row_swa = n_swa > 0 ? ctx->cpu.buf.mask_swa + (size_t)t * n_kv : NULL;
        const uint64_t bit = (uint64_t)1 << b->seq_id[t];
        for (int32_t c = 0; c < n_kv; c++) {
            const pi_kv_cell *cell = &ctx->kv.cells[c];
            row[c] = (cell->seqs & bit) && cell->pos <= b->pos[t] ? 0.0f : -INFINITY;
            if (row_swa) row_swa[c] = (int64_t)b->pos[t] - cell->pos < n_swa ? row[c] : -INFINITY;
        }
    }
    if (b->span) span_mask(ctx, b, n_kv);
}

/* The batch's positions, cells and masks on the device, when a layer's attention runs there. */
static pi_status batch_inputs(pi_context *ctx, const pi_batch *b, int32_t n_kv) {
    pi_exec *c = &ctx->cpu, *d = &ctx->dev;
    const size_t T = (size_t)b->n_tokens;
    memcpy(c->buf.pos, b->pos, T * sizeof(int32_t));
    build_mask(ctx, b, n_kv);
    if (!d->be || ctx->ostats.n_attn_layers == 0) return PI_OK;
    TRY(transfer(d, d->buf.pos, c, c->buf.pos, T * sizeof(int32_t)));
    TRY(transfer(d, d->buf.cells, c, c->buf.cells, T * sizeof(int32_t)));
    TRY(transfer(d, d->buf.mask, c, c->buf.mask, T * (size_t)n_kv * sizeof(float)));
    if (ctx->model->hp.n_swa > 0) TRY(transfer(d, d->buf.mask_swa, c, c->buf.mask_swa, T * (size_t)n_kv * sizeof(float)));
    return PI_OK;
}

/* bin of |v| in pi_act_histogram: 16 per octave from 2^-24, bin 0 below */
static int32_t act_bin(float v) {
    v = fabsf(v);
    if (!(v >= 0x1p-24f)) return 0;
    const int32_t b = 1 + (int32_t)floorf((log2f(v) + 24.0f) * 16.0f);
    return PI_MIN(b, PI_ACT_HIST_BINS - 1);
}

/* layer il's histogram of this kind (pi_act_histogram) += the n values |x_i| */
static void act_histogram_of(pi_context *ctx, int32_t il, int kind, const float *x, int64_t n) {
    int64_t *h = ctx->act_hist + ((int64_t)il * PI_ACT_HIST_KINDS + kind) * PI_ACT_HIST_BINS;
    for (int64_t i = 0; i < n; i++) h[act_bin(x[i])]++;
}

/* Whether a decode call of T tokens runs a gate-sparse file's levels (params.sparse_batch_max: larger ones run dense). */
static bool batch_sparse(const pi_context *ctx, int64_t T) {
    return ctx->params.sparse_mode == PI_SPARSE_PREDICT &&
           (ctx->params.sparse_batch_max <= 0 || T <= ctx->params.sparse_batch_max);
}

/* Whether a call of T tokens that runs a level reads the kept rows only (the sparse kernels: a batch gives its tokens'
 * bits one at a time) or zeroes what the level leaves out and runs the dense kernels (params.sparse_gather_max;
 * beyond one token the dense kernels are faster: bench/README.md). */
static bool batch_gathers(const pi_context *ctx, int64_t T) {
    return ctx->params.sparse_gather_max <= 0 || T <= ctx->params.sparse_gather_max;
}

/* Whether layer il's q/k/v (part 0) or wo (part 1) reads only the input entries above its threshold: an input-sparse
 * matmul, or in a batch beyond sparse_gather_max the dense one over the kept entries (a file with attn_input_sparse,
 * predictor mode and a batch within sparse_batch_max, a threshold > 0, the attention on the CPU). */
static bool attn_sparse(const pi_context *ctx, const pi_layer_exec *lx, int32_t il, int part, int64_t T) {
    return ctx->model->hp.attn_input_sparse && batch_sparse(ctx, T) && ctx->attn_threshold[2 * il + part] > 0.0f &&
           lx->attn == &ctx->cpu;
}

/* y[T][n_out] = w x over the entries of x [T][n_in] with |x_j| >= layer il's attention threshold (part 0: the input,
 * 1: the output) only, through the matrix's layout by input (TEAL); the entries read added to *n_read (NULL: not
 * counted: q, k and v read the same entries, counted once). */
static pi_status attn_sparse_matmul(pi_context *ctx, pi_exec *e, const pi_sparse_ffn_weights *w, int32_t il, int part,
                                    float *x, int64_t n_in, float *y, int64_t n_out, int64_t T, int64_t *n_read) {
    pi_tensor in = f32_2d(x, n_in, T), out = f32_2d(y, n_out, T);
    return OP(e, sparse_ffn, w, NULL, PI_ACT_RELU, PI_FFN_SEQ, &in, &in, ctx->attn_threshold[2 * il + part], NULL, &out,
              n_read, NULL);
}

/* dst [n, T] (rows dst_stride floats apart) = src [n, T] (rows src_stride floats apart) */
static pi_status copy_rows(pi_exec *e, const float *src, int64_t src_stride, float *dst, int64_t dst_stride, int64_t n,
                           int64_t T) {
    pi_tensor s = f32_2d((float *)src, n, T), d = f32_2d(dst, n, T);
    s.nb[1] = src_stride * (int64_t)sizeof(float);
    d.nb[1] = dst_stride * (int64_t)sizeof(float);
    return OP(e, copy_2d, &s, &d);
}

/* y [N, T] (rows y_stride floats apart) = head h's matrix [K, N] of a [K, N, n_head] stack times x [K, T] (rows
 * x_stride floats apart); tin and tout: contiguous [K, T] and [N, T] scratch */
static pi_status head_matmul(pi_exec *e, const pi_tensor *stack, int64_t h, const float *x, int64_t x_stride, float *y,
                             int64_t y_stride, float *tin, float *tout, int64_t T) {
    const int64_t K = stack->ne[0], N = stack->ne[1];
    pi_tensor w = pi_tensor_view(stack->type, (char *)stack->data + h * stack->nb[2], 2, (int64_t[]){ K, N });
    TRY(copy_rows(e, x, x_stride, tin, K, K, T));
    TRY(matmul(e, &w, tin, tout, T));
    return copy_rows(e, tout, N, y, y_stride, N, T);
}

/* DeepSeek-V2/V3's multi-head latent attention, absorbed (pi_hparams.mla_kv_rank; docs/design.md "MLA") over the normed
 * input in B->cur, the result in B->cur: attention with one KV head of D = R + n_rot values per token (the cache row
 * [kv_a_norm(latent), rope(k_pe)], V the same row read from the K cache), each query head [k_b[h] q_nope,
 * rope(q_pe)]; of each head's output [D] the first R values (the latent's part) times v_b[h], then wo. */
static pi_status mla_attention(pi_context *ctx, const pi_layer_exec *lx, int32_t il, const pi_batch *b, int32_t n_kv) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_exec *e = lx->attn;
    const pi_layer *L = lx->attn_w;
    pi_buffers *B = &e->buf;
    const pi_kv_cache *kv = &ctx->kv;
    const int64_t T = b->n_tokens, H = hp->n_head, R = hp->mla_kv_rank, nr = hp->n_rot, hk = hp->mla_head_k,
                  nope = hk - nr, Vd = hp->mla_head_v, D = R + nr;
    float *qf = B->mla, *vo = qf + T * H * hk, *tin = vo + T * H * Vd, *tout = tin + T * PI_MAX(nope, R),
          *qa = tout + T * PI_MAX(R, Vd);   /* qf [T][H][hk], vo [T][H][Vd], qa [T][q_lora_rank] */
    if (hp->q_lora_rank > 0) {
        TRY(matmul(e, &L->wq_a, B->cur, qa, T));
        TRY(rms_norm(ctx, e, qa, &L->q_a_norm, qa, T));
        TRY(matmul(e, &L->wq_b, qa, qf, T));
    } else {
        TRY(matmul(e, &L->wq, B->cur, qf, T));
    }
    TRY(matmul(e, &L->wkv_a, B->cur, B->k, T));   /* B->k [T][D]: [latent R, k_pe n_rot] */
    pi_tensor lat = f32_2d(B->k, R, T);
    lat.nb[1] = D * (int64_t)sizeof(float);
    TRY(OP(e, rms_norm, &lat, &L->kv_a_norm, hp->norm_eps, &lat));
    for (int64_t h = 0; h < H; h++) {   /* B->q [T][H][D]: [k_b[h] q_nope, q_pe] */
        TRY(head_matmul(e, &L->wk_b, h, qf + h * hk, H * hk, B->q + h * D, H * D, tin, tout, T));
        TRY(copy_rows(e, qf + h * hk + nope, H * hk, B->q + h * D + R, H * D, nr, T));
    }
    pi_tensor qpe = pi_tensor_view(PI_TYPE_F32, B->q + R, 3, (int64_t[]){ nr, H, T });
    pi_tensor kpe = pi_tensor_view(PI_TYPE_F32, B->k + R, 3, (int64_t[]){ nr, 1, T });
    qpe.nb[1] = D * (int64_t)sizeof(float);
    qpe.nb[2] = H * D * (int64_t)sizeof(float);
    kpe.nb[1] = kpe.nb[2] = D * (int64_t)sizeof(float);
    const float mscale = hp->rope_mscale > 0.0f ? hp->rope_mscale : 1.0f;
    TRY(OP(e, rope, &qpe, B->pos, (int32_t)nr, hp->rope_mode, hp->rope_freq_base, hp->rope_freq_scale, lx->rope_freqs,
           mscale, &qpe));
    TRY(OP(e, rope, &kpe, B->pos, (int32_t)nr, hp->rope_mode, hp->rope_freq_base, hp->rope_freq_scale, lx->rope_freqs,
           mscale, &kpe));
    pi_tensor kall = pi_tensor_view(kv->type_k, lx->k, 2, (int64_t[]){ D, kv->n_ctx });
    pi_tensor k2 = f32_2d(B->k, D, T);
    TRY(OP(e, set_rows, &kall, &k2, B->cells));
    /* V: the cached K rows themselves (the cache stores no V for MLA: kv_cache.c); their first R values are used */
    pi_tensor q = pi_tensor_view(PI_TYPE_F32, B->q, 3, (int64_t[]){ D, H, T });
    pi_tensor kc = pi_tensor_view(kv->type_k, lx->k, 3, (int64_t[]){ D, 1, n_kv });
    pi_tensor mask = f32_2d(B->mask, n_kv, T);
    pi_tensor att = pi_tensor_view(PI_TYPE_F32, B->att, 3, (int64_t[]){ D, H, T });
    TRY(OP(e, attention, &q, &kc, &kc, &mask, hp->attn_scale, 0.0f, NULL, &att));
    for (int64_t h = 0; h < H; h++)   /* vo [T][H][Vd] = v_b[h] (head h's output's first R values) */
        TRY(head_matmul(e, &L->wv_b, h, B->att + h * D, H * D, vo + h * Vd, H * Vd, tin, tout, T));
    return matmul(e, &L->wo, vo, B->cur, T);
}

/* q [hd, n_head, T] and (own_kv) k [hd, n_head_kv, T] RMS-normed in place (qk_norm): per head (1) or over each token's
 * whole q and k (2: olmo2) */
static pi_status qk_norms(pi_context *ctx, pi_exec *e, const pi_layer *L, pi_tensor *q, pi_tensor *k, bool own_kv) {
    const pi_hparams *hp = &ctx->model->hp;
    if (hp->qk_norm == 1) {
        TRY(OP(e, rms_norm, q, &L->q_norm, hp->norm_eps, q));
        if (own_kv) TRY(OP(e, rms_norm, k, &L->k_norm, hp->norm_eps, k));
    } else if (hp->qk_norm == 2) {
        pi_tensor qa = f32_2d(q->data, q->ne[0] * q->ne[1], q->ne[2]);
        pi_tensor ka = f32_2d(k->data, k->ne[0] * k->ne[1], k->ne[2]);
        TRY(OP(e, rms_norm, &qa, &L->q_norm, hp->norm_eps, &qa));
        if (own_kv) TRY(OP(e, rms_norm, &ka, &L->k_norm, hp->norm_eps, &ka));
    }
    return PI_OK;
}

/* q [Eq, T] *= 1 + attn_temp_scale * ln(floor(pos / attn_temp_floor) + 1) per token (mistral3): one scale op per run
 * of consecutive tokens with the same factor, none where it is 1 (positions below attn_temp_floor) */
static pi_status attn_temperature(pi_context *ctx, pi_exec *e, const pi_batch *b, float *q, int64_t Eq) {
    const pi_hparams *hp = &ctx->model->hp;
    if (hp->attn_temp_scale == 0.0f) return PI_OK;
    for (int32_t t0 = 0, t1; t0 < b->n_tokens; t0 = t1) {
        const int64_t step = b->pos[t0] / hp->attn_temp_floor;
        for (t1 = t0 + 1; t1 < b->n_tokens && b->pos[t1] / hp->attn_temp_floor == step; t1++) {}
        if (step == 0) continue;
        const float s = (float)(1.0 + (double)hp->attn_temp_scale * log((double)step + 1.0));
        pi_tensor qt = f32_2d(q + (size_t)t0 * (size_t)Eq, Eq, t1 - t0);
        TRY(OP(e, scale, &qt, s));
    }
    return PI_OK;
}

/* Attention of one layer over the normed input in B->cur: q/k/v, rope, KV store, attention, wo (+ bias),
 * the result in B->cur. */
static pi_status attention_core(pi_context *ctx, const pi_layer_exec *lx, int32_t il, const pi_batch *b, int32_t n_kv) {
    const pi_hparams *hp = &ctx->model->hp;
    const pi_layer_geom *g = &ctx->model->geom[il];
    pi_exec *e = lx->attn;
    const pi_layer *L = lx->attn_w;
    pi_buffers *B = &e->buf;
    const int64_t T = b->n_tokens, hd = g->head_dim, n_head_kv = g->n_head_kv;
    const int64_t Ekv = hd * n_head_kv, Eq = hd * hp->n_head;
    const bool local = g->is_local, own_kv = g->kv_source == il;   /* !own_kv: q only, over kv_source's cache */
    const pi_kv_cache *kv = &ctx->kv;
    if (hp->mla_kv_rank > 0) return mla_attention(ctx, lx, il, b, n_kv);
    const bool qkv_sparse = !L->wqkv.data && attn_sparse(ctx, lx, il, 0, T);

    if (L->wqkv.data) {   /* falcon: one matmul, rows = all Q heads, then all K heads, then all V heads */
        const int64_t W = Eq + 2 * Ekv;
        TRY(matmul(e, &L->wqkv, B->cur, B->qkv, T));
        TRY(pi_lora_add(ctx, e, il, PI_LORA_QKV, B->cur, B->qkv, T));
        pi_tensor src = f32_2d(B->qkv, Eq, T), dst = f32_2d(B->q, Eq, T);
        src.nb[1] = W * (int64_t)sizeof(float);
        TRY(OP(e, copy_2d, &src, &dst));
        src.ne[0] = Ekv; src.data = B->qkv + Eq;
        dst = f32_2d(B->k, Ekv, T);
        TRY(OP(e, copy_2d, &src, &dst));
        src.data = B->qkv + Eq + Ekv;
        dst = f32_2d(B->v, Ekv, T);
        TRY(OP(e, copy_2d, &src, &dst));
    } else if (qkv_sparse && batch_gathers(ctx, T)) {
        const pi_sparse_ffn_weights *W = ctx->model->layers[il].act_attn;
        TRY(attn_sparse_matmul(ctx, e, &W[0], il, 0, B->cur, hp->n_embd, B->q, Eq, T, &ctx->attn_active[il]));
        TRY(attn_sparse_matmul(ctx, e, &W[1], il, 0, B->cur, hp->n_embd, B->k, Ekv, T, NULL));
        TRY(attn_sparse_matmul(ctx, e, &W[2], il, 0, B->cur, hp->n_embd, B->v, Ekv, T, NULL));
    } else {
        float *in = B->cur;
        if (qkv_sparse) {   /* a batch: the kept entries in B->att (free until the attention) */
            pi_sparse_mask(ctx->pool, B->cur, -1, NULL, ctx->attn_threshold[2 * il], B->cur, B->att, hp->n_embd, T,
                           &ctx->attn_active[il], NULL);
            in = B->att;
        } else if (hp->attn_input_sparse) ctx->attn_active[il] += T * hp->n_embd;   /* every entry read */
        /* q, k, v; q alone in a shared-KV layer, q and k where there is no attn_v (v_norm: V is K's projection) */
        const int n = !own_kv ? 1 : L->wv.data ? 3 : 2;
        if (hp->attn_output_gate) {   /* q and its gate from attn_q (qwen35, qwen3next), then k and v */
            TRY(pi_gdn_gated_q(ctx, e, &L->wq, in, B->q, hd, T));
            TRY(matmuls(e, 2, (const pi_tensor *[]){ &L->wk, &L->wv }, in, (float *[]){ B->k, B->v }, T));
        } else
            TRY(matmuls(e, n, (const pi_tensor *[]){ &L->wq, &L->wk, &L->wv }, in, (float *[]){ B->q, B->k, B->v },
                        T));
    }
    if (ctx->n_lora && !L->wqkv.data) {   /* the adapters' terms read the normed input itself */
        TRY(pi_lora_add(ctx, e, il, PI_LORA_Q, B->cur, B->q, T));
        if (own_kv) TRY(pi_lora_add(ctx, e, il, PI_LORA_K, B->cur, B->k, T));
        if (L->wv.data) TRY(pi_lora_add(ctx, e, il, PI_LORA_V, B->cur, B->v, T));
    }
    if (own_kv && !L->wv.data && !L->wqkv.data)   /* V = the K projection, before k's norm and rope (gemma4) */
        TRY(OP(e, copy, B->v, B->k, (size_t)(T * Ekv) * sizeof(float)));
    if (ctx->act_hist && e == &ctx->cpu) act_histogram_of(ctx, il, 2, B->cur, T * hp->n_embd);
    if (hp->qkv_bias) {
        TRY(add_bias(e, B->q, &L->bq, T));
        if (own_kv) TRY(add_bias(e, B->k, &L->bk, T));
        if (own_kv) TRY(add_bias(e, B->v, &L->bv, T));
    }

    pi_tensor q = pi_tensor_view(PI_TYPE_F32, B->q, 3, (int64_t[]){ hd, hp->n_head, T });
    pi_tensor k = pi_tensor_view(PI_TYPE_F32, B->k, 3, (int64_t[]){ hd, n_head_kv, T });
    pi_tensor v = pi_tensor_view(PI_TYPE_F32, B->v, 3, (int64_t[]){ hd, n_head_kv, T });
    if (!hp->qk_norm_after_rope) TRY(qk_norms(ctx, e, L, &q, &k, own_kv));
    if (own_kv && hp->v_norm) TRY(OP(e, rms_norm, &v, NULL, hp->norm_eps, &v));   /* of each head, no weight (gemma4) */
    const float base = local && hp->rope_freq_base_swa > 0.0f ? hp->rope_freq_base_swa : hp->rope_freq_base;
    const float fscale = local && hp->rope_freq_scale_swa > 0.0f ? hp->rope_freq_scale_swa : hp->rope_freq_scale;
    const bool nope = hp->n_no_rope_layer_step > 0 && (il + 1) % hp->n_no_rope_layer_step == 0;   /* smollm3 */
    const float *freqs = local && hp->rope_freqs_global ? NULL : lx->rope_freqs;   /* gemma4: global layers only */
    if (hp->arch != PI_ARCH_OPT && !nope) {   /* opt: learned position embeddings, no rope */
        const float mscale = hp->rope_mscale > 0.0f ? hp->rope_mscale : 1.0f;
        TRY(OP(e, rope, &q, B->pos, g->n_rot, hp->rope_mode, base, fscale, freqs, mscale, &q));
        if (own_kv) TRY(OP(e, rope, &k, B->pos, g->n_rot, hp->rope_mode, base, fscale, freqs, mscale, &k));
    }

    if (hp->qk_norm_after_rope) TRY(qk_norms(ctx, e, L, &q, &k, own_kv));
    TRY(attn_temperature(ctx, e, b, B->q, Eq));

    if (own_kv) {   /* the KV store: rows cells[t] of this layer's cache */
        pi_tensor kall = pi_tensor_view(kv->type_k, lx->k, 2, (int64_t[]){ Ekv, kv->n_ctx });
        pi_tensor vall = pi_tensor_view(kv->type_v, lx->v, 2, (int64_t[]){ Ekv, kv->n_ctx });
        pi_tensor k2 = f32_2d(B->k, Ekv, T), v2 = f32_2d(B->v, Ekv, T);
        TRY(OP(e, set_rows, &kall, &k2, B->cells));
        TRY(OP(e, set_rows, &vall, &v2, B->cells));
    }

    /* views over cells [0, n_kv) of this layer's cache (a shared layer's: kv_source's): [hd, n_head_kv, n_kv] */
    pi_tensor kc = pi_tensor_view(kv->type_k, lx->k, 3, (int64_t[]){ hd, n_head_kv, n_kv });
    pi_tensor vc = pi_tensor_view(kv->type_v, lx->v, 3, (int64_t[]){ hd, n_head_kv, n_kv });
    pi_tensor mask = f32_2d(local ? B->mask_swa : B->mask, n_kv, T);
    pi_tensor att = pi_tensor_view(PI_TYPE_F32, B->att, 3, (int64_t[]){ hd, hp->n_head, T });
    const float scale = hp->attn_scale > 0.0f ? hp->attn_scale : 1.0f / sqrtf((float)hd);
    TRY(OP(e, attention, &q, &kc, &vc, &mask, scale, hp->attn_softcap, L->attn_sinks.data, &att));
    if (hp->attn_output_gate) TRY(pi_gdn_apply_gate(ctx, B->att, hd, T));

    if (ctx->act_hist && e == &ctx->cpu) act_histogram_of(ctx, il, 3, B->att, T * Eq);
    const bool wo_sparse = !L->wqkv.data && attn_sparse(ctx, lx, il, 1, T);
    if (wo_sparse && batch_gathers(ctx, T))
        TRY(attn_sparse_matmul(ctx, e, &ctx->model->layers[il].act_attn[3], il, 1, B->att, Eq, B->cur, hp->n_embd, T,
                               &ctx->attn_active[il]));
    else {
        if (wo_sparse)   /* a batch: wo over the kept entries */
            pi_sparse_mask(ctx->pool, B->att, -1, NULL, ctx->attn_threshold[2 * il + 1], B->att, B->att, Eq, T,
                           &ctx->attn_active[il], NULL);
        else if (hp->attn_input_sparse) ctx->attn_active[il] += T * Eq;
        TRY(matmul(e, &L->wo, B->att, B->cur, T));
    }
    TRY(pi_lora_add(ctx, e, il, PI_LORA_O, B->att, B->cur, T));   /* wo's input as its matmul read it */
    if (L->bo.data) TRY(add_bias(e, B->cur, &L->bo, T));
    return PI_OK;
}

static pi_status attention_block(pi_context *ctx, pi_exec **at, const pi_layer_exec *lx, int32_t il,
                                 const pi_batch *b, int32_t n_kv) {
    pi_exec *e = lx->attn;
    const int64_t T = b->n_tokens;
    TRY(move_x(ctx, at, e, T));
    TRY(block_input(ctx, e, e->buf.x, &lx->attn_w->attn_norm, &lx->attn_w->attn_norm_b, e->buf.cur, T));
    TRY(attention_core(ctx, lx, il, b, n_kv));
    return residual_add(ctx, e, e->buf.cur, &lx->attn_w->post_attn_norm, T);
}

/* A gated delta net or short conv layer (pi_layer_geom.recurrent) in place of the attention block:
 * x += gdn(rms_norm(x) * attn_norm) or shortconv(...), on the CPU (offload.c keeps these layers there). */
static pi_status recurrent_block(pi_context *ctx, pi_exec **at, const pi_layer_exec *lx, int32_t il,
                                 const pi_batch *b) {
    pi_exec *e = lx->attn;
    const int64_t T = b->n_tokens;
    TRY(move_x(ctx, at, e, T));
    TRY(block_input(ctx, e, e->buf.x, &lx->attn_w->attn_norm, &lx->attn_w->attn_norm_b, e->buf.cur, T));
    TRY(ctx->model->hp.shortconv ? pi_shortconv_layer(ctx, e, lx->attn_w, il, b)
                                 : pi_gdn_layer(ctx, e, lx->attn_w, il, b));
    return residual_add(ctx, e, e->buf.cur, &lx->attn_w->post_attn_norm, T);
}

/* PowerInfer FFN of the normed input `in` into `out` (both [T][n_embd] on the layer's main backend e =
 * lx->attn); the predictor reads `pred_in`. The hot neurons (n_hot of them) run on e, the cold ones
 * on the CPU from the model's weights with the hot ones skipped, at the same time where e is
 * asynchronous; the two partial sums are added in one fixed order: out = cold + hot. A layer with
 * every neuron hot (or none) has one part and the CPU-only summation order. */
static pi_status sparse_ffn(pi_context *ctx, const pi_layer_exec *lx, int32_t il, int64_t T, float *in,
                            float *pred_in, float *out) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_exec *e = lx->attn, *c = &ctx->cpu;
    const pi_layer *L = lx->attn_w;
    const int64_t E = hp->n_embd, F = hp->n_ff;
    pi_tensor scores = f32_2d(e->buf.scores, F, T);
    float threshold = ctx->layer_threshold[il];
    if (ctx->params.sparse_mode == PI_SPARSE_ALL) {
        TRY(OP(e, fill, &scores, 0.0f));
        threshold = -INFINITY;
    } else {
        pi_tensor xt = f32_2d(pred_in, E, T);
        TRY(OP(e, predictor, &L->fc1, &L->fc2, &xt, &scores));
    }
    int64_t *counts = ctx->neuron_counts ? ctx->neuron_counts + il * F : NULL;
    const bool hot = lx->n_hot > 0, cold = lx->n_hot < F;
    /* the CPU half's inputs: the CPU's own buffers (the same memory when e is the CPU) */
    float *c_in = e == c ? in : c->buf.cur, *c_out = e == c ? out : c->buf.att;
    pi_tensor c_scores = f32_2d(c->buf.scores, F, T);
    if (cold) {
        TRY(transfer(c, c_in, e, in, (size_t)(T * E) * sizeof(float)));
        TRY(transfer(c, c->buf.scores, e, e->buf.scores, (size_t)(T * F) * sizeof(float)));
    }
    if (hot) {   /* asynchronous on a GPU: the CPU's cold neurons below run meanwhile */
        pi_tensor it = f32_2d(in, E, T), ot = f32_2d(cold ? e->buf.ffn_hot : out, E, T);
        TRY(OP(e, sparse_ffn, &lx->hot, lx->bucket, hp->ffn_act, hp->ffn_gate, &it, &scores, threshold, NULL, &ot,
               &ctx->sparse_active[il], counts));
    }
    if (cold) {
        const pi_layer *CL = &ctx->model->layers[il];
        pi_sparse_ffn_weights w = { .gate = CL->ffn_gate, .up = CL->ffn_up, .down_t = CL->ffn_down_t,
                                    .up_bias = CL->ffn_up_b.data, .down_bias = CL->ffn_down_t_b.data };
        pi_tensor it = f32_2d(c_in, E, T), ot = f32_2d(c_out, E, T);
        TRY(OP(c, sparse_ffn, &w, NULL, hp->ffn_act, hp->ffn_gate, &it, &c_scores, threshold, lx->hot_mask, &ot,
               &ctx->sparse_active[il], counts));
        TRY(transfer(e, out, c, c_out, (size_t)(T * E) * sizeof(float)));
        if (hot) TRY(add_inplace(e, out, e->buf.ffn_hot, E, T));
    }
    return PI_OK;   /* sparse_active[il] is complete after the decode's final sync */
}

/* Pre-norm sparse FFN (llama, bamboo, opt): the predictor reads the pre-norm residual x, the FFN the normed input. */
static pi_status sparse_ffn_block(pi_context *ctx, pi_exec **at, const pi_layer_exec *lx, int32_t il, int64_t T) {
    pi_exec *e = lx->attn;
    TRY(move_x(ctx, at, e, T));
    TRY(norm(ctx, e, e->buf.x, &lx->attn_w->ffn_norm, &lx->attn_w->ffn_norm_b, e->buf.cur, T));
    TRY(sparse_ffn(ctx, lx, il, T, e->buf.cur, e->buf.x, e->buf.att));
    return add_inplace(e, e->buf.x, e->buf.att, ctx->model->hp.n_embd, T);
}

float pi_act_histogram_edge(int32_t bin) {
    if (bin <= 0) return 0.0f;
    return exp2f((float)(bin - 1) / 16.0f - 24.0f);
}

/* layer il's histograms: kind 0 |act(gate)| (times the channel's act_scale where the file has one) over T x n_ff,
 * kind 1 |x| over the FFN input's T x n_embd; and the channels' sums of |up x| */
static void act_histogram(pi_context *ctx, int32_t il, const float *gate, const float *up, const float *x, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    int64_t *h = ctx->act_hist + (int64_t)il * PI_ACT_HIST_KINDS * PI_ACT_HIST_BINS;
    const float *scale = ctx->model->layers[il].act_ffn.act_scale;
    float a[256];
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hp->n_ff; c += 256) {   /* the values the sparse step's selection compares */
            const int64_t n = PI_MIN(256, hp->n_ff - c);
            pi_gate_scores(hp->ffn_act, n, gate + t * hp->n_ff + c, scale ? scale + c : NULL, a);
            for (int64_t k = 0; k < n; k++) h[act_bin(a[k])]++;
        }
    double *usum = ctx->act_usum + (int64_t)il * hp->n_ff;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < hp->n_ff; i++) usum[i] += fabsf(up[t * hp->n_ff + i]);
    ctx->act_utokens[il] += T;
    act_histogram_of(ctx, il, 1, x, T * hp->n_embd);
}

/* A gate-sparse file's layer runs activation-sparse when the predictor mode is on and the call's T tokens are within
 * params.sparse_batch_max, its threshold keeps fewer than every channel (|act| >= t <= 0 keeps all: the dense
 * kernels run, exactly the dense model) and its FFN is on the CPU. */
static bool act_sparse(const pi_context *ctx, const pi_layer_exec *lx, int32_t il, int64_t T) {
    return ctx->model->hp.gate_sparse && batch_sparse(ctx, T) && ctx->layer_threshold[il] > 0.0f &&
           lx->ffn == &ctx->cpu;
}

/* Whether layer il's gate reads only the FFN input entries with |x_j| >= its input threshold (a file with ffn_gate_t
 * or a column layout of ffn_gate, a threshold > 0). */
static bool gate_input_sparse(const pi_context *ctx, int32_t il) {
    return ctx->model->layers[il].act_gate.down_t.data && ctx->input_threshold[il] > 0.0f;
}

/* The activation-sparse FFN of a gate-sparse layer: the gate (dense, or over the input entries with |x_j| >= the
 * input threshold where the file has ffn_gate_t), then the channels with |act(gate)| >= the layer's threshold. */
static pi_status act_sparse_ffn(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    const pi_layer *ML = &ctx->model->layers[il];
    pi_buffers *B = &e->buf;
    pi_tensor in = f32_2d(B->cur, hp->n_embd, T), g = f32_2d(B->gate, hp->n_ff, T), o = f32_2d(B->att, hp->n_embd, T);
    if (gate_input_sparse(ctx, il)) {   /* up NULL: an input-sparse matmul */
        TRY(OP(e, sparse_ffn, &ML->act_gate, NULL, hp->ffn_act, PI_FFN_SEQ, &in, &in, ctx->input_threshold[il], NULL, &g,
               &ctx->input_active[il], NULL));
    } else {
        TRY(matmul(e, &L->ffn_gate, B->cur, B->gate, T));
        ctx->input_active[il] += T * hp->n_embd;
    }
    int64_t *counts = ctx->neuron_counts ? ctx->neuron_counts + il * hp->n_ff : NULL;
    TRY(OP(e, sparse_ffn, &ML->act_ffn, NULL, hp->ffn_act, hp->ffn_gate, &in, &g, ctx->layer_threshold[il], NULL, &o,
           &ctx->sparse_active[il], counts));
    return residual_add(ctx, e, B->att, &L->post_ffn_norm, T);
}

/* A level over the dense kernels (a batch beyond sparse_gather_max): the gate over the kept input entries (the others
 * zeroed), up over every entry, h = act(gate) * up zeroed for the channels left out, then the dense down matrix:
 * the level's selection at about the dense model's speed. */
static pi_status masked_sparse_ffn(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    const pi_layer *ML = &ctx->model->layers[il];
    pi_buffers *B = &e->buf;
    if (gate_input_sparse(ctx, il)) {   /* B->att is free until the FFN's output */
        pi_sparse_mask(ctx->pool, B->cur, -1, NULL, ctx->input_threshold[il], B->cur, B->att, hp->n_embd, T,
                       &ctx->input_active[il], NULL);
        TRY(matmul(e, &L->ffn_gate, B->att, B->gate, T));
        TRY(matmul(e, &L->ffn_up, B->cur, B->up, T));
    } else {
        TRY(matmuls(e, 2, (const pi_tensor *[]){ &L->ffn_gate, &L->ffn_up }, B->cur, (float *[]){ B->gate, B->up }, T));
        ctx->input_active[il] += T * hp->n_embd;
    }
    pi_tensor g = f32_2d(B->gate, hp->n_ff, T), u = f32_2d(B->up, hp->n_ff, T);
    TRY(OP(e, glu, hp->ffn_act, hp->ffn_gate, &g, &u));   /* h = up */
    pi_sparse_mask(ctx->pool, B->gate, hp->ffn_act, ML->act_ffn.act_scale, ctx->layer_threshold[il], B->up, B->up,
                   hp->n_ff, T, &ctx->sparse_active[il],
                   ctx->neuron_counts ? ctx->neuron_counts + il * hp->n_ff : NULL);
    TRY(matmul(e, &L->ffn_down, B->up, B->cur, T));
    return residual_add(ctx, e, B->cur, &L->post_ffn_norm, T);
}

/* B->cur [n_embd, T] = layer il's dense FFN of B->cur (ffn_gate, ffn_up, ffn_down and their LoRA adapters) */
static pi_status dense_ffn(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_buffers *B = &e->buf;
    if (hp->ffn_gate != PI_FFN_SEQ)
        TRY(matmuls(e, 2, (const pi_tensor *[]){ &L->ffn_gate, &L->ffn_up }, B->cur, (float *[]){ B->gate, B->up }, T));
    else
        TRY(matmul(e, &L->ffn_up, B->cur, B->up, T));
    if (ctx->n_lora) {
        if (hp->ffn_gate != PI_FFN_SEQ) TRY(pi_lora_add(ctx, e, il, PI_LORA_GATE, B->cur, B->gate, T));
        TRY(pi_lora_add(ctx, e, il, PI_LORA_UP, B->cur, B->up, T));
    }
    if (L->ffn_up_b.data) TRY(add_bias(e, B->up, &L->ffn_up_b, T));   /* encoders */
    const int64_t F = ctx->model->geom[il].n_ff;
    pi_tensor g = f32_2d(B->gate, F, T), u = f32_2d(B->up, F, T);
    if (hp->gate_sparse) {   /* every channel computed */
        ctx->sparse_active[il] += T * hp->n_ff;
        ctx->input_active[il] += T * hp->n_embd;
        for (int64_t i = 0; ctx->neuron_counts && i < hp->n_ff; i++) ctx->neuron_counts[il * hp->n_ff + i] += T;
    }
    if (ctx->act_hist && hp->ffn_gate != PI_FFN_SEQ && e == &ctx->cpu) act_histogram(ctx, il, B->gate, B->up, B->cur, T);
    if (hp->ffn_act == PI_ACT_XIELU) pi_xielu(ctx->pool, B->up, F * T, L->act_params.data);   /* the CPU (offload.c) */
    else TRY(OP(e, glu, hp->ffn_act, hp->ffn_gate, hp->ffn_gate != PI_FFN_SEQ ? &g : NULL, &u));   /* h = up */
    if (hp->ffn_act_square) TRY(OP(e, binary, PI_BINARY_MUL, &u, &u, &u));   /* h = h^2 (ReLU^2: arcee) */
    TRY(matmul(e, &L->ffn_down, B->up, B->cur, T));
    TRY(pi_lora_add(ctx, e, il, PI_LORA_DOWN, B->up, B->cur, T));
    return L->ffn_down_b.data ? add_bias(e, B->cur, &L->ffn_down_b, T) : PI_OK;
}

/* hparams.moe_dense_ffn (gemma4): B->cur (ffn_norm(x)) = rms_norm(FFN(B->cur)) * post_ffw_norm_1 +
 * rms_norm(experts(rms_norm(x) * pre_ffw_norm_2)) * post_ffw_norm_2, the experts' branch in B->att (free in the FFN) */
static pi_status moe_dense_ffn(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, int64_t T) {
    pi_buffers *B = &e->buf;
    TRY(rms_norm(ctx, e, B->x, &L->ffn_pre_norm_2, B->att, T));
    TRY(pi_moe_ffn(ctx, e, L, B->x, B->att, B->att, T));
    TRY(rms_norm(ctx, e, B->att, &L->ffn_post_norm_2, B->att, T));
    TRY(dense_ffn(ctx, e, L, il, T));
    TRY(rms_norm(ctx, e, B->cur, &L->ffn_post_norm_1, B->cur, T));
    return add_inplace(e, B->cur, B->att, ctx->model->hp.n_embd, T);
}

static pi_status ffn_block(pi_context *ctx, pi_exec **at, const pi_layer_exec *lx, int32_t il, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_exec *e = lx->ffn;
    const pi_layer *L = lx->ffn_w;
    pi_buffers *B = &e->buf;
    TRY(move_x(ctx, at, e, T));
    TRY(block_input(ctx, e, B->x, &L->ffn_norm, &L->ffn_norm_b, B->cur, T));
    if (ctx->model->geom[il].moe)
        TRY(hp->moe_dense_ffn ? moe_dense_ffn(ctx, e, L, il, T) : pi_moe_ffn(ctx, e, L, B->x, B->cur, B->cur, T));
    else if (act_sparse(ctx, lx, il, T))
        return batch_gathers(ctx, T) ? act_sparse_ffn(ctx, e, L, il, T) : masked_sparse_ffn(ctx, e, L, il, T);
    else
        TRY(dense_ffn(ctx, e, L, il, T));
    return residual_add(ctx, e, B->cur, &L->post_ffn_norm, T);
}

/* A parallel block: h = norm(x) in ln, x += attn(LN_2(x) where falcon-40B has its own norm, else h) + FFN(h); the
 * layer's attention and FFN on one backend. falcon: the predictor-guided sparse FFN of its PowerInfer files (the
 * predictor reading x), attn + FFN added first, then x; command-r, cohere2 (hparams.parallel_block; offload refuses
 * them): the dense FFN, x += attn, then x += FFN. */
static pi_status parallel_layer(pi_context *ctx, pi_exec **at, const pi_layer_exec *lx, int32_t il, const pi_batch *b,
                                int32_t n_kv) {
    pi_exec *e = lx->attn;
    pi_buffers *B = &e->buf;
    const pi_layer *L = lx->attn_w;
    const int64_t T = b->n_tokens, E = ctx->model->hp.n_embd;
    const size_t bytes = (size_t)(T * E) * sizeof(float);
    TRY(move_x(ctx, at, e, T));
    TRY(norm(ctx, e, B->x, &L->attn_norm, &L->attn_norm_b, B->ln, T));
    if (L->attn_norm_2.data) TRY(norm(ctx, e, B->x, &L->attn_norm_2, &L->attn_norm_2_b, B->cur, T));
    else TRY(OP(e, copy, B->cur, B->ln, bytes));
    TRY(attention_core(ctx, lx, il, b, n_kv));           /* -> B->cur */
    if (ctx->model->hp.sparse) {
        TRY(sparse_ffn(ctx, lx, il, T, B->ln, B->x, B->att)); /* -> B->att */
        TRY(add_inplace(e, B->cur, B->att, E, T));            /* attn_out + FFN, then + inpL */
    } else {
        TRY(add_inplace(e, B->x, B->cur, E, T));
        TRY(OP(e, copy, B->cur, B->ln, bytes));
        TRY(dense_ffn(ctx, e, lx->ffn_w, il, T));             /* -> B->cur */
    }
    return add_inplace(e, B->x, B->cur, E, T);
}

/* An encoder layer (bert family: post-norm blocks, the attention over each sequence in both directions):
 * x = LN(x + attn(x)) * attn_output_norm + b, then x = LN(x + FFN(x)) * layer_output_norm + b (llama.cpp's bert graph);
 * on the CPU. */
static pi_status encoder_layer(pi_context *ctx, pi_exec **at, const pi_layer_exec *lx, int32_t il, const pi_batch *b,
                               int32_t n_kv) {
    pi_exec *e = lx->attn;
    pi_buffers *B = &e->buf;
    const pi_layer *L = lx->attn_w;
    const int64_t T = b->n_tokens, E = ctx->model->hp.n_embd;
    const float eps = ctx->model->hp.norm_eps;
    pi_tensor xt = f32_2d(B->x, E, T);
    TRY(move_x(ctx, at, e, T));
    TRY(OP(e, copy, B->cur, B->x, (size_t)(T * E) * sizeof(float)));
    TRY(attention_core(ctx, lx, il, b, n_kv));            /* -> B->cur (+ bo) */
    TRY(add_inplace(e, B->x, B->cur, E, T));
    TRY(OP(e, layer_norm, &xt, &L->attn_out_norm, &L->attn_out_norm_b, eps, &xt));
    TRY(OP(e, copy, B->cur, B->x, (size_t)(T * E) * sizeof(float)));
    TRY(dense_ffn(ctx, e, lx->ffn_w, il, T));              /* -> B->cur (+ biases) */
    TRY(add_inplace(e, B->x, B->cur, E, T));
    return OP(e, layer_norm, &xt, &L->layer_out_norm, &L->layer_out_norm_b, eps, &xt);
}

static pi_status check_batch(const pi_context *ctx, const pi_batch *b) {
    const pi_hparams *hp = &ctx->model->hp;
    if (!b || (!b->token && !b->embd) || !b->pos || !b->seq_id)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: incomplete batch");
    if (b->embd && hp->n_embd_per_layer > 0)
        return pi_fail(PI_ERR_UNSUPPORTED, "pi_decode: input embeddings on a model with per-layer embeddings "
                       "(gemma3n / gemma4) are not supported");
    if (b->n_tokens < 1 || b->n_tokens > ctx->params.n_batch)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: batch of %d tokens, must be 1..n_batch (%d)", b->n_tokens,
                       ctx->params.n_batch);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (!b->embd && (b->token[i] < 0 || b->token[i] >= hp->n_vocab))
            return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: token %d at %d is out of range [0, %d)", b->token[i], i,
                           hp->n_vocab);
        if (b->pos[i] < 0) return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: negative position %d at %d", b->pos[i], i);
        if (ctx->model->pos_embd.data && pi_pos_embd_row(hp, b->pos[i]) >= ctx->model->pos_embd.ne[1])
            return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: position %d at %d is past the %lld learned positions",
                           b->pos[i], i, (long long)(ctx->model->pos_embd.ne[1] - pi_pos_embd_row(hp, 0)));
        if (b->seq_id[i] < 0 || b->seq_id[i] >= ctx->params.n_seq_max)
            return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: sequence id %d at %d is out of range [0, %d)",
                           b->seq_id[i], i, ctx->params.n_seq_max);
    }
    return PI_OK;
}

/* x = token_embd[tokens] (* embd_scale) (+ position_embd[pos + 2]), on the CPU (the table stays in the file). */
static pi_status embeddings(pi_context *ctx, const pi_batch *b) {
    const pi_model *m = ctx->model;
    pi_exec *c = &ctx->cpu;
    const int64_t T = b->n_tokens, E = m->hp.n_embd;
    pi_tensor x = f32_2d(c->buf.x, E, T);
    if (b->embd) {   /* pi_batch.embd: the rows as given (no embd_scale, no adapter term: llama.cpp's embd input) */
        for (int64_t t = 0; t < T; t++) {
            for (int64_t j = 0; j < E; j++) {
                const float v = b->embd[t * E + j];
                if (!isfinite(v)) return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: input embedding row %lld has a "
                                                 "non-finite value at %lld", (long long)t, (long long)j);
            }
        }
        memcpy(c->buf.x, b->embd, (size_t)(T * E) * sizeof(float));
    } else {
        TRY(OP(c, get_rows, &m->token_embd, b->token, T, &x));
        TRY(pi_lora_add_embd(ctx, c, b->token, c->buf.x, T));
        if (m->hp.embd_scale > 0.0f && m->hp.embd_scale != 1.0f) TRY(OP(c, scale, &x, m->hp.embd_scale));   /* gemma */
    }
    if (m->type_embd.data) {   /* encoders: + token_types[0] (sentence A) for every token, as llama.cpp */
        pi_tensor te = f32_2d(c->buf.cur, E, 1);
        c->buf.ids[0] = 0;
        TRY(OP(c, get_rows, &m->type_embd, c->buf.ids, 1, &te));
        TRY(add_bias(c, c->buf.x, &te, T));
    }
    if (m->pos_embd.data) {   /* opt: + position_embd[pos + 2]; bert: + position_embd[pos] */
        for (int64_t t = 0; t < T; t++) c->buf.ids[t] = (int32_t)pi_pos_embd_row(&m->hp, b->pos[t]);
        pi_tensor pe = f32_2d(c->buf.cur, E, T);
        TRY(OP(c, get_rows, &m->pos_embd, c->buf.ids, T, &pe));
        TRY(add_inplace(c, c->buf.x, c->buf.cur, E, T));
    }
    if (m->tok_norm.data) TRY(OP(c, layer_norm, &x, &m->tok_norm, &m->tok_norm_b, m->hp.norm_eps, &x));   /* encoders */
    return PI_OK;
}

/* The per-layer inputs of the batch (gemma4's per-layer embeddings), from the scaled token embeddings x, on the CPU:
 * P [n_layer][T][n_pl] = (rms_norm(per_layer_model_proj . x / sqrt(n_embd)) * per_layer_proj_norm per n_pl chunk +
 * per_layer_token_embd[tokens] * sqrt(n_pl)) / sqrt(2) (llama.cpp's project_per_layer_inputs), copied to the device
 * where it runs dense FFNs (the per-layer block runs after each FFN, on its backend). */
static pi_status per_layer_inputs(pi_context *ctx, const pi_batch *b) {
    const pi_model *m = ctx->model;
    pi_exec *c = &ctx->cpu, *d = &ctx->dev;
    const int64_t T = b->n_tokens, P = m->hp.n_embd_per_layer, L = m->hp.n_layer, E = m->hp.n_embd;
    if (P == 0) return PI_OK;
    pi_tensor tok = f32_2d(c->buf.ple_tok, P * L, T), proj = f32_2d(c->buf.ple_x, P * L, T);
    TRY(OP(c, get_rows, &m->ple_tok_embd, b->token, T, &tok));   /* the file's rows, whatever their type */
    TRY(OP(c, scale, &tok, sqrtf((float)P)));
    TRY(matmul(c, &m->ple_model_proj, c->buf.x, c->buf.ple_x, T));
    TRY(OP(c, scale, &proj, 1.0f / sqrtf((float)E)));
    TRY(rms_norm(ctx, c, c->buf.ple_x, &m->ple_proj_norm, c->buf.ple_x, L * T));   /* [n_pl, n_layer T] */
    TRY(add_inplace(c, c->buf.ple_tok, c->buf.ple_x, P * L, T));
    TRY(OP(c, scale, &tok, 1.0f / sqrtf(2.0f)));
    for (int64_t il = 0; il < L; il++) {   /* [T][n_layer][n_pl] -> [n_layer][T][n_pl]: layer il's rows contiguous */
        pi_tensor src = f32_2d(c->buf.ple_tok + il * P, P, T), dst = f32_2d(c->buf.ple + il * T * P, P, T);
        src.nb[1] = (size_t)(P * L) * sizeof(float);
        TRY(OP(c, copy_2d, &src, &dst));
    }
    if (!d->be || ctx->ostats.n_ffn_layers == 0) return PI_OK;
    return transfer(d, d->buf.ple, c, c->buf.ple, (size_t)(L * T * P) * sizeof(float));
}

/* x [n_embd, T] += rms_norm(proj . (gelu(inp_gate . x) * P[il])) * post_norm: layer il's per-layer embedding, after its
 * FFN, on the FFN's backend e. T_batch: the batch's tokens; T < T_batch (the last layer over the output rows only):
 * P[il]'s output rows (the CPU's buf.ids). */
static pi_status per_layer_embedding(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, int64_t T,
                                     int64_t T_batch) {
    const int64_t P = ctx->model->hp.n_embd_per_layer, E = ctx->model->hp.n_embd;
    if (P == 0) return PI_OK;
    pi_buffers *B = &e->buf;
    float *g = B->ple_g, *rows = B->ple + il * T_batch * P;   /* [n_pl, T] */
    TRY(matmul(e, &L->ple_gate, B->x, g, T));
    TRY(pi_lora_add(ctx, e, il, PI_LORA_PLE_GATE, B->x, g, T));
    pi_tensor gt = f32_2d(g, P, T);
    TRY(OP(e, glu, PI_ACT_GELU, PI_FFN_SEQ, NULL, &gt));
    if (T < T_batch) {
        TRY(transfer(e, B->ids, &ctx->cpu, ctx->cpu.buf.ids, (size_t)T * sizeof(int32_t)));
        pi_tensor all = f32_2d(rows, P, T_batch), out = f32_2d(B->ple_g + T * P, P, T);
        TRY(OP(e, get_rows, &all, B->ids, T, &out));
        rows = B->ple_g + T * P;
    }
    pi_tensor pt = f32_2d(rows, P, T);
    TRY(OP(e, binary, PI_BINARY_MUL, &gt, &pt, &gt));
    TRY(matmul(e, &L->ple_proj, g, B->cur, T));
    TRY(pi_lora_add(ctx, e, il, PI_LORA_PLE_PROJ, g, B->cur, T));
    TRY(rms_norm(ctx, e, B->cur, &L->ple_norm, B->cur, T));
    return add_inplace(e, B->x, B->cur, E, T);
}

/* rows of n floats in *buf (capacity *cap rows), grown to n_rows */
static pi_status reserve_rows(float **buf, int32_t *cap, int32_t n_rows, int64_t n, const char *what) {
    if (n_rows <= *cap) return PI_OK;
    float *p = realloc(*buf, (size_t)n_rows * (size_t)n * sizeof(float));
    if (!p) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for %s of %d rows", what, n_rows);
    *buf = p;
    *cap = n_rows;
    return PI_OK;
}

/* Which batch rows asked for outputs (b->logits, else the last): ctx->output_row[t] = its output row or -1, the
 * CPU's buf.ids = the rows in order; returns how many. */
static int32_t output_rows(pi_context *ctx, const pi_batch *b) {
    int32_t n_out = 0;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const bool want = b->logits ? b->logits[t] != 0 : t == b->n_tokens - 1;
        ctx->output_row[t] = want ? n_out : -1;
        if (want) ctx->cpu.buf.ids[n_out++] = t;
    }
    return n_out;
}

/* e's cur = the n_out output rows (the CPU's buf.ids) of e's x [T][n_embd], in order. */
static pi_status gather_output_rows(pi_context *ctx, pi_exec *e, int64_t T, int32_t n_out) {
    const int64_t E = ctx->model->hp.n_embd;
    TRY(transfer(e, e->buf.ids, &ctx->cpu, ctx->cpu.buf.ids, (size_t)n_out * sizeof(int32_t)));
    pi_tensor xt = f32_2d(e->buf.x, E, T), rows = f32_2d(e->buf.cur, E, n_out);
    return OP(e, get_rows, &xt, e->buf.ids, n_out, &rows);
}

/* The residual stream x [T][n_embd] (on at) keeps only the n_out output rows, in order. */
static pi_status keep_output_rows(pi_context *ctx, pi_exec *at, int64_t T, int32_t n_out) {
    TRY(gather_output_rows(ctx, at, T, n_out));
    return OP(at, copy, at->buf.x, at->buf.cur, (size_t)(n_out * ctx->model->hp.n_embd) * sizeof(float));
}

/* Final norm, then the output head, for the n_out rows that asked for outputs (output_rows), on the output's backend:
 * ctx->outputs says whether the normed rows (embeddings) are kept and whether the head runs. x holds T rows, or only
 * the output rows (T == n_out: forward dropped the others before the last FFN). */
static pi_status compute_logits(pi_context *ctx, pi_exec **at, int64_t T, int32_t n_out) {
    const pi_model *m = ctx->model;
    pi_exec *e = ctx->out, *c = &ctx->cpu;
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
    const bool want_logits = ctx->outputs & PI_OUTPUT_LOGITS, want_embd = ctx->outputs & PI_OUTPUT_EMBD;
    if (n_out == 0) return PI_OK;
    if (want_logits) TRY(reserve_rows(&ctx->logits, &ctx->logits_cap, n_out, V, "logits"));
    if (want_embd) TRY(reserve_rows(&ctx->embd, &ctx->embd_cap, n_out, E, "embeddings"));
    TRY(move_x(ctx, at, e, T));
    if (T > n_out) TRY(gather_output_rows(ctx, e, T, n_out));   /* else x holds just the output rows */
    if (pi_is_encoder(&m->hp)) {   /* the last layer's x as it is: no output norm, no head (pi_set_outputs) */
        if (T == n_out) TRY(OP(e, copy, e->buf.cur, e->buf.x, (size_t)n_out * (size_t)E * sizeof(float)));
        return transfer(c, ctx->embd, e, e->buf.cur, (size_t)n_out * (size_t)E * sizeof(float));
    }
    TRY(norm(ctx, e, T > n_out ? e->buf.cur : e->buf.x, ctx->out_norm, ctx->out_norm_b, e->buf.cur, n_out));
    if (want_embd) TRY(transfer(c, ctx->embd, e, e->buf.cur, (size_t)n_out * (size_t)E * sizeof(float)));
    if (!want_logits) return PI_OK;
    float *dst = e->buf.logits ? e->buf.logits : ctx->logits;
    TRY(matmul(e, ctx->out_w, e->buf.cur, dst, n_out));
    TRY(pi_lora_add_output(ctx, e, e->buf.cur, dst, n_out));
    if (m->hp.logit_scale != 0.0f && m->hp.logit_scale != 1.0f) {   /* granite */
        pi_tensor lt = f32_2d(dst, V, n_out);
        TRY(OP(e, scale, &lt, 1.0f / m->hp.logit_scale));
    }
    TRY(transfer(c, ctx->logits, e, dst, (size_t)n_out * (size_t)V * sizeof(float)));
    /* gemma2's final soft-capping on the host's copy, whatever backend computed the head (download waits for it) */
    if (m->hp.final_softcap > 0.0f) pi_softcap(ctx->pool, ctx->logits, (int64_t)n_out * V, m->hp.final_softcap);
    return PI_OK;
}

/* Whether the last layer's FFN may run over the output rows only (as llama.cpp does): its result matters for those
 * rows alone, and every op of a dense FFN gives a row the same bits whatever the batch (docs/design.md), so the
 * outputs are the same. Not for the sparse FFNs and the calibration histograms, whose statistics count every token
 * of every layer, nor for falcon's parallel block (its attention and FFN read the same normed rows). */
static bool prune_last_ffn(const pi_context *ctx) {
    const pi_hparams *hp = &ctx->model->hp;
    return !hp->sparse && !hp->gate_sparse && !ctx->act_hist && hp->arch != PI_ARCH_FALCON;
}

/* x [T][n_embd] *= layer il's blk.N.layer_output_scale where the file has one (gemma4), after its FFN's residual add */
static pi_status layer_output_scale(pi_context *ctx, pi_exec *at, int32_t il, int64_t T) {
    const pi_tensor *s = &ctx->model->layers[il].out_scale;   /* [1] f32, on the host */
    if (!s->data) return PI_OK;
    pi_tensor xt = f32_2d(at->buf.x, ctx->model->hp.n_embd, T);
    return OP(at, scale, &xt, *(const float *)s->data);
}

/* x [T][n_embd] += the control vector's row il, after layer il (llama.cpp's cvec) */
static pi_status control_vector(pi_context *ctx, pi_exec *at, int32_t il, int64_t T) {
    if (!ctx->cvec || il < ctx->cvec_start || il > ctx->cvec_end) return PI_OK;
    if (at != &ctx->cpu) return pi_fail(PI_ERR_UNSUPPORTED, "control vectors run on the CPU only (layer %d is not)", il);
    const int64_t E = ctx->model->hp.n_embd;
    pi_tensor row = pi_tensor_view(PI_TYPE_F32, ctx->cvec + il * E, 1, (int64_t[]){ E });
    return add_bias(at, at->buf.x, &row, T);
}

pi_status pi_context_set_control_vector(pi_context *ctx, const float *data, int32_t n_embd, int32_t il_start,
                                        int32_t il_end) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "pi_context_set_control_vector: ctx is NULL");
    const pi_hparams *hp = &ctx->model->hp;
    if (data && n_embd != hp->n_embd)
        return pi_fail(PI_ERR_INVALID_ARG, "control vector of %d values, the model's n_embd is %d", n_embd,
                       (int)hp->n_embd);
    if (data && (il_start < 0 || il_end < il_start))
        return pi_fail(PI_ERR_INVALID_ARG, "control vector layer range [%d, %d] is empty or negative", il_start,
                       il_end);
    const int32_t last = data ? PI_MIN(il_end, hp->n_layer - 1) : -1;
    for (int32_t il = data ? il_start : 0; il <= last; il++) {
        const pi_layer_exec *lx = &ctx->lx[il];
        if (lx->attn != &ctx->cpu || lx->ffn != &ctx->cpu)
            return pi_fail(PI_ERR_UNSUPPORTED, "control vectors run on the CPU only, and layer %d is offloaded", il);
    }
    float *copy = NULL;
    if (data) {
        const size_t bytes = (size_t)hp->n_layer * (size_t)hp->n_embd * sizeof(float);
        if (!(copy = malloc(bytes))) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for a control vector");
        memcpy(copy, data, bytes);
        for (size_t i = 0; i < bytes / sizeof(float); i++)
            if (!isfinite(copy[i])) {
                free(copy);
                return pi_fail(PI_ERR_INVALID_ARG, "control vector value %zu is not finite", i);
            }
    }
    free(ctx->cvec);
    ctx->cvec = copy;
    ctx->cvec_start = il_start;
    ctx->cvec_end = il_end;
    return PI_OK;
}

static pi_status forward(pi_context *ctx, const pi_batch *batch, int32_t n_kv) {
    const pi_model *m = ctx->model;
    pi_exec *at = &ctx->cpu;   /* the backend holding the valid residual stream */
    TRY(batch_inputs(ctx, batch, n_kv));
    TRY(embeddings(ctx, batch));
    TRY(per_layer_inputs(ctx, batch));
    const int32_t n_out = output_rows(ctx, batch);
    int64_t T = batch->n_tokens;   /* rows of the residual stream */
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        if (ctx->abort_cb && ctx->abort_cb(ctx->abort_data)) return pi_fail(PI_ERR_ABORTED, "decode aborted by the abort callback");
        const pi_layer_exec *lx = &ctx->lx[il];
        if (pi_is_encoder(&m->hp)) {
            TRY(encoder_layer(ctx, &at, lx, il, batch, n_kv));
            continue;
        }
        if (m->hp.arch == PI_ARCH_FALCON || m->hp.parallel_block) {
            TRY(parallel_layer(ctx, &at, lx, il, batch, n_kv));
            TRY(control_vector(ctx, at, il, T));
            continue;
        }
        if (m->geom[il].recurrent) TRY(recurrent_block(ctx, &at, lx, il, batch));
        else TRY(attention_block(ctx, &at, lx, il, batch, n_kv));
        if (il == m->hp.n_layer - 1 && n_out < T && prune_last_ffn(ctx)) {
            if (n_out == 0) break;   /* no outputs: the cache is written, the last FFN would be for nothing */
            TRY(keep_output_rows(ctx, at, T, n_out));
            T = n_out;
        }
        if (m->hp.sparse) TRY(sparse_ffn_block(ctx, &at, lx, il, T));
        else TRY(ffn_block(ctx, &at, lx, il, T));
        TRY(per_layer_embedding(ctx, at, lx->ffn_w, il, T, batch->n_tokens));
        TRY(layer_output_scale(ctx, at, il, T));
        TRY(control_vector(ctx, at, il, T));
    }
    TRY(compute_logits(ctx, &at, T, n_out));
    return ctx->dev.be ? ctx->dev.be->i->sync(ctx->dev.be) : PI_OK;
}

pi_status pi_decode(pi_context *ctx, const pi_batch *batch) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: context is NULL");
    ctx->n_batch_last = 0;
    pi_status st = check_batch(ctx, batch);
    if (st != PI_OK) return st;
    const int32_t T = batch->n_tokens;
    if (ctx->rs && (st = pi_rs_begin(ctx->rs, batch)) != PI_OK) return st;
    st = pi_kv_claim(&ctx->kv, T, batch->pos, batch->seq_id, ctx->cpu.buf.cells);
    if (st != PI_OK) return st;
    pi_threadpool_set_active(ctx->pool, T > 1 ? ctx->params.n_threads_batch : ctx->params.n_threads);
    st = forward(ctx, batch, pi_kv_span(&ctx->kv));
    if (st == PI_OK && pi_is_encoder(&ctx->model->hp))   /* an encoder's decode is whole: nothing stays cached */
        pi_kv_unclaim(&ctx->kv, T, ctx->cpu.buf.cells);
    if (st != PI_OK) {
        if (ctx->dev.be) ctx->dev.be->i->sync(ctx->dev.be);
        pi_kv_unclaim(&ctx->kv, T, ctx->cpu.buf.cells);   /* leave the cache as it was */
        return st;
    }
    if (ctx->model->hp.sparse || ctx->model->hp.gate_sparse) ctx->sparse_total += (int64_t)T * ctx->model->hp.n_ff;
    ctx->input_total += (int64_t)T * ctx->model->hp.n_embd;
    ctx->attn_total += (int64_t)T * (ctx->model->hp.n_embd + pi_head_dim(&ctx->model->hp) * ctx->model->hp.n_head);
    ctx->n_batch_last = T;
    if (ctx->rs) pi_rs_commit(ctx->rs);
    return PI_OK;
}

const float *pi_get_logits(pi_context *ctx, int32_t i) {
    if (!ctx) { pi_fail(PI_ERR_INVALID_ARG, "pi_get_logits: context is NULL"); return NULL; }
    if (!(ctx->outputs & PI_OUTPUT_LOGITS)) {
        pi_fail(PI_ERR_INVALID_ARG, "pi_get_logits: the context outputs embeddings only (pi_set_outputs)");
        return NULL;
    }
    if (i < 0 || i >= ctx->n_batch_last || ctx->output_row[i] < 0) {
        pi_fail(PI_ERR_INVALID_ARG, "pi_get_logits: no logits for batch row %d", i);
        return NULL;
    }
    return ctx->logits + (size_t)ctx->output_row[i] * (size_t)ctx->model->hp.n_vocab;
}

pi_status pi_set_outputs(pi_context *ctx, int32_t outputs) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "pi_set_outputs: context is NULL");
    if (outputs < 1 || outputs > (PI_OUTPUT_LOGITS | PI_OUTPUT_EMBD))
        return pi_fail(PI_ERR_INVALID_ARG, "pi_set_outputs: %d is not PI_OUTPUT_LOGITS, PI_OUTPUT_EMBD or both", outputs);
    if ((outputs & PI_OUTPUT_LOGITS) && pi_is_encoder(&ctx->model->hp))
        return pi_fail(PI_ERR_UNSUPPORTED, "pi_set_outputs: an encoder model (bert family) has no output head: it "
                       "outputs embeddings only");
    ctx->outputs = outputs;
    ctx->n_batch_last = 0;   /* the last decode's rows were made for the old outputs */
    return PI_OK;
}

const float *pi_get_embeddings(pi_context *ctx, int32_t i) {
    if (!ctx) { pi_fail(PI_ERR_INVALID_ARG, "pi_get_embeddings: context is NULL"); return NULL; }
    if (!(ctx->outputs & PI_OUTPUT_EMBD)) {
        pi_fail(PI_ERR_INVALID_ARG, "pi_get_embeddings: the context does not output embeddings (pi_set_outputs)");
        return NULL;
    }
    if (i < 0 || i >= ctx->n_batch_last || ctx->output_row[i] < 0) {
        pi_fail(PI_ERR_INVALID_ARG, "pi_get_embeddings: no embeddings for batch row %d", i);
        return NULL;
    }
    return ctx->embd + (size_t)ctx->output_row[i] * (size_t)ctx->model->hp.n_embd;
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
    if (ctx->act_hist) {
        memset(ctx->act_hist, 0, (size_t)ctx->model->hp.n_layer * PI_ACT_HIST_KINDS * PI_ACT_HIST_BINS * sizeof(int64_t));
        memset(ctx->act_usum, 0, (size_t)ctx->model->hp.n_layer * (size_t)ctx->model->hp.n_ff * sizeof(double));
        memset(ctx->act_utokens, 0, (size_t)ctx->model->hp.n_layer * sizeof(int64_t));
    }
    memset(ctx->input_active, 0, (size_t)ctx->model->hp.n_layer * sizeof(int64_t));
    memset(ctx->attn_active, 0, (size_t)ctx->model->hp.n_layer * sizeof(int64_t));
    ctx->sparse_total = 0;
    ctx->input_total = 0;
    ctx->attn_total = 0;
}

pi_status pi_act_histogram(pi_context *ctx, int64_t *hist) {
    if (!ctx || !hist) return pi_fail(PI_ERR_INVALID_ARG, "pi_act_histogram: NULL argument");
    if (!ctx->act_hist) return pi_fail(PI_ERR_INVALID_ARG, "pi_act_histogram: the context was made without act_histogram");
    memcpy(hist, ctx->act_hist, (size_t)ctx->model->hp.n_layer * PI_ACT_HIST_KINDS * PI_ACT_HIST_BINS * sizeof(int64_t));
    return PI_OK;
}

pi_status pi_act_channel_means(pi_context *ctx, float *means) {
    if (!ctx || !means) return pi_fail(PI_ERR_INVALID_ARG, "pi_act_channel_means: NULL argument");
    if (!ctx->act_hist)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_act_channel_means: the context was made without act_histogram");
    const int64_t n_ff = ctx->model->hp.n_ff;
    for (int32_t il = 0; il < ctx->model->hp.n_layer; il++)
        for (int64_t i = 0; i < n_ff; i++)
            means[il * n_ff + i] = ctx->act_utokens[il] ? (float)(ctx->act_usum[il * n_ff + i] / (double)ctx->act_utokens[il])
                                                        : 0.0f;
    return PI_OK;
}

pi_status pi_neuron_counts(pi_context *ctx, int32_t il, int64_t *counts) {
    if (!ctx || !counts) return pi_fail(PI_ERR_INVALID_ARG, "pi_neuron_counts: NULL argument");
    const pi_hparams *hp = &ctx->model->hp;
    if (!ctx->neuron_counts)
        return pi_fail(PI_ERR_INVALID_ARG, hp->sparse || hp->gate_sparse
                                                      ? "pi_neuron_counts: the context was made without count_neurons"
                                                      : "pi_neuron_counts: not a sparse (PowerInfer or gate-sparse) model");
    if (il < 0 || il >= hp->n_layer)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_neuron_counts: layer %d is out of range [0, %d)", il, hp->n_layer);
    memcpy(counts, ctx->neuron_counts + il * (int64_t)hp->n_ff, (size_t)hp->n_ff * sizeof(int64_t));
    return PI_OK;
}
