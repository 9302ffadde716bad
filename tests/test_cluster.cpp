// Tests of cluster descriptions (sim/cluster.cpp: presets, JSON, NCCL topology XML) and of
// the topology graph built from them (sim/topology.cpp).
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.hpp"
#include "sim/cluster.hpp"
#include "sim/topology.hpp"

using namespace zp::sim;
using zp::InputError;

namespace {

constexpr double kG = 1e9;

std::string data_file(const std::string& name) { return std::string(ZEROPLAN_SHARED_DIR) + "/tests/data/" + name; }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A temporary file removed at scope exit.
struct TempFile {
  std::string path;
  TempFile(const std::string& text, const std::string& ext) {
    char tmpl[] = "/tmp/zp_cluster_XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    std::remove(tmpl);
    path = std::string(tmpl) + ext;
    std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

using zp::test::input_error;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const char* kMinimal = R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "nvswitch",
  "nvlink": {"links_per_gpu": 12}})";

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

}  // namespace

TEST_CASE("every preset loads, names itself and says where its figures come from") {
  const std::vector<std::string> expected = {"1xH100-80GB",          "1xH200-141GB",         "4xV100-16GB-PCIe",
                                             "8xA100-80GB-NVSwitch",
                                             "8xH100-80GB-NVSwitch", "8xH200-141GB-NVSwitch", "8xV100-32GB-NVLink",
                                             "cpu-local"};
  const auto names = cluster_preset_names();
  for (const auto& e : expected) CHECK(std::find(names.begin(), names.end(), e) != names.end());
  for (const auto& n : names) {
    CAPTURE(n);
    const ClusterSpec c = load_cluster(n);
    CHECK(c.name == n);
    CHECK(!c.description.empty());
    CHECK(!c.source.empty());
    CHECK(c.nodes == 1);
    CHECK(!describe_cluster(c).empty());
    Topology t(c);  // builds
    CHECK(t.count(VertexKind::gpu) == static_cast<std::size_t>(c.gpus_per_node));
  }
}

TEST_CASE("preset lookup is case-insensitive; an unknown name suggests the closest preset") {
  CHECK(load_cluster("8xa100-80gb-nvswitch").name == "8xA100-80GB-NVSwitch");
  const std::string msg = input_error([] { load_cluster("8xA100-80GB-NVSwich"); });
  CHECK(contains(msg, "--cluster"));
  CHECK(contains(msg, "did you mean '8xA100-80GB-NVSwitch'"));
}

TEST_CASE("preset contents") {
  const ClusterSpec a100 = load_cluster("8xA100-80GB-NVSwitch");
  CHECK(a100.gpu == "A100-80GB");
  CHECK(a100.intra == IntraNode::nvswitch);
  CHECK(a100.nvlinks_per_gpu == 12);
  CHECK(a100.nvlink_gen == 3);
  CHECK(a100.nvlink_bw_per_link.v == zp::test::approx(25 * kG));
  CHECK(a100.nics_per_node == 8);
  CHECK(a100.nic_gbps == 200);

  const ClusterSpec h100 = load_cluster("8xH100-80GB-NVSwitch");
  CHECK(h100.nvlinks_per_gpu == 18);
  CHECK(h100.nvlink_gen == 4);
  CHECK(h100.nic_gbps == 400);
  CHECK(load_cluster("8xH200-141GB-NVSwitch").gpu == "H200-141GB");
  CHECK(load_cluster("1xH200-141GB").gpus_per_node == 1);

  const ClusterSpec dgx1 = load_cluster("8xV100-32GB-NVLink");
  CHECK(dgx1.intra == IntraNode::nvlink_mesh);
  CHECK(dgx1.nvlink_gen == 2);
  REQUIRE(dgx1.nvlink_pairs.size() == 8);
  int pairs = 0;
  for (int g = 0; g < 8; ++g) {
    int links = 0;
    for (const auto& [peer, l] : dgx1.nvlink_pairs[static_cast<std::size_t>(g)]) {
      links += l;
      ++pairs;
      // symmetric
      const auto& back = dgx1.nvlink_pairs[static_cast<std::size_t>(peer)];
      CHECK(std::find(back.begin(), back.end(), std::make_pair(g, l)) != back.end());
    }
    CHECK(links == 6);  // 6 NVLink2 per V100
  }
  CHECK(pairs == 2 * 16);

  const ClusterSpec pcie = load_cluster("4xV100-16GB-PCIe");
  CHECK(pcie.intra == IntraNode::pcie);
  CHECK(pcie.pcie_gen == 3);
  CHECK(pcie.pcie_width == 16);
  CHECK(pcie.gpus_per_pcie_switch == 2);

  const ClusterSpec cpu = load_cluster("cpu-local");
  CHECK(cpu.gpu == "cpu");
  CHECK(cpu.intra == IntraNode::shared_memory);
  CHECK(cpu.shm_bandwidth.v == zp::test::approx(10 * kG));
  CHECK(cpu.shm_latency.us() == zp::test::approx(3));
  CHECK(cpu.nics_per_node == 0);
}

