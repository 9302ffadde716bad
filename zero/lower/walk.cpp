#include "zero/lower/walk.hpp"

#include <fmt/format.h>

namespace zp::zero::lowering {

using models::OpId;
using models::ParamId;
using models::TensorId;

Walk::Walk(Context& c, OptimizerLowering& optimizer) : c_(c), opt_(optimizer) {
  const auto& g = c.g;
  ckpt_input_.assign(g.tensors.size(), 0);
  held_.assign(g.tensors.size(), 0);
  for (TensorId t : g.outputs) held_[static_cast<std::size_t>(t)] = 1;
  // torch.utils.checkpoint keeps every tensor argument of the checkpointed layer: the
  // hidden states, and whatever else the layer reads from outside it (BERT's extended
  // attention mask, Llama's rotary cos/sin).
  if (c.ckpt)
    for (const auto& l : g.layers) {
      if (l.input >= 0) ckpt_input_[static_cast<std::size_t>(l.input)] = 1;
      for (OpId o = l.first; o >= 0 && o <= l.last; ++o)
        for (TensorId t : g.ops[static_cast<std::size_t>(o)].inputs) {
          const OpId prod = g.tensors[static_cast<std::size_t>(t)].producer;
          if (prod < l.first || prod > l.last) ckpt_input_[static_cast<std::size_t>(t)] = 1;
        }
    }
}

void Walk::micro_step(int m) {
  MicroState st(c_.g);
  c_.at.micro = m;
  c_.at.boundary = m == c_.gas() - 1;
  c_.at.bucket_seq = 0;
  load_batch(st);
  opt_.begin_micro_step();
  forward(st);
  if (!c_.opt.keep_output) drop_output(st);
  backward(st);
  opt_.end_of_backward();
  // Inputs go when the micro-step's references drop.
  c_.b.begin(EventKind::marker, Stream::compute, Phase::backward, m, "free_batch");
  for (TensorId t : c_.g.inputs) release_tensor(st, t);
  for (std::size_t t = 0; t < st.tensor_buf.size(); ++t)
    if (st.tensor_buf[t] >= 0) release_tensor(st, static_cast<TensorId>(t));
}

// The batch arrives (ids, labels, masks): each input tensor (its graph shape, its dtype).
void Walk::load_batch(MicroState& st) {
  Builder& b = c_.b;
  b.begin(EventKind::copy, Stream::compute, Phase::forward, c_.at.micro, "batch");
  b.cur().src = Placement::host;
  b.cur().copy_op = CopyOp::load_batch;
  for (TensorId t : c_.g.inputs) {
    const auto& ten = c_.g.tensors[static_cast<std::size_t>(t)];
    auto& buf = st.tensor_buf[static_cast<std::size_t>(t)];
    buf = b.buffer(Category::activations, Placement::device, BufferRole::activation, ten.dtype,
                   ten.bytes.v / dtype_size(ten.dtype), c_.names.tensor(t), t);
    b.alloc(buf);
    b.cur().mem_bytes += ten.bytes;
  }
}

void Walk::drop_output(MicroState& st) {
  bool any = false;
  for (TensorId t : c_.g.outputs) {
    if (st.tensor_buf[static_cast<std::size_t>(t)] < 0 || kept_for_backward(t, false)) continue;
    if (!any) c_.b.begin(EventKind::marker, Stream::compute, Phase::forward, c_.at.micro, "drop_output");
    any = true;
    release_tensor(st, t);
  }
}

void Walk::release_tensor(MicroState& st, TensorId t) {
  auto& buf = st.tensor_buf[static_cast<std::size_t>(t)];
  if (buf >= 0) {
    c_.b.free(buf);
    buf = -1;
  }
}

bool Walk::in_ckpt_layer(OpId o) const { return c_.ckpt && c_.f.layer_of_op[static_cast<std::size_t>(o)] >= 0; }

bool Walk::is_ckpt_input(TensorId t) const {
  return c_.ckpt && t >= 0 && ckpt_input_[static_cast<std::size_t>(t)] != 0;
}

OpId Walk::layer_last_op(std::int32_t l) const { return c_.g.layers[static_cast<std::size_t>(l)].last; }

// A tensor is kept for backward when an op saves it; under checkpointing, tensors of a
// checkpointed layer are not kept (they are recomputed), except the layer input.
bool Walk::kept_for_backward(TensorId t, bool recomputing) const {
  const OpId saver = c_.f.min_saver[static_cast<std::size_t>(t)];
  if (saver < 0) return false;
  if (!c_.ckpt || recomputing) return true;
  return !in_ckpt_layer(saver);
}

bool Walk::dead_after(TensorId t, OpId o, bool recomputing) const {
  const auto& f = c_.f;
  if (f.last_fwd_use[static_cast<std::size_t>(t)] > o) return false;
  if (t == c_.g.loss) return false;
  if (held_by_output(t) && !recomputing) return false;  // until the caller drops the output
  if (is_ckpt_input(t) && !recomputing) return false;
  if (recomputing) {
    // During recomputation only the layer's own tensors are rebuilt; the layer input
    // belongs to the checkpoint.
    if (is_ckpt_input(t)) return false;
    const OpId saver = f.min_saver[static_cast<std::size_t>(t)];
    return saver < 0 || f.layer_of_op[static_cast<std::size_t>(saver)] != recompute_layer_;
  }
  return !kept_for_backward(t, false);
}

void Walk::forward_op(MicroState& st, OpId o, Phase ph, bool recomputing) {
  const auto& op = c_.g.ops[static_cast<std::size_t>(o)];
  Builder& b = c_.b;
  opt_.before_op(o, ph);
  c_.dispatch(ph);
  Event& e = b.begin(EventKind::compute, Stream::compute, ph, c_.at.micro, c_.names.op(o));
  c_.at.last_compute = e.id;
  e.op = o;
  e.layer = op.layer;
  e.flops = op.fwd_flops;
  e.mem_bytes = op.fwd_bytes;
  opt_.forward_compute(e, op);
  opt_.op_issued(o);
  // Outputs: each tensor as the graph shapes it.
  for (TensorId t : op.outputs) {
    const auto& ten = c_.g.tensors[static_cast<std::size_t>(t)];
    const BufferId id = b.buffer(Category::activations, Placement::device, BufferRole::activation, ten.dtype,
                                 ten.bytes.v / dtype_size(ten.dtype), c_.names.tensor(t), t);
    b.alloc(id);
    release_tensor(st, t);  // a recomputation replaces a tensor still held from before
    st.tensor_buf[static_cast<std::size_t>(t)] = id;
  }
  // Free inputs/outputs whose last forward use is this op and that nobody keeps.
  for (TensorId t : op.inputs)
    if (st.tensor_buf[static_cast<std::size_t>(t)] >= 0 && dead_after(t, o, recomputing)) release_tensor(st, t);
  for (TensorId t : op.outputs)
    if (st.tensor_buf[static_cast<std::size_t>(t)] >= 0 && dead_after(t, o, recomputing)) release_tensor(st, t);
  // Recomputation: outputs that leave the layer are not needed again.
  if (recomputing)
    for (TensorId t : op.outputs) {
      const OpId saver = c_.f.min_saver[static_cast<std::size_t>(t)];
      const bool saved_here = saver >= 0 && c_.f.layer_of_op[static_cast<std::size_t>(saver)] == recompute_layer_;
      const bool used_here = c_.f.last_fwd_use[static_cast<std::size_t>(t)] <= layer_last_op(recompute_layer_);
      if (!saved_here && !used_here && st.tensor_buf[static_cast<std::size_t>(t)] >= 0) release_tensor(st, t);
    }
  opt_.after_op(o, ph);
}

void Walk::forward(MicroState& st) {
  for (const auto& op : c_.g.ops) forward_op(st, op.id, Phase::forward, false);
}

void Walk::recompute_layer(MicroState& st, std::int32_t layer) {
  recompute_layer_ = layer;
  const auto& span = c_.g.layers[static_cast<std::size_t>(layer)];
  for (OpId r = span.first; r <= span.last; ++r) forward_op(st, r, Phase::recompute, true);
}

// The checkpoint drops the layer input once the layer's backward is done, unless an op
// before the layer still saves it for its own backward.
void Walk::release_checkpoint(MicroState& st, std::int32_t layer) {
  const auto& span = c_.g.layers[static_cast<std::size_t>(layer)];
  c_.b.begin(EventKind::marker, Stream::compute, Phase::backward, c_.at.micro,
             c_.b.cached(LabelKind::checkpoint_release, layer, [&] { return fmt::format("layer{}.checkpoint_release", layer); }));
  const TensorId in = span.input;
  const OpId saver = in >= 0 ? c_.f.min_saver[static_cast<std::size_t>(in)] : -1;
  if (in >= 0 && (saver < 0 || saver >= span.first)) release_tensor(st, in);
  recompute_layer_ = -1;
}

void Walk::backward(MicroState& st) {
  const auto nops = static_cast<OpId>(c_.g.ops.size());
  for (OpId o = nops - 1; o >= 0; --o) {
    const std::int32_t layer = c_.f.layer_of_op[static_cast<std::size_t>(o)];
    if (c_.ckpt && layer >= 0 && o == layer_last_op(layer)) recompute_layer(st, layer);
    backward_op(st, o);
    if (c_.ckpt && layer >= 0 && o == c_.g.layers[static_cast<std::size_t>(layer)].first) release_checkpoint(st, layer);
  }
}

void Walk::backward_op(MicroState& st, OpId o) {
  const auto& op = c_.g.ops[static_cast<std::size_t>(o)];
  const auto& f = c_.f;
  Builder& b = c_.b;
  opt_.before_op(o, Phase::backward);
  c_.dispatch(Phase::backward);
  // A sum passing its output's gradient on (PyTorch's AddBackward0): no kernel; both inputs'
  // gradients are that buffer, freed when the last of them has been consumed.
  // Only a gradient no other tensor still holds is passed on: adding into the first input's
  // would change the others' (a sum whose output was itself passed a gradient another
  // operand's producer has not read yet).
  const BufferId yb = st.grad_buf[static_cast<std::size_t>(op.outputs[0])];
  const auto held = st.grad_shares.find(yb);
  const bool passes = f.passes_gradient[static_cast<std::size_t>(o)] != 0 && yb >= 0 &&
                      (held == st.grad_shares.end() || held->second == 1) &&
                      st.grad_buf[static_cast<std::size_t>(op.inputs[0])] < 0 &&
                      st.grad_buf[static_cast<std::size_t>(op.inputs[1])] < 0;
  Event& e = b.begin(passes ? EventKind::marker : EventKind::compute, Stream::compute, Phase::backward, c_.at.micro,
                     c_.names.op(o));
  if (!passes) c_.at.last_compute = e.id;
  e.op = o;
  e.layer = op.layer;
  e.flops = passes ? Flops{} : op.bwd_flops;
  e.mem_bytes = passes ? Bytes{} : op.bwd_bytes;
  e.passes_gradient = passes;
  if (passes) {
    auto& y = st.grad_buf[static_cast<std::size_t>(op.outputs[0])];
    st.grad_buf[static_cast<std::size_t>(op.inputs[0])] = y;
    st.grad_buf[static_cast<std::size_t>(op.inputs[1])] = y;
    st.grad_shares[y] = 2;
    y = -1;
  }
  opt_.op_issued(o);
  // Gradients of outputs that live only inside this backward (cross_entropy: the
  // log-probabilities'), freed with the output gradients below. They come first: autograd
  // runs nll_loss's backward, which makes the gradient of logp, before log_softmax's, which
  // makes the gradient of the logits (the caching allocator sees them in that order).
  for (TensorId t : op.bwd_grads) {
    auto& gb = st.grad_buf[static_cast<std::size_t>(t)];
    if (gb >= 0) continue;
    const auto& ten = c_.g.tensors[static_cast<std::size_t>(t)];
    gb = b.buffer(Category::temporaries, Placement::device, BufferRole::activation_grad, ten.dtype,
                  ten.bytes.v / dtype_size(ten.dtype), c_.names.tensor_grad(t), t);
    b.alloc(gb);
  }
  // Gradients of the inputs, shaped as the inputs. Where several consumers contribute,
  // autograd stores the first and adds each later one into it by a kernel of its own
  // (Event::grad_adds), with two exceptions:
  // - consumers that read a (B, T, W) tensor as heads (GPT-2's attention and cache copies of
  //   c_attn's q, k and v column blocks) take views of one split, whose backward assembles
  //   their gradients without an add: together they are one contribution;
  // - a sum passing its gradient on adds nothing.
  // Inside an op the graph keeps whole, the adds its eager form makes are counted too: RoPE's
  // q * cos + rotate_half(q) * sin reads q three times (itself and rotate_half's two slices),
  // two adds of q's size.
  if (!passes && op.kind == models::OpKind::rope && !op.inputs.empty() &&
      f.requires_grad[static_cast<std::size_t>(op.inputs[0])]) {
    Event& cur = b.cur();
    cur.grad_adds += 2;
    cur.grad_add_bytes.v += 2 * c_.g.tensors[static_cast<std::size_t>(op.inputs[0])].bytes.v;
  }
  const bool reads_heads = op.fn == models::Fn::heads_copy || op.fn == models::Fn::sdpa ||
                           op.fn == models::Fn::flash_attention || op.fn == models::Fn::attn_scores ||
                           op.fn == models::Fn::attn_context;
  for (TensorId t : op.inputs) {
    if (!f.requires_grad[static_cast<std::size_t>(t)]) continue;
    const auto& ten = c_.g.tensors[static_cast<std::size_t>(t)];
    auto& gb = st.grad_buf[static_cast<std::size_t>(t)];
    const bool view = reads_heads && ten.shape.size() == 3;
    auto& split_seen = st.split_grad[static_cast<std::size_t>(t)];
    // A tensor made from nothing that requires a gradient (RoPE's cos and sin tables, the
    // causal mask) gets none in PyTorch, so nothing is added into it.
    const models::Op& maker = c_.g.ops[static_cast<std::size_t>(ten.producer)];
    const bool constant = maker.inputs.empty() && maker.params.empty();
    if (gb >= 0 && !passes && !constant && !(view && split_seen)) {
      Event& cur = b.cur();
      ++cur.grad_adds;
      cur.grad_add_bytes.v += ten.bytes.v;
    }
    if (view) split_seen = 1;
    if (gb < 0) {
      gb = b.buffer(Category::temporaries, Placement::device, BufferRole::activation_grad, ten.dtype,
                    ten.bytes.v / dtype_size(ten.dtype), c_.names.tensor_grad(t), t);
      b.alloc(gb);
    }
  }
  // The backward kernel's own temporaries, freed when it ends.
  for (TensorId t : op.bwd_scratch) {
    const auto& ten = c_.g.tensors[static_cast<std::size_t>(t)];
    const BufferId id = b.buffer(Category::temporaries, Placement::device, BufferRole::op_scratch, ten.dtype,
                                 ten.bytes.v / dtype_size(ten.dtype), c_.names.tensor(t), t);
    b.alloc(id);
    b.free(id);
  }
  // Parameter gradients.
  for (ParamId p : op.params) opt_.grad_produced(st, p, o);
  // What this backward consumed: saved tensors whose earliest saver is this op (unless the
  // output the caller keeps references them), and the gradient of outputs produced here.
  const bool kept_output = c_.opt.keep_output;
  for (TensorId t : op.saved)
    if (f.min_saver[static_cast<std::size_t>(t)] == o && (!is_ckpt_input(t) || !in_ckpt_layer(o)) &&
        !(kept_output && held_by_output(t)))
      release_tensor(st, t);
  for (TensorId t : op.outputs) {
    auto& gb = st.grad_buf[static_cast<std::size_t>(t)];
    if (gb >= 0) {
      auto shared = st.grad_shares.find(gb);
      if (shared == st.grad_shares.end() || --shared->second == 0) {
        if (shared != st.grad_shares.end()) st.grad_shares.erase(shared);
        b.free(gb);
      }
      gb = -1;
    }
    if (t == c_.g.loss) release_tensor(st, t);
  }
  opt_.after_op(o, Phase::backward);
  // Gradient hooks of params whose last contribution was this op (the wrappers that install
  // hooks put their Python on the host: Context::host_hook).
  for (ParamId p : f.ready_at_op[static_cast<std::size_t>(o)]) opt_.grad_hook(st, p);
}

}  // namespace zp::zero::lowering
