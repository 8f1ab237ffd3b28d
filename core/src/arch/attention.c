/* attention.c: a prompt's attention kernels (ops.c attend_block) for an f16 cache: the scores (AVX-512) and the V step.
 *
 * Scores: s[j][c] = pi_vec_dot_f16_f32(hd, k_c, q_j) bit for bit, for the queries j < nq and cells c0 <= c < c1. The
 * 8-row kernels keep each (cell, query) dot in its own 8-lane accumulator and end with a horizontal tree per pair
 * (a quarter of the work at hd = 128). Here 16 cells' K rows are transposed once (converted to f32, 16 x 16 at a
 * time) so that a register holds one element of 16 cells; each query keeps eight such accumulators, one per lane
 * of vec_dot's order (element i goes to accumulator i % 8, in element order), so the same fma chains run with the
 * cells in the lanes, and vec_dot's tree ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) and its unfused tail
 * are vertical adds, 16 cells at once.
 *
 * V step:
 *   y[j][e] += p[j][c] * v_c[e]   for the queries j < nq, the cells c0 <= c < c1 in order, e < hd
 *
 * where p[j][c] == -inf marks a cell query j does not see: it is skipped for that query. Each element of each y[j]
 * gets exactly pi_axpy_f16's operations, one fma per seen cell in cell order (so a query's output is the bits of the
 * one-token path, which adds its cells one axpy at a time). The vector bodies keep a tile of 8 queries x one vector
 * of elements in registers over a block of ATT_PV_CELLS cells and convert each V vector once per tile, instead of
 * loading and storing y for every 8 cells and converting each V vector once per 4 queries (the axpy8xq kernel it
 * replaces). Blocks where every query of the tile sees every cell run without masks; the others mask each query's
 * fma (AVX-512: a mask register; AVX2: the old value blended back). hd must be a multiple of the vector width. */
#include "../internal.h"

#include <math.h>
#if PI_HAVE_ROWS8
#include <immintrin.h>
#endif

#define ATT_PV_CELLS 64   /* cells per block: a tile's probabilities (8 x 64 floats) and V rows stay in L1 */

/* On CPUs where pi_cpu_software_prefetch says so, the scores request the next 16 K rows, the V step the next block's
 * V rows, before working on the current ones: a head's rows lie a whole cell apart, which the hardware prefetchers
 * follow poorly (Zen 5, 2 threads, a 542M llama's 512 queries at depth 3072, bench/ab_ops.py --op attention: the K
 * rows alone 0.91x the time; bench/README.md, 2026-12-07). */

/* Whether every p[j][c] of the tile (queries j < m) and cells [c, c + n) is seen (not -inf). */
static bool tile_all_seen(const float *const *p, int m, int64_t c, int64_t n) {
    for (int j = 0; j < m; j++)
        for (int64_t k = c; k < c + n; k++)
            if (p[j][k] == -INFINITY) return false;
    return true;
}

