/* rows8_k.c: 8-row kernels (pi_vec_dot8_fn) of Q5_0, Q4_1, Q5_1, IQ4_XS, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K
 * and Q6_K: eight weight rows against up to PI_DOT8_MAX_T tokens per call, the weights unpacked once per block and reused for all of them.
 *
 * The scheme is the one of rows8.c (Q4_0): eight rows are "transposed" into registers, 32-bit
 * lane r of a register holding 4 consecutive quants of row r. Four activation bytes broadcast
 * against such a register with maddubs give partial sums of all eight rows in their own lanes:
 * no horizontal reductions, the row scales of a block are one vector, and the float steps of
 * the eight rows run side by side in the 8 float lanes.
 *
 * Bits: every lane follows exactly the per-block arithmetic of the type's single-row vec_dot
 * (exact integer sums inside a block, then the same float operations in the same order; see
 * the canonical order noted at each kernel), so all kernels of a type agree bit for bit.
 *
 * int16 budget of maddubs (unsigned weights u times int8 activations |y| <= 127; each maddubs
 * lane is two products): 4-bit u: 2*15*127 = 3810 (8 may be summed in int16), 5-bit: 7874 (4),
 * 6-bit: 16002 (2); signed 8-bit weights (sign trick): 2*128*127 = 32512 (1). */
#include "../quants_k.h"

#include <stddef.h>

#if PI_HAVE_ROWS8
#include <immintrin.h>

#include "avx2_util.h"

/* Bytes j0 and j1 (< 4) of every 32-bit lane of v -> the lane's two int16 halves (zero- or
 * sign-extended): a per-row scale (j0 == j1) or pair of scales for madd_epi16. */
static inline __m256i lane_bytes_to_i16(__m256i v, int j0, int j1, int is_signed) {
    /* pshufb index per lane L (of 4 per 128-bit half); 0x80 writes a zero byte */
    const __m256i lane = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404, 0x08080808,
                                           0x0c0c0c0c);
    if (is_signed) {   /* the byte into the high half of each int16, then an arithmetic shift */
        const __m256i idx = _mm256_or_si256(_mm256_and_si256(lane, _mm256_set1_epi32((int)0xff00ff00)),
                                            _mm256_set1_epi32((int)(0x00800080u | (unsigned)j0 << 8 | (unsigned)j1 << 24)));
        return _mm256_srai_epi16(_mm256_shuffle_epi8(v, idx), 8);
    }
    const __m256i idx = _mm256_or_si256(_mm256_and_si256(lane, _mm256_set1_epi32(0x00ff00ff)),
                                        _mm256_set1_epi32((int)(0x80008000u | (unsigned)j0 | (unsigned)j1 << 16)));
    return _mm256_shuffle_epi8(v, idx);
}

static inline void store_acc(const __m256 *acc, int nt, float *y, int64_t y_stride) {
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

/* The kernels are written for a token count nt known at compile time (the accumulators stay in
 * registers, the token loops unroll); the exported functions pick the instance. One token (decode,
 * bound by memory bandwidth) reads the rows one after the other through the single-row kernel (the same
 * bits, by the canonical order) where they follow each other in memory, a dense matrix's rows: one
 * sequential stream, which the hardware prefetchers follow best (eight short interleaved streams took the
 * output head of Gemma 3 270M 10.8 ms per token, row by row 6 ms). Rows that lie apart, the sparse FFN's
 * gathered up rows, go side by side through the 8-row kernel: eight streams keep more reads in flight than one
 * row and the next one's prefetch (542M files at half the channels, Sapphire Rapids, 2 threads: the CATS op
 * 0.91-0.94x the time with Q4_K_M, 0.94x Q5_K_M, 0.95-0.98x Q6_K; bench/README.md). Q8_0, Q4_1 and Q5_1 go side by
 * side either way (Q4_1 / Q5_1: row by row took 1.15x / 1.10x the time of side by side, 542M matrices, Sapphire
 * Rapids, 2 threads). */
/* Whether the 8 rows lie one after the other, row_bytes apart (a dense matrix's consecutive rows). */
static inline bool rows_consecutive(const void *const *rows, int64_t row_bytes) {
    for (int k = 1; k < 8; k++)
        if ((const char *)rows[k] != (const char *)rows[k - 1] + row_bytes) return false;
    return true;
}

/* Tokens per kernel instance: all of a call's (PI_DOT8_MAX_T), so a block's weights are unpacked once per call. With
 * AVX2's 16 registers the per-token sums then live partly on the stack, which costs less than unpacking twice:
 * against 4 tokens (Zen 3, one thread, 542M files, ffn_up + ffn_down, T = 128, bench/ab_ops.py) Q6_K 0.76x the
 * time, Q2_K 0.76x, Q3_K_M 0.85x, Q4_K_M 0.92-0.96x, Q5_K_M 0.95x; Gemma 3's Q5_0 gate and up (T = 512) 0.76-0.78x. */
#define K_MAX_T PI_DOT8_MAX_T
/* The kernel instance for each count of tokens up to max_t (<= PI_DOT8_MAX_T), one token through one_row (cases
 * above max_t are never reached; PI_MIN keeps them from instantiating a kernel for more tokens than it has room). */
#define DISPATCH_NT(kernel, one_row, max_t)                                                \
    if (nt == 1) { one_row(n, rows, x, y); return; }                                       \
    for (int t0 = 0; t0 < nt; t0 += (max_t)) {   /* PI_DOT8_MAX_T (8) tokens: one or two blocks */ \
        const char *xt = x + t0 * x_stride;                                                \
        float *yt = y + t0 * y_stride;                                                     \
        switch (nt - t0) {                                                                 \
        case 1: kernel(n, rows, xt, x_stride, 1, yt, y_stride); break;                     \
        case 2: kernel(n, rows, xt, x_stride, 2, yt, y_stride); break;                     \
        case 3: kernel(n, rows, xt, x_stride, 3, yt, y_stride); break;                     \
        case 4: kernel(n, rows, xt, x_stride, 4, yt, y_stride); break;                     \
        case 5: kernel(n, rows, xt, x_stride, PI_MIN(5, (max_t)), yt, y_stride); break;    \
        case 6: kernel(n, rows, xt, x_stride, PI_MIN(6, (max_t)), yt, y_stride); break;    \
        case 7: kernel(n, rows, xt, x_stride, PI_MIN(7, (max_t)), yt, y_stride); break;    \
        default: kernel(n, rows, xt, x_stride, (max_t), yt, y_stride); break;              \
        }                                                                                  \
    }

/* Consecutive rows one by one; on Intel and Zen 5 (pi_cpu_software_prefetch) each row's lines are requested while the row
 * before it is computed (the dense Q3_K_M matrices at one token, Sapphire Rapids, 2 threads: without it
 * 1.08x the time; Q6_K's at the avx2 level, which has no Q6_K copy: 0.91-0.93x the time with it; Q5_0's, which only
 * --no-repack leaves in rows, not measured). */
static inline void rows_one(int64_t n, const void *const *rows, const char *x, float *y, pi_vec_dot_fn single,
                            int64_t row_bytes) {
    const bool ahead = pi_cpu_software_prefetch();
    for (int k = 0; k < 8; k++) {
        if (ahead && k + 1 < 8)
            for (int64_t l = 0; l < row_bytes; l += 64) _mm_prefetch((const char *)rows[k + 1] + l, _MM_HINT_T0);
        y[k] = single(n, rows[k], x);
    }
}

/* The exported 8-row kernel of a K-quant `name` whose body is kernel(..., flag), and its one-token path: the
 * single-row kernel `single` row by row where the rows are consecutive, else the body side by side. */
#define K_ROWS8(name, kernel, flag, single)                                                                       \
    static inline __attribute__((always_inline)) void name##_dot8(int64_t n, const void *const *rows, const char *x, \
                                                                 int64_t x_stride, const int nt, float *y,          \
                                                                 int64_t y_stride) {                                \
        kernel(n, rows, x, x_stride, nt, y, y_stride, flag);                                                      \
    }                                                                                                             \
    static void name##_dot8_one(int64_t n, const void *const *rows, const char *x, float *y) {                    \
        const int64_t row_bytes = n / PI_QK_K * (int64_t)sizeof(pi_block_##name);                                \
        if (rows_consecutive(rows, row_bytes)) rows_one(n, rows, x, y, single, row_bytes);                        \
        else                                                                                                      \
            kernel(n, rows, x, 0, 1, y, 0, flag);                                                                 \
    }                                                                                                             \
    void pi_vec_dot8_##name##_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,     \
                                   float *y, int64_t y_stride) { DISPATCH_NT(name##_dot8, name##_dot8_one, K_MAX_T); }

/* p[k] = super-block b of row k, and the super-block after next requested (`lines` cache lines per row). */
static inline void k_block_rows(const void *const *rows, int64_t b, int64_t block_bytes, int lines, const char *p[8]) {
    for (int k = 0; k < 8; k++) p[k] = (const char *)rows[k] + b * block_bytes;
    for (int k = 0; k < 8; k++)
        for (int l = 0; l < lines; l++) _mm_prefetch(p[k] + 2 * block_bytes + 64 * l, _MM_HINT_T0);
}

/* The 16 bytes at byte `off` of the eight rows' super-blocks as four registers of 32-bit lanes (lane r = row r): gh < 0,
 * transposed from the rows p; gh = 0 or 1, loaded from half gh of an interleaved group's super-block, whose
 * words[i..i+3] (quants_k.h) hold those bytes (gh is a constant after inlining). */
static inline void k_lanes4(const char *const *p, size_t off, const uint8_t (*words)[64], int i, const int gh,
                            __m256i c[4]) {
    if (gh < 0) { pi_transpose8x16(p, off, c); return; }
    for (int m = 0; m < 4; m++) c[m] = _mm256_loadu_si256((const __m256i *)(words[i + m] + 32 * gh));
}

/* One sub-block of 16 (Q2_K, Q3_K, Q6_K, Q8_KW): sumi[t] += sc * (its 16 quants w (4 per lane) . the activations at
 * element `offset` of super-block b), for nt tokens; per_int16 maddubs summed in int16 before the madd: 2 for w < 64,
 * 1 for w < 128. */
static inline void k16_accumulate(const __m256i w[4], __m256i sc, const char *x, int64_t x_stride, int64_t b,
                                  int offset, int nt, __m256i *sumi, const int per_int16) {
    for (int t = 0; t < nt; t++) {
        const int8_t *yq = ((const pi_block_q8_K *)(x + t * x_stride) + b)->qs + offset;
        for (int m = 0; m < 4; m += per_int16)
            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pi_maddubs_sum(w + m, yq + 4 * m, per_int16), sc));
    }
}

