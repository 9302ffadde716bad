#include "exec/device_placed.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace zp::exec {

bool runs_placed(const zero::Program& p) {
  return std::any_of(p.buffers.begin(), p.buffers.end(),
                     [](const zero::Buffer& b) { return b.placement == zero::Placement::host; });
}

namespace {

std::size_t U(std::int64_t v) { return static_cast<std::size_t>(v); }

void* at(const Ref& r) { return r.address(); }

Ref f32(float* p) { return {p, DType::fp32, 0}; }

}  // namespace

void* PlacedDevice::allocate(std::size_t bytes) {
  void* p = dev_.allocate(bytes);
  if (p) segments_[static_cast<const char*>(p)] = bytes;
  return p;
}

void PlacedDevice::release(void* p) {
  segments_.erase(static_cast<const char*>(p));
  dev_.release(p);
}

bool PlacedDevice::on_device(const void* p) const {
  if (!p) return false;
  const auto* c = static_cast<const char*>(p);
  auto it = segments_.upper_bound(c);
  if (it == segments_.begin()) return false;
  --it;
  return c < it->first + it->second;
}

void PlacedDevice::host_work() {
  ++host_calls_;
  if (current_ < 0) return;
  const auto i = static_cast<std::size_t>(current_);
  if (!drained_[i]) {
    dev_.synchronize();
    drained_[i] = 1;
    begin_[i] = Clock::now();  // the event's host work starts once the device is idle
  }
  host_timed_[i] = 1;
}

void PlacedDevice::to_host_f32(const Ref& src, std::int64_t n, std::vector<float>& out) {
  out.resize(U(n));
  if (!dev(src)) {
    host_.copy(f32(out.data()), src, n);
    return;
  }
  for (std::int64_t k = 0; k < n; k += kChunkElements) {
    dev_.download(out.data() + k, src.at(k), std::min(kChunkElements, n - k));
    ++transfers_;
  }
}

// ------------------------------------------------------------------ optimizer
void PlacedDevice::adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step,
                             const kernels::cpu::AdamConfig& c, float grad_factor) {
  const int on = dev(p) + dev(g) + dev(m) + dev(v);
  if (on == 4) return dev_.adam_step(p, g, m, v, n, step, c, grad_factor);
  if (on != 0)
    throw std::logic_error(fmt::format("adam step with operands on both sides ({} of 4 on the device)", on));
  host_work();
  host_.adam_step(p, g, m, v, n, step, c, grad_factor);
}

void PlacedDevice::sgd_step(Ref p, Ref g, Ref momentum, std::int64_t n, std::int64_t step,
                            const kernels::cpu::SgdConfig& c, float grad_factor) {
  const bool pd = dev(p), gd = dev(g), md = momentum ? dev(momentum) : pd;
  if (pd && gd && md) return dev_.sgd_step(p, g, momentum, n, step, c, grad_factor);
  if (pd || gd || md) throw std::logic_error("sgd step with operands on both sides");
  host_work();
  host_.sgd_step(p, g, momentum, n, step, c, grad_factor);
}

// ------------------------------------------------------------------ data movement
void PlacedDevice::copy(Ref dst, Ref src, std::int64_t n) {
  const bool dd = dev(dst), sd = dev(src);
  if (dd && sd) return dev_.copy(dst, src, n);
  host_work();
  if (!dd && !sd) return host_.copy(dst, src, n);
  if (n <= 0) return;
  if (dd) {  // host → device: fp32 values (converted to dst's dtype on the device), or raw bytes
    if (src.dt == dst.dt && src.dt != DType::fp32) {
      for (std::int64_t k = 0; k < n; k += kChunkElements)
        upload_bytes(at(dst.at(k)), at(src.at(k)), U(std::min(kChunkElements, n - k) * dtype_size(src.dt)));
      return;
    }
    for (std::int64_t k = 0; k < n; k += kChunkElements) {
      const std::int64_t c = std::min(kChunkElements, n - k);
      const float* from = nullptr;
      if (src.dt == DType::fp32) {
        from = static_cast<const float*>(at(src)) + k;
      } else {
        tmp_.resize(U(c));
        host_.copy(f32(tmp_.data()), src.at(k), c);
        from = tmp_.data();
      }
      dev_.upload(dst.at(k), from, c);
      ++transfers_;
    }
    return;
  }
  // device → host
  if (src.dt == dst.dt && src.dt != DType::fp32) {
    for (std::int64_t k = 0; k < n; k += kChunkElements)
      download_bytes(at(dst.at(k)), at(src.at(k)), U(std::min(kChunkElements, n - k) * dtype_size(src.dt)));
    return;
  }
  if (dst.dt == DType::fp32) {
    for (std::int64_t k = 0; k < n; k += kChunkElements) {
      dev_.download(static_cast<float*>(at(dst)) + k, src.at(k), std::min(kChunkElements, n - k));
      ++transfers_;
    }
    return;
  }
  for (std::int64_t k = 0; k < n; k += kChunkElements) {
    const std::int64_t c = std::min(kChunkElements, n - k);
    to_host_f32(src.at(k), c, tmp_);
    host_.copy(dst.at(k), f32(tmp_.data()), c);
  }
}

