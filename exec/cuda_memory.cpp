#include "exec/cuda_memory.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>

#include <sys/mman.h>

#include <fmt/format.h>

#include "exec/allocator.hpp"
#include "exec/comm.hpp"
#include "exec/cuda_scratch.hpp"
#include "exec/device_placed.hpp"
#include "exec/interpreter.hpp"
#include "kernels/common/sdpa_dims.hpp"
#include "exec/numeric.hpp"

namespace zp::exec {

namespace {

// A communicator of the program's world that moves nothing: the device's memory does not
// depend on what a collective carries (it works in place on the program's buffers).
class NullComm final : public Comm {
 public:
  NullComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void run(const CollectiveCall&) override {}
  bool device_buffers() const override { return true; }
  const char* backend() const override { return "none"; }
  double sum_for_report(double v) override { return v; }
  std::vector<std::string> gather_for_report(const std::string& text) override {
    return std::vector<std::string>(static_cast<std::size_t>(size_), text);
  }
  void barrier() override {}
  [[noreturn]] void abort(const std::string& why) override { throw std::logic_error(why); }

 private:
  int rank_ = 0, size_ = 1;
};

// Addresses for the probe's device buffers: a range of the process's address space reserved
// and never mapped (mmap PROT_NONE), so no host allocation can fall in it and a pointer's
// side is told by its address, as exec::PlacedDevice tells it.
class AddressRange {
 public:
  AddressRange() {
    void* p = mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cuda memory probe: cannot reserve address space for the device");
    base_ = static_cast<char*>(p);
  }
  ~AddressRange() { munmap(base_, kBytes); }
  AddressRange(const AddressRange&) = delete;
  AddressRange& operator=(const AddressRange&) = delete;
  void* take(std::size_t bytes) {
    const std::size_t size = (std::max<std::size_t>(bytes, 1) + 511) / 512 * 512;
    if (used_ + size > kBytes) throw std::runtime_error("cuda memory probe: the program's device buffers exceed 1 TiB");
    void* p = base_ + used_;
    used_ += size;
    return p;
  }
  bool holds(const void* p) const {
    const auto* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + kBytes;
  }

 private:
  static constexpr std::size_t kBytes = std::size_t{1} << 40;
  char* base_ = nullptr;
  std::size_t used_ = 0;
};

// The CUDA device's memory decisions (exec/device_cuda.cpp), without memory or kernels, behind
// exec::PlacedDevice's routing (which `train --device cuda` puts in front of it when the
// program has host buffers, ZeRO-Offload): device buffers get addresses nothing reads; a call
// records the scratch the CUDA device would take for it on the current stream; a call on
// host buffers takes none (the CPU runs it), except the transfers PlacedDevice makes through
// the device in chunks. Host buffers are real (the allocator's, zero pages) and never touched.
class ProbeDevice final : public Device {
 public:
  ProbeDevice(const zero::Program& p, bool cudnn_attention)
      : p_(p), placed_(runs_placed(p)), cudnn_(cudnn_attention) {}

  const char* name() const override { return "cuda (memory probe)"; }
  bool host_addressable() const override { return false; }
  void* allocate(std::size_t bytes) override { return range_.take(bytes); }
  void release(void*) override {}

  // An op ends a batch, as on the CUDA device.
  void forward(const models::Op& op, Operands& o) override {
    batching_ = false;
    ops(op, "forward", cuda_forward_scratch(op, o, cudnn_));
  }
  void backward(const models::Op& op, Operands& o) override {
    batching_ = false;
    ops(op, "backward", cuda_backward_scratch(op, o, cudnn_));
    if (cudnn_ && (op.fn == models::Fn::sdpa || op.fn == models::Fn::flash_attention)) cudnn_workspace(op, o);
  }

