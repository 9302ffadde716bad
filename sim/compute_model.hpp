#pragma once
// Compute cost model: each event's time from its FLOPs and bytes — a roofline over the
// device's peak tensor FLOP/s and HBM bandwidth, with GEMM efficiency as a function of
// (m, n, k), bandwidth-bound elementwise/normalisation ops with an efficiency floor, and
// a per-kernel launch overhead — plus the host-side costs DeepSpeed pays (optimizer on
// the partition, flatten/cast copies, CPU Adam, PCIe transfers for offload).
// Every coefficient lives in a DeviceProfile that calibration will replace with
// measured values (calibration/profiles/*.json); defaults come from sim/profiles.json.
#include <cstdint>
#include <string>
#include <vector>

#include "core/units.hpp"
#include "models/graph.hpp"
#include "sim/device.hpp"
#include "zero/program.hpp"

namespace zp::sim {

struct DeviceProfile {
  std::string device;                    // device database name
  FlopsPerSecond peak_tensor_flops{};
  FlopsPerSecond peak_fp32_flops{};
  BytesPerSecond hbm_bandwidth{};
  // GEMM efficiency: eff(m,n,k) = max_eff * s(m) * s(n) * s(k), s(x) = x / (x + half_dim)
  double gemm_max_efficiency = 0.8;
  double gemm_half_dim = 128;
  // Factor on eff when a GEMM dimension is not a multiple of 16 bytes of its dtype
  // (8 fp16/bf16 elements): cuBLAS leaves its fastest tensor-core kernels (vocab 50257).
  double gemm_unaligned_factor = 1.0;
  double elementwise_efficiency = 0.8;   // fraction of HBM bandwidth elementwise ops reach
  Seconds kernel_launch{};               // per kernel
  int kernels_per_op = 1;                // average kernels an op launches (fwd); bwd doubles
  BytesPerSecond d2d_copy_bandwidth{};   // memcpy within the device (read + write counted)
  BytesPerSecond pcie_h2d{};             // host ↔ device per direction
  BytesPerSecond host_memcpy_bandwidth{};// memcpy within host memory (read + write counted)
  double cpu_adam_params_per_second = 1e9;  // DeepSpeed CPUAdam throughput on the host
  double comm_compute_interference = 0.0;   // slowdown of compute while a collective overlaps
  std::string source;
};

// Defaults for a device from sim/profiles.json (or derived from the device database).
DeviceProfile default_profile(const DeviceSpec& dev);
DeviceProfile load_profile(const std::string& path);
// Every entry of a profile database in the format of sim/profiles.json (strict).
std::vector<DeviceProfile> load_profiles(const std::string& path);
// GEMM efficiency of the profile: max_eff · s(m) · s(n) · s(k), in (0, gemm_max_efficiency],
// times gemm_unaligned_factor when m, n or k is not a multiple of `align` elements.
double gemm_efficiency(const DeviceProfile& p, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::int64_t align = 1);

class ComputeModel {
 public:
  ComputeModel(const DeviceProfile& profile, const models::OpGraph& graph);
  // Duration of a compute / copy / optimizer event (collectives are not priced here).
  Seconds cost(const zero::Event& e) const;
  // Duration of graph op `op` in `phase` (forward, backward or recompute) with the op's
  // own FLOPs and bytes: what cost() gives for the compute event that runs it.
  Seconds op_cost(models::OpId op, zero::Phase phase) const;
  // A compute kernel of `flops` and `bytes` in `phase`: GEMM-shaped by graph op `op`
  // (kNone: a non-GEMM op).
  Seconds compute_cost(models::OpId op, zero::Phase phase, Flops flops, Bytes bytes) const;
  const DeviceProfile& profile() const { return p_; }

 private:
  DeviceProfile p_;
  const models::OpGraph& g_;
};

}  // namespace zp::sim
