#pragma once
// scaled_dot_product_attention in training mode through cuDNN's fused flash attention (the
// SDPA graphs of cudnn-frontend): (B, H, T, D) query heads over (B, Hk, T, D) key and value
// heads, H a multiple of Hk (grouped-query attention where Hk < H: cuDNN reads each kv head for
// its group of H / Hk query heads, and sums their key and value gradients itself, so nothing is
// repeated or summed outside it). Each operand either contiguous or read and written in place
// as D-column blocks of (B, T, W) rows (SdpaCudnnLayout: a projection's output, as PyTorch's
// sdpa reads the head views Hugging Face passes it), causal or not (no additive key mask),
// 16-bit storage, fp32 softmax statistics. What it keeps for the backward is what sdpa.cuh
// keeps: O and the row logsumexp (B, H, T) in fp32, cuDNN's "stats" (natural log, the scaled
// scores' max plus the log of their exponentials' sum); so the memory the program predicts is
// the same.
//
// Dropout draws cuDNN's Philox masks keyed by a (seed, offset) pair of int64 on the device
// (the program's rng_state tensor, which the forward writes before it runs): the backward
// regenerates the forward's mask from the same pair. The masks are not the CPU twin's (the
// same rate, other elements), so a run with attention dropout is compared with the CPU device
// by its statistics, not element by element.
//
// Graphs are built once per shape (the first call takes hundreds of milliseconds) and kept in
// the Context; cuDNN's workspace comes from Context::buffer, so device_bytes() counts it.
#include <cstdint>
#include <string>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/sdpa.cuh"

namespace zp::kernels::cuda {

// Whether this build has cuDNN's attention (cuDNN's and cudnn-frontend's headers found at
// configure time).
bool sdpa_cudnn_built();
// Opens cuDNN 9 (libcudnn.so.9) once per process: "" when it is there, else one line saying
// why not. Binaries do not link cuDNN or NVRTC: cuDNN is opened here, on first use; NVRTC by
// cudnn-frontend, only for its run-time compiled engines.
std::string sdpa_cudnn_load();
// The cuDNN library loaded at run time (cudnnGetVersion: 91900 for 9.19.0); 0 without cuDNN.
std::int64_t sdpa_cudnn_version();
// "" where cuDNN's attention takes these operands (kernels/common/sdpa_dims.hpp,
// sdpa_cudnn_takes); else one line saying why not (a build without cuDNN, cuDNN 9 not found at
// run time, a storage dtype
// other than bf16/fp16, a head dim that is not a multiple of 8 up to 128, one position).
std::string sdpa_cudnn_refusal(std::int64_t T, std::int64_t D, DType dt);

// Where each (B, X, T, D) operand lies (X = H for q, the output and their gradients, Hk for k, v
// and theirs), as the row stride of its positions: 0 for contiguous heads (element (b, h, t, d)
// at ((b·X + h)·T + t)·D + d), W for D-column blocks of (B, T, W) rows (at (b·T + t)·W + h·D + d
// from the operand's pointer, W ≥ X·D). The output's gradient lies as the output. Each layout
// is part of the graph's key.
struct SdpaCudnnLayout {
  std::int64_t q = 0, k = 0, v = 0, o = 0, dq = 0, dk = 0, dv = 0;
  auto key() const { return std::make_tuple(q, k, v, o, dq, dk, dv); }
};

void sdpa_cudnn_forward(Context& ctx,
                        void* o,                    // (B, H, T, D)
                        float* lse,                 // (B, H, T)
                        const void* q,              // (B, H, T, D)
                        const void* k, const void* v,  // (B, Hk, T, D)
                        std::int64_t B, std::int64_t H, std::int64_t Hk, std::int64_t T, std::int64_t D, bool causal,
                        float scale,
                        float p,
                        const std::int64_t* rng,    // device: {seed, offset}; read only where p > 0
                        DType dt, cudaStream_t stream, const SdpaCudnnLayout& layout = {});

// Writes dq (B, H, T, D), dk and dv (B, Hk, T, D), or adds into those `acc` names (through a
// contiguous temporary in the Context's buffer, added into the gradient as it lies: cuDNN writes
// its outputs whole).
void sdpa_cudnn_backward(Context& ctx, void* dq, void* dk, void* dv,
                         const void* dout,          // (B, H, T, D)
                         const void* q, const void* k, const void* v,
                         const void* o,             // the forward's output
                         const float* lse,          // the forward's logsumexp
                         std::int64_t B, std::int64_t H, std::int64_t Hk, std::int64_t T, std::int64_t D, bool causal,
                         float scale,
                         float p, const std::int64_t* rng, DType dt, cudaStream_t stream, SdpaAccumulate acc = {},
                         const SdpaCudnnLayout& layout = {});

// cuDNN's workspace for the forward and for the backward at these operands (its graphs built
// if they are not yet), for the memory prediction and the bench.
struct SdpaCudnnWorkspace {
  std::int64_t forward = 0, backward = 0;
};
SdpaCudnnWorkspace sdpa_cudnn_workspace(Context& ctx, std::int64_t B, std::int64_t H, std::int64_t Hk, std::int64_t T,
                                        std::int64_t D, bool causal, float scale, float p, DType dt);

}  // namespace zp::kernels::cuda