/* sum_j c_j bsum_j over the 16 sub-blocks of xb, per lane; cp[i] holds (c_2i, c_2i+1) of each row as int16. */
static inline __m256i pairs_dot_bsums(const __m256i cp[8], const pi_block_q8_K *xb) {
    __m256i c = _mm256_setzero_si256();
    for (int i = 0; i < 8; i++) c = _mm256_add_epi32(c, _mm256_madd_epi16(cp[i], _mm256_set1_epi32(pi_load_i32(xb->bsums + 2 * i))));
    return c;
}

/* acc + (d_x * d) * sumi: the float step of the K-quants without mins (Q3_K, Q6_K). */
static inline __m256 k_step(__m256 acc, float dx, __m256 d, __m256i sumi) {
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(dx), d), _mm256_cvtepi32_ps(sumi)));
}

/* acc + d_x * (d * sumi - dmin * summ): the float step of the K-quants with mins (Q2_K, Q4_K, Q5_K). */
static inline __m256 k_min_step(__m256 acc, float dx, __m256 d, __m256 dmin, __m256i sumi, __m256i summ) {
    const __m256 v = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(summ)));
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(dx), v));
}

/* ======================================================================================
 * The 32-element types with unsigned quants u: Q5_0 . Q8_0S (value d (u - 16)), Q4_1 / Q5_1 . Q8_1 (value d u + m).
 * Canonical orders (pi_vec_dot_q5_0_q8_0s, pi_vec_dot_q4_1_q8_1): per block the exact integer i (Q5_0:
 * sum u y - 16 s, s the activation block's sum; Q4_1 / Q5_1: sum u y), then p[b % 8] = fma(d_w * d_x, i, p[b % 8])
 * (Q4_1 / Q5_1: then p[b % 8] = fma(m_w, s_x, p[b % 8])), blocks in order, and pi_tree8(p).
 * ====================================================================================== */
enum { U32_Q5_0, U32_Q4_1, U32_Q5_1 };   /* which type a u32_dot8 instance reads */

/* qh holds each row's 32 high bits in its lane -> byte k of lane r = 16 if bit 4g + k of row r is set. */
static inline __m256i q5_high_bits(__m256i qh, int g) {
    const __m256i lane = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404, 0x08080808,
                                           0x0c0c0c0c);
    const __m256i spread = _mm256_shuffle_epi8(qh, _mm256_add_epi8(lane, _mm256_set1_epi8((char)(g / 2))));
    const __m256i bit = _mm256_set1_epi32(g & 1 ? (int)0x80402010 : 0x08040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

/* Bytes ahead of each row's block that u32_dot8 requests, once every 3 blocks (about a line). Q4_1 / Q5_1 on Intel
 * and Zen 5 (pi_cpu_software_prefetch; other AMD CPUs not measured), 542M Q4_1 matrices at one token, Sapphire Rapids, 2 threads,
 * against 640: none 1.25x the time, 256 1.03x, 1280 and 2560 1.19-1.2x (the kernel before this one); this one's
 * rows, before the Q4_1X16 copies: 320 0.97x (fastest rounds 1.0x), 1280 1.17x. Q5_0 8 blocks ahead everywhere, as it
 * was tuned (Zen 4). */
#ifndef Q4_1_PREFETCH
#define Q4_1_PREFETCH 640
#endif

static inline __attribute__((always_inline)) void u32_dot8(int64_t n, const void *const *rows, const char *x,
                                                           int64_t x_stride, const int nt, float *y, int64_t y_stride,
                                                           const int kind) {
    const int64_t nb = n / PI_QK;
    const int64_t bsz = kind == U32_Q5_0 ? (int64_t)sizeof(pi_block_q5_0)
                        : kind == U32_Q4_1 ? (int64_t)sizeof(pi_block_q4_1) : (int64_t)sizeof(pi_block_q5_1);
    const size_t qs_off = kind == U32_Q5_0 ? offsetof(pi_block_q5_0, qs)
                          : kind == U32_Q4_1 ? offsetof(pi_block_q4_1, qs) : offsetof(pi_block_q5_1, qs);
    const int64_t qh_off = kind == U32_Q5_0 ? (int64_t)offsetof(pi_block_q5_0, qh)
                           : kind == U32_Q5_1 ? (int64_t)offsetof(pi_block_q5_1, qh) : -1;
    const int64_t ahead = kind == U32_Q5_0 ? 8 * bsz : Q4_1_PREFETCH;
    const bool prefetch = kind == U32_Q5_0 || pi_cpu_software_prefetch();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[PI_DOT8_MAX_T][8];   /* partial sums p[b % 8] of each token, 8 rows per vector (nt <= K_MAX_T) */
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < 8; j++) acc[t][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *p[8];
        for (int k = 0; k < 8; k++) p[k] = (const char *)rows[k] + b * bsz;
        if (prefetch && b % 3 == 0)   /* 3 blocks = 60-72 bytes: about one new cache line per row */
            for (int k = 0; k < 8; k++) _mm_prefetch(p[k] + ahead, _MM_HINT_T0);
        __m256i c[4];
        pi_transpose8x16(p, qs_off, c);
        /* w[g]: elements 4g..4g+3 (g < 4: low nibbles of c[g]; g >= 4: high nibbles of c[g - 4]), + 16 per fifth bit */
        __m256i w[8];
        for (int m = 0; m < 4; m++) {
            w[m] = _mm256_and_si256(c[m], m4);
            w[4 + m] = _mm256_and_si256(_mm256_srli_epi16(c[m], 4), m4);
        }
        if (qh_off >= 0) {
            const __m256i qh = _mm256_setr_epi32(pi_load_i32(p[0] + qh_off), pi_load_i32(p[1] + qh_off),
                                                 pi_load_i32(p[2] + qh_off), pi_load_i32(p[3] + qh_off),
                                                 pi_load_i32(p[4] + qh_off), pi_load_i32(p[5] + qh_off),
                                                 pi_load_i32(p[6] + qh_off), pi_load_i32(p[7] + qh_off));
            for (int g = 0; g < 8; g++) w[g] = _mm256_or_si256(w[g], q5_high_bits(qh, g));
        }
        const __m256 dw = pi_f16x8_rows(p, 0);   /* d: the first 2 bytes of the three block types */
        if (kind == U32_Q5_0) {
            for (int t = 0; t < nt; t++) {
                const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
                const __m256i s = _mm256_add_epi32(pi_dot_u8_bcast(w, xb->qs, 4),
                                                   pi_dot_u8_bcast(w + 4, xb->qs + 16, 4));
                const __m256i i = _mm256_sub_epi32(s, _mm256_set1_epi32(16 * (int32_t)xb->s));
                acc[t][b % 8] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(pi_fp16_to_f32(xb->d))),
                                                _mm256_cvtepi32_ps(i), acc[t][b % 8]);
            }
        } else {
            const __m256 mw = pi_f16x8_rows(p, 2);   /* m: bytes 2-3 of Q4_1 and Q5_1 */
            for (int t = 0; t < nt; t++) {
                const pi_block_q8_1 *xb = (const pi_block_q8_1 *)(x + t * x_stride) + b;
                const __m256i i = _mm256_add_epi32(pi_dot_u8_bcast(w, xb->qs, 4),
                                                   pi_dot_u8_bcast(w + 4, xb->qs + 16, 4));
                const __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(i),
                                                 acc[t][b % 8]);
                acc[t][b % 8] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), a);
            }
        }
    }
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * y_stride, pi_tree8_ps(acc[t]));
}

/* The exported 8-row kernel of Q5_0, Q4_1 or Q5_1 (`name`, activations `act`), and its one-token path: Q5_0 as the
 * K-quants, consecutive rows (--no-repack) one by one and rows apart (the sparse FFN's gathered up rows) side by side
 * (Gemma 3 270M's sparse Q5_0 FFN 0.83-0.87x the time of row by row, Zen 4; consecutive Q5_0 rows side by side took
 * 1.05-1.14x the time); Q4_1 / Q5_1 side by side always (above). */
