/* activation.c: SiLU, ReLU and GELU over a row (pi_activation_row), soft-capping (pi_softcap_row: Gemma 2's attention
 * scores and logits), gpt-oss's clamped SwiGLU (pi_swiglu_oai_row) and attention's softmax numerator (pi_softmax_exp,
 * with an optional sink column), all on the same exp.
 *
 * Soft-capping is y = cap tanh(u), u = x scale / cap, with tanh |u| = (1 - e^-2|u|) / (1 + e^-2|u|) and u's sign put
 * back: e^-2|u| <= 1 never overflows (+-inf give +-cap). The error is absolute, at most 2.6 ulp of 1 times cap over
 * |x| <= 200 cap (tests/test_ops.py; relative: 8 ulp where |y| > cap / 10): e's rounding stays in 1 - e, so a tiny
 * |u| loses its relative precision, which neither the softmax nor sampling sees (they take differences of scores and
 * logits). Every level runs these operations in this order.
 *
 * The AVX2 path evaluates exp with the classic range reduction (x = n ln2 + r, |r| <= ln2/2, a
 * degree-6 polynomial for e^r, 2^n through the exponent bits), within 2 ulp of expf, and builds
 * SiLU = x / (1 + e^-x) and GELU = x / (1 + e^-2u) = 0.5 x (1 + tanh u) from it (the same tanh
 * approximation of GELU as ggml). Every element goes through the vector code, the tail through a
 * padded copy, so an element's result does not depend on its position in the row. At the AVX-512 levels the
 * softmax numerator runs sixteen lanes at a time over whole vectors of 16 (exp16: exp8's operations), adding each
 * vector's two halves to the 8-lane sum in element order (the same sum). The scalar level
 * does the same operations one element at a time, the neon level four at a time (the tail one by one): every
 * level gives the same bits. */
#include "../internal.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(89.0f), lo = _mm256_set1_ps(-103.97f);   /* e^89: inf; e^-104: 0 */
    x = _mm256_max_ps(lo, _mm256_min_ps(hi, x));   /* operand order keeps NaN (the second operand wins) */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);          /* ln2 = 0.693359375 - 2.12194440e-4 */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);                                /* e^r, Cephes expf coefficients */
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n in two factors so that n down to -150 (subnormal results) stays representable */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(ni, 1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

static inline __m256 act8(int32_t op, __m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    switch (op) {
        case PI_UNARY_RELU: return _mm256_max_ps(x, _mm256_setzero_ps());   /* NaN and -0 -> +0, as x > 0 ? x : 0 */
        case PI_UNARY_SILU: return _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        default: {   /* GELU: u = sqrt(2/pi) (x + 0.044715 x^3), 0.5 x (1 + tanh u) = x / (1 + e^(-2u)) */
            const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
            const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                           _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
            return _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u))));
        }
    }
}

void pi_activation_row(int32_t op, int64_t n, const float *x, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, act8(op, _mm256_loadu_ps(x + i)));
    if (i < n) {
        float buf[8] = { 0 };
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(buf, act8(op, _mm256_loadu_ps(buf)));
        memcpy(y + i, buf, (size_t)(n - i) * sizeof(float));
    }
}

/* cap tanh(x scale / cap), eight at a time (the soft-capping of the header) */
static inline __m256 softcap8(__m256 x, __m256 scale, __m256 inv_cap, __m256 cap) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 u = _mm256_mul_ps(_mm256_mul_ps(x, scale), inv_cap);
    const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, u)));   /* e^-2|u| */
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_mul_ps(cap, _mm256_or_ps(t, _mm256_and_ps(sign, u)));
}

void pi_softcap_row(int64_t n, const float *x, float *y, float scale, float cap) {
    const __m256 vs = _mm256_set1_ps(scale), vi = _mm256_set1_ps(1.0f / cap), vc = _mm256_set1_ps(cap);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, softcap8(_mm256_loadu_ps(x + i), vs, vi, vc));
    if (i < n) {
        float buf[8] = { 0 };
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(buf, softcap8(_mm256_loadu_ps(buf), vs, vi, vc));
        memcpy(y + i, buf, (size_t)(n - i) * sizeof(float));
    }
}