  // The fp32 views exec/device_cuda.cpp takes: a 16-bit gradient in slot 0, the params and
  // the states in slots 1-3. On host buffers: the CPU's.
  void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t, const kernels::cpu::AdamConfig&,
                 float) override {
    if (n <= 0 || !same_side(p, {g, m, v}, "adam step")) return;
    view(g, n, 0, "adam_step");
    view(p, n, 1, "adam_step");
    view(m, n, 2, "adam_step");
    view(v, n, 3, "adam_step");
  }
  void sgd_step(Ref p, Ref g, Ref momentum, std::int64_t n, std::int64_t, const kernels::cpu::SgdConfig&,
                float) override {
    if (n <= 0 || !same_side(p, {g, momentum}, "sgd step")) return;
    view(g, n, 0, "sgd_step");
    view(p, n, 1, "sgd_step");
    if (momentum) view(momentum, n, 2, "sgd_step");
  }
  // Between the sides, PlacedDevice moves fp32 values through the device's upload and
  // download in chunks (raw bytes when both sides store the same 16-bit dtype).
  void copy(Ref dst, Ref src, std::int64_t n) override {
    const bool dd = dev(dst), sd = dev(src);
    if (dd == sd || n <= 0) return;
    if (src.dt == dst.dt && src.dt != DType::fp32) return;
    chunks(dd ? dst : src, n, dd ? "upload" : "download");
  }
  void add(Ref dst, Ref src, std::int64_t n) override {
    if (dev(dst) && src && !dev(src)) throw std::logic_error("add of host memory into device memory");
    if (!dev(dst) && dev(src) && n > 0) chunks(src, n, "download");
  }
  void fill(Ref, std::int64_t, float) override {}
  void scale(Ref, std::int64_t, float) override {}
  void norm_begin() override {}
  // A program with host buffers runs behind a PlacedDevice (runs_placed), which passes no
  // batch on: the CUDA device then runs each call as made.
  void batch(bool on) override { batching_ = on && !placed_; }
  void norm_add(std::span<const Ref> parts, std::int64_t n) override {
    if (n <= 0 || parts.empty()) return;
    std::size_t on = 0;
    for (const Ref& r : parts) on += dev(r) ? 1 : 0;
    if (on < parts.size()) {  // summed on the host, the device's parts downloaded as fp32
      for (const Ref& r : parts)
        if (dev(r)) chunks(r, n, "norm");
      return;
    }
    // Two float parts of one dtype, batched: held and summed as they are read (no scratch).
    const bool held = batching_ && parts.size() == 2 && parts[0].dt == parts[1].dt && is_float(parts[0].dt);
    if (parts.size() > 1 && !held) {
      take(0, static_cast<std::size_t>(n) * 4, "norm");
      for (std::size_t k = 1; k < parts.size(); ++k) view(parts[k], n, 1, "norm");
    }
    context();  // the sum of squares reduces through the stream's Context
  }
  NormStats norm_end() override { return {}; }
  void upload(Ref dst, const float*, std::int64_t n) override {
    if (n > 0 && dev(dst)) view(dst, n, 0, "upload");
  }
  void download(float* dst, Ref src, std::int64_t n) override {
    if (n <= 0) return;
    if (dev(src)) view(src, n, 0, "download");
    std::fill(dst, dst + n, 0.0f);
  }
  void upload_bytes(void*, const void*, std::size_t) override {}
  void download_bytes(void* dst, const void*, std::size_t bytes) override {
    std::fill(static_cast<std::byte*>(dst), static_cast<std::byte*>(dst) + bytes, std::byte{0});
  }

  void step_begin(std::size_t) override { stream_ = 0; }
  void event_order(std::size_t i, int stream, std::span<const std::int32_t>) override {
    if (stream < 0 || stream >= zero::kNumStreams)
      throw std::logic_error(fmt::format("cuda memory probe: event {} on stream {}", i, stream));
    stream_ = stream;
    event_ = i;
  }
  void event_begin(std::size_t i) override { event_ = i; }
  void event_end(std::size_t) override {}
  void step_times(std::span<double> seconds, std::span<double> starts) override {
    std::fill(seconds.begin(), seconds.end(), 0.0);
    std::fill(starts.begin(), starts.end(), 0.0);
    stream_ = 0;  // between steps: the compute stream
    event_ = SIZE_MAX;
  }

