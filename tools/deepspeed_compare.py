#!/usr/bin/env python3
"""Lay zeroplan's predictions beside DeepSpeed's measurements (tools/deepspeed_reference.py).

Reads DIR/meta.json and DIR/runs.jsonl, predicts every run with `zeroplan simulate --json` on the
preset of the GPU the runs were measured on (cluster_of: 1xH200-141GB, 1xH100-80GB; --cluster
overrides it) (same model config, ds_config, micro-batch, sequence length and attention), and prints one
table: measured, predicted and the error of the allocated peak, the reserved peak, device-used bytes,
the peak's moment, and the forward, backward, step and iteration wall times.

--write-reference FILE keeps what CI checks the simulator against (tests/data/deepspeed/): the
versions, the process constants and, per run, its inputs and measurements (no snapshots or traces).

--timing DIR... replaces each run's times by the pooled times of time-only rounds
(deepspeed_reference.py --time-only --rounds R, possibly several calls): the phases are the median
of every timed step of every round, the iteration the median of the rounds' iteration times. A run
measured only there joins with its times and no memory. --base FILE takes the runs (memory and
all) from an earlier reference file instead of a DIR of raw measurements.

Usage: deepspeed_compare.py DIR [--zeroplan build/cli/zeroplan] [--write-reference FILE] [--json OUT]
       deepspeed_compare.py --base tests/data/deepspeed/h200_deepspeed_0.19.8.json --timing D1 D2 ...
       (DIR of a several-rank run: one of its rankR/ folders)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MiB = 1 << 20


def model_arg(run_model):
    """The model as zeroplan takes it: a catalogue name when the config is one, else the path."""
    cat = os.path.join(ROOT, "models", "catalog", run_model)
    if os.path.exists(cat):
        return os.path.splitext(run_model)[0]
    local = os.path.join(ROOT, "tests", "data", "deepspeed", run_model)
    if os.path.exists(local):
        return local
    raise SystemExit(f"deepspeed_compare: no model config named {run_model} in models/catalog or tests/data/deepspeed")


def cluster_of(meta):
    """The single-GPU preset of the GPU a reference file names (meta.versions.gpu), and the
    node preset its several-rank runs are predicted on as one rank of."""
    gpu = meta.get("versions", {}).get("gpu", "")
    for key, one, node in (("H200", "1xH200-141GB", "8xH200-141GB-NVSwitch"),
                           ("H100", "1xH100-80GB", "8xH100-80GB-NVSwitch")):
        if key in gpu:
            return one, node
    raise SystemExit(f"deepspeed_compare: no preset for the GPU '{gpu}' the runs were measured on (give --cluster)")


def predict(zeroplan, run, clusters=("1xH200-141GB", "8xH200-141GB-NVSwitch"), profile=None):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(run["ds_config"], f)
        cfg = f.name
    trace = cfg + ".trace.json"
    try:
        n = run.get("world_size", 1)
        # Several ranks: that rank of an N-GPU node (memory is per rank; the times assume
        # NVLink, which ranks sharing one GPU over sockets do not have).
        cluster = ["--cluster", clusters[0]] if n == 1 else ["--cluster", clusters[1], "--gpus", str(n),
                                                             "--rank", str(run.get("rank", 0))]
        cmd = [zeroplan, "simulate", "--model", model_arg(run["model"]), "--ds-config", cfg, *cluster,
               "--seq-len", str(run["seq_len"]), "--attention", run["attention"], "--json", "--trace", trace]
        if run.get("keep_output"):
            cmd.append("--keep-output")
        if profile:
            cmd += ["--profile", profile]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
        r = json.loads(p.stdout)["results"][0]
        return {
            "peak_allocated": r["memory"]["peak_allocated_bytes"],
            "reserved": r["memory"]["reserved_bytes"],
            "device_used": r["memory"]["device_used_bytes"],
            "persistent": r["memory"]["persistent_bytes"],
            "peak_event": r["memory"]["peak_event"],
            "forward": r["time"]["forward_ms"] * 1e-3,
            "backward": r["time"]["backward_ms"] * 1e-3,
            "step": r["time"]["step_ms"] * 1e-3,
            "iteration": r["time"]["iteration_ms"] * 1e-3,
            "gpu": device_busy(trace),
            "gpu_by_class": device_by_class(trace),
        }
    finally:
        os.remove(cfg)
        if os.path.exists(trace):
            os.remove(trace)


# The program's phases as the reference's profile names them: the reduction's events and
# recomputation are backward's (DeepSpeed's hooks and checkpointing run them inside
# loss.backward()), the work after the step (stage 3's persistent parameters) is step()'s.
TRACE_PHASES = {"fwd": "forward", "bwd": "backward", "reduce": "backward", "recompute": "backward", "step": "step",
                "post_step": "step"}


def device_events(trace_path):
    """The predicted trace's device-stream slices (not the host thread's) as (phase, event), or
    None where the trace folds micro-steps into one slice (they have no phase: not comparable).
    The phases as timed, synchronised: the process of the iteration without the phases'
    synchronisations (simulate --trace writes one where it differs) is left out."""
    with open(trace_path) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    if any(e.get("cat") == "repeated" for e in events):
        return None
    host = {e["tid"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
            and e.get("args", {}).get("name") == "host"}
    unsynchronised = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                      and e.get("args", {}).get("unsynchronised")}
    out = []
    for e in events:
        phase = TRACE_PHASES.get(e.get("args", {}).get("phase"))
        if (e.get("ph") == "X" and e.get("tid") not in host and e.get("pid") not in unsynchronised
                and phase is not None and e.get("dur", 0) > 0):
            out.append((phase, e))
    return out


def device_busy(trace_path):
    """Seconds per phase during which the predicted trace keeps the GPU busy: the union of the
    intervals of its device streams' events, as the profiler's GPU busy time
    (profile.phases.*.gpu_busy_s of deepspeed_reference.py) counts kernels."""
    events = device_events(trace_path)
    if events is None:
        return {}
    spans = {}
    for phase, e in events:
        spans.setdefault(phase, []).append((e["ts"], e["ts"] + e["dur"]))
    busy = {}
    for phase, iv in spans.items():
        iv.sort()
        total, lo, hi = 0.0, None, None
        for a, b in iv:
            if hi is None or a > hi:
                total += (hi - lo) if hi is not None else 0.0
                lo, hi = a, b
            else:
                hi = max(hi, b)
        busy[phase] = (total + (hi - lo if hi is not None else 0.0)) * 1e-6  # the trace's microseconds
    return busy


def device_by_class(trace_path):
    """Seconds per phase and kernel class of the predicted trace's device events: each slice's
    "profiled" args, the simulator's own split of its time by the class a profiler names the
    kernels by (sim::profiled_split: deepspeed_reference.py's kernel_class; a linear op's bias
    kernels elementwise), summed as the profile's by_class_s sums kernel times."""
    events = device_events(trace_path)
    if events is None:
        return {}
    out = {}
    for phase, e in events:
        cls = out.setdefault(phase, {})
        for k, us in e.get("args", {}).get("profiled", {}).items():
            cls[k] = cls.get(k, 0.0) + us * 1e-6
    return out


