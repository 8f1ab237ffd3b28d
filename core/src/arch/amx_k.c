/* amx_k.c: AMX tile kernels of the K-quants Q4_K, Q5_K and Q6_K (the amx level only; level.c includes it where
 * __AMX_INT8__ is set). 16 rows at any addresses (the file's layout), or one Q4_KX16 group (pi_tiles_q4_Kx16_q8_K:
 * its quant words are the B tiles' rows, only the nibbles are split) x nt tokens (a multiple of 16) of Q8_KM
 * (Q4_K, Q5_K) or Q8_K (Q6_K) activations; bit-identical to pi_vec_dot_q4_K_q8_K / _q5_K_ / _q6_K_ per (row, token).
 *
 * Canonical orders (vec_dot_k.c, rows8_k.c): per super-block exact integers, then one float step in order:
 *   Q4_K, Q5_K (Q8_KM activations): sumi = sum_j sc_j m_j sum_l q_l y_l, summ = sum_j mn_j m_j (bsum_2j +
 *   bsum_2j+1) over 8 sub-blocks of 32 (q unsigned 0..15 / 0..31), acc = acc + d_x * (d * sumi - dmin * summ)
 *   Q6_K (Q8_K activations): sumi = sum_j sc_j sum_l (u_l - 32) y_l over 16 sub-blocks of 16 (sc_j int8),
 *   acc = acc + (d_x * d) * sumi
 * How it survives the tiles: one tile product per sub-block (k = 32 bytes, 16 for Q6_K) gives the exact
 * sub-block sums C_j of 16 tokens x 16 rows (TDPBSSD, int32), and an integer epilogue adds the scale times C_j
 * (lanes = rows: the scales are per row) into one int32 accumulator per token, which is sumi exactly:
 * only the grouping of integer additions changes. summ comes from the activations' bsums (vpmaddwd of pairs),
 * and the float step runs per token with the 16 rows in the lanes.
 *
 * Tiles per sub-block j of super-block b (amx_util.h numbering):
 *   A  [16 tokens][k bytes]            s8 activations, straight from the Q8_KM / Q8_K rows
 *   B  [k/4][16 rows x 4 bytes]        s8 weights of sub-block j (q for Q5_K, q - 8 for Q4_K, u - 32 for Q6_K),
 *                                      built per K chunk
 *   C  [16 tokens][16 rows]            int32 sub-block sums
 *
 * The B tiles, scales and mins of a chunk of AMX_K_KC super-blocks are decoded once and serve every token
 * tile of the call (up to AMX_K_TG tokens per pass over K); between chunks the float accumulators wait in
 * `accb` (a float stored and loaded is the same float). */
#include "../quants_k.h"

#include "amx_util.h"

#include <stddef.h>

#ifndef AMX_K_KC
#define AMX_K_KC 4      /* super-blocks per K chunk: B tiles of 16 KB */
#endif
#define AMX_K_TG 128    /* tokens per pass over K */

/* sumi[t] += sc * C[t] for the 16 tokens of the int32 tile ct [16 tokens][16 rows] (lanes = rows). */
static inline void amx_scale_add(const int32_t *ct, __m512i sc, __m512i sumi[16]) {
    for (int t = 0; t < 16; t++)
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(sc, _mm512_load_si512((const __m512i *)(ct + 16 * t))));
}

/* Byte k (< 4) of every 32-bit lane, zero-extended. */
static inline __m512i amx_lane_byte(__m512i v, int k) {
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * k), _mm512_set1_epi32(0xff));
}

/* ---- Q4_K and Q5_K (activations Q8_KM) ----
 * Q8_KM's multipliers m_j (1..32, per token and sub-block: quants_k.h) fold into the weights' scales in the
 * canonical order: sumi = sum_j (sc_j m_j) C_j and summ = sum_j (mn_j m_j) (bsum_2j + bsum_2j+1), where
 * C_j = sum_l q_l y_l. Since m_j belongs to the token and sc_j to the row, the scales cannot go into the B
 * tiles: one product per 32-element sub-block (k = 32), then per token sumi += (sc_j m_j) * C_j, where
 * sc_j m_j < 2^11 comes from one int16 multiply (vpmullw); |sumi| < 2^31 (quants_k.h's budget). Q5_K (q <= 31
 * as s8) takes the product with C_j from vpmulld (amx_scale_m_add); Q4_K's B tiles hold q - 8, so that two
 * sub-blocks' sums fit int16 pairs and one vpdpwssd adds both (amx_q4_K_pair_add). */

