#pragma once
// Micro-steps that repeat (LowerOptions::replicate_micro_steps): once a lowered micro-step
// is the one before it moved by one micro-step's worth of ids, the micro-steps after it (to
// GAS-2) are copies of it. The lowering lowers the last micro-step and the step right after
// it, then inserts the copies (Program::repeat records them).
#include <cstddef>

#include "zero/program.hpp"

namespace zp::zero::lowering {

// Where each of the program's lists stood at a point of the lowering.
struct Marks {
  std::size_t events = 0, buffers = 0, allocs = 0, frees = 0, deps = 0, slices = 0;
};
Marks marks(const Program& p);

// Whether the micro-step [b, c) is the micro-step [a, b) moved by one micro-step: the same
// events, buffers, lists and labels, every reference relative (into itself or the one
// before: it moves with the micro-step) or fixed (before both: the prologue's buffers, what
// micro-step 0 allocated for the whole step), and every buffer the first allocates freed by
// the end of the second (so nothing a repeated micro-step allocates outlives the next one).
bool periodic(const Program& p, const Marks& a, const Marks& b, const Marks& c);

// The program holds the micro-steps up to [b, c), which repeats [a, b), then the last
// micro-step and the step (from c). Inserts `copies` copies of [b, c) before the last one
// and moves it and the step past them: every reference at or after a moves by the copies'
// micro-steps.
void replicate(Program& p, const Marks& a, const Marks& b, const Marks& c, int copies);

}  // namespace zp::zero::lowering
