#include "exec/cuda_scratch.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "exec/numeric.hpp"
#include "kernels/common/gelu_epilogue.hpp"
#include "kernels/common/norm_dims.hpp"
#include "kernels/common/sdpa_dims.hpp"

namespace zp::exec {

using models::Fn;
using models::TensorId;

namespace {
std::size_t U(std::int64_t i) { return static_cast<std::size_t>(i); }
std::size_t nbytes(std::int64_t n, DType dt) { return static_cast<std::size_t>(n * dtype_size(dt)); }

// The fused attention's operands (sdpa, flash_attention), as its launcher reads them.
// cuDNN's attention (`cudnn`) reads and writes every operand in place, contiguous heads or
// column blocks of rows alike (kernels/cuda/sdpa_cudnn.cuh, SdpaCudnnLayout), and takes a key
// and value of fewer heads than the query (GQA) as they are: it needs no temporary of the op's.
// zeroplan's own kernels take contiguous heads only, and a key or value of as many heads as
// the query: a GQA key or value is repeated over its query heads into a copy.
struct Fused {
  models::HeadsLayout f;
  DType dt = DType::fp32;
  bool cudnn = false;
  std::int64_t hv = 0, kvn = 0;
  // A (B, X, T, D) copy of operand h, where the kernel cannot read it where it lies.
  std::size_t copy(const models::HeadsOperand& h, std::int64_t X) const {
    if (cudnn) return 0;
    return models::heads_contiguous(f, h, X) ? 0 : nbytes(f.B * X * f.T * f.D, dt);
  }
  std::size_t repeat() const { return !cudnn && f.K < f.H ? nbytes(hv, dt) : 0; }
  // The output (or its gradient) as (B, H, T, D) heads: the own kernels'.
  std::size_t out_heads() const { return cudnn ? 0 : nbytes(hv, dt); }
};

Fused fused(const models::Op& op, const Operands& o, bool cudnn_attention) {
  Fused a{models::heads_layout(o.graph(), op)};
  const auto& f = a.f;
  if (!kernels::sdpa_head_dim_supported(f.D))
    cuda_op_fail(op, fmt::format("not implemented for head dim {} (the fused kernel takes 16, 32, 64 and 128)", f.D));
  a.dt = cuda_op_dtype(op, {o.act_ref(f.q.tensor), o.act_ref(f.k.tensor), o.act_ref(f.v.tensor),
                            o.act_ref(f.o.tensor)});
  a.hv = f.B * f.H * f.T * f.D;
  a.kvn = f.B * f.K * f.T * f.D;
  for (const auto* h : {&f.q, &f.k, &f.v, &f.o}) {
    const std::int64_t X = h == &f.k || h == &f.v ? f.K : f.H;
    if (!models::heads_contiguous(f, *h, X) && !models::heads_columns(f, *h))
      cuda_op_fail(op, "an attention operand in a layout the CUDA device cannot read");
  }
  if (!models::heads_columns(f, f.o) || f.o.st != f.H * f.D) cuda_op_fail(op, "an attention output that is not (B, T, H*D)");
  a.cudnn = cuda_attention_takes_cudnn(f, a.dt, cudnn_attention);
  return a;
}
}  // namespace

std::size_t scratch_parts_total(std::span<const std::size_t> parts) {
  std::size_t total = 0;
  for (const std::size_t b : parts) total += (b + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  return total;
}

void cuda_op_fail(const models::Op& op, const std::string& what) {
  throw std::logic_error(fmt::format("cuda device: op {} ({}): {}", op.name, models::fn_name(op.fn), what));
}

DType cuda_op_dtype(const models::Op& op, std::initializer_list<Ref> refs) {
  const Ref* first = nullptr;
  for (const Ref& r : refs) {
    if (!r) continue;
    if (!is_float(r.dt))
      cuda_op_fail(op, fmt::format("a {} operand where a float one is expected", dtype_name(r.dt)));
    if (!first) first = &r;
    else if (r.dt != first->dt)
      cuda_op_fail(op, fmt::format("operands of mixed dtypes {} and {}", dtype_name(first->dt), dtype_name(r.dt)));
  }
  if (!first) cuda_op_fail(op, "no bound float operand");
  return first->dt;
}

LossFlow cuda_loss_flow(const models::OpGraph& g, const models::Op& op) {
  LossFlow l;
  l.loss_op = op.fn == Fn::cross_entropy || op.fn == Fn::cross_entropy_fused;
  const TensorId y = op.outputs.empty() ? -1 : op.outputs[0];
  l.out_main = l.loss_op ? op.outputs[1] : y;
  l.from_loss = l.out_main >= 0 && l.out_main == g.loss;
  return l;
}

bool cuda_attention_takes_cudnn(const models::HeadsLayout& f, DType dt, bool cudnn_attention) {
  return cudnn_attention && kernels::sdpa_cudnn_takes(f.T, f.D, dt == DType::bf16 || dt == DType::fp16);
}

OpScratch cuda_forward_scratch(const models::Op& op, const Operands& o, bool cudnn_attention) {
  const models::OpGraph& g = o.graph();
  auto shape = [&](TensorId t) -> const std::vector<std::int64_t>& { return g.tensors[U(t)].shape; };
  auto act = [&](TensorId t) { return o.act_ref(t); };
  const TensorId y = op.outputs.empty() ? -1 : op.outputs[0];
  const std::int64_t n = y >= 0 ? shape_numel(shape(y)) : 0;
  const Ref yr = y >= 0 ? act(y) : Ref{};
  auto in = [&](std::size_t i) { return act(op.inputs[i]); };
  OpScratch s;
  switch (op.fn) {
    case Fn::linear_first_token: {
      const auto& w = g.params[U(op.params[0])].shape;
      const std::int64_t K = w[1];  // nn.Linear's (N, K)
      const Ref b = op.params.size() > 1 ? o.param_ref(op.params[1]) : Ref{};
      const DType dt = cuda_op_dtype(op, {yr, in(0), o.param_ref(op.params[0]), b});
      s.temp = {nbytes(shape(op.inputs[0])[0] * K, dt)};
      break;
    }
    case Fn::attn_scores:
    case Fn::attn_context: {
      const auto& ys = shape(y);
      const TensorId t0 = op.inputs[0], t1 = op.inputs[std::min<std::size_t>(1, op.inputs.size() - 1)];
      const DType dt = cuda_op_dtype(op, {yr, act(t0), act(t1)});
      auto is4 = [&](TensorId t) { return shape(t).size() == 4; };
      const std::size_t hv = nbytes(ys[0] * ys[1] * ys[2] * g.cfg.head_dim, dt);
      const bool scores = op.fn == Fn::attn_scores;
      s.temp = {scores && !is4(t0) ? hv : 0, !is4(t1) ? hv : 0};
      break;
    }
    case Fn::softmax: {
      const DType dt = cuda_op_dtype(op, {yr});
      if (in(0).dt != dt) s.temp = {nbytes(n, dt)};
      break;
    }
    case Fn::rope: s.temp = {nbytes(n, cuda_op_dtype(op, {yr, in(0), in(1), in(2)}))}; break;
    case Fn::repeat_kv: {
      const auto& ys = shape(y);
      const auto& xs = shape(op.inputs[0]);
      const DType dt = cuda_op_dtype(op, {yr, in(0)});
      if (xs.size() == 3) s.temp = {nbytes(ys[0] * (xs[2] / ys[3]) * ys[2] * ys[3], dt)};
      break;
    }
    case Fn::cross_entropy: {
      cuda_op_dtype(op, {yr, in(0)});
      const Ref loss = act(op.outputs[1]);
      s.temp = {loss.dt == DType::fp32 ? 0 : nbytes(1, DType::fp32)};
      break;
    }
    case Fn::sdpa:
    case Fn::flash_attention: {
      const Fused a = fused(op, o, cudnn_attention);
      s.temp = {a.copy(a.f.q, a.f.H), a.copy(a.f.k, a.f.K), a.repeat(), a.copy(a.f.v, a.f.K), a.repeat(),
                a.out_heads()};
      break;
    }
    default: break;
  }
  return s;
}

OpScratch cuda_backward_scratch(const models::Op& op, const Operands& o, bool cudnn_attention) {
  const models::OpGraph& g = o.graph();
  auto shape = [&](TensorId t) -> const std::vector<std::int64_t>& { return g.tensors[U(t)].shape; };
  auto act = [&](TensorId t) { return o.act_ref(t); };
  // Peeked, not used: the device asks whether it may write an input's gradient whole after
  // this (Operands::accumulates), and a gradient used first is zero-filled.
  auto grad = [&](TensorId t) { return o.grad_peek(t); };
  const TensorId y = op.outputs.empty() ? -1 : op.outputs[0];
  const std::int64_t n = y >= 0 ? shape_numel(shape(y)) : 0;
  const LossFlow lf = cuda_loss_flow(g, op);
  OpScratch s;
  Ref dy;
  if (lf.from_loss && !lf.loss_op) {
    s.loss = 4;  // one element of the loss's dtype, in a 4-byte request
    // dy is that scalar: bound (any non-null base marks it so; it is never read), the loss's dtype.
    const Ref loss = act(g.loss);
    dy = Ref{&s, loss ? loss.dt : g.tensors[U(g.loss)].dtype, 0};
  } else if (!lf.from_loss && lf.out_main >= 0) {
    dy = grad(lf.out_main);
  }
  if (!lf.from_loss && !dy) return s;  // nothing flows back through this op
  auto dx = [&](std::size_t i) { return i < op.inputs.size() ? grad(op.inputs[i]) : Ref{}; };
  switch (op.fn) {
    case Fn::linear_first_token: {
      const auto& w = g.params[U(op.params[0])].shape;
      const std::int64_t K = w[1];
      const Ref gx = dx(0);
      const Ref b = op.params.size() > 1 ? o.param_grad_ref(op.params[1]) : Ref{};
      const DType dt = cuda_op_dtype(
          op, {dy, act(op.inputs[0]), o.param_ref(op.params[0]), o.param_grad_ref(op.params[0]), b, gx});
      const std::int64_t B = shape(op.inputs[0])[0];
      s.temp = {nbytes(B * K, dt), gx ? nbytes(B * K, dt) : 0};
      break;
    }
    case Fn::attn_scores:
    case Fn::attn_context: {
      const auto& ys = shape(y);
      const TensorId t0 = op.inputs[0], t1 = op.inputs[std::min<std::size_t>(1, op.inputs.size() - 1)];
      const Ref g0 = grad(t0), g1 = grad(t1);
      if (!g0 && !g1) break;
      const DType dt = cuda_op_dtype(op, {dy, act(t0), act(t1), g0, g1});
      auto is4 = [&](TensorId t) { return shape(t).size() == 4; };
      const std::size_t hv = nbytes(ys[0] * ys[1] * ys[2] * g.cfg.head_dim, dt);
      const bool scores = op.fn == Fn::attn_scores;
      s.temp = {scores && !is4(t0) ? hv : 0, !is4(t1) ? hv : 0, g0 && !is4(t0) ? hv : 0, g1 && !is4(t1) ? hv : 0};
      break;
    }
    case Fn::softmax: {
      const Ref gx = dx(0);
      if (!gx) break;
      const DType dt = cuda_op_dtype(op, {act(y), dy});
      if (gx.dt != dt) s.temp = {nbytes(n, dt)};
      break;
    }
    case Fn::rope: {
      const Ref gx = dx(0);
      if (!gx) break;
      s.temp = {nbytes(n, cuda_op_dtype(op, {gx, dy, act(op.inputs[1]), act(op.inputs[2])}))};
      break;
    }
    case Fn::repeat_kv: {
      const Ref gx = dx(0);
      if (!gx) break;
      const auto& ys = shape(y);
      const auto& xs = shape(op.inputs[0]);
      const DType dt = cuda_op_dtype(op, {gx, dy});
      if (xs.size() != 4) s.temp = {nbytes(ys[0] * (xs[2] / ys[3]) * ys[2] * ys[3], dt)};
      break;
    }
    case Fn::cross_entropy: {
      const Ref gx = dx(0);
      if (!gx || lf.from_loss) break;
      const std::int64_t V = shape(op.outputs[0]).back();
      const std::int64_t rows = shape_numel(shape(op.inputs[0])) / V;
      const DType dt = cuda_op_dtype(op, {act(op.outputs[0]), gx});
      const Ref glogp = grad(op.outputs[0]);
      s.temp = {glogp && glogp.dt == dt ? 0 : nbytes(rows * V, dt)};
      if (dy.dt != dt) s.convert = nbytes(1, dt);
      break;
    }
    case Fn::dropout_add_layernorm: {
      // Rows too long for the warp kernels: the sum's gradient in a temporary before the epilogue
      // (one part, 0 bytes where the warp kernels take the rows). The pointers the kernel asks
      // about, as it will see them (a param's offset in its flat buffer decides the weight's
      // alignment; every buffer's base is aligned).
      const Ref gb = dx(0), gx = dx(1);
      const std::int64_t C = shape(y).back();
      const TensorId sum = op.outputs[3];
      const DType dt = cuda_op_dtype(op, {dy, act(sum), gb, gx});
      const void* mask = op.outputs.size() > 4 ? act(op.outputs[4]).address() : nullptr;
      const bool warp = (!gb && !gx) ||
                        kernels::dropout_add_layernorm_backward_warp_takes(
                            C, dtype_size(dt),
                            {dy.address(), act(sum).address(), o.param_ref(op.params[0]).address(), grad(sum).address(),
                             gx.address(), gb.address()},
                            mask);
      s.temp = {warp ? 0 : nbytes(n, dt)};
      break;
    }
    case Fn::mlp_gelu_tanh: {
      // The pre-activation's gradient (M, F); and where the derivative cannot be the product's
      // epilogue (kernels::gelu_epilogue_takes, of the pointers the kernel sees; its output is
      // this temporary, always aligned), c_proj's input gradient before the GELU's backward.
      const Ref pre = act(op.outputs[1]), w2 = o.param_ref(op.params[2]);
      const DType dt = cuda_op_dtype(op, {dy, pre, w2, dx(0)});
      const auto& ws = g.params[U(op.params[0])].shape;  // (C, F)
      const std::int64_t C = ws[0], F = ws[1], M = n / C;
      const bool epilogue = kernels::gelu_epilogue_takes(M, F, C, {dy.address(), w2.address(), pre.address()});
      s.temp = {nbytes(M * F, dt), epilogue ? 0 : nbytes(M * F, dt)};
      break;
    }
    case Fn::sdpa:
    case Fn::flash_attention: {
      const Fused a = fused(op, o, cudnn_attention);
      const auto& f = a.f;
      const Ref gq = grad(f.q.tensor), gk = grad(f.k.tensor), gv = grad(f.v.tensor);
      if (!gq && !gk && !gv) break;
      cuda_op_dtype(op, {act(f.q.tensor), dy, gq, gk, gv});
      // A gradient written in place where the kernel can write (or add into) it where it lies:
      // any layout and any number of heads for cuDNN; for the own kernels, contiguous heads of
      // as many heads as the query (a repeated key's or value's is summed back from a copy).
      auto in_place = [&](const models::HeadsOperand& h, std::int64_t X) {
        return a.cudnn || (X == f.H && models::heads_contiguous(f, h, X));
      };
      const bool q_direct = gq && in_place(f.q, f.H);
      const bool k_direct = gk && in_place(f.k, f.K);
      const bool v_direct = gv && in_place(f.v, f.K);
      auto kv_copy = [&](const Ref& gr, const models::HeadsOperand& h) {
        return gr && !a.cudnn && f.K < f.H && !models::heads_contiguous(f, h, f.K) ? nbytes(a.kvn, a.dt)
                                                                                      : std::size_t{0};
      };
      // The (B, H, T, D) gradients the own kernels write; cuDNN writes the key's and value's at
      // their own heads (a gradient nobody keeps still gets one to be written into).
      const std::size_t heads = nbytes(a.hv, a.dt), kv_heads = a.cudnn ? nbytes(a.kvn, a.dt) : heads;
      s.temp = {a.copy(f.q, f.H), a.copy(f.k, f.K), a.repeat(), a.copy(f.v, f.K), a.repeat(), a.out_heads(),
                a.out_heads(), q_direct ? 0 : heads, k_direct ? 0 : kv_heads, v_direct ? 0 : kv_heads,
                kv_copy(gk, f.k), kv_copy(gv, f.v)};
      break;
    }
    default: break;
  }
  return s;
}

}  // namespace zp::exec
