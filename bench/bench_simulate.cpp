// Speed targets (docs/performance.md):
//  - one full simulation of a bert-large configuration on 4 GPUs (lowering, memory
//    replay, pricing and the event engine; BM_FullSim_BertLarge_4GPUs): < 5 ms
//  - lowering + memory replay of one bert-large configuration: < 5 ms
//  - gpt3-175b, stage 3, 1024 GPUs, full simulation: < 200 ms
//  - the event engine: >= 5 M events/s
//  - gpt3-175b, stage 3, 4096 GPUs: GAS 32767 in the time GAS 16 takes
//  - `simulate` of Llama-2-7b on 64 GPUs, stages 0-3: < 0.5 s
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>

#include "cli/plan.hpp"
#include "cli/simulate.hpp"
#include "planner/plan.hpp"
#include "sim/collective_model.hpp"
#include "sim/compute_model.hpp"
#include "sim/timing.hpp"

using namespace zp;

namespace {

cli::SimRequest bert_request() {
  cli::SimRequest r;
  r.model = "bert-large-uncased";
  r.ds_config = std::string(ZEROPLAN_SHARED_DIR) + "/examples/bert_large_ds_config.json";
  r.gpus = 4;
  r.gpu = "V100-16GB";
  r.micro_batch = 64;
  r.seq_len = 128;
  return r;
}

models::OpGraph graph_for(const cli::Inputs& in, const zero::DsConfig& cfg, const zero::Batch& batch) {
  return models::build_graph(in.model, cli::graph_options(in, cfg, batch));
}

// One configuration: lowering + memory replay (with the caching-allocator model), graph built once.
void BM_LowerAndReplay_BertLarge(benchmark::State& state) {
  auto req = bert_request();
  const int stage = static_cast<int>(state.range(0));
  req.stages = {stage};
  const auto in = cli::load_inputs(req);
  const auto cfg = cli::config_for_stage(in, req, stage);
  const auto batch = zero::resolve_batch(cfg, in.world_size);
  const auto g = graph_for(in, cfg, batch);
  std::size_t events = 0;
  int skipped = 0;
  for (auto _ : state) {
    auto r = cli::simulate_one(in, cfg, &g, false);
    events = static_cast<std::size_t>(r.program.num_events());
    skipped = r.memory.skipped_micro_steps;
    benchmark::DoNotOptimize(r.memory.peak_allocated);
  }
  state.counters["events"] = static_cast<double>(events);
  state.counters["skipped_micro_steps"] = skipped;
}
BENCHMARK(BM_LowerAndReplay_BertLarge)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

// The two halves separately: lowering, and the memory replay with the allocator model.
void BM_Lower_BertLarge(benchmark::State& state) {
  auto req = bert_request();
  const int stage = static_cast<int>(state.range(0));
  const auto in = cli::load_inputs(req);
  const auto cfg = cli::config_for_stage(in, req, stage);
  const auto batch = zero::resolve_batch(cfg, in.world_size);
  const auto g = graph_for(in, cfg, batch);
  zero::LowerOptions lo;
  lo.world_size = in.world_size;
  lo.rank = zero::heaviest_rank(g, cfg, in.world_size);
  for (auto _ : state) {
    auto p = zero::lower(g, cfg, batch, lo);
    benchmark::DoNotOptimize(p.num_events());
  }
}
BENCHMARK(BM_Lower_BertLarge)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

void BM_Replay_BertLarge(benchmark::State& state) {
  auto req = bert_request();
  const int stage = static_cast<int>(state.range(0));
  const bool allocator = state.range(1) != 0;
  const auto in = cli::load_inputs(req);
  const auto cfg = cli::config_for_stage(in, req, stage);
  const auto r = cli::simulate_one(in, cfg);
  sim::MemoryOptions mo;
  mo.allocator = allocator;
  for (auto _ : state) {
    auto m = sim::replay_memory(r.program, *in.device, mo);
    benchmark::DoNotOptimize(m.peak_allocated);
  }
}
BENCHMARK(BM_Replay_BertLarge)->ArgsProduct({{0, 1, 2, 3}, {0, 1}})->Unit(benchmark::kMillisecond);

// The time half alone: pricing every event and running the event engine.
void BM_Time_BertLarge(benchmark::State& state) {
  auto req = bert_request();
  const int stage = static_cast<int>(state.range(0));
  const auto in = cli::load_inputs(req);
  const auto cfg = cli::config_for_stage(in, req, stage);
  const auto r = cli::simulate_one(in, cfg, nullptr, false);
  const auto g = graph_for(in, cfg, r.batch);
  sim::EngineOptions eo;
  eo.interference = in.profile.comm_compute_interference;
  for (auto _ : state) {
    const sim::ComputeModel compute(in.profile, g);
    auto t = sim::simulate_time(r.program, g, compute, *in.collectives, eo);
    benchmark::DoNotOptimize(t.report.phases.iteration);
  }
}
BENCHMARK(BM_Time_BertLarge)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

// Issue targets of the time model: one full simulation (lowering + events + memory).
void BM_FullSim_BertLarge_4GPUs(benchmark::State& state) {
  auto req = bert_request();
  const int stage = static_cast<int>(state.range(0));
  const auto in = cli::load_inputs(req);
  const auto cfg = cli::config_for_stage(in, req, stage);
  const auto g = graph_for(in, cfg, zero::resolve_batch(cfg, in.world_size));
  for (auto _ : state) {
    auto r = cli::simulate_one(in, cfg, &g, true);
    benchmark::DoNotOptimize(r.time.report.phases.iteration);
  }
}
BENCHMARK(BM_FullSim_BertLarge_4GPUs)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

void BM_FullSim_GPT3_175B_Stage3_1024GPUs(benchmark::State& state) {
  cli::SimRequest r;
  r.model = "gpt3-175b";
  r.cluster = "8xA100-80GB-NVSwitch";
  r.nodes = 128;
  r.micro_batch = 1;
  r.seq_len = 2048;
  r.stages = {3};
  r.activation_checkpointing = true;
  const auto in = cli::load_inputs(r);
  const auto cfg = cli::config_for_stage(in, r, 3);
  const auto g = graph_for(in, cfg, zero::resolve_batch(cfg, in.world_size));
  std::size_t events = 0;
  for (auto _ : state) {
    auto res = cli::simulate_one(in, cfg, &g, true);
    events = static_cast<std::size_t>(res.program.num_events());
    benchmark::DoNotOptimize(res.time.report.phases.iteration);
  }
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_FullSim_GPT3_175B_Stage3_1024GPUs)->Unit(benchmark::kMillisecond);

// The engine alone: events per second on one core, of the program as simulate lowers it
// (arg 0: its repeated micro-steps stored once, counted as the events they stand for) and of
// the same program lowered one by one (arg 1: every event run).
void BM_Engine(benchmark::State& state) {
  auto req = bert_request();
  req.micro_batch = 8;
  const auto in = cli::load_inputs(req);
  const auto cfg = cli::config_for_stage(in, req, 3);
  const auto batch = zero::resolve_batch(cfg, in.world_size);
  const auto g = graph_for(in, cfg, batch);
  zero::LowerOptions lo;
  lo.world_size = in.world_size;
  lo.replicate_micro_steps = state.range(0) == 0;
  const auto program = zero::lower(g, cfg, batch, lo);
  const sim::ComputeModel compute(in.profile, g);
  const auto d = sim::event_durations(program, compute, *in.collectives);
  sim::EngineOptions eo;
  eo.interference = 0.15;
  std::int64_t processed = 0;
  for (auto _ : state) {
    auto t = sim::run_events(program, d, eo);
    processed += t.processed;
    benchmark::DoNotOptimize(t.phases.iteration);
  }
  state.counters["events_per_s"] = benchmark::Counter(static_cast<double>(processed), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Engine)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Issue 13's target: gpt3-175b, stage 3, 512 nodes of 8 H100 (4096 ranks), seq 2048, bf16,
// the whole simulation (lowering, memory replay, pricing, engine) at GAS 16, 1024 and 32767:
// the repeated micro-steps are stored once, so each costs about what GAS 16 costs.
void BM_FullSim_GPT3_175B_4096GPUs_GAS(benchmark::State& state) {
  const auto cfg_path = std::filesystem::temp_directory_path() /
                        ("zeroplan_bench_gas" + std::to_string(state.range(0)) + ".json");
  std::ofstream(cfg_path) << R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )"
                          << state.range(0) << R"(, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3}})";
  cli::SimRequest r;
  r.model = "gpt3-175b";
  r.cluster = "8xH100-80GB-NVSwitch";
  r.nodes = 512;
  r.ds_config = cfg_path.string();
  r.stages = {3};
  const auto in = cli::load_inputs(r);
  const auto cfg = cli::config_for_stage(in, r, 3);
  const auto g = graph_for(in, cfg, zero::resolve_batch(cfg, in.world_size));
  std::int64_t events = 0;
  for (auto _ : state) {
    auto res = cli::simulate_one(in, cfg, &g, true);
    events = res.program.num_events();
    benchmark::DoNotOptimize(res.time.report.phases.iteration);
  }
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_FullSim_GPT3_175B_4096GPUs_GAS)->Arg(16)->Arg(1024)->Arg(32767)->Unit(benchmark::kMillisecond);

// The --json document of one result, with the critical path event by event.
void BM_ResultJson_BertLarge(benchmark::State& state) {
  auto req = bert_request();
  const int stage = static_cast<int>(state.range(0));
  const auto in = cli::load_inputs(req);
  const auto r = cli::simulate_one(in, cli::config_for_stage(in, req, stage));
  for (auto _ : state) {
    auto j = cli::result_json(r, true);
    benchmark::DoNotOptimize(j["critical_path"]["num_events"]);
  }
  state.counters["path_events"] = static_cast<double>(r.time.report.critical_path.size());
}
BENCHMARK(BM_ResultJson_BertLarge)->Arg(3)->Unit(benchmark::kMillisecond);

// The whole command: load inputs, build the graph, lower and replay four stages.
void BM_Simulate_Llama2_7b_64GPUs_AllStages(benchmark::State& state) {
  cli::SimRequest r;
  r.model = "Llama-2-7b";
  r.gpus = 64;
  r.gpu = "A100-80GB";
  r.micro_batch = 1;
  r.seq_len = 4096;
  r.stages = {0, 1, 2, 3};
  for (auto _ : state) {
    const auto in = cli::load_inputs(r);
    auto rs = cli::simulate(in, r);
    benchmark::DoNotOptimize(rs.back().memory.peak_allocated);
  }
}
BENCHMARK(BM_Simulate_Llama2_7b_64GPUs_AllStages)->Unit(benchmark::kMillisecond);

// The planner (issue targets: bert-large on 4 x V100 < 1 s; GPT-3 175B on 1024 GPUs < 10 s),
// on every core. Counters: full simulations per second and grid candidates decided per second.
void run_plan_bench(benchmark::State& state, const cli::PlanRequest& req) {
  const auto pb = cli::plan_problem(req);
  const auto space = planner::default_space(pb, {});
  planner::PlanResult r;
  double seconds = 0;
  for (auto _ : state) {
    r = planner::plan(pb, space, 0);
    seconds += r.stats.seconds;
    benchmark::DoNotOptimize(r.ranked.front().samples_per_s);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["simulated"] = static_cast<double>(r.stats.simulated);
  state.counters["grid"] = static_cast<double>(r.stats.grid);
  state.counters["sims_per_s"] = static_cast<double>(r.stats.simulated) * n / seconds;
  state.counters["candidates_per_s"] = static_cast<double>(r.stats.grid) * n / seconds;
  state.counters["threads"] = r.stats.threads;
}

void BM_Plan_BertLarge_4xV100(benchmark::State& state) {
  cli::PlanRequest req;
  req.base.model = "bert-large-uncased";
  req.base.cluster = "4xV100-16GB-PCIe";
  req.base.ds_config = std::string(ZEROPLAN_SHARED_DIR) + "/examples/bert_large_ds_config.json";
  req.base.seq_len = 128;
  run_plan_bench(state, req);
}
BENCHMARK(BM_Plan_BertLarge_4xV100)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Plan_GPT3_175B_1024GPUs(benchmark::State& state) {
  cli::PlanRequest req;
  req.base.model = "gpt3-175b";
  req.base.cluster = "8xA100-80GB-NVSwitch";
  req.base.nodes = 128;
  req.base.seq_len = 2048;
  req.global_batch = 2048;
  const auto cfg = std::filesystem::temp_directory_path() / "zeroplan_bench_bf16.json";
  std::ofstream(cfg) << R"({"bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})";
  req.base.ds_config = cfg.string();
  run_plan_bench(state, req);
}
BENCHMARK(BM_Plan_GPT3_175B_1024GPUs)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
