#include "zero/lower/replicate.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace zp::zero::lowering {

namespace {

Marks minus(const Marks& b, const Marks& a) {
  return {b.events - a.events, b.buffers - a.buffers, b.allocs - a.allocs,
          b.frees - a.frees,   b.deps - a.deps,       b.slices - a.slices};
}

// A reference (event or buffer id) of the later of two compared micro-steps points either
// into itself or the one before (relative: it moves with the micro-step) or before both
// (fixed). `r1` is the earlier micro-step's reference, `start1` where that micro-step begins.
bool same_ref(std::int64_t r1, std::int64_t r2, std::size_t start1, std::size_t delta) {
  if (r1 < 0 || r2 < 0) return r1 == r2;
  if (static_cast<std::size_t>(r2) >= start1) return static_cast<std::size_t>(r1) + delta == static_cast<std::size_t>(r2);
  return r1 == r2;
}

// Moves an event by k micro-steps of `d` ids: its id, its list ranges, and (when it is a
// repeated micro-step's) its micro-step; buffer references at or after `a` move too.
void shift_event(Event& e, std::size_t k, const Marks& d, const Marks& a, bool repeated) {
  e.id += static_cast<EventId>(k * d.events);
  if (repeated && e.micro_step >= 0) e.micro_step = static_cast<std::int16_t>(e.micro_step + k);
  e.alloc_begin += static_cast<std::uint32_t>(k * d.allocs);
  e.alloc_end += static_cast<std::uint32_t>(k * d.allocs);
  e.free_begin += static_cast<std::uint32_t>(k * d.frees);
  e.free_end += static_cast<std::uint32_t>(k * d.frees);
  e.dep_begin += static_cast<std::uint32_t>(k * d.deps);
  e.dep_end += static_cast<std::uint32_t>(k * d.deps);
  e.slice_begin += static_cast<std::uint32_t>(k * d.slices);
  e.slice_end += static_cast<std::uint32_t>(k * d.slices);
  auto buf = [&](BufferId& b) {
    if (b >= 0 && static_cast<std::size_t>(b) >= a.buffers) b += static_cast<BufferId>(k * d.buffers);
  };
  buf(e.src_buf);
  buf(e.src2_buf);
  buf(e.src3_buf);
  buf(e.dst_buf);
}

}  // namespace

Marks marks(const Program& p) {
  return {p.events.size(), p.buffers.size(), p.alloc_list.size(), p.free_list.size(), p.dep_list.size(),
          p.slice_list.size()};
}

bool periodic(const Program& p, const Marks& a, const Marks& b, const Marks& c) {
  const Marks d = minus(b, a);
  const Marks d2 = minus(c, b);
  if (d2.events != d.events || d2.buffers != d.buffers || d2.allocs != d.allocs || d2.frees != d.frees ||
      d2.deps != d.deps || d2.slices != d.slices)
    return false;
  for (std::size_t i = 0; i < d.events; ++i) {
    const Event& e1 = p.events[a.events + i];
    const Event& e2 = p.events[b.events + i];
    if (!same_ref(e1.src_buf, e2.src_buf, a.buffers, d.buffers) ||
        !same_ref(e1.src2_buf, e2.src2_buf, a.buffers, d.buffers) ||
        !same_ref(e1.src3_buf, e2.src3_buf, a.buffers, d.buffers) ||
        !same_ref(e1.dst_buf, e2.dst_buf, a.buffers, d.buffers))
      return false;
    Event t = e1;
    shift_event(t, 1, d, a, true);
    t.src_buf = e2.src_buf;
    t.src2_buf = e2.src2_buf;
    t.src3_buf = e2.src3_buf;
    t.dst_buf = e2.dst_buf;
    if (!(t == e2)) return false;
  }
  for (std::size_t i = 0; i < d.buffers; ++i) {
    Buffer t = p.buffers[a.buffers + i];
    t.id += static_cast<BufferId>(d.buffers);
    if (!(t == p.buffers[b.buffers + i])) return false;
  }
  for (std::size_t i = 0; i < d.allocs; ++i)
    if (!same_ref(p.alloc_list[a.allocs + i], p.alloc_list[b.allocs + i], a.buffers, d.buffers)) return false;
  for (std::size_t i = 0; i < d.frees; ++i)
    if (!same_ref(p.free_list[a.frees + i], p.free_list[b.frees + i], a.buffers, d.buffers)) return false;
  for (std::size_t i = 0; i < d.deps; ++i)
    if (!same_ref(p.dep_list[a.deps + i], p.dep_list[b.deps + i], a.events, d.events)) return false;
  for (std::size_t i = 0; i < d.slices; ++i)
    if (!(p.slice_list[a.slices + i] == p.slice_list[b.slices + i])) return false;
  std::vector<char> freed(d.buffers, 0);
  for (std::size_t i = a.frees; i < c.frees; ++i) {
    const auto f = static_cast<std::size_t>(p.free_list[i]);
    if (f >= a.buffers && f < b.buffers) freed[f - a.buffers] = 1;
  }
  return std::all_of(freed.begin(), freed.end(), [](char x) { return x != 0; });
}

