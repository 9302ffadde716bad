// The data-movement contract of exec/device.hpp, on the CPU device: elementwise in fp32 with
// one rounding per stored element, so a copy between equal dtypes is exact, a 16-bit
// accumulation rounds the fp32 sum once, and norms add the parts before squaring. The CUDA
// device implements the same calls (exec/device_cuda.cpp); tests/gpu/test_exec_cuda.cpp
// checks it through whole training runs against this device.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <doctest/doctest.h>

#include "exec/device_cpu.hpp"
#include "exec/device_placed.hpp"
#include "exec/run_batch.hpp"
#include "forwarding_device.hpp"
#include "kernels/cpu/convert.hpp"

namespace {

namespace cpu = zp::kernels::cpu;
using zp::DType;
using zp::exec::Ref;

std::vector<float> values(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f) * (1.0f + static_cast<float>(i % 7));
  return v;
}

}  // namespace

TEST_CASE("device copy, add, fill, scale: one rounding per stored element") {
  zp::exec::CpuDevice dev;
  const std::size_t n = 37;
  const auto x = values(n), y = values(n + 5);
  std::vector<std::uint16_t> b(n), c(n);
  std::vector<float> f(n), g(n);

  // fp32 -> bf16 is the round-to-nearest-even conversion; bf16 -> bf16 is a bit copy.
  dev.copy(Ref{b.data(), DType::bf16, 0}, Ref{const_cast<float*>(x.data()), DType::fp32, 0}, static_cast<std::int64_t>(n));
  for (std::size_t i = 0; i < n; ++i) CHECK(b[i] == cpu::float_to_bf16(x[i]));
  dev.copy(Ref{c.data(), DType::bf16, 0}, Ref{b.data(), DType::bf16, 0}, static_cast<std::int64_t>(n));
  CHECK(c == b);

  // Offsets address elements: 10 elements from element 3 of y into element 5 of f.
  dev.copy(Ref{f.data(), DType::fp32, 5}, Ref{const_cast<float*>(y.data()), DType::fp32, 3}, 10);
  for (std::size_t i = 0; i < 10; ++i) CHECK(f[5 + i] == y[3 + i]);
  CHECK(f[4] == 0.0f);
  CHECK(f[15] == 0.0f);

  // bf16 += fp32: the fp32 sum rounded once.
  std::vector<std::uint16_t> acc = b;
  dev.add(Ref{acc.data(), DType::bf16, 0}, Ref{const_cast<float*>(y.data()), DType::fp32, 0}, static_cast<std::int64_t>(n));
  for (std::size_t i = 0; i < n; ++i) CHECK(acc[i] == cpu::float_to_bf16(cpu::bf16_to_float(b[i]) + y[i]));

  // fp32 += bf16: exact widening, then the fp32 sum.
  g = x;
  dev.add(Ref{g.data(), DType::fp32, 0}, Ref{b.data(), DType::bf16, 0}, static_cast<std::int64_t>(n));
  for (std::size_t i = 0; i < n; ++i) CHECK(g[i] == x[i] + cpu::bf16_to_float(b[i]));

  // fp16: the same rule.
  std::vector<std::uint16_t> h(n);
  dev.copy(Ref{h.data(), DType::fp16, 0}, Ref{const_cast<float*>(x.data()), DType::fp32, 0}, static_cast<std::int64_t>(n));
  for (std::size_t i = 0; i < n; ++i) CHECK(h[i] == cpu::float_to_fp16(x[i]));

  // fill and scale.
  dev.fill(Ref{b.data(), DType::bf16, 2}, 4, 1.5f);
  for (std::size_t i = 2; i < 6; ++i) CHECK(cpu::bf16_to_float(b[i]) == 1.5f);
  std::vector<std::int64_t> ids(8, 42);
  dev.fill(Ref{ids.data(), DType::i64, 1}, 6, 0.0f);  // other dtypes: zeroed bytes
  CHECK(ids == std::vector<std::int64_t>{42, 0, 0, 0, 0, 0, 0, 42});
  CHECK_THROWS(dev.fill(Ref{ids.data(), DType::i64, 0}, 1, 1.0f));
  std::vector<std::uint16_t> s = acc;
  dev.scale(Ref{s.data(), DType::bf16, 0}, static_cast<std::int64_t>(n), 0.25f);
  for (std::size_t i = 0; i < n; ++i) CHECK(s[i] == cpu::float_to_bf16(cpu::bf16_to_float(acc[i]) * 0.25f));
}

