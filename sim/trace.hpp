#pragma once
// Chrome trace (Trace Event Format; opens in Perfetto and chrome://tracing) of a step
// program run in time: one process per rank, one thread (track) per stream, one
// complete ("X") slice per event named by its event id, and a counter ("C") track of
// allocated device bytes per category over time. The executor writes measured traces
// in the same layout, so the two open side by side. Of the copies of a repeated block
// (Program::repeat) the first 16 are shown event by event, the others as one slice per
// stream ("msA..msB: N repeated micro-steps", otherData.repeated_micro_steps says so), so a
// trace stays the size it has at GAS 20 whatever GAS is.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/graph.hpp"
#include "sim/compute_model.hpp"

#include "sim/engine.hpp"
#include "zero/program.hpp"

namespace zp::sim {

// What a compute event's op is (its slice's args "fn": the op's function, "gemm": whether it
// runs as matrix products) and the part of its time its biases take as kernels of their own:
// in backward the gradients' column sums, in forward (and recomputation) the add DeepSpeed
// runs apart (zero::Event::unfused_bias), each as sim::ComputeModel::bias_part prices it.
struct OpTraceInfo {
  std::string fn;
  bool gemm = false;
  bool attention = false;       // a fused attention op (its kernels are one class to a profiler)
  double backward_bias_s = 0;
  double forward_bias_s = 0;    // where the event adds the bias apart; 0 where the model prices no such add
  // Autograd's gradient adds of a backward event (sim::grad_accumulate_seconds): per byte, per add.
  double grad_add_s_per_byte = 0;
  double grad_add_launch_s = 0;
};
// `cm` (over `g`): the bias parts' times; without it, none are named.
std::vector<OpTraceInfo> op_trace_info(const models::OpGraph& g, const ComputeModel* cm = nullptr);

// Whether event e's work runs on the GPU: not a marker, not on the host stream, not the
// host's optimizer step or a copy between host buffers.
bool on_device(const zero::Event& e);

// The classes a profiler names a device event's kernels by (tools/deepspeed_reference.py's
// kernel_class): the fused attention's, matrix products, the optimizer's multi-tensor kernels,
// collectives, copies, the rest elementwise.
enum class ProfiledClass : std::uint8_t { gemm, attention, elementwise, optimizer, collective, copy };
inline constexpr int kNumProfiledClasses = 6;
static_assert(kNumProfiledClasses == static_cast<int>(ProfiledClass::copy) + 1);
std::string_view profiled_class_name(ProfiledClass c);

// Device event e's `seconds` by class: a linear op's products less its bias kernels
// (elementwise), a fused attention op's kernels, the rest by the event's kind. The one place
// predicted time is split so: calibration::phase_times (the gpu_gemm, gpu_attention and
// gpu_other observations) and the trace's "profiled" args (tools/deepspeed_compare.py's
// per-class table) both come from it.
// With `update`, a device optimizer event's fused update (ElementwisePricing::seconds of its flops and
// bytes) is the optimizer's class and the rest of it (the norm's reduction, the loops' kernels it
// carries) elementwise; without, all of it the optimizer's.
std::array<double, kNumProfiledClasses> profiled_split(const zero::Event& e, double seconds,
                                                        std::span<const OpTraceInfo> ops,
                                                        const ElementwisePricing* update = nullptr);

nlohmann::json chrome_trace(const zero::Program& p, const TimeReport& t, std::span<const OpTraceInfo> ops = {},
                            const ElementwisePricing* update = nullptr);
// Appends the events of one rank to an existing trace document (for several ranks).
void append_chrome_trace(nlohmann::json& doc, const zero::Program& p, const TimeReport& t,
                         std::span<const OpTraceInfo> ops = {}, const ElementwisePricing* update = nullptr);

}  // namespace zp::sim
