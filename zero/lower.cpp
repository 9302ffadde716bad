// Lowering of (op graph, ds_config, N, rank) into the step program of one rank: the
// prologue of the optimizer wrapper DeepSpeed runs, each micro-step's forward/backward
// walk, then the step. zero/lower/context.hpp lists the parts and where each DeepSpeed
// behaviour is modelled.
#include "zero/lower.hpp"

#include <array>
#include <stdexcept>

#include "zero/lower/context.hpp"
#include "zero/lower/optimizer.hpp"
#include "zero/lower/replicate.hpp"
#include "zero/lower/walk.hpp"

namespace zp::zero {

namespace {

using lowering::Context;
using lowering::Marks;

// Size the program once: about three events and two buffers per op and micro-step.
void reserve(const Context& c) {
  const auto per_micro = c.g.ops.size() * (c.ckpt ? 4 : 3) + c.g.params.size() * 2;
  const auto n = per_micro * static_cast<std::size_t>(c.gas()) + 64;
  c.p.events.reserve(n);
  c.p.buffers.reserve(n);
  c.p.alloc_list.reserve(n);
  c.p.free_list.reserve(n);
  c.p.dep_list.reserve(2 * per_micro * static_cast<std::size_t>(c.gas()) + 64);
  c.p.slice_list.reserve(n);
}

void run(Context& c, lowering::OptimizerLowering& optimizer, lowering::Walk& walk) {
  reserve(c);
  c.describe_program();
  c.add_groups();
  c.library_workspaces();
  optimizer.prologue();
  Program& p = c.p;
  p.step_begin = static_cast<EventId>(p.events.size());
  if (c.opt.copied_micro_steps) *c.opt.copied_micro_steps = 0;
  const int G = c.gas();
  // Micro-steps are lowered one by one until one repeats the one before it: micro-step 2
  // micro-step 1, else 3 micro-step 2 (micro-step 0 may differ from the rest, and with it
  // where micro-step 1 finds what micro-step 0 left). The micro-steps after it, to G-2,
  // are then copies of it.
  std::array<Marks, 5> at{};
  int m = 0, compared = -1;
  for (; m < G; ++m) {
    if (m < static_cast<int>(at.size())) {
      c.b.close();  // finishes the event before; the micro-step opens its own first
      at[static_cast<std::size_t>(m)] = lowering::marks(p);
    }
    if ((m == 3 || m == 4) && c.opt.replicate_micro_steps && G > m + 1 &&
        lowering::periodic(p, at[static_cast<std::size_t>(m - 2)], at[static_cast<std::size_t>(m - 1)],
                           at[static_cast<std::size_t>(m)])) {
      compared = m - 2;
      break;
    }
    walk.micro_step(m);
  }
  if (compared >= 0) {
    // Lower the last micro-step and the step right after the repeating one, then make
    // room for the copies.
    const Marks& a = at[static_cast<std::size_t>(compared)];
    const Marks& b = at[static_cast<std::size_t>(compared + 1)];
    const Marks& cm = at[static_cast<std::size_t>(compared + 2)];
    const int copies = G - 1 - m;
    walk.micro_step(G - 1);
    optimizer.step();
    c.b.close();
    lowering::replicate(p, a, b, cm, copies);
    p.repeat = {static_cast<EventId>(b.events), static_cast<EventId>(cm.events - b.events), copies};
    if (c.opt.copied_micro_steps) *c.opt.copied_micro_steps = copies;
    return;
  }
  optimizer.step();
  c.b.close();
}

}  // namespace

Program lower(const models::OpGraph& g, const DsConfig& cfg, const Batch& batch, const LowerOptions& opt) {
  if (opt.world_size < 1) throw std::invalid_argument("world size must be >= 1");
  if (opt.rank < 0 || opt.rank >= opt.world_size) throw std::invalid_argument("rank out of range");
  // transformers turns the KV cache off under gradient checkpointing: the graph says whether
  // it was built for that (models::GraphOptions::gradient_checkpointing).
  if (g.opt.gradient_checkpointing != opt.activation_checkpointing)
    throw std::invalid_argument("activation checkpointing differs between the graph's options and the lowering's");
  Program p;
  Context c(g, cfg, batch, opt, p);
  const auto optimizer = lowering::make_optimizer(c);
  lowering::Walk walk(c, *optimizer);
  run(c, *optimizer, walk);
  return p;
}

}  // namespace zp::zero
