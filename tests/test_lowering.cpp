// The step program: invariants for every stage and option, DeepSpeed's bucket and
// collective semantics (REFERENCE.md §1), and the memory replay's golden numbers.
#include <doctest/doctest.h>

#include <map>
#include <numeric>

#include "cli/simulate.hpp"
#include "sim/memory.hpp"
#include "sim/timing.hpp"
#include "zero/lower.hpp"

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
  CHECK(static_cast<double>(sent) == doctest::Approx(expected).epsilon(0.001));
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