/* Eight scores with their mask values: x * scale + m where m > -inf, else -inf (the cell is hidden). */
static inline __m256 masked8(__m256 x, __m256 m, __m256 scale, __m256 *hidden) {
    *hidden = _mm256_cmp_ps(m, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    return _mm256_blendv_ps(_mm256_add_ps(_mm256_mul_ps(x, scale), m), m, *hidden);
}

#if defined(__AVX512F__)
/* exp8's operations, sixteen lanes at a time (the same bits) */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-103.97f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i ni = _mm512_cvtps_epi32(n);
    const __m512i half = _mm512_srai_epi32(ni, 1);
    const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
    const __m512 s2 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), _mm512_set1_epi32(127)), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

/* masked8 sixteen at a time */
static inline __m512 masked16(const float *x, const float *mask, __m512 scale, __mmask16 *hidden) {
    const __m512 m = mask ? _mm512_loadu_ps(mask) : _mm512_setzero_ps();
    *hidden = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(*hidden, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x), scale), m), m);
}
#endif

float pi_softmax_exp(int64_t n, float *x, const float *mask, float scale, float softcap, float sink) {
    if (softcap > 0.0f) {   /* the scores capped in place first; x * 1 below is x */
        pi_softcap_row(n, x, x, scale, softcap);
        scale = 1.0f;
    }
    const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    const int64_t n8 = n / 8 * 8;
    float xt[8], mt[8];   /* the tail, padded with hidden cells */
    for (int j = 0; j < 8; j++) {
        xt[j] = n8 + j < n ? x[n8 + j] : 0.0f;
        mt[j] = n8 + j < n ? (mask ? mask[n8 + j] : 0.0f) : -INFINITY;
    }
#define SCORES(i, m) (i < n8 ? _mm256_loadu_ps(x + i) : _mm256_loadu_ps(xt)), \
                     (i < n8 ? (mask ? _mm256_loadu_ps(mask + i) : _mm256_setzero_ps()) : _mm256_loadu_ps(mt))
    __m256 vmax = ninf, hidden;
    int64_t i0 = 0;   /* elements before i0 go sixteen at a time (AVX-512), the rest eight at a time */
#if defined(__AVX512F__)
    const __m512 vs16 = _mm512_set1_ps(scale);
    const int64_t n16 = n / 16 * 16;
    __m512 vmax16 = _mm512_set1_ps(-INFINITY);
    __mmask16 hidden16;
    for (int64_t i = 0; i < n16; i += 16)   /* a NaN score is passed over, as fmaxf does */
        vmax16 = _mm512_max_ps(masked16(x + i, mask ? mask + i : NULL, vs16, &hidden16), vmax16);
    vmax = _mm256_max_ps(_mm512_castps512_ps256(vmax16), _mm512_extractf32x8_ps(vmax16, 1));
    i0 = n16;
#endif
    for (int64_t i = i0; i < n; i += 8) {
        const __m256 s = masked8(SCORES(i, m), vs, &hidden);
        vmax = _mm256_max_ps(s, vmax);   /* a NaN score is passed over, as fmaxf does */
    }
    float lanes[8], max = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int j = 0; j < 8; j++) max = fmaxf(max, lanes[j]);
    if (max == -INFINITY) {   /* nothing visible */
        for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
        return 0.0f;
    }
    const bool has_sink = sink != -INFINITY;
    if (has_sink) max = fmaxf(max, sink);   /* the sink is one more column: in the max and in the sum */
    const __m256 vm = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();   /* element i in lane i % 8, in element order */
#if defined(__AVX512F__)
    const __m512 vm16 = _mm512_set1_ps(max);
    for (int64_t i = 0; i < n16; i += 16) {
        const __m512 s = masked16(x + i, mask ? mask + i : NULL, vs16, &hidden16);
        if (hidden16 == 0xffff) {   /* 16 hidden cells (a causal prompt's future): -inf, adding 0 */
            _mm512_storeu_ps(x + i, _mm512_set1_ps(-INFINITY));
            continue;
        }
        const __m512 e = _mm512_maskz_mov_ps((__mmask16)~hidden16, exp16(_mm512_sub_ps(s, vm16)));
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));   /* a hidden cell adds +0: the sum's bits stay */
        sum = _mm256_add_ps(sum, _mm512_extractf32x8_ps(e, 1));
        _mm512_storeu_ps(x + i, _mm512_mask_blend_ps(hidden16, e, _mm512_set1_ps(-INFINITY)));
    }
