// The planner: its search against the full grid (regret), the memory bound it promises,
// the shortcuts it takes (knob relevance, GAS extrapolation, the compute bound) checked
// against full simulation, its ds_config output, and its bad inputs.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "cli/plan.hpp"
#include "planner/plan.hpp"
#include "sim/predict.hpp"
#include "test_util.hpp"
#include "zero/lower.hpp"

using namespace zp;
using planner::Dim;
using planner::get;

namespace {

cli::PlanRequest request(const std::string& model, const std::string& cluster, std::optional<int> nodes,
                         std::int64_t global, std::int64_t seq, const std::string& ds_config = "") {
  cli::PlanRequest r;
  r.base.model = model;
  r.base.cluster = cluster;
  r.base.nodes = nodes;
  r.base.seq_len = seq;
  r.base.ds_config = ds_config;
  r.global_batch = global;
  return r;
}

std::string fp16_config() {
  const auto p = std::filesystem::temp_directory_path() / "zeroplan_test_planner_fp16.json";
  std::ofstream(p) << R"({"fp16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})";
  return p.string();
}
std::string bf16_config() {
  const auto p = std::filesystem::temp_directory_path() / "zeroplan_test_planner_bf16.json";
  std::ofstream(p) << R"({"bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})";
  return p.string();
}

void set_values(planner::Space& s, Dim d, std::vector<std::int64_t> v) { s.values[static_cast<std::size_t>(d)] = std::move(v); }

// A reduced grid (every dimension still searched, fewer values) small enough to
// simulate exhaustively in a test.
planner::Space reduced(const planner::Problem& pb, std::vector<std::int64_t> mbs) {
  planner::Space s = planner::default_space(pb, {});
  set_values(s, Dim::micro_batch, std::move(mbs));
  set_values(s, Dim::reduce_bucket_size, {20000000, 500000000});
  set_values(s, Dim::use_multi_rank_bucket_allreduce, {1});
  set_values(s, Dim::reduce_scatter, {1});
  set_values(s, Dim::stage3_prefetch_bucket_size, {10000000, 200000000});
  set_values(s, Dim::stage3_param_persistence_threshold, {100000});
  set_values(s, Dim::stage3_max_live_parameters, {1000000000});
  set_values(s, Dim::stage3_max_reuse_distance, {1000000000});
  return s;
}

}  // namespace

