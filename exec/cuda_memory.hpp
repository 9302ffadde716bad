#pragma once
// The CUDA device's memory outside the program's buffers, predicted without a GPU: the
// interpreter runs the rank's program (the prologue and one step) on a device that
// computes nothing and records what the CUDA device (exec/device_cuda.cpp) would take for
// itself: each stream's scratch arenas (the ops' temporaries by the rules of
// exec/cuda_scratch.hpp; fp32 views of 16-bit operands for updates, norms and uploads) and
// the kernels' Context of each stream other than the compute stream. With the program's
// reserved bytes (sim/) and the per-GPU figures the driver reports for the CUDA context,
// the kernels' libraries and NCCL's communicator (sim/devices.json, measured by
// `train --device cuda`), this is the device-used figure a run's driver reports.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/units.hpp"
#include "models/graph.hpp"
#include "sim/device.hpp"
#include "zero/ds_config.hpp"
#include "zero/program.hpp"

namespace zp::exec {

// One scratch arena: its stream (zero::Stream), slot (0-3 the device's own, 4-7 the ops'),
// size (the largest request, never below kArenaMinBytes) and the event that made it so.
struct CudaArena {
  int stream = 0;
  std::size_t slot = 0;
  Bytes bytes{};
  std::string largest_by;
};

struct CudaScratchPrediction {
  std::vector<CudaArena> arenas;  // by stream, then slot
  Bytes stream_contexts{};        // the Contexts of streams other than compute (workspace-less)
  // The compute stream's Context's buffer (kernels::cuda::Context::buffer): cuDNN's attention
  // workspace, with train --attention-kernel cudnn (kernels/common/sdpa_dims.hpp).
  Bytes context_buffer{};
  std::string context_buffer_by;  // the op that needs it at its largest
  bool cudnn = false;             // cuDNN takes an attention: its handle and engines are made
  Bytes total{};                  // arenas + stream_contexts + context_buffer: DriverMemory::device_scratch
};

// The prediction for one rank of a program (zero::expand's or a repeating one; run
// expanded). Throws std::logic_error where the CUDA device would refuse an op.
// `cudnn_attention`: the run's fused attention is cuDNN's (train --attention-kernel cudnn).
CudaScratchPrediction predict_cuda_scratch(const models::OpGraph& g, const zero::Program& p,
                                           const zero::DsConfig& cfg, bool cudnn_attention = false);

// The bytes a kernels::cuda::Context holds on the device: the compute stream's (the default
// ContextOptions: a 32 MiB cuBLASLt workspace and 64 MiB of scratch; exec/device_cuda.cpp
// checks it) and another stream's (no GEMM workspace, 1 MiB of scratch).
inline constexpr std::size_t kComputeContextBytes = std::size_t{96} << 20;
inline constexpr std::size_t kStreamContextBytes = std::size_t{1} << 20;
// The driver maps device memory in pages of this size: a cudaMalloc uses whole pages.
inline constexpr std::size_t kDevicePageBytes = std::size_t{2} << 20;

// A rank's device-used bytes at its peak as the driver reports them (cudaMemGetInfo;
// exec::DriverMemory), part by part: the program's reserved segments (sim/'s prediction),
// the scratch above with the pages its allocations round up to, and what the GPU's entry in
// sim/devices.json measured for the context, the libraries and one rank's NCCL
// communicator, and cuDNN's handle and engines (or a cluster profile's). `known` is false where
// there are no such figures, or none for a communicator or cuDNN a run has (those parts 0).
struct CudaDeviceUsed {
  bool known = false;
  Bytes context{};       // DriverMemory::after_context
  Bytes libraries{};     // after_init - after_context: the compute stream's Context and the rest
  Bytes communicator{};  // after_comm - after_init (NCCL; 0 with --comm mpi)
  Bytes reserved{};      // the program's segments (the caching allocator's reserved peak)
  Bytes scratch{};       // DriverMemory::device_scratch
  Bytes cudnn{};         // DriverMemory::cudnn: cuDNN's handle and engines, where cuDNN runs
  Bytes pages{};         // the rounding of the scratch's allocations up to whole pages
  Bytes total{};
};
// `nccl`: the run communicates through NCCL (`train --comm nccl`, the default on GPUs with a
// rank each). The communicator's figure is one rank's; with more ranks NCCL's buffers grow
// with its peers and channels, which is not modelled (CudaDeviceUsed::known stays true; the
// caller says so).
CudaDeviceUsed predict_cuda_device_used(const sim::DeviceSpec::ExecutorMemory& figures, Bytes reserved_peak,
                                        const CudaScratchPrediction& s, bool nccl);

}  // namespace zp::exec
