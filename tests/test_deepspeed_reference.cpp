// The simulator against DeepSpeed itself: every run recorded by tools/deepspeed_reference.py on
// an H200 (DeepSpeed 0.19.8, torch 2.11, transformers 5.17; tests/data/deepspeed/) is predicted
// with the H200 preset and its errors bounded. The table is printed (doctest -s) as
// docs/deepspeed_fidelity.md shows it.
//
// Memory is held to the targets (allocated 3%, reserved 5%) run by run. The times are pooled
// over interleaved time-only rounds (tools/deepspeed_reference.py --time-only --rounds); the
// same run's medians still differ by 1.2x (median) to 1.9x between processes on that host, which bounds what a time
// model can be held to per run. The mean over the runs is held to the 10% per phase
// (with a point of margin: the host costs were fitted to these runs, docs/time_model.md gives
// the held-out figures); each run to what the model reaches today, so that it cannot get worse
// unnoticed.
#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "calibration/predictor.hpp"
#include "cli/simulate.hpp"
#include "sim/engine.hpp"
#include "zero/program.hpp"
#include "sim/compute_model.hpp"
#include "sim/device.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kRoot = ZEROPLAN_SHARED_DIR;

json reference(const std::string& file = "h200_deepspeed_0.19.8.json") {
  std::ifstream in(kRoot + "/tests/data/deepspeed/" + file);
  REQUIRE(in.good());
  return json::parse(in);
}

// The model as zeroplan takes it: a catalogue name, or a config.json beside the data.
std::string model_of(const std::string& file) {
  if (fs::exists(kRoot + "/models/catalog/" + file)) return fs::path(file).stem().string();
  return kRoot + "/tests/data/deepspeed/" + file;
}

// zeroplan's prediction of one recorded run, as a user would ask for it: its ds_config (written
// under `dir`), model, sequence and attention, on one GPU (`one`, the H200 unless named), or for
// its rank of an H200 node of its world size.
zp::cli::StageResult predict(const json& run, const fs::path& dir, const std::string& one = "1xH200-141GB",
                             const std::string& profile = "") {
  const fs::path cfg = dir / (run.at("name").get<std::string>() + ".json");
  std::ofstream(cfg) << run.at("ds_config").dump();
  zp::cli::SimRequest req;
  req.model = model_of(run.at("model"));
  req.ds_config = cfg.string();
  const int world = run.value("world_size", 1);
  req.cluster = world == 1 ? one : "8xH200-141GB-NVSwitch";
  if (world > 1) {
    req.gpus = world;
    req.rank = run.at("rank").get<int>();
  }
  req.seq_len = run.at("seq_len").get<std::int64_t>();
  req.attention = run.at("attention");
  req.keep_output = run.value("keep_output", false);  // the caller held the model output (--keep-output)
  req.profile = profile;
  auto results = zp::cli::simulate(zp::cli::load_inputs(req), req);
  fs::remove(cfg);
  REQUIRE(results.size() == 1);
  return std::move(results[0]);
}

struct Row {
  std::string name;
  bool has_memory = true;
  double alloc = 0, reserved = 0, fwd = 0, bwd = 0, step = 0, iter = 0;  // relative errors
};

// The GPU's busy time per phase of a prediction (forward; backward with its reductions and
// recomputation; the step with what follows it): the union of the device streams' event
// intervals, as the profiler's gpu_busy_s of deepspeed_reference.py counts kernels
// (calibration::phase_times, on every micro-step).
std::array<double, 3> device_busy(const zp::zero::Program& stored, const zp::sim::TimeReport& stored_t) {
  using zp::calibration::PhaseName;
  const auto pp = zp::calibration::phase_times(zp::zero::expand(stored), zp::sim::expand_times(stored, stored_t));
  auto busy = [&](PhaseName ph) {
    return pp.seconds[static_cast<std::size_t>(ph)][static_cast<std::size_t>(zp::calibration::Quantity::gpu_busy)];
  };
  return {busy(PhaseName::forward), busy(PhaseName::backward), busy(PhaseName::step)};
}

double rel(double predicted, double measured) { return (predicted - measured) / measured; }

}  // namespace

