/* quants_k.h: block layouts and kernels of the llama.cpp quantization types beyond Q4_0/Q8_0
 * (spec section 8): the 32-element Q4_1, Q5_0, Q5_1 (+ the Q8_1 activation type) and the
 * 256-element K-quants Q2_K..Q6_K (+ the Q8_K activation type).
 *
 * Conversions (to_f32, reference quantizers) are in dtype_k.c, dot products and axpy in
 * arch/vec_dot_k.c. Activation types per weight type, as llama.cpp:
 *   Q5_0 -> Q8_0S (Q8_0 + the block's sum of quants),  Q4_1/Q5_1 -> Q8_1 (f32 d and s = d * sum(q)),
 *   Q2_K, Q3_K, Q6_K -> Q8_K,  Q4_K/Q5_K -> Q8_KM (Q8_K with a step per 32: below; llama.cpp uses Q8_K),
 *   IQ4_NL, MXFP4 -> Q8_0S,  IQ4_XS -> Q8_K (as llama.cpp: Q8_KM's multipliers times IQ4_XS's 6-bit signed scales and its
 *   grid's values up to 127 could overflow a super-block's int32 sum),  IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
 *   IQ1_M -> Q8_K. */
#ifndef PI_QUANTS_K_H
#define PI_QUANTS_K_H

#include "internal.h"

#include <math.h>

#define PI_QK   32     /* elements of a Q4_1/Q5_0/Q5_1/Q8_1 block */
#define PI_QK_K 256    /* elements of a K-quant super-block */
#define PI_K_SCALE_SIZE 12

typedef struct { uint16_t d, m; uint8_t qs[PI_QK / 2]; }                   pi_block_q4_1;   /* 20 B */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[PI_QK / 2]; }       pi_block_q5_0;   /* 22 B */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[PI_QK / 2]; }    pi_block_q5_1;   /* 24 B */
typedef struct { float d, s; int8_t qs[PI_QK]; }                           pi_block_q8_1;   /* 40 B */

/* The 32 unsigned 5-bit quants u of a Q5_0 / Q5_1 block: element j (j < 16) is the low nibble of qs[j], element
 * j + 16 its high nibble, and bit j of the 32-bit qh is element j's fifth bit. */
static inline void pi_quants_5bit(const uint8_t qs[PI_QK / 2], const uint8_t qh_bytes[4], uint8_t u[PI_QK]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < PI_QK / 2; j++) {
        u[j] = (uint8_t)((qs[j] & 0x0f) | ((qh >> j) & 1) << 4);
        u[j + PI_QK / 2] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
}

/* The grid of the IQ4 types: quant q (0..15) stands for PI_IQ4_VALUES[q] (llama.cpp's kvalues_iq4nl). */
static const int8_t PI_IQ4_VALUES[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };
/* IQ4_NL: Q4_0's layout (fp16 d; element j < 16 the low nibble of qs[j], j + 16 its high nibble), the value
 * d PI_IQ4_VALUES[q]. 18 B */
typedef struct { uint16_t d; uint8_t qs[PI_QK / 2]; } pi_block_iq4_nl;
/* IQ4_XS: 8 sub-blocks of 32, each with a 6-bit scale ls_j (low 4 bits: nibble j % 2 of scales_l[j / 2]; high 2:
 * bits 2j, 2j + 1 of scales_h) and IQ4_NL's 16 nibble bytes (qs[16 j ..]); the value d (ls_j - 32) PI_IQ4_VALUES[q].
 * 136 B */
typedef struct { uint16_t d, scales_h; uint8_t scales_l[PI_QK_K / 64]; uint8_t qs[PI_QK_K / 2]; } pi_block_iq4_xs;
/* MXFP4 (the OCP microscaling FP4 format; gpt-oss's expert weights): one E8M0 byte e, the block's scale 2^(e - 127),
 * then Q4_0's nibble layout; a nibble is an E2M1 number (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3,
 * 4, 6), held doubled as the int8 PI_MXFP4_VALUES[q] (llama.cpp's kvalues_mxfp4), so the value is
 * 2^(e - 128) PI_MXFP4_VALUES[q] (pi_e8m0_half). 17 B */
