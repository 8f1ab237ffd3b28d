/* ops.c: the CPU ops of the core. Each public pi_op_* checks its arguments,
 * then splits its work over the thread pool. f32 tensors must have contiguous
 * rows (nb[0] == 4); higher dims may be strided. */
#include "internal.h"
#include "work_share.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ROW_F32(t, i1, i2, i3) \
    ((float *)((char *)(t)->data + (i1) * (t)->nb[1] + (i2) * (t)->nb[2] + (i3) * (t)->nb[3]))

/* Static split of [0, n) into nth ranges. */
static inline void split_range(int64_t n, int ith, int nth, int64_t *i0, int64_t *i1) {
    const int64_t per = (n + nth - 1) / nth;
    *i0 = PI_MIN(n, per * ith);
    *i1 = PI_MIN(n, *i0 + per);
}

static pi_status check_f32(const pi_tensor *t, const char *what) {
    pi_status st = pi_check_tensor(t, what);
    if (st != PI_OK) return st;
    if (t->type != PI_TYPE_F32) return pi_fail(PI_ERR_INVALID_ARG, "%s: must be f32, got %s", what, pi_type_name(t->type));
    if (t->nb[0] != sizeof(float)) return pi_fail(PI_ERR_INVALID_ARG, "%s: rows must be contiguous", what);
    return PI_OK;
}

static pi_status check_same_shape(const pi_tensor *a, const pi_tensor *b, const char *what) {
    for (int i = 0; i < PI_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i])
            return pi_fail(PI_ERR_INVALID_ARG, "%s: shape mismatch in dim %d (%lld vs %lld)", what, i,
                           (long long)a->ne[i], (long long)b->ne[i]);
    return PI_OK;
}

#define RETURN_IF(st) do { pi_status st_ = (st); if (st_ != PI_OK) return st_; } while (0)

/* ---- get_rows ---------------------------------------------------------- */

typedef struct { const pi_tensor *table; const int32_t *ids; int64_t n; pi_tensor *out; } get_rows_args;

static void get_rows_task(void *p, int ith, int nth) {
    get_rows_args *a = p;
    const pi_type_traits *tr = pi_traits(a->table->type);
    int64_t i0, i1;
    split_range(a->n, ith, nth, &i0, &i1);
    const int64_t R = pi_group_rows(a->table->type);   /* > 0: an interleaved table (a tied head's copy) */
    for (int64_t i = i0; i < i1; i++) {
        const int64_t r = a->ids[i];
        if (R) {
            const char *group = (const char *)a->table->data + r / R * R * a->table->nb[1];
            tr->group_row_to_f32(group, (int)(r % R), ROW_F32(a->out, i, 0, 0), a->table->ne[0]);
        } else {
            tr->to_f32((const char *)a->table->data + r * a->table->nb[1], ROW_F32(a->out, i, 0, 0), a->table->ne[0]);
        }
    }
}

