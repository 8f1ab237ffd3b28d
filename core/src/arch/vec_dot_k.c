/* vec_dot_k.c: dot products and axpy of Q4_1, Q5_0, Q5_1, Q8_1 and the K-quants.
 *
 * Every kernel has a scalar version (the reference, compiled when the target lacks AVX2,
 * e.g. -DPI_NATIVE=OFF) and an AVX2 version.
 *
 * K-quants: the SIMD code computes only the exact integer sums of a 256-element
 * super-block (sum_j scale_j * sum_l q_l * y_l, and sum_j min_j * bsum_j); the float
 * combination is shared code. The SIMD and scalar results are therefore bit-identical.
 * 32-element types: per block an exact integer, then float steps into p[b % 8] (the canonical orders
 * at each kernel), which the scalar code spells out: the same bits too. */
#include "../quants_k.h"
#include "../iq_grids.h"

#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>

#include "avx2_util.h"

/* 16 bytes of packed nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones. */
static inline __m256i nibbles_32(const uint8_t *qs) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* 32 bits -> 32 bytes: byte k is 0xff when bit k is set, else 0. */
static inline __m256i bits_to_mask(uint32_t bits) {
    /* byte k takes source byte k/8, then tests its bit k%8 */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

static inline __m256i bits_to_bytes(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    return bits_to_mask(bits);
}

/* 32 sign bits -> 32 bytes: -1 where bit k is set, else +1 (sign_epi8's multiplier) */
static inline __m256i bits_to_signs(uint32_t bits) {
    return _mm256_or_si256(bits_to_mask(bits), _mm256_set1_epi8(1));
}

/* Sum of 32 int8 x int8 products as 8 int32 lanes (maddubs needs an unsigned first operand). */
static inline __m256i dot_i8(__m256i x, __m256i y) {
    return pi_dpbusd(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* Sum of 32 uint8 (< 128) x int8 products as 8 int32 lanes. */
static inline __m256i dot_u8_i8(__m256i u, __m256i y) {
    return pi_dpbusd(_mm256_setzero_si256(), u, y);
}

/* 32 uint8 (< 64) x 32 int8 products, elements 0..15 weighted by sc[j] and 16..31 by sc[j + 1], as 8 int32
 * lanes; sc: 16 int16 scales of a K-quant super-block (j even: sc[j], sc[j + 1] lie in one 128-bit half). */
static inline __m256i dot_u8_i8_pair(__m256i u, const int8_t *y, __m256i sc, int j) {
    const __m256i half = j < 8 ? _mm256_permute2x128_si256(sc, sc, 0x00) : _mm256_permute2x128_si256(sc, sc, 0x11);
    const __m256i pick = _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (j % 8))),
                                           _mm_set1_epi16((short)(0x0100 + 0x0202 * (j % 8 + 1))));
    const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)y));
    return _mm256_madd_epi16(p, _mm256_shuffle_epi8(half, pick));
}

/* The 16 int16 products sc[j] * bsums[j] summed in pairs: 8 int32 lanes whose total is exact (|sc| < 64,
 * |bsum| <= 2048). */
static inline __m256i scales_bsums_lanes(__m256i sc, const pi_block_q8_K *y) {
    return _mm256_madd_epi16(sc, _mm256_loadu_si256((const __m256i *)y->bsums));
}

/* The 32 quants of a Q5_0 / Q5_1 block (16 nibble bytes qs, 32 fifth bits qh) as unsigned bytes 0..31, element order. */
static inline __m256i quants_5bit(const uint8_t *qs, const uint8_t *qh) {
    return _mm256_or_si256(nibbles_32(qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(16)));
}
static inline __m256i q5_0_unsigned(const pi_block_q5_0 *blk) { return quants_5bit(blk->qs, blk->qh); }
/* The 32 quants of a Q4_1 / Q5_1 block (unsigned, < 32) in element order; void *: Q4_1/Q5_1's 8-row kernel
 * (rows8_k.c) takes either through one pointer type. */
static inline __m256i q4_1_quants(const void *blk) { return nibbles_32(((const pi_block_q4_1 *)blk)->qs); }
static inline __m256i q5_1_quants(const void *blk) {
    const pi_block_q5_1 *b = blk;
    return quants_5bit(b->qs, b->qh);
}

#endif

/* Decode streams one row per thread; asking for the super-block K_PREFETCH_AHEAD blocks on (all its cache lines)
 * keeps that stream's misses overlapped. */
#ifndef K_PREFETCH_AHEAD
#define K_PREFETCH_AHEAD 2
#endif
static inline void prefetch_block(const void *block, int64_t bytes) {
#if defined(__AVX2__)
    const char *ahead = (const char *)block + K_PREFETCH_AHEAD * bytes;
    for (int64_t l = 0; l < bytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
#else
    PI_UNUSED(block); PI_UNUSED(bytes);
#endif
}

/* ======================================================================================
 * 32-element blocks
 * ====================================================================================== */

/* Q5_0 . Q8_0S. The canonical order every Q5_0 kernel follows (the 8-row kernel of rows8_k.c too):
 * per block the exact integer i = sum u y - 16 s with u = the unsigned 5-bit quant (0..31) and s the
 * activation block's sum of quants, then p[b % 8] = fma(d_w * d_x, i, p[b % 8]), blocks in order,
 * and pi_tree8(p) (see internal.h). SIMD and scalar give the same bits. */
#if PI_NEON
/* sum u y over a block of 5-bit quants (qs: 16 nibble bytes, qh: the 32 fifth bits; u unsigned, 0..31) */
static inline int32_t neon_dot_5bit(const uint8_t *qs, const uint8_t *qh_bytes, const int8_t *y) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    int8x16_t lo, hi;
    pi_neon_nibbles(qs, &lo, &hi);
    lo = vorrq_s8(lo, vreinterpretq_s8_u8(pi_neon_bits16(qh)));
    hi = vorrq_s8(hi, vreinterpretq_s8_u8(pi_neon_bits16(qh >> 16)));
    return pi_neon_dot_halves(lo, hi, y);
}
/* sum v y over a block of nibbles (16 bytes) on a grid of 16 int8 values, v = values[q] (IQ4: PI_IQ4_VALUES) */
static inline int32_t neon_dot_grid4(const uint8_t *qs, const int8_t *values, const int8_t *y) {
    int8x16_t lo, hi;
    pi_neon_iq4_values(qs, vld1q_s8(values), &lo, &hi);
    return pi_neon_dot_halves(lo, hi, y);
}
static inline int32_t neon_dot_iq4(const uint8_t *qs, const int8_t *y) { return neon_dot_grid4(qs, PI_IQ4_VALUES, y); }
#endif

float pi_vec_dot_q5_0_q8_0s(int64_t n, const void *w, const void *x) {
    const pi_block_q5_0 *a = w;
    const pi_block_q8_0s *b = x;
    const int64_t nb = n / PI_QK;
    float p[8] = { 0 };
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    /* 8 blocks at a time: lane j = block i + j = partial sum j */
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= nb; i += 8) {
        __m256i v[8];
        for (int j = 0; j < 8; j++)
            v[j] = dot_u8_i8(q5_0_unsigned(&a[i + j]), _mm256_loadu_si256((const __m256i *)b[i + j].qs));
        const __m256i s16 = _mm256_slli_epi32(_mm256_cvtepi16_epi32(pi_i16x8_strided(&b[i].s, sizeof *b)), 4);
        const __m256 d = _mm256_mul_ps(pi_f16x8_strided(&a[i].d, sizeof *a), pi_f16x8_strided(&b[i].d, sizeof *b));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(pi_hsum8_i32(v), s16)), acc);
    }
    _mm256_storeu_ps(p, acc);
#endif
    for (; i < nb; i++) {
        int32_t s;
#if defined(__AVX2__)
        s = pi_hsum_epi32(dot_u8_i8(q5_0_unsigned(&a[i]), _mm256_loadu_si256((const __m256i *)b[i].qs)));
#elif PI_NEON
        s = neon_dot_5bit(a[i].qs, a[i].qh, b[i].qs);
#else
        uint8_t u[PI_QK];
        pi_quants_5bit(a[i].qs, a[i].qh, u);
        s = 0;
        for (int j = 0; j < PI_QK; j++) s += u[j] * b[i].qs[j];
#endif
        p[i % 8] = fmaf(pi_fp16_to_f32(a[i].d) * pi_fp16_to_f32(b[i].d), (float)(s - 16 * b[i].s), p[i % 8]);
    }
    return pi_tree8(p);
}

/* IQ4_NL, MXFP4 . Q8_0S (quants_k.h's grid kinds: Q4_0's layout with the nibbles indexing a grid of 16 int8 values,
 * IQ4_NL's after an fp16 d, MXFP4's after an E8M0 e): Q4_0's canonical order (pi_vec_dot_q4_0_q8_0s), so that the
 * 8-row and interleaved kernels of rows8.c serve all three: per block the exact integer i = sum values[q] y, then
 * acc = fma(d_w * d_x, i, acc), blocks in order, one accumulator. */
#if defined(__AVX2__)
/* The 32 int8 values of a block's 16 nibble bytes (elements 0..15 from the low nibbles, 16..31 the high ones). */
static inline __m256i grid4_values_32(const int8_t *values, const uint8_t *qs) {
    return _mm256_shuffle_epi8(pi_grid16(values), nibbles_32(qs));
}
static inline __m256i iq4_values_32(const uint8_t *qs) { return grid4_values_32(PI_IQ4_VALUES, qs); }
#endif

static inline __attribute__((always_inline)) float grid4_dot(int64_t n, const void *w, const void *x, const int kind) {
    const int64_t bb = pi_nib_block_bytes(kind), off = pi_nib_scale_bytes(kind);
    const int8_t *values = pi_nib_values(kind);
    const uint8_t *a = w;
    const pi_block_q8_0s *b = x;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / PI_QK; i++, a += bb) {
        const uint8_t *qs = a + off;
        int32_t s = 0;
#if defined(__AVX2__)
        s = pi_hsum_epi32(dot_i8(grid4_values_32(values, qs), _mm256_loadu_si256((const __m256i *)b[i].qs)));
#elif PI_NEON
        s = neon_dot_grid4(qs, values, b[i].qs);
#else
        for (int j = 0; j < PI_QK / 2; j++)
            s += values[qs[j] & 15] * b[i].qs[j] + values[qs[j] >> 4] * b[i].qs[j + PI_QK / 2];
#endif
        acc = fmaf(pi_nib_scale(kind, a) * pi_fp16_to_f32(b[i].d), (float)s, acc);
    }
    return acc;
}

float pi_vec_dot_iq4_nl_q8_0s(int64_t n, const void *w, const void *x) { return grid4_dot(n, w, x, PI_NIB_IQ4_NL); }
float pi_vec_dot_mxfp4_q8_0s(int64_t n, const void *w, const void *x) { return grid4_dot(n, w, x, PI_NIB_MXFP4); }

/* Q4_1 / Q5_1 . Q8_1, value = d u + m with u the unsigned quant (Q4_1 0..15, Q5_1 0..31):
 * sum = d d_y sum(u q_y) + m s_y, s_y = d_y sum(q_y) stored in the Q8_1 block. The canonical order every Q4_1 / Q5_1
 * kernel follows (the 8-row kernel of rows8_k.c and the tile kernel of amx_q8_0s.c too): per block the exact integer
 * i = sum u y, then p[b % 8] = fma(d_w * d_y, i, p[b % 8]) and p[b % 8] = fma(m_w, s_y, p[b % 8]), blocks in order,
 * and pi_tree8(p): Q5_0's order plus the min term in the same partial sum, so that a tile product per block (AMX)
 * keeps it. SIMD and scalar give the same bits. */
