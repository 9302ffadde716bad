// MPI backend: direct exchanges between group members on MPI_COMM_WORLD.
//  all-reduce      = reduce-scatter + all-gather of blocks (block_of)
//  reduce-scatter  : each rank sends every other rank that rank's block, then sums the
//                    n contributions to its own block in group order
//  all-gather      : each rank sends its block to every other rank
//  reduce          : every non-root rank sends the whole buffer; the root sums in group order
//  broadcast       : a chain from the root
// Per rank this sends exactly Program::bytes_sent; sums run in group order in fp32,
// whatever the collective, so the same gradients reduce to the same bits.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exec/comm.hpp"
#include "exec/numeric.hpp"

namespace zp::exec {

Block block_of(std::int64_t elements, std::int64_t n, std::int64_t b) {
  const std::int64_t base = elements / n, rem = elements % n;
  return {b * base + std::min(b, rem), base + (b < rem ? 1 : 0)};
}

namespace {

void check(int rc, const char* what, const char* file, int line) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw std::runtime_error(fmt::format("{}:{}: {} failed: {}", file, line, what, std::string(msg, static_cast<std::size_t>(len))));
  }
}
#define ZP_MPI(call) check((call), #call, __FILE__, __LINE__)

constexpr std::int64_t kMaxMessage = std::int64_t{1} << 30;  // bytes per MPI message

