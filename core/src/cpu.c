/* cpu.c: which ISA level's kernels run (arch/level.c builds one table per level).
 *
 * At library load the best level that the build has, the CPU implements and the OS enables is chosen
 * (cpuid + xgetbv; for AMX also the kernel's permission, arch_prctl), unless POWERINFER_ISA names a
 * lower one. pi_cpu_isa_set changes it later (tests, users hit by a kernel bug). Each compiled level's
 * traits table (dtype.c formats + that level's kernels) is built once here, so pi_traits() is a lookup. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define PI_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#else
#define PI_X86 0
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* Best last within an architecture: x86 runs scalar..amx, aarch64 scalar..i8mm (never both kinds). */
typedef enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512, ISA_AMX, ISA_NEON, ISA_DOTPROD, ISA_I8MM, ISA_COUNT } isa_level;
static const char *const isa_names[ISA_COUNT] = { "scalar", "avx2", "avx512", "amx", "neon", "dotprod", "i8mm" };
#define ISA_LIST "scalar, avx2, avx512, amx, neon, dotprod, i8mm"

/* The tables CMake compiled in (PI_WITH_<LEVEL>, see CMakeLists.txt). */
extern const pi_cpu_kernels pi_kernels_scalar;
#if PI_WITH_AVX2
extern const pi_cpu_kernels pi_kernels_avx2;
#endif
#if PI_WITH_AVX512
extern const pi_cpu_kernels pi_kernels_avx512;
#endif
#if PI_WITH_AMX
extern const pi_cpu_kernels pi_kernels_amx;
#endif
#if PI_WITH_NEON
extern const pi_cpu_kernels pi_kernels_neon;
#endif
#if PI_WITH_DOTPROD
extern const pi_cpu_kernels pi_kernels_dotprod;
#endif
#if PI_WITH_I8MM
extern const pi_cpu_kernels pi_kernels_i8mm;
#endif

static const pi_cpu_kernels *compiled[ISA_COUNT];
static pi_type_traits traits[ISA_COUNT][PI_TYPE_TABLE_END];
static int64_t l2_bytes = 1 << 20;   /* the L2 cache per core, read at load where the C library tells it */
static bool one_stream_decode;        /* one token reads one weight stream per thread (pi_cpu_one_stream_decode) */
static bool half_width_512;           /* 512-bit instructions run as two 256-bit halves (pi_cpu_half_width_512) */
static bool bf16_dot;                 /* bf16 weights in vdpbf16ps's arithmetic (pi_bf16_dot) */
static bool half_width_256;           /* 256-bit instructions run as two 128-bit halves (pi_cpu_half_width_256) */
static bool software_prefetch;        /* the kernels' software prefetches measured to pay here (pi_cpu_software_prefetch) */
static bool runs[ISA_COUNT];          /* compiled in and supported by this CPU and OS */
static isa_level active = ISA_SCALAR;
static char env_error[160];           /* why POWERINFER_ISA was not applied ("" if it was, or unset) */
static char info[512];                /* pi_system_info: the level in use, the levels that run, the features */

#if PI_X86
static bool cpu_has(unsigned leaf, unsigned sub, int reg, int bit) {
    unsigned r[4];
    if (__get_cpuid_max(leaf & 0x80000000u, NULL) < leaf) return false;
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    return (r[reg] >> bit) & 1;
}
enum { EAX, EBX, ECX, EDX };

