/* vec_dot.c: the dot-product and axpy kernels behind the dtype traits table.
 * This directory is the only place with SIMD intrinsics. Every kernel has a
 * scalar version (compiled when the target lacks the ISA, e.g. -DPI_NATIVE=OFF)
 * which is the reference the SIMD paths are tested against. */
#include "../internal.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX2__)
#include "avx2_util.h"
#endif


/* ---- float dots ---- */

float pi_dot_f32(int64_t n, const float *a, const float *b) {
    int64_t i = 0;
    float sum;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    sum = pi_hsum_ps(_mm256_add_ps(acc0, acc1));
#elif PI_NEON   /* lanes 0..7 and 8..15 of 16: four registers */
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, vld1q_f32(a + i), vld1q_f32(b + i));
        a1 = vfmaq_f32(a1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        a2 = vfmaq_f32(a2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        a3 = vfmaq_f32(a3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    sum = pi_neon_tree8(vaddq_f32(a0, a2), vaddq_f32(a1, a3));
#else   /* the same order: two 8-lane accumulators, added lane by lane, then the tree */
    float p0[8] = { 0 }, p1[8] = { 0 };
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 8; j++) {
            p0[j] = fmaf(a[i + j], b[i + j], p0[j]);
            p1[j] = fmaf(a[i + 8 + j], b[i + 8 + j], p1[j]);
        }
    for (int j = 0; j < 8; j++) p0[j] += p1[j];
    sum = pi_tree8(p0);
#endif
    for (; i < n; i++) sum += a[i] * b[i];   /* leftovers */
    return sum;
}

void pi_axpy_f32(int64_t n, float a, const float *x, float *y) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#elif PI_NEON
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
        vst1q_f32(y + i + 4, vfmaq_n_f32(vld1q_f32(y + i + 4), vld1q_f32(x + i + 4), a));
    }
#else
    for (; i < n / 8 * 8; i++) y[i] = fmaf(a, x[i], y[i]);   /* fused, as the vector body */
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

float pi_vec_dot_f32_f32(int64_t n, const void *w, const void *x) { return pi_dot_f32(n, w, x); }

float pi_vec_dot_f16_f32(int64_t n, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    int64_t i = 0;
    float sum;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    __m256 acc0 = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
        acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b + i), acc0);
    }
    sum = pi_hsum_ps(acc0);
#elif PI_NEON
    float32x4_t lo = vdupq_n_f32(0), hi = lo;
    for (; i + 8 <= n; i += 8) {
        float32x4_t w0, w1;
        pi_neon_load8_f16(a + i, &w0, &w1);
        lo = vfmaq_f32(lo, w0, vld1q_f32(b + i));
        hi = vfmaq_f32(hi, w1, vld1q_f32(b + i + 4));
    }
    sum = pi_neon_tree8(lo, hi);
#else   /* the same order: one 8-lane accumulator, then the tree */
    float p[8] = { 0 };
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) p[j] = fmaf(pi_fp16_to_f32(a[i + j]), b[i + j], p[j]);
    sum = pi_tree8(p);
#endif
    for (; i < n; i++) sum += pi_fp16_to_f32(a[i]) * b[i];
    return sum;
}

/* Element i of a row of 16-bit floats (half) or of f32 (!half) as f32. */
static inline float row_elem(const void *row, int64_t i, bool half) {
    return half ? pi_fp16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* Four rows (f16 if half, else f32) against one f32 vector, each in pi_vec_dot_f16_f32's order: out[k] = the f16
 * vec_dot of rows[k] (the same bits), or for f32 rows the same operations on their values (attention scores over a
 * cache of any type, read as f32 values). Each row keeps its own 8-lane accumulator; the four chains run
 * interleaved, which hides the fma latency that a single dot product waits on. */
static inline __attribute__((always_inline)) void dot4_rows(int64_t n, const void *const *rows, const float *x,
                                                            float *out, bool half) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        for (int k = 0; k < 4; k++) {
            const __m256 w = half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)rows[k] + i)))
                                  : _mm256_loadu_ps((const float *)rows[k] + i);
            acc[k] = _mm256_fmadd_ps(w, xv, acc[k]);
        }
    }
    for (int k = 0; k < 4; k++) out[k] = pi_hsum_ps(acc[k]);
#elif PI_NEON
    float32x4_t lo[4], hi[4];
    for (int k = 0; k < 4; k++) lo[k] = hi[k] = vdupq_n_f32(0);
    for (; i + 8 <= n; i += 8) {
        const float32x4_t x0 = vld1q_f32(x + i), x1 = vld1q_f32(x + i + 4);
        for (int k = 0; k < 4; k++) {
            float32x4_t w0, w1;
            if (half) pi_neon_load8_f16((const uint16_t *)rows[k] + i, &w0, &w1);
            else {
                w0 = vld1q_f32((const float *)rows[k] + i);
                w1 = vld1q_f32((const float *)rows[k] + i + 4);
            }
            lo[k] = vfmaq_f32(lo[k], w0, x0);
            hi[k] = vfmaq_f32(hi[k], w1, x1);
        }
    }
    for (int k = 0; k < 4; k++) out[k] = pi_neon_tree8(lo[k], hi[k]);
#else   /* the same order: one 8-lane accumulator per row, then the tree */
    for (int k = 0; k < 4; k++) {
        float p[8] = { 0 };
        for (int64_t j = 0; j + 8 <= n; j += 8)
            for (int l = 0; l < 8; l++) p[l] = fmaf(row_elem(rows[k], j + l, half), x[j + l], p[l]);
        out[k] = pi_tree8(p);
    }
    i = n / 8 * 8;
#endif
    for (int k = 0; k < 4; k++)   /* the unfused tail */
        for (int64_t j = i; j < n; j++) out[k] += row_elem(rows[k], j, half) * x[j];
}

void pi_vec_dot4_f16_f32(int64_t n, const void *const *rows, const float *x, float *out) {
    dot4_rows(n, rows, x, out, true);
}

void pi_vec_dot4_f32_f32(int64_t n, const void *const *rows, const float *x, float *out) {
    dot4_rows(n, rows, x, out, false);
}

float pi_vec_dot_bf16_f32(int64_t n, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    int64_t i = 0;
    float sum;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc0 = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256i wi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(a + i))), 16);
        acc0 = _mm256_fmadd_ps(_mm256_castsi256_ps(wi), _mm256_loadu_ps(b + i), acc0);
    }
    sum = pi_hsum_ps(acc0);