TEST_CASE("device norms: parts added before squaring, in double; a non-finite value is flagged") {
  zp::exec::CpuDevice dev;
  std::vector<float> a = {1.0f, -2.0f, 3.0f}, b = {0.5f, 2.0f, -1.0f};
  dev.norm_begin();
  const Ref one[] = {Ref{a.data(), DType::fp32, 0}};
  dev.norm_add(one, 3);
  auto st = dev.norm_end();
  CHECK(st.sumsq == 14.0);
  CHECK_FALSE(st.nonfinite);
  dev.norm_begin();
  const Ref two[] = {Ref{a.data(), DType::fp32, 0}, Ref{b.data(), DType::fp32, 0}};
  dev.norm_add(two, 3);
  dev.norm_add(one, 1);  // several calls add up
  st = dev.norm_end();
  CHECK(st.sumsq == 1.5 * 1.5 + 0.0 + 2.0 * 2.0 + 1.0);
  a[1] = std::numeric_limits<float>::infinity();
  dev.norm_begin();
  dev.norm_add(one, 3);
  CHECK(dev.norm_end().nonfinite);
}

TEST_CASE("device optimizer steps: 16-bit params update in fp32 and round once; the gradient factor is applied first") {
  zp::exec::CpuDevice dev;
  const std::size_t n = 16;
  const auto p0 = values(n), g0 = values(n + 3);
  zp::kernels::cpu::AdamConfig c;
  c.lr = 1e-2;
  // fp32 reference: the gradient scaled, then Adam.
  std::vector<float> p = p0, g(g0.begin(), g0.begin() + static_cast<std::ptrdiff_t>(n)), m(n), v(n);
  std::vector<float> gs = g;
  for (float& x : gs) x *= 0.5f;
  std::vector<float> pr = p0, mr(n), vr(n);
  cpu::adam_step(pr.data(), gs.data(), mr.data(), vr.data(), static_cast<std::int64_t>(n), 1, c);
  dev.adam_step(Ref{p.data(), DType::fp32, 0}, Ref{g.data(), DType::fp32, 0}, Ref{m.data(), DType::fp32, 0},
                Ref{v.data(), DType::fp32, 0}, static_cast<std::int64_t>(n), 1, c, 0.5f);
  CHECK(p == pr);
  CHECK(m == mr);
  CHECK(g == gs);  // an fp32 gradient is scaled in place, as DeepSpeed unscales it
  // bf16 params and states (a model left in bf16 at stage 0): fp32 math, one rounding each.
  std::vector<std::uint16_t> pb(n), mb(n), vb(n), gb(n);
  for (std::size_t i = 0; i < n; ++i) {
    pb[i] = cpu::float_to_bf16(p0[i]);
    gb[i] = cpu::float_to_bf16(g0[i]);
  }
  std::vector<float> pf(n), gf(n), mf(n), vf(n);
  for (std::size_t i = 0; i < n; ++i) {
    pf[i] = cpu::bf16_to_float(pb[i]);
    gf[i] = cpu::bf16_to_float(gb[i]) * 0.5f;
  }
  cpu::adam_step(pf.data(), gf.data(), mf.data(), vf.data(), static_cast<std::int64_t>(n), 1, c);
  dev.adam_step(Ref{pb.data(), DType::bf16, 0}, Ref{gb.data(), DType::bf16, 0}, Ref{mb.data(), DType::bf16, 0},
                Ref{vb.data(), DType::bf16, 0}, static_cast<std::int64_t>(n), 1, c, 0.5f);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(pb[i] == cpu::float_to_bf16(pf[i]));
    CHECK(mb[i] == cpu::float_to_bf16(mf[i]));
    CHECK(vb[i] == cpu::float_to_bf16(vf[i]));
  }
}

