// Tests of the device database (sim/devices.json through sim/device.cpp).
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.hpp"
#include "sim/device.hpp"

namespace zp::sim {
// Defined in sim/device.cpp: reads a device file other than the installed one.
std::vector<DeviceSpec> load_devices(const std::string& path);
}  // namespace zp::sim

using zp::sim::DeviceSpec;
using zp::sim::find_device;

namespace {

constexpr double kT = 1e12;
constexpr double kG = 1e9;

void check_gpu(const std::string& name, std::int64_t memory, double tensor_tflops, double fp32_tflops,
               double hbm_gbps, double nvlink_gbps, bool bf16, const std::string& arch) {
  CAPTURE(name);
  const DeviceSpec& d = find_device(name);
  CHECK(d.name == name);
  CHECK(d.arch == arch);
  CHECK(d.memory.v == memory);
  CHECK(d.peak_tensor_flops.v == zp::test::approx(tensor_tflops * kT));
  CHECK(d.peak_fp32_flops.v == zp::test::approx(fp32_tflops * kT));
  CHECK(d.hbm_bandwidth.v == zp::test::approx(hbm_gbps * kG));
  CHECK(d.nvlink_bandwidth.v == zp::test::approx(nvlink_gbps * kG));
  CHECK(d.bf16 == bf16);
  CHECK(d.context_overhead.v > 256LL * 1024 * 1024);  // a CUDA context alone is a few hundred MB
  CHECK(d.context_overhead.v < 4LL * 1024 * 1024 * 1024);
}

std::string write_temp(const std::string& text) {
  const std::string path = "/tmp/zeroplan_test_devices_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& text) {
  const std::string path = write_temp(text);
  std::string msg;
  try {
    zp::sim::load_devices(path);
  } catch (const zp::InputError& e) {
    msg = e.what();
  }
  std::remove(path.c_str());
  return msg;
}

const char* kGood = R"({"devices": [{"name": "X1", "arch": "hopper", "memory_bytes": 1000,
  "peak_tensor_tflops": 1, "peak_fp32_tflops": 1, "hbm_gbps": 1, "nvlink_gbps": 0,
  "context_overhead_bytes": 10, "cublas_workspace_bytes": 4, "cublaslt_workspace_bytes": 2, "bf16": true,
  "source": "test"}]})";

}  // namespace

