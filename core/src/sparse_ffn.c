/* sparse_ffn.c: PowerInfer's predictor-guided FFN.
 *
 *   scores = fc2 relu(fc1 x_pred)                         (the predictor, dense and small)
 *   neuron i runs for token t  iff  scores[i, t] >= threshold
 *   h[i, t] = act(gate_i . x_t) * (up_i . x_t + b_up[i])  only for running (i, t), else 0 (b_up: opt)
 *   out[:, t] = sum_i h[i, t] * down_t[i, :] + b_down      axpy over rows of the transposed down matrix
 *
 * The sum over neurons has one fixed order, whatever the batch or the thread count: the neurons
 * fall into ranges of SPARSE_RANGE consecutive indices; a range's partial sum p_r starts at 0 and
 * adds its rows with h != 0 in index order (fma per element, as traits->axpy; or, for a type with
 * axpy_group such as the packed Q4_0R rows, in consecutive groups of PI_AXPY_GROUP, each one integer
 * sum; for the packed Q4_0C / Q4_KC / Q6_KC layouts of a file's own down matrix, each block of 32 / super-block
 * of 256 neurons' rows as one group); out = ((0 + p_0) + p_1) + ... over the ranges in order.
 *
 * The gate given (activation sparsity, tools/sparsify.py; CATS): with w->gate.data NULL and a gated mode
 * (PI_FFN_PAR/SYM) the scores ARE the gate's pre-activation values g = gate x, computed densely by the
 * caller; neuron i runs for token t iff |act(g[i, t])| * act_scale[i] >= threshold (act_scale NULL: 1), and h uses g
 * as it is (only up and down_t rows are read per neuron).
 *
 * Everything given (an input-sparse matmul, TEAL): with w->up.data NULL too (and gate_mode PI_FFN_SEQ)
 * h IS the scores: out[:, t] = sum over i with |scores[i, t]| >= threshold of scores[i, t] * down_t[i, :],
 * where down_t is any transposed matrix [n_out, n_in] (row i = input i's column) and x is unused.
 *
 * One token (decode) runs fused: a task is one range, its 8-neuron groups are gathered (gate/up dot
 * products) and their down_t rows added to the range's partial right away, so each neuron's rows are
 * read together, once; a last pass adds the partials. A batch of T tokens gathers the union U of the
 * neurons active for any token once: a row active for enough of the tokens is dotted against all of them in a
 * group (16 rows on AMX tiles, or 8 by the 8-row kernel), a rarely active one for its active pairs alone
 * (gather_rows_split); then the down step splits the output columns between threads; a range's rows stay in
 * cache while every token adds them, so each down_t row comes from memory once. */
