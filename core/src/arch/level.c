/* level.c: one ISA level's kernels and their table.
 *
 * CMake compiles this file once per level with that level's instruction-set flags and
 * PI_LEVEL=<name> (scalar, avx2, avx512, amx; aarch64: scalar, neon, dotprod, i8mm): the arch/ sources are included here (amx.c only at the amx
 * level: the avx512 table plus the AMX tile kernels), so their
 * kernels (declared static in kernels.h) exist once per level without clashing, and the only
 * symbol a level exports is its table, pi_kernels_<name>. cpu.c picks the table at load time.
 * Inside the sources, `#if defined(__AVX2__)` and friends select each kernel's body for the level. */
#include "kernels.h"

#include "vec_dot.c"
#include "bf16_dot.c"
#include "vec_dot_k.c"
#include "rows8.c"
#include "rows8_k.c"
#include "q4_0r.c"
#include "q4_0c.c"
#include "kc.c"
#include "q8_0x16.c"
#include "kx16.c"
#include "activation.c"
#include "attention.c"
#include "gdn_rows.c"
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
#include "amx.c"        /* Q4_0X8, IQ4_NLX8, MXFP4X8 */
#include "amx_q8_0s.c"  /* Q8_0, Q5_0, Q4_1, Q5_1, Q4_0R rows, Q8_0X16, Q5_0X16 */
#include "amx_k.c"      /* Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_KW rows, Q4_KX16, Q5_KX16, Q6_KX16, IQ4_XSX16 */
#define AMX(kernel) kernel
#else
#define AMX(kernel) NULL     /* below the amx level: no tile kernels */
#define AMX_Q8_K_TABLE 0
#define AMX_Q8_KM_TABLE 0
#endif

#if PI_HAVE_ROWS16
#define ROWS16(kernel) kernel
#else
#define ROWS16(kernel) NULL
#endif
#if PI_HAVE_ROWS8
#define X16_BATCH(kernel) kernel   /* prompts' rows regrouped 16 at a time (the amx level: below a token tile, ops.c) */
#else
#define X16_BATCH(kernel) NULL
#endif
#if PI_HAVE_ROWS16
#define X16_BATCH_512(kernel) kernel   /* the same from avx512 on (Q3_K: at avx2 0.94-1.01x on a Zen 5, an AVX2-only CPU not measured) */
#else
#define X16_BATCH_512(kernel) NULL
#endif
#if PI_NEON
#define REPACK(kernel) NULL   /* no NEON kernels for the interleaved groups: the file's rows, 8 at a time */
#else
#define REPACK(kernel) kernel
#endif
#if PI_HAVE_ROWS8 && !PI_HAVE_ROWS16
#define BF16_DOT(kernel) kernel##s   /* avx2: bf16 weights against split activations (arch/bf16_dot.c) */
#define BF16_ACT PI_TYPE_BF16S
#else
#define BF16_DOT(kernel) kernel      /* bf16 activations: vdpbf16ps (avx512, amx), the steps (scalar, aarch64) */
#define BF16_ACT PI_TYPE_BF16
#endif
#if PI_HAVE_ROWS8 || PI_NEON
#define F16_FROM_F32 pi_f16_from_f32
#else
#define F16_FROM_F32 NULL   /* scalar: dtype.c's conversion */
#endif
#if PI_HAVE_ROWS8
#define ROWS8(kernel) kernel
#else
#define ROWS8(kernel) NULL   /* scalar and the aarch64 levels: row by row with vec_dot / axpy, the same bits */
#endif
#if PI_HAVE_ROWS8 || PI_NEON
#define ROWS8_NEON(kernel) kernel   /* an 8-row kernel the aarch64 levels have too */
#else
#define ROWS8_NEON(kernel) NULL
#endif

#define PI_TABLE_NAME(level) PI_TABLE_NAME_(level)
#define PI_TABLE_NAME_(level) pi_kernels_##level

