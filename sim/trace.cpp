#include "sim/trace.hpp"

#include <algorithm>
#include <array>
#include <string>

#include <fmt/format.h>

namespace zp::sim {

using nlohmann::json;

namespace {
// Copies of a repeated block shown event by event; the others are one slice per stream.
constexpr int kTraceCopies = 16;
}  // namespace

std::vector<OpTraceInfo> op_trace_info(const models::OpGraph& g, const ComputeModel* cm) {
  std::vector<OpTraceInfo> ops;
  ops.reserve(g.ops.size());
  for (const auto& op : g.ops) {
    OpTraceInfo oi{models::fn_name(op.fn), !op.gemms.empty(),
                   op.fn == models::Fn::sdpa || op.fn == models::Fn::flash_attention, 0.0, 0.0,
                   cm != nullptr ? cm->grad_add_seconds_per_byte() : 0.0, cm != nullptr ? cm->grad_add_launch() : 0.0};
    if (cm != nullptr && oi.gemm) {
      // The model's own split of a backward event and of a forward one that adds apart.
      zero::Event e;
      e.kind = zero::EventKind::compute;
      e.op = op.id;
      e.phase = zero::Phase::backward;
      oi.backward_bias_s = cm->bias_part(e).v;
      e.phase = zero::Phase::forward;
      e.unfused_bias = true;
      oi.forward_bias_s = cm->bias_part(e).v;
    }
    ops.push_back(std::move(oi));
  }
  return ops;
}

bool on_device(const zero::Event& e) {
  if (e.kind == zero::EventKind::marker || e.stream == zero::Stream::host) return false;
  if (e.kind == zero::EventKind::optimizer && e.src == zero::Placement::host) return false;
  if (e.kind == zero::EventKind::copy && e.src == zero::Placement::host && e.dst == zero::Placement::host) return false;
  return true;
}

std::string_view profiled_class_name(ProfiledClass c) {
  switch (c) {
    case ProfiledClass::gemm: return "gemm";
    case ProfiledClass::attention: return "attention";
    case ProfiledClass::elementwise: return "elementwise";
    case ProfiledClass::optimizer: return "optimizer";
    case ProfiledClass::collective: return "collective";
    case ProfiledClass::copy: return "copy";
  }
  return "?";
}

std::array<double, kNumProfiledClasses> profiled_split(const zero::Event& e, double seconds,
                                                        std::span<const OpTraceInfo> ops, const ElementwisePricing* update) {
  std::array<double, kNumProfiledClasses> out{};
  auto add = [&](ProfiledClass c, double v) { out[static_cast<std::size_t>(c)] += v; };
  switch (e.kind) {
    case zero::EventKind::compute: {
      if (e.op < 0 || static_cast<std::size_t>(e.op) >= ops.size()) {
        add(ProfiledClass::elementwise, seconds);
        break;
      }
      const OpTraceInfo& oi = ops[static_cast<std::size_t>(e.op)];
      // Autograd's gradient adds are elementwise kernels whatever the op.
      const double adds = std::min(seconds, grad_accumulate_seconds(e, oi.grad_add_s_per_byte, oi.grad_add_launch_s));
      add(ProfiledClass::elementwise, adds);
      seconds -= adds;
      if (oi.attention) {
        add(ProfiledClass::attention, seconds);
      } else if (oi.gemm) {
        const double bias = std::min(seconds, e.phase == zero::Phase::backward ? oi.backward_bias_s
                                              : e.unfused_bias                 ? oi.forward_bias_s
                                                                               : 0.0);
        add(ProfiledClass::elementwise, bias);
        add(ProfiledClass::gemm, seconds - bias);
      } else {
        add(ProfiledClass::elementwise, seconds);
      }
      break;
    }
    case zero::EventKind::optimizer: {
      // The fused update's multi-tensor kernels, and the norm and loop kernels priced with it.
      const double fused = update != nullptr && e.src == zero::Placement::device
                               ? std::min(seconds, update->seconds(e.flops, e.mem_bytes).v)
                               : seconds;
      add(ProfiledClass::optimizer, fused);
      add(ProfiledClass::elementwise, seconds - fused);
      break;
    }
    case zero::EventKind::collective: add(ProfiledClass::collective, seconds); break;
    default: add(ProfiledClass::copy, seconds); break;
  }
  return out;
}

void append_chrome_trace(json& doc, const zero::Program& p, const TimeReport& t, std::span<const OpTraceInfo> ops,
                         const ElementwisePricing* update) {
  auto& ev = doc["traceEvents"];
  const int pid = p.info.rank;
  ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                {"args", {{"name", "rank " + std::to_string(pid)}}}});
  for (int s = 0; s < zero::kNumStreams; ++s)
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", s},
                  {"args", {{"name", zero::stream_name(static_cast<zero::Stream>(s))}}}});
  std::array<std::int64_t, zero::kNumCategories> live{};
  auto counter = [&](double ts_us) {
    json args = json::object();
    for (int c = 0; c < zero::kNumCategories; ++c) args[zero::category_name(static_cast<zero::Category>(c))] = live[static_cast<std::size_t>(c)];
    ev.push_back({{"name", "allocated bytes"}, {"ph", "C"}, {"pid", pid}, {"tid", 0}, {"ts", ts_us}, {"args", args}});
  };
  // One event: stored `e`, standing at logical id `id`.
  auto one = [&](const zero::Event& e, zero::EventId id) {
    const EventTime et = t.at(id);
    const double ts = et.start.v * 1e6, dur = (et.end - et.start).v * 1e6;
    bool changed = false;
    for (auto b : p.allocs(e)) {
      const auto& buf = p.buffers[static_cast<std::size_t>(b)];
      if (buf.placement != zero::Placement::device) continue;
      live[static_cast<std::size_t>(buf.category)] += buf.bytes.v;
      changed = true;
    }
    if (changed) counter(ts);
    if (e.id >= p.step_begin && e.kind != zero::EventKind::marker) {
      json args = {{"id", id}, {"kind", zero::event_kind_name(e.kind)}, {"phase", zero::phase_name(e.phase)}};
      if (e.kind == zero::EventKind::collective) {
        args["collective"] = zero::coll_kind_name(e.coll);
        args["elements"] = e.elements;
        args["dtype"] = std::string(dtype_name(e.dtype));
        args["trigger"] = zero::trigger_name(e.trigger);
        args["group"] = p.groups[static_cast<std::size_t>(e.group)].name;
      } else {
        args["flops"] = e.flops.v;
        args["bytes"] = e.mem_bytes.v;
      }
      if (e.kind == zero::EventKind::compute && e.op >= 0 && static_cast<std::size_t>(e.op) < ops.size()) {
        const OpTraceInfo& oi = ops[static_cast<std::size_t>(e.op)];
        args["fn"] = oi.fn;
        args["gemm"] = oi.gemm;
      }
      if (!ops.empty() && on_device(e)) {
        // The slice's microseconds by the class a profiler would name its kernels by.
        json classes = json::object();
        const auto split = profiled_split(e, (et.end - et.start).v, ops, update);
        for (int k = 0; k < kNumProfiledClasses; ++k)
          if (split[static_cast<std::size_t>(k)] > 0)
            classes[std::string(profiled_class_name(static_cast<ProfiledClass>(k)))] = split[static_cast<std::size_t>(k)] * 1e6;
        args["profiled"] = std::move(classes);
      }
      ev.push_back({{"name", p.event_name(id)}, {"cat", zero::event_kind_name(e.kind)}, {"ph", "X"}, {"pid", pid},
                    {"tid", static_cast<int>(e.stream)}, {"ts", ts}, {"dur", dur}, {"args", args}});
    }
    changed = false;
    for (auto b : p.frees(e)) {
      const auto& buf = p.buffers[static_cast<std::size_t>(b)];
      if (buf.placement != zero::Placement::device) continue;
      live[static_cast<std::size_t>(buf.category)] -= buf.bytes.v;
      changed = true;
    }
    if (changed) counter(et.end.v * 1e6);
  };
  const auto& rp = p.repeat;
  const int K = rp.copies;
  const auto c = static_cast<std::size_t>(K > 0 ? rp.first + rp.events : static_cast<zero::EventId>(p.events.size()));
  for (std::size_t e = 0; e < c; ++e) one(p.events[e], static_cast<zero::EventId>(e));
  const int shown = std::min(K, kTraceCopies);
  for (int k = 1; k <= shown; ++k)
    for (zero::EventId x = 0; x < rp.events; ++x) one(p.events[static_cast<std::size_t>(rp.first + x)], p.logical_event(rp.first + x, k));
  if (K > shown) {
    // The other copies, one slice per stream from the first of them to the last (their
    // allocations and frees net to nothing, like the block's).
    const int n = K - shown;
    doc["otherData"]["repeated_micro_steps"] = {
        {"shown_event_by_event", shown}, {"shown_as_one_slice_per_stream", n},
        {"note", "micro-steps that repeat the one before them: after the first few, one slice per stream stands for "
                 "the rest"}};
    const int ms0 = p.events[static_cast<std::size_t>(rp.first)].micro_step;
    for (int s = 0; s < zero::kNumStreams; ++s) {
      zero::EventId lo = -1, hi = -1;
      std::int64_t per_copy = 0;
      for (zero::EventId x = 0; x < rp.events; ++x) {
        const auto& e = p.events[static_cast<std::size_t>(rp.first + x)];
        if (static_cast<int>(e.stream) != s || e.kind == zero::EventKind::marker) continue;
        if (lo < 0) lo = rp.first + x;
        hi = rp.first + x;
        ++per_copy;
      }
      if (lo < 0) continue;
      const EventTime a = t.at(p.logical_event(lo, shown + 1)), z = t.at(p.logical_event(hi, K));
      json args = {{"micro_steps", n}, {"events", per_copy * n}, {"first", p.event_name(p.logical_event(lo, shown + 1))},
                   {"last", p.event_name(p.logical_event(hi, K))}};
      if (t.ns.period > 0) args["period_ms"] = static_cast<double>(t.ns.period) / 1e6;
      ev.push_back({{"name", fmt::format("ms{}..ms{}: {} repeated micro-steps", ms0 + shown + 1, ms0 + K, n)},
                    {"cat", "repeated"}, {"ph", "X"}, {"pid", pid}, {"tid", s}, {"ts", a.start.v * 1e6},
                    {"dur", (z.end - a.start).v * 1e6}, {"args", args}});
    }
  }
  const auto moved = static_cast<zero::EventId>(static_cast<std::int64_t>(K) * rp.events);
  for (std::size_t e = c; e < p.events.size(); ++e) one(p.events[e], static_cast<zero::EventId>(e) + moved);
}

json chrome_trace(const zero::Program& p, const TimeReport& t, std::span<const OpTraceInfo> ops,
                  const ElementwisePricing* update) {
  json doc = {{"traceEvents", json::array()}, {"displayTimeUnit", "ms"}};
  doc["otherData"] = {{"model", p.info.model}, {"stage", p.info.stage}, {"world_size", p.info.world_size},
                      {"rank", p.info.rank}};
  append_chrome_trace(doc, p, t, ops, update);
  return doc;
}

}  // namespace zp::sim
