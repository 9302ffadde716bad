#include "sim/memory.hpp"

#include <algorithm>
#include <cstdint>

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
  EventId begin = 0, end = -1;    // [begin, end); -1 while not yet known
  std::int8_t same_as_prev = -1;  // whether it issues the same requests as the range before: -1 unknown
};

// Memory reused from one replay to the next on this thread (per-buffer arrays are the
// largest allocations of a replay).
struct Scratch {
  std::vector<CachingAllocatorModel::Handle> handle;  // per buffer
  std::vector<std::int32_t> local;                     // per buffer: position in the range analysed, or -1
  std::vector<BufferId> touched;
  std::vector<std::int64_t> sig[2];       // capacity kept: sig_len says how much is used
  std::size_t sig_len[2] = {0, 0};
  std::size_t sig_range[2] = {SIZE_MAX, SIZE_MAX};
  bool self_contained[2] = {false, false};
  std::vector<std::int64_t> sig_repeat;   // the copied micro-step's, once per program
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The micro-steps of a program (maximal runs of step events with the same micro-step)
// and, on demand, whether each issues the same requests as the one before; found while
// replaying (no pass of their own) and shared by every replay of the program (neither
// depends on the allocator's capacity).
struct MicroRanges {
  std::vector<MicroRange> ranges;
  std::int8_t repeat_self_contained = -1;  // whether the micro-step the lowering copied frees all it allocates
};

// The exact sequence of requests of a range, into `sig`: per event a header (stream,
// number of allocations, number of frees), the size, placement and category of each
// allocation, and what it frees — buffers allocated in the range by their position,
// others by id. Two ranges issue the same requests iff their signatures are equal.
// Returns its length and whether the range frees everything it allocates; finds the
// range's end when not yet known.
std::size_t signature(const zero::Program& p, MicroRange& r, std::vector<std::int64_t>& sig, Scratch& s,
                      bool& self_contained) {
  if (s.local.size() < p.buffers.size()) s.local.resize(p.buffers.size(), -1);
  s.touched.clear();
  std::int32_t next = 0;
  std::int64_t open = 0;
  std::size_t at = 0;
  const auto n = static_cast<EventId>(p.events.size());
  const bool find_end = r.end < 0;
  const int ms = p.events[static_cast<std::size_t>(r.begin)].micro_step;
  EventId e = r.begin;
  for (; find_end ? e < n && p.events[static_cast<std::size_t>(e)].micro_step == ms : e < r.end; ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    // Events are large and read once here: ask for the ones ahead early.
    if (e + 8 < n) __builtin_prefetch(&p.events[static_cast<std::size_t>(e) + 8].alloc_begin);
    const auto allocs = p.allocs(ev);
    const auto frees = p.frees(ev);
    const std::size_t need = at + 1 + allocs.size() + frees.size();
    if (need > sig.size()) sig.resize(std::max(need, 2 * sig.size() + 1024));
    std::int64_t* out = sig.data() + at;
    *out++ = static_cast<std::int64_t>(ev.stream) | static_cast<std::int64_t>(allocs.size()) << 8 |
             static_cast<std::int64_t>(frees.size()) << 36;
    for (BufferId b : allocs) {
      const Buffer& buf = p.buffers[static_cast<std::size_t>(b)];
      s.local[static_cast<std::size_t>(b)] = next++;
      s.touched.push_back(b);
      *out++ = buf.bytes.v * 64 + static_cast<std::int64_t>(buf.placement) * 8 + static_cast<std::int64_t>(buf.category);
    }
    for (BufferId b : frees) {
      const std::int32_t o = s.local[static_cast<std::size_t>(b)];
      if (o >= 0) {
        *out++ = o;  // allocated in this range: by position
        --open;
      } else {
        *out++ = -1 - static_cast<std::int64_t>(b);  // allocated before: the same buffer
      }
    }
    open += static_cast<std::int64_t>(allocs.size());
    at = need;
  }
  if (find_end) r.end = e;
  for (BufferId b : s.touched) s.local[static_cast<std::size_t>(b)] = -1;
  self_contained = open == 0;
  return at;
}

// Whether range k issues the same requests as range k - 1 (both freeing all they allocate).
bool same_requests(const zero::Program& p, MicroRanges& m, std::size_t k, Scratch& s) {
  MicroRange& cur = m.ranges[k];
  const zero::Repeat& rp = p.repeat;
  if (cur.same_as_prev < 0 && rp.copies > 0 && cur.begin > rp.first && (cur.begin - rp.first) % rp.events == 0 &&
      (cur.begin - rp.first) / rp.events <= rp.copies && m.ranges[k - 1].begin == cur.begin - rp.events) {
    // A copy of the micro-step before (or of the one it copies). When that one frees all it
    // allocates, everything it frees from outside was allocated before the copies, and
    // keeps its id in each: the requests are the same (Program::repeat).
    cur.end = cur.begin + rp.events;
    if (m.repeat_self_contained < 0) {
      MicroRange orig{rp.first, rp.first + rp.events, -1};
      bool sc = false;
      signature(p, orig, s.sig_repeat, s, sc);
      m.repeat_self_contained = sc ? 1 : 0;
    }
    cur.same_as_prev = m.repeat_self_contained;
  }
  if (cur.same_as_prev < 0) {
    // Signatures of the last two ranges analysed are kept: ranges are compared in order.
    auto slot_of = [&](std::size_t range) -> int {
      for (int i = 0; i < 2; ++i)
        if (s.sig_range[i] == range) return i;
      return -1;
    };
    int a = slot_of(k - 1);
    if (a < 0) {
      a = slot_of(k) == 0 ? 1 : 0;
      s.sig_len[a] = signature(p, m.ranges[k - 1], s.sig[a], s, s.self_contained[a]);
      s.sig_range[a] = k - 1;
    }
    int b = slot_of(k);
    if (b < 0) {
      b = 1 - a;
      s.sig_len[b] = signature(p, cur, s.sig[b], s, s.self_contained[b]);
      s.sig_range[b] = k;
    }
    cur.same_as_prev = s.self_contained[a] && s.self_contained[b] && s.sig_len[a] == s.sig_len[b] &&
                       std::equal(s.sig[a].begin(), s.sig[a].begin() + static_cast<std::ptrdiff_t>(s.sig_len[a]),
                                  s.sig[b].begin());
  }
  return cur.same_as_prev > 0;
}

// A steady-state step is never a process's first: its caching allocator has seen the set-up
// and at least one step, whose requests shaped the segments it holds (reserved bytes never
// shrink). The allocator model replays the prologue and one first step before the replay
// proper (requests only: no bytes are counted), with the buffers DeepSpeed creates during
// the first step (zero::Buffer::first_step) allocated right before that step's first
// optimizer event; the replay proper continues from that allocator state.
void warm_up(const zero::Program& p, CachingAllocatorModel& alloc, std::vector<CachingAllocatorModel::Handle>& handle,
             bool& oom) {
  auto allocate = [&](BufferId b, int stream) {
    if (oom) return;
    if (const auto h = alloc.allocate(p.buffers[static_cast<std::size_t>(b)].bytes, stream)) handle[static_cast<std::size_t>(b)] = *h;
    else oom = true;
  };
  auto release = [&](BufferId b) {
    auto& h = handle[static_cast<std::size_t>(b)];
    if (h >= 0) alloc.free(h);
    h = -1;
  };
  std::vector<std::pair<BufferId, int>> deferred;
  const auto n = static_cast<EventId>(p.events.size());
  for (EventId id = 0; id < n; ++id) {
    const Event& e = p.events[static_cast<std::size_t>(id)];
    if (id >= p.step_begin && e.kind == zero::EventKind::optimizer) {
      for (const auto& [b, s] : deferred) allocate(b, s);
      deferred.clear();
    }
    if (e.empty_cache) alloc.empty_cache();
    for (BufferId b : p.allocs(e)) {
      const Buffer& buf = p.buffers[static_cast<std::size_t>(b)];
      if (buf.placement != Placement::device) continue;
      if (buf.first_step) deferred.emplace_back(b, static_cast<int>(e.stream));
      else allocate(b, static_cast<int>(e.stream));
    }
    for (BufferId b : p.frees(e)) release(b);
  }
  for (const auto& [b, s] : deferred) allocate(b, s);
}

// One replay with the allocator limited to `capacity` bytes.
MemoryReport replay_with_capacity(const zero::Program& p, const DeviceSpec& dev, const MemoryOptions& opt,
                                  Bytes capacity, MicroRanges& micro, Scratch& scratch) {
  MemoryReport r;
  CategoryBytes dev_live{}, host_live{};
  Bytes dev_total{}, host_total{};
  CachingAllocatorOptions aopt;
  aopt.capacity = capacity;
  CachingAllocatorModel alloc(aopt);
  std::vector<CachingAllocatorModel::Handle>& handle = scratch.handle;
  if (opt.allocator) handle.assign(p.buffers.size(), -1);
  // The allocator has seen the prologue and a first step (warm_up).
  const bool warmed = opt.allocator;
  if (warmed) warm_up(p, alloc, handle, r.allocator_oom);
  if (opt.timeline) r.timeline.reserve(p.events.size());

  // Fixed-point skipping of repeated micro-steps (not with a timeline, which wants every event).
  const bool skipping = !opt.timeline;
  std::size_t next_range = 0;  // ranges begun so far (micro.ranges may know more, from an earlier replay)
  int run_ms = -1;             // micro-step of the event before, while in a step
  struct Snapshot {
    CachingAllocatorModel alloc;
    CategoryBytes dev_live, host_live;
    bool oom = false;
  };
  Snapshot prev_start;
  bool have_prev = false;
  // True while nothing has changed since the state was last proved equal to prev_start
  // (right after a skipped micro-step, which leaves the state where it was).
  bool at_prev_start = false;

  const auto n = static_cast<EventId>(p.events.size());
  for (EventId id = 0; id < n; ++id) {
    const Event& e = p.events[static_cast<std::size_t>(id)];
    if (skipping && id >= p.step_begin && e.micro_step != run_ms) {
      // A boundary: the range before (if any) ends here, and one begins if this event is
      // in a micro-step.
      if (run_ms >= 0) micro.ranges[next_range - 1].end = id;
      run_ms = e.micro_step;
      if (run_ms >= 0) {
        if (next_range == micro.ranges.size()) micro.ranges.push_back(MicroRange{id, -1, -1});
        MicroRange& cur = micro.ranges[next_range];
        bool repeat = next_range > 0 && micro.ranges[next_range - 1].end == cur.begin && have_prev &&
                      (at_prev_start ||
                       (prev_start.dev_live == dev_live && prev_start.host_live == host_live &&
                        prev_start.oom == r.allocator_oom && (!opt.allocator || prev_start.alloc == alloc)));
        // Only when the state repeats are the two ranges' requests compared.
        if (repeat) repeat = same_requests(p, micro, next_range, scratch);
        ++next_range;
        if (repeat) {
          // Same start, same requests: same end state, no new peak. Skip it.
          id = cur.end - 1;
          ++r.skipped_micro_steps;
          at_prev_start = true;
          continue;
        }
        if (opt.allocator) prev_start.alloc = alloc;  // copy-assignment reuses the snapshot's storage
        prev_start.dev_live = dev_live;
        prev_start.host_live = host_live;
        prev_start.oom = r.allocator_oom;
        have_prev = true;
      }
    }
    at_prev_start = false;
    const bool allocator_here = opt.allocator && !(warmed && id < p.step_begin);
    if (e.empty_cache && allocator_here) alloc.empty_cache();
    // Peaks are the step's: the prologue's set-up temporaries do not count (the persistent
    // bytes live at the step's start do).
    const bool in_step = id >= p.step_begin;
    if (id == p.step_begin)
      for (std::size_t c = 0; c < r.category_peak.size(); ++c) r.category_peak[c] = dev_live[c];
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
      if (in_step && dev_live[c] > r.category_peak[c]) r.category_peak[c] = dev_live[c];
      if (allocator_here && !r.allocator_oom) {
        auto h = alloc.allocate(buf.bytes, static_cast<int>(e.stream));
        if (h) handle[static_cast<std::size_t>(b)] = *h;
        else r.allocator_oom = true;
      }
    }
    if (in_step && dev_total > r.peak_allocated) {
      r.peak_allocated = dev_total;
      r.peak_event = e.id;
      r.at_peak = dev_live;
    }
    if (in_step && host_total > r.peak_host) {
      r.peak_host = host_total;
      r.host_at_peak = host_live;
    }
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
    if (e.id == p.step_begin - 1) r.persistent = dev_total;  // what the set-up leaves
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
  MicroRanges micro;
  Scratch& s = scratch();
  s.sig_range[0] = s.sig_range[1] = SIZE_MAX;  // signatures of another program are stale
  MemoryReport r = replay_with_capacity(p, dev, opt, Bytes{INT64_MAX}, micro, s);
  if (!opt.allocator || dev.memory.v <= 0 || r.reserved_peak <= capacity) return r;
  if (r.allocator_allocated_peak > capacity) {
    r.fits = false;
    r.allocator_oom = true;
    return r;
  }
  MemoryReport bounded = replay_with_capacity(p, dev, opt, capacity, micro, s);
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
