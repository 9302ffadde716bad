// The event engine on hand-built programs: stream order, dependencies, overlap,
// interference, determinism, phase accounting and the Chrome trace layout.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "sim/engine.hpp"
#include "sim/trace.hpp"

using namespace zp;
using zero::EventKind;
using zero::Phase;
using zero::Stream;

namespace {

// A small program builder for tests: events in program order with explicit deps.
struct Tiny {
  zero::Program p;
  std::vector<Seconds> d;
  Tiny() {
    p.groups.push_back({"dp", {0, 1}});
    p.step_begin = 0;
  }
  zero::EventId add(EventKind k, Stream s, Phase ph, int micro, double seconds, std::vector<zero::EventId> deps = {},
                    const std::string& label = "e") {
    zero::Event e;
    e.id = static_cast<zero::EventId>(p.events.size());
    e.kind = k;
    e.stream = s;
    e.phase = ph;
    e.micro_step = static_cast<std::int16_t>(micro);
    p.labels.push_back(label + std::to_string(e.id));
    e.label = static_cast<std::int32_t>(p.labels.size() - 1);
    e.dep_begin = static_cast<std::uint32_t>(p.dep_list.size());
    for (auto x : deps) p.dep_list.push_back(x);
    e.dep_end = static_cast<std::uint32_t>(p.dep_list.size());
    e.alloc_begin = e.alloc_end = static_cast<std::uint32_t>(p.alloc_list.size());
    e.free_begin = e.free_end = static_cast<std::uint32_t>(p.free_list.size());
    if (k == EventKind::collective) {
      e.group = 0;
      e.coll = zero::CollKind::all_reduce;
      e.elements = 1000;
      e.dtype = DType::fp16;
    }
    p.events.push_back(e);
    d.push_back(Seconds{seconds});
    return e.id;
  }
  void alloc_free(zero::EventId a, zero::EventId f, std::int64_t bytes, zero::Category c) {
    zero::Buffer b;
    b.id = static_cast<zero::BufferId>(p.buffers.size());
    b.category = c;
    b.elements = bytes;
    b.dtype = DType::u8;
    b.bytes = Bytes{bytes};
    p.buffers.push_back(b);
    // Events here have no allocations yet; append at the end of the lists (tests build
    // allocation-carrying events last).
    auto& ea = p.events[static_cast<std::size_t>(a)];
    ea.alloc_begin = static_cast<std::uint32_t>(p.alloc_list.size());
    p.alloc_list.push_back(b.id);
    ea.alloc_end = static_cast<std::uint32_t>(p.alloc_list.size());
    auto& ef = p.events[static_cast<std::size_t>(f)];
    ef.free_begin = static_cast<std::uint32_t>(p.free_list.size());
    p.free_list.push_back(b.id);
    ef.free_end = static_cast<std::uint32_t>(p.free_list.size());
  }
};

}  // namespace

TEST_CASE("one stream runs in program order; a dependency on another stream waits") {
  Tiny t;
  const auto a = t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 1.0);
  const auto b = t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 2.0);
  const auto c = t.add(EventKind::collective, Stream::reduction, Phase::backward, 0, 5.0, {a});
  const auto d = t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 1.0, {c});
  const auto r = sim::run_events(t.p, t.d);
  CHECK(r.events[a].start.v == 0.0);
  CHECK(r.events[a].end.v == 1.0);
  CHECK(r.events[b].start.v == 1.0);  // in order behind a
  CHECK(r.events[c].start.v == 1.0);  // overlaps b on its own stream
  CHECK(r.events[c].end.v == 6.0);
  CHECK(r.events[d].start.v == 6.0);  // waits for the collective
  CHECK(r.phases.iteration.v == 7.0);
  CHECK(r.phases.forward.v == 1.0);
  CHECK(r.phases.backward.v == 6.0);
  // Backward compute ran 3 s of the 6 s backward: 3 s were exposed communication.
  CHECK(r.phases.backward_allreduce.v == zp::test::approx(3.0));
  CHECK(r.comm.exposed[static_cast<std::size_t>(zero::CollKind::all_reduce)].v == zp::test::approx(3.0));
  // Critical path: a → c → d.
  CHECK(r.critical_path.events() == std::vector<zero::EventId>{a, c, d});
  CHECK(r.processed == 4);
}

