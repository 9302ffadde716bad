// Whole-model gradient check: the gradient the executor computes for a tiny model (every
// layer's forward and backward, as the step program orders them) against central finite
// differences of the loss. One rank, stage 0, fp32, SGD without momentum: after one step
// with learning rate lr, p1 = p0 - lr * g, so g = (p0 - p1) / lr; the loss at p ± h comes
// from steps run with learning rate 0 (a step reports the loss of its forward pass).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "exec/allocator.hpp"
#include "exec/comm.hpp"
#include "exec/data.hpp"
#include "exec/device_cpu.hpp"
#include "exec/device_placed.hpp"
#include "forwarding_device.hpp"
#include "exec/interpreter.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"
#include "zero/ds_config.hpp"
#include "zero/lower.hpp"

namespace {

zp::exec::Comm& comm() {
  static auto c = [] {
    int argc = 0;
    char** argv = nullptr;
    return zp::exec::make_mpi_comm(&argc, &argv);
  }();
  return *c;
}

struct Model {
  zp::models::OpGraph g;
  zp::zero::DsConfig cfg;
  zp::zero::Program prog;
};

Model make(const std::string& name, double lr, zp::models::Attention attention = zp::models::Attention::eager,
           zp::models::Transformers transformers = zp::models::kDefaultTransformers) {
  Model m;
  m.cfg = zp::zero::parse_ds_config("grad-check.json", nlohmann::json::parse(fmt::format(
      R"({{"train_micro_batch_size_per_gpu": 2, "optimizer": {{"type": "SGD", "params": {{"lr": {}}}}},
          "zero_optimization": {{"stage": 0}}}})", lr)));
  const auto batch = zp::zero::resolve_batch(m.cfg, 1);
  zp::models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = 8;
  go.act_dtype = zp::DType::fp32;
  go.attention = attention;
  go.transformers = transformers;
  auto mc = zp::models::load_model(name);
  // No dropout: the loss must be a deterministic function of the weights.
  mc.hidden_dropout = mc.attention_dropout = mc.embedding_dropout = 0.0;
  m.g = zp::models::build_graph(mc, go);
  zp::zero::LowerOptions lo;
  m.prog = zp::zero::lower(m.g, m.cfg, batch, lo);
  return m;
}

// A tiny model's expanded step program at one rank (seq 8) for a ds_config of micro-batch 2,
// `gas` micro-steps, AdamW, clipping at 1.0, the dtype ("fp32", "fp16" or "bf16") and these
// zero_optimization keys.
Model lowered(const std::string& name, const std::string& dtype, int gas, const std::string& zero) {
  Model m;
  const std::string precision = dtype == "fp32" ? "" : fmt::format(R"("{}": {{"enabled": true}},)", dtype);
  m.cfg = zp::zero::parse_ds_config("lowered.json", nlohmann::json::parse(fmt::format(
      R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": {}, {} "gradient_clipping": 1.0,
          "optimizer": {{"type": "AdamW", "params": {{"lr": 0.002}}}}, "zero_optimization": {{{}}}}})",
      gas, precision, zero)));
  const auto batch = zp::zero::resolve_batch(m.cfg, 1);
  zp::models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = 8;
  go.act_dtype = m.cfg.model_dtype();
  m.g = zp::models::build_graph(zp::models::load_model(name), go);
  zp::zero::LowerOptions lo;
  m.prog = zp::zero::expand(zp::zero::lower(m.g, m.cfg, batch, lo));
  return m;
}

// The loss of one step's forward pass at the current weights, and the weights after it.
double loss_at(zp::exec::Interpreter& it, const std::vector<zp::exec::MicroBatch>& data) {
  return it.step(1, data).loss;
}

}  // namespace

