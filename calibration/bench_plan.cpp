// What `calibrate --device cuda` measures, derived from the model's op graph, and the
// progress bar it draws. Portable: the CUDA side only runs the cases.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "calibration/device_bench.hpp"
#include "sim/collective_model.hpp"
#include "zero/lower/graph_facts.hpp"

namespace zp::calibration {

namespace {

constexpr double kTrialSeconds = 0.02;   // each trial: about 20 ms of calls
constexpr int kTrials = 3;
constexpr double kPerCaseOverhead = 0.005;  // allocation, warm-up, events
constexpr std::int64_t kMiB = 1 << 20;

std::string dims_text(const DeviceCase& c) {
  const auto& d = c.dims;
  switch (c.op) {
    case DeviceOp::gemm:
    case DeviceOp::gemm_bwd:
      return d[3] > 1 ? fmt::format("{}x{}x{}x{}", d[3], d[0], d[1], d[2]) : fmt::format("{}x{}x{}", d[0], d[1], d[2]);
    case DeviceOp::sdpa_fwd:
    case DeviceOp::sdpa_bwd: return fmt::format("{}x{}x{}x{}{}", d[0], d[1], d[2], d[3], d[4] ? " causal" : "");
    case DeviceOp::layernorm_fwd:
    case DeviceOp::layernorm_bwd:
    case DeviceOp::softmax_fwd:
    case DeviceOp::softmax_bwd: return fmt::format("{}x{}", d[0], d[1]);
    case DeviceOp::unary_fwd:
    case DeviceOp::unary_bwd:
    case DeviceOp::binary_fwd: return fmt::format("{}", d[0]);
    case DeviceOp::op_fwd:
    case DeviceOp::op_bwd: return fmt::format("op {}", d[0]);  // describe_op names it
    case DeviceOp::copy_d2d:
    case DeviceOp::copy_h2d:
    case DeviceOp::copy_d2h:
    case DeviceOp::copy_host: return fmt::format("{} B", d[0]);
    case DeviceOp::collective: return fmt::format("{} ranks {} B", d[0], d[1]);
  }
  return "";
}

// The observation a case becomes: its sample is what the kernel it runs moves and computes.
void describe(DeviceCase& c) {
  Observation& o = c.obs;
  KernelSample& k = o.kernel;
  const auto& d = c.dims;
  const double sz = static_cast<double>(dtype_size(c.dtype));
  o.kind = ObsKind::kernel;
  k.dtype = c.dtype;
  auto bytes = [&](double elements) { return Bytes{static_cast<std::int64_t>(elements * sz)}; };
  switch (c.op) {
    case DeviceOp::gemm:
    case DeviceOp::gemm_bwd: {
      const double m = static_cast<double>(d[0]), n = static_cast<double>(d[1]), kk = static_cast<double>(d[2]),
                   b = static_cast<double>(std::max<std::int64_t>(d[3], 1));
      k.cls = KernelClass::gemm;
      k.gemms = {models::Gemm{d[0], d[1], d[2], std::max<std::int64_t>(d[3], 1)}};
      const bool bwd = c.op == DeviceOp::gemm_bwd;
      k.backward = bwd;
      k.flops = Flops{(bwd ? 4.0 : 2.0) * m * n * kk * b};
      k.bytes = bytes((bwd ? 2.0 : 1.0) * b * (m * kk + kk * n + m * n));
      break;
    }
    case DeviceOp::sdpa_fwd:
    case DeviceOp::sdpa_bwd: {
      const std::int64_t B = d[0], H = d[1], T = d[2], D = d[3];
      const bool causal = d[4] != 0, bwd = c.op == DeviceOp::sdpa_bwd;
      k.cls = KernelClass::attention;
      k.gemms = {models::Gemm{T, T, D, B * H}, models::Gemm{T, D, T, B * H}};
      const double f = 4.0 * static_cast<double>(B * H) * static_cast<double>(T) * static_cast<double>(T) *
                       static_cast<double>(D) * (causal ? 0.5 : 1.0);
      k.backward = bwd;
      k.flops = Flops{bwd ? 2.5 * f : f};
      const double qkvo = 4.0 * static_cast<double>(B * H * T * D);
      k.bytes = Bytes{static_cast<std::int64_t>((bwd ? 2.0 : 1.0) * qkvo * sz + static_cast<double>(B * H * T) * 4.0)};
      break;
    }
    case DeviceOp::layernorm_fwd:
    case DeviceOp::layernorm_bwd: {
      const double rows = static_cast<double>(d[0]), C = static_cast<double>(d[1]);
      const bool bwd = c.op == DeviceOp::layernorm_bwd;
      k.cls = KernelClass::memory;
      k.backward = bwd;
      // fwd: read x, w, b; write y, mean, rstd. bwd: read dy, x, w, mean, rstd; write dx, dw, db.
      k.bytes = Bytes{static_cast<std::int64_t>((bwd ? 3.0 : 2.0) * rows * C * sz + (bwd ? 3.0 : 2.0) * C * sz +
                                                2.0 * rows * 4.0)};
      k.flops = Flops{(bwd ? 10.0 : 7.0) * rows * C};
      break;
    }
    case DeviceOp::softmax_fwd:
    case DeviceOp::softmax_bwd: {
      const double e = static_cast<double>(d[0]) * static_cast<double>(d[1]);
      const bool bwd = c.op == DeviceOp::softmax_bwd;
      k.cls = KernelClass::memory;
      k.backward = bwd;
      k.bytes = bytes((bwd ? 3.0 : 2.0) * e);
      k.flops = Flops{(bwd ? 4.0 : 5.0) * e};
      break;
    }
    case DeviceOp::unary_fwd:
    case DeviceOp::unary_bwd:
    case DeviceOp::binary_fwd: {
      const double n = static_cast<double>(d[0]);
      k.cls = KernelClass::memory;
      k.backward = c.op == DeviceOp::unary_bwd;
      k.bytes = bytes(c.op == DeviceOp::unary_fwd ? 2.0 * n : 3.0 * n);
      k.flops = Flops{(c.op == DeviceOp::binary_fwd ? 1.0 : 10.0) * n};
      break;
    }
    case DeviceOp::op_fwd:
    case DeviceOp::op_bwd: break;  // describe_op
    case DeviceOp::copy_d2d:
      k.cls = KernelClass::copy_d2d;
      k.bytes = Bytes{2 * d[0]};  // read + write, as the lowering counts a device copy
      break;
    case DeviceOp::copy_h2d:
    case DeviceOp::copy_d2h:
      k.cls = KernelClass::copy_h2d;
      k.bytes = Bytes{d[0]};
      break;
    case DeviceOp::copy_host:
      k.cls = KernelClass::copy_host;
      k.bytes = Bytes{2 * d[0]};
      break;
    case DeviceOp::collective:
      o.kind = ObsKind::collective;
      o.coll.kind = c.coll;
      o.coll.ranks = static_cast<int>(d[0]);
      o.coll.nodes = 1;
      o.coll.ranks_per_node = static_cast<int>(d[0]);
      o.coll.bytes = Bytes{d[1]};
      o.coll.dtype = std::string(dtype_name(c.dtype));
      break;
  }
  const std::string what = c.op == DeviceOp::collective ? zero::coll_kind_name(c.coll) : device_op_name(c.op);
  k.name = fmt::format("{} {} {}", what, dims_text(c), dtype_name(c.dtype));
  o.label = k.name;
  o.source = "calibrate --device cuda";
  o.tags["source"] = "device";
  o.tags["kind"] = c.op == DeviceOp::collective ? "collective" : kernel_class_name(k.cls);
  o.tags["op"] = what;
  o.tags["dtype"] = std::string(dtype_name(c.dtype));
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return shape.empty() ? std::string("1") : fmt::format("{}", fmt::join(shape, "x"));
}

// What an op of the graph reads and writes, as a key: ops with the same key run the same
// kernels on the same sizes (the twelve layers' LayerNorms are one case). The backward's key
// says which outputs have a gradient there (zero::lowering::gets_grad, as GraphOpRunner binds
// them): GPT-2's fused residual LayerNorms read their sum's gradient, the last one (with ln_f)
// has none; their forwards are one case.
std::string op_signature(const models::OpGraph& g, const zero::lowering::GraphFacts& facts, const models::Op& op,
                         bool backward) {
  std::string key = fmt::format("{}/{}/{}", models::op_kind_name(op.kind), static_cast<int>(op.fn), op.alpha != 0 ? 1 : 0);
  auto tensors = [&](const char* what, const std::vector<models::TensorId>& ts) {
    key += what;
    for (auto t : ts) {
      const auto& ten = g.tensors[static_cast<std::size_t>(t)];
      key += fmt::format("{}:{},", shape_text(ten.shape), dtype_name(ten.dtype));
    }
  };
  tensors("|in ", op.inputs);
  tensors("|out ", op.outputs);
  tensors("|saved ", op.saved);
  key += "|params ";
  for (auto p : op.params) key += shape_text(g.params[static_cast<std::size_t>(p)].shape) + ",";
  if (backward) {
    key += "|out grads ";
    for (auto t : op.outputs) key += zero::lowering::gets_grad(facts, t) ? 'g' : '-';
  }
  return key;
}

// An op of the graph as the executor runs it: a memory-bound kernel of its kind, priced (and
// fitted) as a training run's event of that op is (calibration/train_out.cpp).
void describe_op(DeviceCase& c, const models::OpGraph& g) {
  const models::Op& op = g.ops[static_cast<std::size_t>(c.dims[0])];
  const bool bwd = c.op == DeviceOp::op_bwd;
  Observation& o = c.obs;
  KernelSample& k = o.kernel;
  o.kind = ObsKind::kernel;
  k.cls = KernelClass::memory;
  k.dtype = c.dtype;
  k.op_kind = op.kind;
  k.backward = bwd;
  k.flops = bwd ? op.bwd_flops : op.fwd_flops;
  k.bytes = bwd ? op.bwd_bytes : op.fwd_bytes;
  const auto& y = g.tensors[static_cast<std::size_t>(op.outputs.front())];
  // e.g. "rope_bwd 8x16x1024x64 bf16 (layer0.self_attn.rotary_q)": the first op of its kind
  k.name = fmt::format("{}_{} {} {} ({})", models::op_kind_name(op.kind), bwd ? "bwd" : "fwd", shape_text(y.shape),
                       dtype_name(c.dtype), op.name);
  o.label = k.name;
  o.source = "calibrate --device cuda";
  o.tags["source"] = "device";
  o.tags["kind"] = kernel_class_name(k.cls);
  o.tags["op"] = models::op_kind_name(op.kind);
  o.tags["dtype"] = std::string(dtype_name(c.dtype));
}

// The prior's price of one call (what the simulator would say before calibrating).
double estimate(const DeviceCase& c, const sim::ComputeModel& cm, const sim::CollectiveModel* coll) {
  const KernelSample& k = c.obs.kernel;
  switch (c.op) {
    case DeviceOp::collective: {
      if (coll == nullptr) return 1e-3;
      std::vector<int> ranks;
      for (int r = 0; r < c.dims[0]; ++r) ranks.push_back(r);
      return coll->cost(c.coll, ranks, Bytes{c.dims[1]}).time.v;
    }
    case DeviceOp::copy_d2d:
    case DeviceOp::copy_h2d:
    case DeviceOp::copy_d2h:
    case DeviceOp::copy_host: {
      zero::Event e;
      e.kind = zero::EventKind::copy;
      e.mem_bytes = k.bytes;
      e.src = c.op == DeviceOp::copy_d2d || c.op == DeviceOp::copy_d2h ? zero::Placement::device : zero::Placement::host;
      e.dst = c.op == DeviceOp::copy_d2d || c.op == DeviceOp::copy_h2d ? zero::Placement::device : zero::Placement::host;
      return cm.cost(e).v;
    }
    case DeviceOp::op_fwd:
    case DeviceOp::op_bwd:
      return cm.op_cost(static_cast<models::OpId>(c.dims[0]), c.op == DeviceOp::op_bwd ? zero::Phase::backward : zero::Phase::forward).v;
    default: break;
  }
  if (k.gemms.empty()) return cm.compute_cost(models::kNone, k.backward ? zero::Phase::backward : zero::Phase::forward, k.flops, k.bytes).v;
  // A GEMM: the efficiency curve's time (no op in a graph needed for the estimate).
  const auto& p = cm.profile();
  double t = 0;
  for (const auto& gm : k.gemms) {
    const double f = 2.0 * static_cast<double>(gm.m * gm.n) * static_cast<double>(gm.k * gm.batch) * (k.backward ? 2.0 : 1.0);
    // As the compute model prices a graph's GEMMs: fp32 on the fp32 cores (no alignment
    // preference) unless the profile says TF32.
    const bool fp32_cores = c.dtype == DType::fp32 && !p.fp32_gemm_tf32;
    const std::int64_t align = fp32_cores ? 1 : 16 / static_cast<std::int64_t>(dtype_size(c.dtype));
    t += f / (p.gemm_peak(c.dtype) * sim::gemm_efficiency(p, gm.m * gm.batch, gm.n, gm.k, align, fp32_cores, 0, false));
  }
  return t + p.kernel_launch.v;
}

}  // namespace

const char* device_op_name(DeviceOp op) {
  switch (op) {
    case DeviceOp::gemm: return "gemm";
    case DeviceOp::gemm_bwd: return "gemm_bwd";
    case DeviceOp::sdpa_fwd: return "sdpa_fwd";
    case DeviceOp::sdpa_bwd: return "sdpa_bwd";
    case DeviceOp::layernorm_fwd: return "layernorm_fwd";
    case DeviceOp::layernorm_bwd: return "layernorm_bwd";
    case DeviceOp::softmax_fwd: return "softmax_fwd";
    case DeviceOp::softmax_bwd: return "softmax_bwd";
    case DeviceOp::unary_fwd: return "gelu_fwd";
    case DeviceOp::unary_bwd: return "gelu_bwd";
    case DeviceOp::binary_fwd: return "add_fwd";
    case DeviceOp::op_fwd: return "op_fwd";
    case DeviceOp::op_bwd: return "op_bwd";
    case DeviceOp::copy_d2d: return "copy_d2d";
    case DeviceOp::copy_h2d: return "copy_h2d";
    case DeviceOp::copy_d2h: return "copy_d2h";
    case DeviceOp::copy_host: return "copy_host";
    case DeviceOp::collective: return "collective";
  }
  return "?";
}

BenchPlan plan_device_benchmarks(const models::OpGraph& g, const sim::DeviceProfile& prior, const sim::ClusterSpec& cluster,
                                 int gpus, double budget_s) {
  BenchPlan plan;
  plan.budget_s = budget_s;
  plan.gpus = gpus;
  const DType dt = g.opt.act_dtype;
  sim::ComputeModel cm(prior, g);
  cm.deepspeed = false;  // the cases time zeroplan's own kernels
  const zero::lowering::GraphFacts facts = zero::lowering::analyse(g);
  std::vector<DeviceCase> cases;
  // Weight of a case: the prior's time of the ops it stands for, fwd + bwd, per step.
  std::map<std::string, std::ptrdiff_t> op_case[2];  // per signature its forward [0] and backward [1] case (-1: none)
  std::map<std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>, std::size_t> seen;
  auto add = [&](DeviceOp op, std::array<std::int64_t, 5> dims, double weight) {
    const auto key = std::make_tuple(static_cast<int>(op), dims[0], dims[1], dims[2], dims[3], dims[4]);
    if (auto it = seen.find(key); it != seen.end()) {
      cases[it->second].weight += weight;
      return;
    }
    DeviceCase c;
    c.op = op;
    c.dtype = dt;
    c.dims = dims;
    c.weight = weight;
    describe(c);
    seen.emplace(key, cases.size());
    cases.push_back(std::move(c));
  };
  for (const auto& op : g.ops) {
    const double w = cm.op_cost(op.id, zero::Phase::forward).v + cm.op_cost(op.id, zero::Phase::backward).v;
    if (op.fn == models::Fn::sdpa || op.fn == models::Fn::flash_attention) {
      const auto& gm = op.gemms.front();  // (T, T, D, B·H)
      const std::int64_t T = gm.m, D = gm.k, BH = gm.batch;
      const std::int64_t B = g.opt.micro_batch, H = B > 0 && BH % B == 0 ? BH / B : BH;
      if (D == 16 || D == 32 || D == 64 || D == 128) {
        add(DeviceOp::sdpa_fwd, {B, H, T, D, op.causal ? 1 : 0}, cm.op_cost(op.id, zero::Phase::forward).v);
        add(DeviceOp::sdpa_bwd, {B, H, T, D, op.causal ? 1 : 0}, cm.op_cost(op.id, zero::Phase::backward).v);
      } else {
        plan.notes.push_back(fmt::format("{}: head dim {} has no fused attention kernel (16, 32, 64, 128): not measured",
                                         op.name, D));
      }
      continue;
    }
    if (!op.gemms.empty()) {
      // An op of several products (--fused-mlp's two) weighs each by its share of the op's work.
      auto work = [](const models::Gemm& gm) {
        return static_cast<double>(gm.m) * static_cast<double>(gm.n) * static_cast<double>(gm.k) *
               static_cast<double>(std::max<std::int64_t>(gm.batch, 1));
      };
      double total = 0.0;
      for (const auto& gm : op.gemms) total += work(gm);
      for (const auto& gm : op.gemms) {
        const double share = total > 0.0 ? work(gm) / total : 1.0 / static_cast<double>(op.gemms.size());
        add(DeviceOp::gemm, {gm.m, gm.n, gm.k, gm.batch, 0}, share * cm.op_cost(op.id, zero::Phase::forward).v);
        add(DeviceOp::gemm_bwd, {gm.m, gm.n, gm.k, gm.batch, 0}, share * cm.op_cost(op.id, zero::Phase::backward).v);
      }
      continue;
    }
    if (op.outputs.empty()) continue;
    const auto& y = g.tensors[static_cast<std::size_t>(op.outputs.front())];
    std::int64_t n = 1;
    for (auto s : y.shape) n *= s;
    if (n < 1024) continue;  // position ids, masks: launch-bound, measured below by the smallest sizes
    // A family kernel at the op's size: the common elementwise efficiency (fitted first).
    const std::int64_t cols = y.shape.empty() ? n : y.shape.back();
    const std::int64_t rows = n / std::max<std::int64_t>(cols, 1);
    switch (op.kind) {
      case models::OpKind::layernorm:
      case models::OpKind::rmsnorm:
        add(DeviceOp::layernorm_fwd, {rows, cols, 0, 0, 0}, cm.op_cost(op.id, zero::Phase::forward).v);
        add(DeviceOp::layernorm_bwd, {rows, cols, 0, 0, 0}, cm.op_cost(op.id, zero::Phase::backward).v);
        break;
      case models::OpKind::softmax:
        add(DeviceOp::softmax_fwd, {rows, cols, 0, 0, 0}, cm.op_cost(op.id, zero::Phase::forward).v);
        add(DeviceOp::softmax_bwd, {rows, cols, 0, 0, 0}, cm.op_cost(op.id, zero::Phase::backward).v);
        break;
      case models::OpKind::add:
      case models::OpKind::mul:
        add(DeviceOp::binary_fwd, {n, 0, 0, 0, 0}, w);
        break;
      case models::OpKind::cross_entropy:
      case models::OpKind::embedding:
        continue;  // gathers and the vocabulary-long softmax: priced as bandwidth-bound, their factors fitted from training runs
      default:
        add(DeviceOp::unary_fwd, {n, 0, 0, 0, 0}, cm.op_cost(op.id, zero::Phase::forward).v);
        add(DeviceOp::unary_bwd, {n, 0, 0, 0, 0}, cm.op_cost(op.id, zero::Phase::backward).v);
        break;
    }
    // The op itself, forward and backward, once per signature (the layers' copies add weight).
    // An op with no parameter and no floating input has no gradient to produce: nothing to
    // time in backward (the rotary tables, the masks).
    const bool differentiable = !op.params.empty() || std::any_of(op.inputs.begin(), op.inputs.end(), [&](models::TensorId t) {
      return is_float(g.tensors[static_cast<std::size_t>(t)].dtype);
    });
    const double ow[2] = {cm.op_cost(op.id, zero::Phase::forward).v, cm.op_cost(op.id, zero::Phase::backward).v};
    for (int b = 0; b < 2; ++b) {
      auto [it, fresh] = op_case[b].emplace(op_signature(g, facts, op, b == 1), -1);
      if (!fresh) {
        if (it->second >= 0) cases[static_cast<std::size_t>(it->second)].weight += ow[b];
        continue;
      }
      // A view (no bytes, no FLOPs) launches nothing to time.
      if ((b ? op.bwd_bytes : op.fwd_bytes).v == 0 && (b ? op.bwd_flops : op.fwd_flops).v == 0) continue;
      if (b == 1 && !differentiable) continue;
      DeviceCase c;
      c.op = b ? DeviceOp::op_bwd : DeviceOp::op_fwd;
      c.dtype = dt;
      c.dims = {op.id, 0, 0, 0, 0};
      c.weight = ow[b];
      describe_op(c, g);
      it->second = static_cast<std::ptrdiff_t>(cases.size());
      cases.push_back(std::move(c));
    }
  }
  // The launch floor: elementwise kernels too small to be bandwidth-bound.
  for (std::int64_t n : {std::int64_t{256}, std::int64_t{4096}}) add(DeviceOp::binary_fwd, {n, 0, 0, 0, 0}, 0);
  // Bandwidth curve of the elementwise kernels and copies, 1 MiB .. 1 GiB.
  for (std::int64_t mib : {1, 16, 256, 1024}) {
    add(DeviceOp::binary_fwd, {mib * kMiB / static_cast<std::int64_t>(dtype_size(dt)), 0, 0, 0, 0}, 0);
    add(DeviceOp::copy_d2d, {mib * kMiB, 0, 0, 0, 0}, 0);
  }
  for (std::int64_t mib : {16, 256}) {
    add(DeviceOp::copy_h2d, {mib * kMiB, 0, 0, 0, 0}, 0);
    add(DeviceOp::copy_d2h, {mib * kMiB, 0, 0, 0, 0}, 0);
    add(DeviceOp::copy_host, {mib * kMiB, 0, 0, 0, 0}, 0);
  }
  // GEMMs of small and large dimensions besides the model's, so the efficiency curve's
  // half-dimension is determined (square products, and one not a multiple of 8).
  for (std::int64_t s : {256, 1024, 4096, 8192}) add(DeviceOp::gemm, {s, s, s, 1, 0}, 0);
  add(DeviceOp::gemm, {4096, 4097, 1024, 1, 0}, 0);

  // Collectives over every group size of this process's GPUs, the kinds ZeRO issues.
  std::optional<sim::CollectiveModel> coll;
  if (gpus >= 2) {
    coll.emplace(cluster);
    std::vector<std::int64_t> sizes;
    for (std::int64_t b = 1024; b <= (std::int64_t{1} << 30); b *= 4) sizes.push_back(b);
    for (double rbs : {1e7, 5e7, 2e8, 5e8}) sizes.push_back(static_cast<std::int64_t>(rbs) * 2);  // reduce buckets, 16-bit
    std::sort(sizes.begin(), sizes.end());
    std::vector<int> groups;
    for (int n = 2; n < gpus; n *= 2) groups.push_back(n);
    groups.push_back(gpus);
    for (int n : groups)
      for (auto kind : {zero::CollKind::all_reduce, zero::CollKind::reduce_scatter, zero::CollKind::all_gather})
        for (std::int64_t b : sizes) {
          if (b % (static_cast<std::int64_t>(n) * 2) != 0) continue;
          DeviceCase c;
          c.op = DeviceOp::collective;
          c.dtype = DType::bf16;
          c.coll = kind;
          c.dims = {n, b, 0, 0, 0};
          c.weight = 0;
          describe(c);
          cases.push_back(std::move(c));
        }
  } else {
    plan.notes.push_back("one GPU: no collectives measured (collective factors stay the model's)");
  }
  for (auto& c : cases) {
    c.est_s = std::max(estimate(c, cm, coll ? &*coll : nullptr), 1e-6);
    c.iters = static_cast<int>(std::clamp(kTrialSeconds / c.est_s, 1.0, 1000.0));
  }
  // Most important first: the model's own ops by their share, then the curves' points.
  std::stable_sort(cases.begin(), cases.end(), [](const DeviceCase& a, const DeviceCase& b) { return a.weight > b.weight; });
  auto cost = [](const DeviceCase& c) { return kPerCaseOverhead + (kTrials + 1) * c.iters * c.est_s; };
  double total = 0;
  std::vector<DeviceCase> kept;
  for (auto& c : cases) {
    const double t = cost(c);
    if (total + t > budget_s * 0.8) {  // the prior can be off: leave a fifth of the budget spare
      ++plan.left_out;
      continue;
    }
    total += t;
    kept.push_back(std::move(c));
  }
  plan.cases = std::move(kept);
  plan.planned_s = total;
  plan.graph = std::make_shared<const models::OpGraph>(g);
  if (plan.left_out > 0)
    plan.notes.push_back(fmt::format("{} cases left out to fit the budget of {:.0f} s (--budget)", plan.left_out, budget_s));
  return plan;
}

ProgressBar::ProgressBar(bool terminal, double budget_s)
    : terminal_(terminal),
      budget_s_(budget_s),
      start_(std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count()) {}

std::string ProgressBar::render(double fraction, const std::string& what, double elapsed_s, int width) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(std::lround(fraction * width));
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar += std::string(static_cast<std::size_t>(width - filled), '.');
  std::string eta = "--:--";
  if (fraction > 0.01) {
    const int left = static_cast<int>(std::lround(elapsed_s * (1 - fraction) / fraction));
    eta = fmt::format("{}:{:02d}", left / 60, left % 60);
  }
  return fmt::format("[{}] {:3.0f}%  {}  ETA {}", bar, 100 * fraction, what, eta);
}

void ProgressBar::operator()(double fraction, const std::string& what) {
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const std::string line = render(fraction, what, now - start_);
  if (terminal_) {
    std::fprintf(stderr, "\r%-110s", line.c_str());
    std::fflush(stderr);
    return;
  }
  const int decile = static_cast<int>(fraction * 10);
  if (decile != last_decile_) {
    last_decile_ = decile;
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void ProgressBar::finish() {
  if (terminal_) std::fprintf(stderr, "\n");
  (void)budget_s_;
}

}  // namespace zp::calibration
