// A build without CUDA: the CUDA device is absent, and asking for it says so.
#include <stdexcept>

#include "exec/device_cuda.hpp"

namespace zp::exec {

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions&) {
  throw std::runtime_error("this zeroplan was built without CUDA (no CUDA toolkit found at configure time): --device cuda is not available");
}
DriverMemory driver_memory(const Device*) { return {}; }
void mark_after_comm(Device*) {}
void* cuda_stream(const Device&) { throw std::logic_error("built without CUDA"); }
int cuda_ordinal(const Device&) { throw std::logic_error("built without CUDA"); }
std::string cuda_bus_id(const Device&) { throw std::logic_error("built without CUDA"); }
bool cuda_device_built() { return false; }
int cuda_devices_visible() { return 0; }
std::string cudnn_attention_refusal() { return "this zeroplan was built without CUDA (no CUDA toolkit found at configure time)"; }

}  // namespace zp::exec
