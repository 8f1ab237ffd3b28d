/* amx.c: AMX tile kernels (the amx level only; level.c includes this file where __AMX_INT8__ is set).
 *
 * pi_tiles_q4_0x8_q8_0s: 16 interleaved Q4_0 rows (two PI_TYPE_Q4_0X8 groups) x nt tokens (a multiple of
 * 16) of PI_TYPE_Q8_0S activations, for prompt batches. Bit-identical to pi_vec_dot_q4_0_q8_0s per
 * (row, token): the canonical Q4_0 order (docs/design.md, "Fast kernels and one arithmetic order").
 * pi_tiles_iq4_nlx8_q8_0s and pi_tiles_mxfp4x8_q8_0s: the same over IQ4_NLX8 / MXFP4X8 groups, whose B tiles hold
 * the grid's values (IQ4_NL's order is Q4_0's with i = sum v y; MXFP4's scales are E8M0 bytes).
 *
 * How the canonical order survives the tiles: every tile product covers exactly one 32-element block
 * (K = 32 bytes), so TDPBSSD (s8 x s8 -> exact int32 sums) yields, per block, the exact integer
 * i = sum (q - 8) y (= sum q y - 8 s of the other kernels) for 16 tokens x 16 rows; the float epilogue
 * then does, per (token, row) lane, acc = fma(d_w * d_x, (float)i, acc), block after block. Vector lanes
 * are the 16 rows (never elements of one sum), one accumulator register per token.
 *
 * Tiles (palette 1), per block b and token tile of 16:
 *   A  tmm2/tmm3: [16 tokens][32 bytes]    s8, read straight from the Q8_0S rows (block b's qs, row
 *                                          stride x_stride): A[t][k] = x_t element k of block b
 *   B  tmm4/tmm5: [8][16 rows x 4 bytes]   s8 q - 8 ("VNNI" layout: B[k/4][4 r + k%4] = row r element k),
 *                                          unpacked at run time from the Q4_0X8 group into a stack tile
 *   C  tmm0/tmm1: [16 tokens][16 rows]     int32, C = A B: the per-block integer sums
 * Two blocks are in flight (even blocks on tmm0/2/4, odd blocks on tmm1/3/5), so the tile unit works
 * on block b+1 while the vector unit does block b's epilogue. K goes in chunks of AMX_KC blocks whose B
 * tiles are unpacked once and then serve every token tile of the call.
 *
 * The B tile from the interleaved layout: group block qs[32 m + 4 r + j] = byte 4m+j of row r, whose low
 * nibble is element 4m+j and high nibble element 16+4m+j. So B row m (m < 4) is the 32 bytes qs[32m..]
 * of group 0 and of group 1 side by side, low nibbles; B row 4+m the same bytes' high nibbles (minus 8). The
 * layout on disk and in memory stays Q4_0X8 (level-independent); only this per-thread tile differs.
 *
 * Tile state is per thread: the caller (mul_mat) opens a tile session around its calls (pi_tiles_begin below). */
#include "amx_util.h"

/* Block b of the two groups (b0, b1: the block's bytes in each, kind: PI_NIB_Q4_0, PI_NIB_IQ4_NL, PI_NIB_MXFP4 as in
 * rows8.c, whose group layouts differ only in the scale bytes before the qs) -> the B tile bt [8][64] (layout in the
 * header comment), the weights signed: q - 8 in -8..7 (Q4_0), the grid's value of q (IQ4_NL, MXFP4: int8). */
static inline __attribute__((always_inline)) void amx_unpack_b(const char *b0, const char *b1, int8_t *bt, const int kind) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)pi_nib_values(kind)));
    const int64_t qoff = 8 * pi_nib_scale_bytes(kind);
    for (int m = 0; m < 4; m++) {
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + qoff + 32 * m))),
                                             _mm256_loadu_si256((const __m256i *)(b1 + qoff + 32 * m)), 1);
        const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        _mm512_store_si512((__m512i *)(bt + 64 * m),
                           kind == PI_NIB_Q4_0 ? _mm512_sub_epi8(lo, eight) : _mm512_shuffle_epi8(values, lo));
        _mm512_store_si512((__m512i *)(bt + 64 * (4 + m)),
                           kind == PI_NIB_Q4_0 ? _mm512_sub_epi8(hi, eight) : _mm512_shuffle_epi8(values, hi));
    }
}

/* The 16 row scales of block b (group 0's 8, then group 1's): fp16, or MXFP4's E8M0 bytes halved (pi_e8m0_half). */
static inline __attribute__((always_inline)) __m512 amx_row_scales(const char *b0, const char *b1, const int kind) {
    if (kind == PI_NIB_MXFP4)
        return _mm512_insertf32x8(_mm512_castps256_ps512(pi_e8m0_half_x8(pi_load_u64(b0))),
                                  pi_e8m0_half_x8(pi_load_u64(b1)), 1);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b0)),
                                                   _mm_loadu_si128((const __m128i *)b1), 1));
}

#ifndef AMX_KC
#define AMX_KC 32   /* blocks per K chunk: their B tiles (32 x 512 bytes) are unpacked once for all token tiles */
#endif

