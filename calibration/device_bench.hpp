#pragma once
// `zeroplan calibrate --device cuda`: micro-benchmarks on this machine's GPUs. The plan (what
// to measure, how often, within the budget) is made here from the op graph of the model to be
// planned and the cluster's group sizes; the CUDA side (device_bench_cuda.cpp, built when the
// CUDA toolkit is found) runs it through kernels/cuda and NCCL and turns each case into an
// observation. Without CUDA, run_device_benchmarks refuses with one line.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "calibration/observation.hpp"
#include "models/graph.hpp"
#include "sim/cluster.hpp"
#include "sim/compute_model.hpp"

namespace zp::calibration {

enum class DeviceOp : std::uint8_t {
  gemm,          // dims (m, n, k, batch): C(m,n) = A(m,k) B(k,n), batched when batch > 1
  gemm_bwd,      // dims (m, n, k, batch): dA = dC Bᵀ and dB = Aᵀ dC, the op's backward
  sdpa_fwd,      // dims (B, H, T, D, causal)
  sdpa_bwd,
  layernorm_fwd, // dims (rows, C)
  layernorm_bwd,
  softmax_fwd,   // dims (rows, n)
  softmax_bwd,
  unary_fwd,     // dims (n): GELU (tanh), two tensors
  unary_bwd,     // three tensors
  binary_fwd,    // dims (n): add, three tensors
  copy_d2d,      // dims (bytes)
  copy_h2d,
  copy_d2h,
  copy_host,
  collective,    // dims (ranks, bytes); `coll`
  op_fwd,        // dims (op id in BenchPlan::graph): the executor's own op, on tensors of its
  op_bwd,        // shapes and dtypes (exec::Device::forward / backward)
};
const char* device_op_name(DeviceOp op);

struct DeviceCase {
  DeviceOp op = DeviceOp::gemm;
  DType dtype = DType::bf16;
  std::array<std::int64_t, 5> dims{};
  zero::CollKind coll = zero::CollKind::all_reduce;
  int iters = 1;                     // timed calls per trial (3 trials, the median kept)
  double est_s = 0;                  // the prior profile's prediction of one call
  double weight = 0;                 // its share of the model's step under the prior (order of priority)
  Observation obs;                   // what it becomes (sample, label, tags; measured filled in)
};

struct BenchPlan {
  std::vector<DeviceCase> cases;     // in the order they run (most important first)
  std::shared_ptr<const models::OpGraph> graph;  // the model's graph, which op_fwd/op_bwd index
  double budget_s = 300;
  double planned_s = 0;              // the prior's estimate of the whole plan, overheads included
  int gpus = 1;                      // GPUs of this process (collectives over 2..gpus)
  int left_out = 0;                  // cases that did not fit the budget
  std::vector<std::string> notes;
};

// The cases for `g` (the model at the planned micro-batch, sequence and dtype): every distinct
// GEMM shape forward and backward, the bandwidth-bound op families at the model's sizes (the
// common elementwise efficiency), every distinct bandwidth-bound op of the graph (its kind,
// function and shapes) forward and backward as the executor runs it (its kind's factor),
// attention (sdpa) when the model uses it, copies, and collectives (all-reduce, reduce-scatter,
// all-gather) over every group size from 2 to `gpus` at sizes from 1 KiB to 1 GiB plus the
// reduce buckets the planner tries. Iterations are chosen so each trial lasts about 20 ms,
// and cases are dropped, least important first, until the estimate fits `budget_s`.
BenchPlan plan_device_benchmarks(const models::OpGraph& g, const sim::DeviceProfile& prior, const sim::ClusterSpec& cluster,
                                 int gpus, double budget_s);

// What the machine is: GPU name and count, driver, CUDA runtime, NCCL.
struct DeviceInfo {
  std::string gpu_name;
  int gpus = 0;
  std::string driver, cuda, nccl;
};

bool device_benchmarks_built();      // zeroplan was built with CUDA
DeviceInfo query_devices();          // InputError without CUDA or without a GPU

using Progress = std::function<void(double fraction, const std::string& what)>;
struct DeviceRun {
  Dataset data;
  double seconds = 0;
  int measured = 0;
  int skipped = 0;                   // cases the budget or the kernels (an unsupported head dim) left out
  bool budget_hit = false;
};
// Runs the plan, never past `plan.budget_s` (cases not started by then are left out).
DeviceRun run_device_benchmarks(const BenchPlan& plan, const Progress& progress);

// A progress bar on stderr: "[#########.........]  45%  gemm 4096x2304x768 bf16  ETA 1:10"
// redrawn in place on a terminal, one line per 10% otherwise.
class ProgressBar {
 public:
  ProgressBar(bool terminal, double budget_s);
  void operator()(double fraction, const std::string& what);
  void finish();
  // The line it would draw (tests).
  static std::string render(double fraction, const std::string& what, double elapsed_s, int width = 30);

 private:
  bool terminal_;
  double budget_s_;
  double start_;
  int last_decile_ = -1;
};

}  // namespace zp::calibration
