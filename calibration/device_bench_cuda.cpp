// `calibrate --device cuda` on this machine's GPUs: each planned case through kernels/cuda
// (cuBLASLt GEMMs, the fused attention, LayerNorm, softmax, GELU, add), the model's
// bandwidth-bound ops through the executor's CUDA device (exec::Device::forward / backward,
// the kernels a training run launches for them), cudaMemcpy, and NCCL for collectives over
// the first k GPUs of this process (one thread driving them, as nccl-tests -g k). Every call
// is checked; times are CUDA events around `iters` calls, three
// trials after a warm-up, the median kept and the trials' spread recorded. Cases not started
// when the budget runs out are left out.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cctype>
#include <fstream>
#include <sstream>
#include <map>
#include <set>
#include <memory>
#include <vector>

#include <fmt/format.h>

#ifdef ZEROPLAN_HAVE_NCCL
#include <nccl.h>
#endif

#include "calibration/device_bench.hpp"
#include "calibration/profile.hpp"
#include "core/error.hpp"
#include "exec/device_cuda.hpp"
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/bmm.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/rng.cuh"
#include "kernels/cuda/sdpa.cuh"
#include "zero/lower/graph_facts.hpp"

namespace zp::calibration {

namespace kc = zp::kernels::cuda;

namespace {

constexpr int kTrials = 3;

#ifdef ZEROPLAN_HAVE_NCCL
void nccl_check(ncclResult_t r, const char* what, const char* file, int line) {
  if (r != ncclSuccess)
    throw kc::CudaError(fmt::format("{}: {} ({}) at {}:{}", what, ncclGetErrorString(r), ncclGetLastError(nullptr), file, line));
}
#define ZP_NCCL_CHECK(call) nccl_check((call), #call, __FILE__, __LINE__)
#endif

// A device buffer that only grows (RAII).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get(std::size_t bytes, cudaStream_t s) {
    bytes = std::max<std::size_t>(bytes, 256);
    if (bytes > size_) {
      release();
      ZP_CUDA_CHECK(cudaMalloc(&p_, bytes));
      size_ = bytes;
      // Random data: GEMMs on zeros run faster than on real operands.
      kc::uniform_fill(p_, static_cast<std::int64_t>(bytes / 2), 1234, 0, DType::bf16, s);
    }
    return p_;
  }

 private:
  void release() {
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    size_ = 0;
  }
  void* p_ = nullptr;
  std::size_t size_ = 0;
};

class Events {
 public:
  Events() {
    ZP_CUDA_CHECK(cudaEventCreate(&a_));
    ZP_CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~Events() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t a_, b_;
};

struct Stat {
  double median = 0, spread = 0;
};

Stat stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stat s;
  s.median = v[v.size() / 2];
  double m = 0;
  for (double x : v) m += x;
  m /= static_cast<double>(v.size());
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  s.spread = m > 0 && v.size() > 1 ? std::sqrt(ss / static_cast<double>(v.size() - 1)) / m : 0;
  return s;
}

// Seconds per call of `call` on `s`: a warm-up, then kTrials trials of `iters` calls.
template <class F>
Stat time_calls(cudaStream_t s, int iters, F&& call) {
  Events ev;
  call();
  ZP_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int k = 0; k < kTrials; ++k) {
    ZP_CUDA_CHECK(cudaEventRecord(ev.a_, s));
    for (int i = 0; i < iters; ++i) call();
    ZP_CUDA_CHECK(cudaEventRecord(ev.b_, s));
    ZP_CUDA_CHECK(cudaEventSynchronize(ev.b_));
    float ms = 0;
    ZP_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a_, ev.b_));
    t.push_back(static_cast<double>(ms) * 1e-3 / iters);
  }
  return stats(std::move(t));
}

std::string version_text(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

// The NVIDIA driver's version, from the kernel module (absent in some containers).
std::string driver_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(f, line)) return "";
  // "NVRM version: NVIDIA UNIX [Open ]Kernel Module[ for x86_64]  580.159.04  Release Build ...":
  // the first word after "Kernel Module" made of digits and dots.
  const auto p = line.find("Kernel Module");
  if (p == std::string::npos) return "";
  std::istringstream words(line.substr(p + 13));
  for (std::string w; words >> w;)
    if (std::isdigit(static_cast<unsigned char>(w.front())) && w.find_first_not_of("0123456789.") == std::string::npos) return w;
  return "";
}

