// Tests of the collective cost model (sim/collective_model.cpp): golden bus bandwidths from
// REFERENCE.md §4, latency- and bandwidth-bound regimes, monotonicity, measured overrides.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "cli/collectives.hpp"
#include "core/error.hpp"
#include "sim/cluster.hpp"
#include "sim/collective_model.hpp"

using namespace zp::sim;
using zp::Bytes;
using zp::zero::CollKind;

namespace {

constexpr double kG = 1e9;
constexpr std::int64_t kMiB = 1 << 20;
const std::vector<CollKind> kAllKinds = {CollKind::all_reduce, CollKind::reduce,    CollKind::reduce_scatter,
                                         CollKind::all_gather, CollKind::broadcast, CollKind::all_to_all};

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

double busbw_gbs(const CollectiveModel& m, CollKind k, int ranks, std::int64_t bytes) {
  return m.cost(k, iota(ranks), Bytes{bytes}).busbw.v / kG;
}

// |predicted / reference - 1| <= tol, reported with both numbers on failure.
void check_within(double predicted, double reference, double tol) {
  CAPTURE(predicted);
  CAPTURE(reference);
  CHECK(std::fabs(predicted / reference - 1) <= tol);
}

}  // namespace

TEST_CASE("golden: all-reduce busbw on 8xA100 NVSwitch within 15% of nccl-tests") {
  const CollectiveModel m(load_cluster("8xA100-80GB-NVSwitch"));
  const std::vector<std::pair<std::int64_t, double>> ref = {
      {kMiB, 36}, {16 * kMiB, 109}, {128 * kMiB, 174}, {1024 * kMiB, 228}};
  for (const auto& [bytes, gbs] : ref) {
    CAPTURE(bytes);
    check_within(busbw_gbs(m, CollKind::all_reduce, 8, bytes), gbs, 0.15);
  }
  check_within(busbw_gbs(m, CollKind::all_reduce, 8, 16384 * kMiB), 231, 0.15);  // "large"
}

TEST_CASE("golden: all-reduce busbw on 8xH200 NVSwitch (NVLS) within 15% of nccl-tests") {
  const CollectiveModel m(load_cluster("8xH200-141GB-NVSwitch"));
  const std::vector<std::pair<std::int64_t, double>> ref = {
      {kMiB, 53}, {16 * kMiB, 240}, {128 * kMiB, 412}, {1024 * kMiB, 468}};
  for (const auto& [bytes, gbs] : ref) {
    CAPTURE(bytes);
    check_within(busbw_gbs(m, CollKind::all_reduce, 8, bytes), gbs, 0.15);
  }
  check_within(busbw_gbs(m, CollKind::all_reduce, 8, 16384 * kMiB), 480, 0.15);
  CHECK(m.cost(CollKind::all_reduce, iota(8), Bytes{1024 * kMiB}).algo == Algo::nvls);
}

TEST_CASE("golden: 8xH100 ring all-reduce at large sizes ~365-370 GB/s") {
  const CollectiveModel m(load_cluster("8xH100-80GB-NVSwitch"));
  for (std::int64_t bytes : {1024 * kMiB, 8192 * kMiB}) {
    const auto ring = m.cost_for(CollKind::all_reduce, iota(8), Bytes{bytes}, Algo::ring);
    REQUIRE(ring.has_value());
    check_within(ring->busbw.v / kG, 367.5, 0.15);
  }
}

TEST_CASE("golden: 4xV100 over PCIe Gen3 ~10-12 GB/s at large sizes (within 25%)") {
  const CollectiveModel m(load_cluster("4xV100-16GB-PCIe"));
  check_within(busbw_gbs(m, CollKind::all_reduce, 4, 1024 * kMiB), 11, 0.25);
  CHECK(m.cost(CollKind::all_reduce, iota(4), Bytes{1024 * kMiB}).proto == Proto::simple);
}

TEST_CASE("golden: DGX-1 8xV100 ~120 GB/s (REFERENCE marks it unverified; within 25%)") {
  const CollectiveModel m(load_cluster("8xV100-32GB-NVLink"));
  check_within(busbw_gbs(m, CollKind::all_reduce, 8, 1024 * kMiB), 120, 0.25);
}

