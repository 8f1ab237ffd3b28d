/* kx16.c: K-quant weights interleaved 16 rows to a group: Q4_K and Q5_K (PI_TYPE_Q4_KX16, Q5_KX16; pi_block_q4_Kx16,
 * pi_block_q5_Kx16 in quants_k.h), the layout decode reads fastest: a group is one contiguous stream with the file's
 * bytes (144 or 176 per row and super-block), regrouped so that every 64-byte row holds one 32-bit word of each row:
 * the quants are already in the "transposed" form of the multi-row kernels (no byte shuffles), d and dmin are two
 * fp16 vectors, and the packed 6-bit scales decode lane-wise (pi_k4_scale_min on all 16 rows at once); amx_k.c's
 * tile kernel takes its B tiles from Q4_KX16's quants with a nibble mask.
 *
 * Measured on a Zen 3 (AVX2, one thread, bench/ab_ops.py against a build that keeps the file's layout): Q5_KX16
 * prompt matmuls (T = 128) 0.93x the time, decode 0.76-1.09x (weights from DRAM; 0.67x from cache) when measured,
 * 1.2x at two threads on 2026-12-06 (a pass per half: below), 1.03-1.06x with the one-token pass. Q6_K's copy
 * (Q6_KX16) is made at load only at the AVX-512 levels: on the Zen 3 the same regrouping made its AVX2 prompts
 * 0.87-0.92x but decode 1.1-2x the time of its single-row kernel (pi_vec_dot_q6_K_q8_K), so the avx2 level converts
 * rows for prompts instead (pi_q6_K_to_x16); its AVX-512 kernel (below) takes 0.47x the time of the file layout's
 * kernels for prompts and for decode on a Zen 5.
 *
 * pi_gemm16_q4_Kx16_q8_K: one group (16 rows) x nt <= PI_DOT8_MAX_T tokens of Q8_KM activations, every level:
 * AVX-512 in 16 lanes with VNNI, AVX2 as two halves of 8 rows through rows8_k.c's k4_block8, scalar loops.
 * All follow Q4_K's canonical order (pi_vec_dot_q4_K_q8_K, rows8_k.c): per super-block the exact integers
 * sumi = sum_j sc_j mx_j sum_l q_l y_l and summ = sum_j mn_j mx_j (bsum_2j + bsum_2j+1), then
 * acc = acc + d_x * (d * sumi - dmin * summ), super-blocks in order; so a repacked model gives the file layout's
 * bits at every level. */
#include "../quants_k.h"

#include <string.h>

#if PI_HAVE_ROWS8
#include <immintrin.h>

#include "avx2_util.h"
#endif

/* Where a row's super-block goes in its group's (quants_k.h): the fp16 scales at row bytes f16_row[i] become the
 * vectors of 16 at group bytes f16_group[i], the words at row bytes w0 + 4i (i < n_words) the 64-byte rows at group
 * bytes words_group + 64i. */
typedef struct {
    int64_t row_bytes;
    int n_f16, f16_row[2], f16_group[2];
    int w0, n_words, words_group;
} kx16_layout;
static const kx16_layout q4_Kx16_layout = { sizeof(pi_block_q4_K), 2, { 0, 2 }, { 0, 32 }, 4, 35, 64 };
static const kx16_layout q5_Kx16_layout = { sizeof(pi_block_q5_K), 2, { 0, 2 }, { 0, 32 }, 4, 43, 64 };
static const kx16_layout q6_Kx16_layout = { sizeof(pi_block_q6_K), 1, { 208, 0 }, { 0, 0 }, 0, 52, 32 };
static const kx16_layout q8_kwx16_layout = { sizeof(pi_block_q8_kw), 0, { 0, 0 }, { 0, 0 }, 0, 69, 0 };
static const kx16_layout q2_Kx16_layout = { sizeof(pi_block_q2_K), 2, { 80, 82 }, { 0, 32 }, 0, 20, 64 };
/* IQ4_XSX16: d, then scales_h (the same 16-bit moves), then 33 words: scales_l, the 32 words of qs */
static const kx16_layout iq4_xsx16_layout = { sizeof(pi_block_iq4_xs), 2, { 0, 2 }, { 0, 32 }, 4, 33, 64 };

/* Row r's super-block between a group's block gb and a row block rb: into the group (to_group) or out of it. */
static void kx16_copy(const kx16_layout *L, char *gb, char *rb, int r, int to_group) {
#define KX16_MOVE(group_bytes, row_bytes, n) \
    (to_group ? memcpy((group_bytes), (row_bytes), (n)) : memcpy((row_bytes), (group_bytes), (n)))
    for (int i = 0; i < L->n_f16; i++) KX16_MOVE(gb + L->f16_group[i] + 2 * r, rb + L->f16_row[i], 2);
    for (int i = 0; i < L->n_words; i++)
        KX16_MOVE(gb + L->words_group + 64 * i + 4 * r, rb + L->w0 + 4 * i, 4);
#undef KX16_MOVE
}

static void kx16_repack(const kx16_layout *L, int64_t n, const void *const *rows, void *group) {
    for (int64_t b = 0; b < n / PI_QK_K; b++)
        for (int r = 0; r < 16; r++)
            kx16_copy(L, (char *)group + 16 * L->row_bytes * b, (char *)rows[r] + L->row_bytes * b, r, 1);
}

void pi_repack_q4_Kx16(int64_t n, const void *const *rows, void *group) { kx16_repack(&q4_Kx16_layout, n, rows, group); }
void pi_repack_q5_Kx16(int64_t n, const void *const *rows, void *group) { kx16_repack(&q5_Kx16_layout, n, rows, group); }
void pi_repack_iq4_xsx16(int64_t n, const void *const *rows, void *group) {
    kx16_repack(&iq4_xsx16_layout, n, rows, group);
}

