/* rows8.c: Q4_0 (and IQ4_NL, MXFP4) kernels that compute eight weight rows at once, and the interleaved
 * layout (PI_TYPE_Q4_0X8, PI_TYPE_IQ4_NLX8, PI_TYPE_MXFP4X8) they read fastest.
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
 * order with i = sum PI_IQ4_VALUES[q] y: the same kernels with a grid kind (quants_k.h's PI_NIB_*) look the values up
 * (one pshufb per register) and dot the signed values with the sign trick, maddubs(|v|, sign(y, v)), |v| <= 127, whose
 * int16 pairs (<= 32258) are widened at once. MXFP4 is the same with its own grid (PI_MXFP4_VALUES, |v| <= 12) and a
 * one-byte E8M0 scale in place of the fp16 d (17-byte blocks; MXFP4X8: Q4_0X8's layout after 8 scale bytes): the
 * kind, a constant in each kernel's copy, says where the nibbles start and how the scales are read. */
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

/* The 8 rows' scales (lane k: row k's) of blocks whose scale bytes are at p[k] (the file's rows) or in one run at p
 * (an interleaved group's 8 scales). */
static inline __attribute__((always_inline)) __m256 rows_scales8(const char *const *p, const int kind) {
    if (kind != PI_NIB_MXFP4) return pi_f16x8_rows(p, 0);
    uint64_t e = 0;
    for (int k = 0; k < 8; k++) e |= (uint64_t)(uint8_t)p[k][0] << 8 * k;
    return pi_e8m0_half_x8(e);
}
static inline __attribute__((always_inline)) __m256 group_scales8(const char *p, const int kind) {
    if (kind == PI_NIB_MXFP4) return pi_e8m0_half_x8(pi_load_u64(p));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* The four transposed registers of a block -> its 8 registers of unsigned nibbles (low, then high): w[g] holds
 * elements 4g..4g+3 of each row; with a grid kind, their signed values (w) and magnitudes (aw). */
static inline __attribute__((always_inline)) void unpack8(__m256i c0, __m256i c1, __m256i c2, __m256i c3, __m256i w[8],
                                                          __m256i aw[8], const int kind) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i c[4] = { c0, c1, c2, c3 };
    for (int m = 0; m < 4; m++) {
        w[m] = _mm256_and_si256(c[m], m4);
        w[m + 4] = _mm256_and_si256(_mm256_srli_epi16(c[m], 4), m4);
    }
    if (kind != PI_NIB_Q4_0) {
        const __m256i values = pi_grid16(pi_nib_values(kind));
        for (int g = 0; g < 8; g++) {
            w[g] = _mm256_shuffle_epi8(values, w[g]);
            aw[g] = _mm256_sign_epi8(w[g], w[g]);
        }
    }
}

/* One token's activation block xb against the unpacked block (8 row scales dw): acc + its 8 dot
 * products, the activation words broadcast straight from the block. */