TEST_CASE("whole-model gradients of the tiny models match finite differences of the loss") {
  // transformers 5: the decoders' KV cache copies (heads_copy) and sdpa's grouped k, v;
  // 4.46: none, and repeat_kv before sdpa. The loss's backward goes through the gradient of
  // the log-probabilities (cross_entropy's bwd_grads) in both.
  for (const auto transformers : {zp::models::Transformers::v5, zp::models::Transformers::v4_46})
  for (const auto attention : {zp::models::Attention::eager, zp::models::Attention::sdpa})
  for (const std::string name : {"tiny-gpt2", "tiny-bert", "tiny-llama"}) {
    if (transformers == zp::models::Transformers::v4_46 && name == "tiny-bert") continue;  // BERT: the same graph
    INFO(name, " ", std::string(zp::models::attention_name(attention)), " transformers ",
         std::string(zp::models::transformers_name(transformers)));
    const double lr = 1e-2;
    Model upd = make(name, lr, attention, transformers), probe = make(name, 0.0, attention, transformers);
    zp::exec::DataSource data("synthetic", upd.g, 7);
    const std::vector<zp::exec::MicroBatch> batch{data.batch(1, 0, 1, 0, 1)};
    // The analytic gradient from one SGD step.
    zp::exec::TrackingAllocator mem_u(upd.prog.buffers.size());
    zp::exec::Interpreter u(upd.g, upd.prog, upd.cfg, comm(), mem_u, 99);
    u.prologue();
    std::vector<std::vector<float>> before;
    for (const auto& p : upd.g.params) before.push_back(u.param_values(p.id));
    loss_at(u, batch);
    // Finite differences through a second interpreter whose steps do not move the weights.
    zp::exec::TrackingAllocator mem_p(probe.prog.buffers.size());
    zp::exec::Interpreter f(probe.g, probe.prog, probe.cfg, comm(), mem_p, 99);
    f.prologue();
    int checked = 0;
    for (const auto& p : upd.g.params) {
      const auto after = u.param_values(p.id);
      const auto& b = before[static_cast<std::size_t>(p.id)];
      // The element with the largest gradient of this param.
      std::size_t best = 0;
      for (std::size_t i = 0; i < b.size(); ++i)
        if (std::abs(b[i] - after[i]) > std::abs(b[best] - after[best])) best = i;
      const double g = (static_cast<double>(b[best]) - static_cast<double>(after[best])) / lr;
      if (std::abs(g) < 1e-3) continue;  // too small to resolve in fp32 either way
      const double h = 1e-2;
      f.set_param_value(p.id, static_cast<std::int64_t>(best), static_cast<float>(b[best] + h));
      const double lp = loss_at(f, batch);
      f.set_param_value(p.id, static_cast<std::int64_t>(best), static_cast<float>(b[best] - h));
      const double lm = loss_at(f, batch);
      f.set_param_value(p.id, static_cast<std::int64_t>(best), b[best]);
      const double fd = (lp - lm) / (2 * h);
      INFO(p.name, "[", best, "]: backward ", g, ", finite difference ", fd);
      CHECK(std::abs(fd - g) <= 0.03 * std::abs(g) + 2e-4);
      ++checked;
    }
    MESSAGE(name, " (", std::string(zp::models::attention_name(attention)), ", transformers ",
            std::string(zp::models::transformers_name(transformers)), "): ", checked,
            " params checked at their largest-gradient element");
    CHECK(checked >= static_cast<int>(upd.g.params.size()) / 2);
  }
}

namespace {
// A device that counts what it is asked to do and has the CPU device do it: the
// interpreter must reach the device only through exec/device.hpp.
class CountingDevice final : public zp::test::ForwardingDevice {
 public:
  const char* name() const override { return "counting"; }
  void forward(const zp::models::Op& op, zp::exec::Operands& o) override {
    ++forward_calls;
    cpu.forward(op, o);
  }
  void backward(const zp::models::Op& op, zp::exec::Operands& o) override {
    ++backward_calls;
    cpu.backward(op, o);
  }
  void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step, const zp::kernels::cpu::AdamConfig& c,
                 float f) override {
    ++updates;
    cpu.adam_step(p, g, m, v, n, step, c, f);
  }
  void sgd_step(Ref p, Ref g, Ref m, std::int64_t n, std::int64_t step, const zp::kernels::cpu::SgdConfig& c,
                float f) override {
    ++updates;
    cpu.sgd_step(p, g, m, n, step, c, f);
  }
  void copy(Ref d, Ref s, std::int64_t n) override { ++moves, cpu.copy(d, s, n); }
  void add(Ref d, Ref s, std::int64_t n) override { ++moves, cpu.add(d, s, n); }
  int forward_calls = 0, backward_calls = 0, updates = 0, moves = 0;
};
}  // namespace

TEST_CASE("the interpreter runs ops and updates through the device interface") {
  Model a = make("tiny-gpt2", 1e-2), b = make("tiny-gpt2", 1e-2);
  zp::exec::DataSource data("synthetic", a.g, 7);
  const std::vector<zp::exec::MicroBatch> batch{data.batch(1, 0, 1, 0, 1)};
  zp::exec::TrackingAllocator mem_a(a.prog.buffers.size()), mem_b(b.prog.buffers.size());
  CountingDevice dev;
  zp::exec::Interpreter with(a.g, a.prog, a.cfg, comm(), mem_a, 99, &dev);
  zp::exec::Interpreter plain(b.g, b.prog, b.cfg, comm(), mem_b, 99);
  with.prologue();
  plain.prologue();
  int fwd = 0, bwd = 0;
  for (auto id = a.prog.step_begin; id < static_cast<zp::zero::EventId>(a.prog.events.size()); ++id) {
    const auto& e = a.prog.events[static_cast<std::size_t>(id)];
    if (e.kind != zp::zero::EventKind::compute || e.op < 0) continue;
    fwd += e.phase != zp::zero::Phase::backward ? 1 : 0;
    bwd += e.phase == zp::zero::Phase::backward ? 1 : 0;
  }
  for (int s = 1; s <= 2; ++s) CHECK(with.step(s, batch).loss == plain.step(s, batch).loss);
  CHECK(dev.forward_calls == 2 * fwd);
  CHECK(dev.backward_calls > 0);
  CHECK(dev.backward_calls <= 2 * bwd);
  CHECK(dev.updates >= 2);
  CHECK(dev.moves > 0);
  CHECK(with.param_values(0) == plain.param_values(0));
}

