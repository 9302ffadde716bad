#include "calibration/profile.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/json_util.hpp"
#include "report/atomic_write.hpp"
#include "sim/device.hpp"

namespace zp::calibration {

namespace {

using CC = sim::CollectiveCoefficients;
const char* const kLevels[CC::kLevels] = {"intra", "inter"};
const char* const kAlgos[CC::kAlgos] = {"ring", "tree", "nvls", "p2p"};
const char* const kProtos[CC::kProtos] = {"ll", "ll128", "simple"};

std::vector<std::string> names(const char* const* a, int n) { return std::vector<std::string>(a, a + n); }

void read_table(const json::Reader& r, const json::json& v, CC::Table& t) {
  if (!v.is_object()) throw InputError(r.file, r.path, "must be an object {\"intra\": {...}, \"inter\": {...}}");
  r.reject_unknown(v, names(kLevels, CC::kLevels));
  for (int l = 0; l < CC::kLevels; ++l) {
    auto it = v.find(kLevels[l]);
    if (it == v.end()) continue;
    const json::Reader lr = r.sub(kLevels[l]);
    if (!it->is_object()) throw InputError(r.file, lr.path, "must be an object of algorithms (ring, tree, nvls, p2p)");
    lr.reject_unknown(*it, names(kAlgos, CC::kAlgos));
    for (int a = 0; a < CC::kAlgos; ++a) {
      auto jt = it->find(kAlgos[a]);
      if (jt == it->end()) continue;
      const json::Reader ar = lr.sub(kAlgos[a]);
      if (!jt->is_object()) throw InputError(r.file, ar.path, "must be an object of protocols (ll, ll128, simple)");
      ar.reject_unknown(*jt, names(kProtos, CC::kProtos));
      for (int p = 0; p < CC::kProtos; ++p)
        if (jt->contains(kProtos[p])) {
          const double x = ar.get_double(*jt, kProtos[p], 1, 1e-6, 1e6);
          if (!(x > 0)) throw InputError(r.file, ar.key_path(kProtos[p]), "must be a factor > 0");
          t[CC::at(l, a, p)] = x;
        }
    }
  }
}

json::json table_json(const CC::Table& t) {
  json::json out = json::json::object();
  for (int l = 0; l < CC::kLevels; ++l)
    for (int a = 0; a < CC::kAlgos; ++a)
      for (int p = 0; p < CC::kProtos; ++p) out[kLevels[l]][kAlgos[a]][kProtos[p]] = t[CC::at(l, a, p)];
  return out;
}

std::string str(const json::Reader& r, const json::json& o, const char* k) { return r.get_string(o, k, ""); }

}  // namespace

bool ClusterProfile::fitted(const std::string& prefix) const {
  for (const auto& p : parameters)
    if (p.name.rfind(prefix, 0) == 0) return true;
  return false;
}

json::json coefficients_to_json(const sim::CollectiveCoefficients& c) {
  return {{"fill_fraction", c.fill_fraction}, {"latency", table_json(c.latency)}, {"bandwidth", table_json(c.bandwidth)}};
}

json::json profile_to_json(const ClusterProfile& p) {
  json::json j;
  j["format"] = kProfileFormat;
  j["version"] = p.version;
  j["created"] = p.created;
  const ClusterInfo& c = p.cluster;
  j["cluster"] = {{"name", c.name},           {"gpu", c.gpu},           {"gpu_name", c.gpu_name},
                  {"count", c.count},         {"nodes", c.nodes},       {"gpus_per_node", c.gpus_per_node},
                  {"intra", c.intra},         {"nics_per_node", c.nics_per_node}, {"nic_gbps", c.nic_gbps},
                  {"topology", c.topology},   {"driver", c.driver},     {"cuda", c.cuda},
                  {"nccl", c.nccl},           {"deepspeed", c.deepspeed}, {"torch", c.torch},
                  {"host", c.host},           {"measured", c.measured}};
  j["device_profile"] = sim::profile_to_json(p.device);
  j["collective"] = coefficients_to_json(p.collective);
  json::json params = json::json::array();
  for (const auto& q : p.parameters)
    params.push_back({{"name", q.name}, {"unit", q.unit}, {"initial", q.initial}, {"value", q.value}, {"sd", q.sd},
                      {"status", q.status}});
  j["parameters"] = params;
  json::json refused = json::json::array();
  for (const auto& r : p.refused) refused.push_back({{"name", r.name}, {"reason", r.reason}});
  j["refused"] = refused;
  j["uncertainty"] = {{"iteration_rel_sd", p.uncertainty.iteration_rel_sd},
                      {"basis", p.uncertainty.basis},
                      {"by_class", p.uncertainty.by_class}};
  if (p.executor_memory.measured) {
    const auto& e = p.executor_memory;
    j["executor_memory"] = {{"context_bytes", e.context.v},
                            {"library_bytes", e.libraries.v},
                            {"nccl_one_rank_bytes", e.nccl_measured ? json::json(e.nccl_one_rank.v) : json::json(nullptr)},
                            {"cudnn_bytes", e.cudnn_measured ? json::json(e.cudnn.v) : json::json(nullptr)},
                            {"runs", p.executor_runs},
                            {"source", e.source}};
  }
  j["sources"] = p.sources;
  j["curves"] = p.curves;
  j["residuals"] = p.residuals;
  return j;
}

ClusterProfile profile_from_json(const std::string& file, const json::json& doc) {
  const json::Reader r{file, ""};
  if (!doc.is_object()) throw InputError(file, "", "a cluster profile is a JSON object (zeroplan calibrate --out writes one)");
  const std::string format = doc.contains("format") && doc.at("format").is_string() ? doc.at("format").get<std::string>() : "";
  if (format != kProfileFormat)
    throw InputError(file, "format",
                     fmt::format("not a zeroplan cluster profile (expected \"format\": \"{}\"; a device profile of "
                                 "sim/profiles.json is not one)",
                                 kProfileFormat));
  r.reject_unknown(doc, {"format", "version", "created", "cluster", "device_profile", "collective", "parameters", "refused",
                         "uncertainty", "executor_memory", "sources", "curves", "residuals", "description"});
  ClusterProfile p;
  p.file = file;
  if (auto it = doc.find("executor_memory"); it != doc.end()) {
    const json::Reader er = r.sub("executor_memory");
    er.require_object(*it, "executor_memory");
    er.reject_unknown(*it, {"context_bytes", "library_bytes", "nccl_one_rank_bytes", "cudnn_bytes", "runs", "source"});
    for (const char* k : {"context_bytes", "library_bytes", "nccl_one_rank_bytes", "runs"})
      if (!it->contains(k)) throw InputError(file, er.key_path(k), "missing required key");
    const std::int64_t big = std::int64_t{1} << 50;
    auto& e = p.executor_memory;
    e.measured = true;
    e.context = Bytes{er.get_int(*it, "context_bytes", 0, 0, big)};
    e.libraries = Bytes{er.get_int(*it, "library_bytes", 0, 0, big)};
    e.nccl_measured = !it->at("nccl_one_rank_bytes").is_null();
    if (e.nccl_measured) e.nccl_one_rank = Bytes{er.get_int(*it, "nccl_one_rank_bytes", 0, 0, big)};
    // Optional (a profile from before it has none): cuDNN's handle and engines, null where no
    // run used cuDNN's attention.
    e.cudnn_measured = it->contains("cudnn_bytes") && !it->at("cudnn_bytes").is_null();
    if (e.cudnn_measured) e.cudnn = Bytes{er.get_int(*it, "cudnn_bytes", 0, 0, big)};
    p.executor_runs = static_cast<int>(er.get_int(*it, "runs", 0, 1, 1 << 20));
    e.source = er.get_string(*it, "source", "");
  }
  p.version = static_cast<int>(r.get_int(doc, "version", 0, 0, 1 << 20));
  if (p.version > kProfileVersion)
    throw InputError(file, "version",
                     fmt::format("format version {} was written by a newer zeroplan; this one reads version {}", p.version,
                                 kProfileVersion));
  if (p.version < 1) throw InputError(file, "version", "must be 1");
  p.created = r.get_string(doc, "created", "");
  for (const char* k : {"cluster", "device_profile", "collective"})
    if (!doc.contains(k)) throw InputError(file, k, "missing required key");
  {
    const auto& c = doc.at("cluster");
    const json::Reader cr = r.sub("cluster");
    r.require_object(c, "cluster");
    cr.reject_unknown(c, {"name", "gpu", "gpu_name", "count", "nodes", "gpus_per_node", "intra", "nics_per_node", "nic_gbps",
                          "topology", "driver", "cuda", "nccl", "deepspeed", "torch", "host", "measured"});
    ClusterInfo& ci = p.cluster;
    ci.name = str(cr, c, "name");
    ci.gpu = str(cr, c, "gpu");
    ci.gpu_name = str(cr, c, "gpu_name");
    ci.count = static_cast<int>(cr.get_int(c, "count", 0, 0, 1 << 24));
    ci.nodes = static_cast<int>(cr.get_int(c, "nodes", 0, 0, 1 << 20));
    ci.gpus_per_node = static_cast<int>(cr.get_int(c, "gpus_per_node", 0, 0, 1 << 12));
    ci.intra = str(cr, c, "intra");
    ci.nics_per_node = static_cast<int>(cr.get_int(c, "nics_per_node", 0, 0, 1024));
    ci.nic_gbps = cr.get_double(c, "nic_gbps", 0, 0, 1e6);
    ci.topology = str(cr, c, "topology");
    ci.driver = str(cr, c, "driver");
    ci.cuda = str(cr, c, "cuda");
    ci.nccl = str(cr, c, "nccl");
    ci.deepspeed = str(cr, c, "deepspeed");
    ci.torch = str(cr, c, "torch");
    ci.host = str(cr, c, "host");
    ci.measured = str(cr, c, "measured");
  }
  p.device = sim::profile_from_json(file, "device_profile", doc.at("device_profile"));
  {
    const auto& c = doc.at("collective");
    const json::Reader cr = r.sub("collective");
    r.require_object(c, "collective");
    cr.reject_unknown(c, {"fill_fraction", "latency", "bandwidth"});
    p.collective.fill_fraction = cr.get_double(c, "fill_fraction", p.collective.fill_fraction, 0, 100);
    if (c.contains("latency")) read_table(cr.sub("latency"), c.at("latency"), p.collective.latency);
    if (c.contains("bandwidth")) read_table(cr.sub("bandwidth"), c.at("bandwidth"), p.collective.bandwidth);
  }
  if (auto it = doc.find("parameters"); it != doc.end()) {
    if (!it->is_array()) throw InputError(file, "parameters", "must be an array");
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json::Reader pr = r.sub(fmt::format("parameters[{}]", i));
      const auto& e = (*it)[i];
      if (!e.is_object()) throw InputError(file, pr.path, "must be an object");
      pr.reject_unknown(e, {"name", "unit", "initial", "value", "sd", "status"});
      ProfileParam q;
      q.name = pr.get_string(e, "name", "");
      q.unit = pr.get_string(e, "unit", "");
      q.status = pr.get_string(e, "status", "fitted");
      q.initial = pr.get_double(e, "initial", 0, -1e30, 1e30);
      q.value = pr.get_double(e, "value", 0, -1e30, 1e30);
      q.sd = pr.get_double(e, "sd", 0, 0, 1e30);
      p.parameters.push_back(q);
    }
  }
  if (auto it = doc.find("refused"); it != doc.end() && it->is_array())
    for (const auto& e : *it)
      if (e.is_object()) p.refused.push_back({e.value("name", ""), e.value("reason", "")});
  if (auto it = doc.find("uncertainty"); it != doc.end()) {
    const json::Reader ur = r.sub("uncertainty");
    r.require_object(*it, "uncertainty");
    ur.reject_unknown(*it, {"iteration_rel_sd", "basis", "by_class"});
    p.uncertainty.iteration_rel_sd = ur.get_double(*it, "iteration_rel_sd", 0, 0, 100);
    p.uncertainty.basis = ur.get_string(*it, "basis", "");
    if (auto b = it->find("by_class"); b != it->end() && b->is_object())
      for (const auto& [k, v] : b->items())
        if (v.is_number()) p.uncertainty.by_class[k] = v.get<double>();
  }
  for (const char* k : {"sources", "curves", "residuals"})
    if (doc.contains(k)) {
      if (!doc.at(k).is_array()) throw InputError(file, k, "must be an array");
      (k == std::string("sources") ? p.sources : k == std::string("curves") ? p.curves : p.residuals) = doc.at(k);
    }
  return p;
}