// One kernel case on device 0.
class KernelRunner {
 public:
  explicit KernelRunner(cudaStream_t s) : s_(s) {}

  Stat run(const DeviceCase& c) {
    const auto& d = c.dims;
    const DType dt = c.dtype;
    const std::size_t sz = dtype_size(dt);
    auto buf = [&](int i, double elements) { return bufs_[i].get(static_cast<std::size_t>(elements * static_cast<double>(sz)), s_); };
    switch (c.op) {
      case DeviceOp::gemm: {
        const std::int64_t m = d[0], n = d[1], k = d[2], b = std::max<std::int64_t>(d[3], 1);
        void* C = buf(0, static_cast<double>(b * m * n));
        void* A = buf(1, static_cast<double>(b * m * k));
        void* B = buf(2, static_cast<double>(b * k * n));
        if (b == 1) return time_calls(s_, c.iters, [&] { kc::gemm(ctx_, C, A, B, m, n, k, false, false, false, dt, s_); });
        return time_calls(s_, c.iters, [&] { kc::bmm_forward(ctx_, C, A, B, b, m, n, k, false, false, dt, s_); });
      }
      case DeviceOp::gemm_bwd: {
        const std::int64_t m = d[0], n = d[1], k = d[2], b = std::max<std::int64_t>(d[3], 1);
        void* dC = buf(0, static_cast<double>(b * m * n));
        void* A = buf(1, static_cast<double>(b * m * k));
        void* B = buf(2, static_cast<double>(b * k * n));
        void* dA = buf(3, static_cast<double>(b * m * k));
        void* dB = buf(4, static_cast<double>(b * k * n));
        if (b == 1)
          return time_calls(s_, c.iters, [&] {
            kc::gemm(ctx_, dA, dC, B, m, k, n, false, true, false, dt, s_);  // dA(m,k) = dC(m,n) Bᵀ
            kc::gemm(ctx_, dB, A, dC, k, n, m, true, false, false, dt, s_);  // dB(k,n) = Aᵀ dC
          });
        return time_calls(s_, c.iters,
                          [&] { kc::bmm_backward(ctx_, dA, dB, dC, A, B, b, m, n, k, false, false, false, dt, s_); });
      }
      case DeviceOp::sdpa_fwd:
      case DeviceOp::sdpa_bwd: {
        const std::int64_t B = d[0], H = d[1], T = d[2], D = d[3];
        const bool causal = d[4] != 0;
        const double e = static_cast<double>(B * H * T * D);
        void* q = buf(0, e);
        void* k = buf(1, e);
        void* v = buf(2, e);
        void* o = buf(3, e);
        auto* lse = static_cast<float*>(bufs_[4].get(static_cast<std::size_t>(B * H * T) * 4, s_));
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        kc::sdpa_forward(o, lse, q, k, v, nullptr, B, H, T, D, causal, scale, 0.0f, 1, 0, dt, s_);
        if (c.op == DeviceOp::sdpa_fwd)
          return time_calls(s_, c.iters, [&] {
            kc::sdpa_forward(o, lse, q, k, v, nullptr, B, H, T, D, causal, scale, 0.0f, 1, 0, dt, s_);
          });
        void* dout = buf(5, e);
        void* dq = buf(6, e);
        void* dk = buf(7, e);
        void* dv = buf(8, e);
        return time_calls(s_, c.iters, [&] {
          kc::sdpa_backward(ctx_, dq, dk, dv, dout, q, k, v, o, lse, nullptr, B, H, T, D, causal, scale, 0.0f, 1, 0, dt, s_);
        });
      }
      case DeviceOp::layernorm_fwd:
      case DeviceOp::layernorm_bwd: {
        const std::int64_t rows = d[0], C = d[1];
        void* x = buf(0, static_cast<double>(rows * C));
        void* y = buf(1, static_cast<double>(rows * C));
        void* w = buf(2, static_cast<double>(C));
        void* b = buf(3, static_cast<double>(C));
        auto* mean = static_cast<float*>(bufs_[4].get(static_cast<std::size_t>(rows) * 4, s_));
        auto* rstd = static_cast<float*>(bufs_[5].get(static_cast<std::size_t>(rows) * 4, s_));
        kc::layernorm_forward(y, mean, rstd, x, w, b, rows, C, 1e-5f, dt, s_);
        if (c.op == DeviceOp::layernorm_fwd)
          return time_calls(s_, c.iters, [&] { kc::layernorm_forward(y, mean, rstd, x, w, b, rows, C, 1e-5f, dt, s_); });
        void* dx = buf(6, static_cast<double>(rows * C));
        void* dw = buf(7, static_cast<double>(C));
        void* db = buf(8, static_cast<double>(C));
        return time_calls(s_, c.iters, [&] {
          kc::layernorm_backward(ctx_, dx, dw, db, y, x, mean, rstd, w, rows, C, false, dt, s_);
        });
      }
      case DeviceOp::softmax_fwd:
      case DeviceOp::softmax_bwd: {
        const std::int64_t rows = d[0], n = d[1];
        const double e = static_cast<double>(rows * n);
        void* x = buf(0, e);
        void* y = buf(1, e);
        if (c.op == DeviceOp::softmax_fwd)
          return time_calls(s_, c.iters, [&] { kc::softmax_forward(y, x, rows, n, dt, s_); });
        void* dx = buf(2, e);
        return time_calls(s_, c.iters, [&] { kc::softmax_backward(dx, y, x, rows, n, false, dt, s_); });
      }
      case DeviceOp::unary_fwd:
      case DeviceOp::unary_bwd: {
        const std::int64_t n = d[0];
        void* x = buf(0, static_cast<double>(n));
        void* y = buf(1, static_cast<double>(n));
        if (c.op == DeviceOp::unary_fwd) return time_calls(s_, c.iters, [&] { kc::gelu_tanh_forward(y, x, n, dt, s_); });
        void* dx = buf(2, static_cast<double>(n));
        return time_calls(s_, c.iters, [&] { kc::gelu_tanh_backward(dx, x, y, n, false, dt, s_); });
      }
      case DeviceOp::binary_fwd: {
        const std::int64_t n = d[0];
        void* a = buf(0, static_cast<double>(n));
        void* b = buf(1, static_cast<double>(n));
        void* y = buf(2, static_cast<double>(n));
        return time_calls(s_, c.iters, [&] { kc::add_forward(y, a, b, n, dt, s_); });
      }
      case DeviceOp::copy_d2d: {
        const auto bytes = static_cast<std::size_t>(d[0]);
        void* a = bufs_[0].get(bytes, s_);
        void* b = bufs_[1].get(bytes, s_);
        return time_calls(s_, c.iters, [&] { ZP_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s_)); });
      }
      case DeviceOp::copy_h2d:
      case DeviceOp::copy_d2h: {
        const auto bytes = static_cast<std::size_t>(d[0]);
        void* dev = bufs_[0].get(bytes, s_);
        void* host = pinned(bytes);
        const bool h2d = c.op == DeviceOp::copy_h2d;
        return time_calls(s_, c.iters, [&] {
          ZP_CUDA_CHECK(cudaMemcpyAsync(h2d ? dev : host, h2d ? host : dev, bytes,
                                        h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s_));
        });
      }
      case DeviceOp::copy_host: {
        const auto bytes = static_cast<std::size_t>(d[0]);
        std::vector<char> a(bytes, 1), b(bytes, 0);
        std::vector<double> t;
        std::memcpy(b.data(), a.data(), bytes);
        for (int k = 0; k < kTrials; ++k) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < c.iters; ++i) std::memcpy(b.data(), a.data(), bytes);
          t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / c.iters);
        }
        return stats(std::move(t));
      }
      case DeviceOp::collective:
      case DeviceOp::op_fwd:
      case DeviceOp::op_bwd: break;
    }
    throw std::logic_error("a collective or graph-op case reached the kernel runner");
  }

  ~KernelRunner() {
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
  }
  KernelRunner(const KernelRunner&) = delete;
  KernelRunner& operator=(const KernelRunner&) = delete;

 private:
  void* pinned(std::size_t bytes) {
    if (bytes > pinned_size_) {
      if (pinned_ != nullptr) cudaFreeHost(pinned_);
      pinned_ = nullptr;
      ZP_CUDA_CHECK(cudaMallocHost(&pinned_, bytes));
      pinned_size_ = bytes;
    }
    return pinned_;
  }
  cudaStream_t s_;
  kc::Context ctx_;
  DeviceBuffer bufs_[9];
  void* pinned_ = nullptr;
  std::size_t pinned_size_ = 0;
};