static inline __attribute__((always_inline)) float q4_1_family_dot(int64_t n, const char *w, const pi_block_q8_1 *b,
                                                                   const int64_t block_bytes, const bool five_bit) {
    const int64_t nb = n / PI_QK;
    float p[8] = { 0 };
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    /* 8 blocks at a time: lane j = block i + j = partial sum j */
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= nb; i += 8) {
        __m256i v[8];
        for (int j = 0; j < 8; j++) {
            const char *blk = w + (i + j) * block_bytes;
            v[j] = dot_u8_i8(five_bit ? q5_1_quants(blk) : q4_1_quants(blk),
                             _mm256_loadu_si256((const __m256i *)b[i + j].qs));
        }
        const char *w8 = w + i * block_bytes;   /* d at byte 0 and m at byte 2 of Q4_1 and Q5_1 blocks */
        const __m256 d = _mm256_mul_ps(pi_f16x8_strided(w8, (size_t)block_bytes), pi_f32x8_strided(&b[i].d, sizeof *b));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(pi_hsum8_i32(v)), acc);
        acc = _mm256_fmadd_ps(pi_f16x8_strided(w8 + 2, (size_t)block_bytes), pi_f32x8_strided(&b[i].s, sizeof *b), acc);
    }
    _mm256_storeu_ps(p, acc);
#endif
    for (; i < nb; i++) {
        const char *blk = w + i * block_bytes;
        const pi_block_q4_1 *dm = (const pi_block_q4_1 *)blk;   /* d, m: the same offsets in Q5_1 */
        int32_t s;
#if defined(__AVX2__)
        s = pi_hsum_epi32(dot_u8_i8(five_bit ? q5_1_quants(blk) : q4_1_quants(blk),
                                    _mm256_loadu_si256((const __m256i *)b[i].qs)));
#elif PI_NEON
        if (five_bit) s = neon_dot_5bit(((const pi_block_q5_1 *)blk)->qs, ((const pi_block_q5_1 *)blk)->qh, b[i].qs);
        else {
            int8x16_t lo, hi;
            pi_neon_nibbles(dm->qs, &lo, &hi);
            s = pi_neon_dot_halves(lo, hi, b[i].qs);
        }
#else
        uint8_t u[PI_QK];
        if (five_bit) pi_quants_5bit(((const pi_block_q5_1 *)blk)->qs, ((const pi_block_q5_1 *)blk)->qh, u);
        else
            for (int j = 0; j < PI_QK / 2; j++) { u[j] = dm->qs[j] & 0x0f; u[j + PI_QK / 2] = dm->qs[j] >> 4; }
        s = 0;
        for (int j = 0; j < PI_QK; j++) s += u[j] * b[i].qs[j];
#endif
        p[i % 8] = fmaf(pi_fp16_to_f32(dm->d) * b[i].d, (float)s, p[i % 8]);
        p[i % 8] = fmaf(pi_fp16_to_f32(dm->m), b[i].s, p[i % 8]);
    }
    return pi_tree8(p);
}

float pi_vec_dot_q4_1_q8_1(int64_t n, const void *w, const void *x) {
    return q4_1_family_dot(n, w, x, sizeof(pi_block_q4_1), false);
}

float pi_vec_dot_q5_1_q8_1(int64_t n, const void *w, const void *x) {
    return q4_1_family_dot(n, w, x, sizeof(pi_block_q5_1), true);
}

/* Q8_1 is an activation type; as a weight (rare) it is dotted with plain scalar code. */
float pi_vec_dot_q8_1_q8_1(int64_t n, const void *w, const void *x) {
    const pi_block_q8_1 *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / PI_QK; i++) {
        int32_t s = 0;
        for (int j = 0; j < PI_QK; j++) s += a[i].qs[j] * b[i].qs[j];
        sum += (float)s * a[i].d * b[i].d;
    }
    return sum;
}

/* ======================================================================================
 * K-quants: integer sums of one super-block, then a shared float combination
 * ====================================================================================== */

/* Q2_K: *sumi = sum_j sc_j sum_l q_l y_l, *summ = sum_j m_j bsum_j  (16 sub-blocks of 16). The AVX2 code
 * (q2_K_lanes) leaves each as 8 int32 lanes whose total is the integer, so that a row's blocks can share the
 * horizontal sums (K_EIGHTS, below); the scalar code (q2_K_ints) computes the integers. The same for every
 * K-quant; the types without mins give summ = 0. */
#if defined(__AVX2__)
static inline __attribute__((always_inline)) void q2_K_lanes(const pi_block_q2_K *x, const pi_block_q8_K *y,
                                                             __m256i *li, __m256i *lm) {
    const __m256i packed = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)x->scales));   /* m << 4 | sc */
    const __m256i sc = _mm256_and_si256(packed, _mm256_set1_epi16(0x0f));
    *lm = scales_bsums_lanes(_mm256_srli_epi16(packed, 4), y);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        for (int g = 0; g < 4; g++) {
            const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), _mm256_set1_epi8(3));
            acc = _mm256_add_epi32(acc, dot_u8_i8_pair(u, y->qs + 128 * h + 32 * g, sc, 8 * h + 2 * g));
        }
    }
    *li = acc;
}
#elif PI_NEON
static inline __attribute__((always_inline)) void q2_K_ints(const pi_block_q2_K *x, const pi_block_q8_K *y, int32_t *sumi, int32_t *summ) {
    int32_t m = 0, sc[16];
    for (int j = 0; j < 16; j++) {
        m += (x->scales[j] >> 4) * y->bsums[j];
        sc[j] = x->scales[j] & 0x0f;
    }
    *summ = m;
    int32x4_t d[16];   /* sub-block 8h + 2g + k: bits 2g of bytes 16k.. of qs[32h..] . y[128h + 32g + 16k ..] */
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 2; k++) {
            const uint8x16_t q = vld1q_u8(x->qs + 32 * h + 16 * k);
            for (int g = 0; g < 4; g++) {
                const int8x16_t u = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * g))), vdupq_n_u8(3)));
                d[8 * h + 2 * g + k] = pi_neon_dot16(u, y->qs + 128 * h + 32 * g + 16 * k);
            }
        }
    *sumi = pi_neon_scaled_sums(d, sc, 16);
}
#else
static inline __attribute__((always_inline)) void q2_K_ints(const pi_block_q2_K *x, const pi_block_q8_K *y, int32_t *sumi, int32_t *summ) {
    int32_t m = 0;
    for (int j = 0; j < 16; j++) m += (x->scales[j] >> 4) * y->bsums[j];
    *summ = m;
    int32_t s = 0;
    for (int e0 = 0; e0 < PI_QK_K; e0 += 16) {
        int32_t t = 0;
        for (int e = e0; e < e0 + 16; e++)
            t += ((x->qs[e / 128 * 32 + e % 32] >> (2 * (e / 32 % 4))) & 3) * y->qs[e];
        s += (x->scales[e0 / 16] & 0x0f) * t;
    }
    *sumi = s;
}
#endif

/* Q3_K: *sumi = sum_j sc_j sum_l (u_l - 4) y_l with u = low 2 bits + 4 * high bit */
#if defined(__AVX2__)
static inline __attribute__((always_inline)) void q3_K_lanes(const pi_block_q3_K *x, const pi_block_q8_K *y,
                                                             __m256i *li, __m256i *lm) {   /* lm: 0, no mins */
    *lm = _mm256_setzero_si256();
    const __m256i sc = _mm256_cvtepi8_epi16(pi_k3_scales16(x->scales));
    const __m256i corr = scales_bsums_lanes(sc, y);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)x->hmask);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        for (int g = 0; g < 4; g++) {
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), _mm256_set1_epi8(3));
            const __m256i u = _mm256_or_si256(lo, pi_bit_to(hm, 4 * h + g, 2));
            acc = _mm256_add_epi32(acc, dot_u8_i8_pair(u, y->qs + 128 * h + 32 * g, sc, 8 * h + 2 * g));
        }
    }
    *li = _mm256_sub_epi32(acc, _mm256_slli_epi32(corr, 2));   /* - 4 corr */
}
#elif PI_NEON
static inline __attribute__((always_inline)) void q3_K_ints(const pi_block_q3_K *x, const pi_block_q8_K *y, int32_t *sumi,
                                                            int32_t *summ) {   /* summ: 0, no mins */
    *summ = 0;
    int32_t sc[16];
    for (int j = 0; j < 16; j++) sc[j] = pi_k3_scale(j, x->scales);
    int32x4_t d[16];   /* as Q2_K's, u = low 2 bits + 4 * bit (4h + g) of hmask, minus 4 */
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 2; k++) {
            const uint8x16_t q = vld1q_u8(x->qs + 32 * h + 16 * k), hm = vld1q_u8(x->hmask + 16 * k);
            for (int g = 0; g < 4; g++) {
                const uint8x16_t lo = vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * g))), vdupq_n_u8(3));
                const uint8x16_t u = vorrq_u8(lo, pi_neon_select_bit(hm, (uint8_t)(1 << (4 * h + g)), 4));
                d[8 * h + 2 * g + k] = pi_neon_dot16(vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(4)),
                                                     y->qs + 128 * h + 32 * g + 16 * k);
            }
        }
    *sumi = pi_neon_scaled_sums(d, sc, 16);
}
#else
static inline __attribute__((always_inline)) void q3_K_ints(const pi_block_q3_K *x, const pi_block_q8_K *y, int32_t *sumi,
                                                            int32_t *summ) {   /* summ: 0, no mins */
    *summ = 0;
    int sc[16];
    for (int j = 0; j < 16; j++) sc[j] = pi_k3_scale(j, x->scales);
    int32_t s = 0;
    for (int e0 = 0; e0 < PI_QK_K; e0 += 16) {
        int32_t t = 0;
        for (int e = e0; e < e0 + 16; e++) {
            const int lo = (x->qs[e / 128 * 32 + e % 32] >> (2 * (e / 32 % 4))) & 3;
            const int hi = (x->hmask[e % 32] >> (e / 32)) & 1;
            t += (lo + 4 * hi - 4) * y->qs[e];
        }
        s += sc[e0 / 16] * t;
    }
    *sumi = s;
}
#endif

/* Q4_K / Q5_K . Q8_KM: 8 sub-blocks of 32 with 6-bit scales and mins; the activation's step multipliers m_j
 * fold into them: sc_j m_j and mn_j m_j (< 2^11, int16 in the SIMD code). Exact integers:
 * sumi = sum_j sc_j m_j sum_l q_l y_l, summ = sum_j mn_j m_j (bsum_2j + bsum_2j+1). */
static inline void k4_scales(const uint8_t *packed, const pi_block_q8_Km *y, int32_t sc[8], int32_t *summ) {
    int32_t m = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t s, mn;
        pi_k4_scale_min(j, packed, &s, &mn);
        sc[j] = s * y->m[j];
        m += mn * y->m[j] * (y->k.bsums[2 * j] + y->k.bsums[2 * j + 1]);
    }
    *summ = m;
}

#if defined(__AVX2__)
/* The 8 scales and 8 mins of a Q4_K/Q5_K super-block (6 bits each, packed in 12 bytes), decoded four at
 * a time as pi_k4_scale_min decodes them one by one: bytes 0..7 = sc_0..7, bytes 8..15 = m_0..7. */
static inline __m128i k4_scales_mins(const uint8_t *packed) {
    uint32_t u[3];
    memcpy(u, packed, 12);   /* q0..3 | q4..7 | q8..11 */
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t sc03 = u[0] & m6, sc47 = (u[2] & m4) | ((u[0] >> 6 & m2) << 4);
    const uint32_t mn03 = u[1] & m6, mn47 = (u[2] >> 4 & m4) | ((u[1] >> 6 & m2) << 4);
    return _mm_set_epi32((int)mn47, (int)mn03, (int)sc47, (int)sc03);
}

