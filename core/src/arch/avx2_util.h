/* avx2_util.h: small AVX2 helpers shared by the kernels of arch/ (include after immintrin.h). */
#ifndef PI_AVX2_UTIL_H
#define PI_AVX2_UTIL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* Software prefetch for the one-token kernels that read their weights as one sequential stream (the interleaved
 * copies), where pi_cpu_software_prefetch says it pays (Intel, Zen 5): the line PI_STREAM_AHEAD bytes past p into L2, one
 * call per 64 bytes read (past the end of the weights: harmless, a prefetch never faults). On a Sapphire Rapids one
 * core's hardware prefetchers keep too few lines in flight for its share of the memory bandwidth: the 542M f16
 * file decoded 26.8 -> 31.8 t/s with it at 8 KB (4 KB: 30.6, 16 KB: 31.3; into L1 instead of L2: 1.03x, not 1.24x,
 * on its matmuls). */
#ifndef PI_STREAM_AHEAD
#define PI_STREAM_AHEAD 8192
#endif
static inline void pi_prefetch_ahead(const void *p) {   /* locality 2: prefetcht1 (_mm_prefetch here: dropped by GCC 12) */
    __builtin_prefetch((const char *)p + PI_STREAM_AHEAD, 0, 2);
}

/* 4 bytes at p as an int32 (unaligned; compiles to a plain load or a broadcast from memory). */
static inline int32_t pi_load_i32(const void *p) {
    int32_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

/* 8 bytes at p as a uint64 (unaligned). */
static inline uint64_t pi_load_u64(const void *p) {
    uint64_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

/* sum over g < n of maddubs(w[g], the 4 activation bytes y[4g..4g+3] in every lane), in int16:
 * the caller bounds n so that no lane overflows (8 for 4-bit unsigned weights). */
static inline __m256i pi_maddubs_sum(const __m256i *w, const int8_t *y, int n) {
    __m256i s = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(pi_load_i32(y)));
    for (int g = 1; g < n; g++)
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(pi_load_i32(y + 4 * g))));
    return s;
}

/* acc + the exact int32 dot products of 32 unsigned bytes u with 32 signed bytes y, lane j summing bytes 4j..4j+3:
 * one VNNI instruction where the level has it, maddubs + madd otherwise (exact while no maddubs pair
 * exceeds int16: the callers' operands are bounded so). */
static inline __m256i pi_dpbusd(__m256i acc, __m256i u, __m256i y) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, y);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1)));
#endif
}

/* The same for signed weights w[g] (int8, -128 included) by the sign trick: aw[g] = |w[g]| (sign_epi8(w, w), read as
 * unsigned) against sign(y, w), each group widened at once (a maddubs pair can reach 2 * 128 * 127). */
static inline __m256i pi_dot_i8_bcast(const __m256i *w, const __m256i *aw, const int8_t *y, int n) {
    __m256i s = _mm256_setzero_si256();
    for (int g = 0; g < n; g++)
        s = pi_dpbusd(s, aw[g], _mm256_sign_epi8(_mm256_set1_epi32(pi_load_i32(y + 4 * g)), w[g]));
    return s;
}

/* sum over g < n of the dot products of w[g]'s unsigned bytes with the 4 activation bytes y[4g..4g+3] (in
 * every lane), as int32 lanes, exact: VNNI accumulates in int32 (two chains, for latency), AVX2 adds the
 * maddubs results in int16 (the caller bounds n as for pi_maddubs_sum) and widens once. */
static inline __m256i pi_dot_u8_bcast(const __m256i *w, const int8_t *y, int n) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int g = 0; g + 1 < n; g += 2) {
        s0 = _mm256_dpbusd_epi32(s0, w[g], _mm256_set1_epi32(pi_load_i32(y + 4 * g)));
        s1 = _mm256_dpbusd_epi32(s1, w[g + 1], _mm256_set1_epi32(pi_load_i32(y + 4 * g + 4)));
    }
    if (n & 1) s0 = _mm256_dpbusd_epi32(s0, w[n - 1], _mm256_set1_epi32(pi_load_i32(y + 4 * (n - 1))));
    return _mm256_add_epi32(s0, s1);
#else
    return _mm256_madd_epi16(pi_maddubs_sum(w, y, n), _mm256_set1_epi16(1));
#endif
}

/* The 16 signed 6-bit scales of a Q3_K block (its 12 packed scale bytes s) as int8, in order: pi_k3_scale(j, s)
 * for every j at once, four per 32-bit word (low 4 bits from bytes 0..7, high 2 bits from bytes 8..11). */
