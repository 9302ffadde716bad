#pragma once
// Elementwise movements a device may run together: copies, additions, zero-fills and sums
// of squares over contiguous runs of its buffers (Device::copy, add, fill, norm_add), queued
// in call order and launched as a few multi-run kernels instead of one kernel per run. A
// step's flatten, unflatten, partition and norm events move every parameter's gradient in
// its own run: a few hundred launches of a few microseconds each on BERT-large.
//
// The queue keeps the result of running the runs one by one: a run that would write memory
// a queued run reads or writes, or read memory a queued run writes, does not fit, and the
// device runs the queue first. So within one take() no run depends on another, and its
// groups and their runs may run in any order, or at once. A sum of squares adds into the
// device's norm in its own order (fixed by the calls, so the same bits run to run).
//
// Two sources: a copy or a sum of squares may read the fp32 sum of two runs of one dtype
// (src + src2). A norm over two partitions (stage 2's accumulated micro-steps and the last
// one) pushes such a sum of squares; a copy followed at once by an addition into the same
// destination (the flatten of those two partitions) becomes one copy of the sum when the copy
// is exact (the destination holds the source's dtype, or fp32), which is then the same result
// in one run instead of a hazard between two.
#include <cstdint>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "exec/device.hpp"

namespace zp::exec {

class RunBatch {
 public:
  enum class Kind : std::uint8_t { copy, add, zero, sumsq };
  struct Run {
    Run() = default;
    Run(Kind k, Ref d, Ref s, std::int64_t count, Ref s2 = {}) : kind(k), dst(d), src(s), n(count), src2(s2) {}
    Kind kind = Kind::copy;
    Ref dst;  // copy, add, zero
    Ref src;  // copy, add, sumsq
    std::int64_t n = 0;
    Ref src2;  // copy, sumsq: a second source of src's dtype, added to src in fp32 (none: null)
  };
  // Runs of one kind, one (destination, source) dtype pair, all with a second source or none.
  struct Group {
    Kind kind = Kind::copy;
    DType dst_dt = DType::fp32, src_dt = DType::fp32;
    bool two = false;
    std::vector<Run> runs;
  };

  // Whether r may join the queue: no hazard with a queued run, or an addition that merges
  // into the copy queued last.
  bool fits(const Run& r) const;
  // Whether push(r) joins r to the last queued run: r adds into exactly what that run, an
  // exact copy of one source, writes (it then copies the two sources' sum).
  bool merges(const Run& r) const;
  void push(const Run& r);
  bool empty() const { return runs_.empty(); }
  std::size_t size() const { return runs_.size(); }
  // The queued runs grouped (a group's runs in call order, groups in order of their first
  // run), and the queue emptied.
  std::vector<Group> take();

 private:
  using Range = std::pair<std::uintptr_t, std::uintptr_t>;  // [first byte, last byte + 1)
  static Range range(const Ref& r, std::int64_t n);

  std::vector<Run> runs_;
  std::vector<Range> writes_, reads_;
};

}  // namespace zp::exec