static uint64_t xcr0(void) {
    if (!cpu_has(1, 0, ECX, 27)) return 0;   /* OSXSAVE */
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

/* Linux hands out AMX tile state only to processes that ask for it (ARCH_REQ_XCOMP_PERM). */
static bool amx_permitted(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return false;
#endif
}

/* The features the levels need, read once: each is the CPU's cpuid bit and, for register state, the OS's
 * XCR0 bits (AVX: 0x6, AVX-512: 0xe0, AMX tiles: 0x60000). */
typedef struct {
    bool avx, avx2, fma, f16c, bmi1, bmi2, popcnt, lzcnt;
    bool avx512f, avx512dq, avx512cd, avx512bw, avx512vl, avx512vnni, avx512bf16;
    bool amx_tile, amx_int8, amx_bf16;
} cpu_features;

static cpu_features detect_features(void) {
    const uint64_t x = xcr0();
    const bool ymm = (x & 0x6) == 0x6, zmm = ymm && (x & 0xe0) == 0xe0, tiles = (x & 0x60000) == 0x60000;
    return (cpu_features){
        .avx = ymm && cpu_has(1, 0, ECX, 28), .avx2 = ymm && cpu_has(7, 0, EBX, 5),
        .fma = ymm && cpu_has(1, 0, ECX, 12), .f16c = cpu_has(1, 0, ECX, 29),
        .bmi1 = cpu_has(7, 0, EBX, 3), .bmi2 = cpu_has(7, 0, EBX, 8), .popcnt = cpu_has(1, 0, ECX, 23),
        .lzcnt = cpu_has(0x80000001u, 0, ECX, 5),
        .avx512f = zmm && cpu_has(7, 0, EBX, 16), .avx512dq = zmm && cpu_has(7, 0, EBX, 17),
        .avx512cd = zmm && cpu_has(7, 0, EBX, 28), .avx512bw = zmm && cpu_has(7, 0, EBX, 30),
        .avx512vl = zmm && cpu_has(7, 0, EBX, 31), .avx512vnni = zmm && cpu_has(7, 0, ECX, 11),
        .avx512bf16 = zmm && cpu_has(7, 1, EAX, 5),
        .amx_tile = tiles && cpu_has(7, 0, EDX, 24), .amx_int8 = tiles && cpu_has(7, 0, EDX, 25),
        .amx_bf16 = tiles && cpu_has(7, 0, EDX, 22),
    };
}

/* AMD family 19h or later: Zen 3 (no AVX-512), Zen 4 (512-bit instructions as two 256-bit halves), Zen 5 (1Ah,
 * a full 512-bit data path). */
static int amd_family(void) {   /* 0: not AMD */
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u || d != 0x69746e65u || c != 0x444d4163u)   /* AuthenticAMD */
        return 0;
    __get_cpuid(1, &a, &b, &c, &d);
    return (int)(((a >> 8) & 0xf) + ((a >> 20) & 0xff));
}

static bool amd_zen3_or_later(void) { return amd_family() >= 0x19; }

static bool intel(void) {
    unsigned a, b, c, d;
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;   /* GenuineIntel */
}