#endif
    for (int64_t i = i0; i < n; i += 8) {
        const __m256 s = masked8(SCORES(i, m), vs, &hidden);
        if (_mm256_movemask_ps(hidden) == 0xff) {   /* 8 hidden cells (a causal prompt's future): -inf, adding 0 */
            if (i < n8) _mm256_storeu_ps(x + i, ninf);
            else for (int64_t k = i; k < n; k++) x[k] = -INFINITY;
            continue;
        }
        const __m256 e = exp8(_mm256_sub_ps(s, vm));
        sum = _mm256_add_ps(sum, _mm256_blendv_ps(e, _mm256_setzero_ps(), hidden));
        const __m256 out = _mm256_blendv_ps(e, ninf, hidden);
        if (i < n8) _mm256_storeu_ps(x + i, out);
        else {
            _mm256_storeu_ps(xt, out);
            memcpy(x + i, xt, (size_t)(n - i) * sizeof(float));
        }
    }
#undef SCORES
    const float total = pi_hsum_ps(sum);
    if (!has_sink) return total;
    float e[8];   /* exp1's bits: exp8 of the sink's column */
    _mm256_storeu_ps(e, exp8(_mm256_set1_ps(sink - max)));
    return total + e[0];
}

/* ggml's swiglu_oai, eight at a time: min(g, limit) / (1 + e^(-alpha min(g, limit))) * (clamp(u, -limit, limit) + 1);
 * na = -alpha. The operand order of min / max keeps a NaN input NaN, as std::min / std::clamp do. */
static inline __m256 swiglu_oai8(__m256 g, __m256 u, __m256 na, __m256 lim, __m256 nlim) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 x = _mm256_min_ps(lim, g);                              /* lim < g ? lim : g */
    const __m256 y = _mm256_max_ps(nlim, _mm256_min_ps(lim, u));         /* -lim > u' ? -lim : u' */
    const __m256 glu = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_mul_ps(na, x))));
    return _mm256_mul_ps(glu, _mm256_add_ps(y, one));
}

void pi_swiglu_oai_row(int64_t n, const float *g, float *u, float alpha, float limit) {
    const __m256 na = _mm256_set1_ps(-alpha), lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(u + i, swiglu_oai8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i), na, lim, nlim));
    if (i < n) {
        float gb[8] = { 0 }, ub[8] = { 0 };
        memcpy(gb, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(ub, u + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(ub, swiglu_oai8(_mm256_loadu_ps(gb), _mm256_loadu_ps(ub), na, lim, nlim));
        memcpy(u + i, ub, (size_t)(n - i) * sizeof(float));
    }
}

#else

/* The vector code's arithmetic one element at a time (the same operations, fused where it fuses), so
 * every level gives the same bits. */
static inline float exp1(float x) {
    if (x != x) return x;               /* NaN stays NaN, as the vector code's min/max keep it */
    x = x < 89.0f ? x : 89.0f;          /* min(89, x), max(-103.97, x) */
    x = -103.97f > x ? -103.97f : x;
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    const int32_t ni = (int32_t)n, half = ni >= 0 ? ni / 2 : -((1 - ni) / 2);   /* ni >> 1, arithmetic */
    return p * pi_bits_to_f32((uint32_t)(half + 127) << 23) * pi_bits_to_f32((uint32_t)(ni - half + 127) << 23);
}

static inline float act1(int32_t op, float x) {
    switch (op) {
        case PI_UNARY_RELU: return x > 0.0f ? x : 0.0f;
        case PI_UNARY_SILU: return x / (1.0f + exp1(0.0f - x));
        default: {
            const float u = 0.7978845608028654f * fmaf(0.044715f, x * x * x, x);
            return x / (1.0f + exp1(-2.0f * u));
        }
    }
}

/* cap tanh(x scale / cap): softcap8's operations one element at a time */
static inline float softcap1(float x, float scale, float inv_cap, float cap) {
    const float u = x * scale * inv_cap;
    const float e = exp1(-2.0f * fabsf(u));
    return cap * copysignf((1.0f - e) / (1.0f + e), u);
}

#if PI_NEON
/* exp1 and act1, four lanes at a time (the same operations: the same bits) */
static inline float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(vdupq_n_f32(-103.97f), vminq_f32(vdupq_n_f32(89.0f), x));   /* FMIN/FMAX keep a NaN */
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t ni = vcvtq_s32_f32(n), half = vshrq_n_s32(ni, 1);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(half, vdupq_n_s32(127)), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(ni, half), vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

static inline float32x4_t act4(int32_t op, float32x4_t x) {
    const float32x4_t one = vdupq_n_f32(1.0f), zero = vdupq_n_f32(0.0f);
    switch (op) {
        case PI_UNARY_RELU: return vbslq_f32(vcgtq_f32(x, zero), x, zero);   /* NaN and -0 -> +0 */
        case PI_UNARY_SILU: return vdivq_f32(x, vaddq_f32(one, exp4(vsubq_f32(zero, x))));
        default: {
            const float32x4_t x3 = vmulq_f32(vmulq_f32(x, x), x);
            const float32x4_t u = vmulq_n_f32(vfmaq_f32(x, vdupq_n_f32(0.044715f), x3), 0.7978845608028654f);
            return vdivq_f32(x, vaddq_f32(one, exp4(vmulq_n_f32(u, -2.0f))));
        }
    }
}
#endif

void pi_activation_row(int32_t op, int64_t n, const float *x, float *y) {
    int64_t i = 0;
#if PI_NEON
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, act4(op, vld1q_f32(x + i)));
#endif
    for (; i < n; i++) y[i] = act1(op, x[i]);
}

