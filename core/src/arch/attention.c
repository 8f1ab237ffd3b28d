/* attention.c: a prompt's attention kernels (ops.c attend_block): the scores and the V step over a cache of any type.
 *
 * Scores: s[j][c] = pi_vec_dot_f16_f32(hd, k_c, q_j) bit for bit, for the queries j < nq and cells c0 <= c < c1 (a
 * cache of another type: its rows as f32 values, from to_f32, in the same operations: pi_vec_dot4_f32_f32's). The
 * 8-row kernels keep each (cell, query) dot in its own 8-lane accumulator and end with a horizontal tree per pair
 * (a quarter of the work at hd = 128). Here the K rows of QK_CELLS cells are transposed once (converted to f32,
 * ATT_W x ATT_W at a time) so that a register holds one element of ATT_W cells (AVX-512: 16, AVX2: 8). vec_dot's
 * order keeps eight chains per dot (element i goes to accumulator i % 8, in element order); the kernel runs one
 * chain at a time for a register tile of QK_QUERIES queries x QK_VECS vectors of cells (each K vector loaded once
 * for the tile's queries, each query element broadcast once for its vectors), parks the chain's sums, and ends with
 * vec_dot's tree ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) and its unfused tail as vertical adds, ATT_W cells
 * at once.
 *
 * V step:
 *   y[j][e] += p[j][c] * v_c[e]   for the queries j < nq, the cells c0 <= c < c1 in order, e < hd
 * with v_c an f16 row, or (to_f32 given) a row of another type as to_f32 gives its values (exact in f32 for every
 * cache type), whose operations are then pi_axpy_f32's on those values (the same as pi_axpy_f16's on an f16 row's):
 *
 * where p[j][c] == -inf marks a cell query j does not see: it is skipped for that query. p arrives as softmax_exp's
 * numerators and becomes attend's probabilities (times inv[j]) in place, a block of cells at a time as the block
 * comes up (0.89-0.96x the time of a pass of its own over rows of scores larger than L2). Each element of each y[j]
 * gets exactly pi_axpy_f16's operations, one fma per seen cell in cell order (so a query's output is the bits of the
 * one-token path, which adds its cells one axpy at a time). A block of cells' V rows is converted to f32 once into
 * a contiguous buffer (the cache's rows of one head lie a whole cell apart); tiles of 8 queries x PV_VECS vectors of
 * elements then stay in registers over the block. Blocks where every query of the tile sees every cell run without
 * masks; the others mask each query's fma (AVX-512: a mask register; AVX2: the old value blended back). Elements
 * past the last whole vector go through pi_axpy_f16 (pi_axpy_f32 on the converted row) from there on, query by
 * query. */
#include "../internal.h"

#include <math.h>
#include <string.h>
#if PI_HAVE_ROWS8
#include <immintrin.h>
#endif

/* On CPUs where pi_cpu_software_prefetch says so, the scores request the next chunk's K rows, the V step the next
 * block's V rows, before working on the current ones: a head's rows lie a whole cell apart, which the hardware
 * prefetchers follow poorly (Zen 5, 2 threads, a 542M llama's 512 queries at depth 3072, bench/ab_ops.py --op
 * attention: the K rows alone 0.91x the time; bench/README.md, 2026-12-07). */

/* x[c] *= f for c < n: a numerator becomes a probability as attend forms it (-inf, a hidden cell, stays -inf: f is
 * positive and finite). Vectorized by the compiler; the same product at every width. */
static void scale_block(float *x, int64_t n, float f) {
    for (int64_t c = 0; c < n; c++) x[c] *= f;
}

/* Whether every p[j][c] of the tile (queries j < m) and cells [c, c + n) is seen (not -inf): eight at a time where
 * the level has vectors (one compare a cell, as the tile's fmas were 8 at a time: a fifth of the V step's time). */