  CudaScratchPrediction result() const {
    CudaScratchPrediction r;
    for (int s = 0; s < zero::kNumStreams; ++s) {
      for (std::size_t k = 0; k < kCudaDeviceSlots; ++k) {
        const Arena& a = arenas_[static_cast<std::size_t>(s)][k];
        if (a.bytes == 0) continue;
        r.arenas.push_back({s, k, Bytes{static_cast<std::int64_t>(a.bytes)}, a.by});
        r.total += Bytes{static_cast<std::int64_t>(a.bytes)};
      }
      if (s != 0 && contexts_[static_cast<std::size_t>(s)])
        r.stream_contexts += Bytes{static_cast<std::int64_t>(kStreamContextBytes)};
    }
    r.context_buffer = Bytes{static_cast<std::int64_t>(buffer_)};
    r.context_buffer_by = buffer_by_;
    r.cudnn = cudnn_used_;
    r.total += r.stream_contexts + r.context_buffer;
    return r;
  }

 private:
  struct Arena {
    std::size_t bytes = 0;
    std::string by;
  };
  std::string who(const std::string& what) const {
    if (event_ == SIZE_MAX || event_ >= p_.events.size()) return fmt::format("{} (between steps)", what);
    return fmt::format("{} in {}", what, p_.event_name(static_cast<zero::EventId>(event_)));
  }
  // Arena::get of exec/device_cuda.cpp: grown to a request larger than it, never below 1 MiB.
  void take(std::size_t slot, std::size_t bytes, const std::string& what) {
    if (bytes == 0) return;
    Arena& a = arenas_[static_cast<std::size_t>(stream_)][slot];
    const std::size_t size = std::max(bytes, kArenaMinBytes);
    if (size > a.bytes) {
      a.bytes = size;
      a.by = who(what);
    }
  }
  void view(Ref r, std::int64_t n, std::size_t slot, const char* what) {
    if (r && r.dt != DType::fp32) take(slot, static_cast<std::size_t>(n) * 4, what);
  }
  // PlacedDevice's transfers of a device buffer r: chunks of at most kChunkElements fp32
  // values through the device's slot 0 (a view when r is 16-bit).
  void chunks(Ref r, std::int64_t n, const char* what) {
    view(r, std::min(n, PlacedDevice::kChunkElements), 0, what);
  }
  bool dev(const Ref& r) const { return r && range_.holds(r.base); }
  // Whether an update runs on the device (every operand there) or the host (none there);
  // operands on both sides are refused, as PlacedDevice refuses them.
  bool same_side(const Ref& p, std::initializer_list<Ref> others, const char* what) const {
    const bool on = dev(p);
    for (const Ref& r : others)
      if (r && dev(r) != on) throw std::logic_error(fmt::format("{} with operands on both sides", what));
    return on;
  }
  void context() { contexts_[static_cast<std::size_t>(stream_)] = true; }
  // cuDNN's workspace (its backward's; the forward's 256 B for an attention without one) in the
  // compute Context's buffer (grown, never shrunk), where
  // cuDNN takes the attention (exec/device_cuda_ops.cpp's FusedAttention decides alike). A
  // gradient without a buffer of its own gets one among the op's temporaries (the scratch rule
  // above), so cuDNN always has three to write. A gradient added into (not written whole), as
  // contiguous heads or as a column block of rows alike, would take a (B, X, T, D) temporary (X
  // its heads: H for q, Hk for k and v)
  // after the workspace (sdpa_cudnn_backward); the models here write theirs whole, and that case
  // is not counted.
  void cudnn_workspace(const models::Op& op, const Operands& o) {
    const models::HeadsLayout f = models::heads_layout(o.graph(), op);
    if (!cuda_attention_takes_cudnn(f, o.act_ref(f.q.tensor).dt, true)) return;
    cudnn_used_ = true;
    const bool backward = o.grad_peek(f.q.tensor) || o.grad_peek(f.k.tensor) || o.grad_peek(f.v.tensor);
    const auto bytes = static_cast<std::size_t>(backward ? kernels::sdpa_cudnn_backward_workspace(f.B, f.H, f.K, f.T, f.D)
                                                         : kernels::kSdpaCudnnForwardWorkspace);
    if (bytes > buffer_) {
      buffer_ = bytes;
      buffer_by_ = who(fmt::format("{} of {}", backward ? "backward" : "forward", op.name));
    }
  }
  void ops(const models::Op& op, const char* pass, const OpScratch& s) {
    context();  // an op runs with its stream's Context
    const std::string what = fmt::format("{} of {}", pass, op.name);
    take(kCudaOpSlot + kTempSlot, scratch_parts_total(s.temp), what);
    take(kCudaOpSlot + kConvertSlot, s.convert, what);
    take(kCudaOpSlot + kLossSlot, s.loss, what);
  }

