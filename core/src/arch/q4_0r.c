/* q4_0r.c: the sparse FFN's load-time Q4_0 layout (PI_TYPE_Q4_0R), its activation format
 * (PI_TYPE_Q8_0P) and their kernels.
 *
 * The sparse FFN reads single scattered neuron rows, eight at a time, where the 8-row kernels of
 * rows8.c spend most of their instructions transposing rows and gathering scales. Here a row is
 * read on its own, 256 elements (8 Q4_0 blocks, a "super-block") at a time:
 *
 *   Q4_0R super-block (144 bytes): the 8 fp16 block scales, lane l holding block BLOCK_OF[l]; then four
 *                                  32-byte vectors c_m (m < 4) whose 4-byte lane l is bytes 4m..4m+3 of
 *                                  block BLOCK_OF[l] (each byte as in Q4_0: byte j = elements j (low
 *                                  nibble) and j + 16 (high nibble))
 *   Q8_0P super-block (320 bytes): the 8 activation block scales as f32 and 8 x the 8 block sums (int32),
 *                                  in lane order, then eight 32-byte vectors X_m: lane l of X_m (m < 4) =
 *                                  elements 4m..4m+3 of block BLOCK_OF[l], of X_{4+m} = elements
 *                                  16+4m..16+4m+3
 *
 * so the low nibbles of c_m pair with X_m, the high ones with X_{4+m}, and eight VNNI products (or
 * maddubs) accumulate each block's exact integer dot product in its own lane: no horizontal adds.
 * The rows that are added (down_t, ffn_gate_t) go in groups of up to 16 through axpy_group: a 4x4 byte
 * transpose of four rows' c_m per 128-bit lane puts the four rows' quants of one output into one 32-bit lane,
 * where one VNNI product (or two maddubs) multiplies them by the group's int8 coefficients. A single axpy
 * keeps the f32 fma per weight: a 4x4 transpose of 32-bit words per 128-bit lane turns c_0..c_3 back into the
 * blocks in order (lanes p and 4 + p are blocks 2p and 2p + 1).
 *
 * Canonical arithmetic (every kernel of this file, AVX2 or scalar, gives these bits):
 *   dot:  lane l accumulates acc_l = fma(d_w * d_x, i_b, acc_l) over the super-blocks in order
 *         (b = block BLOCK_OF[l] of each; i_b the exact integer sum q . x - 8 s), and the result is
 *         pi_tree8 over the lanes.
 *   axpy: y[e] = fma(a * d_b, q_e - 8, y[e]), as pi_axpy_q4_0 (one row on its own).
 *   axpy_group (the sparse FFN's down step: up to PI_AXPY_GROUP rows k with coefficients a_k, added as one
 *         integer sum): per block b of 32 outputs, c_k = a_k * d_kb (f32), M = max_k |c_k|, the 14-bit
 *         coefficients m_k = rint(c_k * (8191 / M)) (0 where M is 0 or not finite, or c_k is NaN), S = M / 8191;
 *         then y[e] = fma(S, (float)(sum_k m_k (q_ke - 8)), y[e]) with the integer sum exact. Each m_k is
 *         split as 128 hi_k + lo_k (hi_k in [-64, 64], lo_k in [-64, 63]), two int8 coefficients, so the sum
 *         is two VNNI (or maddubs) products per four rows instead of an f32 fma per weight; a coefficient is
 *         off by at most M / 16382, 1/64 of what one int8 (Q8_0-like) step would cost.
 * Rows must have a multiple of 256 elements (the types' block size). */
#include "../internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

static const int BLOCK_OF[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };   /* lane l holds block BLOCK_OF[l] */
static const int LANE_OF[8] = { 0, 4, 1, 5, 2, 6, 3, 7 };    /* block b sits in lane LANE_OF[b] */

typedef struct { uint16_t d[8]; uint8_t qs[4][8][4]; } sb_q4_0r;                  /* 144 bytes */
typedef struct { float d[8]; int32_t s8[8]; int8_t qs[8][8][4]; } sb_q8_0p;       /* 320 bytes */
_Static_assert(sizeof(sb_q4_0r) == 144 && sizeof(sb_q8_0p) == 320, "super-block sizes");

/* ---- conversions ---- */

void pi_q4_0r_from_q4_0(int64_t n, const void *src, void *dst) {
    const pi_block_q4_0 *x = src;
    sb_q4_0r *y = dst;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            const pi_block_q4_0 *b = &x[8 * s + BLOCK_OF[l]];
            y[s].d[l] = b->d;
            for (int m = 0; m < 4; m++) memcpy(y[s].qs[m][l], b->qs + 4 * m, 4);
        }
}

