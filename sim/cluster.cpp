// Cluster descriptions: presets (sim/clusters/*.json), user JSON files and NCCL topology
// XML dumps, validated key by key; `--nodes K` multiplies the node across the fabric.
#include "sim/cluster.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"

namespace zp::sim {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr double kGiga = 1e9;
constexpr double kMicro = 1e-6;
constexpr int kMaxNodes = 1 << 16;
constexpr int kMaxGpusPerNode = 1024;
constexpr int kMaxNics = 64;
constexpr double kMaxNicGbps = 100000;   // Gb/s
constexpr double kMaxLinkGBps = 10000;   // GB/s
constexpr int kMaxXmlDepth = 128;        // element nesting accepted in a topology XML
using io::kConfigMaxBytes;

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

fs::path presets_dir() { return fs::path(ZEROPLAN_DATA_DIR) / "sim" / "clusters"; }

// The node a GPU type usually comes in: NVLink generation and per-link rate, PCIe, and
// the NICs a server of that generation ships with (used when the node is multiplied).
struct NodeDefaults {
  int nvlink_gen = 0;
  int nvlinks_per_gpu = 0;   // to the NVSwitch fabric
  double link_gbytes = 25;   // GB/s per direction per link
  int pcie_gen = 4;
  int nics = 0;
  double nic_gbps = 0;
};

NodeDefaults defaults_for(const DeviceSpec& d) {
  if (d.arch == "volta") return {2, 6, 25, 3, 4, 100};      // DGX-1V / DGX-2: NVLink2, EDR
  if (d.arch == "ampere") return {3, 12, 25, 4, 8, 200};    // DGX A100: NVLink3, HDR
  if (d.arch == "hopper") return {4, 18, 25, 5, 8, 400};    // DGX H100/H200: NVLink4, NDR
  if (d.arch == "blackwell") return {5, 18, 50, 6, 8, 400}; // HGX B200: NVLink5
  return {0, 0, 0, 4, 0, 0};
}

// DGX-1 (Volta) hybrid cube mesh: 6 NVLink2 per GPU; pairs with two links are the
// "NV2" entries of `nvidia-smi topo -m` on a DGX-1V.
const std::vector<std::array<int, 3>> kDgx1Pairs = {
    {0, 1, 1}, {0, 2, 1}, {0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 3, 1}, {1, 5, 2},
    {2, 3, 2}, {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {4, 7, 2}, {5, 6, 2},
    {5, 7, 1}, {6, 7, 2}};

// Per-GPU adjacency from undirected (a, b, links) triples.
std::vector<std::vector<std::pair<int, int>>> adjacency(int gpus, const std::vector<std::array<int, 3>>& pairs) {
  std::vector<std::vector<std::pair<int, int>>> adj(static_cast<std::size_t>(gpus));
  for (const auto& p : pairs) {
    if (p[0] >= gpus || p[1] >= gpus) continue;
    adj[static_cast<std::size_t>(p[0])].emplace_back(p[1], p[2]);
    adj[static_cast<std::size_t>(p[1])].emplace_back(p[0], p[2]);
  }
  for (auto& a : adj) std::sort(a.begin(), a.end());
  return adj;
}

int max_links(const std::vector<std::vector<std::pair<int, int>>>& adj) {
  int best = 0;
  for (const auto& a : adj) {
    int sum = 0;
    for (const auto& [peer, links] : a) sum += links;
    best = std::max(best, sum);
  }
  return best;
}

// ---------------------------------------------------------------- JSON

const std::vector<std::string> kRootKeys = {
    "name",   "description", "gpu",     "nodes",         "gpus_per_node", "intra",
    "nvlink", "pcie",        "network", "shared_memory", "measured",      "source",
    "nccl_topo_xml", "host_memory_gib"};
const std::vector<std::string> kNvlinkKeys = {"generation", "links_per_gpu", "link_gbytes_per_s", "pairs"};
const std::vector<std::string> kPcieKeys = {"gen", "width", "gpus_per_switch"};
const std::vector<std::string> kNetworkKeys = {"nics_per_node", "nic_gbps", "fabric"};
const std::vector<std::string> kShmKeys = {"gbytes_per_s", "latency_us"};
const std::vector<std::string> kCurveKeys = {"ranks", "points", "source"};
const std::vector<std::string> kIntraNames = {"nvswitch", "nvlink_mesh", "pcie", "shared_memory"};

IntraNode intra_from_name(const std::string& s) {
  if (s == "nvswitch") return IntraNode::nvswitch;
  if (s == "nvlink_mesh") return IntraNode::nvlink_mesh;
  if (s == "pcie") return IntraNode::pcie;
  return IntraNode::shared_memory;
}

std::vector<std::string> coll_names() {
  std::vector<std::string> out;
  for (int k = 0; k < zero::kNumCollKinds; ++k) out.emplace_back(zero::coll_kind_name(static_cast<zero::CollKind>(k)));
  return out;
}

const DeviceSpec& device_or_error(const std::string& file, const std::string& key, const std::string& gpu) {
  try {
    return find_device(gpu);
  } catch (const InputError& e) {
    std::string known;
    for (const auto& d : devices()) known += (known.empty() ? "" : ", ") + d.name;
    throw InputError(file, key, fmt::format("unknown GPU '{}'; known: {}", gpu, known));
  }
}

void read_nvlink(const json::Reader& r, const Json& v, ClusterSpec& c, const DeviceSpec& dev) {
  r.reject_unknown(v, kNvlinkKeys);
  const NodeDefaults nd = defaults_for(dev);
  c.nvlink_gen = static_cast<int>(r.get_int(v, "generation", nd.nvlink_gen == 0 ? 3 : nd.nvlink_gen, 1, 6));
  const double dflt_rate = c.nvlink_gen >= 5 ? 50.0 : c.nvlink_gen == 1 ? 20.0 : 25.0;
  c.nvlink_bw_per_link = BytesPerSecond{r.get_double(v, "link_gbytes_per_s", dflt_rate, 0.001, kMaxLinkGBps) * kGiga};
  c.nvlinks_per_gpu = static_cast<int>(r.get_int(v, "links_per_gpu", 0, 0, 64));
  if (auto it = v.find("pairs"); it != v.end()) {
    const std::string key = r.key_path("pairs");
    if (!it->is_array()) throw InputError(r.file, key, "must be an array of [gpu_a, gpu_b, links]");
    std::vector<std::array<int, 3>> pairs;
    std::set<std::pair<int, int>> seen;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const auto& p = (*it)[i];
      const std::string pk = fmt::format("{}[{}]", key, i);
      if (!p.is_array() || p.size() != 3 || !p[0].is_number_integer() || !p[1].is_number_integer() ||
          !p[2].is_number_integer())
        throw InputError(r.file, pk, "must be [gpu_a, gpu_b, links] (three integers)");
      const int a = p[0].get<int>(), b = p[1].get<int>(), l = p[2].get<int>();
      if (a < 0 || b < 0 || a >= c.gpus_per_node || b >= c.gpus_per_node)
        throw InputError(r.file, pk, fmt::format("GPU indices must be in [0, {}]", c.gpus_per_node - 1));
      if (a == b) throw InputError(r.file, pk, "a GPU cannot link to itself");
      if (l < 1 || l > 64) throw InputError(r.file, pk, "links must be in [1, 64]");
      if (!seen.insert({std::min(a, b), std::max(a, b)}).second)
        throw InputError(r.file, pk, fmt::format("pair ({}, {}) listed twice", a, b));
      pairs.push_back({a, b, l});
    }
    c.nvlink_pairs = adjacency(c.gpus_per_node, pairs);
    const int used = max_links(c.nvlink_pairs);
    if (c.nvlinks_per_gpu != 0 && used > c.nvlinks_per_gpu)
      throw InputError(r.file, key, fmt::format("a GPU uses {} links, more than links_per_gpu {}", used, c.nvlinks_per_gpu));
    if (c.nvlinks_per_gpu == 0) c.nvlinks_per_gpu = used;
  }
}

void read_pcie(const json::Reader& r, const Json& v, ClusterSpec& c) {
  r.reject_unknown(v, kPcieKeys);
  c.pcie_gen = static_cast<int>(r.get_int(v, "gen", c.pcie_gen, 1, 6));
  c.pcie_width = static_cast<int>(r.get_int(v, "width", c.pcie_width, 1, 32));
  if (c.pcie_width & (c.pcie_width - 1))
    throw InputError(r.file, r.key_path("width"), fmt::format("must be 1, 2, 4, 8, 16 or 32, got {}", c.pcie_width));
  c.gpus_per_pcie_switch = static_cast<int>(r.get_int(v, "gpus_per_switch", 0, 0, c.gpus_per_node));
}

void read_network(const json::Reader& r, const Json& v, ClusterSpec& c) {
  r.reject_unknown(v, kNetworkKeys);
  c.nics_per_node = static_cast<int>(r.get_int(v, "nics_per_node", 0, 0, kMaxNics));
  c.nic_gbps = r.get_double(v, "nic_gbps", 0, 0, kMaxNicGbps);
  (void)r.get_string(v, "fabric", "");
  if (c.nics_per_node > 0 && c.nic_gbps <= 0)
    throw InputError(r.file, r.key_path("nic_gbps"), "must be > 0 (Gb/s per NIC) when nics_per_node > 0");
  if (c.nics_per_node == 0 && c.nic_gbps > 0)
    throw InputError(r.file, r.key_path("nics_per_node"), "must be >= 1 when nic_gbps is given");
}

void read_shm(const json::Reader& r, const Json& v, ClusterSpec& c) {
  r.reject_unknown(v, kShmKeys);
  c.shm_bandwidth = BytesPerSecond{r.get_double(v, "gbytes_per_s", c.shm_bandwidth.v / kGiga, 0.001, kMaxLinkGBps) * kGiga};
  c.shm_latency = Seconds{r.get_double(v, "latency_us", c.shm_latency.us(), 0, 1e6) * kMicro};
}

MeasuredCurve read_curve(const json::Reader& r, const Json& v) {
  if (!v.is_object()) throw InputError(r.file, r.path, "must be an object {\"ranks\", \"points\", \"source\"}");
  r.reject_unknown(v, kCurveKeys);
  MeasuredCurve m;
  m.ranks = static_cast<int>(r.get_int(v, "ranks", 0, 0, kMaxNodes * 64));
  m.source = r.get_string(v, "source", "");
  auto it = v.find("points");
  const std::string key = r.key_path("points");
  if (it == v.end()) throw InputError(r.file, key, "missing required key");
  if (!it->is_array() || it->empty())
    throw InputError(r.file, key, "must be a non-empty array of [bytes, busbw_gbytes_per_s]");
  double last_time = 0;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const auto& p = (*it)[i];
    const std::string pk = fmt::format("{}[{}]", key, i);
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number())
      throw InputError(r.file, pk, "must be [bytes, busbw_gbytes_per_s]");
    const double bytes = p[0].get<double>(), bw = p[1].get<double>();
    if (!(bytes >= 1) || bytes != std::floor(bytes) || bytes > 9e18)
      throw InputError(r.file, pk, fmt::format("bytes must be a positive integer, got {}", p[0].dump()));
    if (!(bw > 0) || !std::isfinite(bw) || bw > kMaxLinkGBps * 100)
      throw InputError(r.file, pk, fmt::format("busbw must be a positive number of GB/s, got {}", p[1].dump()));
    const Bytes b{static_cast<std::int64_t>(bytes)};
    if (!m.points.empty() && b <= m.points.back().first)
      throw InputError(r.file, pk, "points must be sorted by strictly increasing size");
    const double t = bytes / bw;  // proportional to the time (the busbw factor is common)
    if (t < last_time * (1 - 1e-9))
      throw InputError(r.file, pk, "implies a shorter time than the smaller size before it (busbw grows faster than size)");
    last_time = t;
    m.points.emplace_back(b, BytesPerSecond{bw * kGiga});
  }
  return m;
}