TEST_CASE("regret: the search's choice is within 1% of the exhaustive grid's best") {
  struct Case {
    std::string model, cluster;
    std::optional<int> nodes;
    std::int64_t global, seq;
    std::string cfg;
    std::vector<std::int64_t> mbs;
  };
  const std::vector<Case> cases = {
      {"bert-large-uncased", "4xV100-16GB-PCIe", std::nullopt, 1024, 128, fp16_config(), {8, 16, 32, 64}},
      {"gpt2-xl", "8xA100-80GB-NVSwitch", 2, 256, 1024, bf16_config(), {1, 2, 4, 8}},
      {"Llama-2-7b", "8xH100-80GB-NVSwitch", 8, 512, 2048, bf16_config(), {1, 2, 4}},
      {"Llama-2-13b", "8xH200-141GB-NVSwitch", std::nullopt, 64, 2048, bf16_config(), {1, 2, 4}},
      // Memory-bound: the fastest point needs overlap_comm and a small prefetch together.
      {"Llama-2-13b", "8xV100-32GB-NVLink", std::nullopt, 32, 1024, fp16_config(), {1, 2, 4}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.model);
    CAPTURE(c.cluster);
    const auto pb = cli::plan_problem(request(c.model, c.cluster, c.nodes, c.global, c.seq, c.cfg));
    const auto space = reduced(pb, c.mbs);
    const auto full = planner::exhaustive(pb, space, 2);
    const auto found = planner::plan(pb, space, 2);
    REQUIRE(full.any_fits());
    REQUIRE(found.any_fits());
    const auto& best = full.ranked.front();
    const auto& got = found.ranked.front();
    MESSAGE(fmt::format("{} on {}: exhaustive {} sims best {:.2f} samples/s (stage {}, mb {}); search {} sims {:.2f}",
                        c.model, c.cluster, full.stats.simulated, best.samples_per_s, get(best.knobs, Dim::stage),
                        best.batch.micro_batch, found.stats.simulated, got.samples_per_s));
    CHECK(got.samples_per_s >= 0.99 * best.samples_per_s);
    CHECK(found.stats.simulated < full.stats.simulated);
    // The winner fits its bound, and so does every fitting candidate of the grid.
    CHECK(got.device_used <= got.device_limit);
    CHECK(got.host_per_node <= got.host_limit);
    const std::int64_t psi = planner::GraphCache(pb).get(1).param_count();
    for (const auto& e : full.all) {
      if (e.fits) CHECK(e.device_used <= e.device_limit);
      CHECK(planner::candidate_lower_bound(pb, psi, e.knobs) <= e.device_used);  // the bound never overestimates
    }
    CHECK(found.stats.grid == full.stats.grid);  // every point evaluated, by bound or simulation
    // The compute bound holds for every point, and is the same for every knob setting of a shape.
    planner::GraphCache graphs(pb);
    graphs.prepare(c.mbs);
    std::map<planner::Knobs, double> bound_of_shape;
    for (const auto& e : full.all) {
      const double b = planner::compute_bound_ms(pb, graphs, e.knobs);
      CHECK(e.iteration_ms >= b * (1 - 1e-9));
      planner::Knobs shape{};
      for (Dim d : {Dim::stage, Dim::micro_batch, Dim::activation_checkpointing, Dim::offload_optimizer,
                    Dim::zero_hpz_partition_size})
        planner::set(shape, d, get(e.knobs, d));
      auto [it, fresh] = bound_of_shape.emplace(shape, b);
      if (!fresh) CHECK(it->second == zp::test::approx(b).epsilon(1e-12));
    }
  }
}

TEST_CASE("only stage 3 with the optimizer offloaded fits: the planner finds it") {
  // Llama-2-7b in fp16 on 4 V100-16GB (14.2 GiB limit): the replicated 16-bit params
  // (13.5 GB) and the gradient partition do not fit below stage 3, and at stage 3 the
  // partitioned fp32 master and Adam states (12 x 6.74e9 / 4 = 20 GB) do not fit on the GPU.
  auto req = request("Llama-2-7b", "4xV100-16GB-PCIe", std::nullopt, 32, 1024, fp16_config());
  const auto pb = cli::plan_problem(req);
  auto space = reduced(pb, {1, 2, 4});
  const auto found = planner::plan(pb, space, 2);
  REQUIRE(found.any_fits());
  const auto& w = found.ranked.front();
  CHECK(get(w.knobs, Dim::stage) == 3);
  CHECK(get(w.knobs, Dim::offload_optimizer) == 1);
  const auto full = planner::exhaustive(pb, space, 2);
  int fitting = 0;
  for (const auto& e : full.all) {
    if (!e.fits) continue;
    ++fitting;
    CHECK(get(e.knobs, Dim::stage) == 3);
    CHECK(get(e.knobs, Dim::offload_optimizer) == 1);
  }
  CHECK(fitting > 0);
  CHECK(w.samples_per_s >= 0.99 * full.ranked.front().samples_per_s);
}

