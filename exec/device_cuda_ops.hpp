#pragma once
// The CUDA device's op dispatch: each models::Fn's forward and backward through
// kernels/cuda, on the tensors as the program stores them (Operands' Refs: device
// memory, the program's dtype). exec/device_cuda.cpp owns the stream, the kernels'
// Context and the scratch these calls use.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "exec/device.hpp"
#include "kernels/cuda/context.cuh"

namespace zp::exec {

// What an op's kernels run with: the stream, the cuBLASLt/reduction Context, and device
// scratch outside the program's buffers (slot 0..3; the memory stays valid until the
// next call with the same slot, and is the op's own: freed by the device, not counted as
// a program buffer).
struct CudaOpEnv {
  kernels::cuda::Context* ctx = nullptr;
  cudaStream_t stream = nullptr;
  void* (*scratch)(void* self, std::size_t slot, std::size_t bytes) = nullptr;
  void* self = nullptr;
  void* get_scratch(std::size_t slot, std::size_t bytes) const { return scratch(self, slot, bytes); }
};

void cuda_forward(const CudaOpEnv& env, const models::Op& op, Operands& o);
void cuda_backward(const CudaOpEnv& env, const models::Op& op, Operands& o);

}  // namespace zp::exec
