// `zeroplan report`: the series behind its plots (sim/series) agree with the simulator's
// own figures, the page has every view with the numbers of the --json outputs, and bad
// input (a measurement of another run, an output that cannot be written) is refused with
// one line, exit status 2 and no file.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/simulate.hpp"
#include "sim/series.hpp"
#include "test_util.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Run = zp::test::ShellRun;

Run sh(const std::string& cmd, bool merge_stderr = true) { return zp::test::run_shell(cmd, merge_stderr); }
std::string bin() { return std::string(ZEROPLAN_BIN) + " "; }

fs::path dir() {
  const auto p = fs::temp_directory_path() / ("zeroplan-test-report-" + std::to_string(getpid()));
  fs::create_directories(p);
  return p;
}
struct RemoveDir {
  ~RemoveDir() {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("zeroplan-test-report-" + std::to_string(getpid())), ec);
  }
} remove_dir;

std::string path(const std::string& name) { return (dir() / name).string(); }
std::string file(const std::string& name, const std::string& text) {
  std::ofstream(path(name)) << text;
  return path(name);
}
std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Stage 2 with several buckets and overlap_comm (reductions on their own stream), GAS 2.
const std::string kConfig = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
  "zero_optimization": {"stage": 2, "reduce_bucket_size": 5000, "overlap_comm": true}})";
const std::string kInputs = "--model tiny-gpt2 --gpus 2 --gpu H200 --seq-len 16";

// ---- reading the page back

// The inner HTML of <section data-view="id">.
std::string section(const std::string& page, const std::string& id) {
  const auto at = page.find("data-view=\"" + id + "\"");
  if (at == std::string::npos) return "";
  return page.substr(at, page.find("</section>", at) - at);
}

// A table's rows: data-row → the data-v values of its cells, in order.
std::map<std::string, std::vector<std::string>> table(const std::string& page, const std::string& id) {
  std::map<std::string, std::vector<std::string>> out;
  const auto at = page.find("data-table=\"" + id + "\"");
  if (at == std::string::npos) return out;
  const std::string t = page.substr(at, page.find("</table>", at) - at);
  static const std::regex row("<tr data-row=\"([^\"]*)\">(.*?)</tr>");
  static const std::regex cell("data-v=\"([^\"]*)\"");
  for (std::sregex_iterator it(t.begin(), t.end(), row), end; it != end; ++it) {
    const std::string cells = (*it)[2];
    auto& v = out[(*it)[1]];
    for (std::sregex_iterator c(cells.begin(), cells.end(), cell); c != end; ++c) v.push_back((*c)[1]);
  }
  return out;
}

std::int64_t as_int(const std::string& s) { return std::stoll(s); }
double as_double(const std::string& s) { return std::stod(s); }

// The page is self-contained: no scripts that run, nothing fetched.
void check_offline(const std::string& page) {
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(page.find("</html>") != std::string::npos);
  CHECK(page.find("<link") == std::string::npos);
  CHECK(page.find(" src=") == std::string::npos);
  CHECK(page.find("@import") == std::string::npos);
  CHECK(page.find("url(http") == std::string::npos);
  CHECK(page.find("href=\"http") == std::string::npos);
  // The one script element holds data (application/json), which browsers do not run.
  const auto first = page.find("<script");
  if (first != std::string::npos) {
    const std::string data_block = "<script type=\"application/json\" id=\"zeroplan-data\"";
    CHECK(page.compare(first, data_block.size(), data_block) == 0);
    CHECK(page.find("<script", first + 1) == std::string::npos);
  }
  // Every xmlns is SVG's namespace name, not a fetch.
  std::size_t n = 0;
  for (auto p = page.find("http"); p != std::string::npos; p = page.find("http", p + 1), ++n)
    CHECK(page.compare(p, 26, "http://www.w3.org/2000/svg") == 0);
  CHECK(n > 0);
}

