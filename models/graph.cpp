// Op graphs of BERT, GPT-2 and Llama-like models, following what PyTorch eager autograd
// saves for the Hugging Face implementation of each family. Attention comes in three
// variants, each built by its own branch in gpt2_block, bert_layer and llama_layer:
//   eager              Builder::bmm + softmax + dropout + bmm: probabilities saved (s² terms)
//   sdpa               Builder::sdpa: q, k, v, output, logsumexp and rng_state saved; the
//                      output is already (B, T, H·D): no merge_heads copy after it
//   flash_attention_2  Builder::flash_attention: q, k, v (k and v not repeated), output,
//                      logsumexp and rng_state saved; no merge_heads copy after it
// Decoder models with a KV cache (GraphOptions::transformers v5, use_cache, no gradient
// checkpointing) copy k and v into the cache (Builder::heads_copy) and attention reads the
// copies (models/transformers.hpp).
//
// Notation in shape comments: B micro-batch, T sequence, C hidden, A heads, K kv heads,
// D head_dim, F MLP width, V vocabulary.
#include "models/graph.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/row_pitch.hpp"

namespace zp::models {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::embedding: return "embedding";
    case OpKind::linear: return "linear";
    case OpKind::bmm: return "bmm";
    case OpKind::layernorm: return "layernorm";
    case OpKind::rmsnorm: return "rmsnorm";
    case OpKind::softmax: return "softmax";
    case OpKind::dropout: return "dropout";
    case OpKind::gelu: return "gelu";
    case OpKind::gelu_tanh: return "gelu_tanh";
    case OpKind::relu: return "relu";
    case OpKind::silu: return "silu";
    case OpKind::tanh: return "tanh";
    case OpKind::pow: return "pow";
    case OpKind::add: return "add";
    case OpKind::mul: return "mul";
    case OpKind::scale: return "scale";
    case OpKind::cast: return "cast";
    case OpKind::rope: return "rope";
    case OpKind::copy: return "copy";
    case OpKind::cross_entropy: return "cross_entropy";
  }
  return "?";
}

const std::vector<std::string>& op_kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (int k = 0; k < kNumOpKinds; ++k) n.emplace_back(op_kind_name(static_cast<OpKind>(k)));
    return n;
  }();
  return names;
}

std::optional<OpKind> op_kind_from_name(std::string_view name) {
  const auto& n = op_kind_names();
  for (std::size_t k = 0; k < n.size(); ++k)
    if (name == n[k]) return static_cast<OpKind>(k);
  return std::nullopt;
}

const std::vector<KernelVariantInfo>& kernel_variants() {
  static const std::vector<KernelVariantInfo> all = {
      {"fused_gelu", "--fused-gelu",
       "GPT-2's gelu_new as one fused GELU op saving only its input (zeroplan's kernel variant; DeepSpeed on HF's "
       "model runs eight ops)",
       &KernelVariants::fused_gelu},
      {"fused_loss", "--fused-loss",
       "a causal LM's loss as one fused cross entropy on the logits in their dtype, saving them and a logsumexp "
       "per row, the logits' rows padded to whole 16 bytes (zeroplan's kernel variant; HF upcasts the logits to "
       "fp32 and saves fp32 log-probabilities)",
       &KernelVariants::fused_loss},
      {"fused_residual_norm", "--fused-residual-norm",
       "a dropout, the residual sum after it and the LayerNorm of the sum as one op (two a layer in BERT and GPT-2; "
       "GPT-2's ln_2 alone under activation checkpointing), saving what HF's three save (zeroplan's kernel variant; "
       "HF runs three kernels)",
       &KernelVariants::fused_residual_norm},
      {"fused_mlp", "--fused-mlp",
       "GPT-2's MLP (c_fc, the tanh-form GELU, c_proj) as one op whose products carry the GELU and its gradient as "
       "cuBLASLt epilogues, saving what c_fc, --fused-gelu's one GELU op and c_proj save (zeroplan's kernel "
       "variant; HF runs the products and the GELU's eight ops apart; models with another activation keep their MLP)",
       &KernelVariants::fused_mlp},
  };
  return all;
}

const char* fn_name(Fn f) {
  switch (f) {
    case Fn::none: return "none";
    case Fn::embedding: return "embedding";
    case Fn::position_embedding: return "position_embedding";
    case Fn::linear: return "linear";
    case Fn::conv1d: return "conv1d";
    case Fn::linear_first_token: return "linear_first_token";
    case Fn::attn_scores: return "attn_scores";
    case Fn::attn_context: return "attn_context";
    case Fn::scale: return "scale";
    case Fn::add: return "add";
    case Fn::add_scalar: return "add_scalar";
    case Fn::causal_where: return "causal_where";
    case Fn::add_mask: return "add_mask";
    case Fn::softmax: return "softmax";
    case Fn::dropout: return "dropout";
    case Fn::layernorm: return "layernorm";
    case Fn::pow: return "pow";
    case Fn::rms_rsqrt: return "rms_rsqrt";
    case Fn::mul: return "mul";
    case Fn::mul_rowscale: return "mul_rowscale";
    case Fn::mul_weight: return "mul_weight";
    case Fn::gelu: return "gelu";
    case Fn::gelu_tanh: return "gelu_tanh";
    case Fn::relu: return "relu";
    case Fn::silu: return "silu";
    case Fn::tanh: return "tanh";
    case Fn::cast: return "cast";
    case Fn::rope_tables: return "rope_tables";
    case Fn::rope: return "rope";
    case Fn::merge_heads: return "merge_heads";
    case Fn::repeat_kv: return "repeat_kv";
    case Fn::extended_mask: return "extended_mask";
    case Fn::causal_mask: return "causal_mask";
    case Fn::cross_entropy: return "cross_entropy";
    case Fn::sdpa: return "sdpa";
    case Fn::flash_attention: return "flash_attention";
    case Fn::cross_entropy_fused: return "cross_entropy_fused";
    case Fn::heads_copy: return "heads_copy";
    case Fn::dropout_add_layernorm: return "dropout_add_layernorm";
    case Fn::mlp_gelu_tanh: return "mlp_gelu_tanh";
  }
  return "?";
}

