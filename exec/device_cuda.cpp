// The CUDA device: one GPU, one CUDA stream per program stream (compute, reduction,
// allgather, host), ordered by the waits exec/stream_order.hpp derives (cudaStreamWaitEvent
// on earlier events' end events), kernels/cuda for the ops and the movements, CUDA events for
// the times. Nothing in a step waits for the device except what the host must read: the
// norm and overflow statistics (DeepSpeed reads them with .item() too), host-staged
// collectives, offloaded work, and the losses at the step's end.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "exec/cuda_memory.hpp"
#include "exec/cuda_scratch.hpp"
#include "exec/device_cuda.hpp"
#include "exec/device_cuda_ops.hpp"
#include "exec/run_batch.hpp"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/multi.cuh"
#include "kernels/cuda/optimizer.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/sdpa_cudnn.cuh"
#include "zero/program.hpp"

namespace zp::exec {

namespace kc = zp::kernels::cuda;

namespace {
std::size_t U(std::int64_t i) { return static_cast<std::size_t>(i); }
void* at(const Ref& r) { return r.address(); }
float* f32(Ref r) { return static_cast<float*>(r.base) + r.off; }

// Device memory the device keeps for itself (not a program buffer), grown on demand.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    if (p_) cudaFree(p_);
  }
  void* get(std::size_t bytes, cudaStream_t s) {
    if (bytes <= size_) return p_;
    if (p_) {
      ZP_CUDA_CHECK(cudaStreamSynchronize(s));  // the work queued on the old memory is done
      ZP_CUDA_CHECK(cudaFree(p_));
    }
    size_ = std::max(bytes, kArenaMinBytes);  // exec/cuda_memory.cpp predicts these sizes
    ZP_CUDA_CHECK(cudaMalloc(&p_, size_));
    return p_;
  }
  std::size_t size() const { return size_; }

 private:
  void* p_ = nullptr;
  std::size_t size_ = 0;
};

// Pinned host memory for transfers, grown on demand; `done` orders its reuse after the
// copy that last read it.
class Pinned {
 public:
  Pinned() = default;
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  ~Pinned() {
    if (done_) cudaEventDestroy(done_);
    if (p_) cudaFreeHost(p_);
  }
  void* get(std::size_t bytes) {
    if (!done_) ZP_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    ZP_CUDA_CHECK(cudaEventSynchronize(done_));
    if (bytes > size_) {
      if (p_) ZP_CUDA_CHECK(cudaFreeHost(p_));
      size_ = std::max(bytes, std::size_t{1} << 20);
      ZP_CUDA_CHECK(cudaMallocHost(&p_, size_));
    }
    return p_;
  }
  void used(cudaStream_t s) { ZP_CUDA_CHECK(cudaEventRecord(done_, s)); }

