#include "zero/program.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace zp::zero {

const char* category_name(Category c) {
  switch (c) {
    case Category::params: return "params";
    case Category::grads: return "grads";
    case Category::master_params: return "master_params";
    case Category::optimizer_states: return "optimizer_states";
    case Category::comm_buffers: return "comm_buffers";
    case Category::activations: return "activations";
    case Category::temporaries: return "temporaries";
  }
  return "?";
}

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::compute: return "compute";
    case Stream::reduction: return "reduction";
    case Stream::allgather: return "allgather";
    case Stream::host: return "host";
  }
  return "?";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::init: return "init";
    case Phase::forward: return "fwd";
    case Phase::backward: return "bwd";
    case Phase::recompute: return "recompute";
    case Phase::reduction: return "reduce";
    case Phase::step: return "step";
    case Phase::post_step: return "post_step";
  }
  return "?";
}

const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::compute: return "compute";
    case EventKind::collective: return "collective";
    case EventKind::copy: return "copy";
    case EventKind::optimizer: return "optimizer";
    case EventKind::marker: return "marker";
    case EventKind::host: return "host";
  }
  return "?";
}

const char* coll_kind_name(CollKind k) {
  switch (k) {
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::reduce: return "reduce";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::all_gather: return "all_gather";
    case CollKind::broadcast: return "broadcast";
    case CollKind::all_to_all: return "all_to_all";
  }
  return "?";
}

const char* trigger_name(Trigger t) {
  switch (t) {
    case Trigger::none: return "none";
    case Trigger::bucket_full: return "bucket_full";
    case Trigger::param_too_large: return "param_too_large";
    case Trigger::end_of_backward: return "end_of_backward";
    case Trigger::gas_boundary: return "gas_boundary";
    case Trigger::module_fetch: return "module_fetch";
    case Trigger::prefetch: return "prefetch";
    case Trigger::post_step: return "post_step";
    case Trigger::overflow_check: return "overflow_check";
    case Trigger::grad_norm: return "grad_norm";
  }
  return "?";
}

std::string Program::event_name(EventId id) const {
  const StoredRef at = stored_event(id);
  if (at.id < 0 || static_cast<std::size_t>(at.id) >= events.size())
    throw std::out_of_range(fmt::format("event {} is not in the program", id));
  const Event& e = events[static_cast<std::size_t>(at.id)];
  const std::string& label = e.label >= 0 ? labels[static_cast<std::size_t>(e.label)] : std::string("?");
  if (e.micro_step >= 0) return fmt::format("ms{}/{}/{}", e.micro_step + at.copy, phase_name(e.phase), label);
  return fmt::format("{}/{}", phase_name(e.phase), label);
}

std::string Program::buffer_name(BufferId id) const {
  const StoredRef at = stored_buffer(id);
  const Buffer& b = buffers.at(static_cast<std::size_t>(at.id));
  return b.name >= 0 ? labels[static_cast<std::size_t>(b.name)] : fmt::format("buffer{}", id);
}

Bytes collective_bytes_sent(CollKind kind, std::int64_t elements, DType dt, std::int64_t n, std::int64_t me, int root) {
  if (n <= 1) return Bytes{0};
  // This rank's block of the buffer.
  const std::int64_t mine = elements / n + (me < elements % n ? 1 : 0);
  const std::int64_t sz = dtype_size(dt);
  switch (kind) {
    // Reduce-scatter then all-gather: every other rank's block once, then this rank's
    // reduced block to each of the n - 1 others (2·S·(n-1)/n when n divides S).
    case CollKind::all_reduce: return Bytes{(elements - mine + (n - 1) * mine) * sz};
    case CollKind::reduce_scatter:
    case CollKind::all_to_all: return Bytes{(elements - mine) * sz};
    case CollKind::all_gather: return Bytes{(n - 1) * mine * sz};
    // Every rank but the root sends its whole buffer once.
    case CollKind::reduce: return Bytes{me == root ? 0 : elements * sz};
    // A chain from the root: every rank but the last forwards the buffer.
    case CollKind::broadcast: {
      const std::int64_t r = root < 0 ? 0 : root;
      return Bytes{me == (r + n - 1) % n ? 0 : elements * sz};
    }
  }
  return Bytes{0};
}

Bytes Program::bytes_sent(const Event& e) const {
  if (e.kind != EventKind::collective) return Bytes{0};
  const auto& ranks = groups.at(static_cast<std::size_t>(e.group)).ranks;
  const auto n = static_cast<std::int64_t>(ranks.size());
  std::int64_t me = 0;
  for (std::int64_t i = 0; i < n; ++i)
    if (ranks[static_cast<std::size_t>(i)] == info.rank) me = i;
  return collective_bytes_sent(e.coll, e.elements, e.dtype, n, me, e.root);
}