typedef struct { uint8_t e; uint8_t qs[PI_QK / 2]; } pi_block_mxfp4;
static const int8_t PI_MXFP4_VALUES[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
/* 2^(e - 128) (half the E8M0 scale, as the values are doubled), exactly as llama.cpp's ggml_e8m0_to_fp32_half: e >= 2
 * a normal float with exponent field e - 1, e = 0 and 1 the subnormals 2^-128 and 2^-127; e = 255 (E8M0's NaN) is
 * 2^127, as there. */
static inline float pi_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? UINT32_C(0x00200000) << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
/* MXFP4X8, MXFP4's interleaved copy (pi_repack): block b of rows 8g..8g+7 as Q4_0X8's, the 8 rows' e, then their
 * nibble bytes in Q4_0X8's order (136 B: 17 a row) */
typedef struct { uint8_t e[8]; uint8_t qs[8 * PI_QK / 2]; } pi_block_mxfp4x8;

/* The 32-element types of Q4_0's nibble layout (element j < 16 the low nibble of qs[j], j + 16 its high nibble) with
 * one block scale ahead of the nibbles: the single-row dots (arch/vec_dot_k.c) and the 8-row and interleaved kernels
 * (arch/rows8.c) are one code with the kind a constant. Q4_0: fp16 d, the value d (q - 8); IQ4_NL: fp16 d,
 * d PI_IQ4_VALUES[q]; MXFP4: E8M0 e, pi_e8m0_half(e) PI_MXFP4_VALUES[q]. The grid kinds (all but Q4_0) look the
 * nibbles up in a table of 16 int8 values. */
enum { PI_NIB_Q4_0, PI_NIB_IQ4_NL, PI_NIB_MXFP4 };
static inline const int8_t *pi_nib_values(int kind) { return kind == PI_NIB_MXFP4 ? PI_MXFP4_VALUES : PI_IQ4_VALUES; }
static inline int64_t pi_nib_scale_bytes(int kind) { return kind == PI_NIB_MXFP4 ? 1 : 2; }   /* = qs's offset */
static inline int64_t pi_nib_block_bytes(int kind) { return pi_nib_scale_bytes(kind) + PI_QK / 2; }
/* the block's scale from its scale bytes (a block, or an interleaved group's k-th scale) */
static inline float pi_nib_scale(int kind, const void *scale) {
    if (kind == PI_NIB_MXFP4) return pi_e8m0_half(*(const uint8_t *)scale);
    uint16_t d;
    memcpy(&d, scale, sizeof d);
    return pi_fp16_to_f32(d);
}

#if defined(__AVX2__)
#include <immintrin.h>
/* a table of 16 int8 values in both 128-bit lanes: a shuffle_epi8 of nibbles gives their values */
static inline __m256i pi_grid16(const int8_t *values) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values));
}
static inline __m256i pi_iq4_grid(void) { return pi_grid16(PI_IQ4_VALUES); }
/* 8 E8M0 bytes (lane k: byte k of e8) -> pi_e8m0_half of each, as 8 floats */
static inline __m256 pi_e8m0_half_x8(uint64_t e8) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)e8));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
}
#endif
#if defined(__AVX512F__)
/* a table of 16 int8 values + 128 in every 128-bit lane (v + 128 = v ^ 0x80 bytewise): unsigned bytes, as VNNI takes
 * the weights; a kernel takes 128 times the activations' sum off again */
static inline __m512i pi_grid16_u8_512(const int8_t *values) {
    return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)values)),
                            _mm512_set1_epi8((char)0x80));
}
static inline __m512i pi_iq4_grid_u8_512(void) { return pi_grid16_u8_512(PI_IQ4_VALUES); }
#endif
/* ls_j - 32 of sub-block j (0..7) of an IQ4_XS block: -32..31 */
static inline int pi_iq4_xs_scale(const pi_block_iq4_xs *b, int j) {
    return ((b->scales_l[j / 2] >> 4 * (j % 2) & 15) | (b->scales_h >> 2 * j & 3) << 4) - 32;
}