#include "internal.h"
#include "backend.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define GATHER_CHUNK 32     /* neurons per work item in the gather step (a multiple of 8) */
#ifndef GATHER_SPLIT_CHUNK
#define GATHER_SPLIT_CHUNK 128   /* the same split by activity: enough rows that the grouped ones fill groups of 16
                                  * (256: within 2% on the 7B ReLU file's prompts) */
#endif
/* a batch's union row is dotted against every token in a group (tiles, 8-row kernel) if active for at least 1 / share
 * of its tokens, else for its active pairs alone (gather_rows_split). Measured on the 7B ReLU file (Sapphire Rapids,
 * pp16/64/256): tiles 1/4, 1/8, 1/16 about the same; the 8-row kernel (avx512 and avx2 levels) 1/2 and 1/4 alike,
 * 1/8 5-10% slower */
#ifndef TILES_MIN_SHARE
#define TILES_MIN_SHARE 8
#endif
#ifndef ROWS8_MIN_SHARE
#define ROWS8_MIN_SHARE 4
#endif
#define COLUMN_ALIGN 32     /* output column ranges start at block boundaries (or at the larger weight block) */
#define SPARSE_RANGE 512    /* neurons per partial sum of the down step (fixes the summation order) */
#define PREFETCH_LINES 4    /* first cache lines of the next 8 neurons requested ahead (fused path) */
#ifndef COLUMN_TILE
#define COLUMN_TILE 1024    /* output columns per pass of the batched down step (a multiple of 256; 2048: the same) */
#endif
#define TILES_CHUNK_T 64    /* tokens per tile kernel call of the gather (16 rows' u and g of them on the stack) */

typedef struct {
    const pi_sparse_ffn_weights *w;
    int32_t act, mode;
    const pi_tensor *x, *scores;
    float threshold;
    const uint8_t *skip; /* [F] neurons left out (computed by another backend), NULL: none */
    bool gate_given;     /* the scores are the gate's values (see the top of the file) */
    bool h_given;        /* the scores are h (an input-sparse matmul) */
    pi_tensor *out;
    int64_t E, F, T;     /* E: x's length, F: rows of down_t, T: tokens */
    int64_t E_out;       /* out's length: down_t's row length (E, except for an input-sparse matmul) */
    /* scratch */
    uint8_t *active;     /* [T][F] */
    int32_t *count;      /* [F] tokens for which neuron i is active */
    int32_t *rows;       /* [nU] union of active neurons, ascending */
    int64_t  n_rows;
    int64_t *range_start;/* [n_ranges + 1] range r's rows are rows[range_start[r] .. range_start[r + 1]) */
    int64_t  n_ranges;
    float   *partial;    /* [n_ranges][E] one token's partial sums (fused path) */
    float   *h;          /* [T][nU] */
    char    *xq_gate, *xq_up;          /* [T] activation rows in the weights' vec_dot types */
    int64_t  xq_gate_bytes, xq_up_bytes;
    int32_t  group_min_count;          /* a batch: rows active for fewer tokens go token by token (0: no split) */
    char    *xs;         /* tiles: [T16] activation rows in the tile kernels' type, NULL: no tiles (gather_tiles) */
    int64_t  xs_bytes, T16;            /* T16: the tokens of whole tiles */
    char    *xt;         /* tiles: the tile table of the T16 tokens, xt_stride bytes per token tile */
    int64_t  xt_stride;
    atomic_llong next;
} sparse_args;

void pi_gate_scores(int32_t act, int64_t n, const float *g, const float *w, float *out) {
    pi_cpu()->activation_row(act, n, g, out);
    if (w)   /* the channel's weight (exact where every weight is 1) */
        for (int64_t k = 0; k < n; k++) out[k] *= w[k];
}

static void select_task(void *p, int ith, int nth) {
    sparse_args *a = p;
    const int64_t per = (a->F + nth - 1) / nth, i0 = PI_MIN(a->F, per * ith), i1 = PI_MIN(a->F, i0 + per);
    for (int64_t i = i0; i < i1; i++) a->count[i] = 0;
    for (int64_t t = 0; t < a->T; t++) {
        const float *s = (const float *)((const char *)a->scores->data + t * a->scores->nb[1]);
        uint8_t *act = a->active + t * a->F;
        if (a->h_given)
            for (int64_t i = i0; i < i1; i++) {
                act[i] = fabsf(s[i]) >= a->threshold && !(a->skip && a->skip[i]);
                a->count[i] += act[i];
            }
        else if (a->gate_given)
            for (int64_t c = i0; c < i1; c += 256) {   /* act(g) a row at a time: the dense FFN's bits */
                float v[256];
                const int64_t n = PI_MIN(256, i1 - c);
                pi_gate_scores(a->act, n, s + c, a->w->act_scale ? a->w->act_scale + c : NULL, v);
                for (int64_t k = 0; k < n; k++) {
                    act[c + k] = fabsf(v[k]) >= a->threshold && !(a->skip && a->skip[c + k]);
                    a->count[c + k] += act[c + k];
                }
            }
        else if (a->skip)
            for (int64_t i = i0; i < i1; i++) {
                act[i] = s[i] >= a->threshold && !a->skip[i];
                a->count[i] += act[i];
            }
        else
            for (int64_t i = i0; i < i1; i++) {
                act[i] = s[i] >= a->threshold;
                a->count[i] += act[i];
            }
    }
}

/* The activations in the gate's and up's vec_dot types (once when they share it), tokens striped over
 * the threads. */
static void convert(sparse_args *a, int ith, int nth) {
    for (int64_t t = ith; t < a->T && !a->h_given; t += nth) {
        const float *x = (const float *)((const char *)a->x->data + t * a->x->nb[1]);
        if (a->xq_gate && a->xq_gate != a->xq_up)
            pi_traits(pi_traits(a->w->gate.type)->vec_dot_type)->from_f32(x, a->xq_gate + t * a->xq_gate_bytes, a->E);
        pi_traits(pi_traits(a->w->up.type)->vec_dot_type)->from_f32(x, a->xq_up + t * a->xq_up_bytes, a->E);
        if (a->xs && t < a->T16) {
            const pi_type_traits *xtr = pi_traits(pi_tiles_act_type(pi_traits(a->w->up.type)));
            char *row = a->xs + t * a->xs_bytes;
            xtr->from_f32(x, row, a->E);
            xtr->tiles_prep(a->E, row, (int)(t % PI_TILE_T), a->xt + t / PI_TILE_T * a->xt_stride);
        }
    }
}

static void select_convert_task(void *p, int ith, int nth) {
    select_task(p, ith, nth);
    convert(p, nth - 1 - ith, nth);   /* for one token the conversion goes to the last thread */
}

/* h of n <= 8 neurons (ids) for one token, from their up (and gate) dot products; the activations in one
 * activation_row call (an element's result does not depend on its place in the row, arch/activation.c). */
static void combine(const sparse_args *a, int n, const int32_t *ids, const float *u_in, const float *g, float *h) {
    float u[8], act_g[8], act_u[8];
    for (int k = 0; k < n; k++) u[k] = a->w->up_bias ? u_in[k] + a->w->up_bias[ids[k]] : u_in[k];
    const pi_cpu_kernels *cpu = pi_cpu();
    switch (a->mode) {
        case PI_FFN_PAR:
            cpu->activation_row(a->act, n, g, act_g);
            for (int k = 0; k < n; k++) h[k] = act_g[k] * u[k];
            break;
        case PI_FFN_SYM:
            cpu->activation_row(a->act, n, g, act_g);
            cpu->activation_row(a->act, n, u, act_u);
            for (int k = 0; k < n; k++) h[k] = act_g[k] * act_u[k];
            break;
        default:
            cpu->activation_row(a->act, n, u, h);
    }
}

static float gate_value(const sparse_args *a, int64_t i, int64_t t) {
    return ((const float *)((const char *)a->scores->data + t * a->scores->nb[1]))[i];
}

/* The up (and gate) rows of the union rows at positions js[0..n). */
static void union_rows(const sparse_args *a, const int32_t *js, int n, const void **up, const void **gate) {
    for (int k = 0; k < n; k++) {
        const int64_t i = a->rows[js[k]];
        up[k] = (const char *)a->w->up.data + i * a->w->up.nb[1];
        gate[k] = a->xq_gate ? (const char *)a->w->gate.data + i * a->w->gate.nb[1] : NULL;
    }
}

/* h of the union rows at js[0..n) (n a multiple of 8) for token t from their up (and gate) values; 0 for the
 * inactive pairs. */
static void store_h(const sparse_args *a, const int32_t *js, int n, int64_t t, const float *u, const float *g) {
    for (int k0 = 0; k0 < n; k0 += 8) {
        int32_t ids[8];
        float h[8];
        for (int k = 0; k < 8; k++) ids[k] = a->rows[js[k0 + k]];
        combine(a, 8, ids, u + k0, g + k0, h);
        for (int k = 0; k < 8; k++) a->h[t * a->n_rows + js[k0 + k]] = a->active[t * a->F + ids[k]] ? h[k] : 0.0f;
    }
}

/* 8 gathered rows (positions js) x the tokens from t_begin on with the 8-row kernels (same bits as vec_dot). */
static void gather8(const sparse_args *a, const int32_t *js, int64_t t_begin) {
    const pi_sparse_ffn_weights *w = a->w;
    const void *up[8], *gate[8];
    union_rows(a, js, 8, up, gate);
    for (int64_t t0 = t_begin; t0 < a->T; t0 += PI_DOT8_MAX_T) {
        const int nt = (int)PI_MIN(PI_DOT8_MAX_T, a->T - t0);
        float u[PI_DOT8_MAX_T][8], g[PI_DOT8_MAX_T][8] = { { 0 } };
        if (a->xq_gate)   /* gate first: in the packed layout a neuron's up row follows its gate row */
            pi_traits(w->gate.type)->vec_dot8(a->E, gate, a->xq_gate + t0 * a->xq_gate_bytes, a->xq_gate_bytes, nt,
                                              g[0], 8);
        else if (a->gate_given)
            for (int t = 0; t < nt; t++)
                for (int k = 0; k < 8; k++) g[t][k] = gate_value(a, a->rows[js[k]], t0 + t);
        pi_traits(w->up.type)->vec_dot8(a->E, up, a->xq_up + t0 * a->xq_up_bytes, a->xq_up_bytes, nt, u[0], 8);
        for (int t = 0; t < nt; t++) store_h(a, js, 8, t0 + t, u[t], g[t]);
    }
}

/* 16 gathered rows (positions js) x the batch's whole token tiles on the AMX tile kernels (same bits as vec_dot). */
static void gather16_tiles(const sparse_args *a, const int32_t *js) {
    const pi_sparse_ffn_weights *w = a->w;
    const void *up[16], *gate[16];
    union_rows(a, js, 16, up, gate);
    for (int64_t t0 = 0; t0 < a->T16; t0 += TILES_CHUNK_T) {
        const int nt = (int)PI_MIN(TILES_CHUNK_T, a->T16 - t0);
        float u[TILES_CHUNK_T][16], g[TILES_CHUNK_T][16];
        const char *xs = a->xs + t0 * a->xs_bytes, *xt = a->xt + t0 / PI_TILE_T * a->xt_stride;
        if (a->xq_gate)
            pi_traits(w->gate.type)->tiles_rows(a->E, gate, xs, a->xs_bytes, nt, g[0], 16, xt, a->xt_stride);
        else
            for (int t = 0; t < nt; t++)
                for (int k = 0; k < 16; k++) g[t][k] = a->gate_given ? gate_value(a, a->rows[js[k]], t0 + t) : 0.0f;
        pi_traits(w->up.type)->tiles_rows(a->E, up, xs, a->xs_bytes, nt, u[0], 16, xt, a->xt_stride);
        for (int t = 0; t < nt; t++) store_h(a, js, 16, t0 + t, u[t], g[t]);
    }
}

/* One union row (position j), token by token: dot products for the active pairs only, 0 for the others. */
static void gather_one(const sparse_args *a, int64_t j) {
    const pi_sparse_ffn_weights *w = a->w;
    const pi_vec_dot_fn dot_up = pi_traits(w->up.type)->vec_dot;
    const pi_vec_dot_fn dot_gate = a->xq_gate ? pi_traits(w->gate.type)->vec_dot : NULL;
    const int64_t i = a->rows[j];
    const char *up_row = (const char *)w->up.data + i * w->up.nb[1];
    const char *gate_row = dot_gate ? (const char *)w->gate.data + i * w->gate.nb[1] : NULL;
    for (int64_t t = 0; t < a->T; t++) {
        float h = 0.0f;
        if (a->active[t * a->F + i]) {
            const float g = dot_gate     ? dot_gate(a->E, gate_row, a->xq_gate + t * a->xq_gate_bytes)
                            : a->gate_given ? gate_value(a, i, t) : 0.0f;
            const float u = dot_up(a->E, up_row, a->xq_up + t * a->xq_up_bytes);
            combine(a, 1, &a->rows[j], &u, &g, &h);
        }
        a->h[t * a->n_rows + j] = h;
    }
}

/* h of the union rows [j0, j1) for every token: 8 at a time where the types have 8-row kernels. */
static void gather_rows(const sparse_args *a, int64_t j0, int64_t j1) {
    const pi_sparse_ffn_weights *w = a->w;
    if (a->h_given) {   /* h = the scores of the active pairs */
        for (int64_t j = j0; j < j1; j++)
            for (int64_t t = 0; t < a->T; t++)
                a->h[t * a->n_rows + j] = a->active[t * a->F + a->rows[j]] ? gate_value(a, a->rows[j], t) : 0.0f;
        return;
    }
    const bool rows8 = pi_traits(w->up.type)->vec_dot8 && (!a->xq_gate || pi_traits(w->gate.type)->vec_dot8);
    int64_t j = j0;
    if (rows8)
        for (; j + 8 <= j1; j += 8) {
            int32_t js[8];
            for (int k = 0; k < 8; k++) js[k] = (int32_t)(j + k);
            gather8(a, js, 0);
        }
    for (; j < j1; j++) gather_one(a, j);
}

/* The same for a batch whose types have 8-row kernels: the rows active for at least group_min_count of its tokens
 * in groups over every token (16 on the tile kernels where the batch has them, gather_tiles, the token tail by the
 * 8-row kernel; else 8 by the 8-row kernel), the others token by token for their active pairs alone: a group
 * computes every token of its rows, and in a ReLU model's batch most union rows are active for a few tokens (7B
 * file, 128 tokens: union 88% of the rows, half of them active for at most 6 tokens). */
static void gather_rows_split(const sparse_args *a, int64_t j0, int64_t j1) {
    int32_t js[GATHER_SPLIT_CHUNK];
    int n = 0;
    for (int64_t j = j0; j < j1; j++) {
        if (a->count[a->rows[j]] >= a->group_min_count) js[n++] = (int32_t)j;
        else gather_one(a, j);
    }
    int k = 0;
    if (a->xs)
        for (; k + 16 <= n; k += 16) {
            gather16_tiles(a, js + k);
            gather8(a, js + k, a->T16);
            gather8(a, js + k + 8, a->T16);
        }
    for (; k + 8 <= n; k += 8) gather8(a, js + k, 0);
    for (; k < n; k++) gather_one(a, js[k]);
}

static void gather_task(void *p, int ith, int nth) {
    PI_UNUSED(ith); PI_UNUSED(nth);
    sparse_args *a = p;
    pi_tile_session session;
    if (a->xs) pi_cpu()->tiles_begin(a->w->up.type, &session);
    const int64_t chunk = a->group_min_count ? GATHER_SPLIT_CHUNK : GATHER_CHUNK;
    for (;;) {
        const int64_t j0 = atomic_fetch_add(&a->next, 1) * chunk;
        if (j0 >= a->n_rows) break;
        if (a->group_min_count) gather_rows_split(a, j0, PI_MIN(a->n_rows, j0 + chunk));
        else gather_rows(a, j0, PI_MIN(a->n_rows, j0 + chunk));
    }
    if (a->xs) pi_cpu()->tiles_end(&session);
}

/* Adds the rows with coef != 0 to y (n columns from column c0 on) in order: for a column-block layout (Q4_0C, Q4_KC,
 * Q6_KC: built from the file's down matrix, arch/q4_0c.c, arch/kc.c) the rows of one unit (32 or 256 neurons) as one
 * group through axpy_cols; else in groups of PI_AXPY_GROUP where the type has axpy_group (Q4_0R: one integer sum per
 * group, arch/q4_0r.c), else eight at a time where it has axpy8 (which loads and stores y once per eight rows; same
 * bits as eight axpy calls). The groups are the range's rows with h != 0, in order: the same for one token and a
 * batch. */
typedef struct {
    const pi_tensor *d;          /* down_t */
    const pi_type_traits *tr;
    const char *aux;             /* column layouts: their per-unit data (down_t_scales) */
    int64_t c0, n;               /* the columns [c0, c0 + n) */
    int64_t c0_bytes;            /* where column c0 starts in a row */
    float *y;
    const void *rows[PI_COLS_MAX];
    float coef[PI_COLS_MAX];
    uint8_t idx[PI_COLS_MAX];    /* column layouts: the rows' places in their unit */
    int count;
    int64_t unit;                /* column layouts: the queued rows' unit */
} axpy_queue;

static axpy_queue queue_init(const sparse_args *a, int64_t c0, int64_t n, float *y) {
    const pi_tensor *d = &a->w->down_t;
    const pi_type_traits *tr = pi_traits(d->type);
    return (axpy_queue){ .d = d, .tr = tr, .aux = a->w->down_t_scales, .c0 = c0, .n = n,
                         .c0_bytes = c0 / tr->block_size * tr->block_bytes, .y = y };
}

static int queue_capacity(const axpy_queue *q) {
    return q->tr->axpy_cols ? q->tr->cols_unit : q->tr->axpy_group ? PI_AXPY_GROUP : 8;
}

static void queue_flush(axpy_queue *q) {
    if (q->tr->axpy_cols) {
        const int64_t at = q->tr->cols_aux * (q->unit * q->d->ne[0] + q->c0);   /* the unit's aux from column c0 */
        if (q->count) q->tr->axpy_cols(q->n, q->count, q->idx, q->coef, q->aux + at, q->rows, q->y);
    } else {
        pi_axpy_rows(q->tr, q->n, q->count, q->coef, q->rows, q->y);
    }
    q->count = 0;
}

/* Queues row i of down_t with coefficient coef. */
static void queue_push(axpy_queue *q, int64_t i, float coef) {
    if (coef == 0.0f) return;
    if (q->tr->axpy_cols) {
        if (q->count && i / q->tr->cols_unit != q->unit) queue_flush(q);
        q->unit = i / q->tr->cols_unit;
        q->idx[q->count] = (uint8_t)(i % q->tr->cols_unit);
    }
    q->rows[q->count] = (const char *)q->d->data + i * q->d->nb[1] + q->c0_bytes;
    q->coef[q->count++] = coef;
    if (q->count == queue_capacity(q)) queue_flush(q);
}

/* One token, fused: a task is a range; h of its 8-neuron groups, then their down_t rows into the
 * range's partial. In the packed layout (pi_sparse_pack) a neuron's gate, up and down_t rows are
 * one contiguous run, read here as eight concurrent streams; the next group's streams are started
 * early with a few prefetches. */
static void fused_task(void *p, int ith, int nth) {
    PI_UNUSED(ith); PI_UNUSED(nth);
    sparse_args *a = p;
    const pi_tensor *d = &a->w->down_t;
    const pi_tensor *first = a->xq_gate ? &a->w->gate : a->h_given ? d : &a->w->up;   /* a neuron's first row */
    for (;;) {
        const int64_t r = atomic_fetch_add(&a->next, 1);
        if (r >= a->n_ranges) return;
        const int64_t j0 = a->range_start[r], j1 = a->range_start[r + 1];
        if (j0 == j1) continue;   /* no row: the reduction skips the range */
        float *y = a->partial + r * a->E_out;
        memset(y, 0, (size_t)a->E_out * sizeof(float));
        axpy_queue q = queue_init(a, 0, a->E_out, y);
        for (int64_t j = j0; j < j1; j += 8) {
            for (int64_t k = j + 8; k < PI_MIN(j1, j + 16); k++) {   /* start the next group's row streams */
                const char *next = (const char *)first->data + a->rows[k] * first->nb[1];
                for (int l = 0; l < PREFETCH_LINES; l++) __builtin_prefetch(next + 64 * l);
            }
            gather_rows(a, j, PI_MIN(j1, j + 8));
            for (int64_t k = j; k < PI_MIN(j1, j + 8); k++)
                queue_push(&q, a->rows[k], a->h[k]);
        }
        queue_flush(&q);
    }
}

/* out = ((0 + p_0) + p_1) + ... over the ranges that have rows, columns split between threads. */
static void reduce_task(void *p, int ith, int nth) {
    sparse_args *a = p;
    const int64_t n_units = (a->E_out + COLUMN_ALIGN - 1) / COLUMN_ALIGN, per = (n_units + nth - 1) / nth;
    const int64_t e0 = PI_MIN(a->E_out, per * ith * COLUMN_ALIGN), e1 = PI_MIN(a->E_out, e0 + per * COLUMN_ALIGN);
    float *o = a->out->data;
    for (int64_t e = e0; e < e1; e++) o[e] = 0.0f;
    for (int64_t r = 0; r < a->n_ranges; r++) {
        if (a->range_start[r] == a->range_start[r + 1]) continue;
        const float *y = a->partial + r * a->E_out;
        for (int64_t e = e0; e < e1; e++) o[e] += y[e];
    }
    if (a->w->down_bias)
        for (int64_t e = e0; e < e1; e++) o[e] += a->w->down_bias[e];
}

/* The batched down step: each thread owns output columns [e0, e1) of every token, in tiles of
 * COLUMN_TILE; per (range, token) the range's rows with h != 0 are listed once (branch-free: which pairs are
 * active is random), then per column tile they go into a partial that is added to the output: the same
 * arithmetic per element as the fused path. A range's rows (over the thread's columns) stay in cache while
 * every token adds them. */
static void down_task(void *p, int ith, int nth) {
    sparse_args *a = p;
    const pi_tensor *d = &a->w->down_t;
    const pi_type_traits *tr = pi_traits(d->type);
    /* this thread's output columns [e0, e1), aligned to whole blocks */
    const int64_t align = PI_MAX(COLUMN_ALIGN, tr->block_size);   /* K-quant rows: blocks of 256 */
    const int64_t n_units = (a->E_out + align - 1) / align;
    const int64_t per = (n_units + nth - 1) / nth;
    const int64_t e0 = PI_MIN(a->E_out, per * ith * align), e1 = PI_MIN(a->E_out, e0 + per * align);
    float part[COLUMN_TILE];
    int32_t list[SPARSE_RANGE];   /* a range's union rows (at most SPARSE_RANGE) with h != 0 for one token */
    for (int64_t t = 0; t < a->T; t++)
        memset((char *)a->out->data + t * a->out->nb[1] + e0 * sizeof(float), 0, (size_t)PI_MAX(0, e1 - e0) * sizeof(float));
    for (int64_t r = 0; r < a->n_ranges && e0 < e1; r++)
        for (int64_t t = 0; t < a->T; t++) {
            const float *h = a->h + t * a->n_rows;
            int n = 0;
            for (int64_t j = a->range_start[r]; j < a->range_start[r + 1]; j++) {
                list[n] = (int32_t)j;
                n += h[j] != 0.0f;
            }
            if (n == 0) continue;
            float *y = (float *)((char *)a->out->data + t * a->out->nb[1]);
            for (int64_t c0 = e0; c0 < e1; c0 += COLUMN_TILE) {
                const int64_t c1 = PI_MIN(e1, c0 + COLUMN_TILE);
                axpy_queue q = queue_init(a, c0, c1 - c0, part);
                memset(part, 0, (size_t)(c1 - c0) * sizeof(float));
                for (int k = 0; k < n; k++) queue_push(&q, a->rows[list[k]], h[list[k]]);
                queue_flush(&q);
                for (int64_t e = 0; e < c1 - c0; e++) y[c0 + e] += part[e];
            }
        }
    if (a->w->down_bias)
        for (int64_t t = 0; t < a->T; t++) {
            float *o = (float *)((char *)a->out->data + t * a->out->nb[1]);
            for (int64_t e = e0; e < e1; e++) o[e] += a->w->down_bias[e];
        }
}

/* What gather_tiles may use of the scratch for its activation rows and tile table: f32 rows, more than any
 * quantized form and its table take. */
static size_t tiles_bytes(int64_t E, int64_t T) { return (size_t)(T * E) * sizeof(float); }

size_t pi_sparse_ffn_scratch(const pi_sparse_ffn_weights *w, int64_t E, int64_t F, int64_t T) {
    size_t bytes = (size_t)(T * F) + 64;                          /* active */
    bytes += (size_t)F * sizeof(int32_t) * 2 + 64;                /* count, rows */
    const int64_t n_ranges = (F + SPARSE_RANGE - 1) / SPARSE_RANGE;
    bytes += (size_t)(n_ranges + 1) * sizeof(int64_t) + 64;       /* range_start */
    if (T == 1) bytes += (size_t)(n_ranges * PI_MAX(E, w->down_t.ne[0])) * sizeof(float) + 64;   /* partial */
    bytes += (size_t)(T * F) * sizeof(float) + 64;                /* h */
    if (w->gate.data) bytes += (size_t)pi_mul_mat_scratch(w->gate.type, E, T) + 64;   /* NULL: the gate given */
    if (w->up.data) bytes += (size_t)pi_mul_mat_scratch(w->up.type, E, T) + 64;   /* NULL: h given */
    if (w->up.data) bytes += tiles_bytes(E, T) + 128;   /* gather_tiles, at any level (contexts outlive levels) */
    return bytes;
}

/* Whether a batch of T tokens gathers its rows 16 at a time on the AMX tile kernels: the amx level, whole 16-token
 * tiles, up rows with a tile kernel (and a gate, if read, of the same type), 8-row kernels for the token tail. */
static bool gather_tiles(const sparse_args *a) {
    const pi_type_traits *tr = pi_traits(a->w->up.type), *xtr = pi_traits(pi_tiles_act_type(tr));
    if (a->T < PI_TILE_T || a->h_given || !tr->tiles_rows || !tr->vec_dot8 || !pi_cpu()->tiles_begin ||
        !xtr->tiles_prep || !xtr->tiles_unit || a->E % xtr->tiles_unit ||
        (a->xq_gate && a->w->gate.type != a->w->up.type))
        return false;
    const int64_t rows = pi_row_bytes(pi_tiles_act_type(tr), a->E) * a->T;
    const int64_t table = a->T / PI_TILE_T * (a->E / xtr->tiles_unit * xtr->tiles_unit_bytes);
    return (size_t)(rows + table) <= tiles_bytes(a->E, a->T);
}

static void *carve(char **p, size_t bytes) {
    void *r = *p;
    *p += (bytes + 63) / 64 * 64;
    return r;
}

pi_status pi_sparse_ffn(pi_threadpool *pool, const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode,
                        const pi_tensor *x, const pi_tensor *scores, float threshold, pi_tensor *out,
                        int64_t *n_active, int64_t *neuron_counts, void *scratch) {
    return pi_sparse_ffn_skip(pool, w, act, gate_mode, x, scores, threshold, NULL, out, n_active, neuron_counts,
                              scratch);
}

/* The hybrid FFN's CPU half: skip[i] != 0 marks the hot neurons another backend computes, so they are
 * neither computed nor counted here (nothing is computed twice). */
pi_status pi_sparse_ffn_skip(pi_threadpool *pool, const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode,
                             const pi_tensor *x, const pi_tensor *scores, float threshold, const uint8_t *skip,
                             pi_tensor *out, int64_t *n_active, int64_t *neuron_counts, void *scratch) {
    sparse_args a = { .w = w, .act = act, .mode = gate_mode, .x = x, .scores = scores, .threshold = threshold,
                      .skip = skip, .out = out, .E = x->ne[0], .F = w->down_t.ne[1], .T = x->ne[1],
                      .E_out = w->down_t.ne[0], .gate_given = gate_mode != PI_FFN_SEQ && !w->gate.data,
                      .h_given = !w->up.data };
    char *p = scratch;
    a.active = carve(&p, (size_t)(a.T * a.F));
    a.count = carve(&p, (size_t)a.F * sizeof(int32_t));
    a.rows = carve(&p, (size_t)a.F * sizeof(int32_t));
    a.h = carve(&p, (size_t)(a.T * a.F) * sizeof(float));
    a.n_ranges = (a.F + SPARSE_RANGE - 1) / SPARSE_RANGE;
    a.range_start = carve(&p, (size_t)(a.n_ranges + 1) * sizeof(int64_t));
    if (a.T == 1) a.partial = carve(&p, (size_t)(a.n_ranges * a.E_out) * sizeof(float));
    if (!a.h_given) {
        a.xq_up_bytes = pi_row_bytes(pi_traits(w->up.type)->vec_dot_type, a.E);
        a.xq_up = carve(&p, (size_t)(a.xq_up_bytes * a.T));
    }
    if (gate_mode != PI_FFN_SEQ && !a.gate_given && !a.h_given) {
        a.xq_gate_bytes = pi_row_bytes(pi_traits(w->gate.type)->vec_dot_type, a.E);
        a.xq_gate = pi_traits(w->gate.type)->vec_dot_type == pi_traits(w->up.type)->vec_dot_type
                        ? a.xq_up : carve(&p, (size_t)(a.xq_gate_bytes * a.T));
    }
    if (gather_tiles(&a)) {
        const int32_t xtype = pi_tiles_act_type(pi_traits(w->up.type));
        const pi_type_traits *xtr = pi_traits(xtype);
        a.T16 = a.T / PI_TILE_T * PI_TILE_T;
        a.xs_bytes = pi_row_bytes(xtype, a.E);
        a.xs = carve(&p, (size_t)(a.xs_bytes * a.T));
        a.xt_stride = a.E / xtr->tiles_unit * xtr->tiles_unit_bytes;
        a.xt = carve(&p, (size_t)(a.T16 / PI_TILE_T * a.xt_stride));
    }

    const bool rows8 = !a.h_given && pi_traits(w->up.type)->vec_dot8 &&
                       (!a.xq_gate || pi_traits(w->gate.type)->vec_dot8);
    if (a.T > 1 && rows8) a.group_min_count = (int32_t)PI_MAX(1, a.T / (a.xs ? TILES_MIN_SHARE : ROWS8_MIN_SHARE));
    pi_threadpool_run(pool, select_convert_task, &a);
    int64_t pairs = 0;
    for (int64_t r = 0; r < a.n_ranges; r++) {   /* the union, ascending; branch-free (which neurons run is random) */
        a.range_start[r] = a.n_rows;
        for (int64_t i = r * SPARSE_RANGE; i < PI_MIN(a.F, (r + 1) * SPARSE_RANGE); i++) {
            pairs += a.count[i];
            a.rows[a.n_rows] = (int32_t)i;
            a.n_rows += a.count[i] != 0;
        }
    }
    a.range_start[a.n_ranges] = a.n_rows;
    if (n_active) *n_active = pairs;
    if (neuron_counts)
        for (int64_t i = 0; i < a.F; i++) neuron_counts[i] += a.count[i];
    atomic_init(&a.next, 0);
    if (a.T == 1) {   /* fused: whole rows, one range per task (the same arithmetic as the tiles) */
        pi_threadpool_run(pool, fused_task, &a);
        pi_threadpool_run(pool, reduce_task, &a);
    } else {
        pi_threadpool_run(pool, gather_task, &a);
        pi_threadpool_run(pool, down_task, &a);
    }
    return PI_OK;
}

/* ---- predictor ---- */

pi_status pi_predictor(pi_threadpool *pool, const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                       pi_tensor *scores, float *hidden, void *scratch) {
    const int64_t T = x->ne[1], r = fc1->ne[1];
    pi_tensor ht = pi_tensor_view(PI_TYPE_F32, hidden, 2, (int64_t[]){ r, T });
    pi_status st = pi_mul_mat(pool, fc1, x, &ht, scratch);
    if (st != PI_OK) return st;
    st = pi_op_unary(pool, PI_UNARY_RELU, &ht, &ht);
    if (st != PI_OK) return st;
    return pi_mul_mat(pool, fc2, &ht, scores, scratch);
}

/* ---- a level's selection over dense values (a batch through the dense kernels, context.c) ---- */

typedef struct {
    const float *s, *src, *w;
    float *dst;
    int32_t act;
    float threshold;
    int64_t n, T;
    int64_t *counts;
    atomic_llong kept;
} mask_args;

/* the threads split the n entries of a row, as select_task splits the neurons */
static void mask_task(void *p, int ith, int nth) {
    mask_args *a = p;
    const int64_t per = (a->n + nth - 1) / nth, i0 = PI_MIN(a->n, per * ith), i1 = PI_MIN(a->n, i0 + per);
    const float threshold = a->threshold;
    int64_t *counts = a->counts, kept = 0;
    for (int64_t t = 0; t < a->T; t++) {
        const float *s = a->s + t * a->n, *x = a->src + t * a->n;
        float *y = a->dst + t * a->n;
        for (int64_t c = i0; c < i1; c += 256) {
            float v[256];   /* the values select_task compares */
            int32_t keep[256];
            const int64_t m = PI_MIN(256, i1 - c);
            if (a->act >= 0) pi_gate_scores(a->act, m, s + c, a->w ? a->w + c : NULL, v);
            else memcpy(v, s + c, (size_t)m * sizeof(float));
            int32_t n_keep = 0;
            for (int64_t k = 0; k < m; k++) {
                keep[k] = fabsf(v[k]) >= threshold;
                n_keep += keep[k];
            }
            for (int64_t k = 0; k < m; k++) {   /* y = keep ? x : +0, without a branch (keep is random) */
                uint32_t bits;
                memcpy(&bits, x + c + k, sizeof bits);
                bits &= (uint32_t)-keep[k];
                memcpy(y + c + k, &bits, sizeof bits);
            }
            kept += n_keep;
            for (int64_t k = 0; counts && k < m; k++) counts[c + k] += keep[k];
        }
    }
    atomic_fetch_add(&a->kept, kept);
}

void pi_sparse_mask(pi_threadpool *pool, const float *s, int32_t act, const float *w, float threshold, const float *src,
                    float *dst, int64_t n, int64_t T, int64_t *n_kept, int64_t *counts) {
    mask_args a = { .s = s, .src = src, .w = w, .dst = dst, .act = act, .threshold = threshold, .n = n, .T = T,
                    .counts = counts };
    atomic_init(&a.kept, 0);
    pi_threadpool_run(pool, mask_task, &a);
    if (n_kept) *n_kept += atomic_load(&a.kept);
}

/* ---- public, checked entry points ---- */

#define RETURN_IF(st) do { pi_status st_ = (st); if (st_ != PI_OK) return st_; } while (0)

static pi_status check_f32_2d(const pi_tensor *t, int64_t ne0, int64_t ne1, const char *what) {
    RETURN_IF(pi_check_tensor(t, what));
    if (t->type != PI_TYPE_F32 || t->nb[0] != sizeof(float))
        return pi_fail(PI_ERR_INVALID_ARG, "%s: must be f32 with contiguous rows", what);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] * t->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "%s: shape must be [%lld, %lld]", what, (long long)ne0, (long long)ne1);
    return PI_OK;
}

