/* kc.c: the sparse down step (and the input-sparse gate) read from a file's own K-quant matrix, without
 * re-quantizing it: q4_0c.c's column layout for the types of llama.cpp's Q4_K_M files, Q4_K (PI_TYPE_Q4_KC) and
 * Q6_K (PI_TYPE_Q6_KC, which Q4_K_M keeps for part of ffn_down).
 *
 * Q4_K W [n_out rows, n_in]: per output e and super-block B of 256 inputs the fp16 d, dmin, per sub-block j of 32
 * inputs a 6-bit scale sc and min mn, w = d sc_j q - dmin mn_j (q 0..15). Laid out by input:
 *
 *   row i (input i): n_out / 2 bytes, as Q4_0C: chunk c (outputs 64c .. 64c + 63) is 32 bytes, byte j holds
 *                    q(64c + j) in its low nibble and q(64c + 32 + j) in its high one
 *   aux (pi_sparse_ffn_weights.down_t_scales): per super-block B and chunk c, Q4_KC_AUX = 1280 bytes at
 *                    (B (n_out / 64) + c) Q4_KC_AUX: d[64] and dmin[64] (fp16, output order), then per sub-block j
 *                    sc_j[64] (in the lane order of the kernels' int16 sums: sc_slot) and mn_j[64] (output order)
 *
 * Q6_K: per output and super-block the fp16 d, per sub-block j of 16 inputs an int8 scale, w = d sc_j (q - 32),
 * q 0..63 = lo (4 bits) + 16 hi (2 bits). Row i: chunk c is 48 bytes, the lo nibbles as a Q4_KC chunk, then 16
 * bytes whose byte t holds in bits 2m..2m+1 the hi bits of output hi_out(m, t) (the int16 sums' lane order); aux per
 * super-block and chunk, Q6_KC_AUX = 1152 bytes: d[64] (fp16, output order), sc_j[64] (int8, sc_slot order).
 *
 * axpy_cols adds the rows of one super-block (count <= 256, idx[k] = row k's input within it, ascending) as the
 * dense K-quant dot product adds that super-block's term: h (the rows' coefficients, 0 elsewhere) quantized as the
 * dense path quantizes it (Q4_K: Q8_KM, quants_k.h: step bd, multipliers m_j, quants y; Q6_K: Q8_K), then per output
 * the dense kernels' exact integers
 *   Q4_K: sumi = sum_j sc_j m_j sum_{k in j} q_k y_k,   summ = sum_j mn_j m_j sum_{k in j} y_k
 *   Q6_K: sumi = sum_j sc_j sum_{k in j} (q_k - 32) y_k  (= sc_j (s_lo + 16 sum (hi_k - 2) y_k))
 * and their float term, y[e] += bd (d sumi - dmin summ) or (bd d) sumi (vec_dot_k.c) to the bit: with every input
 * kept the sparse step is the dense product up to the f32 order of the terms. The AVX2 bodies: two rows' bytes
 * interleaved and one maddubs per 32 outputs (as Q4_0C; Q6_K one more for the hi bits), int16 sums over runs of
 * up to 16 rows of one sub-block, weighted by the sub-block's scale with madd. Every level gives the scalar
 * body's bits. n_out must be a multiple of 64. */
#include "../quants_k.h"

#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define Q4_KC_AUX 1280   /* aux bytes per super-block and 64 outputs: 20 per output */
#define Q6_KC_AUX 1152   /* 18 per output */
/* Chunks of 64 outputs per pass over a super-block's rows (AVX2): each row is read in pieces of KC_TILE * 32 bytes
 * (Q4_KC). 8 (256-byte pieces) read the 7B shape's rows at 10-13 GB/s on 2 threads of a Sapphire Rapids; 32 (1 KB, a
 * down row's half, 8 KB of int32 sums on the stack) made its input-sparse gate (5.5 KB rows) 1.28-1.30x faster and the
 * CATS step 1.04-1.10x (`ab_ops.py --op gate_t,cats`; a one-thread harness: 256-byte pieces of 128 rows 6.6-8.4 GB/s,
 * whole rows 8-16 side by side 12-13), on the 542M files and Gemma 3 270M gate_t 1.03-1.12x, cats 1.00 +- 0.03.
 * The bits do not depend on it (integer sums per output, the same epilogue per chunk). */
