/* qemu_count.c: the driver of bench/qemu_instructions.py. One op, `reps` times, on one thread, after a fixed setup,
 * so that the guest instructions qemu-user counts for reps = R minus those for reps = 0 are R times the op's own.
 *
 *   qemu_count mul_mat TYPE K N T REPS      y[N, T] = W[N, K] (TYPE: f32/f16/bf16 converted, others random bytes) x[K, T]
 *   qemu_count attention HD NKV REPS        one query, 4 heads sharing 2 KV heads, an f16 cache of NKV cells
 *
 * Inputs come from a fixed integer PRNG; prints the level used and a checksum of the outputs. */
#include "powerinfer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) {   /* [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(int32_t)(rng >> 40) / 8388608.0f - 1.0f;
}
static float *array(int64_t n) {
    float *a = malloc((size_t)n * sizeof(float));
    if (!a) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (int64_t i = 0; i < n; i++) a[i] = uniform();
    return a;
}
static pi_tensor tensor(int32_t type, int64_t ne0, int64_t ne1, int64_t ne2, void *data) {
    pi_tensor t = { type, ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1, { ne0, ne1, ne2, 1 }, { 0 }, data };
    t.nb[0] = pi_type_block_bytes(type);
    t.nb[1] = pi_row_bytes(type, ne0);
    t.nb[2] = t.nb[1] * ne1;
    t.nb[3] = t.nb[2] * ne2;
    return t;
}
static void *quantize(int32_t type, const float *src, int64_t n, int64_t rows) {
    const int64_t rb = pi_row_bytes(type, n);
    char *dst = malloc((size_t)(rb * rows));
    for (int64_t r = 0; dst && r < rows; r++)
        if (pi_quantize_row(type, src + r * n, dst + r * rb, n) != PI_OK) { fprintf(stderr, "%s\n", pi_last_error()); exit(1); }
    return dst;
}
/* Weights for the count: float types converted, quantized ones random bytes (the library's K-quant quantizer costs
 * minutes under single-stepped qemu, and no kernel branches on the values; the outputs are then meaningless) */
static void *raw_rows(int32_t type, const float *w, int64_t n, int64_t rows) {
    if (type == PI_TYPE_F32 || type == PI_TYPE_F16 || type == PI_TYPE_BF16) return quantize(type, w, n, rows);
    const int64_t bytes = pi_row_bytes(type, n) * rows;
    uint8_t *dst = malloc((size_t)bytes);
    for (int64_t i = 0; dst && i < bytes; i++) dst[i] = (uint8_t)(uniform() * 127.0f);
    return dst;
}
static int32_t type_named(const char *name) {
    for (int32_t t = 0; t < 64; t++) {
        const char *n = pi_type_name(t);
        if (n && strcmp(n, name) == 0) return t;
    }
    fprintf(stderr, "unknown type %s\n", name);
    exit(2);
}
static double checksum(const float *y, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += y[i];
    return s;
}

int main(int argc, char **argv) {
    if (pi_cpu_isa_env_error()) { fprintf(stderr, "%s\n", pi_cpu_isa_env_error()); return 1; }
    pi_threadpool *pool;
    if (pi_threadpool_create(1, &pool) != PI_OK) return 1;
    if (argc == 7 && strcmp(argv[1], "mul_mat") == 0) {
        const int32_t type = type_named(argv[2]);
        const int64_t K = atoll(argv[3]), N = atoll(argv[4]), T = atoll(argv[5]), reps = atoll(argv[6]);
        float *w = array(K * N), *x = array(K * T), *y = calloc((size_t)(N * T), sizeof(float));
        void *wq = raw_rows(type, w, K, N);
        pi_tensor tw = tensor(type, K, N, 1, wq), tx = tensor(PI_TYPE_F32, K, T, 1, x), ty = tensor(PI_TYPE_F32, N, T, 1, y);
        for (int64_t r = 0; r < reps; r++)
            if (pi_op_mul_mat(pool, &tw, &tx, &ty) != PI_OK) { fprintf(stderr, "%s\n", pi_last_error()); return 1; }
        printf("%s %.6g\n", pi_cpu_isa(), checksum(y, N * T));
    } else if (argc == 5 && strcmp(argv[1], "attention") == 0) {
        const int64_t hd = atoll(argv[2]), n_kv = atoll(argv[3]), reps = atoll(argv[4]), H = 4, Hkv = 2;
        float *q = array(hd * H), *kf = array(hd * Hkv * n_kv), *vf = array(hd * Hkv * n_kv), *mask = calloc((size_t)n_kv, 4);
        float *y = calloc((size_t)(hd * H), sizeof(float));
        void *k = quantize(PI_TYPE_F16, kf, hd, Hkv * n_kv), *v = quantize(PI_TYPE_F16, vf, hd, Hkv * n_kv);
        pi_tensor tq = tensor(PI_TYPE_F32, hd, H, 1, q), tk = tensor(PI_TYPE_F16, hd, Hkv, n_kv, k),
                  tv = tensor(PI_TYPE_F16, hd, Hkv, n_kv, v), tm = tensor(PI_TYPE_F32, n_kv, 1, 1, mask),
                  ty = tensor(PI_TYPE_F32, hd, H, 1, y);
        for (int64_t r = 0; r < reps; r++)
            if (pi_op_attention(pool, &tq, &tk, &tv, &tm, 0.125f, &ty) != PI_OK) { fprintf(stderr, "%s\n", pi_last_error()); return 1; }
        printf("%s %.6g\n", pi_cpu_isa(), checksum(y, hd * H));
    } else {
        fprintf(stderr, "usage: qemu_count mul_mat TYPE K N T REPS | attention HD NKV REPS\n");
        return 2;
    }
    pi_threadpool_free(pool);
    return 0;
}
