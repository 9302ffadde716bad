#pragma once
// What every kernels/cuda header shares: the storage dtype of the tensors a launcher reads
// and writes (fp32, bf16 or fp16, chosen at run time), and error checks that name the call
// and its file:line. These headers hold host declarations only, so plain C++ code (the
// executor, the tests) includes them; the kernels live in the .cu files.
//
// Conventions of every launcher, as kernels/cpu: outputs first, shape comments on each
// buffer, nullable gradient outputs, `accumulate` adds into them; then the storage dtype
// and the stream the work is queued on. Nothing synchronises: results that the CPU twin
// returns (a loss, a norm, an overflow test) are written to device memory instead.
// Math and statistics run in fp32 whatever the storage dtype; 16-bit results round to
// nearest even. Buffers need no particular alignment; 16-byte aligned ones (the caching
// allocator's) take the vectorised paths.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/dtype.hpp"

namespace zp::kernels::cuda {

// A failed CUDA runtime or cuBLAS call, or a failed launch; what() names it and file:line.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(const std::string& what, const char* file, int line);

inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess)
    throw_cuda_error(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")", file,
                     line);
}

// fp32, bf16 or fp16; anything else throws std::invalid_argument naming `what`.
void require_float(DType dt, const char* what);

// The bytes the driver reports in use on the current device (cudaMemGetInfo: total - free).
inline std::int64_t driver_used_bytes() {
  std::size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", __FILE__, __LINE__);
  return static_cast<std::int64_t>(total - free);
}

}  // namespace zp::kernels::cuda

#define ZP_CUDA_CHECK(call) ::zp::kernels::cuda::check_cuda((call), #call, __FILE__, __LINE__)
// After every launch: a bad configuration or an earlier asynchronous fault surfaces here.
#define ZP_CUDA_CHECK_LAUNCH(kernel) ::zp::kernels::cuda::check_cuda(cudaGetLastError(), kernel, __FILE__, __LINE__)