#if PI_HAVE_ROWS16
/* r[i] = row i (16 floats) -> r[j] = column j (lane i = row i). */
static inline void transpose16x16(__m512 r[16]) {
    __m512 t[16], u[16];
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

#define ATT_QK_QUERIES 3   /* queries per pass: 3 x 8 accumulators */

void pi_attn_qk_f16(int64_t hd, int nq, const float *const *q, int64_t c0, int64_t c1, const void *k, int64_t k_stride,
                    float *const *s) {
    const int64_t hd8 = hd / 8 * 8;
    const bool ahead = pi_cpu_software_prefetch();
    float kt[PI_ATT_QK_MAX_HD][16] __attribute__((aligned(64)));   /* kt[d][r]: element d of cell c + r */
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16) {
        const char *kc = (const char *)k + c * k_stride;
        if (ahead && c + 32 <= c1) pi_prefetch_rows(kc + 16 * k_stride, 16, k_stride, 2 * hd);   /* the next 16 */
        for (int64_t d0 = 0; d0 < hd; d0 += 16) {
            const __mmask16 keep = (__mmask16)(hd - d0 >= 16 ? 0xffff : (1u << (hd - d0)) - 1);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(keep, (const uint16_t *)(kc + i * k_stride) + d0));
            transpose16x16(r);
            for (int i = 0; i < 16 && d0 + i < hd; i++) _mm512_store_ps(kt[d0 + i], r[i]);
        }
        for (int j0 = 0; j0 < nq; j0 += ATT_QK_QUERIES) {
            const int m = PI_MIN(ATT_QK_QUERIES, nq - j0);
            const float *qj[ATT_QK_QUERIES];
            for (int j = 0; j < ATT_QK_QUERIES; j++) qj[j] = q[j0 + PI_MIN(j, m - 1)];
            __m512 acc[ATT_QK_QUERIES][8];
            for (int j = 0; j < ATT_QK_QUERIES; j++)
                for (int l = 0; l < 8; l++) acc[j][l] = _mm512_setzero_ps();
            for (int64_t d = 0; d < hd8; d += 8)
                for (int l = 0; l < 8; l++) {
                    __m512 kv = _mm512_load_ps(kt[d + l]);
                    __asm__("" : "+v"(kv));   /* one load for the queries, not one folded into each fma */
                    for (int j = 0; j < ATT_QK_QUERIES; j++)
                        acc[j][l] = _mm512_fmadd_ps(kv, _mm512_set1_ps(qj[j][d + l]), acc[j][l]);
                }
            for (int j = 0; j < m; j++) {
                const __m512 *a8 = acc[j];   /* vec_dot's tree */
                __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8[0], a8[4]), _mm512_add_ps(a8[2], a8[6])),
                                           _mm512_add_ps(_mm512_add_ps(a8[1], a8[5]), _mm512_add_ps(a8[3], a8[7])));
                for (int64_t d = hd8; d < hd; d++)   /* vec_dot's unfused tail */
                    sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_load_ps(kt[d]), _mm512_set1_ps(qj[j][d])));
                _mm512_storeu_ps(s[j0 + j] + c, sum);
            }
        }
    }
    for (; c < c1; c++)
        for (int j = 0; j < nq; j++) s[j][c] = pi_vec_dot_f16_f32(hd, (const char *)k + c * k_stride, q[j]);
}
#endif

/* Elements [e, hd) past the last whole vector, query by query (the m real ones of the tile): pi_axpy_f16 from
 * element e (a multiple of 8) on gives them the operations its call over the whole row does. */
static void tail(int64_t hd, int64_t e, const float *const *p, int m, int64_t c0, int64_t c1, const char *v,
                 int64_t v_stride, float *const *y) {
    if (e == hd) return;
    for (int j = 0; j < m; j++)
        for (int64_t c = c0; c < c1; c++)
            if (p[j][c] != -INFINITY) pi_axpy_f16(hd - e, p[j][c], (const uint16_t *)(v + c * v_stride) + e, y[j] + e);
}

/* One vector of the V step at this level: PV_W floats (AVX-512: 16, AVX2: 8). pv_fma_seen adds p v to acc where p
 * is not -inf (a seen cell; NaN counts as seen, as in attend) and keeps acc otherwise. */
