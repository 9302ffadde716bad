// Kernel and collective observations saved as JSON and read back (`calibrate
// --save-observations` / `--observations`): the device's micro-benchmarks, measured once on
// the GPU machine, refitted anywhere. Read as strictly as every other source: an unknown key,
// a bad class or dtype, a NaN or negative time is one line naming the file and the key.
#include <cmath>

#include <fmt/format.h>

#include "calibration/sources.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"

namespace zp::calibration {

namespace {

constexpr const char* kFormat = "zeroplan-observations";
constexpr int kVersion = 1;

// The name → value of an enum whose names `name_of` gives, over values 0..n-1.
template <typename E, typename F>
E enum_of(const json::Reader& r, const json::json& obj, const char* key, int n, F name_of) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.emplace_back(name_of(static_cast<E>(i)));
  const std::string v = r.get_enum(obj, key, "", names);
  for (int i = 0; i < n; ++i)
    if (names[static_cast<std::size_t>(i)] == v) return static_cast<E>(i);
  throw InputError(r.file, r.key_path(key), "missing required key");
}

constexpr int kNumKernelClasses = static_cast<int>(KernelClass::reduction) + 1;
constexpr int kNumDTypes = static_cast<int>(DType::i64) + 1;

}  // namespace

json::json observations_to_json(const Dataset& data, int* left_out) {
  json::json obs = json::json::array();
  int skipped = 0;
  for (const Observation& o : data.obs) {
    // Phases and the events of a training run belong to their runs: their files are the record.
    if (o.kind == ObsKind::phase || (o.kind == ObsKind::kernel && o.kernel.run >= 0)) {
      ++skipped;
      continue;
    }
    json::json j = {{"kind", obs_kind_name(o.kind)},
                    {"source", o.source},
                    {"label", o.label},
                    {"seconds", o.measured.v},
                    {"spread", o.spread},
                    {"repeats", o.repeats},
                    {"tags", o.tags}};
    if (o.kind == ObsKind::kernel) {
      const KernelSample& k = o.kernel;
      json::json gemms = json::json::array();
      for (const auto& g : k.gemms) {
        json::json one = {g.m, g.n, g.k, g.batch};
        if (g.bias) one.push_back(1);
        gemms.push_back(one);
      }
      j["class"] = kernel_class_name(k.cls);
      j["name"] = k.name;
      j["gemms"] = gemms;
      j["flops"] = k.flops.v;
      j["bytes"] = k.bytes.v;
      j["dtype"] = std::string(dtype_name(k.dtype));
      j["backward"] = k.backward;
      j["tf32"] = k.tf32;
      if (k.cudnn_attention) j["cudnn_attention"] = true;
      if (k.padded_rows) j["padded_rows"] = true;
      if (k.op_kind) j["op_kind"] = models::op_kind_name(*k.op_kind);
      if (k.dropout > 0) j["dropout"] = k.dropout;
      if (k.pieces > 1) j["pieces"] = k.pieces;
      if (k.copy_kernel != zero::CopyKernel::memcpy) j["copy_kernel"] = zero::copy_kernel_name(k.copy_kernel);
      if (k.host_bound) j["host_bound"] = true;
      if (k.optimizer) j["optimizer"] = true;
      if (k.reduce_bytes.v > 0) j["reduce_bytes"] = k.reduce_bytes.v;
    }
    if (o.kind == ObsKind::collective || (o.kind == ObsKind::kernel && o.kernel.cls == KernelClass::collective)) {
      const CollectiveSample& c = o.coll;
      j["collective"] = {{"kind", zero::coll_kind_name(c.kind)}, {"ranks", c.ranks},       {"nodes", c.nodes},
                         {"ranks_per_node", c.ranks_per_node},   {"bytes", c.bytes.v},     {"dtype", c.dtype},
                         {"group", c.group}};
    }
    obs.push_back(std::move(j));
  }
  if (left_out != nullptr) *left_out = skipped;
  const Environment& e = data.env;
  return {{"format", kFormat},
          {"version", kVersion},
          {"environment",
           {{"gpu_name", e.gpu_name}, {"gpu_count", e.gpu_count}, {"nodes", e.nodes}, {"driver", e.driver},
            {"cuda", e.cuda}, {"nccl", e.nccl}, {"deepspeed", e.deepspeed}, {"torch", e.torch}, {"host", e.host},
            {"date", e.date}}},
          {"observations", std::move(obs)}};
}

