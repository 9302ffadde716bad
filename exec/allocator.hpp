#pragma once
// The executor's category-tagged allocator. Every buffer the step program declares is
// allocated and freed through it; it records live and peak bytes per category and
// placement at the same points the simulator's replay does (after an event's
// allocations), and feeds device requests through the same caching-allocator model
// (sim/caching_allocator) so reserved bytes are measured by the rules they are
// predicted with. Memory is real. A device buffer that something accumulates into (a
// param's gradient, a bucket, a partition, a backward temporary) starts at zero, as
// torch.zeros would; a buffer its first writer fills whole (a forward output, a step
// temporary) is left as the cache hands it over, as torch.empty would: zero-filling it
// would add a memset to its event that PyTorch does not run (zero::starts_zeroed says
// which). A forward tensor's gradient is left as it is too where the interpreter asks
// (defer_gradient_zeroing): its first writer writes it whole or zero-fills it.
#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/units.hpp"
#include "exec/device.hpp"
#include "sim/caching_allocator.hpp"
#include "zero/program.hpp"

namespace zp::exec {

using CategoryBytes = std::array<Bytes, zero::kNumCategories>;

struct AllocatorReport {
  Bytes peak_allocated{};            // device bytes live at the device peak
  zero::EventId peak_event = -1;
  CategoryBytes at_peak{};           // breakdown of peak_allocated
  CategoryBytes category_peak{};     // each category's own device maximum
  Bytes peak_host{};
  Bytes reserved_peak{};             // caching-allocator rules over the real requests
  Bytes live_now{};
};

class AllocationFailed : public std::runtime_error {
 public:
  AllocationFailed(const std::string& what, Bytes requested_bytes, Bytes live_bytes)
      : std::runtime_error(what), requested(requested_bytes), live(live_bytes) {}
  Bytes requested, live;
};

class TrackingAllocator {
 public:
  // `limit`: device bytes that may be live at once (--memory-limit); 0 = none.
  // `device`: where device buffers live (nullptr: host memory, as the CPU device's).
  explicit TrackingAllocator(std::size_t buffers, Bytes limit = Bytes{0}, Device* device = nullptr);
  ~TrackingAllocator();
  TrackingAllocator(const TrackingAllocator&) = delete;
  TrackingAllocator& operator=(const TrackingAllocator&) = delete;

  void* allocate(const zero::Buffer& b, int stream);
  // Gradients of forward tensors (BufferRole::activation_grad) handed over as the cache has
  // them, not zero-filled: the interpreter zero-fills one only where its first writer adds
  // into it rather than writing it whole (Interpreter::accumulates).
  void defer_gradient_zeroing(bool on) { defer_grads_ = on; }
  void release(const zero::Buffer& b);
  void* data(zero::BufferId id) const { return ptr_[static_cast<std::size_t>(id)]; }
  bool live(zero::BufferId id) const { return ptr_[static_cast<std::size_t>(id)] != nullptr; }
  // Marks the end of an event's allocations: the point peaks are taken at.
  void after_allocations(zero::EventId e);
  // Starts a new measured step (peaks restart; live buffers stay).
  void reset_peaks();
  // torch.cuda.empty_cache(): the caching-allocator model releases its free segments.
  void empty_cache();
  // Device memory reserved now (the segments the device holds for the program).
  Bytes reserved_now() const { return cache_.reserved(); }
  const AllocatorReport& report() const { return rep_; }
  // Where the caching-allocator model placed a live device buffer (its segment and offset:
  // where a device that is not the host's holds it); nullopt for a host buffer.
  std::optional<sim::CachingAllocatorModel::Place> place(zero::BufferId id) const {
    const auto& h = handle_[static_cast<std::size_t>(id)];
    if (!h) return std::nullopt;
    return cache_.place(*h);
  }

 private:
  bool segmented() const { return device_ && !device_->host_addressable(); }
  void sync_segments();  // release the segments the model no longer holds
  void free_host(zero::BufferId id);

  Device* device_ = nullptr;
  bool defer_grads_ = false;
  std::map<std::int64_t, void*> segments_;  // the model's segment → the device's memory
  std::vector<void*> ptr_;
  std::vector<std::optional<sim::CachingAllocatorModel::Handle>> handle_;
  std::array<CategoryBytes, 2> live_{};  // [placement][category]
  Bytes device_live_{}, host_live_{};
  Bytes limit_{};
  sim::CachingAllocatorModel cache_;
  AllocatorReport rep_;
};

}  // namespace zp::exec
