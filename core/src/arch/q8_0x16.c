/* q8_0x16.c: Q8_0 weights interleaved 16 rows to a group (PI_TYPE_Q8_0X16, pi_block_q8_0x16), the layout
 * mul_mat reads fastest: a group is one contiguous stream, its quants are already in the "transposed" form the
 * multi-row kernels compute on (32-bit lane r of a 64-byte row m = elements 4m..4m+3 of row r), so no kernel
 * shuffles bytes, and each 64-byte row m is row m of an AMX B tile as it stands (amx_q8_0s.c). Q5_0 weights in the
 * same order at 22 bytes a row (PI_TYPE_Q5_0X16, pi_block_q5_0x16): nibbles and high bits, which the kernels turn
 * into the same transposed rows of unsigned 5-bit quants u in registers (the Q5_0 value is d (u - 16)). Q4_1 and Q5_1
 * the same way (PI_TYPE_Q4_1X16, PI_TYPE_Q5_1X16: d and m of the 16 rows, then Q5_0X16's qs (and qh); value d u + m),
 * against Q8_1 activations, in their canonical order (pi_vec_dot_q4_1_q8_1: Q5_0's plus p[b % 8] = fma(m_w, s_x,
 * p[b % 8]) after each block's step).
 *
 * pi_gemm16_q8_0x16_q8_0s, pi_gemm16_q5_0x16_q8_0s: one group (16 rows) x nt <= PI_DOT8_MAX_T tokens of Q8_0S
 * activations, every level: AVX-512 in 16 lanes, AVX2 as two halves of 8 rows, scalar loops. All follow Q8_0's
 * canonical order (pi_vec_dot_q8_0_q8_0s; Q5_0's is the same with i = sum (u - 16) y): per block the exact integer
 * i = sum w y, then p[b % 8] = fma(d_w * d_x, i, p[b % 8]) in block order, and pi_tree8(p); so a repacked model
 * gives the file layout's bits at every level.
 *
 * Why (Sapphire Rapids, one thread, weights in L2): the 8-row kernel on the file's layout spends its time
 * transposing (vec_dot8, 14.5 GB/s of Q8_0); see bench/README.md for this kernel's figures.
 *
 * Software prefetch on Intel and Zen 5 (pi_cpu_software_prefetch; one token): a group is one
 * sequential stream, which AMD's hardware prefetchers follow best alone (prefetching 3 of the 9 lines of the block 4
 * ahead made one-token matmuls 1.1-1.27x slower on a Zen 4 at both the avx512 and the avx2 level: Gemma 3 270M's
 * Q8_0 head, the 542M Q8_0 layers), while on a Sapphire Rapids all 9 lines of the block 8 ahead into L1 made Gemma's
 * head 0.9x the time (2 threads; 4 or 16 ahead the same), and every line PI_STREAM_AHEAD bytes ahead into L2
 * (pi_prefetch_ahead, Q5_0X16 too) lifted 542M Q8_0 decode 3% more and Gemma's 5%. The AVX2 kernel was not measured
 * on Intel with it. */
#include "../internal.h"
#include "../quants_k.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#if PI_HAVE_ROWS8
#include <immintrin.h>

#include "avx2_util.h"
#endif

void pi_repack_q8_0x16(int64_t n, const void *const *rows, void *group) {
    pi_interleave_blocks(n / PI_QK8_0, rows, 16, sizeof(pi_block_q8_0), 2, group);
}

/* Where the parts of a row block (src) and of a group block (dst) lie, in bytes; qh, m < 0: the type has none. */
typedef struct { int64_t bytes, d, m, qh, qs; } x16_layout;

/* Rows of 32-element blocks with 4-bit quants and (qh >= 0) fifth bits -> group blocks: the rows' d (and m), the
 * interleaved quants qs[4][64] and fifth bits qh[8][8] (pi_block_q5_0x16 says where each bit goes). */