void read_measured(const json::Reader& r, const Json& v, ClusterSpec& c) {
  const std::vector<std::string> names = coll_names();
  r.reject_unknown(v, names);
  for (int k = 0; k < zero::kNumCollKinds; ++k) {
    const auto kind = static_cast<zero::CollKind>(k);
    auto it = v.find(zero::coll_kind_name(kind));
    if (it == v.end()) continue;
    c.measured[kind] = read_curve(r.sub(zero::coll_kind_name(kind)), *it);
  }
}

void require_object(const json::Reader& r, const Json& doc, const std::string& key) {
  if (auto it = doc.find(key); it != doc.end()) r.require_object(*it, key);
}

std::string read_text(const std::string& path) { return io::read_capped(path, io::kConfigMaxBytes, "an NCCL topology XML"); }

// Refuses XML whose elements nest deeper than kMaxXmlDepth before it is parsed (the parser
// and the walk below recurse once per level). Comments, CDATA, declarations and quoted
// attribute values are skipped; the rest of the syntax is left to the parser.
void check_xml_depth(const std::string& file, std::string_view text) {
  int depth = 0;
  std::size_t line = 1;
  const auto skip_to = [&](std::size_t from, std::string_view end) {
    const std::size_t at = text.find(end, from);
    const std::size_t stop = at == std::string_view::npos ? text.size() : at + end.size();
    for (std::size_t k = from; k < stop; ++k) line += text[k] == '\n' ? 1 : 0;
    return stop;
  };
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '\n') ++line;
    if (c != '<') {
      ++i;
      continue;
    }
    const std::string_view rest = text.substr(i);
    if (rest.substr(0, 4) == "<!--") {
      i = skip_to(i + 4, "-->");
    } else if (rest.substr(0, 9) == "<![CDATA[") {
      i = skip_to(i + 9, "]]>");
    } else if (rest.substr(0, 2) == "<?") {
      i = skip_to(i + 2, "?>");
    } else if (rest.substr(0, 2) == "<!") {
      i = skip_to(i + 2, ">");
    } else if (rest.substr(0, 2) == "</") {
      if (depth > 0) --depth;
      i = skip_to(i + 2, ">");
    } else {
      // An opening tag: up to its '>' outside quoted attribute values.
      std::size_t k = i + 1;
      char quote = 0;
      for (; k < text.size(); ++k) {
        if (text[k] == '\n') ++line;
        if (quote) {
          if (text[k] == quote) quote = 0;
        } else if (text[k] == '"' || text[k] == '\'') {
          quote = text[k];
        } else if (text[k] == '>') {
          break;
        }
      }
      const bool self_closing = k < text.size() && k > i + 1 && text[k - 1] == '/';
      if (!self_closing && ++depth > kMaxXmlDepth)
        throw InputError(file, "", fmt::format("elements nested more than {} levels deep (at line {}); an NCCL "
                                               "topology nests fewer than 10",
                                               kMaxXmlDepth, line));
      i = k + 1;
    }
  }
}

