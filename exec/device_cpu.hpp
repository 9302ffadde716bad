#pragma once
// The CPU device: host memory, kernels/cpu (fp32 arithmetic; Eigen GEMMs).
#include <chrono>
#include <vector>

#include "exec/device.hpp"

namespace zp::exec {

class CpuDevice final : public Device {
 public:
  const char* name() const override { return "cpu"; }
  bool host_addressable() const override { return true; }
  void* allocate(std::size_t bytes) override;
  void release(void* p) override;
  void forward(const models::Op& op, Operands& o) override;
  void backward(const models::Op& op, Operands& o) override;
  void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step, const kernels::cpu::AdamConfig& c,
                 float grad_factor) override;
  void sgd_step(Ref p, Ref g, Ref momentum, std::int64_t n, std::int64_t step, const kernels::cpu::SgdConfig& c,
                float grad_factor) override;
  void copy(Ref dst, Ref src, std::int64_t n) override;
  void add(Ref dst, Ref src, std::int64_t n) override;
  void fill(Ref dst, std::int64_t n, float value) override;
  void scale(Ref x, std::int64_t n, float factor) override;
  void norm_begin() override { norm_ = {}; }
  void norm_add(std::span<const Ref> parts, std::int64_t n) override;
  NormStats norm_end() override { return norm_; }
  void upload(Ref dst, const float* src, std::int64_t n) override;
  void download(float* dst, Ref src, std::int64_t n) override;
  void upload_bytes(void* dst, const void* src, std::size_t bytes) override;
  void download_bytes(void* dst, const void* src, std::size_t bytes) override;
  void step_begin(std::size_t events) override;
  void event_begin(std::size_t index) override;
  void event_end(std::size_t index) override;
  void step_times(std::span<double> seconds, std::span<double> starts) override;

 private:
  NormStats norm_;
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_;
  std::vector<Clock::time_point> begin_, end_;
  // fp32 copies of 16-bit optimizer operands
  std::vector<float> tmp_[4];
};

}  // namespace zp::exec
