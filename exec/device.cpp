#include "exec/device.hpp"

#include "exec/numeric.hpp"

namespace zp::exec {

namespace {
std::int64_t numel(const models::OpGraph& g, models::TensorId t) {
  return shape_numel(g.tensors[static_cast<std::size_t>(t)].shape);
}
}  // namespace

bool backward_assigns(const models::OpGraph& g, const models::Op& op, std::size_t i) {
  using models::Fn;
  if (i >= op.inputs.size() || op.outputs.empty()) return false;
  switch (op.fn) {
    // One product (or one elementwise pass) writes the input's gradient: beta 0, or `=`.
    case Fn::linear:
    case Fn::conv1d:
    case Fn::scale:
    case Fn::add_scalar:
    case Fn::dropout:
    case Fn::layernorm:
    case Fn::pow:
    case Fn::rms_rsqrt:
    case Fn::gelu:
    case Fn::gelu_tanh:
    case Fn::relu:
    case Fn::silu:
    case Fn::tanh:
    case Fn::cast:
    case Fn::merge_heads:
    case Fn::softmax:
    case Fn::cross_entropy:
    case Fn::cross_entropy_fused: return i == 0;
    case Fn::mul: return true;
    case Fn::mul_rowscale:
    case Fn::mul_weight: return i == 0;
    // Both operands of a same-shape sum (a residual); a broadcast operand's gradient is a
    // reduction over the batch, kept as it is.
    case Fn::add: return op.inputs.size() == 2 && numel(g, op.inputs[1]) == numel(g, op.outputs[0]);
    // A copy of a whole 4-D tensor; a column block of a wider one is only part of it.
    case Fn::heads_copy: return g.tensors[static_cast<std::size_t>(op.inputs[0])].shape.size() == 4;
    // q, k or v as the (B, T, X·D) columns of a tensor of its own (BERT's projections): the
    // heads' gradient is copied into all of it. Not the (B, X, T, D) heads the fused kernel
    // adds into in place, nor one tensor that is two operands (GPT-2's fused qkv).
    case Fn::sdpa:
    case Fn::flash_attention: {
      const models::HeadsLayout f = models::heads_layout(g, op);
      const models::TensorId t = op.inputs[i];
      const models::HeadsOperand* ops[3] = {&f.q, &f.k, &f.v};
      const models::HeadsOperand* h = nullptr;
      int uses = 0;
      for (int k = 0; k < 3; ++k)
        if (ops[k]->tensor == t) {
          h = ops[k];
          ++uses;
        }
      if (uses != 1) return false;
      const std::int64_t X = h == &f.q ? f.H : f.K;
      const bool columns = h->offset == 0 && h->st == X * f.D && h->sh == f.D && h->sb == f.T * h->st;
      // (With one head and one position the columns are the contiguous heads.)
      return columns && !(X == 1 && f.T == 1) && numel(g, t) == f.B * f.T * X * f.D;
    }
    default: return false;
  }
}

}  // namespace zp::exec
