#include "exec/device_cuda_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "exec/cuda_scratch.hpp"
#include "exec/numeric.hpp"

#include "kernels/cpu/convert.hpp"
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/bmm.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/layout.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/loss.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/sdpa.cuh"
#include "kernels/cuda/sdpa_cudnn.cuh"

namespace zp::exec {

namespace cuda = zp::kernels::cuda;
using models::Fn;
using models::ParamId;
using models::TensorId;

namespace {
std::size_t U(std::int64_t i) { return static_cast<std::size_t>(i); }

// The first element of a Ref (nullptr when not bound).
void* ptr(const Ref& r) { return r.address(); }
std::size_t nbytes(std::int64_t n, DType dt) { return static_cast<std::size_t>(n * dtype_size(dt)); }

[[noreturn]] void fail(const models::Op& op, const std::string& what) { cuda_op_fail(op, what); }
DType float_dtype(const models::Op& op, std::initializer_list<Ref> refs) { return cuda_op_dtype(op, refs); }

const std::int64_t* ids_of(const models::Op& op, const Ref& r) {
  if (r.dt != DType::i64) fail(op, fmt::format("token ids stored as {}, not i64", dtype_name(r.dt)));
  return static_cast<const std::int64_t*>(ptr(r));
}
float* fp32_of(const models::Op& op, const Ref& r) {
  if (r.dt != DType::fp32) fail(op, fmt::format("statistics stored as {}, not fp32", dtype_name(r.dt)));
  return static_cast<float*>(ptr(r));
}
std::uint8_t* mask_of(const models::Op& op, const Ref& r) {
  if (r.dt != DType::b1 && r.dt != DType::u8) fail(op, fmt::format("a mask stored as {}", dtype_name(r.dt)));
  return static_cast<std::uint8_t*>(ptr(r));
}

// Device temporaries of one op from the temporary slot: the parts its rule gives
// (exec/cuda_scratch.hpp), in order, each kScratchAlign-aligned (nullptr for a part of 0).
std::vector<void*> carve(const CudaOpEnv& env, const std::vector<std::size_t>& bytes) {
  std::vector<void*> p(bytes.size(), nullptr);
  const std::size_t total = scratch_parts_total(bytes);
  if (total == 0) return p;
  char* base = static_cast<char*>(env.get_scratch(kTempSlot, total));
  std::size_t at = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i]) p[i] = base + at;
    at += (bytes[i] + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  }
  return p;
}
// Part i of a carving, null where the op's rule gave it 0 bytes (`need`: it must have some).
void* part(const models::Op& op, const std::vector<void*>& parts, std::size_t i, bool need = true) {
  if (i >= parts.size() || (need && !parts[i]))
    throw std::logic_error(fmt::format("cuda device: op {} ({}): scratch part {} of {} missing from its rule "
                                       "(exec/cuda_scratch.cpp)", op.name, models::fn_name(op.fn), i, parts.size()));
  return parts[i];
}
void* maybe(const models::Op& op, const std::vector<void*>& parts, std::size_t i) { return part(op, parts, i, false); }

// Host bytes into device memory with nothing on the host to keep alive until the copy runs
// (a cudaMemcpyAsync from pageable memory may synchronise): one cudaMemsetAsync per run of
// equal bytes, the value passed by argument.
void write_bytes(void* dst, const void* src, std::size_t n, cudaStream_t stream) {
  const auto* b = static_cast<const unsigned char*>(src);
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i + 1;
    while (j < n && b[j] == b[i]) ++j;
    ZP_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(dst) + i, static_cast<int>(b[i]), j - i, stream));
    i = j;
  }
}

// d(loss)/d(loss) as one element of dt in device scratch, rounded as the host rounds it.
Ref loss_scalar(const CudaOpEnv& env, const OpScratch& sc, float v, DType dt) {
  unsigned char b[4] = {};
  if (dt == DType::fp32) {
    std::memcpy(b, &v, 4);
  } else {
    const std::uint16_t h = dt == DType::bf16 ? kernels::cpu::float_to_bf16(v) : kernels::cpu::float_to_fp16(v);
    std::memcpy(b, &h, 2);
  }
  void* p = env.get_scratch(kLossSlot, sc.loss);
  write_bytes(p, b, nbytes(1, dt), env.stream);
  return {p, dt, 0};
}

// src (n of src_dt) as dt: itself, or converted into the conversion slot (its rule's size).
const void* as_dtype(const CudaOpEnv& env, const OpScratch& sc, const void* src, DType src_dt, std::int64_t n,
                     DType dt) {
  if (src_dt == dt) return src;
  if (sc.convert < nbytes(n, dt)) throw std::logic_error("cuda device: a conversion larger than its rule's");
  void* t = env.get_scratch(kConvertSlot, sc.convert);
  cuda::convert(t, dt, src, src_dt, n, env.stream);
  return t;
}

// dst += src (n elements). A src of another dtype is first rounded to dst's, as autograd
// casts a gradient to its input's dtype before accumulating it: in the same pass, with no
// temporary (the cast of GPT-2's fp32 logits gradient to bf16 had taken a 16-bit copy of the
// logits, 1.5 GiB at micro-batch 16, in the device's scratch).
void accumulate(const CudaOpEnv& env, const Ref& dst, const void* src, DType src_dt, std::int64_t n, bool add = true) {
  if (!dst) return;
  if (src_dt == dst.dt)
    cuda::copy_accumulate(ptr(dst), src, n, add, dst.dt, env.stream);
  else if (add)
    cuda::convert_accumulate(ptr(dst), dst.dt, src, src_dt, n, env.stream);
  else
    cuda::convert(ptr(dst), dst.dt, src, src_dt, n, env.stream);
}

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

// The fused attentions (sdpa, flash_attention), with as many kv heads as query heads or fewer
// (GQA). cuDNN's (--attention-kernel cudnn, where it takes them) reads each operand and writes
// the output and the gradients where they lie, contiguous heads or column blocks of (B, T, W)
// rows, as PyTorch's sdpa reads HF's head views, and groups the query heads over their kv head
// itself (the key and value gradients summed over the group inside it). kernels/cuda/sdpa takes
// contiguous (B, H, T, D) heads: each operand is read in place where it already is that, else
// copied out of its column block, and the output is computed as heads and merged into its
// (B, T, H·D) tensor; a key or value of fewer heads is repeated over the query heads of its kv
// head (HF's repeat_kv) into a copy, and its gradient summed back over them.
class FusedAttention {
 public:
  FusedAttention(const CudaOpEnv& env, const models::Op& op, Operands& o)
      : env_(env), op_(op), o_(o), f_(models::heads_layout(o.graph(), op)) {
    if (!cuda::sdpa_supports(f_.D))
      fail(op, fmt::format("not implemented for head dim {} (the fused kernel takes 16, 32, 64 and 128)", f_.D));
    q_ = o.act_ref(f_.q.tensor);
    k_ = o.act_ref(f_.k.tensor);
    v_ = o.act_ref(f_.v.tensor);
    out_ = o.act_ref(f_.o.tensor);
    dt_ = float_dtype(op, {q_, k_, v_, out_});  // its layouts were checked by its scratch rule
    // cuDNN's flash attention where asked for and it takes the operands (16-bit, head dims
    // multiples of 8, T > 1: kernels/common/sdpa_dims.hpp); the forward and the backward decide alike, so one kernel's saved
    // logsumexp and dropout stream never meet the other's backward.
    // The scratch rule decides alike (cuda_attention_takes_cudnn); the device refused to start
    // under --attention-kernel cudnn where cuDNN cannot be loaded.
    cudnn_ = cuda_attention_takes_cudnn(f_, dt_, env.ctx->sdpa_cudnn());
    seed_ = o.dropout_seed();
    offset_ = static_cast<std::uint64_t>(op.rng_stream) << 32;
  }

