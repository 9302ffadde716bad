#include "sim/memory.hpp"

#include "sim/caching_allocator.hpp"

namespace zp::sim {

using zero::Buffer;
using zero::BufferId;
using zero::Event;
using zero::Placement;

MemoryReport replay_memory(const zero::Program& p, const DeviceSpec& dev, const MemoryOptions& opt) {
  MemoryReport r;
  CategoryBytes dev_live{}, host_live{};
  Bytes dev_total{}, host_total{};
  CachingAllocatorOptions aopt;
  aopt.capacity = dev.memory.v > 0 ? Bytes{dev.memory.v - dev.context_overhead.v} : Bytes{INT64_MAX};
  CachingAllocatorModel alloc(aopt);
  std::vector<CachingAllocatorModel::Handle> handle;
  if (opt.allocator) handle.assign(p.buffers.size(), -1);
  if (opt.timeline) r.timeline.reserve(p.events.size());

  for (const Event& e : p.events) {
    for (BufferId b : p.allocs(e)) {
      const Buffer& buf = p.buffers[static_cast<std::size_t>(b)];
      const auto c = static_cast<std::size_t>(buf.category);
      if (buf.placement == Placement::host) {
        host_live[c] += buf.bytes;
        host_total += buf.bytes;
        continue;
      }
      dev_live[c] += buf.bytes;
      dev_total += buf.bytes;
      if (dev_live[c] > r.category_peak[c]) r.category_peak[c] = dev_live[c];
      if (opt.allocator && !r.allocator_oom) {
        auto h = alloc.allocate(buf.bytes, static_cast<int>(e.stream));
        if (h) handle[static_cast<std::size_t>(b)] = *h;
        else r.allocator_oom = true;
      }
    }
    if (dev_total > r.peak_allocated) {
      r.peak_allocated = dev_total;
      r.peak_event = e.id;
      r.at_peak = dev_live;
    }
    if (host_total > r.peak_host) {
      r.peak_host = host_total;
      r.host_at_peak = host_live;
    }
    if (e.id == p.step_begin - 1) r.persistent = dev_total;
    for (BufferId b : p.frees(e)) {
      const Buffer& buf = p.buffers[static_cast<std::size_t>(b)];
      const auto c = static_cast<std::size_t>(buf.category);
      if (buf.placement == Placement::host) {
        host_live[c] -= buf.bytes;
        host_total -= buf.bytes;
        continue;
      }
      dev_live[c] -= buf.bytes;
      dev_total -= buf.bytes;
      if (opt.allocator && handle[static_cast<std::size_t>(b)] >= 0) {
        alloc.free(handle[static_cast<std::size_t>(b)]);
        handle[static_cast<std::size_t>(b)] = -1;
      }
    }
    if (opt.timeline) r.timeline.push_back(dev_total);
  }
  if (p.step_begin == 0) r.persistent = Bytes{0};
  r.context = dev.context_overhead;
  if (opt.allocator && r.allocator_oom) {
    // It does not fit; report what the allocator would reserve without a capacity limit.
    CachingAllocatorModel unbounded;
    std::vector<CachingAllocatorModel::Handle> h2(p.buffers.size(), -1);
    for (const Event& e : p.events) {
      for (BufferId b : p.allocs(e)) {
        const Buffer& buf = p.buffers[static_cast<std::size_t>(b)];
        if (buf.placement == Placement::device) h2[static_cast<std::size_t>(b)] = *unbounded.allocate(buf.bytes, static_cast<int>(e.stream));
      }
      for (BufferId b : p.frees(e))
        if (h2[static_cast<std::size_t>(b)] >= 0) unbounded.free(h2[static_cast<std::size_t>(b)]);
    }
    alloc = unbounded;
  }
  if (opt.allocator) {
    r.reserved_peak = alloc.peak_reserved();
    r.allocator_allocated_peak = alloc.peak_allocated();
    r.segments = alloc.segments();
  } else {
    r.reserved_peak = r.peak_allocated;
  }
  r.device_used = r.reserved_peak + r.context;
  r.fits = !r.allocator_oom && r.device_used <= dev.memory;
  return r;
}

std::vector<BufferId> live_at(const zero::Program& p, zero::EventId at) {
  std::vector<char> live(p.buffers.size(), 0);
  for (const Event& e : p.events) {
    for (BufferId b : p.allocs(e)) live[static_cast<std::size_t>(b)] = 1;
    if (e.id == at) break;
    for (BufferId b : p.frees(e)) live[static_cast<std::size_t>(b)] = 0;
  }
  std::vector<BufferId> out;
  for (std::size_t b = 0; b < live.size(); ++b)
    if (live[b]) out.push_back(static_cast<BufferId>(b));
  return out;
}

}  // namespace zp::sim
