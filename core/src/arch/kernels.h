/* kernels.h: the kernels of arch/, declared static: each ISA level's translation unit (level.c)
 * compiles all of them with that level's instruction set and exports only its pi_cpu_kernels table, so
 * the same names exist once per level without clashing. Generic code reaches them through pi_cpu().
 * Include this before anything else that declares them (quants_k.h's conversions are generic code). */
#ifndef PI_ARCH_KERNELS_H
#define PI_ARCH_KERNELS_H

#include "../internal.h"

/* The 8-row kernels and the AVX2 bodies of the others need AVX2 + FMA + F16C: every level above scalar. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PI_HAVE_ROWS8 1
#else
#define PI_HAVE_ROWS8 0   /* the scalar level: mul_mat goes row by row (the same bits) */
#endif

/* The aarch64 levels neon (Armv8.0 Advanced SIMD) and dotprod (+ the Armv8.2 dot product, SDOT): NEON bodies for the
 * single-row kernels (arch/neon_util.h; without SDOT an exact emulation of it) and 8-row kernels over the file's rows
 * (4 rows a pass, lane k of a register for row k), no interleaved copies (level.c), the same bits. */
#if defined(__aarch64__) && defined(__ARM_NEON) && PI_LEVEL_AARCH64_SIMD
#define PI_NEON 1
#include "neon_util.h"
#else
#define PI_NEON 0
#endif

/* ---- dot products, activation quantizers, axpy (arch/vec_dot.c); each has a scalar body ---- */
static float pi_vec_dot_f32_f32(int64_t n, const void *w, const void *x);
static float pi_vec_dot_f16_f32(int64_t n, const void *w, const void *x);
static float pi_vec_dot_bf16_f32(int64_t n, const void *w, const void *x);
static float pi_vec_dot_bf16_bf16(int64_t n, const void *w, const void *x);   /* arch/bf16_dot.c: bf16 activations */
static float pi_vec_dot_bf16_bf16s(int64_t n, const void *w, const void *x);  /* avx2: split activations (BF16S) */
static void pi_vec_dot4_f16_f32(int64_t n, const void *const *rows, const float *x, float *out);
static void pi_vec_dot4_f32_f32(int64_t n, const void *const *rows, const float *x, float *out);
static void pi_attn_qk(int64_t hd, int nq, const float *const *q, int64_t c0, int64_t c1, const void *k,
                       int64_t k_stride, pi_to_f32_fn to_f32, float *const *s);
static void pi_attn_pv(int64_t hd, int nq, float *const *p, const float *inv, int64_t c0, int64_t c1, const void *v,
                       int64_t v_stride, pi_to_f32_fn to_f32, float *const *y);
static float pi_vec_dot_q4_0_q8_0s(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q8_0_q8_0s(int64_t n, const void *w, const void *x);
static void pi_quantize_row_q8_0(const float *src, void *dst, int64_t n);
static void pi_q4_0_to_f32(const void *src, float *dst, int64_t n);
static void pi_q8_0_to_f32(const void *src, float *dst, int64_t n);
static void pi_quantize_row_q8_0s(const float *src, void *dst, int64_t n);
static void pi_q8_0s_to_f32(const void *src, float *dst, int64_t n);
static void pi_repack8_q4_0x8(int64_t n, const void *const *rows, void *group);
static void pi_repack8_mxfp4x8(int64_t n, const void *const *rows, void *group);   /* rows8.c: Q4_0X8's order */
/* Q8_0X16 and Q5_0X16 groups at every level (arch/q8_0x16.c) */
static void pi_repack_q8_0x16(int64_t n, const void *const *rows, void *group);
static void pi_repack_q5_0x16(int64_t n, const void *const *rows, void *group);
static void pi_repack_q4_1x16(int64_t n, const void *const *rows, void *group);
static void pi_repack_q5_1x16(int64_t n, const void *const *rows, void *group);
static void pi_gemm16_q8_0x16_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);
static void pi_gemm16_q5_0x16_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);
static void pi_gemm16_q4_1x16_q8_1(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);
static void pi_gemm16_q5_1x16_q8_1(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);
/* Q4_KX16 and Q5_KX16 groups at every level (arch/kx16.c); x: Q8_KM */
static void pi_repack_q4_Kx16(int64_t n, const void *const *rows, void *group);
static void pi_repack_q5_Kx16(int64_t n, const void *const *rows, void *group);
static void pi_repack_iq4_xsx16(int64_t n, const void *const *rows, void *group);
static void pi_gemm16_iq4_xsx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                                     int64_t y_stride);
static void pi_gemm16_q4_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                   float *y, int64_t y_stride);
static void pi_gemm16_q5_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                   float *y, int64_t y_stride);
/* Q6_KX16 groups at every level (arch/kx16.c; x: Q8_K); only the AVX-512 levels make them at load (pi_repack_q6_Kx16
 * below; the amx level's prompts take them on tiles, pi_tiles_q6_Kx16_q8_K), the avx2 level for prompts (below) */