#ifndef KC_TILE
#define KC_TILE 32
#endif
/* How far ahead (bytes) kc_lo_sums requests each row's line on Intel and Zen 5 (pi_cpu_software_prefetch): a super-block's
 * rows are up to 256 short streams side by side. 542M Q4_K_M at half the channels, 2 threads, Sapphire Rapids:
 * decode 0.69x -> 0.80x its dense model's speed (128 and 512 bytes: the same; into L2 512 ahead 0.76x); the next
 * tile's scales into L2 as well: +2-4% more (into L1: +1-2%). With KC_TILE 32, on the 7B Q4_K_M shape: 128 ahead
 * 1.01-1.05x the time, 512 1.04-1.08x, 1024 1.2x. Zen 5: on with the Q4_0 kernels it was measured with (Q4_KC / Q6_KC
 * files not measured there); other AMD CPUs not measured with it. */
#ifndef KC_PREFETCH
#define KC_PREFETCH 256
#endif

/* The first output of the low 8 lanes of each of a chunk's four int16 sums (kc_lo_sums): sum m, lane t holds output
 * KC_BASE[m] + t + (t < 8 ? 0 : 8). */
static const int KC_BASE[4] = { 0, 8, 32, 40 };

/* Where output o (0..63) of a chunk keeps its sc_j byte: the order of the kernel's int16 sums, whose four vectors
 * hold outputs {0-7, 16-23}, {8-15, 24-31}, {32-39, 48-55}, {40-47, 56-63} (unpacklo/hi work per 128-bit lane). */
static inline int sc_slot(int o) {
    const int g = o / 8;
    return 16 * (g / 4 * 2 + g % 2) + 8 * (g % 4 / 2) + o % 8;
}

#if defined(__AVX2__)
/* A super-block's rows (ascending idx) as runs of up to 16 rows of one sub-block of sub inputs (int16 sums:
 * |sum| <= 16 * 15 * 127), the rows of a run in pairs (an odd run padded with its first row at coefficient 0):
 * r[2p], r[2p + 1] the pair's rows, P[p] its coefficients (y_a, y_b) in every 16-bit lane; run u is pairs
 * run_pair0[u] .. run_pair0[u + 1] of sub-block run_j[u]. Returns the number of runs (<= 16). */
typedef struct {
    const uint8_t *r[2 * (128 + 16)];
    __m256i P[128 + 16];
    int run_j[16], run_pair0[17];
} kc_runs;

static int kc_make_runs(int count, const uint8_t *idx, const int8_t *q, const void *const *rows, int sub, kc_runs *R) {
    int n_runs = 0, n_pairs = 0;
    for (int k = 0; k < count;) {
        const int j = idx[k] / sub;
        int end = k;
        while (end < count && idx[end] / sub == j && end - k < 16) end++;
        R->run_j[n_runs] = j;
        R->run_pair0[n_runs++] = n_pairs;
        for (int i = k; i < end; i += 2) {
            const bool two = i + 1 < end;
            R->r[2 * n_pairs] = rows[i];
            R->r[2 * n_pairs + 1] = rows[two ? i + 1 : i];
            const uint8_t qa = (uint8_t)q[i], qb = two ? (uint8_t)q[i + 1] : 0;
            R->P[n_pairs++] = _mm256_set1_epi16((int16_t)(uint16_t)(qa | (uint16_t)qb << 8));
        }
        k = end;
    }
    R->run_pair0[n_runs] = n_pairs;
    return n_runs;
}

/* s[0..3] = run u's int16 sums over its rows of the 64 nibbles at byte offset off of each row (a Q4_0C chunk):
 * s[m] lane t = output KC_BASE[m] + t + (t < 8 ? 0 : 8) */
