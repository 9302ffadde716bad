// A build without NCCL: the NCCL backend is absent, and asking for it says so.
#include <stdexcept>

#include "exec/comm.hpp"

namespace zp::exec {

std::unique_ptr<Comm> make_nccl_comm(Comm&, const Device&, const std::vector<zero::Group>&, const NcclOptions&) {
  throw std::runtime_error("this zeroplan was built without NCCL (nccl.h not found at configure time): --comm nccl is not available");
}
bool nccl_built() { return false; }
std::string nccl_version() { return ""; }

}  // namespace zp::exec
