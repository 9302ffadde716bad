#pragma once
// The planner: searches ZeRO configurations (stage, micro-batch, buckets, overlap,
// stage-3 knobs, checkpointing, offload, hpZ) through the simulator and ranks them.
//
// Every candidate is priced by the same sim::predict that `simulate` uses. The search
// is exact with respect to its grid where it prunes by proof, and says so where it
// prunes by a heuristic:
//   - shapes (stage, micro-batch, checkpointing, offload, hpZ) are pruned when their
//     persistent model states alone exceed the memory limit (proof), or when the
//     memory-frugal setting of their knobs does not fit (heuristic: the knobs' effect
//     on memory is monotone in the grid's direction), and larger micro-batches of a
//     family whose smaller one did not fit are skipped (activations grow with it);
//   - a shape is optimised only while its throughput bound (the compute stream's own
//     work, which no communication knob can shorten) beats the best found (proof);
//   - within a shape the knobs are searched coordinate by coordinate until none moves
//     (heuristic; tests/test_planner.cpp measures the regret against the full grid).
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/graph.hpp"
#include "models/model_config.hpp"
#include "sim/cluster.hpp"
#include "sim/collective_model.hpp"
#include "sim/compute_model.hpp"
#include "sim/device.hpp"
#include "sim/predict.hpp"
#include "zero/ds_config.hpp"

namespace zp::planner {

enum class Objective { throughput, memory, cost };
const char* objective_name(Objective o);

// The searchable dimensions; names are the --search keys (ds_config key names).
enum class Dim {
  stage,
  micro_batch,
  activation_checkpointing,
  offload_optimizer,
  zero_hpz_partition_size,
  reduce_bucket_size,
  allgather_bucket_size,
  overlap_comm,
  contiguous_gradients,
  reduce_scatter,
  use_multi_rank_bucket_allreduce,
  stage3_prefetch_bucket_size,
  stage3_param_persistence_threshold,
  stage3_max_live_parameters,
  stage3_max_reuse_distance,
};
constexpr int kNumDims = 15;
const char* dim_name(Dim d);
// "--search" key → Dim; unknown → InputError listing the allowed keys.
Dim parse_dim(const std::string& key);

// One point of the search space (booleans as 0/1, sizes in elements).
using Knobs = std::array<std::int64_t, kNumDims>;
inline std::int64_t get(const Knobs& k, Dim d) { return k[static_cast<std::size_t>(d)]; }
inline void set(Knobs& k, Dim d, std::int64_t v) { k[static_cast<std::size_t>(d)] = v; }

// Everything fixed for one plan, loaded and validated once.
struct Problem {
  models::ModelConfig model;
  zero::DsConfig base;               // BASE.json or DeepSpeed's defaults
  const sim::DeviceSpec* device = nullptr;
  sim::ClusterSpec cluster;
  std::shared_ptr<const sim::CollectiveModel> collectives;
  sim::DeviceProfile profile;
  int world_size = 1;
  std::int64_t seq_len = 0;
  std::int64_t global_batch = 0;     // train_batch_size
  models::Attention attention = models::kDefaultAttention;
  models::Transformers transformers = models::kDefaultTransformers;
  bool keep_output = false;          // zero::LowerOptions::keep_output
  bool deepspeed = true;             // sim::Target::deepspeed: DeepSpeed runs the plan, or (false) zeroplan's executor
  bool cudnn_attention = false;      // sim::Target::cudnn_attention: the executor's attention is cuDNN's
  bool stages_products = true;       // sim::Target::stages_products: the executor on GPUs
  Objective objective = Objective::throughput;
  double headroom = 0.9;             // fraction of device (and host) memory a plan may use
  double price_per_gpu_hour = 1.0;   // cost objective (currency per GPU-hour)
};

// The values each dimension may take; one value: fixed.
struct Space {
  std::array<std::vector<std::int64_t>, kNumDims> values;
  std::int64_t size() const;         // the full grid (every combination)
};

// The default grid for `searched` dimensions (empty: all); the others keep the base
// config's value. Micro-batches: the divisors of global_batch / N. Bucket sizes: a log
// grid 1e7 … 1e9 plus ceil(Ψ / k) for small k, the sizes that make the bucket count
// integral for this model. Checks the global batch (InputError when no micro-batch and
// GAS make it on N ranks).
Space default_space(const Problem& pb, const std::vector<Dim>& searched);

// The base config's own point (the knobs as BASE.json sets them).
Knobs base_knobs(const Problem& pb);

// Whether dimension `d` can change the step program at this point (stage, offload,
// precision); knobs that cannot are kept at the base value and never searched.
bool relevant(const Problem& pb, const Knobs& k, Dim d);

// The ZeRO settings of a point (the base config's, with the point's knobs).
zero::ZeroConfig zero_of(const Problem& pb, const Knobs& k);
// The DeepSpeed config for a point: the base config with the searched keys replaced.
zero::DsConfig config_of(const Problem& pb, const Knobs& k);

// One evaluated candidate.
struct Evaluation {
  Knobs knobs{};
  zero::Batch batch;
  int rank = 0;                      // the rank simulated (the heaviest)
  Bytes peak_allocated{}, reserved{}, device_used{};
  Bytes host_per_node{};             // host bytes of the node's ranks (offload)
  Bytes device_limit{}, host_limit{};// headroom × capacity
  bool fits = false;
  std::string peak_event;
  double forward_ms = 0, backward_ms = 0, backward_allreduce_ms = 0, step_ms = 0, iteration_ms = 0;
  // The phases (timed apart) add up to iteration_ms + phase_overlap_ms: what of them the iteration
  // overlaps without a synchronisation between them (sim::TimeSummary::iteration).
  double phase_overlap_ms = 0;
  double samples_per_s = 0, tokens_per_s = 0, tflops = 0, mfu = 0;
  double comm_bytes = 0;             // per rank per iteration
  double compute_bound_ms = 0;       // planner::compute_bound_ms of its shape (ranked rows)
  double gpu_hours_per_mtok = 0;     // N / tokens_per_s / 3600 * 1e6
  double cost_per_mtok = 0;          // gpu_hours_per_mtok * price
  bool extrapolated = false;         // GAS > kDirectGas: two short programs, extrapolated
  double margin() const;             // (limit - used) / limit on the device
};

// GAS up to this is simulated as is; above it, at two shorter GAS and extrapolated
// linearly (micro-steps after the first are identical in a step program).
constexpr std::int64_t kDirectGas = 3;

// Graphs per micro-batch and activation checkpointing (transformers turns the KV cache off
// under gradient checkpointing), built once and shared by the threads.
class GraphCache {
 public:
  explicit GraphCache(const Problem& pb) : pb_(pb) {}
  // not thread-safe: call prepare first
  const models::OpGraph& get(std::int64_t micro_batch, bool activation_checkpointing = false);
  void prepare(const std::vector<std::int64_t>& micro_batches);  // both checkpointing settings
  const models::OpGraph* find(std::int64_t micro_batch, bool activation_checkpointing) const;

