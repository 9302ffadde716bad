// Tests of the caching-allocator model: the rounding rules at their boundaries, the
// split/coalesce/reuse rules, streams, the OOM paths, and the golden traces recorded
// from PyTorch's allocator on an H200 (tests/data/allocator_*.json, recorded with
// tools/allocator_trace.py): allocated and reserved bytes must match after every step.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/caching_allocator.hpp"

using zp::Bytes;
using zp::sim::CachingAllocatorModel;
using zp::sim::CachingAllocatorOptions;

namespace {

constexpr std::int64_t KiB = 1024;
constexpr std::int64_t MiB = 1024 * KiB;
constexpr std::int64_t GiB = 1024 * MiB;

std::int64_t rounded(std::int64_t n) { return CachingAllocatorModel::round_size(Bytes{n}).v; }
std::int64_t segment(std::int64_t n) {
  return CachingAllocatorModel::segment_size(CachingAllocatorModel::round_size(Bytes{n})).v;
}

CachingAllocatorModel::Handle must(std::optional<CachingAllocatorModel::Handle> h) {
  REQUIRE(h.has_value());
  return *h;
}

}  // namespace

TEST_CASE("round_size: multiples of 512 B, at least 512 B") {
  CHECK(rounded(1) == 512);
  CHECK(rounded(511) == 512);
  CHECK(rounded(512) == 512);
  CHECK(rounded(513) == 1024);
  CHECK(rounded(4095) == 4096);
  CHECK(rounded(MiB) == MiB);
  CHECK(rounded(MiB + 1) == MiB + 512);
  CHECK(rounded(10 * MiB - 1) == 10 * MiB);
  CHECK(rounded(10 * MiB) == 10 * MiB);
  CHECK(rounded(10 * MiB + 1) == 10 * MiB + 512);
  CHECK(rounded(2 * GiB) == 2 * GiB);
}

TEST_CASE("segment_size: 2 MiB small segments, 20 MiB below 10 MiB, else 2 MiB multiples") {
  CHECK(segment(1) == 2 * MiB);
  CHECK(segment(511) == 2 * MiB);
  CHECK(segment(512) == 2 * MiB);
  CHECK(segment(513) == 2 * MiB);
  CHECK(segment(MiB) == 2 * MiB);
  CHECK(segment(MiB + 1) == 20 * MiB);
  CHECK(segment(2 * MiB) == 20 * MiB);
  CHECK(segment(10 * MiB - 1) == 10 * MiB);  // rounds to 10 MiB: no longer below kMinLargeAlloc
  CHECK(segment(10 * MiB - 512) == 20 * MiB);
  CHECK(segment(10 * MiB - 513) == 20 * MiB);
  CHECK(segment(10 * MiB) == 10 * MiB);
  CHECK(segment(10 * MiB + 1) == 12 * MiB);
  CHECK(segment(12 * MiB) == 12 * MiB);
  CHECK(segment(20 * MiB) == 20 * MiB);
  CHECK(segment(20 * MiB + 1) == 22 * MiB);
  CHECK(segment(2 * GiB - 1) == 2 * GiB);
}

TEST_CASE("small pool: split while the remainder is >= 512 B") {
  CachingAllocatorModel m;
  auto a = must(m.allocate(Bytes{1}));
  CHECK(m.allocated().v == 512);
  CHECK(m.reserved().v == 2 * MiB);
  CHECK(m.block_size(a).v == 512);
  auto b = must(m.allocate(Bytes{MiB}));          // split from the same segment
  auto c = must(m.allocate(Bytes{MiB - 1024}));   // leaves exactly 512 B: still split
  CHECK(m.segments() == 1);
  CHECK(m.block_size(c).v == MiB - 1024);
  auto d = must(m.allocate(Bytes{512}));          // the last 512 B, no remainder
  CHECK(m.segments() == 1);
  CHECK(m.allocated().v == 2 * MiB);
  auto e = must(m.allocate(Bytes{1}));            // segment full: a new one
  CHECK(m.segments() == 2);
  CHECK(m.reserved().v == 4 * MiB);
  for (auto h : {a, b, c, d, e}) m.free(h);
  CHECK(m.allocated().v == 0);
  CHECK(m.reserved().v == 4 * MiB);  // cached, not returned
}

