/* gpu_smoke.c: a dependency-free GPU check (no Python needed): the main GPU ops against their CPU
 * twins through the public C API, then a few kernel timings. Built and run by run_gpu_checks.sh:
 *
 *   cc -O2 tests/gpu/gpu_smoke.c -Icore/include -Lbuild-cuda -lpowerinfer -Wl,-rpath,$PWD/build-cuda -lm
 *
 * `gpu_smoke --no-bench` runs the checks without the timings (for compute-sanitizer).
 * Exit status: 0 all passed, 1 a comparison failed, 77 no GPU (skipped). */
#include "powerinfer.h"
#include "powerinfer_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) {   /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float *rand_f32(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

static pi_tensor view(int32_t type, void *data, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2) {
    pi_tensor t;
    memset(&t, 0, sizeof t);
    t.type = type;
    t.n_dims = n_dims;
    t.data = data;
    t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = ne2; t.ne[3] = 1;
    t.nb[0] = pi_type_block_bytes(type);
    t.nb[1] = pi_row_bytes(type, ne0);
    t.nb[2] = t.nb[1] * ne1;
    t.nb[3] = t.nb[2] * ne2;
    return t;
}

/* rows x n f32 -> a buffer of `type` */
static void *encode(int32_t type, const float *x, int64_t rows, int64_t n) {
    const int64_t rb = pi_row_bytes(type, n);
    char *out = malloc((size_t)(rb * rows));
    for (int64_t r = 0; r < rows; r++) pi_quantize_row(type, x + r * n, out + r * rb, n);
    return out;
}

static double rel_err(const float *got, const float *ref, int64_t n) {
    double m = 1e-30, e = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
        const double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e)) e = d;   /* NaN counts as a failure */
    }
    return e / m;
}

static void report(const char *what, pi_status cpu_st, pi_status gpu_st, double err, double tol) {
    const int ok = cpu_st == PI_OK && gpu_st == PI_OK && err < tol;
    if (!ok) failures++;
    printf("%s %-34s rel_err %.3g (tol %.1g)%s%s\n", ok ? "PASS" : "FAIL", what, err, tol,
           gpu_st != PI_OK ? "  gpu: " : "", gpu_st != PI_OK ? pi_last_error() : "");
}

static const int32_t TYPES[] = { PI_TYPE_F32, PI_TYPE_F16, PI_TYPE_BF16, PI_TYPE_Q8_0, PI_TYPE_Q4_0 };

static void check_mul_mat(int32_t type, int64_t K, int64_t N, int64_t T) {
    float *wf = rand_f32(K * N, 1.0f), *x = rand_f32(K * T, 1.0f);
    void *w = encode(type, wf, N, K);
    float *ref = calloc((size_t)(N * T), 4), *out = calloc((size_t)(N * T), 4);
    pi_tensor tw = view(type, w, 2, K, N, 1), tx = view(PI_TYPE_F32, x, 2, K, T, 1);
    pi_tensor tr = view(PI_TYPE_F32, ref, 2, N, T, 1), to = view(PI_TYPE_F32, out, 2, N, T, 1);
    pi_status a = pi_op_mul_mat(NULL, &tw, &tx, &tr), b = pi_cuda_op_mul_mat(&tw, &tx, &to);
    char what[64];
    snprintf(what, sizeof what, "mul_mat %s %lldx%lld T=%lld", pi_type_name(type), (long long)K, (long long)N,
             (long long)T);
    report(what, a, b, rel_err(out, ref, N * T), 3e-5);
    free(wf); free(x); free(w); free(ref); free(out);
}

