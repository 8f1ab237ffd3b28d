/* amx_k.c: AMX tile kernels of the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, and of IQ4_XS and Q8_KW (the IQ2 and IQ1
 * rows of prompts) on Q6_K's (the amx level only; level.c includes
 * it where __AMX_INT8__ is set), and the tile tables of their activations Q8_KM and Q8_K. 16 rows at any addresses (the
 * file's layout), or one Q4_KX16 group (pi_tiles_q4_Kx16_q8_K) x nt tokens (a multiple of 16); bit-identical to
 * pi_vec_dot_q4_K_q8_K / _q5_K_ / _q6_K_ per (row, token).
 *
 * Canonical orders (vec_dot_k.c, rows8_k.c): per super-block exact integers, then one float step in order:
 *   Q4_K, Q5_K (Q8_KM activations): sumi = sum_j sc_j m_j sum_l q_l y_l, summ = sum_j mn_j m_j (bsum_2j +
 *   bsum_2j+1) over 8 sub-blocks of 32 (q unsigned 0..15 / 0..31), acc = acc + d_x * (d * sumi - dmin * summ)
 *   Q6_K (Q8_K activations): sumi = sum_j sc_j sum_l (u_l - 32) y_l over 16 sub-blocks of 16 (sc_j int8),
 *   acc = acc + (d_x * d) * sumi
 *
 * How the integer sums survive the tiles: the sub-block scales go into the operands, so that one run of tile
 * products covers a whole super-block: sumi = sum_l w_l v_l with w_l = sc_j q_l (Q4_K, Q5_K; Q6_K: sc_j (u_l - 32))
 * and v_l = m_j y_l (Q8_KM; Q8_K: y_l). Neither fits a byte, so each is split into its high byte (x >> 8) and its
 * low byte (unsigned 0..255): "planes". The tile products (k = 64 bytes, four per super-block and plane pair)
 * give exact int32 sums per plane pair, and an integer shift-add per token puts sumi together:
 *   Q6_K: w = 256 wh + wl, sumi = 256 Ch + Cl, Ch = sum wh y (TDPBSSD), Cl = sum wl y (TDPBSUD, B unsigned);
 *   Q4_K, Q5_K: also v = 256 vh + vl, sumi = 65536 Chh + 256 Cmid + Cll with Chh = sum vh wh, Cmid = sum vh wl +
 *   sum vl wh, Cll = sum vl wl (TDPBSUD, TDPBUUD).
 * Only the grouping of integer additions changes (two's complement sums: the result is sumi whenever sumi fits
 * int32, quants_k.h's budget; every product and shift here fits too). One product per sub-block (k = 32 or 16)
 * with an integer epilogue per sub-block, as these kernels did before, took 2-4 times as long: the tile stores and
 * the per-sub-block epilogue were the cost, not the multiplies (bench/README.md, 2026-12-04).
 *
 * Tiles per super-block b and k-step i (elements 64 i .. 64 i + 63 of the super-block), all 16 x 64 bytes:
 *   A  [16 tokens][64 bytes]     activation planes, from the tile table (contiguous tiles: read from the rows at
 *                                their stride, the tile loads took twice as long)
 *   B  [16][16 rows x 4 bytes]   weight planes ("VNNI" layout: B[e/4][4 r + e%4] = row r element 64 i + e),
 *                                built per K chunk
 *   C  [16 tokens][16 rows]      int32 plane sums
 * The B planes of a chunk of AMX_K_KC super-blocks are built once and serve every token tile of the call (up to
 * AMX_K_TG tokens per pass over K); between chunks the float accumulators wait in `accb` (a float stored and
 * loaded is the same float). */
#include "../quants_k.h"

#include "amx_util.h"

#include <stddef.h>

#ifndef AMX_K_KC
#define AMX_K_KC 2      /* super-blocks per K chunk: B planes of 16 KB (4: 32 KB, 0.87-0.93x the speed with the A
                           tiles, C slots and accumulators in L1 too; Sapphire Rapids, 542M Q4_K_M, T = 512) */
#endif
#ifndef AMX_K_TG
#define AMX_K_TG 128    /* tokens per pass over K (256: the same, 512: 0.75x, Q4_K_M pp512 on Sapphire Rapids) */
#endif

/* Byte k (< 4) of every 32-bit lane, zero-extended. */
static inline __m512i amx_lane_byte(__m512i v, int k) {
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * k), _mm512_set1_epi32(0xff));
}

/* The 64 bytes v (lane r = 4 elements of row r, s8) times the row scales scw (lane r: row r's scale in both int16
 * halves) -> the products' low bytes (lo, unsigned) and high bytes (hi, signed: product >> 8), in v's byte order.
 * Every product fits int16 (|v| <= 32, |scale| <= 128 or v <= 31, scale <= 63). */
static inline void amx_scale_split(__m512i v, __m512i scw, __m512i *lo, __m512i *hi) {
    const __m512i even = _mm512_mullo_epi16(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8), scw);   /* bytes 0, 2, ..: int16 */
    const __m512i odd = _mm512_mullo_epi16(_mm512_srai_epi16(v, 8), scw);                          /* bytes 1, 3, .. */
    const __m512i low = _mm512_set1_epi16(0x00ff);
    /* ternary logic 0xE4: c ? a : b per bit (c = the low-byte mask) */
    *lo = _mm512_ternarylogic_epi32(even, _mm512_slli_epi16(odd, 8), low, 0xE4);
    *hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(even, 8), odd, low, 0xE4);
}

/* A lane's int16 scale in both halves of the lane (sc: the scale in the low 16 bits). */
static inline __m512i amx_scale_words(__m512i sc) {
    return _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(sc, 16));
}

