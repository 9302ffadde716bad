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

  MemoryReport run() {
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
    return finish();
  }

 private:
  static constexpr int kNone = -1000;

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
    const Event& e = p_.events[static_cast<std::size_t>(stored)];
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
      if (dev_live_[c] > r_.category_peak[c]) r_.category_peak[c] = dev_live_[c];
      if (opt_.allocator && !r_.allocator_oom) {
        auto h = alloc_.allocate(buf.bytes, static_cast<int>(e.stream));
        if (h) {
          auto& slot_h = handle_[slot(b, at)];
          if (slot_h >= 0) throw std::logic_error("memory replay: a copy's buffer outlives the copy after it");
          slot_h = *h;
        } else {
          r_.allocator_oom = true;
        }
      }
    }
    if (dev_total_ > r_.peak_allocated) {
      r_.peak_allocated = dev_total_;
      r_.peak_event = logical;
      r_.at_peak = dev_live_;
    }
    if (host_total_ > r_.peak_host) {
      r_.peak_host = host_total_;
      r_.host_at_peak = host_live_;
    }
    if (stored == p_.step_begin - 1) r_.persistent = dev_total_;
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
      if (opt_.allocator) {
        auto& h = handle_[slot(b, at)];
        if (h >= 0) {
          alloc_.free(h);
          h = -1;
        }
      }
    }
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
