/* neon_util.h: helpers of the aarch64 levels' kernels (neon and dotprod, kernels.h's PI_NEON).
 *
 * The contract is the scalar level's bits (docs/design.md, "numeric contract"): integer sums are exact whatever
 * instructions form them (SDOT, or pi_neon_sdot's emulation), and every float sum keeps the AVX2 order, whose 8 lanes
 * are two 4-lane registers here (lo = lanes 0..3, hi = lanes 4..7) reduced by pi_tree8. NEON's fused multiply-add
 * (vfmaq) rounds once, as fmaf and AVX2's fmadd do. */
#ifndef PI_ARCH_NEON_UTIL_H
#define PI_ARCH_NEON_UTIL_H

#include <arm_neon.h>
#include <string.h>

/* SDOT: lane i of acc += the products of bytes 4i..4i+3 of a and b. The dotprod level has the instruction; the neon
 * level forms the same lanes exactly from SMULL's int16 products (|.| <= 2^14) and two pairwise adds. */
static inline int32x4_t pi_neon_sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));   /* bytes 0-1, 2-3, 4-5, 6-7 */
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(a, b));                       /* bytes 8-9, ..., 14-15 */
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
#endif
}

/* 8 lanes (two registers) -> the scalar level's horizontal sum */
static inline float pi_neon_tree8(float32x4_t lo, float32x4_t hi) {
    float p[8];
    vst1q_f32(p, lo);
    vst1q_f32(p + 4, hi);
    return pi_tree8(p);
}

/* 8 f16 values -> two f32 registers (exact) */
static inline void pi_neon_load8_f16(const uint16_t *h, float32x4_t *lo, float32x4_t *hi) {
    const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(h));
    *lo = vcvt_f32_f16(vget_low_f16(v));
    *hi = vcvt_high_f32_f16(v);
}

/* 8 bf16 values -> two f32 registers (exact: the 16 bits are the float's top half) */
static inline void pi_neon_load8_bf16(const uint16_t *h, float32x4_t *lo, float32x4_t *hi) {
    const uint16x8_t v = vld1q_u16(h);
    *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
    *hi = vreinterpretq_f32_u32(vshll_high_n_u16(v, 16));
}

/* One row's 32 products lo . y0 + hi . y1 as 4 int32 lanes whose total is their exact sum (which products go to
 * which lane is free: only the total counts). Without SDOT two products share an int16 lane (vmull + vmlal_high:
 * |w y| <= 128 * 127, as in the AVX2 maddubs pairs; the activation quantizers keep |y| <= 127), then pairwise
 * widening adds: 6 instructions instead of two emulated SDOTs' 12. */
static inline int32x4_t pi_neon_row_sums32(int8x16_t lo, int8x16_t hi, int8x16_t y0, int8x16_t y1) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, y0), hi, y1);
#else
    const int16x8_t a = vmlal_high_s8(vmull_s8(vget_low_s8(lo), vget_low_s8(y0)), lo, y0);
    const int16x8_t b = vmlal_high_s8(vmull_s8(vget_low_s8(hi), vget_low_s8(y1)), hi, y1);
    return vpadalq_s16(vpaddlq_s16(a), b);
#endif
}

/* the exact sum of the 32 products lo . y[0..15] + hi . y[16..31] (a block's two halves against its activations) */
static inline int32_t pi_neon_dot_halves(int8x16_t lo, int8x16_t hi, const int8_t *y) {
    return vaddvq_s32(pi_neon_row_sums32(lo, hi, vld1q_s8(y), vld1q_s8(y + 16)));
}

/* Four rows' blocks against one activation block: lane k = the exact sum of the 32 products lo[k] . y[0..15] +
 * hi[k] . y[16..31] (the 8-row kernels: each row's block sum in its own lane, by three pairwise adds) */
