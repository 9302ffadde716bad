#!/usr/bin/env python3
"""Writes the FIXTURES of tests/data/calibration/: measurements of a cluster unlike the presets,
made up for zeroplan's tests, not measured (README.md in this folder says what they stand for).

The cluster: 16 nodes of 8 A100-80GB on NVSwitch, whose nodes talk through one 100 Gb/s
Ethernet (RoCE) link each instead of the 8 x 200 Gb/s HDR the preset 8xA100-80GB-NVSwitch
assumes. The nccl-tests tables follow

    t(S) = alpha + S·f / B + gamma·sqrt(S·f / B)      (f: nccl-tests' busbw factor)

(a latency, a bandwidth and a pipeline term; not zeroplan's own form), with the constants
below, a deterministic ±2% wobble, and nccl-tests' own rounding and layout (src/util.cu:
getFloatStr, writeBenchmarkLinePreamble/Body, the device lines, the footer). The DeepSpeed
log's phase times come from `zeroplan simulate` under a "truth" profile (the collective
factors calibrated from those tables, GEMMs at 0.7 of peak), step to step ±3%, laid out as
DeepSpeed 0.19.8 prints its start-up, configuration and wall_clock_breakdown lines
(utils/logging.py, runtime/config.py, utils/timer.py).

Usage: python3 tests/data/calibration/make_fixtures.py build-ci/cli/zeroplan
"""
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BUS = ["0000:07:00", "0000:0f:00", "0000:47:00", "0000:4e:00", "0000:87:00", "0000:90:00", "0000:b7:00", "0000:bd:00"]
NCCL_CODE = 22603  # NCCL 2.26.3
HEADER = ("# FIXTURE: hand-made for zeroplan's tests (tests/data/calibration/README.md), not a measurement.\n"
          "# It follows nccl-tests 2.17's output; the times follow a stated formula (make_fixtures.py).\n")


def wobble(i, amp):
    """A deterministic pseudo-random factor in [1 - amp, 1 + amp]."""
    x = math.sin(12.9898 * (i + 1) + 78.233) * 43758.5453
    return 1 + amp * (2 * (x - math.floor(x)) - 1)


def fstr(v, width):
    """nccl-tests' getFloatStr: %.2f, else %.1f, else %.0f, else %.1e, within `width`."""
    for fmt in ("{:%d.2f}", "{:%d.1f}", "{:%d.0f}"):
        s = (fmt % width).format(v)
        if len(s) <= width:
            return s
    return ("{:%d.1e}" % width).format(v)


