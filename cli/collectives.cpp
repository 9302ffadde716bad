#include "cli/collectives.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <unistd.h>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "exec/device.hpp"
#include "exec/device_cuda.hpp"
#include "sim/collective_model.hpp"

namespace zp::cli {

namespace {

using zero::CollKind;

constexpr std::int64_t kFloatBytes = 4;  // nccl-tests' default type
constexpr std::size_t kMaxSizes = 10000;
constexpr double kGiga = 1e9;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string strip_underscores(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  return s;
}

const char* redop(CollKind k) {
  return k == CollKind::all_reduce || k == CollKind::reduce || k == CollKind::reduce_scatter ? "sum" : "none";
}

int root(CollKind k) { return k == CollKind::broadcast || k == CollKind::reduce ? 0 : -1; }

// nccl-tests' element count for a size: per rank for the collectives whose buffers are
// split across ranks, rounded down to 16 bytes as nccl-tests aligns them.
struct Shape {
  std::int64_t count = 0;  // elements, as nccl-tests prints
  Bytes bytes{};           // S: the logical buffer the collective moves
};

Shape shape(CollKind k, Bytes size, int n) {
  Shape s;
  if (k == CollKind::all_gather || k == CollKind::reduce_scatter || k == CollKind::all_to_all) {
    const std::int64_t per_rank = size.v / kFloatBytes / n;
    s.count = per_rank & ~std::int64_t{16 / kFloatBytes - 1};
    s.bytes = Bytes{s.count * n * kFloatBytes};
  } else {
    s.count = size.v / kFloatBytes;
    s.bytes = Bytes{s.count * kFloatBytes};
  }
  return s;
}

// nccl-tests prints a number in a fixed width with as many decimals as fit.
std::string fit(double v, int width) {
  for (int decimals : {2, 1, 0}) {
    std::string s = fmt::format("{:{}.{}f}", v, width, decimals);
    if (static_cast<int>(s.size()) <= width) return s;
  }
  return fmt::format("{:{}.1e}", v, width);
}

struct Row {
  Shape shape;
  sim::CollectiveCost cost;
};

struct Sweep {
  int ranks = 0;
  int nodes = 0;
  std::vector<Bytes> sizes;
  std::vector<std::pair<CollKind, std::vector<Row>>> blocks;
};

Sweep run(const sim::ClusterSpec& c, int ranks, Bytes min, Bytes max, double factor, const std::vector<CollKind>& kinds) {
  if (ranks < 1 || ranks > c.world_size())
    throw InputError("--ranks", "",
                     fmt::format("must be in [1, {}] (cluster '{}' has {} GPUs), got {}", c.world_size(), c.name,
                                 c.world_size(), ranks));
  if (kinds.empty()) throw InputError("--ops", "", "no collective to sweep");
  Sweep sw;
  sw.ranks = ranks;
  sw.nodes = (ranks + c.gpus_per_node - 1) / c.gpus_per_node;
  sw.sizes = sweep_sizes(min, max, factor);
  const sim::CollectiveModel model(c);
  std::vector<int> group(static_cast<std::size_t>(ranks));
  for (int i = 0; i < ranks; ++i) group[static_cast<std::size_t>(i)] = i;
  for (CollKind k : kinds) {
    std::vector<Row> rows;
    for (Bytes s : sw.sizes) {
      Row r;
      r.shape = shape(k, s, ranks);
      r.cost = model.cost(k, group, r.shape.bytes);
      rows.push_back(r);
    }
    sw.blocks.emplace_back(k, std::move(rows));
  }
  return sw;
}

std::string algorithm(const sim::CollectiveCost& c) {
  if (c.measured) return "measured";
  if (c.time.v == 0) return "-";
  return fmt::format("{}/{}", sim::algo_name(c.algo), sim::proto_name(c.proto));
}

double avg_busbw(const std::vector<Row>& rows) {
  double sum = 0;
  for (const auto& r : rows) sum += r.cost.busbw.v;
  return rows.empty() ? 0 : sum / static_cast<double>(rows.size()) / kGiga;
}

}  // namespace

Bytes parse_size(const std::string& flag, const std::string& text) {
  const auto bad = [&] {
    return InputError(flag, "", fmt::format("expected a size like 8, 1K, 128M or 1G (binary units), got '{}'", text));
  };
  std::string s = text;
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char ch) { return std::isspace(ch); }), s.end());
  if (s.empty()) throw bad();
  if (s.size() > 1 && (s.back() == 'B' || s.back() == 'b')) s.pop_back();  // "8B", "1KB", "1MiB"
  if (s.size() > 2 && (s.back() == 'i' || s.back() == 'I')) s.pop_back();
  double unit = 1;
  switch (std::tolower(static_cast<unsigned char>(s.back()))) {
    case 'k': unit = 1024.0; break;
    case 'm': unit = 1024.0 * 1024; break;
    case 'g': unit = 1024.0 * 1024 * 1024; break;
    case 't': unit = 1024.0 * 1024 * 1024 * 1024; break;
    default: break;
  }
  if (unit != 1) s.pop_back();
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) throw bad();
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    throw bad();
  }
  if (used != s.size() || !std::isfinite(v) || v < 0) throw bad();
  const double bytes = v * unit;
  if (bytes != std::floor(bytes) || bytes > 9.0e18)
    throw InputError(flag, "", fmt::format("'{}' is not a whole number of bytes", text));
  return Bytes{static_cast<std::int64_t>(bytes)};
}

