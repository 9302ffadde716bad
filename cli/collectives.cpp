#include "cli/collectives.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
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