#define U32_ROWS8(name, act, kind)                                                                                \
    static inline __attribute__((always_inline)) void name##_dot8(int64_t n, const void *const *rows, const char *x, \
                                                                 int64_t x_stride, const int nt, float *y,          \
                                                                 int64_t y_stride) {                                \
        u32_dot8(n, rows, x, x_stride, nt, y, y_stride, kind);                                                   \
    }                                                                                                             \
    static void name##_dot8_one(int64_t n, const void *const *rows, const char *x, float *y) {                    \
        const int64_t row_bytes = n / PI_QK * (int64_t)sizeof(pi_block_##name);                                   \
        if (kind == U32_Q5_0 && rows_consecutive(rows, row_bytes))                                                \
            rows_one(n, rows, x, y, pi_vec_dot_##name##_##act, row_bytes);                                        \
        else name##_dot8(n, rows, x, 0, 1, y, 0);                                                                 \
    }                                                                                                             \
    void pi_vec_dot8_##name##_##act(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,   \
                                    float *y, int64_t y_stride) {                                                 \
        DISPATCH_NT(name##_dot8, name##_dot8_one, K_MAX_T);                                                       \
    }
U32_ROWS8(q5_0, q8_0s, U32_Q5_0)
U32_ROWS8(q4_1, q8_1, U32_Q4_1)
U32_ROWS8(q5_1, q8_1, U32_Q5_1)

/* ======================================================================================
 * Q8_0 . Q8_0S. Canonical order (pi_vec_dot_q8_0_q8_0s): per block the exact integer
 * i = sum w y, then p[b % 8] = fma(d_w * d_x, i, p[b % 8]), blocks in order, and pi_tree8(p). The weights are signed:
 * maddubs(|w|, sign(y, w)) per 4-byte group, widened to int32 at once (lanes up to 32512).
 * ====================================================================================== */
static inline __attribute__((always_inline)) void q8_0_dot8(int64_t n, const void *const *rows, const char *x, int64_t x_stride,
                                                        const int nt, float *y, int64_t y_stride) {
    const int64_t nb = n / PI_QK8_0;
    __m256 acc[PI_DOT8_MAX_T][8];   /* partial sums p[b % 8] of each token, 8 rows per vector (nt <= K_MAX_T) */
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < 8; j++) acc[t][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *p[8];
        for (int k = 0; k < 8; k++) p[k] = (const char *)rows[k] + b * (int64_t)sizeof(pi_block_q8_0);
        if (b % 2 == 0)   /* 2 blocks = 68 bytes */
            for (int k = 0; k < 8; k++) _mm_prefetch(p[k] + 6 * sizeof(pi_block_q8_0), _MM_HINT_T0);
        __m256i w[8], aw[8];   /* w[g]: elements 4g..4g+3 */
        pi_transpose8x16(p, offsetof(pi_block_q8_0, qs), w);
        pi_transpose8x16(p, offsetof(pi_block_q8_0, qs) + 16, w + 4);
        const __m256 dw = pi_f16x8_rows(p, 0);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        /* VNNI: unsigned w + 128, and sum w y = sum (w + 128) y - 128 s */
        for (int g = 0; g < 8; g++) aw[g] = _mm256_xor_si256(w[g], _mm256_set1_epi8((char)0x80));
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
            const __m256i s = _mm256_sub_epi32(pi_dot_u8_bcast(aw, xb->qs, 8), _mm256_set1_epi32(128 * (int32_t)xb->s));
#else
        /* maddubs: |w| (-128 -> 128 unsigned) against sign(y, w) */
        for (int g = 0; g < 8; g++) aw[g] = _mm256_sign_epi8(w[g], w[g]);
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_0s *xb = (const pi_block_q8_0s *)(x + t * x_stride) + b;
            const __m256i s = pi_dot_i8_bcast(w, aw, xb->qs, 8);
#endif
            acc[t][b % 8] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(pi_fp16_to_f32(xb->d))), _mm256_cvtepi32_ps(s),
                                           acc[t][b % 8]);
        }
    }
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * y_stride, pi_tree8_ps(acc[t]));
}

/* One token goes through the 8-row kernel even where the rows are consecutive, unlike the other types: Q8_0's
 * single-row kernel spends about 12 cycles a block (scale gathers, a horizontal sum per 8 blocks), the 8-row one a
 * third of that per row, which outweighs the eight short streams (542M Q8_0 decode 26.7 -> 31.4 t/s, Gemma 3 270M's Q8_0 head
 * +2-10%, on Sapphire Rapids). */
static void q8_0_dot8_one(int64_t n, const void *const *rows, const char *x, float *y) {
    q8_0_dot8(n, rows, x, 0, 1, y, 0);
}

void pi_vec_dot8_q8_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { DISPATCH_NT(q8_0_dot8, q8_0_dot8_one, K_MAX_T); }

/* ======================================================================================
 * Q4_K and Q5_K . Q8_KM. Canonical order (pi_vec_dot_q4_K_q8_K, pi_vec_dot_q5_K_q8_K): per
 * super-block the exact integers sumi = sum_j sc_j mx_j sum_l q_l y_l and summ = sum_j mn_j mx_j (bsum_2j +
 * bsum_2j+1) (mx_j: the activation's step multipliers, quants_k.h), then acc = acc + d_x * (d * sumi -
 * dmin * summ), super-blocks in order. Q5_K is Q4_K with a fifth bit per quant: bit 2j (low nibbles,
 * sub-block 2j) or 2j+1 (high nibbles) of qh[l].
 * ====================================================================================== */


/* Super-block b's step acc[t] of eight rows at any addresses (rows; gh < 0), or of half gh (rows 8gh..8gh+7) of one
 * Q4_KX16 or Q5_KX16 group (the same 32-bit lanes loaded instead of transposed); gh and five_bit are constants after
 * inlining. k4_dot8 runs it over the super-blocks in order, kx16.c's kx16_gemm16 over a group's halves. */
static inline __attribute__((always_inline)) void k4_block8(int64_t b, const void *const *rows, const void *group,
                                                            const int gh, const char *x, int64_t x_stride, const int nt,
                                                            __m256 *acc, const int five_bit) {
    const int64_t block_bytes = five_bit ? (int64_t)sizeof(pi_block_q5_K) : (int64_t)sizeof(pi_block_q4_K);
    const size_t qs_offset = five_bit ? offsetof(pi_block_q5_K, qs) : offsetof(pi_block_q4_K, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const char *p[8];
    __m256i h[4];   /* lane r: bytes 0..15 of row r's block: d | dmin, then the 12 packed scale bytes u0 (q[0..3]), u1, u2 */
    __m256 d, dmin;
    /* an interleaved group's super-block b (Q4_KX16 and Q5_KX16 begin alike: d[16], dmin[16], words from byte 4) */
    const pi_block_q5_Kx16 *gb = gh < 0 ? NULL : (const void *)((const char *)group + b * 16 * block_bytes);
    const uint8_t (*words)[64] = gh < 0 ? NULL : gb->words;
    if (gh < 0) {
        k_block_rows(rows, b, block_bytes, five_bit ? 4 : 3, p);   /* 144 (176) bytes: up to 3 (4) lines */
        pi_transpose8x16(p, 0, h);
        /* d (low half of each lane) and dmin (high half) as 8 floats each */
        const __m256i dd = _mm256_permute4x64_epi64(
            _mm256_packus_epi32(_mm256_and_si256(h[0], _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(h[0], 16)),
            _MM_SHUFFLE(3, 1, 2, 0));
        d = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
        dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1));
    } else {
        d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb->d + 8 * gh)));
        dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb->dmin + 8 * gh)));
        for (int w = 0; w < 3; w++) h[1 + w] = _mm256_loadu_si256((const __m256i *)(words[w] + 32 * gh));
    }
    /* sc/m of sub-blocks 0..3 and 4..7 as bytes of each row's lane (pi_k4_scale_min) */
    const __m256i m6 = _mm256_set1_epi8(0x3f), m2h = _mm256_set1_epi8(0x30);
    const __m256i sc03 = _mm256_and_si256(h[1], m6), mn03 = _mm256_and_si256(h[2], m6);
    const __m256i sc47 = _mm256_or_si256(_mm256_and_si256(h[3], m4), _mm256_and_si256(_mm256_srli_epi32(h[1], 2), m2h));
    const __m256i mn47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(h[3], 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi32(h[2], 2), m2h));

    __m256i sumi[K_MAX_T] = { _mm256_setzero_si256() };   /* all zero */
    /* Q5_K: qh[16 half .. 16 half + 15] transposed like the quants below, once per super-block from the rows; a
     * group's are loaded where they are used (eight registers fewer held across the loop below) */
    __m256i qh[2][4];
    if (five_bit && gh < 0)
        for (int half = 0; half < 2; half++) pi_transpose8x16(p, offsetof(pi_block_q5_K, qh) + 16 * half, qh[half]);
    for (int j = 0; j < 4; j++) {   /* qs[32j..32j+31]: low nibbles sub-block 2j, high nibbles 2j+1 */
        const __m256i sc_lo = lane_bytes_to_i16(j < 2 ? sc03 : sc47, (2 * j) % 4, (2 * j) % 4, 0);
        const __m256i sc_hi = lane_bytes_to_i16(j < 2 ? sc03 : sc47, (2 * j + 1) % 4, (2 * j + 1) % 4, 0);
        for (int half = 0; half < 2; half++) {   /* elements l = 16 half .. 16 half + 15 of both sub-blocks */
            __m256i c[4], w[8], qhh[4];
            k_lanes4(p, qs_offset + 32 * j + 16 * half, words, (int)(qs_offset - 4) / 4 + 8 * j + 4 * half, gh, c);
            if (five_bit) {
                if (gh < 0) for (int m = 0; m < 4; m++) qhh[m] = qh[half][m];
                else k_lanes4(p, offsetof(pi_block_q5_K, qh) + 16 * half, words, 3 + 4 * half, gh, qhh);
            }
            for (int m = 0; m < 4; m++) {
                w[m] = _mm256_and_si256(c[m], m4);
                w[4 + m] = _mm256_and_si256(_mm256_srli_epi16(c[m], 4), m4);
                if (five_bit) {   /* 5-bit quants: 4 maddubs (2 x 31 x 127 each) still fit int16 */
                    w[m] = _mm256_or_si256(w[m], pi_bit_to(qhh[m], 2 * j, 4));   /* the fifth bit: 16 */
                    w[4 + m] = _mm256_or_si256(w[4 + m], pi_bit_to(qhh[m], 2 * j + 1, 4));
                }
            }
            for (int t = 0; t < nt; t++) {
                const pi_block_q8_Km *xm = (const pi_block_q8_Km *)(x + t * x_stride) + b;
                const int8_t *yq = xm->k.qs + 64 * j + 16 * half;
                /* sc_2j mx_2j, sc_2j+1 mx_2j+1 (< 2^11), made where used: no per-token registers held */
                const __m256i scm_lo = _mm256_mullo_epi16(sc_lo, _mm256_set1_epi16(xm->m[2 * j]));
                const __m256i scm_hi = _mm256_mullo_epi16(sc_hi, _mm256_set1_epi16(xm->m[2 * j + 1]));
                const __m256i lo = _mm256_madd_epi16(pi_maddubs_sum(w, yq, 4), scm_lo);
                const __m256i hi = _mm256_madd_epi16(pi_maddubs_sum(w + 4, yq + 32, 4), scm_hi);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(lo, hi));
            }
        }
    }
    /* mins: madd of (m_2i, m_2i+1) per lane against the activation's (mx_2i bs_2i, mx_2i+1 bs_2i+1), bs_j =
     * sum of 32 (|mx bs| <= 32 * 4064: int16 no longer holds it, so mx goes to the mins, as in the sums) */
    __m256i mp[4];
    for (int i = 0; i < 4; i++) mp[i] = lane_bytes_to_i16(i < 2 ? mn03 : mn47, (2 * i) % 4, (2 * i) % 4 + 1, 0);
    for (int t = 0; t < nt; t++) {
        const pi_block_q8_Km *xm = (const pi_block_q8_Km *)(x + t * x_stride) + b;
        const pi_block_q8_K *xb = &xm->k;
        const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)xb->bsums),
                                          _mm_loadu_si128((const __m128i *)xb->bsums + 1));   /* bs_0..bs_7 */
        const __m256i bs8 = _mm256_castsi128_si256(bs);
        /* lane i of mx8 = (mx_2i, mx_2i+1) as its two int16 halves, i = 0..3: the 8 multipliers */
        const __m256i mx8 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)xm->m));
        __m256i summ = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            const __m256i pick = _mm256_set1_epi32(i);
            const __m256i mpm = _mm256_mullo_epi16(mp[i], _mm256_permutevar8x32_epi32(mx8, pick));
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(mpm, _mm256_permutevar8x32_epi32(bs8, pick)));
        }
        acc[t] = k_min_step(acc[t], xb->d, d, dmin, sumi[t], summ);
    }
}

