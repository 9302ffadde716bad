// The CUDA kernels against their kernels/cpu twins, on seeded random inputs (never zeros)
// in fp32, bf16 and fp16: the CPU twin runs on exactly the values the GPU holds (the inputs
// rounded to the storage dtype), outputs are poisoned before each run (NaN in every dtype,
// so an unwritten element fails), and each output is checked element by element (atol +
// |ref|·rtol) and by its relative L2 error against METHOD.md's band. Bit-exact where the
// operations are the same (casts, copies, dropout masks, the shared generator, fp32
// optimizer steps, fp32 embedding gradients); reductions are run twice for the same bits.
// Sizes include ragged ones (tails of the 16-byte paths) and misaligned pointers (the
// scalar paths).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "kernels/common/gelu_epilogue.hpp"
#include "kernels/common/gemm_pieces.hpp"
#include "kernels/common/norm_dims.hpp"
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/bmm.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/layout.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/cpu/rng.hpp"
#include "kernels/cpu/sdpa.hpp"
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/bmm.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/layout.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/loss.cuh"
#include "kernels/cuda/multi.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/optimizer.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rng.cuh"
#include "kernels/common/sdpa_dims.hpp"
#include "kernels/cuda/sdpa.cuh"
#include "kernels/cuda/sdpa_cudnn.cuh"

namespace kg = zp::kernels::cuda;
using zp::DType;
using namespace zp::gpu_test;

namespace {

constexpr DType kDtypes[] = {DType::fp32, DType::bf16, DType::fp16};
constexpr cudaStream_t kStream = nullptr;

// Rounds a CPU reference that the GPU stores in dt (for exact comparisons).
Vec stored(const Vec& v, DType dt) { return rounded(v, dt); }

// Whether the fused residual LayerNorm's backward needs its scratch for rows of C (every
// buffer aligned; kernels/common/norm_dims.hpp).
bool kernels_needs_scratch(std::int64_t C, DType dt) { return !zp::kernels::layernorm_backward_warp_takes(C, zp::dtype_size(dt)); }

// `rows` rows of `width` elements from packed to rows `ld` apart, the padding NaN (a kernel
// that reads it shows), and back; `padding_kept` checks that nothing wrote the padding.
Vec pad_rows(const Vec& packed, std::int64_t rows, std::int64_t width, std::int64_t ld) {
  Vec out(sz(rows * ld), std::numeric_limits<float>::quiet_NaN());
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy_n(packed.begin() + r * width, width, out.begin() + r * ld);
  return out;
}
Vec unpad_rows(const Vec& pitched, std::int64_t rows, std::int64_t width, std::int64_t ld) {
  Vec out(sz(rows * width));
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy_n(pitched.begin() + r * ld, width, out.begin() + r * width);
  return out;
}
bool padding_kept(const Vec& pitched, std::int64_t rows, std::int64_t width, std::int64_t ld) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = width; j < ld; ++j)
      if (!std::isnan(pitched[sz(r * ld + j)])) return false;
  return true;
}

}  // namespace

// ------------------------------------------------------------------------------------
// casts
// ------------------------------------------------------------------------------------
TEST_CASE("convert: every pair of fp32, bf16, fp16 equals the CPU conversions bit for bit") {
  const std::int64_t n = 4099;
  Vec x = rand_vec(n, 11, DType::fp32, -3.0f, 3.0f);
  // Special values: overflow for fp16, subnormals of both 16-bit formats, ties, inf, NaN.
  const float specials[] = {70000.0f, -65520.0f, 65519.0f, 1e-6f, -3e-8f, 1e-40f, 1.00390625f, 1.01171875f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 3.3895314e38f};
  for (std::size_t i = 0; i < std::size(specials); ++i) x[i * 7] = specials[i];
  for (DType from : kDtypes)
    for (DType to : kDtypes)
      for (std::size_t offset : {std::size_t{0}, std::size_t{4}}) {
        CAPTURE(dtype_str(from));
        CAPTURE(dtype_str(to));
        CAPTURE(offset);
        const Vec in = rounded(x, from);
        auto d_in = device(in, from, offset);
        auto d_out = output(sz(n), to, offset);
        kg::convert(d_out->get(), to, d_in->get(), from, n, kStream);
        const Vec got = download(*d_out, sz(n), to);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < sz(n); ++i) {
          const float ref = round_value(in[i], to);
          const bool same = std::isnan(ref) ? std::isnan(got[i])
                                            : std::memcmp(&got[i], &ref, sizeof(float)) == 0;
          if (!same && bad++ < 8) std::printf("  convert: element %zu: got %.9g, expected %.9g\n", i, got[i], ref);
        }
        CHECK(bad == 0);
        // y += x rounded to y's dtype, in one pass: convert into a temporary, then
        // copy_accumulate, bit for bit.
        const Vec init = rounded(rand_vec(n, 12, DType::fp32, -3.0f, 3.0f), to);
        auto d_acc = device(init, to, offset), d_ref = device(init, to, offset);
        kg::convert_accumulate(d_acc->get(), to, d_in->get(), from, n, kStream);
        kg::copy_accumulate(d_ref->get(), d_out->get(), n, true, to, kStream);
        expect_equal_bits("convert_accumulate", bits(*d_acc), bits(*d_ref));
        // y += x with the sum in fp32 and one rounding (Device::add between dtypes): the same
        // bits as both converted to fp32, added, and converted back.
        auto d_mix = device(init, to, offset);
        kg::add_mixed(d_mix->get(), to, d_in->get(), from, n, kStream);
        auto d_y32 = device(init, DType::fp32, offset), d_x32 = device(in, DType::fp32, offset);
        kg::copy_accumulate(d_y32->get(), d_x32->get(), n, true, DType::fp32, kStream);
        auto d_back = output(sz(n), to, offset);
        kg::convert(d_back->get(), to, d_y32->get(), DType::fp32, n, kStream);
        expect_equal_bits("add_mixed", bits(*d_mix), bits(*d_back));
      }
}

// ------------------------------------------------------------------------------------
// elementwise
// ------------------------------------------------------------------------------------
TEST_CASE("elementwise: add, mul, scale, add_scalar, pow2, pow3, copy_accumulate, forward and backward") {
  for (DType dt : kDtypes)
    for (std::int64_t n : {std::int64_t{4096}, std::int64_t{1001}})
      for (std::size_t offset : {std::size_t{0}, std::size_t{4}}) {
        CAPTURE(dtype_str(dt));
        CAPTURE(n);
        CAPTURE(offset);
        const Tol t = tol(dt, 1.0, 1e-7);
        const Vec a = rand_vec(n, 1, dt), b = rand_vec(n, 2, dt), dy = rand_vec(n, 3, dt), init = rand_vec(n, 4, dt);
        auto da = device(a, dt, offset), db = device(b, dt, offset), ddy = device(dy, dt, offset);
        Vec ref(sz(n));
        auto run_fwd = [&](const std::string& what, auto gpu, auto cpu) {
          auto y = output(sz(n), dt, offset);
          gpu(y->get());
          cpu(ref.data());
          expect_close(what, download(*y, sz(n), dt), ref, t);
        };
        run_fwd("add_forward", [&](void* y) { kg::add_forward(y, da->get(), db->get(), n, dt, kStream); },
                [&](float* r) { kc::add_forward(r, a.data(), b.data(), n); });
        run_fwd("mul_forward", [&](void* y) { kg::mul_forward(y, da->get(), db->get(), n, dt, kStream); },
                [&](float* r) { kc::mul_forward(r, a.data(), b.data(), n); });
        run_fwd("scale_forward", [&](void* y) { kg::scale_forward(y, da->get(), n, 0.37f, dt, kStream); },
                [&](float* r) { kc::scale_forward(r, a.data(), n, 0.37f); });
        run_fwd("add_scalar_forward", [&](void* y) { kg::add_scalar_forward(y, da->get(), n, 1.25f, dt, kStream); },
                [&](float* r) { kc::add_scalar_forward(r, a.data(), n, 1.25f); });
        run_fwd("pow2_forward", [&](void* y) { kg::pow2_forward(y, da->get(), n, dt, kStream); },
                [&](float* r) { kc::pow2_forward(r, a.data(), n); });
        run_fwd("pow3_forward", [&](void* y) { kg::pow3_forward(y, da->get(), n, dt, kStream); },
                [&](float* r) { kc::pow3_forward(r, a.data(), n); });

        // Backward passes, written (poisoned output) and accumulated (into init).
        for (bool acc : {false, true}) {
          CAPTURE(acc);
          auto run_bwd = [&](const std::string& what, auto gpu, auto cpu) {
            auto dx = acc ? device(init, dt, offset) : output(sz(n), dt, offset);
            Vec r = acc ? init : Vec(sz(n), 0.0f);
            gpu(dx->get());
            cpu(r.data());
            expect_close(what, download(*dx, sz(n), dt), r, t);
          };
          run_bwd("copy_accumulate", [&](void* d) { kg::copy_accumulate(d, ddy->get(), n, acc, dt, kStream); },
                  [&](float* r) { kc::copy_accumulate(r, dy.data(), n, acc); });
          run_bwd("add_backward (a)", [&](void* d) { kg::add_backward(d, nullptr, ddy->get(), n, acc, dt, kStream); },
                  [&](float* r) { kc::add_backward(r, nullptr, dy.data(), n, acc); });
          run_bwd("mul_backward (a)",
                  [&](void* d) { kg::mul_backward(d, nullptr, ddy->get(), da->get(), db->get(), n, acc, dt, kStream); },
                  [&](float* r) { kc::mul_backward(r, nullptr, dy.data(), a.data(), b.data(), n, acc); });
          run_bwd("mul_backward (b)",
                  [&](void* d) { kg::mul_backward(nullptr, d, ddy->get(), da->get(), db->get(), n, acc, dt, kStream); },
                  [&](float* r) { kc::mul_backward(nullptr, r, dy.data(), a.data(), b.data(), n, acc); });
          run_bwd("scale_backward", [&](void* d) { kg::scale_backward(d, ddy->get(), n, -1.5f, acc, dt, kStream); },
                  [&](float* r) { kc::scale_backward(r, dy.data(), n, -1.5f, acc); });
          run_bwd("add_scalar_backward", [&](void* d) { kg::add_scalar_backward(d, ddy->get(), n, acc, dt, kStream); },
                  [&](float* r) { kc::add_scalar_backward(r, dy.data(), n, acc); });
          run_bwd("pow2_backward",
                  [&](void* d) { kg::pow2_backward(d, da->get(), ddy->get(), n, acc, dt, kStream); },
                  [&](float* r) { kc::pow2_backward(r, a.data(), dy.data(), n, acc); });
          run_bwd("pow3_backward",
                  [&](void* d) { kg::pow3_backward(d, da->get(), ddy->get(), n, acc, dt, kStream); },
                  [&](float* r) { kc::pow3_backward(r, a.data(), dy.data(), n, acc); });
        }
      }
}

TEST_CASE("elementwise: broadcast add over position embeddings and attention masks, and its reducing backward") {
  struct Shape {
    kg::Dims4 dims, b_dims;
  };
  const Shape shapes[] = {{{1, 4, 33, 24}, {1, 1, 33, 24}},   // (1, T, C) over (B, T, C)
                          {{3, 2, 17, 17}, {3, 1, 1, 17}},    // (B, 1, 1, T) over (B, H, T, T)
                          {{2, 3, 16, 16}, {1, 1, 16, 16}}};  // (1, 1, T, T) over (B, H, T, T)
  for (DType dt : kDtypes)
    for (const Shape& s : shapes) {
      CAPTURE(dtype_str(dt));
      CAPTURE(s.dims[1]);
      const std::int64_t n = s.dims[0] * s.dims[1] * s.dims[2] * s.dims[3];
      const std::int64_t nb = s.b_dims[0] * s.b_dims[1] * s.b_dims[2] * s.b_dims[3];
      const std::int64_t fan_in = n / nb;
      const Vec a = rand_vec(n, 5, dt), b = rand_vec(nb, 6, dt), dy = rand_vec(n, 7, dt), init = rand_vec(nb, 8, dt);
      const Vec init_a = rand_vec(n, 9, dt);
      auto da = device(a, dt), db = device(b, dt), ddy = device(dy, dt);
      auto y = output(sz(n), dt);
      kg::add_broadcast_forward(y->get(), da->get(), db->get(), s.dims, s.b_dims, dt, kStream);
      Vec ref(sz(n));
      kc::add_broadcast_forward(ref.data(), a.data(), b.data(), s.dims, s.b_dims);
      expect_close("add_broadcast_forward", download(*y, sz(n), dt), ref, tol(dt, 1.0, 1e-7));
      for (bool acc : {false, true}) {
        // Both gradients accumulate into initial values (never into the poison).
        auto gb = acc ? device(init, dt) : output(sz(nb), dt);
        auto ga = acc ? device(init_a, dt) : output(sz(n), dt);
        kg::add_broadcast_backward(ga->get(), gb->get(), ddy->get(), s.dims, s.b_dims, acc, dt, kStream);
        Vec rb = acc ? init : Vec(sz(nb)), ra = acc ? init_a : Vec(sz(n));
        kc::add_broadcast_backward(ra.data(), rb.data(), dy.data(), s.dims, s.b_dims, acc);
        expect_close("add_broadcast_backward (a)", download(*ga, sz(n), dt), ra, tol(dt, 1.0, 1e-7));
        // fp32 sums of fan_in terms in y's order against the CPU's double sums.
        expect_close("add_broadcast_backward (b)", download(*gb, sz(nb), dt), rb,
                     tol(dt, 2.0, 1e-6 * static_cast<double>(fan_in)));
      }
    }
}

// ------------------------------------------------------------------------------------
// activations
// ------------------------------------------------------------------------------------
TEST_CASE("activations: gelu, gelu_tanh, silu, relu, tanh and the fused silu·gate, forward and backward") {
  using Fwd = void (*)(void*, const void*, std::int64_t, DType, cudaStream_t);
  using Bwd = void (*)(void*, const void*, const void*, std::int64_t, bool, DType, cudaStream_t);
  using CFwd = void (*)(float*, const float*, std::int64_t);
  using CBwd = void (*)(float*, const float*, const float*, std::int64_t, bool);
  struct Act {
    const char* name;
    Fwd fwd;
    Bwd bwd;
    CFwd cfwd;
    CBwd cbwd;
    bool from_output;  // backward takes y (relu, tanh)
  };
  const Act acts[] = {{"gelu", kg::gelu_forward, kg::gelu_backward, kc::gelu_forward, kc::gelu_backward, false},
                      {"gelu_tanh", kg::gelu_tanh_forward, kg::gelu_tanh_backward, kc::gelu_tanh_forward,
                       kc::gelu_tanh_backward, false},
                      {"silu", kg::silu_forward, kg::silu_backward, kc::silu_forward, kc::silu_backward, false},
                      {"relu", kg::relu_forward, kg::relu_backward, kc::relu_forward, kc::relu_backward, true},
                      {"tanh", kg::tanh_forward, kg::tanh_backward, kc::tanh_forward, kc::tanh_backward, true}};
  const std::int64_t n = 3077;
  for (DType dt : kDtypes)
    for (const Act& act : acts) {
      CAPTURE(dtype_str(dt));
      CAPTURE(act.name);
      const Vec x = rand_vec(n, 21, dt, -4.0f, 4.0f), dy = rand_vec(n, 22, dt), init = rand_vec(n, 23, dt);
      auto dx_in = device(x, dt), ddy = device(dy, dt);
      auto y = output(sz(n), dt);
      act.fwd(y->get(), dx_in->get(), n, dt, kStream);
      Vec ry(sz(n));
      act.cfwd(ry.data(), x.data(), n);
      const Vec gy = download(*y, sz(n), dt);
      expect_close(std::string(act.name) + "_forward", gy, ry, tol_math(dt, 1e-6));
      // The saved output the backward reads is the GPU's (stored) one, as in training.
      const Vec saved = act.from_output ? gy : x;
      auto dsaved = device(saved, dt);
      for (bool acc : {false, true}) {
        auto dx = acc ? device(init, dt) : output(sz(n), dt);
        act.bwd(dx->get(), dsaved->get(), ddy->get(), n, acc, dt, kStream);
        Vec r = acc ? init : Vec(sz(n));
        act.cbwd(r.data(), saved.data(), dy.data(), n, acc);
        expect_close(std::string(act.name) + "_backward", download(*dx, sz(n), dt), r, tol_math(dt, 1e-6));
      }
    }
  // silu(gate) * up, one rounding, against the CPU's silu then mul in fp32.
  for (DType dt : kDtypes) {
    CAPTURE(dtype_str(dt));
    const Vec gate = rand_vec(n, 31, dt, -4.0f, 4.0f), up = rand_vec(n, 32, dt), dy = rand_vec(n, 33, dt);
    auto dg = device(gate, dt), du = device(up, dt), ddy = device(dy, dt);
    auto y = output(sz(n), dt);
    kg::silu_mul_forward(y->get(), dg->get(), du->get(), n, dt, kStream);
    Vec s(sz(n)), ry(sz(n));
    kc::silu_forward(s.data(), gate.data(), n);
    kc::mul_forward(ry.data(), s.data(), up.data(), n);
    expect_close("silu_mul_forward", download(*y, sz(n), dt), ry, tol_math(dt, 1e-6));
    auto dgate = output(sz(n), dt), dup = output(sz(n), dt);
    kg::silu_mul_backward(dgate->get(), dup->get(), ddy->get(), dg->get(), du->get(), n, false, dt, kStream);
    Vec ds(sz(n)), rg(sz(n)), ru(sz(n));
    kc::mul_backward(ds.data(), ru.data(), dy.data(), s.data(), up.data(), n, false);
    kc::silu_backward(rg.data(), gate.data(), ds.data(), n, false);
    expect_close("silu_mul_backward (gate)", download(*dgate, sz(n), dt), rg, tol_math(dt, 1e-6));
    expect_close("silu_mul_backward (up)", download(*dup, sz(n), dt), ru, tol_math(dt, 1e-6));
  }
}

// ------------------------------------------------------------------------------------
// layout
// ------------------------------------------------------------------------------------
TEST_CASE("layout: split/merge heads (fused qkv columns), repeat_kv, select_token, forward and backward") {
  for (DType dt : kDtypes)
    for (std::int64_t D : {std::int64_t{16}, std::int64_t{12}}) {  // 12: not a whole 16-byte pack
      CAPTURE(dtype_str(dt));
      CAPTURE(D);
      const std::int64_t B = 2, T = 9, H = 3, W = 3 * H * D;
      const Tol exact{0.0, 0.0, 0.0};
      const Tol acc_tol = tol(dt, 1.0, 0.0);
      const Vec x = rand_vec(B * T * W, 41, dt), dy = rand_vec(B * H * T * D, 42, dt), init = rand_vec(B * T * W, 43, dt);
      auto dxin = device(x, dt), ddy = device(dy, dt);
      for (std::int64_t offset : {std::int64_t{0}, H * D, 2 * H * D}) {
        auto y = output(sz(B * H * T * D), dt);
        kg::split_heads_forward(y->get(), dxin->get(), B, T, H, D, W, offset, dt, kStream);
        Vec r(sz(B * H * T * D));
        kc::split_heads_forward(r.data(), x.data(), B, T, H, D, W, offset);
        expect_close("split_heads_forward", download(*y, r.size(), dt), r, exact);
        for (bool acc : {false, true}) {  // written or added into: its columns only, the others kept
          auto dx = device(init, dt);
          kg::split_heads_backward(dx->get(), ddy->get(), B, T, H, D, W, offset, acc, dt, kStream);
          Vec rd = init;
          kc::split_heads_backward(rd.data(), dy.data(), B, T, H, D, W, offset, acc);
          expect_close("split_heads_backward", download(*dx, rd.size(), dt), acc ? stored(rd, dt) : rd, acc_tol);
        }
      }
      {
        auto y = output(sz(B * T * H * D), dt);
        kg::merge_heads_forward(y->get(), ddy->get(), B, T, H, D, dt, kStream);
        Vec r(sz(B * T * H * D));
        kc::merge_heads_forward(r.data(), dy.data(), B, T, H, D);
        expect_close("merge_heads_forward", download(*y, r.size(), dt), r, exact);
        const Vec g = rand_vec(B * T * H * D, 44, dt), ginit = rand_vec(B * H * T * D, 45, dt);
        auto dg = device(g, dt);
        for (bool acc : {false, true}) {
          auto dx = acc ? device(ginit, dt) : output(sz(B * H * T * D), dt);
          kg::merge_heads_backward(dx->get(), dg->get(), B, T, H, D, acc, dt, kStream);
          Vec rd = acc ? ginit : Vec(sz(B * H * T * D));
          kc::merge_heads_backward(rd.data(), g.data(), B, T, H, D, acc);
          expect_close("merge_heads_backward", download(*dx, rd.size(), dt), stored(rd, dt), exact);
        }
      }
      {
        const std::int64_t KV = 2, rep = 3;
        const Vec kv = rand_vec(B * KV * T * D, 46, dt), g = rand_vec(B * KV * rep * T * D, 47, dt);
        const Vec kinit = rand_vec(B * KV * T * D, 48, dt);
        auto dkv = device(kv, dt), dg = device(g, dt);
        auto y = output(sz(B * KV * rep * T * D), dt);
        kg::repeat_kv_forward(y->get(), dkv->get(), B, KV, rep, T, D, dt, kStream);
        Vec r(sz(B * KV * rep * T * D));
        kc::repeat_kv_forward(r.data(), kv.data(), B, KV, rep, T, D);
        expect_close("repeat_kv_forward", download(*y, r.size(), dt), r, exact);
        for (bool acc : {false, true}) {
          auto dx = acc ? device(kinit, dt) : output(sz(B * KV * T * D), dt);
          kg::repeat_kv_backward(dx->get(), dg->get(), B, KV, rep, T, D, acc, dt, kStream);
          Vec rd = acc ? kinit : Vec(sz(B * KV * T * D));
          kc::repeat_kv_backward(rd.data(), g.data(), B, KV, rep, T, D, acc);
          expect_close("repeat_kv_backward", download(*dx, rd.size(), dt), stored(rd, dt), exact);
        }
      }
      {
        const std::int64_t C = 4 * D, tok = 2;
        const Vec h = rand_vec(B * T * C, 49, dt), g = rand_vec(B * C, 50, dt), hinit = rand_vec(B * T * C, 51, dt);
        auto dh = device(h, dt), dg = device(g, dt);
        auto y = output(sz(B * C), dt);
        kg::select_token_forward(y->get(), dh->get(), B, T, C, tok, dt, kStream);
        Vec r(sz(B * C));
        kc::select_token_forward(r.data(), h.data(), B, T, C, tok);
        expect_close("select_token_forward", download(*y, r.size(), dt), r, exact);
        for (bool acc : {false, true}) {
          auto dx = acc ? device(hinit, dt) : output(sz(B * T * C), dt);
          kg::select_token_backward(dx->get(), dg->get(), B, T, C, tok, acc, dt, kStream);
          Vec rd = acc ? hinit : Vec(sz(B * T * C));
          kc::select_token_backward(rd.data(), g.data(), B, T, C, tok, acc);
          expect_close("select_token_backward", download(*dx, rd.size(), dt), stored(rd, dt), exact);
        }
      }
    }
}