/* ---- Q8_K's and Q8_KM's tile tables (pi_tiles_prep_fn) ----
 * Per token tile and super-block b, its k-steps i (elements 64 i ..) of the 16 rows:
 *   Q8_K:  [4 steps][16 rows][64]                 the quants y, as they stand (the epilogue reads d from the rows:
 *          the rows' d in the table, 64 bytes more per super-block, made the Q6_K head 1.07x slower)
 *   Q8_KM: [4 steps][2 planes][16 rows][64]       v = m_j y (int16): plane 0 v >> 8 (s8), plane 1 its low byte,
 *          then the epilogue's record (amx_q8_Km_record): each activation row's d, bsum pairs and multiplier pairs
 * (unaligned stores: mul_mat's scratch is 64-byte aligned, but nothing here needs it) */
#define AMX_TILE_BYTES (16 * 64)

typedef struct {
    float d[16];              /* d of row r */
    int32_t s[4][16];         /* (S_2k, S_2k+1) of row r as two int16: the sums of sub-blocks' bsum pairs */
    int32_t m[4][16];         /* (m_2k, m_2k+1) of row r as two int16 */
} amx_q8_Km_record;
#define AMX_Q8_K_TABLE (4 * AMX_TILE_BYTES)
#define AMX_Q8_KM_TABLE (8 * AMX_TILE_BYTES + (int)sizeof(amx_q8_Km_record))
_Static_assert(sizeof(amx_q8_Km_record) % 64 == 0, "the Q8_KM table's units stay 64-byte aligned");

void pi_tiles_prep_q8_K(int64_t n, const void *row, int r, char *tile) {
    const pi_block_q8_K *x = row;
    for (int64_t b = 0; b < n / PI_QK_K; b++)
        for (int i = 0; i < 4; i++)
            _mm512_storeu_si512((__m512i *)(tile + b * AMX_Q8_K_TABLE + i * AMX_TILE_BYTES + 64 * r),
                                _mm512_loadu_si512(x[b].qs + 64 * i));
}

void pi_tiles_prep_q8_Km(int64_t n, const void *row, int r, char *tile) {
    const pi_block_q8_Km *x = row;
    for (int64_t b = 0; b < n / PI_QK_K; b++) {   /* the record */
        const pi_block_q8_Km *xb = &x[b];
        amx_q8_Km_record *rec = (amx_q8_Km_record *)(tile + b * AMX_Q8_KM_TABLE + 8 * AMX_TILE_BYTES);
        _Alignas(16) int32_t s[4];
        _mm_store_si128((__m128i *)s, _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)xb->k.bsums),
                                                      _mm_loadu_si128((const __m128i *)(xb->k.bsums + 8))));
        rec->d[r] = xb->k.d;
        for (int k = 0; k < 4; k++) {
            rec->s[k][r] = s[k];
            memcpy(&rec->m[k][r], &xb->m[2 * k], 4);
        }
    }
    for (int64_t g = 0; g < n / 64; g++) {
        const pi_block_q8_Km *xb = &x[g / 4];
        char *planes = tile + g / 4 * AMX_Q8_KM_TABLE + g % 4 * 2 * AMX_TILE_BYTES;
        const int i = (int)(g % 4);
        const __m512i y = _mm512_loadu_si512(xb->k.qs + 64 * i);
        /* sub-blocks 2i and 2i + 1: |m_j y| <= 32 * 127 */
        const __m512i v0 = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(y)), _mm512_set1_epi16(xb->m[2 * i]));
        const __m512i v1 = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(y, 1)),
                                              _mm512_set1_epi16(xb->m[2 * i + 1]));
        const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(v0, 8))),
                                              _mm512_cvtepi16_epi8(_mm512_srai_epi16(v1, 8)), 1);
        const __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(v0)), _mm512_cvtepi16_epi8(v1), 1);
        _mm512_storeu_si512((__m512i *)(planes + 64 * r), hi);
        _mm512_storeu_si512((__m512i *)(planes + AMX_TILE_BYTES + 64 * r), lo);
    }
}

/* ---- Q4_K and Q5_K (activations Q8_KM) ----
 * w_l = sc_j q_l <= 63 * 31: planes wh <= 7, wl; the activation planes come from Q8_KM's table, and so do summ's and
 * the float step's per-token values (its record: d, bsum pairs, multiplier pairs). */

typedef struct {
    _Alignas(64) int8_t wh[4][16 * 64];    /* k-step i: B plane of w >> 8 (sub-block 2i: rows 0..7, 2i + 1: 8..15) */
    _Alignas(64) uint8_t wl[4][16 * 64];   /* the low bytes */
    _Alignas(64) int32_t mp[4][16];        /* (mn_2i, mn_2i+1) per row as two int16 */
    _Alignas(64) float d[16], dmin[16];
} amx_q4_K_block;

/* Bytes off..off+15 (off >= 4) of the 16 rows' Q4_K / Q5_K blocks as four vectors of 32-bit lanes (lane r = row r):
 * transposed from the rows p, or loaded from a Q4_KX16 / Q5_KX16 group super-block gb, whose 64-byte words after d
 * and dmin are those lanes (the row block's word at byte off is the group's word (off - 4) / 4, quants_k.h). */
static inline __attribute__((always_inline)) void amx_k4_words(const char *const *p, const char *gb, const int interleaved,
                                                               size_t off, __m512i c[4]) {
    amx_rows_or_words(p, off, interleaved, interleaved ? gb + 64 + 64 * ((off - 4) / 4) : NULL, c);
}

/* Super-block b of the 16 rows p[] (p[r] = row r's block), or of a group (interleaved: gb, a Q4_KX16 or Q5_KX16
 * super-block) -> its planes and scales; five_bit: Q5_K (q = nibble | bit 2jj (low nibbles) or 2jj + 1 (high
 * nibbles) of qh[l] << 4). */