// Exit status 2, one line naming what is wrong, and no file at `out` nor temporaries beside it.
void refused(const std::string& args, const std::string& out, const std::string& must_contain) {
  CAPTURE(args);
  const std::size_t before = std::distance(fs::directory_iterator(dir()), fs::directory_iterator());
  const Run r = sh(bin() + "report " + args);
  CAPTURE(r.out);
  CHECK(r.status == 2);
  CHECK(r.out.find(must_contain) != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK(!fs::exists(out));
  CHECK(std::distance(fs::directory_iterator(dir()), fs::directory_iterator()) == static_cast<std::ptrdiff_t>(before));
}

zp::cli::StageResult simulate_config(const std::string& config, int stage) {
  zp::cli::SimRequest req;
  req.model = "tiny-gpt2";
  req.ds_config = file("series.json", config);
  req.gpus = 2;
  req.gpu = "H200";
  req.seq_len = 16;
  req.stages = {stage};
  const auto in = zp::cli::load_inputs(req);
  return zp::cli::simulate_one(in, zp::cli::config_for_stage(in, req, stage));
}

}  // namespace

TEST_CASE("memory_series: the highest sample is the replay's peak, every step event covered once") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const auto r = simulate_config(kConfig, stage);
    const auto& p = r.program;
    const auto step_events = static_cast<std::int64_t>(p.events.size()) - p.step_begin;
    REQUIRE(step_events > 100);
    for (std::size_t max : {std::size_t{1}, std::size_t{7}, std::size_t{100}, static_cast<std::size_t>(step_events) + 5}) {
      CAPTURE(max);
      const auto s = zp::sim::memory_series(p, max);
      CHECK(s.step_events == step_events);
      CHECK(s.samples.size() == std::min<std::size_t>(max, static_cast<std::size_t>(step_events)));
      CHECK(s.aggregated == (max < static_cast<std::size_t>(step_events)));
      CHECK(s.persistent == r.memory.persistent);
      CHECK(s.samples.front().first == p.step_begin);
      CHECK(s.samples.back().last == static_cast<zp::zero::EventId>(p.events.size()) - 1);
      for (std::size_t i = 1; i < s.samples.size(); ++i) CHECK(s.samples[i].first == s.samples[i - 1].last + 1);
      const auto& pk = s.samples[s.peak_sample];
      CHECK(pk.total == r.memory.peak_allocated);
      CHECK(pk.at == r.memory.peak_event);
      CHECK(pk.bytes == r.memory.at_peak);
    }
  }
}

TEST_CASE("exposed_intervals: summed by kind, the simulator's exposed communication") {
  const std::string no_overlap = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5000, "overlap_comm": false}})";
  const std::string stage3 = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5000, "stage3_prefetch_bucket_size": 20000,
                          "stage3_param_persistence_threshold": 0}})";
  int with_gaps = 0;
  for (const auto& [config, stage] : {std::pair{kConfig, 2}, std::pair{no_overlap, 2}, std::pair{stage3, 3}, std::pair{kConfig, 1}}) {
    CAPTURE(config);
    const auto r = simulate_config(config, stage);
    const auto& t = r.time.report;
    const auto iv = zp::sim::exposed_intervals(r.program, t);
    std::array<double, zp::zero::kNumCollKinds> sum{};
    for (const auto& x : iv) {
      CHECK(x.end > x.start);
      CHECK(r.program.events[static_cast<std::size_t>(x.collective)].kind == zp::zero::EventKind::collective);
      sum[static_cast<std::size_t>(x.kind)] += (x.end - x.start).v;
      if (r.program.events[static_cast<std::size_t>(x.collective)].stream != zp::zero::Stream::compute) ++with_gaps;
    }
    double total = 0;
    for (int k = 0; k < zp::zero::kNumCollKinds; ++k) {
      CAPTURE(k);
      CHECK(sum[static_cast<std::size_t>(k)] == zp::test::approx(t.comm.exposed[static_cast<std::size_t>(k)].v).epsilon(1e-9));  // sums in another order
      total += t.comm.exposed[static_cast<std::size_t>(k)].v;
    }
    CHECK(total > 0);
  }
  CHECK(with_gaps > 0);  // some waits are on collectives of other streams, not only blocking ones
}

