/* kv_cache.c: cell bookkeeping for the KV cache and the public seq operations. */
#include "kv_cache.h"
#include "context.h"
#include "backend.h"
#include "recurrent.h"

#include <stdlib.h>
#include <string.h>

pi_status pi_kv_type_check(int32_t type, int64_t head_dim, const char *which) {
    static const int32_t TYPES[] = { PI_TYPE_F32, PI_TYPE_F16, PI_TYPE_BF16, PI_TYPE_Q8_0, PI_TYPE_Q4_0, PI_TYPE_Q4_1,
                                     PI_TYPE_IQ4_NL, PI_TYPE_Q5_0, PI_TYPE_Q5_1 };
    bool known = false;
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) known |= TYPES[i] == type;
    if (!known)
        return pi_fail(PI_ERR_INVALID_ARG, "%s cache type %s: the KV cache is f32, f16, bf16, q8_0, q4_0, q4_1, "
                       "iq4_nl, q5_0 or q5_1", which, pi_type_name(type));
    if (type != PI_TYPE_F16 && type != PI_TYPE_F32 && head_dim > PI_ATT_PV_MAX_HD)
        return pi_fail(PI_ERR_INVALID_ARG, "%s cache type %s: heads of %lld values (at most %d for it)", which,
                       pi_type_name(type), (long long)head_dim, PI_ATT_PV_MAX_HD);
    const int64_t block = pi_traits(type)->block_size;
    if (head_dim % block != 0)
        return pi_fail(PI_ERR_INVALID_ARG, "%s cache type %s: the model's head size %lld is not a multiple of its "
                       "blocks of %lld", which, pi_type_name(type), (long long)head_dim, (long long)block);
    return PI_OK;
}

pi_status pi_kv_init(pi_kv_cache *kv, int32_t n_ctx, const pi_model *model, int32_t type_k, int32_t type_v) {
    memset(kv, 0, sizeof *kv);
    const int32_t n_layer = model->hp.n_layer;
    kv->n_ctx = n_ctx;
    kv->n_layer = n_layer;
    kv->type_k = type_k;
    kv->type_v = type_v;
    kv->layer = calloc((size_t)n_layer, sizeof *kv->layer);
    if (!kv->layer) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    uint64_t k_bytes = 0, v_bytes = 0;   /* per cell, over the layers with their own cache */
    const bool k_only = model->hp.mla_kv_rank > 0;   /* MLA: V is read from K's rows (mla_attention), not stored */
    for (int32_t il = 0; il < n_layer; il++) {
        const pi_layer_geom *g = &model->geom[il];
        pi_kv_layer *l = &kv->layer[il];
        if (g->recurrent) continue;   /* no KV cache: a recurrent state (recurrent.h); own = false, no rows */
        if (g->kv_source != il) {   /* an earlier layer's (pi_model_create checked it) */
            *l = kv->layer[g->kv_source];
            l->own = false;
            continue;
        }
        l->n_embd_kv = (int64_t)g->head_dim * g->n_head_kv;
        l->k_row_bytes = pi_row_bytes(type_k, l->n_embd_kv);
        l->v_row_bytes = k_only ? 0 : pi_row_bytes(type_v, l->n_embd_kv);
        l->k_off = (int64_t)(k_bytes * (uint64_t)n_ctx);
        l->v_off = (int64_t)(v_bytes * (uint64_t)n_ctx);
        l->own = true;
        k_bytes += (uint64_t)l->k_row_bytes;
        v_bytes += (uint64_t)l->v_row_bytes;
    }
    const uint64_t cell = k_bytes + v_bytes, bytes = (uint64_t)n_ctx * cell;
    if (bytes / cell != (uint64_t)n_ctx || bytes > ((uint64_t)1 << 46)) {
        pi_kv_release(kv);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "KV cache of %d cells is too large", n_ctx);
    }
    kv->cells = malloc((size_t)n_ctx * sizeof *kv->cells);
    kv->k = malloc((size_t)PI_MAX(k_bytes * (uint64_t)n_ctx, 1));
    kv->v = malloc((size_t)PI_MAX(v_bytes * (uint64_t)n_ctx, 1));
    if (!kv->cells || !kv->k || !kv->v) {
        pi_kv_release(kv);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for a KV cache of %d cells (%.1f MiB)", n_ctx,
                       (double)bytes / (1 << 20));
    }
    for (int32_t i = 0; i < n_ctx; i++) kv->cells[i] = (pi_kv_cell){ -1, 0 };
    return PI_OK;
}

