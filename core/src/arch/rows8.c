/* rows8.c: Q4_0 (and IQ4_NL) kernels that compute eight weight rows at once, and the interleaved
 * layout (PI_TYPE_Q4_0X8, PI_TYPE_IQ4_NLX8) they read fastest.
 *
 * Eight rows are held "transposed" in four registers: 32-bit lane r of register m holds
 * bytes 4m..4m+3 of row r's block, i.e. elements 4m..4m+3 (low nibbles) and
 * 16+4m..16+4m+3 (high nibbles). Broadcasting four activation bytes against such a
 * register with maddubs yields partial sums for all eight rows in their own lanes, so
 * there is no horizontal reduction, the eight row scales are one vector, and the
 * unpacked weights are reused for up to PI_DOT8_MAX_T (8) tokens.
 *
 * The nibbles stay unsigned (0..15): sum (q - 8) y = sum q y - 8 s with s the activation
 * block's sum (PI_TYPE_Q8_0S). Eight maddubs results (each lane |2 * 15 * 127| <= 3810)
 * add up in int16 without overflow (<= 30480). Per (row, token) the arithmetic is the
 * canonical one of pi_vec_dot_q4_0_q8_0s: exact integer per block, then
 * acc = fma(d_w * d_x, i, acc) in block order, so all Q4_0 kernels agree bit for bit.
 *
 * Interleaved layout: a tensor of N = 8G rows is G groups; group g is nb blocks of
 * pi_block_q4_0x8 (rows 8g..8g+7, 144 bytes each), so a group's weights are one
 * contiguous stream.
 *
 * IQ4_NL has Q4_0's layout with the nibble indexing a grid of 16 int8 values (PI_IQ4_VALUES), and Q4_0's canonical
 * order with i = sum PI_IQ4_VALUES[q] y: the same kernels with `grid` set look the values up (one pshufb per
 * register) and dot the signed values with the sign trick, maddubs(|v|, sign(y, v)), |v| <= 127, whose int16 pairs
 * (<= 32258) are widened at once. */
#include "../quants_k.h"   /* internal.h, and PI_IQ4_VALUES */

#include <math.h>
#include <string.h>

#if PI_HAVE_ROWS8
#include <immintrin.h>
#include <stddef.h>

#include "avx2_util.h"

#ifndef PREFETCH_BLOCKS
#define PREFETCH_BLOCKS 16  /* how far ahead (in blocks: 2.3 KB) the next weights are prefetched */
#endif
#ifndef ROW_PREFETCH_BLOCKS
#define ROW_PREFETCH_BLOCKS 8
#endif

/* The four transposed registers of a block -> its 8 registers of unsigned nibbles (low, then high): w[g] holds
 * elements 4g..4g+3 of each row; with grid, their signed values (w) and magnitudes (aw). */
static inline __attribute__((always_inline)) void unpack8(__m256i c0, __m256i c1, __m256i c2, __m256i c3, __m256i w[8],
                                                          __m256i aw[8], const int grid) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i c[4] = { c0, c1, c2, c3 };
    for (int m = 0; m < 4; m++) {
        w[m] = _mm256_and_si256(c[m], m4);
        w[m + 4] = _mm256_and_si256(_mm256_srli_epi16(c[m], 4), m4);
    }
    if (grid) {
        const __m256i values = pi_iq4_grid();
        for (int g = 0; g < 8; g++) {
            w[g] = _mm256_shuffle_epi8(values, w[g]);
            aw[g] = _mm256_sign_epi8(w[g], w[g]);
        }
    }
}

/* One token's activation block xb against the unpacked block (8 row scales dw): acc + its 8 dot
 * products, the activation words broadcast straight from the block. */