// An op of the model's graph on the executor's CUDA device: every tensor it reads or writes
// (its inputs, outputs, saved tensors and backward scratch; their gradients; its params and
// their gradients), zero-filled (a valid index for the integer ones), then its forward or
// backward timed as a training step times an event: CUDA events on the device's stream around
// `iters` calls. The gradients bound are those a training step has at the op's backward: an
// input's where it requires one, an output's where a later op reads it (GraphFacts, as the
// lowering decides them; BERT's fused residual LayerNorm then runs without a gradient of its
// sum, which no op reads, as in training). The dtypes are the lowering's, restated for one op
// without lowering a program:
// a tensor and its gradient in the tensor's dtype (zero/lower/walk.cpp), params and their
// gradients in the model dtype, which the graph's activation dtype is (zero/lower/autograd.hpp).
// A micro-benchmark, not a second interpreter: it decides no buffer of a training step.
class GraphOpRunner final : public exec::Operands {
 public:
  GraphOpRunner(const models::OpGraph& g)
      : g_(g), facts_(zero::lowering::analyse(g)), dev_(exec::make_cuda_device(exec::CudaDeviceOptions{0, 0, false})) {}
  ~GraphOpRunner() override { release(); }
  GraphOpRunner(const GraphOpRunner&) = delete;
  GraphOpRunner& operator=(const GraphOpRunner&) = delete;