void pi_q4_0r_to_f32(const void *src, float *dst, int64_t n) {
    const sb_q4_0r *x = src;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            const float d = pi_fp16_to_f32(x[s].d[l]);
            float *o = dst + 256 * s + 32 * BLOCK_OF[l];
            for (int j = 0; j < 16; j++) {
                const uint8_t q = x[s].qs[j / 4][l][j % 4];
                o[j] = (float)((q & 15) - 8) * d;
                o[j + 16] = (float)((q >> 4) - 8) * d;
            }
        }
}

/* Quantized exactly as Q8_0S (same rounding), then rearranged. */
void pi_quantize_row_q8_0p(const float *src, void *dst, int64_t n) {
    sb_q8_0p *y = dst;
    for (int64_t s = 0; s < n / 256; s++) {
        pi_block_q8_0s q[8];
        pi_quantize_row_q8_0s(src + 256 * s, q, 256);
        for (int l = 0; l < 8; l++) {
            const pi_block_q8_0s *b = &q[BLOCK_OF[l]];
            y[s].d[l] = pi_fp16_to_f32(b->d);
            y[s].s8[l] = 8 * (int32_t)b->s;
            for (int m = 0; m < 4; m++) {
                memcpy(y[s].qs[m][l], b->qs + 4 * m, 4);
                memcpy(y[s].qs[4 + m][l], b->qs + 16 + 4 * m, 4);
            }
        }
    }
}

void pi_q8_0p_to_f32(const void *src, float *dst, int64_t n) {
    const sb_q8_0p *x = src;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            float *o = dst + 256 * s + 32 * BLOCK_OF[l];
            for (int j = 0; j < 16; j++) {
                o[j] = (float)x[s].qs[j / 4][l][j % 4] * x[s].d[l];
                o[j + 16] = (float)x[s].qs[4 + j / 4][l][j % 4] * x[s].d[l];
            }
        }
}


/* ---- kernels ---- */

#if PI_HAVE_ROWS8
#include <immintrin.h>

#include "avx2_util.h"

/* acc + (d_w d_x) * (the 8 blocks' exact integer dot products), lane l = block BLOCK_OF[l]. */
static inline __m256 sb_dot(const sb_q4_0r *w, const sb_q8_0p *x, __m256 acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i *c = (const __m256i *)w->qs, *xq = (const __m256i *)x->qs;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    __m256i i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256();   /* two chains: latency */
    for (int m = 0; m < 4; m++) {
        const __m256i q = _mm256_loadu_si256(c + m);
        i0 = _mm256_dpbusd_epi32(i0, _mm256_and_si256(q, m4), _mm256_loadu_si256(xq + m));
        i1 = _mm256_dpbusd_epi32(i1, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_loadu_si256(xq + 4 + m));
    }
    __m256i i = _mm256_add_epi32(i0, i1);
#else   /* eight maddubs results (each |.| <= 2 * 15 * 127) add up in int16 without overflow */
    __m256i s16 = _mm256_setzero_si256();
    for (int m = 0; m < 4; m++) {
        const __m256i q = _mm256_loadu_si256(c + m);
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_and_si256(q, m4), _mm256_loadu_si256(xq + m)));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                                         _mm256_loadu_si256(xq + 4 + m)));
    }
    __m256i i = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
#endif
    i = _mm256_sub_epi32(i, _mm256_loadu_si256((const __m256i *)x->s8));
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w->d)), _mm256_loadu_ps(x->d));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(i), acc);
}

float pi_vec_dot_q4_0r_q8_0p(int64_t n, const void *w, const void *x) {
    const sb_q4_0r *a = w;
    const sb_q8_0p *b = x;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t s = 0; s < n / 256; s++) acc = sb_dot(&a[s], &b[s], acc);
    return pi_hsum_ps(acc);   /* = pi_tree8 of the lanes */
}


