#pragma once
// What every part of the lowering shares: its inputs, the facts of the configuration it
// reads everywhere, the program being built (through the Builder), the persistent model
// states the executor's operands name, and where the issue order stands (the events that
// later events wait for).
//
// The parts (one file each, named after the DeepSpeed source they follow):
//   walk             the forward/backward walk of a micro-step, activation checkpointing
//                    (torch autograd, torch.utils.checkpoint)
//   optimizer        the hooks the walk calls into the optimizer wrapper DeepSpeed chose
//                    (engine.py _configure_optimizer), one implementation per wrapper:
//     fused_optimizer       stage 0: FP16_Optimizer (runtime/fp16/fused_optimizer.py)
//     bf16_optimizer        stage 1 + bf16 + fp32 accumulation (runtime/bf16_optimizer.py)
//     stage_1_and_2         DeepSpeedZeroOptimizer: ipg buckets (runtime/zero/stage_1_and_2.py)
//     stage3                DeepSpeedZeroOptimizer_Stage3: gradients and sub-group step
//                           (runtime/zero/stage3.py)
//   partitioned_param_coordinator  stage 3 fetch, prefetch and release
//   engine_allreduce  engine.py allreduce_gradients (stage 0 and BF16_Optimizer)
//   optimizer_step   the pieces every step shares: norm/overflow all-reduces, the update,
//                    the 16-bit copy back, the post-step all-gather
//   offload          offload_optimizer / offload_param: host buffers, host step, host copies
//   (zero/lower.cpp drives them; micro-steps that repeat are stored once: zero/repeat.cpp)
//
// Host-side work (ARCHITECTURE.md §4): the host thread's dispatch of the model's ops and
// DeepSpeed's Python — gradient hooks, stage 3's per-submodule hooks, the step's per-tensor
// loops and .item() syncs — are host events on Stream::host (zero/program.hpp HostWork);
// the device events they issue wait for them (Context::dispatch and the host_* calls).
// Places where host work is not yet separated out are marked "host work:".
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/graph.hpp"
#include "zero/ds_config.hpp"
#include "zero/lower.hpp"
#include "zero/lower/builder.hpp"
#include "zero/lower/graph_facts.hpp"
#include "zero/program.hpp"

namespace zp::zero::lowering {

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
inline std::int64_t ceil_div(std::int64_t x, std::int64_t m) { return (x + m - 1) / m; }

// The persistent buffers that events name as operands (the executor binds them).
struct ModelStates {
  BufferId params = -1;      // 16-bit params: flat (stages 0-2) or the partitions (stage 3)
  BufferId master = -1;      // fp32 master weights (this rank's partition, or all of them)
  BufferId states = -1;      // optimizer states of the master: the first (Adam's exp_avg)
  BufferId states2 = -1;     // the second, if the optimizer keeps two (Adam's exp_avg_sq)
  BufferId grads32 = -1;     // BF16_Optimizer: the flat fp32 gradients of every param
  BufferId host_grads = -1;  // offload_optimizer: the host fp32 gradient partition
};

// DeepSpeed 0.19.8's DeepSpeedZeroOptimizer launches, per gradient, 13 kernels for its overflow
// test (has_inf_or_nan and the add into the count) and 2 for its norm (a cast to fp64, the norm),
// as its kernel profiles on an H100 count them (optimizer_step.cpp prices them on the device).
inline constexpr int kOverflowKernelsPerGradient = 13, kNormKernelsPerGradient = 2;

// Where the issue order stands: the micro-step being lowered and the latest events of
// each kind that later events wait for.
struct IssueCursor {
  int micro = 0;                  // micro-step being lowered
  bool boundary = false;          // it is the last one (GAS boundary)
  EventId last_compute = -1;      // the latest compute event issued
  EventId last_grad_event = -1;   // the backward op that produced the gradient being hooked
  EventId last_copy = -1;         // the latest copy into a reduce bucket
  EventId last_reduce = -1;       // the latest event of a gradient reduction (the step waits for it)
  EventId last_check = -1;        // the step's latest gradient check (norm, overflow): the update reads it
  EventId overflow_check = -1;    // the step's overflow check, whose flag the host reads back
  EventId last_update = -1;       // the latest copy of updated master weights into the 16-bit params
  std::map<GroupId, EventId> last_collective;  // per rank group (communicator): its latest collective
  int bucket_seq = 0;             // reduce buckets flushed in this micro-step
  EventId host = -1;              // the host event issuing the current ops (-1: none yet)
  int host_micro = -2;            // its micro-step and phase, and the ops it issued so far
  Phase host_phase = Phase::init;
  int host_ops = 0;
  EventId step_loop = -1;         // a step's host loops (ZeRO's, the bare optimizer's), until host_step_rest()
  float loop_after_check = 0;     // the share of those loops still to run after the overflow flag's read-back
  // The launches issued so far, in issue order: each graph op's compute event, and the device
  // events a hook issues beside them (Context::launched); where the current and the previous
  // micro-step's begin among them (the launch queue's bound).
  std::vector<EventId> issued;
  int issued_micro = -2;
  std::size_t micro_first = 0, prev_micro_first = 0;
  bool has_prev_micro = false;
};

// Labels formatted once per op, tensor or param.
class Names {
 public:
  Names(const models::OpGraph& g, Builder& b) : g_(g), b_(b) {}
  std::int32_t op(models::OpId o);               // the op's name
  std::int32_t tensor(models::TensorId t);       // the tensor's name
  std::int32_t tensor_grad(models::TensorId t);  // "grad:" + the tensor's name
  std::int32_t param_grad(models::ParamId p);    // "grad:" + the param's name

