/* gdn.c: the gated delta net layers of qwen35 / qwen35moe / qwen3next (llama.cpp's delta-net graphs), and the output
 * gate of their full-attention layers.
 *
 * A gated delta net layer over the normed input x of a batch (powerinfer.h, pi_hparams.ssm_*):
 *   qkv = attn_qkv x, z = attn_gate x, b/a = ssm_beta x / ssm_alpha x (or ssm_ba x)   all tokens at once
 *   per sequence of the batch, its tokens in order, from its recurrent state (recurrent.h):
 *       c = silu(conv(qkv) over [conv state; qkv])          pi_op_ssm_conv (the state: the last d_conv - 1 rows)
 *       q, k = l2_norm per head of c's first 2 H_k S values, v = the rest
 *       beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a
 *       o = the gated delta rule over (q, k, v, g, beta)    pi_op_gated_delta_net (the state: H_v [S, S])
 *   y = ssm_out (rms_norm(o per head) * ssm_norm * silu(z))
 * The recurrence runs token by token (exact: no chunked form); it keeps each state row in L1 over all the tokens of a
 * call (a row j of S_h^T evolves by itself: it is scaled by e^g, gives d_j, takes d_j k and gives o_j). exp / log are
 * libm's, the dots and axpys the f32 kernels (the same bits at every level). */
#include "gdn.h"
#include "recurrent.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr) do { pi_status st_ = (expr); if (st_ != PI_OK) return st_; } while (0)

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf_(float x) { return x / (1.0f + expf(-x)); }
static inline float softplusf_(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }   /* ggml's threshold */

pi_status pi_gdn_check_hparams(const pi_hparams *hp) {
    if (hp->attn_output_gate < 0 || hp->attn_output_gate > 1 || hp->ssm_head_interleave < 0 ||
        hp->ssm_head_interleave > 1)
        return pi_fail(PI_ERR_BAD_MODEL, "attn_output_gate = %d, ssm_head_interleave = %d: 0 or 1",
                       hp->attn_output_gate, hp->ssm_head_interleave);
    if (hp->ssm_d_state == 0 && hp->ssm_d_conv == 0 && hp->ssm_dt_rank == 0 && hp->ssm_n_group == 0 &&
        hp->ssm_d_inner == 0)
        return PI_OK;
    const int64_t S = hp->ssm_d_state;
    if (S <= 0 || S > 4096 || hp->ssm_d_conv < 1 || hp->ssm_d_conv > 64 || hp->ssm_n_group <= 0 ||
        hp->ssm_dt_rank <= 0 || hp->ssm_dt_rank % hp->ssm_n_group || hp->ssm_dt_rank > 4096 ||
        hp->ssm_d_inner != hp->ssm_dt_rank * S)
        return pi_fail(PI_ERR_BAD_MODEL, "gated delta net: ssm_d_state %d (1..4096), ssm_d_conv %d (1..64), "
                       "ssm_n_group %d dividing ssm_dt_rank %d, ssm_d_inner %d = ssm_dt_rank * ssm_d_state",
                       hp->ssm_d_state, hp->ssm_d_conv, hp->ssm_n_group, hp->ssm_dt_rank, hp->ssm_d_inner);
    if (hp->sparse || hp->gate_sparse || hp->mla_kv_rank > 0 || hp->parallel_block || hp->arch == PI_ARCH_FALCON)
        return pi_fail(PI_ERR_UNSUPPORTED, "gated delta net layers with sparse files, MLA or parallel blocks");
    return PI_OK;
}

/* blk.il.suffix of shape [ne0, ne1] (ne1 0: 1-d); f32: must be f32; optional: absent leaves it zero */
static pi_status get(const pi_model_desc *desc, int32_t il, const char *suffix, int64_t ne0, int64_t ne1, bool f32,
                     bool optional, pi_tensor *out) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    memset(out, 0, sizeof *out);
    const pi_tensor_desc *d = pi_find_tensor(desc, name);
    if (!d) return optional ? PI_OK : pi_fail(PI_ERR_BAD_MODEL, "missing tensor '%s'", name);
    if (f32 && d->type != PI_TYPE_F32)
        return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s' must be f32, got %s", name, pi_type_name(d->type));
    return pi_tensor_desc_view(d, ne1 ? 2 : 1, (int64_t[]){ ne0, ne1 }, out);
}