/* rows: whether single rows are read (the sparse FFN gathers neurons), which interleaved layouts do not allow */
static pi_status check_shape(const pi_tensor *t, int64_t ne0, int64_t ne1, const char *what) {
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] * t->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "%s: shape [%lld, %lld], expected [%lld, %lld]", what,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)ne0, (long long)ne1);
    return PI_OK;
}

static pi_status check_weight(const pi_tensor *t, int64_t ne0, int64_t ne1, bool rows, const char *what) {
    RETURN_IF(pi_check_tensor(t, what));
    const pi_type_traits *tr = pi_traits(t->type);
    if (!tr || (rows ? !tr->vec_dot || !tr->axpy : !tr->vec_dot && !tr->gemm8 && !tr->gemm16))
        return pi_fail(PI_ERR_UNSUPPORTED, "%s: type %s", what, pi_type_name(t->type));
    if (pi_is_interleaved(t->type) && t->ne[1] % pi_group_rows(t->type))
        return pi_fail(PI_ERR_INVALID_ARG, "%s: an interleaved weight needs a multiple of %lld rows", what,
                       (long long)pi_group_rows(t->type));
    return check_shape(t, ne0, ne1, what);
}

pi_status pi_op_predictor(pi_threadpool *pool, const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                          pi_tensor *scores) {
    RETURN_IF(pi_check_tensor(x, "predictor x"));
    RETURN_IF(pi_check_tensor(fc1, "predictor fc1"));
    RETURN_IF(pi_check_tensor(fc2, "predictor fc2"));
    const int64_t E = x->ne[0], T = x->ne[1], r = fc1->ne[1];
    RETURN_IF(check_f32_2d(x, E, T, "predictor x"));
    RETURN_IF(check_weight(fc1, E, r, false, "predictor fc1"));
    RETURN_IF(check_weight(fc2, r, fc2->ne[1], false, "predictor fc2"));
    RETURN_IF(check_f32_2d(scores, fc2->ne[1], T, "predictor scores"));
    float *hidden = pi_alloc_lines((size_t)(r * T) * sizeof(float));
    const size_t sbytes = PI_MAX(pi_mul_mat_scratch(fc1->type, E, T), pi_mul_mat_scratch(fc2->type, r, T));
    void *scratch = pi_alloc_lines(sbytes);
    pi_status st = hidden && scratch ? pi_predictor(pool, fc1, fc2, x, scores, hidden, scratch)
                                     : pi_fail(PI_ERR_OUT_OF_MEMORY, "predictor: out of memory");
    free(hidden);
    free(scratch);
    return st;
}

