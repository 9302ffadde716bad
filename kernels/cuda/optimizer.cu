#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/optimizer.cuh"

namespace zp::kernels::cuda {

namespace {

constexpr int kStepBlock = 512;
constexpr std::int64_t kChunk = std::int64_t{1} << 16;  // elements per block
constexpr int kMaxTensors = 24;
constexpr int kMaxChunks = 320;  // keeps the kernel's argument under 4 KB

// Scalars of one Adam step, as the CPU twin rounds them.
struct AdamScalars {
  float decay, l2, w1, one_minus_w1, b2, w2, neg_step_size, bc2_sqrt, eps;
  bool has_wd, decoupled, lerp_low;
};

AdamScalars adam_scalars(std::int64_t step, const AdamConfig& cfg) {
  const double t = static_cast<double>(step);
  AdamScalars s{};
  s.decay = static_cast<float>(1.0 - cfg.lr * cfg.weight_decay);
  s.l2 = static_cast<float>(cfg.weight_decay);
  s.w1 = static_cast<float>(1.0 - cfg.beta1);
  s.one_minus_w1 = 1.0f - s.w1;
  s.b2 = static_cast<float>(cfg.beta2);
  s.w2 = static_cast<float>(1.0 - cfg.beta2);
  s.neg_step_size = static_cast<float>(-(cfg.lr / (1.0 - std::pow(cfg.beta1, t))));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t)));
  s.eps = static_cast<float>(cfg.eps);
  s.has_wd = cfg.weight_decay != 0.0;
  s.decoupled = cfg.decoupled;
  s.lerp_low = std::fabs(s.w1) < 0.5f;
  return s;
}

struct SgdScalars {
  float wd, mom, damp, neg_lr;
  bool has_wd, first, nesterov;
};

SgdScalars sgd_scalars(std::int64_t step, const SgdConfig& cfg) {
  SgdScalars s{};
  s.wd = static_cast<float>(cfg.weight_decay);
  s.mom = static_cast<float>(cfg.momentum);
  s.damp = static_cast<float>(1.0 - cfg.dampening);
  s.neg_lr = static_cast<float>(-cfg.lr);
  s.has_wd = cfg.weight_decay != 0.0;
  s.first = step <= 1;
  s.nesterov = cfg.nesterov;
  return s;
}

template <class T>
__device__ __forceinline__ void write_p16(void* p16, std::int64_t i, float v) {
  static_cast<T*>(p16)[i] = detail::from_float<T>(v);
}

// One element of Adam, every operation rounded on its own as on the CPU (no FMA).
__device__ __forceinline__ float adam_element(float& p, float grad, float& m, float& v, const AdamScalars& s) {
  if (s.has_wd) {
    if (s.decoupled)
      p = __fmul_rn(p, s.decay);
    else
      grad = __fadd_rn(grad, __fmul_rn(s.l2, p));
  }
  const float diff = __fsub_rn(grad, m);
  m = s.lerp_low ? __fadd_rn(m, __fmul_rn(s.w1, diff)) : __fsub_rn(grad, __fmul_rn(diff, s.one_minus_w1));
  v = __fadd_rn(__fmul_rn(v, s.b2), __fmul_rn(__fmul_rn(s.w2, grad), grad));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom));
  return p;
}

__device__ __forceinline__ float sgd_element(float& p, float grad, float* buf, const SgdScalars& s) {
  if (s.has_wd) grad = __fadd_rn(grad, __fmul_rn(s.wd, p));
  if (buf != nullptr) {
    const float b = s.first ? grad : __fadd_rn(__fmul_rn(*buf, s.mom), __fmul_rn(s.damp, grad));
    *buf = b;
    grad = s.nesterov ? __fadd_rn(grad, __fmul_rn(s.mom, b)) : b;
  }
  p = __fadd_rn(p, __fmul_rn(s.neg_lr, grad));
  return p;
}

struct AdamList {
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  void* p16[kMaxTensors];
  std::int64_t n[kMaxTensors];
  std::int16_t tensor[kMaxChunks];
  std::int32_t chunk[kMaxChunks];
};

struct SgdList {
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* buf[kMaxTensors];
  void* p16[kMaxTensors];
  std::int64_t n[kMaxTensors];
  std::int16_t tensor[kMaxChunks];
  std::int32_t chunk[kMaxChunks];
};

template <class P16>
__global__ void adam_kernel(AdamList list, AdamScalars s, const float* __restrict__ grad_scale, float grad_factor,
                            const int* __restrict__ skip) {
  if (skip != nullptr && *skip != 0) return;
  const int t = list.tensor[blockIdx.x];
  const std::int64_t n = list.n[t];
  const std::int64_t lo = static_cast<std::int64_t>(list.chunk[blockIdx.x]) * kChunk;
  const std::int64_t hi = lo + kChunk < n ? lo + kChunk : n;
  const bool scaled = grad_scale != nullptr || grad_factor != 1.0f;
  const float gs = grad_scale != nullptr ? *grad_scale : grad_factor;
  float* p = list.p[t];
  const float* g = list.g[t];
  float* m = list.m[t];
  float* v = list.v[t];
  void* p16 = list.p16[t];
  for (std::int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    const float gi = scaled ? __fmul_rn(g[i], gs) : g[i];
    adam_element(pi, gi, mi, vi, s);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (p16 != nullptr) write_p16<P16>(p16, i, pi);
  }
}