typedef struct {
    _Alignas(64) int8_t bt[8][8 * 64];   /* B tiles of the 8 sub-blocks: q (Q5_K) or q - 8 (Q4_K), [8][16 rows x 4] */
    _Alignas(64) int32_t sc[8][16];      /* Q5_K: sc_j per row, in the low int16 of each lane (high half zero) */
    _Alignas(64) int32_t sp[4][16];      /* Q4_K: (sc_2i, sc_2i+1) per row as two int16 (the pair epilogue) */
    _Alignas(64) int32_t mp[4][16];      /* (mn_2i, mn_2i+1) per row as two int16 */
    _Alignas(64) float d[16], dmin[16];
} amx_q4_K_block;

/* Super-block b of the 16 rows p[] (p[r] = row r's block) -> its tiles and scales; five_bit: Q5_K (q = nibble |
 * bit 2jj (low nibbles) or 2jj + 1 (high nibbles) of qh[l] << 4). */
static inline __attribute__((always_inline)) void amx_q4_K_decode(const char *const *p, amx_q4_K_block *o, const int five_bit,
                                                                  const pi_block_q4_Kx16 *gb, const int interleaved) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m6 = _mm512_set1_epi8(0x3f), m2h = _mm512_set1_epi8(0x30);
    __m512i h[4];   /* bytes 0..15: d, dmin, the 12 packed scale bytes q[0..11] (pi_k4_scale_min) */
    if (interleaved) for (int w = 0; w < 3; w++) h[1 + w] = _mm512_loadu_si512(gb->scales[w]);   /* interleaved: lanes as they stand */
    else amx_transpose16x16(p, 0, h);
    const __m512i sc03 = _mm512_and_si512(h[1], m6), mn03 = _mm512_and_si512(h[2], m6);
    const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(h[3], m4), _mm512_and_si512(_mm512_srli_epi32(h[1], 2), m2h));
    const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 4), m4),
                                         _mm512_and_si512(_mm512_srli_epi32(h[2], 2), m2h));
    if (five_bit)
        for (int j = 0; j < 8; j++) _mm512_store_si512((__m512i *)o->sc[j], amx_lane_byte(j < 4 ? sc03 : sc47, j % 4));
    for (int i = 0; i < 4; i++) {
        const __m512i v = i < 2 ? mn03 : mn47, u = i < 2 ? sc03 : sc47;
        const int k = (2 * i) % 4;
        _mm512_store_si512((__m512i *)o->mp[i], _mm512_or_si512(amx_lane_byte(v, k), _mm512_slli_epi32(amx_lane_byte(v, k + 1), 16)));
        if (!five_bit)
            _mm512_store_si512((__m512i *)o->sp[i], _mm512_or_si512(amx_lane_byte(u, k), _mm512_slli_epi32(amx_lane_byte(u, k + 1), 16)));
    }
    _mm512_store_ps(o->d, _mm512_cvtph_ps(interleaved ? _mm256_loadu_si256((const __m256i *)gb->d) : _mm512_cvtepi32_epi16(h[0])));
    _mm512_store_ps(o->dmin, _mm512_cvtph_ps(interleaved ? _mm256_loadu_si256((const __m256i *)gb->dmin)
                                                : _mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16))));
    const size_t qs_offset = five_bit ? offsetof(pi_block_q5_K, qs) : offsetof(pi_block_q4_K, qs);
    __m512i qh[8];   /* Q5_K: qh[0..31] transposed like the quants (the same bytes serve every pair jj) */
    if (five_bit) {
        amx_transpose16x16(p, offsetof(pi_block_q5_K, qh), qh);
        amx_transpose16x16(p, offsetof(pi_block_q5_K, qh) + 16, qh + 4);
    }
    for (int jj = 0; jj < 4; jj++) {   /* qs[32 jj ..]: low nibbles sub-block 2 jj, high nibbles 2 jj + 1 */
        __m512i c[8];
        if (interleaved) for (int m = 0; m < 8; m++) c[m] = _mm512_loadu_si512(gb->qs[8 * jj + m]);
        else {
            amx_transpose16x16(p, qs_offset + 32 * jj, c);
            amx_transpose16x16(p, qs_offset + 32 * jj + 16, c + 4);
        }
        for (int m = 0; m < 8; m++) {
            __m512i lo = _mm512_and_si512(c[m], m4), hi = _mm512_and_si512(_mm512_srli_epi16(c[m], 4), m4);
            if (five_bit) {   /* bit 2jj (2jj + 1) of each qh byte -> bit 4 (16-bit shifts < 8 keep it in its byte) */
                const __m512i one = _mm512_set1_epi8(1);
                lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh[m], 2 * jj), one), 4));
                hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh[m], 2 * jj + 1), one), 4));
            }
            if (!five_bit) {   /* Q4_K: q - 8, so that a sub-block's product fits int16 (the pair epilogue) */
                lo = _mm512_sub_epi8(lo, _mm512_set1_epi8(8));
                hi = _mm512_sub_epi8(hi, _mm512_set1_epi8(8));
            }
            _mm512_store_si512((__m512i *)(o->bt[2 * jj] + 64 * m), lo);
            _mm512_store_si512((__m512i *)(o->bt[2 * jj + 1] + 64 * m), hi);
        }
    }
}

