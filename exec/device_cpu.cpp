#include "exec/device_cpu.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "exec/numeric.hpp"
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/bmm.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/layout.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "kernels/cpu/rng.hpp"
#include "kernels/cpu/sdpa.hpp"

namespace zp::exec {

namespace cpu = zp::kernels::cpu;
using models::Fn;
using models::ParamId;
using models::TensorId;

namespace {
std::size_t U(std::int64_t i) { return static_cast<std::size_t>(i); }

// `rows` rows of `width` elements between a layout with rows `pitch` apart (models::Tensor::
// row_pitch, the fused loss's logits) and a packed one: the CPU kernels take packed rows.
void pack_rows(float* dst, const float* src, std::int64_t rows, std::int64_t width, std::int64_t pitch) {
  for (std::int64_t r = 0; r < rows; ++r) std::copy_n(src + r * pitch, width, dst + r * width);
}
void unpack_rows(float* dst, const float* src, std::int64_t rows, std::int64_t width, std::int64_t pitch) {
  for (std::int64_t r = 0; r < rows; ++r) std::copy_n(src + r * width, width, dst + r * pitch);
}

// v rounded to dt in place: a 16-bit tensor between two kernels of a fused op, as the chain of
// ops it replaces stores it.
void round_to(float* v, std::int64_t n, DType dt) {
  if (dt == DType::bf16)
    for (std::int64_t i = 0; i < n; ++i) v[i] = cpu::bf16_to_float(cpu::float_to_bf16(v[i]));
  else if (dt == DType::fp16)
    for (std::int64_t i = 0; i < n; ++i) v[i] = cpu::fp16_to_float(cpu::float_to_fp16(v[i]));
}

}  // namespace

namespace {
struct Dims {
  std::int64_t B = 0, H = 0, T = 0, D = 0;
};
// y = x W^T (nn.Linear, W (N, K)) or y = x W (GPT-2's Conv1D, W (K, N)).
struct LinearGeometry {
  bool conv = false;
  std::int64_t K = 0, N = 0;
};
LinearGeometry linear_geometry(const models::OpGraph& g, const models::Op& op) {
  const auto& w = g.params[static_cast<std::size_t>(op.params[0])].shape;
  const bool conv = op.fn == Fn::conv1d;
  return {conv, conv ? w[0] : w[1], conv ? w[1] : w[0]};
}
}  // namespace

void CpuDevice::forward(const models::Op& op, Operands& ops) {
  const models::OpGraph& graph = ops.graph();
  auto act = [&](TensorId t) { return ops.act(t); };
  auto ids = [&](TensorId t) { return ops.ids(t); };
  auto param = [&](ParamId p) { return ops.param(p); };
  auto scratch = [&](std::size_t slot, std::int64_t count) { return ops.scratch(slot, count); };
  auto numel = [&](TensorId t) { return shape_numel(graph.tensors[U(t)].shape); };
  auto dropout_seed = [&] { return ops.dropout_seed(); };
  const auto& cfg = graph.cfg;
  const TensorId y = op.outputs.empty() ? -1 : op.outputs[0];
  const std::int64_t n = y >= 0 ? numel(y) : 0;
  auto in = [&](std::size_t i) { return act(op.inputs[i]); };
  auto shape = [&](TensorId t) -> const std::vector<std::int64_t>& { return graph.tensors[U(t)].shape; };
  const float alpha = static_cast<float>(op.alpha);
  switch (op.fn) {
    case Fn::embedding: {
      const std::int64_t C = shape(y).back();
      cpu::embedding_forward(act(y), ids(op.inputs[0]), param(op.params[0]), n / C, C);
      break;
    }
    case Fn::position_embedding: std::copy(param(op.params[0]), param(op.params[0]) + n, act(y)); break;
    case Fn::linear:
    case Fn::conv1d:
    case Fn::linear_first_token: {
      const auto [conv, K, Nn] = linear_geometry(graph, op);
      const float* b = op.params.size() > 1 ? param(op.params[1]) : nullptr;
      const float* x = in(0);
      if (op.fn == Fn::linear_first_token) {
        const auto& xs = shape(op.inputs[0]);
        float* sel = scratch(0, xs[0] * K);
        cpu::select_token_forward(sel, x, xs[0], xs[1], K, 0);
        x = sel;
      }
      const std::int64_t ld = models::row_stride(graph.tensors[U(y)]);  // the fused loss's logits: padded rows
      float* out = ld == Nn ? act(y) : scratch(1, n);
      if (conv) cpu::conv1d_forward(out, x, param(op.params[0]), b, n / Nn, Nn, K);
      else cpu::linear_forward(out, x, param(op.params[0]), b, n / Nn, Nn, K);
      if (ld != Nn) unpack_rows(act(y), out, n / Nn, Nn, ld);
      break;
    }
    case Fn::mlp_gelu_tanh: {  // outputs y, pre, a: the GELU of pre's fp32 sums, a rounded before c_proj reads it
      const auto& w1 = graph.params[U(op.params[0])].shape;  // (C, F)
      const std::int64_t C = w1[0], F = w1[1], M = n / C;
      float* pre = act(op.outputs[1]);
      float* a = act(op.outputs[2]);
      cpu::conv1d_forward(pre, in(0), param(op.params[0]), param(op.params[1]), M, F, C);
      cpu::gelu_tanh_forward(a, pre, M * F);
      round_to(a, M * F, ops.act_ref(op.outputs[2]).dt);
      cpu::conv1d_forward(act(y), a, param(op.params[2]), param(op.params[3]), M, C, F);
      break;
    }
    case Fn::attn_scores:
    case Fn::attn_context: {
      const auto& ys = shape(y);  // (B, H, T, T) or (B, H, T, D)
      Dims d{ys[0], ys[1], ys[2], cfg.head_dim};
      // Operand i as (B, H, T, D): a head view of a (B, T, W) tensor, or a 4-D tensor.
      auto operand = [&](std::size_t i, std::size_t slot) -> const float* {
        const TensorId t = op.inputs[std::min(i, op.inputs.size() - 1)];
        const auto& s = shape(t);
        if (s.size() == 4) return act(t);
        float* o = scratch(slot, d.B * d.H * d.T * d.D);
        cpu::split_heads_forward(o, act(t), d.B, d.T, d.H, d.D, s[2], op.col[i]);
        return o;
      };
      if (op.fn == Fn::attn_scores)
        cpu::bmm_forward(act(y), operand(0, 0), operand(1, 1), d.B * d.H, d.T, d.T, d.D, false, true);
      else
        cpu::bmm_forward(act(y), act(op.inputs[0]), operand(1, 1), d.B * d.H, d.T, d.D, d.T, false, false);
      break;
    }
    case Fn::scale: cpu::scale_forward(act(y), in(0), n, alpha); break;
    case Fn::add_scalar: cpu::add_scalar_forward(act(y), in(0), n, alpha); break;
    case Fn::add: {
      const TensorId b = op.inputs[1];
      if (numel(b) == n) {
        cpu::add_forward(act(y), in(0), in(1), n);
      } else {  // (1, T, C) over (B, T, C)
        const auto& s = shape(y);
        cpu::add_broadcast_forward(act(y), in(0), in(1), {1, s[0], s[1], s[2]}, {1, 1, s[1], s[2]});
      }
      break;
    }
    case Fn::causal_where: {
      const auto& s = shape(y);
      cpu::causal_where_forward(act(y), in(0), s[0] * s[1], s[2]);
      break;
    }
    case Fn::add_mask: {
      const auto& s = shape(y);
      const auto& m = shape(op.inputs[1]);
      cpu::add_broadcast_forward(act(y), in(0), in(1), {s[0], s[1], s[2], s[3]}, {m[0], m[1], m[2], m[3]});
      break;
    }
    case Fn::softmax: {
      const std::int64_t c = shape(y).back();
      cpu::softmax_forward(act(y), in(0), n / c, c);
      break;
    }
    case Fn::dropout:
      cpu::dropout_forward(act(y), reinterpret_cast<std::uint8_t*>(act(op.outputs[1])), in(0), n, alpha,
                           dropout_seed(), static_cast<std::uint64_t>(op.rng_stream) << 32);
      break;
    case Fn::layernorm: {
      const std::int64_t C = shape(y).back();
      cpu::layernorm_forward(act(y), act(op.outputs[1]), act(op.outputs[2]), in(0), param(op.params[0]),
                             op.params.size() > 1 ? param(op.params[1]) : nullptr, n / C, C, alpha);
      break;
    }
    case Fn::dropout_add_layernorm: {  // s = x + dropout(b), y = LayerNorm(s); s rounded before the norm reads it
      const std::int64_t C = shape(y).back();
      const TensorId s = op.outputs[3];
      const DType dt = ops.act_ref(s).dt;
      const float* d = in(0);
      if (op.p > 0.0) {
        float* t = scratch(0, n);
        cpu::dropout_forward(t, reinterpret_cast<std::uint8_t*>(act(op.outputs[4])), in(0), n, static_cast<float>(op.p),
                             dropout_seed(), static_cast<std::uint64_t>(op.rng_stream) << 32);
        round_to(t, n, dt);
        d = t;
      }
      cpu::add_forward(act(s), d, in(1), n);
      round_to(act(s), n, dt);
      cpu::layernorm_forward(act(y), act(op.outputs[1]), act(op.outputs[2]), act(s), param(op.params[0]),
                             op.params.size() > 1 ? param(op.params[1]) : nullptr, n / C, C, alpha);
      break;
    }
    case Fn::pow:
      if (op.alpha == 2.0) cpu::pow2_forward(act(y), in(0), n);
      else cpu::pow3_forward(act(y), in(0), n);
      break;
    case Fn::rms_rsqrt: {
      const std::int64_t C = shape(op.inputs[0]).back();
      cpu::rms_rsqrt_forward(act(y), in(0), n, C, alpha);
      break;
    }
    case Fn::mul: cpu::mul_forward(act(y), in(0), in(1), n); break;
    case Fn::mul_rowscale: {
      const std::int64_t C = shape(y).back();
      cpu::mul_rowscale_forward(act(y), in(0), in(1), n / C, C);
      break;
    }
    case Fn::mul_weight: {
      const std::int64_t C = shape(y).back();
      cpu::mul_weight_forward(act(y), in(0), param(op.params[0]), n / C, C);
      break;
    }
    case Fn::gelu: cpu::gelu_forward(act(y), in(0), n); break;
    case Fn::gelu_tanh: cpu::gelu_tanh_forward(act(y), in(0), n); break;
    case Fn::relu: cpu::relu_forward(act(y), in(0), n); break;
    case Fn::silu: cpu::silu_forward(act(y), in(0), n); break;
    case Fn::tanh: cpu::tanh_forward(act(y), in(0), n); break;
    case Fn::cast: std::copy(in(0), in(0) + n, act(y)); break;
    case Fn::rope_tables: {
      const auto& s = shape(y);  // (1, T, D)
      cpu::rope_tables(act(op.outputs[0]), act(op.outputs[1]), s[1], s[2], alpha);
      break;
    }
    case Fn::rope: {
      const auto& s = shape(y);  // (B, H, T, D) from a (B, T, H*D) projection
      float* x = scratch(0, n);
      cpu::split_heads_forward(x, in(0), s[0], s[2], s[1], s[3], s[1] * s[3], 0);
      cpu::rope_forward(act(y), x, in(1), in(2), s[0], s[1], s[2], s[3]);
      break;
    }
    case Fn::merge_heads: {
      const auto& s = shape(op.inputs[0]);  // (B, H, T, D)
      cpu::merge_heads_forward(act(y), in(0), s[0], s[2], s[1], s[3]);
      break;
    }
    case Fn::repeat_kv: {
      // (B, K, T, D), or a (B, T, K*D) projection read as heads
      const auto& ys = shape(y);
      const auto& s = shape(op.inputs[0]);
      const std::int64_t B = ys[0], T = ys[2], D = ys[3], K = s.size() == 4 ? s[1] : s[2] / D;
      const float* x = in(0);
      if (s.size() == 3) {
        float* h = scratch(0, B * K * T * D);
        cpu::split_heads_forward(h, x, B, T, K, D, s[2], 0);
        x = h;
      }
      cpu::repeat_kv_forward(act(y), x, B, K, ys[1] / K, T, D);
      break;
    }
    case Fn::extended_mask: {
      const auto& s = shape(op.inputs[0]);  // (B, T)
      cpu::padding_mask(act(y), ids(op.inputs[0]), s[0], s[1]);
      break;
    }
    case Fn::causal_mask: cpu::causal_mask(act(y), shape(y)[2]); break;
    case Fn::cross_entropy: {
      const std::int64_t V = shape(op.outputs[0]).back();
      const std::int64_t rows = numel(op.inputs[0]) / V;
      cpu::log_softmax_forward(act(op.outputs[0]), in(0), rows, V);
      act(op.outputs[1])[0] = cpu::nll_loss_forward(act(op.outputs[0]), ids(op.inputs[1]), rows, V);
      break;
    }
    case Fn::cross_entropy_fused: {  // outputs: the rows' logsumexp, the mean loss
      const std::int64_t V = shape(op.inputs[0]).back();
      const std::int64_t rows = numel(op.inputs[0]) / V;
      const std::int64_t ld = models::row_stride(graph.tensors[U(op.inputs[0])]);
      const float* logits = in(0);
      if (ld != V) {
        float* packed = scratch(0, rows * V);
        pack_rows(packed, logits, rows, V, ld);
        logits = packed;
      }
      act(op.outputs[1])[0] = cpu::cross_entropy_forward(act(op.outputs[0]), logits, ids(op.inputs[1]), rows, V);
      break;
    }
    case Fn::sdpa:
    case Fn::flash_attention: {
      // transformers' sdpa and flash_attention_2 (models::heads_layout): strided heads, k and
      // v with K heads, the output written in (B, T, H, D) order.
      const models::HeadsLayout f = models::heads_layout(graph, op);
      auto base = [&](const models::HeadsOperand& h) { return act(h.tensor) + h.offset; };
      auto st = [](const models::HeadsOperand& h) { return cpu::HeadStrides{h.sb, h.sh, h.st}; };
      // rng_state as the kernels keep it: the dropout stream's seed and offset.
      auto* rng = reinterpret_cast<std::int64_t*>(act(f.rng));
      rng[0] = static_cast<std::int64_t>(dropout_seed());
      rng[1] = static_cast<std::int64_t>(static_cast<std::uint64_t>(op.rng_stream) << 32);
      cpu::attention_forward(base(f.o), st(f.o), act(f.lse), base(f.q), st(f.q), base(f.k), st(f.k), base(f.v),
                             st(f.v), nullptr, f.B, f.H, f.K, f.T, f.D, f.causal,
                             static_cast<float>(1.0 / std::sqrt(static_cast<double>(f.D))), alpha,
                             static_cast<std::uint64_t>(rng[0]), static_cast<std::uint64_t>(rng[1]));
      break;
    }
    case Fn::heads_copy: {
      // (B, X, T, D) from a 4-D tensor (a copy) or from columns [col, col + X·D) of a (B, T, W) one
      const auto& ys = shape(y);
      const auto& xs = shape(op.inputs[0]);
      if (xs.size() == 4) std::copy(in(0), in(0) + n, act(y));
      else cpu::split_heads_forward(act(y), in(0), ys[0], ys[2], ys[1], ys[3], xs[2], op.col[0]);
      break;
    }
    case Fn::none: throw std::logic_error(fmt::format("op {} cannot be executed", op.name));
  }
}

void CpuDevice::backward(const models::Op& op, Operands& ops) {
  const models::OpGraph& graph = ops.graph();
  auto act = [&](TensorId t) { return ops.act(t); };
  auto grad = [&](TensorId t) { return ops.grad(t); };
  auto ids = [&](TensorId t) { return ops.ids(t); };
  auto param = [&](ParamId p) { return ops.param(p); };
  auto param_grad = [&](ParamId p) { return ops.param_grad(p); };
  auto scratch = [&](std::size_t slot, std::int64_t count) { return ops.scratch(slot, count); };
  auto numel = [&](TensorId t) { return shape_numel(graph.tensors[U(t)].shape); };
  const auto& cfg = graph.cfg;
  const TensorId y = op.outputs.empty() ? -1 : op.outputs[0];
  const std::int64_t n = y >= 0 ? numel(y) : 0;
  auto shape = [&](TensorId t) -> const std::vector<std::int64_t>& { return graph.tensors[U(t)].shape; };
  // The gradient flowing into this op: d(loss)/d(loss) = 1/GAS (DeepSpeed scales the loss).
  const float loss_grad = ops.loss_grad();
  const bool loss_op = op.fn == Fn::cross_entropy || op.fn == Fn::cross_entropy_fused;
  const TensorId out_main = loss_op ? op.outputs[1] : y;
  const float* dy = nullptr;
  if (out_main == graph.loss) dy = &loss_grad;
  else if (out_main >= 0) dy = grad(out_main);
  if (!dy) return;  // nothing flows back through this op
  auto dx = [&](std::size_t i) { return i < op.inputs.size() ? grad(op.inputs[i]) : nullptr; };
  // Whether input i's gradient is added into (else written whole: backward_assigns), asked
  // before its first dx(i).
  auto acc = [&](std::size_t i) { return ops.accumulates(op.inputs[i]); };
  auto x = [&](std::size_t i) { return act(op.inputs[i]); };
  auto pg = [&](std::size_t i) { return param_grad(op.params[i]); };
  const float alpha = static_cast<float>(op.alpha);
  switch (op.fn) {
    case Fn::embedding: {
      const std::int64_t C = shape(y).back();
      const std::int64_t V = graph.params[U(op.params[0])].shape[0];
      cpu::embedding_backward(pg(0), ids(op.inputs[0]), dy, n / C, V, C, -1, true);
      break;
    }
    case Fn::position_embedding: cpu::copy_accumulate(pg(0), dy, n, true); break;
    case Fn::linear:
    case Fn::conv1d:
    case Fn::linear_first_token: {
      const auto [conv, K, Nn] = linear_geometry(graph, op);
      const bool ax = op.fn == Fn::linear_first_token || acc(0);
      float* db = op.params.size() > 1 ? pg(1) : nullptr;
      const float* xin = x(0);
      float* dxin = dx(0);
      float* dsel = nullptr;
      std::int64_t B = 0, T = 0;
      if (op.fn == Fn::linear_first_token) {
        const auto& xs = shape(op.inputs[0]);
        B = xs[0];
        T = xs[1];
        float* sel = scratch(0, B * K);
        cpu::select_token_forward(sel, xin, B, T, K, 0);
        xin = sel;
        if (dxin) dsel = scratch(1, B * K);
      }
      float* dtarget = op.fn == Fn::linear_first_token ? dsel : dxin;
      // dy with the padded rows of y (the fused loss's logits) packed first.
      if (const std::int64_t ld = models::row_stride(graph.tensors[U(y)]); ld != Nn) {
        float* packed = scratch(2, n);
        pack_rows(packed, dy, n / Nn, Nn, ld);
        dy = packed;
      }
      // The input's gradient, then the params' (they always add: GAS accumulates there).
      auto gemms = [&](float* d, float* gw, float* gb, bool accumulate) {
        if (conv) cpu::conv1d_backward(d, gw, gb, dy, xin, param(op.params[0]), n / Nn, Nn, K, accumulate);
        else cpu::linear_backward(d, gw, gb, dy, xin, param(op.params[0]), n / Nn, Nn, K, accumulate);
      };
      if (dtarget) gemms(dtarget, nullptr, nullptr, ax);
      gemms(nullptr, pg(0), db, true);
      if (dsel) cpu::select_token_backward(dxin, dsel, B, T, K, 0, true);
      break;
    }
    case Fn::attn_scores:
    case Fn::attn_context: {
      const auto& ys = shape(y);
      Dims d{ys[0], ys[1], ys[2], cfg.head_dim};
      const std::int64_t hv = d.B * d.H * d.T * d.D;
      // Operand i as (B, H, T, D) and where its gradient goes.
      auto operand = [&](std::size_t i, std::size_t slot) -> const float* {
        const TensorId t = op.inputs[std::min(i, op.inputs.size() - 1)];
        const auto& s = shape(t);
        if (s.size() == 4) return act(t);
        float* o = scratch(slot, hv);
        cpu::split_heads_forward(o, act(t), d.B, d.T, d.H, d.D, s[2], op.col[i]);
        return o;
      };
      auto give_back = [&](std::size_t i, const float* g) {
        const TensorId t = op.inputs[std::min(i, op.inputs.size() - 1)];
        float* dt = grad(t);
        if (!dt) return;
        const auto& s = shape(t);
        if (s.size() == 4) cpu::copy_accumulate(dt, g, numel(t), true);
        else cpu::split_heads_backward(dt, g, d.B, d.T, d.H, d.D, s[2], op.col[i], true);
      };
      if (op.fn == Fn::attn_scores) {
        const float* q = operand(0, 0);
        const float* k = operand(1, 1);
        float* dq = scratch(2, hv);
        float* dk = scratch(3, hv);
        cpu::bmm_backward(dq, dk, dy, q, k, d.B * d.H, d.T, d.T, d.D, false, true, false);
        give_back(0, dq);
        give_back(1, dk);
      } else {
        const float* pr = act(op.inputs[0]);
        const float* v = operand(1, 1);
        const std::int64_t np = numel(op.inputs[0]);
        float* dp = scratch(2, np);
        float* dv = scratch(3, hv);
        cpu::bmm_backward(dp, dv, dy, pr, v, d.B * d.H, d.T, d.D, d.T, false, false, false);
        if (float* g = grad(op.inputs[0])) cpu::copy_accumulate(g, dp, np, true);
        give_back(1, dv);
      }
      break;
    }
    case Fn::scale: {
      const bool a = acc(0);
      if (float* d = dx(0)) cpu::scale_backward(d, dy, n, alpha, a);
      break;
    }
    case Fn::add_scalar: {
      const bool a = acc(0);
      if (float* d = dx(0)) cpu::add_scalar_backward(d, dy, n, a);
      break;
    }
    case Fn::add: {
      if (op.inputs.size() > 1 && numel(op.inputs[1]) != n) {
        const auto& s = shape(y);
        cpu::add_broadcast_backward(dx(0), dx(1), dy, {1, s[0], s[1], s[2]}, {1, 1, s[1], s[2]}, true);
      } else {
        const bool a0 = acc(0), a1 = op.inputs.size() > 1 ? acc(1) : a0;
        cpu::add_backward(dx(0), nullptr, dy, n, a0);
        if (op.inputs.size() > 1) cpu::add_backward(nullptr, dx(1), dy, n, a1);
      }
      break;
    }
    case Fn::causal_where: {
      const auto& s = shape(y);
      if (dx(0)) cpu::causal_where_backward(dx(0), dy, s[0] * s[1], s[2], true);
      break;
    }
    case Fn::add_mask: {
      const auto& s = shape(y);
      const auto& m = shape(op.inputs[1]);
      cpu::add_broadcast_backward(dx(0), nullptr, dy, {s[0], s[1], s[2], s[3]}, {m[0], m[1], m[2], m[3]}, true);
      break;
    }
    case Fn::softmax: {
      // Through the program's temporary (op.bwd_scratch), as the CUDA kernel does.
      const std::int64_t c = shape(y).back();
      if (op.bwd_scratch.empty())
        throw std::logic_error(fmt::format("op {}: no temporary for its backward", op.name));
      const bool a = acc(0);
      if (float* d = dx(0)) cpu::softmax_backward(d, act(y), dy, act(op.bwd_scratch[0]), n / c, c, a);
      break;
    }
    case Fn::dropout: {
      const bool a = acc(0);
      if (float* d = dx(0))
        cpu::dropout_backward(d, reinterpret_cast<const std::uint8_t*>(act(op.outputs[1])), dy, n, alpha, a);
      break;
    }
    case Fn::layernorm: {
      const std::int64_t C = shape(y).back();
      const bool a = acc(0);
      const float* mean = act(op.outputs[1]);
      const float* rstd = act(op.outputs[2]);
      cpu::layernorm_backward(dx(0), pg(0), op.params.size() > 1 ? pg(1) : nullptr, dy, x(0), mean, rstd,
                              param(op.params[0]), n / C, C, a, true);
      break;
    }
    case Fn::mlp_gelu_tanh: {
      // c_proj's input gradient rounded to the activation dtype (as cuBLASLt's derivative
      // epilogue rounds the product in 16 bits, and the chain stores it), times the GELU's
      // derivative at the saved pre-activation, rounded: the pre-activation's gradient, which
      // c_fc's products read.
      const auto& w1 = graph.params[U(op.params[0])].shape;  // (C, F)
      const std::int64_t C = w1[0], F = w1[1], M = n / C;
      const bool ax = acc(0);
      const float* a = act(op.outputs[2]);
      float* da = scratch(0, M * F);
      float* dpre = scratch(1, M * F);
      cpu::conv1d_backward(da, nullptr, nullptr, dy, a, param(op.params[2]), M, C, F, false);
      cpu::conv1d_backward(nullptr, pg(2), pg(3), dy, a, param(op.params[2]), M, C, F, true);
      round_to(da, M * F, ops.act_ref(op.outputs[1]).dt);
      cpu::gelu_tanh_backward(dpre, act(op.outputs[1]), da, M * F, false);
      round_to(dpre, M * F, ops.act_ref(op.outputs[1]).dt);
      if (float* d = dx(0)) cpu::conv1d_backward(d, nullptr, nullptr, dpre, x(0), param(op.params[0]), M, F, C, ax);
      cpu::conv1d_backward(nullptr, pg(0), pg(1), dpre, x(0), param(op.params[0]), M, F, C, true);
      break;
    }
    case Fn::dropout_add_layernorm: {
      // t = the sum's gradient: LayerNorm's input gradient, plus what a later reader of the sum
      // gave it, rounded once; the residual's gradient is t, the dropped operand's t·mask/(1-p).
      const std::int64_t C = shape(y).back();
      const TensorId s = op.outputs[3];
      const bool ab = acc(0), ax = acc(1);
      float* t = scratch(0, n);
      const float* ds = grad(s);
      if (ds) std::copy_n(ds, n, t);
      cpu::layernorm_backward(t, pg(0), op.params.size() > 1 ? pg(1) : nullptr, dy, act(s), act(op.outputs[1]),
                              act(op.outputs[2]), param(op.params[0]), n / C, C, ds != nullptr, true);
      round_to(t, n, ops.act_ref(s).dt);
      if (float* d = dx(1)) cpu::copy_accumulate(d, t, n, ax);
      if (float* d = dx(0)) {
        if (op.p > 0.0)
          cpu::dropout_backward(d, reinterpret_cast<const std::uint8_t*>(act(op.outputs[4])), t, n,
                                static_cast<float>(op.p), ab);
        else
          cpu::copy_accumulate(d, t, n, ab);
      }
      break;
    }
    case Fn::pow: {
      const bool a = acc(0);
      float* d = dx(0);
      if (!d) break;
      if (op.alpha == 2.0) cpu::pow2_backward(d, x(0), dy, n, a);
      else cpu::pow3_backward(d, x(0), dy, n, a);
      break;
    }
    case Fn::rms_rsqrt: {
      const std::int64_t C = shape(op.inputs[0]).back();
      const bool a = acc(0);
      if (float* d = dx(0)) cpu::rms_rsqrt_backward(d, dy, act(y), n, C, a);
      break;
    }
    case Fn::mul: {
      const bool a0 = acc(0), a1 = acc(1);
      if (a0 == a1) {  // one pass (a fresh operand and one added into: two)
        cpu::mul_backward(dx(0), dx(1), dy, x(0), x(1), n, a0);
      } else {
        cpu::mul_backward(dx(0), nullptr, dy, x(0), x(1), n, a0);
        cpu::mul_backward(nullptr, dx(1), dy, x(0), x(1), n, a1);
      }
      break;
    }
    case Fn::mul_rowscale: {
      const std::int64_t C = shape(y).back();
      const bool a = acc(0);
      cpu::mul_rowscale_backward(dx(0), dx(1), dy, x(0), x(1), n / C, C, a, true);
      break;
    }
    case Fn::mul_weight: {
      const std::int64_t C = shape(y).back();
      const bool a = acc(0);
      cpu::mul_weight_backward(dx(0), pg(0), dy, x(0), param(op.params[0]), n / C, C, a, true);
      break;
    }
    case Fn::gelu: { const bool a = acc(0); if (float* d = dx(0)) cpu::gelu_backward(d, x(0), dy, n, a); break; }
    case Fn::gelu_tanh: { const bool a = acc(0); if (float* d = dx(0)) cpu::gelu_tanh_backward(d, x(0), dy, n, a); break; }
    case Fn::silu: { const bool a = acc(0); if (float* d = dx(0)) cpu::silu_backward(d, x(0), dy, n, a); break; }
    case Fn::relu: { const bool a = acc(0); if (float* d = dx(0)) cpu::relu_backward(d, act(y), dy, n, a); break; }
    case Fn::tanh: { const bool a = acc(0); if (float* d = dx(0)) cpu::tanh_backward(d, act(y), dy, n, a); break; }
    case Fn::cast: { const bool a = acc(0); if (float* d = dx(0)) cpu::copy_accumulate(d, dy, n, a); break; }
    case Fn::rope: {
      const auto& s = shape(y);
      if (!dx(0)) break;
      float* dxh = scratch(0, n);
      cpu::rope_backward(dxh, dy, x(1), x(2), s[0], s[1], s[2], s[3], false);
      cpu::split_heads_backward(dx(0), dxh, s[0], s[2], s[1], s[3], s[1] * s[3], 0, true);
      break;
    }
    case Fn::merge_heads: {
      const auto& s = shape(op.inputs[0]);
      const bool a = acc(0);
      if (float* d = dx(0)) cpu::merge_heads_backward(d, dy, s[0], s[2], s[1], s[3], a);
      break;
    }
    case Fn::repeat_kv: {
      if (!dx(0)) break;
      const auto& ys = shape(y);
      const auto& s = shape(op.inputs[0]);
      const std::int64_t B = ys[0], T = ys[2], D = ys[3], K = s.size() == 4 ? s[1] : s[2] / D;
      if (s.size() == 4) {
        cpu::repeat_kv_backward(dx(0), dy, B, K, ys[1] / K, T, D, true);
      } else {
        float* h = scratch(0, B * K * T * D);
        cpu::repeat_kv_backward(h, dy, B, K, ys[1] / K, T, D, false);
        cpu::split_heads_backward(dx(0), h, B, T, K, D, s[2], 0, true);
      }
      break;
    }
    case Fn::cross_entropy: {
      // As autograd runs it: nll_loss's backward writes the gradient of logp (the buffer the
      // program gives it, op.bwd_grads), log_softmax's reads it and writes the logits'.
      const std::int64_t V = shape(op.outputs[0]).back();
      const std::int64_t rows = numel(op.inputs[0]) / V;
      const bool a = acc(0);
      float* glogp = grad(op.outputs[0]);
      if (!glogp) throw std::logic_error(fmt::format("op {}: no buffer for the gradient of its log-probabilities", op.name));
      cpu::nll_loss_backward(glogp, ids(op.inputs[1]), rows, V, dy[0]);
      if (float* d = dx(0)) cpu::log_softmax_backward(d, act(op.outputs[0]), glogp, rows, V, a);
      break;
    }
    case Fn::cross_entropy_fused: {  // from the saved logits and logsumexp, straight into the logits' gradient
      const std::int64_t V = shape(op.inputs[0]).back();
      const std::int64_t rows = numel(op.inputs[0]) / V;
      const bool a = acc(0);
      float* d = dx(0);
      if (!d) break;
      const std::int64_t ld = models::row_stride(graph.tensors[U(op.inputs[0])]);
      if (ld == V) {
        cpu::cross_entropy_backward(d, x(0), act(op.outputs[0]), ids(op.inputs[1]), rows, V, dy[0], a);
        break;
      }
      // Padded rows: the logits and the gradient packed, the gradient's rows put back.
      float* logits = scratch(0, rows * V);
      float* packed = scratch(1, rows * V);
      pack_rows(logits, x(0), rows, V, ld);
      if (a) pack_rows(packed, d, rows, V, ld);
      cpu::cross_entropy_backward(packed, logits, act(op.outputs[0]), ids(op.inputs[1]), rows, V, dy[0], a);
      unpack_rows(d, packed, rows, V, ld);
      break;
    }
    case Fn::rope_tables:
    case Fn::extended_mask:
    case Fn::causal_mask: break;  // no gradient
    case Fn::sdpa:
    case Fn::flash_attention: {
      const models::HeadsLayout f = models::heads_layout(graph, op);
      auto base = [&](const models::HeadsOperand& h) { return act(h.tensor) + h.offset; };
      auto st = [](const models::HeadsOperand& h) { return cpu::HeadStrides{h.sb, h.sh, h.st}; };
      // The gradients land in the inputs' gradients at the operands' own strides (GPT-2: the
      // column blocks of d(qkv)); an input without one gets a zeroed scratch of its size.
      const models::HeadsOperand* in[3] = {&f.q, &f.k, &f.v};
      // Asked first: a gradient (or column block of one) written whole starts from zeros here.
      bool add[3];
      for (int i = 0; i < 3; ++i) add[i] = operand_accumulates(ops, f, *in[i]);
      float* g[3];
      for (int i = 0; i < 3; ++i) {
        float* d = grad(in[i]->tensor);
        if (d && !add[i]) {
          const auto& xs = shape(in[i]->tensor);
          const std::int64_t cols = (i == 0 ? f.H : f.K) * f.D;
          if (xs.size() == 3 && cols < xs[2]) {  // its columns of each (B, T) row
            for (std::int64_t r = 0; r < f.B * f.T; ++r) std::fill_n(d + r * xs[2] + in[i]->offset, cols, 0.0f);
          } else {
            std::fill_n(d, numel(in[i]->tensor), 0.0f);
          }
        }
        g[i] = d ? d + in[i]->offset : scratch(U(i), numel(in[i]->tensor)) + in[i]->offset;
      }
      const auto* rng = reinterpret_cast<const std::int64_t*>(act(f.rng));
      cpu::attention_backward(g[0], st(f.q), g[1], st(f.k), g[2], st(f.v), dy, st(f.o), base(f.q), st(f.q), base(f.k),
                              st(f.k), base(f.v), st(f.v), act(f.lse), nullptr, f.B, f.H, f.K, f.T, f.D, f.causal,
                              static_cast<float>(1.0 / std::sqrt(static_cast<double>(f.D))), alpha,
                              static_cast<std::uint64_t>(rng[0]), static_cast<std::uint64_t>(rng[1]));
      break;
    }
    case Fn::heads_copy: {
      const auto& ys = shape(y);
      const auto& xs = shape(op.inputs[0]);
      // A 4-D input's gradient whole, or the column block [col, col + X·D) of a (B, T, W) one.
      const bool a = xs.size() == 4 ? acc(0) : ops.accumulates(op.inputs[0], {op.col[0], ys[1] * ys[3], xs[2]});
      float* d = dx(0);
      if (!d) break;
      if (xs.size() == 4) cpu::copy_accumulate(d, dy, n, a);
      else cpu::split_heads_backward(d, dy, ys[0], ys[2], ys[1], ys[3], xs[2], op.col[0], a);
      break;
    }
    case Fn::none: throw std::logic_error(fmt::format("op {} cannot be executed", op.name));
  }
}

// ------------------------------------------------------------------ memory and movement
namespace {
bool is16(DType t) { return t == DType::bf16 || t == DType::fp16; }
float* f32p(Ref r) { return static_cast<float*>(r.base) + r.off; }
// r's n elements as fp32: r itself when it is fp32, else converted into tmp.
float* as_f32(Ref r, std::int64_t n, std::vector<float>& tmp) {
  if (!r) return nullptr;
  if (r.dt == DType::fp32) return f32p(r);
  tmp.resize(U(n));
  const auto* raw = static_cast<const std::uint16_t*>(r.base) + r.off;
  if (r.dt == DType::bf16) cpu::bf16_to_float(tmp.data(), raw, n);
  else if (r.dt == DType::fp16) cpu::fp16_to_float(tmp.data(), raw, n);
  else throw std::logic_error("cpu device: a float operand is stored as a non-float dtype");
  return tmp.data();
}
void store_f32(Ref r, const float* v, std::int64_t n) {
  if (r.dt == DType::fp32) {
    if (f32p(r) != v) std::copy_n(v, n, f32p(r));
    return;
  }
  auto* raw = static_cast<std::uint16_t*>(r.base) + r.off;
  if (r.dt == DType::bf16) cpu::float_to_bf16(raw, v, n);
  else cpu::float_to_fp16(raw, v, n);
}
}  // namespace

void* CpuDevice::allocate(std::size_t bytes) {
  // Zero-filled by calloc: large blocks come as fresh zero pages from the OS, so a bucket
  // sized for the GPU (reduce_bucket_size 5e8 elements) costs no time or resident memory
  // until it is written. At least one byte, so addresses are distinct.
  return std::calloc(std::max<std::size_t>(bytes, 1), 1);
}
void CpuDevice::release(void* p) { std::free(p); }

void CpuDevice::copy(Ref dst, Ref src, std::int64_t n) {
  if (n <= 0) return;
  if (dst.dt == src.dt) {
    const auto es = static_cast<std::size_t>(dtype_size(dst.dt));
    std::memcpy(static_cast<std::byte*>(dst.base) + U(dst.off) * es, static_cast<const std::byte*>(src.base) + U(src.off) * es,
                U(n) * es);
    return;
  }
  store_f32(dst, as_f32(src, n, tmp_[0]), n);
}

void CpuDevice::add(Ref dst, Ref src, std::int64_t n) {
  if (n <= 0) return;
  const float* s = as_f32(src, n, tmp_[0]);
  float* d = as_f32(dst, n, tmp_[1]);
  cpu::copy_accumulate(d, s, n, true);
  if (is16(dst.dt)) store_f32(dst, d, n);
}

void CpuDevice::fill(Ref dst, std::int64_t n, float value) {
  if (n <= 0) return;
  if (dst.dt == DType::fp32) {
    std::fill_n(f32p(dst), n, value);
    return;
  }
  if (!is16(dst.dt)) {
    if (value != 0.0f) throw std::logic_error("cpu device: fill of a non-float buffer with a value other than 0");
    const auto es = static_cast<std::size_t>(dtype_size(dst.dt));
    std::memset(static_cast<std::byte*>(dst.base) + U(dst.off) * es, 0, U(n) * es);
    return;
  }
  // One 16-bit pattern, stored n times (no fp32 staging of the whole run).
  const std::uint16_t bits = dst.dt == DType::bf16 ? cpu::float_to_bf16(value) : cpu::float_to_fp16(value);
  std::fill_n(static_cast<std::uint16_t*>(dst.base) + dst.off, n, bits);
}

void CpuDevice::scale(Ref x, std::int64_t n, float factor) {
  if (n <= 0) return;
  float* v = as_f32(x, n, tmp_[0]);
  cpu::scale_inplace(v, n, factor);
  if (is16(x.dt)) store_f32(x, v, n);
}

void CpuDevice::norm_add(std::span<const Ref> parts, std::int64_t n) {
  if (parts.size() == 1) {
    const float* g = as_f32(parts[0], n, tmp_[0]);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<double>(g[i]);
      norm_.sumsq += v * v;
      if (!std::isfinite(v)) norm_.nonfinite = true;
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    double v = 0.0;
    for (const Ref& r : parts) v += static_cast<double>(load(r.base, r.dt, r.off + i));
    norm_.sumsq += v * v;
    if (!std::isfinite(v)) norm_.nonfinite = true;
  }
}

void CpuDevice::upload(Ref dst, const float* src, std::int64_t n) { store_f32(dst, src, n); }
void CpuDevice::download(float* dst, Ref src, std::int64_t n) {
  const float* v = as_f32(src, n, tmp_[0]);
  std::copy_n(v, n, dst);
}
void CpuDevice::upload_bytes(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuDevice::download_bytes(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }

// ------------------------------------------------------------------ optimizer
// Params and states in a 16-bit dtype (a model DeepSpeed leaves in bf16 at stage 0) update
// in fp32 and round back, as torch's Adam on bf16 tensors computes in fp32 per element.
void CpuDevice::adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step,
                          const kernels::cpu::AdamConfig& c, float grad_factor) {
  float* gf = as_f32(g, n, tmp_[0]);
  if (grad_factor != 1.0f) cpu::scale_inplace(gf, n, grad_factor);
  float* pf = as_f32(p, n, tmp_[1]);
  float* mf = as_f32(m, n, tmp_[2]);
  float* vf = as_f32(v, n, tmp_[3]);
  cpu::adam_step(pf, gf, mf, vf, n, step, c);
  store_f32(p, pf, n);
  store_f32(m, mf, n);
  store_f32(v, vf, n);
}

void CpuDevice::sgd_step(Ref p, Ref g, Ref momentum, std::int64_t n, std::int64_t step,
                         const kernels::cpu::SgdConfig& c, float grad_factor) {
  float* gf = as_f32(g, n, tmp_[0]);
  if (grad_factor != 1.0f) cpu::scale_inplace(gf, n, grad_factor);
  float* pf = as_f32(p, n, tmp_[1]);
  float* mf = as_f32(momentum, n, tmp_[2]);
  cpu::sgd_step(pf, gf, mf, n, step, c);
  store_f32(p, pf, n);
  if (momentum) store_f32(momentum, mf, n);
}

// ------------------------------------------------------------------ timing
void CpuDevice::step_begin(std::size_t events) {
  t0_ = Clock::now();
  begin_.assign(events, t0_);
  end_.assign(events, t0_);
}
void CpuDevice::event_begin(std::size_t index) { begin_[index] = Clock::now(); }
void CpuDevice::event_end(std::size_t index) { end_[index] = Clock::now(); }
void CpuDevice::step_times(std::span<double> seconds, std::span<double> starts) {
  for (std::size_t i = 0; i < begin_.size() && i < seconds.size(); ++i) {
    seconds[i] = std::chrono::duration<double>(end_[i] - begin_[i]).count();
    starts[i] = std::chrono::duration<double>(begin_[i] - t0_).count();
  }
}

}  // namespace zp::exec