TEST_CASE("DeepSpeed 0.19.8 on an H200: memory and time of every recorded run") {
  const json ref = reference();
  REQUIRE(ref.at("runs").size() >= 30);
  const fs::path dir = fs::temp_directory_path() / fmt::format("zp_dsref_{}", static_cast<long>(::getpid()));
  fs::create_directories(dir);
  std::vector<Row> rows;
  std::array<double, 3> gpu_err{};  // Σ |error| of the GPU's busy time per phase
  int gpu_runs = 0;
  std::string gpu_table;
  std::string table = fmt::format("{:<28} {:>19} {:>19} {:>15} {:>15} {:>15} {:>15}\n", "run", "allocated MiB",
                                  "reserved MiB", "forward ms", "backward ms", "step ms", "iteration ms");
  for (const auto& run : ref.at("runs")) {
    const std::string name = run.at("name");
    CAPTURE(name);
    const auto r = predict(run, dir);
    // Runs measured in time-only rounds alone (tools/deepspeed_reference.py --time-only) have no memory.
    const bool has_memory = run.contains("memory");
    const json m = has_memory ? run.at("memory") : json{{"peak_allocated", NAN}, {"peak_reserved", NAN}};
    const auto& ph = run.at("phases_s");
    Row row;
    row.name = name;
    row.has_memory = has_memory;
    row.alloc = rel(static_cast<double>(r.memory.peak_allocated.v), m.at("peak_allocated").get<double>());
    row.reserved = rel(static_cast<double>(r.memory.reserved_peak.v), m.at("peak_reserved").get<double>());
    const auto& t = r.time.report.phases;
    row.fwd = rel(t.forward.v, ph.at("forward").get<double>());
    row.bwd = rel(t.backward.v, ph.at("backward").get<double>());
    row.step = rel(t.step.v, ph.at("step").get<double>());
    row.iter = rel(r.time.iteration.v, run.at("iteration_s").get<double>());
    auto cell = [](double meas, double pred, double e) {
      if (std::isnan(meas)) return fmt::format("{:>7}/{:<6.0f}{:>6}", "-", pred, "");
      return fmt::format("{:>7.0f}/{:<6.0f}{:+5.1f}%", meas, pred, e * 100);
    };
    auto tcell = [](double meas, double pred, double e) { return fmt::format("{:>5.1f}/{:<5.1f}{:+5.0f}%", meas, pred, e * 100); };
    table += fmt::format("{:<28} {} {} {} {} {} {}\n", name,
                         cell(m.at("peak_allocated").get<double>() / 1048576.0, static_cast<double>(r.memory.peak_allocated.v) / 1048576.0, row.alloc),
                         cell(m.at("peak_reserved").get<double>() / 1048576.0, static_cast<double>(r.memory.reserved_peak.v) / 1048576.0, row.reserved),
                         tcell(ph.at("forward").get<double>() * 1e3, t.forward.v * 1e3, row.fwd),
                         tcell(ph.at("backward").get<double>() * 1e3, t.backward.v * 1e3, row.bwd),
                         tcell(ph.at("step").get<double>() * 1e3, t.step.v * 1e3, row.step),
                         tcell(run.at("iteration_s").get<double>() * 1e3, r.time.iteration.v * 1e3, row.iter));
    rows.push_back(row);
    if (run.contains("gpu_s") && run.value("world_size", 1) == 1) {
      const auto busy = device_busy(r.program, r.time.report);
      gpu_table += fmt::format("{:<28}", name);
      int k = 0;
      for (const char* phase : {"forward", "backward", "step"}) {
        const double meas = run.at("gpu_s").at(phase).get<double>(), e = rel(busy[static_cast<std::size_t>(k)], meas);
        gpu_err[static_cast<std::size_t>(k++)] += std::fabs(e);
        gpu_table += fmt::format(" {:>5.1f}/{:<5.1f}{:+5.0f}%", meas * 1e3, busy[static_cast<std::size_t>(k - 1)] * 1e3, e * 100);
      }
      gpu_table += "\n";
      ++gpu_runs;
    }
  }
  fs::remove_all(dir);
  MESSAGE("measured/predicted and error, per run\n" << table);
  // The compute model apart from the host's: the profiler's GPU busy time per phase (runs
  // measured in full), against the predicted device streams'.
  MESSAGE("GPU busy ms, forward / backward / step, profiler/predicted\n" << gpu_table);
  REQUIRE(gpu_runs >= 30);
  MESSAGE(fmt::format("mean |error| of the GPU's busy time: forward {:.1f}%, backward {:.1f}%, step {:.1f}%",
                      100 * gpu_err[0] / gpu_runs, 100 * gpu_err[1] / gpu_runs, 100 * gpu_err[2] / gpu_runs));
  // The GEMM curve, the odd head's output, flash attention and autograd's adds fitted together
  // to the H100's kernel profiles (docs/compute_model.md): forward 9.6% and backward 4.7% before
  // (the attention's excess hiding the GEMMs' and the adds' errors); stage 3's separate bias
  // adds (Event::unfused_bias) took the forward from 10.4% to 9.6%. PyTorch's kernels by family
  // (sim::TorchKernel) took the forward from 5.6% to 5.0% and the backward from 5.4% to 2.7%.
  CHECK(gpu_err[0] / gpu_runs <= 0.055);
  CHECK(gpu_err[1] / gpu_runs <= 0.035);  // residual sums passing their gradient on: 6.3% before
  CHECK(gpu_err[2] / gpu_runs <= 0.07);  // DeepSpeed's per-tensor step loops (58% short without them)

  // Bounds per run and on the mean over runs (see the header comment).
  double mean_f = 0, mean_b = 0, mean_s = 0, mean_i = 0, sq_log_iter = 0;
  for (const Row& r : rows) {
    CAPTURE(r.name);
    if (r.has_memory) {
      CHECK(std::fabs(r.alloc) <= 0.03);  // the targets, met by every run
      CHECK(std::fabs(r.reserved) <= 0.05);
    }
    CHECK(std::fabs(r.fwd) <= 0.35);
    CHECK(std::fabs(r.bwd) <= 0.35);
    CHECK(std::fabs(r.step) <= 0.45);
    CHECK(std::fabs(r.iter) <= 0.30);
    mean_f += std::fabs(r.fwd);
    mean_b += std::fabs(r.bwd);
    mean_s += std::fabs(r.step);
    mean_i += std::fabs(r.iter);
    sq_log_iter += std::log1p(r.iter) * std::log1p(r.iter);
  }
  const double n = static_cast<double>(rows.size());
  MESSAGE(fmt::format("mean |error|: forward {:.1f}%, backward {:.1f}%, step {:.1f}%, iteration {:.1f}%",
                      100 * mean_f / n, 100 * mean_b / n, 100 * mean_s / n, 100 * mean_i / n));
  CHECK(mean_f / n <= 0.11);
  CHECK(mean_b / n <= 0.11);
  CHECK(mean_s / n <= 0.11);
  CHECK(mean_i / n <= 0.09);
  // The H200 preset's stated uncertainty (sim/profiles.json, printed by simulate and plan) is
  // this root mean square of log(predicted / measured): it must not understate it.
  const double rms = std::sqrt(sq_log_iter / n);
  MESSAGE(fmt::format("rms of log(predicted / measured) iteration: {:.4f}", rms));
  const double stated = zp::sim::default_profile(zp::sim::find_device("H200-141GB")).iteration_rel_sd;
  CHECK(rms <= stated * 1.02);
  CHECK(rms >= stated * 0.8);
}

