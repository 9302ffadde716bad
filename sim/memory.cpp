#include "sim/memory.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "sim/caching_allocator.hpp"

namespace zp::sim {

using zero::Buffer;
using zero::BufferId;
using zero::Event;
using zero::EventId;
using zero::Placement;

namespace {

// The replay of one program: its events in issue order, a repeated block's copies
// (Program::repeat) replayed from the block with their buffers moved, until a copy starts
// from the state the copy before started from — the allocator's blocks at the same
// addresses, the same bytes live, the buffers the copy before left to this one on the same
// blocks: it then ends in that state too, with no new peak, and so does every later copy.
class Replay {
 public:
  Replay(const zero::Program& p, const DeviceSpec& dev, const MemoryOptions& opt, Bytes capacity)
      : p_(p), dev_(dev), opt_(opt), alloc_(CachingAllocatorOptions{capacity}) {
    const auto& rp = p.repeat;
    K_ = rp.copies;
    if (K_ > 0) {
      b_ = rp.first;
      d_ = rp.events;
      bb_ = rp.first_buffer;
      db_ = rp.buffers;
      ab_ = bb_ - db_;
    }
    if (opt.allocator) handle_.assign(p.buffers.size(), -1);
    if (opt.timeline) r_.timeline.reserve(static_cast<std::size_t>(std::min<std::int64_t>(p.num_events(), 1 << 24)));
  }

  // A steady-state step is never a process's first: its caching allocator has seen the
  // set-up and at least one step, whose requests shaped the segments it holds (reserved
  // bytes never shrink). The allocator model first replays the prologue and one first step
  // (requests only: no bytes are counted), with the buffers DeepSpeed creates during the
  // first step (zero::Buffer::first_step) requested right before that step's first
  // optimizer event; the replay proper counts the bytes of the prologue and the step and
  // continues the allocator from there.
  MemoryReport run() {
    if (opt_.allocator) {
      warm_ = true;
      pass();
      for (const auto& d : deferred_) allocate(d.buffer, d.stream, d.slot);
      deferred_.clear();
      warm_ = false;
      warmed_ = true;
      prev_.set = spare_.set = false;
      r_.skipped_micro_steps = 0;
    }
    pass();
    return finish();
  }

 private:
  static constexpr int kNone = -1000;

  void pass() {
    const auto S = static_cast<EventId>(p_.events.size());
    const EventId c = K_ > 0 ? b_ + d_ : S;
    for (EventId e = 0; e < c; ++e) {
      if (K_ > 0 && e == b_) {
        snapshot(prev_);  // the block starts with instance -1's buffers handed on
        carry_of(-1, prev_.carry);
      }
      event(e, e, e >= b_ - d_ && K_ > 0 ? (e >= b_ ? 0 : -1) : kNone);
    }
    copies();
    const EventId moved = static_cast<EventId>(static_cast<std::int64_t>(K_) * d_);
    for (EventId e = c; e < S; ++e) event(e, e + moved, K_ > 0 ? K_ : kNone);
  }

  void allocate(BufferId b, int stream, std::size_t slot_index) {
    if (r_.allocator_oom) return;
    auto h = alloc_.allocate(p_.buffers[static_cast<std::size_t>(b)].bytes, stream);
    if (h) {
      auto& slot_h = handle_[slot_index];
      if (slot_h >= 0) throw std::logic_error("memory replay: a copy's buffer outlives the copy after it");
      slot_h = *h;
    } else {
      r_.allocator_oom = true;
    }
  }

  // The warm-up's event: the allocator's requests only.
  void warm_event(EventId stored, int at) {
    const Event& e = p_.events[static_cast<std::size_t>(stored)];
    const bool in_step = stored >= p_.step_begin;
    if (in_step && e.kind == zero::EventKind::optimizer && !deferred_.empty()) {
      for (const auto& d : deferred_) allocate(d.buffer, d.stream, d.slot);
      deferred_.clear();
    }
    if (e.empty_cache) alloc_.empty_cache();
    for (BufferId b : p_.allocs(e)) {
      const Buffer& buf = p_.buffers[static_cast<std::size_t>(b)];
      if (buf.placement == Placement::host) continue;
      if (buf.first_step && !in_step) deferred_.push_back({b, static_cast<int>(e.stream), slot(b, at)});
      else allocate(b, static_cast<int>(e.stream), slot(b, at));
    }
    for (BufferId b : p_.frees(e)) {
      auto& h = handle_[slot(b, at)];
      if (h >= 0) {
        alloc_.free(h);
        h = -1;
      }
    }
  }

