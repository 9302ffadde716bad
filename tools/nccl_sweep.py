#!/usr/bin/env python3
"""An nccl-tests-style sweep through PyTorch's NCCL backend, written in nccl-tests' output format.

Where nccl-tests is not installed but PyTorch is (the GPU machines here), this measures what
all_reduce_perf, all_gather_perf and reduce_scatter_perf measure -- the time of one collective
over the whole group at sizes from --min-bytes to --max-bytes, factor 4, bf16, after a warm-up,
CUDA events around --iters calls -- and writes one file per collective that
`zeroplan calibrate --nccl-tests KIND=FILE` reads. Launch one process per rank:

    mpirun -np 2 python3 tools/nccl_sweep.py --out DIR

Ranks may share a GPU: NCCL refuses two ranks on one device of one host, so give each rank its
own NCCL_HOSTID (each is then a "node" of its own, and the transport between them is NCCL's
socket transport over loopback, not NVLink):

    mpirun -np 2 -x NCCL_SOCKET_IFNAME=lo bash -c \\
        'NCCL_HOSTID=zp$OMPI_COMM_WORLD_RANK exec python3 tools/nccl_sweep.py --out DIR'

The host name each rank prints is its NCCL_HOSTID when set (the node calibration counts).
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist


def env_int(*names, default=0):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return default


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for all_reduce.txt, all_gather.txt, reduce_scatter.txt")
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter")
    a = ap.parse_args()

    rank = env_int("OMPI_COMM_WORLD_RANK", "RANK")
    world = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default=1)
    local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    ndev = torch.cuda.device_count()
    dev = torch.device("cuda", local % ndev)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)

    host = os.environ.get("NCCL_HOSTID") or socket.gethostname()
    props = torch.cuda.get_device_properties(dev)
    bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}" if hasattr(props, "pci_bus_id") else "0000:00:00"
    me = f"#  Rank {rank:2d} Group  0 Pid {os.getpid():6d} on {host} device {dev.index:2d} [{bus}] {props.name}"
    ranks = [None] * world
    dist.all_gather_object(ranks, me)

    v = torch.cuda.nccl.version()
    code = v[0] * 10000 + v[1] * 100 + v[2] if isinstance(v, tuple) else int(v)
    os.makedirs(a.out, exist_ok=True)
    for kind in a.collectives.split(","):
        test = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf", "reduce_scatter": "reduce_scatter_perf"}[kind]
        lines = [
            f"# nccl-tests version 2.17.1 nccl-headers={code} nccl-library={code}",
            f"# (measured by zeroplan's tools/nccl_sweep.py through torch.distributed {torch.__version__}, not nccl-tests)",
            f"# Collective test starting: {test}",
            f"# nThread 1 nGpus 1 minBytes {a.min_bytes} maxBytes {a.max_bytes} step: 4(factor) warmup iters: {a.warmup} iters: {a.iters} agg iters: 1 validation: 0 graph: 0",
            "#",
            "# Using devices",
            *ranks,
            "#",
            "#                                                              out-of-place                       in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ",
        ]
        size = a.min_bytes
        busbws = []
        while size <= a.max_bytes:
            count = size // 2  # bf16 elements of the whole buffer (nccl-tests' count)
            if count % world:
                size *= 4
                continue
            if kind == "all_reduce":
                x = torch.ones(count, dtype=torch.bfloat16, device=dev)
                call = lambda: dist.all_reduce(x)
                factor = 2 * (world - 1) / world
            elif kind == "all_gather":
                out = torch.empty(count, dtype=torch.bfloat16, device=dev)
                x = torch.ones(count // world, dtype=torch.bfloat16, device=dev)
                call = lambda: dist.all_gather_into_tensor(out, x)
                factor = (world - 1) / world
            else:
                inp = torch.ones(count, dtype=torch.bfloat16, device=dev)
                x = torch.empty(count // world, dtype=torch.bfloat16, device=dev)
                call = lambda: dist.reduce_scatter_tensor(x, inp)
                factor = (world - 1) / world
            for _ in range(a.warmup):
                call()
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(a.iters):
                call()
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3 / a.iters
            # The slowest rank's time is the collective's (nccl-tests reports the max over ranks).
            t = torch.tensor([us], dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            us = t.item()
            algbw = size / us / 1e3
            busbw = algbw * factor
            busbws.append(busbw)
            redop = "sum" if kind != "all_gather" else "none"
            lines.append(f"{size:12d}  {count:12d}  {'bfloat16':>8s}  {redop:>6s}  {-1:6d}  {us:7.2f}  {algbw:6.2f}  {busbw:6.2f}  {0:6d}"
                         f"  {us:7.2f}  {algbw:6.2f}  {busbw:6.2f}  {'N/A':>6s}")
            size *= 4
        lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(busbws) / max(len(busbws), 1):.5f} ", "#",
                  f"# Collective test concluded: {test}", ""]
        if rank == 0:
            with open(os.path.join(a.out, f"{kind}.txt"), "w") as f:
                f.write("\n".join(lines))
            print(f"{kind}: {len(busbws)} sizes, largest {busbws[-1]:.2f} GB/s bus bandwidth", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
