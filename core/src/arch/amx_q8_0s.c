/* amx_q8_0s.c: AMX tile kernels of the 32-element row types: Q8_0 and Q5_0 (activations Q8_0S), Q4_1 and Q5_1
 * (activations Q8_1; the amx level only; level.c includes it where __AMX_INT8__ is set).
 *
 * pi_tiles_rows_q4_1_q8_1, pi_tiles_rows_q5_1_q8_1 (and pi_tiles_q4_1x16_q8_1, pi_tiles_q5_1x16_q8_1 over their
 * interleaved copies, unpacked per K chunk as Q5_0X16's): Q5_0's row kernel with B = u (no offset) and the min term:
 * their canonical order (pi_vec_dot_q4_1_q8_1) is Q5_0's with p[b % 8] = fma(m_w, s_x, p[b % 8]) after each block's
 * step, which the epilogue adds (the tile table holds s_x beside d_x).
 *
 * pi_tiles_rows_q4_0r_q8_0s: 16 rows of the sparse FFN's Q4_0R layout (q4_0r.c) at any addresses against Q8_0S
 * activations (not its vec_dot type Q8_0P: an A tile needs each block's 32 quants side by side). Q4_0R's canonical
 * order is Q5_0's with the lanes permuted: lane l accumulates the blocks b = BLOCK_OF[l] mod 8, i.e. p[BLOCK_OF[l]],
 * and pi_tree8 over the lanes is ((p0 + p1) + (p4 + p5)) + ((p2 + p3) + (p6 + p7)), the final tree here.
 *
 * pi_tiles_rows_q8_0_q8_0s, pi_tiles_rows_q5_0_q8_0s: 16 rows at any addresses (the file's layout, not
 * repacked) x nt tokens (a multiple of 16) of PI_TYPE_Q8_0S activations; pi_tiles_q8_0x16_q8_0s: the same for
 * one group of the interleaved Q8_0X16 layout, whose quants are the B tiles as they stand (no transposition);
 * pi_tiles_q5_0x16_q8_0s: one Q5_0X16 group, its blocks unpacked into B tiles (u - 16) once per K chunk, as a
 * Q5_0 row's are, so that decode reads the 22-byte blocks (not a 34-byte Q8_0X16 copy). Bit-identical to
 * pi_vec_dot_q8_0_q8_0s / pi_vec_dot_q5_0_q8_0s per (row, token): both canonical orders are, per block b, the
 * exact integer i (Q8_0: sum w y; Q5_0: sum (u - 16) y = sum u y - 16 s), then p[b % 8] = fma(d_w d_x, i,
 * p[b % 8]) (blocks in order within each p[j]), and pi_tree8(p) at the end.
 *
 * One tile product per 32-element block (k = 32 bytes, amx_util.h): TDPBSSD of the signed weights (Q5_0:
 * u - 16 in -16..15) and activations gives the exact i for 16 tokens x 16 rows; the epilogue is the one of
 * Q4_0 (lanes = rows, one accumulator register per token). The 8 partial sums per (row, token) do not fit in
 * registers for 16 tokens, so the blocks of a K chunk go by residue: all blocks b = j mod 8 (in order) into
 * the 16 accumulators of p[j], which wait in `part` between residues and chunks. Each p[j] still sees its
 * blocks in order, so the bits are those of the scalar loop.
 *
 * Tiles per block b:
 *   A  [16 tokens][32 bytes]          s8 activations, straight from the Q8_0S rows (stride x_stride)
 *   B  [8][16 rows x 4 bytes]         s8 weights: B[m][4 r + i] = row r element 4m + i, built per K chunk from
 *                                     the 16 rows' blocks (4-byte words transposed) into a stack tile
 *   C  [16 tokens][16 rows]           int32 i
 * The B tiles of a chunk are built once and serve every token tile of the call (up to AMX_Q8_TG tokens per
 * pass over K). */
#include "../quants_k.h"

#include "amx_util.h"

#include <stddef.h>