 private:
  struct Entry {
    std::int64_t micro_batch = 0;
    bool ckpt = false;
    std::unique_ptr<const models::OpGraph> graph;
  };
  const Problem& pb_;
  std::vector<Entry> graphs_;
};

// What the plan's predictions are made for: its device, profile, collectives, world size, kept
// output and runner (Problem::deepspeed), with or without activation checkpointing.
sim::Target target_of(const Problem& pb, bool activation_checkpointing);

// Simulates one point (thread-safe once the cache holds its micro-batch).
Evaluation evaluate(const Problem& pb, const GraphCache& graphs, const Knobs& k);

// A lower bound on iteration_ms for every knob setting of k's shape: the compute
// stream's own ops and optimizer work at full rate (from a lowering at GAS 1).
double compute_bound_ms(const Problem& pb, const GraphCache& graphs, const Knobs& k);

// Device bytes every setting of `k` allocates at once at some point (model states and the
// gradient buckets its knobs size): device_used >= this, so a point above the limit
// cannot fit and is not simulated. Ψ: the model's parameter count.
Bytes candidate_lower_bound(const Problem& pb, std::int64_t psi, const Knobs& k);

// Better under the objective (fitting candidates before non-fitting ones).
bool better(const Problem& pb, const Evaluation& a, const Evaluation& b);

struct SearchStats {
  std::int64_t grid = 0;             // points of the full grid (relevant dimensions only), each
                                     // evaluated by its memory lower bound
  std::int64_t simulated = 0;        // candidates evaluated by full simulation
  std::int64_t shapes = 0;           // (stage, micro-batch, checkpointing, offload, hpZ) combinations
  std::int64_t shapes_pruned_states = 0;   // every point's memory bound (model states, buckets) exceeds the limit
  std::int64_t pruned_memory_bound = 0;    // grid points whose memory lower bound exceeds the limit
  std::int64_t shapes_pruned_memory = 0;   // the memory-frugal setting does not fit
  std::int64_t shapes_pruned_bound = 0;    // throughput bound below the best found
  double seconds = 0;
  int threads = 1;
};

struct PlanResult {
  std::vector<Evaluation> ranked;    // the best candidate of each shape, best first (fitting first)
  std::vector<Evaluation> all;       // every simulated candidate
  SearchStats stats;
  bool any_fits() const { return !ranked.empty() && ranked.front().fits; }
};

// The search (see the top of this file). `threads` <= 0: the hardware's.
PlanResult plan(const Problem& pb, const Space& space, int threads = 0);
// Every point of the grid, simulated: the reference the search is measured against.
// `progress` (optional) is called with (0, points) once the grid is enumerated, before any
// work, then after each simulated point with (done, points), one call at a time.
using Progress = std::function<void(std::int64_t done, std::int64_t total)>;
PlanResult exhaustive(const Problem& pb, const Space& space, int threads = 0, const Progress& progress = {});

// What would make a plan fit when nothing does, each change alone, smallest first.
struct Suggestion {
  std::string change;
  bool fits = false;
  std::optional<Evaluation> best;    // the most frugal fitting candidate under the change
};
std::vector<Suggestion> suggest_when_nothing_fits(const Problem& pb, const Space& space, int threads = 0);

}  // namespace zp::planner
