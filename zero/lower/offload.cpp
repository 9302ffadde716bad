#include "zero/lower/offload.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "zero/lower/optimizer_step.hpp"

namespace zp::zero::lowering {

void host_buffers_stage12(Context& c, std::int64_t P) {
  c.states.host_grads = c.persistent(Category::grads, Placement::host, BufferRole::host_grads32, DType::fp32, P,
                                     "host fp32 grad partition");
  c.persistent(Category::params, Placement::host, BufferRole::host_staging16, c.md, P, "host 16-bit staging partition");
  std::int64_t largest = 0;
  for (const auto& prm : c.g.params) largest = std::max(largest, prm.numel);
  // (2 × max numel,) model dtype
  c.persistent(Category::comm_buffers, Placement::device, BufferRole::offload_staging, c.md, 2 * largest,
               "device staging buffer (2 x largest param)");
}

void host_grad_partition(Context& c, std::int64_t elements) {
  c.states.host_grads = c.persistent(Category::grads, Placement::host, BufferRole::host_grads32, DType::fp32, elements,
                                     "host fp32 grad partition");
}

void host_step_stage12(Context& c, std::int64_t P, const std::function<void()>& release_device_grads) {
  Builder& b = c.b;
  Event& d2h = b.begin(EventKind::copy, Stream::host, Phase::step, -1, "grads_to_host");
  d2h.src = Placement::device;
  d2h.dst = Placement::host;
  d2h.mem_bytes = Bytes{P * 4};
  release_device_grads();
  optimizer_event(c, P, Placement::host, "optimizer.cpu", c.states.master, c.states.host_grads);
  Event& h2d = b.begin(EventKind::copy, Stream::host, Phase::step, -1, "params_to_device");
  h2d.src = Placement::host;
  h2d.dst = Placement::device;
  h2d.mem_bytes = Bytes{P * c.b16()};
  params_from_master(c, h2d, 0, P);
}

void host_step_subgroup(Context& c, std::int64_t gi, std::int64_t offset, std::int64_t n) {
  optimizer_event(c, n, Placement::host, fmt::format("optimizer.cpu.subgroup{}", gi), c.states.master,
                  c.states.host_grads, offset);
  Event& h2d = c.b.begin(EventKind::copy, Stream::host, Phase::step, -1, fmt::format("params_to_device.subgroup{}", gi));
  h2d.src = Placement::host;
  h2d.dst = c.offload_param ? Placement::host : Placement::device;
  h2d.mem_bytes = Bytes{n * c.b16()};
  params_from_master(c, h2d, offset, n);
}

void fetch_from_host(Context& c, Stream s, Phase ph, std::int32_t label, Bytes bytes) {
  Event& h2d = c.b.begin(EventKind::copy, s, ph, c.at.micro, label);
  h2d.src = Placement::host;
  h2d.mem_bytes = bytes;
}

}  // namespace zp::zero::lowering
