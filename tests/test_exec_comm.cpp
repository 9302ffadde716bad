// The communication backends' shared accounting and group planning (exec/comm.hpp):
// the bytes each rank sends per collective, which the MPI backend sends and the NCCL
// backend counts, and the rounds of ncclCommSplit that make one communicator per group.
#include <algorithm>
#include <stdexcept>

#include <doctest/doctest.h>

#include "exec/comm.hpp"
#include "zero/program.hpp"

using zp::DType;
using zp::exec::encode_groups;
using zp::exec::split_rounds;
using zp::zero::CollKind;
using zp::zero::collective_bytes_sent;

TEST_CASE("bytes sent per rank: ring volumes over blocks, the first elements mod n one longer") {
  // 10 fp32 elements over 4 ranks: blocks of 3, 3, 2, 2.
  CHECK(collective_bytes_sent(CollKind::reduce_scatter, 10, DType::fp32, 4, 0, 0).v == (10 - 3) * 4);
  CHECK(collective_bytes_sent(CollKind::reduce_scatter, 10, DType::fp32, 4, 3, 0).v == (10 - 2) * 4);
  CHECK(collective_bytes_sent(CollKind::all_gather, 10, DType::fp32, 4, 1, 0).v == 3 * 3 * 4);
  CHECK(collective_bytes_sent(CollKind::all_gather, 10, DType::fp32, 4, 2, 0).v == 3 * 2 * 4);
  // An all-reduce is a reduce-scatter and an all-gather; 2 (n-1)/n of the buffer when n divides it.
  for (std::int64_t me = 0; me < 4; ++me)
    CHECK(collective_bytes_sent(CollKind::all_reduce, 10, DType::bf16, 4, me, 0).v ==
          collective_bytes_sent(CollKind::reduce_scatter, 10, DType::bf16, 4, me, 0).v +
              collective_bytes_sent(CollKind::all_gather, 10, DType::bf16, 4, me, 0).v);
  CHECK(collective_bytes_sent(CollKind::all_reduce, 1 << 20, DType::bf16, 8, 5, 0).v == 2 * 7 * (1 << 20) * 2 / 8);
  // Reduce: every rank but the root sends the buffer; broadcast: a chain, the last sends nothing.
  CHECK(collective_bytes_sent(CollKind::reduce, 10, DType::fp16, 4, 2, 2).v == 0);
  CHECK(collective_bytes_sent(CollKind::reduce, 10, DType::fp16, 4, 1, 2).v == 20);
  CHECK(collective_bytes_sent(CollKind::broadcast, 10, DType::fp32, 4, 0, 1).v == 0);  // last after 1, 2, 3
  CHECK(collective_bytes_sent(CollKind::broadcast, 10, DType::fp32, 4, 3, 1).v == 40);
  // A group of one moves nothing.
  for (auto k : {CollKind::all_reduce, CollKind::reduce_scatter, CollKind::all_gather, CollKind::reduce, CollKind::broadcast})
    CHECK(collective_bytes_sent(k, 1000, DType::fp32, 1, 0, 0).v == 0);
}

TEST_CASE("communicators for the program's groups: one split per round of disjoint groups, alike on every rank") {
  const std::vector<int> world = {0, 1, 2, 3};
  auto group = [](std::string name, std::vector<int> ranks) { return zp::zero::Group{std::move(name), std::move(ranks)}; };
  // hpZ-like: each rank's program names the world and its own pair; groups of one are not sent.
  CHECK(encode_groups({group("dp", {0, 1, 2, 3}), group("hpz", {0, 1}), group("self", {0})}) == "0,1,2,3;0,1;");
  const std::vector<std::string> texts = {"0,1,2,3;0,1;", "0,1,2,3;0,1;", "0,1,2,3;2,3;", "0,1,2,3;2,3;"};
  const auto rounds = split_rounds(texts, world);
  REQUIRE(rounds.size() == 1);  // the two pairs are disjoint: one split makes both
  CHECK(rounds[0] == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  // The order the ranks' texts arrive in does not change the plan (every rank must call the same splits).
  std::vector<std::string> reversed(texts.rbegin(), texts.rend());
  CHECK(split_rounds(reversed, world) == rounds);
  // Overlapping groups need a split each.
  const auto overlap = split_rounds({"0,1;1,2;", "0,1;", "1,2;2,3;", "2,3;"}, world);
  REQUIRE(overlap.size() == 2);
  CHECK(overlap[0] == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  CHECK(overlap[1] == std::vector<std::vector<int>>{{1, 2}});
  // The world has its communicator already; a program of the world only needs no split.
  CHECK(split_rounds({"0,1,2,3;", "0,1,2,3;", "0,1,2,3;", "0,1,2,3;"}, world).empty());
  // Group order matters (it is the ranks' order in the collective): a permuted world is a group of its own.
  CHECK(split_rounds({"1,0;"}, {0, 1}).size() == 1);
  CHECK_THROWS_AS(split_rounds({"0,1"}, world), std::logic_error);
}