TEST_CASE("a collective on the compute stream blocks it") {
  Tiny t;
  t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 1.0);
  t.add(EventKind::collective, Stream::compute, Phase::backward, 0, 2.0);
  const auto c = t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 1.0);
  const auto r = sim::run_events(t.p, t.d);
  CHECK(r.events[c].start.v == 3.0);
  CHECK(r.comm.exposed[static_cast<std::size_t>(zero::CollKind::all_reduce)].v == 2.0);
}

TEST_CASE("interference slows compute while a collective overlaps it") {
  Tiny t;
  t.add(EventKind::collective, Stream::reduction, Phase::backward, 0, 1.0);
  const auto c = t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 2.0);
  sim::EngineOptions o;
  o.interference = 1.0;  // half speed while overlapped
  const auto r = sim::run_events(t.p, t.d, o);
  // First second at half speed (0.5 s of work), the remaining 1.5 s alone.
  CHECK(r.events[c].end.v == zp::test::approx(2.5));
  const auto r0 = sim::run_events(t.p, t.d);
  CHECK(r0.events[c].end.v == zp::test::approx(2.0));
}

TEST_CASE("deterministic: the same program gives the same times, ties broken by event id") {
  Tiny t;
  for (int i = 0; i < 50; ++i) {
    t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 0.001 * (i % 3));
    t.add(EventKind::collective, Stream::reduction, Phase::forward, 0, 0.001 * (i % 2), {static_cast<zero::EventId>(2 * i)});
  }
  const auto r1 = sim::run_events(t.p, t.d);
  const auto r2 = sim::run_events(t.p, t.d);
  for (std::size_t i = 0; i < r1.events.size(); ++i) {
    CHECK(r1.events[i].start.v == r2.events[i].start.v);
    CHECK(r1.events[i].end.v == r2.events[i].end.v);
  }
}

TEST_CASE("zero-length events and markers complete at once; a bad duration count is refused") {
  Tiny t;
  const auto a = t.add(EventKind::marker, Stream::compute, Phase::forward, 0, 0.0);
  const auto b = t.add(EventKind::compute, Stream::host, Phase::step, -1, 0.5, {a});
  const auto r = sim::run_events(t.p, t.d);
  CHECK(r.events[b].end.v == 0.5);
  CHECK(r.phases.step.v == 0.5);
  t.d.pop_back();
  CHECK_THROWS_AS(sim::run_events(t.p, t.d), std::invalid_argument);
}

