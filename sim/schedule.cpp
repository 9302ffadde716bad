#include "sim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace zp::sim::engine_detail {

using zero::Event;
using zero::EventKind;
using zero::Phase;
using zero::Stream;

namespace {

constexpr Nanos kMaxTime = std::numeric_limits<Nanos>::max() / 4;
constexpr auto kComputeStream = static_cast<std::size_t>(Stream::compute);

// Builds a CSR from (index, item) pairs, items in the order given.
Csr csr(std::size_t size, const std::vector<std::pair<std::size_t, std::int64_t>>& pairs) {
  Csr c;
  c.begin.assign(size + 1, 0);
  for (const auto& [i, v] : pairs) ++c.begin[i + 1];
  for (std::size_t i = 1; i <= size; ++i) c.begin[i] += c.begin[i - 1];
  c.items.resize(pairs.size());
  std::vector<std::int32_t> fill(c.begin.begin(), c.begin.end() - 1);
  for (const auto& [i, v] : pairs) c.items[static_cast<std::size_t>(fill[i]++)] = v;
  return c;
}

}  // namespace

Nanos to_ns(Seconds s) {
  const double ns = std::max(0.0, s.v) * 1e9;
  if (!(ns < 1e18)) throw std::range_error(fmt::format("an event's cost of {} s is beyond what the engine can time", s.v));
  return std::llround(ns);
}

