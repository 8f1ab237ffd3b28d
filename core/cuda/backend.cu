/* backend.cu: devices, the counting allocator, streams and copies; CUDA errors -> pi_status. */
#include "common.cuh"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

pi_status pi_cuda_fail(cudaError_t err, const char *what, const char *file, int line) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    pi_status st = PI_ERR_DEVICE;
    if (err == cudaErrorMemoryAllocation) st = PI_ERR_OUT_OF_MEMORY;
    else if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) st = PI_ERR_UNSUPPORTED;
    (void)cudaGetLastError();   /* clear a non-sticky error so the next call starts clean */
    return pi_fail(st, "GPU: %s: %s (%s at %s:%d)", cudaGetErrorName(err), cudaGetErrorString(err), what, base, line);
}

struct pi_cuda_stream { cudaStream_t s; };

cudaStream_t pi_cuda_raw_stream(pi_cuda_stream *s) { return s ? s->s : cudaStreamPerThread; }

/* ---- devices ---- */

int32_t pi_cuda_compiled(void) {
#if defined(PI_HIP)
    return PI_GPU_HIP;
#else
    return PI_GPU_CUDA;
#endif
}

int32_t pi_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

pi_status pi_cuda_device_info(int32_t device, pi_cuda_device_props *out) {
    if (!out) return pi_fail(PI_ERR_INVALID_ARG, "cuda_device_info: out is NULL");
    const int32_t n = pi_cuda_available();
    if (device < 0 || device >= n)
        return pi_fail(n ? PI_ERR_INVALID_ARG : PI_ERR_UNSUPPORTED, "GPU: device %d does not exist (%d found)",
                       (int)device, (int)n);
    cudaDeviceProp p;
    PI_CU(cudaGetDeviceProperties(&p, device));
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->device = device;
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->n_sm = p.multiProcessorCount;
    out->warp_size = p.warpSize;
    out->total_bytes = (int64_t)p.totalGlobalMem;
    int cur = 0;
    PI_CU(cudaGetDevice(&cur));
    PI_CU(cudaSetDevice(device));
    size_t fr = 0, tot = 0;
    const cudaError_t e = cudaMemGetInfo(&fr, &tot);
    PI_CU(cudaSetDevice(cur));
    if (e != cudaSuccess) return pi_cuda_fail(e, "cudaMemGetInfo", __FILE__, __LINE__);
    out->free_bytes = (int64_t)fr;
    return PI_OK;
}

pi_status pi_cuda_set_device(int32_t device) {
    const int32_t n = pi_cuda_available();
    if (device < 0 || device >= n)
        return pi_fail(n ? PI_ERR_INVALID_ARG : PI_ERR_UNSUPPORTED, "GPU: device %d does not exist (%d found)",
                       (int)device, (int)n);
    PI_CU(cudaSetDevice(device));
    return PI_OK;
}

pi_status pi_cuda_init(int32_t device) {
    PI_TRY(pi_cuda_set_device(device));
    PI_CU(cudaFree(0));   /* creates the context now rather than inside the first timed op */
    return PI_OK;
}

pi_status pi_cuda_mem_get_info(int64_t *free_bytes, int64_t *total_bytes) {
    if (pi_cuda_available() == 0) return pi_fail(PI_ERR_UNSUPPORTED, "GPU: no device");
    size_t fr = 0, tot = 0;
    PI_CU(cudaMemGetInfo(&fr, &tot));
    if (free_bytes) *free_bytes = (int64_t)fr;
    if (total_bytes) *total_bytes = (int64_t)tot;
    return PI_OK;
}

int32_t pi_cuda_type_supported(int32_t type) {
    return type == PI_TYPE_F32 || type == PI_TYPE_F16 || type == PI_TYPE_BF16 || type == PI_TYPE_Q4_0 ||
           type == PI_TYPE_Q8_0;
}