/* GPU hot rows + CPU cold rows (scores -inf) == CPU over every row */
static void check_ffn(int32_t type, int64_t E, int64_t F, int64_t T, int hot_every) {
    float *g = rand_f32(E * F, 0.06f), *u = rand_f32(E * F, 0.06f), *d = rand_f32(E * F, 0.06f);
    float *x = rand_f32(E * T, 1.0f), *s = rand_f32(F * T, 1.0f), *s_cold = malloc((size_t)(F * T) * 4);
    void *gq = encode(type, g, F, E), *uq = encode(type, u, F, E), *dq = encode(type, d, F, E);
    int32_t *bucket = malloc((size_t)F * 4);
    int64_t k = 0;
    for (int64_t i = 0; i < F; i++)
        if (i % hot_every == 0) bucket[k++] = (int32_t)i;
    const int64_t rb = pi_row_bytes(type, E);
    char *gh = malloc((size_t)(rb * k)), *uh = malloc((size_t)(rb * k)), *dh = malloc((size_t)(rb * k));
    for (int64_t j = 0; j < k; j++) {
        memcpy(gh + j * rb, (char *)gq + bucket[j] * rb, (size_t)rb);
        memcpy(uh + j * rb, (char *)uq + bucket[j] * rb, (size_t)rb);
        memcpy(dh + j * rb, (char *)dq + bucket[j] * rb, (size_t)rb);
    }
    memcpy(s_cold, s, (size_t)(F * T) * 4);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) s_cold[t * F + bucket[j]] = -INFINITY;
    pi_sparse_ffn_weights w = { .gate = view(type, gq, 2, E, F, 1), .up = view(type, uq, 2, E, F, 1),
                                .down_t = view(type, dq, 2, E, F, 1) };
    pi_sparse_ffn_weights wh = { .gate = view(type, gh, 2, E, k, 1), .up = view(type, uh, 2, E, k, 1),
                                 .down_t = view(type, dh, 2, E, k, 1) };
    float *full = calloc((size_t)(E * T), 4), *cold = calloc((size_t)(E * T), 4), *hot = calloc((size_t)(E * T), 4);
    float *whole = calloc((size_t)(E * T), 4);
    pi_tensor tx = view(PI_TYPE_F32, x, 2, E, T, 1), ts = view(PI_TYPE_F32, s, 2, F, T, 1);
    pi_tensor tsc = view(PI_TYPE_F32, s_cold, 2, F, T, 1);
    pi_tensor tf = view(PI_TYPE_F32, full, 2, E, T, 1), tc = view(PI_TYPE_F32, cold, 2, E, T, 1);
    pi_tensor th = view(PI_TYPE_F32, hot, 2, E, T, 1), tw = view(PI_TYPE_F32, whole, 2, E, T, 1);
    int64_t n_full = 0, n_cold = 0, n_hot = 0, n_whole = 0;
    pi_status a = pi_op_sparse_ffn(NULL, &w, PI_ACT_RELU, PI_FFN_PAR, &tx, &ts, 0.0f, &tf, &n_full);
    pi_status b = pi_op_sparse_ffn(NULL, &w, PI_ACT_RELU, PI_FFN_PAR, &tx, &tsc, 0.0f, &tc, &n_cold);
    pi_status c = pi_cuda_op_sparse_ffn_hot(&wh, bucket, F, PI_ACT_RELU, PI_FFN_PAR, &tx, &ts, 0.0f, &th, &n_hot);
    pi_status e = pi_cuda_op_sparse_ffn(&w, PI_ACT_RELU, PI_FFN_PAR, &tx, &ts, 0.0f, &tw, &n_whole);
    for (int64_t i = 0; i < E * T; i++) cold[i] += hot[i];
    char what[64];
    snprintf(what, sizeof what, "hybrid ffn %s T=%lld hot 1/%d", pi_type_name(type), (long long)T, hot_every);
    report(what, a == PI_OK ? b : a, c, rel_err(cold, full, E * T), 1e-4);
    if (n_cold + n_hot != n_full) { failures++; printf("FAIL n_active %lld + %lld != %lld\n", (long long)n_cold,
                                                       (long long)n_hot, (long long)n_full); }
    snprintf(what, sizeof what, "gpu ffn %s T=%lld", pi_type_name(type), (long long)T);
    report(what, a, e, rel_err(whole, full, E * T), 1e-4);
    if (e == PI_OK && n_whole != n_full) { failures++; printf("FAIL n_active %lld != %lld\n", (long long)n_whole,
                                                              (long long)n_full); }
    free(g); free(u); free(d); free(x); free(s); free(s_cold); free(gq); free(uq); free(dq); free(bucket);
    free(gh); free(uh); free(dh); free(full); free(cold); free(hot); free(whole);
}