static void repack_nibbles_x16(int64_t n, const void *const *rows, x16_layout src, void *group, x16_layout dst) {
    for (int64_t b = 0; b < n / PI_QK; b++) {
        char *g = (char *)group + b * dst.bytes;
        uint8_t (*qs)[64] = (uint8_t (*)[64])(g + dst.qs);
        uint8_t (*qh)[8] = (uint8_t (*)[8])(g + dst.qh);
        if (dst.qh >= 0) memset(qh, 0, 64);
        for (int r = 0; r < 16; r++) {
            const char *x = (const char *)rows[r] + b * src.bytes;
            memcpy(g + dst.d + 2 * r, x + src.d, 2);
            if (dst.m >= 0) memcpy(g + dst.m + 2 * r, x + src.m, 2);
            for (int j = 0; j < 4; j++) memcpy(&qs[j][4 * r], x + src.qs + 4 * j, 4);
            if (dst.qh >= 0) {
                uint32_t h;
                memcpy(&h, x + src.qh, 4);
                for (int e = 0; e < PI_QK; e++) {   /* element e = 4m + k: bit 4r + k of qh[m] */
                    const int i = 4 * r + e % 4;
                    qh[e / 4][i / 8] |= (uint8_t)((h >> e & 1) << (i % 8));
                }
            }
        }
    }
}

#define X16_LAYOUT(block, m, qh) \
    ((x16_layout){ sizeof(block), offsetof(block, d), m, qh, offsetof(block, qs) })

void pi_repack_q5_0x16(int64_t n, const void *const *rows, void *group) {
    repack_nibbles_x16(n, rows, X16_LAYOUT(pi_block_q5_0, -1, offsetof(pi_block_q5_0, qh)), group,
                       X16_LAYOUT(pi_block_q5_0x16, -1, offsetof(pi_block_q5_0x16, qh)));
}

void pi_repack_q4_1x16(int64_t n, const void *const *rows, void *group) {
    repack_nibbles_x16(n, rows, X16_LAYOUT(pi_block_q4_1, offsetof(pi_block_q4_1, m), -1), group,
                       X16_LAYOUT(pi_block_q4_1x16, offsetof(pi_block_q4_1x16, m), -1));
}

void pi_repack_q5_1x16(int64_t n, const void *const *rows, void *group) {
    repack_nibbles_x16(n, rows, X16_LAYOUT(pi_block_q5_1, offsetof(pi_block_q5_1, m), offsetof(pi_block_q5_1, qh)),
                       group,
                       X16_LAYOUT(pi_block_q5_1x16, offsetof(pi_block_q5_1x16, m), offsetof(pi_block_q5_1x16, qh)));
}

/* What a group holds: Q8_0X16 blocks, Q5_0X16 blocks, (UNPACKED_Q5) Q8_0X16-shaped blocks of Q5_0's u already,
 * Q4_1X16 or Q5_1X16 blocks */
enum { X16_Q8, X16_Q5, X16_UNPACKED_Q5, X16_Q4_1, X16_Q5_1 };
/* Bytes of one block of a group of kind `kind` (X16_UNPACKED_Q5: Q8_0X16's). */
static inline int64_t x16_block_bytes(const int kind) {
    return kind == X16_Q5 ? (int64_t)sizeof(pi_block_q5_0x16) : kind == X16_Q4_1 ? (int64_t)sizeof(pi_block_q4_1x16)
         : kind == X16_Q5_1 ? (int64_t)sizeof(pi_block_q5_1x16) : (int64_t)sizeof(pi_block_q8_0x16);
}
/* The quants (qs, qh: NULL for Q4_1X16) and the d and m (NULL: Q5_0X16) of block b of a nibble group. */
static inline void x16_nibble_parts(const void *group, const int kind, int64_t b, const uint8_t (**qs)[64],
                                    const uint8_t (**qh)[8], const uint16_t **d, const uint16_t **m) {
    if (kind == X16_Q5) {
        const pi_block_q5_0x16 *g = (const pi_block_q5_0x16 *)group + b;
        *qs = g->qs; *qh = g->qh; *d = g->d; *m = NULL;
    } else if (kind == X16_Q4_1) {
        const pi_block_q4_1x16 *g = (const pi_block_q4_1x16 *)group + b;
        *qs = g->qs; *qh = NULL; *d = g->d; *m = g->m;
    } else {
        const pi_block_q5_1x16 *g = (const pi_block_q5_1x16 *)group + b;
        *qs = g->qs; *qh = g->qh; *d = g->d; *m = g->m;
    }
}

#if PI_HAVE_ROWS16
/* Block g of a group as 16 rows of unsigned bytes in transposed registers (lane r of u[m]: elements 4m..4m+3 of row
 * r), and the rows' scales: Q8_0X16's w + 128; Q5_0X16's u, the nibble plus 16 where bit i of qh[m] is set (one
 * masked add per register). */