  // `sc`: cuda_forward_scratch's parts (q, k and its repeat, v and its repeat, the output heads).
  void forward(const OpScratch& sc) {
    const std::vector<void*> t = carve(env_, sc.temp);
    void *qc = maybe(op_, t, 0), *kc = maybe(op_, t, 1), *kh = maybe(op_, t, 2), *vc = maybe(op_, t, 3),
         *vh = maybe(op_, t, 4), *oh = maybe(op_, t, 5);
    cuda::SdpaCudnnLayout l;
    const void* q = heads(f_.q, q_, f_.H, qc, nullptr, l.q);
    const void* k = heads(f_.k, k_, f_.K, kc, kh, l.k);
    const void* v = heads(f_.v, v_, f_.K, vc, vh, l.v);
    // rng_state as the kernels keep it: the dropout stream's seed and offset.
    const Ref rng = o_.act_ref(f_.rng);
    if (rng.dt != DType::i64) fail(op_, fmt::format("rng_state stored as {}, not i64", dtype_name(rng.dt)));
    const std::int64_t state[2] = {static_cast<std::int64_t>(seed_), static_cast<std::int64_t>(offset_)};
    write_bytes(ptr(rng), state, sizeof state, env_.stream);
    void* const out = ptr(out_.at(f_.o.offset));
    if (cudnn_) {
      l.o = f_.o.st;  // written as its (B, T, H·D) rows
      cuda::sdpa_cudnn_forward(*env_.ctx, out, fp32_of(op_, o_.act_ref(f_.lse)), q, k, v, f_.B, f_.H, f_.K, f_.T,
                               f_.D, f_.causal, scale(), p(), static_cast<const std::int64_t*>(ptr(rng)), dt_,
                               env_.stream, l);
      return;
    }
    if (!oh) fail(op_, "the scratch rule left out the output's heads");
    cuda::sdpa_forward(oh, fp32_of(op_, o_.act_ref(f_.lse)), q, k, v, nullptr, f_.B, f_.H, f_.T, f_.D, f_.causal,
                       scale(), p(), seed_, offset_, dt_, env_.stream);
    cuda::merge_heads_forward(out, oh, f_.B, f_.T, f_.H, f_.D, dt_, env_.stream);
  }

  // The seed and offset are the forward's (this micro-step's stream and the op's), not read
  // back from rng_state, which lives on the device.
  // `sc`: cuda_backward_scratch's parts: the forward's operands, the output and its gradient
  // as heads, then a (B, H, T, D) gradient for each of q, k, v the kernel cannot accumulate
  // into in place (none: in place), then k's and v's summed over their query heads.
  void backward(const Ref& dy, const OpScratch& sc) {
    // Asked before the gradients are touched (Operands::accumulates): an operand that is a whole
    // tensor of its own, or a column block of one, gets its gradient written, not added: by the
    // kernel itself (heads of their own), or by the last copy or sum over query heads.
    const bool aq = operand_accumulates(o_, f_, f_.q), ak = operand_accumulates(o_, f_, f_.k),
               av = operand_accumulates(o_, f_, f_.v);
    const Ref gq = o_.grad_ref(f_.q.tensor), gk = o_.grad_ref(f_.k.tensor), gv = o_.grad_ref(f_.v.tensor);
    if (!gq && !gk && !gv) return;
    const std::vector<void*> t = carve(env_, sc.temp);
    void *qc = maybe(op_, t, 0), *kc = maybe(op_, t, 1), *kh = maybe(op_, t, 2), *vc = maybe(op_, t, 3),
         *vh = maybe(op_, t, 4);
    void *oh = maybe(op_, t, 5), *doh = maybe(op_, t, 6), *dqh = maybe(op_, t, 7), *dkh = maybe(op_, t, 8),
         *dvh = maybe(op_, t, 9), *dkc = maybe(op_, t, 10), *dvc = maybe(op_, t, 11);
    const bool q_direct = !dqh, k_direct = !dkh, v_direct = !dvh;
    cuda::SdpaCudnnLayout l;
    const void* q = heads(f_.q, q_, f_.H, qc, nullptr, l.q);
    const void* k = heads(f_.k, k_, f_.K, kc, kh, l.k);
    const void* v = heads(f_.v, v_, f_.K, vc, vh, l.v);
    // The kernel writes its temporaries, and adds into a gradient only where it must.
    void* dq = q_direct ? ptr(gq.at(f_.q.offset)) : dqh;
    void* dk = k_direct ? ptr(gk.at(f_.k.offset)) : dkh;
    void* dv = v_direct ? ptr(gv.at(f_.v.offset)) : dvh;
    const cuda::SdpaAccumulate add{q_direct && aq, k_direct && ak, v_direct && av};
    if (cudnn_) {  // the forward's (seed, offset), as it wrote them into rng_state
      l.o = f_.o.st;  // the output and its gradient read as their (B, T, H·D) rows
      l.dq = q_direct ? row_stride(f_.q, f_.H) : 0;
      l.dk = k_direct ? row_stride(f_.k, f_.K) : 0;
      l.dv = v_direct ? row_stride(f_.v, f_.K) : 0;
      cuda::sdpa_cudnn_backward(*env_.ctx, dq, dk, dv, ptr(dy.at(f_.o.offset)), q, k, v, ptr(out_.at(f_.o.offset)),
                                fp32_of(op_, o_.act_ref(f_.lse)), f_.B, f_.H, f_.K, f_.T, f_.D, f_.causal, scale(), p(),
                                static_cast<const std::int64_t*>(ptr(o_.act_ref(f_.rng))), dt_, env_.stream, add, l);
    } else {
      if (!oh || !doh) fail(op_, "the scratch rule left out the output's heads");
      cuda::split_heads_forward(oh, ptr(out_), f_.B, f_.T, f_.H, f_.D, f_.o.st, f_.o.offset, dt_, env_.stream);
      cuda::split_heads_forward(doh, ptr(dy), f_.B, f_.T, f_.H, f_.D, f_.o.st, f_.o.offset, dt_, env_.stream);
      cuda::sdpa_backward(*env_.ctx, dq, dk, dv, doh, q, k, v, oh, fp32_of(op_, o_.act_ref(f_.lse)), nullptr, f_.B,
                          f_.H, f_.T, f_.D, f_.causal, scale(), p(), seed_, offset_, dt_, env_.stream, add);
    }
    if (!q_direct) give_back(f_.q, gq, f_.H, dqh, nullptr, aq);
    if (!k_direct) give_back(f_.k, gk, f_.K, dkh, dkc, ak);
    if (!v_direct) give_back(f_.v, gv, f_.K, dvh, dvc, av);
  }