namespace {

using Shape = std::vector<std::int64_t>;

std::int64_t numel_of(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

// Tensors and params larger than this (1 PiB) are not simulated: sizes that large only
// come from inputs out of any real range, and their products would overflow int64.
constexpr std::int64_t kMaxTensorBytes = std::int64_t{1} << 50;

std::int64_t checked_bytes(const Shape& s, std::int64_t elem, const std::string& what) {
  std::int64_t n = elem;
  for (const std::int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxTensorBytes)
      throw InputError("--micro-batch/--seq-len", "",
                       fmt::format("{} would exceed {} bytes: the model or batch is too large to simulate", what,
                                   kMaxTensorBytes));
  return n;
}

// A per-token statistic kept with keepdim (LayerNorm mean/rstd, RMSNorm rsqrt): (B, T, 1).
bool is_per_token_stat(const Tensor& t) { return t.shape.size() >= 2 && t.shape.back() == 1; }

// Forward / backward FLOPs per element for the non-GEMM ops (small constants).
struct PerElement {
  double fwd, bwd;
};
PerElement per_element(OpKind k) {
  switch (k) {
    case OpKind::add: return {1, 1};
    case OpKind::mul: return {1, 2};
    case OpKind::scale: return {1, 1};
    case OpKind::dropout: return {2, 2};
    case OpKind::gelu: return {8, 12};
    case OpKind::gelu_tanh: return {8, 12};
    case OpKind::relu: return {1, 1};
    case OpKind::silu: return {4, 8};
    case OpKind::tanh: return {4, 3};
    case OpKind::pow: return {1, 2};
    case OpKind::softmax: return {5, 4};
    case OpKind::layernorm: return {8, 12};
    case OpKind::rmsnorm: return {3, 3};
    case OpKind::rope: return {3, 3};
    case OpKind::cross_entropy: return {5, 3};
    case OpKind::embedding:
    case OpKind::cast:
    case OpKind::copy:
    case OpKind::linear:
    case OpKind::bmm: return {0, 0};
  }
  return {0, 0};
}

class Builder {
 public:
  explicit Builder(OpGraph& g) : g_(g), act_(g.opt.act_dtype), dsz_(dtype_size(g.opt.act_dtype)) {}

  DType act() const { return act_; }
  Attention attention() const { return g_.opt.attention; }
  bool kv_cache() const { return g_.kv_cache; }
  bool fused_residual_norm() const { return g_.opt.variants.fused_residual_norm; }
  bool fused_mlp() const { return g_.opt.variants.fused_mlp; }
  bool gradient_checkpointing() const { return g_.opt.gradient_checkpointing; }
  Transformers transformers() const { return g_.opt.transformers; }
  // A tensor the model's output object references (OpGraph::outputs).
  void output(TensorId t) { g_.outputs.push_back(t); }
  const Tensor& T(TensorId t) const { return g_.tensors.at(static_cast<std::size_t>(t)); }

  // ---- parameters and modules, in registration order ----
  struct PSpec {
    std::string suffix;
    Shape shape;
  };

  // A module owning `own` params directly, plus `shared` ones registered earlier (tied).
  ModuleId module(const std::string& name, std::int32_t layer, const std::vector<PSpec>& own,
                  bool in_base = true, const std::vector<ParamId>& shared = {}) {
    Module m;
    m.id = static_cast<ModuleId>(g_.modules.size());
    m.name = name;
    m.layer = layer;
    for (const auto& ps : own) {
      Param p;
      p.id = static_cast<ParamId>(g_.params.size());
      p.name = name + "." + ps.suffix;
      p.shape = ps.shape;
      p.numel = checked_bytes(ps.shape, 1, "parameter " + p.name);
      p.module = m.id;
      p.layer = layer;
      p.in_base_model = in_base;
      param_by_name_[p.name] = p.id;
      m.params.push_back(p.id);
      g_.params.push_back(std::move(p));
    }
    m.params.insert(m.params.end(), shared.begin(), shared.end());
    module_by_name_[name] = m.id;
    g_.modules.push_back(std::move(m));
    return m_last();
  }
  ModuleId mod(const std::string& name) const { return module_by_name_.at(name); }
  ParamId param(const std::string& name) const { return param_by_name_.at(name); }
  const Module& M(ModuleId m) const { return g_.modules.at(static_cast<std::size_t>(m)); }

  // ---- layers ----
  void begin_layer(std::int32_t l, TensorId input) {
    layer_ = l;
    prefix_ = fmt::format("layer{}.", l);
    LayerSpan span;
    span.first = static_cast<OpId>(g_.ops.size());
    span.input = input;
    g_.layers.push_back(span);
  }
  void end_layer() {
    g_.layers.back().last = static_cast<OpId>(g_.ops.size()) - 1;
    layer_ = kNone;
    prefix_.clear();
  }

  // ---- tensors ----
  TensorId tensor(const std::string& name, Shape shape, DType dt) {
    Tensor t;
    t.id = static_cast<TensorId>(g_.tensors.size());
    t.name = prefix_ + name;
    t.bytes = Bytes{checked_bytes(shape, dtype_size(dt), "tensor " + t.name)};
    t.shape = std::move(shape);
    t.dtype = dt;
    t.layer = layer_;
    g_.tensors.push_back(std::move(t));
    return g_.tensors.back().id;
  }
  TensorId input(const std::string& name, Shape shape, DType dt) {
    const TensorId t = tensor(name, std::move(shape), dt);
    g_.inputs.push_back(t);
    return t;
  }

  // ---- ops ----
  // Appends `op` (name, kind, module, inputs, outputs, saved, params already set) and fills
  // in the id, layer, producers, and the default FLOPs/bytes of a non-GEMM op.
  // Sets the exact function of the op just emitted (and its constant).
  void tag(Fn f, double alpha = 0.0) {
    g_.ops.back().fn = f;
    g_.ops.back().alpha = alpha;
  }

  OpId emit(Op op, bool default_costs = true) {
    op.id = static_cast<OpId>(g_.ops.size());
    if (op.fn == Fn::dropout || op.fn == Fn::sdpa || op.fn == Fn::flash_attention ||
        (op.fn == Fn::dropout_add_layernorm && op.p > 0.0))
      op.rng_stream = rng_streams_++;
    op.name = prefix_ + op.name;
    op.layer = layer_;
    for (TensorId t : op.outputs) g_.tensors[static_cast<std::size_t>(t)].producer = op.id;
    if (default_costs) elementwise_costs(op);
    g_.ops.push_back(std::move(op));
    return g_.ops.back().id;
  }

  // A non-GEMM op with one main output of `shape`/`dt`; returns that output.
  TensorId simple(const std::string& name, OpKind kind, std::vector<TensorId> in, Shape shape, DType dt,
                  std::vector<TensorId> saved_in, bool save_output = false, ModuleId m = kNone,
                  std::vector<ParamId> params = {}) {
    const TensorId y = tensor(name, std::move(shape), dt);
    Op op;
    op.name = name;
    op.kind = kind;
    op.module = m;
    op.inputs = std::move(in);
    op.outputs = {y};
    op.saved = std::move(saved_in);
    if (save_output) op.saved.push_back(y);
    op.params = std::move(params);
    emit(std::move(op));
    return y;
  }

  // nn.Linear / Conv1D: y = x W^T + b; autograd saves x. `rows` overrides the number of
  // rows the GEMM sees (a view of x, e.g. BERT's pooler on the CLS token).
  TensorId linear(const std::string& name, ModuleId m, TensorId x, std::int64_t in, std::int64_t out,
                  std::optional<Shape> yshape = std::nullopt, Fn fn = Fn::linear) {
    Shape ys = yshape ? *yshape : T(x).shape;
    if (!yshape) ys.back() = out;
    const std::int64_t rows = numel_of(ys) / out;
    const bool bias = M(m).params.size() > 1;
    const TensorId y = tensor(name, ys, act_);
    Op op;
    op.name = name;
    op.kind = OpKind::linear;
    op.fn = yshape && fn == Fn::linear ? Fn::linear_first_token : fn;
    op.module = m;
    op.inputs = {x};
    op.outputs = {y};
    op.saved = {x};
    op.params = M(m).params;
    op.gemms = {Gemm{rows, out, in, 1, bias}};
    const double mnk = static_cast<double>(rows) * static_cast<double>(out) * static_cast<double>(in);
    const double bias_flops = bias ? static_cast<double>(rows * out) : 0.0;
    op.fwd_flops = Flops{2.0 * mnk + bias_flops};
    op.bwd_flops = Flops{4.0 * mnk + bias_flops};
    const std::int64_t xe = rows * in, we = in * out, ye = rows * out, be = bias ? out : 0;
    op.fwd_bytes = Bytes{(xe + we + be + ye) * dsz_};
    // dgrad reads dY, W and writes dX; wgrad reads dY, X and writes dW (and db).
    op.bwd_bytes = Bytes{(2 * ye + 2 * we + 2 * xe + be) * dsz_};
    emit(std::move(op), false);
    return y;
  }

  // KernelVariants::fused_mlp: GPT-2's c_fc (Conv1D, `fc`), the tanh-form GELU and c_proj
  // (`proj`) as one op. Its outputs are c_proj's output, the pre-activation (c_fc's output,
  // rounded from its fp32 sums) and the activation (the GELU of those sums, rounded once); it
  // saves x, the pre-activation and the activation, as c_fc, --fused-gelu's GELU op and c_proj
  // do (HF's eight-op gelu_new saves three (B, T, 4H) tensors more). Its params are
  // both modules' (the op is c_fc's module's: stage 3 fetches them on one visit). Backward: c_proj's
  // gradients, its input gradient (rounded to the activation dtype, as the chain stores it)
  // times the GELU's derivative at the saved pre-activation, rounded: the pre-activation's
  // gradient, the op's own temporary; then c_fc's.
  TensorId mlp_gelu_tanh(const std::string& name, ModuleId fc, ModuleId proj, TensorId x, std::int64_t h,
                         std::int64_t f) {
    Shape ps = T(x).shape;
    ps.back() = f;
    const std::int64_t rows = numel_of(T(x).shape) / h;
    const TensorId y = tensor(name + ".c_proj", T(x).shape, act_);
    const TensorId pre = tensor(name + ".c_fc", ps, act_);
    const TensorId a = tensor(name + ".act", ps, act_);
    Op op;
    op.name = name;
    op.kind = OpKind::linear;
    op.fn = Fn::mlp_gelu_tanh;
    op.module = fc;
    op.inputs = {x};
    op.outputs = {y, pre, a};
    op.saved = {x, pre, a};
    op.params = M(fc).params;
    op.params.insert(op.params.end(), M(proj).params.begin(), M(proj).params.end());
    op.gemms = {Gemm{rows, f, h, 1, true}, Gemm{rows, h, f, 1, true}};
    const double mnk = static_cast<double>(rows) * static_cast<double>(f) * static_cast<double>(h);
    const double pe = static_cast<double>(rows * f);
    // Two products and their biases; the GELU (about 8 operations an element) and its derivative (about 12).
    op.fwd_flops = Flops{4.0 * mnk + pe + static_cast<double>(rows * h) + 8.0 * pe};
    op.bwd_flops = Flops{8.0 * mnk + pe + static_cast<double>(rows * h) + 12.0 * pe};
    const std::int64_t xe = rows * h, we = h * f, fe = rows * f;
    // Forward: x, W1, b1 in; pre and a out; a, W2, b2 in; y out.
    op.fwd_bytes = Bytes{(xe + we + f + 2 * fe + fe + we + h + xe) * dsz_};
    // Backward, counted as linear() counts each product pair (dgrad reads dY and W and writes
    // dX; wgrad reads dY and X and writes dW; the bias): c_proj's, whose dX is the
    // pre-activation's gradient, plus the derivative's epilogue reading pre; then c_fc's.
    op.bwd_bytes = Bytes{((2 * xe + 2 * we + 2 * fe + h) + fe + (2 * fe + 2 * we + 2 * xe + f)) * dsz_};
    emit(std::move(op), false);
    return y;
  }

  // torch.matmul on (batched) attention operands; autograd saves both operands
  // (`saved` names the tensors that own their storage: views keep their base alive).
  TensorId bmm(const std::string& name, std::vector<TensorId> in, std::vector<TensorId> saved, Shape yshape,
               Gemm geo, Fn fn, std::int64_t col0 = 0, std::int64_t col1 = 0) {
    const TensorId y = tensor(name, std::move(yshape), act_);
    Op op;
    op.name = name;
    op.kind = OpKind::bmm;
    op.fn = fn;
    op.col[0] = col0;
    op.col[1] = col1;
    op.inputs = std::move(in);
    op.outputs = {y};
    op.saved = std::move(saved);
    op.gemms = {geo};
    const double f = 2.0 * static_cast<double>(geo.batch) * static_cast<double>(geo.m) *
                     static_cast<double>(geo.n) * static_cast<double>(geo.k);
    op.fwd_flops = Flops{f};
    op.bwd_flops = Flops{2.0 * f};
    const std::int64_t a = geo.batch * geo.m * geo.k, b = geo.batch * geo.k * geo.n, c = geo.batch * geo.m * geo.n;
    op.fwd_bytes = Bytes{(a + b + c) * dsz_};
    op.bwd_bytes = Bytes{2 * (a + b + c) * dsz_};
    emit(std::move(op), false);
    return y;
  }

  // nn.Embedding: saves the indices (an int64 input, or a persistent buffer when ids == kNone).
  TensorId embedding(const std::string& name, ModuleId m, TensorId ids, Shape yshape) {
    const TensorId y = tensor(name, std::move(yshape), act_);
    Op op;
    op.name = name;
    op.kind = OpKind::embedding;
    op.fn = ids != kNone ? Fn::embedding : Fn::position_embedding;
    op.module = m;
    if (ids != kNone) {
      op.inputs = {ids};
      op.saved = {ids};
    }
    op.outputs = {y};
    op.params = M(m).params;
    const std::int64_t ye = numel_of(T(y).shape);
    const std::int64_t table = g_.params[static_cast<std::size_t>(op.params.front())].numel;
    const std::int64_t ide = ids != kNone ? T(ids).bytes.v : 0;
    op.fwd_bytes = Bytes{ide + 2 * ye * dsz_};
    // A dense gradient of the whole table: zero-fill, then scatter-add the rows.
    op.bwd_bytes = Bytes{ide + ye * dsz_ + 2 * table * dsz_};
    op.bwd_flops = Flops{static_cast<double>(ye)};
    emit(std::move(op), false);
    return y;
  }

  // nn.Dropout in training: native_dropout saves its bool mask. p == 0 is a no-op.
  TensorId dropout(const std::string& name, TensorId x, double p) {
    if (p <= 0.0) return x;
    const TensorId y = tensor(name, T(x).shape, T(x).dtype);
    const TensorId mask = tensor(name + ".mask", T(x).shape, DType::b1);
    Op op;
    op.name = name;
    op.kind = OpKind::dropout;
    op.fn = Fn::dropout;
    op.alpha = p;
    op.inputs = {x};
    op.outputs = {y, mask};
    op.saved = {mask};
    emit(std::move(op));
    return y;
  }

  // nn.LayerNorm: native_layer_norm saves its input and the fp32 mean and rstd per token.
  TensorId layernorm(const std::string& name, ModuleId m, TensorId x) {
    Shape stat = T(x).shape;
    stat.back() = 1;
    const TensorId y = tensor(name, T(x).shape, T(x).dtype);
    const TensorId mean = tensor(name + ".mean", stat, DType::fp32);   // (B, T, 1)
    const TensorId rstd = tensor(name + ".rstd", stat, DType::fp32);   // (B, T, 1)
    Op op;
    op.name = name;
    op.kind = OpKind::layernorm;
    op.fn = Fn::layernorm;
    op.alpha = g_.cfg.norm_eps;
    op.module = m;
    op.inputs = {x};
    op.outputs = {y, mean, rstd};
    op.saved = {x, mean, rstd};
    op.params = M(m).params;
    emit(std::move(op));
    return y;
  }

  // KernelVariants::fused_residual_norm: dropout(b) + x, then nn.LayerNorm of the sum, as one
  // op that saves what the three save (the sum, mean and rstd, the mask) and draws the
  // dropout's stream in its place, so its masks are the chain's. The tensors keep the chain's
  // names; the op is named after the LayerNorm. `sum_read_later`: the sum is also a later op's
  // input (a pre-LN block's residual), so its gradient comes into the backward too.
  // Returns y; *sum, when asked, is s.
  TensorId dropout_add_layernorm(const std::string& dropout_name, const std::string& sum_name,
                                 const std::string& name, ModuleId m, TensorId b, TensorId x, double p,
                                 bool sum_read_later, TensorId* sum = nullptr) {
    const Shape shape = T(x).shape;
    Shape stat = shape;
    stat.back() = 1;
    const TensorId y = tensor(name, shape, T(x).dtype);
    const TensorId mean = tensor(name + ".mean", stat, DType::fp32);
    const TensorId rstd = tensor(name + ".rstd", stat, DType::fp32);
    const TensorId s = tensor(sum_name, shape, T(x).dtype);
    Op op;
    op.name = name;
    op.kind = OpKind::layernorm;
    op.fn = Fn::dropout_add_layernorm;
    op.alpha = g_.cfg.norm_eps;
    op.p = p > 0.0 ? p : 0.0;
    op.module = m;
    op.inputs = {b, x};
    op.outputs = {y, mean, rstd, s};
    op.saved = {s, mean, rstd};
    if (op.p > 0.0) {
      const TensorId mask = tensor(dropout_name + ".mask", shape, DType::b1);
      op.outputs.push_back(mask);
      op.saved.push_back(mask);
    }
    op.params = M(m).params;
    elementwise_costs(op);
    // Its backward reads the sum's gradient only where a later op made one.
    if (!sum_read_later) op.bwd_bytes.v -= T(s).bytes.v;
    emit(std::move(op), false);
    if (sum) *sum = s;
    return y;
  }

  // A residual block's tail, LayerNorm(x + dropout(b)): HF's three ops, or with
  // KernelVariants::fused_residual_norm the one above. *sum, when asked, is the sum.
  TensorId residual_layernorm(const std::string& dropout_name, const std::string& sum_name, const std::string& name,
                              ModuleId m, TensorId b, TensorId x, double p, bool sum_read_later,
                              TensorId* sum = nullptr) {
    if (fused_residual_norm()) return dropout_add_layernorm(dropout_name, sum_name, name, m, b, x, p, sum_read_later, sum);
    const TensorId d = dropout(dropout_name, b, p);
    const TensorId s = simple(sum_name, OpKind::add, {d, x}, T(x).shape, act_, {});
    tag(Fn::add);
    if (sum) *sum = s;
    return layernorm(name, m, s);
  }

  // LlamaRMSNorm as Hugging Face writes it:
  //   x32 = x.to(fp32); var = x32.pow(2).mean(-1, keepdim); r = rsqrt(var + eps)
  //   return weight * (x32 * r).to(x.dtype)
  // Saved: x32 (by pow and mul), r (by mul), the 16-bit cast (by the weight multiply).
  // In fp32 both casts are no-ops, so pow saves x itself and the weight multiply x32*r.
  TensorId rmsnorm(const std::string& name, ModuleId m, TensorId x) {
    const Shape shape = T(x).shape;
    Shape stat = shape;
    stat.back() = 1;
    const bool cast = T(x).dtype != DType::fp32;
    TensorId x32 = x;
    if (cast) {
      x32 = simple(name + ".to_fp32", OpKind::cast, {x}, shape, DType::fp32, {}, false, m);
      tag(Fn::cast);
    }
    const TensorId sq = simple(name + ".pow", OpKind::pow, {x32}, shape, DType::fp32, {x32}, false, m);
    tag(Fn::pow, 2.0);
    // mean(-1, keepdim) + eps + rsqrt: one value per token, saved by rsqrt's backward.
    const TensorId r = simple(name + ".rsqrt", OpKind::rmsnorm, {sq}, stat, DType::fp32, {}, true, m);
    tag(Fn::rms_rsqrt, g_.cfg.norm_eps);
    const TensorId y32 = simple(name + ".mul", OpKind::mul, {x32, r}, shape, DType::fp32, {x32, r}, false, m);
    tag(Fn::mul_rowscale);
    TensorId y16 = y32;
    if (cast) {
      y16 = simple(name + ".to_act", OpKind::cast, {y32}, shape, T(x).dtype, {}, false, m);
      tag(Fn::cast);
    }
    const TensorId y = simple(name, OpKind::mul, {y16}, shape, T(x).dtype, {y16}, false, m, M(m).params);
    tag(Fn::mul_weight);
    return y;
  }

  // The MLP activation; what autograd saves depends on how HF writes it.
  TensorId activation(const std::string& name, Act a, TensorId x) {
    const Shape shape = T(x).shape;
    const DType dt = T(x).dtype;
    switch (a) {
      case Act::gelu: { const TensorId y = simple(name, OpKind::gelu, {x}, shape, dt, {x}); tag(Fn::gelu); return y; }
      case Act::gelu_pytorch_tanh: {
        const TensorId y = simple(name, OpKind::gelu_tanh, {x}, shape, dt, {x});
        tag(Fn::gelu_tanh);
        return y;
      }
      case Act::silu: { const TensorId y = simple(name, OpKind::silu, {x}, shape, dt, {x}); tag(Fn::silu); return y; }
      case Act::relu: {
        const TensorId y = simple(name, OpKind::relu, {x}, shape, dt, {}, true);  // saves its result
        tag(Fn::relu);
        return y;
      }
      case Act::gelu_new: {
        if (g_.opt.variants.fused_gelu) {  // KernelVariants::fused_gelu: the same formula as one op
          const TensorId y = simple(name, OpKind::gelu_tanh, {x}, shape, dt, {x});
          tag(Fn::gelu_tanh);
          return y;
        }
        // NewGELUActivation: 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*pow(x, 3))))
        const TensorId half = simple(name + ".half_x", OpKind::scale, {x}, shape, dt, {});
        tag(Fn::scale, 0.5);
        const TensorId cube = simple(name + ".pow3", OpKind::pow, {x}, shape, dt, {x});
        tag(Fn::pow, 3.0);
        const TensorId c3 = simple(name + ".scale_cube", OpKind::scale, {cube}, shape, dt, {});
        tag(Fn::scale, 0.044715);
        const TensorId inner = simple(name + ".add_x", OpKind::add, {x, c3}, shape, dt, {});
        tag(Fn::add);
        const TensorId arg = simple(name + ".scale_sqrt", OpKind::scale, {inner}, shape, dt, {});
        tag(Fn::scale, std::sqrt(2.0 / std::numbers::pi));
        const TensorId th = simple(name + ".tanh", OpKind::tanh, {arg}, shape, dt, {}, true);
        tag(Fn::tanh);
        const TensorId one_p = simple(name + ".one_plus", OpKind::add, {th}, shape, dt, {});
        tag(Fn::add_scalar, 1.0);
        const TensorId y = simple(name, OpKind::mul, {half, one_p}, shape, dt, {half, one_p});
        tag(Fn::mul);
        return y;
      }
    }
    return x;
  }

  // F.scaled_dot_product_attention as transformers calls it, with PyTorch's flash kernel (what
  // it dispatches to on sm80+ for 16-bit q, k, v without a mask): one op that saves q, k, v
  // (the tensors in `saved_qkv` own their storage), its output, the logsumexp (B, A, T) in
  // fp32 and the philox seed and offset (rng_state); dropout is regenerated from them in
  // backward, so no mask is kept. The kernel writes its output in (B, T, A, D) order and
  // returns the (B, A, T, D) transposed view, so transformers' transpose(1, 2).contiguous()
  // copies nothing and the output is the merged (B, T, A·D) tensor o_proj saves. With
  // enable_gqa, k and v keep their `kv` heads. FLOPs are the two GEMMs (4·b·a·s²·d), halved
  // when causal (the kernel skips masked blocks); backward recomputes the scores (2.5×).
  TensorId sdpa(const std::string& name, std::vector<TensorId> in, std::vector<TensorId> saved_qkv,
                std::int64_t b, std::int64_t a, std::int64_t kv, std::int64_t s, std::int64_t d, bool causal,
                double dropout) {
    const TensorId out = tensor(name, {b, s, a * d}, act_);                       // (B, T, A·D)
    const TensorId lse = tensor(name + ".logsumexp", {b, a, s, 1}, DType::fp32);  // (B, A, T, 1)
    const TensorId rng = tensor(name + ".rng_state", {2}, DType::i64);
    Op op;
    op.name = name;
    op.kind = OpKind::bmm;
    op.fn = Fn::sdpa;
    op.alpha = dropout;  // dropout_p on the probabilities (training)
    op.causal = causal;
    op.inputs = std::move(in);
    op.outputs = {out, lse, rng};
    op.saved = std::move(saved_qkv);
    op.saved.insert(op.saved.end(), {out, lse, rng});
    op.gemms = {Gemm{s, s, d, b * a}, Gemm{s, d, s, b * a}};
    const double f = 4.0 * static_cast<double>(b * a) * static_cast<double>(s) * static_cast<double>(s) *
                     static_cast<double>(d) * (causal ? 0.5 : 1.0);
    op.fwd_flops = Flops{f};
    op.bwd_flops = Flops{2.5 * f};
    const std::int64_t qo = 2 * b * a * s * d, kv_el = 2 * b * kv * s * d;
    op.fwd_bytes = Bytes{(qo + kv_el) * dsz_ + b * a * s * 4};
    op.bwd_bytes = Bytes{2 * (qo + kv_el) * dsz_ + b * a * s * 4};
    emit(std::move(op), false);
    return out;
  }

  // A contiguous (B, heads, T, D) copy of a head view of x: columns [col, col + heads·D) of a
  // (B, T, W) tensor, or a whole (B, heads, T, D) tensor. The DynamicCache's update
  // (torch.cat onto an empty tensor) makes one of k and one of v; torch.matmul makes one of
  // an operand whose heads it cannot fold into its batch (GPT-2's strided q). Saves nothing.
  TensorId heads_copy(const std::string& name, TensorId x, std::int64_t heads, std::int64_t col = 0) {
    const Shape& xs = T(x).shape;
    const std::int64_t d = g_.cfg.head_dim;
    const Shape ys = xs.size() == 4 ? xs : Shape{xs[0], heads, xs[1], d};
    const TensorId y = tensor(name, ys, T(x).dtype);
    Op op;
    op.name = name;
    op.kind = OpKind::copy;
    op.fn = Fn::heads_copy;
    op.col[0] = col;
    op.inputs = {x};
    op.outputs = {y};
    const std::int64_t yb = T(y).bytes.v;
    op.fwd_bytes = Bytes{2 * yb};
    op.bwd_bytes = Bytes{3 * yb};  // reads dY, accumulates into the input's gradient
    emit(std::move(op), false);
    return y;
  }

  // flash_attn_func(q, k, v, dropout_p, softmax_scale, causal) as transformers' flash_attention_2
  // path calls it (transformers 5.25: integrations/flash_attention.py transposes the head
  // views to (B, T, H, D), modeling_flash_attention_utils._flash_attention_forward calls
  // flash_attn_func when there is no padding; flash-attn 2.8: FlashAttnFunc.forward):
  //  - k and v keep their K heads: no repeat_kv, flash-attn groups the query heads itself;
  //  - q, k, v are views (last stride 1, so maybe_contiguous copies nothing): the tensors in
  //    `saved_qkv` own their storage and stay alive;
  //  - saved for backward: q, k, v, out_padded, softmax_lse (B, H, T) fp32 and rng_state
  //    (2 int64); nothing of size T²;
  //  - the output (B, T, H, D) is already (B, T, H·D): reshape(...).contiguous() copies
  //    nothing, so no merge_heads op follows and o_proj saves this very tensor.
  // FLOPs: the forward's two GEMMs over the (i, j) pairs attended, T² or, causal, the lower
  // triangle with its diagonal T(T+1)/2: 4·b·a·d·pairs. Backward runs five GEMMs of that
  // size: Q Kᵀ recomputed (P from the logsumexp), dV = Pᵀ dO, dP = dO Vᵀ, dQ = dS K,
  // dK = dSᵀ Q: 2.5× the forward.
  TensorId flash_attention(const std::string& name, std::vector<TensorId> in, std::vector<TensorId> saved_qkv,
                           std::int64_t b, std::int64_t a, std::int64_t kv, std::int64_t s, std::int64_t d,
                           bool causal, double dropout) {
    const TensorId out = tensor(name, {b, s, a * d}, act_);                          // (B, T, A·D)
    const TensorId lse = tensor(name + ".softmax_lse", {b, a, s, 1}, DType::fp32);  // (B, A, T, 1)
    const TensorId rng = tensor(name + ".rng_state", {2}, DType::i64);
    Op op;
    op.name = name;
    op.kind = OpKind::bmm;
    op.fn = Fn::flash_attention;
    op.alpha = dropout;
    op.causal = causal;
    op.inputs = std::move(in);
    op.outputs = {out, lse, rng};
    op.saved = std::move(saved_qkv);
    op.saved.insert(op.saved.end(), {out, lse, rng});
    op.gemms = {Gemm{s, s, d, b * a}, Gemm{s, d, s, b * a}};
    const double pairs = causal ? static_cast<double>(s) * static_cast<double>(s + 1) / 2.0
                                : static_cast<double>(s) * static_cast<double>(s);
    const double f = 4.0 * static_cast<double>(b * a) * static_cast<double>(d) * pairs;
    op.fwd_flops = Flops{f};
    op.bwd_flops = Flops{2.5 * f};
    // Forward reads q, k, v and writes o and the logsumexp. Backward reads q, k, v, o, dO and
    // the logsumexp, writes dq, dk, dv, its fp32 dq accumulator and softmax_d (rowsum(dO∘O));
    // with K < A it writes dk, dv over A heads and sums them down to K.
    const std::int64_t qo = b * s * a * d, kv_el = b * s * kv * d, rows = b * a * s;
    op.fwd_bytes = Bytes{(2 * qo + 2 * kv_el) * dsz_ + rows * 4};
    const std::int64_t expand = kv < a ? 4 * qo : 0;
    op.bwd_bytes = Bytes{(4 * qo + 4 * kv_el + expand) * dsz_ + 2 * qo * 4 + 3 * rows * 4};
    emit(std::move(op), false);
    return out;
  }

  // softmax over the last dimension, saving its output (in `out` dtype: fp32 for Llama's
  // softmax(dtype=float32)). ATen's softmax(x, dim, dtype): a 16-bit x asked for fp32 runs
  // the fused half_to_float kernel for fp16 only; bf16 is first upcast (x.toType(float), a
  // copy whose backward casts the fp32 gradient back). Its CUDA backward (softmax_backward)
  // computes tmp = grad * output, a temporary of the gradient's size and dtype, before
  // grad_input = tmp - output * Σ tmp.
  TensorId softmax(const std::string& name, TensorId x, DType out) {
    const Shape shape = T(x).shape;
    TensorId in = x;
    if (out != T(x).dtype && T(x).dtype == DType::bf16) {
      in = simple(name + "_upcast", OpKind::cast, {x}, shape, out, {});
      tag(Fn::cast);
    }
    const TensorId y = simple(name, OpKind::softmax, {in}, shape, out, {}, true);
    tag(Fn::softmax);
    const TensorId tmp = tensor(name + ".grad_times_output", shape, out);
    g_.ops.back().bwd_scratch = {tmp};
    g_.ops.back().bwd_bytes += Bytes{2 * T(tmp).bytes.v};
    return y;
  }

  // (B, H, T, D) -> (B, T, H·D): transpose(1, 2).contiguous(), a copy that saves nothing.
  TensorId merge_heads(const std::string& name, TensorId ctx, std::int64_t width) {
    const Shape& cs = T(ctx).shape;
    const TensorId y = simple(name, OpKind::copy, {ctx}, {cs[0], cs[2], width}, act_, {});
    tag(Fn::merge_heads);
    return y;
  }

  // A loss op over (rows, classes) logits: outputs {per-row or full-size tensor, the scalar loss}.
  Op& loss_op(const std::string& name, Fn fn, TensorId logits, TensorId labels, TensorId first, TensorId loss,
              std::vector<TensorId> saved) {
    Op op;
    op.name = name;
    op.kind = OpKind::cross_entropy;
    op.fn = fn;
    op.inputs = {logits, labels};
    op.outputs = {first, loss};
    op.saved = std::move(saved);
    emit(std::move(op));
    return g_.ops.back();
  }

  // F.cross_entropy = log_softmax (saves its output) + nll_loss (saves the targets).
  TensorId cross_entropy(const std::string& name, TensorId logits, TensorId labels, std::int64_t classes) {
    const DType dt = T(logits).dtype;
    const std::int64_t rows = numel_of(T(logits).shape) / classes;
    const TensorId logp = tensor(name + ".log_softmax", {rows, classes}, dt);
    const TensorId loss = tensor(name, {}, dt);
    Op& op = loss_op(name, Fn::cross_entropy, logits, labels, logp, loss, {logp, labels});
    op.bwd_grads = {logp};  // nll_loss's backward: the gradient of logp, full size, in its dtype
    // ... which log_softmax's backward reads while it writes the logits' gradient.
    op.bwd_bytes += Bytes{2 * T(logp).bytes.v};
    return loss;
  }

  // KernelVariants::fused_loss: one op reads the logits in their dtype, computes in fp32 and
  // saves them with each row's logsumexp; its backward writes the logits' gradient directly.
  // The logits' rows get a padded pitch (Tensor::row_pitch) where they are not whole 16-byte
  // groups (GPT-2's 50257): the head's products and this op then run aligned kernels.
  TensorId cross_entropy_fused(const std::string& name, TensorId logits, TensorId labels, std::int64_t classes) {
    const std::int64_t rows = numel_of(T(logits).shape) / classes;
    if (Tensor& t = g_.tensors.at(static_cast<std::size_t>(logits)); t.shape.back() == classes) {
      const std::int64_t elem = dtype_size(t.dtype), pitch = padded_row_elements(classes, elem);
      if (pitch != classes) {
        t.row_pitch = pitch;
        t.bytes = Bytes{checked_bytes({rows, pitch}, elem, "tensor " + t.name)};
      }
    }
    const TensorId lse = tensor(name + ".logsumexp", {rows}, DType::fp32);
    const TensorId loss = tensor(name, {}, DType::fp32);
    Op& op = loss_op(name, Fn::cross_entropy_fused, logits, labels, lse, loss, {logits, lse, labels});
    // Its backward adds into the logits' gradient: that buffer is read as well as written.
    op.bwd_bytes += T(logits).bytes;
    return loss;
  }

  // Causal-LM loss as HF's ForCausalLMLoss: logits.float(), labels shifted by padding,
  // cross-entropy over all B*T positions.
  TensorId causal_lm_loss(TensorId logits, TensorId labels, std::int64_t vocab) {
    if (g_.opt.variants.fused_loss) return cross_entropy_fused("loss.cross_entropy", logits, labels, vocab);
    TensorId l = logits;
    if (T(logits).dtype != DType::fp32)
    {
      l = simple("loss.upcast", OpKind::cast, {logits}, T(logits).shape, DType::fp32, {});
      tag(Fn::cast);
    }
    return cross_entropy("loss.cross_entropy", l, labels, vocab);
  }

 private:
  ModuleId m_last() const { return static_cast<ModuleId>(g_.modules.size()) - 1; }

  void elementwise_costs(Op& op) const {
    std::int64_t n = 0, rd = 0, wr = 0, saved = 0, gin = 0, gout = 0;
    for (TensorId t : op.inputs) {
      const Tensor& x = T(t);
      n = std::max(n, numel_of(x.shape));
      rd += x.bytes.v;
      if (is_float(x.dtype)) gin += x.bytes.v;
    }
    for (TensorId t : op.outputs) {
      const Tensor& y = T(t);
      n = std::max(n, numel_of(y.shape));
      wr += y.bytes.v;
      if (is_float(y.dtype) && !is_per_token_stat(y)) gout += y.bytes.v;
    }
    for (TensorId t : op.saved) saved += T(t).bytes.v;
    std::int64_t pbytes = 0;
    for (ParamId p : op.params) pbytes += g_.params[static_cast<std::size_t>(p)].numel * dsz_;
    const PerElement pe = per_element(op.kind);
    op.fwd_flops = Flops{pe.fwd * static_cast<double>(n)};
    op.bwd_flops = Flops{pe.bwd * static_cast<double>(n)};
    op.fwd_bytes = Bytes{rd + wr + pbytes};
    // Backward reads the output gradients and the saved tensors, writes the input
    // gradients, and reads the params / writes their gradients.
    op.bwd_bytes = Bytes{gout + saved + gin + 2 * pbytes};
  }

  OpGraph& g_;
  DType act_;
  std::int64_t dsz_;
  std::int32_t layer_ = kNone;
  std::int32_t rng_streams_ = 0;
  std::string prefix_;
  std::unordered_map<std::string, ModuleId> module_by_name_;
  std::unordered_map<std::string, ParamId> param_by_name_;
};

struct Dims {
  std::int64_t b, s, h, a, kv, d, f, v;
};

Dims dims_of(const OpGraph& g) {
  const ModelConfig& c = g.cfg;
  return Dims{g.opt.micro_batch, g.opt.seq_len, c.hidden, c.heads, c.kv_heads, c.head_dim, c.intermediate, c.vocab};
}

// ------------------------------------------------------------------------------------
// GPT-2 (GPT2LMHeadModel)
// ------------------------------------------------------------------------------------

void gpt2_params(Builder& bd, const ModelConfig& c) {
  const std::int64_t h = c.hidden, f = c.intermediate;
  bd.module("transformer.wte", kNone, {{"weight", {c.vocab, h}}});
  bd.module("transformer.wpe", kNone, {{"weight", {c.max_positions, h}}});
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(c.layers); ++l) {
    const std::string p = fmt::format("transformer.h.{}.", l);
    // Conv1D stores its weight as (in, out).
    bd.module(p + "ln_1", l, {{"weight", {h}}, {"bias", {h}}});
    bd.module(p + "attn.c_attn", l, {{"weight", {h, 3 * h}}, {"bias", {3 * h}}});
    bd.module(p + "attn.c_proj", l, {{"weight", {h, h}}, {"bias", {h}}});
    bd.module(p + "ln_2", l, {{"weight", {h}}, {"bias", {h}}});
    bd.module(p + "mlp.c_fc", l, {{"weight", {h, f}}, {"bias", {f}}});
    bd.module(p + "mlp.c_proj", l, {{"weight", {f, h}}, {"bias", {h}}});
  }
  bd.module("transformer.ln_f", kNone, {{"weight", {h}}, {"bias", {h}}});
  if (c.tie_word_embeddings)
    bd.module("lm_head", kNone, {}, true, {bd.param("transformer.wte.weight")});
  else
    bd.module("lm_head", kNone, {{"weight", {c.vocab, h}}}, false);
}

// The residual stream between GPT-2's layers: x, or with `branch` the sum x + dropout(branch)
// not taken yet (KernelVariants::fused_residual_norm without checkpointing: the MLP's dropout
// and sum are fused with the next LayerNorm, the next layer's ln_1 or ln_f; their tensors are
// named prev_mlp.* in the next layer, transformer.last_mlp.* after the last).
struct Residual {
  TensorId x = kNone, branch = kNone;
};

Residual gpt2_block(Builder& bd, const ModelConfig& c, const Dims& d, std::int32_t l, Residual stream) {
  const std::string p = fmt::format("transformer.h.{}.", l);
  bd.begin_layer(l, stream.x);
  TensorId x = stream.x, y = kNone;
  if (stream.branch != kNone)  // the previous layer's MLP dropout and sum, and this layer's ln_1
    y = bd.dropout_add_layernorm("prev_mlp.dropout", "prev_mlp.residual", "ln_1", bd.mod(p + "ln_1"), stream.branch,
                                 stream.x, c.hidden_dropout, true, &x);
  else
    y = bd.layernorm("ln_1", bd.mod(p + "ln_1"), x);
  const TensorId qkv = bd.linear("attn.c_attn", bd.mod(p + "attn.c_attn"), y, d.h, 3 * d.h, std::nullopt, Fn::conv1d);  // (B, T, 3C)
  // q, k, v are the column blocks [0, C), [C, 2C), [2C, 3C) of qkv, split into heads. With a
  // KV cache, its update copies k and v into contiguous (B, A, T, D) tensors.
  TensorId kc = kNone, vc = kNone;
  if (bd.kv_cache()) {
    kc = bd.heads_copy("attn.cache_k", qkv, d.a, d.h);      // (B, A, T, D)
    vc = bd.heads_copy("attn.cache_v", qkv, d.a, 2 * d.h);  // (B, A, T, D)
    bd.output(kc);
    bd.output(vc);
  }
  // Attention, one variant per case, each ending in the merged (B, T, C) tensor.
  TensorId merged = kNone;
  switch (bd.attention()) {
    case Attention::eager: {
      TensorId sc = kNone;
      if (kc == kNone) {
        // q, k, v are strided views of qkv; each matmul copies the operands it cannot fold
        // into its batch, and saves those: q, k and v, as many bytes as qkv, which is what
        // the matmuls are said to keep alive here.
        sc = bd.bmm("attn.qk", {qkv}, {qkv}, {d.b, d.a, d.s, d.s}, Gemm{d.s, d.s, d.d, d.b * d.a}, Fn::attn_scores, 0,
                    d.h);
      } else {
        // The matmul copies the strided q (and saves the copy); k is the cache's copy.
        const TensorId q = bd.heads_copy("attn.q_contiguous", qkv, d.a, 0);  // (B, A, T, D)
        sc = bd.bmm("attn.qk", {q, kc}, {q, kc}, {d.b, d.a, d.s, d.s}, Gemm{d.s, d.s, d.d, d.b * d.a},
                    Fn::attn_scores);
      }
      sc = bd.simple("attn.scale", OpKind::scale, {sc}, {d.b, d.a, d.s, d.s}, bd.act(), {});
      bd.tag(Fn::scale, 1.0 / std::sqrt(static_cast<double>(d.d)));
      // torch.where(bias[..., :T, :T], w, min): the condition is a persistent buffer.
      sc = bd.simple("attn.causal_mask", OpKind::add, {sc}, {d.b, d.a, d.s, d.s}, bd.act(), {});
      bd.tag(Fn::causal_where);
      const TensorId probs = bd.softmax("attn.softmax", sc, bd.act());
      const TensorId pd = bd.dropout("attn.attn_dropout", probs, c.attention_dropout);
      const TensorId ctx =
          vc == kNone ? bd.bmm("attn.pv", {pd, qkv}, {pd, qkv}, {d.b, d.a, d.s, d.d}, Gemm{d.s, d.d, d.s, d.b * d.a},
                               Fn::attn_context, 0, 2 * d.h)
                      : bd.bmm("attn.pv", {pd, vc}, {pd, vc}, {d.b, d.a, d.s, d.d}, Gemm{d.s, d.d, d.s, d.b * d.a},
                               Fn::attn_context);
      // attn_output.transpose(1, 2).reshape(...).contiguous(): a copy.
      merged = bd.merge_heads("attn.merge_heads", ctx, d.h);
      break;
    }
    case Attention::sdpa:
    case Attention::flash_attention_2: {
      // q is a strided view of qkv (the kernels take it as it is: last stride 1), so qkv stays
      // alive; k and v are qkv's too, or the cache's copies. The output is the merged tensor.
      const std::vector<TensorId> in = kc == kNone ? std::vector<TensorId>{qkv} : std::vector<TensorId>{qkv, kc, vc};
      merged = bd.attention() == Attention::sdpa
                   ? bd.sdpa("attn.sdpa", in, in, d.b, d.a, d.a, d.s, d.d, true, c.attention_dropout)
                   : bd.flash_attention("attn.flash_attn", in, in, d.b, d.a, d.a, d.s, d.d, true, c.attention_dropout);
      break;
    }
  }
  TensorId o = bd.linear("attn.c_proj", bd.mod(p + "attn.c_proj"), merged, d.h, d.h, std::nullopt, Fn::conv1d);
  // The sum is the MLP's residual too.
  TensorId x2 = kNone;
  const TensorId y2 = bd.residual_layernorm("attn.resid_dropout", "attn.residual", "ln_2", bd.mod(p + "ln_2"), o, x,
                                            c.hidden_dropout, true, &x2);
  TensorId m = kNone;
  if (bd.fused_mlp() && (c.act == Act::gelu_new || c.act == Act::gelu_pytorch_tanh)) {
    m = bd.mlp_gelu_tanh("mlp", bd.mod(p + "mlp.c_fc"), bd.mod(p + "mlp.c_proj"), y2, d.h, d.f);
  } else {
    const TensorId fc = bd.linear("mlp.c_fc", bd.mod(p + "mlp.c_fc"), y2, d.h, d.f, std::nullopt, Fn::conv1d);  // (B, T, F)
    const TensorId g = bd.activation("mlp.act", c.act, fc);
    m = bd.linear("mlp.c_proj", bd.mod(p + "mlp.c_proj"), g, d.f, d.h, std::nullopt, Fn::conv1d);
  }
  // The MLP's dropout and sum go with the next LayerNorm, unless checkpointing recomputes the
  // layers apart (an op of two layers' would be in neither's recomputation).
  if (bd.fused_residual_norm() && !bd.gradient_checkpointing()) {
    bd.end_layer();
    return {x2, m};
  }
  m = bd.dropout("mlp.dropout", m, c.hidden_dropout);
  const TensorId out = bd.simple("mlp.residual", OpKind::add, {x2, m}, {d.b, d.s, d.h}, bd.act(), {});
  bd.tag(Fn::add);
  bd.end_layer();
  return {out, kNone};
}

void gpt2_graph(Builder& bd, OpGraph& g) {
  const ModelConfig& c = g.cfg;
  const Dims d = dims_of(g);
  gpt2_params(bd, c);
  const TensorId ids = bd.input("input_ids", {d.b, d.s}, DType::i64);
  const TensorId labels = bd.input("labels", {d.b, d.s}, DType::i64);
  const TensorId tok = bd.embedding("transformer.wte", bd.mod("transformer.wte"), ids, {d.b, d.s, d.h});
  // position_ids = arange(T)[None]: (1, T, C) broadcast over the batch.
  const TensorId pos = bd.embedding("transformer.wpe", bd.mod("transformer.wpe"), kNone, {1, d.s, d.h});
  TensorId x = bd.simple("transformer.embed_add", OpKind::add, {tok, pos}, {d.b, d.s, d.h}, bd.act(), {});
  bd.tag(Fn::add);
  x = bd.dropout("transformer.drop", x, c.embedding_dropout);
  Residual r{x, kNone};
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(c.layers); ++l) r = gpt2_block(bd, c, d, l, r);
  if (r.branch != kNone)  // the last layer's MLP dropout and sum, and ln_f
    x = bd.dropout_add_layernorm("transformer.last_mlp.dropout", "transformer.last_mlp.residual", "transformer.ln_f",
                                 bd.mod("transformer.ln_f"), r.branch, r.x, c.hidden_dropout, false);
  else
    x = bd.layernorm("transformer.ln_f", bd.mod("transformer.ln_f"), r.x);
  const TensorId logits = bd.linear("lm_head", bd.mod("lm_head"), x, d.h, d.v);  // (B, T, V)
  bd.output(logits);
  g.loss = bd.causal_lm_loss(logits, labels, d.v);
}

