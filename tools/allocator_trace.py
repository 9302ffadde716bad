#!/usr/bin/env python3
"""Record golden traces of PyTorch's CUDA caching allocator.

Replays deterministic allocation/free sequences through torch.cuda
(torch.empty(n, dtype=torch.uint8, device="cuda") and del) and records, after
every step, torch.cuda.memory_allocated(), memory_reserved(), the number of
segments and the number of allocation retries. Each sequence runs in a fresh
child process so that it starts from an empty allocator. A last child process
measures the device: mem_get_info() total and the memory the process uses
outside the allocator (CUDA context, cuBLAS handle, NCCL communicator).

The traces are stored as tests/data/allocator_<sequence>.json and replayed by
tests/test_caching_allocator.cpp through zp::sim::CachingAllocatorModel, which
must reproduce allocated and reserved bytes after every step exactly.

Usage:
    python3 tools/allocator_trace.py --out DIR            # all sequences + device
    python3 tools/allocator_trace.py --out DIR --only mixed,oom
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

KiB = 1024
MiB = 1024 * 1024
GiB = 1024 * MiB

# Each sequence: (name, PYTORCH_CUDA_ALLOC_CONF value or None, capacity in bytes).
# The capacity is imposed with torch.cuda.set_per_process_memory_fraction, so the
# allocator's limit is known exactly: allowed = int(fraction * total).
SEQUENCES = {
    "boundaries": (None, 64 * GiB),
    "mixed": (None, 100 * GiB),
    "training": (None, 100 * GiB),
    "streams": (None, 64 * GiB),
    "oom": (None, 1 * GiB),
    "maxsplit": ("max_split_size_mb:64", 1 * GiB),
}


# ----------------------------------------------------------------------------
# Sequence builders. An op is ("alloc", id, size, stream), ("free", id) or
# ("empty_cache",).
# Builders are pure functions of a fixed seed, so the ops are reproducible.
# ----------------------------------------------------------------------------
class Ops:
    def __init__(self):
        self.ops = []
        self.next_id = 0
        self.live = []  # ids in allocation order

    def alloc(self, size, stream=0):
        i = self.next_id
        self.next_id += 1
        self.ops.append(("alloc", i, int(size), stream))
        self.live.append(i)
        return i

    def free(self, i):
        self.ops.append(("free", i))
        self.live.remove(i)

    def empty_cache(self):
        self.ops.append(("empty_cache",))


def seq_boundaries():
    o = Ops()
    sizes = [1, 511, 512, 513, 4095, 4096, MiB - 1, MiB, MiB + 1, 2 * MiB - 1, 2 * MiB,
             2 * MiB + 1, 5 * MiB, 10 * MiB - 1, 10 * MiB, 10 * MiB + 1, 12 * MiB + 1,
             20 * MiB - 1, 20 * MiB, 20 * MiB + 1, 64 * MiB + 7]
    # Each size alone, freed at once (then reused from the cache by the next pass).
    for s in sizes:
        o.free(o.alloc(s))
    keep = o.alloc(3 * MiB)
    o.empty_cache()  # releases every cached segment but the one `keep` splits
    o.free(keep)
    # All live together, freed in allocation order, then again (cache reuse).
    for _ in range(2):
        ids = [o.alloc(s) for s in sizes]
        for i in ids:
            o.free(i)
    # Large-pool split rules inside one 20 MiB segment: 5 MiB + 5 MiB + 9 MiB
    # leaves a 1 MiB remainder that is not split off (remainder must exceed 1 MiB).
    a = o.alloc(5 * MiB)
    b = o.alloc(5 * MiB)
    c = o.alloc(9 * MiB)
    d = o.alloc(3 * MiB)  # no free block left: new 20 MiB segment
    e = o.alloc(19 * MiB)  # 20 MiB segment, 1 MiB remainder not split
    for i in (b, a, c, e, d):
        o.free(i)
    # Small-pool coalescing: three blocks of one 2 MiB segment, free middle, first, last.
    x = o.alloc(600 * KiB)
    y = o.alloc(600 * KiB)
    z = o.alloc(600 * KiB)
    w = o.alloc(600 * KiB)  # 1.8 MiB used, 0.2 MiB left: new segment
    o.free(y)
    o.free(x)
    r = o.alloc(1 * MiB)  # fits in the coalesced 1.2 MiB hole
    o.free(z)
    o.free(r)
    o.free(w)
    # Best fit: free blocks of 30, 40, 50 MiB (own segments); a 35 MiB request
    # takes the 40 MiB one and splits off 5 MiB.
    p = [o.alloc(n * MiB) for n in (30, 40, 50)]
    keep = o.alloc(2 * MiB)
    for i in p:
        o.free(i)
    q = o.alloc(35 * MiB)
    q2 = o.alloc(45 * MiB)
    q3 = o.alloc(31 * MiB)
    for i in (q, q2, q3, keep):
        o.free(i)
    o.empty_cache()  # everything is free: reserved drops to zero
    return o.ops


def log_uniform(rng, lo, hi):
    import math
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def seq_mixed(seed=20240611, steps=1600, live_cap=12 * GiB):
    rng = random.Random(seed)
    o = Ops()
    sizes = {}
    live_bytes = 0
    for _ in range(steps):
        want_alloc = (not o.live) or rng.random() < 0.55
        if want_alloc:
            band = rng.random()
            if band < 0.45:
                s = log_uniform(rng, 1, MiB + 1)
            elif band < 0.75:
                s = log_uniform(rng, MiB, 10 * MiB + 1)
            elif band < 0.97:
                s = log_uniform(rng, 10 * MiB, 400 * MiB)
            else:
                s = log_uniform(rng, 400 * MiB, 2 * GiB)
            if rng.random() < 0.2:  # exact multiples and boundary values
                s = rng.choice([512, MiB, MiB + 1, 2 * MiB, 10 * MiB - 1, 10 * MiB, 20 * MiB,
                                64 * MiB, 128 * MiB + 1])
            if live_bytes + s > live_cap:
                want_alloc = False
            else:
                i = o.alloc(s)
                sizes[i] = s
                live_bytes += s
        if not want_alloc and o.live:
            # Mostly free recent tensors (stack-like), sometimes a random one.
            if rng.random() < 0.6:
                k = len(o.live) - 1 - min(len(o.live) - 1, int(rng.expovariate(0.5)))
            else:
                k = rng.randrange(len(o.live))
            i = o.live[k]
            live_bytes -= sizes.pop(i)
            o.free(i)
    for i in list(reversed(o.live)):
        o.free(i)
    return o.ops


def seq_training(layers=12, hidden=2048, batch=4, seq=1024, heads=16, iters=3):
    """Persistent buffers, then per iteration: activations forward, frees in reverse
    with gradient temporaries in backward, optimizer temporaries at the step."""
    o = Ops()
    h = hidden
    b2 = 2  # fp16 bytes
    layer_params = [3 * h * h * b2, 3 * h * b2, h * h * b2, h * b2, 2 * h * b2, 4 * h * h * b2,
                    4 * h * b2, 4 * h * h * b2, h * b2, 2 * h * b2]
    vocab = 50257
    embed = vocab * h * b2
    params = [o.alloc(embed)]
    for _ in range(layers):
        params += [o.alloc(s) for s in layer_params]
    all_param_sizes = [embed] + layer_params * layers
    grads = None
    master = None
    tok = batch * seq * h * b2  # (B, T, C) fp16
    scores = batch * heads * seq * seq * b2  # (B, H, T, T)
    for it in range(iters):
        inp = o.alloc(batch * seq * 8)  # token ids, int64
        x = o.alloc(tok)
        saved = []
        for _ in range(layers):
            acts = [o.alloc(tok),            # ln1 out
                    o.alloc(3 * tok),        # qkv
                    o.alloc(scores),         # attention scores
                    o.alloc(scores),         # softmax
                    o.alloc(scores // 2),    # dropout mask (1 byte)
                    o.alloc(tok),            # context
                    o.alloc(tok),            # attn out + residual
                    o.alloc(tok),            # ln2 out
                    o.alloc(4 * tok),        # fc1
                    o.alloc(4 * tok),        # gelu
                    o.alloc(tok)]            # fc2 + residual
            saved.append(acts)
        logits = o.alloc(batch * seq * vocab * b2)
        loss = o.alloc(4)
        if grads is None:
            grads = [o.alloc(s) for s in all_param_sizes[::-1]]
        dlogits = o.alloc(batch * seq * vocab * b2)
        o.free(logits)
        dx = o.alloc(tok)
        o.free(dlogits)
        for acts in reversed(saved):
            for a in reversed(acts):
                t = o.alloc(o_size(o, a))  # gradient of the activation
                o.free(a)
                o.free(t)
            tmp = o.alloc(4 * tok)
            o.free(tmp)
        o.free(dx)
        o.free(x)
        o.free(inp)
        o.free(loss)
        # Optimizer step: fp32 master and Adam states created at the first step,
        # a flat fp32 copy of the gradients per step.
        if master is None:
            master = [o.alloc(2 * s) for s in all_param_sizes]
            m = [o.alloc(2 * s) for s in all_param_sizes]
            v = [o.alloc(2 * s) for s in all_param_sizes]
        flat = o.alloc(2 * sum(all_param_sizes))
        norm = o.alloc(4)
        o.free(norm)
        o.free(flat)
    for i in list(reversed(o.live)):
        o.free(i)
    return o.ops


def o_size(o, i):
    for op in o.ops:
        if op[0] == "alloc" and op[1] == i:
            return op[2]
    raise KeyError(i)


def seq_streams(seed=7, steps=600):
    rng = random.Random(seed)
    o = Ops()
    # Blocks freed on stream 1 cannot serve stream 0.
    a = o.alloc(30 * MiB, 1)
    b = o.alloc(100 * KiB, 1)
    o.free(a)
    o.free(b)
    c = o.alloc(30 * MiB, 0)   # new segment on stream 0
    d = o.alloc(100 * KiB, 0)  # new small segment on stream 0
    e = o.alloc(30 * MiB, 1)   # reuses stream 1's cached block
    for i in (c, d, e):
        o.free(i)
    sizes = {}
    live_bytes = 0
    for k in range(steps):
        if k == steps // 2:
            o.empty_cache()
        if (not o.live) or (rng.random() < 0.55 and live_bytes < 6 * GiB):
            s = log_uniform(rng, 1, 300 * MiB)
            st = rng.randrange(2)
            i = o.alloc(s, st)
            sizes[i] = s
            live_bytes += s
        else:
            i = o.live[rng.randrange(len(o.live))]
            live_bytes -= sizes.pop(i)
            o.free(i)
    for i in list(o.live):
        o.free(i)
    return o.ops


def seq_oom(seed=99, steps=500):
    """Capacity 1 GiB: cached segments are released and the request retried; some
    requests fail."""
    rng = random.Random(seed)
    o = Ops()
    a = o.alloc(300 * MiB)
    b = o.alloc(300 * MiB)
    c = o.alloc(300 * MiB)
    o.free(a)
    o.free(b)
    d = o.alloc(500 * MiB)  # needs the two cached 300 MiB segments released
    e = o.alloc(400 * MiB)  # fails: 800 MiB live, 1 GiB capacity
    o.free(c)
    o.free(d)
    if e in o.live:
        o.free(e)
    sizes = {}
    live_bytes = 0
    for _ in range(steps):
        if (not o.live) or rng.random() < 0.55:
            band = rng.random()
            s = log_uniform(rng, 1, MiB) if band < 0.3 else log_uniform(rng, MiB, 400 * MiB)
            i = o.alloc(s)
            sizes[i] = s
            live_bytes += s
        else:
            i = o.live[rng.randrange(len(o.live))]
            live_bytes -= sizes.pop(i)
            o.free(i)
    for i in list(o.live):
        o.free(i)
    return o.ops


def seq_maxsplit(seed=5, steps=500):
    """max_split_size_mb:64 and a 1 GiB capacity: oversize blocks are not split,
    an oversize cached block serves a request only within 20 MiB of its size, and
    release_available_cached_blocks frees oversize blocks before everything else."""
    rng = random.Random(seed)
    o = Ops()
    a = o.alloc(100 * MiB)
    o.free(a)
    b = o.alloc(90 * MiB)   # takes the cached 100 MiB block whole
    c = o.alloc(70 * MiB)   # 100 MiB block is busy: new 70 MiB segment
    o.free(b)
    d = o.alloc(30 * MiB)   # below max_split: may not take the 100 MiB block
    e = o.alloc(79 * MiB)   # 100 >= 79 + 20: refused, new segment
    f = o.alloc(81 * MiB)   # 100 < 81 + 20: takes it
    for i in (c, d, e, f):
        o.free(i)
    sizes = {}
    for _ in range(steps):
        if (not o.live) or rng.random() < 0.55:
            band = rng.random()
            if band < 0.25:
                s = log_uniform(rng, 1, MiB)
            elif band < 0.55:
                s = log_uniform(rng, MiB, 64 * MiB)
            else:
                s = log_uniform(rng, 64 * MiB, 500 * MiB)
            i = o.alloc(s)
            sizes[i] = s
        else:
            i = o.live[rng.randrange(len(o.live))]
            sizes.pop(i)
            o.free(i)
    for i in list(o.live):
        o.free(i)
    return o.ops


BUILDERS = {
    "boundaries": seq_boundaries,
    "mixed": seq_mixed,
    "training": seq_training,
    "streams": seq_streams,
    "oom": seq_oom,
    "maxsplit": seq_maxsplit,
}


# ----------------------------------------------------------------------------
# Child processes
# ----------------------------------------------------------------------------
def device_header(torch):
    free, total = torch.cuda.mem_get_info()
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(0),
        "mem_get_info_total": int(total),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
    }


def run_sequence(name, out_dir):
    import torch
    conf, capacity = SEQUENCES[name]
    ops = BUILDERS[name]()
    header = device_header(torch)
    total = header["mem_get_info_total"]
    fraction = capacity / total
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    allowed = int(fraction * total)
    streams = {0: torch.cuda.current_stream(), 1: torch.cuda.Stream()}
    live = {}
    steps = []
    t0 = time.time()

    def stats():
        st = torch.cuda.memory_stats()
        return (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                st.get("segment.all.current", 0), st.get("num_alloc_retries", 0),
                st.get("num_ooms", 0))

    assert stats()[1] == 0, "allocator not empty at start"
    for op in ops:
        if op[0] == "alloc":
            _, i, size, st = op
            ok = True
            ptr = 0
            try:
                with torch.cuda.stream(streams[st]):
                    t = torch.empty(size, dtype=torch.uint8, device="cuda")
                live[i] = t
                ptr = t.data_ptr()
                del t  # `live` must hold the only reference, or a later free is deferred
            except torch.cuda.OutOfMemoryError:
                ok = False
            a, r, seg, retries, ooms = stats()
            steps.append({"op": "alloc", "id": i, "size": size, "stream": st, "ok": ok,
                          "allocated": a, "reserved": r, "segments": seg,
                          "retries": retries, "ooms": ooms, "ptr": ptr})
        elif op[0] == "empty_cache":
            torch.cuda.empty_cache()
            a, r, seg, retries, ooms = stats()
            steps.append({"op": "empty_cache", "allocated": a, "reserved": r,
                          "segments": seg, "retries": retries, "ooms": ooms})
        else:
            _, i = op
            if i not in live:  # its allocation failed
                continue
            del live[i]
            a, r, seg, retries, ooms = stats()
            steps.append({"op": "free", "id": i, "allocated": a, "reserved": r,
                          "segments": seg, "retries": retries, "ooms": ooms})
    torch.cuda.synchronize()
    assert not live, "ops left tensors alive"
    doc = dict(header)
    doc.update({
        "sequence": name,
        "capacity": allowed,
        "max_split_size": 64 * MiB if conf and "max_split_size_mb:64" in conf else None,
        "source": "recorded with tools/allocator_trace.py",
        "seconds": round(time.time() - t0, 3),
        "steps": steps,
    })
    with open(os.path.join(out_dir, f"allocator_{name}.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"{name}: {len(steps)} steps, peak reserved "
          f"{max(s['reserved'] for s in steps) / GiB:.3f} GiB, "
          f"retries {steps[-1]['retries']}, ooms {steps[-1]['ooms']}, "
          f"{doc['seconds']} s", flush=True)


def run_device(out_dir):
    import torch
    rec = {}

    def used():
        free, total = torch.cuda.mem_get_info()
        return int(total - free), int(total)

    u, total = used()
    rec["mem_get_info_total"] = total
    rec["after_init"] = {"used": u, "reserved": torch.cuda.memory_reserved()}
    x = torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    u, _ = used()
    rec["after_first_tensor"] = {"used": u, "reserved": torch.cuda.memory_reserved()}
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    c = a @ a
    torch.cuda.synchronize()
    u, _ = used()
    rec["after_cublas_fp16_gemm"] = {"used": u, "reserved": torch.cuda.memory_reserved(),
                                     "allocated": torch.cuda.memory_allocated()}
    del a, c
    nccl = None
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_nccl_available():
            store = dist.HashStore()
            dist.init_process_group("nccl", store=store, rank=0, world_size=1,
                                    device_id=torch.device("cuda", 0))
            torch.cuda.synchronize()
            u, _ = used()
            rec["after_nccl_group_init"] = {"used": u, "reserved": torch.cuda.memory_reserved()}
            t = torch.ones(1 << 20, device="cuda")
            dist.all_reduce(t)
            torch.cuda.synchronize()
            u, _ = used()
            nccl = {"used": u, "reserved": torch.cuda.memory_reserved(),
                    "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))}
            del t
    except Exception as exc:  # record why NCCL was not measured
        nccl = {"error": repr(exc)}
    rec["after_nccl_init"] = nccl
    last = nccl if nccl and "used" in nccl else rec["after_cublas_fp16_gemm"]
    rec["context_overhead"] = last["used"] - last["reserved"]
    rec["context_overhead_stages"] = {
        k: rec[k]["used"] - rec[k]["reserved"]
        for k in ("after_init", "after_first_tensor", "after_cublas_fp16_gemm",
                  "after_nccl_group_init", "after_nccl_init")
        if rec.get(k) and "used" in rec[k]}
    rec.update(device_header(torch))
    rec["props_total_memory"] = int(torch.cuda.get_device_properties(0).total_memory)
    rec["env"] = {k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "NCCL_NVLS_ENABLE")}
    with open(os.path.join(out_dir, "allocator_device.json"), "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    print("device:", json.dumps(rec), flush=True)
    try:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated sequence names (and/or 'device')")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true", help="count the ops without a GPU")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.child == "device":
        run_device(args.out)
        return
    if args.child:
        run_sequence(args.child, args.out)
        return
    names = [n for n in args.only.split(",") if n] or list(SEQUENCES) + ["device"]
    if args.dry_run:
        for n in names:
            if n in BUILDERS:
                ops = BUILDERS[n]()
                print(n, len(ops), "ops, largest",
                      max(op[2] for op in ops if op[0] == "alloc"))
        return
    failed = []
    for n in names:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        if n in SEQUENCES and SEQUENCES[n][0]:
            env["PYTORCH_CUDA_ALLOC_CONF"] = SEQUENCES[n][0]
        rc = subprocess.call([sys.executable, os.path.abspath(__file__), "--out", args.out,
                              "--child", n], env=env)
        if rc != 0:
            failed.append(n)
    if failed:
        print("failed:", ",".join(failed), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
