#include "exec/allocator.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace zp::exec {

TrackingAllocator::TrackingAllocator(std::size_t buffers, Bytes limit)
    : ptr_(buffers, nullptr), handle_(buffers), limit_(limit) {}

TrackingAllocator::~TrackingAllocator() {
  for (void* p : ptr_) std::free(p);
}

void* TrackingAllocator::allocate(const zero::Buffer& b, int stream) {
  const auto i = static_cast<std::size_t>(b.id);
  if (ptr_[i]) throw std::logic_error(fmt::format("buffer {} allocated twice", b.id));
  const bool dev = b.placement == zero::Placement::device;
  if (dev && limit_.v > 0 && device_live_.v + b.bytes.v > limit_.v)
    throw AllocationFailed(fmt::format("memory limit: {} B requested with {} B live exceeds --memory-limit {} B",
                                       b.bytes.v, device_live_.v, limit_.v),
                           b.bytes, device_live_);
  // Zero-filled by calloc: large blocks come as fresh zero pages from the OS, so a
  // bucket sized for the GPU (reduce_bucket_size 5e8 elements) costs no time or
  // resident memory until it is written. At least one byte, so addresses are distinct.
  void* p = std::calloc(static_cast<std::size_t>(std::max<std::int64_t>(b.bytes.v, 1)), 1);
  if (!p)
    throw AllocationFailed(fmt::format("out of memory: {} B requested with {} B live", b.bytes.v, device_live_.v),
                           b.bytes, device_live_);
  ptr_[i] = p;
  const auto c = static_cast<std::size_t>(b.category);
  live_[dev ? 0 : 1][c] += b.bytes;
  if (dev) {
    device_live_ += b.bytes;
    handle_[i] = cache_.allocate(b.bytes, stream);
    if (live_[0][c] > rep_.category_peak[c]) rep_.category_peak[c] = live_[0][c];
  } else {
    host_live_ += b.bytes;
    if (host_live_ > rep_.peak_host) rep_.peak_host = host_live_;
  }
  return p;
}

void TrackingAllocator::release(const zero::Buffer& b) {
  const auto i = static_cast<std::size_t>(b.id);
  if (!ptr_[i]) throw std::logic_error(fmt::format("buffer {} freed but not live", b.id));
  std::free(ptr_[i]);
  ptr_[i] = nullptr;
  const bool dev = b.placement == zero::Placement::device;
  live_[dev ? 0 : 1][static_cast<std::size_t>(b.category)] -= b.bytes;
  if (dev) {
    device_live_ -= b.bytes;
    if (handle_[i]) cache_.free(*handle_[i]);
    handle_[i].reset();
  } else {
    host_live_ -= b.bytes;
  }
}

void TrackingAllocator::after_allocations(zero::EventId e) {
  if (device_live_ > rep_.peak_allocated) {
    rep_.peak_allocated = device_live_;
    rep_.peak_event = e;
    rep_.at_peak = live_[0];
  }
  rep_.reserved_peak = cache_.peak_reserved();
  rep_.live_now = device_live_;
}

void TrackingAllocator::reset_peaks() {
  rep_ = AllocatorReport{};
  rep_.category_peak = live_[0];
  rep_.peak_host = host_live_;
}

}  // namespace zp::exec