pi_status pi_op_get_rows(pi_threadpool *pool, const pi_tensor *table, const int32_t *ids, int64_t n, pi_tensor *out) {
    RETURN_IF(pi_check_tensor(table, "get_rows table"));
    RETURN_IF(check_f32(out, "get_rows out"));
    if (!ids) return pi_fail(PI_ERR_INVALID_ARG, "get_rows: ids is NULL");
    const pi_type_traits *tr = pi_traits(table->type);
    if (!tr || (pi_is_interleaved(table->type) ? !tr->group_row_to_f32 : !tr->to_f32))
        return pi_fail(PI_ERR_UNSUPPORTED, "get_rows: table type %s", pi_type_name(table->type));
    if (pi_is_interleaved(table->type) && table->ne[1] % pi_group_rows(table->type))
        return pi_fail(PI_ERR_INVALID_ARG, "get_rows: an interleaved %s table needs a multiple of %lld rows",
                       pi_type_name(table->type), (long long)pi_group_rows(table->type));
    if (table->ne[2] * table->ne[3] != 1 || out->ne[2] * out->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "get_rows: table and out must be 2-d");
    if (out->ne[0] != table->ne[0] || out->ne[1] != n || n < 1)
        return pi_fail(PI_ERR_INVALID_ARG, "get_rows: out must be [%lld, %lld]", (long long)table->ne[0], (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= table->ne[1])
            return pi_fail(PI_ERR_INVALID_ARG, "get_rows: id %d at %lld is out of range [0, %lld)", ids[i],
                           (long long)i, (long long)table->ne[1]);
    get_rows_args a = { table, ids, n, out };
    pi_threadpool_run(pool, get_rows_task, &a);
    return PI_OK;
}

/* ---- mul_mat ------------------------------------------------------------
 * y[n, t] = dot(w row n, x column t). Activations are converted once to the
 * weight type's vec_dot_type; rows are handed out in chunks through an atomic
 * counter, and each chunk of rows is applied to every token while it is in cache.
 * Four kernels, fastest first, all giving the same bits per (row, token):
 *   tiles     interleaved weights on AMX tiles: 16 rows x a multiple of 16 tokens per call (prompts of
 *             at least PI_TILES_MIN_T tokens; the token and row tails go to the kernels below)
 *   gemm16    interleaved weights, 16 rows x up to 8 tokens per call (Q4_0X8: two groups, AVX-512 levels;
 *             Q8_0X16, Q5_0X16, Q4_1X16, Q5_1X16, Q4_KX16: one group, every level; Q5_0X16 at the AVX-512 levels: up to
 *             32 tokens (its gemm_max_t), so that each call's unpacking serves more of them)
 *   gemm8     interleaved weights (Q4_0X8, F16X8, BF16X8): 8 rows x up to 8 tokens per call (F16X8 and BF16X8 at
 *             the avx2 level: up to 24, their gemm_max_t, so that the kernel's blocks of 3 tokens fill the call)
 *   tiles_rows  rows at any addresses on AMX tiles: 16 rows x a multiple of 16 tokens per call (prompts of at
 *             least PI_TILES_MIN_T tokens; the token and row tails go to vec_dot8)
 *   vec_dot8  8 rows at any addresses x up to 8 tokens per call
 *   vec_dot   one row, one token */

/* The smallest batch mul_mat gives the AMX kernels (tiles, tiles_rows): 16 is the smallest a tile takes, and
 * there they already beat the avx512 kernels (Sapphire Rapids, bench/ab_isa.py: Q4_0 1.25x at 2 threads,
 * the row kernels of Q8_0, Q5_0, Q4_K, Q5_K, Q6_K 1.5-1.75x with --cpu-time, 4096x4096) */
#ifndef PI_TILES_MIN_T
#define PI_TILES_MIN_T 16
#endif
#ifndef PI_TILES_CHUNK_T
#define PI_TILES_CHUNK_T 128   /* tokens per pass over a work item's rows: 128 Q8_0S rows of K = 4096 are 590 KB, in L2 */
#endif

/* Prompts: work items shrink as the rows run out ("guided" scheduling), at most 256 rows, so the threads finish
 * together: mul_mat_rows runs an item's rows over every token (or over chunks of tokens that fit in L2 with them),
 * which wants the item's rows in cache. A matmul of at most PI_STREAM_MAX_T tokens is bound by its weight stream
 * instead, and there each thread reads long stretches of rows (work_share.h): with these items the two threads'
 * items alternated through every matrix, and on a Zen 5 (2 threads) Gemma 3 270M's layer matrices at T = 1 read at
 * 29.4 against 40.3 GB/s (1.10-1.17x the time at T = 2..8, 1.01-1.03x at 16 and 32), its 178 MB head 4% slower,
 * its decode took 1.16x the time of the work sharing's (542M Q4_K_M 1.04x, Q8_0 1.02x, F16 1.03x, 7B Q4_0 1.05x;
 * bench/README.md). Item sizes are multiples of 16 (the 8-row kernels need multiples of 8); which thread computes a
 * row never changes its result. Returns the first row of the caller's next item, or -1 when none is left (as
 * pi_row_share_next). */
#define PI_STREAM_MAX_T 8
static int64_t next_rows(atomic_llong *next, int64_t N, int nth, int64_t *r1) {
    long long r0 = atomic_load(next);
    for (;;) {
        if (r0 >= N) return -1;
        const int64_t size = PI_MAX(16, PI_MIN(256, (N - r0) / (2 * (int64_t)nth) / 16 * 16));
        if (atomic_compare_exchange_weak(next, &r0, r0 + size)) {
            *r1 = PI_MIN(N, r0 + size);
            return r0;
        }
    }
}

typedef struct {
    const pi_tensor *w, *x;
    pi_tensor *y;
    char *xq;             /* [T] rows of the vec_dot_type */
    int64_t xq_row_bytes;
    char *xt;             /* the tile table of the batch's whole token tiles (pi_tiles_fn's xt), or NULL */
    int64_t xt_stride;    /* its bytes per token tile */
} mul_mat_args;

/* Types whose own kernels decode slowly (to_batch: the IQ3 and IQ2 grids) run a prompt's rows [r, r1) BATCH_ROWS at
 * a time: converted once into their batch_type (the same bits per (row, token), pi_to_batch_fn), then that type's
 * 8-row kernel over the tokens, chunk at a time (its dot at the scalar level, which has no 8-row kernels), or for an
 * interleaved batch_type (Q6_K's Q6_KX16 groups, Q8_KW's Q8_KWX16, avx2 and avx512) its gemm16 per group, or where the
 * batch type has row tile kernels (the amx level: Q6_K, Q8_KW) those over the whole token tiles. Where the batch type converts
 * too and the prompt is long enough for it (its batch_min_t), the rows convert twice (IQ3 -> Q6_K -> Q6_KX16 at the
 * avx2 level: the 542M IQ3_S / IQ3_M matmuls at T = 32 0.93-0.96x the time, at T = 128 0.84-0.91x; converted twice at
 * T = 16 they took 1.12-1.25x, Zen 3, two threads; at the avx512 level, whose Q6_KX16 and Q8_KWX16 kernels are AVX-512
 * VNNI, IQ3_S at T = 128 0.455x, IQ2_S / IQ1_M 0.43-0.47x, Zen 5). The converted rows go to a heap
 * buffer (a row of a wide matrix in Q6_K is 9 KB at K = 11008); without one, or where a chunk cannot be converted, the
 * rows left go to the type's own kernels. Returns the first row not done.
 * PI_BATCH_MIN_T: 542M IQ3_S ffn_up, one thread (Zen 3): 2 tokens as fast either way, 3: 0.68x the time, 16: 0.22x.
 * A type's batch_min_t overrides it: Q6_K -> Q6_KX16 (avx2) saves only the 8-row kernel's transposes, so its copy pays
 * from about 20 tokens on (542M Q6_K matmuls, Zen 3, two threads: T = 8 1.08x the time, 16 1.03x, 32 0.95x, 512 0.88x). */
#ifndef PI_BATCH_MIN_T
#define PI_BATCH_MIN_T 3
#endif
#define BATCH_ROWS 16
static bool batch_pays(const pi_type_traits *tr, int64_t T) {
    return tr->to_batch && T >= (tr->batch_min_t ? tr->batch_min_t : PI_BATCH_MIN_T);
}

/* The traits whose tile kernels a batch of T tokens of weights tr runs, or NULL: its own (tiles, tiles_rows), or, for
 * a type whose prompts convert their rows (to_batch) once into a type with row tile kernels, those: the IQ3 rows as
 * Q6_K, the IQ2 and IQ1 rows as Q8_KW at the amx level (mul_mat_batch_rows). */
static const pi_type_traits *tile_traits(const pi_type_traits *tr, int64_t T) {
    if (tr->tiles || tr->tiles_rows) return tr;
    if (!batch_pays(tr, T)) return NULL;
    const pi_type_traits *bt = pi_traits(tr->batch_type);
    return bt->tiles_rows && T >= PI_TILES_MIN_T && bt->vec_dot_type == tr->vec_dot_type ? bt : NULL;
}

/* Bytes per token tile of the activations' tile table (pi_tiles_fn's xt) where a batch of T goes to tile kernels
 * that read one, else 0. */
static int64_t tile_table_stride(const pi_type_traits *tr, int64_t K, int64_t T) {
    const pi_type_traits *xtr = pi_traits(tr->vec_dot_type), *tt = tile_traits(tr, T);
    if (T < PI_TILES_MIN_T || !tt || !pi_cpu()->tiles_begin || !xtr->tiles_prep ||
        pi_tiles_act_type(tt) != tr->vec_dot_type)   /* mul_mat's activations are the vec_dot type */
        return 0;
    return K / xtr->tiles_unit * xtr->tiles_unit_bytes;
}

/* mul_mat's scratch: T activation rows of the vec_dot_type, then (at a 64-byte boundary) the tile table, if any. */
static size_t tile_table_offset(const pi_type_traits *tr, int64_t K, int64_t T) {
    return ((size_t)(pi_row_bytes(tr->vec_dot_type, K) * T) + 63) / 64 * 64;
}

static void mul_mat_convert_task(void *p, int ith, int nth) {
    mul_mat_args *a = p;
    const pi_type_traits *xtr = pi_traits(pi_traits(a->w->type)->vec_dot_type);
    const int64_t K = a->x->ne[0], T = a->x->ne[1], T16 = a->xt ? T / PI_TILE_T * PI_TILE_T : 0;
    int64_t t0, t1;
    split_range(T, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        char *row = a->xq + t * a->xq_row_bytes;
        xtr->from_f32(ROW_F32(a->x, t, 0, 0), row, K);
        if (t < T16) xtr->tiles_prep(K, row, (int)(t % PI_TILE_T), a->xt + t / PI_TILE_T * a->xt_stride);
    }
}

/* The AMX part of mul_mat_rows: rows [r0, r16) (r16 - r0 a multiple of 16) x tokens [0, T16) on tiles, T16 the
 * token count rounded down to whole tiles; token chunks outside so they stay in cache. Returns T16, or 0 (nothing
 * done) without a tile kernel for this layout, below PI_TILES_MIN_T tokens, or without the tile table they read. */
static int64_t mul_mat_tiles(const mul_mat_args *a, const pi_type_traits *tr, int64_t r0, int64_t r16) {
    const int64_t K = a->w->ne[0], T = a->x->ne[1];
    if ((!tr->tiles && !tr->tiles_rows) || T < PI_TILES_MIN_T || r16 <= r0 || !a->xt) return 0;
    const char *w = a->w->data;
    const int64_t y_stride = a->y->nb[1] / (int64_t)sizeof(float), T16 = T / PI_TILE_T * PI_TILE_T;
    float *y0 = a->y->data;
    pi_tile_session session;
    pi_cpu()->tiles_begin(a->w->type, &session);
    for (int64_t t = 0; t < T16; t += PI_TILES_CHUNK_T) {
        const char *xq = a->xq + t * a->xq_row_bytes;
        const char *xt = a->xt ? a->xt + t / PI_TILE_T * a->xt_stride : NULL;   /* token t's tile */
        const int nt = (int)PI_MIN(PI_TILES_CHUNK_T, T16 - t);
        for (int64_t g = r0; g < r16; g += 16) {
            if (tr->tiles) {   /* interleaved: two groups from row g on */
                tr->tiles(K, w + g * a->w->nb[1], xq, a->xq_row_bytes, nt, y0 + t * y_stride + g, y_stride, xt,
                          a->xt_stride);
                continue;
            }
            const void *rows[16];
            for (int k = 0; k < 16; k++) rows[k] = w + (g + k) * a->w->nb[1];
            tr->tiles_rows(K, rows, xq, a->xq_row_bytes, nt, y0 + t * y_stride + g, y_stride, xt, a->xt_stride);
        }
    }
    pi_cpu()->tiles_end(&session);
    return T16;
}

static int64_t mul_mat_batch_rows(const mul_mat_args *a, const pi_type_traits *tr, int64_t r, int64_t r1,
                                  int64_t chunk) {
    const pi_type_traits *ct = pi_traits(tr->batch_type);   /* the first conversion's type */
    const int64_t K = a->w->ne[0], T = a->x->ne[1], crow = pi_row_bytes(tr->batch_type, K);
    /* the converted rows on their tile kernels (tile_traits, with the table made for them), else converted twice (to
     * an interleaved type) where that pays */
    const bool on_tiles = a->xt && tile_traits(tr, T) == ct;
    const bool twice = !on_tiles && batch_pays(ct, T);
    const int32_t btype = twice ? ct->batch_type : tr->batch_type;   /* the type whose kernels run */
    const pi_type_traits *bt = pi_traits(btype);
    const int64_t brow = pi_row_bytes(btype, K);
    const int64_t y_stride = a->y->nb[1] / (int64_t)sizeof(float);
    float *y0 = a->y->data;
    const char *w = a->w->data;
    const int unit = pi_is_interleaved(btype) ? pi_group_rows(btype) : 8;   /* rows per call */
    if (r1 - r < unit) return r;
    char *cbuf = malloc((size_t)(BATCH_ROWS * (crow + (twice ? brow : 0))));
    if (!cbuf) return r;
    char *buf = twice ? cbuf + BATCH_ROWS * crow : cbuf;   /* rows of btype */
    /* the converted rows on the batch type's tile kernels (amx level), 16 rows x the whole token tiles; the token tail
     * below */
    const int64_t T16 = on_tiles ? T / PI_TILE_T * PI_TILE_T : 0;
    pi_tile_session session;
    if (T16) pi_cpu()->tiles_begin(btype, &session);
    for (; r + unit <= r1;) {
        const int n = (int)PI_MIN(BATCH_ROWS, (r1 - r) / unit * unit);
        if (!tr->to_batch(K, w + r * a->w->nb[1], a->w->nb[1], n, cbuf)) break;
        if (twice && !ct->to_batch(K, cbuf, crow, n, buf)) break;
        const int64_t tiled = n == 16 ? T16 : 0;   /* tokens [0, tiled) of these rows done on tiles */
        if (tiled) {
            const void *rows[16];
            for (int k = 0; k < 16; k++) rows[k] = buf + k * brow;
            for (int64_t t = 0; t < tiled; t += PI_TILES_CHUNK_T)
                bt->tiles_rows(K, rows, a->xq + t * a->xq_row_bytes, a->xq_row_bytes,
                               (int)PI_MIN(PI_TILES_CHUNK_T, tiled - t), y0 + t * y_stride + r, y_stride,
                               a->xt + t / PI_TILE_T * a->xt_stride, a->xt_stride);
        }
        if (unit > 8) {   /* groups (Q6_KX16): brow bytes per row, a group's rows together */
            for (int64_t c0 = 0; c0 < T; c0 += chunk)
                for (int g = 0; g < n; g += unit)
                    for (int64_t t = c0; t < PI_MIN(T, c0 + chunk); t += bt->gemm_max_t)
                        bt->gemm16(K, buf + g * brow, a->xq + t * a->xq_row_bytes, a->xq_row_bytes,
                                   (int)PI_MIN(bt->gemm_max_t, PI_MIN(T, c0 + chunk) - t), y0 + t * y_stride + r + g,
                                   y_stride);
            r += n;
            continue;
        }
        for (int64_t c0 = 0; c0 < T; c0 += chunk)
            for (int g = 0; g < n; g += 8) {
                const void *rows[8];
                for (int k = 0; k < 8; k++) rows[k] = buf + (g + k) * brow;
                for (int64_t t = PI_MAX(c0, tiled); t < PI_MIN(T, c0 + chunk); t += PI_DOT8_MAX_T) {
                    const int nt = (int)PI_MIN(PI_DOT8_MAX_T, PI_MIN(T, c0 + chunk) - t);
                    float *y = y0 + t * y_stride + r + g;
                    if (bt->vec_dot8)
                        bt->vec_dot8(K, rows, a->xq + t * a->xq_row_bytes, a->xq_row_bytes, nt, y, y_stride);
                    else   /* the scalar level: no 8-row kernels */
                        for (int i = 0; i < nt; i++)
                            for (int k = 0; k < 8; k++)
                                y[i * y_stride + k] = bt->vec_dot(K, rows[k], a->xq + (t + i) * a->xq_row_bytes);
                }
            }
        r += n;
    }
    if (T16) pi_cpu()->tiles_end(&session);
    free(cbuf);
    return r;
}

/* Tokens per pass over a work item's row groups, a multiple of the kernel's tokens per call: each pass's activations
 * (a quarter of L2: 512 KB on Sapphire Rapids, where 1/8 and 1/2 measured slower) stay in L2 while every row group
 * of the item reads them (f32 activations of 512 tokens are 4 MB at K = 2048). The interleaved layouts round up to
 * whole calls: F16X8's and BF16X8's 24-token calls at the avx2 level make passes of 24 tokens (192 KB at K = 2048,
 * 540 KB at K = 5632); on a Zen 3, passes of 12 at K = 5632 measured the same, passes of 12 at K = 2048 1.05x the
 * time. */
static int64_t token_chunk(const mul_mat_args *a, int64_t per_call, bool round_up) {
    const int64_t fit = pi_cpu_l2_bytes() / 4 / a->xq_row_bytes;
    return PI_MAX(per_call, (round_up ? fit + per_call - 1 : fit) / per_call * per_call);
}

/* rows [r0, r1) for every token */
static void mul_mat_rows(const mul_mat_args *a, const pi_type_traits *tr, int64_t r0, int64_t r1) {
    const int64_t K = a->w->ne[0], T = a->x->ne[1];
    const char *w = a->w->data;
    const int64_t y_stride = a->y->nb[1] / (int64_t)sizeof(float);
    float *y0 = a->y->data;
    int64_t r = r0;
    const int64_t r16 = r0 + (r1 - r0) / 16 * 16;
    const int64_t tiled = mul_mat_tiles(a, tr, r0, r16);   /* tokens [0, tiled) of rows [r0, r16) are done */
    const int64_t chunk = token_chunk(a, PI_DOT8_MAX_T, false);
    if (pi_is_interleaved(a->w->type)) {   /* rows r of group r / R at byte r nb[1]; r0, r1 are multiples of R */
        /* only float activations (f32, bf16, BF16S: F16X8, BF16X8) in chunks: the quantized layouts' prompts measured
         * as fast or faster with every token per row group (Zen 4, pp512: Q8_0 0.6-0.8x with chunks, Q4_K_M and 7B
         * Q4_0 within noise) */
        const int64_t per_call = tr->gemm_max_t;
        const bool float_act = tr->vec_dot_type == PI_TYPE_F32 || tr->vec_dot_type == PI_TYPE_BF16 ||
                               tr->vec_dot_type == PI_TYPE_BF16S;
        const int64_t tokens_per_pass = float_act ? token_chunk(a, per_call, true) : T;
        /* one token on AMD Zen 4 and Zen 5: Q4_0X8's groups one after the other through the 256-bit gemm8 (one
         * weight stream) rather than two side by side in gemm16. 7B Q4_0 decode at the avx512 level went from
         * 0.77-0.90x the avx2 level's speed to 0.95-1.09x on a Zen 4; the decode matmuls took 0.89x the time on a
         * Zen 5, whose 512-bit data path is full width (so the two halves are not the whole cost).
         * Sapphire Rapids keeps gemm16: it doubled the one-token speed from L2 there (from DRAM: not measured). */
        const bool two_groups = tr->gemm16 && !(T == 1 && tr->gemm8 && pi_cpu_one_stream_decode());
        for (int64_t c0 = 0; c0 < T; c0 += tokens_per_pass) {
            const int64_t c1 = PI_MIN(T, c0 + tokens_per_pass);
            r = r0;
            if (two_groups)   /* 16 rows per call where the level (Q4_0X8) or the layout (Q8_0X16, Q4_KX16) has one */
                for (; r + 16 <= r1; r += 16)
                    for (int64_t t = PI_MAX(c0, r < r16 ? tiled : 0); t < c1; t += per_call)
                        tr->gemm16(K, w + r * a->w->nb[1], a->xq + t * a->xq_row_bytes, a->xq_row_bytes,
                                   (int)PI_MIN(per_call, c1 - t), y0 + t * y_stride + r, y_stride);
            for (; r < r1; r += 8)   /* 8-row groups only: 16-row layouts end above */
                for (int64_t t = PI_MAX(c0, r < r16 ? tiled : 0); t < c1; t += per_call)
                    tr->gemm8(K, w + r * a->w->nb[1], a->xq + t * a->xq_row_bytes, a->xq_row_bytes,
                              (int)PI_MIN(per_call, c1 - t), y0 + t * y_stride + r, y_stride);
        }
        return;
    }
    if (batch_pays(tr, T) && !tiled) r = mul_mat_batch_rows(a, tr, r, r1, chunk);   /* tiles first where they ran */
    if (tr->vec_dot8) {
        const int64_t r8 = r + (r1 - r) / 8 * 8;
        for (int64_t c0 = 0; c0 < T; c0 += chunk)
            for (int64_t g = r; g < r8; g += 8) {
                const void *rows[8];
                for (int k = 0; k < 8; k++) rows[k] = w + (g + k) * a->w->nb[1];
                const int64_t c1 = PI_MIN(T, c0 + chunk);
                for (int64_t t = PI_MAX(c0, g < r16 ? tiled : 0); t < c1; t += PI_DOT8_MAX_T)
                    tr->vec_dot8(K, rows, a->xq + t * a->xq_row_bytes, a->xq_row_bytes,
                                 (int)PI_MIN(PI_DOT8_MAX_T, c1 - t), y0 + t * y_stride + g, y_stride);
            }
        r = r8;
    }
    for (int64_t t = 0; t < T; t++) {
        const char *xq = a->xq + t * a->xq_row_bytes;
        for (int64_t k = r; k < r1; k++) y0[t * y_stride + k] = tr->vec_dot(K, w + k * a->w->nb[1], xq);
    }
}

/* One pass of mul_mat over the rows of n weights of one input (one weight: a plain mul_mat): rows numbered across
 * them (weight i's after those of weights < i), handed out as one matmul's, an item cut where a weight ends. */
typedef struct {
    mul_mat_args m[PI_MUL_MATS_MAX];
    int64_t end[PI_MUL_MATS_MAX];      /* rows of weights 0..i */
    int n, nth;
    bool stream;                       /* at most PI_STREAM_MAX_T tokens: rows shared as stretches (share) */
    atomic_llong next_row;             /* else: the guided items (next_rows) */
    pi_row_share share;
} mul_mat_pass;

static void mul_mat_task(void *p, int ith, int nth) {
    PI_UNUSED(nth);
    mul_mat_pass *a = p;
    const int64_t N = a->end[a->n - 1];
    for (;;) {
        int64_t r1;
        const int64_t r0 = a->stream ? pi_row_share_next(&a->share, ith, &r1) : next_rows(&a->next_row, N, a->nth, &r1);
        if (r0 < 0) return;
        for (int i = 0; i < a->n; i++) {
            const int64_t b0 = i ? a->end[i - 1] : 0, lo = PI_MAX(r0, b0), hi = PI_MIN(r1, a->end[i]);
            if (lo < hi) mul_mat_rows(&a->m[i], pi_traits(a->m[i].w->type), lo - b0, hi - b0);
        }
    }
}

/* x converted once (to weight 0's vec_dot_type, which every weight shares), then one pass over all the rows. */
static void mul_mat_run(pi_threadpool *pool, int n, const pi_tensor *const *w, const pi_tensor *x, pi_tensor *const *y,
                        void *scratch) {
    mul_mat_pass a = { .n = n, .nth = pi_threadpool_size(pool) };
    const pi_type_traits *tr = pi_traits(w[0]->type);   /* every weight has its activation format and K */
    const int64_t K = w[0]->ne[0], T = x->ne[1];
    int64_t xt_stride = 0;   /* the tile table, where a weight's tile kernels read one */
    for (int i = 0; i < n; i++) xt_stride = PI_MAX(xt_stride, tile_table_stride(pi_traits(w[i]->type), K, T));
    char *xt = xt_stride ? (char *)scratch + tile_table_offset(tr, K, T) : NULL;
    for (int i = 0; i < n; i++) {
        a.m[i] = (mul_mat_args){ .w = w[i], .x = x, .y = y[i], .xq = scratch, .xt = xt, .xt_stride = xt_stride };
        a.m[i].xq_row_bytes = pi_row_bytes(pi_traits(w[i]->type)->vec_dot_type, w[i]->ne[0]);
        a.end[i] = (i ? a.end[i - 1] : 0) + w[i]->ne[1];
    }
    atomic_init(&a.next_row, 0);
    a.stream = x->ne[1] <= PI_STREAM_MAX_T && pi_row_share_init(&a.share, a.end[n - 1], a.nth, 16);
    if (x->ne[1] == 1) mul_mat_convert_task(&a.m[0], 0, 1);   /* one token: one thread's work, without a pool run */
    else pi_threadpool_run(pool, mul_mat_convert_task, &a.m[0]);
    pi_threadpool_run(pool, mul_mat_task, &a);
}

/* One conversion and one pass over the rows where every weight has x's vec_dot_type and whole 16-row items
 * (so an item cut at a weight's end keeps the kernels' row groups); else one mul_mat each. At one token
 * this saves a pool run and a tail per weight (Gemma 3 270M: q, k, v of 1024, 256, 256 rows, gate and up). */
pi_status pi_mul_mats(pi_threadpool *pool, int n, const pi_tensor *const *w, const pi_tensor *x, pi_tensor *const *y,
                      void *scratch) {
    bool merge = n >= 1 && n <= PI_MUL_MATS_MAX;
    for (int i = 0; merge && i < n; i++)
        merge = pi_traits(w[i]->type)->vec_dot_type == pi_traits(w[0]->type)->vec_dot_type &&
                w[i]->ne[0] == w[0]->ne[0] && w[i]->ne[1] % 16 == 0;
    if (merge) mul_mat_run(pool, n, w, x, y, scratch);
    else
        for (int i = 0; i < n; i++) mul_mat_run(pool, 1, &w[i], x, &y[i], scratch);
    return PI_OK;
}

size_t pi_mul_mat_scratch(int32_t wtype, int64_t K, int64_t T) {
    const pi_type_traits *tr = pi_traits(wtype);
    if (!tr) return 0;
    const int64_t xt_stride = tile_table_stride(tr, K, T);
    if (!xt_stride) return (size_t)(pi_row_bytes(tr->vec_dot_type, K) * T);
    return tile_table_offset(tr, K, T) + (size_t)(T / PI_TILE_T * xt_stride);
}

pi_status pi_mul_mat(pi_threadpool *pool, const pi_tensor *w, const pi_tensor *x, pi_tensor *y, void *scratch) {
    mul_mat_run(pool, 1, &w, x, &y, scratch);
    return PI_OK;
}

pi_status pi_mul_mat_grow(pi_threadpool *pool, const pi_tensor *w, const pi_tensor *x, pi_tensor *y, void **scratch,
                          size_t *bytes) {
    const size_t need = pi_mul_mat_scratch(w->type, w->ne[0], x->ne[1]);
    if (need > *bytes) {
        free(*scratch);
        *bytes = 0;
        if (!(*scratch = pi_alloc_lines(need))) return pi_fail(PI_ERR_OUT_OF_MEMORY, "mul_mat: out of memory");
        *bytes = need;
    }
    return pi_mul_mat(pool, w, x, y, *scratch);
}

static pi_status check_mul_mat(const pi_tensor *w, const pi_tensor *x, const pi_tensor *y) {
    if (!w || !y) return pi_fail(PI_ERR_INVALID_ARG, "mul_mat: w or y is NULL");
    RETURN_IF(pi_check_tensor(w, "mul_mat w"));
    RETURN_IF(check_f32(x, "mul_mat x"));
    RETURN_IF(check_f32(y, "mul_mat y"));
    const pi_type_traits *tr = pi_traits(w->type);
    if (!tr || (!tr->vec_dot && !tr->gemm8 && !tr->gemm16))
        return pi_fail(PI_ERR_UNSUPPORTED, "mul_mat: weight type %s", pi_type_name(w->type));
    if (pi_is_interleaved(w->type) && w->ne[1] % pi_group_rows(w->type))
        return pi_fail(PI_ERR_INVALID_ARG, "mul_mat: an interleaved %s weight needs a multiple of %lld rows",
                       pi_type_name(w->type), (long long)pi_group_rows(w->type));
    if (y->nb[1] % (int64_t)sizeof(float))
        return pi_fail(PI_ERR_INVALID_ARG, "mul_mat: y rows must be float aligned");
    if (w->n_dims > 2 || x->ne[2] * x->ne[3] != 1 || y->ne[2] * y->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "mul_mat: only 2-d operands are supported");
    if (x->ne[0] != w->ne[0] || y->ne[0] != w->ne[1] || y->ne[1] != x->ne[1])
        return pi_fail(PI_ERR_INVALID_ARG, "mul_mat: shapes w [%lld, %lld], x [%lld, %lld], y [%lld, %lld] do not fit",
                       (long long)w->ne[0], (long long)w->ne[1], (long long)x->ne[0], (long long)x->ne[1],
                       (long long)y->ne[0], (long long)y->ne[1]);
    return PI_OK;
}

pi_status pi_op_mul_mat(pi_threadpool *pool, const pi_tensor *w, const pi_tensor *x, pi_tensor *y) {
    RETURN_IF(check_mul_mat(w, x, y));
    const size_t bytes = pi_mul_mat_scratch(w->type, w->ne[0], x->ne[1]);
    void *scratch = pi_alloc_lines(bytes);
    if (!scratch) return pi_fail(PI_ERR_OUT_OF_MEMORY, "mul_mat: out of memory");
    pi_status st = pi_mul_mat(pool, w, x, y, scratch);
    free(scratch);
    return st;
}

pi_status pi_op_mul_mats(pi_threadpool *pool, int32_t n, const pi_tensor *const *w, const pi_tensor *x,
                         pi_tensor *const *y) {
    if (n < 1 || n > PI_MUL_MATS_MAX)
        return pi_fail(PI_ERR_INVALID_ARG, "mul_mats: n = %d weights is not 1..%d", n, PI_MUL_MATS_MAX);
    if (!w || !y) return pi_fail(PI_ERR_INVALID_ARG, "mul_mats: the weight or output array is NULL");
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        RETURN_IF(check_mul_mat(w[i], x, y[i]));
        bytes = PI_MAX(bytes, pi_mul_mat_scratch(w[i]->type, w[i]->ne[0], x->ne[1]));
    }
    void *scratch = pi_alloc_lines(bytes);
    if (!scratch) return pi_fail(PI_ERR_OUT_OF_MEMORY, "mul_mats: out of memory");
    pi_status st = pi_mul_mats(pool, n, w, x, y, scratch);
    free(scratch);
    return st;
}