/* down_t: rows of a type the down step can add, or one of pi_sparse_pack's column-block layouts (Q4_0C, Q4_KC,
 * Q6_KC) with its aux */
static pi_status check_down_t(const pi_sparse_ffn_weights *w, int64_t E_out, int64_t F) {
    const pi_type_traits *tr = pi_traits(w->down_t.type);
    if (!tr || !tr->axpy_cols) return check_weight(&w->down_t, E_out, F, true, "sparse_ffn down_t");
    RETURN_IF(pi_check_tensor(&w->down_t, "sparse_ffn down_t"));
    if (!w->down_t_scales || F % tr->cols_unit || w->down_t.ne[0] % 64)
        return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn down_t: a %s layout needs its aux (down_t_scales), a multiple "
                       "of %d rows and of 64 columns (made by pi_sparse_pack)", pi_type_name(w->down_t.type),
                       (int)tr->cols_unit);
    return check_shape(&w->down_t, E_out, F, "sparse_ffn down_t");
}

pi_status pi_check_sparse_weights(const pi_sparse_ffn_weights *w, int32_t gate_mode, int64_t E, int64_t F) {
    if (!w) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn: weights are NULL");
    if (gate_mode < PI_FFN_PAR || gate_mode > PI_FFN_SEQ)
        return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn: unknown gate mode %d", gate_mode);
    if (!w->up.data) {   /* an input-sparse matmul: down_t [n_out, F] alone, the scores [F, T] are h */
        if (gate_mode != PI_FFN_SEQ || w->gate.data)
            return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn up: NULL with a gate (an input-sparse matmul has neither: "
                                               "gate mode seq, gate and up NULL)");
        return check_down_t(w, w->down_t.ne[0], F);
    }
    if (gate_mode != PI_FFN_SEQ && w->gate.data) RETURN_IF(check_weight(&w->gate, E, F, true, "sparse_ffn gate"));
    RETURN_IF(check_weight(&w->up, E, F, true, "sparse_ffn up"));
    return check_down_t(w, E, F);
}