  Stat run(const models::Op& op, bool backward, int iters) {
    release();
    auto tensor = [&](models::TensorId t, std::map<models::TensorId, void*>& in) {
      if (!in.count(t)) in[t] = alloc(static_cast<std::size_t>(g_.tensors[static_cast<std::size_t>(t)].bytes.v));
    };
    for (const auto* list : {&op.inputs, &op.outputs, &op.saved, &op.bwd_scratch})
      for (auto t : *list) tensor(t, act_);
    if (backward) {
      for (auto t : op.inputs)
        if (facts_.requires_grad[static_cast<std::size_t>(t)]) tensor(t, grad_);
      for (auto t : op.outputs)
        if (zero::lowering::gets_grad(facts_, t)) tensor(t, grad_);
      for (auto t : op.bwd_grads) tensor(t, grad_);
    }
    const std::size_t psz = static_cast<std::size_t>(dtype_size(g_.opt.act_dtype));
    for (auto p : op.params) {
      const auto numel = static_cast<std::size_t>(g_.params[static_cast<std::size_t>(p)].numel);
      param_[p] = alloc(numel * psz);
      if (backward) pgrad_[p] = alloc(numel * psz);
    }
    // An input gradient the op's kernels can write whole is written, as its first writer in
    // a training step writes it (exec::backward_assigns); the others are added into.
    assigns_.clear();
    assigns_cols_.clear();
    for (std::size_t i = 0; i < op.inputs.size(); ++i) {
      if (exec::backward_assigns(g_, op, i) && std::count(op.inputs.begin(), op.inputs.end(), op.inputs[i]) == 1)
        assigns_.insert(op.inputs[i]);
      for (const exec::ColumnBlock& c : exec::backward_assigns_columns(g_, op, i))
        assigns_cols_.emplace(op.inputs[i], c.first);
    }
    auto call = [&] { backward ? dev_->backward(op, *this) : dev_->forward(op, *this); };
    call();  // warm-up (and the device's scratch grown to the op's size)
    std::vector<double> t;
    for (int k = 0; k < kTrials; ++k) {
      dev_->step_begin(1);
      dev_->event_begin(0);
      for (int i = 0; i < iters; ++i) call();
      dev_->event_end(0);
      double seconds = 0, start = 0;
      dev_->step_times(std::span<double>(&seconds, 1), std::span<double>(&start, 1));
      t.push_back(seconds / iters);
    }
    return stats(std::move(t));
  }