 private:
  bool contiguous(const models::HeadsOperand& h, std::int64_t X) const { return models::heads_contiguous(f_, h, X); }
  // SdpaCudnnLayout's row stride of operand h where it lies: 0 for contiguous heads, else its rows'.
  std::int64_t row_stride(const models::HeadsOperand& h, std::int64_t X) const { return contiguous(h, X) ? 0 : h.st; }
  float scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(f_.D))); }
  float p() const { return static_cast<float>(op_.alpha); }

  // Operand h (X heads) as its kernel reads it: in place where the scratch rule gave it no
  // copy (cuDNN's: any layout, `row` its row stride, SdpaCudnnLayout, and X < H as it is; the
  // own kernels': contiguous heads), else through `copy` (B, X, T, D); then, for the own
  // kernels, `repeat` (B, H, T, D) where X < H.
  const void* heads(const models::HeadsOperand& h, const Ref& r, std::int64_t X, void* copy, void* repeat,
                    std::int64_t& row) const {
    const void* x = ptr(r.at(h.offset));
    row = 0;
    if (copy != nullptr) {
      cuda::split_heads_forward(copy, ptr(r), f_.B, f_.T, X, f_.D, h.st, h.offset, dt_, env_.stream);
      x = copy;
    } else {
      if (!cudnn_ && !contiguous(h, X)) fail(op_, "the scratch rule left out a head copy");
      row = row_stride(h, X);
    }
    if (X == f_.H || cudnn_) return x;
    if (repeat == nullptr) fail(op_, "the scratch rule left out a key/value repeat");
    row = 0;
    cuda::repeat_kv_forward(repeat, x, f_.B, X, f_.H / X, f_.T, f_.D, dt_, env_.stream);
    return repeat;
  }

  // Adds the (B, H, T, D) gradient dh to operand h's gradient g (or writes it, `accumulate`
  // false: h is all of g): summed over the query heads of each kv head (in `copy` when h is a
  // column block), then scattered to its columns.
  void give_back(const models::HeadsOperand& h, const Ref& g, std::int64_t X, const void* dh, void* copy,
                 bool accumulate) const {
    if (!g) return;
    if (X < f_.H) {
      if (contiguous(h, X)) {
        cuda::repeat_kv_backward(ptr(g.at(h.offset)), dh, f_.B, X, f_.H / X, f_.T, f_.D, accumulate, dt_,
                                 env_.stream);
        return;
      }
      cuda::repeat_kv_backward(copy, dh, f_.B, X, f_.H / X, f_.T, f_.D, false, dt_, env_.stream);
      dh = copy;
    }
    cuda::split_heads_backward(ptr(g), dh, f_.B, f_.T, X, f_.D, h.st, h.offset, accumulate, dt_, env_.stream);
  }

  const CudaOpEnv& env_;
  const models::Op& op_;
  Operands& o_;
  models::HeadsLayout f_;
  Ref q_, k_, v_, out_;
  DType dt_ = DType::fp32;
  std::uint64_t seed_ = 0, offset_ = 0;
  bool cudnn_ = false;  // cuDNN's attention (ContextOptions::sdpa_cudnn), else kernels/cuda/sdpa
};

}  // namespace