static inline __attribute__((always_inline)) void amx_q4_K_decode(const char *const *p, amx_q4_K_block *o, const int five_bit,
                                                                  const char *gb, const int interleaved) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m6 = _mm512_set1_epi8(0x3f), m2h = _mm512_set1_epi8(0x30);
    __m512i h[4];   /* bytes 0..15: d, dmin, the 12 packed scale bytes q[0..11] (pi_k4_scale_min) */
    if (interleaved) for (int w = 0; w < 3; w++) h[1 + w] = _mm512_loadu_si512(gb + 64 + 64 * w);   /* lanes as they stand */
    else amx_transpose16x16(p, 0, h);
    const __m512i sc03 = _mm512_and_si512(h[1], m6), mn03 = _mm512_and_si512(h[2], m6);
    const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(h[3], m4), _mm512_and_si512(_mm512_srli_epi32(h[1], 2), m2h));
    const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 4), m4),
                                         _mm512_and_si512(_mm512_srli_epi32(h[2], 2), m2h));
    for (int i = 0; i < 4; i++) {
        const __m512i v = i < 2 ? mn03 : mn47;
        const int k = (2 * i) % 4;
        _mm512_store_si512((__m512i *)o->mp[i], _mm512_or_si512(amx_lane_byte(v, k), _mm512_slli_epi32(amx_lane_byte(v, k + 1), 16)));
    }
    /* a group super-block starts with d[16] and dmin[16] as fp16 (both group types) */
    _mm512_store_ps(o->d, _mm512_cvtph_ps(interleaved ? _mm256_loadu_si256((const __m256i *)gb) : _mm512_cvtepi32_epi16(h[0])));
    _mm512_store_ps(o->dmin, _mm512_cvtph_ps(interleaved ? _mm256_loadu_si256((const __m256i *)(gb + 32))
                                                : _mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16))));
    const size_t qs_offset = five_bit ? offsetof(pi_block_q5_K, qs) : offsetof(pi_block_q4_K, qs);
    __m512i qh[8];   /* Q5_K: qh[0..31] transposed like the quants (the same bytes serve every pair jj) */
    if (five_bit) {
        amx_k4_words(p, gb, interleaved, offsetof(pi_block_q5_K, qh), qh);
        amx_k4_words(p, gb, interleaved, offsetof(pi_block_q5_K, qh) + 16, qh + 4);
    }
    for (int jj = 0; jj < 4; jj++) {   /* qs[32 jj ..]: low nibbles sub-block 2 jj, high nibbles 2 jj + 1 */
        __m512i c[8];
        amx_k4_words(p, gb, interleaved, qs_offset + 32 * jj, c);
        amx_k4_words(p, gb, interleaved, qs_offset + 32 * jj + 16, c + 4);
        const __m512i sc = jj < 2 ? sc03 : sc47;
        const __m512i sclo = amx_scale_words(amx_lane_byte(sc, (2 * jj) % 4));       /* sub-block 2 jj */
        const __m512i schi = amx_scale_words(amx_lane_byte(sc, (2 * jj) % 4 + 1));   /* sub-block 2 jj + 1 */
        for (int m = 0; m < 8; m++) {
            __m512i lo = _mm512_and_si512(c[m], m4), hi = _mm512_and_si512(_mm512_srli_epi16(c[m], 4), m4);
            if (five_bit) {   /* bit 2jj (2jj + 1) of each qh byte -> bit 4 (16-bit shifts < 8 keep it in its byte) */
                const __m512i one = _mm512_set1_epi8(1);
                lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh[m], 2 * jj), one), 4));
                hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh[m], 2 * jj + 1), one), 4));
            }
            __m512i wl, wh;
            amx_scale_split(lo, sclo, &wl, &wh);
            _mm512_store_si512((__m512i *)(o->wl[jj] + 64 * m), wl);
            _mm512_store_si512((__m512i *)(o->wh[jj] + 64 * m), wh);
            amx_scale_split(hi, schi, &wl, &wh);
            _mm512_store_si512((__m512i *)(o->wl[jj] + 64 * (8 + m)), wl);
            _mm512_store_si512((__m512i *)(o->wh[jj] + 64 * (8 + m)), wh);
        }
    }
}

/* Super-block o's plane products for one token tile (a: its Q8_KM table at the super-block) -> ct[0] = Chh,
 * ct[1] = Cmid, ct[2] = Cll. Tiles: C 0, 1, 6; A 2 (vh), 3 (vl); B 4 (wh), 5 (wl). */
static inline void amx_q4_K_products(const amx_q4_K_block *o, const char *a, int32_t ct[3][16 * 16]) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(6);
    for (int i = 0; i < 4; i++) {
        _tile_loadd(2, a + (2 * i) * AMX_TILE_BYTES, 64);
        _tile_loadd(4, o->wh[i], 64);
        _tile_loadd(3, a + (2 * i + 1) * AMX_TILE_BYTES, 64);
        _tile_loadd(5, o->wl[i], 64);
        _tile_dpbsud(0, 2, 4);
        _tile_dpbsud(1, 2, 5);
        _tile_dpbuud(1, 3, 4);
        _tile_dpbuud(6, 3, 5);
    }
    _tile_stored(0, ct[0], 64);
    _tile_stored(1, ct[1], 64);
    _tile_stored(6, ct[2], 64);
    __asm__ volatile("" ::: "memory");
}