static inline __attribute__((always_inline)) __m256 token8(const __m256i w[8], const __m256i aw[8], __m256 dw,
                                                           const pi_block_q8_0s *xb, __m256 acc, const int grid) {
    __m256i s32;
    if (grid) {   /* sum v y over the signed values */
        s32 = pi_dot_i8_bcast(w, aw, xb->qs, 8);
    } else {      /* sum (q - 8) y = sum q y - 8 s; AVX2: 8 x 2 x 15 x 127 fits int16 */
        s32 = _mm256_sub_epi32(pi_dot_u8_bcast(w, xb->qs, 8), _mm256_set1_epi32(8 * (int32_t)xb->s));
    }
    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(pi_fp16_to_f32(xb->d)));
    return _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s32), acc);
}

/* Accumulates one block (8 rows x 32 elements, given as the four transposed registers and the
 * 8 row scales) into acc[t] for nt tokens, unpacking the weights once. */
static inline __attribute__((always_inline)) void block8(__m256i c0, __m256i c1, __m256i c2, __m256i c3, __m256 dw,
                                                         const char *x, int64_t x_stride, int64_t b, int nt,
                                                         __m256 *acc, const int grid) {
    __m256i w[8], aw[8];
    unpack8(c0, c1, c2, c3, w, aw, grid);
    for (int t = 0; t < nt; t++)
        acc[t] = token8(w, aw, dw, (const pi_block_q8_0s *)(x + t * x_stride) + b, acc[t], grid);
}

/* block8 for one token, with the accumulator in a register (the nt loop keeps acc[t] in memory). */
static inline __attribute__((always_inline)) __m256 block8_t1(__m256i c0, __m256i c1, __m256i c2, __m256i c3,
                                                              __m256 dw, const pi_block_q8_0s *xb, __m256 acc,
                                                              const int grid) {
    __m256i w[8], aw[8];
    unpack8(c0, c1, c2, c3, w, aw, grid);
    return token8(w, aw, dw, xb, acc, grid);
}

static inline void store8(const __m256 *acc, int nt, float *y, int64_t y_stride) {
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

/* 8 rows of Q4_0 (grid 0) or IQ4_NL (grid 1) blocks at any addresses (the layouts are the same) */
static inline __attribute__((always_inline)) void rows8(int64_t n, const void *const *rows, const char *x,
                                                        int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                        const int grid) {
    const pi_block_q4_0 *const *r = (const pi_block_q4_0 *const *)rows;
    const int64_t nb = n / PI_QK4_0;
    if (nt == 1) {   /* decode */
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if ((b & 3) == 0)
                for (int k = 0; k < 8; k++) _mm_prefetch((const char *)(r[k] + b + ROW_PREFETCH_BLOCKS), _MM_HINT_T0);
            const char *p[8];
            for (int k = 0; k < 8; k++) p[k] = (const char *)(r[k] + b);
            __m256i c[4];
            pi_transpose8x16(p, offsetof(pi_block_q4_0, qs), c);
            acc = block8_t1(c[0], c[1], c[2], c[3], pi_f16x8_rows(p, offsetof(pi_block_q4_0, d)),
                            (const pi_block_q8_0s *)x + b, acc, grid);
        }
        _mm256_storeu_ps(y, acc);
        return;
    }
    __m256 acc[PI_DOT8_MAX_T];
    for (int t = 0; t < PI_DOT8_MAX_T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if ((b & 3) == 0)   /* 4 blocks = 72 bytes: about one new cache line per row */
            for (int k = 0; k < 8; k++) _mm_prefetch((const char *)(r[k] + b + ROW_PREFETCH_BLOCKS), _MM_HINT_T0);
        const char *p[8];
        for (int k = 0; k < 8; k++) p[k] = (const char *)(r[k] + b);
        __m256i c[4];
        pi_transpose8x16(p, offsetof(pi_block_q4_0, qs), c);

        block8(c[0], c[1], c[2], c[3], pi_f16x8_rows(p, offsetof(pi_block_q4_0, d)), x, x_stride, b, nt, acc, grid);
    }
    store8(acc, nt, y, y_stride);
}