// ------------------------------------------------------------------------------------
// BERT (BertForPreTraining / BertForMaskedLM)
// ------------------------------------------------------------------------------------

void bert_params(Builder& bd, const ModelConfig& c) {
  const std::int64_t h = c.hidden, f = c.intermediate;
  const std::vector<Builder::PSpec> ln{{"weight", {h}}, {"bias", {h}}};
  bd.module("bert.embeddings.word_embeddings", kNone, {{"weight", {c.vocab, h}}});
  bd.module("bert.embeddings.position_embeddings", kNone, {{"weight", {c.max_positions, h}}});
  bd.module("bert.embeddings.token_type_embeddings", kNone, {{"weight", {c.type_vocab, h}}});
  bd.module("bert.embeddings.LayerNorm", kNone, ln);
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(c.layers); ++l) {
    const std::string p = fmt::format("bert.encoder.layer.{}.", l);
    bd.module(p + "attention.self.query", l, {{"weight", {h, h}}, {"bias", {h}}});
    bd.module(p + "attention.self.key", l, {{"weight", {h, h}}, {"bias", {h}}});
    bd.module(p + "attention.self.value", l, {{"weight", {h, h}}, {"bias", {h}}});
    bd.module(p + "attention.output.dense", l, {{"weight", {h, h}}, {"bias", {h}}});
    bd.module(p + "attention.output.LayerNorm", l, ln);
    bd.module(p + "intermediate.dense", l, {{"weight", {f, h}}, {"bias", {f}}});
    bd.module(p + "output.dense", l, {{"weight", {h, f}}, {"bias", {h}}});
    bd.module(p + "output.LayerNorm", l, ln);
  }
  const bool pretraining = c.head == Head::bert_pretraining;
  if (pretraining) bd.module("bert.pooler.dense", kNone, {{"weight", {h, h}}, {"bias", {h}}});
  // BertLMPredictionHead registers its own `bias` before its children; decoder.bias is
  // the same Parameter, decoder.weight is tied to the word embeddings.
  bd.module("cls.predictions", kNone, {{"bias", {c.vocab}}}, false);
  bd.module("cls.predictions.transform.dense", kNone, {{"weight", {h, h}}, {"bias", {h}}}, false);
  bd.module("cls.predictions.transform.LayerNorm", kNone, ln, false);
  const ParamId bias = bd.param("cls.predictions.bias");
  if (c.tie_word_embeddings)
    bd.module("cls.predictions.decoder", kNone, {}, false, {bd.param("bert.embeddings.word_embeddings.weight"), bias});
  else
    bd.module("cls.predictions.decoder", kNone, {{"weight", {c.vocab, h}}}, false, {bias});
  if (pretraining) bd.module("cls.seq_relationship", kNone, {{"weight", {2, h}}, {"bias", {2}}}, false);
}