namespace {

// Memory the host is told it cannot address (a GPU's, here host memory behind the
// interface): the data-movement calls run on the CPU device; it counts the drains and the
// largest transfer, and counts optimizer steps (the placed device must keep those of host
// buffers on the host).
class RemoteDevice final : public zp::test::ForwardingDevice {
 public:
  RemoteDevice() : ForwardingDevice(false) {}
  const char* name() const override { return "remote"; }
  void synchronize() override { ++drains; }
  void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t s, const cpu::AdamConfig& c, float f) override {
    ++updates;
    this->cpu.adam_step(p, g, m, v, n, s, c, f);
  }
  void sgd_step(Ref, Ref, Ref, std::int64_t, std::int64_t, const cpu::SgdConfig&, float) override { ++updates; }
  void upload(Ref d, const float* s, std::int64_t n) override {
    largest = std::max(largest, n);
    this->cpu.upload(d, s, n);
  }
  void download(float* d, Ref s, std::int64_t n) override {
    largest = std::max(largest, n);
    this->cpu.download(d, s, n);
  }
  void step_times(std::span<double> s, std::span<double> t) override {
    this->cpu.step_times(s, t);
    for (double& x : s) x = -1.0;  // a device time, told apart from the host's below
  }
  int drains = 0, updates = 0;
  std::int64_t largest = 0;
};

}  // namespace

TEST_CASE("placed device: calls go where their operands live; transfers convert once and are chunked") {
  RemoteDevice remote;
  zp::exec::PlacedDevice dev(remote);
  constexpr std::int64_t kN = zp::exec::PlacedDevice::kChunkElements + 1001;  // two transfers
  const auto x = values(static_cast<std::size_t>(kN));
  auto* d16 = static_cast<std::uint16_t*>(dev.allocate(static_cast<std::size_t>(kN) * 2));
  std::vector<float> h32(static_cast<std::size_t>(kN));
  CHECK(dev.on_device(d16));
  CHECK(dev.on_device(d16 + kN - 1));
  CHECK_FALSE(dev.on_device(d16 + kN));
  CHECK_FALSE(dev.on_device(h32.data()));

  // Host fp32 master -> device bf16 params: one rounding, in chunks no larger than kChunkElements.
  std::copy(x.begin(), x.end(), h32.begin());
  dev.copy(Ref{d16, DType::bf16, 0}, Ref{h32.data(), DType::fp32, 0}, kN);
  CHECK(remote.largest == zp::exec::PlacedDevice::kChunkElements);
  CHECK(dev.transfers() == 2);
  bool same = true;
  for (std::int64_t i = 0; i < kN; ++i) same = same && d16[i] == cpu::float_to_bf16(x[static_cast<std::size_t>(i)]);
  CHECK(same);
  // Device bf16 gradients accumulated into a host fp32 partition (gradient accumulation with offload).
  std::vector<float> acc(static_cast<std::size_t>(kN), 0.25f);
  dev.add(Ref{acc.data(), DType::fp32, 0}, Ref{d16, DType::bf16, 0}, kN);
  same = true;
  for (std::int64_t i = 0; i < kN; ++i) same = same && acc[static_cast<std::size_t>(i)] == 0.25f + cpu::bf16_to_float(d16[i]);
  CHECK(same);
  // Device bf16 -> host bf16: a bit copy.
  std::vector<std::uint16_t> h16(100);
  dev.copy(Ref{h16.data(), DType::bf16, 0}, Ref{d16, DType::bf16, 7}, 100);
  CHECK(std::equal(h16.begin(), h16.end(), d16 + 7));
  // An add of host memory into the device's is not something a program does: said, not guessed.
  CHECK_THROWS_AS(dev.add(Ref{d16, DType::bf16, 0}, Ref{acc.data(), DType::fp32, 0}, 4), std::logic_error);

  // Adam of host operands runs on the host; of device ones on the device; of both: refused.
  cpu::AdamConfig c;
  c.lr = 1e-2;
  std::vector<float> p(16, 1.0f), g(16, 0.5f), m(16), v(16);
  const Ref hp{p.data(), DType::fp32, 0}, hg{g.data(), DType::fp32, 0}, hm{m.data(), DType::fp32, 0}, hv{v.data(), DType::fp32, 0};
  dev.adam_step(hp, hg, hm, hv, 16, 1, c, 1.0f);
  CHECK(remote.updates == 0);
  CHECK(p[0] < 1.0f);
  auto* dp = static_cast<float*>(dev.allocate(16 * 4 * 4));
  const Ref rp{dp, DType::fp32, 0}, rg{dp, DType::fp32, 16}, rm{dp, DType::fp32, 32}, rv{dp, DType::fp32, 48};
  dev.adam_step(rp, rg, rm, rv, 16, 1, c, 1.0f);
  CHECK(remote.updates == 1);
  CHECK_THROWS_AS(dev.adam_step(rp, hg, rm, rv, 16, 1, c, 1.0f), std::logic_error);

  // Norms: the device's parts and the host's added; a sum of parts on both sides on the host.
  std::vector<float> a = {1.0f, -2.0f, 3.0f};
  std::copy(a.begin(), a.end(), dp);
  dev.norm_begin();
  const Ref on_dev[] = {Ref{dp, DType::fp32, 0}};
  const Ref on_host[] = {Ref{a.data(), DType::fp32, 0}};
  const Ref both[] = {Ref{dp, DType::fp32, 0}, Ref{a.data(), DType::fp32, 0}};
  dev.norm_add(on_dev, 3);
  dev.norm_add(on_host, 3);
  dev.norm_add(both, 3);
  const auto st = dev.norm_end();
  CHECK(st.sumsq == 14.0 + 14.0 + 56.0);
  CHECK_FALSE(st.nonfinite);
  dev.release(dp);
  dev.release(d16);
  CHECK_FALSE(dev.on_device(d16));
}

