#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/detail.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::Inputs;

constexpr float kSqrtHalf = 0.70710678118654752440f;     // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1/sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kGeluCoeff = 0.044715f;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

struct Gelu {
  __device__ float operator()(const float* a) const { return 0.5f * a[0] * (1.0f + erff(a[0] * kSqrtHalf)); }
};
struct GeluBackward {  // x, dy
  __device__ float operator()(const float* a) const {
    const float x = a[0];
    const float cdf = 0.5f * (1.0f + erff(x * kSqrtHalf));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return a[1] * (cdf + x * pdf);
  }
};
struct GeluTanh {
  __device__ float operator()(const float* a) const {
    const float v = a[0];
    const float inner = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
    return 0.5f * v * (1.0f + tanhf(inner));
  }
};
struct GeluTanhBackward {  // x, dy
  __device__ float operator()(const float* a) const {
    const float v = a[0];
    const float t = tanhf(kSqrt2OverPi * (v + kGeluCoeff * v * v * v));
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v * v);
    const float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner;
    return a[1] * grad;
  }
};
struct Silu {
  __device__ float operator()(const float* a) const { return a[0] * sigmoid(a[0]); }
};
struct SiluBackward {  // x, dy
  __device__ float operator()(const float* a) const {
    const float s = sigmoid(a[0]);
    return a[1] * s * (1.0f + a[0] * (1.0f - s));
  }
};
struct SiluMul {  // gate, up
  __device__ float operator()(const float* a) const { return a[0] * sigmoid(a[0]) * a[1]; }
};
struct SiluMulBackwardGate {  // dy, gate, up
  __device__ float operator()(const float* a) const {
    const float s = sigmoid(a[1]);
    return a[0] * a[2] * s * (1.0f + a[1] * (1.0f - s));
  }
};
struct SiluMulBackwardUp {  // dy, gate
  __device__ float operator()(const float* a) const { return a[0] * (a[1] * sigmoid(a[1])); }
};
struct Relu {
  __device__ float operator()(const float* a) const { return a[0] < 0.0f ? 0.0f : a[0]; }
};
struct ReluBackward {  // y, dy
  __device__ float operator()(const float* a) const { return a[0] <= 0.0f ? 0.0f : a[1]; }
};
struct Tanh {
  __device__ float operator()(const float* a) const { return tanhf(a[0]); }
};
struct TanhBackward {  // y, dy
  __device__ float operator()(const float* a) const { return a[1] * (1.0f - a[0] * a[0]); }
};

template <int N, class F>
void run(void* y, const void* const (&in)[N], std::int64_t n, bool accumulate, DType dt, F f, cudaStream_t stream,
         const char* what) {
  detail::dispatch(dt, what, [&](auto tag) {
    using T = decltype(tag);
    Inputs<T, N> ins{};
    for (int k = 0; k < N; ++k) ins.p[k] = static_cast<const T*>(in[k]);
    detail::map<T, N>(static_cast<T*>(y), ins, n, accumulate, f, stream, what);
  });
}

}  // namespace

void gelu_forward(void* y, const void* x, std::int64_t n, DType dt, cudaStream_t stream) {
  run<1>(y, {x}, n, false, dt, Gelu{}, stream, "gelu_forward");
}
void gelu_backward(void* dx, const void* x, const void* dy, std::int64_t n, bool accumulate, DType dt,
                   cudaStream_t stream) {
  run<2>(dx, {x, dy}, n, accumulate, dt, GeluBackward{}, stream, "gelu_backward");
}
void gelu_tanh_forward(void* y, const void* x, std::int64_t n, DType dt, cudaStream_t stream) {
  run<1>(y, {x}, n, false, dt, GeluTanh{}, stream, "gelu_tanh_forward");
}
void gelu_tanh_backward(void* dx, const void* x, const void* dy, std::int64_t n, bool accumulate, DType dt,
                        cudaStream_t stream) {
  run<2>(dx, {x, dy}, n, accumulate, dt, GeluTanhBackward{}, stream, "gelu_tanh_backward");
}
void silu_forward(void* y, const void* x, std::int64_t n, DType dt, cudaStream_t stream) {
  run<1>(y, {x}, n, false, dt, Silu{}, stream, "silu_forward");
}
void silu_backward(void* dx, const void* x, const void* dy, std::int64_t n, bool accumulate, DType dt,
                   cudaStream_t stream) {
  run<2>(dx, {x, dy}, n, accumulate, dt, SiluBackward{}, stream, "silu_backward");
}
void silu_mul_forward(void* y, const void* gate, const void* up, std::int64_t n, DType dt, cudaStream_t stream) {
  run<2>(y, {gate, up}, n, false, dt, SiluMul{}, stream, "silu_mul_forward");
}
void silu_mul_backward(void* dgate, void* dup, const void* dy, const void* gate, const void* up, std::int64_t n,
                       bool accumulate, DType dt, cudaStream_t stream) {
  if (dgate != nullptr)
    run<3>(dgate, {dy, gate, up}, n, accumulate, dt, SiluMulBackwardGate{}, stream, "silu_mul_backward");
  if (dup != nullptr) run<2>(dup, {dy, gate}, n, accumulate, dt, SiluMulBackwardUp{}, stream, "silu_mul_backward");
}
void relu_forward(void* y, const void* x, std::int64_t n, DType dt, cudaStream_t stream) {
  run<1>(y, {x}, n, false, dt, Relu{}, stream, "relu_forward");
}
void relu_backward(void* dx, const void* y, const void* dy, std::int64_t n, bool accumulate, DType dt,
                   cudaStream_t stream) {
  run<2>(dx, {y, dy}, n, accumulate, dt, ReluBackward{}, stream, "relu_backward");
}
void tanh_forward(void* y, const void* x, std::int64_t n, DType dt, cudaStream_t stream) {
  run<1>(y, {x}, n, false, dt, Tanh{}, stream, "tanh_forward");
}
void tanh_backward(void* dx, const void* y, const void* dy, std::int64_t n, bool accumulate, DType dt,
                   cudaStream_t stream) {
  run<2>(dx, {y, dy}, n, accumulate, dt, TanhBackward{}, stream, "tanh_backward");
}

}  // namespace zp::kernels::cuda
