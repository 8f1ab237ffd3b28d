/* q4_0c.c: the sparse down step read from the file's own Q4_0 matrix (PI_TYPE_Q4_0C), without re-quantizing it.
 *
 * An input-sparse product y = W h, W [n_out rows, n_in] in Q4_0 (one fp16 scale per output and 32 inputs), adds
 * h_i times input i's column for every input i with h_i != 0. The file's blocks run along the inputs, so a column
 * is not a row of the file, and the transposed copies the Q4_0R path reads (down_t, ffn_gate_t) are re-quantized
 * along the other axis. Q4_0C keeps the file's quants and scales and only lays them out by input:
 *
 *   scales (pi_sparse_ffn_weights.down_t_scales): per block b of 32 inputs, n_out fp16, [b][e] = W's block (e, b)
 *   row i (input i): n_out / 2 bytes; chunk c (outputs 64c .. 64c + 63) is 32 bytes, byte j holds q(64c + j) in
 *                    its low nibble and q(64c + 32 + j) in its high one (q = the file's 4-bit quant, 0..15)
 *
 * axpy_cols adds 1..32 rows k of one block b at once (aux: the block's scales for outputs 0..n): their
 * coefficients quantized together as one Q8_0 block as the dense path's activations (Q8_0S: M = max |a_k|,
 * S = M / 127 rounded to fp16, m_k = rint(a_k * 127 / M); all m_k = 0 where M is 0 or not finite, m_k = 0 where a_k
 * is NaN), an exact integer sum per output, one fma:
 *
 *   y[e] = fma(scales[b][e] * S, (float)(sum_k m_k (q_ke - 8)), y[e])
 *
 * That is the block term of the dense Q4_0 x Q8_0S dot product for the rows kept, to the bit where every row of
 * the block is (the dense path quantizes h by the same blocks): with every neuron kept the sparse step is the dense
 * one up to the f32 summation order. Per 64 outputs and two rows the AVX2 body is one byte interleave and
 * one maddubs per 32 outputs: about half the multiplies per weight of the dense one-token dot, none spent on
 * per-block coefficients (Q4_0R's axpy_group re-quantizes a_k d_kb for every row and 32 outputs). Every level
 * gives the scalar body's bits. n_out must be a multiple of 64, n_in of 32. */
