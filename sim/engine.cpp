#include "sim/engine.hpp"

#include <algorithm>
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

struct Running {
  EventId e = -1;
  double remaining = 0;  // seconds of work at rate 1
};

}  // namespace

TimeReport run_events(const zero::Program& p, std::span<const Seconds> duration, const EngineOptions& opt) {
  const auto n = static_cast<EventId>(p.events.size());
  if (duration.size() != p.events.size())
    throw std::invalid_argument(fmt::format("run_events: {} durations for {} events", duration.size(), n));
  const EventId first = p.step_begin;
  TimeReport r;
  r.events.assign(p.events.size(), EventTime{});

  // Dependents (CSR) and unfinished-dependency counts; prologue events are done at t = 0.
  std::vector<std::int32_t> waiting(p.events.size(), 0), dep_start(p.events.size() + 1, 0);
  for (EventId e = first; e < n; ++e)
    for (EventId d : p.deps(p.events[static_cast<std::size_t>(e)]))
      if (d >= first) {
        ++waiting[static_cast<std::size_t>(e)];
        ++dep_start[static_cast<std::size_t>(d) + 1];
      }
  for (std::size_t i = 1; i < dep_start.size(); ++i) dep_start[i] += dep_start[i - 1];
  std::vector<EventId> dependents(static_cast<std::size_t>(dep_start.back()));
  {
    std::vector<std::int32_t> fill(dep_start.begin(), dep_start.end() - 1);
    for (EventId e = first; e < n; ++e)
      for (EventId d : p.deps(p.events[static_cast<std::size_t>(e)]))
        if (d >= first) dependents[static_cast<std::size_t>(fill[static_cast<std::size_t>(d)]++)] = e;
  }
  // Per-stream FIFO of events, in program order.
  std::array<std::vector<EventId>, kS> fifo;
  for (EventId e = first; e < n; ++e) fifo[static_cast<std::size_t>(p.events[static_cast<std::size_t>(e)].stream)].push_back(e);
  std::array<std::size_t, kS> head{};
  std::array<Running, kS> run{};
  std::array<EventId, kS> last_on_stream;
  last_on_stream.fill(-1);
  std::vector<EventId> pred(p.events.size(), -1);  // what bound each event's start
  std::vector<char> done(p.events.size(), 0);
  for (EventId e = 0; e < first; ++e) done[static_cast<std::size_t>(e)] = 1;

  double now = 0;
  std::int64_t processed = 0;
  const double slow = 1.0 / (1.0 + std::max(0.0, opt.interference));

  auto complete = [&](int s) {
    const EventId e = run[static_cast<std::size_t>(s)].e;
    r.events[static_cast<std::size_t>(e)].end = Seconds{now};
    done[static_cast<std::size_t>(e)] = 1;
    run[static_cast<std::size_t>(s)].e = -1;
    last_on_stream[static_cast<std::size_t>(s)] = e;
    ++processed;
    for (auto k = dep_start[static_cast<std::size_t>(e)]; k < dep_start[static_cast<std::size_t>(e) + 1]; ++k)
      --waiting[static_cast<std::size_t>(dependents[static_cast<std::size_t>(k)])];
  };

  // Start every event that can start now; zero-length events complete on the spot.
  auto start_ready = [&]() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int s = 0; s < kS; ++s) {
        auto& rs = run[static_cast<std::size_t>(s)];
        auto& h = head[static_cast<std::size_t>(s)];
        const auto& q = fifo[static_cast<std::size_t>(s)];
        while (rs.e < 0 && h < q.size() && waiting[static_cast<std::size_t>(q[h])] == 0) {
          const EventId e = q[h++];
          // The binding constraint: the latest-finishing of the stream predecessor and deps.
          EventId bind = last_on_stream[static_cast<std::size_t>(s)];
          double bind_end = bind >= 0 ? r.events[static_cast<std::size_t>(bind)].end.v : -1;
          for (EventId d : p.deps(p.events[static_cast<std::size_t>(e)]))
            if (d >= first && r.events[static_cast<std::size_t>(d)].end.v > bind_end) {
              bind = d;
              bind_end = r.events[static_cast<std::size_t>(d)].end.v;
            }
          pred[static_cast<std::size_t>(e)] = bind;
          r.events[static_cast<std::size_t>(e)].start = Seconds{now};
          rs.e = e;
          rs.remaining = std::max(0.0, duration[static_cast<std::size_t>(e)].v);
          if (rs.remaining == 0) {
            complete(s);
            progress = true;
          }
        }
      }
    }
  };

  for (;;) {
    start_ready();
    bool any = false, comm = false;
    for (const auto& rs : run)
      if (rs.e >= 0) {
        any = true;
        comm = comm || p.events[static_cast<std::size_t>(rs.e)].kind == EventKind::collective;
      }
    if (!any) break;
    std::array<double, kS> rate{};
    int best = -1;
    double best_dt = std::numeric_limits<double>::infinity();
    for (int s = 0; s < kS; ++s) {
      const auto& rs = run[static_cast<std::size_t>(s)];
      if (rs.e < 0) continue;
      const bool computing = p.events[static_cast<std::size_t>(rs.e)].kind != EventKind::collective;
      rate[static_cast<std::size_t>(s)] = computing && comm && s == static_cast<int>(Stream::compute) ? slow : 1.0;
      const double dt = rs.remaining / rate[static_cast<std::size_t>(s)];
      if (best < 0 || dt < best_dt || (dt == best_dt && rs.e < run[static_cast<std::size_t>(best)].e)) {
        best_dt = dt;
        best = s;
      }
    }
    now += best_dt;
    for (int s = 0; s < kS; ++s) {
      auto& rs = run[static_cast<std::size_t>(s)];
      if (rs.e < 0) continue;
      r.busy[static_cast<std::size_t>(s)] += Seconds{best_dt};
      rs.remaining = s == best ? 0.0 : std::max(0.0, rs.remaining - best_dt * rate[static_cast<std::size_t>(s)]);
    }
    complete(best);
  }
  r.processed = processed;
  if (processed != n - first)
    throw std::logic_error(fmt::format("run_events: {} of {} events could not run (a dependency cycle?)",
                                       n - first - processed, n - first));

  // Phase times, micro-step by micro-step. A micro-step's backward runs from the end of its
  // forward to its last event, but no further than the start of the next forward: work of
  // one micro-step that overlaps the next forward is not counted twice.
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
  for (EventId e = first; e < n; ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    const EventTime& t = r.events[static_cast<std::size_t>(e)];
    begin_all = std::min(begin_all, t.start.v);
    end_all = std::max(end_all, t.end.v);
    if (ev.micro_step < 0) continue;
    if (ev.micro_step != micro) {
      close_micro();
      micro = ev.micro_step;
      have_fwd = false;
      ms_end = 0;
      bwd_compute = 0;
    }
    ms_end = std::max(ms_end, t.end.v);
    if (ev.phase == Phase::forward) {
      if (!have_fwd) fwd_begin = t.start.v;
      have_fwd = true;
      fwd_end = std::max(fwd_end, t.end.v);
    } else if (ev.stream == Stream::compute && ev.kind == EventKind::compute) {
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
  for (EventId e = first; e < n; ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    if (ev.kind != EventKind::collective) continue;
    const auto k = static_cast<std::size_t>(ev.coll);
    const Bytes b = p.bytes_sent(ev);
    r.comm.bytes[k] += b;
    r.comm.total += b;
    r.comm.count[k] += 1;
    const EventTime& t = r.events[static_cast<std::size_t>(e)];
    r.comm.time[k] += t.end - t.start;
    if (ev.stream == Stream::compute) r.comm.exposed[k] += t.end - t.start;
  }
  EventId prev = -1;
  for (EventId e : fifo[static_cast<std::size_t>(Stream::compute)]) {
    if (prev >= 0) {
      const double gap = r.events[static_cast<std::size_t>(e)].start.v - r.events[static_cast<std::size_t>(prev)].end.v;
      if (gap > 0) {
        EventId c = pred[static_cast<std::size_t>(e)];
        while (c >= 0 && p.events[static_cast<std::size_t>(c)].kind != EventKind::collective &&
               p.events[static_cast<std::size_t>(c)].stream != Stream::compute)
          c = pred[static_cast<std::size_t>(c)];
        if (c >= 0 && p.events[static_cast<std::size_t>(c)].kind == EventKind::collective) {
          // Only the part of the gap while that collective ran: its queueing behind other
          // communication belongs to those.
          const EventTime& ct = r.events[static_cast<std::size_t>(c)];
          const double lo = std::max(r.events[static_cast<std::size_t>(prev)].end.v, ct.start.v);
          const double hi = std::min(r.events[static_cast<std::size_t>(e)].start.v, ct.end.v);
          if (hi > lo) r.comm.exposed[static_cast<std::size_t>(p.events[static_cast<std::size_t>(c)].coll)] += Seconds{hi - lo};
        }
      }
    }
    prev = e;
  }

  // Critical path: back from the last event to finish.
  EventId last = -1;
  for (EventId e = first; e < n; ++e)
    if (last < 0 || r.events[static_cast<std::size_t>(e)].end.v >= r.events[static_cast<std::size_t>(last)].end.v) last = e;
  for (EventId e = last; e >= 0; e = pred[static_cast<std::size_t>(e)]) r.critical_path.push_back(e);
  std::reverse(r.critical_path.begin(), r.critical_path.end());
  return r;
}

}  // namespace zp::sim
