/* dtype_k.c: row conversions of Q4_1, Q5_0, Q5_1, Q8_1 and the K-quants (scalar reference code).
 *
 * to_f32 follows the block layouts of spec section 8 (and quants_k.h). The quantizers
 * re-derive llama.cpp's reference quantizers (quantize_row_*_ref): the same search for
 * scales and mins, so that a row quantized here has the values llama.cpp's `quantize`
 * would give it without an importance matrix. */
#include "quants_k.h"
#include "quants_k_ref.h"
#include "iq_grids.h"

#include <string.h>


/* ======================================================================================
 * 32-element blocks
 * ====================================================================================== */

void pi_q4_1_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q4_1 *x = src;
    for (int64_t b = 0; b < n / PI_QK; b++, dst += PI_QK) {
        const float d = pi_fp16_to_f32(x[b].d), m = pi_fp16_to_f32(x[b].m);
        for (int j = 0; j < PI_QK / 2; j++) {
            dst[j]            = (float)(x[b].qs[j] & 0x0f) * d + m;
            dst[j + PI_QK / 2] = (float)(x[b].qs[j] >> 4) * d + m;
        }
    }
}

void pi_q5_0_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q5_0 *x = src;
    for (int64_t b = 0; b < n / PI_QK; b++, dst += PI_QK) {
        const float d = pi_fp16_to_f32(x[b].d);
        uint8_t u[PI_QK];
        pi_quants_5bit(x[b].qs, x[b].qh, u);
        for (int j = 0; j < PI_QK; j++) dst[j] = (float)(u[j] - 16) * d;
    }
}

/* IQ4_NL, MXFP4 (the grid kinds of quants_k.h's PI_NIB_*), IQ4_XS: the f32 operations of llama.cpp's dequantizers
 * (the block's scale times the value; IQ4_XS: d (ls - 32) first, then times the value) */
static inline void grid4_to_f32(const void *src, float *dst, int64_t n, const int kind) {
    const int64_t bb = pi_nib_block_bytes(kind), off = pi_nib_scale_bytes(kind);
    const int8_t *values = pi_nib_values(kind);
    const uint8_t *x = src;
    for (int64_t b = 0; b < n / PI_QK; b++, x += bb, dst += PI_QK) {
        const float d = pi_nib_scale(kind, x);
        for (int j = 0; j < PI_QK / 2; j++) {
            dst[j] = d * (float)values[x[off + j] & 15];
            dst[j + PI_QK / 2] = d * (float)values[x[off + j] >> 4];
        }
    }
}

void pi_iq4_nl_to_f32(const void *src, float *dst, int64_t n) { grid4_to_f32(src, dst, n, PI_NIB_IQ4_NL); }
void pi_mxfp4_to_f32(const void *src, float *dst, int64_t n) { grid4_to_f32(src, dst, n, PI_NIB_MXFP4); }

void pi_iq4_xs_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_iq4_xs *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        const float d = pi_fp16_to_f32(x[b].d);
        for (int j = 0; j < PI_QK_K / PI_QK; j++, dst += PI_QK) {
            const float dl = d * (float)pi_iq4_xs_scale(&x[b], j);
            const uint8_t *qs = x[b].qs + 16 * j;
            for (int k = 0; k < 16; k++) {
                dst[k] = dl * (float)PI_IQ4_VALUES[qs[k] & 15];
                dst[k + 16] = dl * (float)PI_IQ4_VALUES[qs[k] >> 4];
            }
        }
    }
}

/* IQ3_XXS, IQ3_S: the f32 operations of llama.cpp's dequantizers: the sub-block's step first (IQ3_XXS:
 * d (0.5 + s) 0.5, IQ3_S: d (1 + 2 s)), then times the grid value, then the sign */