Layout::Layout(const zero::Program& prog) : p(prog) {
  first = std::max<zero::EventId>(p.step_begin, 0);
  S = static_cast<std::int64_t>(p.events.size());
  const auto& rep = p.repeat;
  if (rep.copies > 0) {
    K = rep.copies;
    d = rep.events;
    b = rep.first;
    a = b - d;
    c = b + d;
  } else {
    a = b = c = S;
    d = 1;
  }
  n = S + static_cast<std::int64_t>(K) * (K > 0 ? d : 0);
  info.resize(static_cast<std::size_t>(S));
  stored_pos_.assign(static_cast<std::size_t>(S), -1);
  prev_stored_.assign(static_cast<std::size_t>(c), -1);
  std::array<std::int64_t, kS> last_on{-1, -1, -1, -1};
  for (std::int64_t e = first; e < S; ++e) {
    const Event& ev = p.events[static_cast<std::size_t>(e)];
    const auto s = static_cast<std::uint8_t>(ev.stream);
    info[static_cast<std::size_t>(e)] =
        static_cast<std::uint8_t>(s | (ev.kind == EventKind::collective ? kCollective : 0) |
                                  (ev.kind == EventKind::compute ? kCompute : 0) | (ev.phase == Phase::forward ? kForward : 0));
    auto& list = e < c ? pre[s] : tail[s];
    stored_pos_[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(list.size());
    list.push_back(e);
    if (e < c) {
      prev_stored_[static_cast<std::size_t>(e)] = last_on[s];
      last_on[s] = e;
    }
    for (zero::EventId d0 : p.deps(ev))
      if (d0 >= first) backward = backward && d0 < e;
  }
  blk_pos_.assign(static_cast<std::size_t>(K > 0 ? d : 0), -1);
  for (std::int64_t x = 0; K > 0 && x < d; ++x) {
    const auto s = info[static_cast<std::size_t>(b + x)] & kStreamMask;
    blk_pos_[static_cast<std::size_t>(x)] = static_cast<std::int32_t>(blk[s].size());
    blk[s].push_back(static_cast<std::int32_t>(x));
  }
  for (int s = 0; s < kS; ++s)
    count[static_cast<std::size_t>(s)] = static_cast<std::int64_t>(pre[s].size() + tail[s].size()) +
                                         static_cast<std::int64_t>(K) * static_cast<std::int64_t>(blk[s].size());
  // Dependents, by what the dependency points to (see Csr members). Events before a
  // (every event without copies) in two passes, the others from (index, item) pairs.
  fixed.begin.assign(static_cast<std::size_t>(std::max<std::int64_t>(a, 0)) + 1, 0);
  for (std::int64_t e = first; e < S; ++e)
    for (zero::EventId r : p.deps(p.events[static_cast<std::size_t>(e)]))
      if (r >= first && r < a) ++fixed.begin[static_cast<std::size_t>(r) + 1];
  for (std::size_t i = 1; i < fixed.begin.size(); ++i) fixed.begin[i] += fixed.begin[i - 1];
  fixed.items.resize(static_cast<std::size_t>(fixed.begin.back()));
  {
    std::vector<std::int32_t> fill(fixed.begin.begin(), fixed.begin.end() - 1);
    for (std::int64_t e = first; e < S; ++e)
      for (zero::EventId r : p.deps(p.events[static_cast<std::size_t>(e)]))
        if (r >= first && r < a) fixed.items[static_cast<std::size_t>(fill[static_cast<std::size_t>(r)]++)] = e;
  }
  std::vector<std::pair<std::size_t, std::int64_t>> tail_p, same_p, next_p, tail_same_p, tail_prev_p;
  for (std::int64_t e = std::max(first, a); e < S; ++e)
    for (zero::EventId r : p.deps(p.events[static_cast<std::size_t>(e)])) {
      if (r < first || r < a) continue;
      if (r >= c) {
        tail_p.emplace_back(static_cast<std::size_t>(r - c), e);
      } else if (e >= c) {
        (r >= b ? tail_same_p : tail_prev_p).emplace_back(static_cast<std::size_t>(r >= b ? r - b : r - a), e);
      } else if (e >= b) {
        (r >= b ? same_p : next_p).emplace_back(static_cast<std::size_t>(r >= b ? r - b : r - a), e - b);
      }
      // Instance -1's dependencies inside itself are the block's `same` (Program::repeat).
    }
  const auto nb = static_cast<std::size_t>(K > 0 ? d : 0);
  tail_csr = csr(static_cast<std::size_t>(S - c), tail_p);
  same = csr(nb, same_p);
  next = csr(nb, next_p);
  tail_same = csr(nb, tail_same_p);
  tail_prev = csr(nb, tail_prev_p);
}

std::int64_t Layout::at(int s, std::int64_t q) const {
  const auto& pr = pre[static_cast<std::size_t>(s)];
  const auto np = static_cast<std::int64_t>(pr.size());
  if (q < np) return pr[static_cast<std::size_t>(q)];
  q -= np;
  const auto& bl = blk[static_cast<std::size_t>(s)];
  const auto nb = static_cast<std::int64_t>(bl.size());
  if (q < static_cast<std::int64_t>(K) * nb) return c + (q / nb) * d + bl[static_cast<std::size_t>(q % nb)];
  q -= static_cast<std::int64_t>(K) * nb;
  return tail[static_cast<std::size_t>(s)][static_cast<std::size_t>(q)] + static_cast<std::int64_t>(K) * d;
}

std::int64_t Layout::pos(std::int64_t L) const {
  const int s = stream(L);
  const auto np = static_cast<std::int64_t>(pre[static_cast<std::size_t>(s)].size());
  const auto nb = static_cast<std::int64_t>(blk[static_cast<std::size_t>(s)].size());
  if (L < c) return stored_pos_[static_cast<std::size_t>(L)];
  const int k = shift(L);
  if (L < c + static_cast<std::int64_t>(K) * d) return np + (k - 1) * nb + blk_pos_[static_cast<std::size_t>(index(L))];
  return np + static_cast<std::int64_t>(K) * nb + stored_pos_[static_cast<std::size_t>(stored(L))];
}

Nanos Schedule::time_of(const Layout& l, std::int64_t L, bool want_start) const {
  if (L < l.c || L >= l.c + static_cast<std::int64_t>(l.K) * l.d) {
    const auto s = static_cast<std::size_t>(l.stored(L));
    return want_start ? start[s] : end[s];
  }
  const int k = l.shift(L);
  const auto x = static_cast<std::size_t>(l.index(L));
  if (periodic(k)) {
    const Nanos base = reference == 0 ? (want_start ? start : end)[static_cast<std::size_t>(l.b) + x]
                                      : (want_start ? copies.at(reference).start : copies.at(reference).end)[x];
    return base + static_cast<Nanos>(k - reference) * period;
  }
  const auto it = copies.find(k);
  if (it == copies.end()) throw std::logic_error(fmt::format("engine: no times for copy {}", k));
  return want_start ? it->second.start[x] : it->second.end[x];
}

namespace {

// The simulation: streams run their events in order; an event starts when its stream is
// free and its dependencies are done.
class Runner {
 public:
  Runner(const Layout& l, std::span<const Nanos> dur, double interference, Schedule& out)
      : l_(l), dur_(dur), slow_factor_(1.0 + std::max(0.0, interference)), out_(out) {}

  void run() {
    const auto S = static_cast<std::size_t>(l_.S);
    out_.start.assign(S, kUnset);
    out_.end.assign(S, kUnset);
    for (std::size_t s = 0; s < static_cast<std::size_t>(kS); ++s)
      if (l_.count[s] > 0) active_[num_active_++] = s;
    if (num_active_ == 1 && l_.backward) {
      run_sequential();
      return;
    }
    waiting_stored_.assign(S, 0);
    for (std::int64_t e = l_.first; e < l_.S; ++e)
      l_.deps(e < l_.c ? e : e + static_cast<std::int64_t>(l_.K) * l_.d, [&](std::int64_t) { ++waiting_stored_[static_cast<std::size_t>(e)]; });
    snapshots_ = l_.K >= 4 && !l_.blk[kComputeStream].empty();
    for (;;) {
      start_ready();
      if (snapshots_) check_snapshots();
      if (running_ == 0) break;
      advance();
    }
    const std::int64_t expected = l_.n - l_.first;
    if (out_.processed != expected)
      throw std::logic_error(fmt::format("run_events: {} of {} events could not run (a dependency cycle?)",
                                         expected - out_.processed, expected));
    for (auto& [k, r] : out_.copies) r.waiting = {};
  }

 private:
  // One stream, every dependency earlier: each event starts when the one before it ends.
  // The copies of the block take the block's time each, one after the other.
  void run_sequential() {
    Nanos now = 0;
    auto one = [&](std::int64_t e) {
      out_.start[static_cast<std::size_t>(e)] = now;
      now = add(now, dur_[static_cast<std::size_t>(e)]);
      out_.end[static_cast<std::size_t>(e)] = now;
    };
    for (std::int64_t e = l_.first; e < l_.c; ++e) one(e);
    if (l_.K > 0) {
      Nanos block = 0;
      for (std::int64_t x = 0; x < l_.d; ++x) block = add(block, dur_[static_cast<std::size_t>(l_.b + x)]);
      out_.reference = 0;
      out_.last = l_.K;
      out_.period = block;
      now = add(now, mul(block, l_.K));
    }
    for (std::int64_t e = l_.c; e < l_.S; ++e) one(e);
    out_.processed = l_.n - l_.first;
  }

  static Nanos add(Nanos a, Nanos b) {
    if (b > kMaxTime - a) throw std::range_error("run_events: the simulated step is longer than the engine can time");
    return a + b;
  }
  static Nanos mul(Nanos a, std::int64_t k) {
    if (a != 0 && k > kMaxTime / a) throw std::range_error("run_events: the simulated step is longer than the engine can time");
    return a * k;
  }

  // ---------------------------------------------------------------- per-event state
  Record& record(int k) {
    auto& slot = cache_[static_cast<std::size_t>(k) % cache_.size()];
    if (slot.first == k) return *slot.second;
    Record& r = out_.copies.at(k);
    slot = {k, &r};
    return r;
  }
  bool is_copy(std::int64_t L) const { return L >= l_.c && L < l_.c + static_cast<std::int64_t>(l_.K) * l_.d; }
  std::int32_t& waiting(std::int64_t L) {
    if (!is_copy(L)) return waiting_stored_[static_cast<std::size_t>(l_.stored(L))];
    return record(l_.shift(L)).waiting[static_cast<std::size_t>(l_.index(L))];
  }
  Nanos& start_of(std::int64_t L) {
    if (!is_copy(L)) return out_.start[static_cast<std::size_t>(l_.stored(L))];
    return record(l_.shift(L)).start[static_cast<std::size_t>(l_.index(L))];
  }
  Nanos& end_of(std::int64_t L) {
    if (!is_copy(L)) return out_.end[static_cast<std::size_t>(l_.stored(L))];
    return record(l_.shift(L)).end[static_cast<std::size_t>(l_.index(L))];
  }
  std::int64_t& done_count(int inst) { return inst <= 0 ? done_stored_[static_cast<std::size_t>(inst + 1)] : record(inst).done; }

  // Copy k's events, waiting for what is not done yet.
  void materialize(int k) {
    Record& r = out_.copies[k];
    const auto d = static_cast<std::size_t>(l_.d);
    r.start.assign(d, kUnset);
    r.end.assign(d, kUnset);
    r.waiting.assign(d, 0);
    r.done = 0;
    materialized_ = k;
    for (std::size_t x = 0; x < d; ++x)
      l_.deps(l_.logical(k, static_cast<std::int64_t>(x)), [&](std::int64_t dep) {
        if (end_of(dep) == kUnset) ++r.waiting[x];
      });
  }

  void dec(std::int64_t L) {
    if (--waiting(L) == 0 && static_cast<std::size_t>(l_.stream(L)) < scanning_) rescan_ = true;
  }

  void notify(std::int64_t L) {
    const int inst = l_.instance(L);
    const std::int64_t moved = static_cast<std::int64_t>(l_.K) * l_.d;
    if (inst == kNoInstance) {
      const std::int64_t s = l_.stored(L);
      if (s < l_.a) {
        for (std::int64_t y : l_.fixed.of(static_cast<std::size_t>(s))) {
          if (y >= l_.c) {
            dec(y + moved);
          } else {
            dec(y);
            if (y >= l_.b)  // a fixed reference of the block: every copy made so far waits on it too
              for (int k = 1; k <= materialized_; ++k) dec(y + k * l_.d);
          }
        }
      } else {
        for (std::int64_t y : l_.tail_csr.of(static_cast<std::size_t>(s - l_.c))) dec(y + moved);
      }
      return;
    }
    const auto x = static_cast<std::size_t>(l_.index(L));
    for (std::int64_t y : l_.same.of(x)) dec(l_.logical(inst, y));
    if (inst + 1 <= l_.K)
      for (std::int64_t y : l_.next.of(x)) dec(l_.logical(inst + 1, y));
    if (inst == l_.K)
      for (std::int64_t y : l_.tail_same.of(x)) dec(y + moved);
    if (inst == l_.K - 1)
      for (std::int64_t y : l_.tail_prev.of(x)) dec(y + moved);
  }

  // ---------------------------------------------------------------- the run
  void start_event(std::size_t s, std::int64_t e) {
    start_of(e) = now_;
    run_e_[s] = e;
    remaining_[s] = dur_[static_cast<std::size_t>(l_.stored(e))];
    const int inst = l_.instance(e);
    if (inst != kNoInstance) {
      max_started_ = std::max(max_started_, inst);
      if (inst >= 0 && inst + 1 <= l_.K && inst + 1 > materialized_) materialize(inst + 1);
    } else {
      ++outside_started_;
    }
    if (remaining_[s] == 0) {
      complete(s);
    } else {
      ++running_;
      if (l_.flags(e) & kCollective) ++comm_running_;
    }
  }

  void complete(std::size_t s) {
    const std::int64_t e = run_e_[s];
    end_of(e) = now_;
    run_e_[s] = -1;
    ++out_.processed;
    const int inst = l_.instance(e);
    if (inst != kNoInstance) ++done_count(inst);
    notify(e);
  }

  // Start every event that can start now; zero-length events complete on the spot. The
  // result does not depend on the order in which streams are visited: each start time is
  // `now`, and what bound an event (its stream predecessor, its dependencies) has ended.
  void start_ready() {
    do {
      rescan_ = false;
      for (std::size_t i = 0; i < num_active_; ++i) {
        const std::size_t s = active_[i];
        scanning_ = s;
        while (run_e_[s] < 0 && head_[s] < l_.count[s]) {
          const std::int64_t e = l_.at(static_cast<int>(s), head_[s]);
          if (waiting(e) != 0) break;
          ++head_[s];
          start_event(s, e);
        }
      }
      scanning_ = kS;
    } while (rescan_);
  }

  // Time to finish `r` of work slowed down, and the work done in `dt` slowed down.
  Nanos slowed_time(Nanos r) const { return static_cast<Nanos>(std::ceil(static_cast<double>(r) * slow_factor_)); }
  Nanos slowed_work(Nanos dt) const { return static_cast<Nanos>(std::floor(static_cast<double>(dt) / slow_factor_)); }

  // Run to the next completion.
  void advance() {
    std::size_t best = kS;
    Nanos best_dt = 0;
    if (running_ == 1) {
      // Alone, an event runs at full rate (interference needs compute and communication).
      for (std::size_t i = 0; i < num_active_; ++i)
        if (run_e_[active_[i]] >= 0) best = active_[i];
      best_dt = remaining_[best];
      now_ = add(now_, best_dt);
      remaining_[best] = 0;
    } else {
      const bool comm = comm_running_ > 0;
      std::array<bool, kS> slowed{};
      for (std::size_t i = 0; i < num_active_; ++i) {
        const std::size_t s = active_[i];
        const std::int64_t e = run_e_[s];
        if (e < 0) continue;
        slowed[s] = comm && s == kComputeStream && !(l_.flags(e) & kCollective) && slow_factor_ != 1.0;
        const Nanos dt = slowed[s] ? slowed_time(remaining_[s]) : remaining_[s];
        if (best == kS || dt < best_dt || (dt == best_dt && e < run_e_[best])) {
          best_dt = dt;
          best = s;
        }
      }
      now_ = add(now_, best_dt);
      for (std::size_t i = 0; i < num_active_; ++i) {
        const std::size_t s = active_[i];
        if (run_e_[s] < 0) continue;
        if (s == best) {
          remaining_[s] = 0;
          continue;
        }
        const Nanos work = slowed[s] ? slowed_work(best_dt) : best_dt;
        remaining_[s] = std::max<Nanos>(0, remaining_[s] - work);
      }
    }
    --running_;
    if (l_.flags(run_e_[best]) & kCollective) --comm_running_;
    complete(best);
  }

  // ---------------------------------------------------------------- periodicity
  // The state of the run as copy i's first compute event has started, relative to copy i:
  // stream heads, running events with their remaining work and start, every event's
  // state in the copies not yet done or touched. Comparable only when no event outside the
  // repeated copies runs.
  struct Snapshot {
    int inst = 0;
    Nanos time = 0;
    int max_started = 0;
    bool clean = false;
    std::vector<std::int64_t> state;
  };

  int lowest_incomplete() {
    while (lo_ <= materialized_ && done_count(lo_) == l_.d) ++lo_;
    return lo_;
  }

  Snapshot take(int i) {
    Snapshot sn;
    sn.inst = i;
    sn.time = now_;
    sn.max_started = max_started_;
    const int lo = lowest_incomplete();
    sn.clean = lo >= 1;
    for (std::size_t s = 0; s < static_cast<std::size_t>(kS); ++s)
      if (run_e_[s] >= 0 && l_.instance(run_e_[s]) == kNoInstance) sn.clean = false;
    if (!sn.clean) return sn;
    auto& v = sn.state;
    v.push_back(lo - i);
    v.push_back(materialized_ - i);
    v.push_back(max_started_ - i);
    v.push_back(outside_started_);
    const std::int64_t base = l_.logical(i, 0);
    for (std::size_t s = 0; s < static_cast<std::size_t>(kS); ++s) {
      const auto nb = static_cast<std::int64_t>(l_.blk[s].size());
      v.push_back(nb > 0 ? head_[s] - (static_cast<std::int64_t>(l_.pre[s].size()) + (i - 1) * nb) : head_[s]);
      const std::int64_t e = run_e_[s];
      v.push_back(e >= 0 ? e - base : std::numeric_limits<std::int64_t>::min());
      v.push_back(e >= 0 ? remaining_[s] : 0);
      v.push_back(e >= 0 ? now_ - start_of(e) : 0);
    }
    for (int j = lo; j <= materialized_; ++j) {
      const Record& r = record(j);
      for (std::size_t x = 0; x < r.waiting.size(); ++x)
        v.push_back(r.end[x] != kUnset ? -2 : r.start[x] != kUnset ? -1 : r.waiting[x]);
    }
    return sn;
  }

  void check_snapshots() {
    const auto nb = static_cast<std::int64_t>(l_.blk[kComputeStream].size());
    const auto np = static_cast<std::int64_t>(l_.pre[kComputeStream].size());
    while (!jumped_ && next_snap_ <= l_.K && head_[kComputeStream] > np + (next_snap_ - 1) * nb) {
      Snapshot sn = take(next_snap_);
      const bool same = sn.clean && prev_.clean && prev_.inst == sn.inst - 1 && sn.state == prev_.state;
      if (!same) {
        streak_ = -1;
      } else if (streak_ < 0) {
        // From prev_'s time on, every start and end repeats one period later; the copies not
        // started by then run entirely inside that and are the reference's moved.
        streak_ = sn.inst;
        reference_ = prev_.max_started + 1;
        period_ = sn.time - prev_.time;
      }
      ++next_snap_;
      if (streak_ >= 0 && lowest_incomplete() > reference_) {
        // Move over the copies but the last two and what runs ahead of them.
        const int J = l_.K - 2 - max_started_;
        if (J >= 1) jump(J);
      }
      prev_ = std::move(sn);
    }
  }

  void jump(int J) {
    const Nanos shift = mul(period_, J);
    now_ = add(now_, shift);
    const std::int64_t moved = static_cast<std::int64_t>(J) * l_.d;
    for (std::size_t s = 0; s < static_cast<std::size_t>(kS); ++s) {
      head_[s] += static_cast<std::int64_t>(J) * static_cast<std::int64_t>(l_.blk[s].size());
      if (run_e_[s] >= 0) run_e_[s] += moved;
    }
    const int lo = lowest_incomplete();
    for (int j = materialized_; j >= lo; --j) {
      Record r = out_.copies.at(j);
      for (auto* v : {&r.start, &r.end})
        for (auto& t : *v)
          if (t != kUnset) t += shift;
      out_.copies[j + J] = std::move(r);
    }
    cache_.fill({-1, nullptr});
    out_.reference = reference_;
    out_.last = lo + J - 1;
    out_.period = period_;
    for (auto it = out_.copies.upper_bound(reference_); it != out_.copies.end() && it->first <= out_.last;)
      it = out_.copies.erase(it);
    lo_ = lo + J;
    materialized_ += J;
    max_started_ += J;
    next_snap_ += J;
    out_.processed += moved;
    jumped_ = true;
  }

  const Layout& l_;
  std::span<const Nanos> dur_;
  const double slow_factor_;
  Schedule& out_;
  std::array<std::size_t, kS> active_{};
  std::size_t num_active_ = 0;
  std::vector<std::int32_t> waiting_stored_;
  std::array<std::int64_t, 2> done_stored_{};  // instances -1 and 0
  std::array<std::pair<int, Record*>, 8> cache_{{{-1, nullptr}, {-1, nullptr}, {-1, nullptr}, {-1, nullptr},
                                                  {-1, nullptr}, {-1, nullptr}, {-1, nullptr}, {-1, nullptr}}};
  Nanos now_ = 0;
  std::array<std::int64_t, kS> head_{};
  std::array<std::int64_t, kS> run_e_{-1, -1, -1, -1};
  std::array<Nanos, kS> remaining_{};
  int running_ = 0, comm_running_ = 0;
  bool rescan_ = false;
  std::size_t scanning_ = kS;
  int materialized_ = 0;         // the highest instance whose events exist (0: the block)
  int max_started_ = std::numeric_limits<int>::min();
  std::int64_t outside_started_ = 0;
  int lo_ = -1;                  // no instance below is incomplete
  // periodicity
  bool snapshots_ = false, jumped_ = false;
  int next_snap_ = 1;
  Snapshot prev_;
  int streak_ = -1, reference_ = -1;
  Nanos period_ = 0;
};

}  // namespace

Schedule simulate(const Layout& l, std::span<const Nanos> duration, double interference) {
  Schedule s;
  Runner r(l, duration, interference, s);
  r.run();
  return s;
}

}  // namespace zp::sim::engine_detail