void cuda_forward(const CudaOpEnv& env, const models::Op& op, Operands& o) {
  const models::OpGraph& graph = o.graph();
  cuda::Context& ctx = *env.ctx;
  cudaStream_t stream = env.stream;
  auto act = [&](TensorId t) { return o.act_ref(t); };
  auto param = [&](ParamId p) { return o.param_ref(p); };
  auto numel = [&](TensorId t) { return shape_numel(graph.tensors[U(t)].shape); };
  auto dtype = [&](std::initializer_list<Ref> refs) { return float_dtype(op, refs); };
  const auto& cfg = graph.cfg;
  const TensorId y = op.outputs.empty() ? -1 : op.outputs[0];
  const std::int64_t n = y >= 0 ? numel(y) : 0;
  const Ref yr = y >= 0 ? act(y) : Ref{};
  void* const yp = ptr(yr);
  auto in = [&](std::size_t i) { return act(op.inputs[i]); };
  auto shape = [&](TensorId t) -> const std::vector<std::int64_t>& { return graph.tensors[U(t)].shape; };
  const float alpha = static_cast<float>(op.alpha);
  const OpScratch sc = cuda_forward_scratch(op, o, env.ctx->sdpa_cudnn());  // its temporaries' sizes (exec/cuda_scratch.hpp)
  switch (op.fn) {
    case Fn::embedding: {
      const Ref w = param(op.params[0]);
      const DType dt = dtype({yr, w});
      const std::int64_t C = shape(y).back();
      cuda::embedding_forward(yp, ids_of(op, in(0)), ptr(w), n / C, C, dt, stream);
      break;
    }
    case Fn::position_embedding: {
      const Ref w = param(op.params[0]);
      cuda::convert(yp, yr.dt, ptr(w), w.dt, n, stream);
      break;
    }
    case Fn::linear:
    case Fn::conv1d:
    case Fn::linear_first_token: {
      const auto [conv, K, Nn] = linear_geometry(graph, op);
      const Ref w = param(op.params[0]);
      const Ref b = op.params.size() > 1 ? param(op.params[1]) : Ref{};
      const DType dt = dtype({yr, in(0), w, b});
      const void* x = ptr(in(0));
      if (op.fn == Fn::linear_first_token) {
        const auto& xs = shape(op.inputs[0]);
        void* sel = part(op, carve(env, sc.temp), 0);
        cuda::select_token_forward(sel, x, xs[0], xs[1], K, 0, dt, stream);
        x = sel;
      }
      const std::int64_t ld = models::row_stride(graph.tensors[U(y)]);  // the fused loss's logits: padded rows
      if (conv && ld != Nn) fail(op, "a Conv1D output with padded rows");
      if (conv) cuda::conv1d_forward(ctx, yp, x, ptr(w), ptr(b), n / Nn, Nn, K, dt, stream);
      else cuda::linear_forward(ctx, yp, x, ptr(w), ptr(b), n / Nn, Nn, K, dt, stream, ld);
      break;
    }
    case Fn::mlp_gelu_tanh: {  // outputs y, pre, a; the GELU as c_fc's epilogue where cuBLASLt takes it
      const Ref w1 = param(op.params[0]), b1 = param(op.params[1]), w2 = param(op.params[2]), b2 = param(op.params[3]);
      const Ref pre = act(op.outputs[1]), a = act(op.outputs[2]);
      const DType dt = dtype({yr, in(0), w1, b1, w2, b2, pre, a});
      const auto& ws = graph.params[U(op.params[0])].shape;  // (C, F)
      const std::int64_t C = ws[0], F = ws[1], M = n / C;
      if (!cuda::conv1d_gelu_forward(ctx, ptr(a), ptr(pre), ptr(in(0)), ptr(w1), ptr(b1), M, F, C, dt, stream)) {
        cuda::conv1d_forward(ctx, ptr(pre), ptr(in(0)), ptr(w1), ptr(b1), M, F, C, dt, stream);
        cuda::gelu_tanh_forward(ptr(a), ptr(pre), M * F, dt, stream);
      }
      cuda::conv1d_forward(ctx, yp, ptr(a), ptr(w2), ptr(b2), M, C, F, dt, stream);
      break;
    }
    case Fn::attn_scores:
    case Fn::attn_context: {
      const auto& ys = shape(y);  // (B, H, T, T) or (B, H, T, D)
      const Dims d{ys[0], ys[1], ys[2], cfg.head_dim};
      const TensorId t0 = op.inputs[0], t1 = op.inputs[std::min<std::size_t>(1, op.inputs.size() - 1)];
      const DType dt = dtype({yr, act(t0), act(t1)});
      auto is4 = [&](TensorId t) { return shape(t).size() == 4; };
      const bool scores = op.fn == Fn::attn_scores;
      const std::vector<void*> h = carve(env, sc.temp);
      void *h0 = maybe(op, h, 0), *h1 = maybe(op, h, 1);
      // Operand i as (B, H, T, D): a head view of a (B, T, W) tensor, or a 4-D tensor.
      auto operand = [&](std::size_t i, TensorId t, void* tmp) -> const void* {
        if (is4(t)) return ptr(act(t));
        part(op, h, i);
        cuda::split_heads_forward(tmp, ptr(act(t)), d.B, d.T, d.H, d.D, shape(t)[2], op.col[i], dt, stream);
        return tmp;
      };
      if (scores)
        cuda::bmm_forward(ctx, yp, operand(0, t0, h0), operand(1, t1, h1), d.B * d.H, d.T, d.T, d.D, false, true,
                          dt, stream);
      else
        cuda::bmm_forward(ctx, yp, ptr(act(t0)), operand(1, t1, h1), d.B * d.H, d.T, d.D, d.T, false, false, dt,
                          stream);
      break;
    }
    case Fn::scale: cuda::scale_forward(yp, ptr(in(0)), n, alpha, dtype({yr, in(0)}), stream); break;
    case Fn::add_scalar: cuda::add_scalar_forward(yp, ptr(in(0)), n, alpha, dtype({yr, in(0)}), stream); break;
    case Fn::add: {
      const DType dt = dtype({yr, in(0), in(1)});
      if (numel(op.inputs[1]) == n) {
        cuda::add_forward(yp, ptr(in(0)), ptr(in(1)), n, dt, stream);
      } else {  // (1, T, C) over (B, T, C)
        const auto& s = shape(y);
        cuda::add_broadcast_forward(yp, ptr(in(0)), ptr(in(1)), {1, s[0], s[1], s[2]}, {1, 1, s[1], s[2]}, dt,
                                    stream);
      }
      break;
    }
    case Fn::causal_where: {
      const auto& s = shape(y);
      const DType dt = dtype({yr, in(0)});
      cuda::causal_where_forward(yp, ptr(in(0)), s[0] * s[1], s[2], cuda::mask_value(dt), dt, stream);
      break;
    }
    case Fn::add_mask: {
      const auto& s = shape(y);
      const auto& m = shape(op.inputs[1]);
      cuda::add_broadcast_forward(yp, ptr(in(0)), ptr(in(1)), {s[0], s[1], s[2], s[3]}, {m[0], m[1], m[2], m[3]},
                                  dtype({yr, in(0), in(1)}), stream);
      break;
    }
    case Fn::softmax: {
      // softmax(x, dtype=float32) of a 16-bit x: the input upcast (exactly) to y's dtype.
      const std::int64_t c = shape(y).back();
      const DType dt = dtype({yr});
      const void* x = ptr(in(0));
      if (in(0).dt != dt) {
        void* t = part(op, carve(env, sc.temp), 0);
        cuda::convert(t, dt, x, in(0).dt, n, stream);
        x = t;
      }
      cuda::softmax_forward(yp, x, n / c, c, dt, stream);
      break;
    }
    case Fn::dropout:
      cuda::dropout_forward(yp, mask_of(op, act(op.outputs[1])), ptr(in(0)), n, alpha, o.dropout_seed(),
                            static_cast<std::uint64_t>(op.rng_stream) << 32, dtype({yr, in(0)}), stream);
      break;
    case Fn::layernorm: {
      const std::int64_t C = shape(y).back();
      const Ref w = param(op.params[0]);
      const Ref b = op.params.size() > 1 ? param(op.params[1]) : Ref{};
      cuda::layernorm_forward(yp, fp32_of(op, act(op.outputs[1])), fp32_of(op, act(op.outputs[2])), ptr(in(0)),
                              ptr(w), ptr(b), n / C, C, alpha, dtype({yr, in(0), w, b}), stream);
      break;
    }
    case Fn::dropout_add_layernorm: {  // outputs y, mean, rstd, the sum, the mask (where p > 0)
      const std::int64_t C = shape(y).back();
      const Ref w = param(op.params[0]);
      const Ref b = op.params.size() > 1 ? param(op.params[1]) : Ref{};
      const Ref sum = act(op.outputs[3]);
      std::uint8_t* mask = op.p > 0.0 ? mask_of(op, act(op.outputs[4])) : nullptr;
      cuda::dropout_add_layernorm_forward(yp, fp32_of(op, act(op.outputs[1])), fp32_of(op, act(op.outputs[2])),
                                          ptr(sum), mask, ptr(in(0)), ptr(in(1)), ptr(w), ptr(b), n / C, C, alpha,
                                          static_cast<float>(op.p), o.dropout_seed(),
                                          static_cast<std::uint64_t>(std::max(op.rng_stream, 0)) << 32,
                                          dtype({yr, sum, in(0), in(1), w, b}), stream);
      break;
    }
    case Fn::pow: {
      const DType dt = dtype({yr, in(0)});
      if (op.alpha == 2.0) cuda::pow2_forward(yp, ptr(in(0)), n, dt, stream);
      else cuda::pow3_forward(yp, ptr(in(0)), n, dt, stream);
      break;
    }
    case Fn::rms_rsqrt: {
      const std::int64_t C = shape(op.inputs[0]).back();
      cuda::rms_rsqrt_forward(yp, ptr(in(0)), n, C, alpha, dtype({yr, in(0)}), stream);
      break;
    }
    case Fn::mul: cuda::mul_forward(yp, ptr(in(0)), ptr(in(1)), n, dtype({yr, in(0), in(1)}), stream); break;
    case Fn::mul_rowscale: {
      const std::int64_t C = shape(y).back();
      cuda::mul_rowscale_forward(yp, ptr(in(0)), ptr(in(1)), n / C, C, dtype({yr, in(0), in(1)}), stream);
      break;
    }
    case Fn::mul_weight: {
      const std::int64_t C = shape(y).back();
      const Ref w = param(op.params[0]);
      cuda::mul_weight_forward(yp, ptr(in(0)), ptr(w), n / C, C, dtype({yr, in(0), w}), stream);
      break;
    }
    case Fn::gelu: cuda::gelu_forward(yp, ptr(in(0)), n, dtype({yr, in(0)}), stream); break;
    case Fn::gelu_tanh: cuda::gelu_tanh_forward(yp, ptr(in(0)), n, dtype({yr, in(0)}), stream); break;
    case Fn::relu: cuda::relu_forward(yp, ptr(in(0)), n, dtype({yr, in(0)}), stream); break;
    case Fn::silu: cuda::silu_forward(yp, ptr(in(0)), n, dtype({yr, in(0)}), stream); break;
    case Fn::tanh: cuda::tanh_forward(yp, ptr(in(0)), n, dtype({yr, in(0)}), stream); break;
    case Fn::cast: cuda::convert(yp, yr.dt, ptr(in(0)), in(0).dt, n, stream); break;
    case Fn::rope_tables: {
      const auto& s = shape(y);  // (1, T, D)
      const Ref sin = act(op.outputs[1]);
      cuda::rope_tables(yp, ptr(sin), s[1], s[2], alpha, dtype({yr, sin}), stream);
      break;
    }
    case Fn::rope: {
      const auto& s = shape(y);  // (B, H, T, D) from a (B, T, H*D) projection
      const DType dt = dtype({yr, in(0), in(1), in(2)});
      void* x = part(op, carve(env, sc.temp), 0);
      cuda::split_heads_forward(x, ptr(in(0)), s[0], s[2], s[1], s[3], s[1] * s[3], 0, dt, stream);
      cuda::rope_forward(yp, x, ptr(in(1)), ptr(in(2)), s[0], s[1], s[2], s[3], dt, stream);
      break;
    }
    case Fn::merge_heads: {
      const auto& s = shape(op.inputs[0]);  // (B, H, T, D)
      cuda::merge_heads_forward(yp, ptr(in(0)), s[0], s[2], s[1], s[3], dtype({yr, in(0)}), stream);
      break;
    }
    case Fn::repeat_kv: {
      // (B, K, T, D), or a (B, T, K*D) projection read as heads
      const auto& ys = shape(y);
      const auto& s = shape(op.inputs[0]);
      const std::int64_t B = ys[0], T = ys[2], D = ys[3], K = s.size() == 4 ? s[1] : s[2] / D;
      const DType dt = dtype({yr, in(0)});
      const void* x = ptr(in(0));
      if (s.size() == 3) {
        void* h = part(op, carve(env, sc.temp), 0);
        cuda::split_heads_forward(h, x, B, T, K, D, s[2], 0, dt, stream);
        x = h;
      }
      cuda::repeat_kv_forward(yp, x, B, K, ys[1] / K, T, D, dt, stream);
      break;
    }
    case Fn::extended_mask: {
      // Masked entries hold finfo(dtype).min of the mask's dtype, as HF builds it.
      const auto& s = shape(op.inputs[0]);  // (B, T)
      const DType dt = dtype({yr});
      cuda::padding_mask(yp, ids_of(op, in(0)), s[0], s[1], cuda::mask_value(dt), dt, stream);
      break;
    }
    case Fn::causal_mask: {
      const DType dt = dtype({yr});
      cuda::causal_mask(yp, shape(y)[2], cuda::mask_value(dt), dt, stream);
      break;
    }
    case Fn::cross_entropy: {
      const std::int64_t V = shape(op.outputs[0]).back();
      const std::int64_t rows = numel(op.inputs[0]) / V;
      const Ref loss = act(op.outputs[1]);
      const DType dt = dtype({yr, in(0)});
      cuda::log_softmax_forward(yp, ptr(in(0)), rows, V, dt, stream);
      // The kernel writes an fp32 loss: a loss of another dtype goes through scratch.
      float* l = loss.dt == DType::fp32 ? static_cast<float*>(ptr(loss))
                                        : static_cast<float*>(part(op, carve(env, sc.temp), 0));
      cuda::nll_loss_forward(l, yp, ids_of(op, in(1)), rows, V, cuda::kIgnoreIndex, dt, stream);
      if (loss.dt != DType::fp32) cuda::convert(ptr(loss), loss.dt, l, DType::fp32, 1, stream);
      break;
    }
    case Fn::cross_entropy_fused: {  // outputs: the rows' logsumexp (y), the mean loss, both fp32
      const Ref logits = in(0);
      const std::int64_t V = shape(op.inputs[0]).back();
      const std::int64_t rows = numel(op.inputs[0]) / V;
      const Ref loss = act(op.outputs[1]);
      if (yr.dt != DType::fp32 || loss.dt != DType::fp32) fail(op, "its logsumexp and loss must be fp32");
      cuda::cross_entropy_forward(ctx, static_cast<float*>(ptr(loss)), static_cast<float*>(yp), ptr(logits),
                                  ids_of(op, in(1)), rows, V, cuda::kIgnoreIndex, dtype({logits}), stream,
                                  models::row_stride(graph.tensors[U(op.inputs[0])]));
      break;
    }
    case Fn::sdpa:
    case Fn::flash_attention: FusedAttention(env, op, o).forward(sc); break;
    case Fn::heads_copy: {
      // (B, X, T, D) from a 4-D tensor (a copy) or from columns [col, col + X·D) of a (B, T, W) one
      const auto& ys = shape(y);
      const auto& xs = shape(op.inputs[0]);
      const DType dt = dtype({yr, in(0)});
      if (xs.size() == 4) cuda::convert(yp, dt, ptr(in(0)), dt, n, stream);
      else cuda::split_heads_forward(yp, ptr(in(0)), ys[0], ys[2], ys[1], ys[3], xs[2], op.col[0], dt, stream);
      break;
    }
    case Fn::none: throw std::logic_error(fmt::format("op {} cannot be executed", op.name));
  }
}