std::vector<zero::CollKind> parse_coll_kinds(const std::string& flag, const std::string& text) {
  std::vector<CollKind> all;
  for (int k = 0; k < zero::kNumCollKinds; ++k) all.push_back(static_cast<CollKind>(k));
  if (lower(text) == "all") return all;
  std::vector<CollKind> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = text.find(',', pos);
    std::string tok = lower(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (tok.size() > 5 && tok.compare(tok.size() - 5, 5, "_perf") == 0) tok.resize(tok.size() - 5);
    bool found = false;
    for (CollKind k : all) {
      if (strip_underscores(tok) == strip_underscores(zero::coll_kind_name(k))) {
        if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
        found = true;
      }
    }
    if (!found) {
      std::string names;
      for (CollKind k : all) names += fmt::format("{}{}", names.empty() ? "" : ", ", zero::coll_kind_name(k));
      throw InputError(flag, "", fmt::format("unknown collective '{}'; expected all or a comma-separated list of {}", tok, names));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::vector<Bytes> sweep_sizes(Bytes min, Bytes max, double factor) {
  if (min.v < 1) throw InputError("--min", "", fmt::format("must be at least 1 byte, got {}", min.v));
  if (max < min) throw InputError("--max", "", fmt::format("must be >= --min ({} bytes), got {}", min.v, max.v));
  if (!(factor > 1) || !std::isfinite(factor))
    throw InputError("--factor", "", fmt::format("must be a number > 1, got {}", factor));
  std::vector<Bytes> out;
  double s = static_cast<double>(min.v);
  while (s <= static_cast<double>(max.v) * (1 + 1e-12)) {
    const Bytes b{static_cast<std::int64_t>(std::llround(s))};
    if (out.empty() || b > out.back()) out.push_back(b);
    if (out.size() > kMaxSizes)
      throw InputError("--factor", "", fmt::format("{} gives more than {} sizes between --min and --max", factor, kMaxSizes));
    s *= factor;
  }
  return out;
}

std::string collectives_table(const sim::ClusterSpec& cluster, int ranks, Bytes min, Bytes max, double factor,
                              const std::vector<zero::CollKind>& kinds) {
  const Sweep sw = run(cluster, ranks, min, max, factor, kinds);
  std::string out;
  out += fmt::format("# zeroplan collectives: predicted by the model, not measured\n");
  out += fmt::format("# cluster {}: {}\n", cluster.name, sim::describe_cluster(cluster));
  out += fmt::format("# ranks {} on {} node{}  minBytes {} maxBytes {} factor {:g}  type float\n", sw.ranks, sw.nodes,
                     sw.nodes == 1 ? "" : "s", min.v, max.v, factor);
  for (const auto& [kind, rows] : sw.blocks) {
    out += "#\n";
    out += fmt::format("# Collective: {}\n", zero::coll_kind_name(kind));
    out += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {}\n", "size", "count", "type", "redop",
                       "root", "time", "algbw", "busbw", "algorithm");
    out += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}\n", "(B)", "(elements)", "", "", "",
                       "(us)", "(GB/s)", "(GB/s)");
    for (const auto& r : rows) {
      out += fmt::format("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}  {}  {}\n", r.shape.bytes.v, r.shape.count, "float",
                         redop(kind), root(kind), fit(r.cost.time.us(), 7), fit(r.cost.algbw.v / kGiga, 6),
                         fit(r.cost.busbw.v / kGiga, 6), algorithm(r.cost));
    }
    out += fmt::format("# Avg bus bandwidth    : {:.3f}\n", avg_busbw(rows));
  }
  return out;
}

