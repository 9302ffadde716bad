#pragma once
// The device backend: what the interpreter asks a device to compute. The interpreter
// decides nothing here: it binds each op's operands (activations, gradients, params, the
// token ids and scratch) to this device's memory through Operands, then asks for the op's
// forward or backward, for an optimizer update on a flat partition, or for one of the
// data movements its copy and optimizer events are made of (copy, add, fill, norms), on
// buffers in their storage dtype. The CPU device runs kernels/cpu on host memory (its ops
// read fp32 views the interpreter stages); the CUDA device runs kernels/cuda on device
// memory, each tensor in the dtype the program gives it.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "models/graph.hpp"

namespace zp::exec {

// Elements [off, off + n) of a buffer: its memory (this device's), its storage dtype.
struct Ref {
  void* base = nullptr;
  DType dt = DType::fp32;
  std::int64_t off = 0;
  Ref at(std::int64_t k) const { return {base, dt, off + k}; }
  // The address of element `off`; nullptr where the Ref is unbound.
  void* address() const { return base ? static_cast<char*>(base) + off * dtype_size(dt) : nullptr; }
  explicit operator bool() const { return base != nullptr; }
};

// Columns [first, first + count) of every row of a tensor whose last dimension is `width`
// wide: the part of a gradient some backward kernels write (GPT-2's q, k and v are column
// blocks of one (B, T, 3C) tensor).
struct ColumnBlock {
  std::int64_t first = 0, count = 0, width = 0;
  bool operator==(const ColumnBlock&) const = default;
};

// One op's operands, bound by the interpreter (nullptr: the tensor is not bound, e.g. a
// gradient nobody needs). Valid for the duration of one forward/backward call.
class Operands {
 public:
  virtual ~Operands() = default;
  virtual const models::OpGraph& graph() const = 0;
  // fp32 views (the CPU device's): 16-bit storage is staged as fp32 and rounded back
  // after the op. Only for a device whose memory the host addresses.
  virtual float* act(models::TensorId t) const = 0;
  virtual float* grad(models::TensorId t) const = 0;
  virtual const std::int64_t* ids(models::TensorId t) const = 0;
  virtual float* param(models::ParamId p) const = 0;
  virtual float* param_grad(models::ParamId p) const = 0;
  // The same tensors as they are stored (any device): id tensors are int64.
  virtual Ref act_ref(models::TensorId t) const = 0;
  virtual Ref grad_ref(models::TensorId t) const = 0;  // base nullptr: not bound
  // The same Ref without using the gradient (no zero-fill of a fresh one, no stream order):
  // for sizing a call's temporaries before its accumulates() questions are asked.
  virtual Ref grad_peek(models::TensorId t) const { return grad_ref(t); }
  virtual Ref param_ref(models::ParamId p) const = 0;
  virtual Ref param_grad_ref(models::ParamId p) const = 0;
  // Whether the backward must add into the gradient of input tensor t (true), or may
  // write it whole (false: nothing is in it yet, and the memory holds no zeros). Ask it
  // before the first grad()/grad_ref() of t in the call: a fresh gradient asked for first
  // is zero-filled then, and this returns true. Answering false is a promise that the
  // call writes every element of t's gradient (the interpreter asks it only of the inputs
  // backward_assigns names). Under ZEROPLAN_POISON_FRESH=1, which every test runs with, the
  // memory holds NaN there, so a broken promise shows in the tests.
  virtual bool accumulates(models::TensorId t) = 0;
  // The same for columns `cols` of t's gradient: false is a promise to write every element
  // of those columns, and to touch no other column of it in this call (the interpreter asks
  // it of the blocks backward_assigns_columns names; their union may be all of t, written by
  // several ops). Ask it before the first grad()/grad_ref() of t in the call; for a block it
  // returns true, its unwritten elements are zero-filled then. A block that is all of t is
  // accumulates(t).
  virtual bool accumulates(models::TensorId t, ColumnBlock cols) = 0;
  // Per-call host working memory, `slot` 0..3, at least `n` floats (the CPU device's).
  virtual float* scratch(std::size_t slot, std::int64_t n) = 0;
  // The dropout stream of this micro-step (masks are a function of it and the op id).
  virtual std::uint64_t dropout_seed() const = 0;
  // d(loss)/d(loss) as backward starts: the loss scale over the GAS.
  virtual float loss_grad() const = 0;
};

// Whether a device's backward of `op` writes the gradient of input `i` whole when it is
// fresh (Operands::accumulates false): the ops whose kernels write every element of that
// gradient with an `accumulate` flag off, the same on every device. A gradient that is not
// named here is zero-filled before its first writer adds into it.
bool backward_assigns(const models::OpGraph& g, const models::Op& op, std::size_t i);
// The column blocks of input i's gradient that a device's backward of `op` writes whole when
// they are fresh (Operands::accumulates(t, block) false), each once, none of them all of the
// tensor (that is backward_assigns): the copy of a column block into heads (the KV cache's
// k and v, eager attention's q), and the fused attention's operands that are column blocks
// of one wider tensor (GPT-2's q, k, v in its qkv). Empty: none.
std::vector<ColumnBlock> backward_assigns_columns(const models::OpGraph& g, const models::Op& op, std::size_t i);
// Whether the backward of the fused attention `f` must add into operand h's gradient
// (Operands::accumulates, asked as a column block where h is one): how both devices ask.
bool operand_accumulates(Operands& o, const models::HeadsLayout& f, const models::HeadsOperand& h);

// The sum of squares of some elements and whether one of them is not finite (DeepSpeed's
// gradient norm and fp16 overflow check), gathered over several calls.
struct NormStats {
  double sumsq = 0.0;
  bool nonfinite = false;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // Whether the host can read and write this device's memory through its pointers.
  virtual bool host_addressable() const = 0;
  // The program's device buffers: `bytes` of zeroed memory, and its release. Host
  // buffers (Placement::host) always come from the host.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p) = 0;

