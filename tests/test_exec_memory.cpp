// The tracking allocator over a device whose memory the host does not address (the CUDA
// device's case, exercised here without a GPU): buffers are placed where the
// caching-allocator model places them, in segments that are each one allocation of the
// device, so the bytes the device holds are the model's reserved bytes at every moment,
// empty_cache() really returns segments, and live buffers never overlap.
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include <doctest/doctest.h>

#include "exec/allocator.hpp"
#include "exec/device_cpu.hpp"
#include "kernels/cpu/rng.hpp"

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