void pi_vec_dot8_q4_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { rows8(n, rows, x, x_stride, nt, y, y_stride, 0); }
void pi_vec_dot8_iq4_nl_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) { rows8(n, rows, x, x_stride, nt, y, y_stride, 1); }

/* one group of the interleaved layout (Q4_0X8, grid 0; IQ4_NLX8, grid 1) */
static inline __attribute__((always_inline)) void group8(int64_t n, const void *group, const char *x, int64_t x_stride,
                                                         int nt, float *y, int64_t y_stride, const int grid) {
    const pi_block_q4_0x8 *g = group;
    const int64_t nb = n / PI_QK4_0;
    if (nt == 1) {   /* decode */
        const pi_block_q8_0s *xb = (const pi_block_q8_0s *)x;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const char *ahead = (const char *)(g + b + PREFETCH_BLOCKS);
            _mm_prefetch(ahead, _MM_HINT_T0);
            _mm_prefetch(ahead + 64, _MM_HINT_T0);
            _mm_prefetch(ahead + 128, _MM_HINT_T0);
            const __m256i *q = (const __m256i *)g[b].qs;
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g[b].d));
            acc = block8_t1(_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1), _mm256_loadu_si256(q + 2),
                            _mm256_loadu_si256(q + 3), dw, xb + b, acc, grid);
        }
        _mm256_storeu_ps(y, acc);
        return;
    }
    __m256 acc[PI_DOT8_MAX_T];
    for (int t = 0; t < PI_DOT8_MAX_T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *ahead = (const char *)(g + b + PREFETCH_BLOCKS);   /* 144 bytes: up to 3 lines */
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
        _mm_prefetch(ahead + 128, _MM_HINT_T0);
        const __m256i *q = (const __m256i *)g[b].qs;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g[b].d));
        block8(_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1), _mm256_loadu_si256(q + 2), _mm256_loadu_si256(q + 3),
               dw, x, x_stride, b, nt, acc, grid);
    }
    store8(acc, nt, y, y_stride);
}

void pi_gemm8_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, 0); }
void pi_gemm8_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, 1); }

#if PI_HAVE_ROWS16
/* Two consecutive groups of the interleaved layout (rows 8g..8g+15) against nt <= PI_DOT8_MAX_T tokens,
 * 512 bits wide: lane r < 8 is row r of the first group, lane 8 + r row r of the second, so each
 * instruction does the work of two 8-row ones; per (row, token) the same integers (VNNI, exact) and
 * the same fma chain as gemm8: the same bits. y[t y_stride + 0..15] receives the 16 rows. IQ4_NLX8 (grid): the
 * nibbles look up value + 128, unsigned for VNNI, and - 128 s takes the offset out again (Q4_0: q, - 8 s). */
static inline __attribute__((always_inline)) void group16(int64_t n, const void *group, const char *x,
                                                          int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                          const int grid) {
    const int64_t nb = n / PI_QK4_0;
    const pi_block_q4_0x8 *g0 = group, *g1 = g0 + nb;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i values = pi_iq4_grid_u8_512();
    __m512 acc[PI_DOT8_MAX_T];
    for (int t = 0; t < PI_DOT8_MAX_T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int k = 0; k < 3; k++) {
            _mm_prefetch((const char *)(g0 + b + PREFETCH_BLOCKS) + 64 * k, _MM_HINT_T0);
            _mm_prefetch((const char *)(g1 + b + PREFETCH_BLOCKS) + 64 * k, _MM_HINT_T0);
        }
        __m512i w[8];   /* w[m] (m < 4): low nibbles = elements 4m..4m+3, w[4 + m]: high = 16+4m.. of each row */
        for (int m = 0; m < 4; m++) {
            const __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)g0[b].qs + m)),
                                                 _mm256_loadu_si256((const __m256i *)g1[b].qs + m), 1);
            w[m] = _mm512_and_si512(c, m4);
            w[m + 4] = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
            if (grid) {
                w[m] = _mm512_shuffle_epi8(values, w[m]);
                w[m + 4] = _mm512_shuffle_epi8(values, w[m + 4]);
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)g1[b].d),
                                                           _mm_loadu_si128((const __m128i *)g0[b].d)));
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
            const __m512i s32 = pi_dot16_q8_0s(w, xb, grid ? 128 : 8);
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(pi_fp16_to_f32(xb->d)));
            acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s32), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + t * y_stride, acc[t]);
}
void pi_gemm16_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { group16(n, group, x, x_stride, nt, y, y_stride, 0); }
void pi_gemm16_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) { group16(n, group, x, x_stride, nt, y, y_stride, 1); }
#endif

