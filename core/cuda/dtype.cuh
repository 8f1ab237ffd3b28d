/* dtype.cuh: the device dtype traits. Every kernel that reads weights is written once, as a
 * template over one of these structs; adding a dtype means adding a struct and a case in
 * pi_cuda_dispatch_type(), never another kernel.
 *
 * A traits struct T provides:
 *   TYPE        the ggml type id
 *   QK          elements per unit: a row is an array of T::block_t, one unit each
 *   QUANT_ACT   true: activations are first quantized to q8_0 (as the CPU's vec_dot_type does),
 *               and act_t is a q8_0 block; false: act_t is QK floats
 *   dot(w, x)   dot product of one unit of weights with one unit of activations
 *   get(row, i) element i of a row as float (axpy, get_rows)
 *   put(row, i, v)  (float types only) store v as element i, rounded as the CPU's from_f32 (set_rows)
 *
 * F32/F16/BF16 come in two widths: QK = 1 (any row) and a vector width (16-byte loads) that
 * the dispatcher picks when rows and pointers are aligned for it.
 */
#ifndef PI_CUDA_DTYPE_CUH
#define PI_CUDA_DTYPE_CUH

#include "common.cuh"

struct pi_dblock_q4_0 { uint16_t d; uint8_t qs[16]; };
struct pi_dblock_q8_0 { uint16_t d; int8_t  qs[32]; };
static_assert(sizeof(pi_dblock_q4_0) == 18, "q4_0 block");
static_assert(sizeof(pi_dblock_q8_0) == 34, "q8_0 block");

__device__ __forceinline__ float pi_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t pi_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float pi_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* Round to nearest even, NaN kept quiet: the CPU's pi_f32_to_bf16. */
__device__ __forceinline__ uint16_t pi_f2bf(float f) {
    const uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64);
    return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

/* 4 bytes from 2-byte aligned memory (quant blocks are only 2-byte aligned). */
__device__ __forceinline__ int pi_load_i32_a2(const void *p) {
    const uint16_t *q = (const uint16_t *)p;
    return (int)((uint32_t)q[0] | ((uint32_t)q[1] << 16));
}

/* Sum of the 4 products of signed bytes of a and b, plus c. */
__device__ __forceinline__ int pi_dp4a(int a, int b, int c) {
#if !defined(PI_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#else
    const int8_t *x = (const int8_t *)&a, *y = (const int8_t *)&b;
    return c + x[0] * y[0] + x[1] * y[1] + x[2] * y[2] + x[3] * y[3];
#endif
}

template <int N> struct alignas(N * 4 >= 16 ? 16 : N * 4) pi_fvec { float v[N]; };

/* ---- float types ---- */

template <int QK_> struct pi_dt_f32 {
    static constexpr int TYPE = PI_TYPE_F32, QK = QK_;
    static constexpr bool QUANT_ACT = false;
    typedef pi_fvec<QK_> block_t;
    typedef pi_fvec<QK_> act_t;
    __device__ __forceinline__ static float dot(const block_t &w, const act_t &x) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < QK; i++) s += w.v[i] * x.v[i];
        return s;
    }
    __device__ __forceinline__ static float get(const void *row, int64_t i) { return ((const float *)row)[i]; }
    __device__ __forceinline__ static void put(void *row, int64_t i, float v) { ((float *)row)[i] = v; }
};

template <int QK_> struct pi_dt_f16 {
    static constexpr int TYPE = PI_TYPE_F16, QK = QK_;
    static constexpr bool QUANT_ACT = false;
    struct alignas(QK_ * 2 >= 16 ? 16 : QK_ * 2) block_t { uint16_t h[QK_]; };
    typedef pi_fvec<QK_> act_t;
    __device__ __forceinline__ static float dot(const block_t &w, const act_t &x) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < QK; i++) s += pi_h2f(w.h[i]) * x.v[i];
        return s;
    }
    __device__ __forceinline__ static float get(const void *row, int64_t i) {
        return pi_h2f(((const uint16_t *)row)[i]);
    }
    __device__ __forceinline__ static void put(void *row, int64_t i, float v) { ((uint16_t *)row)[i] = pi_f2h(v); }
};