TEST_CASE("series at GAS 8: repeated micro-steps expanded, every event drawn, the simulator's numbers") {
  const std::string gas8 = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5000, "overlap_comm": true}})";
  const auto r = simulate_config(gas8, 2);
  REQUIRE(r.program.repeat.copies > 0);  // simulate stores the repeated micro-steps once
  CHECK_THROWS_AS(zp::sim::memory_series(r.program, 100), std::invalid_argument);
  CHECK_THROWS_AS(zp::sim::exposed_intervals(r.program, r.time.report), std::invalid_argument);
  const auto p = zp::zero::expand(r.program);
  const auto t = zp::sim::expand_times(r.program, r.time.report);
  REQUIRE(t.events.size() == p.events.size());
  const auto s = zp::sim::memory_series(p, 100);
  CHECK(s.step_events == r.program.num_events() - r.program.step_begin);
  const auto& pk = s.samples[s.peak_sample];
  CHECK(pk.total == r.memory.peak_allocated);
  CHECK(pk.at == r.memory.peak_event);
  std::array<double, zp::zero::kNumCollKinds> sum{};
  for (const auto& x : zp::sim::exposed_intervals(p, t)) sum[static_cast<std::size_t>(x.kind)] += (x.end - x.start).v;
  for (int k = 0; k < zp::zero::kNumCollKinds; ++k)
    CHECK(sum[static_cast<std::size_t>(k)] == zp::test::approx(t.comm.exposed[static_cast<std::size_t>(k)].v).epsilon(1e-9));  // sums in another order
}

TEST_CASE("report from the inputs: every view, the numbers of simulate --json, offline") {
  const std::string ds = file("ds.json", kConfig);
  const std::string out = path("page.html");
  const Run r = sh(bin() + "report " + kInputs + " --ds-config " + ds + " --stages 0,1,2,3 --stage 1 --vs-stage 2 --out " + out);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("report written to " + out) != std::string::npos);
  const Run j = sh(bin() + "simulate " + kInputs + " --ds-config " + ds + " --stages 0,1,2,3 --json", false);
  REQUIRE(j.status == 0);
  const json sim = json::parse(j.out);
  const std::string page = slurp(out);
  check_offline(page);
  for (const char* v : {"memory-per-stage", "memory-over-step", "step-timeline"}) {
    CAPTURE(v);
    const std::string s = section(page, v);
    CHECK(s.find("<svg") != std::string::npos);
    CHECK(s.find("<table") != std::string::npos);
    CHECK(s.find("class=\"note missing\"") == std::string::npos);
  }
  CHECK(section(page, "plan-candidates").empty());
  CHECK(section(page, "measured-vs-predicted").empty());
  // The embedded document is simulate --json's.
  const auto at = page.find("id=\"zeroplan-data\"");
  REQUIRE(at != std::string::npos);
  const auto open = page.find('>', at) + 1;
  CHECK(json::parse(page.substr(open, page.find("</script>", open) - open)) == sim);

  // View 1: every category and total of every stage, to the byte.
  const auto mem = table(page, "memory-per-stage");
  const auto& results = sim["results"];
  REQUIRE(results.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    const auto& m = results[i]["memory"];
    for (auto it = m["by_category"].begin(); it != m["by_category"].end(); ++it) {
      CAPTURE(it.key());
      REQUIRE(mem.at(it.key()).size() == 4);
      CHECK(as_int(mem.at(it.key())[i]) == it.value().get<std::int64_t>());
    }
    for (const char* k : {"peak_allocated_bytes", "reserved_bytes", "context_bytes", "device_used_bytes", "host_bytes"})
      CHECK(as_int(mem.at(k)[i]) == m[k].get<std::int64_t>());
  }
  // View 2: stage 1 and stage 2 side by side, each peak the prediction's.
  const auto over = table(page, "memory-over-step");
  REQUIRE(over.at("peak").size() == 2);
  CHECK(as_int(over.at("peak")[0]) == results[1]["memory"]["peak_allocated_bytes"].get<std::int64_t>());
  CHECK(as_int(over.at("peak")[1]) == results[2]["memory"]["peak_allocated_bytes"].get<std::int64_t>());
  CHECK(over.count("ms0") == 1);
  CHECK(over.count("ms1") == 1);
  CHECK(over.count("step") == 1);
  const std::string s2 = section(page, "memory-over-step");
  CHECK(s2.find("peak " ) != std::string::npos);
  CHECK(s2.find(results[1]["memory"]["peak_event"].get<std::string>()) != std::string::npos);
  // View 3: phase times and collectives of both, exposed time drawn = predicted.
  const auto tt = table(page, "step-time");
  for (const char* k : {"forward_ms", "backward_ms", "backward_allreduce_ms", "step_ms", "synchronised_iteration_ms",
                        "iteration_ms", "samples_per_s"}) {
    CAPTURE(k);
    CHECK(as_double(tt.at(k)[0]) == results[1]["time"][k].get<double>());
    CHECK(as_double(tt.at(k)[1]) == results[2]["time"][k].get<double>());
  }
  const auto coll = table(page, "collectives");
  int rows = 0;
  for (int c = 0; c < 2; ++c)
    for (auto it = results[c + 1]["comm"]["by_kind"].begin(); it != results[c + 1]["comm"]["by_kind"].end(); ++it, ++rows) {
      const auto& v = coll.at(std::to_string(c) + ":" + it.key());
      CAPTURE(it.key());
      REQUIRE(v.size() == 5);
      CHECK(as_int(v[0]) == it.value()["count"].get<std::int64_t>());
      CHECK(as_int(v[1]) == it.value()["bytes"].get<std::int64_t>());
      CHECK(as_double(v[2]) == it.value()["time_ms"].get<double>());
      CHECK(as_double(v[3]) == it.value()["exposed_ms"].get<double>());
      CHECK(as_double(v[4]) == zp::test::approx(it.value()["exposed_ms"].get<double>()).epsilon(1e-9));
    }
  CHECK(rows >= 4);
  const std::string s3 = section(page, "step-timeline");
  for (const char* lane : {"compute stream", "reduction stream", "exposed comm", "all_reduce", "time (ms)"}) CHECK(s3.find(lane) != std::string::npos);
  // Units on every plot.
  CHECK(section(page, "memory-per-stage").find("(GiB)") != std::string::npos);
  CHECK(s2.find("(GiB)") != std::string::npos);
}