#ifndef AMX_Q8_KC
#define AMX_Q8_KC 32    /* blocks per K chunk (a multiple of 8); their B tiles are 32 x 512 bytes */
#endif
#define AMX_Q8_TG 128   /* tokens per pass over K: the partials of 8 token tiles are 64 KB */

/* Q8_0 block b of the 16 rows (p[r] = row r's block) -> the B tile bt [8][64]. */
static inline void amx_q8_0_b(const char *const *p, int8_t *bt) {
    __m512i c[8];
    amx_transpose16x16(p, offsetof(pi_block_q8_0, qs), c);
    amx_transpose16x16(p, offsetof(pi_block_q8_0, qs) + 16, c + 4);
    for (int m = 0; m < 8; m++) _mm512_store_si512((__m512i *)(bt + 64 * m), c[m]);
}

/* Block b of 16 rows of a type with unsigned quants u (Q5_0, Q4_1, Q5_1; p[r] = row r's block) -> bt [8][64], u - bias
 * (Q5_0: 16, the others 0). Element e < 16 is the low nibble of qs[e], e >= 16 the high nibble of qs[e - 16]; its
 * fifth bit (qh_off >= 0: Q5_0, Q5_1) is bit e of qh. B row m holds elements 4m..4m+3 (m < 4: low nibbles of the
 * transposed qs word m; m >= 4: high nibbles of word m - 4). */
static inline __attribute__((always_inline)) void amx_u32_b(const char *const *p, int8_t *bt, size_t qs_off,
                                                            int64_t qh_off, int bias) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i c[4];
    amx_transpose16x16(p, qs_off, c);
    _Alignas(64) uint32_t h[16];   /* qh of each row */
    if (qh_off >= 0)
        for (int r = 0; r < 16; r++) memcpy(&h[r], p[r] + qh_off, 4);
    const __m512i qh = qh_off >= 0 ? _mm512_load_si512((const __m512i *)h) : _mm512_setzero_si512();
    for (int m = 0; m < 8; m++) {
        __m512i u = _mm512_and_si512(m < 4 ? c[m] : _mm512_srli_epi16(c[m - 4], 4), m4);
        if (qh_off >= 0) {
            /* bits 4m..4m+3 of qh -> bit 4 of bytes 0..3 of each lane: the multiply moves bit i to bit 8i */
            const __m512i bits = _mm512_and_si512(_mm512_srli_epi32(qh, 4 * m), _mm512_set1_epi32(0xf));
            const __m512i spread = _mm512_and_si512(_mm512_mullo_epi32(bits, _mm512_set1_epi32(0x00204081)),
                                                    _mm512_set1_epi32(0x01010101));
            u = _mm512_or_si512(u, _mm512_slli_epi32(spread, 4));
        }
        if (bias) u = _mm512_sub_epi8(u, _mm512_set1_epi8((char)bias));
        _mm512_store_si512((__m512i *)(bt + 64 * m), u);
    }
}
static void amx_q5_0_b(const char *const *p, int8_t *bt) {
    amx_u32_b(p, bt, offsetof(pi_block_q5_0, qs), offsetof(pi_block_q5_0, qh), 16);
}
static void amx_q4_1_b(const char *const *p, int8_t *bt) { amx_u32_b(p, bt, offsetof(pi_block_q4_1, qs), -1, 0); }
static void amx_q5_1_b(const char *const *p, int8_t *bt) {
    amx_u32_b(p, bt, offsetof(pi_block_q5_1, qs), offsetof(pi_block_q5_1, qh), 0);
}

/* 16 rows' eight 32-bit words v[r] (r < 16) -> w[l] (l < 8): 32-bit lane r of w[l] = word l of v[r]. Rows r and
 * r + 8 share a register, so an 8 x 8 transpose per 256-bit half does it. */
