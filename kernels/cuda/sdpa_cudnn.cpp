// cuDNN's fused flash attention through cudnn-frontend's SDPA graphs (sdpa_cudnn.cuh).
// Without cuDNN in the build, every entry point says so (sdpa_cudnn_refusal) or throws.
#include "kernels/cuda/sdpa_cudnn.cuh"

#include <fmt/format.h>

#include <bit>
#include <cstdlib>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels/common/sdpa_dims.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/layout.cuh"

#ifdef ZP_HAVE_CUDNN
// cuDNN is opened at run time (sdpa_cudnn_load), on the first use of cuDNN's attention, not
// linked: a binary built with it starts where it is missing, and only `--attention-kernel
// cudnn` asks for it. NVRTC, which cudnn-frontend's run-time compiled engines use, is opened by
// cudnn-frontend itself, and only for those.
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <dlfcn.h>
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace zp::kernels::cuda {

std::string sdpa_cudnn_refusal(std::int64_t T, std::int64_t D, DType dt) {
  if (!sdpa_cudnn_built())
    return "this build has no cuDNN attention (cuDNN 9 and cudnn-frontend's headers were not found at configure "
           "time: scripts/setup.sh puts the headers in .deps/)";
  if (const std::string why = sdpa_cudnn_load(); !why.empty()) return why;
  const bool sixteen = dt == DType::bf16 || dt == DType::fp16;
  if (sdpa_cudnn_takes(T, D, sixteen)) return "";
  if (!sixteen) return fmt::format("cuDNN's attention takes bf16 or fp16 storage, not {}", dtype_name(dt));
  if (T <= 1) return fmt::format("cuDNN's attention takes more than one position, not {}", T);
  return fmt::format("cuDNN's attention takes head dims that are multiples of 8 up to 128, not {}", D);
}

#ifndef ZP_HAVE_CUDNN

bool sdpa_cudnn_built() { return false; }
std::string sdpa_cudnn_load() { return sdpa_cudnn_refusal(2, 64, DType::bf16); }
std::int64_t sdpa_cudnn_version() { return 0; }

namespace {
[[noreturn]] void not_built() { throw CudaError(sdpa_cudnn_refusal(2, 64, DType::bf16)); }
}  // namespace

void sdpa_cudnn_forward(Context&, void*, float*, const void*, const void*, const void*, std::int64_t, std::int64_t,
                        std::int64_t, std::int64_t, std::int64_t, bool, float, float, const std::int64_t*, DType,
                        cudaStream_t, const SdpaCudnnLayout&) {
  not_built();
}
void sdpa_cudnn_backward(Context&, void*, void*, void*, const void*, const void*, const void*, const void*,
                         const void*, const float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         bool, float, float, const std::int64_t*, DType, cudaStream_t, SdpaAccumulate,
                         const SdpaCudnnLayout&) {
  not_built();
}
SdpaCudnnWorkspace sdpa_cudnn_workspace(Context&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                        bool, float, float, DType) {
  not_built();
}

#else

}  // namespace zp::kernels::cuda

// cudnn-frontend's dynamic loading reads the library's handle from here.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace zp::kernels::cuda {

bool sdpa_cudnn_built() { return true; }

std::string sdpa_cudnn_load() {
  // Once per process: cuDNN 9's front library (it opens its engine libraries from its own
  // folder), found as the dynamic loader finds any (LD_LIBRARY_PATH, the ld.so cache), or the
  // file ZEROPLAN_CUDNN_LIBRARY names (another cuDNN than the system's: PyTorch's wheel's, say).
  static const std::string why = [] {
    // cudnn-frontend opens a CUDA runtime of its own for its memsets and copies, the first of
    // libcudart.so.12 and .13 it finds: the one this binary runs on, unless the user chose.
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", fmt::format("libcudart.so.{}", CUDART_VERSION / 1000).c_str(), 0);
    const char* env = std::getenv("ZEROPLAN_CUDNN_LIBRARY");
    const std::string lib = env != nullptr && *env != '\0' ? env : "libcudnn.so.9";
    dlerror();
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* e = dlerror();
      return fmt::format("cuDNN 9 could not be loaded ({}); install cuDNN 9, put its lib folder on "
                         "LD_LIBRARY_PATH or name the library in ZEROPLAN_CUDNN_LIBRARY, or use --attention-kernel own",
                         e != nullptr ? e : lib + " not found");
    }
    if (dlsym(h, "cudnnGetVersion") == nullptr) {
      dlclose(h);
      return fmt::format("{} is not cuDNN (no cudnnGetVersion in it); name cuDNN 9's libcudnn.so.9 in "
                         "ZEROPLAN_CUDNN_LIBRARY, or use --attention-kernel own",
                         lib);
    }
    cudnn_frontend::cudnn_dlhandle = h;
    if (const std::size_t v = cudnn_frontend::detail::get_backend_version(); v < 90000)
      return fmt::format("{} is cuDNN {}; cuDNN's attention takes cuDNN 9 or later", lib, v);
    return std::string();
  }();
  return why;
}

