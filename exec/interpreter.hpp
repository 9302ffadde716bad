#pragma once
// The executor's interpreter: runs a rank's step program with real kernels and real
// collectives. Events run one at a time in program (issue) order, which respects every
// stream's order and every dependency (dependencies point backwards), so results are
// deterministic; each event's buffers are allocated through the tracking allocator
// when it starts and freed when it ends, exactly as the program declares. Nothing here
// decides a buffer, a bucket or a fetch: the data movement of each event follows its
// operands (zero/program.hpp), its op's function (models::Fn) and its slices.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include "exec/allocator.hpp"
#include "exec/checkpoint.hpp"
#include "exec/comm.hpp"
#include "exec/device.hpp"
#include "exec/safetensors.hpp"
#include "exec/stream_order.hpp"
#include "models/graph.hpp"
#include "zero/ds_config.hpp"
#include "zero/lower.hpp"
#include "zero/program.hpp"

namespace zp::exec {

// One micro-step's inputs, one vector per graph input tensor (g.inputs order), int64.
using MicroBatch = std::vector<std::vector<std::int64_t>>;

struct StepResult {
  double loss = 0.0;                 // mean over micro-steps of this rank's loss
  double grad_norm = -1.0;           // global L2 norm before clipping (-1: not computed)
  double loss_scale = 1.0;           // fp16: the dynamic loss scale this step ran with
  bool skipped = false;              // gradients overflowed, the update was skipped (fp16; bf16 where DeepSpeed checks)
  double seconds = 0.0;
};

// Whether the executor can run this program, and if not, why (one line).
std::string unsupported_reason(const models::OpGraph& g, const zero::Program& p, const zero::DsConfig& cfg);

// Runs a step program on one device and one communicator: binds each event's buffers
// (through the tracking allocator), stages 16-bit storage as fp32 views, and hands ops
// and optimizer updates to the device and collectives to the communicator. Every
// micro-step runs: a program whose block repeats (Program::repeat) runs expanded
// (zero::expand), its event and buffer ids the logical ones (`mem` holds
// p.num_buffers() buffers; event_seconds() and the others have p.num_events() entries).
class Interpreter : private Operands {
 public:
  // `device`: nullptr for the CPU device.
  // `device`: nullptr for the CPU device. `mem` allocates device buffers from the same
  // device (TrackingAllocator's `device`).
  Interpreter(const models::OpGraph& g, const zero::Program& p, const zero::DsConfig& cfg, Comm& comm,
              TrackingAllocator& mem, std::uint64_t seed, Device* device = nullptr);
  ~Interpreter() override;
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;
  // Runs the prologue: allocates the persistent buffers and initialises params (the same
  // values for every stage and world size), master weights and optimizer states.
  void prologue();
  // Initial values by param name (train --init-weights), checked by the caller to hold
  // every param at its shape; set before prologue(). Default: the seeded random init.
  void set_initial_weights(const std::map<std::string, NamedTensor>* w) { init_ = w; }
  // The prologue draws no initial values and passes the device no source for them: only for a
  // device that reads none (exec/cuda_memory.hpp's probe, a run whose values nobody reads).
  void skip_initial_values() { skip_values_ = true; }
  // One optimizer step (all micro-steps); `step` counts from 1.
  StepResult step(std::int64_t step, const std::vector<MicroBatch>& data);
  // Allocates the buffers DeepSpeed creates during the first step (zero::Buffer::first_step;
  // zero-filled), which the first step() does right before its first optimizer event; a
  // caller that needs them earlier (loading a checkpoint) calls it first.
  void create_first_step_buffers();
  // The next update's learning rate (the scheduler's) and the optimizer's own step count
  // (1 + the updates applied before it: an fp16 overflow skips the optimizer, so its
  // count, and Adam's bias correction with it, does not advance). Default: the config's lr
  // and the step number.
  // `betas`: Adam's (beta1, beta2) when the scheduler sets them (OneCycle), else the config's.
  void set_update(double lr, std::int64_t optimizer_step, std::optional<std::pair<double, double>> betas = {}) {
    lr_ = lr;
    optimizer_step_ = optimizer_step;
    betas_ = betas;
  }
  // Seconds each event took in the last step (index: event id).
  const std::vector<double>& event_seconds() const { return seconds_; }
  // When each event of the last step started, in seconds from the step's start.
  const std::vector<double>& event_starts() const { return starts_; }
  // Bytes this rank sent in each collective event of the last step, as the communication
  // backend counted them (0 for other events).
  const std::vector<std::int64_t>& event_bytes_sent() const { return sent_; }
  // The full value of param p as training left it (gathered from this rank's view; for
  // checks on one rank or where the rank holds it: stages 0-2 hold every param).
  std::vector<float> param_values(models::ParamId p) const;
  // Sets element i of param p in every copy this rank holds (16-bit params and master
  // weights); stages 0-2 only (for gradient checks).
  void set_param_value(models::ParamId p, std::int64_t i, float v);
  // The state a checkpoint holds: the persistent buffers of the program (16-bit params
  // this rank holds; master weights and optimizer states of its partition), and the
  // fp16 loss scaler. Valid between steps. A blob in the device's memory is read and
  // restored through the device (in chunks: a GPU's state is never copied whole to the host).
  std::vector<CheckpointBlob> checkpoint_blobs(CheckpointPart part) const;
  nlohmann::json scaler_state() const;
  void set_scaler_state(const nlohmann::json& j);
  // The cross-stream waits the steps so far needed (exec/stream_order.hpp); touch waits are
  // uses the program's dependencies leave unordered.
  const StreamOrder::Stats& stream_waits() const { return order_.stats(); }
  // For tests: what each event of the last step used and waited for, in the order it
  // happened (an allocation is a use by its event), and where each device buffer the step
  // allocated was placed.
  struct StreamTrace {
    struct Entry {
      bool wait = false;  // a wait for event `id`, else a use of buffer `id`
      std::int32_t id = -1;
    };
    std::vector<std::vector<Entry>> events;
    std::vector<std::optional<sim::CachingAllocatorModel::Place>> places;  // per buffer
  };
  // `reuse_waits` false leaves out the waits a freed buffer's reuse needs (so that tests can
  // see their check find the races those waits prevent); never for real runs.
  void trace_streams(StreamTrace* t, bool reuse_waits = true) {
    stream_trace_ = t;
    order_.set_reuse_waits(reuse_waits);
  }

