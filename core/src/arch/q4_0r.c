/* q4_0r.c: the sparse FFN's load-time Q4_0 layouts and their kernels: PI_TYPE_Q4_0R (rows that are
 * dotted: gate, up), its activation format PI_TYPE_Q8_0P, and PI_TYPE_Q4_0A (rows that are added:
 * down_t, ffn_gate_t).
 *
 * The sparse FFN reads single scattered rows, where the 8-row kernels of rows8.c spend most of their
 * instructions transposing rows and gathering scales. Here a row is read on its own, 256 elements
 * (8 Q4_0 blocks, a "super-block") at a time, in a layout made for its one kernel.
 *
 * Q4_0R super-block (144 bytes): the 8 fp16 block scales, lane l holding block BLOCK_OF[l]; then four
 * 32-byte vectors c_m (m < 4) whose 4-byte lane l is bytes 4m..4m+3 of block BLOCK_OF[l] (each byte as
 * in Q4_0: byte j = elements j (low nibble) and j + 16 (high nibble)).
 * Q8_0P super-block (320 bytes): the 8 activation block scales as f32 and 8 x the 8 block sums (int32),
 * in lane order, then eight 32-byte vectors X_m: lane l of X_m (m < 4) = elements 4m..4m+3 of block
 * BLOCK_OF[l], of X_{4+m} = elements 16+4m..16+4m+3.
 * So the low nibbles of c_m pair with X_m, the high ones with X_{4+m}, and eight VNNI products (or
 * maddubs) accumulate each block's exact integer dot product in its own lane: no horizontal adds.
 *
 * Q4_0A super-block (144 bytes): the 8 fp16 block scales in block order, then two halves of 64 bytes;
 * byte 16L + 4m + k of half w (L, m, k < 4) holds element 128w + 16m + 4L + k (low nibble) and element
 * 128w + 64 + 16m + 4L + k (high nibble). Interleaving the bytes of four rows (two unpack steps) puts
 * the four rows' nibbles of one element in one 4-byte lane, in element order: sixteen consecutive
 * elements per 512-bit register, all of one block.
 *
 * Canonical arithmetic (every kernel of this file, at every level, gives these bits):
 *   dot (Q4_0R . Q8_0P): lane l accumulates acc_l = fma(d_w * d_x, i_b, acc_l) over the super-blocks in
 *         order (b = block BLOCK_OF[l] of each; i_b the exact integer sum q . x - 8 s), and the result is
 *         pi_tree8 over the lanes.
 *   axpy of one Q4_0A (or Q4_0R) row: y[e] = fma(a * d_b, q_e - 8, y[e]), as pi_axpy_q4_0.
 *   axpy8 of eight Q4_0A rows (a group): per block b, c_kb = a_k * d_kb (f32), amax_b = max_k |c_kb|,
 *         S_b = amax_b / 16256, and the integer coefficients n_kb = rint(c_kb * (amax_b > 0 ? 16256 / amax_b : 0));
 *         then y[e] = fma(S_b, (float)(sum_k n_kb (q_ke - 8)), y[e]) with the sum exact in int32. So the
 *         group's rows are summed in integers (one fma per element per 8 rows instead of 8), with h
 *         rounded to 1/32512 of the group's largest coefficient per block (the kernels take n = 128 hi + lo
 *         as two signed bytes: two VNNI products per 4 rows). An 8-bit n (one product) was measured 2.2% off
 *         in a small model's logits; this is below the dot products' own rounding.
 * Rows must have a multiple of 256 elements (the types' block size). */
#include "../internal.h"

#include <math.h>
#include <string.h>

static const int BLOCK_OF[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };   /* lane l holds block BLOCK_OF[l] */
static const int LANE_OF[8] = { 0, 4, 1, 5, 2, 6, 3, 7 };    /* block b sits in lane LANE_OF[b] */

/* The coefficients' range: 127 * 128, so that n = 128 hi + lo with hi and lo signed bytes (|lo| <= 64). */
#define Q4_0A_COEF_MAX 16256.0f