#elif PI_NEON
    float32x4_t lo = vdupq_n_f32(0), hi = lo;
    for (; i + 8 <= n; i += 8) {
        float32x4_t w0, w1;
        pi_neon_load8_bf16(a + i, &w0, &w1);
        lo = vfmaq_f32(lo, w0, vld1q_f32(b + i));
        hi = vfmaq_f32(hi, w1, vld1q_f32(b + i + 4));
    }
    sum = pi_neon_tree8(lo, hi);
#else   /* the same order: one 8-lane accumulator, then the tree */
    float p[8] = { 0 };
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) p[j] = fmaf(pi_bf16_to_f32(a[i + j]), b[i + j], p[j]);
    sum = pi_tree8(p);
#endif
    for (; i < n; i++) sum += pi_bf16_to_f32(a[i]) * b[i];
    return sum;
}

/* ---- f16 rows ---- */

#if defined(__AVX2__)
/* f32 -> f16, 8 at a time with vcvtps2ph (round to nearest even, overflow to inf, subnormals kept): the bits of
 * fp16.h's pi_f32_to_fp16, but for NaN, which the instruction keeps with its payload and pi_f32_to_fp16 makes
 * sign | 0x7e00: a group of 8 with a NaN takes the scalar conversion. The prompt's K/V stores; the scalar level
 * keeps dtype.c's loop (542M llama pp512 on Sapphire Rapids: 2% of the samples). */
void pi_f16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) {
            for (int k = 0; k < 8; k++) d[i + k] = pi_f32_to_fp16(src[i + k]);
            continue;
        }
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; i++) d[i] = pi_f32_to_fp16(src[i]);
}
#elif PI_NEON
/* The same with FCVTN (round to nearest even under the default FPCR, overflow to inf, subnormals kept), a group of 8
 * with a NaN through the scalar conversion. */
void pi_f16_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t a = vld1q_f32(src + i), b = vld1q_f32(src + i + 4);
        if (vminvq_u32(vandq_u32(vceqq_f32(a, a), vceqq_f32(b, b))) == 0) {   /* a NaN */
            for (int k = 0; k < 8; k++) d[i + k] = pi_f32_to_fp16(src[i + k]);
            continue;
        }
        vst1q_u16(d + i, vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(a), b)));
    }
    for (; i < n; i++) d[i] = pi_f32_to_fp16(src[i]);
}
#endif

/* ---- 8-bit activations ---- */

/* One block of 32 floats to 8 bits, d = amax / 127; returns the sum of the quants. Two roundings:
 * - storage (Q8_0 weights, a q8_0 KV cache): q = roundf(x * (1 / d)), halves away from zero, the bytes of
 *   llama.cpp's reference quantizer and gguf-py's;
 * - activations (Q8_0S, ties_even): q = rint(x * (127 / amax)), halves to even, as llama.cpp's SIMD
 *   activation quantizers and our Q8_K/Q8_KM. Halves away are biased where many products land exactly on
 *   .5, as in layer 0 of a model whose embeddings are Q8_0 (integers times one scale per block): on Gemma 3
 *   270M Q4_K_M without BOS, the KL divergence from the exact weights went 0.0247 -> 0.0182 (bench/README.md).
 * The AVX2 path gives exactly the scalar path's bits. */
static inline int32_t quantize_block_q8(const float *x, uint16_t *d_out, int8_t *qs, const bool ties_even) {
#if defined(__AVX2__)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax8 = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax8 = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), amax8);   /* NaN lanes keep amax, as fmaxf */
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float amax = _mm_cvtss_f32(m);
    const float d = amax / 127.0f;
    const float id = ties_even ? (amax != 0.0f ? 127.0f / amax : 0.0f) : (d != 0.0f ? 1.0f / d : 0.0f);
    *d_out = pi_f32_to_fp16(d);
    __m256i q[4], sum = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        const __m256 y = _mm256_mul_ps(v[k], _mm256_set1_ps(id));
        if (ties_even) {
            q[k] = _mm256_cvtps_epi32(y);   /* the default rounding mode: nearest, ties to even */
            sum = _mm256_add_epi32(sum, q[k]);
            continue;
        }
        const __m256 a = _mm256_andnot_ps(sign, y);
        const __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                        _mm256_set1_ps(1.0f));
        const __m256 r = _mm256_or_ps(_mm256_add_ps(t, up), _mm256_and_ps(sign, y));   /* roundf */
        q[k] = _mm256_cvttps_epi32(r);
        sum = _mm256_add_epi32(sum, q[k]);
    }
    /* int32 -> int8: packs work within 128-bit lanes, a final permute restores the order */
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    _mm256_storeu_si256((__m256i *)qs, _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return pi_hsum_epi32(sum);
#elif PI_NEON
    float32x4_t v[8], m = vdupq_n_f32(0);
    for (int k = 0; k < 8; k++) {
        v[k] = vld1q_f32(x + 4 * k);
        m = vmaxnmq_f32(m, vabsq_f32(v[k]));   /* maxnm: a NaN lane keeps the other, as fmaxf */
    }
    const float amax = vmaxnmvq_f32(m);
    const float d = amax / 127.0f;
    const float id = ties_even ? (amax != 0.0f ? 127.0f / amax : 0.0f) : (d != 0.0f ? 1.0f / d : 0.0f);
    *d_out = pi_f32_to_fp16(d);
    int32x4_t q[8], sum = vdupq_n_s32(0);
    for (int k = 0; k < 8; k++) {
        const float32x4_t y = vmulq_n_f32(v[k], id);
        q[k] = ties_even ? vcvtnq_s32_f32(y) : vcvtaq_s32_f32(y);   /* nearest even (rintf) / away (roundf) */
        sum = vaddq_s32(sum, q[k]);
    }
    pi_neon_store_i8x32(q, qs);
    return vaddvq_s32(sum);
#else
    float amax = 0.0f;
    for (int j = 0; j < PI_QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = ties_even ? (amax != 0.0f ? 127.0f / amax : 0.0f) : (d != 0.0f ? 1.0f / d : 0.0f);
    *d_out = pi_f32_to_fp16(d);
    int32_t sum = 0;
    for (int j = 0; j < PI_QK8_0; j++) sum += qs[j] = (int8_t)(ties_even ? rintf(x[j] * id) : roundf(x[j] * id));
    return sum;
#endif
}

/* Q8_0 as stored (weights, a q8_0 KV cache): d = amax / 127, q = roundf(x / d). */
void pi_quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    pi_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / PI_QK8_0; b++) quantize_block_q8(src + b * PI_QK8_0, &y[b].d, y[b].qs, false);
}