static bool tile_all_seen(const float *const *p, int m, int64_t c, int64_t n) {
    for (int j = 0; j < m; j++) {
        int64_t k = c;
#if PI_HAVE_ROWS8
        __m256 hidden = _mm256_setzero_ps();
        for (; k + 8 <= c + n; k += 8)
            hidden = _mm256_or_ps(hidden,
                                  _mm256_cmp_ps(_mm256_loadu_ps(p[j] + k), _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
        if (_mm256_movemask_ps(hidden)) return false;
#endif
        for (; k < c + n; k++)
            if (p[j][k] == -INFINITY) return false;
    }
    return true;
}

/* The kernels' vectors at this level: ATT_W floats (AVX-512: 16, AVX2: 8). att_f16 converts ATT_W halves. pv_fma_seen
 * adds p v to acc where p is not -inf (a seen cell; NaN counts as seen, as in attend) and keeps acc otherwise.
 * qk_rows converts element d0.. of ATT_W rows (k rows of f16, or of f32 if f32, at kc, row_stride apart, the rest
 * zeros; e elements of each at most) and transposes them: r[i] = element d0 + i of the ATT_W cells. qk_store_first
 * stores the first k lanes. */
#if PI_HAVE_ROWS16
#define ATT_W 16
#define QK_QUERIES 8   /* score tiles: queries x vectors of cells, 8 x 3 accumulators (of 32 registers) */
#define QK_VECS 3
#define PV_VECS 2      /* V step tiles: 8 queries x 2 vectors of elements */
typedef __m512 att_vec;
static inline att_vec att_load(const float *x) { return _mm512_loadu_ps(x); }
static inline void att_store(float *x, att_vec v) { _mm512_storeu_ps(x, v); }
static inline att_vec att_set1(float x) { return _mm512_set1_ps(x); }
static inline att_vec att_zero(void) { return _mm512_setzero_ps(); }
static inline att_vec att_fma(att_vec a, att_vec b, att_vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline att_vec att_add(att_vec a, att_vec b) { return _mm512_add_ps(a, b); }
static inline att_vec att_mul(att_vec a, att_vec b) { return _mm512_mul_ps(a, b); }
static inline att_vec att_f16(const void *x) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)x)); }
static inline att_vec pv_fma_seen(float p, att_vec v, att_vec acc) {
    const __m512 pc = _mm512_set1_ps(p);
    return _mm512_mask3_fmadd_ps(pc, v, acc, _mm512_cmp_ps_mask(pc, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ));
}
static inline void qk_store_first(float *x, att_vec v, int k) {
    _mm512_mask_storeu_ps(x, (__mmask16)(k >= 16 ? 0xffff : (1u << k) - 1), v);
}
static inline void qk_rows(const char *kc, int64_t row_stride, int k, int64_t d0, int64_t e, bool f32,
                           att_vec r[16]) {
    const __mmask16 keep = (__mmask16)(e >= 16 ? 0xffff : (1u << e) - 1);
    for (int i = 0; i < 16; i++)
        r[i] = i >= k ? _mm512_setzero_ps()
             : f32    ? _mm512_maskz_loadu_ps(keep, (const float *)(kc + i * row_stride) + d0)
                      : _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(keep, (const uint16_t *)(kc + i * row_stride) + d0));
    __m512 t[16], u[16];   /* the transposition: rows -> columns */
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {   /* u[g + m], 128-bit lane L: rows g..g+3 of column 4L + m */
        u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
        u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
        u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
        u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        const __m512 a0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88), a1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xDD);
        const __m512 b0 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
        const __m512 b1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xDD);
        r[m] = _mm512_shuffle_f32x4(a0, b0, 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(a0, b0, 0xDD);
        r[4 + m] = _mm512_shuffle_f32x4(a1, b1, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(a1, b1, 0xDD);
    }
}
#elif PI_HAVE_ROWS8
#define ATT_W 8
#define QK_QUERIES 4   /* 4 x 3 accumulators, 3 vectors of K and a broadcast: the 16 registers */
#define QK_VECS 3
#define PV_VECS 1      /* 8 accumulators */
typedef __m256 att_vec;
static inline att_vec att_load(const float *x) { return _mm256_loadu_ps(x); }
static inline void att_store(float *x, att_vec v) { _mm256_storeu_ps(x, v); }
static inline att_vec att_set1(float x) { return _mm256_set1_ps(x); }
static inline att_vec att_zero(void) { return _mm256_setzero_ps(); }
static inline att_vec att_fma(att_vec a, att_vec b, att_vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline att_vec att_add(att_vec a, att_vec b) { return _mm256_add_ps(a, b); }
static inline att_vec att_mul(att_vec a, att_vec b) { return _mm256_mul_ps(a, b); }
static inline att_vec att_f16(const void *x) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x)); }
static inline att_vec pv_fma_seen(float p, att_vec v, att_vec acc) {   /* a hidden cell's fma (maybe NaN) dropped */
    const __m256 pc = _mm256_set1_ps(p);
    const __m256 seen = _mm256_cmp_ps(pc, _mm256_set1_ps(-INFINITY), _CMP_NEQ_UQ);
    return _mm256_blendv_ps(acc, _mm256_fmadd_ps(pc, v, acc), seen);
}
static inline void qk_store_first(float *x, att_vec v, int k) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    memcpy(x, lanes, (size_t)PI_MIN(k, 8) * sizeof(float));
}
static inline void qk_rows(const char *kc, int64_t row_stride, int k, int64_t d0, int64_t e, bool f32,
                           att_vec r[8]) {
    const size_t size = f32 ? sizeof(float) : sizeof(uint16_t);
    for (int i = 0; i < 8; i++) {
        const char *x = kc + i * row_stride + d0 * (int64_t)size;
        float h[8] = { 0 };   /* a short row's elements then zeros (8 f32 or 8 f16), or all zeros past row k */
        if (i >= k || e < 8) {
            if (i < k) memcpy(h, x, (size_t)e * size);
            x = (const char *)h;
        }
        r[i] = f32 ? _mm256_loadu_ps((const float *)x) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x));
    }
    __m256 t[8], u[8];   /* the transposition: rows -> columns */
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {   /* u[g + m], 128-bit lane L: rows g..g+3 of column 4L + m */
        u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
        u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
        u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
        u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
        r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
    }
}
#endif

