#pragma once
// Inside the event engine (sim/engine.hpp): the logical events of a program whose block
// repeats (Program::repeat), and their simulation in integer nanoseconds.
//
// Logical events: stored ids [first, a) come before the micro-step stored just before the
// block (instance -1, stored [a, b)); the block is instance 0 (stored [b, c)); copies 1..K
// are not stored; the tail is stored [c, S) and stands at ids moved by K·d. An event of
// instance i, block index x, has logical id b + i·d + x. Without copies a = b = c = S.
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <vector>

#include "core/units.hpp"
#include "zero/program.hpp"

namespace zp::sim::engine_detail {

using Nanos = std::int64_t;
constexpr Nanos kUnset = std::numeric_limits<Nanos>::min();
constexpr int kNoInstance = std::numeric_limits<int>::min();
constexpr int kS = zero::kNumStreams;

// A cost in whole nanoseconds (the nearest; negative costs are 0).
Nanos to_ns(Seconds s);
inline Seconds to_seconds(Nanos ns) { return Seconds{static_cast<double>(ns) / 1e9}; }

// What the engine needs of a stored event, in one byte.
constexpr std::uint8_t kStreamMask = 0x03;
constexpr std::uint8_t kCollective = 0x04;   // kind collective
constexpr std::uint8_t kCompute = 0x08;      // kind compute
constexpr std::uint8_t kForward = 0x10;      // phase forward
static_assert(kS <= 4, "the stream is kept in two bits");

// Lists of ids per index (CSR).
struct Csr {
  std::vector<std::int32_t> begin;  // size + 1
  std::vector<std::int64_t> items;
  std::span<const std::int64_t> of(std::size_t i) const {
    return {items.data() + begin[i], static_cast<std::size_t>(begin[i + 1] - begin[i])};
  }
};

class Layout {
 public:
  explicit Layout(const zero::Program& p);

  const zero::Program& p;
  std::int64_t first = 0;             // Program::step_begin
  std::int64_t S = 0;                 // stored events
  std::int64_t a = 0, b = 0, c = 0;   // instance -1, the block, the tail
  std::int64_t d = 0;                 // events per micro-step
  int K = 0;                          // copies
  std::int64_t n = 0;                 // logical events
  std::vector<std::uint8_t> info;     // per stored event
  bool backward = true;               // every step dependency points to an earlier event
  std::array<std::vector<std::int64_t>, kS> pre, tail;  // per stream: its stored events before c, from c
  std::array<std::vector<std::int32_t>, kS> blk;        // per stream: its block indices
  std::array<std::int64_t, kS> count{};                 // per stream: its logical events
  // Dependents: `fixed` of stored events before a and `tail_csr` of tail events (stored
  // ids); `same` (same instance) and `next` (next instance) by block index (block
  // indices); `tail_same` / `tail_prev` by block index (tail stored ids waiting on copy K /
  // K - 1).
  Csr fixed, tail_csr, same, next, tail_same, tail_prev;

  std::int64_t stored(std::int64_t L) const {
    if (L < c) return L;
    if (L < c + static_cast<std::int64_t>(K) * d) return b + (L - c) % d;
    return L - static_cast<std::int64_t>(K) * d;
  }
  // Instance -1, 0 or the copy of a logical event; kNoInstance for the others.
  int instance(std::int64_t L) const {
    if (L < a) return kNoInstance;
    if (L < c + static_cast<std::int64_t>(K) * d) return static_cast<int>((L - b) >= 0 ? (L - b) / d : -1);
    return kNoInstance;
  }
  std::int64_t index(std::int64_t L) const { return (L - a) % d; }
  std::int64_t logical(int inst, std::int64_t x) const { return b + inst * d + x; }
  // How far a logical event's stored references move: its copy, K for the tail, else 0.
  int shift(std::int64_t L) const {
    if (L < c) return 0;
    if (L < c + static_cast<std::int64_t>(K) * d) return static_cast<int>(1 + (L - c) / d);
    return K;
  }
  std::int64_t move(std::int64_t r, int k) const { return r >= a ? r + k * d : r; }
  int stream(std::int64_t L) const { return info[static_cast<std::size_t>(stored(L))] & kStreamMask; }
  std::uint8_t flags(std::int64_t L) const { return info[static_cast<std::size_t>(stored(L))]; }
  // The logical event at position `pos` of stream s, and the position of logical event L.
  std::int64_t at(int s, std::int64_t pos) const;
  std::int64_t pos(std::int64_t L) const;
  // The previous event on L's stream, -1 for the first.
  std::int64_t stream_prev(std::int64_t L) const {
    if (L < c) return prev_stored_[static_cast<std::size_t>(L)];
    const std::int64_t q = pos(L);
    return q > 0 ? at(stream(L), q - 1) : -1;
  }
  // The step dependencies of L, as logical ids, in program order.
  template <class F>
  void deps(std::int64_t L, F&& f) const {
    const int k = shift(L);
    for (zero::EventId r : p.deps(p.events[static_cast<std::size_t>(stored(L))]))
      if (r >= first) f(move(r, k));
  }

 private:
  std::vector<std::int32_t> stored_pos_;  // per stored event: its position among its stream's stored events
  std::vector<std::int64_t> prev_stored_; // per stored event before c: the previous step event on its stream, -1
  std::vector<std::int32_t> blk_pos_;     // per block index: its position in blk[stream]
};

// Times of one copy run event by event.
struct Record {
  std::vector<Nanos> start, end;
  std::vector<std::int32_t> waiting;    // while running: unfinished dependencies
  std::int64_t done = 0;
};

struct Schedule {
  std::vector<Nanos> start, end;        // per stored event (the prologue's unset)
  std::map<int, Record> copies;         // the copies run event by event
  int reference = -1, last = -1;        // the periodic stretch: copies (reference, last]
  Nanos period = 0;
  std::int64_t processed = 0;
  Nanos start_of(const Layout& l, std::int64_t L) const {
    return L < l.c ? start[static_cast<std::size_t>(L)] : time_of(l, L, true);
  }
  Nanos end_of(const Layout& l, std::int64_t L) const {
    return L < l.c ? end[static_cast<std::size_t>(L)] : time_of(l, L, false);
  }
  bool periodic(int copy) const { return copy > reference && copy <= last; }

 private:
  Nanos time_of(const Layout& l, std::int64_t L, bool start) const;
};

// Runs every logical event of `l` (durations per stored event, ns).
Schedule simulate(const Layout& l, std::span<const Nanos> duration, double interference);

}  // namespace zp::sim::engine_detail