static inline int32x4_t pi_neon_rows4_sums(const int8x16_t lo[4], const int8x16_t hi[4], const int8_t *y) {
    const int8x16_t y0 = vld1q_s8(y), y1 = vld1q_s8(y + 16);
    int32x4_t p[4];
    for (int k = 0; k < 4; k++) p[k] = pi_neon_row_sums32(lo[k], hi[k], y0, y1);
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
/* The i8mm level's operands: two rows' (or two tokens') 32 bytes (a: lo0, hi0, b: lo1, hi1) as SMMLA's 2 x 8 blocks,
 * chunk c = bytes 8c..8c+7 of a, then those of b */
static inline void pi_neon_pair_chunks(int8x16_t lo0, int8x16_t hi0, int8x16_t lo1, int8x16_t hi1, int8x16_t c[4]) {
    c[0] = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(lo0), vreinterpretq_s64_s8(lo1)));
    c[1] = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(lo0), vreinterpretq_s64_s8(lo1)));
    c[2] = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(hi0), vreinterpretq_s64_s8(hi1)));
    c[3] = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(hi0), vreinterpretq_s64_s8(hi1)));
}

/* a register of (row, token) lanes (row 0, token 0), (0, 1), (1, 0), (1, 1) stored to y (token t's row r at
 * y[t y_stride + r]); second: whether token 1 is real (else an odd last token's copy, not stored) */
static inline void pi_neon_store_pair_lanes(float32x4_t v, float *y, int64_t y_stride, bool second) {
    y[0] = vgetq_lane_f32(v, 0);
    y[1] = vgetq_lane_f32(v, 2);
    if (second) {
        y[y_stride] = vgetq_lane_f32(v, 1);
        y[y_stride + 1] = vgetq_lane_f32(v, 3);
    }
}

/* the exact sums of 2 rows' 32 products with 2 tokens' (pi_neon_pair_chunks of each): lanes (row 0, token 0),
 * (row 0, token 1), (row 1, token 0), (row 1, token 1), four SMMLA */
static inline int32x4_t pi_neon_pair_sums(const int8x16_t w[4], const int8x16_t x[4]) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int c = 0; c < 4; c++) acc = vmmlaq_s32(acc, w[c], x[c]);
    return acc;
}
#endif

/* The same for 16 elements: lane k = the exact sum of q[k] . y[0..15] */
static inline int32x4_t pi_neon_rows4_sums16(const int8x16_t q[4], const int8_t *y) {
    const int8x16_t y0 = vld1q_s8(y);
    int32x4_t p[4];
    for (int k = 0; k < 4; k++)
#if defined(__ARM_FEATURE_DOTPROD)
        p[k] = vdotq_s32(vdupq_n_s32(0), q[k], y0);
#else   /* as pi_neon_row_sums32: two products per int16 lane */
        p[k] = vpaddlq_s16(vmlal_high_s8(vmull_s8(vget_low_s8(q[k]), vget_low_s8(y0)), q[k], y0));
#endif
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

/* 16 int8 values of each of 4 rows (a block's 16 scales, or 8 scales and 8 mins) -> out[j], lane k = value j of row k
 * (int32): the rows' per-sub-block scales laid out for the 8-row kernels' lanes, by two rounds of zips and widening */
static inline void pi_neon_rows4_transpose16(const int8x16_t s[4], int32x4_t out[16]) {
    const int16x8_t a = vreinterpretq_s16_s8(vzip1q_s8(s[0], s[1])), b = vreinterpretq_s16_s8(vzip2q_s8(s[0], s[1]));
    const int16x8_t c = vreinterpretq_s16_s8(vzip1q_s8(s[2], s[3])), d = vreinterpretq_s16_s8(vzip2q_s8(s[2], s[3]));
    const int8x16_t q[4] = { vreinterpretq_s8_s16(vzip1q_s16(a, c)), vreinterpretq_s8_s16(vzip2q_s16(a, c)),
                             vreinterpretq_s8_s16(vzip1q_s16(b, d)), vreinterpretq_s8_s16(vzip2q_s16(b, d)) };
    for (int m = 0; m < 4; m++) {   /* q[m]: values 4m..4m+3 of rows 0..3, a row's four bytes per value */
        const int16x8_t lo = vmovl_s8(vget_low_s8(q[m])), hi = vmovl_high_s8(q[m]);
        out[4 * m] = vmovl_s16(vget_low_s16(lo));
        out[4 * m + 1] = vmovl_high_s16(lo);
        out[4 * m + 2] = vmovl_s16(vget_low_s16(hi));
        out[4 * m + 3] = vmovl_high_s16(hi);
    }
}

/* four fp16 values (the four rows' block scales d or dmin) as one f32 register, lane k = *h[k] */
static inline float32x4_t pi_neon_rows4_f16(const uint16_t *const h[4]) {
    uint16x4_t v = vdup_n_u16(0);
    v = vld1_lane_u16(h[0], v, 0);
    v = vld1_lane_u16(h[1], v, 1);
    v = vld1_lane_u16(h[2], v, 2);
    v = vld1_lane_u16(h[3], v, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(v));
}

/* Q6_K's unsigned 6-bit values u (value = u - 32) of elements 128h + 32g + 16k .. + 15, g = 0..3 (sub-blocks
 * 8h + 2g + k): 4 low bits from ql, 2 high bits from qh */
static inline void pi_neon_q6_K_values(const uint8_t *ql, const uint8_t *qh, int h, int k, uint8x16_t u[4]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(3);
    const uint8x16_t l0 = vld1q_u8(ql + 64 * h + 16 * k), l1 = vld1q_u8(ql + 64 * h + 32 + 16 * k);
    const uint8x16_t hb = vld1q_u8(qh + 32 * h + 16 * k);
    u[0] = vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(hb, m3), 4));
    u[1] = vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4));
    u[2] = vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4));
    u[3] = vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4));
}

