/* shortconv.c: LFM2's short conv layers (llama.cpp's llama_model_lfm2 shortconv block).
 *
 * Over the normed input x of a batch (E = n_embd, K = ssm_d_conv, the file's shortconv.l_cache):
 *   bcx = in_proj x                      [T][3E], split into b, c, x (E each, in that order)   all tokens at once
 *   bx = b * x
 *   per sequence of the batch, its tokens in order, from its recurrent state (recurrent.h: the last K - 1 rows of
 *   bx, no matrix part):
 *       conv = the causal depthwise conv of [state; bx] with shortconv.conv [K, E]   pi_op_ssm_conv
 *   y = out_proj (c * conv)
 * No activation anywhere; the products are the matmul kernels', the rest f32 element-wise (every level the same
 * bits). */
#include "shortconv.h"
#include "recurrent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr) do { pi_status st_ = (expr); if (st_ != PI_OK) return st_; } while (0)

pi_status pi_shortconv_check_hparams(const pi_hparams *hp) {
    if (hp->shortconv == 0) return PI_OK;
    if (hp->shortconv != 1 || hp->ssm_d_conv < 2 || hp->ssm_d_conv > 64 || hp->ssm_d_state || hp->ssm_d_inner ||
        hp->ssm_dt_rank || hp->ssm_n_group || hp->attn_output_gate)
        return pi_fail(PI_ERR_BAD_MODEL, "short conv layers: shortconv = %d (0 or 1), ssm_d_conv %d (2..64), the "
                       "gated delta net's ssm_* and attn_output_gate 0", hp->shortconv, hp->ssm_d_conv);
    if (hp->sparse || hp->gate_sparse || hp->mla_kv_rank > 0 || hp->parallel_block || hp->arch == PI_ARCH_FALCON)
        return pi_fail(PI_ERR_UNSUPPORTED, "short conv layers with sparse files, MLA or parallel blocks");
    return PI_OK;
}

static pi_status get(const pi_model_desc *desc, int32_t il, const char *suffix, int64_t ne0, int64_t ne1, bool f32,
                     pi_tensor *out) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    memset(out, 0, sizeof *out);
    const pi_tensor_desc *d = pi_find_tensor(desc, name);
    if (!d) return pi_fail(PI_ERR_BAD_MODEL, "missing tensor '%s'", name);
    if (f32 && d->type != PI_TYPE_F32)
        return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s' must be f32, got %s", name, pi_type_name(d->type));
    return pi_tensor_desc_view(d, 2, (int64_t[]){ ne0, ne1 }, out);
}

pi_status pi_shortconv_load(const pi_model_desc *desc, const pi_hparams *hp, int32_t il, pi_layer *L) {
    const int64_t E = hp->n_embd;
    TRY(get(desc, il, "shortconv.in_proj.weight", E, 3 * E, false, &L->ssm_qkv));
    TRY(get(desc, il, "shortconv.conv.weight", hp->ssm_d_conv, E, true, &L->ssm_conv1d));
    TRY(get(desc, il, "shortconv.out_proj.weight", E, E, false, &L->ssm_out));
    return PI_OK;
}

pi_status pi_shortconv_layer(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, const pi_batch *b) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_rs *rs = ctx->rs;
    const int64_t T = b->n_tokens, E = hp->n_embd, K = hp->ssm_d_conv;
    /* scratch (the gated delta nets' buffer: a model has one kind): bcx [T][3E], xs, cs [T][E], ids [T] */
    const int64_t need = T * 5 * E + T;
    if (ctx->gdn_n < need) {
        float *p = realloc(ctx->gdn, (size_t)need * sizeof(float));
        if (!p) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the short conv's scratch");
        ctx->gdn = p;
        ctx->gdn_n = need;
    }
    float *bcx = ctx->gdn, *xs = bcx + T * 3 * E, *cs = xs + T * E;
    int32_t *ids = (int32_t *)(cs + T * E);
    float *y = e->buf.cur;
    TRY(pi_scratch_product(ctx, &ctx->cpu, &L->ssm_qkv, y, bcx, T));
    for (int64_t t = 0; t < T; t++) {   /* bx into the x part of bcx */
        const float *bt = bcx + t * 3 * E;
        float *xt = bcx + t * 3 * E + 2 * E;
        for (int64_t i = 0; i < E; i++) xt[i] *= bt[i];
    }
    const float *w = L->ssm_conv1d.data;
    for (int32_t seq = 0; seq < rs->n_seq; seq++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            if (b->seq_id[t] == seq) ids[n++] = (int32_t)t;
        if (n == 0) continue;
        for (int64_t i = 0; i < n; i++) memcpy(xs + i * E, bcx + ids[i] * 3 * E + 2 * E, (size_t)E * sizeof(float));
        float *conv_next = pi_rs_conv(rs, il, seq, true);
        memcpy(conv_next, pi_rs_conv(rs, il, seq, false), (size_t)((K - 1) * E) * sizeof(float));
        TRY(pi_op_ssm_conv(xs, n, E, K, w, conv_next, cs));
        for (int64_t i = 0; i < n; i++) {   /* y = c * conv, into xs's row of the token (c stays in bcx) */
            const float *c = bcx + ids[i] * 3 * E + E;
            float *o = bcx + ids[i] * 3 * E + 2 * E;
            for (int64_t j = 0; j < E; j++) o[j] = c[j] * cs[i * E + j];
        }
    }
    for (int64_t t = 0; t < T; t++) memcpy(xs + t * E, bcx + t * 3 * E + 2 * E, (size_t)E * sizeof(float));
    return pi_scratch_product(ctx, &ctx->cpu, &L->ssm_out, xs, y, T);
}