TEST_CASE("nothing fits: the answer says so and names the smallest change that fits") {
  // GPT-3 175B on one node of 8 A100-80GB: even at stage 3 with the optimizer offloaded,
  // the partitioned 16-bit params and gradients (2 x 350 GB / 8 = 87.5 GB) exceed 72 GB.
  auto req = request("gpt3-175b", "8xA100-80GB-NVSwitch", std::nullopt, 64, 2048, bf16_config());
  const auto pb = cli::plan_problem(req);
  auto space = planner::default_space(pb, {});
  const auto found = planner::plan(pb, space, 2);
  CHECK_FALSE(found.any_fits());
  const auto sugg = planner::suggest_when_nothing_fits(pb, space, 2);
  REQUIRE(!sugg.empty());
  const planner::Suggestion* first = nullptr;
  for (const auto& s : sugg)
    if (s.fits && !first) first = &s;
  REQUIRE(first != nullptr);
  // Checkpointing, offload and shorter sequences cannot shrink the model states: only
  // more GPUs do. On 2 nodes the GPUs would hold the partitions, but the offloaded fp32
  // optimizer (16 B per parameter with its gradients, 1.4 TB per node) exceeds 90% of a
  // node's 1 TiB host memory; 4 nodes are the first to fit.
  CHECK(first->change.find("4 nodes") == 0);
  for (const auto& s : sugg)
    if (s.change.find("2 nodes") == 0) {
      REQUIRE(s.best);
      CHECK_FALSE(s.fits);
      CHECK(s.best->device_used <= s.best->device_limit);
      CHECK(s.best->host_per_node > s.best->host_limit);
    }
  CHECK(first->best->fits);
  CHECK(first->best->device_used <= first->best->device_limit);
  for (const auto& s : sugg)
    if (s.change.find("seq-len") == 0 || s.change.find("activation") == 0) CHECK_FALSE(s.fits);

  // The command says so too, with exit status 3 (kExitNothingFits) and "best": null.
  const auto r = test::run_shell(std::string(ZEROPLAN_BIN) +
                                 " plan --model gpt3-175b --cluster 8xA100-80GB-NVSwitch --global-batch 64 --seq-len 2048"
                                 " --json --ds-config " + bf16_config(), false);
  CHECK(r.status == 3);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["best"].is_null());
  CHECK(j["nothing_fits"] == true);
}

TEST_CASE("knobs the planner does not search cannot change the program") {
  const auto pb = cli::plan_problem(request("gpt2", "8xA100-80GB-NVSwitch", std::nullopt, 64, 256, fp16_config()));
  planner::GraphCache graphs(pb);
  const auto& g = graphs.get(2);
  auto program = [&](const planner::Knobs& k) {
    const auto cfg = planner::config_of(pb, k);
    zero::LowerOptions lo;
    lo.world_size = pb.world_size;
    lo.rank = 0;
    return zero::lower(g, cfg, zero::resolve_batch(cfg, pb.world_size), lo);
  };
  auto same = [](const zero::Program& a, const zero::Program& b) {
    if (a.events.size() != b.events.size() || a.buffers.size() != b.buffers.size()) return false;
    for (std::size_t i = 0; i < a.events.size(); ++i)
      if (a.event_name(static_cast<zero::EventId>(i)) != b.event_name(static_cast<zero::EventId>(i)) ||
          a.events[i].stream != b.events[i].stream || a.events[i].elements != b.events[i].elements)
        return false;
    for (std::size_t i = 0; i < a.buffers.size(); ++i)
      if (a.buffers[i].elements != b.buffers[i].elements) return false;
    return true;
  };
  const std::map<Dim, std::vector<std::int64_t>> probe = {
      {Dim::offload_optimizer, {0, 1}},
      {Dim::reduce_bucket_size, {1000000, 50000000}},
      {Dim::allgather_bucket_size, {1000000, 50000000}},
      {Dim::overlap_comm, {0, 1}},
      {Dim::contiguous_gradients, {0, 1}},
      {Dim::reduce_scatter, {0, 1}},
      {Dim::use_multi_rank_bucket_allreduce, {0, 1}},
      {Dim::stage3_prefetch_bucket_size, {1000000, 50000000}},
      {Dim::stage3_param_persistence_threshold, {1000, 1000000}},
      {Dim::stage3_max_live_parameters, {10000000, 1000000000}},
      {Dim::stage3_max_reuse_distance, {0, 1000000000}},
  };
  for (int stage = 0; stage <= 3; ++stage) {
    planner::Knobs k = planner::base_knobs(pb);
    planner::set(k, Dim::stage, stage);
    planner::set(k, Dim::micro_batch, 2);
    int relevant_that_changed = 0;
    for (const auto& [d, vals] : probe) {
      CAPTURE(stage);
      CAPTURE(planner::dim_name(d));
      planner::Knobs a = k, b = k;
      planner::set(a, d, vals[0]);
      planner::set(b, d, vals[1]);
      const bool equal = same(program(a), program(b));
      if (!planner::relevant(pb, k, d)) CHECK(equal);  // the planner may skip it
      else relevant_that_changed += equal ? 0 : 1;
    }
    if (stage >= 1) CHECK(relevant_that_changed >= 3);  // the search space is not vacuous
  }
}

