#include "sim/compute_model.hpp"

#include <cmath>
#include <cstdlib>

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/json_util.hpp"
#include "kernels/common/gemm_pieces.hpp"
#include "kernels/common/sdpa_dims.hpp"

namespace zp::sim {

namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr double kMicro = 1e-6;
constexpr double kAdamFlopsPerElement = 12.0;  // what the lowering charges per element

// ------------------------------------------------------------------ reading profiles

const std::vector<std::string> kProfileKeys = {
    "device",
    "host",
    "attention_dropout_efficiency",
    "attention_dropout_backward_efficiency",
    "optimizer_efficiency",
    "executor_attention_efficiency",
    "executor_attention_backward_efficiency",
    "executor_optimizer_efficiency",
    "op_efficiency",
    "torch_kernel_efficiency",
    "fp32_gemm_tf32",
    "peak_tensor_tflops",
    "peak_fp32_tflops",
    "hbm_gbps",
    "gemm_max_efficiency",
    "gemm_half_dim",
    "fp32_gemm_half_dim",
    "gemm_unaligned_factor",
    "torch_gemm_unaligned_output_factor",
    "elementwise_efficiency",
    "attention_efficiency",
    "attention_backward_efficiency",
    "attention_half_seq",
    "torch_attention_half_seq",
    "kernel_launch_us",
    "copy_launch_us",
    "copy_piece_us",
    "host_launch_us",
    "h2d_launch_us",
    "norm_tensor_us",
    "executor_norm_us",
    "loop_kernel_us",
    "kernels_per_op",
    "d2d_copy_gbps",
    "pcie_h2d_gbps",
    "host_memcpy_gbps",
    "cpu_adam_params_per_second",
    "comm_compute_interference",
    "iteration_rel_sd",
    "uncertainty_basis",
    "source"};
// Peaks default to the device database; every coefficient must be given.
const std::vector<std::string> kRequiredKeys = {
    "device",        "gemm_max_efficiency", "gemm_half_dim",    "gemm_unaligned_factor",
    "elementwise_efficiency", "kernel_launch_us", "kernels_per_op", "d2d_copy_gbps",
    "pcie_h2d_gbps", "host_memcpy_gbps",    "cpu_adam_params_per_second", "comm_compute_interference",
    "source"};

constexpr double kHuge = 1e18;

// A strictly positive number (0 and negatives rejected with the key named).
double positive(const json::Reader& r, const json::json& obj, std::string_view key, double hi) {
  const auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) throw InputError(r.file, r.key_path(key), "missing required key");
  if (!it->is_number())
    throw InputError(r.file, r.key_path(key), fmt::format("must be a positive number, got {}", it->dump()));
  const double v = r.get_double(obj, key, 0, -kHuge, kHuge);
  if (!(v > 0.0) || v > hi)
    throw InputError(r.file, r.key_path(key), fmt::format("must be a positive number at most {}, got {}", hi, it->dump()));
  return v;
}

double fraction(const json::Reader& r, const json::json& obj, std::string_view key) {
  return positive(r, obj, key, 1.0);
}

Seconds micros(const json::Reader& r, const json::json& obj, std::string_view key, Seconds dflt) {
  return Seconds{r.get_double(obj, std::string(key), dflt.v / kMicro, 0, 1e9) * kMicro};
}

// "host": {"forward_op_us": …, "step": {"zero_optimizer": {"base_us": …, "per_tensor_us": …}, …}, "source": …}
// Keys left out keep the defaults (default_host_costs()).
HostCosts read_host_costs(const json::Reader& r, const json::json& h) {
  if (!h.is_object()) throw InputError(r.file, r.path, "must be a JSON object");
  r.reject_unknown(h, {"forward_op_us", "backward_op_us", "grad_hook_us", "bucket_hook_us", "stage3_module_forward_us",
                       "stage3_module_backward_us", "stage3_param_forward_us", "stage3_grad_hook_us",
                       "stage3_linear_forward_us", "stage3_linear_backward_us", "step",
                       "probe_us", "scale", "source"});
  HostCosts c = default_host_costs();
  c.forward_op = micros(r, h, "forward_op_us", c.forward_op);
  c.backward_op = micros(r, h, "backward_op_us", c.backward_op);
  c.grad_hook = micros(r, h, "grad_hook_us", c.grad_hook);
  c.bucket_hook = micros(r, h, "bucket_hook_us", c.bucket_hook);
  c.stage3_module_forward = micros(r, h, "stage3_module_forward_us", c.stage3_module_forward);
  c.stage3_module_backward = micros(r, h, "stage3_module_backward_us", c.stage3_module_backward);
  c.stage3_param_forward = micros(r, h, "stage3_param_forward_us", c.stage3_param_forward);
  c.stage3_grad_hook = micros(r, h, "stage3_grad_hook_us", c.stage3_grad_hook);
  // A profile written before stage 3's linear function was priced has module (and parameter)
  // costs fitted with its Python inside them: without its own key, no more on top.
  const bool before_linear = !h.contains("stage3_linear_forward_us") && !h.contains("stage3_linear_backward_us");
  if (before_linear && h.contains("stage3_module_forward_us")) c.stage3_linear_forward = Seconds{0};
  if (before_linear && h.contains("stage3_module_backward_us")) c.stage3_linear_backward = Seconds{0};
  c.stage3_linear_forward = micros(r, h, "stage3_linear_forward_us", c.stage3_linear_forward);
  c.stage3_linear_backward = micros(r, h, "stage3_linear_backward_us", c.stage3_linear_backward);
  if (auto it = h.find("step"); it != h.end()) {
    const json::Reader sr = r.sub("step");
    if (!it->is_object()) throw InputError(r.file, r.key_path("step"), "must be a JSON object");
    sr.reject_unknown(*it, {"fp16_optimizer", "bf16_optimizer", "zero_optimizer", "zero3_optimizer", "plain"});
    auto step = [&](const char* key, HostCosts::Step& s) {
      auto jt = it->find(key);
      if (jt == it->end()) return;
      const json::Reader kr = sr.sub(key);
      if (!jt->is_object()) throw InputError(r.file, sr.key_path(key), "must be a JSON object");
      kr.reject_unknown(*jt, {"base_us", "per_tensor_us"});
      s.base = micros(kr, *jt, "base_us", s.base);
      s.per_tensor = micros(kr, *jt, "per_tensor_us", s.per_tensor);
    };
    step("fp16_optimizer", c.fp16_optimizer);
    step("bf16_optimizer", c.bf16_optimizer);
    step("zero_optimizer", c.zero_optimizer);
    step("zero3_optimizer", c.zero3_optimizer);
    step("plain", c.plain);
  }
  if (h.contains("probe_us")) c.probe_us = r.get_double(h, "probe_us", 0, 0, kMaxHostProbeUs);
  if (h.contains("scale")) c.scale = r.get_double(h, "scale", 1, kMinHostScale, kMaxHostScale);
  c.source = r.get_string(h, "source", c.source);
  return c;
}