void check_node_links(const std::string& file, ClusterSpec& c) {
  switch (c.intra) {
    case IntraNode::nvswitch:
      if (c.nvlinks_per_gpu < 1)
        throw InputError(file, "nvlink.links_per_gpu", "intra \"nvswitch\" needs links_per_gpu >= 1");
      if (!c.nvlink_pairs.empty())
        throw InputError(file, "nvlink.pairs", "pairs describe an \"nvlink_mesh\"; an NVSwitch node has none");
      break;
    case IntraNode::nvlink_mesh:
      if (c.nvlink_pairs.empty())
        throw InputError(file, "nvlink.pairs", "intra \"nvlink_mesh\" needs the list of linked GPU pairs");
      break;
    case IntraNode::pcie:
    case IntraNode::shared_memory:
      break;
  }
}

ClusterSpec from_json(const std::string& file, const Json& doc) {
  const json::Reader r{file, ""};
  if (!doc.is_object()) throw InputError(file, "", "a cluster description must be a JSON object");
  r.reject_unknown(doc, kRootKeys);
  for (const char* k : {"nvlink", "pcie", "network", "shared_memory", "measured"}) require_object(r, doc, k);

  ClusterSpec c;
  const std::string stem = fs::path(file).stem().string();
  const std::string xml = r.get_string(doc, "nccl_topo_xml", "");
  if (!xml.empty()) {
    for (const char* k : {"gpus_per_node", "intra", "nvlink", "pcie", "shared_memory"})
      if (doc.contains(k))
        throw InputError(file, k, "comes from nccl_topo_xml; remove it (or describe the node here without the XML)");
    fs::path xp(xml);
    if (xp.is_relative()) xp = fs::path(file).parent_path() / xp;
    std::string gpu;
    if (doc.contains("gpu")) gpu = device_or_error(file, "gpu", r.get_string(doc, "gpu", "")).name;
    c = parse_nccl_topo_xml(xp.string(), read_text(xp.string()), gpu);
  } else {
    for (const char* k : {"gpu", "gpus_per_node", "intra"})
      if (!doc.contains(k)) throw InputError(file, k, "missing required key");
    const DeviceSpec& dev = device_or_error(file, "gpu", r.get_string(doc, "gpu", ""));
    c.gpu = dev.name;
    c.gpus_per_node = static_cast<int>(r.get_int(doc, "gpus_per_node", 1, 1, kMaxGpusPerNode));
    c.intra = intra_from_name(r.get_enum(doc, "intra", "", kIntraNames));
    const NodeDefaults nd = defaults_for(dev);
    c.pcie_gen = nd.pcie_gen;
    c.nvlink_gen = nd.nvlink_gen;
    c.nvlinks_per_gpu = 0;
    if (auto it = doc.find("nvlink"); it != doc.end()) read_nvlink(r.sub("nvlink"), *it, c, dev);
    else if (c.intra == IntraNode::nvswitch || c.intra == IntraNode::nvlink_mesh)
      throw InputError(file, "nvlink", fmt::format("intra \"{}\" needs an \"nvlink\" section", intra_node_name(c.intra)));
    if (c.intra == IntraNode::pcie || c.intra == IntraNode::shared_memory) {
      if (doc.contains("nvlink"))
        throw InputError(file, "nvlink", fmt::format("intra \"{}\" has no NVLink", intra_node_name(c.intra)));
      c.nvlink_gen = 0;
      c.nvlinks_per_gpu = 0;
    }
    if (auto it = doc.find("pcie"); it != doc.end()) read_pcie(r.sub("pcie"), *it, c);
    const bool cpu = dev.arch == "cpu";
    if (cpu != (c.intra == IntraNode::shared_memory))
      throw InputError(file, "intra", cpu ? "CPU ranks communicate through \"shared_memory\""
                                          : "\"shared_memory\" is for CPU ranks (gpu \"cpu\")");
    if (c.intra == IntraNode::shared_memory) {
      c.shm_bandwidth = BytesPerSecond{10 * kGiga};
      c.shm_latency = Seconds{3 * kMicro};
      if (auto it = doc.find("shared_memory"); it != doc.end()) read_shm(r.sub("shared_memory"), *it, c);
    } else if (doc.contains("shared_memory")) {
      throw InputError(file, "shared_memory", "only for intra \"shared_memory\"");
    }
    check_node_links(file, c);
  }
  c.name = r.get_string(doc, "name", stem);
  c.description = r.get_string(doc, "description", c.description);
  c.source = r.get_string(doc, "source", c.source.empty() ? file : c.source);
  c.nodes = static_cast<int>(r.get_int(doc, "nodes", 1, 1, kMaxNodes));
  if (doc.contains("host_memory_gib"))
    c.host_memory = Bytes{r.get_int(doc, "host_memory_gib", 0, 1, std::int64_t{1} << 20) * (std::int64_t{1} << 30)};
  if (auto it = doc.find("network"); it != doc.end()) read_network(r.sub("network"), *it, c);
  if (c.nodes > 1 && c.nics_per_node == 0)
    throw InputError(file, "nodes", "more than one node needs NICs (network.nics_per_node, network.nic_gbps)");
  if (auto it = doc.find("measured"); it != doc.end()) read_measured(r.sub("measured"), *it, c);
  return c;
}

