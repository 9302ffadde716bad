// The step program: invariants for every stage and option, DeepSpeed's bucket and
// collective semantics (REFERENCE.md §1), and the memory replay's golden numbers.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <map>
#include <set>
#include <numeric>

#include <fmt/format.h>

#include "cli/simulate.hpp"
#include "sim/compute_model.hpp"
#include "sim/memory.hpp"
#include "sim/timing.hpp"
#include "zero/lower.hpp"
#include "zero/lower/graph_facts.hpp"

using namespace zp;
using zero::Category;
using zero::CollKind;
using zero::EventKind;
using zero::Trigger;

namespace {

zero::DsConfig config(int stage, std::int64_t micro, std::int64_t gas, bool fp16 = true) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", micro},
                      {"gradient_accumulation_steps", gas},
                      {"zero_optimization", {{"stage", stage}}}};
  if (fp16) j["fp16"] = {{"enabled", true}};
  return zero::parse_ds_config("test.json", j);
}

struct Built {
  models::OpGraph g;
  zero::Program p;
  sim::MemoryReport m;
};

Built build(const std::string& model, const zero::DsConfig& cfg, int N, std::int64_t seq, bool ckpt = false,
            int rank = -1) {
  Built b;
  const auto mc = models::load_model(model);
  const auto batch = zero::resolve_batch(cfg, N);
  models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = seq;
  go.act_dtype = cfg.model_dtype();
  go.gradient_checkpointing = ckpt;
  b.g = models::build_graph(mc, go);
  zero::LowerOptions lo;
  lo.world_size = N;
  lo.rank = rank >= 0 ? rank : zero::heaviest_rank(b.g, cfg, N);
  lo.activation_checkpointing = ckpt;
  b.p = zero::lower(b.g, cfg, batch, lo);
  b.m = sim::replay_memory(b.p, sim::find_device("A100-80GB"));
  return b;
}

std::int64_t psi(const models::OpGraph& g) { return g.param_count(); }

struct CollStats {
  std::map<CollKind, std::int64_t> count, elements;
  std::map<Trigger, std::int64_t> by_trigger;
};
CollStats collectives(const zero::Program& p, int micro = -2) {
  CollStats s;
  for (const auto& e : p.events) {
    if (e.kind != EventKind::collective) continue;
    if (micro != -2 && e.micro_step != micro) continue;
    s.count[e.coll]++;
    s.elements[e.coll] += e.elements;
    s.by_trigger[e.trigger]++;
  }
  return s;
}

Bytes cat(const sim::MemoryReport& m, Category c) { return m.at_peak[static_cast<std::size_t>(c)]; }

// Independent replay: the sum of what is allocated and freed, to check the simulator's
// bookkeeping and the steady-state property (everything the step allocates, it frees).
Bytes live_after_step(const zero::Program& p) {
  std::int64_t live = 0;
  for (const auto& e : p.events) {
    for (auto b : p.allocs(e)) live += p.buffers[static_cast<std::size_t>(b)].placement == zero::Placement::device
                                           ? p.buffers[static_cast<std::size_t>(b)].bytes.v : 0;
    for (auto b : p.frees(e)) live -= p.buffers[static_cast<std::size_t>(b)].placement == zero::Placement::device
                                          ? p.buffers[static_cast<std::size_t>(b)].bytes.v : 0;
  }
  return Bytes{live};
}

}  // namespace

