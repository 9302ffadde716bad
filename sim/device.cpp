#include "sim/device.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/json_util.hpp"

namespace zp::sim {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

const std::vector<std::string> kEntryKeys = {
    "name",           "aliases",         "arch",    "memory_bytes", "peak_tensor_tflops",
    "peak_fp32_tflops", "hbm_gbps",      "nvlink_gbps", "context_overhead_bytes", "cublas_workspace_bytes",
    "cublaslt_workspace_bytes", "bf16",  "source", "executor_cuda"};
const std::vector<std::string> kExecutorKeys = {"context_bytes", "library_bytes", "nccl_one_rank_bytes", "source"};
const std::vector<std::string> kExecutorOptionalKeys = {"cudnn_bytes"};
const std::vector<std::string> kRequiredKeys = {
    "name",     "arch",        "memory_bytes",           "peak_tensor_tflops", "peak_fp32_tflops",
    "hbm_gbps", "nvlink_gbps", "context_overhead_bytes", "cublas_workspace_bytes", "cublaslt_workspace_bytes",
    "bf16",     "source"};

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr double kMaxTflops = 1e6;
constexpr double kMaxGbps = 1e6;

struct Entry {
  DeviceSpec spec;
  std::vector<std::string> aliases;
};

Entry read_entry(const json::Reader& r, const json::json& e) {
  r.reject_unknown(e, kEntryKeys);
  for (const auto& k : kRequiredKeys)
    if (!e.contains(k)) throw InputError(r.file, r.key_path(k), "missing required key");
  Entry out;
  DeviceSpec& d = out.spec;
  d.name = r.get_string(e, "name", "");
  if (d.name.empty()) throw InputError(r.file, r.key_path("name"), "must be a non-empty string");
  d.arch = r.get_enum(e, "arch", "", {"volta", "ampere", "hopper", "blackwell", "cpu"});
  d.memory = Bytes{r.get_int(e, "memory_bytes", 0, 1, std::int64_t{1} << 50)};
  d.peak_tensor_flops = FlopsPerSecond{r.get_double(e, "peak_tensor_tflops", 0, 1e-6, kMaxTflops) * kTera};
  d.peak_fp32_flops = FlopsPerSecond{r.get_double(e, "peak_fp32_tflops", 0, 1e-6, kMaxTflops) * kTera};
  d.hbm_bandwidth = BytesPerSecond{r.get_double(e, "hbm_gbps", 0, 1e-6, kMaxGbps) * kGiga};
  d.nvlink_bandwidth = BytesPerSecond{r.get_double(e, "nvlink_gbps", 0, 0, kMaxGbps) * kGiga};
  d.context_overhead = Bytes{r.get_int(e, "context_overhead_bytes", 0, 0, d.memory.v)};
  d.cublas_workspace = Bytes{r.get_int(e, "cublas_workspace_bytes", 0, 0, d.memory.v)};
  d.cublaslt_workspace = Bytes{r.get_int(e, "cublaslt_workspace_bytes", 0, 0, d.memory.v)};
  d.bf16 = r.get_bool(e, "bf16", true);
  if (auto it = e.find("executor_cuda"); it != e.end()) {
    if (!it->is_object()) throw InputError(r.file, r.key_path("executor_cuda"), "must be an object");
    const json::Reader x = r.sub("executor_cuda");
    std::vector<std::string> allowed = kExecutorKeys;
    allowed.insert(allowed.end(), kExecutorOptionalKeys.begin(), kExecutorOptionalKeys.end());
    x.reject_unknown(*it, allowed);
    for (const auto& k : kExecutorKeys)
      if (!it->contains(k)) throw InputError(x.file, x.key_path(k), "missing required key");
    d.executor.measured = true;
    d.executor.context = Bytes{x.get_int(*it, "context_bytes", 0, 0, d.memory.v)};
    d.executor.libraries = Bytes{x.get_int(*it, "library_bytes", 0, 0, d.memory.v)};
    d.executor.nccl_one_rank = Bytes{x.get_int(*it, "nccl_one_rank_bytes", 0, 0, d.memory.v)};
    d.executor.nccl_measured = true;
    d.executor.cudnn_measured = it->contains("cudnn_bytes");
    if (d.executor.cudnn_measured) d.executor.cudnn = Bytes{x.get_int(*it, "cudnn_bytes", 0, 0, d.memory.v)};
    d.executor.source = x.get_string(*it, "source", "");
    if (d.executor.source.empty()) throw InputError(x.file, x.key_path("source"), "must say where the figures come from");
  }
  if (r.get_string(e, "source", "").empty())
    throw InputError(r.file, r.key_path("source"), "must say where the figures come from");
  if (auto it = e.find("aliases"); it != e.end()) {
    if (!it->is_array())
      throw InputError(r.file, r.key_path("aliases"), "must be an array of strings");
    for (std::size_t i = 0; i < it->size(); ++i) {
      const auto& a = (*it)[i];
      if (!a.is_string() || a.get<std::string>().empty())
        throw InputError(r.file, fmt::format("{}[{}]", r.key_path("aliases"), i),
                         "must be a non-empty string");
      out.aliases.push_back(a.get<std::string>());
    }
  }
  return out;
}

struct Database {
  std::vector<DeviceSpec> devices;
  std::map<std::string, std::size_t> by_key;  // lower-case name or alias -> index
};

Database load_database(const std::string& path) {
  const json::json doc = json::parse_file(path);
  const json::Reader root{path, ""};
  if (!doc.is_object()) throw InputError(path, "", "must be a JSON object with a 'devices' array");
  root.reject_unknown(doc, {"description", "devices"});
  auto it = doc.find("devices");
  if (it == doc.end() || !it->is_array() || it->empty())
    throw InputError(path, "devices", "must be a non-empty array of device objects");
  Database db;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json::Reader r{path, fmt::format("devices[{}]", i)};
    const auto& e = (*it)[i];
    if (!e.is_object()) throw InputError(path, r.path, "must be a JSON object");
    Entry entry = read_entry(r, e);
    std::vector<std::string> keys{entry.spec.name};
    keys.insert(keys.end(), entry.aliases.begin(), entry.aliases.end());
    for (const auto& k : keys) {
      if (!db.by_key.emplace(lower(k), db.devices.size()).second)
        throw InputError(path, r.path, fmt::format("name or alias '{}' is used twice", k));
    }
    db.devices.push_back(std::move(entry.spec));
  }
  return db;
}

const Database& database() {
  static const Database db = load_database(std::string(ZEROPLAN_DATA_DIR) + "/sim/devices.json");
  return db;
}

}  // namespace

// Not in the header: reads a device file other than the installed one (tests).
std::vector<DeviceSpec> load_devices(const std::string& path) { return load_database(path).devices; }

const std::vector<DeviceSpec>& devices() { return database().devices; }

const DeviceSpec& find_device(const std::string& name) {
  const Database& db = database();
  if (auto it = db.by_key.find(lower(name)); it != db.by_key.end()) return db.devices[it->second];
  std::string known;
  for (const auto& d : db.devices) known += (known.empty() ? "" : ", ") + d.name;
  throw InputError("--gpu", "", fmt::format("unknown GPU '{}'; known: {}", name, known));
}

}  // namespace zp::sim