pi_status pi_gdn_load(const pi_model_desc *desc, const pi_hparams *hp, int32_t il, pi_layer *L) {
    const int64_t E = hp->n_embd, S = hp->ssm_d_state, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank;
    const int64_t C = 2 * Hk * S + Hv * S;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ssm_in.weight", il);
    if (pi_find_tensor(desc, name))
        return pi_fail(PI_ERR_UNSUPPORTED, "'%s': the fused in_proj_qkvz of early qwen3next conversions is not "
                       "supported (convert the model again: attn_qkv + attn_gate)", name);
    TRY(get(desc, il, "attn_qkv.weight", E, C, false, false, &L->ssm_qkv));
    TRY(get(desc, il, "attn_gate.weight", E, Hv * S, false, false, &L->ssm_z));
    TRY(get(desc, il, "ssm_ba.weight", E, 2 * Hv, false, true, &L->ssm_ba));
    if (!L->ssm_ba.data) {
        TRY(get(desc, il, "ssm_beta.weight", E, Hv, false, false, &L->ssm_beta));
        TRY(get(desc, il, "ssm_alpha.weight", E, Hv, false, false, &L->ssm_alpha));
    }
    TRY(get(desc, il, "ssm_conv1d.weight", hp->ssm_d_conv, C, true, false, &L->ssm_conv1d));
    TRY(get(desc, il, "ssm_dt.bias", Hv, 0, true, false, &L->ssm_dt));
    TRY(get(desc, il, "ssm_a", Hv, 0, true, false, &L->ssm_a));
    TRY(get(desc, il, "ssm_norm.weight", S, 0, true, false, &L->ssm_norm));
    TRY(get(desc, il, "ssm_out.weight", Hv * S, E, false, false, &L->ssm_out));
    return PI_OK;
}

/* ---- the ops ---- */

pi_status pi_op_ssm_conv(const float *x, int64_t T, int64_t C, int64_t K, const float *w, float *state, float *out) {
    if (!x || !w || !out || T < 1 || C < 1 || K < 1)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_op_ssm_conv: NULL argument or empty shape");
    const int64_t R = K - 1;   /* state rows (state NULL: zeros, nothing kept) */
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) {
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                const int64_t r = t + k;   /* row of [state; x] */
                const float v = r < R ? (state ? state[r * C + c] : 0.0f) : x[(r - R) * C + c];
                sum += v * w[c * K + k];
            }
            out[t * C + c] = sum;
        }
    if (state && R > 0) {   /* the last R rows of [state; x] */
        if (T >= R) memcpy(state, x + (T - R) * C, (size_t)(R * C) * sizeof(float));
        else {
            memmove(state, state + T * C, (size_t)((R - T) * C) * sizeof(float));
            memcpy(state + (R - T) * C, x, (size_t)(T * C) * sizeof(float));
        }
    }
    return PI_OK;
}

typedef struct {
    const float *q, *k, *v, *g, *beta;   /* token t's rows at t * ldq / ldk / ldv (heads S apart); e^g, beta [T][H_v] */
    int64_t ldq, ldk, ldv, T, H_k, H_v, S;
    int32_t interleave;
    const float *s_in;   /* [H_v][S][S] */
    float *s_out, *out;  /* out: [T][H_v][S] */
    int64_t n_units, rows_per_unit;
} gdn_task;

/* Units of (head, block of rows): rows_per_unit rows j of head h over all T tokens (pi_cpu()->gdn_rows); g holds
 * e^g here (exp taken once per token and head by the caller). */
static void gdn_run(void *arg, int ith, int nth) {
    const gdn_task *a = arg;
    const int64_t S = a->S, rf = a->H_v / a->H_k, per_head = (S + a->rows_per_unit - 1) / a->rows_per_unit;
    const float scale = 1.0f / sqrtf((float)S);
    for (int64_t u = ith; u < a->n_units; u += nth) {
        const int64_t h = u / per_head, j0 = (u % per_head) * a->rows_per_unit;
        const int64_t hk = a->interleave ? h / rf : h % a->H_k;
        pi_cpu()->gdn_rows(S, a->T, j0, PI_MIN(S, j0 + a->rows_per_unit), a->s_in + h * S * S, a->s_out + h * S * S,
                           a->k + hk * S, a->ldk, a->q + hk * S, a->ldq, a->v + h * S, a->ldv, a->g + h, a->beta + h,
                           a->H_v, scale, a->out + h * S, a->H_v * S);
    }
}