const pi_cpu_kernels PI_TABLE_NAME(PI_LEVEL) = {
    .type = {
        /*                 vec_dot                   axpy */
        [PI_TYPE_F32]  = { pi_vec_dot_f32_f32,    pi_axpy_f32_row },
        [PI_TYPE_F16]  = { pi_vec_dot_f16_f32,    pi_axpy_f16,  .vec_dot8 = ROWS8_NEON(pi_vec_dot8_f16_f32),
                           .axpy8 = ROWS8_NEON(pi_axpy8_f16), .repack = REPACK(pi_repack_16bit_x8),
                           .from_f32 = F16_FROM_F32 },
        [PI_TYPE_BF16] = { pi_vec_dot_bf16_f32,   pi_axpy_bf16, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_bf16_f32),
                           .repack = REPACK(pi_repack_16bit_x8) },
        [PI_TYPE_Q4_0] = { pi_vec_dot_q4_0_q8_0s, pi_axpy_q4_0, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q4_0_q8_0s),
                           .axpy8 = ROWS8(pi_axpy8_q4_0), .repack = REPACK(pi_repack8_q4_0x8),
                           .to_f32 = pi_q4_0_to_f32 },
        [PI_TYPE_Q8_0] = { pi_vec_dot_q8_0_q8_0s,  pi_axpy_q8_0, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q8_0_q8_0s),
                           .axpy8 = ROWS8(pi_axpy8_q8_0),
                           .tiles_rows = AMX(pi_tiles_rows_q8_0_q8_0s),
                           .from_f32 = pi_quantize_row_q8_0, .to_f32 = pi_q8_0_to_f32,
                           .repack = REPACK(pi_repack_q8_0x16) },
        [PI_TYPE_Q4_1] = { pi_vec_dot_q4_1_q8_1,  pi_axpy_q4_1, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q4_1_q8_1),
                           .tiles_rows = AMX(pi_tiles_rows_q4_1_q8_1), .repack = REPACK(pi_repack_q4_1x16) },
        [PI_TYPE_Q5_0] = { pi_vec_dot_q5_0_q8_0s, pi_axpy_q5_0, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q5_0_q8_0s),
                           .tiles_rows = AMX(pi_tiles_rows_q5_0_q8_0s), .repack = REPACK(pi_repack_q5_0x16) },
        [PI_TYPE_Q5_1] = { pi_vec_dot_q5_1_q8_1,  pi_axpy_q5_1, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q5_1_q8_1),
                           .tiles_rows = AMX(pi_tiles_rows_q5_1_q8_1), .repack = REPACK(pi_repack_q5_1x16) },
        [PI_TYPE_Q8_1] = { pi_vec_dot_q8_1_q8_1,  pi_axpy_q8_1, .tiles_prep = AMX(pi_tiles_prep_q8_1),
                           .tiles_unit = PI_QK, .tiles_unit_bytes = 32 * sizeof(float) },
        [PI_TYPE_Q2_K] = { pi_vec_dot_q2_K_q8_K,  pi_axpy_q2_K, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q2_K_q8_K),
                           .tiles_rows = AMX(pi_tiles_rows_q2_K_q8_K), .to_batch = X16_BATCH_512(pi_q2_K_to_x16) },
        [PI_TYPE_Q3_K] = { pi_vec_dot_q3_K_q8_K,  pi_axpy_q3_K, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q3_K_q8_K),
                           .tiles_rows = AMX(pi_tiles_rows_q3_K_q8_K), .to_batch = X16_BATCH_512(pi_q3_K_to_q6_K) },
        [PI_TYPE_Q4_K] = { pi_vec_dot_q4_K_q8_K,  pi_axpy_q4_K, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q4_K_q8_K),
                           .tiles_rows = AMX(pi_tiles_rows_q4_K_q8_K), .repack = REPACK(pi_repack_q4_Kx16) },
        [PI_TYPE_Q5_K] = { pi_vec_dot_q5_K_q8_K,  pi_axpy_q5_K, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q5_K_q8_K),
                           .tiles_rows = AMX(pi_tiles_rows_q5_K_q8_K), .repack = REPACK(pi_repack_q5_Kx16) },
        [PI_TYPE_Q6_K] = { pi_vec_dot_q6_K_q8_K,  pi_axpy_q6_K, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q6_K_q8_K),
                           .tiles_rows = AMX(pi_tiles_rows_q6_K_q8_K), .repack = ROWS16(pi_repack_q6_Kx16),
                           .to_batch = X16_BATCH(pi_q6_K_to_x16) },
        [PI_TYPE_IQ4_NL] = { pi_vec_dot_iq4_nl_q8_0s, pi_axpy_iq4_nl, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_iq4_nl_q8_0s),
                             .repack = REPACK(pi_repack8_q4_0x8) /* the same block bytes */ },
        [PI_TYPE_MXFP4]  = { pi_vec_dot_mxfp4_q8_0s, pi_axpy_mxfp4, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_mxfp4_q8_0s),
                             .repack = REPACK(pi_repack8_mxfp4x8) },
        [PI_TYPE_IQ4_XS] = { pi_vec_dot_iq4_xs_q8_K, pi_axpy_iq4_xs, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_iq4_xs_q8_K),
                             .tiles_rows = AMX(pi_tiles_rows_iq4_xs_q8_K), .repack = REPACK(pi_repack_iq4_xsx16) },
        /* no 8-row kernels: prompts convert rows to Q6_K (to_batch) and run its kernels */
        [PI_TYPE_IQ3_XXS] = { pi_vec_dot_iq3_xxs_q8_K, pi_axpy_iq3_xxs, .to_batch = pi_iq3_xxs_to_q6_K },
        [PI_TYPE_IQ3_S]   = { pi_vec_dot_iq3_s_q8_K, pi_axpy_iq3_s, .to_batch = pi_iq3_s_to_q6_K },
        /* prompts convert rows to Q8_KW (to_batch) and run its kernels (IQ2, IQ1) */
        [PI_TYPE_IQ2_XXS] = { pi_vec_dot_iq2_xxs_q8_K, pi_axpy_iq2_xxs, .to_batch = pi_iq2_xxs_to_q8_kw },
        [PI_TYPE_IQ2_XS]  = { pi_vec_dot_iq2_xs_q8_K, pi_axpy_iq2_xs, .to_batch = pi_iq2_xs_to_q8_kw },
        [PI_TYPE_IQ2_S]   = { pi_vec_dot_iq2_s_q8_K, pi_axpy_iq2_s, .to_batch = pi_iq2_s_to_q8_kw },
        [PI_TYPE_IQ1_S]   = { pi_vec_dot_iq1_s_q8_K, pi_axpy_iq1_s, .to_batch = pi_iq1_s_to_q8_kw },
        [PI_TYPE_IQ1_M]   = { pi_vec_dot_iq1_m_q8_K, pi_axpy_iq1_m, .to_batch = pi_iq1_m_to_q8_kw },
        [PI_TYPE_Q8_K] = { pi_vec_dot_q8_K_q8_K,  pi_axpy_q8_K, .from_f32 = pi_quantize_row_q8_K,
                           .tiles_prep = AMX(pi_tiles_prep_q8_K),
                           .tiles_unit = PI_QK_K, .tiles_unit_bytes = AMX_Q8_K_TABLE },
        /* internal types */
        [PI_TYPE_Q8_0S]  = { .to_f32 = pi_q8_0s_to_f32, .from_f32 = pi_quantize_row_q8_0s,
                             .tiles_prep = AMX(pi_tiles_prep_q8_0s),
                             .tiles_unit = PI_QK8_0, .tiles_unit_bytes = 16 * sizeof(float) },
        [PI_TYPE_Q4_0X8] = { .gemm8 = pi_gemm8_q4_0x8_q8_0s, .gemm16 = ROWS16(pi_gemm16_q4_0x8_q8_0s),
                             .tiles = AMX(pi_tiles_q4_0x8_q8_0s) },
        [PI_TYPE_IQ4_NLX8] = { .gemm8 = pi_gemm8_iq4_nlx8_q8_0s, .gemm16 = ROWS16(pi_gemm16_iq4_nlx8_q8_0s),
                               .tiles = AMX(pi_tiles_iq4_nlx8_q8_0s) },
        [PI_TYPE_MXFP4X8] = { .gemm8 = pi_gemm8_mxfp4x8_q8_0s, .gemm16 = ROWS16(pi_gemm16_mxfp4x8_q8_0s),
                              .tiles = AMX(pi_tiles_mxfp4x8_q8_0s) },
        [PI_TYPE_IQ4_XSX16] = { .gemm16 = pi_gemm16_iq4_xsx16_q8_K, .tiles = AMX(pi_tiles_iq4_xsx16_q8_K) },
        [PI_TYPE_Q8_KW]  = { pi_vec_dot_q8_kw_q8_K, .vec_dot8 = ROWS8_NEON(pi_vec_dot8_q8_kw_q8_K),
                             .to_batch = X16_BATCH(pi_q8_kw_to_x16), .tiles_rows = AMX(pi_tiles_rows_q8_kw_q8_K) },
        [PI_TYPE_Q8_KWX16] = { .gemm16 = pi_gemm16_q8_kwx16_q8_K },
        [PI_TYPE_Q2_KX16] = { .gemm16 = pi_gemm16_q2_Kx16_q8_K },
        [PI_TYPE_F16X8]  = { .gemm8 = pi_gemm8_f16x8_f32, .gemm_max_t = HALF_X8_MAX_T },
        [PI_TYPE_BF16X8] = { .gemm8 = pi_gemm8_bf16x8_f32, .gemm_max_t = HALF_X8_MAX_T },
        [PI_TYPE_Q8_0X16] = { .gemm16 = pi_gemm16_q8_0x16_q8_0s, .tiles = AMX(pi_tiles_q8_0x16_q8_0s) },
        [PI_TYPE_Q5_0X16] = { .gemm16 = pi_gemm16_q5_0x16_q8_0s, .gemm_max_t = Q5X16_MAX_T,
                              .tiles = AMX(pi_tiles_q5_0x16_q8_0s) },
        [PI_TYPE_Q4_1X16] = { .gemm16 = pi_gemm16_q4_1x16_q8_1, .tiles = AMX(pi_tiles_q4_1x16_q8_1) },
        [PI_TYPE_Q5_1X16] = { .gemm16 = pi_gemm16_q5_1x16_q8_1, .tiles = AMX(pi_tiles_q5_1x16_q8_1) },
        [PI_TYPE_Q4_KX16] = { .gemm16 = pi_gemm16_q4_Kx16_q8_K, .tiles = AMX(pi_tiles_q4_Kx16_q8_K) },
        [PI_TYPE_Q5_KX16] = { .gemm16 = pi_gemm16_q5_Kx16_q8_K, .tiles = AMX(pi_tiles_q5_Kx16_q8_K) },
        [PI_TYPE_Q6_KX16] = { .gemm16 = pi_gemm16_q6_Kx16_q8_K, .tiles = AMX(pi_tiles_q6_Kx16_q8_K) },
        [PI_TYPE_Q4_0R]  = { pi_vec_dot_q4_0r_q8_0p, pi_axpy_q4_0r, .vec_dot8 = pi_vec_dot8_q4_0r_q8_0p,
                             .axpy_group = pi_axpy_group_q4_0r, .to_f32 = pi_q4_0r_to_f32,
                             .tiles_rows = AMX(pi_tiles_rows_q4_0r_q8_0s) },
        [PI_TYPE_Q4_0C]  = { .axpy_cols = pi_axpy_cols_q4_0c, .cols_pack = pi_q4_0c_from_q4_0 },
        [PI_TYPE_Q4_KC]  = { .axpy_cols = pi_axpy_cols_q4_kc, .cols_pack = pi_q4_kc_from_q4_k },
        [PI_TYPE_Q6_KC]  = { .axpy_cols = pi_axpy_cols_q6_kc, .cols_pack = pi_q6_kc_from_q6_k },
        [PI_TYPE_Q8_0P]  = { .to_f32 = pi_q8_0p_to_f32, .from_f32 = pi_quantize_row_q8_0p },
        [PI_TYPE_Q8_KM]  = { .from_f32 = pi_q8_Km_from_f32, .tiles_prep = AMX(pi_tiles_prep_q8_Km),
                             .tiles_unit = PI_QK_K, .tiles_unit_bytes = AMX_Q8_KM_TABLE },
    },
    .tiles_begin = AMX(pi_tiles_begin),
    .tiles_end = AMX(pi_tiles_end),
    .vec_dot4_f16_f32 = pi_vec_dot4_f16_f32,
    .vec_dot4_f32_f32 = pi_vec_dot4_f32_f32,
    .attn_qk = ROWS8(pi_attn_qk),
    .attn_pv = pi_attn_pv,
    .activation_row = pi_activation_row,
    /* bf16 weights in vdpbf16ps's arithmetic (arch/bf16_dot.c), which cpu.c puts in place of the entries above on a
     * CPU with AVX512_BF16 */
    .bf16_dp = { BF16_DOT(pi_vec_dot_bf16_bf16), pi_axpy_bf16, .vec_dot8 = ROWS8(BF16_DOT(pi_vec_dot8_bf16_bf16)),
                 .repack = REPACK(pi_repack_16bit_x8), .vec_dot_type = BF16_ACT },
    .bf16x8_dp = { .gemm8 = BF16_DOT(pi_gemm8_bf16x8_bf16), .vec_dot_type = BF16_ACT },
    .softcap_row = pi_softcap_row,
    .softmax_exp = pi_softmax_exp,
    .swiglu_oai_row = pi_swiglu_oai_row,
    .q4_0r_from_q4_0 = pi_q4_0r_from_q4_0,
    .gdn_rows = pi_gdn_rows,
};