namespace {
// Operands passed on to the interpreter's, except accumulates(): answered by `claim`.
class ClaimingOperands final : public zp::exec::Operands {
  using Ref = zp::exec::Ref;

 public:
  ClaimingOperands(zp::exec::Operands& o, bool claim, std::vector<std::pair<zp::models::OpId, zp::models::TensorId>>* log,
                   zp::models::OpId op)
      : o_(o), claim_(claim), log_(log), op_(op) {}
  const zp::models::OpGraph& graph() const override { return o_.graph(); }
  float* act(zp::models::TensorId t) const override { return o_.act(t); }
  float* grad(zp::models::TensorId t) const override { return o_.grad(t); }
  const std::int64_t* ids(zp::models::TensorId t) const override { return o_.ids(t); }
  float* param(zp::models::ParamId p) const override { return o_.param(p); }
  float* param_grad(zp::models::ParamId p) const override { return o_.param_grad(p); }
  Ref act_ref(zp::models::TensorId t) const override { return o_.act_ref(t); }
  Ref grad_ref(zp::models::TensorId t) const override { return o_.grad_ref(t); }
  Ref grad_peek(zp::models::TensorId t) const override { return o_.grad_peek(t); }
  Ref param_ref(zp::models::ParamId p) const override { return o_.param_ref(p); }
  Ref param_grad_ref(zp::models::ParamId p) const override { return o_.param_grad_ref(p); }
  bool accumulates(zp::models::TensorId t) override {
    if (!claim_) return true;  // never claimed: the interpreter zero-fills it when it is touched
    const bool a = o_.accumulates(t);
    if (!a) log_->emplace_back(op_, t);
    return a;
  }
  bool accumulates(zp::models::TensorId t, zp::exec::ColumnBlock cols) override {
    if (!claim_) return true;
    const bool a = o_.accumulates(t, cols);
    if (!a && cols.count == cols.width) log_->emplace_back(op_, t);
    if (!a && cols.count < cols.width) blocks->push_back({op_, t, cols});
    return a;
  }
  struct Block {
    zp::models::OpId op;
    zp::models::TensorId t;
    zp::exec::ColumnBlock cols;
  };
  std::vector<Block>* blocks = nullptr;
  float* scratch(std::size_t slot, std::int64_t n) override { return o_.scratch(slot, n); }
  std::uint64_t dropout_seed() const override { return o_.dropout_seed(); }
  float loss_grad() const override { return o_.loss_grad(); }

 private:
  zp::exec::Operands& o_;
  bool claim_;
  std::vector<std::pair<zp::models::OpId, zp::models::TensorId>>* log_;
  zp::models::OpId op_;
};

// The CPU device, its backward seeing ClaimingOperands.
class ClaimingDevice final : public zp::test::ForwardingDevice {
 public:
  // only_attention: claims in the fused attention's backward only, so the blocks it leaves
  // unwritten are zero-filled (Device::zero_columns) for the KV cache copies to add into.
  // ask_left_block: a KV cache copy first asks for the block left of its own, which is not
  // one it may write whole: the interpreter zero-fills that block's unwritten columns for it
  // to add into, and the copy that owns it later adds there instead of writing.
  explicit ClaimingDevice(bool claim, bool only_attention = false, bool ask_left_block = false)
      : claim_(claim), only_attention_(only_attention), ask_left_block_(ask_left_block) {}
  void backward(const zp::models::Op& op, zp::exec::Operands& o) override {
    if (ask_left_block_ && op.fn == zp::models::Fn::heads_copy) {
      const auto& xs = o.graph().tensors[static_cast<std::size_t>(op.inputs[0])].shape;
      const auto& ys = o.graph().tensors[static_cast<std::size_t>(op.outputs[0])].shape;
      const std::int64_t count = ys[1] * ys[3];
      if (xs.size() == 3 && op.col[0] >= count) {
        const bool a = o.accumulates(op.inputs[0], zp::exec::ColumnBlock{op.col[0] - count, count, xs[2]});
        CHECK(a);
        ++left_asked;
      }
    }
    ClaimingOperands c(o, claim_ && (!only_attention_ || op.fn == zp::models::Fn::sdpa), &claimed, op.id);
    c.blocks = &claimed_blocks;
    cpu.backward(op, c);
  }
  std::vector<std::pair<zp::models::OpId, zp::models::TensorId>> claimed;
  std::vector<ClaimingOperands::Block> claimed_blocks;
  int left_asked = 0;