TEST_CASE("every stage and option lowers to a valid steady-state program") {
  for (const char* model : {"tiny-gpt2", "tiny-bert", "tiny-llama"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int gas : {1, 3}) {
        for (bool overlap : {false, true}) {
          for (bool ckpt : {false, true}) {
            for (bool fp16 : {true, false}) {
              auto cfg = config(stage, 2, gas, fp16);
              cfg.zero.overlap_comm = overlap;
              cfg.zero.reduce_bucket_size = 5000;
              cfg.zero.stage3_prefetch_bucket_size = 3000;
              cfg.zero.stage3_param_persistence_threshold = 100;
              CAPTURE(model);
              CAPTURE(stage);
              CAPTURE(gas);
              CAPTURE(overlap);
              CAPTURE(ckpt);
              const auto b = build(model, cfg, 4, 16, ckpt);
              CHECK_NOTHROW(b.p.validate());
              CHECK(live_after_step(b.p) == b.m.persistent);
              CHECK(b.m.peak_allocated >= b.m.persistent);
              Bytes sum{};
              for (auto v : b.m.at_peak) sum += v;
              CHECK(sum == b.m.peak_allocated);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("less common paths lower to valid programs") {
  auto base = config(2, 2, 2);
  base.zero.reduce_bucket_size = 3000;
  SUBCASE("reduce per destination rank") {
    base.zero.use_multi_rank_bucket_allreduce = false;
    const auto b = build("tiny-gpt2", base, 4, 16);
    CHECK_NOTHROW(b.p.validate());
    CHECK(collectives(b.p).count[CollKind::reduce] > 0);
    CHECK(collectives(b.p).count[CollKind::all_reduce] == 2);  // only the scalar overflow/norm
  }
  SUBCASE("contiguous_gradients false: no ipg bucket") {
    base.zero.contiguous_gradients = false;
    const auto b = build("tiny-gpt2", base, 4, 16);
    CHECK_NOTHROW(b.p.validate());
    CHECK(b.p.info.ipg_buffers == 0);
    CHECK(b.m.category_peak[static_cast<std::size_t>(Category::comm_buffers)].v > 0);  // flatten copies remain
  }
  SUBCASE("offload_optimizer cpu moves master, grads and states to the host") {
    base.zero.offload_optimizer.device = zero::OffloadDevice::cpu;
    const auto b = build("tiny-gpt2", base, 4, 16);
    CHECK_NOTHROW(b.p.validate());
    CHECK(cat(b.m, Category::master_params).v == 0);
    CHECK(cat(b.m, Category::optimizer_states).v == 0);
    const std::int64_t P = b.p.info.partition_elements;
    CHECK(b.m.host_at_peak[static_cast<std::size_t>(Category::master_params)].v == 4 * P);
    CHECK(b.m.host_at_peak[static_cast<std::size_t>(Category::optimizer_states)].v == 8 * P);
    CHECK(b.m.host_at_peak[static_cast<std::size_t>(Category::grads)].v == 4 * P);
  }
  SUBCASE("stage 3 with offload_param and offload_optimizer") {
    auto c = config(3, 2, 2);
    c.zero.offload_optimizer.device = zero::OffloadDevice::cpu;
    c.zero.offload_param.device = zero::OffloadDevice::cpu;
    const auto b = build("tiny-llama", c, 4, 16);
    CHECK_NOTHROW(b.p.validate());
    CHECK(b.m.peak_host.v > 0);
  }
  SUBCASE("stage 3 hpZ: backward gathers stay in the secondary group") {
    auto c = config(3, 2, 1);
    c.zero.zero_hpz_partition_size = 2;
    c.zero.stage3_param_persistence_threshold = 0;
    c.zero.stage3_max_reuse_distance = 0;
    c.zero.stage3_prefetch_bucket_size = 1;
    const auto b = build("tiny-gpt2", c, 4, 16);
    CHECK_NOTHROW(b.p.validate());
    int hpz = 0;
    for (const auto& e : b.p.events)
      if (e.kind == EventKind::collective && e.coll == CollKind::all_gather && e.group == 1) {
        ++hpz;
        CHECK(e.phase == zero::Phase::backward);
      }
    CHECK(hpz > 0);
    CHECK(b.p.groups[1].ranks.size() == 2);
  }
}

TEST_CASE("persistent model states follow the ZeRO formulas exactly (fp16 Adam)") {
  const int N = 4;
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    const auto b = build("tiny-gpt2", config(stage, 2, 2), N, 16);
    const std::int64_t P = psi(b.g);
    const std::int64_t padded = (P + 2 * N - 1) / (2 * N) * (2 * N);
    if (stage == 0) {
      CHECK(b.m.persistent.v == 2 * P + 4 * P + 8 * P);
    } else if (stage <= 2) {
      CHECK(b.p.info.padded_params == padded);
      CHECK(b.m.persistent.v == 2 * padded + (4 + 8) * padded / N);
    } else {
      std::int64_t part = 0, persist = 0;
      for (const auto& p : b.g.params) {
        part += (p.numel + N - 1) / N;
        if (p.numel <= 100000) persist += p.numel;
      }
      // 16-bit partition + persistent params + fp32 master + Adam + grad partition + bucket
      CHECK(b.m.persistent.v == 2 * part + 2 * persist + 4 * part + 8 * part + 2 * part + 2 * 500000000LL);
    }
  }
}

TEST_CASE("ZeRO paper model-state bytes at the peak (Llama-2-7b, N=64)") {
  // P_os: 4Ψ + 12Ψ/N; P_os+g: 2Ψ + 14Ψ/N; baseline 16Ψ (REFERENCE.md §1).
  const int N = 64;
  auto c1 = config(1, 1, 2);
  auto c2 = config(2, 1, 2);
  auto c0 = config(0, 1, 2);
  const auto b0 = build("Llama-2-7b", c0, N, 128);
  const auto b1 = build("Llama-2-7b", c1, N, 128);
  const auto b2 = build("Llama-2-7b", c2, N, 128);
  const std::int64_t P = psi(b1.g);
  const std::int64_t padded = b1.p.info.padded_params;
  auto states = [](const sim::MemoryReport& m) {
    return cat(m, Category::params).v + cat(m, Category::master_params).v + cat(m, Category::optimizer_states).v;
  };
  CHECK(states(b0.m) + cat(b0.m, Category::grads).v == 16 * P);
  // Stage 1's peak is in micro-step 1, with every full gradient accumulated.
  CHECK(states(b1.m) + cat(b1.m, Category::grads).v == 2 * padded + 12 * padded / N + 2 * P);
  // Stage 2 keeps grads_in_partition (≈ Ψ/N) plus the gradients in flight.
  const std::int64_t gip = zero::grads_in_partition_elements(b2.g, zero::flat_layout(b2.g, N), b2.p.info.rank);
  CHECK(states(b2.m) == 2 * padded + 12 * padded / N);
  CHECK(cat(b2.m, Category::grads).v >= 2 * gip);
  CHECK(cat(b2.m, Category::grads).v < 2 * gip + 2 * 300000000LL);
}

TEST_CASE("stage 1 reduces once per optimizer step, stage 2 every micro-step") {
  const int N = 4;
  const int gas = 3;
  auto c1 = config(1, 2, gas);
  auto c2 = config(2, 2, gas);
  c1.zero.reduce_bucket_size = c2.zero.reduce_bucket_size = 20000;
  const auto b1 = build("tiny-gpt2", c1, N, 16);
  const auto b2 = build("tiny-gpt2", c2, N, 16);
  const std::int64_t P = psi(b1.g);
  for (int m = 0; m < gas - 1; ++m) {
    CHECK(collectives(b1.p, m).count[CollKind::all_reduce] == 0);
    CHECK(collectives(b2.p, m).elements[CollKind::all_reduce] == P);
  }
  CHECK(collectives(b1.p, gas - 1).elements[CollKind::all_reduce] == P);
  CHECK(collectives(b2.p, gas - 1).elements[CollKind::all_reduce] == P);
  // Bucket count: greedy packing in hook order, a new bucket when the next grad does not fit.
  int expected = 0;
  {
    // Same packing rule as DeepSpeed: flush before adding when elements + numel > RBS.
    std::int64_t in_bucket = 0;
    std::map<models::ParamId, models::OpId> first;
    for (const auto& op : b2.g.ops)
      for (auto p : op.params)
        if (!first.count(p)) first[p] = op.id;
    // hooks fire in decreasing order of the first (earliest) op that reads the param
    std::vector<std::pair<models::OpId, models::ParamId>> hooks;
    for (auto [p, o] : first) hooks.push_back({o, p});
    std::stable_sort(hooks.begin(), hooks.end(), [](auto a, auto b) { return a.first > b.first; });
    for (auto [o, p] : hooks) {
      const auto n = b2.g.params[static_cast<std::size_t>(p)].numel;
      if (in_bucket + n > 20000 && in_bucket > 0) { ++expected; in_bucket = 0; }
      in_bucket += n;
    }
    if (in_bucket > 0) ++expected;
  }
  CHECK(collectives(b2.p, 0).count[CollKind::all_reduce] == expected);
  // Post-step all-gather of the updated partitions and the two scalar all-reduces.
  auto s2 = collectives(b2.p, -1);
  CHECK(s2.elements[CollKind::all_gather] == b2.p.info.padded_params);
  CHECK(s2.by_trigger[Trigger::overflow_check] == 1);
  CHECK(s2.by_trigger[Trigger::grad_norm] == 1);
}

TEST_CASE("per-rank volume per step: about 3Ψ at stages 1/2, not the paper's 2Ψ") {
  const int N = 8;
  const auto b = build("tiny-bert", config(1, 2, 1), N, 16);
  std::int64_t sent = 0;
  for (const auto& e : b.p.events) sent += b.p.bytes_sent(e).v;
  const std::int64_t P = psi(b.g);
  const double expected = 4.0 * static_cast<double>(P) * (N - 1) / N +
                          2.0 * static_cast<double>(b.p.info.padded_params) * (N - 1) / N;
  CHECK(static_cast<double>(sent) == zp::test::approx(expected).epsilon(0.001));
}

TEST_CASE("ipg buckets: one buffer, two under overlap_comm; stage 1 keeps it across micro-steps") {
  auto c = config(2, 2, 2);
  c.zero.reduce_bucket_size = 100000;
  c.zero.overlap_comm = false;
  auto one = build("tiny-gpt2", c, 4, 16);
  CHECK(one.p.info.ipg_buffers == 1);
  c.zero.overlap_comm = true;
  auto two = build("tiny-gpt2", c, 4, 16);
  CHECK(two.p.info.ipg_buffers == 2);
  CHECK(two.m.category_peak[static_cast<std::size_t>(Category::comm_buffers)].v >= 2 * 2 * 100000);
  // Overlap: reductions on the reduction stream; without: on the compute stream.
  int full = 0;
  for (const auto& e : two.p.events)
    if (e.kind == EventKind::collective && e.trigger == Trigger::bucket_full) {
      ++full;
      CHECK(e.stream == zero::Stream::reduction);
    }
  CHECK(full > 0);  // the 100000-element bucket fills during backward
  for (const auto& e : one.p.events)
    if (e.kind == EventKind::collective) CHECK(e.stream == zero::Stream::compute);
  // Stage 1: the bucket allocated in micro-step 0 is freed only at the boundary.
  auto c1 = config(1, 2, 3);
  c1.zero.reduce_bucket_size = 100000;
  auto s1 = build("tiny-gpt2", c1, 4, 16);
  int allocs = 0;
  for (const auto& e : s1.p.events)
    for (auto bid : s1.p.allocs(e))
      if (s1.p.buffers[static_cast<std::size_t>(bid)].role == zero::BufferRole::ipg_bucket) {
        ++allocs;
        CHECK(e.micro_step == 0);
      }
  CHECK(allocs == 1);
}

TEST_CASE("stage 3: gathers, releases and reduce-scatters") {
  const int N = 4;
  auto c = config(3, 2, 1);
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.stage3_max_reuse_distance = 0;
  c.zero.stage3_prefetch_bucket_size = 1;  // no useful prefetch
  c.zero.reduce_bucket_size = 50000;
  const auto b = build("tiny-gpt2", c, N, 16);
  std::int64_t gathered = 0, padded = 0, rs = 0;
  for (const auto& e : b.p.events)
    if (e.kind == EventKind::collective && e.coll == CollKind::all_gather) gathered += e.elements;
  for (const auto& p : b.g.params) padded += N * ((p.numel + N - 1) / N);
  for (const auto& e : b.p.events)
    if (e.kind == EventKind::collective && e.coll == CollKind::reduce_scatter) rs += e.elements;
  // Every param gathered in forward and again in backward (2Ψ), reduce-scattered once (Ψ).
  // Tied weights (wte used by the embedding and lm_head) are gathered once per visit.
  CHECK(gathered >= 2 * padded);
  CHECK(rs == padded);
  // With the default reuse distance (1e9 elements) nothing is released in forward.
  auto d = config(3, 2, 1);
  const auto keep = build("tiny-gpt2", d, N, 16);
  std::int64_t gathered_default = 0;
  for (const auto& e : keep.p.events)
    if (e.kind == EventKind::collective && e.coll == CollKind::all_gather) gathered_default += e.elements;
  CHECK(gathered_default < gathered);
  CHECK(keep.m.at_peak[static_cast<std::size_t>(Category::params)] > b.m.at_peak[static_cast<std::size_t>(Category::params)]);
}

// Stage 3 runs nn.Linear through DeepSpeed's LinearFunctionForZeroStage3: on a 3-D input the
// bias is added by a kernel of its own (the H100 profile: 147 broadcast adds in BERT-large's
// forward, GEMMs without their bias epilogue). A 2-D input (BERT's next-sentence head on the
// pooled output) goes through addmm; GPT-2's Conv1D, the pooler's first-token linear and
// bias-free linears are untouched; stages 0-2 run PyTorch's own linear, and so does stage 3
// with memory_efficient_linear off.
TEST_CASE("stage 3: a linear's bias added apart on 3-D inputs, in forward and recomputation, priced as DeepSpeed's work") {
  for (const bool ckpt : {false, true}) {
    CAPTURE(ckpt);
    const auto b3 = build("tiny-bert", config(3, 2, 1), 2, 16, ckpt);
    int unfused = 0, recomputed = 0;
    std::set<std::string> ops;
    for (const auto& e : b3.p.events) {
      if (!e.unfused_bias) continue;
      REQUIRE(e.kind == EventKind::compute);
      CHECK(e.phase != zero::Phase::backward);
      const auto& op = b3.g.ops[static_cast<std::size_t>(e.op)];
      CHECK(op.fn == models::Fn::linear);
      CHECK(b3.g.tensors[static_cast<std::size_t>(op.inputs.front())].shape.size() >= 3);
      ops.insert(op.name);
      ++unfused;
      recomputed += e.phase == zero::Phase::recompute;
    }
    int biased_3d = 0;
    bool two_d = false;
    for (const auto& op : b3.g.ops) {
      if (op.fn != models::Fn::linear || op.gemms.empty() || !op.gemms.front().bias) continue;
      if (b3.g.tensors[static_cast<std::size_t>(op.inputs.front())].shape.size() >= 3) {
        ++biased_3d;
        CHECK(ops.count(op.name) == 1);
      } else {
        two_d = true;
        CHECK(ops.count(op.name) == 0);  // addmm: the bias in the product
      }
    }
    CHECK(two_d);
    CHECK(biased_3d > 0);
    CHECK(unfused == biased_3d + recomputed);
    CHECK((recomputed > 0) == ckpt);

    // The simulator adds each one's cost where it prices DeepSpeed's own work, and not for
    // zeroplan's executor; a profiler would class it beside the product, not in it.
    const sim::DeviceProfile prof = sim::default_profile(sim::find_device("A100-80GB"));
    sim::ComputeModel cm(prof, b3.g);
    for (const auto& e : b3.p.events) {
      if (!e.unfused_bias) continue;
      const double product = cm.compute_cost(e.op, e.phase, e.flops, e.mem_bytes).v;
      const double add = cm.unfused_bias_cost(e.op).v;
      CHECK(add > 0);
      CHECK(cm.cost(e).v == zp::test::approx(product + add));
      CHECK(cm.bias_part(e).v == zp::test::approx(add));
      cm.deepspeed = false;
      CHECK(cm.cost(e).v == zp::test::approx(product));
      CHECK(cm.bias_part(e).v == 0);
      cm.deepspeed = true;
      break;
    }
  }
  for (const int stage : {0, 1, 2})
    for (const auto& e : build("tiny-bert", config(stage, 2, 1), 2, 16).p.events) CHECK_FALSE(e.unfused_bias);
  auto plain = config(3, 2, 1);
  plain.zero.memory_efficient_linear = false;
  for (const auto& e : build("tiny-bert", plain, 2, 16).p.events) CHECK_FALSE(e.unfused_bias);
  for (const char* model : {"tiny-gpt2", "tiny-llama"})
    for (const auto& e : build(model, config(3, 2, 1), 2, 16).p.events) CHECK_FALSE(e.unfused_bias);
}

// Stage 3 replaces F.linear by DeepSpeed's own autograd function (LinearFunctionForZeroStage3,
// zero.Init's _enable_mem_efficient_linear when the model's params are converted): its Python runs
// once per nn.Linear call in forward (recomputation too) and once in backward, on the host event
// that issues the op. GPT-2's Conv1D calls addmm itself; stages 0-2 and memory_efficient_linear off
// leave F.linear alone.
TEST_CASE("stage 3: DeepSpeed's linear function's Python on the host, per nn.Linear call in forward and backward") {
  auto counts = [](const Built& b) {
    std::map<zero::Phase, int> n;
    for (const auto& e : b.p.events)
      if (e.kind == EventKind::host) n[e.phase] += e.host.linear_functions;
    return n;
  };
  auto linears = [](const models::OpGraph& g) {
    int n = 0;
    for (const auto& op : g.ops) n += op.fn == models::Fn::linear || op.fn == models::Fn::linear_first_token;
    return n;
  };
  for (const std::string model : {"tiny-bert", "tiny-llama", "tiny-gpt2"})
    for (const bool ckpt : {false, true}) {
      CAPTURE(model);
      CAPTURE(ckpt);
      const auto b3 = build(model, config(3, 2, 1), 2, 16, ckpt);
      const int n = linears(b3.g);
      CHECK(n > 0);  // GPT-2's head is an nn.Linear, its blocks' Conv1D are not
      auto c = counts(b3);
      CHECK(c[zero::Phase::forward] == n);
      CHECK(c[zero::Phase::backward] == n);
      int recomputed = 0;  // the checkpointed layers' linears, run again before their backward
      for (const auto& e : b3.p.events)
        if (e.kind == EventKind::compute && e.phase == zero::Phase::recompute && e.op >= 0) {
          const auto fn = b3.g.ops[static_cast<std::size_t>(e.op)].fn;
          recomputed += fn == models::Fn::linear || fn == models::Fn::linear_first_token;
        }
      CHECK(c[zero::Phase::recompute] == recomputed);
      CHECK((recomputed > 0) == (ckpt && model != "tiny-gpt2"));  // GPT-2's head is outside the layers

      // Priced at the profile's per-call costs, forward and recomputation at the forward's.
      sim::HostCosts h = sim::default_host_costs();
      h.stage3_linear_forward = Seconds{1e-4};
      h.stage3_linear_backward = Seconds{3e-4};
      auto none = h;
      none.stage3_linear_forward = none.stage3_linear_backward = Seconds{0};
      double fwd = 0, bwd = 0;
      for (const auto& e : b3.p.events) {
        if (e.kind != EventKind::host) continue;
        const double extra = sim::host_cost(h, e).v - sim::host_cost(none, e).v;
        (e.phase == zero::Phase::backward ? bwd : fwd) += extra;
      }
      CHECK(fwd == zp::test::approx(1e-4 * (n + recomputed)));
      CHECK(bwd == zp::test::approx(3e-4 * n));
    }
  for (const int stage : {0, 1, 2})
    for (const auto& [ph, k] : counts(build("tiny-bert", config(stage, 2, 1), 2, 16))) CHECK(k == 0);
  auto plain = config(3, 2, 1);
  plain.zero.memory_efficient_linear = false;
  const auto off = build("tiny-bert", plain, 2, 16);
  for (const auto& [ph, k] : counts(off)) CHECK(k == 0);
  // Its `output += bias` on a 3-D input is one more eager op on the host (Event::unfused_bias).
  const auto on = build("tiny-bert", config(3, 2, 1), 2, 16);
  auto host_ops = [](const Built& b) {
    int n = 0;
    for (const auto& e : b.p.events) n += e.kind == EventKind::host ? e.host.ops : 0;
    return n;
  };
  int unfused = 0;
  for (const auto& e : on.p.events) unfused += e.unfused_bias;
  CHECK(unfused > 0);
  CHECK(host_ops(on) == host_ops(off) + unfused);
}

TEST_CASE("activation checkpointing keeps layer inputs and recomputes") {
  auto c = config(1, 4, 1);
  const auto plain = build("tiny-gpt2", c, 2, 64, false);
  const auto ck = build("tiny-gpt2", c, 2, 64, true);
  CHECK(cat(ck.m, Category::activations) < cat(plain.m, Category::activations));
  int recompute = 0;
  for (const auto& e : ck.p.events) recompute += e.kind == zero::EventKind::compute && e.phase == zero::Phase::recompute;
  int layer_ops = 0;
  for (const auto& op : ck.g.ops) layer_ops += op.layer >= 0;
  CHECK(recompute == layer_ops);
}

TEST_CASE("heaviest rank: stage 1/2 grads_in_partition differs by rank") {
  const auto mc = models::load_model("tiny-gpt2");
  models::GraphOptions go;
  go.micro_batch = 1;
  go.seq_len = 8;
  const auto g = models::build_graph(mc, go);
  const auto l = zero::flat_layout(g, 3);
  std::int64_t best = 0;
  for (int r = 0; r < 3; ++r) best = std::max(best, zero::grads_in_partition_elements(g, l, r));
  const int hr = zero::heaviest_rank(g, config(2, 1, 1), 3);
  CHECK(zero::grads_in_partition_elements(g, l, hr) == best);
  CHECK(best >= l.partition);
  CHECK(zero::heaviest_rank(g, config(3, 1, 1), 3) == 0);
}

TEST_CASE("the example: bert-large on 4 x V100-16GB, micro-batch 64, seq-len 128") {
  cli::SimRequest req;
  req.model = "bert-large-uncased";
  req.ds_config = std::string(ZEROPLAN_SHARED_DIR) + "/examples/bert_large_ds_config.json";
  req.gpus = 4;
  req.gpu = "V100-16GB";
  req.micro_batch = 64;
  req.seq_len = 128;
  req.stages = {0, 1, 2, 3};
  const auto in = cli::load_inputs(req);
  CHECK(!in.warnings.empty());  // sparse_attention is accepted with a warning
  const auto rs = cli::simulate(in, req);
  REQUIRE(rs.size() == 4);
  for (const auto& r : rs) {
    CHECK(r.batch.gas == 16);
    CHECK_NOTHROW(r.program.validate());
  }
  // The ipg bucket (5e8 × 2 B) is live at both stage 1 and stage 2 peaks.
  for (int s : {1, 2}) CHECK(cat(rs[static_cast<std::size_t>(s)].memory, Category::comm_buffers).v >= 1000000000);
  // The activation high-water mark is the same graph's at stages 0-2.
  const auto act = static_cast<std::size_t>(Category::activations);
  CHECK(rs[1].memory.category_peak[act] == rs[2].memory.category_peak[act]);
  CHECK(rs[0].memory.category_peak[act] == rs[1].memory.category_peak[act]);
}

namespace {
// The memory reports of two programs of one configuration agree (the skip count aside).
void check_same_memory(const sim::MemoryReport& a, const sim::MemoryReport& b) {
  CHECK(a.peak_allocated == b.peak_allocated);
  CHECK(a.peak_event == b.peak_event);
  CHECK(a.at_peak == b.at_peak);
  CHECK(a.category_peak == b.category_peak);
  CHECK(a.persistent == b.persistent);
  CHECK(a.reserved_peak == b.reserved_peak);
  CHECK(a.allocator_allocated_peak == b.allocator_allocated_peak);
  CHECK(a.segments == b.segments);
  CHECK(a.peak_host == b.peak_host);
  CHECK(a.host_at_peak == b.host_at_peak);
  CHECK(a.fits == b.fits);
  CHECK(a.allocator_oom == b.allocator_oom);
}
}  // namespace

TEST_CASE("the replay skips copies once one starts where the one before did, and changes no result") {
  // The replay of a program whose block repeats skips the copies once one starts from the
  // state the one before started from; a replay that skips nothing (timeline on) and the
  // replay of the program lowered one by one must agree with it.
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool overlap : {false, true}) {
      auto c = config(stage, 2, 9);
      c.zero.overlap_comm = overlap;
      c.zero.reduce_bucket_size = 7000;
      const auto b = build("tiny-llama", c, 4, 32);
      REQUIRE(b.p.repeat.copies >= 4);
      zero::LowerOptions lo;
      lo.world_size = 4;
      lo.rank = zero::heaviest_rank(b.g, c, 4);
      lo.replicate_micro_steps = false;
      const auto one_by_one = zero::lower(b.g, c, zero::resolve_batch(c, 4), lo);
      sim::MemoryOptions full;
      full.timeline = true;
      for (const char* gpu : {"A100-80GB", "cpu"}) {
        const auto& dev = sim::find_device(gpu);
        const auto fast = sim::replay_memory(b.p, dev);
        const auto slow = sim::replay_memory(b.p, dev, full);
        const auto ref = sim::replay_memory(one_by_one, dev, full);
        CAPTURE(stage);
        CAPTURE(overlap);
        CAPTURE(gpu);
        check_same_memory(fast, slow);
        check_same_memory(fast, ref);
        CHECK(slow.timeline.size() == static_cast<std::size_t>(b.p.num_events()));
        CHECK(slow.timeline == ref.timeline);
        CHECK(slow.skipped_micro_steps == 0);
        CHECK(fast.skipped_micro_steps >= b.p.repeat.copies - 1);
      }
    }
  }
}

namespace {
std::int64_t count_buffers(const zero::Program& p, zero::BufferRole role) {
  std::int64_t n = 0;
  for (const auto& b : p.buffers) n += b.role == role;
  return n;
}
std::int64_t count_events(const zero::Program& p, EventKind k, int coll = -1) {
  std::int64_t n = 0;
  for (const auto& e : p.events) n += e.kind == k && (coll < 0 || static_cast<int>(e.coll) == coll);
  return n;
}
zero::DsConfig bf16_config(int stage, std::int64_t micro, std::int64_t gas, bool fp32_accum) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", micro},
                      {"gradient_accumulation_steps", gas},
                      {"bf16", {{"enabled", true}}},
                      {"zero_optimization", {{"stage", stage}}}};
  if (fp32_accum) j["data_types"] = {{"grad_accum_dtype", "fp32"}};
  return zero::parse_ds_config("test.json", j);
}
}  // namespace

TEST_CASE("optimizer wrappers follow engine.py: FP16_Optimizer for 16-bit stage 0, BF16_Optimizer for bf16 ZeRO-1 with fp32 accumulation") {
  const int N = 4;
  // Stage 0 bf16 (grad_accum_dtype = model dtype): FP16_Optimizer, nothing partitioned.
  const auto s0 = build("tiny-gpt2", bf16_config(0, 2, 2, false), N, 16);
  const std::int64_t P = psi(s0.g);
  CHECK(s0.m.persistent.v == 2 * P + 4 * P + 8 * P);
  CHECK(count_events(s0.p, EventKind::collective, static_cast<int>(CollKind::all_gather)) == 0);
  // Its step: per-param fp32 copies (4Ψ) and their flat copy (4Ψ) are live together.
  CHECK(s0.m.category_peak[static_cast<std::size_t>(Category::temporaries)].v >= 8 * P);
  // Stage 1 bf16 + fp32 accumulation: BF16_Optimizer, flat 16-bit params and fp32 grads
  // aligned to 2N (Ψ'), partitioned master and states.
  const auto b1 = build("tiny-gpt2", bf16_config(1, 2, 2, true), 5, 16);  // 5 ranks: Ψ is not a multiple of 10
  const auto layout = zero::flat_layout(b1.g, 5);
  const std::int64_t part = layout.partition;
  CHECK(layout.padded > P);  // the alignment pads this model
  CHECK(b1.m.persistent.v == 2 * layout.padded + 4 * layout.padded + 4 * part + 8 * part);
  // Each hook adds the param's gradient into the fp32 buffer at its flat offset; the step
  // updates the partition, casts it into the 16-bit params and all-gathers them.
  std::int64_t accumulated = 0;
  for (const auto& e : b1.p.events) {
    if (e.copy_op != zero::CopyOp::grad_accumulate) continue;
    ++accumulated;
    REQUIRE(b1.p.slices(e).size() == 1);
    const auto& sl = b1.p.slices(e).front();
    CHECK(sl.bucket_offset == layout.offset[static_cast<std::size_t>(sl.param)]);
    CHECK(b1.p.buffers[static_cast<std::size_t>(e.dst_buf)].role == zero::BufferRole::flat_grads32);
  }
  CHECK(accumulated == 2 * static_cast<std::int64_t>(b1.g.params.size()));
  CHECK(count_events(b1.p, EventKind::optimizer) == 1);
  int master_copies = 0;
  for (const auto& e : b1.p.events) master_copies += e.copy_op == zero::CopyOp::master_to_params;
  CHECK(master_copies == 1);
  CHECK(b1.p.info.ipg_buffers == 0);
  CHECK(count_buffers(b1.p, zero::BufferRole::ipg_bucket) == 0);
  CHECK(count_events(b1.p, EventKind::collective, static_cast<int>(CollKind::all_gather)) == 1);
  // Stage 2 with fp32 accumulation keeps grads_in_partition in fp32.
  const auto b2 = build("tiny-gpt2", bf16_config(2, 2, 2, true), N, 16);
  for (const auto& b : b2.p.buffers)
    if (b.role == zero::BufferRole::grads_in_partition) CHECK(b.dtype == DType::fp32);
}

TEST_CASE("reduction paths: flatten copies only where DeepSpeed makes them") {
  auto c = config(2, 2, 1);
  c.zero.reduce_bucket_size = 20000;
  const auto dflt = build("tiny-gpt2", c, 4, 16);
  CHECK(count_buffers(dflt.p, zero::BufferRole::comm_staging) > 0);  // allreduce_bucket flattens
  c.zero.reduce_scatter = false;                                       // in-place all-reduce of the bucket
  const auto inplace = build("tiny-gpt2", c, 4, 16);
  CHECK(count_buffers(inplace.p, zero::BufferRole::comm_staging) == 0);
  CHECK(count_events(inplace.p, EventKind::collective, static_cast<int>(CollKind::all_reduce)) ==
        count_events(dflt.p, EventKind::collective, static_cast<int>(CollKind::all_reduce)));
  c.zero.reduce_scatter = true;
  c.zero.use_multi_rank_bucket_allreduce = false;                      // per-destination reduce, in place
  const auto per_rank = build("tiny-gpt2", c, 4, 16);
  CHECK(count_buffers(per_rank.p, zero::BufferRole::comm_staging) == 0);
  CHECK(count_events(per_rank.p, EventKind::collective, static_cast<int>(CollKind::reduce)) > 0);
  // fp32 training: the step's flat partition gradients are one fp32 copy, no cast.
  const auto f = build("tiny-gpt2", config(2, 2, 1, false), 4, 16);
  CHECK(count_buffers(f.p, zero::BufferRole::step_temp) == 0);
  CHECK(count_buffers(f.p, zero::BufferRole::flat_grads32) == 1);
}

TEST_CASE("stage 3: bucket only with contiguous gradients; all-reduce without reduce_scatter; sub-groups of whole params") {
  auto c = config(3, 2, 1);
  c.zero.contiguous_gradients = false;
  const auto nc = build("tiny-llama", c, 4, 16);
  CHECK(count_buffers(nc.p, zero::BufferRole::ipg_bucket) == 0);
  c.zero.contiguous_gradients = true;
  c.zero.reduce_scatter = false;
  const auto ar = build("tiny-llama", c, 4, 16);
  CHECK(count_events(ar.p, EventKind::collective, static_cast<int>(CollKind::reduce_scatter)) == 0);
  CHECK(count_events(ar.p, EventKind::collective, static_cast<int>(CollKind::all_reduce)) > 2);
  c.zero.reduce_scatter = true;
  c.zero.sub_group_size = 1;  // every param its own sub-group, not one group per element
  const auto sg = build("tiny-llama", c, 4, 16);
  CHECK(count_events(sg.p, EventKind::optimizer) == static_cast<std::int64_t>(sg.g.params.size()));
  // allgather_bucket_size does not split the post-step all-gather (stage 2).
  auto c2 = config(2, 2, 1);
  c2.zero.allgather_bucket_size = 1;
  const auto ag = build("tiny-gpt2", c2, 4, 16);
  CHECK(count_events(ag.p, EventKind::collective, static_cast<int>(CollKind::all_gather)) == 1);
  // N = 1: no post-step all-gather.
  const auto one = build("tiny-gpt2", config(2, 2, 1), 1, 16);
  CHECK(count_events(one.p, EventKind::collective, static_cast<int>(CollKind::all_gather)) == 0);
}

TEST_CASE("stage 3 release keeps params the prefetcher passed (fetched for a later step)") {
  auto c = config(3, 2, 1);
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.stage3_max_reuse_distance = 0;
  auto backward_fetches = [](const zero::Program& p) {
    int n = 0;
    for (const auto& e : p.events)
      n += e.kind == EventKind::collective && e.trigger == Trigger::module_fetch && e.phase == zero::Phase::backward;
    return n;
  };
  c.zero.stage3_prefetch_bucket_size = 1;  // the prefetcher passes at most one use ahead
  const auto narrow = build("tiny-gpt2", c, 4, 16);
  c.zero.stage3_prefetch_bucket_size = 100000000;  // it passes every later use at the first module
  const auto wide = build("tiny-gpt2", c, 4, 16);
  CHECK(backward_fetches(narrow.p) > 0);
  CHECK(backward_fetches(wide.p) == 0);
  CHECK(wide.m.at_peak[static_cast<std::size_t>(Category::params)] > narrow.m.at_peak[static_cast<std::size_t>(Category::params)]);
}

TEST_CASE("stage 2 with accumulation: the accumulated partition and a new grads_in_partition coexist") {
  auto c = config(2, 2, 3);
  c.zero.reduce_bucket_size = 5000;  // reductions during backward, while the accumulator lives
  const auto b = build("tiny-gpt2", c, 4, 16);
  const std::int64_t gip = zero::grads_in_partition_elements(b.g, zero::flat_layout(b.g, 4), b.p.info.rank) * 2;
  CHECK(b.m.category_peak[static_cast<std::size_t>(Category::grads)].v >= 2 * gip);
  std::int64_t gip_buffers = 0;
  for (const auto& buf : b.p.buffers) gip_buffers += buf.role == zero::BufferRole::grads_in_partition;
  CHECK(gip_buffers == 3);  // one per micro-step
  // GAS 1: a single grads_in_partition, kept to the step.
  const auto one = build("tiny-gpt2", config(2, 2, 1), 4, 16);
  std::int64_t n1 = 0;
  for (const auto& buf : one.p.buffers) n1 += buf.role == zero::BufferRole::grads_in_partition;
  CHECK(n1 == 1);
}

namespace {
// One configuration lowered with repeated micro-steps stored once (`compact`) and one by
// one (`full`), and how many copies the repeat stands for.
struct BothWays {
  zero::Program compact, full;
  int copied = -1;
};
BothWays lower_both_ways(const models::OpGraph& g, const zero::DsConfig& cfg, const zero::Batch& batch,
                         zero::LowerOptions lo) {
  BothWays b;
  lo.replicate_micro_steps = true;
  lo.copied_micro_steps = &b.copied;
  b.compact = zero::lower(g, cfg, batch, lo);
  lo.replicate_micro_steps = false;
  lo.copied_micro_steps = nullptr;
  b.full = zero::lower(g, cfg, batch, lo);
  CHECK(b.full.repeat.copies == 0);
  CHECK(b.compact.repeat.copies == std::max(b.copied, 0));
  return b;
}

// The two programs are the same step: the compact one expanded equals the one lowered one by
// one, list for list and field for field, and every name and count agrees.
void check_same_program(const zero::Program& compact, const zero::Program& full) {
  CHECK_NOTHROW(compact.validate());
  const zero::Program expanded = zero::expand(compact);
  CHECK(expanded.events == full.events);
  CHECK(expanded.buffers == full.buffers);
  CHECK(expanded.labels == full.labels);
  CHECK(expanded.alloc_list == full.alloc_list);
  CHECK(expanded.free_list == full.free_list);
  CHECK(expanded.dep_list == full.dep_list);
  CHECK(expanded.slice_list == full.slice_list);
  CHECK(expanded == full);
  CHECK(compact.num_events() == static_cast<std::int64_t>(full.events.size()));
  CHECK(compact.num_buffers() == static_cast<std::int64_t>(full.buffers.size()));
  for (zero::EventId e = 0; e < static_cast<zero::EventId>(full.events.size()); e += 7) {
    CHECK(compact.event_name(e) == full.event_name(e));
    const auto at = compact.stored_event(e);
    CHECK(compact.logical_event(at.id, at.copy) == e);
  }
}

// The two programs' times agree: phases, communication, busy time, the critical path, and
// every event's start and end.
void check_same_time(const sim::TimeReport& a, const sim::TimeReport& b, std::int64_t events) {
  CHECK(a.phases == b.phases);
  CHECK(a.comm == b.comm);
  CHECK(a.busy == b.busy);
  CHECK(a.processed == b.processed);
  CHECK(a.critical_path.size() == b.critical_path.size());
  CHECK(a.critical_path.events() == b.critical_path.events());
  std::int64_t differ = 0;
  for (zero::EventId e = 0; e < events; ++e) differ += a.at(e) == b.at(e) ? 0 : 1;
  CHECK(differ == 0);
}

sim::TimeReport run(const zero::Program& p, const models::OpGraph& g, const cli::Inputs& in, double interference) {
  const sim::ComputeModel cm(in.profile, g);
  sim::EngineOptions eo;
  eo.interference = interference;
  return sim::run_events(p, sim::event_durations(p, cm, *in.collectives), eo);
}

// A configuration drawn over every knob the lowering reads.
struct Drawn {
  std::string model;
  nlohmann::json ds;
  int N = 1;
  int rank = 0;
  bool ckpt = false;
  double interference = 0;
};
template <class Pick>
Drawn draw(Pick&& pick, std::int64_t gas) {
  const char* models_[] = {"tiny-gpt2", "tiny-bert", "tiny-llama"};
  const std::int64_t buckets[] = {500, 3000, 7000, 500000000};
  Drawn d;
  d.model = models_[pick(3)];
  const int stage = static_cast<int>(pick(4));
  const int dtype = static_cast<int>(pick(3));  // fp16, bf16, fp32
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", gas},
                      {"zero_optimization", {{"stage", stage}}}};
  if (dtype == 0) j["fp16"] = {{"enabled", true}};
  if (dtype == 1) j["bf16"] = {{"enabled", true}};
  if (dtype == 1 && stage >= 1 && pick(2)) j["data_types"] = {{"grad_accum_dtype", "fp32"}};
  auto& z = j["zero_optimization"];
  z["overlap_comm"] = pick(2) == 1;
  z["contiguous_gradients"] = pick(4) != 0;
  z["reduce_scatter"] = pick(4) != 0;
  z["use_multi_rank_bucket_allreduce"] = pick(4) != 0;
  z["reduce_bucket_size"] = buckets[pick(4)];
  if (stage >= 1 && pick(4) == 0) z["offload_optimizer"] = {{"device", "cpu"}};
  d.N = 1 << pick(3);
  if (stage == 3) {
    z["stage3_prefetch_bucket_size"] = buckets[pick(4)];
    z["stage3_param_persistence_threshold"] = pick(2) ? 100 : 0;
    z["stage3_max_live_parameters"] = pick(2) ? 20000 : 1000000000;
    z["stage3_max_reuse_distance"] = pick(2) ? 0 : 1000000000;
    if (pick(4) == 0) z["offload_param"] = {{"device", "cpu"}};
    if (d.N == 4 && pick(2)) z["zero_hpz_partition_size"] = 2;
  }
  d.ds = j;
  d.ckpt = pick(2) == 1;
  d.rank = static_cast<int>(pick(static_cast<std::uint64_t>(d.N)));
  d.interference = pick(2) ? 0.0 : 0.3;
  return d;
}

struct Lowered {
  models::OpGraph g;
  BothWays both;
};
Lowered lower_drawn(const Drawn& d) {
  const auto cfg = zero::parse_ds_config("test.json", d.ds);
  const auto batch = zero::resolve_batch(cfg, d.N);
  models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = 16;
  go.act_dtype = cfg.model_dtype();
  go.gradient_checkpointing = d.ckpt;
  Lowered l;
  l.g = models::build_graph(models::load_model(d.model), go);
  zero::LowerOptions lo;
  lo.world_size = d.N;
  lo.rank = d.rank;
  lo.activation_checkpointing = d.ckpt;
  l.both = lower_both_ways(l.g, cfg, batch, lo);
  return l;
}

cli::Inputs inputs_for(int gpus) {
  cli::SimRequest req;
  req.model = "tiny-gpt2";
  req.gpus = gpus;
  req.gpu = "A100-80GB";
  return cli::load_inputs(req);
}
}  // namespace

