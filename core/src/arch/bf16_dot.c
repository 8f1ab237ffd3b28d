/* bf16_dot.c: bf16 weights (BF16 rows, BF16X8 groups) against bf16 activations, in the arithmetic of AVX512_BF16's
 * vdpbf16ps at every level, as llama.cpp computes them (its bf16 matmuls round the activations to bf16 too). cpu.c
 * puts these kernels (each level's pi_cpu_kernels.bf16_dp, bf16x8_dp) in place of the f32-activation ones
 * (arch/vec_dot.c) where the CPU has AVX512_BF16, at every level, or where POWERINFER_BF16_DOT=1 asks.
 *
 * The contract (docs/design.md): mul_mat rounds the activations to bf16 once (pi_f32_to_bf16, to nearest even). A
 * row's dot product keeps 8 lanes: lane l = 4 q + p takes pair p (elements 2p and 2p + 1) of every 8-element chunk c
 * with c % 2 == q, chunk after chunk, as two steps: acc = acc + w[2p+1] x[2p+1], then acc = acc + w[2p] x[2p]. A step
 * is one fused multiply-add rounded to nearest even, with subnormal inputs taken as zero and a result whose exact
 * value is below FLT_MIN in magnitude flushed to a zero of its sign (bf16_dp_step). Then pi_tree8 of the lanes and,
 * for a row whose length is not a multiple of 8, the last elements one by one, unfused.
 * That is vdpbf16ps's lane (the Intel SDM: odd element first, each step DAZ, FTZ, RNE), checked against the
 * instruction on a Zen 5 over 32M lanes with random operands, tiny and subnormal ones among them: the odd-first steps
 * agree on every lane once the flush looks at the exact result (checking the rounded one left 36 apart); even-first
 * steps or one rounding of both products disagree on millions.
 *
 * Levels: avx512 and amx run vdpbf16ps on bf16 activations (a ymm over a row's chunks 2k, 2k + 1 is lanes 0..7 as
 * they stand; a zmm over a BF16X8 half's chunk is lanes p of its 4 rows); asked for on an AVX-512 CPU without
 * AVX512_BF16, the avx512 level takes the avx2 level's kernels (cpu.c). The avx2 level runs the steps as f32 fmas with
 * MXCSR's FTZ and DAZ set around the lane loop (x86's flush judges the exact result: the same 32M lanes agree), on
 * activations split once per matmul (PI_TYPE_BF16S, dtype.c: per 8 elements the odd ones' values, then the even
 * ones', as f32, each four twice, so an fma reads them from memory as they stand): 1.25x the time of the f32 kernels
 * on a Zen 5 (the two steps of a lane depend on each other), one reason the contract stays off on CPUs without the
 * instruction. The tree and tail run after MXCSR is put back. The scalar (and the aarch64) levels spell the steps out
 * (bf16_dp_step), portable C. */
#include <float.h>
#include <math.h>
#include <string.h>

#if PI_HAVE_ROWS8
#include <immintrin.h>

#include "avx2_util.h"
#endif

/* bf16 -> f32 with a subnormal taken as a zero of its sign (DAZ) */
static inline float bf16_daz(uint16_t h) {
    return (h & 0x7f80) ? pi_bf16_to_f32(h) : pi_bf16_to_f32((uint16_t)(h & 0x8000));
}

/* One step of a vdpbf16ps lane: acc + w x, fused, DAZ in, FTZ out (the exact value below FLT_MIN: flushed). */
static inline float bf16_dp_step(float acc, uint16_t w, uint16_t x) {
    const float a = bf16_daz(w), b = bf16_daz(x);
    const float r = fmaf(a, b, acc);
    if (!(fabsf(r) <= FLT_MIN)) return r;                   /* normal, infinite or NaN */
    if (fabsf(r) < FLT_MIN) return copysignf(0.0f, r);      /* the exact value is below FLT_MIN too */
    /* |r| == FLT_MIN: flushed where the exact acc + a b lies below it (rounded up to it). a b is exact in double;
     * s + e is acc + a b exactly (TwoSum) */
    const double p = (double)a * (double)b, s = (double)acc + p, bs = s - (double)acc;
    const double e = ((double)acc - (s - bs)) + (p - bs);
    const int below = fabs(s) < FLT_MIN || (fabs(s) == FLT_MIN && e != 0.0 && (e < 0.0) != (s < 0.0));
    return below ? copysignf(0.0f, r) : r;
}

