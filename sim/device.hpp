#pragma once
// The device database (sim/devices.json): memory, peak tensor FLOP/s, HBM bandwidth,
// and the per-device constant that sits outside any program (CUDA context, library
// workspaces, NCCL buffers) used to turn reserved bytes into device-used bytes.
#include <string>
#include <vector>

#include "core/units.hpp"

namespace zp::sim {

struct DeviceSpec {
  std::string name;                  // "V100-16GB", "A100-80GB", "H200-141GB", "cpu"
  std::string arch;                  // "volta", "ampere", "hopper", "cpu"
  Bytes memory{};                    // usable device memory (what torch.cuda.mem_get_info reports as total)
  FlopsPerSecond peak_tensor_flops{};// dense fp16/bf16 tensor-core peak
  FlopsPerSecond peak_fp32_flops{};  // non-tensor fp32 peak
  BytesPerSecond hbm_bandwidth{};
  BytesPerSecond nvlink_bandwidth{}; // per direction, whole device (0 for none)
  Bytes context_overhead{};          // CUDA context, library handles, NCCL buffers: outside the allocator
  Bytes cublas_workspace{};          // PyTorch's cuBLAS workspace per (handle, stream), through the allocator
  Bytes cublaslt_workspace{};        // and cuBLASLt's
  bool bf16 = true;                  // V100 has no bf16 tensor cores
  // zeroplan's own CUDA executor (train --device cuda) on this GPU, as its driver figures
  // measured it (measured false: never measured here): the CUDA context; what the kernels'
  // libraries hold besides their Context's workspace and scratch (cuBLASLt's handle, driver
  // pages); one rank's NCCL communicator. exec/cuda_memory.hpp adds the rest.
  // A cluster profile (zeroplan calibrate on train --device cuda runs) measures them for its GPU.
  struct ExecutorMemory {
    bool measured = false;
    Bytes context{};
    Bytes libraries{};
    Bytes nccl_one_rank{};
    bool nccl_measured = false;  // a profile of MPI runs only has no communicator figure
    // cuDNN's handle and its attention engines' code (train --attention-kernel cudnn): what the
    // driver's used bytes grew by across cuDNN's calls (exec::DriverMemory::cudnn).
    Bytes cudnn{};
    bool cudnn_measured = false;
    std::string source;
  } executor;
};

// All devices, from ZEROPLAN_DATA_DIR/sim/devices.json.
const std::vector<DeviceSpec>& devices();
// Lookup by name, case-insensitive; aliases like "v100" → "V100-16GB", "h200" → "H200-141GB".
// Unknown → zp::InputError("--gpu", "", "unknown GPU 'X'; known: ...").
const DeviceSpec& find_device(const std::string& name);

}  // namespace zp::sim
