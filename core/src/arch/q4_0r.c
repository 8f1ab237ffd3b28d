/* q4_0r.c: the sparse FFN's load-time Q4_0 layout (PI_TYPE_Q4_0R), its activation format
 * (PI_TYPE_Q8_0P) and their kernels.
 *
 * The sparse FFN reads single scattered neuron rows, eight at a time, where the 8-row kernels of
 * rows8.c spend most of their instructions transposing rows and gathering scales. Here a row is
 * read on its own, 256 elements (8 Q4_0 blocks, a "super-block") at a time:
 *
 *   Q4_0R super-block (144 bytes): the 8 fp16 block scales, lane l holding block BLOCK_OF[l]; then four
 *                                  32-byte vectors c_m (m < 4) whose 4-byte lane l is bytes 4m..4m+3 of
 *                                  block BLOCK_OF[l] (each byte as in Q4_0: byte j = elements j (low
 *                                  nibble) and j + 16 (high nibble))
 *   Q8_0P super-block (320 bytes): the 8 activation block scales as f32 and 8 x the 8 block sums (int32),
 *                                  in lane order, then eight 32-byte vectors X_m: lane l of X_m (m < 4) =
 *                                  elements 4m..4m+3 of block BLOCK_OF[l], of X_{4+m} = elements
 *                                  16+4m..16+4m+3
 *
 * so the low nibbles of c_m pair with X_m, the high ones with X_{4+m}, and eight VNNI products (or
 * maddubs) accumulate each block's exact integer dot product in its own lane: no horizontal adds.
 * The rows that are added (down_t, ffn_gate_t) keep the f32 axpy: a 4x4 transpose of 32-bit words per
 * 128-bit lane turns c_0..c_3 back into the blocks in order (lanes p and 4 + p are blocks 2p and 2p + 1).
 *
 * Canonical arithmetic (every kernel of this file, AVX2 or scalar, gives these bits):
 *   dot:  lane l accumulates acc_l = fma(d_w * d_x, i_b, acc_l) over the super-blocks in order
 *         (b = block BLOCK_OF[l] of each; i_b the exact integer sum q . x - 8 s), and the result is
 *         pi_tree8 over the lanes.
 *   axpy: y[e] = fma(a * d_b, q_e - 8, y[e]), as pi_axpy_q4_0; axpy8 adds its eight rows in order.
 * Rows must have a multiple of 256 elements (the types' block size). */
#include "../internal.h"

#include <math.h>
#include <string.h>

static const int BLOCK_OF[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };   /* lane l holds block BLOCK_OF[l] */
static const int LANE_OF[8] = { 0, 4, 1, 5, 2, 6, 3, 7 };    /* block b sits in lane LANE_OF[b] */

typedef struct { uint16_t d[8]; uint8_t qs[4][8][4]; } sb_q4_0r;                  /* 144 bytes */
typedef struct { float d[8]; int32_t s8[8]; int8_t qs[8][8][4]; } sb_q8_0p;       /* 320 bytes */
_Static_assert(sizeof(sb_q4_0r) == 144 && sizeof(sb_q8_0p) == 320, "super-block sizes");

/* ---- conversions ---- */

void pi_q4_0r_from_q4_0(int64_t n, const void *src, void *dst) {
    const pi_block_q4_0 *x = src;
    sb_q4_0r *y = dst;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            const pi_block_q4_0 *b = &x[8 * s + BLOCK_OF[l]];
            y[s].d[l] = b->d;
            for (int m = 0; m < 4; m++) memcpy(y[s].qs[m][l], b->qs + 4 * m, 4);
        }
}

void pi_q4_0r_to_f32(const void *src, float *dst, int64_t n) {
    const sb_q4_0r *x = src;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            const float d = pi_fp16_to_f32(x[s].d[l]);
            float *o = dst + 256 * s + 32 * BLOCK_OF[l];
            for (int j = 0; j < 16; j++) {
                const uint8_t q = x[s].qs[j / 4][l][j % 4];
                o[j] = (float)((q & 15) - 8) * d;
                o[j + 16] = (float)((q >> 4) - 8) * d;
            }
        }
}

/* Quantized exactly as Q8_0S (same rounding), then rearranged. */
void pi_quantize_row_q8_0p(const float *src, void *dst, int64_t n) {
    sb_q8_0p *y = dst;
    for (int64_t s = 0; s < n / 256; s++) {
        pi_block_q8_0s q[8];
        pi_quantize_row_q8_0s(src + 256 * s, q, 256);
        for (int l = 0; l < 8; l++) {
            const pi_block_q8_0s *b = &q[BLOCK_OF[l]];
            y[s].d[l] = pi_fp16_to_f32(b->d);
            y[s].s8[l] = 8 * (int32_t)b->s;
            for (int m = 0; m < 4; m++) {
                memcpy(y[s].qs[m][l], b->qs + 4 * m, 4);
                memcpy(y[s].qs[4 + m][l], b->qs + 16 + 4 * m, 4);
            }
        }
    }
}

