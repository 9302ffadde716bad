#pragma once
// Chrome trace (Trace Event Format; opens in Perfetto and chrome://tracing) of a step
// program run in time: one process per rank, one thread (track) per stream, one
// complete ("X") slice per event named by its event id, and a counter ("C") track of
// allocated device bytes per category over time. The executor writes measured traces
// in the same layout, so the two open side by side. Of the copies of a repeated block
// (Program::repeat) the first 16 are shown event by event, the others as one slice per
// stream ("msA..msB: N repeated micro-steps", otherData.repeated_micro_steps says so), so a
// trace stays the size it has at GAS 20 whatever GAS is.
#include <nlohmann/json.hpp>

#include "sim/engine.hpp"
#include "zero/program.hpp"

namespace zp::sim {

nlohmann::json chrome_trace(const zero::Program& p, const TimeReport& t);
// Appends the events of one rank to an existing trace document (for several ranks).
void append_chrome_trace(nlohmann::json& doc, const zero::Program& p, const TimeReport& t);

}  // namespace zp::sim