static inline __attribute__((always_inline)) __m512 q8_0x16_unsigned(const pi_block_q8_0x16 *g, __m512i u[8]) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int m = 0; m < 8; m++) u[m] = _mm512_xor_si512(_mm512_loadu_si512(g->qs[m]), bias);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g->d));
}

/* Quants qs (and fifth bits qh, not NULL) of a nibble group's block -> the 16 rows' u in transposed registers: the
 * nibble, plus 16 where bit i of qh[m] is set (one masked add per register). */
static inline __attribute__((always_inline)) void x16_nibbles_u(const uint8_t (*qs)[64], const uint8_t (*qh)[8],
                                                              __m512i u[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), high = _mm512_set1_epi8(0x10);
    for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_loadu_si512(qs[j]);
        const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        u[j] = qh ? _mm512_mask_add_epi8(lo, _cvtu64_mask64(pi_load_u64(qh[j])), lo, high) : lo;
        u[j + 4] = qh ? _mm512_mask_add_epi8(hi, _cvtu64_mask64(pi_load_u64(qh[j + 4])), hi, high) : hi;
    }
}

/* Block b of a nibble group (kind: Q5_0X16, Q4_1X16, Q5_1X16) -> the 16 rows' u in transposed registers (x16_nibbles_u)
 * and their d (returned) and m (*mw; 0 for Q5_0X16, which has none). */
static inline __attribute__((always_inline)) __m512 x16_nibble_block(const void *group, const int kind, int64_t b,
                                                                   __m512i u[8], __m512 *mw) {
    const uint8_t (*qs)[64], (*qh)[8];
    const uint16_t *d, *m;
    x16_nibble_parts(group, kind, b, &qs, &qh, &d, &m);
    x16_nibbles_u(qs, qh, u);
    *mw = m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)m)) : _mm512_setzero_ps();
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
}

/* Block b against nt tokens: p[t][j] += its products (j = b % 8); kind a constant; ahead (a constant): request the
 * block's lines PI_STREAM_AHEAD bytes ahead (pi_prefetch_ahead) */
static inline __attribute__((always_inline)) void x16_block(const void *group, const int kind, const int ahead,
                                                          int64_t b, const char *x, int64_t x_stride, const int nt,
                                                          __m512 p[][8], const int j) {
    if (ahead) {
        const int64_t bytes = x16_block_bytes(kind);
        for (int l = 0; l < (bytes + 63) / 64; l++) pi_prefetch_ahead((const char *)group + b * bytes + 64 * l);
    }
    __m512i u[8];
    __m512 dw, mw = _mm512_setzero_ps();
    if (kind == X16_Q8) {
        dw = q8_0x16_unsigned((const pi_block_q8_0x16 *)group + b, u);
    } else if (kind == X16_UNPACKED_Q5) {
        const pi_block_q8_0x16 *g = (const pi_block_q8_0x16 *)group + b;
        for (int m = 0; m < 8; m++) u[m] = _mm512_loadu_si512(g->qs[m]);
        dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g->d));
    } else {   /* Q5_0X16, Q4_1X16, Q5_1X16 */
        dw = x16_nibble_block(group, kind, b, u, &mw);
    }
    for (int t = 0; t < nt; t++) {
        if (kind == X16_Q4_1 || kind == X16_Q5_1) {
            const pi_block_q8_1 *xb = (const pi_block_q8_1 *)(x + t * x_stride) + b;
            const __m512i i = pi_dot16_u8(u, xb->qs);
            const __m512 a = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), _mm512_cvtepi32_ps(i), p[t][j]);
            p[t][j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb->s), a);
            continue;
        }
        const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
        const __m512i i = pi_dot16_q8_0s(u, xb, kind == X16_Q8 ? 128 : 16);   /* sum w y = sum u y - offset s */
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(pi_fp16_to_f32(xb->d)));
        p[t][j] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(i), p[t][j]);
    }
}

/* nb blocks (b = 0 a multiple of 8 into the row: the partial sums keep their blocks in order) against nt (1 or 2, a
 * constant after inlining) tokens, their 8 partial sums each taken from and put back into ps (in registers
 * meanwhile: 16 zmm at most); kind (a constant) says what group holds */