/* Element i >= n8 of an activation row in the level's format: the avx2 level's BF16S keeps those after the split
 * chunks, one f32 each; the others' rows are bf16. */
#if PI_HAVE_ROWS8 && !PI_HAVE_ROWS16
static inline float act_tail(const void *x, int64_t n8, int64_t i) { return ((const float *)x)[2 * n8 + (i - n8)]; }
#else
static inline float act_tail(const void *x, int64_t n8, int64_t i) { return pi_bf16_to_f32(((const uint16_t *)x)[i]); }
#endif

/* The lanes' tree, then the elements past n8 (a row of the file's layout only) one by one, unfused. */
static inline float bf16_lanes_end(const float lane[8], const uint16_t *w, const void *x, int64_t n8, int64_t n) {
    float sum = pi_tree8(lane);
    for (int64_t i = n8; i < n; i++) sum += pi_bf16_to_f32(w[i]) * act_tail(x, n8, i);
    return sum;
}

/* Lanes of an x8 kernel's accumulators -> lanes[k0 + k][t], k < rows: row k's lanes 4k..4k+3 of the chunks with
 * q = 0 (a0), then of those with q = 1 (a1) */
static inline void x8_rows_lanes(const float *a0, const float *a1, int rows, int k0, int t,
                                 float (*lanes)[PI_DOT8_MAX_T][8]) {
    for (int k = 0; k < rows; k++) {
        memcpy(lanes[k0 + k][t], a0 + 4 * k, 16);
        memcpy(lanes[k0 + k][t] + 4, a1 + 4 * k, 16);
    }
}

#if !PI_HAVE_ROWS8
/* The reference: one row whose chunk c starts at w + S 8 c (S = 1: the file's row; 4: a row of a BF16X8 half). */
static inline float bf16_dot_steps(int64_t n, const uint16_t *w, const uint16_t *x, const int S) {
    const int64_t n8 = n / 8 * 8;
    float lane[8] = { 0 };
    for (int64_t i = 0; i < n8; i += 8) {
        float *l = lane + 4 * ((i / 8) % 2);
        for (int p = 0; p < 4; p++) {
            l[p] = bf16_dp_step(l[p], w[i * S + 2 * p + 1], x[i + 2 * p + 1]);
            l[p] = bf16_dp_step(l[p], w[i * S + 2 * p], x[i + 2 * p]);
        }
    }
    return bf16_lanes_end(lane, w, x, n8, n);
}
#endif

#if PI_HAVE_ROWS8 && !PI_HAVE_ROWS16
/* ---- avx2: the fma steps under FTZ + DAZ, on split activations (PI_TYPE_BF16S) ---- */

/* MXCSR with FTZ (bit 15) and DAZ (bit 6) for the lane loop; the memory barriers keep the loop's loads and stores
 * (and so its arithmetic) between the two writes of MXCSR. */
static inline unsigned bf16_ftz_daz_begin(void) {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
    __asm__ __volatile__("" ::: "memory");
    return csr;
}
static inline void bf16_ftz_daz_end(unsigned csr) {
    __asm__ __volatile__("" ::: "memory");
    _mm_setcsr(csr);
}

/* 8 bf16 pairs (one per 32-bit lane) -> the odd elements' and the even elements' f32 */
static inline __m256 bf16_odd8(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16)); }
static inline __m256 bf16_even8(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }

/* The split chunk c of a BF16S row: its odd values (4, twice) at xs + 16 c, its even ones at xs + 16 c + 8. A row's
 * 16 elements from chunk c (c even) are lanes 0..3 of chunk c and 4..7 of chunk c + 1: two halves. */
static inline __m256 bf16s_odd16(const float *xs, int64_t c) { return _mm256_loadu2_m128(xs + 16 * c + 16, xs + 16 * c); }
static inline __m256 bf16s_even16(const float *xs, int64_t c) { return _mm256_loadu2_m128(xs + 16 * c + 24, xs + 16 * c + 8); }