static inline __m128i pi_k3_scales16(const uint8_t *s) {
    uint32_t a[3];
    __builtin_memcpy(a, s, 12);
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const __m128i u = _mm_set_epi32((int)((a[1] >> 4 & m4) | (a[2] >> 6 & m2) << 4),    /* scales 12..15 */
                                    (int)((a[0] >> 4 & m4) | (a[2] >> 4 & m2) << 4),    /* 8..11 */
                                    (int)((a[1] & m4) | (a[2] >> 2 & m2) << 4),         /* 4..7 */
                                    (int)((a[0] & m4) | (a[2] & m2) << 4));             /* 0..3 */
    return _mm_sub_epi8(u, _mm_set1_epi8(32));
}

/* Bits from..from+n-1 of every byte of v moved to bits to..to+n-1, the byte's other bits 0: one 16-bit shift keeps
 * them inside their byte (after it, a byte's bits to.. are its own bits from..; from + n, to + n <= 8); from, n and
 * to are constants after inlining. Two instructions where a compare against a bit takes three. */
static inline __m256i pi_bits_to(__m256i v, int from, int n, int to) {
    const __m256i moved = from == to ? v : from < to ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to);
    return _mm256_and_si256(moved, _mm256_set1_epi8((char)(((1 << n) - 1) << to)));
}
static inline __m256i pi_bit_to(__m256i v, int bit, int to) { return pi_bits_to(v, bit, 1, to); }

/* The sum of the 8 float lanes, in a fixed order (lanes i and i+4, then pairs, then the last two). */
static inline float pi_hsum_ps(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* The sum of the 8 int32 lanes (exact). */
static inline int32_t pi_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* [a.lo, b.lo] (hi = 0) or [a.hi, b.hi] (hi = 1): _mm256_permute2x128_si256(a, b, 0x20 / 0x31) as an insert (and an
 * extract), which a Zen 1 runs as 2-3 uops where vperm2i128 takes 8 (Zen 2 and later: one either way). */
static inline __m256i pi_halves(__m256i a, __m256i b, int hi) {
    return hi ? _mm256_inserti128_si256(b, _mm256_extracti128_si256(a, 1), 0)
              : _mm256_inserti128_si256(a, _mm256_castsi256_si128(b), 1);
}

/* v[r] holds 8 int32 partial sums of item r (a row, or a block) -> lane r = their total, exact.
 * One add tree for all eight: ~15 instructions instead of eight horizontal sums. */
static inline __m256i pi_hsum8_i32(const __m256i v[8]) {
    __m256i a[4];   /* per 128-bit half: [v2i lanes 0+2, v2i+1 lanes 0+2, v2i lanes 1+3, v2i+1 lanes 1+3] */
    for (int i = 0; i < 4; i++)
        a[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    /* per 128-bit half: that half's totals of items 0..3 (b0) and 4..7 (b1) */
    const __m256i b0 = _mm256_add_epi32(_mm256_unpacklo_epi64(a[0], a[1]), _mm256_unpackhi_epi64(a[0], a[1]));
    const __m256i b1 = _mm256_add_epi32(_mm256_unpacklo_epi64(a[2], a[3]), _mm256_unpackhi_epi64(a[2], a[3]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}

/* The 16-bit words at byte 0 of 8 records `stride` bytes apart (block scales, sums) -> one vector. */
static inline __m128i pi_i16x8_strided(const void *p, size_t stride) {
    const char *c = p;
    short h[8];
    for (int k = 0; k < 8; k++) __builtin_memcpy(&h[k], c + k * stride, 2);
    return _mm_loadu_si128((const __m128i *)h);
}
static inline __m256 pi_f16x8_strided(const void *p, size_t stride) { return _mm256_cvtph_ps(pi_i16x8_strided(p, stride)); }
/* The f32 values at byte 0 of 8 records `stride` bytes apart (activation blocks' steps) -> one vector. */
static inline __m256 pi_f32x8_strided(const void *p, size_t stride) {
    const char *c = p;
    float f[8];
    for (int k = 0; k < 8; k++) __builtin_memcpy(&f[k], c + k * stride, 4);
    return _mm256_loadu_ps(f);
}

/* Bytes off..off+15 of the 8 rows p[0..7] -> c[0..3]: 32-bit lane r of c[m] = bytes off+4m..off+4m+3
 * of row r. */
static inline void pi_transpose8x16(const char *const *p, size_t off, __m256i c[4]) {
#define ROWS(lo, hi) _mm256_loadu2_m128i((const __m128i *)(p[hi] + off), (const __m128i *)(p[lo] + off))
    const __m256i t0 = ROWS(0, 4), t1 = ROWS(1, 5), t2 = ROWS(2, 6), t3 = ROWS(3, 7);
#undef ROWS
    const __m256i u0 = _mm256_unpacklo_epi32(t0, t1), u1 = _mm256_unpackhi_epi32(t0, t1);
    const __m256i u2 = _mm256_unpacklo_epi32(t2, t3), u3 = _mm256_unpackhi_epi32(t2, t3);
    c[0] = _mm256_unpacklo_epi64(u0, u2);
    c[1] = _mm256_unpackhi_epi64(u0, u2);
    c[2] = _mm256_unpacklo_epi64(u1, u3);
    c[3] = _mm256_unpackhi_epi64(u1, u3);
}

/* The fp16 words at byte `off` of 8 rows p[0..7] (their block scales) as 8 floats. */
static inline __m256 pi_f16x8_rows(const char *const *p, size_t off) {
    short h[8];
    for (int k = 0; k < 8; k++) __builtin_memcpy(&h[k], p[k] + off, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* y[0..3] (elements 0..31 of a Q4_0 block) += scale * (q - 8) for the block's 16 nibble bytes qs
 * (byte j: element j in the low nibble, j + 16 in the high one), one fma per element as pi_axpy_q4_0
 * adds it. The bytes are zero-extended straight into 32-bit lanes, where one and / one shift split
 * the nibbles. */
static inline void pi_q4_0_axpy_block(__m256 scale, const uint8_t *qs, __m256 y[4]) {
    const __m256i m4 = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
    const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));        /* 0..7 | 16..23 */
    const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));  /* 8..15 | 24..31 */
    y[0] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v0, m4), eight)), y[0]);
    y[1] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v1, m4), eight)), y[1]);
    y[2] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v0, 4), eight)), y[2]);
    y[3] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v1, 4), eight)), y[3]);
}

