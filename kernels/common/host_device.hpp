#pragma once
// Functions defined in headers that both backends compile: plain inline functions for the
// host compiler, __host__ __device__ ones when nvcc compiles them for the GPU as well.
#if defined(__CUDACC__)
#define ZP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ZP_HOST_DEVICE inline
#endif
