/* internal.h: declarations shared by the core's source files (not public). */
#ifndef PI_INTERNAL_H
#define PI_INTERNAL_H

#include "powerinfer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define PI_MAX_DIMS   4
#define PI_MAX_SEQ    64
#define PI_UNUSED(x)  (void)(x)
#define PI_MIN(a, b)  ((a) < (b) ? (a) : (b))
#define PI_MAX(a, b)  ((a) > (b) ? (a) : (b))

/* ---- errors (error.c) ---- */
/* Records a printf-style message for pi_last_error() and returns status. */
pi_status pi_fail(pi_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void      pi_clear_error(void);

/* ---- dtypes (dtype.c) ---- */
typedef void  (*pi_to_f32_fn)(const void *src, float *dst, int64_t n);
typedef void  (*pi_from_f32_fn)(const float *src, void *dst, int64_t n);
/* Dot product of n elements: w in the weight type, x in the traits' vec_dot_type. */
typedef float (*pi_vec_dot_fn)(int64_t n, const void *w, const void *x);
/* y[0..n) += a * row[0..n), row in the weight type (n a multiple of the block size). */
typedef void  (*pi_axpy_fn)(int64_t n, float a, const void *row, float *y);
/* Eight weight rows against nt <= PI_DOT8_MAX_T activation rows: y[t * y_stride + r] = dot(row r, x_t),
 * row r at rows[r] (any addresses: dense rows or gathered neurons), x_t at x + t * x_stride.
 * Bit-identical to vec_dot on each (row, token): the kernels differ in speed only. */
#define PI_DOT8_MAX_T 8   /* 8 accumulators + 8 unpacked weight registers: 7% faster prompts than 4 */
typedef void  (*pi_vec_dot8_fn)(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                float *y, int64_t y_stride);
/* Q5_0 and Q8_0 dot products keep 8 partial sums: block b is added (one fma) to p[b % 8], and the
 * result is this fixed tree over them, which is also the order of an AVX2 horizontal sum of the 8
 * lanes; every kernel of these types (single-row, 8-row, scalar) sums this way. */
/* Memory for activations and scratch (free() releases it): on 64-byte boundaries, because the kernels'
 * 32-byte loads of activation rows cost a quarter more when they straddle cache lines, and malloc's
 * large blocks start 16 bytes into a page. */
static inline void *pi_alloc_lines(size_t bytes) { return aligned_alloc(64, (bytes + 64) / 64 * 64); }

static inline float pi_tree8(const float p[8]) { return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7])); }
/* The same for one group of 8 rows of an interleaved (repacked) weight; group = the group's first byte. */
typedef void  (*pi_gemm8_fn)(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                             float *y, int64_t y_stride);
/* Sixteen interleaved rows (two consecutive groups, group = the first one's first byte) against nt activation
 * rows, nt a multiple of PI_TILE_T: the same contract as gemm8 (y[t * y_stride + r], bit-identical to
 * vec_dot per (row, token)). The AMX level's prompt kernel; mul_mat calls it for batches of at least
 * PI_TILES_MIN_T tokens (ops.c) and does the token and row tails with gemm16/gemm8. */
#define PI_TILE_T 16
typedef void  (*pi_tiles_fn)(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                             float *y, int64_t y_stride, const char *xt, int64_t xt_stride);
/* Sixteen weight rows at any addresses (rows[0..15], the file's layout) against nt activation rows, nt a multiple
 * of PI_TILE_T: y[t * y_stride + r] = dot(row r, x_t), bit-identical to vec_dot per (row, token), as vec_dot8.
 * The AMX level's prompt kernel of Q8_0, Q5_0, Q4_K, Q5_K and Q6_K rows; mul_mat calls it for batches
 * of at least PI_TILES_MIN_T tokens (ops.c) and does the token and row tails with vec_dot8. */
typedef void  (*pi_tiles_rows_fn)(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                  float *y, int64_t y_stride, const char *xt, int64_t xt_stride);
/* Both tile kernels' xt: the activations' tile table, what the kernels need of the activation rows in the form
 * their tiles and epilogues read, made once per mul_mat (pi_tiles_prep_fn) instead of in every 16-row kernel call:
 * token tile i of the call (activation rows 16 i .. 16 i + 15) at xt + i xt_stride. Its layout belongs to the
 * activation type's prep and the kernels that read it (arch/amx_util.h). */
/* Activation row `row` (the vec_dot_type, n elements) -> its part of the tile table of its token tile at `tile`,
 * as row r (< 16) of that tile. */
typedef void  (*pi_tiles_prep_fn)(int64_t n, const void *row, int r, char *tile);
/* y[0..n) += a[k] * rows[k][0..n) for k = 0..7 in order: the same bits as eight axpy calls, with y
 * loaded and stored once. */
