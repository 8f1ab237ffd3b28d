/* quant_imatrix.c: quantizers with importance weights, llama.cpp's quantize_row_*_impl (ggml-quants.c) with
 * quant_weights: the weighted searches for scales and mins that llama-quantize runs when it has an importance matrix
 * (pi_quantize_rows_imatrix; without one, pi_quantize_row's reference quantizers, as llama.cpp). The arithmetic is
 * llama.cpp's operation for operation, in float (built with -ffp-contract=off like the rest of the core), so a row
 * quantized here has its bytes.
 *
 * IQ4_NL and IQ4_XS: llama.cpp's quantize_iq4_nl / quantize_iq4_xs, with or without weights (the files it writes
 * come from those searches, not from its reference quantizer, which the KV cache's IQ4_NL follows).
 *
 * Weights per element: qw_i * sqrt(sigma2 + x_i^2), sigma2 the mean of x^2 over the row (legacy types) or 2x that
 * over the super-block (Q3_K, Q4_K, Q5_K; Q2_K: 1x), except Q6_K, which takes qw as it is. */
#include "quant_iq.h"
#include "quants_k.h"
#include "quants_k_ref.h"

#include <math.h>
#include <stdint.h>
#include <string.h>


/* levels 0..nmax of non-negative x (the scales and mins of a super-block), weighted (make_qp_quants) */
static float qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *w) {
    float max = 0;
    for (int i = 0; i < n; i++) max = PI_MAX(max, x[i]);
    if (max < PI_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)pi_nearest_int(iscale * x[i]);
    const float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        const float diff = x[i] - scale * (float)L[i];
        best += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * (float)is + (float)nmax) / max, scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            const int l = PI_MIN(nmax, pi_nearest_int(iscale_is * x[i]));
            const float diff = x[i] - scale_is * (float)l;
            mse += w[i] * diff * diff;
        }
        if (mse < best) {
            best = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = PI_MIN(nmax, pi_nearest_int(iscale * x[i]));
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * (float)l;
        suml2 += w[i] * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * (float)L[i];
            float sl2 = suml2 - w[i] * (float)L[i] * (float)L[i];
            if (slx > 0 && sl2 > 0) {
                const int new_l = PI_MIN(nmax, pi_nearest_int(x[i] * sl2 / slx));
                if (new_l != L[i]) {
                    slx += w[i] * x[i] * (float)new_l;
                    sl2 += w[i] * (float)new_l * (float)new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static float sum_sq(const float *x, int64_t n) {
    float s = 0;
    for (int64_t j = 0; j < n; j++) s += x[j] * x[j];
    return s;
}

/* the importance weights q[l] sqrt(sigma2 + x[l]^2) of n elements into w; returns their sum (a sub-block's weight) */
static float weigh(const float *x, const float *q, float sigma2, int n, float *w) {
    float sumw = 0;
    for (int l = 0; l < n; l++) w[l] = q[l] * sqrtf(sigma2 + x[l] * x[l]);
    for (int l = 0; l < n; l++) sumw += w[l];
    return sumw;
}

/* ------------------------------------------------------------------ 32-element blocks */
static void q4_0_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q4_0 *y = dst;
    float w[32];
    int8_t L[32];
    const float sigma2 = sum_sq(x, n) / (float)n;
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b, *q = qw + 32 * b;
        weigh(xb, q, sigma2, 32, w);
        y[b].d = pi_f32_to_fp16(pi_qx_quants(32, 8, xb, L, w));
        for (int j = 0; j < 16; j++) y[b].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

static void q4_1_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q4_1 *y = dst;
    float w[32], min;
    uint8_t L[32], Laux[32];
    const float sigma2 = sum_sq(x, n) / (float)n;
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b, *q = qw + 32 * b;
        weigh(xb, q, sigma2, 32, w);
        const float d = pi_qkx_quants(32, 15, xb, w, L, &min, Laux, -0.9f, 0.05f, 36, false);
        y[b].d = pi_f32_to_fp16(d);
        y[b].m = pi_f32_to_fp16(-min);
        for (int j = 0; j < 16; j++) y[b].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

static void pack5(const uint8_t *L, uint8_t qs[16], uint8_t qh_out[4]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((L[j] & 0x0f) | ((L[j + 16] & 0x0f) << 4));
        qh |= (uint32_t)((L[j] & 0x10u) >> 4) << j;
        qh |= (uint32_t)((L[j + 16] & 0x10u) >> 4) << (j + 16);
    }
    memcpy(qh_out, &qh, 4);
}

static void q5_0_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q5_0 *y = dst;
    float w[32];
    int8_t L[32];
    const float sigma2 = sum_sq(x, n) / (float)n;
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b, *q = qw + 32 * b;
        weigh(xb, q, sigma2, 32, w);
        y[b].d = pi_f32_to_fp16(pi_qx_quants(32, 16, xb, L, w));
        pack5((const uint8_t *)L, y[b].qs, y[b].qh);
    }
}

