/* op_reference.c: a fixed set of ops on deterministic inputs; every output's raw bytes go to a file.
 *
 * The outputs of the scalar level are stored in tests/c/op_reference.bin; tests/test_cross_arch.py runs
 * this program at every ISA level the machine has (POWERINFER_ISA=<level>) and, cross-built for aarch64,
 * under qemu-aarch64, and compares with the stored bytes: the numeric contract (docs/design.md), checked
 * at C level and across architectures.
 *
 *   op_reference OUT.bin [n_threads]     (n_threads default 2; every thread count gives the same bits)
 *
 * OUT.bin: "PIOPREF1", then per case: uint32 name length, the name, uint32 count, count little-endian
 * float32 values. stdout: one line per case, "<name> <count> <fnv1a-64 of the bytes>", then the level.
 * Inputs come from an integer PRNG and exact integer-to-float conversions only (no libm), so they are the
 * same bits on every machine; an input of the wrong shape here is a failed call, which exits 1. */
#include "powerinfer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic inputs ------------------------------------------------------------------ */

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static uint64_t rng_next(void) {   /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [-amp, amp): a 24-bit integer times a power of two, exact in f32 for amp a power of two */
static float rng_uniform(float amp) { return ((float)(int32_t)(rng_next() >> 40) - 8388608.0f) * (amp / 8388608.0f); }
static float *rng_array(int64_t n, float amp, uint64_t seed) {
    float *a = malloc((size_t)n * sizeof(float));
    if (!a) { fprintf(stderr, "out of memory\n"); exit(1); }
    rng_seed(seed);
    for (int64_t i = 0; i < n; i++) a[i] = rng_uniform(amp);
    return a;
}

/* ---- tensors, output ------------------------------------------------------------------------ */

static pi_tensor tensor(int32_t type, int64_t ne0, int64_t ne1, int64_t ne2, void *data) {
    pi_tensor t = { type, ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1, { ne0, ne1, ne2, 1 }, { 0 }, data };
    const int64_t bs = pi_type_block_size(type);
    t.nb[0] = pi_type_block_bytes(type);
    t.nb[1] = pi_row_bytes(type, ne0);
    t.nb[2] = t.nb[1] * ne1;
    t.nb[3] = t.nb[2] * ne2;
    if (bs <= 0 || ne0 % bs) { fprintf(stderr, "tensor: %lld elements are no whole %s blocks\n", (long long)ne0, pi_type_name(type)); exit(1); }
    return t;
}

/* rows [n_rows][n] f32 -> one buffer of n_rows rows of `type` (pi_quantize_row, the library's own quantizer) */
static void *quantize(int32_t type, const float *src, int64_t n, int64_t n_rows) {
    const int64_t rb = pi_row_bytes(type, n);
    char *dst = malloc((size_t)(rb * n_rows));
    if (!dst) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (int64_t r = 0; r < n_rows; r++)
        if (pi_quantize_row(type, src + r * n, dst + r * rb, n) != PI_OK) {
            fprintf(stderr, "pi_quantize_row(%s): %s\n", pi_type_name(type), pi_last_error());
            exit(1);
        }
    return dst;
}

static void check(pi_status st, const char *what) {
    if (st != PI_OK) { fprintf(stderr, "%s: %s\n", what, pi_last_error()); exit(1); }
}

static FILE *out_file;

static void emit(const char *name, const float *v, int64_t n) {
    const uint32_t len = (uint32_t)strlen(name), count = (uint32_t)n;
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a 64 over the little-endian bytes */
    const unsigned char *b = (const unsigned char *)v;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ b[i]) * 0x100000001b3ull;
    fwrite(&len, 4, 1, out_file);
    fwrite(name, 1, len, out_file);
    fwrite(&count, 4, 1, out_file);
    fwrite(v, sizeof(float), (size_t)n, out_file);
    printf("%s %u %016llx\n", name, count, (unsigned long long)h);
}

/* ---- the cases --------------------------------------------------------------------------------- */

static pi_threadpool *pool;

static void case_mul_mat_k(int32_t type, int64_t K, int64_t T, const char *name);

