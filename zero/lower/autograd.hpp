#pragma once
// What autograd holds during one micro-step, and the two ways a parameter's gradient lives:
// in param.grad across micro-steps (AccumulateGrad: stage 0 and stage 1, which reduce only
// at the GAS boundary), or as the micro-step's own tensor until a hook takes it (stages 2
// and 3, BF16_Optimizer).
#include <map>
#include <vector>

#include "zero/lower/context.hpp"

namespace zp::zero::lowering {

// The live buffers of one micro-step (-1: none).
struct MicroState {
  std::vector<BufferId> tensor_buf;   // per tensor: its forward value
  std::vector<BufferId> grad_buf;     // per tensor: its gradient
  std::vector<BufferId> param_grad;   // per param: the micro-step's autograd gradient
  // Gradient buffers that stand for several tensors (a sum passing its gradient on): how many
  // of them are not yet consumed; the buffer is freed with the last.
  std::map<BufferId, int> grad_shares;
  // Per tensor: a consumer reading it as heads (a view of one split) has contributed its
  // gradient (Walk::backward_op counts the split's contributions as one).
  std::vector<char> split_grad;
  explicit MicroState(const models::OpGraph& g)
      : tensor_buf(g.tensors.size(), -1), grad_buf(g.tensors.size(), -1), param_grad(g.params.size(), -1),
        split_grad(g.tensors.size(), 0) {}
};

// The micro-step's gradient of param p, written at op o's backward, lives until a hook
// takes it: (numel,) in the model dtype.
inline void own_grad(Context& c, MicroState& st, models::ParamId p) {
  auto& pg = st.param_grad[static_cast<std::size_t>(p)];
  if (pg >= 0) return;
  pg = c.b.buffer(Category::grads, Placement::device, BufferRole::param_grad, c.md, c.numel(p), c.names.param_grad(p), p);
  c.b.alloc(pg);
}

// param.grad kept across micro-steps: allocated by the first backward that writes it; in
// later micro-steps AccumulateGrad adds a fresh gradient into it and drops that.
class AccumulatedGrads {
 public:
  void produced(Context& c, models::ParamId p, models::OpId o) {
    if (grad_.empty()) grad_.assign(c.g.params.size(), -1);
    auto& acc = grad_[static_cast<std::size_t>(p)];
    const std::int64_t n = c.numel(p);
    if (acc < 0) {
      // (numel,) model dtype
      acc = c.b.buffer(Category::grads, Placement::device, BufferRole::param_grad, c.md, n, c.names.param_grad(p), p);
      c.b.alloc(acc);
    } else if (o == c.f.param_first_bwd[static_cast<std::size_t>(p)]) {
      const BufferId tmp = c.b.buffer(Category::temporaries, Placement::device, BufferRole::param_grad, c.md, n,
                                      c.names.param_grad(p), p);
      c.b.alloc(tmp);
      c.b.free(tmp);
    }
  }
  bool live(models::ParamId p) const { return !grad_.empty() && grad_[static_cast<std::size_t>(p)] >= 0; }
  // Hands param.grad over (a reduction takes it); -1 when there is none.
  BufferId take(models::ParamId p) {
    auto& g = grad_[static_cast<std::size_t>(p)];
    const BufferId out = g;
    g = -1;
    return out;
  }
  // zero_grad: every param.grad freed.
  void free_all(Builder& b) {
    for (auto& g : grad_)
      if (g >= 0) {
        b.free(g);
        g = -1;
      }
  }

 private:
  std::vector<BufferId> grad_;  // per param
};

}  // namespace zp::zero::lowering
