#include "cli/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"
#include "zero/program.hpp"

namespace zp::cli {

namespace {

using nlohmann::json;
namespace ju = zp::json;

// One of the two documents: its name in messages and what it is expected to be.
struct Source {
  std::string file;
  std::string hint;
};

// A value inside a document with its dotted path, so every error names the file and key.
class Node {
 public:
  Node(const Source& src, const json& v, std::string path) : src_(&src), v_(&v), path_(std::move(path)) {}

  const json& raw() const { return *v_; }
  const std::string& path() const { return path_; }

  bool has(std::string_view key) const { return v_->is_object() && v_->contains(key); }

  Node operator[](std::string_view key) const {
    require_object();
    const auto it = v_->find(key);
    const std::string p = child(key);
    if (it == v_->end()) throw InputError(src_->file, p, fmt::format("missing ({})", src_->hint));
    return Node(*src_, *it, p);
  }

  std::size_t size() const {
    if (!v_->is_array()) fail(fmt::format("must be a JSON array, got {} ({})", v_->type_name(), src_->hint));
    return v_->size();
  }

  Node at(std::size_t i) const { return Node(*src_, (*v_)[i], fmt::format("{}[{}]", path_, i)); }

  std::vector<std::string> keys() const {
    require_object();
    std::vector<std::string> out;
    for (auto it = v_->begin(); it != v_->end(); ++it) out.push_back(it.key());
    return out;
  }

  std::int64_t integer(std::int64_t lo = std::numeric_limits<std::int64_t>::min()) const {
    std::optional<std::int64_t> x;
    if (v_->is_number_unsigned()) {
      const auto u = v_->get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) x = static_cast<std::int64_t>(u);
    } else if (v_->is_number_integer()) {
      x = v_->get<std::int64_t>();
    } else if (v_->is_number_float()) {
      const double d = v_->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) x = static_cast<std::int64_t>(d);
    }
    if (!x || *x < lo)
      fail(lo == std::numeric_limits<std::int64_t>::min()
               ? fmt::format("must be an integer, got {}", shown())
               : fmt::format("must be an integer >= {}, got {}", lo, shown()));
    return *x;
  }

  double number() const {
    if (!v_->is_number() || !std::isfinite(v_->get<double>()) || v_->get<double>() < 0)
      fail(fmt::format("must be a number >= 0, got {}", shown()));
    return v_->get<double>();
  }

  bool boolean() const {
    if (!v_->is_boolean()) fail(fmt::format("must be true or false, got {}", shown()));
    return v_->get<bool>();
  }

  std::string string() const {
    if (!v_->is_string()) fail(fmt::format("must be a string, got {}", shown()));
    return v_->get<std::string>();
  }

  [[noreturn]] void fail(const std::string& msg) const { throw InputError(src_->file, path_, msg); }

 private:
  std::string child(std::string_view key) const {
    return path_.empty() ? ju::printable(key) : fmt::format("{}.{}", path_, ju::printable(key));
  }
  void require_object() const {
    if (!v_->is_object()) fail(fmt::format("must be a JSON object, got {} ({})", v_->type_name(), src_->hint));
  }
  std::string shown() const { return ju::printable(v_->dump()); }

  const Source* src_;
  const json* v_;
  std::string path_;
};

// ---- formatting

// 1234567 → "1,234,567"; with_sign: "+1,234,567", "0".
std::string grouped(std::int64_t v, bool with_sign = false) {
  const std::uint64_t a = v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  std::string digits = std::to_string(a), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  if (v < 0) return "-" + out;
  if (with_sign && v > 0) return "+" + out;
  return out;
}

// The difference predicted - measured as a percentage of the measured value; none when
// the measured value is 0 and the predicted one is not.
std::optional<double> diff_pct(std::int64_t predicted, std::int64_t measured) {
  if (predicted == measured) return 0.0;
  if (measured == 0) return std::nullopt;
  return 100.0 * (static_cast<double>(predicted) - static_cast<double>(measured)) / static_cast<double>(measured);
}