typedef struct { uint16_t d[8]; uint8_t qs[4][8][4]; } sb_q4_0r;                  /* 144 bytes */
typedef struct { float d[8]; int32_t s8[8]; int8_t qs[8][8][4]; } sb_q8_0p;       /* 320 bytes */
typedef struct { uint16_t d[8]; uint8_t qs[2][4][4][4]; } sb_q4_0a;               /* qs[w][L][m][k], 144 bytes */
_Static_assert(sizeof(sb_q4_0r) == 144 && sizeof(sb_q8_0p) == 320 && sizeof(sb_q4_0a) == 144, "super-block sizes");

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

/* Q4_0A: element i of a super-block lives at half w = i / 128, nibble (i % 128) / 64, and byte
 * 16L + 4m + k with i % 64 = 16m + 4L + k. */
static inline int q4_0a_byte(int i) { return 64 * (i / 128) + 16 * (i % 16 / 4) + 4 * (i % 64 / 16) + i % 4; }
static inline int q4_0a_shift(int i) { return i % 128 / 64 * 4; }

/* Quant e (0..15) of the 8 Q4_0 blocks x of a super-block. */
static inline uint8_t q4_0_quant(const pi_block_q4_0 *x, int e) {
    const int j = e % 32;
    return j < 16 ? x[e / 32].qs[j] & 15 : x[e / 32].qs[j - 16] >> 4;
}

void pi_q4_0a_from_q4_0(int64_t n, const void *src, void *dst) {
    const pi_block_q4_0 *x = src;
    sb_q4_0a *y = dst;
    for (int64_t s = 0; s < n / 256; s++) {
        const pi_block_q4_0 *xs = x + 8 * s;
        for (int b = 0; b < 8; b++) y[s].d[b] = xs[b].d;
        for (int w = 0; w < 2; w++)
            for (int L = 0; L < 4; L++)
                for (int m = 0; m < 4; m++)
                    for (int k = 0; k < 4; k++) {
                        const int e = 128 * w + 16 * m + 4 * L + k;
                        y[s].qs[w][L][m][k] = (uint8_t)(q4_0_quant(xs, e) | q4_0_quant(xs, e + 64) << 4);
                    }
    }
}

/* The 256 quants (0..15) of super-block w in element order. */
static inline void q4_0a_unpack(const sb_q4_0a *w, uint8_t q[256]) {
    const uint8_t *qs = &w->qs[0][0][0][0];
    for (int i = 0; i < 256; i++) q[i] = qs[q4_0a_byte(i)] >> q4_0a_shift(i) & 15;
}

