/* column_kernels.c: the sparse down step's column-layout kernels alone, one thread, at the avx2 level: Q4_KC
 * (arch/kc.c, a Q4_K matrix by input: one axpy_cols call per super-block of 256 channels) against Q4_0C (arch/q4_0c.c,
 * one call per block of 32) on the same kept channels, over the 7B shape's down step (4096 outputs, rows of 2 KB),
 * random quants and scales (the timing does not depend on their values).
 *
 *   M=.; F="-O3 -fno-math-errno -ffp-contract=off -D_GNU_SOURCE -I$M/core/include -I$M/core/src"
 *   gcc $F -DPI_LEVEL=avx2 -mavx2 -mfma -mf16c -mbmi -mbmi2 -mlzcnt -mpopcnt -Wno-unused-function \
 *       -c $M/core/src/arch/level.c -o /tmp/level_avx2.o
 *   gcc $F -DPI_LEVEL=scalar -Wno-unused-function -c $M/core/src/arch/level.c -o /tmp/level_scalar.o
 *   gcc $F -o /tmp/column_kernels bench/column_kernels.c /tmp/level_avx2.o /tmp/level_scalar.o \
 *       $M/core/src/{error,dtype,dtype_k,tensor,threadpool,ops,model,kv_cache,context,backend_cpu,offload}.c \
 *       $M/core/src/{sparse_ffn,repack,cpu}.c $M/core/cuda/stub.c -DPI_WITH_AVX2=1 -lm -lpthread
 *   /tmp/column_kernels 0.5 4      # half the channels of 4 super-blocks (2 MB of rows: L3 on a Zen 1)
 *   /tmp/column_kernels 0.5 32     # 32 super-blocks (16 MB: memory)
 *
 * Prints cycles per 16 kept channels x 256 outputs at 2.37 GHz (the Zen 1 this was written on) and GB/s of quants
 * read (Q4_KC's 20 bytes of scales per output and super-block are read as well, not counted). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern const pi_cpu_kernels pi_kernels_avx2;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    const int64_t E = 4096; const double keep = argc > 1 ? atof(argv[1]) : 0.5;
    const int NSB = argc > 2 ? atoi(argv[2]) : 4;   /* 1024 channels: rows 2 MB: L2-ish/L3 */
    char *rows = aligned_alloc(64, (size_t)NSB * 256 * E / 2);
    for (size_t i = 0; i < (size_t)NSB * 256 * E / 2; i++) rows[i] = (char)rand();
    uint8_t *aux = aligned_alloc(64, (size_t)NSB * E * 20);
    for (size_t i = 0; i < (size_t)NSB * E * 20; i++) aux[i] = (uint8_t)(rand() & 63);
    for (int b = 0; b < NSB; b++) for (int c = 0; c < E / 64; c++) for (int o = 0; o < 128; o++) ((uint16_t *)(aux + (b * E / 64 + c) * 1280))[o] = 0x2000;
    uint16_t *sc0 = aligned_alloc(64, (size_t)NSB * 8 * E * 2);
    for (size_t i = 0; i < (size_t)NSB * 8 * E; i++) sc0[i] = 0x2000;
    float *y = aligned_alloc(64, E * 4); memset(y, 0, E * 4);
    const pi_type_kernels *kk = &pi_kernels_avx2.type[PI_TYPE_Q4_KC], *k0 = &pi_kernels_avx2.type[PI_TYPE_Q4_0C];
    for (int pass = 0; pass < 3; pass++) for (int mode = 0; mode < 2; mode++) {
        srand(7);
        double t0 = now(); int64_t nrows = 0;
        for (int rep = 0; rep < 20; rep++)
        for (int b = 0; b < NSB; b++) {
            const void *rp[256]; float a[256]; uint8_t idx[256]; int n = 0;
            for (int i = 0; i < 256; i++) if ((double)rand() / RAND_MAX < keep) { rp[n] = rows + ((size_t)b * 256 + i) * E / 2; a[n] = (float)(rand() % 100 - 50) / 50; idx[n++] = i; }
            nrows += n;
            if (mode == 0) kk->axpy_cols(E, n, idx, a, aux + (size_t)b * E * 20, rp, y);
            else for (int j = 0, k = 0; j < 8; j++) { int s = k; while (k < n && idx[k] / 32 == j) k++; if (k > s) k0->axpy_cols(E, k - s, idx + s, a + s, sc0 + ((size_t)b * 8 + j) * E, rp + s, y); }
        }
        double dt = now() - t0;
        printf("pass %d %s: %.1f cycles per 16 rows x 256 outputs (%.2f GB/s quants) %g\n", pass, mode ? "q4_0c" : "q4_kc", dt * 2.37e9 / (nrows / 16.0 * E / 256), nrows * E / 2 / dt / 1e9, y[3]);
    }
}