DeviceProfile read_profile(const json::Reader& r, const json::json& e, const std::vector<std::string>& extra_keys) {
  if (!e.is_object()) throw InputError(r.file, r.path, "must be a JSON object");
  std::vector<std::string> known = kProfileKeys;
  known.insert(known.end(), extra_keys.begin(), extra_keys.end());
  r.reject_unknown(e, known);
  for (const auto& k : kRequiredKeys)
    if (!e.contains(k)) throw InputError(r.file, r.key_path(k), "missing required key");

  DeviceProfile p;
  const std::string name = r.get_string(e, "device", "");
  const DeviceSpec* spec = nullptr;
  try {
    spec = &find_device(name);  // names and aliases, case-insensitive
  } catch (const InputError&) {
    std::string known_names;
    for (const auto& d : devices()) known_names += (known_names.empty() ? "" : ", ") + d.name;
    throw InputError(r.file, r.key_path("device"),
                     fmt::format("unknown device {}; known: {}", json::json(name).dump(), known_names));
  }
  p.device = spec->name;
  p.peak_tensor_flops = spec->peak_tensor_flops;
  p.peak_fp32_flops = spec->peak_fp32_flops;
  p.hbm_bandwidth = spec->hbm_bandwidth;
  if (e.contains("peak_tensor_tflops"))
    p.peak_tensor_flops = FlopsPerSecond{positive(r, e, "peak_tensor_tflops", 1e6) * kTera};
  if (e.contains("peak_fp32_tflops"))
    p.peak_fp32_flops = FlopsPerSecond{positive(r, e, "peak_fp32_tflops", 1e6) * kTera};
  if (e.contains("hbm_gbps")) p.hbm_bandwidth = BytesPerSecond{positive(r, e, "hbm_gbps", 1e6) * kGiga};

  p.gemm_max_efficiency = fraction(r, e, "gemm_max_efficiency");
  p.gemm_half_dim = r.get_double(e, "gemm_half_dim", 0, 0, 1e6);
  if (e.contains("fp32_gemm_half_dim")) p.fp32_gemm_half_dim = r.get_double(e, "fp32_gemm_half_dim", 0, 0, 1e6);
  p.gemm_unaligned_factor = fraction(r, e, "gemm_unaligned_factor");
  if (e.contains("torch_gemm_unaligned_output_factor"))
    p.torch_gemm_unaligned_output_factor = fraction(r, e, "torch_gemm_unaligned_output_factor");
  p.elementwise_efficiency = fraction(r, e, "elementwise_efficiency");
  // Optional (profiles written before it price attention as its GEMMs).
  if (e.contains("attention_efficiency")) p.attention_efficiency = positive(r, e, "attention_efficiency", 10);
  if (e.contains("attention_backward_efficiency"))
    p.attention_backward_efficiency = positive(r, e, "attention_backward_efficiency", 10);
  if (e.contains("attention_dropout_efficiency"))
    p.attention_dropout_efficiency = positive(r, e, "attention_dropout_efficiency", 10);
  if (e.contains("attention_dropout_backward_efficiency"))
    p.attention_dropout_backward_efficiency = positive(r, e, "attention_dropout_backward_efficiency", 10);
  if (e.contains("optimizer_efficiency")) p.optimizer_efficiency = positive(r, e, "optimizer_efficiency", 10);
  for (const auto& [key, field] : std::vector<std::pair<const char*, double DeviceProfile::*>>{
           {"executor_attention_efficiency", &DeviceProfile::executor_attention_efficiency},
           {"executor_attention_backward_efficiency", &DeviceProfile::executor_attention_backward_efficiency},
           {"executor_optimizer_efficiency", &DeviceProfile::executor_optimizer_efficiency}})
    if (e.contains(key)) p.*field = positive(r, e, key, 10);
  if (e.contains("attention_half_seq")) p.attention_half_seq = r.get_double(e, "attention_half_seq", 0, 0, 1e6);
  if (e.contains("torch_attention_half_seq"))
    p.torch_attention_half_seq = r.get_double(e, "torch_attention_half_seq", 0, 0, 1e6);
  // {"layernorm": 0.5, "layernorm.backward": 0.2, ...}: op kinds as models/graph.hpp names them.
  if (auto it = e.find("op_efficiency"); it != e.end()) {
    const json::Reader orr = r.sub("op_efficiency");
    if (!it->is_object()) throw InputError(r.file, r.key_path("op_efficiency"), "must be a JSON object of op kind → factor");
    for (const auto& [key, v] : it->items()) {
      const bool bwd = key.size() > 9 && key.compare(key.size() - 9, 9, ".backward") == 0;
      const auto kind = models::op_kind_from_name(bwd ? std::string_view(key).substr(0, key.size() - 9) : std::string_view(key));
      if (!kind) {
        const auto& names = models::op_kind_names();
        const std::string near = json::closest(bwd ? key.substr(0, key.size() - 9) : key, names);
        throw InputError(r.file, orr.key_path(key),
                         fmt::format("not an op kind{} (kinds: {}, each optionally with .backward)",
                                     near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near), fmt::join(names, ", ")));
      }
      p.op_factor(*kind, bwd) = positive(orr, *it, key, 100);
    }
  }
  // {"vectorized": 0.9, "strided": 0.55, ...}: PyTorch's kernel families (TorchKernel).
  if (auto it = e.find("torch_kernel_efficiency"); it != e.end()) {
    const json::Reader tr = r.sub("torch_kernel_efficiency");
    if (!it->is_object())
      throw InputError(r.file, r.key_path("torch_kernel_efficiency"), "must be a JSON object of kernel family → fraction");
    const auto& names = torch_kernel_names();
    for (const auto& [key, v] : it->items()) {
      const auto at = std::find(names.begin(), names.end(), key);
      if (at == names.end()) {
        const std::string near = json::closest(key, names);
        throw InputError(r.file, tr.key_path(key),
                         fmt::format("not a kernel family{} (families: {})",
                                     near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near), fmt::join(names, ", ")));
      }
      p.torch_kernel_efficiency[static_cast<std::size_t>(at - names.begin())] = fraction(tr, *it, key);
    }
  }
  p.kernel_launch = Seconds{r.get_double(e, "kernel_launch_us", 0, 0, 1e6) * kMicro};
  p.copy_launch = e.contains("copy_launch_us") ? Seconds{r.get_double(e, "copy_launch_us", 0, 0, 1e6) * kMicro} : p.kernel_launch;
  p.copy_piece = Seconds{r.get_double(e, "copy_piece_us", 0, 0, 1e6) * kMicro};
  p.host_launch = Seconds{r.get_double(e, "host_launch_us", 0, 0, 1e6) * kMicro};
  p.h2d_launch = e.contains("h2d_launch_us") ? Seconds{r.get_double(e, "h2d_launch_us", 0, 0, 1e6) * kMicro} : p.kernel_launch;
  p.norm_tensor = e.contains("norm_tensor_us") ? Seconds{r.get_double(e, "norm_tensor_us", 0, 0, 1e6) * kMicro} : p.kernel_launch;
  if (e.contains("executor_norm_us")) p.executor_norm = Seconds{r.get_double(e, "executor_norm_us", 0, 0, 1e6) * kMicro};
  p.loop_kernel = e.contains("loop_kernel_us") ? Seconds{r.get_double(e, "loop_kernel_us", 0, 0, 1e6) * kMicro} : p.kernel_launch;
  p.kernels_per_op = static_cast<int>(r.get_int(e, "kernels_per_op", 1, 1, 1000));
  p.d2d_copy_bandwidth = BytesPerSecond{positive(r, e, "d2d_copy_gbps", 1e6) * kGiga};
  p.pcie_h2d = BytesPerSecond{positive(r, e, "pcie_h2d_gbps", 1e6) * kGiga};
  p.host_memcpy_bandwidth = BytesPerSecond{positive(r, e, "host_memcpy_gbps", 1e6) * kGiga};
  p.cpu_adam_params_per_second = positive(r, e, "cpu_adam_params_per_second", 1e15);
  p.comm_compute_interference = r.get_double(e, "comm_compute_interference", 0, 0, 10);
  p.host = e.contains("host") ? read_host_costs(r.sub("host"), e.at("host")) : default_host_costs();
  p.fp32_gemm_tf32 = r.get_bool(e, "fp32_gemm_tf32", false);
  p.iteration_rel_sd = r.get_double(e, "iteration_rel_sd", 0, 0, 10);
  p.uncertainty_basis = r.get_string(e, "uncertainty_basis", "");
  if (p.iteration_rel_sd > 0 && p.uncertainty_basis.empty())
    throw InputError(r.file, r.key_path("uncertainty_basis"), "must say what iteration_rel_sd was measured against");
  p.source = r.get_string(e, "source", "");
  if (p.source.empty()) throw InputError(r.file, r.key_path("source"), "must say where the figures come from");
  return p;
}

