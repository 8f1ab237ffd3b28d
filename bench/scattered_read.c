/* scattered_read.c: how fast this machine reads runs of `seg` bytes scattered over a large buffer,
 * the access pattern of the sparse FFN (about 10% of the neurons' rows per layer, sorted).
 *
 *   gcc -O2 -mavx2 -fopenmp bench/scattered_read.c -o /tmp/scattered_read
 *   OMP_NUM_THREADS=2 /tmp/scattered_read 2304     # one Q4_0 row of n_embd 4096 (file layout)
 *   OMP_NUM_THREADS=2 /tmp/scattered_read 6912     # gate + up + down_t of one neuron (pi_sparse_pack)
 *   OMP_NUM_THREADS=2 /tmp/scattered_read 65536    # long runs: close to a plain streaming read
 *
 * 800 MiB in 32 "layers"; per layer 2.5 MB in runs of seg bytes at sorted random offsets; the runs
 * are handed to the threads in chunks of 8; each thread prefetches the run after its current one
 * (non-temporal) and xors the data. Prints the best of 5 passes in GB/s. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t next_random(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

int main(int argc, char **argv) {
    const size_t seg = argc > 1 ? (size_t)atol(argv[1]) / 64 * 64 : 2304 / 64 * 64;
    if (seg < 64) { fprintf(stderr, "usage: %s RUN_BYTES (>= 64)\n", argv[0]); return 2; }
    const size_t total = (size_t)800 << 20, layers = 32, per_layer = total / layers;
    const size_t n_runs = per_layer / seg, pick = (size_t)(2.5e6 / seg) + 1;
    uint8_t *buf = aligned_alloc(64, total);
    size_t *off = malloc(sizeof *off * layers * pick);
    if (!buf || !off) { fprintf(stderr, "out of memory\n"); return 1; }
    for (size_t i = 0; i < total / 8; i++) ((uint64_t *)buf)[i] = next_random();
    for (size_t l = 0; l < layers; l++) {   /* about `pick` runs per layer, ascending */
        size_t c = 0;
        for (size_t i = 0; i < n_runs && c < pick; i++)
            if (next_random() % n_runs < pick * 11 / 10) off[l * pick + c++] = l * per_layer + i * seg;
        for (; c < pick; c++) off[l * pick + c] = off[l * pick + c - 1];
    }
    unsigned sink = 0;
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        const double t0 = now();
        for (size_t l = 0; l < layers; l++) {
            const size_t *o = off + l * pick;
#pragma omp parallel reduction(| : sink)
            {
                __m256i acc = _mm256_setzero_si256();
#pragma omp for schedule(dynamic, 8)
                for (size_t j = 0; j < pick; j++) {
                    const uint8_t *run = buf + o[j];
                    const char *next = (const char *)buf + o[j + 1 < pick ? j + 1 : j];
                    for (size_t c = 0; c < seg; c += 64) {
                        _mm_prefetch(next + c, _MM_HINT_NTA);
                        acc = _mm256_xor_si256(acc, _mm256_load_si256((const __m256i *)(run + c)));
                        acc = _mm256_xor_si256(acc, _mm256_load_si256((const __m256i *)(run + c + 32)));
                    }
                }
                sink |= (unsigned)_mm256_extract_epi32(acc, 0);
            }
        }
        const double t = (now() - t0) / layers;
        if (t < best) best = t;
    }
    printf("runs of %zu bytes, %d threads: %.1f GB/s%s\n", seg, omp_get_max_threads(), pick * seg / best / 1e9,
           sink == 0x12345678u ? " " : "");
    free(buf);
    free(off);
    return 0;
}