#if defined(__AVX2__)
/* The 32 int8 products of a Q8_0 weight block w and an activation block as 8 int32 lanes (lane sums
 * differ between the two bodies, the total does not): VNNI takes w + 128 (unsigned) and subtracts 128 s
 * from lane 0; AVX2's maddubs, whose int16 pairs would overflow with 255 x 127, takes |w| and sign(y, w). */
static inline __m256i dot_i8_s8(const int8_t *w, const pi_block_q8_0s *xb) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)w), y = _mm256_loadu_si256((const __m256i *)xb->qs);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setr_epi32(-128 * (int32_t)xb->s, 0, 0, 0, 0, 0, 0, 0),
                               _mm256_xor_si256(x, _mm256_set1_epi8((char)0x80)), y);
#else
    return pi_dpbusd(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
#endif
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles first, then high nibbles. */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}
#endif

/* Q8_0S (activations, ties to even: quantize_block_q8): Q8_0 plus s = sum of the block's quants, so that
 * a Q4_0 dot can use the unsigned nibbles: sum (q - 8) y = sum q y - 8 s. */
void pi_quantize_row_q8_0s(const float *src, void *dst, int64_t n) {
    pi_block_q8_0s *y = dst;
    for (int64_t b = 0; b < n / PI_QK8_0; b++)
        y[b].s = (int16_t)quantize_block_q8(src + b * PI_QK8_0, &y[b].d, y[b].qs, true);
}

void pi_q8_0s_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q8_0s *x = src;
    for (int64_t b = 0; b < n / PI_QK8_0; b++) {
        const float d = pi_fp16_to_f32(x[b].d);
        for (int j = 0; j < PI_QK8_0; j++) dst[b * PI_QK8_0 + j] = (float)x[b].qs[j] * d;
    }
}

/* Q4_0 . Q8_0S. The canonical order every Q4_0 kernel follows (so that the 8-row and interleaved
 * kernels of rows8.c give the same bits): per block the exact integer i = sum q y - 8 s, then
 * acc = fma(d_w * d_x, i, acc), blocks in order, one accumulator. */
float pi_vec_dot_q4_0_q8_0s(int64_t n, const void *w, const void *x) {
    const pi_block_q4_0 *a = w;
    const pi_block_q8_0s *b = x;
    const int64_t nb = n / PI_QK4_0;
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t s;
#if defined(__AVX2__)
        const __m256i dot = pi_dpbusd(_mm256_setzero_si256(), unpack_nibbles(a[i].qs),
                                      _mm256_loadu_si256((const __m256i *)b[i].qs));
        s = pi_hsum_epi32(dot);
#elif PI_NEON
        int8x16_t lo, hi;
        pi_neon_nibbles(a[i].qs, &lo, &hi);
        s = pi_neon_dot_halves(lo, hi, b[i].qs);
#else
        s = 0;
        for (int j = 0; j < PI_QK4_0 / 2; j++)
            s += (a[i].qs[j] & 0x0f) * b[i].qs[j] + (a[i].qs[j] >> 4) * b[i].qs[j + PI_QK4_0 / 2];
#endif
        acc = fmaf(pi_fp16_to_f32(a[i].d) * pi_fp16_to_f32(b[i].d), (float)(s - 8 * b[i].s), acc);
    }
    return acc;
}

/* Q8_0 . Q8_0S. The canonical order every Q8_0 kernel follows (the 8-row kernel of rows8_k.c too):
 * per block the exact integer i = sum w y, then p[b % 8] = fma(d_w * d_x, i, p[b % 8]), blocks in
 * order, and pi_tree8(p). Eight partial sums: the AVX2 code adds 8 blocks with one vector fma
 * (a single scalar chain would cost decode speed). SIMD and scalar give the same bits. The activation
 * block's quant sum s lets VNNI use unsigned weights: sum w y = sum (w + 128) y - 128 s (dot_i8_s8). */
float pi_vec_dot_q8_0_q8_0s(int64_t n, const void *w, const void *x) {
    const pi_block_q8_0 *a = w;
    const pi_block_q8_0s *b = x;
    const int64_t nb = n / PI_QK8_0;
    float p[8] = { 0 };
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    /* 8 blocks at a time: lane j = block i + j = partial sum j */
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= nb; i += 8) {
        __m256i v[8];
        for (int j = 0; j < 8; j++) v[j] = dot_i8_s8(a[i + j].qs, &b[i + j]);
        const __m256 d = _mm256_mul_ps(pi_f16x8_strided(&a[i].d, sizeof *a), pi_f16x8_strided(&b[i].d, sizeof *b));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(pi_hsum8_i32(v)), acc);
    }
    _mm256_storeu_ps(p, acc);
#elif PI_NEON
    float32x4_t lo = vdupq_n_f32(0), hi = lo;
    for (; i + 8 <= nb; i += 8) {
        int32_t s8[8];
        float d8[8];
        for (int j = 0; j < 8; j++) {
            s8[j] = pi_neon_dot32(a[i + j].qs, b[i + j].qs);
            d8[j] = pi_fp16_to_f32(a[i + j].d) * pi_fp16_to_f32(b[i + j].d);
        }
        lo = vfmaq_f32(lo, vld1q_f32(d8), vcvtq_f32_s32(vld1q_s32(s8)));
        hi = vfmaq_f32(hi, vld1q_f32(d8 + 4), vcvtq_f32_s32(vld1q_s32(s8 + 4)));
    }
    vst1q_f32(p, lo);
    vst1q_f32(p + 4, hi);
#endif
    for (; i < nb; i++) {
        int32_t s;
#if defined(__AVX2__)
        s = pi_hsum_epi32(dot_i8_s8(a[i].qs, &b[i]));
#elif PI_NEON
        s = pi_neon_dot32(a[i].qs, b[i].qs);
#else
        s = 0;
        for (int j = 0; j < PI_QK8_0; j++) s += a[i].qs[j] * b[i].qs[j];
#endif
        p[i % 8] = fmaf(pi_fp16_to_f32(a[i].d) * pi_fp16_to_f32(b[i].d), (float)s, p[i % 8]);
    }
    return pi_tree8(p);
}

/* ---- axpy: y += a * row, row in a weight type (the sparse FFN's down step) ---- */

void pi_axpy_f32_row(int64_t n, float a, const void *row, float *y) { pi_axpy_f32(n, a, row, y); }

void pi_axpy_f16(int64_t n, float a, const void *row, float *y) {
    const uint16_t *x = row;
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
    }
#elif PI_NEON
    for (; i + 8 <= n; i += 8) {
        float32x4_t w0, w1;
        pi_neon_load8_f16(x + i, &w0, &w1);
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), w0, a));
        vst1q_f32(y + i + 4, vfmaq_n_f32(vld1q_f32(y + i + 4), w1, a));
    }