static inline void amx_words16x8(const __m256i v[16], __m512i w[8]) {
    __m512i z[8], t[8], u[8];
    for (int r = 0; r < 8; r++) z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(v[r]), v[r + 8], 1);
    for (int q = 0; q < 4; q++) {   /* per 128-bit lane: rows 2q, 2q + 1 interleaved */
        t[2 * q] = _mm512_unpacklo_epi32(z[2 * q], z[2 * q + 1]);
        t[2 * q + 1] = _mm512_unpackhi_epi32(z[2 * q], z[2 * q + 1]);
    }
    for (int h = 0; h < 2; h++) {   /* u[4h + k]: words k and 4 + k of rows 4h..4h+3 (128-bit lanes 0, 2 | 1, 3) */
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int k = 0; k < 4; k++) {   /* rows 0-3, 4-7, 8-11, 12-15 of word k (lo) and 4 + k (hi) */
        w[k] = _mm512_permutex2var_epi64(u[k], lo, u[4 + k]);
        w[4 + k] = _mm512_permutex2var_epi64(u[k], hi, u[4 + k]);
    }
}

/* One Q4_0R super-block of 16 rows (p[r]: row r's 144 bytes) -> the B tiles of its 8 blocks (bt[b], q - 8) and their
 * scales (dw[b]): vector c_m holds word m of block BLOCK_OF[l] in 32-bit lane l, the d words lane by lane too. */
static inline void amx_q4_0r_sb(const char *const *p, int8_t (*bt)[8 * 64], float (*dw)[16]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    __m256i v[16];
    __m512i w[8];
    for (int m = 0; m < 4; m++) {
        for (int r = 0; r < 16; r++)
            v[r] = _mm256_loadu_si256((const __m256i *)(p[r] + offsetof(sb_q4_0r, qs) + 32 * m));
        amx_words16x8(v, w);
        for (int l = 0; l < 8; l++) {   /* B rows m (low nibbles: elements 4m..) and 4 + m (high: 16 + 4m..) */
            _mm512_store_si512((__m512i *)(bt[BLOCK_OF[l]] + 64 * m),
                               _mm512_sub_epi8(_mm512_and_si512(w[l], m4), eight));
            _mm512_store_si512((__m512i *)(bt[BLOCK_OF[l]] + 64 * (4 + m)),
                               _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(w[l], 4), m4), eight));
        }
    }
    for (int r = 0; r < 16; r++)
        v[r] = _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p[r] + offsetof(sb_q4_0r, d)))));
    amx_words16x8(v, w);
    for (int l = 0; l < 8; l++) _mm512_store_ps(dw[BLOCK_OF[l]], _mm512_castsi512_ps(w[l]));
}

/* The blocks first, first + 8, ... (< kc) of one token tile into acc: each block's tile product is issued two
 * blocks ahead of its epilogue (four C buffers), so the epilogue's loads find the tile store done instead of
 * waiting for it. With mins (Q4_1, Q5_1: mw the rows' m per block, sx the tokens' s_x at dx + 16), each block's step
 * adds fma(m_w, s_x, .) after the scale's. */
static inline __attribute__((always_inline)) void amx_q8_0s_residue(const int8_t *bt, int64_t bt_stride, const float (*dw)[16],
                                                                    const float (*mw)[16], const char *xt,
                                                                    int64_t x_stride, int64_t bsz, int64_t qoff,
                                                                    int64_t first, int64_t kc, const float *dx,
                                                                    int64_t dx_stride, int32_t (*ct)[16 * 16],
                                                                    __m512 acc[16]) {
    const int64_t count = first < kc ? (kc - first + 7) / 8 : 0;
    int64_t issued = 0;
    for (int64_t i = 0; i < count; i++) {
        for (; issued < PI_MIN(i + 3, count); issued++) {
            const int64_t b = first + 8 * issued;
            if (issued & 1) AMX_PRODUCT(1, 3, 5, bt + b * bt_stride, ct[issued % 4], xt + b * bsz + qoff);
            else            AMX_PRODUCT(0, 2, 4, bt + b * bt_stride, ct[issued % 4], xt + b * bsz + qoff);
        }
        const int64_t b = first + 8 * i;
        amx_epilogue_q8_0s(ct[i % 4], _mm512_load_ps(dw[b]), dx + b * dx_stride, acc);
        if (mw) {
            const __m512 m = _mm512_load_ps(mw[b]);
            const float *sx = dx + b * dx_stride + 16;
            for (int t = 0; t < 16; t++) acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[t]), acc[t]);
        }
    }
}

