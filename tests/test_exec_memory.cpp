// The tracking allocator over a device whose memory the host does not address (the CUDA
// device's case, exercised here without a GPU): buffers are placed where the
// caching-allocator model places them, in segments that are each one allocation of the
// device, so the bytes the device holds are the model's reserved bytes at every moment,
// empty_cache() really returns segments, and live buffers never overlap. And the CUDA
// device's own memory as exec/cuda_memory.hpp predicts it.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exec/allocator.hpp"
#include "exec/cuda_memory.hpp"
#include "exec/cuda_scratch.hpp"
#include "exec/device_cpu.hpp"
#include "exec/device_placed.hpp"
#include "kernels/cpu/rng.hpp"
#include "models/model_config.hpp"
#include "sim/device.hpp"
#include "zero/lower.hpp"

namespace {

using zp::exec::Ref;

// Host memory behind an interface that says it is not the host's: only allocate, release
// and fill are used by the allocator.
class SegmentDevice final : public zp::exec::Device {
 public:
  const char* name() const override { return "segments"; }
  bool host_addressable() const override { return false; }
  void* allocate(std::size_t bytes) override {
    void* p = ::operator new(bytes);
    std::memset(p, 0xAB, bytes);  // not zero: the allocator must zero each buffer itself
    held[p] = bytes;
    ++allocations;
    return p;
  }
  void release(void* p) override {
    REQUIRE(held.count(p) == 1);
    held.erase(p);
    ::operator delete(p);
  }
  void fill(Ref d, std::int64_t n, float v) override { cpu.fill(d, n, v); }
  std::int64_t held_bytes() const {
    std::int64_t s = 0;
    for (const auto& [p, b] : held) s += static_cast<std::int64_t>(b);
    return s;
  }
  // Unused by the allocator.
  void forward(const zp::models::Op&, zp::exec::Operands&) override {}
  void backward(const zp::models::Op&, zp::exec::Operands&) override {}
  void adam_step(Ref, Ref, Ref, Ref, std::int64_t, std::int64_t, const zp::kernels::cpu::AdamConfig&, float) override {}
  void sgd_step(Ref, Ref, Ref, std::int64_t, std::int64_t, const zp::kernels::cpu::SgdConfig&, float) override {}
  void copy(Ref, Ref, std::int64_t) override {}
  void add(Ref, Ref, std::int64_t) override {}
  void scale(Ref, std::int64_t, float) override {}
  void norm_begin() override {}
  void norm_add(std::span<const Ref>, std::int64_t) override {}
  zp::exec::NormStats norm_end() override { return {}; }
  void upload(Ref, const float*, std::int64_t) override {}
  void download(float*, Ref, std::int64_t) override {}
  void upload_bytes(void*, const void*, std::size_t) override {}
  void download_bytes(void*, const void*, std::size_t) override {}
  void step_begin(std::size_t) override {}
  void event_begin(std::size_t) override {}
  void event_end(std::size_t) override {}
  void step_times(std::span<double>, std::span<double>) override {}

  zp::exec::CpuDevice cpu;
  std::map<void*, std::size_t> held;
  int allocations = 0;
};

}  // namespace