/* The IQ3 types: 8 sub-blocks of 32 elements, each 8 points of a lattice grid of 4 unsigned values (iq_grids.h, a
 * grid entry packs its values, value k in byte k) with one sign bit per element; the value of an element is
 * d * ls_j * grid value * sign, ls_j = 2 s_j + 1 from a 4-bit s_j (IQ3_XXS: times 1/4).
 * IQ3_XXS: qs[0..63] the grid indices (sub-block j: qs[8 j .. 8 j + 7], each 4 elements); then per sub-block a
 * little-endian uint32: bits 7 l .. 7 l + 6 (l < 4) a 7-bit sign index for elements 8 l .. 8 l + 7 (pi_iq_signs:
 * the eighth sign makes the count of minus signs even), bits 28..31 s_j. 98 B */
typedef struct { uint16_t d; uint8_t qs[3 * PI_QK_K / 8]; } pi_block_iq3_xxs;
/* IQ3_S: 9-bit grid indices, qs[i] | bit i % 8 of qh[i / 8] << 8 (sub-block j: indices 8 j .. 8 j + 7); element k's
 * sign bit k % 8 of signs[k / 8]; s_j nibble j % 2 of scales[j / 2]. 110 B */
typedef struct {
    uint16_t d;
    uint8_t qs[PI_QK_K / 4], qh[PI_QK_K / 32], signs[PI_QK_K / 8], scales[PI_QK_K / 64];
} pi_block_iq3_s;
/* IQ3_XXS's sign byte for a 7-bit index: the index, and bit 7 set where the index has an odd number of bits */
static inline uint8_t pi_iq_signs(uint32_t index7) {
    return (uint8_t)(index7 | (uint32_t)__builtin_parity(index7) << 7);
}
/* the 32 sign bits of IQ3_XXS sub-block j (bit k: element 32 j + k negative), and its ls_j = 2 s_j + 1 */
static inline uint32_t pi_iq3_xxs_signs(const pi_block_iq3_xxs *b, int j, int *ls) {
    uint32_t aux;
    memcpy(&aux, b->qs + PI_QK_K / 4 + 4 * j, 4);
    *ls = 2 * (int)(aux >> 28) + 1;
    return pi_iq_signs(aux & 127) | (uint32_t)pi_iq_signs(aux >> 7 & 127) << 8 |
           (uint32_t)pi_iq_signs(aux >> 14 & 127) << 16 | (uint32_t)pi_iq_signs(aux >> 21 & 127) << 24;
}
/* IQ3_S's grid index i (0..63) and ls_j of sub-block j */
static inline int pi_iq3_s_index(const pi_block_iq3_s *b, int i) { return b->qs[i] | (b->qh[i / 8] >> i % 8 & 1) << 8; }
static inline int pi_iq3_s_ls(const pi_block_iq3_s *b, int j) { return 2 * (b->scales[j / 2] >> 4 * (j % 2) & 15) + 1; }

/* The IQ2 types: 8 sub-blocks of 32 elements, each 4 points of a lattice grid of 8 values in {8, 25, 43} (iq_grids.h, a
 * uint64 packs a point, value k in byte k) with one sign bit per element; element value d (0.5 + s) / 4 * grid value
 * * sign, a 4-bit s per 32 (IQ2_XXS) or per 16 (IQ2_XS, IQ2_S). ls = 2 s + 1 is the integer scale of the dot.
 * IQ2_XXS: per sub-block two little-endian uint32: the first the 4 grid indices (a byte each), the second 4 x 7-bit
 * sign indices (as IQ3_XXS's, pi_iq_signs) and s in bits 28..31. 66 B */
typedef struct { uint16_t d; uint16_t qs[PI_QK_K / 8]; } pi_block_iq2_xxs;
/* IQ2_XS: per 8 elements a uint16, a 9-bit grid index and a 7-bit sign index above it; s of elements 16 k .. nibble
 * k % 2 of scales[k / 2]. 74 B */