/* ---- rms_norm ------------------------------------------------------------ */

typedef struct { const pi_tensor *x, *w; float eps; pi_tensor *out; } rms_norm_args;

static void rms_norm_task(void *p, int ith, int nth) {
    rms_norm_args *a = p;
    const int64_t D = a->x->ne[0], R = a->x->ne[1] * a->x->ne[2] * a->x->ne[3];
    const float *w = a->w ? a->w->data : NULL;
    int64_t r0, r1;
    split_range(R, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % a->x->ne[1], i2 = (r / a->x->ne[1]) % a->x->ne[2], i3 = r / (a->x->ne[1] * a->x->ne[2]);
        const float *x = ROW_F32(a->x, i1, i2, i3);
        float *y = ROW_F32(a->out, i1, i2, i3);
        double ss = 0.0;
        for (int64_t i = 0; i < D; i++) ss += (double)x[i] * x[i];
        const float scale = (float)(1.0 / sqrt(ss / (double)D + a->eps));
        for (int64_t i = 0; i < D; i++) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
    }
}

pi_status pi_op_rms_norm(pi_threadpool *pool, const pi_tensor *x, const pi_tensor *weight, float eps, pi_tensor *out) {
    RETURN_IF(check_f32(x, "rms_norm x"));
    RETURN_IF(check_f32(out, "rms_norm out"));
    RETURN_IF(check_same_shape(x, out, "rms_norm"));
    if (weight) {
        RETURN_IF(check_f32(weight, "rms_norm weight"));
        if (weight->ne[0] != x->ne[0] || pi_nelements(weight) != weight->ne[0])
            return pi_fail(PI_ERR_INVALID_ARG, "rms_norm: weight must be [%lld]", (long long)x->ne[0]);
    }
    if (!(eps >= 0.0f)) return pi_fail(PI_ERR_INVALID_ARG, "rms_norm: eps must be >= 0");
    rms_norm_args a = { x, weight, eps, out };
    pi_threadpool_run(pool, rms_norm_task, &a);
    return PI_OK;
}