static inline __attribute__((always_inline)) __m256 token8(const __m256i w[8], const __m256i aw[8], __m256 dw,
                                                           const pi_block_q8_0s *xb, __m256 acc, const int kind) {
    __m256i s32;
    if (kind != PI_NIB_Q4_0) {   /* sum v y over the signed values */
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
                                                         __m256 *acc, const int kind) {
    __m256i w[8], aw[8];
    unpack8(c0, c1, c2, c3, w, aw, kind);
    for (int t = 0; t < nt; t++)
        acc[t] = token8(w, aw, dw, (const pi_block_q8_0s *)(x + t * x_stride) + b, acc[t], kind);
}

/* block8 for one token, with the accumulator in a register (the nt loop keeps acc[t] in memory). */
static inline __attribute__((always_inline)) __m256 block8_t1(__m256i c0, __m256i c1, __m256i c2, __m256i c3,
                                                              __m256 dw, const pi_block_q8_0s *xb, __m256 acc,
                                                              const int kind) {
    __m256i w[8], aw[8];
    unpack8(c0, c1, c2, c3, w, aw, kind);
    return token8(w, aw, dw, xb, acc, kind);
}

static inline void store8(const __m256 *acc, int nt, float *y, int64_t y_stride) {
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

/* 8 rows of Q4_0, IQ4_NL or MXFP4 blocks (kind) at any addresses */
static inline __attribute__((always_inline)) void rows8(int64_t n, const void *const *rows, const char *x,
                                                        int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                        const int kind) {
    const char *const *r = (const char *const *)rows;
    const int64_t nb = n / PI_QK4_0, bb = pi_nib_block_bytes(kind), off = pi_nib_scale_bytes(kind);
    if (nt == 1) {   /* decode */
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if ((b & 3) == 0)
                for (int k = 0; k < 8; k++) _mm_prefetch(r[k] + (b + ROW_PREFETCH_BLOCKS) * bb, _MM_HINT_T0);
            const char *p[8];
            for (int k = 0; k < 8; k++) p[k] = r[k] + b * bb;
            __m256i c[4];
            pi_transpose8x16(p, (size_t)off, c);
            acc = block8_t1(c[0], c[1], c[2], c[3], rows_scales8(p, kind), (const pi_block_q8_0s *)x + b, acc, kind);
        }
        _mm256_storeu_ps(y, acc);
        return;
    }
    __m256 acc[PI_DOT8_MAX_T];
    for (int t = 0; t < PI_DOT8_MAX_T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if ((b & 3) == 0)   /* 4 blocks = 72 bytes: about one new cache line per row */
            for (int k = 0; k < 8; k++) _mm_prefetch(r[k] + (b + ROW_PREFETCH_BLOCKS) * bb, _MM_HINT_T0);
        const char *p[8];
        for (int k = 0; k < 8; k++) p[k] = r[k] + b * bb;
        __m256i c[4];
        pi_transpose8x16(p, (size_t)off, c);

        block8(c[0], c[1], c[2], c[3], rows_scales8(p, kind), x, x_stride, b, nt, acc, kind);
    }
    store8(acc, nt, y, y_stride);
}

void pi_vec_dot8_q4_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { rows8(n, rows, x, x_stride, nt, y, y_stride, PI_NIB_Q4_0); }
void pi_vec_dot8_iq4_nl_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) { rows8(n, rows, x, x_stride, nt, y, y_stride, PI_NIB_IQ4_NL); }
void pi_vec_dot8_mxfp4_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) { rows8(n, rows, x, x_stride, nt, y, y_stride, PI_NIB_MXFP4); }

/* one group of the interleaved layout (Q4_0X8, IQ4_NLX8, MXFP4X8: kind): per block the 8 scales (8 x 2 or 8 x 1
 * bytes), then the 128 nibble bytes */
static inline __attribute__((always_inline)) void group8(int64_t n, const void *group, const char *x, int64_t x_stride,
                                                         int nt, float *y, int64_t y_stride, const int kind) {
    const char *g = group;
    const int64_t nb = n / PI_QK4_0, gbytes = 8 * pi_nib_block_bytes(kind), qoff = 8 * pi_nib_scale_bytes(kind);
    if (nt == 1) {   /* decode */
        const pi_block_q8_0s *xb = (const pi_block_q8_0s *)x;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const char *gb = g + b * gbytes, *ahead = gb + PREFETCH_BLOCKS * gbytes;
            _mm_prefetch(ahead, _MM_HINT_T0);
            _mm_prefetch(ahead + 64, _MM_HINT_T0);
            _mm_prefetch(ahead + 128, _MM_HINT_T0);
            const __m256i *q = (const __m256i *)(gb + qoff);
            acc = block8_t1(_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1), _mm256_loadu_si256(q + 2),
                            _mm256_loadu_si256(q + 3), group_scales8(gb, kind), xb + b, acc, kind);
        }
        _mm256_storeu_ps(y, acc);
        return;
    }
    __m256 acc[PI_DOT8_MAX_T];
    for (int t = 0; t < PI_DOT8_MAX_T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *gb = g + b * gbytes, *ahead = gb + PREFETCH_BLOCKS * gbytes;   /* 136-144 bytes: up to 3 lines */
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
        _mm_prefetch(ahead + 128, _MM_HINT_T0);
        const __m256i *q = (const __m256i *)(gb + qoff);
        block8(_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1), _mm256_loadu_si256(q + 2), _mm256_loadu_si256(q + 3),
               group_scales8(gb, kind), x, x_stride, b, nt, acc, kind);
    }
    store8(acc, nt, y, y_stride);
}

