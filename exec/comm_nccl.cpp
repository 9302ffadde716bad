// NCCL backend (exec/comm.hpp): the program's collectives in place on its device buffers,
// in the device's stream of the event that runs it (one per program stream).
//
//   all-reduce      ncclAllReduce, in place
//   reduce-scatter  ncclReduceScatter in place (this rank's block at rank·count) when the
//                   blocks are equal; else one ncclReduce per block to its owner, grouped
//   all-gather      ncclAllGather in place, or one ncclBroadcast per block from its owner
//   reduce          ncclReduce, broadcast ncclBroadcast
//
// Blocks are block_of's, as in the MPI backend, so both leave the same elements on each
// rank. The bytes counted per call are the ones the step program predicts for it
// (Program::bytes_sent, the MPI backend's exchanges): what NCCL's rings and trees move
// internally is its own affair. Sums follow NCCL's order, so results may differ from the
// MPI backend's in the last bit.
//
// Communicators are non-blocking (ncclConfig_t::blocking = 0) so that no wait is
// unbounded. A watchdog thread follows the collectives in flight: from the moment the
// stream reaches one (an event recorded before it completes), it has `timeout_s` to
// finish; one that does not, or an asynchronous NCCL error, ends the job (through the
// bootstrap's abort) with one line naming this rank, the
// collective, its size and its group.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exec/comm.hpp"
#include "exec/device_cuda.hpp"

namespace zp::exec {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_error(ncclResult_t r) {
  const char* last = ncclGetLastError(nullptr);
  return last && *last ? fmt::format("{}: {}", ncclGetErrorString(r), last) : std::string(ncclGetErrorString(r));
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::fp32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::fp16: return ncclFloat16;
    case DType::u8: return ncclUint8;
    case DType::i64: return ncclInt64;
    case DType::b1: break;
  }
  throw std::logic_error(fmt::format("nccl: no collective on {} buffers", dtype_name(t)));
}

ncclRedOp_t nccl_op(zero::ReduceOp o) {
  switch (o) {
    case zero::ReduceOp::sum: return ncclSum;
    case zero::ReduceOp::max: return ncclMax;
    case zero::ReduceOp::avg: return ncclAvg;
    case zero::ReduceOp::none: return ncclSum;  // gathers and broadcasts reduce nothing
  }
  return ncclSum;
}