static inline __attribute__((always_inline)) void amx_nib_tiles(int64_t n, const void *group, const char *x,
                                                                int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                                const char *xtab, int64_t xt_stride, const int kind) {
    const int64_t nb = n / PI_QK4_0, gbytes = 8 * pi_nib_block_bytes(kind);
    const char *g0 = group, *g1 = g0 + nb * gbytes;   /* rows 0..7, rows 8..15 */
    const int64_t bsz = (int64_t)sizeof(pi_block_q8_0s), qoff = (int64_t)offsetof(pi_block_q8_0s, qs);
    _Alignas(64) int8_t bt[AMX_KC][8 * 64];     /* the chunk's B tiles */
    _Alignas(64) float dw[AMX_KC][16];         /* the chunk's row scales */
    _Alignas(64) int32_t ct[2][2][16 * 16];   /* two pairs' C slots */
    /* K in chunks of AMX_KC blocks, all token tiles per chunk; between chunks the accumulators wait in y
     * (a float stored and loaded is the same float: the block order per (row, token) is unchanged) */
    for (int64_t c0 = 0; c0 < nb; c0 += AMX_KC) {
        const int64_t kc = PI_MIN(AMX_KC, nb - c0);
        for (int64_t b = 0; b < kc; b++) {
            const char *b0 = g0 + (c0 + b) * gbytes, *b1 = g1 + (c0 + b) * gbytes;
            amx_unpack_b(b0, b1, bt[b], kind);
            _mm512_store_ps(dw[b], amx_row_scales(b0, b1, kind));
        }
        __asm__ volatile("" ::: "memory");   /* the tile loads below read bt */
        for (int t0 = 0; t0 < nt; t0 += 16) {
            const char *xt = x + t0 * x_stride + c0 * bsz;
            const float *dx = amx_q8_0s_scales(xtab + t0 / 16 * xt_stride) + 16 * c0;   /* block c0 + b: dx + 16 b */
            __m512 acc[16];
            for (int t = 0; t < 16; t++)
                acc[t] = c0 ? _mm512_loadu_ps(y + (t0 + t) * y_stride) : _mm512_setzero_ps();
            /* pairs of blocks (2p, 2p + 1), each pair's products issued one pair ahead of its epilogue (two C
             * slots), so the tile unit works while the vector unit does the epilogue before */
            const int64_t npairs = kc / 2;
            for (int64_t q = 0; q <= npairs; q++) {
                if (q < npairs) {
                    const int64_t b = 2 * q;
                    AMX_PRODUCT_PAIR(bt[b], xt + b * bsz + qoff, ct[q % 2][0], bt[b + 1], xt + (b + 1) * bsz + qoff,
                                     ct[q % 2][1]);
                }
                if (q > 0) {
                    const int64_t b = 2 * (q - 1);
                    amx_epilogue_q8_0s(ct[(q - 1) % 2][0], _mm512_load_ps(dw[b]), dx + 16 * b, acc);
                    amx_epilogue_q8_0s(ct[(q - 1) % 2][1], _mm512_load_ps(dw[b + 1]), dx + 16 * (b + 1), acc);
                }
            }
            if (kc % 2) {
                const int64_t b = kc - 1;
                AMX_PRODUCT(0, 2, 4, bt[b], ct[0][0], xt + b * bsz + qoff);
                amx_epilogue_q8_0s(ct[0][0], _mm512_load_ps(dw[b]), dx + 16 * b, acc);
            }
            for (int t = 0; t < 16; t++) _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
        }
        __asm__ volatile("" ::: "memory");   /* the next chunk's unpacking overwrites bt */
    }
}

void pi_tiles_q4_0x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                            int64_t y_stride, const char *xtab, int64_t xt_stride) {
    amx_nib_tiles(n, group, x, x_stride, nt, y, y_stride, xtab, xt_stride, PI_NIB_Q4_0);
}

void pi_tiles_iq4_nlx8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                              int64_t y_stride, const char *xtab, int64_t xt_stride) {
    amx_nib_tiles(n, group, x, x_stride, nt, y, y_stride, xtab, xt_stride, PI_NIB_IQ4_NL);
}

void pi_tiles_mxfp4x8_q8_0s(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride, const char *xtab, int64_t xt_stride) {
    amx_nib_tiles(n, group, x, x_stride, nt, y, y_stride, xtab, xt_stride, PI_NIB_MXFP4);
}

/* The tile session of a weight type's tile kernels (pi_cpu_kernels.tiles_begin/tiles_end): products of 32 bytes
 * (one Q4_0/Q5_0/Q8_0 block), 64 for the K-quants (a quarter super-block: amx_k.c). */
void pi_tiles_begin(int32_t type, pi_tile_session *s) {
    const bool k_quant = type == PI_TYPE_Q2_K || type == PI_TYPE_Q3_K || type == PI_TYPE_Q4_K || type == PI_TYPE_Q5_K ||
                         type == PI_TYPE_Q6_K || type == PI_TYPE_Q4_KX16 || type == PI_TYPE_Q5_KX16 ||
                         type == PI_TYPE_Q6_KX16 || type == PI_TYPE_IQ4_XS || type == PI_TYPE_IQ4_XSX16 ||
                         type == PI_TYPE_Q8_KW;
    amx_begin(k_quant ? 64 : 32, s);
}

void pi_tiles_end(const pi_tile_session *s) { amx_end(s); }