void pi_q4_0a_to_f32(const void *src, float *dst, int64_t n) {
    const sb_q4_0a *x = src;
    for (int64_t s = 0; s < n / 256; s++) {
        uint8_t q[256];
        q4_0a_unpack(&x[s], q);
        for (int i = 0; i < 256; i++) dst[256 * s + i] = (float)(q[i] - 8) * pi_fp16_to_f32(x[s].d[i / 32]);
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

/* ---- axpy of one row (the same C at every level: a group's remainder, rows of either layout) ---- */

void pi_axpy_q4_0r(int64_t n, float a, const void *row, float *y) {
    const sb_q4_0r *w = row;
    for (int64_t s = 0; s < n / 256; s++)
        for (int l = 0; l < 8; l++) {
            const float scale = a * pi_fp16_to_f32(w[s].d[l]);
            float *yb = y + 256 * s + 32 * BLOCK_OF[l];
            for (int j = 0; j < 16; j++) {
                const uint8_t q = w[s].qs[j / 4][l][j % 4];
                yb[j] = fmaf(scale, (float)((q & 15) - 8), yb[j]);
                yb[j + 16] = fmaf(scale, (float)((q >> 4) - 8), yb[j + 16]);
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

/* ---- Q4_0A groups of 8 rows ---- */

/* A group's per-block numbers for super-block s: the coefficients n_kb = 128 hi_kb + lo_kb (hi, lo: signed
 * bytes, |lo| <= 64), as the 4 bytes of rows 4g..4g+3 per block (an int32 to broadcast): hi[g][b], lo[g][b];
 * negcorr[b] = -8 sum_k n_kb; scale[b] = S_b (see the top of the file). */
typedef struct { int32_t hi[2][8], lo[2][8]; int32_t negcorr[8]; float scale[8]; } q4_0a_group;

/* bytes [row][block] of rows 4h..4h+3 (int32 lanes: blocks) -> per block the 4 rows' bytes: two packs, then a
 * 4x4 byte transpose per 128-bit lane */
static inline __m256i q4_0a_bytes4(const __m256i v[4]) {
    const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm256_shuffle_epi8(_mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])), tr);
}

static inline void q4_0a_group_setup(const float *a, const sb_q4_0a *const *r, int64_t s, q4_0a_group *g) {
    __m256 c[8], amax = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m[8];
    for (int k = 0; k < 8; k++) {
        c[k] = _mm256_mul_ps(_mm256_set1_ps(a[k]), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r[k][s].d)));
        m[k] = _mm256_and_ps(c[k], abs_mask);
    }
    /* a tree (exact, any order): max of the magnitudes, and 0 for a block whose coefficients are all 0 */
    amax = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])),
                         _mm256_max_ps(_mm256_max_ps(m[4], m[5]), _mm256_max_ps(_mm256_max_ps(m[6], m[7]), amax)));
    const __m256 top = _mm256_set1_ps(Q4_0A_COEF_MAX);
    const __m256 inv = _mm256_and_ps(_mm256_div_ps(top, amax), _mm256_cmp_ps(amax, _mm256_setzero_ps(), _CMP_GT_OQ));
    _mm256_storeu_ps(g->scale, _mm256_div_ps(amax, top));
    __m256i hi[8], lo[8], sum = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const __m256i n = _mm256_cvtps_epi32(_mm256_mul_ps(c[k], inv));
        sum = _mm256_add_epi32(sum, n);
        hi[k] = _mm256_srai_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(64)), 7);
        lo[k] = _mm256_sub_epi32(n, _mm256_slli_epi32(hi[k], 7));
    }
    _mm256_storeu_si256((__m256i *)g->negcorr, _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 3)));
    for (int h = 0; h < 2; h++) {
        _mm256_storeu_si256((__m256i *)g->hi[h], q4_0a_bytes4(hi + 4 * h));
        _mm256_storeu_si256((__m256i *)g->lo[h], q4_0a_bytes4(lo + 4 * h));
    }
}

/* Rows 4g..4g+3's bytes at offset off of super-block s, interleaved: u[m] lane (L, k) = the four rows'
 * byte 16L + 4m + k (256-bit: L < 2 from off, the caller passes off + 32 for the other two). */
static inline void q4_0a_interleave4(const sb_q4_0a *const *r, int64_t s, int off, __m256i u[4]) {
#define ROW(k) _mm256_loadu_si256((const __m256i *)((const uint8_t *)r[k][s].qs + off))
    const __m256i r0 = ROW(0), r1 = ROW(1), r2 = ROW(2), r3 = ROW(3);
#undef ROW
    const __m256i t0 = _mm256_unpacklo_epi8(r0, r1), t1 = _mm256_unpackhi_epi8(r0, r1);
    const __m256i t2 = _mm256_unpacklo_epi8(r2, r3), t3 = _mm256_unpackhi_epi8(r2, r3);
    u[0] = _mm256_unpacklo_epi16(t0, t2);
    u[1] = _mm256_unpackhi_epi16(t0, t2);
    u[2] = _mm256_unpacklo_epi16(t1, t3);
    u[3] = _mm256_unpackhi_epi16(t1, t3);
}