#else
    for (; i < n / 8 * 8; i++) y[i] = fmaf(a, pi_fp16_to_f32(x[i]), y[i]);   /* fused, as the vector body */
#endif
    for (; i < n; i++) y[i] += a * pi_fp16_to_f32(x[i]);
}

/* tokens one F16X8 / BF16X8 gemm8 call takes (mul_mat: the traits' gemm_max_t): at the AVX2 level 24, whole blocks of
 * 3 tokens (and a Zen 1's of 8); mul_mat's token passes are whole calls. Calls of 12 (passes of 24 tokens at K = 2048,
 * 12 at K = 5632) measured the same on a Zen 3 (0.98-1.02x), but would cut a Zen 1's 8-token blocks. */
#if PI_HAVE_ROWS8 && !PI_HAVE_ROWS16
#define HALF_X8_MAX_T 24
#else
#define HALF_X8_MAX_T PI_DOT8_MAX_T
#endif

#if PI_HAVE_ROWS8
/* Eight f16 rows in order (attention's V rows, f16 down_t rows): 32 outputs stay in registers while
 * the eight rows are added, each element exactly as pi_axpy_f16 adds it. */
void pi_axpy8_f16(int64_t n, const float *a, const void *const *rows, float *y) {
    const uint16_t *const *x = (const uint16_t *const *)rows;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8), y2 = _mm256_loadu_ps(y + i + 16),
               y3 = _mm256_loadu_ps(y + i + 24);
        for (int k = 0; k < 8; k++) {
            const __m256 va = _mm256_set1_ps(a[k]);
            const uint16_t *r = x[k] + i;
            y0 = _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r)), y0);
            y1 = _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8))), y1);
            y2 = _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16))), y2);
            y3 = _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 24))), y3);
        }
        _mm256_storeu_ps(y + i, y0);
        _mm256_storeu_ps(y + i + 8, y1);
        _mm256_storeu_ps(y + i + 16, y2);
        _mm256_storeu_ps(y + i + 24, y3);
    }
    for (int k = 0; k < 8; k++) pi_axpy_f16(n - i, a[k], x[k] + i, y + i);   /* the rest: n % 32 < 8 too */
}

/* Eight 16-bit float rows (f16 or bf16) against nt f32 vectors (mul_mat: prompts, batches; nt <= PI_DOT8_MAX_T for
 * vec_dot8, HALF_X8_MAX_T for the interleaved copies' gemm8):
 * y[t y_stride + k] = the single-row kernel's dot product (pi_vec_dot_f16_f32 / pi_vec_dot_bf16_f32), the
 * same bits: each (row, token) keeps its own 8-lane accumulator, fed in the same order, then the same
 * horizontal sum and tail. Blocks of rows_per rows x tok_per tokens keep their accumulators in registers,
 * so each converted weight vector feeds tok_per fmas.
 * The rows are either the file's (S = 1: elements i..i+7 of row k at w[k] + i) or one group of the interleaved
 * copy F16X8/BF16X8 (S = 4: two halves of 4 rows, and in a half every 8-element chunk holds the 4 rows' elements
 * i..i+7 one after the other, so they sit at w[k] + 4 i with w[k] = group + (k / 4) 4 n + (k % 4) 8; n is a
 * multiple of 8); S is a constant after inlining. */
/* Tiles, measured on a Zen 3 (542M llama, T = 512, one thread, CPU time, bench/ab_ops.py): 4 rows x 3 tokens (12
 * accumulators, 3 activation vectors and the converted weight vector: all 16 registers) in calls of 12 tokens (of 24,
 * as now: the same), against the 4 x 2 (f16) and 2 x 4 (bf16) blocks in calls of 8 before: f16 0.95x the time
 * (ffn_up, K = 2048), 0.96-0.97x (ffn_down, attn_q); bf16 0.82x (ffn_up), 0.84-0.86x (ffn_down). The conversions compete with the fmas for issue on
 * this core (8 fmas and 4 vcvtph2ps from memory take 4.7-4.9 cycles, not 4; with bf16's widening 6.2-6.4:
 * bench/instr_throughput.c), so fewer conversions per fma pay. The 1 or 2 tokens left take 4 x 2. Earlier, in calls
 * of 8 tokens: f16 4 x 2 0.75 of the time of 2 x 4 (4 x 3 as 3 + 3 + 2 with the last token repeated: 0.82; 8 x 1:
 * 1.01, 4 x 4: 1.14); bf16 4 x 2 1.08 of its 2 x 4. A Zen 1, which runs 256-bit instructions as two halves
 * (pi_cpu_half_width_256), is bound by the conversions instead: there f16 blocks of 8 tokens run as 1 row x 8
 * tokens, one vcvtph2ps per 8 fmas (542M f16 ffn_up/ffn_down/attn_q, T = 512, one thread, CPU time: 0.71-0.74x the
 * time of 4 x 2; 2 x 4: 0.76x, 4 x 3: 0.94x), and bf16 keeps 2 x 4 (1 x 8: 1.11x). */
#define F16_TILE_MAX 8

static inline __m256 load8_f16(const uint16_t *w) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w)); }
static inline __m256 load8_bf16(const uint16_t *w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w)), 16));
}

/* The end of one 16-bit float row's dot product in the single-row kernel's order: the tree of its 8 lanes,
 * then elements n8..n-1 unfused. */
static inline float half_dot_end(__m256 lanes, const uint16_t *w, const float *x, int64_t n8, int64_t n, int bf16) {
    float sum = pi_hsum_ps(lanes);
    for (int64_t i = n8; i < n; i++) sum += (bf16 ? pi_bf16_to_f32(w[i]) : pi_fp16_to_f32(w[i])) * x[i];
    return sum;
}

/* rows_per rows w[] x tokens t0..t0+n_tok-1 (a block of tok_per; a short one repeats its last token); rows_per and
 * tok_per are constants after inlining */