/* The file's rows (n8 elements each) x tokens t0.. (rows_per x tok accumulators, constants after inlining): a ymm of
 * a row's 16 elements is lanes 0..7 as they stand -> lanes[r][t] */
static inline __attribute__((always_inline)) void bf16_rows_block_fma(int64_t n8, const uint16_t *const *w,
                                                                      const char *x, int64_t x_stride, int t0,
                                                                      const int rows_per, const int tok,
                                                                      float (*lanes)[PI_DOT8_MAX_T][8]) {
    __m256 acc[4][2];
    const float *xt[2];
#pragma GCC unroll 4
    for (int r = 0; r < rows_per; r++)
#pragma GCC unroll 2
        for (int t = 0; t < tok; t++) acc[r][t] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int t = 0; t < tok; t++) xt[t] = (const float *)(x + (t0 + t) * x_stride);
    int64_t i = 0;
    for (; i + 16 <= n8; i += 16) {
        __m256 xo[2], xe[2];
#pragma GCC unroll 2
        for (int t = 0; t < tok; t++) { xo[t] = bf16s_odd16(xt[t], i / 8); xe[t] = bf16s_even16(xt[t], i / 8); }
#pragma GCC unroll 4
        for (int r = 0; r < rows_per; r++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(w[r] + i));
            const __m256 wo = bf16_odd8(wv), we = bf16_even8(wv);
#pragma GCC unroll 2
            for (int t = 0; t < tok; t++) acc[r][t] = _mm256_fmadd_ps(we, xe[t], _mm256_fmadd_ps(wo, xo[t], acc[r][t]));
        }
    }
    if (i < n8)   /* a last chunk with q = 0: lanes 0..3 only (the upper half of the operands: zero) */
#pragma GCC unroll 4
        for (int r = 0; r < rows_per; r++)
#pragma GCC unroll 2
            for (int t = 0; t < tok; t++) {
                const __m256i wv = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w[r] + i)));
                const __m256 xo = _mm256_loadu_ps(xt[t] + 2 * i), xe = _mm256_loadu_ps(xt[t] + 2 * i + 8);
                const __m256 s = _mm256_fmadd_ps(bf16_even8(wv), xe, _mm256_fmadd_ps(bf16_odd8(wv), xo, acc[r][t]));
                acc[r][t] = _mm256_blend_ps(acc[r][t], s, 0x0f);
            }
#pragma GCC unroll 4
    for (int r = 0; r < rows_per; r++)
#pragma GCC unroll 2
        for (int t = 0; t < tok; t++) _mm256_storeu_ps(lanes[r][t0 + t], acc[r][t]);
}

/* rows (nr: 1, or 8 in blocks of 4) x tokens [0, nt) of the file's layout: lanes[r][t]; blocks of 4 rows x 2 tokens */
static void bf16_lanes_fma(int64_t n8, const uint16_t *const *w, int nr, const char *x, int64_t x_stride, int nt,
                           float (*lanes)[PI_DOT8_MAX_T][8]) {
    const unsigned csr = bf16_ftz_daz_begin();
    if (nr == 1)
        for (int t = 0; t < nt; t++) bf16_rows_block_fma(n8, w, x, x_stride, t, 1, 1, lanes);
    else
        for (int r0 = 0; r0 < nr; r0 += 4) {
            int t = 0;
            for (; t + 2 <= nt; t += 2) bf16_rows_block_fma(n8, w + r0, x, x_stride, t, 4, 2, lanes + r0);
            for (; t < nt; t++) bf16_rows_block_fma(n8, w + r0, x, x_stride, t, 4, 1, lanes + r0);
        }
    bf16_ftz_daz_end(csr);
}

/* Half h of a BF16X8 group (4 rows; its chunk c at g + 32 c, a 32-byte load is rows 2j, 2j + 1: lanes 0..3, 4..7) x
 * tokens t0..t0+tok-1 (tok a constant): accumulators [q][pair j][token], 12 chains for 3 tokens (the steps' two fmas
 * per lane and chunk depend on each other: 8 chains leave the fma units idle), the split activations read by the
 * fmas from memory; ahead (a constant): each line requested PI_STREAM_AHEAD bytes ahead (one token) */