/* Rows copied out of the group, then the type's vec_dot per token (the reference itself): every layout's kernel at the
 * scalar level, and Q6_KX16's below the AVX-512 levels (which do not make that copy, but run one made above them). */
static inline void kx16_gemm16_rows(const kx16_layout *L, pi_vec_dot_fn dot, int64_t n, const void *group, const char *x,
                                    int64_t x_stride, int nt, float *y, int64_t y_stride) {
    char row[n / PI_QK_K * L->row_bytes];
    for (int r = 0; r < 16; r++) {
        for (int64_t b = 0; b < n / PI_QK_K; b++)   /* read only: kx16_copy with to_group = 0 */
            kx16_copy(L, (char *)group + 16 * L->row_bytes * b, row + L->row_bytes * b, r, 0);
        for (int t = 0; t < nt; t++) y[t * y_stride + r] = dot(n, row, x + t * x_stride);
    }
}

#if PI_HAVE_ROWS16
#ifndef Q4KX16_PF_DIST
#define Q4KX16_PF_DIST 4   /* super-blocks ahead (2304 bytes each): 4 beat 2 by 4% from DRAM (ab_ops, one thread) */
#endif
#ifndef Q4KX16_PF_HINT
#if defined(__AMX_INT8__)   /* the amx level (Intel): into L2. Sapphire Rapids, 542M Q4_K_M decode 1.10x (bench/README.md) */
#define Q4KX16_PF_HINT _MM_HINT_T1
#else                       /* into L1: what the AMD CPUs were measured with */
#define Q4KX16_PF_HINT _MM_HINT_T0
#endif
#endif
/* Byte j0 of every 32-bit lane of v zero-extended into the lane's low int16, byte j1 into its high int16 (j1 < 0:
 * zero): per-row scales as int32 (sc_j) or int16 pairs (mn_2i, mn_2i+1). */
static inline __m512i q4kx16_lane_bytes(__m512i v, int j0, int j1) {
    const __m512i lane = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0);
    const int hi = j1 < 0 ? 0x8080 : 0x8000 | j1;
    const __m512i idx = _mm512_or_si512(_mm512_and_si512(lane, _mm512_set1_epi32(j1 < 0 ? 0xff : 0x00ff00ff)),
                                        _mm512_set1_epi32((int)((unsigned)hi << 16 | 0x8000u | (unsigned)j0)));
    return _mm512_shuffle_epi8(v, idx);
}

/* nt (1, 2 or 4, a constant after inlining) tokens of one Q4_KX16 group, or (five_bit) of one Q5_KX16 group: both
 * start each super-block with d[16], dmin[16], then 64-byte words (the rows' scales, for Q5_K qh, then qs). Sub-block
 * sums C_j of the 16 rows by VNNI (u8 weights, s8 activations broadcast; below 4 tokens two chains per sub-block and
 * token, so at least four chains hide vpdpbusd's latency); Q4_K's high nibbles enter as 16 q (the byte & 0xf0), their
 * sum is shifted back exactly once per sub-block; Q5_K's quants (q up to 31) are built whole, nibble | fifth bit << 4.
 * sumi += (sc_j mx_j) C_j in int32 (quants_k.h's budget). Each unpacked weight register feeds nt tokens: 4 tokens
 * took 0.8x the time of 2 on a Zen 4 (542M ffn_up/ffn_gate, T = 512). */