/* The 32-bit word at p, in every lane: its low int16 is the multiplier m_j (the high one, m_j+1, meets the zero
 * high halves of sc / is used as the pair's second multiplier). */
static inline __m512i amx_bcast32(const char *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* sumi[t] += (sc_j m_j(t)) * C[t] for the 16 tokens of the int32 tile ct; xm = token 0's m_j. */
static inline void amx_scale_m_add(const int32_t *ct, __m512i sc, const char *xm, int64_t x_stride, __m512i sumi[16]) {
    for (int t = 0; t < 16; t++) {
        const __m512i scm = _mm512_mullo_epi16(sc, amx_bcast32(xm + t * x_stride));   /* < 2^11: exact */
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(scm, _mm512_load_si512((const __m512i *)(ct + 16 * t))));
    }
}

/* Q4_K's epilogue of sub-blocks 2i, 2i+1 at once: with B = q - 8, the tiles ct[0], ct[1] hold C'_j = sum (q - 8) y
 * = C_j - 8 S_j (S_j the activations' sub-block sum), |C'_j| <= 32 * 8 * 127 < 2^15, so one vpshufb packs the two
 * into int16 pairs per row and one vpdpwssd adds (sc_j m_j) C'_j for both; a second adds (sc_j m_j) 8 S_j
 * (8 |S_j| <= 32512). The sum is sumi's exact integer sum_j sc_j m_j C_j, grouped differently (every partial
 * sum < 2^30). sp = (sc_2i, sc_2i+1) per row, xm = token 0's (m_2i, m_2i+1), bs8[t][i] = token t's (8 S_2i,
 * 8 S_2i+1). */
static inline void amx_q4_K_pair_add(const int32_t ct[2][16 * 16], __m512i sp, const char *xm, int64_t x_stride,
                                     const int32_t bs8[16][4], int i, __m512i sumi[16]) {
    /* bytes 0, 1 of every dword of C'_2i+1 to bytes 2, 3 (vpshufb indices within each 128-bit lane) */
    const __m512i up = _mm512_set4_epi32(0x0d0c8080, 0x09088080, 0x05048080, 0x01008080);
    for (int t = 0; t < 16; t++) {
        const __m512i pair = _mm512_mask_shuffle_epi8(_mm512_load_si512((const __m512i *)(ct[0] + 16 * t)), 0xCCCCCCCCCCCCCCCCull,
                                                      _mm512_load_si512((const __m512i *)(ct[1] + 16 * t)), up);
        const __m512i scm = _mm512_mullo_epi16(sp, amx_bcast32(xm + t * x_stride));   /* (sc_j m_j) < 2^11: exact */
        sumi[t] = _mm512_dpwssd_epi32(sumi[t], pair, scm);
        sumi[t] = _mm512_dpwssd_epi32(sumi[t], scm, _mm512_set1_epi32(bs8[t][i]));
    }
}