static inline __attribute__((always_inline)) void k4_dot8(int64_t n, const void *const *rows, const char *x, int64_t x_stride,
                                                      const int nt, float *y, int64_t y_stride, const int five_bit) {
    __m256 acc[K_MAX_T] = { _mm256_setzero_ps() };   /* all zero */
    for (int64_t b = 0; b < n / PI_QK_K; b++) k4_block8(b, rows, NULL, -1, x, x_stride, nt, acc, five_bit);
    store_acc(acc, nt, y, y_stride);
}

K_ROWS8(q4_K, k4_dot8, 0, pi_vec_dot_q4_K_q8_K)
K_ROWS8(q5_K, k4_dot8, 1, pi_vec_dot_q5_K_q8_K)

/* ======================================================================================
 * Q2_K and Q3_K . Q8_K: 16 sub-blocks of 16; element e = 128h + 32g + l (l < 32) has the 2 bits
 * 2g, 2g+1 of qs[32h + l] (Q3_K: plus bit 4h + g of hmask[l] as its value 4) and belongs to sub-block
 * 8h + 2g + l / 16. Canonical order (pi_vec_dot_q2_K_q8_K): sumi = sum_j sc_j sum_l u_l y_l and
 * summ = sum_j m_j bsum_j (scale and min: the low and high nibble of scales[j]), then acc = acc + d_x *
 * (d * sumi - dmin * summ). Q3_K (pi_vec_dot_q3_K_q8_K): sumi = sum_j sc_j sum_l (u_l - 4) y_l (computed
 * as sum_j sc_j sum_l u_l y_l - 4 sum_j sc_j bsum_j, sc_j the signed 6-bit scales), then acc = acc +
 * (d_x * d) * sumi.
 * ====================================================================================== */
static inline __attribute__((always_inline)) void k23_dot8(int64_t n, const void *const *rows, const char *x,
                                                       int64_t x_stride, const int nt, float *y, int64_t y_stride,
                                                       const int three_bit) {
    const int64_t nb = n / PI_QK_K;
    const int64_t block_bytes = three_bit ? (int64_t)sizeof(pi_block_q3_K) : (int64_t)sizeof(pi_block_q2_K);
    const size_t qs_offset = three_bit ? offsetof(pi_block_q3_K, qs) : offsetof(pi_block_q2_K, qs);
    const __m256i m2 = _mm256_set1_epi8(3);
    __m256 acc[K_MAX_T] = { _mm256_setzero_ps() };   /* all zero */
    for (int64_t b = 0; b < nb; b++) {
        const char *p[8];
        k_block_rows(rows, b, block_bytes, three_bit ? 3 : 2, p);   /* 84 (110) bytes: up to 2 (3) lines */
        /* scale bytes: byte j % 4 of lane r of sc[j / 4] is row r's sub-block j (Q2_K: min << 4 | scale;
         * Q3_K: the signed scale, pi_k3_scale's value; decoded lane-wise, not row by row through pi_k3_scales16
         * and a transpose of the results: the Q3_K matrices of the 542M Q3_K_M file at T = 128 took 0.86x the time
         * that way, Zen 3, two threads) */
        __m256i sc[4], mn[4];
        if (three_bit) {   /* pi_k3_scales16 lane-wise on the rows' scale words a0, a1, a2 */
            __m256i c[4];   /* bytes 94..109 of each row's block (the 12 scale bytes inside it, 2 either side) */
            pi_transpose8x16(p, offsetof(pi_block_q3_K, scales) - 2, c);
            __m256i a[3];
            for (int i = 0; i < 3; i++) a[i] = _mm256_or_si256(_mm256_srli_epi32(c[i], 16), _mm256_slli_epi32(c[i + 1], 16));
            const __m256i m4 = _mm256_set1_epi8(0x0f), bias = _mm256_set1_epi8(32);
            for (int i = 0; i < 4; i++) {   /* scales 4i..4i+3: low (i < 2) or high nibbles of a[i % 2], 2 bits of a2 */
                const __m256i lo = _mm256_and_si256(i < 2 ? a[i % 2] : _mm256_srli_epi16(a[i % 2], 4), m4);
                const __m256i hi = pi_bits_to(a[2], 2 * i, 2, 4);
                sc[i] = _mm256_sub_epi8(_mm256_or_si256(lo, hi), bias);
            }
        } else {
            __m256i packed[4];
            pi_transpose8x16(p, offsetof(pi_block_q2_K, scales), packed);
            for (int i = 0; i < 4; i++) {
                sc[i] = _mm256_and_si256(packed[i], _mm256_set1_epi8(0x0f));
                mn[i] = _mm256_and_si256(_mm256_srli_epi16(packed[i], 4), _mm256_set1_epi8(0x0f));
            }
        }
        __m256i sumi[K_MAX_T] = { _mm256_setzero_si256() };   /* all zero */
        for (int half = 0; half < 2; half++) {
            __m256i hb[4];   /* Q3_K: hmask[16 half .. 16 half + 15] */
            if (three_bit) pi_transpose8x16(p, offsetof(pi_block_q3_K, hmask) + 16 * half, hb);
            for (int h = 0; h < 2; h++) {
                __m256i a[4];   /* qs[32h + 16 half .. + 15] */
                pi_transpose8x16(p, qs_offset + 32 * h + 16 * half, a);
                for (int g = 0; g < 4; g++) {
                    __m256i w[4];
                    for (int m = 0; m < 4; m++) {
                        w[m] = _mm256_and_si256(_mm256_srli_epi16(a[m], 2 * g), m2);
                        if (three_bit)   /* bit 4h + g of hmask -> value 4 */
                            w[m] = _mm256_or_si256(w[m], pi_bit_to(hb[m], 4 * h + g, 2));
                    }
                    const int j = 8 * h + 2 * g + half;
                    k16_accumulate(w, lane_bytes_to_i16(sc[j / 4], j % 4, j % 4, three_bit), x, x_stride, b,
                                   128 * h + 32 * g + 16 * half, nt, sumi, 2);
                }
            }
        }
        /* sum_j c_j bsum_j (Q2_K: c = the mins; Q3_K: c = the scales): madd of (c_2i, c_2i+1) per lane */
        __m256i cp[8];
        for (int i = 0; i < 8; i++) cp[i] = lane_bytes_to_i16(three_bit ? sc[i / 2] : mn[i / 2], (2 * i) % 4, (2 * i) % 4 + 1, three_bit);
        const __m256 d = pi_f16x8_rows(p, three_bit ? offsetof(pi_block_q3_K, d) : offsetof(pi_block_q2_K, d));
        const __m256 dmin = three_bit ? d : pi_f16x8_rows(p, offsetof(pi_block_q2_K, dmin));
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_K *xb = (const pi_block_q8_K *)(x + t * x_stride) + b;
            const __m256i c = pairs_dot_bsums(cp, xb);
            acc[t] = three_bit ? k_step(acc[t], xb->d, d, _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(c, 2)))
                               : k_min_step(acc[t], xb->d, d, dmin, sumi[t], c);
        }
    }
    store_acc(acc, nt, y, y_stride);
}