nlohmann::json collectives_json(const sim::ClusterSpec& cluster, int ranks, Bytes min, Bytes max, double factor,
                                const std::vector<zero::CollKind>& kinds) {
  const Sweep sw = run(cluster, ranks, min, max, factor, kinds);
  nlohmann::json j;
  j["predicted"] = true;
  j["cluster"] = {{"name", cluster.name},
                  {"description", sim::describe_cluster(cluster)},
                  {"gpu", cluster.gpu},
                  {"nodes", cluster.nodes},
                  {"gpus_per_node", cluster.gpus_per_node},
                  {"intra", sim::intra_node_name(cluster.intra)}};
  j["ranks"] = sw.ranks;
  j["nodes_spanned"] = sw.nodes;
  j["min_bytes"] = min.v;
  j["max_bytes"] = max.v;
  j["factor"] = factor;
  j["type"] = "float";
  nlohmann::json blocks = nlohmann::json::array();
  for (const auto& [kind, rows] : sw.blocks) {
    nlohmann::json rj = nlohmann::json::array();
    for (const auto& r : rows) {
      rj.push_back({{"size_bytes", r.shape.bytes.v},
                    {"count", r.shape.count},
                    {"time_us", r.cost.time.us()},
                    {"algbw_gbps", r.cost.algbw.v / kGiga},
                    {"busbw_gbps", r.cost.busbw.v / kGiga},
                    {"algorithm", r.cost.time.v == 0 ? "-" : sim::algo_name(r.cost.algo)},
                    {"protocol", r.cost.time.v == 0 ? "-" : sim::proto_name(r.cost.proto)},
                    {"measured", r.cost.measured}});
    }
    blocks.push_back({{"collective", zero::coll_kind_name(kind)},
                      {"redop", redop(kind)},
                      {"root", root(kind)},
                      {"avg_busbw_gbps", avg_busbw(rows)},
                      {"rows", std::move(rj)}});
  }
  j["collectives"] = std::move(blocks);
  return j;
}

}  // namespace zp::cli

