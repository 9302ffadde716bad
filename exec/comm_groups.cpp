// The communicators a device backend makes for the program's groups, and where a rank runs
// (exec/comm.hpp).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exec/comm.hpp"

namespace zp::exec {

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