#include "../internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* How far ahead (in chunks of 64 outputs: 32 bytes of a row) axpy_cols requests its rows. Up to 32 rows are read
 * side by side, more streams than a core's hardware prefetchers follow well: on a Sapphire Rapids (7B shape, half
 * the rows, 2 threads, ab_ops.py) 8 ahead made the input-sparse gate 0.85-0.87x the time and the CATS FFN's
 * 0.92x (4: 0.87x / 0.93x, 12: 0.91x / 0.96x; into L2 instead: 0.88x / 0.95x). On Intel
 * (pi_cpu_software_prefetch; Zen 5 too: the 7B shape's sparse FFN 0.86x the time); other AMD CPUs not measured. */
#define COLS_PREFETCH 8

/* More than COLS_ONE_PASS rows (up to 32: a block) are added in two passes of at most 16 over tiles of COLS_TILE
 * outputs on the CPUs where one weight stream per thread pays (pi_cpu_one_stream_decode: AMD Zen 3 and later),
 * instead of all rows side by side in one pass. Measured on a Zen 3 (7B shape, bench/ab_ops.py --op gate_t -t 1
 * --cpu-time, paired A/B): with 75% of the inputs kept (24 rows a block) the input-sparse gate took 0.74-0.78x the
 * time, with 50% 1.00x (two passes from 17 rows on: 1.09-1.11x there, hence 20); the CATS FFN at 75% of the channels
 * 0.95x, at 50% 1.03x (noise); the whole decode's gate-input levels (--gate-input-scale 0.5) ran 8-12% faster. Intel
 * (software prefetch, COLS_PREFETCH) and Zen 1 are not measured with it and keep one pass. */
#ifndef COLS_ONE_PASS
#define COLS_ONE_PASS 20
#endif
/* Outputs per tile of the two passes (their int32 sums: 64 KB on the stack). Long runs of each row per pass pay more
 * than sums that stay in L1: on the Zen 3 (7B shape, the input-sparse gate at 70% of the inputs, 11008 outputs, paired
 * A/B against 4096) 1024 took 1.41x the time, 2048 1.06x, 8192 0.98x, 16384 (whole rows) 0.94-0.96x with 2 threads and
 * 0.94-0.95x one thread's CPU time; passes of 8, 6 or 4 rows over whole rows instead of halves 0.99x, 1.08x, 1.15x. */
#ifndef COLS_TILE
#define COLS_TILE 16384
#endif

/* Block b (inputs 32b .. 32b + 31) of the Q4_0 matrix w (n_out rows of n_in, row stride w_stride bytes) ->
 * rows[k] (input 32b + k, n_out / 2 bytes each) and aux: the n_out fp16 scales. */
void pi_q4_0c_from_q4_0(int64_t n_out, const void *w, int64_t w_stride, int64_t b, void *const *rows, void *aux) {
    uint16_t *scales = aux;
    for (int64_t e0 = 0; e0 < n_out; e0 += 64)   /* chunk e0 / 64: byte j of a row from outputs e0 + j, e0 + 32 + j */
        for (int j = 0; j < 32; j++) {
            const pi_block_q4_0 *lo = (const pi_block_q4_0 *)((const char *)w + (e0 + j) * w_stride) + b;
            const pi_block_q4_0 *hi = (const pi_block_q4_0 *)((const char *)w + (e0 + 32 + j) * w_stride) + b;
            scales[e0 + j] = lo->d;
            scales[e0 + 32 + j] = hi->d;
            const int64_t at = e0 / 2 + j;   /* the byte in every row */
            for (int k = 0; k < 16; k++) {   /* Q4_0: byte k holds inputs k (low nibble) and k + 16 (high) */
                ((uint8_t *)rows[k])[at] = (uint8_t)((lo->qs[k] & 15) | (hi->qs[k] & 15) << 4);
                ((uint8_t *)rows[k + 16])[at] = (uint8_t)((lo->qs[k] >> 4) | (hi->qs[k] >> 4) << 4);
            }
        }
}

/* The group's int8 coefficients (count entries) and their step S; returns sum_k m_k. */
static inline int32_t cols_coefs(int count, const float *a, int8_t m[32], float *S) {
    float M = 0.0f;
    for (int k = 0; k < count; k++) M = fabsf(a[k]) > M ? fabsf(a[k]) : M;   /* NaN never wins */
    const bool ok = M > 0.0f && M <= FLT_MAX;
    const float id = ok ? 127.0f / M : 0.0f;
    *S = ok ? pi_fp16_to_f32(pi_f32_to_fp16(M / 127.0f)) : 0.0f;   /* as the dense path's Q8_0S activations */
    int32_t sum = 0;
    for (int k = 0; k < count; k++) {
        const float v = a[k] * id;
        sum += m[k] = (int8_t)(v == v ? rintf(v) : 0.0f);
    }
    return sum;
}

#if defined(__AVX2__)
/* unpacklo/hi work per 128-bit lane: the four int16 sums of a chunk hold outputs {0-7, 16-23}, {8-15, 24-31}, and the
 * same + 32; OUT[v] is the first output of their 8-output halves in widening order */
static const int OUT[8] = { 0, 16, 8, 24, 32, 48, 40, 56 };

/* The two-pass form's steps (the one-pass loop in pi_axpy_cols_q4_0c keeps the same arithmetic inline: written
 * through these helpers, GCC 12's code for it took 1.10-1.13x the time on the Zen 3, the input-sparse gate at 50%).
 * Chunk c (64 outputs) of rows [k0, k1) (at most 16, pairs: P[p] holds (m_2p, m_2p+1) in every 16-bit lane): the
 * exact int16 sums sum_k m_k q_ke, four vectors in the lane order above. */
static inline __attribute__((always_inline)) void chunk_sums(const uint8_t *const *r, const __m256i *P, int k0, int k1,
                                                             int64_t c, __m256i s[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int i = 0; i < 4; i++) s[i] = _mm256_setzero_si256();
    for (int k = k0; k < k1; k += 2) {   /* two rows' bytes side by side, then nibbles */
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(r[k] + 32 * c));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(r[k + 1] + 32 * c));
        const __m256i lo = _mm256_unpacklo_epi8(v0, v1), hi = _mm256_unpackhi_epi8(v0, v1);
        s[0] = _mm256_add_epi16(s[0], _mm256_maddubs_epi16(_mm256_and_si256(lo, m4), P[k / 2]));
        s[1] = _mm256_add_epi16(s[1], _mm256_maddubs_epi16(_mm256_and_si256(hi, m4), P[k / 2]));
        s[2] = _mm256_add_epi16(s[2], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(lo, 4), m4), P[k / 2]));
        s[3] = _mm256_add_epi16(s[3], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 4), m4), P[k / 2]));
    }
}