 private:
  void run_event(const zero::Event& e);
  void bind(zero::BufferId b);
  void unbind(zero::BufferId b);
  void forward_op(const models::Op& op);
  void backward_op(const models::Op& op);
  void copy_event(const zero::Event& e);
  void collective_event(const zero::Event& e);
  void optimizer_event(const zero::Event& e);
  NormStats partition_norm();
  void run_collective(CollectiveCall c, void* buf, std::size_t bytes);
  // Elements of a live buffer from `off`, as the device stores them.
  Ref ref(zero::BufferId b, std::int64_t off = 0) const;
  // Where param p's full values are now: (buffer, element offset).
  std::pair<zero::BufferId, std::int64_t> param_at(models::ParamId p) const;
  zero::BufferId param_grad_buf(models::ParamId p) const;

  // A float view of a buffer for fp32 arithmetic: the buffer itself when it is fp32 (or
  // not floating point: ids, masks), else an fp32 copy that flush() rounds back into the
  // 16-bit buffer (round to nearest even). Values read and not changed round-trip exactly.
  float* f32(zero::BufferId b) const;
  // The same for elements [offset, offset + count) only (a 5e8-element bucket sized for
  // the GPU is converted where it is used). The pointer addresses element `offset`; it
  // stays valid until the next f32 call on the same buffer.
  float* f32_range(zero::BufferId b, std::int64_t offset, std::int64_t count) const;
  void flush() const;
  void update_loss_scale();
  // Operands of the op being run (exec/device.hpp).
  const models::OpGraph& graph() const override { return g_; }
  float* act(models::TensorId t) const override;        // a forward tensor's data
  float* grad(models::TensorId t) const override;       // its gradient, or nullptr
  const std::int64_t* ids(models::TensorId t) const override;
  float* param(models::ParamId p) const override;       // the param's full values
  float* param_grad(models::ParamId p) const override;  // its gradient (must be live)
  Ref act_ref(models::TensorId t) const override;
  Ref grad_ref(models::TensorId t) const override;
  Ref grad_peek(models::TensorId t) const override;
  Ref param_ref(models::ParamId p) const override;
  Ref param_grad_ref(models::ParamId p) const override;
  bool accumulates(models::TensorId t) override;
  bool accumulates(models::TensorId t, ColumnBlock cols) override;
  float* scratch(std::size_t slot, std::int64_t n) override;
  std::uint64_t dropout_seed() const override;
  float loss_grad() const override;
  std::int64_t numel(models::TensorId t) const;

  std::unique_ptr<Device> own_device_;  // the CPU device when none is given
  Device& dev_;
  bool host_ = true;             // the device's memory is the host's (fp32 views may be staged)
  BlobMemory device_memory_;     // checkpoint blobs in the device's memory, through the device
  void* loss_slots_ = nullptr;
  bool skip_values_ = false;
  const std::map<std::string, NamedTensor>* init_ = nullptr;   // each micro-step's loss (fp32, on the device) until the step ends

