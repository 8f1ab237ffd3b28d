/* moe.c: the mixture-of-experts FFN (Mixtral, Qwen3-MoE, gpt-oss), llama.cpp's build_moe_ffn with a softmax router and
 * norm_w: per token the router's logits l = gate_inp x (+ its bias), p = softmax(l), the n_expert_used largest p (ties:
 * the lower expert), weights w = p / (sum of the chosen p) (times expert_weights_scale where it is not 0), and
 * y = sum over the chosen e of w_e down_e (silu(gate_e x) * (up_e x)). The renormalized softmax is the softmax of the
 * chosen logits alone, which is what gpt-oss's gating (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT without norm_w)
 * computes: the one rule serves both. With hparams.expert_bias each product gets its expert's bias (gate_e x + b_gate,
 * up_e x + b_up, down_e h + b_down, as ggml_add_id), and ffn_act PI_ACT_SWIGLU_OAI replaces silu(g) u by gpt-oss's
 * clamped SwiGLU (pi_swiglu_oai). With hparams.expert_raw_weights (qwen2moe) w = p of the chosen, not renormalized;
 * with a shared expert (hparams.n_ff_shexp) y += down_s (silu(gate_s x) * (up_s x)), times sigmoid(gate_inp_s . x) where
 * the layer has that gate. gemma4: the router reads rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale (moe_router_norm; x
 * the block's input, not the experts' normed input), and each expert's output is times its ffn_down_exps.scale (where
 * the file has one, any arch: llama.cpp's down_exps_s). DeepSeek-V3's routing (route_biased): sigmoid probabilities
 * (hparams.expert_sigmoid) or the softmax's, a selection bias (exp_probs_b) and expert groups (n_expert_groups); the
 * chosen experts weighted by their unbiased p. Each expert runs once per call over the tokens routed to it
 * (their rows gathered), through mul_mat, so a token's row does not depend on the batch. CPU only. */
#include "moe.h"
#include "imatrix.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr) do { pi_status st_ = (expr); if (st_ != PI_OK) return st_; } while (0)
#define OP(e, name, ...) ((e)->be->i->name((e)->be, __VA_ARGS__))

static pi_tensor f32_2d(float *data, int64_t ne0, int64_t ne1) {
    return pi_tensor_view(PI_TYPE_F32, data, 2, (int64_t[]){ ne0, ne1 });
}

/* expert e's [ne0, ne1] matrix of a [ne0, ne1, n_expert] tensor */
static pi_tensor expert(const pi_tensor *t, int64_t e) {
    return pi_tensor_view(t->type, (char *)t->data + e * t->nb[2], 2, (int64_t[]){ t->ne[0], t->ne[1] });
}

/* y [m][n] += expert ex's bias (row ex of b [n, n_expert]; b absent: nothing) */
static void add_rows(const pi_tensor *b, int32_t ex, float *y, int64_t n, int64_t m) {
    if (!b->data) return;
    const float *row = (const float *)((const char *)b->data + ex * b->nb[1]);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) y[i * n + j] += row[j];
}

/* r [T][E] = rms_norm(x) (no weight) / sqrt(E) * scale [E] (gemma4's router input; ggml_rms_norm's double sum) */
static void router_input(const float *x, const float *scale, float eps, float *r, int64_t E, int64_t T) {
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * E;
        double ss = 0.0;
        for (int64_t j = 0; j < E; j++) ss += (double)(xt[j] * xt[j]);
        const float k = 1.0f / sqrtf((float)(ss / (double)E) + eps), inv = 1.0f / sqrtf((float)E);
        for (int64_t j = 0; j < E; j++) r[t * E + j] = xt[j] * k * inv * scale[j];
    }
}

/* es[0..K) = the indices of the K largest s[0..n) (ties: the lower index first) */
static void top_k(const float *s, int64_t n, int64_t K, int32_t *es) {
    for (int64_t k = 0; k < K; k++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++) {
            bool taken = false;
            for (int64_t j = 0; j < k; j++) taken |= es[j] == i;
            if (!taken && (best < 0 || s[i] > s[best])) best = i;
        }
        es[k] = best;
    }
}

/* One token's experts from its router logits l [NE] by the softmax (top-K of the logits): es [K] and their weights ws
 * [K], the softmax's probabilities renormalized over the chosen (or, expert_raw_weights, not), times the scale. */