TEST_CASE("--nodes multiplies the node; --nic-gbps sets the NIC speed; both validated") {
  const ClusterSpec c = load_cluster("8xA100-80GB-NVSwitch", 4, 400.0);
  CHECK(c.nodes == 4);
  CHECK(c.world_size() == 32);
  CHECK(c.nic_gbps == 400);
  CHECK(contains(input_error([] { load_cluster("8xA100-80GB-NVSwitch", 0); }), "--nodes"));
  CHECK(contains(input_error([] { load_cluster("cpu-local", 2); }), "no NICs"));
  CHECK(contains(input_error([] { load_cluster("cpu-local", 1, 100.0); }), "--nic-gbps"));
  CHECK(contains(input_error([] { load_cluster("8xA100-80GB-NVSwitch", 2, -5.0); }), "--nic-gbps"));
  CHECK(load_cluster("cpu-local", 1).nodes == 1);
}

TEST_CASE("single_node gives each GPU the links it usually has") {
  CHECK(single_node("V100-16GB", 4).intra == IntraNode::pcie);
  CHECK(single_node("V100-16GB", 4).pcie_gen == 3);
  CHECK(single_node("V100-32GB", 8).intra == IntraNode::nvlink_mesh);
  CHECK(single_node("a100", 8).intra == IntraNode::nvswitch);
  CHECK(single_node("a100", 8).nvlinks_per_gpu == 12);
  CHECK(single_node("h100", 8).nvlinks_per_gpu == 18);
  CHECK(single_node("h200", 2).gpus_per_node == 2);
  CHECK(single_node("cpu", 3).intra == IntraNode::shared_memory);
  CHECK(single_node("cpu", 3).shm_bandwidth.v > 0);
  CHECK_THROWS_AS(single_node("v100", 0), InputError);
  for (const char* g : {"V100-16GB", "A100-80GB", "H100-80GB", "cpu"})
    for (int n : {1, 2, 4, 5, 8}) {
      CAPTURE(g);
      CAPTURE(n);
      Topology t(single_node(g, n));
      CHECK(t.plan(iota(n)).ranks == n);
    }
}

