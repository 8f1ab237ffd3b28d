/* imatrix.c: importance-matrix collection (llama.cpp's tools/imatrix: IMatrixCollector::collect_imatrix).
 *
 * pi_imatrix_begin registers the context's weight matrices by the address of their pi_tensor (the layer structs the
 * forward pass reads, so a lookup is a pointer compare) under their GGUF names. The forward pass calls
 * pi_imatrix_observe before a weight matmul when ctx->cpu.imatrix is set (one pointer test when it is not). Per matrix
 * the observer keeps sums[n_mat][n_cols] (float, summed in token order as llama.cpp sums them) of x_j^2 over the rows
 * x it saw, and counts[n_mat] of those rows; the experts of a 3-D tensor each have their row and count.
 *
 * What is collected: the attention matrices (attn_q/k/v/output, attn_qkv, the MLA attn_q_a/attn_q_b/attn_kv_a_mqa,
 * a gated delta net layer's attn_qkv / attn_gate / ssm_beta / ssm_alpha / ssm_ba / ssm_out, LFM2's shortconv.in_proj /
 * out_proj),
 * the dense FFN (ffn_gate/up/down), the router (ffn_gate_inp), the experts (ffn_{gate,up,down}_exps, per expert) and
 * the shared expert, gemma's per-layer inp_gate/proj, and output.weight with PI_IMATRIX_OUTPUT (not a tied output,
 * which is token_embd: llama-imatrix skips it too). Not: the MLA per-head attn_k_b / attn_v_b (run as views), the
 * FFN of sparse (PowerInfer) and gate-sparse files (their neuron-sparse kernels are not matmuls over whole rows), the
 * input-sparse attention matmuls. CPU contexts only. */
#include "imatrix.h"

#include "context.h"
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr) do { pi_status st_ = (expr); if (st_ != PI_OK) return st_; } while (0)

typedef struct {
    const pi_tensor *w;
    char             name[96];
    int64_t          n_cols, n_mat;
    float           *sums;     /* [n_mat][n_cols] */
    int64_t         *counts;   /* [n_mat] */
} im_entry;

struct pi_imatrix {
    im_entry *e;
    int32_t           n, cap;
    int32_t           last;    /* the entry found last (the next lookup starts there) */
};

static pi_status add(pi_imatrix *im, const pi_tensor *w, const char *name) {
    if (!w->data || w->n_dims < 2) return PI_OK;
    for (int32_t i = 0; i < im->n; i++)
        if (im->e[i].w == w) return PI_OK;
    if (im->n == im->cap) {
        const int32_t cap = im->cap ? 2 * im->cap : 64;
        im_entry *p = realloc(im->e, (size_t)cap * sizeof *p);
        if (!p) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the importance matrix");
        im->e = p;
        im->cap = cap;
    }
    im_entry *e = &im->e[im->n];
    memset(e, 0, sizeof *e);
    e->w = w;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->n_cols = w->ne[0];
    e->n_mat = w->n_dims >= 3 ? w->ne[2] : 1;
    e->sums = calloc((size_t)(e->n_cols * e->n_mat), sizeof(float));
    e->counts = calloc((size_t)e->n_mat, sizeof(int64_t));
    if (!e->sums || !e->counts) {
        free(e->sums);
        free(e->counts);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the importance matrix");
    }
    im->n++;
    return PI_OK;
}

static void imatrix_free(pi_imatrix *im) {
    if (!im) return;
    for (int32_t i = 0; i < im->n; i++) {
        free(im->e[i].sums);
        free(im->e[i].counts);
    }
    free(im->e);
    free(im);
}

/* the attention and FFN matrices of a layer struct, with their GGUF names */
#define F(field, suffix) { offsetof(pi_layer, field), suffix }
static const struct { size_t off; const char *suffix; } ATTN[] = {
    F(wq, "attn_q"), F(wk, "attn_k"), F(wv, "attn_v"), F(wo, "attn_output"), F(wqkv, "attn_qkv"),
    F(wq_a, "attn_q_a"), F(wq_b, "attn_q_b"), F(wkv_a, "attn_kv_a_mqa"),
    F(ssm_qkv, "attn_qkv"), F(ssm_z, "attn_gate"), F(ssm_beta, "ssm_beta"), F(ssm_alpha, "ssm_alpha"),
    F(ssm_ba, "ssm_ba"), F(ssm_out, "ssm_out"),     /* gated delta net layers (gdn.c) */
}, FFN[] = {
    F(ffn_gate, "ffn_gate"), F(ffn_up, "ffn_up"), F(ffn_down, "ffn_down"), F(ffn_gate_inp, "ffn_gate_inp"),
    F(ffn_gate_exps, "ffn_gate_exps"), F(ffn_up_exps, "ffn_up_exps"), F(ffn_down_exps, "ffn_down_exps"),
    F(ffn_gate_shexp, "ffn_gate_shexp"), F(ffn_up_shexp, "ffn_up_shexp"), F(ffn_down_shexp, "ffn_down_shexp"),
    F(ple_gate, "inp_gate"), F(ple_proj, "proj"),
}, SHORTCONV[] = {
    F(ssm_qkv, "shortconv.in_proj"), F(ssm_out, "shortconv.out_proj"),
};
#undef F