static inline void kc_lo_sums(const kc_runs *R, int u, int64_t off, __m256i s[4], bool ahead) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int i = 0; i < 4; i++) s[i] = _mm256_setzero_si256();
    for (int p = R->run_pair0[u]; p < R->run_pair0[u + 1]; p++) {
        if (ahead) {   /* KC_PREFETCH */
            _mm_prefetch((const char *)(R->r[2 * p] + off + KC_PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char *)(R->r[2 * p + 1] + off + KC_PREFETCH), _MM_HINT_T0);
        }
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(R->r[2 * p] + off));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(R->r[2 * p + 1] + off));
        const __m256i lo = _mm256_unpacklo_epi8(v0, v1), hi = _mm256_unpackhi_epi8(v0, v1);
        s[0] = _mm256_add_epi16(s[0], _mm256_maddubs_epi16(_mm256_and_si256(lo, m4), R->P[p]));
        s[1] = _mm256_add_epi16(s[1], _mm256_maddubs_epi16(_mm256_and_si256(hi, m4), R->P[p]));
        s[2] = _mm256_add_epi16(s[2], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(lo, 4), m4), R->P[p]));
        s[3] = _mm256_add_epi16(s[3], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 4), m4), R->P[p]));
    }
}

/* acc[2i] += a . wa + b . wb lane-wise over the low 4 int16 lanes of each 128-bit half, acc[2i + 1] over the high
 * ones: int32 per output, in the lane order KC_BASE describes (outputs KC_BASE[i] + {0-3 | 16-19}, {4-7 | 20-23}) */
static inline void kc_madd2(__m256i acc[8], int i, __m256i a, __m256i b, __m256i wa, __m256i wb) {
    acc[2 * i] = _mm256_add_epi32(acc[2 * i], _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b),
                                                                _mm256_unpacklo_epi16(wa, wb)));
    acc[2 * i + 1] = _mm256_add_epi32(acc[2 * i + 1], _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b),
                                                                        _mm256_unpackhi_epi16(wa, wb)));
}

/* outputs KC_BASE[i] + 16 h .. + 7 of the chunk's int32 sums, in order */
static inline __m256i kc_outputs8(const __m256i acc[8], int i, int h) {
    /* two literal immediates: a build without constant propagation (PI_SANITIZE) cannot fold h ? 0x31 : 0x20 */
    return h ? _mm256_permute2x128_si256(acc[2 * i], acc[2 * i + 1], 0x31)
             : _mm256_permute2x128_si256(acc[2 * i], acc[2 * i + 1], 0x20);
}
#endif

#if PI_NEON
/* sc_slot(o) for o = 0..63: the table lookup (vqtbl4q) that puts a chunk's 64 sc_j bytes in output order */
static const uint8_t KC_NATURAL[64] = {
    0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31,
    32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61,
    62, 63 };

/* The 64 sc_j bytes of a chunk (at p, sc_slot order) in output order, 16 outputs per register */
static inline void kc_scales_natural(const uint8_t *p, uint8x16_t out[4]) {
    const uint8x16x4_t t = vld1q_u8_x4(p);
    for (int g = 0; g < 4; g++) out[g] = vqtbl4q_u8(t, vld1q_u8(KC_NATURAL + 16 * g));
}

/* sumi[2i], sumi[2i + 1] (outputs 8i .. 8i + 7 of a chunk) += s16[i] w[i]: a run's int16 sums weighted by its
 * sub-block's int16 scales, exact in int32 */
static inline void kc_add_weighted(int32x4_t sumi[16], const int16x8_t s16[8], const int16x8_t w[8]) {
    for (int i = 0; i < 8; i++) {
        sumi[2 * i] = vmlal_s16(sumi[2 * i], vget_low_s16(s16[i]), vget_low_s16(w[i]));
        sumi[2 * i + 1] = vmlal_high_s16(sumi[2 * i + 1], s16[i], w[i]);
    }
}
#endif


/* Super-block B (inputs 256B .. 256B + 255) of the Q4_K matrix w (n_out rows, row stride w_stride bytes) ->
 * rows[k] (input 256B + k, n_out / 2 bytes each) and the super-block's aux (n_out / 64 Q4_KC_AUX bytes): chunk by
 * chunk, each byte stored once. */