TEST_CASE("DeepSpeed 0.19.8 on an H200: the planner ranks each model's stages as DeepSpeed measured them") {
  // Iteration time per stage of each model at bf16 with sdpa and the matrix's defaults.
  const json ref = reference();
  int pairs = 0;
  for (const std::string model : {"gpt2", "bertl", "llama", "gpt2m", "bertb"}) {
    CAPTURE(model);
    std::vector<std::pair<double, int>> measured, predicted;  // (iteration s, stage), same order
    for (const auto& run : ref.at("runs")) {
      const std::string name = run.at("name");
      bool base = false;
      for (int s = 0; s < 4; ++s)
        base = base || name == fmt::format("{}-bf16-sdpa-s{}", model, s);
      if (!base) continue;
      const auto r = predict(run, fs::temp_directory_path());
      const int stage = run.at("stage");
      measured.emplace_back(run.at("iteration_s").get<double>(), stage);
      predicted.emplace_back(r.time.iteration.v, stage);
    }
    if (measured.size() < 2) continue;
    // Every pair of stages DeepSpeed ran more than 35% apart is ordered the same way by the
    // prediction. Closer pairs are within the host's noise (stages 1 and 2 of a model are
    // 5-15% apart, and they swapped places between models in the first measurement).
    for (std::size_t i = 0; i < measured.size(); ++i)
      for (std::size_t j = 0; j < measured.size(); ++j) {
        if (measured[j].first <= 1.35 * measured[i].first) continue;
        ++pairs;
        CAPTURE(measured[i].second);
        CAPTURE(measured[j].second);
        CHECK(predicted[i].first < predicted[j].first);
      }
  }
  CHECK(pairs >= 5);
}