std::vector<DeviceProfile> read_database(const std::string& path) {
  const json::json doc = json::parse_file(path);
  const json::Reader root{path, ""};
  if (!doc.is_object()) throw InputError(path, "", "must be a JSON object with a 'profiles' array");
  root.reject_unknown(doc, {"description", "profiles"});
  const auto it = doc.find("profiles");
  if (it == doc.end() || !it->is_array() || it->empty())
    throw InputError(path, "profiles", "must be a non-empty array of profile objects");
  std::vector<DeviceProfile> out;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json::Reader r{path, fmt::format("profiles[{}]", i)};
    DeviceProfile p = read_profile(r, (*it)[i], {});
    for (const auto& q : out)
      if (q.device == p.device)
        throw InputError(path, r.key_path("device"), fmt::format("device '{}' has two profiles", p.device));
    out.push_back(std::move(p));
  }
  return out;
}

// sim/profiles.json, or the database ZEROPLAN_PROFILES names (the same format): how fitting
// tools try coefficients without touching the installed file.
const std::vector<DeviceProfile>& installed_profiles() {
  static const std::vector<DeviceProfile> db = [] {
    const char* env = std::getenv("ZEROPLAN_PROFILES");
    return read_database(env != nullptr && *env != '\0' ? std::string(env)
                                                         : std::string(ZEROPLAN_DATA_DIR) + "/sim/profiles.json");
  }();
  return db;
}

// For a device the profile file does not list: coefficients by architecture, scaled
// from the device's own peaks (the same assumptions as the listed devices of that kind).
DeviceProfile derived_profile(const DeviceSpec& dev) {
  DeviceProfile p;
  p.device = dev.name;
  p.peak_tensor_flops = dev.peak_tensor_flops;
  p.peak_fp32_flops = dev.peak_fp32_flops;
  p.hbm_bandwidth = dev.hbm_bandwidth;
  const bool cpu = dev.arch == "cpu";
  const bool hopper = dev.arch == "hopper" || dev.arch == "blackwell";
  p.gemm_max_efficiency = cpu ? 0.6 : (hopper ? 0.84 : 0.86);
  p.gemm_half_dim = cpu ? 32 : (hopper ? 110 : 128);
  p.gemm_unaligned_factor = cpu ? 1.0 : (hopper ? 0.2 : 0.3);
  if (hopper) {
    // Fitted on Hopper (sim/profiles.json, the H100's kernel profiles of DeepSpeed runs),
    // assumed for Blackwell.
    p.fp32_gemm_half_dim = 96;
    p.torch_gemm_unaligned_output_factor = 0.13;
    p.torch_attention_half_seq = 16;
    p.attention_efficiency = 1.04;
    p.attention_backward_efficiency = 0.72;
    p.attention_dropout_efficiency = 0.43;
    p.attention_dropout_backward_efficiency = 0.89;
    // PyTorch's kernel families: the H100's fractions; a contiguous add's is the H200's own
    // (0.76 of 4.8 TB/s) on faster memory, where the same SMs do not reach the H100's 0.90.
    auto family = [&](TorchKernel k, double v) { p.torch_kernel_efficiency[static_cast<std::size_t>(k)] = v; };
    family(TorchKernel::vectorized, dev.hbm_bandwidth.v > 4e12 ? 0.76 : 0.9);
    family(TorchKernel::strided, 0.55);
    family(TorchKernel::random, 0.76);
    family(TorchKernel::cat, 0.2);
    family(TorchKernel::row_norm, 0.55);
    family(TorchKernel::column_sum, 0.28);
  }
  p.elementwise_efficiency = cpu ? 0.5 : (hopper ? 0.62 : 0.8);
  p.kernel_launch = Seconds{(cpu ? 10.0 : hopper ? 3.5 : 5.0) * kMicro};
  p.copy_launch = p.kernel_launch;
  p.h2d_launch = p.kernel_launch;
  p.norm_tensor = p.kernel_launch;
  p.loop_kernel = p.kernel_launch;
  p.kernels_per_op = 1;
  p.d2d_copy_bandwidth = BytesPerSecond{dev.hbm_bandwidth.v * (cpu ? 0.5 : 0.85)};
  p.pcie_h2d = BytesPerSecond{(cpu ? 10.0 : hopper ? 50.0 : 24.0) * kGiga};
  p.host_memcpy_bandwidth = BytesPerSecond{20.0 * kGiga};
  p.cpu_adam_params_per_second = cpu ? 3e8 : 1.5e9;
  p.comm_compute_interference = cpu ? 0.3 : 0.15;
  p.host = default_host_costs();
  p.source = fmt::format("derived for {} from the device database (no entry in sim/profiles.json): "
                         "the {} assumptions of docs/compute_model.md", dev.name, dev.arch);
  return p;
}

double saturation(double x, double half) { return x / (x + half); }

}  // namespace

const char* torch_kernel_name(TorchKernel k) {
  switch (k) {
    case TorchKernel::vectorized: return "vectorized";
    case TorchKernel::strided: return "strided";
    case TorchKernel::random: return "random";
    case TorchKernel::cat: return "cat";
    case TorchKernel::row_norm: return "row_norm";
    case TorchKernel::column_sum: return "column_sum";
  }
  return "?";
}

const std::vector<std::string>& torch_kernel_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (int k = 0; k < kNumTorchKernels; ++k) n.emplace_back(torch_kernel_name(static_cast<TorchKernel>(k)));
    return n;
  }();
  return names;
}

std::vector<DeviceProfile> load_profiles(const std::string& path) { return read_database(path); }

Seconds host_cost(const HostCosts& c, const zero::Event& e) {
  const zero::HostWork& h = e.host;
  const bool bwd = e.phase == zero::Phase::backward;
  double s = h.ops * (bwd ? c.backward_op : c.forward_op).v;
  s += h.grad_hooks * c.grad_hook.v + h.bucket_hooks * c.bucket_hook.v + h.stage3_grad_hooks * c.stage3_grad_hook.v;
  s += h.module_visits * (bwd ? c.stage3_module_backward : c.stage3_module_forward).v;
  if (!bwd) s += h.stage3_params * c.stage3_param_forward.v;
  s += h.linear_functions * (bwd ? c.stage3_linear_backward : c.stage3_linear_forward).v;
  const HostCosts::Step* step = nullptr;
  switch (h.step) {
    case zero::HostStep::none: break;
    case zero::HostStep::fp16_optimizer: step = &c.fp16_optimizer; break;
    case zero::HostStep::bf16_optimizer: step = &c.bf16_optimizer; break;
    case zero::HostStep::zero_optimizer: step = &c.zero_optimizer; break;
    case zero::HostStep::zero3_optimizer: step = &c.zero3_optimizer; break;
    case zero::HostStep::plain: step = &c.plain; break;
  }
  if (step != nullptr) s += (h.step_base ? step->base.v : 0.0) + h.tensors * static_cast<double>(h.loop_share) * step->per_tensor.v;
  return Seconds{s * c.scale};
}