void pi_q4_kc_from_q4_k(int64_t n_out, const void *w, int64_t w_stride, int64_t B, void *const *rows, void *aux) {
    for (int64_t e0 = 0; e0 < n_out; e0 += 64)   /* chunk e0 / 64: byte j of a row from outputs e0 + j, e0 + 32 + j */
        for (int j = 0; j < 32; j++) {
            const pi_block_q4_K *blk[2];
            for (int h = 0; h < 2; h++) {   /* the two outputs' d, dmin, scales and mins */
                const int o = j + 32 * h;
                blk[h] = (const pi_block_q4_K *)((const char *)w + (e0 + o) * w_stride) + B;
                uint8_t *ax = (uint8_t *)aux + e0 / 64 * Q4_KC_AUX;
                memcpy(ax + 2 * o, &blk[h]->d, 2);
                memcpy(ax + 128 + 2 * o, &blk[h]->dmin, 2);
                for (int sb = 0; sb < 8; sb++)
                    pi_k4_scale_min(sb, blk[h]->scales, &ax[256 + 64 * sb + sc_slot(o)], &ax[768 + 64 * sb + o]);
            }
            const int64_t at = e0 / 2 + j;
            for (int p = 0; p < 4; p++)   /* Q4_K: qs[32p + l] holds sub-block 2p's element l (low), 2p + 1's (high) */
                for (int l = 0; l < 32; l++) {
                    const uint8_t a = blk[0]->qs[32 * p + l], c = blk[1]->qs[32 * p + l];
                    ((uint8_t *)rows[64 * p + l])[at] = (uint8_t)((a & 15) | (c & 15) << 4);
                    ((uint8_t *)rows[64 * p + 32 + l])[at] = (uint8_t)((a >> 4) | (c >> 4) << 4);
                }
        }
}

void pi_axpy_cols_q4_kc(int64_t n, int count, const uint8_t *idx, const float *a, const void *aux,
                        const void *const *rows, float *y) {
    float h[256] = { 0 };
    for (int k = 0; k < count; k++) h[idx[k]] = a[k];
    pi_block_q8_Km hq;
    pi_q8_Km_from_f32(h, &hq, 256);
    int8_t q[256];
    int32_t cm[8] = { 0 };   /* m_j sum_{k in j} y_k: the mins' integer weight of sub-block j */
    for (int k = 0; k < count; k++) cm[idx[k] / 32] += q[k] = hq.k.qs[idx[k]];
    for (int j = 0; j < 8; j++) cm[j] *= hq.m[j];
    const float bd = hq.k.d;
#if defined(__AVX2__)
    kc_runs R;
    const int n_runs = kc_make_runs(count, idx, q, rows, 32, &R);
    int act[8], n_act = 0;   /* sub-blocks with a mins term */
    for (int j = 0; j < 8; j++)
        if (cm[j]) act[n_act++] = j;
    const __m256 vbd = _mm256_set1_ps(bd);
    const bool ahead = pi_cpu_software_prefetch();
    /* Outputs in tiles of KC_TILE chunks, the runs two at a time over a tile: each row is read in pieces of
     * KC_TILE * 32 bytes, up to 32 rows side by side (all of a super-block's rows at once: up to 256 streams) */
    for (int64_t c0 = 0; c0 < n / 64; c0 += KC_TILE) {
        const int nc = (int)PI_MIN(KC_TILE, n / 64 - c0);
        __m256i acc[KC_TILE][8];   /* sumi, lanes as kc_madd2 leaves them */
        memset(acc, 0, sizeof acc);
        for (int u = 0; u < n_runs; u += 2) {   /* two runs per madd: (s_a, s_b) . (sc_a m_a, sc_b m_b) */
            const int ja = R.run_j[u], jb = u + 1 < n_runs ? R.run_j[u + 1] : ja;
            const __m256i ma = _mm256_set1_epi16(hq.m[ja]), mb = _mm256_set1_epi16(u + 1 < n_runs ? hq.m[jb] : 0);
            for (int c = 0; c < nc; c++) {
                const int64_t cc = c0 + c;
                __m256i s[2][4];
                for (int h2 = 0; h2 < 2; h2++)
                    if (u + h2 < n_runs) kc_lo_sums(&R, u + h2, 32 * cc, s[h2], ahead);
                    else for (int i = 0; i < 4; i++) s[h2][i] = _mm256_setzero_si256();
                const uint8_t *ax = (const uint8_t *)aux + cc * Q4_KC_AUX;
                if (ahead && u == 0)   /* the next tile's chunk of scales, into L2 */
                    for (int l = 0; l < Q4_KC_AUX; l += 64)
                        _mm_prefetch((const char *)ax + KC_TILE * Q4_KC_AUX + l, _MM_HINT_T1);
                for (int i = 0; i < 4; i++) {   /* |s sc m| <= 30480 * 2016: the pair's sum fits int32 */
                    const __m256i wa = _mm256_mullo_epi16(
                        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ax + 256 + 64 * ja + 16 * i))), ma);
                    const __m256i wb = _mm256_mullo_epi16(
                        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ax + 256 + 64 * jb + 16 * i))), mb);
                    kc_madd2(acc[c], i, s[0][i], s[1][i], wa, wb);
                }
            }
        }
        for (int c = 0; c < nc; c++) {
            const int64_t cc = c0 + c;
            const uint8_t *ax = (const uint8_t *)aux + cc * Q4_KC_AUX;
            for (int i = 0; i < 4; i++)
                for (int h2 = 0; h2 < 2; h2++) {   /* outputs o0 .. o0 + 7 in order */
                    const int o0 = KC_BASE[i] + 16 * h2;
                    const __m256i si = kc_outputs8(acc[c], i, h2);
                    __m256i sm = _mm256_setzero_si256();
                    for (int t = 0; t < n_act; t++)
                        sm = _mm256_add_epi32(sm, _mm256_mullo_epi32(
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ax + 768 + 64 * act[t] + o0))),
                            _mm256_set1_epi32(cm[act[t]])));
                    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ax + 2 * o0)));
                    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ax + 128 + 2 * o0)));
                    const __m256 t = _mm256_mul_ps(vbd, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(si)),
                                                                      _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(sm))));
                    float *yp = y + 64 * cc + o0;
                    _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), t));
                }
        }
    }