class NcclComm final : public Comm {
 public:
  NcclComm(Comm& boot, const Device& dev, const std::vector<zero::Group>& groups, const NcclOptions& o)
      : boot_(boot),
        dev_(dev),
        stream_(static_cast<cudaStream_t>(cuda_stream(dev))),
        ordinal_(cuda_ordinal(dev)),
        timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_s))),
        timeout_s_(o.timeout_s) {
    cuda_ok(cudaSetDevice(ordinal_), "cudaSetDevice");
    // The world's communicator: rank 0's unique id to every rank over the bootstrap.
    ncclUniqueId id{};
    if (boot_.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr);
    const std::string mine = boot_.rank() == 0 ? std::string(id.internal, sizeof id.internal) : std::string();
    const auto ids = boot_.gather_for_report(mine);
    std::copy(ids.front().begin(), ids.front().end(), id.internal);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t world = nullptr;
    const ncclResult_t init = ncclCommInitRankConfig(&world, boot_.size(), id, boot_.rank(), &cfg);
    wait_call(init, world, "ncclCommInitRankConfig");  // after the call: it sets `world`
    std::vector<int> everyone(static_cast<std::size_t>(boot_.size()));
    for (int r = 0; r < boot_.size(); ++r) everyone[static_cast<std::size_t>(r)] = r;
    comms_[everyone] = world;
    world_ = world;
    split(groups);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (aborted_) return;
    cudaDeviceSynchronize();  // every stream a collective was queued on
    // Splits first, the world last; finalize (which flushes) then destroy.
    for (auto it = comms_.begin(); it != comms_.end(); ++it)
      if (it->second != world_) finish(it->second);
    finish(world_);
    for (auto& [start, done] : free_)
      cudaEventDestroy(start), cudaEventDestroy(done);
    for (auto& [comm, e] : order_)
      if (e) cudaEventDestroy(e);
    if (staging_) cudaFree(staging_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return boot_.rank(); }
  int size() const override { return boot_.size(); }
  const char* backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  double sum_for_report(double v) override { return boot_.sum_for_report(v); }
  std::vector<std::string> gather_for_report(const std::string& text) override { return boot_.gather_for_report(text); }
  void barrier() override { boot_.barrier(); }
  [[noreturn]] void abort(const std::string& why) override {
    abort_communicators();
    boot_.abort(why);
    std::abort();  // not reached: the bootstrap ends the job
  }

  void run(const CollectiveCall& c) override {
    const auto n = static_cast<std::int64_t>(c.group.size());
    const auto me = static_cast<std::int64_t>(std::find(c.group.begin(), c.group.end(), rank()) - c.group.begin());
    if (me == n) throw std::logic_error(fmt::format("rank {} is not in the collective's group", rank()));
    const auto k = static_cast<std::size_t>(c.kind);
    ++counters_.calls[k];
    counters_.bytes_sent[k] += zero::collective_bytes_sent(c.kind, c.elements, c.dtype, n, me, c.root).v;
    if (n == 1) return;  // a group of one: the buffer is already the result
    stream_ = static_cast<cudaStream_t>(cuda_stream(dev_));  // the stream of the event running it
    const auto it = comms_.find(std::vector<int>(c.group.begin(), c.group.end()));
    if (it == comms_.end())
      throw std::logic_error(fmt::format("rank {}: no NCCL communicator for group [{}]", rank(), fmt::join(c.group, ",")));
    ncclComm_t comm = it->second;
    const std::int64_t esz = dtype_size(c.dtype), bytes = c.elements * esz;
    const std::string what = fmt::format("{} of {} B ({} x {}) on group [{}]", zero::coll_kind_name(c.kind), bytes,
                                         c.elements, dtype_name(c.dtype), fmt::join(c.group, ","));
    auto* p = static_cast<std::byte*>(c.buf);
    if (!c.on_device) {  // a host buffer (a reduced scalar, a gathered piece): staged here
      if (static_cast<std::size_t>(bytes) > staging_bytes_) {
        cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        if (staging_) cuda_ok(cudaFree(staging_), "cudaFree");
        staging_bytes_ = std::max<std::size_t>(static_cast<std::size_t>(bytes), 256);
        cuda_ok(cudaMalloc(&staging_, staging_bytes_), "cudaMalloc (NCCL staging)");
      }
      cuda_ok(cudaMemcpyAsync(staging_, c.buf, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
      p = static_cast<std::byte*>(staging_);
    }
    const ncclDataType_t dt = nccl_type(c.dtype);
    const ncclRedOp_t op = nccl_op(c.op);
    const bool even = c.elements % n == 0;
    const auto count = static_cast<std::size_t>(c.elements);
    auto block = [&](std::int64_t b) { return block_of(c.elements, n, b); };
    auto ptr = [&](std::int64_t element) { return p + element * esz; };
    auto cnt = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    auto root = [](std::int64_t v) { return static_cast<int>(v); };
    // One communicator's operations run in the order they were issued, whichever streams
    // they are queued on (as PyTorch's one NCCL stream per communicator does): the same order
    // on every rank, never two at once on one communicator.
    cudaEvent_t& in_order = order_[comm];
    if (!in_order) cuda_ok(cudaEventCreateWithFlags(&in_order, cudaEventDisableTiming), "cudaEventCreate");
    else cuda_ok(cudaStreamWaitEvent(stream_, in_order, 0), "cudaStreamWaitEvent");
    const auto [start, done] = take_events();
    cuda_ok(cudaEventRecord(start, stream_), "cudaEventRecord");
    switch (c.kind) {
      case zero::CollKind::all_reduce: wait_call(ncclAllReduce(p, p, count, dt, op, comm, stream_), comm, what); break;
      case zero::CollKind::reduce_scatter:
        if (even) {
          const std::size_t per = count / static_cast<std::size_t>(n);
          wait_call(ncclReduceScatter(p, ptr(me * c.elements / n), per, dt, op, comm, stream_), comm, what);
        } else {
          wait_call(ncclGroupStart(), comm, what);
          for (std::int64_t b = 0; b < n; ++b)
            if (block(b).count > 0)
              check(ncclReduce(ptr(block(b).offset), ptr(block(b).offset), cnt(block(b).count), dt, op, root(b), comm, stream_), what.c_str(), comm);
          wait_call(ncclGroupEnd(), comm, what);
        }
        break;
      case zero::CollKind::all_gather:
        if (even) {
          const std::size_t per = count / static_cast<std::size_t>(n);
          wait_call(ncclAllGather(ptr(me * c.elements / n), p, per, dt, comm, stream_), comm, what);
        } else {
          wait_call(ncclGroupStart(), comm, what);
          for (std::int64_t b = 0; b < n; ++b)
            if (block(b).count > 0)
              check(ncclBroadcast(ptr(block(b).offset), ptr(block(b).offset), cnt(block(b).count), dt, root(b), comm, stream_), what.c_str(), comm);
          wait_call(ncclGroupEnd(), comm, what);
        }
        break;
      case zero::CollKind::reduce: wait_call(ncclReduce(p, p, count, dt, op, c.root, comm, stream_), comm, what); break;
      case zero::CollKind::broadcast: wait_call(ncclBroadcast(p, p, count, dt, c.root, comm, stream_), comm, what); break;
      case zero::CollKind::all_to_all: throw std::logic_error("all_to_all is not used by the step program");
    }
    cuda_ok(cudaEventRecord(done, stream_), "cudaEventRecord");
    cuda_ok(cudaEventRecord(in_order, stream_), "cudaEventRecord");
    {
      std::lock_guard<std::mutex> lk(mu_);
      pending_.push_back({start, done, what, {}, false});
    }
    if (!c.on_device) {
      cuda_ok(cudaMemcpyAsync(c.buf, staging_, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
      cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // bounded by the watchdog
    }
  }

 private:
  struct Pending {
    cudaEvent_t start, done;
    std::string what;
    Clock::time_point reached;  // when the stream reached it (start completed)
    bool started;
  };

  // The bootstrap's abort and the trainer prefix the rank.
  std::string where(const std::string& what) const { return "NCCL " + what; }

  // A call's immediate result: an error names the rank and the call.
  void check(ncclResult_t r, const char* what, ncclComm_t) const {
    if (r != ncclSuccess && r != ncclInProgress) throw std::runtime_error(fmt::format("{} failed: {}", where(what), nccl_error(r)));
  }
  // A call on a non-blocking communicator, then its completion (ncclInProgress until the
  // communicator is ready again), bounded by the timeout.
  void wait_call(ncclResult_t r, ncclComm_t comm, const std::string& what) const {
    check(r, what.c_str(), comm);
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      if (comm == nullptr) {  // a failed non-blocking init or split leaves no communicator
        const char* last = ncclGetLastError(nullptr);
        throw std::runtime_error(fmt::format("{} failed: {}", where(what), last && *last ? last : "no communicator was made"));
      }
      ncclResult_t st = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &st);
      if (q != ncclSuccess) throw std::runtime_error(fmt::format("{}: ncclCommGetAsyncError failed: {}", where(what), nccl_error(q)));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) throw std::runtime_error(fmt::format("{} failed: {}", where(what), nccl_error(st)));
      if (Clock::now() > deadline)
        throw std::runtime_error(fmt::format("{} did not complete within {:g} s (a peer died or hangs; --comm-timeout)", where(what), timeout_s_));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // One communicator per distinct group of more than one rank that is not the world:
  // the union of every rank's groups, split in rounds of disjoint groups (one
  // ncclCommSplit per round, every rank calling it: color = its group's index in the
  // round or NCCL_SPLIT_NOCOLOR, key = its place in the group).
  void split(const std::vector<zero::Group>& groups) {
    std::vector<int> world(static_cast<std::size_t>(size()));
    for (int r = 0; r < size(); ++r) world[static_cast<std::size_t>(r)] = r;
    const auto rounds = split_rounds(boot_.gather_for_report(encode_groups(groups)), world);
    for (const auto& round : rounds) {
      int color = NCCL_SPLIT_NOCOLOR, key = 0;
      const std::vector<int>* in = nullptr;
      for (std::size_t i = 0; i < round.size(); ++i) {
        const auto pos = std::find(round[i].begin(), round[i].end(), rank());
        if (pos != round[i].end()) {
          color = static_cast<int>(i);
          key = static_cast<int>(pos - round[i].begin());
          in = &round[i];
        }
      }
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      ncclComm_t sub = nullptr;
      const std::string what = in ? fmt::format("ncclCommSplit into [{}]", fmt::join(*in, ",")) : std::string("ncclCommSplit");
      wait_call(ncclCommSplit(world_, color, key, &sub, &cfg), world_, what);
      if (in) {
        wait_call(ncclSuccess, sub, what);
        comms_[*in] = sub;
      }
    }
  }

  std::pair<cudaEvent_t, cudaEvent_t> take_events() {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_.empty()) {
      const auto e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t a = nullptr, b = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "cudaEventCreate");
    return {a, b};
  }

  // The watchdog: retires finished collectives, starts the clock of the oldest when the
  // stream reaches it, and ends the job on a timeout or an asynchronous error.
  void watch() {
    cudaSetDevice(ordinal_);
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(20));
      if (stop_) break;
      while (!pending_.empty()) {
        auto& f = pending_.front();
        const cudaError_t q = cudaEventQuery(f.done);
        if (q == cudaErrorNotReady) break;
        if (q != cudaSuccess) fail(lk, fmt::format("{}: the stream failed: {}", where(f.what), cudaGetErrorString(q)));
        free_.emplace_back(f.start, f.done);
        pending_.pop_front();
      }
      if (!pending_.empty()) {
        auto& f = pending_.front();
        if (!f.started && cudaEventQuery(f.start) == cudaSuccess) {
          f.started = true;
          f.reached = Clock::now();
        }
        if (f.started && Clock::now() - f.reached > timeout_)
          fail(lk, fmt::format("{} did not complete within {:g} s of the stream reaching it: a peer died or hangs "
                               "(--comm-timeout)", where(f.what), timeout_s_));
        for (const auto& [ranks, comm] : comms_) {
          ncclResult_t st = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
            fail(lk, fmt::format("{} failed: {}", where(f.what), nccl_error(st)));
        }
      }
    }
  }

  // From the watchdog: the main thread may be inside NCCL or waiting on the stream, so the
  // communicators are left alone (aborting one frees it under that thread); the bootstrap
  // ends the job, and the ending process takes its kernels with it.
  [[noreturn]] void fail(std::unique_lock<std::mutex>& lk, const std::string& why) {
    lk.unlock();
    if (aborted_.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // the other caller is ending the job
      std::_Exit(1);
    }
    boot_.abort(why);
    std::abort();  // not reached: the bootstrap ends the job
  }

  // Once, from the thread that runs the collectives: every communicator aborted, so that no
  // kernel waits on a peer any more.
  void abort_communicators() {
    if (aborted_.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // the other caller is ending the job
      std::_Exit(1);
    }
    for (auto& [ranks, comm] : comms_)
      if (comm != world_) ncclCommAbort(comm);
    if (world_) ncclCommAbort(world_);
  }

  void finish(ncclComm_t comm) {
    const ncclResult_t r = ncclCommFinalize(comm);
    if (r == ncclSuccess || r == ncclInProgress) {
      const auto deadline = Clock::now() + timeout_;
      ncclResult_t st = ncclInProgress;
      while (ncclCommGetAsyncError(comm, &st) == ncclSuccess && st == ncclInProgress && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ncclCommDestroy(comm);
  }

  Comm& boot_;
  const Device& dev_;
  cudaStream_t stream_;  // the stream of the collective being queued
  int ordinal_;
  Clock::duration timeout_;
  double timeout_s_;
  ncclComm_t world_ = nullptr;
  std::map<std::vector<int>, ncclComm_t> comms_;  // by the group's world ranks, in order
  std::map<ncclComm_t, cudaEvent_t> order_;       // per communicator: the end of its latest operation
  void* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> free_;
  bool stop_ = false;
  std::atomic<bool> aborted_{false};
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm& boot, const Device& device, const std::vector<zero::Group>& groups,
                                     const NcclOptions& o) {
  return std::make_unique<NcclComm>(boot, device, groups, o);
}

bool nccl_built() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace zp::exec