TEST_CASE("critical path: the chain back from the last event through whichever predecessor ended last") {
  Tiny t;
  const auto a = t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 1.0);            // 0 - 1
  const auto g = t.add(EventKind::collective, Stream::allgather, Phase::forward, 0, 2.0);       // 0 - 2
  const auto b = t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 1.0, {g});       // 2 - 3
  const auto c = t.add(EventKind::collective, Stream::reduction, Phase::backward, 0, 3.0, {b}); // 3 - 6
  const auto d = t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 1.0);           // 3 - 4
  const auto e = t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 0.5, {c});      // 6 - 6.5
  const auto r = sim::run_events(t.p, t.d);
  REQUIRE(r.events[e].end.v == 6.5);
  // e waited for c (ended 6) rather than d (4); b for g (2) rather than a (1).
  CHECK(r.critical_path.events() == std::vector<zero::EventId>{g, b, c, e});
  (void)a;
  (void)d;

  const auto path = sim::critical_path_events(t.p, r);
  REQUIRE(path.size() == 4);
  CHECK(path[0].stream == Stream::allgather);
  CHECK(path[0].communication());
  CHECK(path[1].kind == EventKind::compute);
  CHECK_FALSE(path[1].communication());
  CHECK(path[2].stream == Stream::reduction);
  CHECK(path[3].start.v == 6.0);
  CHECK(path[3].end.v == 6.5);
  CHECK(t.p.event_name(path[3].id) == "ms0/bwd/e5");

  // Its length is the iteration less the idle gaps between its events (none here: each
  // starts when the one before it ends).
  double busy = 0, idle = path.front().start.v;
  for (std::size_t i = 0; i < path.size(); ++i) {
    busy += path[i].duration().v;
    if (i > 0) idle += path[i].start.v - path[i - 1].end.v;
  }
  CHECK(idle == 0.0);
  CHECK(busy == zp::test::approx(r.phases.iteration.v - idle));

  const auto top = sim::longest_events(path, 2);
  REQUIRE(top.size() == 2);
  CHECK(top[0].id == c);
  CHECK(top[1].id == g);
}

TEST_CASE("critical path: equal end times go to the higher event id; the chain is deterministic") {
  {
    Tiny t;  // the dependency has the higher id
    const auto x = t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 1.0);
    const auto y = t.add(EventKind::collective, Stream::reduction, Phase::forward, 0, 1.0);
    const auto z = t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 1.0, {y});
    const auto r = sim::run_events(t.p, t.d);
    CHECK(r.critical_path.events() == std::vector<zero::EventId>{y, z});
    (void)x;
  }
  {
    Tiny t;  // the stream predecessor has the higher id
    const auto y = t.add(EventKind::collective, Stream::reduction, Phase::forward, 0, 1.0);
    const auto x = t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 1.0);
    const auto z = t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 1.0, {y});
    const auto r = sim::run_events(t.p, t.d);
    CHECK(r.critical_path.events() == std::vector<zero::EventId>{x, z});
  }
  {
    Tiny t;  // two streams ending together: the path ends at the higher id
    t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 2.0);
    const auto q = t.add(EventKind::collective, Stream::reduction, Phase::forward, 0, 2.0);
    const auto r = sim::run_events(t.p, t.d);
    CHECK(r.critical_path.events() == std::vector<zero::EventId>{q});
  }
  Tiny t;
  for (int i = 0; i < 60; ++i) {
    const auto s = static_cast<zero::EventId>(t.p.events.size());
    t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 0.001 * (i % 3));
    t.add(EventKind::collective, i % 2 ? Stream::reduction : Stream::allgather, Phase::forward, 0, 0.001 * (i % 4), {s});
    t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 0.0005, {static_cast<zero::EventId>(s + 1)});
  }
  sim::EngineOptions o;
  o.interference = 0.5;
  const auto r1 = sim::run_events(t.p, t.d, o);
  const auto r2 = sim::run_events(t.p, t.d, o);
  CHECK(r1.critical_path == r2.critical_path);
  REQUIRE_FALSE(r1.critical_path.empty());
  // A chain: each event starts when the one before it on the path ends, which is its
  // stream predecessor or one of its dependencies.
  const auto path1 = r1.critical_path.events();
  for (std::size_t i = 1; i < path1.size(); ++i) {
    const auto prev = path1[i - 1], cur = path1[i];
    CHECK(prev < cur);
    CHECK(r1.events[cur].start.v == r1.events[prev].end.v);
    const auto& ev = t.p.events[cur];
    const auto deps = t.p.deps(ev);
    bool linked = std::find(deps.begin(), deps.end(), prev) != deps.end();
    if (!linked && t.p.events[prev].stream == ev.stream) {
      linked = true;
      for (auto k = prev + 1; k < cur; ++k)
        if (t.p.events[k].stream == ev.stream) linked = false;
    }
    CHECK(linked);
  }
  CHECK(r1.events[static_cast<std::size_t>(r1.critical_path.back())].end.v == zp::test::approx(r1.phases.iteration.v));
}