 private:
  void* p_ = nullptr;
  std::size_t size_ = 0;
  cudaEvent_t done_ = nullptr;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const CudaDeviceOptions& o) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
      throw std::runtime_error(fmt::format("--device cuda: no CUDA device is visible ({})",
                                           err != cudaSuccess ? cudaGetErrorString(err) : "0 devices"));
    dev_ = o.device >= 0 ? o.device : o.local_rank % count;
    if (dev_ >= count) throw std::runtime_error(fmt::format("--device cuda: device {} of {} visible", dev_, count));
    ZP_CUDA_CHECK(cudaSetDevice(dev_));
    ZP_CUDA_CHECK(cudaFree(nullptr));  // the context, now
    cudaDeviceProp prop{};
    ZP_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev_));
    mem_.gpu = prop.name;
    mem_.after_context = used();
    for (auto& st : streams_) ZP_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    stream_ = streams_[0];
    ctx_options_.allow_tf32 = o.allow_tf32;
    if (o.cudnn_attention)
      if (const std::string why = kc::sdpa_cudnn_load(); !why.empty())
        throw std::runtime_error("--attention-kernel cudnn: " + why);
    ctx_options_.sdpa_cudnn = o.cudnn_attention;
    ctx_[0] = std::make_unique<kc::Context>(ctx_options_);
    if (ctx_[0]->device_bytes() != kComputeContextBytes)  // exec/cuda_memory.hpp predicts it so
      throw std::logic_error(fmt::format("cuda device: the kernels' Context holds {} bytes, exec/cuda_memory.hpp "
                                         "assumes {}", ctx_[0]->device_bytes(), kComputeContextBytes));
    ZP_CUDA_CHECK(cudaMalloc(&norm_, sizeof(double)));
    ZP_CUDA_CHECK(cudaMallocHost(&norm_host_, sizeof(double)));
    mem_.after_init = used();
    mem_.peak = mem_.after_init;
  }
  ~CudaDevice() override {
    for (cudaStream_t st : streams_)
      if (st) cudaStreamSynchronize(st);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (norm_) cudaFree(norm_);
    if (norm_host_) cudaFreeHost(norm_host_);
    for (auto& c : ctx_) c.reset();
    for (cudaStream_t st : streams_)
      if (st) cudaStreamDestroy(st);
  }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const char* name() const override { return "cuda"; }
  bool host_addressable() const override { return false; }
  DriverMemory driver() const {
    DriverMemory m = mem_;
    std::int64_t scratch = 0;  // arenas only grow: their sizes now are their largest
    for (const auto& per_stream : scratch_)
      for (const Arena& a : per_stream) scratch += static_cast<std::int64_t>(a.size());
    for (std::size_t k = 1; k < ctx_.size(); ++k)
      if (ctx_[k]) scratch += static_cast<std::int64_t>(ctx_[k]->device_bytes());
    // The compute stream's Context beyond what it held at init (its buffer, grown by the
    // one-pass attention backward, ContextOptions::sdpa_backward_one_pass).
    scratch += static_cast<std::int64_t>(ctx_[0]->device_bytes() - kComputeContextBytes);
    m.device_scratch = Bytes{scratch};
    for (const auto& c : ctx_) {
      if (!c) continue;
      m.cublaslt_loaded.v += c->driver_growth(kc::Context::Library::cublaslt);
      m.cudnn.v += c->driver_growth(kc::Context::Library::cudnn);
    }
    return m;
  }
  void mark_after_comm() { mem_.after_comm = used(); mem_.peak = std::max(mem_.peak, mem_.after_comm); }
  cudaStream_t stream() const {
    settle();  // a communicator queues work on it next
    return stream_;
  }
  int ordinal() const { return dev_; }

  void* allocate(std::size_t bytes) override {
    settle();
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: the caller reports the failed request
      return nullptr;
    }
    ZP_CUDA_CHECK(err);
    // Zeroed before any stream can use it (a new segment serves its pool's stream, which need
    // not be the current one): a rare, cold path.
    ZP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    ZP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    mem_.peak = std::max(mem_.peak, used());
    return p;
  }
  void release(void* p) override {
    settle();
    ZP_CUDA_CHECK(cudaFree(p));
  }

  // An op's calls back into the device (a fresh gradient's zero-fill) run as they are made.
  void forward(const models::Op& op, Operands& o) override {
    settle();
    batching_ = false;
    cuda_forward(env(), op, o);
  }
  void backward(const models::Op& op, Operands& o) override {
    settle();
    batching_ = false;
    cuda_backward(env(), op, o);
  }
  void batch(bool on) override {
    if (!on) settle();
    batching_ = on;
  }

  void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step, const kc::AdamConfig& c,
                 float grad_factor) override {
    settle();
    if (n <= 0) return;
    // The unscaling factor is applied as the kernel reads the gradient: no pass of its own.
    const float* gf = as_f32(g, n, 0);
    float* pf = as_f32(p, n, 1);
    float* mf = as_f32(m, n, 2);
    float* vf = as_f32(v, n, 3);
    kc::adam_step(pf, gf, mf, vf, n, step, c, stream_, grad_factor);
    back(p, pf, n);
    back(m, mf, n);
    back(v, vf, n);
  }
  void sgd_step(Ref p, Ref g, Ref momentum, std::int64_t n, std::int64_t step, const kc::SgdConfig& c,
                float grad_factor) override {
    settle();
    if (n <= 0) return;
    const float* gf = as_f32(g, n, 0);
    float* pf = as_f32(p, n, 1);
    float* mf = momentum ? as_f32(momentum, n, 2) : nullptr;
    kc::sgd_step(pf, gf, mf, n, step, c, stream_, grad_factor);
    back(p, pf, n);
    if (momentum) back(momentum, mf, n);
  }

  void copy(Ref dst, Ref src, std::int64_t n) override {
    if (n <= 0) return;
    if (hold({RunBatch::Kind::copy, dst, src, n})) return;
    if (dst.dt == src.dt) {
      ZP_CUDA_CHECK(cudaMemcpyAsync(at(dst), at(src), U(n * dtype_size(dst.dt)), cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    float_only(dst, "copy");
    float_only(src, "copy");
    kc::convert(at(dst), dst.dt, at(src), src.dt, n, stream_);
  }
  void add(Ref dst, Ref src, std::int64_t n) override {
    if (n <= 0) return;
    if (hold({RunBatch::Kind::add, dst, src, n})) return;
    float_only(dst, "add");
    float_only(src, "add");
    if (dst.dt == src.dt) {
      kc::copy_accumulate(at(dst), at(src), n, true, dst.dt, stream_);
      return;
    }
    // Mixed: in fp32, one rounding into dst, in one pass.
    kc::add_mixed(at(dst), dst.dt, at(src), src.dt, n, stream_);
  }
  void fill(Ref dst, std::int64_t n, float value) override {
    if (n <= 0) return;
    if (value == 0.0f && hold({RunBatch::Kind::zero, dst, Ref{}, n})) return;
    settle();
    ZP_CUDA_CHECK(cudaMemsetAsync(at(dst), 0, U(n * dtype_size(dst.dt)), stream_));
    if (value == 0.0f) return;
    float_only(dst, "fill");
    kc::add_scalar_forward(at(dst), at(dst), n, value, dst.dt, stream_);
  }
  void zero_columns(Ref dst, std::int64_t rows, ColumnBlock cols) override {
    settle();
    if (rows <= 0 || cols.count <= 0) return;
    const std::size_t e = dtype_size(dst.dt);
    ZP_CUDA_CHECK(cudaMemset2DAsync(at(dst.at(cols.first)), U(cols.width) * e, 0, U(cols.count) * e, U(rows), stream_));
  }
  void scale(Ref x, std::int64_t n, float factor) override {
    settle();
    if (n <= 0) return;
    float_only(x, "scale");
    kc::scale_inplace(at(x), n, factor, x.dt, stream_);
  }

  void norm_begin() override {
    settle();
    ZP_CUDA_CHECK(cudaMemsetAsync(norm_, 0, sizeof(double), stream_));
  }
  void norm_add(std::span<const Ref> parts, std::int64_t n) override {
    if (n <= 0 || parts.empty()) return;
    // One part, or two of one dtype (stage 2's accumulated partition and the last micro-step's):
    // held, and summed with the other parts' runs in one launch.
    if (parts.size() == 1 && hold({RunBatch::Kind::sumsq, Ref{}, parts[0], n})) return;
    if (parts.size() == 2 && parts[0].dt == parts[1].dt && hold({RunBatch::Kind::sumsq, Ref{}, parts[0], n, parts[1]}))
      return;
    settle();
    auto* sumsq = static_cast<double*>(norm_);
    const void* x = at(parts[0]);
    DType dt = parts[0].dt;
    if (parts.size() > 1) {  // the elementwise sum of the parts first, in fp32
      auto* s = static_cast<float*>(scratch(0, U(n) * 4));
      kc::convert(s, DType::fp32, at(parts[0]), parts[0].dt, n, stream_);
      for (std::size_t k = 1; k < parts.size(); ++k) {
        float* t = as_f32(parts[k], n, 1);
        kc::copy_accumulate(s, t, n, true, DType::fp32, stream_);
      }
      x = s;
      dt = DType::fp32;
    }
    // One pass: the sum of squares in double is not finite exactly when an element is not
    // (a finite fp32 square is below 1.2e77, so no finite sum overflows).
    kc::sum_squares(ctx(), sumsq, x, n, true, dt, stream_);
  }
  NormStats norm_end() override {
    settle();
    ZP_CUDA_CHECK(cudaMemcpyAsync(norm_host_, norm_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    ZP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    NormStats st;
    std::memcpy(&st.sumsq, norm_host_, sizeof(double));
    st.nonfinite = !std::isfinite(st.sumsq);
    return st;
  }

  void upload(Ref dst, const float* src, std::int64_t n) override {
    settle();
    if (n <= 0) return;
    if (dst.dt == DType::fp32) {
      upload_bytes(at(dst), src, U(n) * 4);
      return;
    }
    float_only(dst, "upload");
    auto* s = static_cast<float*>(scratch(0, U(n) * 4));
    upload_bytes(s, src, U(n) * 4);
    kc::convert(at(dst), dst.dt, s, DType::fp32, n, stream_);
  }
  void download(float* dst, Ref src, std::int64_t n) override {
    settle();
    if (n <= 0) return;
    const void* from = at(src);
    if (src.dt != DType::fp32) {
      float_only(src, "download");
      auto* s = static_cast<float*>(scratch(0, U(n) * 4));
      kc::convert(s, DType::fp32, from, src.dt, n, stream_);
      from = s;
    }
    download_bytes(dst, from, U(n) * 4);
  }
  void upload_bytes(void* dst, const void* src, std::size_t bytes) override {
    settle();
    if (bytes == 0) return;
    void* p = pinned_up_.get(bytes);
    std::memcpy(p, src, bytes);
    ZP_CUDA_CHECK(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, stream_));
    pinned_up_.used(stream_);
  }
  void download_bytes(void* dst, const void* src, std::size_t bytes) override {
    settle();
    if (bytes == 0) return;
    void* p = pinned_down_.get(bytes);
    ZP_CUDA_CHECK(cudaMemcpyAsync(p, src, bytes, cudaMemcpyDeviceToHost, stream_));
    ZP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(dst, p, bytes);
  }
  void synchronize() override {
    settle();
    for (cudaStream_t st : streams_) ZP_CUDA_CHECK(cudaStreamSynchronize(st));
  }

  // One CUDA stream per program stream (zero::Stream); the step starts on every stream after
  // everything queued before it (the set-up, the previous step's end, on the compute stream).
  void step_begin(std::size_t events) override {
    settle();
    if (events_.size() < 2 * events + 1) {
      const std::size_t have = events_.size();
      events_.resize(2 * events + 1);
      for (std::size_t i = have; i < events_.size(); ++i) ZP_CUDA_CHECK(cudaEventCreate(&events_[i]));
    }
    recorded_.assign(events, false);
    stream_ = streams_[0];
    ZP_CUDA_CHECK(cudaEventRecord(events_[0], stream_));
    for (std::size_t k = 1; k < streams_.size(); ++k) ZP_CUDA_CHECK(cudaStreamWaitEvent(streams_[k], events_[0], 0));
  }
  void event_order(std::size_t i, int stream, std::span<const std::int32_t> waits) override {
    if (stream < 0 || static_cast<std::size_t>(stream) >= streams_.size())
      throw std::logic_error(fmt::format("cuda device: event {} on stream {}", i, stream));
    settle();  // on the stream it was queued for
    stream_ = streams_[static_cast<std::size_t>(stream)];
    for (const std::int32_t w : waits) event_wait(static_cast<std::size_t>(w));
    (void)i;
  }
  void event_wait(std::size_t w) override {
    if (w >= recorded_.size() || !recorded_[w])
      throw std::logic_error(fmt::format("cuda device: a wait for event {}, not run in this step", w));
    ZP_CUDA_CHECK(cudaStreamWaitEvent(stream_, events_[2 + 2 * w], 0));
  }
  void event_begin(std::size_t i) override { ZP_CUDA_CHECK(cudaEventRecord(events_[1 + 2 * i], stream_)); }
  void event_end(std::size_t i) override {
    settle();  // the event's time includes what it held
    ZP_CUDA_CHECK(cudaEventRecord(events_[2 + 2 * i], stream_));
    recorded_[i] = true;
  }
  void step_times(std::span<double> seconds, std::span<double> starts) override {
    settle();
    synchronize();
    stream_ = streams_[0];  // what runs between steps (losses, checkpoints, weights) on the compute stream
    mem_.peak = std::max(mem_.peak, used());  // the device's own scratch grows outside allocate()
    for (std::size_t i = 0; i < recorded_.size() && i < seconds.size(); ++i) {
      if (!recorded_[i]) continue;
      float ms = 0.0f, from = 0.0f;
      ZP_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[1 + 2 * i], events_[2 + 2 * i]));
      ZP_CUDA_CHECK(cudaEventElapsedTime(&from, events_[0], events_[1 + 2 * i]));
      seconds[i] = static_cast<double>(ms) * 1e-3;
      starts[i] = static_cast<double>(from) * 1e-3;
    }
  }

 private:
  // Whether run r is held for a batch (batching, float operands, no hazard with what is
  // held; else what is held runs first and r is not held).
  bool hold(const RunBatch::Run& r) {
    if (!batching_) return false;
    const bool floats = (r.kind == RunBatch::Kind::sumsq || is_float(r.dst.dt)) &&
                        (r.kind == RunBatch::Kind::zero || is_float(r.src.dt));
    if (!floats) {
      settle();
      return false;
    }
    if (!held_.fits(r)) settle();
    held_.push(r);
    return true;
  }
  // Runs what is held: one multi-run launch per group of up to 48 runs.
  void settle() const {
    if (held_.empty()) return;
    auto* self = const_cast<CudaDevice*>(this);
    for (const RunBatch::Group& g : self->held_.take()) {
      std::vector<kc::MultiRun> runs;
      runs.reserve(g.runs.size());
      for (const RunBatch::Run& r : g.runs)
        runs.push_back({r.dst ? at(r.dst) : nullptr, r.src ? at(r.src) : nullptr, r.n, r.src2 ? at(r.src2) : nullptr});
      const auto count = static_cast<std::int64_t>(runs.size());
      switch (g.kind) {
        case RunBatch::Kind::copy: kc::multi_map(runs.data(), count, kc::MultiMode::copy, g.dst_dt, g.src_dt, stream_); break;
        case RunBatch::Kind::add: kc::multi_map(runs.data(), count, kc::MultiMode::add, g.dst_dt, g.src_dt, stream_); break;
        case RunBatch::Kind::zero: kc::multi_map(runs.data(), count, kc::MultiMode::zero, g.dst_dt, g.dst_dt, stream_); break;
        case RunBatch::Kind::sumsq:
          kc::multi_sum_squares(self->ctx(), static_cast<double*>(norm_), runs.data(), count, g.src_dt, stream_);
          break;
      }
    }
  }
  static void float_only(Ref r, const char* what) {
    if (!is_float(r.dt))
      throw std::logic_error(fmt::format("cuda device: {} of a {} buffer", what, dtype_name(r.dt)));
  }
  Bytes used() {
    std::size_t free = 0, total = 0;
    ZP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    mem_.total = Bytes{static_cast<std::int64_t>(total)};
    return Bytes{static_cast<std::int64_t>(total - free)};
  }
  // Each stream has its own arenas: work queued on two streams never shares scratch.
  void* scratch(std::size_t slot, std::size_t bytes) { return scratch_[stream_index()][slot].get(bytes, stream_); }
  std::size_t stream_index() const {
    for (std::size_t k = 0; k < streams_.size(); ++k)
      if (streams_[k] == stream_) return k;
    return 0;
  }
  static void* scratch_of(void* self, std::size_t slot, std::size_t bytes) {
    return static_cast<CudaDevice*>(self)->scratch(kCudaOpSlot + slot, bytes);
  }
  CudaOpEnv env() { return {&ctx(), stream_, &CudaDevice::scratch_of, this}; }
  // The current stream's Context (a Context serves one stream at a time): the compute
  // stream's is made with the device; another stream's the first time it needs one (its
  // workspace and scratch then count as the device's scratch).
  kc::Context& ctx() {
    const std::size_t k = stream_index();
    auto& c = ctx_[k];
    if (!c) {
      // Off the compute stream only small reductions need one (a norm's partial sums): no
      // GEMM workspace, a little scratch (a staged GEMM falls back to the plain one).
      kc::ContextOptions o = ctx_options_;
      o.blas_workspace_bytes = 0;
      o.scratch_bytes = kStreamContextBytes;
      c = std::make_unique<kc::Context>(o);
    }
    return *c;
  }
  // r as fp32 device memory: r itself, or an fp32 copy in scratch slot `slot`.
  float* as_f32(Ref r, std::int64_t n, std::size_t slot) {
    if (r.dt == DType::fp32) return f32(r);
    float_only(r, "an fp32 view");
    auto* s = static_cast<float*>(scratch(slot, U(n) * 4));
    kc::convert(s, DType::fp32, at(r), r.dt, n, stream_);
    return s;
  }
  void back(Ref r, float* v, std::int64_t n) {
    if (r.dt != DType::fp32) kc::convert(at(r), r.dt, v, DType::fp32, n, stream_);
  }

  int dev_ = 0;
  std::array<cudaStream_t, zero::kNumStreams> streams_{};  // compute, reduction, allgather, host
  cudaStream_t stream_ = nullptr;                          // the current event's
  kc::ContextOptions ctx_options_;
  std::array<std::unique_ptr<kc::Context>, zero::kNumStreams> ctx_;  // per stream, made when first needed
  // Per stream; 0-3: the device's own; 4-7: the ops' (kCudaOpSlot + exec/cuda_scratch.hpp's slots).
  std::array<std::array<Arena, kCudaDeviceSlots>, zero::kNumStreams> scratch_;
  Pinned pinned_up_, pinned_down_;
  void* norm_ = nullptr;       // device: the double sum of squares (not finite: a non-finite element)
  void* norm_host_ = nullptr;  // pinned
  std::vector<cudaEvent_t> events_;  // [0]: step start; 1 + 2i, 2 + 2i: event i's bracket
  std::vector<bool> recorded_;
  DriverMemory mem_;
  bool batching_ = false;
  RunBatch held_;  // runs held for one launch (batch)
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o) { return std::make_unique<CudaDevice>(o); }

DriverMemory driver_memory(const Device* d) {
  const auto* c = dynamic_cast<const CudaDevice*>(d);
  return c ? c->driver() : DriverMemory{};
}

void mark_after_comm(Device* d) {
  if (auto* c = dynamic_cast<CudaDevice*>(d)) c->mark_after_comm();
}

namespace {
const CudaDevice& cuda(const Device& d) {
  const auto* c = dynamic_cast<const CudaDevice*>(&d);
  if (!c) throw std::logic_error(fmt::format("a CUDA communicator needs the cuda device, not '{}'", d.name()));
  return *c;
}
}  // namespace

void* cuda_stream(const Device& d) { return cuda(d).stream(); }
int cuda_ordinal(const Device& d) { return cuda(d).ordinal(); }
std::string cuda_bus_id(const Device& d) {
  std::array<char, 32> id{};
  ZP_CUDA_CHECK(cudaDeviceGetPCIBusId(id.data(), static_cast<int>(id.size()), cuda(d).ordinal()));
  return id.data();
}

bool cuda_device_built() { return true; }

std::string cudnn_attention_refusal() { return kc::sdpa_cudnn_load(); }

int cuda_devices_visible() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver: clear the error, there is no device
    return 0;
  }
  return count;
}

}  // namespace zp::exec