TEST_CASE("report: the timeline's size is bounded by its bins, not by the events") {
  const std::string ds = file("ds.json", kConfig);
  const std::string out = path("bins.html");
  const Run r = sh(bin() + "report " + kInputs + " --ds-config " + ds + " --stages 1,2 --timeline-bins 40 --out " + out);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex("timeline: (\\d+) step events drawn as (\\d+) slices")));
  // Two columns × two panels × at most 4 lanes + exposed × 40 bins.
  CHECK(std::stoll(m[2]) <= 2 * 2 * 5 * 40);
  CHECK(std::stoll(m[1]) > std::stoll(m[2]));
  CHECK(slurp(out).find("Aggregated") != std::string::npos);
}

TEST_CASE("report --plan: the ranked candidates and the winner's ds_config of plan --json") {
  const std::string args = kInputs + " --global-batch 16 --search stage,micro_batch,overlap_comm --threads 1";
  const std::string out = path("plan.html");
  const Run r = sh(bin() + "report --plan " + args + " --out " + out);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  const Run j = sh(bin() + "plan " + args + " --top 1000000 --json", false);
  REQUIRE(j.status == 0);
  const json plan = json::parse(j.out);
  const std::string page = slurp(out);
  check_offline(page);
  for (const char* v : {"memory-per-stage", "memory-over-step", "step-timeline", "plan-candidates"})
    CHECK(section(page, v).find("<svg") != std::string::npos);
  const auto ranked = table(page, "plan-ranked");
  REQUIRE(ranked.size() == plan["ranked"].size());
  for (std::size_t i = 0; i < plan["ranked"].size(); ++i) {
    const auto& row = ranked.at(std::to_string(i));
    REQUIRE(row.size() == 4);
    CHECK(as_int(row[0]) == plan["ranked"][i]["memory"]["device_used_bytes"].get<std::int64_t>());
    CHECK(as_double(row[1]) == plan["ranked"][i]["time"]["samples_per_s"].get<double>());
  }
  const std::string s4 = section(page, "plan-candidates");
  CHECK(s4.find("winner: stage " + std::to_string(plan["best"]["stage"].get<int>())) != std::string::npos);
  CHECK(s4.find("limit ") != std::string::npos);
  // The ds_config block is the winner's, unescaped.
  const auto pre = s4.find("data-ds-config>");
  REQUIRE(pre != std::string::npos);
  std::string ds = s4.substr(pre + 15, s4.find("</pre>", pre) - pre - 15);
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"&quot;", "\""}, {"&lt;", "<"}, {"&gt;", ">"}, {"&#39;", "'"}, {"&amp;", "&"}})
    for (auto p = ds.find(from); p != std::string::npos; p = ds.find(from, p + to.size())) ds.replace(p, from.size(), to);
  CHECK(json::parse(ds) == plan["best"]["ds_config"]);
}