TEST_CASE("a repeated micro-step stored once gives the program and the results of lowering every one") {
  // A seeded sample of configurations over every knob the lowering reads: the program
  // whose micro-steps 3 .. GAS-2 stand for one stored micro-step (Program::repeat),
  // expanded, must equal list for list and field for field the program with every
  // micro-step lowered; its memory replay and its run in time must give the same reports.
  std::uint64_t state = 0x9e3779b97f4a7c15ULL;
  auto pick = [&](std::uint64_t n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state % n;
  };
  std::map<int, cli::Inputs> inputs;
  int copied_any = 0, periodic = 0, cases = 0;
  for (int i = 0; i < 400; ++i) {
    const std::int64_t gas = std::int64_t{7} + static_cast<std::int64_t>(pick(8));
    const Drawn d = draw(pick, gas);
    const Lowered l = lower_drawn(d);
    const auto& [compact, full, copied] = l.both;
    CAPTURE(d.ds.dump());
    CAPTURE(d.model);
    CAPTURE(d.N);
    CAPTURE(d.ckpt);
    check_same_program(compact, full);
    for (const char* gpu : {"A100-80GB", "cpu"})
      check_same_memory(sim::replay_memory(compact, sim::find_device(gpu)), sim::replay_memory(full, sim::find_device(gpu)));
    if (!inputs.count(d.N)) inputs.emplace(d.N, inputs_for(d.N));
    const auto tc = run(compact, l.g, inputs.at(d.N), d.interference);
    const auto tf = run(full, l.g, inputs.at(d.N), d.interference);
    check_same_time(tc, tf, full.num_events());
    ++cases;
    if (copied > 0) ++copied_any;
    if (tc.ns.last > tc.ns.reference) ++periodic;
  }
  MESSAGE(copied_any << " of " << cases << " sampled programs store a repeated micro-step once; " << periodic
                     << " ran some copies as a periodic stretch");
  CHECK(copied_any > cases / 2);  // the common case is stored once, not only checked
  CHECK(periodic > cases / 2);

  // The README example at every stage: 12 of its 16 micro-steps are copies of the stored
  // one at stages 0 and 3, 11 at stages 1 and 2. There micro-step 1's host waits (the launch
  // queue) for an op of micro-step 0, which is not laid out as the later ones are (at stage
  // 2, for instance, it keeps its grads_in_partition as the accumulated partition, and the
  // later ones add theirs to it), so micro-step 2 is the first that repeats the one before.
  for (int stage = 0; stage <= 3; ++stage) {
    auto cfg = config(stage, 64, 16);
    cfg.zero.reduce_bucket_size = 500000000;
    const auto batch = zero::resolve_batch(cfg, 4);
    models::GraphOptions go;
    go.micro_batch = batch.micro_batch;
    go.seq_len = 128;
    go.act_dtype = cfg.model_dtype();
    const auto g = models::build_graph(models::load_model("bert-large-uncased"), go);
    zero::LowerOptions lo;
    lo.world_size = 4;
    lo.rank = zero::heaviest_rank(g, cfg, 4);
    const auto [compact, full, copied] = lower_both_ways(g, cfg, batch, lo);
    CAPTURE(stage);
    CHECK(copied == (stage == 1 || stage == 2 ? 11 : 12));
    check_same_program(compact, full);
    cli::SimRequest req;
    req.model = "bert-large-uncased";
    req.gpus = 4;
    req.gpu = "V100-16GB";
    const auto in = cli::load_inputs(req);
    check_same_time(run(compact, g, in, in.profile.comm_compute_interference),
                    run(full, g, in, in.profile.comm_compute_interference), full.num_events());
    check_same_memory(sim::replay_memory(compact, sim::find_device("V100-16GB")),
                      sim::replay_memory(full, sim::find_device("V100-16GB")));
  }
}