// Several DeepSpeed ranks (tests/data/deepspeed/h200_deepspeed_0.19.8_n{2,4}.json): rank 0's
// memory at world sizes 2 and 4, where ZeRO partitions the optimizer state (stages 1-2) and
// stage 3 gathers its parameters for real. The ranks shared one H200 and spoke over sockets, so
// only memory is compared, against the targets (allocated 3%, reserved 5%). Stage 3's reserved
// bytes are what found _create_fp32_partitions' converted copy and the IPG bucket's place before
// the gradient partition (docs/deepspeed_fidelity.md; from the N = 2 runs: without them the model
// held one 1572 MiB segment more than DeepSpeed, +12.5%); the N = 4 runs and the BERT-large and
// Llama runs at N = 2 were recorded after that change and predicted as they are.
TEST_CASE("DeepSpeed 0.19.8, two and four ranks: per-rank memory at stages 1-3 (GPT-2, BERT-large, Llama)") {
  std::string table;
  for (const int world : {2, 4}) {
    CAPTURE(world);
    std::ifstream in(kRoot + fmt::format("/tests/data/deepspeed/h200_deepspeed_0.19.8_n{}.json", world));
    REQUIRE(in.good());
    const json ref = json::parse(in);
    REQUIRE(ref.at("runs").size() >= 3);
    const fs::path dir = fs::temp_directory_path() / fmt::format("zp_dsref{}_{}", world, static_cast<long>(::getpid()));
    fs::create_directories(dir);
    for (const auto& run : ref.at("runs")) {
      const std::string name = run.at("name");
      CAPTURE(name);
      REQUIRE(run.at("world_size") == world);
      const auto r = predict(run, dir);
      const auto& m = run.at("memory");
      const double alloc = rel(static_cast<double>(r.memory.peak_allocated.v), m.at("peak_allocated").get<double>());
      const double reserved = rel(static_cast<double>(r.memory.reserved_peak.v), m.at("peak_reserved").get<double>());
      table += fmt::format("{:<24} allocated {:>7.0f}/{:<7.0f} {:+5.1f}%   reserved {:>7.0f}/{:<7.0f} {:+5.1f}%\n", name,
                           m.at("peak_allocated").get<double>() / 1048576.0,
                           static_cast<double>(r.memory.peak_allocated.v) / 1048576.0, 100 * alloc,
                           m.at("peak_reserved").get<double>() / 1048576.0,
                           static_cast<double>(r.memory.reserved_peak.v) / 1048576.0, 100 * reserved);
      CHECK(std::fabs(alloc) <= 0.03);
      CHECK(std::fabs(reserved) <= 0.05);
    }
    fs::remove_all(dir);
  }
  MESSAGE("rank 0, measured/predicted MiB and error\n" << table);
}