void pi_q8_0p_to_f32(const void *src, float *dst, int64_t n) {
    const sb_q8_0p *x = src;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            float *o = dst + 256 * s + 32 * BLOCK_OF[l];
            for (int j = 0; j < 16; j++) {
                o[j] = (float)x[s].qs[j / 4][l][j % 4] * x[s].d[l];
                o[j + 16] = (float)x[s].qs[4 + j / 4][l][j % 4] * x[s].d[l];
            }
        }
}


/* ---- kernels ---- */

#if PI_HAVE_ROWS8
#include <immintrin.h>

#include "avx2_util.h"

#ifndef Q4_0R_PREFETCH
#define Q4_0R_PREFETCH 4   /* super-blocks (144 bytes) ahead that each row of vec_dot8 prefetches */
#endif

/* acc + (d_w d_x) * (the 8 blocks' exact integer dot products), lane l = block BLOCK_OF[l]. */
static inline __m256 sb_dot(const sb_q4_0r *w, const sb_q8_0p *x, __m256 acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i *c = (const __m256i *)w->qs, *xq = (const __m256i *)x->qs;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    __m256i i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256();   /* two chains: latency */
    for (int m = 0; m < 4; m++) {
        const __m256i q = _mm256_loadu_si256(c + m);
        i0 = _mm256_dpbusd_epi32(i0, _mm256_and_si256(q, m4), _mm256_loadu_si256(xq + m));
        i1 = _mm256_dpbusd_epi32(i1, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_loadu_si256(xq + 4 + m));
    }
    __m256i i = _mm256_add_epi32(i0, i1);
#else   /* eight maddubs results (each |.| <= 2 * 15 * 127) add up in int16 without overflow */
    __m256i s16 = _mm256_setzero_si256();
    for (int m = 0; m < 4; m++) {
        const __m256i q = _mm256_loadu_si256(c + m);
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_and_si256(q, m4), _mm256_loadu_si256(xq + m)));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                                         _mm256_loadu_si256(xq + 4 + m)));
    }
    __m256i i = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
#endif
    i = _mm256_sub_epi32(i, _mm256_loadu_si256((const __m256i *)x->s8));
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w->d)), _mm256_loadu_ps(x->d));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(i), acc);
}

float pi_vec_dot_q4_0r_q8_0p(int64_t n, const void *w, const void *x) {
    const sb_q4_0r *a = w;
    const sb_q8_0p *b = x;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t s = 0; s < n / 256; s++) acc = sb_dot(&a[s], &b[s], acc);
    return pi_hsum_ps(acc);   /* = pi_tree8 of the lanes */
}


/* The 8 blocks' 16 nibble bytes of super-block w in block order (qs[b] = block b, as in Q4_0). */
static inline void sb_blocks(const sb_q4_0r *w, uint8_t qs[8][16]) {
    const __m256i *c = (const __m256i *)w->qs;
    const __m256i c0 = _mm256_loadu_si256(c), c1 = _mm256_loadu_si256(c + 1);
    const __m256i c2 = _mm256_loadu_si256(c + 2), c3 = _mm256_loadu_si256(c + 3);
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    __m256i *o = (__m256i *)qs;   /* o[p] = blocks 2p | 2p + 1 (lanes p | 4 + p) */
    _mm256_storeu_si256(o, _mm256_unpacklo_epi64(t0, t2));
    _mm256_storeu_si256(o + 1, _mm256_unpackhi_epi64(t0, t2));
    _mm256_storeu_si256(o + 2, _mm256_unpacklo_epi64(t1, t3));
    _mm256_storeu_si256(o + 3, _mm256_unpackhi_epi64(t1, t3));
}

/* The 8 block scales of super-block w times a, in lane order. */
static inline __m256 sb_scales(const sb_q4_0r *w, float a) {
    return _mm256_mul_ps(_mm256_set1_ps(a), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w->d)));
}

void pi_axpy_q4_0r(int64_t n, float a, const void *row, float *y) {
    const sb_q4_0r *w = row;
    for (int64_t s = 0; s < n / 256; s++) {
        float scale[8];
        uint8_t qs[8][16];
        _mm256_storeu_ps(scale, sb_scales(&w[s], a));
        sb_blocks(&w[s], qs);
        for (int b = 0; b < 8; b++) {
            __m256 yb[4];
            pi_load4_ps(y + 256 * s + 32 * b, yb);
            pi_q4_0_axpy_block(_mm256_broadcast_ss(&scale[LANE_OF[b]]), qs[b], yb);
            pi_store4_ps(y + 256 * s + 32 * b, yb);
        }
    }
}