  // y = f(x) of graph op `op` (models::Fn), and its backward: input and param gradients
  // accumulate into what is bound.
  virtual void forward(const models::Op& op, Operands& o) = 0;
  virtual void backward(const models::Op& op, Operands& o) = 0;
  // Optimizer updates on a flat fp32 partition (`step` counts applied updates from 1); the
  // gradient is g·grad_factor rounded to fp32 (a 16-bit g read as fp32 first, as DeepSpeed's
  // fp32 copy of it would be). Whether g itself is left scaled is the device's: the CPU device
  // scales an fp32 g in place, the CUDA kernels scale as they read. No program reads a
  // gradient after its update (it is zeroed or refilled first).
  virtual void adam_step(Ref p, Ref g, Ref m, Ref v, std::int64_t n, std::int64_t step,
                         const kernels::cpu::AdamConfig& c, float grad_factor) = 0;
  virtual void sgd_step(Ref p, Ref g, Ref momentum, std::int64_t n, std::int64_t step,
                        const kernels::cpu::SgdConfig& c, float grad_factor) = 0;

  // Data movement, elementwise in fp32 with one rounding per stored element (so a copy
  // between equal dtypes is exact). dst and src do not overlap.
  virtual void copy(Ref dst, Ref src, std::int64_t n) = 0;   // dst = src
  virtual void add(Ref dst, Ref src, std::int64_t n) = 0;    // dst += src
  virtual void fill(Ref dst, std::int64_t n, float value) = 0;  // other dtypes: 0 only (bytes zeroed)
  // Zeroes columns `cols` of `rows` rows of `cols.width` elements from dst (one fill per row
  // here; a device with a strided fill uses it).
  virtual void zero_columns(Ref dst, std::int64_t rows, ColumnBlock cols) {
    for (std::int64_t r = 0; r < rows; ++r) fill(dst.at(r * cols.width + cols.first), cols.count, 0.0f);
  }
  virtual void scale(Ref x, std::int64_t n, float factor) = 0;
  // Norm statistics: norm_begin clears them; norm_add adds the elements of the sum of
  // `parts` (each n long); norm_end returns them (the only call that waits for the device).
  virtual void norm_begin() = 0;
  virtual void norm_add(std::span<const Ref> parts, std::int64_t n) = 0;
  virtual NormStats norm_end() = 0;
  // Between host memory and this device's: fp32 values (converted to/from the storage
  // dtype) and raw bytes. Return when the host side may be reused or read.
  virtual void upload(Ref dst, const float* src, std::int64_t n) = 0;
  virtual void download(float* dst, Ref src, std::int64_t n) = 0;
  virtual void upload_bytes(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void download_bytes(void* dst, const void* src, std::size_t bytes) = 0;
  // Returns once everything queued on this device has run (a device that runs each call
  // as it is made has nothing to wait for).
  virtual void synchronize() {}
  // Between batch(true) and batch(false) the device may hold back copy, add, fill (with 0)
  // and norm_add calls (of one part, or two of one dtype) and run them together
  // (exec/run_batch.hpp), with the results of running them in call order; any other call runs
  // what it holds first. The interpreter batches a copy event's runs and a norm's parts. A
  // device that runs each call as it is made ignores it.
  virtual void batch(bool on) { (void)on; }

  // Event timing: the interpreter brackets each event of a step; step_times returns, for
  // each event bracketed since step_begin, its seconds and its start from the step's
  // start (waiting for the device first). A device that queues its work (CUDA) times it
  // where it runs, not where the host queued it.
  virtual void step_begin(std::size_t events) = 0;
  // Streams (exec/stream_order.hpp): before event `index` begins, the device stream it runs on
  // (a zero::Stream) and the earlier events of the step, on other streams, it must wait for;
  // event_wait adds one while the event runs, before the work that needs it is queued. The
  // step's work is done on every stream when step_times returns. A device that runs each
  // call as it is made (the CPU's) has nothing to order.
  virtual void event_order(std::size_t index, int stream, std::span<const std::int32_t> waits) {
    (void)index, (void)stream, (void)waits;
  }
  virtual void event_wait(std::size_t index) { (void)index; }
  virtual void event_begin(std::size_t index) = 0;
  virtual void event_end(std::size_t index) = 0;
  virtual void step_times(std::span<double> seconds, std::span<double> starts) = 0;
};

}  // namespace zp::exec