// ------------------------------------------------------------------------------------
// dropout and the shared generator
// ------------------------------------------------------------------------------------
TEST_CASE("dropout: the same mask as the CPU for every (seed, offset), kept values scaled exactly") {
  // Offsets a multiple of 4 with aligned buffers take the 16-byte path (8 elements and two
  // Philox blocks per thread); other offsets, buffers 2 elements off alignment (misaligned 1)
  // or a mask 4 bytes off (misaligned 2), the element path. n leaves a tail of 7 on the
  // 16-byte path; the last offset's blocks carry into the counter's high word.
  const std::int64_t n = 10007;
  for (DType dt : kDtypes)
    for (float p : {0.0f, 0.1f, 0.5f, 1.0f})
      for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{3}, std::uint64_t{17} << 32,
                                   (std::uint64_t{17} << 32) + 5, (std::uint64_t{1} << 34) - 16})
        for (int misaligned : {0, 1, 2}) {
          CAPTURE(dtype_str(dt));
          CAPTURE(p);
          CAPTURE(offset);
          CAPTURE(misaligned);
          const std::size_t off = misaligned == 1 ? 2 * sz(dtype_size(dt)) : 0;
          const std::uint64_t seed = 0x9E3779B97F4A7C15ull ^ 1234u;
          const Vec x = rand_vec(n, 61, dt), dy = rand_vec(n, 62, dt), init = rand_vec(n, 63, dt);
          auto dxin = device(x, dt, off), ddy = device(dy, dt, off);
          auto y = output(sz(n), dt, off);
          Dev mask(sz(n), misaligned == 1 ? 3 : misaligned == 2 ? 4 : 0);
          mask.poison();
          kg::dropout_forward(y->get(), mask.as<std::uint8_t>(), dxin->get(), n, p, seed, offset, dt, kStream);
          Vec ry(sz(n));
          std::vector<std::uint8_t> rmask(sz(n));
          kc::dropout_forward(ry.data(), rmask.data(), x.data(), n, p, seed, offset);
          CHECK(download_raw<std::uint8_t>(mask, sz(n)) == rmask);
          expect_close("dropout_forward", download(*y, sz(n), dt), stored(ry, dt), Tol{});
          auto dx = output(sz(n), dt, off);
          kg::dropout_backward(dx->get(), mask.as<std::uint8_t>(), ddy->get(), n, p, false, dt, kStream);
          Vec rdx(sz(n));
          kc::dropout_backward(rdx.data(), rmask.data(), dy.data(), n, p, false);
          expect_close("dropout_backward", download(*dx, sz(n), dt), stored(rdx, dt), Tol{});
          // Accumulated into initial values: the sum in fp32, rounded once.
          auto acc = device(init, dt, off);
          kg::dropout_backward(acc->get(), mask.as<std::uint8_t>(), ddy->get(), n, p, true, dt, kStream);
          Vec racc = init;
          kc::dropout_backward(racc.data(), rmask.data(), dy.data(), n, p, true);
          expect_close("dropout_backward accumulated", download(*acc, sz(n), dt), stored(racc, dt), Tol{});
          if (p == 0.1f) {
            const auto kept = std::count(rmask.begin(), rmask.end(), std::uint8_t{1});
            CHECK(std::abs(static_cast<double>(kept) / static_cast<double>(n) - 0.9) < 0.02);
          }
        }
}

TEST_CASE("rng: uniform_fill equals the CPU bit for bit, normal_fill to the last fp32 bit or so") {
  const std::int64_t n = 5003;
  for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{7}, std::uint64_t{5} << 36}) {
    CAPTURE(offset);
    auto u = output(sz(n), DType::fp32);
    kg::uniform_fill(u->get(), n, 77, offset, DType::fp32, kStream);
    Vec ru(sz(n));
    kc::uniform_fill(ru.data(), n, 77, offset);
    expect_close("uniform_fill", download(*u, sz(n), DType::fp32), ru, Tol{});
    auto z = output(sz(n), DType::fp32);
    kg::normal_fill(z->get(), n, 78, offset, 0.0f, 0.02f, DType::fp32, kStream);
    Vec rz(sz(n));
    kc::normal_fill(rz.data(), n, 78, offset, 0.0f, 0.02f);
    expect_close("normal_fill", download(*z, sz(n), DType::fp32), rz, Tol{1e-12, 4e-7, 0.0});
    auto zb = output(sz(n), DType::bf16);
    kg::normal_fill(zb->get(), n, 78, offset, 0.0f, 0.02f, DType::bf16, kStream);
    expect_close("normal_fill (bf16)", download(*zb, sz(n), DType::bf16), rz, tol(DType::bf16, 0.5, 1e-12));
  }
}

// ------------------------------------------------------------------------------------
// eager attention pieces
// ------------------------------------------------------------------------------------
TEST_CASE("softmax: rows of 1024 (16-byte path) and 1001 (scalar), a row that is -inf everywhere, masked entries") {
  for (DType dt : kDtypes)
    for (std::int64_t n : {std::int64_t{1024}, std::int64_t{1001}}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(n);
      const std::int64_t rows = 13;
      Vec x = rand_vec(rows * n, 71, dt, -8.0f, 8.0f);
      for (std::int64_t j = 0; j < n; ++j) x[sz(3 * n + j)] = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = n / 2; j < n; ++j) x[sz(5 * n + j)] = kg::mask_value(dt);
      auto dxin = device(x, dt);
      auto y = output(sz(rows * n), dt);
      kg::softmax_forward(y->get(), dxin->get(), rows, n, dt, kStream);
      Vec ry(sz(rows * n));
      kc::softmax_forward(ry.data(), x.data(), rows, n);
      const Vec gy = download(*y, ry.size(), dt);
      expect_close("softmax_forward", gy, ry, tol_math(dt, 1e-9));
      const Vec dy = rand_vec(rows * n, 72, dt), init = rand_vec(rows * n, 73, dt);
      auto dys = device(gy, dt), ddy = device(dy, dt);
      for (bool acc : {false, true}) {
        auto dx = acc ? device(init, dt) : output(sz(rows * n), dt);
        kg::softmax_backward(dx->get(), dys->get(), ddy->get(), rows, n, acc, dt, kStream);
        Vec r = acc ? init : Vec(sz(rows * n));
        kc::softmax_backward(r.data(), gy.data(), dy.data(), rows, n, acc);
        expect_close("softmax_backward", download(*dx, r.size(), dt), r, tol_math(dt, 1e-6));
      }
    }
}

TEST_CASE("masks: causal mask, GPT-2's causal where, BERT's padding mask, with the dtype's lowest value") {
  for (DType dt : kDtypes) {
    CAPTURE(dtype_str(dt));
    const float masked = kg::mask_value(dt);
    CHECK(round_value(masked, dt) == masked);  // representable, finite
    CHECK(std::isfinite(masked));
    const std::int64_t T = 37, BH = 3, B = 4;
    auto m = output(sz(T * T), dt);
    kg::causal_mask(m->get(), T, masked, dt, kStream);
    Vec rm(sz(T * T));
    kc::causal_mask(rm.data(), T, masked);
    expect_close("causal_mask", download(*m, rm.size(), dt), rm, Tol{});
    const Vec x = rand_vec(BH * T * T, 81, dt), init = rand_vec(BH * T * T, 82, dt);
    auto dxin = device(x, dt);
    auto y = output(sz(BH * T * T), dt);
    kg::causal_where_forward(y->get(), dxin->get(), BH, T, masked, dt, kStream);
    Vec ry(sz(BH * T * T));
    kc::causal_where_forward(ry.data(), x.data(), BH, T, masked);
    expect_close("causal_where_forward", download(*y, ry.size(), dt), ry, Tol{});
    for (bool acc : {false, true}) {
      auto dx = acc ? device(init, dt) : output(sz(BH * T * T), dt);
      kg::causal_where_backward(dx->get(), dxin->get(), BH, T, acc, dt, kStream);
      Vec r = acc ? init : Vec(sz(BH * T * T));
      kc::causal_where_backward(r.data(), x.data(), BH, T, acc);
      expect_close("causal_where_backward", download(*dx, r.size(), dt), stored(r, dt), Tol{});
    }
    std::vector<std::int64_t> am(sz(B * T));
    for (std::size_t i = 0; i < am.size(); ++i) am[i] = kc::uniform(83, i) < 0.7f ? 1 : 0;
    auto dam = device_raw(am);
    auto pm = output(sz(B * T), dt);
    kg::padding_mask(pm->get(), dam->as<std::int64_t>(), B, T, masked, dt, kStream);
    Vec rp(sz(B * T));
    kc::padding_mask(rp.data(), am.data(), B, T, masked);
    expect_close("padding_mask", download(*pm, rp.size(), dt), rp, Tol{});
  }
}

TEST_CASE("rotary: Llama's tables and the rotation forward and backward") {
  for (DType dt : kDtypes)
    for (std::int64_t D : {std::int64_t{12}, std::int64_t{16}, std::int64_t{64}}) {  // 12: the scalar path
      CAPTURE(dtype_str(dt));
      CAPTURE(D);
      const std::int64_t B = 2, H = 3, T = 50;
      auto c = output(sz(T * D), dt), s = output(sz(T * D), dt);
      kg::rope_tables(c->get(), s->get(), T, D, 10000.0f, dt, kStream);
      Vec rc(sz(T * D)), rs(sz(T * D));
      kc::rope_tables(rc.data(), rs.data(), T, D, 10000.0f);
      // cos(t·inv_freq) at t up to 49: an ulp of powf moves the angle by ~3e-6.
      expect_close("rope_tables (cos)", download(*c, rc.size(), dt), rc, tol_math(dt, 1e-5));
      expect_close("rope_tables (sin)", download(*s, rs.size(), dt), rs, tol_math(dt, 1e-5));
      const Vec cs = rounded(rc, dt), sn = rounded(rs, dt);
      const Vec x = rand_vec(B * H * T * D, 91, dt), init = rand_vec(B * H * T * D, 92, dt);
      auto dc = device(cs, dt), dsn = device(sn, dt), dxin = device(x, dt);
      auto y = output(x.size(), dt);
      kg::rope_forward(y->get(), dxin->get(), dc->get(), dsn->get(), B, H, T, D, dt, kStream);
      Vec ry(x.size());
      kc::rope_forward(ry.data(), x.data(), cs.data(), sn.data(), B, H, T, D);
      expect_close("rope_forward", download(*y, ry.size(), dt), ry, tol(dt, 1.0, 1e-6));
      for (bool acc : {false, true}) {
        auto dx = acc ? device(init, dt) : output(x.size(), dt);
        kg::rope_backward(dx->get(), dxin->get(), dc->get(), dsn->get(), B, H, T, D, acc, dt, kStream);
        Vec r = acc ? init : Vec(x.size());
        kc::rope_backward(r.data(), x.data(), cs.data(), sn.data(), B, H, T, D, acc);
        expect_close("rope_backward", download(*dx, r.size(), dt), r, tol(dt, 1.0, 1e-6));
      }
    }
}

// ------------------------------------------------------------------------------------
// GEMMs (cuBLASLt)
// ------------------------------------------------------------------------------------
TEST_CASE("gemm and bmm: every transposition, accumulate, ragged and aligned shapes, batched strides") {
  kg::Context ctx;
  struct Shape {
    std::int64_t m, n, k;
  };
  for (DType dt : kDtypes)
    for (const Shape& sh : {Shape{37, 45, 70}, Shape{64, 128, 96}})
      for (int tr = 0; tr < 4; ++tr) {
        const bool ta = (tr & 1) != 0, tb = (tr & 2) != 0;
        CAPTURE(dtype_str(dt));
        CAPTURE(sh.m);
        CAPTURE(ta);
        CAPTURE(tb);
        const std::int64_t m = sh.m, n = sh.n, k = sh.k, batch = 3;
        const Vec a = rand_vec(batch * m * k, 101, dt), b = rand_vec(batch * k * n, 102, dt);
        const Vec cinit = rand_vec(batch * m * n, 103, dt);
        const Vec abs_a = abs_of(a), abs_b = abs_of(b);
        auto da = device(a, dt), db = device(b, dt);
        for (bool acc : {false, true}) {
          auto c = acc ? device(cinit, dt) : output(sz(m * n), dt);
          kg::gemm(ctx, c->get(), da->get(), db->get(), m, n, k, ta, tb, acc, dt, kStream);
          Vec r = acc ? Vec(cinit.begin(), cinit.begin() + m * n) : Vec(sz(m * n));
          kc::gemm(r.data(), a.data(), b.data(), m, n, k, ta, tb, acc);
          Vec sr = acc ? abs_of(Vec(cinit.begin(), cinit.begin() + m * n)) : Vec(sz(m * n));
          kc::gemm(sr.data(), abs_a.data(), abs_b.data(), m, n, k, ta, tb, acc);
          expect_dot("gemm", download(*c, sz(m * n), dt), r, sr, k + 1, dt, acc);
        }
        auto c = output(sz(batch * m * n), dt);
        kg::bmm_forward(ctx, c->get(), da->get(), db->get(), batch, m, n, k, ta, tb, dt, kStream);
        Vec rc(sz(batch * m * n)), src(sz(batch * m * n));
        kc::bmm_forward(rc.data(), a.data(), b.data(), batch, m, n, k, ta, tb);
        kc::bmm_forward(src.data(), abs_a.data(), abs_b.data(), batch, m, n, k, ta, tb);
        expect_dot("bmm_forward", download(*c, rc.size(), dt), rc, src, k, dt);
        const Vec dc = rand_vec(batch * m * n, 104, dt);
        const Vec ainit = rand_vec(batch * m * k, 105, dt), binit = rand_vec(batch * k * n, 106, dt);
        auto ddc = device(dc, dt);
        for (bool acc : {false, true}) {
          auto ga = acc ? device(ainit, dt) : output(a.size(), dt);
          auto gb = acc ? device(binit, dt) : output(b.size(), dt);
          kg::bmm_backward(ctx, ga->get(), gb->get(), ddc->get(), da->get(), db->get(), batch, m, n, k, ta, tb, acc,
                           dt, kStream);
          Vec ra = acc ? ainit : Vec(a.size()), rb = acc ? binit : Vec(b.size());
          kc::bmm_backward(ra.data(), rb.data(), dc.data(), a.data(), b.data(), batch, m, n, k, ta, tb, acc);
          Vec sa = acc ? abs_of(ainit) : Vec(a.size()), sb = acc ? abs_of(binit) : Vec(b.size());
          kc::bmm_backward(sa.data(), sb.data(), abs_of(dc).data(), abs_a.data(), abs_b.data(), batch, m, n, k, ta, tb,
                           acc);
          expect_dot("bmm_backward (a)", download(*ga, ra.size(), dt), ra, sa, n + 1, dt, acc);
          expect_dot("bmm_backward (b)", download(*gb, rb.size(), dt), rb, sb, m + 1, dt, acc);
        }
      }
}

TEST_CASE("gemm with rows not 16-byte aligned: staged in pieces through the scratch, the CPU's products") {
  // Every product here is staged (staged_min_work 0) and the scratch holds only a few rows,
  // so each runs in several pieces with a ragged last one. Odd n, k or m make the rows of
  // C or A misaligned in every dtype.
  kg::ContextOptions options;
  options.staged_min_work = 0;
  options.scratch_bytes = std::size_t{64} << 10;
  kg::Context ctx(options);
  struct Case {
    const char* name;
    std::int64_t m, n, k;
    bool ta, tb, staged;
  };
  const Case cases[] = {
      {"C's rows (the LM head's logits)", 1000, 77, 96, false, true, true},
      {"C's rows, A stored (k,m)", 1000, 77, 96, true, true, true},
      {"A's rows (the LM head's dx)", 1000, 96, 45, false, false, true},
      {"A's rows, k in several parts and a remainder", 300, 64, 1001, false, false, true},
      {"C's rows, fewer columns than one aligned group", 200, 5, 96, false, true, true},
      {"A's columns (the LM head's dw)", 301, 96, 200, true, false, true},
      {"B's rows too: runs as it is", 200, 77, 96, false, false, false},
  };
  for (DType dt : kDtypes)
    for (const Case& cs : cases)
      for (bool acc : {false, true}) {
        CAPTURE(dtype_str(dt));
        CAPTURE(cs.name);
        CAPTURE(acc);
        const std::int64_t m = cs.m, n = cs.n, k = cs.k;
        const Vec a = rand_vec(m * k, 121, dt), b = rand_vec(k * n, 122, dt), cinit = rand_vec(m * n, 123, dt);
        auto da = device(a, dt), db = device(b, dt);
        auto c = acc ? device(cinit, dt) : output(sz(m * n), dt);
        const std::uint64_t before = ctx.staged_products();
        kg::gemm(ctx, c->get(), da->get(), db->get(), m, n, k, cs.ta, cs.tb, acc, dt, kStream);
        CHECK(ctx.staged_products() - before == (cs.staged ? 1u : 0u));
        Vec r = acc ? cinit : Vec(sz(m * n)), sr = acc ? abs_of(cinit) : Vec(sz(m * n));
        kc::gemm(r.data(), a.data(), b.data(), m, n, k, cs.ta, cs.tb, acc);
        kc::gemm(sr.data(), abs_of(a).data(), abs_of(b).data(), m, n, k, cs.ta, cs.tb, acc);
        expect_dot("staged gemm", download(*c, r.size(), dt), r, sr, k + 1, dt, acc);
      }
  // The LM head as the executor runs it: linear forward with a bias (16-byte aligned, or
  // copied aligned to the scratch's start first) and its backward, all staged.
  for (DType dt : kDtypes)
    for (std::size_t bias_offset : {std::size_t{0}, std::size_t{4}}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(bias_offset);
      const std::int64_t M = 700, N = 77, K = 64;
      const Vec x = rand_vec(M * K, 124, dt), w = rand_vec(N * K, 125, dt), bias = rand_vec(N, 126, dt);
      auto dxin = device(x, dt), dw = device(w, dt), dbias = device(bias, dt, bias_offset);
      auto y = output(sz(M * N), dt);
      const std::uint64_t before = ctx.staged_products();
      kg::linear_forward(ctx, y->get(), dxin->get(), dw->get(), dbias->get(), M, N, K, dt, kStream);
      Vec ry(sz(M * N)), sy(sz(M * N));
      kc::linear_forward(ry.data(), x.data(), w.data(), bias.data(), M, N, K);
      kc::linear_forward(sy.data(), abs_of(x).data(), abs_of(w).data(), abs_of(bias).data(), M, N, K);
      expect_dot("staged linear forward", download(*y, ry.size(), dt), ry, sy, K + 1, dt);
      const Vec dy = rand_vec(M * N, 127, dt);
      auto ddy = device(dy, dt);
      auto gx = output(x.size(), dt), gw = output(w.size(), dt);
      kg::linear_backward(ctx, gx->get(), gw->get(), nullptr, ddy->get(), dxin->get(), dw->get(), M, N, K, false, dt,
                          kStream);
      CHECK(ctx.staged_products() - before == 3u);
      Vec rx(x.size()), rw(w.size()), sx(x.size()), sw(w.size());
      kc::linear_backward(rx.data(), rw.data(), nullptr, dy.data(), x.data(), w.data(), M, N, K, false);
      kc::linear_backward(sx.data(), sw.data(), nullptr, abs_of(dy).data(), abs_of(x).data(), abs_of(w).data(), M, N,
                          K, false);
      expect_dot("staged linear backward dx", download(*gx, rx.size(), dt), rx, sx, N + 1, dt);
      expect_dot("staged linear backward dw", download(*gw, rw.size(), dt), rw, sw, M + 1, dt);
    }
  // The LM head on logits with padded rows (models::Tensor::row_pitch, --fused-loss): every
  // stride aligned, the odd vocabulary cut in place into an aligned part and a thin rest (n
  // of the forward, k of dx through the fp32 accumulator, m of dW); the padding, NaN, is
  // neither read nor written.
  for (DType dt : kDtypes)
    for (bool with_bias : {false, true}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(with_bias);
      const std::int64_t M = 700, N = 77, K = 64, ld = zp::kernels::padded_rows(N, dtype_size(dt));
      REQUIRE(ld > N);
      const Vec x = rand_vec(M * K, 131, dt), w = rand_vec(N * K, 132, dt), bias = rand_vec(N, 133, dt);
      auto dxin = device(x, dt), dw = device(w, dt), dbias = device(bias, dt);
      auto y = device(pad_rows(Vec(sz(M * N)), M, N, ld), dt);
      const std::uint64_t before = ctx.staged_products();
      kg::linear_forward(ctx, y->get(), dxin->get(), dw->get(), with_bias ? dbias->get() : nullptr, M, N, K, dt,
                         kStream, ld);
      const Vec got = download(*y, sz(M * ld), dt);
      CHECK(padding_kept(got, M, N, ld));
      Vec ry(sz(M * N)), sy(sz(M * N));
      kc::linear_forward(ry.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, M, N, K);
      kc::linear_forward(sy.data(), abs_of(x).data(), abs_of(w).data(), with_bias ? abs_of(bias).data() : nullptr, M,
                         N, K);
      expect_dot("padded-rows linear forward", unpad_rows(got, M, N, ld), ry, sy, K + 1, dt);
      const Vec dy = rand_vec(M * N, 134, dt);
      auto ddy = device(pad_rows(dy, M, N, ld), dt);
      auto gx = output(x.size(), dt), gw = output(w.size(), dt), gb = output(sz(N), dt);
      kg::linear_backward(ctx, gx->get(), gw->get(), with_bias ? gb->get() : nullptr, ddy->get(), dxin->get(),
                          dw->get(), M, N, K, false, dt, kStream, ld);
      CHECK(ctx.staged_products() - before == 3u);
      Vec rx(x.size()), rw(w.size()), rb(sz(N)), sx(x.size()), sw(w.size()), sb(sz(N));
      kc::linear_backward(rx.data(), rw.data(), rb.data(), dy.data(), x.data(), w.data(), M, N, K, false);
      kc::linear_backward(sx.data(), sw.data(), sb.data(), abs_of(dy).data(), abs_of(x).data(), abs_of(w).data(), M, N,
                          K, false);
      expect_dot("padded-rows linear backward dx", download(*gx, rx.size(), dt), rx, sx, N + 1, dt);
      expect_dot("padded-rows linear backward dw", download(*gw, rw.size(), dt), rw, sw, M + 1, dt);
      if (with_bias) expect_dot("padded-rows linear backward db", download(*gb, rb.size(), dt), rb, sb, M + 1, dt);
    }
  // Conv1D (weight stored (K, N)) with an odd K: A's rows misaligned, k in parts summed in the
  // fp32 accumulator, the bias added by the finish in the one rounding.
  for (DType dt : kDtypes) {
    CAPTURE(dtype_str(dt));
    const std::int64_t M = 300, N = 64, K = 1001;
    const Vec x = rand_vec(M * K, 128, dt), w = rand_vec(K * N, 129, dt), bias = rand_vec(N, 130, dt);
    auto dxin = device(x, dt), dw = device(w, dt), dbias = device(bias, dt);
    auto y = output(sz(M * N), dt);
    const std::uint64_t before = ctx.staged_products();
    kg::conv1d_forward(ctx, y->get(), dxin->get(), dw->get(), dbias->get(), M, N, K, dt, kStream);
    CHECK(ctx.staged_products() - before == 1u);
    Vec ry(sz(M * N)), sy(sz(M * N));
    kc::conv1d_forward(ry.data(), x.data(), w.data(), bias.data(), M, N, K);
    kc::conv1d_forward(sy.data(), abs_of(x).data(), abs_of(w).data(), abs_of(bias).data(), M, N, K);
    expect_dot("staged conv1d forward", download(*y, ry.size(), dt), ry, sy, K + 1, dt);
  }
}

