#include "exec/run_batch.hpp"

#include <algorithm>
#include <stdexcept>

namespace zp::exec {

namespace {
bool overlap(const std::pair<std::uintptr_t, std::uintptr_t>& a, const std::pair<std::uintptr_t, std::uintptr_t>& b) {
  return a.first < b.second && b.first < a.second;
}
}  // namespace

RunBatch::Range RunBatch::range(const Ref& r, std::int64_t n) {
  const auto es = static_cast<std::uintptr_t>(dtype_size(r.dt));
  const auto lo = reinterpret_cast<std::uintptr_t>(r.base) + static_cast<std::uintptr_t>(r.off) * es;
  return {lo, lo + static_cast<std::uintptr_t>(n) * es};
}

bool RunBatch::merges(const Run& r) const {
  if (r.kind != Kind::add || runs_.empty()) return false;
  const Run& last = runs_.back();
  return last.kind == Kind::copy && !last.src2 && last.n == r.n && last.dst.base == r.dst.base &&
         last.dst.dt == r.dst.dt && last.dst.off == r.dst.off && r.src.dt == last.src.dt &&
         (last.dst.dt == last.src.dt || last.dst.dt == DType::fp32);
}

bool RunBatch::fits(const Run& r) const {
  if (r.n <= 0) return true;
  auto hits = [](const std::vector<Range>& v, const Range& x) {
    return std::any_of(v.begin(), v.end(), [&](const Range& y) { return overlap(x, y); });
  };
  // Merged, the addition reads its source before the copy writes: so its source must not
  // overlap the copy's destination either, which is among the writes.
  if (merges(r)) return !hits(writes_, range(r.src, r.n));
  if (r.kind != Kind::sumsq) {
    const Range w = range(r.dst, r.n);
    if (hits(writes_, w) || hits(reads_, w)) return false;
  }
  if (r.kind != Kind::zero && hits(writes_, range(r.src, r.n))) return false;
  if (r.src2 && hits(writes_, range(r.src2, r.n))) return false;
  return true;
}

void RunBatch::push(const Run& r) {
  if (r.n <= 0) return;
  if (merges(r)) {
    runs_.back().src2 = r.src;
    reads_.push_back(range(r.src, r.n));
    return;
  }
  if (r.src2 && (r.src2.dt != r.src.dt || (r.kind != Kind::copy && r.kind != Kind::sumsq)))
    throw std::logic_error("RunBatch: a second source outside a copy or a sum of squares, or of another dtype");
  runs_.push_back(r);
  if (r.kind != Kind::sumsq) writes_.push_back(range(r.dst, r.n));
  if (r.kind != Kind::zero) reads_.push_back(range(r.src, r.n));
  if (r.src2) reads_.push_back(range(r.src2, r.n));
  // An addition reads its destination too; it is already among the writes, which every
  // later run is checked against both ways.
}

std::vector<RunBatch::Group> RunBatch::take() {
  std::vector<Group> groups;
  for (const Run& r : runs_) {
    const DType d = r.kind == Kind::sumsq ? r.src.dt : r.dst.dt;
    const DType s = r.kind == Kind::zero ? r.dst.dt : r.src.dt;
    const bool two = static_cast<bool>(r.src2);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return x.kind == r.kind && x.dst_dt == d && x.src_dt == s && x.two == two;
    });
    if (g == groups.end()) {
      groups.push_back(Group{r.kind, d, s, two, {}});
      g = groups.end() - 1;
    }
    g->runs.push_back(r);
  }
  runs_.clear();
  writes_.clear();
  reads_.clear();
  return groups;
}

}  // namespace zp::exec