// ---------------------------------------------------------------- NCCL XML

using boost::property_tree::ptree;

struct XmlGpu {
  std::string busid;        // lower-case, of the enclosing <pci>
  int dev = 0;
  int sm = 0;
  int pcie_gen = 0, pcie_width = 0;
  const ptree* parent_bridge = nullptr;  // nearest enclosing PCIe switch (class 0x0604xx)
  std::vector<std::tuple<std::string, int, std::string>> nvlinks;  // (target busid, count, tclass)
};

struct XmlNic {
  std::string name;
  double gbps = 0;
};

struct XmlWalk {
  const std::string& file;
  std::vector<XmlGpu> gpus;
  std::vector<XmlNic> nics;
  int cpus = 0;
};

std::string attr(const ptree& node, const std::string& name) {
  if (auto a = node.get_child_optional("<xmlattr>." + name)) return a->get_value<std::string>();
  return {};
}

int attr_int(const XmlWalk& w, const ptree& node, const std::string& elem, const std::string& name, bool required,
             int dflt = 0) {
  const std::string s = attr(node, name);
  if (s.empty()) {
    if (required) throw InputError(w.file, fmt::format("<{} {}>", elem, name), "missing required attribute");
    return dflt;
  }
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used, 0);
  } catch (...) {
    used = 0;
  }
  if (used != s.size() || v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    throw InputError(w.file, fmt::format("<{} {}>", elem, name), fmt::format("must be an integer, got \"{}\"", s));
  return static_cast<int>(v);
}