TEST_CASE("linear and conv1d: bias in the GEMM epilogue (aligned, or copied aligned first); backward; bias_backward") {
  kg::Context ctx;
  // The backward again with the bias gradient from cuBLASLt's epilogue on the dW product
  // (ContextOptions::bias_grad_epilogue): the same bounds against the CPU twin.
  kg::ContextOptions bgrad_options;
  bgrad_options.bias_grad_epilogue = true;
  kg::Context bgrad(bgrad_options);
  std::map<DType, std::uint64_t> epilogues;  // per dtype: backward calls that took the epilogue
  for (DType dt : kDtypes)
    for (std::size_t bias_offset : {std::size_t{0}, std::size_t{4}})
      for (bool conv : {false, true}) {
        CAPTURE(dtype_str(dt));
        CAPTURE(bias_offset);
        CAPTURE(conv);
        const std::int64_t M = 96, N = 72, K = 40;
        const Vec x = rand_vec(M * K, 111, dt), w = rand_vec(N * K, 112, dt), b = rand_vec(N, 113, dt);
        auto dxin = device(x, dt), dw = device(w, dt), dbias = device(b, dt, bias_offset);
        auto y = output(sz(M * N), dt);
        Vec ry(sz(M * N));
        if (conv) {
          kg::conv1d_forward(ctx, y->get(), dxin->get(), dw->get(), dbias->get(), M, N, K, dt, kStream);
          kc::conv1d_forward(ry.data(), x.data(), w.data(), b.data(), M, N, K);
        } else {
          kg::linear_forward(ctx, y->get(), dxin->get(), dw->get(), dbias->get(), M, N, K, dt, kStream);
          kc::linear_forward(ry.data(), x.data(), w.data(), b.data(), M, N, K);
        }
        Vec sy(sz(M * N));
        if (conv)
          kc::conv1d_forward(sy.data(), abs_of(x).data(), abs_of(w).data(), abs_of(b).data(), M, N, K);
        else
          kc::linear_forward(sy.data(), abs_of(x).data(), abs_of(w).data(), abs_of(b).data(), M, N, K);
        expect_dot("linear/conv1d forward", download(*y, ry.size(), dt), ry, sy, K + 1, dt);
        const Vec dy = rand_vec(M * N, 114, dt);
        const Vec xinit = rand_vec(M * K, 115, dt), winit = rand_vec(N * K, 116, dt), binit = rand_vec(N, 117, dt);
        auto ddy = device(dy, dt);
        for (kg::Context* c : {&ctx, &bgrad})
        for (bool acc : {false, true}) {
          CAPTURE(c == &bgrad);
          const std::uint64_t before = c->bias_grad_epilogues();
          auto gx = acc ? device(xinit, dt) : output(x.size(), dt);
          auto gw = acc ? device(winit, dt) : output(w.size(), dt);
          auto gb = acc ? device(binit, dt) : output(b.size(), dt);
          Vec rx = acc ? xinit : Vec(x.size()), rw = acc ? winit : Vec(w.size()), rb = acc ? binit : Vec(b.size());
          if (conv) {
            kg::conv1d_backward(*c, gx->get(), gw->get(), gb->get(), ddy->get(), dxin->get(), dw->get(), M, N, K, acc,
                                dt, kStream);
            kc::conv1d_backward(rx.data(), rw.data(), rb.data(), dy.data(), x.data(), w.data(), M, N, K, acc);
          } else {
            kg::linear_backward(*c, gx->get(), gw->get(), gb->get(), ddy->get(), dxin->get(), dw->get(), M, N, K, acc,
                                dt, kStream);
            kc::linear_backward(rx.data(), rw.data(), rb.data(), dy.data(), x.data(), w.data(), M, N, K, acc);
          }
          CHECK(ctx.bias_grad_epilogues() == 0);  // off by default
          epilogues[dt] += c->bias_grad_epilogues() - before;
          Vec sx = acc ? abs_of(xinit) : Vec(x.size()), sw = acc ? abs_of(winit) : Vec(w.size()),
              sb = acc ? abs_of(binit) : Vec(b.size());
          if (conv)
            kc::conv1d_backward(sx.data(), sw.data(), sb.data(), abs_of(dy).data(), abs_of(x).data(),
                                abs_of(w).data(), M, N, K, acc);
          else
            kc::linear_backward(sx.data(), sw.data(), sb.data(), abs_of(dy).data(), abs_of(x).data(),
                                abs_of(w).data(), M, N, K, acc);
          expect_dot("backward dx", download(*gx, rx.size(), dt), rx, sx, N + 1, dt, acc);
          expect_dot("backward dw", download(*gw, rw.size(), dt), rw, sw, M + 1, dt, acc);
          expect_dot("backward db", download(*gb, rb.size(), dt), rb, sb, M + 1, dt);
        }
      }
  // cuBLASLt took the epilogue for every call it may take (on an H100 with cuBLASLt 13: fp32
  // sums for fp32 products; for 16-bit ones, whose fp32 sums it refuses, sums in the product's
  // dtype, and only where db is written: added into db they would be rounded twice).
  for (DType dt : kDtypes) {
    const std::uint64_t expected = dt == DType::fp32 ? 8 : 4;
    MESSAGE(dtype_str(dt), ": bias gradient by the epilogue in ", epilogues[dt], " of 8 backward calls");
    CHECK(epilogues[dt] == expected);
  }
  // bias_backward over many rows (several row chunks, rows left over after the unrolled
  // loads), columns short of a block's tile, one tile and a ragged last one; deterministic.
  for (DType dt : kDtypes)
    for (std::int64_t N : {std::int64_t{77}, std::int64_t{3}, std::int64_t{1000}})
      for (bool acc : {false, true}) {
        CAPTURE(dtype_str(dt));
        CAPTURE(N);
        CAPTURE(acc);
        const std::int64_t M = 5003;
        const Vec dy = rand_vec(M * N, 118, dt), init = rand_vec(N, 119, dt);
        auto ddy = device(dy, dt);
        auto db1 = acc ? device(init, dt) : output(sz(N), dt), db2 = acc ? device(init, dt) : output(sz(N), dt);
        kg::bias_backward(ctx, db1->get(), ddy->get(), M, N, acc, dt, kStream);
        kg::bias_backward(ctx, db2->get(), ddy->get(), M, N, acc, dt, kStream);
        Vec r = acc ? init : Vec(sz(N));
        kc::bias_backward(r.data(), dy.data(), M, N, acc);
        expect_close("bias_backward", download(*db1, r.size(), dt), r,
                     Tol{1e-7 * static_cast<double>(M), eps(dt), band(dt)});
        expect_equal_bits("bias_backward", bits(*db1), bits(*db2));
      }
}

// How many elements of `got` equal `ref` rounded to dt.
static std::size_t equal_after_rounding(const Vec& got, const Vec& ref, DType dt) {
  const Vec rr = rounded(ref, dt);
  std::size_t same = 0;
  for (std::size_t i = 0; i < rr.size(); ++i) same += got[i] == rr[i] ? 1 : 0;
  return same;
}

// The fused MLP's products (models::Fn::mlp_gelu_tanh): c_fc with the GELU as cuBLASLt's
// epilogue, and c_proj's input gradient with the GELU's derivative as its epilogue, against
// the CPU twin of the same sums (exec/device_cpu.cpp: the GELU of the fp32 sums, rounded once;
// the derivative at the rounded pre-activation times the product rounded to dt, rounded). Where the
// operands refuse the epilogue (a width not a multiple of 8, an operand not 16-byte aligned)
// nothing runs and the call says so, for the caller to run the chain.
TEST_CASE("conv1d with the GELU epilogue and the GELU's derivative epilogue: the CPU twin's values; refusals") {
  kg::Context ctx;
  constexpr double kSlope = 1.2;  // |gelu_tanh'| <= 1.13: an error in pre grows by at most this in the GELU
  for (DType dt : kDtypes)
    for (std::size_t bias_offset : {std::size_t{0}, std::size_t{4}}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(bias_offset);
      const std::int64_t M = 96, N = 128, K = 64;  // pre, a (M, N) = x (M, K) · W (K, N) + b
      const Vec x = rand_vec(M * K, 211, dt), w = rand_vec(K * N, 212, dt, -0.5f, 0.5f), b = rand_vec(N, 213, dt);
      auto dx = device(x, dt), dw = device(w, dt), db = device(b, dt, bias_offset);
      auto pre = output(sz(M * N), dt), a = output(sz(M * N), dt);
      REQUIRE(kg::conv1d_gelu_forward(ctx, a->get(), pre->get(), dx->get(), dw->get(), db->get(), M, N, K, dt, kStream));
      Vec r32(sz(M * N)), s(sz(M * N)), ra(sz(M * N));
      kc::conv1d_forward(r32.data(), x.data(), w.data(), b.data(), M, N, K);
      kc::conv1d_forward(s.data(), abs_of(x).data(), abs_of(w).data(), abs_of(b).data(), M, N, K);
      kc::gelu_tanh_forward(ra.data(), r32.data(), M * N);
      const Vec rpre = rounded(r32, dt);
      expect_dot("pre-activation", download(*pre, rpre.size(), dt), r32, s, K + 1, dt);
      {  // the GELU of the fp32 sums (A) or of their rounding to dt (B, the chain's): which it is
        const Vec got_a = download(*a, ra.size(), dt);
        Vec rb(ra.size());
        kc::gelu_tanh_forward(rb.data(), rpre.data(), M * N);
        const std::size_t of_sums = equal_after_rounding(got_a, ra, dt), of_rounded = equal_after_rounding(got_a, rb, dt);
        MESSAGE("GELU ", dtype_str(dt), ": of the fp32 sums ", of_sums, ", of their rounding ", of_rounded, " of ",
                ra.size(), " equal");
        // In 16 bits the epilogue is the GELU of the sums: on an H100 99.3% (bf16) of the elements
        // are that twin's rounding, 67% the chain's. (fp32 results differ by ulps: not counted.)
        if (dt != DType::fp32) CHECK(static_cast<double>(of_sums) >= 0.95 * static_cast<double>(ra.size()));
      }
      // The GELU of the GPU's own fp32 sums: their error through the GELU's slope, cuBLASLt's
      // GELU against libm's tanh (16 fp32 ulps of the result and of the sum), one rounding.
      const double u = 0x1p-24, u_dt = dt == DType::fp32 ? 0.0 : eps(dt) / 2.0;
      expect_within(
          "GELU epilogue", download(*a, ra.size(), dt), ra,
          [&](std::size_t i) {
            const double sum_err = kSlope * 5.0 * static_cast<double>(K + 1) * u * static_cast<double>(s[i]);
            const double math = 16 * 0x1p-23 * (std::fabs(static_cast<double>(ra[i])) + std::fabs(static_cast<double>(r32[i])));
            return u_dt * (std::fabs(static_cast<double>(ra[i])) + sum_err + math) + sum_err + math + underflow(dt);
          },
          band(dt));
      // Backward: d_pre (M, N) = gelu'(pre) · (dy (M, K') · W2^T), W2 (N, K'), at the saved (rounded) pre.
      const std::int64_t Kp = 48;
      const Vec dyv = rand_vec(M * Kp, 214, dt), w2 = rand_vec(N * Kp, 215, dt);
      auto ddy = device(dyv, dt), dw2 = device(w2, dt);
      auto dpre = output(sz(M * N), dt);
      const Vec got_pre = download(*pre, rpre.size(), dt);
      REQUIRE(kg::conv1d_dgelu_backward(ctx, dpre->get(), ddy->get(), dw2->get(), pre->get(), M, Kp, N, dt, kStream));
      Vec da(sz(M * N)), sa(sz(M * N)), rd(sz(M * N));
      kc::conv1d_backward(da.data(), nullptr, nullptr, dyv.data(), got_pre.data(), w2.data(), M, Kp, N, false);
      kc::conv1d_backward(sa.data(), nullptr, nullptr, abs_of(dyv).data(), got_pre.data(), abs_of(w2).data(), M, Kp, N, false);
      kc::gelu_tanh_backward(rd.data(), got_pre.data(), da.data(), M * N, false);
      const Vec got_d = download(*dpre, rd.size(), dt);
      // What cuBLASLt's 16-bit derivative epilogue rounds on the way, against three twins: the
      // fp32 product times the derivative (A), the product rounded to dt first (B: the chain's
      // rounding), and the derivative rounded to dt too (C); the relative L2 error of each. On
      // an H100 (2026-12-07) B: bf16 12,182 of 12,288 equal (relative L2 1.75e-4), against A's
      // 9,137 (2.74e-3) and C's 8,912; fp16 11,980 (3.0e-5). The executor's CPU twin is B. (The
      // forward's GELU is of the fp32 sums: 12,204 bf16 elements equal that twin, 8,253 the
      // GELU of the rounded sums.)
      {
        Vec db_(rd.size()), dc(rd.size());
        const Vec da_r = rounded(da, dt);
        kc::gelu_tanh_backward(db_.data(), got_pre.data(), da_r.data(), M * N, false);
        Vec ones(rd.size(), 1.0f), dg(rd.size());
        kc::gelu_tanh_backward(dg.data(), got_pre.data(), ones.data(), M * N, false);
        const Vec dg_r = rounded(dg, dt);
        for (std::size_t i = 0; i < rd.size(); ++i) dc[i] = dg_r[i] * da_r[i];
        auto rel = [&](const Vec& r) {
          const Vec rr = rounded(r, dt);
          double num = 0, den = 0;
          for (std::size_t i = 0; i < rr.size(); ++i) {
            num += (got_d[i] - rr[i]) * (got_d[i] - rr[i]);
            den += rr[i] * rr[i];
          }
          return std::sqrt(num / den);
        };
        MESSAGE("DGELU ", dtype_str(dt), ": A rel L2 ", rel(rd), ", ", equal_after_rounding(got_d, rd, dt), " equal; B ",
                rel(db_), ", ", equal_after_rounding(got_d, db_, dt), " equal; C ", rel(dc), ", ",
                equal_after_rounding(got_d, dc, dt), " of ", rd.size(), " equal");
        // The CPU twin's rounding point, asserted: in 16 bits B's rounding for 95% of the elements
        // and its relative L2 within 0.05 eps (H100: 99.1% and 0.022 eps in bf16; A's 74%, 0.35 eps).
        if (dt != DType::fp32) {
          CHECK(static_cast<double>(equal_after_rounding(got_d, db_, dt)) >= 0.95 * static_cast<double>(rd.size()));
          CHECK(rel(db_) <= 0.05 * eps(dt));
        }
      }
      // Against B unrounded: half an ulp of dt, the products' fp32 error through the slope, the
      // formula's fp32 ulps, and where the two products round to neighbours in dt (their fp32
      // sums either side of a midpoint), an ulp of the product through the slope.
      Vec rbw(rd.size());
      kc::gelu_tanh_backward(rbw.data(), got_pre.data(), rounded(da, dt).data(), M * N, false);
      expect_within(
          "DGELU epilogue", got_d, rbw,
          [&](std::size_t i) {
            const double sum_err = kSlope * 5.0 * static_cast<double>(Kp) * u * static_cast<double>(sa[i]);
            const double flip = kSlope * 2.0 * u_dt * std::fabs(static_cast<double>(da[i]));
            const double math = 16 * 0x1p-23 * kSlope * std::fabs(static_cast<double>(da[i]));
            return u_dt * (std::fabs(static_cast<double>(rbw[i])) + sum_err + flip + math) + sum_err + flip + math +
                   underflow(dt);
          },
          dt == DType::fp32 ? band(dt) : 0.5 * eps(dt));  // the output's rounding alone: about 0.2 eps
      // Refused: a width of 100 (not a multiple of 8); an operand 2 bytes off 16-byte alignment.
      auto x_off = device(x, dt, 2);
      CHECK_FALSE(kg::conv1d_gelu_forward(ctx, a->get(), pre->get(), x_off->get(), dw->get(), db->get(), M, N, K, dt,
                                          kStream));
      CHECK_FALSE(kg::conv1d_dgelu_backward(ctx, dpre->get(), x_off->get(), dw2->get(), pre->get(), M, Kp, N, dt, kStream));
      const Vec w100 = rand_vec(K * 100, 216, dt), b100 = rand_vec(100, 217, dt);
      auto dw100 = device(w100, dt), db100 = device(b100, dt);
      CHECK_FALSE(kg::conv1d_gelu_forward(ctx, a->get(), pre->get(), dx->get(), dw100->get(), db100->get(), M, 100, K,
                                          dt, kStream));
      CHECK(zp::kernels::gelu_epilogue_takes(M, N, K, {dx->get(), dw->get(), pre->get(), a->get()}));
      CHECK_FALSE(zp::kernels::gelu_epilogue_takes(M, 100, K, {dx->get(), dw->get(), pre->get(), a->get()}));
    }
}

