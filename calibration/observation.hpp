#pragma once
// What calibration fits to: one common observation type for every source (nccl-tests tables,
// DeepSpeed logs and recorded runs, `zeroplan train --out` files, micro-benchmarks on the
// device). An observation says what ran (a collective over a group, a kernel of a given
// shape, a phase of a training step), on what (dtype, bytes, FLOPs, group) and the time
// measured; the predictor (predictor.hpp) prices the same thing through the simulator.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/units.hpp"
#include "models/attention.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"
#include "sim/cluster.hpp"
#include "zero/ds_config.hpp"
#include "zero/program.hpp"

namespace zp::calibration {

enum class ObsKind : std::uint8_t {
  collective,  // one collective over a group of ranks (nccl-tests, the device sweep)
  kernel,      // one kernel or op on one GPU (micro-benchmarks, train --out events)
  phase,       // one phase of a training step (DeepSpeed timers, recorded runs, train --out)
};
const char* obs_kind_name(ObsKind k);

// One collective: nccl-tests' S (the logical buffer) over `ranks` ranks on `nodes` nodes.
struct CollectiveSample {
  zero::CollKind kind = zero::CollKind::all_reduce;
  int ranks = 0;
  int nodes = 1;
  int ranks_per_node = 0;
  Bytes bytes{};
  std::string dtype;                 // nccl-tests' type column (float, half, bfloat16, ...)
  std::vector<int> group;            // the global ranks when known (a program's group); else
                                     // ranks_per_node ranks on each of `nodes` nodes
};

// What a kernel observation measured.
enum class KernelClass : std::uint8_t {
  gemm,        // GEMMs (one op's, forward or backward)
  memory,      // bandwidth-bound kernels (elementwise, normalisation, softmax, loss, optimizer)
  attention,   // fused attention (sdpa, flash_attention), priced through its GEMMs
  copy_d2d,    // memcpy within the device
  copy_h2d,    // host ↔ device
  copy_host,   // memcpy within host memory
  collective,  // a collective event of a train --out file (its group and bytes in `coll`)
  reduction,   // the local reduction of a scalar all-reduce of one rank (the gradient norm, the
               // overflow check): `bytes` read over `pieces` tensors
};
const char* kernel_class_name(KernelClass k);

struct KernelSample {
  KernelClass cls = KernelClass::memory;
  std::string name;                  // e.g. "gemm 4096x2304x768 bf16", the op's name
  std::vector<models::Gemm> gemms;   // forward geometry (the compute model derives the backward's)
  Flops flops{};
  Bytes bytes{};                     // bytes read + written
  DType dtype = DType::bf16;         // the activations' dtype (tensor cores unless fp32)
  bool backward = false;             // the op's backward (twice the kernels; dA and dB GEMMs)
  bool tf32 = false;                 // fp32 GEMMs ran on TF32 tensor cores (else the fp32 cores)
  bool cudnn_attention = false;      // fused attention ran cuDNN's kernel (train --attention-kernel cudnn)
  bool staged = false;               // an nn.Linear product of a run on the CUDA device, which
                                     // stages it where its output width is odd (ComputeModel::
                                     // stages_products): micro-benchmarks and CPU runs are not
  bool padded_rows = false;          // a GEMM whose output has padded, aligned rows (models::Tensor::
                                     // row_pitch: the fused loss's logits), priced as aligned
  std::optional<models::OpKind> op_kind;  // the graph op's kind (a training run's event): its
                                     // bandwidth factor (DeviceProfile::op_efficiency) applies
  double dropout = 0;                // fused attention: its dropout_p
  std::int64_t pieces = 1;           // a copy: its contiguous pieces (a flatten's tensors); a
                                     // reduction, or a collective's local reduction: its tensors
  Bytes reduce_bytes{};               // an optimizer step's local gradient norm first: the bytes
                                     // it reads (over `pieces` tensors)
  zero::CopyKernel copy_kernel = zero::CopyKernel::memcpy;  // a device copy: memcpy, or a kernel
                                     // that converts (cast) or accumulates (add)
  bool host_bound = false;           // a copy issued right after the host read a value back
                                     // (zero::Event::host_bound)
  bool optimizer = false;            // the optimizer's update on the device (a memory kernel at
                                     // DeviceProfile::optimizer_efficiency)
  int run = -1;                      // the training run it was timed in (index into Dataset::runs:
                                     // a train --out event); -1: a micro-benchmark
};

// The phases DeepSpeed's wall_clock_breakdown times (utils/timer.py), and the iteration.
enum class PhaseName : std::uint8_t { forward, backward, backward_inner, backward_allreduce, step, iteration };
const char* phase_label(PhaseName p);
constexpr int kNumPhaseNames = 6;

// Wall time as DeepSpeed's timers see it; the GPU's busy time inside the phase (the union of
// kernel intervals, as tools/deepspeed_reference.py reduces a profiler trace); the sum of
// the phase's device events' own times, as zeroplan's executor times them (train --out); or
// the summed kernel time of one class of kernels in the phase, as the profiler names them
// (deepspeed_reference.py's kernel_class): the matrix products (cuBLAS), the fused attention,
// and the rest (elementwise, normalisation, reductions, copies, the optimizer's kernels).
// The classes let a fit tell the GEMM curve from the bandwidth-bound kernels, which the
// phase totals trade against each other.
enum class Quantity : std::uint8_t { wall, gpu_busy, events, gpu_gemm, gpu_attention, gpu_other };
constexpr int kNumQuantities = 6;
const char* quantity_name(Quantity q);

struct PhaseSample {
  int run = -1;                      // index into Dataset::runs
  PhaseName phase = PhaseName::forward;
  Quantity quantity = Quantity::wall;
};

struct Observation {
  ObsKind kind = ObsKind::kernel;
  std::string source;                // "FILE:LINE" or "FILE: run NAME"
  std::string label;                 // one line for reports
  CollectiveSample coll;
  KernelSample kernel;
  PhaseSample phase;
  Seconds measured{};
  double spread = 0;                 // relative standard deviation of the repeats (0: unknown)
  Seconds floor{};                   // added to measured and predicted before their ratio is
                                     // taken, for phases that may be near 0 (bwd_allreduce)
  int repeats = 1;
  // Relative weight in the fit: 1, or for a training run's events the square root of the event's
  // time over the mean time of its run's events of its class, so that the fit weighs each event
  // by its share of that class's time (a thousand 10 µs adds do not outvote one 2 ms loss).
  double weight = 1;
  // Attributes `--fit-where` selects by: source, kind, model, stage, dtype, micro_batch, op, ...
  std::map<std::string, std::string> tags;
  bool fit = true;                   // false: held out (reported, not fitted)
};

// A training configuration that phase observations refer to.
struct RunConfig {
  std::string name;
  std::string source;                // where it was read
  std::string model;                 // as --model takes it
  std::optional<models::ModelConfig> model_config;  // the config itself, where `model` cannot be loaded here
  zero::DsConfig cfg;
  std::int64_t seq_len = 0;
  models::Attention attention = models::kDefaultAttention;
  int world_size = 1;
  std::optional<int> rank;           // the rank it measured (train --out of one rank of N); none:
                                     // the heaviest rank, as simulate predicts it
  bool activation_checkpointing = false;
  bool keep_output = false;          // the caller held the model output (--keep-output)
  models::KernelVariants variants;   // train --fused-gelu, ... (zeroplan's kernel variants)
  // Trained by zeroplan's executor (train --out), not by DeepSpeed: none of DeepSpeed's
  // per-tensor step loops (zero::Event::loop_kernels) ran.
  bool zeroplan_executor = false;
  bool cudnn_attention = false;      // the executor's fused attention was cuDNN's (train --attention-kernel)
  bool cuda = false;                 // the executor's CUDA device ran it (its large odd products staged)
  // Events of the program the run's file has no time for (events the program gained after it
  // was written): left out of the phases' sums of event times, as they were of the measured ones.
  std::vector<std::int32_t> unmeasured_events;
  // The host probe when the run was timed (µs per eager op, tools/deepspeed_reference.py's
  // host_probe_us; the median over its rounds); 0: not recorded. Its host costs are predicted
  // at this probe (sim::host_costs_at_probe).
  double host_probe_us = 0;
  std::map<std::string, std::string> tags;
};

// What the measurements say about the machine they were taken on (profile metadata).
struct Environment {
  std::string gpu_name;              // as the driver names it ("NVIDIA H200")
  int gpu_count = 0;
  int nodes = 0;
  std::string driver, cuda, nccl, deepspeed, torch, host;
  std::string date;                  // of the measurements, when they say
  // Where each field came from (for conflicts: two sources naming different NCCL versions).
  std::map<std::string, std::string> origin;
};

// What the driver reported of a `train --device cuda --out` run on a GPU of its own (its
// driver_memory): the CUDA context, what the kernels' libraries held beyond their Context's
// workspace and scratch, and NCCL's communicator (-1: the run had none).
struct DriverFigures {
  std::string file, gpu_name;
  std::int64_t context = 0, libraries = 0, nccl = -1;
  std::int64_t cudnn = -1;  // cuDNN's handle and engines, in a run with --attention-kernel cudnn
};

// The figures of several runs: medians (what a profile keeps) and spreads (max - min), NCCL
// over the runs that had it (nccl -1: none did).
struct DriverSummary {
  int runs = 0;
  std::int64_t context = 0, libraries = 0, nccl = -1, cudnn = -1;
  std::int64_t context_spread = 0, libraries_spread = 0, nccl_spread = 0, cudnn_spread = 0;
};
DriverSummary summarize(const std::vector<DriverFigures>& runs);

struct Dataset {
  std::vector<Observation> obs;
  std::vector<RunConfig> runs;
  std::vector<DriverFigures> driver;  // train --out runs of one rank per GPU with driver_memory
  Environment env;
  std::vector<std::string> warnings;
  std::vector<std::string> files;    // every source read
};

// Merges `from` into `into` (runs renumbered); conflicting environment fields are warned about.
void merge(Dataset& into, Dataset from);

}  // namespace zp::calibration
