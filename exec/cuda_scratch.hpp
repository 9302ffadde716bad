#pragma once
// The CUDA device's own memory, as rules: what each op's kernels take from the device's
// scratch besides the program's buffers (head copies of column-block operands, dtype
// conversions, the loss gradient as a device scalar), decided from the op and its bound
// operands alone. exec/device_cuda_ops.cpp carves its temporaries from these sizes (so the
// rule is the code), and predict_cuda_scratch (exec/cuda_memory.hpp) runs the same rules
// over a whole program without a GPU, which is how `simulate --executor cuda` predicts the
// device memory a `train --device cuda` run measures. Built with and without CUDA.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "exec/device.hpp"
#include "models/graph.hpp"

namespace zp::exec {

// The device's scratch slots per stream: 0-3 its own (fp32 views of 16-bit operands for
// optimizer updates, norms, uploads), 4-7 the ops' (kCudaOpSlot + these).
inline constexpr std::size_t kCudaDeviceSlots = 8;
inline constexpr std::size_t kCudaOpSlot = 4;
inline constexpr std::size_t kTempSlot = 0;     // an op's temporaries, carved in parts
inline constexpr std::size_t kConvertSlot = 1;  // a dtype conversion on the way into a gradient
inline constexpr std::size_t kLossSlot = 3;     // d(loss)/d(loss) as one device element
// Every part starts 256-byte aligned, so the launchers take their vectorised paths.
inline constexpr std::size_t kScratchAlign = 256;
// An arena is never smaller than this (one cudaMalloc per slot and stream, grown on demand).
inline constexpr std::size_t kArenaMinBytes = std::size_t{1} << 20;

// What one forward or backward call of an op takes from the ops' slots (bytes; 0: none).
// `temp` lists the parts of the temporary slot in the order the op uses them (a part of 0
// bytes is not carved: its pointer is null).
struct OpScratch {
  std::vector<std::size_t> temp;
  std::size_t convert = 0;
  std::size_t loss = 0;
};

// The bytes of the temporary slot: the parts, each rounded up to kScratchAlign.
std::size_t scratch_parts_total(std::span<const std::size_t> parts);

// The rules, for an op whose operands `o` binds as the interpreter would (only the Refs'
// dtypes and whether they are bound are read). Throws std::logic_error where the CUDA
// device would refuse the op (mixed float dtypes, a layout it cannot read).
// `cudnn_attention`: train --attention-kernel cudnn (ContextOptions::sdpa_cudnn), under which
// cuDNN takes each fused attention it can (cuda_attention_takes_cudnn) and reads and writes
// its operands where they lie.
OpScratch cuda_forward_scratch(const models::Op& op, const Operands& o, bool cudnn_attention);
OpScratch cuda_backward_scratch(const models::Op& op, const Operands& o, bool cudnn_attention);
// Whether cuDNN takes a fused attention of this layout and storage dtype: asked by the rules
// and by the op dispatch alike (kernels::sdpa_cudnn_takes, under --attention-kernel cudnn).
bool cuda_attention_takes_cudnn(const models::HeadsLayout& f, DType dt, bool cudnn_attention);

// Shared with the op dispatch.
[[noreturn]] void cuda_op_fail(const models::Op& op, const std::string& what);
// The one float dtype of an op's bound operands (each launcher takes a single dtype).
DType cuda_op_dtype(const models::Op& op, std::initializer_list<Ref> refs);
// Whether op's gradient comes from the loss and as what: `from_loss` true when the op
// produces the graph's loss; `loss_op` when it is a cross entropy (which takes the
// gradient by value).
struct LossFlow {
  bool loss_op = false;
  bool from_loss = false;
  models::TensorId out_main = -1;
};
LossFlow cuda_loss_flow(const models::OpGraph& g, const models::Op& op);

}  // namespace zp::exec