/* Blocks c0..c0+kc-1 of 16 rows at any addresses -> their B tiles bt, row scales dw and (mw not NULL: Q4_1, Q5_1)
 * row mins mw. */
static inline __attribute__((always_inline)) void amx_build_b_tiles(const void *const *rows, int64_t c0, int64_t kc,
                                                                    int64_t block_bytes,
                                                                    void (*build_b)(const char *const *, int8_t *),
                                                                    int8_t (*bt)[8 * 64], float (*dw)[16],
                                                                    float (*mw)[16]) {
    for (int64_t b = 0; b < kc; b++) {
        const char *p[16];
        for (int r = 0; r < 16; r++) p[r] = (const char *)rows[r] + (c0 + b) * block_bytes;
        build_b(p, bt[b]);
        _mm512_store_ps(dw[b], amx_f16x16_rows(p, 0));   /* d: the first 2 bytes of every block type here */
        if (mw) _mm512_store_ps(mw[b], amx_f16x16_rows(p, 2));   /* m: bytes 2-3 of Q4_1 and Q5_1 */
    }
}

/* Block b of a Q5_0X16 / Q4_1X16 / Q5_1X16 group (x16_kind: X16_Q5, X16_Q4_1, X16_Q5_1) -> its B tile bt [8][64]
 * (the layout of Q8_0X16's quants, q8_0x16.c: Q5_0X16's u - 16, the others' u), the 16 rows' scales dw and (mw not
 * NULL) mins mw. */
static inline __attribute__((always_inline)) void amx_nibbles_x16_b(const void *group, const int x16_kind, int64_t b,
                                                                    int8_t *bt, float *dw, float *mw) {
    __m512i u[8];
    __m512 m;
    _mm512_store_ps(dw, x16_nibble_block(group, x16_kind, b, u, &m));
    for (int k = 0; k < 8; k++)
        _mm512_store_si512((__m512i *)(bt + 64 * k), x16_kind == X16_Q5 ? _mm512_sub_epi8(u[k], _mm512_set1_epi8(16))
                                                                        : u[k]);
    if (mw) _mm512_store_ps(mw, m);
}

/* What amx_rows_q8_0s reads: 16 rows at any addresses (build_b makes a block's B tile, block_bytes its size; AMX_Q4_0R:
 * Q4_0R rows, a super-block's 8 tiles at once), one Q8_0X16 group (its quants are the B tiles) or one Q5_0X16, Q4_1X16
 * or Q5_1X16 group (unpacked into B tiles per K chunk) */
enum { AMX_ROWS, AMX_Q8_0X16, AMX_Q5_0X16, AMX_Q4_1X16, AMX_Q5_1X16, AMX_Q4_0R };

/* The kernel of a weight type with Q8_0S activations, or (with_min: Q4_1, Q5_1) Q8_1 ones and the min term; `kind` (a
 * constant, so each instance keeps one) says what it reads: rows or group. */