/* ---- layer_norm ------------------------------------------------------------ */

typedef struct { const pi_tensor *x, *w, *b; float eps; pi_tensor *out; } layer_norm_args;

static void layer_norm_task(void *p, int ith, int nth) {
    layer_norm_args *a = p;
    const int64_t D = a->x->ne[0], R = a->x->ne[1] * a->x->ne[2] * a->x->ne[3];
    const float *w = a->w ? a->w->data : NULL, *b = a->b ? a->b->data : NULL;
    int64_t r0, r1;
    split_range(R, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % a->x->ne[1], i2 = (r / a->x->ne[1]) % a->x->ne[2], i3 = r / (a->x->ne[1] * a->x->ne[2]);
        const float *x = ROW_F32(a->x, i1, i2, i3);
        float *y = ROW_F32(a->out, i1, i2, i3);
        double sum = 0.0;
        for (int64_t i = 0; i < D; i++) sum += x[i];
        const double mean = sum / (double)D;
        double ss = 0.0;
        for (int64_t i = 0; i < D; i++) ss += ((double)x[i] - mean) * ((double)x[i] - mean);
        const float scale = (float)(1.0 / sqrt(ss / (double)D + a->eps));
        const float m = (float)mean;
        for (int64_t i = 0; i < D; i++) y[i] = (x[i] - m) * scale * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
}

pi_status pi_op_layer_norm(pi_threadpool *pool, const pi_tensor *x, const pi_tensor *weight, const pi_tensor *bias,
                           float eps, pi_tensor *out) {
    RETURN_IF(check_f32(x, "layer_norm x"));
    RETURN_IF(check_f32(out, "layer_norm out"));
    RETURN_IF(check_same_shape(x, out, "layer_norm"));
    const pi_tensor *wb[2] = { weight, bias };
    for (int i = 0; i < 2; i++) {
        if (!wb[i]) continue;
        RETURN_IF(check_f32(wb[i], i ? "layer_norm bias" : "layer_norm weight"));
        if (wb[i]->ne[0] != x->ne[0] || pi_nelements(wb[i]) != wb[i]->ne[0])
            return pi_fail(PI_ERR_INVALID_ARG, "layer_norm: %s must be [%lld]", i ? "bias" : "weight",
                           (long long)x->ne[0]);
    }
    if (!(eps >= 0.0f)) return pi_fail(PI_ERR_INVALID_ARG, "layer_norm: eps must be >= 0");
    layer_norm_args a = { x, weight, bias, eps, out };
    pi_threadpool_run(pool, layer_norm_task, &a);
    return PI_OK;
}

/* ---- rope ----------------------------------------------------------------- */

/* The table's cos/sin for its key, split over the threads by (token, pair). */
typedef struct { pi_rope_table *tb; const double *inv_freq; } rope_table_args;

static void rope_table_task(void *p, int ith, int nth) {
    rope_table_args *a = p;
    pi_rope_table *tb = a->tb;
    const int64_t P = tb->n_rot / 2;
    int64_t j0, j1;
    split_range(tb->T * P, ith, nth, &j0, &j1);
    for (int64_t j = j0; j < j1; j++) {
        const int64_t t = j / P, i = j % P;
        double theta = (double)tb->pos[t] * tb->scale * a->inv_freq[i];
        if (tb->factors) theta /= tb->factors[i];   /* frequency factors (rope_freqs) */
        tb->cs[2 * j] = (float)cos(theta) * tb->mscale;
        tb->cs[2 * j + 1] = (float)sin(theta) * tb->mscale;
    }
}

static bool rope_table_is(const pi_rope_table *tb, const int32_t *pos, int64_t T, int32_t n_rot, float base,
                          float scale, const float *factors, float mscale) {
    return tb->T == T && tb->n_rot == n_rot && tb->base == base && tb->scale == scale && tb->factors == factors &&
           tb->mscale == mscale && memcmp(tb->pos, pos, (size_t)T * sizeof *pos) == 0;
}

/* The cache's table for this key (computed into the oldest one where none matches), or *fresh for the call alone. */
static pi_status rope_table(pi_threadpool *pool, pi_rope_cache *cache, pi_rope_table *fresh, const int32_t *pos,
                            int64_t T, int32_t n_rot, float base, float scale, const float *factors,
                            float mscale, pi_rope_table **out) {
    pi_rope_table *tb = fresh;
    if (cache) {
        tb = &cache->t[0];
        for (int i = 0; i < PI_ROPE_TABLES; i++) {
            pi_rope_table *c = &cache->t[i];
            if (rope_table_is(c, pos, T, n_rot, base, scale, factors, mscale)) {
                c->used = ++cache->clock;
                *out = c;
                return PI_OK;
            }
            if (c->used < tb->used) tb = c;
        }
        tb->used = ++cache->clock;
    }
    tb->T = 0;   /* empty until filled */
    const int64_t n_cs = T * n_rot;
    if (tb->cap_T < T || tb->cap_cs < n_cs) {
        int32_t *p = realloc(tb->pos, (size_t)PI_MAX(T, tb->cap_T) * sizeof *p);
        if (p) { tb->pos = p; tb->cap_T = PI_MAX(T, tb->cap_T); }
        float *cs = p ? realloc(tb->cs, (size_t)PI_MAX(n_cs, tb->cap_cs) * sizeof *cs) : NULL;
        if (cs) { tb->cs = cs; tb->cap_cs = PI_MAX(n_cs, tb->cap_cs); }
        if (!p || !cs) return pi_fail(PI_ERR_OUT_OF_MEMORY, "rope: out of memory for %lld tokens", (long long)T);
    }
    /* base^(-2i / n_rot) on the heap: n_rot of pi_op_rope is the caller's; + 1: never malloc(0) */
    double *inv_freq = malloc((size_t)(n_rot / 2 + 1) * sizeof *inv_freq);
    if (!inv_freq) return pi_fail(PI_ERR_OUT_OF_MEMORY, "rope: out of memory");
    for (int32_t i = 0; i < n_rot / 2; i++) inv_freq[i] = pow(base, -2.0 * (double)i / n_rot);
    memcpy(tb->pos, pos, (size_t)T * sizeof *pos);
    tb->n_rot = n_rot; tb->base = base; tb->scale = scale; tb->factors = factors; tb->mscale = mscale;
    tb->T = T;
    rope_table_args a = { tb, inv_freq };
    pi_threadpool_run(pool, rope_table_task, &a);
    free(inv_freq);
    *out = tb;
    return PI_OK;
}

void pi_rope_cache_free(pi_rope_cache *c) {
    if (!c) return;
    for (int i = 0; i < PI_ROPE_TABLES; i++) { free(c->t[i].pos); free(c->t[i].cs); }
    memset(c, 0, sizeof *c);
}

typedef struct { const pi_tensor *x; int32_t mode; const pi_rope_table *tb; pi_tensor *out; } rope_args;

/* Rows (token t, head h) split over the threads: one token's heads go to several threads. */
static void rope_task(void *p, int ith, int nth) {
    rope_args *a = p;
    const int64_t hd = a->x->ne[0], H = a->x->ne[1], T = a->x->ne[2], P = a->tb->n_rot / 2;
    int64_t r0, r1;
    split_range(T * H, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = r / H, h = r % H;
        const float *cs = a->tb->cs + 2 * P * t;
        const float *x = ROW_F32(a->x, h, t, 0);
        float *y = ROW_F32(a->out, h, t, 0);
        for (int64_t i = 0; i < P; i++) {
            /* the pair: (2i, 2i+1) normal, (i, i + n_rot/2) NEOX */
            const int64_t i0 = a->mode == PI_ROPE_NEOX ? i : 2 * i, i1 = a->mode == PI_ROPE_NEOX ? i + P : 2 * i + 1;
            const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[i0], x1 = x[i1];
            y[i0] = x0 * c - x1 * s;
            y[i1] = x0 * s + x1 * c;
        }
        if (y != x)   /* dims past n_rot pass through */
            memcpy(y + 2 * P, x + 2 * P, (size_t)(hd - 2 * P) * sizeof(float));
    }
}

pi_status pi_op_rope(pi_threadpool *pool, const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode,
                     float freq_base, float freq_scale, pi_tensor *out) {
    RETURN_IF(check_f32(x, "rope x"));
    RETURN_IF(check_f32(out, "rope out"));
    RETURN_IF(check_same_shape(x, out, "rope"));
    if (!pos) return pi_fail(PI_ERR_INVALID_ARG, "rope: pos is NULL");
    if (x->ne[3] != 1) return pi_fail(PI_ERR_INVALID_ARG, "rope: x must be [head_dim, n_head, T] (3-d at most)");
    if (n_rot <= 0 || n_rot % 2 || n_rot > x->ne[0])
        return pi_fail(PI_ERR_INVALID_ARG, "rope: n_rot = %d must be even and in (0, %lld]", n_rot, (long long)x->ne[0]);
    if (!(freq_base > 0.0f) || !(freq_scale > 0.0f))
        return pi_fail(PI_ERR_INVALID_ARG, "rope: freq_base and freq_scale must be > 0");
    if (mode != PI_ROPE_NORMAL && mode != PI_ROPE_NEOX)
        return pi_fail(PI_ERR_INVALID_ARG, "rope: mode %d is not PI_ROPE_NORMAL (0) or PI_ROPE_NEOX (2)", mode);
    return pi_rope(pool, x, pos, n_rot, mode, freq_base, freq_scale, NULL, 1.0f, NULL, out);
}

pi_status pi_rope(pi_threadpool *pool, const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode,
                  float freq_base, float freq_scale, const float *freq_factors, float mscale, pi_rope_cache *cache,
                  pi_tensor *out) {
    pi_rope_table fresh = { 0 }, *tb = NULL;
    pi_status st = rope_table(pool, cache, &fresh, pos, x->ne[2], n_rot, freq_base, freq_scale, freq_factors, mscale,
                              &tb);
    if (st == PI_OK) {
        rope_args a = { x, mode, tb, out };
        pi_threadpool_run(pool, rope_task, &a);
    }
    free(fresh.pos);
    free(fresh.cs);
    return st;
}

/* ---- softmax -------------------------------------------------------------- */

static void softmax_row(float *y, const float *x, int64_t n) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) max = fmaxf(max, x[i]);
    if (max == -INFINITY) { for (int64_t i = 0; i < n; i++) y[i] = 0.0f; return; }
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) { y[i] = expf(x[i] - max); sum += y[i]; }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) y[i] *= inv;
}

