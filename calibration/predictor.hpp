#pragma once
// Observations priced through the simulator itself: kernels by sim::ComputeModel,
// collectives by sim::CollectiveModel, training phases by lowering the run's configuration
// once and running its step program through the event engine (sim::simulate_time) under
// each set of parameters. Whatever coefficient the simulator reads, the predictions follow.
#include <array>
#include <optional>
#include <span>
#include <vector>

#include "calibration/observation.hpp"
#include "calibration/params.hpp"
#include "models/graph.hpp"
#include "sim/collective_model.hpp"
#include "sim/compute_model.hpp"
#include "sim/device.hpp"
#include "sim/engine.hpp"
#include "sim/trace.hpp"
#include "zero/program.hpp"

namespace zp::calibration {

// Every phase of one run under one set of parameters: wall (DeepSpeed's timers), GPU busy, and
// the sum of its device events' times.
struct PhasePrediction {
  std::array<std::array<double, kNumQuantities>, kNumPhaseNames> seconds{};  // [PhaseName][Quantity]
};

// The phase times of a simulated step: the engine's phase summaries, the union of the device
// streams' event intervals per phase (forward; backward with its recomputation and
// reductions; the step; the whole iteration), and the sum of those events' durations.
// With the compute model that priced the step (`cm`, over the program's graph), also the
// summed time of each kernel class a profiler would see per phase (Quantity::gpu_gemm,
// gpu_attention, gpu_other): a fused attention op's events, a linear op's products less the
// parts sim::ComputeModel::bias_part names (its bias kernels), and everything else.
PhasePrediction phase_times(const zero::Program& p, const sim::TimeReport& t,
                            const std::vector<std::int32_t>& unmeasured = {}, const sim::ComputeModel* cm = nullptr,
                            const models::OpGraph* graph = nullptr);
// The same with the graph's ops as the trace has them (sim::op_trace_info; cli::StageResult::ops):
// the kernel classes from those, none where `ops` is empty.
PhasePrediction phase_times(const zero::Program& p, const sim::TimeReport& t, std::span<const sim::OpTraceInfo> ops,
                            const std::vector<std::int32_t>& unmeasured = {});

// Which of DeepSpeed's timer windows an event falls in: forward, backward (with its
// recomputation and the reductions issued from the backward hooks and epilogue), or step.
PhaseName timer_phase(const zero::Event& e);

class Predictor {
 public:
  // `cluster`: what the measurements ran on. Observations that do not fit it (a group larger
  // than the cluster, a run on more ranks) → InputError naming the observation's source.
  Predictor(const Dataset& data, const sim::ClusterSpec& cluster);

  // Seconds predicted for the observations with want[i] (all when `want` is empty) under `m`;
  // out[i] is left as it is for the others.
  void predict(const ModelParams& m, const std::vector<char>& want, std::vector<double>& out) const;
  std::vector<double> predict(const ModelParams& m) const;

  const sim::ClusterSpec& cluster() const { return cluster_; }
  const sim::DeviceSpec& device() const { return *device_; }
  const Dataset& data() const { return data_; }
  // The lowered program of run r (reports, tests).
  const zero::Program& program(int run) const { return runs_[static_cast<std::size_t>(run)].program; }

 private:
  struct Run {
    models::OpGraph graph;
    zero::Program program;
    std::optional<zero::Program> free_running;  // its iteration's (sim::free_running_program)
    std::vector<std::size_t> obs;
  };
  const Dataset& data_;
  sim::ClusterSpec cluster_;
  const sim::DeviceSpec* device_ = nullptr;
  sim::CollectiveModel collectives_;
  models::OpGraph empty_graph_;                  // for copies (priced without an op)
  std::vector<models::OpGraph> kernel_graphs_;   // one per activation dtype (and TF32 setting) of kernel observations
  std::vector<bool> kernel_graph_tf32_;          // whether that graph's fp32 GEMMs ran in TF32
  std::vector<bool> kernel_graph_cudnn_;         // whether its fused attention ran cuDNN's kernel
  std::vector<int> kernel_graph_;                // per observation: its graph, or -1
  std::vector<models::OpId> kernel_op_;          // per observation: its op in that graph, or kNone
  std::vector<std::vector<int>> groups_;         // per collective observation: its ranks
  std::vector<Run> runs_;
};

}  // namespace zp::calibration