TensorId bert_layer(Builder& bd, const ModelConfig& c, const Dims& d, std::int32_t l, TensorId x, TensorId mask) {
  const std::string p = fmt::format("bert.encoder.layer.{}.", l);
  const Shape bash{d.b, d.a, d.s, d.s};
  bd.begin_layer(l, x);
  // Q, K and V each save the same input x.
  const TensorId q = bd.linear("attention.self.query", bd.mod(p + "attention.self.query"), x, d.h, d.h);
  const TensorId k = bd.linear("attention.self.key", bd.mod(p + "attention.self.key"), x, d.h, d.h);
  const TensorId v = bd.linear("attention.self.value", bd.mod(p + "attention.self.value"), x, d.h, d.h);
  // Attention, one variant per case, each ending in the merged (B, T, C) tensor.
  TensorId merged = kNone;
  switch (bd.attention()) {
    case Attention::eager: {
      TensorId sc = bd.bmm("attention.self.scores", {q, k}, {q, k}, bash, Gemm{d.s, d.s, d.d, d.b * d.a},
                           Fn::attn_scores);
      sc = bd.simple("attention.self.scale", OpKind::scale, {sc}, bash, bd.act(), {});
      bd.tag(Fn::scale, 1.0 / std::sqrt(static_cast<double>(d.d)));
      // + extended attention mask (B, 1, 1, T): a broadcast add saves nothing.
      sc = bd.simple("attention.self.mask", OpKind::add, {sc, mask}, bash, bd.act(), {});
      bd.tag(Fn::add_mask);
      const TensorId probs = bd.softmax("attention.self.softmax", sc, bd.act());
      const TensorId pd = bd.dropout("attention.self.dropout", probs, c.attention_dropout);
      const TensorId ctx = bd.bmm("attention.self.context", {pd, v}, {pd, v}, {d.b, d.a, d.s, d.d},
                                  Gemm{d.s, d.d, d.s, d.b * d.a}, Fn::attn_context);
      merged = bd.merge_heads("attention.self.merge_heads", ctx, d.h);
      break;
    }
    case Attention::sdpa:
      // Without padding transformers passes no mask (5.x masking_utils.sdpa_mask, 4.46
      // _prepare_4d_attention_mask_for_sdpa: None for an all-ones attention_mask): dense,
      // non-causal; q, k, v are (B, T, A, D) views of the projections, the output the merged
      // tensor.
      merged = bd.sdpa("attention.self.sdpa", {q, k, v}, {q, k, v}, d.b, d.a, d.a, d.s, d.d, false,
                       c.attention_dropout);
      break;
    case Attention::flash_attention_2:
      // Without padding transformers passes no mask (masking_utils.flash_attention_mask
      // returns None for an all-ones attention_mask): dense, non-causal flash_attn_func.
      merged = bd.flash_attention("attention.self.flash_attn", {q, k, v}, {q, k, v}, d.b, d.a, d.a, d.s, d.d, false,
                                  c.attention_dropout);
      break;
  }
  TensorId o = bd.linear("attention.output.dense", bd.mod(p + "attention.output.dense"), merged, d.h, d.h);
  const TensorId ao = bd.residual_layernorm("attention.output.dropout", "attention.output.residual",
                                            "attention.output.LayerNorm", bd.mod(p + "attention.output.LayerNorm"), o, x,
                                            c.hidden_dropout, false);
  TensorId i = bd.linear("intermediate.dense", bd.mod(p + "intermediate.dense"), ao, d.h, d.f);  // (B, T, F)
  i = bd.activation("intermediate.act", c.act, i);
  TensorId o2 = bd.linear("output.dense", bd.mod(p + "output.dense"), i, d.f, d.h);
  const TensorId out = bd.residual_layernorm("output.dropout", "output.residual", "output.LayerNorm",
                                             bd.mod(p + "output.LayerNorm"), o2, ao, c.hidden_dropout, false);
  bd.end_layer();
  return out;
}