static void pi_gemm16_q6_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                   float *y, int64_t y_stride);
/* Q8_KWX16 groups at every level (arch/kx16.c; x: Q8_K); only the avx2 level makes them (IQ2 / IQ1 prompts) */
static void pi_gemm16_q8_kwx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);
static void pi_gemm16_q2_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                                   int64_t y_stride);
/* F16X8 and BF16X8 groups at every level (arch/vec_dot.c; layout: pi_x8_index) */
static void pi_repack_16bit_x8(int64_t n, const void *const *rows, void *group);
static void pi_gemm8_f16x8_f32(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                               int64_t y_stride);
static void pi_gemm8_bf16x8_f32(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                                int64_t y_stride);
static void pi_gemm8_bf16x8_bf16(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                                 int64_t y_stride);   /* arch/bf16_dot.c */
static void pi_gemm8_bf16x8_bf16s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                                  int64_t y_stride);
/* Q4_0X8 (IQ4_NLX8, MXFP4X8) groups at every level (the scalar body in rows8.c), so a repacked model runs at any
 * level. */
static void pi_gemm8_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                  float *y, int64_t y_stride);
static void pi_gemm8_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);
static void pi_gemm8_mxfp4x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                   float *y, int64_t y_stride);
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define PI_HAVE_ROWS16 1   /* 512-bit kernels over two 8-row groups */
static void pi_repack_q6_Kx16(int64_t n, const void *const *rows, void *group);
static void pi_gemm16_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                   float *y, int64_t y_stride);
static void pi_gemm16_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                     float *y, int64_t y_stride);
static void pi_gemm16_mxfp4x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);
#else
#define PI_HAVE_ROWS16 0
#endif
#if PI_HAVE_ROWS8
/* the x86 levels: Q6_K (IQ3's converted rows; the avx2 level's file rows) and Q8_KW rows -> 16-row groups for prompts
 * (mul_mat's batch path) */