static pi_status add_layer(pi_imatrix *im, const pi_layer *L, int32_t il, const void *table, size_t n) {
    const struct { size_t off; const char *suffix; } *t = table;
    char name[96];
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", (int)il, t[i].suffix);
        TRY(add(im, (const pi_tensor *)((const char *)L + t[i].off), name));
    }
    return PI_OK;
}

pi_status pi_imatrix_begin(pi_context *ctx, int32_t flags) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "pi_imatrix_begin: ctx is NULL");
    if (ctx->dev.be)
        return pi_fail(PI_ERR_UNSUPPORTED, "importance-matrix collection runs on the CPU only: this context offloads "
                       "layers to a device (use no GPU layers)");
    if (flags & ~PI_IMATRIX_OUTPUT) return pi_fail(PI_ERR_INVALID_ARG, "pi_imatrix_begin: unknown flags %d", flags);
    pi_imatrix_end(ctx);
    pi_imatrix *im = calloc(1, sizeof *im);
    if (!im) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the importance matrix");
    const pi_model *m = ctx->model;
    const bool dense_ffn = !m->hp.sparse && !m->hp.gate_sparse;
    pi_status st = PI_OK;
    for (int32_t il = 0; il < m->hp.n_layer && st == PI_OK; il++) {
        if (m->hp.shortconv)   /* LFM2's short conv layers keep in_proj / out_proj in the gated delta net's slots */
            st = add_layer(im, ctx->lx[il].attn_w, il, SHORTCONV, sizeof SHORTCONV / sizeof SHORTCONV[0]);
        if (st == PI_OK) st = add_layer(im, ctx->lx[il].attn_w, il, ATTN, sizeof ATTN / sizeof ATTN[0]);
        if (st == PI_OK && dense_ffn) st = add_layer(im, ctx->lx[il].ffn_w, il, FFN, sizeof FFN / sizeof FFN[0]);
    }
    /* output.weight: only a file's own (a tied output is token_embd's data) */
    if (st == PI_OK && (flags & PI_IMATRIX_OUTPUT) && ctx->out_w && ctx->out_w->data != m->token_embd.data)
        st = add(im, ctx->out_w, "output.weight");
    if (st != PI_OK) {
        imatrix_free(im);
        return st;
    }
    ctx->cpu.imatrix = im;
    return PI_OK;
}

void pi_imatrix_end(pi_context *ctx) {
    if (!ctx) return;
    imatrix_free(ctx->cpu.imatrix);
    ctx->cpu.imatrix = NULL;
}

int32_t pi_imatrix_n_entries(const pi_context *ctx) {
    return ctx && ctx->cpu.imatrix ? ctx->cpu.imatrix->n : 0;
}

pi_status pi_imatrix_entry(const pi_context *ctx, int32_t i, const char **name, int64_t *n_cols, int64_t *n_mat,
                           float **sums, int64_t **counts) {
    const pi_imatrix *im = ctx ? ctx->cpu.imatrix : NULL;
    if (!im) return pi_fail(PI_ERR_INVALID_ARG, "pi_imatrix_entry: the context collects no importance matrix");
    if (i < 0 || i >= im->n) return pi_fail(PI_ERR_INVALID_ARG, "pi_imatrix_entry: no entry %d (of %d)", i, im->n);
    const im_entry *e = &im->e[i];
    if (name) *name = e->name;
    if (n_cols) *n_cols = e->n_cols;
    if (n_mat) *n_mat = e->n_mat;
    if (sums) *sums = e->sums;
    if (counts) *counts = e->counts;
    return PI_OK;
}

static im_entry *find(pi_imatrix *im, const pi_tensor *w) {
    for (int32_t k = 0; k < im->n; k++) {
        const int32_t i = (im->last + k) % im->n;
        if (im->e[i].w == w) {
            im->last = (i + 1) % im->n;   /* the forward pass meets the matrices in their registration order */
            return &im->e[i];
        }
    }
    return NULL;
}

static pi_status accumulate(const im_entry *e, float *acc, const float *x, int64_t T) {
    const int64_t K = e->n_cols;
    for (int64_t t = 0; t < T; t++) {
        const float *r = x + t * K;
        for (int64_t j = 0; j < K; j++) acc[j] += r[j] * r[j];
    }
    for (int64_t j = 0; j < K; j++)
        if (!isfinite(acc[j])) return pi_fail(PI_ERR_INVALID_ARG, "importance matrix: non-finite values in %s", e->name);
    return PI_OK;
}

pi_status pi_imatrix_observe(pi_imatrix *im, const pi_tensor *w, const float *x, int64_t T) {
    if (T < 16) return PI_OK;
    im_entry *e = find(im, w);
    if (!e || e->n_mat != 1) return PI_OK;
    e->counts[0] += T;
    return accumulate(e, e->sums, x, T);
}

pi_status pi_imatrix_observe_expert(pi_imatrix *im, const pi_tensor *w, int64_t ex, const float *x, int64_t m) {
    im_entry *e = find(im, w);
    if (!e || ex < 0 || ex >= e->n_mat) return PI_OK;
    e->counts[ex] += m;
    return accumulate(e, e->sums + ex * e->n_cols, x, m);
}