 private:
  bool claim_, only_attention_, ask_left_block_;
};
}  // namespace

TEST_CASE("a fresh gradient is written whole by its first writer where backward_assigns allows, and the step is bit for bit the one that adds into zeros") {
  // Under ZEROPLAN_POISON_FRESH=1 (set here too, so the binary alone checks it) such gradients
  // hold NaN until written (Operands::accumulates): a kernel that claimed a gradient and left
  // part of it unwritten makes the step NaN.
  REQUIRE(setenv("ZEROPLAN_POISON_FRESH", "1", 1) == 0);
  for (const std::string name : {"tiny-gpt2", "tiny-bert", "tiny-llama"})
  for (const std::string dtype : {"bf16", "fp32"}) {
    INFO(name, " ", dtype);
    const Model a = lowered(name, dtype, 2, R"("stage": 2, "overlap_comm": true)");
    const Model b = lowered(name, dtype, 2, R"("stage": 2, "overlap_comm": true)");
    zp::exec::DataSource data("synthetic", a.g, 7);
    const std::vector<zp::exec::MicroBatch> mbs{data.batch(1, 0, 2, 0, 1), data.batch(1, 1, 2, 0, 1)};
    zp::exec::TrackingAllocator mem_a(a.prog.buffers.size()), mem_b(b.prog.buffers.size());
    ClaimingDevice claims(true), zeroes(false);
    zp::exec::Interpreter ia(a.g, a.prog, a.cfg, comm(), mem_a, 99, &claims);
    zp::exec::Interpreter ib(b.g, b.prog, b.cfg, comm(), mem_b, 99, &zeroes);
    ia.prologue();
    ib.prologue();
    for (int s = 1; s <= 2; ++s) {
      const auto ra = ia.step(s, mbs), rb = ib.step(s, mbs);
      CHECK(std::isfinite(ra.loss));
      CHECK(ra.loss == rb.loss);
      CHECK(ra.grad_norm == rb.grad_norm);
    }
    for (const auto& p : a.g.params) CHECK(ia.param_values(p.id) == ib.param_values(p.id));
    {  // some blocks claimed, the others zero-filled around them: the same bits again
      const Model c = lowered(name, dtype, 2, R"("stage": 2, "overlap_comm": true)");
      zp::exec::TrackingAllocator mem_c(c.prog.buffers.size());
      ClaimingDevice some(true, true);
      zp::exec::Interpreter ic(c.g, c.prog, c.cfg, comm(), mem_c, 99, &some);
      ic.prologue();
      for (int s = 1; s <= 2; ++s) ic.step(s, mbs);
      for (const auto& p : c.g.params) CHECK(ic.param_values(p.id) == ib.param_values(p.id));
      if (name == "tiny-gpt2") CHECK_FALSE(some.claimed_blocks.empty());
    }
    {  // a block asked for that is not the asker's to write: zero-filled there, added into
      const Model c = lowered(name, dtype, 2, R"("stage": 2, "overlap_comm": true)");
      zp::exec::TrackingAllocator mem_c(c.prog.buffers.size());
      ClaimingDevice left(true, false, true);
      zp::exec::Interpreter ic(c.g, c.prog, c.cfg, comm(), mem_c, 99, &left);
      ic.prologue();
      for (int s = 1; s <= 2; ++s) ic.step(s, mbs);
      for (const auto& p : c.g.params) CHECK(ic.param_values(p.id) == ib.param_values(p.id));
      if (name == "tiny-gpt2") {
        CHECK(left.left_asked > 0);
        CHECK(left.claimed_blocks.size() < claims.claimed_blocks.size());  // the left blocks were added into
      }
    }
    // Claims happen, only where backward_assigns allows, once per gradient and micro-step.
    REQUIRE_FALSE(claims.claimed.empty());
    std::map<std::pair<zp::models::OpId, zp::models::TensorId>, int> times;
    std::set<zp::models::Fn> fns;
    for (const auto& [op, t] : claims.claimed) {
      const auto& o = a.g.ops[static_cast<std::size_t>(op)];
      const auto i = static_cast<std::size_t>(std::find(o.inputs.begin(), o.inputs.end(), t) - o.inputs.begin());
      CHECK(zp::exec::backward_assigns(a.g, o, i));
      ++times[{op, t}];
      fns.insert(o.fn);
    }
    for (const auto& [k, n] : times) CHECK(n == 4);  // 2 steps x 2 micro-steps
    std::map<zp::models::TensorId, std::set<zp::models::OpId>> writers;  // one first writer per gradient
    for (const auto& [op, t] : claims.claimed) writers[t].insert(op);
    for (const auto& [t, ops] : writers) CHECK(ops.size() == 1);
    // The projections' inputs and the loss's logits are among them; the residual sums pass
    // their output's gradient on instead (two per layer), with no kernel.
    CHECK((fns.count(zp::models::Fn::linear) + fns.count(zp::models::Fn::conv1d)) >= 1);
    const auto passing = std::count_if(a.prog.events.begin(), a.prog.events.end(), [&](const zp::zero::Event& e) {
      return e.passes_gradient && e.micro_step == 0 && e.id >= a.prog.step_begin;
    });
    CHECK(passing >= 2 * a.g.cfg.layers);
    // The attention writes the gradients of q, k and v where they are tensors of their own:
    // BERT's projections, Llama's RoPE outputs and KV cache copies, GPT-2's cache copies.
    CHECK(fns.count(zp::models::Fn::sdpa) == 1);
    // Column blocks: GPT-2's d(qkv) written by the attention (q's columns) and the KV cache's
    // copies (k's, v's), each block by one op, once per micro-step, all columns together.
    std::map<std::tuple<zp::models::OpId, zp::models::TensorId, std::int64_t>, int> block_times;
    std::map<zp::models::TensorId, std::map<std::int64_t, std::set<zp::models::OpId>>> block_writers;
    std::map<zp::models::TensorId, std::int64_t> block_width;
    for (const auto& c : claims.claimed_blocks) {
      const auto& o = a.g.ops[static_cast<std::size_t>(c.op)];
      const auto i = static_cast<std::size_t>(std::find(o.inputs.begin(), o.inputs.end(), c.t) - o.inputs.begin());
      const auto allowed = zp::exec::backward_assigns_columns(a.g, o, i);
      CHECK(std::find(allowed.begin(), allowed.end(), c.cols) != allowed.end());
      ++block_times[{c.op, c.t, c.cols.first}];
      block_writers[c.t][c.cols.first].insert(c.op);
      block_width[c.t] = c.cols.width;
    }
    for (const auto& [k, n] : block_times) CHECK(n == 4);
    std::size_t covered = 0;
    for (const auto& [t, firsts] : block_writers) {
      std::int64_t cols = 0;
      for (const auto& [first, ops] : firsts) {
        CHECK(ops.size() == 1);
        for (const auto& c : claims.claimed_blocks)
          if (c.t == t && c.cols.first == first) {
            cols += c.cols.count;
            break;
          }
      }
      covered += cols == block_width[t] ? 1 : 0;
    }
    if (name == "tiny-gpt2") {
      CHECK(covered == block_writers.size());
      CHECK(covered == static_cast<std::size_t>(a.g.cfg.layers));  // each layer's d(qkv)
    } else {
      CHECK(block_writers.empty());
    }
    MESSAGE(name, " ", dtype, ": ", times.size(), " gradients written whole by their first writer, ", covered,
            " by the writers of their column blocks");
  }
}