#elif PI_NEON
    /* per chunk of 64 outputs: int16 sums over runs of up to 16 rows of one sub-block, weighted by sc_j m_j (< 2^11)
     * into int32 sumi; summ from the mins; then the scalar body's float term */
    const float32x4_t vbd = vdupq_n_f32(bd);
    for (int64_t c = 0; c < n / 64; c++) {
        const uint8_t *ax = (const uint8_t *)aux + c * Q4_KC_AUX;
        int32x4_t sumi[16], summ[16];   /* outputs 64c + 4i .. + 3 */
        for (int i = 0; i < 16; i++) sumi[i] = summ[i] = vdupq_n_s32(0);
        for (int k = 0; k < count;) {
            const int j = idx[k] / 32;
            int16x8_t s16[8];   /* outputs 8i .. 8i + 7 */
            for (int i = 0; i < 8; i++) s16[i] = vdupq_n_s16(0);
            for (const int k1 = PI_MIN(count, k + 16); k < k1 && idx[k] / 32 == j; k++)
                pi_neon_mla_nibbles64(s16, (const uint8_t *)rows[k] + 32 * c, q[k]);
            uint8x16_t sc[4];
            kc_scales_natural(ax + 256 + 64 * j, sc);
            int16x8_t w[8];   /* sc_j m_j per output */
            for (int g = 0; g < 4; g++) {
                w[2 * g] = vmulq_n_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(sc[g]))), hq.m[j]);
                w[2 * g + 1] = vmulq_n_s16(vreinterpretq_s16_u16(vmovl_high_u8(sc[g])), hq.m[j]);
            }
            kc_add_weighted(sumi, s16, w);
        }
        for (int j = 0; j < 8; j++) {
            if (!cm[j]) continue;
            for (int g = 0; g < 4; g++) {
                const uint8x16_t mn = vld1q_u8(ax + 768 + 64 * j + 16 * g);
                const int16x8_t m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
                const int16x8_t m1 = vreinterpretq_s16_u16(vmovl_high_u8(mn));
                summ[4 * g] = vmlaq_n_s32(summ[4 * g], vmovl_s16(vget_low_s16(m0)), cm[j]);
                summ[4 * g + 1] = vmlaq_n_s32(summ[4 * g + 1], vmovl_high_s16(m0), cm[j]);
                summ[4 * g + 2] = vmlaq_n_s32(summ[4 * g + 2], vmovl_s16(vget_low_s16(m1)), cm[j]);
                summ[4 * g + 3] = vmlaq_n_s32(summ[4 * g + 3], vmovl_high_s16(m1), cm[j]);
            }
        }
        for (int i = 0; i < 16; i++) {
            const float32x4_t t = vsubq_f32(vmulq_f32(pi_neon_load4_f16(ax + 8 * i), vcvtq_f32_s32(sumi[i])),
                                            vmulq_f32(pi_neon_load4_f16(ax + 128 + 8 * i), vcvtq_f32_s32(summ[i])));
            float *ye = y + 64 * c + 4 * i;
            vst1q_f32(ye, vaddq_f32(vld1q_f32(ye), vmulq_f32(vbd, t)));
        }
    }