/* The 8 blocks' 16 nibble bytes of super-block w in block order (qs[b] = block b, as in Q4_0). */
static inline void sb_blocks(const sb_q4_0r *w, uint8_t qs[8][16]) {
    const __m256i *c = (const __m256i *)w->qs;
    const __m256i c0 = _mm256_loadu_si256(c), c1 = _mm256_loadu_si256(c + 1);
    const __m256i c2 = _mm256_loadu_si256(c + 2), c3 = _mm256_loadu_si256(c + 3);
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    __m256i *o = (__m256i *)qs;   /* o[p] = blocks 2p | 2p + 1 (lanes p | 4 + p) */
    _mm256_storeu_si256(o, _mm256_unpacklo_epi64(t0, t2));
    _mm256_storeu_si256(o + 1, _mm256_unpackhi_epi64(t0, t2));
    _mm256_storeu_si256(o + 2, _mm256_unpacklo_epi64(t1, t3));
    _mm256_storeu_si256(o + 3, _mm256_unpackhi_epi64(t1, t3));
}

/* The 8 block scales of super-block w times a, in lane order. */
static inline __m256 sb_scales(const sb_q4_0r *w, float a) {
    return _mm256_mul_ps(_mm256_set1_ps(a), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w->d)));
}

void pi_axpy_q4_0r(int64_t n, float a, const void *row, float *y) {
    const sb_q4_0r *w = row;
    for (int64_t s = 0; s < n / 256; s++) {
        float scale[8];
        uint8_t qs[8][16];
        _mm256_storeu_ps(scale, sb_scales(&w[s], a));
        sb_blocks(&w[s], qs);
        for (int b = 0; b < 8; b++) {
            __m256 yb[4];
            pi_load4_ps(y + 256 * s + 32 * b, yb);
            pi_q4_0_axpy_block(_mm256_broadcast_ss(&scale[LANE_OF[b]]), qs[b], yb);
            pi_store4_ps(y + 256 * s + 32 * b, yb);
        }
    }
}

/* The group's coefficients for super-block s, from its rows' block scales: Wh[q] and Wl[q] (lane l = block
 * BLOCK_OF[l]) pack hi_k and lo_k of rows 4q..4q+3 as the four bytes of a 32-bit word; S[l] = M / 8191;
 * sum8[l] = 8 sum_k m_k. Rows past count have m_k = 0. */
static inline void group_coefs(int count, const float *a, const sb_q4_0r *const *r, int64_t s,
                               __m256i Wh[PI_AXPY_GROUP / 4], __m256i Wl[PI_AXPY_GROUP / 4], float S[8],
                               __m256i *sum8) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 c[PI_AXPY_GROUP], M = _mm256_setzero_ps();   /* c[k]: a_k d_kb per lane */
    for (int k = 0; k < count; k++) {   /* max_ps(x, M) keeps M where x is NaN, as the scalar body's x > M ? x : M */
        c[k] = sb_scales(&r[k][s], a[k]);
        M = _mm256_max_ps(_mm256_and_ps(c[k], absmask), M);
    }
    const __m256 finite = _mm256_and_ps(_mm256_cmp_ps(M, _mm256_setzero_ps(), _CMP_GT_OQ),
                                        _mm256_cmp_ps(M, _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ));
    const __m256 inv = _mm256_and_ps(finite, _mm256_div_ps(_mm256_set1_ps(8191.0f), M));
    _mm256_storeu_ps(S, _mm256_div_ps(M, _mm256_set1_ps(8191.0f)));
    const __m256i byte = _mm256_set1_epi32(0xff);
    __m256i sum = _mm256_setzero_si256();
    for (int q = 0; q < PI_AXPY_GROUP / 4; q++) Wh[q] = Wl[q] = _mm256_setzero_si256();
    for (int q = 0; q < (count + 3) / 4; q++) {
        for (int k = 0; k < 4 && 4 * q + k < count; k++) {
            const __m256 v = _mm256_mul_ps(c[4 * q + k], inv);
            const __m256i m = _mm256_and_si256(_mm256_cvtps_epi32(v),
                                               _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));   /* NaN: 0 */
            const __m256i hi = _mm256_srai_epi32(_mm256_add_epi32(m, _mm256_set1_epi32(64)), 7);
            const __m256i lo = _mm256_sub_epi32(m, _mm256_slli_epi32(hi, 7));
            sum = _mm256_add_epi32(sum, m);
            Wh[q] = _mm256_or_si256(Wh[q], _mm256_slli_epi32(_mm256_and_si256(hi, byte), 8 * k));
            Wl[q] = _mm256_or_si256(Wl[q], _mm256_slli_epi32(_mm256_and_si256(lo, byte), 8 * k));
        }
    }
    *sum8 = _mm256_slli_epi32(sum, 3);
}