static void case_mul_mat(int32_t type, int64_t T) {
    char name[64];
    snprintf(name, sizeof name, "mul_mat.%s.t%lld", pi_type_name(type), (long long)T);
    case_mul_mat_k(type, 512, T, name);   /* 2 super-blocks of 256 per row: every format, several blocks */
}

static void case_mul_mat_k(int32_t type, int64_t K, int64_t T, const char *name) {
    const int64_t N = 24;
    float *w = rng_array(K * N, 1.0f, 100 + (uint64_t)type);
    float *x = rng_array(K * T, 2.0f, 200 + (uint64_t)T);
    float *y = calloc((size_t)(N * T), sizeof(float));
    void *wq = quantize(type, w, K, N);
    pi_tensor tw = tensor(type, K, N, 1, wq), tx = tensor(PI_TYPE_F32, K, T, 1, x), ty = tensor(PI_TYPE_F32, N, T, 1, y);
    check(pi_op_mul_mat(pool, &tw, &tx, &ty), "mul_mat");
    emit(name, y, N * T);
    free(w); free(x); free(y); free(wq);
}

/* A type the library reads but does not write (the IQ types: no quantizer): N rows of K elements of PRNG bytes,
 * each block's leading fp16 scale set to +-2^-6 .. 2^-4 (finite, moderate); the dot products are exact integer sums
 * per block, so every level must give the stored bits. MXFP4 (which has a quantizer; its blocks of any bytes here):
 * the E8M0 byte e 118..133 (2^-10 .. 2^5), 0, 1 or 2 (2^-128, 2^-127, 2^-127: subnormal scales) in every 16th block. */
static void case_mul_mat_bytes(int32_t type, int64_t T) {
    const int64_t K = 512, N = 24, rb = pi_row_bytes(type, K), bb = pi_type_block_bytes(type);
    unsigned char *wq = malloc((size_t)(rb * N));
    float *x = rng_array(K * T, 2.0f, 200 + (uint64_t)T);
    float *y = calloc((size_t)(N * T), sizeof(float));
    if (!wq || !y) { fprintf(stderr, "out of memory\n"); exit(1); }
    rng_seed(500 + (uint64_t)type);
    for (int64_t i = 0; i < rb * N; i++) wq[i] = (unsigned char)(rng_next() >> 56);
    for (int64_t b = 0; b < rb * N / bb; b++) {   /* fp16 sign | exponent 9..11 (2^-6 .. 2^-4) | 10 random bits */
        const uint64_t r = rng_next();
        const uint16_t h = (uint16_t)((r >> 63) << 15 | (9 + (r >> 32) % 3) << 10 | (r & 0x3ff));
        if (type == PI_TYPE_MXFP4)
            wq[b * bb] = (unsigned char)(b % 16 == 5 ? (uint64_t)(b / 16 % 3) : 118 + (r >> 32) % 16);
        else if (type == PI_TYPE_IQ1_M)   /* d: the top nibbles of the four scale words (bytes 48..55) */
            for (int k = 0; k < 4; k++) {
                unsigned char *s = wq + b * bb + 48 + 2 * k;
                s[1] = (unsigned char)((s[1] & 0x0f) | (h >> 4 * k & 15) << 4);
            }
        else
            memcpy(wq + b * bb, &h, 2);
    }
    pi_tensor tw = tensor(type, K, N, 1, wq), tx = tensor(PI_TYPE_F32, K, T, 1, x), ty = tensor(PI_TYPE_F32, N, T, 1, y);
    check(pi_op_mul_mat(pool, &tw, &tx, &ty), "mul_mat");
    char name[64];
    snprintf(name, sizeof name, type == PI_TYPE_MXFP4 ? "mul_mat.%s.bytes.t%lld" : "mul_mat.%s.t%lld", pi_type_name(type),
             (long long)T);
    emit(name, y, N * T);
    free(wq); free(x); free(y);
}

/* An input-sparse matmul read from the file's own Q4_0 / Q4_K / Q6_K matrix laid out by input (pi_sparse_pack with
 * w.down: types q4_0c, q4_kc, q6_kc and their axpy_cols): out[E, t] = sum over |h_i| >= 0.5 of h_i column i. */
