#pragma once
// Cluster profiles (calibration/profiles/*.json): what a calibration measured and fitted, in a
// versioned JSON file that `simulate`, `explain`, `plan` and `report` read with --profile.
//
//   {"format": "zeroplan-cluster-profile", "version": 1, "created": "...",
//    "cluster": {GPU, count, nodes, topology, driver, CUDA, NCCL, DeepSpeed versions, date},
//    "device_profile": {sim/profiles.json's keys, "host": {...}},
//    "collective": {"fill_fraction": φ, "latency": {"intra": {"ring": {"ll": f, ...}, ...}, ...},
//                   "bandwidth": {...}},
//    "parameters": [{"name", "unit", "initial", "value", "sd", "status"}],
//    "refused": [{"name", "reason"}],
//    "uncertainty": {"iteration_rel_sd", "basis", "by_class": {...}},
//    "executor_memory": {"context_bytes", "library_bytes", "nccl_one_rank_bytes", "runs", "source"},
//    "sources": [...], "curves": [...], "residuals": [...]}
//
// docs/calibration.md describes every key.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibration/fit.hpp"
#include "sim/cluster.hpp"
#include "sim/compute_model.hpp"
#include "sim/device.hpp"

namespace zp::calibration {

constexpr int kProfileVersion = 1;
constexpr const char* kProfileFormat = "zeroplan-cluster-profile";

// What the profile was measured on.
struct ClusterInfo {
  std::string name;                  // the cluster's name (preset, file)
  std::string gpu;                   // device database name
  std::string gpu_name;              // as the driver names it
  int count = 0, nodes = 0, gpus_per_node = 0;
  std::string intra;                 // nvswitch, nvlink_mesh, pcie, shared_memory
  int nics_per_node = 0;
  double nic_gbps = 0;
  std::string topology;              // sim::describe_cluster
  std::string driver, cuda, nccl, deepspeed, torch, host, measured;
};

struct ProfileParam {
  std::string name, unit, status;    // status: fitted, at_bound
  double initial = 0, value = 0, sd = 0;
};

// The interval a prediction made with the profile carries: a relative standard deviation
// (68% of the measured iterations fell within it) and where it comes from.
struct ProfileUncertainty {
  double iteration_rel_sd = 0;
  std::string basis;
  std::map<std::string, double> by_class;  // "phase wall", "phase gpu_busy", "collective", "kernel"
};

struct ClusterProfile {
  std::string file;                  // where it was read from
  int version = kProfileVersion;
  std::string created;
  ClusterInfo cluster;
  sim::DeviceProfile device;
  sim::CollectiveCoefficients collective;
  std::vector<ProfileParam> parameters;
  std::vector<Refusal> refused;
  ProfileUncertainty uncertainty;
  // zeroplan's CUDA executor on this GPU (train --device cuda --out runs of one rank per GPU):
  // the driver's context, library and one-rank NCCL figures, medians over `executor_runs`.
  sim::DeviceSpec::ExecutorMemory executor_memory;
  int executor_runs = 0;
  nlohmann::json sources = nlohmann::json::array();
  nlohmann::json curves = nlohmann::json::array();
  nlohmann::json residuals = nlohmann::json::array();
  bool fitted(const std::string& prefix) const;  // some parameter whose name starts with `prefix` was fitted
};

nlohmann::json profile_to_json(const ClusterProfile& p);
ClusterProfile profile_from_json(const std::string& file, const nlohmann::json& doc);
ClusterProfile load_cluster_profile(const std::string& path);
void write_cluster_profile(const ClusterProfile& p, const std::string& path);

nlohmann::json coefficients_to_json(const sim::CollectiveCoefficients& c);

// What differs between the cluster a profile was measured on and the one planned: one
// warning per difference (GPU, node links, GPUs per node, NICs, `local_nccl` (this machine's,
// local_nccl_version(); "" unknown), a plan across nodes with a profile measured inside one).
std::vector<std::string> compatibility_warnings(const ClusterProfile& p, const sim::ClusterSpec& planned, int world_size,
                                                const std::string& local_nccl);

// The profile's coefficients on the planned device and cluster: its efficiencies, launch and
// host costs with the planned device's peaks, and its collective factors.
void apply_profile(const ClusterProfile& p, const sim::DeviceSpec& planned_device, sim::DeviceProfile& profile,
                   sim::ClusterSpec& cluster);

// NCCL's version on this machine ("2.28.9"), or "" when zeroplan was built without NCCL.
std::string local_nccl_version();

// "NVIDIA H200" → "H200-141GB", "Tesla V100-PCIE-16GB" → "V100-16GB"; "" when unknown.
std::string device_for_gpu_name(const std::string& gpu_name);

}  // namespace zp::calibration
