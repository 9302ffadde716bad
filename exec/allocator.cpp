#include "exec/allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace zp::exec {

TrackingAllocator::TrackingAllocator(std::size_t buffers, Bytes limit, Device* device)
    : device_(device), ptr_(buffers, nullptr), handle_(buffers), limit_(limit) {}

TrackingAllocator::~TrackingAllocator() {
  for (std::size_t i = 0; i < ptr_.size(); ++i)
    if (ptr_[i] && !(segmented() && handle_[i])) free_host(static_cast<zero::BufferId>(i));
  for (auto& [id, p] : segments_) device_->release(p);
}

void TrackingAllocator::free_host(zero::BufferId id) {
  void* p = ptr_[static_cast<std::size_t>(id)];
  if (device_ && device_->host_addressable() && handle_[static_cast<std::size_t>(id)]) device_->release(p);
  else std::free(p);
}

void TrackingAllocator::sync_segments() {
  if (static_cast<std::int64_t>(segments_.size()) == cache_.segments()) return;
  const auto held = cache_.segment_ids();
  for (auto it = segments_.begin(); it != segments_.end();) {
    if (std::find(held.begin(), held.end(), it->first) == held.end()) {
      device_->release(it->second);
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
}

void TrackingAllocator::empty_cache() {
  cache_.empty_cache();
  if (segmented()) sync_segments();
}

void* TrackingAllocator::allocate(const zero::Buffer& b, int stream) {
  const auto i = static_cast<std::size_t>(b.id);
  if (ptr_[i]) throw std::logic_error(fmt::format("buffer {} allocated twice", b.id));
  const bool dev = b.placement == zero::Placement::device;
  if (dev && limit_.v > 0 && device_live_.v + b.bytes.v > limit_.v)
    throw AllocationFailed(fmt::format("memory limit: {} B requested with {} B live exceeds --memory-limit {} B",
                                       b.bytes.v, device_live_.v, limit_.v),
                           b.bytes, device_live_);
  const auto size = static_cast<std::size_t>(std::max<std::int64_t>(b.bytes.v, 1));
  void* p = nullptr;
  if (dev) {
    handle_[i] = cache_.allocate(b.bytes, stream);
    if (segmented()) {
      if (!handle_[i])
        throw AllocationFailed(fmt::format("out of device memory: {} B requested with {} B live", b.bytes.v, device_live_.v),
                               b.bytes, device_live_);
      const auto where = cache_.place(*handle_[i]);
      sync_segments();  // a request may have released cached segments first
      auto seg = segments_.find(where.segment);
      if (seg == segments_.end()) {
        void* mem = device_->allocate(static_cast<std::size_t>(where.segment_size));
        if (!mem)
          throw AllocationFailed(fmt::format("out of device memory: a {} B segment for {} B with {} B live",
                                             where.segment_size, b.bytes.v, device_live_.v),
                                 b.bytes, device_live_);
        seg = segments_.emplace(where.segment, mem).first;
      }
      p = static_cast<std::byte*>(seg->second) + where.offset;
      const bool deferred = defer_grads_ && b.role == zero::BufferRole::activation_grad;
      if (zero::starts_zeroed(b.role) && !deferred)
        device_->fill(Ref{p, DType::u8, 0}, static_cast<std::int64_t>(size), 0.0f);
    } else {
      p = device_ ? device_->allocate(size) : std::calloc(size, 1);
    }
  } else {
    // Host buffers: zero-filled by calloc (large ones come as fresh zero pages, costing
    // nothing until written). At least one byte, so addresses are distinct.
    p = std::calloc(size, 1);
  }
  if (!p)
    throw AllocationFailed(fmt::format("out of memory: {} B requested with {} B live", b.bytes.v, device_live_.v),
                           b.bytes, device_live_);
  ptr_[i] = p;
  const auto c = static_cast<std::size_t>(b.category);
  live_[dev ? 0 : 1][c] += b.bytes;
  if (dev) {
    device_live_ += b.bytes;
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
  const bool dev = b.placement == zero::Placement::device;
  if (!(dev && segmented())) free_host(b.id);
  ptr_[i] = nullptr;
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