/* 16 rows at any addresses (rows) or one Q4_KX16 / Q5_KX16 group (interleaved: group). */
static inline __attribute__((always_inline)) void amx_k4_rows(int64_t n, const void *const *rows,
                                                              const char *group, const int interleaved,
                                                              const char *x, int64_t x_stride, int nt, float *y,
                                                              int64_t y_stride, const char *xtab, int64_t xt_stride,
                                                              const int five_bit) {
    const int64_t block_bytes = five_bit ? (int64_t)sizeof(pi_block_q5_K) : (int64_t)sizeof(pi_block_q4_K);
    const int64_t group_block = five_bit ? (int64_t)sizeof(pi_block_q5_Kx16) : (int64_t)sizeof(pi_block_q4_Kx16);
    PI_UNUSED(x); PI_UNUSED(x_stride);   /* everything the kernel reads of the activations is in the tile table */
    const int64_t nb = n / PI_QK_K;
    const int64_t sb_table = AMX_Q8_KM_TABLE;   /* a super-block's part of a token tile's Q8_KM table */
    amx_q4_K_block blk[AMX_K_KC];
    _Alignas(64) float accb[AMX_K_TG][16];
    _Alignas(64) int32_t ct[2][3][16 * 16];   /* two super-blocks' (Chh, Cmid, Cll) */
    for (int g0 = 0; g0 < nt; g0 += AMX_K_TG) {
        const int ntiles = PI_MIN(AMX_K_TG, nt - g0) / 16;
        for (int64_t c0 = 0; c0 < nb; c0 += AMX_K_KC) {
            const int64_t kc = PI_MIN(AMX_K_KC, nb - c0);
            for (int64_t b = 0; b < kc; b++) {
                const char *p[16];
                if (!interleaved)
                    for (int r = 0; r < 16; r++) p[r] = (const char *)rows[r] + (c0 + b) * block_bytes;
                amx_q4_K_decode(p, &blk[b], five_bit, interleaved ? group + (c0 + b) * group_block : NULL, interleaved);
            }
            __asm__ volatile("" ::: "memory");   /* the tile loads below read blk */
            for (int tt = 0; tt < ntiles; tt++) {
                const char *at = xtab + (g0 / 16 + tt) * xt_stride + c0 * sb_table;
                /* each super-block's products are issued one super-block ahead of its epilogue (two C slots) */
                amx_q4_K_products(&blk[0], at, ct[0]);
                for (int64_t b = 0; b < kc; b++) {
                    if (b + 1 < kc) amx_q4_K_products(&blk[b + 1], at + (b + 1) * sb_table, ct[(b + 1) % 2]);
                    const int32_t (*c)[16 * 16] = ct[b % 2];
                    const amx_q4_K_block *o = &blk[b];
                    const amx_q8_Km_record *rec = (const amx_q8_Km_record *)(at + b * sb_table + 8 * AMX_TILE_BYTES);
                    const __m512 d = _mm512_load_ps(o->d), dmin = _mm512_load_ps(o->dmin);
                    for (int t = 0; t < 16; t++) {
                        const __m512i sumi = _mm512_add_epi32(
                            _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512((const __m512i *)(c[0] + 16 * t)), 16),
                                             _mm512_slli_epi32(_mm512_load_si512((const __m512i *)(c[1] + 16 * t)), 8)),
                            _mm512_load_si512((const __m512i *)(c[2] + 16 * t)));
                        /* summ = sum_k (mn_2k m_2k, mn_2k+1 m_2k+1) . (S_2k, S_2k+1), S the sub-blocks' bsum pairs */
                        __m512i summ = _mm512_setzero_si512();
                        for (int k = 0; k < 4; k++) {   /* mn_j m_j < 2^11 */
                            const __m512i mm = _mm512_mullo_epi16(_mm512_load_si512((const __m512i *)o->mp[k]),
                                                                  _mm512_set1_epi32(rec->m[k][t]));
                            summ = _mm512_dpwssd_epi32(summ, mm, _mm512_set1_epi32(rec->s[k][t]));
                        }
                        const float dx = rec->d[t];
                        const __m512 v = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi)),
                                                       _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summ)));
                        float *acc = accb[16 * tt + t];
                        /* 0 + v first, as the scalar loop's first step (-0 becomes +0) */
                        _mm512_store_ps(acc, _mm512_add_ps(c0 || b ? _mm512_load_ps(acc) : _mm512_setzero_ps(),
                                                           _mm512_mul_ps(_mm512_set1_ps(dx), v)));
                    }
                }
            }
            __asm__ volatile("" ::: "memory");   /* the next chunk's decoding overwrites blk */
        }
        for (int t = 0; t < 16 * ntiles; t++) _mm512_storeu_ps(y + (g0 + t) * y_stride, _mm512_load_ps(accb[t]));
    }
}

void pi_tiles_rows_q4_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_k4_rows(n, rows, NULL, 0, x, x_stride, nt, y, y_stride, xt, xt_stride, 0);
}

void pi_tiles_rows_q5_K_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                             int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_k4_rows(n, rows, NULL, 0, x, x_stride, nt, y, y_stride, xt, xt_stride, 1);
}

void pi_tiles_q4_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_k4_rows(n, NULL, group, 1, x, x_stride, nt, y, y_stride, xt, xt_stride, 0);
}

void pi_tiles_q5_Kx16_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                           int64_t y_stride, const char *xt, int64_t xt_stride) {
    amx_k4_rows(n, NULL, group, 1, x, x_stride, nt, y, y_stride, xt, xt_stride, 1);
}

/* ---- Q6_K (activations Q8_K) ----
 * w_l = sc_j (u_l - 32), |w| <= 128 * 32: planes wh (-16..16) and wl; the activations from Q8_K's table as they
 * stand; the float step reads d_x from the Q8_K rows. Q3_K and Q2_K (below) share the kernel (amx_q8_K_rows: the
 * types with Q8_K activations) with one plane each. */

/* One super-block of 16 rows of a type with Q8_K activations, decoded for the tiles. */
typedef struct {
    _Alignas(64) int8_t wh[16][4 * 64];    /* w >> 8, sub-block j's B tile rows at [j]: k-step i = [4i .. 4i + 3] */
    _Alignas(64) uint8_t wl[16][4 * 64];   /* the low bytes, the same layout */
    _Alignas(64) float d[16];
    _Alignas(64) float dmin[16];           /* Q2_K */
    _Alignas(64) int32_t mpair[8][16];     /* Q2_K: lane r of [k] = row r's mins m_2k, m_2k+1 as two int16 */
} amx_q8_K_block;   /* Q3_K and Q2_K: one plane, in wh */

/* Bytes off..off+15 of the 16 rows' Q6_K blocks as four vectors of 32-bit lanes (lane r = row r): transposed from
 * the rows p, or loaded from the Q6_KX16 group gb, whose words are those lanes (quants_k.h). */