typedef void  (*pi_axpy8_fn)(int64_t n, const float *a, const void *const *rows, float *y);
/* y[0..n) += the sum over k < count (1 <= count <= PI_AXPY_GROUP) of a[k] * rows[k], computed as one group whose
 * bits are the type's own (arch/q4_0r.c: coefficients quantized together, an exact integer sum), not those of
 * count axpy calls. */
#define PI_AXPY_GROUP 16
typedef void  (*pi_axpy_group_fn)(int64_t n, int count, const float *a, const void *const *rows, float *y);
/* Column-block layouts (a matrix laid out by input: PI_TYPE_Q4_0C, arch/q4_0c.c; PI_TYPE_Q4_KC, Q6_KC, arch/kc.c):
 * their rows are added by unit of traits->cols_unit consecutive inputs (32: a Q4_0 block, 256: a K-quant super-block):
 * y[0..n) += the sum over k < count (1 <= count <= cols_unit) of a[k] * row k, idx[k] = row k's input within the
 * unit (ascending), aux = the unit's per-output data (block scales...) for outputs 0..n: one group, the type's own
 * bits. The unit's aux for outputs c0.. of a matrix of n_out outputs lies traits->cols_aux (unit n_out + c0) bytes
 * into the layout's aux (pi_sparse_ffn_weights.down_t_scales; c0 a multiple of 64). */
#define PI_COLS_MAX 256
typedef void  (*pi_axpy_cols_fn)(int64_t n, int count, const uint8_t *idx, const float *a, const void *aux,
                                 const void *const *rows, float *y);
/* Unit u (inputs u cols_unit ..) of the file's matrix w [n_out rows, row stride w_stride bytes] in the layout's
 * source type (Q4_0, Q4_K, Q6_K) -> its cols_unit rows of the layout and the unit's aux (cols_aux n_out bytes). */
typedef void  (*pi_cols_pack_fn)(int64_t n_out, const void *w, int64_t w_stride, int64_t u, void *const *rows,
                                 void *aux);
/* Writes one group's rows (pi_group_rows of the interleaved type: 8 or 16; n elements each, in the source type)
 * as one group of the interleaved layout. */
typedef void  (*pi_repack_fn)(int64_t n, const void *const *rows, void *group);
/* n rows of a type whose kernels decode slowly (the IQ3 grids; k elements, row stride `stride` bytes) -> the same rows
 * in its batch_type, whose kernels give the same bits for every (row, token) (arch/vec_dot_k.c says why); false where
 * a row cannot be (mul_mat then runs the type's own kernels on those rows). Prompts convert a few rows at a time and
 * run batch_type's 8-row kernel over every token (ops.c). */
typedef bool  (*pi_to_batch_fn)(int64_t k, const void *w, int64_t stride, int n, void *dst);

typedef struct pi_type_traits {
    const char     *name;
    int64_t         block_size;    /* elements per block (0: unknown type) */
    int64_t         block_bytes;
    pi_to_f32_fn    to_f32;
    pi_from_f32_fn  from_f32;
    int32_t         vec_dot_type;  /* type the activations are converted to for vec_dot (the level's, where it has one) */
    pi_vec_dot_fn   vec_dot;
    pi_axpy_fn      axpy;          /* the sparse FFN's down step */
    pi_vec_dot8_fn  vec_dot8;      /* optional: 8 rows at once (NULL: row by row with vec_dot) */
    pi_axpy8_fn     axpy8;         /* optional: 8 axpy at once (NULL: one by one) */
    pi_axpy_group_fn axpy_group;   /* optional: the sparse FFN adds rows in groups through it, not by axpy/axpy8 */
    pi_axpy_cols_fn axpy_cols;     /* column-block layouts only: their rows are added by unit through it */
    pi_cols_pack_fn cols_pack;     /* column-block layouts: made from the file's matrix by unit through it */
    int32_t         cols_unit;     /* column-block layouts: inputs per unit (32, 256) */
    int32_t         cols_aux;      /* column-block layouts: aux bytes per unit and output */
    int32_t         repacked_type; /* optional: interleaved layout mul_mat reads faster (0: none) */
    /* interleaved layouts only (rows are not addressable one by one; ne[1] a multiple of pi_group_rows) */
    pi_gemm8_fn     gemm8;         /* Q4_0X8: one group of 8 rows */
    pi_gemm8_fn     gemm16;        /* 16 rows from a multiple of 16 on (Q4_0X8: two groups, optional; *X16: one) */
    int32_t         gemm_max_t;    /* tokens one gemm8 / gemm16 call takes: PI_DOT8_MAX_T, or more where the kernel says */
    pi_repack_fn    repack;        /* types with a repacked_type (not the layout): R rows -> one group */
    int32_t         batch_type;    /* optional: what to_batch converts rows to for prompts (0: none) */
    int32_t         batch_min_t;   /* the fewest tokens whose prompt converts (0: PI_BATCH_MIN_T, ops.c) */
    pi_to_batch_fn  to_batch;
    pi_tiles_fn     tiles;         /* optional: 16 rows x multiples of 16 tokens (AMX) */
    /* optional: row k of one group as floats, the file row's values (get_rows reads such a table, so a tied
     * embedding table can be repacked for the output head) */
    void          (*group_row_to_f32)(const void *group, int k, float *dst, int64_t n);
    /* rows at any addresses (not interleaved) */
    pi_tiles_rows_fn tiles_rows;   /* optional: 16 rows x multiples of 16 tokens (AMX) */
    int32_t         tiles_act_type;/* the tile kernels' activations where not vec_dot_type (0): Q4_0R's are Q8_0S,
                                    * whose blocks lie contiguous as an A tile needs (Q8_0P interleaves them) */
    /* activation types: the tile table of the tile kernels (pi_type_kernels) */
    pi_tiles_prep_fn tiles_prep;
    int32_t         tiles_unit, tiles_unit_bytes;
} pi_type_traits;

