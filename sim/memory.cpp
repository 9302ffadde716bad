#include "sim/memory.hpp"

#include <optional>

#include "sim/caching_allocator.hpp"

namespace zp::sim {

using zero::Buffer;
using zero::BufferId;
using zero::Event;
using zero::EventId;
using zero::Placement;

namespace {

// Micro-steps repeat: once a micro-step starts from the same allocator state as the
// previous one and issues the same requests, it ends in the same state with the same
// peaks, so the replay may skip it without changing any result. A micro-step qualifies
// when it frees only what it allocated (or buffers it names the same way) and keeps
// nothing; its signature is the exact sequence of requests.
struct MicroRange {
  EventId begin = 0, end = 0;  // [begin, end)
  bool analysed = false;
  bool self_contained = true;
  std::vector<std::int64_t> signature;
};

std::vector<MicroRange> micro_ranges(const zero::Program& p) {
  std::vector<MicroRange> out;
  EventId i = p.step_begin;
  const auto n = static_cast<EventId>(p.events.size());
  while (i < n) {
    const int ms = p.events[static_cast<std::size_t>(i)].micro_step;
    if (ms < 0) { ++i; continue; }
    MicroRange r;
    r.begin = i;
    while (i < n && p.events[static_cast<std::size_t>(i)].micro_step == ms) ++i;
    r.end = i;
    out.push_back(std::move(r));
  }
  return out;
}

// The exact sequence of requests of a range (computed on demand): per event its stream,
// the sizes, categories and placements it allocates, and what it frees — buffers
// allocated in the range by their position, others by id.
void analyse(const zero::Program& p, MicroRange& r, std::vector<std::int32_t>& ordinal) {
  if (r.analysed) return;
  r.analysed = true;
  std::int32_t next = 0;
  std::int64_t open = 0;
  r.signature.reserve(static_cast<std::size_t>(r.end - r.begin) * 4);
  for (EventId e = r.begin; e < r.end; ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    r.signature.push_back(-1 - static_cast<std::int64_t>(ev.stream));
    for (BufferId b : p.allocs(ev)) {
      const Buffer& buf = p.buffers[static_cast<std::size_t>(b)];
      ordinal[static_cast<std::size_t>(b)] = next++;
      ++open;
      r.signature.push_back(buf.bytes.v * 64 + static_cast<std::int64_t>(buf.placement) * 8 +
                            static_cast<std::int64_t>(buf.category));
    }
    r.signature.push_back(-100);
    for (BufferId b : p.frees(ev)) {
      const auto o = ordinal[static_cast<std::size_t>(b)];
      if (o >= 0) {
        r.signature.push_back(-1000 - o);
        --open;
      } else {
        r.signature.push_back(-(std::int64_t{1} << 40) - b);  // freed from before: the same buffer
      }
    }
  }
  r.self_contained = open == 0;
  for (EventId e = r.begin; e < r.end; ++e)
    for (BufferId b : p.allocs(p.events[static_cast<std::size_t>(e)])) ordinal[static_cast<std::size_t>(b)] = -1;
}
}  // namespace

namespace {

// One replay with the allocator limited to `capacity` bytes.
MemoryReport replay_with_capacity(const zero::Program& p, const DeviceSpec& dev, const MemoryOptions& opt,
                                  Bytes capacity) {
  MemoryReport r;
  CategoryBytes dev_live{}, host_live{};
  Bytes dev_total{}, host_total{};
  CachingAllocatorOptions aopt;
  aopt.capacity = capacity;
  CachingAllocatorModel alloc(aopt);
  std::vector<CachingAllocatorModel::Handle> handle;
  if (opt.allocator) handle.assign(p.buffers.size(), -1);
  if (opt.timeline) r.timeline.reserve(p.events.size());

  // Fixed-point skipping of repeated micro-steps (not with a timeline, which wants every event).
  std::vector<MicroRange> ranges;
  if (!opt.timeline) ranges = micro_ranges(p);
  std::size_t next_range = 0;
  std::vector<std::int32_t> ordinal(p.buffers.size(), -1);
  struct Snapshot {
    CachingAllocatorModel alloc;
    CategoryBytes dev_live, host_live;
    bool oom;
  };
  std::optional<Snapshot> prev_start;

  const auto n = static_cast<EventId>(p.events.size());
  for (EventId id = 0; id < n; ++id) {
    if (next_range < ranges.size() && ranges[next_range].begin == id) {
      MicroRange& cur = ranges[next_range];
      bool repeat = next_range > 0 && ranges[next_range - 1].end == cur.begin && prev_start &&
                    prev_start->dev_live == dev_live && prev_start->host_live == host_live &&
                    prev_start->oom == r.allocator_oom && (!opt.allocator || prev_start->alloc == alloc);
      if (repeat) {
        // Only when the state repeats are the two ranges' requests compared.
        MicroRange& prev = ranges[next_range - 1];
        analyse(p, prev, ordinal);
        analyse(p, cur, ordinal);
        repeat = cur.self_contained && prev.self_contained && cur.signature == prev.signature;
      }
      if (repeat) {
        // Same start, same requests: same end state, no new peak. Skip it.
        id = cur.end - 1;
        ++next_range;
        ++r.skipped_micro_steps;
        continue;
      }
      prev_start = Snapshot{alloc, dev_live, host_live, r.allocator_oom};
      ++next_range;
    }
    const Event& e = p.events[static_cast<std::size_t>(id)];
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

}  // namespace

MemoryReport replay_memory(const zero::Program& p, const DeviceSpec& dev, const MemoryOptions& opt) {
  // Without a limit first: what the allocator would reserve. The device's capacity only
  // matters when that exceeds it (PyTorch then frees cached segments and retries); when
  // even the allocated bytes exceed it, nothing can make it fit.
  const Bytes capacity = dev.memory.v > 0 ? Bytes{dev.memory.v - dev.context_overhead.v} : Bytes{INT64_MAX};
  MemoryReport r = replay_with_capacity(p, dev, opt, Bytes{INT64_MAX});
  if (!opt.allocator || dev.memory.v <= 0 || r.reserved_peak <= capacity) return r;
  if (r.allocator_allocated_peak > capacity) {
    r.fits = false;
    r.allocator_oom = true;
    return r;
  }
  MemoryReport bounded = replay_with_capacity(p, dev, opt, capacity);
  if (bounded.allocator_oom) {
    // Report what it would need; it does not fit.
    r.allocator_oom = true;
    r.fits = false;
    return r;
  }
  return bounded;
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