/* 16 rows at any addresses (rows) or one Q4_KX16 group (interleaved: group, Q4_K only). */
static inline __attribute__((always_inline)) void amx_k4_rows(int64_t n, const void *const *rows,
                                                              const pi_block_q4_Kx16 *group, const int interleaved,
                                                              const char *x,
                                                              int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                              const int five_bit) {
    const int64_t block_bytes = five_bit ? (int64_t)sizeof(pi_block_q5_K) : (int64_t)sizeof(pi_block_q4_K);
    const int64_t nb = n / PI_QK_K, bsz = (int64_t)sizeof(pi_block_q8_Km);
    const int64_t qoff = (int64_t)offsetof(pi_block_q8_Km, k.qs), boff = (int64_t)offsetof(pi_block_q8_Km, k.bsums);
    const int64_t moff = (int64_t)offsetof(pi_block_q8_Km, m);
    amx_q4_K_block blk[AMX_K_KC];
    _Alignas(64) float accb[AMX_K_TG][16];
    _Alignas(64) int32_t ct[4][2][16 * 16];   /* four pairs' C slots */
    for (int g0 = 0; g0 < nt; g0 += AMX_K_TG) {
        const int ntiles = PI_MIN(AMX_K_TG, nt - g0) / 16;
        memset(accb, 0, sizeof accb);
        for (int64_t c0 = 0; c0 < nb; c0 += AMX_K_KC) {
            const int64_t kc = PI_MIN(AMX_K_KC, nb - c0);
            for (int64_t b = 0; b < kc; b++) {
                const char *p[16];
                if (!interleaved)
                    for (int r = 0; r < 16; r++) p[r] = (const char *)rows[r] + (c0 + b) * block_bytes;
                amx_q4_K_decode(p, &blk[b], five_bit, interleaved ? group + c0 + b : NULL, interleaved);
            }
            __asm__ volatile("" ::: "memory");   /* the tile loads below read blk */
            for (int tt = 0; tt < ntiles; tt++) {
                const char *xt = x + (g0 + 16 * tt) * x_stride + c0 * bsz;
                /* pairs of sub-blocks q = 4 b + j / 2 in order; each pair's two products are issued two pairs ahead of
                 * its epilogue (four C slots), so the epilogue's loads find the tile stores done */
                const int64_t npairs = 4 * kc;
                int64_t issued = 0;
                __m512i sumi[16];
                _Alignas(16) int32_t bs[16][4], bs8[16][4];   /* per token (S_2i, S_2i+1) and (Q4_K) 8 times that, int16 pairs */
                for (int64_t q = 0; q < npairs; q++) {
                    for (; issued < PI_MIN(q + 3, npairs); issued++) {
                        const int64_t ib = issued / 4, j = 2 * (issued % 4);
                        const char *xq = xt + ib * bsz + qoff + 32 * j;
                        AMX_PRODUCT_PAIR(blk[ib].bt[j], xq, ct[issued % 4][0], blk[ib].bt[j + 1], xq + 32, ct[issued % 4][1]);
                    }
                    const int64_t b = q / 4;
                    const int i = (int)(q % 4);
                    const amx_q4_K_block *o = &blk[b];
                    const char *xm = xt + b * bsz + moff;
                    if (i == 0) {
                        for (int t = 0; t < 16; t++) {
                            sumi[t] = _mm512_setzero_si512();
                            const char *bsum = xt + t * x_stride + b * bsz + boff;
                            const __m128i v = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsum),
                                                             _mm_loadu_si128((const __m128i *)(bsum + 16)));
                            _mm_store_si128((__m128i *)bs[t], v);
                            if (!five_bit) _mm_store_si128((__m128i *)bs8[t], _mm_slli_epi16(v, 3));
                        }
                    }
                    if (!five_bit)
                        amx_q4_K_pair_add(ct[q % 4], _mm512_load_si512((const __m512i *)o->sp[i]), xm + 4 * i, x_stride,
                                          bs8, i, sumi);
                    else {
                        amx_scale_m_add(ct[q % 4][0], _mm512_load_si512((const __m512i *)o->sc[2 * i]), xm + 4 * i, x_stride,
                                        sumi);
                        amx_scale_m_add(ct[q % 4][1], _mm512_load_si512((const __m512i *)o->sc[2 * i + 1]), xm + 4 * i + 2,
                                        x_stride, sumi);
                    }
                    if (i < 3) continue;
                    /* the super-block's float step: summ = sum_i (mn_2i m_2i, mn_2i+1 m_2i+1) . (S_2i, S_2i+1) */
                    const __m512 d = _mm512_load_ps(o->d), dmin = _mm512_load_ps(o->dmin);
                    for (int t = 0; t < 16; t++) {
                        const char *xb = xt + t * x_stride + b * bsz;
                        float dx;
                        memcpy(&dx, xb, sizeof dx);
                        __m512i summ = _mm512_setzero_si512();
                        for (int k = 0; k < 4; k++) {   /* mn_j m_j < 2^11 */
                            const __m512i mm = _mm512_mullo_epi16(_mm512_load_si512((const __m512i *)o->mp[k]),
                                                                  amx_bcast32(xb + moff + 4 * k));
                            summ = _mm512_dpwssd_epi32(summ, mm, _mm512_set1_epi32(bs[t][k]));
                        }
                        const __m512 v = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi[t])),
                                                       _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summ)));
                        float *acc = accb[16 * tt + t];
                        _mm512_store_ps(acc, _mm512_add_ps(_mm512_load_ps(acc), _mm512_mul_ps(_mm512_set1_ps(dx), v)));
                    }
                }
            }
            __asm__ volatile("" ::: "memory");   /* the next chunk's decoding overwrites blk */
        }
        for (int t = 0; t < 16 * ntiles; t++) _mm512_storeu_ps(y + (g0 + t) * y_stride, _mm512_load_ps(accb[t]));
    }
}