void pi_gemm8_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, PI_NIB_Q4_0); }
void pi_gemm8_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, PI_NIB_IQ4_NL); }
void pi_gemm8_mxfp4x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, PI_NIB_MXFP4); }

#if PI_HAVE_ROWS16
/* Two consecutive groups of the interleaved layout (rows 8g..8g+15) against nt <= PI_DOT8_MAX_T tokens,
 * 512 bits wide: lane r < 8 is row r of the first group, lane 8 + r row r of the second, so each
 * instruction does the work of two 8-row ones; per (row, token) the same integers (VNNI, exact) and
 * the same fma chain as gemm8: the same bits. y[t y_stride + 0..15] receives the 16 rows. IQ4_NLX8, MXFP4X8 (grid
 * kinds): the nibbles look up value + 128, unsigned for VNNI, and - 128 s takes the offset out again (Q4_0: q,
 * - 8 s). */
static inline __attribute__((always_inline)) void group16(int64_t n, const void *group, const char *x,
                                                          int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                          const int kind) {
    const int64_t nb = n / PI_QK4_0, gbytes = 8 * pi_nib_block_bytes(kind), qoff = 8 * pi_nib_scale_bytes(kind);
    const char *g0 = group, *g1 = g0 + nb * gbytes;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const int grid = kind != PI_NIB_Q4_0;
    const __m512i values = pi_grid16_u8_512(pi_nib_values(kind));
    __m512 acc[PI_DOT8_MAX_T];
    for (int t = 0; t < PI_DOT8_MAX_T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *b0 = g0 + b * gbytes, *b1 = g1 + b * gbytes;
        for (int k = 0; k < 3; k++) {
            _mm_prefetch(b0 + PREFETCH_BLOCKS * gbytes + 64 * k, _MM_HINT_T0);
            _mm_prefetch(b1 + PREFETCH_BLOCKS * gbytes + 64 * k, _MM_HINT_T0);
        }
        __m512i w[8];   /* w[m] (m < 4): low nibbles = elements 4m..4m+3, w[4 + m]: high = 16+4m.. of each row */
        const __m256i *q0 = (const __m256i *)(b0 + qoff), *q1 = (const __m256i *)(b1 + qoff);
        for (int m = 0; m < 4; m++) {
            const __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(q0 + m)),
                                                 _mm256_loadu_si256(q1 + m), 1);
            w[m] = _mm512_and_si512(c, m4);
            w[m + 4] = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
            if (grid) {
                w[m] = _mm512_shuffle_epi8(values, w[m]);
                w[m + 4] = _mm512_shuffle_epi8(values, w[m + 4]);
            }
        }
        const __m512 dw = kind == PI_NIB_MXFP4   /* the two groups' 8 scales */
            ? _mm512_insertf32x8(_mm512_castps256_ps512(group_scales8(b0, kind)), group_scales8(b1, kind), 1)
            : _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)b1),
                                               _mm_loadu_si128((const __m128i *)b0)));
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
                            int64_t y_stride) { group16(n, group, x, x_stride, nt, y, y_stride, PI_NIB_Q4_0); }