/* Four rows' 32-byte vectors c_m side by side: X[j] (j < 4) holds, in 32-bit lane i of 128-bit lane p, byte i of
 * lane 4p + j of each row's vector (rows 0..3 as its four bytes): a 4x4 byte transpose per 128-bit lane. */
#define INTERLEAVE4(vec, pre, N0, N1, N2, N3, X) do {                                               \
        const vec A_ = pre##_unpacklo_epi8(N0, N1), B_ = pre##_unpackhi_epi8(N0, N1);                     \
        const vec C_ = pre##_unpacklo_epi8(N2, N3), D_ = pre##_unpackhi_epi8(N2, N3);                     \
        X[0] = pre##_unpacklo_epi16(A_, C_); X[1] = pre##_unpackhi_epi16(A_, C_);                         \
        X[2] = pre##_unpacklo_epi16(B_, D_); X[3] = pre##_unpackhi_epi16(B_, D_);                         \
    } while (0)

#if !PI_HAVE_ROWS16
/* X[j] of INTERLEAVE4 alone, from the four rows' 32-byte vectors: bytes of 8-bit half j / 2, then 16-bit half j % 2. */
static inline __m256i interleave4_column(const int j, const void *n0, const void *n1, const void *n2, const void *n3) {
    const __m256i N0 = _mm256_loadu_si256(n0), N1 = _mm256_loadu_si256(n1);
    const __m256i N2 = _mm256_loadu_si256(n2), N3 = _mm256_loadu_si256(n3);
    const __m256i A = j < 2 ? _mm256_unpacklo_epi8(N0, N1) : _mm256_unpackhi_epi8(N0, N1);
    const __m256i C = j < 2 ? _mm256_unpacklo_epi8(N2, N3) : _mm256_unpackhi_epi8(N2, N3);
    return j % 2 ? _mm256_unpackhi_epi16(A, C) : _mm256_unpacklo_epi16(A, C);
}
#endif

/* The group's integer sums per super-block, then one fma per output. In X[j] of vector c_m, 128-bit lane p
 * holds block 2j + p (lane j + 4p), elements 4m..4m+3 (low nibbles) and 16+4m.. (high ones). */
