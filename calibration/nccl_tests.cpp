// nccl-tests output → collective observations. The format (nccl-tests src/util.cu and
// common.cu): '#' header lines (the version, "Collective test starting: NAME", "nThread T nGpus
// G minBytes ...", one "#  Rank R Group G Pid P on HOST device D [BUS] NAME" line per rank),
// a two- or three-line column header, one row per size, then the "Out of bounds values" and
// "Avg bus bandwidth" footer. Columns are found by their header names, so older and newer
// layouts (no root column, "error" for "#wrong", per-iteration statistics, timestamps) read alike.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "calibration/sources.hpp"
#include "core/error.hpp"
#include "core/json_util.hpp"
#include "sim/collective_model.hpp"

namespace zp::calibration {

namespace {

std::vector<std::string> split_ws(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string t;
  while (in >> t) out.push_back(t);
  return out;
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r"));
  s.erase(s.find_last_not_of(" \t\r") + 1);
  return s;
}

std::optional<zero::CollKind> kind_from_test_name(const std::string& name) {
  static const std::vector<std::pair<std::string, zero::CollKind>> names = {
      {"all_reduce", zero::CollKind::all_reduce},         {"allreduce", zero::CollKind::all_reduce},
      {"all_gather", zero::CollKind::all_gather},         {"allgather", zero::CollKind::all_gather},
      {"reduce_scatter", zero::CollKind::reduce_scatter}, {"reducescatter", zero::CollKind::reduce_scatter},
      {"alltoall", zero::CollKind::all_to_all},           {"all_to_all", zero::CollKind::all_to_all},
      {"broadcast", zero::CollKind::broadcast},           {"reduce", zero::CollKind::reduce}};
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& [n, k] : names)  // longest names first: "reduce" last
    if (lower.find(n) != std::string::npos) return k;
  return std::nullopt;
}

bool parse_double(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// "nccl-library=22807" → "2.28.7" (NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9).
std::string nccl_from_code(long code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100);
}

struct Rank {
  int rank = 0, group = 0;
  std::string host, device_name;
};

struct Section {
  std::string test;                       // "all_reduce_perf"
  std::optional<zero::CollKind> kind;
  int nthread = 0, ngpus = 0;
  std::vector<Rank> ranks;
  int header_line = 0;
  std::vector<std::string> columns;       // names from the header, "#wrong" kept
  bool cputime = false;
  int rows = 0;
  bool footer = false;
  int first_line = 0;
};

}  // namespace

