#pragma once
// Training data for the executor: a seeded synthetic corpus with learnable structure,
// or a flat file of uint16 token ids. A micro-batch depends only on (seed, step,
// micro-step, rank, world size), never on the ZeRO stage.
#include <cstdint>
#include <string>
#include <vector>

#include "exec/interpreter.hpp"
#include "models/graph.hpp"

namespace zp::exec {

class DataSource {
 public:
  // `spec`: "synthetic" or a path to a uint16 token file. Bad input → InputError.
  DataSource(const std::string& spec, const models::OpGraph& g, std::uint64_t seed);
  MicroBatch batch(std::int64_t step, int micro, int gas, int rank, int world) const;
  // Entropy (nats per token) of the synthetic corpus's next token: the loss floor.
  double synthetic_floor() const;

 private:
  std::vector<std::int64_t> sample(std::int64_t id, std::int64_t len) const;
  const models::OpGraph& g_;
  std::uint64_t seed_;
  std::vector<std::uint16_t> tokens_;  // file data (empty: synthetic)
  std::int64_t vocab_ = 0;
};

}  // namespace zp::exec