TEST_CASE("a dependency on a later event: waits for it on another stream, never ends on the same") {
  for (bool two_streams : {false, true}) {
    Tiny t;
    t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 1.0, {1});
    t.add(EventKind::compute, two_streams ? Stream::reduction : Stream::compute, Phase::forward, 0, 1.0);
    if (two_streams) {
      const auto r = sim::run_events(t.p, t.d);
      CHECK(r.events[0].start.v == 1.0);
      CHECK(r.critical_path.events() == std::vector<zero::EventId>{1, 0});
    } else {
      CHECK_THROWS_AS(sim::run_events(t.p, t.d), std::logic_error);
    }
  }
}

TEST_CASE("Chrome trace: Trace Event Format, one track per stream, counters per category; golden file") {
  Tiny t;
  const auto a = t.add(EventKind::compute, Stream::compute, Phase::forward, 0, 0.001, {}, "fwd");
  t.add(EventKind::collective, Stream::reduction, Phase::backward, 0, 0.002, {a}, "ar");
  const auto c = t.add(EventKind::compute, Stream::compute, Phase::backward, 0, 0.001, {}, "bwd");
  t.alloc_free(a, c, 4096, zero::Category::activations);
  const auto r = sim::run_events(t.p, t.d);
  const auto doc = sim::chrome_trace(t.p, r);
  REQUIRE(doc.contains("traceEvents"));
  std::set<int> tids;
  int slices = 0, counters = 0, meta = 0;
  for (const auto& e : doc["traceEvents"]) {
    const std::string ph = e["ph"];
    CHECK(e.contains("pid"));
    CHECK(e.contains("name"));
    if (ph == "X") {
      ++slices;
      tids.insert(e["tid"].get<int>());
      CHECK(e["ts"].is_number());
      CHECK(e["dur"].get<double>() >= 0);
    } else if (ph == "C") {
      ++counters;
      CHECK(e["args"].contains("activations"));
    } else {
      CHECK(ph == "M");
      ++meta;
    }
  }
  CHECK(slices == 3);
  CHECK(tids.size() == 2);
  CHECK(counters == 2);
  CHECK(meta == 1 + zero::kNumStreams);
  // Golden: the exact document (regenerate with ZEROPLAN_UPDATE_GOLDEN=1).
  const std::string golden = std::string(ZEROPLAN_DATA_DIR) + "/tests/data/trace_golden.json";
  if (std::getenv("ZEROPLAN_UPDATE_GOLDEN")) std::ofstream(golden) << doc.dump(1) << "\n";
  std::ifstream in(golden);
  REQUIRE(in.good());
  const auto expected = nlohmann::json::parse(in);
  CHECK(expected == doc);
}

#include "cli/simulate.hpp"

namespace {
cli::StageResult simulate_config(const std::string& model, const nlohmann::json& ds, int gpus, const std::string& gpu,
                                 std::int64_t seq) {
  const auto path = std::filesystem::temp_directory_path() / ("zeroplan-engine-" + std::to_string(std::hash<std::string>{}(ds.dump())) + ".json");
  std::ofstream(path) << ds.dump();
  cli::SimRequest r;
  r.model = model;
  r.ds_config = path.string();
  r.gpus = gpus;
  r.gpu = gpu;
  r.seq_len = seq;
  const auto in = cli::load_inputs(r);
  return cli::simulate_one(in, cli::config_for_stage(in, r, in.cfg.zero.stage));
}
}  // namespace