TEST_CASE("large pool: split only when the remainder exceeds 1 MiB") {
  CachingAllocatorModel m;
  auto a = must(m.allocate(Bytes{5 * MiB}));  // 20 MiB segment, 15 MiB remainder
  auto b = must(m.allocate(Bytes{5 * MiB}));  // 10 MiB remainder
  auto c = must(m.allocate(Bytes{9 * MiB}));  // remainder 1 MiB: not split, takes 10 MiB
  CHECK(m.segments() == 1);
  CHECK(m.block_size(c).v == 10 * MiB);
  CHECK(m.allocated().v == 20 * MiB);
  auto d = must(m.allocate(Bytes{19 * MiB}));  // new 20 MiB segment, 1 MiB remainder kept
  CHECK(m.block_size(d).v == 20 * MiB);
  auto e = must(m.allocate(Bytes{18 * MiB + 512}));  // new segment, remainder 2 MiB - 512 B split off
  CHECK(m.block_size(e).v == 18 * MiB + 512);
  CHECK(m.segments() == 3);
  CHECK(m.reserved().v == 60 * MiB);
  for (auto h : {a, b, c, d, e}) m.free(h);
  CHECK(m.allocated().v == 0);
}

TEST_CASE("free coalesces with free neighbours of the same segment") {
  CachingAllocatorModel m;
  auto a = must(m.allocate(Bytes{4 * MiB}));
  auto b = must(m.allocate(Bytes{4 * MiB}));
  auto c = must(m.allocate(Bytes{4 * MiB}));
  auto other = must(m.allocate(Bytes{20 * MiB}));  // a second segment, exactly 20 MiB
  m.free(b);
  m.free(a);                                   // a + b merge into 8 MiB
  auto f = must(m.allocate(Bytes{8 * MiB}));   // two 8 MiB holes: the lower address (merged a + b)
  CHECK(m.segments() == 2);
  m.free(f);
  m.free(c);                                   // the whole 20 MiB segment is free again
  m.free(other);
  CHECK(m.allocated().v == 0);
  // Two whole cached 20 MiB segments: a 20 MiB request reuses one without growing.
  auto g = must(m.allocate(Bytes{20 * MiB}));
  CHECK(m.segments() == 2);
  CHECK(m.block_size(g).v == 20 * MiB);
  m.free(g);
  m.empty_cache();
  CHECK(m.reserved().v == 0);
  CHECK(m.segments() == 0);
}

TEST_CASE("a cached block is reused, not re-reserved") {
  CachingAllocatorModel m;
  auto a = must(m.allocate(Bytes{50 * MiB}));
  m.free(a);
  auto b = must(m.allocate(Bytes{50 * MiB}));
  CHECK(b == a);
  CHECK(m.segments() == 1);
  CHECK(m.reserved().v == 50 * MiB);
  CHECK(m.peak_reserved().v == 50 * MiB);
  CHECK(m.peak_allocated().v == 50 * MiB);
}

TEST_CASE("best fit: the smallest cached block that is large enough") {
  CachingAllocatorModel m;
  auto p30 = must(m.allocate(Bytes{30 * MiB}));
  auto p40 = must(m.allocate(Bytes{40 * MiB}));
  auto p50 = must(m.allocate(Bytes{50 * MiB}));
  m.free(p30);
  m.free(p40);
  m.free(p50);
  auto q35 = must(m.allocate(Bytes{35 * MiB}));
  CHECK(q35 == p40);                        // 40 MiB block, 5 MiB split off
  CHECK(m.block_size(q35).v == 35 * MiB);
  auto q45 = must(m.allocate(Bytes{45 * MiB}));
  CHECK(q45 == p50);
  auto q30 = must(m.allocate(Bytes{30 * MiB}));
  CHECK(q30 == p30);
  CHECK(m.segments() == 3);
  auto q31 = must(m.allocate(Bytes{31 * MiB}));  // only 5 MiB pieces left: new segment
  CHECK(m.segments() == 4);
  CHECK(m.reserved().v == (120 + 32) * MiB);
  for (auto h : {q35, q45, q30, q31}) m.free(h);
}