ClusterProfile load_cluster_profile(const std::string& path) {
  return profile_from_json(path, json::parse_file(path));
}

void write_cluster_profile(const ClusterProfile& p, const std::string& path) {
  report::write_file_atomically(path, profile_to_json(p).dump(1) + "\n", "--out");
}

std::string device_for_gpu_name(const std::string& gpu_name) {
  if (gpu_name.empty()) return "";
  try {
    return sim::find_device(gpu_name).name;
  } catch (const InputError&) {
  }
  std::string s = gpu_name;
  for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  auto has = [&](const char* x) { return s.find(x) != std::string::npos; };
  if (has("H200")) return "H200-141GB";
  if (has("H100")) return "H100-80GB";
  if (has("A100")) return has("40GB") ? "A100-40GB" : "A100-80GB";
  if (has("V100")) return has("32GB") ? "V100-32GB" : "V100-16GB";
  return "";
}

std::vector<std::string> compatibility_warnings(const ClusterProfile& p, const sim::ClusterSpec& planned, int world_size,
                                                const std::string& local_nccl) {
  std::vector<std::string> w;
  const ClusterInfo& c = p.cluster;
  const std::string f = p.file.empty() ? "--profile" : p.file;
  if (!c.gpu.empty() && c.gpu != planned.gpu)
    w.push_back(fmt::format("{}: measured on {} GPUs, planned on {}: its efficiencies and host costs may not transfer "
                            "(the planned GPU's peaks are used)",
                            f, c.gpu, planned.gpu));
  const bool intra_fit = p.fitted("collective.intra");
  const bool inter_fit = p.fitted("collective.inter");
  if (intra_fit && !c.intra.empty() && c.intra != sim::intra_node_name(planned.intra))
    w.push_back(fmt::format("{}: its intra-node collective factors were fitted on {} nodes, the planned cluster's nodes "
                            "are {}",
                            f, c.intra, sim::intra_node_name(planned.intra)));
  if (intra_fit && c.gpus_per_node > 0 && c.gpus_per_node != planned.gpus_per_node)
    w.push_back(fmt::format("{}: measured on nodes of {} GPUs, planned on nodes of {}", f, c.gpus_per_node,
                            planned.gpus_per_node));
  const bool spans = world_size > planned.gpus_per_node;
  if (inter_fit && spans && c.nic_gbps > 0 &&
      (c.nic_gbps != planned.nic_gbps || c.nics_per_node != planned.nics_per_node))
    w.push_back(fmt::format("{}: its inter-node factors were fitted on {} x {:g} Gb/s NICs per node, the planned cluster "
                            "has {} x {:g} Gb/s",
                            f, c.nics_per_node, c.nic_gbps, planned.nics_per_node, planned.nic_gbps));
  if (spans && !inter_fit)
    w.push_back(fmt::format("{}: its measurements stayed inside one node (collective.inter.* not fitted): communication "
                            "across the planned {} nodes uses the model's defaults",
                            f, (world_size + planned.gpus_per_node - 1) / planned.gpus_per_node));
  const std::string& here = local_nccl;
  if (!here.empty() && !c.nccl.empty() && here != c.nccl)
    w.push_back(fmt::format("{}: measured with NCCL {}, this machine has NCCL {}: collective timings may differ", f, c.nccl,
                            here));
  return w;
}

void apply_profile(const ClusterProfile& p, const sim::DeviceSpec& dev, sim::DeviceProfile& profile,
                   sim::ClusterSpec& cluster) {
  profile = p.device;
  profile.device = dev.name;
  profile.peak_tensor_flops = dev.peak_tensor_flops;
  profile.peak_fp32_flops = dev.peak_fp32_flops;
  profile.hbm_bandwidth = dev.hbm_bandwidth;
  profile.source = fmt::format("cluster profile {}", p.file.empty() ? p.cluster.name : p.file);
  cluster.collective = p.collective;
}

}  // namespace zp::calibration