// On real programs (every stage, overlap on and off, 3 micro-steps and 8, which the program
// stores once and the engine takes its periodic path for): the phases add up to at most the
// iteration, exposed time to at most the time; and phases_of_timeline (the phases of measured
// event times by the engine's definitions, what an executor's run is laid beside a
// prediction with) gives the engine's phases back from its own event times, and with the host
// events untimed (an executor does not run them) the phases of what remains.
TEST_CASE("on real programs: phases add up; the engine's event times give its phases back through phases_of_timeline") {
  for (int gas : {3, 8}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (bool overlap : {false, true}) {
        nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", gas},
                             {"bf16", {{"enabled", true}}},
                             {"zero_optimization", {{"stage", stage}, {"overlap_comm", overlap}, {"reduce_bucket_size", 2000000}}}};
        const auto r = simulate_config("gpt2", ds, 8, "A100-80GB", 256);
        CAPTURE(gas);
        CAPTURE(stage);
        CAPTURE(overlap);
        const auto& want = r.time.report.phases;
        CHECK(want.forward.v + want.backward.v + want.step.v <= want.iteration.v * (1 + 1e-9));
        CHECK(want.backward_allreduce.v <= want.backward.v);
        // The iteration without the phases' synchronisations: shorter only where the ZeRO step of
        // stages 1/2 waits for nothing of the backward (no overlap_comm); the same elsewhere.
        if ((stage == 1 || stage == 2) && !overlap)
          CHECK(r.time.iteration < want.iteration);
        else
          CHECK(r.time.iteration == want.iteration);
        for (int k = 0; k < zero::kNumCollKinds; ++k)
          CHECK(r.time.report.comm.exposed[static_cast<std::size_t>(k)].v <=
                r.time.report.comm.time[static_cast<std::size_t>(k)].v * (1 + 1e-9));
        if (gas == 8) CHECK(r.program.repeat.copies > 0);
        const zero::Program full = zero::expand(r.program);
        const sim::TimeReport t = sim::expand_times(r.program, r.time.report);
        REQUIRE(t.events.size() == full.events.size());
        std::vector<double> start(full.events.size()), end(full.events.size());
        for (std::size_t e = 0; e < full.events.size(); ++e) {
          start[e] = t.events[e].start.v;
          end[e] = t.events[e].end.v;
        }
        const auto ph = sim::phases_of_timeline(full, start, end);
        const double ns = 1e-9 * 4;  // each time went through whole nanoseconds once more
        CHECK(std::abs(ph.forward.v - want.forward.v) <= ns);
        CHECK(std::abs(ph.backward.v - want.backward.v) <= ns);
        CHECK(std::abs(ph.backward_allreduce.v - want.backward_allreduce.v) <= ns);
        CHECK(std::abs(ph.step.v - want.step.v) <= ns);
        CHECK(std::abs(ph.iteration.v - want.iteration.v) <= ns);
        for (std::size_t e = 0; e < full.events.size(); ++e)
          if (full.events[e].kind == EventKind::host) start[e] = end[e] = std::nan("");
        const auto no_host = sim::phases_of_timeline(full, start, end);
        CHECK(no_host.iteration.v <= want.iteration.v + ns);
        CHECK(no_host.forward.v + no_host.backward.v + no_host.step.v <= no_host.iteration.v + 3 * ns);
      }
    }
  }
  zero::Program repeated;  // a program that stores a micro-step once is refused
  repeated.repeat.copies = 2;
  CHECK_THROWS_AS(sim::phases_of_timeline(repeated, {}, {}), std::invalid_argument);
}

TEST_CASE("stage-3 gathers do not run ahead of the compute issued before them") {
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2}, {"bf16", {{"enabled", true}}},
                       {"zero_optimization", {{"stage", 3}, {"stage3_max_reuse_distance", 0}, {"stage3_param_persistence_threshold", 0}, {"stage3_prefetch_bucket_size", 1000000}}}};
  const auto r = simulate_config("gpt2", ds, 8, "A100-80GB", 256);
  const auto& p = r.program;
  zero::EventId last_compute = -1;
  int gathers = 0;
  for (const auto& e : p.events) {
    if (e.kind == EventKind::compute) last_compute = e.id;
    if (e.kind == EventKind::collective && e.coll == zero::CollKind::all_gather && last_compute >= 0) {
      ++gathers;
      CHECK(r.time.report.events[static_cast<std::size_t>(e.id)].start.v >=
            r.time.report.events[static_cast<std::size_t>(last_compute)].end.v);
    }
  }
  CHECK(gathers > 10);
}