def table(test, op, nodes, gpn, alpha, busbw, gamma, sizes, seed):
    n = nodes * gpn
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}[op]
    out = [HEADER,
           f"# nccl-tests version 2.17.1 nccl-headers={NCCL_CODE} nccl-library={NCCL_CODE}\n",
           f"# Collective test starting: {test}\n",
           f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 4(factor) warmup iters: 5 iters: 20 "
           "agg iters: 1 validation: 1 graph: 0 unalign: 0\n",
           "#\n", "# Using devices\n"]
    pid = 41021
    for node in range(nodes):
        for d in range(gpn):
            r = node * gpn + d
            out.append(f"#  Rank {r:2d} Group  0 Pid {pid + r:6d} on {'gpu-node%02d' % (node + 1):>10s} device {d:2d} "
                       f"[{BUS[d]}] NVIDIA A100-SXM4-80GB\n")
    out.append("#\n")
    out.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n" % ("", "", "", "", ""))
    out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n" % (
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"))
    out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n" % (
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""))
    bws = []
    for i, s in enumerate(sizes):
        count = s // 4
        if op != "all_reduce":  # per-rank count, aligned to 16 bytes (AllGatherGetCollByteCount)
            count = (count // n) & ~3
            s = count * 4 * n
        row = "%12d  %12d  %8s  %6s  %6d" % (s, count, "float", "sum" if op != "all_gather" else "none", -1)
        for place in range(2):
            t = alpha + s * factor / busbw + gamma * math.sqrt(s * factor / busbw)
            t *= wobble(seed + 2 * i + place, 0.02)
            us = t * 1e6
            algbw = s / t / 1e9
            row += "  %7s  %6s  %6s  %6g" % (fstr(us, 7), fstr(algbw, 6), fstr(algbw * factor, 6), 0)
            if place == 0:
                bws.append(algbw * factor)
        out.append(row + "\n")
    out.append("# Out of bounds values : 0 OK\n")
    out.append("# Avg bus bandwidth    : %g \n" % (sum(bws) / len(bws)))
    out.append("#\n")
    out.append(f"# Collective test concluded: {test}\n")
    return "".join(out)


def write(name, text):
    with open(os.path.join(HERE, name), "w") as f:
        f.write(text)


def main():
    zeroplan = sys.argv[1] if len(sys.argv) > 1 else "build-ci/cli/zeroplan"
    sizes = [1024 * 4 ** k for k in range(12)]  # 1 KiB .. 4 GiB
    # 16 nodes: the Ethernet link bounds every ring; its hops are slower than InfiniBand's (an
    # all-reduce of a few KiB takes a tree, 118 us; an all-gather's ring of 128 ranks, 262 us).
    write("fixture_slow_fabric_all_reduce.txt",
          table("all_reduce_perf", "all_reduce", 16, 8, 118e-6, 10.4e9, 2.2e-6, sizes, 1))
    write("fixture_slow_fabric_all_gather.txt",
          table("all_gather_perf", "all_gather", 16, 8, 262e-6, 10.9e9, 2.0e-6, sizes, 101))
    write("fixture_slow_fabric_reduce_scatter.txt",
          table("reduce_scatter_perf", "reduce_scatter", 16, 8, 271e-6, 10.7e9, 2.1e-6, sizes, 201))
    # One node: NVSwitch, about what the model says of it.
    write("fixture_slow_fabric_all_reduce_1node.txt",
          table("all_reduce_perf", "all_reduce", 1, 8, 21e-6, 214e9, 0.9e-6, sizes, 301))

    cluster = ["--cluster", "8xA100-80GB-NVSwitch", "--nodes", "16"]
    with tempfile.TemporaryDirectory() as d:
        coll = os.path.join(d, "coll.json")
        subprocess.run([zeroplan, "calibrate", *cluster,
                        "--nccl-tests", os.path.join(HERE, "fixture_slow_fabric_all_reduce.txt"),
                        "--nccl-tests", os.path.join(HERE, "fixture_slow_fabric_all_gather.txt"),
                        "--nccl-tests", os.path.join(HERE, "fixture_slow_fabric_reduce_scatter.txt"),
                        "--nccl-tests", os.path.join(HERE, "fixture_slow_fabric_all_reduce_1node.txt"),
                        "--out", coll], check=True, capture_output=True)
        truth = json.load(open(coll))
        truth["device_profile"]["gemm_max_efficiency"] = 0.70
        truth["device_profile"]["elementwise_efficiency"] = 0.72
        truth_path = os.path.join(d, "truth.json")
        json.dump(truth, open(truth_path, "w"))
        cfg = os.path.join(HERE, "fixture_slow_fabric_ds_config.json")
        p = subprocess.run([zeroplan, "simulate", "--model", "gpt2-medium", "--ds-config", cfg, *cluster, "--seq-len",
                            "1024", "--profile", truth_path, "--json"], check=True, capture_output=True, text=True)
        t = json.loads(p.stdout)["results"][0]["time"]
    fwd, bwd, red, step = t["forward_ms"], t["backward_ms"], t["backward_allreduce_ms"], t["step_ms"]
    lines = ["FIXTURE: hand-made for zeroplan's tests (tests/data/calibration/README.md), not a measurement; laid out as "
             "DeepSpeed 0.19.8 prints.\n"]
    ts = "2026-11-30 14:02:%02d,%03d"
    lines.append("[%s] [INFO] [real_accelerator.py:260:get_accelerator] Setting ds_accelerator to cuda (auto detect)\n"
                 % (ts % (1, 417)))
    lines.append("[%s] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: version=0.19.8, git-hash=unknown, "
                 "git-branch=unknown\n" % (ts % (9, 112)))
    lines.append("[%s] [INFO] [engine.py:2369:_configure_optimizer] [Rank 0] DeepSpeed Final Optimizer = "
                 "DeepSpeedZeroOptimizer\n" % (ts % (11, 530)))
    lines.append("[%s] [INFO] [config.py:677:print] DeepSpeedEngine configuration:\n" % (ts % (11, 601)))
    for k, v in [("gradient_accumulation_steps", 1), ("train_batch_size", 1024), ("train_micro_batch_size_per_gpu", 8),
                 ("wall_clock_breakdown", True), ("world_size", 128), ("zero_enabled", True),
                 ("zero_optimization_stage", 1)]:
        lines.append("[%s] [INFO] [config.py:681:print]   %s %s %s\n" % (ts % (11, 602), k, "." * (29 - len(k)), v))
    for step_no in range(1, 7):
        warm = 1.8 if step_no == 1 else 1.0
        f = fwd * warm * wobble(step_no * 7, 0.03)
        r = red * warm * wobble(step_no * 7 + 1, 0.03)
        inner = (bwd - red) * warm * wobble(step_no * 7 + 2, 0.03)
        s = step * warm * wobble(step_no * 7 + 3, 0.03)
        lines.append("[Rank 0] time (ms) | fwd_microstep: %.2f | bwd_microstep: %.2f | bwd_inner_microstep: %.2f | "
                     "bwd_allreduce_microstep: %.2f | step_microstep: %.2f\n" % (f, inner + r, inner, r, s))
        lines.append("[Rank 0] time (ms) | fwd: %.2f | bwd: %.2f | bwd_inner: %.2f | bwd_allreduce: %.2f | step: %.2f\n"
                     % (f, inner + r, inner, r, s))
        lines.append("[%s] [INFO] [logging.py:107:log_dist] [Rank 0] step=%d, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]\n"
                     % (ts % (20 + step_no, 10 * step_no), step_no))
    write("fixture_slow_fabric_deepspeed.log", "".join(lines))


if __name__ == "__main__":
    main()