TEST_CASE("large GAS: what is stored does not grow, the results equal lowering every micro-step") {
  // GAS 64 and 1000 over sampled configurations, compared with the program lowered one by
  // one; the stored program, the copies the engine keeps times of and the critical path's
  // runs stay the size they are at GAS 64.
  std::uint64_t state = 0x2545f4914f6cdd1dULL;
  auto pick = [&](std::uint64_t n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state % n;
  };
  std::map<int, cli::Inputs> inputs;
  for (int i = 0; i < 8; ++i) {
    const std::uint64_t saved = state;
    std::size_t stored64 = 0, kept64 = 0, runs64 = 0;
    for (const std::int64_t gas : {64, 1000}) {
      state = saved;  // the same draw at both GAS
      const Drawn d = draw(pick, gas);
      const Lowered l = lower_drawn(d);
      const auto& [compact, full, copied] = l.both;
      CAPTURE(d.ds.dump());
      CAPTURE(d.model);
      CAPTURE(d.N);
      CAPTURE(d.ckpt);
      REQUIRE(copied > 0);
      check_same_program(compact, full);
      for (const char* gpu : {"A100-80GB", "cpu"})
        check_same_memory(sim::replay_memory(compact, sim::find_device(gpu)),
                          sim::replay_memory(full, sim::find_device(gpu)));
      if (!inputs.count(d.N)) inputs.emplace(d.N, inputs_for(d.N));
      const auto tc = run(compact, l.g, inputs.at(d.N), d.interference);
      const auto tf = run(full, l.g, inputs.at(d.N), d.interference);
      check_same_time(tc, tf, full.num_events());
      CHECK(tc.ns.last > tc.ns.reference);  // the copies ran as a periodic stretch
      if (gas == 64) {
        stored64 = compact.events.size();
        kept64 = tc.ns.copy_start.size();
        runs64 = tc.critical_path.runs.size();
      } else {
        CHECK(compact.events.size() == stored64);
        CHECK(tc.ns.copy_start.size() == kept64);
        CHECK(tc.critical_path.runs.size() == runs64);
      }
    }
  }
}

TEST_CASE("GAS 32767 stored once: the results of the 4.9-million-event program lowered one by one") {
  // The largest GAS accepted, on the smallest model, overlapped streams and interference:
  // the program lowered one by one (every event stored, about 1.8 GB while it runs) gives
  // the compact program's reports exactly.
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 32767},
                      {"fp16", {{"enabled", true}}},
                      {"zero_optimization", {{"stage", 3}, {"overlap_comm", true}, {"reduce_bucket_size", 20000},
                                             {"stage3_prefetch_bucket_size", 20000}}}};
  const auto cfg = zero::parse_ds_config("test.json", j);
  const auto batch = zero::resolve_batch(cfg, 2);
  models::GraphOptions go;
  go.micro_batch = 1;
  go.seq_len = 16;
  go.act_dtype = cfg.model_dtype();
  const auto g = models::build_graph(models::load_model("tiny-gpt2"), go);
  zero::LowerOptions lo;
  lo.world_size = 2;
  const auto compact = zero::lower(g, cfg, batch, lo);
  REQUIRE(compact.repeat.copies >= 32767 - 5);
  const auto in = inputs_for(2);
  const auto tc = run(compact, g, in, 0.2);
  const auto mc = sim::replay_memory(compact, sim::find_device("A100-80GB"));
  CHECK(tc.ns.last > tc.ns.reference);
  CHECK(compact.events.size() < 1000);
  lo.replicate_micro_steps = false;
  sim::TimeReport tf;
  sim::MemoryReport mf;
  std::int64_t n = 0;
  {
    const auto full = zero::lower(g, cfg, batch, lo);
    n = static_cast<std::int64_t>(full.events.size());
    tf = run(full, g, in, 0.2);
    mf = sim::replay_memory(full, sim::find_device("A100-80GB"));
  }
  CHECK(n == compact.num_events());
  check_same_time(tc, tf, n);
  check_same_memory(mc, mf);
}

namespace {

// tiny-gpt2 (V = 256, C = 64, 2 layers) lowered with the given options on one rank.
struct LoweredWith {
  models::OpGraph g;
  zero::Program p;
};
LoweredWith lower_with(const zero::DsConfig& cfg, const zero::LowerOptions& lo, models::Attention att,
                   const std::string& model = "tiny-gpt2") {
  LoweredWith l;
  const auto batch = zero::resolve_batch(cfg, lo.world_size);
  models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = 16;
  go.act_dtype = cfg.model_dtype();
  go.attention = att;
  go.gradient_checkpointing = lo.activation_checkpointing;
  l.g = models::build_graph(models::load_model(model), go);
  l.p = zero::lower(l.g, cfg, batch, lo);
  l.p.validate();
  return l;
}

zero::EventId event_named(const zero::Program& p, const std::string& name) {
  for (const auto& e : p.events)
    if (p.event_name(e.id) == name) return e.id;
  FAIL("no event ", name);
  return -1;
}

// Device bytes live at the start of event `id` (after its allocations).
std::int64_t live_bytes(const zero::Program& p, zero::EventId id) {
  std::int64_t n = 0;
  for (auto b : sim::live_at(p, id))
    if (p.buffers[static_cast<std::size_t>(b)].placement == zero::Placement::device)
      n += p.buffers[static_cast<std::size_t>(b)].bytes.v;
  return n;
}

}  // namespace

TEST_CASE("the loss's backward holds logp, its gradient and the logits' gradient at once") {
  // F.cross_entropy = log_softmax + nll_loss: nll_loss's backward writes the gradient of logp,
  // (B·T, V) in its dtype, and log_softmax's then writes the logits' gradient while logp (saved)
  // and that gradient are live. GPT-2 upcasts the logits (logits.float()): all three are fp32.
  const std::int64_t B = 2, T = 16, V = 256;
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", B}, {"zero_optimization", {{"stage", 0}}}};
    if (bf16) j["bf16"] = {{"enabled", true}};
    const auto l = lower_with(zero::parse_ds_config("t.json", j), zero::LowerOptions{}, models::Attention::sdpa);
    const auto id = event_named(l.p, "ms0/bwd/loss.cross_entropy");
    const auto& e = l.p.events[static_cast<std::size_t>(id)];
    std::vector<std::string> allocs, frees;
    for (auto b : l.p.allocs(e)) {
      allocs.push_back(l.p.buffer_name(b));
      CHECK(l.p.buffers[static_cast<std::size_t>(b)].bytes.v == B * T * V * 4);
    }
    for (auto b : l.p.frees(e)) frees.push_back(l.p.buffer_name(b));
    const std::string input = bf16 ? "grad:loss.upcast" : "grad:lm_head";
    CHECK(allocs == std::vector<std::string>{"grad:loss.cross_entropy.log_softmax", input});  // nll_loss's, then log_softmax's
    // The gradient of logp and logp itself go when the backward ends; the logits' stays.
    CHECK(std::count(frees.begin(), frees.end(), "grad:loss.cross_entropy.log_softmax") == 1);
    CHECK(std::count(frees.begin(), frees.end(), "loss.cross_entropy.log_softmax") == 1);
    CHECK(std::count(frees.begin(), frees.end(), input) == 0);
    // Three logits-sized fp32 tensors at once; the bf16 logits went when the output was
    // dropped after the forward.
    int big = 0;
    for (auto b : sim::live_at(l.p, id)) {
      const std::string name = l.p.buffer_name(b);
      CHECK(name != "lm_head");
      if (name == "loss.cross_entropy.log_softmax" || name == "grad:loss.cross_entropy.log_softmax" || name == input) {
        CHECK(l.p.buffers[static_cast<std::size_t>(b)].bytes.v == B * T * V * 4);
        ++big;
      }
    }
    CHECK(big == 3);
  }
}

TEST_CASE("keeping the model output keeps the 16-bit logits to the end of the micro-step") {
  const std::int64_t B = 2, T = 16, V = 256;
  const auto cfg = zero::parse_ds_config(
      "t.json", nlohmann::json{{"train_micro_batch_size_per_gpu", B}, {"bf16", {{"enabled", true}}},
                               {"zero_optimization", {{"stage", 1}}}});
  zero::LowerOptions drop, keep;
  keep.keep_output = true;
  const auto d = lower_with(cfg, drop, models::Attention::sdpa);
  const auto k = lower_with(cfg, keep, models::Attention::sdpa);
  // HF Trainer drops the output after the forward: one marker frees the logits (the KV cache
  // copies are saved by attention and stay with it).
  const auto dropped = event_named(d.p, "ms0/fwd/drop_output");
  std::vector<std::string> freed;
  for (auto b : d.p.frees(d.p.events[static_cast<std::size_t>(dropped)])) freed.push_back(d.p.buffer_name(b));
  CHECK(freed == std::vector<std::string>{"lm_head"});
  for (const auto& e : k.p.events) CHECK(k.p.event_name(e.id) != "ms0/fwd/drop_output");
  // At the loss's backward the kept output holds B·T·V bf16 logits more, and the programs
  // differ by nothing else there.
  const auto dk = live_bytes(k.p, event_named(k.p, "ms0/bwd/loss.cross_entropy"));
  const auto dd = live_bytes(d.p, event_named(d.p, "ms0/bwd/loss.cross_entropy"));
  CHECK(dk - dd == B * T * V * 2);
  // Kept, the cache copies outlive attention's backward too: the sdpa backward of layer 0
  // frees no cache copy, and the micro-step's last event frees them with the logits.
  const auto& sd = k.p.events[static_cast<std::size_t>(event_named(k.p, "ms0/bwd/layer0.attn.sdpa"))];
  for (auto b : k.p.frees(sd)) CHECK(k.p.buffer_name(b).find("cache") == std::string::npos);
  const auto& sd_drop = d.p.events[static_cast<std::size_t>(event_named(d.p, "ms0/bwd/layer0.attn.sdpa"))];
  int cache_freed = 0;
  for (auto b : d.p.frees(sd_drop)) cache_freed += d.p.buffer_name(b).find("cache") != std::string::npos;
  CHECK(cache_freed == 2);
  CHECK(sim::replay_memory(k.p, sim::find_device("A100-80GB")).peak_allocated.v >=
        sim::replay_memory(d.p, sim::find_device("A100-80GB")).peak_allocated.v);
}

TEST_CASE("PyTorch's cuBLAS and cuBLASLt workspaces are persistent buffers of the program") {
  const auto cfg = config(2, 2, 1);
  zero::LowerOptions none, a100;
  const auto& dev = sim::find_device("A100-80GB");
  a100.cublas_workspace = dev.cublas_workspace;
  a100.cublaslt_workspace = dev.cublaslt_workspace;
  const auto n = lower_with(cfg, none, models::Attention::sdpa);
  const auto w = lower_with(cfg, a100, models::Attention::sdpa);
  const auto mn = sim::replay_memory(n.p, dev), mw = sim::replay_memory(w.p, dev);
  // Two cuBLAS workspaces (the forward thread's and autograd's) of :4096:2:16:8 and one
  // cuBLASLt workspace of 1024 KiB: 2 × 8,519,680 + 1,048,576 B, before the step and kept.
  const std::int64_t ws = 2 * 8'519'680 + 1'048'576;
  CHECK(mw.persistent.v - mn.persistent.v == ws);
  CHECK(mw.peak_allocated.v - mn.peak_allocated.v == ws);
  CHECK(cat(mw, Category::temporaries).v - cat(mn, Category::temporaries).v == ws);
  int found = 0;
  for (zero::EventId id = 0; id < w.p.step_begin; ++id)
    for (auto b : w.p.allocs(w.p.events[static_cast<std::size_t>(id)])) {
      const auto& buf = w.p.buffers[static_cast<std::size_t>(b)];
      if (buf.role != zero::BufferRole::library_workspace) continue;
      ++found;
      CHECK(w.p.events[static_cast<std::size_t>(id)].stream == zero::Stream::compute);
      CHECK(buf.bytes.v == (buf.ref == 2 ? 1'048'576 : 8'519'680));
    }
  CHECK(found == 3);
}

TEST_CASE("stage 3 on one rank gathers nothing: params are their partitions") {
  // partition_parameters.py: a partition world of one takes _no_gather_coalesced (param.data
  // points at ds_tensor): no all-gather, no gathered copy, no flat buffer, no persistent copy.
  auto c = config(3, 2, 1);
  c.zero.reduce_bucket_size = 50000;
  zero::LowerOptions lo;
  const auto l = lower_with(c, lo, models::Attention::sdpa);
  const std::int64_t P = psi(l.g);
  for (const auto& e : l.p.events) CHECK(!(e.kind == EventKind::collective && e.coll == CollKind::all_gather));
  for (const auto& b : l.p.buffers) {
    CHECK(b.role != zero::BufferRole::param_full16);
    CHECK(b.role != zero::BufferRole::gather_flat);
  }
  const auto m = sim::replay_memory(l.p, sim::find_device("A100-80GB"));
  // fp16 partition (Ψ), fp32 master, Adam, fp16 grad partition, the fp16 reduce bucket.
  CHECK(m.persistent.v == 2 * P + 4 * P + 8 * P + 2 * P + 2 * 50000);
  CHECK(cat(m, Category::params).v == 2 * P);
  CHECK(m.category_peak[static_cast<std::size_t>(Category::params)].v == 2 * P);
  // Two ranks still gather.
  lo.world_size = 2;
  bool gathers = false;
  for (const auto& e : lower_with(c, lo, models::Attention::sdpa).p.events)
    gathers = gathers || (e.kind == EventKind::collective && e.coll == CollKind::all_gather);
  CHECK(gathers);
}

TEST_CASE("without fp16 or bf16 the model trains in its config.json's torch_dtype") {
  // DeepSpeed casts the module only when fp16 or bf16 is enabled; transformers builds it in
  // torch_dtype. Stage 0 then runs the plain optimizer on the 16-bit params (states
  // zeros_like(p): 2 × 2 B), stages 1/2 keep fp32 master partitions and Adam in fp32.
  auto cfg0 = zero::parse_ds_config("t.json", nlohmann::json{{"train_micro_batch_size_per_gpu", 2},
                                                              {"zero_optimization", {{"stage", 0}}}});
  const std::string note = zero::apply_module_dtype(cfg0, DType::bf16, "llama.json", "torch_dtype");
  CHECK(note.find("llama.json: torch_dtype bf16: with neither fp16 nor bf16 enabled in t.json") == 0);
  CHECK(cfg0.model_dtype() == DType::bf16);
  CHECK(cfg0.precision_dtype() == DType::fp32);
  CHECK(cfg0.communication_data_type() == DType::fp32);  // engine.py: fp32 without fp16/bf16
  CHECK(cfg0.grad_accum() == DType::fp32);
  const auto l0 = lower_with(cfg0, zero::LowerOptions{}, models::Attention::sdpa, "tiny-llama");
  const std::int64_t P = psi(l0.g);
  const auto m0 = sim::replay_memory(l0.p, sim::find_device("A100-80GB"));
  CHECK(m0.persistent.v == 2 * P + 2 * 2 * P);
  CHECK(m0.category_peak[static_cast<std::size_t>(Category::master_params)].v == 0);
  auto cfg2 = zero::parse_ds_config("t.json", nlohmann::json{{"train_micro_batch_size_per_gpu", 2},
                                                              {"zero_optimization", {{"stage", 2}}}});
  (void)zero::apply_module_dtype(cfg2, DType::bf16, "llama.json", "torch_dtype");
  CHECK(!zero::runs_bf16_optimizer(cfg2));
  const auto l2 = lower_with(cfg2, zero::LowerOptions{}, models::Attention::sdpa, "tiny-llama");
  const std::int64_t padded = l2.p.info.padded_params;  // Ψ padded to 2N = 2
  CHECK(sim::replay_memory(l2.p, sim::find_device("A100-80GB")).persistent.v == 2 * padded + 4 * padded + 8 * padded);
  // A 16-bit precision section wins; an fp32 torch_dtype changes nothing.
  auto bf = config(1, 2, 1, false);
  bf.precision = zero::Precision::bf16;
  CHECK(zero::apply_module_dtype(bf, DType::fp16, "m.json", "torch_dtype").empty());
  CHECK(bf.model_dtype() == DType::bf16);
  auto f32 = config(1, 2, 1, false);
  CHECK(zero::apply_module_dtype(f32, DType::fp32, "m.json", "torch_dtype").empty());
  CHECK(f32.model_dtype() == DType::fp32);
}