TEST_CASE("a cluster JSON file: every key checked, ranges validated") {
  SUBCASE("minimal file") {
    TempFile f(kMinimal, ".json");
    const ClusterSpec c = load_cluster(f.path);
    CHECK(c.gpu == "A100-80GB");
    CHECK(c.nvlink_bw_per_link.v == zp::test::approx(25 * kG));  // NVLink3 default
    CHECK(c.nodes == 1);
    CHECK(c.name == std::filesystem::path(f.path).stem().string());
    CHECK(contains(input_error([&] { load_cluster(f.path, 2); }), "no NICs"));
  }
  struct Bad {
    const char* json;
    const char* expect;
  };
  const std::vector<Bad> bad = {
      {R"({"gpu": "A100-80GB", "gpus_per_nod": 8, "intra": "nvswitch", "nvlink": {"links_per_gpu": 12}})",
       "did you mean 'gpus_per_node'"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "nvswitch", "nvlink": {"link_per_gpu": 12}})",
       "nvlink.link_per_gpu: unknown key (did you mean 'links_per_gpu'?)"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 0, "intra": "nvswitch", "nvlink": {"links_per_gpu": 12}})",
       "gpus_per_node"},
      {R"({"gpu": "A100-80GB", "nodes": 0, "gpus_per_node": 8, "intra": "nvswitch", "nvlink": {"links_per_gpu": 12}})",
       "nodes"},
      {R"({"gpu": "Z100", "gpus_per_node": 8, "intra": "nvswitch", "nvlink": {"links_per_gpu": 12}})",
       "unknown GPU 'Z100'"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "infiniband"})", "intra: must be one of"},
      {R"({"gpus_per_node": 8, "intra": "pcie"})", "gpu: missing required key"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "nvswitch"})", "needs an \"nvlink\" section"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "nvswitch", "nvlink": {"links_per_gpu": 0}})",
       "links_per_gpu >= 1"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "nvlink_mesh", "nvlink": {"pairs": [[0, 8, 1]]}})",
       "nvlink.pairs[0]"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "nvlink_mesh", "nvlink": {"pairs": [[0, 1, 1], [1, 0, 2]]}})",
       "listed twice"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "pcie", "pcie": {"gen": 7}})", "pcie.gen"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "pcie", "pcie": {"width": 12}})", "pcie.width"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "pcie", "nodes": 2})", "needs NICs"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "pcie", "network": {"nics_per_node": 2}})",
       "network.nic_gbps"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "shared_memory"})", "for CPU ranks"},
      {R"({"gpu": "cpu", "gpus_per_node": 8, "intra": "pcie"})", "shared_memory"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "pcie",
           "measured": {"all_reduce": {"points": [[1024, 1.0], [512, 2.0]]}}})",
       "sorted"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "pcie",
           "measured": {"all_reduce": {"points": [[1024, -1.0]]}}})",
       "busbw must be a positive"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "pcie",
           "measured": {"allreduce": {"points": [[1024, 1.0]]}}})",
       "did you mean 'all_reduce'"},
      {R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "pcie",
           "measured": {"all_reduce": {"points": [[1024, 1.0], [2048, 10.0]]}}})",
       "shorter time"},
      {R"([1, 2])", "must be a JSON object"},
      {R"({"gpu": "A100-80GB", )", "malformed JSON"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.json);
    TempFile f(b.json, ".json");
    const std::string msg = input_error([&] { load_cluster(f.path); });
    CHECK(contains(msg, f.path));
    CHECK(contains(msg, b.expect));
  }
}

TEST_CASE("measured curves are read in bytes and GB/s") {
  TempFile f(R"({"gpu": "A100-80GB", "gpus_per_node": 8, "intra": "nvswitch", "nvlink": {"links_per_gpu": 12},
    "network": {"nics_per_node": 8, "nic_gbps": 200},
    "measured": {"all_gather": {"ranks": 8, "points": [[1048576, 30], [1073741824, 200]], "source": "nccl-tests"}}})",
             ".json");
  const ClusterSpec c = load_cluster(f.path, 2);
  CHECK(c.nodes == 2);
  REQUIRE(c.measured.count(zp::zero::CollKind::all_gather) == 1);
  const auto& m = c.measured.at(zp::zero::CollKind::all_gather);
  CHECK(m.ranks == 8);
  REQUIRE(m.points.size() == 2);
  CHECK(m.points[1].first.v == 1073741824);
  CHECK(m.points[1].second.v == zp::test::approx(200 * kG));
}

TEST_CASE("NCCL topology XML: 8-GPU NVSwitch node") {
  const std::string path = data_file("nccl_topo_8gpu_nvswitch.xml");
  const ClusterSpec c = load_cluster(path);
  CHECK(c.gpus_per_node == 8);
  CHECK(c.gpu == "A100-80GB");  // sm 80
  CHECK(c.intra == IntraNode::nvswitch);
  CHECK(c.nvlinks_per_gpu == 12);  // 6 switches x 2 links
  CHECK(c.nvlink_gen == 3);
  CHECK(c.pcie_gen == 4);
  CHECK(c.pcie_width == 16);
  CHECK(c.gpus_per_pcie_switch == 2);
  CHECK(c.nics_per_node == 8);
  CHECK(c.nic_gbps == zp::test::approx(200));
  CHECK(contains(c.description, "2 CPU sockets"));
  // The same node as the preset, as far as the topology goes.
  const GroupPlan p = Topology(c).plan(iota(8));
  const GroupPlan q = Topology(load_cluster("8xA100-80GB-NVSwitch")).plan(iota(8));
  CHECK(p.intra_bw.v == zp::test::approx(q.intra_bw.v));
  // sm 90 cannot tell H100 from H200: the override does.
  CHECK(parse_nccl_topo_xml(path, slurp(path), "H200-141GB").gpu == "H200-141GB");
  // --nodes works on an imported node with NICs.
  CHECK(load_cluster(path, 2).world_size() == 16);
}

