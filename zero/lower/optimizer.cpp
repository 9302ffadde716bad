#include "zero/lower/optimizer.hpp"

#include "zero/lower/bf16_optimizer.hpp"
#include "zero/lower/fused_optimizer.hpp"
#include "zero/lower/stage3.hpp"
#include "zero/lower/stage_1_and_2.hpp"

namespace zp::zero::lowering {

std::unique_ptr<OptimizerLowering> make_optimizer(Context& c) {
  if (c.bf16_opt) return std::make_unique<Bf16OptimizerLowering>(c);
  if (c.stage == 0) return std::make_unique<FusedOptimizerLowering>(c);
  if (c.stage == 3) return std::make_unique<Stage3Lowering>(c);
  return std::make_unique<ZeroOptimizerLowering>(c);
}

}  // namespace zp::zero::lowering
