/* amx_util.h: what the AMX tile kernels share (amx.c, amx_q8_0.c, amx_k.c; the amx level only): the tile
 * configuration, the 16-row transposition that builds B tiles from rows at any addresses, and the Q8_0S
 * float epilogue of one 32-element block.
 *
 * Tile numbering in every kernel (palette 1): tmm0/tmm1 C [16 tokens][16 rows] int32, tmm2/tmm3 A [16 tokens]
 * [k bytes] s8 activations, tmm4/tmm5 B [k/4][16 rows x 4 bytes] s8 weights ("VNNI" layout: B[i/4][4 r + i%4]
 * = row r element i), tmm6/tmm7 two more B tiles, k = the elements of one product (32; 64 for the K-quants, whose
 * kernels number their tiles themselves: amx_k.c). Two products are in flight (even ones on tmm0/2/4, odd ones on
 * tmm1/3/5). */
#ifndef PI_AMX_UTIL_H
#define PI_AMX_UTIL_H

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

/* The 64-byte LDTILECFG operand (pi_tile_session.saved holds one). */
typedef struct {
    uint8_t  palette;
    uint8_t  start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];   /* bytes per row of tile i */
    uint8_t  rows[16];
} __attribute__((aligned(64))) amx_tile_config;

/* Loads the configuration above for products of k bytes (k a multiple of 4, <= 64). */
static inline void amx_configure(int k) {
    amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) {
        cfg.rows[0 + i] = 16; cfg.colsb[0 + i] = 16 * sizeof(int32_t);   /* C: 16 tokens x 16 rows int32 */
        cfg.rows[2 + i] = 16; cfg.colsb[2 + i] = (uint16_t)k;            /* A: 16 tokens x k s8 */
        cfg.rows[4 + i] = (uint8_t)(k / 4); cfg.colsb[4 + i] = 16 * 4;   /* B: k/4 x (16 rows x 4 s8) */
        cfg.rows[6 + i] = (uint8_t)(k / 4); cfg.colsb[6 + i] = 16 * 4;   /* tmm6/tmm7: two more B tiles */
    }
    /* GCC 12 sees no reader of cfg in _tile_loadconfig and drops the stores above without this barrier */
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&cfg);
}

/* A tile session on the calling thread (pi_cpu_kernels.tiles_begin/tiles_end: mul_mat opens one per work item,
 * around all the tile kernel calls of its rows; STTILECFG and LDTILECFG cost thousands of cycles, 16% of a Q4_K
 * prompt matmul when every kernel call paid them). amx_begin saves the thread's tile configuration (all zero when
 * no one had tiles configured) and loads ours for products of k bytes; amx_end puts the saved configuration back
 * (the tile data is zeroed either way) or releases the tiles. Another library in the process may configure its
 * tiles once per thread and rely on that: llama.cpp's AMX kernels do, and died with an illegal instruction in
 * tests/compat after a TILERELEASE of ours on the same thread. */
static inline void amx_begin(int k, pi_tile_session *s) {
    _tile_storeconfig(s->saved);
    __asm__ volatile("" ::: "memory");   /* the read of the saved palette in amx_end follows the store */
    amx_configure(k);
}

static inline void amx_end(const pi_tile_session *s) {
    __asm__ volatile("" ::: "memory");
    if (s->saved[0]) _tile_loadconfig(s->saved);   /* byte 0: the palette (0: no configuration) */
    else _tile_release();
}

/* One product on tiles (C, A, B): B from the tile buffer bt (64-byte rows), A from activation rows xq
 * (stride x_stride, a variable of the caller), the int32 result stored to ct [16][16]. The tile macros are
 * asm statements that take addresses only, so the compiler barrier orders the later loads from ct after
 * the tile store. Tile numbers must be literals. */
#define AMX_PRODUCT(C, A, B, bt, ct, xq)                    \
    do {                                                    \
        _tile_loadd(B, (bt), 64);                           \
        _tile_loadd(A, (xq), x_stride);                     \
        _tile_zero(C);                                      \
        _tile_dpbssd(C, A, B);                              \
        _tile_stored(C, (ct), 64);                          \
        __asm__ volatile("" ::: "memory");                  \
    } while (0)