void pi_iq3_xxs_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_iq3_xxs *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        const float d = pi_fp16_to_f32(x[b].d);
        for (int j = 0; j < PI_QK_K / PI_QK; j++, dst += PI_QK) {
            int ls;
            const uint32_t signs = pi_iq3_xxs_signs(&x[b], j, &ls);
            const float db = d * (0.5f + (float)(ls / 2)) * 0.5f;
            for (int k = 0; k < PI_QK; k++) {
                const float g = (float)(PI_IQ3_XXS_GRID[x[b].qs[8 * j + k / 4]] >> 8 * (k % 4) & 255);
                dst[k] = db * g * (signs >> k & 1 ? -1.0f : 1.0f);
            }
        }
    }
}

void pi_iq3_s_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_iq3_s *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        const float d = pi_fp16_to_f32(x[b].d);
        for (int j = 0; j < PI_QK_K / PI_QK; j++, dst += PI_QK) {
            const float db = d * (float)pi_iq3_s_ls(&x[b], j);
            for (int k = 0; k < PI_QK; k++) {
                const float g = (float)(PI_IQ3_S_GRID[pi_iq3_s_index(&x[b], 8 * j + k / 4)] >> 8 * (k % 4) & 255);
                dst[k] = db * g * (x[b].signs[4 * j + k / 8] >> k % 8 & 1 ? -1.0f : 1.0f);
            }
        }
    }
}

/* IQ2_XXS, IQ2_XS, IQ2_S: llama.cpp's f32 operations, d (0.5 + s) 0.25, then times the grid value, then the sign */
#define IQ2_TO_F32(name, wtype, grid)                                                                               \
    void pi_##name##_to_f32(const void *src, float *dst, int64_t n) {                                               \
        const wtype *x = src;                                                                                       \
        for (int64_t b = 0; b < n / PI_QK_K; b++) {                                                                 \
            const float d = pi_fp16_to_f32(x[b].d);                                                                 \
            for (int j = 0; j < PI_QK_K / PI_QK; j++, dst += PI_QK) {                                               \
                pi_iq2_sub sb;                                                                                      \
                pi_##name##_sub(&x[b], j, grid, &sb);                                                               \
                for (int k = 0; k < PI_QK; k++) {                                                                   \
                    const float db = d * (0.5f + (float)sb.s[k / 16]) * 0.25f;                                      \
                    const float g = (float)(sb.points[k / 8] >> 8 * (k % 8) & 255);                                 \
                    dst[k] = db * g * (sb.signs >> k & 1 ? -1.0f : 1.0f);                                           \
                }                                                                                                   \
            }                                                                                                       \
        }                                                                                                           \
    }
IQ2_TO_F32(iq2_xxs, pi_block_iq2_xxs, PI_IQ2_XXS_GRID)
IQ2_TO_F32(iq2_xs, pi_block_iq2_xs, PI_IQ2_XS_GRID)
IQ2_TO_F32(iq2_s, pi_block_iq2_s, PI_IQ2_S_GRID)

/* IQ1_S, IQ1_M: llama.cpp's f32 operations, d ls, then times (g + delta) = v / 8 (exact) */
#define IQ1_TO_F32(name, wtype, dfield)                                                                             \
    void pi_##name##_to_f32(const void *src, float *dst, int64_t n) {                                               \
        const wtype *x = src;                                                                                       \
        for (int64_t b = 0; b < n / PI_QK_K; b++) {                                                                 \
            const float d = pi_fp16_to_f32(dfield(&x[b]));                                                          \
            for (int j = 0; j < PI_QK_K / PI_QK; j++, dst += PI_QK) {                                               \
                pi_iq1_sub sb;                                                                                      \
                pi_##name##_sub(&x[b], j, &sb);                                                                     \
                for (int k = 0; k < PI_QK; k++)                                                                     \
                    dst[k] = d * (float)sb.ls[k / 16] * ((float)pi_iq1_value(PI_IQ1_GRID, &sb, k) * 0.125f);       \
            }                                                                                                       \
        }                                                                                                           \
    }