static inline __attribute__((always_inline)) void half_tile(int64_t n, const uint16_t *const *w, const char *x,
                                                        int64_t x_stride, int t0, int n_tok, float *y,
                                                        int64_t y_stride, const int bf16, const int S,
                                                        const int rows_per, const int tok_per) {
    const int64_t n8 = n / 8 * 8;
    const float *xt[F16_TILE_MAX];
    for (int j = 0; j < tok_per; j++) xt[j] = (const float *)(x + (t0 + PI_MIN(j, n_tok - 1)) * x_stride);
    __m256 acc[F16_TILE_MAX][F16_TILE_MAX];
    for (int k = 0; k < rows_per; k++)
        for (int j = 0; j < tok_per; j++) acc[k][j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 xv[F16_TILE_MAX];
        for (int j = 0; j < tok_per; j++) xv[j] = _mm256_loadu_ps(xt[j] + i);
        for (int k = 0; k < rows_per; k++) {
            const __m256 wk = bf16 ? load8_bf16(w[k] + i * S) : load8_f16(w[k] + i * S);
            for (int j = 0; j < tok_per; j++) acc[k][j] = _mm256_fmadd_ps(wk, xv[j], acc[k][j]);
        }
    }
    for (int j = 0; j < n_tok; j++)
        for (int k = 0; k < rows_per; k++)
            y[(t0 + j) * y_stride + k] = half_dot_end(acc[k][j], w[k], xt[j], n8, n, bf16);
}

/* blocks of rows_per rows x tok_per tokens; the tokens left after whole blocks in one short block (f16's 4 x 3: the 1
 * or 2 left in a 4 x 2 block, whose repeat of a token costs less) */
static inline __attribute__((always_inline)) void half_rows8(int64_t n, const void *const *rows, const char *x,
                                                         int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                         const int bf16, const int S, const int rows_per,
                                                         const int tok_per) {
    for (int r0 = 0; r0 < 8; r0 += rows_per) {
        const uint16_t *w[F16_TILE_MAX];
        for (int k = 0; k < rows_per; k++) w[k] = rows[r0 + k];
        int t0 = 0;
        for (; t0 + tok_per <= nt; t0 += tok_per)
            half_tile(n, w, x, x_stride, t0, tok_per, y + r0, y_stride, bf16, S, rows_per, tok_per);
        if (t0 < nt)
            half_tile(n, w, x, x_stride, t0, nt - t0, y + r0, y_stride, bf16, S, rows_per, tok_per == 3 ? 2 : tok_per);
    }
}

#if PI_HAVE_ROWS16
/* half_rows8 512 bits wide: a register holds the 8-lane accumulators of two rows (lanes 0..7: row 2p, 8..15:
 * row 2p + 1) for one token, fed in the same order as the single-row kernel, so the same bits with half
 * the fma instructions. Blocks of 8 tokens x 2 row pairs (16 accumulators; each converted pair feeds 8 fmas),
 * or, for 4 tokens or fewer, 4 tokens x all 4 pairs (a short block repeats its last token: fewer repeats).
 * Sapphire Rapids, f16 ffn_up/ffn_down T = 512: 8 x 2 took 0.92x the time of 4 x 4 (bf16 0.90x) once the
 * activations came from L2 (mul_mat's token chunks); streaming them from L3 it had been 1.13x. A Zen 4, which runs
 * 512-bit instructions as two halves (pi_cpu_half_width_512), is the other way round: 4 x 4 (twice for 8 tokens: four
 * conversions and four broadcasts per 16 fmas, not two and eight) took 0.90-0.91x the time of 8 x 2 (542M f16
 * ffn_up/ffn_down/attn_q, T = 512, one thread CPU time and two threads; bf16 0.94x; T = 8 0.87x). */
#ifndef F16_PREFETCH_NEXT
#define F16_PREFETCH_NEXT 1
#endif
static inline __m512 load_pair(const uint16_t *a, const uint16_t *b, int bf16, const int S) {
    const __m256i h = S != 1 ? _mm256_loadu_si256((const __m256i *)a)   /* interleaved: b = a + 8, one load */
                             : _mm256_set_m128i(_mm_loadu_si128((const __m128i *)b), _mm_loadu_si128((const __m128i *)a));
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

/* tokens t0..t0+tok-1 (n_tok of them real) x row pairs p0..p0+pairs-1; tok, pairs constants after inlining */
static inline __attribute__((always_inline)) void half_block_512(int64_t n, const uint16_t *const *w,
                                                             const float *const *xt, int n_tok, int p0, float *y,
                                                             int64_t y_stride, const int tok, const int pairs,
                                                             const int bf16, const int S, const char *pf) {
    const int64_t n8 = n / 8 * 8;
    __m512 acc[4][8];
    for (int p = 0; p < pairs; p++)
        for (int j = 0; j < tok; j++) acc[p][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n8; i += 8) {
        if (pf)   /* a cache line of the next group per step (pf: where this block's share of it begins) */
            for (int l = 0; l < pairs / 2; l++) _mm_prefetch(pf + 8 * i * (pairs / 2) + 64 * l, _MM_HINT_T1);
        __m512 wp[4];
        for (int p = 0; p < pairs; p++) wp[p] = load_pair(w[2 * (p0 + p)] + i * S, w[2 * (p0 + p) + 1] + i * S, bf16, S);
        for (int j = 0; j < tok; j++) {
            const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(xt[j] + i));
            for (int p = 0; p < pairs; p++) acc[p][j] = _mm512_fmadd_ps(wp[p], xv, acc[p][j]);
        }
    }
    for (int j = 0; j < n_tok; j++)
        for (int p = 0; p < pairs; p++)
            for (int h = 0; h < 2; h++) {
                const int k = 2 * (p0 + p) + h;
                const __m256 half = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][j]), 1))
                                      : _mm512_castps512_ps256(acc[p][j]);
                y[j * y_stride + k] = half_dot_end(half, w[k], xt[j], n8, n, bf16);
            }
}