// "8 GT/s", "8.0 GT/s PCIe", "16.0 GT/s PCIe" → PCIe generation.
int pcie_gen_from_speed(const XmlWalk& w, const std::string& s) {
  if (s.empty()) return 0;
  double gts = 0;
  try {
    gts = std::stod(s);
  } catch (...) {
    throw InputError(w.file, "<pci link_speed>", fmt::format("expected a rate like \"16.0 GT/s PCIe\", got \"{}\"", s));
  }
  const double rates[] = {2.5, 5, 8, 16, 32, 64};
  for (int g = 0; g < 6; ++g)
    if (std::fabs(gts - rates[g]) < 0.01) return g + 1;
  throw InputError(w.file, "<pci link_speed>", fmt::format("unknown PCIe rate \"{}\" (2.5, 5, 8, 16, 32 or 64 GT/s)", s));
}

bool class_is(const std::string& cls, const char* prefix) { return lower(cls).rfind(prefix, 0) == 0; }

void walk_nic(XmlWalk& w, const ptree& nic) {
  for (const auto& [name, child] : nic) {
    if (name != "net") continue;
    XmlNic n;
    n.name = attr(child, "name");
    const int mbps = attr_int(w, child, "net", "speed", false, 0);
    if (mbps < 0) throw InputError(w.file, "<net speed>", "must be >= 0 (Mb/s)");
    n.gbps = mbps / 1000.0;
    w.nics.push_back(n);
  }
}

void walk(XmlWalk& w, const ptree& node, const std::string& tag, const ptree* bridge, const ptree* pci) {
  if (tag == "cpu") ++w.cpus;
  if (tag == "nic") {
    walk_nic(w, node);
    return;
  }
  if (tag == "gpu") {
    if (pci == nullptr) throw InputError(w.file, "<gpu>", "must be inside the <pci> element of its device");
    XmlGpu g;
    g.busid = lower(attr(*pci, "busid"));
    g.dev = attr_int(w, node, "gpu", "dev", true);
    g.sm = attr_int(w, node, "gpu", "sm", true);
    g.pcie_gen = pcie_gen_from_speed(w, attr(*pci, "link_speed"));
    g.pcie_width = attr_int(w, *pci, "pci", "link_width", false, 0);
    g.parent_bridge = bridge;
    for (const auto& [name, child] : node) {
      if (name != "nvlink") continue;
      const int count = attr_int(w, child, "nvlink", "count", true);
      if (count < 1 || count > 64) throw InputError(w.file, "<nvlink count>", "must be in [1, 64]");
      g.nvlinks.emplace_back(lower(attr(child, "target")), count, lower(attr(child, "tclass")));
    }
    w.gpus.push_back(std::move(g));
    return;
  }
  const ptree* next_bridge = bridge;
  const ptree* next_pci = pci;
  if (tag == "pci") {
    next_pci = &node;
    if (class_is(attr(node, "class"), "0x0604")) next_bridge = &node;
  }
  for (const auto& [name, child] : node) {
    if (name == "<xmlattr>" || name == "<xmlcomment>") continue;
    walk(w, child, name, next_bridge, next_pci);
  }
}