TEST_CASE("streams have separate pools") {
  CachingAllocatorModel m;
  auto a = must(m.allocate(Bytes{30 * MiB}, 1));
  auto s = must(m.allocate(Bytes{100 * KiB}, 1));
  m.free(a);
  m.free(s);
  auto b = must(m.allocate(Bytes{30 * MiB}, 0));  // stream 1's cache does not serve stream 0
  auto t = must(m.allocate(Bytes{100 * KiB}, 0));
  CHECK(m.segments() == 4);
  auto c = must(m.allocate(Bytes{30 * MiB}, 1));  // stream 1 reuses its own
  CHECK(c == a);
  CHECK(m.segments() == 4);
  for (auto h : {b, t, c}) m.free(h);
}

TEST_CASE("segment_info: every segment held, its stream, pool and live bytes, in creation order") {
  CachingAllocatorModel m;
  auto a = must(m.allocate(Bytes{30 * MiB}, 1));   // a 30 MiB segment, split
  auto b = must(m.allocate(Bytes{3 * MiB}, 0));    // a 20 MiB segment
  auto c = must(m.allocate(Bytes{100 * KiB}, 0));  // a 2 MiB small segment
  auto d = must(m.allocate(Bytes{5 * MiB}, 0));    // from b's segment (its remainder is cached)
  m.free(a);
  const auto seg = m.segment_info();
  REQUIRE(seg.size() == 3);
  CHECK(seg[0].stream == 1);
  CHECK(seg[0].size == 30 * MiB);
  CHECK(seg[0].allocated == 0);
  CHECK_FALSE(seg[0].small_pool);
  CHECK(seg[1].stream == 0);
  CHECK(seg[1].size == 20 * MiB);
  CHECK(seg[1].allocated == 8 * MiB);
  CHECK(seg[2].small_pool);
  CHECK(seg[2].size == 2 * MiB);
  CHECK(seg[2].allocated == rounded(100 * KiB));
  std::int64_t held = 0, live = 0;
  for (const auto& s : seg) {
    held += s.size;
    live += s.allocated;
  }
  CHECK(held == m.reserved().v);
  CHECK(live == m.allocated().v);
  for (auto h : {b, c, d}) m.free(h);
  for (const auto& s : m.segment_info()) CHECK(s.allocated == 0);
}

TEST_CASE("max_split_size: oversize blocks are not split and serve only close requests") {
  CachingAllocatorOptions opt;
  opt.max_split_size = Bytes{64 * MiB};
  CachingAllocatorModel m(opt);
  auto a = must(m.allocate(Bytes{100 * MiB}));
  m.free(a);
  auto b = must(m.allocate(Bytes{90 * MiB}));  // takes the cached 100 MiB whole
  CHECK(b == a);
  CHECK(m.block_size(b).v == 100 * MiB);
  CHECK(m.allocated().v == 100 * MiB);
  m.free(b);
  auto d = must(m.allocate(Bytes{30 * MiB}));  // below max_split: may not use the oversize block
  CHECK(d != a);
  auto e = must(m.allocate(Bytes{79 * MiB}));  // 100 >= 79 + 20: refused
  CHECK(e != a);
  auto f = must(m.allocate(Bytes{81 * MiB}));  // 100 < 81 + 20: accepted
  CHECK(f == a);
  CHECK(m.segments() == 3);
  for (auto h : {d, e, f}) m.free(h);
  CHECK_THROWS_AS(CachingAllocatorModel(CachingAllocatorOptions{Bytes{GiB}, Bytes{20 * MiB}}),
                  std::invalid_argument);
}