static inline __attribute__((always_inline)) void x16_tokens(int64_t nb, const void *group, const int kind,
                                                           const int ahead, const char *x, int64_t x_stride,
                                                           const int nt, __m512 ps[][8]) {
    __m512 p[2][8];
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < 8; j++) p[t][j] = ps[t][j];
    int64_t b8 = 0;
    for (; b8 + 8 <= nb; b8 += 8)   /* 8 blocks per pass, j a constant in each copy: p[t][j] stay in registers */
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) x16_block(group, kind, ahead, b8 + j, x, x_stride, nt, p, j);
    for (int j = 0; b8 + j < nb; j++) x16_block(group, kind, ahead, b8 + j, x, x_stride, nt, p, j);
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < 8; j++) ps[t][j] = p[t][j];
}

/* nb blocks of group (kind) against tokens [0, nt) in pairs, into ps; one token on a CPU where
 * pi_cpu_software_prefetch says so with software prefetch */
static inline __attribute__((always_inline)) void x16_pairs(int64_t nb, const void *group, const int kind,
                                                          const char *x, int64_t x_stride, int nt, __m512 ps[][8]) {
    int t = 0;
    for (; t + 2 <= nt; t += 2) x16_tokens(nb, group, kind, 0, x + t * x_stride, x_stride, 2, ps + t);
    if (t < nt) {
        if (nt == 1 && pi_cpu_software_prefetch()) x16_tokens(nb, group, kind, 1, x, x_stride, 1, ps);
        else x16_tokens(nb, group, kind, 0, x + t * x_stride, x_stride, 1, ps + t);
    }
}

static inline void x16_store(int nt, __m512 ps[][8], float *y, int64_t y_stride) {
    for (int t = 0; t < nt; t++) {
        const __m512 *p = ps[t];
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(p[0], p[4]), _mm512_add_ps(p[2], p[6])),
                                       _mm512_add_ps(_mm512_add_ps(p[1], p[5]), _mm512_add_ps(p[3], p[7])));
        _mm512_storeu_ps(y + t * y_stride, s);
    }
}

/* The exported kernel of a layout whose tokens go in pairs over the group itself (`name`, activations `act`, group
 * kind `kind`): Q8_0X16; Q4_1X16 / Q5_1X16 too, each pair unpacking the block in registers (no copy as Q5_0X16's
 * below: their nibbles need no mask loads, Q5_1's one masked add per register as Q5_0X16's pairs). */
#define X16_PAIRS_GEMM16(name, act, kind)                                                                        \
    void pi_gemm16_##name##_##act(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y, \
                                  int64_t y_stride) {                                                            \
        __m512 ps[PI_DOT8_MAX_T][8];                                                                             \
        for (int t = 0; t < nt; t++)                                                                             \
            for (int j = 0; j < 8; j++) ps[t][j] = _mm512_setzero_ps();                                          \
        x16_pairs(n / PI_QK, group, kind, x, x_stride, nt, ps);                                                  \
        x16_store(nt, ps, y, y_stride);                                                                          \
    }
X16_PAIRS_GEMM16(q8_0x16, q8_0s, X16_Q8)
X16_PAIRS_GEMM16(q4_1x16, q8_1, X16_Q4_1)
X16_PAIRS_GEMM16(q5_1x16, q8_1, X16_Q5_1)

/* Q5_0X16: one token or a pair unpacks each block in registers, once. More tokens (prompts) would unpack it once per
 * pair, a mask load and a masked add more per register than Q8_0X16's bias: 1.19-1.34x the time of the Q8_0X16 copy
 * at T = 512 (Zen 4, Gemma 3 270M's Q5_0 matrices). So their blocks are unpacked Q5X16_CHUNK at a time (a multiple of
 * 8) into Q8_0X16-shaped blocks of u, and every pair of tokens runs the Q8_0X16 body over that copy, in L1, without
 * even its bias (X16_UNPACKED_Q5); and a call takes up to Q5X16_MAX_T tokens (mul_mat: the traits' gemm_max_t), so
 * that one unpacking serves them all (with 8 tokens a call it still took 1.06-1.23x the time). */
#define Q5X16_CHUNK 32
#define Q5X16_MAX_T 32

