#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/elementwise.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::Inputs;

// The operations, on fp32 values, in the CPU twins' order of operations.
struct Identity {
  __device__ float operator()(const float* x) const { return x[0]; }
};
struct Add {
  __device__ float operator()(const float* x) const { return x[0] + x[1]; }
};
struct Mul {
  __device__ float operator()(const float* x) const { return x[0] * x[1]; }
};
struct Scale {
  float alpha;
  __device__ float operator()(const float* x) const { return alpha * x[0]; }
};
struct AddScalar {
  float c;
  __device__ float operator()(const float* x) const { return x[0] + c; }
};
struct Pow2 {
  __device__ float operator()(const float* x) const { return x[0] * x[0]; }
};
struct Pow2Backward {  // x, dy
  __device__ float operator()(const float* x) const { return __fmul_rn(2.0f * x[0], x[1]); }
};
struct Pow3 {
  __device__ float operator()(const float* x) const { return __fmul_rn(x[0] * x[0], x[0]); }
};
struct Pow3Backward {  // x, dy
  __device__ float operator()(const float* x) const { return __fmul_rn(__fmul_rn(3.0f * x[0], x[0]), x[1]); }
};

template <class F>
void map1(void* y, const void* x, std::int64_t n, bool accumulate, DType dt, F f, cudaStream_t stream,
          const char* what) {
  detail::dispatch(dt, what, [&](auto tag) {
    using T = decltype(tag);
    detail::map<T, 1>(static_cast<T*>(y), Inputs<T, 1>{{static_cast<const T*>(x)}}, n, accumulate, f, stream, what);
  });
}

template <class F>
void map2(void* y, const void* a, const void* b, std::int64_t n, bool accumulate, DType dt, F f,
          cudaStream_t stream, const char* what) {
  detail::dispatch(dt, what, [&](auto tag) {
    using T = decltype(tag);
    detail::map<T, 2>(static_cast<T*>(y), Inputs<T, 2>{{static_cast<const T*>(a), static_cast<const T*>(b)}}, n,
                      accumulate, f, stream, what);
  });
}

// ------------------------------------------------------------------ broadcast
struct Broadcast {
  std::int64_t dims[4];
  std::int64_t bstride[4];  // b's stride along each of y's dims, 0 where b is broadcast
  std::int64_t bdims[4];
};

Broadcast make_broadcast(const Dims4& dims, const Dims4& b_dims) {
  Broadcast g{};
  std::int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    const auto k = static_cast<std::size_t>(i);
    g.dims[i] = dims[k];
    g.bdims[i] = b_dims[k];
    g.bstride[i] = (b_dims[k] == 1 && dims[k] != 1) ? 0 : stride;
    stride *= b_dims[k];
  }
  return g;
}

template <class T>
__global__ void add_broadcast_forward_kernel(T* __restrict__ y, const T* __restrict__ a, const T* __restrict__ b,
                                             Broadcast g) {
  const std::int64_t total = g.dims[0] * g.dims[1] * g.dims[2] * g.dims[3];
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t r = i, j = 0;
    for (int d = 3; d >= 0; --d) {
      j += (r % g.dims[d]) * g.bstride[d];
      r /= g.dims[d];
    }
    y[i] = detail::from_float<T>(detail::to_float(a[i]) + detail::to_float(b[j]));
  }
}

// One thread per element of b: the sum of dy over the positions broadcast onto it, in y's
// (row-major) order.
template <class T>
__global__ void add_broadcast_backward_kernel(T* __restrict__ db, const T* __restrict__ dy, Broadcast g,
                                              bool accumulate) {
  const std::int64_t total = g.bdims[0] * g.bdims[1] * g.bdims[2] * g.bdims[3];
  std::int64_t ystride[4];
  ystride[3] = 1;
  for (int d = 2; d >= 0; --d) ystride[d] = ystride[d + 1] * g.dims[d + 1];
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < total;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    // b's coordinates, and along each dim either that coordinate or the whole range of y.
    std::int64_t lo[4], hi[4], r = j;
    for (int d = 3; d >= 0; --d) {
      const std::int64_t c = r % g.bdims[d];
      r /= g.bdims[d];
      const bool bcast = g.bdims[d] == 1 && g.dims[d] != 1;
      lo[d] = bcast ? 0 : c;
      hi[d] = bcast ? g.dims[d] : c + 1;
    }
    float s = 0.0f;
    for (std::int64_t i0 = lo[0]; i0 < hi[0]; ++i0)
      for (std::int64_t i1 = lo[1]; i1 < hi[1]; ++i1)
        for (std::int64_t i2 = lo[2]; i2 < hi[2]; ++i2)
          for (std::int64_t i3 = lo[3]; i3 < hi[3]; ++i3)
            s += detail::to_float(dy[i0 * ystride[0] + i1 * ystride[1] + i2 * ystride[2] + i3 * ystride[3]]);
    detail::store1(db + j, s, accumulate);
  }
}

constexpr int kBroadcastBlock = 256;

std::int64_t numel(const Dims4& d) { return d[0] * d[1] * d[2] * d[3]; }

}  // namespace

