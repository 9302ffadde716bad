// Calibration's fit: measurements generated through the simulator from known coefficients,
// with noise, are fitted back within their stated uncertainty; parameters the data cannot
// determine are refused with the measurement that would; the closed forms recover exact data.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cmath>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "calibration/fit.hpp"
#include "calibration/params.hpp"
#include "calibration/predictor.hpp"
#include "calibration/sources.hpp"
#include "core/error.hpp"
#include "sim/cluster.hpp"
#include "sim/compute_model.hpp"
#include "sim/device.hpp"

using namespace zp;
using namespace zp::calibration;

namespace {

// Measured = the truth's prediction × exp(noise · N(0, 1)), seeded.
void measure(Dataset& data, const Predictor& pred, const ModelParams& truth, double noise, unsigned seed) {
  const std::vector<double> t = pred.predict(truth);
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  for (std::size_t i = 0; i < data.obs.size(); ++i) data.obs[i].measured = Seconds{t[i] * std::exp(noise * n(rng))};
}

PredictFn predict_fn(const Predictor& p) {
  return [&p](const ModelParams& m, const std::vector<char>& want, std::vector<double>& out) { p.predict(m, want, out); };
}

const FittedParam* fitted(const FitResult& r, const std::string& name) {
  for (const auto& f : r.fitted)
    if (f.def->name == name) return &f;
  return nullptr;
}

const Refusal* refusal(const FitResult& r, const std::string& name) {
  for (const auto& f : r.refused)
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<const ParamDef*> params(std::initializer_list<const char*> names) {
  std::vector<const ParamDef*> out;
  for (const char* n : names) {
    const ParamDef* d = find_param(n);
    REQUIRE_MESSAGE(d != nullptr, n);
    out.push_back(d);
  }
  return out;
}

Observation collective(zero::CollKind kind, int ranks, int nodes, std::int64_t bytes) {
  Observation o;
  o.kind = ObsKind::collective;
  o.coll.kind = kind;
  o.coll.ranks = ranks;
  o.coll.nodes = nodes;
  o.coll.ranks_per_node = ranks / nodes;
  o.coll.bytes = Bytes{bytes};
  o.tags = {{"source", "synthetic"}};
  return o;
}

Observation kernel(KernelClass cls, std::vector<models::Gemm> g, bool backward, double flops, std::int64_t bytes) {
  Observation o;
  o.kind = ObsKind::kernel;
  o.kernel.cls = cls;
  o.kernel.gemms = std::move(g);
  o.kernel.backward = backward;
  o.kernel.flops = Flops{flops};
  o.kernel.bytes = Bytes{bytes};
  o.kernel.dtype = DType::bf16;
  o.tags = {{"source", "synthetic"}};
  return o;
}

// A fused attention kernel (sdpa forward or backward) as calibrate --device cuda records it:
// its two batched products, the causal half of their FLOPs, and Q, K, V, O moved.
Observation attention(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool backward) {
  const double f = 4.0 * static_cast<double>(B * H * T) * static_cast<double>(T * D) * 0.5;
  Observation o = kernel(KernelClass::attention, {models::Gemm{T, T, D, B * H}, models::Gemm{T, D, T, B * H}}, backward,
                         backward ? 2.5 * f : f, (backward ? 2 : 1) * 4 * 2 * B * H * T * D);
  o.tags["kind"] = "attention";
  return o;
}

// Within k standard deviations of the truth, and the deviation itself a useful one.
void within(const FitResult& r, const std::string& name, double truth, double k = 3.0, double max_rel_sd = 0.2) {
  CAPTURE(name);
  const FittedParam* f = fitted(r, name);
  REQUIRE(f != nullptr);
  CAPTURE(f->value);
  CAPTURE(f->sd);
  CHECK(f->sd > 0);
  CHECK(std::abs(f->value - truth) <= k * f->sd);
  CHECK(f->sd <= max_rel_sd * std::max(std::abs(truth), f->def->typical * 0.1));
}

void scale_cells(ModelParams& m, const std::string& name, double factor) {
  const ParamDef* d = find_param(name);
  REQUIRE(d != nullptr);
  d->set(m, d->get(m) * factor);
}

}  // namespace

TEST_CASE("collective factors are fitted back within their stated uncertainty") {
  const sim::ClusterSpec cluster = sim::load_cluster("8xA100-80GB-NVSwitch", 2);
  Dataset data;
  for (auto kind : {zero::CollKind::all_reduce, zero::CollKind::all_gather, zero::CollKind::reduce_scatter})
    for (auto [ranks, nodes] : {std::pair{8, 1}, std::pair{16, 2}})
      for (std::int64_t b = 1024; b <= (std::int64_t{1} << 30); b *= 4) data.obs.push_back(collective(kind, ranks, nodes, b));
  const Predictor pred(data, cluster);
  ModelParams start;
  start.device = sim::default_profile(sim::find_device(cluster.gpu));
  start.collective = cluster.collective;
  ModelParams truth = start;
  scale_cells(truth, "collective.intra.bandwidth", 0.7);
  scale_cells(truth, "collective.inter.bandwidth", 0.4);
  scale_cells(truth, "collective.intra.latency", 1.5);
  scale_cells(truth, "collective.inter.latency", 2.0);
  truth.collective.fill_fraction = 0.9;
  measure(data, pred, truth, 0.02, 7);

  FitOptions fo;
  fo.candidates = params({"collective.intra.bandwidth", "collective.intra.latency", "collective.inter.bandwidth",
                          "collective.inter.latency", "collective.fill_fraction"});
  const FitResult r = fit(predict_fn(pred), data.obs, start, fo);
  std::string why;
  for (const auto& x : r.refused) why += x.name + ": " + x.reason + "\n";
  for (const auto& x : r.fitted) why += fmt::format("{} = {} ± {}\n", x.def->name, x.value, x.sd);
  CAPTURE(why);
  CHECK(r.fitted.size() == 5);
  within(r, "collective.intra.bandwidth", 0.7);
  within(r, "collective.inter.bandwidth", 0.4);
  within(r, "collective.intra.latency", 1.5);
  within(r, "collective.inter.latency", 2.0);
  within(r, "collective.fill_fraction", 0.9, 3.0, 0.5);
  CHECK(r.cost_after < r.cost_before);
  // The residual scatter is the noise put in.
  CHECK(r.sigma > 0);
}

TEST_CASE("the GEMM curve, bandwidth and launch are fitted back from kernels within their uncertainty") {
  const sim::ClusterSpec cluster = sim::single_node("H200-141GB", 1);
  Dataset data;
  const std::int64_t dims[] = {128, 512, 2048, 8192};
  for (auto m : dims)
    for (auto n : dims)
      for (auto k : dims)
        for (bool bwd : {false, true}) {
          const double f = (bwd ? 4.0 : 2.0) * static_cast<double>(m * n) * static_cast<double>(k);
          data.obs.push_back(kernel(KernelClass::gemm, {models::Gemm{m, n, k, 1}}, bwd, f, (bwd ? 4 : 2) * (m * k + k * n + m * n)));
        }
  for (std::int64_t n : {50257, 30522})  // vocabularies: not multiples of 8
    data.obs.push_back(kernel(KernelClass::gemm, {models::Gemm{8192, n, 768, 1}}, false, 2.0 * 8192 * 768 * static_cast<double>(n),
                              2 * (8192 * 768 + 768 * n + 8192 * n)));
  for (std::int64_t b = 1024; b <= (std::int64_t{1} << 30); b *= 2) data.obs.push_back(kernel(KernelClass::memory, {}, false, 0, b));
  data.obs.push_back(attention(8, 12, 1024, 64, false));
  data.obs.push_back(attention(8, 12, 1024, 64, true));
  data.obs.push_back(attention(4, 16, 2048, 128, false));
  data.obs.push_back(attention(4, 16, 2048, 128, true));
  const Predictor pred(data, cluster);
  ModelParams start;
  start.device = sim::default_profile(sim::find_device("H200-141GB"));
  ModelParams truth = start;
  truth.device.attention_efficiency = 0.3;
  truth.device.gemm_max_efficiency = 0.7;
  truth.device.gemm_half_dim = 180;
  truth.device.gemm_unaligned_factor = 0.6;
  truth.device.elementwise_efficiency = 0.55;
  truth.device.kernel_launch = Seconds{6e-6};
  measure(data, pred, truth, 0.02, 11);

  FitOptions fo;
  fo.candidates = params({"compute.gemm_max_efficiency", "compute.gemm_half_dim", "compute.gemm_unaligned_factor",
                          "compute.elementwise_efficiency", "compute.kernel_launch_us", "compute.d2d_copy_gbps",
                          "compute.attention_efficiency"});
  const FitResult r = fit(predict_fn(pred), data.obs, start, fo);
  within(r, "compute.attention_efficiency", 0.3);
  within(r, "compute.gemm_max_efficiency", 0.7);
  within(r, "compute.gemm_half_dim", 180);
  within(r, "compute.gemm_unaligned_factor", 0.6);
  within(r, "compute.elementwise_efficiency", 0.55);
  within(r, "compute.kernel_launch_us", 6.0);
  // No copy was measured: the copy bandwidth is refused, naming what would determine it.
  const Refusal* d2d = refusal(r, "compute.d2d_copy_gbps");
  REQUIRE(d2d != nullptr);
  CHECK(d2d->reason.find("no fitted observation depends on it") != std::string::npos);
  CHECK(d2d->reason.find("device-to-device copies") != std::string::npos);
}

TEST_CASE("measurements inside one node leave the inter-node factors unfitted, with the measurement that would fit them") {
  const sim::ClusterSpec cluster = sim::load_cluster("8xA100-80GB-NVSwitch", 2);
  Dataset data;
  for (std::int64_t b = 1024; b <= (std::int64_t{1} << 30); b *= 4)
    data.obs.push_back(collective(zero::CollKind::all_reduce, 8, 1, b));
  const Predictor pred(data, cluster);
  ModelParams start;
  start.device = sim::default_profile(sim::find_device(cluster.gpu));
  start.collective = cluster.collective;
  ModelParams truth = start;
  scale_cells(truth, "collective.intra.bandwidth", 0.8);
  measure(data, pred, truth, 0.01, 3);
  FitOptions fo;
  fo.candidates = default_fit_set(false, true, false, false);
  const FitResult r = fit(predict_fn(pred), data.obs, start, fo);
  REQUIRE(fitted(r, "collective.intra.bandwidth") != nullptr);
  for (const char* name : {"collective.inter.bandwidth", "collective.inter.latency.ring", "collective.inter.latency.tree"}) {
    CAPTURE(name);
    const Refusal* x = refusal(r, name);
    REQUIRE(x != nullptr);
    CHECK(x->reason.find("collectives across nodes") != std::string::npos);
  }
  within(r, "collective.intra.bandwidth", 0.8);
}

TEST_CASE("parameters that move the same measurements alike are refused, naming the one kept") {
  // One message size repeated: latency, bandwidth and the fill term all set the one time.
  const sim::ClusterSpec cluster = sim::load_cluster("8xA100-80GB-NVSwitch");
  Dataset data;
  for (int i = 0; i < 6; ++i) data.obs.push_back(collective(zero::CollKind::all_reduce, 8, 1, 64 << 20));
  const Predictor pred(data, cluster);
  ModelParams start;
  start.device = sim::default_profile(sim::find_device(cluster.gpu));
  measure(data, pred, start, 0.01, 5);
  FitOptions fo;
  fo.candidates = params({"collective.intra.bandwidth", "collective.intra.latency", "collective.fill_fraction"});
  const FitResult r = fit(predict_fn(pred), data.obs, start, fo);
  CHECK(r.fitted.size() == 1);
  REQUIRE(fitted(r, "collective.intra.bandwidth") != nullptr);
  const Refusal* fill = refusal(r, "collective.fill_fraction");
  REQUIRE(fill != nullptr);
  CHECK(fill->reason.find("cannot tell it from collective.intra.bandwidth") != std::string::npos);
  CHECK(fill->reason.find("mid-size messages") != std::string::npos);
}

TEST_CASE("--fit: groups, names, the closest name for a typo, and overlapping parameters") {
  const auto all = parse_fit_spec("compute,host");
  CHECK(std::any_of(all.begin(), all.end(), [](const ParamDef* d) { return d->name == "host.grad_hook_us"; }));
  CHECK(std::none_of(all.begin(), all.end(), [](const ParamDef* d) { return d->group == ParamGroup::collective; }));
  CHECK(parse_fit_spec("collective.inter.bandwidth.ring.simple").size() == 1);
  CHECK_THROWS_WITH_AS(parse_fit_spec("compute.gemm_max_eficiency"),
                       doctest::Contains("did you mean 'compute.gemm_max_efficiency'"), InputError);
  CHECK_THROWS_WITH_AS(parse_fit_spec("collective.intra.bandwidth,collective.intra.bandwidth.ring"),
                       doctest::Contains("change the same coefficient"), InputError);
  CHECK_THROWS_AS(parse_fit_spec(" , "), InputError);
}

TEST_CASE("a tied collective factor moves its cells together and keeps their ratios") {
  ModelParams m;
  const ParamDef* ring = find_param("collective.inter.bandwidth.ring");
  const ParamDef* all = find_param("collective.inter.bandwidth");
  REQUIRE(ring != nullptr);
  REQUIRE(all != nullptr);
  ring->set(m, 2.0);
  CHECK(ring->get(m) == zp::test::approx(2.0));
  const double before = all->get(m);
  all->set(m, before * 0.5);
  CHECK(ring->get(m) == zp::test::approx(1.0));
  CHECK(all->get(m) == zp::test::approx(before * 0.5));
  using CC = sim::CollectiveCoefficients;
  CHECK(m.collective.bandwidth[CC::at(CC::inter, 0, 2)] == zp::test::approx(1.0));   // ring Simple
  CHECK(m.collective.bandwidth[CC::at(CC::inter, 1, 2)] == zp::test::approx(0.5));   // tree Simple
  CHECK(m.collective.bandwidth[CC::at(CC::intra, 0, 2)] == 1.0);                    // the other level untouched
}

TEST_CASE("the alpha-beta line of a collective curve, in closed form") {
  std::vector<double> s, t;
  for (double b = 1e3; b <= 1e9; b *= 10) {
    s.push_back(b);
    t.push_back(12e-6 + b / 40e9);
  }
  const AlphaBeta ab = fit_alpha_beta(s, t);
  CHECK(ab.points == 7);
  CHECK(ab.alpha_s == zp::test::approx(12e-6).epsilon(1e-9));
  CHECK(ab.beta == zp::test::approx(40e9).epsilon(1e-9));
  CHECK(ab.rms_rel < 1e-12);
  // A line through the origin: no negative latency.
  std::vector<double> t2;
  for (double b : s) t2.push_back(b / 10e9);
  const AlphaBeta ab2 = fit_alpha_beta(s, t2);
  CHECK(ab2.alpha_s >= 0);
  CHECK(ab2.beta == zp::test::approx(10e9).epsilon(1e-6));
}

TEST_CASE("the GEMM efficiency curve, in closed form") {
  std::vector<std::array<double, 3>> mnk;
  std::vector<double> eff;
  for (double m : {64.0, 256.0, 1024.0, 4096.0})
    for (double n : {128.0, 2048.0})
      for (double k : {256.0, 8192.0}) {
        mnk.push_back({m, n, k});
        eff.push_back(0.81 * m / (m + 222) * n / (n + 222) * k / (k + 222));
      }
  const GemmCurve g = fit_gemm_curve(mnk, eff);
  CHECK(g.max_efficiency == zp::test::approx(0.81).epsilon(1e-4));
  CHECK(g.half_dim == zp::test::approx(222).epsilon(1e-4));
  CHECK(g.rms_rel < 1e-6);
}

TEST_CASE("the robust loss keeps a class the model cannot represent from bending the rest") {
  const sim::ClusterSpec cluster = sim::single_node("H200-141GB", 1);
  Dataset data;
  for (std::int64_t b = 1 << 20; b <= (std::int64_t{1} << 30); b *= 2) data.obs.push_back(kernel(KernelClass::memory, {}, false, 0, b));
  const Predictor pred(data, cluster);
  ModelParams start;
  start.device = sim::default_profile(sim::find_device("H200-141GB"));
  ModelParams truth = start;
  truth.device.elementwise_efficiency = 0.5;
  measure(data, pred, truth, 0.01, 17);
  // Two observations three times slower than anything the model can say.
  data.obs[3].measured = Seconds{data.obs[3].measured.v * 3};
  data.obs[7].measured = Seconds{data.obs[7].measured.v * 3};
  FitOptions fo;
  fo.candidates = params({"compute.elementwise_efficiency"});
  const FitResult robust = fit(predict_fn(pred), data.obs, start, fo);
  fo.robust_scale = 0;
  const FitResult ls = fit(predict_fn(pred), data.obs, start, fo);
  const double er = std::abs(fitted(robust, "compute.elementwise_efficiency")->value - 0.5);
  const double el = std::abs(fitted(ls, "compute.elementwise_efficiency")->value - 0.5);
  CHECK(er < 0.3 * el);
}

// An fp32 GEMM is priced on the cores it ran on: the fp32 cores when the measurement says
// TF32 was off (zeroplan's kernels, PyTorch's default), TF32 at half the 16-bit tensor peak
// when on; the profile's fp32_gemm_tf32 (what the planned stack does) does not override it.
TEST_CASE("fp32 GEMM observations are priced with their own TF32 setting") {
  const sim::ClusterSpec cluster = sim::single_node("H200-141GB", 1);
  Dataset data;
  for (bool tf32 : {false, true}) {
    Observation o = kernel(KernelClass::gemm, {models::Gemm{8192, 8192, 8192, 1}}, false, 2.0 * 8192.0 * 8192.0 * 8192.0,
                           4 * 3 * 8192 * 8192);
    o.kernel.dtype = DType::fp32;
    o.kernel.tf32 = tf32;
    data.obs.push_back(o);
  }
  const Predictor pred(data, cluster);
  for (bool profile_tf32 : {false, true}) {
    ModelParams m;
    m.device = sim::default_profile(sim::find_device("H200-141GB"));
    m.device.fp32_gemm_tf32 = profile_tf32;
    const auto t = pred.predict(m);
    CAPTURE(profile_tf32);
    // fp32 cores (67 TFLOP/s) against TF32 (half of 989): 7.4 times slower at the same
    // efficiency, less the fp32 cores' curve's (fp32_gemm_half_dim) higher one at 8192³.
    const double fp32_eff = sim::gemm_efficiency(m.device, 8192, 8192, 8192, 1, true);
    const double tc_eff = sim::gemm_efficiency(m.device, 8192, 8192, 8192, 1, false);
    CHECK(fp32_eff > tc_eff);
    CHECK(t[0] / t[1] == zp::test::approx(0.5 * 989.0 / 67.0 * tc_eff / fp32_eff).epsilon(0.01));
    const double flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
    CHECK(flops / t[0] < 67e12);
    CHECK(flops / t[0] > 0.5 * 67e12);
  }
}

// Attention that ran cuDNN's kernel (train --attention-kernel cudnn) is priced on PyTorch's
// kernel's curve (torch_attention_half_seq), the executor's own kernel on attention_half_seq.
TEST_CASE("attention observations are priced as the kernel that ran them: the executor's or cuDNN's") {
  const sim::ClusterSpec cluster = sim::single_node("H200-141GB", 1);
  Dataset data;
  for (bool cudnn : {false, true}) {
    Observation o = attention(16, 16, 512, 64, false);  // the products' time, not their bytes'
    o.kernel.cudnn_attention = cudnn;
    data.obs.push_back(o);
  }
  const Predictor pred(data, cluster);
  ModelParams m;
  m.device = sim::default_profile(sim::find_device("H200-141GB"));
  m.device.attention_half_seq = 200;
  m.device.torch_attention_half_seq = 16;
  m.device.executor_attention_efficiency = m.device.executor_attention_backward_efficiency = 1;  // the curves alone
  auto t = pred.predict(m);
  CHECK(t[1] < 0.8 * t[0]);
  m.device.torch_attention_half_seq = 200;
  t = pred.predict(m);
  CHECK(t[1] == zp::test::approx(t[0]));
  // The executor's own kernel's factor prices its kernel and not cuDNN's.
  m.device.executor_attention_efficiency = 0.5;
  const auto t2 = pred.predict(m);
  CHECK(t2[0] > 1.5 * t[0]);
  CHECK(t2[1] == zp::test::approx(t[1]));
}

// A product whose output rows are padded (the fused loss's logits, a vocabulary off the 8-element
// alignment) is priced as aligned, as the simulator prices the event: GPT-2 medium's LM head,
// forward, 2.3 ms measured on an H100, was priced as an unaligned product at 11.3 ms.
TEST_CASE("a GEMM observation with padded output rows is priced as the aligned product") {
  const sim::ClusterSpec cluster = sim::single_node("H100-80GB", 1);
  Dataset data;
  for (bool padded : {false, true}) {
    const double f = 2.0 * 16384.0 * 50257.0 * 1024.0;
    Observation o = kernel(KernelClass::gemm, {models::Gemm{16384, 50257, 1024, 1}}, false, f, 16384LL * 50264 * 2);
    o.kernel.op_kind = models::OpKind::linear;
    o.kernel.padded_rows = padded;
    o.measured = Seconds{2.3e-3};
    data.obs.push_back(o);
  }
  const Predictor pred(data, cluster);
  ModelParams m;
  m.device = sim::default_profile(sim::find_device("H100-80GB"));
  const auto t = pred.predict(m);
  CHECK(t[1] < 0.5 * t[0]);
  // Saved and read back, the observation keeps it.
  const std::string file = (std::filesystem::temp_directory_path() / "zp_padded_rows_obs.json").string();
  save_observations(data, file, "--save-observations");
  const Dataset back = read_observations(file);
  REQUIRE(back.obs.size() == 2);
  CHECK_FALSE(back.obs[0].kernel.padded_rows);
  CHECK(back.obs[1].kernel.padded_rows);
}

// Fused attention has its own factor: it moves attention kernels and nothing else, and without
// an attention measurement it is refused, naming the measurement that would determine it.
TEST_CASE("fused attention kernels are priced with compute.attention_efficiency, and only they") {
  const sim::ClusterSpec cluster = sim::single_node("H200-141GB", 1);
  Dataset data;
  data.obs.push_back(attention(8, 12, 1024, 64, false));
  data.obs.push_back(kernel(KernelClass::gemm, {models::Gemm{8192, 8192, 8192, 1}}, false, 2.0 * 8192.0 * 8192.0 * 8192.0,
                            2 * 3 * 8192 * 8192));
  const Predictor pred(data, cluster);
  ModelParams m;
  m.device = sim::default_profile(sim::find_device("H200-141GB"));
  const auto a = pred.predict(m);
  m.device.attention_efficiency = 0.25;
  const auto b = pred.predict(m);
  CHECK(b[0] == zp::test::approx(4.0 * a[0]).epsilon(0.05));  // FLOP-bound: 1/4 the efficiency, ~4x the time
  CHECK(b[1] == a[1]);

  Dataset gemms;
  gemms.obs.push_back(data.obs[1]);
  const Predictor only_gemm(gemms, cluster);
  ModelParams start;
  start.device = sim::default_profile(sim::find_device("H200-141GB"));
  gemms.obs[0].measured = Seconds{only_gemm.predict(start)[0] * 1.3};
  FitOptions fo;
  fo.candidates = params({"compute.gemm_max_efficiency", "compute.attention_efficiency"});
  const FitResult r = fit(predict_fn(only_gemm), gemms.obs, start, fo);
  const Refusal* att = refusal(r, "compute.attention_efficiency");
  REQUIRE(att != nullptr);
  CHECK(att->reason.find("fused attention forward kernels") != std::string::npos);
  CHECK(fitted(r, "compute.gemm_max_efficiency") != nullptr);
}

// Kernels of GPT-2 124M (bf16, micro-batch 8, sequence 1024) as `calibrate --device cuda`
// measured them on an H200 (2026-12-03, CUDA 13.0): cuBLASLt GEMMs and zeroplan's own fused
// attention, 1.6x (forward) and 3.4x (backward) slower than the GEMM curve prices its products.
// Attention's own factor absorbs that: the GEMM curve is fitted to the GEMMs, not dragged
// down to the attention kernel (which once made GEMM predictions 3x too slow).
TEST_CASE("measured H200 kernels: the slow attention kernel moves its own factor, not the GEMM curve") {
  const sim::ClusterSpec cluster = sim::single_node("H200-141GB", 1);
  struct G {
    std::int64_t m, n, k;
    bool bwd;
    double us;
  };
  const G gemms[] = {{8192, 50257, 768, true, 11255.15}, {8192, 50257, 768, false, 5092.36},
                     {8192, 3072, 768, true, 100.78},    {8192, 768, 3072, true, 115.31},
                     {8192, 2304, 768, true, 83.24},     {8192, 3072, 768, false, 56.35},
                     {8192, 768, 3072, false, 50.88},    {8192, 2304, 768, false, 44.46},
                     {8192, 768, 768, true, 38.79},      {8192, 768, 768, false, 16.18},
                     {256, 256, 256, false, 9.84},       {1024, 1024, 1024, false, 9.72},
                     {4096, 4096, 4096, false, 162.80},  {8192, 8192, 8192, false, 1384.91},
                     {4096, 4097, 1024, false, 310.07}};
  Dataset data;
  for (const G& g : gemms) {
    const double f = (g.bwd ? 4.0 : 2.0) * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
    Observation o = kernel(KernelClass::gemm, {models::Gemm{g.m, g.n, g.k, 1}}, g.bwd, f,
                           (g.bwd ? 2 : 1) * 2 * (g.m * g.k + g.k * g.n + g.m * g.n));
    o.measured = Seconds{g.us * 1e-6};
    data.obs.push_back(o);
  }
  Observation fwd = attention(8, 12, 1024, 64, false), bwd = attention(8, 12, 1024, 64, true);
  fwd.measured = Seconds{149.57e-6};
  bwd.measured = Seconds{644.21e-6};
  data.obs.push_back(fwd);
  data.obs.push_back(bwd);
  const Predictor pred(data, cluster);
  ModelParams start;
  start.device = sim::default_profile(sim::find_device("H200-141GB"));
  FitOptions fo;
  fo.candidates = default_fit_set(true, false, false, false);
  const FitResult r = fit_in_two_passes(
      predict_fn(pred), data.obs, start, fo, [](const Observation& o) { return o.kernel.cls == KernelClass::attention; },
      params({"compute.attention_efficiency", "compute.attention_backward_efficiency"}));
  std::string why;
  for (const auto& x : r.refused) why += x.name + ": " + x.reason + "\n";
  for (const auto& x : r.fitted) why += fmt::format("{} = {} ± {}\n", x.def->name, x.value, x.sd);
  CAPTURE(why);
  auto mape = [&](const ModelParams& m, KernelClass cls) {
    const auto t = pred.predict(m);
    double s = 0;
    int n = 0;
    for (std::size_t i = 0; i < t.size(); ++i)
      if (data.obs[i].kernel.cls == cls) {
        s += std::abs(t[i] / data.obs[i].measured.v - 1);
        ++n;
      }
    return s / n;
  };
  const double gemm_before = mape(start, KernelClass::gemm), gemm_after = mape(r.after, KernelClass::gemm);
  const double att_before = mape(start, KernelClass::attention), att_after = mape(r.after, KernelClass::attention);
  MESSAGE(fmt::format("GEMM MAPE {:.1f}% -> {:.1f}%, attention {:.1f}% -> {:.1f}%", 100 * gemm_before, 100 * gemm_after,
                      100 * att_before, 100 * att_after));
  CHECK(gemm_after < 0.5 * gemm_before);
  CHECK(att_after < 0.8 * att_before);
  for (const char* a : {"compute.attention_efficiency", "compute.attention_backward_efficiency"}) {
    CAPTURE(a);
    const FittedParam* att = fitted(r, a);
    REQUIRE(att != nullptr);
    CHECK(att->value < 1.0);  // zeroplan's attention kernels run below the GEMMs they stand for
    CHECK(att->sd < 0.5 * att->value);
  }
  const FittedParam* g = fitted(r, "compute.gemm_max_efficiency");
  REQUIRE(g != nullptr);
  CHECK(g->value > 0.5);
  // The joint fit, for contrast, is what the two passes avoid.
  const FitResult joint = fit(predict_fn(pred), data.obs, start, fo);
  CHECK(mape(joint.after, KernelClass::gemm) > gemm_after);
}
