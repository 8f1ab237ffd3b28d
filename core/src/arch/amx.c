/* amx.c: AMX tile kernels (the amx level only; level.c includes this file where __AMX_INT8__ is set).
 *
 * pi_gemm16_q4_0x8_q8_0s: 16 interleaved Q4_0 rows (two PI_TYPE_Q4_0X8 groups) x nt tokens (a multiple of
 * 16) of PI_TYPE_Q8_0S activations, for prompt batches. Bit-identical to pi_vec_dot_q4_0_q8_0s per
 * (row, token): the canonical Q4_0 order (docs/design.md, "Fast kernels and one arithmetic order").
 *
 * How the canonical order survives the tiles: every tile product covers exactly one 32-element block
 * (K = 32 bytes), so TDPBSUD (s8 x u8 -> exact int32 sums) yields, per block, the exact integer
 * sum q y for 16 tokens x 16 rows; the float epilogue then does, per (token, row) lane,
 * i = sum - 8 s (exact), acc = fma(d_w * d_x, (float)i, acc), block after block. Vector lanes are
 * the 16 rows (never elements of one sum), one accumulator register per token.
 *
 * Tiles (palette 1), per block b and token tile of 16:
 *   A  tmm2/tmm3: [16 tokens][32 bytes]    s8, read straight from the Q8_0S rows (block b's qs, row
 *                                          stride x_stride): A[t][k] = x_t element k of block b
 *   B  tmm4/tmm5: [8][16 rows x 4 bytes]   u8 ("VNNI" layout: B[k/4][4 r + k%4] = row r element k),
 *                                          unpacked at run time from the Q4_0X8 group into a stack tile
 *   C  tmm0/tmm1: [16 tokens][16 rows]     int32, C = A B: the per-block integer sums q y
 * Two blocks are in flight (even blocks on tmm0/2/4, odd blocks on tmm1/3/5), so the tile unit works
 * on block b+1 while the vector unit does block b's epilogue.
 *
 * The B tile from the interleaved layout: group block qs[32 m + 4 r + j] = byte 4m+j of row r, whose low
 * nibble is element 4m+j and high nibble element 16+4m+j. So B row m (m < 4) is the 32 bytes qs[32m..]
 * of group 0 and of group 1 side by side, low nibbles; B row 4+m the same bytes' high nibbles. The
 * layout on disk and in memory stays Q4_0X8 (level-independent); only this per-thread tile differs.
 *
 * Tile state is per thread: each call loads its configuration and releases the tiles at the end (a
 * call covers 16 rows x all its tokens x K, so the configuration costs well under 1%). */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

/* The 64-byte LDTILECFG operand. */
typedef struct {
    uint8_t  palette;
    uint8_t  start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];   /* bytes per row of tile i */
    uint8_t  rows[16];
} __attribute__((aligned(64))) amx_tile_config;

static void amx_configure(void) {
    amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) {
        cfg.rows[0 + i] = 16; cfg.colsb[0 + i] = 16 * sizeof(int32_t);   /* C: 16 tokens x 16 rows int32 */
        cfg.rows[2 + i] = 16; cfg.colsb[2 + i] = PI_QK8_0;               /* A: 16 tokens x 32 s8 */
        cfg.rows[4 + i] = PI_QK4_0 / 4; cfg.colsb[4 + i] = 16 * 4;       /* B: 8 x (16 rows x 4 u8) */
    }
    /* GCC 12 sees no reader of cfg in _tile_loadconfig and drops the stores above without this barrier */
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&cfg);
}

/* Block b of the two groups -> the B tile bt [8][64] (layout in the header comment). */
static inline void amx_unpack_b(const pi_block_q4_0x8 *g0, const pi_block_q4_0x8 *g1, uint8_t *bt) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int m = 0; m < 4; m++) {
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g0->qs + 32 * m))),
                                             _mm256_loadu_si256((const __m256i *)(g1->qs + 32 * m)), 1);
        _mm512_store_si512((__m512i *)(bt + 64 * m), _mm512_and_si512(v, m4));
        _mm512_store_si512((__m512i *)(bt + 64 * (4 + m)), _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
}