void replicate(Program& p, const Marks& a, const Marks& b, const Marks& c, int copies) {
  const Marks d = minus(b, a);
  const auto k_all = static_cast<std::size_t>(copies);
  auto move_buf = [&](BufferId x, std::size_t k) {
    return x >= 0 && static_cast<std::size_t>(x) >= a.buffers ? x + static_cast<BufferId>(k * d.buffers) : x;
  };
  auto move_event = [&](EventId x, std::size_t k) {
    return x >= 0 && static_cast<std::size_t>(x) >= a.events ? x + static_cast<EventId>(k * d.events) : x;
  };
  // Each list: [0, c) kept, then the copies of [b, c), then the tail [c, end) moved; each
  // copy is appended whole, then its references are moved in place.
  auto expand = [&](auto& list, std::size_t from, std::size_t to, auto&& move) {
    using T = std::remove_reference_t<decltype(list[0])>;
    static_assert(std::is_trivially_copyable_v<T>);
    const std::vector<T> block(list.begin() + static_cast<std::ptrdiff_t>(from), list.begin() + static_cast<std::ptrdiff_t>(to));
    const std::vector<T> tail(list.begin() + static_cast<std::ptrdiff_t>(to), list.end());
    list.resize(to);
    list.reserve(to + k_all * block.size() + tail.size());
    for (std::size_t k = 1; k <= k_all; ++k) {
      const std::size_t at = list.size();
      list.insert(list.end(), block.begin(), block.end());
      for (std::size_t i = at; i < list.size(); ++i) move(list[i], k, true);
    }
    const std::size_t at = list.size();
    list.insert(list.end(), tail.begin(), tail.end());
    for (std::size_t i = at; i < list.size(); ++i) move(list[i], k_all, false);
  };
  expand(p.events, b.events, c.events, [&](Event& e, std::size_t k, bool repeated) { shift_event(e, k, d, a, repeated); });
  expand(p.buffers, b.buffers, c.buffers, [&](Buffer& x, std::size_t k, bool) { x.id += static_cast<BufferId>(k * d.buffers); });
  expand(p.alloc_list, b.allocs, c.allocs, [&](BufferId& x, std::size_t k, bool) { x = move_buf(x, k); });
  expand(p.free_list, b.frees, c.frees, [&](BufferId& x, std::size_t k, bool) { x = move_buf(x, k); });
  expand(p.dep_list, b.deps, c.deps, [&](EventId& x, std::size_t k, bool) { x = move_event(x, k); });
  expand(p.slice_list, b.slices, c.slices, [](BucketSlice&, std::size_t, bool) {});
}

}  // namespace zp::zero::lowering
