// zeroplan: predict the memory and time of DeepSpeed ZeRO training before spending GPU hours,
// explain them, plan the best configuration, train it for real on CPU ranks and compare.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include "core/json_util.hpp"
#include "models/graph.hpp"
#include <fmt/format.h>

#include "cli/calibrate.hpp"
#include "cli/collectives.hpp"
#include "cli/compare.hpp"
#include "cli/explain.hpp"
#include "cli/plan.hpp"
#include "cli/report.hpp"
#include "cli/simulate.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "exec/comm.hpp"
#include "exec/trainer.hpp"
#include "models/model_config.hpp"
#include "sim/device.hpp"

namespace {

std::vector<int> parse_stages(const std::string& s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = s.find(',', pos);
    const std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (tok.size() != 1 || tok[0] < '0' || tok[0] > '3')
      throw zp::InputError("--stages", "", fmt::format("expected a comma-separated list of 0, 1, 2, 3, got '{}'", s));
    out.push_back(tok[0] - '0');
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// The first argument when it names no subcommand: "zeroplan nosuch", "zeroplan nosuch --help".
// CLI11 would say "A subcommand is required", or print the main help with exit 0, so this is
// answered before parsing: unknown, with the closest name. The names come from the parser, so
// every subcommand registered on `app` is known without a list here.
std::optional<std::string> unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2) return std::nullopt;
  const std::string first = argv[1];
  if (first.empty() || first[0] == '-') return std::nullopt;  // --help, or an option CLI11 will judge
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
    for (const auto& a : sub->get_aliases()) names.push_back(a);
  }
  for (const auto& n : names)
    if (n == first) return std::nullopt;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  std::string msg = fmt::format("unknown subcommand '{}'", zp::json::printable(first));
  if (const std::string near = zp::json::closest(first, names); !near.empty()) {
    msg += fmt::format("; did you mean '{}'?", near);
  } else {
    // Nothing within a typo's distance: still name the nearest one.
    const auto best = std::min_element(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
      return zp::json::edit_distance(first, a) < zp::json::edit_distance(first, b);
    });
    if (best != names.end()) msg += fmt::format("; the closest subcommand is '{}'", *best);
  }
  msg += fmt::format(" (subcommands: {}; zeroplan --help describes them)", list);
  return msg;
}

void add_common(CLI::App* c, zp::cli::SimRequest& r, std::string& micro, std::string& seq) {
  c->add_option("--model", r.model, "catalogue name or hub id (zeroplan models), or path to a HF config.json")->required();
  c->add_option("--ds-config", r.ds_config, "DeepSpeed config JSON (default: DeepSpeed's defaults)");
  c->add_option("--gpus", r.gpus, "data-parallel world size N (default: the cluster's GPUs)");
  c->add_option("--gpu", r.gpu, "GPU type for --gpus N (zeroplan devices)");
  c->add_option("--cluster", r.cluster, "cluster preset (zeroplan clusters), JSON file or NCCL topology XML");
  c->add_option("--nodes", r.nodes, "multiply the cluster's node across an InfiniBand fabric");
  c->add_option("--nic-gbps", r.nic_gbps, "NIC speed in Gb/s for --nodes");
  c->add_option("--interference", r.interference, "compute slowdown while communication overlaps (default: device profile)");
  c->add_option("--profile", r.profile, "a cluster profile (zeroplan calibrate --out): its fitted coefficients and interval");
  c->add_option("--host-probe-us", r.host_probe_us, zp::cli::host_probe_help());
  c->add_option("--micro-batch", micro, "override train_micro_batch_size_per_gpu (GAS follows)");
  c->add_option("--seq-len", seq, "sequence length (default: the model's max positions)");
  c->add_flag("--activation-checkpointing", r.activation_checkpointing, "per-layer activation checkpointing");
  c->add_flag("--json", r.json, "machine-readable output");
  c->add_option("--attention", r.attention, zp::cli::attention_help());
  c->add_option("--transformers", r.transformers, zp::cli::transformers_help());
  c->add_flag("--keep-output", r.keep_output, zp::cli::keep_output_help());
  zp::cli::add_variant_flags(c, r.variants);
  c->add_option("--rank", r.rank, "rank to simulate (default: the one with the most rank-dependent bytes)");
}