/* summ = sum_j mn_j m_j (bsum_2j + bsum_2j+1) = sum_k (mn m)_(k/2) bsum_k: each product twice (as lanes). */
static inline __m256i k4_summ_lanes(__m128i scales_mins, const pi_block_q8_Km *y) {
    const __m128i mult = _mm_loadu_si128((const __m128i *)y->m);   /* m_0..7 as int16 */
    const __m256i mult2 = _mm256_setr_m128i(_mm_unpacklo_epi16(mult, mult), _mm_unpackhi_epi16(mult, mult));
    const __m256i mins2 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scales_mins, scales_mins));
    return scales_bsums_lanes(_mm256_mullo_epi16(mins2, mult2), &y->k);
}

/* sumi = sum_s sc_s m_s (the 32 quants of sub-block s . their activations), exact, as lanes; q[s] holds sub-block
 * s's quants as unsigned bytes (< 64), sc_s are bytes 0..7 of scales_mins, m_s the activation's multipliers. */
static inline __m256i k4_sumi_lanes(const __m256i q[8], __m128i scales_mins, const pi_block_q8_Km *y) {
    const __m128i scm = _mm_mullo_epi16(_mm_cvtepu8_epi16(scales_mins), _mm_loadu_si128((const __m128i *)y->m));
    const __m256i sc16 = _mm256_broadcastsi128_si256(scm);   /* sc_0..7 m_0..7 as int16 */
    __m256i acc = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
        const __m256i sc = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * s)));   /* sc_s m_s */
        const __m256i p = _mm256_maddubs_epi16(q[s], _mm256_loadu_si256((const __m256i *)(y->k.qs + 32 * s)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
    }
    return acc;
}
#endif

#if defined(__AVX2__)
static inline __attribute__((always_inline)) void q4_K_lanes(const pi_block_q4_K *x, const pi_block_q8_Km *y,
                                                             __m256i *li, __m256i *lm) {
    const __m128i sm = k4_scales_mins(x->scales);
    __m256i q[8];   /* qs[32j..32j+31]: low nibbles sub-block 2j, high nibbles 2j+1 */
    for (int j = 0; j < 4; j++) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        q[2 * j] = _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
        q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0f));
    }
    *li = k4_sumi_lanes(q, sm, y);
    *lm = k4_summ_lanes(sm, y);
}
#elif PI_NEON
/* sub-blocks 2j (low nibbles) and 2j + 1 (high) of a Q4_K/Q5_K block, with fifth bits from qh where given */
static inline void neon_k4_sub_blocks(const uint8_t *qs, const uint8_t *qh, const pi_block_q8_Km *y, int32x4_t d[8]) {
    for (int j = 0; j < 4; j++) {
        int32x4_t lo = vdupq_n_s32(0), hi = lo;
        for (int k = 0; k < 2; k++) {
            const uint8x16_t b = vld1q_u8(qs + 32 * j + 16 * k);
            uint8x16_t ql = vandq_u8(b, vdupq_n_u8(0x0f)), qh4 = vshrq_n_u8(b, 4);
            if (qh) {
                const uint8x16_t h = vld1q_u8(qh + 16 * k);
                ql = vorrq_u8(ql, pi_neon_select_bit(h, (uint8_t)(1 << (2 * j)), 16));
                qh4 = vorrq_u8(qh4, pi_neon_select_bit(h, (uint8_t)(1 << (2 * j + 1)), 16));
            }
            lo = pi_neon_sdot(lo, vreinterpretq_s8_u8(ql), vld1q_s8(y->k.qs + 64 * j + 16 * k));
            hi = pi_neon_sdot(hi, vreinterpretq_s8_u8(qh4), vld1q_s8(y->k.qs + 64 * j + 32 + 16 * k));
        }
        d[2 * j] = lo;
        d[2 * j + 1] = hi;
    }
}
static inline __attribute__((always_inline)) void q4_K_ints(const pi_block_q4_K *x, const pi_block_q8_Km *y, int32_t *sumi, int32_t *summ) {
    int32_t sc[8];
    k4_scales(x->scales, y, sc, summ);
    int32x4_t d[8];
    neon_k4_sub_blocks(x->qs, NULL, y, d);
    *sumi = pi_neon_scaled_sums(d, sc, 8);
}
#else
static inline __attribute__((always_inline)) void q4_K_ints(const pi_block_q4_K *x, const pi_block_q8_Km *y, int32_t *sumi, int32_t *summ) {
    int32_t sc[8];
    k4_scales(x->scales, y, sc, summ);
    int32_t s = 0;
    for (int j = 0; j < 4; j++) {
        int32_t s0 = 0, s1 = 0;
        for (int l = 0; l < 32; l++) {
            s0 += (x->qs[32 * j + l] & 0x0f) * y->k.qs[64 * j + l];
            s1 += (x->qs[32 * j + l] >> 4) * y->k.qs[64 * j + 32 + l];
        }
        s += sc[2 * j] * s0 + sc[2 * j + 1] * s1;
    }
    *sumi = s;
}
#endif

#if defined(__AVX2__)
static inline __attribute__((always_inline)) void q5_K_lanes(const pi_block_q5_K *x, const pi_block_q8_Km *y,
                                                             __m256i *li, __m256i *lm) {
    const __m128i sm = k4_scales_mins(x->scales);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
    __m256i q[8];   /* as Q4_K, plus the fifth bit: bit 2j (low nibbles) or 2j+1 (high) of qh[l] */
    for (int j = 0; j < 4; j++) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        q[2 * j] = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi8(0x0f)), pi_bit_to(qh, 2 * j, 4));
        q[2 * j + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0f)),
                                       pi_bit_to(qh, 2 * j + 1, 4));
    }
    *li = k4_sumi_lanes(q, sm, y);
    *lm = k4_summ_lanes(sm, y);
}
#elif PI_NEON
static inline __attribute__((always_inline)) void q5_K_ints(const pi_block_q5_K *x, const pi_block_q8_Km *y, int32_t *sumi, int32_t *summ) {
    int32_t sc[8];
    k4_scales(x->scales, y, sc, summ);
    int32x4_t d[8];
    neon_k4_sub_blocks(x->qs, x->qh, y, d);
    *sumi = pi_neon_scaled_sums(d, sc, 8);
}
#else
static inline __attribute__((always_inline)) void q5_K_ints(const pi_block_q5_K *x, const pi_block_q8_Km *y, int32_t *sumi, int32_t *summ) {
    int32_t sc[8];
    k4_scales(x->scales, y, sc, summ);
    int32_t s = 0;
    for (int j = 0; j < 4; j++) {
        int32_t s0 = 0, s1 = 0;
        for (int l = 0; l < 32; l++) {
            const int q0 = (x->qs[32 * j + l] & 0x0f) | (((x->qh[l] >> (2 * j)) & 1) << 4);
            const int q1 = (x->qs[32 * j + l] >> 4) | (((x->qh[l] >> (2 * j + 1)) & 1) << 4);
            s0 += q0 * y->k.qs[64 * j + l];
            s1 += q1 * y->k.qs[64 * j + 32 + l];
        }
        s += sc[2 * j] * s0 + sc[2 * j + 1] * s1;
    }
    *sumi = s;
}
#endif

/* Q6_K: *sumi = sum_j sc_j sum_l (u_l - 32) y_l,  u = 4 low bits | 2 high bits << 4 */
#if defined(__AVX2__)
static inline __attribute__((always_inline)) void q6_K_lanes(const pi_block_q6_K *x, const pi_block_q8_K *y,
                                                             __m256i *li, __m256i *lm) {   /* lm: 0, no mins */
    *lm = _mm256_setzero_si256();
    /* the 16 signed scales as int16: corr = sum_j sc_j bsum_j, and the per-call pairs (sc_j | sc_j+1) */
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m256i corr = scales_bsums_lanes(sc16, y);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        __m256i u[4];
        u[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), pi_bits_to(qh, 0, 2, 4));
        u[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), pi_bits_to(qh, 2, 2, 4));
        u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), pi_bits_to(qh, 4, 2, 4));
        u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), pi_bits_to(qh, 6, 2, 4));
        for (int k = 0; k < 4; k++)
            acc = _mm256_add_epi32(acc, dot_u8_i8_pair(u[k], y->qs + 128 * h + 32 * k, sc16, 8 * h + 2 * k));
    }
    *li = _mm256_sub_epi32(acc, _mm256_slli_epi32(corr, 5));   /* - 32 corr */
}
#elif PI_NEON
static inline __attribute__((always_inline)) void q6_K_ints(const pi_block_q6_K *x, const pi_block_q8_K *y, int32_t *sumi,
                                                            int32_t *summ) {   /* summ: 0, no mins */
    *summ = 0;
    int32_t sc[16];
    for (int j = 0; j < 16; j++) sc[j] = x->scales[j];
    int32x4_t d[16];   /* sub-block 8h + 2g + k: elements 128h + 32g + 16k .. + 15 */
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 2; k++) {
            uint8x16_t u[4];
            pi_neon_q6_K_values(x->ql, x->qh, h, k, u);
            for (int g = 0; g < 4; g++)
                d[8 * h + 2 * g + k] = pi_neon_dot16(vsubq_s8(vreinterpretq_s8_u8(u[g]), vdupq_n_s8(32)),
                                                     y->qs + 128 * h + 32 * g + 16 * k);
        }
    *sumi = pi_neon_scaled_sums(d, sc, 16);
}
#else
static inline __attribute__((always_inline)) void q6_K_ints(const pi_block_q6_K *x, const pi_block_q8_K *y, int32_t *sumi,
                                                            int32_t *summ) {   /* summ: 0, no mins */
    *summ = 0;
    int32_t s = 0;
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        const int8_t *yq = y->qs + 128 * h;
        int32_t t[8] = { 0 };   /* sub-blocks 8h + 0..7 */
        for (int l = 0; l < 32; l++) {
            t[l / 16 + 0] += (((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32) * yq[l];
            t[l / 16 + 2] += (((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32) * yq[l + 32];
            t[l / 16 + 4] += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * yq[l + 64];
            t[l / 16 + 6] += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * yq[l + 96];
        }
        for (int j = 0; j < 8; j++) s += x->scales[8 * h + j] * t[j];
    }
    *sumi = s;
}
#endif

/* IQ4_XS: *sumi = sum_j (ls_j - 32) sum_l PI_IQ4_VALUES[q_l] y_l (|sumi| <= 8 * 32 * 32 * 127 * 127: int32) */
#if defined(__AVX2__)
static inline __attribute__((always_inline)) void iq4_xs_lanes(const pi_block_iq4_xs *x, const pi_block_q8_K *y,
                                                               __m256i *li, __m256i *lm) {   /* lm: 0, no mins */
    *lm = _mm256_setzero_si256();
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < PI_QK_K / PI_QK; j++) {
        const __m256i p = dot_i8(iq4_values_32(x->qs + 16 * j), _mm256_loadu_si256((const __m256i *)(y->qs + 32 * j)));
        acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p, _mm256_set1_epi32(pi_iq4_xs_scale(x, j))));
    }
    *li = acc;
}
#elif PI_NEON
static inline __attribute__((always_inline)) void iq4_xs_ints(const pi_block_iq4_xs *x, const pi_block_q8_K *y,
                                                              int32_t *sumi, int32_t *summ) {   /* summ: 0, no mins */
    *summ = 0;
    int32_t s = 0;
    for (int j = 0; j < PI_QK_K / PI_QK; j++) s += pi_iq4_xs_scale(x, j) * neon_dot_iq4(x->qs + 16 * j, y->qs + 32 * j);
    *sumi = s;
}
#else
static inline __attribute__((always_inline)) void iq4_xs_ints(const pi_block_iq4_xs *x, const pi_block_q8_K *y,
                                                              int32_t *sumi, int32_t *summ) {   /* summ: 0, no mins */
    *summ = 0;
    int32_t s = 0;
    for (int j = 0; j < PI_QK_K / PI_QK; j++) {
        const uint8_t *qs = x->qs + 16 * j;
        const int8_t *yq = y->qs + 32 * j;
        int32_t t = 0;
        for (int l = 0; l < 16; l++)
            t += PI_IQ4_VALUES[qs[l] & 15] * yq[l] + PI_IQ4_VALUES[qs[l] >> 4] * yq[l + 16];
        s += pi_iq4_xs_scale(x, j) * t;
    }
    *sumi = s;
}
#endif