static void case_sparse_cols(int32_t type, int64_t T) {
    const int64_t E = 128, F = 512;   /* outputs (a multiple of 64), inputs (of 256) */
    float *d = rng_array(E * F, 1.0f, 950), *h = rng_array(F * T, 1.0f, 951);
    float *x = calloc((size_t)(E * T), sizeof(float)), *y = calloc((size_t)(E * T), sizeof(float));
    void *dq = quantize(type, d, F, E);
    pi_sparse_ffn_weights w = { .down = tensor(type, F, E, 1, dq) }, wp;
    const int64_t bytes = pi_sparse_pack_bytes(&w, PI_FFN_SEQ);
    if (bytes <= 0) { fprintf(stderr, "sparse_pack: no column layout for %s\n", pi_type_name(type)); exit(1); }
    void *pack = malloc((size_t)bytes);
    check(pi_sparse_pack(&w, PI_FFN_SEQ, pack, bytes, &wp), "sparse_pack");
    pi_tensor tx = tensor(PI_TYPE_F32, E, T, 1, x), th = tensor(PI_TYPE_F32, F, T, 1, h), ty = tensor(PI_TYPE_F32, E, T, 1, y);
    check(pi_op_sparse_ffn(pool, &wp, PI_ACT_RELU, PI_FFN_SEQ, &tx, &th, 0.5f, &ty, NULL), "sparse_ffn");
    char name[64];
    snprintf(name, sizeof name, "sparse_cols.%s.t%lld", pi_type_name(type), (long long)T);
    emit(name, y, E * T);
    free(d); free(h); free(x); free(y); free(dq); free(pack);
}

/* NaN inputs: every level keeps a NaN (its payload) through exp, SiLU/GELU and attention's softmax (a NaN in one K
 * row makes its cell's score NaN, and then the head's output). Quiet NaNs with payloads, both signs. */
static float nan_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void case_nan_unary(int32_t op, const char *name) {
    const int64_t D = 16;
    float *x = rng_array(D, 4.0f, 710), *y = calloc((size_t)D, sizeof(float));
    x[1] = nan_bits(0x7fc00001u);
    x[6] = nan_bits(0xffc12345u);
    x[13] = nan_bits(0x7fd00000u);   /* the tail (past the last 8 and 4) too */
    pi_tensor tx = tensor(PI_TYPE_F32, D, 1, 1, x), ty = tensor(PI_TYPE_F32, D, 1, 1, y);
    check(pi_op_unary(pool, op, &tx, &ty), "unary");
    emit(name, y, D);
    free(x); free(y);
}

static void case_nan_attention(void) {
    const int64_t hd = 64, H = 4, Hkv = 2, n_kv = 13;
    float *q = rng_array(hd * H, 1.0f, 810);
    float *kf = rng_array(hd * Hkv * n_kv, 1.0f, 811), *vf = rng_array(hd * Hkv * n_kv, 1.0f, 812);
    kf[(3 * Hkv + 0) * hd + 9] = nan_bits(0x7fc00042u);   /* cell 3, KV head 0: not x86's default NaN */
    kf[(5 * Hkv + 1) * hd + 7] = nan_bits(0xffc00042u);   /* cell 5, KV head 1: not Arm's */
    void *k = quantize(PI_TYPE_F16, kf, hd, Hkv * n_kv), *v = quantize(PI_TYPE_F16, vf, hd, Hkv * n_kv);
    float *mask = calloc((size_t)n_kv, sizeof(float)), *y = calloc((size_t)(hd * H), sizeof(float));
    pi_tensor tq = tensor(PI_TYPE_F32, hd, H, 1, q), tk = tensor(PI_TYPE_F16, hd, Hkv, n_kv, k),
              tv = tensor(PI_TYPE_F16, hd, Hkv, n_kv, v), tm = tensor(PI_TYPE_F32, n_kv, 1, 1, mask),
              ty = tensor(PI_TYPE_F32, hd, H, 1, y);
    check(pi_op_attention(pool, &tq, &tk, &tv, &tm, 0.125f, &ty), "attention");
    emit("nan.attention.f16", y, hd * H);
    free(q); free(kf); free(vf); free(k); free(v); free(mask); free(y);
}

