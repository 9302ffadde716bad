#pragma once
// Series for plots of one prediction (zeroplan report): device bytes per category over
// the step's events, and the intervals in which the compute stream waits for
// communication. Opt-in: simulate, explain and the planner never compute them. They take
// the program with every micro-step stored (zero::expand, sim::expand_times): they draw
// every event.
#include <cstddef>
#include <span>
#include <vector>

#include "core/units.hpp"
#include "sim/engine.hpp"
#include "sim/memory.hpp"
#include "zero/program.hpp"

namespace zp::sim {

// The step's events [first, last] (issue order) summarised by the one among them with
// the most device bytes live at its start (after its allocations, before its frees: where
// replay_memory looks for the peak; the first of equals).
struct MemorySample {
  zero::EventId first = 0, last = 0;
  zero::EventId at = 0;
  CategoryBytes bytes{};             // live device bytes per category at `at`
  Bytes total{};
};

struct MemorySeries {
  std::vector<MemorySample> samples; // in event order, covering every step event once
  std::int64_t step_events = 0;
  bool aggregated = false;           // more step events than samples: each sample covers several
  Bytes persistent{};                // live when the step begins (allocated by the prologue)
  // The highest sample: replay_memory's peak (bytes, event and breakdown) when the peak is
  // in the step.
  std::size_t peak_sample = 0;
};

// At most `max_samples` samples (>= 1), each covering the same number of events give or
// take one. One walk over the program's allocations; no allocator model.
MemorySeries memory_series(const zero::Program& p, std::size_t max_samples);

// An interval in which the compute stream waits for a collective, as run_events counts
// CommStats::exposed: a collective on the compute stream for its whole length, and the part
// of an idle gap of the compute stream during which the collective its start was bound to
// (through events of the other non-compute streams) ran. Summed by kind they equal
// `t.comm.exposed`.
struct ExposedInterval {
  Seconds start{}, end{};
  zero::EventId collective = -1;
  zero::CollKind kind = zero::CollKind::all_reduce;
};

std::vector<ExposedInterval> exposed_intervals(const zero::Program& p, const TimeReport& t);

}  // namespace zp::sim