/* IQ3_XXS, IQ3_S: *sumi = sum_j ls_j sum_l grid_l sign_l y_l (grid values <= 62, ls_j <= 31: |sumi| <= 8 * 31 * 32
 * * 62 * 127: int32); IQ3_XXS's 1/4 is its row dot's d multiplier.
 * IQ2_XXS, IQ2_XS, IQ2_S: *sumi = sum over halves h of 16 elements ls_h sum_l grid_l sign_l y_l (grid values <= 43,
 * ls <= 31: |sumi| <= 16 * 31 * 16 * 43 * 127: int32); d's factor is 1/8 ((0.5 + s) / 4 = ls / 8). */
#if defined(__AVX2__)
/* A sub-block of 32 elements decoded (X_vec): its grid values g (32 unsigned bytes), the signs as +-1 bytes, and ls as
 * int16 lanes (lanes 0..7: elements 0..15, 8..15: the rest; one ls for both in the IQ3 types and IQ2_XXS). The 7-bit
 * sign indices of IQ3_XXS / IQ2_XXS / IQ2_XS take PI_IQ_SIGNS64's patterns (one load per 8 elements) rather than
 * their parity bits (542M IQ2_XS decode 20.1 -> 24.5 t/s). */
typedef struct { __m256i g, signs, ls; } iq_vec;
static inline __m256i iq_ls(int ls0, int ls1) {
    return _mm256_setr_m128i(_mm_set1_epi16((short)ls0), _mm_set1_epi16((short)ls1));
}
static inline __m256i iq_signs64(uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {   /* four 7-bit sign indices */
    return _mm256_setr_epi64x((int64_t)PI_IQ_SIGNS64[i0], (int64_t)PI_IQ_SIGNS64[i1], (int64_t)PI_IQ_SIGNS64[i2],
                              (int64_t)PI_IQ_SIGNS64[i3]);
}

/* The 8 grid points idx (8 x int32) as 32 unsigned bytes: the indices stored and the points loaded one by one, not
 * by vpgatherdd, which measured as fast on the Zen 3 (a 542M IQ3_S prompt 0.97x the time, decode 0.99x; llama.cpp's
 * AVX2 code found the loads faster on a Zen 4) and which qemu 7.2's x86-64 emulation gets wrong here (the one-token
 * dot under -cpu Haswell, tests/test_cross_arch.py). */
static inline __attribute__((always_inline)) __m256i iq3_grid_points(const uint32_t *grid, __m256i idx) {
    uint32_t i[8];
    _mm256_storeu_si256((__m256i *)i, idx);
    return _mm256_setr_epi32((int)grid[i[0]], (int)grid[i[1]], (int)grid[i[2]], (int)grid[i[3]], (int)grid[i[4]],
                             (int)grid[i[5]], (int)grid[i[6]], (int)grid[i[7]]);
}
static inline __attribute__((always_inline)) iq_vec iq3_xxs_vec(const pi_block_iq3_xxs *x, int j) {
    uint32_t aux;
    memcpy(&aux, x->qs + PI_QK_K / 4 + 4 * j, 4);
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * j)));
    const int ls = 2 * (int)(aux >> 28) + 1;
    return (iq_vec){ iq3_grid_points(PI_IQ3_XXS_GRID, idx),
                     iq_signs64(aux & 127, aux >> 7 & 127, aux >> 14 & 127, aux >> 21 & 127), iq_ls(ls, ls) };
}
static inline __attribute__((always_inline)) iq_vec iq3_s_vec(const pi_block_iq3_s *x, int j) {
    uint32_t signs;
    memcpy(&signs, x->signs + 4 * j, 4);
    const int ls = pi_iq3_s_ls(x, j);
    /* indices computed here, not as a vector stored and read back one by one: 0.80-0.92x the time (paired A/B,
     * 542M IQ3_S up + down matmuls, one thread) */
    const uint32_t *G = PI_IQ3_S_GRID, h = x->qh[j];
    const uint8_t *q = x->qs + 8 * j;
#define IQ3_S_POINT(i) (int)G[q[i] | (h << (8 - (i)) & 256)]
    return (iq_vec){ _mm256_setr_epi32(IQ3_S_POINT(0), IQ3_S_POINT(1), IQ3_S_POINT(2), IQ3_S_POINT(3), IQ3_S_POINT(4),
                                       IQ3_S_POINT(5), IQ3_S_POINT(6), IQ3_S_POINT(7)),
                     bits_to_signs(signs), iq_ls(ls, ls) };
#undef IQ3_S_POINT
}
static inline __attribute__((always_inline)) iq_vec iq2_xxs_vec(const pi_block_iq2_xxs *x, int j) {
    uint32_t aux[2];
    memcpy(aux, x->qs + 4 * j, 8);
    const uint64_t *G = PI_IQ2_XXS_GRID;
    const int ls = 2 * (int)(aux[1] >> 28) + 1;
    return (iq_vec){ _mm256_setr_epi64x((int64_t)G[aux[0] & 255], (int64_t)G[aux[0] >> 8 & 255],
                                        (int64_t)G[aux[0] >> 16 & 255], (int64_t)G[aux[0] >> 24]),
                     iq_signs64(aux[1] & 127, aux[1] >> 7 & 127, aux[1] >> 14 & 127, aux[1] >> 21 & 127),
                     iq_ls(ls, ls) };
}
static inline __attribute__((always_inline)) iq_vec iq2_xs_vec(const pi_block_iq2_xs *x, int j) {
    const uint16_t *q = x->qs + 4 * j;
    const uint64_t *G = PI_IQ2_XS_GRID;
    return (iq_vec){ _mm256_setr_epi64x((int64_t)G[q[0] & 511], (int64_t)G[q[1] & 511], (int64_t)G[q[2] & 511],
                                        (int64_t)G[q[3] & 511]),
                     iq_signs64(q[0] >> 9, q[1] >> 9, q[2] >> 9, q[3] >> 9),
                     iq_ls(2 * (x->scales[j] & 15) + 1, 2 * (x->scales[j] >> 4) + 1) };
}
static inline __attribute__((always_inline)) iq_vec iq2_s_vec(const pi_block_iq2_s *x, int j) {
    const uint64_t *G = PI_IQ2_S_GRID;
    const uint8_t *q = x->qs + 4 * j;
    const uint32_t h = x->qh[j];   /* 2 high index bits per point */
    uint32_t signs;
    memcpy(&signs, x->signs + 4 * j, 4);
    return (iq_vec){ _mm256_setr_epi64x((int64_t)G[q[0] | (h << 8 & 0x300)], (int64_t)G[q[1] | (h << 6 & 0x300)],
                                        (int64_t)G[q[2] | (h << 4 & 0x300)], (int64_t)G[q[3] | (h << 2 & 0x300)]),
                     bits_to_signs(signs), iq_ls(2 * (x->scales[j] & 15) + 1, 2 * (x->scales[j] >> 4) + 1) };
}
/* IQ1: the values v = 8 g + delta (odd, |v| <= 9) of a sub-block's 4 points (11-bit indices) and their deltas' signs
 * (delta: per 8-byte lane all -1 or all +1 bytes); |v| becomes the iq_vec's g and v itself its signs (never 0). */
static inline __attribute__((always_inline)) __m256i iq1_values(uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3,
                                                                __m256i delta) {
    const uint64_t *G = PI_IQ1_GRID;
    const __m256i g = _mm256_setr_epi64x((int64_t)G[i0], (int64_t)G[i1], (int64_t)G[i2], (int64_t)G[i3]);
    /* 8 g bytewise: a 16-bit shift by 3 whose carries into the next byte (from -1's 0xff) the mask drops */
    return _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16(g, 3), _mm256_set1_epi8((char)0xf8)), delta);
}
#define IQ1_DELTA8(negative) ((negative) ? -1ll : 0x0101010101010101ll)
static inline __attribute__((always_inline)) iq_vec iq1_s_vec(const pi_block_iq1_s *x, int j) {
    const uint32_t h = x->qh[j];
    const uint8_t *q = x->qs + 4 * j;
    const __m256i v = iq1_values(q[0] | (h << 8 & 0x700), q[1] | (h << 5 & 0x700), q[2] | (h << 2 & 0x700),
                                 q[3] | (h >> 1 & 0x700), _mm256_set1_epi64x(IQ1_DELTA8(h & 0x8000)));
    const int ls = 2 * (int)(h >> 12 & 7) + 1;
    return (iq_vec){ _mm256_abs_epi8(v), v, iq_ls(ls, ls) };
}
/* IQ1_M sub-block j's values v (its 4 deltas from one compare) */
static inline __attribute__((always_inline)) __m256i iq1_m_values(const pi_block_iq1_m *x, int j) {
    uint16_t h;   /* qh[2 j] | qh[2 j + 1] << 8: the deltas' signs in bits 3, 7, 11, 15 */
    memcpy(&h, x->qh + 2 * j, 2);
    const uint8_t *q = x->qs + 4 * j;
    const __m256i bit = _mm256_setr_epi64x(1 << 3, 1 << 7, 1 << 11, 1 << 15);
    const __m256i neg = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(h), bit), bit);
    return iq1_values(q[0] | (h << 8 & 0x700), q[1] | (h << 4 & 0x700), q[2] | (h & 0x700), q[3] | (h >> 4 & 0x700),
                      _mm256_or_si256(neg, _mm256_set1_epi8(1)));
}
static inline __attribute__((always_inline)) iq_vec iq1_m_vec(const pi_block_iq1_m *x, int j) {
    const __m256i v = iq1_m_values(x, j);
    const uint32_t s = (uint32_t)pi_iq1_m_scales(x, j / 2) >> 6 * (j % 2);
    return (iq_vec){ _mm256_abs_epi8(v), v, iq_ls(2 * (int)(s & 7) + 1, 2 * (int)(s >> 3 & 7) + 1) };
}
#undef IQ1_DELTA8
/* The IQ lanes' 8 sub-blocks unrolled (GCC keeps the loop otherwise): on a Zen 3 the IQ1 dots took 0.77-0.81x the
 * time (paired A/B, the 542M files' up + down matmuls, one thread, CPU time), the sub-blocks' scalar index work and
 * their vector work overlapping across iterations. */
#ifdef IQ_KEEP_LOOPS
#define IQ_UNROLL_SUBBLOCKS
#else
#define IQ_UNROLL_SUBBLOCKS _Pragma("GCC unroll 8")
#endif
/* IQ2_XS, IQ2_S: byte j of scales holds the s of sub-block j's halves (low nibble: elements 0..15). Their 16 ls as
 * int16 once per block, the first halves' in the low 128 bits and the second halves' in the high ones, so that one
 * in-lane byte shuffle (iq_ls_of) makes sub-block j's iq_ls vector; the *_vec's own ls, made by scalar code per
 * sub-block, then goes unused. Paired A/B on the 542M files (one thread, CPU time, the up + down matmuls): IQ2_XS
 * 0.76x the time, IQ2_S 0.87x. The same for the types with one s per sub-block measured IQ3_S 0.99x and IQ2_XXS
 * 1.09x (its words are strided): they keep the *_vec's ls. */