TEST_CASE("placed device: an event with host work is timed on the host clock after one drain of the device") {
  RemoteDevice remote;
  zp::exec::PlacedDevice dev(remote);
  std::vector<float> h(8, 1.0f);
  auto* d = static_cast<float*>(dev.allocate(8 * 4));
  dev.step_begin(3);
  dev.event_begin(0);  // device work only
  dev.fill(Ref{d, DType::fp32, 0}, 8, 2.0f);
  dev.event_end(0);
  dev.event_begin(1);  // a transfer and host work: drained once
  dev.copy(Ref{h.data(), DType::fp32, 0}, Ref{d, DType::fp32, 0}, 8);
  dev.scale(Ref{h.data(), DType::fp32, 0}, 8, 0.5f);
  dev.event_end(1);
  dev.event_begin(2);
  dev.fill(Ref{h.data(), DType::fp32, 0}, 8, 0.0f);
  dev.event_end(2);
  std::vector<double> sec(3), start(3);
  dev.step_times(sec, start);
  // Drained before each host-timed event's first host work and at its end (the device
  // work queued after it belongs to it); the device-only event not at all.
  CHECK(remote.drains == 4);
  CHECK(sec[0] == -1.0);  // the device's own time
  CHECK(sec[1] >= 0.0);   // host clock
  CHECK(sec[2] >= 0.0);
  CHECK(h[0] == 0.0f);
  dev.release(d);
}

