#include "sim/engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace zp::sim {

using zero::Event;
using zero::EventId;
using zero::EventKind;
using zero::Phase;
using zero::Stream;

namespace {

constexpr int kS = zero::kNumStreams;
static_assert(kS <= 4, "EngineScratch::info keeps the stream in two bits");

// EngineScratch::info: what the engine needs of an event, so that the run and the
// summaries do not go back to the (much larger) program events.
constexpr std::uint8_t kStreamMask = 0x03;
constexpr std::uint8_t kCollective = 0x04;   // kind collective
constexpr std::uint8_t kCompute = 0x08;      // kind compute
constexpr std::uint8_t kForward = 0x10;      // phase forward

// Per-event working arrays, reused from one run to the next on this thread.
struct EngineScratch {
  std::vector<std::uint8_t> info;        // stream | kind and phase bits
  std::vector<std::int16_t> micro;       // micro-step
  std::vector<std::int32_t> dep_begin;   // CSR of each event's step dependencies, in program order
  std::vector<EventId> deps;
  std::vector<std::int32_t> waiting;     // unfinished dependencies
  std::vector<std::int32_t> dependent_begin;  // CSR of dependents
  std::vector<EventId> dependents;
  std::vector<EventId> order;            // step events grouped by stream, each in program order
  std::vector<EventId> stream_prev;      // the previous event on the same stream, or -1
  std::vector<EventId> pred;             // what bound each event's start
  std::vector<EventId> collectives;      // collective step events, in program order
};
EngineScratch& engine_scratch() {
  thread_local EngineScratch s;
  return s;
}

}  // namespace