/* Eight Q4_0 axpy in one pass: per block the 32 outputs stay in registers while the eight rows are
 * added in order, each exactly as pi_axpy_q4_0 adds it (fma(a_k d, q - 8, y)). */
void pi_axpy8_q4_0(int64_t n, const float *a, const void *const *rows, float *y) {
    const pi_block_q4_0 *const *r = (const pi_block_q4_0 *const *)rows;
#if PI_HAVE_ROWS16
    const __m512 table = pi_q4_0_minus8_table();
    for (int64_t b = 0; b < n / PI_QK4_0; b++) {
        __m512 yb[2] = { _mm512_loadu_ps(y + b * PI_QK4_0), _mm512_loadu_ps(y + b * PI_QK4_0 + 16) };
        for (int k = 0; k < 8; k++)
            pi_q4_0_axpy_block16(table, _mm512_set1_ps(a[k] * pi_fp16_to_f32(r[k][b].d)), r[k][b].qs, yb);
        _mm512_storeu_ps(y + b * PI_QK4_0, yb[0]);
        _mm512_storeu_ps(y + b * PI_QK4_0 + 16, yb[1]);
    }
    return;
#endif
    for (int64_t b = 0; b < n / PI_QK4_0; b++) {
        __m256 yb[4];
        pi_load4_ps(y + b * PI_QK4_0, yb);
        for (int k = 0; k < 8; k++) pi_q4_0_axpy_block(_mm256_set1_ps(a[k] * pi_fp16_to_f32(r[k][b].d)), r[k][b].qs, yb);
        pi_store4_ps(y + b * PI_QK4_0, yb);
    }
}

#else   /* scalar: the canonical order of pi_vec_dot_q4_0_q8_0s (pi_vec_dot_iq4_nl_q8_0s) per (row, token) */

static void group8(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y, int64_t y_stride,
                   const int grid) {
    const pi_block_q4_0x8 *g = group;
    for (int t = 0; t < nt; t++) {
        const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride);
        for (int r = 0; r < 8; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < n / PI_QK4_0; b++) {
                int32_t s = 0;
                for (int j = 0; j < PI_QK4_0 / 2; j++) {   /* byte j of row r: elements j and j + 16 */
                    const uint8_t q = g[b].qs[32 * (j / 4) + 4 * r + j % 4];
                    s += grid ? PI_IQ4_VALUES[q & 0x0f] * xb[b].qs[j] + PI_IQ4_VALUES[q >> 4] * xb[b].qs[j + PI_QK4_0 / 2]
                              : (q & 0x0f) * xb[b].qs[j] + (q >> 4) * xb[b].qs[j + PI_QK4_0 / 2];
                }
                if (!grid) s -= 8 * xb[b].s;
                acc = fmaf(pi_fp16_to_f32(g[b].d[r]) * pi_fp16_to_f32(xb[b].d), (float)s, acc);
            }
            y[t * y_stride + r] = acc;
        }
    }
}

void pi_gemm8_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, 0); }
void pi_gemm8_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, 1); }

#endif

#if PI_NEON
/* block b of the 4 rows: the values (elements 0..15: lo, 16..31: hi; Q4_0's unsigned nibbles, IQ4_NL's grid values)
 * and the d of each (lane k: row k) */