#if PI_HAVE_ROWS8
#define QK_CELLS (ATT_W * QK_VECS)   /* cells transposed at a time */

/* kt[d][ATT_W v + i] = element d of row i of the k rows at kc (f16, or f32 if f32, k_stride apart) as f32, for
 * i < ATT_W; rows past k are zeros. */
static void transpose_rows(int64_t hd, const char *kc, int64_t k_stride, int k, int v, bool f32,
                           float kt[][QK_CELLS]) {
    for (int64_t d0 = 0; d0 < hd; d0 += ATT_W) {
        att_vec r[ATT_W];
        qk_rows(kc, k_stride, k, d0, hd - d0, f32, r);
        for (int i = 0; i < ATT_W && d0 + i < hd; i++) att_store(kt[d0 + i] + ATT_W * v, r[i]);
    }
}

void pi_attn_qk(int64_t hd, int nq, const float *const *q, int64_t c0, int64_t c1, const void *k, int64_t k_stride,
                pi_to_f32_fn to_f32, float *const *s) {
    const int64_t hd8 = hd / 8 * 8;
    const bool ahead = pi_cpu_software_prefetch();
    float kt[PI_ATT_QK_MAX_HD][QK_CELLS] __attribute__((aligned(64)));   /* kt[d][i]: element d of cell c + i */
    float kf[ATT_W][PI_ATT_QK_MAX_HD] __attribute__((aligned(64)));   /* to_f32: a vector of cells' rows as f32 */
    att_vec part[8][QK_QUERIES][QK_VECS];   /* part[l][j][v]: vec_dot's accumulator l, query j, the cells of vector v */
    for (int64_t c = c0; c < c1; c += QK_CELLS) {
        const int n = (int)PI_MIN(QK_CELLS, c1 - c);
        const char *kc = (const char *)k + c * k_stride;
        if (ahead && c + QK_CELLS < c1)   /* the next chunk's rows */
            pi_prefetch_rows(kc + QK_CELLS * k_stride, PI_MIN(QK_CELLS, c1 - c - QK_CELLS), k_stride,
                             to_f32 ? k_stride : 2 * hd);
        for (int v = 0; v < QK_VECS; v++) {
            const char *kv = kc + ATT_W * v * k_stride;
            const int rows = (int)PI_MIN(ATT_W, n - ATT_W * v);
            if (!to_f32) {
                transpose_rows(hd, kv, k_stride, rows, v, false, kt);
                continue;
            }
            for (int i = 0; i < rows; i++) to_f32(kv + i * k_stride, kf[i], hd);
            transpose_rows(hd, (const char *)kf, (int64_t)sizeof kf[0], rows, v, true, kt);
        }
        for (int j0 = 0; j0 < nq; j0 += QK_QUERIES) {
            const int m = PI_MIN(QK_QUERIES, nq - j0);
            const float *qj[QK_QUERIES];   /* a short tile repeats its last query */
            for (int j = 0; j < QK_QUERIES; j++) qj[j] = q[j0 + PI_MIN(j, m - 1)];
            for (int l = 0; l < 8; l++) {   /* chain l: elements l, l + 8, ... */
                att_vec acc[QK_QUERIES][QK_VECS];
                for (int j = 0; j < QK_QUERIES; j++)
                    for (int v = 0; v < QK_VECS; v++) acc[j][v] = att_zero();
                for (int64_t d = l; d < hd8; d += 8) {
                    att_vec kv[QK_VECS];
                    for (int v = 0; v < QK_VECS; v++) {
                        kv[v] = att_load(kt[d] + ATT_W * v);
                        __asm__("" : "+x"(kv[v]));   /* one load for the queries, not one folded into each fma */
                    }
                    for (int j = 0; j < QK_QUERIES; j++) {
                        att_vec qd = att_set1(qj[j][d]);
                        __asm__("" : "+x"(qd));   /* one broadcast for the vectors */
                        for (int v = 0; v < QK_VECS; v++) acc[j][v] = att_fma(kv[v], qd, acc[j][v]);
                    }
                }
                for (int j = 0; j < QK_QUERIES; j++)
                    for (int v = 0; v < QK_VECS; v++) part[l][j][v] = acc[j][v];
            }
            for (int j = 0; j < m; j++)
                for (int v = 0; v < QK_VECS && ATT_W * v < n; v++) {
                    att_vec a[8];
                    for (int l = 0; l < 8; l++) a[l] = part[l][j][v];
                    att_vec sum = att_add(att_add(att_add(a[0], a[4]), att_add(a[2], a[6])),
                                        att_add(att_add(a[1], a[5]), att_add(a[3], a[7])));
                    for (int64_t d = hd8; d < hd; d++)   /* vec_dot's unfused tail */
                        sum = att_add(sum, att_mul(att_load(kt[d] + ATT_W * v), att_set1(qj[j][d])));
                    qk_store_first(s[j0 + j] + c + ATT_W * v, sum, n - ATT_W * v);
                }
        }
    }
}
#endif