std::string gpu_from_sm(const std::string& file, int sm) {
  if (sm >= 70 && sm < 80) return "V100-32GB";
  if (sm >= 80 && sm < 90) return "A100-80GB";
  if (sm >= 90 && sm < 100) return "H100-80GB";
  throw InputError(file, "<gpu sm>",
                   fmt::format("no device for compute capability {} (70 → V100-32GB, 80 → A100-80GB, 90 → H100-80GB); "
                               "give the GPU type explicitly",
                               sm));
}

}  // namespace

const char* intra_node_name(IntraNode k) {
  switch (k) {
    case IntraNode::nvswitch: return "nvswitch";
    case IntraNode::nvlink_mesh: return "nvlink_mesh";
    case IntraNode::pcie: return "pcie";
    case IntraNode::shared_memory: return "shared_memory";
  }
  return "?";
}

ClusterSpec parse_nccl_topo_xml(const std::string& file, const std::string& xml_text) {
  return parse_nccl_topo_xml(file, xml_text, "");
}

ClusterSpec parse_nccl_topo_xml(const std::string& file, const std::string& xml_text, const std::string& gpu_override) {
  check_xml_depth(file, xml_text);
  ptree doc;
  try {
    std::istringstream in(xml_text);
    boost::property_tree::read_xml(in, doc);
  } catch (const boost::property_tree::xml_parser_error& e) {
    throw InputError(file, "", fmt::format("malformed XML at line {}: {}", e.line(), e.message()));
  }
  auto system = doc.get_child_optional("system");
  if (!system) throw InputError(file, "<system>", "not an NCCL topology dump: no <system> root element");
  XmlWalk w{file, {}, {}, 0};
  if (attr(*system, "version").empty()) throw InputError(file, "<system version>", "missing required attribute");
  walk(w, *system, "system", nullptr, nullptr);
  if (w.gpus.empty()) throw InputError(file, "<gpu>", "no GPUs in the topology");

  std::sort(w.gpus.begin(), w.gpus.end(), [](const XmlGpu& a, const XmlGpu& b) { return a.dev < b.dev; });
  for (std::size_t i = 1; i < w.gpus.size(); ++i)
    if (w.gpus[i].dev == w.gpus[i - 1].dev)
      throw InputError(file, "<gpu dev>", fmt::format("GPU dev {} appears twice", w.gpus[i].dev));
  const int n = static_cast<int>(w.gpus.size());

  ClusterSpec c;
  c.name = fs::path(file).stem().string();
  c.source = fmt::format("NCCL topology XML {}", file);
  c.nodes = 1;
  c.gpus_per_node = n;
  const int sm = w.gpus.front().sm;
  for (const auto& g : w.gpus)
    if (g.sm != sm) throw InputError(file, "<gpu sm>", "GPUs of different compute capability in one node");
  c.gpu = gpu_override.empty() ? gpu_from_sm(file, sm) : device_or_error(file, "gpu", gpu_override).name;
  const DeviceSpec& dev = find_device(c.gpu);

  // NVLinks: to an NVSwitch (tclass 0x068000 or an unknown busid), or to another GPU.
  std::map<std::string, int> index_of;
  for (int i = 0; i < n; ++i) index_of[w.gpus[static_cast<std::size_t>(i)].busid] = i;
  int switch_links = 0;
  std::map<std::pair<int, int>, int> pair_links;
  for (int i = 0; i < n; ++i) {
    int to_switch = 0;
    for (const auto& [target, count, tclass] : w.gpus[static_cast<std::size_t>(i)].nvlinks) {
      auto it = index_of.find(target);
      const bool to_gpu = (tclass.empty() || class_is(tclass, "0x03")) && it != index_of.end();
      if (to_gpu) {
        if (it->second == i) throw InputError(file, "<nvlink target>", "a GPU cannot link to itself");
        auto& slot = pair_links[{std::min(i, it->second), std::max(i, it->second)}];
        slot = std::max(slot, count);  // each side lists the same links
      } else if (tclass.empty() || class_is(tclass, "0x0680")) {
        to_switch += count;
      }  // other classes (CPU over NVLink on POWER) are not modelled
    }
    switch_links = std::max(switch_links, to_switch);
  }
  c.nvlink_gen = defaults_for(dev).nvlink_gen;
  c.nvlink_bw_per_link = BytesPerSecond{(c.nvlink_gen >= 5 ? 50.0 : 25.0) * kGiga};
  if (switch_links > 0) {
    c.intra = IntraNode::nvswitch;
    c.nvlinks_per_gpu = switch_links;
  } else if (!pair_links.empty()) {
    c.intra = IntraNode::nvlink_mesh;
    std::vector<std::array<int, 3>> pairs;
    for (const auto& [ab, links] : pair_links) pairs.push_back({ab.first, ab.second, links});
    c.nvlink_pairs = adjacency(n, pairs);
    c.nvlinks_per_gpu = max_links(c.nvlink_pairs);
  } else {
    c.intra = IntraNode::pcie;
    c.nvlink_gen = 0;
    c.nvlink_bw_per_link = BytesPerSecond{};
  }

  // PCIe: the slowest GPU link, and how many GPUs share the nearest PCIe switch.
  c.pcie_gen = 6;
  c.pcie_width = 32;
  std::map<const ptree*, int> per_bridge;
  bool any_speed = false;
  for (const auto& g : w.gpus) {
    if (g.pcie_gen > 0) {
      c.pcie_gen = std::min(c.pcie_gen, g.pcie_gen);
      any_speed = true;
    }
    if (g.pcie_width > 0) c.pcie_width = std::min(c.pcie_width, g.pcie_width);
    if (g.parent_bridge != nullptr) ++per_bridge[g.parent_bridge];
  }
  if (!any_speed) c.pcie_gen = defaults_for(dev).pcie_gen;
  if (c.pcie_width == 32 || (c.pcie_width & (c.pcie_width - 1))) c.pcie_width = 16;
  c.gpus_per_pcie_switch = 0;
  if (per_bridge.size() > 1 || (per_bridge.size() == 1 && per_bridge.begin()->second < n))
    for (const auto& [b, k] : per_bridge) c.gpus_per_pcie_switch = std::max(c.gpus_per_pcie_switch, k);

  // NICs: every <net>; the ring is bounded by the slowest.
  c.nics_per_node = static_cast<int>(w.nics.size());
  double slowest = 0;
  for (const auto& nic : w.nics)
    if (nic.gbps > 0) slowest = slowest == 0 ? nic.gbps : std::min(slowest, nic.gbps);
  if (c.nics_per_node > 0 && slowest == 0)
    throw InputError(file, "<net speed>", "NICs without a speed (Mb/s); cannot model the network");
  c.nic_gbps = slowest;
  c.description = fmt::format("{} x {} from NCCL topology ({} CPU socket{}, {} NIC{})", n, c.gpu, w.cpus,
                              w.cpus == 1 ? "" : "s", c.nics_per_node, c.nics_per_node == 1 ? "" : "s");
  return c;
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(presets_dir(), ec)) {
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

ClusterSpec load_cluster(const std::string& name_or_path, std::optional<int> nodes, std::optional<double> nic_gbps,
                         const std::string& gpu) {
  ClusterSpec c;
  std::string preset_path;
  for (const auto& p : cluster_preset_names())
    if (lower(p) == lower(name_or_path)) preset_path = (presets_dir() / (p + ".json")).string();
  std::error_code ec;
  const bool xml = preset_path.empty() && lower(fs::path(name_or_path).extension().string()) == ".xml";
  if (!gpu.empty() && !xml)
    throw InputError("--gpu", "",
                     fmt::format("cluster '{}' names its own GPU; --gpu sets the GPU of --gpus N or of an NCCL "
                                 "topology XML (not applied to a preset or cluster JSON: set its \"gpu\" key instead)",
                                 name_or_path));
  if (!preset_path.empty()) {
    c = from_json(preset_path, json::parse_file(preset_path, kConfigMaxBytes, "a cluster description"));
  } else if (fs::is_regular_file(name_or_path, ec)) {
    if (xml)
      c = parse_nccl_topo_xml(name_or_path, read_text(name_or_path), gpu);
    else
      c = from_json(name_or_path, json::parse_file(name_or_path, kConfigMaxBytes, "a cluster description"));
  } else {
    const auto names = cluster_preset_names();
    std::string joined;
    for (const auto& p : names) joined += (joined.empty() ? "" : ", ") + p;
    const std::string near = json::closest(name_or_path, names);
    throw InputError("--cluster", "",
                     fmt::format("unknown cluster '{}'{}; presets: {}; or a path to a cluster JSON or NCCL topology XML",
                                 name_or_path, near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near), joined));
  }
  if (nic_gbps) {
    if (!(*nic_gbps > 0) || *nic_gbps > kMaxNicGbps)
      throw InputError("--nic-gbps", "", fmt::format("must be a NIC speed in (0, {}] Gb/s, got {}", kMaxNicGbps, *nic_gbps));
    if (c.nics_per_node == 0)
      throw InputError("--nic-gbps", "", fmt::format("cluster '{}' has no NICs to set the speed of", c.name));
    c.nic_gbps = *nic_gbps;
  }
  if (nodes) {
    if (*nodes < 1 || *nodes > kMaxNodes)
      throw InputError("--nodes", "", fmt::format("must be an integer in [1, {}], got {}", kMaxNodes, *nodes));
    if (*nodes > 1 && c.nics_per_node == 0)
      throw InputError("--nodes", "",
                       fmt::format("cluster '{}' has no NICs (network.nics_per_node) to connect {} nodes", c.name, *nodes));
    c.nodes = *nodes;
  }
  return c;
}