HostCosts default_host_costs() {
  // Fitted through the simulator (tools/fit_host_costs.py: the iteration time weighted twice,
  // and the forward, backward and step times) to the 40 runs of
  // tests/data/deepspeed/h200_deepspeed_0.19.8.json (the one that keeps the model output
  // differs from its twin in memory only), timed in interleaved time-only rounds: the H200
  // machine's host (Intel Xeon, 16 cores), torch 2.11, transformers 5.17, DeepSpeed 0.19.8,
  // with the step's per-tensor kernels on the device (Event::loop_kernels) and a ZeRO step's
  // loops apart from its fixed part, priced on the compute model of the H100's kernel profiles
  // (sim/profiles.json) with PyTorch's kernels by family, and FP16_Optimizer's loop kernels
  // beside its host loop (2026-12-07). Mean |error| in sample, over the 40 fitted runs: forward
  // 9.0%, backward 9.7%, step 9.0%, iteration 6.7%, the iteration then the phases' sum; with
  // stages 1-2's iteration predicted without the phases' synchronisations (zero::LowerOptions::
  // phase_syncs) and the fp32 stage-2 norm loop the fit moves no cost by more than 3.2%
  // (bucket_hook 73.9 -> 71.6 us) and the costs were kept. Stage 3's forward costs (per module
  // visit, per parameter, per nn.Linear through DeepSpeed's own autograd function) were fitted
  // again together, on the GPT-2 and BERT-large runs, once the linear function was modelled
  // (the H100 machine's one-machine runs gave it 160 us in these units, the H200 machines' 159). Over all 41
  // (tests/test_deepspeed_reference.cpp): docs/time_model.md. bf16_optimizer was not measured
  // (zero_optimizer's values); `plain` rests on one run.
  HostCosts c;
  c.forward_op = Seconds{52.38 * kMicro};
  c.backward_op = Seconds{94.32 * kMicro};
  c.grad_hook = Seconds{55.37 * kMicro};
  c.bucket_hook = Seconds{73.91 * kMicro};
  c.stage3_module_forward = Seconds{301.6 * kMicro};
  c.stage3_module_backward = Seconds{104.36 * kMicro};
  c.stage3_param_forward = Seconds{144.71 * kMicro};
  c.stage3_grad_hook = Seconds{405.99 * kMicro};
  c.stage3_linear_forward = Seconds{158.83 * kMicro};
  c.stage3_linear_backward = Seconds{0.0};
  c.fp16_optimizer = {Seconds{5007.0 * kMicro}, Seconds{151.4 * kMicro}};
  c.bf16_optimizer = {Seconds{4956.8 * kMicro}, Seconds{166.0 * kMicro}};
  c.zero_optimizer = {Seconds{4956.8 * kMicro}, Seconds{166.0 * kMicro}};
  c.zero3_optimizer = {Seconds{4967.4 * kMicro}, Seconds{70.6 * kMicro}};
  c.plain = {Seconds{4998.9 * kMicro}, Seconds{36.49 * kMicro}};
  c.source = "fitted through the simulator to DeepSpeed 0.19.8 / torch 2.11 / transformers 5.17 runs on the H200 "
             "machine's host (tests/data/deepspeed/h200_deepspeed_0.19.8.json; tools/fit_host_costs.py)";
  return c;
}

DeviceProfile profile_from_json(const std::string& file, const std::string& key_path, const nlohmann::json& obj) {
  return read_profile(json::Reader{file, key_path}, obj, {});
}

nlohmann::json profile_to_json(const DeviceProfile& p) {
  auto us = [](Seconds s) { return s.v / kMicro; };
  const HostCosts& h = p.host;
  nlohmann::json steps = nlohmann::json::object();
  auto step = [&](const char* key, const HostCosts::Step& s) {
    steps[key] = {{"base_us", us(s.base)}, {"per_tensor_us", us(s.per_tensor)}};
  };
  step("fp16_optimizer", h.fp16_optimizer);
  step("bf16_optimizer", h.bf16_optimizer);
  step("zero_optimizer", h.zero_optimizer);
  step("zero3_optimizer", h.zero3_optimizer);
  step("plain", h.plain);
  nlohmann::json ops = nlohmann::json::object();  // the kinds whose factor is not 1
  for (int k = 0; k < models::kNumOpKinds; ++k)
    for (bool bwd : {false, true}) {
      const double f = p.op_factor(static_cast<models::OpKind>(k), bwd);
      if (f != 1.0) ops[fmt::format("{}{}", models::op_kind_name(static_cast<models::OpKind>(k)), bwd ? ".backward" : "")] = f;
    }
  nlohmann::json torch_families = nlohmann::json::object();  // the families given their own fraction
  for (int k = 0; k < kNumTorchKernels; ++k)
    if (p.torch_kernel_efficiency[static_cast<std::size_t>(k)] > 0)
      torch_families[torch_kernel_name(static_cast<TorchKernel>(k))] = p.torch_kernel_efficiency[static_cast<std::size_t>(k)];
  nlohmann::json j = {{"device", p.device},
          {"peak_tensor_tflops", p.peak_tensor_flops.v / kTera},
          {"peak_fp32_tflops", p.peak_fp32_flops.v / kTera},
          {"hbm_gbps", p.hbm_bandwidth.v / kGiga},
          {"gemm_max_efficiency", p.gemm_max_efficiency},
          {"gemm_half_dim", p.gemm_half_dim},
          {"gemm_unaligned_factor", p.gemm_unaligned_factor},
          {"elementwise_efficiency", p.elementwise_efficiency},
          {"attention_efficiency", p.attention_efficiency},
          {"attention_backward_efficiency", p.attention_backward_efficiency},
          {"attention_dropout_efficiency", p.attention_dropout_efficiency},
          {"attention_dropout_backward_efficiency", p.attention_dropout_backward()},
          {"optimizer_efficiency", p.optimizer_efficiency},
          {"executor_attention_efficiency", p.executor_attention_efficiency},
          {"executor_attention_backward_efficiency", p.executor_attention_backward_efficiency},
          {"executor_optimizer_efficiency", p.executor_optimizer_efficiency},
          {"attention_half_seq", p.attention_half()},
          {"op_efficiency", ops},
          {"torch_kernel_efficiency", torch_families},
          {"kernel_launch_us", us(p.kernel_launch)},
          {"copy_launch_us", us(p.copy_launch)},
          {"copy_piece_us", us(p.copy_piece)},
          {"host_launch_us", us(p.host_launch)},
          {"h2d_launch_us", us(p.h2d_launch)},
          {"norm_tensor_us", us(p.norm_tensor)},
          {"executor_norm_us", us(p.executor_norm_cost())},
          {"loop_kernel_us", us(p.loop_kernel)},
          {"kernels_per_op", p.kernels_per_op},
          {"d2d_copy_gbps", p.d2d_copy_bandwidth.v / kGiga},
          {"pcie_h2d_gbps", p.pcie_h2d.v / kGiga},
          {"host_memcpy_gbps", p.host_memcpy_bandwidth.v / kGiga},
          {"cpu_adam_params_per_second", p.cpu_adam_params_per_second},
          {"comm_compute_interference", p.comm_compute_interference},
          {"fp32_gemm_tf32", p.fp32_gemm_tf32},
          {"host",
           {{"forward_op_us", us(h.forward_op)},
            {"backward_op_us", us(h.backward_op)},
            {"grad_hook_us", us(h.grad_hook)},
            {"bucket_hook_us", us(h.bucket_hook)},
            {"stage3_module_forward_us", us(h.stage3_module_forward)},
            {"stage3_module_backward_us", us(h.stage3_module_backward)},
            {"stage3_param_forward_us", us(h.stage3_param_forward)},
            {"stage3_grad_hook_us", us(h.stage3_grad_hook)},
            {"stage3_linear_forward_us", us(h.stage3_linear_forward)},
            {"stage3_linear_backward_us", us(h.stage3_linear_backward)},
            {"step", steps},
            {"probe_us", h.probe_us},
            {"scale", h.scale},
            {"source", h.source}}},
          {"source", p.source}};
  // Written only where set: absent, the fp32 curve follows gemm_half_dim (a fit of it moves both).
  if (p.fp32_gemm_half_dim >= 0) j["fp32_gemm_half_dim"] = p.fp32_gemm_half_dim;
  if (p.torch_gemm_unaligned_output_factor >= 0)
    j["torch_gemm_unaligned_output_factor"] = p.torch_gemm_unaligned_output_factor;
  if (p.torch_attention_half_seq >= 0) j["torch_attention_half_seq"] = p.torch_attention_half_seq;
  return j;
}