std::int64_t sdpa_cudnn_version() {
  return sdpa_cudnn_load().empty() ? static_cast<std::int64_t>(cudnn_frontend::detail::get_backend_version()) : 0;
}

namespace {

namespace fe = cudnn_frontend;

// The backend's calls through cudnn-frontend's loader (fe::detail: dlsym on the handle above).
const char* status_name(cudnnStatus_t st) { return fe::detail::get_error_string(st); }
std::size_t loaded_version() { return fe::detail::get_backend_version(); }

// The graphs' tensors by uid.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeed, kOffset };

struct Shape {
  std::int64_t B, H, Hk, T, D;
  bool causal;
  float scale, p;
  DType dt;
  SdpaCudnnLayout layout;
  auto key(bool backward) const {
    return std::tuple_cat(std::make_tuple(backward, B, H, Hk, T, D, causal, std::bit_cast<std::uint32_t>(scale),
                                          std::bit_cast<std::uint32_t>(p), static_cast<int>(dt)),
                          layout.key());
  }
  // An operand of X heads (H or Hk), its dims and strides: contiguous heads (row 0) or
  // D-column blocks of (B, T, row).
  std::vector<std::int64_t> dim(std::int64_t X) const { return {B, X, T, D}; }
  std::vector<std::int64_t> stride(std::int64_t row, std::int64_t X) const {
    if (row == 0) return {X * T * D, T * D, D, 1};
    return {T * row, D, row, 1};
  }
};
using Key = decltype(std::declval<Shape>().key(false));

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  bool executed = false;  // its first execution loads its engine's kernels: measured (run)
};

// The Context's cuDNN state (Context::cudnn_state): one handle, the graphs built so far.
struct State {
  cudnnHandle_t handle = nullptr;
  std::map<Key, Built> graphs;
  State() {
    if (const std::string why = sdpa_cudnn_load(); !why.empty()) throw CudaError(why);
    const cudnnStatus_t st = fe::detail::create_handle(&handle);
    if (st != CUDNN_STATUS_SUCCESS)
      throw CudaError(fmt::format("cudnnCreate: {} (cuDNN {} at run time)", status_name(st), loaded_version()));
  }
  ~State() {
    graphs.clear();  // their plans were built with the handle: released before it
    if (handle != nullptr) fe::detail::destroy_handle(handle);
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;
};

State& state(Context& ctx) {
  auto& slot = ctx.cudnn_state();
  if (!slot) {
    const std::int64_t before = driver_used_bytes();
    slot = std::make_shared<State>();
    ctx.add_driver_growth(Context::Library::cudnn, driver_used_bytes() - before);
  }
  return *static_cast<State*>(slot.get());
}

void check(fe::error_t e, const char* step, const Shape& s) {
  if (e.is_good()) return;
  throw CudaError(fmt::format("cuDNN attention ({} B={} H={}{} T={} D={}{}{}, cuDNN {}): {}", step, s.B, s.H,
                              s.Hk != s.H ? fmt::format(" Hk={}", s.Hk) : "", s.T, s.D, s.causal ? " causal" : "",
                              s.p > 0 ? fmt::format(" dropout {}", s.p) : "", loaded_version(), e.get_message()));
}

std::shared_ptr<fe::graph::Tensor_attributes> heads(fe::graph::Graph& g, const char* name, std::int64_t uid,
                                                    const Shape& s, std::int64_t row, std::int64_t X) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(s.dim(X)).set_stride(s.stride(row, X)));
}
std::shared_ptr<fe::graph::Tensor_attributes> stats(fe::graph::Graph& g, const Shape& s) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("stats")
                      .set_uid(kStats)
                      .set_dim({s.B, s.H, s.T, 1})
                      .set_stride({s.H * s.T, s.T, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}
std::shared_ptr<fe::graph::Tensor_attributes> scalar(fe::graph::Graph& g, const char* name, std::int64_t uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_alignment(8)  // the offset is rng_state's second int64
                      .set_data_type(fe::DataType_t::INT64));
}

// Causal as torch's is_causal: key j <= query i (the diagonal from the top left).
template <class Attributes>
void mask(Attributes& a, const Shape& s) {
  if (s.causal) a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
}