static void q5_1_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q5_1 *y = dst;
    float w[32], min;
    uint8_t L[32], Laux[32];
    const float sigma2 = sum_sq(x, n) / (float)n;
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b, *q = qw + 32 * b;
        weigh(xb, q, sigma2, 32, w);
        const float d = pi_qkx_quants(32, 31, xb, w, L, &min, Laux, -0.9f, 0.05f, 36, false);
        y[b].d = pi_f32_to_fp16(d);
        y[b].m = pi_f32_to_fp16(-min);
        pack5(L, y[b].qs, y[b].qh);
    }
}

/* ------------------------------------------------------------------ K-quants */
static void pack2(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < PI_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

static void q2_K_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q2_K *y = dst;
    uint8_t L[PI_QK_K], Laux[16], Ls[16], Lm[16];
    float mins[16], scales[16], sw[16], w[16];
    for (int64_t b = 0; b < n / PI_QK_K; b++, x += PI_QK_K) {
        const float sigma2 = sum_sq(x, PI_QK_K) / PI_QK_K;
        for (int j = 0; j < 16; j++) {
            const float *q = qw + PI_QK_K * b + 16 * j;
            sw[j] = weigh(x + 16 * j, q, sigma2, 16, w);
            scales[j] = pi_qkx_quants(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
        }
        const float dm0 = qp_quants(16, 15, scales, Ls, sw), mm0 = qp_quants(16, 15, mins, Lm, sw);
        y[b].d = pi_f32_to_fp16(dm0);
        y[b].dmin = pi_f32_to_fp16(mm0);
        for (int j = 0; j < 16; j++) y[b].scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        pi_q2k_requant(x, y[b].scales, y[b].d, y[b].dmin, L);
        pack2(L, y[b].qs);
    }
}

static void q3_K_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q3_K *y = dst;
    int8_t L[PI_QK_K], Ls[16];
    float scales[16], w[16], sw[16];
    for (int64_t b = 0; b < n / PI_QK_K; b++, x += PI_QK_K) {
        const float sigma2 = 2 * sum_sq(x, PI_QK_K) / PI_QK_K;
        for (int j = 0; j < 16; j++) {
            const float *q = qw + PI_QK_K * b + 16 * j;
            sw[j] = weigh(x + 16 * j, q, sigma2, 16, w);
            scales[j] = pi_qx_quants(16, 4, x + 16 * j, L + 16 * j, w);
        }
        memset(y[b].scales, 0, 12);
        const float d_block = pi_qx_quants(16, 32, scales, Ls, sw);
        for (int j = 0; j < 16; j++) pi_k3_pack_scale(j, Ls[j], y[b].scales);
        y[b].d = pi_f32_to_fp16(d_block);
        pi_k3_requant(x, y[b].scales, y[b].d, L);
        memset(y[b].hmask, 0, sizeof y[b].hmask);
        for (int e = 0; e < PI_QK_K; e++)
            if (L[e] > 3) {
                y[b].hmask[e % 32] |= (uint8_t)(1 << (e / 32));
                L[e] = (int8_t)(L[e] - 4);
            }
        pack2((const uint8_t *)L, y[b].qs);
    }
}

/* Q4_K / Q5_K: levels 0..nmax per 32 with a min, the 8 scales and mins on 6 bits */
static void k45_row_block(const float *x, const float *qw, int nmax, uint8_t *L, uint8_t packed[12], uint16_t *d_out,
                          uint16_t *dmin_out) {
    uint8_t Laux[32], Ls[8], Lm[8];
    float w[32], sw[8], mins[8], scales[8];
    const float sigma2 = 2 * sum_sq(x, PI_QK_K) / PI_QK_K;
    for (int j = 0; j < 8; j++) {
        const float *q = qw + 32 * j;
        sw[j] = weigh(x + 32 * j, q, sigma2, 32, w);
        scales[j] = pi_qkx_quants(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
    }
    const float d_block = qp_quants(8, 63, scales, Ls, sw), m_block = qp_quants(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; j++) {
        Ls[j] = (uint8_t)PI_MIN(63, Ls[j]);
        Lm[j] = (uint8_t)PI_MIN(63, Lm[j]);
    }
    pi_k45_pack_scales(Ls, Lm, packed);
    *d_out = pi_f32_to_fp16(d_block);
    *dmin_out = pi_f32_to_fp16(m_block);
    pi_k45_requant(x, nmax, packed, *d_out, *dmin_out, L);
}

static void q4_K_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q4_K *y = dst;
    uint8_t L[PI_QK_K];
    for (int64_t b = 0; b < n / PI_QK_K; b++, x += PI_QK_K) {
        k45_row_block(x, qw + PI_QK_K * b, 15, L, y[b].scales, &y[b].d, &y[b].dmin);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) y[b].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + l + 32] << 4));
    }
}