typedef struct { const pi_tensor *x; pi_tensor *out; } unary_rows_args;

static void softmax_task(void *p, int ith, int nth) {
    unary_rows_args *a = p;
    const int64_t R = a->x->ne[1] * a->x->ne[2] * a->x->ne[3];
    int64_t r0, r1;
    split_range(R, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % a->x->ne[1], i2 = (r / a->x->ne[1]) % a->x->ne[2], i3 = r / (a->x->ne[1] * a->x->ne[2]);
        softmax_row(ROW_F32(a->out, i1, i2, i3), ROW_F32(a->x, i1, i2, i3), a->x->ne[0]);
    }
}

pi_status pi_op_softmax(pi_threadpool *pool, const pi_tensor *x, pi_tensor *out) {
    RETURN_IF(check_f32(x, "softmax x"));
    RETURN_IF(check_f32(out, "softmax out"));
    RETURN_IF(check_same_shape(x, out, "softmax"));
    unary_rows_args a = { x, out };
    pi_threadpool_run(pool, softmax_task, &a);
    return PI_OK;
}

/* ---- elementwise ---------------------------------------------------------- */

typedef struct { int32_t op; const pi_tensor *x; pi_tensor *out; } unary_args;

static void unary_task(void *p, int ith, int nth) {
    unary_args *a = p;
    const int64_t D = a->x->ne[0], R = a->x->ne[1] * a->x->ne[2] * a->x->ne[3];
    int64_t r0, r1;
    split_range(R, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % a->x->ne[1], i2 = (r / a->x->ne[1]) % a->x->ne[2], i3 = r / (a->x->ne[1] * a->x->ne[2]);
        const float *x = ROW_F32(a->x, i1, i2, i3);
        float *y = ROW_F32(a->out, i1, i2, i3);
        pi_cpu()->activation_row(a->op, D, x, y);
    }
}

pi_status pi_op_unary(pi_threadpool *pool, int32_t op, const pi_tensor *x, pi_tensor *out) {
    RETURN_IF(check_f32(x, "unary x"));
    RETURN_IF(check_f32(out, "unary out"));
    RETURN_IF(check_same_shape(x, out, "unary"));
    if (op != PI_UNARY_SILU && op != PI_UNARY_RELU && op != PI_UNARY_GELU)
        return pi_fail(PI_ERR_INVALID_ARG, "unary: unknown op %d", op);
    unary_args a = { op, x, out };
    pi_threadpool_run(pool, unary_task, &a);
    return PI_OK;
}

typedef struct { int32_t op; const pi_tensor *a, *b; pi_tensor *out; } binary_args;

static void binary_task(void *p, int ith, int nth) {
    binary_args *a = p;
    const pi_tensor *A = a->a, *B = a->b;
    const int64_t D = A->ne[0], R = A->ne[1] * A->ne[2] * A->ne[3];
    int64_t r0, r1;
    split_range(R, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % A->ne[1], i2 = (r / A->ne[1]) % A->ne[2], i3 = r / (A->ne[1] * A->ne[2]);
        const float *x = ROW_F32(A, i1, i2, i3);
        const float *y = ROW_F32(B, i1 % B->ne[1], i2 % B->ne[2], i3 % B->ne[3]);
        float *z = ROW_F32(a->out, i1, i2, i3);
        const int64_t ystep = B->ne[0] == 1 ? 0 : 1;
        if (a->op == PI_BINARY_ADD) for (int64_t i = 0; i < D; i++) z[i] = x[i] + y[i * ystep];
        else                        for (int64_t i = 0; i < D; i++) z[i] = x[i] * y[i * ystep];
    }
}

pi_status pi_op_binary(pi_threadpool *pool, int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out) {
    RETURN_IF(check_f32(a, "binary a"));
    RETURN_IF(check_f32(b, "binary b"));
    RETURN_IF(check_f32(out, "binary out"));
    RETURN_IF(check_same_shape(a, out, "binary"));
    if (op != PI_BINARY_ADD && op != PI_BINARY_MUL) return pi_fail(PI_ERR_INVALID_ARG, "binary: unknown op %d", op);
    for (int i = 0; i < PI_MAX_DIMS; i++)
        if (b->ne[i] != 1 && b->ne[i] != a->ne[i])
            return pi_fail(PI_ERR_INVALID_ARG, "binary: b dim %d (%lld) neither 1 nor %lld", i, (long long)b->ne[i],
                           (long long)a->ne[i]);
    binary_args args = { op, a, b, out };
    pi_threadpool_run(pool, binary_task, &args);
    return PI_OK;
}

/* ---- attention -------------------------------------------------------------
 * Per (token, head): scores over the visible cells, softmax, weighted sum of V rows. Masked cells (-inf) are
 * skipped entirely. A cache of any type is read as its values in f32 (exact for every cache type: f16, bf16 and
 * the 8-, 5- and 4-bit blocks), with f16's operations: a score is pi_vec_dot_f16_f32's order over the K row's values
 * and q in f32 (q is not quantized: a q8_0 cache's logits were 1.4x as far from the reference with q8_0 q), a V row
 * is added as pi_axpy_f16 adds. An f16 cache converts as it goes; other types' rows are converted by the type's
 * to_f32 into f32 rows first. A thread takes up to
 * ATT_HEADS heads of one token per pass and walks the cells once for all of them: the cache holds
 * a cell's heads side by side, so each cell is read as one run of ATT_HEADS * head_dim values
 * instead of one short row per head at a stride of the whole cell. Per head the arithmetic (and
 * the order of the cells) is the same either way. */

#define ATT_HEADS 16

/* One token (attend): on CPUs where pi_cpu_software_prefetch says so, each K and V row read is requested again
 * ATT_PREFETCH_CELLS cells ahead. A head's rows lie a whole cell (every head's row) apart, a pattern the hardware
 * prefetchers follow poorly: on a Zen 5, one token against 4096 cells of a 16-head, 128-dim f16 cache read 1.23x as
 * fast with it at 2 threads (1.46x at one), Gemma 3's one KV head at 8192 cells 2.3x, 32 heads at 2048 cells 1.14x;
 * 8, 16 and 32 cells ahead the same (bench/README.md, 2026-12-07). The same bits: only loads are added. */
#define ATT_PREFETCH_CELLS 16