#define Q4KX16_MAX_T 4
static inline __attribute__((always_inline)) void q4_Kx16_tokens(int64_t nb, const void *group, const int five_bit,
                                                               const char *x, int64_t x_stride, const int nt,
                                                               float *y, int64_t y_stride) {
    const int64_t block_bytes = five_bit ? (int64_t)sizeof(pi_block_q5_Kx16) : (int64_t)sizeof(pi_block_q4_Kx16);
    const int qs_word = five_bit ? 11 : 3;   /* the word of qs[0] (after the scales' 3 and, for Q5_K, qh's 8) */
    const __m512i m4 = _mm512_set1_epi8(0x0f), mf0 = _mm512_set1_epi8((char)0xf0), m6 = _mm512_set1_epi8(0x3f);
    const __m512i m2h = _mm512_set1_epi8(0x30);
    const int ch = nt >= 4 ? 1 : 2;   /* chains per token and nibble half */
    __m512 acc[Q4KX16_MAX_T];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *gb = (const char *)group + b * block_bytes;
        const uint8_t (*words)[64] = (const uint8_t (*)[64])(gb + 64);   /* after d[16], dmin[16] */
        const __m512i u0 = _mm512_loadu_si512(words[0]), u1 = _mm512_loadu_si512(words[1]);
        const __m512i u2 = _mm512_loadu_si512(words[2]);
        const __m512i sc03 = _mm512_and_si512(u0, m6), mn03 = _mm512_and_si512(u1, m6);
        const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(u2, m4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), m2h));
        const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                             _mm512_and_si512(_mm512_srli_epi32(u1, 2), m2h));
        const pi_block_q8_Km *xm[Q4KX16_MAX_T];
        __m512i sumi[Q4KX16_MAX_T];
        for (int t = 0; t < nt; t++) {
            xm[t] = (const pi_block_q8_Km *)(x + t * x_stride) + b;
            sumi[t] = _mm512_setzero_si512();
        }
        for (int jj = 0; jj < 4; jj++) {   /* qs[8jj..8jj+7]: low nibbles sub-block 2jj, high nibbles 2jj + 1 */
            for (int i = 0; i < (five_bit ? 11 : 9); i++)   /* a quarter of the super-block PF_DIST ahead */
                _mm_prefetch(gb + Q4KX16_PF_DIST * block_bytes + 64 * ((five_bit ? 11 : 9) * jj + i), Q4KX16_PF_HINT);
            __m512i c[Q4KX16_MAX_T][4];
            for (int t = 0; t < nt; t++)
                for (int k = 0; k < 2 * ch; k++) c[t][k] = _mm512_setzero_si512();
            for (int m = 0; m < 8; m++) {
                const __m512i v = _mm512_loadu_si512(words[qs_word + 8 * jj + m]);
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(v, mf0);
                if (five_bit) {   /* bit 2jj (2jj + 1) of qh byte l is the fifth bit of element l of sub-block 2jj (+ 1) */
                    const __m512i qh = _mm512_loadu_si512(words[3 + m]), one = _mm512_set1_epi8(1);
                    lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * jj), one), 4));
                    hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * jj + 1), one), 4));
                }
                for (int t = 0; t < nt; t++) {
                    const int8_t *yq = xm[t]->k.qs + 64 * jj + 4 * m;
                    const int k = ch == 2 ? (m & 1) : 0;   /* c[t][k]: low nibbles, c[t][ch + k]: high */
                    c[t][k] = _mm512_dpbusd_epi32(c[t][k], lo, _mm512_set1_epi32(pi_load_i32(yq)));
                    c[t][ch + k] = _mm512_dpbusd_epi32(c[t][ch + k], hi, _mm512_set1_epi32(pi_load_i32(yq + 32)));
                }
            }
            const __m512i sc_lo = q4kx16_lane_bytes(jj < 2 ? sc03 : sc47, (2 * jj) % 4, -1);
            const __m512i sc_hi = q4kx16_lane_bytes(jj < 2 ? sc03 : sc47, (2 * jj + 1) % 4, -1);
            for (int t = 0; t < nt; t++) {   /* sc_j mx_j < 2^11: one int16 multiply (the high halves stay 0) */
                const __m512i scm_lo = _mm512_mullo_epi16(sc_lo, _mm512_set1_epi32(xm[t]->m[2 * jj]));
                const __m512i scm_hi = _mm512_mullo_epi16(sc_hi, _mm512_set1_epi32(xm[t]->m[2 * jj + 1]));
                const __m512i c_lo = ch == 2 ? _mm512_add_epi32(c[t][0], c[t][1]) : c[t][0];
                const __m512i c_hi16 = ch == 2 ? _mm512_add_epi32(c[t][2], c[t][3]) : c[t][1];
                const __m512i c_hi = five_bit ? c_hi16 : _mm512_srai_epi32(c_hi16, 4);   /* Q4_K: 16 q entered */
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(scm_lo, c_lo),
                                                                     _mm512_mullo_epi32(scm_hi, c_hi)));
            }
        }
        /* summ: madd of (mn_2i, mn_2i+1) mx per lane against (bs_2i, bs_2i+1), bs_j = bsum_2j + bsum_2j+1 */
        __m512i mp[4];
        for (int i = 0; i < 4; i++) mp[i] = q4kx16_lane_bytes(i < 2 ? mn03 : mn47, (2 * i) % 4, (2 * i) % 4 + 1);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        for (int t = 0; t < nt; t++) {
            const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)xm[t]->k.bsums),
                                              _mm_loadu_si128((const __m128i *)xm[t]->k.bsums + 1));
            const __m512i bsv = _mm512_broadcast_i32x4(bs);
            const __m512i mxv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xm[t]->m));
            __m512i summ = _mm512_setzero_si512();
            /* the four steps spelled out (32-bit word i of each 128-bit lane): _mm512_shuffle_epi32 takes a literal
             * immediate, which a build without loop unrolling (PI_SANITIZE) cannot make of 0x55 * i */
#define KX16_MINS(i, pick)                                                                                         \
            summ = _mm512_add_epi32(summ, _mm512_madd_epi16(                                                       \
                       _mm512_mullo_epi16(mp[i], _mm512_shuffle_epi32(mxv, pick)),                                 \
                       _mm512_shuffle_epi32(bsv, pick)))
            KX16_MINS(0, _MM_PERM_AAAA);
            KX16_MINS(1, _MM_PERM_BBBB);
            KX16_MINS(2, _MM_PERM_CCCC);
            KX16_MINS(3, _MM_PERM_DDDD);
#undef KX16_MINS
            const __m512 v = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi[t])),
                                           _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summ)));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(xm[t]->k.d), v));
        }
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + t * y_stride, acc[t]);
}

static inline __attribute__((always_inline)) void k4x16_gemm16_512(int64_t n, const void *group, const int five_bit,
                                                                   const char *x, int64_t x_stride, int nt, float *y,
                                                                   int64_t y_stride) {
    int t = 0;
    for (; t + 4 <= nt; t += 4) q4_Kx16_tokens(n / PI_QK_K, group, five_bit, x + t * x_stride, x_stride, 4, y + t * y_stride, y_stride);
    for (; t + 2 <= nt; t += 2) q4_Kx16_tokens(n / PI_QK_K, group, five_bit, x + t * x_stride, x_stride, 2, y + t * y_stride, y_stride);
    if (t < nt) q4_Kx16_tokens(n / PI_QK_K, group, five_bit, x + t * x_stride, x_stride, 1, y + t * y_stride, y_stride);
}