  // The slot (handle index) of stored buffer `r` referred to by an event of instance `at`
  // (the tail refers as copy K does): a reference into the block stands for the instance's
  // own buffer, one into the micro-step before it for the previous instance's. Instances
  // alternate between the two stored ranges: every buffer an instance allocates is freed
  // by the end of the next one.
  std::size_t slot(BufferId r, int at) const {
    if (at == kNone || K_ == 0 || r < ab_ || r >= bb_ + db_) return static_cast<std::size_t>(r);
    const bool own = r >= bb_;
    const int inst = own ? at : at - 1;
    const BufferId x = r - (own ? bb_ : ab_);
    return static_cast<std::size_t>(((inst % 2) + 2) % 2 == 1 ? ab_ + x : bb_ + x);
  }

  void event(EventId stored, EventId logical, int at) {
    if (warm_) {
      warm_event(stored, at);
      return;
    }
    const Event& e = p_.events[static_cast<std::size_t>(stored)];
    // After the warm-up the allocator already holds what the prologue left.
    const bool allocator_here = opt_.allocator && !(warmed_ && stored < p_.step_begin);
    if (e.empty_cache && allocator_here) alloc_.empty_cache();
    // Peaks are the step's: the prologue's set-up temporaries do not count (the persistent
    // bytes live at the step's start do).
    const bool in_step = stored >= p_.step_begin;
    if (stored == p_.step_begin) r_.category_peak = dev_live_;
    for (BufferId b : p_.allocs(e)) {
      const Buffer& buf = p_.buffers[static_cast<std::size_t>(b)];
      const auto c = static_cast<std::size_t>(buf.category);
      if (buf.placement == Placement::host) {
        host_live_[c] += buf.bytes;
        host_total_ += buf.bytes;
        continue;
      }
      dev_live_[c] += buf.bytes;
      dev_total_ += buf.bytes;
      if (in_step && dev_live_[c] > r_.category_peak[c]) r_.category_peak[c] = dev_live_[c];
      if (allocator_here) allocate(b, static_cast<int>(e.stream), slot(b, at));
    }
    if (in_step && dev_total_ > r_.peak_allocated) {
      r_.peak_allocated = dev_total_;
      r_.peak_event = logical;
      r_.at_peak = dev_live_;
    }
    if (in_step && host_total_ > r_.peak_host) {
      r_.peak_host = host_total_;
      r_.host_at_peak = host_live_;
    }
    for (BufferId b : p_.frees(e)) {
      const Buffer& buf = p_.buffers[static_cast<std::size_t>(b)];
      const auto c = static_cast<std::size_t>(buf.category);
      if (buf.placement == Placement::host) {
        host_live_[c] -= buf.bytes;
        host_total_ -= buf.bytes;
        continue;
      }
      dev_live_[c] -= buf.bytes;
      dev_total_ -= buf.bytes;
      if (allocator_here) {
        auto& h = handle_[slot(b, at)];
        if (h >= 0) {
          alloc_.free(h);
          h = -1;
        }
      }
    }
    if (stored == p_.step_begin - 1) r_.persistent = dev_total_;  // what the set-up leaves
    if (opt_.timeline) r_.timeline.push_back(dev_total_);
  }

  // The state an instance starts from; `carry`: the handles of the previous instance's
  // buffers (instance `at` - 1).
  struct State {
    CachingAllocatorModel alloc;
    CategoryBytes dev_live{}, host_live{};
    bool oom = false;
    std::vector<CachingAllocatorModel::Handle> carry;
    bool set = false;
  };
  std::size_t region(int inst) const { return static_cast<std::size_t>(((inst % 2) + 2) % 2 == 1 ? ab_ : bb_); }
  void snapshot(State& s) {
    if (opt_.timeline) return;
    s.alloc = alloc_;  // copy-assignment reuses the snapshot's storage
    s.dev_live = dev_live_;
    s.host_live = host_live_;
    s.oom = r_.allocator_oom;
    s.carry.clear();
    s.set = true;
  }
  void carry_of(int prev_inst, std::vector<CachingAllocatorModel::Handle>& out) const {
    out.clear();
    if (!opt_.allocator) return;
    const std::size_t r = region(prev_inst);
    out.assign(handle_.begin() + static_cast<std::ptrdiff_t>(r), handle_.begin() + static_cast<std::ptrdiff_t>(r + static_cast<std::size_t>(db_)));
  }

  void copies() {
    if (K_ == 0) return;
    for (int k = 1; k <= K_; ++k) {
      if (!opt_.timeline) {
        State& cur = spare_;
        snapshot(cur);
        carry_of(k - 1, cur.carry);
        const bool same = prev_.set && cur.dev_live == prev_.dev_live && cur.host_live == prev_.host_live &&
                          cur.oom == prev_.oom && cur.carry == prev_.carry && (!opt_.allocator || cur.alloc == prev_.alloc);
        if (same) {
          // Copies k .. K replay copy k - 1: the tail finds copy K's buffers where copy
          // k - 1's are.
          r_.skipped_micro_steps = K_ - k + 1;
          if (opt_.allocator && region(K_) != region(k - 1)) {
            const std::size_t from = region(k - 1), to = region(K_);
            for (std::size_t x = 0; x < static_cast<std::size_t>(db_); ++x) {
              handle_[to + x] = handle_[from + x];
              handle_[from + x] = -1;
            }
          }
          return;
        }
        std::swap(prev_, cur);
      }
      for (EventId x = 0; x < d_; ++x)
        event(b_ + x, p_.logical_event(b_ + x, k), k);
    }
  }