/* The activation type of a weight type's tile kernels (tiles, tiles_rows). */
static inline int32_t pi_tiles_act_type(const pi_type_traits *tr) {
    return tr->tiles_act_type ? tr->tiles_act_type : tr->vec_dot_type;
}

/* Types that exist only inside the core (never in a GGUF file): activation formats and
 * load-time weight layouts. They follow the GGUF ids in the traits table. */
enum {
    PI_TYPE_Q8_0S = PI_TYPE_COUNT,   /* activations of Q4_0: Q8_0 plus the block's sum of quants */
    PI_TYPE_Q4_0X8,                  /* Q4_0 weights, 8 rows interleaved (pi_repack) */
    PI_TYPE_Q4_0R,                   /* Q4_0 rows, 8 block scales ahead of their quants (pi_sparse_pack) */
    PI_TYPE_Q8_0P,                   /* activations of Q4_0R (arch/q4_0r.c) */
    PI_TYPE_Q8_KM,                   /* activations of Q4_K/Q5_K: Q8_K + a step multiplier per 32 (quants_k.h) */
    PI_TYPE_Q8_0X16,                 /* Q8_0 weights, 16 rows interleaved (pi_repack) */
    PI_TYPE_Q4_KX16,                 /* Q4_K weights, 16 rows interleaved (pi_repack; quants_k.h) */
    PI_TYPE_Q5_KX16,                 /* Q5_K weights, the same */
    PI_TYPE_F16X8,                   /* f16 weights, 8 rows as two halves of 4 interleaved per 8 elements (pi_x8_index) */
    PI_TYPE_BF16X8,                  /* bf16 weights, the same */
    PI_TYPE_Q6_KX16,                 /* Q6_K weights, 16 rows interleaved (pi_repack; quants_k.h) */
    PI_TYPE_Q5_0X16,                 /* Q5_0 weights, 16 rows interleaved (pi_repack; arch/q8_0x16.c) */
    PI_TYPE_Q4_0C,                   /* a Q4_0 matrix by input: quants only, scales apart (pi_sparse_pack; arch/q4_0c.c) */
    PI_TYPE_Q4_KC,                   /* a Q4_K matrix by input, the same (arch/kc.c) */
    PI_TYPE_Q6_KC,                   /* a Q6_K matrix by input, the same (arch/kc.c) */
    PI_TYPE_Q4_1X16,                 /* Q4_1 weights, 16 rows interleaved (pi_repack; arch/q8_0x16.c) */
    PI_TYPE_Q5_1X16,                 /* Q5_1 weights, the same */
    PI_TYPE_IQ4_NLX8,                /* IQ4_NL weights in Q4_0X8's layout (pi_repack; arch/rows8.c) */
    PI_TYPE_IQ4_XSX16,               /* IQ4_XS weights, 16 rows regrouped as Q4_KX16 (pi_repack; arch/kx16.c) */
    PI_TYPE_Q8_KW,                   /* the IQ2 types' rows for prompts: bytes, a scale per 16 (to_batch; quants_k.h) */
    PI_TYPE_Q8_KWX16,                /* Q8_KW rows, 16 regrouped by 32-bit words (to_batch at avx2, avx512; arch/kx16.c) */
    PI_TYPE_Q2_KX16,                 /* Q2_K rows, 16 regrouped by 32-bit words (to_batch at avx512; arch/kx16.c) */
    PI_TYPE_BF16S,                   /* activations of bf16 weights at the avx2 level: bf16 values split (dtype.c) */
    PI_TYPE_MXFP4X8,                 /* MXFP4 weights, 8 rows interleaved as Q4_0X8 (pi_repack; arch/rows8.c) */
    PI_TYPE_TABLE_END
};
/* Rows per group of an interleaved layout (a weight of that type has a multiple of them), 0 for row layouts. */
static inline int64_t pi_group_rows(int32_t type) {
    return type == PI_TYPE_Q4_0X8 || type == PI_TYPE_IQ4_NLX8 || type == PI_TYPE_MXFP4X8 || type == PI_TYPE_F16X8 ||
           type == PI_TYPE_BF16X8 ? 8
         : type == PI_TYPE_Q8_0X16 || type == PI_TYPE_Q5_0X16 || type == PI_TYPE_Q4_1X16 || type == PI_TYPE_Q5_1X16 ||
           type == PI_TYPE_Q4_KX16 || type == PI_TYPE_Q5_KX16 || type == PI_TYPE_Q6_KX16 || type == PI_TYPE_IQ4_XSX16 ||
           type == PI_TYPE_Q8_KWX16 || type == PI_TYPE_Q2_KX16 ? 16
         : 0;
}
static inline bool pi_is_interleaved(int32_t type) { return pi_group_rows(type) > 0; }
/* Where element i of row k sits in one F16X8/BF16X8 group of rows of n elements (n a multiple of 8), in 16-bit
 * values: two halves of 4 rows (4 n values each), and in a half every 8-element chunk holds the 4 rows' elements
 * one after the other (64 bytes, one cache line). arch/vec_dot.c says why. */
