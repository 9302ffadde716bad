#pragma once
// offload_optimizer and offload_param with device cpu (ZeRO-Offload, ZeRO-Infinity): the
// host buffers, the optimizer step on the host stream, and the copies between host and
// device. The stage files call these where their offloaded paths differ.
#include <functional>

#include "zero/lower/context.hpp"

namespace zp::zero::lowering {

// Where the fp32 master weights (and optimizer states) live, and their role.
inline Placement optimizer_placement(const Context& c) { return c.offload_opt ? Placement::host : Placement::device; }
inline BufferRole master_role(const Context& c) {
  return c.offload_opt ? BufferRole::host_master : BufferRole::master_partition;
}

// Stages 1/2: the host fp32 gradient partition (P,), a host 16-bit staging partition (P,)
// and a device staging buffer of 2 × the largest param.
void host_buffers_stage12(Context& c, std::int64_t P);
// Stage 3: the host fp32 gradient partition (elements,).
void host_grad_partition(Context& c, std::int64_t elements);

// Stages 1/2 step on the host: this rank's gradient partition to the host
// (`release_device_grads` frees the device copies while that copy is issued), the host
// optimizer, the updated 16-bit partition back to the device.
void host_step_stage12(Context& c, std::int64_t P, const std::function<void()>& release_device_grads);
// Stage 3 sub-group `gi` ([offset, offset + n) of the partition): the host optimizer and
// the updated 16-bit params back (to the host partition under offload_param).
void host_step_subgroup(Context& c, std::int64_t gi, std::int64_t offset, std::int64_t n);

// offload_param: before a gather, this rank's 16-bit partitions of its params are copied in
// from the host (`bytes` of them).
void fetch_from_host(Context& c, Stream s, Phase ph, std::int32_t label, Bytes bytes);

}  // namespace zp::zero::lowering