K_ROWS8(q2_K, k23_dot8, 0, pi_vec_dot_q2_K_q8_K)
K_ROWS8(q3_K, k23_dot8, 1, pi_vec_dot_q3_K_q8_K)

/* The float steps of a super-block of the types whose quants u carry an offset 2^shift (Q6_K: 32, Q8_KW: 64) and
 * whose 16 int8 scales per row are sc (byte j % 4 of sc[j / 4]): acc[t] += (d_x d) (sumi[t] - 2^shift sum_j sc_j
 * bsum_j), the scales madd-ed in pairs (sc_2i, sc_2i+1) against (bsum_2i, bsum_2i+1). */
static inline __attribute__((always_inline)) void k_offset_steps(__m256 *acc, const __m256i sc[4], const int shift,
                                                                 const char *x, int64_t x_stride, int64_t b, __m256 d,
                                                                 const __m256i *sumi, int nt) {
    __m256i scp[8];
    for (int i = 0; i < 8; i++) scp[i] = lane_bytes_to_i16(sc[i / 2], (2 * i) % 4, (2 * i) % 4 + 1, 1);
    for (int t = 0; t < nt; t++) {
        const pi_block_q8_K *xb = (const pi_block_q8_K *)(x + t * x_stride) + b;
        acc[t] = k_step(acc[t], xb->d, d, _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(pairs_dot_bsums(scp, xb), shift)));
    }
}

/* ======================================================================================
 * Q8_KW . Q8_K (IQ2 rows converted for prompts). Canonical order (pi_vec_dot_q8_kw_q8_K): per super-block
 * sumi = sum_j sc_j sum_l u_l y_l - 64 sum_j sc_j bsum_j, then acc = acc + (d_x * d) * sumi, super-blocks in order;
 * the bytes u < 128 take one maddubs per int16.
 * ====================================================================================== */
/* Super-block b's step acc[t] of eight rows at any addresses (rows; gh < 0), or of half gh (rows 8gh..8gh+7) of one
 * Q8_KWX16 group (loads in place of the transposes; d: word 68, 8 floats) */
static inline __attribute__((always_inline)) void q8_kw_block8(int64_t b, const void *const *rows, const void *group,
                                                               const int gh, const char *x, int64_t x_stride,
                                                               const int nt, __m256 *acc) {
    const char *p[8];
    const uint8_t (*words)[64] = gh < 0 ? NULL : ((const pi_block_q8_kwx16 *)group + b)->words;
    __m256 d;
    if (gh < 0) {
        k_block_rows(rows, b, sizeof(pi_block_q8_kw), 5, p);   /* 276 bytes: up to 5 lines */
        float dr[8];
        for (int k = 0; k < 8; k++) memcpy(&dr[k], p[k] + offsetof(pi_block_q8_kw, d), sizeof(float));
        d = _mm256_loadu_ps(dr);
    } else {
        d = _mm256_loadu_ps((const float *)(words[offsetof(pi_block_q8_kw, d) / 4] + 32 * gh));
    }
    __m256i sc[4];   /* int8 scales: byte j % 4 of sc[j / 4] */
    k_lanes4(p, offsetof(pi_block_q8_kw, scales), words, offsetof(pi_block_q8_kw, scales) / 4, gh, sc);
    __m256i sumi[K_MAX_T] = { _mm256_setzero_si256() };   /* all zero */
    for (int j = 0; j < PI_QK_K / 16; j++) {
        __m256i w[4];
        k_lanes4(p, offsetof(pi_block_q8_kw, u) + 16 * j, words, 4 * j, gh, w);
        k16_accumulate(w, lane_bytes_to_i16(sc[j / 4], j % 4, j % 4, 1), x, x_stride, b, 16 * j, nt, sumi, 1);
    }
    k_offset_steps(acc, sc, 6, x, x_stride, b, d, sumi, nt);   /* - 64 sum_j sc_j bsum_j */
}

static inline __attribute__((always_inline)) void q8_kw_dot8(int64_t n, const void *const *rows, const char *x,
                                                             int64_t x_stride, const int nt, float *y, int64_t y_stride) {
    __m256 acc[K_MAX_T] = { _mm256_setzero_ps() };   /* all zero */
    for (int64_t b = 0; b < n / PI_QK_K; b++) q8_kw_block8(b, rows, NULL, -1, x, x_stride, nt, acc);
    store_acc(acc, nt, y, y_stride);
}

static void q8_kw_dot8_one(int64_t n, const void *const *rows, const char *x, float *y) {
    for (int k = 0; k < 8; k++) y[k] = pi_vec_dot_q8_kw_q8_K(n, rows[k], x);
}

void pi_vec_dot8_q8_kw_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) { DISPATCH_NT(q8_kw_dot8, q8_kw_dot8_one, K_MAX_T); }

/* ======================================================================================
 * Q6_K . Q8_K. Canonical order (pi_vec_dot_q6_K_q8_K): per super-block the exact integer
 * sumi = sum_j sc_j sum_l (u_l - 32) y_l (computed as sum_j sc_j sum_l u_l y_l
 * - 32 sum_j sc_j bsum_j), then acc = acc + (d_x * d) * sumi, super-blocks in order.
 * ====================================================================================== */
/* Super-block b's step acc[t] of eight rows at any addresses (rows; gh < 0), or of half gh (rows 8gh..8gh+7) of one
 * Q6_KX16 group (kx16.c: d[16], then the row block's 52 words as 52 x 64), with loads in place of the transposes. */
static inline __attribute__((always_inline)) void q6_K_block8(int64_t b, const void *const *rows, const void *group,
                                                              const int gh, const char *x, int64_t x_stride,
                                                              const int nt, __m256 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const char *p[8];
    const pi_block_q6_Kx16 *gb = gh < 0 ? NULL : (const pi_block_q6_Kx16 *)group + b;
    const uint8_t (*words)[64] = gh < 0 ? NULL : gb->words;   /* word i: row bytes 4i..4i+3 */
    __m256 d;
    if (gh < 0) {
        k_block_rows(rows, b, sizeof(pi_block_q6_K), 4, p);   /* 210 bytes: up to 4 lines */
        d = pi_f16x8_rows(p, offsetof(pi_block_q6_K, d));
    } else {
        d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb->d + 8 * gh)));
    }
    __m256i sc[4];   /* int8 scales: byte j % 4 of sc[j / 4] */
    k_lanes4(p, offsetof(pi_block_q6_K, scales), words, offsetof(pi_block_q6_K, scales) / 4, gh, sc);

    __m256i sumi[K_MAX_T] = { _mm256_setzero_si256() };   /* all zero */
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            /* ql[64h + l] (a) and ql[64h + 32 + l] (bq), qh[32h + l] for l = 16 half .. 16 half + 15:
             * quarter q of the 128 elements 128h.. takes nibble (q / 2) of a (q even) or bq (q odd) and
             * bits 2q, 2q+1 of qh; its elements 128h + 32q + l are sub-block 8h + 2q + half */
            const int o_a = offsetof(pi_block_q6_K, ql) + 64 * h + 16 * half, o_b = o_a + 32;
            const int o_h = offsetof(pi_block_q6_K, qh) + 32 * h + 16 * half;
            __m256i a[4], bq[4], hb[4];
            k_lanes4(p, o_a, words, o_a / 4, gh, a);
            k_lanes4(p, o_b, words, o_b / 4, gh, bq);
            k_lanes4(p, o_h, words, o_h / 4, gh, hb);
            for (int q = 0; q < 4; q++) {
                __m256i w[4];
                for (int m = 0; m < 4; m++) {
                    const __m256i lo = q & 1 ? bq[m] : a[m];
                    const __m256i nib = _mm256_and_si256(q < 2 ? lo : _mm256_srli_epi16(lo, 4), m4);
                    w[m] = _mm256_or_si256(nib, pi_bits_to(hb[m], 2 * q, 2, 4));   /* bits 2q, 2q+1 of qh */
                }
                const int j = 8 * h + 2 * q + half;
                k16_accumulate(w, lane_bytes_to_i16(sc[j / 4], j % 4, j % 4, 1), x, x_stride, b,
                               128 * h + 32 * q + 16 * half, nt, sumi, 2);
            }
        }
    k_offset_steps(acc, sc, 5, x, x_stride, b, d, sumi, nt);   /* - 32 sum_j sc_j bsum_j */
}

static inline __attribute__((always_inline)) void q6_K_dot8(int64_t n, const void *const *rows, const char *x,
                                                            int64_t x_stride, const int nt, float *y, int64_t y_stride) {
    __m256 acc[K_MAX_T] = { _mm256_setzero_ps() };   /* all zero */
    for (int64_t b = 0; b < n / PI_QK_K; b++) q6_K_block8(b, rows, NULL, -1, x, x_stride, nt, acc);
    store_acc(acc, nt, y, y_stride);
}

static void q6_K_dot8_one(int64_t n, const void *const *rows, const char *x, float *y) {
    const int64_t row_bytes = n / PI_QK_K * (int64_t)sizeof(pi_block_q6_K);
    if (rows_consecutive(rows, row_bytes)) rows_one(n, rows, x, y, pi_vec_dot_q6_K_q8_K, row_bytes);
    else
        q6_K_dot8(n, rows, x, 0, 1, y, 0);
}

