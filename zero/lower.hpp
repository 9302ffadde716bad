#pragma once
// Lowering: (op graph, ds_config, world size N, rank) → the step program of that rank.
// Every DeepSpeed behaviour that decides a buffer, a bucket flush or a fetch is
// decided here and only here (REFERENCE.md §1).
#include <vector>

#include "core/units.hpp"

#include "models/graph.hpp"
#include "zero/ds_config.hpp"
#include "zero/program.hpp"

namespace zp::zero {

struct LowerOptions {
  int world_size = 1;                // N (data-parallel degree)
  int rank = 0;
  int gpus_per_node = 8;             // for hpZ groups
  bool activation_checkpointing = false;  // per-layer (HF gradient_checkpointing_enable); must be the
                                          // graph's models::GraphOptions::gradient_checkpointing
  // The host thread's work (EventKind::host): PyTorch's dispatch and the Python of the model
  // and of DeepSpeed, which the device waits for when the host falls behind. Off: the
  // program describes the device's work alone (an ideal host).
  bool host_work = true;
  // The caller keeps the model's output object (models::OpGraph::outputs: logits, the KV
  // cache) until the end of the micro-step; by default it drops it after the forward, as
  // HF Trainer does.
  bool keep_output = false;
  // The phases are timed apart: a synchronisation between forward, backward and step, as
  // DeepSpeed's wall_clock_breakdown timers and the reference harness's phase times have.
  // Off: the iteration as training runs it, where only DeepSpeed's own read-backs and its
  // throughput timer synchronise. Only the ZeRO step of stages 1/2 without overlap_comm differs:
  // nothing from the end of the backward to its overflow flag's read-back waits for the device,
  // so its loops run while the device still works through the backward, as far as the launch
  // queue lets the host run ahead (docs/deepspeed_fidelity.md).
  bool phase_syncs = true;
  // Library workspaces PyTorch allocates through its caching allocator once and keeps
  // (sim/devices.json): cuBLAS's, one per (handle, stream) — the forward thread's and the
  // autograd engine's — and cuBLASLt's (the forward's GEMMs with a bias epilogue). 0: none
  // (the CPU). The prologue allocates them; the executor allocates them too.
  Bytes cublas_workspace{0};
  Bytes cublaslt_workspace{0};
  // The middle micro-steps repeat: when micro-step 2 is micro-step 1 moved by one
  // micro-step's worth of ids (else 3 micro-step 2), it stands for the ones after it to
  // GAS-2 (Program::repeat: stored once, whatever GAS is; zero::expand lists every one).
  // Off: lower and store every micro-step one by one (the reference tests compare with).
  bool replicate_micro_steps = true;
  int* copied_micro_steps = nullptr;   // out, when set: how many micro-steps the repeat stands for
};

Program lower(const models::OpGraph& g, const DsConfig& cfg, const Batch& batch, const LowerOptions& opt);

// The rank whose persistent and bucket bytes are largest (stages 1/2 have rank-dependent
// grads_in_partition sizes; stages 0 and 3 are symmetric → 0). Cheap: no lowering.
int heaviest_rank(const models::OpGraph& g, const DsConfig& cfg, int world_size);

// engine.py _do_optimizer_sanity_check: stage 1 + bf16 + fp32 gradient accumulation,
// without CPU offload, runs BF16_Optimizer instead of the ZeRO optimizer (no buckets).
// (`z`: ZeRO settings to use instead of cfg.zero; precision and optimizer come from cfg.)
bool runs_bf16_optimizer(const DsConfig& cfg, const ZeroConfig& z);
inline bool runs_bf16_optimizer(const DsConfig& cfg) { return runs_bf16_optimizer(cfg, cfg.zero); }

// Whether the iteration DeepSpeed runs for cfg differs from its phases timed apart, and so
// whether LowerOptions::phase_syncs changes what lower() makes: the ZeRO optimizer of stages 1/2
// without overlap_comm and without an offloaded optimizer, unless wall_clock_breakdown's timers
// synchronise the phases anyway.
bool phase_syncs_matter(const DsConfig& cfg);

// The gradient buckets lower() allocates for cfg: stages 1/2 with contiguous_gradients,
// reduce_bucket_size elements of the model dtype, two under overlap_comm; stage 3 with
// contiguous_gradients, one in the communication dtype; none otherwise.
struct GradientBuckets {
  int count = 0;
  Bytes each{};
};
GradientBuckets gradient_buckets(const DsConfig& cfg, const ZeroConfig& z);
inline GradientBuckets gradient_buckets(const DsConfig& cfg) { return gradient_buckets(cfg, cfg.zero); }

// Device bytes every program lower() makes of cfg (Ψ = `params`, N ranks) holds at once at
// some point of the step: the persistent 16-bit params, fp32 master and optimizer states
// (unless offloaded), and its gradient buckets, which are live while those are. The
// planner rules candidates out with it before simulating them.
Bytes device_bytes_lower_bound(const DsConfig& cfg, const ZeroConfig& z, std::int64_t params, int world_size);

// Layout facts the lowering uses, exposed for explain and tests.
struct FlatLayout {
  std::int64_t params = 0;           // Ψ
  std::int64_t padded = 0;           // Ψ' = roundup(Ψ, 2N)
  std::int64_t partition = 0;        // Ψ'/N
  std::vector<std::int64_t> offset;  // per param, in the flat buffer
};
FlatLayout flat_layout(const models::OpGraph& g, int world_size);
// Σ numel of the params overlapping rank r's partition (stage 1/2 grads_in_partition).
std::int64_t grads_in_partition_elements(const models::OpGraph& g, const FlatLayout& l, int rank);
// The layout of that buffer: each param's offset in it (whole params that overlap the
// partition, in param order), -1 for the others. The executor indexes it with these.
std::vector<std::int64_t> grads_in_partition_offsets(const models::OpGraph& g, const FlatLayout& l, int rank);
// Stage 3: Σ ceil(numel/N) over params (the padded partition), persistent numel.
std::int64_t stage3_partition_elements(const models::OpGraph& g, int world_size);
// Stage 3: where each param's partition starts in the flat partition (size params + 1; the
// last entry is the total).
std::vector<std::int64_t> stage3_partition_offsets(const models::OpGraph& g, int world_size);

}  // namespace zp::zero