TEST_CASE("GAS above the direct limit: two short programs extrapolate the long one") {
  const auto pb = cli::plan_problem(request("gpt2", "8xA100-80GB-NVSwitch", 2, 512, 512, fp16_config()));
  planner::GraphCache graphs(pb);
  graphs.prepare({2});
  for (int stage = 0; stage <= 3; ++stage)
    for (int variant = 0; variant < 4; ++variant) {
      const int overlap = variant & 1, other = variant >> 1;
      CAPTURE(stage);
      CAPTURE(overlap);
      CAPTURE(other);
      planner::Knobs k = planner::base_knobs(pb);
      planner::set(k, Dim::stage, stage);
      planner::set(k, Dim::micro_batch, 2);  // GAS 512 / (2 x 16) = 16
      planner::set(k, Dim::overlap_comm, overlap);
      // the other knobs that change what repeats per micro-step
      planner::set(k, Dim::activation_checkpointing, other);
      planner::set(k, Dim::contiguous_gradients, 1 - other);
      planner::set(k, Dim::offload_optimizer, stage >= 1 ? other : 0);
      planner::set(k, Dim::reduce_bucket_size, other ? 5000000 : 500000000);
      const auto ev = planner::evaluate(pb, graphs, k);
      REQUIRE(ev.extrapolated);
      REQUIRE(ev.batch.gas == 16);
      const auto cfg = planner::config_of(pb, k);
      const auto direct = sim::predict(*graphs.find(2, other != 0), cfg, zero::resolve_batch(cfg, pb.world_size),
                                       planner::target_of(pb, other != 0));
      CHECK(ev.device_used == direct.memory.device_used);
      CHECK(ev.peak_allocated == direct.memory.peak_allocated);
      CHECK(ev.iteration_ms == zp::test::approx(direct.time.iteration.ms()).epsilon(1e-6));
      CHECK(ev.backward_allreduce_ms == zp::test::approx(direct.time.report.phases.backward_allreduce.ms()).epsilon(1e-6));
      CHECK(ev.comm_bytes == zp::test::approx(static_cast<double>(direct.time.report.comm.total.v)).epsilon(1e-9));
      CHECK(ev.mfu == zp::test::approx(direct.time.mfu).epsilon(1e-6));
    }
}