typedef struct {
    const pi_tensor *q, *k, *v, *mask;
    float scale;
    float softcap;        /* 0, or the scores' soft cap (softmax_exp caps them before the mask) */
    const float *sinks;   /* [n_head] or NULL: each head's sink logit, a column without a value (softmax_exp's sink) */
    pi_tensor *out;
    float *scratch;       /* per thread (per_thread floats): [score rows][n_kv] scores, then for attend [4 + 8][hd] */
    int64_t per_thread;   /* score rows (ATT_HEADS heads of a token, or a prompt block's rows) x n_kv (+ 12 hd) */
    int block;            /* prompts: queries per block (attention_block) */
    int item_heads;       /* prompts: heads per work item (attention_item_heads) */
    int64_t *items;       /* prompts: thread i's work items are [items[i], items[i + 1]) */
} attention_args;

/* Rows of a cache type other than f16 and f32 as f32 (rows[k] becomes buf + k hd): the values every path reads. */
static inline void rows_to_f32(const pi_type_traits *tr, int64_t hd, int n, const void **rows, float *buf) {
    for (int k = 0; k < n; k++) {
        tr->to_f32(rows[k], buf + k * hd, hd);
        rows[k] = buf + k * hd;
    }
}

/* Heads h0 .. h0+nh-1 of token t; scores [nh][n_kv]. */
static void attend(const attention_args *a, int64_t t, int64_t h0, int64_t nh, float *scores) {
    const int64_t hd = a->q->ne[0], H = a->q->ne[1], n_kv = a->k->ne[2];
    const int64_t group = H / a->k->ne[1];
    const pi_type_traits *kt = pi_traits(a->k->type), *vt = pi_traits(a->v->type);
    const float *mask = a->mask ? ROW_F32(a->mask, t, 0, 0) : NULL;
    const float *q[ATT_HEADS];
    const char *kbase[ATT_HEADS], *vbase[ATT_HEADS];
    for (int64_t j = 0; j < nh; j++) {
        q[j] = ROW_F32(a->q, h0 + j, t, 0);
        kbase[j] = (const char *)a->k->data + (h0 + j) / group * a->k->nb[1];
        vbase[j] = (const char *)a->v->data + (h0 + j) / group * a->v->nb[1];
    }
    /* f16 rows as they are, f32 rows as they are, other types' rows converted to f32 rows (kbuf, vbuf: after the
     * scores in pi_attention's scratch; heads of one KV head convert a row once) */
    const bool k_half = a->k->type == PI_TYPE_F16, k_conv = !k_half && a->k->type != PI_TYPE_F32;
    const bool v_conv = a->v->type != PI_TYPE_F16 && a->v->type != PI_TYPE_F32;
    float *kbuf = scores + ATT_HEADS * n_kv, *vbuf = kbuf + 4 * hd;   /* [4][hd], [8][hd] */
    void (*const dot4)(int64_t, const void *const *, const float *, float *) =
        k_half ? pi_cpu()->vec_dot4_f16_f32 : pi_cpu()->vec_dot4_f32_f32;
    const int64_t ahead = pi_cpu_software_prefetch() ? ATT_PREFETCH_CELLS : 0;   /* cells; 0: none */
    const int64_t k_bytes = pi_row_bytes(a->k->type, hd), v_bytes = pi_row_bytes(a->v->type, hd);
    for (int64_t c = 0; c < n_kv; c++) {   /* raw scores of the visible cells, four at a time where possible */
        if (mask && mask[c] == -INFINITY) continue;
        const int n = c + 4 <= n_kv && (!mask || (mask[c + 1] != -INFINITY && mask[c + 2] != -INFINITY &&
                                                  mask[c + 3] != -INFINITY)) ? 4 : 1;
        if (k_half && n == 1) {   /* f16's one cell: its vec_dot (dot4's bits) */
            for (int64_t j = 0; j < nh; j++) scores[j * n_kv + c] = kt->vec_dot(hd, kbase[j] + c * a->k->nb[2], q[j]);
            continue;
        }
        const char *converted = NULL;   /* other types: the KV head whose rows kbuf holds */
        for (int64_t j = 0; j < nh; j++) {
            const void *rows[4];   /* one cell: its row four times, out[0] kept */
            for (int k = 0; k < 4; k++) rows[k] = kbase[j] + (c + (k < n ? k : 0)) * a->k->nb[2];
            if (ahead && c + n + ahead <= n_kv)
                pi_prefetch_rows((const char *)rows[0] + ahead * a->k->nb[2], n, a->k->nb[2], k_bytes);
            if (k_conv && converted != kbase[j]) {
                rows_to_f32(kt, hd, 4, rows, kbuf);
                converted = kbase[j];
            } else if (k_conv)   /* this KV head's rows are in kbuf already */
                for (int k = 0; k < 4; k++) rows[k] = kbuf + k * hd;
            if (n == 4) dot4(hd, rows, q[j], scores + j * n_kv + c);
            else {
                float out[4];
                dot4(hd, rows, q[j], out);
                scores[j * n_kv + c] = out[0];
            }
        }
        c += n - 1;
    }
    float inv[ATT_HEADS];
    bool any = false;
    for (int64_t j = 0; j < nh; j++) {
        memset(ROW_F32(a->out, h0 + j, t, 0), 0, (size_t)hd * sizeof(float));
        const float sum = pi_cpu()->softmax_exp(n_kv, scores + j * n_kv, mask, a->scale, a->softcap,
                                                a->sinks ? a->sinks[h0 + j] : -INFINITY);
        if (sum == 0.0f) { inv[j] = 0.0f; continue; }   /* nothing visible: output zeros */
        any = true;
        inv[j] = 1.0f / sum;
    }
    if (!any) return;
    /* out += p_c v_c in cell order, eight visible cells per pass (pi_axpy_rows: axpy8 where the type has it); rows
     * of types other than f16 and f32 converted, added by pi_axpy_f32 (pi_axpy_f16's operations on the values) */
    const pi_type_traits *at = v_conv ? pi_traits(PI_TYPE_F32) : vt;
    int64_t cells[8];
    int nv = 0;
    for (int64_t c = 0; c <= n_kv; c++) {
        if (c < n_kv) {
            if (scores[c] == -INFINITY) continue;   /* the same cells are visible for every head */
            cells[nv++] = c;
            if (nv < 8) continue;
        }
        const char *converted = NULL;
        for (int64_t j = 0; j < nh; j++) {
            float *out = ROW_F32(a->out, h0 + j, t, 0);
            const void *rows[8];
            float pc[8];
            for (int k = 0; k < nv; k++) {
                rows[k] = vbase[j] + cells[k] * a->v->nb[2];
                pc[k] = scores[j * n_kv + cells[k]] * inv[j];
                if (ahead && cells[k] + ahead < n_kv)
                    pi_prefetch_rows((const char *)rows[k] + ahead * a->v->nb[2], 1, 0, v_bytes);
            }
            if (v_conv && converted != vbase[j]) {
                rows_to_f32(vt, hd, nv, rows, vbuf);
                converted = vbase[j];
            } else if (v_conv)
                for (int k = 0; k < nv; k++) rows[k] = vbuf + k * hd;
            pi_axpy_rows(at, hd, nv, pc, rows, out);
        }
        nv = 0;
    }
}

/* Prompts (attend_block): heads h .. h+ng-1 of queries t0 .. t0+nt-1, nt ng <= ATT_ROWS_MAX rows of scores [n_kv].
 * The scores come from attn_qk (any K type; heads up to PI_ATT_QK_MAX_HD at the levels that have it), else from
 * scores_by_rows; a score of a cell a query does not see is computed and then dropped. Per (query, cell) that is
 * attend's score, and softmax and the V sum are attend's, query by query: the same bits as attend, whatever the
 * block's size. A block reads the head's K and V rows once, so the queries a block takes set how often a prompt
 * reads the cache: attention_block picks them per call. */
#define ATT_BLOCK_MIN 32
#define ATT_BLOCK_MAX 128
#define ATT_ROWS_MAX 128   /* a block's rows: its queries x the heads it takes */
_Static_assert(ATT_BLOCK_MIN % PI_DOT8_MAX_T == 0, "whole vec_dot8 calls per block");
#define ATT_SCORES_CAP ((int64_t)4 << 20)   /* scores a thread may hold beyond the smallest block: 16 MB */

/* Whether a prompt's scores go through attn_qk (a level that has it, heads it takes). */
static bool scores_by_qk_kernel(const pi_tensor *q) {
    return pi_cpu()->attn_qk && q->ne[0] <= PI_ATT_QK_MAX_HD;
}

/* Heads a work item takes: with scores by attn_qk and the V step by attn_pv, every query head of a KV head (the K
 * rows are transposed and the V rows converted once for all of them, and read once), else one. */
static int attention_item_heads(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v) {
    const int64_t group = q->ne[1] / k->ne[1];
    const bool kernels = scores_by_qk_kernel(q) && (v->type == PI_TYPE_F16 || q->ne[0] <= PI_ATT_PV_MAX_HD);
    return kernels && group > 1 && group * 8 <= ATT_ROWS_MAX ? (int)group : 1;
}

/* Scores [nt][n_kv] of queries t0 .. t0+nt-1 of head h (one head) without attn_qk (the scalar level, heads past
 * PI_ATT_QK_MAX_HD): an f16 K by its vec_dot8 / vec_dot (each group of 8 cells against sub-blocks of up to
 * PI_DOT8_MAX_T queries), any other type 4 cells at a time as attend scores them (rows converted once for the
 * block's queries, vec_dot4_f32_f32), each for the queries that see a cell of the group (mask[j]: query j's row of
 * the mask, NULL: no mask). kbuf: [4][hd] floats. Not inlined: inside attend_block it made the f16 path's prompts
 * 1.07x slower (Zen 5). */
static __attribute__((noinline)) void scores_by_rows(const attention_args *a, int64_t t0, int nt, int64_t h,
                                                     const char *kbase, const float *const *mask, float *kbuf,
                                                     float *scores) {
    const int64_t hd = a->q->ne[0], n_kv = a->k->ne[2];
    const pi_type_traits *kt = pi_traits(a->k->type);
    const char *q0 = (const char *)ROW_F32(a->q, h, t0, 0);
    const int64_t q_stride = a->q->nb[2];
    const bool half = a->k->type == PI_TYPE_F16, conv = !half && a->k->type != PI_TYPE_F32;
#define SEEN(j, c) (!mask[j] || mask[j][c] != -INFINITY)
    for (int64_t c = 0; c < n_kv;) {
        if (!half) {   /* 4 cells (or one, repeated) against each query that sees one of them */
            const int n = c + 4 <= n_kv ? 4 : 1;
            const void *rows[4];
            for (int k = 0; k < 4; k++) rows[k] = kbase + (c + (k < n ? k : 0)) * a->k->nb[2];
            if (conv) rows_to_f32(kt, hd, 4, rows, kbuf);
            for (int j = 0; j < nt; j++) {
                bool any = false;
                for (int64_t k = c; k < c + n && !any; k++) any = SEEN(j, k);
                if (!any) continue;
                float out[4];
                pi_cpu()->vec_dot4_f32_f32(hd, rows, (const float *)(q0 + j * q_stride), out);
                memcpy(scores + j * n_kv + c, out, (size_t)n * sizeof(float));
            }
            c += n;
            continue;
        }
        const int64_t len = kt->vec_dot8 && c + 8 <= n_kv ? 8 : 1;
        for (int j0 = 0; j0 < nt; j0 += PI_DOT8_MAX_T) {   /* sub-blocks of queries */
            const int n_sub = PI_MIN(PI_DOT8_MAX_T, nt - j0);
            bool any = false;
            for (int j = j0; j < j0 + n_sub && !any; j++)
                for (int64_t k = c; k < c + len && !any; k++) any = SEEN(j, k);
            if (any && len == 8) {
                const void *rows[8];
                for (int k = 0; k < 8; k++) rows[k] = kbase + (c + k) * a->k->nb[2];
                kt->vec_dot8(hd, rows, q0 + j0 * q_stride, q_stride, n_sub, scores + j0 * n_kv + c, n_kv);
            } else if (any) {
                for (int j = j0; j < j0 + n_sub; j++)
                    if (SEEN(j, c)) scores[j * n_kv + c] = kt->vec_dot(hd, kbase + c * a->k->nb[2], q0 + j * q_stride);
            }
        }
        c += len;
    }
#undef SEEN
}

