/* moe.c: the mixture-of-experts FFN (Mixtral, Qwen3-MoE), llama.cpp's build_moe_ffn with a softmax router and norm_w:
 * per token the router's logits l = gate_inp x, p = softmax(l), the n_expert_used largest p (ties: the lower expert),
 * weights w = p / (sum of the chosen p) (times expert_weights_scale where it is not 0), and
 * y = sum over the chosen e of w_e down_e (silu(gate_e x) * (up_e x)). Each expert runs once per call over the tokens
 * routed to it (their rows gathered), through mul_mat, so a token's row does not depend on the batch. CPU only. */
#include "moe.h"

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

static pi_status product(pi_context *ctx, pi_exec *e, const pi_tensor *w, float *x, float *y, int64_t T) {
    pi_tensor xt = f32_2d(x, w->ne[0], T), yt = f32_2d(y, w->ne[1], T);
    return pi_mul_mat_grow(e->be->pool, w, &xt, &yt, &ctx->moe_conv, &ctx->moe_conv_bytes);
}

pi_status pi_moe_ffn(pi_context *ctx, pi_exec *e, const pi_layer *L, float *in, float *out, int64_t T) {
    const pi_hparams *hp = &ctx->model->hp;
    if (e != &ctx->cpu) return pi_fail(PI_ERR_UNSUPPORTED, "mixture-of-experts layers run on the CPU only");
    const int64_t E = hp->n_embd, F = hp->n_ff, NE = hp->n_expert, K = hp->n_expert_used;
    /* scratch: logits [T][NE], chosen [T][K] (expert, weight), gathered x [T][E], g and u [T][F], d [T][E], acc [T][E] */
    const int64_t need = T * NE + 2 * T * K + 3 * T * E + 2 * T * F;
    if (need > ctx->moe_n) {
        float *p = realloc(ctx->moe, (size_t)need * sizeof(float));
        if (!p) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the experts of %lld tokens", (long long)T);
        ctx->moe = p;
        ctx->moe_n = need;
    }
    float *logits = ctx->moe, *wsel = logits + T * NE, *xg = wsel + 2 * T * K, *g = xg + T * E, *u = g + T * F,
          *d = u + T * F, *acc = d + T * E;
    int32_t *esel = (int32_t *)(wsel + T * K);
    TRY(product(ctx, e, &L->ffn_gate_inp, in, logits, T));
    for (int64_t t = 0; t < T; t++) {   /* top-K of the softmax, renormalized over the chosen */
        const float *l = logits + t * NE;
        float mx = l[0];
        for (int64_t i = 1; i < NE; i++) mx = fmaxf(mx, l[i]);
        int32_t *es = esel + t * K;
        float *ws = wsel + t * K, sum = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            int32_t best = -1;
            for (int32_t i = 0; i < NE; i++) {
                bool taken = false;
                for (int64_t j = 0; j < k; j++) taken |= es[j] == i;
                if (!taken && (best < 0 || l[i] > l[best])) best = i;
            }
            es[k] = best;
            ws[k] = expf(l[best] - mx);   /* the softmax's denominator cancels in the renormalization */
            sum += ws[k];
        }
        const float scale = hp->expert_weights_scale != 0.0f ? hp->expert_weights_scale : 1.0f;
        for (int64_t k = 0; k < K; k++) ws[k] = ws[k] / sum * scale;
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
        TRY(product(ctx, e, &ge, xg, g, m));
        TRY(product(ctx, e, &ue, xg, u, m));
        pi_tensor gt = f32_2d(g, F, m), ut = f32_2d(u, F, m);
        TRY(OP(e, glu, hp->ffn_act, PI_FFN_PAR, &gt, &ut));      /* u = silu(g) * u */
        TRY(product(ctx, e, &de, u, d, m));
        for (int64_t i = 0; i < m; i++) {
            const int64_t t = rows[i] / K;
            const float w = wsel[rows[i]];
            float *o = acc + t * E;
            const float *di = d + i * E;
            for (int64_t j = 0; j < E; j++) o[j] += w * di[j];
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
