#pragma once
// Per-tensor and per-param facts of the op graph that do not depend on the micro-step:
// the lifetimes the forward/backward walk derives, and where each gradient hook fires.
#include <cstdint>
#include <vector>

#include "models/graph.hpp"

namespace zp::zero::lowering {

struct GraphFacts {
  std::vector<models::OpId> last_fwd_use;    // per tensor: last forward op reading or producing it
  std::vector<models::OpId> min_saver;       // per tensor: earliest op saving it (its backward frees it), -1 none
  std::vector<models::OpId> grad_first;      // per tensor: backward op that first produces its gradient
  std::vector<char> requires_grad;           // per tensor
  std::vector<models::OpId> param_first_bwd; // per param: max op reading it: its grad appears there
  std::vector<models::OpId> param_ready;     // per param: min op reading it: its hook fires there
  std::vector<std::vector<models::ParamId>> ready_at_op;  // per op: params whose hook fires at its backward
  std::vector<std::int32_t> layer_of_op;     // per op: its layer, -1 outside layers
  // Per op: a sum of two same-shape tensors whose backward passes its output's gradient on
  // as both inputs' (PyTorch's AddBackward0 returns the tensor it is given, no kernel): the
  // two gradients are that buffer until the last of them is consumed. Only where nothing
  // else writes the first input's gradient before the second's producer has read it.
  std::vector<char> passes_gradient;
};

GraphFacts analyse(const models::OpGraph& g);

// Whether tensor t has a gradient when its producer's backward runs: a later op reads it and it
// requires one (an output nothing reads, as LayerNorm's mean, gets none).
inline bool gets_grad(const GraphFacts& f, models::TensorId t) { return f.grad_first[static_cast<std::size_t>(t)] >= 0; }

}  // namespace zp::zero::lowering
