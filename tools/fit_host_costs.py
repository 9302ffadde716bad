#!/usr/bin/env python3
"""Fit the host-cost defaults (sim/compute_model.cpp: default_host_costs) to recorded DeepSpeed runs.

Each run of a reference file (tests/data/deepspeed/*.json, written by tools/deepspeed_compare.py from
tools/deepspeed_reference.py's measurements) is predicted by `zeroplan simulate` on the H200 preset, with the
host costs under test written into a copy of the device profiles (ZEROPLAN_PROFILES points the binary at it).
The forward, backward and step wall times of the prediction are compared with the measured medians, and the
host costs are fitted by damped Gauss-Newton on the relative errors of the iteration (weighted twice) and
of the three phases, with numerical derivatives through the simulator itself (the engine runs host events
on the host stream, so the times are not linear in them), bounded below by 0.

This is the bootstrap for the defaults; `zeroplan calibrate` fits the same coefficients for a user's host.

Usage: fit_host_costs.py tests/data/deepspeed/h200_deepspeed_0.19.8.json [--zeroplan build/cli/zeroplan]
       [--fit-runs REGEX]   (fit on the matching runs only; the others are reported as held out)
       [--params REGEX]     (fit only the costs whose names match; the others keep their values)
       [--cluster 1xH100-80GB --profile calibration/profiles/h100-80gb_deepspeed-0.19.8.json]
                            (runs of another machine: its preset and profile, whose host.scale multiplies
                            the costs under test, so that they stay in the H200 host's units)
The fitted costs are printed as JSON, for sim/compute_model.cpp's defaults.
"""
import argparse
import concurrent.futures
import copy
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from deepspeed_compare import ROOT, model_arg  # noqa: E402

# parameter: (phase it moves, path in the profile's "host" object)
PARAMS = {
    "forward": [("forward_op_us",), ("stage3_module_forward_us",), ("stage3_param_forward_us",),
                ("stage3_linear_forward_us",)],
    "backward": [("backward_op_us",), ("grad_hook_us",), ("bucket_hook_us",), ("stage3_module_backward_us",),
                 ("stage3_grad_hook_us",), ("stage3_linear_backward_us",)],
    "step": [("step", w, k) for w in ("fp16_optimizer", "zero_optimizer", "zero3_optimizer", "plain")
             for k in ("base_us", "per_tensor_us")],
}
# Which runs inform which parameters (a parameter no run exercises is left at its value).
def informs(path, run):
    name = path[-1] if len(path) == 1 else path[1]
    cls = run["optimizer_class"]
    if name.startswith("stage3"):
        return run["stage"] == 3
    if name == "grad_hook_us":
        return run["stage"] in (1, 2)
    if name == "bucket_hook_us":
        return run["stage"] == 2 or (run["stage"] == 1 and run["ds_config"]["zero_optimization"].get("overlap_comm"))
    if len(path) == 3:
        return {"fp16_optimizer": "FP16_Optimizer", "zero_optimizer": "DeepSpeedZeroOptimizer",
                "zero3_optimizer": "DeepSpeedZeroOptimizer_Stage3", "plain": "FusedAdam"}[name] == cls
    return True


def get(host, path):
    v = host
    for k in path:
        v = v[k]
    return v


def put(host, path, value):
    v = host
    for k in path[:-1]:
        v = v.setdefault(k, {})
    v[path[-1]] = value


