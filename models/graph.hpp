#pragma once
// The operator graph of one forward (and, implicitly, backward) pass of a model at a
// given micro-batch and sequence length, at tensor granularity:
//  - Param: every parameter tensor with its exact shape, in registration order
//    (the order of model.parameters(), which DeepSpeed flattens and partitions).
//  - Module: every leaf nn.Module that owns parameters directly (what ZeRO-3 fetches).
//  - Tensor: every activation tensor autograd materialises (views are not tensors).
//  - Op: one forward kernel/autograd node; its backward is implied. Ops are stored in
//    forward execution order. `saved` lists what autograd keeps for its backward,
//    following PyTorch eager on the Hugging Face implementation of each family.
// The Boost.Graph view (ops as vertices, tensors as edges) is built by to_boost().
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "core/dtype.hpp"
#include "core/units.hpp"
#include "models/model_config.hpp"
#include "models/transformers.hpp"

namespace zp::models {

using ParamId = std::int32_t;
using ModuleId = std::int32_t;
using TensorId = std::int32_t;
using OpId = std::int32_t;
constexpr std::int32_t kNone = -1;

struct Param {
  ParamId id = kNone;
  std::string name;                  // HF name, e.g. "bert.encoder.layer.3.attention.self.query.weight"
  std::vector<std::int64_t> shape;   // e.g. (out, in) for nn.Linear
  std::int64_t numel = 0;
  ModuleId module = kNone;           // owning leaf module (first registration)
  std::int32_t layer = kNone;        // transformer layer index, kNone outside layers
  bool in_base_model = true;         // false for heads (cls.*, lm_head) and for BERT's NSP head
};

struct Module {
  ModuleId id = kNone;
  std::string name;                  // e.g. "bert.encoder.layer.3.attention.self.query"
  std::vector<ParamId> params;       // params it owns directly (recurse=False)
  std::int32_t layer = kNone;
};

enum class OpKind {
  embedding, linear, bmm,            // bmm: batched attention matmul (QK^T, PV)
  layernorm, rmsnorm, softmax, dropout,
  gelu, gelu_tanh, relu, silu, tanh, pow,
  add, mul, scale, cast, rope, copy,  // copy: a materialising op (repeat_kv, contiguous)
  cross_entropy,
};
constexpr int kNumOpKinds = static_cast<int>(OpKind::cross_entropy) + 1;
const char* op_kind_name(OpKind k);
// The kind op_kind_name() names; nullopt for any other text.
std::optional<OpKind> op_kind_from_name(std::string_view name);
// Every kind's name, in enum order (what a reader lists when a name is wrong).
const std::vector<std::string>& op_kind_names();

// What an op computes, precisely enough for the executor (cost models need only the
// kind). `Op::alpha` and `Op::col` carry the few constants an op needs.
enum class Fn : std::uint8_t {
  none,
  embedding,           // y(B,T,C) = W[ids]
  position_embedding,  // y(1,T,C) = W[0..T)                      (no inputs: arange)
  linear,              // y = x W^T + b                           (nn.Linear, W (out, in))
  conv1d,              // y = x W + b                             (GPT-2 Conv1D, W (in, out))
  linear_first_token,  // y(B,C') = x[:, 0] W^T + b               (BERT pooler)
  attn_scores,         // s(B,H,T,T) = q k^T                      (q, k: head views, see col)
  attn_context,        // c(B,H,T,D) = p v                        (v: head view)
  scale,               // y = alpha x
  add,                 // y = a + b; b may be (1,T,C) broadcast over the batch
  add_scalar,          // y = x + alpha
  causal_where,        // y = where(j <= i, x, lowest)            (GPT-2's bias buffer)
  add_mask,            // y(B,H,T,T) = x + m, m (B,1,1,T) or (1,1,T,T)
  softmax,             // over the last dim
  dropout,             // alpha = p; outputs y and the byte mask
  layernorm,           // alpha = eps; outputs y, mean, rstd
  pow,                 // y = x^alpha (2 or 3)
  rms_rsqrt,           // r(B,T,1) = rsqrt(mean(sq) + alpha)
  mul,                 // y = a * b, same shape
  mul_rowscale,        // y = x * r, r (B,T,1)
  mul_weight,          // y = x * w, w (C) a parameter
  gelu, gelu_tanh, relu, silu, tanh,
  cast,                // dtype conversion
  rope_tables,         // cos, sin (1,T,D)
  rope,                // y(B,H,T,D) = x*cos + rotate_half(x)*sin, x a head view
  merge_heads,         // (B,H,T,D) -> (B,T,H*D)
  repeat_kv,           // (B,K,T,D) -> (B,H,T,D)
  extended_mask,       // (B,T) int mask -> (B,1,1,T): (1 - m) * lowest
  causal_mask,         // (1,1,T,T): 0 on and below the diagonal, lowest above
  cross_entropy,       // outputs log-probabilities and the mean loss (ignore_index -100)
  sdpa,                // F.scaled_dot_product_attention with a flash kernel (alpha: dropout_p);
                       // operands and layout: heads_layout()
  flash_attention,     // flash_attn_func as transformers' flash_attention_2 calls it (alpha: dropout_p);
                       // operands and layout: heads_layout()
  cross_entropy_fused, // outputs the rows' logsumexp (fp32) and the mean loss (fp32) of 16-bit or fp32 logits;
                       // saves the logits and the logsumexp (KernelVariants::fused_loss)
  heads_copy,          // y(B,X,T,D) contiguous = the head view of x: columns [col[0], col[0] + X·D) of a
                       // (B,T,W) tensor, or a 4-D tensor (the KV cache's torch.cat, matmul's copy of a
                       // strided operand)
  dropout_add_layernorm,  // inputs (b, x): s = x + dropout(b) (p: Op::p; 0: no dropout), y = LayerNorm(s)
                          // (alpha = eps); outputs y, mean, rstd (fp32), s, and the byte mask where p > 0;
                          // saves s, mean, rstd, mask (KernelVariants::fused_residual_norm)
  mlp_gelu_tanh,          // GPT-2's MLP (Conv1D weights W1 (C,F), W2 (F,C)): pre = x W1 + b1, a = gelu_tanh(pre)
                          // computed from pre's fp32 sum, y = a W2 + b2; outputs y, pre, a; saves x, pre, a
                          // (KernelVariants::fused_mlp)
};
const char* fn_name(Fn f);

struct Tensor {
  TensorId id = kNone;
  std::string name;                  // e.g. "layer3.attn.probs"
  std::vector<std::int64_t> shape;   // shape comment in code, e.g. (B, a, T, T)
  DType dtype = DType::fp16;
  Bytes bytes{};                     // numel * dtype_size (bool masks: 1 byte each), or rows * row_pitch * dtype_size
  // Elements from one row (of the last dimension) to the next in memory when they are padded:
  // 0 for packed rows. The fused loss's logits (KernelVariants::fused_loss) get a pitch of
  // whole 16 bytes where the vocabulary is not (GPT-2's 50257 in bf16: 50264), so that the
  // head's products and the loss run aligned kernels; the padding is never read or written,
  // and the tensor's bytes (and its gradient's) count it. Kernels that read or write such a
  // tensor take the stride (row_stride).
  std::int64_t row_pitch = 0;
  OpId producer = kNone;             // kNone for model inputs (ids, labels)
  std::int32_t layer = kNone;
};

// Elements between the starts of t's rows (of its last dimension).
inline std::int64_t row_stride(const Tensor& t) {
  return t.row_pitch != 0 ? t.row_pitch : (t.shape.empty() ? 1 : t.shape.back());
}

// GEMM geometry for compute cost models: C(m,n) = A(m,k) B(k,n), `batch` times.
struct Gemm {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  // A bias added to every output row (nn.Linear, Conv1D): the backward also sums the output
  // gradient's columns, a pass of its own after the two products.
  bool bias = false;
};

struct Op {
  OpId id = kNone;
  std::string name;                  // e.g. "layer3.attn.query"
  OpKind kind = OpKind::add;
  ModuleId module = kNone;           // leaf module whose params it uses (kNone: functional op)
  std::int32_t layer = kNone;
  std::vector<TensorId> inputs;      // activation inputs
  std::vector<TensorId> outputs;     // freshly allocated outputs
  std::vector<ParamId> params;       // parameters read (their grads are produced by backward)
  std::vector<TensorId> saved;       // tensors autograd saves for this op's backward
  // Outputs whose gradient exists only inside this op's backward: allocated when it starts,
  // freed when it ends (cross_entropy: nll_loss's backward writes the gradient of the
  // log-probabilities, which log_softmax's backward reads while writing the logits').
  std::vector<TensorId> bwd_grads;
  // Temporaries the op's backward kernel allocates, live for that backward only (softmax:
  // PyTorch's CUDA softmax_backward materialises grad * output before its row reduction).
  // Tensors of the graph that no op produces, reads or saves.
  std::vector<TensorId> bwd_scratch;
  Flops fwd_flops{};                 // forward FLOPs (2mnk for a GEMM)
  Flops bwd_flops{};                 // backward FLOPs (grad input + grad weight)
  Bytes fwd_bytes{};                 // bytes read + written by the forward kernel(s)
  Bytes bwd_bytes{};                 // bytes read + written by the backward kernel(s)
  std::vector<Gemm> gemms;           // forward GEMMs (empty for non-GEMM ops)
  Fn fn = Fn::none;                  // exact function, for the executor
  double alpha = 0.0;                // the constant of scale/add_scalar/pow/dropout/eps
  std::int64_t col[2] = {0, 0};      // attention operands read from a (B,T,W) tensor: column offset
  bool causal = false;               // fused attention (sdpa, flash_attention): causal masking
  // The op's random stream (dropout, and the fused attentions' dropout): its ordinal among
  // such ops in forward order, so ops that draw nothing (copies) do not move it; -1: none.
  std::int32_t rng_stream = -1;
  double p = 0.0;                    // dropout_add_layernorm's dropout probability (alpha is its eps)
};

// zeroplan's kernel variants of HF's graph: fused ops that save less, which its executor runs
// and `simulate` predicts with the same flags. DeepSpeed runs HF's graph: all off.
struct KernelVariants {
  // GPT-2's gelu_new as one fused GELU op (tanh form: the same formula, computed in fp32 and
  // rounded once) that saves only its input, instead of HF's eight elementwise ops and their
  // saved tensors.
  bool fused_gelu = false;
  // A causal LM's loss as one fused cross entropy on the logits in their own dtype (fp32 inside,
  // saving the logits and one fp32 logsumexp per row), instead of HF's fp32 upcast of the logits
  // and log_softmax + nll_loss, which save fp32 log-probabilities of the logits' size. The
  // logits' rows are padded to whole 16 bytes (Tensor::row_pitch) where the vocabulary is not.
  bool fused_loss = false;
  // A dropout, the residual sum after it and the LayerNorm of that sum as one op (two a layer in
  // BERT and GPT-2: GPT-2's MLP tail with the next layer's ln_1 or ln_f, except under activation
  // checkpointing, which recomputes the layers apart): the same formulas and roundings (the dropout's output and the sum
  // rounded to the activation dtype), saving what HF's three ops save (the sum, the fp32 mean
  // and rstd, the byte mask), so only the kernels change: one pass instead of three forward,
  // and in backward the LayerNorm's input gradient, the residual's and the dropout's in one.
  bool fused_residual_norm = false;
  // GPT-2's MLP (c_fc, the tanh-form GELU, c_proj) as one op whose products carry the GELU as
  // their epilogues (cuBLASLt's GELU_AUX_BIAS forward, DGELU backward): the GELU is computed
  // from c_fc's fp32 sums (one rounding fewer than the chain in 16 bits) and its gradient from
  // c_proj's input gradient as the chain rounds it, so neither the chain's GELU kernels nor the
  // gradient of the GELU's output in memory exist. Saves what c_fc, --fused-gelu's GELU op and
  // c_proj save (x, the pre-activation, the activation): on its own it also drops what HF's
  // eight-op gelu_new saves beyond them, as fused_gelu does. Where cuBLASLt's epilogues cannot
  // take the operands (kernels::gelu_epilogue_takes) the CUDA device runs the chain's kernels:
  // the GELU of the rounded pre-activation, in 16 bits one rounding more than the epilogue.
  bool fused_mlp = false;
  bool operator==(const KernelVariants&) const = default;
};
// Each variant: its key in train --out's config and simulate --json, its command-line flag, its
// help text, and its member.
struct KernelVariantInfo {
  const char* key;
  const char* flag;
  const char* help;
  bool KernelVariants::*member;
};
const std::vector<KernelVariantInfo>& kernel_variants();

// How attention is computed (models/attention.hpp: eager, sdpa, flash_attention_2; the
// default is kDefaultAttention, sdpa, as transformers picks it), and which transformers
// release's modelling code is followed where releases differ (models/transformers.hpp).
struct GraphOptions {
  std::int64_t micro_batch = 1;      // b
  std::int64_t seq_len = 0;          // s (0: the model's max_positions)
  DType act_dtype = DType::fp16;     // dtype of activations and 16-bit params
  Attention attention = kDefaultAttention;
  Transformers transformers = kDefaultTransformers;
  // HF gradient checkpointing (per-layer activation checkpointing): transformers then turns
  // use_cache off, so no KV cache is built. Must match the lowering's activation_checkpointing.
  bool gradient_checkpointing = false;
  KernelVariants variants;           // zeroplan's fused variants (all off: HF's graph)
};


// One layer's extent in the op list, for activation checkpointing.
struct LayerSpan {
  OpId first = kNone, last = kNone;  // inclusive range of ops of the layer
  // The layer's input hidden states (kept when checkpointing). With GPT-2's MLP tail fused with
  // the next layer's ln_1 (KernelVariants::fused_residual_norm, never under checkpointing) the
  // layer reads two tensors of the one before: its input is the residual of the two (x2), and
  // the hidden states HF passes in are made by the layer's first op.
  TensorId input = kNone;
};

struct OpGraph {
  ModelConfig cfg;
  GraphOptions opt;
  std::vector<Param> params;
  std::vector<Module> modules;
  std::vector<Tensor> tensors;
  std::vector<Op> ops;               // forward order
  std::vector<TensorId> inputs;      // tensors alive before forward (ids, labels, masks)
  TensorId loss = kNone;
  // What the model's output object references besides the loss (logits; the KV cache's k and
  // v): alive until the caller drops the output, at the end of the forward (HF Trainer) or,
  // when it keeps the output, at the end of the micro-step (zero::LowerOptions::keep_output).
  std::vector<TensorId> outputs;
  bool kv_cache = false;             // the decoder layers copy k and v into a DynamicCache
  std::vector<LayerSpan> layers;