static inline __m256i iq_ls_of(__m256i ls, int j) {
    return _mm256_shuffle_epi8(ls, _mm256_set1_epi16((short)(2 * j | (2 * j + 1) << 8)));
}
static inline __m256i iq2_scales_ls(const uint8_t scales[8]) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)scales), m4 = _mm_set1_epi8(0x0f);
    const __m128i s = _mm_unpacklo_epi64(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    return _mm256_cvtepu8_epi16(_mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1)));
}
/* The lanes of a super-block: per sub-block the signed activations against g, int16 pairs (grid <= 62: 2 * 62 * 127
 * fits) times ls into int32 lanes. block_ls: made once per block (ls), ls_j: sub-block j's iq_ls vector (v.ls, or
 * from ls). */
#define IQ_LANES(name, wtype, block_ls, ls_j)                                                                       \
    static inline __attribute__((always_inline)) void name##_lanes(const wtype *x, const pi_block_q8_K *y,          \
                                                                   __m256i *li, __m256i *lm) {                      \
        *lm = _mm256_setzero_si256();   /* no mins */                                                               \
        const __m256i ls = block_ls;                                                                                \
        (void)ls;                                                                                                   \
        __m256i acc = _mm256_setzero_si256();                                                                       \
        IQ_UNROLL_SUBBLOCKS                                                                                         \
        for (int j = 0; j < PI_QK_K / PI_QK; j++) {                                                                 \
            const iq_vec v = name##_vec(x, j);                                                                      \
            const __m256i yq = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(y->qs + 32 * j)), v.signs);    \
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(v.g, yq), ls_j));                    \
        }                                                                                                           \
        *li = acc;                                                                                                  \
    }
IQ_LANES(iq3_xxs, pi_block_iq3_xxs, _mm256_setzero_si256(), v.ls)
IQ_LANES(iq3_s, pi_block_iq3_s, _mm256_setzero_si256(), v.ls)
IQ_LANES(iq2_xxs, pi_block_iq2_xxs, _mm256_setzero_si256(), v.ls)
IQ_LANES(iq2_xs, pi_block_iq2_xs, iq2_scales_ls(x->scales), iq_ls_of(ls, j))
IQ_LANES(iq2_s, pi_block_iq2_s, iq2_scales_ls(x->scales), iq_ls_of(ls, j))
/* IQ1_S's lanes take each sub-block's ls and delta sign by one in-lane byte shuffle each from two vectors made once
 * per block from its 8 qh words (ls: bits 12..14, the sign: bit 15), not by scalar code per sub-block. IQ_LANES'
 * arithmetic. */
static inline __attribute__((always_inline)) void iq1_s_lanes(const pi_block_iq1_s *x, const pi_block_q8_K *y,
                                                              __m256i *li, __m256i *lm) {
    *lm = _mm256_setzero_si256();
    const __m128i qh = _mm_loadu_si128((const __m128i *)x->qh);
    const __m256i ls = _mm256_broadcastsi128_si256(_mm_add_epi16(
        _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), 1), _mm_set1_epi16(1)));
    const __m256i neg = _mm256_broadcastsi128_si256(_mm_srai_epi16(qh, 15));   /* 0 or -1 per word */
    __m256i acc = _mm256_setzero_si256();
    IQ_UNROLL_SUBBLOCKS
    for (int j = 0; j < PI_QK_K / PI_QK; j++) {
        const uint32_t h = x->qh[j];
        const uint8_t *q = x->qs + 4 * j;
        const __m256i v = iq1_values(q[0] | (h << 8 & 0x700), q[1] | (h << 5 & 0x700), q[2] | (h << 2 & 0x700),
                                     q[3] | (h >> 1 & 0x700),
                                     _mm256_or_si256(iq_ls_of(neg, j), _mm256_set1_epi8(1)));   /* word j's sign */
        const __m256i yq = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(y->qs + 32 * j)), v);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), yq),
                                                      iq_ls_of(ls, j)));
    }
    *li = acc;
}
/* IQ1_M's 16 ls of a block in one vector (llama.cpp's AVX2 trick): the four scale words shifted by 0, 6 (64-bit lanes
 * 0, 1: the first halves of even / odd sub-blocks) and 3, 9 (lanes 2, 3: their second halves), so that one in-lane
 * byte shuffle (iq1_m_ls_of) puts sub-block j's two ls in the halves of its iq_ls vector. */
static inline __m256i iq1_m_block_ls(const pi_block_iq1_m *x) {
    uint64_t words;
    memcpy(&words, x->scales, 8);
    const __m256i f = _mm256_srlv_epi64(_mm256_set1_epi64x((int64_t)words), _mm256_setr_epi64x(0, 6, 3, 9));
    return _mm256_add_epi16(_mm256_slli_epi16(_mm256_and_si256(f, _mm256_set1_epi16(7)), 1), _mm256_set1_epi16(1));
}
static inline __m256i iq1_m_ls_of(__m256i ls, int j) {
    const int at = (j % 2) * 8 + (j / 2) * 2;   /* the byte of sub-block j's ls in each 128-bit half */
    return _mm256_shuffle_epi8(ls, _mm256_set1_epi16((short)(at | (at + 1) << 8)));
}
IQ_LANES(iq1_m, pi_block_iq1_m, iq1_m_block_ls(x), iq1_m_ls_of(ls, j))
#elif PI_NEON
/* A sub-block's integers with SDOT: its 32 grid values laid out as bytes (pi_neon_signed_dot32); the scalar level's
 * loops below give the same sums. */
static inline int32_t iq3_sub_block(const uint32_t *grid, const int *idx, uint32_t signs, const int8_t *yq) {
    uint32_t g[8];   /* grid values are 0..62: as int8 the same */
    for (int i = 0; i < 8; i++) g[i] = grid[idx[i]];
    int32_t t[2];
    pi_neon_signed_dot32((const int8_t *)g, signs, yq, t);
    return t[0] + t[1];
}
static inline void iq2_sub_halves(const pi_iq2_sub *sb, const int8_t *yq, int32_t t[2]) {
    pi_neon_signed_dot32((const int8_t *)sb->points, sb->signs, yq, t);   /* grid values 0..43 */
}
static inline void iq1_sub_halves(const pi_iq1_sub *sb, const int8_t *yq, int32_t t[2]) {
    int8_t v[32];   /* 8 g + delta, |v| <= 9 */
    for (int p = 0; p < 4; p++)
        vst1_s8(v + 8 * p, vadd_s8(vshl_n_s8(vcreate_s8(PI_IQ1_GRID[sb->idx[p]]), 3), vdup_n_s8((int8_t)sb->delta[p])));
    pi_neon_signed_dot32(v, 0, yq, t);
}
#else
/* sum_k grid value k * sign k * yq[k] over a sub-block's 32 elements (idx: its 8 grid points) */
static inline int32_t iq3_sub_block(const uint32_t *grid, const int *idx, uint32_t signs, const int8_t *yq) {
    int32_t t = 0;
    for (int k = 0; k < PI_QK; k++) {
        const int32_t g = (int32_t)(grid[idx[k / 4]] >> 8 * (k % 4) & 255);
        t += (signs >> k & 1 ? -g : g) * yq[k];
    }
    return t;
}
/* an IQ2 sub-block's sums of grid value * sign * yq over elements 0..15 and 16..31 */
static inline void iq2_sub_halves(const pi_iq2_sub *sb, const int8_t *yq, int32_t t[2]) {
    for (int h = 0; h < 2; h++) {
        t[h] = 0;
        for (int k = 16 * h; k < 16 * h + 16; k++) {
            const int32_t g = (int32_t)(sb->points[k / 8] >> 8 * (k % 8) & 255);
            t[h] += (sb->signs >> k & 1 ? -g : g) * yq[k];
        }
    }
}
/* an IQ1 sub-block's sums of v * yq over elements 0..15 and 16..31 */
static inline void iq1_sub_halves(const pi_iq1_sub *sb, const int8_t *yq, int32_t t[2]) {
    for (int h = 0; h < 2; h++) {
        t[h] = 0;
        for (int k = 16 * h; k < 16 * h + 16; k++) t[h] += pi_iq1_value(PI_IQ1_GRID, sb, k) * yq[k];
    }
}
#endif

#if !defined(__AVX2__)   /* scalar and neon: the integers of one super-block, sub-block by sub-block */
static inline __attribute__((always_inline)) void iq3_xxs_ints(const pi_block_iq3_xxs *x, const pi_block_q8_K *y,
                                                               int32_t *sumi, int32_t *summ) {   /* summ: 0, no mins */
    *summ = 0;
    int32_t s = 0;
    for (int j = 0; j < PI_QK_K / PI_QK; j++) {
        int ls, idx[8];
        const uint32_t signs = pi_iq3_xxs_signs(x, j, &ls);
        for (int i = 0; i < 8; i++) idx[i] = x->qs[8 * j + i];
        s += ls * iq3_sub_block(PI_IQ3_XXS_GRID, idx, signs, y->qs + 32 * j);
    }
    *sumi = s;
}

static inline __attribute__((always_inline)) void iq3_s_ints(const pi_block_iq3_s *x, const pi_block_q8_K *y,
                                                             int32_t *sumi, int32_t *summ) {   /* summ: 0, no mins */
    *summ = 0;
    int32_t s = 0;
    for (int j = 0; j < PI_QK_K / PI_QK; j++) {
        int idx[8];
        uint32_t signs;
        memcpy(&signs, x->signs + 4 * j, 4);
        for (int i = 0; i < 8; i++) idx[i] = pi_iq3_s_index(x, 8 * j + i);
        s += pi_iq3_s_ls(x, j) * iq3_sub_block(PI_IQ3_S_GRID, idx, signs, y->qs + 32 * j);
    }
    *sumi = s;
}

#define IQ2_INTS(name, wtype, grid)                                                                                 \
    static inline __attribute__((always_inline)) void name##_ints(const wtype *x, const pi_block_q8_K *y,           \
                                                                  int32_t *sumi, int32_t *summ) {                   \
        *summ = 0;                                                                                                  \
        int32_t s = 0;                                                                                              \
        for (int j = 0; j < PI_QK_K / PI_QK; j++) {                                                                 \
            pi_iq2_sub sb;                                                                                          \
            pi_##name##_sub(x, j, grid, &sb);                                                                       \
            int32_t t[2];                                                                                           \
            iq2_sub_halves(&sb, y->qs + 32 * j, t);                                                                 \
            s += (2 * sb.s[0] + 1) * t[0] + (2 * sb.s[1] + 1) * t[1];                                               \
        }                                                                                                           \
        *sumi = s;                                                                                                  \
    }
IQ2_INTS(iq2_xxs, pi_block_iq2_xxs, PI_IQ2_XXS_GRID)
IQ2_INTS(iq2_xs, pi_block_iq2_xs, PI_IQ2_XS_GRID)
IQ2_INTS(iq2_s, pi_block_iq2_s, PI_IQ2_S_GRID)

/* IQ1_S, IQ1_M: *sumi = sum over halves h of 16 elements ls_h sum_l v_l y_l (|v| <= 9, ls <= 15); d's factor 1/8 */
#define IQ1_INTS(name, wtype)                                                                                       \
    static inline __attribute__((always_inline)) void name##_ints(const wtype *x, const pi_block_q8_K *y,           \
                                                                  int32_t *sumi, int32_t *summ) {                   \
        *summ = 0;                                                                                                  \
        int32_t s = 0;                                                                                              \
        for (int j = 0; j < PI_QK_K / PI_QK; j++) {                                                                 \
            pi_iq1_sub sb;                                                                                          \
            pi_##name##_sub(x, j, &sb);                                                                             \
            int32_t t[2];                                                                                           \
            iq1_sub_halves(&sb, y->qs + 32 * j, t);                                                                 \
            s += sb.ls[0] * t[0] + sb.ls[1] * t[1];                                                                 \
        }                                                                                                           \
        *sumi = s;                                                                                                  \
    }
IQ1_INTS(iq1_s, pi_block_iq1_s)
IQ1_INTS(iq1_m, pi_block_iq1_m)
#endif