/* Rounding ties: rows whose blocks hold -127 first and otherwise k + 0.5 (k an integer), so every quantizer's
 * scale is 1 and most products land exactly halfway: the activation quantizers round them to even (Q8_0S for Q8_0,
 * Q8_KM for Q4_K, Q8_K for Q6_K), the Q8_0 weight quantizer away from zero. */
static float *tie_rows(int64_t n, int64_t rows, uint64_t seed) {
    float *a = rng_array(n * rows, 1.0f, seed);
    for (int64_t i = 0; i < n * rows; i++)
        a[i] = i % 32 == 0 ? -127.0f : (float)(int)(a[i] * 100.0f) + 0.5f;
    return a;
}

static void case_ties(int32_t type, int weights_tied) {
    const int64_t K = 512, N = 8;
    float *w = weights_tied ? tie_rows(K, N, 300) : rng_array(K * N, 1.0f, 301);
    float *x = tie_rows(K, 1, 302);
    float *y = calloc((size_t)N, sizeof(float));
    void *wq = quantize(type, w, K, N);
    pi_tensor tw = tensor(type, K, N, 1, wq), tx = tensor(PI_TYPE_F32, K, 1, 1, x), ty = tensor(PI_TYPE_F32, N, 1, 1, y);
    check(pi_op_mul_mat(pool, &tw, &tx, &ty), "mul_mat");
    char name[64];
    snprintf(name, sizeof name, "ties.%s%s", pi_type_name(type), weights_tied ? ".weights" : "");
    emit(name, y, N);
    free(w); free(x); free(y); free(wq);
}

static void case_get_rows(int32_t type) {
    const int64_t K = 256, N = 8;
    const int32_t ids[3] = { 5, 0, 7 };
    float *w = rng_array(K * N, 1.0f, 300 + (uint64_t)type);
    float *y = calloc((size_t)(K * 3), sizeof(float));
    void *wq = quantize(type, w, K, N);
    pi_tensor tw = tensor(type, K, N, 1, wq), ty = tensor(PI_TYPE_F32, K, 3, 1, y);
    check(pi_op_get_rows(pool, &tw, ids, 3, &ty), "get_rows");
    char name[64];
    snprintf(name, sizeof name, "get_rows.%s", pi_type_name(type));
    emit(name, y, K * 3);
    free(w); free(y); free(wq);
}

static void case_norms(void) {
    const int64_t D = 320, T = 3;
    float *x = rng_array(D * T, 4.0f, 400), *g = rng_array(D, 1.0f, 401), *b = rng_array(D, 0.5f, 402);
    float *y = calloc((size_t)(D * T), sizeof(float));
    pi_tensor tx = tensor(PI_TYPE_F32, D, T, 1, x), tg = tensor(PI_TYPE_F32, D, 1, 1, g),
              tb = tensor(PI_TYPE_F32, D, 1, 1, b), ty = tensor(PI_TYPE_F32, D, T, 1, y);
    check(pi_op_rms_norm(pool, &tx, &tg, 1e-6f, &ty), "rms_norm");
    emit("rms_norm", y, D * T);
    check(pi_op_layer_norm(pool, &tx, &tg, &tb, 1e-5f, &ty), "layer_norm");
    emit("layer_norm", y, D * T);
    free(x); free(g); free(b); free(y);
}

static void case_rope(int32_t mode, const char *name) {
    const int64_t hd = 64, H = 4, T = 4;
    const int32_t pos[4] = { 0, 1, 37, 1000 };
    float *x = rng_array(hd * H * T, 2.0f, 500), *y = calloc((size_t)(hd * H * T), sizeof(float));
    pi_tensor tx = tensor(PI_TYPE_F32, hd, H, T, x), ty = tensor(PI_TYPE_F32, hd, H, T, y);
    check(pi_op_rope(pool, &tx, pos, 48, mode, 10000.0f, 1.0f, &ty), "rope");   /* 48 of 64 dims: partial rotary */
    emit(name, y, hd * H * T);
    free(x); free(y);
}

