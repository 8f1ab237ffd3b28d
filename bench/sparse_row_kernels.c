/* sparse_row_kernels.c: the speed of the sparse FFN's row kernels alone, one thread, at the avx2 level: the 8-row
 * dot of packed up rows (Q4_0R, pi_vec_dot8_q4_0r_q8_0p), and the down step two ways: the integer group axpy of
 * packed down_t rows (Q4_0R, pi_axpy_group_q4_0r, groups of 16 consecutive kept channels) and the column blocks
 * of the file's own ffn_down (Q4_0C, pi_axpy_cols_q4_0c, one group per block of 32 channels: what the loader
 * packs for a Q4_0 file), alone and after the dot as the fused one-token path runs them, over the 7B shape's
 * packed channels (n_embd 4096: an up row of 2304 bytes, then the channel's down row: 2304 bytes as Q4_0R,
 * 2048 as Q4_0C, whose scales lie apart, 8 KB per block of 32 channels).
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
 * Prints, per pass and mode, ms per layer, GB/s of rows read (the Q4_0C scales counted) and the cycles a group of
 * 16 kept channels' down rows takes per 256 outputs at 2.37 GHz (the Zen 1 this was written on). */
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
    const size_t row_bytes = E / 256 * 144, col_bytes = E / 2;    /* a Q4_0R row, a Q4_0C row */
    const size_t channel_r = 2 * row_bytes, channel_c = row_bytes + col_bytes;   /* up row, then down row */
    const size_t layer_scales = F / 32 * E;   /* Q4_0C: fp16 scales per layer */
    char *wr = aligned_alloc(64, (size_t)n_layer * F * channel_r), *wc = aligned_alloc(64, (size_t)n_layer * F * channel_c);
    uint16_t *sc = aligned_alloc(64, (size_t)n_layer * layer_scales * sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)n_layer * F * channel_r; i++) wr[i] = (char)rand();
    for (size_t i = 0; i < (size_t)n_layer * F * channel_c; i++) wc[i] = (char)rand();
    for (size_t r = 0; r < (size_t)n_layer * F * 2; r++)   /* finite fp16 scales: 0x2000 = 2^-7 */
        for (int64_t s = 0; s < E / 256; s++)
            for (int l = 0; l < 8; l++) ((uint16_t *)(wr + r * row_bytes + s * 144))[l] = 0x2000;
    for (size_t c = 0; c < (size_t)n_layer * F; c++)   /* the Q4_0C layout's up rows */
        for (int64_t s = 0; s < E / 256; s++)
            for (int l = 0; l < 8; l++) ((uint16_t *)(wc + c * channel_c + s * 144))[l] = 0x2000;
    for (size_t i = 0; i < (size_t)n_layer * layer_scales; i++) sc[i] = 0x2000;
    float *x = aligned_alloc(64, E * sizeof(float)), *y = aligned_alloc(64, E * sizeof(float));
    for (int64_t i = 0; i < E; i++) x[i] = (float)(rand() % 1000) / 500.0f - 1.0f;
    memset(y, 0, E * sizeof(float));
    char *xq = aligned_alloc(64, E / 256 * 320);
    pi_kernels_avx2.type[PI_TYPE_Q8_0P].from_f32(x, xq, E);
    int *sel = malloc(F * sizeof(int)), n_sel = 0;   /* the kept channels, ascending */
    for (int i = 0; i < F; i++)
        if ((double)rand() / RAND_MAX < keep) sel[n_sel++] = i;
    n_sel = n_sel / 8 * 8;
    const pi_type_kernels *k = &pi_kernels_avx2.type[PI_TYPE_Q4_0R], *kc = &pi_kernels_avx2.type[PI_TYPE_Q4_0C];
    enum { DOT, GROUPS, COLS, DOT_GROUPS, DOT_COLS, N_MODES };
    const char *names[N_MODES] = { "dot only", "groups only", "cols only", "dot+groups", "dot+cols" };
    for (int pass = 0; pass < 3; pass++)
        for (int mode = 0; mode < N_MODES; mode++) {
            const bool cols = mode == COLS || mode == DOT_COLS, dot = mode == DOT || mode >= DOT_GROUPS;
            const bool down = mode != DOT;
            const size_t channel = cols ? channel_c : channel_r;
            const int reps = n_layer == 1 ? 50 : 1;
            float sink = 0.0f;
            int64_t n_blocks = 0;   /* Q4_0C blocks with a kept channel: their scales are read */
            const double t0 = now();
            for (int rep = 0; rep < reps; rep++)
                for (int l = 0; l < n_layer; l++) {
                    const char *layer = (cols ? wc : wr) + (size_t)l * F * channel;
                    float hq[PI_COLS_MAX];
                    const void *dq[PI_COLS_MAX];
                    uint8_t iq[PI_COLS_MAX];   /* Q4_0C: the rows' places in their block */
                    int nq = 0;
                    int64_t block = -1;
                    for (int j = 0; j < n_sel; j += 8) {
                        const void *up[8];
                        float h[8] = { 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f };
                        for (int q = 0; q < 8; q++) up[q] = layer + (size_t)sel[j + q] * channel;
                        if (dot) k->vec_dot8(E, up, xq, 0, 1, h, 1);
                        for (int q = 0; q < 8 && down; q++) {   /* the axpy queue of sparse_ffn.c */
                            const int i = sel[j + q];
                            if (nq && (cols ? i / 32 != block : nq == PI_AXPY_GROUP)) {
                                if (cols) kc->axpy_cols(E, nq, iq, hq, sc + (size_t)l * layer_scales + block * E, dq, y);
                                else k->axpy_group(E, nq, hq, dq, y);
                                nq = 0;
                            }
                            if (cols && i / 32 != block) n_blocks++;
                            block = i / 32;
                            dq[nq] = (const char *)up[q] + row_bytes;
                            iq[nq] = (uint8_t)(i % 32);
                            hq[nq++] = h[q];
                        }
                        sink += h[0];
                    }
                    if (nq && cols) kc->axpy_cols(E, nq, iq, hq, sc + (size_t)l * layer_scales + block * E, dq, y);
                    else if (nq) k->axpy_group(E, nq, hq, dq, y);
                }
            const double dt = now() - t0;
            const double rows = (double)reps * n_layer * n_sel;
            const double bytes = rows * ((dot ? row_bytes : 0) + (down ? cols ? col_bytes : row_bytes : 0)) +
                                 (double)n_blocks * E * sizeof(uint16_t);
            printf("pass %d, %d channels x %d layers, %-11s: %.3f ms per layer, %.1f GB/s, %.0f cycles per 16 rows "
                   "x 256 (%g)\n", pass, n_sel, n_layer, names[mode], dt * 1e3 / (reps * n_layer), bytes / dt / 1e9,
                   dt * 2.37e9 / (rows / 16 * E / 256), (double)(sink + y[1]));
        }
    return 0;
}