 private:
  const models::OpGraph& g_;
  Builder& b_;
  std::vector<std::int32_t> op_, tensor_, tensor_grad_, param_grad_;
};

class Context {
 public:
  Context(const models::OpGraph& graph, const DsConfig& config, const Batch& b, const LowerOptions& options,
          Program& program);
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // inputs and the program being built
  const models::OpGraph& g;
  const DsConfig& cfg;
  const Batch& batch;
  const LowerOptions& opt;
  Program& p;
  Builder b;
  Names names;
  const GraphFacts f;
  const FlatLayout layout;

  // the configuration, as the lowering reads it
  int N = 1;                       // data-parallel world size
  int stage = 0;
  DType md = DType::fp16;          // model (16-bit params, activations) dtype
  DType cd = DType::fp16;          // communication dtype
  bool overlap = false;            // overlap_comm
  bool offload_opt = false;        // offload_optimizer (stages 1-3)
  bool offload_param = false;      // offload_param (stage 3)
  bool ckpt = false;               // per-layer activation checkpointing
  bool bf16_opt = false;           // engine.py runs BF16_Optimizer
  std::int64_t rbs = 0;            // reduce_bucket_size (elements)
  std::int64_t hpz = 1;            // zero_hpz_partition_size (stage 3), else 1
  GroupId dp_group = 0, hpz_group = -1;

  ModelStates states;
  IssueCursor at;

  int gas() const { return static_cast<int>(batch.gas); }

 private:
  // The current host event of phase `ph` and this micro-step, opened when there is none or
  // when `full` (it issued kHostGroupOps ops already).
  HostWork& host_event(Phase ph, bool full);
  // An unsynchronised iteration's ZeRO step loops (LowerOptions::phase_syncs off).
  void queued_step_loops(std::int32_t tensors, bool overflow);
  // One host event of those loops: `tensors` gradients at `share` of the per-tensor cost; it
  // becomes the step's current host event.
  Event& step_loop_event(std::int32_t tensors, float share);
  std::int32_t loop_tensors_ = 0;   // the tensors an unsynchronised step's loops go over

 public:
  std::int64_t b16() const { return dtype_size(md); }
  Stream red_stream() const { return overlap ? Stream::reduction : Stream::compute; }
  DType accum_dtype() const { return cfg.grad_accum(); }
  std::int64_t numel(models::ParamId prm) const { return g.params[static_cast<std::size_t>(prm)].numel; }
  const std::string& pname(models::ParamId prm) const { return g.params[static_cast<std::size_t>(prm)].name; }