static void case_softmax(void) {
    const int64_t D = 100, R = 4;
    float *x = rng_array(D * R, 16.0f, 600), *y = calloc((size_t)(D * R), sizeof(float));
    for (int64_t i = 0; i < D; i += 3) x[D + i] = -INFINITY;   /* masked entries in row 1 */
    pi_tensor tx = tensor(PI_TYPE_F32, D, R, 1, x), ty = tensor(PI_TYPE_F32, D, R, 1, y);
    check(pi_op_softmax(pool, &tx, &ty), "softmax");
    emit("softmax", y, D * R);
    free(x); free(y);
}

/* expf(-63.09946) (bits 0xc27c65d9): glibc 2.36 rounds it to 0x11fa2993 on x86-64 with FMA (its __expf_fma
 * variant) and to 0x11fa2992, the correctly rounded value, on aarch64 and on x86-64 without FMA: the one
 * input in [-104, 0) where they differ. Softmax hands it through unchanged (the row sum rounds to 1), so
 * this case is 1 ulp apart across those platforms (tests/test_cross_arch.py, LIBM_ULPS). */
static void case_softmax_libm(void) {
    const uint32_t hard = 0xc27c65d9u;
    float x[2] = { 0.0f, 0.0f }, y[2];
    memcpy(&x[1], &hard, 4);
    pi_tensor tx = tensor(PI_TYPE_F32, 2, 1, 1, x), ty = tensor(PI_TYPE_F32, 2, 1, 1, y);
    check(pi_op_softmax(pool, &tx, &ty), "softmax");
    emit("softmax.libm_expf", y, 2);
}

static void case_unary(int32_t op, const char *name) {
    const int64_t D = 256, R = 4;   /* [-16, 16): both tails, and the region around 0 */
    float *x = rng_array(D * R, 16.0f, 700), *y = calloc((size_t)(D * R), sizeof(float));
    x[0] = 0.0f; x[1] = -0.0f; x[2] = 100.0f; x[3] = -100.0f;
    pi_tensor tx = tensor(PI_TYPE_F32, D, R, 1, x), ty = tensor(PI_TYPE_F32, D, R, 1, y);
    check(pi_op_unary(pool, op, &tx, &ty), "unary");
    emit(name, y, D * R);
    free(x); free(y);
}

static void case_attention(int64_t T) {
    const int64_t hd = 64, H = 4, Hkv = 2, n_kv = 13;
    float *q = rng_array(hd * H * T, 1.0f, 800 + (uint64_t)T);
    float *kf = rng_array(hd * Hkv * n_kv, 1.0f, 801), *vf = rng_array(hd * Hkv * n_kv, 1.0f, 802);
    void *k = quantize(PI_TYPE_F16, kf, hd, Hkv * n_kv), *v = quantize(PI_TYPE_F16, vf, hd, Hkv * n_kv);
    float *mask = malloc((size_t)(n_kv * T) * sizeof(float)), *y = calloc((size_t)(hd * H * T), sizeof(float));
    for (int64_t t = 0; t < T; t++)   /* causal: token t of the batch sees cells 0 .. n_kv - T + t */
        for (int64_t c = 0; c < n_kv; c++) mask[t * n_kv + c] = c <= n_kv - T + t ? 0.0f : -INFINITY;
    pi_tensor tq = tensor(PI_TYPE_F32, hd, H, T, q), tk = tensor(PI_TYPE_F16, hd, Hkv, n_kv, k),
              tv = tensor(PI_TYPE_F16, hd, Hkv, n_kv, v), tm = tensor(PI_TYPE_F32, n_kv, T, 1, mask),
              ty = tensor(PI_TYPE_F32, hd, H, T, y);
    check(pi_op_attention(pool, &tq, &tk, &tv, &tm, 0.125f, &ty), "attention");
    char name[64];
    snprintf(name, sizeof name, "attention.f16.t%lld", (long long)T);
    emit(name, y, hd * H * T);
    free(q); free(kf); free(vf); free(k); free(v); free(mask); free(y);
}