static pi_status gated_delta_net(pi_threadpool *pool, const gdn_task *task) {
    gdn_task a = *task;
    const int n_threads = pool ? pi_threadpool_capacity(pool) : 1;
    /* enough units for the threads (heads split into row blocks), rows of a block a multiple of 8 */
    int64_t rows = a.S;
    while (rows > 8 && a.H_v * ((a.S + rows - 1) / rows) < 4 * n_threads) rows = (rows + 1) / 2;
    a.rows_per_unit = rows;
    a.n_units = a.H_v * ((a.S + rows - 1) / rows);
    if (pool) pi_threadpool_run(pool, gdn_run, &a);
    else gdn_run(&a, 0, 1);
    return PI_OK;
}

pi_status pi_op_gated_delta_net(pi_threadpool *pool, const float *q, const float *k, const float *v, const float *g,
                                const float *beta, int64_t T, int64_t H_k, int64_t H_v, int64_t S, int32_t interleave,
                                float *state, float *out) {
    if (!q || !k || !v || !g || !beta || !state || !out)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_op_gated_delta_net: NULL argument");
    if (T < 1 || H_k < 1 || H_v < 1 || H_v % H_k || S < 1 || interleave < 0 || interleave > 1)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_op_gated_delta_net: T %lld, H_k %lld dividing H_v %lld, S %lld must be "
                       ">= 1, interleave 0 or 1", (long long)T, (long long)H_k, (long long)H_v, (long long)S);
    float *eg = malloc((size_t)(T * H_v) * sizeof(float));
    if (!eg) return pi_fail(PI_ERR_OUT_OF_MEMORY, "pi_op_gated_delta_net: out of memory");
    for (int64_t i = 0; i < T * H_v; i++) eg[i] = expf(g[i]);
    const gdn_task a = { .q = q, .k = k, .v = v, .g = eg, .beta = beta, .ldq = H_k * S, .ldk = H_k * S,
                         .ldv = H_v * S, .T = T, .H_k = H_k, .H_v = H_v, .S = S, .interleave = interleave,
                         .s_in = state, .s_out = state, .out = out };
    const pi_status st = gated_delta_net(pool, &a);
    free(eg);
    return st;
}

/* ---- the layer ---- */