static inline __attribute__((always_inline)) void amx_rows_q8_0s(int64_t n, const void *const *rows,
                                                                 const void *group, const int kind,
                                                                 const char *x,
                                                                 int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                                 const char *xtab, int64_t xt_stride, int64_t block_bytes,
                                                                 void (*build_b)(const char *const *, int8_t *),
                                                                 const int with_min) {
    const int64_t nb = n / PI_QK8_0;
    const int64_t bsz = with_min ? (int64_t)sizeof(pi_block_q8_1) : (int64_t)sizeof(pi_block_q8_0s);
    const int64_t qoff = with_min ? (int64_t)offsetof(pi_block_q8_1, qs) : (int64_t)offsetof(pi_block_q8_0s, qs);
    const int64_t dx_stride = with_min ? 32 : 16;   /* floats per block in the tile table: d_x (+ s_x) of 16 tokens */
    _Alignas(64) int8_t bt[AMX_Q8_KC][8 * 64];        /* the chunk's B tiles */
    _Alignas(64) float dw[AMX_Q8_KC][16];             /* the chunk's row scales */
    _Alignas(64) float mw[AMX_Q8_KC][16];             /* the chunk's row mins (with_min) */
    _Alignas(64) float part[AMX_Q8_TG / 16][8][16][16];   /* p[j] per token tile: [tile][j][token][row] */
    _Alignas(64) int32_t ct[4][16 * 16];
    for (int g0 = 0; g0 < nt; g0 += AMX_Q8_TG) {
        const int ntiles = PI_MIN(AMX_Q8_TG, nt - g0) / 16;
        for (int64_t c0 = 0; c0 < nb; c0 += AMX_Q8_KC) {
            const int64_t kc = PI_MIN(AMX_Q8_KC, nb - c0);
            const pi_block_q8_0x16 *g8 = group;
            const int8_t *b0 = kind == AMX_Q8_0X16 ? g8[c0].qs[0] : bt[0];   /* the chunk's B tiles, b_stride apart */
            const int64_t b_stride = kind == AMX_Q8_0X16 ? (int64_t)sizeof *g8 : (int64_t)sizeof bt[0];
            if (kind == AMX_Q8_0X16)
                for (int64_t b = 0; b < kc; b++)
                    _mm512_store_ps(dw[b], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g8[c0 + b].d)));
            else if (kind == AMX_Q4_0R)   /* kc is a multiple of 8: whole super-blocks */
                for (int64_t b = 0; b < kc; b += 8) {
                    const char *p[16];
                    for (int r = 0; r < 16; r++)
                        p[r] = (const char *)rows[r] + (c0 + b) / 8 * (int64_t)sizeof(sb_q4_0r);
                    amx_q4_0r_sb(p, bt + b, dw + b);
                }
            else if (kind != AMX_ROWS)   /* the nibble groups */
                for (int64_t b = 0; b < kc; b++)
                    amx_nibbles_x16_b(group, kind == AMX_Q5_0X16 ? X16_Q5 : kind == AMX_Q4_1X16 ? X16_Q4_1 : X16_Q5_1,
                                      c0 + b, bt[b], dw[b], with_min ? mw[b] : NULL);
            else
                amx_build_b_tiles(rows, c0, kc, block_bytes, build_b, bt, dw, with_min ? mw : NULL);
            __asm__ volatile("" ::: "memory");   /* the tile loads below read bt */
            for (int tt = 0; tt < ntiles; tt++) {
                const char *xt = x + (g0 + 16 * tt) * x_stride + c0 * bsz;
                for (int j = 0; j < 8; j++) {   /* c0 is a multiple of 8: chunk block b is global block c0 + b = b mod 8 */
                    __m512 acc[16];
                    for (int t = 0; t < 16; t++) acc[t] = c0 ? _mm512_load_ps(part[tt][j][t]) : _mm512_setzero_ps();
                    const float *dx = amx_q8_0s_scales(xtab + (g0 / 16 + tt) * xt_stride) + dx_stride * c0;
                    amx_q8_0s_residue(b0, b_stride, dw, with_min ? mw : NULL, xt, x_stride, bsz, qoff, j, kc, dx,
                                      dx_stride, ct, acc);
                    for (int t = 0; t < 16; t++) _mm512_store_ps(part[tt][j][t], acc[t]);
                }
            }
            __asm__ volatile("" ::: "memory");   /* the next chunk's B tiles overwrite bt */
        }
        /* pi_tree8 over the partials (Q4_0R: over its lanes p[BLOCK_OF[l]]), lanes = rows */
        for (int tt = 0; tt < ntiles; tt++)
            for (int t = 0; t < 16; t++) {
                __m512 q[8];
                for (int j = 0; j < 8; j++) q[j] = _mm512_load_ps(part[tt][j][t]);
                const __m512 s =
                    kind == AMX_Q4_0R
                        ? _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(q[0], q[1]), _mm512_add_ps(q[4], q[5])),
                                        _mm512_add_ps(_mm512_add_ps(q[2], q[3]), _mm512_add_ps(q[6], q[7])))
                        : _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(q[0], q[4]), _mm512_add_ps(q[2], q[6])),
                                        _mm512_add_ps(_mm512_add_ps(q[1], q[5]), _mm512_add_ps(q[3], q[7])));
                _mm512_storeu_ps(y + (g0 + 16 * tt + t) * y_stride, s);
            }
    }
}