typedef struct { uint16_t d; uint16_t qs[PI_QK_K / 8]; uint8_t scales[PI_QK_K / 32]; } pi_block_iq2_xs;
/* IQ2_S: 10-bit grid indices, qs[i] | bits 2 (i % 4) .. of qh[i / 4] << 8; element k's sign bit k % 8 of signs[k / 8];
 * s as IQ2_XS's. 82 B */
typedef struct {
    uint16_t d;
    uint8_t qs[PI_QK_K / 8], signs[PI_QK_K / 8], qh[PI_QK_K / 32], scales[PI_QK_K / 32];
} pi_block_iq2_s;
/* One IQ2 sub-block of 32 elements: its 4 grid points, 32 sign bits (bit k: element k negative), s of its halves */
typedef struct { uint64_t points[4]; uint32_t signs; int s[2]; } pi_iq2_sub;
static inline void pi_iq2_xxs_sub(const pi_block_iq2_xxs *b, int j, const uint64_t *grid, pi_iq2_sub *o) {
    uint32_t aux[2];
    memcpy(aux, b->qs + 4 * j, 8);
    for (int l = 0; l < 4; l++) o->points[l] = grid[aux[0] >> 8 * l & 255];
    o->signs = 0;
    for (int l = 0; l < 4; l++) o->signs |= (uint32_t)pi_iq_signs(aux[1] >> 7 * l & 127) << 8 * l;
    o->s[0] = o->s[1] = (int)(aux[1] >> 28);
}
static inline void pi_iq2_xs_sub(const pi_block_iq2_xs *b, int j, const uint64_t *grid, pi_iq2_sub *o) {
    o->signs = 0;
    for (int l = 0; l < 4; l++) {
        const uint16_t q = b->qs[4 * j + l];
        o->points[l] = grid[q & 511];
        o->signs |= (uint32_t)pi_iq_signs(q >> 9) << 8 * l;
    }
    o->s[0] = b->scales[j] & 15;
    o->s[1] = b->scales[j] >> 4;
}
static inline void pi_iq2_s_sub(const pi_block_iq2_s *b, int j, const uint64_t *grid, pi_iq2_sub *o) {
    for (int l = 0; l < 4; l++) o->points[l] = grid[b->qs[4 * j + l] | (b->qh[j] >> 2 * l & 3) << 8];
    memcpy(&o->signs, b->signs + 4 * j, 4);
    o->s[0] = b->scales[j] & 15;
    o->s[1] = b->scales[j] >> 4;
}

/* The IQ1 types: 8 sub-blocks of 32 elements, each 4 points of a grid of 8 values g in {-1, 0, 1} (PI_IQ1_GRID, 11-bit
 * indices) shifted by a delta of +-1/8 per point (IQ1_S: per sub-block); element value d ls (g + delta) with
 * ls = 2 s + 1 from a 3-bit s, per 32 (IQ1_S) or per 16 (IQ1_M). In integers v = 8 (g + delta) = 8 g +- 1 (odd,
 * |v| <= 9) and d / 8: the dot products sum ls v y exactly (llama.cpp's 8 sum ls g y + sum ls delta bsum, the same).
 * IQ1_S: qs[i] the low 8 bits of index i (sub-block j: 4 j .. 4 j + 3); qh[j]: bits 3 l .. 3 l + 2 index 4 j + l's
 * top 3, bits 12..14 s_j, bit 15 the delta's sign (set: -1/8). 50 B */
typedef struct { uint16_t d; uint8_t qs[PI_QK_K / 8]; uint16_t qh[PI_QK_K / 32]; } pi_block_iq1_s;
/* IQ1_M: qs as IQ1_S's; qh[2 j + m] holds the top 3 bits of index 4 j + 2 m in bits 0..2 and of 4 j + 2 m + 1 in
 * bits 4..6, their deltas' signs in bits 3 and 7; the little-endian uint16 k of scales holds the 3-bit s of the
 * halves of sub-blocks 2 k (bits 0..2, 3..5) and 2 k + 1 (bits 6..8, 9..11), and its bits 12..15 are bits 4 k ..
 * 4 k + 3 of the fp16 d. 56 B */