/* Zen 1 and Zen+ (family 17h, models below 30h; Zen 2 is 17h from model 30h on, with 256-bit units). */
static bool amd_zen1(void) {
    unsigned a, b, c, d;
    if (amd_family() != 0x17 || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (((a >> 4) & 0xf) | (((a >> 16) & 0xf) << 4)) < 0x30;
}

static bool cpu_runs(isa_level level) {
    const cpu_features f = detect_features();
    const bool avx2 = f.avx && f.avx2 && f.fma && f.f16c && f.bmi1 && f.bmi2 && f.popcnt && f.lzcnt;
    const bool avx512 = avx2 && f.avx512f && f.avx512dq && f.avx512cd && f.avx512bw && f.avx512vl && f.avx512vnni;
    switch (level) {
        case ISA_SCALAR: return true;
        case ISA_AVX2:   return avx2;
        case ISA_AVX512: return avx512;
        case ISA_AMX:    return avx512 && f.avx512bf16 && f.amx_tile && f.amx_int8 && f.amx_bf16 && amx_permitted();
        default:         return false;
    }
}

static void describe_features(char *out, size_t size) {
    const cpu_features f = detect_features();
    snprintf(out, size,
             "AVX = %d | AVX2 = %d | FMA = %d | F16C = %d | AVX512F = %d | AVX512BW = %d | AVX512_VNNI = %d | "
             "AVX512_BF16 = %d | AMX_INT8 = %d | AMX_BF16 = %d | NEON = 0",
             f.avx, f.avx2, f.fma, f.f16c, f.avx512f, f.avx512bw, f.avx512vnni, f.avx512bf16, f.amx_int8, f.amx_bf16);
}
#elif defined(__aarch64__)
/* Advanced SIMD (the neon level) is part of every aarch64 CPU; the dotprod level needs the dot-product instructions
 * (SDOT, Armv8.2's FEAT_DotProd: Apple M1 on, Graviton 2 on, Cortex-A76 / Neoverse N1 on, not the Cortex-A72 of a
 * Raspberry Pi 4 or the A53/A55 of many boards). */
static bool cpu_dotprod(void) {
#if defined(__linux__)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t size = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &size, NULL, 0) == 0 && v != 0;
#else
    return false;
#endif
}
/* The i8mm level adds the int8 matrix multiply (SMMLA, FEAT_I8MM: Apple M2 on, Graviton 3 on, Neoverse V1 / N2 on). */
static bool cpu_i8mm(void) {
#if defined(__linux__)
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
    return (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t size = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_I8MM", &v, &size, NULL, 0) == 0 && v != 0;
#else
    return false;
#endif
}
static bool cpu_runs(isa_level level) {
    return level == ISA_SCALAR || level == ISA_NEON || (level == ISA_DOTPROD && cpu_dotprod()) ||
           (level == ISA_I8MM && cpu_dotprod() && cpu_i8mm());
}
static void describe_features(char *out, size_t size) {
    snprintf(out, size, "NEON = 1 | DOTPROD = %d | I8MM = %d", cpu_dotprod(), cpu_i8mm());
}
#else
static bool cpu_runs(isa_level level) { return level == ISA_SCALAR; }
static void describe_features(char *out, size_t size) { snprintf(out, size, "no SIMD kernels for this architecture"); }
#endif

static int find_level(const char *name) {
    for (int i = 0; i < ISA_COUNT; i++)
        if (name && strcmp(name, isa_names[i]) == 0) return i;
    return -1;
}

__attribute__((constructor)) static void pi_cpu_init(void) {
    bool avx512_bf16 = false;   /* the avx512 level's vdpbf16ps runs (its flags lack AVX512_BF16: Ice Lake has the rest) */
#ifdef _SC_LEVEL2_CACHE_SIZE   /* glibc (cpuid on x86); elsewhere, or where it answers 0, the 1 MB default */
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 > 0) l2_bytes = l2;
#endif
#if PI_X86
    one_stream_decode = amd_zen3_or_later();
    half_width_512 = amd_family() == 0x19;   /* Zen 4 (Zen 3, the same family, runs no 512-bit level) */
    half_width_256 = amd_zen1();
    avx512_bf16 = detect_features().avx512bf16;
    software_prefetch = intel() || amd_family() == 0x1a;   /* Sapphire Rapids, Zen 5 (the Zen 4 measured slower with) */
#endif
    compiled[ISA_SCALAR] = &pi_kernels_scalar;
#if PI_WITH_AVX2
    compiled[ISA_AVX2] = &pi_kernels_avx2;
#endif
#if PI_WITH_AVX512
    compiled[ISA_AVX512] = &pi_kernels_avx512;
#endif
#if PI_WITH_AMX
    compiled[ISA_AMX] = &pi_kernels_amx;
#endif
#if PI_WITH_NEON
    compiled[ISA_NEON] = &pi_kernels_neon;
#endif
#if PI_WITH_DOTPROD
    compiled[ISA_DOTPROD] = &pi_kernels_dotprod;
#endif
#if PI_WITH_I8MM
    compiled[ISA_I8MM] = &pi_kernels_i8mm;
#endif
    for (int i = 0; i < ISA_COUNT; i++) {
        if (!compiled[i]) continue;
        pi_traits_fill(compiled[i], traits[i]);
        runs[i] = cpu_runs((isa_level)i);
        if (runs[i]) active = (isa_level)i;
    }
    /* bf16 weights: vdpbf16ps's arithmetic (bf16 activations) at every level where the CPU has AVX512_BF16, so that
     * every level gives the scalar level's bits on the machine; f32 activations elsewhere, where its emulation would
     * cost the prompts (docs/design.md). POWERINFER_BF16_DOT=0 / 1 chooses (tests); forced on without AVX512_BF16,
     * the avx512 level runs the avx2 level's emulation. */
    const char *dot = getenv("POWERINFER_BF16_DOT");
    bf16_dot = dot && *dot ? strcmp(dot, "0") != 0 : avx512_bf16;
    for (int i = 0; bf16_dot && i < ISA_COUNT; i++) {
        if (!compiled[i]) continue;
        const pi_cpu_kernels *k = compiled[i];
#if PI_WITH_AVX512 && PI_WITH_AVX2
        if (i == ISA_AVX512 && !avx512_bf16 && compiled[ISA_AVX2]) k = compiled[ISA_AVX2];
#endif
        pi_traits_fill_one(PI_TYPE_BF16, &k->bf16_dp, &traits[i][PI_TYPE_BF16]);
        pi_traits_fill_one(PI_TYPE_BF16X8, &k->bf16x8_dp, &traits[i][PI_TYPE_BF16X8]);
    }
    const char *env = getenv("POWERINFER_ISA");
    if (env && *env) {
        const int want = find_level(env);
        if (want < 0)
            snprintf(env_error, sizeof env_error, "POWERINFER_ISA=%.40s: unknown level (" ISA_LIST ")", env);
        else if (!runs[want])
            snprintf(env_error, sizeof env_error, "POWERINFER_ISA=%s: %s", env,
                     compiled[want] ? "this CPU does not support it" : "this build does not include it");
        else   /* a level that runs is at most the best one (active, so far) */
            active = (isa_level)want;
    }
}

const char *pi_system_info(void) {
    char levels[64] = "";
    for (int i = 0; i < ISA_COUNT; i++)
        if (runs[i]) snprintf(levels + strlen(levels), sizeof levels - strlen(levels), "%s%s", *levels ? ", " : "", isa_names[i]);
    char features[384];
    describe_features(features, sizeof features);
    snprintf(info, sizeof info, "CPU_ISA = %s (runs: %s) | BF16_DOT = %d | %s", isa_names[active], levels, bf16_dot,
             features);
    return info;
}

const pi_cpu_kernels *pi_cpu(void) { return compiled[active]; }
int64_t pi_cpu_l2_bytes(void) { return l2_bytes; }
bool pi_cpu_one_stream_decode(void) { return one_stream_decode; }
bool pi_cpu_half_width_512(void) { return half_width_512; }
bool pi_cpu_half_width_256(void) { return half_width_256; }
bool pi_cpu_software_prefetch(void) { return software_prefetch; }
const pi_type_traits *pi_cpu_traits(void) { return traits[active]; }

const char *pi_cpu_isa(void) { return isa_names[active]; }
int32_t pi_bf16_dot(void) { return bf16_dot; }

int32_t pi_cpu_isa_supported(const char *name) {
    const int i = find_level(name);
    return i >= 0 && runs[i];
}

const char *pi_cpu_isa_env_error(void) { return env_error[0] ? env_error : NULL; }

pi_status pi_cpu_isa_set(const char *name) {
    const int i = find_level(name);
    if (i < 0) return pi_fail(PI_ERR_INVALID_ARG, "unknown ISA level '%s' (" ISA_LIST ")", name ? name : "");
    if (!compiled[i]) return pi_fail(PI_ERR_UNSUPPORTED, "ISA level %s is not in this build", name);
    if (!runs[i]) return pi_fail(PI_ERR_UNSUPPORTED, "this CPU does not support ISA level %s", name);
    active = (isa_level)i;
    return PI_OK;
}