TEST_CASE("every GPU entry loads with its datasheet figures") {
  check_gpu("V100-16GB", 16'945'512'448, 125, 15.7, 900, 150, false, "volta");
  check_gpu("V100-32GB", 34'089'730'048, 125, 15.7, 900, 150, false, "volta");
  check_gpu("A100-40GB", 42'505'273'344, 312, 19.5, 1555, 300, true, "ampere");
  check_gpu("A100-80GB", 85'051'572'224, 312, 19.5, 2039, 300, true, "ampere");
  check_gpu("H100-80GB", 85'520'809'984, 989, 67, 3350, 450, true, "hopper");
  check_gpu("H200-141GB", 150'109'880'320, 989, 67, 4800, 450, true, "hopper");
}

TEST_CASE("H200 figures are the ones measured on the device") {
  const DeviceSpec& d = find_device("H200-141GB");
  CHECK(d.memory.v == 150'109'880'320);         // torch.cuda.mem_get_info total
  CHECK(d.context_overhead.v == 1'303'183'360);  // CUDA context + cuBLAS + one-rank NCCL
}

TEST_CASE("cuBLAS workspaces: PyTorch's defaults per architecture, measured on the H200") {
  // CublasHandlePool.cpp: :4096:8 on sm90, :4096:2:16:8 elsewhere; cuBLASLt 1024 KiB.
  CHECK(find_device("H200-141GB").cublas_workspace.v == 4096 * 8 * 1024);  // 33,554,432 B measured
  CHECK(find_device("H100-80GB").cublas_workspace.v == 4096 * 8 * 1024);
  CHECK(find_device("A100-80GB").cublas_workspace.v == 4096 * 1024 * 2 + 16 * 1024 * 8);
  CHECK(find_device("V100-16GB").cublas_workspace.v == 8'519'680);
  CHECK(find_device("H200-141GB").cublaslt_workspace.v == 1'048'576);  // measured
  CHECK(find_device("A100-40GB").cublaslt_workspace.v == 1'048'576);
  CHECK(find_device("cpu").cublas_workspace.v == 0);
  CHECK(find_device("cpu").cublaslt_workspace.v == 0);
  const auto good = zp::sim::load_devices(write_temp(kGood));
  CHECK(good.front().cublas_workspace.v == 4);
  CHECK(good.front().cublaslt_workspace.v == 2);
}

TEST_CASE("cpu entry: 16 GiB, no context overhead") {
  const DeviceSpec& d = find_device("cpu");
  CHECK(d.arch == "cpu");
  CHECK(d.memory.v == 16LL * 1024 * 1024 * 1024);
  CHECK(d.context_overhead.v == 0);
  CHECK(d.peak_tensor_flops.v > 0);
  CHECK(d.peak_tensor_flops.v < find_device("V100-16GB").peak_tensor_flops.v);
  CHECK(d.hbm_bandwidth.v > 0);
  CHECK(d.nvlink_bandwidth.v == 0);
}

TEST_CASE("names are case-insensitive and aliases resolve") {
  CHECK(find_device("v100").name == "V100-16GB");
  CHECK(find_device("V100").name == "V100-16GB");
  CHECK(find_device("a100").name == "A100-80GB");
  CHECK(find_device("h100").name == "H100-80GB");
  CHECK(find_device("H200").name == "H200-141GB");
  CHECK(find_device("h200-141gb").name == "H200-141GB");
  CHECK(find_device("v100-32gb").name == "V100-32GB");
  CHECK(find_device("NVIDIA H200").name == "H200-141GB");  // torch.cuda.get_device_name()
  CHECK(&find_device("A100-80GB") == &find_device("a100"));
}

TEST_CASE("devices() lists every entry once") {
  const auto& all = zp::sim::devices();
  CHECK(all.size() >= 7);
  for (const auto& d : all) {
    CAPTURE(d.name);
    CHECK(&find_device(d.name) == &d);
    CHECK(d.memory.v > 0);
    CHECK(d.context_overhead.v < d.memory.v);
  }
}

TEST_CASE("unknown GPU: one line naming --gpu and the known devices") {
  std::string msg;
  try {
    find_device("B300");
  } catch (const zp::InputError& e) {
    msg = e.what();
  }
  CHECK(msg ==
        "--gpu: unknown GPU 'B300'; known: V100-16GB, V100-32GB, A100-40GB, A100-80GB, "
        "H100-80GB, H200-141GB, cpu");
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("device files are read strictly") {
  CHECK(zp::sim::load_devices(write_temp(kGood)).size() == 1);
  std::string bad = kGood;
  bad.replace(bad.find("\"bf16\""), 6, "\"bf_16\"");
  CHECK(error_of(bad).find("devices[0].bf_16: unknown key (did you mean 'bf16'?)") != std::string::npos);
  bad = kGood;
  bad.replace(bad.find("\"source\": \"test\""), 16, "\"sauce\": \"test\"");
  CHECK(error_of(bad).find("devices[0].sauce") != std::string::npos);
  bad = kGood;
  bad.replace(bad.find("\"memory_bytes\": 1000"), 20, "\"memory_bytes\": -1");
  CHECK(error_of(bad).find("devices[0].memory_bytes") != std::string::npos);
  bad = kGood;
  bad.replace(bad.find("\"cublas_workspace_bytes\": 4"), 27, "\"cublas_workspace_bytes\": -4");
  CHECK(error_of(bad).find("devices[0].cublas_workspace_bytes") != std::string::npos);
  bad = kGood;
  bad.replace(bad.find("\"cublaslt_workspace_bytes\": 2, "), 31, "");
  CHECK(error_of(bad).find("devices[0].cublaslt_workspace_bytes: missing required key") != std::string::npos);
  bad = kGood;
  bad.replace(bad.find("\"hopper\""), 8, "\"kepler\"");
  CHECK(error_of(bad).find("devices[0].arch: must be one of") != std::string::npos);
  CHECK(error_of(R"({"devices": []})").find("devices") != std::string::npos);
  CHECK(error_of(R"({"devises": []})").find("did you mean 'devices'") != std::string::npos);
  const std::string twice = std::string(R"({"devices": [)") +
                            std::string(kGood).substr(13, std::string(kGood).size() - 15) + "," +
                            std::string(kGood).substr(13, std::string(kGood).size() - 15) + "]}";
  CHECK(error_of(twice).find("used twice") != std::string::npos);
}