TimeReport run_events(const zero::Program& p, std::span<const Seconds> duration, const EngineOptions& opt) {
  const auto n = static_cast<EventId>(p.events.size());
  if (duration.size() != p.events.size())
    throw std::invalid_argument(fmt::format("run_events: {} durations for {} events", duration.size(), n));
  const EventId first = p.step_begin;
  const auto un = static_cast<std::size_t>(n);
  TimeReport r;
  r.events.assign(un, EventTime{});
  EventTime* const times = r.events.data();
  const Seconds* const dur = duration.data();

  // One pass over the program: per-event summaries, step dependencies (prologue events
  // are done at t = 0), unfinished-dependency counts, stream sizes.
  EngineScratch& sc = engine_scratch();
  sc.info.resize(un);
  sc.micro.resize(un);
  sc.dep_begin.resize(un + 1);
  sc.deps.clear();
  sc.waiting.resize(un);
  sc.stream_prev.resize(un);
  sc.pred.resize(un);  // set for every step event when it starts (never read for the prologue)
  sc.collectives.clear();
  std::uint8_t* const info = sc.info.data();
  std::int16_t* const micro_of = sc.micro.data();
  std::int32_t* const waiting = sc.waiting.data();
  EventId* const stream_prev = sc.stream_prev.data();
  EventId* const pred = sc.pred.data();
  std::array<std::int32_t, kS + 1> stream_begin{};
  std::array<EventId, kS> last_seen;
  last_seen.fill(-1);
  bool backward = true;  // every dependency points to an earlier event
  for (EventId e = 0; e < first; ++e) sc.dep_begin[static_cast<std::size_t>(e)] = 0;
  for (EventId e = first; e < n; ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    // Events are large and read once here: ask for the ones ahead early.
    if (e + 8 < n) {
      __builtin_prefetch(&p.events[static_cast<std::size_t>(e) + 8].kind);
      __builtin_prefetch(&p.events[static_cast<std::size_t>(e) + 8].dep_begin);
    }
    const auto s = static_cast<std::uint8_t>(ev.stream);
    info[e] = static_cast<std::uint8_t>(s | (ev.kind == EventKind::collective ? kCollective : 0) |
                                        (ev.kind == EventKind::compute ? kCompute : 0) |
                                        (ev.phase == Phase::forward ? kForward : 0));
    micro_of[e] = ev.micro_step;
    ++stream_begin[static_cast<std::size_t>(s) + 1];
    stream_prev[e] = last_seen[s];
    last_seen[s] = e;
    if (ev.kind == EventKind::collective) sc.collectives.push_back(e);
    sc.dep_begin[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(sc.deps.size());
    for (EventId d : p.deps(ev))
      if (d >= first) {
        sc.deps.push_back(d);
        backward = backward && d < e;
      }
    waiting[e] = static_cast<std::int32_t>(sc.deps.size()) - sc.dep_begin[static_cast<std::size_t>(e)];
  }
  sc.dep_begin[un] = static_cast<std::int32_t>(sc.deps.size());
  const std::int32_t* const dep_begin = sc.dep_begin.data();
  const EventId* const deps = sc.deps.data();
  for (std::size_t s = 1; s <= kS; ++s) stream_begin[s] += stream_begin[s - 1];
  // The streams that have events, in order (the loops below visit only these).
  std::array<std::size_t, kS> active{};
  std::size_t num_active = 0;
  for (std::size_t s = 0; s < kS; ++s)
    if (stream_begin[s + 1] > stream_begin[s]) active[num_active++] = s;
  sc.order.resize(static_cast<std::size_t>(stream_begin[kS]));
  EventId* const order = sc.order.data();

  double now = 0;
  std::int64_t processed = 0;
  constexpr auto compute_stream = static_cast<std::size_t>(Stream::compute);

  const bool sequential = num_active == 1 && backward;
  if (sequential) {
    // One stream: each event starts when the one before it ends (its dependencies, all
    // earlier on the same stream, ended no later), alone and so at full rate. The same
    // arithmetic as the general loop below, without its bookkeeping.
    const std::size_t s = active[0];
    EventId prev = -1;
    double busy = r.busy[s].v;  // accumulated here, in the same order
    for (EventId e = first; e < n; ++e) {
      order[e - first] = e;
      pred[e] = prev;
      times[e].start = Seconds{now};
      const double d = std::max(0.0, dur[e].v);
      if (d != 0) {
        const double dt = d / 1.0;
        now += dt;
        busy += dt;
      }
      times[e].end = Seconds{now};
      prev = e;
    }
    r.busy[s] = Seconds{busy};
    processed = n - first;
  } else {
    // Dependents (CSR), built from the step dependencies.
    sc.dependent_begin.assign(un + 1, 0);
    std::int32_t* const dependent_begin = sc.dependent_begin.data();
    for (std::size_t k = 0; k < sc.deps.size(); ++k) ++dependent_begin[deps[k] + 1];
    for (std::size_t i = 1; i <= un; ++i) dependent_begin[i] += dependent_begin[i - 1];
    sc.dependents.resize(sc.deps.size());
    EventId* const dependents = sc.dependents.data();
    {
      // dependent_begin[d] advances while filling and is shifted back after.
      std::array<std::int32_t, kS> fill{};
      for (std::size_t s = 0; s < kS; ++s) fill[s] = stream_begin[s];
      for (EventId e = first; e < n; ++e) {
        order[fill[info[e] & kStreamMask]++] = e;
        for (auto k = dep_begin[e]; k < dep_begin[e + 1]; ++k) dependents[dependent_begin[deps[k]]++] = e;
      }
      for (std::size_t i = un; i > 0; --i) dependent_begin[i] = dependent_begin[i - 1];
      dependent_begin[0] = 0;
    }

    std::array<std::int32_t, kS> head{};
    for (std::size_t s = 0; s < kS; ++s) head[s] = stream_begin[s];
    std::array<EventId, kS> run_e;
    run_e.fill(-1);
    std::array<double, kS> remaining{};
    std::array<EventId, kS> last_on_stream;
    last_on_stream.fill(-1);
    int running = 0, comm_running = 0;

    const double slow = 1.0 / (1.0 + std::max(0.0, opt.interference));
    // Set when a completion makes an event ready whose stream start_ready has passed.
    bool rescan = false;
    std::size_t scanning = kS;

    auto complete = [&](std::size_t s) {
      const EventId e = run_e[s];
      times[e].end = Seconds{now};
      run_e[s] = -1;
      last_on_stream[s] = e;
      ++processed;
      for (auto k = dependent_begin[e]; k < dependent_begin[e + 1]; ++k)
        if (--waiting[dependents[k]] == 0 && (info[dependents[k]] & kStreamMask) < scanning) rescan = true;
    };

    // Start every event that can start now; zero-length events complete on the spot. The
    // result does not depend on the order in which streams are visited: each start time is
    // `now`, and what bound an event (its stream predecessor, its dependencies) has ended.
    auto start_ready = [&]() {
      do {
        rescan = false;
        for (std::size_t a = 0; a < num_active; ++a) {
          const std::size_t s = active[a];
          scanning = s;
          auto& h = head[s];
          while (run_e[s] < 0 && h < stream_begin[s + 1] && waiting[order[h]] == 0) {
            const EventId e = order[h++];
            // The binding constraint: the latest-finishing of the stream predecessor and deps.
            EventId bind = last_on_stream[s];
            double bind_end = bind >= 0 ? times[bind].end.v : -1;
            for (auto k = dep_begin[e]; k < dep_begin[e + 1]; ++k)
              if (times[deps[k]].end.v > bind_end) {
                bind = deps[k];
                bind_end = times[bind].end.v;
              }
            pred[e] = bind;
            times[e].start = Seconds{now};
            run_e[s] = e;
            remaining[s] = std::max(0.0, dur[e].v);
            if (remaining[s] == 0) {
              complete(s);
            } else {
              ++running;
              if (info[e] & kCollective) ++comm_running;
            }
          }
        }
        scanning = kS;
      } while (rescan);
    };

    for (;;) {
      start_ready();
      if (running == 0) break;
      std::size_t best = kS;
      double best_dt = std::numeric_limits<double>::infinity();
      if (running == 1) {
        // Alone, an event runs at full rate (interference needs compute and communication).
        for (std::size_t a = 0; a < num_active; ++a)
          if (run_e[active[a]] >= 0) best = active[a];
        best_dt = remaining[best] / 1.0;
        now += best_dt;
        r.busy[best] += Seconds{best_dt};
        remaining[best] = 0.0;
      } else {
        const bool comm = comm_running > 0;
        std::array<double, kS> rate{};
        for (std::size_t a = 0; a < num_active; ++a) {
          const std::size_t s = active[a];
          const EventId e = run_e[s];
          if (e < 0) continue;
          const bool computing = !(info[e] & kCollective);
          rate[s] = computing && comm && s == compute_stream ? slow : 1.0;
          const double dt = remaining[s] / rate[s];
          if (best == kS || dt < best_dt || (dt == best_dt && e < run_e[best])) {
            best_dt = dt;
            best = s;
          }
        }
        now += best_dt;
        for (std::size_t a = 0; a < num_active; ++a) {
          const std::size_t s = active[a];
          if (run_e[s] < 0) continue;
          r.busy[s] += Seconds{best_dt};
          remaining[s] = s == best ? 0.0 : std::max(0.0, remaining[s] - best_dt * rate[s]);
        }
      }
      --running;
      if (info[run_e[best]] & kCollective) --comm_running;
      complete(best);
    }
  }
  r.processed = processed;
  if (processed != n - first)
    throw std::logic_error(fmt::format("run_events: {} of {} events could not run (a dependency cycle?)",
                                       n - first - processed, n - first));

  // Phase times, micro-step by micro-step. A micro-step's backward runs from the end of its
  // forward to its last event, but no further than the start of the next forward: work of
  // one micro-step that overlaps the next forward is not counted twice. The same pass
  // finds the last event to finish (the latest of equals).
  double begin_all = std::numeric_limits<double>::infinity(), end_all = 0, end_micro = 0;
  int micro = -1;
  double fwd_begin = 0, fwd_end = 0, ms_end = 0, bwd_compute = 0;
  bool have_fwd = false;
  struct MicroTimes { double fwd_begin, fwd_end, end, bwd_compute; };
  std::vector<MicroTimes> micros;
  auto close_micro = [&]() {
    if (micro < 0) return;
    micros.push_back({fwd_begin, fwd_end, ms_end, bwd_compute});
  };
  EventId last = -1;
  double last_end = 0;
  for (EventId e = first; e < n; ++e) {
    const EventTime& t = times[e];
    if (last < 0 || t.end.v >= last_end) {
      last = e;
      last_end = t.end.v;
    }
    begin_all = std::min(begin_all, t.start.v);
    end_all = std::max(end_all, t.end.v);
    const int ms = micro_of[e];
    if (ms < 0) continue;
    if (ms != micro) {
      close_micro();
      micro = ms;
      have_fwd = false;
      ms_end = 0;
      bwd_compute = 0;
    }
    ms_end = std::max(ms_end, t.end.v);
    const std::uint8_t f = info[e];
    if (f & kForward) {
      if (!have_fwd) fwd_begin = t.start.v;
      have_fwd = true;
      fwd_end = std::max(fwd_end, t.end.v);
    } else if ((f & kStreamMask) == compute_stream && (f & kCompute)) {
      bwd_compute += t.end.v - t.start.v;
    }
  }
  close_micro();
  for (std::size_t k = 0; k < micros.size(); ++k) {
    const auto& m = micros[k];
    r.phases.forward += Seconds{m.fwd_end - m.fwd_begin};
    const double end = k + 1 < micros.size() ? std::min(m.end, micros[k + 1].fwd_begin) : m.end;
    const double bwd = std::max(0.0, end - m.fwd_end);
    r.phases.backward += Seconds{bwd};
    r.phases.backward_allreduce += Seconds{std::max(0.0, bwd - m.bwd_compute)};
    end_micro = std::max(end_micro, m.end);
  }
  if (begin_all == std::numeric_limits<double>::infinity()) begin_all = 0;
  r.phases.iteration = Seconds{end_all - begin_all};
  r.phases.step = Seconds{std::max(0.0, end_all - std::max(end_micro, begin_all))};

  // Communication: bytes and time by kind; exposed time = idle gaps of the compute stream
  // whose binding constraint traces back to a collective.
  for (EventId e : sc.collectives) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    const auto k = static_cast<std::size_t>(ev.coll);
    const Bytes b = p.bytes_sent(ev);
    r.comm.bytes[k] += b;
    r.comm.total += b;
    r.comm.count[k] += 1;
    const EventTime& t = times[e];
    r.comm.time[k] += t.end - t.start;
    if (ev.stream == Stream::compute) r.comm.exposed[k] += t.end - t.start;
  }
  // (On one stream each event starts when the one before it ends: no gaps.)
  EventId prev = -1;
  for (std::int32_t i = stream_begin[compute_stream]; !sequential && i < stream_begin[compute_stream + 1]; ++i) {
    const EventId e = order[i];
    if (prev >= 0) {
      const double gap = times[e].start.v - times[prev].end.v;
      if (gap > 0) {
        EventId c = pred[e];
        while (c >= 0 && !(info[c] & kCollective) && (info[c] & kStreamMask) != compute_stream) c = pred[c];
        if (c >= 0 && (info[c] & kCollective)) {
          // Only the part of the gap while that collective ran: its queueing behind other
          // communication belongs to those.
          const EventTime& ct = times[c];
          const double lo = std::max(times[prev].end.v, ct.start.v);
          const double hi = std::min(times[e].start.v, ct.end.v);
          if (hi > lo) r.comm.exposed[static_cast<std::size_t>(p.events[static_cast<std::size_t>(c)].coll)] += Seconds{hi - lo};
        }
      }
    }
    prev = e;
  }

  // Critical path: back from the last event to finish, each time through whichever of
  // the stream predecessor and the dependencies finished last (the highest event id
  // among equals).
  if (sequential && last == n - 1) {
    // On one stream that is every event: the stream predecessor ended last, and the
    // dependencies, all earlier, no later.
    r.critical_path.resize(static_cast<std::size_t>(n - first));
    for (EventId e = first; e < n; ++e) r.critical_path[static_cast<std::size_t>(e - first)] = e;
    return r;
  }
  for (EventId e = last; e >= 0;) {
    r.critical_path.push_back(e);
    EventId next = stream_prev[e];
    double next_end = next >= 0 ? times[next].end.v : -1;
    for (auto k = dep_begin[e]; k < dep_begin[e + 1]; ++k) {
      const EventId d = deps[k];
      const double end = times[d].end.v;
      if (end > next_end || (end == next_end && d > next)) {
        next = d;
        next_end = end;
      }
    }
    e = next;
  }
  std::reverse(r.critical_path.begin(), r.critical_path.end());
  return r;
}

std::vector<PathEvent> critical_path_events(const zero::Program& p, const TimeReport& t) {
  std::vector<PathEvent> out;
  out.reserve(t.critical_path.size());
  for (const EventId e : t.critical_path) {
    const Event& ev = p.events.at(static_cast<std::size_t>(e));
    const EventTime& et = t.events.at(static_cast<std::size_t>(e));
    out.push_back(PathEvent{e, ev.stream, ev.kind, et.start, et.end});
  }
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

}  // namespace zp::sim