  // exec::Operands: the tensors as the CUDA device reads them (no host views).
  const models::OpGraph& graph() const override { return g_; }
  float* act(models::TensorId) const override { return host_view(); }
  float* grad(models::TensorId) const override { return host_view(); }
  const std::int64_t* ids(models::TensorId) const override { return nullptr; }
  float* param(models::ParamId) const override { return host_view(); }
  float* param_grad(models::ParamId) const override { return host_view(); }
  exec::Ref act_ref(models::TensorId t) const override { return ref(act_, t, g_.tensors[static_cast<std::size_t>(t)].dtype, true); }
  exec::Ref grad_ref(models::TensorId t) const override { return ref(grad_, t, g_.tensors[static_cast<std::size_t>(t)].dtype, false); }
  exec::Ref param_ref(models::ParamId p) const override { return ref(param_, p, g_.opt.act_dtype, true); }
  exec::Ref param_grad_ref(models::ParamId p) const override { return ref(pgrad_, p, g_.opt.act_dtype, true); }
  float* scratch(std::size_t slot, std::int64_t n) override {
    if (scratch_.size() <= slot) scratch_.resize(slot + 1);
    scratch_[slot].assign(static_cast<std::size_t>(n), 0.0f);
    return scratch_[slot].data();
  }
  bool accumulates(models::TensorId t) override { return assigns_.count(t) == 0; }
  bool accumulates(models::TensorId t, exec::ColumnBlock cols) override {
    if (cols.first == 0 && cols.count == cols.width) return accumulates(t);
    return assigns_cols_.count({t, cols.first}) == 0;
  }
  std::uint64_t dropout_seed() const override { return 1234; }
  float loss_grad() const override { return 1.0f; }

 private:
  static float* host_view() { throw std::logic_error("the CUDA device asked for a host view of a tensor"); }
  template <class Id>
  exec::Ref ref(const std::map<Id, void*>& in, Id id, DType dt, bool required) const {
    const auto it = in.find(id);
    if (it == in.end()) {
      if (required) throw std::logic_error(fmt::format("graph op benchmark: operand {} not bound", id));
      return {};
    }
    return {it->second, dt, 0};
  }
  void* alloc(std::size_t bytes) {
    void* p = dev_->allocate(std::max<std::size_t>(bytes, 16));
    if (p == nullptr) throw kc::CudaError(fmt::format("graph op benchmark: out of device memory for {} bytes", bytes));
    owned_.push_back(p);
    return p;
  }
  void release() {
    for (void* p : owned_) dev_->release(p);
    owned_.clear();
    act_.clear();
    grad_.clear();
    param_.clear();
    pgrad_.clear();
  }
  const models::OpGraph& g_;
  zero::lowering::GraphFacts facts_;
  std::unique_ptr<exec::Device> dev_;
  std::vector<void*> owned_;
  std::map<models::TensorId, void*> act_, grad_;
  std::set<models::TensorId> assigns_;
  std::set<std::pair<models::TensorId, std::int64_t>> assigns_cols_;  // (tensor, first column)
  std::map<models::ParamId, void*> param_, pgrad_;
  std::vector<std::vector<float>> scratch_;
};

