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
    f.requires_grad[static_cast<std::size_t>(t.id)] = is_float(t.dtype) && t.producer != models::kNone;
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
  // The residual sums whose backward passes the gradient on (GraphFacts::passes_gradient).
  // Per tensor: how many inputs read it, and its two latest consumers (ops in id order), so the
  // test below takes no pass over the ops per sum.
  std::vector<int> uses(nt, 0);
  std::vector<OpId> last(nt, -1), before_last(nt, -1);
  for (const auto& op : g.ops)
    for (TensorId t : op.inputs) {
      const auto i = static_cast<std::size_t>(t);
      ++uses[i];
      if (last[i] != op.id) {
        before_last[i] = last[i];
        last[i] = op.id;
      }
    }
  for (TensorId t : g.outputs) ++uses[static_cast<std::size_t>(t)];
  f.passes_gradient.assign(g.ops.size(), 0);
  auto T = [&](TensorId t) -> const models::Tensor& { return g.tensors[static_cast<std::size_t>(t)]; };
  for (const auto& op : g.ops) {
    if (op.fn != models::Fn::add || op.inputs.size() != 2 || op.outputs.size() != 1) continue;
    const TensorId y = op.outputs[0];
    if (op.inputs[0] == op.inputs[1] || y == g.loss) continue;
    // One operand (b) consumed by the sum alone; the other's (a's) other consumers add into
    // its gradient only after b's producer has read b's, and b's producer is not one of them
    // (either operand may be a).
    auto passes = [&](TensorId a, TensorId b) {
      const bool same = T(a).shape == T(y).shape && T(b).shape == T(y).shape && T(a).dtype == T(y).dtype &&
                        T(b).dtype == T(y).dtype;
      const auto ia = static_cast<std::size_t>(a), ib = static_cast<std::size_t>(b);
      // The sum is the last consumer of both: its backward makes both gradients first.
      if (!same || !f.requires_grad[ia] || !f.requires_grad[ib] || f.grad_first[ia] != op.id ||
          f.grad_first[ib] != op.id || uses[ib] != 1)
        return false;
      // The sum is a's last consumer, so its other consumers are at most before_last[a].
      return before_last[ia] < T(b).producer;
    };
    f.passes_gradient[static_cast<std::size_t>(op.id)] =
        passes(op.inputs[0], op.inputs[1]) || passes(op.inputs[1], op.inputs[0]) ? 1 : 0;
  }
  return f;
}

}  // namespace zp::zero::lowering