template <class P16>
__global__ void sgd_kernel(SgdList list, SgdScalars s, const float* __restrict__ grad_scale, float grad_factor,
                           const int* __restrict__ skip) {
  if (skip != nullptr && *skip != 0) return;
  const int t = list.tensor[blockIdx.x];
  const std::int64_t n = list.n[t];
  const std::int64_t lo = static_cast<std::int64_t>(list.chunk[blockIdx.x]) * kChunk;
  const std::int64_t hi = lo + kChunk < n ? lo + kChunk : n;
  const bool scaled = grad_scale != nullptr || grad_factor != 1.0f;
  const float gs = grad_scale != nullptr ? *grad_scale : grad_factor;
  float* p = list.p[t];
  const float* g = list.g[t];
  float* buf = list.buf[t];
  void* p16 = list.p16[t];
  for (std::int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float pi = p[i];
    const float gi = scaled ? __fmul_rn(g[i], gs) : g[i];
    sgd_element(pi, gi, buf != nullptr ? buf + i : nullptr, s);
    p[i] = pi;
    if (p16 != nullptr) write_p16<P16>(p16, i, pi);
  }
}

// Fills lists of at most kMaxTensors tensors and kMaxChunks chunks and calls launch(list,
// chunks) for each; a tensor cut by a full list continues in the next one.
template <class List, class Tensor, class Copy, class Launch>
void for_each_list(const Tensor* tensors, std::size_t count, Copy copy, Launch launch) {
  List list{};
  int nt = 0, nb = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const Tensor& tensor = tensors[k];
    if (tensor.n <= 0) continue;
    copy(list, nt, tensor);
    ++nt;
    const std::int64_t chunks = detail::ceil_div(tensor.n, kChunk);
    for (std::int64_t c = 0; c < chunks; ++c) {
      list.tensor[nb] = static_cast<std::int16_t>(nt - 1);
      list.chunk[nb] = static_cast<std::int32_t>(c);
      ++nb;
      const bool last_chunk = c == chunks - 1;
      if (nb == kMaxChunks || (nt == kMaxTensors && last_chunk)) {
        launch(list, nb);
        nb = 0;
        if (last_chunk) {
          nt = 0;
        } else {
          copy(list, 0, tensor);
          nt = 1;
        }
      }
    }
  }
  if (nb > 0) launch(list, nb);
}

void check_chunks(std::int64_t n) {
  if (detail::ceil_div(n, kChunk) > (std::int64_t{1} << 31) - 1)
    throw std::invalid_argument("optimizer step: a partition of more than 2^47 elements");
}

template <class F>
void dispatch_p16(DType dt, F&& f) {
  switch (dt) {
    case DType::fp16: f(detail::fp16{}); return;
    case DType::fp32: f(float{}); return;
    default: f(detail::bf16{}); return;
  }
}

constexpr int kElemBlock = 256;

template <class T>
__global__ void scale_device_kernel_t(T* x, std::int64_t n, const float* alpha) {
  const float a = *alpha;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = detail::from_float<T>(detail::to_float(x[i]) * a);
}

template <class T>
__global__ void scale_kernel_t(T* x, std::int64_t n, float a) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = detail::from_float<T>(detail::to_float(x[i]) * a);
}

// Exponent bits all ones: ±inf or NaN, read from the storage bits.
template <class T>
__device__ __forceinline__ bool non_finite(T x);
template <>
__device__ __forceinline__ bool non_finite<float>(float x) {
  return (__float_as_uint(x) & 0x7F800000u) == 0x7F800000u;
}
template <>
__device__ __forceinline__ bool non_finite<detail::bf16>(detail::bf16 x) {
  return (__bfloat16_as_ushort(x) & 0x7F80u) == 0x7F80u;
}
template <>
__device__ __forceinline__ bool non_finite<detail::fp16>(detail::fp16 x) {
  return (__half_as_ushort(x) & 0x7C00u) == 0x7C00u;
}

