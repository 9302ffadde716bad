#!/usr/bin/env python3
"""Where one training step of `zeroplan train --out RUN.json` goes: its events' times (CUDA
events on the GPU, wall clock on the CPU) summed per op with the layer index folded, and per
class of work as bench/cuda_vs_torch.md tabulates them.

Usage: step_profile.py RUN.json [--top N]

Classes (by the event's op name): the attention (sdpa), the layers' GEMMs (Linear / Conv1D
layers: c_attn, c_proj, c_fc, dense, query, key, value, q/k/v/o/gate/up/down projections, and
--fused-mlp's mlp, GPT-2's two MLP products with the GELU as their epilogues), the
head (lm_head, the MLM decoder), DeepSpeed's step and its bucket copies (the step's events and
the reduction's flatten / copy_to_partition / unflatten), the attention's key/value cache
copies, and every other op (bandwidth-bound: loss, norms, activations, dropouts, residual adds,
embeddings). The attention, layer GEMMs and head are split into forward and backward.
"""
import argparse
import collections
import json
import re

GEMM = re.compile(r"(c_attn|c_proj|c_fc|mlp|dense|query|key|value|[qkvo]_proj|gate_proj|up_proj|down_proj)$")
HEAD = re.compile(r"(lm_head|decoder)$")


def op_of(event_id):
    """(phase, op name without its layer index) of an event id, or None for a marker."""
    m = re.match(r"ms\d+/(\w+)/(.*)", event_id) or re.match(r"(step)/(.*)", event_id)
    if not m:
        return None
    op = re.sub(r"layer\d+\.", "", m.group(2))
    return m.group(1), re.sub(r"\.\d+$", "", op)


def work_class(phase, op):
    if phase == "step" or re.search(r"bucket|partition", op):
        return "DeepSpeed step and bucket copies"
    if "cache" in op:
        return "key/value cache copies"
    side = "backward" if phase in ("bwd", "recompute") else "forward"
    if "sdpa" in op:
        return f"attention {side}"
    if HEAD.search(op):
        return f"head {side}"
    if GEMM.search(op):
        return f"layer GEMMs {side}"
    return "bandwidth-bound ops"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    with open(args.run) as f:
        d = json.load(f)
    ops, classes = collections.Counter(), collections.Counter()
    for e in d["events"]:
        o = op_of(e["id"])
        if o is None or o[1].startswith("host."):
            continue
        ops[o] += e["seconds"]
        classes[work_class(*o)] += e["seconds"]
    print(f"step {d['step_seconds'] * 1e3:.2f} ms; events {sum(ops.values()) * 1e3:.2f} ms")
    print("by class:")
    for k, s in classes.most_common():
        print(f"  {k:40} {s * 1e3:8.2f} ms")
    print(f"the {args.top} longest ops (summed over layers):")
    for (ph, op), s in ops.most_common(args.top):
        print(f"  {ph:8} {op:45} {s * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