void pi_tiles_rows_q4_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride, const float *xd, int64_t xd_stride) {
    PI_UNUSED(xd); PI_UNUSED(xd_stride);   /* x: Q8_KM, whose scales the kernel reads itself */
    amx_k4_rows(n, rows, NULL, 0, x, x_stride, nt, y, y_stride, 0);
}

void pi_tiles_rows_q5_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride, const float *xd, int64_t xd_stride) {
    PI_UNUSED(xd); PI_UNUSED(xd_stride);   /* x: Q8_KM, whose scales the kernel reads itself */
    amx_k4_rows(n, rows, NULL, 0, x, x_stride, nt, y, y_stride, 1);
}

void pi_tiles_q4_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride, const float *xd, int64_t xd_stride) {
    PI_UNUSED(xd); PI_UNUSED(xd_stride);   /* x: Q8_KM, whose scales the kernel reads itself */
    amx_k4_rows(n, NULL, group, 1, x, x_stride, nt, y, y_stride, 0);
}

/* ---- Q6_K ---- */

typedef struct {
    _Alignas(64) int8_t bt[16][4 * 64];  /* B tiles of the 16 sub-blocks (k = 16) */
    _Alignas(64) int32_t sc[16][16];     /* sc_j per row (signed) */
    _Alignas(64) float d[16];
} amx_q6_K_block;

static inline void amx_q6_K_decode(const char *const *p, amx_q6_K_block *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2h = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    __m512i s[4];
    amx_transpose16x16(p, offsetof(pi_block_q6_K, scales), s);
    for (int j = 0; j < 16; j++)   /* byte j % 4 of s[j / 4], sign-extended */
        _mm512_store_si512((__m512i *)o->sc[j], _mm512_srai_epi32(_mm512_slli_epi32(s[j / 4], 24 - 8 * (j % 4)), 24));
    _mm512_store_ps(o->d, amx_f16x16_rows(p, offsetof(pi_block_q6_K, d)));
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            /* ql[64h + l] (a) and ql[64h + 32 + l] (bq), qh[32h + l] (hb) for l = 16 half ..: quarter q of the
             * 128 elements 128h.. takes nibble q / 2 of a (q even) or bq (q odd) and bits 2q, 2q+1 of qh; its
             * elements 128h + 32q + l are sub-block 8h + 2q + half */
            __m512i a[4], bq[4], hb[4];
            amx_transpose16x16(p, offsetof(pi_block_q6_K, ql) + 64 * h + 16 * half, a);
            amx_transpose16x16(p, offsetof(pi_block_q6_K, ql) + 64 * h + 32 + 16 * half, bq);
            amx_transpose16x16(p, offsetof(pi_block_q6_K, qh) + 32 * h + 16 * half, hb);
            for (int q = 0; q < 4; q++)
                for (int m = 0; m < 4; m++) {
                    const __m512i lo = q & 1 ? bq[m] : a[m];
                    const __m512i nib = _mm512_and_si512(q < 2 ? lo : _mm512_srli_epi16(lo, 4), m4);
                    const __m512i hi2 = q == 0 ? _mm512_slli_epi16(hb[m], 4)
                                      : q == 1 ? _mm512_slli_epi16(hb[m], 2)
                                      : q == 2 ? hb[m] : _mm512_srli_epi16(hb[m], 2);
                    const __m512i u = _mm512_or_si512(nib, _mm512_and_si512(hi2, m2h));
                    _mm512_store_si512((__m512i *)(o->bt[8 * h + 2 * q + half] + 64 * m), _mm512_sub_epi8(u, k32));
                }
        }
}

