#pragma once
// Instruction-set variants of the GEMM, chosen when the program runs.
//
// The kernels are built for the portable x86-64 baseline, so a binary runs on any x86-64 CPU.
// The GEMM (kernels/cpu/gemm_isa.cpp, through Eigen) is also built for x86-64-v3 (AVX2 + FMA)
// and x86-64-v4 (AVX-512), and the first call picks the best variant this CPU runs.
// ZEROPLAN_CPU_ISA=baseline|avx2|avx512 asks for a lower one (tests and benchmarks compare
// them). With ZEROPLAN_NATIVE the whole library is built for the build machine's CPU and
// there is one variant, `native`.
//
// The variants differ in rounding only: Eigen's blocking and fused multiply-adds depend on
// the vector width. Every other kernel is built with -ffp-contract=off and vectorises
// without reassociating, so its bits do not depend on the instruction set.
#include <cstdint>
#include <span>

namespace zp::kernels::cpu {

enum class Isa : std::uint8_t { baseline, avx2, avx512, native };
const char* isa_name(Isa isa);

// Variants compiled into this binary, lowest first.
std::span<const Isa> built_isas();
// Whether this CPU can run `isa`.
bool cpu_supports(Isa isa);
// The variant gemm() uses: the best one this CPU runs, or the one ZEROPLAN_CPU_ISA asks for.
// Throws zp::InputError when ZEROPLAN_CPU_ISA names no variant, or one this binary or CPU lacks.
Isa gemm_isa();

// gemm() (kernels/cpu/bmm.hpp) of a given variant. Throws zp::InputError when the variant is
// not built into this binary or this CPU cannot run it.
using GemmFn = void (*)(float* c, const float* a, const float* b, std::int64_t m, std::int64_t n, std::int64_t k,
                        bool trans_a, bool trans_b, bool accumulate);
GemmFn gemm_fn(Isa isa);

}  // namespace zp::kernels::cpu