static void case_sparse_ffn(int32_t type, int32_t gate_mode, int32_t act, const char *mode_name, int packed) {
    const int64_t E = 256, F = 64, T = 3;
    float *g = rng_array(E * F, 1.0f, 900), *u = rng_array(E * F, 1.0f, 901), *d = rng_array(E * F, 1.0f, 902);
    float *x = rng_array(E * T, 1.0f, 903), *scores = rng_array(F * T, 1.0f, 904);
    float *y = calloc((size_t)(E * T), sizeof(float));
    void *gq = quantize(type, g, E, F), *uq = quantize(type, u, E, F), *dq = quantize(type, d, E, F);
    pi_sparse_ffn_weights w = { .gate = tensor(type, E, F, 1, gate_mode == PI_FFN_SEQ ? NULL : gq),
                                .up = tensor(type, E, F, 1, uq), .down_t = tensor(type, E, F, 1, dq) };
    void *pack = NULL;
    if (packed) {
        const int64_t bytes = pi_sparse_pack_bytes(&w, gate_mode);
        if (bytes <= 0) { fprintf(stderr, "sparse_pack: no packed layout for %s\n", pi_type_name(type)); exit(1); }
        pack = malloc((size_t)bytes);
        pi_sparse_ffn_weights wp;
        check(pi_sparse_pack(&w, gate_mode, pack, bytes, &wp), "sparse_pack");
        w = wp;
    }
    pi_tensor tx = tensor(PI_TYPE_F32, E, T, 1, x), ts = tensor(PI_TYPE_F32, F, T, 1, scores),
              ty = tensor(PI_TYPE_F32, E, T, 1, y);
    int64_t n_active = 0;
    check(pi_op_sparse_ffn(pool, &w, act, gate_mode, &tx, &ts, 0.0f, &ty, &n_active), "sparse_ffn");
    char name[64];
    snprintf(name, sizeof name, "sparse_ffn.%s.%s%s", pi_type_name(type), mode_name, packed ? ".packed" : "");
    emit(name, y, E * T);
    free(g); free(u); free(d); free(x); free(scores); free(y); free(gq); free(uq); free(dq); free(pack);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s OUT.bin [n_threads]\n", argv[0]); return 2; }
    const int n_threads = argc > 2 ? atoi(argv[2]) : 2;
    if (pi_cpu_isa_env_error()) { fprintf(stderr, "%s\n", pi_cpu_isa_env_error()); return 1; }
    out_file = fopen(argv[1], "wb");
    if (!out_file) { perror(argv[1]); return 1; }
    fwrite("PIOPREF1", 1, 8, out_file);
    check(pi_threadpool_create(n_threads, &pool), "threadpool");

    const int32_t types[] = { PI_TYPE_F32, PI_TYPE_F16, PI_TYPE_BF16, PI_TYPE_Q4_0, PI_TYPE_Q8_0, PI_TYPE_Q4_K, PI_TYPE_Q6_K,
                              PI_TYPE_Q4_1, PI_TYPE_Q5_0, PI_TYPE_Q5_1, PI_TYPE_Q2_K, PI_TYPE_Q3_K, PI_TYPE_Q5_K };
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        case_mul_mat(types[i], 1);
        case_mul_mat(types[i], 9);
    }
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) case_mul_mat(types[i], 17);   /* AMX tiles: 16 + 1 */
    case_get_rows(PI_TYPE_Q4_K);
    case_get_rows(PI_TYPE_Q6_K);
    case_norms();
    case_rope(PI_ROPE_NORMAL, "rope.normal");
    case_rope(PI_ROPE_NEOX, "rope.neox");
    case_softmax();
    case_softmax_libm();
    case_unary(PI_UNARY_SILU, "unary.silu");
    case_unary(PI_UNARY_GELU, "unary.gelu");
    case_attention(1);
    case_attention(4);
    case_sparse_ffn(PI_TYPE_Q4_0, PI_FFN_PAR, PI_ACT_SILU, "par.silu", 0);
    case_sparse_ffn(PI_TYPE_Q4_0, PI_FFN_PAR, PI_ACT_SILU, "par.silu", 1);
    case_sparse_ffn(PI_TYPE_Q8_0, PI_FFN_SYM, PI_ACT_RELU, "sym.relu", 0);
    case_sparse_ffn(PI_TYPE_F16, PI_FFN_SEQ, PI_ACT_GELU, "seq.gelu", 0);
    const int32_t read_only[] = { PI_TYPE_IQ4_NL, PI_TYPE_IQ4_XS, PI_TYPE_IQ3_XXS, PI_TYPE_IQ3_S, PI_TYPE_IQ2_XXS,
                                  PI_TYPE_IQ2_XS, PI_TYPE_IQ2_S, PI_TYPE_IQ1_S, PI_TYPE_IQ1_M };
    for (size_t i = 0; i < sizeof read_only / sizeof *read_only; i++)
        for (int64_t T = 1; T <= 17; T += 8) case_mul_mat_bytes(read_only[i], T);   /* 1, 9, 17 tokens */
    case_ties(PI_TYPE_Q8_0, 0);
    case_ties(PI_TYPE_Q8_0, 1);
    case_ties(PI_TYPE_Q4_K, 0);
    case_ties(PI_TYPE_Q6_K, 0);
    case_unary(PI_UNARY_RELU, "unary.relu");
    case_nan_unary(PI_UNARY_SILU, "nan.unary.silu");
    case_nan_unary(PI_UNARY_GELU, "nan.unary.gelu");
    case_nan_attention();
    const int32_t col_types[] = { PI_TYPE_Q4_0, PI_TYPE_Q4_K, PI_TYPE_Q6_K };
    for (size_t i = 0; i < sizeof col_types / sizeof *col_types; i++) {
        case_sparse_cols(col_types[i], 1);
        case_sparse_cols(col_types[i], 3);
    }
    /* rows of 11 blocks of 32 (a tail after 8 blocks; f16: 4 elements after the last 8) and 7 tokens (8-row kernel
     * calls of 7: token pairs with an odd one left, a pass of 4 tokens and one of 3) */
    const int32_t block_types[] = { PI_TYPE_F16, PI_TYPE_BF16, PI_TYPE_Q4_0, PI_TYPE_Q8_0, PI_TYPE_Q4_1, PI_TYPE_Q5_0,
                                    PI_TYPE_Q5_1 };
    for (size_t i = 0; i < sizeof block_types / sizeof *block_types; i++) {
        const int32_t t = block_types[i];
        const int64_t K = t == PI_TYPE_F16 || t == PI_TYPE_BF16 ? 356 : 352;
        char name[64];
        snprintf(name, sizeof name, "mul_mat.%s.k%lld.t7", pi_type_name(t), (long long)K);
        case_mul_mat_k(t, K, 7, name);
    }
    const int32_t k_types[] = { PI_TYPE_Q2_K, PI_TYPE_Q3_K, PI_TYPE_Q4_K, PI_TYPE_Q5_K, PI_TYPE_Q6_K };
    for (size_t i = 0; i < sizeof k_types / sizeof *k_types; i++) case_mul_mat(k_types[i], 7);   /* passes of 4 and 3 */
    for (size_t i = 0; i < sizeof read_only / sizeof *read_only; i++) case_mul_mat_bytes(read_only[i], 7);
    /* MXFP4 (gpt-oss's experts), after the cases above so that they keep their places: quantized rows at 1, 9, 17
     * and 7 tokens, rows of 11 blocks, PRNG blocks (subnormal scales among them), get_rows */
    for (int64_t T = 1; T <= 17; T += 8) case_mul_mat(PI_TYPE_MXFP4, T);
    case_mul_mat(PI_TYPE_MXFP4, 7);
    case_mul_mat_k(PI_TYPE_MXFP4, 352, 7, "mul_mat.mxfp4.k352.t7");
    for (int64_t T = 1; T <= 17; T += 8) case_mul_mat_bytes(PI_TYPE_MXFP4, T);
    case_mul_mat_bytes(PI_TYPE_MXFP4, 7);
    case_get_rows(PI_TYPE_MXFP4);

    pi_threadpool_free(pool);
    if (fclose(out_file) != 0) { perror(argv[1]); return 1; }
    printf("isa %s\n", pi_cpu_isa());
    return 0;
}