#ifdef ZEROPLAN_HAVE_NCCL
// NCCL communicators over GPUs 0..k-1 of this process, their streams and buffers.
class CollectiveRunner {
 public:
  explicit CollectiveRunner(int k) : k_(k), comms_(static_cast<std::size_t>(k)), streams_(static_cast<std::size_t>(k)) {
    std::vector<int> devs(static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) devs[static_cast<std::size_t>(i)] = i;
    ZP_NCCL_CHECK(ncclCommInitAll(comms_.data(), k, devs.data()));
    for (int i = 0; i < k; ++i) {
      ZP_CUDA_CHECK(cudaSetDevice(i));
      ZP_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[static_cast<std::size_t>(i)], cudaStreamNonBlocking));
    }
    bufs_.resize(static_cast<std::size_t>(k));
    ZP_CUDA_CHECK(cudaSetDevice(0));
  }
  ~CollectiveRunner() {
    for (int i = 0; i < k_; ++i) {
      cudaSetDevice(i);
      auto& b = bufs_[static_cast<std::size_t>(i)];
      if (b.first != nullptr) cudaFree(b.first);
      if (b.second != nullptr) cudaFree(b.second);
      cudaStreamDestroy(streams_[static_cast<std::size_t>(i)]);
      ncclCommDestroy(comms_[static_cast<std::size_t>(i)]);
    }
    cudaSetDevice(0);
  }
  CollectiveRunner(const CollectiveRunner&) = delete;
  CollectiveRunner& operator=(const CollectiveRunner&) = delete;

  Stat run(zero::CollKind kind, std::size_t bytes, int iters) {
    for (int i = 0; i < k_; ++i) {
      auto& b = bufs_[static_cast<std::size_t>(i)];
      if (bytes > size_) {
        ZP_CUDA_CHECK(cudaSetDevice(i));
        if (b.first != nullptr) cudaFree(b.first);
        if (b.second != nullptr) cudaFree(b.second);
        ZP_CUDA_CHECK(cudaMalloc(&b.first, bytes));
        ZP_CUDA_CHECK(cudaMalloc(&b.second, bytes));
        ZP_CUDA_CHECK(cudaMemset(b.first, 0, bytes));
      }
    }
    size_ = std::max(size_, bytes);
    const std::size_t count = bytes / 2;  // bf16 elements of S
    auto once = [&] {
      ZP_NCCL_CHECK(ncclGroupStart());
      for (int i = 0; i < k_; ++i) {
        auto& b = bufs_[static_cast<std::size_t>(i)];
        auto c = comms_[static_cast<std::size_t>(i)];
        auto s = streams_[static_cast<std::size_t>(i)];
        const std::size_t part = count / static_cast<std::size_t>(k_);
        switch (kind) {
          case zero::CollKind::all_reduce: ZP_NCCL_CHECK(ncclAllReduce(b.first, b.second, count, ncclBfloat16, ncclSum, c, s)); break;
          case zero::CollKind::reduce_scatter:
            ZP_NCCL_CHECK(ncclReduceScatter(b.first, b.second, part, ncclBfloat16, ncclSum, c, s));
            break;
          case zero::CollKind::all_gather: ZP_NCCL_CHECK(ncclAllGather(b.first, b.second, part, ncclBfloat16, c, s)); break;
          default: throw std::logic_error("collective kind not swept");
        }
      }
      ZP_NCCL_CHECK(ncclGroupEnd());
    };
    // Time on every GPU's stream; the slowest GPU is the collective's time.
    std::vector<std::unique_ptr<Events>> ev;
    for (int i = 0; i < k_; ++i) {
      ZP_CUDA_CHECK(cudaSetDevice(i));
      ev.push_back(std::make_unique<Events>());
    }
    once();
    sync();
    std::vector<double> t;
    for (int trial = 0; trial < kTrials; ++trial) {
      for (int i = 0; i < k_; ++i) {
        ZP_CUDA_CHECK(cudaSetDevice(i));
        ZP_CUDA_CHECK(cudaEventRecord(ev[static_cast<std::size_t>(i)]->a_, streams_[static_cast<std::size_t>(i)]));
      }
      for (int it = 0; it < iters; ++it) once();
      double worst = 0;
      for (int i = 0; i < k_; ++i) {
        ZP_CUDA_CHECK(cudaSetDevice(i));
        ZP_CUDA_CHECK(cudaEventRecord(ev[static_cast<std::size_t>(i)]->b_, streams_[static_cast<std::size_t>(i)]));
      }
      for (int i = 0; i < k_; ++i) {
        ZP_CUDA_CHECK(cudaSetDevice(i));
        ZP_CUDA_CHECK(cudaEventSynchronize(ev[static_cast<std::size_t>(i)]->b_));
        float ms = 0;
        ZP_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[static_cast<std::size_t>(i)]->a_, ev[static_cast<std::size_t>(i)]->b_));
        worst = std::max(worst, static_cast<double>(ms) * 1e-3 / iters);
      }
      t.push_back(worst);
    }
    ZP_CUDA_CHECK(cudaSetDevice(0));
    return stats(std::move(t));
  }

 private:
  void sync() {
    for (int i = 0; i < k_; ++i) {
      ZP_CUDA_CHECK(cudaSetDevice(i));
      ZP_CUDA_CHECK(cudaStreamSynchronize(streams_[static_cast<std::size_t>(i)]));
    }
  }
  int k_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::vector<std::pair<void*, void*>> bufs_;
  std::size_t size_ = 0;
};
#endif

}  // namespace