#else
    for (int64_t e = 0; e < n; e++) {
        const uint8_t *ax = (const uint8_t *)aux + e / 64 * Q4_KC_AUX;
        const int o = (int)(e % 64);
        const int64_t byte = e / 64 * 32 + e % 32, shift = e % 64 < 32 ? 0 : 4;
        int32_t sumi = 0, summ = 0;
        for (int j = 0, k = 0; j < 8; j++) {
            int32_t s = 0;
            for (; k < count && idx[k] / 32 == j; k++) s += q[k] * (((const uint8_t *)rows[k])[byte] >> shift & 15);
            sumi += ax[256 + 64 * j + sc_slot(o)] * hq.m[j] * s;
            summ += ax[768 + 64 * j + o] * cm[j];
        }
        uint16_t d, dmin;
        memcpy(&d, ax + 2 * o, 2);
        memcpy(&dmin, ax + 128 + 2 * o, 2);
        y[e] += bd * (pi_fp16_to_f32(d) * (float)sumi - pi_fp16_to_f32(dmin) * (float)summ);
    }
#endif
}

/* ---- Q6_KC ---- */

/* Q6_K quant i (0..255) of a super-block, 0..63 */
static inline int q6_K_quant(const pi_block_q6_K *b, int i) {
    const int h = i / 128, g = i % 128 / 32, l = i % 32;
    const uint8_t ql = b->ql[64 * h + l + 32 * (g & 1)], qh = b->qh[32 * h + l];
    return (g < 2 ? ql & 15 : ql >> 4) | (qh >> (2 * g) & 3) << 4;
}

/* Where the hi bits of output o (0..63) of a chunk lie: byte t of the chunk's 16, bits 2m (the lane order of the
 * lo sums: o = KC_BASE[m] + t + (t < 8 ? 0 : 8)). */
static inline void hi_place(int o, int *t, int *m) {
    const int g = o / 8;
    *m = g / 4 * 2 + g % 2;
    *t = 8 * (g % 4 / 2) + o % 8;
}

/* Super-block B of the Q6_K matrix w (n_out rows) -> rows[k] (input 256B + k, 3 n_out / 4 bytes) and its aux
 * (n_out / 64 Q6_KC_AUX bytes). */
void pi_q6_kc_from_q6_k(int64_t n_out, const void *w, int64_t w_stride, int64_t B, void *const *rows, void *aux) {
    for (int k = 0; k < 256; k++)   /* the hi planes are or-ed together below */
        for (int64_t c = 0; c < n_out / 64; c++) memset((uint8_t *)rows[k] + 48 * c + 32, 0, 16);
    for (int64_t e0 = 0; e0 < n_out; e0 += 64)   /* chunk e0 / 64: lo byte j from outputs e0 + j, e0 + 32 + j */
        for (int j = 0; j < 32; j++) {
            const pi_block_q6_K *blk[2];
            int t[2], m[2];
            for (int h = 0; h < 2; h++) {   /* the two outputs' d and scales, and where their hi bits go */
                const int o = j + 32 * h;
                blk[h] = (const pi_block_q6_K *)((const char *)w + (e0 + o) * w_stride) + B;
                uint8_t *ax = (uint8_t *)aux + e0 / 64 * Q6_KC_AUX;
                memcpy(ax + 2 * o, &blk[h]->d, 2);
                for (int sb = 0; sb < 16; sb++) ax[128 + 64 * sb + sc_slot(o)] = (uint8_t)blk[h]->scales[sb];
                hi_place(o, &t[h], &m[h]);
            }
            uint8_t *const *r = (uint8_t *const *)rows;
            const int64_t at = e0 / 64 * 48;
            for (int k = 0; k < 256; k++) {
                const int qa = q6_K_quant(blk[0], k), qb = q6_K_quant(blk[1], k);
                r[k][at + j] = (uint8_t)((qa & 15) | (qb & 15) << 4);
                r[k][at + 32 + t[0]] |= (uint8_t)((qa >> 4) << (2 * m[0]));
                r[k][at + 32 + t[1]] |= (uint8_t)((qb >> 4) << (2 * m[1]));
            }
        }
}