/* one element at a time at the neon levels too (a logits row or an attention row: a small share of the work) */
void pi_softcap_row(int64_t n, const float *x, float *y, float scale, float cap) {
    const float inv_cap = 1.0f / cap;
    for (int64_t i = 0; i < n; i++) y[i] = softcap1(x[i], scale, inv_cap, cap);
}

float pi_softmax_exp(int64_t n, float *x, const float *mask, float scale, float softcap, float sink) {
    if (softcap > 0.0f) {   /* the scores capped in place first; x * 1 below is x */
        pi_softcap_row(n, x, x, scale, softcap);
        scale = 1.0f;
    }
    float max = -INFINITY;
    int64_t i = 0;
#if PI_NEON
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    float32x4_t vmax = ninf;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t m = mask ? vld1q_f32(mask + i) : vdupq_n_f32(0.0f);
        const float32x4_t s = vbslq_f32(vceqq_f32(m, ninf), ninf, vaddq_f32(vmulq_n_f32(vld1q_f32(x + i), scale), m));
        vst1q_f32(x + i, s);
        vmax = vmaxnmq_f32(vmax, s);   /* a NaN score is passed over, as fmaxf does */
    }
    max = vmaxnmvq_f32(vmax);
#endif
    for (; i < n; i++) {
        const float m = mask ? mask[i] : 0.0f;
        x[i] = m == -INFINITY ? -INFINITY : x[i] * scale + m;
        max = fmaxf(max, x[i]);
    }
    if (max == -INFINITY) {   /* nothing visible */
        for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
        return 0.0f;
    }
    const bool has_sink = sink != -INFINITY;
    if (has_sink) max = fmaxf(max, sink);   /* the sink is one more column: in the max and in the sum */
    float lanes[8] = { 0 };
    i = 0;
#if PI_NEON
    float32x4_t acc[2] = { vdupq_n_f32(0.0f), vdupq_n_f32(0.0f) };   /* lanes 0..3, 4..7 */
    for (; i + 8 <= n; i += 8)
        for (int h = 0; h < 2; h++) {
            const uint32x4_t hidden = mask ? vceqq_f32(vld1q_f32(mask + i + 4 * h), ninf) : vdupq_n_u32(0);
            const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i + 4 * h), vdupq_n_f32(max)));
            acc[h] = vaddq_f32(acc[h], vbslq_f32(hidden, vdupq_n_f32(0.0f), e));
            vst1q_f32(x + i + 4 * h, vbslq_f32(hidden, ninf, e));
        }
    vst1q_f32(lanes, acc[0]);
    vst1q_f32(lanes + 4, acc[1]);
#endif
    for (; i < n; i++) {
        if (mask && mask[i] == -INFINITY) continue;   /* hidden: stays -inf, adds 0 to its lane */
        x[i] = exp1(x[i] - max);
        lanes[i % 8] += x[i];
    }
    const float total = pi_tree8(lanes);
    return has_sink ? total + exp1(sink - max) : total;
}

/* swiglu_oai8's operations one element at a time (the neon levels too: an expert's rows are a small share) */
void pi_swiglu_oai_row(int64_t n, const float *g, float *u, float alpha, float limit) {
    const float na = -alpha;
    for (int64_t i = 0; i < n; i++) {
        const float x = limit < g[i] ? limit : g[i];
        float y = limit < u[i] ? limit : u[i];
        y = -limit > y ? -limit : y;
        u[i] = x / (1.0f + exp1(na * x)) * (y + 1.0f);
    }
}

#endif
