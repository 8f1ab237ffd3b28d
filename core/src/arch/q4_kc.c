/* q4_kc.c: the sparse down step (and the input-sparse gate) read from a file's own Q4_K matrix (PI_TYPE_Q4_KC),
 * without re-quantizing it: q4_0c.c's column layout for the K-quant that most llama.cpp files (Q4_K_M) hold.
 *
 * W [n_out rows, n_in] in Q4_K: per output e and super-block B of 256 inputs the fp16 d, dmin, per sub-block j
 * of 32 inputs a 6-bit scale sc and min mn, w = d sc_j q - dmin mn_j (q 0..15). Laid out by input:
 *
 *   row i (input i): n_out / 2 bytes, as Q4_0C: chunk c (outputs 64c .. 64c + 63) is 32 bytes, byte j holds
 *                    q(64c + j) in its low nibble and q(64c + 32 + j) in its high one
 *   aux (pi_sparse_ffn_weights.down_t_scales): per super-block B and chunk c, KC_AUX = 1280 bytes at
 *                    (B (n_out / 64) + c) KC_AUX: d[64] and dmin[64] (fp16, output order), then per sub-block j
 *                    sc_j[64] (in the lane order of the kernel's int16 sums: sc_slot) and mn_j[64] (output order)
 *
 * axpy_cols adds the rows of one super-block (count <= 256, idx[k] = row k's input within it, ascending) as the
 * dense Q4_K x Q8_KM dot product adds that super-block's term: h (the rows' coefficients, 0 elsewhere) quantized
 * as Q8_KM (quants_k.h: step bd, multipliers m_j, quants y), then per output the exact integers
 *   sumi = sum_j sc_j m_j sum_{k in j} q_k y_k,   summ = sum_j mn_j m_j sum_{k in j} y_k
 * and y[e] += bd (d sumi - dmin summ), the dense kernels' term (vec_dot_k.c) to the bit: with every input kept
 * the sparse step is the dense product up to the f32 order of the terms. The AVX2 body: two rows' bytes
 * interleaved and one maddubs per 32 outputs (as Q4_0C), int16 sums over runs of up to 16 rows of one sub-block,
 * weighted by sc_j m_j with one madd per two runs. Every level gives the scalar body's bits. n_out must be a
 * multiple of 64. */
#include "../quants_k.h"

#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define KC_AUX 1280   /* aux bytes per super-block and 64 outputs: 20 per output */

/* Where output o (0..63) of a chunk keeps its sc_j byte: the order of the kernel's int16 sums, whose four vectors
 * hold outputs {0-7, 16-23}, {8-15, 24-31}, {32-39, 48-55}, {40-47, 56-63} (unpacklo/hi work per 128-bit lane). */
static inline int sc_slot(int o) {
    const int g = o / 8;
    return 16 * (g / 4 * 2 + g % 2) + 8 * (g % 4 / 2) + o % 8;
}

/* Super-block B (inputs 256B .. 256B + 255) of the Q4_K matrix w (n_out rows, row stride w_stride bytes) ->
 * rows[k] (input 256B + k, n_out / 2 bytes each) and the super-block's aux (n_out / 64 KC_AUX bytes). */
void pi_q4_kc_from_q4_k(int64_t n_out, const void *w, int64_t w_stride, int64_t B, void *const rows[256], void *aux) {
    for (int k = 0; k < 256; k++) memset(rows[k], 0, (size_t)n_out / 2);
    for (int64_t e = 0; e < n_out; e++) {
        const pi_block_q4_K *blk = (const pi_block_q4_K *)((const char *)w + e * w_stride) + B;
        uint8_t *ax = (uint8_t *)aux + e / 64 * KC_AUX;
        const int o = (int)(e % 64);
        memcpy(ax + 2 * o, &blk->d, 2);
        memcpy(ax + 128 + 2 * o, &blk->dmin, 2);
        for (int j = 0; j < 8; j++) pi_k4_scale_min(j, blk->scales, &ax[256 + 64 * j + sc_slot(o)], &ax[768 + 64 * j + o]);
        const int64_t byte = e / 64 * 32 + e % 32, shift = e % 64 < 32 ? 0 : 4;
        for (int k = 0; k < 256; k++) {   /* Q4_K: qs[32p + l] holds sub-block 2p's element l (low), 2p + 1's (high) */
            const int j = k / 32, q = blk->qs[32 * (j / 2) + k % 32] >> (4 * (j % 2)) & 15;
            ((uint8_t *)rows[k])[byte] |= (uint8_t)(q << shift);
        }
    }
}