static inline __attribute__((always_inline)) void bf16x8_half_fma(int64_t n, const uint16_t *g, const char *x,
                                                                  int64_t x_stride, int t0, const int tok,
                                                                  const int ahead, int h,
                                                                  float (*lanes)[PI_DOT8_MAX_T][8]) {
    __m256 a[2][2][3];
    const float *xt[3];
#pragma GCC unroll 2
    for (int q = 0; q < 2; q++)
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++)
#pragma GCC unroll 3
            for (int t = 0; t < tok; t++) a[q][j][t] = _mm256_setzero_ps();
#pragma GCC unroll 3
    for (int t = 0; t < tok; t++) xt[t] = (const float *)(x + (t0 + t) * x_stride);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++) {
            const int64_t c = i / 8 + q;
            if (ahead) pi_prefetch_ahead(g + 32 * c);
#pragma GCC unroll 2
            for (int j = 0; j < 2; j++) {
                const __m256i wv = _mm256_loadu_si256((const __m256i *)(g + 32 * c + 16 * j));
                const __m256 wo = bf16_odd8(wv), we = bf16_even8(wv);
#pragma GCC unroll 3
                for (int t = 0; t < tok; t++)
                    a[q][j][t] = _mm256_fmadd_ps(we, _mm256_loadu_ps(xt[t] + 16 * c + 8),
                                                 _mm256_fmadd_ps(wo, _mm256_loadu_ps(xt[t] + 16 * c), a[q][j][t]));
            }
        }
    if (i < n) {   /* the last chunk, q = 0 */
        const int64_t c = i / 8;
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(g + 32 * c + 16 * j));
            const __m256 wo = bf16_odd8(wv), we = bf16_even8(wv);
#pragma GCC unroll 3
            for (int t = 0; t < tok; t++)
                a[0][j][t] = _mm256_fmadd_ps(we, _mm256_loadu_ps(xt[t] + 16 * c + 8),
                                             _mm256_fmadd_ps(wo, _mm256_loadu_ps(xt[t] + 16 * c), a[0][j][t]));
        }
    }
    for (int j = 0; j < 2; j++)   /* rows 4h + 2j, 4h + 2j + 1 */
        for (int t = 0; t < tok; t++) {
            float a0[8], a1[8];
            _mm256_storeu_ps(a0, a[0][j][t]);
            _mm256_storeu_ps(a1, a[1][j][t]);
            x8_rows_lanes(a0, a1, 2, 4 * h + 2 * j, t0 + t, lanes);
        }
}

/* A BF16X8 group x tokens [0, nt): lanes[k][t]; one half after the other (one token: one sequential stream) */
static void bf16x8_lanes_fma(int64_t n, const uint16_t *group, const char *x, int64_t x_stride, int nt,
                             float (*lanes)[PI_DOT8_MAX_T][8]) {
    const unsigned csr = bf16_ftz_daz_begin();
    const bool ahead = nt == 1 && pi_cpu_software_prefetch();
    for (int h = 0; h < 2; h++) {
        const uint16_t *g = group + h * 4 * n;
        int t = 0;
        if (ahead) { bf16x8_half_fma(n, g, x, x_stride, 0, 1, 1, h, lanes); continue; }
        for (; t + 3 <= nt; t += 3) bf16x8_half_fma(n, g, x, x_stride, t, 3, 0, h, lanes);
        if (nt - t == 2) bf16x8_half_fma(n, g, x, x_stride, t, 2, 0, h, lanes);
        else if (nt - t == 1) bf16x8_half_fma(n, g, x, x_stride, t, 1, 0, h, lanes);
    }
    bf16_ftz_daz_end(csr);
}
#endif

#if PI_HAVE_ROWS16
/* ---- vdpbf16ps (AVX-512 with AVX512_BF16; the level's flags lack it, so these carry the target) ---- */
#define BF16_TARGET __attribute__((target("avx512bf16,avx512vl,avx512bw,avx512f")))

BF16_TARGET static inline __m256 bf16_dp8(__m256 acc, __m256i w, __m256i x) {
    return _mm256_dpbf16_ps(acc, (__m256bh)w, (__m256bh)x);
}
BF16_TARGET static inline __m512 bf16_dp16(__m512 acc, __m512i w, __m512i x) {
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
}

