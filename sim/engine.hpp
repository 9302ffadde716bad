#pragma once
// The event engine: runs a step program in simulated time. Each stream executes its
// events in program order; an event starts when its stream is free and its
// dependencies are done. Work progresses at rate 1, except compute while a collective
// is in flight on another stream, which progresses at 1 / (1 + interference).
// Deterministic: simultaneous completions are ordered by event id (ns-3 style keys).
//
// Time is kept in integer nanoseconds (each event's cost rounded to the nearest ns), so
// that running the same work later gives the same durations to the bit. That makes a
// repeated block (Program::repeat) cheap and exact: the engine runs the copies event by
// event until the state of its streams, taken as each copy starts, is the state it had
// when the copy before started, moved by one copy and by the time between the two (the
// period); from there every copy is the one before it moved by the period, so the engine
// moves its state over all the copies but the last few at once, and runs those and the
// events after them. When the state never repeats it runs every copy.
#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "core/units.hpp"
#include "zero/program.hpp"

namespace zp::sim {

struct EngineOptions {
  double interference = 0.0;        // compute slowdown while communication overlaps it
};

struct EventTime {
  Seconds start{}, end{};
  Seconds duration() const { return end - start; }
  bool operator==(const EventTime&) const = default;
};

struct PhaseTimes {
  Seconds forward{};                // Σ over micro-steps of the forward interval
  Seconds backward{};               // Σ over micro-steps of the backward interval (incl. exposed comm)
  Seconds backward_allreduce{};     // part of backward when the compute stream is not computing
  Seconds step{};                   // from the end of the last micro-step to the end
  Seconds iteration{};              // makespan of the program's step (prologue excluded)
  bool operator==(const PhaseTimes&) const = default;
};

// Exposed communication is a compute-stream gap bound by a collective, found back through
// what bound the event after the gap. An event passes that search on to what bound it when it
// is off the compute stream and is neither a collective nor the host thread's work (a gap the
// host bound is framework time). run_events and exposed_intervals both search this way.
inline bool passes_binding_on(bool collective, zero::Stream s) {
  return !collective && s != zero::Stream::compute && s != zero::Stream::host;
}

struct CommStats {
  std::array<Bytes, zero::kNumCollKinds> bytes{};     // bytes sent per rank, by kind
  std::array<Seconds, zero::kNumCollKinds> time{};    // Σ durations, by kind
  std::array<Seconds, zero::kNumCollKinds> exposed{}; // time the compute stream waited, by kind
  std::array<int, zero::kNumCollKinds> count{};
  Bytes total{};
  bool operator==(const CommStats&) const = default;
};

// Every event's start and end in integer nanoseconds, as the engine ran them: the stored
// events', the copies of the repeated block (Program::repeat) the engine ran event by
// event, and the copies of its periodic stretch (reference, last], each the reference copy
// moved by whole periods (copy 0 is the block itself).
struct ExactTimes {
  zero::Repeat repeat;                            // the program's
  std::vector<std::int64_t> start, end;           // per stored event
  std::map<int, std::vector<std::int64_t>> copy_start, copy_end;  // by copy, then block index
  int reference = -1, last = -1;
  std::int64_t period = 0;
  bool periodic(int copy) const { return copy > reference && copy <= last; }
  std::int64_t start_of(zero::EventId id) const { return time_of(id, true); }  // by logical id
  std::int64_t end_of(zero::EventId id) const { return time_of(id, false); }
  bool operator==(const ExactTimes&) const = default;

 private:
  std::int64_t time_of(zero::EventId id, bool start) const;
};

// The critical path, first event to last. Runs of events repeat: run r stands for its
// events, then the same events at ids moved by `step`, `times` times in all (a stretch of
// copies the path crosses the same way, each `step` ids after the one before).
struct CriticalPath {
  struct Run {
    std::vector<zero::EventId> events;
    std::int64_t times = 1;
    zero::EventId step = 0;
    bool operator==(const Run&) const = default;
  };
  std::vector<Run> runs;
  std::int64_t size() const;
  bool empty() const { return size() == 0; }
  zero::EventId back() const;
  // Every event, first to last (the whole path: for small programs and tests).
  std::vector<zero::EventId> events() const;
  template <class F>
  void for_each(F&& f) const {
    for (const Run& r : runs)
      for (std::int64_t t = 0; t < r.times; ++t)
        for (zero::EventId e : r.events) f(static_cast<zero::EventId>(e + t * r.step));
  }
  bool operator==(const CriticalPath&) const = default;
};

struct TimeReport {
  std::vector<EventTime> events;    // per stored event (prologue events at time 0, length 0)
  ExactTimes ns;                    // every event, in nanoseconds (empty when built by hand)
  PhaseTimes phases;
  CommStats comm;
  // The critical path, from the first event to the last: back from the last event to
  // finish (the highest id among equals), each time through whichever of its stream
  // predecessor and dependencies finished last (the highest id among equals).
  CriticalPath critical_path;
  std::array<Seconds, zero::kNumStreams> busy{};
  std::int64_t processed = 0;       // step events the engine accounted for
  // The time of any event, by logical id (Program::repeat).
  EventTime at(zero::EventId id) const;
  // Σ (end - start), in nanoseconds, over the logical events stored event `stored` stands
  // for (itself, and its copies when it is in the repeated block).
  std::int64_t total_duration_ns(zero::EventId stored) const;
};

// `t` as if `p` stored every micro-step (zero::expand(p)): `events` and `ns` give every
// event's time by its id. For consumers that index times by event; it grows with GAS.
TimeReport expand_times(const zero::Program& p, const TimeReport& t);

// The phases of a step whose event times were measured (an executor's), by the definitions
// run_events uses (PhaseTimes): `start[e]`, `end[e]` in seconds for every event of `p`, which
// must store every micro-step (zero::expand); the prologue's events and events with a
// non-finite start (not timed: the host events an executor does not run) are left out.
PhaseTimes phases_of_timeline(const zero::Program& p, std::span<const double> start, std::span<const double> end);

// `duration[e]`: the cost of stored event e at full rate (from the cost models); the copies
// of a repeated block cost what the block costs.
TimeReport run_events(const zero::Program& p, std::span<const Seconds> duration, const EngineOptions& opt = {});

// One event of the critical path, for reports (its name: Program::event_name(id)).
struct PathEvent {
  zero::EventId id = -1;
  zero::Stream stream = zero::Stream::compute;
  zero::EventKind kind = zero::EventKind::marker;
  Seconds start{}, end{};
  bool communication() const { return kind == zero::EventKind::collective; }
  Seconds duration() const { return end - start; }
};
PathEvent path_event(const zero::Program& p, const TimeReport& t, zero::EventId id);

// The critical path of `t` (a run of `p`) as events, first to last (every event: for small
// programs and tests; summarize_critical_path serves reports).
std::vector<PathEvent> critical_path_events(const zero::Program& p, const TimeReport& t);

// The `k` longest events of a path, longest first (lengths equal to the nanosecond in
// path order).
std::vector<PathEvent> longest_events(std::vector<PathEvent> path, std::size_t k);

// What reports show of the critical path, without listing it: its number of events, its
// length by event kind, and its `k` longest events as longest_events gives them.
struct PathSummary {
  std::int64_t num_events = 0;
  std::array<Seconds, zero::kNumEventKinds> by_kind{};  // by zero::EventKind
  std::array<bool, zero::kNumEventKinds> has_kind{};    // the path has events of the kind
  std::vector<PathEvent> longest;
};
PathSummary summarize_critical_path(const zero::Program& p, const TimeReport& t, std::size_t k);

}  // namespace zp::sim