pi_status pi_op_sparse_ffn(pi_threadpool *pool, const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode,
                           const pi_tensor *x, const pi_tensor *scores, float threshold, pi_tensor *out,
                           int64_t *n_active) {
    RETURN_IF(pi_check_tensor(x, "sparse_ffn x"));
    if (!w) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn: weights are NULL");
    /* F from up (the FFN's channels), or from down_t for an input-sparse matmul */
    const int64_t E = x->ne[0], T = x->ne[1], F = w->up.data ? w->up.ne[1] : w->down_t.ne[1];
    const int64_t E_out = w->up.data ? E : w->down_t.ne[0];
    RETURN_IF(pi_check_sparse_weights(w, gate_mode, E, F));
    RETURN_IF(check_f32_2d(x, E, T, "sparse_ffn x"));
    RETURN_IF(check_f32_2d(scores, F, T, "sparse_ffn scores"));
    RETURN_IF(check_f32_2d(out, E_out, T, "sparse_ffn out"));
    if (out->data == x->data) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn: out must not alias x");
    if (act < PI_ACT_SILU || act > PI_ACT_GELU) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn: unknown activation %d", act);
    if (isnan(threshold)) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn: threshold is NaN");
    void *scratch = pi_alloc_lines(pi_sparse_ffn_scratch(w, E, F, T));
    if (!scratch) return pi_fail(PI_ERR_OUT_OF_MEMORY, "sparse_ffn: out of memory");
    pi_status st = pi_sparse_ffn(pool, w, act, gate_mode, x, scores, threshold, out, n_active, NULL, scratch);
    free(scratch);
    return st;
}