void pi_axpy_cols_q6_kc(int64_t n, int count, const uint8_t *idx, const float *a, const void *aux,
                        const void *const *rows, float *y) {
    float h[256] = { 0 };
    for (int k = 0; k < count; k++) h[idx[k]] = a[k];
    pi_block_q8_K hq;
    pi_quantize_row_q8_K(h, &hq, 256);
    int8_t q[256];
    int32_t b2[16] = { 0 };   /* 2 sum_{k in j} y_k: the -32 offset, as sum (hi - 2) y = s_hi - b2 */
    for (int k = 0; k < count; k++) b2[idx[k] / 16] += 2 * (q[k] = hq.qs[idx[k]]);
    const float bd = hq.d;
#if defined(__AVX2__)
    kc_runs R;
    const int n_runs = kc_make_runs(count, idx, q, rows, 16, &R);
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256 vbd = _mm256_set1_ps(bd);
    const bool ahead = pi_cpu_software_prefetch();
    for (int64_t c0 = 0; c0 < n / 64; c0 += KC_TILE) {
        const int nc = (int)PI_MIN(KC_TILE, n / 64 - c0);
        __m256i acc[KC_TILE][8];   /* sumi, lanes as Q4_KC's */
        memset(acc, 0, sizeof acc);
        for (int u = 0; u < n_runs; u++) {   /* one run = one sub-block's rows: (s_lo, s_hi - b2) . (sc, 16 sc) */
            const int j = R.run_j[u];
            const __m256i vb2 = _mm256_set1_epi16((int16_t)b2[j]);
            for (int c = 0; c < nc; c++) {
                const int64_t cc = c0 + c;
                __m256i lo[4], hi[4];
                kc_lo_sums(&R, u, 48 * cc, lo, ahead);
                for (int i = 0; i < 4; i++) hi[i] = _mm256_setzero_si256();
                for (int p = R.run_pair0[u]; p < R.run_pair0[u + 1]; p++) {   /* |sum| <= 16 * 3 * 127 */
                    const __m128i v0 = _mm_loadu_si128((const __m128i *)(R.r[2 * p] + 48 * cc + 32));
                    const __m128i v1 = _mm_loadu_si128((const __m128i *)(R.r[2 * p + 1] + 48 * cc + 32));
                    const __m256i v = _mm256_set_m128i(_mm_unpackhi_epi8(v0, v1), _mm_unpacklo_epi8(v0, v1));
                    hi[0] = _mm256_add_epi16(hi[0], _mm256_maddubs_epi16(_mm256_and_si256(v, m3), R.P[p]));
                    hi[1] = _mm256_add_epi16(hi[1], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 2), m3),
                                                                         R.P[p]));
                    hi[2] = _mm256_add_epi16(hi[2], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m3),
                                                                         R.P[p]));
                    hi[3] = _mm256_add_epi16(hi[3], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 6), m3),
                                                                         R.P[p]));
                }
                const uint8_t *ax = (const uint8_t *)aux + cc * Q6_KC_AUX;
                if (ahead && u == 0)   /* the next tile's chunk of scales, into L2 */
                    for (int l = 0; l < Q6_KC_AUX; l += 64)
                        _mm_prefetch((const char *)ax + KC_TILE * Q6_KC_AUX + l, _MM_HINT_T1);
                for (int i = 0; i < 4; i++) {   /* |sc (s_lo + 16 (s_hi - b2))| <= 128 * (30480 + 16 * 4064) */
                    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(ax + 128 + 64 * j + 16 * i));
                    const __m256i sc = _mm256_cvtepi8_epi16(sc8);
                    const __m256i sh = _mm256_sub_epi16(hi[i], vb2), sc16 = _mm256_slli_epi16(sc, 4);
                    kc_madd2(acc[c], i, lo[i], sh, sc, sc16);
                }
            }
        }
        for (int c = 0; c < nc; c++) {
            const int64_t cc = c0 + c;
            const uint8_t *ax = (const uint8_t *)aux + cc * Q6_KC_AUX;
            for (int i = 0; i < 4; i++)
                for (int h2 = 0; h2 < 2; h2++) {   /* outputs o0 .. o0 + 7 in order */
                    const int o0 = KC_BASE[i] + 16 * h2;
                    const __m256i si = kc_outputs8(acc[c], i, h2);
                    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ax + 2 * o0)));
                    const __m256 t = _mm256_mul_ps(_mm256_mul_ps(vbd, d), _mm256_cvtepi32_ps(si));
                    float *yp = y + 64 * cc + o0;
                    _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), t));
                }
        }
    }