Built& graph(Context& ctx, const Shape& s, bool backward) {
  State& st = state(ctx);
  const Key key = s.key(backward);
  if (auto it = st.graphs.find(key); it != st.graphs.end()) return it->second;
  const std::int64_t before = driver_used_bytes();  // its engine's plans (run-time compiled kernels)
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s.dt == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const SdpaCudnnLayout& l = s.layout;
  auto q = heads(*g, "q", kQ, s, l.q, s.H), k = heads(*g, "k", kK, s, l.k, s.Hk), v = heads(*g, "v", kV, s, l.v, s.Hk);
  if (!backward) {
    auto a = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(s.scale);
    mask(a, s);
    if (s.p > 0) a.set_dropout(s.p, scalar(*g, "seed", kSeed), scalar(*g, "offset", kOffset));
    auto [o, lse] = g->sdpa(q, k, v, a);
    o->set_output(true).set_uid(kO).set_dim(s.dim(s.H)).set_stride(s.stride(l.o, s.H));
    lse->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto a = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(s.scale);
    mask(a, s);
    if (s.p > 0) a.set_dropout(s.p, scalar(*g, "seed", kSeed), scalar(*g, "offset", kOffset));
    auto o = heads(*g, "o", kO, s, l.o, s.H), dout = heads(*g, "dout", kDO, s, l.o, s.H);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats(*g, s), a);
    dq->set_output(true).set_uid(kDQ).set_dim(s.dim(s.H)).set_stride(s.stride(l.dq, s.H));
    dk->set_output(true).set_uid(kDK).set_dim(s.dim(s.Hk)).set_stride(s.stride(l.dk, s.Hk));
    dv->set_output(true).set_uid(kDV).set_dim(s.dim(s.Hk)).set_stride(s.stride(l.dv, s.Hk));
  }
  check(g->validate(), "validate", s);
  check(g->build_operation_graph(st.handle), "build_operation_graph", s);
  check(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", s);
  check(g->check_support(), "check_support", s);
  check(g->build_plans(), "build_plans", s);
  Built b{g, 0};
  check(g->get_workspace_size(b.workspace), "get_workspace_size", s);
  ctx.add_driver_growth(Context::Library::cudnn, driver_used_bytes() - before);
  return st.graphs.emplace(key, std::move(b)).first->second;
}

Shape shape_of(std::int64_t B, std::int64_t H, std::int64_t Hk, std::int64_t T, std::int64_t D, bool causal,
               float scale, float p, DType dt, const SdpaCudnnLayout& layout = {}) {
  if (const std::string why = sdpa_cudnn_refusal(T, D, dt); !why.empty()) throw std::invalid_argument(why);
  if (B <= 0 || H <= 0 || T <= 0) throw std::invalid_argument(fmt::format("cuDNN attention: B={} H={} T={}", B, H, T));
  if (Hk <= 0 || H % Hk != 0)
    throw std::invalid_argument(
        fmt::format("cuDNN attention: {} key/value heads for {} query heads (a divisor of them)", Hk, H));
  if (!(p >= 0.0f && p < 1.0f)) throw std::invalid_argument(fmt::format("cuDNN attention: dropout {}", p));
  // A row narrower than its operand's heads would overlap them; cuDNN's loads want 16-byte rows.
  const auto [lq, lk, lv, lo, ldq, ldk, ldv] = layout.key();
  for (const auto& [row, X] : {std::pair{lq, H}, {lk, Hk}, {lv, Hk}, {lo, H}, {ldq, H}, {ldk, Hk}, {ldv, Hk}})
    if (row != 0 && (row < X * D || row * dtype_size(dt) % 16 != 0))
      throw std::invalid_argument(fmt::format("cuDNN attention: a row stride of {} for {} heads of {}", row, X, D));
  return {B, H, Hk, T, D, causal, scale, p, dt, layout};
}

std::size_t aligned(std::int64_t n) { return static_cast<std::size_t>(carve_aligned(n)); }

void run(Context& ctx, Built& b, const Shape& s, std::unordered_map<std::int64_t, void*>& pack, void* workspace,
         cudaStream_t stream, const char* what) {
  State& st = state(ctx);
  if (const cudnnStatus_t e = fe::detail::set_stream(st.handle, stream); e != CUDNN_STATUS_SUCCESS)
    throw CudaError(fmt::format("cudnnSetStream: {}", status_name(e)));
  const std::int64_t before = b.executed ? -1 : driver_used_bytes();
  check(b.graph->execute(st.handle, pack, workspace), what, s);
  if (before >= 0) ctx.add_driver_growth(Context::Library::cudnn, driver_used_bytes() - before);
  b.executed = true;
}

}  // namespace