void bert_graph(Builder& bd, OpGraph& g) {
  const ModelConfig& c = g.cfg;
  const Dims d = dims_of(g);
  const bool pretraining = c.head == Head::bert_pretraining;
  bert_params(bd, c);
  const TensorId ids = bd.input("input_ids", {d.b, d.s}, DType::i64);
  const TensorId types = bd.input("token_type_ids", {d.b, d.s}, DType::i64);
  const TensorId amask = bd.input("attention_mask", {d.b, d.s}, DType::i64);
  const TensorId labels = bd.input("labels", {d.b, d.s}, DType::i64);
  const TensorId nsp_labels = pretraining ? bd.input("next_sentence_label", {d.b}, DType::i64) : kNone;
  // (1 - mask) * finfo.min in the activation dtype: (B, 1, 1, T), for eager; sdpa and
  // flash_attention_2 take no mask when nothing is padded.
  TensorId ext = kNone;
  if (bd.attention() == Attention::eager) {
    ext = bd.simple("bert.extended_attention_mask", OpKind::copy, {amask}, {d.b, 1, 1, d.s}, bd.act(), {});
    bd.tag(Fn::extended_mask);
  }
  const Shape bsh{d.b, d.s, d.h};
  const TensorId w = bd.embedding("bert.embeddings.word_embeddings", bd.mod("bert.embeddings.word_embeddings"), ids, bsh);
  const TensorId t =
      bd.embedding("bert.embeddings.token_type_embeddings", bd.mod("bert.embeddings.token_type_embeddings"), types, bsh);
  TensorId x = bd.simple("bert.embeddings.add_token_type", OpKind::add, {w, t}, bsh, bd.act(), {});
  bd.tag(Fn::add);
  const TensorId pos = bd.embedding("bert.embeddings.position_embeddings",
                                    bd.mod("bert.embeddings.position_embeddings"), kNone, {1, d.s, d.h});
  x = bd.simple("bert.embeddings.add_position", OpKind::add, {x, pos}, bsh, bd.act(), {});
  bd.tag(Fn::add);
  x = bd.layernorm("bert.embeddings.LayerNorm", bd.mod("bert.embeddings.LayerNorm"), x);
  x = bd.dropout("bert.embeddings.dropout", x, c.hidden_dropout);
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(c.layers); ++l) x = bert_layer(bd, c, d, l, x, ext);
  const TensorId seq = x;

  TensorId pooled = kNone;
  if (pretraining) {
    // hidden_states[:, 0] is a view: the dense layer's saved input keeps `seq` alive.
    pooled = bd.linear("bert.pooler.dense", bd.mod("bert.pooler.dense"), seq, d.h, d.h, Shape{d.b, d.h});
    pooled = bd.simple("bert.pooler.activation", OpKind::tanh, {pooled}, {d.b, d.h}, bd.act(), {}, true);
    bd.tag(Fn::tanh);
  }
  TensorId tr = bd.linear("cls.predictions.transform.dense", bd.mod("cls.predictions.transform.dense"), seq, d.h, d.h);
  tr = bd.activation("cls.predictions.transform.act", c.act, tr);
  tr = bd.layernorm("cls.predictions.transform.LayerNorm", bd.mod("cls.predictions.transform.LayerNorm"), tr);
  const TensorId scores = bd.linear("cls.predictions.decoder", bd.mod("cls.predictions.decoder"), tr, d.h, d.v);
  bd.output(scores);
  TensorId nsp = kNone;
  if (pretraining) {
    nsp = bd.linear("cls.seq_relationship", bd.mod("cls.seq_relationship"), pooled, d.h, 2);
    bd.output(nsp);
  }
  // CrossEntropyLoss on prediction_scores.view(-1, V) in the activation dtype.
  const TensorId mlm_loss = bd.cross_entropy("loss.mlm", scores, labels, d.v);
  if (!pretraining) {
    g.loss = mlm_loss;
    return;
  }
  const TensorId nsp_loss = bd.cross_entropy("loss.nsp", nsp, nsp_labels, 2);
  g.loss = bd.simple("loss.total", OpKind::add, {mlm_loss, nsp_loss}, {}, bd.act(), {});
  bd.tag(Fn::add);
}