  std::int64_t param_count() const;       // everything trained (with heads)
  std::int64_t base_param_count() const;  // the backbone (BertModel with pooler, GPT2Model, ...)
  // Bytes of activations saved for backward by the ops of layer `l` (each tensor once).
  // (With GPT-2's MLP tail fused across layers, a layer's tail mask is charged to the next layer,
  // the last layer's to none: layer 0 is one byte mask below the others.)
  Bytes saved_bytes_of_layer(std::int32_t l) const;
  // Same, leaving out per-token statistics (LayerNorm mean/rstd, RMSNorm rsqrt: one fp32
  // value per token, shape (B, T, 1)). Tensors shared by all layers (RoPE cos/sin) are
  // charged to no layer; the layer's input counts for the layer whose ops save it.
  Bytes saved_bytes_of_layer_large(std::int32_t l) const;
  Flops fwd_flops() const;
  Flops bwd_flops() const;
};

OpGraph build_graph(const ModelConfig& cfg, const GraphOptions& opt);

// The kernel variants on in `opt` that leave `cfg`'s graph as it is, in one line for a warning:
// those of a model without the ops they fuse (--fused-mlp or --fused-gelu on BERT,
// --fused-residual-norm on the Llama's RMSNorm), and those whose ops another variant on fuses
// already (--fused-gelu beside --fused-mlp); "" when each variant on changes the graph. Each is
// found by building the graph without it (and with it alone): the same ops, op for op.
std::string inert_variants_note(const ModelConfig& cfg, const GraphOptions& opt);

// Where a fused attention op (sdpa, flash_attention) reads q, k, v and writes its output:
// element (b, h, t, d) of an operand at offset + b·sb + h·sh + t·st + d of the tensor named
// by `tensor`. Inputs are either one packed (B, T, 3·H·D) projection (GPT-2's c_attn: q, k,
// v are its column blocks) or q, k, v each a (B, T, X·D) projection (q: the first H·D
// columns) or a contiguous (B, X, T, D) tensor.
struct HeadsOperand {
  TensorId tensor = kNone;
  std::int64_t offset = 0, sb = 0, sh = 0, st = 0;
};
struct HeadsLayout {
  std::int64_t B = 0, H = 0, K = 0, T = 0, D = 0;  // K: kv heads (H % K == 0)
  bool causal = false;
  HeadsOperand q, k, v;   // inputs
  HeadsOperand o;         // outputs[0], (B, T, H·D)
  TensorId lse = kNone;   // outputs[1], (B, H, T, 1) fp32
  TensorId rng = kNone;   // outputs[2], (2) int64: the dropout stream's (seed, offset)
};
HeadsLayout heads_layout(const OpGraph& g, const Op& op);
// Operand h (X heads) of a fused attention as (B, X, T, D) contiguous heads.
bool heads_contiguous(const HeadsLayout& f, const HeadsOperand& h, std::int64_t X);
// Operand h as column blocks of (B, T, W) rows: each head's D columns contiguous, a row per
// position (the row's stride is h.st = W).
bool heads_columns(const HeadsLayout& f, const HeadsOperand& h);

// Ops as vertices, one edge per (producer → consumer) use of a tensor.
using BoostGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS,
                                         boost::no_property, boost::property<boost::edge_name_t, TensorId>>;
BoostGraph to_boost(const OpGraph& g);

}  // namespace zp::models