/* the exact sum of the 32 products of two int8 blocks */
static inline int32_t pi_neon_dot32(const int8_t *a, const int8_t *b) {
    return pi_neon_dot_halves(vld1q_s8(a), vld1q_s8(a + 16), b);
}

/* 4 fp16 at p (any alignment) -> f32 (exact) */
static inline float32x4_t pi_neon_load4_f16(const void *p) {
    return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8((const uint8_t *)p)));
}

/* 32 int32 lanes (each in -128..127) -> 32 bytes in order */
static inline void pi_neon_store_i8x32(const int32x4_t v[8], int8_t *q) {
    for (int k = 0; k < 8; k += 2) vst1_s8(q + 4 * k, vmovn_s16(vcombine_s16(vmovn_s32(v[k]), vmovn_s32(v[k + 1]))));
}

/* 16 bytes of packed nibbles -> the low nibbles (elements 0..15) and the high ones (16..31), unsigned */
static inline void pi_neon_nibbles(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
}

/* The same through the IQ4 grid (grid = vld1q_s8(PI_IQ4_VALUES)): the values grid[q] of elements 0..15 (lo) and
 * 16..31 (hi) (IQ4_NL, IQ4_XS) */
static inline void pi_neon_iq4_values(const uint8_t *qs, int8x16_t grid, int8x16_t *lo, int8x16_t *hi) {
    pi_neon_nibbles(qs, lo, hi);
    *lo = vqtbl1q_s8(grid, vreinterpretq_u8_s8(*lo));
    *hi = vqtbl1q_s8(grid, vreinterpretq_u8_s8(*hi));
}

/* sum_k sc[k] * (the total of d[k]'s lanes), k < n (a multiple of 4): exact int32, as the scalar level's
 * sub-block loops (d[k]: one sub-block's products as SDOT lanes) */
static inline int32_t pi_neon_scaled_sums(const int32x4_t *d, const int32_t *sc, int n) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int k = 0; k < n; k += 4)
        acc = vmlaq_s32(acc, vpaddq_s32(vpaddq_s32(d[k], d[k + 1]), vpaddq_s32(d[k + 2], d[k + 3])), vld1q_s32(sc + k));
    return vaddvq_s32(acc);
}

/* one sub-block's products as lanes: the 16 bytes q . y[0..15] */
static inline int32x4_t pi_neon_dot16(int8x16_t q, const int8_t *y) {
    return pi_neon_sdot(vdupq_n_s32(0), q, vld1q_s8(y));
}

/* bytes of value v where bit `bit` of the bytes of m is set, else 0 */
static inline uint8x16_t pi_neon_select_bit(uint8x16_t m, uint8_t bit, uint8_t v) {
    return vandq_u8(vtstq_u8(m, vdupq_n_u8(bit)), vdupq_n_u8(v));
}

/* 16 bits (bits 0..15 of b) -> 16 bytes: 0xff where the bit is set, else 0 */
static inline uint8x16_t pi_neon_bitmask16(uint32_t b) {
    const uint8x16_t bytes = vcombine_u8(vdup_n_u8((uint8_t)b), vdup_n_u8((uint8_t)(b >> 8)));
    static const uint8_t bit[16] = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
    return vtstq_u8(bytes, vld1q_u8(bit));
}