void pi_axpy_group_q4_0r(int64_t n, int count, const float *a, const void *const *rows, float *y) {
    const sb_q4_0r *const *r = (const sb_q4_0r *const *)rows;
    const sb_q4_0r *rp[PI_AXPY_GROUP];   /* rows past count: any row (m_k = 0) */
    for (int k = 0; k < PI_AXPY_GROUP; k++) rp[k] = r[k < count ? k : 0];
    enum { nq = PI_AXPY_GROUP / 4 };   /* a short group runs whole (its missing rows have m_k = 0): fixed loops */
#if PI_HAVE_ROWS16
    /* c_0|c_1 and c_2|c_3 as two 512-bit vectors (Z = 0, 1); full = sum m_k * byte, lo = sum m_k * low nibble,
     * so the high nibbles' sum is (full - lo) / 16, exact */
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i idx[4];
    for (int j = 0; j < 4; j++)
        idx[j] = _mm512_setr_epi32(j, j, j, j, 4 + j, 4 + j, 4 + j, 4 + j, j, j, j, j, 4 + j, 4 + j, 4 + j, 4 + j);
    for (int64_t s = 0; s < n / 256; s++) {
        __m256i Wh[PI_AXPY_GROUP / 4], Wl[PI_AXPY_GROUP / 4], sum8;
        float S[8];
        group_coefs(count, a, r, s, Wh, Wl, S, &sum8);
        __m512i Ph[PI_AXPY_GROUP / 4][4], Pl[PI_AXPY_GROUP / 4][4];   /* [quad][j]: each 32-bit lane's block's bytes */
        for (int q = 0; q < nq; q++)
            for (int j = 0; j < 4; j++) {
                Ph[q][j] = _mm512_permutexvar_epi32(idx[j], _mm512_castsi256_si512(Wh[q]));
                Pl[q][j] = _mm512_permutexvar_epi32(idx[j], _mm512_castsi256_si512(Wl[q]));
            }
        __m512i off[4];   /* [j]: 8 sum_k m_k of each 32-bit lane's block */
        for (int j = 0; j < 4; j++) off[j] = _mm512_permutexvar_epi32(idx[j], _mm512_castsi256_si512(sum8));
        __m512i R[2][2][4];   /* [Z][nibble][j] the exact integer sums, lane order */
        for (int Z = 0; Z < 2; Z++) {
            __m512i full[4], lo[4], full_l[4], lo_l[4];   /* by hi_k, by lo_k */
            for (int j = 0; j < 4; j++) full[j] = lo[j] = full_l[j] = lo_l[j] = _mm512_setzero_si512();
            for (int q = 0; q < nq; q++) {
                __m512i X[4];
                INTERLEAVE4(__m512i, _mm512, _mm512_loadu_si512((const char *)rp[4 * q][s].qs + 64 * Z),
                            _mm512_loadu_si512((const char *)rp[4 * q + 1][s].qs + 64 * Z),
                            _mm512_loadu_si512((const char *)rp[4 * q + 2][s].qs + 64 * Z),
                            _mm512_loadu_si512((const char *)rp[4 * q + 3][s].qs + 64 * Z), X);
                for (int j = 0; j < 4; j++) {
                    const __m512i xl = _mm512_and_si512(X[j], m4);
                    full[j] = _mm512_dpbusd_epi32(full[j], X[j], Ph[q][j]);
                    lo[j] = _mm512_dpbusd_epi32(lo[j], xl, Ph[q][j]);
                    full_l[j] = _mm512_dpbusd_epi32(full_l[j], X[j], Pl[q][j]);
                    lo_l[j] = _mm512_dpbusd_epi32(lo_l[j], xl, Pl[q][j]);
                }
            }
            for (int j = 0; j < 4; j++) {   /* sum m_k x = 128 sum hi_k x + sum lo_k x */
                full[j] = _mm512_add_epi32(_mm512_slli_epi32(full[j], 7), full_l[j]);
                lo[j] = _mm512_add_epi32(_mm512_slli_epi32(lo[j], 7), lo_l[j]);
            }
            for (int j = 0; j < 4; j++) {
                R[Z][0][j] = _mm512_sub_epi32(lo[j], off[j]);
                R[Z][1][j] = _mm512_sub_epi32(_mm512_srai_epi32(_mm512_sub_epi32(full[j], lo[j]), 4), off[j]);
            }
        }
        for (int j = 0; j < 4; j++)   /* block 2j + odd, elements 16 nib ..: 128-bit lanes odd, 2 + odd of Z = 0, 1 */
            for (int nib = 0; nib < 2; nib++)
                for (int odd = 0; odd < 2; odd++) {
                    const int b = 2 * j + odd;
                    const __m512i i = odd ? _mm512_shuffle_i32x4(R[0][nib][j], R[1][nib][j], _MM_SHUFFLE(3, 1, 3, 1))
                                          : _mm512_shuffle_i32x4(R[0][nib][j], R[1][nib][j], _MM_SHUFFLE(2, 0, 2, 0));
                    float *yp = y + 256 * s + 32 * b + 16 * nib;
                    _mm512_storeu_ps(yp, _mm512_fmadd_ps(_mm512_set1_ps(S[LANE_OF[b]]), _mm512_cvtepi32_ps(i),
                                                         _mm512_loadu_ps(yp)));
                }
    }
#else
    /* maddubs of the nibbles (|pair| <= 2 * 15 * 64) adds up over four quads in int16 without overflow. One column j
     * of the 4x4 byte transposes (X[j] of INTERLEAVE4: blocks 2j and 2j + 1) and two vectors c_m at a time, the quads'
     * rows loaded again for each (from L1) and the coefficients read from the stack, so that the four sums of a column
     * and the two R of a pair of vectors stay in registers; all four columns' 16 sums and 32 coefficient vectors at
     * once spilled. On a Zen 1 (one thread, CPU time): 16 rows of 4096 from L2, 0.91-0.94x the time (1355-1405 cycles a
     * super-block against 1483-1492; about 400 are the coefficients and the output). In the model, rows from DRAM
     * (the 7B shape's ffn_gate_t at 50%, bench/ab_ops.py --op gate_t), 0.905x, 0.965x and 1.027x in three runs: there
     * the scattered rows' reads bound it, not these instructions (bench/README.md). */
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int64_t s = 0; s < n / 256; s++) {
        __m256i Wh[PI_AXPY_GROUP / 4], Wl[PI_AXPY_GROUP / 4], sum8;
        float S[8];
        int32_t sum8_l[8];
        group_coefs(count, a, r, s, Wh, Wl, S, &sum8);
        _mm256_storeu_si256((__m256i *)sum8_l, sum8);
        __m256i P[4][PI_AXPY_GROUP / 4][2];   /* [j][quad][by hi_k, lo_k]: lane j in 128-bit lane 0, 4 + j in 1 */
        for (int q = 0; q < nq; q++) {   /* in-lane shuffles: a lane-crossing vpermd costs 3-4x on a Zen 1 */
            P[0][q][0] = _mm256_shuffle_epi32(Wh[q], 0x00), P[0][q][1] = _mm256_shuffle_epi32(Wl[q], 0x00);
            P[1][q][0] = _mm256_shuffle_epi32(Wh[q], 0x55), P[1][q][1] = _mm256_shuffle_epi32(Wl[q], 0x55);
            P[2][q][0] = _mm256_shuffle_epi32(Wh[q], 0xaa), P[2][q][1] = _mm256_shuffle_epi32(Wl[q], 0xaa);
            P[3][q][0] = _mm256_shuffle_epi32(Wh[q], 0xff), P[3][q][1] = _mm256_shuffle_epi32(Wl[q], 0xff);
        }
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++) {   /* vectors c_2h, c_2h+1: elements 8h.. (low nibbles) and 16 + 8h.. (high) */
                __m256i R[2][2];   /* [m - 2h][nibble]: the exact sums sum m_k x */
                for (int mm = 0; mm < 2; mm++) {
                    const int m = 2 * h + mm;
                    __m256i lo = _mm256_setzero_si256(), hi = lo, lo_l = lo, hi_l = lo;   /* by hi_k, by lo_k */
                    for (int q = 0; q < nq; q++) {
                        const __m256i X = interleave4_column(j, rp[4 * q][s].qs[m], rp[4 * q + 1][s].qs[m],
                                                             rp[4 * q + 2][s].qs[m], rp[4 * q + 3][s].qs[m]);
                        const __m256i xl = _mm256_and_si256(X, m4), xh = _mm256_and_si256(_mm256_srli_epi16(X, 4), m4);
                        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(xl, P[j][q][0]));
                        hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(xh, P[j][q][0]));
                        lo_l = _mm256_add_epi16(lo_l, _mm256_maddubs_epi16(xl, P[j][q][1]));
                        hi_l = _mm256_add_epi16(hi_l, _mm256_maddubs_epi16(xh, P[j][q][1]));
                    }
                    /* sum m_k x = 128 sum hi_k x + sum lo_k x */
                    R[mm][0] = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(lo, ones), 7),
                                                _mm256_madd_epi16(lo_l, ones));
                    R[mm][1] = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(hi, ones), 7),
                                                _mm256_madd_epi16(hi_l, ones));
                }
                for (int nib = 0; nib < 2; nib++)   /* block 2j + odd, elements 16 nib + 8h..: 128-bit lane odd */
                    for (int odd = 0; odd < 2; odd++) {
                        const int b = 2 * j + odd;
                        const __m256i i = _mm256_sub_epi32(pi_halves(R[0][nib], R[1][nib], odd),
                                                           _mm256_set1_epi32(sum8_l[LANE_OF[b]]));
                        float *yp = y + 256 * s + 32 * b + 16 * nib + 8 * h;
                        _mm256_storeu_ps(yp, _mm256_fmadd_ps(_mm256_set1_ps(S[LANE_OF[b]]), _mm256_cvtepi32_ps(i),
                                                             _mm256_loadu_ps(yp)));
                    }
            }
    }