// ------------------------------------------------------------------------------------
// Llama, Mistral, Qwen2 (…ForCausalLM)
// ------------------------------------------------------------------------------------

void llama_params(Builder& bd, const ModelConfig& c) {
  const std::int64_t h = c.hidden, f = c.intermediate, qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const bool o_bias = c.qkv_bias && c.model_type == "llama";  // LlamaConfig.attention_bias
  auto lin = [](std::int64_t out, std::int64_t in, bool bias) {
    std::vector<Builder::PSpec> ps{{"weight", {out, in}}};
    if (bias) ps.push_back({"bias", {out}});
    return ps;
  };
  bd.module("model.embed_tokens", kNone, {{"weight", {c.vocab, h}}});
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(c.layers); ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    bd.module(p + "self_attn.q_proj", l, lin(qd, h, c.qkv_bias));
    bd.module(p + "self_attn.k_proj", l, lin(kvd, h, c.qkv_bias));
    bd.module(p + "self_attn.v_proj", l, lin(kvd, h, c.qkv_bias));
    bd.module(p + "self_attn.o_proj", l, lin(h, qd, o_bias));
    bd.module(p + "mlp.gate_proj", l, lin(f, h, c.mlp_bias));
    bd.module(p + "mlp.up_proj", l, lin(f, h, c.mlp_bias));
    bd.module(p + "mlp.down_proj", l, lin(h, f, c.mlp_bias));
    bd.module(p + "input_layernorm", l, {{"weight", {h}}});
    bd.module(p + "post_attention_layernorm", l, {{"weight", {h}}});
  }
  bd.module("model.norm", kNone, {{"weight", {h}}});
  if (c.tie_word_embeddings)
    bd.module("lm_head", kNone, {}, true, {bd.param("model.embed_tokens.weight")});
  else
    bd.module("lm_head", kNone, {{"weight", {c.vocab, h}}}, false);
}