size_t pi_cuda_padded(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* ---- the counting allocator: every device byte the library holds is in `allocated` ---- */

typedef struct { void *ptr; size_t bytes; } pi_alloc_rec;

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static pi_alloc_rec *alloc_recs;
static size_t alloc_n, alloc_cap;
static int64_t allocated, peak;

pi_status pi_cuda_malloc(void **ptr, size_t bytes) {
    if (!ptr) return pi_fail(PI_ERR_INVALID_ARG, "cuda_malloc: ptr is NULL");
    *ptr = NULL;
    if (bytes == 0) bytes = 1;
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", bytes);
        return pi_cuda_fail(e, what, __FILE__, __LINE__);
    }
    pthread_mutex_lock(&alloc_lock);
    if (alloc_n == alloc_cap) {
        const size_t cap = alloc_cap ? alloc_cap * 2 : 64;
        pi_alloc_rec *r = (pi_alloc_rec *)realloc(alloc_recs, cap * sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&alloc_lock);
            (void)cudaFree(p);
            return pi_fail(PI_ERR_OUT_OF_MEMORY, "cuda_malloc: out of host memory");
        }
        alloc_recs = r;
        alloc_cap = cap;
    }
    alloc_recs[alloc_n].ptr = p;
    alloc_recs[alloc_n].bytes = bytes;
    alloc_n++;
    allocated += (int64_t)bytes;
    if (allocated > peak) peak = allocated;
    pthread_mutex_unlock(&alloc_lock);
    *ptr = p;
    return PI_OK;
}

void pi_cuda_free(void *ptr) {
    if (!ptr) return;
    pthread_mutex_lock(&alloc_lock);
    for (size_t i = alloc_n; i-- > 0;) {
        if (alloc_recs[i].ptr == ptr) {
            allocated -= (int64_t)alloc_recs[i].bytes;
            alloc_recs[i] = alloc_recs[--alloc_n];
            break;
        }
    }
    pthread_mutex_unlock(&alloc_lock);
    (void)cudaFree(ptr);
}

int64_t pi_cuda_allocated_bytes(void) {
    pthread_mutex_lock(&alloc_lock);
    const int64_t a = allocated;
    pthread_mutex_unlock(&alloc_lock);
    return a;
}

int64_t pi_cuda_peak_allocated_bytes(void) {
    pthread_mutex_lock(&alloc_lock);
    const int64_t p = peak;
    pthread_mutex_unlock(&alloc_lock);
    return p;
}

void pi_cuda_reset_peak(void) {
    pthread_mutex_lock(&alloc_lock);
    peak = allocated;
    pthread_mutex_unlock(&alloc_lock);
}

pi_status pi_cuda_host_alloc(void **ptr, size_t bytes) {
    if (!ptr) return pi_fail(PI_ERR_INVALID_ARG, "cuda_host_alloc: ptr is NULL");
    *ptr = NULL;
    PI_CU(cudaMallocHost(ptr, bytes ? bytes : 1));
    return PI_OK;
}

void pi_cuda_host_free(void *ptr) {
    if (ptr) (void)cudaFreeHost(ptr);
}

/* ---- streams and copies ---- */

pi_status pi_cuda_stream_create(pi_cuda_stream **out) {
    if (!out) return pi_fail(PI_ERR_INVALID_ARG, "cuda_stream_create: out is NULL");
    *out = NULL;
    pi_cuda_stream *s = (pi_cuda_stream *)calloc(1, sizeof *s);
    if (!s) return pi_fail(PI_ERR_OUT_OF_MEMORY, "cuda_stream_create: out of memory");
    const cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(s);
        return pi_cuda_fail(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
    }
    *out = s;
    return PI_OK;
}

void pi_cuda_stream_free(pi_cuda_stream *s) {
    if (!s) return;
    (void)cudaStreamDestroy(s->s);
    free(s);
}

pi_status pi_cuda_stream_sync(pi_cuda_stream *s) {
    PI_CU(cudaStreamSynchronize(pi_cuda_raw_stream(s)));
    return PI_OK;
}

pi_status pi_cuda_upload(pi_cuda_stream *s, void *dst, const void *src, size_t bytes) {
    if (bytes) PI_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, pi_cuda_raw_stream(s)));
    return PI_OK;
}

pi_status pi_cuda_download(pi_cuda_stream *s, void *dst, const void *src, size_t bytes) {
    if (bytes) PI_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, pi_cuda_raw_stream(s)));
    return PI_OK;
}

pi_status pi_cuda_copy_d2d(pi_cuda_stream *s, void *dst, const void *src, size_t bytes) {
    if (bytes) PI_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, pi_cuda_raw_stream(s)));
    return PI_OK;
}

pi_status pi_cuda_memset(pi_cuda_stream *s, void *dst, int value, size_t bytes) {
    if (bytes) PI_CU(cudaMemsetAsync(dst, value, bytes, pi_cuda_raw_stream(s)));
    return PI_OK;
}