DeviceProfile load_profile(const std::string& path) {
  const json::json doc = json::parse_file(path);
  if (!doc.is_object()) throw InputError(path, "", "must be a JSON object holding one device profile");
  return read_profile(json::Reader{path, ""}, doc, {"description"});
}

DeviceProfile default_profile(const DeviceSpec& dev) {
  for (const auto& p : installed_profiles()) {
    if (p.device != dev.name) continue;
    DeviceProfile out = p;
    // The peaks are the device's (a custom spec under a known name keeps its own figures).
    out.peak_tensor_flops = dev.peak_tensor_flops;
    out.peak_fp32_flops = dev.peak_fp32_flops;
    out.hbm_bandwidth = dev.hbm_bandwidth;
    return out;
  }
  return derived_profile(dev);
}

HostCosts scaled_host_costs(const HostCosts& h, double factor) {
  if (!(factor > 0) || !std::isfinite(factor))
    throw std::logic_error(fmt::format("host costs scaled by {}", factor));
  HostCosts c = h;
  c.scale *= factor;
  c.probe_us *= factor;
  return c;
}

HostCosts host_costs_at_probe(const HostCosts& h, double probe_us) {
  if (h.probe_us <= 0 || probe_us <= 0) return h;
  return scaled_host_costs(h, probe_us / h.probe_us);
}

double gemm_efficiency(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t align,
                       bool fp32_cores, std::int64_t out_ld, bool torch) {
  if (m <= 0 || n <= 0 || k <= 0) return p.gemm_max_efficiency;
  const double h = fp32_cores ? p.fp32_half() : p.gemm_half_dim;
  const double eff = p.gemm_max_efficiency * saturation(static_cast<double>(m), h) *
                     saturation(static_cast<double>(n), h) * saturation(static_cast<double>(k), h);
  return eff * alignment_factor(p, m, n, k, align, out_ld, torch);
}

double alignment_factor(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t align,
                        std::int64_t out_ld, bool torch) {
  if (align <= 1 || m <= 0 || n <= 0 || k <= 0 || (m % align == 0 && n % align == 0 && k % align == 0)) return 1.0;
  // The bytes every dimension is aligned to: the largest power of two dividing each, in bytes.
  const std::int64_t elem = std::max<std::int64_t>(1, 16 / align);
  auto aligned_bytes = [&](std::int64_t x) {
    const std::int64_t b = x * elem;
    return std::min<std::int64_t>(16, b & -b);
  };
  std::int64_t bytes = 16;
  for (const std::int64_t x : {m, n, k}) bytes = std::min(bytes, aligned_bytes(x));
  const bool odd_output = torch && aligned_bytes(out_ld > 0 ? out_ld : n) <= 2;
  const double f = odd_output ? p.torch_unaligned_output() : p.gemm_unaligned_factor;
  return std::min(1.0, f * std::pow(static_cast<double>(bytes) / 2.0, kUnalignedGrading));
}

// ------------------------------------------------------------------ the model

ComputeModel::ComputeModel(const DeviceProfile& profile, const models::OpGraph& graph) : p_(profile), g_(graph) {
  if (p_.peak_tensor_flops.v <= 0 || p_.peak_fp32_flops.v <= 0 || p_.hbm_bandwidth.v <= 0 ||
      p_.d2d_copy_bandwidth.v <= 0 || p_.pcie_h2d.v <= 0 || p_.host_memcpy_bandwidth.v <= 0 ||
      p_.cpu_adam_params_per_second <= 0 || p_.gemm_max_efficiency <= 0 || p_.gemm_unaligned_factor <= 0 ||
      p_.torch_unaligned_output() <= 0 ||
      p_.elementwise_efficiency <= 0 || p_.attention_efficiency <= 0 ||
      p_.attention_backward_efficiency <= 0 || p_.optimizer_efficiency <= 0 || p_.executor_attention_efficiency <= 0 ||
      p_.executor_attention_backward_efficiency <= 0 || p_.executor_optimizer_efficiency <= 0 || p_.kernels_per_op < 1)
    throw std::logic_error(fmt::format("device profile '{}' has a zero or negative coefficient", p_.device));
}

