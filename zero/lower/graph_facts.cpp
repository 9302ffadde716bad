#include "zero/lower/graph_facts.hpp"

#include <algorithm>

namespace zp::zero::lowering {

using models::OpId;
using models::ParamId;
using models::TensorId;

GraphFacts analyse(const models::OpGraph& g) {
  const auto nt = g.tensors.size();
  const auto np = g.params.size();
  GraphFacts f;
  f.last_fwd_use.assign(nt, -1);
  f.min_saver.assign(nt, -1);
  f.grad_first.assign(nt, -1);
  f.requires_grad.assign(nt, 0);
  f.param_first_bwd.assign(np, -1);
  f.param_ready.assign(np, -1);
  f.ready_at_op.assign(g.ops.size(), {});
  f.layer_of_op.assign(g.ops.size(), -1);
  for (const auto& t : g.tensors) {
    const bool floating = t.dtype == DType::fp32 || t.dtype == DType::fp16 || t.dtype == DType::bf16;
    f.requires_grad[static_cast<std::size_t>(t.id)] = floating && t.producer != models::kNone;
  }
  for (const auto& op : g.ops) {
    f.layer_of_op[static_cast<std::size_t>(op.id)] = op.layer;
    for (TensorId t : op.inputs) {
      auto& u = f.last_fwd_use[static_cast<std::size_t>(t)];
      u = std::max(u, op.id);
      if (f.requires_grad[static_cast<std::size_t>(t)]) {
        auto& gf = f.grad_first[static_cast<std::size_t>(t)];
        gf = std::max(gf, op.id);
      }
    }
    for (TensorId t : op.outputs) {
      auto& u = f.last_fwd_use[static_cast<std::size_t>(t)];
      u = std::max(u, op.id);
    }
    for (TensorId t : op.saved) {
      auto& s = f.min_saver[static_cast<std::size_t>(t)];
      if (s < 0 || op.id < s) s = op.id;
    }
    for (ParamId p : op.params) {
      auto& fb = f.param_first_bwd[static_cast<std::size_t>(p)];
      fb = std::max(fb, op.id);
      auto& r = f.param_ready[static_cast<std::size_t>(p)];
      if (r < 0 || op.id < r) r = op.id;
    }
  }
  for (std::size_t p = 0; p < np; ++p)
    if (f.param_ready[p] >= 0) f.ready_at_op[static_cast<std::size_t>(f.param_ready[p])].push_back(static_cast<ParamId>(p));
  return f;
}

}  // namespace zp::zero::lowering
