#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

void throw_cuda_error(const std::string& what, const char* file, int line) {
  throw CudaError(what + " at " + file + ":" + std::to_string(line));
}

void require_float(DType dt, const char* what) {
  if (dt != DType::fp32 && dt != DType::bf16 && dt != DType::fp16)
    throw std::invalid_argument(std::string(what) + ": storage dtype " + std::string(dtype_name(dt)) +
                                " is not one of fp32, bf16, fp16");
}

void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_cuda_error(std::string(what) + ": " + cublasLtGetStatusName(status) + " (" +
                         cublasLtGetStatusString(status) + ")",
                     file, line);
}

Context::Impl::~Impl() {
  // Destructors do not throw: failures while freeing are ignored.
  cudnn.reset();
  for (auto& [key, plan] : plans) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.op);
  }
  if (lt != nullptr) cublasLtDestroy(lt);
  if (workspace != nullptr) cudaFree(workspace);
  if (scratch != nullptr) cudaFree(scratch);
  if (buffer != nullptr) cudaFree(buffer);
}

Context::Context(const ContextOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  ZP_CUDA_CHECK(cudaGetDevice(&s.device));
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&s.sm_count, cudaDevAttrMultiProcessorCount, s.device));
  s.allow_tf32 = options.allow_tf32;
  s.staged_min_work = options.staged_min_work;
  if (options.sdpa_backward_chunk != 16 && options.sdpa_backward_chunk != 32)
    throw std::invalid_argument("ContextOptions::sdpa_backward_chunk is " + std::to_string(options.sdpa_backward_chunk) +
                                "; allowed: 16, 32");
  s.sdpa_backward_chunk = options.sdpa_backward_chunk;
  s.sdpa_backward_one_pass = options.sdpa_backward_one_pass;
  if (options.sdpa_backward_atomic_dq && !options.sdpa_backward_one_pass)
    throw std::invalid_argument("ContextOptions::sdpa_backward_atomic_dq needs sdpa_backward_one_pass");
  s.sdpa_backward_atomic_dq = options.sdpa_backward_atomic_dq;
  s.sdpa_backward_kv_registers = options.sdpa_backward_kv_registers;
  if (options.layernorm_backward_warps < 0)
    throw std::invalid_argument("ContextOptions::layernorm_backward_warps is " +
                                std::to_string(options.layernorm_backward_warps) + "; allowed: 0 (built in) or more");
  s.layernorm_backward_warps = options.layernorm_backward_warps;
  s.sdpa_cudnn = options.sdpa_cudnn;
  s.bias_grad_epilogue = options.bias_grad_epilogue;
  ZP_CUBLAS_CHECK(cublasLtCreate(&s.lt));
  if (options.blas_workspace_bytes > 0) ZP_CUDA_CHECK(cudaMalloc(&s.workspace, options.blas_workspace_bytes));
  s.workspace_bytes = options.blas_workspace_bytes;
  if (options.scratch_bytes > 0) ZP_CUDA_CHECK(cudaMalloc(&s.scratch, options.scratch_bytes));
  s.scratch_bytes = options.scratch_bytes;
}

Context::~Context() = default;

int Context::device() const { return impl_->device; }
int Context::sm_count() const { return impl_->sm_count; }
std::size_t Context::device_bytes() const {
  return impl_->workspace_bytes + impl_->scratch_bytes + impl_->buffer_bytes;
}
std::size_t Context::scratch_bytes() const { return impl_->scratch_bytes; }
bool Context::allow_tf32() const { return impl_->allow_tf32; }
std::uint64_t Context::staged_products() const { return impl_->staged_products; }
bool Context::bias_grad_epilogue() const { return impl_->bias_grad_epilogue; }
std::uint64_t Context::bias_grad_epilogues() const { return impl_->bias_grad_epilogues; }
int Context::sdpa_backward_chunk() const { return impl_->sdpa_backward_chunk; }
bool Context::sdpa_backward_one_pass() const { return impl_->sdpa_backward_one_pass; }
bool Context::sdpa_backward_atomic_dq() const { return impl_->sdpa_backward_atomic_dq; }
bool Context::sdpa_backward_kv_registers() const { return impl_->sdpa_backward_kv_registers; }
std::int64_t Context::layernorm_backward_warps() const { return impl_->layernorm_backward_warps; }
bool Context::sdpa_cudnn() const { return impl_->sdpa_cudnn; }
std::shared_ptr<void>& Context::cudnn_state() { return impl_->cudnn; }
std::int64_t Context::driver_growth(Library l) const { return impl_->driver_growth[static_cast<int>(l)]; }
void Context::add_driver_growth(Library l, std::int64_t bytes) {
  impl_->driver_growth[static_cast<int>(l)] += std::max<std::int64_t>(bytes, 0);
}

void* Context::buffer(std::size_t bytes) {
  Impl& s = *impl_;
  if (bytes > s.buffer_bytes) {
    if (s.buffer != nullptr) {
      ZP_CUDA_CHECK(cudaFree(s.buffer));  // synchronises: no queued kernel still uses it
      s.buffer = nullptr;
      s.buffer_bytes = 0;
    }
    ZP_CUDA_CHECK(cudaMalloc(&s.buffer, bytes));
    s.buffer_bytes = bytes;
  }
  return s.buffer;
}

void* Context::scratch(std::size_t bytes, const char* what) {
  if (bytes > impl_->scratch_bytes)
    throw CudaError(std::string(what) + ": needs " + std::to_string(bytes) + " bytes of scratch, the Context has " +
                    std::to_string(impl_->scratch_bytes) + " (ContextOptions::scratch_bytes)");
  return impl_->scratch;
}

}  // namespace zp::kernels::cuda
