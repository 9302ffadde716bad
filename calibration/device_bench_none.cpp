// Built when CUDA was not found at configure time: the device benchmarks are absent and say so.
#include "calibration/device_bench.hpp"
#include "calibration/profile.hpp"
#include "core/error.hpp"

namespace zp::calibration {

namespace {
const char* const kNoCuda =
    "this zeroplan was built without CUDA: configure on a machine with the CUDA toolkit (nvcc, cuBLASLt; NCCL for the "
    "collectives) to measure GPUs (docs/calibration.md), or calibrate from files: --nccl-tests, --deepspeed-log, "
    "--deepspeed-runs, --train-out";
}  // namespace

bool device_benchmarks_built() { return false; }

DeviceInfo query_devices() { throw InputError("--device", "", kNoCuda); }

DeviceRun run_device_benchmarks(const BenchPlan&, const Progress&) { throw InputError("--device", "", kNoCuda); }

std::string local_nccl_version() { return ""; }

}  // namespace zp::calibration