void pi_gemm16_q5_0x16_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride) {
    const int64_t nb = n / PI_QK;
    __m512 ps[Q5X16_MAX_T][8];
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < 8; j++) ps[t][j] = _mm512_setzero_ps();
    if (nt <= 2) {
        x16_pairs(nb, group, X16_Q5, x, x_stride, nt, ps);
    } else {
        pi_block_q8_0x16 copy[Q5X16_CHUNK];
        for (int64_t b0 = 0; b0 < nb; b0 += Q5X16_CHUNK) {
            const int64_t cn = PI_MIN(Q5X16_CHUNK, nb - b0);
            for (int64_t b = 0; b < cn; b++) {
                const pi_block_q5_0x16 *g = (const pi_block_q5_0x16 *)group + b0 + b;
                __m512i u[8];
                __m512 none;   /* Q5_0X16 has no m */
                x16_nibble_block(group, X16_Q5, b0 + b, u, &none);
                memcpy(copy[b].d, g->d, sizeof g->d);
                for (int m = 0; m < 8; m++) _mm512_storeu_si512(copy[b].qs[m], u[m]);
            }
            x16_pairs(cn, copy, X16_UNPACKED_Q5, x + b0 * (int64_t)sizeof(pi_block_q8_0s), x_stride, nt, ps);
        }
    }
    x16_store(nt, ps, y, y_stride);
}

#elif PI_HAVE_ROWS8
#define Q5X16_MAX_T 0   /* PI_DOT8_MAX_T */

/* Byte k of the result = 16 where bit k of the 32 bits at qh is set, else 0. */
static inline __m256i q5_high16(const uint8_t *qh) {
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(pi_load_i32(qh)),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

/* Half `half` (rows 8 half..8 half + 7) of block b of a nibble group (Q5_0X16, Q4_1X16, Q5_1X16) as Q8_0X16's
 * transposed rows of unsigned quants u (u[m]: row m's bytes, as the Q8_0X16 body's w), and those rows' d and (Q4_1X16,
 * Q5_1X16) m. */
static inline __attribute__((always_inline)) void x16_half_u(const void *group, const int kind, int64_t b,
                                                           const int half, __m256i u[8], __m256 *dw, __m256 *mw) {
    const uint8_t (*qs)[64], (*qh)[8];
    const uint16_t *d, *m;
    x16_nibble_parts(group, kind, b, &qs, &qh, &d, &m);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int j = 0; j < 4; j++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs[j] + 32 * half));
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        u[j] = qh ? _mm256_or_si256(lo, q5_high16(qh[j] + 4 * half)) : lo;
        u[j + 4] = qh ? _mm256_or_si256(hi, q5_high16(qh[j + 4] + 4 * half)) : hi;
    }
    *dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + 8 * half)));
    *mw = m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + 8 * half))) : _mm256_setzero_ps();
}

/* One token's step of block b over those 8 rows (lanes), from x16_half_u's u, d and m: Q5_0X16 p + (d_w d_x) i with
 * i = sum (u - 16) y; Q4_1X16 / Q5_1X16 the same with i = sum u y, then + m_w s_x (two sums of 4 each: pi_maddubs_sum's
 * bound at u < 32). xrow: the token's activation row. */
static inline __attribute__((always_inline)) __m256 x16_nibble_step(const __m256i u[8], __m256 dw, __m256 mw,
                                                                  const int kind, const char *xrow, int64_t b,
                                                                  __m256 p) {
    if (kind == X16_Q5) {
        const pi_block_q8_0s *xb = (const pi_block_q8_0s *)xrow + b;
        const __m256i i = _mm256_sub_epi32(_mm256_add_epi32(pi_dot_u8_bcast(u, xb->qs, 4),
                                                            pi_dot_u8_bcast(u + 4, xb->qs + 16, 4)),
                                           _mm256_set1_epi32(16 * (int32_t)xb->s));
        return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(pi_fp16_to_f32(xb->d))), _mm256_cvtepi32_ps(i), p);
    }
    const pi_block_q8_1 *xb = (const pi_block_q8_1 *)xrow + b;
    const __m256i i = _mm256_add_epi32(pi_dot_u8_bcast(u, xb->qs, 4), pi_dot_u8_bcast(u + 4, xb->qs + 16, 4));
    const __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(i), p);
    return _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), a);
}

/* AVX2: the group as two halves of 8 rows (bytes 0..31 and 32..63 of every row m), all nt tokens per pass so that
 * each weight register and its absolute value are made once for them, not once per token (542M Q8_0 prompt
 * matmuls: 0.80-0.90x the time on a Zen 3, bench/README.md), with the arithmetic of rows8_k.c's q8_0_dot8 (maddubs
 * of |w| against sign(y, w), widened at once; the nibble groups: maddubs of u, as u32_dot8); the partial sums
 * p[b % 8] of each token live on the stack. kind (a constant) picks the layout. */
