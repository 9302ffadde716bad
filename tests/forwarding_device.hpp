#pragma once
// A device for tests that does what the CPU device does (its `cpu` member, every call
// forwarded) and says whether the host addresses its memory as it is told: tests derive from
// it and override only the calls they count or check.
#include <cstddef>
#include <cstdint>
#include <span>

#include "exec/device.hpp"
#include "exec/device_cpu.hpp"

namespace zp::test {

class ForwardingDevice : public exec::Device {
 public:
  using Ref = exec::Ref;
  explicit ForwardingDevice(bool host_addressable = true) : host_(host_addressable) {}
  const char* name() const override { return "forwarding"; }
  bool host_addressable() const override { return host_; }
  void* allocate(std::size_t bytes) override { return cpu.allocate(bytes); }
  void release(void* p) override { cpu.release(p); }
  void forward(const models::Op& op, exec::Operands& o) override { cpu.forward(op, o); }
  void backward(const models::Op& op, exec::Operands& o) override { cpu.backward(op, o); }
  void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step, const kernels::cpu::AdamConfig& c,
                 float f) override {
    cpu.adam_step(p, g, m, v, n, step, c, f);
  }
  void sgd_step(Ref p, Ref g, Ref m, std::int64_t n, std::int64_t step, const kernels::cpu::SgdConfig& c,
                float f) override {
    cpu.sgd_step(p, g, m, n, step, c, f);
  }
  void copy(Ref d, Ref s, std::int64_t n) override { cpu.copy(d, s, n); }
  void add(Ref d, Ref s, std::int64_t n) override { cpu.add(d, s, n); }
  void fill(Ref d, std::int64_t n, float v) override { cpu.fill(d, n, v); }
  void scale(Ref x, std::int64_t n, float f) override { cpu.scale(x, n, f); }
  void norm_begin() override { cpu.norm_begin(); }
  void norm_add(std::span<const Ref> parts, std::int64_t n) override { cpu.norm_add(parts, n); }
  exec::NormStats norm_end() override { return cpu.norm_end(); }
  void upload(Ref d, const float* s, std::int64_t n) override { cpu.upload(d, s, n); }
  void download(float* d, Ref s, std::int64_t n) override { cpu.download(d, s, n); }
  void upload_bytes(void* d, const void* s, std::size_t b) override { cpu.upload_bytes(d, s, b); }
  void download_bytes(void* d, const void* s, std::size_t b) override { cpu.download_bytes(d, s, b); }
  void step_begin(std::size_t e) override { cpu.step_begin(e); }
  void event_begin(std::size_t i) override { cpu.event_begin(i); }
  void event_end(std::size_t i) override { cpu.event_end(i); }
  void step_times(std::span<double> s, std::span<double> t) override { cpu.step_times(s, t); }

  exec::CpuDevice cpu;

 private:
  bool host_ = true;
};

}  // namespace zp::test