static void q5_K_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q5_K *y = dst;
    uint8_t L[PI_QK_K];
    for (int64_t b = 0; b < n / PI_QK_K; b++, x += PI_QK_K) {
        k45_row_block(x, qw + PI_QK_K * b, 31, L, y[b].scales, &y[b].d, &y[b].dmin);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const int l1 = L[64 * j + l], l2 = L[64 * j + l + 32];
                y[b].qs[32 * j + l] = (uint8_t)((l1 & 0x0f) | ((l2 & 0x0f) << 4));
                y[b].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * j)) | ((l2 >> 4) << (2 * j + 1)));
            }
    }
}

static void q6_K_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_q6_K *y = dst;
    int8_t L[PI_QK_K];
    float scales[16];
    for (int64_t b = 0; b < n / PI_QK_K; b++, x += PI_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = pi_qx_quants(16, 32, x + 16 * j, L + 16 * j, qw + PI_QK_K * b + 16 * j);
            if (fabsf(scales[j]) > max_abs_scale) { max_abs_scale = fabsf(scales[j]); max_scale = scales[j]; }
        }
        if (max_abs_scale < PI_GROUP_MAX_EPS) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[b].d = pi_f32_to_fp16(1 / iscale);
        for (int j = 0; j < 16; j++) y[b].scales[j] = (int8_t)PI_MIN(127, pi_nearest_int(iscale * scales[j]));
        pi_k6_requant_pack(x, y[b].scales, y[b].d, L, y[b].ql, y[b].qh);
    }
}

/* ------------------------------------------------------------------ IQ4_NL, IQ4_XS */
/* the grid value nearest x (ties and the ends as llama.cpp's best_index_int8) */
static int iq4_index(float x) {
    const int8_t *v = PI_IQ4_VALUES;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid;
        else lo = mid;
    }
    return x - (float)v[hi - 1] < (float)v[hi] - x ? hi - 1 : hi;
}

/* One super-block of `sbs` values in sub-blocks of 32 (llama.cpp's quantize_row_iq4_nl_impl with ntry 7, what
 * quantize_iq4_nl / _xs run with or without weights): per sub-block the scale of 15 grids with the best weighted fit
 * (weights qw sqrt(sigma2 + x^2), or x^2 without qw); several sub-blocks: 6-bit scales of d = -max / 32. */
static void iq4_block(int sbs, const float *x, const float *qw, uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                      uint8_t *scales_l) {
    const int ntry = 7, nb = sbs / 32;
    float scales[PI_QK_K / 32], w[32];
    uint8_t L[PI_QK_K];
    float sigma2 = 0;
    for (int j = 0; j < sbs; j++) sigma2 += x[j] * x[j];
    sigma2 *= 2.0f / (float)sbs;
    memset(q4, 0, (size_t)sbs / 2);
    *dh = pi_f32_to_fp16(0.0f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nb; ib++) {
        const float *xb = x + 32 * ib;
        uint8_t *Lb = L + 32 * ib;
        for (int j = 0; j < 32; j++) w[j] = qw ? qw[32 * ib + j] * sqrtf(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(xb[j]) > amax) { amax = fabsf(xb[j]); max = xb[j]; }
        if (amax < PI_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / (float)PI_IQ4_VALUES[0], id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const int l = iq4_index(id * xb[j]);
            Lb[j] = (uint8_t)l;
            const float q = PI_IQ4_VALUES[l];
            sumqx += w[j] * q * xb[j];
            sumq2 += w[j] * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (float)(itry + PI_IQ4_VALUES[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const float q = PI_IQ4_VALUES[iq4_index(id * xb[j])];
                sumqx += w[j] * q * xb[j];
                sumq2 += w[j] * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) { amax_scale = fabsf(d); max_scale = d; }
    }
    if (nb > 1) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = pi_f32_to_fp16(d);
        const float id = d != 0.0f ? 1 / d : 0.0f;
        for (int ib = 0; ib < nb; ib++) {
            int l = PI_MAX(-32, PI_MIN(31, pi_nearest_int(id * scales[ib])));
            const float dl = d * (float)l, idl = dl != 0.0f ? 1 / dl : 0.0f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)iq4_index(idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0) scales_l[ib / 2] = (uint8_t)(l & 0x0f);
            else scales_l[ib / 2] |= (uint8_t)((l & 0x0f) << 4);
            *scales_h |= (uint16_t)((l >> 4) << (2 * (ib % 8)));
        }
    } else {
        *dh = pi_f32_to_fp16(scales[0]);
        const float id = scales[0] != 0.0f ? 1 / scales[0] : 0.0f;
        for (int j = 0; j < sbs; j++) L[j] = (uint8_t)iq4_index(id * x[j]);
    }
    for (int i = 0; i < sbs / 32; i++)
        for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

static void iq4_nl_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_iq4_nl *y = dst;
    for (int64_t b = 0; b < n / 32; b++)
        iq4_block(32, x + 32 * b, qw ? qw + 32 * b : NULL, &y[b].d, y[b].qs, NULL, NULL);
}