IQ1_TO_F32(iq1_s, pi_block_iq1_s, PI_BLOCK_D)
IQ1_TO_F32(iq1_m, pi_block_iq1_m, pi_iq1_m_d)

void pi_q5_1_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q5_1 *x = src;
    for (int64_t b = 0; b < n / PI_QK; b++, dst += PI_QK) {
        const float d = pi_fp16_to_f32(x[b].d), m = pi_fp16_to_f32(x[b].m);
        uint8_t u[PI_QK];
        pi_quants_5bit(x[b].qs, x[b].qh, u);
        for (int j = 0; j < PI_QK; j++) dst[j] = (float)u[j] * d + m;
    }
}

void pi_q8_1_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q8_1 *x = src;
    for (int64_t b = 0; b < n / PI_QK; b++, dst += PI_QK)
        for (int j = 0; j < PI_QK; j++) dst[j] = (float)x[b].qs[j] * x[b].d;
}

/* Q4_1: d = (max - min) / 15, m = min, q = round-half-up((x - min) / d) in [0, 15]. */
void pi_q4_1_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q4_1 *y = dst;
    for (int64_t b = 0; b < n / PI_QK; b++, src += PI_QK) {
        float min = src[0], max = src[0];
        for (int j = 1; j < PI_QK; j++) { min = fminf(min, src[j]); max = fmaxf(max, src[j]); }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pi_f32_to_fp16(d);
        y[b].m = pi_f32_to_fp16(min);
        for (int j = 0; j < PI_QK / 2; j++) {
            const int q0 = PI_MIN(15, (int)((src[j] - min) * id + 0.5f));
            const int q1 = PI_MIN(15, (int)((src[j + PI_QK / 2] - min) * id + 0.5f));
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q5_0: d = max / -16 (max = the element of largest magnitude), q = trunc(x / d + 16.5) in [0, 31]. */
void pi_q5_0_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q5_0 *y = dst;
    for (int64_t b = 0; b < n / PI_QK; b++, src += PI_QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < PI_QK; j++)
            if (fabsf(src[j]) > amax) { amax = fabsf(src[j]); max = src[j]; }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pi_f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < PI_QK / 2; j++) {
            const int q0 = PI_MAX(0, PI_MIN(31, (int)(src[j] * id + 16.5f)));
            const int q1 = PI_MAX(0, PI_MIN(31, (int)(src[j + PI_QK / 2] * id + 16.5f)));
            y[b].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        memcpy(y[b].qh, &qh, 4);
    }
}

/* Q5_1: d = (max - min) / 31, m = min, q = round-half-up((x - min) / d) in [0, 31]. */
void pi_q5_1_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q5_1 *y = dst;
    for (int64_t b = 0; b < n / PI_QK; b++, src += PI_QK) {
        float min = src[0], max = src[0];
        for (int j = 1; j < PI_QK; j++) { min = fminf(min, src[j]); max = fmaxf(max, src[j]); }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pi_f32_to_fp16(d);
        y[b].m = pi_f32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < PI_QK / 2; j++) {
            const int q0 = PI_MIN(31, (int)((src[j] - min) * id + 0.5f));
            const int q1 = PI_MIN(31, (int)((src[j + PI_QK / 2] - min) * id + 0.5f));
            y[b].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + 16);
        }
        memcpy(y[b].qh, &qh, 4);
    }
}

/* The index of the grid value nearest to x (PI_IQ4_VALUES ascending; a tie goes to the larger). */
static int iq4_nearest(float x) {
    int lo = 0, hi = 15;   /* values[lo] <= x < values[hi], narrowed by halves */
    if (x <= PI_IQ4_VALUES[0]) return 0;
    if (x >= PI_IQ4_VALUES[15]) return 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < PI_IQ4_VALUES[mid]) hi = mid;
        else lo = mid;
    }
    return x - (float)PI_IQ4_VALUES[lo] < (float)PI_IQ4_VALUES[hi] - x ? lo : hi;
}

