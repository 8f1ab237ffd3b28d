/* attention.c: the V step of a prompt's attention (ops.c attend_block), for an f16 cache.
 *
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

/* Whether every p[j][c] of the tile (queries j < m) and cells [c, c + n) is seen (not -inf). */
static bool tile_all_seen(const float *const *p, int m, int64_t c, int64_t n) {
    for (int j = 0; j < m; j++)
        for (int64_t k = c; k < c + n; k++)
            if (p[j][k] == -INFINITY) return false;
    return true;
}

/* Elements [e, hd) past the last whole vector, query by query (the m real ones of the tile): pi_axpy_f16 from
 * element e (a multiple of 8) on gives them the operations its call over the whole row does. */
static void tail(int64_t hd, int64_t e, const float *const *p, int m, int64_t c0, int64_t c1, const char *v,
                 int64_t v_stride, float *const *y) {
    if (e == hd) return;
    for (int j = 0; j < m; j++)
        for (int64_t c = c0; c < c1; c++)
            if (p[j][c] != -INFINITY) pi_axpy_f16(hd - e, p[j][c], (const uint16_t *)(v + c * v_stride) + e, y[j] + e);
}

#if PI_HAVE_ROWS16
void pi_attn_pv_f16(int64_t hd, int nq, const float *const *p, int64_t c0, int64_t c1, const void *v,
                    int64_t v_stride, float *const *y) {
    const char *vb = v;
    const __m512 hidden = _mm512_set1_ps(-INFINITY);
    for (int64_t cb = c0; cb < c1; cb += ATT_PV_CELLS) {
        const int64_t ce = PI_MIN(c1, cb + ATT_PV_CELLS);
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
            for (; e + 16 <= hd; e += 16) {
                __m512 acc[8];
                for (int j = 0; j < 8; j++) acc[j] = _mm512_loadu_ps(yj[j] + e);
                if (all)
                    for (int64_t c = cb; c < ce; c++) {
                        const __m512 vv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vb + c * v_stride) + e / 16));
                        for (int j = 0; j < 8; j++) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(pj[j][c]), vv, acc[j]);
                    }
                else
                    for (int64_t c = cb; c < ce; c++) {
                        const __m512 vv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vb + c * v_stride) + e / 16));
                        for (int j = 0; j < 8; j++) {
                            const __m512 pc = _mm512_set1_ps(pj[j][c]);
                            acc[j] = _mm512_mask3_fmadd_ps(pc, vv, acc[j], _mm512_cmp_ps_mask(pc, hidden, _CMP_NEQ_UQ));
                        }
                    }
                for (int j = 0; j < 8; j++) _mm512_storeu_ps(yj[j] + e, acc[j]);
            }
            tail(hd, e, pj, m, cb, ce, vb, v_stride, yj);
        }
    }
}
#elif PI_HAVE_ROWS8
void pi_attn_pv_f16(int64_t hd, int nq, const float *const *p, int64_t c0, int64_t c1, const void *v,
                    int64_t v_stride, float *const *y) {
    const char *vb = v;
    const __m256 hidden = _mm256_set1_ps(-INFINITY);
    for (int64_t cb = c0; cb < c1; cb += ATT_PV_CELLS) {
        const int64_t ce = PI_MIN(c1, cb + ATT_PV_CELLS);
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
            for (; e + 8 <= hd; e += 8) {
                __m256 acc[8];
                for (int j = 0; j < 8; j++) acc[j] = _mm256_loadu_ps(yj[j] + e);
                if (all)
                    for (int64_t c = cb; c < ce; c++) {
                        const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vb + c * v_stride) + e / 8));
                        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&pj[j][c]), vv, acc[j]);
                    }
                else
                    for (int64_t c = cb; c < ce; c++) {
                        const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vb + c * v_stride) + e / 8));
                        for (int j = 0; j < 8; j++) {   /* a hidden cell's fma result is dropped (it may be NaN) */
                            const __m256 pc = _mm256_broadcast_ss(&pj[j][c]);
                            acc[j] = _mm256_blendv_ps(acc[j], _mm256_fmadd_ps(pc, vv, acc[j]),
                                                      _mm256_cmp_ps(pc, hidden, _CMP_NEQ_UQ));
                        }
                    }
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(yj[j] + e, acc[j]);
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