void PlacedDevice::add(Ref dst, Ref src, std::int64_t n) {
  const bool dd = dev(dst), sd = dev(src);
  if (dd && sd) return dev_.add(dst, src, n);
  host_work();
  if (!dd && !sd) return host_.add(dst, src, n);
  if (dd)  // no program adds host memory into the device's; said plainly if one ever does
    throw std::logic_error("add of host memory into device memory");
  for (std::int64_t k = 0; k < n; k += kChunkElements) {
    const std::int64_t c = std::min(kChunkElements, n - k);
    to_host_f32(src.at(k), c, tmp_);
    host_.add(dst.at(k), f32(tmp_.data()), c);
  }
}

void PlacedDevice::fill(Ref dst, std::int64_t n, float value) {
  if (dev(dst)) return dev_.fill(dst, n, value);
  host_work();
  host_.fill(dst, n, value);
}

void PlacedDevice::zero_columns(Ref dst, std::int64_t rows, ColumnBlock cols) {
  if (dev(dst)) return dev_.zero_columns(dst, rows, cols);
  host_work();
  host_.zero_columns(dst, rows, cols);
}

void PlacedDevice::scale(Ref x, std::int64_t n, float factor) {
  if (dev(x)) return dev_.scale(x, n, factor);
  host_work();
  host_.scale(x, n, factor);
}

void PlacedDevice::norm_begin() {
  dev_.norm_begin();
  host_.norm_begin();
}

void PlacedDevice::norm_add(std::span<const Ref> parts, std::int64_t n) {
  if (parts.empty()) return;
  std::size_t on = 0;
  for (const auto& r : parts) on += dev(r) ? 1 : 0;
  if (on == parts.size()) return dev_.norm_add(parts, n);
  host_work();
  if (on == 0) return host_.norm_add(parts, n);
  // A sum of parts on both sides: the device's parts brought over as fp32, summed on the host.
  std::vector<std::vector<float>> staged(parts.size());
  std::vector<Ref> host_parts(parts.begin(), parts.end());
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (dev(parts[i])) {
      to_host_f32(parts[i], n, staged[i]);
      host_parts[i] = f32(staged[i].data());
    }
  host_.norm_add(host_parts, n);
}

NormStats PlacedDevice::norm_end() {
  const NormStats d = dev_.norm_end(), h = host_.norm_end();
  return {d.sumsq + h.sumsq, d.nonfinite || h.nonfinite};
}

void PlacedDevice::upload(Ref dst, const float* src, std::int64_t n) {
  if (dev(dst)) return dev_.upload(dst, src, n);
  host_.upload(dst, src, n);
}

void PlacedDevice::download(float* dst, Ref src, std::int64_t n) {
  if (dev(src)) return dev_.download(dst, src, n);
  host_.download(dst, src, n);
}

void PlacedDevice::upload_bytes(void* dst, const void* src, std::size_t bytes) {
  if (!on_device(dst)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  dev_.upload_bytes(dst, src, bytes);
  ++transfers_;
}

void PlacedDevice::download_bytes(void* dst, const void* src, std::size_t bytes) {
  if (!on_device(src)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  dev_.download_bytes(dst, src, bytes);
  ++transfers_;
}

// ------------------------------------------------------------------ timing
void PlacedDevice::step_begin(std::size_t events) {
  dev_.step_begin(events);
  t0_ = Clock::now();
  begin_.assign(events, t0_);
  end_.assign(events, t0_);
  host_timed_.assign(events, 0);
  drained_.assign(events, 0);
  current_ = -1;
}

void PlacedDevice::event_begin(std::size_t index) {
  dev_.event_begin(index);
  begin_[index] = Clock::now();
  current_ = static_cast<std::ptrdiff_t>(index);
}

void PlacedDevice::event_end(std::size_t index) {
  // A host-timed event ends when the device work it queued after its host part (a
  // collective on what it copied over, the last chunk's conversion) is done too.
  if (host_timed_[index]) dev_.synchronize();
  end_[index] = Clock::now();
  dev_.event_end(index);
  current_ = -1;
}

void PlacedDevice::step_times(std::span<double> seconds, std::span<double> starts) {
  dev_.step_times(seconds, starts);
  for (std::size_t i = 0; i < host_timed_.size() && i < seconds.size(); ++i)
    if (host_timed_[i]) {
      seconds[i] = std::chrono::duration<double>(end_[i] - begin_[i]).count();
      starts[i] = std::chrono::duration<double>(begin_[i] - t0_).count();
    }
}

}  // namespace zp::exec