TEST_CASE("eager softmax backward holds grad × output for the length of the op") {
  // Llama (bf16, softmax(dtype=float32)): at the softmax's backward, the fp32 gradient of its
  // output, the fp32 gradient of its (upcast) input and the kernel's fp32 temporary are live.
  const std::int64_t B = 2, A = 4, T = 16;
  const auto cfg = zero::parse_ds_config(
      "t.json", nlohmann::json{{"train_micro_batch_size_per_gpu", B}, {"bf16", {{"enabled", true}}},
                               {"zero_optimization", {{"stage", 0}}}});
  const auto l = lower_with(cfg, zero::LowerOptions{}, models::Attention::eager, "tiny-llama");
  const auto id = event_named(l.p, "ms0/bwd/layer1.self_attn.softmax");
  const auto& e = l.p.events[static_cast<std::size_t>(id)];
  std::vector<std::string> allocs;
  for (auto b : l.p.allocs(e)) {
    allocs.push_back(l.p.buffer_name(b));
    CHECK(l.p.buffers[static_cast<std::size_t>(b)].bytes.v == B * A * T * T * 4);
  }
  CHECK(allocs == std::vector<std::string>{"grad:layer1.self_attn.softmax_upcast", "layer1.self_attn.softmax.grad_times_output"});
  int freed = 0;
  for (auto b : l.p.frees(e)) freed += l.p.buffer_name(b) == "layer1.self_attn.softmax.grad_times_output";
  CHECK(freed == 1);
}

namespace {

// The device bytes live after each prologue event's allocations, up to (not including) the
// event named `until`: their maximum.
std::int64_t setup_peak(const zero::Program& p, zero::EventId until) {
  std::int64_t live = 0, peak = 0;
  for (zero::EventId id = 0; id < until; ++id) {
    const auto& e = p.events[static_cast<std::size_t>(id)];
    for (auto b : p.allocs(e)) live += p.buffers[static_cast<std::size_t>(b)].bytes.v;
    peak = std::max(peak, live);
    for (auto b : p.frees(e)) live -= p.buffers[static_cast<std::size_t>(b)].bytes.v;
  }
  return peak;
}

// Every set-up copy is allocated and freed in the prologue.
void check_init_copies_freed(const zero::Program& p) {
  std::vector<int> state(p.buffers.size(), 0);
  for (zero::EventId id = 0; id < static_cast<zero::EventId>(p.events.size()); ++id) {
    const auto& e = p.events[static_cast<std::size_t>(id)];
    for (auto b : p.allocs(e))
      if (p.buffers[static_cast<std::size_t>(b)].role == zero::BufferRole::init_copy) {
        CHECK(id < p.step_begin);
        state[static_cast<std::size_t>(b)] = 1;
      }
    for (auto b : p.frees(e))
      if (p.buffers[static_cast<std::size_t>(b)].role == zero::BufferRole::init_copy) {
        CHECK(id < p.step_begin);
        state[static_cast<std::size_t>(b)] = 2;
      }
  }
  int copies = 0;
  for (const auto& b : p.buffers)
    if (b.role == zero::BufferRole::init_copy) {
      ++copies;
      CHECK(state[static_cast<std::size_t>(b.id)] == 2);
    }
  CHECK(copies > 0);
}

}  // namespace

TEST_CASE("ZeRO 1/2 set-up: the fp32 model, its cast, empty_cache, the flat copy and the master's clone") {
  // transformers builds every param in fp32, the engine casts each to fp16 (new tensor, old
  // freed); stage_1_and_2.py empties the cache, flattens the params (the module's tensors
  // become views), clones the partition in fp16 and copies it to fp32 (the master), and
  // initialize_optimizer_states makes and drops a zero fp32 gradient. Adam's states come with
  // the first step. On one rank the partition is all of Ψ' = roundup(Ψ, 2).
  const auto l = lower_with(config(2, 2, 1), zero::LowerOptions{}, models::Attention::sdpa);
  const std::int64_t P = l.p.info.padded_params, psi_ = psi(l.g);
  const auto n_params = static_cast<std::int64_t>(l.g.params.size());
  std::vector<std::string> names;
  int empties = 0;
  for (zero::EventId id = 0; id < l.p.step_begin; ++id) {
    const std::string name = l.p.event_name(id);
    if (name == "init/cast_module_to_fp16") continue;
    if (names.empty() || names.back() != name) names.push_back(name);
    empties += l.p.events[static_cast<std::size_t>(id)].empty_cache;
  }
  REQUIRE(names.size() >= 8);
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 8) ==
        std::vector<std::string>{"init/build_model", "init/empty_cache_before_flatten",
                                 fmt::format("init/paramsfp16 (flat, padded to 2N: {} elements)", P),
                                 "init/params_to_flat_views", "init/partition.clone", "init/master fp32 partition",
                                 "init/partition.drop_clone", "init/initialize_optimizer_states.zero_grads"});
  CHECK(empties == 1);
  CHECK(l.p.events[static_cast<std::size_t>(event_named(l.p, "init/empty_cache_before_flatten"))].empty_cache);
  int casts = 0;
  for (const auto& e : l.p.events) casts += l.p.event_name(e.id) == "init/cast_module_to_fp16";
  CHECK(casts == n_params);
  check_init_copies_freed(l.p);
  // The set-up's high point before Adam's states: flat fp16 + fp32 master + the zero fp32
  // gradient, 2 + 4 + 4 bytes per element (the fp32 model, 4Ψ plus one fp16 param, is lower).
  CHECK(setup_peak(l.p, event_named(l.p, "init/optimizer states (partition)")) == 10 * P);
  CHECK(4 * psi_ + 2 * l.g.params.front().numel < 10 * P);
  // What it leaves is the formulas' bytes.
  const auto m = sim::replay_memory(l.p, sim::find_device("A100-80GB"));
  CHECK(cat(m, Category::params).v == 2 * P);
  CHECK(cat(m, Category::master_params).v == 4 * P);
  CHECK(cat(m, Category::optimizer_states).v == 8 * P);
}

TEST_CASE("FP16_Optimizer set-up: per-param clones, the flat copy, the master's clone and initialize_optimizer_states") {
  // fused_optimizer.py: [p.clone().detach() for p in group] flattened (2Ψ clones + 2Ψ flat
  // beside the 2Ψ module), the clones and module tensors dropped, a 16-bit clone of the flat
  // copy made fp32 (the master), then a zero fp32 gradient and a first optimizer step that
  // creates Adam's states before the gradient is dropped: 2 + 4 + 4 + 8 = 18 bytes per param.
  const auto l = lower_with(config(0, 2, 1), zero::LowerOptions{}, models::Attention::sdpa);
  const std::int64_t P = psi(l.g);
  check_init_copies_freed(l.p);
  CHECK(setup_peak(l.p, l.p.step_begin) == 18 * P);
  CHECK(setup_peak(l.p, event_named(l.p, "init/fp16_groups.drop_clones")) == 6 * P);
  for (const auto& b : l.p.buffers)
    if (b.role == zero::BufferRole::optimizer_state) CHECK(!b.first_step);  // made during the set-up
  const auto m = sim::replay_memory(l.p, sim::find_device("A100-80GB"));
  CHECK(m.persistent.v == 2 * P + 4 * P + 8 * P);
  // The step's fp32 copies of the grads are one tensor per param (the allocator's requests),
  // all live when the flat fp32 copy is made from them.
  const auto flat = event_named(l.p, "step/flatten_grads_fp32");
  std::int64_t per_param = 0, tensors = 0;
  for (auto b : l.p.allocs(l.p.events[static_cast<std::size_t>(event_named(l.p, "step/grads_to_fp32"))])) {
    const auto& buf = l.p.buffers[static_cast<std::size_t>(b)];
    CHECK(buf.bytes.v == 4 * l.g.params[static_cast<std::size_t>(buf.ref)].numel);
    per_param += buf.bytes.v;
    ++tensors;
  }
  CHECK(tensors == static_cast<std::int64_t>(l.g.params.size()));
  CHECK(per_param == 4 * P);
  CHECK(l.p.frees(l.p.events[static_cast<std::size_t>(flat)]).size() == l.g.params.size());
}

TEST_CASE("Adam's states are two tensors, created by the first step except FP16_Optimizer's and offloaded ones") {
  // torch.optim / FusedAdam: state['exp_avg'] and state['exp_avg_sq'] = zeros_like(the fp32
  // params it steps), two requests of the params' size, made by its first step(); one rank
  // steps all of Ψ' (stages 1/2) or Ψ (stages 0, 3).
  auto first_step = [](const zero::DsConfig& c) {
    const auto l = lower_with(c, zero::LowerOptions{}, models::Attention::sdpa);
    const std::int64_t elements = c.zero.stage == 1 || c.zero.stage == 2 ? l.p.info.padded_params : psi(l.g);
    std::vector<std::string> names;
    int flagged = 0;
    for (const auto& b : l.p.buffers)
      if (b.category == Category::optimizer_states) {
        names.push_back(l.p.buffer_name(b.id));
        CHECK(b.elements == elements);
        CHECK(b.bytes.v == elements * dtype_size(b.dtype));
        flagged += b.first_step;
      }
    REQUIRE(names.size() == 2);
    CHECK(names[0].ends_with(": exp_avg"));
    CHECK(names[1].ends_with(": exp_avg_sq"));
    // The optimizer event names both.
    for (const auto& e : l.p.events)
      if (e.kind == EventKind::optimizer) {
        CHECK(l.p.buffer_name(e.src2_buf) == names[0]);
        CHECK(l.p.buffer_name(e.src3_buf) == names[1]);
      }
    CHECK(flagged % 2 == 0);
    return flagged == 2;
  };
  CHECK(first_step(config(1, 2, 1)));
  CHECK(first_step(config(2, 2, 1)));
  CHECK(first_step(config(3, 2, 1)));
  CHECK(first_step(config(0, 2, 1, false)));  // plain torch optimizer on fp32 params
  CHECK(!first_step(config(0, 2, 1)));        // FP16_Optimizer.initialize_optimizer_states
  auto off = config(2, 2, 1);
  off.zero.offload_optimizer.device = zero::OffloadDevice::cpu;
  CHECK(!first_step(off));  // host memory: not the device allocator's
  // SGD with momentum keeps one tensor.
  auto sgd = config(2, 2, 1);
  sgd.optimizer.type = zero::OptimizerType::sgd;
  sgd.optimizer.momentum = 0.9;
  const auto l = lower_with(sgd, zero::LowerOptions{}, models::Attention::sdpa);
  int states = 0;
  for (const auto& b : l.p.buffers)
    if (b.category == Category::optimizer_states) {
      ++states;
      CHECK(l.p.buffer_name(b.id).ends_with(": momentum_buffer"));
    }
  CHECK(states == 1);
  for (const auto& e : l.p.events)
    if (e.kind == EventKind::optimizer) CHECK(e.src3_buf == -1);
}

TEST_CASE("one rank's bucket is one slice: no flatten copy; two ranks' buckets are") {
  // average_tensor → allreduce_bucket flattens the slices of rank_and_offsets; a bucket on
  // one rank is one slice and flatten_dense_tensors of one tensor is a view of it.
  auto c = config(2, 2, 1);
  c.zero.reduce_bucket_size = 20000;
  CHECK(count_buffers(build("tiny-gpt2", c, 1, 16).p, zero::BufferRole::comm_staging) == 0);
  CHECK(count_buffers(build("tiny-gpt2", c, 2, 16).p, zero::BufferRole::comm_staging) > 0);
}

namespace {

// A hand-built program: events in order, each with its allocations and frees.
struct Seq {
  zero::Program p;
  zero::BufferId buffer(std::int64_t mib, bool first_step = false) {
    zero::Buffer b;
    b.id = static_cast<zero::BufferId>(p.buffers.size());
    b.category = Category::temporaries;
    b.dtype = DType::u8;
    b.elements = mib << 20;
    b.bytes = Bytes{mib << 20};
    b.first_step = first_step;
    p.buffers.push_back(b);
    return b.id;
  }
  void event(EventKind k, int micro, std::vector<zero::BufferId> allocs, std::vector<zero::BufferId> frees,
             bool empty_cache = false) {
    zero::Event e;
    e.id = static_cast<zero::EventId>(p.events.size());
    e.kind = k;
    e.micro_step = static_cast<std::int16_t>(micro);
    e.empty_cache = empty_cache;
    e.alloc_begin = static_cast<std::uint32_t>(p.alloc_list.size());
    for (auto b : allocs) p.alloc_list.push_back(b);
    e.alloc_end = static_cast<std::uint32_t>(p.alloc_list.size());
    e.free_begin = static_cast<std::uint32_t>(p.free_list.size());
    for (auto b : frees) p.free_list.push_back(b);
    e.free_end = static_cast<std::uint32_t>(p.free_list.size());
    p.events.push_back(e);
  }
};

constexpr std::int64_t MiB = 1 << 20;

}  // namespace

TEST_CASE("reserved: the allocator model has seen the set-up and a first step that creates the states") {
  // Prologue: A (12 MiB, persistent), S (12 MiB, Adam's states); the step: T (24 MiB)
  // allocated and freed, then the optimizer. Requests of 10 MiB and more get segments of
  // their size rounded to 2 MiB.
  for (const bool lazy : {false, true}) {
    CAPTURE(lazy);
    Seq s;
    const auto a = s.buffer(12), st = s.buffer(12, lazy), t = s.buffer(24);
    s.event(EventKind::marker, -1, {a}, {});
    s.event(EventKind::marker, -1, {st}, {});
    s.p.step_begin = 2;
    s.event(EventKind::compute, 0, {t}, {});
    s.event(EventKind::compute, 0, {}, {t});
    s.event(EventKind::optimizer, -1, {}, {});
    const auto m = sim::replay_memory(s.p, sim::find_device("A100-80GB"));
    CHECK(m.peak_allocated.v == 48 * MiB);
    CHECK(m.persistent.v == 24 * MiB);
    // Created before the step, S has its own segment and the step's T reuses its own: 48 MiB.
    // Created at the first optimizer step, S takes 12 MiB of T's free 24-MiB segment (the
    // rest stays cached), so the next step's T needs a new segment: 12 + 24 + 24 MiB.
    CHECK(m.reserved_peak.v == (lazy ? 60 : 48) * MiB);
    CHECK(m.segments == 3);
  }
}

TEST_CASE("reserved: empty_cache in the set-up releases the free segments before later requests") {
  // X (24 MiB) made and dropped by the set-up, A (12 MiB) kept; the step makes T (24 MiB).
  for (const bool empty : {false, true}) {
    CAPTURE(empty);
    Seq s;
    const auto x = s.buffer(24), a = s.buffer(12), t = s.buffer(24);
    s.event(EventKind::marker, -1, {x}, {x});
    s.event(EventKind::marker, -1, {}, {}, empty);
    s.event(EventKind::marker, -1, {a}, {});
    s.p.step_begin = 3;
    s.event(EventKind::compute, 0, {t}, {});
    s.event(EventKind::compute, 0, {}, {t});
    const auto m = sim::replay_memory(s.p, sim::find_device("A100-80GB"));
    CHECK(m.peak_allocated.v == 36 * MiB);  // the set-up's X is not a step's
    // Kept, X's segment serves A (split: 12 MiB stay cached, too few for T): 24 + 24 MiB.
    // Released, A and T get segments of their own: 12 + 24 MiB (the 24 MiB of X came first).
    CHECK(m.reserved_peak.v == (empty ? 36 : 48) * MiB);
  }
}