/* y[0..3] (32 elements) += scale * the 32 quants of a Q8_0 block, one fma per element. */
static inline void pi_q8_0_axpy_block(__m256 scale, const int8_t *qs, __m256 y[4]) {
    for (int i = 0; i < 4; i++) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * i)));
        y[i] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(q), y[i]);
    }
}

#if defined(__AVX512F__)
/* The same 32 fmas with 512-bit registers: y[0] elements 0..15 (low nibbles), y[1] 16..31 (high nibbles);
 * q - 8 comes from a 16-entry table (vpermps reads an index's low 4 bits), the same exact values. */
static inline __m512 pi_q4_0_minus8_table(void) {
    return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}
static inline void pi_q4_0_axpy_block16(__m512 table, __m512 scale, const uint8_t *qs, __m512 y[2]) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    y[0] = _mm512_fmadd_ps(scale, _mm512_permutexvar_ps(v, table), y[0]);
    y[1] = _mm512_fmadd_ps(scale, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table), y[1]);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* One Q8_0S activation block against 16 rows in transposed registers (lane r of u[m]: 4 unsigned weight bytes of
 * row r, elements 4m..4m+3): the exact integers sum u y - offset s per row lane, offset the weights' bias (8 for
 * Q4_0's nibbles, 128 for Q8_0's w + 128). Two VNNI chains, for latency. */
static inline __m512i pi_dot16_u8(const __m512i u[8], const int8_t *qs) {   /* sum u y of 32 activation quants qs */
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int m = 0; m < 8; m += 2) {
        s0 = _mm512_dpbusd_epi32(s0, u[m], _mm512_set1_epi32(pi_load_i32(qs + 4 * m)));
        s1 = _mm512_dpbusd_epi32(s1, u[m + 1], _mm512_set1_epi32(pi_load_i32(qs + 4 * m + 4)));
    }
    return _mm512_add_epi32(s0, s1);
}
static inline __m512i pi_dot16_q8_0s(const __m512i u[8], const pi_block_q8_0s *xb, int32_t offset) {
    return _mm512_sub_epi32(pi_dot16_u8(u, xb->qs), _mm512_set1_epi32(offset * (int32_t)xb->s));
}
#endif

static inline void pi_load4_ps(const float *p, __m256 y[4]) {
    for (int i = 0; i < 4; i++) y[i] = _mm256_loadu_ps(p + 8 * i);
}
static inline void pi_store4_ps(float *p, const __m256 y[4]) {
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(p + 8 * i, y[i]);
}

/* pi_tree8 of 8 vectors, lane by lane. */
static inline __m256 pi_tree8_ps(const __m256 p[8]) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[4]), _mm256_add_ps(p[2], p[6])),
                         _mm256_add_ps(_mm256_add_ps(p[1], p[5]), _mm256_add_ps(p[3], p[7])));
}

#endif