/* y[64c + OUT[v] ..] += scales * S * acc[v] (one fma per output). */
static inline __attribute__((always_inline)) void chunk_store(const uint16_t *scales, __m256 vS, int64_t c,
                                                              const __m256i acc[8], float *y) {
    for (int v = 0; v < 8; v++) {
        float *yp = y + 64 * c + OUT[v];
        const __m128i h = _mm_loadu_si128((const __m128i *)(scales + 64 * c + OUT[v]));
        const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(h), vS);
        _mm256_storeu_ps(yp, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(acc[v]), _mm256_loadu_ps(yp)));
    }
}
#endif

void pi_axpy_cols_q4_0c(int64_t n, int count, const uint8_t *idx, const float *a, const void *aux,
                        const void *const *rows, float *y) {
    PI_UNUSED(idx);   /* the coefficients are the rows' own: their places in the block do not matter */
    const uint16_t *scales = aux;
    int8_t m[32];
    float S;
    const int32_t msum = cols_coefs(count, a, m, &S);
#if defined(__AVX2__)
    const uint8_t *r[32];   /* an odd count is padded with the first row at m = 0 */
    const int n_rows = (count + 1) & ~1;
    if (count < n_rows) m[count] = 0;
    for (int k = 0; k < n_rows; k++) r[k] = rows[k < count ? k : 0];
    __m256i P[16];   /* rows 2p, 2p + 1: (m_2p, m_2p+1) in every 16-bit lane, maddubs' signed bytes */
    for (int p = 0; p < n_rows / 2; p++)
        P[p] = _mm256_set1_epi16((int16_t)(uint16_t)((uint8_t)m[2 * p] | (uint16_t)(uint8_t)m[2 * p + 1] << 8));
    const __m256i m4 = _mm256_set1_epi8(0x0f), neg_off = _mm256_set1_epi32(-8 * msum);
    const __m256 vS = _mm256_set1_ps(S);
    const bool ahead = pi_cpu_software_prefetch();   /* Intel, Zen 5: COLS_PREFETCH */
    if (n_rows > COLS_ONE_PASS && pi_cpu_one_stream_decode()) {
        /* Two passes of at most 16 rows over each tile of COLS_TILE outputs, the exact int32 sums kept between them:
         * the same integers, so the same bits. See COLS_ONE_PASS. */
        const int half = (n_rows / 2 + 1) & ~1;   /* n_rows is even: passes of half and n_rows - half rows */
        int32_t isum[COLS_TILE];
        for (int64_t e0 = 0; e0 < n; e0 += COLS_TILE) {
            const int64_t c0 = e0 / 64, c1 = PI_MIN(n, e0 + COLS_TILE) / 64;
            for (int k0 = 0; k0 < n_rows; k0 += half)
                for (int64_t c = c0; c < c1; c++) {
                    __m256i s[4];
                    chunk_sums(r, P, k0, PI_MIN(n_rows, k0 + half), c, s);
                    int32_t *is = isum + 64 * (c - c0);
                    for (int i = 0; i < 4; i++)
                        for (int h = 0; h < 2; h++) {
                            __m256i *at = (__m256i *)(is + OUT[2 * i + h]);
                            const __m256i w = _mm256_cvtepi16_epi32(h ? _mm256_extracti128_si256(s[i], 1)
                                                                      : _mm256_castsi256_si128(s[i]));
                            _mm256_storeu_si256(at, _mm256_add_epi32(k0 ? _mm256_loadu_si256(at) : neg_off, w));
                        }
                }
            for (int64_t c = c0; c < c1; c++) {
                __m256i acc[8];
                for (int v = 0; v < 8; v++)
                    acc[v] = _mm256_loadu_si256((const __m256i *)(isum + 64 * (c - c0) + OUT[v]));
                chunk_store(scales, vS, c, acc, y);
            }
        }
        return;
    }
    for (int64_t c = 0; c < n / 64; c++) {
        if (ahead && c % 2 == 0) {   /* each row's line, the scales' 4, COLS_PREFETCH chunks ahead */
            for (int k = 0; k < n_rows; k++) _mm_prefetch((const char *)(r[k] + 32 * (c + COLS_PREFETCH)), _MM_HINT_T0);
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(scales + 64 * (c + COLS_PREFETCH)) + 64 * l, _MM_HINT_T0);
        }
        __m256i acc[8];   /* int32: sum_k m_k (q_ke - 8) for the outputs OUT[v] .. OUT[v] + 7 */
        for (int v = 0; v < 8; v++) acc[v] = neg_off;
        for (int k0 = 0; k0 < n_rows; k0 += 16) {   /* int16 sums over at most 16 rows: |sum| <= 16 * 15 * 127 */
            __m256i s[4] = { _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                             _mm256_setzero_si256() };
            for (int k = k0; k < n_rows && k < k0 + 16; k += 2) {   /* two rows' bytes side by side, then nibbles */
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(r[k] + 32 * c));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(r[k + 1] + 32 * c));
                const __m256i lo = _mm256_unpacklo_epi8(v0, v1), hi = _mm256_unpackhi_epi8(v0, v1);
                s[0] = _mm256_add_epi16(s[0], _mm256_maddubs_epi16(_mm256_and_si256(lo, m4), P[k / 2]));
                s[1] = _mm256_add_epi16(s[1], _mm256_maddubs_epi16(_mm256_and_si256(hi, m4), P[k / 2]));
                s[2] = _mm256_add_epi16(s[2], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(lo, 4), m4),
                                                                   P[k / 2]));
                s[3] = _mm256_add_epi16(s[3], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 4), m4),
                                                                   P[k / 2]));
            }
            for (int i = 0; i < 4; i++) {
                acc[2 * i] = _mm256_add_epi32(acc[2 * i], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s[i])));
                acc[2 * i + 1] = _mm256_add_epi32(acc[2 * i + 1],
                                                  _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s[i], 1)));
            }
        }
        for (int v = 0; v < 8; v++) {
            float *yp = y + 64 * c + OUT[v];
            const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + 64 * c + OUT[v]))),
                                           vS);
            _mm256_storeu_ps(yp, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(acc[v]), _mm256_loadu_ps(yp)));
        }
    }