TEST_CASE("golden: multi-node points within 25%") {
  SUBCASE("A100 nodes with 4 x HDR200 NICs across 2 nodes: 85-96 GB/s") {
    ClusterSpec c = load_cluster("8xA100-80GB-NVSwitch", 2);
    c.nics_per_node = 4;
    const CollectiveModel m(c);
    check_within(busbw_gbs(m, CollKind::all_reduce, 16, 4096 * kMiB), 90.5, 0.25);
    ClusterSpec c3 = load_cluster("8xA100-80GB-NVSwitch", 3);
    c3.nics_per_node = 4;
    check_within(busbw_gbs(CollectiveModel(c3), CollKind::all_reduce, 24, 4096 * kMiB), 90.5, 0.25);
  }
  SUBCASE("NDR 400G: 46-49 GB/s per NIC") {
    const CollectiveModel one(load_cluster("1xH200-141GB", 2));  // one GPU and one NIC per node
    check_within(busbw_gbs(one, CollKind::all_reduce, 2, 4096 * kMiB), 47.5, 0.25);
    const CollectiveModel eight(load_cluster("8xH100-80GB-NVSwitch", 2));  // 8 NICs per node
    check_within(busbw_gbs(eight, CollKind::all_reduce, 16, 4096 * kMiB) / 8, 47.5, 0.25);
  }
  SUBCASE("two-level: a group spanning nodes pays network hops") {
    const CollectiveModel m(load_cluster("8xA100-80GB-NVSwitch", 2));
    const double t1 = m.cost(CollKind::all_reduce, iota(8), Bytes{8}).time.us();
    const double t2 = m.cost(CollKind::all_reduce, iota(16), Bytes{8}).time.us();
    CHECK(t2 > t1 + 5);
  }
}

TEST_CASE("small messages are latency-bound, large ones bandwidth-bound") {
  for (const char* name : {"8xA100-80GB-NVSwitch", "8xH200-141GB-NVSwitch", "4xV100-16GB-PCIe", "8xV100-32GB-NVLink",
                           "cpu-local"}) {
    const ClusterSpec c = load_cluster(name);
    const CollectiveModel m(c);
    const int n = c.world_size();
    for (CollKind k : kAllKinds) {
      const std::string cname = name, kname = zp::zero::coll_kind_name(k);
      CAPTURE(cname);
      CAPTURE(kname);
      const double t8 = m.cost(k, iota(n), Bytes{8}).time.v;
      const double t64k = m.cost(k, iota(n), Bytes{64 * 1024}).time.v;
      CHECK(t8 > 0);
      if (c.intra != IntraNode::pcie && c.intra != IntraNode::shared_memory) {
        // ≈ constant below 64 KB on NVLink (all-to-all's n-1 sends share the mesh's links)
        CHECK(t64k < (k == CollKind::all_to_all ? 1.5 : 1.35) * t8);
      }
      CHECK(t64k < 64.0 * 1024 / 8 * t8 / 100);  // far from proportional to size
      const double t1g = m.cost(k, iota(n), Bytes{1024 * kMiB}).time.v;
      const double t2g = m.cost(k, iota(n), Bytes{2048 * kMiB}).time.v;
      CHECK(t2g / t1g == zp::test::approx(2.0).epsilon(0.05));  // ∝ size
    }
  }
}

TEST_CASE("time is non-decreasing in size for every collective and cluster") {
  std::vector<ClusterSpec> clusters = {load_cluster("8xA100-80GB-NVSwitch"), load_cluster("8xH200-141GB-NVSwitch"),
                                       load_cluster("4xV100-16GB-PCIe"),     load_cluster("8xV100-32GB-NVLink"),
                                       load_cluster("cpu-local"),            load_cluster("8xA100-80GB-NVSwitch", 4),
                                       load_cluster("1xH200-141GB", 3)};
  for (const auto& c : clusters) {
    const CollectiveModel m(c);
    const auto ranks = iota(c.world_size());
    for (CollKind k : kAllKinds) {
      CAPTURE(c.name);
      CAPTURE(c.nodes);
      const std::string kname = zp::zero::coll_kind_name(k);
      CAPTURE(kname);
      double last = 0;
      for (double s = 1; s <= 8.0 * 1024 * kMiB; s *= 1.19) {
        const double t = m.cost(k, ranks, Bytes{static_cast<std::int64_t>(s)}).time.v;
        CAPTURE(s);
        CHECK(t >= last);
        last = t;
      }
    }
  }
}

