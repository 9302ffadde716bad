#pragma once
// The CPU device: host memory, kernels/cpu (fp32 arithmetic; Eigen GEMMs).
#include "exec/device.hpp"

namespace zp::exec {

class CpuDevice final : public Device {
 public:
  const char* name() const override { return "cpu"; }
  void forward(const models::Op& op, Operands& o) override;
  void backward(const models::Op& op, Operands& o) override;
  void adam_step(float* p, const float* g, float* m, float* v, std::int64_t n, std::int64_t step,
                 const kernels::cpu::AdamConfig& c) override;
  void sgd_step(float* p, const float* g, float* momentum, std::int64_t n, std::int64_t step,
                const kernels::cpu::SgdConfig& c) override;
  void scale(float* x, std::int64_t n, float factor) override;
  void accumulate(float* dst, const float* src, std::int64_t n) override;
};

}  // namespace zp::exec