void pi_axpy8_q4_0a(int64_t n, const float *a, const void *const *rows, float *y) {
    const sb_q4_0a *const *r = (const sb_q4_0a *const *)rows;
    const sb_q4_0a *r4[4];
    for (int64_t s = 0; s < n / 256; s++) {
        q4_0a_group g;
        q4_0a_group_setup(a, r, s, &g);
#if PI_HAVE_ROWS16
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        for (int w = 0; w < 2; w++) {
            /* output vector o: elements 128w + 16o .. +15, all of block 4w + o / 2; sums of hi and lo bytes apart */
            __m512i ah[8], al[8];
            for (int o = 0; o < 8; o++) {
                ah[o] = _mm512_setzero_si512();
                al[o] = _mm512_set1_epi32(g.negcorr[4 * w + o / 2]);
            }
            for (int h = 0; h < 2; h++) {
#define ROW(k) _mm512_loadu_si512((const void *)r[4 * h + k][s].qs[w])
                const __m512i r0 = ROW(0), r1 = ROW(1), r2 = ROW(2), r3 = ROW(3);
#undef ROW
                const __m512i t0 = _mm512_unpacklo_epi8(r0, r1), t1 = _mm512_unpackhi_epi8(r0, r1);
                const __m512i t2 = _mm512_unpacklo_epi8(r2, r3), t3 = _mm512_unpackhi_epi8(r2, r3);
                const __m512i u[4] = { _mm512_unpacklo_epi16(t0, t2), _mm512_unpackhi_epi16(t0, t2),
                                       _mm512_unpacklo_epi16(t1, t3), _mm512_unpackhi_epi16(t1, t3) };
                for (int m = 0; m < 4; m++) {
                    const __m512i ql = _mm512_and_si512(u[m], m4), qh = _mm512_and_si512(_mm512_srli_epi16(u[m], 4), m4);
                    const int bl = 4 * w + m / 2, bh = bl + 2;
                    ah[m] = _mm512_dpbusd_epi32(ah[m], ql, _mm512_set1_epi32(g.hi[h][bl]));
                    al[m] = _mm512_dpbusd_epi32(al[m], ql, _mm512_set1_epi32(g.lo[h][bl]));
                    ah[4 + m] = _mm512_dpbusd_epi32(ah[4 + m], qh, _mm512_set1_epi32(g.hi[h][bh]));
                    al[4 + m] = _mm512_dpbusd_epi32(al[4 + m], qh, _mm512_set1_epi32(g.lo[h][bh]));
                }
            }
            float *yw = y + 256 * s + 128 * w;
            for (int o = 0; o < 8; o++) {
                const __m512i i = _mm512_add_epi32(_mm512_slli_epi32(ah[o], 7), al[o]);
                _mm512_storeu_ps(yw + 16 * o, _mm512_fmadd_ps(_mm512_set1_ps(g.scale[4 * w + o / 2]),
                                                              _mm512_cvtepi32_ps(i), _mm512_loadu_ps(yw + 16 * o)));
            }
        }
        PI_UNUSED(r4);
#else
        const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
        for (int w = 0; w < 2; w++)
            for (int v = 0; v < 2; v++) {   /* lanes L = 2v, 2v + 1 of half w: elements 128w + 16o + 8v .. +7 */
                __m256i sh[8], sl[8];       /* int16 sums of the hi and lo bytes' products */
                for (int h = 0; h < 2; h++) {
                    for (int k = 0; k < 4; k++) r4[k] = r[4 * h + k];
                    __m256i u[4];
                    q4_0a_interleave4(r4, s, 64 * w + 32 * v, u);
                    for (int m = 0; m < 4; m++) {   /* maddubs: |.| <= 2 * 15 * 127, two of them fit int16 */
                        const __m256i ql = _mm256_and_si256(u[m], m4), qh = _mm256_and_si256(_mm256_srli_epi16(u[m], 4), m4);
                        const int bl = 4 * w + m / 2, bh = bl + 2;
                        const __m256i p[4] = { _mm256_maddubs_epi16(ql, _mm256_set1_epi32(g.hi[h][bl])),
                                               _mm256_maddubs_epi16(ql, _mm256_set1_epi32(g.lo[h][bl])),
                                               _mm256_maddubs_epi16(qh, _mm256_set1_epi32(g.hi[h][bh])),
                                               _mm256_maddubs_epi16(qh, _mm256_set1_epi32(g.lo[h][bh])) };
                        sh[m] = h ? _mm256_add_epi16(sh[m], p[0]) : p[0];
                        sl[m] = h ? _mm256_add_epi16(sl[m], p[1]) : p[1];
                        sh[4 + m] = h ? _mm256_add_epi16(sh[4 + m], p[2]) : p[2];
                        sl[4 + m] = h ? _mm256_add_epi16(sl[4 + m], p[3]) : p[3];
                    }
                }
                float *yv = y + 256 * s + 128 * w + 8 * v;
                for (int o = 0; o < 8; o++) {
                    const __m256i i = _mm256_add_epi32(
                        _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(sh[o], ones), 7), _mm256_madd_epi16(sl[o], ones)),
                        _mm256_set1_epi32(g.negcorr[4 * w + o / 2]));
                    _mm256_storeu_ps(yv + 16 * o, _mm256_fmadd_ps(_mm256_set1_ps(g.scale[4 * w + o / 2]),
                                                                  _mm256_cvtepi32_ps(i), _mm256_loadu_ps(yv + 16 * o)));
                }
            }
