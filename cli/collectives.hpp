#pragma once
// `zeroplan collectives`: a predicted sweep of collective times over a cluster, printed
// like nccl-tests (size, count, type, redop, root, time, algbw, busbw) plus the algorithm
// and protocol the model chose, so it can be laid beside a measured nccl-tests run.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/units.hpp"
#include "exec/comm.hpp"
#include "sim/cluster.hpp"
#include "zero/program.hpp"

namespace zp::cli {

// A size as nccl-tests reads it: a number with an optional K, M or G suffix in binary units
// (1K = 1024), case-insensitive, an optional trailing "B" ("8", "1K", "128M", "1G", "1.5G").
// Anything else, or a result that is not a whole number of bytes → InputError naming `flag`.
Bytes parse_size(const std::string& flag, const std::string& text);

// "all" or a comma-separated list of all_reduce, all_gather, reduce_scatter, reduce,
// broadcast, all_to_all (nccl-tests' names without underscores, alltoall, also accepted).
std::vector<zero::CollKind> parse_coll_kinds(const std::string& flag, const std::string& text);

// The sizes a sweep visits: min, min*factor, ... while <= max (nccl-tests -b, -e, -f).
// min >= 1, max >= min, factor > 1, at most 10000 sizes; else InputError naming the flag.
std::vector<Bytes> sweep_sizes(Bytes min, Bytes max, double factor);

// The sweep over ranks 0..ranks-1 of `cluster` (ranks in [1, cluster.world_size()], else
// InputError("--ranks")), one nccl-tests-like block per collective kind, fp32 elements.
std::string collectives_table(const sim::ClusterSpec& cluster, int ranks, Bytes min, Bytes max, double factor,
                              const std::vector<zero::CollKind>& kinds);
nlohmann::json collectives_json(const sim::ClusterSpec& cluster, int ranks, Bytes min, Bytes max, double factor,
                                const std::vector<zero::CollKind>& kinds);

// `zeroplan collectives --measure`, under `mpirun -np N`: the same sweep run through zeroplan's
// own communicator between this job's N ranks, each collective over all of them as nccl-tests
// measures it (`warmup` calls, then `iters` calls timed on the host after the device finished,
// the mean over ranks as nccl-tests' default -a 1), beside the model's prediction for N ranks
// of `cluster` and its error per size. `device`: "cuda" (NCCL between the ranks' GPUs, one GPU
// per rank or an NCCL_HOSTID per rank), "cpu" (MPI between host buffers: the executor's CPU
// ranks), "auto" (cuda when a GPU is visible). `out`: the measurements in nccl-tests' output
// format, which `calibrate --nccl-tests` reads. Every rank calls it; rank 0 gets the report
// (text or JSON), the others "". A refusal found on some ranks only is agreed on first
// (exec::agree_on_refusals), so no rank is left waiting in a collective.
struct MeasureOptions {
  std::string device = "auto";
  int warmup = 5;
  int iters = 20;
  std::string out;
  double timeout_s = 600.0;
  bool json = false;
};
std::string measure_collectives(exec::Comm& boot, const sim::ClusterSpec& cluster, Bytes min, Bytes max, double factor,
                                const std::vector<zero::CollKind>& kinds, const MeasureOptions& o);

}  // namespace zp::cli
