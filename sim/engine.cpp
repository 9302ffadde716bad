#include "sim/engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "sim/schedule.hpp"

namespace zp::sim {

using zero::Event;
using zero::EventId;
using zero::EventKind;
using zero::Stream;
using namespace engine_detail;

// ------------------------------------------------------------------ accessors
std::int64_t ExactTimes::time_of(EventId id, bool want_start) const {
  const auto& r = repeat;
  const std::int64_t c = r.first + r.events;
  const std::int64_t span = static_cast<std::int64_t>(r.copies) * r.events;
  const auto& stored = want_start ? start : end;
  if (r.copies == 0 || id < c) return stored.at(static_cast<std::size_t>(id));
  if (id >= c + span) return stored.at(static_cast<std::size_t>(id - span));
  const int k = static_cast<int>(1 + (id - c) / r.events);
  const auto x = static_cast<std::size_t>((id - c) % r.events);
  if (periodic(k)) {
    const std::int64_t base = reference == 0 ? stored.at(static_cast<std::size_t>(r.first) + x)
                                             : (want_start ? copy_start : copy_end).at(reference).at(x);
    return base + static_cast<std::int64_t>(k - reference) * period;
  }
  return (want_start ? copy_start : copy_end).at(k).at(x);
}

EventTime TimeReport::at(EventId id) const {
  if (ns.start.empty()) return events.at(static_cast<std::size_t>(id));
  return {to_seconds(ns.start_of(id)), to_seconds(ns.end_of(id))};
}

std::int64_t TimeReport::total_duration_ns(EventId stored) const {
  const auto& r = ns.repeat;
  if (ns.start.empty()) return to_ns(events.at(static_cast<std::size_t>(stored)).duration());
  std::int64_t sum = ns.end.at(static_cast<std::size_t>(stored)) - ns.start.at(static_cast<std::size_t>(stored));
  if (r.copies == 0 || stored < r.first || stored >= r.first + r.events) return sum;
  const auto x = static_cast<std::size_t>(stored - r.first);
  for (const auto& [k, st] : ns.copy_start)
    if (!ns.periodic(k)) sum += ns.copy_end.at(k)[x] - st[x];
  if (ns.last > ns.reference) {
    const std::int64_t ref = ns.reference == 0 ? ns.end[static_cast<std::size_t>(stored)] - ns.start[static_cast<std::size_t>(stored)]
                                                : ns.copy_end.at(ns.reference)[x] - ns.copy_start.at(ns.reference)[x];
    sum += ref * (ns.last - ns.reference);
  }
  return sum;
}

std::int64_t CriticalPath::size() const {
  std::int64_t n = 0;
  for (const Run& r : runs) n += static_cast<std::int64_t>(r.events.size()) * r.times;
  return n;
}

EventId CriticalPath::back() const {
  for (auto it = runs.rbegin(); it != runs.rend(); ++it)
    if (!it->events.empty()) return static_cast<EventId>(it->events.back() + (it->times - 1) * it->step);
  throw std::out_of_range("critical path is empty");
}

std::vector<EventId> CriticalPath::events() const {
  std::vector<EventId> out;
  out.reserve(static_cast<std::size_t>(size()));
  for_each([&](EventId e) { out.push_back(e); });
  return out;
}

namespace {

// ------------------------------------------------------------------ summaries
// A run's times, as the engine left them.
struct Run {
  const Layout& l;
  const Schedule& s;
  Nanos start(std::int64_t L) const { return s.start_of(l, L); }
  Nanos end(std::int64_t L) const { return s.end_of(l, L); }
  // Every logical step event in program order, the copies of the periodic stretch once
  // (copy reference + 1 stands for them): f(L, count), count the copies it stands for.
  template <class F>
  void each(F&& f) const {
    for (std::int64_t e = l.first; e < l.c; ++e) f(e, 1);
    for (int k = 1; k <= l.K; ++k) {
      if (s.periodic(k)) {
        if (k != s.reference + 1) continue;
        for (std::int64_t x = 0; x < l.d; ++x) f(l.logical(k, x), s.last - s.reference);
        continue;
      }
      for (std::int64_t x = 0; x < l.d; ++x) f(l.logical(k, x), 1);
    }
    const std::int64_t moved = static_cast<std::int64_t>(l.K) * l.d;
    for (std::int64_t e = l.c; e < l.S; ++e) f(e + moved, 1);
  }
  // What bound L's start: the latest-ending of its stream predecessor and dependencies
  // (the predecessor among equals, then the first dependency).
  std::int64_t bound_by(std::int64_t L) const {
    std::int64_t bind = l.stream_prev(L);
    Nanos bind_end = bind >= 0 ? end(bind) : -1;
    l.deps(L, [&](std::int64_t d) {
      const Nanos t = end(d);
      if (t > bind_end) {
        bind = d;
        bind_end = t;
      }
    });
    return bind;
  }
};

// Phase times, micro-step by micro-step: a micro-step's backward runs from the end of its
// forward to its last event, but no further than the start of the next forward, so work of
// one micro-step that overlaps the next forward is not counted twice.
struct MicroAgg {
  bool has_fwd = false;
  Nanos fwd_begin = 0, fwd_end = 0, end = 0, bwd_compute = 0;
  MicroAgg moved(Nanos t) const { return {has_fwd, fwd_begin + t, fwd_end + t, end + t, bwd_compute}; }
};

class PhaseAccumulator {
 public:
  void push(const MicroAgg& a) {
    const Nanos begin = a.has_fwd ? a.fwd_begin : fwd_begin_;
    running_fwd_end_ = a.has_fwd ? std::max(running_fwd_end_, a.fwd_end) : running_fwd_end_;
    fwd_begin_ = begin;
    const Micro m{begin, running_fwd_end_, a.end, a.bwd_compute};
    if (pending_) close(*pending_, m.fwd_begin);
    pending_ = m;
  }
  // `count` micro-steps, the t-th `a` moved by t periods.
  void push_periodic(const MicroAgg& a, std::int64_t count, Nanos period) {
    std::int64_t t = 0;
    for (; t < count; ++t) {
      push(a.moved(period * t));
      // Once the running forward end is this micro-step's own, closing it and each later
      // one but the last adds the same amounts: add them at once.
      if (t + 2 < count && a.has_fwd && running_fwd_end_ == a.fwd_end + period * t) {
        const Sums before = sums_;
        push(a.moved(period * (t + 1)));
        const std::int64_t more = count - 2 - (t + 1);  // closes of t + 1 .. count - 3, each like t's
        sums_.forward += (sums_.forward - before.forward) * more;
        sums_.backward += (sums_.backward - before.backward) * more;
        sums_.backward_allreduce += (sums_.backward_allreduce - before.backward_allreduce) * more;
        t = count - 2;
        const MicroAgg last = a.moved(period * t);
        // The state after micro-step count - 2: its own forward end, pending itself.
        running_fwd_end_ = last.fwd_end;
        fwd_begin_ = last.fwd_begin;
        end_micro_ = std::max(end_micro_, a.end + period * (count - 3));
        pending_ = Micro{last.fwd_begin, last.fwd_end, last.end, last.bwd_compute};
      }
    }
  }
  void finish() {
    if (pending_) close(*pending_, std::nullopt);
    pending_.reset();
  }
  // The phases once every micro-step was pushed, for a step from begin_all to end_all.
  PhaseTimes times(Nanos begin_all, Nanos end_all) {
    finish();
    PhaseTimes ph;
    ph.forward = to_seconds(sums_.forward);
    ph.backward = to_seconds(sums_.backward);
    ph.backward_allreduce = to_seconds(sums_.backward_allreduce);
    ph.iteration = to_seconds(end_all - begin_all);
    ph.step = to_seconds(std::max<Nanos>(0, end_all - std::max(end_micro_, begin_all)));
    return ph;
  }

