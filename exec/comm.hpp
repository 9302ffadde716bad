#pragma once
// Communication backends for the executor. One small struct per collective call (as in
// nccl-tests): kind, buffer, element count, dtype, group and reduce op. Every backend
// moves the bytes the step program predicts for the call (Program::bytes_sent) and
// reduces in group-rank order, so results are bitwise deterministic and independent of
// which collective carried them.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "zero/program.hpp"

namespace zp::exec {

class Device;

struct CollectiveCall {
  zero::CollKind kind = zero::CollKind::all_reduce;
  void* buf = nullptr;             // in place: the full logical buffer (elements)
  std::int64_t elements = 0;       // all-reduce/reduce: reduced; all-gather: output; reduce-scatter: input
  DType dtype = DType::fp32;
  zero::ReduceOp op = zero::ReduceOp::sum;
  std::span<const int> group;      // world ranks, in group order
  int root = 0;                    // reduce/broadcast: index into group
  bool on_device = false;          // buf is device memory (a backend with device_buffers())
};

// Bytes sent and calls, per collective kind.
struct CommCounters {
  std::array<std::int64_t, zero::kNumCollKinds> bytes_sent{};
  std::array<std::int64_t, zero::kNumCollKinds> calls{};
};

// Block b of `elements` split over n ranks: the first (elements mod n) blocks are one
// element longer (the split Program::bytes_sent assumes).
struct Block {
  std::int64_t offset = 0, count = 0;
};
Block block_of(std::int64_t elements, std::int64_t n, std::int64_t b);

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void run(const CollectiveCall& c) = 0;
  // Whether run() works on device memory in place (NCCL); host buffers (on_device false)
  // are then staged by the backend itself. Otherwise run() reads and writes host memory.
  virtual bool device_buffers() const { return false; }
  // The backend's name in reports: "mpi", "nccl".
  virtual const char* backend() const = 0;
  // Seconds a collective may take once this rank reaches it before the job is ended with
  // one line naming the rank, the collective, its bytes and group (a peer died or hangs).
  // The NCCL backend takes it at construction (NcclOptions).
  virtual void set_timeout(double seconds) { (void)seconds; }
  // Outside the program (reporting): sum of one double over all ranks, not counted.
  virtual double sum_for_report(double v) = 0;
  // Outside the program (agreement checks before training): every rank's `text`, in rank
  // order, on every rank; not counted.
  virtual std::vector<std::string> gather_for_report(const std::string& text) = 0;
  // Barrier outside the program (start of timing), not counted.
  virtual void barrier() = 0;
  // Ends the job on every rank with a message (a failed rank must not leave peers hanging).
  [[noreturn]] virtual void abort(const std::string& why) = 0;
  const CommCounters& counters() const { return counters_; }

 protected:
  CommCounters counters_;
};

// MPI (OpenMPI) over point-to-point exchanges on MPI_COMM_WORLD. Initialises MPI on
// construction (singleton runs work without mpirun) and finalises it on destruction.
std::unique_ptr<Comm> make_mpi_comm(int* argc, char*** argv);

// NCCL on the GPU of a CUDA device (exec/comm_nccl.cpp): the collectives run in place on
// the program's device buffers, in the device's stream, so they are ordered with its
// kernels without a host synchronisation. `boot` (MPI) broadcasts the unique id and keeps
// the reporting calls; it must outlive the result. One communicator for the world and
// one per other group any rank's program uses (ncclCommSplit: every rank passes its own
// program's groups, the union is agreed over `boot`). Every wait is bounded by
// `timeout_s`: a collective the stream reached that does not finish in time (a peer died
// or hangs), or an asynchronous NCCL error, ends the job (MPI_Abort through `boot`)
// with one line naming the rank, the collective, its size and group.
struct NcclOptions {
  double timeout_s = 600.0;
};
std::unique_ptr<Comm> make_nccl_comm(Comm& boot, const Device& device, const std::vector<zero::Group>& groups,
                                     const NcclOptions& o);
// The groups of a device backend's communicators. encode_groups: a rank's program groups
// of more than one rank, as text to gather over the bootstrap. split_rounds: from every
// rank's text, the distinct groups other than `world`, in rounds of disjoint groups (one
// ncclCommSplit per round: color = the index of the rank's group in the round), in an order
// every rank computes alike.
std::string encode_groups(const std::vector<zero::Group>& groups);
std::vector<std::vector<std::vector<int>>> split_rounds(const std::vector<std::string>& per_rank,
                                                        const std::vector<int>& world);
// A refusal that only some ranks saw (a damaged checkpoint file of one rank, a GPU one rank
// cannot use): those ranks have printed their message; every rank ends with exit status 2.
class RankRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Every rank's refusal ("" for none), in rank order, as gathered: nothing when none refused;
// the same refusal on every rank → InputError (rank 0 prints it once); refusals of some ranks
// only → each rank prints one line (its own refusal, or that it stopped because of ranks R
// refusing `what`) and throws RankRefused. Every rank decides alike, so none is left waiting in
// a collective.
void stop_if_refused(const std::vector<std::string>& refusals, int rank, const std::string& what);
// The same after gathering `mine` over `comm` (a refusal found on this rank only).
void agree_on_refusals(Comm& comm, const std::string& mine, const std::string& what = "");

// This rank's index among the ranks of its host (Open MPI and Slurm say; else `rank`), and the
// host's name.
int local_rank(int rank);
std::string host_name();

// Whether this build has the NCCL backend; its version ("2.28.9"), or "".
bool nccl_built();
std::string nccl_version();

}  // namespace zp::exec