Seconds ComputeModel::compute_cost(models::OpId op, zero::Phase phase, Flops flops, Bytes bytes) const {
  const bool backward = phase == zero::Phase::backward;
  const double kernels = static_cast<double>(p_.kernels_per_op) * (backward ? 2.0 : 1.0);
  const double launch = kernels * p_.kernel_launch.v;
  const double mem_time = static_cast<double>(bytes.v) / (p_.hbm_bandwidth.v * p_.elementwise_efficiency);

  const models::Op* o = nullptr;
  if (op != models::kNone) o = &op_at(op);

  if (o != nullptr && o->gemms.empty() && deepspeed) {
    const double t = torch_op_time(*o, backward);
    if (t >= 0) return Seconds{t};
  }
  if (o == nullptr || o->gemms.empty())
    return elementwise_cost(flops, bytes, o == nullptr ? 1.0 : p_.op_factor(o->kind, backward), launch);

  // Σ f_i / eff_i over the GEMMs this phase runs, with f_i the geometry FLOPs; the event's
  // own FLOPs are spread over them in that proportion (a causal flash kernel skips half,
  // a bias adds a few; the efficiency is the FLOP-weighted harmonic mean).
  // Tensor-core kernels want every dimension a multiple of 16 bytes of the operand dtype; fp32
  // GEMMs on the fp32 cores (no TF32) have no such preference (GPT-2's vocabulary of 50257 in fp32
  // on the H200: 31 ms of forward GPU time, tests/data/deepspeed/, which a 0.33 penalty on its
  // head would put near 50).
  // An output with padded rows (the fused loss's logits, Tensor::row_pitch) is cut into its
  // aligned part and a thin rest (kernels/common/gemm_pieces.hpp): priced as aligned.
  const bool fp32_cores = g_.opt.act_dtype == DType::fp32 && !p_.fp32_gemm_tf32;
  const bool padded_rows = !o->outputs.empty() && g_.tensors[static_cast<std::size_t>(o->outputs[0])].row_pitch != 0;
  const std::int64_t elem = std::max<std::int64_t>(1, dtype_size(g_.opt.act_dtype));
  const std::int64_t align16 = std::max<std::int64_t>(1, 16 / elem);
  // zeroplan's executor stages a large product whose rows are not 16-byte aligned (an LM
  // head's vocabulary) as the plan of kernels/common/gemm_pieces.hpp that it runs (plan_gemm,
  // kernels/cuda/bmm.cu): aligned products plus the plan's copies, accumulator rows and
  // finishes (staged_extra_bytes), priced at the elementwise bandwidth. An nn.Linear's weight is
  // stored (n, k): forward C = X·Wᵀ, backward dX = dC·W and dW = dCᵀ·X. On an H100, GPT-2's head
  // at 8 x 1024 measured 1.84 / 3.00 ms forward / backward, priced 1.68 / 3.58 (4.42 / 8.85 as an
  // unaligned product); BERT-large's decoder at 64 x 128 with its bias 1.76 / 2.42, priced 1.66 /
  // 2.79 (2.11 / 4.46).
  double staged_bytes = 0;
  bool staged = false;
  if (!deepspeed && stages_products && !fp32_cores && !padded_rows && o->fn == models::Fn::linear)
    for (const auto& gm : o->gemms) {
      if (gm.batch > 1 ||
          static_cast<double>(gm.m) * static_cast<double>(gm.n) * static_cast<double>(gm.k) < kernels::kStagedMinWork)
        continue;
      auto plan = [&](std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb, bool bias) {
        const kernels::GemmPlan pl = kernels::plan_gemm(m, n, k, ta, tb, false, bias, elem, 0, 0, 0, kernels::kStagedScratchBytes);
        if (pl.empty()) return;
        staged = true;
        staged_bytes += kernels::staged_extra_bytes(pl, elem);
      };
      if (!backward) {
        plan(gm.m, gm.n, gm.k, false, true, gm.bias);
      } else {
        plan(gm.m, gm.k, gm.n, false, false, false);  // dX(m,k) = dC(m,n) · W(n,k)
        plan(gm.n, gm.k, gm.m, true, false, false);   // dW(n,k) = dC(m,n)ᵀ · X(m,k)
      }
    }
  const std::int64_t align = fp32_cores || padded_rows || staged ? 1 : align16;
  // Fused attention: every dimension but the head dimension (the scores product's k) is along
  // the sequence (or the batch), on the attention curve.
  const bool attention = o->fn == models::Fn::sdpa || o->fn == models::Fn::flash_attention;
  const std::int64_t head_dim = o->gemms.front().k;
  // `out_ld`: the leading dimension of the product's output. Forward C(m, n): n. Backward
  // dA(m, k) and the weight gradient, which nn.Linear keeps as (n, k): k. (A Conv1D weight,
  // (k, n), has its gradient's rows n wide; no model here has an odd n there, and an odd
  // output only matters for PyTorch's products: torch_gemm_unaligned_output_factor.)
  auto efficiency = [&](std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t out_ld) {
    if (!attention) return gemm_efficiency(p_, m, n, k, align, fp32_cores, out_ld, deepspeed);
    double e = p_.gemm_max_efficiency;
    const double head_half = fp32_cores ? p_.fp32_half() : p_.gemm_half_dim;
    const double seq_half = fp32_cores       ? p_.gemm_half_dim
                            : prices_cudnn_attention(*o) ? p_.torch_attention_half()
                                              : p_.attention_half();
    for (const std::int64_t x : {m, n, k}) e *= saturation(static_cast<double>(x), x == head_dim ? head_half : seq_half);
    return e * alignment_factor(p_, m, n, k, align, out_ld, false);  // a flash kernel writes no scores
  };
  double geo_flops = 0, weighted = 0;
  for (const auto& g : o->gemms) {
    // A batched GEMM's batch adds independent output tiles: it fills the device like
    // more rows, so the row dimension of each product counts batch · rows.
    const std::int64_t b = std::max<std::int64_t>(g.batch, 1);
    const double f = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
                     static_cast<double>(b);
    if (!backward) {
      geo_flops += f;
      weighted += f / efficiency(g.m * b, g.n, g.k, g.n);
    } else {
      // C(m,n) = A(m,k) B(k,n): dA(m,k) = dC(m,n) B^T is an (m, k, n) GEMM,
      // dB(k,n) = A^T dC is a (k, n, m) GEMM.
      geo_flops += 2.0 * f;
      weighted += f / efficiency(g.m * b, g.k, g.n, g.k) + f / efficiency(g.k * b, g.n, g.m, g.k);
    }
  }
  double eff = geo_flops > 0 ? geo_flops / weighted : p_.gemm_max_efficiency;
  if (attention && !fp32_cores) {  // the 16-bit kernels' own factors (DeviceProfile::attention_efficiency)
    eff *= backward ? p_.attention_backward_efficiency : p_.attention_efficiency;
    if (o->alpha > 0) eff *= backward ? p_.attention_dropout_backward() : p_.attention_dropout_efficiency;  // alpha: dropout_p
    if (!prices_cudnn_attention(*o))  // zeroplan's own kernels
      eff *= backward ? p_.executor_attention_backward_efficiency : p_.executor_attention_efficiency;
  }
  // fp32 models run their GEMMs on the fp32 cores (PyTorch's default leaves TF32 matmuls off),
  // or in TF32 at half the 16-bit tensor peak where the profile says the stack allows it.
  const double peak = p_.gemm_peak(g_.opt.act_dtype);
  const double gemm_time = flops.v / (peak * eff);
  const double staging = staged_bytes / (p_.hbm_bandwidth.v * p_.elementwise_efficiency);
  return Seconds{std::max(gemm_time, mem_time) + staging + launch + bias_grad_time(*o, phase) +
                 (attention && backward && !fp32_cores && prices_cudnn_attention(*o) ? attention_backward_passes(*o) : 0.0)};
}