template <int QK_> struct pi_dt_bf16 {
    static constexpr int TYPE = PI_TYPE_BF16, QK = QK_;
    static constexpr bool QUANT_ACT = false;
    struct alignas(QK_ * 2 >= 16 ? 16 : QK_ * 2) block_t { uint16_t h[QK_]; };
    typedef pi_fvec<QK_> act_t;
    __device__ __forceinline__ static float dot(const block_t &w, const act_t &x) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < QK; i++) s += pi_bf2f(w.h[i]) * x.v[i];
        return s;
    }
    __device__ __forceinline__ static float get(const void *row, int64_t i) {
        return pi_bf2f(((const uint16_t *)row)[i]);
    }
    __device__ __forceinline__ static void put(void *row, int64_t i, float v) { ((uint16_t *)row)[i] = pi_f2bf(v); }
};

/* ---- block quants (activations quantized to q8_0, integer dot per block, as the CPU) ---- */

struct pi_dt_q4_0 {
    static constexpr int TYPE = PI_TYPE_Q4_0, QK = 32;
    static constexpr bool QUANT_ACT = true;
    typedef pi_dblock_q4_0 block_t;
    typedef pi_dblock_q8_0 act_t;
    /* sum (q - 8) * y = sum q * y - 8 * sum y; low nibbles are elements 0..15, high 16..31 */
    __device__ __forceinline__ static float dot(const block_t &w, const act_t &x) {
        int sumi = 0, sumy = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int v = pi_load_i32_a2(w.qs + 4 * i);
            const int y0 = pi_load_i32_a2(x.qs + 4 * i), y1 = pi_load_i32_a2(x.qs + 16 + 4 * i);
            sumi = pi_dp4a(v & 0x0f0f0f0f, y0, sumi);
            sumi = pi_dp4a((v >> 4) & 0x0f0f0f0f, y1, sumi);
            sumy = pi_dp4a(0x01010101, y0, sumy);
            sumy = pi_dp4a(0x01010101, y1, sumy);
        }
        return (float)(sumi - 8 * sumy) * pi_h2f(w.d) * pi_h2f(x.d);
    }
    __device__ __forceinline__ static float get(const void *row, int64_t i) {
        const block_t *b = (const block_t *)row + i / 32;
        const int j = (int)(i % 32);
        const int q = j < 16 ? (b->qs[j] & 0x0f) : (b->qs[j - 16] >> 4);
        return (float)(q - 8) * pi_h2f(b->d);
    }
};

struct pi_dt_q8_0 {
    static constexpr int TYPE = PI_TYPE_Q8_0, QK = 32;
    static constexpr bool QUANT_ACT = true;
    typedef pi_dblock_q8_0 block_t;
    typedef pi_dblock_q8_0 act_t;
    __device__ __forceinline__ static float dot(const block_t &w, const act_t &x) {
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) sumi = pi_dp4a(pi_load_i32_a2(w.qs + 4 * i), pi_load_i32_a2(x.qs + 4 * i), sumi);
        return (float)sumi * pi_h2f(w.d) * pi_h2f(x.d);
    }
    __device__ __forceinline__ static float get(const void *row, int64_t i) {
        const block_t *b = (const block_t *)row + i / 32;
        return (float)b->qs[i % 32] * pi_h2f(b->d);
    }
};

/* ---- dispatch ----
 * Calls f(T{}) with the traits of `type`. `vec` asks for the vector width of the float types
 * (rows a multiple of 8 elements, 16-byte aligned); quant types ignore it. */
template <class F> static pi_status pi_cuda_dispatch_type(int32_t type, bool vec, F &&f) {
    switch (type) {
        case PI_TYPE_F32:  return vec ? f(pi_dt_f32<4>()) : f(pi_dt_f32<1>());
        case PI_TYPE_F16:  return vec ? f(pi_dt_f16<8>()) : f(pi_dt_f16<1>());
        case PI_TYPE_BF16: return vec ? f(pi_dt_bf16<8>()) : f(pi_dt_bf16<1>());
        case PI_TYPE_Q4_0: return f(pi_dt_q4_0());
        case PI_TYPE_Q8_0: return f(pi_dt_q8_0());
        default:
            return pi_fail(PI_ERR_UNSUPPORTED, "the GPU backend has no kernels for type %s yet", pi_type_name(type));
    }
}

/* Whether rows of K elements at `data` with byte stride nb1 can use the 16-byte vector width. */
static inline bool pi_cuda_vec_ok(int32_t type, const void *data, int64_t K, int64_t nb1) {
    if (type != PI_TYPE_F32 && type != PI_TYPE_F16 && type != PI_TYPE_BF16) return false;
    const int64_t qk = type == PI_TYPE_F32 ? 4 : 8;
    return K % qk == 0 && (uintptr_t)data % 16 == 0 && nb1 % 16 == 0;
}

#endif