// ------------------------------------------------------------------------------------
// normalisation
// ------------------------------------------------------------------------------------
TEST_CASE("layernorm: forward statistics and output, backward dx, dw, db (deterministic), with and without affine") {
  kg::Context ctx;
  for (DType dt : kDtypes)
    // One warp per row where rows are whole 16-byte packs: 768 (packs per lane 3 in 16 bits,
    // so 4; 6 in fp32, so 8 forward and the block kernel for dx), 512 (2 in 16 bits, 4 in
    // fp32), 100 (1 in fp32; 16 bits go element by element); 4096: the block kernels on packs.
    for (std::int64_t C : {std::int64_t{768}, std::int64_t{100}, std::int64_t{512}, std::int64_t{4096}})
      for (bool affine : {true, false}) {
        CAPTURE(dtype_str(dt));
        CAPTURE(C);
        CAPTURE(affine);
        // 2051: several row chunks and a ragged tail; 4100 at 768: the one-pass backward's 1025
        // warps take four rows each, the last of them none (an idle warp of the last block).
        const std::int64_t rows = C == 100 ? 2051 : C == 768 ? 4100 : 45;
        const float eps_ln = 1e-5f;
        const Vec x = rand_vec(rows * C, 121, dt, -2.0f, 3.0f), w = rand_vec(C, 122, dt, 0.5f, 1.5f),
                  b = rand_vec(C, 123, dt);
        auto dxin = device(x, dt), dw = device(w, dt), db = device(b, dt);
        const void* wp = affine ? dw->get() : nullptr;
        const void* bp = affine ? db->get() : nullptr;
        auto y = output(sz(rows * C), dt);
        Dev mean(sz(rows) * 4), rstd(sz(rows) * 4);
        mean.poison();
        rstd.poison();
        kg::layernorm_forward(y->get(), mean.as<float>(), rstd.as<float>(), dxin->get(), wp, bp, rows, C, eps_ln, dt,
                              kStream);
        Vec ry(sz(rows * C)), rmean(sz(rows)), rrstd(sz(rows));
        kc::layernorm_forward(ry.data(), rmean.data(), rrstd.data(), x.data(), affine ? w.data() : nullptr,
                              affine ? b.data() : nullptr, rows, C, eps_ln);
        expect_close("layernorm mean", download(mean, sz(rows), DType::fp32), rmean, Tol{1e-6, 1e-5, 1e-5});
        expect_close("layernorm rstd", download(rstd, sz(rows), DType::fp32), rrstd, Tol{0.0, 1e-5, 1e-5});
        expect_close("layernorm_forward", download(*y, ry.size(), dt), ry, tol_math(dt, 1e-5));

        const Vec dy = rand_vec(rows * C, 124, dt), xinit = rand_vec(rows * C, 125, dt), winit = rand_vec(C, 126, dt),
                  binit = rand_vec(C, 127, dt);
        auto ddy = device(dy, dt);
        auto dmean = device(rmean, DType::fp32), drstd = device(rrstd, DType::fp32);
        // dw and db are column sums over the rows, in another order here than the CPU's
        // (warps' partials, then a column reduction): their roundings differ by a random walk
        // that grows as √rows (an H100 put one fp32 element of 768, over 4100 rows, 1.24e-5 off
        // against an allowed 1.17e-5; the relative L2 error, 1.9e-7, stays far inside its band).
        const Tol tol_sum = tol_math(dt, 1e-5 * std::max(1.0, std::sqrt(static_cast<double>(rows) / 256.0)));
        for (bool acc : {false, true}) {
          auto gx = acc ? device(xinit, dt) : output(x.size(), dt);
          auto gw = acc ? device(winit, dt) : output(sz(C), dt);
          auto gb = acc ? device(binit, dt) : output(sz(C), dt);
          kg::layernorm_backward(ctx, gx->get(), gw->get(), gb->get(), ddy->get(), dxin->get(), dmean->as<float>(),
                                 drstd->as<float>(), wp, rows, C, acc, dt, kStream);
          Vec rx = acc ? xinit : Vec(x.size()), rw = acc ? winit : Vec(sz(C)), rb = acc ? binit : Vec(sz(C));
          kc::layernorm_backward(rx.data(), rw.data(), rb.data(), dy.data(), x.data(), rmean.data(), rrstd.data(),
                                 affine ? w.data() : nullptr, rows, C, acc);
          expect_close("layernorm_backward dx", download(*gx, rx.size(), dt), rx, tol_math(dt, 1e-5));
          expect_close("layernorm_backward dw", download(*gw, rw.size(), dt), rw, tol_sum);
          expect_close("layernorm_backward db", download(*gb, rb.size(), dt), rb, tol_sum);
          if (!acc) {
            // The same bits again; dw alone (the column reduction over the rows) within the
            // tolerance of the one pass's (its sums are the warps').
            auto gx2 = output(x.size(), dt), gw2 = output(sz(C), dt), gb2 = output(sz(C), dt), gw3 = output(sz(C), dt);
            kg::layernorm_backward(ctx, gx2->get(), gw2->get(), gb2->get(), ddy->get(), dxin->get(), dmean->as<float>(),
                                   drstd->as<float>(), wp, rows, C, false, dt, kStream);
            expect_equal_bits("layernorm_backward dx", bits(*gx), bits(*gx2));
            expect_equal_bits("layernorm_backward dw", bits(*gw), bits(*gw2));
            expect_equal_bits("layernorm_backward db", bits(*gb), bits(*gb2));
            kg::layernorm_backward(ctx, nullptr, gw3->get(), nullptr, ddy->get(), dxin->get(), dmean->as<float>(),
                                   drstd->as<float>(), wp, rows, C, false, dt, kStream);
            expect_close("layernorm_backward dw alone", download(*gw3, rw.size(), dt), rw, tol_sum);
            // dx written, dw and db added into (a fresh input gradient, the params' accumulating).
            auto gx4 = output(x.size(), dt);
            auto gw4 = device(winit, dt), gb4 = device(binit, dt);
            kg::layernorm_backward(ctx, gx4->get(), gw4->get(), gb4->get(), ddy->get(), dxin->get(), dmean->as<float>(),
                                   drstd->as<float>(), wp, rows, C, false, true, dt, kStream);
            Vec rw4 = winit, rb4 = binit, rx4(x.size());
            kc::layernorm_backward(rx4.data(), nullptr, nullptr, dy.data(), x.data(), rmean.data(), rrstd.data(),
                                   affine ? w.data() : nullptr, rows, C, false);
            kc::layernorm_backward(nullptr, rw4.data(), rb4.data(), dy.data(), x.data(), rmean.data(), rrstd.data(),
                                   affine ? w.data() : nullptr, rows, C, true);
            expect_close("layernorm_backward dx written", download(*gx4, rx4.size(), dt), rx4, tol_math(dt, 1e-5));
            expect_close("layernorm_backward dw added", download(*gw4, rw4.size(), dt), rw4, tol_sum);
            expect_close("layernorm_backward db added", download(*gb4, rb4.size(), dt), rb4, tol_sum);
          }
        }
      }
  // The one-pass backward's warps fixed (ContextOptions::layernorm_backward_warps): 5 warps,
  // 820 rows each, in two blocks, the second with three idle warps; the CPU's gradients, and
  // the same bits from another Context with the same number.
  kg::ContextOptions five;
  five.layernorm_backward_warps = 5;
  kg::Context c5(five), c5b(five);
  for (DType dt : kDtypes) {
    CAPTURE(dtype_str(dt));
    const std::int64_t rows = 4100, C = 512;
    const Vec x = rand_vec(rows * C, 131, dt, -2.0f, 3.0f), w = rand_vec(C, 132, dt, 0.5f, 1.5f),
              dy = rand_vec(rows * C, 133, dt);
    Vec mean(sz(rows)), rstd(sz(rows)), y(sz(rows * C)), rx(x.size()), rw(sz(C)), rb(sz(C));
    kc::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, rows, C, 1e-5f);
    kc::layernorm_backward(rx.data(), rw.data(), rb.data(), dy.data(), x.data(), mean.data(), rstd.data(), w.data(),
                           rows, C, false);
    auto dxin = device(x, dt), dwt = device(w, dt), ddy = device(dy, dt);
    auto dmean = device(mean, DType::fp32), drstd = device(rstd, DType::fp32);
    std::vector<std::vector<std::uint8_t>> got;
    for (kg::Context* c : {&c5, &c5b}) {
      auto gx = output(x.size(), dt), gw = output(sz(C), dt), gb = output(sz(C), dt);
      kg::layernorm_backward(*c, gx->get(), gw->get(), gb->get(), ddy->get(), dxin->get(), dmean->as<float>(),
                             drstd->as<float>(), dwt->get(), rows, C, false, dt, kStream);
      // Each warp sums its 820 rows' dy·x̂ (and dy) in sequence, not 4 and then a tree: for
      // zero-mean terms of about 0.6 the partial sums grow as √k, so one warp's fp32 rounding
      // error has a standard deviation of about 2^-24 · 0.6 · 820 / √2, and five warps add √5
      // of it. Allowed: four of those (1.8e-4; an H100 put dw 7.1e-5 off where the default's
      // √rows bound allowed 6.4e-5). The relative L2 band (1e-5; measured 5e-7) stays.
      const double chain = static_cast<double>(rows) / 5.0;
      const double walk = 4.0 * 0x1p-24 * 0.6 * chain / std::sqrt(2.0) * std::sqrt(5.0);
      const Tol tol_sum = tol_math(dt, std::max(walk, 1e-5 * std::sqrt(static_cast<double>(rows) / 256.0)));
      expect_close("layernorm_backward dx, 5 warps", download(*gx, rx.size(), dt), rx, tol_math(dt, 1e-5));
      expect_close("layernorm_backward dw, 5 warps", download(*gw, rw.size(), dt), rw, tol_sum);
      expect_close("layernorm_backward db, 5 warps", download(*gb, rb.size(), dt), rb, tol_sum);
      got.push_back(bits(*gw));
    }
    expect_equal_bits("layernorm_backward dw, two Contexts of 5 warps", got[0], got[1]);
  }
  kg::ContextOptions negative;
  negative.layernorm_backward_warps = -1;
  CHECK_THROWS_AS(kg::Context{negative}, std::invalid_argument);
}

TEST_CASE("fused residual LayerNorm: the bits of the chain dropout, add, layernorm, forward and backward") {
  // models::Fn::dropout_add_layernorm against the three kernels it replaces, on the GPU: the
  // same masks, sums, outputs, statistics, and gradients (the residual's, the dropped
  // operand's, the params'), bit for bit. C: 768 (one warp a row both ways in 16 bits; fp32's
  // backward rows through the scratch), 64 (one pack a lane), 2048 (16 bits: the forward's
  // warps, the backward through the scratch), 100 (16 bits: not whole packs, the chain's
  // kernels forward and the scratch backward; fp32: whole packs of 4, the mask read 4 bytes a
  // lane, the warps both ways). With and without a gradient of the sum from a later reader
  // (GPT-2's residual), with the inputs' gradients written or added into, each on its own; and
  // with a weight 4 bytes off its alignment (a parameter at an odd offset of its flat buffer):
  // the scratch path, which the prediction's rule asks for there too.
  kg::Context ctx;
  const std::uint64_t seed = 0x9E3779B97F4A7C15ull ^ 77u, offset = std::uint64_t{5} << 32;
  for (DType dt : kDtypes)
    for (std::int64_t C : {std::int64_t{768}, std::int64_t{64}, std::int64_t{2048}, std::int64_t{100}})
      for (float p : {0.1f, 0.0f}) {
        CAPTURE(dtype_str(dt));
        CAPTURE(C);
        CAPTURE(p);
        const std::int64_t rows = 301, n = rows * C;
        const float eps_ln = 1e-12f;
        const Vec b = rand_vec(n, 141, dt, -2.0f, 2.0f), x = rand_vec(n, 142, dt, -1.0f, 3.0f),
                  w = rand_vec(C, 143, dt, 0.5f, 1.5f), beta = rand_vec(C, 144, dt);
        auto db_in = device(b, dt), dx_in = device(x, dt), dw = device(w, dt), dbeta = device(beta, dt);
        // The chain.
        auto d = output(sz(n), dt), s1 = output(sz(n), dt), y1 = output(sz(n), dt);
        Dev m1(sz(n)), mean1(sz(rows) * 4), rstd1(sz(rows) * 4);
        m1.poison();
        if (p > 0.0f) kg::dropout_forward(d->get(), m1.as<std::uint8_t>(), db_in->get(), n, p, seed, offset, dt, kStream);
        else kg::convert(d->get(), dt, db_in->get(), dt, n, kStream);
        kg::add_forward(s1->get(), d->get(), dx_in->get(), n, dt, kStream);
        kg::layernorm_forward(y1->get(), mean1.as<float>(), rstd1.as<float>(), s1->get(), dw->get(), dbeta->get(), rows,
                              C, eps_ln, dt, kStream);
        // The fused op.
        auto s2 = output(sz(n), dt), y2 = output(sz(n), dt);
        Dev m2(sz(n)), mean2(sz(rows) * 4), rstd2(sz(rows) * 4);
        m2.poison();
        mean2.poison();
        rstd2.poison();
        kg::dropout_add_layernorm_forward(y2->get(), mean2.as<float>(), rstd2.as<float>(), s2->get(),
                                          p > 0.0f ? m2.as<std::uint8_t>() : nullptr, db_in->get(), dx_in->get(),
                                          dw->get(), dbeta->get(), rows, C, eps_ln, p, seed, offset, dt, kStream);
        expect_equal_bits("fused residual LayerNorm: the sum", bits(*s1), bits(*s2));
        expect_equal_bits("fused residual LayerNorm: y", bits(*y1), bits(*y2));
        expect_equal_bits("fused residual LayerNorm: mean", bits(mean1), bits(mean2));
        expect_equal_bits("fused residual LayerNorm: rstd", bits(rstd1), bits(rstd2));
        if (p > 0.0f) {
          CHECK(download_raw<std::uint8_t>(m1, sz(n)) == download_raw<std::uint8_t>(m2, sz(n)));
        }
        const Vec dy = rand_vec(n, 145, dt), ds = rand_vec(n, 146, dt), res0 = rand_vec(n, 147, dt),
                  b0 = rand_vec(n, 148, dt), w0 = rand_vec(C, 149, dt), beta0 = rand_vec(C, 150, dt);
        auto ddy = device(dy, dt);
        for (bool with_ds : {false, true})
          for (int accs = 0; accs < 4; ++accs) {
            const bool acc_res = (accs & 1) != 0, acc_b = (accs & 2) != 0;
            CAPTURE(with_ds);
            CAPTURE(acc_res);
            CAPTURE(acc_b);
            // The chain: LayerNorm's input gradient written (or added into the sum's), then the
            // residual's gradient the sum's (or added into), the dropped operand's through the mask.
            auto gs = with_ds ? device(ds, dt) : output(sz(n), dt);
            auto gw1 = device(w0, dt), gbeta1 = device(beta0, dt);
            kg::layernorm_backward(ctx, gs->get(), gw1->get(), gbeta1->get(), ddy->get(), s1->get(), mean1.as<float>(),
                                   rstd1.as<float>(), dw->get(), rows, C, with_ds, true, dt, kStream);
            auto gres1 = acc_res ? device(res0, dt) : output(sz(n), dt);
            auto gb1 = acc_b ? device(b0, dt) : output(sz(n), dt);
            auto put = [&](void* dst, const void* src, bool acc) {
              if (acc) kg::convert_accumulate(dst, dt, src, dt, n, kStream);
              else kg::convert(dst, dt, src, dt, n, kStream);
            };
            put(gres1->get(), gs->get(), acc_res);
            if (p > 0.0f) kg::dropout_backward(gb1->get(), m1.as<std::uint8_t>(), gs->get(), n, p, acc_b, dt, kStream);
            else put(gb1->get(), gs->get(), acc_b);
            // The fused op, from the same ds.
            auto ds2 = device(ds, dt);
            auto gw2 = device(w0, dt), gbeta2 = device(beta0, dt);
            auto gres2 = acc_res ? device(res0, dt) : output(sz(n), dt);
            auto gb2 = acc_b ? device(b0, dt) : output(sz(n), dt);
            auto scratch = kernels_needs_scratch(C, dt) ? output(sz(n), dt) : nullptr;
            kg::dropout_add_layernorm_backward(ctx, gb2->get(), gres2->get(), gw2->get(), gbeta2->get(), ddy->get(),
                                               with_ds ? ds2->get() : nullptr, s2->get(),
                                               p > 0.0f ? m2.as<std::uint8_t>() : nullptr, mean2.as<float>(),
                                               rstd2.as<float>(), dw->get(), rows, C, p, acc_b, acc_res,
                                               scratch ? scratch->get() : nullptr, dt, kStream);
            expect_equal_bits("fused residual LayerNorm: the residual's gradient", bits(*gres1), bits(*gres2));
            expect_equal_bits("fused residual LayerNorm: the dropped operand's gradient", bits(*gb1), bits(*gb2));
            expect_equal_bits("fused residual LayerNorm: dw", bits(*gw1), bits(*gw2));
            expect_equal_bits("fused residual LayerNorm: dbeta", bits(*gbeta1), bits(*gbeta2));
          }
        // A weight off its 16-byte alignment: the rule sends the backward to the scratch path,
        // with the chain's dx (the chain's LayerNorm goes to its block kernels there too).
        if (C == 768 && p > 0.0f) {
          auto wodd = device(w, dt, 4);
          CHECK(!zp::kernels::dropout_add_layernorm_backward_warp_takes(C, zp::dtype_size(dt),
                                                                        {ddy->get(), s2->get(), wodd->get()},
                                                                        m2.as<std::uint8_t>()));
          auto gs = output(sz(n), dt);
          auto gw1 = device(w0, dt), gbeta1 = device(beta0, dt), gw2 = device(w0, dt), gbeta2 = device(beta0, dt);
          kg::layernorm_backward(ctx, gs->get(), gw1->get(), gbeta1->get(), ddy->get(), s1->get(), mean1.as<float>(),
                                 rstd1.as<float>(), wodd->get(), rows, C, false, true, dt, kStream);
          auto gb1 = output(sz(n), dt), gres2 = output(sz(n), dt), gb2 = output(sz(n), dt), scratch = output(sz(n), dt);
          kg::dropout_backward(gb1->get(), m1.as<std::uint8_t>(), gs->get(), n, p, false, dt, kStream);
          kg::dropout_add_layernorm_backward(ctx, gb2->get(), gres2->get(), gw2->get(), gbeta2->get(), ddy->get(), nullptr,
                                             s2->get(), m2.as<std::uint8_t>(), mean2.as<float>(), rstd2.as<float>(),
                                             wodd->get(), rows, C, p, false, false, scratch->get(), dt, kStream);
          expect_equal_bits("fused residual LayerNorm, odd weight: the residual's gradient", bits(*gs), bits(*gres2));
          expect_equal_bits("fused residual LayerNorm, odd weight: the dropped operand's", bits(*gb1), bits(*gb2));
          expect_equal_bits("fused residual LayerNorm, odd weight: dw", bits(*gw1), bits(*gw2));
        }
      }
  // Rows the warp kernels do not take, with no scratch given: refused by name.
  auto big = output(sz(2 * 2048), DType::bf16);
  Dev stat(2 * 4);
  CHECK_THROWS_AS(kg::dropout_add_layernorm_backward(ctx, big->get(), big->get(), nullptr, nullptr, big->get(), nullptr,
                                                     big->get(), nullptr, stat.as<float>(), stat.as<float>(), nullptr, 2,
                                                     2048, 0.0f, false, false, nullptr, DType::bf16, kStream),
                  std::logic_error);
}