#endif
    }
}

/* One Q4_0A row: y[e] = fma(a d_b, q - 8, y[e]). */
void pi_axpy_q4_0a(int64_t n, float a, const void *row, float *y) {
    const sb_q4_0a *w = row;
    const __m256i m4 = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
    for (int64_t s = 0; s < n / 256; s++) {
        float scale[8];
        _mm256_storeu_ps(scale, _mm256_mul_ps(_mm256_set1_ps(a), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w[s].d))));
        for (int w2 = 0; w2 < 2; w2++)
            for (int m = 0; m < 4; m++)
                for (int v = 0; v < 2; v++) {
                    /* bytes 16L + 4m + k for L = 2v, 2v + 1: elements 128 w2 + 16m + 8v + 4(L - 2v) + k */
                    const uint8_t *qs = w[s].qs[w2][2 * v][m];
                    const __m256i b = _mm256_cvtepu8_epi32(_mm_unpacklo_epi32(_mm_cvtsi32_si128(pi_load_i32(qs)),
                                                                             _mm_cvtsi32_si128(pi_load_i32(qs + 16))));
                    float *lo = y + 256 * s + 128 * w2 + 16 * m + 8 * v, *hi = lo + 64;
                    const __m256 qlo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b, m4), eight));
                    const __m256 qhi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 4), eight));
                    _mm256_storeu_ps(lo, _mm256_fmadd_ps(_mm256_set1_ps(scale[4 * w2 + m / 2]), qlo, _mm256_loadu_ps(lo)));
                    _mm256_storeu_ps(hi, _mm256_fmadd_ps(_mm256_set1_ps(scale[4 * w2 + 2 + m / 2]), qhi, _mm256_loadu_ps(hi)));
                }
    }
}

#else   /* scalar reference: the same canonical orders */

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

void pi_axpy_q4_0a(int64_t n, float a, const void *row, float *y) {
    const sb_q4_0a *w = row;
    for (int64_t s = 0; s < n / 256; s++) {
        uint8_t q[256];
        q4_0a_unpack(&w[s], q);
        for (int i = 0; i < 256; i++)
            y[256 * s + i] = fmaf(a * pi_fp16_to_f32(w[s].d[i / 32]), (float)(q[i] - 8), y[256 * s + i]);
    }
}

void pi_axpy8_q4_0a(int64_t n, const float *a, const void *const *rows, float *y) {
    const sb_q4_0a *const *r = (const sb_q4_0a *const *)rows;
    for (int64_t s = 0; s < n / 256; s++) {
        uint8_t q[8][256];
        for (int k = 0; k < 8; k++) q4_0a_unpack(&r[k][s], q[k]);
        for (int b = 0; b < 8; b++) {
            float c[8], amax = 0.0f;
            for (int k = 0; k < 8; k++) {
                c[k] = a[k] * pi_fp16_to_f32(r[k][s].d[b]);
                amax = fmaxf(amax, fabsf(c[k]));
            }
            const float inv = amax > 0.0f ? Q4_0A_COEF_MAX / amax : 0.0f, scale = amax / Q4_0A_COEF_MAX;
            int32_t nk[8], corr = 0;
            for (int k = 0; k < 8; k++) {
                nk[k] = (int32_t)nearbyintf(c[k] * inv);
                corr += 8 * nk[k];
            }
            for (int i = 32 * b; i < 32 * b + 32; i++) {
                int32_t sum = -corr;
                for (int k = 0; k < 8; k++) sum += nk[k] * q[k][i];
                y[256 * s + i] = fmaf(scale, (float)sum, y[256 * s + i]);
            }
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