TEST_CASE("a program storing a repeated micro-step once runs every micro-step, as the one lowered one by one") {
  // Seven micro-steps at stage 2: the compact program stands for four of them by one stored
  // micro-step; the interpreter runs it expanded, with the same results, byte for byte, as
  // the program lowered one by one.
  const auto cfg = zp::zero::parse_ds_config("repeat.json", nlohmann::json::parse(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 7, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
          "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 5000}})"));
  const auto batch = zp::zero::resolve_batch(cfg, 1);
  zp::models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = 8;
  go.act_dtype = cfg.model_dtype();
  const auto g = zp::models::build_graph(zp::models::load_model("tiny-gpt2"), go);
  zp::zero::LowerOptions lo;
  const auto compact = zp::zero::lower(g, cfg, batch, lo);
  lo.replicate_micro_steps = false;
  const auto full = zp::zero::lower(g, cfg, batch, lo);
  REQUIRE(compact.repeat.copies >= 2);
  REQUIRE(compact.events.size() < full.events.size());
  zp::exec::DataSource data("synthetic", g, 7);
  std::vector<zp::exec::MicroBatch> mbs;
  for (int m = 0; m < 7; ++m) mbs.push_back(data.batch(1, m, 7, 0, 1));
  zp::exec::TrackingAllocator mem_c(static_cast<std::size_t>(compact.num_buffers())), mem_f(full.buffers.size());
  zp::exec::Interpreter ic(g, compact, cfg, comm(), mem_c, 99);
  zp::exec::Interpreter iff(g, full, cfg, comm(), mem_f, 99);
  ic.prologue();
  iff.prologue();
  for (int s = 1; s <= 2; ++s) {
    const auto a = ic.step(s, mbs), b = iff.step(s, mbs);
    CHECK(a.loss == b.loss);
    CHECK(a.grad_norm == b.grad_norm);
  }
  CHECK(ic.event_seconds().size() == full.events.size());
  for (const auto& p : g.params) CHECK(ic.param_values(p.id) == iff.param_values(p.id));
  const auto& rc = mem_c.report();
  const auto& rf = mem_f.report();
  CHECK(rc.peak_allocated == rf.peak_allocated);
  CHECK(rc.peak_event == rf.peak_event);
  CHECK(rc.at_peak == rf.at_peak);
  CHECK(rc.category_peak == rf.category_peak);
  CHECK(rc.reserved_peak == rf.reserved_peak);
}