// ------------------------------------------------------------------ measured
namespace zp::cli {

namespace {

struct Measured {
  Shape shape;
  double seconds = 0;  // per call, the mean over ranks
  sim::CollectiveCost predicted;
};

// nccl-tests' bus bandwidth of a measured row, GB/s.
double busbw_gbps(CollKind k, int n, const Measured& m) {
  return static_cast<double>(m.shape.bytes.v) / m.seconds * sim::CollectiveModel::busbw_factor(k, n) / kGiga;
}

std::string nccl_tests_text(const std::vector<std::pair<CollKind, std::vector<Measured>>>& blocks,
                            const std::vector<std::string>& rank_lines, const std::string& backend, int n, Bytes min,
                            Bytes max, double factor, int warmup, int iters) {
  std::string t;
  t += fmt::format("# zeroplan collectives --measure through its {} communicator (nccl-tests' output format; not "
                   "nccl-tests)\n",
                   backend);
  // The NCCL version as NCCL_DEBUG=INFO prints it, which calibrate reads.
  if (const std::string v = exec::nccl_version(); backend == "nccl" && !v.empty()) t += fmt::format("# NCCL INFO NCCL version {}\n", v);
  for (const auto& [kind, rows] : blocks) {
    const std::string test = fmt::format("{}_perf", zero::coll_kind_name(kind));
    t += fmt::format("# Collective test starting: {}\n", test);
    t += fmt::format("# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {:g}(factor) warmup iters: {} iters: {} agg iters: 1 "
                     "validation: 0 graph: 0\n#\n# Using devices\n",
                     min.v, max.v, factor, warmup, iters);
    for (const auto& l : rank_lines) t += l + "\n";
    t += "#\n";
    t += "#       size         count      type   redop    root     time   algbw   busbw  #wrong\n";
    t += "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        \n";
    double sum = 0;
    for (const auto& m : rows) {
      const double algbw = static_cast<double>(m.shape.bytes.v) / m.seconds / kGiga, busbw = busbw_gbps(kind, n, m);
      sum += busbw;
      t += fmt::format("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}  {}  {:>6}\n", m.shape.bytes.v, m.shape.count, "float",
                       redop(kind), root(kind), fit(m.seconds * 1e6, 7), fit(algbw, 6), fit(busbw, 6), "N/A");
    }
    t += "# Out of bounds values : 0 OK\n";
    t += fmt::format("# Avg bus bandwidth    : {:.5f}\n#\n", rows.empty() ? 0.0 : sum / static_cast<double>(rows.size()));
    t += fmt::format("# Collective test concluded: {}\n", test);
  }
  return t;
}

}  // namespace



std::string measure_collectives(exec::Comm& boot, const sim::ClusterSpec& cluster, Bytes min, Bytes max, double factor,
                                const std::vector<zero::CollKind>& kinds, const MeasureOptions& o) {
  const int n = boot.size(), rank = boot.rank();
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    throw InputError("--device", "", fmt::format("must be auto, cpu or cuda, got '{}'", o.device));
  if (o.iters < 1) throw InputError("--iters", "", fmt::format("must be >= 1, got {}", o.iters));
  if (o.warmup < 0) throw InputError("--warmup", "", fmt::format("must be >= 0, got {}", o.warmup));
  if (!(o.timeout_s > 0)) throw InputError("--comm-timeout", "", fmt::format("must be > 0 seconds, got {}", o.timeout_s));
  if (n < 2)
    throw InputError("--measure", "",
                     "one rank: a collective of one rank moves nothing; launch it with mpirun -np N (N >= 2), one rank "
                     "per GPU");
  if (n > cluster.world_size())
    throw InputError("--cluster", "", fmt::format("'{}' has {} GPUs, this job {} ranks: give the cluster the job runs on",
                                                  cluster.name, cluster.world_size(), n));
  for (CollKind k : kinds)
    if (k == CollKind::all_to_all)
      throw InputError("--ops", "", "all_to_all is not a collective zeroplan's communicators run (ZeRO does not use it)");
  const std::vector<Bytes> sizes = sweep_sizes(min, max, factor);
  // The device: what rank 0 sees decides for `auto`; every rank must see the same.
  bool cuda = o.device == "cuda" || (o.device == "auto" && exec::cuda_devices_visible() > 0);
  {
    const auto seen = boot.gather_for_report(cuda ? "1" : "0");
    if (std::any_of(seen.begin(), seen.end(), [&](const std::string& v) { return v != seen.front(); }))
      throw InputError("--device", "", "auto: some ranks see a GPU and some do not; give --device cuda or --device cpu");
  }
  if (cuda && !exec::cuda_device_built())
    throw InputError("--device", "", "cuda: this zeroplan was built without CUDA (no toolkit at configure time)");
  if (cuda && !exec::nccl_built())
    throw InputError("--device", "", "cuda: this zeroplan was built without NCCL (nccl.h not found at configure time)");

  // Where each rank runs; NCCL refuses two ranks on one GPU of one host (unless each names
  // its own NCCL_HOSTID, and then it talks over sockets between them).
  std::unique_ptr<exec::Device> device;
  std::string gpu_name, bus;
  int ordinal = -1;
  if (cuda) {
    exec::CudaDeviceOptions co;
    co.local_rank = exec::local_rank(rank);
    std::string refused;
    try {
      device = exec::make_cuda_device(co);
      gpu_name = exec::driver_memory(device.get()).gpu;
      bus = exec::cuda_bus_id(*device);
      ordinal = exec::cuda_ordinal(*device);
    } catch (const std::runtime_error& e) {
      refused = e.what();
    }
    exec::agree_on_refusals(boot, refused, "its GPU");  // a rank with no usable GPU stops every rank
  }
  const char* hostid_env = std::getenv("NCCL_HOSTID");
  const std::string hostid = hostid_env ? hostid_env : "";
  const auto where = boot.gather_for_report(
      fmt::format("{}|{}|{}|{}|{}|{}", exec::host_name(), bus, hostid, ordinal, ::getpid(), gpu_name));
  std::vector<std::string> rank_lines;
  std::vector<std::string> hosts;
  bool shared_gpu = false;
  std::vector<std::vector<std::string>> fields;
  for (const auto& w : where) {
    std::vector<std::string> f;
    std::size_t at = 0;
    for (int k = 0; k < 5; ++k) {
      const std::size_t bar = w.find('|', at);
      f.push_back(w.substr(at, bar - at));
      at = bar + 1;
    }
    f.push_back(w.substr(at));  // the GPU's name (may hold anything but comes last)
    fields.push_back(std::move(f));
  }
  for (int r = 0; r < n; ++r) {
    const auto& f = fields[static_cast<std::size_t>(r)];
    if (std::find(hosts.begin(), hosts.end(), f[0]) == hosts.end()) hosts.push_back(f[0]);
    for (int q = 0; q < r && cuda; ++q) {
      const auto& g = fields[static_cast<std::size_t>(q)];
      if (g[0] != f[0] || g[1] != f[1]) continue;
      if (g[2] == f[2])
        throw InputError("--device", "",
                         fmt::format("ranks {} and {} share GPU {} on {}: NCCL needs a GPU per rank (or an NCCL_HOSTID per "
                                     "rank); --device cpu measures MPI between host buffers",
                                     q, r, f[1], f[0]));
      shared_gpu = true;
    }
    rank_lines.push_back(fmt::format("#  Rank {:2d} Group  0 Pid {:>6} on {} device {:>2} [{}] {}", r, f[4], f[0],
                                     cuda ? f[3] : "-1", cuda ? f[1] : "host", cuda ? f[5] : "CPU"));
  }
  std::unique_ptr<exec::Comm> nccl;
  if (cuda) {
    zero::Group world;
    world.name = "world";
    for (int r = 0; r < n; ++r) world.ranks.push_back(r);
    exec::NcclOptions no;
    no.timeout_s = o.timeout_s;
    nccl = exec::make_nccl_comm(boot, *device, {world}, no);
  } else {
    boot.set_timeout(o.timeout_s);
  }
  exec::Comm& comm = nccl ? *nccl : boot;

  // One buffer for the largest size, in the device's memory (NCCL) or the host's (MPI).
  std::int64_t largest = 0;
  for (CollKind k : kinds)
    for (Bytes s : sizes) largest = std::max(largest, shape(k, s, n).bytes.v);
  std::vector<float> host_buf(cuda ? 0 : static_cast<std::size_t>(largest / kFloatBytes) + 1);
  const auto release = [&](void* p) {
    if (cuda && p) device->release(p);
  };
  std::unique_ptr<void, decltype(release)> held(
      cuda ? device->allocate(static_cast<std::size_t>(largest) + 16) : static_cast<void*>(host_buf.data()), release);
  void* buf = held.get();
  exec::agree_on_refusals(boot, buf ? "" : fmt::format("--max: {} bytes do not fit on the GPU", largest), "the buffer");
  std::vector<int> group(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) group[static_cast<std::size_t>(r)] = r;
  const sim::CollectiveModel model(cluster);

  std::vector<std::pair<CollKind, std::vector<Measured>>> blocks;
  for (CollKind k : kinds) {
    std::vector<Measured> rows;
    for (Bytes s : sizes) {
      Measured m;
      m.shape = shape(k, s, n);
      if (m.shape.count == 0) continue;  // smaller than one element per rank
      exec::CollectiveCall c;
      c.kind = k;
      c.buf = buf;
      c.elements = m.shape.bytes.v / kFloatBytes;
      c.dtype = DType::fp32;
      c.op = std::string(redop(k)) == "sum" ? zero::ReduceOp::sum : zero::ReduceOp::none;
      c.group = group;
      c.root = 0;
      c.on_device = cuda;
      auto drain = [&] {
        if (device) device->synchronize();
      };
      for (int i = 0; i < o.warmup; ++i) comm.run(c);
      drain();
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) comm.run(c);
      drain();
      const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
      m.seconds = boot.sum_for_report(mine) / n;  // the mean over ranks, as nccl-tests reports by default (-a 1)
      m.predicted = model.cost(k, group, m.shape.bytes);
      rows.push_back(m);
    }
    blocks.emplace_back(k, std::move(rows));
  }
  held.reset();
  if (rank != 0) return "";