void pi_gemm16_q4_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    k4x16_gemm16_512(n, group, 0, x, x_stride, nt, y, y_stride);
}

void pi_gemm16_q5_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    k4x16_gemm16_512(n, group, 1, x, x_stride, nt, y, y_stride);
}

/* IQ4_XSX16 (header d[16] fp16, scales_h[16]; word 0 the rows' scales_l, words 1.. qs), nt (1, 2 or 4) tokens, in
 * IQ4_XS's canonical order (pi_vec_dot_iq4_xs_q8_K): per super-block sumi = sum_j (ls_j - 32) C_j with C_j the exact
 * sum of PI_IQ4_VALUES[q] y over sub-block j's 32 elements, then acc = acc + (d_x * d) * sumi. VNNI takes unsigned
 * weights: the nibbles look up value + 128 (one vpshufb), and C_j = sum (v + 128) y - 128 (bsum_2j + bsum_2j+1), the
 * offset the chain's start. |C_j| <= 32 * 128 * 127, |sumi| <= 8 * 32 * |C_j| < 2^31. */
static inline __attribute__((always_inline)) void iq4_xsx16_tokens(int64_t nb, const void *group, const char *x,
                                                                 int64_t x_stride, const int nt, float *y,
                                                                 int64_t y_stride) {
    const int64_t block_bytes = 16 * (int64_t)sizeof(pi_block_iq4_xs);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i grid = pi_iq4_grid_u8_512();
    __m512 acc[Q4KX16_MAX_T];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *gb = (const char *)group + b * block_bytes;
        const uint8_t (*words)[64] = (const uint8_t (*)[64])(gb + 64);   /* after d[16], scales_h[16] */
        const __m512i sl = _mm512_loadu_si512(words[0]);
        const __m512i sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        const pi_block_q8_K *xb[Q4KX16_MAX_T];
        __m512i sumi[Q4KX16_MAX_T];
        for (int t = 0; t < nt; t++) {
            xb[t] = (const pi_block_q8_K *)(x + t * x_stride) + b;
            sumi[t] = _mm512_setzero_si512();
        }
        for (int j = 0; j < PI_QK_K / PI_QK; j++) {
            for (int i = 34 * j / 8; i < 34 * (j + 1) / 8; i++)   /* this sub-block's share of the 34 lines */
                _mm_prefetch(gb + Q4KX16_PF_DIST * block_bytes + 64 * i, Q4KX16_PF_HINT);
            __m512i c[Q4KX16_MAX_T][2];   /* low nibbles (elements 32j + 4mm..), high (32j + 16 + 4mm..) */
            for (int t = 0; t < nt; t++) {
                c[t][0] = _mm512_set1_epi32(-128 * (xb[t]->bsums[2 * j] + xb[t]->bsums[2 * j + 1]));
                c[t][1] = _mm512_setzero_si512();
            }
            for (int mm = 0; mm < 4; mm++) {
                const __m512i v = _mm512_loadu_si512(words[1 + 4 * j + mm]);
                const __m512i lo = _mm512_shuffle_epi8(grid, _mm512_and_si512(v, m4));
                const __m512i hi = _mm512_shuffle_epi8(grid, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                for (int t = 0; t < nt; t++) {
                    const int8_t *yq = xb[t]->qs + 32 * j + 4 * mm;
                    c[t][0] = _mm512_dpbusd_epi32(c[t][0], lo, _mm512_set1_epi32(pi_load_i32(yq)));
                    c[t][1] = _mm512_dpbusd_epi32(c[t][1], hi, _mm512_set1_epi32(pi_load_i32(yq + 16)));
                }
            }
            const __m512i ls = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sl, 4 * j), _mm512_set1_epi32(15)),
                                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * j),
                                                                                  _mm512_set1_epi32(3)), 4));
            const __m512i sc = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));   /* ls_j - 32 of each row */
            for (int t = 0; t < nt; t++)
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(sc, _mm512_add_epi32(c[t][0], c[t][1])));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        for (int t = 0; t < nt; t++)
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(xb[t]->d), d), _mm512_cvtepi32_ps(sumi[t])));
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + t * y_stride, acc[t]);
}

void pi_gemm16_iq4_xsx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) {
    int t = 0;
    for (; t + 4 <= nt; t += 4) iq4_xsx16_tokens(n / PI_QK_K, group, x + t * x_stride, x_stride, 4, y + t * y_stride, y_stride);
    for (; t + 2 <= nt; t += 2) iq4_xsx16_tokens(n / PI_QK_K, group, x + t * x_stride, x_stride, 2, y + t * y_stride, y_stride);
    if (t < nt) iq4_xsx16_tokens(n / PI_QK_K, group, x + t * x_stride, x_stride, 1, y + t * y_stride, y_stride);
}

#endif

#if PI_HAVE_ROWS8
/* The AVX2 bodies of the 16-row groups (Q4_KX16 and Q5_KX16 at the AVX2 level: the AVX-512 levels take both through
 * q4_Kx16_tokens, for Q5_KX16 one-token decode 1.45x as fast as these halves on a Sapphire Rapids, 542M Q5_K_M, AMD
 * not measured; IQ4_XSX16, Q6_KX16 and Q8_KWX16 at the AVX2 level too, the AVX-512 levels having their own VNNI
 * kernels: IQ4_XSX16's 0.40x the time of these halves at T = 128 and 0.49x at one token, Zen 5): the group as two halves
 * of 8 rows (bytes 0..31 and 32..63 of every 64-byte row), each a super-block step of the file layout's 8-row kernel
 * (rows8_k.c) with its transposes replaced by loads, so the bits are the file layout's; kind and gh are constants
 * after inlining. */