namespace {
// The device behind exec::PlacedDevice in the offload test: the CPU device, holding the placed
// device to its routing. Every Ref it is handed, and every operand of an op it runs, must lie
// in memory it allocated itself (a host buffer reaching it is counted as a stray), and it
// counts optimizer steps (the offloaded partition's must run on the host side).
class OwnMemoryDevice final : public zp::test::ForwardingDevice {
 public:
  const char* name() const override { return "own-memory"; }
  void* allocate(std::size_t bytes) override {
    void* p = cpu.allocate(bytes);
    held[static_cast<const char*>(p)] = std::max<std::size_t>(bytes, 1);
    return p;
  }
  void release(void* p) override {
    held.erase(static_cast<const char*>(p));
    cpu.release(p);
  }
  void forward(const zp::models::Op& op, zp::exec::Operands& o) override {
    for (auto t : op.inputs) need({o.act_ref(t)});
    for (auto t : op.outputs) need({o.act_ref(t)});
    for (auto p : op.params) need({o.param_ref(p)});
    cpu.forward(op, o);
  }
  void backward(const zp::models::Op& op, zp::exec::Operands& o) override {
    for (auto t : op.saved) need({o.act_ref(t)});
    for (auto t : op.outputs) need({o.grad_ref(t)});
    for (auto t : op.inputs) need({o.grad_ref(t)});
    for (auto p : op.params) need({o.param_ref(p)});
    cpu.backward(op, o);
  }
  void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step, const zp::kernels::cpu::AdamConfig& c,
                 float f) override {
    ++updates;
    need({p, g, m, v});
    cpu.adam_step(p, g, m, v, n, step, c, f);
  }
  void sgd_step(Ref p, Ref g, Ref m, std::int64_t n, std::int64_t step, const zp::kernels::cpu::SgdConfig& c,
                float f) override {
    ++updates;
    need({p, g, m});
    cpu.sgd_step(p, g, m, n, step, c, f);
  }
  void copy(Ref d, Ref s, std::int64_t n) override { need({d, s}), cpu.copy(d, s, n); }
  void add(Ref d, Ref s, std::int64_t n) override { need({d, s}), cpu.add(d, s, n); }
  void fill(Ref d, std::int64_t n, float v) override { need({d}), cpu.fill(d, n, v); }
  void scale(Ref x, std::int64_t n, float f) override { need({x}), cpu.scale(x, n, f); }
  void norm_add(std::span<const Ref> parts, std::int64_t n) override {
    for (const Ref& r : parts) need({r});
    cpu.norm_add(parts, n);
  }
  void upload(Ref d, const float* s, std::int64_t n) override { need({d}), cpu.upload(d, s, n); }
  void download(float* d, Ref s, std::int64_t n) override { need({s}), cpu.download(d, s, n); }
  void upload_bytes(void* d, const void* s, std::size_t b) override {
    strays += owns(d) ? 0 : 1;
    cpu.upload_bytes(d, s, b);
  }
  void download_bytes(void* d, const void* s, std::size_t b) override {
    strays += owns(s) ? 0 : 1;
    cpu.download_bytes(d, s, b);
  }

  bool owns(const void* p) const {
    const auto* c = static_cast<const char*>(p);
    auto it = held.upper_bound(c);
    if (it == held.begin()) return false;
    --it;
    return c < it->first + it->second;
  }
  std::map<const char*, std::size_t> held;
  int updates = 0, strays = 0;

 private:
  void need(std::initializer_list<Ref> refs) {
    for (const Ref& r : refs)
      if (r && !owns(r.base)) ++strays;
  }
};
}  // namespace