  const std::string backend = comm.backend();
  if (!o.out.empty())
    io::write_atomic(o.out, nccl_tests_text(blocks, rank_lines, backend, n, min, max, factor, o.warmup, o.iters), "--out");
  const int nodes = static_cast<int>(hosts.size());
  double err_sum = 0;
  int err_n = 0;
  for (const auto& [k, rows] : blocks)
    for (const auto& m : rows) {
      err_sum += std::abs(m.predicted.time.v / m.seconds - 1.0);
      ++err_n;
    }
  const double mape = err_n ? 100.0 * err_sum / err_n : 0.0;
  if (o.json) {
    nlohmann::json j;
    j["measured"] = true;
    j["backend"] = backend;
    j["ranks"] = n;
    j["nodes"] = nodes;
    j["gpu"] = gpu_name;
    j["cluster"] = cluster.name;
    j["iters"] = o.iters;
    j["warmup"] = o.warmup;
    j["time_mape_percent"] = mape;
    nlohmann::json bj = nlohmann::json::array();
    for (const auto& [k, rows] : blocks) {
      nlohmann::json rj = nlohmann::json::array();
      for (const auto& m : rows) {
        const double busbw = busbw_gbps(k, n, m);
        rj.push_back({{"size_bytes", m.shape.bytes.v},
                      {"count", m.shape.count},
                      {"time_us", m.seconds * 1e6},
                      {"busbw_gbps", busbw},
                      {"predicted_time_us", m.predicted.time.us()},
                      {"predicted_busbw_gbps", m.predicted.busbw.v / kGiga},
                      {"error", m.predicted.time.v / m.seconds - 1.0}});
      }
      bj.push_back({{"collective", zero::coll_kind_name(k)}, {"rows", std::move(rj)}});
    }
    j["collectives"] = std::move(bj);
    return j.dump(2) + "\n";
  }
  std::string t;
  t += fmt::format("# zeroplan collectives --measure: {} ranks on {} node{} through {} ({}), {} warm-up and {} timed calls "
                   "per size, the mean over ranks as nccl-tests' default{}\n",
                   n, nodes, nodes == 1 ? "" : "s", backend, cuda ? gpu_name : "host memory", o.warmup, o.iters,
                   shared_gpu ? "\n# note: ranks share a GPU (an NCCL_HOSTID each): NCCL talks over sockets between them; "
                                "these times say nothing of NVLink"
                              : "");
  t += fmt::format("# predicted: {} ranks of cluster {}: {}\n", n, cluster.name, sim::describe_cluster(cluster));
  for (const auto& [k, rows] : blocks) {
    t += "#\n";
    t += fmt::format("# Collective: {}\n", zero::coll_kind_name(k));
    t += fmt::format("# {:>10}  {:>12}  {:>7}  {:>6}  {:>7}  {:>6}  {:>7}\n", "size", "count", "time", "busbw", "pred", "busbw",
                     "error");
    t += fmt::format("# {:>10}  {:>12}  {:>7}  {:>6}  {:>7}  {:>6}  {:>7}\n", "(B)", "(elements)", "(us)", "(GB/s)", "(us)",
                     "(GB/s)", "(time)");
    for (const auto& m : rows) {
      const double busbw = busbw_gbps(k, n, m);
      t += fmt::format("{:>12}  {:>12}  {}  {}  {}  {}  {:>+6.0f}%\n", m.shape.bytes.v, m.shape.count, fit(m.seconds * 1e6, 7),
                       fit(busbw, 6), fit(m.predicted.time.us(), 7), fit(m.predicted.busbw.v / kGiga, 6),
                       100.0 * (m.predicted.time.v / m.seconds - 1.0));
    }
  }
  t += fmt::format("# mean |error| of the predicted time: {:.1f}% over {} sizes{}\n", mape, err_n,
                   o.out.empty() ? "" : fmt::format("; nccl-tests format in {} (calibrate --nccl-tests reads it)", o.out));
  return t;
}

}  // namespace zp::cli