static void iq4_xs_row(const float *x, void *dst, int64_t n, const float *qw) {
    pi_block_iq4_xs *y = dst;
    for (int64_t b = 0; b < n / PI_QK_K; b++)
        iq4_block(PI_QK_K, x + PI_QK_K * b, qw ? qw + PI_QK_K * b : NULL, &y[b].d, y[b].qs, &y[b].scales_h,
                  y[b].scales_l);
}

typedef void (*row_fn)(const float *x, void *dst, int64_t n, const float *qw);

/* the quantizers llama.cpp's ggml_quantize_chunk runs whether or not it has weights (their reference quantizers are
 * other searches) */
static row_fn searched(int32_t type) {
    switch (type) {
    case PI_TYPE_IQ4_NL: return iq4_nl_row;
    case PI_TYPE_IQ4_XS: return iq4_xs_row;
    case PI_TYPE_IQ3_S: return pi_iq3_s_row;
    default: return NULL;
    }
}

static row_fn weighted(int32_t type) {
    switch (type) {
    case PI_TYPE_Q4_0: return q4_0_row;
    case PI_TYPE_Q4_1: return q4_1_row;
    case PI_TYPE_Q5_0: return q5_0_row;
    case PI_TYPE_Q5_1: return q5_1_row;
    case PI_TYPE_Q2_K: return q2_K_row;
    case PI_TYPE_Q3_K: return q3_K_row;
    case PI_TYPE_Q4_K: return q4_K_row;
    case PI_TYPE_Q5_K: return q5_K_row;
    case PI_TYPE_Q6_K: return q6_K_row;
    default: return NULL;
    }
}

pi_status pi_quantize_rows_imatrix(int32_t type, const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                                   const float *quant_weights) {
    if (nrows < 0 || n_per_row < 0) return pi_fail(PI_ERR_INVALID_ARG, "pi_quantize_rows_imatrix: negative size");
    if (n_per_row > 0 && nrows > INT64_MAX / n_per_row)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_quantize_rows_imatrix: too many values (%lld rows of %lld)",
                       (long long)nrows, (long long)n_per_row);
    const int64_t rb = pi_row_bytes(type, n_per_row);
    if (rb < 0)
        return pi_fail(PI_ERR_INVALID_ARG, "rows of %lld elements cannot be stored as type %d", (long long)n_per_row,
                       (int)type);
    row_fn f = searched(type);
    if (!f && quant_weights) f = weighted(type);
    if (type == PI_TYPE_IQ3_XXS) {   /* llama.cpp quantizes it without weights too; its ftypes require them */
        f = pi_iq3_xxs_row;
    }
    if ((type == PI_TYPE_IQ3_XXS || type == PI_TYPE_IQ3_S) && !pi_iq3_tables_ready(type))
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the %s grid tables", pi_type_name(type));
    if (!f) {
        if (quant_weights && type != PI_TYPE_Q8_0 && type != PI_TYPE_MXFP4)   /* llama.cpp ignores their weights */
            return pi_fail(PI_ERR_UNSUPPORTED, "type %s: no quantizer with importance weights here", pi_type_name(type));
        return pi_quantize_row(type, src, dst, nrows * n_per_row);
    }
    if (!src || !dst) return pi_fail(PI_ERR_INVALID_ARG, "NULL buffer");
    for (int64_t r = 0; r < nrows; r++) f(src + r * n_per_row, (char *)dst + r * rb, n_per_row, quant_weights);
    return PI_OK;
}