std::string pct_text(std::int64_t predicted, std::int64_t measured) {
  if (predicted == measured) return "exact";
  const auto p = diff_pct(predicted, measured);
  return p ? fmt::format("{:+.2f}%", *p) : std::string("n/a");
}

json opt_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

struct ByteRow {
  std::string name;
  std::int64_t predicted = 0, measured = 0;
  bool exact() const { return predicted == measured; }
  json to_json() const {
    return {{"predicted", predicted},
            {"measured", measured},
            {"diff", predicted - measured},
            {"diff_pct", opt_json(diff_pct(predicted, measured))}};
  }
};

std::string byte_line(const ByteRow& r) {
  return fmt::format("  {:<22} {:>16} {:>16} {:>14} {:>9}", r.name, grouped(r.predicted), grouped(r.measured),
                     grouped(r.predicted - r.measured, true), pct_text(r.predicted, r.measured));
}

std::optional<double> ratio(double measured, double predicted) {
  if (predicted <= 0) return std::nullopt;
  return measured / predicted;
}

std::string ratio_text(const std::optional<double>& r) {
  if (!r) return "n/a";
  if (*r >= 100) return fmt::format("{:.0f}x", *r);
  return fmt::format("{:.2f}x", *r);
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Canonical names first (in the program's order), then any others either side has.
std::vector<std::string> union_keys(std::vector<std::string> canonical, const std::vector<std::string>& a,
                                    const std::vector<std::string>& b) {
  auto add = [&](const std::vector<std::string>& ks) {
    for (const auto& k : ks)
      if (std::find(canonical.begin(), canonical.end(), k) == canonical.end()) canonical.push_back(k);
  };
  add(a);
  add(b);
  return canonical;
}

}  // namespace

Comparison compare_documents(const json& predicted, const std::string& predicted_name, const json& measured,
                             const std::string& measured_name) {
  const Source ps{predicted_name, "expected the output of `zeroplan simulate --json`"};
  const Source ms{measured_name, "expected the measurements of `zeroplan train --out`"};
  const Node P(ps, predicted, ""), M(ms, measured, "");
  const std::string pair = fmt::format("{} vs {}", predicted_name, measured_name);
  if (predicted.is_object() && measured.is_object() && predicted.contains("config") && !predicted.contains("results") &&
      measured.contains("results") && !measured.contains("config"))
    throw InputError(pair, "",
                     "the files look swapped: --predicted takes `simulate --json` output, --measured the "
                     "measurements of `train --out`");
  const Node cfg = M["config"];
  auto differ = [&](const Node& pn, const Node& mn, const std::string& pv, const std::string& mv,
                    const std::string& fix) {
    throw InputError(pair, "",
                     fmt::format("the runs differ in {}: predicted {} ({}), measured {} ({}){}",
                                 mn.path().substr(mn.path().find('.') + 1), pv, pn.path(), mv, mn.path(),
                                 fix.empty() ? "" : "; " + fix));
  };

  // ---- the same configuration on both sides
  const std::string model = cfg["model"].string();
  if (P["model"].string() != model)
    differ(P["model"], cfg["model"], ju::printable(P["model"].string()), ju::printable(model), "");
  const std::int64_t world = cfg["world_size"].integer(1);
  if (P["world_size"].integer(1) != world)
    differ(P["world_size"], cfg["world_size"], std::to_string(P["world_size"].integer(1)), std::to_string(world),
           fmt::format("simulate with --gpus {}", world));
  const std::int64_t stage = cfg["stage"].integer(0);
  const Node results = P["results"];
  std::optional<std::size_t> pick;
  std::vector<std::string> stages;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const std::int64_t s = results.at(i)["stage"].integer(0);
    stages.push_back(std::to_string(s));
    if (s == stage && !pick) pick = i;
  }
  if (!pick)
    throw InputError(pair, "",
                     fmt::format("the runs differ in stage: the measurement is ZeRO stage {} (config.stage), the "
                                 "prediction has {} (results[].stage); simulate with --stages {}",
                                 stage, stages.empty()       ? std::string("no results")
                                 : (stages.size() == 1 ? "stage " : "stages ") + join(stages, ", "),
                                 stage));
  const Node R = results.at(*pick);
  const std::int64_t rank = cfg["rank"].integer(0);
  if (R["rank"].integer(0) != rank)
    differ(R["rank"], cfg["rank"], std::to_string(R["rank"].integer(0)), std::to_string(rank),
           fmt::format("simulate with --rank {} (or compare rank {}'s measurements)", rank, R["rank"].integer(0)));
  const std::int64_t micro = cfg["micro_batch"].integer(1);
  if (R["micro_batch"].integer(1) != micro)
    differ(R["micro_batch"], cfg["micro_batch"], std::to_string(R["micro_batch"].integer(1)), std::to_string(micro),
           fmt::format("simulate with --micro-batch {}", micro));
  const std::int64_t gas = cfg["gas"].integer(1);
  if (R["gradient_accumulation_steps"].integer(1) != gas)
    differ(R["gradient_accumulation_steps"], cfg["gas"], std::to_string(R["gradient_accumulation_steps"].integer(1)),
           std::to_string(gas), "simulate with the measured run's ds_config");
  const std::int64_t seq = cfg["seq_len"].integer(1);
  if (P["seq_len"].integer(1) != seq)
    differ(P["seq_len"], cfg["seq_len"], std::to_string(P["seq_len"].integer(1)), std::to_string(seq),
           fmt::format("simulate with --seq-len {}", seq));
  // Keys only some versions write: compared when both sides have them.
  for (const char* k : {"attention", "activation_checkpointing"}) {
    if (!P.has(k) || !cfg.has(k)) continue;
    if (P[k].raw() != cfg[k].raw())
      differ(P[k], cfg[k], ju::printable(P[k].raw().dump()), ju::printable(cfg[k].raw().dump()), "");
  }
  // A file without a kernel variant's key predates it: it predicted (or ran) HF's graph.
  for (const models::KernelVariantInfo& k : models::kernel_variants()) {
    const bool p_on = P.has(k.key) && P[k.key].raw() == true;
    const bool m_on = cfg.has(k.key) && cfg[k.key].raw() == true;
    if (p_on != m_on)
      throw InputError(pair, "",
                       fmt::format("the runs differ in {}: predicted {}, measured {} (a file without the key ran HF's "
                                   "graph); simulate {}{}",
                                   k.key, p_on, m_on, m_on ? "with " : "without ", k.flag));
  }
  // The ds_config each side was made from (canonical JSON, written by simulate --json as
  // "ds_config" and by train --out as config.ds_config_json), apart from the keys that
  // --stages and --micro-batch override and that are compared above.
  if (P.has("ds_config") && cfg.has("ds_config_json")) {
    const auto effective = [](const json& v) {
      json c = v.is_object() ? ju::canonical(v) : json::object();
      for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
        c.erase(k);
      if (c.contains("zero_optimization") && c["zero_optimization"].is_object()) c["zero_optimization"].erase("stage");
      return c;
    };
    const json pc = effective(P["ds_config"].raw()), mc = effective(cfg["ds_config_json"].raw());
    if (pc != mc)
      throw InputError(pair, "",
                       fmt::format("the runs were made from different ds_configs: {}; simulate with the measured run's "
                                   "ds_config",
                                   ju::describe_differences(pc, mc, "in the prediction", "in the measurement")));
  }
  const std::string backend = cfg["backend"].string();
  const std::string gpu = P.has("gpu") ? P["gpu"].string() : std::string("the predicted device");

  Comparison c;
  std::string& t = c.text;
  json& j = c.json;
  j["model"] = model;
  j["stage"] = stage;
  j["rank"] = rank;
  j["world_size"] = world;
  j["micro_batch"] = micro;
  j["gas"] = gas;
  j["seq_len"] = seq;
  j["predicted"] = {{"file", predicted_name}, {"gpu", gpu}};
  j["measured"] = {{"file", measured_name}, {"backend", backend}};
  t += fmt::format("compare: {}, ZeRO stage {}, rank {} of {}, micro-batch {} x {} micro-steps, seq-len {}\n",
                   ju::printable(model), stage, rank, world, micro, gas, seq);
  t += fmt::format("  predicted: {} (simulate, {})\n", predicted_name, ju::printable(gpu));
  t += fmt::format("  measured:  {} (train, {} backend{})\n", measured_name, ju::printable(backend),
                   cfg.has("steps") ? fmt::format(", {} steps", cfg["steps"].integer(1)) : "");

  // ---- memory at the peak
  // The program the run held: PyTorch's cuBLAS/cuBLASLt workspaces are among a prediction's
  // buffers (simulate lowers for DeepSpeed), among a run's only under train --workspaces-of.
  // A run without them is held to the program simulate --executor lowered as train ran it;
  // with no such program the difference is shown, and said where it comes from. (Files
  // without the keys predate them and are compared as they are.)
  Node pm = R["memory"];
  const Node mm = M["memory"];
  std::string program_note, workspace_note;
  std::optional<std::pair<std::int64_t, std::int64_t>> workspaces;  // predicted (top-level), measured
  if (cfg.has("library_workspace_bytes") && pm.has("library_workspace_bytes")) {
    const std::int64_t mw = cfg["library_workspace_bytes"].integer(0), pw = pm["library_workspace_bytes"].integer(0);
    workspaces.emplace(pw, mw);
    if (pw != mw) {
      if (R.has("executor") && R["executor"].has("memory") && R["executor"]["library_workspace_bytes"].integer(0) == mw) {
        pm = R["executor"]["memory"];
        program_note = ", without PyTorch's workspaces (simulate --executor)";
      } else {
        workspace_note = fmt::format(
            "  the prediction holds {} bytes of PyTorch's cuBLAS/cuBLASLt workspaces, the run {} "
            "(config.library_workspace_bytes): {}\n",
            grouped(pw), grouped(mw),
            mw > 0 ? "predict it on the GPU the run named with train --workspaces-of"
            : backend.rfind("cuda", 0) == 0
                ? "simulate --executor cuda predicts the program as train ran it"
                : "simulate --executor cuda predicts the program as train ran it, or train --workspaces-of the "
                  "simulated GPU holds them as the prediction does");
      }
    }
  }
  const Node pcat = pm["by_category"], mcat = mm["at_peak"];
  std::vector<std::string> canon;
  for (int k = 0; k < zero::kNumCategories; ++k)
    canon.emplace_back(zero::category_name(static_cast<zero::Category>(k)));
  std::vector<ByteRow> mem;
  for (const auto& k : union_keys(canon, pcat.keys(), mcat.keys()))
    mem.push_back({k, pcat[k].integer(0), mcat[k].integer(0)});
  const std::size_t ncat = mem.size();
  mem.push_back({"peak allocated", pm["peak_allocated_bytes"].integer(0), mm["peak_allocated"].integer(0)});
  mem.push_back({"reserved", pm["reserved_bytes"].integer(0), mm["reserved_peak"].integer(0)});
  if (pm.has("host_bytes") && mm.has("peak_host"))
    mem.push_back({"host peak (offload)", pm["host_bytes"].integer(0), mm["peak_host"].integer(0)});
  const std::string pev = pm["peak_event"].string(), mev = mm["peak_event"].string();
  const bool same_event = pev == mev;
  std::vector<std::string> mem_off;
  for (const auto& r : mem)
    if (!r.exact()) mem_off.push_back(r.name);
  if (!same_event) mem_off.emplace_back("peak event");
  c.exact_memory = mem_off.empty();

  t += fmt::format("\n{:<25}{:>16} {:>16} {:>14} {:>9}\n", "memory, bytes", "predicted", "measured", "diff", "diff %");
  t += fmt::format("  at the peak, by category{}\n", program_note);
  json jcat = json::object();
  for (std::size_t i = 0; i < mem.size(); ++i) {
    if (i == ncat) t += "  totals\n";
    t += byte_line(mem[i]) + "\n";
    if (i < ncat) jcat[mem[i].name] = mem[i].to_json();
  }
  t += fmt::format("  peak event: predicted {}\n              measured  {}{}\n", ju::printable(pev),
                   ju::printable(mev), same_event ? "  (same)" : "  (different)");
  t += c.exact_memory ? std::string("memory: exact (every category, the peak, reserved and the peak event agree)\n")
                      : fmt::format("memory: differs in {} (diff = predicted - measured; % of measured)\n",
                                    join(mem_off, ", "));
  t += workspace_note;
  j["memory"] = {{"by_category", jcat},
                 {"peak_allocated", mem[ncat].to_json()},
                 {"reserved", mem[ncat + 1].to_json()},
                 {"peak_event", {{"predicted", pev}, {"measured", mev}, {"same", same_event}}}};
  j["memory"]["predicted_program"] = program_note.empty() ? "simulate" : "simulate --executor";
  if (workspaces)  // PyTorch's workspaces: the top-level program's and the run's
    j["memory"]["library_workspace_bytes"] = {{"predicted", workspaces->first}, {"measured", workspaces->second}};
  if (mem.size() > ncat + 2) j["memory"]["host_peak"] = mem[ncat + 2].to_json();
  if (M.has("driver_memory")) {
    // A GPU run: the whole device as the driver saw it at the peak, part by part, beside
    // what `simulate --executor cuda` predicted for it (exec/cuda_memory.hpp); without that,
    // only the program's reserved segments are predicted.
    const Node dm = M["driver_memory"];
    const std::int64_t ctx = dm["after_context"].integer(0), init = dm["after_init"].integer(0);
    const std::int64_t comm = dm["after_comm"].integer(0), peak = dm["peak"].integer(0);
    const std::int64_t scratch = dm["device_scratch"].integer(0), reserved = mm["reserved_peak"].integer(0);
    const std::int64_t nccl = comm > init ? comm - init : 0;
    // What the libraries took after init (a run recorded before these keys has them in the
    // unexplained rest): cuDNN's handle and attention engines, cuBLASLt's kernels loaded at a
    // GEMM shape's first product.
    const std::int64_t cudnn = dm.has("cudnn") ? dm["cudnn"].integer(0) : 0;
    const std::int64_t loaded = dm.has("cublaslt_loaded") ? dm["cublaslt_loaded"].integer(0) : 0;
    const std::int64_t rest = peak - ctx - (init - ctx) - nccl - cudnn - loaded - reserved - scratch;
    const bool ex = R.has("executor");
    std::optional<Node> pu;
    if (ex) pu = R["executor"]["device_used"];
    const std::string mb = cfg.has("backend") ? cfg["backend"].string() : std::string();
    if (ex && mb.rfind("cuda+", 0) == 0) {  // the communicator predicted is the one the run used
      const std::string pc = R["executor"]["comm"].string(), mc = mb.substr(5);
      if (pc != mc)
        differ(R["executor"]["comm"], cfg["backend"], pc, mb,
               fmt::format("predict it with simulate --executor {}", mc == "mpi" ? "cuda-mpi" : "cuda"));
    }
    // ... and so are PyTorch's workspaces (a file without the key predates it: none in the run,
    // the device's in the prediction, whose reserved bytes then held them).
    if (ex && R["executor"].has("library_workspace_bytes") && cfg.has("library_workspace_bytes")) {
      const std::int64_t pw = R["executor"]["library_workspace_bytes"].integer(0),
                         mw = cfg["library_workspace_bytes"].integer(0);
      if (pw != mw)
        differ(R["executor"]["library_workspace_bytes"], cfg["library_workspace_bytes"], std::to_string(pw),
               std::to_string(mw),
               mw > 0 ? "predict it with simulate --executor-workspaces (the run's train --workspaces-of)"
                      : "predict it without --executor-workspaces (the run had no train --workspaces-of)");
    }
    const bool known = ex && (*pu)["known"].boolean();
    const std::optional<std::int64_t> pr_reserved = pm["reserved_bytes"].integer(0);
    auto pred = [&](const char* key) -> std::optional<std::int64_t> {
      if (!ex || (!known && std::string_view(key) != "reserved_bytes" && std::string_view(key) != "scratch_bytes" &&
                  std::string_view(key) != "pages_bytes"))
        return std::nullopt;
      if (std::string_view(key) == "cudnn_bytes" && !pu->has(key)) return 0;  // a prediction from before the key
      return (*pu)[key].integer(0);
    };
    // Ranks sharing the GPU (train --comm mpi on one GPU): the driver's figures are all of
    // theirs, so the peak is held against the sum of their predictions (simulate
    // --ranks-per-gpu K), not this rank's.
    const std::int64_t on_gpu = cfg.has("ranks_on_gpu") ? cfg["ranks_on_gpu"].integer(1) : 1;
    std::optional<std::int64_t> whole = known ? pred("total_bytes") : std::nullopt;
    if (on_gpu > 1) {
      whole.reset();
      const bool have = ex && R["executor"].has("gpu_shared") &&
                        R["executor"]["gpu_shared"]["ranks"].integer(1) == on_gpu &&
                        R["executor"]["gpu_shared"]["known"].boolean();
      if (have) whole = R["executor"]["gpu_shared"]["total_bytes"].integer(0);
    }
    // `key` names the part in --json whatever the inputs; `name` in the table.
    struct Part {
      const char* key;
      const char* name;
      std::int64_t measured;
      std::optional<std::int64_t> predicted;
    };
    const Part parts[] = {
        {"CUDA context", "CUDA context", ctx, pred("context_bytes")},
        {"libraries (cuBLASLt, kernels)", "libraries (cuBLASLt, kernels)", init - ctx, pred("libraries_bytes")},
        {"communicator (NCCL)", "communicator (NCCL)", nccl, pred("communicator_bytes")},
        {"cuDNN (handle, engines)", "cuDNN (handle, engines)", cudnn, pred("cudnn_bytes")},
        {"cuBLASLt kernels loaded later", "cuBLASLt kernels loaded later", loaded, std::nullopt},
        {"program's reserved segments", "program's reserved segments", reserved, ex ? pred("reserved_bytes") : pr_reserved},
        {"device scratch", "device scratch", scratch, pred("scratch_bytes")},
        {"unexplained", ex ? "pages / unexplained" : "unexplained", rest, pred("pages_bytes")},
        {"driver's peak", on_gpu > 1 ? "= driver's peak (the GPU's)" : "= driver's peak", peak, whole}};
    auto mib = [](std::int64_t b) { return fmt::format("{:.1f}", static_cast<double>(b) / 1048576.0); };
    t += fmt::format("  the GPU as the driver saw it at the peak, MiB{}\n    {:<32}{:>12} {:>12} {:>9}\n",
                     ex ? "" : " (only the reserved segments are predicted: simulate --executor cuda predicts the rest)",
                     "", "predicted", "measured", "diff %");
    json jd = json::object();
    for (const Part& q : parts) {
      const std::string d = q.predicted && q.measured != 0
                                ? fmt::format("{:+.2f}%", 100.0 * static_cast<double>(*q.predicted - q.measured) /
                                                              static_cast<double>(q.measured))
                                : std::string();
      t += fmt::format("    {:<32}{:>12} {:>12} {:>9}\n", q.name, q.predicted ? mib(*q.predicted) : "-", mib(q.measured), d);
      jd[q.key] = {{"measured", q.measured}, {"predicted", q.predicted ? json(*q.predicted) : json(nullptr)}};
    }
    if (on_gpu > 1)
      t += fmt::format("    the driver's figures are the GPU's, which {} ranks share{}\n", on_gpu,
                       whole ? fmt::format(": predicted for the {} of them, {} MiB", on_gpu, mib(*whole))
                             : fmt::format(" (simulate --executor cuda-mpi --ranks-per-gpu {} predicts them)", on_gpu));
    if (whole && peak > 0) {
      const double off = static_cast<double>(*whole - peak) / static_cast<double>(peak);
      c.device_used_within_1pct = std::abs(off) <= 0.01;
      t += fmt::format("device used: predicted {} the driver's peak ({:+.2f}%)\n",
                       *c.device_used_within_1pct ? "within 1% of" : "more than 1% away from", 100.0 * off);
      jd["device_used_diff"] = off;
      jd["device_used_within_1pct"] = *c.device_used_within_1pct;
      jd["device_used_predicted"] = *whole;
    } else if (on_gpu > 1) {
      t += "device used: not predicted for the whole GPU\n";
    } else if (ex) {
      t += "device used: not predicted (the GPU's context, libraries and communicator were never measured: "
           "sim/devices.json executor_cuda)\n";
    }
    j["driver_memory"] = jd;
  }

  // ---- communication per rank per step
  const Node pc = R["comm"], mc = M["comm"];
  const Node pk = pc["by_kind"], mk = mc["by_kind"];
  std::vector<std::string> kinds;
  for (int k = 0; k < zero::kNumCollKinds; ++k)
    kinds.emplace_back(zero::coll_kind_name(static_cast<zero::CollKind>(k)));
  std::vector<std::string> comm_off;
  json jkind = json::object();
  std::string comm_rows;
  for (const auto& k : union_keys(kinds, pk.keys(), mk.keys())) {
    const bool in_p = pk.has(k), in_m = mk.has(k);
    if (!in_p && !in_m) continue;
    ByteRow r{k, in_p ? pk[k]["bytes"].integer(0) : 0, in_m ? mk[k]["bytes_per_step"].integer(0) : 0};
    const std::int64_t pcalls = in_p ? pk[k]["count"].integer(0) : 0;
    const std::int64_t mcalls = in_m ? mk[k]["calls_per_step"].integer(0) : 0;
    if (!r.exact() || pcalls != mcalls) comm_off.push_back(k);
    comm_rows += fmt::format("{} {:>9}\n", byte_line(r),
                             pcalls == mcalls ? fmt::format("{}", pcalls) : fmt::format("{} / {}", pcalls, mcalls));
    json jr = r.to_json();
    jr["predicted_calls"] = pcalls;
    jr["measured_calls"] = mcalls;
    jkind[k] = jr;
  }
  const ByteRow total{"total", pc["bytes_per_rank"].integer(0), mc["bytes_per_rank"].integer(0)};
  if (!total.exact()) comm_off.emplace_back("total");
  c.exact_comm = comm_off.empty();
  t += fmt::format("\ncommunication, bytes sent per rank per step\n  {:<22} {:>16} {:>16} {:>14} {:>9} {:>9}\n", "",
                   "predicted", "measured", "diff", "diff %", "calls");
  t += comm_rows.empty() ? std::string("  (no collectives)\n") : comm_rows;
  t += byte_line(total) + "\n";
  t += c.exact_comm ? std::string("communication: exact (bytes and calls of every collective kind agree)\n")
                    : fmt::format("communication: differs in {} (calls: predicted / measured)\n", join(comm_off, ", "));
  j["comm"] = {{"by_kind", jkind}, {"bytes_per_rank", total.to_json()}};

  // ---- time per phase of one optimizer step
  // A GPU run against the executor's own step where the prediction has it (simulate --executor
  // cuda): the top-level time prices DeepSpeed's host work, which zeroplan's executor does not do.
  const bool cpu = backend.rfind("cpu", 0) == 0;
  const bool exec_time = !cpu && R.has("executor") && R["executor"].has("time");
  const Node pt = exec_time ? R["executor"]["time"] : R["time"];
  double fwd = 0, bwd = 0, step = 0;
  // The phases as the simulator defines them (intervals of the measured timeline, overlapped
  // streams counted once: train --out's phase_times); a file without them: the sums of its
  // events per phase (the same on a device that runs events one at a time).
  const bool timeline = M.has("phase_times");
  if (timeline) {
    const Node pt_m = M["phase_times"];
    fwd = pt_m["forward"].number();
    bwd = pt_m["backward"].number();
    step = pt_m["step"].number();
  } else {
    const Node ph = M["phases"];
    for (const auto& k : ph.keys()) {
      const double v = ph[k].number();
      if (k == "fwd") fwd += v;
      else if (k == "step" || k == "post_step") step += v;
      else bwd += v;  // bwd, recompute, reduce: the rest of a micro-step
    }
  }
  struct TimeRow {
    const char* name;
    const char* key;
    double predicted_ms, measured_ms;
  };
  const TimeRow rows[] = {
      {"forward", "forward", pt["forward_ms"].number(), 1e3 * fwd},
      {"backward", "backward", pt["backward_ms"].number(), 1e3 * bwd},
      {"step", "step", pt["step_ms"].number(), 1e3 * step},
      {"iteration", "iteration", pt["iteration_ms"].number(), 1e3 * M["step_seconds"].number()},
  };
  const double psps = pt["samples_per_s"].number(), msps = M["samples_per_s"].number();
  const std::string note =
      cpu ? fmt::format("the measured backend is CPU ({}): its times come from CPU kernels and MPI, not from the {} "
                        "the prediction models, so they are not expected to match; these ratios are what "
                        "calibration will fit",
                        ju::printable(backend), ju::printable(gpu))
      : exec_time
          ? fmt::format("the measured backend is {}; predicted: the step as zeroplan's executor runs it on {} "
                        "(simulate --executor), without the DeepSpeed host work the prediction's own times price",
                        ju::printable(backend), ju::printable(gpu))
      : backend == "cuda+nccl"
          ? fmt::format("the measured backend is {}; the prediction models {} as DeepSpeed runs it (its Python on "
                        "the host, per-tensor loops), which zeroplan's executor does not do: simulate --executor cuda "
                        "predicts the executor's own step",
                        ju::printable(backend), ju::printable(gpu))
          : fmt::format("the measured backend is {}; the prediction models {} as DeepSpeed runs it (its Python on "
                        "the host, per-tensor loops) with NCCL; ranks that share a GPU and stage their collectives "
                        "through the host have no time model",
                        ju::printable(backend), ju::printable(gpu));
  t += fmt::format("\n{:<29}{:>14} {:>14} {:>20}\n", "time per optimizer step, ms", "predicted", "measured",
                   "measured/predicted");
  json jphase = json::object();
  for (const auto& r : rows) {
    const auto q = ratio(r.measured_ms, r.predicted_ms);
    t += fmt::format("  {:<26} {:>14.3f} {:>14.3f} {:>20}\n", r.name, r.predicted_ms, r.measured_ms, ratio_text(q));
    jphase[r.key] = {{"predicted_ms", r.predicted_ms}, {"measured_ms", r.measured_ms}, {"ratio", opt_json(q)}};
  }
  const auto sq = ratio(msps, psps);
  t += fmt::format("  {:<26} {:>14.1f} {:>14.1f} {:>20}\n", "samples/s", psps, msps, ratio_text(sq));
  if (timeline)
    t += fmt::format("  predicted: the simulator's device model of {}; measured: {}, phases by the simulator's\n"
                     "  definitions on the measured event times (forward and backward intervals of each micro-step,\n"
                     "  the step after the last; overlapping streams counted once)\n",
                     ju::printable(gpu), ju::printable(backend));
  else
    t += fmt::format("  predicted: the simulator's device model of {}; measured: {}, backward = bwd + recompute +\n"
                     "  reduce events of the micro-steps, step = step + post_step events\n",
                     ju::printable(gpu), ju::printable(backend));
  t += fmt::format("note: {}\n", note);
  j["time"] = {{"device", gpu},
               {"backend", backend},
               {"predicted", exec_time ? "executor" : "deepspeed"},
               {"phases", jphase},
               {"samples_per_s", {{"predicted", psps}, {"measured", msps}, {"ratio", opt_json(sq)}}},
               {"note", note}};
  j["exact_memory"] = c.exact_memory;
  j["exact_comm"] = c.exact_comm;
  return c;
}

Comparison compare(const CompareRequest& req) {
  const json p = ju::parse_file(req.predicted, io::kDocumentMaxBytes, "a prediction (simulate --json)");
  const json m = ju::parse_file(req.measured, io::kDocumentMaxBytes, "a measurement (train --out)");
  return compare_documents(p, req.predicted, m, req.measured);
}

}  // namespace zp::cli