static float *scratch(pi_context *ctx, int64_t n) {
    if (ctx->gdn_n < n) {
        float *p = realloc(ctx->gdn, (size_t)n * sizeof(float));
        if (!p) { pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the gated delta net's scratch"); return NULL; }
        ctx->gdn = p;
        ctx->gdn_n = n;
    }
    return ctx->gdn;
}

/* x [n] /= sqrt(sum x^2 + eps), as ggml's rms_norm(x, eps / n) / sqrt(n) */
static void l2_norm(float *x, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    const float s = 1.0f / sqrtf((float)(sum / (double)n) + eps / (float)n) / sqrtf((float)n);
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

pi_status pi_gdn_layer(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, const pi_batch *b) {
    const pi_hparams *hp = &ctx->model->hp;
    pi_rs *rs = ctx->rs;
    const int64_t T = b->n_tokens, S = hp->ssm_d_state, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank;
    const int64_t C = 2 * Hk * S + Hv * S, Vd = Hv * S, K = hp->ssm_d_conv;
    /* scratch: qkv [T][C], z [T][Vd], ba [T][2 Hv], xs, cs [T][C] (a sequence's rows), gb [2][T][Hv], os [T][Vd],
     * o [T][Vd] */
    float *base = scratch(ctx, T * (4 * C + 3 * Vd + 4 * Hv) + T);
    if (!base) return PI_ERR_OUT_OF_MEMORY;
    float *qkv = base, *z = qkv + T * C, *ba = z + T * Vd, *xs = ba + 2 * T * Hv, *cs = xs + T * C;
    float *gs = cs + T * C, *bs = gs + T * Hv, *os = bs + T * Hv, *o = os + T * Vd;
    int32_t *ids = (int32_t *)(o + T * Vd);   /* [T] a sequence's batch rows (T floats' room) */
    float *x = e->buf.cur;
    TRY(pi_scratch_product(ctx, &ctx->cpu, &L->ssm_qkv, x, qkv, T));
    TRY(pi_scratch_product(ctx, &ctx->cpu, &L->ssm_z, x, z, T));
    if (L->ssm_ba.data) TRY(pi_scratch_product(ctx, &ctx->cpu, &L->ssm_ba, x, ba, T));
    else {
        TRY(pi_scratch_product(ctx, &ctx->cpu, &L->ssm_beta, x, ba, T));           /* b: [T][Hv] */
        TRY(pi_scratch_product(ctx, &ctx->cpu, &L->ssm_alpha, x, ba + T * Hv, T));  /* a: [T][Hv] */
    }
    const float *dt = L->ssm_dt.data, *A = L->ssm_a.data, *w = L->ssm_conv1d.data;
    const int64_t rf = Hv / Hk;
    uint64_t done = 0;
    for (int64_t t0 = 0; t0 < T; t0++) {
        const int32_t seq = b->seq_id[t0];
        if (done >> seq & 1) continue;
        done |= (uint64_t)1 << seq;
        int64_t n = 0;
        for (int64_t t = t0; t < T; t++)
            if (b->seq_id[t] == seq) ids[n++] = (int32_t)t;
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = ids[i];
            memcpy(xs + i * C, qkv + t * C, (size_t)C * sizeof(float));
            for (int64_t h = 0; h < Hv; h++) {
                float bv, av;
                if (L->ssm_ba.data) {   /* per key head: its rf b values, then its rf a values */
                    const int64_t kh = h / rf, r = h % rf;
                    bv = ba[t * 2 * Hv + kh * 2 * rf + r];
                    av = ba[t * 2 * Hv + kh * 2 * rf + rf + r];
                } else {
                    bv = ba[t * Hv + h];
                    av = ba[T * Hv + t * Hv + h];
                }
                bs[i * Hv + h] = sigmoidf_(bv);
                gs[i * Hv + h] = expf(softplusf_(av + dt[h]) * A[h]);   /* the decay e^g */
            }
        }
        /* the conv, from the current state into the next copy */
        float *conv_next = pi_rs_conv(rs, il, seq, true);
        if (K > 1) memcpy(conv_next, pi_rs_conv(rs, il, seq, false), (size_t)((K - 1) * C) * sizeof(float));
        TRY(pi_op_ssm_conv(xs, n, C, K, w, conv_next, cs));
        for (int64_t i = 0; i < n * C; i++) cs[i] = siluf_(cs[i]);
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < 2 * Hk; h++) l2_norm(cs + i * C + h * S, S, hp->norm_eps);
        const gdn_task task = { .q = cs, .k = cs + Hk * S, .v = cs + 2 * Hk * S, .g = gs, .beta = bs, .ldq = C,
                                .ldk = C, .ldv = C, .T = n, .H_k = Hk, .H_v = Hv, .S = S,
                                .interleave = hp->ssm_head_interleave, .s_in = pi_rs_mat(rs, il, seq, false),
                                .s_out = pi_rs_mat(rs, il, seq, true), .out = os };
        TRY(gated_delta_net(ctx->pool, &task));
        for (int64_t i = 0; i < n; i++) memcpy(o + ids[i] * Vd, os + i * Vd, (size_t)Vd * sizeof(float));
    }
    /* rms_norm per head * ssm_norm * silu(z), then ssm_out */
    pi_tensor ot = pi_tensor_view(PI_TYPE_F32, o, 2, (int64_t[]){ S, Hv * T });
    TRY(e->be->i->rms_norm(e->be, &ot, &L->ssm_norm, hp->norm_eps, &ot));
    for (int64_t i = 0; i < T * Vd; i++) o[i] *= siluf_(z[i]);
    return pi_scratch_product(ctx, &ctx->cpu, &L->ssm_out, o, e->buf.cur, T);
}

/* ---- the full-attention layers' output gate ---- */

pi_status pi_gdn_gated_q(pi_context *ctx, pi_exec *e, const pi_tensor *wq, const float *x, float *q, int64_t hd,
                         int64_t T) {
    (void)e;
    const int64_t Eq2 = wq->ne[1], H = Eq2 / (2 * hd);
    float *qg = scratch(ctx, 2 * T * Eq2);
    if (!qg) return PI_ERR_OUT_OF_MEMORY;
    TRY(pi_scratch_product(ctx, &ctx->cpu, wq, x, qg, T));
    float *gate = qg + T * Eq2;   /* [T][H hd] */
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            memcpy(q + (t * H + h) * hd, qg + t * Eq2 + 2 * h * hd, (size_t)hd * sizeof(float));
            memcpy(gate + (t * H + h) * hd, qg + t * Eq2 + (2 * h + 1) * hd, (size_t)hd * sizeof(float));
        }
    return PI_OK;
}

pi_status pi_gdn_apply_gate(pi_context *ctx, float *att, int64_t hd, int64_t T) {
    const int64_t Eq = hd * ctx->model->hp.n_head;
    const float *gate = ctx->gdn + T * 2 * Eq;
    for (int64_t i = 0; i < T * Eq; i++) att[i] *= sigmoidf_(gate[i]);
    return PI_OK;
}
