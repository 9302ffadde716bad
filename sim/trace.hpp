#pragma once
// Chrome trace (Trace Event Format; opens in Perfetto and chrome://tracing) of a step
// program run in time: one process per rank, one thread (track) per stream, one
// complete ("X") slice per event named by its event id, and a counter ("C") track of
// allocated device bytes per category over time. The executor writes measured traces
// in the same layout, so the two open side by side. Of the copies of a repeated block
// (Program::repeat) the first 16 are shown event by event, the others as one slice per
// stream ("msA..msB: N repeated micro-steps", otherData.repeated_micro_steps says so), so a
// trace stays the size it has at GAS 20 whatever GAS is.
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/graph.hpp"
#include "sim/compute_model.hpp"

#include "sim/engine.hpp"
#include "zero/program.hpp"

namespace zp::sim {

// What a compute event's op is, in its slice's args ("fn": the op's function, "gemm": whether
// it runs as matrix products, "bias_us": the part of its time its biases take as kernels of
// their own, the gradients' column sums in backward and, where DeepSpeed adds them apart
// (zero::Event::unfused_bias), the add in forward): how a profiler would class its kernels (the
// fused attention, GEMMs, the rest elementwise, the bias kernels among them), for
// tools/deepspeed_compare.py's per-class times (calibration::phase_times classes them the same
// way, through sim::ComputeModel::bias_part).
struct OpTraceInfo {
  std::string fn;
  bool gemm = false;
  double bias_grad_us = 0;     // backward
  double unfused_bias_us = 0;  // forward, where the event adds the bias apart
};
// `cm` (over `g`): the bias gradients' times; without it, none are named.
std::vector<OpTraceInfo> op_trace_info(const models::OpGraph& g, const ComputeModel* cm = nullptr);

nlohmann::json chrome_trace(const zero::Program& p, const TimeReport& t, std::span<const OpTraceInfo> ops = {});
// Appends the events of one rank to an existing trace document (for several ranks).
void append_chrome_trace(nlohmann::json& doc, const zero::Program& p, const TimeReport& t,
                         std::span<const OpTraceInfo> ops = {});

}  // namespace zp::sim