// The same harness on a second device, an H100 SXM 80GB (tests/data/deepspeed/h100_deepspeed_0.19.8.json,
// ten runs measured in full, three of them on 2026-12-07): memory against the targets on a GPU of another capacity, and the
// compute model on the H100 preset, whose GEMM and attention coefficients were fitted to these
// runs' kernels (sim/profiles.json). The wall times are the host's, which differs from the
// H200 machines' (test_calibration_cli: its host costs calibrated).
TEST_CASE("DeepSpeed 0.19.8 on an H100: memory, and the GPU's busy time on the H100 preset") {
  const json ref = reference("h100_deepspeed_0.19.8.json");
  REQUIRE(ref.at("meta").at("versions").at("gpu").get<std::string>().find("H100") != std::string::npos);
  const fs::path dir = fs::temp_directory_path() / fmt::format("zp_dsref100_{}", static_cast<long>(::getpid()));
  fs::create_directories(dir);
  int full = 0;
  std::array<double, 3> gpu_err{};
  for (const auto& run : ref.at("runs")) {
    if (!run.contains("memory")) continue;  // timed in rounds only
    const std::string name = run.at("name");
    CAPTURE(name);
    ++full;
    const auto r = predict(run, dir, "1xH100-80GB");
    const auto& m = run.at("memory");
    CHECK(std::fabs(rel(static_cast<double>(r.memory.peak_allocated.v), m.at("peak_allocated").get<double>())) <= 0.03);
    CHECK(std::fabs(rel(static_cast<double>(r.memory.reserved_peak.v), m.at("peak_reserved").get<double>())) <= 0.05);
    const auto busy = device_busy(r.program, r.time.report);
    int k = 0;
    for (const char* phase : {"forward", "backward", "step"}) {
      const double e = rel(busy[static_cast<std::size_t>(k)], run.at("gpu_s").at(phase).get<double>());
      CAPTURE(phase);
      CHECK(std::fabs(e) <= 0.35);  // worst today: the fp32 Llama's step (+23%, +32% before FusedAdam's measured rate) and backward (-23%)
      gpu_err[static_cast<std::size_t>(k++)] += std::fabs(e);
    }
  }
  fs::remove_all(dir);
  REQUIRE(full == 10);  // the three stage-3 runs timed in rounds only had their memory and profile measured on 2026-12-07
  MESSAGE(fmt::format("H100, mean |error| of the GPU's busy time: forward {:.1f}%, backward {:.1f}%, step {:.1f}%",
                      100 * gpu_err[0] / full, 100 * gpu_err[1] / full, 100 * gpu_err[2] / full));
  // 6.6% before the joint fit of the compute model (backward 6.2%); 2.3% / 6.0% before PyTorch's
  // kernels by family (2.9% / 4.2% with them: the fp32 Llama's forward moved from -4% to +7%).
  // Step 7.7% with FusedAdam at its measured rate and the loops' kernels at 1.7 us (7.3% with both
  // off in ways that cancelled, docs/compute_model.md).
  CHECK(gpu_err[0] / full <= 0.04);
  CHECK(gpu_err[1] / full <= 0.05);
  CHECK(gpu_err[2] / full <= 0.08);
}