// DeepSpeed's own work priced (its Python on the host, per-tensor loops, stage 3's separate bias
// adds) or not (zeroplan's executor, `plan --verify`'s second prediction): the same program and
// bytes, every host event free, and never a slower iteration; at stage 3, whose forward is
// host-bound, much faster.
TEST_CASE("the executor's prediction: DeepSpeed's host work, loops and separate bias adds left out") {
  const auto pb = cli::plan_problem(request("gpt2", "8xH100-80GB-NVSwitch", 1, 16, 1024, fp16_config()));
  planner::Problem exec_pb = pb;
  exec_pb.deepspeed = false;
  planner::GraphCache graphs(pb), exec_graphs(exec_pb);
  graphs.prepare({2});
  exec_graphs.prepare({2});
  double s3_ratio = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    planner::Knobs k = planner::base_knobs(pb);
    planner::set(k, Dim::stage, stage);
    planner::set(k, Dim::micro_batch, 2);
    const auto ds = planner::evaluate(pb, graphs, k), ex = planner::evaluate(exec_pb, exec_graphs, k);
    CHECK(ex.peak_allocated == ds.peak_allocated);
    CHECK(ex.device_used == ds.device_used);
    CHECK(ex.iteration_ms < ds.iteration_ms);
    CHECK(ex.samples_per_s > ds.samples_per_s);
    if (stage == 3) s3_ratio = ds.iteration_ms / ex.iteration_ms;
    // Host events cost nothing for the executor; DeepSpeed's do.
    const auto cfg = planner::config_of(pb, k);
    const sim::Target t = planner::target_of(exec_pb, false), t_ds = planner::target_of(pb, false);
    REQUIRE(!t.deepspeed);
    REQUIRE(t_ds.deepspeed);
    const auto batch = zero::resolve_batch(cfg, pb.world_size);
    const auto p = sim::predict(*exec_graphs.find(2, false), cfg, batch, t);
    const auto p_ds = sim::predict(*graphs.find(2, false), cfg, batch, t_ds);
    REQUIRE(p.program.events.size() == p_ds.program.events.size());
    int host_events = 0;
    double ds_host_s = 0;
    for (std::size_t i = 0; i < p.program.events.size(); ++i) {
      if (p.program.events[i].kind != zero::EventKind::host) continue;
      ++host_events;
      CHECK(p.time.report.events[i].end.v == p.time.report.events[i].start.v);
      ds_host_s += p_ds.time.report.events[i].end.v - p_ds.time.report.events[i].start.v;
    }
    CHECK(host_events > 0);
    CHECK(ds_host_s > 0);
  }
  CHECK(s3_ratio > 1.2);
}

TEST_CASE("the winner's ds_config is the base with the searched keys replaced, and reads back") {
  const std::string base = std::string(ZEROPLAN_SHARED_DIR) + "/examples/bert_large_ds_config.json";
  const auto out = std::filesystem::temp_directory_path() / "zeroplan_test_plan_best.json";
  std::filesystem::remove(out);
  const auto r = test::run_shell(std::string(ZEROPLAN_BIN) +
                                 " plan --model bert-large-uncased --cluster 4xV100-16GB-PCIe --seq-len 128 --json"
                                 " --ds-config " + base + " --out " + out.string(), false);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["best"].is_object());
  CHECK(j["candidates_evaluated"].get<int>() > j["candidates_simulated"].get<int>());
  CHECK(j["candidates_simulated"].get<int>() > 0);
  CHECK(j["search_seconds"].get<double>() > 0);
  CHECK(j["ranked"].size() >= 2);
  const auto cfg = zero::load_ds_config(out.string());
  const auto doc = nlohmann::json::parse(std::ifstream(out));
  CHECK(doc == j["best"]["ds_config"]);
  CHECK(doc["scheduler"]["type"] == "WarmupLR");  // the base's other sections stay
  // Keys DeepSpeed 0.19 refuses are left out, so DeepSpeed accepts what the plan writes.
  CHECK_FALSE(doc.contains("sparse_attention"));
  CHECK_FALSE(doc["zero_optimization"].contains("grad_hooks"));
  CHECK(cfg.zero.stage == j["best"]["stage"].get<int>());
  const auto b = zero::resolve_batch(cfg, 4);
  CHECK(b.train_batch_size == 4096);
  CHECK(b.micro_batch == j["best"]["micro_batch"].get<std::int64_t>());
  CHECK(b.gas == j["best"]["gradient_accumulation_steps"].get<std::int64_t>());
  CHECK(j["best"]["fits"] == true);
  CHECK(j["best"]["memory"]["device_used_bytes"].get<std::int64_t>() <=
        j["best"]["memory"]["device_limit_bytes"].get<std::int64_t>());
  // simulate agrees with the plan on the winner's config.
  const auto s = test::run_shell(std::string(ZEROPLAN_BIN) + " simulate --model bert-large-uncased --cluster "
                                 "4xV100-16GB-PCIe --seq-len 128 --json --ds-config " + out.string() +
                                 (j["best"]["knobs"]["activation_checkpointing"] == true ? " --activation-checkpointing" : ""),
                                 false);
  REQUIRE(s.status == 0);
  const auto sj = nlohmann::json::parse(s.out)["results"][0];
  CHECK(sj["memory"]["device_used_bytes"] == j["best"]["memory"]["device_used_bytes"]);
  CHECK(sj["time"]["iteration_ms"].get<double>() ==
        zp::test::approx(j["best"]["time"]["iteration_ms"].get<double>()).epsilon(1e-6));
}