TEST_CASE("algorithm and protocol choice follows NCCL's") {
  const CollectiveModel a100(load_cluster("8xA100-80GB-NVSwitch"));
  const auto small = a100.cost(CollKind::all_reduce, iota(8), Bytes{1024});
  CHECK(small.proto == Proto::ll);
  const auto large = a100.cost(CollKind::all_reduce, iota(8), Bytes{1024 * kMiB});
  CHECK(large.algo == Algo::ring);
  CHECK(large.proto == Proto::simple);
  CHECK(!large.measured);
  // No NVLS on Ampere, no tree for all-gather, NVLS on Hopper NVSwitch.
  CHECK(!a100.cost_for(CollKind::all_reduce, iota(8), Bytes{kMiB}, Algo::nvls));
  CHECK(!a100.cost_for(CollKind::all_gather, iota(8), Bytes{kMiB}, Algo::tree));
  CHECK(a100.cost_for(CollKind::all_reduce, iota(8), Bytes{kMiB}, Algo::tree));
  const CollectiveModel h200(load_cluster("8xH200-141GB-NVSwitch"));
  CHECK(h200.cost_for(CollKind::all_gather, iota(8), Bytes{kMiB}, Algo::nvls));
  CHECK(h200.cost(CollKind::all_to_all, iota(8), Bytes{kMiB}).algo == Algo::p2p);
  // No LL128 over PCIe.
  const CollectiveModel pcie(load_cluster("4xV100-16GB-PCIe"));
  for (const auto& c : pcie.candidates(CollKind::all_reduce, iota(4), Bytes{kMiB})) CHECK(c.proto != Proto::ll128);
  // Every candidate's busbw follows from its time.
  for (const auto& c : a100.candidates(CollKind::reduce_scatter, iota(8), Bytes{16 * kMiB})) {
    CHECK(c.time.v > 0);
    CHECK(c.algbw.v == zp::test::approx(16.0 * kMiB / c.time.v));
    CHECK(c.busbw.v == zp::test::approx(c.algbw.v * 7 / 8));
  }
}

TEST_CASE("relations between collectives") {
  const CollectiveModel m(load_cluster("8xA100-80GB-NVSwitch"));
  const auto r = iota(8);
  const Bytes s{512 * kMiB};
  // A ring all-reduce moves twice what a reduce-scatter or an all-gather moves.
  const double ar = m.cost(CollKind::all_reduce, r, s).time.v;
  const double rs = m.cost(CollKind::reduce_scatter, r, s).time.v;
  const double ag = m.cost(CollKind::all_gather, r, s).time.v;
  CHECK(ar == zp::test::approx(rs + ag).epsilon(0.1));
  CHECK(rs == zp::test::approx(ag));
  // Broadcast busbw is its algbw; on a large message it reaches the ring bandwidth.
  const auto bc = m.cost(CollKind::broadcast, r, s);
  CHECK(bc.busbw.v == zp::test::approx(bc.algbw.v));
  check_within(bc.busbw.v / kG, 240, 0.15);
  // A subgroup of 2 GPUs on the NVSwitch sees the same per-GPU links.
  check_within(m.cost(CollKind::all_reduce, {3, 6}, s).busbw.v / kG, 240, 0.15);
}

TEST_CASE("trivial groups and sizes cost nothing; bad groups are refused") {
  const CollectiveModel m(load_cluster("8xA100-80GB-NVSwitch"));
  for (CollKind k : kAllKinds) {
    const auto one = m.cost(k, {5}, Bytes{kMiB});
    CHECK(one.time.v == 0);
    CHECK(one.busbw.v == 0);
    CHECK(m.cost(k, iota(8), Bytes{0}).time.v == 0);
  }
  CHECK_THROWS_AS(m.cost(CollKind::all_reduce, {0, 8}, Bytes{kMiB}), std::invalid_argument);
  CHECK_THROWS_AS(m.cost(CollKind::all_reduce, {1, 1}, Bytes{kMiB}), std::invalid_argument);
}

TEST_CASE("busbw factors are nccl-tests'") {
  CHECK(CollectiveModel::busbw_factor(CollKind::all_reduce, 8) == zp::test::approx(1.75));
  CHECK(CollectiveModel::busbw_factor(CollKind::reduce_scatter, 8) == zp::test::approx(0.875));
  CHECK(CollectiveModel::busbw_factor(CollKind::all_gather, 4) == zp::test::approx(0.75));
  CHECK(CollectiveModel::busbw_factor(CollKind::all_to_all, 2) == zp::test::approx(0.5));
  CHECK(CollectiveModel::busbw_factor(CollKind::broadcast, 8) == 1.0);
  CHECK(CollectiveModel::busbw_factor(CollKind::reduce, 8) == 1.0);
}