// ZeRO-Offload on a device the host does not address is run by exec::PlacedDevice: each call
// goes where its operands live, the offloaded partition's optimizer on the CPU. Here its
// device is the CPU device (whose allocations it tells apart from the host buffers by
// address), so the run must equal the plain CPU run bit for bit: every loss, norm and
// parameter, with the optimizer steps and the copies across run by the host side and the
// transfers, and none of the optimizer's work on the device. That device says the host
// addresses its memory, so the interpreter takes its host path (fp32 views, no segments):
// what is checked is the routing, not the GPU-only paths (test_exec_cuda runs those).
TEST_CASE("offload through the placed device: host buffers on the host side, results bit for bit") {
  struct Setup {
    const char* dtype;
    int stage;
    int gas;
    bool offload_param;
  };
  for (const Setup su : {Setup{"fp32", 2, 2, false}, Setup{"bf16", 1, 1, false}, Setup{"fp16", 2, 3, false},
                         Setup{"bf16", 3, 2, true}, Setup{"fp32", 3, 1, false}}) {
    INFO(su.dtype, " stage ", su.stage, " gas ", su.gas, su.offload_param ? " offload_param" : "");
    const Model lw = lowered("tiny-gpt2", su.dtype, su.gas,
                             fmt::format(R"("stage": {}, "reduce_bucket_size": 3000, "offload_optimizer": {{"device": "cpu"}}{})",
                                         su.stage, su.offload_param ? R"(, "offload_param": {"device": "cpu"})" : ""));
    const auto& [g, cfg, prog] = lw;
    REQUIRE(std::any_of(prog.buffers.begin(), prog.buffers.end(),
                        [](const zp::zero::Buffer& b) { return b.placement == zp::zero::Placement::host; }));
    zp::exec::DataSource data("synthetic", g, 7);
    OwnMemoryDevice inner;
    zp::exec::PlacedDevice placed(inner);
    zp::exec::TrackingAllocator mem_p(prog.buffers.size(), zp::Bytes{0}, &placed), mem_c(prog.buffers.size());
    zp::exec::Interpreter ip(g, prog, cfg, comm(), mem_p, 99, &placed);
    zp::exec::Interpreter ic(g, prog, cfg, comm(), mem_c, 99);
    ip.prologue();
    ic.prologue();
    for (int s = 1; s <= 3; ++s) {
      std::vector<zp::exec::MicroBatch> mbs;
      for (int m = 0; m < su.gas; ++m) mbs.push_back(data.batch(s, m, su.gas, 0, 1));
      const auto a = ip.step(s, mbs), b = ic.step(s, mbs);
      CHECK(a.loss == b.loss);
      CHECK(a.grad_norm == b.grad_norm);
      CHECK(a.skipped == b.skipped);
    }
    for (const auto& p : g.params) CHECK(ip.param_values(p.id) == ic.param_values(p.id));
    CHECK(inner.updates == 0);  // every optimizer step ran on the host side
    CHECK(inner.strays == 0);   // and nothing of the host's reached the device side
    CHECK(placed.host_calls() > 0);
    CHECK(placed.transfers() > 0);
    CHECK(mem_p.report().peak_allocated == mem_c.report().peak_allocated);
    CHECK(mem_p.report().peak_host == mem_c.report().peak_host);
  }
}

namespace {
// An independent check of a step's cross-stream order as a device with one stream per
// program stream runs it (exec/stream_order.hpp): vector clocks from each stream's order and
// the waits the interpreter issued, in the order they were issued; then every two uses of the
// same memory on two streams must be ordered. Memory is the buffer itself, and, for device
// buffers, the bytes the caching-allocator model placed it at: a buffer placed over one freed
// earlier in the step inherits its uses (the reuse a stream's pool allows at once).
std::vector<std::string> stream_races(const zp::zero::Program& p, const zp::exec::Interpreter::StreamTrace& t) {
  constexpr int kS = zp::zero::kNumStreams;
  using Clock = std::array<std::int32_t, kS>;
  const auto n = p.events.size();
  std::vector<Clock> clock(n, Clock{});
  std::vector<std::int32_t> seq(n, 0);
  std::array<Clock, kS> now{};
  std::array<std::int32_t, kS> count{};
  std::vector<std::array<zp::zero::EventId, kS>> last(p.buffers.size());
  for (auto& l : last) l.fill(-1);
  struct Occupant {
    std::int64_t segment, lo, hi;
    zp::zero::BufferId buffer;
  };
  std::vector<Occupant> placed;  // device buffers allocated in this step, where they were placed
  std::vector<std::string> races;
  for (std::size_t i = 0; i < n; ++i) {
    if (t.events[i].empty()) continue;  // nothing used or waited for (host events, markers)
    const int s = static_cast<int>(p.events[i].stream);
    seq[i] = ++count[static_cast<std::size_t>(s)];
    Clock& c = now[static_cast<std::size_t>(s)];
    c[static_cast<std::size_t>(s)] = seq[i];
    for (const auto& en : t.events[i]) {
      if (en.wait) {
        for (int x = 0; x < kS; ++x)
          c[static_cast<std::size_t>(x)] = std::max(c[static_cast<std::size_t>(x)], clock[static_cast<std::size_t>(en.id)][static_cast<std::size_t>(x)]);
        continue;
      }
      const auto b = static_cast<std::size_t>(en.id);
      const auto& allocs = p.allocs(p.events[i]);
      const bool fresh = std::find(allocs.begin(), allocs.end(), en.id) != allocs.end() && last[b][static_cast<std::size_t>(s)] != static_cast<zp::zero::EventId>(i);
      if (fresh && t.places[b]) {  // placed now: inherit the uses of what lay there before
        const auto& pl = *t.places[b];
        const Occupant me{pl.segment, pl.offset, pl.offset + p.buffers[b].bytes.v, en.id};
        for (const auto& o : placed)
          if (o.segment == me.segment && o.lo < me.hi && me.lo < o.hi)
            for (int x = 0; x < kS; ++x)
              last[b][static_cast<std::size_t>(x)] = std::max(last[b][static_cast<std::size_t>(x)], last[static_cast<std::size_t>(o.buffer)][static_cast<std::size_t>(x)]);
        placed.push_back(me);
      }
      for (int x = 0; x < kS; ++x) {
        const zp::zero::EventId u = last[b][static_cast<std::size_t>(x)];
        if (x == s || u < 0 || c[static_cast<std::size_t>(x)] >= seq[static_cast<std::size_t>(u)]) continue;
        races.push_back(fmt::format("{} uses {} unordered after {}", p.event_name(static_cast<zp::zero::EventId>(i)),
                                    p.buffer_name(en.id), p.event_name(u)));
      }
      last[b][static_cast<std::size_t>(s)] = static_cast<zp::zero::EventId>(i);
    }
    clock[i] = c;
  }
  return races;
}
}  // namespace