enum { KX16_Q4_K, KX16_Q5_K, KX16_IQ4_XS, KX16_Q6_K, KX16_Q8_KW };
static inline __attribute__((always_inline)) void kx16_block8(const int kind, int64_t b, const void *group, const int gh,
                                                             const char *x, int64_t x_stride, const int nt,
                                                             __m256 *acc) {
    if (kind == KX16_Q4_K || kind == KX16_Q5_K) k4_block8(b, NULL, group, gh, x, x_stride, nt, acc, kind == KX16_Q5_K);
    else if (kind == KX16_IQ4_XS) iq4_xs_block8(b, NULL, group, gh, x, x_stride, nt, acc);
    else if (kind == KX16_Q6_K) q6_K_block8(b, NULL, group, gh, x, x_stride, nt, acc);
    else q8_kw_block8(b, NULL, group, gh, x, x_stride, nt, acc);
}
static inline __attribute__((always_inline)) void kx16_half_tokens(int64_t n, const void *group, const int gh,
                                                                 const int kind, const char *x, int64_t x_stride,
                                                                 const int nt, float *y, int64_t y_stride) {
    __m256 acc[K_MAX_T] = { _mm256_setzero_ps() };   /* all zero */
    for (int64_t b = 0; b < n / PI_QK_K; b++) kx16_block8(kind, b, group, gh, x, x_stride, nt, acc);
    store_acc(acc, nt, y, y_stride);
}
#define KX16_HALF(n, group, xt, xs, nt, yt, ys) kx16_half_tokens(n, group, gh, kind, xt, xs, nt, yt, ys)
#define KX16_HALF_ONE(n, group, xt, yt) kx16_half_tokens(n, group, gh, kind, xt, 0, 1, yt, 0)
static inline __attribute__((always_inline)) void kx16_half(int64_t n, const void *rows, const int gh, const int kind,
                                                           const char *x, int64_t x_stride, int nt, float *y,
                                                           int64_t y_stride) {
    DISPATCH_NT(KX16_HALF, KX16_HALF_ONE, K_MAX_T);
}

/* A group of `kind` against nt tokens: a pass per half, but one token goes over the group once, both halves of each
 * super-block in turn (each half's accumulator steps as in its own pass: the same bits): a pass per half reads all of
 * every 64-byte line for its 32 bytes, then the line again from L2. Zen 3, 542M files, ffn_up / ffn_down / attn_q /
 * attn_output at one token, two threads (bench/ab_ops.py against a pass per half): Q4_KX16 0.91x the time, Q5_KX16
 * 0.91-0.94x, IQ4_XSX16 0.89-0.93x. */
static inline __attribute__((always_inline)) void kx16_gemm16(const int kind, int64_t n, const void *group,
                                                             const char *x, int64_t x_stride, int nt, float *y,
                                                             int64_t y_stride) {
    if (nt == 1) {
        __m256 acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };   /* rows 0..7, rows 8..15 */
        for (int64_t b = 0; b < n / PI_QK_K; b++)
            for (int h = 0; h < 2; h++) kx16_block8(kind, b, group, h, x, 0, 1, acc + h);
        _mm256_storeu_ps(y, acc[0]);
        _mm256_storeu_ps(y + 8, acc[1]);
        return;
    }
    kx16_half(n, group, 0, kind, x, x_stride, nt, y, y_stride);
    kx16_half(n, group, 1, kind, x, x_stride, nt, y + 8, y_stride);
}

#if !PI_HAVE_ROWS16
void pi_gemm16_iq4_xsx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) {
    kx16_gemm16(KX16_IQ4_XS, n, group, x, x_stride, nt, y, y_stride);
}

void pi_gemm16_q4_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    kx16_gemm16(KX16_Q4_K, n, group, x, x_stride, nt, y, y_stride);
}

void pi_gemm16_q5_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    kx16_gemm16(KX16_Q5_K, n, group, x, x_stride, nt, y, y_stride);
}
#endif

#else   /* scalar: each row copied out of the group, then the type's vec_dot per token (the reference itself) */

void pi_gemm16_q4_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    kx16_gemm16_rows(&q4_Kx16_layout, pi_vec_dot_q4_K_q8_K, n, group, x, x_stride, nt, y, y_stride);
}

void pi_gemm16_q5_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    kx16_gemm16_rows(&q5_Kx16_layout, pi_vec_dot_q5_K_q8_K, n, group, x, x_stride, nt, y, y_stride);
}

void pi_gemm16_iq4_xsx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride) {
    kx16_gemm16_rows(&iq4_xsx16_layout, pi_vec_dot_iq4_xs_q8_K, n, group, x, x_stride, nt, y, y_stride);
}

#endif