static void route_softmax(const pi_hparams *hp, const float *l, int32_t *es, float *ws) {
    const int64_t NE = hp->n_expert, K = hp->n_expert_used;
    float mx = l[0], all = 0.0f, sum = 0.0f;
    for (int64_t i = 1; i < NE; i++) mx = fmaxf(mx, l[i]);
    if (hp->expert_raw_weights)
        for (int64_t i = 0; i < NE; i++) all += expf(l[i] - mx);
    top_k(l, NE, K, es);
    for (int64_t k = 0; k < K; k++) {
        ws[k] = expf(l[es[k]] - mx);   /* the softmax's denominator cancels in the renormalization */
        sum += ws[k];
    }
    const float scale = hp->expert_weights_scale != 0.0f ? hp->expert_weights_scale : 1.0f;
    if (hp->expert_raw_weights) sum = all;
    for (int64_t k = 0; k < K; k++) ws[k] = ws[k] / sum * scale;
}

/* DeepSeek-V3's routing of one token (llama.cpp's build_moe_ffn): p [NE] = sigmoid(l) (expert_sigmoid) or softmax(l);
 * selection scores s = p + bias (bias NULL: p); with n_expert_groups groups only the n_group_used groups with the
 * largest sums of their two best s compete; the top-K of s chosen, weighted by p, renormalized unless
 * expert_raw_weights (the sum clamped to >= 6.103515625e-5), times the scale. p and s: [NE] scratch. */
static void route_biased(const pi_hparams *hp, const float *bias, const float *l, float *p, float *s, int32_t *es,
                         float *ws) {
    const int64_t NE = hp->n_expert, K = hp->n_expert_used;
    if (hp->expert_sigmoid) {
        for (int64_t i = 0; i < NE; i++) p[i] = 1.0f / (1.0f + expf(-l[i]));
    } else {
        float mx = l[0];
        double sum = 0.0;
        for (int64_t i = 1; i < NE; i++) mx = fmaxf(mx, l[i]);
        for (int64_t i = 0; i < NE; i++) sum += p[i] = expf(l[i] - mx);
        for (int64_t i = 0; i < NE; i++) p[i] = (float)(p[i] / sum);
    }
    for (int64_t i = 0; i < NE; i++) s[i] = bias ? p[i] + bias[i] : p[i];
    if (hp->n_expert_groups > 1) {   /* each group's score: its two best s; the other groups' s to -inf */
        const int64_t G = hp->n_expert_groups, per = NE / G;
        float score[1024];
        int32_t keep[1024], two[2];
        for (int64_t g = 0; g < G; g++) {
            top_k(s + g * per, per, 2, two);
            score[g] = s[g * per + two[0]] + s[g * per + two[1]];
        }
        top_k(score, G, hp->n_group_used, keep);
        for (int64_t g = 0; g < G; g++) {
            bool used = false;
            for (int64_t j = 0; j < hp->n_group_used; j++) used |= keep[j] == g;
            for (int64_t i = 0; !used && i < per; i++) s[g * per + i] = -INFINITY;
        }
    }
    top_k(s, NE, K, es);
    float sum = 0.0f;
    for (int64_t k = 0; k < K; k++) sum += ws[k] = p[es[k]];
    const float scale = hp->expert_weights_scale != 0.0f ? hp->expert_weights_scale : 1.0f;
    const float div = hp->expert_raw_weights ? 1.0f : fmaxf(sum, 6.103515625e-5f);
    for (int64_t k = 0; k < K; k++) ws[k] = ws[k] / div * scale;
}

