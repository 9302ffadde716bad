#pragma once
// Optimizer steps on flat fp32 partitions (kernels/cpu/optimizer.hpp's twins): the same
// fp32 operations in the same order with no fused multiply-adds, so an fp32 partition
// updates to the same bits as on the CPU. The multi-tensor forms update many partitions in
// one launch (a table of (tensor, chunk) per block, as apex's multi_tensor_apply), can
// unscale the gradients by a factor held on the device, skip the whole step when a device
// flag says so (an fp16 overflow, without reading it on the host), and write the 16-bit
// copy of the updated parameters in the same pass.
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/optimizer.hpp"
#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

using AdamConfig = cpu::AdamConfig;
using SgdConfig = cpu::SgdConfig;

// One Adam / AdamW step; `step` is the 1-based count including this step. The gradient is
// g * grad_factor, rounded to fp32 (the bits of scale_inplace(g, grad_factor) first, without
// its pass over g; g is not written).
void adam_step(float* p,        // (n) parameters, updated
               const float* g,  // (n) gradients
               float* m,        // (n) exp_avg, updated
               float* v,        // (n) exp_avg_sq, updated
               std::int64_t n, std::int64_t step, const AdamConfig& cfg, cudaStream_t stream,
               float grad_factor = 1.0f);

// One torch.optim.SGD step; buf may be nullptr when momentum == 0. grad_factor as adam_step's.
void sgd_step(float* p,        // (n) parameters, updated
              const float* g,  // (n) gradients
              float* buf,      // (n) momentum buffer, updated (or nullptr)
              std::int64_t n, std::int64_t step, const SgdConfig& cfg, cudaStream_t stream,
              float grad_factor = 1.0f);

// What the multi-tensor steps may do besides the update.
struct StepOptions {
  const float* grad_scale = nullptr;  // device scalar: g * (*grad_scale) is the gradient (nullptr: 1)
  float grad_factor = 1.0f;           // host scalar: g * grad_factor is the gradient (not with grad_scale)
  const int* skip = nullptr;          // device flag: nonzero skips the step entirely (nullptr: never)
  DType p16_dtype = DType::bf16;      // dtype of the tensors' p16 copies
};

struct AdamTensor {
  float* p = nullptr;        // (n)
  const float* g = nullptr;  // (n)
  float* m = nullptr;        // (n)
  float* v = nullptr;        // (n)
  void* p16 = nullptr;       // (n) in StepOptions::p16_dtype, written from the new p; or nullptr
  std::int64_t n = 0;
};
void adam_step_multi(const AdamTensor* tensors, std::size_t count, std::int64_t step, const AdamConfig& cfg,
                     const StepOptions& options, cudaStream_t stream);

struct SgdTensor {
  float* p = nullptr;        // (n)
  const float* g = nullptr;  // (n)
  float* buf = nullptr;      // (n), or nullptr when momentum == 0
  void* p16 = nullptr;       // (n), or nullptr
  std::int64_t n = 0;
};
void sgd_step_multi(const SgdTensor* tensors, std::size_t count, std::int64_t step, const SgdConfig& cfg,
                    const StepOptions& options, cudaStream_t stream);

// x *= alpha (gradient unscaling, clipping by a factor); the _device form reads alpha from
// device memory.
void scale_inplace(void* x,  // (n)
                   std::int64_t n, float alpha, DType dt, cudaStream_t stream);
void scale_inplace_device(void* x,  // (n)
                          std::int64_t n, const float* alpha, DType dt, cudaStream_t stream);

// found[0] = 1 when some element is ±inf or NaN (the fp16 loss-scale overflow check, on the
// device). accumulate=false first sets found[0] = 0; true keeps an earlier 1, so several
// buffers can be checked into one flag.
void has_inf_or_nan(int* found,     // (1) on the device
                    const void* x,  // (n)
                    std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