void pi_vec_dot8_q6_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride) { DISPATCH_NT(q6_K_dot8, q6_K_dot8_one, K_MAX_T); }

/* ======================================================================================
 * IQ4_XS . Q8_K. Canonical order (K_ROW_DOT of vec_dot_k.c, no mins): per super-block the exact integer
 * sumi = sum_j (ls_j - 32) sum PI_IQ4_VALUES[q] y, then sum += (bd * d) * sumi, super-blocks in order. Per sub-block
 * of 32 the eight rows' 16 nibble bytes are transposed as Q4_0's blocks (rows8.c), the grid looked up, and the
 * signed values dotted with the sign trick (|v| <= 127); the rows' scales ls_j - 32 weight the int32 sums
 * (|sumi| <= 8 * 32 * 32 * 127 * 127 < 2^31).
 * ====================================================================================== */
/* Super-block b's step acc[t] of rows: 8 row pointers (gh < 0), or with gh = 0 / 1 half gh of an IQ4_XSX16 group
 * (arch/kx16.c: per super-block the 16 rows' d, then their scales_h as 16 x 16 bits, then 33 words: scales_l and
 * the 32 words of qs) */
static inline __attribute__((always_inline)) void iq4_xs_block8(int64_t b, const void *const *rows, const void *group,
                                                                const int gh, const char *x, int64_t x_stride,
                                                                const int nt, __m256 *acc) {
    const __m256i grid = pi_iq4_grid(), m4 = _mm256_set1_epi8(0x0f);
    const char *p[8] = { 0 }, *gb = NULL;
    __m256i lo4, sh;   /* lane r = row r: scales_l (nibble j: ls_j's low 4 bits), scales_h (bits 2j, 2j + 1) */
    __m256 dw;
    if (gh < 0) {
        k_block_rows(rows, b, sizeof(pi_block_iq4_xs), 3, p);
        lo4 = _mm256_setr_epi32(pi_load_i32(p[0] + 4), pi_load_i32(p[1] + 4), pi_load_i32(p[2] + 4),
                                pi_load_i32(p[3] + 4), pi_load_i32(p[4] + 4), pi_load_i32(p[5] + 4),
                                pi_load_i32(p[6] + 4), pi_load_i32(p[7] + 4));
        sh = _mm256_srli_epi32(_mm256_setr_epi32(pi_load_i32(p[0]), pi_load_i32(p[1]), pi_load_i32(p[2]),
                                                 pi_load_i32(p[3]), pi_load_i32(p[4]), pi_load_i32(p[5]),
                                                 pi_load_i32(p[6]), pi_load_i32(p[7])), 16);   /* d | sh << 16 */
        dw = pi_f16x8_rows(p, 0);
    } else {
        gb = (const char *)group + 16 * (int64_t)sizeof(pi_block_iq4_xs) * b;   /* one stream: no prefetch */
        lo4 = _mm256_loadu_si256((const __m256i *)(gb + 64 + 32 * gh));
        sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * gh)));
        dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * gh)));
    }
    __m256i isum[PI_DOT8_MAX_T];
    for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
    for (int j = 0; j < PI_QK_K / PI_QK; j++) {
        __m256i c[4], w[8], av[8];   /* w[g]: the values of elements 4g..4g+3 of sub-block j, lane r = row r */
        k_lanes4(p, offsetof(pi_block_iq4_xs, qs) + 16 * j, gb ? (const uint8_t (*)[64])(gb + 64) : NULL, 1 + 4 * j,
                 gh, c);
        for (int m = 0; m < 4; m++) {
            w[m] = _mm256_shuffle_epi8(grid, _mm256_and_si256(c[m], m4));
            w[4 + m] = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16(c[m], 4), m4));
        }
        for (int g = 0; g < 8; g++) av[g] = _mm256_sign_epi8(w[g], w[g]);
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(lo4, 4 * j), _mm256_set1_epi32(15));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(sh, 2 * j), _mm256_set1_epi32(3));
        const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
                                            _mm256_set1_epi32(32));   /* ls_j - 32 of each row */
        for (int t = 0; t < nt; t++) {
            const int8_t *xq = ((const pi_block_q8_K *)(x + t * x_stride) + b)->qs + 32 * j;
            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(pi_dot_i8_bcast(w, av, xq, 8), sc));
        }
    }
    for (int t = 0; t < nt; t++)
        acc[t] = k_step(acc[t], ((const pi_block_q8_K *)(x + t * x_stride) + b)->d, dw, isum[t]);
}

static inline __attribute__((always_inline)) void iq4_xs_rows8(int64_t n, const void *const *rows, const char *x,
                                                               int64_t x_stride, const int nt, float *y,
                                                               int64_t y_stride, const int unused) {
    (void)unused;
    __m256 acc[PI_DOT8_MAX_T];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / PI_QK_K; b++) iq4_xs_block8(b, rows, NULL, -1, x, x_stride, nt, acc);
    store_acc(acc, nt, y, y_stride);
}
K_ROWS8(iq4_xs, iq4_xs_rows8, 0, pi_vec_dot_iq4_xs_q8_K)

#endif

#if PI_NEON
/* Q8_0, Q5_0 (. Q8_0S), Q4_1 and Q5_1 (. Q8_1) on the aarch64 levels: 8 rows as two passes of 4 (rows8.c's NEON
 * scheme: lane k of a register for row k, each row's block sum by pi_neon_rows4_sums). Their canonical orders keep 8
 * partial sums per (row, token), p[b % 8] (pi_vec_dot_q8_0_q8_0s, pi_vec_dot_q5_0_q8_0s, q4_1_family_dot): here 8
 * registers per token (lane k: row k's), so blocks of 2 tokens, each block's float step for the 4 rows at once; at
 * the end each row's p goes through pi_tree8. */
enum { B32_Q8_0, B32_Q5_0, B32_Q4_1, B32_Q5_1 };   /* which type a b32_rows4_neon instance reads */

/* block b's values for rows r[0..3] (elements 0..15: lo, 16..31: hi; unsigned for all but Q8_0) and d / m as lanes */
static inline __attribute__((always_inline)) void b32_rows4_block(const char *const *r, int64_t b, const int type,
                                                                  int8x16_t lo[4], int8x16_t hi[4], float32x4_t *dw,
                                                                  float32x4_t *mw) {
    const int64_t bytes = type == B32_Q8_0 ? (int64_t)sizeof(pi_block_q8_0) : type == B32_Q5_0 ? (int64_t)sizeof(pi_block_q5_0)
                        : type == B32_Q4_1 ? (int64_t)sizeof(pi_block_q4_1) : (int64_t)sizeof(pi_block_q5_1);
    const uint16_t *d[4], *m[4];
    for (int k = 0; k < 4; k++) {
        const char *blk = r[k] + b * bytes;
        d[k] = (const uint16_t *)blk;       /* d first in every one */
        m[k] = (const uint16_t *)blk + 1;   /* Q4_1, Q5_1: m second */
        if (type == B32_Q8_0) {
            lo[k] = vld1q_s8(((const pi_block_q8_0 *)blk)->qs);
            hi[k] = vld1q_s8(((const pi_block_q8_0 *)blk)->qs + 16);
            continue;
        }
        const uint8_t *qs = type == B32_Q5_0 ? ((const pi_block_q5_0 *)blk)->qs
                          : type == B32_Q4_1 ? ((const pi_block_q4_1 *)blk)->qs : ((const pi_block_q5_1 *)blk)->qs;
        pi_neon_nibbles(qs, &lo[k], &hi[k]);
        if (type != B32_Q4_1) {   /* the fifth bits */
            uint32_t qh;
            memcpy(&qh, type == B32_Q5_0 ? ((const pi_block_q5_0 *)blk)->qh : ((const pi_block_q5_1 *)blk)->qh, 4);
            lo[k] = vorrq_s8(lo[k], vreinterpretq_s8_u8(pi_neon_bits16(qh)));
            hi[k] = vorrq_s8(hi[k], vreinterpretq_s8_u8(pi_neon_bits16(qh >> 16)));
        }
    }
    *dw = pi_neon_rows4_f16(d);
    if (type == B32_Q4_1 || type == B32_Q5_1) *mw = pi_neon_rows4_f16(m);
}

static inline __attribute__((always_inline)) void b32_rows4_neon(int64_t nb, const char *const *r, const char *x,
                                                                 int64_t x_stride, const int tok, float *y,
                                                                 int64_t y_stride, const int type) {
    const bool q8_1 = type == B32_Q4_1 || type == B32_Q5_1;   /* the activations: Q8_1, else Q8_0S */
    float32x4_t acc[2][8];   /* [token][b % 8] */
    for (int j = 0; j < tok; j++)
        for (int l = 0; l < 8; l++) acc[j][l] = vdupq_n_f32(0.0f);
    for (int64_t b0 = 0; b0 < nb; b0 += 8)
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {   /* unrolled: acc's index a constant */
            const int64_t b = b0 + l;
            if (b >= nb) break;
            int8x16_t lo[4], hi[4];
            float32x4_t dw, mw = vdupq_n_f32(0.0f);
            b32_rows4_block(r, b, type, lo, hi, &dw, &mw);
            for (int j = 0; j < tok; j++) {
                const char *xb = x + j * x_stride;
                if (q8_1) {
                    const pi_block_q8_1 *a = (const pi_block_q8_1 *)xb + b;
                    const float32x4_t i = vcvtq_f32_s32(pi_neon_rows4_sums(lo, hi, a->qs));
                    acc[j][l] = vfmaq_n_f32(vfmaq_f32(acc[j][l], vmulq_n_f32(dw, a->d), i), mw, a->s);
                } else {
                    const pi_block_q8_0s *a = (const pi_block_q8_0s *)xb + b;
                    int32x4_t i = pi_neon_rows4_sums(lo, hi, a->qs);
                    if (type == B32_Q5_0) i = vsubq_s32(i, vdupq_n_s32(16 * a->s));
                    acc[j][l] = vfmaq_f32(acc[j][l], vmulq_n_f32(dw, pi_fp16_to_f32(a->d)), vcvtq_f32_s32(i));
                }
            }
        }
    for (int j = 0; j < tok; j++) {
        float p[8][4];   /* [b % 8][row] */
        for (int l = 0; l < 8; l++) vst1q_f32(p[l], acc[j][l]);
        for (int k = 0; k < 4; k++) {
            const float pk[8] = { p[0][k], p[1][k], p[2][k], p[3][k], p[4][k], p[5][k], p[6][k], p[7][k] };
            y[j * y_stride + k] = pi_tree8(pk);
        }
    }
}