TEST_CASE("RMSNorm: HF's decomposition (rms_rsqrt, mul_rowscale, mul_weight) and the fused kernel, both ways") {
  kg::Context ctx;
  for (DType dt : kDtypes)
    for (std::int64_t C : {std::int64_t{256}, std::int64_t{90}}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(C);
      const std::int64_t rows = 40;
      const float eps_rms = 1e-6f;
      const Vec x = rand_vec(rows * C, 131, dt, -2.0f, 2.0f), w = rand_vec(C, 132, dt, 0.5f, 1.5f);
      const Vec dy = rand_vec(rows * C, 133, dt);
      auto dxin = device(x, dt), dw = device(w, dt), ddy = device(dy, dt);
      // The pieces, each against its CPU twin.
      Vec sq(x.size());
      kc::pow2_forward(sq.data(), x.data(), rows * C);
      sq = rounded(sq, dt);
      auto dsq = device(sq, dt);
      auto r = output(sz(rows), dt);
      kg::rms_rsqrt_forward(r->get(), dsq->get(), rows, C, eps_rms, dt, kStream);
      Vec rr(sz(rows));
      kc::rms_rsqrt_forward(rr.data(), sq.data(), rows, C, eps_rms);
      expect_close("rms_rsqrt_forward", download(*r, rr.size(), dt), rr, tol_math(dt, 0.0));
      const Vec rs = rounded(rr, dt), dr = rand_vec(rows, 134, dt);
      auto drs = device(rs, dt), ddr = device(dr, dt);
      auto gsq = output(sq.size(), dt);
      kg::rms_rsqrt_backward(gsq->get(), ddr->get(), drs->get(), rows, C, false, dt, kStream);
      Vec rgsq(sq.size());
      kc::rms_rsqrt_backward(rgsq.data(), dr.data(), rs.data(), rows, C, false);
      expect_close("rms_rsqrt_backward", download(*gsq, rgsq.size(), dt), rgsq, tol(dt, 1.0, 0.0));
      auto h = output(x.size(), dt);
      kg::mul_rowscale_forward(h->get(), dxin->get(), drs->get(), rows, C, dt, kStream);
      Vec rh(x.size());
      kc::mul_rowscale_forward(rh.data(), x.data(), rs.data(), rows, C);
      expect_close("mul_rowscale_forward", download(*h, rh.size(), dt), rh, tol(dt, 1.0, 0.0));
      auto gx = output(x.size(), dt), gr = output(sz(rows), dt);
      kg::mul_rowscale_backward(gx->get(), gr->get(), ddy->get(), dxin->get(), drs->get(), rows, C, false, dt, kStream);
      Vec rgx(x.size()), rgr(sz(rows));
      kc::mul_rowscale_backward(rgx.data(), rgr.data(), dy.data(), x.data(), rs.data(), rows, C, false);
      expect_close("mul_rowscale_backward dx", download(*gx, rgx.size(), dt), rgx, tol(dt, 1.0, 0.0));
      expect_close("mul_rowscale_backward dr", download(*gr, rgr.size(), dt), rgr, tol(dt, 2.0, 1e-6 * static_cast<double>(C)));
      {  // dx accumulated into what is there (both paths: C = 256 packs, C = 90 does not)
        const Vec init = rand_vec(rows * C, 134, dt);
        auto gxa = device(init, dt);
        kg::mul_rowscale_backward(gxa->get(), nullptr, ddy->get(), dxin->get(), drs->get(), rows, C, true, dt, kStream);
        Vec rgxa = init;
        kc::mul_rowscale_backward(rgxa.data(), nullptr, dy.data(), x.data(), rs.data(), rows, C, true);
        expect_close("mul_rowscale_backward dx accumulated", download(*gxa, rgxa.size(), dt), rgxa, tol(dt, 1.0, 0.0));
      }
      auto yw = output(x.size(), dt);
      kg::mul_weight_forward(yw->get(), dxin->get(), dw->get(), rows, C, dt, kStream);
      Vec ryw(x.size());
      kc::mul_weight_forward(ryw.data(), x.data(), w.data(), rows, C);
      expect_close("mul_weight_forward", download(*yw, ryw.size(), dt), ryw, tol(dt, 1.0, 0.0));
      auto gxw = output(x.size(), dt), gw = output(sz(C), dt);
      kg::mul_weight_backward(ctx, gxw->get(), gw->get(), ddy->get(), dxin->get(), dw->get(), rows, C, false, dt,
                              kStream);
      Vec rgxw(x.size()), rgw(sz(C));
      kc::mul_weight_backward(rgxw.data(), rgw.data(), dy.data(), x.data(), w.data(), rows, C, false);
      expect_close("mul_weight_backward dx", download(*gxw, rgxw.size(), dt), rgxw, tol(dt, 1.0, 0.0));
      expect_close("mul_weight_backward dw", download(*gw, rgw.size(), dt), rgw, tol(dt, 2.0, 1e-6 * static_cast<double>(rows)));

      // Fused, against the CPU chain in fp32 with HF's cast to the input dtype before the weight.
      Vec r32(sz(rows)), h32(x.size()), y32(x.size()), sq32(x.size());
      kc::pow2_forward(sq32.data(), x.data(), rows * C);
      kc::rms_rsqrt_forward(r32.data(), sq32.data(), rows, C, eps_rms);
      kc::mul_rowscale_forward(h32.data(), x.data(), r32.data(), rows, C);
      const Vec hd = rounded(h32, dt);
      kc::mul_weight_forward(y32.data(), hd.data(), w.data(), rows, C);
      auto y = output(x.size(), dt);
      Dev rstd(sz(rows) * 4);
      rstd.poison();
      kg::rmsnorm_forward(y->get(), rstd.as<float>(), dxin->get(), dw->get(), rows, C, eps_rms, dt, kStream);
      expect_close("rmsnorm_forward rstd", download(rstd, sz(rows), DType::fp32), r32, Tol{0.0, 1e-5, 1e-5});
      // h = x·r rounded to dt may round the other way than the CPU's when r differs in its
      // last fp32 bit: one more ulp of dt allowed.
      expect_close("rmsnorm_forward", download(*y, y32.size(), dt), y32,
                   Tol{1e-6, 2 * eps(dt) + 16 * 0x1p-23, band(dt)});
      // Backward: dh = dy w, dw = sum dy·round(h); dx through mul_rowscale, rms_rsqrt, pow2.
      Vec dh(x.size()), rdw(sz(C)), dx1(x.size()), drr(sz(rows)), dsq32(x.size()), rdx(x.size());
      kc::mul_weight_backward(dh.data(), rdw.data(), dy.data(), hd.data(), w.data(), rows, C, false);
      kc::mul_rowscale_backward(dx1.data(), drr.data(), dh.data(), x.data(), r32.data(), rows, C, false);
      kc::rms_rsqrt_backward(dsq32.data(), drr.data(), r32.data(), rows, C, false);
      rdx = dx1;
      kc::pow2_backward(rdx.data(), x.data(), dsq32.data(), rows * C, true);
      auto drstd = device(r32, DType::fp32);
      auto fx = output(x.size(), dt), fw = output(sz(C), dt);
      kg::rmsnorm_backward(ctx, fx->get(), fw->get(), ddy->get(), dxin->get(), drstd->as<float>(), dw->get(), rows, C,
                           false, dt, kStream);
      expect_close("rmsnorm_backward dx", download(*fx, rdx.size(), dt), rdx, tol_math(dt, 1e-5));
      expect_close("rmsnorm_backward dw", download(*fw, rdw.size(), dt), rdw, tol_math(dt, 1e-5));
    }
}

// ------------------------------------------------------------------------------------
// cross entropy
// ------------------------------------------------------------------------------------
TEST_CASE("cross entropy: fused forward (mean loss, lse) and backward, ignored rows, in place, deterministic") {
  kg::Context ctx;
  // Rows in 16-byte groups from each row's first boundary when the logits and their gradient
  // are congruent modulo 16 bytes (aligned, or both 2 elements past), element by element when
  // not (logits 2 elements past, the gradient aligned); rows narrower than a group.
  for (DType dt : kDtypes)
    for (std::int64_t V : {std::int64_t{5}, std::int64_t{1024}, std::int64_t{50257}})
    for (int layout = 0; layout < 3; ++layout) {
      CAPTURE(dtype_str(dt));
      CAPTURE(V);
      CAPTURE(layout);
      const std::size_t two = 2 * sz(dtype_size(dt)), xo = layout == 0 ? 0 : two, go = layout == 1 ? two : 0;
      const std::int64_t N = 19;
      const Vec x = rand_vec(N * V, 141, dt, -6.0f, 6.0f);
      std::vector<std::int64_t> tg(sz(N));
      for (std::int64_t i = 0; i < N; ++i)
        tg[sz(i)] = i % 5 == 2 ? kc::kIgnoreIndex : static_cast<std::int64_t>(kc::random_u32(142, sz(i)) % V);
      auto dxin = device(x, dt, xo);
      auto dtg = device_raw(tg);
      Dev loss(4), loss2(4), lse(sz(N) * 4);
      loss.poison();
      lse.poison();
      kg::cross_entropy_forward(ctx, loss.as<float>(), lse.as<float>(), dxin->get(), dtg->as<std::int64_t>(), N, V,
                                kg::kIgnoreIndex, dt, kStream);
      kg::cross_entropy_forward(ctx, loss2.as<float>(), nullptr, dxin->get(), dtg->as<std::int64_t>(), N, V,
                                kg::kIgnoreIndex, dt, kStream);
      Vec rlse(sz(N));
      const float rloss = kc::cross_entropy_forward(rlse.data(), x.data(), tg.data(), N, V);
      expect_close("cross_entropy_forward loss", download(loss, 1, DType::fp32), Vec{rloss}, Tol{0.0, 2e-6, 0.0});
      expect_close("cross_entropy_forward lse", download(lse, sz(N), DType::fp32), rlse, Tol{0.0, 2e-6, 0.0});
      expect_equal_bits("cross_entropy_forward loss", bits(loss), bits(loss2));
      const Vec init = rand_vec(N * V, 143, dt);
      for (bool with_lse : {true, false})
        for (bool acc : {false, true}) {
          CAPTURE(with_lse);
          CAPTURE(acc);
          auto g = acc ? device(init, dt, go) : output(x.size(), dt, go);
          kg::cross_entropy_backward(ctx, g->get(), dxin->get(), with_lse ? lse.as<float>() : nullptr,
                                     dtg->as<std::int64_t>(), N, V, 0.7f, acc, kg::kIgnoreIndex, dt, kStream);
          Vec r = acc ? init : Vec(x.size());
          kc::cross_entropy_backward(r.data(), x.data(), rlse.data(), tg.data(), N, V, 0.7f, acc);
          expect_close("cross_entropy_backward", download(*g, r.size(), dt), r, tol_math(dt, 1e-8));
        }
      // In place: dlogits over the logits themselves.
      auto inplace = device(x, dt, xo);
      kg::cross_entropy_backward(ctx, inplace->get(), inplace->get(), lse.as<float>(), dtg->as<std::int64_t>(), N, V,
                                 0.7f, false, kg::kIgnoreIndex, dt, kStream);
      Vec r(x.size());
      kc::cross_entropy_backward(r.data(), x.data(), rlse.data(), tg.data(), N, V, 0.7f, false);
      expect_close("cross_entropy_backward (in place)", download(*inplace, r.size(), dt), r, tol_math(dt, 1e-8));
    }
  // Padded rows (the fused loss's logits, models::Tensor::row_pitch): the same results, the
  // padding (NaN) neither read nor written.
  for (DType dt : kDtypes)
    for (std::int64_t V : {std::int64_t{5}, std::int64_t{50257}}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(V);
      const std::int64_t N = 19, ld = zp::kernels::padded_rows(V, dtype_size(dt));
      const Vec x = rand_vec(N * V, 145, dt, -6.0f, 6.0f);
      std::vector<std::int64_t> tg(sz(N));
      for (std::int64_t i = 0; i < N; ++i)
        tg[sz(i)] = i % 5 == 2 ? kc::kIgnoreIndex : static_cast<std::int64_t>(kc::random_u32(146, sz(i)) % V);
      auto dxin = device(pad_rows(x, N, V, ld), dt);
      auto dtg = device_raw(tg);
      Dev loss(4), lse(sz(N) * 4);
      kg::cross_entropy_forward(ctx, loss.as<float>(), lse.as<float>(), dxin->get(), dtg->as<std::int64_t>(), N, V,
                                kg::kIgnoreIndex, dt, kStream, ld);
      Vec rlse(sz(N));
      const float rloss = kc::cross_entropy_forward(rlse.data(), x.data(), tg.data(), N, V);
      expect_close("padded-rows cross_entropy_forward loss", download(loss, 1, DType::fp32), Vec{rloss},
                   Tol{0.0, 2e-6, 0.0});
      expect_close("padded-rows cross_entropy_forward lse", download(lse, sz(N), DType::fp32), rlse,
                   Tol{0.0, 2e-6, 0.0});
      const Vec init = rand_vec(N * V, 147, dt);
      for (bool acc : {false, true}) {
        CAPTURE(acc);
        auto g = device(pad_rows(acc ? init : Vec(sz(N * V), std::numeric_limits<float>::quiet_NaN()), N, V, ld), dt);
        kg::cross_entropy_backward(ctx, g->get(), dxin->get(), lse.as<float>(), dtg->as<std::int64_t>(), N, V, 0.7f,
                                   acc, kg::kIgnoreIndex, dt, kStream, ld);
        Vec r = acc ? init : Vec(x.size());
        kc::cross_entropy_backward(r.data(), x.data(), rlse.data(), tg.data(), N, V, 0.7f, acc);
        const Vec got = download(*g, sz(N * ld), dt);
        CHECK(padding_kept(got, N, V, ld));
        expect_close("padded-rows cross_entropy_backward", unpad_rows(got, N, V, ld), r, tol_math(dt, 1e-8));
      }
    }
  // Every target ignored: loss 0 and zero gradients; a NaN logit: NaN loss and lse.
  for (DType dt : kDtypes) {
    CAPTURE(dtype_str(dt));
    const std::int64_t N = 3, V = 100;
    Vec x = rand_vec(N * V, 144, dt);
    std::vector<std::int64_t> none(sz(N), kc::kIgnoreIndex);
    auto dxin = device(x, dt);
    auto dnone = device_raw(none);
    Dev loss(4);
    loss.poison();
    kg::cross_entropy_forward(ctx, loss.as<float>(), nullptr, dxin->get(), dnone->as<std::int64_t>(), N, V,
                              kg::kIgnoreIndex, dt, kStream);
    CHECK(download(loss, 1, DType::fp32)[0] == 0.0f);
    auto g = output(x.size(), dt);
    kg::cross_entropy_backward(ctx, g->get(), dxin->get(), nullptr, dnone->as<std::int64_t>(), N, V, 1.0f, false,
                               kg::kIgnoreIndex, dt, kStream);
    const Vec gz = download(*g, x.size(), dt);
    CHECK(std::all_of(gz.begin(), gz.end(), [](float v) { return v == 0.0f; }));
    x[sz(V + 17)] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::int64_t> tg = {1, 2, 3};
    auto dnan = device(x, dt);
    auto dtg = device_raw(tg);
    Dev lse(sz(N) * 4);
    kg::cross_entropy_forward(ctx, loss.as<float>(), lse.as<float>(), dnan->get(), dtg->as<std::int64_t>(), N, V,
                              kg::kIgnoreIndex, dt, kStream);
    CHECK(std::isnan(download(loss, 1, DType::fp32)[0]));
    const Vec l = download(lse, sz(N), DType::fp32);
    CHECK(std::isfinite(l[0]));
    CHECK(std::isnan(l[1]));
  }
}

TEST_CASE("log_softmax + nll_loss (the eager split) forward and backward") {
  kg::Context ctx;
  for (DType dt : kDtypes) {
    CAPTURE(dtype_str(dt));
    const std::int64_t N = 23, V = 777;
    const Vec x = rand_vec(N * V, 151, dt, -5.0f, 5.0f);
    std::vector<std::int64_t> tg(sz(N));
    for (std::int64_t i = 0; i < N; ++i)
      tg[sz(i)] = i % 7 == 3 ? kc::kIgnoreIndex : static_cast<std::int64_t>(kc::random_u32(152, sz(i)) % V);
    auto dxin = device(x, dt);
    auto dtg = device_raw(tg);
    auto lp = output(x.size(), dt);
    kg::log_softmax_forward(lp->get(), dxin->get(), N, V, dt, kStream);
    Vec rlp(x.size());
    kc::log_softmax_forward(rlp.data(), x.data(), N, V);
    const Vec glp = download(*lp, rlp.size(), dt);
    expect_close("log_softmax_forward", glp, rlp, tol_math(dt, 2e-6));
    Dev loss(4);
    loss.poison();
    kg::nll_loss_forward(loss.as<float>(), lp->get(), dtg->as<std::int64_t>(), N, V, kg::kIgnoreIndex, dt, kStream);
    const float rloss = kc::nll_loss_forward(glp.data(), tg.data(), N, V);
    expect_close("nll_loss_forward", download(loss, 1, DType::fp32), Vec{rloss}, Tol{0.0, 1e-6, 0.0});
    const Vec init = rand_vec(N * V, 153, dt);
    for (bool acc : {false, true}) {
      auto g = acc ? device(init, dt) : output(x.size(), dt);
      kg::log_softmax_nll_backward(ctx, g->get(), lp->get(), dtg->as<std::int64_t>(), N, V, 0.5f, acc,
                                   kg::kIgnoreIndex, dt, kStream);
      Vec r = acc ? init : Vec(x.size());
      kc::log_softmax_nll_backward(r.data(), glp.data(), tg.data(), N, V, 0.5f, acc);
      expect_close("log_softmax_nll_backward", download(*g, r.size(), dt), r, tol_math(dt, 1e-8));
    }
  }
}

// ------------------------------------------------------------------------------------
// embeddings
// ------------------------------------------------------------------------------------
TEST_CASE("embedding: gather, and the scatter-add gradient in the CPU's order (bit for bit), padding_idx, positions") {
  kg::Context ctx;
  for (DType dt : kDtypes)
    for (std::int64_t C : {std::int64_t{64}, std::int64_t{20}}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(C);
      const std::int64_t N = 300, V = 37;
      const Vec w = rand_vec(V * C, 161, dt), dy = rand_vec(N * C, 162, dt), init = rand_vec(V * C, 163, dt);
      std::vector<std::int64_t> ids(sz(N));
      for (std::int64_t i = 0; i < N; ++i) ids[sz(i)] = static_cast<std::int64_t>(kc::random_u32(164, sz(i)) % 11) * 3;
      auto dwt = device(w, dt), ddy = device(dy, dt);
      auto dids = device_raw(ids);
      auto y = output(sz(N * C), dt);
      kg::embedding_forward(y->get(), dids->as<std::int64_t>(), dwt->get(), N, C, dt, kStream);
      Vec ry(sz(N * C));
      kc::embedding_forward(ry.data(), ids.data(), w.data(), N, C);
      expect_close("embedding_forward", download(*y, ry.size(), dt), ry, Tol{});
      for (std::int64_t padding : {std::int64_t{-1}, std::int64_t{3}})
        for (bool acc : {false, true}) {
          CAPTURE(padding);
          CAPTURE(acc);
          auto g = acc ? device(init, dt) : output(w.size(), dt);
          kg::embedding_backward(ctx, g->get(), dids->as<std::int64_t>(), ddy->get(), N, V, C, padding, acc, dt,
                                 kStream);
          Vec r = acc ? init : Vec(w.size());
          kc::embedding_backward(r.data(), ids.data(), dy.data(), N, V, C, padding, acc);
          expect_close("embedding_backward", download(*g, r.size(), dt), stored(r, dt), Tol{});
        }
      // Position ids (nullptr): row i of the table for row i.
      const std::int64_t P = 30;
      auto yp = output(sz(P * C), dt);
      kg::embedding_forward(yp->get(), nullptr, dwt->get(), P, C, dt, kStream);
      Vec ryp(sz(P * C));
      kc::embedding_forward(ryp.data(), nullptr, w.data(), P, C);
      expect_close("embedding_forward (positions)", download(*yp, ryp.size(), dt), ryp, Tol{});
      for (bool acc : {false, true}) {
        auto g = acc ? device(init, dt) : output(w.size(), dt);
        kg::embedding_backward(ctx, g->get(), nullptr, ddy->get(), P, V, C, -1, acc, dt, kStream);
        Vec r = acc ? init : Vec(w.size());
        kc::embedding_backward(r.data(), nullptr, dy.data(), P, V, C, -1, acc);
        expect_close("embedding_backward (positions)", download(*g, r.size(), dt), stored(r, dt), Tol{});
      }
    }
  // Heavily repeated ids (runs spanning many chunks of sorted rows): every id 0, a tiny
  // vocabulary, and one id making up ~40% of the tokens among random others; the padding
  // run sits among the others and still takes its sorted rows.
  struct Repeated {
    const char* name;
    std::int64_t V, padding;
  };
  const std::int64_t N = 5000;
  kg::ContextOptions small_options;
  small_options.scratch_bytes = std::size_t{200} << 10;  // about 50 columns of partial sums at a time
  kg::Context small(small_options);
  for (const Repeated& rep : {Repeated{"all zero", 2, 0}, Repeated{"tiny vocabulary", 3, 1},
                              Repeated{"one id 40%", 1000, 0}}) {
    std::vector<std::int64_t> ids(sz(N));
    for (std::int64_t i = 0; i < N; ++i) {
      const std::uint32_t r = kc::random_u32(171, sz(i));
      if (rep.V == 2)
        ids[sz(i)] = 0;
      else if (rep.V == 3)
        ids[sz(i)] = r % 3;
      else
        ids[sz(i)] = r % 20 < 8 ? 103 : r % 20 == 8 ? 0 : static_cast<std::int64_t>(kc::random_u32(172, sz(i)) % 1000);
    }
    auto dids = device_raw(ids);
    for (DType dt : kDtypes)
      for (std::int64_t C : {std::int64_t{20}, std::int64_t{300}}) {
        const Vec dy = rand_vec(N * C, 173, dt), init = rand_vec(rep.V * C, 174, dt);
        auto ddy = device(dy, dt);
        for (std::int64_t padding : {std::int64_t{-1}, rep.padding})
          for (bool acc : {false, true}) {
            CAPTURE(rep.name);
            CAPTURE(dtype_str(dt));
            CAPTURE(C);
            CAPTURE(padding);
            CAPTURE(acc);
            auto g = acc ? device(init, dt) : output(init.size(), dt);
            kg::embedding_backward(ctx, g->get(), dids->as<std::int64_t>(), ddy->get(), N, rep.V, C, padding, acc, dt,
                                   kStream);
            Vec r = acc ? init : Vec(init.size());
            kc::embedding_backward(r.data(), ids.data(), dy.data(), N, rep.V, C, padding, acc);
            expect_close("embedding_backward (repeated ids)", download(*g, r.size(), dt), stored(r, dt), Tol{});
            if (C == 300) {
              // A scratch too small for every column at once: slabs of columns, the same bits.
              auto g2 = acc ? device(init, dt) : output(init.size(), dt);
              kg::embedding_backward(small, g2->get(), dids->as<std::int64_t>(), ddy->get(), N, rep.V, C, padding, acc,
                                     dt, kStream);
              expect_equal_bits("embedding_backward (slabs of columns)", bits(*g), bits(*g2));
            }
          }
      }
  }
  // One too small for 16 columns: refused with the sizes, nothing written.
  kg::ContextOptions tiny_options;
  tiny_options.scratch_bytes = std::size_t{64} << 10;
  kg::Context tiny(tiny_options);
  const Vec dy = rand_vec(N * 16, 175, DType::fp32);
  auto ddy = device(dy, DType::fp32);
  std::vector<std::int64_t> ids(sz(N), 1);
  auto dids = device_raw(ids);
  const Vec table = rand_vec(2 * 16, 176, DType::fp32);
  for (bool acc : {true, false}) {
    auto g = device(table, DType::fp32);
    CHECK_THROWS_AS(kg::embedding_backward(tiny, g->get(), dids->as<std::int64_t>(), ddy->get(), N, 2, 16, -1, acc,
                                           DType::fp32, kStream),
                    kg::CudaError);
    expect_equal_bits("embedding_backward refused", bits(*g), bits(*device(table, DType::fp32)));
  }
}

