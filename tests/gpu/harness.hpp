#pragma once
// What the GPU kernel tests share: device buffers, uploads in a storage dtype (the host
// copy rounded the same way, so the CPU twin sees exactly the GPU's inputs), poisoned
// outputs, and comparisons with a tolerance atol + |ref|·rtol plus the relative L2 error
// ‖got − ref‖ / ‖ref‖ against a band per dtype, printing the first mismatches.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/rng.hpp"

namespace zp::gpu_test {

using Vec = std::vector<float>;
namespace kc = zp::kernels::cpu;

inline std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

inline void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(err));
}
#define ZP_TEST_CUDA(call) ::zp::gpu_test::cuda_ok((call), #call)

// A device allocation (RAII); `offset` bytes past a 256-byte aligned base when a test wants
// a pointer that is not 16-byte aligned (the kernels' scalar paths).
class Dev {
 public:
  explicit Dev(std::size_t bytes, std::size_t offset = 0) : bytes_(bytes), offset_(offset) {
    ZP_TEST_CUDA(cudaMalloc(&base_, bytes + offset + 16));
  }
  ~Dev() { cudaFree(base_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void* get() const { return static_cast<char*>(base_) + offset_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(get());
  }
  std::size_t bytes() const { return bytes_; }
  // 0xFF bytes: NaN in fp32, bf16 and fp16, so an element no kernel wrote never matches.
  void poison() const { ZP_TEST_CUDA(cudaMemset(get(), 0xFF, bytes_)); }

 private:
  void* base_ = nullptr;
  std::size_t bytes_ = 0, offset_ = 0;
};

inline float round_value(float x, DType dt) {
  switch (dt) {
    case DType::bf16: return kc::bf16_to_float(kc::float_to_bf16(x));
    case DType::fp16: return kc::fp16_to_float(kc::float_to_fp16(x));
    default: return x;
  }
}

inline Vec rounded(Vec v, DType dt) {
  for (float& x : v) x = round_value(x, dt);
  return v;
}

// Uniform in [lo, hi), rounded to dt: exactly what the device buffer will hold.
inline Vec rand_vec(std::int64_t n, std::uint64_t seed, DType dt, float lo = -1.0f, float hi = 1.0f) {
  Vec v(sz(n));
  kc::uniform_fill(v.data(), n, seed, 0);
  for (float& x : v) x = lo + (hi - lo) * x;
  return rounded(std::move(v), dt);
}

inline std::vector<unsigned char> encode(const Vec& v, DType dt) {
  std::vector<unsigned char> out(v.size() * sz(dtype_size(dt)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::fp32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t h = dt == DType::bf16 ? kc::float_to_bf16(v[i]) : kc::float_to_fp16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

inline Vec decode(const std::vector<unsigned char>& bytes, std::size_t n, DType dt) {
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (dt == DType::fp32) {
      std::memcpy(&v[i], bytes.data() + 4 * i, 4);
    } else {
      std::uint16_t h = 0;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      v[i] = dt == DType::bf16 ? kc::bf16_to_float(h) : kc::fp16_to_float(h);
    }
  }
  return v;
}

inline void upload(const Dev& d, const Vec& v, DType dt) {
  const auto bytes = encode(v, dt);
  REQUIRE(bytes.size() <= d.bytes());
  ZP_TEST_CUDA(cudaMemcpy(d.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
}

inline Vec download(const Dev& d, std::size_t n, DType dt) {
  std::vector<unsigned char> bytes(n * sz(dtype_size(dt)));
  ZP_TEST_CUDA(cudaDeviceSynchronize());
  ZP_TEST_CUDA(cudaMemcpy(bytes.data(), d.get(), bytes.size(), cudaMemcpyDeviceToHost));
  return decode(bytes, n, dt);
}

// A device copy of v in dt (v should already be representable: see rand_vec / rounded).
inline std::unique_ptr<Dev> device(const Vec& v, DType dt, std::size_t offset = 0) {
  auto d = std::make_unique<Dev>(v.size() * sz(dtype_size(dt)), offset);
  upload(*d, v, dt);
  return d;
}

// An output buffer of n elements, poisoned.
inline std::unique_ptr<Dev> output(std::size_t n, DType dt, std::size_t offset = 0) {
  auto d = std::make_unique<Dev>(n * sz(dtype_size(dt)), offset);
  d->poison();
  return d;
}

template <class T>
std::unique_ptr<Dev> device_raw(const std::vector<T>& v) {
  auto d = std::make_unique<Dev>(v.size() * sizeof(T));
  ZP_TEST_CUDA(cudaMemcpy(d->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> download_raw(const Dev& d, std::size_t n) {
  std::vector<T> v(n);
  ZP_TEST_CUDA(cudaDeviceSynchronize());
  ZP_TEST_CUDA(cudaMemcpy(v.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

inline std::vector<unsigned char> bits(const Dev& d) {
  std::vector<unsigned char> v(d.bytes());
  ZP_TEST_CUDA(cudaDeviceSynchronize());
  ZP_TEST_CUDA(cudaMemcpy(v.data(), d.get(), v.size(), cudaMemcpyDeviceToHost));
  return v;
}

// Machine epsilon of the storage dtype (spacing of its values at 1).
inline double eps(DType dt) {
  switch (dt) {
    case DType::bf16: return 0x1p-7;
    case DType::fp16: return 0x1p-10;
    default: return 0x1p-23;
  }
}

// Half the spacing of dt's subnormals. Below its smallest normal (fp16: 2^-14, about 6.1e-5) a
// value of dt is a multiple of its smallest subnormal (fp16: 2^-24, about 6e-8), so rounding
// a result there errs by up to half of that, absolutely, where no relative tolerance reaches:
// fp16 softmax probabilities over a 50257-long row (about 2e-5) all lie there.
inline double underflow(DType dt) {
  switch (dt) {
    case DType::bf16: return 0x1p-134;
    case DType::fp16: return 0x1p-25;
    default: return 0x1p-150;
  }
}

// Relative L2 error bands (METHOD.md): fp32 far under 1e-3; 16-bit operands 1e-3 .. 1e-2.
inline double band(DType dt) {
  switch (dt) {
    case DType::bf16: return 1e-2;
    case DType::fp16: return 2e-3;
    default: return 1e-5;
  }
}

struct Tol {
  double atol = 0.0;
  double rtol = 0.0;
  double rel_l2 = 0.0;  // bound on ‖got − ref‖ / ‖ref‖ (0: not checked)
};

// The usual tolerance of one kernel's output: k ulps of dt relative, atol absolute (plus the
// rounding of dt's subnormals), the band.
inline Tol tol(DType dt, double k_ulps, double atol) {
  return Tol{atol + underflow(dt), k_ulps * eps(dt), band(dt)};
}

// For kernels with transcendental functions: the fp32 results may differ by a few ulps from
// the CPU's libm (16 of them allowed), 16-bit ones by their rounding.
inline Tol tol_math(DType dt, double atol) {
  return Tol{atol + underflow(dt), eps(dt) + 16 * 0x1p-23, band(dt)};
}

inline std::string dtype_str(DType dt) { return std::string(dtype_name(dt)); }

// Every element i within allowed(i) of ref[i] (NaN matches only NaN), and the relative L2
// error within rel_l2 (0: not checked); the first mismatches are printed.
template <class Allowed>
void expect_within(const std::string& what, const Vec& got, const Vec& ref, Allowed allowed, double rel_l2) {
  REQUIRE(got.size() == ref.size());
  std::size_t bad = 0;
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    const bool both_nan = std::isnan(g) && std::isnan(r);
    const double limit = allowed(i);
    const bool ok = both_nan || (std::fabs(g - r) <= limit);
    if (!ok) {
      if (bad < 8)
        std::printf("  %s: element %zu: got %.9g, expected %.9g (|diff| %.3g, allowed %.3g)\n", what.c_str(), i, g, r,
                    std::fabs(g - r), limit);
      ++bad;
    }
    if (!both_nan && std::isfinite(r)) {
      num += (g - r) * (g - r);
      den += r * r;
    }
  }
  const double rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  if (bad > 0) std::printf("  %s: %zu of %zu elements off; relative L2 error %.3g\n", what.c_str(), bad, got.size(), rel);
  INFO(what << ": relative L2 error " << rel << ", band " << rel_l2);
  CHECK(bad == 0);
  if (rel_l2 > 0.0) CHECK(rel <= rel_l2);
}

// Every element within atol + |ref|·rtol, and the relative L2 error within the band.
inline void expect_close(const std::string& what, const Vec& got, const Vec& ref, const Tol& t) {
  expect_within(
      what, got, ref, [&](std::size_t i) { return t.atol + std::fabs(static_cast<double>(ref[i])) * t.rtol; },
      t.rel_l2);
}

// The bound on |GPU − CPU| for outputs that are fp32-accumulated dot products stored in dt:
// output i sums `terms` products (and addends: the accumulated value, a bias) whose absolute
// values sum to s[i] (the CPU twin run on the absolute values of its inputs).
//  - Each side's fp32 sum errs by at most about terms·u·s[i], u = 2^-24, whatever the order of
//    the additions (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §3.1:
//    γ_n = n·u / (1 − n·u)). The CPU (Eigen, or a plain loop) rounds each step to nearest.
//    The GPU's tensor cores add blocks of 16-bit products after aligning them by truncation,
//    at most 2u of the block's magnitude per product and per block sum: 4·terms·u·s[i] is
//    allowed for the GPU, so A = 5·terms·u·s[i] in all (for fp32 operands, on the CUDA
//    cores with fused multiply-adds, A = 2·terms·u·s[i] would do).
//  - A 16-bit output is then rounded once: |stored − sum| <= u_dt·|sum| <= u_dt·(|ref| + A),
//    u_dt = eps(dt) / 2, plus half the subnormal spacing below dt's smallest normal.
// A split-K reduction in the output type adds one u_dt·|part| per part on top, which cancels
// only by chance: the check fails on outputs whose parts are larger than they are.
//
// `product_rounded`: a 16-bit GEMM that accumulates (C += A·B, cuBLASLt's beta = 1) rounds
// the product to dt before it adds C, a second rounding of up to u_dt·|A·B| <= u_dt·s[i]. On
// the H200 (CUDA 13.0, the Hopper algorithm 66 of the aligned shapes) every output was
// bf16(bf16(A·B) + C) exactly (reproduced on the CPU from the test's inputs,
// docs/cuda.md); PyTorch's addmm_/baddbmm_ through cuBLASLt get the same.
inline void expect_dot(const std::string& what, const Vec& got, const Vec& ref, const Vec& s, std::int64_t terms,
                       DType dt, bool product_rounded = false) {
  REQUIRE(s.size() == ref.size());
  const double u = 0x1p-24, u_dt = dt == DType::fp32 ? 0.0 : eps(dt) / 2.0;
  expect_within(
      what, got, ref,
      [&](std::size_t i) {
        const double a = 5.0 * static_cast<double>(terms) * u * static_cast<double>(s[i]);
        const double second = product_rounded ? u_dt * static_cast<double>(s[i]) : 0.0;
        return u_dt * (std::fabs(static_cast<double>(ref[i])) + a) + a + second + underflow(dt);
      },
      band(dt));
}

// |v|, elementwise.
inline Vec abs_of(Vec v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

inline void expect_equal_bits(const std::string& what, const std::vector<unsigned char>& a,
                              const std::vector<unsigned char>& b) {
  INFO(what << ": two runs on the same inputs must give the same bits");
  CHECK(a == b);
}

}  // namespace zp::gpu_test