class MpiComm final : public Comm {
 public:
  MpiComm(int* argc, char*** argv) {
    int inited = 0;
    ZP_MPI(MPI_Initialized(&inited));
    if (!inited) {
      ZP_MPI(MPI_Init(argc, argv));
      owns_ = true;
    }
    ZP_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    ZP_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    ZP_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  }
  ~MpiComm() override {
    if (watchdog_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      watchdog_.join();
    }
    if (owns_) MPI_Finalize();
  }
  // A watchdog thread, started with the first timeout: a collective this rank has been in
  // for longer ends the job (MPI_Abort; the blocked call itself cannot be interrupted).
  void set_timeout(double seconds) override {
    timeout_s_ = seconds;
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  // The reporting calls are bounded like the program's collectives: a peer that hangs
  // between a step's collectives and its report (the loss's sum, every step) ends the job too.
  double sum_for_report(double v) override {
    double out = 0.0;
    Armed armed(*this, [&] { return fmt::format("all_reduce of 8 B (1 x fp64, the step's report) on {}", world_group()); });
    ZP_MPI(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    return out;
  }
  std::vector<std::string> gather_for_report(const std::string& text) override {
    if (text.size() > static_cast<std::size_t>(kMaxMessage)) throw std::length_error("gather_for_report: text too long");
    const int mine = static_cast<int>(text.size());
    Armed armed(*this, [&] {
      return fmt::format("all_gather of {} B (the ranks' reports) on {}", text.size(), world_group());
    });
    std::vector<int> lens(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_));
    ZP_MPI(MPI_Allgather(&mine, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD));
    std::int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      if (total > kMaxMessage) throw std::length_error("gather_for_report: texts too long");
      offsets[static_cast<std::size_t>(r)] = static_cast<int>(total);
      total += lens[static_cast<std::size_t>(r)];
    }
    if (total > kMaxMessage) throw std::length_error("gather_for_report: texts too long");
    std::string all(static_cast<std::size_t>(total), '\0');
    ZP_MPI(MPI_Allgatherv(text.data(), mine, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR,
                          MPI_COMM_WORLD));
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r)
      out.push_back(all.substr(static_cast<std::size_t>(offsets[static_cast<std::size_t>(r)]),
                               static_cast<std::size_t>(lens[static_cast<std::size_t>(r)])));
    return out;
  }
  void barrier() override {
    Armed armed(*this, [&] { return fmt::format("barrier of 0 B (around a checkpoint's save) on {}", world_group()); });
    ZP_MPI(MPI_Barrier(MPI_COMM_WORLD));
  }
  [[noreturn]] void abort(const std::string& why) override {
    fmt::print(stderr, "zeroplan: rank {}: {}\n", rank_, why);
    std::fflush(stderr);
    // The watchdog calls this from its own thread while the collective blocks the main one,
    // and MPI does not promise that MPI_Abort then returns control to mpirun (it may wait on
    // what the blocked call holds). Should this process still live 5 s later, it ends without
    // MPI: mpirun ends the job of a rank that exited without MPI_Finalize.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::_Exit(1);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }

  void run(const CollectiveCall& c) override {
    const auto n = static_cast<std::int64_t>(c.group.size());
    std::int64_t me = -1;
    for (std::int64_t i = 0; i < n; ++i)
      if (c.group[static_cast<std::size_t>(i)] == rank_) me = i;
    if (me < 0) throw std::logic_error(fmt::format("rank {} is not in the collective's group", rank_));
    if (c.on_device) throw std::logic_error("the MPI backend was given device memory (stage it through the host)");
    const auto k = static_cast<std::size_t>(c.kind);
    ++counters_.calls[k];
    if (n == 1) return;  // a group of one: the buffer is already the result (avg: /1)
    Armed armed(*this, [&] {
      return fmt::format("{} of {} B ({} x {}) on group [{}]", zero::coll_kind_name(c.kind),
                         c.elements * static_cast<std::int64_t>(dtype_size(c.dtype)), c.elements, dtype_name(c.dtype),
                         fmt::join(c.group, ","));
    });
    switch (c.kind) {
      case zero::CollKind::all_reduce:
        reduce_scatter(c, n, me);
        all_gather(c, n, me);
        break;
      case zero::CollKind::reduce_scatter: reduce_scatter(c, n, me); break;
      case zero::CollKind::all_gather: all_gather(c, n, me); break;
      case zero::CollKind::reduce: reduce(c, n, me); break;
      case zero::CollKind::broadcast: broadcast(c, n, me); break;
      case zero::CollKind::all_to_all: throw std::logic_error("all_to_all is not used by the step program");
    }
  }

 private:
  std::int64_t esize(const CollectiveCall& c) const { return static_cast<std::int64_t>(dtype_size(c.dtype)); }
  std::byte* at(const CollectiveCall& c, std::int64_t element) const {
    return static_cast<std::byte*>(c.buf) + element * esize(c);
  }

  void send(const CollectiveCall& c, const void* p, std::int64_t bytes, int to) {
    counters_.bytes_sent[static_cast<std::size_t>(c.kind)] += bytes;
    const auto* b = static_cast<const std::byte*>(p);
    for (std::int64_t off = 0; off < bytes; off += kMaxMessage) {
      const int len = static_cast<int>(std::min(kMaxMessage, bytes - off));
      ZP_MPI(MPI_Send(b + off, len, MPI_BYTE, to, 0, MPI_COMM_WORLD));
    }
  }
  void recv(void* p, std::int64_t bytes, int from) {
    auto* b = static_cast<std::byte*>(p);
    for (std::int64_t off = 0; off < bytes; off += kMaxMessage) {
      const int len = static_cast<int>(std::min(kMaxMessage, bytes - off));
      ZP_MPI(MPI_Recv(b + off, len, MPI_BYTE, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    }
  }
  // Pairwise exchange in rounds s = 1..n-1 (send to me+s, receive from me-s): lower
  // group index sends first, so blocking sends never wait on each other.
  template <class SendFn, class RecvFn>
  void rounds(const CollectiveCall& c, std::int64_t n, std::int64_t me, SendFn&& send_to, RecvFn&& recv_from) {
    for (std::int64_t s = 1; s < n; ++s) {
      const std::int64_t to = (me + s) % n, from = (me - s + n) % n;
      if (me < to) { send_to(to); recv_from(from); }
      else { recv_from(from); send_to(to); }
    }
    (void)c;
  }
  int world(const CollectiveCall& c, std::int64_t i) const { return c.group[static_cast<std::size_t>(i)]; }

  void reduce_scatter(const CollectiveCall& c, std::int64_t n, std::int64_t me) {
    const Block mine = block_of(c.elements, n, me);
    std::vector<std::byte> recvd(static_cast<std::size_t>(mine.count * esize(c) * n));
    rounds(c, n, me,
           [&](std::int64_t to) {
             const Block b = block_of(c.elements, n, to);
             send(c, at(c, b.offset), b.count * esize(c), world(c, to));
           },
           [&](std::int64_t from) {
             recv(recvd.data() + from * mine.count * esize(c), mine.count * esize(c), world(c, from));
           });
    std::memcpy(recvd.data() + me * mine.count * esize(c), at(c, mine.offset), static_cast<std::size_t>(mine.count * esize(c)));
    reduce_blocks(c.dtype, c.op, recvd.data(), n, mine.count, at(c, mine.offset));
  }

  void all_gather(const CollectiveCall& c, std::int64_t n, std::int64_t me) {
    const Block mine = block_of(c.elements, n, me);
    rounds(c, n, me,
           [&](std::int64_t to) { send(c, at(c, mine.offset), mine.count * esize(c), world(c, to)); },
           [&](std::int64_t from) {
             const Block b = block_of(c.elements, n, from);
             recv(at(c, b.offset), b.count * esize(c), world(c, from));
           });
  }

  void reduce(const CollectiveCall& c, std::int64_t n, std::int64_t me) {
    const std::int64_t bytes = c.elements * esize(c);
    if (me != c.root) {
      send(c, c.buf, bytes, world(c, c.root));
      return;
    }
    std::vector<std::byte> all(static_cast<std::size_t>(bytes * n));
    for (std::int64_t i = 0; i < n; ++i) {
      if (i == me) std::memcpy(all.data() + i * bytes, c.buf, static_cast<std::size_t>(bytes));
      else recv(all.data() + i * bytes, bytes, world(c, i));
    }
    reduce_blocks(c.dtype, c.op, all.data(), n, c.elements, c.buf);
  }

  void broadcast(const CollectiveCall& c, std::int64_t n, std::int64_t me) {
    const std::int64_t bytes = c.elements * esize(c);
    const std::int64_t pos = (me - c.root + n) % n;  // place in the chain
    if (pos > 0) recv(c.buf, bytes, world(c, (me - 1 + n) % n));
    if (pos < n - 1) send(c, c.buf, bytes, world(c, (me + 1) % n));
  }

  // "group [0,1,...]": every rank of the world.
  std::string world_group() const {
    std::string g;
    for (int r = 0; r < size_; ++r) g += fmt::format("{}{}", r ? "," : "", r);
    return fmt::format("group [{}]", g);
  }

  // The call in progress, for the watchdog (set for the call's duration; `what` names it in the
  // line that ends the job, and is only made when a watchdog runs).
  struct Armed {
    MpiComm& m;
    template <class What>
    Armed(MpiComm& comm, What&& what) : m(comm) {
      if (!m.watchdog_.joinable()) return;
      std::string w = what();
      std::lock_guard<std::mutex> lk(m.mu_);
      m.what_ = std::move(w);
      m.since_ = std::chrono::steady_clock::now();
      m.armed_ = true;
    }
    ~Armed() {
      if (!m.watchdog_.joinable()) return;
      std::lock_guard<std::mutex> lk(m.mu_);
      m.armed_ = false;
    }
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;
  };

  void watch() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(50));
      if (stop_ || !armed_) continue;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count() > timeout_s_) {
        const std::string why = fmt::format("MPI {} did not complete within {:g} s: a peer died or hangs (--comm-timeout)",
                                            what_, timeout_s_);
        lk.unlock();
        abort(why);
      }
    }
  }

  int rank_ = 0, size_ = 1;
  bool owns_ = false;
  double timeout_s_ = 0;
  std::thread watchdog_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false;
  std::string what_;
  std::chrono::steady_clock::time_point since_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(int* argc, char*** argv) { return std::make_unique<MpiComm>(argc, argv); }

}  // namespace zp::exec