/* Queries per block of a prompt of T queries against n_kv cells on nth threads, items of ng heads (units items per
 * block): the most of 128, 64, ... (down to 32, or to 8 for items of several heads) such that the block's rows fit
 * ATT_ROWS_MAX and (a) the cells before the prompt are at least 4x the block (under a causal mask a block computes
 * the scores of the cells only its later queries see: half a block per query, wasted), (b) every thread gets at
 * least 4 items to balance, and (c) a thread's scores stay within ATT_SCORES_CAP. A 542M llama's 512 queries (16
 * heads, f16 cache, 2 threads, Zen 5) against 32-query blocks: 128 took 0.79x the time at depth 3072, 0.77x at
 * 8192, 0.93x at 512; at depth 0 it took 1.06x (bench/README.md, 2026-12-07). */
static int attention_block(int64_t T, int64_t units, int ng, int64_t n_kv, int nth) {
    const int least = ng > 1 ? 8 : ATT_BLOCK_MIN;
    int b = ATT_BLOCK_MAX;
    while (b > least && (b * ng > ATT_ROWS_MAX || n_kv - T < 4 * b || (T + b - 1) / b * units < 4 * (int64_t)nth ||
                         (int64_t)b * ng * n_kv > ATT_SCORES_CAP))
        b /= 2;
    return b;
}

static void attend_block(const attention_args *a, int64_t t0, int nt, int64_t h, int ng, float *scores,
                         float *kbuf) {
    const int64_t hd = a->q->ne[0], n_kv = a->k->ne[2], group = a->q->ne[1] / a->k->ne[1];
    const pi_type_traits *kt = pi_traits(a->k->type), *vt = pi_traits(a->v->type);
    const char *kbase = (const char *)a->k->data + h / group * a->k->nb[1];   /* the ng heads share it */
    const char *vbase = (const char *)a->v->data + h / group * a->v->nb[1];
    const int nr = nt * ng;   /* rows: query j of head h + g is row j ng + g */
    const float *mask[ATT_ROWS_MAX];
    /* row r sees no cell outside [lo[r], hi[r]) (empty: lo = hi = n_kv); found once, used by all three steps */
    int64_t lo[ATT_ROWS_MAX], hi[ATT_ROWS_MAX];
#define SEEN(r, c) (!mask[r] || mask[r][c] != -INFINITY)
    for (int j = 0; j < nt; j++) {
        const int r0 = j * ng;
        mask[r0] = a->mask ? ROW_F32(a->mask, t0 + j, 0, 0) : NULL;
        int64_t first = 0, last = n_kv - 1;
        while (first < n_kv && !SEEN(r0, first)) first++;
        while (last > first && !SEEN(r0, last)) last--;
        for (int r = r0; r < r0 + ng; r++) {
            mask[r] = mask[r0];
            lo[r] = first;
            hi[r] = first == n_kv ? n_kv : last + 1;
        }
    }
    if (scores_by_qk_kernel(a->q)) {
        /* every query against the cells any of them sees (softmax_exp hides the others): attend's bits */
        const float *qr[ATT_ROWS_MAX];
        float *sr[ATT_ROWS_MAX];
        int64_t c0 = n_kv, c1 = 0;
        for (int r = 0; r < nr; r++) {
            qr[r] = ROW_F32(a->q, h + r % ng, t0 + r / ng, 0);
            sr[r] = scores + r * n_kv;
            if (lo[r] == n_kv) continue;   /* a row that sees nothing */
            c0 = PI_MIN(c0, lo[r]);
            c1 = PI_MAX(c1, hi[r]);
        }
        if (c0 < c1)
            pi_cpu()->attn_qk(hd, nr, qr, c0, c1, kbase, a->k->nb[2], a->k->type == PI_TYPE_F16 ? NULL : kt->to_f32,
                              sr);
    } else   /* one head (ng = 1): rows are queries */
        scores_by_rows(a, t0, nt, h, kbase, mask, kbuf, scores);
    float inv[ATT_ROWS_MAX], *out[ATT_ROWS_MAX];
    int live[ATT_ROWS_MAX], n_live = 0;   /* the rows that see any cell */
    for (int r = 0; r < nr; r++) {      /* softmax, as attend */
        out[r] = ROW_F32(a->out, h + r % ng, t0 + r / ng, 0);
        memset(out[r], 0, (size_t)hd * sizeof(float));
        const float sum = pi_cpu()->softmax_exp(n_kv, scores + r * n_kv, mask[r], a->scale, a->softcap,
                                                a->sinks ? a->sinks[h + r % ng] : -INFINITY);
        if (sum == 0.0f) continue;   /* nothing visible: output zeros */
        inv[r] = 1.0f / sum;
        live[n_live++] = r;
    }
    /* out_j += p_jc v_c over the cells query j sees, in cell order, p_jc = e_jc * (1 / sum) as attend computes it
     * (e_jc: softmax_exp's numerator; -inf where hidden): through attn_pv (which forms p_jc a block of cells at a
     * time, while the block's numerators are in cache; rows of types other than f16 as to_f32's values), or, for
     * f32 rows of heads past PI_ATT_PV_MAX_HD, query by query, 8 cells at a time (pi_axpy_rows); either way the
     * bits of attend's axpy per cell. */
    if (a->v->type == PI_TYPE_F16 || hd <= PI_ATT_PV_MAX_HD) {
        float *p[ATT_ROWS_MAX], *y[ATT_ROWS_MAX], inv_live[ATT_ROWS_MAX];
        int64_t c0 = n_kv, c1 = 0;   /* the cells some query sees are within [c0, c1) */
        for (int i = 0; i < n_live; i++) {
            p[i] = scores + live[i] * n_kv;
            inv_live[i] = inv[live[i]];
            y[i] = out[live[i]];
            c0 = PI_MIN(c0, lo[live[i]]);   /* a live query's numerators are -inf exactly where it sees nothing */
            c1 = PI_MAX(c1, hi[live[i]]);
        }
        if (n_live)
            pi_cpu()->attn_pv(hd, n_live, p, inv_live, c0, c1, vbase, a->v->nb[2],
                              a->v->type == PI_TYPE_F16 ? NULL : vt->to_f32, y);
    } else
        for (int i = 0; i < n_live; i++) {
            const float *e_row = scores + live[i] * n_kv, f = inv[live[i]];
            const void *rows[8];
            float pc[8];
            int nv = 0;
            for (int64_t c = 0; c <= n_kv; c++) {
                if (c < n_kv && e_row[c] == -INFINITY) continue;
                if (c < n_kv) {
                    rows[nv] = vbase + c * a->v->nb[2];
                    pc[nv++] = e_row[c] * f;
                }
                if (nv == 8 || (c == n_kv && nv)) {
                    pi_axpy_rows(vt, hd, nv, pc, rows, out[live[i]]);
                    nv = 0;
                }
            }
        }
#undef SEEN
}

static void attention_task(void *p, int ith, int nth) {
    attention_args *a = p;
    const int64_t H = a->q->ne[1], T = a->q->ne[2];
    float *scores = a->scratch + (size_t)ith * (size_t)a->per_thread;
    int64_t w0, w1;
    if (T > 1) {   /* prompts: work items of (a block of queries, item_heads heads), block by block */
        const int64_t units = H / a->item_heads;
        for (int64_t w = a->items[ith]; w < a->items[ith + 1]; w++) {
            const int64_t t0 = w / units * a->block;
            attend_block(a, t0, (int)PI_MIN(a->block, T - t0), w % units * a->item_heads, a->item_heads, scores,
                         scores + a->block * a->item_heads * a->k->ne[2]);
        }
        return;
    }
    split_range(T * H, ith, nth, &w0, &w1);
    for (int64_t w = w0; w < w1;) {
        const int64_t t = w / H, h = w % H, nh = PI_MIN(ATT_HEADS, PI_MIN(w1 - w, H - h));
        attend(a, t, h, nh, scores);
        w += nh;
    }
}

/* Cells query t sees (all of them without a mask). */
static int64_t visible_cells(const pi_tensor *mask, int64_t t, int64_t n_kv) {
    if (!mask) return n_kv;
    const float *m = ROW_F32(mask, t, 0, 0);
    int64_t n = 0;
    for (int64_t c = 0; c < n_kv; c++) n += m[c] != -INFINITY;
    return n;
}

/* The cost of query block b (of `block` queries): the cells its first and last queries see. */
static int64_t block_cost(const pi_tensor *mask, int64_t T, int block, int64_t b, int64_t n_kv) {
    return 1 + visible_cells(mask, b * block, n_kv) + visible_cells(mask, PI_MIN(T, (b + 1) * block) - 1, n_kv);
}

/* A prompt's work items (query block, heads), `units` of them per block, block-major, cut into one contiguous range
 * per thread of about equal cost: under a causal mask the later blocks see more (at depth 0 the second half of a
 * prompt has 3x the work of the first). Contiguous ranges measured faster than handing items out one by one (a 542M
 * llama, T = 512 at depth 4096: 0.8x the time). Thread i - 1's range ends at the first item whose predecessors cost
 * i / nth of the total. */
static void split_blocks(const pi_tensor *mask, int64_t T, int block, int64_t units, int64_t n_kv, int nth,
                         int64_t *items) {
    const int64_t n_blocks = (T + block - 1) / block;
    int64_t total = 0, done = 0;   /* done: the cost of the items before the current one */
    for (int64_t b = 0; b < n_blocks; b++) total += block_cost(mask, T, block, b, n_kv);
    int i = 1;
    items[0] = 0;
    for (int64_t b = 0; b < n_blocks && i < nth; b++) {
        const int64_t cost = block_cost(mask, T, block, b, n_kv);   /* the same for the block's items */
        for (int64_t u = 0; u < units; u++) {
            while (i < nth && done * nth >= total * units * i) items[i++] = b * units + u;
            done += cost;
        }
    }
    while (i <= nth) items[i++] = n_blocks * units;
}