/* The float epilogue of one block: ct [16 tokens][16 rows] int32 sums, dw the 16 row scales, xt the token
 * tile's first activation row (block b at byte offset boff), tok[t] = t * x_stride. acc[t] += per row. */
static inline void amx_epilogue(const int32_t *ct, __m512 dw, const char *xt, int64_t boff, __m512i tok,
                                __m512 acc[16]) {
    /* d (f16, low half) and s (int16, high half) of block b for the 16 tokens: one gather of the blocks'
     * first 4 bytes */
    const __m512i ds = _mm512_i32gather_epi32(tok, xt + boff, 1);
    float dx[16];
    int32_t s8[16];
    _mm512_storeu_ps(dx, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(ds)));
    _mm512_storeu_si512((__m512i *)s8, _mm512_slli_epi32(_mm512_srai_epi32(ds, 16), 3));   /* 8 s */
    for (int t = 0; t < 16; t++) {
        const __m512i i = _mm512_sub_epi32(_mm512_load_si512((const __m512i *)(ct + 16 * t)), _mm512_set1_epi32(s8[t]));
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t]));   /* d_w * d_x, as the scalar code */
        acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(i), acc[t]);
    }
}

/* The 16 row scales of block b (group 0's 8, then group 1's). */
static inline __m512 amx_row_scales(const pi_block_q4_0x8 *g0, const pi_block_q4_0x8 *g1) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)g0->d)),
                                                   _mm_loadu_si128((const __m128i *)g1->d), 1));
}

/* One block on tiles (C, A, B): unpack B into bt, load A from the activations, ct = the integer sums. The
 * tile macros are asm statements that take addresses only, so the compiler barriers order them against
 * the C stores to bt and the loads from ct. Tile numbers must be literals. */
#define AMX_BLOCK(C, A, B, bt, ct, g0b, g1b, xq)            \
    do {                                                    \
        amx_unpack_b((g0b), (g1b), (bt));                   \
        __asm__ volatile("" ::: "memory");                  \
        _tile_loadd(B, (bt), 64);                           \
        _tile_loadd(A, (xq), x_stride);                     \
        _tile_zero(C);                                      \
        _tile_dpbsud(C, A, B);                              \
        _tile_stored(C, (ct), 64);                          \
        __asm__ volatile("" ::: "memory");                  \
    } while (0)

void pi_gemm16_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride) {
    const int64_t nb = n / PI_QK4_0;
    const pi_block_q4_0x8 *g0 = group, *g1 = g0 + nb;   /* rows 0..7, rows 8..15 */
    const int64_t bsz = (int64_t)sizeof(pi_block_q8_0s), qoff = (int64_t)offsetof(pi_block_q8_0s, qs);
    _Alignas(64) uint8_t bt[2][8 * 64];
    _Alignas(64) int32_t ct[2][16 * 16];
    const __m512i tok = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int32_t)x_stride));
    amx_configure();
    for (int t0 = 0; t0 < nt; t0 += 16) {
        const char *xt = x + t0 * x_stride;
        __m512 acc[16];
        for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {   /* blocks b (tiles 0, 2, 4) and b+1 (tiles 1, 3, 5) */
            AMX_BLOCK(0, 2, 4, bt[0], ct[0], g0 + b, g1 + b, xt + b * bsz + qoff);
            AMX_BLOCK(1, 3, 5, bt[1], ct[1], g0 + b + 1, g1 + b + 1, xt + (b + 1) * bsz + qoff);
            amx_epilogue(ct[0], amx_row_scales(g0 + b, g1 + b), xt, b * bsz, tok, acc);
            amx_epilogue(ct[1], amx_row_scales(g0 + b + 1, g1 + b + 1), xt, (b + 1) * bsz, tok, acc);
        }
        if (b < nb) {
            AMX_BLOCK(0, 2, 4, bt[0], ct[0], g0 + b, g1 + b, xt + b * bsz + qoff);
            amx_epilogue(ct[0], amx_row_scales(g0 + b, g1 + b), xt, b * bsz, tok, acc);
        }
        for (int t = 0; t < 16; t++) _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
    }
    _tile_release();
}