TEST_CASE("a measured curve overrides the model, interpolated in log size") {
  ClusterSpec c = load_cluster("8xA100-80GB-NVSwitch");
  MeasuredCurve curve;
  curve.ranks = 8;
  curve.points = {{Bytes{kMiB}, zp::BytesPerSecond{40 * kG}}, {Bytes{16 * kMiB}, zp::BytesPerSecond{120 * kG}},
                  {Bytes{1024 * kMiB}, zp::BytesPerSecond{220 * kG}}};
  c.measured[CollKind::all_reduce] = curve;
  const CollectiveModel m(c);
  const auto at = [&](std::int64_t b) { return m.cost(CollKind::all_reduce, iota(8), Bytes{b}); };
  CHECK(at(kMiB).measured);
  CHECK(at(kMiB).busbw.v / kG == zp::test::approx(40));
  CHECK(at(16 * kMiB).busbw.v / kG == zp::test::approx(120));
  CHECK(at(4 * kMiB).busbw.v / kG == zp::test::approx(80));  // halfway in log size
  CHECK(at(4096 * kMiB).busbw.v / kG == zp::test::approx(220));
  // Below the first point: the first point's time.
  CHECK(at(1024).time.v == zp::test::approx(at(kMiB).time.v));
  double last = 0;
  for (std::int64_t b = 1; b < 8192 * kMiB; b *= 3) {
    CHECK(at(b).time.v >= last);
    last = at(b).time.v;
  }
  // Another group size or another collective still uses the model.
  CHECK(!m.cost(CollKind::all_reduce, iota(4), Bytes{kMiB}).measured);
  CHECK(!m.cost(CollKind::all_gather, iota(8), Bytes{kMiB}).measured);
}

TEST_CASE("cpu-local: shared-memory rings with default bandwidth") {
  const CollectiveModel m(load_cluster("cpu-local"));
  check_within(busbw_gbs(m, CollKind::all_reduce, 4, 1024 * kMiB), 10, 0.05);
  const auto small = m.cost(CollKind::all_reduce, iota(4), Bytes{8});
  CHECK(small.time.us() == zp::test::approx(6 * 3.0).epsilon(0.01));  // 2(n-1) hops of 3 µs
}

// ------------------------------------------------------------ zeroplan collectives

TEST_CASE("parse_size reads sizes the way nccl-tests does") {
  using zp::cli::parse_size;
  CHECK(parse_size("--min", "8").v == 8);
  CHECK(parse_size("--min", "1K").v == 1024);
  CHECK(parse_size("--min", "1k").v == 1024);
  CHECK(parse_size("--max", "128M").v == 128 * kMiB);
  CHECK(parse_size("--max", "1G").v == 1024 * kMiB);
  CHECK(parse_size("--max", "1.5G").v == 1536 * kMiB);
  CHECK(parse_size("--max", "2GB").v == 2048 * kMiB);
  CHECK(parse_size("--max", "4MiB").v == 4 * kMiB);
  CHECK(parse_size("--max", "0").v == 0);
  for (const char* bad : {"", "G", "abc", "-1", "1X", "1.2.3M", "0.3K", "1KK"}) {
    CAPTURE(std::string(bad));
    try {
      (void)parse_size("--min", bad);
      FAIL("expected an InputError");
    } catch (const zp::InputError& e) {
      CHECK(std::string(e.what()).rfind("--min: ", 0) == 0);
    }
  }
}

TEST_CASE("collective kinds and sweep sizes") {
  using zp::cli::parse_coll_kinds;
  using zp::cli::sweep_sizes;
  CHECK(parse_coll_kinds("--ops", "all").size() == 6);
  CHECK(parse_coll_kinds("--ops", "all_reduce,allgather,alltoall,reduce_scatter_perf") ==
        std::vector<CollKind>{CollKind::all_reduce, CollKind::all_gather, CollKind::all_to_all, CollKind::reduce_scatter});
  CHECK_THROWS_AS(parse_coll_kinds("--ops", "all_reduce,gather"), zp::InputError);
  const auto sizes = sweep_sizes(Bytes{8}, Bytes{1024 * kMiB}, 2);
  CHECK(sizes.size() == 28);
  CHECK(sizes.front().v == 8);
  CHECK(sizes.back().v == 1024 * kMiB);
  CHECK(sweep_sizes(Bytes{1}, Bytes{10}, 1.5).size() == 5);  // 1 2 3 5 8: 1.5^k rounded, repeats dropped
  CHECK_THROWS_AS(sweep_sizes(Bytes{0}, Bytes{8}, 2), zp::InputError);
  CHECK_THROWS_AS(sweep_sizes(Bytes{16}, Bytes{8}, 2), zp::InputError);
  CHECK_THROWS_AS(sweep_sizes(Bytes{8}, Bytes{16}, 1.0), zp::InputError);
  CHECK_THROWS_AS(sweep_sizes(Bytes{1}, Bytes{1LL << 60}, 1.0001), zp::InputError);
}

