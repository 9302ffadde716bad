#pragma once
// The step program: for one rank, the ordered events of one optimizer step (all
// micro-steps; those that repeat the one before them are stored once: Repeat), each on a
// named stream with explicit dependencies. Both interpreters consume it unchanged: sim/
// gives each event a cost and replays its allocations; exec/ runs each event with real
// kernels and collectives.
//
// Conventions
//  - Program order is issue order: the order one host thread issues the work, which
//    is also the order PyTorch's caching allocator sees requests. Memory is replayed
//    in this order; time follows streams and dependencies.
//  - An event allocates its `allocs` when it starts and frees its `frees` when it ends.
//  - Dependencies point backwards only (dep < id). Events on one stream run in order.
//  - Buffers in `persistent` exist before the step and outlive it (steady state: the
//    program describes a step after the first two, when Adam states exist and the
//    ZeRO-3 module trace is complete). The prologue events allocate them once.
//  - Collective `elements` is the full logical buffer: all-reduce/reduce/broadcast the
//    reduced buffer, all-gather the gathered output, reduce-scatter the input.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/units.hpp"
#include "models/graph.hpp"

namespace zp::zero {

enum class Category : std::uint8_t {
  params, grads, master_params, optimizer_states, comm_buffers, activations, temporaries
};
constexpr int kNumCategories = 7;
const char* category_name(Category c);

enum class Placement : std::uint8_t { device, host };

// Named streams. `reduction` carries gradient reductions under overlap_comm, `allgather`
// carries ZeRO-3 parameter fetches, `host` carries CPU work (offloaded optimizer) and
// device↔host copies.
enum class Stream : std::uint8_t { compute, reduction, allgather, host };
constexpr int kNumStreams = 4;
const char* stream_name(Stream s);

enum class Phase : std::uint8_t { init, forward, backward, recompute, reduction, step, post_step };
const char* phase_name(Phase p);

enum class EventKind : std::uint8_t {
  compute,      // a forward/backward/recompute op of the model graph
  collective,   // a communication collective over a rank group
  copy,         // memory copy: flatten, cast, copy into a bucket, offload transfers
  optimizer,    // the optimizer update of a partition (device or host)
  marker,       // allocation/free point without work (e.g. zero_grad)
  host,         // framework work on the host thread (HostWork); the device events it issues wait for it
};
constexpr int kNumEventKinds = 5;
const char* event_kind_name(EventKind k);

// What a host event (EventKind::host, on Stream::host) stands for: the host thread's share of
// training, which the GPU's work waits for when the host falls behind. PyTorch's eager
// dispatch and kernel launches and the model's Python for `ops` graph ops (forward or
// recomputation, or backward nodes, by the event's phase), DeepSpeed's Python in
// `grad_hooks` gradient hooks (stages 1/2 and BF16_Optimizer; stage 3's in
// `stage3_grad_hooks`), `bucket_hooks` of which also copy the gradient into an IPG bucket and
// do its bookkeeping (stage 2; stage 1 under overlap_comm at the boundary), and in stage 3's fetch/release hooks of `module_visits` module visits
// (looping over their `stage3_params` parameters) and its own autograd function for `linear_functions` nn.Linear calls, and the optimizer step's loop over `tensors` parameter tensors with its .item()
// synchronisations (`step`: the wrapper that runs it). sim/ prices it with the profile's
// HostCosts; the executor does this work itself and treats the event as a marker.
enum class HostStep : std::uint8_t {
  none,
  fp16_optimizer,   // stage 0 with 16-bit params (runtime/fp16/fused_optimizer.py)
  bf16_optimizer,   // stage 1 + bf16 + fp32 gradient accumulation (runtime/bf16_optimizer.py)
  zero_optimizer,   // stages 1/2 (runtime/zero/stage_1_and_2.py)
  zero3_optimizer,  // stage 3 (runtime/zero/stage3.py)
  plain,            // fp32 without ZeRO: the torch optimizer alone
};
struct HostWork {
  std::int32_t ops = 0;
  std::int32_t grad_hooks = 0;
  std::int32_t stage3_grad_hooks = 0;
  std::int32_t bucket_hooks = 0;   // of grad_hooks: those that add the gradient to an IPG bucket
  std::int32_t module_visits = 0;
  std::int32_t stage3_params = 0;  // the parameters of those visits (their hooks loop over them)
  // Stage 3's nn.Linear calls through DeepSpeed's LinearFunctionForZeroStage3 (F.linear is
  // replaced when the model's params are converted, zero_optimization.memory_efficient_linear):
  // its Python forward and setup_context, or its Python backward (under an autocast context,
  // the products and the bias's sum each dispatched on their own).
  std::int32_t linear_functions = 0;
  HostStep step = HostStep::none;
  std::int32_t tensors = 0;        // parameter tensors the step loops over
  // The step's fixed part (what it does once: its .item() reads, the optimizer's call, the
  // loss scaler) is in this event. A ZeRO step's host work is two events: its loops over the
  // gradients (tensors, no fixed part), whose small kernels the device runs while the host
  // goes on issuing the next ones, then the fixed part, which waits for them and for what it
  // reads back (stages 1/2: the overflow flag, their norm staying on the device; stage 3: the norm).
  // The bare optimizer's (fp32 at stage 0) too: its loop (the update waits for it), then the
  // fixed part, beside the update (nothing read back between them).
  bool step_base = true;
  // The share of the per-tensor cost this event's loop is (1: all of the step's loops; a ZeRO
  // 1/2 step without the overflow check loops for its norm alone: 2 of 15 launches). An
  // iteration without synchronisations between its phases (LowerOptions::phase_syncs off)
  // splits a ZeRO step's loops where the launch queue and the overflow flag's read-back stop
  // the host: the overflow loop in pieces, the norm's loop after the read-back.
  float loop_share = 1;
  bool operator==(const HostWork&) const = default;
};

enum class CollKind : std::uint8_t { all_reduce, reduce, reduce_scatter, all_gather, broadcast, all_to_all };
constexpr int kNumCollKinds = 6;
const char* coll_kind_name(CollKind k);
// Bytes the rank at place `me` of a group of n sends for one collective of `elements` of
// dt (root: reduce/broadcast, a place in the group): the executor's exchanges, which every
// communication backend counts (blocks of elements split n ways, the first elements mod n
// one element longer). 0 for a group of one.
Bytes collective_bytes_sent(CollKind kind, std::int64_t elements, DType dt, std::int64_t n, std::int64_t me, int root);

// Why a collective was issued.
enum class Trigger : std::uint8_t {
  none,
  bucket_full,       // the ipg/reduce bucket could not take the next gradient
  param_too_large,   // a gradient larger than the bucket, reduced on its own
  end_of_backward,   // the reduction epilogue flushes what is left
  gas_boundary,      // stage 0/1: reduction once per optimizer step
  module_fetch,      // ZeRO-3: a module's params were not available when it ran
  prefetch,          // ZeRO-3: fetched ahead from the recorded module trace
  post_step,         // stages 1/2: updated 16-bit partitions gathered after the step
  overflow_check,    // fp16: MAX all-reduce of the overflow flag
  grad_norm,         // SUM all-reduce of the squared gradient norm
};
const char* trigger_name(Trigger t);

// avg: sum over the group, then scaled by 1/|group| (DeepSpeed's gradient averaging).
enum class ReduceOp : std::uint8_t { sum, max, none, avg };

// What a copy event does with data, for the executor (the simulator prices mem_bytes).
// Operands are the event's src/src2/dst buffers and its slices.
enum class CopyOp : std::uint8_t {
  none,
  load_batch,          // the micro-step's inputs into their (freshly allocated) buffers
  grad_to_bucket,      // slice: the param's grad (src) → bucket dst at bucket_offset
  grad_accumulate,     // slice: the param's grad (src) added into dst at bucket_offset (BF16_Optimizer)
  flatten,             // slices: each param's grad, or the bucket src at bucket_offset → dst, packed
  unflatten_grads,     // slices: packed src → each param's grad, or dst at bucket_offset (after the
                       // stage-0 all-reduce)
  to_partition,        // slices: the part of reduced src in this rank's partition → dst += (grads_in_partition)
  accumulate,          // dst += src (same layout)
  partition_grads,     // this rank's partition of src (+ src2) → dst; src (and src2) are zeroed
  master_to_params,    // master partition src → this rank's part of the 16-bit params dst
  gather_unflatten,    // stage 3: gathered src (rank-major shards of the slices) → each param's full buffer
  interleave,          // stage 3: slices of bucket src (or loose grads) → dst, rank-major shards
  shard_accumulate,    // stage 3: this rank's block of the reduce-scattered src → grad partition dst +=
  subgroup_grads,      // stage 3: grad partition src [offset, offset+elements) → dst; src range zeroed
  cast,                // src → dst, dtype conversion, whole buffer
  grads_to_list,       // slices: each param's gradient → the buffer this event allocates for it, in
                       // slice order, converted to its dtype (fused_optimizer's per-param .float())
  flatten_list,        // slices: the buffers this event frees, in slice order → dst, packed
};
const char* copy_op_name(CopyOp c);

// How a device copy runs, and so what it costs: a memcpy (same dtype, nothing combined:
// PyTorch's copy_ between contiguous tensors of one dtype, cudaMemcpyAsync), or an elementwise
// kernel that converts the dtype (cast) or adds into its destination (add, converting where
// the dtypes differ).
enum class CopyKernel : std::uint8_t { memcpy, cast, add };
const char* copy_kernel_name(CopyKernel k);
std::optional<CopyKernel> copy_kernel_from_name(std::string_view name);
// Every kind's name, in enum order (what a reader lists when a name is wrong).
const std::vector<std::string>& copy_kernel_names();

// What a buffer holds, so the executor can bind it to real data.
enum class BufferRole : std::uint8_t {
  flat_params16,      // stage 0-2 flat 16-bit params (all ranks' partitions)
  param_partition16,  // stage 3 16-bit partition of a param (ref = param)
  param_full16,       // stage 3 gathered (or persistent) full param (ref = param)
  hpz_partition16,    // hpZ secondary partition of a param (ref = param)
  master_partition,   // fp32 master weights of this rank (ref = sub-group)
  optimizer_state,    // optimizer states of this rank (ref = sub-group)
  param_grad,         // autograd gradient of a param (ref = param)
  flat_grads32,       // stage 0 fp32 gradient buffer (bf16) / fp32 flat grads at the step
  grads_in_partition, // stages 1/2: gradients of params overlapping this partition
  grad_partition,     // stage 3: flat gradient partition
  ipg_bucket,         // reduce bucket (ref = buffer index 0/1)
  comm_staging,       // flatten/cast/interleave copies around a collective
  gather_flat,        // ZeRO-3 flat all-gather output (ref = module)
  activation,         // a forward tensor (ref = models::TensorId)
  activation_grad,    // gradient of a forward tensor (ref = models::TensorId)
  step_temp,          // flatten/cast temporaries of the optimizer step
  offload_staging,    // device staging for host transfers
  host_master, host_grads32, host_staging16, host_optimizer_state,
  checkpoint_host,    // layer input kept on host (cpu_checkpointing)
  init_copy,          // a tensor of the set-up that is freed before training: the model's params as
                      // transformers built them, their casts, DeepSpeed's flatten and master clones
                      // (ref = param, or -1)
  op_scratch,         // a backward kernel's temporary (ref = models::TensorId, one of the op's bwd_scratch)
  library_workspace,  // cuBLAS / cuBLASLt workspace (ref = 0 forward thread, 1 autograd thread, 2 cuBLASLt)
};

// Whether the program reads a fresh buffer of this role as zeros (torch.zeros: a gradient, a
// bucket, a partition that something adds into) or writes it whole before any read
// (torch.empty: a forward output, a step temporary). An interpreter that hands out real memory
// zero-fills the former only.
bool starts_zeroed(BufferRole role);

using BufferId = std::int32_t;
using EventId = std::int32_t;
using GroupId = std::int32_t;

struct Buffer {
  BufferId id = -1;
  Category category = Category::temporaries;
  Placement placement = Placement::device;
  BufferRole role = BufferRole::step_temp;
  DType dtype = DType::fp16;
  std::int64_t elements = 0;
  Bytes bytes{};
  std::int32_t ref = -1;       // param / tensor / module / bucket index, by role
  std::int32_t name = -1;      // index into Program::labels
  // Persistent, but DeepSpeed creates it during the first step, right before that step's
  // first optimizer event (torch.optim's states, created lazily by its first step()). A
  // steady-state step has it from the start; an interpreter that runs from the prologue
  // allocates it there, so its caching allocator sees the requests in the order a training
  // process's did.
  bool first_step = false;
  bool operator==(const Buffer&) const = default;
};

// A slice of a parameter's gradient inside a bucket (for the executor).
struct BucketSlice {
  models::ParamId param = -1;
  std::int64_t param_offset = 0;   // first element of the param in this slice
  std::int64_t count = 0;
  std::int64_t bucket_offset = 0;  // where it lands in the bucket
  bool operator==(const BucketSlice&) const = default;
};

struct Group {
  std::string name;                // "dp", "hpz", "self"
  std::vector<int> ranks;
  bool operator==(const Group&) const = default;
};

struct Event {
  EventId id = -1;
  EventKind kind = EventKind::marker;
  Stream stream = Stream::compute;
  Phase phase = Phase::init;
  std::int16_t micro_step = -1;    // -1 outside micro-steps (init, step)
  std::int32_t layer = -1;
  std::int32_t label = -1;         // index into Program::labels
  // compute
  models::OpId op = -1;
  Flops flops{};
  Bytes mem_bytes{};               // bytes read + written (compute, copy, optimizer)
  // collective
  CollKind coll = CollKind::all_reduce;
  ReduceOp reduce_op = ReduceOp::none;
  Trigger trigger = Trigger::none;
  GroupId group = -1;
  std::int64_t elements = 0;
  DType dtype = DType::fp16;
  std::int32_t bucket = -1;        // bucket sequence number within the step, or module id for fetches
  // copy
  Placement src = Placement::device, dst = Placement::device;
  // Executor operands (the simulator does not read them): what a copy, collective or
  // optimizer event reads and writes. A collective works in place on dst (all-gather and
  // reduce-scatter: src is this rank's input block; a stage-3 all-gather within the hpZ
  // group names the first param's secondary partition, the others follow its slices). A
  // gather_unflatten copy's `group` is the gather's, whose blocks it reads. `offset` is the
  // first element of the range an optimizer or sub-group copy covers; `root` is a
  // reduce's destination. An optimizer whose src is the flat fp32 gradient buffer of every
  // param (BF16_Optimizer) reads this rank's partition of it, and clears it after; its
  // src2/src3 are the optimizer's state tensors (Adam's exp_avg, exp_avg_sq).
  CopyOp copy_op = CopyOp::none;
  CopyKernel copy_kernel = CopyKernel::memcpy;
  // A marker that calls torch.cuda.empty_cache() when it starts (DeepSpeed does during its
  // set-up): the caching allocator releases every cached segment that is entirely free.
  bool empty_cache = false;
  // Issued right after the host waited for the device (it read the gradient norm or the
  // overflow flag back, DeepSpeed's .item()): the device idles while the host issues the
  // event's pieces one by one, so each piece takes at least the host's cost of issuing it
  // (sim::DeviceProfile::host_launch) however little the device has to do for it.
  bool host_bound = false;
  // An optimizer event whose update first tests this rank's gradients for inf/NaN and is
  // skipped on one (FP16_Optimizer's has_overflow inside step(), fp16 and bf16 alike; stages
  // 1-3 test with the overflow_check all-reduce instead).
  bool checks_overflow = false;
  // A backward marker of a sum whose backward passes its output's gradient on as both its
  // inputs' (lowering::GraphFacts::passes_gradient; op names the sum): from here their
  // gradients are that buffer, and no kernel runs.
  bool passes_gradient = false;
  // A forward (or recomputed) linear op whose bias DeepSpeed adds by a kernel of its own after
  // the product, reading and writing the output: stage 3 runs nn.Linear on a 3-D input through
  // LinearFunctionForZeroStage3 (runtime/zero/linear.py: matmul, then `output += bias`), where
  // PyTorch's own linear fuses the bias into the GEMM. DeepSpeed's work: the simulator prices the
  // add (sim::ComputeModel::unfused_bias_cost) where it prices DeepSpeed's loops; zeroplan's
  // executor keeps the bias in the product.
  bool unfused_bias = false;
  // A backward compute event's input gradients that another consumer of the same tensor made
  // first: PyTorch's autograd accumulates each into it by an add kernel of its own (its input
  // buffer's accumulate: both read, one written), `grad_adds` of them over `grad_add_bytes`
  // (one gradient's bytes each). Priced where the simulator prices DeepSpeed's (PyTorch's) work
  // (sim::ComputeModel::grad_accumulate_cost); zeroplan's executor accumulates in its kernels.
  std::int32_t grad_adds = 0;
  Bytes grad_add_bytes{};
  BufferId src_buf = -1, src2_buf = -1, src3_buf = -1, dst_buf = -1;
  std::int32_t root = -1;
  std::int64_t offset = 0;
  // Tensors the event visits one by one: a scalar all-reduce's local reduction before the
  // all-reduce (the gradient norm, the overflow check; their bytes are mem_bytes), an optimizer
  // event's local reduction (its bytes are reduce_bytes), a copy done per tensor (DeepSpeed's
  // per-param casts, a partition's flatten). 0: not counted (a copy's slices, when it has them,
  // are its pieces).
  std::int32_t tensors = 0;
  // DeepSpeed's own work in the event, beyond what zeroplan's executor does for it (its bytes,
  // pieces and tensors above): the kernels of DeepSpeed's per-tensor Python loops in the step,
  // which visit gradients one by one with several small kernels each (has_inf_or_nan's amax,
  // amin, isfinite, logical_and and logical_not; a cast to fp64 before each norm; a cast and a
  // copy back per parameter), and the bytes those kernels move. The simulator prices them
  // (sim::DeviceProfile::loop_kernel per kernel, the bandwidth for the bytes); the executor does
  // not do them, and calibration from its runs leaves them out. A copy with loop kernels is
  // priced by them instead of by its pieces (where the simulator prices DeepSpeed's loops at
  // all: sim::ComputeModel::deepspeed). 0 for anything else.
  std::int32_t loop_kernels = 0;
  Bytes loop_bytes{};
  // An optimizer event that first reduces the gradients it reads on this rank (stage 0's
  // FP16_Optimizer and BF16_Optimizer take the norm, and fp16's overflow check, inside step()):
  // the bytes that reduction reads, over `tensors` tensors.
  Bytes reduce_bytes{};
  // CSR ranges into Program's lists
  std::uint32_t alloc_begin = 0, alloc_end = 0;
  std::uint32_t free_begin = 0, free_end = 0;
  std::uint32_t dep_begin = 0, dep_end = 0;
  std::uint32_t slice_begin = 0, slice_end = 0;
  // host (EventKind::host)
  HostWork host;
  bool operator==(const Event&) const = default;
};

struct ProgramInfo {
  std::string model;
  int stage = 0;
  int world_size = 1;
  int rank = 0;
  std::int64_t micro_batch = 1;
  std::int64_t seq_len = 0;
  std::int64_t gas = 1;
  DType model_dtype = DType::fp16;
  DType comm_dtype = DType::fp16;
  bool overlap_comm = false;
  bool activation_checkpointing = false;
  std::int64_t params = 0;             // Ψ
  std::int64_t padded_params = 0;      // Ψ' (stages 1/2: padded to 2N)
  std::int64_t partition_elements = 0; // this rank's partition of the flat params
  std::int64_t reduce_bucket_elements = 0;
  int ipg_buffers = 0;                 // ipg buckets that exist (0, 1 or 2)
  bool operator==(const ProgramInfo&) const = default;
};

// Micro-steps represented once (LowerOptions::replicate_micro_steps). The stored events
// [first, first + events) — the block — are one micro-step that stands for itself and
// `copies` more: copy k (1 .. copies) is the block moved by k micro-steps, its events at ids
// moved by k × events, its buffers at ids moved by k × buffers, its micro-step + k, its
// references into itself or into the micro-step stored just before it (events
// [first - events, first), buffers [first_buffer - buffers, first_buffer)) moved by k
// micro-steps, its references to anything before those fixed. The events and buffers stored
// after the block (the last micro-step and the step) stand at ids moved by copies ×
// events (× buffers); their references into the block or the micro-step before it stand
// for the last copy and the one before it. Every buffer the block allocates is freed by the
// end of the micro-step after it; the block frees nothing allocated before the micro-step
// stored before it.
//
// Stored ids are positions in Program::events and Program::buffers (an event's `id`, its
// lists and its operands use them); logical ids number the step as expanded (`expand`),
// and reports, names and traces use logical ids. Without copies the two are the same.
struct Repeat {
  EventId first = -1;          // the block's first stored event
  EventId events = 0;          // events per micro-step
  BufferId first_buffer = -1;  // the block's first stored buffer
  BufferId buffers = 0;        // buffers per micro-step
  int copies = 0;
  bool operator==(const Repeat&) const = default;
};

// A logical event or buffer as stored: the stored id and which copy of it it is (0: the
// stored one itself).
struct StoredRef {
  std::int32_t id = -1;
  int copy = 0;
  bool operator==(const StoredRef&) const = default;
};

struct Program {
  ProgramInfo info;
  std::vector<std::string> labels;
  std::vector<Buffer> buffers;
  std::vector<Event> events;
  std::vector<Group> groups;
  std::vector<BufferId> alloc_list, free_list;
  std::vector<EventId> dep_list;
  std::vector<BucketSlice> slice_list;
  EventId step_begin = 0;              // events before this are the prologue (init)
  Repeat repeat;
  bool operator==(const Program&) const = default;