static inline __attribute__((always_inline)) void half_rows8_512(int64_t n, const void *const *rows, const char *x,
                                                             int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                             const int bf16, const int S) {
    const uint16_t *const *w = (const uint16_t *const *)rows;
    /* the interleaved copy: the next group (16 n bytes on) into L2 while this one computes. Where a pass holds few
     * tokens (mul_mat's L2 chunks: 8 at K = 5632), each group comes from DRAM with its first 8 tokens at 8 bytes a
     * cycle, more than one core's stream gives. Zen 5, one thread: 8 tokens over 16 MB of groups at K = 2048 ran
     * at 59 GFLOP/s without, 162 with (182 from L2); the 542M f16 ffn_down at T = 512 took 0.95x the time
     * (bench/ab_ops.py --cpu-time), ffn_up (32 tokens a pass) the same */
    const char *next = S != 1 && F16_PREFETCH_NEXT ? (const char *)w[0] + 16 * n : NULL;
    for (int t0 = 0; t0 < nt; t0 += 8) {
        const int n_tok = PI_MIN(8, nt - t0);
        const float *xt[8];
        for (int j = 0; j < 8; j++) xt[j] = (const float *)(x + (t0 + PI_MIN(j, n_tok - 1)) * x_stride);
        if (n_tok > 4 && !pi_cpu_half_width_512())
            for (int p0 = 0; p0 < 4; p0 += 2)
                half_block_512(n, w, xt, n_tok, p0, y + t0 * y_stride, y_stride, 8, 2, bf16, S,
                               next ? next + 4 * n * p0 : NULL);
        else {   /* 4 tokens x 4 pairs, twice for more than 4 tokens */
            half_block_512(n, w, xt, PI_MIN(4, n_tok), 0, y + t0 * y_stride, y_stride, 4, 4, bf16, S, next);
            if (n_tok > 4)
                half_block_512(n, w, xt + 4, n_tok - 4, 0, y + (t0 + 4) * y_stride, y_stride, 4, 4, bf16, S, next);
        }
    }
}
#define HALF_ROWS8_BODY half_rows8_512
#else
/* 4 rows x 3 tokens; on a Zen 1 f16's whole blocks of 8 tokens 1 x 8 (its tail 4 x 2), bf16 2 x 4 */
static inline __attribute__((always_inline)) void half_rows8_avx2(int64_t n, const void *const *rows, const char *x,
                                                              int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                              const int bf16, const int S) {
    if (!pi_cpu_half_width_256())
        half_rows8(n, rows, x, x_stride, nt, y, y_stride, bf16, S, 4, 3);
    else if (bf16)
        half_rows8(n, rows, x, x_stride, nt, y, y_stride, bf16, S, 2, 4);
    else {
        int t0 = 0;
        for (; t0 + 8 <= nt; t0 += 8)
            half_rows8(n, rows, x + t0 * x_stride, x_stride, 8, y + t0 * y_stride, y_stride, bf16, S, 1, 8);
        if (t0 < nt) half_rows8(n, rows, x + t0 * x_stride, x_stride, nt - t0, y + t0 * y_stride, y_stride, bf16, S, 4, 2);
    }
}
#define HALF_ROWS8_BODY half_rows8_avx2
#endif

/* One token (decode): the rows' single-row dot products side by side, each in its own 8-lane accumulator in
 * element order (the single-row kernel's order: the same bits), so independent fma chains hide the latency that
 * one row's chain waits on (f16 decode was fma-latency bound, not memory bound). The file's rows (S = 1): all eight
 * at once (AVX-512: two rows per register, four chains), with software prefetch. The interleaved copy (S = 4): one
 * half after the other with four 256-bit chains at every level, so the weights are read as one sequential stream.
 * On a Zen 4 the 542M f16 file decoded 1.45-1.54x as fast as from the file's rows (eight streams); with two
 * rows per 512-bit register (two chains) 1.27-1.35x, with the two halves side by side 1.17-1.23x. On Intel
 * and Zen 5 (pi_cpu_software_prefetch) the copy's lines are requested PI_STREAM_AHEAD bytes ahead into L2: on a Sapphire
 * Rapids f16 decode 26.8 -> 31.8 t/s, the bandwidth bound; on a Zen 5 the 542M f16 one-token matmuls 0.91-0.93x the
 * time (the Zen 4 was not measured with it). */
#ifndef F16_PREFETCH
#define F16_PREFETCH 256   /* elements (512 bytes) ahead in each of the eight rows: eight streams outrun the hardware prefetcher */
#endif
static inline __attribute__((always_inline)) void half_rows8_one(int64_t n, const void *const *rows, const float *x,
                                                             float *y, const int bf16, const int S) {
    const uint16_t *const *w = (const uint16_t *const *)rows;
    const int64_t n8 = n / 8 * 8;
    __m256 half[8];
#if PI_HAVE_ROWS16
    if (S == 1) {   /* the file's rows: four 512-bit chains of two rows */
        __m512 acc[4];
        for (int p = 0; p < 4; p++) acc[p] = _mm512_setzero_ps();
        for (int64_t i = 0; i < n8; i += 8) {
            if (i % 32 == 0)   /* a cache line of each row per 32 elements, F16_PREFETCH elements ahead */
                for (int k = 0; k < 8; k++) _mm_prefetch((const char *)(w[k] + i + F16_PREFETCH), _MM_HINT_T0);
            const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + i));
            for (int p = 0; p < 4; p++) acc[p] = _mm512_fmadd_ps(load_pair(w[2 * p] + i, w[2 * p + 1] + i, bf16, 1), xv, acc[p]);
        }
        for (int p = 0; p < 4; p++) {
            half[2 * p] = _mm512_castps512_ps256(acc[p]);
            half[2 * p + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p]), 1));
        }
    } else
#endif
    {
        const int rows_per = S == 1 ? 8 : 4;   /* rows per pass */
        const bool ahead = S != 1 && pi_cpu_software_prefetch();   /* the copy: one line of a half per i */
        for (int k = 0; k < 8; k++) half[k] = _mm256_setzero_ps();
        for (int k0 = 0; k0 < 8; k0 += rows_per)
            for (int64_t i = 0; i < n8; i += 8) {
                if (S == 1 && i % 32 == 0)
                    for (int k = 0; k < 8; k++) _mm_prefetch((const char *)(w[k] + i + F16_PREFETCH), _MM_HINT_T0);
                if (ahead) pi_prefetch_ahead(w[k0] + i * S);
                const __m256 xv = _mm256_loadu_ps(x + i);
                for (int k = k0; k < k0 + rows_per; k++)
                    half[k] = _mm256_fmadd_ps(bf16 ? load8_bf16(w[k] + i * S) : load8_f16(w[k] + i * S), xv, half[k]);
            }
    }
    for (int k = 0; k < 8; k++) y[k] = half_dot_end(half[k], w[k], x, n8, n, bf16);
}

static inline __attribute__((always_inline)) void half_rows8_any(int64_t n, const void *const *rows, const char *x,
                                                             int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                             const int bf16, const int S) {
    if (nt == 1)
        half_rows8_one(n, rows, (const float *)x, y, bf16, S);
    else
        HALF_ROWS8_BODY(n, rows, x, x_stride, nt, y, y_stride, bf16, S);
}

#define HALF_ROWS8(type, bf16)                                                                                   \
    void pi_vec_dot8_##type##_f32(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt,      \
                                  float *y, int64_t y_stride) {                                                    \
        half_rows8_any(n, rows, x, x_stride, nt, y, y_stride, bf16, 1);                                            \
    }                                                                                                              \
    void pi_gemm8_##type##x8_f32(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,  \
                                 int64_t y_stride) {                                                               \
        const void *rows[8];                                                                                       \
        for (int k = 0; k < 8; k++) rows[k] = (const uint16_t *)group + pi_x8_index(n, k, 0);                      \
        half_rows8_any(n, rows, x, x_stride, nt, y, y_stride, bf16, 4);                                            \
    }