void pi_tiles_rows_q6_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride, const float *xd, int64_t xd_stride) {
    PI_UNUSED(xd); PI_UNUSED(xd_stride);   /* x: Q8_K, whose scales the kernel reads itself */
    const int64_t nb = n / PI_QK_K, bsz = (int64_t)sizeof(pi_block_q8_K);
    const int64_t qoff = (int64_t)offsetof(pi_block_q8_K, qs);
    amx_q6_K_block blk[AMX_K_KC];
    _Alignas(64) float accb[AMX_K_TG][16];
    _Alignas(64) int32_t ct[2][2][16 * 16];   /* two pairs' C slots */
    for (int g0 = 0; g0 < nt; g0 += AMX_K_TG) {
        const int ntiles = PI_MIN(AMX_K_TG, nt - g0) / 16;
        memset(accb, 0, sizeof accb);
        for (int64_t c0 = 0; c0 < nb; c0 += AMX_K_KC) {
            const int64_t kc = PI_MIN(AMX_K_KC, nb - c0);
            for (int64_t b = 0; b < kc; b++) {
                const char *p[16];
                for (int r = 0; r < 16; r++) p[r] = (const char *)rows[r] + (c0 + b) * (int64_t)sizeof(pi_block_q6_K);
                amx_q6_K_decode(p, &blk[b]);
            }
            __asm__ volatile("" ::: "memory");   /* the tile loads below read blk */
            for (int tt = 0; tt < ntiles; tt++) {
                const char *xt = x + (g0 + 16 * tt) * x_stride + c0 * bsz;
                for (int64_t b = 0; b < kc; b++) {
                    const amx_q6_K_block *o = &blk[b];
                    const char *xq = xt + b * bsz + qoff;
                    __m512i sumi[16];
                    for (int t = 0; t < 16; t++) sumi[t] = _mm512_setzero_si512();
                    /* sub-blocks j, j + 1 as a pair of products, each pair issued one pair ahead of its epilogue (two
                     * C slot pairs): the tile unit works while the vector unit adds the pair before */
                    AMX_PRODUCT_PAIR(o->bt[0], xq, ct[0][0], o->bt[1], xq + 16, ct[0][1]);
                    for (int j = 0; j < 16; j += 2) {
                        const int slot = j / 2 % 2;
                        if (j + 2 < 16)
                            AMX_PRODUCT_PAIR(o->bt[j + 2], xq + 16 * (j + 2), ct[!slot][0], o->bt[j + 3],
                                             xq + 16 * (j + 3), ct[!slot][1]);
                        amx_scale_add(ct[slot][0], _mm512_load_si512((const __m512i *)o->sc[j]), sumi);
                        amx_scale_add(ct[slot][1], _mm512_load_si512((const __m512i *)o->sc[j + 1]), sumi);
                    }
                    const __m512 d = _mm512_load_ps(o->d);
                    for (int t = 0; t < 16; t++) {
                        float dx;
                        memcpy(&dx, xt + t * x_stride + b * bsz, sizeof dx);
                        float *acc = accb[16 * tt + t];
                        _mm512_store_ps(acc, _mm512_add_ps(_mm512_load_ps(acc),
                                                           _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(dx), d), _mm512_cvtepi32_ps(sumi[t]))));
                    }
                }
            }
            __asm__ volatile("" ::: "memory");   /* the next chunk's decoding overwrites blk */
        }
        for (int t = 0; t < 16 * ntiles; t++) _mm512_storeu_ps(y + (g0 + t) * y_stride, _mm512_load_ps(accb[t]));
    }
}