// ------------------------------------------------------------------------------------
// optimizers
// ------------------------------------------------------------------------------------
TEST_CASE("Adam, AdamW, SGD on flat fp32 partitions: the CPU's bits, step after step") {
  const std::int64_t n = 70001;  // two chunks of a block each
  kc::AdamConfig adam;
  adam.lr = 1e-3;
  kc::AdamConfig adam_l2 = adam;
  adam_l2.weight_decay = 0.01;
  kc::AdamConfig adamw = adam_l2;
  adamw.decoupled = true;
  kc::AdamConfig low_beta = adamw;  // 1 - beta1 >= 0.5: torch.lerp's other branch
  low_beta.beta1 = 0.3;
  low_beta.beta2 = 0.95;
  for (const kc::AdamConfig& cfg : {adam, adam_l2, adamw, low_beta}) {
    CAPTURE(cfg.weight_decay);
    CAPTURE(cfg.decoupled);
    CAPTURE(cfg.beta1);
    Vec p = rand_vec(n, 171, DType::fp32), m(sz(n), 0.0f), v(sz(n), 0.0f);
    auto dp = device(p, DType::fp32), dm = device(m, DType::fp32), dv = device(v, DType::fp32);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const Vec g = rand_vec(n, 172 + static_cast<std::uint64_t>(step), DType::fp32, -0.1f, 0.1f);
      auto dg = device(g, DType::fp32);
      kg::adam_step(dp->as<float>(), dg->as<float>(), dm->as<float>(), dv->as<float>(), n, step, cfg, kStream);
      kc::adam_step(p.data(), g.data(), m.data(), v.data(), n, step, cfg);
    }
    expect_close("adam p", download(*dp, sz(n), DType::fp32), p, Tol{});
    expect_close("adam m", download(*dm, sz(n), DType::fp32), m, Tol{});
    expect_close("adam v", download(*dv, sz(n), DType::fp32), v, Tol{});
  }
  kc::SgdConfig sgd;
  sgd.lr = 0.05;
  kc::SgdConfig momentum = sgd;
  momentum.momentum = 0.9;
  momentum.dampening = 0.1;
  momentum.weight_decay = 1e-4;
  kc::SgdConfig nesterov = momentum;
  nesterov.dampening = 0.0;
  nesterov.nesterov = true;
  for (const kc::SgdConfig& cfg : {sgd, momentum, nesterov}) {
    CAPTURE(cfg.momentum);
    CAPTURE(cfg.nesterov);
    Vec p = rand_vec(n, 181, DType::fp32), buf(sz(n), 0.0f);
    auto dp = device(p, DType::fp32), dbuf = device(buf, DType::fp32);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const Vec g = rand_vec(n, 182 + static_cast<std::uint64_t>(step), DType::fp32);
      auto dg = device(g, DType::fp32);
      kg::sgd_step(dp->as<float>(), dg->as<float>(), cfg.momentum != 0.0 ? dbuf->as<float>() : nullptr, n, step, cfg,
                   kStream);
      kc::sgd_step(p.data(), g.data(), cfg.momentum != 0.0 ? buf.data() : nullptr, n, step, cfg);
    }
    expect_close("sgd p", download(*dp, sz(n), DType::fp32), p, Tol{});
    if (cfg.momentum != 0.0) expect_close("sgd momentum", download(*dbuf, sz(n), DType::fp32), buf, Tol{});
  }
  // An unscaling factor (fp16's 1 / loss scale; not a power of two here, so the product
  // rounds) applied as the kernels read the gradient: the bits of the CPU's scale_inplace
  // and then the step, with the device's gradient left as it was.
  {
    const float factor = 1.0f / 3000.0f;
    Vec p = rand_vec(n, 191, DType::fp32), m(sz(n), 0.0f), v(sz(n), 0.0f), q = p, buf(sz(n), 0.0f);
    auto dp = device(p, DType::fp32), dm = device(m, DType::fp32), dv = device(v, DType::fp32);
    auto dq = device(q, DType::fp32), dbuf = device(buf, DType::fp32);
    for (std::int64_t step = 1; step <= 2; ++step) {
      const Vec g = rand_vec(n, 192 + static_cast<std::uint64_t>(step), DType::fp32, -300.0f, 300.0f);
      auto dg = device(g, DType::fp32);
      kg::adam_step(dp->as<float>(), dg->as<float>(), dm->as<float>(), dv->as<float>(), n, step, adamw, kStream,
                    factor);
      kg::sgd_step(dq->as<float>(), dg->as<float>(), dbuf->as<float>(), n, step, momentum, kStream, factor);
      expect_equal_bits("the gradient, unscaled as read", bits(*dg), bits(*device(g, DType::fp32)));
      Vec gs = g;
      kc::scale_inplace(gs.data(), n, factor);
      kc::adam_step(p.data(), gs.data(), m.data(), v.data(), n, step, adamw);
      kc::sgd_step(q.data(), gs.data(), buf.data(), n, step, momentum);
    }
    expect_close("adam p, unscaled", download(*dp, sz(n), DType::fp32), p, Tol{});
    expect_close("adam m, unscaled", download(*dm, sz(n), DType::fp32), m, Tol{});
    expect_close("adam v, unscaled", download(*dv, sz(n), DType::fp32), v, Tol{});
    expect_close("sgd p, unscaled", download(*dq, sz(n), DType::fp32), q, Tol{});
    expect_close("sgd momentum, unscaled", download(*dbuf, sz(n), DType::fp32), buf, Tol{});
    kg::StepOptions both;
    Dev scale(4);
    both.grad_scale = scale.as<float>();
    both.grad_factor = 0.5f;
    kg::AdamTensor t{dp->as<float>(), dq->as<float>(), dm->as<float>(), dv->as<float>(), nullptr, n};
    CHECK_THROWS_AS(kg::adam_step_multi(&t, 1, 3, adamw, both, kStream), std::invalid_argument);
  }
}

TEST_CASE("multi-tensor Adam: many partitions in one launch, device-side unscaling, the skip flag, 16-bit copies") {
  kc::AdamConfig cfg;
  cfg.lr = 2e-3;
  cfg.weight_decay = 0.1;
  cfg.decoupled = true;
  for (DType p16 : {DType::bf16, DType::fp16}) {
    CAPTURE(dtype_str(p16));
    // 30 partitions (more than one launch holds), one empty, one of several chunks.
    std::vector<std::int64_t> sizes;
    for (int i = 0; i < 30; ++i) sizes.push_back(i == 4 ? 0 : i == 7 ? 200000 : 1000 + 37 * i);
    std::vector<Vec> p, g, m, v;
    std::vector<std::unique_ptr<Dev>> dp, dg, dm, dv, dh;
    std::vector<kg::AdamTensor> tensors;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::int64_t n = sizes[i];
      p.push_back(rand_vec(n, 190 + i, DType::fp32));
      g.push_back(rand_vec(n, 290 + i, DType::fp32, -50.0f, 50.0f));
      m.push_back(rand_vec(n, 390 + i, DType::fp32, -0.01f, 0.01f));
      v.push_back(rand_vec(n, 490 + i, DType::fp32, 0.0f, 1e-4f));
      dp.push_back(device(p.back(), DType::fp32));
      dg.push_back(device(g.back(), DType::fp32));
      dm.push_back(device(m.back(), DType::fp32));
      dv.push_back(device(v.back(), DType::fp32));
      dh.push_back(output(sz(n), p16));
      kg::AdamTensor t;
      t.p = dp.back()->as<float>();
      t.g = dg.back()->as<float>();
      t.m = dm.back()->as<float>();
      t.v = dv.back()->as<float>();
      t.p16 = dh.back()->get();
      t.n = n;
      tensors.push_back(t);
    }
    const float inv_scale = 1.0f / 64.0f;
    auto dscale = device(Vec{inv_scale}, DType::fp32);
    auto dskip = device_raw(std::vector<int>{1});
    kg::StepOptions opt;
    opt.grad_scale = dscale->as<float>();
    opt.skip = dskip->as<int>();
    opt.p16_dtype = p16;
    kg::adam_step_multi(tensors.data(), tensors.size(), 1, cfg, opt, kStream);  // skipped: nothing moves
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(i);
      expect_close("skipped step p", download(*dp[i], sz(sizes[i]), DType::fp32), p[i], Tol{});
      expect_close("skipped step m", download(*dm[i], sz(sizes[i]), DType::fp32), m[i], Tol{});
    }
    opt.skip = nullptr;
    kg::adam_step_multi(tensors.data(), tensors.size(), 1, cfg, opt, kStream);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(i);
      const std::int64_t n = sizes[i];
      kc::scale_inplace(g[i].data(), n, inv_scale);
      kc::adam_step(p[i].data(), g[i].data(), m[i].data(), v[i].data(), n, 1, cfg);
      expect_close("multi p", download(*dp[i], sz(n), DType::fp32), p[i], Tol{});
      expect_close("multi m", download(*dm[i], sz(n), DType::fp32), m[i], Tol{});
      expect_close("multi v", download(*dv[i], sz(n), DType::fp32), v[i], Tol{});
      expect_close("multi p16", download(*dh[i], sz(n), p16), stored(p[i], p16), Tol{});
    }
  }
}

TEST_CASE("scale_inplace, its device-factor form, and the overflow check on the device") {
  const std::int64_t n = 9001;
  for (DType dt : kDtypes) {
    CAPTURE(dtype_str(dt));
    const Vec x = rand_vec(n, 201, dt, -4.0f, 4.0f);
    auto d = device(x, dt);
    kg::scale_inplace(d->get(), n, 0.125f, dt, kStream);
    Vec r = x;
    kc::scale_inplace(r.data(), n, 0.125f);
    expect_close("scale_inplace", download(*d, sz(n), dt), stored(r, dt), Tol{});
    auto factor = device(Vec{-3.0f}, DType::fp32);
    kg::scale_inplace_device(d->get(), n, factor->as<float>(), dt, kStream);
    kc::scale_inplace(r.data(), n, -3.0f);
    expect_close("scale_inplace_device", download(*d, sz(n), dt), stored(r, dt), Tol{});

    Dev found(sizeof(int));
    found.poison();
    auto clean = device(x, dt);
    kg::has_inf_or_nan(found.as<int>(), clean->get(), n, false, dt, kStream);
    CHECK(download_raw<int>(found, 1)[0] == 0);
    CHECK_FALSE(kc::has_inf_or_nan(x.data(), n));
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      Vec y = x;
      y[sz(n - 3)] = bad;
      auto dy = device(y, dt);
      kg::has_inf_or_nan(found.as<int>(), dy->get(), n, false, dt, kStream);
      CHECK(download_raw<int>(found, 1)[0] == 1);
      CHECK(kc::has_inf_or_nan(y.data(), n));
      // accumulate keeps an earlier overflow through a clean buffer
      kg::has_inf_or_nan(found.as<int>(), clean->get(), n, true, dt, kStream);
      CHECK(download_raw<int>(found, 1)[0] == 1);
    }
    if (dt == DType::fp16) {  // the largest fp16 is finite
      Vec y = x;
      y[0] = 65504.0f;
      auto dy = device(y, dt);
      kg::has_inf_or_nan(found.as<int>(), dy->get(), n, false, dt, kStream);
      CHECK(download_raw<int>(found, 1)[0] == 0);
    }
  }
}

// ------------------------------------------------------------------------------------
// reductions
// ------------------------------------------------------------------------------------
TEST_CASE("sum_squares and sum: the CPU's value to double rounding, the same bits twice, accumulated over buffers") {
  kg::Context ctx;
  for (DType dt : kDtypes)
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{1000003}}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(n);
      const Vec x = rand_vec(n, 211, dt, -2.0f, 3.0f), y = rand_vec(n, 212, dt);
      auto dxin = device(x, dt, 4), dy = device(y, dt);  // x misaligned: the scalar path
      Dev out(8), out2(8);
      out.poison();
      kg::sum_squares(ctx, out.as<double>(), dxin->get(), n, false, dt, kStream);
      kg::sum_squares(ctx, out2.as<double>(), dxin->get(), n, false, dt, kStream);
      const double rss = kc::sum_squares(x.data(), n);
      const double got = download_raw<double>(out, 1)[0];
      CHECK(std::fabs(got - rss) <= 1e-12 * std::fabs(rss));
      expect_equal_bits("sum_squares", bits(out), bits(out2));
      kg::sum_squares(ctx, out.as<double>(), dy->get(), n, true, dt, kStream);
      const double both = rss + kc::sum_squares(y.data(), n);
      CHECK(std::fabs(download_raw<double>(out, 1)[0] - both) <= 1e-12 * std::fabs(both));
      kg::sum(ctx, out.as<double>(), dy->get(), n, false, dt, kStream);
      const double rs = kc::sum(y.data(), n);
      double sabs = 0.0;
      for (float v : y) sabs += std::fabs(static_cast<double>(v));
      CHECK(std::fabs(download_raw<double>(out, 1)[0] - rs) <= 1e-12 * sabs);
      // The executor's norm tells a non-finite gradient by its sum of squares alone (no second
      // pass): one inf or NaN anywhere, on the vector path or in the tail, makes it non-finite;
      // the largest finite values do not.
      for (const std::int64_t at : {std::int64_t{0}, n / 2, n - 1})
        for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
          Vec z = y;
          z[static_cast<std::size_t>(at)] = bad;
          auto dz = device(z, dt);
          kg::sum_squares(ctx, out.as<double>(), dz->get(), n, false, dt, kStream);
          CHECK_FALSE(std::isfinite(download_raw<double>(out, 1)[0]));
        }
      Vec big(static_cast<std::size_t>(n), dt == DType::fp16 ? 65504.0f : std::numeric_limits<float>::max());
      if (dt == DType::bf16) big.assign(big.size(), 3.3895314e38f);  // the largest finite bf16
      auto dbig = device(big, dt);
      kg::sum_squares(ctx, out.as<double>(), dbig->get(), n, false, dt, kStream);
      CHECK(std::isfinite(download_raw<double>(out, 1)[0]));
    }
}

TEST_CASE("multi-run copies, additions, zero-fills and sums of squares: the one-run kernels' results in one launch") {
  // 100 runs (three launches of at most 48), of 1 to 70000 elements, some starting off the
  // 16-byte grid (the scalar path), each in its own place in one buffer: the one-run calls
  // (convert, add_mixed, a memset; sum_squares) on a second copy give the same bits, except
  // the norm's double sum, whose order differs (the CPU's value within 1e-12, the same bits
  // twice).
  kg::Context ctx;
  const std::int64_t sizes[] = {1, 7, 8, 9, 100, 8192, 8193, 70000, 31, 1000};
  for (DType ydt : kDtypes)
    for (DType xdt : kDtypes) {
      CAPTURE(dtype_str(ydt));
      CAPTURE(dtype_str(xdt));
      std::vector<std::pair<std::int64_t, std::int64_t>> at;  // element offset, count
      std::int64_t total = 0;
      for (int r = 0; r < 100; ++r) {
        const std::int64_t n = sizes[r % 10];
        const std::int64_t skew = r % 3 == 1 ? 3 : 0;  // off the 16-byte grid
        at.emplace_back(total + skew, n);
        total += skew + n + 64;
      }
      const Vec x = rand_vec(total, 71, xdt, -3.0f, 3.0f), y0 = rand_vec(total, 72, ydt, -3.0f, 3.0f);
      auto dx = device(x, xdt);
      for (const auto mode : {kg::MultiMode::copy, kg::MultiMode::add, kg::MultiMode::zero}) {
        CAPTURE(static_cast<int>(mode));
        auto got = device(y0, ydt), want = device(y0, ydt);
        std::vector<kg::MultiRun> runs;
        const std::size_t ys = sz(dtype_size(ydt)), xs = sz(dtype_size(xdt));
        for (const auto& [off, n] : at) {
          runs.push_back({got->as<char>() + sz(off) * ys, dx->as<char>() + sz(off) * xs, n});
          char* w = want->as<char>() + sz(off) * ys;
          const char* xp = dx->as<char>() + sz(off) * xs;
          switch (mode) {
            case kg::MultiMode::copy: kg::convert(w, ydt, xp, xdt, n, kStream); break;
            case kg::MultiMode::add: kg::add_mixed(w, ydt, xp, xdt, n, kStream); break;
            case kg::MultiMode::zero: ZP_TEST_CUDA(cudaMemsetAsync(w, 0, sz(n) * ys, kStream)); break;
          }
        }
        kg::multi_map(runs.data(), static_cast<std::int64_t>(runs.size()), mode, ydt, xdt, kStream);
        expect_equal_bits("multi_map", bits(*got), bits(*want));
      }
      // Two sources (the flatten of stage 2's two partitions): a copy of x + x2 summed in fp32,
      // the bits of a copy followed by an addition where the copy is exact (y in x's dtype or
      // fp32). Every fourth run's x2 starts 5 elements past its x, so that runs whose x is on
      // the 16-byte grid have an x2 off it (the element-wise path for both).
      const Vec x2 = rand_vec(total + 8, 73, xdt, -3.0f, 3.0f);
      auto dx2 = device(x2, xdt);
      auto x2_at = [&](std::int64_t off, std::size_t r) { return off + (r % 4 == 2 ? 5 : 0); };
      if (ydt == xdt || ydt == DType::fp32) {
        auto got = device(y0, ydt), want = device(y0, ydt);
        std::vector<kg::MultiRun> runs;
        const std::size_t ys = sz(dtype_size(ydt)), xs = sz(dtype_size(xdt));
        for (std::size_t r = 0; r < at.size(); ++r) {
          const auto [off, n] = at[r];
          const char* xp = dx->as<char>() + sz(off) * xs;
          const char* x2p = dx2->as<char>() + sz(x2_at(off, r)) * xs;
          runs.push_back({got->as<char>() + sz(off) * ys, xp, n, x2p});
          char* w = want->as<char>() + sz(off) * ys;
          kg::convert(w, ydt, xp, xdt, n, kStream);
          kg::add_mixed(w, ydt, x2p, xdt, n, kStream);
        }
        kg::multi_map(runs.data(), static_cast<std::int64_t>(runs.size()), kg::MultiMode::copy, ydt, xdt, kStream);
        expect_equal_bits("multi_map, two sources", bits(*got), bits(*want));
        CHECK_THROWS_AS(kg::multi_map(runs.data(), 1, kg::MultiMode::add, ydt, xdt, kStream), std::logic_error);
      }
      if (ydt != xdt) continue;
      {
        std::vector<kg::MultiRun> runs;
        double ref = 0.0;
        for (std::size_t r = 0; r < at.size(); ++r) {
          const auto [off, n] = at[r];
          runs.push_back({nullptr, dx->as<char>() + sz(off) * sz(dtype_size(xdt)), n,
                          dx2->as<char>() + sz(x2_at(off, r)) * sz(dtype_size(xdt))});
          for (std::int64_t i = 0; i < n; ++i) {
            const double v = x[sz(off + i)] + x2[sz(x2_at(off, r) + i)];  // the fp32 sum, squared in double
            ref += v * v;
          }
        }
        Dev out(8);
        ZP_TEST_CUDA(cudaMemset(out.get(), 0, 8));
        kg::multi_sum_squares(ctx, out.as<double>(), runs.data(), static_cast<std::int64_t>(runs.size()), xdt, kStream);
        CHECK(std::fabs(download_raw<double>(out, 1)[0] - ref) <= 1e-12 * ref);
      }
      std::vector<kg::MultiRun> runs;
      double ref = 0.0;
      for (const auto& [off, n] : at) {
        runs.push_back({nullptr, dx->as<char>() + sz(off) * sz(dtype_size(xdt)), n});
        ref += kc::sum_squares(x.data() + off, n);
      }
      Dev out(8), out2(8);
      ZP_TEST_CUDA(cudaMemset(out.get(), 0, 8));
      ZP_TEST_CUDA(cudaMemset(out2.get(), 0, 8));
      kg::multi_sum_squares(ctx, out.as<double>(), runs.data(), static_cast<std::int64_t>(runs.size()), xdt, kStream);
      kg::multi_sum_squares(ctx, out2.as<double>(), runs.data(), static_cast<std::int64_t>(runs.size()), xdt, kStream);
      const double got = download_raw<double>(out, 1)[0];
      CHECK(std::fabs(got - ref) <= 1e-12 * ref);
      expect_equal_bits("multi_sum_squares", bits(out), bits(out2));
      // It adds into what is there.
      kg::multi_sum_squares(ctx, out.as<double>(), runs.data(), 1, xdt, kStream);
      CHECK(download_raw<double>(out, 1)[0] > got);
    }
}

