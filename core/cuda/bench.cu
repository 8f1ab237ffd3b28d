/* bench.cu: pi_cuda_bench, kernel timings on device-resident random data (tests/gpu/run_gpu_checks.sh). */
#include "dtype.cuh"

namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (uint32_t)x;
}

/* Random bytes, then the scale / exponent bits fixed so that every value is finite and small. */
__global__ void k_fill_weights(uint8_t *p, int64_t n, int32_t type, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)hash32(seed + (uint64_t)i);
}

__global__ void k_fix_weights(uint8_t *p, int64_t n_units, int32_t type) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_units; i += (int64_t)gridDim.x * blockDim.x) {
        switch (type) {
            case PI_TYPE_F32: ((uint32_t *)p)[i] &= 0xbcffffffu; break;                 /* |x| < 2^-6 */
            case PI_TYPE_F16: ((uint16_t *)p)[i] &= 0xa7ffu; break;
            case PI_TYPE_BF16: ((uint16_t *)p)[i] &= 0xbcffu; break;
            case PI_TYPE_Q4_0: ((pi_dblock_q4_0 *)p)[i].d = 0x1c00; break;               /* 2^-8 */
            case PI_TYPE_Q8_0: ((pi_dblock_q8_0 *)p)[i].d = 0x1c00; break;
        }
    }
}

__global__ void k_fill_uniform(float *p, int64_t n, float lo, float hi, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = lo + (hi - lo) * (float)(hash32(seed + (uint64_t)i) >> 8) * (1.0f / 16777216.0f);
}

__global__ void k_fill_f16(uint16_t *p, int64_t n, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = pi_f2h((float)(hash32(seed + (uint64_t)i) >> 8) * (1.0f / 16777216.0f) - 0.5f);
}

__global__ void k_iota_stride(int32_t *p, int64_t k, int64_t n) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < k) p[j] = (int32_t)(j * n / k);
}

struct Bufs {
    void *p[12] = {};
    int n = 0;
    ~Bufs() { for (int i = 0; i < n; i++) pi_cuda_free(p[i]); }
    pi_status get(size_t bytes, void **out) {
        PI_TRY(pi_cuda_malloc(&p[n], bytes ? bytes : 1));
        *out = p[n++];
        return PI_OK;
    }
};

pi_status weights(Bufs &b, int32_t type, int64_t K, int64_t N, uint64_t seed, pi_tensor *t) {
    const int64_t bytes = pi_row_bytes(type, K) * N;
    void *p;
    PI_TRY(b.get((size_t)bytes, &p));
    k_fill_weights<<<1024, 256>>>((uint8_t *)p, bytes, type, seed);
    PI_CU_LAUNCH("fill");
    const int64_t units = bytes / pi_type_block_bytes(type);
    k_fix_weights<<<1024, 256>>>((uint8_t *)p, units, type);
    PI_CU_LAUNCH("fix");
    int64_t ne[2] = { K, N };
    *t = pi_tensor_view(type, p, 2, ne);
    return PI_OK;
}

pi_status f32s(Bufs &b, int64_t ne0, int64_t ne1, float lo, float hi, uint64_t seed, pi_tensor *t) {
    void *p;
    PI_TRY(b.get((size_t)(ne0 * ne1) * sizeof(float), &p));
    k_fill_uniform<<<1024, 256>>>((float *)p, ne0 * ne1, lo, hi, seed);
    PI_CU_LAUNCH("fill_uniform");
    int64_t ne[2] = { ne0, ne1 };
    *t = pi_tensor_view(PI_TYPE_F32, p, 2, ne);
    return PI_OK;
}

}  // namespace