ClusterSpec single_node(const std::string& gpu, int gpus) {
  const DeviceSpec& dev = find_device(gpu);
  if (gpus < 1 || gpus > kMaxGpusPerNode)
    throw InputError("--gpus", "", fmt::format("must be an integer in [1, {}], got {}", kMaxGpusPerNode, gpus));
  // More GPUs than one server holds: servers of 8 (the usual HGX/DGX node) joined by their
  // default NICs; the ranks fill them in order.
  if (dev.arch != "cpu" && gpus > 8) {
    ClusterSpec c = single_node(gpu, 8);
    c.nodes = (gpus + 7) / 8;
    c.name = fmt::format("{}x{} ({} nodes of 8)", gpus, dev.name, c.nodes);
    c.source = "--gpus/--gpu: nodes of 8 with the links and NICs this GPU usually has";
    c.description = fmt::format("{} nodes x ({}), {} x {:g} Gb/s NICs per node", c.nodes, c.description,
                                c.nics_per_node, c.nic_gbps);
    return c;
  }
  const NodeDefaults nd = defaults_for(dev);
  ClusterSpec c;
  c.name = fmt::format("{}x{}", gpus, dev.name);
  c.gpu = dev.name;
  c.nodes = 1;
  c.gpus_per_node = gpus;
  c.source = "--gpus/--gpu: the links this GPU usually has";
  c.pcie_gen = nd.pcie_gen;
  c.pcie_width = 16;
  c.nics_per_node = nd.nics;
  c.nic_gbps = nd.nic_gbps;
  if (dev.arch == "cpu") {
    c.intra = IntraNode::shared_memory;
    c.shm_bandwidth = BytesPerSecond{10 * kGiga};
    c.shm_latency = Seconds{3 * kMicro};
    c.description = fmt::format("{} CPU processes on one host", gpus);
    return c;
  }
  c.nvlink_gen = nd.nvlink_gen;
  c.nvlink_bw_per_link = BytesPerSecond{nd.link_gbytes * kGiga};
  if (dev.arch == "volta" && gpus <= 4) {
    c.intra = IntraNode::pcie;
    c.gpus_per_pcie_switch = std::min(gpus, 2);
    c.nvlink_gen = 0;
    c.nvlink_bw_per_link = BytesPerSecond{};
    c.description = fmt::format("{} x {} over PCIe Gen3 x16", gpus, dev.name);
  } else if (dev.arch == "volta" && gpus <= 8) {
    c.intra = IntraNode::nvlink_mesh;
    c.nvlink_pairs = adjacency(gpus, kDgx1Pairs);
    c.nvlinks_per_gpu = 6;
    c.gpus_per_pcie_switch = 2;
    c.description = fmt::format("{} x {} in a DGX-1 hybrid cube mesh (NVLink2)", gpus, dev.name);
  } else {
    c.intra = IntraNode::nvswitch;
    c.nvlinks_per_gpu = nd.nvlinks_per_gpu;
    c.gpus_per_pcie_switch = std::min(gpus, 2);
    c.description = fmt::format("{} x {} on NVSwitch ({} x NVLink{})", gpus, dev.name, c.nvlinks_per_gpu, c.nvlink_gen);
  }
  return c;
}

