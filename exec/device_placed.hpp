#pragma once
// A device whose memory the host does not address (a GPU), joined with the host for the
// program's host-placed buffers (ZeRO-Offload: the fp32 master partition, its optimizer
// states and the fp32 gradient partition in host memory, the optimizer step on the CPU as
// DeepSpeed's CPU Adam runs it). Every call goes where its operands live:
//
//   - ops (forward/backward) and the device's own buffers: the device;
//   - optimizer steps, fills, scales and norms of host buffers: the CPU device;
//   - a copy or add between the two: moved through the device's transfers (download /
//     upload, converting to and from fp32 on the device) in chunks of at most
//     kChunkElements, so the device's staging memory stays bounded whatever the partition.
//
// Which memory is whose is decided by address: everything the device allocated (its
// segments) is the device's, the rest is the host's. Nothing here decides a placement: the
// program does (zero::Buffer::placement), and the allocator follows it.
//
// Timing: an event that did host work (a host-routed call or a transfer) is timed on the
// host's clock: the device is drained before its first host work (untimed) and at its end,
// so its seconds are the transfers, the CPU's work and the device work queued after them;
// its start is on the same step clock as the device's events.
#include <chrono>
#include <cstddef>
#include <map>
#include <vector>

#include "exec/device.hpp"
#include "exec/device_cpu.hpp"
#include "zero/program.hpp"

namespace zp::exec {

// Whether a program runs on a GPU through a PlacedDevice: it has host buffers (offload).
bool runs_placed(const zero::Program& p);

class PlacedDevice final : public Device {
 public:
  static constexpr std::int64_t kChunkElements = std::int64_t{1} << 24;  // 64 MiB of fp32 per transfer

  explicit PlacedDevice(Device& device) : dev_(device) {}

  const char* name() const override { return dev_.name(); }
  bool host_addressable() const override { return dev_.host_addressable(); }
  void* allocate(std::size_t bytes) override;
  void release(void* p) override;
  void synchronize() override { dev_.synchronize(); }

  void forward(const models::Op& op, Operands& o) override { dev_.forward(op, o); }
  void backward(const models::Op& op, Operands& o) override { dev_.backward(op, o); }
  void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step, const kernels::cpu::AdamConfig& c,
                 float grad_factor) override;
  void sgd_step(Ref p, Ref g, Ref momentum, std::int64_t n, std::int64_t step, const kernels::cpu::SgdConfig& c,
                float grad_factor) override;
  void copy(Ref dst, Ref src, std::int64_t n) override;
  void add(Ref dst, Ref src, std::int64_t n) override;
  void fill(Ref dst, std::int64_t n, float value) override;
  void zero_columns(Ref dst, std::int64_t rows, ColumnBlock cols) override;
  void scale(Ref x, std::int64_t n, float factor) override;
  void norm_begin() override;
  void norm_add(std::span<const Ref> parts, std::int64_t n) override;
  NormStats norm_end() override;
  void upload(Ref dst, const float* src, std::int64_t n) override;
  void download(float* dst, Ref src, std::int64_t n) override;
  void upload_bytes(void* dst, const void* src, std::size_t bytes) override;
  void download_bytes(void* dst, const void* src, std::size_t bytes) override;
  void step_begin(std::size_t events) override;
  void event_order(std::size_t index, int stream, std::span<const std::int32_t> waits) override {
    dev_.event_order(index, stream, waits);
  }
  void event_wait(std::size_t index) override { dev_.event_wait(index); }
  void event_begin(std::size_t index) override;
  void event_end(std::size_t index) override;
  void step_times(std::span<double> seconds, std::span<double> starts) override;

  // Whether p lies in memory the device allocated.
  bool on_device(const void* p) const;
  // Calls that ran on the host (the CPU device) or moved data between the two, since
  // construction: what the tests check the routing by.
  std::int64_t host_calls() const { return host_calls_; }
  std::int64_t transfers() const { return transfers_; }

 private:
  bool dev(const Ref& r) const { return on_device(r.base); }
  // Called before host work: drains the device once per event (untimed) and marks the
  // current event host-timed.
  void host_work();
  // Elements [0, n) of src as fp32 into `out` (device src: through download, in chunks).
  void to_host_f32(const Ref& src, std::int64_t n, std::vector<float>& out);

  Device& dev_;
  CpuDevice host_;
  std::map<const char*, std::size_t> segments_;  // the device's allocations: base → bytes
  std::vector<float> tmp_;
  NormStats host_norm_;
  std::int64_t host_calls_ = 0, transfers_ = 0;

  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_;
  std::vector<Clock::time_point> begin_, end_;
  std::vector<char> host_timed_;  // per event: it did host work
  std::vector<char> drained_;     // per event: the device was drained before its host work
  std::ptrdiff_t current_ = -1;   // the event being run (-1: none)
};

}  // namespace zp::exec