pi_status pi_cuda_bench(int32_t op, int32_t type, int64_t n_embd, int64_t n_ff, int64_t n_tokens, float hot_fraction,
                        float active_fraction, int32_t iters, pi_cuda_bench_result *out) {
    if (!out) return pi_fail(PI_ERR_INVALID_ARG, "cuda_bench: out is NULL");
    if (pi_cuda_available() == 0) return pi_fail(PI_ERR_UNSUPPORTED, "cuda_bench: no GPU device");
    if (n_embd < 32 || n_embd % 128 || n_ff < 32 || n_ff % 32 || n_tokens < 1 || n_tokens > 4096 || iters < 1)
        return pi_fail(PI_ERR_INVALID_ARG, "cuda_bench: n_embd (a multiple of 128), n_ff (of 32), n_tokens "
                                           "(1..4096) or iters out of range");
    if (!pi_cuda_type_supported(type))
        return pi_fail(PI_ERR_UNSUPPORTED, "cuda_bench: no GPU kernels for %s", pi_type_name(type));
    Bufs b;
    pi_tensor x, y;
    int64_t bytes = 0;
    void *scratch = NULL;
    /* the op to time, as a closure over the buffers */
    pi_tensor w, s, q, kc, vc, o;
    pi_sparse_ffn_weights fw;
    int32_t *bucket = NULL;
    float thr = 0.0f;
    int64_t k = 0;
    PI_TRY(f32s(b, n_embd, n_tokens, -1.0f, 1.0f, 11, &x));
    switch (op) {
        case PI_CUDA_BENCH_MUL_MAT:
            PI_TRY(weights(b, type, n_embd, n_ff, 1, &w));
            PI_TRY(f32s(b, n_ff, n_tokens, 0, 0, 2, &y));
            PI_TRY(b.get(pi_cuda_mul_mat_scratch(type, n_embd, n_tokens), &scratch));
            bytes = pi_row_bytes(type, n_embd) * n_ff;
            break;
        case PI_CUDA_BENCH_SPARSE_FFN: {
            k = (int64_t)((double)hot_fraction * (double)n_ff);
            if (k < 1) k = 1;
            if (k > n_ff) k = n_ff;
            memset(&fw, 0, sizeof fw);
            PI_TRY(weights(b, type, n_embd, k, 3, &fw.gate));
            PI_TRY(weights(b, type, n_embd, k, 4, &fw.up));
            PI_TRY(weights(b, type, n_embd, k, 5, &fw.down_t));
            PI_TRY(f32s(b, n_ff, n_tokens, 0.0f, 1.0f, 6, &s));   /* uniform scores: P(s >= thr) = active_fraction */
            thr = 1.0f - active_fraction;
            PI_TRY(f32s(b, n_embd, n_tokens, 0, 0, 7, &y));
            PI_TRY(b.get((size_t)k * sizeof(int32_t), (void **)&bucket));
            k_iota_stride<<<(unsigned)pi_ceil_div(k, 256), 256>>>(bucket, k, n_ff);
            PI_CU_LAUNCH("iota");
            PI_TRY(b.get(pi_cuda_sparse_ffn_scratch(&fw, n_embd, k, n_tokens), &scratch));
            bytes = (int64_t)(3.0 * (double)pi_row_bytes(type, n_embd) * (double)k * (double)active_fraction);
            break;
        }
        case PI_CUDA_BENCH_ATTENTION: {
            const int64_t H = n_embd / 128, n_kv = n_ff;
            int64_t ne3[3] = { 128, H, n_tokens }, nek[3] = { 128, H, n_kv };
            void *pq, *pk, *pv, *po;
            PI_TRY(b.get((size_t)(128 * H * n_tokens) * 4, &pq));
            PI_TRY(b.get((size_t)(128 * H * n_kv) * 2, &pk));
            PI_TRY(b.get((size_t)(128 * H * n_kv) * 2, &pv));
            PI_TRY(b.get((size_t)(128 * H * n_tokens) * 4, &po));
            k_fill_uniform<<<1024, 256>>>((float *)pq, 128 * H * n_tokens, -1.0f, 1.0f, 8);
            k_fill_f16<<<1024, 256>>>((uint16_t *)pk, 128 * H * n_kv, 9);
            k_fill_f16<<<1024, 256>>>((uint16_t *)pv, 128 * H * n_kv, 10);
            PI_CU_LAUNCH("fill");
            q = pi_tensor_view(PI_TYPE_F32, pq, 3, ne3);
            o = pi_tensor_view(PI_TYPE_F32, po, 3, ne3);
            kc = pi_tensor_view(PI_TYPE_F16, pk, 3, nek);
            vc = pi_tensor_view(PI_TYPE_F16, pv, 3, nek);
            PI_TRY(b.get(pi_cuda_attention_scratch(H, n_tokens, n_kv), &scratch));
            bytes = 2 * 128 * H * n_kv * 2;
            break;
        }
        default:
            return pi_fail(PI_ERR_INVALID_ARG, "cuda_bench: unknown op %d", op);
    }
    auto run = [&]() -> pi_status {
        switch (op) {
            case PI_CUDA_BENCH_MUL_MAT: return pi_cuda_mul_mat(NULL, &w, &x, &y, scratch);
            case PI_CUDA_BENCH_SPARSE_FFN:
                return pi_cuda_sparse_ffn(NULL, &fw, bucket, PI_ACT_RELU, PI_FFN_PAR, &x, &s, thr, &y, NULL, scratch);
            default: return pi_cuda_attention(NULL, &q, &kc, &vc, NULL, 0.088f, 0.0f, NULL, &o, scratch);
        }
    };
    PI_CU(cudaDeviceSynchronize());
    PI_TRY(run());   /* warm-up */
    cudaEvent_t e0, e1;
    PI_CU(cudaEventCreate(&e0));
    PI_CU(cudaEventCreate(&e1));
    pi_status st = PI_OK;
    if (cudaEventRecord(e0, cudaStreamPerThread) != cudaSuccess) st = pi_fail(PI_ERR_DEVICE, "cuda_bench: event record");
    for (int i = 0; st == PI_OK && i < iters; i++) st = run();
    float ms = 0.0f;
    if (st == PI_OK) {
        cudaError_t e = cudaEventRecord(e1, cudaStreamPerThread);
        if (e == cudaSuccess) e = cudaEventSynchronize(e1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
        if (e != cudaSuccess) st = pi_cuda_fail(e, "cuda_bench timing", __FILE__, __LINE__);
    }
    (void)cudaEventDestroy(e0);
    (void)cudaEventDestroy(e1);
    if (st != PI_OK) return st;
    out->ms_per_iter = (double)ms / iters;
    out->bytes_per_iter = bytes;
    out->weight_gbps = out->ms_per_iter > 0 ? (double)bytes / (out->ms_per_iter * 1e6) : 0.0;
    return PI_OK;
}
