#include "exec/device.hpp"

#include <optional>

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
    case Fn::mlp_gelu_tanh:
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
    // The dropped operand's and the residual's, each one pass.
    case Fn::dropout_add_layernorm: return op.inputs.size() == 2 && op.inputs[0] != op.inputs[1];
    case Fn::mul_rowscale:
    case Fn::mul_weight: return i == 0;
    // Both operands of a same-shape sum (a residual); a broadcast operand's gradient is a
    // reduction over the batch, kept as it is.
    case Fn::add: return op.inputs.size() == 2 && numel(g, op.inputs[1]) == numel(g, op.outputs[0]);
    // A copy of a whole 4-D tensor; a column block of a wider one is only part of it.
    case Fn::heads_copy: return g.tensors[static_cast<std::size_t>(op.inputs[0])].shape.size() == 4;
    // q, k or v as all the (B, T, X·D) columns of a tensor of its own (BERT's projections), or
    // as (B, X, T, D) heads of their own (a RoPE output, the KV cache's copy): the kernels
    // write its gradient (the heads' gradient, or its copy or sum over query heads) whole.
    // Not one tensor that is several operands (GPT-2's qkv: backward_assigns_columns).
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
      if (uses != 1 || h->offset != 0) return false;
      const std::int64_t X = h == &f.q ? f.H : f.K;
      if (numel(g, t) != f.B * f.T * X * f.D) return false;
      const bool columns = models::heads_columns(f, *h) && h->st == X * f.D;
      const bool heads = models::heads_contiguous(f, *h, X);
      // (With one head and one position the two layouts are the same memory.)
      return heads || (columns && !(X == 1 && f.T == 1));
    }
    default: return false;
  }
}

namespace {
// Operand h of the fused attention as columns of its tensor: (B, T, W) with its X·D columns
// at `offset` of each row, and its width W; nullopt when it is laid out otherwise.
std::optional<ColumnBlock> operand_columns(const models::OpGraph& g, const models::HeadsLayout& f,
                                           const models::HeadsOperand& h) {
  const auto& shape = g.tensors[static_cast<std::size_t>(h.tensor)].shape;
  if (shape.size() != 3) return std::nullopt;
  const std::int64_t W = shape[2], X = &h == &f.q ? f.H : f.K;
  if (!models::heads_columns(f, h) || h.st != W || h.offset < 0 || h.offset + X * f.D > W) return std::nullopt;
  return ColumnBlock{h.offset, X * f.D, W};
}
}  // namespace

std::vector<ColumnBlock> backward_assigns_columns(const models::OpGraph& g, const models::Op& op, std::size_t i) {
  using models::Fn;
  if (i >= op.inputs.size() || op.outputs.empty() || backward_assigns(g, op, i)) return {};
  const models::TensorId t = op.inputs[i];
  const auto& xs = g.tensors[static_cast<std::size_t>(t)].shape;
  switch (op.fn) {
    case Fn::heads_copy: {  // columns [col, col + X·D) of a (B, T, W) tensor, copied to (B, X, T, D)
      if (xs.size() != 3) return {};
      const auto& ys = g.tensors[static_cast<std::size_t>(op.outputs[0])].shape;
      const ColumnBlock b{op.col[0], ys[1] * ys[3], xs[2]};
      if (b.first < 0 || b.first + b.count > b.width || b.count == b.width) return {};
      return {b};
    }
    case Fn::sdpa:
    case Fn::flash_attention: {
      const models::HeadsLayout f = models::heads_layout(g, op);
      std::vector<ColumnBlock> blocks;
      for (const models::HeadsOperand* h : {&f.q, &f.k, &f.v}) {
        if (h->tensor != t) continue;
        const auto b = operand_columns(g, f, *h);
        if (!b) return {};  // one of its operands is not a column block: nothing claimed
        for (const ColumnBlock& o : blocks)
          if (b->first < o.first + o.count && o.first < b->first + b->count) return {};  // overlapping
        blocks.push_back(*b);
      }
      return blocks;
    }
    default: return {};
  }
}

bool operand_accumulates(Operands& o, const models::HeadsLayout& f, const models::HeadsOperand& h) {
  if (const auto b = operand_columns(o.graph(), f, h); b && b->count < b->width) return o.accumulates(h.tensor, *b);
  return o.accumulates(h.tensor);
}

}  // namespace zp::exec