static inline __attribute__((always_inline)) void x16_half(int64_t nb, const void *group, const int kind,
                                                         const int half, const char *x, int64_t x_stride,
                                                         const int nt, float *y, int64_t y_stride) {
    __m256 p[PI_DOT8_MAX_T][8];
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < 8; j++) p[t][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (kind != X16_Q8) {
            __m256i u[8];
            __m256 dw, mw;
            x16_half_u(group, kind, b, half, u, &dw, &mw);
            for (int t = 0; t < nt; t++)
                p[t][b % 8] = x16_nibble_step(u, dw, mw, kind, x + t * x_stride, b, p[t][b % 8]);
            continue;
        }
        const pi_block_q8_0x16 *g = (const pi_block_q8_0x16 *)group + b;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->d + 8 * half)));
        __m256i s[PI_DOT8_MAX_T];
        for (int t = 0; t < nt; t++) s[t] = _mm256_setzero_si256();
        for (int m = 0; m < 8; m++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(g->qs[m] + 32 * half));
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

/* A kernel instance per token count (rows8_k.c's DISPATCH_NT): the per-token sums stay in registers. Up to
 * K_MAX_T (8) tokens per pass; Q8_0X16 at most Q8X16_MAX_T_HALF_WIDTH on a CPU that runs 256-bit instructions as two
 * halves (pi_cpu_half_width_256, a Zen 1): there its ymm multiplies issue once every two cycles and 8 tokens' sums
 * spill, while a Q8_0 weight register costs only a load and a sign to remake (542M Q8_0 ffn_up, T = 512, one thread,
 * CPU time: 4 tokens 0.87x the time of 8, 3 tokens 0.88x, 6 tokens 1.00x; Q5_0X16, whose unpacking is dearer, keeps
 * 8: 4 took 1.09x; not measured on other CPUs). */
#define Q8X16_MAX_T_HALF_WIDTH 4
#define Q8X16_HALF(n, group, xt, xs, nt, yt, ys) x16_half((n) / PI_QK8_0, group, kind, half, xt, xs, nt, yt, ys)
#define Q8X16_HALF_ONE(n, group, xt, yt) x16_half((n) / PI_QK8_0, group, kind, half, xt, 0, 1, yt, 0)

static inline __attribute__((always_inline)) void x16_half_nt(int64_t n, const void *rows, const int kind,
                                                            const int half, const char *x, int64_t x_stride, int nt,
                                                            float *y, int64_t y_stride) {
    if (kind == X16_Q8 && pi_cpu_half_width_256()) {
        DISPATCH_NT(Q8X16_HALF, Q8X16_HALF_ONE, Q8X16_MAX_T_HALF_WIDTH);
    } else {
        DISPATCH_NT(Q8X16_HALF, Q8X16_HALF_ONE, K_MAX_T);
    }
}

/* One token in one pass over the group, both halves of each block in turn (x16_half's arithmetic per half, so the
 * same bits): x16_half's two passes read every 64-byte line twice, the second time from L2, and on a Zen 1 the 542M
 * Q8_0 decode matmuls took 1.3-1.5x the time of the file layout's 8-row kernel that way. */
static inline __attribute__((always_inline)) void x16_one(int64_t nb, const void *group, const int kind,
                                                        const char *x, float *y) {
    __m256 p[2][8];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 8; j++) p[h][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++)
        for (int h = 0; h < 2; h++) {
            if (kind != X16_Q8) {
                __m256i u[8];
                __m256 dw, mw;
                x16_half_u(group, kind, b, h, u, &dw, &mw);
                p[h][b % 8] = x16_nibble_step(u, dw, mw, kind, x, b, p[h][b % 8]);
                continue;
            }
            const pi_block_q8_0x16 *g = (const pi_block_q8_0x16 *)group + b;
            const pi_block_q8_0s *xb = (const pi_block_q8_0s *)x + b;
            __m256i s = _mm256_setzero_si256();
            for (int m = 0; m < 8; m++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(g->qs[m] + 32 * h));
                const __m256i y4 = _mm256_set1_epi32(pi_load_i32(xb->qs + 4 * m));
                s = pi_dpbusd(s, _mm256_sign_epi8(w, w), _mm256_sign_epi8(y4, w));
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->d + 8 * h)));
            p[h][b % 8] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(pi_fp16_to_f32(xb->d))),
                                          _mm256_cvtepi32_ps(s), p[h][b % 8]);
        }
    _mm256_storeu_ps(y, pi_tree8_ps(p[0]));
    _mm256_storeu_ps(y + 8, pi_tree8_ps(p[1]));
}