HALF_ROWS8(f16, 0)
HALF_ROWS8(bf16, 1)
#endif

#if PI_NEON
/* The aarch64 levels' 8-row f16/bf16 kernel (the file's rows; no interleaved copies there): blocks of 4 rows x 2
 * tokens, each (row, token) with the single-row kernel's two 4-lane accumulators fed in its order (16 registers), so
 * each converted weight vector feeds two fmas and each activation vector four; then the same tree and tail: the same
 * bits as pi_vec_dot_f16_f32 / pi_vec_dot_bf16_f32. tok (1 or 2) is a constant. */
static inline __attribute__((always_inline)) void neon_load8_half(const uint16_t *p, const int bf16, float32x4_t *lo,
                                                                  float32x4_t *hi) {
    if (bf16) pi_neon_load8_bf16(p, lo, hi);
    else pi_neon_load8_f16(p, lo, hi);
}

static inline __attribute__((always_inline)) void half_rows4_neon(int64_t n, const uint16_t *const *w,
                                                                  const float *const *xt, const int tok, float *y,
                                                                  int64_t y_stride, const int bf16) {
    const int64_t n8 = n / 8 * 8;
    float32x4_t lo[4][2], hi[4][2];   /* [row][token]: lanes 0..3 and 4..7 of the 8-lane accumulator */
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < tok; j++) lo[k][j] = hi[k][j] = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n8; i += 8) {
        float32x4_t x0[2], x1[2];
        for (int j = 0; j < tok; j++) {
            x0[j] = vld1q_f32(xt[j] + i);
            x1[j] = vld1q_f32(xt[j] + i + 4);
        }
        for (int k = 0; k < 4; k++) {
            float32x4_t w0, w1;
            neon_load8_half(w[k] + i, bf16, &w0, &w1);
            for (int j = 0; j < tok; j++) {
                lo[k][j] = vfmaq_f32(lo[k][j], w0, x0[j]);
                hi[k][j] = vfmaq_f32(hi[k][j], w1, x1[j]);
            }
        }
    }
    for (int j = 0; j < tok; j++)
        for (int k = 0; k < 4; k++) {
            float sum = pi_neon_tree8(lo[k][j], hi[k][j]);
            for (int64_t i = n8; i < n; i++) sum += (bf16 ? pi_bf16_to_f32(w[k][i]) : pi_fp16_to_f32(w[k][i])) * xt[j][i];
            y[j * y_stride + k] = sum;
        }
}

static inline __attribute__((always_inline)) void half_rows8_neon(int64_t n, const void *const *rows, const char *x,
                                                                  int64_t x_stride, int nt, float *y, int64_t y_stride,
                                                                  const int bf16) {
    for (int k0 = 0; k0 < 8; k0 += 4)
        for (int t0 = 0; t0 < nt; t0 += 2) {
            const float *xt[2] = { (const float *)(x + t0 * x_stride), (const float *)(x + (t0 + 1) * x_stride) };
            if (t0 + 1 < nt)
                half_rows4_neon(n, (const uint16_t *const *)rows + k0, xt, 2, y + t0 * y_stride + k0, y_stride, bf16);
            else
                half_rows4_neon(n, (const uint16_t *const *)rows + k0, xt, 1, y + t0 * y_stride + k0, y_stride, bf16);
        }
}

void pi_vec_dot8_f16_f32(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                         int64_t y_stride) { half_rows8_neon(n, rows, x, x_stride, nt, y, y_stride, 0); }
void pi_vec_dot8_bf16_f32(int64_t n, const void *const *rows, const char *x, int64_t x_stride, int nt, float *y,
                          int64_t y_stride) { half_rows8_neon(n, rows, x, x_stride, nt, y, y_stride, 1); }

/* Eight f16 rows in order (attention's V rows, f16 down_t rows), as the AVX2 pi_axpy8_f16: 32 outputs stay in
 * registers while the eight rows are added, each element exactly as pi_axpy_f16 adds it. */
void pi_axpy8_f16(int64_t n, const float *a, const void *const *rows, float *y) {
    const uint16_t *const *x = (const uint16_t *const *)rows;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        float32x4_t acc[8];
        for (int q = 0; q < 8; q++) acc[q] = vld1q_f32(y + i + 4 * q);
        for (int k = 0; k < 8; k++)
            for (int h = 0; h < 4; h++) {
                float32x4_t w0, w1;
                pi_neon_load8_f16(x[k] + i + 8 * h, &w0, &w1);
                acc[2 * h] = vfmaq_n_f32(acc[2 * h], w0, a[k]);
                acc[2 * h + 1] = vfmaq_n_f32(acc[2 * h + 1], w1, a[k]);
            }
        for (int q = 0; q < 8; q++) vst1q_f32(y + i + 4 * q, acc[q]);
    }
    for (int k = 0; k < 8; k++) pi_axpy_f16(n - i, a[k], x[k] + i, y + i);   /* the rest: n % 32 < 8 too */
}
#endif

/* The interleaved copies F16X8 and BF16X8 (pi_repack; n a multiple of 8; pi_x8_index): two halves of 4 rows, and in
 * a half, for every 8-element chunk c, the 4 rows' elements 8c..8c+7 one after the other (64 bytes: one cache line).
 * Decode reads one half after the other, one sequential stream, instead of eight rows side by side; a pass of the
 * prompt kernels over 4 rows reads one contiguous run of whole lines, and the AVX-512 kernels load a pair of rows'
 * chunks at once. (Eight rows per chunk, 128 bytes, made 4-row passes read every other line: prompts took 1.1-1.2x
 * the time.) */

void pi_repack_16bit_x8(int64_t n, const void *const *rows, void *group) {
    uint16_t *g = group;
    for (int k = 0; k < 8; k++)
        for (int64_t c = 0; c < n / 8; c++) memcpy(g + pi_x8_index(n, k, 8 * c), (const uint16_t *)rows[k] + 8 * c, 16);
}

#if !PI_HAVE_ROWS8   /* scalar: each row copied out of the group, then the single-row kernel (the reference itself) */
static void x8_gemm8_rows(pi_vec_dot_fn dot, int64_t n, const void *group, const char *x, int64_t x_stride, int nt,
                          float *y, int64_t y_stride) {
    uint16_t row[n];
    for (int k = 0; k < 8; k++) {
        for (int64_t c = 0; c < n / 8; c++) memcpy(row + 8 * c, (const uint16_t *)group + pi_x8_index(n, k, 8 * c), 16);
        for (int t = 0; t < nt; t++) y[t * y_stride + k] = dot(n, row, x + t * x_stride);
    }
}

