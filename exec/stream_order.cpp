#include "exec/stream_order.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace zp::exec {

namespace {
std::size_t U(std::int64_t v) { return static_cast<std::size_t>(v); }
}  // namespace

StreamOrder::StreamOrder(const zero::Program& p)
    : p_(p),
      seq_(p.events.size(), 0),
      clock_(p.events.size()),
      frontier_(p.events.size()),
      last_use_(p.buffers.size()),
      alloc_stream_(p.buffers.size(), 0) {
  if (p.repeat.copies > 0) throw std::logic_error("StreamOrder: the program must be expanded");
  step_begin();
}

bool StreamOrder::transparent(zero::EventId e) const { return p_.events[U(e)].kind == zero::EventKind::host; }

void StreamOrder::step_begin() {
  for (auto& c : now_) c.fill(0);
  count_.fill(0);
  prev_.fill(-1);
  last_real_.fill(-1);
  for (auto& f : pending_) f.fill(-1);
  for (auto& u : last_use_) u.fill(-1);
  cur_ = -1;
  cur_stream_ = 0;
}

void StreamOrder::wait_for(zero::EventId w) {
  out_.push_back(w);
  auto& mine = now_[U(cur_stream_)];
  const Clock& theirs = clock_[U(w)];
  for (int x = 0; x < kStreams; ++x) mine[U(x)] = std::max(mine[U(x)], theirs[U(x)]);
  clock_[U(cur_)] = mine;
}

std::span<const zero::EventId> StreamOrder::begin(zero::EventId e) {
  const zero::Event& ev = p_.events[U(e)];
  const int s = static_cast<int>(ev.stream);
  cur_ = e;
  cur_stream_ = s;
  out_.clear();
  // What this event is ordered after in the program: its dependencies and its stream's
  // previous event, each as the real events it stands for.
  Frontier deps;
  deps.fill(-1);
  auto merge = [&](zero::EventId d) {
    if (d < p_.step_begin) return;  // before the step: done
    for (int x = 0; x < kStreams; ++x) deps[U(x)] = std::max(deps[U(x)], frontier_[U(d)][U(x)]);
  };
  for (zero::EventId d : p_.deps(ev)) merge(d);
  if (prev_[U(s)] >= 0) merge(prev_[U(s)]);
  prev_[U(s)] = e;
  if (transparent(e)) {
    frontier_[U(e)] = deps;
    return {};
  }
  seq_[U(e)] = ++count_[U(s)];
  last_real_[U(s)] = e;
  auto& mine = now_[U(s)];
  mine[U(s)] = seq_[U(e)];
  clock_[U(e)] = mine;
  frontier_[U(e)].fill(-1);
  frontier_[U(e)][U(s)] = e;
  Frontier& reuse = pending_[U(s)];
  for (int x = 0; x < kStreams; ++x) {
    if (x == s) continue;
    const zero::EventId d = deps[U(x)], r = reuse[U(x)];
    const bool need_d = d >= 0 && mine[U(x)] < seq_[U(d)];
    const bool need_r = r >= 0 && mine[U(x)] < seq_[U(r)] && !(need_d && d >= r);
    if (!need_d && !need_r) continue;
    stats_.dep_waits += need_d ? 1 : 0;
    stats_.reuse_waits += need_r ? 1 : 0;
    wait_for(std::max(need_d ? d : -1, need_r ? r : -1));
  }
  reuse.fill(-1);
  return out_;
}

std::span<const zero::EventId> StreamOrder::touch(zero::BufferId b) {
  out_.clear();
  if (cur_ < 0 || transparent(cur_)) return {};
  auto& last = last_use_[U(b)];
  const auto& mine = now_[U(cur_stream_)];
  for (int x = 0; x < kStreams; ++x) {
    const zero::EventId t = last[U(x)];
    if (x == cur_stream_ || t < 0 || mine[U(x)] >= seq_[U(t)]) continue;
    ++stats_.touch_waits;
    if (stats_.unordered.size() < 8)
      stats_.unordered.push_back(fmt::format("{} uses {} after {} on the {} stream with no dependency ordering them",
                                             p_.event_name(cur_), p_.buffer_name(b), p_.event_name(t),
                                             zero::stream_name(static_cast<zero::Stream>(x))));
    wait_for(t);
  }
  last[U(cur_stream_)] = cur_;
  return out_;
}

std::span<const zero::EventId> StreamOrder::allocated(zero::BufferId b, int pool_stream) {
  out_.clear();
  alloc_stream_[U(b)] = static_cast<std::int8_t>(pool_stream);
  last_use_[U(b)].fill(-1);
  if (cur_ < 0 || transparent(cur_)) return {};
  if (pool_stream != cur_stream_) {
    // Memory from another stream's pool: what that stream's next event would wait for.
    // And the pool's own stream's latest work (the memory's last users there).
    const auto& mine = now_[U(cur_stream_)];
    for (int x = 0; x < kStreams; ++x) {
      const zero::EventId r = x == pool_stream ? last_real_[U(x)] : pending_[U(pool_stream)][U(x)];
      if (x == cur_stream_ || r < 0 || mine[U(x)] >= seq_[U(r)]) continue;
      ++stats_.reuse_waits;
      wait_for(r);
    }
  }
  last_use_[U(b)][U(cur_stream_)] = cur_;
  return out_;
}

void StreamOrder::freed(zero::BufferId b) {
  if (!reuse_waits_) return;
  // Host memory is not pooled per stream: nothing reuses it behind a stream's back.
  if (p_.buffers[U(b)].placement != zero::Placement::device) return;
  const int a = alloc_stream_[U(b)];
  for (int x = 0; x < kStreams; ++x) {
    const zero::EventId t = last_use_[U(b)][U(x)];
    if (x != a && t >= 0) pending_[U(a)][U(x)] = std::max(pending_[U(a)][U(x)], t);
  }
}

void StreamOrder::step_end() { cur_ = -1; }

}  // namespace zp::exec