/* 16 bits -> 16 bytes: 16 where the bit is set, else 0 (Q5_0/Q5_1's fifth bits) */
static inline uint8x16_t pi_neon_bits16(uint32_t b) { return vandq_u8(pi_neon_bitmask16(b), vdupq_n_u8(16)); }

/* The exact sums of v_k y_k over elements 0..15 and 16..31 of a sub-block, v_k = the byte value k of vals (signed),
 * negated where bit k of signs is set (the IQ types' grid values and sign bits) */
static inline void pi_neon_signed_dot32(const int8_t *vals, uint32_t signs, const int8_t *y, int32_t t[2]) {
    for (int h = 0; h < 2; h++) {
        const int8x16_t m = vreinterpretq_s8_u8(pi_neon_bitmask16(signs >> 16 * h));
        const int8x16_t v = vsubq_s8(veorq_s8(vld1q_s8(vals + 16 * h), m), m);   /* -v where m = -1 */
        t[h] = vaddvq_s32(pi_neon_sdot(vdupq_n_s32(0), v, vld1q_s8(y + 16 * h)));
    }
}

/* y[j] = fma(s, q_j, y[j]) for j < 16: 16 int8 values added to 16 outputs, one fma per element (the axpy order) */
static inline void pi_neon_axpy16(float s, int8x16_t q, float *y) {
    const int16x8_t q0 = vmovl_s8(vget_low_s8(q)), q1 = vmovl_high_s8(q);
    vst1q_f32(y, vfmaq_n_f32(vld1q_f32(y), vcvtq_f32_s32(vmovl_s16(vget_low_s16(q0))), s));
    vst1q_f32(y + 4, vfmaq_n_f32(vld1q_f32(y + 4), vcvtq_f32_s32(vmovl_high_s16(q0)), s));
    vst1q_f32(y + 8, vfmaq_n_f32(vld1q_f32(y + 8), vcvtq_f32_s32(vmovl_s16(vget_low_s16(q1))), s));
    vst1q_f32(y + 12, vfmaq_n_f32(vld1q_f32(y + 12), vcvtq_f32_s32(vmovl_high_s16(q1)), s));
}

/* y[j] = fma(s, lo_j - 8, y[j]) for j < 16 and y[16 + j] = fma(s, hi_j - 8, y[16 + j]): 16 bytes of Q4_0 nibbles
 * added to 32 outputs (pi_axpy_q4_0's order) */
static inline void pi_neon_axpy_nibbles(float s, uint8x16_t bytes, float *y) {
    pi_neon_axpy16(s, vsubq_s8(vreinterpretq_s8_u8(vandq_u8(bytes, vdupq_n_u8(0x0f))), vdupq_n_s8(8)), y);
    pi_neon_axpy16(s, vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(bytes, 4)), vdupq_n_s8(8)), y + 16);
}

/* The column layouts (Q4_0C, Q4_KC, Q6_KC): a row's 32 bytes of a chunk -> its 64 nibbles, outputs 0-15, 16-31,
 * 32-47, 48-63 (byte j: output j in the low nibble, 32 + j in the high one) */
static inline void pi_neon_nibbles64(const uint8_t *r, uint8x16_t L[4]) {
    const uint8x16_t b0 = vld1q_u8(r), b1 = vld1q_u8(r + 16);
    L[0] = vandq_u8(b0, vdupq_n_u8(0x0f));
    L[1] = vandq_u8(b1, vdupq_n_u8(0x0f));
    L[2] = vshrq_n_u8(b0, 4);
    L[3] = vshrq_n_u8(b1, 4);
}

/* s16[i] (outputs 8i .. 8i + 7 of a chunk) += q times the row's nibbles at r: one row of an int16 run */
static inline void pi_neon_mla_nibbles64(int16x8_t s16[8], const uint8_t *r, int8_t q) {
    uint8x16_t L[4];
    pi_neon_nibbles64(r, L);
    const int8x8_t qv = vdup_n_s8(q);
    for (int g = 0; g < 4; g++) {
        s16[2 * g] = vmlal_s8(s16[2 * g], vreinterpret_s8_u8(vget_low_u8(L[g])), qv);
        s16[2 * g + 1] = vmlal_s8(s16[2 * g + 1], vreinterpret_s8_u8(vget_high_u8(L[g])), qv);
    }
}

#endif