#endif
}

#endif

#if !PI_HAVE_ROWS8
/* axpy_group's coefficients for lane l of super-block s (the canonical arithmetic above): m[k] for the count rows,
 * *sum = sum_k m_k; returns S. */
static inline float group_lane_coefs(int count, const float *a, const sb_q4_0r *const *r, int64_t s, int l,
                                     int32_t m[PI_AXPY_GROUP], int32_t *sum) {
    float c[PI_AXPY_GROUP], M = 0.0f;
    for (int k = 0; k < count; k++) {
        c[k] = a[k] * pi_fp16_to_f32(r[k][s].d[l]);
        const float ac = fabsf(c[k]);
        M = ac > M ? ac : M;
    }
    const float inv = M > 0.0f && M <= FLT_MAX ? 8191.0f / M : 0.0f;
    *sum = 0;
    for (int k = 0; k < count; k++) {
        const float v = c[k] * inv;
        m[k] = v == v ? (int32_t)lrintf(v) : 0;
        *sum += m[k];
    }
    return M / 8191.0f;
}
#endif

#if PI_NEON   /* the scalar reference's order; a 16-byte register holds 4 lanes, SDOT their exact integers */

/* the 16 bytes of lane l of a super-block (block BLOCK_OF[l]'s bytes 0..15, 4 from each c_m) */
static inline uint8x16_t lane_bytes(const sb_q4_0r *w, int l) {
    uint32x4_t v = vdupq_n_u32(0);
    v = vld1q_lane_u32((const uint32_t *)(const void *)w->qs[0][l], v, 0);
    v = vld1q_lane_u32((const uint32_t *)(const void *)w->qs[1][l], v, 1);
    v = vld1q_lane_u32((const uint32_t *)(const void *)w->qs[2][l], v, 2);
    v = vld1q_lane_u32((const uint32_t *)(const void *)w->qs[3][l], v, 3);
    return vreinterpretq_u8_u32(v);
}

