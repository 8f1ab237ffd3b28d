/* dtype.c: the dtype traits table and row conversions (scalar reference code). */
#include "internal.h"
#include "quants_k.h"

#include <math.h>

/* ---- conversions ---- */

static void f32_to_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
static void f32_from_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void f16_to_f32(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = pi_fp16_to_f32(s[i]);
}
static void f16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = pi_f32_to_fp16(src[i]);
}
static void bf16_to_f32(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = pi_bf16_to_f32(s[i]);
}
static void bf16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = pi_f32_to_bf16(src[i]);
}

/* Q4_0: d = max / -8 where max is the element of largest magnitude; q = clamp(x/d + 8.5). */
static void q4_0_from_f32(const float *src, void *dst, int64_t n) {
    pi_block_q4_0 *y = dst;
    for (int64_t b = 0; b < n / PI_QK4_0; b++) {
        const float *x = src + b * PI_QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < PI_QK4_0; j++) {
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pi_f32_to_fp16(d);
        for (int j = 0; j < PI_QK4_0 / 2; j++) {
            int q0 = (int)(x[j] * id + 8.5f);
            int q1 = (int)(x[j + PI_QK4_0 / 2] * id + 8.5f);
            q0 = PI_MIN(15, PI_MAX(0, q0));
            q1 = PI_MIN(15, PI_MAX(0, q1));
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}
/* Row k of one Q8_0X16 group (n elements): q8_0_to_f32 of the row the group was made from. */
static void q8_0x16_row_to_f32(const void *group, int k, float *dst, int64_t n) {
    const pi_block_q8_0x16 *g = group;
    for (int64_t b = 0; b < n / PI_QK8_0; b++) {
        const float d = pi_fp16_to_f32(g[b].d[k]);
        for (int e = 0; e < PI_QK8_0; e++) dst[b * PI_QK8_0 + e] = (float)g[b].qs[e / 4][4 * k + e % 4] * d;
    }
}

/* Row k of one Q5_0X16 group (n elements): pi_q5_0_to_f32 of the row the group was made from. */
static void q5_0x16_row_to_f32(const void *group, int k, float *dst, int64_t n) {
    const pi_block_q5_0x16 *g = group;
    for (int64_t b = 0; b < n / PI_QK; b++) {
        const float d = pi_fp16_to_f32(g[b].d[k]);
        for (int e = 0; e < PI_QK; e++) dst[b * PI_QK + e] = (float)(pi_q5_0x16_u(&g[b], k, e) - 16) * d;
    }
}

/* Row k of one Q4_1X16 / Q5_1X16 group (n elements): pi_q4_1_to_f32 / pi_q5_1_to_f32 of the row it was made from. */
static void q4_1x16_row_to_f32(const void *group, int k, float *dst, int64_t n) {
    const pi_block_q4_1x16 *g = group;
    for (int64_t b = 0; b < n / PI_QK; b++) {
        const float d = pi_fp16_to_f32(g[b].d[k]), m = pi_fp16_to_f32(g[b].m[k]);
        for (int e = 0; e < PI_QK; e++) dst[b * PI_QK + e] = (float)pi_x16_u(g[b].qs, NULL, k, e) * d + m;
    }
}

static void q5_1x16_row_to_f32(const void *group, int k, float *dst, int64_t n) {
    const pi_block_q5_1x16 *g = group;
    for (int64_t b = 0; b < n / PI_QK; b++) {
        const float d = pi_fp16_to_f32(g[b].d[k]), m = pi_fp16_to_f32(g[b].m[k]);
        for (int e = 0; e < PI_QK; e++) dst[b * PI_QK + e] = (float)pi_x16_u(g[b].qs, g[b].qh, k, e) * d + m;
    }
}

/* Row k of one F16X8 / BF16X8 group (n elements, a multiple of 8; pi_x8_index): the values of the row the group was
 * made from. */
static void f16x8_row_to_f32(const void *group, int k, float *dst, int64_t n) {
    const uint16_t *g = group;
    for (int64_t i = 0; i < n; i++) dst[i] = pi_fp16_to_f32(g[pi_x8_index(n, k, i)]);
}

static void bf16x8_row_to_f32(const void *group, int k, float *dst, int64_t n) {
    const uint16_t *g = group;
    for (int64_t i = 0; i < n; i++) dst[i] = pi_bf16_to_f32(g[pi_x8_index(n, k, i)]);
}

/* BF16S, the avx2 level's activations of bf16 weights (arch/bf16_dot.c): the bf16 values of a row split for its fma
 * steps, 8 bytes an element. Per 8-element chunk c, 16 floats at 16 c: the values of elements 8c+1, 8c+3, 8c+5, 8c+7
 * (the pairs' odd elements) twice, then of 8c, 8c+2, 8c+4, 8c+6 twice; the elements past n / 8 * 8 after the chunks,
 * one float each (the rest of the row zero). */
static void bf16s_from_f32(const float *src, void *dst, int64_t n) {
    float *d = dst;
    const int64_t n8 = n / 8 * 8;
    for (int64_t c = 0; c < n8 / 8; c++)
        for (int p = 0; p < 4; p++) {
            d[16 * c + p] = d[16 * c + 4 + p] = pi_bf16_to_f32(pi_f32_to_bf16(src[8 * c + 2 * p + 1]));
            d[16 * c + 8 + p] = d[16 * c + 12 + p] = pi_bf16_to_f32(pi_f32_to_bf16(src[8 * c + 2 * p]));
        }
    for (int64_t i = n8; i < n; i++) d[n8 + i] = pi_bf16_to_f32(pi_f32_to_bf16(src[i]));
    for (int64_t i = n; i < 2 * n - n8; i++) d[n8 + i] = 0.0f;
}

static void bf16s_to_f32(const void *src, float *dst, int64_t n) {
    const float *s = src;
    const int64_t n8 = n / 8 * 8;
    for (int64_t c = 0; c < n8 / 8; c++)
        for (int p = 0; p < 4; p++) {
            dst[8 * c + 2 * p + 1] = s[16 * c + p];
            dst[8 * c + 2 * p] = s[16 * c + 8 + p];
        }
    for (int64_t i = n8; i < n; i++) dst[i] = s[n8 + i];
}

/* ---- the table ---- */

/* What a type is (layout, conversions, activation type), whatever the CPU; the kernels come from the
 * active ISA level's table (pi_traits_fill). */
static const pi_type_traits formats[PI_TYPE_TABLE_END] = {
    /*               name    block bytes to_f32       from_f32          vec_dot_type */
    [PI_TYPE_F32]  = { "f32",  1,  4,  f32_to_f32,  f32_from_f32,     PI_TYPE_F32 },
    [PI_TYPE_F16]  = { "f16",  1,  2,  f16_to_f32,  f16_from_f32,     PI_TYPE_F32, .repacked_type = PI_TYPE_F16X8 },
    [PI_TYPE_BF16] = { "bf16", 1,  2,  bf16_to_f32, bf16_from_f32,    PI_TYPE_F32, .repacked_type = PI_TYPE_BF16X8 },
    [PI_TYPE_Q4_0] = { "q4_0", 32, 18, NULL /* arch */, q4_0_from_f32, PI_TYPE_Q8_0S, .repacked_type = PI_TYPE_Q4_0X8 },
    [PI_TYPE_Q8_0] = { "q8_0", 32, 34, NULL /* arch */, NULL /* arch */, PI_TYPE_Q8_0S, .repacked_type = PI_TYPE_Q8_0X16 },
    /* quants_k.h: conversions in dtype_k.c, kernels in arch/vec_dot_k.c */
    [PI_TYPE_Q4_1] = { "q4_1", 32,  20,  pi_q4_1_to_f32, pi_q4_1_from_f32, PI_TYPE_Q8_1,
                       .repacked_type = PI_TYPE_Q4_1X16 },
    [PI_TYPE_Q5_0] = { "q5_0", 32,  22,  pi_q5_0_to_f32, pi_q5_0_from_f32, PI_TYPE_Q8_0S,
                       .repacked_type = PI_TYPE_Q5_0X16 },
    [PI_TYPE_Q5_1] = { "q5_1", 32,  24,  pi_q5_1_to_f32, pi_q5_1_from_f32, PI_TYPE_Q8_1,
                       .repacked_type = PI_TYPE_Q5_1X16 },
    [PI_TYPE_Q8_1] = { "q8_1", 32,  40,  pi_q8_1_to_f32, pi_q8_1_from_f32, PI_TYPE_Q8_1 },
    [PI_TYPE_Q2_K] = { "q2_K", 256, 84,  pi_q2_K_to_f32, pi_q2_K_from_f32, PI_TYPE_Q8_K,
                       .batch_type = PI_TYPE_Q2_KX16, .batch_min_t = 12 /* where the level converts (avx512) */ },
    [PI_TYPE_Q3_K] = { "q3_K", 256, 110, pi_q3_K_to_f32, pi_q3_K_from_f32, PI_TYPE_Q8_K,
                       .batch_type = PI_TYPE_Q6_K, .batch_min_t = 32 /* on to Q6_KX16, where the level converts */ },
    [PI_TYPE_Q4_K] = { "q4_K", 256, 144, pi_q4_K_to_f32, pi_q4_K_from_f32, PI_TYPE_Q8_KM,
                       .repacked_type = PI_TYPE_Q4_KX16 },
    [PI_TYPE_Q5_K] = { "q5_K", 256, 176, pi_q5_K_to_f32, pi_q5_K_from_f32, PI_TYPE_Q8_KM,
                       .repacked_type = PI_TYPE_Q5_KX16 },
    [PI_TYPE_Q6_K] = { "q6_K", 256, 210, pi_q6_K_to_f32, pi_q6_K_from_f32, PI_TYPE_Q8_K,
                       .repacked_type = PI_TYPE_Q6_KX16 /* where the level has a repack kernel for it */,
                       .batch_type = PI_TYPE_Q6_KX16, .batch_min_t = 32 /* prompts where the level converts */ },
    [PI_TYPE_Q8_K] = { "q8_K", 256, 292, pi_q8_K_to_f32, pi_q8_K_from_f32, PI_TYPE_Q8_K },
    /* IQ4, IQ3, IQ2, IQ1 (read only: llama.cpp's files; no quantizer here) */
    [PI_TYPE_IQ4_NL] = { "iq4_nl", 32, 18, pi_iq4_nl_to_f32, pi_iq4_nl_from_f32, PI_TYPE_Q8_0S,
                         .repacked_type = PI_TYPE_IQ4_NLX8 },
    /* MXFP4 (gpt-oss's experts): IQ4_NL's kernels with MXFP4's grid and E8M0 scales (quants_k.h, PI_NIB_MXFP4) */
    [PI_TYPE_MXFP4] = { "mxfp4", 32, 17, pi_mxfp4_to_f32, pi_mxfp4_from_f32, PI_TYPE_Q8_0S,
                        .repacked_type = PI_TYPE_MXFP4X8 },
    [PI_TYPE_IQ4_XS] = { "iq4_xs", 256, 136, pi_iq4_xs_to_f32, NULL, PI_TYPE_Q8_K, .repacked_type = PI_TYPE_IQ4_XSX16 },
    [PI_TYPE_IQ3_XXS] = { "iq3_xxs", 256, 98, pi_iq3_xxs_to_f32, NULL, PI_TYPE_Q8_K, .batch_type = PI_TYPE_Q6_K },
    [PI_TYPE_IQ3_S]   = { "iq3_s", 256, 110, pi_iq3_s_to_f32, NULL, PI_TYPE_Q8_K, .batch_type = PI_TYPE_Q6_K },
    [PI_TYPE_IQ2_XXS] = { "iq2_xxs", 256, 66, pi_iq2_xxs_to_f32, NULL, PI_TYPE_Q8_K, .batch_type = PI_TYPE_Q8_KW },
    [PI_TYPE_IQ2_XS]  = { "iq2_xs", 256, 74, pi_iq2_xs_to_f32, NULL, PI_TYPE_Q8_K, .batch_type = PI_TYPE_Q8_KW },
    [PI_TYPE_IQ2_S]   = { "iq2_s", 256, 82, pi_iq2_s_to_f32, NULL, PI_TYPE_Q8_K, .batch_type = PI_TYPE_Q8_KW },
    [PI_TYPE_IQ1_S]   = { "iq1_s", 256, 50, pi_iq1_s_to_f32, NULL, PI_TYPE_Q8_K, .batch_type = PI_TYPE_Q8_KW },
    [PI_TYPE_IQ1_M]   = { "iq1_m", 256, 56, pi_iq1_m_to_f32, NULL, PI_TYPE_Q8_K, .batch_type = PI_TYPE_Q8_KW },
    /* internal types: activation formats (conversions in arch/), an interleaved weight layout (no row access:
     * no conversions, dot or axpy; block_bytes is per row so that sizes stay those of Q4_0), the sparse FFN's
     * packed rows */
    [PI_TYPE_Q8_0S]  = { "q8_0s", 32, 36, NULL, NULL, PI_TYPE_Q8_0S },
    [PI_TYPE_Q4_0X8] = { "q4_0x8", 32, 18, NULL, NULL, PI_TYPE_Q8_0S },
    [PI_TYPE_IQ4_NLX8] = { "iq4_nlx8", 32, 18, NULL, NULL, PI_TYPE_Q8_0S },   /* Q4_0X8's layout, IQ4_NL's values */
    [PI_TYPE_MXFP4X8] = { "mxfp4x8", 32, 17, NULL, NULL, PI_TYPE_Q8_0S },     /* Q4_0X8's order, MXFP4's bytes */
    [PI_TYPE_IQ4_XSX16] = { "iq4_xsx16", 256, 136, NULL, NULL, PI_TYPE_Q8_K },
    [PI_TYPE_Q8_KW]  = { "q8_kw", 256, 276, NULL, NULL, PI_TYPE_Q8_K,   /* IQ2, IQ1 rows for prompts (to_batch) */
                         .batch_type = PI_TYPE_Q8_KWX16, .batch_min_t = 32 /* where the level converts */ },
    [PI_TYPE_Q8_KWX16] = { "q8_kwx16", 256, 276, NULL, NULL, PI_TYPE_Q8_K },
    [PI_TYPE_Q2_KX16] = { "q2_Kx16", 256, 84, NULL, NULL, PI_TYPE_Q8_K },
    [PI_TYPE_BF16S] = { "bf16s", 1, 8, bf16s_to_f32, bf16s_from_f32, PI_TYPE_BF16S },
    [PI_TYPE_Q4_0R]  = { "q4_0r", 256, 144, NULL, NULL, PI_TYPE_Q8_0P, .tiles_act_type = PI_TYPE_Q8_0S },
    /* rows without scales: axpy_cols only */
    [PI_TYPE_Q4_0C]  = { "q4_0c", 64, 32, NULL, NULL, PI_TYPE_F32, .cols_unit = 32, .cols_aux = 2 },
    [PI_TYPE_Q4_KC]  = { "q4_kc", 64, 32, NULL, NULL, PI_TYPE_F32, .cols_unit = 256, .cols_aux = 20 },
    [PI_TYPE_Q6_KC]  = { "q6_kc", 64, 48, NULL, NULL, PI_TYPE_F32, .cols_unit = 256, .cols_aux = 18 },
    [PI_TYPE_Q8_0P]  = { "q8_0p", 256, 320, NULL, NULL, PI_TYPE_Q8_0P },
    [PI_TYPE_Q8_KM]  = { "q8_Km", 256, 308, pi_q8_Km_to_f32, NULL /* arch */, PI_TYPE_Q8_KM },
    [PI_TYPE_Q8_0X16] = { "q8_0x16", 32, 34, NULL, NULL, PI_TYPE_Q8_0S, .group_row_to_f32 = q8_0x16_row_to_f32 },
    [PI_TYPE_Q5_0X16] = { "q5_0x16", 32, 22, NULL, NULL, PI_TYPE_Q8_0S, .group_row_to_f32 = q5_0x16_row_to_f32 },
    [PI_TYPE_Q4_1X16] = { "q4_1x16", 32, 20, NULL, NULL, PI_TYPE_Q8_1, .group_row_to_f32 = q4_1x16_row_to_f32 },
    [PI_TYPE_Q5_1X16] = { "q5_1x16", 32, 24, NULL, NULL, PI_TYPE_Q8_1, .group_row_to_f32 = q5_1x16_row_to_f32 },
    [PI_TYPE_Q4_KX16] = { "q4_Kx16", 256, 144, NULL, NULL, PI_TYPE_Q8_KM },
    [PI_TYPE_Q5_KX16] = { "q5_Kx16", 256, 176, NULL, NULL, PI_TYPE_Q8_KM },
    [PI_TYPE_Q6_KX16] = { "q6_Kx16", 256, 210, NULL, NULL, PI_TYPE_Q8_K },
    /* blocks of 8 elements per row (n a multiple of 8) */
    [PI_TYPE_F16X8]  = { "f16x8", 8, 16, NULL, NULL, PI_TYPE_F32, .group_row_to_f32 = f16x8_row_to_f32 },
    [PI_TYPE_BF16X8] = { "bf16x8", 8, 16, NULL, NULL, PI_TYPE_F32, .group_row_to_f32 = bf16x8_row_to_f32 },
};

/* Type t's traits: its format, the level's kernels kt. */
void pi_traits_fill_one(int32_t t, const pi_type_kernels *kt, pi_type_traits *out) {
    *out = formats[t];
    out->vec_dot = kt->vec_dot;
    out->axpy = kt->axpy;
    out->vec_dot8 = kt->vec_dot8;
    out->axpy8 = kt->axpy8;
    out->axpy_group = kt->axpy_group;
    out->axpy_cols = kt->axpy_cols;
    out->cols_pack = kt->cols_pack;
    out->gemm8 = kt->gemm8;
    out->gemm16 = kt->gemm16;
    out->gemm_max_t = kt->gemm_max_t ? kt->gemm_max_t : PI_DOT8_MAX_T;
    out->repack = kt->repack;
    out->to_batch = kt->to_batch;
    if (!kt->to_batch) out->batch_type = 0;
    if (kt->repacked_type) out->repacked_type = kt->repacked_type;
    if (kt->vec_dot_type) out->vec_dot_type = kt->vec_dot_type;
    out->tiles = kt->tiles;
    out->tiles_rows = kt->tiles_rows;
    out->tiles_prep = kt->tiles_prep;
    out->tiles_unit = kt->tiles_unit;
    out->tiles_unit_bytes = kt->tiles_unit_bytes;
    if (kt->to_f32) out->to_f32 = kt->to_f32;
    if (kt->from_f32) out->from_f32 = kt->from_f32;
}

void pi_traits_fill(const pi_cpu_kernels *k, pi_type_traits out[PI_TYPE_TABLE_END]) {
    for (int32_t t = 0; t < PI_TYPE_TABLE_END; t++) pi_traits_fill_one(t, &k->type[t], &out[t]);
}
_Static_assert(sizeof(pi_block_q8_0s) == 36 && sizeof(pi_block_q4_0x8) == 8 * 18 &&
               sizeof(pi_block_q8_0x16) == 16 * 34 && sizeof(pi_block_q5_0x16) == 16 * 22 &&
               sizeof(pi_block_q4_1x16) == 16 * 20 && sizeof(pi_block_q5_1x16) == 16 * 24, "internal block sizes");

/* The block structs must have exactly the GGUF sizes. */
_Static_assert(sizeof(pi_block_q4_1) == 20 && sizeof(pi_block_q5_0) == 22 && sizeof(pi_block_q5_1) == 24 &&
               sizeof(pi_block_q8_1) == 40 && sizeof(pi_block_iq4_nl) == 18, "32-element block sizes");
_Static_assert(sizeof(pi_block_iq4_xs) == 136, "IQ4_XS block size");
_Static_assert(sizeof(pi_block_mxfp4) == 17 && sizeof(pi_block_mxfp4x8) == 8 * 17, "MXFP4 block sizes");
_Static_assert(sizeof(pi_block_iq3_xxs) == 98, "IQ3_XXS block size");
_Static_assert(sizeof(pi_block_iq3_s) == 110, "IQ3_S block size");
_Static_assert(sizeof(pi_block_iq2_xxs) == 66, "IQ2_XXS block size");
_Static_assert(sizeof(pi_block_iq2_xs) == 74, "IQ2_XS block size");
_Static_assert(sizeof(pi_block_iq2_s) == 82, "IQ2_S block size");
_Static_assert(sizeof(pi_block_iq1_s) == 50 && sizeof(pi_block_iq1_m) == 56, "IQ1 block sizes");
_Static_assert(sizeof(pi_block_q8_kw) == 276 && sizeof(pi_block_q8_kwx16) == 16 * 276, "Q8_KW block sizes");
_Static_assert(sizeof(pi_block_q2_Kx16) == 16 * 84, "Q2_KX16 block size");
_Static_assert(sizeof(pi_block_q2_K) == 84 && sizeof(pi_block_q3_K) == 110 && sizeof(pi_block_q4_K) == 144 &&
               sizeof(pi_block_q5_K) == 176 && sizeof(pi_block_q6_K) == 210 && sizeof(pi_block_q8_K) == 292 &&
               sizeof(pi_block_q8_Km) == 308 && sizeof(pi_block_q4_Kx16) == 16 * 144 &&
               sizeof(pi_block_q5_Kx16) == 16 * 176 && sizeof(pi_block_q6_Kx16) == 16 * 210,
               "K-quant block sizes");

const pi_type_traits *pi_traits(int32_t type) {
    if (type < 0 || type >= PI_TYPE_TABLE_END || formats[type].block_size == 0) return NULL;
    return pi_cpu_traits() + type;
}

/* GGUF weight types the core computes with (the internal types are not among them). */
int32_t pi_type_supported(int32_t type) { return type < PI_TYPE_COUNT && pi_traits(type) != NULL; }

const char *pi_type_name(int32_t type) {
    if (type == PI_TYPE_I32) return "i32";
    const pi_type_traits *t = pi_traits(type);
    return t ? t->name : "unknown";
}

int64_t pi_type_block_size(int32_t type) {
    if (type == PI_TYPE_I32) return 1;
    const pi_type_traits *t = pi_traits(type);
    return t ? t->block_size : 0;
}

int64_t pi_type_block_bytes(int32_t type) {
    if (type == PI_TYPE_I32) return 4;
    const pi_type_traits *t = pi_traits(type);
    return t ? t->block_bytes : 0;
}

int64_t pi_row_bytes(int32_t type, int64_t n) {
    const int64_t bs = pi_type_block_size(type), bb = pi_type_block_bytes(type);
    if (bs == 0 || n < 0 || n % bs != 0) return -1;
    if (n / bs > INT64_MAX / bb) return -1;   /* would overflow */
    return n / bs * bb;
}

/* quantize: from f32 (else to f32). GGUF types read from files only (the IQ types) convert to f32 alone. */
static pi_status check_conversion(int32_t type, const void *a, const void *b, int64_t n, bool quantize) {
    const pi_type_traits *t = pi_traits(type);
    const bool read_only = t && t->to_f32 && !t->from_f32 && type < PI_TYPE_COUNT;
    if (read_only && quantize)
        return pi_fail(PI_ERR_UNSUPPORTED, "type %s: no quantizer here (its files are read, not written)", t->name);
    if (!t || !t->to_f32 || (!t->from_f32 && !read_only))
        return pi_fail(PI_ERR_UNSUPPORTED, "unsupported type id %d", (int)type);
    if (!a || !b) return pi_fail(PI_ERR_INVALID_ARG, "NULL buffer");
    if (n < 0 || n % t->block_size != 0)
        return pi_fail(PI_ERR_INVALID_ARG, "%lld elements is not a multiple of the %s block size %lld",
                       (long long)n, t->name, (long long)t->block_size);
    return PI_OK;
}

pi_status pi_quantize_row(int32_t type, const float *src, void *dst, int64_t n) {
    pi_status st = check_conversion(type, src, dst, n, true);
    if (st != PI_OK) return st;
    pi_traits(type)->from_f32(src, dst, n);
    return PI_OK;
}

pi_status pi_dequantize_row(int32_t type, const void *src, float *dst, int64_t n) {
    pi_status st = check_conversion(type, src, dst, n, false);
    if (st != PI_OK) return st;
    pi_traits(type)->to_f32(src, dst, n);
    return PI_OK;
}
