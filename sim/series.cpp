#include "sim/series.hpp"

#include <algorithm>
#include <array>
#include <span>
#include <stdexcept>

#include <fmt/format.h>

namespace zp::sim {

using zero::Event;
using zero::EventId;

MemorySeries memory_series(const zero::Program& p, std::size_t max_samples) {
  if (max_samples < 1) throw std::invalid_argument("memory_series: max_samples must be >= 1");
  if (p.repeat.copies > 0)
    throw std::invalid_argument("memory_series: needs every micro-step stored (zero::expand), not one for its copies");
  MemorySeries s;
  CategoryBytes live{};
  Bytes total{};
  auto apply = [&](std::span<const zero::BufferId> bufs, std::int64_t sign) {
    for (zero::BufferId b : bufs) {
      const zero::Buffer& buf = p.buffers[static_cast<std::size_t>(b)];
      if (buf.placement != zero::Placement::device) continue;
      live[static_cast<std::size_t>(buf.category)] += Bytes{sign * buf.bytes.v};
      total += Bytes{sign * buf.bytes.v};
    }
  };
  const auto n = static_cast<EventId>(p.events.size());
  const EventId first = std::min(p.step_begin, n);
  for (EventId e = 0; e < first; ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    apply(p.allocs(ev), 1);
    apply(p.frees(ev), -1);
  }
  s.persistent = total;
  s.step_events = n - first;
  if (s.step_events == 0) return s;
  const auto count = static_cast<std::int64_t>(std::min<std::size_t>(max_samples, static_cast<std::size_t>(s.step_events)));
  s.aggregated = count < s.step_events;
  s.samples.reserve(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) {
    // Sample k covers events [first + k·E/count, first + (k+1)·E/count).
    const EventId lo = first + static_cast<EventId>(k * s.step_events / count);
    const EventId hi = first + static_cast<EventId>((k + 1) * s.step_events / count);
    MemorySample m;
    m.first = lo;
    m.last = hi - 1;
    m.total = Bytes{-1};
    for (EventId e = lo; e < hi; ++e) {
      const Event& ev = p.events[static_cast<std::size_t>(e)];
      apply(p.allocs(ev), 1);
      if (total > m.total) {
        m.total = total;
        m.at = e;
        m.bytes = live;
      }
      apply(p.frees(ev), -1);
    }
    if (s.samples.empty() || m.total > s.samples[s.peak_sample].total) s.peak_sample = s.samples.size();
    s.samples.push_back(m);
  }
  return s;
}

std::vector<ExposedInterval> exposed_intervals(const zero::Program& p, const TimeReport& t) {
  if (p.repeat.copies > 0)
    throw std::invalid_argument(
        "exposed_intervals: needs every micro-step stored (zero::expand, sim::expand_times), not one for its copies");
  const auto n = static_cast<EventId>(p.events.size());
  if (t.events.size() != p.events.size())
    throw std::invalid_argument(fmt::format("exposed_intervals: {} event times for {} events", t.events.size(), n));
  const EventId first = p.step_begin;
  constexpr auto compute = zero::Stream::compute;
  // The previous event on each event's stream (streams run in program order).
  std::vector<EventId> stream_prev(p.events.size(), -1);
  std::array<EventId, zero::kNumStreams> last{};
  last.fill(-1);
  for (EventId e = first; e < n; ++e) {
    const auto s = static_cast<std::size_t>(p.events[static_cast<std::size_t>(e)].stream);
    stream_prev[static_cast<std::size_t>(e)] = last[s];
    last[s] = e;
  }
  auto end_of = [&](EventId e) { return t.events[static_cast<std::size_t>(e)].end.v; };
  // What bound an event's start, as run_events decides it: the stream predecessor, unless
  // a step dependency (in order) ended strictly later.
  auto bound_by = [&](EventId e) {
    EventId bind = stream_prev[static_cast<std::size_t>(e)];
    double bind_end = bind >= 0 ? end_of(bind) : -1;
    for (EventId d : p.deps(p.events[static_cast<std::size_t>(e)]))
      if (d >= first && end_of(d) > bind_end) {
        bind = d;
        bind_end = end_of(d);
      }
    return bind;
  };
  std::vector<ExposedInterval> out;
  EventId prev = -1;
  for (EventId e = first; e < n; ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    if (ev.stream != compute) continue;
    const EventTime& et = t.events[static_cast<std::size_t>(e)];
    if (prev >= 0) {
      const double gap_lo = end_of(prev), gap_hi = et.start.v;
      if (gap_hi > gap_lo) {
        EventId c = bound_by(e);
        while (c >= 0 && passes_binding_on(p.events[static_cast<std::size_t>(c)].kind == zero::EventKind::collective,
                                           p.events[static_cast<std::size_t>(c)].stream))
          c = bound_by(c);
        if (c >= 0 && p.events[static_cast<std::size_t>(c)].kind == zero::EventKind::collective) {
          const EventTime& ct = t.events[static_cast<std::size_t>(c)];
          const double lo = std::max(gap_lo, ct.start.v), hi = std::min(gap_hi, ct.end.v);
          if (hi > lo) out.push_back({Seconds{lo}, Seconds{hi}, c, p.events[static_cast<std::size_t>(c)].coll});
        }
      }
    }
    if (ev.kind == zero::EventKind::collective && et.end > et.start) out.push_back({et.start, et.end, e, ev.coll});
    prev = e;
  }
  return out;
}

}  // namespace zp::sim
