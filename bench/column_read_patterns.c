/* column_read_patterns.c: how one thread reads a K-quant column step's rows (arch/kc.c), with an AVX2 add as the
 * kernel: units of 256 rows of R bytes (a super-block of inputs), a share `frac` of them kept at random, read
 *   mode 0: in pieces of 256 bytes per pass over the unit's kept rows (KC_TILE 8 as it was; the next piece of each
 *           row requested `pf` bytes ahead),
 *   mode 1: the same passes over a chunk-major layout (row k's 32-byte chunk c at (256 c + k) * 32),
 *   mode G >= 2: whole rows, G of them side by side (2: one at a time).
 *
 *   gcc -O2 -mavx2 -o /tmp/column_read_patterns bench/column_read_patterns.c
 *   /tmp/column_read_patterns 0.5 0 512 5504    # the 7B shape's input-sparse gate rows, 256-byte pieces
 *   /tmp/column_read_patterns 0.5 16 512 5504   # whole rows, 16 side by side
 *   /tmp/column_read_patterns 0.5 8 512 2048    # the down step's rows
 *
 * About 560 MB of rows (memory, not cache); prints the best of 3 passes in GB/s of the kept rows' bytes. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s FRAC MODE [PREFETCH_BYTES [ROW_BYTES]]\n", argv[0]);
        return 1;
    }
    const double frac = atof(argv[1]);
    const int mode = atoi(argv[2]), pf = argc > 3 ? atoi(argv[3]) : 256;
    const int64_t R = argc > 4 ? atoi(argv[4]) : 5504, U = 256, n_units = 400 * 5504 / R;   /* about 563 MB */
    if (R < 256 || R % 32 || mode < 0 || mode > 256) {
        fprintf(stderr, "ROW_BYTES must be a multiple of 32 >= 256, MODE 0..256\n");
        return 1;
    }
    uint8_t *buf = aligned_alloc(1 << 21, (size_t)(R * U * n_units));
    memset(buf, 1, (size_t)(R * U * n_units));
    uint8_t *keep = malloc(U * n_units); srand(1);
    for (int64_t i = 0; i < U * n_units; i++) keep[i] = (rand() / (double)RAND_MAX) < frac;
    __m256i acc = _mm256_setzero_si256();
    double best = 1e9; int64_t bytes = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now(); bytes = 0;
        for (int64_t u = 0; u < n_units; u++) {
            const uint8_t *base = buf + u * R * U;
            int idx[256], n = 0;
            for (int k = 0; k < U; k++) if (keep[u * U + k]) idx[n++] = k;
            if (mode >= 2) {   /* groups of G rows side by side, each over its whole length */
                const int G = mode == 2 ? 1 : mode;
                for (int i0 = 0; i0 < n; i0 += G) {
                    const int g = n - i0 < G ? n - i0 : G;
                    for (int64_t off = 0; off < R; off += 32)
                        for (int i = 0; i < g; i++) {
                            const uint8_t *p = base + idx[i0 + i] * R + off;
                            if ((off & 63) == 0 && pf) _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
                            acc = _mm256_add_epi8(acc, _mm256_loadu_si256((const __m256i *)p));
                        }
                }
                bytes += (int64_t)n * R;
                continue;
            }
            for (int64_t off = 0; off < R; off += 256) {         /* a tile of 8 chunks */
                for (int i = 0; i < n; i++) {
                    for (int c = 0; c < 8; c++) {
                        const int64_t chunk = off / 32 + c;
                        if (chunk * 32 >= R) break;
                        const uint8_t *p = mode == 0 ? base + idx[i] * R + chunk * 32
                                                     : base + (chunk * U + idx[i]) * 32;
                        if (mode == 0 && c == 0 && pf) _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
                        acc = _mm256_add_epi8(acc, _mm256_loadu_si256((const __m256i *)p));
                    }
                }
            }
            bytes += (int64_t)n * R;
        }
        double dt = now() - t0; if (dt < best) best = dt;
    }
    uint8_t out[32]; _mm256_storeu_si256((__m256i *)out, acc);
    const char *name = mode == 1 ? "chunk-major" : mode == 0 ? "row-major tiles" : "whole rows, groups";
    printf("frac %.2f mode %s: kept bytes %.1f MB, %.2f GB/s of kept bytes (%d)\n", frac, name, bytes / 1e6,
           bytes / best / 1e9, out[0]);
    return 0;
}
