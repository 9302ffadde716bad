// Lowering of (op graph, ds_config, N, rank) into the step program of one rank: the
// prologue of the optimizer wrapper DeepSpeed runs, each micro-step's forward/backward
// walk, then the step. zero/lower/context.hpp lists the parts and where each DeepSpeed
// behaviour is modelled.
#include "zero/lower.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "zero/lower/context.hpp"
#include "zero/lower/optimizer.hpp"
#include "zero/lower/walk.hpp"

namespace zp::zero {

namespace {

using lowering::Context;

// Size the program once: about three events and two buffers per op and stored micro-step
// (at most six are stored when repeating ones are represented once).
void reserve(const Context& c) {
  const auto per_micro = c.g.ops.size() * (c.ckpt ? 4 : 3) + c.g.params.size() * 2;
  const auto micro = static_cast<std::size_t>(c.opt.replicate_micro_steps ? std::min(c.gas(), 6) : c.gas());
  const auto n = per_micro * micro + 64;
  c.p.events.reserve(n);
  c.p.buffers.reserve(n);
  c.p.alloc_list.reserve(n);
  c.p.free_list.reserve(n);
  c.p.dep_list.reserve(2 * per_micro * micro + 64);
  c.p.slice_list.reserve(n);
}

// The step's events and buffers must be numbered by 32-bit ids once every micro-step is
// counted (Program::num_events).
void check_size(const Context& c, const Program& p) {
  constexpr std::int64_t kMax = std::numeric_limits<EventId>::max();
  if (p.num_events() <= kMax && p.num_buffers() <= kMax) return;
  throw InputError(c.cfg.file, "gradient_accumulation_steps",
                   fmt::format("{} micro-steps of {} make a step of {} events and {} buffers; at most {} of each "
                               "are supported: use fewer micro-steps (a larger micro-batch)",
                               c.gas(), c.g.cfg.name, p.num_events(), p.num_buffers(), kMax));
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
  // where micro-step 1 finds what micro-step 0 left). That one then stands for the
  // micro-steps after it, to G-2 (Program::repeat); the last micro-step and the step are
  // lowered right after it.
  std::array<ListMarks, 5> at{};
  int m = 0, compared = -1;
  for (; m < G; ++m) {
    if (m < static_cast<int>(at.size())) {
      c.b.close();  // finishes the event before; the micro-step opens its own first
      at[static_cast<std::size_t>(m)] = list_marks(p);
    }
    if ((m == 3 || m == 4) && c.opt.replicate_micro_steps && G > m + 1 &&
        repeats_previous(p, at[static_cast<std::size_t>(m - 2)], at[static_cast<std::size_t>(m - 1)],
                         at[static_cast<std::size_t>(m)])) {
      compared = m - 2;
      break;
    }
    walk.micro_step(m);
  }
  if (compared >= 0) {
    const ListMarks& a = at[static_cast<std::size_t>(compared)];
    const ListMarks& b = at[static_cast<std::size_t>(compared + 1)];
    const int copies = G - 1 - m;
    p.repeat = {static_cast<EventId>(b.events), static_cast<EventId>(b.events - a.events),
                static_cast<BufferId>(b.buffers), static_cast<BufferId>(b.buffers - a.buffers), copies};
    walk.micro_step(G - 1);
    c.host_step(optimizer.host_step(), optimizer.host_step_tensors());
    optimizer.step();
    c.b.close();
    check_size(c, p);
    if (c.opt.copied_micro_steps) *c.opt.copied_micro_steps = copies;
    return;
  }
  c.host_step(optimizer.host_step(), optimizer.host_step_tensors());
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