static bool pi_q6_K_to_x16(int64_t k, const void *w, int64_t stride, int n, void *dst);
static bool pi_q3_K_to_q6_K(int64_t k, const void *w, int64_t stride, int n, void *dst);
static bool pi_q2_K_to_x16(int64_t k, const void *w, int64_t stride, int n, void *dst);
static bool pi_q8_kw_to_x16(int64_t k, const void *w, int64_t stride, int n, void *dst);
#endif
/* ---- AMX tile kernels (arch/amx.c); the amx level only ---- */
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
static void pi_tiles_begin(int32_t type, pi_tile_session *s);
static void pi_tiles_end(const pi_tile_session *s);
#define PI_TILES_ARGS const char *x, int64_t x_stride, int nt, float *y, int64_t y_stride, const char *xt, int64_t xt_stride
static void pi_tiles_q4_0x8_q8_0s(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_iq4_nlx8_q8_0s(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_mxfp4x8_q8_0s(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_q8_0x16_q8_0s(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_q5_0x16_q8_0s(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_q4_1x16_q8_1(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_q5_1x16_q8_1(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_q4_Kx16_q8_K(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_q5_Kx16_q8_K(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_q6_Kx16_q8_K(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_iq4_xsx16_q8_K(int64_t n, const void *group, PI_TILES_ARGS);
static void pi_tiles_rows_q8_0_q8_0s(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q5_0_q8_0s(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q4_0r_q8_0s(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q4_1_q8_1(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q5_1_q8_1(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q2_K_q8_K(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q3_K_q8_K(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q4_K_q8_K(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q5_K_q8_K(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q6_K_q8_K(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_iq4_xs_q8_K(int64_t n, const void *const *rows, PI_TILES_ARGS);
static void pi_tiles_rows_q8_kw_q8_K(int64_t n, const void *const *rows, PI_TILES_ARGS);
#undef PI_TILES_ARGS
/* the tile tables (pi_tiles_prep_fn) of the activation types Q8_0S, Q8_1, Q8_K, Q8_KM */
static void pi_tiles_prep_q8_0s(int64_t n, const void *row, int r, char *tile);
static void pi_tiles_prep_q8_1(int64_t n, const void *row, int r, char *tile);
static void pi_tiles_prep_q8_K(int64_t n, const void *row, int r, char *tile);
static void pi_tiles_prep_q8_Km(int64_t n, const void *row, int r, char *tile);
#endif
/* ---- 8-row kernels (arch/rows8.c, rows8_k.c, vec_dot.c); AVX2 and up, and these at the aarch64 levels too ---- */
#if PI_HAVE_ROWS8 || PI_NEON
static void pi_vec_dot8_q4_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                             float *y, int64_t y_stride);
static void pi_vec_dot8_iq4_nl_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                     float *y, int64_t y_stride);   /* rows8.c: Q4_0's kernel with the grid */
static void pi_vec_dot8_mxfp4_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);    /* the same with MXFP4's grid and scales */
static void pi_vec_dot8_f16_f32(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                          int64_t y_stride);
static void pi_vec_dot8_bf16_f32(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride);
static void pi_vec_dot8_bf16_bf16(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                                  int64_t y_stride);   /* arch/bf16_dot.c, levels with 8-row kernels */
static void pi_vec_dot8_bf16_bf16s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                   float *y, int64_t y_stride);
static void pi_vec_dot8_q8_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                   float *y, int64_t y_stride);   /* rows8_k.c */
static void pi_vec_dot8_q4_1_q8_1(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                  float *y, int64_t y_stride);
static void pi_vec_dot8_q5_1_q8_1(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                  float *y, int64_t y_stride);
static void pi_vec_dot8_q5_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                            float *y, int64_t y_stride);
static void pi_vec_dot8_q2_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                           float *y, int64_t y_stride);
static void pi_vec_dot8_q3_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                           float *y, int64_t y_stride);
static void pi_vec_dot8_q8_kw_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                   float *y, int64_t y_stride);
static void pi_vec_dot8_q4_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                           float *y, int64_t y_stride);
static void pi_vec_dot8_q5_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                           float *y, int64_t y_stride);
static void pi_vec_dot8_q6_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                           float *y, int64_t y_stride);
static void pi_vec_dot8_iq4_xs_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                    float *y, int64_t y_stride);
static void pi_axpy8_f16(int64_t n, const float *a, const void *const *rows, float *y);
#endif
#if PI_HAVE_ROWS8
static void pi_axpy8_q4_0(int64_t n, const float *a, const void *const *rows, float *y);
static void pi_axpy8_q8_0(int64_t n, const float *a, const void *const *rows, float *y);
#endif
/* ---- the sparse FFN's Q4_0 layout (arch/q4_0r.c); n a multiple of 256 ---- */
static void pi_q4_0r_from_q4_0(int64_t n, const void *src, void *dst);
static void pi_q4_0r_to_f32(const void *src, float *dst, int64_t n);
static void pi_quantize_row_q8_0p(const float *src, void *dst, int64_t n);
static void pi_q8_0p_to_f32(const void *src, float *dst, int64_t n);
static float pi_vec_dot_q4_0r_q8_0p(int64_t n, const void *w, const void *x);
static void pi_vec_dot8_q4_0r_q8_0p(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride);
static void pi_axpy_q4_0r(int64_t n, float a, const void *row, float *y);
static void pi_axpy_group_q4_0r(int64_t n, int count, const float *a, const void *const *rows, float *y);
/* ---- the file's Q4_0 matrix laid out by input, for the sparse down step (arch/q4_0c.c) ---- */
static void pi_q4_0c_from_q4_0(int64_t n_out, const void *w, int64_t w_stride, int64_t b, void *const *rows,
                               void *aux);
static void pi_axpy_cols_q4_0c(int64_t n, int count, const uint8_t *idx, const float *a, const void *aux,
                               const void *const *rows, float *y);
/* ---- the file's Q4_K / Q6_K matrix laid out by input, the same (arch/kc.c) ---- */
static void pi_q4_kc_from_q4_k(int64_t n_out, const void *w, int64_t w_stride, int64_t B, void *const *rows,
                               void *aux);
static void pi_axpy_cols_q4_kc(int64_t n, int count, const uint8_t *idx, const float *a, const void *aux,
                               const void *const *rows, float *y);
static void pi_q6_kc_from_q6_k(int64_t n_out, const void *w, int64_t w_stride, int64_t B, void *const *rows,
                               void *aux);
static void pi_axpy_cols_q6_kc(int64_t n, int count, const uint8_t *idx, const float *a, const void *aux,
                               const void *const *rows, float *y);
static float pi_dot_f32(int64_t n, const float *a, const float *b);
static void pi_axpy_f32(int64_t n, float a, const float *x, float *y);   /* y += a * x */
static void pi_axpy_f32_row(int64_t n, float a, const void *row, float *y);
static void pi_axpy_f16(int64_t n, float a, const void *row, float *y);
#if defined(__AVX2__) || PI_NEON
static void pi_f16_from_f32(const float *src, void *dst, int64_t n);   /* f32 -> f16 rows (the KV cache's stores) */
#endif
static void pi_axpy_bf16(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q4_0(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q8_0(int64_t n, float a, const void *row, float *y);
/* ---- activations (arch/activation.c) ---- */
static void pi_activation_row(int32_t op, int64_t n, const float *x, float *y);
static void pi_softcap_row(int64_t n, const float *x, float *y, float scale, float cap);
static float pi_softmax_exp(int64_t n, float *x, const float *mask, float scale, float softcap, float sink);
static void pi_swiglu_oai_row(int64_t n, const float *g, float *u, float alpha, float limit);


/* ---- dot products and axpy (arch/vec_dot_k.c), SIMD with scalar fallbacks ---- */
static float pi_vec_dot_q4_1_q8_1(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q5_0_q8_0s(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q5_1_q8_1(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q8_1_q8_1(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q2_K_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q3_K_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q4_K_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q5_K_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q6_K_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q8_K_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq4_nl_q8_0s(int64_t n, const void *w, const void *x);
static float pi_vec_dot_mxfp4_q8_0s(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq4_xs_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq3_xxs_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq3_s_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq2_xs_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq2_s_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq1_s_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_iq1_m_q8_K(int64_t n, const void *w, const void *x);
static float pi_vec_dot_q8_kw_q8_K(int64_t n, const void *w, const void *x);
static bool pi_iq2_xxs_to_q8_kw(int64_t k, const void *w, int64_t stride, int n, void *dst);
static bool pi_iq2_xs_to_q8_kw(int64_t k, const void *w, int64_t stride, int n, void *dst);
static bool pi_iq2_s_to_q8_kw(int64_t k, const void *w, int64_t stride, int n, void *dst);
static bool pi_iq1_s_to_q8_kw(int64_t k, const void *w, int64_t stride, int n, void *dst);
static bool pi_iq1_m_to_q8_kw(int64_t k, const void *w, int64_t stride, int n, void *dst);

static void pi_axpy_q4_1(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q5_0(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q5_1(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q8_1(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q2_K(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q3_K(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q4_K(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q5_K(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q6_K(int64_t n, float a, const void *row, float *y);
static void pi_axpy_q8_K(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq4_nl(int64_t n, float a, const void *row, float *y);
static void pi_axpy_mxfp4(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq4_xs(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq3_xxs(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq3_s(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq2_xxs(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq2_xs(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq2_s(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq1_s(int64_t n, float a, const void *row, float *y);
static void pi_axpy_iq1_m(int64_t n, float a, const void *row, float *y);
static bool pi_iq3_xxs_to_q6_K(int64_t k, const void *w, int64_t stride, int n, void *dst);
static bool pi_iq3_s_to_q6_K(int64_t k, const void *w, int64_t stride, int n, void *dst);
/* Q8_KM: the activations of Q4_K/Q5_K (quants_k.h), SIMD with the scalar bits */
static void pi_q8_Km_from_f32(const float *src, void *dst, int64_t n);
/* Q8_K: the activations of Q2_K/Q3_K/Q6_K, SIMD with the bits of dtype_k.c's pi_q8_K_from_f32 */
static void pi_quantize_row_q8_K(const float *src, void *dst, int64_t n);

#endif