static inline int64_t pi_x8_index(int64_t n, int k, int64_t i) { return k / 4 * 4 * n + i / 8 * 32 + k % 4 * 8 + i % 8; }

const pi_type_traits *pi_traits(int32_t type);   /* NULL for types the core cannot compute with */

/* y[0..n) += a[k] * rows[k] for k = 0..count-1 (count <= 8, or <= PI_AXPY_GROUP for a type with axpy_group): one
 * axpy_group call where the type has one (its own bits); else one axpy8 call where count is 8 and the type has one
 * (y loaded and stored once), otherwise axpy row by row, in order, the same bits either way. */
static inline void pi_axpy_rows(const pi_type_traits *tr, int64_t n, int count, const float *a, const void *const *rows,
                                float *y) {
    if (tr->axpy_group) { if (count > 0) tr->axpy_group(n, count, a, rows, y); return; }
    if (count == 8 && tr->axpy8) { tr->axpy8(n, a, rows, y); return; }
    for (int k = 0; k < count; k++) tr->axpy(n, a[k], rows[k], y);
}

/* ---- fp16 / bf16 conversions (fp16.h) ---- */
#include "fp16.h"

/* ---- CPU kernels: one table per ISA level (arch/level.c), one level active (cpu.c) ----
 * The kernels of arch/ are compiled once per level (scalar, avx2, avx512, amx; aarch64: scalar, neon, dotprod, i8mm) into one translation
 * unit each (arch/level.c), where they are static; a level exports only its table. The level is
 * chosen once at library load (the best the CPU supports, or POWERINFER_ISA), pi_cpu_isa_set can
 * lower it. Every level gives the scalar level's bits (the numeric contract, docs/design.md). */
typedef struct pi_type_kernels {
    pi_vec_dot_fn  vec_dot;
    pi_axpy_fn     axpy;
    pi_vec_dot8_fn vec_dot8;    /* optional */
    pi_axpy8_fn    axpy8;       /* optional */
    pi_axpy_group_fn axpy_group; /* optional */
    pi_axpy_cols_fn axpy_cols;   /* column-block layouts */
    pi_cols_pack_fn cols_pack;   /* column-block layouts */
    pi_gemm8_fn    gemm8;       /* interleaved layouts of 8-row groups */
    pi_gemm8_fn    gemm16;      /* interleaved layouts: 16 rows at once (optional for 8-row groups) */
    int32_t        gemm_max_t;  /* optional: gemm8 / gemm16 take up to this many tokens a call (0: PI_DOT8_MAX_T) */
    pi_repack_fn   repack;      /* types with a repacked_type: R of its rows -> one group of that layout */
    int32_t        repacked_type; /* optional: the layout repack makes at this level, if not the format's */
    int32_t        vec_dot_type; /* optional: the activation format of this level's kernels, if not the format's */
    pi_to_batch_fn to_batch;    /* types with a batch_type */
    pi_tiles_fn    tiles;       /* interleaved layouts, optional (the amx level) */
    pi_tiles_rows_fn tiles_rows; /* rows at any addresses, optional (the amx level) */
    /* activation types whose weights have tile kernels (the amx level): their tile table (pi_tiles_fn's xt) takes
     * tiles_unit_bytes (a multiple of 64) per token tile and tiles_unit elements of K */
    pi_tiles_prep_fn tiles_prep;
    int32_t        tiles_unit, tiles_unit_bytes;
    pi_to_f32_fn   to_f32;      /* set where arch/ implements the conversion (activation formats) */
    pi_from_f32_fn from_f32;
} pi_type_kernels;

/* A thread's AMX tile session (the amx level): the tile configuration it found, put back at the end. */
typedef struct {
    uint8_t saved[64] __attribute__((aligned(64)));   /* (not _Alignas: nvcc compiles this header as C++) */
} pi_tile_session;

