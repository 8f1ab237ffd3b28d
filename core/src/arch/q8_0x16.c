/* q8_0x16.c: Q8_0 weights interleaved 16 rows to a group (PI_TYPE_Q8_0X16, pi_block_q8_0x16), the layout
 * mul_mat reads fastest: a group is one contiguous stream, its quants are already in the "transposed" form the
 * multi-row kernels compute on (32-bit lane r of a 64-byte row m = elements 4m..4m+3 of row r), so no kernel
 * shuffles bytes, and each 64-byte row m is row m of an AMX B tile as it stands (amx_q8_0s.c).
 *
 * pi_gemm16_q8_0x16_q8_0s: one group (16 rows) x nt <= PI_DOT8_MAX_T tokens of Q8_0S activations, every level:
 * AVX-512 in 16 lanes, AVX2 as two halves of 8 rows, scalar loops. All follow Q8_0's canonical order
 * (pi_vec_dot_q8_0_q8_0s): per block the exact integer i = sum w y, then p[b % 8] = fma(d_w * d_x, i, p[b % 8])
 * in block order, and pi_tree8(p); so a repacked model gives the file layout's bits at every level.
 *
 * Why (Sapphire Rapids, one thread, weights in L2): the 8-row kernel on the file's layout spends its time
 * transposing (vec_dot8, 14.5 GB/s of Q8_0); see bench/README.md for this kernel's figures.
 *
 * No software prefetch: a group is one sequential stream, which the hardware prefetchers follow. Prefetching 3 of
 * the 9 lines of the block 4 ahead made one-token matmuls 1.1-1.27x slower on a Zen 4 at both the avx512 and the
 * avx2 level (Gemma 3 270M's Q8_0 head, the 542M Q8_0 layers; prompts unchanged); not measured on Intel. */
#include "../internal.h"
#include "../quants_k.h"

#include <math.h>
#include <string.h>

#if PI_HAVE_ROWS8
#include <immintrin.h>

#include "avx2_util.h"
#endif

void pi_repack_q8_0x16(int64_t n, const void *const *rows, void *group) {
    pi_interleave_blocks(n / PI_QK8_0, rows, 16, sizeof(pi_block_q8_0), group);
}

/* Q5_0 rows into the same layout, losslessly: a Q5_0 element is d (u - 16) with u in 0..31, so its Q8_0 block has the
 * same d and the quants u - 16. The kernels then compute Q5_0's canonical order exactly (per block the integer
 * sum (u - 16) y = sum u y - 16 s, then Q8_0's fma into p[b % 8]: amx_q8_0s.c names both orders), so the bits are the
 * file layout's. The copy takes 34 bytes per block where the file has 22 (1.55x): Q5_0 tensors are typically the
 * 256-indivisible rows of a K-quant mix (Gemma 3 270M's n_embd 640). */
void pi_repack_q5_0_q8_0x16(int64_t n, const void *const *rows, void *group) {
    for (int64_t b = 0; b < n / PI_QK; b++) {
        pi_block_q8_0 blk[16];
        const void *src[16];
        for (int k = 0; k < 16; k++) {
            const pi_block_q5_0 *x = (const pi_block_q5_0 *)rows[k] + b;
            uint8_t u[PI_QK];
            pi_quants_5bit(x->qs, x->qh, u);
            blk[k].d = x->d;
            for (int j = 0; j < PI_QK; j++) blk[k].qs[j] = (int8_t)(u[j] - 16);
            src[k] = &blk[k];
        }
        pi_interleave_blocks(1, src, 16, sizeof(pi_block_q8_0), (char *)group + b * 16 * (int64_t)sizeof(pi_block_q8_0));
    }
}

#if PI_HAVE_ROWS16
/* nt (1 or 2, a constant after inlining) tokens: 8 partial sums per token in registers (16 zmm at most) */
static inline __attribute__((always_inline)) void q8_0x16_tokens(int64_t nb, const pi_block_q8_0x16 *g,
                                                               const char *x, int64_t x_stride, const int nt,
                                                               float *y, int64_t y_stride) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512 p[2][8];
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < 8; j++) p[t][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g[b].d));
        __m512i u[8];   /* w + 128, unsigned: sum w y = sum (w + 128) y - 128 s */
        for (int m = 0; m < 8; m++) u[m] = _mm512_xor_si512(_mm512_loadu_si512(g[b].qs[m]), bias);
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
            const __m512i i = pi_dot16_q8_0s(u, xb, 128);
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(pi_fp16_to_f32(xb->d)));
            p[t][b % 8] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(i), p[t][b % 8]);
        }
    }
    for (int t = 0; t < nt; t++) {
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(p[t][0], p[t][4]), _mm512_add_ps(p[t][2], p[t][6])),
                                       _mm512_add_ps(_mm512_add_ps(p[t][1], p[t][5]), _mm512_add_ps(p[t][3], p[t][7])));
        _mm512_storeu_ps(y + t * y_stride, s);
    }
}