TEST_CASE("segmented device memory: held bytes equal the model's reserved bytes; accumulated-into buffers zeroed; all disjoint") {
  constexpr int kBuffers = 300;
  std::vector<zp::zero::Buffer> bufs(kBuffers);
  for (int i = 0; i < kBuffers; ++i) {
    auto& b = bufs[static_cast<std::size_t>(i)];
    b.id = i;
    b.dtype = zp::DType::u8;
    // Gradients start at zero; forward outputs are written whole by their op, not zero-filled.
    b.role = i % 2 == 0 ? zp::zero::BufferRole::param_grad : zp::zero::BufferRole::activation;
    // From a few bytes (the small pool) to tens of MiB (rounded segments).
    const auto u = zp::kernels::cpu::random_u32(7, static_cast<std::uint64_t>(i));
    b.elements = u % 4 == 0 ? std::int64_t{1} << (20 + u % 6) : 1 + u % 200000;
    b.bytes = zp::Bytes{b.elements};
  }
  // What the program reads as zeros (torch.zeros) and what it writes whole first (torch.empty).
  using zp::zero::BufferRole;
  for (BufferRole r : {BufferRole::param_grad, BufferRole::ipg_bucket, BufferRole::grads_in_partition,
                       BufferRole::activation_grad, BufferRole::op_scratch})
    CHECK(zp::zero::starts_zeroed(r));
  CHECK_FALSE(zp::zero::starts_zeroed(BufferRole::activation));
  CHECK_FALSE(zp::zero::starts_zeroed(BufferRole::step_temp));
  SegmentDevice dev;
  {
    zp::exec::TrackingAllocator mem(kBuffers, zp::Bytes{0}, &dev);
    std::vector<int> live;
    for (int round = 0; round < 6; ++round) {
      for (int i = round; i < kBuffers; i += 3) {
        if (mem.live(i)) continue;
        auto* p = static_cast<unsigned char*>(mem.allocate(bufs[static_cast<std::size_t>(i)], i % 2));
        const auto n = static_cast<std::size_t>(bufs[static_cast<std::size_t>(i)].bytes.v);
        // A gradient starts at zero even where an earlier buffer left its bytes; an activation
        // is handed over as the cache has it (the bytes below are checked for overlap only).
        if (bufs[static_cast<std::size_t>(i)].role == zp::zero::BufferRole::param_grad)
          CHECK(std::all_of(p, p + n, [](unsigned char c) { return c == 0; }));
        std::memset(p, i & 0xff, n);  // each buffer's own byte, to catch overlaps
        live.push_back(i);
        CHECK(dev.held_bytes() == mem.reserved_now().v);
      }
      // Every live buffer still holds its own byte: no two overlap.
      for (int i : live) {
        const auto* p = static_cast<const unsigned char*>(mem.data(i));
        const auto n = static_cast<std::size_t>(bufs[static_cast<std::size_t>(i)].bytes.v);
        CHECK(std::all_of(p, p + n, [&](unsigned char c) { return c == (i & 0xff); }));
      }
      // Free half of them, then return what is cached.
      std::vector<int> keep;
      for (std::size_t k = 0; k < live.size(); ++k) {
        if (k % 2 == 0) mem.release(bufs[static_cast<std::size_t>(live[k])]);
        else keep.push_back(live[k]);
      }
      live = keep;
      CHECK(dev.held_bytes() == mem.reserved_now().v);
      mem.empty_cache();
      CHECK(dev.held_bytes() == mem.reserved_now().v);
    }
    CHECK(dev.allocations > 0);
    for (int i : live) mem.release(bufs[static_cast<std::size_t>(i)]);
    mem.empty_cache();
    CHECK(dev.held_bytes() == 0);
  }
  CHECK(dev.held.empty());  // the allocator's destructor returns every segment
}

// ---- the CUDA device's own memory, predicted without a GPU (exec/cuda_memory.hpp)

namespace {

struct Probe {
  zp::models::OpGraph g;
  zp::zero::DsConfig cfg;
  zp::zero::Program p;
};

// GPT-2 (124M) at micro-batch B, sequence T, in `dtype`, sdpa attention, stage `stage`.
Probe gpt2_program(std::int64_t B, std::int64_t T, const char* dtype, int stage) {
  Probe r;
  r.cfg = zp::zero::parse_ds_config("gpt2.json", nlohmann::json::parse(fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "zero_optimization": {{"stage": {}}}{}}})", B, stage,
      std::string(dtype) == "fp32" ? "" : fmt::format(R"(, "{}": {{"enabled": true}})", dtype))));
  const auto mc = zp::models::load_model("gpt2");
  const auto batch = zp::zero::resolve_batch(r.cfg, 1);
  zp::models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = T;
  go.act_dtype = r.cfg.model_dtype();
  go.attention = zp::models::Attention::sdpa;
  r.g = zp::models::build_graph(mc, go);
  r.p = zp::zero::lower(r.g, r.cfg, batch, zp::zero::LowerOptions{});
  return r;
}

