#pragma once
// The device backend: what the interpreter asks a device to compute. The interpreter
// decides nothing here: it binds each op's operands (activations, gradients, params, the
// token ids and scratch) to this device's memory through Operands, then asks for the op's
// forward or backward, or for an optimizer update on a flat partition. The CPU device
// runs kernels/cpu on host memory; a CUDA device runs kernels/cuda on device memory
// behind the same calls (kernels/ keeps the same signatures for both).
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/optimizer.hpp"
#include "models/graph.hpp"

namespace zp::exec {

// One op's operands, bound by the interpreter (nullptr: the tensor is not bound, e.g. a
// gradient nobody needs). Valid for the duration of one forward/backward call.
class Operands {
 public:
  virtual ~Operands() = default;
  virtual const models::OpGraph& graph() const = 0;
  virtual float* act(models::TensorId t) const = 0;
  virtual float* grad(models::TensorId t) const = 0;
  virtual const std::int64_t* ids(models::TensorId t) const = 0;
  virtual float* param(models::ParamId p) const = 0;
  virtual float* param_grad(models::ParamId p) const = 0;
  // Per-call working memory, `slot` 0..3, at least `n` floats.
  virtual float* scratch(std::size_t slot, std::int64_t n) = 0;
  // The dropout stream of this micro-step (masks are a function of it and the op id).
  virtual std::uint64_t dropout_seed() const = 0;
  // d(loss)/d(loss) as backward starts: the loss scale over the GAS.
  virtual float loss_grad() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // y = f(x) of graph op `op` (models::Fn), and its backward: input and param gradients
  // accumulate into what is bound.
  virtual void forward(const models::Op& op, Operands& o) = 0;
  virtual void backward(const models::Op& op, Operands& o) = 0;
  // Optimizer updates on a flat fp32 partition (`step` counts applied updates from 1).
  virtual void adam_step(float* p, const float* g, float* m, float* v, std::int64_t n, std::int64_t step,
                         const kernels::cpu::AdamConfig& c) = 0;
  virtual void sgd_step(float* p, const float* g, float* momentum, std::int64_t n, std::int64_t step,
                        const kernels::cpu::SgdConfig& c) = 0;
  virtual void scale(float* x, std::int64_t n, float factor) = 0;
  // dst[i] += src[i]
  virtual void accumulate(float* dst, const float* src, std::int64_t n) = 0;
};

}  // namespace zp::exec
