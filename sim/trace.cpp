#include "sim/trace.hpp"

#include <array>
#include <string>

namespace zp::sim {

using nlohmann::json;

void append_chrome_trace(json& doc, const zero::Program& p, const TimeReport& t) {
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
  for (const auto& e : p.events) {
    const EventTime& et = t.events[static_cast<std::size_t>(e.id)];
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
      json args = {{"id", e.id}, {"kind", zero::event_kind_name(e.kind)}, {"phase", zero::phase_name(e.phase)}};
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
      ev.push_back({{"name", p.event_name(e.id)}, {"cat", zero::event_kind_name(e.kind)}, {"ph", "X"}, {"pid", pid},
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
  }
}

json chrome_trace(const zero::Program& p, const TimeReport& t) {
  json doc = {{"traceEvents", json::array()}, {"displayTimeUnit", "ms"}};
  doc["otherData"] = {{"model", p.info.model}, {"stage", p.info.stage}, {"world_size", p.info.world_size},
                      {"rank", p.info.rank}};
  append_chrome_trace(doc, p, t);
  return doc;
}

}  // namespace zp::sim