Dataset parse_nccl_tests(const std::string& path, const std::string& text, std::optional<zero::CollKind> kind_arg) {
  Dataset ds;
  ds.files.push_back(path);
  std::vector<std::string> lines;
  {
    std::string cur;
    for (char c : text) {
      if (c == '\n') {
        lines.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) lines.push_back(cur);
  }
  const bool ends_mid_line = !text.empty() && text.back() != '\n';
  const std::optional<zero::CollKind> kind_from_file = kind_from_test_name(std::filesystem::path(path).filename().string());

  std::vector<Section> sections;
  auto cur = [&]() -> Section& {
    if (sections.empty()) sections.emplace_back();
    return sections.back();
  };
  bool any_marker = false;
  std::string nccl_version;
  int skipped_zero = 0, skipped_wrong = 0;
  auto where = [&](std::size_t i) { return fmt::format("line {}", i + 1); };

  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string line = trim(lines[i]);
    if (line.empty()) continue;
    // NCCL_DEBUG=INFO's "NCCL INFO NCCL version 2.18.3+cuda12.2", anywhere.
    if (auto p = line.find("NCCL version "); p != std::string::npos && line.find("NCCL INFO") != std::string::npos) {
      const auto toks = split_ws(line.substr(p + 13));
      if (!toks.empty()) nccl_version = toks[0].substr(0, toks[0].find('+'));
      continue;
    }
    if (line[0] != '#') {
      // A data row: only inside a table.
      if (sections.empty() || cur().columns.empty()) {
        if (!any_marker) continue;  // text before any nccl-tests output (launcher noise)
        const auto toks = split_ws(line);
        double v = 0;
        if (!toks.empty() && parse_double(toks[0], v))
          throw InputError(path, where(i),
                           "a result row before the column header ('#  size  count  type ... time  algbw  busbw'): the "
                           "table's header is missing or the file was cut");
        continue;  // other text (NCCL warnings) between tables
      }
      Section& s = cur();
      const auto toks = split_ws(line);
      double first = 0;
      if (!parse_double(toks[0], first)) continue;  // not a row (a message printed mid-table)
      const auto& cols = s.columns;
      if (toks.size() < cols.size()) {
        if (i + 1 == lines.size() && ends_mid_line) {
          ds.warnings.push_back(fmt::format("{}: {}: the last row is cut short ({} of {} columns); left out", path,
                                            where(i), toks.size(), cols.size()));
          continue;
        }
        throw InputError(path, where(i),
                         fmt::format("row has {} columns, the header names {} ({}): a column is missing", toks.size(),
                                     cols.size(), fmt::join(cols, " ")));
      }
      auto col = [&](const std::string& name, int occurrence) -> int {
        int seen = 0;
        for (std::size_t c = 0; c < cols.size(); ++c)
          if (cols[c] == name && seen++ == occurrence) return static_cast<int>(c);
        return -1;
      };
      const int c_size = col("size", 0);
      const int c_type = col("type", 0);
      int c_time = col("time", 0);
      const int c_time_in = col("time", 1);
      int c_wrong = col("#wrong", 0) >= 0 ? col("#wrong", 0) : col("error", 0);
      double bytes = 0;
      if (!parse_double(toks[static_cast<std::size_t>(c_size)], bytes) || bytes < 0 || bytes != std::floor(bytes))
        throw InputError(path, where(i), fmt::format("size must be a whole number of bytes, got '{}'",
                                                     json::printable(toks[static_cast<std::size_t>(c_size)])));
      if (bytes == 0) {
        ++skipped_zero;
        continue;
      }
      double t_us = 0;
      const std::string& ts = toks[static_cast<std::size_t>(c_time)];
      if (!parse_double(ts, t_us) && c_time_in >= 0) {  // out-of-place blank (trace replay): in-place
        c_time = c_time_in;
        c_wrong = col("#wrong", 1) >= 0 ? col("#wrong", 1) : col("error", 1);
      }
      const std::string& tstr = toks[static_cast<std::size_t>(c_time)];
      if (!parse_double(tstr, t_us))
        throw InputError(path, where(i), fmt::format("time must be a number of microseconds, got '{}'", json::printable(tstr)));
      if (!std::isfinite(t_us) || t_us <= 0)
        throw InputError(path, where(i),
                         fmt::format("time must be a positive number of microseconds, got {} (a failed or empty measurement)",
                                     json::printable(tstr)));
      if (c_wrong >= 0 && static_cast<std::size_t>(c_wrong) < toks.size()) {
        double wrong = 0;
        if (parse_double(toks[static_cast<std::size_t>(c_wrong)], wrong) && wrong > 0) {
          ++skipped_wrong;
          ds.warnings.push_back(fmt::format("{}: {}: {} wrong elements at {} bytes: the collective's results were "
                                            "wrong, so its time is left out",
                                            path, where(i), wrong, bytes));
          continue;
        }
      }
      ++s.rows;
      Observation o;
      o.kind = ObsKind::collective;
      o.source = fmt::format("{}:{}", path, i + 1);
      o.coll.bytes = Bytes{static_cast<std::int64_t>(bytes)};
      o.coll.dtype = c_type >= 0 ? toks[static_cast<std::size_t>(c_type)] : "";
      o.measured = Seconds{t_us * 1e-6};
      ds.obs.push_back(std::move(o));
      continue;
    }
    // '#' lines.
    const std::string body = trim(line.substr(1));
    if (body.rfind("nccl-tests version", 0) == 0) {
      any_marker = true;
      const auto p = body.find("nccl-library=");
      if (p != std::string::npos) nccl_version = nccl_from_code(std::atol(body.c_str() + p + 13));
      continue;
    }
    if (body.rfind("Collective test starting:", 0) == 0) {
      any_marker = true;
      Section s;
      s.test = trim(body.substr(25));
      s.kind = kind_from_test_name(s.test);
      s.first_line = static_cast<int>(i + 1);
      sections.push_back(std::move(s));
      continue;
    }
    if (body.rfind("nThread", 0) == 0) {
      any_marker = true;
      // Older nccl-tests print no "Collective test starting": a header line starts a test.
      if (sections.empty() || !cur().columns.empty() || cur().nthread > 0) {
        Section s;
        s.first_line = static_cast<int>(i + 1);
        sections.push_back(std::move(s));
      }
      const auto toks = split_ws(body);
      for (std::size_t t = 0; t + 1 < toks.size(); ++t) {
        if (toks[t] == "nThread") cur().nthread = std::atoi(toks[t + 1].c_str());
        if (toks[t] == "nGpus") cur().ngpus = std::atoi(toks[t + 1].c_str());
      }
      continue;
    }
    if (body.rfind("Rank", 0) == 0 && body.find(" on ") != std::string::npos && body.find("device") != std::string::npos) {
      // "Rank  0 Group  0 Pid 1234 on host device  0 [0000:07:00] NVIDIA H200"
      const auto toks = split_ws(body);
      Rank r;
      for (std::size_t t = 0; t + 1 < toks.size(); ++t) {
        if (toks[t] == "Rank") r.rank = std::atoi(toks[t + 1].c_str());
        if (toks[t] == "Group") r.group = std::atoi(toks[t + 1].c_str());
        if (toks[t] == "on") r.host = toks[t + 1];
      }
      if (const auto b = body.find(']'); b != std::string::npos) r.device_name = trim(body.substr(b + 1));
      cur().ranks.push_back(r);
      continue;
    }
    if (body.find("size") != std::string::npos && body.find("count") != std::string::npos &&
        (body.find("time") != std::string::npos || body.find("busbw") != std::string::npos)) {
      auto toks = split_ws(body);
      Section& s = cur();
      s.columns.clear();
      for (auto& t : toks) {
        if (t == "cputime") {
          s.cputime = true;
          t = "time";
        }
        s.columns.push_back(t);
      }
      s.header_line = static_cast<int>(i + 1);
      any_marker = true;
      for (const char* need : {"size", "time"})
        if (std::find(s.columns.begin(), s.columns.end(), need) == s.columns.end())
          throw InputError(path, where(i),
                           fmt::format("the table has no '{}' column (columns: {}); calibration needs size and time",
                                       need, fmt::join(s.columns, " ")));
      if (s.cputime)
        throw InputError(path, where(i),
                         "the table reports CPU time (nccl-tests -C 1), not the collective's latency; rerun without -C");
      continue;
    }
    if (body.rfind("Avg bus bandwidth", 0) == 0 || body.rfind("Out of bounds values", 0) == 0) {
      if (!sections.empty()) cur().footer = true;
      continue;
    }
  }
  if (!any_marker)
    throw InputError(path, "",
                     "not nccl-tests output: no '# nThread ... nGpus ...' header and no '#  size  count ...' table "
                     "(give the output of all_reduce_perf, all_gather_perf, reduce_scatter_perf, ...)");
  if (ds.obs.empty())
    throw InputError(path, "", "no result rows with a positive size: the table is empty or was cut before its first row");
  if (skipped_zero > 0)
    ds.warnings.push_back(fmt::format("{}: {} rows of 0 bytes left out (no transfer to time)", path, skipped_zero));
  (void)skipped_wrong;

  // Assign each observation its section's collective and group (rows are in file order).
  std::size_t next = 0;
  const auto row_line = [&](const Observation& o) { return std::atoi(o.source.substr(o.source.rfind(':') + 1).c_str()); };
  std::set<std::string> hosts_all;
  for (std::size_t si = 0; si < sections.size(); ++si) {
    Section& s = sections[si];
    const int end_line = si + 1 < sections.size() ? sections[si + 1].first_line : 1 << 30;
    std::optional<zero::CollKind> kind = s.kind ? s.kind : kind_arg ? kind_arg : kind_from_file;
    if (kind_arg && s.kind && *kind_arg != *s.kind)
      throw InputError(path, fmt::format("line {}", s.first_line),
                       fmt::format("the output is {} ({}), not the {} the command line names", s.test,
                                   zero::coll_kind_name(*s.kind), zero::coll_kind_name(*kind_arg)));
    // Ranks and nodes: the device lines; NCCL_TESTS_SPLIT groups run the same operation side by side.
    int ranks = static_cast<int>(s.ranks.size());
    int groups = 1, nodes = 1, per_node = ranks;
    std::string device_name;
    if (ranks > 0) {
      std::set<int> gs;
      std::map<std::string, int> by_host;
      for (const auto& r : s.ranks) {
        gs.insert(r.group);
        if (r.group == s.ranks.front().group) ++by_host[r.host];
        hosts_all.insert(r.host);
        if (device_name.empty()) device_name = r.device_name;
      }
      groups = static_cast<int>(gs.size());
      ranks = 0;
      per_node = 0;
      for (const auto& [h, n] : by_host) {
        ranks += n;
        per_node = std::max(per_node, n);
      }
      nodes = static_cast<int>(by_host.size());
      if (groups > 1)
        ds.warnings.push_back(fmt::format("{}: {} groups of {} ranks ran side by side (NCCL_TESTS_SPLIT); each row is one "
                                          "group's time",
                                          path, groups, ranks));
    } else if (s.nthread > 0 && s.ngpus > 0) {
      ranks = s.nthread * s.ngpus;
      per_node = ranks;
      ds.warnings.push_back(fmt::format("{}: no '#  Rank' device lines: {} ranks on one node assumed from nThread x nGpus "
                                        "(an MPI run over several processes would have more)",
                                        path, ranks));
    }
    bool any = false;
    for (; next < ds.obs.size() && row_line(ds.obs[next]) < end_line; ++next) {
      any = true;
      if (!kind)
        throw InputError(path, fmt::format("line {}", s.first_line),
                         "cannot tell which collective this table measured (no '# Collective test starting:' line and "
                         "the file name names none); give it as KIND=FILE, e.g. all_reduce=" + path);
      if (ranks < 2)
        throw InputError(path, fmt::format("line {}", s.first_line),
                         ranks == 1 ? "one rank: a collective of one rank moves nothing; calibration needs 2 or more"
                                    : "no '#  Rank' device lines and no nThread/nGpus header: the group size is unknown");
      Observation& o = ds.obs[next];
      o.coll.kind = *kind;
      o.coll.ranks = ranks;
      o.coll.nodes = nodes;
      o.coll.ranks_per_node = per_node;
      o.label = fmt::format("{} {} ranks{} {} B", zero::coll_kind_name(*kind), ranks,
                            nodes > 1 ? fmt::format(" ({} nodes)", nodes) : "", o.coll.bytes.v);
      o.tags = {{"source", "nccl-tests"},
                {"kind", "collective"},
                {"op", zero::coll_kind_name(*kind)},
                {"ranks", std::to_string(ranks)},
                {"nodes", std::to_string(nodes)},
                {"file", path}};
    }
    if (any && !s.footer)
      ds.warnings.push_back(fmt::format("{}: the {} table has no 'Avg bus bandwidth' footer: the run may have been cut "
                                        "short (its rows are used)",
                                        path, s.test.empty() ? "nccl-tests" : s.test));
    if (any && !device_name.empty()) {
      if (!ds.env.gpu_name.empty() && ds.env.gpu_name != device_name)
        ds.warnings.push_back(fmt::format("{}: tables of different GPUs ({}, {})", path, ds.env.gpu_name, device_name));
      ds.env.gpu_name = device_name;
      ds.env.origin["gpu_name"] = path;
    }
    if (any) {
      ds.env.gpu_count = std::max(ds.env.gpu_count, ranks * groups);
      ds.env.nodes = std::max(ds.env.nodes, static_cast<int>(hosts_all.size()));
    }
  }
  if (next < ds.obs.size())
    throw InputError(path, "", "rows outside any table (internal: sections and rows disagree)");
  if (!nccl_version.empty()) {
    ds.env.nccl = nccl_version;
    ds.env.origin["nccl"] = path;
  }
  return ds;
}

Dataset read_nccl_tests(const std::string& path, std::optional<zero::CollKind> kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open the nccl-tests output");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_nccl_tests(path, ss.str(), kind);
}

Dataset read_nccl_tests_arg(const std::string& arg) {
  const auto eq = arg.find('=');
  if (eq != std::string::npos && !std::filesystem::exists(arg)) {
    const std::string name = arg.substr(0, eq);
    for (int k = 0; k < zero::kNumCollKinds; ++k)
      if (name == zero::coll_kind_name(static_cast<zero::CollKind>(k)))
        return read_nccl_tests(arg.substr(eq + 1), static_cast<zero::CollKind>(k));
    std::vector<std::string> names;
    for (int k = 0; k < zero::kNumCollKinds; ++k) names.emplace_back(zero::coll_kind_name(static_cast<zero::CollKind>(k)));
    throw InputError("--nccl-tests", "",
                     fmt::format("'{}' names no collective; KIND=FILE takes {}", json::printable(name), fmt::join(names, ", ")));
  }
  return read_nccl_tests(arg);
}

}  // namespace zp::calibration