/* The file's rows (nr: 1 or 8, a constant after inlining) x one token: a ymm of a row's 16 elements is lanes 0..7 as
 * they stand, one vdpbf16ps each, the rows' chains side by side */
BF16_TARGET static inline __attribute__((always_inline)) void bf16_rows_dp(int64_t n8, const uint16_t *const *w,
                                                                          const int nr, const uint16_t *xt, int t,
                                                                          float (*lanes)[PI_DOT8_MAX_T][8]) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n8; i += 16) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xt + i));
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) acc[r] = bf16_dp8(acc[r], _mm256_loadu_si256((const __m256i *)(w[r] + i)), xv);
    }
    if (i < n8) {   /* a last chunk with q = 0: lanes 0..3 only */
        const __m256i xv = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(xt + i)));
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++)
            acc[r] = _mm256_mask_dpbf16_ps(acc[r], 0x0f, (__m256bh)_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w[r] + i))),
                                           (__m256bh)xv);
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) _mm256_storeu_ps(lanes[r][t], acc[r]);
}

BF16_TARGET static void bf16_lanes_dp(int64_t n8, const uint16_t *const *w, int nr, const char *x, int64_t x_stride,
                                      int nt, float (*lanes)[PI_DOT8_MAX_T][8]) {
    for (int t = 0; t < nt; t++) {
        const uint16_t *xt = (const uint16_t *)(x + t * x_stride);
        if (nr == 8) bf16_rows_dp(n8, w, 8, xt, t, lanes);
        else bf16_rows_dp(n8, w, 1, xt, t, lanes);
    }
}

/* A BF16X8 group: a zmm is a half's chunk (lanes 4k + p: row k of the half, pair p), the token's chunk broadcast to
 * the 4 rows; accumulators [half][q][token], 4 tokens a pass (16 registers), one half after the other for one token */
BF16_TARGET static inline __attribute__((always_inline)) void bf16x8_block_dp(int64_t n, const uint16_t *group,
                                                                             const char *x, int64_t x_stride, int h0,
                                                                             const int nh, const int tok,
                                                                             const int ahead,
                                                                             float (*lanes)[PI_DOT8_MAX_T][8], int t0) {
    __m512 acc[2][2][4];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++)
#pragma GCC unroll 4
            for (int t = 0; t < tok; t++) acc[h][q][t] = _mm512_setzero_ps();
    const uint16_t *xt[4];
#pragma GCC unroll 4
    for (int t = 0; t < tok; t++) xt[t] = (const uint16_t *)(x + (t0 + t) * x_stride);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++) {
            __m512i wv[2];
#pragma GCC unroll 2
            for (int h = 0; h < nh; h++) {
                const uint16_t *c = group + (h0 + h) * 4 * n + 4 * (i + 8 * q);   /* a half's chunk: one line */
                if (ahead) pi_prefetch_ahead(c);
                wv[h] = _mm512_loadu_si512(c);
            }
#pragma GCC unroll 4
            for (int t = 0; t < tok; t++) {
                const __m512i xv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xt[t] + i + 8 * q)));
#pragma GCC unroll 2
                for (int h = 0; h < nh; h++) acc[h][q][t] = bf16_dp16(acc[h][q][t], wv[h], xv);
            }
        }
    if (i < n)
        for (int t = 0; t < tok; t++) {
            const __m512i xv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xt[t] + i)));
            for (int h = 0; h < nh; h++)
                acc[h][0][t] = bf16_dp16(acc[h][0][t], _mm512_loadu_si512(group + (h0 + h) * 4 * n + 4 * i), xv);
        }
    for (int h = 0; h < nh; h++)
        for (int t = 0; t < tok; t++) {
            float a0[16], a1[16];
            _mm512_storeu_ps(a0, acc[h][0][t]);
            _mm512_storeu_ps(a1, acc[h][1][t]);
            x8_rows_lanes(a0, a1, 4, 4 * (h0 + h), t0 + t, lanes);
        }
}

