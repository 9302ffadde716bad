#pragma once
// engine.py allreduce_gradients → buffered_allreduce_fallback, the gradient reduction of
// the wrappers that are not ZeRO optimizers (FP16_Optimizer at stage 0, BF16_Optimizer):
// at the GAS boundary, every param's gradient in registration order, in buckets of at most
// 5e8 elements, each flattened, all-reduced on the compute stream and copied back.
#include "zero/lower/context.hpp"

namespace zp::zero::lowering {

// `flat_grads32`: BF16_Optimizer's flat fp32 gradient buffer the gradients are read from
// and written back to (get_grads_for_reduction, by flat offset); -1: each param's own
// gradient in the model dtype.
void buffered_allreduce(Context& c, BufferId flat_grads32);

}  // namespace zp::zero::lowering