void pi_gemm8_f16x8_f32(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                        int64_t y_stride) {
    x8_gemm8_rows(pi_vec_dot_f16_f32, n, group, x, x_stride, nt, y, y_stride);
}

void pi_gemm8_bf16x8_f32(int64_t n, const void *group, const char *x, int64_t x_stride, int nt, float *y,
                         int64_t y_stride) {
    x8_gemm8_rows(pi_vec_dot_bf16_f32, n, group, x, x_stride, nt, y, y_stride);
}
#endif

void pi_axpy_bf16(int64_t n, float a, const void *row, float *y) {
    const uint16_t *x = row;
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) {
        const __m256i xi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i))), 16);
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_castsi256_ps(xi), _mm256_loadu_ps(y + i)));
    }
#else
    for (; i < n / 8 * 8; i++) y[i] = fmaf(a, pi_bf16_to_f32(x[i]), y[i]);   /* fused, as the vector body */
#endif
    for (; i < n; i++) y[i] += a * pi_bf16_to_f32(x[i]);
}

/* Q4_0 and Q8_0 rows as f32 (dequantization: get_rows, a KV cache's values): (q - 8) d and q d, exact in f32, the
 * same bits at every level. */
void pi_q4_0_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q4_0 *x = src;
    for (int64_t b = 0; b < n / PI_QK4_0; b++) {
        const float d = pi_fp16_to_f32(x[b].d);
        float *y = dst + b * PI_QK4_0;
#if defined(__AVX2__)
        const __m256i q = unpack_nibbles(x[b].qs);   /* the block's 32 nibbles in element order */
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m128i q8[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };   /* elements 8j.. */
        const __m256 vd = _mm256_set1_ps(d);
        for (int j = 0; j < 4; j++) {
            const __m256i qi = _mm256_sub_epi32(_mm256_cvtepu8_epi32(q8[j]), _mm256_set1_epi32(8));
            _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(qi), vd));
        }
#else
        for (int j = 0; j < PI_QK4_0 / 2; j++) {
            y[j] = (float)((x[b].qs[j] & 0x0f) - 8) * d;
            y[j + PI_QK4_0 / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
#endif
    }
}

void pi_q8_0_to_f32(const void *src, float *dst, int64_t n) {
    const pi_block_q8_0 *x = src;
    for (int64_t b = 0; b < n / PI_QK8_0; b++) {
        const float d = pi_fp16_to_f32(x[b].d);
        float *y = dst + b * PI_QK8_0;
#if defined(__AVX2__)
        const __m256 vd = _mm256_set1_ps(d);
        for (int j = 0; j < PI_QK8_0; j += 8)
            _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                      _mm_loadl_epi64((const __m128i *)(x[b].qs + j)))), vd));
#else
        for (int j = 0; j < PI_QK8_0; j++) y[j] = (float)x[b].qs[j] * d;
#endif
    }
}

void pi_axpy_q4_0(int64_t n, float a, const void *row, float *y) {
    const pi_block_q4_0 *x = row;
    const int64_t nb = n / PI_QK4_0;
    int64_t b = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; b < nb; b++) {
        __m256 yb[4];
        pi_load4_ps(y + b * PI_QK4_0, yb);
        pi_q4_0_axpy_block(_mm256_set1_ps(a * pi_fp16_to_f32(x[b].d)), x[b].qs, yb);
        pi_store4_ps(y + b * PI_QK4_0, yb);
    }
#elif PI_NEON
    for (; b < nb; b++) pi_neon_axpy_nibbles(a * pi_fp16_to_f32(x[b].d), vld1q_u8(x[b].qs), y + b * PI_QK4_0);
#endif
    for (; b < nb; b++) {   /* fused like the SIMD path, so both give the same bits */
        const float s = a * pi_fp16_to_f32(x[b].d);
        for (int j = 0; j < PI_QK4_0 / 2; j++) {
            float *lo = &y[b * PI_QK4_0 + j], *hi = lo + PI_QK4_0 / 2;
            *lo = fmaf(s, (float)((x[b].qs[j] & 0x0f) - 8), *lo);
            *hi = fmaf(s, (float)((x[b].qs[j] >> 4) - 8), *hi);
        }
    }
}

void pi_axpy_q8_0(int64_t n, float a, const void *row, float *y) {
    const pi_block_q8_0 *x = row;
    const int64_t nb = n / PI_QK8_0;
    int64_t b = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; b < nb; b++) {
        __m256 yb[4];
        pi_load4_ps(y + b * PI_QK8_0, yb);
        pi_q8_0_axpy_block(_mm256_set1_ps(a * pi_fp16_to_f32(x[b].d)), x[b].qs, yb);
        pi_store4_ps(y + b * PI_QK8_0, yb);
    }
#elif PI_NEON
    for (; b < nb; b++) {
        const float s = a * pi_fp16_to_f32(x[b].d);
        for (int h = 0; h < 2; h++) pi_neon_axpy16(s, vld1q_s8(x[b].qs + 16 * h), y + b * PI_QK8_0 + 16 * h);
    }
#endif
    for (; b < nb; b++) {   /* fused like the SIMD path, so both give the same bits */
        const float s = a * pi_fp16_to_f32(x[b].d);
        for (int j = 0; j < PI_QK8_0; j++) y[b * PI_QK8_0 + j] = fmaf(s, (float)x[b].qs[j], y[b * PI_QK8_0 + j]);
    }
}

#if PI_HAVE_ROWS8
/* Eight pi_axpy_q8_0 calls (rows k = 0..7 in order, the same fma per element: the same bits) with each block of y
 * loaded and stored once: a Q8_0 down_t's rows (Gemma 3's sparse FFN, n_embd 640) took 10.8% of its decode's
 * samples added one at a time. */
void pi_axpy8_q8_0(int64_t n, const float *a, const void *const *rows, float *y) {
    const pi_block_q8_0 *const *r = (const pi_block_q8_0 *const *)rows;
    for (int64_t b = 0; b < n / PI_QK8_0; b++) {
        __m256 yb[4];
        pi_load4_ps(y + b * PI_QK8_0, yb);
        for (int k = 0; k < 8; k++)
            pi_q8_0_axpy_block(_mm256_set1_ps(a[k] * pi_fp16_to_f32(r[k][b].d)), r[k][b].qs, yb);
        pi_store4_ps(y + b * PI_QK8_0, yb);
    }
}
#endif