void pi_gemm16_q8_0x16_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) {
    PI_GEMM16_PAIRS(q8_0x16_tokens, n / PI_QK8_0, group, x, x_stride, nt, y, y_stride);
}

#elif PI_HAVE_ROWS8
/* AVX2: the group as two halves of 8 rows (bytes 0..31 and 32..63 of every row m), all nt tokens per pass so that
 * each weight register and its absolute value are made once for them, not once per token (542M Q8_0 prompt
 * matmuls: 0.80-0.90x the time on a Zen 3, bench/README.md), with the arithmetic of rows8_k.c's q8_0_dot8 (maddubs
 * of |w| against sign(y, w), widened at once); the partial sums p[b % 8] of each token live on the stack. */
static inline __attribute__((always_inline)) void q8_0x16_half(int64_t nb, const pi_block_q8_0x16 *g, const int half,
                                                               const char *x, int64_t x_stride, const int nt,
                                                               float *y, int64_t y_stride) {
    __m256 p[PI_DOT8_MAX_T][8];
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < 8; j++) p[t][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g[b].d + 8 * half)));
        __m256i s[PI_DOT8_MAX_T];
        for (int t = 0; t < nt; t++) s[t] = _mm256_setzero_si256();
        for (int m = 0; m < 8; m++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(g[b].qs[m] + 32 * half));
            const __m256i aw = _mm256_sign_epi8(w, w);
            for (int t = 0; t < nt; t++) {
                const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
                s[t] = pi_dpbusd(s[t], aw, _mm256_sign_epi8(_mm256_set1_epi32(pi_load_i32(xb->qs + 4 * m)), w));
            }
        }
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(pi_fp16_to_f32(xb->d)));
            p[t][b % 8] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s[t]), p[t][b % 8]);
        }
    }
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * y_stride, pi_tree8_ps(p[t]));
}

/* A kernel instance per token count (rows8_k.c's DISPATCH_NT): the per-token sums stay in registers. */
#define Q8X16_HALF(n, group, xt, xs, nt, yt, ys) q8_0x16_half((n) / PI_QK8_0, group, half, xt, xs, nt, yt, ys)
#define Q8X16_HALF_ONE(n, group, xt, yt) q8_0x16_half((n) / PI_QK8_0, group, half, xt, 0, 1, yt, 0)

static inline __attribute__((always_inline)) void q8_0x16_half_nt(int64_t n, const pi_block_q8_0x16 *rows,
                                                                  const int half, const char *x, int64_t x_stride,
                                                                  int nt, float *y, int64_t y_stride) {
    DISPATCH_NT(Q8X16_HALF, Q8X16_HALF_ONE, K_MAX_T);
}

void pi_gemm16_q8_0x16_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) {
    q8_0x16_half_nt(n, group, 0, x, x_stride, nt, y, y_stride);
    q8_0x16_half_nt(n, group, 1, x, x_stride, nt, y + 8, y_stride);
}

#else   /* scalar: the canonical order of pi_vec_dot_q8_0_q8_0s per (row, token) */

void pi_gemm16_q8_0x16_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) {
    const pi_block_q8_0x16 *g = group;
    for (int t = 0; t < nt; t++) {
        const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride);
        for (int r = 0; r < 16; r++) {
            float p[8] = { 0 };
            for (int64_t b = 0; b < n / PI_QK8_0; b++) {
                int32_t s = 0;
                for (int e = 0; e < PI_QK8_0; e++) s += g[b].qs[e / 4][4 * r + e % 4] * xb[b].qs[e];
                p[b % 8] = fmaf(pi_fp16_to_f32(g[b].d[r]) * pi_fp16_to_f32(xb[b].d), (float)s, p[b % 8]);
            }
            y[t * y_stride + r] = pi_tree8(p);
        }
    }
}

#endif