void pi_tiles_rows_q8_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_rows_q8_0s(n, rows, NULL, AMX_ROWS, x, x_stride, nt, y, y_stride, xt, xt_stride, sizeof(pi_block_q8_0),
                   amx_q8_0_b, 0);
}

/* The exported tile kernel of an interleaved group kind `kind` (activations `act`; with_min: Q8_1's min term). */
#define AMX_GROUP_TILES(name, act, kind, with_min)                                                                  \
    void pi_tiles_##name##_##act(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,    \
                                 int64_t y_stride, const char *xt, int64_t xt_stride) {                             \
        amx_rows_q8_0s(n, NULL, group, kind, x, x_stride, nt, y, y_stride, xt, xt_stride, 0, NULL, with_min);      \
    }
AMX_GROUP_TILES(q8_0x16, q8_0s, AMX_Q8_0X16, 0)
AMX_GROUP_TILES(q5_0x16, q8_0s, AMX_Q5_0X16, 0)
AMX_GROUP_TILES(q4_1x16, q8_1, AMX_Q4_1X16, 1)
AMX_GROUP_TILES(q5_1x16, q8_1, AMX_Q5_1X16, 1)

void pi_tiles_rows_q4_0r_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                               int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_rows_q8_0s(n, rows, NULL, AMX_Q4_0R, x, x_stride, nt, y, y_stride, xt, xt_stride, 0, NULL, 0);
}

void pi_tiles_rows_q5_0_q8_0s(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_rows_q8_0s(n, rows, NULL, AMX_ROWS, x, x_stride, nt, y, y_stride, xt, xt_stride, sizeof(pi_block_q5_0),
                   amx_q5_0_b, 0);
}

void pi_tiles_rows_q4_1_q8_1(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_rows_q8_0s(n, rows, NULL, AMX_ROWS, x, x_stride, nt, y, y_stride, xt, xt_stride, sizeof(pi_block_q4_1),
                   amx_q4_1_b, 1);
}

void pi_tiles_rows_q5_1_q8_1(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_rows_q8_0s(n, rows, NULL, AMX_ROWS, x, x_stride, nt, y, y_stride, xt, xt_stride, sizeof(pi_block_q5_1),
                   amx_q5_1_b, 1);
}

/* Q8_0S's tile table (amx_q8_0s_scales): the block scales d as floats, [block][16 rows] per token tile. */
void pi_tiles_prep_q8_0s(int64_t n, const void *row, int r, char *tile) {
    const pi_block_q8_0s *x = row;
    float *d = (float *)tile;
    for (int64_t b = 0; b < n / PI_QK8_0; b++) d[16 * b + r] = pi_fp16_to_f32(x[b].d);
}

/* Q8_1's tile table: per block the d_x of the token tile's 16 rows, then their s_x, as floats: [block][2][16 rows]. */
void pi_tiles_prep_q8_1(int64_t n, const void *row, int r, char *tile) {
    const pi_block_q8_1 *x = row;
    float *d = (float *)tile;
    for (int64_t b = 0; b < n / PI_QK; b++) {
        d[32 * b + r] = x[b].d;
        d[32 * b + 16 + r] = x[b].s;
    }
}