  std::span<const BufferId> allocs(const Event& e) const {
    return {alloc_list.data() + e.alloc_begin, e.alloc_end - e.alloc_begin};
  }
  std::span<const BufferId> frees(const Event& e) const {
    return {free_list.data() + e.free_begin, e.free_end - e.free_begin};
  }
  std::span<const EventId> deps(const Event& e) const {
    return {dep_list.data() + e.dep_begin, e.dep_end - e.dep_begin};
  }
  std::span<const BucketSlice> slices(const Event& e) const {
    return {slice_list.data() + e.slice_begin, e.slice_end - e.slice_begin};
  }
  // The step as expanded: its number of events and buffers (logical ids run below these).
  std::int64_t num_events() const {
    return static_cast<std::int64_t>(events.size()) + static_cast<std::int64_t>(repeat.copies) * repeat.events;
  }
  std::int64_t num_buffers() const {
    return static_cast<std::int64_t>(buffers.size()) + static_cast<std::int64_t>(repeat.copies) * repeat.buffers;
  }
  // Whether stored event `id` is in the block, and how many logical events it stands for:
  // 1 + copies in the block, 1 elsewhere.
  bool in_block(EventId id) const { return repeat.copies > 0 && id >= repeat.first && id < repeat.first + repeat.events; }
  std::int64_t copies_of(EventId id) const { return in_block(id) ? 1 + repeat.copies : 1; }
  // Logical ↔ stored (see Repeat).
  StoredRef stored_event(EventId logical) const;
  EventId logical_event(EventId stored, int copy = 0) const;
  StoredRef stored_buffer(BufferId logical) const;
  BufferId logical_buffer(BufferId stored, int copy = 0) const;
  // Stable, readable event id shared by predicted and measured traces, by logical id:
  // "ms3/bwd/layer5.mlp.fc", "step/allgather.0", "init/params16".
  std::string event_name(EventId id) const;
  std::string buffer_name(BufferId id) const;  // by logical id
  // Bytes one rank sends for collective event e (ring algorithm volumes).
  Bytes bytes_sent(const Event& e) const;
  // Checks the invariants (deps backwards, every buffer allocated once and freed at most
  // once after its allocation, persistent buffers never freed in the step; the prologue may
  // free the set-up's temporaries) of the stored events, and that the block repeats the
  // micro-step stored before it as Repeat says (so the expanded step keeps them too).
  // Throws std::logic_error describing the first violation.
  void validate() const;
};

// Positions in a program's lists where something begins (a micro-step, the tail).
struct ListMarks {
  std::size_t events = 0, buffers = 0, allocs = 0, frees = 0, deps = 0, slices = 0;
};
// The ends of the lists now (where the next event, buffer, ... goes).
ListMarks list_marks(const Program& p);
// Whether the stored events [b, c) are the events [a, b) moved by one micro-step: the same
// events, buffers, lists and labels, every reference relative (into itself or the one
// before: it moves with the micro-step) or fixed (before both), and every buffer [a, b)
// allocates freed by c.
bool repeats_previous(const Program& p, const ListMarks& a, const ListMarks& b, const ListMarks& c);
// Whether Program::repeat is empty, or describes a block (in range) that repeats the
// micro-step stored before it; validate() checks it.
bool repeat_is_valid(const Program& p);
// The step with every micro-step stored: the copies of the block in place, the events after
// them moved, every reference moved (Program::repeat cleared). For the executor, which runs
// every micro-step, and for tests; ids of the result are the logical ids.
Program expand(const Program& p);
// The bytes of PyTorch's cuBLAS/cuBLASLt workspaces the program holds (its
// BufferRole::library_workspace buffers; none where LowerOptions gave no workspace sizes).
Bytes library_workspace_bytes(const Program& p);

}  // namespace zp::zero