TEST_CASE("report --measured: a run over its prediction; a run of another configuration is refused") {
  const std::string ds = file("ds.json", kConfig);
  const std::string m = path("m.json");
  const Run tr = sh(bin() + "train --model tiny-gpt2 --ds-config " + ds + " --seq-len 16 --steps 2 --quiet --out " + m);
  CAPTURE(tr.out);
  REQUIRE(tr.status == 0);
  const std::string one = "--model tiny-gpt2 --gpus 1 --gpu H200 --seq-len 16 --ds-config " + ds;
  const std::string out = path("measured.html");
  const Run r = sh(bin() + "report " + one + " --stages 1,2 --measured " + m + " --out " + out);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  const Run j = sh(bin() + "simulate " + one + " --stages 1,2 --json > " + path("p.json"), false);
  REQUIRE(j.status == 0);
  const Run c = sh(bin() + "compare --predicted " + path("p.json") + " --measured " + m + " --json", false);
  REQUIRE(c.status == 0);
  const json cmp = json::parse(c.out);
  const std::string page = slurp(out);
  check_offline(page);
  const std::string s5 = section(page, "measured-vs-predicted");
  REQUIRE(!s5.empty());
  CHECK(s5.find("<svg") != std::string::npos);
  CHECK(s5.find("Every event") != std::string::npos);
  const auto mem = table(page, "measured-memory");
  for (auto it = cmp["memory"]["by_category"].begin(); it != cmp["memory"]["by_category"].end(); ++it) {
    CAPTURE(it.key());
    CHECK(as_int(mem.at(it.key())[0]) == it.value()["predicted"].get<std::int64_t>());
    CHECK(as_int(mem.at(it.key())[1]) == it.value()["measured"].get<std::int64_t>());
  }
  CHECK(as_int(mem.at("peak_allocated")[1]) == cmp["memory"]["peak_allocated"]["measured"].get<std::int64_t>());
  const auto comm = table(page, "measured-comm");
  CHECK(as_int(comm.at("total")[1]) == cmp["comm"]["bytes_per_rank"]["measured"].get<std::int64_t>());
  const auto tm = table(page, "measured-time");
  for (const char* ph : {"forward", "backward", "step", "iteration"}) {
    CAPTURE(ph);
    CHECK(as_double(tm.at(ph)[0]) == cmp["time"]["phases"][ph]["predicted_ms"].get<double>());
    CHECK(as_double(tm.at(ph)[1]) == cmp["time"]["phases"][ph]["measured_ms"].get<double>());
  }
  // The same measurement from the prediction's --json file.
  const Run f = sh(bin() + "report --input " + path("p.json") + " --measured " + m + " --out " + path("measured2.html"));
  CAPTURE(f.out);
  REQUIRE(f.status == 0);
  const auto mem2 = table(slurp(path("measured2.html")), "measured-memory");
  CHECK(mem2 == mem);

  // Another configuration: the micro-batch, the world size, the stage differ.
  const std::string bad = path("bad.html");
  refused(one + " --micro-batch 1 --measured " + m + " --out " + bad, bad, "differ in micro_batch");
  refused("--model tiny-gpt2 --gpus 2 --gpu H200 --seq-len 16 --ds-config " + ds + " --measured " + m + " --out " + bad, bad,
          "differ in world_size");
  refused(one + " --stages 0,1 --measured " + m + " --out " + bad, bad, "differ in stage");
  refused("--input " + m + " --out " + bad, bad, "--measured");
}