/* IQ4_NL (a KV cache's rows: -ctk / -ctv iq4_nl; weights stay the file's): per block of 32, the block's largest
 * magnitude (with its sign) is mapped onto 15 points around the grid's far end (-127 + t, t = -7..7, llama.cpp's
 * search), each element rounded to the nearest grid value, and the scale refit by least squares with weights x^2;
 * the candidate of least weighted squared error wins (the largest (sum w q x)^2 / sum w q^2). The nibbles are then
 * rounded again against the fp16-rounded scale that is stored. */
void pi_iq4_nl_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_iq4_nl *y = dst;
    for (int64_t b = 0; b < n / PI_QK; b++, src += PI_QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < PI_QK; j++)
            if (fabsf(src[j]) > amax) { amax = fabsf(src[j]); max = src[j]; }
        float d = 0.0f, best = 0.0f;
        for (int t = -7; t <= 7 && amax > 0.0f; t++) {
            const float id = ((float)PI_IQ4_VALUES[0] + (float)t) / max;
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < PI_QK; j++) {
                const float q = (float)PI_IQ4_VALUES[iq4_nearest(src[j] * id)], w = src[j] * src[j];
                sumqx += w * q * src[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        y[b].d = pi_f32_to_fp16(d);
        const float ds = pi_fp16_to_f32(y[b].d), id = ds != 0.0f ? 1.0f / ds : 0.0f;
        for (int j = 0; j < PI_QK / 2; j++)
            y[b].qs[j] = (uint8_t)(iq4_nearest(src[j] * id) | iq4_nearest(src[j + PI_QK / 2] * id) << 4);
    }
}

/* MXFP4, llama.cpp's quantize_row_mxfp4_ref (gguf-py's MXFP4 quantizer gives the same bytes): per block of 32 the
 * largest magnitude amax sets e = floor(log2(amax)) - 2 + 127 (so 2^(e - 128) 12, the largest value, is 1.5 times
 * amax's power of two: the block's largest elements may be clipped to it), 0 for an all-zero block (and where
 * llama.cpp's conversion would leave uint8's range: 0 for amax below 2^-125, 252 for an infinite one), and each
 * element takes the first nibble of least |value - x|. */
void pi_mxfp4_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_mxfp4 *y = dst;
    for (int64_t b = 0; b < n / PI_QK; b++, src += PI_QK) {
        float amax = 0.0f;   /* NaN elements left out, as llama.cpp's loop leaves them */
        for (int j = 0; j < PI_QK; j++)
            if (amax < fabsf(src[j])) amax = fabsf(src[j]);
        const float e = amax > 0.0f ? floorf(log2f(amax)) - 2.0f + 127.0f : 0.0f;
        y[b].e = (uint8_t)PI_MIN(PI_MAX(e, 0.0f), 252.0f);   /* finite amax: e <= 252; an infinite one: 252 */
        const float d = pi_e8m0_half(y[b].e);
        for (int j = 0; j < PI_QK; j++) {
            int best = 0;
            float best_err = fabsf((float)PI_MXFP4_VALUES[0] * d - src[j]);
            for (int i = 1; i < 16; i++) {
                const float err = fabsf((float)PI_MXFP4_VALUES[i] * d - src[j]);
                if (err < best_err) { best = i; best_err = err; }
            }
            if (j < PI_QK / 2) y[b].qs[j] = (uint8_t)best;
            else y[b].qs[j - PI_QK / 2] |= (uint8_t)(best << 4);
        }
    }
}

/* Q8_1 (activations): d = amax / 127, q = rint(x * (127 / amax)) (ties to even, as Q8_0S: see
 * quantize_block_q8 in arch/vec_dot.c), s = d * sum(q). */
void pi_q8_1_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q8_1 *y = dst;
    for (int64_t b = 0; b < n / PI_QK; b++, src += PI_QK) {
        float amax = 0.0f;
        for (int j = 0; j < PI_QK; j++) amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < PI_QK; j++) {
            y[b].qs[j] = (int8_t)rintf(src[j] * id);
            sum += y[b].qs[j];
        }
        y[b].d = d;
        y[b].s = (float)sum * d;
    }
}