TEST_CASE("on real programs: the critical path spans the iteration; --json lists it event by event") {
  for (int stage : {1, 3}) {
    nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", 2},
                         {"bf16", {{"enabled", true}}},
                         {"zero_optimization", {{"stage", stage}, {"overlap_comm", true}, {"reduce_bucket_size", 2000000}}}};
    const auto r = simulate_config("gpt2", ds, 8, "A100-80GB", 256);
    CAPTURE(stage);
    const auto& t = r.time.report;
    const auto path = sim::critical_path_events(r.program, t);
    REQUIRE(path.size() > 10);
    double busy = 0, idle = path.front().start.v;
    for (std::size_t i = 0; i < path.size(); ++i) {
      busy += path[i].duration().v;
      if (i > 0) idle += path[i].start.v - path[i - 1].end.v;
    }
    CHECK(idle >= 0);
    CHECK(busy == zp::test::approx(t.phases.iteration.v - idle).epsilon(1e-9));
    CHECK(path.back().end.v == zp::test::approx(t.phases.iteration.v));
    CHECK_FALSE(cli::result_json(r)["critical_path"].contains("events"));  // opt-in
    CHECK(cli::result_json(r)["critical_path"]["longest"].size() == 10);
    const auto j = cli::result_json(r, true)["critical_path"];
    REQUIRE(j["events"].size() == path.size());
    CHECK(j["num_events"] == path.size());
    const auto& last = j["events"].back();
    CHECK(last["name"] == r.program.event_name(path.back().id));
    CHECK(last["stream"] == zero::stream_name(path.back().stream));
    CHECK(last["end_ms"].get<double>() == zp::test::approx(t.phases.iteration.ms()));
    CHECK(last["communication"].is_boolean());
    double compute_ms = 0;
    for (const auto& e : j["events"])
      if (e["kind"] == "compute") compute_ms += e["end_ms"].get<double>() - e["start_ms"].get<double>();
    CHECK(compute_ms == zp::test::approx(j["compute_ms"].get<double>()));
  }
}

namespace {
// The critical path by its definition, from the run's times alone.
std::vector<zero::EventId> reference_path(const zero::Program& p, const sim::TimeReport& t) {
  const auto n = static_cast<zero::EventId>(p.events.size());
  zero::EventId last = -1;
  for (zero::EventId e = p.step_begin; e < n; ++e)
    if (last < 0 || t.events[e].end.v >= t.events[last].end.v) last = e;
  std::vector<zero::EventId> path;
  for (zero::EventId e = last; e >= 0;) {
    path.insert(path.begin(), e);
    zero::EventId next = -1;
    for (zero::EventId q = e - 1; q >= p.step_begin; --q)
      if (p.events[q].stream == p.events[e].stream) {
        next = q;
        break;
      }
    for (zero::EventId d : p.deps(p.events[e])) {
      if (d < p.step_begin) continue;
      if (next < 0 || t.events[d].end.v > t.events[next].end.v ||
          (t.events[d].end.v == t.events[next].end.v && d > next))
        next = d;
    }
    e = next;
  }
  return path;
}
}  // namespace

TEST_CASE("on real programs, one stream or several, the critical path is the one its definition gives") {
  for (int stage : {0, 2, 3}) {
    for (bool overlap : {false, true}) {
      nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", 2},
                           {"bf16", {{"enabled", true}}},
                           {"zero_optimization", {{"stage", stage}, {"overlap_comm", overlap}, {"reduce_bucket_size", 2000000}}}};
      const auto r = simulate_config("gpt2", ds, 4, "A100-80GB", 128);
      CAPTURE(stage);
      CAPTURE(overlap);
      CHECK(r.time.report.critical_path.events() == reference_path(r.program, r.time.report));
    }
  }
}

