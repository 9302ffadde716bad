#pragma once
// The per-stream resources some launchers need, owned by one object (no globals): the
// cuBLASLt handle, its workspace and its algorithm choices per GEMM shape, and a scratch
// area for the second pass of deterministic reductions (partial sums), the embedding
// gradient's sort and the attention backward's row terms. Everything is allocated by the
// constructor (cudaMalloc, outside the program's allocator: report device_bytes() as
// device overhead) and freed by the destructor.
//
// A Context serves one stream at a time: launchers that take one reuse its workspace and
// scratch, so two streams running such kernels concurrently need a Context each.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/common/gemm_pieces.hpp"
#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

struct ContextOptions {
  std::size_t blas_workspace_bytes = std::size_t{32} << 20;  // cuBLASLt's recommendation for Hopper
  std::size_t scratch_bytes = kernels::kStagedScratchBytes;
  bool allow_tf32 = false;  // fp32 GEMMs on TF32 tensor cores (off: exact fp32 products)
  // A product of at least this many m·n·k whose rows are not 16-byte aligned runs in pieces
  // staged through the scratch with padded rows (kernels/cuda/bmm.cu); 0: every such product.
  double staged_min_work = kernels::kStagedMinWork;
  // Positions per inner step of the 16-bit attention backward (kernels/cuda/sdpa.cu): 16 or
  // 32 (twice the independent products per step for twice the registers). fp32 always 16.
  int sdpa_backward_chunk = 16;
  // The 16-bit attention backward at head dims up to 64 in one pass: dQ summed from the dK/dV
  // kernel's dS in a fixed order (the key tiles ascending, through a counter per query tile)
  // in an fp32 buffer of the Context (B·H·T·D floats), instead of a second kernel recomputing
  // S and dP. Deterministic, but not the two-pass kernels' bits for dQ.
  bool sdpa_backward_one_pass = false;
  // With sdpa_backward_one_pass: each key tile adds its dQ into the fp32 sums by atomic adds as
  // soon as it has it, as FlashAttention-2's backward does, instead of waiting its turn in the
  // key tiles' order. No wavefront (no block waits for another), but the sums' order, and so
  // dQ's last bits, vary from run to run. dK and dV are the two-pass kernels' bits either way.
  bool sdpa_backward_atomic_dq = false;
  // The two-pass 16-bit attention backward at head dim 64, in steps of 16: the dK/dV kernel
  // reads its block's K and V from shared memory at each step, in 128 registers a thread (four
  // blocks a multiprocessor where shared memory holds four: Hopper, Blackwell), or, true (and
  // on other GPUs and head dims), holds them in registers (168 a thread: three blocks). The
  // same products in the same order: the same bits. On an H100, four blocks take 11-16% less
  // time (bench/cuda_vs_torch.md).
  bool sdpa_backward_kv_registers = false;
  // The 16-bit fused attention through cuDNN's flash attention (kernels/cuda/sdpa_cudnn.cpp)
  // instead of kernels/cuda/sdpa.cu, where this build has cuDNN and the head dim suits it.
  // Dropout then draws cuDNN's masks, not the CPU twin's (same rate, other elements).
  bool sdpa_cudnn = false;
  // Warps of the one-pass LayerNorm backward (kernels/cuda/norm.cu), each taking the rows k,
  // k + warps, ...: 0 as many as this GPU holds at once (one wave). The parameters' gradients
  // are summed in the warps' order: a fixed number gives the same bits on every GPU.
  std::int64_t layernorm_backward_warps = 0;
  // A Linear's bias gradient summed by cuBLASLt's bias-gradient epilogue (BGRADA/BGRADB) as
  // the weight-gradient product reads dY, instead of a column sum over dY of its own
  // (kernels/cuda/linear.cu). Only where the product runs unstaged (dims multiples of 8,
  // 16-byte aligned operands) and cuBLASLt has an algorithm for it; else the column sum.
  // Off: not yet timed (docs/cuda.md, "The bias gradient in the dW product").
  bool bias_grad_epilogue = false;
};

class Context {
 public:
  explicit Context(const ContextOptions& options = ContextOptions());
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const;                 // the CUDA device current at construction
  int sm_count() const;               // its multiprocessors
  std::size_t device_bytes() const;   // workspace + scratch held on the device
  std::size_t scratch_bytes() const;
  bool allow_tf32() const;
  std::uint64_t staged_products() const;  // products run in staged pieces so far
  bool bias_grad_epilogue() const;
  std::uint64_t bias_grad_epilogues() const;  // bias gradients summed by cuBLASLt's epilogue so far
  int sdpa_backward_chunk() const;
  bool sdpa_backward_one_pass() const;
  bool sdpa_backward_atomic_dq() const;
  bool sdpa_backward_kv_registers() const;
  std::int64_t layernorm_backward_warps() const;
  bool sdpa_cudnn() const;
  // cuDNN's handle and the attention graphs it built (kernels/cuda/sdpa_cudnn.cpp's type),
  // made at first use and released with the Context.
  std::shared_ptr<void>& cudnn_state();

  // Device memory the libraries take after the Context was made, outside every allocation of
  // ours: what the driver's used bytes (cudaMemGetInfo) grew by across the calls that load
  // code or make state there. Each call is measured on the host thread, where nothing else of
  // this process allocates meanwhile: a GEMM plan's first product (cuBLASLt loads its kernels
  // lazily), and cuDNN's handle, each attention graph's build and its first execution. The
  // driver's figure is the whole GPU's: with other processes on it (ranks sharing the GPU),
  // what they allocate meanwhile is counted too.
  enum class Library : int { cublaslt, cudnn };
  std::int64_t driver_growth(Library l) const;
  void add_driver_growth(Library l, std::int64_t bytes);

  // The scratch area, at least `bytes` long (throws CudaError naming `what` when larger
  // than scratch_bytes()). Valid until the next launcher that takes this Context runs.
  void* scratch(std::size_t bytes, const char* what);
  // A second area, grown (freed and allocated again, synchronising the device, so not while a
  // CUDA graph is being captured) when a launcher needs more than it holds; counted in
  // device_bytes(). Valid until the next call. Like the scratch, it belongs to one launcher
  // at a time: launchers sharing a Context must not run concurrently on different streams
  // (the one-pass attention backward keeps its ordering counters here, and a second call's
  // reset of them would stall the first).
  void* buffer(std::size_t bytes);

  struct Impl;  // cuBLASLt state (kernels/cuda/blas.cuh)
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace zp::kernels::cuda