#elif PI_NEON
    /* per chunk: int16 sums of q_k (u - 32) over runs of up to 8 rows of one sub-block (|.| <= 8 * 127 * 32), weighted
     * by the signed sc_j into int32 sumi; then the scalar body's float term */
    for (int64_t c = 0; c < n / 64; c++) {
        const uint8_t *ax = (const uint8_t *)aux + c * Q6_KC_AUX;
        int32x4_t sumi[16];   /* outputs 64c + 4i .. + 3 */
        for (int i = 0; i < 16; i++) sumi[i] = vdupq_n_s32(0);
        for (int k = 0; k < count;) {
            const int j = idx[k] / 16;
            int16x8_t s16[8];   /* outputs 8g .. 8g + 7 */
            for (int g = 0; g < 8; g++) s16[g] = vdupq_n_s16(0);
            for (const int k1 = PI_MIN(count, k + 8); k < k1 && idx[k] / 16 == j; k++) {
                const uint8_t *r = (const uint8_t *)rows[k] + 48 * c;
                uint8x16_t L[4];
                pi_neon_nibbles64(r, L);
                const uint8x16_t H = vld1q_u8(r + 32);
                const int8x8_t qk = vdup_n_s8(q[k]);
                for (int g = 0; g < 8; g++) {   /* hi bits of outputs 8g..: bits 2m of bytes 8 (g % 4 / 2) .. (hi_place) */
                    const int m = g / 4 * 2 + g % 2;
                    const uint8x8_t half = g % 4 / 2 ? vget_high_u8(H) : vget_low_u8(H);
                    const uint8x8_t h = vand_u8(vshl_u8(half, vdup_n_s8((int8_t)(-2 * m))), vdup_n_u8(3));
                    const uint8x8_t lo = g % 2 ? vget_high_u8(L[g / 2]) : vget_low_u8(L[g / 2]);
                    const int8x8_t v = vsub_s8(vreinterpret_s8_u8(vorr_u8(lo, vshl_n_u8(h, 4))), vdup_n_s8(32));
                    s16[g] = vmlal_s8(s16[g], v, qk);
                }
            }
            uint8x16_t sc[4];
            kc_scales_natural(ax + 128 + 64 * j, sc);
            int16x8_t w[8];   /* the signed sc_j per output */
            for (int g = 0; g < 4; g++) {
                w[2 * g] = vmovl_s8(vreinterpret_s8_u8(vget_low_u8(sc[g])));
                w[2 * g + 1] = vmovl_high_s8(vreinterpretq_s8_u8(sc[g]));
            }
            kc_add_weighted(sumi, s16, w);
        }
        for (int i = 0; i < 16; i++) {
            float *ye = y + 64 * c + 4 * i;
            const float32x4_t t = vmulq_f32(vmulq_n_f32(pi_neon_load4_f16(ax + 8 * i), bd), vcvtq_f32_s32(sumi[i]));
            vst1q_f32(ye, vaddq_f32(vld1q_f32(ye), t));
        }
    }
#else
    for (int64_t e = 0; e < n; e++) {
        const uint8_t *ax = (const uint8_t *)aux + e / 64 * Q6_KC_AUX;
        const int o = (int)(e % 64);
        int t, m;
        hi_place(o, &t, &m);
        const int64_t chunk = e / 64 * 48, lo_shift = o < 32 ? 0 : 4;
        int32_t sumi = 0;
        for (int j = 0, k = 0; j < 16; j++) {
            int32_t s = 0;
            for (; k < count && idx[k] / 16 == j; k++) {
                const uint8_t *r = (const uint8_t *)rows[k] + chunk;
                s += q[k] * ((r[o % 32] >> lo_shift & 15) + 16 * (r[32 + t] >> (2 * m) & 3) - 32);
            }
            sumi += (int8_t)ax[128 + 64 * j + sc_slot(o)] * s;
        }
        uint16_t d;
        memcpy(&d, ax + 2 * o, 2);
        y[e] += bd * pi_fp16_to_f32(d) * (float)sumi;
    }
#endif
}