def predict_all(zeroplan, runs, host, workdir, cluster="1xH200-141GB", profile=None):
    """Forward, backward and step seconds of every run with these host costs (on the H200 preset's
    profile, or in a copy of `profile`, a calibrated profile whose host.scale stays)."""
    path = os.path.join(workdir, f"profiles-{os.getpid()}-{id(host)}.json")
    env = dict(os.environ)
    extra = []
    if profile:
        prof = json.load(open(profile))
        scale = prof["device_profile"]["host"].get("scale", 1.0)
        prof["device_profile"]["host"] = dict(host, scale=scale, source="fit_host_costs.py candidate")
        json.dump(prof, open(path, "w"))
        extra = ["--profile", path]
    else:
        profiles = json.load(open(os.path.join(ROOT, "sim", "profiles.json")))
        for p in profiles["profiles"]:
            if p["device"] == "H200-141GB":
                p["host"] = dict(host, source="fit_host_costs.py candidate")
        json.dump(profiles, open(path, "w"))
        env["ZEROPLAN_PROFILES"] = path

    def one(run):
        cfg = os.path.join(workdir, run["name"] + ".json")
        if not os.path.exists(cfg):
            json.dump(run["ds_config"], open(cfg, "w"))
        out = subprocess.run([zeroplan, "simulate", "--model", model_arg(run["model"]), "--ds-config", cfg, "--cluster",
                              cluster, "--seq-len", str(run["seq_len"]), "--attention", run["attention"],
                              "--json"] + extra,
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise SystemExit(f"{run['name']}: {out.stderr.strip()}")
        t = json.loads(out.stdout)["results"][0]["time"]
        return [t["forward_ms"] * 1e-3, t["backward_ms"] * 1e-3, t["step_ms"] * 1e-3, t["iteration_ms"] * 1e-3]

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        res = np.array(list(ex.map(one, runs)))
    os.remove(path)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reference")
    ap.add_argument("--zeroplan", default=os.path.join(ROOT, "build", "cli", "zeroplan"))
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--fit-runs", default="", help="regular expression: fit on the runs whose names match, and "
                                                   "report the others as held out")
    ap.add_argument("--params", default="", help="regular expression: fit only the costs whose names match")
    ap.add_argument("--cluster", default="1xH200-141GB", help="the preset the runs are predicted on")
    ap.add_argument("--profile", default="", help="a calibrated profile (calibration/profiles/) for the runs' machine: "
                                                  "the costs under test replace its host costs, its host.scale stays")
    args = ap.parse_args()
    if not args.profile and (args.params or args.cluster != "1xH200-141GB"):
        # Without a profile the costs start from this script's rough starting values (sim/profiles.json
        # has no host section): a partial fit, or another machine's preset, needs the costs to hold.
        raise SystemExit("fit_host_costs.py: --params and --cluster need --profile (a profile whose host costs the "
                         "fit starts from and keeps where it fits nothing: calibration/profiles/, or one written by "
                         "zeroplan calibrate --fit host.scale for the built-in defaults)")
    # Runs that keep the model's output differ from their twins in memory only.
    runs = [r for r in json.load(open(args.reference))["runs"] if not r.get("keep_output")]
    measured = np.array([[r["phases_s"]["forward"], r["phases_s"]["backward"], r["phases_s"]["step"], r["iteration_s"]]
                         for r in runs])
    # Start from the profile's current host costs (or nothing).
    if args.profile:
        host = copy.deepcopy(json.load(open(args.profile))["device_profile"].get("host", {}))
    else:
        profiles = json.load(open(os.path.join(ROOT, "sim", "profiles.json")))
        host = next((copy.deepcopy(p.get("host", {})) for p in profiles["profiles"] if p["device"] == "H200-141GB"), {})
    for k in ("scale", "probe_us"):
        host.pop(k, None)
    start = {"forward_op_us": 60, "stage3_module_forward_us": 500, "backward_op_us": 100, "grad_hook_us": 80, "bucket_hook_us": 50,
             "stage3_module_backward_us": 600, "stage3_param_forward_us": 100, "stage3_grad_hook_us": 0,
             "stage3_linear_forward_us": 0, "stage3_linear_backward_us": 0,
             "step": {w: {"base_us": 5000, "per_tensor_us": 200} for w in ("fp16_optimizer", "zero_optimizer",
                                                                           "zero3_optimizer", "plain")}}
    for ph, paths in PARAMS.items():
        for p in paths:
            try:
                get(host, p)
            except KeyError:
                put(host, p, get(start, p))
    host.pop("source", None)
    # Residuals: the relative errors of the iteration (weight 2: what throughput and the
    # planner's ranking rest on, measured without synchronisations) and of the three phases
    # (weight 1: DeepSpeed's wall_clock_breakdown synchronises between them, so they carry the
    # GPU's tail at each phase end, which the host costs should not absorb).
    weights = np.array([1.0, 1.0, 1.0, 2.0])
    fit = np.array([bool(re.search(args.fit_runs, r["name"])) for r in runs])
    paths = [p for ps in PARAMS.values() for p in ps]
    used = [p for p in paths if any(informs(p, r) for r, f in zip(runs, fit) if f)
            and re.search(args.params, "_".join(p))]
    if not used:
        raise SystemExit(f"fit_host_costs.py: no host cost to fit (--params '{args.params}' matches none that the fitted "
                         f"runs inform; names: {', '.join('.'.join(p) for p in paths)})")

    def residuals(pred):
        return (((pred - measured) / measured) * weights)[fit].ravel()

    with tempfile.TemporaryDirectory() as work:
        for it in range(args.iterations):
            base = predict_all(args.zeroplan, runs, host, work, args.cluster, args.profile or None)
            r0 = residuals(base)
            rel = ((base - measured) / measured)[fit]
            print(f"iteration {it}: mean |error| forward {np.mean(abs(rel[:, 0])) * 100:.1f}%, backward "
                  f"{np.mean(abs(rel[:, 1])) * 100:.1f}%, step {np.mean(abs(rel[:, 2])) * 100:.1f}%, iteration "
                  f"{np.mean(abs(rel[:, 3])) * 100:.1f}%", flush=True)
            J = np.zeros((r0.size, len(used)))
            for j, p in enumerate(used):
                h = copy.deepcopy(host)
                step = max(1.0, 0.1 * get(host, p))
                put(h, p, get(host, p) + step)
                J[:, j] = (residuals(predict_all(args.zeroplan, runs, h, work, args.cluster, args.profile or None)) - r0) / step
            keep = [j for j in range(len(used)) if np.any(J[:, j] != 0)]
            if not keep:
                raise SystemExit("fit_host_costs.py: no prediction moves with the costs under test (is --cluster the "
                                 "machine of --profile?)")
            lam = 1e-3 * np.trace(J[:, keep].T @ J[:, keep]) / max(1, len(keep))
            A = J[:, keep].T @ J[:, keep] + lam * np.eye(len(keep))
            delta = np.linalg.solve(A, -J[:, keep].T @ r0)
            # Accept the step only where it lowers the residuals (halving it up to 4 times).
            for _ in range(5):
                trial = copy.deepcopy(host)
                for j, d in zip(keep, delta):
                    put(trial, used[j], round(max(0.0, get(host, used[j]) + float(d)), 2))
                if np.sum(residuals(predict_all(args.zeroplan, runs, trial, work, args.cluster, args.profile or None)) ** 2) < np.sum(r0 ** 2):
                    host = trial
                    break
                delta = delta / 2
        final = predict_all(args.zeroplan, runs, host, work, args.cluster, args.profile or None)
    rel = (final - measured) / measured
    for r, e, f, m, fitted in zip(runs, rel, final, measured, fit):
        print(f"{r['name']:<28}{' ' if fitted else '*'}" + "  ".join(f"{ph} {mm * 1e3:7.1f}/{ff * 1e3:7.1f} {ee * 100:+6.1f}%"
                                             for ph, mm, ff, ee in zip(("fwd", "bwd", "step", "iter"), m, f, e)))
    for what, sel in (("fitted", fit), ("held out (*)", ~fit)):
        if sel.any():
            print(f"mean |error|, {what} ({sel.sum()} runs): " + ", ".join(
                f"{ph} {np.mean(abs(rel[sel, i])) * 100:.1f}% (max {np.max(abs(rel[sel, i])) * 100:.1f}%)"
                for i, ph in enumerate(("forward", "backward", "step", "iteration"))))
    print(json.dumps({"host": host}, indent=1))


if __name__ == "__main__":
    main()