void pi_gemm16_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) { group16(n, group, x, x_stride, nt, y, y_stride, PI_NIB_IQ4_NL); }
void pi_gemm16_mxfp4x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) { group16(n, group, x, x_stride, nt, y, y_stride, PI_NIB_MXFP4); }
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
                   const int kind) {
    const int64_t gbytes = 8 * pi_nib_block_bytes(kind), sb = pi_nib_scale_bytes(kind);
    const int grid = kind != PI_NIB_Q4_0;
    const int8_t *values = pi_nib_values(kind);
    for (int t = 0; t < nt; t++) {
        const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride);
        for (int r = 0; r < 8; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < n / PI_QK4_0; b++) {
                const uint8_t *gb = (const uint8_t *)group + b * gbytes, *qs = gb + 8 * sb;
                int32_t s = 0;
                for (int j = 0; j < PI_QK4_0 / 2; j++) {   /* byte j of row r: elements j and j + 16 */
                    const uint8_t q = qs[32 * (j / 4) + 4 * r + j % 4];
                    s += grid ? values[q & 0x0f] * xb[b].qs[j] + values[q >> 4] * xb[b].qs[j + PI_QK4_0 / 2]
                              : (q & 0x0f) * xb[b].qs[j] + (q >> 4) * xb[b].qs[j + PI_QK4_0 / 2];
                }
                if (!grid) s -= 8 * xb[b].s;
                acc = fmaf(pi_nib_scale(kind, gb + r * sb) * pi_fp16_to_f32(xb[b].d), (float)s, acc);
            }
            y[t * y_stride + r] = acc;
        }
    }
}

void pi_gemm8_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, PI_NIB_Q4_0); }
void pi_gemm8_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, PI_NIB_IQ4_NL); }
void pi_gemm8_mxfp4x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { group8(n, group, x, x_stride, nt, y, y_stride, PI_NIB_MXFP4); }

#endif

#if PI_NEON
/* block b of the 4 rows: the values (elements 0..15: lo, 16..31: hi; Q4_0's unsigned nibbles, IQ4_NL's and MXFP4's
 * grid values) and the scale of each (lane k: row k) */
static inline __attribute__((always_inline)) float32x4_t rows4_block(const char *const r[4], int64_t b, const int kind,
                                                                     int8x16_t lo[4], int8x16_t hi[4]) {
    const int64_t bb = pi_nib_block_bytes(kind), off = pi_nib_scale_bytes(kind);
    for (int k = 0; k < 4; k++) {
        const uint8_t *qs = (const uint8_t *)r[k] + b * bb + off;
        if (kind != PI_NIB_Q4_0) pi_neon_iq4_values(qs, vld1q_s8(pi_nib_values(kind)), &lo[k], &hi[k]);
        else pi_neon_nibbles(qs, &lo[k], &hi[k]);
    }
    if (kind == PI_NIB_MXFP4) {
        float d[4];
        for (int k = 0; k < 4; k++) d[k] = pi_e8m0_half((uint8_t)r[k][b * bb]);
        return vld1q_f32(d);
    }
    const uint16_t *d[4];
    for (int k = 0; k < 4; k++) d[k] = (const uint16_t *)(const void *)(r[k] + b * bb);
    return pi_neon_rows4_f16(d);
}

/* NEON (no interleaved copies at the aarch64 levels): 8 rows of Q4_0, IQ4_NL or MXFP4 blocks (kind) at any
 * addresses, as two passes of 4 rows over the blocks. Per block the 4 rows' values are made once (8 registers) and
 * serve every token; per token two SDOT per row give a row's block products as 4 lanes, and three pairwise adds put
 * the 4 rows' exact block sums in the lanes of one register, so that lane r takes row r's step of the canonical order
 * of pi_vec_dot_q4_0_q8_0s, acc = fma(d_w d_x, i - 8 s, acc) (the grid kinds: i), in one vector fma. tok: a
 * constant. */