  const models::OpGraph& g_;
  std::optional<zero::Program> expanded_;  // the program with every micro-step stored, when it repeats one
  const zero::Program& p_;                 // what runs: every micro-step, ids logical
  const zero::DsConfig& cfg_;
  Comm& comm_;
  TrackingAllocator& mem_;
  std::uint64_t seed_;
  int stage_ = 0, N_ = 1, rank_ = 0;
  bool bf16_opt_ = false;  // DeepSpeed runs BF16_Optimizer for this config (zero::runs_bf16_optimizer)
  zero::FlatLayout layout_;
  std::vector<std::int64_t> part_off_;     // stage 3: param → offset in the partition
  std::vector<std::int64_t> gip_off_;      // stages 1/2: param → offset in grads_in_partition (-1: none)
  std::vector<std::int64_t> persist_off_;  // stage 3: param → offset in the persistent buffer (-1: none)
  zero::BufferId persist_buf_ = -1, params_buf_ = -1;
  // live bindings
  std::vector<zero::BufferId> tensor_buf_, tgrad_buf_, pgrad_buf_, full_buf_;
  std::vector<zero::BufferId> hpz_buf_;  // stage 3 hpZ: param → its secondary partition
  std::vector<std::pair<zero::BufferId, int>> first_step_;  // not yet allocated (buffer, stream)
  std::vector<std::vector<float>> scratch_;
  std::int64_t step_ = 0;
  std::optional<double> lr_;                  // set_update
  std::optional<std::pair<double, double>> betas_;
  std::optional<std::int64_t> optimizer_step_;
  int micro_ = 0;
  const MicroBatch* batch_ = nullptr;
  double loss_sum_ = 0.0;
  double grad_norm_ = -1.0;
  std::vector<std::int64_t> sent_;
  std::vector<double> seconds_, starts_;
  struct Staged {
    std::int64_t lo = 0;             // first element held
    std::vector<float> v;
  };
  mutable std::map<zero::BufferId, Staged> staged_;
  void flush_one(zero::BufferId b, const Staged& st) const;
  // A gradient of a forward tensor starts unwritten (its memory as the cache hands it over,
  // or NaN under poisoning): the op that writes it first writes it whole where
  // backward_assigns says its kernels can, and it is zero-filled before any other first use.
  // A gradient whose column blocks are written by several ops (GPT-2's d(qkv): the attention
  // writes q's columns, the KV cache's copies k's and v's) is kBlocks until all its columns
  // are written; backward_assigns_columns names those blocks.
  enum : std::uint8_t { kWritten = 0, kFresh = 1, kMayAssign = 2, kAssigned = 3, kBlocks = 4 };
  mutable std::vector<std::uint8_t> fresh_;  // per buffer
  struct Blocks {
    std::int64_t width = 0;                             // the tensor's last dimension
    std::vector<std::pair<std::int64_t, std::int64_t>>  // columns [first, last) written (or zeroed)
        done;
    std::vector<ColumnBlock> may;                       // the running op may write these whole
    bool claimed = false;                               // the running op promised some of them
  };
  mutable std::map<zero::BufferId, Blocks> blocks_;
  // Gradient buffers that a sum passed on as its inputs' (Event::passes_gradient): those tensors.
  std::map<zero::BufferId, std::vector<models::TensorId>> grad_aliases_;
  // Zero-fills the columns in [lo, hi) of b's rows not yet written, and counts them written.
  void zero_unwritten(zero::BufferId b, Blocks& bl, std::int64_t lo, std::int64_t hi) const;
  // Buffers the program does not read as zeros are filled with NaN as they are allocated,
  // under ZEROPLAN_POISON_FRESH=1 (the test suite sets it).
  bool poison_ = false;
  void allocated(zero::BufferId b);
  void zero_if_fresh(zero::BufferId b) const;
  // The current event uses buffer b: waits for its uses on other streams (StreamOrder).
  void use(zero::BufferId b) const;
  void waits_to_device(std::span<const zero::EventId> waits) const;
  // Around an allocation from the pool of `pool_stream`: the waits reusing its memory needs
  // (before: the allocation may zero-fill it), and the trace's record of where it went.
  void before_allocation(zero::BufferId b, int pool_stream);
  void after_allocation(zero::BufferId b);
  mutable StreamOrder order_;
  StreamTrace* stream_trace_ = nullptr;
  zero::EventId running_ = -1;  // the event being run (-1: none)
  // fp16 dynamic loss scaling (DeepSpeed's DynamicLossScaler)
  bool fp16_ = false;
  double loss_scale_ = 1.0;
  bool overflow_ = false;
  std::int64_t hysteresis_ = 1, last_overflow_ = 0;
};

}  // namespace zp::exec