TEST_CASE("NCCL topology XML: 4-GPU PCIe node") {
  const ClusterSpec c = load_cluster(data_file("nccl_topo_4gpu_pcie.xml"));
  CHECK(c.gpus_per_node == 4);
  CHECK(c.gpu == "V100-32GB");  // sm 70
  CHECK(c.intra == IntraNode::pcie);
  CHECK(c.nvlinks_per_gpu == 0);
  CHECK(c.pcie_gen == 3);
  CHECK(c.pcie_width == 16);
  CHECK(c.gpus_per_pcie_switch == 2);
  CHECK(c.nics_per_node == 1);
  CHECK(c.nic_gbps == zp::test::approx(100));
  const GroupPlan p = Topology(c).plan(iota(4));
  CHECK(p.intra_class == LinkClass::pcie);
  CHECK(p.intra_bw.v == zp::test::approx(12 * kG));  // PCIe Gen3 x16 as NCCL counts it
}

TEST_CASE("NCCL topology XML: GPU-to-GPU NVLinks make a mesh; a JSON file can wrap an XML") {
  const std::string xml = R"(<system version="1"><cpu numaid="0">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:02:00.0" count="4" tclass="0x030200"/></gpu></pci>
    <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="1" sm="80" rank="1" gdr="1"><nvlink target="0000:01:00.0" count="4" tclass="0x030200"/></gpu></pci>
    <nic><net name="mlx5_0" dev="0" speed="400000" port="1" gdr="1"/></nic>
  </cpu></system>)";
  const ClusterSpec c = parse_nccl_topo_xml("pair.xml", xml);
  CHECK(c.intra == IntraNode::nvlink_mesh);
  REQUIRE(c.nvlink_pairs.size() == 2);
  CHECK(c.nvlink_pairs[0] == std::vector<std::pair<int, int>>{{1, 4}});
  CHECK(c.nics_per_node == 1);
  CHECK(c.nic_gbps == zp::test::approx(400));
  CHECK(c.gpus_per_pcie_switch == 0);

  TempFile x(xml, ".xml");
  const std::string wrapper = "{\"nccl_topo_xml\": \"" + x.path + "\", \"gpu\": \"A100-40GB\", \"nodes\": 3, \"name\": \"pairs\"}";
  TempFile j(wrapper, ".json");
  const ClusterSpec w = load_cluster(j.path);
  CHECK(w.name == "pairs");
  CHECK(w.gpu == "A100-40GB");
  CHECK(w.nodes == 3);
  CHECK(w.intra == IntraNode::nvlink_mesh);
  TempFile j2("{\"nccl_topo_xml\": \"" + x.path + "\", \"intra\": \"pcie\"}", ".json");
  CHECK(contains(input_error([&] { load_cluster(j2.path); }), "comes from nccl_topo_xml"));
}

TEST_CASE("bad NCCL topology XML is an InputError naming the file") {
  struct Bad {
    const char* xml;
    const char* expect;
  };
  const std::vector<Bad> bad = {
      {"<system version=\"1\"><cpu></system>", "malformed XML at line"},
      {"<topology/>", "no <system> root"},
      {"<system version=\"1\"><cpu numaid=\"0\"/></system>", "no GPUs"},
      {"<system><cpu/></system>", "<system version>"},
      {R"(<system version="1"><pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
           <gpu dev="0" rank="0"/></pci></system>)",
       "<gpu sm>: missing required attribute"},
      {R"(<system version="1"><pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
           <gpu dev="0" sm="sixty" rank="0"/></pci></system>)",
       "<gpu sm>: must be an integer"},
      {R"(<system version="1"><pci busid="0000:01:00.0" class="0x030200" link_speed="3 GT/s" link_width="16">
           <gpu dev="0" sm="80" rank="0"/></pci></system>)",
       "unknown PCIe rate"},
      {R"(<system version="1"><pci busid="0000:01:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
           <gpu dev="0" sm="61" rank="0"/></pci></system>)",
       "compute capability 61"},
      {R"(<system version="1"><gpu dev="0" sm="80" rank="0"/></system>)", "inside the <pci>"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.xml);
    TempFile f(b.xml, ".xml");
    const std::string msg = input_error([&] { load_cluster(f.path); });
    CHECK(contains(msg, f.path));
    CHECK(contains(msg, b.expect));
  }
}