  const zero::Program& p_;
  AddressRange range_;
  int stream_ = 0;
  std::size_t event_ = SIZE_MAX;
  std::array<std::array<Arena, kCudaDeviceSlots>, zero::kNumStreams> arenas_{};
  std::array<bool, zero::kNumStreams> contexts_{};
  const bool placed_;
  const bool cudnn_;         // train --attention-kernel cudnn
  bool cudnn_used_ = false;  // ... and cuDNN takes an attention of the program
  std::size_t buffer_ = 0;   // the compute Context's buffer (cuDNN's workspace)
  std::string buffer_by_;      // host buffers: PlacedDevice in front of the CUDA device
  bool batching_ = false;  // exec/device_cuda.cpp holds runs only between batch(true) and batch(false)
};

}  // namespace

CudaScratchPrediction predict_cuda_scratch(const models::OpGraph& g, const zero::Program& p,
                                           const zero::DsConfig& cfg, bool cudnn_attention) {
  // The interpreter runs a repeating program expanded: the probe names its events so.
  std::optional<zero::Program> expanded;
  if (p.repeat.copies > 0) expanded = zero::expand(p);
  ProbeDevice dev(expanded ? *expanded : p, cudnn_attention);
  NullComm comm(p.info.rank, p.info.world_size);
  TrackingAllocator mem(p.buffers.size(), Bytes{0}, &dev);
  Interpreter interp(g, p, cfg, comm, mem, 1, &dev);
  interp.skip_initial_values();
  interp.prologue();
  // One step: every micro-step's inputs (ids of 0), in the graph's input shapes.
  MicroBatch mb;
  for (const models::TensorId t : g.inputs)
    mb.emplace_back(static_cast<std::size_t>(shape_numel(g.tensors[static_cast<std::size_t>(t)].shape)), 0);
  const std::vector<MicroBatch> data(static_cast<std::size_t>(p.info.gas), mb);
  interp.step(1, data);
  return dev.result();
}

namespace {
std::int64_t page_rounding(std::size_t bytes) {
  const std::size_t pages = (bytes + kDevicePageBytes - 1) / kDevicePageBytes * kDevicePageBytes;
  return static_cast<std::int64_t>(pages - bytes);
}
}  // namespace

CudaDeviceUsed predict_cuda_device_used(const sim::DeviceSpec::ExecutorMemory& figures, Bytes reserved_peak,
                                        const CudaScratchPrediction& s, bool nccl) {
  CudaDeviceUsed u;
  u.known = figures.measured && (!nccl || figures.nccl_measured) && (!s.cudnn || figures.cudnn_measured);
  if (u.known) {
    u.context = figures.context;
    u.libraries = Bytes{static_cast<std::int64_t>(kComputeContextBytes)} + figures.libraries;
    u.communicator = nccl ? figures.nccl_one_rank : Bytes{0};
    u.cudnn = s.cudnn ? figures.cudnn : Bytes{0};
  }
  u.reserved = reserved_peak;
  u.scratch = s.total;
  std::int64_t pages = 0;
  for (const CudaArena& a : s.arenas) pages += page_rounding(static_cast<std::size_t>(a.bytes.v));
  const std::int64_t contexts = s.stream_contexts.v / static_cast<std::int64_t>(kStreamContextBytes);
  pages += contexts * page_rounding(kStreamContextBytes);
  if (s.context_buffer.v > 0) pages += page_rounding(static_cast<std::size_t>(s.context_buffer.v));
  // The interpreter's loss slots (one fp32 per micro-step) are a few bytes: the runtime
  // places them in a page it already holds (the one the device's 8-byte norm took at init,
  // part of the libraries' figure), so they add nothing. The 14 recorded H200 runs left 1-5
  // MiB unexplained, within the rounding above.
  u.pages = Bytes{pages};
  u.total = u.context + u.libraries + u.communicator + u.cudnn + u.reserved + u.scratch + u.pages;
  return u;
}

}  // namespace zp::exec