std::int64_t parse_positive(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || x < 1) throw zp::InputError(flag, "", fmt::format("must be an integer >= 1, got '{}'", v));
  return x;
}

void apply_numbers(zp::cli::SimRequest& r, const std::string& micro, const std::string& seq) {
  if (!micro.empty()) r.micro_batch = parse_positive("--micro-batch", micro);
  if (!seq.empty()) r.seq_len = parse_positive("--seq-len", seq);
}

void print_warnings(const std::vector<std::string>& ws) {
  for (const auto& w : ws) std::fprintf(stderr, "warning: %s\n", w.c_str());
}

}  // namespace

// A command every rank runs under mpirun (train, collectives --measure): bad input that every
// rank saw is reported once, by rank 0, a refusal of some ranks only by those ranks (both exit
// status 2 on every rank); any other failure ends every rank through the communicator.
template <class Body>
int on_every_rank(zp::exec::Comm& comm, Body&& body) {
  try {
    body();
  } catch (const zp::InputError& e) {
    if (comm.rank() == 0) std::fprintf(stderr, "zeroplan: %s\n", e.what());
    return zp::kExitBadInput;
  } catch (const zp::exec::RankRefused&) {
    return zp::kExitBadInput;  // the refusing ranks printed why
  } catch (const std::exception& e) {
    comm.abort(fmt::format("internal error: {}", e.what()));
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"zeroplan: predicts the memory and time of DeepSpeed ZeRO training (stages 0-3, offload, buckets) on a "
               "cluster from a Hugging Face config.json and a ds_config, explains the difference between two "
               "configurations, plans the best one, trains it for real on CPU ranks, and compares the prediction "
               "with the measurement"};
  app.require_subcommand(1);

  zp::cli::SimRequest sim_req;
  std::string sim_stages, sim_micro, sim_seq;
  auto* sim = app.add_subcommand("simulate", "predict per-stage device memory of one optimizer step");
  add_common(sim, sim_req, sim_micro, sim_seq);
  sim->add_option("--stages", sim_stages, "comma-separated stages to simulate, e.g. 0,1,2,3 (default: the config's)");
  sim->add_option("--trace", sim_req.trace, "write a Chrome trace (Perfetto, chrome://tracing) of each stage");
  sim->add_flag("--critical-path", sim_req.critical_path,
                "show the critical path: its longest events (table), every event on it (--json)");
  sim->add_option("--executor", sim_req.executor,
                  "also predict the device memory of zeroplan's own executor on this program: cuda (train --device "
                  "cuda, NCCL) or cuda-mpi (--comm mpi): its scratch and the device-used bytes its driver reports");
  sim->add_flag("--executor-workspaces", sim_req.executor_workspaces,
                "with --executor: the run holds the cuBLAS/cuBLASLt workspaces PyTorch keeps on this GPU (train "
                "--workspaces-of it); default: none, as train runs");
  sim->add_option("--ranks-per-gpu", sim_req.ranks_per_gpu,
                  "--executor cuda-mpi: ranks 0..K-1 share GPU 0 (train --comm mpi on one GPU); also predict the whole "
                  "GPU's device-used bytes, the sum of theirs");
  sim->add_option("--attention-kernel", sim_req.attention_kernel,
                  "with --executor: the fused attention's kernels the run takes (train --attention-kernel): own or "
                  "cudnn, whose backward's workspace the executor's scratch then holds")
      ->default_str("own");

  zp::cli::ExplainRequest ex_req;
  std::string ex_micro, ex_seq;
  std::string stage_a, stage_b;
  auto* ex = app.add_subcommand("explain", "explain the memory difference between two stages or two configs");
  add_common(ex, ex_req.base, ex_micro, ex_seq);
  ex->add_option("--stage", stage_a, "stage A (default: the config's)");
  ex->add_option("--vs-stage", stage_b, "stage B");
  ex->add_option("--vs-ds-config", ex_req.vs_ds_config, "config B");

  std::string coll_cluster, coll_min = "8", coll_max = "1G", coll_ops = "all";
  std::optional<int> coll_ranks, coll_nodes;
  std::optional<double> coll_nic;
  double coll_factor = 2.0;
  bool coll_json = false;
  auto* coll = app.add_subcommand("collectives", "predicted nccl-tests-style sweep of collectives on a cluster");
  coll->add_option("--cluster", coll_cluster, "cluster preset, JSON file or NCCL topology XML")->required();
  coll->add_option("--nodes", coll_nodes, "multiply the cluster's node across an InfiniBand fabric");
  coll->add_option("--nic-gbps", coll_nic, "NIC speed in Gb/s for --nodes");
  coll->add_option("--ranks", coll_ranks, "ranks taking part (default: every GPU of the cluster)");
  coll->add_option("--min,-b", coll_min, "smallest message (bytes, K/M/G suffixes)");
  coll->add_option("--max,-e", coll_max, "largest message");
  coll->add_option("--factor,-f", coll_factor, "size multiplier between steps");
  coll->add_option("--ops", coll_ops, "all, or a comma-separated list: all_reduce,all_gather,reduce_scatter,...");
  coll->add_flag("--json", coll_json, "machine-readable output");
  bool coll_measure = false;
  zp::cli::MeasureOptions coll_mo;
  coll->add_flag("--measure", coll_measure,
                 "measure the sweep between this job's ranks (mpirun -np N), beside the prediction for N ranks of --cluster");
  coll->add_option("--device", coll_mo.device, "--measure: cuda (NCCL between the ranks' GPUs), cpu (MPI between host buffers) "
                                               "or auto (default: cuda when a GPU is visible)");
  coll->add_option("--iters", coll_mo.iters, "--measure: timed calls per size (default 20)");
  coll->add_option("--warmup", coll_mo.warmup, "--measure: untimed calls per size first (default 5)");
  coll->add_option("--out", coll_mo.out, "--measure: also write the measurements in nccl-tests' format (calibrate --nccl-tests reads it)");
  coll->add_option("--comm-timeout", coll_mo.timeout_s, "--measure: seconds a collective may take before the job is ended (default 600)");

  zp::exec::TrainOptions tr;
  std::string tr_seq, tr_limit, tr_micro;
  auto* train = app.add_subcommand("train", "train the model for real with the config's ZeRO stage on CPU ranks "
                                            "(run under mpirun -np N) and measure memory, bytes and time");
  train->add_option("--model", tr.model, "catalogue name or hub id (zeroplan models), or path to a HF config.json")->required();
  train->add_option("--ds-config", tr.ds_config, "DeepSpeed config JSON (default: DeepSpeed's defaults)");
  train->add_option("--steps", tr.steps, "optimizer steps (default 10)");
  train->add_option("--seed", tr.seed, "seed for initial weights, data and dropout (default 1234)");
  train->add_option("--data", tr.data, "synthetic (default) or a file of uint16 token ids");
  train->add_option("--seq-len", tr_seq, "sequence length (default: the model's max positions)");
  train->add_option("--micro-batch", tr_micro, "override train_micro_batch_size_per_gpu (GAS follows)");
  train->add_flag("--activation-checkpointing", tr.activation_checkpointing, "per-layer activation checkpointing");
  train->add_option("--attention", tr.attention, zp::cli::attention_help());
  train->add_option("--transformers", tr.transformers, zp::cli::transformers_help());
  train->add_flag("--keep-output", tr.keep_output, zp::cli::keep_output_help());
  zp::cli::add_variant_flags(train, tr.variants);
  std::string tr_workspaces_of;
  train->add_option("--workspaces-of", tr_workspaces_of,
                    "allocate the cuBLAS/cuBLASLt workspaces PyTorch keeps on this GPU (zeroplan devices), so the "
                    "measured bytes equal simulate's prediction for it (default: none, as on a CPU)");
  train->add_option("--memory-limit", tr_limit, "device bytes that may be live at once (K/M/G suffixes)");
  train->add_option("--out", tr.out, "measurements JSON (FILE.rankR.json per rank when N > 1)");
  train->add_flag("--quiet", tr.quiet, "no per-step lines");
  train->add_option("--trace", tr.trace, "Chrome trace of the last step, same layout and event ids as simulate --trace");
  train->add_option("--checkpoint-dir", tr.checkpoint_dir, "save ZeRO-layout checkpoints here (global_stepN/, latest)");
  train->add_option("--save-every", tr.save_every, "save every K steps (default: at the end)");
  train->add_flag("--resume", tr.resume, "continue from the latest checkpoint in --checkpoint-dir");
  train->add_option("--init-weights", tr.init_weights, "initial parameters from a safetensors file, by Hugging Face name (e.g. a save_pretrained model.safetensors)");
  train->add_option("--save-weights", tr.save_weights, "write the parameters after training as safetensors (F32, Hugging Face names)");
  train->add_option("--save-batch", tr.save_batch, "write step 1's micro-batches (rank 0) as JSON, by input name");
  train->add_option("--device", tr.device, "cpu (default) or cuda: the step program on one GPU per rank (the local rank's)");
  train->add_flag("--allow-tf32", tr.allow_tf32, "--device cuda: fp32 GEMMs on TF32 tensor cores (off: exact fp32)");
  train->add_option("--attention-kernel", tr.attention_kernel,
                    "--device cuda: the 16-bit fused attention's kernels: own (kernels/cuda/sdpa; dropout masks "
                    "equal to the CPU device's) or cudnn (cuDNN's flash attention; its own dropout masks)")
      ->default_str("own");
  train->add_option("--comm", tr.comm, "auto (default), nccl or mpi: the collectives' backend; auto takes NCCL with "
                                       "--device cuda when every rank has its own GPU, else MPI (through host memory)");
  train->add_option("--comm-timeout", tr.comm_timeout, "seconds a collective may take once this rank (its GPU, for NCCL) "
                                                       "reaches it before every rank is ended with a message (default 600)");

  zp::cli::CompareRequest cmp_req;
  auto* cmp = app.add_subcommand("compare", "lay a prediction (simulate --json) beside a measurement (train --out) "
                                            "of the same configuration: memory, bytes and time");
  cmp->add_option("--predicted", cmp_req.predicted, "simulate --json output")->required();
  cmp->add_option("--measured", cmp_req.measured, "train --out measurements of one rank (FILE.rankR.json)")->required();
  cmp->add_flag("--json", cmp_req.json, "machine-readable output");

  zp::cli::PlanRequest plan_req;
  std::string plan_seq, plan_global;
  auto* pl = app.add_subcommand("plan", "find the best ZeRO stage, buckets and micro-batch for a model on a cluster, "
                                        "and write its ds_config");
  pl->add_option("--model", plan_req.base.model, "catalogue name or hub id (zeroplan models), or path to a HF config.json")->required();
  pl->add_option("--ds-config", plan_req.base.ds_config, "BASE.json: kept as is except the searched keys");
  pl->add_option("--cluster", plan_req.base.cluster, "cluster preset (zeroplan clusters), JSON file or NCCL topology XML");
  pl->add_option("--nodes", plan_req.base.nodes, "multiply the cluster's node across an InfiniBand fabric");
  pl->add_option("--nic-gbps", plan_req.base.nic_gbps, "NIC speed in Gb/s for --nodes");
  pl->add_option("--gpus", plan_req.base.gpus, "ranks (default: the cluster's GPUs); with --gpu: one node of N");
  pl->add_option("--gpu", plan_req.base.gpu, "GPU type for --gpus N (zeroplan devices)");
  pl->add_option("--profile", plan_req.base.profile,
                 "a cluster profile (zeroplan calibrate --out): its coefficients; candidates within its interval are ties");
  pl->add_option("--host-probe-us", plan_req.base.host_probe_us, zp::cli::host_probe_help());
  pl->add_option("--global-batch", plan_global, "train_batch_size (default: BASE.json's)");
  pl->add_option("--seq-len", plan_seq, "sequence length (default: the model's max positions)");
  pl->add_option("--attention", plan_req.base.attention, zp::cli::attention_help());
  pl->add_option("--transformers", plan_req.base.transformers, zp::cli::transformers_help());
  pl->add_flag("--keep-output", plan_req.base.keep_output, zp::cli::keep_output_help());
  pl->add_flag("--activation-checkpointing", plan_req.base.activation_checkpointing,
               "the model checkpoints activations (the base value when checkpointing is not searched)");
  pl->add_option("--objective", plan_req.objective, "throughput (default), memory, or cost");
  pl->add_option("--price-per-gpu-hour", plan_req.price, "for --objective cost (default 1: GPU-hours)");
  pl->add_option("--memory-headroom", plan_req.headroom, "fraction of device and host memory a plan may use, in (0, 1] (default 0.9)");
  pl->add_option("--search", plan_req.search, "comma-separated dimensions to search (default: all); the rest come from BASE.json");
  auto* plan_top = pl->add_option("--top", plan_req.top, "rows of the ranked table (default 10); with --verify, the candidates verified");
  pl->add_option("--out", plan_req.out, "write the winner's ds_config here");
  pl->add_option("--threads", plan_req.threads, "threads (default 0: every core)");
  pl->add_flag("--exhaustive", plan_req.exhaustive, "simulate every point of the grid instead of searching");
  pl->add_flag("--explain", plan_req.explain, "add the full explain of the runner-up vs the winner");
  pl->add_flag("--verify", plan_req.verify, "run the executor on the top candidates and compare");
  auto* plan_verify_top = pl->add_option("--verify-top", plan_req.verify_top, "candidates to verify (default: --top if given, else 3)");
  pl->add_option("--verify-steps", plan_req.verify_steps, "steps per verified candidate (default 3)");
  pl->add_option("--verify-max-minutes", plan_req.verify_max_minutes,
                 "skip candidates the CPU executor would need longer for (default 10)");
  pl->add_option("--verify-device", plan_req.verify_device, "where --verify trains: cpu, cuda, or auto (default: cuda when a GPU is visible, else cpu)");
  pl->add_option("--verify-attention-kernel", plan_req.verify_attention_kernel,
                 "where --verify trains on GPUs: their fused attention's kernels (train --attention-kernel): own or "
                 "cudnn; the executor's predictions price that kernel")
      ->default_str("own");
  pl->add_option("--verify-launcher", plan_req.verify_launcher, "rank launcher, {N} = ranks (default: mpirun --oversubscribe -np {N})");
  pl->add_flag("--json", plan_req.base.json, "machine-readable output");

  zp::cli::CalibrateRequest cal;
  std::string cal_seq, cal_micro;
  bool cal_list = false;
  auto* calib = app.add_subcommand("calibrate", "fit the simulator's coefficients to measurements (nccl-tests, DeepSpeed "
                                                "logs and runs, train --out, or micro-benchmarks on this machine's GPUs) "
                                                "and write a cluster profile for --profile");
  calib->add_option("--nccl-tests", cal.nccl_tests, "nccl-tests output (FILE or KIND=FILE, e.g. all_reduce=ar.txt); repeatable");
  calib->add_option("--deepspeed-log", cal.deepspeed_logs,
                    "a DeepSpeed training log with wall_clock_breakdown (with --model, --ds-config, --seq-len); repeatable");
  calib->add_option("--deepspeed-runs", cal.deepspeed_runs,
                    "recorded DeepSpeed runs (tests/data/deepspeed/*.json) or a list of logs with their configs; repeatable");
  calib->add_option("--train-out", cal.train_out, "a `zeroplan train --out` measurement of one rank; repeatable");
  calib->add_option("--observations", cal.observations, "kernel and collective observations --save-observations wrote "
                                                        "(e.g. a GPU machine's --device cuda run); repeatable");
  calib->add_option("--save-observations", cal.save_observations, "write the kernel and collective observations "
                                                                  "(the device's micro-benchmarks) here, to refit later");
  calib->add_option("--device", cal.device, "cuda: micro-benchmarks on this machine's GPUs (the GEMMs and ops of --model, "
                                            "collectives through NCCL)");
  calib->add_option("--budget", cal.budget_minutes, "--device: minutes the benchmarks may take (default 5)");
  calib->add_option("--model", cal.model, "the model a log or train --out ran, or --device measures");
  calib->add_option("--ds-config", cal.ds_config, "the ds_config the DeepSpeed log ran with");
  calib->add_option("--seq-len", cal_seq, "sequence length of the run (default: the model's max positions)");
  calib->add_option("--micro-batch", cal_micro, "override train_micro_batch_size_per_gpu (GAS follows)");
  calib->add_option("--attention", cal.attention, zp::cli::attention_help());
  calib->add_flag("--activation-checkpointing", cal.activation_checkpointing, "the run checkpointed activations");
  calib->add_option("--skip-steps", cal.skip_steps, "DeepSpeed steps left out as warm-up (default 1)");
  calib->add_option("--cluster", cal.cluster, "the cluster the measurements ran on: preset, JSON file or NCCL topology XML");
  calib->add_option("--nodes", cal.nodes, "multiply the cluster's node across its fabric");
  calib->add_option("--nic-gbps", cal.nic_gbps, "NIC speed in Gb/s for --nodes");
  calib->add_option("--gpus", cal.gpus, "one node of N GPUs (with --gpu) instead of --cluster");
  calib->add_option("--gpu", cal.gpu, "GPU type for --gpus N (zeroplan devices)");
  calib->add_option("--fit", cal.fit, "parameters to fit: names and groups (compute, host, collective, collective-detail, "
                                      "all); default: what the data can determine");
  calib->add_option("--fit-where", cal.fit_where, "fit only observations with these tags (KEY=V1|V2,KEY=...; "
                                                  "alternatives separated by ';'); the rest are held out and reported");
  calib->add_option("--profile", cal.start_profile, "start from this cluster profile instead of the defaults");
  calib->add_option("--threads", cal.threads, "threads for the fit (default 0: every core)");
  calib->add_option("--out", cal.out, "write the cluster profile here (calibration/profiles/NAME.json)");
  calib->add_flag("--report", cal.report, "each source's fit: measured vs predicted per size, kernel and phase");
  calib->add_flag("--list-params", cal_list, "list every parameter calibration can fit, and what determines it");
  calib->add_flag("--json", cal.json, "machine-readable output");

  zp::cli::ReportRequest rep_req;
  auto* rep = zp::cli::add_report_command(app, rep_req);

  auto* clusters = app.add_subcommand("clusters", "list the cluster presets");
  auto* models = app.add_subcommand("models", "list the model catalogue");
  auto* devices = app.add_subcommand("devices", "list the device database");

  if (const auto unknown = unknown_subcommand(app, argc, argv)) {
    std::fprintf(stderr, "zeroplan: %s\n", unknown->c_str());
    return zp::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "zeroplan: %s\n", e.what());
    return zp::kExitBadInput;
  }

  if (*train) {
    // MPI starts here (singleton runs work without mpirun). Bad input is reported once,
    // by rank 0, with exit status 2 on every rank; failures later abort every rank.
    auto comm = zp::exec::make_mpi_comm(&argc, &argv);
    return on_every_rank(*comm, [&] {
      if (!tr_seq.empty()) tr.seq_len = parse_positive("--seq-len", tr_seq);
      if (!tr_micro.empty()) tr.micro_batch = parse_positive("--micro-batch", tr_micro);
      if (!tr_limit.empty()) tr.memory_limit = zp::cli::parse_size("--memory-limit", tr_limit);
      if (!tr_workspaces_of.empty()) {
        const auto& dev = zp::sim::find_device(tr_workspaces_of);
        tr.cublas_workspace = dev.cublas_workspace;
        tr.cublaslt_workspace = dev.cublaslt_workspace;
      }
      if (const auto m = zp::models::load_model(tr.model); !m.rope_type.empty())
        throw zp::InputError(m.source, "rope_scaling",
                             fmt::format("rope_type \"{}\" rescales the rotary frequencies, which the CPU executor does "
                                         "not apply (simulate and plan model the run: it changes neither memory nor "
                                         "time); train a config.json without rope_scaling",
                                         m.rope_type));
      zp::exec::train(tr, *comm);
    });
  }

  if (*coll && coll_measure) {
    // Under mpirun: every rank takes part. What one rank finds wrong (a cluster file it cannot
    // read, an output it cannot write) is agreed on before any rank goes on, so every rank
    // stops with exit 2 and rank 0 prints the one line.
    auto comm = zp::exec::make_mpi_comm(&argc, &argv);
    return on_every_rank(*comm, [&] {
      std::string refused;
      std::optional<zp::sim::ClusterSpec> cluster;
      std::vector<zp::zero::CollKind> kinds;
      zp::Bytes lo{0}, hi{0};
      try {
        cluster = zp::sim::load_cluster(coll_cluster, coll_nodes, coll_nic);
        if (coll_ranks && *coll_ranks != comm->size())
          throw zp::InputError("--ranks", "", fmt::format("--measure runs over this job's {} ranks, got --ranks {}",
                                                          comm->size(), *coll_ranks));
        lo = zp::cli::parse_size("--min", coll_min);
        hi = zp::cli::parse_size("--max", coll_max);
        // "all": every collective the communicators run (all_to_all is not one of them).
        kinds = zp::cli::parse_coll_kinds("--ops", coll_ops);
        std::string ops = coll_ops;
        std::transform(ops.begin(), ops.end(), ops.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (ops == "all") std::erase(kinds, zp::zero::CollKind::all_to_all);
        if (!coll_mo.out.empty() && comm->rank() == 0) {  // rank 0 writes it; said before the sweep, not after
          const std::filesystem::path out(coll_mo.out);
          const auto dir = out.parent_path().empty() ? std::filesystem::path(".") : out.parent_path();
          if (std::filesystem::is_directory(out) || !std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0)
            throw zp::InputError(coll_mo.out, "", "--out: cannot write the file there (no such directory, not writable, or a directory)");
        }
      } catch (const zp::InputError& e) {
        refused = e.what();
      }
      zp::exec::agree_on_refusals(*comm, refused, "its input");
      coll_mo.json = coll_json;
      std::cout << zp::cli::measure_collectives(*comm, *cluster, lo, hi, coll_factor, kinds, coll_mo);
    });
  }

  try {
    if (*sim) {
      apply_numbers(sim_req, sim_micro, sim_seq);
      if (!sim_stages.empty()) sim_req.stages = parse_stages(sim_stages);
      const auto in = zp::cli::load_inputs(sim_req);
      zp::cli::check_output(sim_req.trace, "--trace", sim_req, in);
      print_warnings(in.warnings);
      const auto rs = zp::cli::simulate(in, sim_req);
      if (!sim_req.trace.empty())
        zp::io::write_atomic(sim_req.trace, zp::cli::simulate_trace(rs).dump() + "\n", "--trace");
      if (sim_req.json) std::cout << zp::cli::simulate_json(in, rs, sim_req.critical_path).dump(2) << "\n";
      else std::cout << zp::cli::simulate_table(in, rs, sim_req.critical_path);
    } else if (*ex) {
      apply_numbers(ex_req.base, ex_micro, ex_seq);
      auto stage_arg = [](const std::string& flag, const std::string& v) {
        if (v.empty()) return -1;
        if (v.size() != 1 || v[0] < '0' || v[0] > '3')
          throw zp::InputError(flag, "", fmt::format("must be one of 0, 1, 2, 3, got '{}'", v));
        return v[0] - '0';
      };
      ex_req.stage_a = stage_arg("--stage", stage_a);
      ex_req.stage_b = stage_arg("--vs-stage", stage_b);
      const auto e = zp::cli::explain(ex_req);
      print_warnings(e.warnings);
      if (ex_req.base.json) std::cout << e.json.dump(2) << "\n";
      else std::cout << e.text;
    } else if (*pl) {
      if (!plan_seq.empty()) plan_req.base.seq_len = parse_positive("--seq-len", plan_seq);
      if (!plan_global.empty()) plan_req.global_batch = parse_positive("--global-batch", plan_global);
      if (plan_top->count() > 0 && plan_verify_top->count() == 0) plan_req.verify_top = plan_req.top;
      const auto o = zp::cli::run_plan(plan_req, argv[0]);
      print_warnings(o.warnings);
      if (plan_req.base.json) std::cout << o.json.dump(2) << "\n";
      else std::cout << o.text;
      return o.exit_code;
    } else if (*coll) {
      for (const char* flag : {"--device", "--iters", "--warmup", "--out", "--comm-timeout"})
        if (coll->count(flag) > 0) throw zp::InputError(flag, "", "needs --measure (the measured sweep under mpirun)");
      const auto cluster = zp::sim::load_cluster(coll_cluster, coll_nodes, coll_nic);
      const int ranks = coll_ranks.value_or(cluster.nodes * cluster.gpus_per_node);
      const auto lo = zp::cli::parse_size("--min", coll_min), hi = zp::cli::parse_size("--max", coll_max);
      const auto kinds = zp::cli::parse_coll_kinds("--ops", coll_ops);
      if (coll_json) std::cout << zp::cli::collectives_json(cluster, ranks, lo, hi, coll_factor, kinds).dump(2) << "\n";
      else std::cout << zp::cli::collectives_table(cluster, ranks, lo, hi, coll_factor, kinds);
    } else if (*calib) {
      if (cal_list) {
        std::cout << zp::cli::params_table();
        return 0;
      }
      if (!cal_seq.empty()) cal.seq_len = parse_positive("--seq-len", cal_seq);
      if (!cal_micro.empty()) cal.micro_batch = parse_positive("--micro-batch", cal_micro);
      std::optional<zp::calibration::ProgressBar> bar;
      zp::calibration::Progress progress;
      if (!cal.device.empty()) {
        bar.emplace(isatty(fileno(stderr)) != 0, cal.budget_minutes * 60);
        progress = [&bar](double f, const std::string& what) { (*bar)(f, what); };
      }
      const auto o = zp::cli::run_calibrate(cal, progress);
      if (bar) bar->finish();
      print_warnings(o.warnings);
      if (cal.json) std::cout << o.json.dump(2) << "\n";
      else std::cout << o.text;
    } else if (*rep) {
      rep_req.command = zp::cli::report_command_line(argc, argv);
      const auto o = zp::cli::run_report(rep_req, argv[0]);
      print_warnings(o.warnings);
      std::cout << o.summary;
    } else if (*cmp) {
      const auto c = zp::cli::compare(cmp_req);
      if (cmp_req.json) std::cout << c.json.dump(2) << "\n";
      else std::cout << c.text;
    } else if (*clusters) {
      for (const auto& n : zp::sim::cluster_preset_names()) {
        const auto c = zp::sim::load_cluster(n);
        std::cout << fmt::format("{:<24} {} x {} per node, {} node(s)\n", n, c.gpus_per_node, c.gpu, c.nodes);
      }
    } else if (*models) {
      const auto ids = zp::models::hub_ids();
      for (const auto& n : zp::models::catalog_names()) {
        const auto m = zp::models::load_model(n);
        // Parameters counted on a one-token graph (the count does not depend on the shape).
        zp::models::GraphOptions go;
        go.seq_len = 1;
        const std::int64_t params = zp::models::build_graph(m, go).param_count();
        std::string hub;
        for (const auto& [id, name] : ids)
          if (name == n) hub += (hub.empty() ? "" : ", ") + id;
        std::cout << fmt::format("{:<18} {:<8} {:>15} params  layers {:>3}  hidden {:>5}  heads {:>3}/{:<3} vocab {:>6}  {}\n",
                                 n, m.model_type, fmt::group_digits(params), m.layers, m.hidden, m.heads, m.kv_heads,
                                 m.vocab, hub);
      }
    } else if (*devices) {
      for (const auto& d : zp::sim::devices())
        std::cout << fmt::format("{:<12} {:>9.2f} GiB  {:>6.0f} TFLOP/s  {:>6.0f} GB/s  context {:.0f} MiB\n", d.name,
                                 d.memory.gib(), d.peak_tensor_flops.v / 1e12, d.hbm_bandwidth.v / 1e9,
                                 d.context_overhead.mib());
    }
  } catch (const zp::InputError& e) {
    std::fprintf(stderr, "zeroplan: %s\n", e.what());
    return zp::kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zeroplan: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