const char* copy_op_name(CopyOp c) {
  switch (c) {
    case CopyOp::none: return "none";
    case CopyOp::load_batch: return "load_batch";
    case CopyOp::grad_to_bucket: return "grad_to_bucket";
    case CopyOp::grad_accumulate: return "grad_accumulate";
    case CopyOp::flatten: return "flatten";
    case CopyOp::unflatten_grads: return "unflatten_grads";
    case CopyOp::to_partition: return "to_partition";
    case CopyOp::accumulate: return "accumulate";
    case CopyOp::partition_grads: return "partition_grads";
    case CopyOp::master_to_params: return "master_to_params";
    case CopyOp::gather_unflatten: return "gather_unflatten";
    case CopyOp::interleave: return "interleave";
    case CopyOp::shard_accumulate: return "shard_accumulate";
    case CopyOp::subgroup_grads: return "subgroup_grads";
    case CopyOp::cast: return "cast";
    case CopyOp::grads_to_list: return "grads_to_list";
    case CopyOp::flatten_list: return "flatten_list";
  }
  return "?";
}

bool starts_zeroed(BufferRole role) {
  // Forward kernels write their whole output; the step's flatten and cast temporaries are
  // written whole before they are read (the per-param fp32 copies, by grads_to_fp32; the flat
  // partition's padding, by partition_grads).
  return role != BufferRole::activation && role != BufferRole::step_temp;
}

const char* copy_kernel_name(CopyKernel k) {
  switch (k) {
    case CopyKernel::memcpy: return "memcpy";
    case CopyKernel::cast: return "cast";
    case CopyKernel::add: return "add";
  }
  return "?";
}

namespace {
constexpr CopyKernel kCopyKernels[] = {CopyKernel::memcpy, CopyKernel::cast, CopyKernel::add};
}

std::optional<CopyKernel> copy_kernel_from_name(std::string_view name) {
  for (const auto k : kCopyKernels)
    if (name == copy_kernel_name(k)) return k;
  return std::nullopt;
}

const std::vector<std::string>& copy_kernel_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto k : kCopyKernels) v.emplace_back(copy_kernel_name(k));
    return v;
  }();
  return names;
}

void Program::validate() const {
  // Names by stored id (event_name and buffer_name take logical ids).
  auto ename = [&](EventId id) { return event_name(logical_event(id)); };
  auto bname = [&](BufferId id) { return buffer_name(logical_buffer(id)); };
  std::vector<EventId> allocated_at(buffers.size(), -1), freed_at(buffers.size(), -1);
  for (const Event& e : events) {
    if (e.id != static_cast<EventId>(&e - events.data()))
      throw std::logic_error(fmt::format("event {} has id {}", &e - events.data(), e.id));
    for (EventId d : deps(e))
      if (d < 0 || d >= e.id)
        throw std::logic_error(fmt::format("{}: dependency {} does not point backwards", ename(e.id), d));
    for (BufferId b : allocs(e)) {
      if (allocated_at[static_cast<std::size_t>(b)] >= 0)
        throw std::logic_error(fmt::format("{}: buffer {} allocated twice", ename(e.id), bname(b)));
      allocated_at[static_cast<std::size_t>(b)] = e.id;
    }
    for (BufferId b : frees(e)) {
      if (allocated_at[static_cast<std::size_t>(b)] < 0)
        throw std::logic_error(fmt::format("{}: buffer {} freed before allocation", ename(e.id), bname(b)));
      if (freed_at[static_cast<std::size_t>(b)] >= 0)
        throw std::logic_error(fmt::format("{}: buffer {} freed twice", ename(e.id), bname(b)));
      if (allocated_at[static_cast<std::size_t>(b)] < step_begin && e.id >= step_begin)
        throw std::logic_error(fmt::format("{}: persistent buffer {} freed in the step", ename(e.id), bname(b)));
      freed_at[static_cast<std::size_t>(b)] = e.id;
    }
  }
  for (std::size_t b = 0; b < buffers.size(); ++b) {
    if (allocated_at[b] < 0)
      throw std::logic_error(fmt::format("buffer {} is never allocated", bname(static_cast<BufferId>(b))));
    if (allocated_at[b] >= step_begin && freed_at[b] < 0)
      throw std::logic_error(fmt::format("buffer {} allocated in the step is never freed", bname(static_cast<BufferId>(b))));
  }
  if (!repeat_is_valid(*this))
    throw std::logic_error(fmt::format("repeat (block at event {}, {} events, {} copies) is not the micro-step before it "
                                       "moved by one", repeat.first, repeat.events, repeat.copies));
}

Bytes library_workspace_bytes(const Program& p) {
  Bytes total{0};
  for (const Buffer& b : p.buffers)
    if (b.role == BufferRole::library_workspace) total.v += b.bytes.v;
  return total;
}

}  // namespace zp::zero
