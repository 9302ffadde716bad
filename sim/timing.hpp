#pragma once
// Time prediction of a step program: each event priced by the cost models, then run on
// its streams by the event engine; summary figures as DeepSpeed's wall_clock_breakdown
// and its FLOPs profiler report them.
#include <vector>

#include "models/graph.hpp"
#include "sim/collective_model.hpp"
#include "sim/compute_model.hpp"
#include "sim/engine.hpp"
#include "zero/program.hpp"

namespace zp::sim {

// Duration of every stored event at full rate: compute, copy and optimizer events from the
// compute model, collectives from the collective model, markers 0 (the copies of a
// repeated block cost what the block costs).
std::vector<Seconds> event_durations(const zero::Program& p, const ComputeModel& compute,
                                     const CollectiveModel& collectives);

struct TimeSummary {
  TimeReport report;
  double samples_per_s = 0;          // global: micro × GAS × N per iteration
  double tokens_per_s = 0;
  double tflops = 0;                 // model FLOPs (forward + backward, no recomputation) per GPU per second / 1e12
  double mfu = 0;                    // tflops / peak dense tensor TFLOP/s
  // The iteration training runs, which the rates above follow: report.phases.iteration (the
  // makespan of the program whose events the report times, with a synchronisation between its
  // phases), or, where predict() simulated the program without those synchronisations
  // (zero::LowerOptions::phase_syncs), that one's makespan.
  Seconds iteration{};
};

TimeSummary simulate_time(const zero::Program& p, const models::OpGraph& g, const ComputeModel& compute,
                          const CollectiveModel& collectives, const EngineOptions& opt = {});

// `s` with `iteration` as its iteration time, and the rates that follow from it (p: the program
// `s` was simulated for).
void set_iteration(TimeSummary& s, Seconds iteration, const zero::Program& p, const models::OpGraph& g,
                   const ComputeModel& compute);

}  // namespace zp::sim