const zp::exec::CudaArena* arena(const zp::exec::CudaScratchPrediction& s, int stream, std::size_t slot) {
  for (const auto& a : s.arenas)
    if (a.stream == stream && a.slot == slot) return &a;
  return nullptr;
}

}  // namespace

TEST_CASE("cuda scratch: the arenas of GPT-2's program follow the CUDA device's rules") {
  const std::int64_t B = 2, T = 256, H = 12, D = 64, V = 50257, C = 768;
  for (const std::string dtype : {"bf16", "fp32"}) {
    CAPTURE(dtype);
    const auto pr = gpt2_program(B, T, dtype.c_str(), 1);
    const auto s = zp::exec::predict_cuda_scratch(pr.g, pr.p, pr.cfg);
    const std::int64_t esz = dtype == "fp32" ? 4 : 2;
    // The ops' temporaries (slot 4): the attention backward's four (B, H, T, D) head tensors:
    // q copied out of c_attn's columns, the output and its gradient as heads, and dq, which
    // the kernel cannot add into columns in place. k and v are contiguous heads already (HF's
    // KV-cache copies), so their gradients accumulate in place.
    const auto* ops = arena(s, 0, zp::exec::kCudaOpSlot + zp::exec::kTempSlot);
    REQUIRE(ops != nullptr);
    CHECK(ops->bytes.v == 4 * B * H * T * D * esz);
    CHECK(ops->largest_by.find("attn.sdpa") != std::string::npos);
    // The device's own slot 0: a 16-bit parameter is uploaded through an fp32 copy, the
    // largest being the token embedding; fp32 parameters go straight to their buffer.
    const auto* up = arena(s, 0, 0);
    if (esz == 2) {
      REQUIRE(up != nullptr);
      CHECK(up->bytes.v == V * C * 4);
      CHECK(up->largest_by == "upload (between steps)");
    } else {
      CHECK(up == nullptr);
    }
    // No op produces the loss other than the cross entropy, which takes its gradient by value.
    CHECK(arena(s, 0, zp::exec::kCudaOpSlot + zp::exec::kLossSlot) == nullptr);
    std::int64_t sum = s.stream_contexts.v;
    for (const auto& a : s.arenas) sum += a.bytes.v;
    CHECK(s.total.v == sum);
  }
}

// Grouped-query attention (tiny Llama: 2 kv heads for 4, transformers 5's enable_gqa): the own
// kernels repeat k and v over the query heads into copies and sum their gradients back; cuDNN
// takes them at their own heads, so no op's temporary is the attention's, and its backward
// workspace is 4·B·H·T·D bytes larger (kernels/common/sdpa_dims.hpp, measured).
TEST_CASE("cuda scratch: cuDNN takes grouped-query attention as it is, with its larger workspace") {
  // Large enough a batch that the attention's temporaries pass the arenas' 1 MiB floor.
  const std::int64_t B = 64, T = 64, H = 4, K = 2, D = 16;
  const auto cfg = zp::zero::parse_ds_config(
      "llama.json", nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 64, "bf16": {"enabled": true},
                                              "zero_optimization": {"stage": 1}})"));
  const auto mc = zp::models::load_model("tiny-llama");
  REQUIRE(mc.heads == H);
  REQUIRE(mc.kv_heads == K);
  zp::models::GraphOptions go;
  go.micro_batch = B;
  go.seq_len = T;
  go.act_dtype = cfg.model_dtype();
  go.attention = zp::models::Attention::sdpa;
  const auto g = zp::models::build_graph(mc, go);
  const auto p = zp::zero::lower(g, cfg, zp::zero::resolve_batch(cfg, 1), zp::zero::LowerOptions{});
  const auto own = zp::exec::predict_cuda_scratch(g, p, cfg);
  const auto cudnn = zp::exec::predict_cuda_scratch(g, p, cfg, true);
  CHECK(cudnn.context_buffer.v == 8 * B * H * T * D + 4 * B * H * T + 256);
  const auto* t_own = arena(own, 0, zp::exec::kCudaOpSlot + zp::exec::kTempSlot);
  const auto* t_cudnn = arena(cudnn, 0, zp::exec::kCudaOpSlot + zp::exec::kTempSlot);
  REQUIRE(t_own != nullptr);
  CHECK(t_own->largest_by.find("sdpa") != std::string::npos);  // the repeats and the sums back
  if (t_cudnn != nullptr) {
    CHECK(t_cudnn->largest_by.find("sdpa") == std::string::npos);
    CHECK(t_cudnn->bytes.v < t_own->bytes.v);
  }
}