/* ======================================================================================
 * K-quants: dequantization
 * ====================================================================================== */

void pi_q2_K_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q2_K *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        const float d = pi_fp16_to_f32(x[b].d), dmin = pi_fp16_to_f32(x[b].dmin);
        for (int e = 0; e < PI_QK_K; e++) {          /* element e: 2 bits at qs[e/128*32 + e%32] >> 2*(e/32%4) */
            const int q = (x[b].qs[e / 128 * 32 + e % 32] >> (2 * (e / 32 % 4))) & 3;
            const uint8_t sc = x[b].scales[e / 16];
            *dst++ = d * (float)(sc & 0x0f) * (float)q - dmin * (float)(sc >> 4);
        }
    }
}

void pi_q3_K_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q3_K *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        const float d = pi_fp16_to_f32(x[b].d);
        for (int e = 0; e < PI_QK_K; e++) {          /* low 2 bits as Q2_K; high bit e/32 of hmask[e%32] */
            const int lo = (x[b].qs[e / 128 * 32 + e % 32] >> (2 * (e / 32 % 4))) & 3;
            const int hi = (x[b].hmask[e % 32] >> (e / 32)) & 1;
            *dst++ = d * (float)pi_k3_scale(e / 16, x[b].scales) * (float)(lo + 4 * hi - 4);
        }
    }
}

void pi_q4_K_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q4_K *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        const float d = pi_fp16_to_f32(x[b].d), dmin = pi_fp16_to_f32(x[b].dmin);
        for (int j = 0; j < PI_QK_K / 64; j++) {     /* 64 elements: low nibbles of qs[32j..], then high */
            uint8_t sc0, m0, sc1, m1;
            pi_k4_scale_min(2 * j, x[b].scales, &sc0, &m0);
            pi_k4_scale_min(2 * j + 1, x[b].scales, &sc1, &m1);
            const float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
            const uint8_t *q = x[b].qs + 32 * j;
            for (int l = 0; l < 32; l++) *dst++ = d0 * (float)(q[l] & 0x0f) - mm0;
            for (int l = 0; l < 32; l++) *dst++ = d1 * (float)(q[l] >> 4) - mm1;
        }
    }
}

void pi_q5_K_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q5_K *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        const float d = pi_fp16_to_f32(x[b].d), dmin = pi_fp16_to_f32(x[b].dmin);
        for (int j = 0; j < PI_QK_K / 64; j++) {     /* as Q4_K; high bits 2j and 2j+1 of qh[l] */
            uint8_t sc0, m0, sc1, m1;
            pi_k4_scale_min(2 * j, x[b].scales, &sc0, &m0);
            pi_k4_scale_min(2 * j + 1, x[b].scales, &sc1, &m1);
            const float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
            const uint8_t *q = x[b].qs + 32 * j;
            for (int l = 0; l < 32; l++)
                *dst++ = d0 * (float)((q[l] & 0x0f) | (((x[b].qh[l] >> (2 * j)) & 1) << 4)) - mm0;
            for (int l = 0; l < 32; l++)
                *dst++ = d1 * (float)((q[l] >> 4) | (((x[b].qh[l] >> (2 * j + 1)) & 1) << 4)) - mm1;
        }
    }
}

void pi_q6_K_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q6_K *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++, dst += PI_QK_K) {
        const float d = pi_fp16_to_f32(x[b].d);
        for (int h = 0; h < 2; h++) {                /* two halves of 128 (spec section 8) */
            const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
            const int8_t *sc = x[b].scales + 8 * h;
            float *y = dst + 128 * h;
            for (int l = 0; l < 32; l++) {
                const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l]      = d * (float)sc[l / 16 + 0] * (float)q1;
                y[l + 32] = d * (float)sc[l / 16 + 2] * (float)q2;
                y[l + 64] = d * (float)sc[l / 16 + 4] * (float)q3;
                y[l + 96] = d * (float)sc[l / 16 + 6] * (float)q4;
            }
        }
    }
}