// ------------------------------------------------------------------------------------
// fused attention
// ------------------------------------------------------------------------------------
namespace {

// got - base against ref - base: the gradient a kernel added into a random initial value.
// Elementwise: the rounding of the stored sum (an ulp of dt at |ref|) plus 10 bands of the
// gradient's rms, plus `floor`, an absolute bound on rounding noise that does not shrink
// with the gradient (see the single-key case below). Overall: the relative L2 error of the
// added gradient within rel_l2, the same floor allowed on top (‖got − ref‖ <= rel_l2·‖ref −
// base‖ + √n·floor): a gradient that vanishes has no relative error to speak of.
void expect_added(const std::string& what, const Vec& got, const Vec& ref, const Vec& base, double rel_l2,
                  double floor, DType dt) {
  double ss = 0.0, num = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double r = static_cast<double>(ref[i]) - base[i], g = static_cast<double>(got[i]) - base[i];
    ss += r * r;
    num += (g - r) * (g - r);
  }
  const double n = static_cast<double>(std::max<std::size_t>(got.size(), 1));
  const double rms = std::sqrt(ss / n);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double allowed = 10.0 * rel_l2 * rms + eps(dt) * std::fabs(ref[i]) + floor;
    const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(diff <= allowed) && bad++ < 8)
      std::printf("  %s: element %zu: got %.9g, expected %.9g (allowed %.3g)\n", what.c_str(), i, got[i], ref[i],
                  allowed);
  }
  CHECK(bad == 0);
  const double rel = std::sqrt(num) / std::max(std::sqrt(ss), 1e-300);
  INFO(what << ": relative L2 error of the added gradient " << rel << ", band " << rel_l2 << ", rms difference "
            << std::sqrt(num / n) << ", floor " << floor);
  CHECK(std::sqrt(num) <= rel_l2 * std::sqrt(ss) + std::sqrt(n) * floor);
}

// The largest |x|, and the largest sum of |x| over a row of D.
double max_abs(const Vec& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}
double max_row_l1(const Vec& v, std::int64_t D) {
  double m = 0.0;
  for (std::size_t r = 0; r < v.size() / sz(D); ++r) {
    double s = 0.0;
    for (std::size_t d = 0; d < sz(D); ++d) s += std::fabs(static_cast<double>(v[r * sz(D) + d]));
    m = std::max(m, s);
  }
  return m;
}

}  // namespace

TEST_CASE("sdpa: flash forward (O, logsumexp) and deterministic backward against the CPU twin, causal, masks, dropout") {
  // The backward in steps of 16 positions (the default) and of 32 (ContextOptions): the same
  // products in the same order, so the same bits. In one pass (16-bit, D <= 64): dK and dV
  // the same bits, dQ summed in another order (against the CPU twin, and deterministic).
  // With K and V held in registers (kv_registers true): the default's bits.
  std::map<std::string, std::array<std::vector<unsigned char>, 3>> chunk16;
  for (const auto& [chunk, one_pass, kv_registers] :
       {std::tuple{16, false, false}, std::tuple{32, false, false}, std::tuple{16, true, false},
        std::tuple{32, true, false}, std::tuple{16, false, true}}) {
    CAPTURE(chunk);
    CAPTURE(one_pass);
    CAPTURE(kv_registers);
    kg::ContextOptions options;
    options.sdpa_backward_chunk = chunk;
    options.sdpa_backward_one_pass = one_pass;
    options.sdpa_backward_kv_registers = kv_registers;
    kg::Context ctx(options);
    struct Case {
      std::int64_t B, H, T, D;
      bool causal, mask;
      float p;
    };
    const Case cases[] = {{2, 2, 130, 64, true, false, 0.0f},  {2, 2, 130, 64, true, false, 0.1f},
                          {2, 3, 130, 64, false, true, 0.1f},  {1, 2, 37, 16, false, true, 0.0f},
                          {1, 2, 96, 128, true, false, 0.1f},  {2, 1, 1, 32, false, false, 0.0f},
                          {1, 1, 200, 32, true, true, 0.2f}};
    for (DType dt : kDtypes)
      for (const Case& c : cases) {
        CAPTURE(dtype_str(dt));
        CAPTURE(c.T);
        CAPTURE(c.D);
        CAPTURE(c.causal);
        CAPTURE(c.mask);
        CAPTURE(c.p);
        const std::int64_t n = c.B * c.H * c.T * c.D, rows = c.B * c.H * c.T;
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
        const std::uint64_t seed = 4242, offset = std::uint64_t{9} << 32;
        const Vec q = rand_vec(n, 221, dt, -2.0f, 2.0f), k = rand_vec(n, 222, dt, -2.0f, 2.0f), v = rand_vec(n, 223, dt);
        Vec mask(sz(c.B * c.T), 0.0f);
        for (std::int64_t b = 0; b < c.B; ++b)
          for (std::int64_t j = std::max<std::int64_t>(1, c.T - 3 * (b + 1)); j < c.T; ++j) mask[sz(b * c.T + j)] = kg::mask_value(dt);
        auto dq_in = device(q, dt), dk_in = device(k, dt), dv_in = device(v, dt), dmask = device(mask, dt);
        const void* mp = c.mask ? dmask->get() : nullptr;
        const float* cmp = c.mask ? mask.data() : nullptr;
        auto o = output(sz(n), dt);
        Dev lse(sz(rows) * 4);
        lse.poison();
        kg::sdpa_forward(o->get(), lse.as<float>(), dq_in->get(), dk_in->get(), dv_in->get(), mp, c.B, c.H, c.T, c.D,
                         c.causal, scale, c.p, seed, offset, dt, kStream);
        Vec ro(sz(n)), rlse(sz(rows));
        kc::sdpa_forward(ro.data(), rlse.data(), q.data(), k.data(), v.data(), cmp, c.B, c.H, c.T, c.D, c.causal, scale,
                         c.p, seed, offset);
        const Vec go = download(*o, sz(n), dt);
        // P is rounded to dt before P·V (as flash-attention does): a few ulps of dt on average.
        expect_close("sdpa_forward O", go, ro,
                     Tol{dt == DType::fp32 ? 1e-5 : 0.2 * eps(dt), eps(dt) + 16 * 0x1p-23, band(dt)});
        expect_close("sdpa_forward lse", download(lse, sz(rows), DType::fp32), rlse, Tol{1e-5, 1e-5, 0.0});

        const Vec dout = rand_vec(n, 224, dt);
        const Vec qi = rand_vec(n, 225, dt, -0.01f, 0.01f), ki = rand_vec(n, 226, dt, -0.01f, 0.01f),
                  vi = rand_vec(n, 227, dt, -0.01f, 0.01f);
        auto ddout = device(dout, dt);
        Vec rdq = qi, rdk = ki, rdv = vi;
        kc::sdpa_backward(rdq.data(), rdk.data(), rdv.data(), dout.data(), q.data(), k.data(), v.data(), rlse.data(),
                          cmp, c.B, c.H, c.T, c.D, c.causal, scale, c.p, seed, offset);
        std::vector<unsigned char> first[3];
        for (int run = 0; run < 2; ++run) {
          auto gdq = device(qi, dt), gdk = device(ki, dt), gdv = device(vi, dt);
          kg::sdpa_backward(ctx, gdq->get(), gdk->get(), gdv->get(), ddout->get(), dq_in->get(), dk_in->get(),
                            dv_in->get(), o->get(), lse.as<float>(), mp, c.B, c.H, c.T, c.D, c.causal, scale, c.p, seed,
                            offset, dt, kStream);
          if (run == 0) {
            // dS is rounded to dt before its products, and O (in dt) gives the row terms.
            const double b = dt == DType::fp32 ? 1e-4 : 2.0 * band(dt);
            double floor = dt == DType::fp32 ? 1e-6 : 1e-4;
            if (c.T == 1 && c.p == 0.0f) {
              // A single key: P = 1 and O = V, so dS = dP − rowsum(dO∘O) vanishes in exact
              // arithmetic and dQ = scale·dS·K, dK = scale·dS·Q are what rounding leaves: each
              // of the two length-D fp32 dot products errs by at most γ_D·‖dO_row‖₁·max|V|
              // (γ_D ≈ D·2^-24, Higham §3.1), so |dS| <= 2γ_D·‖dO_row‖₁·max|V| on each side, and
              // GPU and CPU differ by at most twice scale·max|Q, K| times that. (On the H200 at
              // D = 32 the fp32 difference was 3e-8 rms.)
              const double gamma = static_cast<double>(c.D) * 0x1p-24;
              floor = std::max(floor, 2.0 * 2.0 * gamma * static_cast<double>(scale) * std::max(max_abs(q), max_abs(k)) *
                                          max_row_l1(dout, c.D) * max_abs(v));
            }
            expect_added("sdpa_backward dq", download(*gdq, sz(n), dt), rdq, qi, b, floor, dt);
            expect_added("sdpa_backward dk", download(*gdk, sz(n), dt), rdk, ki, b, floor, dt);
            expect_added("sdpa_backward dv", download(*gdv, sz(n), dt), rdv, vi, b, floor, dt);
            first[0] = bits(*gdq);
            first[1] = bits(*gdk);
            first[2] = bits(*gdv);
            const std::string key = dtype_str(dt) + " case " + std::to_string(&c - cases);
            if (chunk == 16 && !one_pass && !kv_registers) {
              chunk16[key] = {first[0], first[1], first[2]};
            } else {
              if (!one_pass || dt == DType::fp32 || c.D > 64)
                expect_equal_bits("sdpa_backward dq against steps of 16", chunk16.at(key)[0], first[0]);
              expect_equal_bits("sdpa_backward dk against steps of 16", chunk16.at(key)[1], first[1]);
              expect_equal_bits("sdpa_backward dv against steps of 16", chunk16.at(key)[2], first[2]);
            }
          } else {
            expect_equal_bits("sdpa_backward dq", first[0], bits(*gdq));
            expect_equal_bits("sdpa_backward dk", first[1], bits(*gdk));
            expect_equal_bits("sdpa_backward dv", first[2], bits(*gdv));
          }
        }
        // Written (SdpaAccumulate false) into memory holding NaN: the bits of adding into
        // zeros, each of dq, dk, dv on its own.
        const Vec zeros(sz(n), 0.0f);
        auto zq = device(zeros, dt), zk = device(zeros, dt), zv = device(zeros, dt);
        kg::sdpa_backward(ctx, zq->get(), zk->get(), zv->get(), ddout->get(), dq_in->get(), dk_in->get(), dv_in->get(),
                          o->get(), lse.as<float>(), mp, c.B, c.H, c.T, c.D, c.causal, scale, c.p, seed, offset, dt,
                          kStream);
        for (int w = 0; w < 3; ++w) {
          const kg::SdpaAccumulate acc{w != 0, w != 1, w != 2};
          auto wq = w == 0 ? output(sz(n), dt) : device(zeros, dt), wk = w == 1 ? output(sz(n), dt) : device(zeros, dt),
               wv = w == 2 ? output(sz(n), dt) : device(zeros, dt);
          kg::sdpa_backward(ctx, wq->get(), wk->get(), wv->get(), ddout->get(), dq_in->get(), dk_in->get(),
                            dv_in->get(), o->get(), lse.as<float>(), mp, c.B, c.H, c.T, c.D, c.causal, scale, c.p, seed,
                            offset, dt, kStream, acc);
          expect_equal_bits("sdpa_backward dq written", bits(*zq), bits(*wq));
          expect_equal_bits("sdpa_backward dk written", bits(*zk), bits(*wk));
          expect_equal_bits("sdpa_backward dv written", bits(*zv), bits(*wv));
        }
      }
  }
  CHECK_THROWS_AS([] {
    kg::ContextOptions bad;
    bad.sdpa_backward_chunk = 24;
    kg::Context c(bad);
  }(), std::invalid_argument);
  // Head dims the kernels are not built for are refused by name.
  Dev dummy(64);
  CHECK_FALSE(kg::sdpa_supports(48));
  CHECK_THROWS_AS(kg::sdpa_forward(dummy.get(), dummy.as<float>(), dummy.get(), dummy.get(), dummy.get(), nullptr, 1, 1,
                                   1, 48, false, 1.0f, 0.0f, 0, 0, DType::bf16, kStream),
                  std::invalid_argument);
}

// The one-pass backward orders its dQ sums with a counter per query tile: key tile k waits
// until tiles 0 .. k - 1 have added theirs. Here the grid (64 heads × 32 key tiles) is far
// larger than what the GPU holds at once, so blocks wait on blocks that started earlier and
// some start only when others finish: it must neither hang nor differ from the two passes by
// more than the order of an fp32 sum (dK, dV: the same bits). With atomic dQ sums
// (ContextOptions::sdpa_backward_atomic_dq) no block waits: the same bounds.
TEST_CASE("sdpa: the one-pass backward on a grid larger than the GPU holds: the two passes' results") {
  kg::ContextOptions one, atomic;
  one.sdpa_backward_one_pass = true;
  atomic.sdpa_backward_one_pass = true;
  atomic.sdpa_backward_atomic_dq = true;
  kg::Context two_pass, one_pass(one), atomic_pass(atomic);
  CHECK_THROWS_AS([] {
    kg::ContextOptions bad;
    bad.sdpa_backward_atomic_dq = true;  // without one pass
    kg::Context c(bad);
  }(), std::invalid_argument);
  const std::int64_t B = 4, H = 16, T = 2048, D = 64, n = B * H * T * D;
  const float scale = 0.125f;
  for (DType dt : {DType::bf16, DType::fp16})
    for (bool causal : {true, false}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(causal);
      const float p = causal ? 0.1f : 0.0f;
      auto q = device(rand_vec(n, 311, dt, -2.0f, 2.0f), dt), k = device(rand_vec(n, 312, dt, -2.0f, 2.0f), dt),
           v = device(rand_vec(n, 313, dt), dt), dout = device(rand_vec(n, 314, dt), dt);
      auto o = output(sz(n), dt);
      Dev lse(sz(B * H * T) * 4);
      kg::sdpa_forward(o->get(), lse.as<float>(), q->get(), k->get(), v->get(), nullptr, B, H, T, D, causal, scale, p, 5,
                       0, dt, kStream);
      std::vector<unsigned char> dk_bits[3], dv_bits[3];
      Vec dq[3];
      kg::Context* ctxs[3] = {&two_pass, &one_pass, &atomic_pass};
      for (int pass = 0; pass < 3; ++pass) {
        auto gdq = device(Vec(sz(n), 0.0f), dt), gdk = device(Vec(sz(n), 0.0f), dt), gdv = device(Vec(sz(n), 0.0f), dt);
        kg::sdpa_backward(*ctxs[pass], gdq->get(), gdk->get(), gdv->get(), dout->get(), q->get(), k->get(), v->get(),
                          o->get(), lse.as<float>(), nullptr, B, H, T, D, causal, scale, p, 5, 0, dt, kStream);
        dq[pass] = download(*gdq, sz(n), dt);
        dk_bits[pass] = bits(*gdk);
        dv_bits[pass] = bits(*gdv);
      }
      for (int pass = 1; pass < 3; ++pass) {
        CAPTURE(pass);  // 1: ordered sums, 2: atomic sums
        expect_close("one-pass dq against two passes", dq[pass], dq[0],
                     Tol{eps(dt) * max_abs(dq[0]), 2 * eps(dt), band(dt)});
        expect_equal_bits("one-pass dk against two passes", dk_bits[0], dk_bits[pass]);
        expect_equal_bits("one-pass dv against two passes", dv_bits[0], dv_bits[pass]);
      }
    }
}

// Where two tile buffers do not fit a block (a GPU with 99 KB per block: sm_86, sm_89,
// sm_120; fp32 on A100), the kernels stream through one: the same products in the same order.
// ZEROPLAN_SDPA_SMEM_LIMIT stands in for such a GPU.
TEST_CASE("sdpa: the one-buffer kernels give the two-buffer kernels' bits (head dim 128; fp32 at 64)") {
  kg::Context ctx;
  struct Case {
    DType dt;
    std::int64_t D;
  };
  for (const Case c : {Case{DType::bf16, 128}, Case{DType::fp16, 128}, Case{DType::fp32, 64}, Case{DType::fp32, 128}}) {
    CAPTURE(dtype_str(c.dt));
    CAPTURE(c.D);
    const std::int64_t B = 1, H = 2, T = 150, n = B * H * T * c.D;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    auto q = device(rand_vec(n, 301, c.dt, -2.0f, 2.0f), c.dt), k = device(rand_vec(n, 302, c.dt, -2.0f, 2.0f), c.dt),
         v = device(rand_vec(n, 303, c.dt), c.dt), dout = device(rand_vec(n, 304, c.dt), c.dt);
    std::vector<unsigned char> out[2][5];
    for (int single = 0; single < 2; ++single) {
      if (single != 0) ::setenv("ZEROPLAN_SDPA_SMEM_LIMIT", "101376", 1);
      auto o = output(sz(n), c.dt);
      Dev lse(sz(B * H * T) * 4);
      kg::sdpa_forward(o->get(), lse.as<float>(), q->get(), k->get(), v->get(), nullptr, B, H, T, c.D, true, scale, 0.1f,
                       11, 0, c.dt, kStream);
      auto dq = device(Vec(sz(n), 0.0f), c.dt), dk = device(Vec(sz(n), 0.0f), c.dt), dv = device(Vec(sz(n), 0.0f), c.dt);
      kg::sdpa_backward(ctx, dq->get(), dk->get(), dv->get(), dout->get(), q->get(), k->get(), v->get(), o->get(),
                        lse.as<float>(), nullptr, B, H, T, c.D, true, scale, 0.1f, 11, 0, c.dt, kStream);
      out[single][0] = bits(*o);
      out[single][1] = bits(lse);
      out[single][2] = bits(*dq);
      out[single][3] = bits(*dk);
      out[single][4] = bits(*dv);
      ::unsetenv("ZEROPLAN_SDPA_SMEM_LIMIT");
    }
    const char* names[] = {"O", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i) expect_equal_bits(names[i], out[0][i], out[1][i]);
  }
}

// A Context whose fused attention is cuDNN's.
kg::ContextOptions cudnn_options() {
  kg::ContextOptions o;
  o.sdpa_cudnn = true;
  return o;
}

