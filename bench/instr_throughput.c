/* instr_throughput.c: how many 256-bit instructions of one kind a core issues per nanosecond (eight independent
 * chains, so latency does not count), and a dependent scalar add chain for the clock. What bounds a CPU's int8
 * kernels is read off this: on a Zen 1 the 256-bit integer multiplies (vpmaddubsw, vpmaddwd, vpmullw) issue every
 * other cycle while and/add/shuffles/fma issue 1-2 a cycle (bench/README.md, 2026-12-03).
 *
 * The last lines time a mix: 8 independent fmas and 4 conversions of 8 16-bit floats from memory (f16: vcvtph2ps;
 * bf16: vpmovzxwd + vpslld), each conversion feeding two of the fmas, in cycles per 8 fmas (4.0 if the conversions
 * took no fma slot): on a Zen 3 the f16 mix ran 4.7-4.9 cycles, the bf16 one 6.2-6.4, so the AVX2 f16/bf16 prompt
 * kernels take 4 x 3 register blocks (fewer conversions per fma) rather than 4 x 2 (bench/README.md, 2026-12-06).
 *
 *   gcc -O2 -mavx2 -mfma -mf16c -o /tmp/instr_throughput bench/instr_throughput.c && /tmp/instr_throughput
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>

#define N 100000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ins applied to eight registers per iteration, each its own chain; returns instructions per ns */
#define CHAINS8(ins)                                                                                      \
    ({                                                                                                    \
        __m256i a0 = _mm256_set1_epi8(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0; \
        const __m256i y = _mm256_set1_epi8(1);                                                            \
        const double t0 = now();                                                                          \
        for (long i = 0; i < N; i++)                                                                      \
            __asm__ volatile(ins " %8, %0, %0\n\t" ins " %8, %1, %1\n\t" ins " %8, %2, %2\n\t"            \
                             ins " %8, %3, %3\n\t" ins " %8, %4, %4\n\t" ins " %8, %5, %5\n\t"            \
                             ins " %8, %6, %6\n\t" ins " %8, %7, %7\n\t"                                  \
                             : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),       \
                               "+x"(a7)                                                                   \
                             : "x"(y));                                                                   \
        8.0 * N / (now() - t0) / 1e9;                                                                     \
    })

/* cycles per 8 fmas when 4 conversions (conv: "vcvtph2ps %8, %[c]" or the bf16 pair) feed them two each */
#define FMA8_CONV4(conv0, conv1, conv2, conv3)                                                                  \
    ({                                                                                                        \
        __m256 a0 = _mm256_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, c;       \
        const __m256 w = _mm256_set1_ps(1e-9f);                                                               \
        const double t0 = now();                                                                              \
        for (long i = 0; i < N / 4; i++)                                                                      \
            __asm__ volatile(conv0 "vfmadd231ps %[w], %[c], %0\n\tvfmadd231ps %[w], %[c], %1\n\t"                \
                             conv1 "vfmadd231ps %[w], %[c], %2\n\tvfmadd231ps %[w], %[c], %3\n\t"                \
                             conv2 "vfmadd231ps %[w], %[c], %4\n\tvfmadd231ps %[w], %[c], %5\n\t"                \
                             conv3 "vfmadd231ps %[w], %[c], %6\n\tvfmadd231ps %[w], %[c], %7\n\t"                \
                             : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7),  \
                               [c] "=&x"(c)                                                                   \
                             : [w] "x"(w), [p] "r"(half_buf));                                                \
        (now() - t0) * 1e9 / (N / 4) * ghz;                                                                       \
    })
#define CVT(off) "vcvtph2ps " #off "(%[p]), %[c]\n\t"
#define WIDEN(off) "vpmovzxwd " #off "(%[p]), %[c]\n\tvpslld $16, %[c], %[c]\n\t"
static uint16_t half_buf[32] __attribute__((aligned(64)));

int main(void) {
    long x = 0;
    double t0 = now();
    for (long i = 0; i < N; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    const double ghz = 4.0 * N / (now() - t0) / 1e9;
    printf("dependent scalar adds: %.2f per ns (the clock, GHz)\n", ghz);
    struct { const char *name; double per_ns; } r[] = {
        { "vpmaddubsw", CHAINS8("vpmaddubsw") }, { "vpmaddwd", CHAINS8("vpmaddwd") },
        { "vpmullw", CHAINS8("vpmullw") },       { "vpaddd", CHAINS8("vpaddd") },
        { "vpand", CHAINS8("vpand") },           { "vpsignb", CHAINS8("vpsignb") },
        { "vpshufb", CHAINS8("vpshufb") },       { "vpunpcklbw", CHAINS8("vpunpcklbw") },
        { "vpcmpeqb", CHAINS8("vpcmpeqb") },     { "vfmadd231ps", CHAINS8("vfmadd231ps") },
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        printf("%-16s %.2f per ns = %.2f per cycle\n", r[i].name, r[i].per_ns, r[i].per_ns / ghz);
    printf("8 fmas + 4 f16 conversions from memory:  %.2f cycles (4.00: the fmas alone)\n",
           FMA8_CONV4(CVT(0), CVT(16), CVT(32), CVT(48)));
    printf("8 fmas + 4 bf16 widenings from memory:   %.2f cycles\n", FMA8_CONV4(WIDEN(0), WIDEN(16), WIDEN(32), WIDEN(48)));
    return (int)(x & 0);
}