typedef struct { uint8_t qs[PI_QK_K / 8]; uint8_t qh[PI_QK_K / 16]; uint8_t scales[PI_QK_K / 32]; } pi_block_iq1_m;
/* One IQ1 sub-block: its 4 grid indices, each point's delta sign (+1 or -1) and ls of its halves */
typedef struct { int idx[4], delta[4], ls[2]; } pi_iq1_sub;
static inline void pi_iq1_s_sub(const pi_block_iq1_s *b, int j, pi_iq1_sub *o) {
    const int h = b->qh[j];
    for (int l = 0; l < 4; l++) {
        o->idx[l] = b->qs[4 * j + l] | (h >> 3 * l & 7) << 8;
        o->delta[l] = h & 0x8000 ? -1 : 1;
    }
    o->ls[0] = o->ls[1] = 2 * (h >> 12 & 7) + 1;
}
static inline uint16_t pi_iq1_m_scales(const pi_block_iq1_m *b, int k) {
    uint16_t s;
    memcpy(&s, b->scales + 2 * k, 2);
    return s;
}
static inline void pi_iq1_m_sub(const pi_block_iq1_m *b, int j, pi_iq1_sub *o) {
    for (int l = 0; l < 4; l++) {
        const int h = b->qh[2 * j + l / 2] >> 4 * (l % 2);
        o->idx[l] = b->qs[4 * j + l] | (h & 7) << 8;
        o->delta[l] = h & 8 ? -1 : 1;
    }
    const int s = pi_iq1_m_scales(b, j / 2) >> 6 * (j % 2);
    o->ls[0] = 2 * (s & 7) + 1;
    o->ls[1] = 2 * (s >> 3 & 7) + 1;
}
/* A block's fp16 d field (the accessor where IQ1_M needs pi_iq1_m_d) */
#define PI_BLOCK_D(block) ((block)->d)
/* IQ1_M's fp16 d, from the top nibbles of its four scale words */
static inline uint16_t pi_iq1_m_d(const pi_block_iq1_m *b) {
    return (uint16_t)(pi_iq1_m_scales(b, 0) >> 12 | (pi_iq1_m_scales(b, 1) >> 8 & 0x00f0) |
                      (pi_iq1_m_scales(b, 2) >> 4 & 0x0f00) | (pi_iq1_m_scales(b, 3) & 0xf000));
}
/* element k (0..31) of a decoded sub-block: v = 8 g + delta */
static inline int pi_iq1_value(const uint64_t *grid, const pi_iq1_sub *sb, int k) {
    return 8 * (int8_t)(grid[sb->idx[k / 8]] >> 8 * (k % 8) & 255) + sb->delta[k / 8];
}

/* Q8_KW (internal): IQ2 and IQ1 rows converted for prompts (pi_to_batch_fn, arch/vec_dot_k.c): per super-block the
 * values v (IQ2: grid value * sign, |v| <= 43; IQ1: 8 g + delta) as bytes u = v + 64, sc_j = ls of elements 16 j ..,
 * and d = the row's fp16 d times 1/8 as f32 (exact); value d sc_j (u - 64). 276 B */
typedef struct { uint8_t u[PI_QK_K]; int8_t scales[PI_QK_K / 16]; float d; } pi_block_q8_kw;
/* Q8_KWX16 (internal): 16 rows' Q8_KW super-blocks regrouped as Q6_KX16's words: 64-byte row i holds word i (row bytes
 * 4i..4i+3) of each row (u: words 0..63, scales 64..67, d 68). 16 x 276 B */
typedef struct { uint8_t words[69][64]; } pi_block_q8_kwx16;

/* Q2_K: 16 sub-blocks of 16; scales[j] = scale (low nibble) | min (high nibble). 84 B */
typedef struct { uint8_t scales[PI_QK_K / 16]; uint8_t qs[PI_QK_K / 4]; uint16_t d, dmin; } pi_block_q2_K;
/* Q2_KX16 (internal): 16 rows' Q2_K super-blocks, d and dmin as vectors of 16, then the rows' 20 words (scales: words
 * 0..3, qs: 4..19) as 64-byte rows of word i of each row (Q2_K prompt rows at the avx512 level). 16 x 84 B */