 private:
  struct Micro {
    Nanos fwd_begin, fwd_end, end, bwd_compute;
  };
  struct Sums {
    Nanos forward = 0, backward = 0, backward_allreduce = 0;
  };
  void close(const Micro& m, std::optional<Nanos> next_begin) {
    sums_.forward += m.fwd_end - m.fwd_begin;
    const Nanos end = next_begin ? std::min(m.end, *next_begin) : m.end;
    const Nanos bwd = std::max<Nanos>(0, end - m.fwd_end);
    sums_.backward += bwd;
    sums_.backward_allreduce += std::max<Nanos>(0, bwd - m.bwd_compute);
    end_micro_ = std::max(end_micro_, m.end);
  }
  std::optional<Micro> pending_;
  Nanos fwd_begin_ = 0, running_fwd_end_ = 0, end_micro_ = 0;
  Sums sums_;
};

constexpr auto kComputeStream = static_cast<std::size_t>(Stream::compute);

// The aggregate of micro-step events [from, to) (logical, consecutive).
MicroAgg micro_agg(const Run& run, std::int64_t from, std::int64_t to) {
  MicroAgg a;
  for (std::int64_t L = from; L < to; ++L) {
    const std::uint8_t f = run.l.flags(L);
    const Nanos s = run.start(L), e = run.end(L);
    a.end = std::max(a.end, e);
    if (f & kForward) {
      if (!a.has_fwd) a.fwd_begin = s;
      a.has_fwd = true;
      a.fwd_end = std::max(a.fwd_end, e);
    } else if ((f & kStreamMask) == kComputeStream && (f & kCompute)) {
      a.bwd_compute += e - s;
    }
  }
  return a;
}

PhaseTimes phases(const Run& run, const zero::Program& p, Nanos begin_all, Nanos end_all) {
  const Layout& l = run.l;
  PhaseAccumulator acc;
  // Stored micro-steps: maximal runs of one micro-step (step events, -1, are not in any).
  auto stored_micros = [&](std::int64_t from, std::int64_t to, std::int64_t moved) {
    std::int64_t e = from;
    while (e < to) {
      const int ms = p.events[static_cast<std::size_t>(e)].micro_step;
      std::int64_t z = e;
      while (z < to && p.events[static_cast<std::size_t>(z)].micro_step == ms) ++z;
      if (ms >= 0) acc.push(micro_agg(run, e + moved, z + moved));
      e = z;
    }
  };
  stored_micros(l.first, l.c, 0);
  for (int k = 1; k <= l.K; ++k) {
    if (run.s.periodic(k)) {
      const MicroAgg a = micro_agg(run, l.logical(k, 0), l.logical(k, l.d));
      acc.push_periodic(a, run.s.last - k + 1, run.s.period);
      k = run.s.last;
      continue;
    }
    acc.push(micro_agg(run, l.logical(k, 0), l.logical(k, l.d)));
  }
  stored_micros(l.c, l.S, static_cast<std::int64_t>(l.K) * l.d);
  return acc.times(begin_all, end_all);
}

// Exposed communication of the compute stream's gap before L (its predecessor on the
// stream ended at prev_end): the part of the gap while the collective that bound it ran,
// found back through what bound L's start (events off the compute stream that are not
// collectives pass it on). Adds to `exposed`; returns the lowest instance whose binding it
// read (kNoInstance: none was an instance's).
int gap_exposed(const Run& run, std::int64_t L, Nanos prev_end, std::array<Nanos, zero::kNumCollKinds>& exposed) {
  const Layout& l = run.l;
  const Nanos start = run.start(L);
  if (start - prev_end <= 0) return std::numeric_limits<int>::max();
  int lowest = l.instance(L);
  std::int64_t c = run.bound_by(L);
  // (Walking the host stream back would also visit every host event before.)
  while (c >= 0 && passes_binding_on((l.flags(c) & kCollective) != 0, static_cast<zero::Stream>(l.stream(c)))) {
    lowest = std::min(lowest, l.instance(c));
    c = run.bound_by(c);
  }
  if (c >= 0 && (l.flags(c) & kCollective)) {
    const Nanos lo = std::max(prev_end, run.start(c));
    const Nanos hi = std::min(start, run.end(c));
    if (hi > lo) exposed[static_cast<std::size_t>(l.p.events[static_cast<std::size_t>(l.stored(c))].coll)] += hi - lo;
  }
  return lowest;
}

std::array<Nanos, zero::kNumCollKinds> exposed_gaps(const Run& run) {
  const Layout& l = run.l;
  const auto& s = run.s;
  std::array<Nanos, zero::kNumCollKinds> exposed{};
  const std::int64_t n = l.count[kComputeStream];
  const auto np = static_cast<std::int64_t>(l.pre[kComputeStream].size());
  const auto nb = static_cast<std::int64_t>(l.blk[kComputeStream].size());
  std::int64_t q = 1;
  while (q < n) {
    // In the periodic stretch: once a copy's gaps were bound by copies that are periodic
    // themselves and have periodic predecessors, every later copy's are the same.
    const std::int64_t rel = q - np;
    if (nb > 0 && rel >= 0 && rel % nb == 0 && rel / nb < l.K) {
      const int k = static_cast<int>(rel / nb) + 1;
      if (s.periodic(k) && k >= s.reference + 2 && k < s.last) {
        std::array<Nanos, zero::kNumCollKinds> one{};
        int lowest = std::numeric_limits<int>::max();
        for (std::int64_t i = 0; i < nb; ++i) {
          const std::int64_t L = l.at(static_cast<int>(kComputeStream), q + i);
          lowest = std::min(lowest, gap_exposed(run, L, run.end(l.at(static_cast<int>(kComputeStream), q + i - 1)), one));
        }
        if (lowest >= s.reference + 2) {
          const std::int64_t copies = s.last - k + 1;
          for (std::size_t c = 0; c < exposed.size(); ++c) exposed[c] += one[c] * copies;
          q += nb * copies;
        } else {
          for (std::size_t c = 0; c < exposed.size(); ++c) exposed[c] += one[c];
          q += nb;
        }
        continue;
      }
    }
    const std::int64_t L = l.at(static_cast<int>(kComputeStream), q);
    gap_exposed(run, L, run.end(l.at(static_cast<int>(kComputeStream), q - 1)), exposed);
    ++q;
  }
  return exposed;
}

// The critical path: back from `last`, each time through whichever of the stream
// predecessor and the dependencies finished last (the highest id among equals). Where the
// path enters copies of the periodic stretch the same way L copies apart, the stretch
// between repeats: it is kept once with its count.
CriticalPath critical_path(const Run& run, std::int64_t last) {
  const Layout& l = run.l;
  const auto& s = run.s;
  // The walk, last event first; a repeated stretch sits between walk[at - 1] and walk[at].
  struct Repeat {
    std::size_t at;
    std::vector<std::int64_t> segment;  // walk order, its first repeat
    std::int64_t times, step;
  };
  std::vector<std::int64_t> walk;
  std::vector<Repeat> repeats;
  struct Entry {
    int copy;
    std::int64_t index;
    std::size_t at;  // position in `walk` of the entering event
  };
  std::vector<Entry> entries;
  constexpr int kMaxCycle = 4;
  const bool repeating = l.K > 0 && s.period > 0 && s.last > s.reference;
  std::int64_t e = last;
  while (e >= 0) {
    walk.push_back(e);
    std::int64_t next = l.stream_prev(e);
    Nanos next_end = next >= 0 ? run.end(next) : -1;
    l.deps(e, [&](std::int64_t d) {
      const Nanos t = run.end(d);
      if (t > next_end || (t == next_end && d > next)) {
        next = d;
        next_end = t;
      }
    });
    const int from = repeating ? l.instance(e) : kNoInstance;
    e = next;
    if (!repeating || e < 0) continue;
    const int k = l.instance(e);
    if (k == kNoInstance || k < 1 || k == from) continue;  // not entering a new copy
    const std::int64_t x = l.index(e);
    entries.push_back({k, x, walk.size()});
    for (int L = 1; L <= kMaxCycle && static_cast<int>(entries.size()) > L; ++L) {
      const Entry& before = entries[entries.size() - 1 - static_cast<std::size_t>(L)];
      if (before.copy != k + L || before.index != x) continue;
      if (!s.periodic(k + L) || k < s.reference + 2) break;
      // The walk from entering copy k + L to entering copy k repeats `times` more times
      // (each repeat's copies all at least reference + 2: periodic, and so is what bound them).
      const std::int64_t times = (k - s.reference - 1) / L;
      if (times < 1) break;
      const std::int64_t step = static_cast<std::int64_t>(L) * l.d;
      std::vector<std::int64_t> segment(walk.begin() + static_cast<std::ptrdiff_t>(before.at), walk.end());
      for (auto& v : segment) v -= step;
      repeats.push_back({walk.size(), std::move(segment), times, step});
      e -= times * step;
      entries.clear();
      break;
    }
  }
  // Forward order: runs of single events, and each repeated stretch as one run.
  CriticalPath path;
  CriticalPath::Run singles;
  auto close_singles = [&]() {
    if (singles.events.empty()) return;
    path.runs.push_back(std::move(singles));
    singles = {};
  };
  std::size_t i = walk.size();
  for (auto r = repeats.rbegin(); r != repeats.rend(); ++r) {
    for (; i > r->at; --i) singles.events.push_back(static_cast<EventId>(walk[i - 1]));
    close_singles();
    CriticalPath::Run run_of;
    run_of.times = r->times;
    run_of.step = static_cast<EventId>(r->step);
    for (auto v = r->segment.rbegin(); v != r->segment.rend(); ++v)
      run_of.events.push_back(static_cast<EventId>(*v - (r->times - 1) * r->step));
    path.runs.push_back(std::move(run_of));
  }
  for (; i > 0; --i) singles.events.push_back(static_cast<EventId>(walk[i - 1]));
  close_singles();
  return path;
}

}  // namespace

PhaseTimes phases_of_timeline(const zero::Program& p, std::span<const double> start, std::span<const double> end) {
  if (p.repeat.copies > 0) throw std::invalid_argument("phases_of_timeline: the program must store every micro-step");
  if (start.size() != p.events.size() || end.size() != p.events.size())
    throw std::invalid_argument(fmt::format("phases_of_timeline: {} starts and {} ends for {} events", start.size(),
                                            end.size(), p.events.size()));
  auto ns = [](double t) { return to_ns(Seconds{t}); };
  PhaseAccumulator acc;
  Nanos begin_all = std::numeric_limits<Nanos>::max(), end_all = 0;
  auto e = static_cast<std::size_t>(p.step_begin);
  while (e < p.events.size()) {  // maximal runs of one micro-step, as phases() takes them
    const int ms = p.events[e].micro_step;
    MicroAgg a;
    bool timed = false;
    std::size_t z = e;
    for (; z < p.events.size() && p.events[z].micro_step == ms; ++z) {
      if (!std::isfinite(start[z])) continue;
      timed = true;
      const Event& ev = p.events[z];
      const Nanos st = ns(start[z]), en = ns(end[z]);
      begin_all = std::min(begin_all, st);
      end_all = std::max(end_all, en);
      a.end = std::max(a.end, en);
      if (ev.phase == zero::Phase::forward) {
        if (!a.has_fwd) a.fwd_begin = st;
        a.has_fwd = true;
        a.fwd_end = std::max(a.fwd_end, en);
      } else if (ev.stream == Stream::compute && ev.kind == EventKind::compute) {
        a.bwd_compute += en - st;
      }
    }
    if (ms >= 0 && timed) acc.push(a);  // a stretch with nothing timed says nothing of its micro-step
    e = z;
  }
  if (begin_all == std::numeric_limits<Nanos>::max()) begin_all = 0;
  return acc.times(begin_all, end_all);
}

TimeReport run_events(const zero::Program& p, std::span<const Seconds> duration, const EngineOptions& opt) {
  if (duration.size() != p.events.size())
    throw std::invalid_argument(fmt::format("run_events: {} durations for {} events", duration.size(), p.events.size()));
  const Layout l(p);
  std::vector<Nanos> dur(p.events.size(), 0);
  for (auto e = static_cast<std::size_t>(l.first); e < dur.size(); ++e) dur[e] = to_ns(duration[e]);
  Schedule s = simulate(l, dur, opt.interference);
  const Run run{l, s};

  TimeReport r;
  r.processed = s.processed;
  r.events.assign(p.events.size(), EventTime{});
  r.ns.repeat = p.repeat;
  for (auto e = static_cast<std::size_t>(l.first); e < p.events.size(); ++e)
    r.events[e] = {to_seconds(s.start[e]), to_seconds(s.end[e])};
  for (const auto& [k, rec] : s.copies) {
    r.ns.copy_start[k] = rec.start;
    r.ns.copy_end[k] = rec.end;
  }
  r.ns.reference = s.reference;
  r.ns.last = s.last;
  r.ns.period = s.period;

  // Busy time per stream, communication per kind, the first start, the last end and the
  // last event to finish (the highest id among equals).
  std::array<Nanos, kS> busy{};
  std::array<Nanos, zero::kNumCollKinds> comm_time{}, exposed{};
  Nanos begin_all = std::numeric_limits<Nanos>::max(), end_all = 0, last_end = 0;
  std::int64_t last = -1;
  run.each([&](std::int64_t L, std::int64_t count) {
    const Nanos st = run.start(L), en = run.end(L);
    const std::uint8_t f = l.flags(L);
    busy[f & kStreamMask] += (en - st) * count;
    if (f & kCollective) {
      const Event& ev = p.events[static_cast<std::size_t>(l.stored(L))];
      const auto k = static_cast<std::size_t>(ev.coll);
      comm_time[k] += (en - st) * count;
      if (ev.stream == Stream::compute) exposed[k] += (en - st) * count;
    }
    begin_all = std::min(begin_all, st);
    // The latest of a periodic stretch is its last copy's: moved by whole periods.
    const std::int64_t Llast = count > 1 ? L + (count - 1) * l.d : L;
    const Nanos elast = count > 1 ? en + (count - 1) * s.period : en;
    end_all = std::max(end_all, elast);
    if (last < 0 || elast > last_end || (elast == last_end && Llast > last)) {
      last = Llast;
      last_end = elast;
    }
  });
  if (begin_all == std::numeric_limits<Nanos>::max()) begin_all = 0;
  for (std::size_t k = 0; k < static_cast<std::size_t>(kS); ++k) r.busy[k] = to_seconds(busy[k]);
  // Bytes sent: a step repeats a few collectives (group, kind, size), priced once each.
  struct Sent {
    const Event* e;
    Bytes bytes;
  };
  std::vector<Sent> sent;
  auto bytes_sent = [&](const Event& ev) {
    for (const Sent& x : sent)
      if (x.e->group == ev.group && x.e->coll == ev.coll && x.e->elements == ev.elements && x.e->dtype == ev.dtype &&
          x.e->root == ev.root)
        return x.bytes;
    sent.push_back({&ev, p.bytes_sent(ev)});
    return sent.back().bytes;
  };
  for (EventId e = static_cast<EventId>(l.first); e < static_cast<EventId>(p.events.size()); ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    if (ev.kind != EventKind::collective) continue;
    const auto k = static_cast<std::size_t>(ev.coll);
    const Bytes b{bytes_sent(ev).v * p.copies_of(e)};
    r.comm.bytes[k] += b;
    r.comm.total += b;
    r.comm.count[k] += static_cast<int>(p.copies_of(e));
  }
  // Exposed time = collectives on the compute stream, and the idle gaps of the compute
  // stream whose binding constraint traces back to a collective (none on one stream).
  if (!(l.backward && std::count_if(l.count.begin(), l.count.end(), [](std::int64_t c) { return c > 0; }) == 1)) {
    const auto gaps = exposed_gaps(run);
    for (std::size_t k = 0; k < exposed.size(); ++k) exposed[k] += gaps[k];
  }
  for (std::size_t k = 0; k < exposed.size(); ++k) {
    r.comm.time[k] = to_seconds(comm_time[k]);
    r.comm.exposed[k] = to_seconds(exposed[k]);
  }
  r.phases = phases(run, p, begin_all, end_all);
  if (last >= 0) r.critical_path = critical_path(run, last);
  // Every time in nanoseconds (the prologue's 0).
  for (auto e = std::size_t{0}; e < static_cast<std::size_t>(l.first); ++e) s.start[e] = s.end[e] = 0;
  r.ns.start = std::move(s.start);
  r.ns.end = std::move(s.end);
  return r;
}

TimeReport expand_times(const zero::Program& p, const TimeReport& t) {
  TimeReport r = t;
  if (p.repeat.copies == 0) return r;
  const auto n = static_cast<std::size_t>(p.num_events());
  r.events.assign(n, EventTime{});
  r.ns = ExactTimes{};
  r.ns.start.resize(n);
  r.ns.end.resize(n);
  for (std::size_t e = 0; e < n; ++e) {
    r.ns.start[e] = t.ns.start_of(static_cast<EventId>(e));
    r.ns.end[e] = t.ns.end_of(static_cast<EventId>(e));
    r.events[e] = {to_seconds(r.ns.start[e]), to_seconds(r.ns.end[e])};
  }
  return r;
}

// ------------------------------------------------------------------ path reports
PathEvent path_event(const zero::Program& p, const TimeReport& t, EventId id) {
  const Event& ev = p.events.at(static_cast<std::size_t>(p.stored_event(id).id));
  const EventTime et = t.at(id);
  return PathEvent{id, ev.stream, ev.kind, et.start, et.end};
}

std::vector<PathEvent> critical_path_events(const zero::Program& p, const TimeReport& t) {
  std::vector<PathEvent> out;
  out.reserve(static_cast<std::size_t>(t.critical_path.size()));
  t.critical_path.for_each([&](EventId e) { out.push_back(path_event(p, t, e)); });
  return out;
}

std::vector<PathEvent> longest_events(std::vector<PathEvent> path, std::size_t k) {
  // Lengths compared to the nanosecond: the same op in two micro-steps may differ in its
  // last bits (end - start at different times), and should keep path order.
  auto ns = [](const PathEvent& e) { return std::llround(e.duration().v * 1e9); };
  std::stable_sort(path.begin(), path.end(), [&](const PathEvent& a, const PathEvent& b) { return ns(a) > ns(b); });
  if (path.size() > k) path.resize(k);
  return path;
}

PathSummary summarize_critical_path(const zero::Program& p, const TimeReport& t, std::size_t k) {
  PathSummary out;
  out.num_events = t.critical_path.size();
  std::array<std::int64_t, zero::kNumEventKinds> kind_ns{};
  // Candidates for the longest: a repeated run's later repeats have the same lengths and
  // come later on the path, so its first k repeats hold every one that can be among them.
  std::vector<PathEvent> candidates;
  for (const auto& run : t.critical_path.runs) {
    for (EventId e : run.events) {
      const PathEvent pe = path_event(p, t, e);
      out.has_kind[static_cast<std::size_t>(pe.kind)] = true;
      kind_ns[static_cast<std::size_t>(pe.kind)] += (t.ns.start.empty() ? to_ns(pe.duration()) : t.ns.end_of(e) - t.ns.start_of(e)) * run.times;
    }
    const std::int64_t reps = std::min<std::int64_t>(run.times, static_cast<std::int64_t>(k));
    for (std::int64_t r = 0; r < reps; ++r)
      for (EventId e : run.events) candidates.push_back(path_event(p, t, static_cast<EventId>(e + r * run.step)));
  }
  for (std::size_t i = 0; i < kind_ns.size(); ++i) out.by_kind[i] = to_seconds(kind_ns[i]);
  out.longest = longest_events(std::move(candidates), k);
  return out;
}

}  // namespace zp::sim