TEST_CASE("run batches: runs taken together give the result of running them one by one, in any order") {
  // Random copies, additions, zero-fills and sums of squares over three small fp32 buffers,
  // overlapping freely. The reference runs them in call order; the batched run holds them in a
  // RunBatch (running what it holds, in reverse order, whenever the next one does not fit)
  // and must end equal, bit for bit: integer values keep every sum exact.
  using zp::exec::RunBatch;
  std::mt19937 rng(5);
  int total_merged = 0, two_source_sums = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::array<std::vector<float>, 3> ref, bat;
    for (auto& b : ref) {
      b.resize(64);
      for (float& v : b) v = static_cast<float>(static_cast<int>(rng() % 9) - 4);
    }
    bat = ref;
    double ref_norm = 0.0, bat_norm = 0.0;
    // A run reads its sources whole first; a merged copy (src2 >= 0) writes their sum.
    auto apply = [](std::array<std::vector<float>, 3>& bufs, double& norm, const RunBatch::Run& r, int dst, int src,
                    std::int64_t doff, std::int64_t soff, int src2 = -1, std::int64_t soff2 = 0) {
      float* d = dst >= 0 ? bufs[static_cast<std::size_t>(dst)].data() + doff : nullptr;
      const float* s = src >= 0 ? bufs[static_cast<std::size_t>(src)].data() + soff : nullptr;
      std::vector<float> tmp(s ? s : d, (s ? s : d) + r.n);
      if (src2 >= 0)
        for (std::int64_t i = 0; i < r.n; ++i)
          tmp[static_cast<std::size_t>(i)] += bufs[static_cast<std::size_t>(src2)][static_cast<std::size_t>(soff2 + i)];
      for (std::int64_t i = 0; i < r.n; ++i) {
        switch (r.kind) {
          case RunBatch::Kind::copy: d[i] = tmp[static_cast<std::size_t>(i)]; break;
          case RunBatch::Kind::add: d[i] += tmp[static_cast<std::size_t>(i)]; break;
          case RunBatch::Kind::zero: d[i] = 0.0f; break;
          case RunBatch::Kind::sumsq: norm += static_cast<double>(tmp[static_cast<std::size_t>(i)]) * tmp[static_cast<std::size_t>(i)]; break;
        }
      }
    };
    struct Call {
      RunBatch::Run run;
      int dst, src;
      std::int64_t doff, soff;
      int src2 = -1;
      std::int64_t soff2 = 0;
    };
    RunBatch batch;
    std::vector<Call> held;
    int flushes = 0, merged = 0;
    auto run_held = [&] {
      // Groups and runs backwards: no order among them may matter.
      const auto groups = batch.take();
      std::size_t runs = 0;
      for (const auto& g : groups) runs += g.runs.size();
      CHECK(runs == held.size());
      for (auto it = held.rbegin(); it != held.rend(); ++it)
        apply(bat, bat_norm, it->run, it->dst, it->src, it->doff, it->soff, it->src2, it->soff2);
      held.clear();
      ++flushes;
    };
    const int calls = 60;
    for (int c = 0; c < calls; ++c) {
      // Half the time after a copy, an addition into the same place (a flatten of two
      // partitions): it merges into the copy when its source does not overlap what is written.
      const bool follow = !held.empty() && held.back().run.kind == RunBatch::Kind::copy && held.back().src2 < 0 &&
                          rng() % 2 == 0;
      const auto kind = follow ? RunBatch::Kind::add : static_cast<RunBatch::Kind>(rng() % 4);
      const std::int64_t n = follow ? held.back().run.n : 1 + static_cast<std::int64_t>(rng() % 12);
      const int dst = follow ? held.back().dst : kind == RunBatch::Kind::sumsq ? -1 : static_cast<int>(rng() % 3);
      const int src = kind == RunBatch::Kind::zero ? -1 : static_cast<int>(rng() % 3);
      const std::int64_t doff =
          follow ? held.back().doff : static_cast<std::int64_t>(rng() % static_cast<unsigned>(64 - n));
      std::int64_t soff = static_cast<std::int64_t>(rng() % static_cast<unsigned>(64 - n));
      if (dst >= 0 && dst == src && std::abs(doff - soff) < n) soff = doff;  // a run is in place or disjoint
      RunBatch::Run r{kind, {}, {}, n};
      if (dst >= 0) r.dst = Ref{bat[static_cast<std::size_t>(dst)].data(), DType::fp32, doff};
      if (src >= 0) r.src = Ref{bat[static_cast<std::size_t>(src)].data(), DType::fp32, soff};
      // Half the sums of squares read a second source (a norm over two partitions).
      int src2 = -1;
      std::int64_t soff2 = 0;
      if (kind == RunBatch::Kind::sumsq && rng() % 2 == 0) {
        src2 = static_cast<int>(rng() % 3);
        soff2 = static_cast<std::int64_t>(rng() % static_cast<unsigned>(64 - n));
        r.src2 = Ref{bat[static_cast<std::size_t>(src2)].data(), DType::fp32, soff2};
        ++two_source_sums;
      }
      apply(ref, ref_norm, r, dst, src, doff, soff, src2, soff2);
      if (!batch.fits(r)) run_held();
      if (batch.merges(r)) {
        held.back().src2 = src;
        held.back().soff2 = soff;
        ++merged;
      } else {
        held.push_back({r, dst, src, doff, soff, src2, soff2});
      }
      batch.push(r);
    }
    run_held();
    CHECK(bat == ref);
    CHECK(bat_norm == ref_norm);
    CHECK(flushes < calls);
    total_merged += merged;
  }
  CHECK(total_merged > 20);     // the merges were exercised
  CHECK(two_source_sums > 20);  // and the two-source sums
  // Groups: one per kind and dtype pair, runs in call order.
  RunBatch b;
  std::vector<float> x(8), y(8);
  std::vector<std::uint16_t> h(8);
  b.push({RunBatch::Kind::copy, Ref{y.data(), DType::fp32, 0}, Ref{x.data(), DType::fp32, 0}, 2});
  b.push({RunBatch::Kind::copy, Ref{h.data(), DType::bf16, 0}, Ref{x.data(), DType::fp32, 2}, 2});
  b.push({RunBatch::Kind::copy, Ref{y.data(), DType::fp32, 4}, Ref{x.data(), DType::fp32, 4}, 2});
  CHECK_FALSE(b.fits({RunBatch::Kind::add, Ref{x.data(), DType::fp32, 1}, Ref{x.data(), DType::fp32, 6}, 1}));  // writes what is read
  CHECK_FALSE(b.fits({RunBatch::Kind::sumsq, {}, Ref{y.data(), DType::fp32, 5}, 1}));  // reads what is written
  CHECK(b.fits({RunBatch::Kind::sumsq, {}, Ref{x.data(), DType::fp32, 0}, 8}));  // reads what is read
  CHECK(b.fits({RunBatch::Kind::zero, Ref{y.data(), DType::fp32, 2}, {}, 2}));
  const auto groups = b.take();
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].runs.size() == 2);
  CHECK(groups[0].runs[1].dst.off == 4);
  CHECK(groups[1].dst_dt == DType::bf16);
  CHECK(b.empty());

  // Two sources: an addition right after a copy into the same place merges into it where the
  // copy is exact (the destination in the source's dtype, or fp32); not into a narrowing copy,
  // nor into another length or place, nor where its source is what the copy writes. A norm of
  // two parts is one run with its own group.
  std::vector<float> p(8), q(8), f(8);
  std::vector<std::uint16_t> hb(8), pb(8), qb(8);
  const Ref P{p.data(), DType::fp32, 0}, Q{q.data(), DType::fp32, 0}, F{f.data(), DType::fp32, 0};
  b.push({RunBatch::Kind::copy, F, P, 8});
  CHECK_FALSE(b.merges({RunBatch::Kind::add, F, Q, 7}));                // another length
  CHECK_FALSE(b.merges({RunBatch::Kind::add, F.at(1), Q.at(1), 7}));    // another place
  CHECK_FALSE(b.merges({RunBatch::Kind::copy, F, Q, 8}));               // not an addition
  CHECK_FALSE(b.fits({RunBatch::Kind::add, F, F, 8}));                  // its source is the copy's output
  const RunBatch::Run add{RunBatch::Kind::add, F, Q, 8};
  REQUIRE(b.merges(add));
  REQUIRE(b.fits(add));
  b.push(add);
  CHECK_FALSE(b.merges({RunBatch::Kind::add, F, Q, 8}));  // once: the copy has two sources now
  CHECK_FALSE(b.fits({RunBatch::Kind::copy, Q, P, 8}));    // Q is read by the merged copy
  b.push({RunBatch::Kind::sumsq, {}, P, 8, Q});
  b.push({RunBatch::Kind::sumsq, {}, P, 8});
  // A bf16 copy of bf16 sources is exact, so it merges; a bf16 copy of fp32 ones rounds.
  b.push({RunBatch::Kind::copy, Ref{hb.data(), DType::bf16, 0}, Ref{pb.data(), DType::bf16, 0}, 8});
  CHECK(b.merges({RunBatch::Kind::add, Ref{hb.data(), DType::bf16, 0}, Ref{qb.data(), DType::bf16, 0}, 8}));
  CHECK_FALSE(b.merges({RunBatch::Kind::add, Ref{hb.data(), DType::bf16, 0}, Q, 8}));  // another source dtype
  const auto two = b.take();
  REQUIRE(two.size() == 4);
  CHECK((two[0].kind == RunBatch::Kind::copy && two[0].two && two[0].runs.size() == 1));
  CHECK(two[0].runs[0].src2.base == q.data());
  CHECK((two[1].kind == RunBatch::Kind::sumsq && two[1].two));
  CHECK((two[2].kind == RunBatch::Kind::sumsq && !two[2].two));
  CHECK((two[3].kind == RunBatch::Kind::copy && !two[3].two && two[3].dst_dt == DType::bf16));
  std::vector<float> r(8);
  const Ref R{r.data(), DType::fp32, 0};
  b.push({RunBatch::Kind::copy, Ref{hb.data(), DType::bf16, 0}, P, 8});
  CHECK_FALSE(b.merges({RunBatch::Kind::add, Ref{hb.data(), DType::bf16, 0}, Q, 8}));  // the copy rounds
  CHECK_THROWS_AS(b.push({RunBatch::Kind::sumsq, {}, R, 8, Ref{qb.data(), DType::bf16, 0}}), std::logic_error);
  b.take();
}
