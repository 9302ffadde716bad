#include "planner/plan.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "core/error.hpp"
#include "sim/predict.hpp"
#include "zero/lower.hpp"

namespace zp::planner {

namespace {

constexpr std::array<const char*, kNumDims> kDimNames = {
    "stage",
    "micro_batch",
    "activation_checkpointing",
    "offload_optimizer",
    "zero_hpz_partition_size",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
    "contiguous_gradients",
    "reduce_scatter",
    "use_multi_rank_bucket_allreduce",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
};

// The dimensions that make a shape: they change the op graph or the program's
// structure, and their compute-stream work. The rest are knobs of a shape.
constexpr std::array<Dim, 5> kShapeDims = {Dim::stage, Dim::micro_batch, Dim::activation_checkpointing,
                                           Dim::offload_optimizer, Dim::zero_hpz_partition_size};
bool is_shape_dim(Dim d) { return std::find(kShapeDims.begin(), kShapeDims.end(), d) != kShapeDims.end(); }

constexpr std::int64_t kUnset = -1;  // overlap_comm absent from the config: DeepSpeed's per-stage default

// Runs f(i) for i in [0, n) on up to `threads` threads; each i exactly once.
template <class F>
void parallel_for(std::size_t n, int threads, F&& f) {
  const std::size_t t = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(1, threads)));
  if (t <= 1) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  std::exception_ptr error;
  std::mutex mu;
  for (std::size_t w = 0; w < t; ++w)
    pool.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < n;) {
        try {
          f(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned h = std::thread::hardware_concurrency();
  return h == 0 ? 1 : static_cast<int>(h);
}

std::vector<std::int64_t> divisors(std::int64_t x) {
  std::vector<std::int64_t> d;
  for (std::int64_t i = 1; i * i <= x; ++i)
    if (x % i == 0) {
      d.push_back(i);
      if (i != x / i) d.push_back(x / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

std::vector<std::int64_t> sorted_unique(std::vector<std::int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// The value of a searched knob that costs the least memory: sizes the smallest
// (buckets, prefetch, live parameters, persistence); booleans false (overlap_comm doubles
// the stage-1/2 IPG buckets, contiguous_gradients keeps them).
std::int64_t frugal_value(const std::vector<std::int64_t>& values) { return values.front(); }

}  // namespace

Bytes candidate_lower_bound(const Problem& pb, std::int64_t psi, const Knobs& k) {
  return zero::device_bytes_lower_bound(pb.base, zero_of(pb, k), psi, pb.world_size) + pb.device->context_overhead;
}

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::throughput: return "throughput";
    case Objective::memory: return "memory";
    case Objective::cost: return "cost";
  }
  return "?";
}

const char* dim_name(Dim d) { return kDimNames[static_cast<std::size_t>(d)]; }

Dim parse_dim(const std::string& key) {
  for (int i = 0; i < kNumDims; ++i)
    if (key == kDimNames[static_cast<std::size_t>(i)]) return static_cast<Dim>(i);
  std::string allowed;
  for (const char* n : kDimNames) allowed += fmt::format("{}{}", allowed.empty() ? "" : ", ", n);
  throw InputError("--search", "", fmt::format("unknown key '{}'; allowed: {}", key, allowed));
}

std::int64_t Space::size() const {
  std::int64_t s = 1;
  for (const auto& v : values) s *= static_cast<std::int64_t>(std::max<std::size_t>(1, v.size()));
  return s;
}

Knobs base_knobs(const Problem& pb) {
  const auto& z = pb.base.zero;
  Knobs k{};
  set(k, Dim::stage, z.stage);
  std::int64_t mb = pb.base.train_micro_batch_size_per_gpu.value_or(1);
  if (mb < 1 || pb.global_batch % (mb * pb.world_size) != 0) mb = 1;
  set(k, Dim::micro_batch, mb);
  set(k, Dim::activation_checkpointing, pb.base.activation_checkpointing_present ? 1 : 0);
  set(k, Dim::offload_optimizer, z.offload_optimizer.device != zero::OffloadDevice::none ? 1 : 0);
  set(k, Dim::zero_hpz_partition_size, z.zero_hpz_partition_size);
  set(k, Dim::reduce_bucket_size, z.reduce_bucket_size);
  set(k, Dim::allgather_bucket_size, z.allgather_bucket_size);
  set(k, Dim::overlap_comm, z.overlap_comm ? (*z.overlap_comm ? 1 : 0) : kUnset);
  set(k, Dim::contiguous_gradients, z.contiguous_gradients ? 1 : 0);
  set(k, Dim::reduce_scatter, z.reduce_scatter ? 1 : 0);
  set(k, Dim::use_multi_rank_bucket_allreduce, z.use_multi_rank_bucket_allreduce ? 1 : 0);
  set(k, Dim::stage3_prefetch_bucket_size, z.stage3_prefetch_bucket_size);
  set(k, Dim::stage3_param_persistence_threshold, z.stage3_param_persistence_threshold);
  set(k, Dim::stage3_max_live_parameters, z.stage3_max_live_parameters);
  set(k, Dim::stage3_max_reuse_distance, z.stage3_max_reuse_distance);
  return k;
}

namespace {
// The BF16_Optimizer test reads only the stage and offload of the point (zero/lower.hpp).
bool runs_bf16(const Problem& pb, const Knobs& k) {
  zero::ZeroConfig z;
  z.stage = static_cast<int>(get(k, Dim::stage));
  z.offload_optimizer.device = get(k, Dim::offload_optimizer) != 0 ? zero::OffloadDevice::cpu : zero::OffloadDevice::none;
  return zero::runs_bf16_optimizer(pb.base, z);
}
}  // namespace

bool relevant(const Problem& pb, const Knobs& k, Dim d) {
  const std::int64_t stage = get(k, Dim::stage);
  switch (d) {
    case Dim::stage:
    case Dim::micro_batch:
    case Dim::activation_checkpointing:
      return true;
    case Dim::offload_optimizer:
      return stage >= 1;
    case Dim::zero_hpz_partition_size:
      return stage == 3 && pb.cluster.nodes > 1;
    case Dim::allgather_bucket_size:
      return false;  // DeepSpeed's post-step all-gather no longer reads it (zero/lower.cpp)
    case Dim::reduce_bucket_size:
    case Dim::overlap_comm:
    case Dim::contiguous_gradients:
    case Dim::reduce_scatter:
      return stage >= 1 && !runs_bf16(pb, k);
    case Dim::use_multi_rank_bucket_allreduce:
      return (stage == 1 || stage == 2) && !runs_bf16(pb, k);
    case Dim::stage3_prefetch_bucket_size:
    case Dim::stage3_param_persistence_threshold:
    case Dim::stage3_max_live_parameters:
    case Dim::stage3_max_reuse_distance:
      return stage == 3;
  }
  return false;
}

Space default_space(const Problem& pb, const std::vector<Dim>& searched) {
  if (pb.global_batch < 1)
    throw InputError("--global-batch", "", fmt::format("must be an integer >= 1, got {}", pb.global_batch));
  if (pb.global_batch % pb.world_size != 0)
    throw InputError("--global-batch", "",
                     fmt::format("{} is not a multiple of the {} ranks: no micro-batch and gradient-accumulation "
                                 "steps give micro x GAS x {} = {}; use a multiple of {}",
                                 pb.global_batch, pb.world_size, pb.world_size, pb.global_batch, pb.world_size));
  const Knobs base = base_knobs(pb);
  const bool all = searched.empty();
  auto is_searched = [&](Dim d) { return all || std::find(searched.begin(), searched.end(), d) != searched.end(); };
  models::GraphOptions go;
  go.micro_batch = 1;
  go.seq_len = pb.seq_len;
  go.act_dtype = pb.base.model_dtype();
  go.attention = pb.attention;
  go.transformers = pb.transformers;
  const std::int64_t psi = models::build_graph(pb.model, go).param_count();

  Space s;
  for (int i = 0; i < kNumDims; ++i) s.values[static_cast<std::size_t>(i)] = {base[static_cast<std::size_t>(i)]};
  auto put = [&](Dim d, std::vector<std::int64_t> v) {
    if (is_searched(d)) s.values[static_cast<std::size_t>(d)] = sorted_unique(std::move(v));
  };
  put(Dim::stage, {0, 1, 2, 3});
  put(Dim::micro_batch, divisors(pb.global_batch / pb.world_size));
  if (!is_searched(Dim::micro_batch) && pb.global_batch % (get(base, Dim::micro_batch) * pb.world_size) != 0)
    throw InputError("--global-batch", "", fmt::format("{} is not a multiple of micro-batch {} x {} ranks",
                                                       pb.global_batch, get(base, Dim::micro_batch), pb.world_size));
  put(Dim::activation_checkpointing, {0, 1});
  put(Dim::offload_optimizer, {0, 1});
  if (pb.cluster.nodes > 1 && pb.cluster.gpus_per_node > 1) put(Dim::zero_hpz_partition_size, {1, pb.cluster.gpus_per_node});
  std::vector<std::int64_t> rbs = {10000000, 20000000, 50000000, 100000000, 200000000, 500000000, 1000000000};
  for (std::int64_t k : {1, 2, 4, 8}) {  // bucket counts that come out integral for this model
    const std::int64_t v = (psi + k - 1) / k;
    if (v >= 10000000 && v <= 1000000000) rbs.push_back(v);
  }
  put(Dim::reduce_bucket_size, rbs);
  put(Dim::overlap_comm, {0, 1});
  put(Dim::contiguous_gradients, {0, 1});
  put(Dim::reduce_scatter, {0, 1});
  put(Dim::use_multi_rank_bucket_allreduce, {0, 1});
  put(Dim::stage3_prefetch_bucket_size, {10000000, 50000000, 100000000, 200000000, 500000000});
  put(Dim::stage3_param_persistence_threshold, {10000, 100000, 1000000});
  put(Dim::stage3_max_live_parameters, {100000000, 300000000, 1000000000, 3000000000});
  put(Dim::stage3_max_reuse_distance, {100000000, 1000000000});
  return s;
}

zero::ZeroConfig zero_of(const Problem& pb, const Knobs& k) {
  const Knobs base = base_knobs(pb);
  zero::ZeroConfig z = pb.base.zero;
  auto changed = [&](Dim d) { return get(k, d) != get(base, d); };
  z.stage = static_cast<int>(get(k, Dim::stage));
  if (changed(Dim::offload_optimizer)) {
    z.offload_optimizer = {};
    if (get(k, Dim::offload_optimizer)) {
      z.offload_optimizer.device = zero::OffloadDevice::cpu;
      z.offload_optimizer.pin_memory = true;
    }
  }
  if (changed(Dim::zero_hpz_partition_size)) z.zero_hpz_partition_size = get(k, Dim::zero_hpz_partition_size);
  if (changed(Dim::reduce_bucket_size)) z.reduce_bucket_size = get(k, Dim::reduce_bucket_size);
  if (changed(Dim::allgather_bucket_size)) z.allgather_bucket_size = get(k, Dim::allgather_bucket_size);
  if (changed(Dim::overlap_comm)) {
    if (get(k, Dim::overlap_comm) == kUnset) z.overlap_comm.reset();
    else z.overlap_comm = get(k, Dim::overlap_comm) != 0;
  }
  if (changed(Dim::contiguous_gradients)) z.contiguous_gradients = get(k, Dim::contiguous_gradients) != 0;
  if (changed(Dim::reduce_scatter)) z.reduce_scatter = get(k, Dim::reduce_scatter) != 0;
  if (changed(Dim::use_multi_rank_bucket_allreduce))
    z.use_multi_rank_bucket_allreduce = get(k, Dim::use_multi_rank_bucket_allreduce) != 0;
  if (changed(Dim::stage3_prefetch_bucket_size)) z.stage3_prefetch_bucket_size = get(k, Dim::stage3_prefetch_bucket_size);
  if (changed(Dim::stage3_param_persistence_threshold))
    z.stage3_param_persistence_threshold = get(k, Dim::stage3_param_persistence_threshold);
  if (changed(Dim::stage3_max_live_parameters)) z.stage3_max_live_parameters = get(k, Dim::stage3_max_live_parameters);
  if (changed(Dim::stage3_max_reuse_distance)) z.stage3_max_reuse_distance = get(k, Dim::stage3_max_reuse_distance);
  return z;
}

zero::DsConfig config_of(const Problem& pb, const Knobs& k) {
  zero::DsConfig c = pb.base;
  c.zero = zero_of(pb, k);
  c.train_batch_size = pb.global_batch;
  c.train_micro_batch_size_per_gpu = get(k, Dim::micro_batch);
  c.gradient_accumulation_steps = pb.global_batch / (get(k, Dim::micro_batch) * pb.world_size);
  if (get(k, Dim::activation_checkpointing) != get(base_knobs(pb), Dim::activation_checkpointing)) {
    // zeroplan reads the section's presence as "the model checkpoints every layer".
    c.activation_checkpointing_present = get(k, Dim::activation_checkpointing) != 0;
    if (!c.activation_checkpointing_present) c.activation_checkpointing = {};
  }
  return c;
}

double Evaluation::margin() const {
  if (device_limit.v <= 0) return 0;
  return static_cast<double>(device_limit.v - device_used.v) / static_cast<double>(device_limit.v);
}

void GraphCache::prepare(const std::vector<std::int64_t>& micro_batches) {
  for (std::int64_t mb : micro_batches) {
    (void)get(mb, false);
    (void)get(mb, true);
  }
}

const models::OpGraph* GraphCache::find(std::int64_t micro_batch, bool activation_checkpointing) const {
  for (const auto& e : graphs_)
    if (e.micro_batch == micro_batch && e.ckpt == activation_checkpointing) return e.graph.get();
  return nullptr;
}

const models::OpGraph& GraphCache::get(std::int64_t micro_batch, bool activation_checkpointing) {
  if (const auto* g = find(micro_batch, activation_checkpointing)) return *g;
  models::GraphOptions go;
  go.micro_batch = micro_batch;
  go.seq_len = pb_.seq_len;
  go.act_dtype = pb_.base.model_dtype();
  go.attention = pb_.attention;
  go.transformers = pb_.transformers;
  go.gradient_checkpointing = activation_checkpointing;
  graphs_.push_back({micro_batch, activation_checkpointing,
                     std::make_unique<const models::OpGraph>(models::build_graph(pb_.model, go))});
  return *graphs_.back().graph;
}

sim::Target target_of(const Problem& pb, bool activation_checkpointing) {
  sim::Target t;
  t.device = pb.device;
  t.profile = &pb.profile;
  t.collectives = pb.collectives.get();
  t.world_size = pb.world_size;
  t.activation_checkpointing = activation_checkpointing;
  t.keep_output = pb.keep_output;
  t.deepspeed = pb.deepspeed;
  t.cudnn_attention = pb.cudnn_attention;
  t.stages_products = pb.stages_products;
  return t;
}

namespace {

struct Point {
  sim::Prediction pred;
};

zero::DsConfig with_gas(const Problem& pb, const zero::DsConfig& cfg, std::int64_t gas) {
  zero::DsConfig c = cfg;
  c.train_batch_size = *cfg.train_micro_batch_size_per_gpu * gas * pb.world_size;
  c.gradient_accumulation_steps = gas;
  return c;
}

Point run_point(const Problem& pb, const models::OpGraph& g, const zero::DsConfig& cfg, std::int64_t gas,
                bool activation_checkpointing, bool free_iteration = true) {
  const zero::DsConfig c = with_gas(pb, cfg, gas);
  Point p;
  p.pred = sim::predict(g, c, zero::Batch{c.train_batch_size.value(), *c.train_micro_batch_size_per_gpu, gas},
                        target_of(pb, activation_checkpointing), true, free_iteration);
  return p;
}

}  // namespace

double compute_bound_ms(const Problem& pb, const GraphCache& graphs, const Knobs& k) {
  const std::int64_t mb = get(k, Dim::micro_batch);
  const bool ckpt = get(k, Dim::activation_checkpointing) != 0;
  const models::OpGraph* g = graphs.find(mb, ckpt);
  if (!g) throw std::logic_error("planner: graph for micro-batch not prepared");
  const zero::DsConfig cfg = with_gas(pb, config_of(pb, k), 1);
  zero::LowerOptions lo;
  lo.world_size = pb.world_size;
  lo.rank = zero::heaviest_rank(*g, cfg, pb.world_size);
  lo.activation_checkpointing = ckpt;
  lo.keep_output = pb.keep_output;
  const zero::Program p = zero::lower(*g, cfg, zero::Batch{cfg.train_batch_size.value(), mb, 1}, lo);
  sim::ComputeModel cm(pb.profile, *g);
  cm.deepspeed = pb.deepspeed;
  cm.cudnn_attention = pb.cudnn_attention;
  cm.stages_products = pb.stages_products;
  // The compute stream runs its events one at a time at best at full rate: its own ops
  // and optimizer work bound the iteration from below whatever the communication knobs.
  // A micro-step's forward, backward and recomputation repeat GAS times; the rest once.
  double once = 0, per_micro = 0;
  for (std::size_t i = static_cast<std::size_t>(std::max<zero::EventId>(p.step_begin, 0)); i < p.events.size(); ++i) {
    const auto& e = p.events[i];
    if (e.stream != zero::Stream::compute) continue;
    if (e.kind != zero::EventKind::compute && e.kind != zero::EventKind::optimizer) continue;
    const double c = cm.cost(e).ms();
    once += c;
    if (e.kind == zero::EventKind::compute &&
        (e.phase == zero::Phase::forward || e.phase == zero::Phase::backward || e.phase == zero::Phase::recompute))
      per_micro += c;
  }
  const std::int64_t gas = pb.global_batch / (mb * pb.world_size);
  return once + static_cast<double>(gas - 1) * per_micro;
}

Evaluation evaluate(const Problem& pb, const GraphCache& graphs, const Knobs& k) {
  const std::int64_t mb = get(k, Dim::micro_batch);
  const bool ckpt = get(k, Dim::activation_checkpointing) != 0;
  const models::OpGraph* g = graphs.find(mb, ckpt);
  if (!g) throw std::logic_error("planner: graph for micro-batch not prepared");
  const zero::DsConfig cfg = config_of(pb, k);
  const std::int64_t gas = pb.global_batch / (mb * pb.world_size);
  Evaluation ev;
  ev.knobs = k;
  ev.batch = {pb.global_batch, mb, gas};

  const std::int64_t g2 = std::min(gas, kDirectGas);
  const Point p2 = run_point(pb, *g, cfg, g2, ckpt);
  const auto& ph2 = p2.pred.time.report.phases;
  double fwd = ph2.forward.ms(), bwd = ph2.backward.ms(), bar = ph2.backward_allreduce.ms(), it = p2.pred.time.iteration.ms();
  double synced = ph2.iteration.ms();
  // What of the phases the iteration overlaps happens once an iteration (the step's loops beside
  // the last backward): taken from the short program, not extrapolated.
  const double overlap = std::max(0.0, synced - it);
  double comm = static_cast<double>(p2.pred.time.report.comm.total.v);
  if (gas > g2) {
    // Micro-steps between the first and the boundary are identical, so every quantity
    // grows by the same amount per added micro-step: extrapolate from GAS g2 - 1 and g2.
    ev.extrapolated = true;
    // Only its phases are read (the overlap is the short program's): no unsynchronised program.
    const Point p1 = run_point(pb, *g, cfg, g2 - 1, ckpt, false);
    const auto& ph1 = p1.pred.time.report.phases;
    const double m = static_cast<double>(gas - g2);
    fwd += m * (fwd - ph1.forward.ms());
    bwd += m * (bwd - ph1.backward.ms());
    bar += m * (bar - ph1.backward_allreduce.ms());
    synced += m * (synced - ph1.iteration.ms());
    it = synced - overlap;
    comm += m * (comm - static_cast<double>(p1.pred.time.report.comm.total.v));
  }
  const auto& mem = p2.pred.memory;
  ev.rank = p2.pred.rank;
  ev.peak_allocated = mem.peak_allocated;
  ev.reserved = mem.reserved_peak;
  ev.device_used = mem.device_used;
  ev.peak_event = mem.peak_event >= 0 ? p2.pred.program.event_name(mem.peak_event) : std::string();
  const std::int64_t ranks_per_node = std::min(pb.world_size, pb.cluster.gpus_per_node);
  ev.host_per_node = Bytes{mem.peak_host.v * ranks_per_node};
  ev.device_limit = Bytes{static_cast<std::int64_t>(std::floor(pb.headroom * static_cast<double>(pb.device->memory.v)))};
  ev.host_limit =
      Bytes{static_cast<std::int64_t>(std::floor(pb.headroom * static_cast<double>(pb.cluster.host_memory_per_node().v)))};
  ev.fits = !mem.allocator_oom && ev.device_used <= ev.device_limit && ev.host_per_node <= ev.host_limit;
  ev.forward_ms = fwd;
  ev.backward_ms = bwd;
  ev.backward_allreduce_ms = bar;
  ev.step_ms = ph2.step.ms();
  ev.iteration_ms = it;
  ev.phase_overlap_ms = overlap;
  ev.comm_bytes = comm;
  if (it > 0) {
    const double s = it / 1e3;
    ev.samples_per_s = static_cast<double>(pb.global_batch) / s;
    ev.tokens_per_s = ev.samples_per_s * static_cast<double>(pb.seq_len);
    // Model FLOPs per GPU: the short program's rate, rescaled to the whole step.
    const double flops2 = p2.pred.time.tflops * p2.pred.time.iteration.v * 1e12;  // over g2 micro-steps
    const double flops = flops2 / static_cast<double>(g2) * static_cast<double>(gas);
    ev.tflops = flops / s / 1e12;
    ev.mfu = p2.pred.time.mfu > 0 ? p2.pred.time.mfu * (ev.tflops / p2.pred.time.tflops) : 0;
    ev.gpu_hours_per_mtok = static_cast<double>(pb.world_size) / ev.tokens_per_s / 3600.0 * 1e6;
    ev.cost_per_mtok = ev.gpu_hours_per_mtok * pb.price_per_gpu_hour;
  }
  return ev;
}

bool better(const Problem& pb, const Evaluation& a, const Evaluation& b) {
  if (a.fits != b.fits) return a.fits;
  if (!a.fits) {
    if (a.device_used != b.device_used) return a.device_used < b.device_used;
    return a.knobs < b.knobs;
  }
  if (pb.objective == Objective::memory) {
    if (a.device_used != b.device_used) return a.device_used < b.device_used;
    if (a.samples_per_s != b.samples_per_s) return a.samples_per_s > b.samples_per_s;
  } else {
    // throughput; cost on a fixed cluster is GPU-hours per token, the same order
    if (a.samples_per_s != b.samples_per_s) return a.samples_per_s > b.samples_per_s;
    if (a.device_used != b.device_used) return a.device_used < b.device_used;
  }
  // Equal predictions (a knob that changed nothing here): the fewer changes to BASE.json.
  const Knobs base = base_knobs(pb);
  int da = 0, db = 0;
  for (std::size_t d = 0; d < base.size(); ++d) {
    da += a.knobs[d] != base[d];
    db += b.knobs[d] != base[d];
  }
  if (da != db) return da < db;
  return a.knobs < b.knobs;
}

namespace {

// The points of the grid, one at a time: every combination of the values of the
// dimensions relevant at the point (the rest stay at the base value), once each.
template <class F>
void for_each_point(const Problem& pb, const Space& space, const Knobs& start, F&& f) {
  Knobs k = start;
  auto rec = [&](auto&& self, int d) -> void {
    if (d == kNumDims) {
      f(k);
      return;
    }
    const Dim dim = static_cast<Dim>(d);
    const auto& vals = space.values[static_cast<std::size_t>(d)];
    if (!relevant(pb, k, dim) || vals.size() <= 1) {
      set(k, dim, relevant(pb, k, dim) ? vals.front() : get(start, dim));
      self(self, d + 1);
      return;
    }
    for (std::int64_t v : vals) {
      set(k, dim, v);
      self(self, d + 1);
    }
  };
  rec(rec, 0);
}

// The same points, stored.
std::vector<Knobs> enumerate(const Problem& pb, const Space& space, const Knobs& start) {
  std::vector<Knobs> out;
  for_each_point(pb, space, start, [&](const Knobs& k) { out.push_back(k); });
  return out;
}

Knobs shape_of(const Knobs& k) {
  Knobs s{};
  for (Dim d : kShapeDims) set(s, d, get(k, d));
  return s;
}

// The point's value in the grid nearest to `v` (log distance), for starting points.
std::int64_t nearest(const std::vector<std::int64_t>& vals, std::int64_t v) {
  std::int64_t best = vals.front();
  double dist = INFINITY;
  for (std::int64_t x : vals) {
    const double d = std::fabs(std::log(static_cast<double>(std::max<std::int64_t>(x, 1))) -
                               std::log(static_cast<double>(std::max<std::int64_t>(v, 1))));
    if (d < dist) dist = d, best = x;
  }
  return best;
}

std::vector<Evaluation> rank_by_shape(const Problem& pb, const std::vector<Evaluation>& all) {
  std::map<Knobs, Evaluation> best;
  for (const auto& e : all) {
    const Knobs s = shape_of(e.knobs);
    auto it = best.find(s);
    if (it == best.end()) best.emplace(s, e);
    else if (better(pb, e, it->second)) it->second = e;
  }
  std::vector<Evaluation> out;
  for (auto& [s, e] : best) out.push_back(std::move(e));
  std::sort(out.begin(), out.end(), [&](const Evaluation& a, const Evaluation& b) { return better(pb, a, b); });
  return out;
}

std::vector<std::int64_t> micro_batches(const Space& space) { return space.values[static_cast<std::size_t>(Dim::micro_batch)]; }

// The bound of the leading rows, for reports (how far each is from its compute stream).
// `known`: the bounds the search already computed, by shape.
void add_bounds(const Problem& pb, const GraphCache& graphs, std::vector<Evaluation>& ranked, int threads,
                const std::map<Knobs, double>& known = {}) {
  const std::size_t n = std::min<std::size_t>(ranked.size(), 16);
  parallel_for(n, threads, [&](std::size_t i) {
    const auto it = known.find(shape_of(ranked[i].knobs));
    ranked[i].compute_bound_ms = it != known.end() ? it->second : compute_bound_ms(pb, graphs, ranked[i].knobs);
  });
}

}  // namespace

PlanResult exhaustive(const Problem& pb, const Space& space, int threads, const Progress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  threads = resolve_threads(threads);
  const auto points = enumerate(pb, space, base_knobs(pb));
  const auto total = static_cast<std::int64_t>(points.size());
  if (progress) progress(0, total);
  GraphCache graphs(pb);
  graphs.prepare(micro_batches(space));
  PlanResult r;
  r.all.resize(points.size());
  std::mutex mu;
  std::int64_t done = 0;
  parallel_for(points.size(), threads, [&](std::size_t i) {
    r.all[i] = evaluate(pb, graphs, points[i]);
    if (!progress) return;
    std::lock_guard<std::mutex> lock(mu);
    progress(++done, total);
  });
  r.ranked = rank_by_shape(pb, r.all);
  add_bounds(pb, graphs, r.ranked, threads);
  r.stats.grid = static_cast<std::int64_t>(points.size());
  r.stats.shapes = static_cast<std::int64_t>(r.ranked.size());
  r.stats.simulated = r.stats.grid;
  r.stats.threads = threads;
  r.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

PlanResult plan(const Problem& pb, const Space& space, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  threads = resolve_threads(threads);
  PlanResult r;
  r.stats.threads = threads;
  GraphCache graphs(pb);
  graphs.prepare(micro_batches(space));
  const std::int64_t psi = graphs.get(micro_batches(space).front()).param_count();
  const Knobs base = base_knobs(pb);

  // The shapes, grouped in families that differ only in micro-batch (ascending).
  std::map<Knobs, std::vector<Knobs>> families;  // key: shape with micro_batch 0
  std::int64_t grid = 0;
  {
    Space shapes_only = space;
    for (int d = 0; d < kNumDims; ++d)
      if (!is_shape_dim(static_cast<Dim>(d))) shapes_only.values[static_cast<std::size_t>(d)] = {base[static_cast<std::size_t>(d)]};
    for (const Knobs& s : enumerate(pb, shapes_only, base)) {
      Knobs fam = shape_of(s);
      set(fam, Dim::micro_batch, 0);
      families[fam].push_back(s);
    }
  }
  // Every point of the grid, evaluated by its memory lower bound (candidate_lower_bound):
  // the points above the limit are never simulated, and a shape with none below it is
  // dropped before its throughput bound is computed.
  const Bytes device_limit{static_cast<std::int64_t>(std::floor(pb.headroom * static_cast<double>(pb.device->memory.v)))};
  std::vector<const Knobs*> all_shapes;
  for (auto& [fam, list] : families)
    for (const Knobs& sh : list) all_shapes.push_back(&sh);
  std::vector<std::int64_t> points(all_shapes.size(), 0), below(all_shapes.size(), 0);
  parallel_for(all_shapes.size(), threads, [&](std::size_t i) {
    Space one = space;
    for (Dim d : kShapeDims) one.values[static_cast<std::size_t>(d)] = {get(*all_shapes[i], d)};
    for_each_point(pb, one, *all_shapes[i], [&](const Knobs& k) {
      ++points[i];
      if (candidate_lower_bound(pb, psi, k) <= device_limit) ++below[i];
    });
  });
  std::set<Knobs> shapes_without_fit;
  for (std::size_t i = 0; i < all_shapes.size(); ++i) {
    grid += points[i];
    r.stats.pruned_memory_bound += points[i] - below[i];
    if (below[i] == 0) shapes_without_fit.insert(*all_shapes[i]);
  }
  r.stats.grid = grid;
  for (auto& [fam, shapes] : families) r.stats.shapes += static_cast<std::int64_t>(shapes.size());

  // The starting knobs of a shape, and its memory-frugal knobs.
  auto project = [&](const Knobs& shape, const Knobs& from) {
    Knobs k = shape;
    for (int d = 0; d < kNumDims; ++d) {
      const Dim dim = static_cast<Dim>(d);
      if (is_shape_dim(dim)) continue;
      const auto& vals = space.values[static_cast<std::size_t>(d)];
      if (!relevant(pb, k, dim)) set(k, dim, get(base, dim));
      else if (vals.size() == 1) set(k, dim, vals.front());
      else set(k, dim, std::find(vals.begin(), vals.end(), get(from, dim)) != vals.end() ? get(from, dim)
                                                                                       : nearest(vals, get(from, dim)));
    }
    return k;
  };
  auto frugal = [&](const Knobs& shape) {
    Knobs k = project(shape, base);
    for (int d = 0; d < kNumDims; ++d) {
      const Dim dim = static_cast<Dim>(d);
      const auto& vals = space.values[static_cast<std::size_t>(d)];
      if (is_shape_dim(dim) || !relevant(pb, k, dim) || vals.size() <= 1) continue;
      set(k, dim, frugal_value(vals));
    }
    return k;
  };

  std::mutex mu;
  std::map<Knobs, Evaluation> cache;
  auto record = [&](const Evaluation& e) {
    std::lock_guard<std::mutex> lock(mu);
    cache.emplace(e.knobs, e);
  };
  auto cached = [&](const Knobs& k) -> const Evaluation* {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(k);
    return it == cache.end() ? nullptr : &it->second;
  };
  // A point above its memory bound is answered without simulation (it cannot fit).
  auto eval = [&](const Knobs& k) {
    if (const Evaluation* e = cached(k)) return *e;
    if (const Bytes lb = candidate_lower_bound(pb, psi, k); lb > device_limit) {
      Evaluation e;
      e.knobs = k;
      e.device_used = lb;
      e.device_limit = device_limit;
      return e;  // fits = false; not recorded: it was never simulated
    }
    Evaluation e = evaluate(pb, graphs, k);
    record(e);
    return e;
  };

  std::vector<Dim> knob_dims;
  for (int d = 0; d < kNumDims; ++d)
    if (!is_shape_dim(static_cast<Dim>(d)) && space.values[static_cast<std::size_t>(d)].size() > 1)
      knob_dims.push_back(static_cast<Dim>(d));

  struct ShapeState {
    Knobs shape{};
    Knobs family{};
    double bound_ms = 0;             // throughput objective: the compute stream's own work
    Evaluation first;                // memory objective: the frugal setting
  };
  std::vector<ShapeState> shapes;
  for (auto& [fam, list] : families) {
    for (const Knobs& sh : list) {
      if (shapes_without_fit.count(sh)) {
        ++r.stats.shapes_pruned_states;
        continue;
      }
      shapes.push_back({sh, fam, 0, {}});
    }
  }
  // One cheap look at every shape: its bound (a lowering at GAS 1, no replay, no
  // engine), or for the memory objective its frugal setting, fully simulated.
  parallel_for(shapes.size(), threads, [&](std::size_t i) {
    if (pb.objective == Objective::memory) shapes[i].first = eval(frugal(shapes[i].shape));
    else shapes[i].bound_ms = compute_bound_ms(pb, graphs, project(shapes[i].shape, base));
  });
  auto key = [&](const ShapeState& s) {
    return pb.objective == Objective::memory ? static_cast<double>(s.first.device_used.v) : s.bound_ms;
  };
  std::stable_sort(shapes.begin(), shapes.end(), [&](const ShapeState& a, const ShapeState& b) {
    if (key(a) != key(b)) return key(a) < key(b);
    return a.shape < b.shape;
  });

  // Shapes in order of promise: stop when the next one's bound cannot beat the best
  // found; skip shapes whose family already failed at a smaller micro-batch.
  std::optional<Evaluation> best;
  std::map<Knobs, std::int64_t> family_fails_at;  // smallest micro-batch that did not fit
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const auto& st = shapes[si];
    const double bound_sps = st.bound_ms > 0 ? static_cast<double>(pb.global_batch) / (st.bound_ms / 1e3) : INFINITY;
    const bool hopeless = pb.objective == Objective::memory
                              ? (best && best->fits && st.first.device_used > best->device_used)
                              : (best && best->fits && bound_sps <= best->samples_per_s);
    if (hopeless) {
      r.stats.shapes_pruned_bound += static_cast<std::int64_t>(shapes.size() - si);
      break;
    }
    const std::int64_t mb = get(st.shape, Dim::micro_batch);
    if (auto it = family_fails_at.find(st.family); it != family_fails_at.end() && it->second <= mb) {
      ++r.stats.shapes_pruned_memory;
      continue;
    }
    // Start from the best knobs found so far (or the base config's) and from the
    // frugal ones, side by side; a shape that does not fit frugally is given up.
    const Knobs start = project(st.shape, best && best->fits ? best->knobs : base);
    const Knobs fr = frugal(st.shape);
    std::vector<Knobs> firsts = {start};
    if (fr != start) firsts.push_back(fr);
    std::vector<Evaluation> fe(firsts.size());
    parallel_for(firsts.size(), threads, [&](std::size_t i) { fe[i] = eval(firsts[i]); });
    Evaluation cur = fe[0];
    for (const auto& e : fe)
      if (better(pb, e, cur)) cur = e;
    if (!cur.fits) {
      auto& f = family_fails_at[st.family];
      f = f == 0 ? mb : std::min(f, mb);
      ++r.stats.shapes_pruned_memory;
      continue;
    }
    for (int round = 0; round < 4; ++round) {
      bool moved = false;
      for (Dim d : knob_dims) {
        if (!relevant(pb, cur.knobs, d)) continue;
        const auto& vals = space.values[static_cast<std::size_t>(d)];
        std::vector<Knobs> cand;
        for (std::int64_t v : vals) {
          Knobs k = cur.knobs;
          set(k, d, v);
          if (k != cur.knobs) cand.push_back(k);
          // overlap_comm moves with the reduce bucket: without it stages 1/2 reduce after the
          // backward, where one large bucket is best, and their step's loops overlap the
          // backward's last work; with it, small buckets hide under the backward. Neither
          // move alone may pay where both together do.
          if (d == Dim::overlap_comm && relevant(pb, k, Dim::reduce_bucket_size))
            for (std::int64_t rb : space.values[static_cast<std::size_t>(Dim::reduce_bucket_size)]) {
              Knobs kr = k;
              set(kr, Dim::reduce_bucket_size, rb);
              if (kr != cur.knobs && kr != k) cand.push_back(kr);
            }
        }
        std::vector<Evaluation> res(cand.size());
        parallel_for(cand.size(), threads, [&](std::size_t i) { res[i] = eval(cand[i]); });
        // A move that does not fit is retried with every other knob at its frugal value:
        // knobs trade memory for speed together (a larger prefetch needs smaller buckets).
        std::vector<Knobs> repair;
        for (std::size_t i = 0; i < cand.size(); ++i)
          if (!res[i].fits) {
            Knobs k = frugal(st.shape);
            set(k, d, get(cand[i], d));
            if (k != cand[i] && k != cur.knobs) repair.push_back(k);
          }
        std::vector<Evaluation> rep(repair.size());
        parallel_for(repair.size(), threads, [&](std::size_t i) { rep[i] = eval(repair[i]); });
        res.insert(res.end(), rep.begin(), rep.end());
        for (const auto& e : res)
          if (better(pb, e, cur)) cur = e, moved = true;
        if (pb.objective != Objective::memory && cur.samples_per_s >= bound_sps * (1 - 1e-9)) break;  // at the bound
      }
      if (!moved) break;
    }
    if (!best || better(pb, cur, *best)) best = cur;
  }

  r.all.reserve(cache.size());
  for (auto& [k, e] : cache) r.all.push_back(e);
  r.stats.simulated = static_cast<std::int64_t>(cache.size());
  r.ranked = rank_by_shape(pb, r.all);
  std::map<Knobs, double> known;
  for (const auto& st : shapes)
    if (st.bound_ms > 0) known.emplace(shape_of(st.shape), st.bound_ms);
  add_bounds(pb, graphs, r.ranked, threads, known);
  r.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<Suggestion> suggest_when_nothing_fits(const Problem& pb, const Space& space, int threads) {
  struct Change {
    std::string what;
    Problem pb;
    Space space;
  };
  std::vector<Change> changes;
  auto has = [&](const Space& s, Dim d, std::int64_t v) {
    const auto& vals = s.values[static_cast<std::size_t>(d)];
    return std::find(vals.begin(), vals.end(), v) != vals.end();
  };
  // Config-only changes first (no hardware, same data), then the data, then hardware.
  if (!has(space, Dim::activation_checkpointing, 1)) {
    Space s = space;
    s.values[static_cast<std::size_t>(Dim::activation_checkpointing)] = {0, 1};
    changes.push_back({"activation checkpointing (per layer)", pb, s});
  }
  if (!has(space, Dim::offload_optimizer, 1)) {
    Space s = space;
    s.values[static_cast<std::size_t>(Dim::offload_optimizer)] = {0, 1};
    changes.push_back({"offload_optimizer to CPU", pb, s});
  }
  if (!has(space, Dim::stage, 3)) {
    Space s = space;
    s.values[static_cast<std::size_t>(Dim::stage)].push_back(3);
    changes.push_back({"ZeRO stage 3", pb, s});
  }
  {
    Space s = space;
    s.values[static_cast<std::size_t>(Dim::activation_checkpointing)] = {0, 1};
    s.values[static_cast<std::size_t>(Dim::offload_optimizer)] = {0, 1};
    s.values[static_cast<std::size_t>(Dim::stage)] = sorted_unique({0, 1, 2, 3});
    for (std::int64_t div : {2, 4, 8}) {
      if (pb.seq_len / div < 1) break;
      Change c{fmt::format("seq-len {} (from {})", pb.seq_len / div, pb.seq_len), pb, s};
      c.pb.seq_len = pb.seq_len / div;
      changes.push_back(std::move(c));
    }
    for (int mult : {2, 4, 8, 16}) {
      Change c{"", pb, s};
      c.pb.cluster.nodes = pb.cluster.nodes * mult;
      c.pb.world_size = pb.world_size * mult;
      if (c.pb.cluster.nodes > 1 && c.pb.cluster.nics_per_node == 0) break;  // no fabric to grow over
      c.pb.collectives = std::make_shared<const sim::CollectiveModel>(c.pb.cluster);
      if (c.pb.global_batch % c.pb.world_size != 0)
        c.pb.global_batch = (c.pb.global_batch + c.pb.world_size - 1) / c.pb.world_size * c.pb.world_size;
      c.what = fmt::format("{} nodes ({} GPUs{})", c.pb.cluster.nodes, c.pb.world_size,
                           c.pb.global_batch != pb.global_batch ? fmt::format(", global batch {}", c.pb.global_batch) : "");
      changes.push_back(std::move(c));
    }
  }
  std::vector<Suggestion> out;
  for (auto& c : changes) {
    Suggestion sg;
    sg.change = c.what;
    // The most frugal point under the change: highest stage, offload and checkpointing
    // where allowed, the smallest micro-batch, the smallest buckets.
    Space s = c.space;
    auto& mbs = s.values[static_cast<std::size_t>(Dim::micro_batch)];
    const std::int64_t per_rank = c.pb.global_batch / c.pb.world_size;
    std::vector<std::int64_t> ok;
    for (std::int64_t mb : mbs)
      if (per_rank % mb == 0) ok.push_back(mb);
    mbs = ok.empty() ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{ok.front()};
    for (Dim d : {Dim::stage, Dim::offload_optimizer, Dim::activation_checkpointing}) {
      auto& v = s.values[static_cast<std::size_t>(d)];
      v = {*std::max_element(v.begin(), v.end())};
    }
    for (int d = 0; d < kNumDims; ++d)
      if (!is_shape_dim(static_cast<Dim>(d))) {
        auto& v = s.values[static_cast<std::size_t>(d)];
        v = {frugal_value(v)};
      }
    GraphCache graphs(c.pb);
    graphs.prepare(mbs);
    const auto pts = enumerate(c.pb, s, base_knobs(c.pb));
    std::vector<Evaluation> evs(pts.size());
    parallel_for(pts.size(), threads, [&](std::size_t i) { evs[i] = evaluate(c.pb, graphs, pts[i]); });
    for (auto& e : evs)
      if (!sg.best || better(c.pb, e, *sg.best)) sg.best = e;
    sg.fits = sg.best && sg.best->fits;
    out.push_back(std::move(sg));
  }
  return out;
}

}  // namespace zp::planner