Dataset read_observations(const std::string& path) {
  const json::json doc = json::parse_file(path, std::int64_t{256} << 20);
  const json::Reader root{path, ""};
  root.require_object(doc, "");
  if (doc.value("format", std::string()) != kFormat)
    throw InputError(path, "format", fmt::format("not a saved observations file (expected \"{}\", written by calibrate "
                                                 "--save-observations)",
                                                 kFormat));
  root.reject_unknown(doc, {"format", "version", "environment", "observations"});
  const std::int64_t version = root.get_int(doc, "version", 0, 1, 1 << 20);
  if (version != kVersion)
    throw InputError(path, "version", fmt::format("version {} is not one this zeroplan reads (it reads {})", version, kVersion));
  Dataset ds;
  ds.files.push_back(path);
  if (doc.contains("environment")) {
    const json::Reader er = root.sub("environment");
    const auto& e = doc.at("environment");
    er.require_object(e, "");
    er.reject_unknown(e, {"gpu_name", "gpu_count", "nodes", "driver", "cuda", "nccl", "deepspeed", "torch", "host", "date"});
    Environment& env = ds.env;
    env.gpu_name = er.get_string(e, "gpu_name", "");
    env.gpu_count = static_cast<int>(er.get_int(e, "gpu_count", 0, 0, 1 << 20));
    env.nodes = static_cast<int>(er.get_int(e, "nodes", 0, 0, 1 << 20));
    env.driver = er.get_string(e, "driver", "");
    env.cuda = er.get_string(e, "cuda", "");
    env.nccl = er.get_string(e, "nccl", "");
    env.deepspeed = er.get_string(e, "deepspeed", "");
    env.torch = er.get_string(e, "torch", "");
    env.host = er.get_string(e, "host", "");
    env.date = er.get_string(e, "date", "");
    for (const char* k : {"gpu_name", "driver", "cuda", "nccl", "deepspeed", "torch", "host", "date"}) env.origin[k] = path;
  }
  const auto it = doc.find("observations");
  if (it == doc.end() || !it->is_array()) throw InputError(path, "observations", "must be an array");
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json::Reader r = root.sub(fmt::format("observations[{}]", i));
    const auto& j = (*it)[i];
    r.require_object(j, "");
    r.reject_unknown(j, {"kind", "source", "label", "seconds", "spread", "repeats", "tags", "class", "name", "gemms",
                         "flops", "bytes", "dtype", "backward", "tf32", "cudnn_attention", "padded_rows", "op_kind", "dropout", "pieces", "copy_kernel", "host_bound", "optimizer", "reduce_bytes", "collective"});
    Observation o;
    o.kind = enum_of<ObsKind>(r, j, "kind", 2, obs_kind_name);  // collective, kernel (phases belong to runs)
    o.source = r.get_string(j, "source", path);
    o.label = r.get_string(j, "label", "");
    if (!j.contains("seconds") || !j.at("seconds").is_number())
      throw InputError(path, r.key_path("seconds"), "must be a number of seconds");
    o.measured = Seconds{j.at("seconds").get<double>()};
    if (!std::isfinite(o.measured.v) || o.measured.v <= 0)
      throw InputError(path, r.key_path("seconds"), fmt::format("must be a positive time, got {}", j.at("seconds").dump()));
    o.spread = r.get_double(j, "spread", 0, 0, 1e6);
    o.repeats = static_cast<int>(r.get_int(j, "repeats", 1, 1, 1 << 30));
    if (j.contains("tags")) {
      const auto& t = j.at("tags");
      r.require_object(t, "tags");
      for (const auto& [k, v] : t.items()) {
        if (!v.is_string()) throw InputError(path, r.sub("tags").key_path(k), "must be a string");
        o.tags[k] = v.get<std::string>();
      }
    }
    bool coll = o.kind == ObsKind::collective;
    if (o.kind == ObsKind::kernel) {
      KernelSample& k = o.kernel;
      k.cls = enum_of<KernelClass>(r, j, "class", kNumKernelClasses, kernel_class_name);
      k.name = r.get_string(j, "name", "");
      if (j.contains("gemms")) {
        const auto& gs = j.at("gemms");
        if (!gs.is_array())
          throw InputError(path, r.key_path("gemms"), "must be an array of [m, n, k, batch] or [m, n, k, batch, bias]");
        for (std::size_t g = 0; g < gs.size(); ++g) {
          const auto& a = gs[g];
          bool ok = a.is_array() && (a.size() == 4 || a.size() == 5);
          for (std::size_t d = 0; ok && d < 4; ++d) ok = a[d].is_number_integer() && a[d].get<std::int64_t>() > 0;
          if (ok && a.size() == 5) ok = a[4].is_number_integer() && (a[4].get<std::int64_t>() == 0 || a[4].get<std::int64_t>() == 1);
          if (!ok)
            throw InputError(path, r.key_path(fmt::format("gemms[{}]", g)),
                             "must be [m, n, k, batch] (positive integers), then optionally bias: 1 (the layer adds a bias) or 0");
          k.gemms.push_back({a[0].get<std::int64_t>(), a[1].get<std::int64_t>(), a[2].get<std::int64_t>(),
                             a[3].get<std::int64_t>(), a.size() == 5 && a[4].get<std::int64_t>() == 1});
        }
      }
      k.flops = Flops{r.get_double(j, "flops", 0, 0, 1e30)};
      k.bytes = Bytes{r.get_int(j, "bytes", 0, 0, std::int64_t{1} << 62)};
      k.dtype = enum_of<DType>(r, j, "dtype", kNumDTypes, [](DType d) { return std::string(dtype_name(d)); });
      k.backward = r.get_bool(j, "backward", false);
      k.tf32 = r.get_bool(j, "tf32", false);
      k.cudnn_attention = r.get_bool(j, "cudnn_attention", false);
      k.padded_rows = r.get_bool(j, "padded_rows", false);
      if (j.contains("op_kind")) k.op_kind = models::op_kind_from_name(r.get_enum(j, "op_kind", "", models::op_kind_names()));
      k.dropout = r.get_double(j, "dropout", 0, 0, 1);
      k.pieces = r.get_int(j, "pieces", 1, 1, std::int64_t{1} << 40);
      k.reduce_bytes = Bytes{r.get_int(j, "reduce_bytes", 0, 0, std::int64_t{1} << 62)};
      if (j.contains("copy_kernel"))
        k.copy_kernel = *zero::copy_kernel_from_name(r.get_enum(j, "copy_kernel", "", zero::copy_kernel_names()));
      k.host_bound = r.get_bool(j, "host_bound", false);
      k.optimizer = r.get_bool(j, "optimizer", false);
      coll = k.cls == KernelClass::collective;
      if (k.cls == KernelClass::gemm && k.gemms.empty())
        throw InputError(path, r.key_path("gemms"), "a GEMM observation needs its shapes");
    }
    if (coll) {
      if (!j.contains("collective")) throw InputError(path, r.key_path("collective"), "missing required key");
      const json::Reader cr = r.sub("collective");
      const auto& c = j.at("collective");
      cr.require_object(c, "");
      cr.reject_unknown(c, {"kind", "ranks", "nodes", "ranks_per_node", "bytes", "dtype", "group"});
      CollectiveSample& s = o.coll;
      s.kind = enum_of<zero::CollKind>(cr, c, "kind", zero::kNumCollKinds, zero::coll_kind_name);
      s.ranks = static_cast<int>(cr.get_int(c, "ranks", 0, 2, 1 << 24));
      s.nodes = static_cast<int>(cr.get_int(c, "nodes", 1, 1, 1 << 24));
      s.ranks_per_node = static_cast<int>(cr.get_int(c, "ranks_per_node", 0, 0, 1 << 24));
      s.bytes = Bytes{cr.get_int(c, "bytes", 0, 0, std::int64_t{1} << 62)};
      s.dtype = cr.get_string(c, "dtype", "");
      if (c.contains("group")) {
        const auto& g = c.at("group");
        if (!g.is_array()) throw InputError(path, cr.key_path("group"), "must be an array of ranks");
        for (const auto& x : g) {
          if (!x.is_number_integer() || x.get<std::int64_t>() < 0)
            throw InputError(path, cr.key_path("group"), "must be an array of non-negative ranks");
          s.group.push_back(x.get<int>());
        }
      }
    }
    ds.obs.push_back(std::move(o));
  }
  if (ds.obs.empty()) throw InputError(path, "observations", "holds no observation");
  return ds;
}

void save_observations(const Dataset& data, const std::string& path, const std::string& flag, int* left_out) {
  io::write_atomic(path, observations_to_json(data, left_out).dump(1) + "\n", flag);
}

}  // namespace zp::calibration