#if PI_HAVE_ROWS16
#define PV_W 16
typedef __m512 pv_vec;
static inline pv_vec pv_load(const float *x) { return _mm512_loadu_ps(x); }
static inline void pv_store(float *x, pv_vec v) { _mm512_storeu_ps(x, v); }
static inline pv_vec pv_f16(const void *x) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)x)); }
static inline pv_vec pv_fma(const float *p, pv_vec v, pv_vec acc) {
    return _mm512_fmadd_ps(_mm512_set1_ps(*p), v, acc);
}
static inline pv_vec pv_fma_seen(const float *p, pv_vec v, pv_vec acc) {
    const __m512 pc = _mm512_set1_ps(*p);
    return _mm512_mask3_fmadd_ps(pc, v, acc, _mm512_cmp_ps_mask(pc, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ));
}
#elif PI_HAVE_ROWS8
#define PV_W 8
typedef __m256 pv_vec;
static inline pv_vec pv_load(const float *x) { return _mm256_loadu_ps(x); }
static inline void pv_store(float *x, pv_vec v) { _mm256_storeu_ps(x, v); }
static inline pv_vec pv_f16(const void *x) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x)); }
static inline pv_vec pv_fma(const float *p, pv_vec v, pv_vec acc) {
    return _mm256_fmadd_ps(_mm256_broadcast_ss(p), v, acc);
}
static inline pv_vec pv_fma_seen(const float *p, pv_vec v, pv_vec acc) {   /* a hidden cell's fma (maybe NaN) dropped */
    const __m256 pc = _mm256_broadcast_ss(p);
    const __m256 seen = _mm256_cmp_ps(pc, _mm256_set1_ps(-INFINITY), _CMP_NEQ_UQ);
    return _mm256_blendv_ps(acc, _mm256_fmadd_ps(pc, v, acc), seen);
}
#endif

#if PI_HAVE_ROWS8
void pi_attn_pv_f16(int64_t hd, int nq, const float *const *p, int64_t c0, int64_t c1, const void *v,
                    int64_t v_stride, float *const *y) {
    const char *vb = v;
    const bool ahead = pi_cpu_software_prefetch();
    for (int64_t cb = c0; cb < c1; cb += ATT_PV_CELLS) {
        const int64_t ce = PI_MIN(c1, cb + ATT_PV_CELLS);
        if (ahead && ce < c1)   /* the next block's rows */
            pi_prefetch_rows(vb + ce * v_stride, PI_MIN(ATT_PV_CELLS, c1 - ce), v_stride, 2 * hd);
        for (int j0 = 0; j0 < nq; j0 += 8) {
            const int m = PI_MIN(8, nq - j0);
            const float *pj[8];
            float *yj[8];
            for (int j = 0; j < 8; j++) {   /* a short tile repeats its last query: the same values, stored again */
                pj[j] = p[j0 + PI_MIN(j, m - 1)];
                yj[j] = y[j0 + PI_MIN(j, m - 1)];
            }
            const bool all = tile_all_seen(pj, m, cb, ce - cb);
            int64_t e = 0;
            for (; e + PV_W <= hd; e += PV_W) {
                pv_vec acc[8];
                for (int j = 0; j < 8; j++) acc[j] = pv_load(yj[j] + e);
                if (all)
                    for (int64_t c = cb; c < ce; c++) {
                        const pv_vec vv = pv_f16((const uint16_t *)(vb + c * v_stride) + e);
                        for (int j = 0; j < 8; j++) acc[j] = pv_fma(&pj[j][c], vv, acc[j]);
                    }
                else
                    for (int64_t c = cb; c < ce; c++) {
                        const pv_vec vv = pv_f16((const uint16_t *)(vb + c * v_stride) + e);
                        for (int j = 0; j < 8; j++) acc[j] = pv_fma_seen(&pj[j][c], vv, acc[j]);
                    }
                for (int j = 0; j < 8; j++) pv_store(yj[j] + e, acc[j]);
            }
            tail(hd, e, pj, m, cb, ce, vb, v_stride, yj);
        }
    }
}
#else   /* scalar reference: query by query, cell by cell */
void pi_attn_pv_f16(int64_t hd, int nq, const float *const *p, int64_t c0, int64_t c1, const void *v,
                    int64_t v_stride, float *const *y) {
    for (int j = 0; j < nq; j++)
        for (int64_t c = c0; c < c1; c++)
            if (p[j][c] != -INFINITY) pi_axpy_f16(hd, p[j][c], (const char *)v + c * v_stride, y[j]);
}
#endif
