#include "exec/data.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/cpu/rng.hpp"

namespace zp::exec {

namespace cpu = zp::kernels::cpu;

namespace {
// The corpus: each token follows its predecessor by a fixed map with probability 0.9,
// otherwise it is uniform. Loss floor: H = -0.9 ln(0.9 + 0.1/V) - ... (synthetic_floor).
constexpr double kFollow = 0.9;
std::int64_t follow(std::int64_t t, std::int64_t V) { return (t * 7 + 3) % V; }
}  // namespace

DataSource::DataSource(const std::string& spec, const models::OpGraph& g, std::uint64_t seed)
    : g_(g), seed_(seed), vocab_(g.cfg.vocab) {
  if (spec == "synthetic") return;
  // A token file is a regular file: its size says how many tokens it holds (a folder, a
  // pipe or a device has no such size).
  std::error_code ec;
  const auto st = std::filesystem::status(spec, ec);
  if (std::filesystem::is_directory(st))
    throw InputError(spec, "--data", "is a directory; expected \"synthetic\" or a file of uint16 token ids");
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw InputError(spec, "--data", "is not a regular file (a device or pipe); expected \"synthetic\" or a file of "
                                     "uint16 token ids");
  std::ifstream in(spec, std::ios::binary | std::ios::ate);
  if (!in) throw InputError(spec, "", "--data: cannot read the token file (expected \"synthetic\" or a file of uint16 token ids)");
  const auto bytes = static_cast<std::int64_t>(in.tellg());
  if (bytes < 0) throw InputError(spec, "--data", "cannot tell the token file's size");
  if (bytes % 2 != 0) throw InputError(spec, "", fmt::format("--data: {} bytes is not a whole number of uint16 tokens", bytes));
  tokens_.resize(static_cast<std::size_t>(bytes / 2));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(tokens_.data()), bytes);
  if (static_cast<std::int64_t>(tokens_.size()) <= g.opt.seq_len + 1)
    throw InputError(spec, "", fmt::format("--data: {} tokens, need more than seq-len + 1 = {}", tokens_.size(), g.opt.seq_len + 1));
  for (std::size_t i = 0; i < tokens_.size(); ++i)
    if (tokens_[i] >= vocab_)
      throw InputError(spec, "", fmt::format("--data: token {} at position {} is outside the model's vocabulary of {}",
                                             tokens_[i], i, vocab_));
}

double DataSource::synthetic_floor() const {
  const double V = static_cast<double>(vocab_);
  const double p_hit = kFollow + (1.0 - kFollow) / V, p_miss = (1.0 - kFollow) / V;
  return -(p_hit * std::log(p_hit) + (V - 1.0) * p_miss * std::log(p_miss));
}

std::vector<std::int64_t> DataSource::sample(std::int64_t id, std::int64_t len) const {
  std::vector<std::int64_t> s(static_cast<std::size_t>(len));
  if (!tokens_.empty()) {
    const auto span = static_cast<std::int64_t>(tokens_.size()) - len;
    const std::int64_t start = static_cast<std::int64_t>(cpu::random_u32(seed_, static_cast<std::uint64_t>(id)) % static_cast<std::uint32_t>(span));
    for (std::int64_t i = 0; i < len; ++i) s[static_cast<std::size_t>(i)] = tokens_[static_cast<std::size_t>(start + i)];
    return s;
  }
  const auto base = static_cast<std::uint64_t>(id) * static_cast<std::uint64_t>(2 * len + 2);
  std::int64_t t = static_cast<std::int64_t>(cpu::random_u32(seed_, base) % static_cast<std::uint32_t>(vocab_));
  for (std::int64_t i = 0; i < len; ++i) {
    s[static_cast<std::size_t>(i)] = t;
    const auto k = base + 1 + 2 * static_cast<std::uint64_t>(i);
    t = cpu::uniform(seed_, k) < kFollow ? follow(t, vocab_)
                                          : static_cast<std::int64_t>(cpu::random_u32(seed_, k + 1) % static_cast<std::uint32_t>(vocab_));
  }
  return s;
}

MicroBatch DataSource::batch(std::int64_t step, int micro, int gas, int rank, int world) const {
  const std::int64_t B = g_.opt.micro_batch, T = g_.opt.seq_len;
  const bool bert = g_.cfg.family == models::Family::bert;
  MicroBatch mb(g_.inputs.size());
  for (std::size_t i = 0; i < g_.inputs.size(); ++i)
    mb[i].reserve(static_cast<std::size_t>(g_.tensors[static_cast<std::size_t>(g_.inputs[i])].bytes.v / 8));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t id = (((step - 1) * gas + micro) * world + rank) * B + b;
    auto s = sample(id, T + 1);
    for (std::size_t i = 0; i < g_.inputs.size(); ++i) {
      const std::string& name = g_.tensors[static_cast<std::size_t>(g_.inputs[i])].name;
      auto& v = mb[i];
      for (std::int64_t t = 0; t < (name == "next_sentence_label" ? 1 : T); ++t) {
        const auto tok = s[static_cast<std::size_t>(t)];
        // BERT masks 15% of positions (the input becomes the last id, the label the token).
        const bool masked = bert && cpu::uniform(seed_ ^ 0x5bd1e995u, static_cast<std::uint64_t>(id * T + t)) < 0.15;
        if (name == "input_ids") v.push_back(masked ? vocab_ - 1 : tok);
        else if (name == "labels") v.push_back(bert ? (masked ? tok : -100) : (t + 1 < T ? s[static_cast<std::size_t>(t + 1)] : -100));
        else if (name == "token_type_ids") v.push_back(t < T / 2 ? 0 : 1);
        else if (name == "attention_mask") v.push_back(1);
        else if (name == "next_sentence_label") v.push_back(id % 2);
        else throw std::logic_error("no data for input " + name);
      }
    }
  }
  return mb;
}

}  // namespace zp::exec