// PyTorch's kernels class by class (tests/data/deepspeed/h100_kernels_0.19.8.json: ten runs on
// H100s with their kernel profiles, BERT-base and large, GPT-2 and GPT-2 medium, the Llama; fp32,
// fp16, bf16; sdpa and eager): the GPU time of the GEMMs, the attention and the rest (elementwise
// kernels and copies) per phase against the profiler's, on the H100 preset. The rest is what
// PyTorch's kernel families price (sim::TorchKernel, docs/compute_model.md): before them its
// backward was 15.8% off on average over these runs (6.7% now), GPT-2's eager backward +22%
// (-7%), and the Llama's forward missed RoPE's five kernels (-15%, now -1%); the GPU's busy
// backward 8.6% (3.1%). The forward's elementwise mean was 7.2% before (7.3%): BERT-large's
// eager forward, short by the copies PyTorch makes of q, k and v for its matmuls (not in the
// graph), and the fp32 Llama's stage 2 hooks stay the largest errors.
TEST_CASE("DeepSpeed 0.19.8 on an H100: PyTorch's kernels class by class") {
  using zp::calibration::PhaseName;
  using zp::calibration::Quantity;
  const json ref = reference("h100_kernels_0.19.8.json");
  REQUIRE(ref.at("meta").at("versions").at("gpu").get<std::string>().find("H100") != std::string::npos);
  const fs::path dir = fs::temp_directory_path() / fmt::format("zp_dsrefk_{}", static_cast<long>(::getpid()));
  fs::create_directories(dir);
  // Σ |error| per phase (forward, backward) of the GPU's busy time and of the elementwise class.
  std::array<double, 2> busy_err{}, other_err{};
  int n = 0;
  std::string table;
  for (const auto& run : ref.at("runs")) {
    const std::string name = run.at("name");
    CAPTURE(name);
    ++n;
    const auto r = predict(run, dir, "1xH100-80GB");
    const auto& m = run.at("memory");
    CHECK(std::fabs(rel(static_cast<double>(r.memory.peak_allocated.v), m.at("peak_allocated").get<double>())) <= 0.03);
    CHECK(std::fabs(rel(static_cast<double>(r.memory.reserved_peak.v), m.at("peak_reserved").get<double>())) <= 0.05);
    const auto pp =
        zp::calibration::phase_times(zp::zero::expand(r.program), zp::sim::expand_times(r.program, r.time.report), r.ops);
    table += fmt::format("{:<22}", name);
    int k = 0;
    for (const auto& [phase, ph] : {std::pair{"forward", PhaseName::forward}, std::pair{"backward", PhaseName::backward}}) {
      CAPTURE(phase);
      const auto& q = pp.seconds[static_cast<std::size_t>(ph)];
      const auto& cls = run.at("gpu_by_class_s").at(phase);
      const double meas_other = cls.value("elementwise", 0.0) + cls.value("copy", 0.0);
      const double pred_other = q[static_cast<std::size_t>(Quantity::gpu_other)];
      const double busy = q[static_cast<std::size_t>(Quantity::gpu_busy)];
      const double e_busy = rel(busy, run.at("gpu_s").at(phase).get<double>()), e_other = rel(pred_other, meas_other);
      CHECK(std::fabs(e_busy) <= 0.2);    // worst today: the fp32 Llama's backward (-15%)
      CHECK(std::fabs(e_other) <= 0.3);   // worst today: the fp32 Llama's backward (-24%), stage 2's fp32 hooks
      busy_err[static_cast<std::size_t>(k)] += std::fabs(e_busy);
      other_err[static_cast<std::size_t>(k)] += std::fabs(e_other);
      table += fmt::format("  {} busy {:5.1f}/{:<5.1f}{:+4.0f}%  elementwise {:5.1f}/{:<5.1f}{:+4.0f}%", phase[0] == 'f' ? "fwd" : "bwd",
                           run.at("gpu_s").at(phase).get<double>() * 1e3, busy * 1e3, e_busy * 100, meas_other * 1e3,
                           pred_other * 1e3, e_other * 100);
      ++k;
    }
    table += "\n";
  }
  fs::remove_all(dir);
  REQUIRE(n == 10);
  MESSAGE("H100 kernel profiles, profiler/predicted ms and error\n" << table);
  MESSAGE(fmt::format("mean |error|: busy forward {:.1f}%, backward {:.1f}%; elementwise forward {:.1f}%, backward {:.1f}%",
                      100 * busy_err[0] / n, 100 * busy_err[1] / n, 100 * other_err[0] / n, 100 * other_err[1] / n));
  // Today 3.8% / 3.1% and 7.3% / 6.7%; before the families 4.3% / 8.6% and 7.2% / 15.8%.
  CHECK(busy_err[0] / n <= 0.045);
  CHECK(busy_err[1] / n <= 0.04);
  CHECK(other_err[0] / n <= 0.085);
  CHECK(other_err[1] / n <= 0.08);
}