BF16_TARGET static void bf16x8_lanes_dp(int64_t n, const uint16_t *group, const char *x, int64_t x_stride, int nt,
                                        float (*lanes)[PI_DOT8_MAX_T][8]) {
    if (nt == 1) {   /* decode: one half after the other, one stream (two chains), requested ahead where that pays */
        if (pi_cpu_software_prefetch()) {
            bf16x8_block_dp(n, group, x, x_stride, 0, 1, 1, 1, lanes, 0);
            bf16x8_block_dp(n, group, x, x_stride, 1, 1, 1, 1, lanes, 0);
        } else {
            bf16x8_block_dp(n, group, x, x_stride, 0, 1, 1, 0, lanes, 0);
            bf16x8_block_dp(n, group, x, x_stride, 1, 1, 1, 0, lanes, 0);
        }
        return;
    }
    int t0 = 0;
    for (; t0 + 4 <= nt; t0 += 4) bf16x8_block_dp(n, group, x, x_stride, 0, 2, 4, 0, lanes, t0);
    for (; t0 < nt; t0++) bf16x8_block_dp(n, group, x, x_stride, 0, 2, 1, 0, lanes, t0);
}
#endif

/* ---- the kernels: x is a row of the level's activation format (avx2: BF16S; else bf16) ---- */

#if PI_HAVE_ROWS8 && !PI_HAVE_ROWS16
#define BF16_LANES(n8, w, nr, x, xs, nt, lanes) bf16_lanes_fma(n8, w, nr, x, xs, nt, lanes)
#define BF16_KERNEL(name) name##s   /* pi_vec_dot_bf16_bf16s, ...: split activations */
#elif PI_HAVE_ROWS16
#define BF16_LANES(n8, w, nr, x, xs, nt, lanes) bf16_lanes_dp(n8, w, nr, x, xs, nt, lanes)
#define BF16_KERNEL(name) name
#endif

#if PI_HAVE_ROWS8

float BF16_KERNEL(pi_vec_dot_bf16_bf16)(int64_t n, const void *w, const void *x) {
    const int64_t n8 = n / 8 * 8;
    const uint16_t *row = w;
    float lanes[1][PI_DOT8_MAX_T][8];
    BF16_LANES(n8, &row, 1, x, 0, 1, lanes);
    return bf16_lanes_end(lanes[0][0], w, x, n8, n);
}

/* Eight rows of the file's layout x nt (<= PI_DOT8_MAX_T) tokens: each (row, token) the single-row kernel's bits. */
void BF16_KERNEL(pi_vec_dot8_bf16_bf16)(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,
                                        float *y, int64_t y_stride) {
    const int64_t n8 = n / 8 * 8;
    float lanes[8][PI_DOT8_MAX_T][8];
    BF16_LANES(n8, (const uint16_t *const *)rows, 8, x, x_stride, nt, lanes);
    for (int k = 0; k < 8; k++)
        for (int t = 0; t < nt; t++)
            y[t * y_stride + k] = bf16_lanes_end(lanes[k][t], rows[k], x + t * x_stride, n8, n);
}

/* A BF16X8 group (pi_x8_index; n a multiple of 8) x nt (<= PI_DOT8_MAX_T) tokens: the bits of its rows' dot products. */
void BF16_KERNEL(pi_gemm8_bf16x8_bf16)(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                                       int64_t y_stride) {
    float lanes[8][PI_DOT8_MAX_T][8];
#if PI_HAVE_ROWS16
    bf16x8_lanes_dp(n, group, x, x_stride, nt, lanes);
#else
    bf16x8_lanes_fma(n, group, x, x_stride, nt, lanes);
#endif
    for (int k = 0; k < 8; k++)
        for (int t = 0; t < nt; t++) y[t * y_stride + k] = pi_tree8(lanes[k][t]);
}
#else   /* scalar, aarch64: the steps spelled out */
float pi_vec_dot_bf16_bf16(int64_t n, const void *w, const void *x) { return bf16_dot_steps(n, w, x, 1); }

void pi_gemm8_bf16x8_bf16(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                          int64_t y_stride) {
    for (int k = 0; k < 8; k++)
        for (int t = 0; t < nt; t++)
            y[t * y_stride + k] = bf16_dot_steps(n, (const uint16_t *)group + pi_x8_index(n, k, 0),
                                                 (const uint16_t *)(x + t * x_stride), 4);
}
#endif