TEST_CASE("the collectives table reads like nccl-tests") {
  const ClusterSpec c = load_cluster("8xA100-80GB-NVSwitch");
  const std::string t = zp::cli::collectives_table(c, 8, Bytes{8}, Bytes{128 * kMiB}, 2,
                                                   {CollKind::all_reduce, CollKind::all_gather});
  CHECK(t.find("# Collective: all_reduce") != std::string::npos);
  CHECK(t.find("# Collective: all_gather") != std::string::npos);
  CHECK(t.find("(GB/s)") != std::string::npos);
  CHECK(t.find("predicted") != std::string::npos);
  // The all-reduce row of 1 MiB: size, count, type, redop, root, time, algbw, busbw, algorithm.
  std::istringstream in(t);
  std::string line;
  bool seen = false;
  while (std::getline(in, line)) {
    if (line.rfind("     1048576", 0) != 0) continue;
    std::istringstream f(line);
    std::string size, count, type, op, root, time, alg, bus, algo;
    f >> size >> count >> type >> op >> root >> time >> alg >> bus >> algo;
    CHECK(count == "262144");
    CHECK(type == "float");
    CHECK(op == "sum");
    CHECK(root == "-1");
    CHECK(std::stod(bus) == zp::test::approx(std::stod(alg) * 1.75).epsilon(0.01));
    CHECK(std::stod(time) == zp::test::approx(1048576 / std::stod(alg) / 1e3).epsilon(0.01));
    CHECK(algo.find('/') != std::string::npos);
    seen = true;
    break;  // the first block is all_reduce
  }
  CHECK(seen);
  // all_gather counts elements per rank, as nccl-tests does.
  CHECK(t.find("     1048576         32768     float") != std::string::npos);
  CHECK_THROWS_AS(zp::cli::collectives_table(c, 9, Bytes{8}, Bytes{64}, 2, {CollKind::all_reduce}), zp::InputError);
  CHECK_THROWS_AS(zp::cli::collectives_table(c, 0, Bytes{8}, Bytes{64}, 2, {CollKind::all_reduce}), zp::InputError);
}

TEST_CASE("the collectives JSON carries the same numbers") {
  const ClusterSpec c = load_cluster("8xH200-141GB-NVSwitch");
  const auto j = zp::cli::collectives_json(c, 8, Bytes{kMiB}, Bytes{1024 * kMiB}, 8, {CollKind::all_reduce});
  CHECK(j["ranks"] == 8);
  CHECK(j["cluster"]["name"] == "8xH200-141GB-NVSwitch");
  REQUIRE(j["collectives"].size() == 1);
  const auto& rows = j["collectives"][0]["rows"];
  REQUIRE(rows.size() == 4);  // 1M 8M 64M 512M
  const CollectiveModel m(c);
  for (const auto& r : rows) {
    const auto cost = m.cost(CollKind::all_reduce, iota(8), Bytes{r["size_bytes"].get<std::int64_t>()});
    CHECK(r["time_us"].get<double>() == zp::test::approx(cost.time.us()));
    CHECK(r["busbw_gbps"].get<double>() == zp::test::approx(cost.busbw.v / kG));
    CHECK(r["algorithm"] == algo_name(cost.algo));
  }
}

TEST_CASE("a hand-built spec without link figures still gives finite times") {
  ClusterSpec c;  // A100 NVSwitch by default, but no NVLink count or rate
  c.name = "bare";
  const CollectiveModel m(c);
  const auto cost = m.cost(CollKind::all_reduce, iota(8), Bytes{kMiB});
  CHECK(std::isfinite(cost.time.v));
  CHECK(cost.time.v > 0);
  CHECK(cost.busbw.v < 30 * kG);  // PCIe Gen4, not NVLink
  CHECK(std::string(algo_name(Algo::p2p)) == "p2p");
  CHECK(std::string(proto_name(Proto::ll128)) == "LL128");
}