struct Rope {
  TensorId cos = kNone, sin = kNone;
};

TensorId llama_layer(Builder& bd, const ModelConfig& c, const Dims& d, std::int32_t l, TensorId x, TensorId mask,
                     Rope rope) {
  const std::string p = fmt::format("model.layers.{}.", l);
  const std::int64_t qd = d.a * d.d, kvd = d.kv * d.d;
  const Shape bash{d.b, d.a, d.s, d.s}, bsh{d.b, d.s, d.h};
  bd.begin_layer(l, x);
  const TensorId y = bd.rmsnorm("input_layernorm", bd.mod(p + "input_layernorm"), x);
  const TensorId q = bd.linear("self_attn.q_proj", bd.mod(p + "self_attn.q_proj"), y, d.h, qd);   // (B, T, A*D)
  const TensorId k = bd.linear("self_attn.k_proj", bd.mod(p + "self_attn.k_proj"), y, d.h, kvd);  // (B, T, K*D)
  const TensorId v = bd.linear("self_attn.v_proj", bd.mod(p + "self_attn.v_proj"), y, d.h, kvd);  // (B, T, K*D)
  // q*cos + rotate_half(q)*sin: the muls save only cos and sin (shared, no grad), so the
  // projections' outputs are freed and the rotated tensors are what the matmul saves.
  const TensorId qr = bd.simple("self_attn.rope_q", OpKind::rope, {q, rope.cos, rope.sin}, {d.b, d.a, d.s, d.d},
                                bd.act(), {rope.cos, rope.sin});
  bd.tag(Fn::rope);
  const TensorId kr = bd.simple("self_attn.rope_k", OpKind::rope, {k, rope.cos, rope.sin}, {d.b, d.kv, d.s, d.d},
                                bd.act(), {rope.cos, rope.sin});
  bd.tag(Fn::rope);
  // With a KV cache, its update copies k (after RoPE) and v into contiguous (B, K, T, D)
  // tensors, and attention reads those; the cache (in the model's output) holds them.
  TensorId kt = kr, vt = v;
  if (bd.kv_cache()) {
    kt = bd.heads_copy("self_attn.cache_k", kr, d.kv);  // (B, K, T, D)
    vt = bd.heads_copy("self_attn.cache_v", v, d.kv);   // (B, K, T, D)
    bd.output(kt);
    bd.output(vt);
  }
  // repeat_kv: expand + reshape materialises (B, A, T, D) when K < A; saves nothing.
  auto repeat_kv = [&]() -> std::pair<TensorId, TensorId> {
    if (d.kv == d.a) return {kt, vt};
    const TensorId kk = bd.simple("self_attn.repeat_k", OpKind::copy, {kt}, {d.b, d.a, d.s, d.d}, bd.act(), {});
    bd.tag(Fn::repeat_kv);
    const TensorId vv = bd.simple("self_attn.repeat_v", OpKind::copy, {vt}, {d.b, d.a, d.s, d.d}, bd.act(), {});
    bd.tag(Fn::repeat_kv);
    return {kk, vv};
  };
  // Attention, one variant per case, each ending in the merged (B, T, A·D) tensor.
  TensorId merged = kNone;
  switch (bd.attention()) {
    case Attention::eager: {
      const auto [kk, vv] = repeat_kv();
      TensorId sc = bd.bmm("self_attn.qk", {qr, kk}, {qr, kk}, bash, Gemm{d.s, d.s, d.d, d.b * d.a}, Fn::attn_scores);
      sc = bd.simple("self_attn.scale", OpKind::scale, {sc}, bash, bd.act(), {});
      bd.tag(Fn::scale, 1.0 / std::sqrt(static_cast<double>(d.d)));
      sc = bd.simple("self_attn.mask", OpKind::add, {sc, mask}, bash, bd.act(), {});
      bd.tag(Fn::add_mask);
      // softmax(dtype=float32) saves its fp32 output; .to(act) is saved by the PV matmul.
      const TensorId p32 = bd.softmax("self_attn.softmax", sc, DType::fp32);
      TensorId probs = p32;
      if (bd.act() != DType::fp32) {
        probs = bd.simple("self_attn.softmax_cast", OpKind::cast, {p32}, bash, bd.act(), {});
        bd.tag(Fn::cast);
      }
      probs = bd.dropout("self_attn.dropout", probs, c.attention_dropout);
      const TensorId ctx = bd.bmm("self_attn.pv", {probs, vv}, {probs, vv}, {d.b, d.a, d.s, d.d},
                                  Gemm{d.s, d.d, d.s, d.b * d.a}, Fn::attn_context);
      merged = bd.merge_heads("self_attn.merge_heads", ctx, qd);
      break;
    }
    case Attention::sdpa: {
      // is_causal=True without a materialised mask. transformers 5 (and 4.57) pass
      // enable_gqa=True when there is no mask: k and v keep their K heads; 4.46 repeats them
      // (repeat_kv) first. What the kernel reads is what it saves.
      const bool gqa = bd.transformers() == Transformers::v5;
      const auto [kk, vv] = gqa ? std::pair<TensorId, TensorId>{kt, vt} : repeat_kv();
      merged = bd.sdpa("self_attn.sdpa", {qr, kk, vv}, {qr, kk, vv}, d.b, d.a, gqa ? d.kv : d.a, d.s, d.d, true,
                       c.attention_dropout);
      break;
    }
    case Attention::flash_attention_2:
      // q and k after RoPE, v the projection's view (or the cache's copies); k and v keep
      // their K heads.
      merged = bd.flash_attention("self_attn.flash_attn", {qr, kt, vt}, {qr, kt, vt}, d.b, d.a, d.kv, d.s, d.d, true,
                                  c.attention_dropout);
      break;
  }
  const TensorId o = bd.linear("self_attn.o_proj", bd.mod(p + "self_attn.o_proj"), merged, qd, d.h);
  const TensorId x2 = bd.simple("residual_attn", OpKind::add, {x, o}, bsh, bd.act(), {});
  bd.tag(Fn::add);
  const TensorId y2 = bd.rmsnorm("post_attention_layernorm", bd.mod(p + "post_attention_layernorm"), x2);
  // down_proj(act_fn(gate_proj(x)) * up_proj(x)), in Python's evaluation order.
  const TensorId gt = bd.linear("mlp.gate_proj", bd.mod(p + "mlp.gate_proj"), y2, d.h, d.f);  // (B, T, F)
  const TensorId ga = bd.activation("mlp.act_fn", c.act, gt);
  const TensorId up = bd.linear("mlp.up_proj", bd.mod(p + "mlp.up_proj"), y2, d.h, d.f);  // (B, T, F)
  const TensorId m = bd.simple("mlp.mul", OpKind::mul, {ga, up}, {d.b, d.s, d.f}, bd.act(), {ga, up});
  bd.tag(Fn::mul);
  const TensorId dn = bd.linear("mlp.down_proj", bd.mod(p + "mlp.down_proj"), m, d.f, d.h);
  const TensorId out = bd.simple("residual_mlp", OpKind::add, {x2, dn}, bsh, bd.act(), {});
  bd.tag(Fn::add);
  bd.end_layer();
  return out;
}

void llama_graph(Builder& bd, OpGraph& g) {
  const ModelConfig& c = g.cfg;
  const Dims d = dims_of(g);
  llama_params(bd, c);
  const TensorId ids = bd.input("input_ids", {d.b, d.s}, DType::i64);
  const TensorId labels = bd.input("labels", {d.b, d.s}, DType::i64);
  TensorId x = bd.embedding("model.embed_tokens", bd.mod("model.embed_tokens"), ids, {d.b, d.s, d.h});
  // The additive causal mask for eager attention, built once (expanded over the batch);
  // sdpa runs with is_causal and needs none.
  TensorId mask = kNone;
  if (bd.attention() == Attention::eager) {
    mask = bd.simple("model.causal_mask", OpKind::copy, {}, {1, 1, d.s, d.s}, bd.act(), {});
    bd.tag(Fn::causal_mask);
  }
  // Rotary embedding: cos and sin (1, T, D) in the activation dtype, shared by all layers.
  Rope rope;
  {
    rope.cos = bd.tensor("model.rotary_emb.cos", {1, d.s, d.d}, bd.act());
    rope.sin = bd.tensor("model.rotary_emb.sin", {1, d.s, d.d}, bd.act());
    Op op;
    op.name = "model.rotary_emb";
    op.kind = OpKind::rope;
    op.fn = Fn::rope_tables;
    op.alpha = c.rope_theta;
    op.outputs = {rope.cos, rope.sin};
    bd.emit(std::move(op));
  }
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(c.layers); ++l) x = llama_layer(bd, c, d, l, x, mask, rope);
  x = bd.rmsnorm("model.norm", bd.mod("model.norm"), x);
  const TensorId logits = bd.linear("lm_head", bd.mod("lm_head"), x, d.h, d.v);  // (B, T, V)
  bd.output(logits);
  g.loss = bd.causal_lm_loss(logits, labels, d.v);
}