/* ---- Q6_KX16 ----
 * Q6_K's canonical order (pi_vec_dot_q6_K_q8_K): per super-block the exact integer
 * sumi = sum_j sc_j sum_l u_l y_l - 32 sum_j sc_j bsum_j (u = 4 low bits | 2 high bits << 4, sc_j int8), then
 * acc = acc + (d_x * d) * sumi, super-blocks in order. Word m (m < 8) of half h's ql (words 16h + m and 16h + 8 + m)
 * and qh (word 32 + 8h + m) make four registers u_q (q < 4) of elements 128h + 32q + 4m..+3 (sub-block
 * 8h + 2q + m / 4): u_0 = ql lo | qh bits 0-1, u_1 = ql' lo | bits 2-3, u_2 = ql hi | bits 4-5, u_3 = ql' hi | bits 6-7.
 *
 * Only the AVX-512 levels make this copy at load (level.c): on a Zen 3 the regrouping in two AVX2 halves made decode
 * 1.1-2x slower than the single-row kernel. The x86 levels convert the IQ3 types' prompt rows to it (via Q6_K,
 * pi_q6_K_to_x16, below), the avx2 level its own Q6_K rows too;
 * the scalar level runs a copy made above it row by row (kx16_gemm16_rows).
 *
 * The loop goes sub-block by sub-block (u_q of four words, then sc_j C_j) with up to 8 tokens per unpacked register:
 * keeping all four u_q and their 16 chains of 4 tokens live spilled registers (Zen 5, one thread, 542M Q6_K ffn_up,
 * T = 512, bench/ab_ops.py: 50 ms a call against this order's 36-38; 8 tokens took 0.88x the time of 4; the file
 * layout's 8-row kernel 76-78 ms). The loops over h and q stay loops: one loop over the 16 sub-blocks made the Q6_K
 * kernel 1.13x the time at T = 128, fully unrolled 1.32x (Zen 5). The AVX-512 kernel serves Q8_KWX16 too. */
#if PI_HAVE_ROWS16
void pi_repack_q6_Kx16(int64_t n, const void *const *rows, void *group) { kx16_repack(&q6_Kx16_layout, n, rows, group); }

#if defined(__AMX_INT8__)   /* the amx level (Intel): into L2, 3 super-blocks (10 KB) ahead. Sapphire Rapids, 542M Q6_K
                             * decode 42-46 -> 61 t/s (2 ahead into L2: 50-60) */
#define Q6KX16_PF_DIST 3
#define Q6KX16_PF_HINT _MM_HINT_T1
#else                       /* into L1, 2 super-blocks (3360 bytes each) ahead: what the AMD CPUs were measured with */
#define Q6KX16_PF_DIST 2
#define Q6KX16_PF_HINT _MM_HINT_T0
#endif
/* Signed bytes j0 and j1 of every 32-bit lane of v as the lane's int16 pair (j0 low, j1 high). */
static inline __m512i q6kx16_pair(__m512i v, int j0, int j1) {
    const __m512i lane = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0);   /* 0x80 | offset: still zero */
    const __m512i idx = _mm512_or_si512(lane, _mm512_set1_epi32((int)((unsigned)j1 << 24 | 0x800000u | (unsigned)j0 << 8 | 0x80u)));
    return _mm512_srai_epi16(_mm512_shuffle_epi8(v, idx), 8);
}

#ifndef Q6KX16_MAX_T
#define Q6KX16_MAX_T 8
#endif
/* Q6_KX16, Q8_KWX16 (the IQ2 / IQ1 types' prompt rows regrouped) and Q2_KX16 (Q2_K's prompt rows regrouped; quants_k.h)
 * share a shape: 16 sub-blocks of 16 per super-block, sub-block sums C_j = sum_l u_l y_l over unsigned bytes u, an
 * integer per scale. Their canonical orders, per super-block: Q6_K and Q8_KW sumi = sum_j sc_j C_j - 2^s sum_j sc_j
 * bsum_j (Q6_K: u = 6-bit quant, s = 5; Q8_KW: u = value + 64, s = 6), acc = acc + (d_x * d) * sumi; Q2_K (u = 2-bit
 * quant, sc_j and m_j the low and high nibble of scale byte j) sumi = sum_j sc_j C_j, summ = sum_j m_j bsum_j,
 * acc = acc + d_x * (d * sumi - dmin * summ). Sub-block j = 8h + 2q + mq's word mm (elements 16j + 4mm..+3) of the 16
 * rows in one register: Q8_KW's is group word 4j + mm; Q6_K's is unpacked from ql word 16h + 8 (q & 1) + 4mq + mm and
 * qh word 32 + 8h + 4mq + mm; Q2_K's is bits 2q, 2q + 1 of the bytes of qs word 8h + 4mq + mm (group word 4 + that). */
enum { X16_Q6_K, X16_Q8_KW, X16_Q2_K };
static inline __attribute__((always_inline)) __m512i x16_sub_word(const uint8_t (*words)[64], const int kind, int h,
                                                                  int q, int mq, int mm) {
    const int m = 4 * mq + mm;
    if (kind == X16_Q8_KW) return _mm512_loadu_si512(words[4 * (8 * h + 2 * q + mq) + mm]);
    if (kind == X16_Q2_K)
        return _mm512_and_si512(_mm512_srli_epi32(_mm512_loadu_si512(words[4 + 8 * h + m]), 2 * q), _mm512_set1_epi8(3));
    const __m512i lo = _mm512_loadu_si512(words[16 * h + 8 * (q & 1) + m]);
    const __m512i hb = _mm512_loadu_si512(words[32 + 8 * h + m]);
    const __m512i nib = _mm512_and_si512(q < 2 ? lo : _mm512_srli_epi32(lo, 4), _mm512_set1_epi8(0x0f));
    const __m512i hi2 = q == 0 ? _mm512_slli_epi32(hb, 4) : q == 1 ? _mm512_slli_epi32(hb, 2)
                      : q == 2 ? hb : _mm512_srli_epi32(hb, 2);   /* bits 2q, 2q+1 -> 4, 5 */
    return _mm512_or_si512(nib, _mm512_and_si512(hi2, _mm512_set1_epi8(0x30)));
}

/* nt (1, 2, 4 or 8, a constant after inlining) tokens; sub-block sums C_j of the 16 rows by VNNI (u8 weights, s8
 * activations broadcast), then sumi += sc_j C_j in int32 (|sumi| <= 256 * 127 * 127 * 128 < 2^31). */