/* IQ3 rows -> Q6_K rows for prompts (pi_to_batch_fn; mul_mat's batch path, ops.c). Sub-block j's 32 values
 * v = grid value * sign become Q6_K's quants v + 32 and ls_j both of its scales, d stays: Q6_K's dot then sums the
 * same integers, sum_j ls_j sum v y, and takes the same float steps, (bd d) sumi per super-block in order, so its
 * kernels give the IQ3 dot's bits. IQ3_XXS's values reach 62, beyond Q6_K's 31, but are all even: v / 2 with d / 2,
 * whose integer sum is half of IQ3_XXS's and d / 2 for d / 4 (a power of two either way: the same bits), refused
 * (false) for a row whose d / 2 is not exact in fp16 (|d| < 2^-13 with an odd last bit, or not finite). */
static inline bool iq3_half_d(uint16_t d, uint16_t *half) {
    const float h = pi_fp16_to_f32(d) * 0.5f;
    *half = pi_f32_to_fp16(h);
    return pi_fp16_to_f32(*half) == h;   /* NaN: false */
}

#if defined(__AVX2__)
/* Q6_K's half h of a super-block from its four sub-blocks of quants u (0..63): q[m] = elements 128 h + 32 m .. */
static inline void q6_K_pack_half(const __m256i q[4], pi_block_q6_K *y, int h) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    __m256i hi[4];
    for (int m = 0; m < 4; m++) hi[m] = _mm256_and_si256(_mm256_srli_epi16(q[m], 4), m2);
    _mm256_storeu_si256((__m256i *)(y->ql + 64 * h),
                        _mm256_or_si256(_mm256_and_si256(q[0], m4), _mm256_slli_epi16(_mm256_and_si256(q[2], m4), 4)));
    _mm256_storeu_si256((__m256i *)(y->ql + 64 * h + 32),
                        _mm256_or_si256(_mm256_and_si256(q[1], m4), _mm256_slli_epi16(_mm256_and_si256(q[3], m4), 4)));
    _mm256_storeu_si256((__m256i *)(y->qh + 32 * h),
                        _mm256_or_si256(_mm256_or_si256(hi[0], _mm256_slli_epi16(hi[1], 2)),
                                        _mm256_or_si256(_mm256_slli_epi16(hi[2], 4), _mm256_slli_epi16(hi[3], 6))));
}

/* sub-block j's quants v + 32 (0..63) and its ls (IQ3_XXS: the grid values halved) */
static inline __m256i iq3_xxs_quants(const pi_block_iq3_xxs *x, int j, int *ls) {
    const iq_vec v = iq3_xxs_vec(x, j);
    *ls = _mm256_extract_epi16(v.ls, 0);
    const __m256i half = _mm256_and_si256(_mm256_srli_epi16(v.g, 1), _mm256_set1_epi8(0x7f));
    return _mm256_add_epi8(_mm256_sign_epi8(half, v.signs), _mm256_set1_epi8(32));
}

static inline __m256i iq3_s_quants(const pi_block_iq3_s *x, int j, int *ls) {
    const iq_vec v = iq3_s_vec(x, j);
    *ls = _mm256_extract_epi16(v.ls, 0);
    return _mm256_add_epi8(_mm256_sign_epi8(v.g, v.signs), _mm256_set1_epi8(32));
}

/* half h (sub-blocks 4 h .. 4 h + 3) of IQ3 super-block x as Q6_K's */
#define IQ3_HALF_TO_Q6_K(name, x, h, y)                                                                             \
    do {                                                                                                            \
        __m256i q[4];                                                                                               \
        for (int m = 0; m < 4; m++) {                                                                               \
            int ls;                                                                                                 \
            q[m] = name##_quants(x, 4 * (h) + m, &ls);                                                              \
            (y)->scales[8 * (h) + 2 * m] = (y)->scales[8 * (h) + 2 * m + 1] = (int8_t)ls;                           \
        }                                                                                                           \
        q6_K_pack_half(q, y, h);                                                                                    \
    } while (0)
#else
/* sub-block j's quants v + 32 (0..63) */
static inline void iq3_xxs_quants(const pi_block_iq3_xxs *x, int j, int *ls, uint8_t u[PI_QK]) {
    const uint32_t signs = pi_iq3_xxs_signs(x, j, ls);
    for (int e = 0; e < PI_QK; e++) {
        const int g = (int)(PI_IQ3_XXS_GRID[x->qs[8 * j + e / 4]] >> 8 * (e % 4) & 255) / 2;
        u[e] = (uint8_t)((signs >> e & 1 ? -g : g) + 32);
    }
}

static inline void iq3_s_quants(const pi_block_iq3_s *x, int j, int *ls, uint8_t u[PI_QK]) {
    *ls = pi_iq3_s_ls(x, j);
    for (int e = 0; e < PI_QK; e++) {
        const int g = (int)(PI_IQ3_S_GRID[pi_iq3_s_index(x, 8 * j + e / 4)] >> 8 * (e % 4) & 255);
        u[e] = (uint8_t)((x->signs[4 * j + e / 8] >> e % 8 & 1 ? -g : g) + 32);
    }
}

#define IQ3_HALF_TO_Q6_K(name, x, h, y)                                                                             \
    do {                                                                                                            \
        uint8_t u[PI_QK_K / 2];                                                                                     \
        for (int m = 0; m < 4; m++) {                                                                               \
            int ls;                                                                                                 \
            name##_quants(x, 4 * (h) + m, &ls, u + PI_QK * m);                                                      \
            (y)->scales[8 * (h) + 2 * m] = (y)->scales[8 * (h) + 2 * m + 1] = (int8_t)ls;                           \
        }                                                                                                           \
        for (int l = 0; l < 32; l++) {   /* Q6_K's layout (pi_q6_K_to_f32): element 128 h + 32 m + l */             \
            const uint8_t *q = u + l;                                                                               \
            (y)->ql[64 * (h) + l] = (uint8_t)((q[0] & 15) | (q[64] & 15) << 4);                                     \
            (y)->ql[64 * (h) + l + 32] = (uint8_t)((q[32] & 15) | (q[96] & 15) << 4);                               \
            (y)->qh[32 * (h) + l] = (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6); \
        }                                                                                                           \
    } while (0)
#endif
#define IQ3_TO_Q6_K(name, wtype, xxs)                                                                               \
    static bool pi_##name##_to_q6_K(int64_t k, const void *w, int64_t stride, int n, void *dst) {                  \
        pi_block_q6_K *y = dst;                                                                                     \
        for (int r = 0; r < n; r++) {                                                                               \
            const wtype *x = (const wtype *)((const char *)w + r * stride);                                         \
            for (int64_t b = 0; b < k / PI_QK_K; b++, y++) {                                                        \
                if (xxs ? !iq3_half_d(x[b].d, &y->d) : (y->d = x[b].d, false)) return false;                        \
                for (int h = 0; h < 2; h++) IQ3_HALF_TO_Q6_K(name, &x[b], h, y);                                    \
            }                                                                                                       \
        }                                                                                                           \
        return true;                                                                                                \
    }
IQ3_TO_Q6_K(iq3_xxs, pi_block_iq3_xxs, true)
IQ3_TO_Q6_K(iq3_s, pi_block_iq3_s, false)

#if defined(__AVX2__)
/* Q3_K rows -> Q6_K rows for prompts (the avx512 level, from 32 tokens: then on to Q6_KX16 groups). Element e's
 * u - 4 (low 2 bits + 4 * hmask bit, u - 4 in -4..3) becomes Q6_K's quant u + 28 (28..35, minus 32 the same value),
 * sub-block j's 6-bit scale sc_j (-32..31) Q6_K's int8 scale j, d stays: Q6_K's dot sums the same integers, sum_j sc_j
 * sum (u - 4) y, and takes the same float step, (bd d) sumi, so its kernels give Q3_K's bits. */
static bool pi_q3_K_to_q6_K(int64_t k, const void *w, int64_t stride, int n, void *dst) {
    pi_block_q6_K *y = dst;
    for (int r = 0; r < n; r++) {
        const pi_block_q3_K *x = (const pi_block_q3_K *)((const char *)w + r * stride);
        for (int64_t b = 0; b < k / PI_QK_K; b++, y++) {
            const __m256i hm = _mm256_loadu_si256((const __m256i *)x[b].hmask);
            for (int h = 0; h < 2; h++) {   /* elements 128 h + 32 m + l: qs[32 h + l] bits 2m, 2m + 1; hmask bit 4h + m */
                const __m256i q2 = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
                __m256i q[4];
                for (int m = 0; m < 4; m++)
                    q[m] = _mm256_add_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q2, 2 * m), _mm256_set1_epi8(3)),
                                                           pi_bit_to(hm, 4 * h + m, 2)),
                                           _mm256_set1_epi8(28));
                q6_K_pack_half(q, y, h);
            }
            _mm_storeu_si128((__m128i *)y->scales, pi_k3_scales16(x[b].scales));
            y->d = x[b].d;
        }
    }
    return true;
}
#endif

/* Q8_KW . Q8_K (IQ2 rows converted for prompts): per super-block sumi = sum_j sc_j sum_l (u_l - 64) y_l, computed
 * as sum_j sc_j sum_l u_l y_l - 64 sum_j sc_j bsum_j (u <= 107: a maddubs pair fits int16), then sum += (bd d) sumi
 * in order: the integers and float steps of the IQ2 dot it came from. */
float pi_vec_dot_q8_kw_q8_K(int64_t n, const void *w, const void *x) {
    const pi_block_q8_kw *a = w;
    const pi_block_q8_K *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        int32_t off = 0;
        for (int j = 0; j < PI_QK_K / 16; j++) off += a[i].scales[j] * b[i].bsums[j];
#if defined(__AVX2__)
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < PI_QK_K / PI_QK; j++) {
            const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(a[i].u + 32 * j)),
                                                   _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * j)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, iq_ls(a[i].scales[2 * j], a[i].scales[2 * j + 1])));
        }
        const int32_t sumi = pi_hsum_epi32(acc) - 64 * off;
#elif PI_NEON
        int32x4_t d[PI_QK_K / 16];
        int32_t sc[PI_QK_K / 16];
        for (int j = 0; j < PI_QK_K / 16; j++) {   /* u = v + 64 <= 107: as int8 the same */
            d[j] = pi_neon_dot16(vld1q_s8((const int8_t *)a[i].u + 16 * j), b[i].qs + 16 * j);
            sc[j] = a[i].scales[j];
        }
        const int32_t sumi = pi_neon_scaled_sums(d, sc, PI_QK_K / 16) - 64 * off;
#else
        int32_t sumi = -64 * off;
        for (int j = 0; j < PI_QK_K / 16; j++) {
            int32_t t = 0;
            for (int l = 16 * j; l < 16 * j + 16; l++) t += a[i].u[l] * b[i].qs[l];
            sumi += a[i].scales[j] * t;
        }
#endif
        sum += b[i].d * a[i].d * (float)sumi;
    }
    return sum;
}

/* IQ2 rows -> Q8_KW rows for prompts (pi_to_batch_fn): the values v = grid value * sign as u = v + 64, ls of each half
 * sub-block as its scale, d = fp16 d / 8 in f32 (exact: the IQ2 dot's d times its 1/8). Never refuses. */
#if defined(__AVX2__)
#define IQ2_SUB_TO_Q8_KW(name, x, j, grid, y)                                                                       \
    do {                                                                                                            \
        const iq_vec v = name##_vec(x, j);                                                                          \
        (y)->scales[2 * (j)] = (int8_t)_mm256_extract_epi16(v.ls, 0);                                               \
        (y)->scales[2 * (j) + 1] = (int8_t)_mm256_extract_epi16(v.ls, 8);                                           \
        _mm256_storeu_si256((__m256i *)((y)->u + PI_QK * (j)),                                                      \
                            _mm256_add_epi8(_mm256_sign_epi8(v.g, v.signs), _mm256_set1_epi8(64)));                 \
    } while (0)