/* Elements [e, hd) past the last whole vector, query by query (the m real ones of the tile): pi_axpy_f16 (f16
 * rows; else pi_axpy_f32 over the row's values from to_f32) from element e (a multiple of 8) on gives them the
 * operations its call over the whole row does. */
static void tail(int64_t hd, int64_t e, const float *const *p, int m, int64_t c0, int64_t c1, const char *v,
                 int64_t v_stride, pi_to_f32_fn to_f32, float *const *y) {
    if (e == hd) return;
    float row[PI_ATT_PV_MAX_HD];
    for (int64_t c = c0; c < c1; c++) {
        if (to_f32) to_f32(v + c * v_stride, row, hd);
        for (int j = 0; j < m; j++) {
            if (p[j][c] == -INFINITY) continue;
            if (to_f32) pi_axpy_f32(hd - e, p[j][c], row + e, y[j] + e);
            else pi_axpy_f16(hd - e, p[j][c], (const uint16_t *)(v + c * v_stride) + e, y[j] + e);
        }
    }
}

#if PI_HAVE_ROWS8
static inline att_vec pv_fma(float p, att_vec v, att_vec acc) { return att_fma(att_set1(p), v, acc); }

#define PV_BLOCK_CELLS 64       /* cells per block at most */
#define PV_BLOCK_FLOATS 8192    /* a block's V rows as f32 (32 KB): in L1 with a tile's probabilities */

/* A tile's queries j < 8, elements [e, e + E ATT_W), the block's cells cb + c for c < n (V rows as f32, hv apart in
 * vf): all = every query sees every cell. */
static inline __attribute__((always_inline)) void pv_tile(int E, bool all, const float *const *pj, float *const *yj,
                                                          int64_t e, int64_t cb, int64_t n, const float *vf,
                                                          int64_t hv) {
    att_vec acc[8][PV_VECS];
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < E; i++) acc[j][i] = att_load(yj[j] + e + i * ATT_W);
    for (int64_t c = 0; c < n; c++) {
        att_vec vv[PV_VECS];
        for (int i = 0; i < E; i++) vv[i] = att_load(vf + c * hv + e + i * ATT_W);
        for (int j = 0; j < 8; j++) {
            const float pc = pj[j][cb + c];
            for (int i = 0; i < E; i++)
                acc[j][i] = all ? pv_fma(pc, vv[i], acc[j][i]) : pv_fma_seen(pc, vv[i], acc[j][i]);
        }
    }
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < E; i++) att_store(yj[j] + e + i * ATT_W, acc[j][i]);
}