#define B32_ROWS8_NEON(name, block_size, type)                                                                     \
    void pi_vec_dot8_##name(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y, \
                            int64_t y_stride) {                                                                    \
        const char *const *r = (const char *const *)rows;                                                          \
        for (int k0 = 0; k0 < 8; k0 += 4)                                                                          \
            for (int t0 = 0; t0 < nt; t0 += 2) {                                                                   \
                if (t0 + 1 < nt)                                                                                   \
                    b32_rows4_neon(n / (block_size), r + k0, x + t0 * x_stride, x_stride, 2, y + t0 * y_stride + k0, \
                                   y_stride, type);                                                                \
                else                                                                                               \
                    b32_rows4_neon(n / (block_size), r + k0, x + t0 * x_stride, x_stride, 1, y + t0 * y_stride + k0, \
                                   y_stride, type);                                                                \
            }                                                                                                      \
    }
B32_ROWS8_NEON(q8_0_q8_0s, PI_QK8_0, B32_Q8_0)
B32_ROWS8_NEON(q5_0_q8_0s, PI_QK, B32_Q5_0)
B32_ROWS8_NEON(q4_1_q8_1, PI_QK, B32_Q4_1)
B32_ROWS8_NEON(q5_1_q8_1, PI_QK, B32_Q5_1)
#undef B32_ROWS8_NEON

/* The K-quants and IQ4_XS on the aarch64 levels: Q4_K / Q5_K (fifth: Q5_K's high bits) . Q8_KM, the others . Q8_K, 4 rows x up to 4 tokens a
 * pass (twice for 8 rows, twice more for more than 4 tokens). A super-block's scales are decoded once per row and
 * laid out by sub-block (lane k: row k), a sub-block's values once per row for every token; per token each
 * sub-block's 4 row sums (pi_neon_rows4_sums) times the scales accumulate the exact integers sumi (and summ) of the
 * single-row kernels in the lanes, then lane k takes row k's float step of k_term, sum += bd (d sumi - dmin summ)
 * (Q6_K: sum += bd d sumi), in one vector step per token: the same bits. */
#define K_TOK_MAX 4
/* vec_dot_k.c's k_term for 4 rows' lanes (d, dmin: the rows' scales; bd: the token's step), added to sum:
 * sum + bd (d sumi - dmin summ) with mins, else sum + (bd d) sumi */
static inline __attribute__((always_inline)) float32x4_t k_term4(float32x4_t sum, float bd, float32x4_t d,
                                                                 float32x4_t dmin, int32x4_t sumi, int32x4_t summ,
                                                                 const bool mins) {
    if (mins)
        return vaddq_f32(sum, vmulq_n_f32(vsubq_f32(vmulq_f32(d, vcvtq_f32_s32(sumi)), vmulq_f32(dmin, vcvtq_f32_s32(summ))),
                                          bd));
    return vaddq_f32(sum, vmulq_f32(vmulq_n_f32(d, bd), vcvtq_f32_s32(sumi)));
}
static inline __attribute__((always_inline)) void k4_rows4_neon(int64_t nb, const void *const *rows, const char *x,
                                                                int64_t x_stride, const int tok, float *y,
                                                                int64_t y_stride, const int fifth) {
    float32x4_t sum[K_TOK_MAX];
    for (int t = 0; t < tok; t++) sum[t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs[4], *qh[4], *scales[4];
        const uint16_t *d[4], *dmin[4];
        for (int k = 0; k < 4; k++) {
            if (fifth) {
                const pi_block_q5_K *r = (const pi_block_q5_K *)rows[k] + b;
                qs[k] = r->qs, qh[k] = r->qh, scales[k] = r->scales, d[k] = &r->d, dmin[k] = &r->dmin;
            } else {
                const pi_block_q4_K *r = (const pi_block_q4_K *)rows[k] + b;
                qs[k] = r->qs, qh[k] = NULL, scales[k] = r->scales, d[k] = &r->d, dmin[k] = &r->dmin;
            }
        }
        int32_t sc[8][4], mn[8][4];   /* [sub-block][row] (scalar here: 1.09x the instructions as a vector transpose) */
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 8; j++) {
                uint8_t s_, m_;
                pi_k4_scale_min(j, scales[k], &s_, &m_);
                sc[j][k] = s_, mn[j][k] = m_;
            }
        const pi_block_q8_Km *xb[K_TOK_MAX];
        int32x4_t sumi[K_TOK_MAX], summ[K_TOK_MAX];
        for (int t = 0; t < tok; t++) {
            xb[t] = (const pi_block_q8_Km *)(x + t * x_stride) + b;
            sumi[t] = summ[t] = vdupq_n_s32(0);
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {   /* sub-block j: bytes 32 (j / 2).. of qs, low nibbles for even j */
            int8x16_t lo[4], hi[4];
            for (int k = 0; k < 4; k++)
                for (int h = 0; h < 2; h++) {
                    const uint8x16_t v = vld1q_u8(qs[k] + 32 * (j / 2) + 16 * h);
                    uint8x16_t q = j % 2 ? vshrq_n_u8(v, 4) : vandq_u8(v, vdupq_n_u8(0x0f));
                    if (fifth) q = vorrq_u8(q, pi_neon_select_bit(vld1q_u8(qh[k] + 16 * h), (uint8_t)(1 << j), 16));
                    (h ? hi : lo)[k] = vreinterpretq_s8_u8(q);
                }
            const int32x4_t scv = vld1q_s32(sc[j]), mnv = vld1q_s32(mn[j]);
            for (int t = 0; t < tok; t++) {
                const int32_t m = xb[t]->m[j];
                sumi[t] = vmlaq_s32(sumi[t], pi_neon_rows4_sums(lo, hi, xb[t]->k.qs + 32 * j), vmulq_n_s32(scv, m));
                summ[t] = vmlaq_n_s32(summ[t], mnv, m * (xb[t]->k.bsums[2 * j] + xb[t]->k.bsums[2 * j + 1]));
            }
        }
        const float32x4_t dv = pi_neon_rows4_f16(d), dminv = pi_neon_rows4_f16(dmin);
        for (int t = 0; t < tok; t++) sum[t] = k_term4(sum[t], xb[t]->k.d, dv, dminv, sumi[t], summ[t], true);
    }
    for (int t = 0; t < tok; t++) vst1q_f32(y + t * y_stride, sum[t]);
}

/* Q2_K (mins), Q3_K, Q6_K and Q8_KW (IQ2 and IQ1 rows converted for prompts) . Q8_K: 16 sub-blocks of 16, sub-block
 * 8h + 2g + k holding elements 128h + 32g + 16k .. + 15; k16_values makes a row's four sub-blocks 8h + k, + 2, + 4,
 * + 6 (g = 0..3) as the unsigned u of value = u - K16_OFFSET (Q2_K 0, Q3_K 4, Q6_K 32, Q8_KW 64: u <= 107), whose
 * - offset sum_j sc_j bsum_j is added to sumi once per token (the same exact integer) */
enum { K16_Q2_K, K16_Q3_K, K16_Q6_K, K16_Q8_KW };
#define K16_OFFSET(type) ((type) == K16_Q3_K ? 4 : (type) == K16_Q6_K ? 32 : (type) == K16_Q8_KW ? 64 : 0)
static inline __attribute__((always_inline)) void k16_values(const void *block, int h, int k, const int type,
                                                             int8x16_t u[4]) {
    if (type == K16_Q6_K) {
        uint8x16_t v[4];
        pi_neon_q6_K_values(((const pi_block_q6_K *)block)->ql, ((const pi_block_q6_K *)block)->qh, h, k, v);
        for (int g = 0; g < 4; g++) u[g] = vreinterpretq_s8_u8(v[g]);
        return;
    }
    if (type == K16_Q8_KW) {
        for (int g = 0; g < 4; g++) u[g] = vld1q_s8((const int8_t *)((const pi_block_q8_kw *)block)->u + 128 * h + 32 * g + 16 * k);
        return;
    }
    /* Q2_K: bits 2g of the bytes; Q3_K: the same + 4 * bit (4h + g) of hmask */
    const uint8_t *qs = type == K16_Q2_K ? ((const pi_block_q2_K *)block)->qs : ((const pi_block_q3_K *)block)->qs;
    const uint8x16_t q = vld1q_u8(qs + 32 * h + 16 * k);
    for (int g = 0; g < 4; g++) {
        uint8x16_t v = vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * g))), vdupq_n_u8(3));
        if (type == K16_Q3_K) {
            const uint8x16_t hm = vld1q_u8(((const pi_block_q3_K *)block)->hmask + 16 * k);
            v = vorrq_u8(v, pi_neon_select_bit(hm, (uint8_t)(1 << (4 * h + g)), 4));
        }
        u[g] = vreinterpretq_s8_u8(v);
    }
}