bool device_benchmarks_built() { return true; }

std::string local_nccl_version() {
#ifdef ZEROPLAN_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  return v >= 10000 ? fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
                    : fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
#else
  return "";
#endif
}

DeviceInfo query_devices() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0)
    throw InputError("--device", "",
                     fmt::format("no CUDA GPU on this machine ({}); calibrate from files instead: --nccl-tests, "
                                 "--deepspeed-log, --deepspeed-runs, --train-out",
                                 err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found none"));
  cudaDeviceProp p{};
  ZP_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  DeviceInfo d;
  d.gpu_name = p.name;
  d.gpus = n;
  int drv = 0, rt = 0;
  ZP_CUDA_CHECK(cudaDriverGetVersion(&drv));
  ZP_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  d.driver = driver_version();
  if (d.driver.empty()) d.driver = "CUDA driver API " + version_text(drv);
  d.cuda = version_text(rt);
  d.nccl = local_nccl_version();
  return d;
}

DeviceRun run_device_benchmarks(const BenchPlan& plan, const Progress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  DeviceRun out;
  ZP_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  ZP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{s};
  KernelRunner kernels(s);
  std::unique_ptr<GraphOpRunner> graph_ops;  // the executor's device, made for the first graph op
#ifdef ZEROPLAN_HAVE_NCCL
  std::map<int, std::unique_ptr<CollectiveRunner>> coll;
#endif
  const std::size_t n = plan.cases.size();
  for (std::size_t i = 0; i < n; ++i) {
    const DeviceCase& c = plan.cases[i];
    if (progress) progress(static_cast<double>(i) / static_cast<double>(n), c.obs.label);
    if (elapsed() > plan.budget_s) {
      out.budget_hit = true;
      out.skipped += static_cast<int>(n - i);
      break;
    }
    Stat st;
    if (c.op == DeviceOp::collective) {
#ifdef ZEROPLAN_HAVE_NCCL
      const int k = static_cast<int>(c.dims[0]);
      auto& r = coll[k];
      if (!r) r = std::make_unique<CollectiveRunner>(k);
      st = r->run(c.coll, static_cast<std::size_t>(c.dims[1]), c.iters);
#else
      ++out.skipped;
      continue;
#endif
    } else if (c.op == DeviceOp::op_fwd || c.op == DeviceOp::op_bwd) {
      if (!plan.graph) throw std::logic_error("a graph-op case without its graph");
      if (!graph_ops) graph_ops = std::make_unique<GraphOpRunner>(*plan.graph);
      st = graph_ops->run(plan.graph->ops[static_cast<std::size_t>(c.dims[0])], c.op == DeviceOp::op_bwd, c.iters);
    } else {
      if ((c.op == DeviceOp::sdpa_fwd || c.op == DeviceOp::sdpa_bwd) && !kc::sdpa_supports(c.dims[3])) {
        ++out.skipped;
        continue;
      }
      st = kernels.run(c);
    }
    if (!(st.median > 0.5e-6)) {  // below any kernel's launch: nothing ran
      ++out.skipped;
      continue;
    }
    Observation o = c.obs;
    o.measured = Seconds{st.median};
    o.spread = st.spread;
    o.repeats = kTrials * c.iters;
    out.data.obs.push_back(std::move(o));
    ++out.measured;
  }
  if (progress) progress(1.0, "done");
  out.data.files.push_back("--device cuda");
  out.seconds = elapsed();
  return out;
}

}  // namespace zp::calibration
