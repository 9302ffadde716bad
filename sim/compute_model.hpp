#pragma once
// Compute cost model: each event's time from its FLOPs and bytes — a roofline over the
// device's peak tensor FLOP/s and HBM bandwidth, with GEMM efficiency as a function of
// (m, n, k), bandwidth-bound elementwise/normalisation ops with an efficiency floor, and
// a per-kernel launch overhead — plus the host-side costs DeepSpeed pays (optimizer on
// the partition, flatten/cast copies, CPU Adam, PCIe transfers for offload).
// Every coefficient lives in a DeviceProfile that calibration will replace with
// measured values (calibration/profiles/*.json); defaults come from sim/profiles.json.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/units.hpp"
#include "models/graph.hpp"
#include "sim/device.hpp"
#include "zero/program.hpp"

namespace zp::sim {

// The host thread's work, which DeepSpeed training pays on top of the GPU's: PyTorch's eager
// dispatch and kernel launches and the Hugging Face modules' Python per op, autograd per
// backward node, DeepSpeed's gradient hooks, stage 3's fetch/release coordinator per module
// visit, and the optimizer step's Python loops over parameter tensors with their device
// synchronisations (FP16_Optimizer and the stage 1/2 optimizer check every gradient for
// inf/NaN with an .item() each). The event engine runs them on the host in issue order
// (docs/time_model.md). Defaults were fitted to DeepSpeed 0.19.8 / torch 2.11 / transformers
// 5.17 runs on the H200 machine's host (tools/deepspeed_reference.py, tests/data/deepspeed/);
// calibration refits them for another host.
struct HostCosts {
  Seconds forward_op{};             // per forward (or recomputed) op of the graph
  Seconds backward_op{};            // per backward node
  Seconds grad_hook{};              // stages 1/2: DeepSpeed's gradient hook, per parameter
  Seconds bucket_hook{};            // stages 1/2: more per hook that adds its gradient to an IPG bucket
  Seconds stage3_module_forward{};  // stage 3: coordinator work per module visit in forward
  Seconds stage3_module_backward{}; // stage 3: per module visit in backward
  Seconds stage3_param_forward{};   // stage 3: more per parameter of a module visit in forward
  Seconds stage3_grad_hook{};       // stage 3: reduce_partition_and_remove_grads, per parameter
  Seconds stage3_linear_forward{};  // stage 3: LinearFunctionForZeroStage3's Python per nn.Linear call in forward
  Seconds stage3_linear_backward{}; // stage 3: its Python backward per nn.Linear
  // The optimizer step, by the wrapper DeepSpeed chose: base + per_tensor × parameter tensors.
  struct Step {
    Seconds base{}, per_tensor{};
    bool operator==(const Step&) const = default;
  };
  Step fp16_optimizer;              // stage 0 with fp16/bf16 (FP16_Optimizer)
  Step bf16_optimizer;              // stage 1 bf16 with fp32 gradient accumulation (BF16_Optimizer)
  Step zero_optimizer;              // stages 1/2 (DeepSpeedZeroOptimizer)
  Step zero3_optimizer;             // stage 3 (DeepSpeedZeroOptimizer_Stage3)
  Step plain;                       // fp32 without ZeRO: the optimizer itself (FusedAdam)
  // The host probe these costs were measured at (µs per eager op: tools/deepspeed_reference.py's
  // host_probe, PyTorch in-place adds on a small CUDA tensor from a Python loop); 0: not known.
  // A host's DeepSpeed costs follow its probe (docs/time_model.md), so a prediction for a host
  // whose probe is known scales them by that probe / this one (scaled_host_costs).
  double probe_us = 0;
  // A factor on every cost above: a host that runs the same Python faster or slower. One such
  // factor carried the H200 machines' costs to an H100 machine's host within 5-9% per phase
  // (docs/calibration.md); `zeroplan calibrate --fit host.scale` fits it for a user's host.
  double scale = 1;
  std::string source;
  bool operator==(const HostCosts&) const = default;
};

// The largest host probe (µs per eager op) read anywhere: a profile's, a recorded run's, --host-probe-us.
constexpr double kMaxHostProbeUs = 1e4;
// The range of host.scale (a profile's key, calibrate's parameter).
constexpr double kMinHostScale = 0.01, kMaxHostScale = 100;

// `h` with every cost `factor` (> 0) times as long (its scale times factor); probe_us follows (the
// costs of a host whose probe is factor times h's).
HostCosts scaled_host_costs(const HostCosts& h, double factor);

// The costs for a host whose probe is `probe_us`: scaled by probe_us / h.probe_us, or `h` itself
// where either probe is unknown (0).
HostCosts host_costs_at_probe(const HostCosts& h, double probe_us);

// The families PyTorch's bandwidth-bound kernels fall into on a GPU, each with its own fraction
// of the HBM bandwidth (DeviceProfile::torch_kernel_efficiency): `vectorized`, TensorIterator's
// kernels over contiguous operands of one shape (adds, multiplies, activations, dropout,
// narrowing casts); `strided`, its unvectorised kernels (a broadcast operand, a strided view,
// a widening cast, a row's sum); `random`, a kernel that draws its own random numbers
// (dropout's mask, Philox); `cat`, torch.cat of strided head views (the KV cache's
// update, RoPE's rotate_half); `row_norm`, a kernel per row (LayerNorm forward and its input's
// gradient, softmax and log-softmax); `column_sum`, a sum over rows (LayerNorm's gamma and
// beta gradients, a weight's or a bias's gradient).
enum class TorchKernel : std::uint8_t { vectorized, strided, random, cat, row_norm, column_sum };
inline constexpr int kNumTorchKernels = 6;
const char* torch_kernel_name(TorchKernel k);
const std::vector<std::string>& torch_kernel_names();

struct DeviceProfile {
  std::string device;                    // device database name
  FlopsPerSecond peak_tensor_flops{};
  FlopsPerSecond peak_fp32_flops{};
  BytesPerSecond hbm_bandwidth{};
  // GEMM efficiency: eff(m,n,k) = max_eff * s(m) * s(n) * s(k), s(x) = x / (x + half_dim)
  double gemm_max_efficiency = 0.8;
  double gemm_half_dim = 128;
  // The half-point of the curve for GEMMs on the fp32 cores (fp32 models without TF32): a peak
  // 15 times below the tensor cores' is reached with smaller tiles, so small dimensions cost
  // less than on the tensor-core curve. Negative: gemm_half_dim.
  double fp32_gemm_half_dim = -1;
  double fp32_half() const { return fp32_gemm_half_dim >= 0 ? fp32_gemm_half_dim : gemm_half_dim; }
  // Factor on eff when a GEMM dimension is only 2-byte aligned (an odd 16-bit dimension:
  // GPT-2's vocabulary, 50257): cuBLAS leaves its fastest tensor-core kernels, whose loads want
  // 16 bytes. A dimension aligned to 4 or 8 bytes pays less: factor · (bytes / 2)^0.72, at most 1
  // (kUnalignedGrading): BERT's 30522 (4-byte rows) ran 1.65x the speed of GPT-2's 50257 on the
  // H200 (243 against 122 TFLOP/s, 0.33 against 0.20 of the aligned rate) and under DeepSpeed on
  // an H100 (its decoder's align2 kernels 236-261 TFLOP/s, GPT-2's head backward's align1 141-146).
  double gemm_unaligned_factor = 1.0;
  // The same factor for PyTorch's products whose output rows are the 2-byte aligned ones (the
  // forward of a head with an odd vocabulary: its logits), where cuBLAS, as PyTorch calls it,
  // falls back to a CUTLASS kernel that writes them element by element
  // (cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1). Under DeepSpeed on an H100,
  // GPT-2's head forward ran at 94 TFLOP/s against 141-146 for its two backward products, whose
  // odd dimension is an operand's. zeroplan's executor's products (cuBLASLt as it calls it) keep
  // gemm_unaligned_factor. Negative: gemm_unaligned_factor.
  double torch_gemm_unaligned_output_factor = -1;
  double torch_unaligned_output() const {
    return torch_gemm_unaligned_output_factor >= 0 ? torch_gemm_unaligned_output_factor : gemm_unaligned_factor;
  }
  double elementwise_efficiency = 0.8;   // fraction of HBM bandwidth elementwise ops reach
  // Factors on the GEMM-curve efficiency of fused attention (sdpa, flash), forward and
  // backward: its batched products run inside one kernel whose speed is the kernel's own
  // (FlashAttention, cuDNN, or zeroplan's), not cuBLAS's, and a flash backward (which
  // recomputes the probabilities) runs further below its GEMMs than the forward does.
  // 1 = priced as the GEMMs. These and the two below describe the 16-bit kernels on the tensor
  // cores (cuDNN's fused attention, which PyTorch 2.11 runs on Hopper); an fp32 model's
  // attention (PyTorch's memory-efficient kernel on the fp32 cores) is priced on the fp32 GEMM
  // curve alone: the H100's profiles put the two apart (docs/deepspeed_fidelity.md).
  double attention_efficiency = 1.0;
  double attention_backward_efficiency = 1.0;
  // The half-point of fused attention's curve along the sequence (the dimensions of its
  // products that are not the head dimension): a flash kernel's loop over keys amortises its
  // per-tile work over the sequence, not as a cuBLAS GEMM does over its k, so BERT's 128
  // tokens and GPT-2's 1024 need their own curve. Negative: gemm_half_dim (the GEMM curve).
  double attention_half_seq = -1;
  double attention_half() const { return attention_half_seq >= 0 ? attention_half_seq : gemm_half_dim; }
  // The same half-point for the attention kernel PyTorch runs (F.scaled_dot_product_attention
  // under DeepSpeed: cuDNN's flash kernel on Hopper), where the kernels priced are PyTorch's
  // (ComputeModel::deepspeed); attention_half_seq stays zeroplan's executor's, whose own
  // kernel amortises its tiles over the sequence differently (47 tokens fitted on the H200,
  // docs/calibration.md, where cuDNN's ran as fast per FLOP at 128 tokens as at 1024: 16).
  // Negative: attention_half().
  double torch_attention_half_seq = -1;
  double torch_attention_half() const { return torch_attention_half_seq >= 0 ? torch_attention_half_seq : attention_half(); }
  // Factor on the forward's efficiency when the kernel draws a dropout mask (sdpa / flash with
  // dropout_p > 0), and on the backward's, which regenerates the mask: each runs below its
  // dropout-free speed, by its own amount (the backward's factor < 0: the forward's).
  double attention_dropout_efficiency = 1.0;
  double attention_dropout_backward_efficiency = -1;
  double attention_dropout_backward() const {
    return attention_dropout_backward_efficiency > 0 ? attention_dropout_backward_efficiency
                                                     : attention_dropout_efficiency;
  }
  // Factor on elementwise_efficiency for the optimizer's update on the device (a fused,
  // multi-tensor Adam over master, gradients and states): one kernel streaming several
  // buffers at once, not a stack's average elementwise op.
  double optimizer_efficiency = 1.0;
  // zeroplan's executor's own kernels where they are not the ones DeepSpeed's PyTorch runs
  // (ComputeModel::deepspeed off): factors on the attention factors above for its own 16-bit
  // fused attention (kernels/cuda/sdpa.cu; cuDNN's, --attention-kernel cudnn, is priced as
  // PyTorch's), forward and backward, and on optimizer_efficiency for its Adam (one kernel over
  // the flat partition). 1 = priced as PyTorch's kernels are.
  double executor_attention_efficiency = 1.0;
  double executor_attention_backward_efficiency = 1.0;
  double executor_optimizer_efficiency = 1.0;
  // Factors on elementwise_efficiency per op kind of the graph, forward and backward: a
  // stack's LayerNorm backward or embedding backward (a scatter-add) runs further below the
  // bandwidth than its adds do. 1 = the common efficiency; calibration fits them per kind.
  std::array<double, 2 * models::kNumOpKinds> op_efficiency = [] {
    std::array<double, 2 * models::kNumOpKinds> a{};
    a.fill(1.0);
    return a;
  }();
  double& op_factor(models::OpKind k, bool backward) {
    return op_efficiency[static_cast<std::size_t>(2 * static_cast<int>(k) + (backward ? 1 : 0))];
  }
  double op_factor(models::OpKind k, bool backward) const {
    return op_efficiency[static_cast<std::size_t>(2 * static_cast<int>(k) + (backward ? 1 : 0))];
  }
  // PyTorch's kernels per family (TorchKernel), where the events stand for PyTorch's
  // (ComputeModel::deepspeed): fractions of the HBM bandwidth, profile key
  // torch_kernel_efficiency {"vectorized": 0.9, ...}. Negative: elementwise_efficiency.
  std::array<double, kNumTorchKernels> torch_kernel_efficiency = {-1, -1, -1, -1, -1, -1};
  double torch_efficiency(TorchKernel k) const {
    const double e = torch_kernel_efficiency[static_cast<std::size_t>(k)];
    return e > 0 ? e : elementwise_efficiency;
  }
  Seconds kernel_launch{};               // per kernel
  // The floor of a memcpy within the device or within the host (cudaMemcpyAsync, a copy
  // engine's set-up), and of one between host and device (a PCIe round trip, and the staging
  // of pageable memory): the same as a kernel's launch unless measured otherwise (profile keys
  // copy_launch_us, h2d_launch_us).
  Seconds copy_launch{};
  Seconds h2d_launch{};
  // Added per contiguous piece of a copy event beyond the first (a flatten of N tensors that a
  // stack copies one by one); 0 where one kernel moves them all (torch.cat).
  Seconds copy_piece{};
  // The host's cost of issuing one piece of a copy (a cudaMemcpyAsync call): it binds where
  // the device waits for the host, the copies issued right after the host read a value back
  // (zero::Event::host_bound). 0: not priced apart (DeepSpeed's host events carry the launches).
  Seconds host_launch{};
  // The local reduction before a scalar all-reduce (the gradient norm, the overflow check):
  // per gradient tensor it visits (its kernels' launches), on top of reading their bytes at
  // elementwise_efficiency. The same as a kernel's launch unless measured otherwise.
  Seconds norm_tensor{};
  // The same local reduction in zeroplan's executor, which sums every tensor's squares in one
  // multi-tensor kernel: its fixed cost, once per reduction. Negative: a kernel's launch.
  Seconds executor_norm{-1};
  Seconds executor_norm_cost() const { return executor_norm.v >= 0 ? executor_norm : kernel_launch; }
  // The mean device time of one kernel of DeepSpeed's per-tensor loops in the optimizer step
  // (zero::Event::loop_kernels: has_inf_or_nan's reductions and scalar ops, a cast and a copy
  // per parameter), beyond the bytes the events already price. The same as a kernel's launch
  // unless measured otherwise (profile key loop_kernel_us).
  Seconds loop_kernel{};
  int kernels_per_op = 1;                // average kernels an op launches (fwd); bwd doubles
  BytesPerSecond d2d_copy_bandwidth{};   // memcpy within the device (read + write counted)
  BytesPerSecond pcie_h2d{};             // host ↔ device per direction
  BytesPerSecond host_memcpy_bandwidth{};// memcpy within host memory (read + write counted)
  double cpu_adam_params_per_second = 1e9;  // DeepSpeed CPUAdam throughput on the host
  double comm_compute_interference = 0.0;   // slowdown of compute while a collective overlaps
  // fp32 GEMMs run in TF32 on the tensor cores (at half their 16-bit peak) instead of on the
  // fp32 cores: what a stack that allows TF32 matmuls does.
  bool fp32_gemm_tf32 = false;
  HostCosts host;                           // the training host's framework work
  std::string source;
  // How far this profile's iteration times were measured to be from a real framework's: one
  // standard deviation of log(predicted / measured), and what it was measured against (0 and
  // empty where no one measured it). A cluster profile's own uncertainty replaces it.
  double iteration_rel_sd = 0;
  std::string uncertainty_basis;
  // The GEMM peak for activations of dtype `act`: the tensor cores for 16-bit, TF32 (half
  // the 16-bit peak) for fp32 where fp32_gemm_tf32, else the fp32 cores. MFU is taken
  // against it too.
  double gemm_peak(DType act) const {
    return act != DType::fp32 ? peak_tensor_flops.v : fp32_gemm_tf32 ? 0.5 * peak_tensor_flops.v : peak_fp32_flops.v;
  }
};
// The host costs measured on the H200 machine (the default of every profile without its own).
HostCosts default_host_costs();
// The time a host event (zero::EventKind::host) keeps the host thread busy.
Seconds host_cost(const HostCosts& c, const zero::Event& e);

// Defaults for a device from sim/profiles.json (or derived from the device database).
DeviceProfile default_profile(const DeviceSpec& dev);
DeviceProfile load_profile(const std::string& path);
// One profile object in the format of sim/profiles.json's entries, read as strictly (a
// misspelled or missing key is an InputError naming `file` and the key under `key_path`),
// and a profile written back in that format (what calibration writes into cluster profiles).
DeviceProfile profile_from_json(const std::string& file, const std::string& key_path, const nlohmann::json& obj);
nlohmann::json profile_to_json(const DeviceProfile& p);
// Every entry of a profile database in the format of sim/profiles.json (strict).
std::vector<DeviceProfile> load_profiles(const std::string& path);
// GEMM efficiency of the profile: max_eff · s(m) · s(n) · s(k), in (0, gemm_max_efficiency],
// times alignment_factor when m, n or k is not a multiple of `align` elements (16 bytes:
// align = 16 / element size). On the fp32 cores (fp32_cores: an fp32 GEMM without TF32) the
// curve's half-point is fp32_gemm_half_dim. `out_ld` is the leading dimension of the product's
// output (0: n, the output C(m, n) of row-major operands); `torch`: the product is PyTorch's
// (DeepSpeed's), not zeroplan's executor's.
double gemm_efficiency(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::int64_t align = 1, bool fp32_cores = false, std::int64_t out_ld = 0, bool torch = true);
// Event e's autograd adds (Event::grad_adds) at `seconds_per_byte` of accumulated gradient, no
// quicker than `launch` each: ComputeModel::grad_accumulate_cost, and the trace's share of it.
double grad_accumulate_seconds(const zero::Event& e, double seconds_per_byte, double launch);
// 1 when m, n and k are multiples of `align` (or align <= 1); else, with `bytes` the bytes
// every dimension is aligned to, min(1, f · (bytes / 2)^kUnalignedGrading), f the profile's
// torch_unaligned_output() for a PyTorch product whose output rows (out_ld; 0: n) are 2-byte
// aligned, else gemm_unaligned_factor.
inline constexpr double kUnalignedGrading = 0.72;  // log2(0.33 / 0.20): 4-byte against 2-byte rows, H200 sweep
double alignment_factor(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t align,
                        std::int64_t out_ld = 0, bool torch = true);

// A bandwidth-bound (or fp32-FLOP-bound) kernel's price: its bytes at `bytes_per_s`, its FLOPs at
// `flops_per_s`, never less than `floor_s` (ComputeModel::elementwise_pricing). The fused
// optimizer update's (Adam over a flat partition on the device), apart from the norm and
// per-tensor loop kernels its event may carry, is ComputeModel::update_pricing(): the trace
// names its time the optimizer's multi-tensor kernels and the rest elementwise, as the
// profiler classes DeepSpeed's kernels.
struct ElementwisePricing {
  double bytes_per_s = 0, flops_per_s = 0, floor_s = 0;
  Seconds seconds(Flops flops, Bytes bytes) const;
};

class ComputeModel {
 public:
  ComputeModel(const DeviceProfile& profile, const models::OpGraph& graph);
  // Duration of a compute / copy / optimizer event (collectives are not priced here).
  Seconds cost(const zero::Event& e) const;
  // Duration of graph op `op` in `phase` (forward, backward or recompute) with the op's
  // own FLOPs and bytes: what cost() gives for the compute event that runs it.
  Seconds op_cost(models::OpId op, zero::Phase phase) const;
  // A compute kernel of `flops` and `bytes` in `phase`: GEMM-shaped by graph op `op`
  // (kNone: a non-GEMM op). A bandwidth-bound op of the graph priced as PyTorch's kernels
  // (`deepspeed` true) takes its bytes from the op's tensors (torch_op_time), not these.
  Seconds compute_cost(models::OpId op, zero::Phase phase, Flops flops, Bytes bytes) const;
  // The part of op `op`'s time in `phase` that its bias gradients take: the column sums of
  // the output gradient after the backward GEMMs (a reduction kernel to a profiler, not a
  // GEMM). 0 outside backward and for ops without a bias.
  Seconds bias_grad_cost(models::OpId op, zero::Phase phase) const;
  // Adding op `op`'s biases by a kernel of their own after the products (zero::Event::
  // unfused_bias: DeepSpeed stage 3's linear function): each output read and written once more
  // by PyTorch's add of a broadcast bias (TorchKernel::strided). 0 for an op without a bias.
  Seconds unfused_bias_cost(models::OpId op) const;
  // The part of compute event e's time that a profiler sees as elementwise kernels beside its
  // products: its bias gradients' sums in backward, DeepSpeed's separate bias add in forward.
  Seconds bias_part(const zero::Event& e) const;
  // Autograd's adds of a backward event's input gradients into those another consumer made
  // first (Event::grad_adds, grad_add_bytes): each reads both and writes one, at the
  // elementwise bandwidth of an add, never faster than its launch. 0 where the events stand for
  // zeroplan's executor (`deepspeed` false), which accumulates inside its kernels.
  Seconds grad_accumulate_cost(const zero::Event& e) const;
  // Its two terms: seconds per byte of accumulated gradient (its three bytes moved) and per add
  // (the launch floor); both 0 with `deepspeed` false.
  double grad_add_seconds_per_byte() const;
  double grad_add_launch() const { return deepspeed ? p_.kernel_launch.v : 0.0; }
  // The local reduction of a scalar all-reduce event (Event::tensors, mem_bytes): 0 for
  // any other collective.
  Seconds local_reduction_cost(Bytes bytes, std::int64_t tensors) const;
  // DeepSpeed's own work in an event (Event::loop_kernels, loop_bytes): its per-tensor loops'
  // small kernels and their bytes. 0 where the events stand for zeroplan's executor, which
  // does none of it (`deepspeed` false: calibration from the executor's runs, `plan
  // --verify`'s predictions of the executor).
  Seconds loop_kernels_cost(const zero::Event& e) const;
  // Whose work the events stand for. On: DeepSpeed's, through PyTorch's kernels and Python.
  // Off: zeroplan's executor's, which has no per-tensor loops (loop_kernels_cost), no separate
  // bias adds (Event::unfused_bias), no autograd adds (Event::grad_adds), whose host events
  // (EventKind::host: PyTorch's and DeepSpeed's Python) cost nothing, its host thread doing only
  // the launches each kernel's time already counts, and to which none of the terms that
  // describe PyTorch's kernels apply (torch_op_time's kernel families, torch_attention_half_seq,
  // torch_gemm_unaligned_output_factor, cuDNN's flash backward's row passes): its own kernels
  // take the profile's other coefficients (op_efficiency among them).
  bool deepspeed = true;
  // Whose fused attention runs where `deepspeed` is off: zeroplan's own kernels (false) or
  // cuDNN's flash attention (`train --attention-kernel cudnn`), the kernel PyTorch runs on
  // Hopper, priced as it is under DeepSpeed (torch_attention_half_seq, the backward's row
  // passes). With `deepspeed` on, cuDNN's always.
  // With deepspeed off: a training run's large nn.Linear products whose output's columns are
  // odd (an LM head's) run as the executor's CUDA device stages them (aligned products and
  // copies through its scratch); false prices them as run in place, on cuBLASLt's unaligned
  // kernels (calibrate --device cuda's GEMM cases, whose B is stored (k, n) and is never staged)
  // or on the CPU device.
  bool stages_products = true;
  bool cudnn_attention = false;
  // Whether fused attention op `o` runs cuDNN's kernel (PyTorch's under DeepSpeed; the
  // executor's under cudnn_attention where cuDNN takes its operands, else its own kernels).
  bool prices_cudnn_attention(const models::Op& o) const;
  // The optimizer's update on the device: `bytes` read + written, `flops`, at the elementwise
  // bandwidth times optimizer_efficiency (without the norm some steps take first).
  Seconds optimizer_cost(Flops flops, Bytes bytes) const;
  ElementwisePricing update_pricing() const;
  // A copy of `bytes` (read + written) from src to dst in `pieces` contiguous pieces (0 bytes:
  // a view, free). Within the device, a memcpy moves at the device-copy bandwidth; a kernel
  // that converts or accumulates at the elementwise bandwidth of its op kind (cast, add).
  // Issued by a host that has just waited for the device (host_bound): no quicker than the
  // host issues its pieces, host_launch each.
  Seconds copy_cost(Bytes bytes, zero::Placement src, zero::Placement dst, std::int64_t pieces,
                    zero::CopyKernel kernel = zero::CopyKernel::memcpy, bool host_bound = false) const;
  const DeviceProfile& profile() const { return p_; }

 private:
  const models::Op& op_at(models::OpId op) const;  // the graph's op (a logic error outside it)
  // The separate bias add event e carries, where DeepSpeed runs it (`deepspeed` true).
  Seconds unfused_bias_add(const zero::Event& e) const;
  double bias_grad_time(const models::Op& o, zero::Phase phase) const;  // seconds; 0 without a bias
  double attention_backward_passes(const models::Op& o) const;           // seconds of a flash backward's row passes
  // Seconds of PyTorch's kernels for bandwidth-bound op o as Hugging Face's code runs it under
  // autograd (`deepspeed` true); negative where the op's own bytes are priced instead.
  double torch_op_time(const models::Op& o, bool backward) const;
  // `count` kernels of PyTorch's family k moving `bytes` between them (seconds).
  double torch_kernel_cost(double bytes, TorchKernel k, int count = 1) const;
  ElementwisePricing elementwise_pricing(double factor, double launch) const;
  Seconds elementwise_cost(Flops flops, Bytes bytes, double factor, double launch) const;

  DeviceProfile p_;
  const models::OpGraph& g_;
};

}  // namespace zp::sim