// PyTorch's kernels for a bandwidth-bound op of the graph, as Hugging Face's code runs it under
// autograd, each priced at its family's fraction of the bandwidth (torch_kernel_cost). Read from
// the top kernels of DeepSpeed 0.19.8 runs profiled on H100s (tests/data/deepspeed/
// h100_deepspeed_0.19.8.json and h100_kernels_0.19.8.json, gpu_top_kernels; docs/compute_model.md):
// - RoPE (q * cos + rotate_half(q) * sin, on a strided head view) is five kernels moving ten
//   times the head tensor's bytes forward (mul, neg, cat, mul, add), seven backward (two muls,
//   a neg, and for each of rotate_half's slices a zero fill and a copy into it);
// - pow's backward is grad * (e * x^(e-1)): x^(e-1) (for e = 2, x.pow(1): a device memcpy), the
//   scaling, the product with the gradient;
// - a row-scale or weight multiply's backward is the broadcast product for the input's
//   gradient, and a product and a sum for the scale's (over the row) or weight's (over rows);
// - RMSNorm's mean is a reduction at the rate of an add; its backward writes the expanded
//   gradient; rsqrt's and the eps add's kernels are scalars';
// - LayerNorm's backward is two kernels: gamma and beta's column sums over dy and x, then the
//   input's gradient (dy, x in; dx out);
// - an add or a mask with a broadcast operand, and a widening cast, run unvectorised;
// - a mask added to the attention scores passes its gradient on (the mask takes none): no kernel;
// - the KV cache's copies of the key and value heads (the model's outputs) are torch.cat, the
//   copy of a strided operand for a matmul (GPT-2's eager q) a strided copy;
// - the loss's backward fills log_softmax's output gradient with zeros before nll_loss scatters
//   into it, then log_softmax's backward reads it and the saved output and writes the logits'.
// A sum that passes its gradient on runs no kernel (zero/lower/walk.cpp makes it a marker).
double ComputeModel::torch_op_time(const models::Op& o, bool backward) const {
  using models::Fn;
  using K = TorchKernel;
  if (o.outputs.empty() || o.inputs.empty()) return -1;
  double t = 0;
  auto kernel = [&](double bytes, K k, int count = 1) { t += torch_kernel_cost(bytes, k, count); };
  const models::Tensor& x = g_.tensors[static_cast<std::size_t>(o.inputs[0])];
  const models::Tensor& y = g_.tensors[static_cast<std::size_t>(o.outputs[0])];
  const auto X = static_cast<double>(x.bytes.v), Y = static_cast<double>(y.bytes.v);
  const auto fwd = static_cast<double>(o.fwd_bytes.v), bwd = static_cast<double>(o.bwd_bytes.v);
  const bool widening = dtype_size(y.dtype) > dtype_size(x.dtype);
  // An operand with fewer elements than the output is broadcast (a position table, a mask);
  // asked of adds only, as every event of every micro-step comes here.
  auto broadcast = [&] {
    auto numel = [](const models::Tensor& tensor) {
      std::int64_t n = 1;
      for (const std::int64_t d : tensor.shape) n *= d;
      return n;
    };
    const std::int64_t out = numel(y);
    return std::any_of(o.inputs.begin(), o.inputs.end(),
                       [&](models::TensorId in) { return numel(g_.tensors[static_cast<std::size_t>(in)]) < out; });
  };
  if (!backward) {
    switch (o.fn) {
      case Fn::add: kernel(fwd, broadcast() ? K::strided : K::vectorized); break;
      case Fn::add_scalar: case Fn::scale: case Fn::mul: case Fn::gelu: case Fn::gelu_tanh:
      case Fn::relu: case Fn::silu: case Fn::tanh: case Fn::pow:
        kernel(fwd, K::vectorized);
        break;
      case Fn::dropout: kernel(fwd, K::random); break;
      case Fn::cast: kernel(fwd, widening ? K::strided : K::vectorized); break;
      case Fn::add_mask: case Fn::causal_where: case Fn::mul_rowscale: case Fn::mul_weight:
      case Fn::merge_heads: case Fn::repeat_kv:
        kernel(fwd, K::strided);
        break;
      case Fn::heads_copy: {
        const bool cache = std::find(g_.outputs.begin(), g_.outputs.end(), o.outputs[0]) != g_.outputs.end();
        kernel(fwd, cache ? K::cat : K::strided);
        break;
      }
      case Fn::rope:  // mul, neg (half in, half out), cat, mul, add
        kernel(2 * Y, K::strided);
        kernel(Y, K::strided);
        kernel(2 * Y, K::cat);
        kernel(2 * Y, K::strided);
        kernel(3 * Y, K::strided);
        break;
      case Fn::rms_rsqrt:  // the mean over the row; + eps and rsqrt on one value a row
        kernel(X + Y, K::vectorized);
        kernel(4 * Y, K::vectorized, 2);
        break;
      case Fn::layernorm: case Fn::softmax: case Fn::cross_entropy: kernel(fwd, K::row_norm); break;
      default: return -1;
    }
    return t;
  }
  switch (o.fn) {
    case Fn::add: case Fn::add_scalar: case Fn::scale: case Fn::gelu: case Fn::gelu_tanh: case Fn::relu:
    case Fn::silu: case Fn::tanh: case Fn::dropout:
      kernel(bwd, K::vectorized);
      break;
    case Fn::add_mask: case Fn::causal_where: break;  // the scores' gradient passes on
    case Fn::mul: {  // one product per operand that takes a gradient
      int grads = 0;
      for (const models::TensorId in : o.inputs) grads += is_float(g_.tensors[static_cast<std::size_t>(in)].dtype) ? 1 : 0;
      kernel(3 * Y * std::max(grads, 1), K::vectorized, std::max(grads, 1));
      break;
    }
    case Fn::pow:  // grad * (e * x^(e-1))
      if (o.alpha == 2.0)
        t += copy_cost(Bytes{2 * x.bytes.v}, zero::Placement::device, zero::Placement::device, 1).v;
      else
        kernel(2 * X, K::vectorized);
      kernel(2 * X, K::vectorized);
      kernel(3 * X, K::vectorized);
      break;
    case Fn::cast: kernel(X + Y, dtype_size(x.dtype) > dtype_size(y.dtype) ? K::strided : K::vectorized); break;
    case Fn::mul_rowscale: case Fn::mul_weight:  // dx = g * s (broadcast); ds = sum(g * x)
      kernel(2 * Y, K::strided);
      kernel(3 * Y, K::vectorized);
      kernel(Y, o.fn == Fn::mul_weight ? K::column_sum : K::strided);
      break;
    case Fn::rms_rsqrt:  // the mean's gradient expanded over the row; rsqrt's and the add's on scalars
      kernel(X, K::strided);
      kernel(9 * Y, K::vectorized, 3);
      break;
    case Fn::layernorm:  // gamma and beta: column sums over dy and x; then dx from dy and x
      kernel(2 * Y, K::column_sum);
      kernel(3 * Y, K::row_norm);
      break;
    case Fn::rope:  // g * cos, g * sin, neg, and for each slice of rotate_half a fill and a copy
      kernel(2 * Y, K::strided);
      kernel(2 * Y, K::strided);
      kernel(Y, K::strided);
      kernel(2 * Y, K::vectorized, 2);
      kernel(2 * Y, K::strided, 2);
      break;
    case Fn::merge_heads: case Fn::repeat_kv: case Fn::heads_copy: kernel(bwd, K::strided); break;
    case Fn::softmax: kernel(3 * Y, K::row_norm); break;  // dy, y in; dx out (one kernel per row)
    case Fn::cross_entropy:  // nll_loss's: a zero fill of logp's gradient; log_softmax's: dlogp, logp in, dx out
      kernel(Y, K::vectorized);
      kernel(3 * Y, K::row_norm);
      break;
    default: return -1;
  }
  return t;
}

// `count` kernels of PyTorch's family k moving `bytes` between them, each no quicker than a launch.
double ComputeModel::torch_kernel_cost(double bytes, TorchKernel k, int count) const {
  const double each = elementwise_cost(Flops{0}, Bytes{static_cast<std::int64_t>(bytes / std::max(count, 1))},
                                       p_.torch_efficiency(k) / p_.elementwise_efficiency, p_.kernel_launch.v)
                          .v;
  return each * std::max(count, 1);
}

// PyTorch's flash backward's passes beside its kernel, over the (B, A, T, D) operands (priced
// where the events stand for PyTorch's kernels; the executor's own kernel keeps its backward
// in its factor, as calibrated): dO · O summed
// per row before it (reads dO and O), and the fp32 accumulator of dQ written out in the
// activation dtype after it (reads 4 bytes, writes one element): 3 · size + 4 bytes per element,
// at the elementwise bandwidth. cuDNN's sdpa backward on an H100 under DeepSpeed
// (compute_dot_do_o, convert_dq_to_16bits): 43 us a layer for BERT-large at micro-batch 64 and
// 128 tokens (priced 40), 33 for GPT-2 at 8 x 1024 (30); the flash kernel's own time scales
// with T^2, these with T, so they weigh most at short sequences.
double ComputeModel::attention_backward_passes(const models::Op& o) const {
  if (o.gemms.empty()) return 0.0;
  const models::Gemm& s = o.gemms.front();  // the scores product: (T, T, D) over B·A
  const double elements = static_cast<double>(std::max<std::int64_t>(s.batch, 1)) * static_cast<double>(s.m) *
                          static_cast<double>(s.k);
  const auto bytes = static_cast<std::int64_t>(elements * (3.0 * static_cast<double>(dtype_size(g_.opt.act_dtype)) + 4.0));
  return elementwise_cost(Flops{0}, Bytes{bytes}, 1.0, 0.0).v;
}

// A layer's bias gradient is not part of either backward GEMM: it is the column sums of the
// output gradient, one more pass over it after them (PyTorch's grad.sum(0) for nn.Linear and
// Conv1D; the executor's column reduction), at the elementwise bandwidth.
double ComputeModel::bias_grad_time(const models::Op& o, zero::Phase phase) const {
  if (phase != zero::Phase::backward) return 0.0;
  double t = 0;
  for (const models::Gemm& g : o.gemms) {
    if (!g.bias) continue;
    const Bytes read{g.m * std::max<std::int64_t>(g.batch, 1) * g.n * dtype_size(g_.opt.act_dtype)};
    // PyTorch's is a column sum (TorchKernel::column_sum); the executor's at the elementwise rate.
    t += deepspeed ? torch_kernel_cost(static_cast<double>(read.v), TorchKernel::column_sum)
                   : elementwise_cost(Flops{0}, read, 1.0, p_.kernel_launch.v).v;
  }
  return t;
}

const models::Op& ComputeModel::op_at(models::OpId op) const {
  if (op < 0 || static_cast<std::size_t>(op) >= g_.ops.size())
    throw std::logic_error(fmt::format("op {} is not in the graph ({} ops)", op, g_.ops.size()));
  return g_.ops[static_cast<std::size_t>(op)];
}

Seconds ComputeModel::bias_grad_cost(models::OpId op, zero::Phase phase) const {
  return op == models::kNone ? Seconds{0} : Seconds{bias_grad_time(op_at(op), phase)};
}

Seconds ComputeModel::unfused_bias_cost(models::OpId op) const {
  if (op == models::kNone) return Seconds{0};
  double t = 0;
  for (const models::Gemm& g : op_at(op).gemms) {
    if (!g.bias) continue;
    const std::int64_t out = g.m * std::max<std::int64_t>(g.batch, 1) * g.n;
    const Bytes moved{(2 * out + g.n) * dtype_size(g_.opt.act_dtype)};
    t += torch_kernel_cost(static_cast<double>(moved.v), TorchKernel::strided);  // the bias broadcast over the rows
  }
  return Seconds{t};
}