float pi_vec_dot_q4_0r_q8_0p(int64_t n, const void *w, const void *x) {
    const sb_q4_0r *a = w;
    const sb_q8_0p *b = x;
    float32x4_t acc[2] = { vdupq_n_f32(0.0f), vdupq_n_f32(0.0f) };   /* lanes 0..3, 4..7 */
    for (int64_t s = 0; s < n / 256; s++)
        for (int h = 0; h < 2; h++) {
            int32x4_t i = vnegq_s32(vld1q_s32(b[s].s8 + 4 * h));
            for (int m = 0; m < 4; m++) {
                const uint8x16_t c = vld1q_u8(a[s].qs[m][4 * h]);
                i = pi_neon_sdot(i, vreinterpretq_s8_u8(vandq_u8(c, vdupq_n_u8(0x0f))), vld1q_s8(b[s].qs[m][4 * h]));
                i = pi_neon_sdot(i, vreinterpretq_s8_u8(vshrq_n_u8(c, 4)), vld1q_s8(b[s].qs[4 + m][4 * h]));
            }
            const float32x4_t d = vmulq_f32(pi_neon_load4_f16(a[s].d + 4 * h), vld1q_f32(b[s].d + 4 * h));
            acc[h] = vfmaq_f32(acc[h], d, vcvtq_f32_s32(i));
        }
    return pi_neon_tree8(acc[0], acc[1]);
}

void pi_axpy_group_q4_0r(int64_t n, int count, const float *a, const void *const *rows, float *y) {
    const sb_q4_0r *const *r = (const sb_q4_0r *const *)rows;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            int32_t mk[PI_AXPY_GROUP], sum;
            const float S = group_lane_coefs(count, a, r, s, l, mk, &sum);
            int32x4_t acc[8];   /* outputs 4i..4i+3: 0..15 the low nibbles, 16..31 the high ones */
            for (int i = 0; i < 8; i++) acc[i] = vdupq_n_s32(0);
            for (int k = 0; k < count; k++) {
                const int16_t m = (int16_t)mk[k];   /* |m| <= 8191 */
                const uint8x16_t q = lane_bytes(&r[k][s], l);
                const uint8x16_t half[2] = { vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8(q, 4) };
                for (int h = 0; h < 2; h++) {
                    const int16x8_t q0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(half[h])));
                    const int16x8_t q1 = vreinterpretq_s16_u16(vmovl_high_u8(half[h]));
                    acc[4 * h] = vmlal_n_s16(acc[4 * h], vget_low_s16(q0), m);
                    acc[4 * h + 1] = vmlal_high_n_s16(acc[4 * h + 1], q0, m);
                    acc[4 * h + 2] = vmlal_n_s16(acc[4 * h + 2], vget_low_s16(q1), m);
                    acc[4 * h + 3] = vmlal_high_n_s16(acc[4 * h + 3], q1, m);
                }
            }
            const int32x4_t s8 = vdupq_n_s32(8 * sum);
            float *yb = y + 256 * s + 32 * BLOCK_OF[l];
            for (int i = 0; i < 8; i++)
                vst1q_f32(yb + 4 * i, vfmaq_n_f32(vld1q_f32(yb + 4 * i), vcvtq_f32_s32(vsubq_s32(acc[i], s8)), S));
        }
}

#endif

#if !PI_HAVE_ROWS8   /* scalar and neon: one row on its own (the engine adds Q4_0R rows in groups, axpy_group) */
void pi_axpy_q4_0r(int64_t n, float a, const void *row, float *y) {
    const sb_q4_0r *w = row;
    for (int64_t s = 0; s < n / 256; s++)
        for (int b = 0; b < 8; b++) {
            const float scale = a * pi_fp16_to_f32(w[s].d[LANE_OF[b]]);
            float *yb = y + 256 * s + 32 * b;
            for (int j = 0; j < 16; j++) {
                const uint8_t q = w[s].qs[j / 4][LANE_OF[b]][j % 4];
                yb[j] = fmaf(scale, (float)((q & 15) - 8), yb[j]);
                yb[j + 16] = fmaf(scale, (float)((q >> 4) - 8), yb[j + 16]);
            }
        }
}
#endif