pi_status pi_op_sparse_mask(pi_threadpool *pool, const pi_tensor *s, int32_t act, const float *weights, float threshold,
                            const pi_tensor *src, pi_tensor *dst, int64_t *n_kept, int64_t *counts) {
    RETURN_IF(pi_check_tensor(s, "sparse_mask s"));
    const int64_t n = s->ne[0], T = s->ne[1];
    RETURN_IF(check_f32_2d(s, n, T, "sparse_mask s"));
    RETURN_IF(check_f32_2d(src, n, T, "sparse_mask src"));
    RETURN_IF(check_f32_2d(dst, n, T, "sparse_mask dst"));
    if (s->nb[1] != n * (int64_t)sizeof(float) || src->nb[1] != s->nb[1] || dst->nb[1] != s->nb[1])
        return pi_fail(PI_ERR_INVALID_ARG, "sparse_mask: s, src and dst must be contiguous");
    if (act < -1 || act > PI_ACT_GELU) return pi_fail(PI_ERR_INVALID_ARG, "sparse_mask: unknown activation %d", act);
    if (isnan(threshold)) return pi_fail(PI_ERR_INVALID_ARG, "sparse_mask: threshold is NaN");
    pi_sparse_mask(pool, s->data, act, weights, threshold, src->data, dst->data, n, T, n_kept, counts);
    return PI_OK;
}