TEST_CASE("fp32 models run GEMMs without tensor cores: far slower than bf16, MFU against the fp32 peak") {
  nlohmann::json fp32 = {{"train_micro_batch_size_per_gpu", 4}, {"zero_optimization", {{"stage", 1}}}};
  nlohmann::json bf16 = fp32;
  bf16["bf16"] = {{"enabled", true}};
  const auto a = simulate_config("gpt2", fp32, 1, "A100-80GB", 512);
  const auto b = simulate_config("gpt2", bf16, 1, "A100-80GB", 512);
  // The device's work on the model's ops (the host's dispatch is the same for both and bounds
  // bf16's step, and bf16's step adds DeepSpeed's overflow check).
  auto ops = [](const auto& r) {
    std::int64_t ns = 0;
    for (std::size_t i = 0; i < r.program.events.size(); ++i)
      if (r.program.events[i].kind == zp::zero::EventKind::compute)
        ns += r.time.report.total_duration_ns(static_cast<zp::zero::EventId>(i));
    return static_cast<double>(ns);
  };
  CHECK(ops(a) > 4 * ops(b));
  CHECK(a.time.tflops < 19.5);  // A100 fp32 peak
  CHECK(a.time.mfu <= 1.0);
}

#include "cli/explain.hpp"
#include "sim/predict.hpp"

namespace {
// `r` (simulate's result: a repeated micro-step stored once) as it would be with the program
// lowered one by one: the same inputs, every event stored.
cli::StageResult one_by_one(const cli::StageResult& r, const std::string& model, int gpus, const std::string& gpu,
                            std::int64_t seq, const zero::DsConfig& cfg) {
  cli::SimRequest req;
  req.model = model;
  req.gpus = gpus;
  req.gpu = gpu;
  req.seq_len = seq;
  const auto in = cli::load_inputs(req);
  models::GraphOptions go;
  go.micro_batch = r.batch.micro_batch;
  go.seq_len = seq;
  go.act_dtype = cfg.model_dtype();
  const auto g = models::build_graph(models::load_model(model), go);
  sim::Target t = cli::target(in);
  t.rank = r.rank;
  zero::LowerOptions lo = sim::lower_options(g, cfg, t);
  lo.replicate_micro_steps = false;
  cli::StageResult f = r;
  f.program = zero::lower(g, cfg, r.batch, lo);
  f.memory = sim::replay_memory(f.program, *in.device);
  const sim::ComputeModel cm(in.profile, g);
  sim::EngineOptions eo;
  eo.interference = in.profile.comm_compute_interference;
  f.time = sim::simulate_time(f.program, g, cm, *in.collectives, eo);
  return f;
}
}  // namespace