#define PI_ATT_QK_MAX_HD 256   /* the largest head size attn_qk takes (its transposed K rows are on the stack) */
#define PI_ATT_PV_MAX_HD 1024  /* the largest head size attn_pv takes with to_f32 (a converted row on the stack) */

typedef struct pi_cpu_kernels {
    pi_type_kernels type[PI_TYPE_TABLE_END];
    /* the amx level: the tile kernels (tiles, tiles_rows) of a weight type run between tiles_begin(type), which
     * saves the calling thread's tile configuration and loads the one they need, and tiles_end, which puts the
     * saved one back (or releases the tiles); NULL below the amx level */
    void (*tiles_begin)(int32_t type, pi_tile_session *s);
    void (*tiles_end)(const pi_tile_session *s);
    /* four f16 rows against one f32 vector: out[k] = the f16 vec_dot of rows[k] (attention scores); the same
     * operations on four f32 rows (a cache of another type, read as f32 values) */
    void (*vec_dot4_f16_f32)(int64_t n, const void *const *rows, const float *x, float *out);
    void (*vec_dot4_f32_f32)(int64_t n, const void *const *rows, const float *x, float *out);
    /* a prompt's attention scores (arch/attention.c; NULL at the scalar level): s[j][c] = the f16 vec_dot of
     * the row at k + c k_stride with q[j] (to_f32 given: another type's row, as to_f32 gives its values, in
     * vec_dot4_f32_f32's operations), for j < nq and c0 <= c < c1 (hd <= PI_ATT_QK_MAX_HD) */
    void (*attn_qk)(int64_t hd, int nq, const float *const *q, int64_t c0, int64_t c1, const void *k,
                    int64_t k_stride, pi_to_f32_fn to_f32, float *const *s);
    /* a prompt's attention V step (arch/attention.c): first p[j][c] *= inv[j] over c0 <= c < c1 (softmax_exp's
     * numerators become attend's probabilities, in place), then y[j][e] += p[j][c] v_c[e] over those cells in
     * order, v_c = the row at v + c v_stride (f16; to_f32 given: another type's, as to_f32 gives its values,
     * hd <= PI_ATT_PV_MAX_HD), skipping cells with p[j][c] == -inf; each element as pi_axpy_f16 adds (another
     * type: pi_axpy_f32 over the values) */
    void (*attn_pv)(int64_t hd, int nq, float *const *p, const float *inv, int64_t c0, int64_t c1, const void *v,
                    int64_t v_stride, pi_to_f32_fn to_f32, float *const *y);
    /* y[i] = op(x[i]) for a row (SiLU/GELU/ReLU; y may alias x); an element's result depends only on its value */
    void (*activation_row)(int32_t op, int64_t n, const float *x, float *y);
    /* y[i] = cap tanh(x[i] scale / cap) for a row (y may alias x; cap > 0): arch/activation.c's soft-capping */
    void (*softcap_row)(int64_t n, const float *x, float *y, float scale, float cap);
    /* attention's softmax numerator over a row of n scores: hidden cells (mask[i] == -inf) become -inf, the
     * others e_i = exp(s_i + mask[i] - max), s_i = x_i * scale, or with softcap > 0 softcap_row's capped
     * softcap tanh(x_i * scale / softcap) (mask NULL: 0; max over the visible values, NaN passed
     * over) with arch/activation.c's exp; returns sum e_i, element i in lane i % 8, then pi_tree8 (0: nothing
     * visible, every x_i -inf). sink (-inf: none) is one more column without a value (attention sinks, gpt-oss): max
     * includes it and the sum ends with + exp(sink - max), after the lanes' tree */
    float (*softmax_exp)(int64_t n, float *x, const float *mask, float scale, float softcap, float sink);
    /* u[i] = min(g, limit) / (1 + e^(-alpha min(g, limit))) * (clamp(u, -limit, limit) + 1) (ggml's swiglu_oai, gpt-oss's
     * experts; arch/activation.c's exp), in place in u */
    void (*swiglu_oai_row)(int64_t n, const float *g, float *u, float alpha, float limit);
    /* bf16 weights (BF16, BF16X8) in vdpbf16ps's arithmetic, on bf16 activations (arch/bf16_dot.c): cpu.c puts them in
     * place of type[PI_TYPE_BF16], type[PI_TYPE_BF16X8] (f32 activations) where the CPU has AVX512_BF16 */
    pi_type_kernels bf16_dp, bf16x8_dp;
    /* one Q4_0 row -> the sparse FFN's PI_TYPE_Q4_0R row (n a multiple of 256) */
    void (*q4_0r_from_q4_0)(int64_t n, const void *src, void *dst);
    /* the gated delta rule's rows j0..j1 of one value head's transposed state over T tokens (arch/gdn_rows.c, gdn.c):
     * row = e^g row (src's at the first token), d = (v_j - row . k) beta, row += d k, out_j = (row . q) scale; the dot
     * and axpy pi_dot_f32's / pi_axpy_f32's (eg = e^g and beta [T] ldg apart; dst may be src) */
    void (*gdn_rows)(int64_t S, int64_t T, int64_t j0, int64_t j1, const float *src, float *dst, const float *k,
                     int64_t ldk, const float *q, int64_t ldq, const float *v, int64_t ldv, const float *eg,
                     const float *beta, int64_t ldg, float scale, float *out, int64_t ldo);
} pi_cpu_kernels;