TEST_CASE("stage 3 fp16 overflow check: isinf and isnan masks of the gradient partition on the reduction stream") {
  // stage3.py has_overflow: torch.isinf(grad_partitions_flat_buffer).any(), then torch.isnan:
  // a bool per element of the partition (Σ ceil(numel/N)) and one for .any(), on
  // reduce_and_partition_stream (the reduction stream under overlap_comm).
  for (const bool overlap : {true, false}) {
    CAPTURE(overlap);
    auto c = config(3, 2, 1);
    c.zero.overlap_comm = overlap;
    zero::LowerOptions lo;
    lo.world_size = 2;
    const auto l = lower_with(c, lo, models::Attention::sdpa);
    std::int64_t part = 0;
    for (const auto& prm : l.g.params) part += (prm.numel + 1) / 2;
    for (const char* test : {"isinf", "isnan"}) {
      const auto& e = l.p.events[static_cast<std::size_t>(event_named(l.p, fmt::format("step/overflow_check.{}", test)))];
      CHECK(e.stream == (overlap ? zero::Stream::reduction : zero::Stream::compute));
      std::vector<std::int64_t> bytes;
      for (auto b : l.p.allocs(e)) bytes.push_back(l.p.buffers[static_cast<std::size_t>(b)].bytes.v);
      CHECK(bytes == std::vector<std::int64_t>{part, 1});
      CHECK(l.p.frees(e).size() == 2);
    }
  }
  // bf16 has no loss scale to check; stages 1/2 test with reductions (utils.has_inf_or_nan).
  for (const auto& cfg : {bf16_config(3, 2, 1, false), config(2, 2, 1)}) {
    const auto l = lower_with(cfg, zero::LowerOptions{}, models::Attention::sdpa);
    for (const auto& e : l.p.events) CHECK(l.p.event_name(e.id).find("overflow_check.is") == std::string::npos);
  }
}

// DeepSpeed's step visits gradients one by one with small kernels of its own (profiled:
// docs/deepspeed_fidelity.md, "DeepSpeed's step on the GPU"): the program counts them on the
// events that do that work, for the simulator alone.
TEST_CASE("the step's per-tensor loops: the overflow check of bf16 at stages 1/2, the norm's fp64 cast, the ZeRO step's host split") {
  for (const int stage : {1, 2}) {
    CAPTURE(stage);
    const auto b = build("tiny-gpt2", bf16_config(stage, 2, 1, false), 4, 16, false, 0);
    const auto l = zero::flat_layout(b.g, 4);
    const std::int64_t n = zero::grads_in_partition_elements(b.g, l, 0);
    std::int32_t t = 0;
    for (const auto off : zero::grads_in_partition_offsets(b.g, l, 0)) t += off >= 0 ? 1 : 0;
    int overflow = 0, norm = 0;
    zero::EventId loops = -1, rest = -1, check = -1, flag = -1;
    for (const auto& e : b.p.events) {
      const std::string name = b.p.event_name(e.id);
      if (e.kind == EventKind::collective && e.trigger == Trigger::overflow_check) {
        flag = e.id;
        ++overflow;  // bf16.check_grad_overflow defaults on
        CHECK(e.reduce_op == zero::ReduceOp::max);
        CHECK(e.loop_kernels == 12 * t);  // has_inf_or_nan and the count's add: 13, one in the local reduction
        CHECK(e.loop_bytes.v == n * 2);   // amin's read besides amax's
      } else if (e.kind == EventKind::collective && e.trigger == Trigger::grad_norm) {
        ++norm;
        CHECK(e.loop_kernels == 2 * t - t);  // a cast to fp64 and a norm per gradient
        CHECK(e.loop_bytes.v == n * 16);     // the fp64 copy written and read
        check = e.id;
      } else if (name == "step/host.optimizer_step") {
        loops = e.id;
        CHECK_FALSE(e.host.step_base);
        CHECK(e.host.tensors > 0);
      } else if (name == "step/host.optimizer_step.rest") {
        rest = e.id;
        CHECK(e.host.step_base);
        CHECK(e.host.tensors == 0);
        // The overflow flag read back (.item()); the norm stays on the device (clipping with it).
        const auto deps = b.p.deps(e);
        CHECK(std::find(deps.begin(), deps.end(), flag) != deps.end());
        CHECK(std::find(deps.begin(), deps.end(), check) == deps.end());
      } else if (e.kind == EventKind::optimizer) {
        CHECK(e.loop_kernels == 1);  // unscale_and_clip_grads' multiply, apart from the update
        CHECK(e.loop_bytes.v == 8 * e.elements);
      }
    }
    CHECK(overflow == 1);
    CHECK(norm == 1);
    REQUIRE(loops >= 0);
    REQUIRE(rest > loops);
    // The checks do not wait for the host's loops: they run while it issues them.
    for (const auto& e : b.p.events)
      if (e.kind == EventKind::collective && e.phase == zero::Phase::step) {
        const auto deps = b.p.deps(e);
        CHECK(std::find(deps.begin(), deps.end(), loops) == deps.end());
      }
  }
  // Stage 2 with accumulation: the executor's local reduction reads two partition buffers, so
  // it already prices more than DeepSpeed's one list (a kernel and a read per tensor per
  // buffer): only what is beyond it is counted, never less than nothing.
  {
    const auto b = build("tiny-gpt2", bf16_config(2, 2, 2, false), 4, 16, false, 0);
    const auto l = zero::flat_layout(b.g, 4);
    const std::int64_t n = zero::grads_in_partition_elements(b.g, l, 0);
    std::int32_t t = 0;
    for (const auto off : zero::grads_in_partition_offsets(b.g, l, 0)) t += off >= 0 ? 1 : 0;
    int checks = 0;
    for (const auto& e : b.p.events) {
      if (e.kind != EventKind::collective || e.phase != zero::Phase::step) continue;
      ++checks;
      CHECK(e.tensors == 2 * t);
      CHECK(e.mem_bytes.v == 2 * n * 2);
      if (e.trigger == Trigger::overflow_check) {
        CHECK(e.loop_kernels == 13 * t - 2 * t);
        CHECK(e.loop_bytes.v == 0);  // amax's and amin's reads: the executor's two
      } else {
        CHECK(e.loop_kernels == 0);  // the cast and the norm: the executor's two
        CHECK(e.loop_bytes.v == n * (2 + 16) - 2 * n * 2);
      }
    }
    CHECK(checks == 2);
  }
  // Off: no check, and a config without bf16 or fp16 checks nothing either.
  auto off = bf16_config(2, 2, 1, false);
  off.bf16_check_grad_overflow = false;
  for (const auto& cfg : {off, zero::parse_ds_config("t.json", {{"train_micro_batch_size_per_gpu", 2},
                                                               {"zero_optimization", {{"stage", 2}}}})})
    for (const auto& e : build("tiny-gpt2", cfg, 4, 16).p.events)
      CHECK_FALSE((e.kind == EventKind::collective && e.trigger == Trigger::overflow_check));
  const auto j = zero::parse_ds_config("t.json", {{"train_micro_batch_size_per_gpu", 2},
                                                  {"bf16", {{"enabled", true}, {"check_grad_overflow", false}}},
                                                  {"zero_optimization", {{"stage", 1}}}});
  CHECK_FALSE(j.bf16_check_grad_overflow);
  // Stage 0 (FP16_Optimizer): has_overflow_serial reads each flag back before the next, so its
  // host step stays one event; the device runs the loop's kernels (on the first cast, with the
  // casts, one parameter at a time) beside it, and the flatten waits for it.
  const auto s0 = build("tiny-gpt2", bf16_config(0, 2, 1, false), 1, 16);
  const auto P = static_cast<std::int32_t>(s0.g.params.size());
  const std::int64_t psi = s0.g.param_count();
  int hosts = 0;
  zero::EventId host = -1;
  for (const auto& e : s0.p.events) {
    const std::string name = s0.p.event_name(e.id);
    const auto deps = s0.p.deps(e);
    const bool waits = host >= 0 && std::find(deps.begin(), deps.end(), host) != deps.end();
    if (e.kind == EventKind::host && e.phase == zero::Phase::step) {
      ++hosts;
      host = e.id;
      CHECK(e.host.step_base);
      CHECK(e.host.step == zero::HostStep::fp16_optimizer);
    }
    if (name == "step/grads_to_fp32") {
      CHECK(e.loop_kernels == P - 1 + 13 * P);
      CHECK(e.loop_bytes.v == 2 * psi * 2);  // amax and amin read each bf16 gradient
      CHECK_FALSE(waits);
    }
    if (name == "step/flatten_grads_fp32") CHECK(waits);
    if (name == "step/master_to_params16") CHECK(e.loop_kernels == P - 1);
    if (e.kind == EventKind::optimizer) {
      CHECK(e.loop_kernels == 1);  // the unscaling pass
      CHECK(e.checks_overflow);    // has_overflow inside step(): the executor skips the update on one
    }
  }
  CHECK(hosts == 1);
  // The gradients are all-reduced at the boundary (engine.py buffered_allreduce_fallback, at one
  // rank too) before step(): the host's loop waits for the copy back of the last bucket, as
  // DeepSpeed's first read-back does (two ranks here, where the all-reduce costs the most).
  const auto s2 = build("tiny-gpt2", bf16_config(0, 2, 1, false), 2, 16);
  zero::EventId last_unflatten = -1;
  int steps = 0;
  for (const auto& e : s2.p.events) {
    const std::string name = s2.p.event_name(e.id);
    if (name.find("unflatten.bucket") != std::string::npos) last_unflatten = e.id;
    if (e.kind == EventKind::host && e.phase == zero::Phase::step) {
      ++steps;
      REQUIRE(last_unflatten >= 0);
      const auto deps = s2.p.deps(e);
      CHECK(std::find(deps.begin(), deps.end(), last_unflatten) != deps.end());
    }
  }
  CHECK(steps == 1);
  // The bare optimizer (fp32 at stage 0): its per-tensor loop (FusedAdam building its lists) is
  // one host event, which the update waits for; the fixed part (the engine's bookkeeping after
  // the launch) is another, after the loop, beside the update (neither waits for the other),
  // and the step's end waits for both.
  const auto pl = build("tiny-gpt2", zero::parse_ds_config("t.json", {{"train_micro_batch_size_per_gpu", 2},
                                                                      {"zero_optimization", {{"stage", 0}}}}),
                        1, 16);
  zero::EventId loop = -1, rest = -1, update = -1, end = -1;
  for (const auto& e : pl.p.events) {
    const std::string name = pl.p.event_name(e.id);
    if (name == "step/host.optimizer_step") loop = e.id;
    if (name == "step/host.optimizer_step.rest") rest = e.id;
    if (e.kind == EventKind::optimizer) update = e.id;
    if (name == "step/zero_grad") end = e.id;
    if (e.kind == EventKind::host && e.phase == zero::Phase::step) {
      CHECK(e.host.step == zero::HostStep::plain);
      CHECK(e.host.step_base == (e.id == rest));
      CHECK(e.host.tensors == (e.id == rest ? 0 : static_cast<std::int32_t>(pl.g.params.size())));
    }
  }
  REQUIRE(loop >= 0);
  REQUIRE(rest > update);
  REQUIRE(update > loop);
  REQUIRE(end > rest);
  auto waits = [&](zero::EventId e, zero::EventId on) {
    const auto deps = pl.p.deps(pl.p.events[static_cast<std::size_t>(e)]);
    return std::find(deps.begin(), deps.end(), on) != deps.end();
  };
  CHECK(waits(update, loop));
  CHECK(waits(rest, loop));
  CHECK_FALSE(waits(rest, update));
  CHECK(waits(end, rest));
}

// The step's scalar all-reduces reduce the rank's gradients locally first, and some copies visit
// tensors one by one: what the compute model prices for them (docs/compute_model.md).
TEST_CASE("the gradient norm reads the rank's gradients; per-parameter casts and flattens count their tensors") {
  for (const int stage : {1, 2, 3}) {
    CAPTURE(stage);
    const auto cfg = config(stage, 2, 1);
    const auto b = build("tiny-gpt2", cfg, 4, 16, false, 0);
    const std::int64_t dt = dtype_size(cfg.grad_accum());  // the gradients in their accumulation dtype
    int norms = 0;
    for (const auto& e : b.p.events) {
      if (e.kind != EventKind::collective || (e.trigger != Trigger::grad_norm && e.trigger != Trigger::overflow_check))
        continue;
      ++norms;
      CHECK(e.elements == 1);  // the all-reduce itself is a scalar
      if (stage == 3) {
        CHECK(e.tensors == 1);  // the flat partition
        CHECK(e.mem_bytes.v == zero::stage3_partition_elements(b.g, 4) * dt);
      } else {
        const auto l = zero::flat_layout(b.g, 4);
        std::int32_t overlapping = 0;
        for (const auto off : zero::grads_in_partition_offsets(b.g, l, 0)) overlapping += off >= 0 ? 1 : 0;
        CHECK(e.tensors == overlapping);
        CHECK(e.tensors > 0);
        CHECK(e.tensors < static_cast<std::int32_t>(b.g.params.size()));  // a quarter of the model, give or take
        CHECK(e.mem_bytes.v == zero::grads_in_partition_elements(b.g, l, 0) * dt);
      }
    }
    CHECK(norms == 2);  // fp16: the overflow check and the norm
  }
  // Offloaded: the host reduces its partition; nothing is read on the device.
  auto off = config(2, 2, 1);
  off.zero.offload_optimizer.device = zero::OffloadDevice::cpu;
  for (const auto& e : build("tiny-gpt2", off, 4, 16).p.events)
    if (e.kind == EventKind::collective && e.trigger == Trigger::grad_norm) CHECK(e.mem_bytes.v == 0);
  // Stage 0 (FP16_Optimizer): each gradient cast to fp32 on its own.
  const auto s0 = build("tiny-gpt2", config(0, 2, 1), 1, 16);
  int casts = 0;
  for (const auto& e : s0.p.events)
    if (e.kind == EventKind::copy && s0.p.event_name(e.id) == "step/grads_to_fp32") {
      ++casts;
      CHECK(e.tensors == static_cast<std::int32_t>(s0.g.params.size()));
      // A kernel per param into its own fp32 buffer (the event's allocations, one slice each).
      CHECK(e.copy_op == zero::CopyOp::grads_to_list);
      CHECK(e.copy_kernel == zero::CopyKernel::cast);
      CHECK(s0.p.allocs(e).size() == s0.g.params.size());
      CHECK(s0.p.slices(e).size() == s0.g.params.size());
    } else if (e.kind == EventKind::copy && s0.p.event_name(e.id) == "step/flatten_grads_fp32") {
      CHECK(e.copy_op == zero::CopyOp::flatten_list);  // fp32 to fp32: a memcpy per param
      CHECK(e.copy_kernel == zero::CopyKernel::memcpy);
      CHECK(s0.p.frees(e).size() == s0.g.params.size());
    } else if (e.kind == EventKind::copy && s0.p.event_name(e.id) == "step/master_to_params16") {
      CHECK(e.copy_kernel == zero::CopyKernel::cast);
    } else if (e.kind == EventKind::optimizer) {
      // step() takes the norm of the flat fp32 gradients (one tensor) before the update.
      CHECK(e.reduce_bytes.v == 4 * s0.p.info.params);
      CHECK(e.tensors == 1);
    }
  CHECK(casts == 1);
}

// The host reads the norm (and fp16's overflow flag) back before it goes on: what it issues
// next, the partition's flatten one parameter at a time, runs at the host's pace. Nothing of
// stage 0's step follows a read (its norm is inside the optimizer's step).
TEST_CASE("the copies issued right after the host read the norm back are host-bound, and only they") {
  for (const int stage : {0, 1, 2, 3})
    for (const int fp : {1, 2}) {  // fp16, bf16
      CAPTURE(stage);
      CAPTURE(fp);
      const auto b = build("tiny-gpt2", fp == 1 ? config(stage, 2, 1) : bf16_config(stage, 2, 1, false), 1, 16);
      std::vector<std::string> bound;
      bool after_read = false;
      for (const auto& e : b.p.events) {
        const bool read = e.kind == EventKind::collective &&
                          (e.trigger == Trigger::grad_norm || e.trigger == Trigger::overflow_check);
        if (e.host_bound) {
          bound.push_back(b.p.event_name(e.id));
          CHECK(after_read);  // the first device event after the last read
        }
        if (read) after_read = true;
        else if (e.kind != EventKind::marker && e.kind != EventKind::host && e.stream != zero::Stream::host) after_read = false;
      }
      if (stage == 0) CHECK(bound.empty());
      if (stage == 1 || stage == 2) CHECK(bound == std::vector<std::string>{"step/flatten_partition_grads"});
      if (stage == 3) CHECK(bound == std::vector<std::string>{"step/flatten_grads.subgroup0"});
    }
}