typedef struct { uint16_t d[16], dmin[16]; uint8_t words[20][64]; } pi_block_q2_Kx16;
/* Q3_K: 16 sub-blocks of 16, 6-bit signed scales (offset 32) packed in 12 bytes. 110 B */
typedef struct { uint8_t hmask[PI_QK_K / 8]; uint8_t qs[PI_QK_K / 4]; uint8_t scales[12]; uint16_t d; } pi_block_q3_K;
/* Q4_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes. 144 B */
typedef struct { uint16_t d, dmin; uint8_t scales[PI_K_SCALE_SIZE]; uint8_t qs[PI_QK_K / 2]; } pi_block_q4_K;
/* Q5_K: as Q4_K plus one high bit per element. 176 B */
typedef struct {
    uint16_t d, dmin; uint8_t scales[PI_K_SCALE_SIZE]; uint8_t qh[PI_QK_K / 8]; uint8_t qs[PI_QK_K / 2];
} pi_block_q5_K;
/* Q6_K: 16 sub-blocks of 16, int8 scales. 210 B */
typedef struct { uint8_t ql[PI_QK_K / 2]; uint8_t qh[PI_QK_K / 4]; int8_t scales[PI_QK_K / 16]; uint16_t d; } pi_block_q6_K;
/* Q8_K (activations): f32 d, 256 int8, sums of each 16 quants. 292 B */
typedef struct { float d; int8_t qs[PI_QK_K]; int16_t bsums[PI_QK_K / 16]; } pi_block_q8_K;
/* Q8_KM (activations of Q4_K/Q5_K, core-internal): a Q8_K block whose 8 sub-blocks of 32 have their own
 * step, an integer multiple of the block's: element i of sub-block j is k.d * m[j] * k.qs[i], 1 <= m[j] <=
 * PI_Q8_KM_M. One step per 256 (Q8_K) costs a sub-block far below the block's largest |x| most of its
 * resolution (Gemma's activations have outliers); m[j] = ceil(M amax_j / amax) gives it a step within
 * (1 + 1/(M amax_j / amax)) of its own amax_j / 127. The multipliers fold into the weights' sub-block
 * scales and mins (sc_j m_j, mn_j m_j, in int16), so the dot products stay exact integer sums per super-block
 * and cost one more int16 multiply per 8 scales. int32 budget of a Q5_K super-block: 256 * 31 * 127 * 63 * M
 * < 2^31 for M = 32. 308 B */
#define PI_Q8_KM_M 32
typedef struct { pi_block_q8_K k; int16_t m[PI_QK_K / 32]; } pi_block_q8_Km;
/* Q4_KX16 (core-internal, pi_repack): super-block b of Q4_K rows 16g..16g+15, the file's bytes regrouped (16 x 144
 * B: the same bytes per weight), so that every 64-byte row holds one 32-bit word of each of the 16 rows (lane r =
 * row r, the "transposed" form of the multi-row kernels): d, dmin as two vectors of 16 fp16; scales[w][4r + k] =
 * byte 4w + k of row r's 12 packed scale bytes (pi_k4_scale_min decodes them lane-wise); qs[8 jj + m][4r + k] =
 * byte 32 jj + 4m + k of row r's qs (jj < 4, m < 8): low nibbles of qs[8jj..8jj+7] are the AMX B tile of
 * sub-block 2jj, high nibbles that of 2jj + 1. arch/kx16.c. */
typedef struct { uint16_t d[16], dmin[16]; uint8_t scales[3][64]; uint8_t qs[32][64]; } pi_block_q4_Kx16;
/* Q5_KX16 (core-internal, pi_repack): the same regrouping of Q5_K super-blocks (16 x 176 B): d, dmin as vectors of
 * 16 fp16, then every 4-byte word of a row's block after them as one 64-byte row of the group, word i of row r at
 * words[i][4r..4r+3], in the row block's order; so the word at byte `off` (>= 4) of the row block is
 * words[(off - 4) / 4], and Q4_KX16's scales and qs are its words[0..2] and [3..34] the same way. arch/kx16.c. */
