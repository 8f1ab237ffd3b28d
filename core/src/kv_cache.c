/* kv_cache.c: cell bookkeeping for the KV cache and the public seq operations. */
#include "kv_cache.h"
#include "context.h"

#include <stdlib.h>
#include <string.h>

pi_status pi_kv_init(pi_kv_cache *kv, int32_t n_ctx, int32_t n_layer, int64_t n_embd_kv, int32_t type) {
    memset(kv, 0, sizeof *kv);
    kv->n_ctx = n_ctx;
    kv->n_layer = n_layer;
    kv->type = type;
    kv->n_embd_kv = n_embd_kv;
    kv->row_bytes = pi_row_bytes(type, n_embd_kv);
    const uint64_t bytes = (uint64_t)n_layer * (uint64_t)n_ctx * (uint64_t)kv->row_bytes;
    if (bytes / (uint64_t)kv->row_bytes / (uint64_t)n_ctx != (uint64_t)n_layer || bytes > ((uint64_t)1 << 46))
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "KV cache of %d cells is too large", n_ctx);
    kv->cells = malloc((size_t)n_ctx * sizeof *kv->cells);
    kv->k = malloc((size_t)bytes);
    kv->v = malloc((size_t)bytes);
    if (!kv->cells || !kv->k || !kv->v) {
        pi_kv_release(kv);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for a KV cache of %d cells (%.1f MiB)", n_ctx,
                       2.0 * (double)bytes / (1 << 20));
    }
    for (int32_t i = 0; i < n_ctx; i++) kv->cells[i] = (pi_kv_cell){ -1, 0 };
    return PI_OK;
}

void pi_kv_release(pi_kv_cache *kv) {
    free(kv->cells);
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

pi_status pi_kv_claim(pi_kv_cache *kv, int32_t n, const int32_t *pos, const int32_t *seq, int32_t *cells) {
    int32_t found = 0;
    for (int32_t c = 0; c < kv->n_ctx && found < n; c++)
        if (kv->cells[c].seqs == 0) cells[found++] = c;
    if (found < n)
        return pi_fail(PI_ERR_KV_FULL, "KV cache full: %d tokens do not fit in the %d free of %d cells "
                       "(raise the context size or remove sequences)", n, found, kv->n_ctx);
    for (int32_t i = 0; i < n; i++) kv->cells[cells[i]] = (pi_kv_cell){ pos[i], (uint64_t)1 << seq[i] };
    return PI_OK;
}

void pi_kv_unclaim(pi_kv_cache *kv, int32_t n, const int32_t *cells) {
    for (int32_t i = 0; i < n; i++) kv->cells[cells[i]] = (pi_kv_cell){ -1, 0 };
}

int32_t pi_kv_span(const pi_kv_cache *kv) {
    int32_t n = kv->n_ctx;
    while (n > 0 && kv->cells[n - 1].seqs == 0) n--;
    return n;
}

/* ---- public API ---- */

static pi_status check_seq(const pi_context *ctx, int32_t seq, bool allow_all) {
    if (!ctx) return pi_fail(PI_ERR_INVALID_ARG, "context is NULL");
    if ((seq < 0 && !allow_all) || seq >= ctx->params.n_seq_max)
        return pi_fail(PI_ERR_INVALID_ARG, "sequence id %d is out of range [0, %d)", seq, ctx->params.n_seq_max);
    return PI_OK;
}

static inline bool in_range(int32_t pos, int32_t p0, int32_t p1) { return pos >= p0 && (p1 < 0 || pos < p1); }

pi_status pi_kv_seq_rm(pi_context *ctx, int32_t seq, int32_t p0, int32_t p1) {
    pi_status st = check_seq(ctx, seq, true);
    if (st != PI_OK) return st;
    pi_kv_cache *kv = &ctx->kv;
    const uint64_t mask = seq < 0 ? ~(uint64_t)0 : (uint64_t)1 << seq;
    for (int32_t c = 0; c < kv->n_ctx; c++) {
        if (!(kv->cells[c].seqs & mask) || !in_range(kv->cells[c].pos, p0 < 0 ? 0 : p0, p1)) continue;
        kv->cells[c].seqs &= ~mask;
        if (kv->cells[c].seqs == 0) kv->cells[c].pos = -1;
    }
    return PI_OK;
}

pi_status pi_kv_seq_cp(pi_context *ctx, int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    pi_status st = check_seq(ctx, src, false);
    if (st == PI_OK) st = check_seq(ctx, dst, false);
    if (st != PI_OK) return st;
    pi_kv_cache *kv = &ctx->kv;
    for (int32_t c = 0; c < kv->n_ctx; c++)
        if ((kv->cells[c].seqs >> src & 1) && in_range(kv->cells[c].pos, p0 < 0 ? 0 : p0, p1))
            kv->cells[c].seqs |= (uint64_t)1 << dst;
    return PI_OK;
}

void pi_kv_clear(pi_context *ctx) {
    if (ctx) pi_kv_seq_rm(ctx, -1, 0, -1);
}

int32_t pi_kv_seq_pos_max(pi_context *ctx, int32_t seq) {
    if (check_seq(ctx, seq, false) != PI_OK) return -1;
    int32_t max = -1;
    for (int32_t c = 0; c < ctx->kv.n_ctx; c++)
        if (ctx->kv.cells[c].seqs >> seq & 1) max = PI_MAX(max, ctx->kv.cells[c].pos);
    return max;
}

int32_t pi_kv_used_cells(pi_context *ctx) {
    if (!ctx) return 0;
    int32_t n = 0;
    for (int32_t c = 0; c < ctx->kv.n_ctx; c++) n += ctx->kv.cells[c].seqs != 0;
    return n;
}
