/* fp16.h: IEEE half and bfloat16 <-> float conversions (scalar, exact rounding). */
#ifndef PI_FP16_H
#define PI_FP16_H

#include <stdint.h>
#include <string.h>

static inline float pi_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t pi_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

#if defined(__F16C__)
#include <immintrin.h>   /* the one intrinsic outside arch/: a single-instruction conversion */
static inline float pi_fp16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#elif defined(__aarch64__)
/* every aarch64 CPU converts half to float in one instruction (FCVT), exactly: the same values as the code below (a
 * signalling NaN comes back quiet, as from F16C) at a tenth of the instructions */
static inline float pi_fp16_to_f32(uint16_t h) {
    __fp16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
}
#else
static inline float pi_fp16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0) return pi_bits_to_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) return pi_bits_to_f32(sign | 0x7f800000u | (man << 13));
    return pi_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}
#endif

/* Round to nearest even, with overflow to inf and subnormals. */
static inline uint16_t pi_f32_to_fp16(float f) {
    uint32_t x = pi_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00);           /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);          /* overflow -> inf */
    if (ax < 0x38800000u) {                                           /* subnormal or zero */
        float af = pi_bits_to_f32(ax);
        /* adding 0.5 (2^-1) aligns the mantissa so that hardware rounding does RNE at 2^-24 */
        float r = af + 0.5f;
        return (uint16_t)(sign | (pi_f32_to_bits(r) - 0x3f000000u));
    }
    uint32_t mant_odd = (ax >> 13) & 1;
    ax += 0xc8000fffu + mant_odd;                                     /* rebias exponent and round */
    return (uint16_t)(sign | (ax >> 13));
}

static inline float pi_bf16_to_f32(uint16_t h) { return pi_bits_to_f32((uint32_t)h << 16); }

static inline uint16_t pi_f32_to_bf16(float f) {
    uint32_t x = pi_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64);  /* quiet NaN */
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

#endif