void pi_q8_K_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q8_K *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++)
        for (int j = 0; j < PI_QK_K; j++) *dst++ = x[b].d * (float)x[b].qs[j];
}

void pi_q8_Km_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q8_Km *x = src;
    for (int64_t b = 0; b < n / PI_QK_K; b++)
        for (int j = 0; j < PI_QK_K; j++) *dst++ = x[b].k.d * (float)x[b].m[j / 32] * (float)x[b].k.qs[j];
}

/* ======================================================================================
 * K-quants: reference quantizers
 * ====================================================================================== */

/* Symmetric 3-bit scale with a few rounds of coordinate descent on the levels (Q3_K). */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax < PI_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    const float iscale = -(float)nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = pi_nearest_int(iscale * x[i]);
        l = PI_MAX(-nmax, PI_MIN(nmax - 1, l));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                int new_l = pi_nearest_int(x[i] * sl2 / slx);
                new_l = PI_MAX(-nmax, PI_MIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

void pi_q2_K_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q2_K *y = dst;
    uint8_t L[PI_QK_K], Laux[16];
    float weights[16], mins[PI_QK_K / 16], scales[PI_QK_K / 16];
    const float q4scale = 15.0f;
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < PI_QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(src[16 * j + l]);
            scales[j] = pi_qkx_quants(16, 3, src + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];   /* (not fmaxf: a -0 min must not win over 0) */
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < PI_QK_K / 16; j++)
                y[b].scales[j] = (uint8_t)PI_MAX(0, PI_MIN(15, pi_nearest_int(iscale * scales[j])));
            y[b].d = pi_f32_to_fp16(max_scale / q4scale);
        } else {
            memset(y[b].scales, 0, sizeof y[b].scales);
            y[b].d = pi_f32_to_fp16(0.0f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < PI_QK_K / 16; j++)
                y[b].scales[j] |= (uint8_t)(PI_MAX(0, PI_MIN(15, pi_nearest_int(iscale * mins[j]))) << 4);
            y[b].dmin = pi_f32_to_fp16(max_min / q4scale);
        } else {
            y[b].dmin = pi_f32_to_fp16(0.0f);
        }
        pi_q2k_requant(src, y[b].scales, y[b].d, y[b].dmin, L);
        for (int j = 0; j < PI_QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[b].qs[j / 4 + l] =
                    (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

void pi_q3_K_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q3_K *y = dst;
    int8_t L[PI_QK_K];
    float scales[PI_QK_K / 16];
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < PI_QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, src + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) { amax = fabsf(scales[j]); max_scale = scales[j]; }
        }
        memset(y[b].scales, 0, sizeof y[b].scales);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < PI_QK_K / 16; j++) {
                pi_k3_pack_scale(j, PI_MAX(-32, PI_MIN(31, pi_nearest_int(iscale * scales[j]))) + 32, y[b].scales);
            }
            y[b].d = pi_f32_to_fp16(1.0f / iscale);
        } else {
            y[b].d = pi_f32_to_fp16(0.0f);
        }
        pi_k3_requant(src, y[b].scales, y[b].d, L);
        memset(y[b].hmask, 0, sizeof y[b].hmask);
        for (int e = 0; e < PI_QK_K; e++) {       /* high bit of element e: bit e/32 of hmask[e%32] */
            if (L[e] > 3) {
                y[b].hmask[e % 32] |= (uint8_t)(1 << (e / 32));
                L[e] = (int8_t)(L[e] - 4);
            }
        }
        for (int j = 0; j < PI_QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[b].qs[j / 4 + l] =
                    (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

/* Q4_K and Q5_K share the scale search and the 6-bit packing of scales and mins. */
static void quantize_k45_scales(const float *src, int nmax, float rmin, int nstep, uint8_t *L, uint8_t packed[12],
                                uint16_t *d_out, uint16_t *dmin_out) {
    float mins[8], scales[8], weights[32];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += src[32 * j + l] * src[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(src[32 * j + l]);
        scales[j] = pi_qkx_quants(32, nmax, src + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep,
                                     false);
        if (scales[j] > max_scale) max_scale = scales[j];   /* (not fmaxf: llama.cpp keeps +0 over a -0 min) */
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)PI_MAX(0, PI_MIN(63, pi_nearest_int(inv_scale * scales[j])));
        lm[j] = (uint8_t)PI_MAX(0, PI_MIN(63, pi_nearest_int(inv_min * mins[j])));
    }
    pi_k45_pack_scales(ls, lm, packed);
    *d_out = pi_f32_to_fp16(max_scale / 63.0f);
    *dmin_out = pi_f32_to_fp16(max_min / 63.0f);
    pi_k45_requant(src, nmax, packed, *d_out, *dmin_out, L);
}

void pi_q4_K_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q4_K *y = dst;
    uint8_t L[PI_QK_K];
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        quantize_k45_scales(src, 15, -1.0f, 20, L, y[b].scales, &y[b].d, &y[b].dmin);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) y[b].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + l + 32] << 4));
    }
}