void copy_accumulate(void* dst, const void* src, std::int64_t n, bool accumulate, DType dt, cudaStream_t stream) {
  require_float(dt, "copy_accumulate");
  if (n <= 0) return;
  if (!accumulate) {
    if (dst != src)
      ZP_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n * dtype_size(dt)), cudaMemcpyDeviceToDevice,
                                    stream));
    return;
  }
  map1(dst, src, n, true, dt, Identity{}, stream, "copy_accumulate");
}

void add_forward(void* y, const void* a, const void* b, std::int64_t n, DType dt, cudaStream_t stream) {
  map2(y, a, b, n, false, dt, Add{}, stream, "add_forward");
}

void add_backward(void* da, void* db, const void* dy, std::int64_t n, bool accumulate, DType dt,
                  cudaStream_t stream) {
  if (da != nullptr) copy_accumulate(da, dy, n, accumulate, dt, stream);
  if (db != nullptr) copy_accumulate(db, dy, n, accumulate, dt, stream);
}

void add_broadcast_forward(void* y, const void* a, const void* b, const Dims4& dims, const Dims4& b_dims, DType dt,
                           cudaStream_t stream) {
  const std::int64_t total = numel(dims);
  if (total <= 0) return;
  const Broadcast g = make_broadcast(dims, b_dims);
  detail::dispatch(dt, "add_broadcast_forward", [&](auto tag) {
    using T = decltype(tag);
    add_broadcast_forward_kernel<T><<<detail::grid_for(total, kBroadcastBlock), kBroadcastBlock, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b), g);
    ZP_CUDA_CHECK_LAUNCH("add_broadcast_forward_kernel");
  });
}

void add_broadcast_backward(void* da, void* db, const void* dy, const Dims4& dims, const Dims4& b_dims,
                            bool accumulate, DType dt, cudaStream_t stream) {
  if (da != nullptr) copy_accumulate(da, dy, numel(dims), accumulate, dt, stream);
  if (db == nullptr || numel(b_dims) <= 0) return;
  const Broadcast g = make_broadcast(dims, b_dims);
  detail::dispatch(dt, "add_broadcast_backward", [&](auto tag) {
    using T = decltype(tag);
    add_broadcast_backward_kernel<T><<<detail::grid_for(numel(b_dims), kBroadcastBlock), kBroadcastBlock, 0,
                                       stream>>>(static_cast<T*>(db), static_cast<const T*>(dy), g, accumulate);
    ZP_CUDA_CHECK_LAUNCH("add_broadcast_backward_kernel");
  });
}

void mul_forward(void* y, const void* a, const void* b, std::int64_t n, DType dt, cudaStream_t stream) {
  map2(y, a, b, n, false, dt, Mul{}, stream, "mul_forward");
}

void mul_backward(void* da, void* db, const void* dy, const void* a, const void* b, std::int64_t n, bool accumulate,
                  DType dt, cudaStream_t stream) {
  if (da != nullptr) map2(da, dy, b, n, accumulate, dt, Mul{}, stream, "mul_backward");
  if (db != nullptr) map2(db, dy, a, n, accumulate, dt, Mul{}, stream, "mul_backward");
}

void scale_forward(void* y, const void* x, std::int64_t n, float alpha, DType dt, cudaStream_t stream) {
  map1(y, x, n, false, dt, Scale{alpha}, stream, "scale_forward");
}

void scale_backward(void* dx, const void* dy, std::int64_t n, float alpha, bool accumulate, DType dt,
                    cudaStream_t stream) {
  map1(dx, dy, n, accumulate, dt, Scale{alpha}, stream, "scale_backward");
}

void add_scalar_forward(void* y, const void* x, std::int64_t n, float c, DType dt, cudaStream_t stream) {
  map1(y, x, n, false, dt, AddScalar{c}, stream, "add_scalar_forward");
}

void add_scalar_backward(void* dx, const void* dy, std::int64_t n, bool accumulate, DType dt, cudaStream_t stream) {
  copy_accumulate(dx, dy, n, accumulate, dt, stream);
}

void pow2_forward(void* y, const void* x, std::int64_t n, DType dt, cudaStream_t stream) {
  map1(y, x, n, false, dt, Pow2{}, stream, "pow2_forward");
}

void pow2_backward(void* dx, const void* x, const void* dy, std::int64_t n, bool accumulate, DType dt,
                   cudaStream_t stream) {
  map2(dx, x, dy, n, accumulate, dt, Pow2Backward{}, stream, "pow2_backward");
}

void pow3_forward(void* y, const void* x, std::int64_t n, DType dt, cudaStream_t stream) {
  map1(y, x, n, false, dt, Pow3{}, stream, "pow3_forward");
}

void pow3_backward(void* dx, const void* x, const void* dy, std::int64_t n, bool accumulate, DType dt,
                   cudaStream_t stream) {
  map2(dx, x, dy, n, accumulate, dt, Pow3Backward{}, stream, "pow3_backward");
}

}  // namespace zp::kernels::cuda