std::string describe_cluster(const ClusterSpec& c) {
  std::string links;
  switch (c.intra) {
    case IntraNode::nvswitch:
      links = fmt::format("NVSwitch ({} x NVLink{} {:g} GB/s)", c.nvlinks_per_gpu, c.nvlink_gen, c.nvlink_bw_per_link.v / kGiga);
      break;
    case IntraNode::nvlink_mesh:
      links = fmt::format("NVLink{} mesh (up to {} links of {:g} GB/s per GPU)", c.nvlink_gen, c.nvlinks_per_gpu,
                          c.nvlink_bw_per_link.v / kGiga);
      break;
    case IntraNode::pcie:
      links = fmt::format("PCIe Gen{} x{}", c.pcie_gen, c.pcie_width);
      break;
    case IntraNode::shared_memory:
      links = fmt::format("shared memory ({:g} GB/s, {:g} us)", c.shm_bandwidth.v / kGiga, c.shm_latency.us());
      break;
  }
  std::string out = fmt::format("{} node{} x {} {}, {}", c.nodes, c.nodes == 1 ? "" : "s", c.gpus_per_node, c.gpu, links);
  if (c.nics_per_node > 0) out += fmt::format(", {} x {:g} Gb/s NICs per node", c.nics_per_node, c.nic_gbps);
  return out;
}

}  // namespace zp::sim