#elif PI_NEON
    /* per chunk of 64 outputs: int16 sums over runs of up to 16 rows (|m q| <= 127 * 15: 16 of them fit), widened
     * into int32 sums per output, then the scalar body's fma */
    const float32x4_t vS = vdupq_n_f32(S);
    const int32x4_t m8 = vdupq_n_s32(8 * msum);
    for (int64_t c = 0; c < n / 64; c++) {
        int32x4_t acc[16];   /* outputs 64c + 4i .. + 3 */
        for (int i = 0; i < 16; i++) acc[i] = vdupq_n_s32(0);
        for (int k0 = 0; k0 < count; k0 += 16) {
            int16x8_t s16[8];   /* outputs 64c + 8i .. + 7 */
            for (int i = 0; i < 8; i++) s16[i] = vdupq_n_s16(0);
            for (int k = k0; k < PI_MIN(count, k0 + 16); k++)
                pi_neon_mla_nibbles64(s16, (const uint8_t *)rows[k] + 32 * c, m[k]);
            for (int i = 0; i < 8; i++) {
                acc[2 * i] = vaddw_s16(acc[2 * i], vget_low_s16(s16[i]));
                acc[2 * i + 1] = vaddw_high_s16(acc[2 * i + 1], s16[i]);
            }
        }
        for (int i = 0; i < 16; i++) {
            const int64_t e = 64 * c + 4 * i;
            const float32x4_t d = vmulq_f32(pi_neon_load4_f16(scales + e), vS);
            vst1q_f32(y + e, vfmaq_f32(vld1q_f32(y + e), d, vcvtq_f32_s32(vsubq_s32(acc[i], m8))));
        }
    }
#else
    for (int64_t e = 0; e < n; e++) {
        const int64_t byte = e / 64 * 32 + e % 32, shift = e % 64 < 32 ? 0 : 4;
        int32_t sum = 0;
        for (int k = 0; k < count; k++) sum += m[k] * (((const uint8_t *)rows[k])[byte] >> shift & 15);
        y[e] = fmaf(pi_fp16_to_f32(scales[e]) * S, (float)(sum - 8 * msum), y[e]);
    }
#endif
}