/* The exported kernel of an interleaved layout (`name`, activations `act`, group kind `kind`) at the AVX2 level. */
#define X16_GEMM16(name, act, kind)                                                                              \
    void pi_gemm16_##name##_##act(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y, \
                                  int64_t y_stride) {                                                            \
        if (nt == 1) {                                                                                           \
            x16_one(n / PI_QK, group, kind, x, y);                                                               \
            return;                                                                                              \
        }                                                                                                        \
        x16_half_nt(n, group, kind, 0, x, x_stride, nt, y, y_stride);                                            \
        x16_half_nt(n, group, kind, 1, x, x_stride, nt, y + 8, y_stride);                                        \
    }
X16_GEMM16(q8_0x16, q8_0s, X16_Q8)
X16_GEMM16(q5_0x16, q8_0s, X16_Q5)
X16_GEMM16(q4_1x16, q8_1, X16_Q4_1)
X16_GEMM16(q5_1x16, q8_1, X16_Q5_1)

#else   /* scalar: the canonical orders of pi_vec_dot_q8_0_q8_0s, _q5_0_q8_0s, _q4_1_q8_1 per (row, token) */
#define Q5X16_MAX_T 0   /* PI_DOT8_MAX_T */

static void x16_scalar(int64_t n, const void *group, const int kind, const char *x, int64_t x_stride, int nt, float *y,
                       int64_t y_stride) {
    const bool mins = kind == X16_Q4_1 || kind == X16_Q5_1;
    for (int t = 0; t < nt; t++) {
        const char *xrow = x + t * x_stride;
        for (int r = 0; r < 16; r++) {
            float p[8] = { 0 };
            for (int64_t b = 0; b < n / PI_QK; b++) {
                const int8_t *xq = mins ? ((const pi_block_q8_1 *)xrow)[b].qs : ((const pi_block_q8_0s *)xrow)[b].qs;
                /* the block's weights of row r (Q8_0X16's quants, Q5_0X16's u - 16, Q4_1X16's / Q5_1X16's u) */
                const uint8_t (*qs)[64] = NULL, (*qh)[8] = NULL;
                const uint16_t *d = ((const pi_block_q8_0x16 *)group)[b].d, *m = NULL;
                if (kind != X16_Q8) x16_nibble_parts(group, kind, b, &qs, &qh, &d, &m);
                int32_t s = 0;
                for (int e = 0; e < PI_QK; e++)
                    s += (kind == X16_Q8 ? ((const pi_block_q8_0x16 *)group)[b].qs[e / 4][4 * r + e % 4]
                                         : pi_x16_u(qs, qh, r, e) - (kind == X16_Q5 ? 16 : 0)) * xq[e];
                if (mins) {
                    const pi_block_q8_1 *xb = (const pi_block_q8_1 *)xrow + b;
                    p[b % 8] = fmaf(pi_fp16_to_f32(d[r]) * xb->d, (float)s, p[b % 8]);
                    p[b % 8] = fmaf(pi_fp16_to_f32(m[r]), xb->s, p[b % 8]);
                } else {
                    const pi_block_q8_0s *xb = (const pi_block_q8_0s *)xrow + b;
                    p[b % 8] = fmaf(pi_fp16_to_f32(d[r]) * pi_fp16_to_f32(xb->d), (float)s, p[b % 8]);
                }
            }
            y[t * y_stride + r] = pi_tree8(p);
        }
    }
}

#define X16_GEMM16(name, act, kind)                                                                              \
    void pi_gemm16_##name##_##act(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y, \
                                  int64_t y_stride) {                                                            \
        x16_scalar(n, group, kind, x, x_stride, nt, y, y_stride);                                                \
    }
X16_GEMM16(q8_0x16, q8_0s, X16_Q8)
X16_GEMM16(q5_0x16, q8_0s, X16_Q5)
X16_GEMM16(q4_1x16, q8_1, X16_Q4_1)
X16_GEMM16(q5_1x16, q8_1, X16_Q5_1)

#endif
