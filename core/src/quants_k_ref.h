/* quants_k_ref.h: the steps the K-quant quantizers share, whether their scales come from the reference search
 * (dtype_k.c) or the importance-weighted one (quant_imatrix.c): the scale-and-min search, packing the sub-block
 * scales into a block's scale bytes, and re-quantizing each sub-block from the scales as stored (fp16 super-block scale times the packed
 * sub-block scale), as llama.cpp does, so the quants match the stored scales exactly. */
#ifndef PI_QUANTS_K_REF_H
#define PI_QUANTS_K_REF_H

#include "quants_k.h"

#define PI_GROUP_MAX_EPS 1e-15f   /* llama.cpp's GROUP_MAX_EPS: a group this small quantizes to zeros */

/* Scale and min for n values with levels 0..nmax: x ~ scale * L - the_min. Starts from
 * the min/max grid, then tries nstep+1 other grids (nmax + rmin + rdelta*is levels over
 * the range) and keeps the weighted least-squares fit (or least absolute deviation) with
 * the smallest weighted error: llama.cpp's make_qkx2_quants, and with use_mad false its make_qkx3_quants too (the
 * same steps), which the importance-weighted quantizers call. */
static inline float pi_qkx_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                                  uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1.0f / iscale;
    float best_err = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = pi_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)PI_MAX(0, PI_MIN(nmax, l));
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_err += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = pi_nearest_int(iscale * (x[i] - min));
            l = PI_MAX(0, PI_MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                err += weights[i] * diff;
            }
            if (err < best_err) {
                memcpy(L, Laux, (size_t)n);
                best_err = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* symmetric levels -nmax..nmax-1 (stored + nmax), weighted least squares over 19 grids (make_qx_quants, rmse_type
 * 1 with weights w) */
static inline float pi_qx_quants(int n, int nmax, const float *x, int8_t *L, const float *w) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax < PI_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -(float)nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = pi_nearest_int(iscale * x[i]);
        l = PI_MAX(-nmax, PI_MIN(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        sumlx += w[i] * x[i] * (float)l;
        suml2 += w[i] * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = pi_nearest_int(iscale * x[i]);
            l = PI_MAX(-nmax, PI_MIN(nmax - 1, l));
            sumlx += w[i] * x[i] * (float)l;
            suml2 += w[i] * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = pi_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + PI_MAX(-nmax, PI_MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q4_K / Q5_K: the 8 6-bit scales ls and mins lm (0..63) into the 12 packed bytes (pi_k4_scale_min's layout). */
static inline void pi_k45_pack_scales(const uint8_t ls[8], const uint8_t lm[8], uint8_t packed[12]) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            packed[j] = ls[j];
            packed[j + 4] = lm[j];
        } else {
            packed[j + 4] = (uint8_t)((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
            packed[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            packed[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* Q4_K / Q5_K: the 256 levels L (0..nmax) of x from the packed scales and the fp16 d, dmin; a sub-block of scale 0
 * keeps the levels it has. */
static inline void pi_k45_requant(const float *x, int nmax, const uint8_t packed[12], uint16_t d16, uint16_t dmin16,
                                  uint8_t *L) {
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        pi_k4_scale_min(j, packed, &sc, &m);
        const float d = pi_fp16_to_f32(d16) * (float)sc;
        if (d == 0.0f) continue;
        const float dm = pi_fp16_to_f32(dmin16) * (float)m;
        for (int i = 0; i < 32; i++) {
            const int l = pi_nearest_int((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)PI_MAX(0, PI_MIN(nmax, l));
        }
    }
}

/* Q2_K: the 256 levels L (0..3) of x from the 16 scale bytes (scale low nibble, min high nibble) and d, dmin. */
static inline void pi_q2k_requant(const float *x, const uint8_t scales[16], uint16_t d16, uint16_t dmin16, uint8_t *L) {
    for (int j = 0; j < 16; j++) {
        const float d = pi_fp16_to_f32(d16) * (float)(scales[j] & 0x0f);
        if (d == 0.0f) continue;
        const float dm = pi_fp16_to_f32(dmin16) * (float)(scales[j] >> 4);
        for (int i = 0; i < 16; i++) {
            const int l = pi_nearest_int((x[16 * j + i] + dm) / d);
            L[16 * j + i] = (uint8_t)PI_MAX(0, PI_MIN(3, l));
        }
    }
}

/* Q3_K: the 6-bit scale l (0..63, 32 for zero) of sub-block j (0..15) into the 12 scale bytes, which start zeroed
 * (pi_k3_scale's layout). */
static inline void pi_k3_pack_scale(int j, int l, uint8_t scales[12]) {
    if (j < 8) scales[j] = (uint8_t)(l & 0x0f);
    else       scales[j - 8] |= (uint8_t)((l & 0x0f) << 4);
    scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

/* Q3_K: the 256 levels L (0..7, the signed level + 4) of x from the packed scales and d. */
static inline void pi_k3_requant(const float *x, const uint8_t scales[12], uint16_t d16, int8_t *L) {
    for (int j = 0; j < 16; j++) {
        const float d = pi_fp16_to_f32(d16) * (float)pi_k3_scale(j, scales);
        if (d == 0.0f) continue;
        for (int i = 0; i < 16; i++) {
            const int l = pi_nearest_int(x[16 * j + i] / d);
            L[16 * j + i] = (int8_t)(PI_MAX(-4, PI_MIN(3, l)) + 4);
        }
    }
}

/* Q6_K: the 256 levels (0..63, the signed level + 32) of x from the 16 int8 scales and d into L, then packed: the low
 * 4 bits into ql (64 bytes a half of 128), the high 2 into qh (32 bytes a half). */
static inline void pi_k6_requant_pack(const float *x, const int8_t scales[16], uint16_t d16, int8_t *L, uint8_t *ql,
                                      uint8_t *qh) {
    for (int j = 0; j < 16; j++) {
        const float d = pi_fp16_to_f32(d16) * (float)scales[j];
        if (d == 0.0f) continue;
        for (int i = 0; i < 16; i++) {
            const int l = pi_nearest_int(x[16 * j + i] / d);
            L[16 * j + i] = (int8_t)(PI_MAX(-32, PI_MIN(31, l)) + 32);
        }
    }
    for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
        const int8_t *Lh = L + 128 * h;
        for (int l = 0; l < 32; l++) {
            const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
            ql[l]      = (uint8_t)((q1 & 0x0f) | ((q3 & 0x0f) << 4));
            ql[l + 32] = (uint8_t)((q2 & 0x0f) | ((q4 & 0x0f) << 4));
            qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
    }
}

#endif