  MemoryReport finish() {
    if (p_.step_begin == 0) r_.persistent = Bytes{0};
    r_.context = dev_.context_overhead;
    if (opt_.allocator) {
      r_.reserved_peak = alloc_.peak_reserved();
      r_.allocator_allocated_peak = alloc_.peak_allocated();
      r_.segments = alloc_.segments();
      for (const auto& si : alloc_.segment_info()) {
        const auto stream = static_cast<zero::Stream>(si.stream);
        auto it = std::find_if(r_.pools.begin(), r_.pools.end(),
                               [&](const MemoryReport::Pool& q) { return q.stream == stream && q.small == si.small_pool; });
        if (it == r_.pools.end()) it = r_.pools.insert(r_.pools.end(), MemoryReport::Pool{stream, si.small_pool, 0, {}, {}, {}});
        ++it->segments;
        it->bytes += Bytes{si.size};
        it->allocated += Bytes{si.allocated};
        it->sizes.push_back(si.size);
      }
      std::sort(r_.pools.begin(), r_.pools.end(), [](const MemoryReport::Pool& a, const MemoryReport::Pool& b) {
        return std::pair{a.stream, a.small} < std::pair{b.stream, b.small};
      });
      for (auto& q : r_.pools) std::sort(q.sizes.rbegin(), q.sizes.rend());
    } else {
      r_.reserved_peak = r_.peak_allocated;
    }
    r_.device_used = r_.reserved_peak + r_.context;
    r_.fits = !r_.allocator_oom && r_.device_used <= dev_.memory;
    return std::move(r_);
  }

  const zero::Program& p_;
  const DeviceSpec& dev_;
  const MemoryOptions& opt_;
  CachingAllocatorModel alloc_;
  int K_ = 0;
  EventId b_ = 0, d_ = 0;
  BufferId ab_ = 0, bb_ = 0, db_ = 0;
  std::vector<CachingAllocatorModel::Handle> handle_;  // per stored buffer slot
  CategoryBytes dev_live_{}, host_live_{};
  Bytes dev_total_{}, host_total_{};
  State prev_, spare_;
  MemoryReport r_;
  bool warm_ = false, warmed_ = false;  // in the warm-up; after it
  struct Deferred {
    BufferId buffer;
    int stream;
    std::size_t slot;
  };
  std::vector<Deferred> deferred_;  // first-step buffers of the warm-up, not yet requested
};

}  // namespace

MemoryReport replay_memory(const zero::Program& p, const DeviceSpec& dev, const MemoryOptions& opt) {
  // Without a limit first: what the allocator would reserve. The device's capacity only
  // matters when that exceeds it (PyTorch then frees cached segments and retries); when
  // even the allocated bytes exceed it, nothing can make it fit.
  const Bytes capacity = dev.memory.v > 0 ? Bytes{dev.memory.v - dev.context_overhead.v} : Bytes{INT64_MAX};
  MemoryReport r = Replay(p, dev, opt, Bytes{INT64_MAX}).run();
  if (!opt.allocator || dev.memory.v <= 0 || r.reserved_peak <= capacity) return r;
  if (r.allocator_allocated_peak > capacity) {
    r.fits = false;
    r.allocator_oom = true;
    return r;
  }
  MemoryReport bounded = Replay(p, dev, opt, capacity).run();
  if (bounded.allocator_oom) {
    // Report what it would need; it does not fit.
    r.allocator_oom = true;
    r.fits = false;
    return r;
  }
  return bounded;
}

std::vector<BufferId> live_at(const zero::Program& p, zero::EventId at) {
  // Copies live what the stored event they copy lives (Program::repeat), by role, size
  // and category: walk the stored events to the one `at` stands for.
  const EventId stored = p.stored_event(at).id;
  std::vector<char> live(p.buffers.size(), 0);
  for (const Event& e : p.events) {
    for (BufferId b : p.allocs(e)) live[static_cast<std::size_t>(b)] = 1;
    if (e.id == stored) break;
    for (BufferId b : p.frees(e)) live[static_cast<std::size_t>(b)] = 0;
  }
  std::vector<BufferId> out;
  for (std::size_t b = 0; b < live.size(); ++b)
    if (live[b]) out.push_back(static_cast<BufferId>(b));
  return out;
}

}  // namespace zp::sim