TEST_CASE("stage 2 with accumulation: the step's norm and flatten read the accumulated partition and the last one") {
  auto event = [](const Built& b, const std::string& name) -> const zero::Event& {
    for (const auto& e : b.p.events)
      if (b.p.event_name(e.id) == name) return e;
    FAIL("no event " << name);
    return b.p.events.front();
  };
  for (const int stage : {1, 2}) {
    CAPTURE(stage);
    const auto one = build("tiny-gpt2", config(stage, 2, 1), 4, 16);
    const auto two = build("tiny-gpt2", config(stage, 2, 2), 4, 16);
    const int parts = stage == 2 ? 2 : 1;  // stage 1 reduces once, at the boundary
    for (const char* n : {"step/grad_norm", "step/flatten_partition_grads"}) {
      CAPTURE(n);
      CHECK(event(two, n).tensors == parts * event(one, n).tensors);
    }
    CHECK(event(two, "step/grad_norm").mem_bytes.v == parts * event(one, "step/grad_norm").mem_bytes.v);
    const auto& fl = event(two, "step/flatten_partition_grads");
    CHECK(fl.mem_bytes.v * 2 == event(one, "step/flatten_partition_grads").mem_bytes.v * (parts + 1));
    CHECK(fl.copy_kernel == (stage == 2 ? zero::CopyKernel::add : zero::CopyKernel::memcpy));
  }
}

// DeepSpeed's gradient hook (stage_1_and_2.py) runs for every parameter of every micro-step
// once installed (stage 2, overlap_comm or contiguous_gradients, DeepSpeed's default); it adds
// the gradient to an IPG bucket (the host's bucket_hooks) at stage 2 on every micro-step, at
// stage 1 only under overlap_comm and only at the boundary, and stage 3's hooks count apart.
TEST_CASE("host work: gradient hooks and the hooks that fill a bucket, per stage, overlap and GAS") {
  struct Case {
    int stage;
    bool overlap;
    std::int64_t gas;
    std::int64_t hooks_per_param, bucket_per_param;
  };
  for (const Case c : {Case{1, false, 1, 1, 0}, Case{1, false, 4, 4, 0}, Case{1, true, 4, 4, 1}, Case{2, false, 1, 1, 1},
                       Case{2, false, 4, 4, 4}, Case{2, true, 4, 4, 4}, Case{3, false, 2, 0, 0}}) {
    CAPTURE(c.stage);
    CAPTURE(c.overlap);
    CAPTURE(c.gas);
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2},
                        {"gradient_accumulation_steps", c.gas},
                        {"bf16", {{"enabled", true}}},
                        {"zero_optimization", {{"stage", c.stage}, {"overlap_comm", c.overlap}}}};
    const auto b = build("tiny-gpt2", zero::parse_ds_config("test.json", j), 1, 16);
    std::int64_t hooks = 0, bucket = 0, stage3 = 0;
    for (const auto& e : b.p.events)
      if (e.kind == EventKind::host) {
        hooks += e.host.grad_hooks;
        bucket += e.host.bucket_hooks;
        stage3 += e.host.stage3_grad_hooks;
        CHECK(e.host.bucket_hooks <= e.host.grad_hooks);
      }
    const auto n = static_cast<std::int64_t>(b.g.params.size());
    CHECK(hooks == c.hooks_per_param * n);
    CHECK(bucket == c.bucket_per_param * n);
    CHECK(stage3 == (c.stage == 3 ? c.gas * n : 0));
  }
}

// Stage 3's fetch and release hooks loop over the parameters of the module they visit: each
// forward visit counts its module's parameters (HostWork::stage3_params), so one forward
// counts every parameter once and the tied LM head's weight (GPT-2's wte) once more.
TEST_CASE("host work: stage 3's module visits and the parameters they loop over, per micro-step") {
  for (std::int64_t gas : {1, 3}) {
    CAPTURE(gas);
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2},
                        {"gradient_accumulation_steps", gas},
                        {"bf16", {{"enabled", true}}},
                        {"zero_optimization", {{"stage", 3}}}};
    const auto b = build("tiny-gpt2", zero::parse_ds_config("test.json", j), 1, 16);
    std::int64_t visits = 0, params = 0, bwd_visits = 0;
    for (const auto& e : b.p.events)
      if (e.kind == EventKind::host) {
        CHECK(e.host.stage3_params >= e.host.module_visits);
        if (e.phase == zero::Phase::forward) {
          visits += e.host.module_visits;
          params += e.host.stage3_params;
        } else if (e.phase == zero::Phase::backward) {
          bwd_visits += e.host.module_visits;
        }
      }
    const auto n = static_cast<std::int64_t>(b.g.params.size());
    CHECK(params == gas * (n + 1));
    CHECK(visits > 0);
    CHECK(visits < params);  // modules with a weight and a bias
    CHECK(bwd_visits == visits);
  }
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2}, {"bf16", {{"enabled", true}}},
                      {"zero_optimization", {{"stage", 2}}}};
  const auto b = build("tiny-gpt2", zero::parse_ds_config("test.json", j), 1, 16);
  for (const auto& e : b.p.events) CHECK(e.host.stage3_params == 0);
}

// stage3.py _create_fp16_sub_groups: params in order, a group closed by the param that brings
// it to sub_group_size partition elements or past it; 0 makes a group of every param.
TEST_CASE("stage 3 sub-groups are DeepSpeed's: closed once they reach the size") {
  const int N = 2;
  auto sizes_of = [&](std::int64_t sub_group_size) {
    auto c = config(3, 2, 1);
    c.zero.sub_group_size = sub_group_size;
    const auto b = build("tiny-gpt2", c, N, 16);
    std::vector<std::int64_t> got;
    for (const auto& e : b.p.events)  // its fp16 gradients read and written: 2 · 2 bytes an element
      if (e.label >= 0 && b.p.labels[static_cast<std::size_t>(e.label)].find("flatten_grads.subgroup") != std::string::npos)
        got.push_back(e.mem_bytes.v / 4);
    std::vector<std::int64_t> want;  // the rule, over the graph's params
    std::int64_t cur = 0;
    for (const auto& p : b.g.params) {
      cur += (p.numel + N - 1) / N;
      if (cur >= sub_group_size) {
        want.push_back(cur);
        cur = 0;
      }
    }
    if (cur > 0) want.push_back(cur);
    return std::pair{got, want};
  };
  const auto [one_got, one_want] = sizes_of(1000000000);
  CHECK(one_got.size() == 1);
  CHECK(one_got == one_want);
  // A size smaller than most params: groups may exceed it by their last param.
  const auto [small_got, small_want] = sizes_of(1000);
  CHECK(small_got == small_want);
  CHECK(small_got.size() > 2);
  CHECK(std::any_of(small_got.begin(), small_got.end(), [](std::int64_t s) { return s > 1000; }));
  const auto [zero_got, zero_want] = sizes_of(0);
  CHECK(zero_got == zero_want);
}

namespace {
// A hand-made graph for GraphFacts: ops of `fn` over (4, 8) fp32 tensors; each op is given as
// its inputs (tensor ids; tensor 0 is the model input) and makes one new tensor.
models::OpGraph chain_graph(const std::vector<std::pair<models::Fn, std::vector<models::TensorId>>>& ops) {
  models::OpGraph g;
  auto tensor = [&](models::OpId producer) {
    models::Tensor t;
    t.id = static_cast<models::TensorId>(g.tensors.size());
    t.name = fmt::format("t{}", t.id);
    t.shape = {4, 8};
    t.dtype = DType::fp32;
    t.bytes = Bytes{4 * 8 * 4};
    t.producer = producer;
    g.tensors.push_back(t);
    return t.id;
  };
  g.inputs.push_back(tensor(models::kNone));
  for (const auto& [fn, in] : ops) {
    models::Op op;
    op.id = static_cast<models::OpId>(g.ops.size());
    op.name = fmt::format("op{}", op.id);
    op.fn = fn;
    op.inputs = in;
    op.outputs = {tensor(op.id)};
    g.ops.push_back(op);
  }
  g.loss = g.tensors.back().id;
  return g;
}
}  // namespace

TEST_CASE("a sum passes its gradient on only where nothing writes one operand's before the other's producer read its own") {
  using models::Fn;
  // x = f(in); h = g(x); b = k(h); y = x + b: x's other consumer (g) runs its backward after
  // b's producer (k) has read b's gradient: the sum passes (GPT-2's residual).
  auto ok = chain_graph({{Fn::scale, {0}}, {Fn::scale, {1}}, {Fn::scale, {2}}, {Fn::add, {1, 3}}, {Fn::scale, {4}}});
  CHECK(zero::lowering::analyse(ok).passes_gradient[3] == 1);
  // Either operand may be the one consumed by the sum alone (BERT writes hidden + input).
  auto swapped = chain_graph({{Fn::scale, {0}}, {Fn::scale, {1}}, {Fn::scale, {2}}, {Fn::add, {3, 1}}, {Fn::scale, {4}}});
  CHECK(zero::lowering::analyse(swapped).passes_gradient[3] == 1);
  // y = x + f(x): f's backward reads b's gradient and adds into x's, the same buffer: no.
  auto own = chain_graph({{Fn::scale, {0}}, {Fn::scale, {1}}, {Fn::add, {1, 2}}, {Fn::scale, {3}}});
  CHECK(zero::lowering::analyse(own).passes_gradient[2] == 0);
  // x's other consumer (op2) comes after b's producer (op1): its backward runs first, adding
  // into x's gradient while that is b's: no.
  auto late = chain_graph({{Fn::scale, {0}}, {Fn::scale, {0}}, {Fn::scale, {1}}, {Fn::add, {1, 2}}, {Fn::add, {3, 4}}});
  CHECK(zero::lowering::analyse(late).passes_gradient[3] == 0);
  // Both operands consumed elsewhere, the loss itself, one tensor twice: no.
  auto both = chain_graph({{Fn::scale, {0}}, {Fn::scale, {0}}, {Fn::add, {1, 2}}, {Fn::add, {1, 2}}, {Fn::add, {3, 4}}});
  CHECK(zero::lowering::analyse(both).passes_gradient[2] == 0);
  auto twice = chain_graph({{Fn::scale, {0}}, {Fn::add, {1, 1}}, {Fn::scale, {2}}});
  CHECK(zero::lowering::analyse(twice).passes_gradient[1] == 0);
  auto loss = chain_graph({{Fn::scale, {0}}, {Fn::scale, {1}}, {Fn::add, {1, 2}}});
  CHECK(zero::lowering::analyse(loss).passes_gradient[2] == 0);
}

TEST_CASE("a residual sum's backward is a marker: the gradient passed on, no kernel, the buffer freed with its last holder") {
  // tiny-gpt2 (2 layers): four residual sums per micro-step pass their gradient on; no
  // gradient buffer of theirs is allocated; every buffer the step allocates it frees.
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2}, {"zero_optimization", {{"stage", 2}}}};
  for (const bool ckpt : {false, true}) {
    CAPTURE(ckpt);
    zero::LowerOptions lo;
    lo.activation_checkpointing = ckpt;
    const auto l = lower_with(zero::parse_ds_config("t.json", j), lo, models::Attention::sdpa);
    int passing = 0;
    std::set<models::TensorId> passed_to;
    for (const auto& e : l.p.events) {
      if (!e.passes_gradient) continue;
      ++passing;
      CHECK(e.kind == EventKind::marker);
      const auto& op = l.g.ops[static_cast<std::size_t>(e.op)];
      CHECK(op.fn == models::Fn::add);
      CHECK(e.mem_bytes.v == 0);
      CHECK(l.p.allocs(e).empty());
      passed_to.insert(op.inputs.begin(), op.inputs.end());
    }
    CHECK(passing >= 4);
    // No gradient buffer of its own for a tensor the gradient was passed to, and every
    // gradient buffer allocated is freed once.
    std::map<zero::BufferId, int> held;
    for (const auto& e : l.p.events) {
      for (auto b : l.p.allocs(e))
        if (l.p.buffers[static_cast<std::size_t>(b)].role == zero::BufferRole::activation_grad) ++held[b];
      for (auto b : l.p.frees(e))
        if (l.p.buffers[static_cast<std::size_t>(b)].role == zero::BufferRole::activation_grad) --held[b];
    }
    for (const auto& [b, n] : held) {
      CHECK(n == 0);
      CHECK(passed_to.count(l.p.buffers[static_cast<std::size_t>(b)].ref) == 0);
    }
  }
}

TEST_CASE("a sum whose output holds a gradient another tensor still holds does not pass it on (parallel residuals)") {
  using models::Fn;
  // u = f(x); v = f(x); h = g(v); z = k(h); s = v + z; y = u + s; loss = m(y). Both sums pass
  // GraphFacts' test, but once y's sum has passed its gradient to u and s, s's sum would hand
  // the same buffer to v, whose other consumer (g) adds into it while it is still u's: the walk
  // passes it on only when its output is the buffer's last holder.
  auto g = chain_graph({{Fn::scale, {0}},      // op0: x = t1
                        {Fn::scale, {1}},      // op1: u = t2
                        {Fn::scale, {1}},      // op2: v = t3
                        {Fn::scale, {3}},      // op3: h = t4
                        {Fn::scale, {4}},      // op4: z = t5
                        {Fn::add, {3, 5}},     // op5: s = t6
                        {Fn::add, {2, 6}},     // op6: y = t7
                        {Fn::scale, {7}}});    // op7: loss = t8
  const auto facts = zero::lowering::analyse(g);
  REQUIRE(facts.passes_gradient[5] == 1);
  REQUIRE(facts.passes_gradient[6] == 1);
  const auto cfg = zero::parse_ds_config("t.json", nlohmann::json{{"train_micro_batch_size_per_gpu", 1},
                                                                 {"zero_optimization", {{"stage", 0}}}});
  const auto p = zero::lower(g, cfg, zero::resolve_batch(cfg, 1), zero::LowerOptions{});
  CHECK_NOTHROW(p.validate());
  std::vector<models::OpId> passed;
  for (const auto& e : p.events)
    if (e.passes_gradient) passed.push_back(e.op);
  CHECK(passed == std::vector<models::OpId>{6});  // y's sum passes; s's then runs as a kernel
  std::map<zero::BufferId, int> held;  // every gradient buffer freed once
  for (const auto& e : p.events) {
    for (auto b : p.allocs(e)) ++held[b];
    for (auto b : p.frees(e)) --held[b];
  }
  for (const auto& [b, n] : held)
    if (p.buffers[static_cast<std::size_t>(b)].role == zero::BufferRole::activation_grad) CHECK(n == 0);
}

// Autograd adds a tensor's gradients from its consumers as they arrive: the first is stored,
// each later one is added by a kernel of its own (Event::grad_adds). Counted against the H100
// kernel profiles of DeepSpeed's runs (`CUDAFunctor_add` in backward;
// docs/deepspeed_fidelity.md), each of which has one more: the tied word embedding's two
// gradients, a parameter's, which this does not count.
// - BERT-large, 97 (98 measured): in each layer the attention's input feeds the query, key and
//   value products and the residual sum (three adds), the attention block's output the
//   intermediate product and the residual sum (one); the last layer's output the MLM head and
//   the pooler (one).
// - GPT-2, 48 (49): the residual stream feeds each block's two LayerNorms and its sums (two a
//   layer), and the eager GELU reads its input three times (two a layer, of the MLP's width).
//   The attention and the KV cache's copies read c_attn's q, k and v column blocks: views of one
//   split, whose gradients are assembled without an add.
// - A 16-layer Llama, 177 (177 for the 300M one profiled, whose layers have the same ops): per
//   layer, the two residual inputs each read by an RMSNorm's cast and a sum (two), each
//   RMSNorm's fp32 copy read by its pow and its multiply (two), the normed input of q, k and v
//   (two) and of gate and up (one), RoPE's rotate_half slices of q and k (two each); and the
//   final norm's fp32 copy (one).
TEST_CASE("autograd's gradient adds: one per later consumer of a tensor, in the backward event that makes it") {
  struct Case {
    const char* model;
    std::int64_t micro, seq, adds, hidden_adds;  // hidden_adds: those of a (micro, seq, hidden) 16-bit tensor
  };
  for (const Case c : {Case{"bert-large-uncased", 4, 128, 97, 97}, Case{"gpt2", 2, 64, 48, 24},
                       Case{"Llama-3.2-1B", 1, 64, 177, 64}}) {
    CAPTURE(c.model);
    const Built b = build(c.model, config(0, c.micro, 1), 1, c.seq);
    std::int64_t adds = 0, bytes = 0, events = 0;
    for (const auto& e : b.p.events) {
      if (e.micro_step != 0 || e.grad_adds == 0) continue;
      CHECK(e.kind == EventKind::compute);
      CHECK(e.phase == zero::Phase::backward);
      adds += e.grad_adds;
      bytes += e.grad_add_bytes.v;
      ++events;
    }
    CHECK(adds == c.adds);
    const std::int64_t hidden = b.g.cfg.hidden;
    const std::int64_t unit = c.micro * c.seq * hidden * 2;
    if (c.adds == c.hidden_adds) CHECK(bytes == c.adds * unit);
    CHECK(bytes >= c.adds * unit / 4);  // no add smaller than a 16-bit (micro, seq, hidden / 4) tensor
    CHECK(events <= adds);
  }
  // GPT-2's other 24: the MLP's width (4 · hidden).
  const Built g = build("gpt2", config(0, 2, 1), 1, 64);
  std::int64_t bytes = 0;
  for (const auto& e : g.p.events)
    if (e.micro_step == 0) bytes += e.grad_add_bytes.v;
  CHECK(bytes == 24 * 2 * 64 * g.g.cfg.hidden * 2 + 24 * 2 * 64 * 4 * g.g.cfg.hidden * 2);
}