static inline __attribute__((always_inline)) void amx_q6_K_words(const char *const *p, const pi_block_q6_Kx16 *gb,
                                                                  const int interleaved, size_t off, __m512i c[4]) {
    amx_rows_or_words(p, off, interleaved, interleaved ? (const char *)gb->words[off / 4] : NULL, c);
}

/* Super-block b of the 16 rows p[] (p[r] = row r's block), or of the Q6_KX16 group gb (interleaved; p unused) -> its
 * planes. */
static inline __attribute__((always_inline)) void amx_q6_K_decode(const char *const *p, const pi_block_q6_Kx16 *gb,
                                                                  const int interleaved, amx_q8_K_block *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2h = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    __m512i s[4], scw[16];
    amx_q6_K_words(p, gb, interleaved, offsetof(pi_block_q6_K, scales), s);
    for (int j = 0; j < 16; j++)   /* byte j % 4 of s[j / 4], sign-extended */
        scw[j] = amx_scale_words(_mm512_srai_epi32(_mm512_slli_epi32(s[j / 4], 24 - 8 * (j % 4)), 24));
    _mm512_store_ps(o->d, interleaved ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb->d))
                                      : amx_f16x16_rows(p, offsetof(pi_block_q6_K, d)));
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            /* ql[64h + l] (a) and ql[64h + 32 + l] (bq), qh[32h + l] (hb) for l = 16 half ..: quarter q of the
             * 128 elements 128h.. takes nibble q / 2 of a (q even) or bq (q odd) and bits 2q, 2q+1 of qh; its
             * elements 128h + 32q + l are sub-block 8h + 2q + half */
            __m512i a[4], bq[4], hb[4];
            amx_q6_K_words(p, gb, interleaved, offsetof(pi_block_q6_K, ql) + 64 * h + 16 * half, a);
            amx_q6_K_words(p, gb, interleaved, offsetof(pi_block_q6_K, ql) + 64 * h + 32 + 16 * half, bq);
            amx_q6_K_words(p, gb, interleaved, offsetof(pi_block_q6_K, qh) + 32 * h + 16 * half, hb);
            for (int q = 0; q < 4; q++)
                for (int m = 0; m < 4; m++) {
                    const __m512i lo = q & 1 ? bq[m] : a[m];
                    const __m512i nib = _mm512_and_si512(q < 2 ? lo : _mm512_srli_epi16(lo, 4), m4);
                    const __m512i hi2 = q == 0 ? _mm512_slli_epi16(hb[m], 4)
                                      : q == 1 ? _mm512_slli_epi16(hb[m], 2)
                                      : q == 2 ? hb[m] : _mm512_srli_epi16(hb[m], 2);
                    const __m512i u = _mm512_or_si512(nib, _mm512_and_si512(hi2, m2h));
                    const int j = 8 * h + 2 * q + half;
                    __m512i wl, wh;
                    amx_scale_split(_mm512_sub_epi8(u, k32), scw[j], &wl, &wh);
                    _mm512_store_si512((__m512i *)(o->wl[j] + 64 * m), wl);
                    _mm512_store_si512((__m512i *)(o->wh[j] + 64 * m), wh);
                }
        }
}

/* ---- Q3_K (activations Q8_K) through Q6_K's kernel ----
 * sumi = sum_j sc_j sum_l q_l y_l over 16 sub-blocks of 16, q_l = u_l - 4 (u: 2 low bits + 4 x the hmask bit), sc_j
 * 6-bit signed (-32..31): w_l = sc_j q_l lies in -124..128, so its negation -w_l (-128..124) is one s8 plane, stored
 * where Q6_K keeps wh: C = sum (-w) y (TDPBSSD, one product per k-step), sumi = -C. The float step is Q6_K's. */

/* Super-block b of the 16 rows p[] (p[r] = row r's Q3_K block) -> its plane -w in o->wh (o->wl unused) and d. */
static inline __attribute__((always_inline)) void amx_q3_K_decode(const char *const *p, amx_q8_K_block *o) {
    const __m512i m3 = _mm512_set1_epi32(0x03030303), one = _mm512_set1_epi32(0x01010101), k4 = _mm512_set1_epi8(4);
    /* bytes 94..109 of each row: qs[62..63], scales[0..11] (byte 2 + i of the 16), d: lane r of sw[w] = bytes 4w.. */
    __m512i sw[4], scw[16];
    amx_transpose16x16(p, offsetof(pi_block_q3_K, scales) - 2, sw);
    for (int j = 0; j < 16; j++) {   /* pi_k3_scale per lane, negated (the plane holds -sc q) */
        const int lo_byte = 2 + (j < 8 ? j : j - 8), hi_byte = 2 + 8 + j % 4;
        const __m512i lb = amx_lane_byte(sw[lo_byte / 4], lo_byte % 4);
        const __m512i hb = amx_lane_byte(sw[hi_byte / 4], hi_byte % 4);
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(lb, j < 8 ? 0 : 4), _mm512_set1_epi32(0x0f));
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(hb, 2 * (j / 4)), _mm512_set1_epi32(3));
        const __m512i sc = _mm512_sub_epi32(_mm512_set1_epi32(32), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)));
        scw[j] = amx_scale_words(sc);
    }
    _mm512_store_ps(o->d, amx_f16x16_rows(p, offsetof(pi_block_q3_K, d)));
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            /* qs[32h + l] holds elements 128h + 32g + l in bits 2g, 2g + 1; hmask[l] their high bits at bit 4h + g;
             * l = 16 half + 4m + k: sub-block 8h + 2g + half, B row m of its tile */
            __m512i qw[4], hw[4];
            amx_transpose16x16(p, offsetof(pi_block_q3_K, qs) + 32 * h + 16 * half, qw);
            amx_transpose16x16(p, offsetof(pi_block_q3_K, hmask) + 16 * half, hw);
            for (int g = 0; g < 4; g++)
                for (int m = 0; m < 4; m++) {
                    const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(qw[m], 2 * g), m3);
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(hw[m], 4 * h + g), one);
                    const __m512i q = _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 2)), k4);
                    const int j = 8 * h + 2 * g + half;
                    __m512i wl, wh;   /* -sc q fits a byte: its low byte, as s8, is the value */
                    amx_scale_split(q, scw[j], &wl, &wh);
                    _mm512_store_si512((__m512i *)(o->wh[j] + 64 * m), wl);
                }
        }
}

