// The data-movement contract of exec/device.hpp, on the CPU device: elementwise in fp32 with
// one rounding per stored element, so a copy between equal dtypes is exact, a 16-bit
// accumulation rounds the fp32 sum once, and norms add the parts before squaring. The CUDA
// device implements the same calls (exec/device_cuda.cpp); tests/gpu/test_exec_cuda.cpp
// checks it through whole training runs against this device.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <doctest/doctest.h>

#include "exec/device_cpu.hpp"
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