TEST_CASE("plan: bad input is one line and exit status 2") {
  const std::string base = std::string(ZEROPLAN_BIN) + " plan --model bert-large-uncased --cluster 4xV100-16GB-PCIe --seq-len 128";
  struct Bad {
    std::string args, expect;
  };
  const std::vector<Bad> bad = {
      {" --global-batch 6", "--global-batch: 6 is not a multiple of the 4 ranks"},
      {" --global-batch 0", "--global-batch"},
      {" --global-batch 64 --search stage,bogus", "--search: unknown key 'bogus'; allowed: stage, micro_batch"},
      {" --global-batch 64 --memory-headroom 0", "--memory-headroom: must be in (0, 1], got 0"},
      {" --global-batch 64 --memory-headroom 1.5", "--memory-headroom: must be in (0, 1], got 1.5"},
      {" --global-batch 64 --memory-headroom nan", "--memory-headroom"},
      {" --global-batch 64 --objective speed", "--objective: must be one of throughput, memory, cost"},
      {" --global-batch 64 --top 0", "--top"},
      {"", "--global-batch: give the global batch"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.args);
    const auto r = test::run_shell(base + b.args);
    CHECK(r.status == 2);
    CHECK(r.out.find(b.expect) != std::string::npos);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}

TEST_CASE("plan --verify runs the top candidates on the executor: memory equal to the byte") {
  const auto r = test::run_shell(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(ZEROPLAN_BIN) +
          " plan --model tiny-gpt2 --cluster cpu-local --gpus 2 --global-batch 8 --seq-len 32 --search stage,micro_batch"
          " --verify --top 3 --verify-steps 2 --json",
      false);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  const auto& v = j["verify"]["candidates"];
  REQUIRE(v.size() == 3);
  for (const auto& c : v) {
    CAPTURE(c.dump());
    CHECK(c["exit_status"] == 0);
    CHECK(c["memory_equal"] == true);
    CHECK(c["measured_peak_allocated_bytes"] == c["predicted_peak_allocated_bytes"]);
    CHECK(c["measured_samples_per_s"].get<double>() > 0);
    // The candidate predicted again as the executor runs it: none of DeepSpeed's own work.
    CHECK(c["executor_predicted_samples_per_s"].get<double>() > c["predicted_samples_per_s"].get<double>());
  }
  CHECK(j["verify"]["ranking_held"].is_boolean());
  std::filesystem::remove_all(j["verify"]["directory"].get<std::string>());
}

TEST_CASE("plan --verify skips candidates the CPU executor would need longer than the cap for, and says why") {
  const auto r = test::run_shell(std::string(ZEROPLAN_BIN) +
                                     " plan --model bert-large-uncased --cluster 4xV100-16GB-PCIe --seq-len 128 --ds-config " +
                                     std::string(ZEROPLAN_SHARED_DIR) + "/examples/bert_large_ds_config.json"
                                     " --verify --top 2 --json",
                                 false);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  const auto& v = j["verify"]["candidates"];
  REQUIRE(v.size() == 2);
  for (const auto& c : v) {
    REQUIRE(c.contains("skipped"));
    CHECK(c["skipped"].get<std::string>().find("would take at least 13 min") != std::string::npos);
  }
  CHECK(j["verify"]["ranking_held"].is_null());
  std::filesystem::remove_all(j["verify"]["directory"].get<std::string>());
  const auto bad = test::run_shell(std::string(ZEROPLAN_BIN) + " plan --model tiny-gpt2 --cluster cpu-local "
                                   "--global-batch 8 --verify --verify-max-minutes 0");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("--verify-max-minutes: must be a number > 0") != std::string::npos);
}