TEST_CASE("GAS 200, repeated micro-steps stored once: the same --json as every micro-step, a bounded trace") {
  for (int stage : {1, 2, 3}) {
    nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", 200},
                         {"bf16", {{"enabled", true}}},
                         {"zero_optimization", {{"stage", stage}, {"overlap_comm", true}, {"reduce_bucket_size", 20000}}}};
    const auto r = simulate_config("tiny-gpt2", ds, 4, "A100-80GB", 32);
    CAPTURE(stage);
    REQUIRE(r.program.repeat.copies > 190);
    const auto f = one_by_one(r, "tiny-gpt2", 4, "A100-80GB", 32, zero::parse_ds_config("t.json", ds));
    REQUIRE(f.program.repeat.copies == 0);
    // The whole report, field for field: memory, time, communication, the critical path.
    CHECK(cli::result_json(r) == cli::result_json(f));
    CHECK(cli::result_json(r)["events"] == f.program.events.size());
    // --critical-path: a stretch crossed the same way in many micro-steps is listed once
    // with its count; expanded, the listing is the path event by event.
    const auto full_list = cli::result_json(f, true)["critical_path"]["events"];
    const auto list = cli::result_json(r, true)["critical_path"]["events"];
    CHECK(list.size() < full_list.size() / 10);
    std::size_t at = 0;
    std::int64_t listed = 0;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i].contains("repeats")) {
        listed += list[i]["repeats"].get<std::int64_t>() * list[i]["events_each"].get<std::int64_t>();
        at += static_cast<std::size_t>(list[i]["repeats"].get<std::int64_t>() * list[i]["events_each"].get<std::int64_t>());
        continue;
      }
      ++listed;
      CHECK(list[i] == full_list[at]);
      ++at;
    }
    CHECK(listed == static_cast<std::int64_t>(full_list.size()));
    // The trace: 16 copies event by event (each slice as in the full trace), the rest one
    // slice per stream; its size does not grow with GAS.
    const auto trace = sim::chrome_trace(r.program, r.time.report);
    const auto full_trace = sim::chrome_trace(f.program, f.time.report);
    CHECK(trace["otherData"]["repeated_micro_steps"]["shown_event_by_event"] == 16);
    CHECK(trace["otherData"]["repeated_micro_steps"]["shown_as_one_slice_per_stream"] == r.program.repeat.copies - 16);
    std::set<std::string> full_slices;
    for (const auto& e : full_trace["traceEvents"])
      if (e["ph"] == "X") full_slices.insert(e.dump());
    int repeated = 0, shown = 0;
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] != "X") continue;
      if (e["cat"] == "repeated") {
        ++repeated;
        CHECK(e["args"]["micro_steps"] == r.program.repeat.copies - 16);
        continue;
      }
      ++shown;
      CHECK(full_slices.count(e.dump()) == 1);
    }
    CHECK(repeated >= (stage == 1 ? 1 : 2));  // compute, and (stages 2, 3) the stream the reductions overlap on
    CHECK(shown < static_cast<int>(full_slices.size()) / 5);  // about 20 of 200 micro-steps
  }
}

TEST_CASE("explain at GAS 1000: the collectives of every micro-step, counted as GAS 8 counts them") {
  auto counts = [](std::int64_t gas) {
    const auto path = std::filesystem::temp_directory_path() / ("zeroplan-explain-gas" + std::to_string(gas) + ".json");
    std::ofstream(path) << nlohmann::json{{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", gas},
                                          {"bf16", {{"enabled", true}}},
                                          {"zero_optimization", {{"reduce_bucket_size", 20000}}}}.dump();
    cli::ExplainRequest req;
    req.base.model = "tiny-gpt2";
    req.base.gpus = 4;
    req.base.gpu = "A100-80GB";
    req.base.seq_len = 32;
    req.base.ds_config = path.string();
    req.stage_a = 1;
    req.stage_b = 2;
    req.suggest = false;
    const auto e = cli::explain(req);
    CHECK(e.text.find("every micro-step") != std::string::npos);
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> m;  // collective/trigger -> (stage 1, stage 2) count
    for (const auto& c : e.json_time["collectives"])
      m[c["collective"].get<std::string>() + "/" + c["trigger"].get<std::string>()] = {c["a_count"], c["b_count"]};
    return m;
  };
  const auto g8 = counts(8), g1000 = counts(1000);
  REQUIRE(g8.size() == g1000.size());
  for (const auto& [k, v] : g8) {
    CAPTURE(k);
    const auto w = g1000.at(k);
    if (k.rfind("all_reduce/bucket_full", 0) == 0 || k.rfind("all_reduce/end_of_backward", 0) == 0) {
      // stage 2 reduces in every micro-step: 125 times as many at GAS 1000
      CHECK(w.second == v.second * 125);
    } else {
      CHECK(w == v);  // once per step
    }
  }
}