const pi_cpu_kernels *pi_cpu(void);          /* the active level's kernels (cpu.c) */
int64_t pi_cpu_l2_bytes(void);               /* the CPU's L2 cache per core in bytes (cpu.c; 1 MB when unknown) */
bool pi_cpu_one_stream_decode(void);         /* whether one token decodes faster from one weight stream (AMD Zen 4, 5) */
bool pi_cpu_half_width_512(void);            /* whether 512-bit instructions run as two 256-bit halves (AMD Zen 4) */
bool pi_cpu_half_width_256(void);            /* whether 256-bit instructions run as two 128-bit halves (AMD Zen 1) */
/* whether the kernels' software prefetches run (each kernel names its gain): Intel (Sapphire Rapids) and AMD Zen 5
 * (family 1Ah). Zen 5, 2 threads, one token, bench/ab_ops.py: the one-token weight streams (the interleaved copies
 * Q8_0X16 / Q5_0X16 / Q4_1X16 / Q5_1X16 and F16X8 / BF16X8, consecutive rows one by one, Q4_1 / Q5_1 rows): Gemma 3
 * 270M's Q8_0X16 head 0.86x the time, 542M F16 0.92x, Q8_0 0.96-0.98x, Q5_1 0.87x, Q2_K 0.86x, Q3_K 1.02-1.05x
 * (noise), Q4_K_M / Q6_K 1.0x, Gemma tg64 +7-19% (builds alternated); the sparse FFN's scattered rows (the 7B shape at
 * 0.5): CATS FFN and input-sparse gate 0.86-0.87x. The Zen 4 measured the Q8_0X16 stream 1.1-1.27x slower with it;
 * other AMD CPUs keep the hardware prefetchers alone. */
bool pi_cpu_software_prefetch(void);
/* Requests n rows of `bytes` each, `stride` apart from row, into L1: the attention's K and V rows, a whole cell apart
 * (ops.c attend, arch/attention.c), where pi_cpu_software_prefetch says so. */
static inline void pi_prefetch_rows(const void *row, int64_t n, int64_t stride, int64_t bytes) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t l = 0; l < bytes; l += 64) __builtin_prefetch((const char *)row + i * stride + l, 0, 3);
}
const pi_type_traits *pi_cpu_traits(void);   /* [PI_TYPE_TABLE_END]: every type's traits at the active level */
/* The traits of every type with k's kernels (dtype.c; cpu.c fills one table per compiled level). */
void pi_traits_fill(const pi_cpu_kernels *k, pi_type_traits out[PI_TYPE_TABLE_END]);
void pi_traits_fill_one(int32_t t, const pi_type_kernels *kt, pi_type_traits *out);

/* Block layouts (spec section 8). */
#define PI_QK4_0 32
#define PI_QK8_0 32
typedef struct { uint16_t d; uint8_t qs[PI_QK4_0 / 2]; } pi_block_q4_0;
typedef struct { uint16_t d; int8_t  qs[PI_QK8_0]; }     pi_block_q8_0;
typedef struct { uint16_t d; int16_t s; int8_t qs[PI_QK8_0]; } pi_block_q8_0s;   /* s = sum of qs */
typedef struct { uint16_t d[8]; uint8_t qs[8 * PI_QK4_0 / 2]; } pi_block_q4_0x8;  /* block b of rows 8g..8g+7:
    qs[32 m + 4 r + k] = byte 4m + k of row r's Q4_0 block (m < 4, k < 4): every 4-byte word holds two runs
    of 4 elements (low nibbles: 4m..4m+3, high nibbles: 16+4m..16+4m+3) */
typedef struct { uint16_t d[16]; int8_t qs[8][64]; } pi_block_q8_0x16;  /* block b of rows 16g..16g+15:
    qs[m][4 r + k] = element 4m + k of row r's Q8_0 block (m < 8, k < 4): row m of an AMX B tile, and two
    256-bit halves (rows 0..7, 8..15) in the transposed form of the 8-row kernels */
typedef struct { uint16_t d[16]; uint8_t qh[8][8]; uint8_t qs[4][64]; } pi_block_q5_0x16;  /* block b of rows
    16g..16g+15, Q8_0X16's order at 22 bytes a row: qs[j][4 r + k] = byte 4j + k of row r's Q5_0 quants (j < 4:
    low nibbles = elements 4j + k, high nibbles = 16 + 4j + k); bit i = 4 r + k of the 64-bit little-endian word
    qh[m] = the high bit of element 4m + k of row r (m < 8), so byte i of Q8_0X16's row m gets bit i of qh[m] */