// The H100 machine's times with its calibrated profile (calibration/profiles/h100-80gb_deepspeed-0.19.8.json:
// one factor on the H200 machines' host costs, host.scale, fitted by `zeroplan calibrate --fit
// host.scale` on the GPT-2 and BERT-large runs): every run, and each model's stages in the order
// DeepSpeed ran them. On that host stage 1 ran faster than stage 0 for every model and stage 2 for
// all but BERT-base (their ZeRO step overlapping the backward's last device work, below), the
// order the H200 machines' slower host reversed.
TEST_CASE("DeepSpeed 0.19.8 on an H100: times with the machine's calibrated host, and the stages' order") {
  const json ref = reference("h100_deepspeed_0.19.8.json");
  const std::string profile = kRoot + "/calibration/profiles/h100-80gb_deepspeed-0.19.8.json";
  const fs::path dir = fs::temp_directory_path() / fmt::format("zp_dsref100t_{}", static_cast<long>(::getpid()));
  fs::create_directories(dir);
  std::array<double, 4> sum{}, held{};  // forward, backward, step, iteration; all runs and held-out ones
  int n = 0, n_held = 0;
  std::map<std::string, std::vector<std::array<double, 3>>> groups;  // model-dtype-attention → (stage, measured, predicted)
  for (const auto& run : ref.at("runs")) {
    const std::string name = run.at("name");
    CAPTURE(name);
    const auto r = predict(run, dir, "1xH100-80GB", profile);
    const auto& t = r.time.report.phases;
    const auto& ph = run.at("phases_s");
    const std::array<double, 4> e = {rel(t.forward.v, ph.at("forward").get<double>()), rel(t.backward.v, ph.at("backward").get<double>()),
                                     rel(t.step.v, ph.at("step").get<double>()), rel(r.time.iteration.v, run.at("iteration_s").get<double>())};
    const bool fitted = name.rfind("gpt2-", 0) == 0 || name.rfind("bertl-", 0) == 0;
    for (std::size_t k = 0; k < 4; ++k) {
      sum[k] += std::fabs(e[k]);
      if (!fitted) held[k] += std::fabs(e[k]);
    }
    ++n;
    n_held += fitted ? 0 : 1;
    CHECK(std::fabs(e[3]) <= 0.15);  // every iteration (worst today: the fp32 Llama's stage 2, +9.9%)
    // The iteration without the phases' synchronisations overlaps them by what the ZeRO step's
    // loops get done while the device finishes the backward: nothing elsewhere, at most the
    // few milliseconds of a step's loops (DeepSpeed's runs: 0.5 to 6.4 ms).
    const double overlap = (r.time.report.phases.iteration - r.time.iteration).v;
    CHECK(overlap >= 0);
    CHECK(overlap <= 0.015);
    const bool free_running = (run.at("stage") == 1 || run.at("stage") == 2) &&
                              !run.at("ds_config").at("zero_optimization").value("overlap_comm", false);
    if (!free_running) CHECK(overlap == 0);
    // The runs named <model>-<dtype>-<attention>-s<stage> with nothing after the stage.
    const auto dash = name.rfind("-s");
    if (dash != std::string::npos && dash + 3 == name.size())
      groups[name.substr(0, dash)].push_back({run.at("stage").get<double>(), run.at("iteration_s").get<double>(), r.time.iteration.v});
  }
  fs::remove_all(dir);
  REQUIRE(n == 41);
  REQUIRE(n_held == 14);
  MESSAGE(fmt::format("H100 with host.scale, mean |error| forward / backward / step / iteration: all {:.1f} / {:.1f} / {:.1f} / "
                      "{:.1f}%, held out {:.1f} / {:.1f} / {:.1f} / {:.1f}%",
                      100 * sum[0] / n, 100 * sum[1] / n, 100 * sum[2] / n, 100 * sum[3] / n, 100 * held[0] / n_held,
                      100 * held[1] / n_held, 100 * held[2] / n_held, 100 * held[3] / n_held));
  for (std::size_t k = 0; k < 4; ++k) {
    CHECK(sum[k] / n <= 0.10);  // the 10% per phase, on average
    CHECK(held[k] / n_held <= 0.10);
  }
  // Every pair of a model's stages DeepSpeed ran more than 5% apart is predicted in that order (at one
  // GPU stages 1 and 2 do the same work and are predicted alike; their measured 1-4% is the host's).
  // Stages 1-2 ran faster than stage 0 on this fast host because their ZeRO step's loops run while
  // the device still works through the backward (nothing reads back until the overflow flag),
  // which the iteration predicted without the phases' synchronisations has (zero::LowerOptions::
  // phase_syncs); before it, GPT-2's three such pairs came out 1-3% the other way.
  int pairs = 0;
  for (const auto& [group, v] : groups) {
    CAPTURE(group);
    for (const auto& a : v)
      for (const auto& b : v) {
        if (b[1] <= 1.05 * a[1]) continue;
        CAPTURE(a[0]);
        CAPTURE(b[0]);
        ++pairs;
        CHECK(a[2] < b[2]);
      }
  }
  MESSAGE(fmt::format("H100 stage order: {} pairs more than 5% apart, predicted in order", pairs));
  CHECK(pairs >= 26);  // the pairs the recorded runs have
}