static inline __attribute__((always_inline)) void x16_sub_tokens(int64_t nb, const void *group, const int kind,
                                                                 const char *x, int64_t x_stride, const int nt,
                                                                 float *y, int64_t y_stride) {
    const int kw = kind == X16_Q8_KW, q2 = kind == X16_Q2_K;
    const int64_t block = kw ? (int64_t)sizeof(pi_block_q8_kwx16) : q2 ? (int64_t)sizeof(pi_block_q2_Kx16)
                             : (int64_t)sizeof(pi_block_q6_Kx16);
    const int sw0 = kw ? offsetof(pi_block_q8_kw, scales) / 4 : q2 ? 0 : offsetof(pi_block_q6_K, scales) / 4;
    const int lines = (int)((block + 63) / 64), shift = kw ? 6 : 5;
    __m512 acc[Q6KX16_MAX_T];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *gb = (const char *)group + b * block;
        const uint8_t (*words)[64] = kw ? ((const pi_block_q8_kwx16 *)gb)->words
                                   : q2 ? ((const pi_block_q2_Kx16 *)gb)->words : ((const pi_block_q6_Kx16 *)gb)->words;
        const pi_block_q8_K *xb[Q6KX16_MAX_T];
        /* Q6_K, Q8_KW: sumi starts at - 2^s sum_j sc_j bsum_j; Q2_K: summ = sum_j m_j bsum_j; a madd of the pair of
         * scales (mins) 2i, 2i + 1 per lane */
        __m512i sumi[Q6KX16_MAX_T], summ[Q6KX16_MAX_T];
        for (int t = 0; t < nt; t++) {
            xb[t] = (const pi_block_q8_K *)(x + t * x_stride) + b;
            sumi[t] = summ[t] = _mm512_setzero_si512();
        }
        for (int i = 0; i < 8; i++) {
            const __m512i sw = _mm512_loadu_si512(words[sw0 + i / 2]);
            const __m512i scp = q6kx16_pair(q2 ? _mm512_and_si512(_mm512_srli_epi32(sw, 4), _mm512_set1_epi8(0x0f)) : sw,
                                            (2 * i) % 4, (2 * i) % 4 + 1);
            for (int t = 0; t < nt; t++) {
                const __m512i bs = _mm512_set1_epi32(pi_load_i32(xb[t]->bsums + 2 * i));
                if (q2) summ[t] = _mm512_dpwssd_epi32(summ[t], scp, bs);
                else sumi[t] = _mm512_dpwssd_epi32(sumi[t], scp, bs);
            }
        }
        if (!q2)
            for (int t = 0; t < nt; t++) sumi[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sumi[t], shift));
        for (int h = 0; h < 2; h++)
            for (int q = 0; q < 4; q++) {   /* sub-blocks j = 8h + 2q + mq: Q6_K's quarter q of half h */
                /* an eighth of the block's lines PF_DIST ahead; Q6_K's 7 a quarter as tuned (56 of its 53 lines: the eighths
                 * made its prompt matmuls 1.05x the time at T = 128, Zen 5) */
                const int p0 = kw || q2 ? lines * (4 * h + q) / 8 : 7 * (4 * h + q);
                const int p1 = kw || q2 ? lines * (4 * h + q + 1) / 8 : p0 + 7;
                for (int i = p0; i < p1; i++) _mm_prefetch(gb + Q6KX16_PF_DIST * block + 64 * i, Q6KX16_PF_HINT);
                for (int mq = 0; mq < 2; mq++) {
                    const int j = 8 * h + 2 * q + mq;
                    __m512i c[Q6KX16_MAX_T];
                    for (int t = 0; t < nt; t++) c[t] = _mm512_setzero_si512();
                    for (int mm = 0; mm < 4; mm++) {
                        const __m512i u = x16_sub_word(words, kind, h, q, mq, mm);
                        for (int t = 0; t < nt; t++)
                            c[t] = _mm512_dpbusd_epi32(c[t], u, _mm512_set1_epi32(pi_load_i32(xb[t]->qs + 16 * j + 4 * mm)));
                    }
                    /* sc_j from byte j % 4 of scale word j / 4: int8 (Q6_K, Q8_KW), the byte's low nibble (Q2_K) */
                    const __m512i sw = _mm512_loadu_si512(words[sw0 + j / 4]);
                    const __m512i sc = q2 ? _mm512_and_si512(_mm512_srli_epi32(sw, 8 * (j % 4)), _mm512_set1_epi32(0x0f))
                                          : _mm512_srai_epi32(_mm512_slli_epi32(sw, 24 - 8 * (j % 4)), 24);
                    for (int t = 0; t < nt; t++) sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(sc, c[t]));
                }
            }
        if (q2) {
            const pi_block_q2_Kx16 *g2 = (const pi_block_q2_Kx16 *)gb;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g2->d));
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g2->dmin));
            for (int t = 0; t < nt; t++) {
                const __m512 v = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi[t])),
                                               _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summ[t])));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(xb[t]->d), v));
            }
            continue;
        }
        const __m512 d = kw ? _mm512_loadu_ps(words[offsetof(pi_block_q8_kw, d) / 4])
                            : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const pi_block_q6_Kx16 *)gb)->d));
        for (int t = 0; t < nt; t++)
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(xb[t]->d), d), _mm512_cvtepi32_ps(sumi[t])));
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + t * y_stride, acc[t]);
}