/* ---- Q2_K (activations Q8_K) through the same kernel ----
 * sumi = sum_j sc_j sum_l q_l y_l, summ = sum_j m_j bsum_j over 16 sub-blocks of 16 (sc_j, m_j 0..15, q 0..3): w_l =
 * sc_j q_l (0..45) is one s8 plane, C = sumi; summ per token from the activation row's bsums (VNNI word pairs); the
 * float step acc + d_x (d sumi - dmin summ), the K-quants' with mins. */

/* Super-block b of the 16 rows p[] (Q2_K blocks) -> its plane w in o->wh, d, dmin and the mins' word pairs. */
static inline __attribute__((always_inline)) void amx_q2_K_decode(const char *const *p, amx_q8_K_block *o) {
    const __m512i m3 = _mm512_set1_epi32(0x03030303), m4 = _mm512_set1_epi32(0x0f);
    __m512i sw[4], scw[16];   /* scales[0..15] of each row: byte j of the 16 = scale j (low nibble) | min j (high) */
    amx_transpose16x16(p, offsetof(pi_block_q2_K, scales), sw);
    for (int j = 0; j < 16; j++) scw[j] = amx_scale_words(_mm512_and_si512(amx_lane_byte(sw[j / 4], j % 4), m4));
    for (int k = 0; k < 8; k++) {
        const __m512i ma = _mm512_srli_epi32(amx_lane_byte(sw[2 * k / 4], 2 * k % 4), 4);
        const __m512i mb = _mm512_srli_epi32(amx_lane_byte(sw[(2 * k + 1) / 4], (2 * k + 1) % 4), 4);
        _mm512_store_si512((__m512i *)o->mpair[k], _mm512_or_si512(ma, _mm512_slli_epi32(mb, 16)));
    }
    _mm512_store_ps(o->d, amx_f16x16_rows(p, offsetof(pi_block_q2_K, d)));
    _mm512_store_ps(o->dmin, amx_f16x16_rows(p, offsetof(pi_block_q2_K, dmin)));
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            /* qs[32h + l] holds elements 128h + 32g + l in bits 2g, 2g + 1 (l = 16 half + 4m + k: sub-block
             * 8h + 2g + half, B row m of its tile) */
            __m512i qw[4];
            amx_transpose16x16(p, offsetof(pi_block_q2_K, qs) + 32 * h + 16 * half, qw);
            for (int g = 0; g < 4; g++)
                for (int m = 0; m < 4; m++) {
                    const __m512i q = _mm512_and_si512(_mm512_srli_epi32(qw[m], 2 * g), m3);
                    __m512i wl, wh;   /* sc q fits a byte: its low byte is the value */
                    amx_scale_split(q, scw[8 * h + 2 * g + half], &wl, &wh);
                    _mm512_store_si512((__m512i *)(o->wh[8 * h + 2 * g + half] + 64 * m), wl);
                }
        }
}

/* ---- IQ4_XS (activations Q8_K) through Q6_K's kernel ----
 * w_l = (ls_j - 32) v_l, v_l the grid value (PI_IQ4_VALUES) of element l's nibble, |w| <= 32 * 127: Q6_K's two planes.
 * Sub-block j (32 elements, qs[16 j ..]) is the kernel's 16-element units 2j (low nibbles) and 2j + 1 (high nibbles);
 * the float step is Q6_K's, (d_x d) sumi: IQ4_XS's canonical order (kx16.c). The IQ4_XSX16 group keeps Q4_KX16's
 * header and word layout (d[16], scales_h[16], then word (off - 4) / 4 of the rows' blocks), so amx_k4_words reads
 * both. */
static inline __attribute__((always_inline)) void amx_iq4_xs_decode(const char *const *p, const char *gb,
                                                                    const int interleaved, amx_q8_K_block *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
    const __m512i grid = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)PI_IQ4_VALUES));
    __m512i sl, sh;   /* lane r: row r's scales_l (4 bytes: nibble j = bits 4j..), scales_h (bits 2j, 2j + 1) */
    if (interleaved) {
        sl = _mm512_loadu_si512(gb + 64);
        sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        _mm512_store_ps(o->d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb)));
    } else {
        _Alignas(64) uint32_t l[16], h[16];
        for (int r = 0; r < 16; r++) {
            const pi_block_iq4_xs *b = (const pi_block_iq4_xs *)p[r];
            memcpy(&l[r], b->scales_l, 4);
            h[r] = b->scales_h;
        }
        sl = _mm512_load_si512((const __m512i *)l);
        sh = _mm512_load_si512((const __m512i *)h);
        _mm512_store_ps(o->d, amx_f16x16_rows(p, offsetof(pi_block_iq4_xs, d)));
    }
    for (int j = 0; j < PI_QK_K / PI_QK; j++) {
        const __m512i ls = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sl, 4 * j), m15),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * j), m3), 4));
        const __m512i scw = amx_scale_words(_mm512_sub_epi32(ls, _mm512_set1_epi32(32)));
        __m512i c[4];
        amx_k4_words(p, gb, interleaved, offsetof(pi_block_iq4_xs, qs) + 16 * j, c);
        for (int m = 0; m < 4; m++)
            for (int half = 0; half < 2; half++) {   /* low nibbles: unit 2j, high: 2j + 1 */
                const __m512i q = _mm512_and_si512(half ? _mm512_srli_epi16(c[m], 4) : c[m], m4);
                __m512i wl, wh;
                amx_scale_split(_mm512_shuffle_epi8(grid, q), scw, &wl, &wh);
                _mm512_store_si512((__m512i *)(o->wl[2 * j + half] + 64 * m), wl);
                _mm512_store_si512((__m512i *)(o->wh[2 * j + half] + 64 * m), wh);
            }
    }
}