void sdpa_cudnn_forward(Context& ctx, void* o, float* lse, const void* q, const void* k, const void* v, std::int64_t B,
                        std::int64_t H, std::int64_t Hk, std::int64_t T, std::int64_t D, bool causal, float scale,
                        float p, const std::int64_t* rng, DType dt, cudaStream_t stream,
                        const SdpaCudnnLayout& layout) {
  const Shape s = shape_of(B, H, Hk, T, D, causal, scale, p, dt, layout);
  Built& b = graph(ctx, s, false);
  std::unordered_map<std::int64_t, void*> pack{{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},
                                               {kV, const_cast<void*>(v)}, {kO, o},
                                               {kStats, lse}};
  if (p > 0) {
    pack[kSeed] = const_cast<std::int64_t*>(rng);
    pack[kOffset] = const_cast<std::int64_t*>(rng + 1);
  }
  void* w = b.workspace > 0 ? ctx.buffer(static_cast<std::size_t>(b.workspace)) : nullptr;
  run(ctx, b, s, pack, w, stream, "execute forward");
}

void sdpa_cudnn_backward(Context& ctx, void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                         const void* v, const void* o, const float* lse, std::int64_t B, std::int64_t H,
                         std::int64_t Hk, std::int64_t T, std::int64_t D, bool causal, float scale, float p,
                         const std::int64_t* rng, DType dt, cudaStream_t stream, SdpaAccumulate acc,
                         const SdpaCudnnLayout& layout) {
  shape_of(B, H, Hk, T, D, causal, scale, p, dt, layout);  // the caller's layouts, those added into too
  // A gradient written through a temporary is written there as contiguous heads.
  SdpaCudnnLayout l = layout;
  auto temp = [](void* grad, bool add) { return grad == nullptr || add; };
  if (temp(dq, acc.q)) l.dq = 0;
  if (temp(dk, acc.k)) l.dk = 0;
  if (temp(dv, acc.v)) l.dv = 0;
  const Shape s = shape_of(B, H, Hk, T, D, causal, scale, p, dt, l);
  Built& b = graph(ctx, s, true);
  // The workspace, then a temporary for each gradient to add into, or not wanted (nullptr):
  // cuDNN writes all three whole; dq's of H heads, dk's and dv's of Hk.
  const std::int64_t nq = B * H * T * D, nkv = B * Hk * T * D;
  const std::size_t one_q = aligned(nq * dtype_size(dt)), one_kv = aligned(nkv * dtype_size(dt));
  const std::size_t ws = aligned(b.workspace);
  const std::size_t temps = one_q * std::size_t{temp(dq, acc.q)} +
                            one_kv * (std::size_t{temp(dk, acc.k)} + std::size_t{temp(dv, acc.v)});
  auto* base = static_cast<char*>(ws + temps > 0 ? ctx.buffer(ws + temps) : nullptr);
  char* next = base + ws;
  auto out = [&](void* grad, bool add, std::size_t one) -> void* {
    if (!temp(grad, add)) return grad;
    void* t = next;
    next += one;
    return t;
  };
  void *tq = out(dq, acc.q, one_q), *tk = out(dk, acc.k, one_kv), *tv = out(dv, acc.v, one_kv);
  std::unordered_map<std::int64_t, void*> pack{
      {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},       {kV, const_cast<void*>(v)},
      {kO, const_cast<void*>(o)}, {kDO, const_cast<void*>(dout)},   {kStats, const_cast<float*>(lse)},
      {kDQ, tq},                  {kDK, tk},                        {kDV, tv}};
  if (p > 0) {
    pack[kSeed] = const_cast<std::int64_t*>(rng);
    pack[kOffset] = const_cast<std::int64_t*>(rng + 1);
  }
  run(ctx, b, s, pack, base, stream, "execute backward");
  // Added into each gradient as it lies (contiguous, or column blocks of its rows).
  auto add = [&](void* grad, const void* t, std::int64_t row, std::int64_t X) {
    if (grad == nullptr || t == grad) return;
    if (row == 0) copy_accumulate(grad, t, B * X * T * D, true, dt, stream);
    else split_heads_backward(grad, t, B, T, X, D, row, 0, true, dt, stream);
  };
  add(dq, tq, layout.dq, H);
  add(dk, tk, layout.dk, Hk);
  add(dv, tv, layout.dv, Hk);
}

SdpaCudnnWorkspace sdpa_cudnn_workspace(Context& ctx, std::int64_t B, std::int64_t H, std::int64_t Hk, std::int64_t T,
                                        std::int64_t D, bool causal, float scale, float p, DType dt) {
  const Shape s = shape_of(B, H, Hk, T, D, causal, scale, p, dt);
  return {graph(ctx, s, false).workspace, graph(ctx, s, true).workspace};
}

#endif

}  // namespace zp::kernels::cuda
