#!/usr/bin/env python3
"""The executor's own step, predicted against its recorded runs.

For every `zeroplan train --device cuda --out` file in the given folders, predicts the run with
`zeroplan simulate --executor cuda` (its model, ds_config, sequence, attention, attention kernel
and kernel variants, on the GPU preset given) and prints the measured and predicted forward,
backward, step and iteration (CUDA-event phases of the run, `phase_times` and `step_seconds`),
then the mean |error| of each. Runs without `phase_times` (recorded before the key) are skipped.

  python3 tools/executor_time_check.py --zeroplan build-ci/cli/zeroplan --gpu h100 \\
      tests/data/calibration/h100_executor tests/data/calibration/h100_executor_variants \\
      tests/data/calibration/h100_executor_parts
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

VARIANTS = [("fused_gelu", "--fused-gelu"), ("fused_loss", "--fused-loss"),
            ("fused_residual_norm", "--fused-residual-norm"), ("fused_mlp", "--fused-mlp")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--zeroplan", default="build/cli/zeroplan")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--profile", default="")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for folder in a.folders:
            for f in sorted(glob.glob(os.path.join(folder, "*.json"))):
                if os.path.basename(f).startswith("device_observations"):
                    continue
                m = json.load(open(f))
                c = m.get("config", {})
                pt = m.get("phase_times")
                if not pt or "ds_config_json" not in c:
                    continue
                model = c["model"]
                if model == "llama-300m":
                    model = os.path.join(root, "tests/data/deepspeed/llama-300m.json")
                ds = os.path.join(tmp, "ds.json")
                json.dump(c["ds_config_json"], open(ds, "w"))
                cmd = [a.zeroplan, "simulate", "--model", model, "--ds-config", ds, "--gpus", str(c.get("world_size", 1)),
                       "--gpu", a.gpu, "--seq-len", str(c["seq_len"]), "--attention", c["attention"],
                       "--executor", "cuda", "--json"]
                if a.profile:
                    cmd += ["--profile", a.profile]
                if c.get("activation_checkpointing"):
                    cmd.append("--activation-checkpointing")
                if "attention_kernel" in c:
                    cmd += ["--attention-kernel", c["attention_kernel"]]
                cmd += [flag for key, flag in VARIANTS if c.get(key)]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"{f}: {r.stderr.strip()}", file=sys.stderr)
                    continue
                t = json.loads(r.stdout)["results"][0]["executor"]["time"]
                measured = [1e3 * pt["forward"], 1e3 * pt["backward"], 1e3 * pt["step"], 1e3 * m["step_seconds"]]
                predicted = [t["forward_ms"], t["backward_ms"], t["step_ms"], t["iteration_ms"]]
                rows.append((f"{os.path.basename(folder.rstrip('/'))}/{os.path.basename(f)[:-5]}",
                             c.get("attention_kernel", "own"), measured, predicted))
    print(f"{'run':52} {'kernel':6} " + " ".join(f"{p:>22}" for p in ("forward ms", "backward ms", "step ms", "iteration ms")))
    for name, kernel, me, pr in rows:
        cells = " ".join(f"{x:8.1f}/{y:7.1f} {100 * (y / x - 1):+5.0f}%" for x, y in zip(me, pr))
        print(f"{name:52} {kernel:6} {cells}")
    if not rows:
        return 1
    for i, phase in enumerate(("forward", "backward", "step", "iteration")):
        errs = [abs(pr[i] / me[i] - 1) for _, _, me, pr in rows if me[i] > 0]
        print(f"{phase}: mean |error| {100 * sum(errs) / len(errs):.1f}%, worst {100 * max(errs):.1f}% over {len(errs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
