#include "calibration/params.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/json_util.hpp"

namespace zp::calibration {

std::string op_factor_name(models::OpKind kind, bool backward);

namespace {

constexpr double kMicro = 1e-6;
constexpr double kGiga = 1e9;

using CC = sim::CollectiveCoefficients;

const char* const kLevelNames[CC::kLevels] = {"intra", "inter"};
const char* const kAlgoNames[CC::kAlgos] = {"ring", "tree", "nvls", "p2p"};
const char* const kProtoNames[CC::kProtos] = {"ll", "ll128", "simple"};

ParamDef scalar(std::string name, ParamGroup g, std::string unit, std::string what, std::string by, double lo,
                double hi, bool coarse, std::function<double(const ModelParams&)> get,
                std::function<void(ModelParams&, double)> set) {
  ParamDef d;
  d.fields = {name};
  d.name = std::move(name);
  d.group = g;
  d.unit = std::move(unit);
  d.what = std::move(what);
  d.determined_by = std::move(by);
  d.lo = lo;
  d.hi = hi;
  d.coarse = coarse;
  d.get = std::move(get);
  d.set = std::move(set);
  return d;
}

// A host cost in µs: linear (0 is a legitimate value), steps of 100 µs.
ParamDef host_us(const std::string& name, std::string what, std::string by, Seconds sim::HostCosts::*field) {
  ParamDef d = scalar(
      "host." + name, ParamGroup::host, "us", std::move(what), std::move(by), 0, 1e6, true,
      [field](const ModelParams& m) { return (m.device.host.*field).v / kMicro; },
      [field](ModelParams& m, double v) { m.device.host.*field = Seconds{v * kMicro}; });
  d.log_scale = false;
  d.typical = 100;
  return d;
}

ParamDef step_us(const std::string& wrapper, bool base, sim::HostCosts::Step sim::HostCosts::*field) {
  const std::string name = fmt::format("host.step.{}.{}", wrapper, base ? "base_us" : "per_tensor_us");
  ParamDef d = scalar(
      name, ParamGroup::host, "us",
      base ? fmt::format("the {} step's fixed host work", wrapper)
           : fmt::format("the {} step's host work per parameter tensor", wrapper),
      base ? fmt::format("step phases of runs whose optimizer DeepSpeed wraps in {}", wrapper)
           : fmt::format("step phases of {} runs of models with different numbers of parameter tensors", wrapper),
      0, 1e6, true,
      [field, base](const ModelParams& m) {
        const auto& s = m.device.host.*field;
        return (base ? s.base : s.per_tensor).v / kMicro;
      },
      [field, base](ModelParams& m, double v) {
        auto& s = m.device.host.*field;
        (base ? s.base : s.per_tensor) = Seconds{v * kMicro};
      });
  d.log_scale = false;
  d.typical = base ? 1000 : 100;
  return d;
}

// A collective factor over every (algorithm, protocol) cell that matches; the cells keep
// their ratios (the parameter is their geometric mean and moves them together).
ParamDef collective_factor(bool bandwidth, int level, int algo, int proto) {
  std::vector<std::size_t> cells;
  for (int a = 0; a < CC::kAlgos; ++a)
    for (int p = 0; p < CC::kProtos; ++p) {
      if (algo >= 0 && a != algo) continue;
      if (proto >= 0 && p != proto) continue;
      if (a == 2 && (level == CC::inter || p != 2)) continue;  // NVLS: one node, Simple only
      cells.push_back(CC::at(level, a, p));
    }
  std::string name = fmt::format("collective.{}.{}", kLevelNames[level], bandwidth ? "bandwidth" : "latency");
  if (algo >= 0) name += fmt::format(".{}", kAlgoNames[algo]);
  if (proto >= 0) name += fmt::format(".{}", kProtoNames[proto]);
  const std::string where = level == CC::intra ? "inside a node" : "between nodes";
  std::string scope = algo < 0 ? "every algorithm and protocol"
                               : proto < 0 ? fmt::format("{} (every protocol)", kAlgoNames[algo])
                                           : fmt::format("{} with {}", kAlgoNames[algo], kProtoNames[proto]);
  const std::string what = bandwidth
                               ? fmt::format("factor on the bandwidth {} the topology gives, for {}", where, scope)
                               : fmt::format("factor on the latency terms {}, for {}", where, scope);
  std::string by = level == CC::intra
                       ? "collectives among GPUs of one node (nccl-tests, or mpirun -np N zeroplan collectives --measure "
                         "--out FILE, on one node with 2 or more GPUs)"
                       : "collectives across nodes (nccl-tests, or mpirun zeroplan collectives --measure --out FILE, on 2 "
                         "or more nodes)";
  by += bandwidth ? ", at large messages (64 MiB and more)" : ", at small messages (64 KiB and less)";
  if (algo >= 0) by += fmt::format(", of the sizes where the model picks {}", scope);
  ParamDef d;
  d.name = name;
  d.group = ParamGroup::collective;
  d.unit = "";
  d.what = what;
  d.determined_by = by;
  d.lo = 0.01;
  d.hi = 100;
  // The default set: bandwidth per level, latency per level and algorithm (a ring's and a
  // tree's latencies grow differently with the group, so one factor cannot serve both).
  d.coarse = proto < 0 && (bandwidth ? algo < 0 : algo >= 0);
  d.detail = algo >= 0 && proto >= 0;
  d.stage = bandwidth ? 0 : 1;
  for (std::size_t c : cells) d.fields.push_back(fmt::format("collective.{}[{}]", bandwidth ? "bandwidth" : "latency", c));
  d.get = [cells, bandwidth](const ModelParams& m) {
    const auto& t = bandwidth ? m.collective.bandwidth : m.collective.latency;
    double s = 0;
    for (std::size_t c : cells) s += std::log(t[c]);
    return std::exp(s / static_cast<double>(cells.size()));
  };
  d.set = [cells, bandwidth, get = d.get](ModelParams& m, double v) {
    const double ratio = v / get(m);
    auto& t = bandwidth ? m.collective.bandwidth : m.collective.latency;
    for (std::size_t c : cells) t[c] *= ratio;
  };
  return d;
}

std::vector<ParamDef> build_registry() {
  std::vector<ParamDef> r;
  using M = ModelParams;
  // Compute model (sim/compute_model.hpp).
  r.push_back(scalar("compute.gemm_max_efficiency", ParamGroup::compute, "",
                     "GEMM efficiency of large products (fraction of the peak tensor FLOP/s)",
                     "GEMMs of large shapes (calibrate --device cuda) or GEMM-bound phases of training runs", 0.01, 1,
                     true, [](const M& m) { return m.device.gemm_max_efficiency; },
                     [](M& m, double v) { m.device.gemm_max_efficiency = v; }));
  r.push_back(scalar("compute.gemm_half_dim", ParamGroup::compute, "",
                     "GEMM dimension at which one factor of the efficiency curve is half (x / (x + h))",
                     "GEMMs of small and large dimensions (calibrate --device cuda), or runs of several micro-batches",
                     1, 1e5, true, [](const M& m) { return m.device.gemm_half_dim; },
                     [](M& m, double v) { m.device.gemm_half_dim = v; }));
  r.push_back(scalar("compute.fp32_gemm_half_dim", ParamGroup::compute, "",
                     "the efficiency curve's half-point for GEMMs on the fp32 cores (fp32 models without TF32)",
                     "GEMM-bound phases of fp32 runs (or their GEMMs measured with calibrate --device cuda)", 1, 1e5,
                     true, [](const M& m) { return m.device.fp32_half(); },
                     [](M& m, double v) { m.device.fp32_gemm_half_dim = v; }));
  r.push_back(scalar("compute.gemm_unaligned_factor", ParamGroup::compute, "",
                     "factor on GEMM efficiency when a dimension is only 2-byte aligned (graded by (bytes / 2)^0.72: "
                     "4-byte aligned 1.65 times it, 8-byte 2.71 times, at most 1)",
                     "a GEMM with a dimension not a multiple of 8 elements (GPT-2's vocabulary of 50257)", 0.01, 1, true,
                     [](const M& m) { return m.device.gemm_unaligned_factor; },
                     [](M& m, double v) { m.device.gemm_unaligned_factor = v; }));
  r.push_back(scalar("compute.torch_gemm_unaligned_output_factor", ParamGroup::compute, "",
                     "the same factor for PyTorch's products whose output rows are 2-byte aligned (an odd "
                     "vocabulary's logits: cuBLAS's CUTLASS fallback as PyTorch calls it)",
                     "the head's forward of a model with an odd vocabulary in DeepSpeed runs' GPU time (GPT-2's "
                     "50257) beside its backward",
                     0.01, 1, true, [](const M& m) { return m.device.torch_unaligned_output(); },
                     [](M& m, double v) { m.device.torch_gemm_unaligned_output_factor = v; }));
  r.push_back(scalar("compute.elementwise_efficiency", ParamGroup::compute, "",
                     "fraction of the HBM bandwidth bandwidth-bound kernels reach",
                     "bandwidth-bound kernels of several MiB (elementwise, normalisation, softmax), or phases they dominate",
                     0.01, 1, true, [](const M& m) { return m.device.elementwise_efficiency; },
                     [](M& m, double v) { m.device.elementwise_efficiency = v; }));
  // Fused attention's own factors, forward and backward.
  for (const auto& [pass, field] : std::vector<std::pair<std::string, double sim::DeviceProfile::*>>{
           {"forward", &sim::DeviceProfile::attention_efficiency},
           {"backward", &sim::DeviceProfile::attention_backward_efficiency}})
    r.push_back(scalar(pass == "forward" ? "compute.attention_efficiency" : "compute.attention_backward_efficiency",
                       ParamGroup::compute, "",
                       "factor on the GEMM-curve efficiency of fused attention kernels (sdpa, flash), " + pass,
                       fmt::format("fused attention {} kernels (calibrate --device cuda on a model with sdpa attention), "
                                   "or {} phases of sdpa runs beside eager ones",
                                   pass, pass),
                       0.01, 5, true, [field](const M& m) { return m.device.*field; },
                       [field](M& m, double v) { m.device.*field = v; }));
  r.push_back(scalar("compute.attention_half_seq", ParamGroup::compute, "",
                     "sequence length at which fused attention's curve is half (x / (x + h) along the sequence)",
                     "fused attention kernels at two or more sequence lengths (training runs or micro-benchmarks of "
                     "models with short and long sequences, BERT's 128 tokens beside GPT-2's 1024)",
                     1, 1e5, true, [](const M& m) { return m.device.attention_half(); },
                     [](M& m, double v) { m.device.attention_half_seq = v; }));
  r.push_back(scalar("compute.torch_attention_half_seq", ParamGroup::compute, "",
                     "the same half-point for the attention kernel PyTorch runs (sdpa under DeepSpeed: cuDNN's "
                     "flash kernel on Hopper)",
                     "DeepSpeed runs' attention time (their GPU profiles' attention class) at two or more sequence "
                     "lengths, BERT's 128 tokens beside GPT-2's 1024",
                     1, 1e5, true, [](const M& m) { return m.device.torch_attention_half(); },
                     [](M& m, double v) { m.device.torch_attention_half_seq = v; }));
  r.push_back(scalar("compute.attention_dropout_efficiency", ParamGroup::compute, "",
                     "factor on the forward attention factor when the fused kernel draws a dropout mask (dropout_p > 0)",
                     "forward attention kernels with dropout (training runs of models with attention dropout, GPT-2, "
                     "BERT) beside ones without (calibrate --device cuda, or a model without it)",
                     0.01, 5, true, [](const M& m) { return m.device.attention_dropout_efficiency; },
                     [](M& m, double v) { m.device.attention_dropout_efficiency = v; }));
  r.push_back(scalar("compute.attention_dropout_backward_efficiency", ParamGroup::compute, "",
                     "factor on the backward attention factor when the fused kernel regenerates a dropout mask",
                     "backward attention kernels with dropout (training runs of GPT-2 or BERT) beside ones without "
                     "(calibrate --device cuda, or a model without it)",
                     0.01, 5, true, [](const M& m) { return m.device.attention_dropout_backward(); },
                     [](M& m, double v) { m.device.attention_dropout_backward_efficiency = v; }));
  r.push_back(scalar("compute.optimizer_efficiency", ParamGroup::compute, "",
                     "factor on the elementwise efficiency for the optimizer's update on the device (fused Adam over "
                     "master, gradients and states)",
                     "the step's optimizer events of training runs (zeroplan train --out; there its product with "
                     "compute.executor_optimizer_efficiency, which the same events cannot tell apart)",
                     0.05, 10, false, [](const M& m) { return m.device.optimizer_efficiency; },
                     [](M& m, double v) { m.device.optimizer_efficiency = v; }));
  // zeroplan's executor's own kernels (priced so only where ComputeModel::deepspeed is off).
  for (const auto& [pass, field] : std::vector<std::pair<std::string, double sim::DeviceProfile::*>>{
           {"forward", &sim::DeviceProfile::executor_attention_efficiency},
           {"backward", &sim::DeviceProfile::executor_attention_backward_efficiency}})
    r.push_back(scalar(pass == "forward" ? "compute.executor_attention_efficiency"
                                         : "compute.executor_attention_backward_efficiency",
                       ParamGroup::compute, "",
                       "factor on the attention factors for zeroplan's executor's own 16-bit fused attention, " + pass +
                           " (its kernels, not cuDNN's)",
                       fmt::format("the {} attention events of train --device cuda --out runs with the own kernels "
                                   "(the default --attention-kernel)",
                                   pass),
                       0.01, 10, true, [field](const M& m) { return m.device.*field; },
                       [field](M& m, double v) { m.device.*field = v; }));
  r.push_back(scalar("compute.executor_optimizer_efficiency", ParamGroup::compute, "",
                     "factor on the optimizer's efficiency for zeroplan's executor's Adam (one kernel over the flat "
                     "partition)",
                     "the step's optimizer events of train --device cuda --out runs", 0.05, 10, false,
                     [](const M& m) { return m.device.executor_optimizer_efficiency; },
                     [](M& m, double v) { m.device.executor_optimizer_efficiency = v; }));
  r.push_back(scalar("compute.kernel_launch_us", ParamGroup::compute, "us", "launch overhead per kernel",
                     "kernels too small to be bandwidth- or FLOP-bound (a few KiB)", 0.01, 1000, true,
                     [](const M& m) { return m.device.kernel_launch.v / kMicro; },
                     [](M& m, double v) { m.device.kernel_launch = Seconds{v * kMicro}; }));
  r.push_back(scalar("compute.copy_launch_us", ParamGroup::compute, "us", "fixed cost of a memory copy (its floor)",
                     "copies too small to be bandwidth-bound (a training run's per-parameter gradient copies)", 0.01, 1000,
                     true, [](const M& m) { return m.device.copy_launch.v / kMicro; },
                     [](M& m, double v) { m.device.copy_launch = Seconds{v * kMicro}; }));
  r.push_back(scalar("compute.h2d_launch_us", ParamGroup::compute, "us",
                     "fixed cost of a host ↔ device copy (a PCIe round trip, staging pageable memory)",
                     "small host-to-device copies (a training run's batch)", 0.01, 1e4, true,
                     [](const M& m) { return m.device.h2d_launch.v / kMicro; },
                     [](M& m, double v) { m.device.h2d_launch = Seconds{v * kMicro}; }));
  r.push_back(scalar("compute.norm_tensor_us", ParamGroup::compute, "us",
                     "DeepSpeed's gradient norm's (and overflow check's) local work per gradient tensor it visits (a "
                     "kernel each; zeroplan's executor sums them all in one, priced at the kernel launch)",
                     "the step's GPU time of DeepSpeed runs at stages 1 and 2, whose norm visits every parameter's "
                     "gradient",
                     0.01, 1e4, true, [](const M& m) { return m.device.norm_tensor.v / kMicro; },
                     [](M& m, double v) { m.device.norm_tensor = Seconds{v * kMicro}; }));
  r.push_back(scalar("compute.executor_norm_us", ParamGroup::compute, "us",
                     "zeroplan's executor's gradient norm (and overflow check): the fixed cost of its one "
                     "multi-tensor kernel, beside reading the gradients",
                     "the step's gradient-norm events of train --device cuda --out runs", 0.01, 1e4, true,
                     [](const M& m) { return m.device.executor_norm_cost().v / kMicro; },
                     [](M& m, double v) { m.device.executor_norm = Seconds{v * kMicro}; }));
  {
    ParamDef d = scalar("compute.copy_piece_us", ParamGroup::compute, "us",
                        "cost per contiguous piece of a copy beyond the first (a stack that copies a flatten's tensors one "
                        "by one)",
                        "copies of many tensors at once (a training run's flatten and bucket copies) beside single copies",
                        0, 1000, true, [](const M& m) { return m.device.copy_piece.v / kMicro; },
                        [](M& m, double v) { m.device.copy_piece = Seconds{v * kMicro}; });
    d.log_scale = false;
    d.typical = 1;
    r.push_back(std::move(d));
  }
  {
    ParamDef d = scalar("compute.host_launch_us", ParamGroup::compute, "us",
                        "the host's cost of issuing one piece of a copy, where the device waits for it (the copies "
                        "issued right after the host read the gradient norm back)",
                        "the step's flatten of the partition's gradients at stages 1 and 2 (training runs, zeroplan "
                        "train --out), issued one parameter at a time after the norm",
                        0, 1000, true, [](const M& m) { return m.device.host_launch.v / kMicro; },
                        [](M& m, double v) { m.device.host_launch = Seconds{v * kMicro}; });
    d.log_scale = false;
    d.typical = 5;
    r.push_back(std::move(d));
  }
  r.push_back(scalar("compute.d2d_copy_gbps", ParamGroup::compute, "GB/s",
                     "memcpy within the device (bytes read + written)", "device-to-device copies of several MiB", 0.1,
                     1e5, true, [](const M& m) { return m.device.d2d_copy_bandwidth.v / kGiga; },
                     [](M& m, double v) { m.device.d2d_copy_bandwidth = BytesPerSecond{v * kGiga}; }));
  r.push_back(scalar("compute.pcie_h2d_gbps", ParamGroup::compute, "GB/s", "host ↔ device copies, per direction",
                     "host-to-device copies of several MiB, or runs with offload_optimizer", 0.1, 1e5, true,
                     [](const M& m) { return m.device.pcie_h2d.v / kGiga; },
                     [](M& m, double v) { m.device.pcie_h2d = BytesPerSecond{v * kGiga}; }));
  r.push_back(scalar("compute.host_memcpy_gbps", ParamGroup::compute, "GB/s",
                     "memcpy within host memory (bytes read + written)",
                     "host memory copies of several MiB, or runs with offload_optimizer", 0.1, 1e5, true,
                     [](const M& m) { return m.device.host_memcpy_bandwidth.v / kGiga; },
                     [](M& m, double v) { m.device.host_memcpy_bandwidth = BytesPerSecond{v * kGiga}; }));
  r.push_back(scalar("compute.cpu_adam_params_per_second", ParamGroup::compute, "1/s",
                     "DeepSpeed CPUAdam throughput on the host (parameters per second)",
                     "step phases of runs with offload_optimizer", 1e6, 1e13, true,
                     [](const M& m) { return m.device.cpu_adam_params_per_second; },
                     [](M& m, double v) { m.device.cpu_adam_params_per_second = v; }));
  {
    ParamDef d = scalar("compute.comm_compute_interference", ParamGroup::compute, "",
                        "slowdown of compute while a collective overlaps it (rate 1 / (1 + x))",
                        "runs with overlap_comm on and off whose communication overlaps compute", 0, 10, true,
                        [](const M& m) { return m.device.comm_compute_interference; },
                        [](M& m, double v) { m.device.comm_compute_interference = v; });
    d.log_scale = false;
    d.typical = 0.5;
    r.push_back(std::move(d));
  }
  // PyTorch's bandwidth-bound kernels per family (sim::TorchKernel), where the events stand for
  // PyTorch's (DeepSpeed runs): not in the default set, as the executor runs none of them. A
  // family the profile leaves unset reads as elementwise_efficiency, and a fit writes it in.
  for (int k = 0; k < sim::kNumTorchKernels; ++k) {
    const auto family = static_cast<sim::TorchKernel>(k);
    ParamDef d = scalar(fmt::format("compute.torch_kernel_efficiency.{}", sim::torch_kernel_name(family)), ParamGroup::compute,
                        "", fmt::format("fraction of the HBM bandwidth PyTorch's {} kernels reach", sim::torch_kernel_name(family)),
                        "DeepSpeed runs' GPU time of bandwidth-bound kernels (their profiles' elementwise class, or the "
                        "phases it dominates)",
                        0.01, 1, false, [family](const M& m) { return m.device.torch_efficiency(family); },
                        [k](M& m, double v) { m.device.torch_kernel_efficiency[static_cast<std::size_t>(k)] = v; });
    d.stage = 2;
    r.push_back(std::move(d));
  }
  // Per op kind, forward and backward: factors on elementwise_efficiency (not in the compute
  // group's default set: calibrate adds the kinds its training runs' events measure).
  for (int k = 0; k < models::kNumOpKinds; ++k) {
    const auto kind = static_cast<models::OpKind>(k);
    for (bool bwd : {false, true}) {
      ParamDef d = scalar(op_factor_name(kind, bwd), ParamGroup::compute, "",
                          fmt::format("factor on the bandwidth efficiency of {} kernels, {}", models::op_kind_name(kind),
                                      bwd ? "backward" : "forward"),
                          fmt::format("the {} events of training runs (zeroplan train --out) of a model with {} ops",
                                      bwd ? "backward" : "forward", models::op_kind_name(kind)),
                          0.01, 20, false, [kind, bwd](const M& m) { return m.device.op_factor(kind, bwd); },
                          [kind, bwd](M& m, double v) { m.device.op_factor(kind, bwd) = v; });
      d.stage = 2;
      r.push_back(std::move(d));
    }
  }
  // Host costs (sim::HostCosts), run by the event engine on the host's clock.
  using H = sim::HostCosts;
  const std::string wall = "wall-clock phases of runs whose host bounds them (DeepSpeed logs, recorded runs)";
  {
    // Every host cost at once: the one coefficient that moves a profile to a faster or slower host.
    // Not in the host group's default set (it and the costs it multiplies cannot be told apart).
    ParamDef d = scalar("host.scale", ParamGroup::host, "",
                        "a factor on every host cost (a host that runs DeepSpeed's Python faster or slower)",
                        "wall-clock phases of runs whose host bounds them, any model and stage", sim::kMinHostScale,
                        sim::kMaxHostScale, false,
                        [](const ModelParams& m) { return m.device.host.scale; },
                        [](ModelParams& m, double v) { m.device.host.scale = v; });
    r.push_back(std::move(d));
  }
  // Each per-event host cost: its key, what it prices, and which observations determine it.
  struct PerEvent {
    const char* key;
    const char* what;
    std::string determined_by;
    Seconds H::*member;
  };
  const std::string stage3_linear_runs = "phases of stage 3 runs of models with nn.Linear layers beside models without (GPT-2's Conv1D)";
  for (const PerEvent& c : std::vector<PerEvent>{
           {"forward_op_us", "host work per forward op (dispatch, launches, the module's Python)", "forward " + wall,
            &H::forward_op},
           {"backward_op_us", "host work per backward node (autograd)", "backward " + wall, &H::backward_op},
           {"grad_hook_us", "DeepSpeed's gradient hook per parameter (stages 1 and 2)",
            "backward phases of stage 1 or 2 runs beside stage 0 runs of the same model", &H::grad_hook},
           {"bucket_hook_us", "more per gradient hook that copies into an IPG bucket (stage 2; stage 1 with overlap_comm)",
            "backward phases of stage 2 runs beside stage 1 runs of the same model", &H::bucket_hook},
           {"stage3_module_forward_us", "stage 3's fetch coordinator per module visit in forward",
            "forward phases of stage 3 runs", &H::stage3_module_forward},
           {"stage3_module_backward_us", "stage 3's coordinator per module visit in backward",
            "backward phases of stage 3 runs", &H::stage3_module_backward},
           {"stage3_param_forward_us", "more per parameter of a stage-3 module visit in forward",
            "forward phases of stage 3 runs of models with different parameters per module", &H::stage3_param_forward},
           {"stage3_grad_hook_us", "stage 3's gradient hook per parameter",
            "backward phases of stage 3 runs of models with different numbers of parameter tensors", &H::stage3_grad_hook},
           {"stage3_linear_forward_us", "stage 3's own autograd function per nn.Linear call in forward",
            "forward " + stage3_linear_runs, &H::stage3_linear_forward},
           {"stage3_linear_backward_us", "stage 3's own autograd function's backward per nn.Linear",
            "backward " + stage3_linear_runs, &H::stage3_linear_backward}})
    r.push_back(host_us(c.key, c.what, c.determined_by, c.member));
  for (const auto& [w, f] : std::vector<std::pair<std::string, H::Step H::*>>{{"fp16_optimizer", &H::fp16_optimizer},
                                                                              {"bf16_optimizer", &H::bf16_optimizer},
                                                                              {"zero_optimizer", &H::zero_optimizer},
                                                                              {"zero3_optimizer", &H::zero3_optimizer},
                                                                              {"plain", &H::plain}}) {
    r.push_back(step_us(w, true, f));
    r.push_back(step_us(w, false, f));
  }
  // Collective model (sim::CollectiveCoefficients): the coarse factors per level first.
  for (int level = 0; level < CC::kLevels; ++level) {
    r.push_back(collective_factor(true, level, -1, -1));
    r.push_back(collective_factor(false, level, -1, -1));
  }
  {
    ParamDef d = scalar("collective.fill_fraction", ParamGroup::collective, "",
                        "the pipeline warm-up's share of a mid-size transfer (φ, collective_model.cpp)",
                        "collectives of mid-size messages (1 to 64 MiB) beside small and large ones", 0, 5, true,
                        [](const M& m) { return m.collective.fill_fraction; },
                        [](M& m, double v) { m.collective.fill_fraction = v; });
    d.log_scale = false;
    d.typical = 0.5;
    r.push_back(std::move(d));
  }
  for (int level = 0; level < CC::kLevels; ++level)
    for (int algo = 0; algo < CC::kAlgos; ++algo) {
      if (algo == 2 && level == CC::inter) continue;
      for (bool bw : {true, false}) r.push_back(collective_factor(bw, level, algo, -1));
    }
  for (int level = 0; level < CC::kLevels; ++level)
    for (int algo = 0; algo < CC::kAlgos; ++algo)
      for (int proto = 0; proto < CC::kProtos; ++proto) {
        if (algo == 2 && (level == CC::inter || proto != 2)) continue;
        for (bool bw : {true, false}) r.push_back(collective_factor(bw, level, algo, proto));
      }
  // host.scale multiplies every host cost: fitted with any of them, the two cannot be told apart.
  for (auto& d : r)
    if (d.name == "host.scale")
      for (const auto& o : r)
        if (o.group == ParamGroup::host && o.name != d.name) d.fields.push_back(o.name);
  for (auto& d : r) {
    if (d.name == "compute.gemm_half_dim" || d.name == "compute.fp32_gemm_half_dim" || d.name == "compute.gemm_unaligned_factor" ||
        d.name == "compute.torch_gemm_unaligned_output_factor" ||
        d.name == "compute.kernel_launch_us" || d.name == "compute.copy_launch_us" || d.name == "compute.copy_piece_us" || d.name == "compute.host_launch_us" ||
        d.name == "compute.h2d_launch_us" || d.name == "compute.norm_tensor_us" || d.name == "compute.executor_norm_us")
      d.stage = 1;
    if (d.name == "compute.comm_compute_interference" || d.name == "collective.fill_fraction") d.stage = 2;
  }
  return r;
}

}  // namespace

std::string op_factor_name(models::OpKind kind, bool backward) {
  return fmt::format("compute.op_efficiency.{}{}", models::op_kind_name(kind), backward ? ".backward" : "");
}

const char* param_group_name(ParamGroup g) {
  switch (g) {
    case ParamGroup::compute: return "compute";
    case ParamGroup::host: return "host";
    case ParamGroup::collective: return "collective";
  }
  return "?";
}

const std::vector<ParamDef>& param_registry() {
  static const std::vector<ParamDef> r = build_registry();
  return r;
}

const ParamDef* find_param(const std::string& name) {
  for (const auto& d : param_registry())
    if (d.name == name) return &d;
  return nullptr;
}

std::vector<const ParamDef*> parse_fit_spec(const std::string& spec) {
  std::vector<const ParamDef*> out;
  std::set<std::string> seen;
  auto add = [&](const ParamDef* d) {
    if (seen.insert(d->name).second) out.push_back(d);
  };
  std::size_t pos = 0;
  bool any = false;
  while (pos <= spec.size()) {
    const std::size_t comma = spec.find(',', pos);
    std::string tok = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    tok.erase(0, tok.find_first_not_of(' '));
    tok.erase(tok.find_last_not_of(' ') + 1);
    pos = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (tok.empty()) continue;
    any = true;
    if (tok == "all") {
      // host.scale multiplies the host costs "all" fits one by one: asked for by name only.
      for (const auto& d : param_registry())
        if ((d.group != ParamGroup::collective || d.coarse) && d.name != "host.scale") add(&d);
    } else if (tok == "compute" || tok == "host" || tok == "collective") {
      for (const auto& d : param_registry())
        if (d.coarse && param_group_name(d.group) == tok) add(&d);
    } else if (tok == "collective-detail") {
      for (const auto& d : param_registry())
        if (d.detail) add(&d);
      add(find_param("collective.fill_fraction"));
    } else if (const ParamDef* d = find_param(tok)) {
      add(d);
    } else {
      std::vector<std::string> names = {"all", "compute", "host", "collective", "collective-detail"};
      for (const auto& p : param_registry()) names.push_back(p.name);
      const std::string near = json::closest(tok, names);
      throw InputError("--fit", "",
                       fmt::format("unknown parameter '{}'{}; give names from `zeroplan calibrate --list-params` or the "
                                   "groups compute, host, collective, collective-detail, all",
                                   json::printable(tok), near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near)));
    }
  }
  if (!any) throw InputError("--fit", "", "is empty; give parameter names or groups (compute, host, collective, all)");
  std::map<std::string, std::string> owner;
  for (const ParamDef* d : out)
    for (const auto& f : d->fields) {
      auto [it, fresh] = owner.emplace(f, d->name);
      if (!fresh)
        throw InputError("--fit", "",
                         fmt::format("{} and {} change the same coefficient; fit one of them (the finer one splits the "
                                     "coarser: by algorithm or protocol, or host.scale's costs one by one)",
                                     it->second, d->name));
    }
  return out;
}

std::vector<const ParamDef*> default_fit_set(bool kernels, bool collectives, bool phases, bool multi_rank_phases) {
  std::vector<const ParamDef*> out;
  for (const auto& d : param_registry()) {
    if (!d.coarse) continue;
    bool take = false;
    switch (d.group) {
      case ParamGroup::compute: take = kernels || phases; break;
      case ParamGroup::host: take = phases; break;
      case ParamGroup::collective: take = collectives || multi_rank_phases; break;
    }
    if (take) out.push_back(&d);
  }
  return out;
}

}  // namespace zp::calibration
