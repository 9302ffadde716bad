// The communicators a device backend makes for the program's groups, and where a rank runs
// (exec/comm.hpp).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "exec/comm.hpp"

namespace zp::exec {

void stop_if_refused(const std::vector<std::string>& refusals, int rank, const std::string& what) {
  std::vector<int> who;
  for (std::size_t r = 0; r < refusals.size(); ++r)
    if (!refusals[r].empty()) who.push_back(static_cast<int>(r));
  if (who.empty()) return;
  const std::string& first = refusals[static_cast<std::size_t>(who.front())];
  if (std::all_of(refusals.begin(), refusals.end(), [&](const std::string& v) { return v == first; }))
    throw InputError(first);
  const std::string& own = refusals[static_cast<std::size_t>(rank)];
  if (!own.empty()) {
    std::fprintf(stderr, "zeroplan: rank %d: %s\n", rank, own.c_str());
  } else {
    std::fprintf(stderr, "zeroplan: rank %d: stopped: rank%s %s refused %s: %s\n", rank, who.size() > 1 ? "s" : "",
                 fmt::format("{}", fmt::join(who, ", ")).c_str(), what.empty() ? "its input" : what.c_str(),
                 first.c_str());
  }
  throw RankRefused("refused");
}

void agree_on_refusals(Comm& comm, const std::string& mine, const std::string& what) {
  stop_if_refused(comm.gather_for_report(mine), comm.rank(), what);
}

int local_rank(int rank) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* e = std::getenv(v); e && *e) return std::atoi(e);
  return rank;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "?";
  return buf.data();
}

std::string encode_groups(const std::vector<zero::Group>& groups) {
  std::string out;
  for (const auto& g : groups)
    if (g.ranks.size() > 1) out += fmt::format("{};", fmt::join(g.ranks, ","));
  return out;
}

std::vector<std::vector<std::vector<int>>> split_rounds(const std::vector<std::string>& per_rank,
                                                        const std::vector<int>& world) {
  std::map<std::vector<int>, bool> all;  // ordered, so every rank computes the same rounds
  for (const auto& text : per_rank) {
    std::size_t at = 0;
    while (at < text.size()) {
      const std::size_t end = text.find(';', at);
      if (end == std::string::npos) throw std::logic_error(fmt::format("split_rounds: '{}' is not encode_groups'", text));
      std::vector<int> ranks;
      for (std::size_t q = at; q < end;) {
        const std::size_t comma = std::min(text.find(',', q), end);
        ranks.push_back(std::stoi(text.substr(q, comma - q)));
        q = comma + 1;
      }
      if (ranks != world) all.emplace(std::move(ranks), true);
      at = end + 1;
    }
  }
  std::vector<std::vector<std::vector<int>>> rounds;
  for (const auto& entry : all) {
    const std::vector<int>& ranks = entry.first;
    auto disjoint = [&](const std::vector<std::vector<int>>& round) {
      for (const auto& other : round)
        for (int r : ranks)
          if (std::find(other.begin(), other.end(), r) != other.end()) return false;
      return true;
    };
    auto round = std::find_if(rounds.begin(), rounds.end(), disjoint);
    if (round == rounds.end()) round = rounds.insert(rounds.end(), std::vector<std::vector<int>>{});
    round->push_back(ranks);
  }
  return rounds;
}

}  // namespace zp::exec