typedef struct { uint16_t d[16], dmin[16]; uint8_t words[43][64]; } pi_block_q5_Kx16;
/* Q6_KX16 (core-internal, pi_repack): the same regrouping of Q6_K super-blocks (16 x 210 B): d as a vector of 16
 * fp16, then the row block's 52 words before it (ql: words 0..31, qh: 32..47, scales: 48..51) as 52 x 64, word i of
 * row r at words[i][4r..4r+3]. arch/kx16.c. */
typedef struct { uint16_t d[16]; uint8_t words[52][64]; } pi_block_q6_Kx16;

/* Round to nearest, ties to even (llama.cpp's nearest_int for the values quantizers produce). */
static inline int pi_nearest_int(float v) { return (int)lrintf(v); }

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block. */
static inline void pi_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m  = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m  = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The signed 6-bit scale of sub-block j (0..15) of a Q3_K block. */
static inline int pi_k3_scale(int j, const uint8_t *s) {
    const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* ---- conversions (dtype_k.c) ---- */
void pi_q4_1_to_f32(const void *src, float *dst, int64_t n);
void pi_q5_0_to_f32(const void *src, float *dst, int64_t n);
void pi_q5_1_to_f32(const void *src, float *dst, int64_t n);
void pi_q8_1_to_f32(const void *src, float *dst, int64_t n);
void pi_q2_K_to_f32(const void *src, float *dst, int64_t n);
void pi_q3_K_to_f32(const void *src, float *dst, int64_t n);
void pi_q4_K_to_f32(const void *src, float *dst, int64_t n);
void pi_q5_K_to_f32(const void *src, float *dst, int64_t n);
void pi_q6_K_to_f32(const void *src, float *dst, int64_t n);
void pi_q8_K_to_f32(const void *src, float *dst, int64_t n);
void pi_q8_Km_to_f32(const void *src, float *dst, int64_t n);
void pi_iq4_nl_to_f32(const void *src, float *dst, int64_t n);
void pi_mxfp4_to_f32(const void *src, float *dst, int64_t n);
void pi_iq4_xs_to_f32(const void *src, float *dst, int64_t n);
void pi_iq3_xxs_to_f32(const void *src, float *dst, int64_t n);
void pi_iq3_s_to_f32(const void *src, float *dst, int64_t n);
void pi_iq2_xxs_to_f32(const void *src, float *dst, int64_t n);
void pi_iq2_xs_to_f32(const void *src, float *dst, int64_t n);
void pi_iq2_s_to_f32(const void *src, float *dst, int64_t n);
void pi_iq1_s_to_f32(const void *src, float *dst, int64_t n);
void pi_iq1_m_to_f32(const void *src, float *dst, int64_t n);

void pi_q4_1_from_f32(const float *src, void *dst, int64_t n);
void pi_q5_0_from_f32(const float *src, void *dst, int64_t n);
void pi_q5_1_from_f32(const float *src, void *dst, int64_t n);
void pi_iq4_nl_from_f32(const float *src, void *dst, int64_t n);
void pi_mxfp4_from_f32(const float *src, void *dst, int64_t n);
void pi_q8_1_from_f32(const float *src, void *dst, int64_t n);
void pi_q2_K_from_f32(const float *src, void *dst, int64_t n);
void pi_q3_K_from_f32(const float *src, void *dst, int64_t n);
void pi_q4_K_from_f32(const float *src, void *dst, int64_t n);
void pi_q5_K_from_f32(const float *src, void *dst, int64_t n);
void pi_q6_K_from_f32(const float *src, void *dst, int64_t n);
void pi_q8_K_from_f32(const float *src, void *dst, int64_t n);
/* (Q8_KM's quantizer is a kernel: arch/vec_dot_k.c, declared in arch/kernels.h) */

#endif