#else
#define IQ2_SUB_TO_Q8_KW(name, x, j, grid, y)                                                                       \
    do {                                                                                                            \
        pi_iq2_sub sb;                                                                                              \
        pi_##name##_sub(x, j, grid, &sb);                                                                           \
        (y)->scales[2 * (j)] = (int8_t)(2 * sb.s[0] + 1);                                                           \
        (y)->scales[2 * (j) + 1] = (int8_t)(2 * sb.s[1] + 1);                                                       \
        for (int e = 0; e < PI_QK; e++) {                                                                           \
            const int g = (int)(sb.points[e / 8] >> 8 * (e % 8) & 255);                                             \
            (y)->u[PI_QK * (j) + e] = (uint8_t)((sb.signs >> e & 1 ? -g : g) + 64);                                 \
        }                                                                                                           \
    } while (0)
#endif
/* Rows of an IQ2 or IQ1 type -> Q8_KW rows: d = fp16 d / 8 in f32 (dfield: the block's fp16 d), then each sub-block
 * through sub (IQ2_SUB_TO_Q8_KW, IQ1_SUB_TO_Q8_KW). Never refuses. */
#define TO_Q8_KW(name, wtype, dfield, grid, sub)                                                                    \
    static bool pi_##name##_to_q8_kw(int64_t k, const void *w, int64_t stride, int n, void *dst) {                 \
        pi_block_q8_kw *y = dst;                                                                                    \
        for (int r = 0; r < n; r++) {                                                                               \
            const wtype *x = (const wtype *)((const char *)w + r * stride);                                         \
            for (int64_t b = 0; b < k / PI_QK_K; b++, y++) {                                                        \
                y->d = pi_fp16_to_f32(dfield(&x[b])) * 0.125f;                                                      \
                for (int j = 0; j < PI_QK_K / PI_QK; j++) sub(name, &x[b], j, grid, y);                             \
            }                                                                                                       \
        }                                                                                                           \
        return true;                                                                                                \
    }
TO_Q8_KW(iq2_xxs, pi_block_iq2_xxs, PI_BLOCK_D, PI_IQ2_XXS_GRID, IQ2_SUB_TO_Q8_KW)
TO_Q8_KW(iq2_xs, pi_block_iq2_xs, PI_BLOCK_D, PI_IQ2_XS_GRID, IQ2_SUB_TO_Q8_KW)
TO_Q8_KW(iq2_s, pi_block_iq2_s, PI_BLOCK_D, PI_IQ2_S_GRID, IQ2_SUB_TO_Q8_KW)

/* An IQ1 sub-block as Q8_KW's: u = v + 64 (v = 8 g + delta) and ls of each half (with TO_Q8_KW's d / 8: the IQ1 dot's
 * integers and float steps) */
#if defined(__AVX2__)
#define IQ1_SUB_TO_Q8_KW(name, x, j, grid, y)                                                                       \
    do {                                                                                                            \
        const iq_vec v = name##_vec(x, j);   /* its signs are the values v */                                       \
        (y)->scales[2 * (j)] = (int8_t)_mm256_extract_epi16(v.ls, 0);                                               \
        (y)->scales[2 * (j) + 1] = (int8_t)_mm256_extract_epi16(v.ls, 8);                                           \
        _mm256_storeu_si256((__m256i *)((y)->u + PI_QK * (j)), _mm256_add_epi8(v.signs, _mm256_set1_epi8(64)));    \
    } while (0)
#else
#define IQ1_SUB_TO_Q8_KW(name, x, j, grid, y)                                                                       \
    do {                                                                                                            \
        pi_iq1_sub sb;                                                                                              \
        pi_##name##_sub(x, j, &sb);                                                                                 \
        (y)->scales[2 * (j)] = (int8_t)sb.ls[0];                                                                    \
        (y)->scales[2 * (j) + 1] = (int8_t)sb.ls[1];                                                                \
        for (int e = 0; e < PI_QK; e++) (y)->u[PI_QK * (j) + e] = (uint8_t)(pi_iq1_value(grid, &sb, e) + 64);      \
    } while (0)
#endif
TO_Q8_KW(iq1_s, pi_block_iq1_s, PI_BLOCK_D, PI_IQ1_GRID, IQ1_SUB_TO_Q8_KW)
TO_Q8_KW(iq1_m, pi_block_iq1_m, pi_iq1_m_d, PI_IQ1_GRID, IQ1_SUB_TO_Q8_KW)

/* A K-quant row . its activations, super-blocks in order: per block the exact integers (X_ints), then
 * sum += bd * (d * sumi - dmin * summ) for the types with mins (Q2_K, Q4_K, Q5_K), sum += bd * d * sumi for the
 * others, bd the activation block's f32 step; the 8-row kernels of rows8_k.c keep the same order. The AVX2 code
 * takes eight blocks at a time: their lanes (X_lanes) share one horizontal sum (pi_hsum8_i32) instead of one or
 * two per block, the products are computed lane by lane (the same f32 operations: the same bits) and added to
 * sum one by one (542M Q2_K/Q3_K/Q5_K decode: bench/README.md). Decode streams a row through one thread, so
 * each block asks for the one K_PREFETCH_AHEAD blocks on. */
#if defined(__AVX2__)
static inline __attribute__((always_inline)) float k_add8(float sum, __m256 bd, __m256 d, const __m256i li[8],
                                                          __m256 dmin, const __m256i lm[8], const bool mins,
                                                          const float dmul) {
    const __m256 si = _mm256_cvtepi32_ps(pi_hsum8_i32(li));
    if (dmul != 1.0f) d = _mm256_mul_ps(d, _mm256_set1_ps(dmul));
    const __m256 t = mins ? _mm256_mul_ps(bd, _mm256_sub_ps(_mm256_mul_ps(d, si),
                                                            _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(pi_hsum8_i32(lm)))))
                          : _mm256_mul_ps(_mm256_mul_ps(bd, d), si);
    float tk[8];
    _mm256_storeu_ps(tk, t);
    for (int k = 0; k < 8; k++) sum += tk[k];
    return sum;
}
/* wd, wdmin: the weight block's fp16 d and dmin (PI_BLOCK_D, K_DMIN; wdmin any fp16 when !mins, unused) */
#define K_EIGHTS(name, bd, mins, wd, wdmin, dmul)                                                                   \
    for (; i + 8 <= nb; i += 8) {                                                                                   \
        __m256i li[8], lm[8];                                                                                       \
        for (int k = 0; k < 8; k++) {                                                                               \
            prefetch_block(&a[i + k], sizeof *a);                                                                   \
            name##_lanes(&a[i + k], &b[i + k], &li[k], &lm[k]);                                                     \
        }                                                                                                           \
        uint16_t d_[8], dmin_[8];                                                                                   \
        for (int k = 0; k < 8; k++) {                                                                               \
            d_[k] = wd(&a[i + k]);                                                                                  \
            dmin_[k] = wdmin(&a[i + k]);                                                                            \
        }                                                                                                           \
        sum = k_add8(sum, pi_f32x8_strided(&b[i].bd, sizeof *b), _mm256_cvtph_ps(_mm_loadu_si128((__m128i *)d_)),  \
                     li, _mm256_cvtph_ps(_mm_loadu_si128((__m128i *)dmin_)), lm, mins, dmul);                      \
    }
#else
#define K_EIGHTS(name, bd, mins, wd, wdmin, dmul)
#endif

/* One block's integers: the lanes' horizontal sums (AVX2) or the scalar X_ints. */
#if defined(__AVX2__)
#define K_INTS(name, x, y, sumi, summ)                                                                              \
    do {                                                                                                            \
        __m256i li_, lm_;                                                                                           \
        name##_lanes(x, y, &li_, &lm_);                                                                             \
        *(sumi) = pi_hsum_epi32(li_);                                                                               \
        *(summ) = pi_hsum_epi32(lm_);                                                                               \
    } while (0)
#else
#define K_INTS(name, x, y, sumi, summ) name##_ints(x, y, sumi, summ)
#endif

/* One block's float term in the order above (mins, dmul: compile-time constants; dmul a power of two, d's factor:
 * IQ3_XXS's 1/4, the IQ2 types' 1/8, 1 for the others). */
static inline __attribute__((always_inline)) float k_term(float bd, uint16_t d, uint16_t dmin, int32_t sumi, int32_t summ,
                                                          const bool mins, const float dmul) {
    return mins ? bd * (pi_fp16_to_f32(d) * (float)sumi - pi_fp16_to_f32(dmin) * (float)summ)
                : bd * (dmul == 1.0f ? pi_fp16_to_f32(d) : pi_fp16_to_f32(d) * dmul) * (float)sumi;
}

/* bd: the activation block's f32 step field; wd, wdmin: the weight block's fp16 d and dmin, read by accessors
 * (PI_BLOCK_D, K_DMIN; IQ1_M spreads its d over its scales; wdmin any fp16 where !mins) */
#define K_DMIN(block) ((block)->dmin)
#define K_ROW_DOT(name, wtype, atype, bd, mins, wd, wdmin, dmul)                                                    \
    float pi_vec_dot_##name##_q8_K(int64_t n, const void *w, const void *x) {                                       \
        const wtype *a = w;                                                                                         \
        const atype *b = x;                                                                                         \
        const int64_t nb = n / PI_QK_K;                                                                             \
        float sum = 0.0f;                                                                                           \
        int64_t i = 0;                                                                                              \
        K_EIGHTS(name, bd, mins, wd, wdmin, dmul)                                                                   \
        for (; i < nb; i++) {                                                                                       \
            prefetch_block(&a[i], sizeof *a);                                                                       \
            int32_t sumi, summ;                                                                                     \
            K_INTS(name, &a[i], &b[i], &sumi, &summ);                                                               \
            sum += k_term(b[i].bd, wd(&a[i]), wdmin(&a[i]), sumi, summ, mins, dmul);                                \
        }                                                                                                           \
        return sum;                                                                                                 \
    }

K_ROW_DOT(q2_K, pi_block_q2_K, pi_block_q8_K, d, true, PI_BLOCK_D, K_DMIN, 1.0f)
K_ROW_DOT(q3_K, pi_block_q3_K, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 1.0f)
K_ROW_DOT(q4_K, pi_block_q4_K, pi_block_q8_Km, k.d, true, PI_BLOCK_D, K_DMIN, 1.0f)   /* x: Q8_KM */
K_ROW_DOT(q5_K, pi_block_q5_K, pi_block_q8_Km, k.d, true, PI_BLOCK_D, K_DMIN, 1.0f)   /* x: Q8_KM */
K_ROW_DOT(q6_K, pi_block_q6_K, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 1.0f)
K_ROW_DOT(iq4_xs, pi_block_iq4_xs, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 1.0f)
K_ROW_DOT(iq3_xxs, pi_block_iq3_xxs, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 0.25f)
K_ROW_DOT(iq3_s, pi_block_iq3_s, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 1.0f)
K_ROW_DOT(iq2_xxs, pi_block_iq2_xxs, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 0.125f)
K_ROW_DOT(iq2_xs, pi_block_iq2_xs, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 0.125f)
K_ROW_DOT(iq2_s, pi_block_iq2_s, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 0.125f)
K_ROW_DOT(iq1_s, pi_block_iq1_s, pi_block_q8_K, d, false, PI_BLOCK_D, PI_BLOCK_D, 0.125f)
K_ROW_DOT(iq1_m, pi_block_iq1_m, pi_block_q8_K, d, false, pi_iq1_m_d, pi_iq1_m_d, 0.125f)