INPUTS = ("model", "attention", "dtype", "stage", "micro_batch", "seq_len", "gas", "ds_config")


def read_runs(path):
    """The JSON lines of a runs.jsonl; a truncated last line (a job stopped mid-write) is skipped."""
    runs = []
    lines = open(path).read().split("\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:
            if k < len(lines) - 2:
                raise SystemExit(f"deepspeed_compare: {path}:{k + 1}: not a JSON line")
            print(f"deepspeed_compare: {path}:{k + 1}: truncated last line skipped", file=sys.stderr)
    return runs


def profile_fields(run):
    """A full run's GPU profile as the reference file keeps it: busy time and time per kernel class
    per phase, and the kernels that took the most (name cut to 160 characters, class, launches,
    seconds: the profile's top_kernels)."""
    phases = run.get("profile", {}).get("phases", {})
    out = {"gpu_s": {ph: v["gpu_busy_s"] for ph, v in phases.items()}}
    classes = {ph: v["by_class_s"] for ph, v in phases.items() if "by_class_s" in v}
    if classes:
        out["gpu_by_class_s"] = classes
    top = {ph: v["top_kernels"] for ph, v in phases.items() if v.get("top_kernels")}
    if top:
        out["gpu_top_kernels"] = top
    return out


def later_full_runs(runs, dirs, field):
    """(base run, later run) for each run of dirs that has `field` (its profile, its memory) and
    whose name and inputs a run of runs has (a later job's measurements of runs an earlier
    reference holds)."""
    by_name = {r["name"]: r for r in runs}
    for d in dirs:
        for r in read_runs(os.path.join(d, "runs.jsonl")):
            if "error" in r or field not in r:
                continue
            if r["name"] not in by_name:
                print(f"deepspeed_compare: {d}: run {r['name']} is not among the runs; its {field} is left out",
                      file=sys.stderr)
                continue
            base = by_name[r["name"]]
            diff = [k for k in INPUTS if k in base and k in r and base[k] != r[k]]
            if diff:
                raise SystemExit(f"deepspeed_compare: run {r['name']}: the {field}'s {', '.join(diff)} differ from the "
                                 f"base file's: not the same run")
            yield base, r


def take_profiles(runs, dirs):
    """Runs with the GPU profiles of the full runs of the same name and inputs in dirs."""
    for base, r in later_full_runs(runs, dirs, "profile"):
        for k in ("gpu_s", "gpu_by_class_s", "gpu_top_kernels"):
            base.pop(k, None)
        base["profile"] = r["profile"]  # what --write-reference keeps of it, as of a run measured with it
        base.update(profile_fields(r))
    return runs


def take_memory(runs, dirs):
    """Runs measured in time-only rounds alone with the memory (and the process's constants) of
    the full runs of the same name and inputs in dirs; a run that has its memory keeps it."""
    for base, r in later_full_runs(runs, dirs, "memory"):
        if base.get("memory"):
            print(f"deepspeed_compare: run {r['name']} has its memory already; the later one is left out",
                  file=sys.stderr)
            continue
        base["memory"] = r["memory"]
        if "process_constants" in r:
            base["process_constants"] = r["process_constants"]
    return runs


TRUNCATED_NAME = 160  # deepspeed_reference.py keeps a kernel's name to this many characters


def reclassify(runs):
    """Moves the time of each kept top kernel whose class deepspeed_reference.kernel_class now
    names differently (profiles recorded before a change of its rules) between the run's
    classes. Kernels below the kept top ones stay where they were recorded."""
    from deepspeed_reference import kernel_class  # noqa: E402 (imports no torch at module level)
    for r in runs:
        by_class, top = r.get("gpu_by_class_s"), r.get("gpu_top_kernels")
        if not by_class or not top:
            continue
        for phase, kernels in top.items():
            classes = by_class.get(phase)
            if classes is None:
                continue
            for k in kernels:
                name, cls, _, seconds = k[:4]
                now = kernel_class(name, "kernel")
                if cls in ("copy", now):
                    continue
                # A name cut at the recorded length that no rule matches now may have lost its
                # keyword with the cut: left where it was recorded.
                if now == "elementwise" and len(name) >= TRUNCATED_NAME:
                    continue
                classes[cls] = classes.get(cls, 0.0) - seconds
                classes[now] = classes.get(now, 0.0) + seconds
                k[1] = now
    return runs


def pool_timing(runs, dirs):
    """Runs with their times pooled over time-only rounds: the rounds an earlier pooling kept
    (timing.rounds_s of a --base run) and those in dirs. A run's first measurement (a base run
    without timing) is replaced, not pooled: it was taken in one long process (tools/README.md)."""
    samples = {}
    for d in dirs:
        for r in read_runs(os.path.join(d, "runs.jsonl")):
            if "error" not in r:
                samples.setdefault(r["name"], []).append(r)
    by_name = {r["name"]: r for r in runs}
    for name, rs in samples.items():
        if name in by_name:
            base = by_name[name]
            for r in rs:
                diff = [k for k in INPUTS if k in base and k in r and base[k] != r[k]]
                if diff:
                    raise SystemExit(f"deepspeed_compare: run {name}: the rounds' {', '.join(diff)} differ from the "
                                     f"base file's: not the same run")
        else:  # measured only in rounds: its inputs from the first, no memory
            by_name[name] = {k: v for k, v in rs[0].items() if k not in ("phases_s", "phases_all_s", "iteration_s",
                                                                         "round", "run_seconds", "process_constants", "host_probe_us")}
            runs.append(by_name[name])
    for name, run in by_name.items():
        earlier = run.get("timing", {}).get("rounds_s", [])
        new = [{"phases_all_s": r["phases_all_s"], "iteration_s": r["iteration_s"],
                **({"host_probe_us": r["host_probe_us"]} if "host_probe_us" in r else {})}
               for r in samples.get(name, [])]
        if not new:
            if dirs and not earlier:
                print(f"deepspeed_compare: {name}: no time-only round; its times stay the first measurement's",
                      file=sys.stderr)
            continue
        rounds = earlier + new
        steps = [p for r in rounds for p in r["phases_all_s"]]
        run["phases_s"] = {k: statistics.median(p[k] for p in steps) for k in ("forward", "backward", "step")}
        run["phases_all_s"] = steps
        run["iteration_s"] = statistics.median(r["iteration_s"] for r in rounds)
        run["timing"] = {
            "rounds": len(rounds),
            "rounds_s": rounds,
            "phases_rounds_s": [{k: statistics.median(p[k] for p in r["phases_all_s"]) for k in ("forward", "backward", "step")}
                                for r in rounds],
            "iteration_rounds_s": [r["iteration_s"] for r in rounds],
        }
    return runs


def err(pred, meas):
    return (pred - meas) / meas if meas else float("nan")


def round_range(run, phase):
    """The lowest and highest of a run's round medians for a phase (forward, backward, step,
    iteration), or None with fewer than two rounds: the host's own spread, against which a
    time's error has to be read (tools/README.md, "Times")."""
    timing = run.get("timing", {})  # pool_timing's per-round medians
    meds = (timing.get("iteration_rounds_s", []) if phase == "iteration"
            else [r[phase] for r in timing.get("phases_rounds_s", [])])
    return (min(meds), max(meds)) if len(meds) >= 2 else None


def outside(pred, rng):
    """How far a prediction lies outside the rounds' range, relative to the nearer end (0 inside)."""
    lo, hi = rng
    if pred > hi:
        return (pred - hi) / hi if hi > 0 else float("inf")
    if pred < lo:
        return (pred - lo) / lo if lo > 0 else float("inf")
    return 0.0


def print_stage_ranking(rows):
    """For each model, dtype and attention measured at several stages (runs named ...-sN with no
    other knob), the stages in order of measured and of predicted iteration time: what the
    planner ranks. Where the orders differ, says whether the stages swapped have overlapping
    ranges of round medians (the host's spread cannot order them)."""
    groups = {}
    for r in rows:
        m = re.fullmatch(r"(.+)-s(\d)", r["name"])
        # One rank's times of a several-rank run come from ranks sharing one GPU: not a ranking.
        if (m and "error" not in r["predicted"] and r["measured"]["iteration"] == r["measured"]["iteration"]
                and r.get("world_size", 1) == 1):
            groups.setdefault(m.group(1), {})[int(m.group(2))] = r
    same = 0
    for g, st in groups.items():
        if len(st) < 2:
            continue
        measured = sorted(st, key=lambda k: st[k]["measured"]["iteration"])
        predicted = sorted(st, key=lambda k: st[k]["predicted"]["iteration"])
        if measured == predicted:
            same += 1
            print(f"stage ranking {g}: {measured} measured and predicted")
            continue
        swapped = [(a, b) for i, a in enumerate(measured) for b in measured[i + 1:] if predicted.index(a) > predicted.index(b)]

        def overlap(a, b):
            ra, rb = st[a]["measured"]["rounds_range"].get("iteration"), st[b]["measured"]["rounds_range"].get("iteration")
            if not ra or not rb:
                return "no rounds to tell"
            return "rounds overlap" if ra[0] <= rb[1] and rb[0] <= ra[1] else "rounds apart"

        why = ", ".join(f"s{a}/s{b} {overlap(a, b)}" for a, b in swapped)
        print(f"stage ranking {g}: measured {measured}, predicted {predicted} ({why})")
    if groups:
        print(f"stage ranking equal to the measured one for {same} of {sum(len(v) > 1 for v in groups.values())} models")


def print_device_busy(rows, runs):
    """The GPU's busy time per phase, measured by the profiler (a run measured in full) and
    predicted: the compute model's error apart from the host's (docs/deepspeed_fidelity.md)."""
    gpu = {run["name"]: run["gpu_s"] for run in runs if run.get("gpu_s") and run.get("world_size", 1) == 1}
    table = [(r["name"], gpu[r["name"]], r["predicted"]["gpu"]) for r in rows
             if r["name"] in gpu and "error" not in r["predicted"]]
    if not table:
        return
    print(f"\nGPU busy per phase, profiler / predicted (ms): the compute model's error without the host's")
    errors = {}
    for name, m, p in table:
        cells = []
        for k in ("forward", "backward", "step"):
            if k not in m or k not in p:
                cells.append(f"{k[:4]} {'-':>17}")
                continue
            e = err(p[k], m[k])
            errors.setdefault(k, []).append(e)
            cells.append(f"{k[:4]} {m[k] * 1e3:6.1f}/{p[k] * 1e3:<6.1f} {e * 100:+4.0f}%")
        print(f"{name:<28} " + "  ".join(cells))
    print("mean |error| of the GPU busy time: " + ", ".join(
        f"{k} {100 * sum(map(abs, v)) / len(v):.1f}% (worst {100 * max(map(abs, v)):.0f}%)" for k, v in errors.items()))
    print_by_class(runs, rows)


def print_by_class(runs, rows):
    """GPU time per kernel class, the profile's (by_class_s) beside the prediction's, for the runs
    whose reference keeps it: where the compute model is right in sum but not class by class.
    Elementwise and copy are compared together (DeepSpeed's per-tensor casts are elementwise
    kernels to the profiler, the same work is a copy event in the program); the bias gradients,
    which the model prices inside the linear ops, are elementwise reductions there, and so are
    the per-tensor loop kernels (overflow check, norms) the model prices inside the step's
    optimizer event: compare the step in sum."""
    measured = {run["name"]: run["gpu_by_class_s"] for run in runs
                if run.get("gpu_by_class_s") and run.get("world_size", 1) == 1}
    table = [(r["name"], measured[r["name"]], r["predicted"].get("gpu_by_class", {})) for r in rows
             if r["name"] in measured and "error" not in r["predicted"]]
    if not table:
        return
    print("\nGPU time per kernel class, profiler / predicted (ms; elementwise includes copies and, at one rank, "
          "the collectives' local reductions)")
    for name, m, p in table:
        for phase in ("forward", "backward", "step"):
            mp, pp = dict(m.get(phase, {})), dict(p.get(phase, {}))
            for d in (mp, pp):  # one rank: a collective event is its local reduction (the norm)
                d["elementwise"] = d.get("elementwise", 0.0) + d.pop("copy", 0.0) + d.pop("collective", 0.0)
            cells = []
            for k in ("gemm", "attention", "elementwise", "optimizer"):
                if mp.get(k, 0.0) == 0.0 and pp.get(k, 0.0) == 0.0:
                    continue
                cells.append(f"{k} {mp.get(k, 0.0) * 1e3:5.1f}/{pp.get(k, 0.0) * 1e3:<5.1f}")
            print(f"{name:<28} {phase[:4]}  " + "  ".join(cells))


def print_host_probe(runs):
    """How the host-bound phase of each run (the step at stages 0-2, the forward at stage 3)
    moved between its time-only rounds against the host probe recorded beside them
    (docs/time_model.md): each later round's median over the first's, both for the phase and for
    the probe (the mean of before and after)."""
    pairs = []
    for run in runs:
        rounds = run.get("timing", {}).get("rounds_s", [])
        if len(rounds) < 2 or any("host_probe_us" not in r for r in rounds):
            continue
        phase = "forward" if run["stage"] == 3 else "step"
        t = [statistics.median(p[phase] for p in r["phases_all_s"]) for r in rounds]
        h = [sum(r["host_probe_us"]) / len(r["host_probe_us"]) for r in rounds]
        pairs += [(h[k] / h[0], t[k] / t[0]) for k in range(1, len(rounds))]
    if len(pairs) < 3:
        return
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return
    print(f"\nhost probe between rounds ({len(pairs)} round pairs): the host-bound phase's ratio against the probe's, "
          f"correlation {sxy / (sxx * syy) ** 0.5:.2f}, slope {sxy / sxx:.2f}")


def print_phase_sums(runs):
    """The synchronised phases' sum against the unsynchronised iteration, by the optimizer's
    wrapper and overlap_comm: how much of a phase's time the harness's synchronisations expose
    that an iteration without them hides (docs/deepspeed_fidelity.md)."""
    groups = {}
    for run in runs:
        ph, it = run.get("phases_s"), run.get("iteration_s")
        if not ph or not it or run.get("world_size", 1) != 1:
            continue
        gap = (sum(ph[k] for k in ("forward", "backward", "step")) - it) * 1e3
        overlap = run.get("ds_config", {}).get("zero_optimization", {}).get("overlap_comm")
        key = f"stage {run['stage']}" + ("" if run["stage"] in (0, 3) else
                                          f", overlap_comm {'on' if overlap else 'off'}")
        groups.setdefault(key, []).append(gap)
    if not groups:
        return
    print("\nsynchronised phases' sum minus the unsynchronised iteration (ms): median [range] over runs")
    for key in sorted(groups):
        g = groups[key]
        print(f"  {key:28s} {statistics.median(g):6.1f} [{min(g):.1f} .. {max(g):.1f}] over {len(g)} runs")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--base", help="an earlier reference file to take the runs from (instead of DIR)")
    ap.add_argument("--timing", nargs="+", default=[], help="folders of time-only rounds to pool the times from")
    ap.add_argument("--zeroplan", default=os.path.join(ROOT, "build", "cli", "zeroplan"))
    ap.add_argument("--cluster", help="the single-GPU preset to predict on (default: the one of the GPU the runs "
                                      "name; several-rank runs then take the 8-GPU node of that GPU)")
    ap.add_argument("--profile", help="a cluster profile (zeroplan calibrate --out) to predict with")
    ap.add_argument("--profiles", nargs="+", default=[],
                    help="folders of full runs whose GPU profiles (busy time, kernel classes, top kernels) replace "
                         "those of the same runs")
    ap.add_argument("--memory-from", nargs="+", default=[],
                    help="folders of full runs whose memory joins the runs measured only in rounds")
    ap.add_argument("--write-reference")
    ap.add_argument("--json")
    args = ap.parse_args()

    if bool(args.dir) == bool(args.base):
        ap.error("give DIR or --base FILE")
    if args.base:
        base = json.load(open(args.base))
        meta, runs = base["meta"], base["runs"]
    else:
        meta = json.load(open(os.path.join(args.dir, "meta.json")))
        runs = read_runs(os.path.join(args.dir, "runs.jsonl"))
    if args.profiles:
        runs = take_profiles(runs, args.profiles)
    if args.memory_from:
        runs = take_memory(runs, args.memory_from)
    runs = reclassify(runs)
    if args.timing:
        runs = pool_timing(runs, args.timing)
        dates = set(meta.get("timing_dates", []))
        for d in args.timing:
            m = os.path.join(d, "meta.json")
            if os.path.exists(m):
                dates.add(json.load(open(m)).get("date", ""))
        meta = dict(meta, timing=("phases: median of every timed step of every time-only round; iteration: "
                                  "median of the rounds (tools/deepspeed_reference.py --time-only --rounds)"),
                    timing_dates=sorted(x for x in dates if x))
    if args.cluster:  # several-rank runs then need the node preset of the GPU the runs name
        clusters = (args.cluster, "8xH200-141GB-NVSwitch")
        try:
            clusters = (args.cluster, cluster_of(meta)[1])
        except SystemExit:
            pass
    else:
        clusters = cluster_of(meta)
    print(f"predicted on {clusters[0]} (runs measured on {meta.get('versions', {}).get('gpu', '?')})")
    rows = []
    nan = float("nan")
    for run in runs:
        if "error" in run:
            print(f"{run['name']}: not measured ({run['error']})", file=sys.stderr)
            continue
        m = run.get("memory")
        consts = run.get("process_constants", meta["constants"])
        meas = {
            "peak_allocated": m["peak_allocated"] if m else nan,
            "reserved": m["peak_reserved"] if m else nan,
            # device-used at the end of the step, with the caching allocator at its peak reservation
            "device_used": m["device_used_after_step"] - m["reserved_after_step"] + m["peak_reserved"] if m else nan,
            "persistent": m["allocated_before_step"] if m else nan,
            "peak_between": m["peak_between"] if m else ["-", "-"],
            "forward": run["phases_s"]["forward"],
            "backward": run["phases_s"]["backward"],
            "step": run["phases_s"]["step"],
            "iteration": run["iteration_s"],
            "rounds_range": {k: round_range(run, k) for k in ("forward", "backward", "step", "iteration")},
        }
        pred = predict(args.zeroplan, run, clusters, args.profile)
        rows.append({"name": run["name"], "world_size": run.get("world_size", 1), "measured": meas, "predicted": pred,
                     "constants": consts})

    hdr = (f"{'run':<28} {'alloc MiB meas/pred':>21} {'err':>6} {'reserved meas/pred':>20} {'err':>6} "
           f"{'fwd ms':>13} {'err':>6} {'bwd ms':>13} {'err':>6} {'step ms':>13} {'err':>6} {'iter ms':>13} {'err':>6}")
    print(hdr)
    worst = {}
    beyond = {}  # by how much the predicted time lies outside the range of the rounds' medians
    inside = [0, 0]
    for r in rows:
        m, p = r["measured"], r["predicted"]
        if "error" in p:
            print(f"{r['name']:<28} prediction failed: {p['error']}")
            continue
        cells = []
        for k, scale, unit in (("peak_allocated", MiB, 0), ("reserved", MiB, 0), ("forward", 1e-3, 1), ("backward", 1e-3, 1),
                               ("step", 1e-3, 1), ("iteration", 1e-3, 1)):
            w = 8 if unit == 0 else 6
            if m[k] != m[k]:  # not measured (a run timed only)
                cells.append(f"{'-':>{w}}/{p[k] / scale:<{w}.{unit}f} {'':>6}")
                continue
            e = err(p[k], m[k])
            worst[k] = max(worst.get(k, 0.0), abs(e))
            rng = m["rounds_range"].get(k) if unit else None
            if rng:
                o = outside(p[k], rng)
                beyond[k] = max(beyond.get(k, 0.0), abs(o))
                inside[0] += o == 0.0
                inside[1] += 1
            cells.append(f"{m[k] / scale:>{w}.{unit}f}/{p[k] / scale:<{w}.{unit}f} {e * 100:+5.1f}%")
        print(f"{r['name']:<28} " + " ".join(cells))
        print(f"{'':<28} peak: measured between {m['peak_between'][0]} and {m['peak_between'][1]}; predicted {p['peak_event']}")
        spread = [f"{k[:4]} {lo * 1e3:.1f}-{hi * 1e3:.1f}" for k, v in m["rounds_range"].items() if v for lo, hi in [v]]
        if spread:
            print(f"{'':<28} rounds' medians (ms): " + ", ".join(spread))
    print("worst |error|: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in worst.items()))
    if inside[1]:
        print(f"times inside the range of their rounds' medians: {inside[0]} of {inside[1]}; worst distance outside it: "
              + ", ".join(f"{k} {v * 100:.1f}%" for k, v in beyond.items()))
    print_stage_ranking(rows)
    print_device_busy(rows, runs)
    print_host_probe(runs)
    print_phase_sums(runs)
    if args.json:  # no measurement (a run timed only) is null, not NaN (which JSON does not have)
        def finite(v):
            if isinstance(v, float) and v != v:
                return None
            if isinstance(v, dict):
                return {k: finite(x) for k, x in v.items()}
            if isinstance(v, list):
                return [finite(x) for x in v]
            return v

        json.dump(finite({"meta": meta, "rows": rows}), open(args.json, "w"), indent=1)
    if args.write_reference:
        keep = []
        for run in runs:
            if "error" in run:
                continue
            keep.append({k: run[k] for k in ("name", "model", "arch", "attention", "dtype", "stage", "micro_batch", "seq_len",
                                              "world_size", "rank",
                                              "gas", "keep_output", "ds_config", "params", "param_tensors", "param_modules",
                                              "optimizer_class", "inner_optimizer_class", "memory", "phases_s",
                                              "iteration_s", "phases_all_s", "host_probe_us", "timing", "skipped_steps", "gpu_s",
                                              "process_constants")
                         if k in run})
            if "memory" in run:
                keep[-1]["memory"] = {k: v for k, v in run["memory"].items() if k != "at_peak"}
            if "profile" in run:
                keep[-1].update(profile_fields(run))
            else:
                keep[-1].update({k: run[k] for k in ("gpu_by_class_s", "gpu_top_kernels") if k in run})
        with open(args.write_reference, "w") as f:
            json.dump({"meta": meta, "runs": keep}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