TEST_CASE("cuda scratch: cuDNN's attention holds its backward's workspace in the compute Context's buffer") {
  const std::int64_t B = 2, T = 256, H = 12, D = 64;
  for (const std::string dtype : {"bf16", "fp32"}) {
    CAPTURE(dtype);
    const auto pr = gpt2_program(B, T, dtype.c_str(), 1);
    const auto own = zp::exec::predict_cuda_scratch(pr.g, pr.p, pr.cfg);
    const auto cudnn = zp::exec::predict_cuda_scratch(pr.g, pr.p, pr.cfg, true);
    CHECK(own.context_buffer.v == 0);
    if (dtype == "bf16") {
      // An fp32 dQ accumulator and an fp32 sum per row, rounded up to 256 bytes.
      CHECK(cudnn.context_buffer.v == 4 * B * H * T * (D + 1) + 256);
      CHECK(cudnn.context_buffer_by.find("backward of") != std::string::npos);
      CHECK(cudnn.context_buffer_by.find("attn.sdpa") != std::string::npos);
    } else {
      CHECK(cudnn.context_buffer.v == 0);  // fp32: the own kernels run
    }
    // The ops' temporaries: the own kernels' attention backward takes four (B, H, T, D) heads
    // (the arenas' case above) and sizes the slot. cuDNN reads q out of c_attn's columns, the
    // output and its gradient as their rows, and writes dq into its column block: in 16 bits
    // no op of this program takes a temporary at all, so the slot is never made.
    const auto* t_own = arena(own, 0, zp::exec::kCudaOpSlot + zp::exec::kTempSlot);
    const auto* t_cudnn = arena(cudnn, 0, zp::exec::kCudaOpSlot + zp::exec::kTempSlot);
    REQUIRE(t_own != nullptr);
    const std::int64_t own_temp = t_own->bytes.v, cudnn_temp = t_cudnn ? t_cudnn->bytes.v : 0;
    if (dtype == "bf16") {
      CHECK(own_temp == 4 * B * H * T * D * 2);
      CHECK(t_cudnn == nullptr);
    } else {
      CHECK(cudnn_temp == own_temp);
    }
    CHECK(cudnn.total.v == own.total.v - own_temp + cudnn_temp + cudnn.context_buffer.v);
    const auto& h100 = zp::sim::find_device("h100");
    const zp::Bytes reserved{1LL << 30};
    const auto u = zp::exec::predict_cuda_device_used(h100.executor, reserved, cudnn, true);
    const auto u0 = zp::exec::predict_cuda_device_used(h100.executor, reserved, own, true);
    // Its own cudaMallocs: whole 2 MiB pages; and where cuDNN takes the attention (16 bits),
    // cuDNN's handle and engines (the H100's 8 MiB, sim/devices.json).
    CHECK(cudnn.cudnn == (dtype == "bf16"));
    CHECK_FALSE(own.cudnn);
    CHECK(u.cudnn.v == (dtype == "bf16" ? 8 << 20 : 0));
    auto pages = [](std::int64_t b) { return (b + (2 << 20) - 1) / (2 << 20) * (2 << 20); };
    CHECK(u.total.v - u0.total.v == pages(cudnn.context_buffer.v) + pages(cudnn_temp) - pages(own_temp) + u.cudnn.v);
  }
}