TEST_CASE("out of capacity: cached segments are released and the request retried") {
  CachingAllocatorOptions opt;
  opt.capacity = Bytes{GiB};
  CachingAllocatorModel m(opt);
  auto a = must(m.allocate(Bytes{300 * MiB}));
  auto b = must(m.allocate(Bytes{300 * MiB}));
  auto c = must(m.allocate(Bytes{300 * MiB}));
  m.free(a);
  m.free(b);
  CHECK(m.reserved().v == 900 * MiB);
  auto d = must(m.allocate(Bytes{500 * MiB}));  // 900 + 500 > 1024: release the two cached, retry
  CHECK(m.num_oom_retries() == 1);
  CHECK(m.reserved().v == 800 * MiB);
  CHECK(m.segments() == 2);
  CHECK(m.peak_reserved().v == 900 * MiB);

  SUBCASE("a request that still does not fit returns nullopt") {
    auto e = m.allocate(Bytes{400 * MiB});
    CHECK_FALSE(e.has_value());
    CHECK(m.num_ooms() == 1);
    CHECK(m.num_oom_retries() == 2);
    CHECK(m.allocated().v == 800 * MiB);
    CHECK(m.reserved().v == 800 * MiB);
  }
  SUBCASE("a split segment is not released") {
    m.free(d);
    m.free(c);
    auto small = must(m.allocate(Bytes{5 * MiB}));  // best fit: splits the cached 300 MiB segment
    CHECK(m.reserved().v == 800 * MiB);
    auto big = must(m.allocate(Bytes{700 * MiB}));  // releases the unsplit segment only
    CHECK(m.segments() == 2);
    CHECK(m.reserved().v == 300 * MiB + 700 * MiB);
    m.free(small);
    m.free(big);
  }
}

TEST_CASE("with max_split_size, oversize cached blocks are released first") {
  CachingAllocatorOptions opt;
  opt.capacity = Bytes{250 * MiB};
  opt.max_split_size = Bytes{64 * MiB};
  CachingAllocatorModel m(opt);
  auto live = must(m.allocate(Bytes{100 * MiB}));
  auto big = must(m.allocate(Bytes{100 * MiB}));
  auto mid = must(m.allocate(Bytes{5 * MiB}));  // a 20 MiB segment
  m.free(big);
  m.free(mid);
  CHECK(m.reserved().v == 220 * MiB);
  auto x = must(m.allocate(Bytes{70 * MiB}));  // the oversize 100 MiB is released, not the 20 MiB
  CHECK(m.num_oom_retries() == 0);
  CHECK(m.reserved().v == 190 * MiB);
  CHECK(m.segments() == 3);
  m.free(x);
  m.free(live);
}

TEST_CASE("zero-size requests and bad handles") {
  CachingAllocatorModel m;
  auto z = must(m.allocate(Bytes{0}));
  CHECK(m.allocated().v == 0);
  CHECK(m.reserved().v == 0);
  m.free(z);  // no-op, like freeing a null pointer
  CHECK_THROWS_AS(m.allocate(Bytes{-1}), std::invalid_argument);
  auto a = must(m.allocate(Bytes{1000}));
  m.free(a);
  CHECK_THROWS_AS(m.free(a), std::logic_error);  // double free
  CHECK_THROWS_AS(m.free(12345), std::logic_error);
}

TEST_CASE("a copy is an independent allocator state") {
  CachingAllocatorModel m;
  auto a = must(m.allocate(Bytes{30 * MiB}));
  auto s = must(m.allocate(Bytes{1000}));
  CachingAllocatorModel copy = m;
  copy.free(a);
  auto b = must(copy.allocate(Bytes{200 * MiB}));
  CHECK(copy.segments() == 3);
  CHECK(m.segments() == 2);
  CHECK(m.allocated().v == 30 * MiB + 1024);
  CHECK(m.block_size(a).v == 30 * MiB);  // still live in the original
  m.free(a);
  m.free(s);
  CHECK(m.allocated().v == 0);
  CHECK(copy.allocated().v == 200 * MiB + 1024);
  copy.free(b);
  CachingAllocatorModel assigned;
  assigned = copy;
  assigned.free(s);
  CHECK(assigned.allocated().v == 0);
  CHECK(copy.allocated().v == 1024);
}

