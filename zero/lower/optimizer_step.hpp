#pragma once
// The pieces every optimizer step shares: the scalar all-reduces of the overflow check and
// the gradient norm, the update of a range of master params, the copy of the updated master
// back into the 16-bit params, and the post-step all-gather of the 16-bit partitions.
// The step's Python (per-tensor loops over param groups, the .item() syncs: stages 1/2 read the
// overflow flag back, stage 3 the flag and the norm) is the host event before them
// (Context::host_step), and for the ZeRO optimizers its fixed part the host event after what it
// reads back (Context::host_step_rest); for the bare optimizer its fixed part the host event
// beside the update.
#include <string>

#include "zero/lower/context.hpp"

namespace zp::zero::lowering {

// The overflow check (fp16; bf16 at stages 1/2 unless bf16.check_grad_overflow is off): a MAX
// all-reduce of the flag; always: a SUM all-reduce of the squared norm (stage_1_and_2.py /
// stage3.py step). One fp32 element each, after a local reduction over this rank's gradients
// (stage 3's flat partition, or at stages 1-2 the params overlapping the partition), which
// DeepSpeed takes tensor by tensor (Event::loop_kernels, loop_bytes), in `partitions` buffers
// for zeroplan's executor (2 at stage 2 with accumulation: the accumulated micro-steps and the
// last one). A ZeRO step's host loops run meanwhile; its fixed host part follows them
// (Context::host_step_rest).
void gradient_checks(Context& c, int partitions = 1);
// Stages 1/2: the params whose gradients overlap this rank's partition (the tensors its norm
// and its partition's flatten visit one by one).
std::int32_t partition_tensors(const Context& c);

// Data: dst (master or the params) -= update(grads, states) over [offset, offset +
// elements); grads -1: each param's own gradient (stage 0, fp32). Waits for the last
// reduction.
void optimizer_event(Context& c, std::int64_t elements, Placement where, const std::string& name, BufferId dst = -1,
                     BufferId grads = -1, std::int64_t offset = 0);

// DeepSpeed's unscale_and_clip_grads before the update on the device (FP16_Optimizer, stages
// 1-3): the fp32 gradients multiplied in place by 1 / combined scale, a kernel of its own that
// reads and writes them (zeroplan's executor folds the factor into the update): Event::loop_*.
void unscale_pass(Event& e, std::int64_t elements);

// Makes `e` the copy (cast) of the updated master range [offset, offset + n) into the
// 16-bit params (through the host staging buffer when the optimizer is offloaded).
void params_from_master(Context& c, Event& e, std::int64_t offset, std::int64_t n);

// runtime/utils.py all_gather_dp_groups: one all_gather_into_tensor of the flat 16-bit
// buffer (N × P elements) per param group (allgather_bucket_size is not used by it);
// nothing when N = 1.
void post_step_allgather(Context& c, std::int64_t P);

}  // namespace zp::zero::lowering