/* ---- Q8_KW (IQ2 and IQ1 rows converted for prompts, activations Q8_K) through Q6_K's kernel ----
 * w_l = sc_j (u_l - 64) (|u - 64| <= 64, sc_j <= 31): Q6_K's two planes; the float step (d_x d) sumi with the row's d a
 * float: pi_vec_dot_q8_kw_q8_K's order. */
static inline __attribute__((always_inline)) void amx_q8_kw_decode(const char *const *p, amx_q8_K_block *o) {
    const __m512i k64 = _mm512_set1_epi8(64);
    __m512i s[4];
    amx_transpose16x16(p, offsetof(pi_block_q8_kw, scales), s);
    _Alignas(64) float d[16];
    for (int r = 0; r < 16; r++) memcpy(&d[r], p[r] + offsetof(pi_block_q8_kw, d), sizeof(float));
    _mm512_store_ps(o->d, _mm512_load_ps(d));
    for (int j = 0; j < PI_QK_K / 16; j++) {   /* unit j: u[16 j ..], its scale byte j % 4 of s[j / 4], sign-extended */
        const __m512i scw = amx_scale_words(_mm512_srai_epi32(_mm512_slli_epi32(s[j / 4], 24 - 8 * (j % 4)), 24));
        __m512i c[4];
        amx_transpose16x16(p, offsetof(pi_block_q8_kw, u) + 16 * j, c);
        for (int m = 0; m < 4; m++) {
            __m512i wl, wh;
            amx_scale_split(_mm512_sub_epi8(c[m], k64), scw, &wl, &wh);
            _mm512_store_si512((__m512i *)(o->wl[j] + 64 * m), wl);
            _mm512_store_si512((__m512i *)(o->wh[j] + 64 * m), wh);
        }
    }
}

/* Super-block o's products for one token tile (a: its Q8_K table at the super-block) -> ct[0] = the plane's sum
 * (Q3_K: -sumi, Q2_K: sumi). */
static inline void amx_q3_K_products(const amx_q8_K_block *o, const char *a, int32_t ct[2][16 * 16]) {
    _tile_zero(0);
    for (int i = 0; i < 4; i += 2) {
        _tile_loadd(2, a + i * AMX_TILE_BYTES, 64);
        _tile_loadd(4, o->wh[4 * i], 64);
        _tile_loadd(3, a + (i + 1) * AMX_TILE_BYTES, 64);
        _tile_loadd(6, o->wh[4 * (i + 1)], 64);
        _tile_dpbssd(0, 2, 4);
        _tile_dpbssd(0, 3, 6);
    }
    _tile_stored(0, ct[0], 64);
    __asm__ volatile("" ::: "memory");
}

/* Super-block o's plane products for one token tile (a: its Q8_K table at the super-block) -> ct[0] = Ch, ct[1] = Cl.
 * Tiles: C 0, 1; A 2 (steps 0, 2), 3 (steps 1, 3); B 4, 5 and 6, 7 the same way. */
static inline void amx_q6_K_products(const amx_q8_K_block *o, const char *a, int32_t ct[2][16 * 16]) {
    _tile_zero(0);
    _tile_zero(1);
    for (int i = 0; i < 4; i += 2) {
        _tile_loadd(2, a + i * AMX_TILE_BYTES, 64);
        _tile_loadd(4, o->wh[4 * i], 64);
        _tile_loadd(5, o->wl[4 * i], 64);
        _tile_loadd(3, a + (i + 1) * AMX_TILE_BYTES, 64);
        _tile_loadd(6, o->wh[4 * (i + 1)], 64);
        _tile_loadd(7, o->wl[4 * (i + 1)], 64);
        _tile_dpbssd(0, 2, 4);
        _tile_dpbsud(1, 2, 5);
        _tile_dpbssd(0, 3, 6);
        _tile_dpbsud(1, 3, 7);
    }
    _tile_stored(0, ct[0], 64);
    _tile_stored(1, ct[1], 64);
    __asm__ volatile("" ::: "memory");
}

/* What amx_q8_K_rows reads: Q6_K rows or groups, Q3_K rows, Q2_K rows (the K-quants with Q8_K activations), IQ4_XS rows or
 * IQ4_XSX16 groups, Q8_KW rows (IQ2 and IQ1 rows converted for prompts) */
enum { AMX_KQ6, AMX_KQ3, AMX_KQ2, AMX_KIQ4_XS, AMX_KW };