static inline __attribute__((always_inline)) float32x4_t rows4_block(const pi_block_q4_0 *const r[4], int64_t b,
                                                                     const int grid, int8x16_t lo[4], int8x16_t hi[4]) {
    const uint16_t *d[4] = { &r[0][b].d, &r[1][b].d, &r[2][b].d, &r[3][b].d };
    for (int k = 0; k < 4; k++)
        if (grid) pi_neon_iq4_values(r[k][b].qs, vld1q_s8(PI_IQ4_VALUES), &lo[k], &hi[k]);
        else pi_neon_nibbles(r[k][b].qs, &lo[k], &hi[k]);
    return pi_neon_rows4_f16(d);
}

/* NEON (no interleaved copies at the aarch64 levels): 8 rows of Q4_0 (grid 0) or IQ4_NL (grid 1) blocks at any
 * addresses, as two passes of 4 rows over the blocks. Per block the 4 rows' values are made once (8 registers) and
 * serve every token; per token two SDOT per row give a row's block products as 4 lanes, and three pairwise adds put
 * the 4 rows' exact block sums in the lanes of one register, so that lane r takes row r's step of the canonical order
 * of pi_vec_dot_q4_0_q8_0s, acc = fma(d_w d_x, i - 8 s, acc) (IQ4_NL: i), in one vector fma. tok: a constant. */