/* Eight rows in order per block, the 32 outputs in registers (same bits as eight pi_axpy_q4_0r). */
void pi_axpy8_q4_0r(int64_t n, const float *a, const void *const *rows, float *y) {
    const sb_q4_0r *const *r = (const sb_q4_0r *const *)rows;
    float scale[8][8];      /* [row][lane] a_k * d */
    uint8_t qs[8][8][16];   /* [row][block] */
#if PI_HAVE_ROWS16
    const __m512 table = pi_q4_0_minus8_table();
    for (int64_t s = 0; s < n / 256; s++) {
        for (int k = 0; k < 8; k++) {
            _mm256_storeu_ps(scale[k], sb_scales(&r[k][s], a[k]));
            sb_blocks(&r[k][s], qs[k]);
        }
        for (int b = 0; b < 8; b++) {
            float *yp = y + 256 * s + 32 * b;
            __m512 yb[2] = { _mm512_loadu_ps(yp), _mm512_loadu_ps(yp + 16) };
            for (int k = 0; k < 8; k++)
                pi_q4_0_axpy_block16(table, _mm512_set1_ps(scale[k][LANE_OF[b]]), qs[k][b], yb);
            _mm512_storeu_ps(yp, yb[0]);
            _mm512_storeu_ps(yp + 16, yb[1]);
        }
    }
    return;
#endif
    for (int64_t s = 0; s < n / 256; s++) {
        for (int k = 0; k < 8; k++) {
            _mm256_storeu_ps(scale[k], sb_scales(&r[k][s], a[k]));
            sb_blocks(&r[k][s], qs[k]);
        }
        for (int b = 0; b < 8; b++) {
            __m256 yb[4];
            pi_load4_ps(y + 256 * s + 32 * b, yb);
            for (int k = 0; k < 8; k++) pi_q4_0_axpy_block(_mm256_broadcast_ss(&scale[k][LANE_OF[b]]), qs[k][b], yb);
            pi_store4_ps(y + 256 * s + 32 * b, yb);
        }
    }
}

#else   /* scalar reference: the same canonical order */

float pi_vec_dot_q4_0r_q8_0p(int64_t n, const void *w, const void *x) {
    const sb_q4_0r *a = w;
    const sb_q8_0p *b = x;
    float acc[8] = { 0 };
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            int32_t i = 0;
            for (int m = 0; m < 4; m++)
                for (int k = 0; k < 4; k++) {
                    const uint8_t q = a[s].qs[m][l][k];
                    i += (q & 15) * b[s].qs[m][l][k] + (q >> 4) * b[s].qs[4 + m][l][k];
                }
            i -= b[s].s8[l];
            acc[l] = fmaf(pi_fp16_to_f32(a[s].d[l]) * b[s].d[l], (float)i, acc[l]);
        }
    return pi_tree8(acc);
}


void pi_axpy_q4_0r(int64_t n, float a, const void *row, float *y) {
    const sb_q4_0r *w = row;
    for (int64_t s = 0; s < n / 256; s++)
        for (int b = 0; b < 8; b++) {
            const float scale = a * pi_fp16_to_f32(w[s].d[LANE_OF[b]]);
            float *yb = y + 256 * s + 32 * b;
            for (int j = 0; j < 16; j++) {
                const uint8_t q = w[s].qs[j / 4][LANE_OF[b]][j % 4];
                yb[j] = fmaf(scale, (float)((q & 15) - 8), yb[j]);
                yb[j + 16] = fmaf(scale, (float)((q >> 4) - 8), yb[j + 16]);
            }
        }
}

#endif

/* Eight rows against nt tokens. With AVX2 the eight rows advance together, one super-block at a time:
 * eight concurrent streams keep more of the scattered rows' memory reads in flight than one. */
void pi_vec_dot8_q4_0r_q8_0p(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) {
#if PI_HAVE_ROWS8
    const sb_q4_0r *const *r = (const sb_q4_0r *const *)rows;
    const int64_t nsb = n / 256;
    for (int t = 0; t < nt; t++) {
        const sb_q8_0p *xt = (const sb_q8_0p *)(x + t * x_stride);
        __m256 acc[8];
        for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
        for (int64_t s = 0; s < nsb; s++) {
            if (t == 0 && s + Q4_0R_PREFETCH < nsb)
                for (int k = 0; k < 8; k++) {
                    const char *p = (const char *)&r[k][s + Q4_0R_PREFETCH];
                    _mm_prefetch(p, _MM_HINT_T0);
                    _mm_prefetch(p + 64, _MM_HINT_T0);
                    _mm_prefetch(p + 128, _MM_HINT_T0);
                }
            for (int k = 0; k < 8; k++) acc[k] = sb_dot(&r[k][s], &xt[s], acc[k]);
        }
        for (int k = 0; k < 8; k++) y[t * y_stride + k] = pi_hsum_ps(acc[k]);
    }
#else
    for (int k = 0; k < 8; k++)
        for (int t = 0; t < nt; t++) y[t * y_stride + k] = pi_vec_dot_q4_0r_q8_0p(n, rows[k], x + t * x_stride);
#endif
}