void cuda_backward(const CudaOpEnv& env, const models::Op& op, Operands& o) {
  const models::OpGraph& graph = o.graph();
  cuda::Context& ctx = *env.ctx;
  cudaStream_t stream = env.stream;
  auto act = [&](TensorId t) { return o.act_ref(t); };
  auto grad = [&](TensorId t) { return o.grad_ref(t); };
  auto param = [&](ParamId p) { return o.param_ref(p); };
  auto numel = [&](TensorId t) { return shape_numel(graph.tensors[U(t)].shape); };
  auto dtype = [&](std::initializer_list<Ref> refs) { return float_dtype(op, refs); };
  const auto& cfg = graph.cfg;
  const TensorId y = op.outputs.empty() ? -1 : op.outputs[0];
  const std::int64_t n = y >= 0 ? numel(y) : 0;
  auto shape = [&](TensorId t) -> const std::vector<std::int64_t>& { return graph.tensors[U(t)].shape; };
  // The gradient flowing into this op: d(loss)/d(loss) = 1/GAS (DeepSpeed scales the loss).
  // The cross entropy takes it by value; any other op producing the loss reads it as a
  // device scalar in the loss's dtype.
  const auto [loss_op, from_loss, out_main] = cuda_loss_flow(graph, op);
  const OpScratch sc = cuda_backward_scratch(op, o, env.ctx->sdpa_cudnn());  // its temporaries' sizes (exec/cuda_scratch.hpp)
  Ref dy;
  if (from_loss && !loss_op) {
    const Ref loss = act(graph.loss);
    dy = loss_scalar(env, sc, o.loss_grad(), loss ? loss.dt : graph.tensors[U(graph.loss)].dtype);
  }
  else if (!from_loss && out_main >= 0) dy = grad(out_main);
  if (!from_loss && !dy) return;  // nothing flows back through this op
  const void* const dyp = ptr(dy);
  auto dx = [&](std::size_t i) { return i < op.inputs.size() ? grad(op.inputs[i]) : Ref{}; };
  // Whether input i's gradient is added into (else written whole: backward_assigns), asked
  // before its first dx(i).
  auto acc = [&](std::size_t i) { return o.accumulates(op.inputs[i]); };
  auto x = [&](std::size_t i) { return act(op.inputs[i]); };
  auto pg = [&](std::size_t i) { return o.param_grad_ref(op.params[i]); };
  const float alpha = static_cast<float>(op.alpha);
  switch (op.fn) {
    case Fn::embedding: {
      const Ref gw = pg(0);
      if (!gw) break;
      const std::int64_t C = shape(y).back();
      const std::int64_t V = graph.params[U(op.params[0])].shape[0];
      cuda::embedding_backward(ctx, ptr(gw), ids_of(op, x(0)), dyp, n / C, V, C, -1, true, dtype({gw, dy}), stream);
      break;
    }
    case Fn::position_embedding: accumulate(env, pg(0), dyp, dy.dt, n); break;
    case Fn::linear:
    case Fn::conv1d:
    case Fn::linear_first_token: {
      const auto [conv, K, Nn] = linear_geometry(graph, op);
      const bool ax = op.fn == Fn::linear_first_token || acc(0);
      const Ref w = param(op.params[0]);
      const Ref gw = pg(0);
      const Ref gb = op.params.size() > 1 ? pg(1) : Ref{};
      const Ref gx = dx(0);
      const DType dt = dtype({dy, x(0), w, gw, gb, gx});
      const std::int64_t M = n / Nn;
      const std::int64_t ld = models::row_stride(graph.tensors[U(y)]);  // dy's rows: y's pitch
      if (conv && ld != Nn) fail(op, "a Conv1D output with padded rows");
      auto gemms = [&](void* dxp, void* dwp, void* dbp, const void* xp, bool accumulate) {
        if (conv) cuda::conv1d_backward(ctx, dxp, dwp, dbp, dyp, xp, ptr(w), M, Nn, K, accumulate, dt, stream);
        else cuda::linear_backward(ctx, dxp, dwp, dbp, dyp, xp, ptr(w), M, Nn, K, accumulate, dt, stream, ld);
      };
      if (op.fn != Fn::linear_first_token) {
        // The input's gradient (written whole where it is fresh), then the params' (added:
        // GAS accumulates there). Separate products either way.
        if (ax) {
          gemms(ptr(gx), ptr(gw), ptr(gb), ptr(x(0)), true);
        } else {
          gemms(ptr(gx), nullptr, nullptr, ptr(x(0)), false);
          gemms(nullptr, ptr(gw), ptr(gb), ptr(x(0)), true);
        }
        break;
      }
      // Through the selected tokens: their gradient is written to scratch (not accumulated),
      // then added into the input's rows.
      const auto& xs = shape(op.inputs[0]);
      const std::int64_t B = xs[0], T = xs[1];
      const std::vector<void*> t = carve(env, sc.temp);
      void* sel = part(op, t, 0);
      void* dsel = gx ? part(op, t, 1) : nullptr;
      cuda::select_token_forward(sel, ptr(x(0)), B, T, K, 0, dt, stream);
      if (gw || gb) gemms(nullptr, ptr(gw), ptr(gb), sel, true);
      if (gx) {
        gemms(dsel, nullptr, nullptr, sel, false);
        cuda::select_token_backward(ptr(gx), dsel, B, T, K, 0, true, dt, stream);
      }
      break;
    }
    case Fn::attn_scores:
    case Fn::attn_context: {
      const auto& ys = shape(y);
      const Dims d{ys[0], ys[1], ys[2], cfg.head_dim};
      const TensorId t0 = op.inputs[0], t1 = op.inputs[std::min<std::size_t>(1, op.inputs.size() - 1)];
      const Ref g0 = grad(t0), g1 = grad(t1);
      if (!g0 && !g1) break;
      const DType dt = dtype({dy, act(t0), act(t1), g0, g1});
      auto is4 = [&](TensorId t) { return shape(t).size() == 4; };
      const bool scores = op.fn == Fn::attn_scores;
      // Head views of (B, T, W) operands, and their gradients before they go back to the columns.
      const std::vector<void*> h = carve(env, sc.temp);
      void *h0 = maybe(op, h, 0), *h1 = maybe(op, h, 1), *d0 = maybe(op, h, 2), *d1 = maybe(op, h, 3);
      auto operand = [&](std::size_t i, TensorId t, void* tmp) -> const void* {
        if (is4(t)) return ptr(act(t));
        part(op, h, i);
        cuda::split_heads_forward(tmp, ptr(act(t)), d.B, d.T, d.H, d.D, shape(t)[2], op.col[i], dt, stream);
        return tmp;
      };
      const void* a = scores ? operand(0, t0, h0) : ptr(act(t0));
      const void* b = operand(1, t1, h1);
      const std::int64_t m = d.T, nn = scores ? d.T : d.D, k = scores ? d.D : d.T;
      // One product per operand: a 4-D operand's gradient accumulates in place, a head view's
      // is written to scratch and added into its columns.
      auto give_back = [&](std::size_t i, TensorId t, const Ref& g, void* tmp) {
        if (!g) return;
        void* target = is4(t) ? ptr(g) : part(op, h, 2 + i);
        cuda::bmm_backward(ctx, i == 0 ? target : nullptr, i == 1 ? target : nullptr, dyp, a, b, d.B * d.H, m, nn, k,
                           false, scores, is4(t), dt, stream);
        if (!is4(t))
          cuda::split_heads_backward(ptr(g), tmp, d.B, d.T, d.H, d.D, shape(t)[2], op.col[i], true, dt, stream);
      };
      give_back(0, t0, g0, d0);
      give_back(1, t1, g1, d1);
      break;
    }
    case Fn::scale: {
      const bool a = acc(0);
      if (dx(0)) cuda::scale_backward(ptr(dx(0)), dyp, n, alpha, a, dtype({dx(0), dy}), stream);
      break;
    }
    case Fn::add_scalar: {
      const bool a = acc(0);
      if (dx(0)) cuda::add_scalar_backward(ptr(dx(0)), dyp, n, a, dtype({dx(0), dy}), stream);
      break;
    }
    case Fn::add: {
      const bool broadcast = op.inputs.size() > 1 && numel(op.inputs[1]) != n;
      const bool a0 = broadcast || acc(0), a1 = broadcast || op.inputs.size() < 2 || acc(1);
      if (!dx(0) && !dx(1)) break;
      const DType dt = dtype({dy, dx(0), dx(1)});
      if (broadcast) {
        const auto& s = shape(y);
        cuda::add_broadcast_backward(ptr(dx(0)), ptr(dx(1)), dyp, {1, s[0], s[1], s[2]}, {1, 1, s[1], s[2]}, true, dt,
                                     stream);
      } else if (a0 == a1 || !dx(0) || !dx(1)) {  // one pass over dy (a residual's two operands, both fresh)
        cuda::add_backward(ptr(dx(0)), ptr(dx(1)), dyp, n, dx(0) ? a0 : a1, dt, stream);
      } else {
        cuda::add_backward(ptr(dx(0)), nullptr, dyp, n, a0, dt, stream);
        cuda::add_backward(nullptr, ptr(dx(1)), dyp, n, a1, dt, stream);
      }
      break;
    }
    case Fn::causal_where: {
      const auto& s = shape(y);
      if (dx(0)) cuda::causal_where_backward(ptr(dx(0)), dyp, s[0] * s[1], s[2], true, dtype({dx(0), dy}), stream);
      break;
    }
    case Fn::add_mask: {
      const auto& s = shape(y);
      const auto& m = shape(op.inputs[1]);
      if (dx(0))
        cuda::add_broadcast_backward(ptr(dx(0)), nullptr, dyp, {s[0], s[1], s[2], s[3]}, {m[0], m[1], m[2], m[3]},
                                     true, dtype({dx(0), dy}), stream);
      break;
    }
    case Fn::softmax: {
      // The program's temporary (op.bwd_scratch) is not needed: the kernel reduces dy * y
      // without materialising it. A 16-bit input of an fp32 softmax gets its gradient
      // rounded to its dtype.
      const bool a = acc(0);
      const Ref gx = dx(0);
      if (!gx) break;
      const std::int64_t c = shape(y).back();
      const Ref yr = act(y);
      const DType dt = dtype({yr, dy});
      if (gx.dt == dt) {
        cuda::softmax_backward(ptr(gx), ptr(yr), dyp, n / c, c, a, dt, stream);
      } else {
        void* t = part(op, carve(env, sc.temp), 0);
        cuda::softmax_backward(t, ptr(yr), dyp, n / c, c, false, dt, stream);
        accumulate(env, gx, t, dt, n, a);
      }
      break;
    }
    case Fn::dropout: {
      const bool a = acc(0);
      if (dx(0))
        cuda::dropout_backward(ptr(dx(0)), mask_of(op, act(op.outputs[1])), dyp, n, alpha, a, dtype({dx(0), dy}),
                               stream);
      break;
    }
    case Fn::layernorm: {
      const std::int64_t C = shape(y).back();
      const bool a = acc(0);
      const Ref w = param(op.params[0]);
      const Ref gw = pg(0);
      const Ref gb = op.params.size() > 1 ? pg(1) : Ref{};
      const Ref gx = dx(0);
      if (!gx && !gw && !gb) break;
      const DType dt = dtype({dy, x(0), w, gx, gw, gb});
      const float* mean = fp32_of(op, act(op.outputs[1]));
      const float* rstd = fp32_of(op, act(op.outputs[2]));
      // The input's gradient written or added, the params' added (one pass where it can).
      cuda::layernorm_backward(ctx, ptr(gx), ptr(gw), ptr(gb), dyp, ptr(x(0)), mean, rstd, ptr(w), n / C, C, a, true,
                               dt, stream);
      break;
    }
    case Fn::dropout_add_layernorm: {
      const std::int64_t C = shape(y).back();
      const bool ab = acc(0), ax = acc(1);
      const Ref w = param(op.params[0]);
      const Ref gw = pg(0);
      const Ref gbeta = op.params.size() > 1 ? pg(1) : Ref{};
      const Ref gb = dx(0), gx = dx(1);
      const Ref sum = act(op.outputs[3]);
      const Ref ds = grad(op.outputs[3]);  // where a later op reads the sum (a pre-LN block's residual)
      const DType dt = dtype({dy, sum, w, gw, gbeta, gb, gx, ds});
      const std::uint8_t* mask = op.p > 0.0 ? mask_of(op, act(op.outputs[4])) : nullptr;
      cuda::dropout_add_layernorm_backward(ctx, ptr(gb), ptr(gx), ptr(gw), ptr(gbeta), dyp, ptr(ds), ptr(sum), mask,
                                           fp32_of(op, act(op.outputs[1])), fp32_of(op, act(op.outputs[2])), ptr(w),
                                           n / C, C, static_cast<float>(op.p), ab, ax,
                                           maybe(op, carve(env, sc.temp), 0), dt, stream);
      break;
    }
    case Fn::pow: {
      const bool a = acc(0);
      if (!dx(0)) break;
      const DType dt = dtype({dx(0), x(0), dy});
      if (op.alpha == 2.0) cuda::pow2_backward(ptr(dx(0)), ptr(x(0)), dyp, n, a, dt, stream);
      else cuda::pow3_backward(ptr(dx(0)), ptr(x(0)), dyp, n, a, dt, stream);
      break;
    }
    case Fn::rms_rsqrt: {
      const std::int64_t C = shape(op.inputs[0]).back();
      const bool a = acc(0);
      if (dx(0))
        cuda::rms_rsqrt_backward(ptr(dx(0)), dyp, ptr(act(y)), n, C, a, dtype({dx(0), dy, act(y)}), stream);
      break;
    }
    case Fn::mul: {
      const bool a0 = acc(0), a1 = acc(1);
      if (!dx(0) && !dx(1)) break;
      const DType dt = dtype({dy, x(0), x(1), dx(0), dx(1)});
      if (a0 == a1 || !dx(0) || !dx(1)) {
        cuda::mul_backward(ptr(dx(0)), ptr(dx(1)), dyp, ptr(x(0)), ptr(x(1)), n, dx(0) ? a0 : a1, dt, stream);
      } else {
        cuda::mul_backward(ptr(dx(0)), nullptr, dyp, ptr(x(0)), ptr(x(1)), n, a0, dt, stream);
        cuda::mul_backward(nullptr, ptr(dx(1)), dyp, ptr(x(0)), ptr(x(1)), n, a1, dt, stream);
      }
      break;
    }
    case Fn::mul_rowscale: {
      const std::int64_t C = shape(y).back();
      const bool a = acc(0);
      if (!dx(0) && !dx(1)) break;
      const DType dt = dtype({dy, x(0), x(1), dx(0), dx(1)});
      if (a || !dx(0) || !dx(1)) {
        cuda::mul_rowscale_backward(ptr(dx(0)), ptr(dx(1)), dyp, ptr(x(0)), ptr(x(1)), n / C, C, dx(0) ? a : true,
                                    dt, stream);
      } else {
        cuda::mul_rowscale_backward(ptr(dx(0)), nullptr, dyp, ptr(x(0)), ptr(x(1)), n / C, C, false, dt, stream);
        cuda::mul_rowscale_backward(nullptr, ptr(dx(1)), dyp, ptr(x(0)), ptr(x(1)), n / C, C, true, dt, stream);
      }
      break;
    }
    case Fn::mul_weight: {
      const std::int64_t C = shape(y).back();
      const bool a = acc(0);
      const Ref w = param(op.params[0]);
      if (!dx(0) && !pg(0)) break;
      const DType dt = dtype({dy, x(0), w, dx(0), pg(0)});
      if (a || !dx(0) || !pg(0)) {
        cuda::mul_weight_backward(ctx, ptr(dx(0)), ptr(pg(0)), dyp, ptr(x(0)), ptr(w), n / C, C, dx(0) ? a : true, dt,
                                  stream);
      } else {
        cuda::mul_weight_backward(ctx, ptr(dx(0)), nullptr, dyp, ptr(x(0)), ptr(w), n / C, C, false, dt, stream);
        cuda::mul_weight_backward(ctx, nullptr, ptr(pg(0)), dyp, ptr(x(0)), ptr(w), n / C, C, true, dt, stream);
      }
      break;
    }
    case Fn::mlp_gelu_tanh: {
      // c_proj's params' gradients; the pre-activation's gradient into the op's temporary (the
      // derivative as the input-gradient product's epilogue, or that product into a second
      // temporary and the GELU's backward kernel); then c_fc's gradients from it.
      const Ref w1 = param(op.params[0]), w2 = param(op.params[2]);
      const Ref pre = act(op.outputs[1]), a = act(op.outputs[2]);
      const Ref gw1 = pg(0), gb1 = pg(1), gw2 = pg(2), gb2 = pg(3);
      const bool ax = acc(0);
      const Ref gx = dx(0);
      const DType dt = dtype({dy, x(0), w1, w2, pre, a, gw1, gb1, gw2, gb2, gx});
      const auto& ws = graph.params[U(op.params[0])].shape;  // (C, F)
      const std::int64_t C = ws[0], F = ws[1], M = n / C;
      const std::vector<void*> t = carve(env, sc.temp);
      void* dpre = part(op, t, 0);
      if (gw2 || gb2) cuda::conv1d_backward(ctx, nullptr, ptr(gw2), ptr(gb2), dyp, ptr(a), ptr(w2), M, C, F, true, dt, stream);
      if (!cuda::conv1d_dgelu_backward(ctx, dpre, dyp, ptr(w2), ptr(pre), M, C, F, dt, stream)) {
        void* da = part(op, t, 1);
        cuda::conv1d_backward(ctx, da, nullptr, nullptr, dyp, ptr(a), ptr(w2), M, C, F, false, dt, stream);
        cuda::gelu_tanh_backward(dpre, ptr(pre), da, M * F, false, dt, stream);
      }
      if (gx && !ax) cuda::conv1d_backward(ctx, ptr(gx), nullptr, nullptr, dpre, ptr(x(0)), ptr(w1), M, F, C, false, dt, stream);
      cuda::conv1d_backward(ctx, gx && ax ? ptr(gx) : nullptr, ptr(gw1), ptr(gb1), dpre, ptr(x(0)), ptr(w1), M, F, C, true,
                            dt, stream);
      break;
    }
    case Fn::gelu: {
      const bool a = acc(0);
      if (dx(0)) cuda::gelu_backward(ptr(dx(0)), ptr(x(0)), dyp, n, a, dtype({dx(0), x(0), dy}), stream);
      break;
    }
    case Fn::gelu_tanh: {
      const bool a = acc(0);
      if (dx(0)) cuda::gelu_tanh_backward(ptr(dx(0)), ptr(x(0)), dyp, n, a, dtype({dx(0), x(0), dy}), stream);
      break;
    }
    case Fn::silu: {
      const bool a = acc(0);
      if (dx(0)) cuda::silu_backward(ptr(dx(0)), ptr(x(0)), dyp, n, a, dtype({dx(0), x(0), dy}), stream);
      break;
    }
    case Fn::relu: {
      const bool a = acc(0);
      if (dx(0)) cuda::relu_backward(ptr(dx(0)), ptr(act(y)), dyp, n, a, dtype({dx(0), act(y), dy}), stream);
      break;
    }
    case Fn::tanh: {
      const bool a = acc(0);
      if (dx(0)) cuda::tanh_backward(ptr(dx(0)), ptr(act(y)), dyp, n, a, dtype({dx(0), act(y), dy}), stream);
      break;
    }
    case Fn::cast: {
      const bool a = acc(0);
      accumulate(env, dx(0), dyp, dy.dt, n, a);
      break;
    }
    case Fn::rope: {
      const auto& s = shape(y);
      const Ref gx = dx(0);
      if (!gx) break;
      const DType dt = dtype({gx, dy, x(1), x(2)});
      void* dxh = part(op, carve(env, sc.temp), 0);
      cuda::rope_backward(dxh, dyp, ptr(x(1)), ptr(x(2)), s[0], s[1], s[2], s[3], false, dt, stream);
      cuda::split_heads_backward(ptr(gx), dxh, s[0], s[2], s[1], s[3], s[1] * s[3], 0, true, dt, stream);
      break;
    }
    case Fn::merge_heads: {
      const auto& s = shape(op.inputs[0]);
      const bool a = acc(0);
      if (dx(0))
        cuda::merge_heads_backward(ptr(dx(0)), dyp, s[0], s[2], s[1], s[3], a, dtype({dx(0), dy}), stream);
      break;
    }
    case Fn::repeat_kv: {
      const Ref gx = dx(0);
      if (!gx) break;
      const auto& ys = shape(y);
      const auto& s = shape(op.inputs[0]);
      const std::int64_t B = ys[0], T = ys[2], D = ys[3], K = s.size() == 4 ? s[1] : s[2] / D;
      const DType dt = dtype({gx, dy});
      if (s.size() == 4) {
        cuda::repeat_kv_backward(ptr(gx), dyp, B, K, ys[1] / K, T, D, true, dt, stream);
      } else {
        void* h = part(op, carve(env, sc.temp), 0);
        cuda::repeat_kv_backward(h, dyp, B, K, ys[1] / K, T, D, false, dt, stream);
        cuda::split_heads_backward(ptr(gx), h, B, T, K, D, s[2], 0, true, dt, stream);
      }
      break;
    }
    case Fn::cross_entropy_fused: {  // from the saved logits and logsumexp, straight into the logits' gradient
      const bool a = acc(0);
      const Ref gx = dx(0);
      if (!gx) break;
      if (!from_loss) fail(op, "a fused cross entropy must produce the graph's loss");
      const Ref logits = x(0);
      const std::int64_t V = shape(op.inputs[0]).back();
      const std::int64_t rows = numel(op.inputs[0]) / V;
      cuda::cross_entropy_backward(ctx, ptr(gx), ptr(logits), static_cast<const float*>(ptr(act(op.outputs[0]))),
                                   ids_of(op, x(1)), rows, V, o.loss_grad(), a, cuda::kIgnoreIndex,
                                   dtype({logits, gx}), stream, models::row_stride(graph.tensors[U(op.inputs[0])]));
      break;
    }
    case Fn::cross_entropy: {
      // nll_loss's and log_softmax's backward fused: dlogits = dloss (exp(logp) - onehot) / count.
      const bool a = acc(0);
      const Ref gx = dx(0);
      if (!gx) break;
      const std::int64_t V = shape(op.outputs[0]).back();
      const std::int64_t rows = numel(op.inputs[0]) / V;
      const Ref logp = act(op.outputs[0]);
      const DType dt = dtype({logp, gx});
      const std::int64_t* targets = ids_of(op, x(1));
      if (from_loss) {
        cuda::log_softmax_nll_backward(ctx, ptr(gx), ptr(logp), targets, rows, V, o.loss_grad(), a,
                                       cuda::kIgnoreIndex, dt, stream);
        break;
      }
      // dloss is on the device (the loss is a sum of losses): the gradient for dloss = 1 into
      // the buffer the program gives the gradient of logp (op.bwd_grads), then scaled by
      // dloss as it accumulates into the logits' gradient.
      const Ref glogp = grad(op.outputs[0]);
      void* own = maybe(op, carve(env, sc.temp), 0);
      void* g = own ? own : ptr(glogp);
      cuda::log_softmax_nll_backward(ctx, g, ptr(logp), targets, rows, V, 1.0f, false, cuda::kIgnoreIndex, dt,
                                     stream);
      const void* dloss = as_dtype(env, sc, dyp, dy.dt, 1, dt);
      cuda::mul_rowscale_backward(ptr(gx), nullptr, g, nullptr, dloss, 1, rows * V, a, dt, stream);
      break;
    }
    case Fn::rope_tables:
    case Fn::extended_mask:
    case Fn::causal_mask: break;  // no gradient
    case Fn::sdpa:
    case Fn::flash_attention: FusedAttention(env, op, o).backward(dy, sc); break;
    case Fn::heads_copy: {
      const auto& ys = shape(y);
      const auto& xs = shape(op.inputs[0]);
      // A 4-D input's gradient whole, or the column block [col, col + X·D) of a (B, T, W) one.
      const bool a = xs.size() == 4 ? acc(0) : o.accumulates(op.inputs[0], {op.col[0], ys[1] * ys[3], xs[2]});
      const Ref gx = dx(0);
      if (!gx) break;
      const DType dt = dtype({gx, dy});
      if (xs.size() == 4) cuda::copy_accumulate(ptr(gx), dyp, n, a, dt, stream);
      else cuda::split_heads_backward(ptr(gx), dyp, ys[0], ys[2], ys[1], ys[3], xs[2], op.col[0], a, dt, stream);
      break;
    }
    case Fn::none: throw std::logic_error(fmt::format("op {} cannot be executed", op.name));
  }
}

}  // namespace zp::exec