// Streams: the waits the interpreter issues order every use of the same memory on two streams
// (checked independently of exec::StreamOrder, with the caching-allocator model's placements),
// and the lowering's dependencies alone order every use of the same buffer (no "use" waits):
// the simulator's overlap is one the executor can run.
TEST_CASE("streams: every use of the same memory on two streams is ordered; the program's dependencies suffice") {
  struct Setup {
    std::string name;
    const char* dtype;
    const char* zero;
    int gas;
    bool streams = true;  // work on several streams
  };
  const Setup setups[] = {
      {"stage 1 overlap", "bf16", R"("stage": 1, "overlap_comm": true, "reduce_bucket_size": 3000)", 3},
      {"stage 2 overlap, small buckets", "fp16", R"("stage": 2, "overlap_comm": true, "reduce_bucket_size": 2000)", 2},
      {"stage 2 no overlap", "bf16", R"("stage": 2, "overlap_comm": false, "reduce_bucket_size": 5000)", 2, false},
      {"stage 3 overlap", "bf16", R"("stage": 3, "overlap_comm": true, "stage3_prefetch_bucket_size": 3000, "stage3_param_persistence_threshold": 100, "stage3_max_live_parameters": 20000)", 2},
      {"stage 3 fp16 overlap", "fp16", R"("stage": 3, "overlap_comm": true, "stage3_prefetch_bucket_size": 2000)", 1},
      {"stage 2 offload", "fp16", R"("stage": 2, "overlap_comm": true, "offload_optimizer": {"device": "cpu"})", 2},
      {"stage 3 offload params", "fp32", R"("stage": 3, "overlap_comm": true, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})", 2},
  };
  for (const auto& su : setups) {
    INFO(su.name);
    const Model lw = lowered("tiny-llama", su.dtype, su.gas, su.zero);
    const auto& [g, cfg, prog] = lw;
    zp::exec::DataSource data("synthetic", g, 7);
    zp::exec::TrackingAllocator mem(prog.buffers.size());
    zp::exec::Interpreter it(g, prog, cfg, comm(), mem, 99);
    zp::exec::Interpreter::StreamTrace trace;
    it.trace_streams(&trace);
    it.prologue();
    for (int s = 1; s <= 2; ++s) {
      std::vector<zp::exec::MicroBatch> mbs;
      for (int m = 0; m < su.gas; ++m) mbs.push_back(data.batch(s, m, su.gas, 0, 1));
      it.step(s, mbs);
      const auto races = stream_races(prog, trace);
      for (std::size_t k = 0; k < std::min<std::size_t>(races.size(), 5); ++k) MESSAGE(races[k]);
      CHECK(races.empty());
    }
    // The check has teeth: without the reuse waits it finds the races they prevent (where
    // the program reuses memory across streams at all).
    if (su.streams && it.stream_waits().reuse_waits > 0) {
      zp::exec::TrackingAllocator mem2(prog.buffers.size());
      zp::exec::Interpreter bare(g, prog, cfg, comm(), mem2, 99);
      zp::exec::Interpreter::StreamTrace t2;
      bare.trace_streams(&t2, false);
      bare.prologue();
      std::vector<zp::exec::MicroBatch> mbs;
      for (int m = 0; m < su.gas; ++m) mbs.push_back(data.batch(1, m, su.gas, 0, 1));
      bare.step(1, mbs);
      CHECK_FALSE(stream_races(prog, t2).empty());
    }
    const auto& w = it.stream_waits();
    MESSAGE(su.name, ": waits over 2 steps: ", w.dep_waits, " for dependencies, ", w.reuse_waits, " for reuse, ",
            w.touch_waits, " for uses the dependencies leave unordered");
    for (const auto& u : w.unordered) MESSAGE(u);
    CHECK(w.touch_waits == 0);
    if (su.streams) CHECK(w.dep_waits > 0);  // the program does use several streams here
    else CHECK(w.dep_waits + w.reuse_waits == 0);
  }
}