/* Two products (C0, A0, B0) = tiles 0, 2, 4 and (C1, A1, B1) = tiles 1, 3, 5, both multiplies issued before either
 * store: the tile unit works on the second while the first drains (AMX_PRODUCT twice stores C0 before it starts
 * C1). bt0/bt1 B tiles, xq0/xq1 activation rows (stride x_stride), ct0/ct1 the int32 results. */
#define AMX_PRODUCT_PAIR(bt0, xq0, ct0, bt1, xq1, ct1)      \
    do {                                                    \
        _tile_loadd(4, (bt0), 64);                          \
        _tile_loadd(2, (xq0), x_stride);                    \
        _tile_loadd(5, (bt1), 64);                          \
        _tile_loadd(3, (xq1), x_stride);                    \
        _tile_zero(0);                                      \
        _tile_zero(1);                                      \
        _tile_dpbssd(0, 2, 4);                              \
        _tile_dpbssd(1, 3, 5);                              \
        _tile_stored(0, (ct0), 64);                         \
        _tile_stored(1, (ct1), 64);                         \
        __asm__ volatile("" ::: "memory");                  \
    } while (0)

/* Bytes off..off+15 of the 16 rows p[0..15] -> c[0..3]: 32-bit lane r of c[m] = bytes off+4m..off+4m+3 of
 * row r (c[m] is row m of a B tile when the 16 bytes are elements 4m.. of one product). */
static inline void amx_transpose16x16(const char *const *p, size_t off, __m512i c[4]) {
    __m256i lo[4], hi[4];
    pi_transpose8x16(p, off, lo);
    pi_transpose8x16(p + 8, off, hi);
    for (int m = 0; m < 4; m++) c[m] = _mm512_inserti64x4(_mm512_castsi256_si512(lo[m]), hi[m], 1);
}

/* The same four vectors from the rows p (interleaved = 0: amx_transpose16x16), or from an interleaved group whose
 * 64-byte words are those lanes already: the four consecutive words at w, where the group keeps the rows' bytes
 * off.. (the caller's layout says where). */
static inline __attribute__((always_inline)) void amx_rows_or_words(const char *const *p, size_t off,
                                                                    const int interleaved, const char *w, __m512i c[4]) {
    if (interleaved) for (int m = 0; m < 4; m++) c[m] = _mm512_loadu_si512(w + 64 * m);
    else amx_transpose16x16(p, off, c);
}

/* The f16 words at byte `off` of the 16 rows p[0..15] as 16 floats (lane r = row r). */
static inline __m512 amx_f16x16_rows(const char *const *p, size_t off) {
    _Alignas(32) uint16_t h[16];
    for (int r = 0; r < 16; r++) memcpy(&h[r], p[r] + off, 2);
    return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)h));
}

/* The tile table of Q8_0S activations (pi_tiles_prep_q8_0s): per token tile, the rows' block scales d as floats,
 * [K / 32 blocks][16 rows]. */
static inline const float *amx_q8_0s_scales(const char *tile) { return (const float *)tile; }

/* The float epilogue of one 32-element block against Q8_0S activations (Q4_0, Q8_0): ct [16 tokens][16 rows]
 * int32 = the block's exact integer sums, dw the 16 row scales, dx the 16 tokens' scales of the block (its row of
 * the tile table). acc[t] = fma(d_w * d_x, (float)i, acc[t]), lanes = rows: the step of both types' canonical
 * orders. Each dx[t] is broadcast from memory by the multiply (a load port): gathering them here per call, and
 * GCC's vpermd broadcasts of a register, cost 15% and 26% of a 7B Q4_0 prompt matmul on Sapphire Rapids. */
static inline void amx_epilogue_q8_0s(const int32_t *ct, __m512 dw, const float *dx, __m512 acc[16]) {
    for (int t = 0; t < 16; t++) {
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t]));   /* d_w * d_x, as the scalar code */
        acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_load_si512((const __m512i *)(ct + 16 * t))), acc[t]);
    }
}


#endif
