// The layout facts and bounds zero/lower.hpp exposes: how the flat buffers are cut into
// partitions, which buckets a configuration allocates, and the bytes every program of it
// holds at once.
#include "zero/lower.hpp"
#include "zero/lower/context.hpp"

namespace zp::zero {

using lowering::ceil_div;
using lowering::round_up;
using models::OpGraph;

FlatLayout flat_layout(const OpGraph& g, int world_size) {
  FlatLayout l;
  l.offset.reserve(g.params.size());
  for (const auto& p : g.params) {
    l.offset.push_back(l.params);
    l.params += p.numel;
  }
  l.padded = round_up(l.params, 2LL * world_size);
  l.partition = l.padded / world_size;
  return l;
}

std::vector<std::int64_t> grads_in_partition_offsets(const OpGraph& g, const FlatLayout& l, int rank) {
  const std::int64_t lo = static_cast<std::int64_t>(rank) * l.partition;
  const std::int64_t hi = lo + l.partition;
  std::vector<std::int64_t> off(g.params.size(), -1);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    const std::int64_t a = l.offset[i], z = a + g.params[i].numel;
    if (a < hi && z > lo) {
      off[i] = at;
      at += g.params[i].numel;
    }
  }
  return off;
}

std::int64_t grads_in_partition_elements(const OpGraph& g, const FlatLayout& l, int rank) {
  const auto off = grads_in_partition_offsets(g, l, rank);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < off.size(); ++i)
    if (off[i] >= 0) total += g.params[i].numel;
  return total;
}

std::vector<std::int64_t> stage3_partition_offsets(const OpGraph& g, int world_size) {
  std::vector<std::int64_t> off(g.params.size() + 1, 0);
  for (std::size_t i = 0; i < g.params.size(); ++i) off[i + 1] = off[i] + ceil_div(g.params[i].numel, world_size);
  return off;
}

std::int64_t stage3_partition_elements(const OpGraph& g, int world_size) {
  return stage3_partition_offsets(g, world_size).back();
}

bool runs_bf16_optimizer(const DsConfig& cfg, const ZeroConfig& z) {
  return z.stage == 1 && cfg.precision == Precision::bf16 && cfg.grad_accum_dtype == DType::fp32 &&
         z.offload_optimizer.device == OffloadDevice::none;
}

bool phase_syncs_matter(const DsConfig& cfg) {
  const ZeroConfig& z = cfg.zero;
  return !cfg.wall_clock_breakdown && (z.stage == 1 || z.stage == 2) && !z.overlap() &&
         z.offload_optimizer.device == OffloadDevice::none && !runs_bf16_optimizer(cfg);
}

GradientBuckets gradient_buckets(const DsConfig& cfg, const ZeroConfig& z) {
  if (!z.contiguous_gradients || z.stage == 0 || runs_bf16_optimizer(cfg, z)) return {};
  if (z.stage == 3) return {1, Bytes{z.reduce_bucket_size * dtype_size(cfg.communication_data_type())}};
  // stage_1_and_2.py: hooks are installed (contiguous_gradients), one bucket, two with overlap.
  return {z.overlap() ? 2 : 1, Bytes{z.reduce_bucket_size * dtype_size(cfg.model_dtype())}};
}

Bytes device_bytes_lower_bound(const DsConfig& cfg, const ZeroConfig& z, std::int64_t params, int world_size) {
  const std::int64_t n = world_size;
  std::int64_t bytes = (z.stage == 3 ? ceil_div(params, n) : params) * dtype_size(cfg.model_dtype());
  const bool offload = z.offload_optimizer.device != OffloadDevice::none && z.stage >= 1;
  if (!offload) {
    // Without fp16/bf16, stage 0 runs the plain optimizer on the module's params: no master,
    // states in the params' dtype.
    const bool plain = z.stage == 0 && cfg.precision == Precision::fp32;
    const std::int64_t master = cfg.model_dtype() == DType::fp32 || plain ? 0 : 4;
    const std::int64_t states =
        plain ? cfg.optimizer.state_bytes_per_param() / 4 * dtype_size(cfg.model_dtype()) : cfg.optimizer.state_bytes_per_param();
    bytes += (z.stage == 0 ? params : params / n) * (master + states);
  }
  const GradientBuckets b = gradient_buckets(cfg, z);
  return Bytes{bytes + b.count * b.each.v};
}

int heaviest_rank(const OpGraph& g, const DsConfig& cfg, int world_size) {
  if (cfg.zero.stage != 1 && cfg.zero.stage != 2) return 0;
  const FlatLayout l = flat_layout(g, world_size);
  int best = 0;
  std::int64_t best_n = -1;
  for (int r = 0; r < world_size; ++r) {
    const std::int64_t n = grads_in_partition_elements(g, l, r);
    if (n > best_n) { best_n = n; best = r; }
  }
  return best;
}

}  // namespace zp::zero
