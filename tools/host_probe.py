#!/usr/bin/env python3
"""This host's probe: microseconds per eager PyTorch op on a GPU, as tools/deepspeed_reference.py
records it beside every run it times (host_probe_us).

DeepSpeed's host-side costs (its Python, PyTorch's dispatcher, kernel launches) on a machine follow
this figure: on one H100 machine the host-bound phases of 41 runs moved with it between two rounds
(correlation 0.89, docs/time_model.md). Give it to zeroplan to scale a calibrated profile's host
costs to this machine:

    python3 tools/host_probe.py            # prints e.g. 5.02
    zeroplan simulate ... --profile calibration/profiles/h100-80gb_deepspeed-0.19.8.json --host-probe-us 5.02

Run it on the training machine, idle, with PyTorch and a CUDA GPU. --repeats takes the median of
several probes a second apart (default 5).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepspeed_reference import host_probe  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    try:
        import torch
    except ImportError:
        sys.exit("host_probe: PyTorch is not installed (pip install torch)")
    if not torch.cuda.is_available():
        sys.exit("host_probe: no CUDA GPU: the probe times eager ops on one")
    host_probe(torch)  # warm-up: the CUDA context and the first launches
    probes = []
    for i in range(args.repeats):
        if i:
            time.sleep(1.0)
        probes.append(host_probe(torch))
    print(f"{statistics.median(probes):.2f}")


if __name__ == "__main__":
    main()