#if !PI_HAVE_ROWS8 && !PI_NEON   /* scalar reference: the same canonical order */

float pi_vec_dot_q4_0r_q8_0p(int64_t n, const void *w, const void *x) {
    const sb_q4_0r *a = w;
    const sb_q8_0p *b = x;
    float acc[8] = { 0 };
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            int32_t i = 0;
            for (int m = 0; m < 4; m++)
                for (int k = 0; k < 4; k++) {
                    const uint8_t q = a[s].qs[m][l][k];
                    i += (q & 15) * b[s].qs[m][l][k] + (q >> 4) * b[s].qs[4 + m][l][k];
                }
            i -= b[s].s8[l];
            acc[l] = fmaf(pi_fp16_to_f32(a[s].d[l]) * b[s].d[l], (float)i, acc[l]);
        }
    return pi_tree8(acc);
}


void pi_axpy_group_q4_0r(int64_t n, int count, const float *a, const void *const *rows, float *y) {
    const sb_q4_0r *const *r = (const sb_q4_0r *const *)rows;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            int32_t m[PI_AXPY_GROUP], sum;
            const float S = group_lane_coefs(count, a, r, s, l, m, &sum);
            float *yb = y + 256 * s + 32 * BLOCK_OF[l];
            for (int j = 0; j < 16; j++) {
                int32_t lo = 0, hi = 0;
                for (int k = 0; k < count; k++) {
                    const uint8_t q = r[k][s].qs[j / 4][l][j % 4];
                    lo += m[k] * (q & 15);
                    hi += m[k] * (q >> 4);
                }
                yb[j] = fmaf(S, (float)(lo - 8 * sum), yb[j]);
                yb[j + 16] = fmaf(S, (float)(hi - 8 * sum), yb[j + 16]);
            }
        }
}

#endif

/* Eight rows against nt tokens. With AVX2 the eight rows advance together, one super-block at a time:
 * eight concurrent streams keep more of the scattered rows' memory reads in flight than one. No software
 * prefetch: requesting each row's super-block 4 ahead (its 3 lines) made the gathered up step slower on a
 * Zen 4: the gate-sparse FFN (cats) took 1.07-1.22x the time at 25-50% (avx2 level 1.16x), the ReLU sparse FFN
 * 1.08-1.16x; the sparse fused path's requests for the next neurons' first lines (sparse_ffn.c) stay (neutral). */
void pi_vec_dot8_q4_0r_q8_0p(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) {
#if PI_HAVE_ROWS8
    const sb_q4_0r *const *r = (const sb_q4_0r *const *)rows;
    const int64_t nsb = n / 256;
    /* One token on Intel and Zen 5 (pi_cpu_software_prefetch): software prefetch. Sapphire Rapids, the 7B shape's CATS FFN at
     * half the channels, 2 threads: 0.93-0.94x the time (4 ahead: 0.96x; into L2 8 ahead: 1.05x). AMD CPUs run
     * without it, as measured there (d32342d removed an earlier one, 4 ahead, when the down step was axpy_group). */
    const bool ahead = nt == 1 && pi_cpu_software_prefetch();
    for (int t = 0; t < nt; t++) {
        const sb_q8_0p *xt = (const sb_q8_0p *)(x + t * x_stride);
        __m256 acc[8];
        for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
        for (int64_t s = 0; s < nsb; s++) {
            if (ahead)   /* the 3 lines of each row's super-block 2 ahead */
                for (int k = 0; k < 8; k++)
                    for (int l = 0; l < 3; l++) _mm_prefetch((const char *)&r[k][s + 2] + 64 * l, _MM_HINT_T0);
            for (int k = 0; k < 8; k++) acc[k] = sb_dot(&r[k][s], &xt[s], acc[k]);
        }
        for (int k = 0; k < 8; k++) y[t * y_stride + k] = pi_hsum_ps(acc[k]);
    }
#else
    for (int k = 0; k < 8; k++)
        for (int t = 0; t < nt; t++) y[t * y_stride + k] = pi_vec_dot_q4_0r_q8_0p(n, rows[k], x + t * x_stride);
#endif
}

