/* amx_bf16_arith.c: does AMX-BF16's TDPBF16PS compute what VDPBF16PS computes? (whether a bf16 tile kernel could
 * keep the bf16 contract of docs/design.md). 20000 random 16x16 tiles, K = 32: the instruction's results against
 * four models of its arithmetic per (m, n): fused steps even element first (Intel's pseudo-code), odd first (what
 * VDPBF16PS does, checked on a Zen 5), each pair summed exactly then rounded, the whole sum in double rounded once;
 * inputs DAZ, results FTZ. An AMX CPU only (Sapphire Rapids and later, Linux >= 5.16):
 *   gcc -O2 -frounding-math -mamx-tile -mamx-bf16 -mavx512f -o /tmp/amx_bf16_arith bench/amx_bf16_arith.c -lm
 *   /tmp/amx_bf16_arith [wide]      (wide: exponents over the whole range, zeros and subnormals; RZ=1: the models
 *                                    rounding toward zero)
 * Sapphire Rapids, 2026-12-07 (bench/README.md): 58-65% of the lanes differ from every model (wide: 36-49%), so no kernel on these
 * tiles gives the bits of the other levels. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#include <fenv.h>
#include <unistd.h>
#include <sys/syscall.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
typedef struct { uint8_t palette, start_row, res[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((aligned(64))) cfg_t;
static uint64_t s = 88172645463325252ull;
static uint64_t rnd(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
static float bf(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t rbf(int wide) { /* random bf16, exponent range narrow or wide */
    uint32_t sign = rnd() & 1, man = rnd() & 127;
    int e = wide ? (int)(rnd() % 254) + 1 : 127 + (int)(rnd() % 16) - 8;
    if (wide && rnd() % 16 == 0) e = 0;  /* subnormal/zero */
    return (uint16_t)(sign << 15 | e << 7 | man);
}
static float daz(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }
static float step(float acc, float a, float b) { /* one fused step, DAZ inputs, FTZ output (by exact? approx: rounded) */
    float r = fmaf(daz(a), daz(b), daz(acc));
    return fpclassify(r) == FP_SUBNORMAL ? copysignf(0.0f, r) : r;
}
int main(int argc, char **argv) {
    int wide = argc > 1;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { puts("no perm"); return 1; }
    cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
    c.rows[0] = 16; c.colsb[0] = 64;  /* C 16x16 f32 */
    c.rows[1] = 16; c.colsb[1] = 64;  /* A 16 x 32 bf16 */
    c.rows[2] = 16; c.colsb[2] = 64;  /* B 16 pairs-rows x 16 cols x 2 bf16 */
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&c);
    if (getenv("RZ")) fesetround(FE_TOWARDZERO);
    long bad_even = 0, bad_odd = 0, bad_pair = 0, bad_all = 0, total = 0;
    for (int it = 0; it < 20000; it++) {
        static uint16_t A[16][32], B[16][32]; static float C0[16][16], C[16][16];
        for (int m = 0; m < 16; m++) for (int k = 0; k < 32; k++) { A[m][k] = rbf(wide); B[m][k] = rbf(wide); }
        for (int m = 0; m < 16; m++) for (int n = 0; n < 16; n++) C0[m][n] = bf(rbf(wide)) * 1.5f;
        memcpy(C, C0, sizeof C);
        _tile_loadd(0, C, 64); _tile_loadd(1, A, 64); _tile_loadd(2, B, 64);
        _tile_dpbf16ps(0, 1, 2);
        _tile_stored(0, C, 64);
        for (int m = 0; m < 16; m++) for (int n = 0; n < 16; n++) {
            float e = C0[m][n], o = C0[m][n], p = C0[m][n]; double all = daz(C0[m][n]);
            for (int k = 0; k < 16; k++) {
                float a0 = bf(A[m][2*k]), a1 = bf(A[m][2*k+1]), b0 = bf(B[k][2*n]), b1 = bf(B[k][2*n+1]);
                e = step(step(e, a0, b0), a1, b1);
                o = step(step(o, a1, b1), a0, b0);
                double pr = (double)daz(a0) * daz(b0) + (double)daz(a1) * daz(b1);  /* pair exact, one rounding */
                all += pr;
                float pp = (float)((double)daz(p) + pr); p = fpclassify(pp) == FP_SUBNORMAL ? copysignf(0.0f, pp) : pp;
            }
            uint32_t r, ue, uo, up; memcpy(&r, &C[m][n], 4); memcpy(&ue, &e, 4); memcpy(&uo, &o, 4); memcpy(&up, &p, 4);
            float fa = (float)all; uint32_t ua; memcpy(&ua, &fa, 4); bad_all += r != ua; total++; bad_even += r != ue; bad_odd += r != uo; bad_pair += r != up;
            if (it == 0 && m == 0 && n < 2) printf("hw %08x even %08x odd %08x pair %08x\n", r, ue, uo, up);
        }
    }
    _tile_release();
    printf("%s: lanes %ld, differ from even-first %ld, odd-first %ld, pair-then-round %ld, all-in-double-once %ld\n", wide ? "wide" : "narrow",
           total, bad_even, bad_odd, bad_pair, bad_all);
    return 0;
}
