#pragma once
// Many runs in one launch: copies, additions and zero-fills of contiguous runs of one
// (destination, source) dtype pair, and the sum of squares of many runs, with the results of
// the one-run kernels (convert, add_mixed / copy_accumulate, a memset, sum_squares) except
// the order of the norm's double sum. exec::RunBatch says which runs may go together.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

struct MultiRun {
  MultiRun() = default;
  MultiRun(void* y_, const void* x_, std::int64_t n_, const void* x2_ = nullptr) : y(y_), x(x_), n(n_), x2(x2_) {}
  void* y = nullptr;        // the destination (unused by multi_sum_squares)
  const void* x = nullptr;  // the source (unused by a zero-fill)
  std::int64_t n = 0;
  // A second source in x's dtype (copy and sum of squares; null: none): the run reads
  // x + x2 summed in fp32, as a copy of x followed by an addition of x2 into an fp32 (or
  // x-typed) destination gives.
  const void* x2 = nullptr;
};

enum class MultiMode : int { copy, add, zero };

// For every run: y = round(x) (copy; round(x + x2) with the sum in fp32 where the run has
// x2), y = round(y + x) with the sum in fp32 (add), or y = 0 (zero), y in y_dt and x in x_dt
// (fp32, bf16, fp16). No two runs may overlap where one writes. x2 only in copy mode.
void multi_map(const MultiRun* runs, std::int64_t count, MultiMode mode, DType y_dt, DType x_dt,
               cudaStream_t stream);

// out[0] += the sum over every run of x² (double; (x + x2)² with the sum in fp32 where the run
// has x2), in a fixed order: each block's partial sum of a slice of one run, then the partials
// in order (ctx's scratch holds them).
void multi_sum_squares(Context& ctx, double* out, const MultiRun* runs, std::int64_t count, DType dt,
                       cudaStream_t stream);

}  // namespace zp::kernels::cuda