pi_status pi_attention(pi_threadpool *pool, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                       const pi_tensor *mask, float scale, float softcap, const float *sinks, pi_tensor *out) {
    const int nth = pi_threadpool_size(pool);
    const int64_t n_kv = k->ne[2], T = q->ne[2];
    const int ng = attention_item_heads(q, k, v);
    const int block = attention_block(T, q->ne[1] / ng, ng, n_kv, nth);
    const int64_t score_rows = T > 1 ? block * ng : ATT_HEADS;
    const int64_t per_thread = score_rows * n_kv + 12 * q->ne[0];   /* + [4 + 8][hd]: converted K and V rows */
    float *scratch = malloc((size_t)nth * (size_t)per_thread * sizeof(float));
    int64_t *items = malloc((size_t)(nth + 1) * sizeof *items);
    if (!scratch || !items) {
        free(scratch);
        free(items);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "attention: out of memory for %lld cells", (long long)n_kv);
    }
    if (T > 1) split_blocks(mask, T, block, q->ne[1] / ng, n_kv, nth, items);
    attention_args a = { q, k, v, mask, scale, softcap, sinks, out, scratch, per_thread, block, ng, items };
    pi_threadpool_run(pool, attention_task, &a);
    free(scratch);
    free(items);
    return PI_OK;
}

pi_status pi_op_attention(pi_threadpool *pool, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                          const pi_tensor *mask, float scale, pi_tensor *out) {
    return pi_op_attention_softcap(pool, q, k, v, mask, scale, 0.0f, out);
}

pi_status pi_op_attention_softcap(pi_threadpool *pool, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                  const pi_tensor *mask, float scale, float softcap, pi_tensor *out) {
    return pi_op_attention_sinks(pool, q, k, v, mask, scale, softcap, NULL, out);
}

pi_status pi_op_attention_sinks(pi_threadpool *pool, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                const pi_tensor *mask, float scale, float softcap, const pi_tensor *sinks,
                                pi_tensor *out) {
    RETURN_IF(check_f32(q, "attention q"));
    RETURN_IF(pi_check_tensor(k, "attention k"));
    RETURN_IF(pi_check_tensor(v, "attention v"));
    RETURN_IF(check_f32(out, "attention out"));
    RETURN_IF(check_same_shape(q, out, "attention q/out"));
    RETURN_IF(check_same_shape(k, v, "attention k/v"));
    const pi_type_traits *kt = pi_traits(k->type), *vt = pi_traits(v->type);
    if (!kt || !kt->to_f32 || !vt || !vt->to_f32)
        return pi_fail(PI_ERR_UNSUPPORTED, "attention: no cache of k %s and v %s", pi_type_name(k->type),
                       pi_type_name(v->type));
    if (v->type != PI_TYPE_F16 && v->type != PI_TYPE_F32 && v->ne[0] > PI_ATT_PV_MAX_HD)
        return pi_fail(PI_ERR_UNSUPPORTED, "attention: a %s v with heads of %lld values (at most %d)",
                       pi_type_name(v->type), (long long)v->ne[0], PI_ATT_PV_MAX_HD);
    if (k->nb[0] != pi_type_block_bytes(k->type) || v->nb[0] != pi_type_block_bytes(v->type))
        return pi_fail(PI_ERR_INVALID_ARG, "attention: k and v rows must be contiguous");
    if (k->ne[0] != q->ne[0] || q->ne[3] != 1 || k->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "attention: head_dim of q (%lld) and k (%lld) differ",
                       (long long)q->ne[0], (long long)k->ne[0]);
    if (q->ne[1] % k->ne[1] != 0)
        return pi_fail(PI_ERR_INVALID_ARG, "attention: %lld query heads is not a multiple of %lld kv heads",
                       (long long)q->ne[1], (long long)k->ne[1]);
    if (mask) {
        RETURN_IF(check_f32(mask, "attention mask"));
        if (mask->ne[0] != k->ne[2] || mask->ne[1] != q->ne[2])
            return pi_fail(PI_ERR_INVALID_ARG, "attention: mask must be [%lld, %lld]", (long long)k->ne[2],
                           (long long)q->ne[2]);
    }
    if (!isfinite(scale)) return pi_fail(PI_ERR_INVALID_ARG, "attention: scale must be finite");
    if (!(softcap >= 0.0f && softcap < INFINITY))
        return pi_fail(PI_ERR_INVALID_ARG, "attention: softcap %g must be finite and >= 0 (0: none)", (double)softcap);
    if (sinks) {
        RETURN_IF(check_f32(sinks, "attention sinks"));
        if (sinks->ne[0] != q->ne[1] || sinks->ne[1] * sinks->ne[2] * sinks->ne[3] != 1)
            return pi_fail(PI_ERR_INVALID_ARG, "attention: sinks must be [%lld] (one per query head)",
                           (long long)q->ne[1]);
        for (int64_t h = 0; h < q->ne[1]; h++)
            if (!isfinite(((const float *)sinks->data)[h]))
                return pi_fail(PI_ERR_INVALID_ARG, "attention: sink %lld is not finite", (long long)h);
    }
    return pi_attention(pool, q, k, v, mask, scale, softcap, sinks ? sinks->data : NULL, out);
}

/* ---- gpt-oss's SwiGLU ---- */

typedef struct { const float *g; float *u; int64_t n; float alpha, limit; } swiglu_args;

static void swiglu_task(void *p, int ith, int nth) {
    swiglu_args *a = p;
    int64_t i0, i1;
    split_range((a->n + 63) / 64, ith, nth, &i0, &i1);   /* blocks of 64 elements */
    i0 = PI_MIN(a->n, i0 * 64);
    i1 = PI_MIN(a->n, i1 * 64);
    if (i1 > i0) pi_cpu()->swiglu_oai_row(i1 - i0, a->g + i0, a->u + i0, a->alpha, a->limit);
}

void pi_swiglu_oai(pi_threadpool *pool, const float *g, float *u, int64_t n, float alpha, float limit) {
    swiglu_args a = { g, u, n, alpha, limit };
    pi_threadpool_run(pool, swiglu_task, &a);
}

pi_status pi_op_swiglu_oai(pi_threadpool *pool, const pi_tensor *gate, pi_tensor *up, float alpha, float limit) {
    RETURN_IF(check_f32(gate, "swiglu_oai gate"));
    RETURN_IF(check_f32(up, "swiglu_oai up"));
    RETURN_IF(check_same_shape(gate, up, "swiglu_oai"));
    if (!isfinite(alpha) || !(limit >= 0.0f && limit < INFINITY))
        return pi_fail(PI_ERR_INVALID_ARG, "swiglu_oai: alpha %g must be finite and limit %g finite and >= 0",
                       (double)alpha, (double)limit);
    const int64_t n = pi_nelements(up);
    for (int i = 1; i < PI_MAX_DIMS; i++)   /* one run of elements each */
        if (gate->nb[i] != gate->nb[i - 1] * gate->ne[i - 1] || up->nb[i] != up->nb[i - 1] * up->ne[i - 1])
            return pi_fail(PI_ERR_INVALID_ARG, "swiglu_oai: gate and up must be contiguous");
    pi_swiglu_oai(pool, gate->data, up->data, n, alpha, limit);
    return PI_OK;
}

/* ---- Apertus's xIELU ---- */

typedef struct { float *x; int64_t n; const float *p; } xielu_args;

static void xielu_task(void *p, int ith, int nth) {
    xielu_args *a = p;
    const float an = a->p[0], ap = a->p[1], beta = a->p[2], eps = a->p[3];
    int64_t i0, i1;
    split_range(a->n, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        const float x = a->x[i];
        a->x[i] = x > 0.0f ? ap * x * x + beta * x : (expm1f(fminf(x, eps)) - x) * an + beta * x;
    }
}

void pi_xielu(pi_threadpool *pool, float *x, int64_t n, const float *p) {
    xielu_args a = { x, n, p };
    pi_threadpool_run(pool, xielu_task, &a);
}

pi_status pi_op_xielu(pi_threadpool *pool, pi_tensor *x, const float *p) {
    RETURN_IF(check_f32(x, "xielu x"));
    if (!p) return pi_fail(PI_ERR_INVALID_ARG, "xielu: NULL parameters");
    for (int i = 1; i < PI_MAX_DIMS; i++)
        if (x->nb[i] != x->nb[i - 1] * x->ne[i - 1]) return pi_fail(PI_ERR_INVALID_ARG, "xielu: x must be contiguous");
    pi_xielu(pool, x->data, pi_nelements(x), p);
    return PI_OK;
}

/* ---- soft-capping (Gemma 2's logits) ---- */

typedef struct { float *x; int64_t n; float cap; } softcap_args;

static void softcap_task(void *p, int ith, int nth) {
    const softcap_args *a = p;
    int64_t i0, i1;
    split_range(a->n, ith, nth, &i0, &i1);
    if (i1 > i0) pi_cpu()->softcap_row(i1 - i0, a->x + i0, a->x + i0, 1.0f, a->cap);
}

void pi_softcap(pi_threadpool *pool, float *x, int64_t n, float cap) {
    softcap_args a = { x, n, cap };
    pi_threadpool_run(pool, softcap_task, &a);
}

typedef struct { const pi_tensor *x; pi_tensor *out; float cap; } softcap_rows_args;

static void softcap_rows_task(void *p, int ith, int nth) {
    const softcap_rows_args *a = p;
    const int64_t D = a->x->ne[0], R = a->x->ne[1] * a->x->ne[2] * a->x->ne[3];
    int64_t r0, r1;
    split_range(R, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % a->x->ne[1], i2 = (r / a->x->ne[1]) % a->x->ne[2], i3 = r / (a->x->ne[1] * a->x->ne[2]);
        pi_cpu()->softcap_row(D, ROW_F32(a->x, i1, i2, i3), ROW_F32(a->out, i1, i2, i3), 1.0f, a->cap);
    }
}

pi_status pi_op_softcap(pi_threadpool *pool, const pi_tensor *x, float cap, pi_tensor *out) {
    RETURN_IF(check_f32(x, "softcap x"));
    RETURN_IF(check_f32(out, "softcap out"));
    RETURN_IF(check_same_shape(x, out, "softcap"));
    if (!(cap > 0.0f && cap < INFINITY))
        return pi_fail(PI_ERR_INVALID_ARG, "softcap: cap %g must be finite and > 0", (double)cap);
    softcap_rows_args a = { x, out, cap };
    pi_threadpool_run(pool, softcap_rows_task, &a);
    return PI_OK;
}
