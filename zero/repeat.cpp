// Micro-steps represented once (Program::repeat): logical ↔ stored ids, the check that the
// block repeats the micro-step before it, and the expansion of the copies.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "zero/program.hpp"

namespace zp::zero {

namespace {

ListMarks minus(const ListMarks& b, const ListMarks& a) {
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
void shift_event(Event& e, std::size_t k, const ListMarks& d, const ListMarks& a, bool repeated) {
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

// Where the stored event `e` (and buffer `b`) begins in every list.
ListMarks marks_at(const Program& p, std::size_t e, std::size_t b) {
  if (e >= p.events.size()) {
    ListMarks m = list_marks(p);
    m.buffers = b;
    return m;
  }
  const Event& ev = p.events[e];
  return {e, b, ev.alloc_begin, ev.free_begin, ev.dep_begin, ev.slice_begin};
}

// The repeat's three marks: the micro-step before the block, the block, what follows.
struct RepeatMarks {
  ListMarks a, b, c;
};
RepeatMarks repeat_marks(const Program& p) {
  const Repeat& r = p.repeat;
  const auto b = static_cast<std::size_t>(r.first), d = static_cast<std::size_t>(r.events);
  const auto bb = static_cast<std::size_t>(r.first_buffer), db = static_cast<std::size_t>(r.buffers);
  return {marks_at(p, b - d, bb - db), marks_at(p, b, bb), marks_at(p, b + d, bb + db)};
}

// A position of logical id `x` in a space where [first, first + per) stands for itself and
// `copies` more, and what follows is moved by copies × per.
StoredRef to_stored(std::int64_t x, std::int64_t first, std::int64_t per, int copies) {
  const std::int64_t end = first + per;
  if (copies <= 0 || x < end) return {static_cast<std::int32_t>(x), 0};
  const std::int64_t span = per * copies;
  if (x < end + span) return {static_cast<std::int32_t>(first + (x - end) % per), static_cast<int>(1 + (x - end) / per)};
  return {static_cast<std::int32_t>(x - span), 0};
}
std::int32_t to_logical(std::int64_t s, int copy, std::int64_t first, std::int64_t per, int copies) {
  if (copies <= 0) return static_cast<std::int32_t>(s);
  if (copy > 0) return static_cast<std::int32_t>(s + per * copy);
  return static_cast<std::int32_t>(s < first + per ? s : s + per * copies);
}

}  // namespace

StoredRef Program::stored_event(EventId logical) const {
  return to_stored(logical, repeat.first, repeat.events, repeat.copies);
}
EventId Program::logical_event(EventId stored, int copy) const {
  return to_logical(stored, copy, repeat.first, repeat.events, repeat.copies);
}
StoredRef Program::stored_buffer(BufferId logical) const {
  return to_stored(logical, repeat.first_buffer, repeat.buffers, repeat.copies);
}
BufferId Program::logical_buffer(BufferId stored, int copy) const {
  return to_logical(stored, copy, repeat.first_buffer, repeat.buffers, repeat.copies);
}

ListMarks list_marks(const Program& p) {
  return {p.events.size(), p.buffers.size(), p.alloc_list.size(), p.free_list.size(), p.dep_list.size(),
          p.slice_list.size()};
}

bool repeats_previous(const Program& p, const ListMarks& a, const ListMarks& b, const ListMarks& c) {
  const ListMarks d = minus(b, a);
  const ListMarks d2 = minus(c, b);
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

bool repeat_is_valid(const Program& p) {
  const Repeat& r = p.repeat;
  if (r.copies == 0) return r == Repeat{};
  if (r.copies < 0 || r.events <= 0 || r.buffers < 0 || r.first - r.events < p.step_begin ||
      static_cast<std::size_t>(r.first + r.events) > p.events.size() || r.first_buffer - r.buffers < 0 ||
      static_cast<std::size_t>(r.first_buffer + r.buffers) > p.buffers.size())
    return false;
  const auto m = repeat_marks(p);
  return repeats_previous(p, m.a, m.b, m.c);
}

Program expand(const Program& src) {
  Program p = src;
  const int copies = p.repeat.copies;
  p.repeat = {};
  if (copies <= 0) return p;
  const auto logical = src.num_events();
  const auto extra = [&](std::size_t n) { return static_cast<std::int64_t>(n) * copies; };
  const RepeatMarks m = repeat_marks(src);
  const ListMarks d0 = minus(m.b, m.a);
  constexpr std::int64_t kMaxList = std::numeric_limits<std::uint32_t>::max();
  if (logical > std::numeric_limits<EventId>::max() || src.num_buffers() > std::numeric_limits<BufferId>::max() ||
      static_cast<std::int64_t>(src.alloc_list.size()) + extra(d0.allocs) > kMaxList ||
      static_cast<std::int64_t>(src.free_list.size()) + extra(d0.frees) > kMaxList ||
      static_cast<std::int64_t>(src.dep_list.size()) + extra(d0.deps) > kMaxList ||
      static_cast<std::int64_t>(src.slice_list.size()) + extra(d0.slices) > kMaxList)
    throw std::length_error("expand: the step has more events, buffers or list entries than the program can number");
  const ListMarks& a = m.a;
  const ListMarks& b = m.b;
  const ListMarks& c = m.c;
  const ListMarks d = minus(b, a);
  const auto k_all = static_cast<std::size_t>(copies);
  auto move_buf = [&](BufferId x, std::size_t k) {
    return x >= 0 && static_cast<std::size_t>(x) >= a.buffers ? x + static_cast<BufferId>(k * d.buffers) : x;
  };
  auto move_event = [&](EventId x, std::size_t k) {
    return x >= 0 && static_cast<std::size_t>(x) >= a.events ? x + static_cast<EventId>(k * d.events) : x;
  };
  // Each list: [0, c) kept, then the copies of [b, c), then the tail [c, end) moved; each
  // copy is appended whole, then its references are moved in place.
  auto expand_list = [&](auto& list, std::size_t from, std::size_t to, auto&& move) {
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
  expand_list(p.events, b.events, c.events, [&](Event& e, std::size_t k, bool repeated) { shift_event(e, k, d, a, repeated); });
  expand_list(p.buffers, b.buffers, c.buffers, [&](Buffer& x, std::size_t k, bool) { x.id += static_cast<BufferId>(k * d.buffers); });
  expand_list(p.alloc_list, b.allocs, c.allocs, [&](BufferId& x, std::size_t k, bool) { x = move_buf(x, k); });
  expand_list(p.free_list, b.frees, c.frees, [&](BufferId& x, std::size_t k, bool) { x = move_buf(x, k); });
  expand_list(p.dep_list, b.deps, c.deps, [&](EventId& x, std::size_t k, bool) { x = move_event(x, k); });
  expand_list(p.slice_list, b.slices, c.slices, [](BucketSlice&, std::size_t, bool) {});
  return p;
}

}  // namespace zp::zero