static void check_small_ops(void) {
    const int64_t hd = 64, H = 8, Hkv = 2, T = 3, n_kv = 200;
    float *q = rand_f32(hd * H * T, 1.0f), *kf = rand_f32(hd * Hkv * n_kv, 1.0f), *vf = rand_f32(hd * Hkv * n_kv, 1.0f);
    void *k = encode(PI_TYPE_F16, kf, Hkv * n_kv, hd), *v = encode(PI_TYPE_F16, vf, Hkv * n_kv, hd);
    float *mask = calloc((size_t)(n_kv * T), 4);
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = n_kv - T + t + 1; c < n_kv; c++) mask[t * n_kv + c] = -INFINITY;
    float *ref = calloc((size_t)(hd * H * T), 4), *out = calloc((size_t)(hd * H * T), 4);
    pi_tensor tq = view(PI_TYPE_F32, q, 3, hd, H, T), tk = view(PI_TYPE_F16, k, 3, hd, Hkv, n_kv);
    pi_tensor tv = view(PI_TYPE_F16, v, 3, hd, Hkv, n_kv), tm = view(PI_TYPE_F32, mask, 2, n_kv, T, 1);
    pi_tensor tr = view(PI_TYPE_F32, ref, 3, hd, H, T), to = view(PI_TYPE_F32, out, 3, hd, H, T);
    report("attention f16 kv, gqa 8/2, T=3", pi_op_attention(NULL, &tq, &tk, &tv, &tm, 0.125f, &tr),
           pi_cuda_op_attention(&tq, &tk, &tv, &tm, 0.125f, &to), rel_err(out, ref, hd * H * T), 3e-5);
    int32_t pos[3] = { 0, 17, 4000 };
    report("rope neox", pi_op_rope(NULL, &tq, pos, 64, PI_ROPE_NEOX, 10000.0f, 1.0f, &tr),
           pi_cuda_op_rope(&tq, pos, 64, PI_ROPE_NEOX, 10000.0f, 1.0f, &to), rel_err(out, ref, hd * H * T), 2e-6);
    report("rms_norm", pi_op_rms_norm(NULL, &tq, NULL, 1e-5f, &tr), pi_cuda_op_rms_norm(&tq, NULL, 1e-5f, &to),
           rel_err(out, ref, hd * H * T), 2e-6);
    report("softmax", pi_op_softmax(NULL, &tq, &tr), pi_cuda_op_softmax(&tq, &to), rel_err(out, ref, hd * H * T), 2e-6);
    free(q); free(kf); free(vf); free(k); free(v); free(mask); free(ref); free(out);
}

static void bench(int32_t op, int32_t type, int64_t E, int64_t F, int64_t T, float hot, float active, const char *what) {
    pi_cuda_bench_result r;
    if (pi_cuda_bench(op, type, E, F, T, hot, active, 20, &r) != PI_OK) {
        printf("BENCH %-44s failed: %s\n", what, pi_last_error());
        failures++;
        return;
    }
    printf("BENCH %-44s %8.3f ms  %8.1f GB/s\n", what, r.ms_per_iter, r.weight_gbps);
}

int main(int argc, char **argv) {
    const int timings = !(argc > 1 && strcmp(argv[1], "--no-bench") == 0);   /* --no-bench: checks only */
    if (pi_cuda_compiled() == PI_GPU_NONE || pi_cuda_available() == 0) {
        printf("SKIP: %s\n", pi_cuda_compiled() == PI_GPU_NONE ? "library built without a GPU backend" : "no GPU device");
        return 77;
    }
    pi_cuda_device_props p;
    if (pi_cuda_device_info(0, &p) == PI_OK)
        printf("device: %s, cc %d.%d, %d SMs, %.1f GiB (%.1f free)\n", p.name, p.cc_major, p.cc_minor, p.n_sm,
               p.total_bytes / 1073741824.0, p.free_bytes / 1073741824.0);
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        check_mul_mat(TYPES[i], 4096, 300, 1);
        check_mul_mat(TYPES[i], 1024, 257, 9);
        check_ffn(TYPES[i], 512, 1536, 1, 3);
        check_ffn(TYPES[i], 512, 1536, 7, 2);
    }
    check_small_ops();
    const int64_t before = pi_cuda_allocated_bytes();
    if (timings) {
        bench(PI_CUDA_BENCH_MUL_MAT, PI_TYPE_F16, 4096, 11008, 1, 1, 1, "mul_mat f16 4096x11008 T=1");
        bench(PI_CUDA_BENCH_MUL_MAT, PI_TYPE_Q4_0, 4096, 11008, 1, 1, 1, "mul_mat q4_0 4096x11008 T=1");
        bench(PI_CUDA_BENCH_MUL_MAT, PI_TYPE_Q8_0, 4096, 11008, 1, 1, 1, "mul_mat q8_0 4096x11008 T=1");
        bench(PI_CUDA_BENCH_MUL_MAT, PI_TYPE_F16, 4096, 11008, 64, 1, 1, "mul_mat f16 4096x11008 T=64");
        bench(PI_CUDA_BENCH_SPARSE_FFN, PI_TYPE_F16, 4096, 11008, 1, 0.3f, 0.3f, "hot ffn f16 30% hot, 30% active T=1");
        bench(PI_CUDA_BENCH_SPARSE_FFN, PI_TYPE_Q4_0, 4096, 11008, 1, 0.3f, 0.3f, "hot ffn q4_0 30% hot, 30% active T=1");
        bench(PI_CUDA_BENCH_SPARSE_FFN, PI_TYPE_F16, 4096, 11008, 32, 0.3f, 0.3f, "hot ffn f16 30% hot, 30% active T=32");
        bench(PI_CUDA_BENCH_ATTENTION, PI_TYPE_F16, 4096, 4096, 1, 1, 1, "attention 32 heads, 4096 cells T=1");
    }
    if (pi_cuda_allocated_bytes() != before) {
        printf("FAIL device memory leaked: %lld bytes\n", (long long)(pi_cuda_allocated_bytes() - before));
        failures++;
    }
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
