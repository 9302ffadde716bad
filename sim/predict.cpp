#include "sim/predict.hpp"

namespace zp::sim {

models::GraphOptions graph_options(const zero::DsConfig& cfg, const zero::Batch& batch, std::int64_t seq_len,
                                   models::Attention attention, models::Transformers transformers, const Target& t) {
  models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = seq_len;
  go.act_dtype = cfg.model_dtype();
  go.attention = attention;
  go.transformers = transformers;
  go.gradient_checkpointing = t.activation_checkpointing;
  return go;
}

zero::LowerOptions lower_options(const models::OpGraph& g, const zero::DsConfig& cfg, const Target& t) {
  zero::LowerOptions lo;
  lo.world_size = t.world_size;
  lo.rank = t.rank ? *t.rank : zero::heaviest_rank(g, cfg, t.world_size);
  lo.activation_checkpointing = t.activation_checkpointing;
  lo.keep_output = t.keep_output;
  if (t.library_workspaces) {
    lo.cublas_workspace = t.device->cublas_workspace;
    lo.cublaslt_workspace = t.device->cublaslt_workspace;
  }
  return lo;
}

std::optional<zero::Program> free_running_program(const models::OpGraph& g, const zero::DsConfig& cfg,
                                                  const zero::Batch& batch, const Target& t) {
  if (!t.deepspeed || !zero::phase_syncs_matter(cfg)) return std::nullopt;
  zero::LowerOptions lo = lower_options(g, cfg, t);
  lo.phase_syncs = false;
  return zero::lower(g, cfg, batch, lo);
}

Prediction predict(const models::OpGraph& g, const zero::DsConfig& cfg, const zero::Batch& batch, const Target& t,
                   bool with_time, bool free_iteration) {
  Prediction r;
  r.batch = batch;
  const zero::LowerOptions lo = lower_options(g, cfg, t);
  r.rank = lo.rank;
  r.program = zero::lower(g, cfg, batch, lo);
  r.memory = replay_memory(r.program, *t.device);
  if (with_time) {
    ComputeModel compute(*t.profile, g);
    compute.deepspeed = t.deepspeed;
    compute.cudnn_attention = t.cudnn_attention;
    compute.stages_products = t.stages_products;
    EngineOptions eo;
    eo.interference = t.profile->comm_compute_interference;
    r.time = simulate_time(r.program, g, compute, *t.collectives, eo);
    if (auto free_running = free_iteration ? free_running_program(g, cfg, batch, t) : std::nullopt) {
      TimeSummary su = simulate_time(*free_running, g, compute, *t.collectives, eo);
      set_iteration(r.time, su.report.phases.iteration, r.program, g, compute);
      r.unsynchronised = Unsynchronised{std::move(*free_running), std::move(su.report)};
    }
  }
  return r;
}

}  // namespace zp::sim