static inline __attribute__((always_inline)) void k16_rows4_neon(int64_t nb, const void *const *rows, const char *x,
                                                                 int64_t x_stride, const int tok, float *y,
                                                                 int64_t y_stride, const int type) {
    const int64_t bytes = type == K16_Q2_K ? (int64_t)sizeof(pi_block_q2_K) : type == K16_Q3_K ? (int64_t)sizeof(pi_block_q3_K)
                        : type == K16_Q6_K ? (int64_t)sizeof(pi_block_q6_K) : (int64_t)sizeof(pi_block_q8_kw);
    float32x4_t sum[K_TOK_MAX];
    for (int t = 0; t < tok; t++) sum[t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const void *r[4];
        const uint16_t *d[4], *dmin[4];
        float dw[4];   /* Q8_KW's f32 d */
        int8x16_t s8[4], m8[4];   /* per row: the 16 scales (Q2_K: and mins) */
        for (int k = 0; k < 4; k++) {
            r[k] = (const char *)rows[k] + b * bytes;
            if (type == K16_Q2_K) {
                const pi_block_q2_K *q = r[k];
                d[k] = &q->d, dmin[k] = &q->dmin;
                const uint8x16_t v = vld1q_u8(q->scales);
                s8[k] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
                m8[k] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
            } else if (type == K16_Q3_K) {
                const pi_block_q3_K *q = r[k];
                d[k] = dmin[k] = &q->d;
                int8_t v[16];
                for (int j = 0; j < 16; j++) v[j] = (int8_t)pi_k3_scale(j, q->scales);
                s8[k] = vld1q_s8(v);
            } else if (type == K16_Q6_K) {
                const pi_block_q6_K *q = r[k];
                d[k] = dmin[k] = &q->d;
                s8[k] = vld1q_s8(q->scales);
            } else {
                const pi_block_q8_kw *q = r[k];
                dw[k] = q->d;
                s8[k] = vld1q_s8(q->scales);
            }
        }
        int32x4_t sc[16], mn[16];   /* [sub-block]: lane k = row k's scale (Q2_K: and min) */
        pi_neon_rows4_transpose16(s8, sc);
        if (type == K16_Q2_K) pi_neon_rows4_transpose16(m8, mn);
        const pi_block_q8_K *xb[K_TOK_MAX];
        int32x4_t sumi[K_TOK_MAX], summ[K_TOK_MAX];
        for (int t = 0; t < tok; t++) {
            xb[t] = (const pi_block_q8_K *)(x + t * x_stride) + b;
            sumi[t] = summ[t] = vdupq_n_s32(0);
            if (type == K16_Q2_K)
                for (int j = 0; j < 16; j++) summ[t] = vmlaq_n_s32(summ[t], mn[j], xb[t]->bsums[j]);
            if (K16_OFFSET(type)) {
                int32x4_t off = vdupq_n_s32(0);
                for (int j = 0; j < 16; j++) off = vmlaq_n_s32(off, sc[j], xb[t]->bsums[j]);
                sumi[t] = vmulq_n_s32(off, -K16_OFFSET(type));
            }
        }
        for (int h = 0; h < 2; h++)
            for (int kk = 0; kk < 2; kk++) {
                int8x16_t u[4][4];   /* [g][row] */
                for (int k = 0; k < 4; k++) {
                    int8x16_t v[4];
                    k16_values(r[k], h, kk, type, v);
                    for (int g = 0; g < 4; g++) u[g][k] = v[g];
                }
                for (int g = 0; g < 4; g++) {
                    const int32x4_t scv = sc[8 * h + 2 * g + kk];
                    for (int t = 0; t < tok; t++)
                        sumi[t] = vmlaq_s32(sumi[t], pi_neon_rows4_sums16(u[g], xb[t]->qs + 128 * h + 32 * g + 16 * kk),
                                            scv);
                }
            }
        const float32x4_t dv = type == K16_Q8_KW ? vld1q_f32(dw) : pi_neon_rows4_f16(d);
        const float32x4_t dminv = type == K16_Q2_K ? pi_neon_rows4_f16(dmin) : dv;
        for (int t = 0; t < tok; t++) sum[t] = k_term4(sum[t], xb[t]->d, dv, dminv, sumi[t], summ[t], type == K16_Q2_K);
    }
    for (int t = 0; t < tok; t++) vst1q_f32(y + t * y_stride, sum[t]);
}

/* IQ4_XS . Q8_K: per sub-block of 32 the nibbles through the grid, scales ls_j - 32; Q6_K's float step */
static inline __attribute__((always_inline)) void iq4_xs_rows4_neon(int64_t nb, const void *const *rows, const char *x,
                                                                    int64_t x_stride, const int tok, float *y,
                                                                    int64_t y_stride, const int unused) {
    (void)unused;
    const int8x16_t grid = vld1q_s8(PI_IQ4_VALUES);
    float32x4_t sum[K_TOK_MAX];
    for (int t = 0; t < tok; t++) sum[t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const pi_block_iq4_xs *r[4];
        const uint16_t *d[4];
        int32_t sc[8][4];   /* [sub-block][row] */
        for (int k = 0; k < 4; k++) {
            r[k] = (const pi_block_iq4_xs *)rows[k] + b;
            d[k] = &r[k]->d;
            for (int j = 0; j < 8; j++) sc[j][k] = pi_iq4_xs_scale(r[k], j);
        }
        const pi_block_q8_K *xb[K_TOK_MAX];
        int32x4_t sumi[K_TOK_MAX];
        for (int t = 0; t < tok; t++) {
            xb[t] = (const pi_block_q8_K *)(x + t * x_stride) + b;
            sumi[t] = vdupq_n_s32(0);
        }
        for (int j = 0; j < 8; j++) {
            int8x16_t lo[4], hi[4];
            for (int k = 0; k < 4; k++) pi_neon_iq4_values(r[k]->qs + 16 * j, grid, &lo[k], &hi[k]);
            const int32x4_t scv = vld1q_s32(sc[j]);
            for (int t = 0; t < tok; t++)
                sumi[t] = vmlaq_s32(sumi[t], pi_neon_rows4_sums(lo, hi, xb[t]->qs + 32 * j), scv);
        }
        const float32x4_t dv = pi_neon_rows4_f16(d);
        for (int t = 0; t < tok; t++) sum[t] = k_term4(sum[t], xb[t]->d, dv, dv, sumi[t], vdupq_n_s32(0), false);
    }
    for (int t = 0; t < tok; t++) vst1q_f32(y + t * y_stride, sum[t]);
}

/* 8 rows x nt tokens through one of the above (body: a rows4 kernel, arg: its flag), 4 rows x K_TOK_MAX tokens a
 * pass, the token count a constant in each copy. one_row (or NULL): the type's single-row dot, which one token takes
 * instead where it costs fewer instructions (qemu counts, bench/README.md: Q6_K's decode 1.09x the single-row
 * kernel's through the 4-row passes, whose sums per sub-block cost as much per row and whose values serve one token) */
#define K_ROWS8_NEON(name, body, arg, one_row)                                                                     \
    void pi_vec_dot8_##name(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y, \
                            int64_t y_stride) {                                                                    \
        pi_vec_dot_fn one = one_row;                                                                               \
        if (one && nt == 1) {                                                                                      \
            for (int k = 0; k < 8; k++) y[k] = one(n, rows[k], x);                                                 \
            return;                                                                                                \
        }                                                                                                          \
        for (int k0 = 0; k0 < 8; k0 += 4)                                                                          \
            for (int t0 = 0; t0 < nt; t0 += K_TOK_MAX) {                                                           \
                const char *xt = x + t0 * x_stride;                                                                \
                float *yt = y + t0 * y_stride + k0;                                                                \
                switch (PI_MIN(K_TOK_MAX, nt - t0)) {                                                              \
                case 1: body(n / PI_QK_K, rows + k0, xt, x_stride, 1, yt, y_stride, arg); break;                   \
                case 2: body(n / PI_QK_K, rows + k0, xt, x_stride, 2, yt, y_stride, arg); break;                   \
                case 3: body(n / PI_QK_K, rows + k0, xt, x_stride, 3, yt, y_stride, arg); break;                   \
                default: body(n / PI_QK_K, rows + k0, xt, x_stride, 4, yt, y_stride, arg); break;                  \
                }                                                                                                  \
            }                                                                                                      \
    }
K_ROWS8_NEON(q4_K_q8_K, k4_rows4_neon, 0, NULL)
K_ROWS8_NEON(q5_K_q8_K, k4_rows4_neon, 1, NULL)
K_ROWS8_NEON(q2_K_q8_K, k16_rows4_neon, K16_Q2_K, pi_vec_dot_q2_K_q8_K)
K_ROWS8_NEON(q3_K_q8_K, k16_rows4_neon, K16_Q3_K, pi_vec_dot_q3_K_q8_K)
K_ROWS8_NEON(q6_K_q8_K, k16_rows4_neon, K16_Q6_K, pi_vec_dot_q6_K_q8_K)
K_ROWS8_NEON(q8_kw_q8_K, k16_rows4_neon, K16_Q8_KW, NULL)
K_ROWS8_NEON(iq4_xs_q8_K, iq4_xs_rows4_neon, 0, NULL)
#undef K_ROWS8_NEON
#undef K16_OFFSET
#undef K_TOK_MAX
#endif