template <class T>
__global__ void inf_nan_kernel(int* found, const T* x, std::int64_t n) {
  bool bad = false;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    bad = bad || non_finite(x[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1;  // every writer writes the same value
}

}  // namespace

static void check_scale(const StepOptions& options, const char* what) {
  if (options.grad_scale != nullptr && options.grad_factor != 1.0f)
    throw std::invalid_argument(std::string(what) +
                                ": StepOptions has a device grad_scale and a grad_factor; allowed: one");
}

void adam_step_multi(const AdamTensor* tensors, std::size_t count, std::int64_t step, const AdamConfig& cfg,
                     const StepOptions& options, cudaStream_t stream) {
  check_scale(options, "adam_step_multi");
  for (std::size_t k = 0; k < count; ++k) check_chunks(tensors[k].n);
  const AdamScalars s = adam_scalars(step, cfg);
  dispatch_p16(options.p16_dtype, [&](auto tag) {
    using P16 = decltype(tag);
    for_each_list<AdamList>(
        tensors, count,
        [](AdamList& l, int i, const AdamTensor& t) {
          l.p[i] = t.p;
          l.g[i] = t.g;
          l.m[i] = t.m;
          l.v[i] = t.v;
          l.p16[i] = t.p16;
          l.n[i] = t.n;
        },
        [&](const AdamList& l, int blocks) {
          adam_kernel<P16><<<static_cast<unsigned>(blocks), kStepBlock, 0, stream>>>(l, s, options.grad_scale,
                                                                                     options.grad_factor, options.skip);
          ZP_CUDA_CHECK_LAUNCH("adam_kernel");
        });
  });
}

void sgd_step_multi(const SgdTensor* tensors, std::size_t count, std::int64_t step, const SgdConfig& cfg,
                    const StepOptions& options, cudaStream_t stream) {
  check_scale(options, "sgd_step_multi");
  for (std::size_t k = 0; k < count; ++k) check_chunks(tensors[k].n);
  const SgdScalars s = sgd_scalars(step, cfg);
  const bool momentum = cfg.momentum != 0.0;
  dispatch_p16(options.p16_dtype, [&](auto tag) {
    using P16 = decltype(tag);
    for_each_list<SgdList>(
        tensors, count,
        [momentum](SgdList& l, int i, const SgdTensor& t) {
          l.p[i] = t.p;
          l.g[i] = t.g;
          l.buf[i] = momentum ? t.buf : nullptr;
          l.p16[i] = t.p16;
          l.n[i] = t.n;
        },
        [&](const SgdList& l, int blocks) {
          sgd_kernel<P16><<<static_cast<unsigned>(blocks), kStepBlock, 0, stream>>>(l, s, options.grad_scale,
                                                                                    options.grad_factor, options.skip);
          ZP_CUDA_CHECK_LAUNCH("sgd_kernel");
        });
  });
}

void adam_step(float* p, const float* g, float* m, float* v, std::int64_t n, std::int64_t step, const AdamConfig& cfg,
               cudaStream_t stream, float grad_factor) {
  AdamTensor t;
  t.p = p;
  t.g = g;
  t.m = m;
  t.v = v;
  t.n = n;
  StepOptions o;
  o.grad_factor = grad_factor;
  adam_step_multi(&t, 1, step, cfg, o, stream);
}

void sgd_step(float* p, const float* g, float* buf, std::int64_t n, std::int64_t step, const SgdConfig& cfg,
              cudaStream_t stream, float grad_factor) {
  SgdTensor t;
  t.p = p;
  t.g = g;
  t.buf = buf;
  t.n = n;
  StepOptions o;
  o.grad_factor = grad_factor;
  sgd_step_multi(&t, 1, step, cfg, o, stream);
}

void scale_inplace(void* x, std::int64_t n, float alpha, DType dt, cudaStream_t stream) {
  if (n <= 0) return;
  detail::dispatch(dt, "scale_inplace", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel_t<T><<<detail::grid_for(n, kElemBlock), kElemBlock, 0, stream>>>(static_cast<T*>(x), n, alpha);
    ZP_CUDA_CHECK_LAUNCH("scale_kernel_t");
  });
}

void scale_inplace_device(void* x, std::int64_t n, const float* alpha, DType dt, cudaStream_t stream) {
  if (n <= 0) return;
  detail::dispatch(dt, "scale_inplace_device", [&](auto tag) {
    using T = decltype(tag);
    scale_device_kernel_t<T><<<detail::grid_for(n, kElemBlock), kElemBlock, 0, stream>>>(static_cast<T*>(x), n,
                                                                                          alpha);
    ZP_CUDA_CHECK_LAUNCH("scale_device_kernel_t");
  });
}

void has_inf_or_nan(int* found, const void* x, std::int64_t n, bool accumulate, DType dt, cudaStream_t stream) {
  require_float(dt, "has_inf_or_nan");
  if (!accumulate) ZP_CUDA_CHECK(cudaMemsetAsync(found, 0, sizeof(int), stream));
  if (n <= 0) return;
  detail::dispatch(dt, "has_inf_or_nan", [&](auto tag) {
    using T = decltype(tag);
    inf_nan_kernel<T><<<detail::grid_for(n, kElemBlock), kElemBlock, 0, stream>>>(found, static_cast<const T*>(x),
                                                                                   n);
    ZP_CUDA_CHECK_LAUNCH("inf_nan_kernel");
  });
}

}  // namespace zp::kernels::cuda