  // The program's info and rank groups ("dp", and "hpz" under hpZ).
  void describe_program();
  void add_groups();
  // PyTorch's library workspaces (LowerOptions::cublas_workspace, cublaslt_workspace): one
  // prologue buffer each, on the compute stream.
  void library_workspaces();
  // The set-up before the optimizer wrapper: transformers builds every param as a tensor of
  // its own in the dtype it builds in (config.json torch_dtype, else fp32; DsConfig's
  // module_dtype), and with fp16 or bf16 enabled the engine casts each to that dtype (a new
  // tensor, the old one freed: _cast_module_mixed_precision). Returns the module's param
  // tensors in registration order; the wrapper frees them once it has flattened them.
  std::vector<BufferId> build_model();
  // A prologue marker allocating (then freeing, unless `keep`) one set-up temporary.
  BufferId init_temp(Category c, DType t, std::int64_t elements, std::string name, bool keep = true);
  // A prologue marker freeing set-up temporaries.
  void free_init(const std::vector<BufferId>& bufs, std::string name);
  // A prologue marker calling torch.cuda.empty_cache().
  void empty_cache(std::string name);
  // A prologue marker allocating one persistent buffer.
  BufferId persistent(Category c, Placement where, BufferRole role, DType t, std::int64_t elements, std::string name,
                      std::int32_t ref = -1);
  // The optimizer states of `elements` master params (state_bytes_per_param each in fp32;
  // none for plain SGD), on the host under offload_optimizer; `t`: the states' dtype when
  // the optimizer steps the module's own params (torch.zeros_like(p)). One buffer per state
  // tensor the optimizer keeps (Adam: exp_avg and exp_avg_sq, each the size of the params it
  // steps), as the caching allocator sees them requested.
  void optimizer_states(std::int64_t elements, const std::string& name, std::int32_t ref, DType t = DType::fp32,
                        bool first_step = false);
  // Host work (LowerOptions::host_work; nothing when it is off). The host event that issues
  // the ops of the walk takes up to kHostGroupOps consecutive ops of one phase and micro-step,
  // so that a device op can start at most kHostGroupOps - 1 ops' host time before the host
  // would have issued it on its own, for a fraction of the events.
  static constexpr int kHostGroupOps = 4;
  // The host runs ahead of the device until CUDA's queue of pending launches is full (about
  // a thousand kernels): a host event waits for the launch kLaunchQueueOps launches before it
  // to end, and from micro-step 1 on for the previous micro-step's first op at the latest,
  // so that the host's lead is bounded where micro-steps issue fewer ops than the queue
  // holds (the run then repeats from copy to copy, and the engine can tell).
  static constexpr std::size_t kLaunchQueueOps = 1024;
  // Before the device event of one graph op of phase `ph`: count it on the current host
  // event (opening one when needed); the next event begun waits for it.
  void dispatch(Phase ph);
  // A device event the host issues beside the graph's ops (a gradient hook's copy into a
  // bucket or an accumulation buffer, a bucket's reduction): `launches` more launches in the
  // queue, which the host's lead and the step's loops are bounded by.
  void launched(EventId e, std::int32_t launches = 1);
  // The device events begun since event `first` (a bucket's flush from a hook: its copies and
  // collectives), each as many launches as launches_of() says.
  void launched_since(std::size_t first);
  // DeepSpeed's Python in one gradient hook / one stage-3 module visit (fetch and release
  // hooks, looping over the module's `params` parameters), on the current host event of phase `ph`.
  // A gradient hook; stage 3's count apart (HostWork::stage3_grad_hooks), and a stage 1/2 hook
  // that adds the gradient to an IPG bucket counts once more (HostWork::bucket_hooks).
  void host_hook(Phase ph, bool to_bucket = false);
  void host_module_visit(Phase ph, std::int32_t params);
  // One more eager op dispatched for the device event `e` of phase `ph` (an op the graph keeps
  // inside another, as stage 3's unfused bias add): its host work and its launch.
  void host_extra_op(Phase ph, EventId e);
  // Stage 3's LinearFunctionForZeroStage3 for one nn.Linear op, in phase `ph` (HostWork::linear_functions).
  void host_linear_function(Phase ph);
  // The optimizer step's host loop over `tensors` parameter tensors, which waits for
  // everything issued so far; the next event begun waits for it, but for FP16_Optimizer's,
  // whose overflow loop's kernels the device runs while the host issues them (each read back
  // before the next, the device keeping up): its first device event runs beside it and
  // FusedOptimizerLowering::step makes the one after wait for it. For the
  // ZeRO optimizers (stages 1-3 on the device) only their loops over the gradients, which read
  // nothing back per tensor: the checks they issue (gradient_checks) run on the device
  // meanwhile, and host_step_rest() then adds the step's fixed part, which waits for what it
  // reads back (stages 1/2: the overflow flag, none without the check; stage 3: the norm too).
  // (Stage 1/2 read the overflow flag back between their two loops; one host event for both
  // loops lets the norm's kernels start before the host would have issued them, which matters
  // only where the device, not the host, bounds the step. Without the phases'
  // synchronisations the two are apart: queued_step_loops.) The bare optimizer (fp32 at stage
  // 0) likewise: this event is its per-tensor loop, which its update waits for, and
  // host_step_rest() its fixed part, beside the update (nothing is read back between them).
  void host_step(HostStep kind, std::int32_t tensors);
  // After the overflow check `check` (a device event): the rest of the ZeRO step's loops (the
  // norm's), which an unsynchronised iteration runs after the flag's read-back; none otherwise.
  void host_step_after_check(EventId check);
  // The step tests the gradients for inf/NaN (DeepSpeed's overflow check).
  bool checks_overflow() const;
  void host_step_rest();

  // One collective event (nccl-tests style: kind, group, count, dtype) and why it was issued.
  Event& collective(Stream s, Phase ph, int micro, std::int32_t label, CollKind kind, ReduceOp op, Trigger why,
                    GroupId group, std::int64_t elements, DType t, std::int32_t bucket);
};

}  // namespace zp::zero::lowering