void pi_attn_pv(int64_t hd, int nq, float *const *p, const float *inv, int64_t c0, int64_t c1, const void *v,
                int64_t v_stride, pi_to_f32_fn to_f32, float *const *y) {
    const char *vb = v;
    const bool ahead = pi_cpu_software_prefetch();
    float row[PI_ATT_PV_MAX_HD];   /* a row of another type as f32 */
    const int64_t hv = hd / ATT_W * ATT_W;   /* elements in whole vectors */
    const int64_t cells = PI_MAX(1, PI_MIN(PV_BLOCK_CELLS, PV_BLOCK_FLOATS / PI_MAX(hv, 1)));
    float vf[PV_BLOCK_FLOATS] __attribute__((aligned(64)));   /* [cells][hv]: the block's V rows as f32 */
    for (int64_t cb = c0; cb < c1; cb += cells) {
        const int64_t n = PI_MIN(cells, c1 - cb);
        if (ahead && cb + n < c1)   /* the next block's rows */
            pi_prefetch_rows(vb + (cb + n) * v_stride, PI_MIN(cells, c1 - cb - n), v_stride,
                             to_f32 ? v_stride : 2 * hd);
        for (int64_t c = 0; c < n; c++)
            if (!to_f32)
                for (int64_t e = 0; e < hv; e += ATT_W)
                    att_store(vf + c * hv + e, att_f16((const uint16_t *)(vb + (cb + c) * v_stride) + e));
            else if (hv == hd)
                to_f32(vb + (cb + c) * v_stride, vf + c * hv, hd);
            else {
                to_f32(vb + (cb + c) * v_stride, row, hd);
                memcpy(vf + c * hv, row, (size_t)hv * sizeof(float));
            }
        for (int j0 = 0; j0 < nq; j0 += 8) {
            const int m = PI_MIN(8, nq - j0);
            const float *pj[8];
            float *yj[8];
            for (int j = 0; j < 8; j++) {   /* a short tile repeats its last query: the same values, stored again */
                pj[j] = p[j0 + PI_MIN(j, m - 1)];
                yj[j] = y[j0 + PI_MIN(j, m - 1)];
            }
            for (int j = j0; j < j0 + m; j++) scale_block(p[j] + cb, n, inv[j]);
            const bool all = tile_all_seen(pj, m, cb, n);
            int64_t e = 0;
            for (; e + PV_VECS * ATT_W <= hv; e += PV_VECS * ATT_W)
                if (all) pv_tile(PV_VECS, true, pj, yj, e, cb, n, vf, hv);
                else pv_tile(PV_VECS, false, pj, yj, e, cb, n, vf, hv);
            for (; e < hv; e += ATT_W)
                if (all) pv_tile(1, true, pj, yj, e, cb, n, vf, hv);
                else pv_tile(1, false, pj, yj, e, cb, n, vf, hv);
            tail(hd, hv, pj, m, cb, cb + n, vb, v_stride, to_f32, yj);
        }
    }
}
#else   /* scalar reference: query by query, cell by cell */
void pi_attn_pv(int64_t hd, int nq, float *const *p, const float *inv, int64_t c0, int64_t c1, const void *v,
                int64_t v_stride, pi_to_f32_fn to_f32, float *const *y) {
    float row[PI_ATT_PV_MAX_HD];
    for (int j = 0; j < nq; j++) scale_block(p[j] + c0, c1 - c0, inv[j]);
    for (int64_t c = c0; c < c1; c++) {
        const char *vc = (const char *)v + c * v_stride;
        if (to_f32) to_f32(vc, row, hd);
        for (int j = 0; j < nq; j++) {
            if (p[j][c] == -INFINITY) continue;
            if (to_f32) pi_axpy_f32(hd, p[j][c], row, y[j]);
            else pi_axpy_f16(hd, p[j][c], vc, y[j]);
        }
    }
}
#endif
