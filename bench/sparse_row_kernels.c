/* sparse_row_kernels.c: the speed of the sparse FFN's two row kernels alone, one thread, at the avx2 level:
 * the 8-row dot of packed up rows (Q4_0R, pi_vec_dot8_q4_0r_q8_0p) and the integer group axpy of packed down_t
 * rows (pi_axpy_group_q4_0r, groups of 8 here), one after the other as the fused one-token path runs them, over the
 * 7B shape's packed channels (n_embd 4096: an up row and a down_t row of 2304 bytes each, contiguous per channel).
 *
 *   M=.; F="-O3 -fno-math-errno -ffp-contract=off -D_GNU_SOURCE -I$M/core/include -I$M/core/src"
 *   gcc $F -DPI_LEVEL=avx2 -mavx2 -mfma -mf16c -mbmi -mbmi2 -mlzcnt -mpopcnt -Wno-unused-function \
 *       -c $M/core/src/arch/level.c -o /tmp/level_avx2.o
 *   gcc $F -DPI_LEVEL=scalar -Wno-unused-function -c $M/core/src/arch/level.c -o /tmp/level_scalar.o
 *   gcc $F -o /tmp/sparse_row_kernels bench/sparse_row_kernels.c /tmp/level_avx2.o /tmp/level_scalar.o \
 *       $M/core/src/{error,dtype,dtype_k,tensor,threadpool,ops,model,kv_cache,context,backend_cpu,offload}.c \
 *       $M/core/src/{sparse_ffn,repack,cpu}.c \
 *       $M/core/cuda/stub.c -DPI_WITH_AVX2=1 -lm -lpthread
 *   /tmp/sparse_row_kernels 8 0.5      # 8 layers (memory-resident), half the channels
 *   /tmp/sparse_row_kernels 1 0.02     # ~220 channels: the rows stay in L2
 *
 * Prints, per pass, ms per layer and GB/s of rows read for: dot only, axpy only, both (fused order). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern const pi_cpu_kernels pi_kernels_avx2;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int64_t E = 4096, F = 11008;
    const int n_layer = argc > 1 ? atoi(argv[1]) : 8;
    const double keep = argc > 2 ? atof(argv[2]) : 0.5;
    const size_t row_bytes = E / 256 * 144, channel_bytes = 2 * row_bytes;   /* up row, then down_t row */
    char *w = aligned_alloc(64, (size_t)n_layer * F * channel_bytes);
    for (size_t i = 0; i < (size_t)n_layer * F * channel_bytes; i++) w[i] = (char)rand();
    for (size_t r = 0; r < (size_t)n_layer * F * 2; r++)   /* finite fp16 scales: 0x2000 = 2^-7 */
        for (int64_t s = 0; s < E / 256; s++)
            for (int l = 0; l < 8; l++) ((uint16_t *)(w + r * row_bytes + s * 144))[l] = 0x2000;
    float *x = aligned_alloc(64, E * sizeof(float)), *y = aligned_alloc(64, E * sizeof(float));
    for (int64_t i = 0; i < E; i++) x[i] = (float)(rand() % 1000) / 500.0f - 1.0f;
    memset(y, 0, E * sizeof(float));
    char *xq = aligned_alloc(64, E / 256 * 320);
    pi_kernels_avx2.type[PI_TYPE_Q8_0P].from_f32(x, xq, E);
    int *sel = malloc(F * sizeof(int)), n_sel = 0;   /* the kept channels, ascending */
    for (int i = 0; i < F; i++)
        if ((double)rand() / RAND_MAX < keep) sel[n_sel++] = i;
    n_sel = n_sel / 8 * 8;
    const pi_type_kernels *k = &pi_kernels_avx2.type[PI_TYPE_Q4_0R];
    const char *names[3] = { "dot only", "axpy only", "both" };
    for (int pass = 0; pass < 3; pass++)
        for (int mode = 0; mode < 3; mode++) {
            const int reps = n_layer == 1 ? 50 : 1;
            float sink = 0.0f;
            const double t0 = now();
            for (int rep = 0; rep < reps; rep++)
                for (int l = 0; l < n_layer; l++) {
                    const char *layer = w + (size_t)l * F * channel_bytes;
                    for (int j = 0; j < n_sel; j += 8) {
                        const void *up[8], *down[8];
                        float h[8] = { 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f };
                        for (int q = 0; q < 8; q++) {
                            up[q] = layer + (size_t)sel[j + q] * channel_bytes;
                            down[q] = (const char *)up[q] + row_bytes;
                        }
                        if (mode != 1) k->vec_dot8(E, up, xq, 0, 1, h, 1);
                        if (mode != 0) k->axpy_group(E, 8, h, down, y);
                        sink += h[0];
                    }
                }
            const double dt = now() - t0, bytes = (double)reps * n_layer * n_sel * (mode == 2 ? 2 : 1) * row_bytes;
            printf("pass %d, %d channels x %d layers, %-9s: %.3f ms per layer, %.1f GB/s (%g)\n", pass, n_sel,
                   n_layer, names[mode], dt * 1e3 / (reps * n_layer), bytes / dt / 1e9, (double)(sink + y[1]));
        }
    return 0;
}