typedef struct { uint16_t d[16], m[16]; uint8_t qs[4][64]; } pi_block_q4_1x16;   /* block b of rows 16g..16g+15:
    the rows' d and m, then their quants as Q5_0X16's qs (20 bytes a row) */
typedef struct { uint16_t d[16], m[16]; uint8_t qh[8][8]; uint8_t qs[4][64]; } pi_block_q5_1x16;   /* the same
    with Q5_0X16's qh (24 bytes a row) */
/* The unsigned quant u of element e of row r in one block of an interleaved group of nibbles qs and (qh not NULL)
 * fifth bits qh: Q5_0X16 (u 0..31, the value d (u - 16)), Q4_1X16 (qh NULL: u 0..15, d u + m), Q5_1X16. */
static inline int pi_x16_u(const uint8_t (*qs)[64], const uint8_t (*qh)[8], int r, int e) {
    const int m = e / 4, i = 4 * r + e % 4, q = qs[m % 4][i];
    return (m < 4 ? q & 0x0f : q >> 4) | (qh ? (qh[m][i / 8] >> (i % 8) & 1) << 4 : 0);
}
static inline int pi_q5_0x16_u(const pi_block_q5_0x16 *g, int r, int e) { return pi_x16_u(g->qs, g->qh, r, e); }

/* The interleaved layouts' repack (Q4_0X8, MXFP4X8, Q8_0X16): nb blocks of R rows (block_bytes each: a scale of
 * scale_bytes (fp16 d: 2, MXFP4's e: 1), then the quants) -> per block the R scales, then the quants as 4-byte words,
 * word m of row k at (m R + k) 4. */
static inline void pi_interleave_blocks(int64_t nb, const void *const *rows, int R, int64_t block_bytes,
                                        int64_t scale_bytes, void *group) {
    const int64_t words = (block_bytes - scale_bytes) / 4;
    for (int64_t b = 0; b < nb; b++) {
        char *g = (char *)group + b * R * block_bytes;
        for (int k = 0; k < R; k++) {
            const char *src = (const char *)rows[k] + b * block_bytes;
            memcpy(g + scale_bytes * k, src, (size_t)scale_bytes);
            for (int64_t m = 0; m < words; m++)
                memcpy(g + scale_bytes * R + (m * R + k) * 4, src + scale_bytes + 4 * m, 4);
        }
    }
}

/* ---- thread pool (threadpool.c) ---- */
typedef void (*pi_task_fn)(void *arg, int ith, int nth);
/* Runs fn(arg, ith, nth) for ith = 0..nth-1 on the pool (the caller is thread 0) and waits. */
void    pi_threadpool_run(pi_threadpool *pool, pi_task_fn fn, void *arg);
int32_t pi_physical_cores(void);
/* Threads the pool was made with; pi_threadpool_size gives the ones the next runs use, which
 * pi_threadpool_set_active chooses (1 .. the capacity): the others wait (llama.cpp's -t / -tb with one pool). */
int32_t pi_threadpool_capacity(const pi_threadpool *pool);
void    pi_threadpool_set_active(pi_threadpool *pool, int32_t n);

/* ---- tensors (tensor.c) ---- */
int64_t   pi_nelements(const pi_tensor *t);
pi_tensor pi_tensor_view(int32_t type, void *data, int n_dims, const int64_t *ne);  /* contiguous */
pi_status pi_check_tensor(const pi_tensor *t, const char *what);
bool      pi_is_contiguous_rows(const pi_tensor *t);   /* dim 0 contiguous */

/* ---- ops with explicit scratch (ops.c) ---- */
/* Bytes of scratch pi_mul_mat needs for x [K, T]. */
size_t    pi_mul_mat_scratch(int32_t wtype, int64_t K, int64_t T);
pi_status pi_mul_mat(pi_threadpool *pool, const pi_tensor *w, const pi_tensor *x, pi_tensor *y, void *scratch);
/* pi_mul_mat with a scratch the caller keeps between calls (*scratch of *bytes, grown as needed; free it at the end) */
pi_status pi_mul_mat_grow(pi_threadpool *pool, const pi_tensor *w, const pi_tensor *x, pi_tensor *y, void **scratch,
                          size_t *bytes);
/* y[i] = w[i] x for n <= PI_MUL_MATS_MAX weights of one input (q, k, v; gate, up): the bits of pi_mul_mat each,
 * in one pass where they share x's conversion. Arguments checked as pi_op_mul_mat's by the caller. */
enum { PI_MUL_MATS_MAX = 3 };
pi_status pi_mul_mats(pi_threadpool *pool, int n, const pi_tensor *const *w, const pi_tensor *x, pi_tensor *const *y,
                      void *scratch);