// An iteration as training runs it (LowerOptions::phase_syncs off): the ZeRO step of stages 1/2
// without overlap_comm waits for nothing of the backward. Its overflow loop is issued in pieces,
// each waiting only for the launch kLaunchQueueOps launches before its first (the queue is full
// until then); the norm's loop waits for the overflow flag's read-back; together they cost what
// the one loop event of the synchronised program costs. Nothing else changes, and no other
// optimizer or stage changes at all.
TEST_CASE("the copies of the reduced gradients into grads_in_partition: a launch per parameter of the rank's partition") {
  // copy_grads_in_partition runs for the parameters in this rank's partition: over the ranks every
  // parameter is counted once, and once more on the neighbour rank where it straddles a partition
  // boundary; each event counts at most its slices (the pieces it is priced by).
  for (const int stage : {1, 2}) {
    CAPTURE(stage);
    const auto cfg = bf16_config(stage, 2, 1, false);
    const int N = 2;
    const auto b0 = build("gpt2", cfg, N, 64);
    const auto params = static_cast<std::int64_t>(b0.g.params.size());
    std::int64_t counted = 0, buckets = 0;
    for (int r = 0; r < N; ++r) {
      zero::LowerOptions lo;
      lo.world_size = N;
      lo.rank = r;
      const zero::Program p = zero::lower(b0.g, cfg, zero::resolve_batch(cfg, N), lo);
      for (const auto& e : p.events) {
        if (e.kind != EventKind::copy || e.copy_op != zero::CopyOp::to_partition) continue;
        CHECK(e.tensors <= static_cast<std::int32_t>(e.slice_end - e.slice_begin));
        counted += e.tensors;
        if (r == 0) ++buckets;
      }
    }
    REQUIRE(buckets > 0);
    CHECK(counted >= params);
    CHECK(counted <= params + buckets * (N - 1));
    CHECK(counted < params * N);  // not every slice on every rank
  }
}

TEST_CASE("phase_syncs off: the ZeRO 1/2 step's loops wait for the launch queue, the norm's loop for the overflow flag") {
  auto lower_free = [](const Built& b, const zero::DsConfig& cfg, int N) {
    zero::LowerOptions lo;
    lo.world_size = N;
    lo.rank = zero::heaviest_rank(b.g, cfg, N);
    lo.phase_syncs = false;
    return zero::lower(b.g, cfg, zero::resolve_batch(cfg, N), lo);
  };
  for (const int stage : {1, 2}) {
    CAPTURE(stage);
    const auto cfg = bf16_config(stage, 2, 1, false);
    REQUIRE(zero::phase_syncs_matter(cfg));
    const auto b = build("gpt2", cfg, 1, 64);
    const zero::Program free = lower_free(b, cfg, 1);
    const auto tensors = static_cast<std::int32_t>(b.g.params.size());
    // The synchronised step: one loop event over every tensor, after the backward's last op.
    zero::EventId last_op = -1, synced_loop = -1;
    for (const auto& e : b.p.events) {
      if (e.kind == EventKind::compute && e.phase == zero::Phase::backward) last_op = e.id;
      if (b.p.event_name(e.id) == "step/host.optimizer_step") {
        CHECK(synced_loop < 0);
        synced_loop = e.id;
        CHECK(e.host.tensors == tensors);
        CHECK(e.host.loop_share == 1.0);
        const auto deps = b.p.deps(e);
        CHECK(std::find(deps.begin(), deps.end(), last_op) != deps.end());
      }
    }
    REQUIRE(synced_loop >= 0);
    // Up to the step both programs are the same.
    REQUIRE(free.events.size() > static_cast<std::size_t>(synced_loop));
    for (zero::EventId i = 0; i < synced_loop; ++i) CHECK(free.events[static_cast<std::size_t>(i)] == b.p.events[static_cast<std::size_t>(i)]);
    // The unsynchronised step: pieces of 8 tensors at 13 / 15 of the per-tensor cost, then the
    // norm's loop at 2 / 15 after the overflow check.
    std::vector<zero::EventId> pieces;
    zero::EventId norm_loop = -1, overflow = -1, rest = -1;
    double cost = 0;  // in tensors' worth of the per-tensor cost
    for (const auto& e : free.events) {
      if (e.id < synced_loop) continue;
      const std::string name = free.event_name(e.id);
      if (e.kind == EventKind::collective && e.trigger == Trigger::overflow_check) overflow = e.id;
      if (name == "step/host.optimizer_step.rest") rest = e.id;
      if (name != "step/host.optimizer_step") continue;
      CHECK_FALSE(e.host.step_base);
      cost += e.host.tensors * static_cast<double>(e.host.loop_share);
      if (overflow < 0) {
        pieces.push_back(e.id);
        CHECK(e.host.tensors == std::min(8, tensors - 8 * static_cast<std::int32_t>(pieces.size() - 1)));
        CHECK(e.host.loop_share == zp::test::approx(13.0 / 15));
      } else {
        CHECK(norm_loop < 0);
        norm_loop = e.id;
        CHECK(e.host.tensors == tensors);
        CHECK(e.host.loop_share == zp::test::approx(2.0 / 15));
        const auto deps = free.deps(e);
        CHECK(std::find(deps.begin(), deps.end(), overflow) != deps.end());
      }
    }
    CHECK(static_cast<std::int32_t>(pieces.size()) == (tensors + 7) / 8);
    CHECK(cost == zp::test::approx(tensors));
    REQUIRE(norm_loop > overflow);
    REQUIRE(rest > norm_loop);
    const auto rdeps = free.deps(free.events[static_cast<std::size_t>(rest)]);
    CHECK(std::find(rdeps.begin(), rdeps.end(), norm_loop) != rdeps.end());
    // No piece waits for the backward's last op. The first pieces fit in the queue behind what the
    // forward and backward left in it and wait for nothing; then each waits for one launch, later
    // pieces for later launches (or the same copy: copy_grads_in_partition's copy per parameter is
    // one event of a launch per parameter, Event::tensors), until the loop's own launches fill the
    // queue (those take microseconds on the device: not waited for).
    zero::EventId prev = -1;
    int waiting = 0;
    for (const zero::EventId p : pieces) {
      const auto deps = free.deps(free.events[static_cast<std::size_t>(p)]);
      CHECK(std::find(deps.begin(), deps.end(), last_op) == deps.end());
      CHECK(deps.size() <= 1);
      if (!deps.empty()) {
        ++waiting;
        CHECK(deps[0] >= prev);
        CHECK(free.events[static_cast<std::size_t>(deps[0])].stream != zero::Stream::host);  // a launch (an op, or the boundary's copies)
        CHECK(deps[0] < pieces.front());
        prev = deps[0];
      }
    }
    // Stage 1 reduces at the boundary: its copies into grads_in_partition end the queue, a launch
    // for each parameter (at one rank every parameter is in the partition), and the last piece to
    // wait waits inside them.
    if (stage == 1) {
      REQUIRE(prev >= 0);
      CHECK(free.event_name(prev) == "ms0/reduce/copy_to_partition.bucket0");
      const zero::Event& w = free.events[static_cast<std::size_t>(prev)];
      CHECK(w.tensors == static_cast<std::int32_t>(w.slice_end - w.slice_begin));
      CHECK(w.tensors > 1);
    }
    CHECK(waiting > 0);
    CHECK(waiting <= 1024 / (8 * 13) + 1);
  }
  // Without the overflow check (bf16.check_grad_overflow off) the step loops for the norm alone,
  // at 2 / 15 of the per-tensor cost, and nothing is read back: without the synchronisations the
  // whole loop is queued in pieces.
  {
    auto cfg = bf16_config(2, 2, 1, false);
    cfg.bf16_check_grad_overflow = false;
    const auto b = build("tiny-gpt2", cfg, 1, 16);
    for (const bool syncs : {true, false}) {
      CAPTURE(syncs);
      const zero::Program p = syncs ? b.p : lower_free(b, cfg, 1);
      double cost = 0;
      int loops = 0;
      for (const auto& e : p.events)
        if (p.event_name(e.id) == "step/host.optimizer_step") {
          ++loops;
          CHECK(e.host.loop_share == zp::test::approx(2.0 / 15));
          cost += e.host.tensors;
        }
      CHECK(cost == static_cast<double>(b.g.params.size()));
      CHECK(loops == (syncs ? 1 : (static_cast<int>(b.g.params.size()) + 7) / 8));
    }
  }
  // fp32 with the optimizer offloaded: one host event (loops and fixed part), looping for the
  // norm alone as well.
  {
    const auto cfg = zero::parse_ds_config("test.json", {{"train_micro_batch_size_per_gpu", 2},
                                                        {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}});
    CHECK_FALSE(zero::phase_syncs_matter(cfg));
    const auto b = build("tiny-gpt2", cfg, 1, 16);
    int steps = 0;
    for (const auto& e : b.p.events)
      if (e.kind == EventKind::host && e.phase == zero::Phase::step) {
        ++steps;
        CHECK(e.host.step_base);
        CHECK(e.host.tensors == static_cast<std::int32_t>(b.g.params.size()));
        CHECK(e.host.loop_share == zp::test::approx(2.0 / 15));
      }
    CHECK(steps == 1);
  }
  // Whatever the precision, GAS and world size, the unsynchronised step costs the host what the
  // synchronised one does: the same fixed part (its .rest event) and the same tensors' worth of
  // loops; and it has its pieces.
  {
    struct Case {
      std::string what;
      nlohmann::json ds;
      int N;
    };
    auto ds = [](int stage, std::int64_t gas, nlohmann::json precision) {
      nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", gas},
                          {"zero_optimization", {{"stage", stage}}}};
      j.update(precision);
      return j;
    };
    const std::vector<Case> cases = {
        {"fp16 stage 1", ds(1, 1, {{"fp16", {{"enabled", true}}}}), 1},
        {"bf16 stage 2, GAS 6 (stored once)", ds(2, 6, {{"bf16", {{"enabled", true}}}}), 1},
        {"fp32 stage 2 (the norm's loop alone)", ds(2, 1, nlohmann::json::object()), 1},
        {"bf16 stage 1, 2 ranks", ds(1, 1, {{"bf16", {{"enabled", true}}}}), 2},
    };
    for (const auto& c : cases) {
      CAPTURE(c.what);
      const auto cfg = zero::parse_ds_config("test.json", c.ds);
      REQUIRE(zero::phase_syncs_matter(cfg));
      const auto b = build("tiny-gpt2", cfg, c.N, 16);
      const zero::Program free = lower_free(b, cfg, c.N);
      auto host_step = [](const zero::Program& p) {
        double loops = 0;
        int rest = 0, pieces = 0;
        for (const auto& e : p.events)
          if (e.kind == EventKind::host && e.phase == zero::Phase::step) {
            loops += e.host.tensors * static_cast<double>(e.host.loop_share);
            rest += e.host.step_base ? 1 : 0;
            pieces += e.host.tensors > 0 ? 1 : 0;
          }
        return std::tuple{loops, rest, pieces};
      };
      const auto [loops_s, rest_s, pieces_s] = host_step(b.p);
      const auto [loops_f, rest_f, pieces_f] = host_step(free);
      const bool checked = c.ds.contains("fp16") || c.ds.contains("bf16");  // the overflow loop runs too
      CHECK(loops_s == zp::test::approx(static_cast<double>(b.g.params.size()) * (checked ? 1.0 : 2.0 / 15)).epsilon(1e-6));
      CHECK(loops_f == zp::test::approx(loops_s).epsilon(1e-6));
      CHECK(rest_s == 1);
      CHECK(rest_f == 1);
      CHECK(pieces_s == 1);
      CHECK(pieces_f > 1);
    }
  }
  // Where the phases' synchronisations change nothing, the programs are the same.
  auto with = [](int stage, nlohmann::json zero_extra, nlohmann::json top = nlohmann::json::object()) {
    nlohmann::json z = {{"stage", stage}};
    z.update(zero_extra);
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2}, {"bf16", {{"enabled", true}}}, {"zero_optimization", z}};
    j.update(top);
    return zero::parse_ds_config("test.json", j);
  };
  const std::vector<std::pair<const char*, zero::DsConfig>> same = {
      {"stage 0", with(0, nlohmann::json::object())},
      {"stage 3", with(3, nlohmann::json::object())},
      {"overlap_comm", with(2, {{"overlap_comm", true}})},
      {"offloaded optimizer", with(2, {{"offload_optimizer", {{"device", "cpu"}}}})},
      {"BF16_Optimizer", with(1, nlohmann::json::object(), {{"data_types", {{"grad_accum_dtype", "fp32"}}}})},
      {"wall_clock_breakdown", with(2, nlohmann::json::object(), {{"wall_clock_breakdown", true}})},
  };
  for (const auto& [what, cfg] : same) {
    CAPTURE(what);
    CHECK_FALSE(zero::phase_syncs_matter(cfg));
    const auto b = build("tiny-gpt2", cfg, 2, 16);
    CHECK(lower_free(b, cfg, 2) == b.p);
  }
  CHECK(zero::phase_syncs_matter(with(1, nlohmann::json::object())));
  CHECK(zero::phase_syncs_matter(with(2, {{"overlap_comm", false}})));
}

// The launch queue holds every launch the host issued, not only the graph's ops: stage 2's hooks
// copy each gradient into its IPG bucket (and flush a full bucket) beside the backward's ops
// (Context::launched), so the unsynchronised step's loop pieces, which wait for the launch
// kLaunchQueueOps launches before theirs, can wait for one of those copies. Stage 1's hooks
// launch nothing in the backward (its copies into the bucket are the boundary's, after the last op).
TEST_CASE("the launch queue counts the copies stage 2's gradient hooks launch") {
  auto waits_on = [](int stage) {
    const auto cfg = bf16_config(stage, 2, 1, false);
    const auto b = build("gpt2", cfg, 1, 64);
    zero::LowerOptions lo;
    lo.world_size = 1;
    lo.rank = 0;
    lo.phase_syncs = false;
    const zero::Program free = zero::lower(b.g, cfg, zero::resolve_batch(cfg, 1), lo);
    std::map<zero::CopyOp, int> copies;
    int ops = 0;
    for (const auto& e : free.events) {
      if (free.event_name(e.id) != "step/host.optimizer_step") continue;
      for (const zero::EventId d : free.deps(e)) {
        const auto& w = free.events[static_cast<std::size_t>(d)];
        if (w.kind == EventKind::copy && w.phase == zero::Phase::backward) ++copies[w.copy_op];  // not the boundary's
        ops += w.kind == EventKind::compute;
      }
    }
    return std::make_pair(copies, ops);
  };
  const auto [c2, ops2] = waits_on(2);
  CHECK(c2.count(zero::CopyOp::grad_to_bucket) == 1);  // a hook's copy in the backward is a launch in the queue
  CHECK(ops2 > 0);
  const auto [c1, ops1] = waits_on(1);
  CHECK(c1.count(zero::CopyOp::grad_to_bucket) == 0);
  CHECK(ops1 > 0);
}