static inline __attribute__((always_inline)) void rows4_neon(int64_t nb, const char *const r[4], const char *x,
                                                             int64_t x_stride, const int tok, float *y,
                                                             int64_t y_stride, const int kind) {
    float32x4_t acc[PI_DOT8_MAX_T];
    for (int t = 0; t < tok; t++) acc[t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t lo[4], hi[4];
        const float32x4_t dw = rows4_block(r, b, kind, lo, hi);
        for (int t = 0; t < tok; t++) {
            const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
            int32x4_t i = pi_neon_rows4_sums(lo, hi, xb->qs);   /* lane k: row k's block sum */
            if (kind == PI_NIB_Q4_0) i = vsubq_s32(i, vdupq_n_s32(8 * xb->s));
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
static inline __attribute__((always_inline)) void rows4_i8mm(int64_t nb, const char *const r[4], const char *x,
                                                             int64_t x_stride, int nt, const int pairs, float *y,
                                                             int64_t y_stride, const int kind) {
    float32x4_t acc[PI_DOT8_MAX_T / 2][2];   /* [token pair][row pair] */
    const pi_block_q8_0s *xt[PI_DOT8_MAX_T];
    for (int t = 0; t < 2 * pairs; t++) xt[t] = (const pi_block_q8_0s *)(x + PI_MIN(t, nt - 1) * x_stride);
    for (int p = 0; p < pairs; p++) acc[p][0] = acc[p][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t lo[4], hi[4], w[2][4];
        const float32x4_t dw = rows4_block(r, b, kind, lo, hi);
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
                if (kind == PI_NIB_Q4_0) i = vsubq_s32(i, s8);
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
                                                             const int kind) {
    const char *const *r = (const char *const *)rows;
#if defined(__ARM_FEATURE_MATMUL_INT8)
    if (nt > 1) {
        for (int k0 = 0; k0 < 8; k0 += 4)
            switch ((nt + 1) / 2) {
            case 1: rows4_i8mm(n / PI_QK4_0, r + k0, x, x_stride, nt, 1, y + k0, y_stride, kind); break;
            case 2: rows4_i8mm(n / PI_QK4_0, r + k0, x, x_stride, nt, 2, y + k0, y_stride, kind); break;
            case 3: rows4_i8mm(n / PI_QK4_0, r + k0, x, x_stride, nt, 3, y + k0, y_stride, kind); break;
            default: rows4_i8mm(n / PI_QK4_0, r + k0, x, x_stride, nt, 4, y + k0, y_stride, kind); break;
            }
        return;
    }
#endif
    for (int k0 = 0; k0 < 8; k0 += 4)
        switch (nt) {   /* the token count a constant in each copy, so the accumulators stay in registers */
#define ROWS4_CASE(tok)                                                                                            \
        case tok: rows4_neon(n / PI_QK4_0, r + k0, x, x_stride, tok, y + k0, y_stride, kind); break;
        ROWS4_CASE(1) ROWS4_CASE(2) ROWS4_CASE(3) ROWS4_CASE(4) ROWS4_CASE(5) ROWS4_CASE(6) ROWS4_CASE(7)
        default: rows4_neon(n / PI_QK4_0, r + k0, x, x_stride, PI_DOT8_MAX_T, y + k0, y_stride, kind); break;
#undef ROWS4_CASE
        }
}

void pi_vec_dot8_q4_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { rows8_neon(n, rows, x, x_stride, nt, y, y_stride, PI_NIB_Q4_0); }
void pi_vec_dot8_iq4_nl_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) { rows8_neon(n, rows, x, x_stride, nt, y, y_stride, PI_NIB_IQ4_NL); }
void pi_vec_dot8_mxfp4_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) { rows8_neon(n, rows, x, x_stride, nt, y, y_stride, PI_NIB_MXFP4); }
#endif

void pi_repack8_q4_0x8(int64_t n, const void *const *rows, void *group) {
    pi_interleave_blocks(n / PI_QK4_0, rows, 8, sizeof(pi_block_q4_0), 2, group);
}
void pi_repack8_mxfp4x8(int64_t n, const void *const *rows, void *group) {
    pi_interleave_blocks(n / PI_QK4_0, rows, 8, sizeof(pi_block_mxfp4), 1, group);
}
