#include "kernels/cpu/isa.hpp"

#include <array>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "core/error.hpp"

// One declaration per variant the build compiled (kernels/CMakeLists.txt defines which).
#define ZP_DECLARE_GEMM(variant)                                                                               \
  namespace zp::kernels::cpu::variant {                                                                        \
  void gemm(float* c, const float* a, const float* b, std::int64_t m, std::int64_t n, std::int64_t k,          \
            bool trans_a, bool trans_b, bool accumulate);                                                      \
  }
#if defined(ZP_GEMM_NATIVE)
ZP_DECLARE_GEMM(native)
#else
ZP_DECLARE_GEMM(baseline)
#if defined(ZP_GEMM_AVX2)
ZP_DECLARE_GEMM(avx2)
#endif
#if defined(ZP_GEMM_AVX512)
ZP_DECLARE_GEMM(avx512)
#endif
#endif
#undef ZP_DECLARE_GEMM

namespace zp::kernels::cpu {

namespace {

constexpr auto kBuilt = std::to_array<Isa>({
#if defined(ZP_GEMM_NATIVE)
    Isa::native,
#else
    Isa::baseline,
#if defined(ZP_GEMM_AVX2)
    Isa::avx2,
#endif
#if defined(ZP_GEMM_AVX512)
    Isa::avx512,
#endif
#endif
});

bool built(Isa isa) {
  for (const Isa b : kBuilt)
    if (b == isa) return true;
  return false;
}

std::string built_list() {
  std::string s;
  for (const Isa b : kBuilt) s += fmt::format("{}{}", s.empty() ? "" : ", ", isa_name(b));
  return s;
}

Isa best_supported() {
  Isa best = kBuilt.front();
  for (const Isa b : kBuilt)
    if (cpu_supports(b)) best = b;
  return best;
}

Isa choose() {
  const char* env = std::getenv("ZEROPLAN_CPU_ISA");
  if (env == nullptr || *env == '\0') return best_supported();
  const std::string want = env;
  for (const Isa b : kBuilt) {
    if (want != isa_name(b)) continue;
    if (!cpu_supports(b))
      throw InputError("ZEROPLAN_CPU_ISA", "",
                       fmt::format("'{}' is not supported by this CPU; it runs {}", want, isa_name(best_supported())));
    return b;
  }
  throw InputError("ZEROPLAN_CPU_ISA", "",
                   fmt::format("'{}' is not a GEMM variant of this build; allowed: {}", want, built_list()));
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::baseline: return "baseline";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::native: return "native";
  }
  return "?";
}

std::span<const Isa> built_isas() { return kBuilt; }

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::baseline:
    case Isa::native: return true;  // native: the build machine's CPU, assumed to be this one
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case Isa::avx2: return __builtin_cpu_supports("x86-64-v3") > 0;
    case Isa::avx512: return __builtin_cpu_supports("x86-64-v4") > 0;
#else
    case Isa::avx2:
    case Isa::avx512: return false;
#endif
  }
  return false;
}

Isa gemm_isa() {
  static const Isa chosen = choose();  // decided once; the environment is read at the first GEMM
  return chosen;
}

GemmFn gemm_fn(Isa isa) {
  if (!built(isa) || !cpu_supports(isa))
    throw InputError("ZEROPLAN_CPU_ISA", "",
                     fmt::format("GEMM variant '{}' is not available here; built: {}", isa_name(isa), built_list()));
  switch (isa) {
#if defined(ZP_GEMM_NATIVE)
    case Isa::native: return native::gemm;
#else
    case Isa::baseline: return baseline::gemm;
#if defined(ZP_GEMM_AVX2)
    case Isa::avx2: return avx2::gemm;
#endif
#if defined(ZP_GEMM_AVX512)
    case Isa::avx512: return avx512::gemm;
#endif
#endif
    default: break;
  }
  return nullptr;  // unreachable: built() listed every case above
}

}  // namespace zp::kernels::cpu