TEST_CASE("cuda scratch: the device-used figure adds the GPU's measured parts and rounds allocations to pages") {
  const auto pr = gpt2_program(2, 256, "bf16", 0);
  const auto s = zp::exec::predict_cuda_scratch(pr.g, pr.p, pr.cfg);
  const auto& h200 = zp::sim::find_device("h200");
  REQUIRE(h200.executor.measured);
  const zp::Bytes reserved{10LL << 30};
  const auto u = zp::exec::predict_cuda_device_used(h200.executor, reserved, s, true);
  CHECK(u.known);
  // By hand: the H200's figures (526.9 MiB context, 96 + 4 MiB of libraries, 578.0 MiB of NCCL),
  // the two arenas (the embedding's fp32 upload, 50257 x 768 x 4 B; the attention backward's
  // four (2, 12, 256, 64) bf16 head tensors) and their pages: 74 pages hold the first, 2 the
  // second.
  const std::int64_t MiB = 1 << 20, upload = 50257LL * 768 * 4, heads = 4LL * 2 * 12 * 256 * 64 * 2;
  CHECK(u.context.v == 552468480);
  CHECK(u.libraries.v == 100 * MiB);
  CHECK(u.communicator.v == 606076928);
  CHECK(u.scratch.v == upload + heads);
  CHECK(u.pages.v == (74 * 2 * MiB - upload) + (2 * 2 * MiB - heads));
  CHECK(u.total.v == 552468480 + 100 * MiB + 606076928 + reserved.v + 74 * 2 * MiB + 2 * 2 * MiB);
  // --comm mpi: no NCCL communicator.
  CHECK(zp::exec::predict_cuda_device_used(h200.executor, reserved, s, false).communicator.v == 0);
  // A GPU never measured: the parts outside the program are unknown, not guessed.
  const auto a100 = zp::exec::predict_cuda_device_used(zp::sim::find_device("a100").executor, reserved, s, true);
  CHECK_FALSE(a100.known);
  CHECK(a100.context.v == 0);
  // Figures without a communicator's (a profile of MPI runs): known for --comm mpi only.
  auto mpi_only = h200.executor;
  mpi_only.nccl_measured = false;
  CHECK(zp::exec::predict_cuda_device_used(mpi_only, reserved, s, false).known);
  CHECK_FALSE(zp::exec::predict_cuda_device_used(mpi_only, reserved, s, true).known);
}

TEST_CASE("cuda scratch: with the optimizer offloaded, its update and states take no device scratch") {
  Probe pr = gpt2_program(2, 128, "bf16", 2);
  pr.cfg = zp::zero::parse_ds_config("offload.json", nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 2,
      "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})"));
  pr.p = zp::zero::lower(pr.g, pr.cfg, zp::zero::resolve_batch(pr.cfg, 1), zp::zero::LowerOptions{});
  REQUIRE(std::any_of(pr.p.buffers.begin(), pr.p.buffers.end(),
                      [](const zp::zero::Buffer& b) { return b.placement == zp::zero::Placement::host; }));
  const auto s = zp::exec::predict_cuda_scratch(pr.g, pr.p, pr.cfg);
  for (const auto& a : s.arenas) {
    CAPTURE(a.largest_by);
    CHECK(a.slot != 1);  // the fp32 views of params and states: the CPU's Adam works on host memory
    CHECK(a.slot != 2);
    CHECK(a.slot != 3);
  }
  // The updated partition comes back to the 16-bit params through the device in chunks of
  // PlacedDevice::kChunkElements fp32 values, on the stream its event runs on (the host's).
  const auto* back = arena(s, static_cast<int>(zp::zero::Stream::host), 0);
  REQUIRE(back != nullptr);
  CHECK(back->bytes.v == zp::exec::PlacedDevice::kChunkElements * 4);
  CHECK(back->largest_by == "upload in step/params_to_device");
  // The compute stream's slot 0: the embedding's upload at the start, as without offload.
  const auto* up = arena(s, 0, 0);
  REQUIRE(up != nullptr);
  CHECK(up->bytes.v == 50257 * 768 * 4);
}