Seconds ComputeModel::unfused_bias_add(const zero::Event& e) const {
  return deepspeed && e.unfused_bias ? unfused_bias_cost(e.op) : Seconds{0};
}

Seconds ComputeModel::bias_part(const zero::Event& e) const {
  if (e.kind != zero::EventKind::compute) return Seconds{0};
  if (e.phase == zero::Phase::backward) return bias_grad_cost(e.op, e.phase);
  return unfused_bias_add(e);
}

double ComputeModel::grad_add_seconds_per_byte() const {
  if (!deepspeed) return 0.0;
  return 3.0 / (p_.hbm_bandwidth.v * p_.torch_efficiency(TorchKernel::vectorized));  // CUDAFunctor_add: torch_kernel_cost's rate
}

double grad_accumulate_seconds(const zero::Event& e, double seconds_per_byte, double launch) {
  if (e.grad_adds <= 0 || seconds_per_byte <= 0) return 0.0;
  return std::max(static_cast<double>(e.grad_add_bytes.v) * seconds_per_byte, static_cast<double>(e.grad_adds) * launch);
}

Seconds ComputeModel::grad_accumulate_cost(const zero::Event& e) const {
  return Seconds{grad_accumulate_seconds(e, grad_add_seconds_per_byte(), grad_add_launch())};
}

Seconds ComputeModel::op_cost(models::OpId op, zero::Phase phase) const {
  const models::Op& o = op_at(op);
  const bool backward = phase == zero::Phase::backward;
  return compute_cost(op, phase, backward ? o.bwd_flops : o.fwd_flops, backward ? o.bwd_bytes : o.fwd_bytes);
}

bool ComputeModel::prices_cudnn_attention(const models::Op& o) const {
  if (deepspeed) return true;
  if (!cudnn_attention) return false;
  // What exec/device_cuda_ops.cpp asks: the scores product (T × D)·(D × T) gives the sequence
  // and the head dimension.
  if (o.gemms.empty()) return true;
  const auto& s = o.gemms.front();
  return kernels::sdpa_cudnn_takes(s.n, s.k, g_.opt.act_dtype == DType::bf16 || g_.opt.act_dtype == DType::fp16);
}

Seconds ComputeModel::local_reduction_cost(Bytes bytes, std::int64_t tensors) const {
  if (tensors <= 0 && bytes.v <= 0) return Seconds{0};
  const double read = static_cast<double>(bytes.v) / (p_.hbm_bandwidth.v * p_.elementwise_efficiency);
  // DeepSpeed's norm takes each tensor in a kernel of its own (norm_tensor each); zeroplan's
  // executor sums the squares of all of them in one multi-tensor kernel (kernels/cuda
  // multi_sum_squares): one fixed cost, whatever the tensors.
  if (!deepspeed) return Seconds{read + p_.executor_norm_cost().v};
  return Seconds{read + static_cast<double>(std::max<std::int64_t>(tensors, 1)) * p_.norm_tensor.v};
}

// DeepSpeed's per-tensor loops launch kernels on tensors and scalars too small to reach the
// bandwidth: each takes the profile's time per loop kernel (docs/deepspeed_fidelity.md).
Seconds ComputeModel::loop_kernels_cost(const zero::Event& e) const {
  if (!deepspeed) return Seconds{0};
  return Seconds{static_cast<double>(std::max(e.loop_kernels, 0)) * p_.loop_kernel.v +
                 static_cast<double>(std::max<std::int64_t>(e.loop_bytes.v, 0)) /
                     (p_.hbm_bandwidth.v * p_.elementwise_efficiency)};
}

Seconds ElementwisePricing::seconds(Flops flops, Bytes bytes) const {
  return Seconds{std::max({static_cast<double>(bytes.v) / bytes_per_s, flops.v / flops_per_s, floor_s})};
}

// Bandwidth-bound (or fp32-FLOP-bound) kernels, never faster than their launches, at the
// elementwise efficiency times `factor` (an op kind's, the optimizer's).
ElementwisePricing ComputeModel::elementwise_pricing(double factor, double launch) const {
  const double eff = p_.elementwise_efficiency * factor;
  return {p_.hbm_bandwidth.v * eff, p_.peak_fp32_flops.v * eff, launch};
}

Seconds ComputeModel::elementwise_cost(Flops flops, Bytes bytes, double factor, double launch) const {
  return elementwise_pricing(factor, launch).seconds(flops, bytes);
}

ElementwisePricing ComputeModel::update_pricing() const {
  return elementwise_pricing(p_.optimizer_efficiency * (deepspeed ? 1.0 : p_.executor_optimizer_efficiency),
                             p_.kernels_per_op * p_.kernel_launch.v);
}

Seconds ComputeModel::optimizer_cost(Flops flops, Bytes bytes) const { return update_pricing().seconds(flops, bytes); }

Seconds ComputeModel::copy_cost(Bytes bytes, zero::Placement src, zero::Placement dst, std::int64_t pieces,
                                zero::CopyKernel kernel, bool host_bound) const {
  using zero::Placement;
  if (bytes.v <= 0) return Seconds{0};  // a view: nothing moves
  double bw = p_.d2d_copy_bandwidth.v, floor = p_.copy_launch.v;
  if (src == Placement::device && dst == Placement::device && kernel != zero::CopyKernel::memcpy) {
    const auto kind = kernel == zero::CopyKernel::cast ? models::OpKind::cast : models::OpKind::add;
    bw = p_.hbm_bandwidth.v * p_.elementwise_efficiency * p_.op_factor(kind, false);
  } else if (src == Placement::host && dst == Placement::host) {
    bw = p_.host_memcpy_bandwidth.v;
  } else if (src != dst) {
    bw = p_.pcie_h2d.v;
    floor = p_.h2d_launch.v;
  }
  const auto n = static_cast<double>(std::max<std::int64_t>(pieces, 1));
  const double device = std::max(static_cast<double>(bytes.v) / bw, floor) + (n - 1) * p_.copy_piece.v;
  return Seconds{host_bound ? std::max(device, n * p_.host_launch.v) : device};
}

Seconds ComputeModel::cost(const zero::Event& e) const {
  using zero::EventKind;
  using zero::Placement;
  switch (e.kind) {
    case EventKind::marker:
      return Seconds{0};
    case EventKind::host:
      return deepspeed ? host_cost(p_.host, e) : Seconds{0};
    case EventKind::collective:
      throw std::logic_error("collective events are priced by the collective model, not the compute model");
    case EventKind::compute:
      return compute_cost(e.op, e.phase, e.flops, e.mem_bytes) + unfused_bias_add(e) + grad_accumulate_cost(e);
    case EventKind::copy:
      // A copy whose kernels per tensor are counted (loop_kernels) is priced by them, not by
      // its pieces.
      return copy_cost(e.mem_bytes, e.src, e.dst,
                       deepspeed && e.loop_kernels > 0
                           ? 1
                           : std::max<std::int64_t>(e.slice_end - e.slice_begin, e.tensors),
                       e.copy_kernel, e.host_bound) +
             loop_kernels_cost(e);
    case EventKind::optimizer: {
      if (e.src == Placement::host) {
        const double elements = e.flops.v / kAdamFlopsPerElement;
        return Seconds{elements / p_.cpu_adam_params_per_second};
      }
      // Fused Adam over a flat partition: bandwidth-bound on master, grads and states; after the
      // local norm of the gradients where step() takes it.
      return optimizer_cost(e.flops, e.mem_bytes) +
             (e.reduce_bytes.v > 0 ? local_reduction_cost(e.reduce_bytes, e.tensors) : Seconds{0}) +
             loop_kernels_cost(e);
    }
  }
  throw std::logic_error("unknown event kind");
}

}  // namespace zp::sim
