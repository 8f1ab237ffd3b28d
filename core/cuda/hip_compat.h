/*
 * hip_compat.h: lets the CUDA sources of core/cuda/ compile with hipcc for ROCm (-DPI_HIP=ON).
 * Only the runtime calls, types and intrinsics the backend uses are mapped.
 */
#ifndef PI_HIP_COMPAT_H
#define PI_HIP_COMPAT_H

#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>

#define cudaError_t                 hipError_t
#define cudaSuccess                 hipSuccess
#define cudaErrorMemoryAllocation   hipErrorOutOfMemory
#define cudaErrorNoDevice           hipErrorNoDevice
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaGetErrorString          hipGetErrorString
#define cudaGetErrorName            hipGetErrorName
#define cudaGetLastError            hipGetLastError

#define cudaDeviceProp              hipDeviceProp_t
#define cudaGetDeviceCount          hipGetDeviceCount
#define cudaGetDeviceProperties     hipGetDeviceProperties
#define cudaSetDevice               hipSetDevice
#define cudaGetDevice               hipGetDevice
#define cudaDeviceSynchronize       hipDeviceSynchronize
#define cudaFree                    hipFree
#define cudaMalloc                  hipMalloc
#define cudaMallocHost              hipHostMalloc
#define cudaFreeHost                hipHostFree
#define cudaMemGetInfo              hipMemGetInfo
#define cudaMemcpyAsync             hipMemcpyAsync
#define cudaMemsetAsync             hipMemsetAsync
#define cudaMemcpyHostToDevice      hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost      hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice    hipMemcpyDeviceToDevice

#define cudaStream_t                hipStream_t
#define cudaStreamCreateWithFlags   hipStreamCreateWithFlags
#define cudaStreamNonBlocking       hipStreamNonBlocking
#define cudaStreamDestroy           hipStreamDestroy
#define cudaStreamSynchronize       hipStreamSynchronize
#define cudaStreamPerThread         hipStreamPerThread

#define cudaEvent_t                 hipEvent_t
#define cudaEventCreate             hipEventCreate
#define cudaEventDestroy            hipEventDestroy
#define cudaEventRecord             hipEventRecord
#define cudaEventSynchronize        hipEventSynchronize
#define cudaEventElapsedTime        hipEventElapsedTime

/* Warp shuffles: the backend's reductions work on groups of 32 lanes (width 32), which is
 * correct on 64-wide wavefronts too. ROCm 5 has no *_sync variants. */
#define PI_SHFL_XOR(v, m) __shfl_xor((v), (m), 32)

#endif
