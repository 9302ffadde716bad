#pragma once
// The CUDA device (exec/device.hpp on one GPU): the program's buffers in device memory,
// placed by the caching-allocator model in segments that are each one cudaMalloc
// (exec/allocator.hpp), every op through kernels/cuda in the dtype the program stores it,
// each program stream a CUDA stream of its own (ordered by CUDA events as
// exec/stream_order.hpp says), event times from CUDA events. Built only with CUDA
// (ZEROPLAN_HAVE_CUDA); without it, make_cuda_device says so.
#include <memory>
#include <string>

#include "core/units.hpp"
#include "exec/device.hpp"

namespace zp::exec {

struct CudaDeviceOptions {
  int device = -1;          // CUDA device ordinal (-1: local rank modulo the visible devices)
  int local_rank = 0;
  bool allow_tf32 = false;  // fp32 GEMMs on TF32 tensor cores
  // The 16-bit fused attention through cuDNN (kernels/cuda/sdpa_cudnn.cuh) instead of
  // kernels/cuda/sdpa; a build without cuDNN refuses it.
  bool cudnn_attention = false;
};

// What the driver reports in use on the device (cudaMemGetInfo: total - free), at three
// moments, so the memory outside the program (context, library workspaces, the device's
// own scratch) is measured, not assumed.
struct DriverMemory {
  Bytes total{0};
  Bytes after_context{0};  // the CUDA context created, nothing allocated
  Bytes after_init{0};     // + cuBLASLt handle and workspace, the kernels' scratch
  Bytes after_comm{0};     // + the communicator's own buffers (NCCL), when one was made
  Bytes peak{0};           // the most seen after any allocation of the device
  // The device's own scratch (exec/device_cuda.cpp: fp32 views of 16-bit operands, the
  // ops' temporaries and dtype conversions) at its largest: outside the program's buffers.
  Bytes device_scratch{0};
  // What the libraries took after init, outside our allocations (kc::Context::driver_growth):
  // cuBLASLt's kernels loaded at a GEMM plan's first product, and cuDNN's handle and attention
  // engines (--attention-kernel cudnn). In the peak once made; never freed before the end.
  Bytes cublaslt_loaded{0};
  Bytes cudnn{0};
  std::string gpu;         // the device's name
};

// Throws std::runtime_error with one line when no CUDA device can be used (a build
// without CUDA, no GPU visible, the driver refusing).
std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o);
// The driver's memory figures of a device make_cuda_device made (nullptr-safe: empty).
DriverMemory driver_memory(const Device* d);
// Records the driver's figure after the communicator was made (DriverMemory::after_comm).
void mark_after_comm(Device* d);
// The CUDA stream (a cudaStream_t) of the event being run (the compute stream between steps:
// one per program stream, exec/stream_order.hpp), the device's ordinal and its PCI bus id
// ("0000:19:00.0"), for a communicator on the same GPU.
void* cuda_stream(const Device& d);
int cuda_ordinal(const Device& d);
std::string cuda_bus_id(const Device& d);
// Whether this build has the CUDA device at all.
bool cuda_device_built();
// CUDA devices this process can use (0: none, or a build without CUDA).
int cuda_devices_visible();
// "" where `train --attention-kernel cudnn` can run (a build with cuDNN's attention, and cuDNN 9
// loaded at run time); else one line saying why not.
std::string cudnn_attention_refusal();

}  // namespace zp::exec