void pi_q5_K_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q5_K *y = dst;
    uint8_t L[PI_QK_K];
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        quantize_k45_scales(src, 31, -0.5f, 15, L, y[b].scales, &y[b].d, &y[b].dmin);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int j = 0; j < 4; j++) {
            for (int l = 0; l < 32; l++) {
                const int l1 = L[64 * j + l], l2 = L[64 * j + l + 32];
                y[b].qs[32 * j + l] = (uint8_t)((l1 & 0x0f) | ((l2 & 0x0f) << 4));
                y[b].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * j)) | ((l2 >> 4) << (2 * j + 1)));
            }
        }
    }
}

void pi_q6_K_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q6_K *y = dst;
    int8_t L[PI_QK_K];
    float scales[PI_QK_K / 16];
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < PI_QK_K / 16; j++) {
            float w[16];   /* weighted by x^2 (make_qx_quants' rmse_type 1) */
            for (int i = 0; i < 16; i++) w[i] = src[16 * j + i] * src[16 * j + i];
            scales[j] = pi_qx_quants(16, 32, src + 16 * j, L + 16 * j, w);
            if (fabsf(scales[j]) > max_abs_scale) { max_abs_scale = fabsf(scales[j]); max_scale = scales[j]; }
        }
        if (max_abs_scale < PI_GROUP_MAX_EPS) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[b].d = pi_f32_to_fp16(1.0f / iscale);
        for (int j = 0; j < PI_QK_K / 16; j++)
            y[b].scales[j] = (int8_t)PI_MAX(-128, PI_MIN(127, pi_nearest_int(iscale * scales[j])));
        pi_k6_requant_pack(src, y[b].scales, y[b].d, L, y[b].ql, y[b].qh);
    }
}

/* Q8_K (activations): d = max / -127 of the element of largest magnitude, q = nearest(x / d)
 * (so |q| <= 127), and the sums of each 16 quants for the K-quants' mins. */
void pi_q8_K_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q8_K *y = dst;
    for (int64_t b = 0; b < n / PI_QK_K; b++, src += PI_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < PI_QK_K; j++)
            if (fabsf(src[j]) > amax) { amax = fabsf(src[j]); max = src[j]; }
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < PI_QK_K; j++) y[b].qs[j] = (int8_t)PI_MAX(-127, PI_MIN(127, pi_nearest_int(iscale * src[j])));
        for (int j = 0; j < PI_QK_K / 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += y[b].qs[16 * j + i];
            y[b].bsums[j] = (int16_t)sum;
        }
        y[b].d = 1.0f / iscale;
    }
}
