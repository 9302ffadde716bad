#pragma once
// Memory replay of a step program: walks events in program (issue) order, allocating
// each event's buffers when it starts and freeing them when it ends, per category and
// placement, and feeds device requests through the caching-allocator model to predict
// reserved bytes. The copies of a repeated block (Program::repeat) are replayed from the
// block until one starts from the state the one before started from (the same allocator
// blocks at the same addresses, the same bytes live, the buffers handed on from the copy
// before on the same blocks): every later copy then repeats it exactly, and is skipped.
#include <array>
#include <vector>

#include "core/units.hpp"
#include "sim/device.hpp"
#include "zero/program.hpp"

namespace zp::sim {

using CategoryBytes = std::array<Bytes, zero::kNumCategories>;

struct MemoryReport {
  Bytes peak_allocated{};            // device bytes live at the peak (exact sum of buffer sizes)
  zero::EventId peak_event = -1;     // the event (logical id) at whose start the peak occurs
  CategoryBytes at_peak{};           // breakdown of peak_allocated
  CategoryBytes category_peak{};     // each category's own maximum over the step
  Bytes persistent{};                // device bytes allocated by the prologue
  Bytes peak_host{};
  CategoryBytes host_at_peak{};
  Bytes reserved_peak{};             // caching-allocator model
  Bytes allocator_allocated_peak{};  // the same peak with 512-B rounding
  std::int64_t segments = 0;
  // The allocator's segments at the end of the step, per stream and pool: what the reserved
  // bytes are made of (torch.cuda.memory_snapshot()'s segments, summed the same way).
  struct Pool {
    zero::Stream stream = zero::Stream::compute;
    bool small = false;            // the 2 MiB segments of requests <= 1 MiB
    std::int64_t segments = 0;
    Bytes bytes{}, allocated{};
    std::vector<std::int64_t> sizes;  // every segment's size, largest first
  };
  std::vector<Pool> pools;
  Bytes context{};                   // device constant outside the program
  Bytes device_used{};               // reserved_peak + context
  bool fits = false;
  bool allocator_oom = false;        // the allocator model could not satisfy a request
  int skipped_micro_steps = 0;       // copies of the repeated block the replay proved identical and skipped
  // live device bytes after each event, by logical id (no copy skipped); filled on request
  std::vector<Bytes> timeline;
};

struct MemoryOptions {
  bool allocator = true;             // run the caching-allocator model
  bool timeline = false;
};

MemoryReport replay_memory(const zero::Program& p, const DeviceSpec& dev, const MemoryOptions& opt = {});

// Which buffers are live at the start of event `at` (logical id; after its allocations).
// A copy of the repeated block, and the events after them, hold what the stored events
// they stand for hold (role, size, category): the buffers are given as stored ids.
std::vector<zero::BufferId> live_at(const zero::Program& p, zero::EventId at);

}  // namespace zp::sim