static inline __attribute__((always_inline)) void rows4_neon(int64_t nb, const pi_block_q4_0 *const r[4], const char *x,
                                                             int64_t x_stride, const int tok, float *y,
                                                             int64_t y_stride, const int grid) {
    float32x4_t acc[PI_DOT8_MAX_T];
    for (int t = 0; t < tok; t++) acc[t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t lo[4], hi[4];
        const float32x4_t dw = rows4_block(r, b, grid, lo, hi);
        for (int t = 0; t < tok; t++) {
            const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
            int32x4_t i = pi_neon_rows4_sums(lo, hi, xb->qs);   /* lane k: row k's block sum */
            if (!grid) i = vsubq_s32(i, vdupq_n_s32(8 * xb->s));
            acc[t] = vfmaq_f32(acc[t], vmulq_n_f32(dw, pi_fp16_to_f32(xb->d)), vcvtq_f32_s32(i));
        }
    }
    for (int t = 0; t < tok; t++) vst1q_f32(y + t * y_stride, acc[t]);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
/* The i8mm level, two tokens or more: per block the 4 rows' values as two row pairs of SMMLA operands (made once,
 * used for every token pair), per token pair 8 SMMLA give the 8 (row, token) block sums in two registers, lanes (row
 * 2q, token 2p), (2q, 2p + 1), (2q + 1, 2p), (2q + 1, 2p + 1), and each register's canonical step is one vector fma as
 * above. pairs: token pairs (a constant); an odd last token is paired with itself, its copy not stored. */
static inline __attribute__((always_inline)) void rows4_i8mm(int64_t nb, const pi_block_q4_0 *const r[4], const char *x,
                                                             int64_t x_stride, int nt, const int pairs, float *y,
                                                             int64_t y_stride, const int grid) {
    float32x4_t acc[PI_DOT8_MAX_T / 2][2];   /* [token pair][row pair] */
    const pi_block_q8_0s *xt[PI_DOT8_MAX_T];
    for (int t = 0; t < 2 * pairs; t++) xt[t] = (const pi_block_q8_0s *)(x + PI_MIN(t, nt - 1) * x_stride);
    for (int p = 0; p < pairs; p++) acc[p][0] = acc[p][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t lo[4], hi[4], w[2][4];
        const float32x4_t dw = rows4_block(r, b, grid, lo, hi);
        pi_neon_pair_chunks(lo[0], hi[0], lo[1], hi[1], w[0]);
        pi_neon_pair_chunks(lo[2], hi[2], lo[3], hi[3], w[1]);
        const float32x4_t dwq[2] = { vzip1q_f32(dw, dw), vzip2q_f32(dw, dw) };   /* d of rows 2q, 2q, 2q + 1, 2q + 1 */
        for (int p = 0; p < pairs; p++) {
            const pi_block_q8_0s *a = xt[2 * p] + b, *c = xt[2 * p + 1] + b;
            int8x16_t xc[4];
            pi_neon_pair_chunks(vld1q_s8(a->qs), vld1q_s8(a->qs + 16), vld1q_s8(c->qs), vld1q_s8(c->qs + 16), xc);
            /* the tokens' d and 8 s as lanes a, c, a, c, from one 32-bit word each */
            const float32x4_t dx = vcvt_f32_f16(vreinterpret_f16_u32(vdup_n_u32(a->d | (uint32_t)c->d << 16)));
            const int32x4_t s8 = vshlq_n_s32(vmovl_s16(vreinterpret_s16_u32(
                vdup_n_u32((uint16_t)a->s | (uint32_t)(uint16_t)c->s << 16))), 3);
            for (int q = 0; q < 2; q++) {
                int32x4_t i = pi_neon_pair_sums(w[q], xc);
                if (!grid) i = vsubq_s32(i, s8);
                acc[p][q] = vfmaq_f32(acc[p][q], vmulq_f32(dwq[q], dx), vcvtq_f32_s32(i));
            }
        }
    }
    for (int p = 0; p < pairs; p++)
        for (int q = 0; q < 2; q++) pi_neon_store_pair_lanes(acc[p][q], y + 2 * p * y_stride + 2 * q, y_stride,
                                                             2 * p + 1 < nt);
}
#endif

static inline __attribute__((always_inline)) void rows8_neon(int64_t n, const void *const *rows, const char *x,
                                                             int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                             const int grid) {
    const pi_block_q4_0 *const *r = (const pi_block_q4_0 *const *)rows;
#if defined(__ARM_FEATURE_MATMUL_INT8)
    if (nt > 1) {
        for (int k0 = 0; k0 < 8; k0 += 4)
            switch ((nt + 1) / 2) {
            case 1: rows4_i8mm(n / PI_QK4_0, r + k0, x, x_stride, nt, 1, y + k0, y_stride, grid); break;
            case 2: rows4_i8mm(n / PI_QK4_0, r + k0, x, x_stride, nt, 2, y + k0, y_stride, grid); break;
            case 3: rows4_i8mm(n / PI_QK4_0, r + k0, x, x_stride, nt, 3, y + k0, y_stride, grid); break;
            default: rows4_i8mm(n / PI_QK4_0, r + k0, x, x_stride, nt, 4, y + k0, y_stride, grid); break;
            }
        return;
    }
#endif
    for (int k0 = 0; k0 < 8; k0 += 4)
        switch (nt) {   /* the token count a constant in each copy, so the accumulators stay in registers */
#define ROWS4_CASE(tok)                                                                                            \
        case tok: rows4_neon(n / PI_QK4_0, r + k0, x, x_stride, tok, y + k0, y_stride, grid); break;
        ROWS4_CASE(1) ROWS4_CASE(2) ROWS4_CASE(3) ROWS4_CASE(4) ROWS4_CASE(5) ROWS4_CASE(6) ROWS4_CASE(7)
        default: rows4_neon(n / PI_QK4_0, r + k0, x, x_stride, PI_DOT8_MAX_T, y + k0, y_stride, grid); break;
#undef ROWS4_CASE
        }
}

void pi_vec_dot8_q4_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { rows8_neon(n, rows, x, x_stride, nt, y, y_stride, 0); }
void pi_vec_dot8_iq4_nl_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) { rows8_neon(n, rows, x, x_stride, nt, y, y_stride, 1); }
#endif

void pi_repack8_q4_0x8(int64_t n, const void *const *rows, void *group) {
    pi_interleave_blocks(n / PI_QK4_0, rows, 8, sizeof(pi_block_q4_0), group);
}