TEST_CASE("topology graph of two A100 nodes") {
  const ClusterSpec c = load_cluster("8xA100-80GB-NVSwitch", 2);
  const Topology t(c);
  CHECK(t.count(VertexKind::gpu) == 16);
  CHECK(t.count(VertexKind::nvswitch) == 2);
  CHECK(t.count(VertexKind::cpu) == 2);
  CHECK(t.count(VertexKind::pcie_switch) == 8);
  CHECK(t.count(VertexKind::nic) == 16);
  CHECK(t.count(VertexKind::network) == 1);
  // GPU 0's NVLink edge: 12 links of 25 GB/s signalling, 20 GB/s usable each.
  bool found = false;
  for (auto e : boost::make_iterator_range(boost::out_edges(t.gpu_vertex(0), t.graph()))) {
    const TopoEdge& ed = t.graph()[e];
    if (ed.cls != LinkClass::nvlink) continue;
    found = true;
    CHECK(ed.links == 12);
    CHECK(ed.raw.v == zp::test::approx(300 * kG));
    CHECK(ed.usable.v == zp::test::approx(240 * kG));
    CHECK(t.graph()[boost::target(e, t.graph())].kind == VertexKind::nvswitch);
  }
  CHECK(found);
  // Routes inside a node go over the NVSwitch.
  const auto r = t.route(0, 5);
  REQUIRE(r.size() == 2);
  for (auto e : r) CHECK(t.graph()[e].cls == LinkClass::nvlink);
  CHECK_THROWS_AS(t.route(0, 9), std::invalid_argument);
}