float pi_vec_dot_q8_K_q8_K(int64_t n, const void *w, const void *x) {
    const pi_block_q8_K *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        int32_t s = 0;
#if defined(__AVX2__)
        __m256i acc = _mm256_setzero_si256();
        for (int k = 0; k < PI_QK_K; k += 32)
            acc = _mm256_add_epi32(acc, dot_i8(_mm256_loadu_si256((const __m256i *)(a[i].qs + k)),
                                               _mm256_loadu_si256((const __m256i *)(b[i].qs + k))));
        s = pi_hsum_epi32(acc);
#elif PI_NEON
        for (int k = 0; k < PI_QK_K; k += 32) s += pi_neon_dot32(a[i].qs + k, b[i].qs + k);
#else
        for (int j = 0; j < PI_QK_K; j++) s += a[i].qs[j] * b[i].qs[j];
#endif
        sum += a[i].d * b[i].d * (float)s;
    }
    return sum;
}

/* ======================================================================================
 * Q8_KM: the activation quantizer of Q4_K/Q5_K (quants_k.h), AVX2 with exactly the scalar bits
 * ====================================================================================== */

#if defined(__AVX2__)
/* The largest |x[i]| of n (a multiple of 8) floats: exact in any order; max_ps(v, acc) keeps acc where v is NaN,
 * as the scalar references' compares (NaN does not count; NEON: FMAXNM). */
static inline float amax_ps(const float *x, int n) {
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < n; k += 8)
        acc = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + k)), acc);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}
#elif PI_NEON
static inline float amax_ps(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(0);
    for (int k = 0; k < n; k += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + k)));
    return vmaxnmvq_f32(m);
}
#endif

/* Q8_K's bsums: the sums of each 16 of the block's quants. */
static inline void q8_K_bsums(pi_block_q8_K *y) {
#if defined(__AVX2__)
    for (int j = 0; j < PI_QK_K / 16; j += 2) {   /* two sums of 16 per 32 bytes */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(y->qs + 16 * j));
        const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
        __m128i s = _mm_hadd_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
        s = _mm_hadd_epi32(s, s);   /* lanes 0, 1: the sums of bytes 0..15 and 16..31 */
        y->bsums[j] = (int16_t)_mm_cvtsi128_si32(s);
        y->bsums[j + 1] = (int16_t)_mm_extract_epi32(s, 1);
    }
#elif PI_NEON
    for (int j = 0; j < PI_QK_K / 16; j++) y->bsums[j] = vaddlvq_s8(vld1q_s8(y->qs + 16 * j));
#else
    for (int j = 0; j < PI_QK_K / 16; j++) {
        int sum = 0;
        for (int i = 0; i < 16; i++) sum += y->qs[16 * j + i];
        y->bsums[j] = (int16_t)sum;
    }
#endif
}

/* amax = the block's largest |x|, amax_j that of sub-block j; d = amax / (127 M), m_j = ceil(M amax_j /
 * amax) (M for the sub-block of amax, at least 1), q = nearest(x / (d m_j)) in -127..127 (ties to even, the
 * value clamped as a float first), f32 operations in this order; bsums as Q8_K's. A zero block is all zeros
 * with m_j = 1. (NaN elements do not count for amax; they quantize to -127.) */
#if PI_NEON
/* q = nearest_even(clamp(iscale x, -127, 127)) for 32 floats; a NaN product gives -127 where nan_low (fmaxf's
 * order, Q8_KM), else 0 (Q8_K's lrintf) */
static inline void neon_quantize32(const float *x, float iscale, int8_t *q, const bool nan_low) {
    const float32x4_t lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
    int32x4_t v[8];
    for (int k = 0; k < 8; k++) {
        const float32x4_t p = vmulq_n_f32(vld1q_f32(x + 4 * k), iscale);
        v[k] = vcvtnq_s32_f32(nan_low ? vminnmq_f32(vmaxnmq_f32(p, lo), hi) : vminq_f32(vmaxq_f32(p, lo), hi));
    }
    pi_neon_store_i8x32(v, q);
}
#endif

void pi_q8_Km_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q8_Km *y = dst;
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        float sub[PI_QK_K / 32], amax = 0.0f;
        for (int j = 0; j < PI_QK_K / 32; j++) {
            const float *xj = src + 32 * j;
            float a = 0.0f;
#if defined(__AVX2__) || PI_NEON
            a = amax_ps(xj, 32);
#else
            for (int i = 0; i < 32; i++) a = fabsf(xj[i]) > a ? fabsf(xj[i]) : a;
#endif
            sub[j] = a;
            amax = a > amax ? a : amax;
        }
        memset(&y[b], 0, sizeof y[b]);
        for (int j = 0; j < PI_QK_K / 32; j++) y[b].m[j] = 1;
        if (amax == 0.0f) continue;
        const float d = amax / (127.0f * PI_Q8_KM_M);
        for (int j = 0; j < PI_QK_K / 32; j++) {
            const int m = PI_MAX(1, PI_MIN(PI_Q8_KM_M, (int)ceilf((float)PI_Q8_KM_M * sub[j] / amax)));
            const float iscale = 1.0f / (d * (float)m);
            const float *xj = src + 32 * j;
            int8_t *qj = y[b].k.qs + 32 * j;
#if defined(__AVX2__)
            /* max_ps(v, -127) gives -127 for NaN, as fmaxf; cvtps rounds to nearest even, as lrintf */
            const __m256 is = _mm256_set1_ps(iscale), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
            __m256i v[4];
            for (int k = 0; k < 4; k++)
                v[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(is, _mm256_loadu_ps(xj + 8 * k)), lo), hi));
            const __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)qj, _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#elif PI_NEON
            neon_quantize32(xj, iscale, qj, true);
#else
            for (int i = 0; i < 32; i++)   /* clamped as floats: no int conversion of an out-of-range value */
                qj[i] = (int8_t)pi_nearest_int(fminf(127.0f, fmaxf(-127.0f, iscale * xj[i])));
#endif
            y[b].m[j] = (int16_t)m;
        }
        q8_K_bsums(&y[b].k);
        y[b].k.d = d;
    }
}

/* ======================================================================================
 * Q8_K: the activations of Q2_K, Q3_K and Q6_K, with the bits of dtype_k.c's pi_q8_K_from_f32
 * (the reference): d = max / -127 of the first element of largest magnitude, q = nearest(x / d).
 * It runs once per matmul call on one thread, so at one token a Q6_K ffn_down (K = 2048) spent
 * 5.4 us here on a Zen 4 with the reference's lrintf per element, ~15% of its own matmul.
 * ====================================================================================== */

void pi_quantize_row_q8_K(const float *src, void *dst, int64_t n) {
#if defined(__AVX2__)
    pi_block_q8_K *y = dst;
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        const float amax = amax_ps(src, PI_QK_K);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        float max = amax;   /* the sign of the first element of that magnitude */
        for (int j = 0; j < PI_QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(src + j), absmask),
                                                             _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) { max = src[j + __builtin_ctz((unsigned)hit)]; break; }
        }
        const float iscale = -127.0f / max;
        /* clamped as floats, then cvtps rounds to nearest even, as lrintf; a NaN product (a NaN element, or
         * 0 * inf) gives 0, as the reference's (int)lrintf(NaN) on x86-64 and aarch64 */
        const __m256 is = _mm256_set1_ps(iscale), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
        for (int j = 0; j < PI_QK_K; j += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++) {
                const __m256 p = _mm256_mul_ps(is, _mm256_loadu_ps(src + j + 8 * k));
                const __m256 c = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(p, lo), hi), _mm256_cmp_ps(p, p, _CMP_ORD_Q));
                v[k] = _mm256_cvtps_epi32(c);
            }
            const __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(y[b].qs + j),
                                _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
        q8_K_bsums(&y[b]);
        y[b].d = 1.0f / iscale;
    }
#elif PI_NEON
    pi_block_q8_K *y = dst;
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        const float amax = amax_ps(src, PI_QK_K);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        float max = amax;   /* the sign of the first element of that magnitude */
        for (int j = 0; j < PI_QK_K; j++)
            if (fabsf(src[j]) == amax) { max = src[j]; break; }
        const float iscale = -127.0f / max;
        for (int j = 0; j < PI_QK_K; j += 32) neon_quantize32(src + j, iscale, y[b].qs + j, false);
        q8_K_bsums(&y[b]);
        y[b].d = 1.0f / iscale;
    }
#else
    pi_q8_K_from_f32(src, dst, n);
#endif
}

/* ======================================================================================
 * axpy (the sparse FFN's down step): dequantize up to 256 elements at a time into a
 * buffer on the stack, then the f32 axpy kernel (FMA where available).
 * ====================================================================================== */

static inline void axpy_blocks(int64_t n, float a, const void *row, float *y, pi_to_f32_fn to_f32, int64_t bs,
                               int64_t bb) {
    float tmp[PI_QK_K];
    const int64_t per = PI_QK_K / bs;   /* blocks per chunk */
    const char *src = row;
    for (int64_t b = 0; b < n / bs; b += per) {
        const int64_t nblk = PI_MIN(per, n / bs - b);
        to_f32(src + b * bb, tmp, nblk * bs);
        pi_axpy_f32(nblk * bs, a, tmp, y + b * bs);
    }
}

#define AXPY(name, to_f32, bs, type) \
    void name(int64_t n, float a, const void *row, float *y) { axpy_blocks(n, a, row, y, to_f32, bs, sizeof(type)); }

AXPY(pi_axpy_q4_1, pi_q4_1_to_f32, PI_QK, pi_block_q4_1)
AXPY(pi_axpy_q5_0, pi_q5_0_to_f32, PI_QK, pi_block_q5_0)
AXPY(pi_axpy_q5_1, pi_q5_1_to_f32, PI_QK, pi_block_q5_1)
AXPY(pi_axpy_q8_1, pi_q8_1_to_f32, PI_QK, pi_block_q8_1)
AXPY(pi_axpy_q2_K, pi_q2_K_to_f32, PI_QK_K, pi_block_q2_K)
AXPY(pi_axpy_q3_K, pi_q3_K_to_f32, PI_QK_K, pi_block_q3_K)
AXPY(pi_axpy_q4_K, pi_q4_K_to_f32, PI_QK_K, pi_block_q4_K)
AXPY(pi_axpy_q5_K, pi_q5_K_to_f32, PI_QK_K, pi_block_q5_K)
AXPY(pi_axpy_q6_K, pi_q6_K_to_f32, PI_QK_K, pi_block_q6_K)
AXPY(pi_axpy_q8_K, pi_q8_K_to_f32, PI_QK_K, pi_block_q8_K)
AXPY(pi_axpy_iq4_nl, pi_iq4_nl_to_f32, PI_QK, pi_block_iq4_nl)
AXPY(pi_axpy_mxfp4, pi_mxfp4_to_f32, PI_QK, pi_block_mxfp4)
AXPY(pi_axpy_iq4_xs, pi_iq4_xs_to_f32, PI_QK_K, pi_block_iq4_xs)
AXPY(pi_axpy_iq3_xxs, pi_iq3_xxs_to_f32, PI_QK_K, pi_block_iq3_xxs)
AXPY(pi_axpy_iq3_s, pi_iq3_s_to_f32, PI_QK_K, pi_block_iq3_s)
AXPY(pi_axpy_iq2_xxs, pi_iq2_xxs_to_f32, PI_QK_K, pi_block_iq2_xxs)
AXPY(pi_axpy_iq2_xs, pi_iq2_xs_to_f32, PI_QK_K, pi_block_iq2_xs)
AXPY(pi_axpy_iq2_s, pi_iq2_s_to_f32, PI_QK_K, pi_block_iq2_s)
AXPY(pi_axpy_iq1_s, pi_iq1_s_to_f32, PI_QK_K, pi_block_iq1_s)
AXPY(pi_axpy_iq1_m, pi_iq1_m_to_f32, PI_QK_K, pi_block_iq1_m)