void pi_kv_release(pi_kv_cache *kv) {
    free(kv->layer);
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
    if (ctx->rs && (st = pi_rs_seq_rm(ctx->rs, seq, p0, p1)) != PI_OK) return st;   /* the state cannot drop a tail */
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
    if (ctx->rs && (st = pi_rs_seq_cp(ctx->rs, src, dst, p0, p1)) != PI_OK) return st;
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

/* ---- a sequence's state (pi_kv_seq_state_*) ----
 * Layout, little-endian: header (magic "PIKVSEQ\2", n_layer, type_k, type_v, n_embd_kv, k_row_bytes, v_row_bytes,
 * n), the n positions (int32, ascending), then per layer with its own cache the n K rows and the n V rows (its
 * k_row_bytes and v_row_bytes each, the cache's own format). n_embd_kv and the row sizes are a layer's where every
 * layer with its own cache has the same (kv_layout); else -(their sum of n_embd_kv) and the sums of the row sizes.
 * Version 1 (one type and row size for K and V, then n) is read too. Rows are read and written through each layer's
 * backend, so layers whose KV lives on a device take part too. */
static const char STATE_MAGIC[8] = { 'P', 'I', 'K', 'V', 'S', 'E', 'Q', 2 };

typedef struct {
    char    magic[8];
    int32_t n_layer, type_k, type_v, reserved;
    int64_t n_embd_kv, k_row_bytes, v_row_bytes;
    int32_t n, reserved2;
} seq_state_header;

typedef struct {   /* version 1 */
    char    magic[8];
    int32_t n_layer, type;
    int64_t n_embd_kv, row_bytes;
    int32_t n, reserved;
} seq_state_header_v1;

static int cmp_pos_cell(const void *a, const void *b) {   /* (pos, cell) pairs by position */
    const int32_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* The header's n_embd_kv and row sizes of this cache: a layer's where every layer with its own cache has the same,
 * else -(the sum of n_embd_kv) and the sums of the row sizes; returns the K and V bytes of one cell over all layers. */
static int64_t kv_layout(const pi_kv_cache *kv, int64_t *n_embd_kv, int64_t *k_row, int64_t *v_row) {
    int64_t e = 0, k = 0, v = 0;
    bool same = true;
    const pi_kv_layer *first = NULL;
    for (int32_t il = 0; il < kv->n_layer; il++) {
        const pi_kv_layer *l = &kv->layer[il];
        if (!l->own) continue;
        if (!first) first = l;
        same &= l->n_embd_kv == first->n_embd_kv;
        e += l->n_embd_kv; k += l->k_row_bytes; v += l->v_row_bytes;
    }
    *n_embd_kv = same && first ? first->n_embd_kv : -e;
    *k_row = same && first ? first->k_row_bytes : k;
    *v_row = same && first ? first->v_row_bytes : v;
    return k + v;
}

/* A state's bytes after its header: n positions and every cached layer's n K and n V rows. */
static size_t body_bytes(const pi_kv_cache *kv, int32_t n) {
    int64_t e, k, v;
    return (size_t)n * sizeof(int32_t) + (size_t)n * (size_t)kv_layout(kv, &e, &k, &v);
}

static size_t state_bytes(const pi_kv_cache *kv, int32_t n) {
    return sizeof(seq_state_header) + body_bytes(kv, n);
}

static bool in_state(const pi_kv_cell *cell, int32_t seq, int32_t p0, int32_t p1) {
    return (cell->seqs >> seq & 1) && in_range(cell->pos, p0 < 0 ? 0 : p0, p1);
}

/* The state's rows <-> the cache: per layer the n K rows, then the n V rows, of cells[0..n), through each layer's
 * backend (to_cache: upload from buf, else download into buf). */
static pi_status copy_rows(pi_context *ctx, const int32_t *cells, int32_t n, char *buf, bool to_cache) {
    pi_status st = PI_OK;
    for (int32_t il = 0; il < ctx->kv.n_layer && st == PI_OK; il++) {
        const pi_layer_exec *lx = &ctx->lx[il];
        pi_backend *be = lx->attn->be;
        if (!ctx->kv.layer[il].own) continue;   /* its source's rows */
        for (int half = 0; half < 2 && st == PI_OK; half++) {
            const int64_t rb = half ? ctx->kv.layer[il].v_row_bytes : ctx->kv.layer[il].k_row_bytes;
            for (int32_t i = 0; i < n && st == PI_OK; i++, buf += rb) {
                char *row = (half ? lx->v : lx->k) + (int64_t)cells[i] * rb;
                st = to_cache ? be->i->upload(be, row, buf, (size_t)rb) : be->i->download(be, buf, row, (size_t)rb);
            }
        }
    }
    return st;
}

static int32_t seq_cells(const pi_kv_cache *kv, int32_t seq, int32_t p0, int32_t p1) {
    int32_t n = 0;
    for (int32_t c = 0; c < kv->n_ctx; c++) n += in_state(&kv->cells[c], seq, p0, p1);
    return n;
}

size_t pi_kv_seq_state_size(pi_context *ctx, int32_t seq, int32_t p0, int32_t p1) {
    if (check_seq(ctx, seq, false) != PI_OK) return 0;
    if (pi_rs_state_check(ctx->rs, seq, p0, p1) != PI_OK) return 0;
    return state_bytes(&ctx->kv, seq_cells(&ctx->kv, seq, p0, p1)) + pi_rs_state_bytes(ctx->rs);
}

pi_status pi_kv_seq_state_get(pi_context *ctx, int32_t seq, int32_t p0, int32_t p1, void *dst, size_t size,
                              size_t *written) {
    pi_status st = check_seq(ctx, seq, false);
    if (st != PI_OK) return st;
    if (!dst && size) return pi_fail(PI_ERR_INVALID_ARG, "dst is NULL");
    const pi_kv_cache *kv = &ctx->kv;
    if ((st = pi_rs_state_check(ctx->rs, seq, p0, p1)) != PI_OK) return st;
    const int32_t n = seq_cells(kv, seq, p0, p1);
    const size_t need = state_bytes(kv, n) + pi_rs_state_bytes(ctx->rs);
    if (size < need)
        return pi_fail(PI_ERR_INVALID_ARG, "sequence %d's state takes %zu bytes, the buffer %zu", seq, need, size);
    int32_t *pc = malloc((size_t)PI_MAX(n, 1) * 2 * sizeof(int32_t));   /* (pos, cell) pairs, then the cells */
    if (!pc) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for a sequence state");
    int32_t k = 0;
    for (int32_t c = 0; c < kv->n_ctx; c++)
        if (in_state(&kv->cells[c], seq, p0, p1)) { pc[2 * k] = kv->cells[c].pos; pc[2 * k + 1] = c; k++; }
    qsort(pc, (size_t)n, 2 * sizeof(int32_t), cmp_pos_cell);
    char *p = dst;
    seq_state_header h = { .n_layer = kv->n_layer, .type_k = kv->type_k, .type_v = kv->type_v, .n = n };
    kv_layout(kv, &h.n_embd_kv, &h.k_row_bytes, &h.v_row_bytes);
    memcpy(h.magic, STATE_MAGIC, sizeof h.magic);
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    for (int32_t i = 0; i < n; i++, p += sizeof(int32_t)) memcpy(p, &pc[2 * i], sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) pc[i] = pc[2 * i + 1];   /* the cells, in position order */
    st = copy_rows(ctx, pc, n, p, false);
    free(pc);
    if (st == PI_OK && ctx->rs) pi_rs_state_write(ctx->rs, seq, (char *)dst + state_bytes(kv, n));
    if (st == PI_OK && written) *written = need;
    return st;
}

/* The header of a state buffer (version 1's in version 2's fields; *at: the header's bytes, where the positions
 * start), checked as far as it goes without a cache: the magic, n >= 0 and n positions in size. */
static pi_status read_header(const void *src, size_t size, seq_state_header *h, size_t *at) {
    static const char MAGIC_V1[8] = { 'P', 'I', 'K', 'V', 'S', 'E', 'Q', 1 };
    *at = 0;
    if (!src || size < sizeof(seq_state_header_v1))
        return pi_fail(PI_ERR_INVALID_ARG, "not a sequence state: %zu bytes", size);
    if (memcmp(src, MAGIC_V1, sizeof MAGIC_V1) == 0) {
        seq_state_header_v1 h1;
        memcpy(&h1, src, sizeof h1);
        *h = (seq_state_header){ .n_layer = h1.n_layer, .type_k = h1.type, .type_v = h1.type, .n_embd_kv = h1.n_embd_kv,
                                 .k_row_bytes = h1.row_bytes, .v_row_bytes = h1.row_bytes, .n = h1.n };
        *at = sizeof h1;
    } else {
        if (size < sizeof *h || memcmp(src, STATE_MAGIC, sizeof STATE_MAGIC) != 0)
            return pi_fail(PI_ERR_INVALID_ARG, "not a sequence state (bad magic)");
        memcpy(h, src, sizeof *h);
        *at = sizeof *h;
    }
    if (h->n < 0 || (size - *at) / sizeof(int32_t) < (size_t)h->n)
        return pi_fail(PI_ERR_INVALID_ARG, "not a sequence state: it claims %d tokens, %zu bytes hold at most %zu positions",
                       h->n, size, (size - *at) / sizeof(int32_t));
    return PI_OK;
}

pi_status pi_kv_seq_state_positions(const void *src, size_t size, int32_t *dst, int32_t capacity, int32_t *n) {
    seq_state_header h;
    size_t at;
    const pi_status st = read_header(src, size, &h, &at);
    if (st != PI_OK) return st;
    if (capacity < 0 || (capacity > 0 && !dst)) return pi_fail(PI_ERR_INVALID_ARG, "positions: bad destination");
    if (dst) memcpy(dst, (const char *)src + at, (size_t)PI_MIN(capacity, h.n) * sizeof(int32_t));
    if (n) *n = h.n;
    return PI_OK;
}

pi_status pi_kv_seq_state_set(pi_context *ctx, int32_t seq, const void *src, size_t size, const int32_t *cells,
                               int32_t n_cells) {
    pi_status st = check_seq(ctx, seq, false);
    if (st != PI_OK) return st;
    pi_kv_cache *kv = &ctx->kv;
    seq_state_header h;
    size_t header;
    if ((st = read_header(src, size, &h, &header)) != PI_OK) return st;
    int64_t n_embd_kv, k_row, v_row;
    kv_layout(kv, &n_embd_kv, &k_row, &v_row);
    if (h.n_layer != kv->n_layer || h.type_k != kv->type_k || h.type_v != kv->type_v || h.n_embd_kv != n_embd_kv ||
        h.k_row_bytes != k_row || h.v_row_bytes != v_row)
        return pi_fail(PI_ERR_INVALID_ARG, "the state is of another KV layout (%d layers, K %s, V %s, width %lld; this "
                       "context: %d, %s, %s, %lld)", h.n_layer, pi_type_name(h.type_k), pi_type_name(h.type_v),
                       (long long)h.n_embd_kv, kv->n_layer, pi_type_name(kv->type_k), pi_type_name(kv->type_v),
                       (long long)n_embd_kv);
    if (h.n > kv->n_ctx)   /* (n >= 0: read_header) */
        return pi_fail(PI_ERR_INVALID_ARG, "the state holds %d tokens, the context %d cells", h.n, kv->n_ctx);
    const int32_t n = h.n;
    if (cells && n_cells != n)
        return pi_fail(PI_ERR_INVALID_ARG, "%d cells given for a state of %d tokens", n_cells, n);
    const size_t rs_bytes = pi_rs_state_bytes(ctx->rs);
    if (size != header + body_bytes(kv, n) + rs_bytes)
        return pi_fail(PI_ERR_INVALID_ARG, "the state of %d tokens takes %zu bytes, not %zu", n,
                       header + body_bytes(kv, n) + rs_bytes, size);
    const char *p = (const char *)src + header;
    int32_t *pos = malloc((size_t)PI_MAX(n, 1) * sizeof(int32_t));
    int32_t *at = malloc((size_t)PI_MAX(n, 1) * sizeof(int32_t));   /* the tokens' cells */
    uint8_t *target = calloc((size_t)kv->n_ctx, 1);
    if (!pos || !at || !target) {
        free(pos); free(at); free(target);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for a sequence state");
    }
    memcpy(pos, p, (size_t)n * sizeof(int32_t));
    p += (size_t)n * sizeof(int32_t);
    for (int32_t i = 0; i < n && st == PI_OK; i++)
        if (pos[i] < 0 || (i && pos[i] <= pos[i - 1]))
            st = pi_fail(PI_ERR_INVALID_ARG, "the state's positions are not ascending and >= 0 (token %d: %d)", i,
                         pos[i]);
    int32_t found = 0;
    for (int32_t i = 0; i < n && st == PI_OK; i++) {
        int32_t c = -1;
        if (cells) {
            c = cells[i];
            if (c < 0 || c >= kv->n_ctx || target[c])
                st = pi_fail(PI_ERR_INVALID_ARG, "cell %d for token %d is out of range or given twice", c, i);
            else if (kv->cells[c].seqs != 0 && kv->cells[c].seqs != (uint64_t)1 << seq)
                st = pi_fail(PI_ERR_INVALID_ARG, "cell %d holds another sequence", c);
        } else {
            while (found < kv->n_ctx && kv->cells[found].seqs != 0) found++;
            if (found == kv->n_ctx)
                st = pi_fail(PI_ERR_KV_FULL, "KV cache full: the state's %d tokens do not fit", n);
            else
                c = found++;
        }
        if (st == PI_OK) { at[i] = c; target[c] = 1; }
    }
    if (st == PI_OK) {
        if (!cells || ctx->rs) pi_kv_seq_rm(ctx, seq, 0, -1);   /* the state replaces the sequence (recurrent: always) */
        for (int32_t c = 0; c < kv->n_ctx; c++)        /* seq's other cells at a restored position leave it */
            if (!target[c] && (kv->cells[c].seqs >> seq & 1) &&
                bsearch(&kv->cells[c].pos, pos, (size_t)n, sizeof(int32_t), cmp_pos_cell) != NULL) {
                kv->cells[c].seqs &= ~((uint64_t)1 << seq);
                if (kv->cells[c].seqs == 0) kv->cells[c].pos = -1;
            }
        for (int32_t i = 0; i < n; i++) kv->cells[at[i]] = (pi_kv_cell){ pos[i], (uint64_t)1 << seq };
        st = copy_rows(ctx, at, n, (char *)p, true);
        const char *rs_part = (const char *)src + size - rs_bytes;   /* after the rows */
        if (st == PI_OK && ctx->rs) st = pi_rs_state_read(ctx->rs, seq, rs_part, n ? pos[n - 1] : -1);
        if (st != PI_OK && ctx->rs) pi_kv_seq_rm(ctx, seq, 0, -1);   /* never half a recurrent sequence */
    }
    free(pos); free(at); free(target);
    return st;
}