TEST_CASE("rank-group plans: one node, two levels, meshes and PCIe trees") {
  SUBCASE("8xA100: one ring bounded by 12 NVLinks") {
    const GroupPlan p = Topology(load_cluster("8xA100-80GB-NVSwitch")).plan(iota(8));
    CHECK(!p.spans_nodes());
    CHECK(p.nodes == 1);
    CHECK(p.intra_bw.v == zp::test::approx(240 * kG));
    CHECK(p.ring_bw.v == zp::test::approx(240 * kG));
    CHECK(p.intra_class == LinkClass::nvlink);
    CHECK(p.nvswitch);
    CHECK(p.channels == 12);
    CHECK(p.intra_hops == 8);
    CHECK(p.inter_hops == 0);
    CHECK(p.a2a_bw.v == zp::test::approx(240 * kG));
    CHECK(p.ring.size() == 8);
  }
  SUBCASE("DGX-1 mesh: rings packed over 6 links per GPU") {
    const Topology t(load_cluster("8xV100-32GB-NVLink"));
    const GroupPlan p = t.plan(iota(8));
    CHECK(p.intra_bw.v == zp::test::approx(120 * kG));  // 6 x 20 GB/s, REFERENCE §4 ≈ 120
    CHECK(p.intra_rings == 4);                          // 2 rings over double links, 2 over single
    CHECK(p.intra_class == LinkClass::nvlink);
    CHECK(!p.nvswitch);
    // GPUs 0 and 5 share no NVLink: the route goes through another GPU's NVLinks.
    const auto r = t.route(0, 5);
    CHECK(r.size() == 2);
    for (auto e : r) CHECK(t.graph()[e].cls == LinkClass::nvlink);
    // A pair with two links.
    CHECK(t.plan({0, 3}).intra_bw.v == zp::test::approx(40 * kG));  // two links of 20 GB/s each way
  }
  SUBCASE("4xV100 PCIe: the ring crosses the switches once each way") {
    const GroupPlan p = Topology(load_cluster("4xV100-16GB-PCIe")).plan(iota(4));
    CHECK(p.intra_bw.v == zp::test::approx(12 * kG));
    CHECK(p.intra_class == LinkClass::pcie);
    CHECK(p.channels == 2);
    // All-to-all: each switch uplink carries 2 x 2 flows each way.
    CHECK(p.a2a_bw.v == zp::test::approx(3.0 / 4.0 * 12 * kG));
  }
  SUBCASE("two A100 nodes with 4 HDR NICs each: the NICs bound the ring") {
    ClusterSpec c = load_cluster("8xA100-80GB-NVSwitch", 2);
    c.nics_per_node = 4;
    const GroupPlan p = Topology(c).plan(iota(16));
    CHECK(p.spans_nodes());
    CHECK(p.nodes == 2);
    CHECK(p.ranks_per_node == 8);
    CHECK(p.inter_bw.v == zp::test::approx(4 * 25 * 0.94 * kG));
    CHECK(p.ring_bw.v == zp::test::approx(p.inter_bw.v));
    CHECK(p.intra_hops == 14);
    CHECK(p.inter_hops == 2);
  }
  SUBCASE("one GPU per node: only the network") {
    const GroupPlan p = Topology(load_cluster("1xH200-141GB", 4)).plan(iota(4));
    CHECK(p.nodes == 4);
    CHECK(p.ranks_per_node == 1);
    CHECK(p.ring_bw.v == zp::test::approx(400.0 / 8 * 0.94 * kG));
  }
  SUBCASE("subgroups and bad groups") {
    const Topology t(load_cluster("8xH100-80GB-NVSwitch", 2));
    const GroupPlan p = t.plan({1, 9});  // same local GPU on two nodes: pure inter-node
    CHECK(p.nodes == 2);
    CHECK(p.ranks_per_node == 1);
    CHECK(p.ring_bw.v == zp::test::approx(48 * kG));  // one GPU's PCIe Gen5 x16 bounds its NICs
    CHECK(t.plan({0}).ranks == 1);
    CHECK_THROWS_AS(t.plan({}), std::invalid_argument);
    CHECK_THROWS_AS(t.plan({0, 0}), std::invalid_argument);
    CHECK_THROWS_AS(t.plan({0, 16}), std::invalid_argument);
    CHECK_THROWS_AS(t.plan({-1, 2}), std::invalid_argument);
  }
  SUBCASE("shared memory") {
    const GroupPlan p = Topology(load_cluster("cpu-local")).plan(iota(4));
    CHECK(p.intra_class == LinkClass::shm);
    CHECK(p.intra_bw.v == zp::test::approx(10 * kG));
    CHECK(p.channels == 1);
  }
}

TEST_CASE("usable link bandwidths follow NCCL's figures") {
  CHECK(pcie_usable(3, 16).v == zp::test::approx(12 * kG));
  CHECK(pcie_usable(4, 16).v == zp::test::approx(24 * kG));
  CHECK(pcie_usable(5, 16).v == zp::test::approx(48 * kG));
  CHECK(pcie_raw(3, 16).v == zp::test::approx(15.754 * kG).epsilon(0.001));
  CHECK(nvlink_usable_per_link("ampere", zp::BytesPerSecond{25 * kG}).v == zp::test::approx(20 * kG));
  CHECK(nvlink_usable_per_link("hopper", zp::BytesPerSecond{25 * kG}).v == zp::test::approx(20.6 * kG));
  CHECK(nic_raw(400).v == zp::test::approx(50 * kG));
}

TEST_CASE("--gpus beyond one server: nodes of 8 with the default NICs") {
  const auto c = zp::sim::single_node("A100-80GB", 64);
  CHECK(c.nodes == 8);
  CHECK(c.gpus_per_node == 8);
  CHECK(c.nics_per_node > 0);
  const auto odd = zp::sim::single_node("H100-80GB", 12);
  CHECK(odd.nodes == 2);
  CHECK(zp::sim::single_node("cpu", 16).nodes == 1);
}