// cuDNN's flash attention (ContextOptions::sdpa_cudnn) on the same operands: without dropout
// against the CPU twin at our kernels' bounds, written and added into, with as many key/value
// heads as query heads and fewer (GQA, MQA: against the CPU twin on the key and value repeated
// over their query heads, and their gradients summed back); with dropout, each element of
// dropout(P) is 0 or P/(1 - p) at about the rate p, and the backward draws the forward's mask
// (with V = I, O is dropout(P) itself; with dO = I, dV is its transpose).
TEST_CASE("sdpa: cuDNN's flash attention against the CPU twin; its dropout mask, forward and backward") {
  CHECK_FALSE(kg::sdpa_cudnn_refusal(16, 64, DType::fp32).empty());
  CHECK_FALSE(kg::sdpa_cudnn_refusal(16, 60, DType::bf16).empty());
  CHECK_FALSE(kg::sdpa_cudnn_refusal(1, 64, DType::bf16).empty());
  if (!kg::sdpa_cudnn_built()) {
    MESSAGE("skipped: " << kg::sdpa_cudnn_refusal(16, 64, DType::bf16));
    return;
  }
  CHECK(kg::sdpa_cudnn_refusal(2, 64, DType::bf16).empty());
  CHECK(kg::sdpa_cudnn_refusal(16, 128, DType::fp16).empty());
  kg::Context ctx(cudnn_options());
  struct Case {
    std::int64_t B, H, Hk, T, D;
    bool causal;
  };
  const Case cases[] = {{2, 2, 2, 130, 64, true},  {2, 3, 3, 130, 64, false}, {1, 2, 2, 96, 128, true},
                        {2, 1, 1, 2, 64, false},   {1, 2, 2, 200, 32, true},  {1, 2, 2, 37, 16, false},
                        {2, 4, 2, 130, 64, true},  {1, 8, 2, 96, 128, false}, {2, 4, 1, 70, 16, true},
                        {1, 6, 3, 37, 32, false}};
  auto rng = device_raw(std::vector<std::int64_t>{4242, std::int64_t{9} << 32});
  const auto* seed_offset = static_cast<const std::int64_t*>(rng->get());
  for (DType dt : {DType::bf16, DType::fp16})
    for (const Case& c : cases) {
      CAPTURE(dtype_str(dt));
      CAPTURE(c.H);
      CAPTURE(c.Hk);
      CAPTURE(c.T);
      CAPTURE(c.D);
      CAPTURE(c.causal);
      const std::int64_t TD = c.T * c.D, n = c.B * c.H * TD, nkv = c.B * c.Hk * TD, rows = c.B * c.H * c.T;
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
      const Vec q = rand_vec(n, 231, dt, -2.0f, 2.0f), k = rand_vec(nkv, 232, dt, -2.0f, 2.0f),
                v = rand_vec(nkv, 233, dt);
      // k and v repeated over their query heads (HF's repeat_kv, the CPU device's kernel).
      Vec kr(sz(n)), vr(sz(n));
      kc::repeat_kv_forward(kr.data(), k.data(), c.B, c.Hk, c.H / c.Hk, c.T, c.D);
      kc::repeat_kv_forward(vr.data(), v.data(), c.B, c.Hk, c.H / c.Hk, c.T, c.D);
      auto gq = device(q, dt), gk = device(k, dt), gv = device(v, dt);
      auto o = output(sz(n), dt);
      Dev lse(sz(rows) * 4);
      lse.poison();
      kg::sdpa_cudnn_forward(ctx, o->get(), lse.as<float>(), gq->get(), gk->get(), gv->get(), c.B, c.H, c.Hk, c.T,
                             c.D, c.causal, scale, 0.0f, seed_offset, dt, kStream);
      Vec ro(sz(n)), rlse(sz(rows));
      kc::sdpa_forward(ro.data(), rlse.data(), q.data(), kr.data(), vr.data(), nullptr, c.B, c.H, c.T, c.D, c.causal,
                       scale, 0.0f, 0, 0);
      expect_close("cuDNN sdpa O", download(*o, sz(n), dt), ro, Tol{0.2 * eps(dt), eps(dt) + 16 * 0x1p-23, band(dt)});
      expect_close("cuDNN sdpa logsumexp", download(lse, sz(rows), DType::fp32), rlse, Tol{1e-5, 1e-5, 0.0});
      const Vec dout = rand_vec(n, 234, dt);
      auto ddout = device(dout, dt);
      const Vec qi = rand_vec(n, 235, dt, -0.01f, 0.01f), ki = rand_vec(nkv, 236, dt, -0.01f, 0.01f),
                vi = rand_vec(nkv, 237, dt, -0.01f, 0.01f);
      // The CPU twin's gradients, written (w*) and added into the initial values (r*); the key's
      // and value's summed over their query heads.
      Vec wq(sz(n), 0.0f), wkr(sz(n), 0.0f), wvr(sz(n), 0.0f);
      kc::sdpa_backward(wq.data(), wkr.data(), wvr.data(), dout.data(), q.data(), kr.data(), vr.data(), rlse.data(),
                        nullptr, c.B, c.H, c.T, c.D, c.causal, scale, 0.0f, 0, 0);
      Vec wk(sz(nkv)), wv(sz(nkv));
      kc::repeat_kv_backward(wk.data(), wkr.data(), c.B, c.Hk, c.H / c.Hk, c.T, c.D, false);
      kc::repeat_kv_backward(wv.data(), wvr.data(), c.B, c.Hk, c.H / c.Hk, c.T, c.D, false);
      Vec rdq = qi, rdk = ki, rdv = vi;
      for (std::size_t i = 0; i < rdq.size(); ++i) rdq[i] += wq[i];
      for (std::size_t i = 0; i < rdk.size(); ++i) {
        rdk[i] += wk[i];
        rdv[i] += wv[i];
      }
      const Vec zq(sz(n), 0.0f), zkv(sz(nkv), 0.0f);
      for (bool add : {true, false}) {
        CAPTURE(add);
        // Written whole: what the gradients held (NaN) is not read.
        auto gdq = add ? device(qi, dt) : output(sz(n), dt), gdk = add ? device(ki, dt) : output(sz(nkv), dt),
             gdv = add ? device(vi, dt) : output(sz(nkv), dt);
        if (!add) {
          gdq->poison();
          gdk->poison();
          gdv->poison();
        }
        kg::sdpa_cudnn_backward(ctx, gdq->get(), gdk->get(), gdv->get(), ddout->get(), gq->get(), gk->get(), gv->get(),
                                o->get(), lse.as<float>(), c.B, c.H, c.Hk, c.T, c.D, c.causal, scale, 0.0f,
                                seed_offset, dt, kStream, kg::SdpaAccumulate{add, add, add});
        const double b = 2.0 * band(dt), floor = 1e-4;
        expect_added("cuDNN sdpa dq", download(*gdq, sz(n), dt), add ? rdq : wq, add ? qi : zq, b, floor, dt);
        expect_added("cuDNN sdpa dk", download(*gdk, sz(nkv), dt), add ? rdk : wk, add ? ki : zkv, b, floor, dt);
        expect_added("cuDNN sdpa dv", download(*gdv, sz(nkv), dt), add ? rdv : wv, add ? vi : zkv, b, floor, dt);
      }
    }

  // Dropout: T = D = 64, V = I per head, so O = dropout(P); P from the CPU twin without dropout.
  const std::int64_t B = 2, H = 2, T = 64, D = 64, n = B * H * T * D;
  const float p = 0.2f, scale = 0.125f;
  Vec eye(sz(n), 0.0f);
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t j = 0; j < T; ++j) eye[sz((bh * T + j) * D + j)] = 1.0f;
  for (DType dt : {DType::bf16, DType::fp16})
    for (bool causal : {false, true}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(causal);
      const Vec q = rand_vec(n, 241, dt, -1.0f, 1.0f), k = rand_vec(n, 242, dt, -1.0f, 1.0f);
      Vec P(sz(n)), rlse(sz(B * H * T));
      kc::sdpa_forward(P.data(), rlse.data(), q.data(), k.data(), eye.data(), nullptr, B, H, T, D, causal, scale, 0.0f, 0,
                       0);
      auto gq = device(q, dt), gk = device(k, dt), gv = device(eye, dt), dout = device(eye, dt);
      auto o = output(sz(n), dt);
      Dev lse(sz(B * H * T) * 4);
      kg::sdpa_cudnn_forward(ctx, o->get(), lse.as<float>(), gq->get(), gk->get(), gv->get(), B, H, H, T, D, causal,
                             scale, p, seed_offset, dt, kStream);
      const Vec got = download(*o, sz(n), dt);
      std::int64_t positive = 0, dropped = 0, wrong = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (P[i] <= 1e-3f) continue;  // too small to tell kept from dropped in 16 bits
        ++positive;
        const double kept = P[i] / (1.0 - p);
        if (std::fabs(got[i]) < 0.5 * kept)
          ++dropped;
        else if (std::fabs(got[i] - kept) > 4 * eps(dt) * kept + 1e-4)
          ++wrong;
      }
      CHECK(wrong == 0);
      REQUIRE(positive > 2000);
      const double rate = static_cast<double>(dropped) / static_cast<double>(positive);
      const double sigma = std::sqrt(static_cast<double>(p) * (1.0 - p) / static_cast<double>(positive));
      INFO("dropped " << dropped << " of " << positive << " (rate " << rate << ")");
      CHECK(std::fabs(rate - p) < 5 * sigma);
      // dO = I: dV[j][d] = Σ_i dropout(P)[i][j]·δ(i, d) = O[d][j] per head, if the masks agree.
      auto gdq = output(sz(n), dt), gdk = output(sz(n), dt), gdv = output(sz(n), dt);
      kg::sdpa_cudnn_backward(ctx, gdq->get(), gdk->get(), gdv->get(), dout->get(), gq->get(), gk->get(), gv->get(),
                              o->get(), lse.as<float>(), B, H, H, T, D, causal, scale, p, seed_offset, dt, kStream,
                              kg::SdpaAccumulate{false, false, false});
      const Vec dv = download(*gdv, sz(n), dt);
      Vec ot(sz(n));
      for (std::int64_t bh = 0; bh < B * H; ++bh)
        for (std::int64_t j = 0; j < T; ++j)
          for (std::int64_t d = 0; d < D; ++d) ot[sz((bh * T + j) * D + d)] = got[sz((bh * T + d) * D + j)];
      expect_close("cuDNN sdpa dV = dropout(P)^T", dv, ot, Tol{1e-6, 4 * eps(dt), 0.0});
    }
  // The workspace the memory prediction counts (kernels/common/sdpa_dims.hpp), at the shapes of
  // the models' attention: tiny GPT-2, GPT-2, GPT-2 medium, BERT-large, the Llama with as many
  // key/value heads as query heads (4.46's repeat_kv), and with its own (tiny Llama's 2 of 4,
  // Llama 3's 8 of 32: 5.x's GQA); with and without dropout and the causal mask.
  struct Shape {
    std::int64_t B, H, Hk, T, D;
  };
  for (const Shape s : {Shape{4, 4, 4, 64, 16}, Shape{16, 12, 12, 1024, 64}, Shape{16, 16, 16, 1024, 64},
                        Shape{64, 16, 16, 128, 64}, Shape{4, 32, 32, 2048, 128}, Shape{2, 2, 2, 130, 64},
                        Shape{4, 4, 2, 64, 16}, Shape{4, 32, 8, 2048, 128}, Shape{2, 4, 2, 130, 64}})
    for (const bool causal : {true, false})
      for (const float drop : {0.0f, 0.1f}) {
        CAPTURE(s.B);
        CAPTURE(s.H);
        CAPTURE(s.Hk);
        CAPTURE(s.T);
        CAPTURE(s.D);
        CAPTURE(causal);
        CAPTURE(drop);
        const kg::SdpaCudnnWorkspace w =
            kg::sdpa_cudnn_workspace(ctx, s.B, s.H, s.Hk, s.T, s.D, causal, 0.125f, drop, DType::bf16);
        MESSAGE("cuDNN " << kg::sdpa_cudnn_version() << " workspace " << s.B << "x" << s.H << "(" << s.Hk << ")x"
                         << s.T << "x" << s.D << std::string(causal ? " causal" : "") << " dropout " << drop << ": forward "
                         << w.forward << " B, backward " << w.backward
                         << " B (4BHTD + 4BHT = " << 4 * s.B * s.H * s.T * (s.D + 1) << ")");
        CHECK(zp::kernels::carve_aligned(w.forward) == zp::kernels::kSdpaCudnnForwardWorkspace);
        CHECK(zp::kernels::carve_aligned(w.backward) ==
              zp::kernels::sdpa_cudnn_backward_workspace(s.B, s.H, s.Hk, s.T, s.D));
      }
}

// cuDNN's attention on operands where the model's ops leave them (SdpaCudnnLayout), each operand
// in a layout of its own so that one operand's strides given to another would show: q as a
// column block of a (B, T, W) projection output (GPT-2's c_attn, W = 3·H·D plus 8 columns nobody
// owns), k as contiguous heads (GPT-2's KV-cache copy), v as the columns of a (B, T, H·D + 8)
// output, the output and its gradient as (B, T, H·D) rows; in backward dq into q's column block
// of the projection's gradient, dk as contiguous heads, dv into v's layout, written and added
// into. Against the same call on contiguous heads: the same engine on the same values, so within
// two 16-bit ulps (dQ's sums are not in a fixed order; the count of bit-equal elements is
// printed), the same dropout mask (the same seed and offset), and the columns no operand owns
// never touched.
TEST_CASE("sdpa: cuDNN reads and writes heads where they lie, as contiguous heads give") {
  if (!kg::sdpa_cudnn_built()) {
    MESSAGE("skipped: " << kg::sdpa_cudnn_refusal(16, 64, DType::bf16));
    return;
  }
  kg::Context ctx(cudnn_options());
  struct Case {
    std::int64_t B, H, Hk, T, D;
    bool causal;
    float p;
  };
  auto rng = device_raw(std::vector<std::int64_t>{777, std::int64_t{3} << 32});
  const auto* seed_offset = static_cast<const std::int64_t*>(rng->get());
  for (DType dt : {DType::bf16, DType::fp16})
    for (const Case c : {Case{2, 3, 3, 130, 64, true, 0.0f}, Case{2, 2, 2, 128, 64, false, 0.1f},
                         Case{1, 2, 2, 96, 128, true, 0.1f}, Case{2, 4, 2, 130, 64, true, 0.1f},
                         Case{1, 8, 2, 96, 128, false, 0.0f}}) {
      CAPTURE(dtype_str(dt));
      CAPTURE(c.H);
      CAPTURE(c.Hk);
      CAPTURE(c.T);
      CAPTURE(c.D);
      CAPTURE(c.causal);
      CAPTURE(c.p);
      // q a column block of a (B, T, W) projection output, v of a (B, T, Hk·D + 8) one.
      const std::int64_t B = c.B, H = c.H, Hk = c.Hk, T = c.T, D = c.D, HD = H * D, W = 3 * HD + 8, WV = Hk * D + 8,
                         n = B * H * T * D, nkv = B * Hk * T * D;
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      const float sentinel = 7.0f;
      // heads (B, X, T, D) <-> rows (B, T, ld) at column offset `at`
      auto to_rows = [&](Vec& rows, const Vec& heads, std::int64_t ld, std::int64_t at, std::int64_t X) {
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t h = 0; h < X; ++h)
            for (std::int64_t t = 0; t < T; ++t)
              for (std::int64_t d = 0; d < D; ++d)
                rows[sz((b * T + t) * ld + at + h * D + d)] = heads[sz(((b * X + h) * T + t) * D + d)];
      };
      auto from_rows = [&](const Vec& rows, std::int64_t ld, std::int64_t at, std::int64_t X) {
        Vec heads(sz(B * X * T * D));
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t h = 0; h < X; ++h)
            for (std::int64_t t = 0; t < T; ++t)
              for (std::int64_t d = 0; d < D; ++d)
                heads[sz(((b * X + h) * T + t) * D + d)] = rows[sz((b * T + t) * ld + at + h * D + d)];
        return heads;
      };
      // Columns [from, ld) of every row still hold the sentinel.
      auto untouched = [&](const Vec& rows, std::int64_t ld, std::int64_t from) {
        std::int64_t off = 0;
        for (std::int64_t r = 0; r < B * T; ++r)
          for (std::int64_t j = from; j < ld; ++j) off += rows[sz(r * ld + j)] != sentinel;
        return off;
      };
      auto bit_equal = [](const Vec& a, const Vec& b) {
        std::size_t same = 0;
        for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
        return same;
      };
      const Vec q = rand_vec(n, 331, dt, -2.0f, 2.0f), k = rand_vec(nkv, 332, dt, -2.0f, 2.0f),
                v = rand_vec(nkv, 333, dt);
      Vec qrows(sz(B * T * W), sentinel), vrows(sz(B * T * WV), sentinel);
      to_rows(qrows, q, W, 0, H);
      to_rows(vrows, v, WV, 0, Hk);
      auto gq = device(q, dt), gk = device(k, dt), gv = device(v, dt), gqrows = device(qrows, dt),
           gvrows = device(vrows, dt);
      // Contiguous heads, as kernels/cuda/sdpa takes them.
      auto o = output(sz(n), dt);
      Dev lse(sz(B * H * T) * 4);
      kg::sdpa_cudnn_forward(ctx, o->get(), lse.as<float>(), gq->get(), gk->get(), gv->get(), B, H, Hk, T, D, c.causal,
                             scale, c.p, seed_offset, dt, kStream);
      // In place, a layout per operand.
      auto orow = output(sz(B * T * HD), dt);
      Dev lse2(sz(B * H * T) * 4);
      kg::SdpaCudnnLayout l;
      l.q = W;
      l.k = 0;
      l.v = WV;
      l.o = HD;
      kg::sdpa_cudnn_forward(ctx, orow->get(), lse2.as<float>(), gqrows->get(), gk->get(), gvrows->get(), B, H, Hk, T,
                             D, c.causal, scale, c.p, seed_offset, dt, kStream, l);
      const Vec want_o = download(*o, sz(n), dt), got_o = from_rows(download(*orow, sz(B * T * HD), dt), HD, 0, H);
      MESSAGE(dtype_str(dt) << " H=" << H << " Hk=" << Hk << " T=" << T << " p=" << c.p << ": O bit-equal in "
                            << bit_equal(got_o, want_o) << " of " << n);
      expect_close("O in place", got_o, want_o, Tol{2 * eps(dt), 2 * eps(dt), 0.0});
      expect_close("logsumexp in place", download(lse2, sz(B * H * T), DType::fp32), download(lse, sz(B * H * T), DType::fp32),
                   Tol{1e-5, 1e-5, 0.0});
      // Backward: dO as rows too.
      const Vec dout = rand_vec(n, 334, dt);
      Vec dorow(sz(B * T * HD));
      to_rows(dorow, dout, HD, 0, H);
      auto gdout = device(dout, dt), gdorow = device(dorow, dt);
      const Vec qi = rand_vec(n, 335, dt, -0.01f, 0.01f), ki = rand_vec(nkv, 336, dt, -0.01f, 0.01f),
                vi = rand_vec(nkv, 337, dt, -0.01f, 0.01f);
      for (bool add : {false, true}) {
        CAPTURE(add);
        auto gdq = add ? device(qi, dt) : output(sz(n), dt), gdk = add ? device(ki, dt) : output(sz(nkv), dt),
             gdv = add ? device(vi, dt) : output(sz(nkv), dt);
        kg::sdpa_cudnn_backward(ctx, gdq->get(), gdk->get(), gdv->get(), gdout->get(), gq->get(), gk->get(), gv->get(),
                                o->get(), lse.as<float>(), B, H, Hk, T, D, c.causal, scale, c.p, seed_offset, dt,
                                kStream, kg::SdpaAccumulate{add, add, add});
        // dq's and dv's rows: the sentinel beyond their blocks; in their blocks what is added
        // into, or NaN where they are written whole. dk: contiguous heads.
        const float nan = std::numeric_limits<float>::quiet_NaN();
        Vec dqrows(sz(B * T * W), sentinel), dvrows(sz(B * T * WV), sentinel);
        to_rows(dqrows, add ? qi : Vec(sz(n), nan), W, 0, H);
        to_rows(dvrows, add ? vi : Vec(sz(nkv), nan), WV, 0, Hk);
        auto gdqrows = device(dqrows, dt), gdvrows = device(dvrows, dt);
        auto gdkh = add ? device(ki, dt) : output(sz(nkv), dt);
        kg::SdpaCudnnLayout lb = l;
        lb.dq = W;
        lb.dk = 0;
        lb.dv = WV;
        kg::sdpa_cudnn_backward(ctx, gdqrows->get(), gdkh->get(), gdvrows->get(), gdorow->get(), gqrows->get(), gk->get(),
                                gvrows->get(), orow->get(), lse2.as<float>(), B, H, Hk, T, D, c.causal, scale, c.p,
                                seed_offset, dt, kStream, kg::SdpaAccumulate{add, add, add}, lb);
        const Vec got_dq = download(*gdqrows, sz(B * T * W), dt), got_dv = download(*gdvrows, sz(B * T * WV), dt);
        CHECK(untouched(got_dq, W, HD) == 0);
        CHECK(untouched(got_dv, WV, Hk * D) == 0);
        const Vec got[] = {from_rows(got_dq, W, 0, H), download(*gdkh, sz(nkv), dt), from_rows(got_dv, WV, 0, Hk)};
        const char* names[] = {"dq", "dk", "dv"};
        const Dev* want[] = {gdq.get(), gdk.get(), gdv.get()};
        const std::int64_t count[] = {n, nkv, nkv};
        for (int i = 0; i < 3; ++i) {
          const Vec w = download(*want[i], sz(count[i]), dt);
          MESSAGE(dtype_str(dt) << " H=" << H << " Hk=" << Hk << " T=" << T << " p=" << c.p
                                << std::string(add ? " added " : " written ") << std::string(names[i])
                                << " bit-equal in " << bit_equal(got[i], w) << " of " << count[i]);
          expect_close(std::string(names[i]) + " in place", got[i], w, Tol{2 * eps(dt) * 0.01, 2 * eps(dt), 0.0});
        }
      }
    }
  // A row narrower than the heads, or of rows not 16-byte multiples, is refused by name; so is
  // one given for a gradient that is added into (it goes through a temporary, then its rows).
  auto dummy = output(64, DType::bf16);
  kg::SdpaCudnnLayout bad;
  bad.q = 100;  // 2 heads of 64
  CHECK_THROWS_AS(kg::sdpa_cudnn_forward(ctx, dummy->get(), nullptr, dummy->get(), dummy->get(), dummy->get(), 1, 2, 2,
                                         4, 64, false, 0.125f, 0.0f, seed_offset, DType::bf16, kStream, bad),
                  std::invalid_argument);
  bad.q = 132;  // wide enough, rows of 264 bytes
  CHECK_THROWS_AS(kg::sdpa_cudnn_forward(ctx, dummy->get(), nullptr, dummy->get(), dummy->get(), dummy->get(), 1, 2, 2,
                                         4, 64, false, 0.125f, 0.0f, seed_offset, DType::bf16, kStream, bad),
                  std::invalid_argument);
  kg::SdpaCudnnLayout narrow;
  narrow.dq = 64;
  CHECK_THROWS_AS(kg::sdpa_cudnn_backward(ctx, dummy->get(), dummy->get(), dummy->get(), dummy->get(), dummy->get(),
                                          dummy->get(), dummy->get(), dummy->get(), nullptr, 1, 2, 2, 4, 64, false, 0.125f,
                                          0.0f, seed_offset, DType::bf16, kStream, kg::SdpaAccumulate{true, false, false},
                                          narrow),
                  std::invalid_argument);
  // Key/value heads that do not divide the query heads, and a key's row narrower than its
  // heads (2 of 64 here, though the query has 4), are refused by name.
  CHECK_THROWS_AS(kg::sdpa_cudnn_forward(ctx, dummy->get(), nullptr, dummy->get(), dummy->get(), dummy->get(), 1, 4, 3,
                                         4, 64, false, 0.125f, 0.0f, seed_offset, DType::bf16, kStream),
                  std::invalid_argument);
  CHECK_THROWS_AS(kg::sdpa_cudnn_forward(ctx, dummy->get(), nullptr, dummy->get(), dummy->get(), dummy->get(), 1, 4, 0,
                                         4, 64, false, 0.125f, 0.0f, seed_offset, DType::bf16, kStream),
                  std::invalid_argument);
  kg::SdpaCudnnLayout thin;
  thin.k = 120;  // 2 kv heads of 64
  CHECK_THROWS_AS(kg::sdpa_cudnn_forward(ctx, dummy->get(), nullptr, dummy->get(), dummy->get(), dummy->get(), 1, 4, 2,
                                         4, 64, false, 0.125f, 0.0f, seed_offset, DType::bf16, kStream, thin),
                  std::invalid_argument);
}

TEST_CASE("kernels refuse storage dtypes other than fp32, bf16, fp16 by name") {
  Dev dummy(64);
  CHECK_THROWS_AS(kg::gelu_forward(dummy.get(), dummy.get(), 4, DType::i64, kStream), std::invalid_argument);
  CHECK_THROWS_AS(kg::convert(dummy.get(), DType::u8, dummy.get(), DType::fp32, 4, kStream), std::invalid_argument);
}