Bytes layer_saved(const OpGraph& g, std::int32_t l, bool large_only) {
  if (l < 0 || static_cast<std::size_t>(l) >= g.layers.size())
    throw std::out_of_range(fmt::format("layer {} out of range (model has {})", l, g.layers.size()));
  const LayerSpan& span = g.layers[static_cast<std::size_t>(l)];
  std::vector<char> seen(g.tensors.size(), 0);
  Bytes sum{};
  for (OpId o = span.first; o <= span.last; ++o) {
    for (TensorId t : g.ops[static_cast<std::size_t>(o)].saved) {
      if (seen[static_cast<std::size_t>(t)]) continue;
      seen[static_cast<std::size_t>(t)] = 1;
      const Tensor& x = g.tensors[static_cast<std::size_t>(t)];
      // The layer's own tensors and its input; model-level tensors shared by every layer
      // (RoPE cos/sin) are charged to no layer.
      if (x.layer != l && t != span.input) continue;
      if (large_only && is_per_token_stat(x)) continue;
      sum += x.bytes;
    }
  }
  return sum;
}

}  // namespace

std::int64_t OpGraph::param_count() const {
  std::int64_t n = 0;
  for (const auto& p : params) n += p.numel;
  return n;
}

std::int64_t OpGraph::base_param_count() const {
  std::int64_t n = 0;
  for (const auto& p : params)
    if (p.in_base_model) n += p.numel;
  return n;
}

Bytes OpGraph::saved_bytes_of_layer(std::int32_t l) const { return layer_saved(*this, l, false); }
Bytes OpGraph::saved_bytes_of_layer_large(std::int32_t l) const { return layer_saved(*this, l, true); }

Flops OpGraph::fwd_flops() const {
  Flops f{};
  for (const auto& o : ops) f += o.fwd_flops;
  return f;
}

Flops OpGraph::bwd_flops() const {
  Flops f{};
  for (const auto& o : ops) f += o.bwd_flops;
  return f;
}

OpGraph build_graph(const ModelConfig& cfg, const GraphOptions& opt) {
  OpGraph g;
  g.cfg = cfg;
  g.opt = opt;
  if (opt.micro_batch < 1)
    throw InputError("--micro-batch", "", fmt::format("must be an integer >= 1, got {}", opt.micro_batch));
  if (opt.seq_len < 0)
    throw InputError("--seq-len", "", fmt::format("must be an integer >= 0 (0: the model's maximum), got {}",
                                                  opt.seq_len));
  if (!is_float(opt.act_dtype))
    throw InputError("--dtype", "", fmt::format("activations must be fp32, fp16 or bf16, got {}",
                                                dtype_name(opt.act_dtype)));
  // transformers casts fp32 q, k, v to the dtype of the model's Linear weights, fp32 when the
  // model trains in fp32, and flash-attn refuses it.
  if (opt.attention == Attention::flash_attention_2 && opt.act_dtype == DType::fp32)
    throw InputError("--attention", "",
                     "flash_attention_2 runs in fp16 or bf16 only (flash-attn refuses fp32 q, k, v) and this "
                     "configuration trains in fp32: enable fp16 or bf16 in the ds_config, or use sdpa");
  if (g.opt.seq_len == 0) g.opt.seq_len = cfg.max_positions;
  // transformers builds a DynamicCache for decoders with use_cache, and turns it off under
  // gradient checkpointing; only v5's cache copies what it is given (models/transformers.hpp).
  g.kv_cache = opt.transformers == Transformers::v5 && cfg.use_cache && !opt.gradient_checkpointing &&
               cfg.family != Family::bert;
  if (cfg.layers > 10000)
    throw InputError(cfg.source, cfg.family == Family::gpt2 ? "n_layer" : "num_hidden_layers",
                     fmt::format("{} layers: more than 10000 are not simulated", cfg.layers));
  // Learned position tables bound the sequence length.
  if (cfg.family != Family::llama && g.opt.seq_len > cfg.max_positions) {
    const char* key = cfg.family == Family::gpt2 ? "n_positions" : "max_position_embeddings";
    throw InputError(cfg.source, key, fmt::format("sequence length {} exceeds the model's {} positions",
                                                  g.opt.seq_len, cfg.max_positions));
  }
  Builder bd(g);
  switch (cfg.family) {
    case Family::gpt2: gpt2_graph(bd, g); break;
    case Family::bert: bert_graph(bd, g); break;
    case Family::llama: llama_graph(bd, g); break;
  }
  // What checkpointing recomputes is each layer's span from its input: an op of a layer may read
  // another layer's tensor only as that input (a variant that fuses across layers keeps to it by
  // not fusing there under checkpointing).
  if (g.opt.gradient_checkpointing)
    for (std::size_t l = 0; l < g.layers.size(); ++l) {
      const LayerSpan& span = g.layers[l];
      for (OpId o = span.first; o >= 0 && o <= span.last; ++o)
        for (TensorId t : g.ops[static_cast<std::size_t>(o)].inputs) {
          const std::int32_t tl = g.tensors[static_cast<std::size_t>(t)].layer;
          if (tl != kNone && tl != static_cast<std::int32_t>(l) && t != span.input)
            throw std::logic_error(fmt::format("graph: op {} of layer {} reads {} of layer {}, not the layer's input",
                                               g.ops[static_cast<std::size_t>(o)].name, l,
                                               g.tensors[static_cast<std::size_t>(t)].name, tl));
        }
    }
  return g;
}

std::string inert_variants_note(const ModelConfig& cfg, const GraphOptions& opt) {
  const auto& all = kernel_variants();
  if (std::none_of(all.begin(), all.end(), [&](const KernelVariantInfo& k) { return opt.variants.*k.member; }))
    return "";
  auto same_ops = [](const OpGraph& a, const OpGraph& b) {
    return a.ops.size() == b.ops.size() && std::equal(a.ops.begin(), a.ops.end(), b.ops.begin(), [](const Op& x, const Op& y) {
             return x.fn == y.fn && x.name == y.name;
           });
  };
  const OpGraph with = build_graph(cfg, opt);
  GraphOptions none = opt;
  none.variants = KernelVariants{};
  std::optional<OpGraph> hf;  // HF's graph, built only where a variant turns out inert
  std::vector<std::string> absent, subsumed;
  for (const KernelVariantInfo& k : all) {
    if (!(opt.variants.*k.member)) continue;
    GraphOptions o = opt;
    o.variants.*k.member = false;
    if (!same_ops(with, build_graph(cfg, o))) continue;
    // On its own it would change the graph: the other variants on fuse its ops already.
    if (!hf) hf = build_graph(cfg, none);
    GraphOptions alone = none;
    alone.variants.*k.member = true;
    (same_ops(*hf, build_graph(cfg, alone)) ? absent : subsumed).emplace_back(k.flag);
  }
  auto joined = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& f : v) s += (s.empty() ? "" : " and ") + f;
    return s;
  };
  std::string note;
  if (!absent.empty())
    note = fmt::format("{} {} {}'s graph as it is: the model has none of the ops {}", joined(absent),
                       absent.size() == 1 ? "leaves" : "leave", cfg.name, absent.size() == 1 ? "it fuses" : "they fuse");
  if (!subsumed.empty())
    note += fmt::format("{}{} {} nothing in {}'s graph beside the other variants on, which fuse {} ops already",
                        note.empty() ? "" : "; ", joined(subsumed), subsumed.size() == 1 ? "changes" : "change", cfg.name,
                        subsumed.size() == 1 ? "its" : "their");
  return note;
}

HeadsLayout heads_layout(const OpGraph& g, const Op& op) {
  if ((op.fn != Fn::flash_attention && op.fn != Fn::sdpa) || op.outputs.size() != 3 ||
      (op.inputs.size() != 1 && op.inputs.size() != 3))
    throw std::logic_error(fmt::format("op {} is not a fused attention op", op.name));
  auto shape = [&](TensorId t) -> const Shape& { return g.tensors.at(static_cast<std::size_t>(t)).shape; };
  HeadsLayout f;
  const Shape& lse = shape(op.outputs[1]);  // (B, H, T, 1)
  f.B = lse[0];
  f.H = lse[1];
  f.T = lse[2];
  const std::int64_t W = shape(op.outputs[0])[2];  // (B, T, H·D)
  f.D = W / f.H;
  f.causal = op.causal;
  f.o = {op.outputs[0], 0, f.T * W, f.D, W};
  f.lse = op.outputs[1];
  f.rng = op.outputs[2];
  std::int64_t kv_heads = f.H;
  if (op.inputs.size() == 1) {
    // GPT-2's c_attn output (B, T, 3C): q, k, v are its column blocks.
    const TensorId t = op.inputs[0];
    const std::int64_t W3 = shape(t)[2];
    f.q = {t, 0, f.T * W3, f.D, W3};
    f.k = {t, W, f.T * W3, f.D, W3};
    f.v = {t, 2 * W, f.T * W3, f.D, W3};
  } else {
    HeadsOperand* dst[3] = {&f.q, &f.k, &f.v};
    for (int i = 0; i < 3; ++i) {
      const TensorId t = op.inputs[static_cast<std::size_t>(i)];
      const Shape& x = shape(t);
      std::int64_t heads = 0;
      if (x.size() == 4) {  // (B, X, T, D): a RoPE output or a cache copy
        heads = x[1];
        *dst[i] = {t, 0, heads * f.T * f.D, f.T * f.D, f.D};
      } else {  // (B, T, X·D): a projection; q may be the first H·D columns of a wider one (GPT-2's c_attn)
        heads = i == 0 ? f.H : x[2] / f.D;
        *dst[i] = {t, 0, f.T * x[2], f.D, x[2]};
      }
      if (i == 1) kv_heads = heads;
    }
  }
  f.K = kv_heads;
  return f;
}

bool heads_contiguous(const HeadsLayout& f, const HeadsOperand& h, std::int64_t X) {
  return h.st == f.D && h.sh == f.T * f.D && h.sb == X * f.T * f.D;
}

bool heads_columns(const HeadsLayout& f, const HeadsOperand& h) { return h.sh == f.D && h.sb == f.T * h.st; }

BoostGraph to_boost(const OpGraph& g) {
  BoostGraph bg(g.ops.size());
  for (const auto& op : g.ops) {
    for (TensorId t : op.inputs) {
      const OpId p = g.tensors[static_cast<std::size_t>(t)].producer;
      if (p != kNone)
        boost::add_edge(static_cast<std::size_t>(p), static_cast<std::size_t>(op.id), TensorId{t}, bg);
    }
  }
  return bg;
}

}  // namespace zp::models