static inline __attribute__((always_inline)) void x16_sub_gemm16(const int kind, int64_t n, const void *group,
                                                                 const char *x, int64_t x_stride, int nt, float *y,
                                                                 int64_t y_stride) {
    int t = 0;
    for (; Q6KX16_MAX_T >= 8 && t + 8 <= nt; t += 8) x16_sub_tokens(n / PI_QK_K, group, kind, x + t * x_stride, x_stride, 8, y + t * y_stride, y_stride);
    for (; Q6KX16_MAX_T >= 4 && t + 4 <= nt; t += 4) x16_sub_tokens(n / PI_QK_K, group, kind, x + t * x_stride, x_stride, 4, y + t * y_stride, y_stride);
    for (; t + 2 <= nt; t += 2) x16_sub_tokens(n / PI_QK_K, group, kind, x + t * x_stride, x_stride, 2, y + t * y_stride, y_stride);
    if (t < nt) x16_sub_tokens(n / PI_QK_K, group, kind, x + t * x_stride, x_stride, 1, y + t * y_stride, y_stride);
}
void pi_gemm16_q6_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { x16_sub_gemm16(X16_Q6_K, n, group, x, x_stride, nt, y, y_stride); }
void pi_gemm16_q8_kwx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) { x16_sub_gemm16(X16_Q8_KW, n, group, x, x_stride, nt, y, y_stride); }
void pi_gemm16_q2_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { x16_sub_gemm16(X16_Q2_K, n, group, x, x_stride, nt, y, y_stride); }

#elif PI_HAVE_ROWS8
/* AVX2: two halves of 8 rows through rows8_k.c's Q6_K step with loads for its transposes (the rows' bits). The level
 * makes no Q6_KX16 copy at load: decode reads the file's rows (a group's one-token step took 1.1-2.1x the time of
 * the single-row kernel on a Zen 3, bench/README.md); prompts convert 16 rows at a time (pi_q6_K_to_x16, mul_mat's
 * batch path), whose groups skip the 8-row kernel's transposes. */
void pi_gemm16_q6_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    kx16_gemm16(KX16_Q6_K, n, group, x, x_stride, nt, y, y_stride);
}

/* Q8_KWX16 at the avx2 level: two halves through rows8_k.c's Q8_KW step with loads for its 17 transposes per
 * super-block, the rows' bits (mul_mat's batch path converts IQ2 -> Q8_KW -> Q8_KWX16 from 32 tokens). */
void pi_gemm16_q8_kwx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) {
    kx16_gemm16(KX16_Q8_KW, n, group, x, x_stride, nt, y, y_stride);
}

#else   /* scalar: a group row by row */
void pi_gemm16_q6_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    kx16_gemm16_rows(&q6_Kx16_layout, pi_vec_dot_q6_K_q8_K, n, group, x, x_stride, nt, y, y_stride);
}
void pi_gemm16_q8_kwx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) {
    kx16_gemm16_rows(&q8_kwx16_layout, pi_vec_dot_q8_kw_q8_K, n, group, x, x_stride, nt, y, y_stride);
}
#endif
#if PI_HAVE_ROWS8

/* n (a multiple of 16) rows, `stride` bytes apart, as n / 16 groups of layout L (kx16_repack's bytes; L's fp16 fields
 * go to the group's header, L's words start at row byte 0): each half's words by transposes of 8 rows x 16
 * bytes, the last one moved back to end at the last word (kx16_repack's scalar copy made Q6_K prompt matmuls at T =
 * 128 about 1.05x the time of the file layout's 8-row kernel; this one 0.93-0.95x). */
static bool x16_transpose_rows(const kx16_layout *L, int64_t k, const void *w, int64_t stride, int n, void *dst) {
    if (n % 16) return false;
    char *gb = dst;
    for (int g = 0; g < n / 16; g++)
        for (int64_t b = 0; b < k / PI_QK_K; b++, gb += 16 * L->row_bytes)
            for (int gh = 0; gh < 2; gh++) {
                const char *p[8];
                for (int r = 0; r < 8; r++) {
                    p[r] = (const char *)w + (16 * g + 8 * gh + r) * stride + b * L->row_bytes;
                    for (int i = 0; i < L->n_f16; i++) memcpy(gb + L->f16_group[i] + 2 * (8 * gh + r), p[r] + L->f16_row[i], 2);
                }
                for (int i = 0; i < L->n_words; i += 4) {
                    const int i0 = PI_MIN(i, L->n_words - 4);
                    __m256i c[4];
                    pi_transpose8x16(p, 4 * (size_t)i0, c);
                    for (int m = 0; m < 4; m++)
                        _mm256_storeu_si256((__m256i *)(gb + L->words_group + 64 * (i0 + m) + 32 * gh), c[m]);
                }
            }
    return true;
}
bool pi_q6_K_to_x16(int64_t k, const void *w, int64_t stride, int n, void *dst) {
    return x16_transpose_rows(&q6_Kx16_layout, k, w, stride, n, dst);
}
bool pi_q8_kw_to_x16(int64_t k, const void *w, int64_t stride, int n, void *dst) {
    return x16_transpose_rows(&q8_kwx16_layout, k, w, stride, n, dst);
}
bool pi_q2_K_to_x16(int64_t k, const void *w, int64_t stride, int n, void *dst) {
    return x16_transpose_rows(&q2_Kx16_layout, k, w, stride, n, dst);
}
#endif
#if !PI_HAVE_ROWS16   /* below the AVX-512 levels (which alone convert Q2_K rows): a group row by row */
void pi_gemm16_q2_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    kx16_gemm16_rows(&q2_Kx16_layout, pi_vec_dot_q2_K_q8_K, n, group, x, x_stride, nt, y, y_stride);
}
#endif