/* 16 rows at any addresses (rows) or one Q6_KX16 group (interleaved: group); kind (a constant): the rows' type. */
static inline __attribute__((always_inline)) void amx_q8_K_rows(int64_t n, const void *const *rows,
                                                                const char *group, const int interleaved,
                                                                const char *x,
                                                                int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                                const char *xtab, int64_t xt_stride, const int kind) {
    const int64_t row_block = kind == AMX_KQ3 ? (int64_t)sizeof(pi_block_q3_K)
                            : kind == AMX_KQ2 ? (int64_t)sizeof(pi_block_q2_K)
                            : kind == AMX_KIQ4_XS ? (int64_t)sizeof(pi_block_iq4_xs)
                            : kind == AMX_KW ? (int64_t)sizeof(pi_block_q8_kw) : (int64_t)sizeof(pi_block_q6_K);
    const int64_t group_block = 16 * row_block;   /* a group's super-block: Q6_KX16, IQ4_XSX16 */
    const int one_plane = kind == AMX_KQ3 || kind == AMX_KQ2;
    const int64_t nb = n / PI_QK_K, bsz = (int64_t)sizeof(pi_block_q8_K);
    const int64_t sb_table = AMX_Q8_K_TABLE;   /* a super-block's part of a token tile's Q8_K table */
    amx_q8_K_block blk[AMX_K_KC];
    _Alignas(64) float accb[AMX_K_TG][16];
    _Alignas(64) int32_t ct[2][2][16 * 16];   /* two super-blocks' (Ch, Cl) */
    for (int g0 = 0; g0 < nt; g0 += AMX_K_TG) {
        const int ntiles = PI_MIN(AMX_K_TG, nt - g0) / 16;
        for (int64_t c0 = 0; c0 < nb; c0 += AMX_K_KC) {
            const int64_t kc = PI_MIN(AMX_K_KC, nb - c0);
            for (int64_t b = 0; b < kc; b++) {
                const char *p[16];
                if (!interleaved)
                    for (int r = 0; r < 16; r++) p[r] = (const char *)rows[r] + (c0 + b) * row_block;
                if (kind == AMX_KQ3) amx_q3_K_decode(p, &blk[b]);
                else if (kind == AMX_KQ2) amx_q2_K_decode(p, &blk[b]);
                else if (kind == AMX_KIQ4_XS)
                    amx_iq4_xs_decode(p, interleaved ? group + (c0 + b) * group_block : NULL, interleaved, &blk[b]);
                else if (kind == AMX_KW) amx_q8_kw_decode(p, &blk[b]);
                else amx_q6_K_decode(p, interleaved ? (const pi_block_q6_Kx16 *)(group + (c0 + b) * group_block) : NULL,
                                     interleaved, &blk[b]);
            }
            __asm__ volatile("" ::: "memory");   /* the tile loads below read blk */
            for (int tt = 0; tt < ntiles; tt++) {
                const char *xt = x + (g0 + 16 * tt) * x_stride + c0 * bsz;
                const char *at = xtab + (g0 / 16 + tt) * xt_stride + c0 * sb_table;
                /* each super-block's products are issued one super-block ahead of its epilogue (two C slots) */
                if (one_plane) amx_q3_K_products(&blk[0], at, ct[0]);
                else amx_q6_K_products(&blk[0], at, ct[0]);
                for (int64_t b = 0; b < kc; b++) {
                    if (b + 1 < kc) {
                        if (one_plane) amx_q3_K_products(&blk[b + 1], at + (b + 1) * sb_table, ct[(b + 1) % 2]);
                        else amx_q6_K_products(&blk[b + 1], at + (b + 1) * sb_table, ct[(b + 1) % 2]);
                    }
                    const int32_t (*c)[16 * 16] = ct[b % 2];
                    const __m512 d = _mm512_load_ps(blk[b].d);
                    for (int t = 0; t < 16; t++) {
                        const char *xb = xt + t * x_stride + b * bsz;
                        float dx;
                        memcpy(&dx, xb, sizeof dx);
                        const __m512i ch = _mm512_load_si512((const __m512i *)(c[0] + 16 * t));
                        const __m512i sumi = kind == AMX_KQ3 ? _mm512_sub_epi32(_mm512_setzero_si512(), ch)
                                           : kind == AMX_KQ2 ? ch
                                           : _mm512_add_epi32(_mm512_slli_epi32(ch, 8),
                                                              _mm512_load_si512((const __m512i *)(c[1] + 16 * t)));
                        float *acc = accb[16 * tt + t];
                        __m512 v;
                        if (kind == AMX_KQ2) {   /* summ = sum_j m_j bsum_j, the bsums in word pairs */
                            const char *bsums = xb + offsetof(pi_block_q8_K, bsums);
                            __m512i summ = _mm512_setzero_si512();
                            for (int k = 0; k < 8; k++)
                                summ = _mm512_dpwssd_epi32(summ, _mm512_load_si512((const __m512i *)blk[b].mpair[k]),
                                                           _mm512_set1_epi32(pi_load_i32(bsums + 4 * k)));
                            const __m512 dmin = _mm512_load_ps(blk[b].dmin);
                            v = _mm512_mul_ps(_mm512_set1_ps(dx),
                                              _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi)),
                                                            _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summ))));
                        } else {
                            v = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(dx), d), _mm512_cvtepi32_ps(sumi));
                        }
                        /* 0 + v first, as the scalar loop's first step (-0 becomes +0) */
                        _mm512_store_ps(acc, _mm512_add_ps(c0 || b ? _mm512_load_ps(acc) : _mm512_setzero_ps(), v));
                    }
                }
            }
            __asm__ volatile("" ::: "memory");   /* the next chunk's decoding overwrites blk */
        }
        for (int t = 0; t < 16 * ntiles; t++) _mm512_storeu_ps(y + (g0 + t) * y_stride, _mm512_load_ps(accb[t]));
    }
}

/* The table's entry points over amx_q8_K_rows: rows of `name` (kind), or groups of `name` (kind) */
#define AMX_Q8_K_ROWS(name, kind)                                                                                  \
    void pi_tiles_rows_##name##_q8_K(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,  \
                                     float *y, int64_t y_stride, const char *xt, int64_t xt_stride) {              \
        amx_q8_K_rows(n, rows, NULL, 0, x, x_stride, nt, y, y_stride, xt, xt_stride, kind);                         \
    }
#define AMX_Q8_K_GROUP(name, kind)                                                                                 \
    void pi_tiles_##name##_q8_K(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,    \
                                int64_t y_stride, const char *xt, int64_t xt_stride) {                             \
        amx_q8_K_rows(n, NULL, group, 1, x, x_stride, nt, y, y_stride, xt, xt_stride, kind);                        \
    }
AMX_Q8_K_ROWS(q6_K, AMX_KQ6)
AMX_Q8_K_GROUP(q6_Kx16, AMX_KQ6)
AMX_Q8_K_ROWS(iq4_xs, AMX_KIQ4_XS)
AMX_Q8_K_GROUP(iq4_xsx16, AMX_KIQ4_XS)
AMX_Q8_K_ROWS(q8_kw, AMX_KW)
AMX_Q8_K_ROWS(q3_K, AMX_KQ3)
AMX_Q8_K_ROWS(q2_K, AMX_KQ2)