void pi_axpy_cols_q4_kc(int64_t n, int count, const uint8_t *idx, const float *a, const void *aux,
                        const void *const *rows, float *y) {
    float h[256] = { 0 };
    for (int k = 0; k < count; k++) h[idx[k]] = a[k];
    pi_block_q8_Km hq;
    pi_q8_Km_from_f32(h, &hq, 256);
    int8_t q[256];
    int32_t cm[8] = { 0 };   /* m_j sum_{k in j} y_k: the mins' integer weight of sub-block j */
    for (int k = 0; k < count; k++) cm[idx[k] / 32] += q[k] = hq.k.qs[idx[k]];
    for (int j = 0; j < 8; j++) cm[j] *= hq.m[j];
    const float bd = hq.k.d;
#if defined(__AVX2__)
    /* runs of up to 16 rows of one sub-block (int16 sums: |sum| <= 16 * 15 * 127), rows in pairs (an odd run padded
     * with its first row at coefficient 0); P: the pair's coefficients (y_a, y_b) in every 16-bit lane */
    const uint8_t *r[2 * (128 + 16)];
    __m256i P[128 + 16];
    int run_j[16], run_pair0[17], n_runs = 0, n_pairs = 0;
    for (int k = 0; k < count;) {
        const int j = idx[k] / 32;
        int end = k;
        while (end < count && idx[end] / 32 == j && end - k < 16) end++;
        run_j[n_runs] = j;
        run_pair0[n_runs++] = n_pairs;
        for (int i = k; i < end; i += 2) {
            const bool two = i + 1 < end;
            r[2 * n_pairs] = rows[i];
            r[2 * n_pairs + 1] = rows[two ? i + 1 : i];
            const uint8_t qa = (uint8_t)q[i], qb = two ? (uint8_t)q[i + 1] : 0;
            P[n_pairs++] = _mm256_set1_epi16((int16_t)(uint16_t)(qa | (uint16_t)qb << 8));
        }
        k = end;
    }
    run_pair0[n_runs] = n_pairs;
    int act[8], n_act = 0;   /* sub-blocks with a mins term */
    for (int j = 0; j < 8; j++)
        if (cm[j]) act[n_act++] = j;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256 vbd = _mm256_set1_ps(bd);
    static const int BASE[4] = { 0, 8, 32, 40 };   /* first output of each int16 sum's low 8 lanes */
    /* Outputs in tiles of KC_TILE chunks, the runs two at a time over a tile: each row is read in runs of 256 bytes,
     * up to 32 rows side by side (all of a super-block's rows at once would be up to 256 concurrent streams) */
    enum { KC_TILE = 8 };
    for (int64_t c0 = 0; c0 < n / 64; c0 += KC_TILE) {
        const int nc = (int)PI_MIN(KC_TILE, n / 64 - c0);
        __m256i acc[KC_TILE][8];   /* sumi: acc[.][2i] outputs BASE[i] + {0-3 | 16-19}, [2i + 1] BASE[i] + {4-7 | 20-23} */
        memset(acc, 0, sizeof acc);
        for (int u = 0; u < n_runs; u += 2) {   /* two runs per madd: (s_a, s_b) . (sc_a m_a, sc_b m_b) */
            const int ja = run_j[u], jb = u + 1 < n_runs ? run_j[u + 1] : ja;
            const __m256i ma = _mm256_set1_epi16(hq.m[ja]), mb = _mm256_set1_epi16(u + 1 < n_runs ? hq.m[jb] : 0);
            for (int c = 0; c < nc; c++) {
                const int64_t cc = c0 + c;
                __m256i s[2][4];
                for (int h2 = 0; h2 < 2; h2++) {
                    for (int i = 0; i < 4; i++) s[h2][i] = _mm256_setzero_si256();
                    if (u + h2 >= n_runs) continue;
                    for (int p = run_pair0[u + h2]; p < run_pair0[u + h2 + 1]; p++) {
                        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(r[2 * p] + 32 * cc));
                        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(r[2 * p + 1] + 32 * cc));
                        const __m256i lo = _mm256_unpacklo_epi8(v0, v1), hi = _mm256_unpackhi_epi8(v0, v1);
                        s[h2][0] = _mm256_add_epi16(s[h2][0], _mm256_maddubs_epi16(_mm256_and_si256(lo, m4), P[p]));
                        s[h2][1] = _mm256_add_epi16(s[h2][1], _mm256_maddubs_epi16(_mm256_and_si256(hi, m4), P[p]));
                        s[h2][2] = _mm256_add_epi16(s[h2][2], _mm256_maddubs_epi16(
                                                                  _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4), P[p]));
                        s[h2][3] = _mm256_add_epi16(s[h2][3], _mm256_maddubs_epi16(
                                                                  _mm256_and_si256(_mm256_srli_epi16(hi, 4), m4), P[p]));
                    }
                }
                const uint8_t *ax = (const uint8_t *)aux + cc * KC_AUX;
                for (int i = 0; i < 4; i++) {   /* |s sc m| <= 30480 * 2016: the pair's sum fits int32 */
                    const __m256i wa = _mm256_mullo_epi16(
                        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ax + 256 + 64 * ja + 16 * i))), ma);
                    const __m256i wb = _mm256_mullo_epi16(
                        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ax + 256 + 64 * jb + 16 * i))), mb);
                    acc[c][2 * i] = _mm256_add_epi32(acc[c][2 * i], _mm256_madd_epi16(_mm256_unpacklo_epi16(s[0][i], s[1][i]),
                                                                                      _mm256_unpacklo_epi16(wa, wb)));
                    acc[c][2 * i + 1] = _mm256_add_epi32(acc[c][2 * i + 1],
                                                         _mm256_madd_epi16(_mm256_unpackhi_epi16(s[0][i], s[1][i]),
                                                                           _mm256_unpackhi_epi16(wa, wb)));
                }
            }
        }
        for (int c = 0; c < nc; c++) {
            const int64_t cc = c0 + c;
            const uint8_t *ax = (const uint8_t *)aux + cc * KC_AUX;
            for (int i = 0; i < 4; i++)
                for (int h2 = 0; h2 < 2; h2++) {   /* outputs o0 .. o0 + 7 in order */
                    const int o0 = BASE[i] + 16 * h2;
                    const __m256i si = _mm256_permute2x128_si256(acc[c][2 * i], acc[c][2 * i + 1], h2 ? 0x31 : 0x20);
                    __m256i sm = _mm256_setzero_si256();
                    for (int t = 0; t < n_act; t++)
                        sm = _mm256_add_epi32(sm, _mm256_mullo_epi32(
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ax + 768 + 64 * act[t] + o0))),
                            _mm256_set1_epi32(cm[act[t]])));
                    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ax + 2 * o0)));
                    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ax + 128 + 2 * o0)));
                    const __m256 t = _mm256_mul_ps(vbd, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(si)),
                                                                      _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(sm))));
                    float *yp = y + 64 * cc + o0;
                    _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), t));
                }
        }
    }
#else
    for (int64_t e = 0; e < n; e++) {
        const uint8_t *ax = (const uint8_t *)aux + e / 64 * KC_AUX;
        const int o = (int)(e % 64);
        const int64_t byte = e / 64 * 32 + e % 32, shift = e % 64 < 32 ? 0 : 4;
        int32_t sumi = 0, summ = 0;
        for (int j = 0, k = 0; j < 8; j++) {
            int32_t s = 0;
            for (; k < count && idx[k] / 32 == j; k++) s += q[k] * (((const uint8_t *)rows[k])[byte] >> shift & 15);
            sumi += ax[256 + 64 * j + sc_slot(o)] * hq.m[j] * s;
            summ += ax[768 + 64 * j + o] * cm[j];
        }
        uint16_t d, dmin;
        memcpy(&d, ax + 2 * o, 2);
        memcpy(&dmin, ax + 128 + 2 * o, 2);
        y[e] += bd * (pi_fp16_to_f32(d) * (float)sumi - pi_fp16_to_f32(dmin) * (float)summ);
    }
#endif
}