TEST_CASE("100k alloc/free pairs replay quickly and consistently") {
  CachingAllocatorModel m;
  std::mt19937_64 rng(42);
  std::vector<CachingAllocatorModel::Handle> live;
  std::int64_t expected = 0;
  std::map<CachingAllocatorModel::Handle, std::int64_t> sizes;
  for (int i = 0; i < 100000; ++i) {
    const std::int64_t n = static_cast<std::int64_t>(rng() % (64 * MiB)) + 1;
    const auto got = m.allocate(Bytes{n}, static_cast<int>(rng() % 2));
    if (!got) FAIL("allocation " << i << " failed");
    const auto h = *got;
    live.push_back(h);
    sizes[h] = m.block_size(h).v;
    expected += sizes[h];
    if (live.size() > 200 || rng() % 2) {
      const std::size_t k = rng() % live.size();
      expected -= sizes[live[k]];
      sizes.erase(live[k]);
      m.free(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
  }
  CHECK(m.allocated().v == expected);
  CHECK(m.allocated() <= m.reserved());
  for (auto h : live) m.free(h);
  CHECK(m.allocated().v == 0);
  m.empty_cache();
  CHECK(m.reserved().v == 0);
}

// ---------------------------------------------------------------------------------
// Golden traces from the real allocator.
// ---------------------------------------------------------------------------------
namespace {

struct ReplayResult {
  std::size_t steps = 0;
  long first_mismatch = -1;
  std::string detail;
};

ReplayResult replay(const std::string& name) {
  const std::string path = std::string(ZEROPLAN_DATA_DIR) + "/tests/data/allocator_" + name + ".json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  const auto doc = nlohmann::json::parse(in);
  CachingAllocatorOptions opt;
  opt.capacity = Bytes{doc.at("capacity").get<std::int64_t>()};
  if (!doc.at("max_split_size").is_null())
    opt.max_split_size = Bytes{doc.at("max_split_size").get<std::int64_t>()};
  CachingAllocatorModel m(opt);
  std::map<std::int64_t, CachingAllocatorModel::Handle> handles;
  ReplayResult res;
  for (const auto& s : doc.at("steps")) {
    const std::string op = s.at("op").get<std::string>();
    bool ok_matches = true;
    if (op == "alloc") {
      auto h = m.allocate(Bytes{s.at("size").get<std::int64_t>()}, s.at("stream").get<int>());
      ok_matches = h.has_value() == s.at("ok").get<bool>();
      if (h) handles[s.at("id").get<std::int64_t>()] = *h;
    } else if (op == "free") {
      m.free(handles.at(s.at("id").get<std::int64_t>()));
    } else if (op == "empty_cache") {
      m.empty_cache();
    } else {
      FAIL("unknown op " << op);
    }
    const bool same = ok_matches && m.allocated().v == s.at("allocated").get<std::int64_t>() &&
                      m.reserved().v == s.at("reserved").get<std::int64_t>() &&
                      m.segments() == s.at("segments").get<std::int64_t>() &&
                      m.num_oom_retries() == s.at("retries").get<std::int64_t>() &&
                      m.num_ooms() == s.at("ooms").get<std::int64_t>();
    if (!same && res.first_mismatch < 0) {
      res.first_mismatch = static_cast<long>(res.steps);
      res.detail = s.dump() + " model allocated=" + std::to_string(m.allocated().v) +
                   " reserved=" + std::to_string(m.reserved().v) +
                   " segments=" + std::to_string(m.segments()) +
                   " retries=" + std::to_string(m.num_oom_retries());
    }
    ++res.steps;
  }
  return res;
}

}  // namespace

TEST_CASE("golden traces: allocated and reserved match PyTorch after every step") {
  for (const char* name : {"boundaries", "mixed", "training", "streams", "oom", "maxsplit"}) {
    CAPTURE(name);
    const ReplayResult r = replay(name);
    INFO(r.detail);
    CHECK(r.steps > 100);
    CHECK(r.first_mismatch == -1);
  }
}
