#pragma once
// The event engine: runs a step program in simulated time. Each stream executes its
// events in program order; an event starts when its stream is free and its
// dependencies are done. Work progresses at rate 1, except compute while a collective
// is in flight on another stream, which progresses at 1 / (1 + interference).
// Deterministic: simultaneous completions are ordered by event id (ns-3 style keys).
#include <array>
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
};

struct PhaseTimes {
  Seconds forward{};                // Σ over micro-steps of the forward interval
  Seconds backward{};               // Σ over micro-steps of the backward interval (incl. exposed comm)
  Seconds backward_allreduce{};     // part of backward when the compute stream is not computing
  Seconds step{};                   // from the end of the last micro-step to the end
  Seconds iteration{};              // makespan of the program's step (prologue excluded)
};

struct CommStats {
  std::array<Bytes, zero::kNumCollKinds> bytes{};     // bytes sent per rank, by kind
  std::array<Seconds, zero::kNumCollKinds> time{};    // Σ durations, by kind
  std::array<Seconds, zero::kNumCollKinds> exposed{}; // time the compute stream waited, by kind
  std::array<int, zero::kNumCollKinds> count{};
  Bytes total{};
};

struct TimeReport {
  std::vector<EventTime> events;    // per event (prologue events at time 0, length 0)
  PhaseTimes phases;
  CommStats comm;
  // The critical path, from the first event to the last: back from the last event to
  // finish (the highest id among equals), each time through whichever of its stream
  // predecessor and dependencies finished last (the highest id among equals).
  std::vector<zero::EventId> critical_path;
  std::array<Seconds, zero::kNumStreams> busy{};
  std::int64_t processed = 0;       // events the engine processed
};

// `duration[e]`: the cost of event e at full rate (from the cost models).
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

// The critical path of `t` (a run of `p`) as events, first to last.
std::vector<PathEvent> critical_path_events(const zero::Program& p, const TimeReport& t);

// The `k` longest events of a path, longest first (lengths equal to the nanosecond in
// path order).
std::vector<PathEvent> longest_events(std::vector<PathEvent> path, std::size_t k);

}  // namespace zp::sim