TEST_CASE("topology XML nested 100,000 levels deep, or of unbounded size, is refused with one line") {
  std::string deep = R"(<system version="1">)";
  for (int i = 0; i < 100000; ++i) deep += "<cpu>";
  for (int i = 0; i < 100000; ++i) deep += "</cpu>";
  deep += "</system>";
  std::string e = input_error([&] { parse_nccl_topo_xml("deep.xml", deep); });
  CHECK(e == "deep.xml: elements nested more than 128 levels deep (at line 1); an NCCL topology nests fewer than 10");
  // Comments, CDATA, self-closing elements and '>' inside attribute values do not nest.
  std::string flat = R"(<?xml version="1.0"?><system version="1"><!-- <a><b><c> -->)";
  for (int i = 0; i < 200; ++i) flat += R"(<cpu numaid="0" affinity="a>b"/><![CDATA[<x><y>]]>)";
  flat += R"(<cpu><pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">)"
          R"(<gpu dev="0" sm="80" rank="0"/></pci></cpu></system>)";
  CHECK(parse_nccl_topo_xml("flat.xml", flat).gpus_per_node == 1);
  // A cluster JSON naming /dev/zero as its XML: the read stops at the cap.
  TempFile f(R"({"nccl_topo_xml": "/dev/zero"})", ".json");
  e = input_error([&] { load_cluster(f.path); });
  CHECK(e == "/dev/zero: more than 8 MiB: too large for an NCCL topology XML");
}

TEST_CASE("--gpu with --cluster: applied to an NCCL topology XML, refused for a preset or cluster JSON") {
  const std::string xml = data_file("nccl_topo_8gpu_nvswitch.xml");
  CHECK(load_cluster(xml).gpu != "H200-141GB");
  CHECK(load_cluster(xml, std::nullopt, std::nullopt, "H200-141GB").gpu == "H200-141GB");
  const std::string e = input_error([&] { load_cluster("8xA100-80GB-NVSwitch", std::nullopt, std::nullopt, "H200-141GB"); });
  CHECK(contains(e, "--gpu: cluster '8xA100-80GB-NVSwitch' names its own GPU"));
  TempFile f(kMinimal, ".json");
  CHECK(contains(input_error([&] { load_cluster(f.path, std::nullopt, std::nullopt, "H200-141GB"); }), "names its own GPU"));
}

TEST_CASE("topology of 65,536 nodes: the graph holds one node, and plans equal those of two nodes") {
  const Topology one(load_cluster("8xH200-141GB-NVSwitch"));
  const Topology two(load_cluster("8xH200-141GB-NVSwitch", 2));
  const Topology many(load_cluster("8xH200-141GB-NVSwitch", 65536));
  // Building is linear in the levels of a node, not in the nodes.
  CHECK(boost::num_vertices(many.graph()) == boost::num_vertices(two.graph()));
  CHECK(boost::num_edges(many.graph()) == boost::num_edges(two.graph()));
  // One node of a preset with NICs holds the fabric vertex too (it is where a second node would join).
  CHECK(one.count(VertexKind::network) == 1);
  CHECK(boost::num_vertices(many.graph()) == boost::num_vertices(one.graph()));
  CHECK(many.count(VertexKind::gpu) == 524288);
  CHECK(many.count(VertexKind::nic) == 524288);
  CHECK(many.count(VertexKind::network) == 1);
  const GroupPlan p2 = two.plan(iota(16));
  const GroupPlan p = many.plan(iota(524288));
  CHECK(p.nodes == 65536);
  CHECK(p.ranks_per_node == 8);
  CHECK(p.ring.size() == 524288);
  CHECK(p.ring[8] == 8);
  CHECK(p.inter_bw.v == p2.inter_bw.v);
  CHECK(p.intra_bw.v == p2.intra_bw.v);
  CHECK(p.ring_bw.v == p2.ring_bw.v);
  CHECK(p.inter_hops == 65536);
  CHECK(p.intra_hops == 524288 - 65536);
  // Ranks of the last node route like node 0's; ranks beyond the cluster are refused.
  CHECK(many.route(524280, 524287).size() == two.route(0, 7).size());
  CHECK(many.gpu_vertex(524287) == many.gpu_vertex(7));
  CHECK_THROWS_AS(many.gpu_vertex(524288), std::invalid_argument);
  CHECK_THROWS_AS(many.plan({0, 524288}), std::invalid_argument);
}
