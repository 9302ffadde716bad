#pragma once
// The order of a step's events on a device that runs each program stream (zero::Stream:
// compute, reduction, allgather, host) as a stream of its own, as DeepSpeed runs them on
// CUDA streams. Work on one stream runs in program order; across streams nothing is ordered
// unless a wait says so. StreamOrder says which waits, as the interpreter issues the events:
//
//   - dependency waits: an event waits for the events it depends on (zero::Program::deps)
//     that run on other streams. A host event (EventKind::host) stands for Python on the
//     host thread and runs nothing on the device here, so an event depending on one waits
//     for what that host event depended on instead.
//   - touch waits: before an event uses a buffer, it waits for the last use of that buffer
//     on every other stream, unless the waits so far already order it (vector clocks). Buffer
//     uses are reported by the interpreter as it binds operands, so no data race is possible
//     whatever the program's dependencies say; a program whose dependencies are complete
//     needs none of these (`Stats::touch_waits` counts them: tests hold the lowering to 0).
//   - reuse waits: a buffer freed to the caching allocator's pool of the stream it was
//     allocated on (PyTorch's rule: blocks return to their stream's pool) may be handed to
//     the next allocation on that stream at once, so that stream's next event waits for the
//     buffer's last use on every other stream (what `record_stream` guarantees in PyTorch).
//
// An allocation counts as a use by the allocating event (it may zero-fill the buffer there).
// Every wait names an earlier event of the same step: the executor drains every stream at
// the end of a step, so a step starts with everything before it done.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zero/program.hpp"

namespace zp::exec {

class StreamOrder {
 public:
  struct Stats {
    std::int64_t dep_waits = 0, touch_waits = 0, reuse_waits = 0;
    std::vector<std::string> unordered;  // the first few uses that needed a touch wait, described
  };

  // `p`: the program as the interpreter runs it (expanded: no Repeat).
  explicit StreamOrder(const zero::Program& p);

  void step_begin();
  // Event `e` (in program order) starts: its stream and the earlier events on other
  // streams it must wait for first (valid until the next call).
  std::span<const zero::EventId> begin(zero::EventId e);
  // The current event uses buffer b (reads or writes it): the events it must wait for
  // first (usually none; valid until the next call).
  std::span<const zero::EventId> touch(zero::BufferId b);
  // Buffer b allocated by the current event from the pool of `pool_stream` (the event's own,
  // or, for a buffer made at the first step, the stream of the set-up event it belongs to):
  // the waits that reusing that pool's memory needs when it is not this event's stream.
  std::span<const zero::EventId> allocated(zero::BufferId b, int pool_stream);
  void freed(zero::BufferId b);  // at the end of the current event
  void step_end();               // after the step's last event: uses outside events are not tracked
  const Stats& stats() const { return stats_; }
  void set_reuse_waits(bool on) { reuse_waits_ = on; }  // tests only: see Interpreter::trace_streams
  // Whether event `e` runs nothing on the device (a host event).
  bool transparent(zero::EventId e) const;

 private:
  static constexpr int kStreams = zero::kNumStreams;
  using Clock = std::array<std::int32_t, kStreams>;  // per stream: the latest position known done
  using Frontier = std::array<zero::EventId, kStreams>;  // per stream: the latest event to wait for

  void wait_for(zero::EventId w);  // the current stream waits for event w (another stream's)

  const zero::Program& p_;
  std::vector<std::int32_t> seq_;   // per event: its position on its stream in this step (1-based)
  std::vector<Clock> clock_;        // per event: what it is ordered after (real events)
  std::vector<Frontier> frontier_;  // per event: what waiting for it means (host events: their deps')
  std::vector<std::array<zero::EventId, kStreams>> last_use_;  // per buffer and stream: latest user
  std::vector<std::int8_t> alloc_stream_;                      // per buffer
  std::array<Clock, kStreams> now_{};        // per stream: the clock of its latest work
  std::array<std::int32_t, kStreams> count_{};
  std::array<zero::EventId, kStreams> prev_{};       // per stream: the latest event (any kind)
  std::array<zero::EventId, kStreams> last_real_{};  // per stream: the latest event run on the device
  std::array<Frontier, kStreams> pending_{};  // per stream: reuse waits for its next event
  zero::EventId cur_ = -1;
  int cur_stream_ = 0;
  std::vector<zero::EventId> out_;
  Stats stats_;
  bool reuse_waits_ = true;
};

}  // namespace zp::exec