pi_status pi_moe_ffn(pi_context *ctx, pi_exec *e, const pi_layer *L, const float *x, float *in, float *out, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    if (e != &ctx->cpu) return pi_fail(PI_ERR_UNSUPPORTED, "mixture-of-experts layers run on the CPU only");
    const int64_t E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used, Fe = pi_n_ff_exp(hp);
    const int64_t F = Fe > hp->n_ff_shexp ? Fe : hp->n_ff_shexp;   /* g and u hold either kind */
    /* scratch: logits [T][NE], chosen [T][K] (expert, weight), gathered x [T][E], g and u [T][F], d [T][E], acc [T][E],
     * p and s [NE] (route_biased) */
    const int64_t need = T * NE + 2 * T * K + 3 * T * E + 2 * T * F + 2 * NE;
    if (need > ctx->moe_n) {
        float *p = realloc(ctx->moe, (size_t)need * sizeof(float));
        if (!p) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the experts of %lld tokens", (long long)T);
        ctx->moe = p;
        ctx->moe_n = need;
    }
    float *logits = ctx->moe, *wsel = logits + T * NE, *xg = wsel + 2 * T * K, *g = xg + T * E, *u = g + T * F,
          *d = u + T * F, *acc = d + T * E, *p = acc + T * E, *s = p + NE;
    int32_t *esel = (int32_t *)(wsel + T * K);
    if (hp->moe_router_norm) {   /* the router's input in xg (free until the experts gather their tokens) */
        router_input(x, L->ffn_gate_inp_s.data, hp->norm_eps, xg, E, T);
        TRY(pi_scratch_product(ctx, e, &L->ffn_gate_inp, xg, logits, T));
    } else {
        TRY(pi_scratch_product(ctx, e, &L->ffn_gate_inp, in, logits, T));
    }
    if (L->ffn_gate_inp_b.data) {   /* the router's bias (gpt-oss) */
        const float *b = L->ffn_gate_inp_b.data;
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < NE; i++) logits[t * NE + i] += b[i];
    }
    const bool biased = hp->expert_sigmoid || hp->n_expert_groups > 1 || L->exp_probs_b.data;
    for (int64_t t = 0; t < T; t++) {
        if (biased) route_biased(hp, L->exp_probs_b.data, logits + t * NE, p, s, esel + t * K, wsel + t * K);
        else route_softmax(hp, logits + t * NE, esel + t * K, wsel + t * K);
    }
    memset(acc, 0, (size_t)(T * E) * sizeof(float));
    int32_t *rows = (int32_t *)logits;   /* the logits are read: their space holds the routed tokens now */
    for (int32_t ex = 0; ex < NE; ex++) {
        int64_t m = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++)
                if (esel[t * K + k] == ex) {
                    rows[m] = (int32_t)(t * K + k);
                    memcpy(xg + m * E, in + t * E, (size_t)E * sizeof(float));
                    m++;
                }
        if (m == 0) continue;
        pi_tensor ge = expert(&L->ffn_gate_exps, ex), ue = expert(&L->ffn_up_exps, ex),
                  de = expert(&L->ffn_down_exps, ex);
        if (e->imatrix) {
            TRY(pi_imatrix_observe_expert(e->imatrix, &L->ffn_gate_exps, ex, xg, m));
            TRY(pi_imatrix_observe_expert(e->imatrix, &L->ffn_up_exps, ex, xg, m));
        }
        TRY(pi_scratch_product(ctx, e, &ge, xg, g, m));
        TRY(pi_scratch_product(ctx, e, &ue, xg, u, m));
        add_rows(&L->ffn_gate_exps_b, ex, g, Fe, m);
        add_rows(&L->ffn_up_exps_b, ex, u, Fe, m);
        if (hp->ffn_act == PI_ACT_SWIGLU_OAI) pi_swiglu_oai(ctx->pool, g, u, m * Fe, hp->swiglu_alpha, hp->swiglu_limit);
        else {
            pi_tensor gt = f32_2d(g, Fe, m), ut = f32_2d(u, Fe, m);
            TRY(OP(e, glu, hp->ffn_act, PI_FFN_PAR, &gt, &ut));      /* u = silu(g) * u */
        }
        if (e->imatrix) TRY(pi_imatrix_observe_expert(e->imatrix, &L->ffn_down_exps, ex, u, m));
        TRY(pi_scratch_product(ctx, e, &de, u, d, m));
        add_rows(&L->ffn_down_exps_b, ex, d, E, m);
        const float *s = L->ffn_down_exps_s.data;   /* the expert's output scale (gemma4) */
        for (int64_t i = 0; i < m; i++) {
            const int64_t t = rows[i] / K;
            const float w = s ? wsel[rows[i]] * s[ex] : wsel[rows[i]];
            float *o = acc + t * E;
            const float *di = d + i * E;
            for (int64_t j = 0; j < E; j++) o[j] += w * di[j];
        }
    }
    if (hp->n_ff_shexp > 0) {   /* the shared expert, every token, after the routed ones */
        const int64_t Fs = hp->n_ff_shexp;
        TRY(pi_scratch_product(ctx, e, &L->ffn_gate_shexp, in, g, T));
        TRY(pi_scratch_product(ctx, e, &L->ffn_up_shexp, in, u, T));
        pi_tensor gt = f32_2d(g, Fs, T), ut = f32_2d(u, Fs, T);
        TRY(OP(e, glu, PI_ACT_SILU, PI_FFN_PAR, &gt, &ut));
        TRY(pi_scratch_product(ctx, e, &L->ffn_down_shexp, u, d, T));
        const float *gs = L->ffn_gate_inp_shexp.data;
        for (int64_t t = 0; t < T; t++) {
            float s = 1.0f;
            if (gs) {
                double z = 0.0;
                for (int64_t j = 0; j < E; j++) z += (double)gs[j] * in[t * E + j];
                s = 1.0f / (1.0f + expf(-(float)z));
            }
            for (int64_t j = 0; j < E; j++) acc[t * E + j] += s * d[t * E + j];
        }
    }
    memcpy(out, acc, (size_t)(T * E) * sizeof(float));
    return PI_OK;
}

void pi_moe_release(pi_context *ctx) {
    free(ctx->moe);
    free(ctx->moe_conv);
    ctx->moe = NULL;
    ctx->moe_conv = NULL;
    ctx->moe_n = 0;
    ctx->moe_conv_bytes = 0;
}
