/* get_rows.cu: row gathers and scatters. get_rows: out[:, i] = dequant(table[:, ids[i]]) for every dtype
 * (embedding lookup, picking the rows that need logits); set_rows: dst[:, rows[t]] = src[:, t] converted
 * to dst's float type (storing a batch's K and V into their KV-cache cells). */
#include "dtype.cuh"

template <class T>
__global__ void k_get_rows(const char *__restrict__ table, int64_t t_nb1, int64_t E, const int32_t *__restrict__ ids,
                           char *__restrict__ out, int64_t o_nb1) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t i = blockIdx.y;
    if (c >= E) return;
    ((float *)(out + i * o_nb1))[c] = T::get(table + (int64_t)ids[i] * t_nb1, c);
}

pi_status pi_cuda_get_rows(pi_cuda_stream *s, const pi_tensor *table, const int32_t *ids_dev, int64_t n,
                           pi_tensor *out) {
    if (n < 1 || n > 65535) return pi_fail(PI_ERR_INVALID_ARG, "GPU get_rows: %lld rows (1..65535)", (long long)n);
    cudaStream_t st = pi_cuda_raw_stream(s);
    const int64_t E = table->ne[0];
    return pi_cuda_dispatch_type(table->type, false, [&](auto tr) -> pi_status {
        typedef decltype(tr) T;
        const dim3 grid((unsigned)pi_ceil_div(E, 256), (unsigned)n);
        k_get_rows<T><<<grid, 256, 0, st>>>((const char *)table->data, table->nb[1], E, ids_dev, (char *)out->data,
                                            out->nb[1]);
        PI_CU_LAUNCH("get_rows");
        return PI_OK;
    });
}

template <class T>
__global__ void k_set_rows(char *__restrict__ dst, int64_t d_nb1, const char *__restrict__ src, int64_t s_nb1,
                           int64_t E, const int32_t *__restrict__ rows) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t t = blockIdx.y;
    if (c >= E) return;
    T::put(dst + (int64_t)rows[t] * d_nb1, c, ((const float *)(src + t * s_nb1))[c]);
}

pi_status pi_cuda_set_rows(pi_cuda_stream *s, pi_tensor *dst, const pi_tensor *src, const int32_t *rows_dev) {
    const int64_t n = src->ne[1], E = src->ne[0];
    if (n < 1 || n > 65535) return pi_fail(PI_ERR_INVALID_ARG, "GPU set_rows: %lld rows (1..65535)", (long long)n);
    cudaStream_t st = pi_cuda_raw_stream(s);
    const dim3 grid((unsigned)pi_ceil_div(E, 256), (unsigned)n);
    switch (dst->type) {
        case PI_TYPE_F32:
            k_set_rows<pi_dt_f32<1>><<<grid, 256, 0, st>>>((char *)dst->data, dst->nb[1], (const char *)src->data,
                                                         src->nb[1], E, rows_dev);
            break;
        case PI_TYPE_F16:
            k_set_rows<pi_dt_f16<1>><<<grid, 256, 0, st>>>((char *)dst->data, dst->nb[1], (const char *)src->data,
                                                         src->nb[1], E, rows_dev);
            break;
        case PI_TYPE_BF16:
            k_set_rows<pi_dt_bf16<1>><<<grid, 256, 0, st>>>((char *)dst->data, dst->nb[1], (const char *)src->data,
                                                          src->nb[1], E, rows_dev);
            break;
        default:
            return pi_fail(PI_ERR_UNSUPPORTED, "GPU set_rows: destination type %s (f32, f16, bf16)",
                           pi_type_name(dst->type));
    }
    PI_CU_LAUNCH("set_rows");
    return PI_OK;
}