/* The rotations of one batch: cos and sin of theta = pos[t] * scale * base^(-2i / n_rot) (/ freq_factors[i]) for
 * T tokens and the n_rot / 2 pairs, as pi_rope computes them. A forward pass ropes q and k of every layer with the
 * same few (pos, base, scale, factors), so a backend keeps PI_ROPE_TABLES of them and recomputes one only when its
 * key changes (Gemma 3 at one token: 2 tables per token instead of 36, 4.3 us a rope call on a Zen 4 before). */
enum { PI_ROPE_TABLES = 2 };   /* Gemma 3: local and global layers */
typedef struct pi_rope_table {
    int64_t  T;              /* tokens of the key; 0: empty */
    int32_t  n_rot;
    float    base, scale, mscale;
    const float *factors;    /* the model's rope_freqs (fixed while the model lives) or NULL */
    int32_t *pos;            /* [T] */
    float   *cs;             /* [T][n_rot / 2][2]: cos, sin (times mscale) */
    int64_t  cap_T, cap_cs;  /* allocated entries of pos and cs */
    uint64_t used;           /* last use (a counter of the owning cache): the oldest is replaced */
} pi_rope_table;
typedef struct pi_rope_cache { pi_rope_table t[PI_ROPE_TABLES]; uint64_t clock; } pi_rope_cache;
void      pi_rope_cache_free(pi_rope_cache *c);
/* pi_op_rope with per-pair frequency factors (theta_i /= freq_factors[i], n_rot/2 of them; NULL: none),
 * llama.cpp's rope_freqs of Llama 3.1+ files, cos and sin times mscale (ggml's attn_factor: YaRN, phi3's long rope),
 * and an optional cache of rotation tables (NULL: computed for this call alone). Arguments are not checked. */
pi_status pi_rope(pi_threadpool *pool, const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode,
                  float freq_base, float freq_scale, const float *freq_factors, float mscale, pi_rope_cache *cache,
                  pi_tensor *out);
/* softcap: 0, or the scores' cap (pi_op_attention_softcap); sinks: [n_head] or NULL (pi_op_attention_sinks). Arguments
 * are not checked. */
pi_status pi_attention(pi_threadpool *pool, const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                       const pi_tensor *mask, float scale, float softcap, const float *sinks, pi_tensor *out);
/* u[i] = swiglu_oai(g[i], u[i]) for i < n, on the pool (pi_op_swiglu_oai unchecked) */
void      pi_swiglu_oai(pi_threadpool *pool, const float *g, float *u, int64_t n, float alpha, float limit);
/* x[i] = xielu(x[i]) with p = {a_n, a_p, beta, eps} for i < n, on the pool (pi_op_xielu unchecked) */
void      pi_xielu(pi_threadpool *pool, float *x, int64_t n, const float *p);
/* x[i] = cap tanh(x[i] / cap) for i < n, on the pool (cap > 0; pi_op_softcap unchecked) */
void      pi_softcap(pi_threadpool *pool, float *x, int64_t n, float cap);


/* ---- repacking (repack.c): pi_repack on a thread pool ---- */
pi_status pi_repack_on(pi_threadpool *pool, const pi_tensor *w, void *dst, int64_t dst_bytes, pi_tensor *out);
pi_status pi_sparse_pack_on(pi_threadpool *pool, const pi_sparse_ffn_weights *w, int32_t gate_mode, void *dst,
                            int64_t dst_bytes, pi_sparse_ffn_weights *out);

/* ---- sparse FFN (sparse_ffn.c) ---- */
/* out[k] = act(g[k]) w[k] (w NULL: 1) for n channels with the gate given: the scores whose |.| the activation-sparse
 * selection compares with its threshold, and which the calibration histogram (pi_act_histogram kind 0) counts */
void      pi_gate_scores(int32_t act, int64_t n, const float *g, const float *w, float *out);
/* pi_op_sparse_mask over contiguous rows [T][n], unchecked */
void      pi_sparse_mask(pi_threadpool *pool, const float *s, int32_t act, const float *w, float threshold,
                         const float *src, float *dst, int64_t n, int64_t T, int64_t *n_kept, int64_t *counts);
size_t    pi_sparse_ffn_scratch(const pi_sparse_ffn_weights *w, int64_t E, int64_t F, int64_t T);
pi_status pi_sparse_ffn(pi_threadpool *pool, const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode,
                        const pi_tensor *x, const pi_tensor *scores, float threshold, pi_tensor *out,
                        int64_t *n_active, int64_t *neuron_counts, void *scratch);
pi_status pi_predictor(pi_threadpool *pool, const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                       pi_tensor *scores, float *hidden, void *scratch);
pi_status pi_check_sparse_weights(const pi_sparse_ffn_weights *w, int32_t gate_mode, int64_t E, int64_t F);

#endif