TEST_CASE("report --input: the views a --json file supports, the others say what they need") {
  const std::string ds = file("ds.json", kConfig);
  REQUIRE(sh(bin() + "simulate " + kInputs + " --ds-config " + ds + " --stages 0,3 --json > " + path("s.json"), false).status == 0);
  const std::string out = path("from-file.html");
  const Run r = sh(bin() + "report --input " + path("s.json") + " --out " + out);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  const json sim = json::parse(slurp(path("s.json")));
  const std::string page = slurp(out);
  check_offline(page);
  const auto mem = table(page, "memory-per-stage");
  CHECK(as_int(mem.at("device_used_bytes")[1]) == sim["results"][1]["memory"]["device_used_bytes"].get<std::int64_t>());
  CHECK(section(page, "memory-over-step").find("needs the step program") != std::string::npos);
  CHECK(section(page, "step-timeline").find("needs the step program") != std::string::npos);

  REQUIRE(sh(bin() + "explain " + kInputs + " --ds-config " + ds + " --stage 1 --vs-stage 3 --json > " + path("e.json"), false).status == 0);
  REQUIRE(sh(bin() + "report --input " + path("e.json") + " --out " + path("e.html")).status == 0);
  const auto emem = table(slurp(path("e.html")), "memory-per-stage");
  const json ex = json::parse(slurp(path("e.json")));
  CHECK(as_int(emem.at("peak_allocated_bytes")[0]) == ex["a"]["result"]["memory"]["peak_allocated_bytes"].get<std::int64_t>());
  CHECK(as_int(emem.at("peak_allocated_bytes")[1]) == ex["b"]["result"]["memory"]["peak_allocated_bytes"].get<std::int64_t>());

  const std::string bad = path("bad.html");
  json broken = sim;
  broken["results"][0]["memory"].erase("reserved_bytes");
  refused("--input " + file("broken.json", broken.dump()) + " --out " + bad, bad, "results[0].memory.reserved_bytes: missing");
  refused("--input " + file("other.json", R"({"x": 1})") + " --out " + bad, bad, "has none of results");
  refused("--input " + path("s.json") + " --model gpt2 --out " + bad, bad, "--input");
}

TEST_CASE("report --vs-ds-config: config A against config B") {
  const std::string a = file("a.json", kConfig);
  const std::string b = file("b.json", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 1}})");
  const std::string out = path("ab.html");
  const Run r = sh(bin() + "report " + kInputs + " --ds-config " + a + " --vs-ds-config " + b + " --out " + out);
  CAPTURE(r.out);
  REQUIRE(r.status == 0);
  const Run j = sh(bin() + "explain " + kInputs + " --ds-config " + a + " --vs-ds-config " + b + " --json", false);
  REQUIRE(j.status == 0);
  const json ex = json::parse(j.out);
  const auto mem = table(slurp(out), "memory-per-stage");
  CHECK(as_int(mem.at("device_used_bytes")[0]) == ex["a"]["result"]["memory"]["device_used_bytes"].get<std::int64_t>());
  CHECK(as_int(mem.at("device_used_bytes")[1]) == ex["b"]["result"]["memory"]["device_used_bytes"].get<std::int64_t>());
}

TEST_CASE("report: an output that cannot be written is refused before any work, and nothing is left") {
  const std::string ds = file("ds.json", kConfig);
  const std::string args = kInputs + " --ds-config " + ds + " --stages 1 --out ";
  refused(args + path("no-such-dir/page.html"), path("no-such-dir/page.html"), "--out: cannot write the file");
  const std::string plain = file("plain.txt", "x");
  refused(args + plain + "/page.html", plain + "/page.html", "is not a directory");
  fs::create_directories(path("a-directory"));
  {
    const Run r = sh(bin() + "report " + args + path("a-directory"));
    CHECK(r.status == 2);
    CHECK(r.out.find("it is a directory") != std::string::npos);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
    CHECK(fs::is_directory(path("a-directory")));
  }
  // A page that exists stays whole when a later report is refused; a new one replaces it whole.
  const std::string out = file("kept.html", "old page\n");
  const Run r = sh(bin() + "report " + kInputs + " --ds-config " + ds + " --stages 1 --micro-batch 0 --out " + out);
  CHECK(r.status == 2);
  CHECK(slurp(out) == "old page\n");
  REQUIRE(sh(bin() + "report " + args + out).status == 0);
  CHECK(slurp(out).find("</html>") != std::string::npos);
  CHECK((fs::status(out).permissions() & fs::perms::others_read) != fs::perms::none);
  for (const auto& e : fs::directory_iterator(dir())) CHECK(e.path().filename().string().rfind(".kept.html.", 0) != 0);
  // Bad flags of the report itself.
  refused(kInputs + " --ds-config " + ds + " --stages 1,5 --out " + path("x.html"), path("x.html"), "--stages");
  refused("--gpus 2 --out " + path("x.html"), path("x.html"), "--model");
  refused(kInputs + " --plan --stages 1 --out " + path("x.html"), path("x.html"), "--plan");
}
