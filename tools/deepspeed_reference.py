#!/usr/bin/env python3
"""Train Hugging Face models under DeepSpeed on one GPU and record what zeroplan predicts.

For every run of a matrix (tools/deepspeed_matrix.json): a model from zeroplan's catalogue
(or any HF config.json), a ds_config built from the run's knobs, a few optimizer steps of
random tokens, and the measurements zeroplan's simulator is checked against:

- memory: peak allocated and reserved bytes of one steady-state step, the bytes allocated
  before and after it, device-used bytes (cudaMemGetInfo) at the peak, and the moment of the
  peak: the module and phase (forward, backward, step) it happened in, from hooks that read
  the allocator's counters, and the live blocks at the peak from a memory snapshot
  (torch.cuda.memory._record_memory_history), grouped by the Python frames that allocated
  them (tools/deepspeed_compare.py turns those into zeroplan's categories);
- time: forward, backward and engine.step() wall times with a synchronisation between
  phases (as DeepSpeed's wall_clock_breakdown), the iteration time without any, and a torch
  profiler trace of one step reduced to GPU busy time vs host wall time per phase, kernel
  launches, and the Python functions of DeepSpeed that took the host's time (count, total);
- which optimizer classes DeepSpeed chose.

Process-wide constants are measured once: the CUDA context, NCCL's buffers after the first
collective, cuBLAS's workspaces (one per handle: the main thread's and autograd's).

Runs on the GPU machine, one process for the whole matrix (runs are separated by freeing
everything and emptying the allocator's cache). DeepSpeed is installed from wheels carried
with the call (see tools/README.md). Writes one JSON line per run to OUT/runs.jsonl as it
goes, so a run cut short keeps what it measured.

Usage: deepspeed_reference.py --matrix tools/deepspeed_matrix.json --out DIR [--only NAME,...]
       mpirun -np N deepspeed_reference.py ... (or torchrun): N ranks, each writing DIR/rankR/;
       on one GPU give each rank its own NCCL_HOSTID (tools/README.md)
       deepspeed_reference.py ... --time-only --rounds R   (times only, every run once per round, so that
       the host's drift spreads over all runs; tools/deepspeed_compare.py --timing pools the rounds)
       deepspeed_reference.py --validate-config CFG.json [...]   (DeepSpeedConfig accepts it?)
"""
import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

MiB = 1 << 20


def log(msg):
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------
# Setup


def world():
    """(rank, world size, local rank): torchrun's variables, else Open MPI's (mpirun -np N), else one rank."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"]))
    if "OMPI_COMM_WORLD_RANK" in env:
        return (int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"]),
                int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", env["OMPI_COMM_WORLD_RANK"])))
    return 0, 1, 0


def init_process():
    # Several ranks: one GPU each (local rank modulo the GPUs), or all on one GPU when each
    # names its own NCCL_HOSTID (NCCL then connects them over sockets as separate hosts).
    rank, size, local = world()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(size)
    import torch

    gpu = local % torch.cuda.device_count()
    os.environ["LOCAL_RANK"] = str(gpu)  # DeepSpeed takes cuda:LOCAL_RANK
    # DeepSpeed checks LOCAL_RANK against Open MPI's local rank and refuses a mismatch (ranks
    # sharing a GPU have one): from here it sees torch's variables only.
    for k in [k for k in os.environ if k.startswith("OMPI_COMM_WORLD_")]:
        del os.environ[k]
    torch.cuda.set_device(gpu)
    free0, total = torch.cuda.mem_get_info()  # creates the context
    torch.cuda.synchronize()
    free_ctx, _ = torch.cuda.mem_get_info()
    consts = {"device_total": total, "context_used": total - free_ctx}

    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl")
    import torch.distributed as dist

    def used():
        return total - torch.cuda.mem_get_info()[0]

    def delta(fn):
        """Bytes fn leaves allocated through PyTorch's allocator, and device bytes it takes outside it."""
        torch.cuda.synchronize()
        a0, r0, u0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), used()
        keep = fn()
        torch.cuda.synchronize()
        a1, r1, u1 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), used()
        return keep, a1 - a0, (u1 - u0) - (r1 - r0)

    x, a, outside = delta(lambda: torch.ones(1, device="cuda"))
    _, a, outside = delta(lambda: dist.all_reduce(x))
    consts["nccl_allocated"] = a
    consts["nccl_outside_allocator"] = outside
    # cuBLAS / cuBLASLt workspaces: per (handle, stream); the autograd engine's thread has its own handle.
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y, a, outside = delta(lambda: w @ w)
    consts["cublas_workspace_main"] = a - y.numel() * y.element_size()
    consts["cublas_outside_allocator_main"] = outside
    z, a, outside = delta(lambda: torch.nn.functional.linear(y, w, b))
    consts["cublaslt_workspace_main"] = a - z.numel() * z.element_size()
    consts["cublaslt_outside_allocator_main"] = outside
    _, a, outside = delta(lambda: (y.sum() + z.sum()).backward())
    consts["cublas_workspace_autograd"] = a - w.numel() * w.element_size() - b.numel() * b.element_size()
    consts["cublas_outside_allocator_autograd"] = outside
    del w, b, y, z, x
    gc.collect()
    torch.cuda.empty_cache()
    consts["persistent_allocated_after_setup"] = torch.cuda.memory_allocated()
    consts["device_used_after_setup"] = used()
    consts["reserved_after_setup"] = torch.cuda.memory_reserved()
    return consts


def versions():
    import torch
    import transformers
    import deepspeed

    v = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "deepspeed": deepspeed.__version__,
        "python": sys.version.split()[0],
        "gpu": torch.cuda.get_device_name(0),
    }
    try:
        v["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001
        pass
    try:
        import cpuinfo

        v["host_cpu"] = cpuinfo.get_cpu_info().get("brand_raw", "")
    except Exception:  # noqa: BLE001
        v["host_cpu"] = ""
    v["host_cores"] = os.cpu_count()
    v["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    # Whether fp32 products ran on TF32 tensor cores (the compute model prices fp32 GEMMs on
    # the fp32 cores unless its profile says otherwise).
    v["tf32"] = {
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
    }
    return v


# ----------------------------------------------------------------------------------------
# Model, data and ds_config of one run


def load_model_config(path, attention):
    import transformers

    with open(path) as f:
        d = json.load(f)
    arch = d.get("architectures", [None])[0]
    cfg = transformers.AutoConfig.for_model(**d)
    cfg._attn_implementation = attention
    try:
        cfg.attn_implementation = attention
    except Exception:  # noqa: BLE001
        pass
    return arch, cfg


def build_model(path, attention):
    import torch
    import transformers

    arch, cfg = load_model_config(path, attention)
    cls = getattr(transformers, arch)
    with torch.device("cuda"):
        try:
            model = cls._from_config(cfg, attn_implementation=attention)
        except TypeError:
            model = cls(cfg)
    model.train()
    return model, cfg


def make_batch(cfg, arch, micro_batch, seq_len, step, dtype_ids):
    import torch

    g = torch.Generator(device="cpu").manual_seed(1234 + step)
    vocab = cfg.vocab_size
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=g)
    batch = {"input_ids": ids.cuda(), "labels": ids.clone().cuda()}
    if arch.startswith("Bert"):
        batch["attention_mask"] = torch.ones(micro_batch, seq_len, dtype=torch.long).cuda()
        batch["token_type_ids"] = torch.zeros(micro_batch, seq_len, dtype=torch.long).cuda()
        if arch == "BertForPreTraining":
            batch["next_sentence_label"] = torch.randint(0, 2, (micro_batch,), generator=g).cuda()
    return batch


def ds_config_of(run):
    z = {"stage": run["stage"]}
    z.update(run.get("zero", {}))
    cfg = {
        "train_micro_batch_size_per_gpu": run["micro_batch"],
        "gradient_accumulation_steps": run.get("gas", 1),
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "zero_optimization": z,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    dt = run["dtype"]
    if dt == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dt == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    if "gradient_clipping" in run:
        cfg["gradient_clipping"] = run["gradient_clipping"]
    cfg.update(run.get("extra", {}))
    return cfg


# ----------------------------------------------------------------------------------------
# Where the peak happens: hooks that read the allocator's counters


class PeakTracker:
    """Marks every module entry/exit in forward and every module's backward start; at each
    mark records the allocated bytes now and the maximum since the previous mark."""

    def __init__(self, model):
        import torch

        self.torch = torch
        self.marks = []
        self.stack = []
        self.handles = []
        self.active = False
        for name, m in model.named_modules():
            if not name:
                continue
            self.handles.append(m.register_forward_pre_hook(self._pre(name)))
            self.handles.append(m.register_forward_hook(self._post(name)))

    def mark(self, label):
        if not self.active:
            return
        t = self.torch.cuda
        self.marks.append((label, t.memory_allocated(), t.max_memory_allocated()))
        t.reset_peak_memory_stats()

    def _pre(self, name):
        def hook(mod, args):
            if self.active:
                self.mark("fwd/" + name + ":enter")
                self.stack.append(name)

        return hook

    def _post(self, name):
        def hook(mod, args, out):
            if not self.active:
                return
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
            self.mark("fwd/" + name + ":exit")
            t = out
            if not isinstance(t, self.torch.Tensor):
                t = getattr(out, "logits", None) if not isinstance(out, (tuple, list)) else (out[0] if out else None)
            if isinstance(t, self.torch.Tensor) and t.requires_grad and t.grad_fn is not None:
                t.register_hook(lambda g, n=name: self.mark("bwd/" + n))

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()

    def peak(self):
        """The mark interval holding the largest allocated bytes: (bytes, label before, label after)."""
        best = (-1, "", "")
        for i, (label, now, mx) in enumerate(self.marks):
            if mx > best[0]:
                prev = self.marks[i - 1][0] if i > 0 else "start"
                best = (mx, prev, label)
        return best


# ----------------------------------------------------------------------------------------
# Memory snapshot: the live blocks at the peak, grouped by the frames that allocated them

FENCE_BYTES = 7 * MiB + 123 * 512  # sizes nothing else asks for: the start fence
FENCE_END_BYTES = 9 * MiB + 321 * 512  # and the end fence


def frame_sig(frames, depth=4):
    keep = []
    for fr in frames or []:
        fn = fr.get("filename", "")
        if ("deepspeed" in fn or "transformers" in fn or "deepspeed_reference" in fn
                or "/torch/nn/" in fn or "/torch/optim" in fn or "/torch/autograd" in fn
                or "/torch/utils/checkpoint" in fn):
            short = fn.split("site-packages/")[-1] if "site-packages/" in fn else os.path.basename(fn)
            keep.append(f"{short}:{fr.get('name', '')}:{fr.get('line', 0)}")
            if len(keep) >= depth:
                break
    return " < ".join(keep) if keep else "(no python frame)"


def snapshot_blocks(snap):
    """Active blocks of a snapshot: {addr: (size, frames)}."""
    out = {}
    for seg in snap.get("segments", []):
        addr = seg.get("address", 0)
        for b in seg.get("blocks", []):
            if b.get("state") in ("active_allocated", "active_pending_free"):
                out[addr] = (b["size"], b.get("frames", []))
            addr += b["size"]
    return out


def segment_summary(snap):
    """The allocator's segments (what reserved bytes are): per stream (in order of first
    appearance, the default stream first) and pool, the count, bytes held and bytes in use,
    and every segment's size, largest first."""
    streams, out = {0: 0}, {}
    for seg in snap.get("segments", []):
        st = streams.setdefault(seg.get("stream", 0), len(streams))
        key = f"stream{st}/{seg.get('segment_type', '?')}"
        g = out.setdefault(key, {"segments": 0, "bytes": 0, "allocated": 0, "sizes": []})
        g["segments"] += 1
        g["bytes"] += seg.get("total_size", 0)
        g["allocated"] += seg.get("allocated_size", 0)
        g["sizes"].append(seg.get("total_size", 0))
    for g in out.values():
        g["sizes"].sort(reverse=True)
    return out


def segment_allocs(snap):
    """Every segment the allocator created while the history was on (from before the model
    existed): [stream index, bytes, the frames that asked for it], in order; the default
    stream is 0."""
    streams, out = {0: 0}, []
    for e in snap.get("device_traces", [[]])[0]:
        if e.get("action") == "segment_alloc":
            st = streams.setdefault(e.get("stream", 0), len(streams))
            out.append([st, e.get("size", 0), frame_sig(e.get("frames", []), 3)])
    return out


def peak_composition(before_snap, after_snap, fence_addr_start, fence_addr_end):
    """Replay the allocator trace between the two fences from the live set of before_snap.
    Returns (peak bytes, {signature: [bytes, blocks, persistent]}) at the peak."""
    live = {a: (s, f, True) for a, (s, f) in snapshot_blocks(before_snap).items()}
    cur = sum(s for s, _, _ in live.values())
    traces = after_snap.get("device_traces", [[]])[0]
    # Find the start fence (the last alloc of FENCE size at its address) and the end fence.
    start = None
    for i, e in enumerate(traces):
        if e.get("action") == "alloc" and e.get("addr") == fence_addr_start and e.get("size") == FENCE_BYTES:
            start = i
    if start is None:
        return None
    # the start fence itself was freed right after; skip past its free
    peak, at_peak = cur, dict(live)
    for e in traces[start + 1:]:
        act = e.get("action")
        if act == "alloc":
            if e.get("addr") == fence_addr_end and e.get("size") == FENCE_END_BYTES:
                break
            live[e["addr"]] = (e["size"], e.get("frames", []), False)
            cur += e["size"]
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif act == "free_completed":
            if e.get("addr") in live:
                cur -= live.pop(e["addr"])[0]
    groups = {}
    for a, (s, f, pers) in at_peak.items():
        if s in (FENCE_BYTES, FENCE_END_BYTES):
            continue
        k = ("P " if pers else "S ") + frame_sig(f)
        g = groups.setdefault(k, [0, 0])
        g[0] += s
        g[1] += 1
    return peak, groups


# ----------------------------------------------------------------------------------------
# Profiler trace: GPU busy vs host wall per phase, DeepSpeed's Python hot spots


# The classes the compute model prices kernels by (sim/compute_model.cpp), told by the kernel's
# name: cuBLAS/cuBLASLt GEMMs (nvjet, cutlass, xmma, gemm), fused attention (flash, fmha, PyTorch's
# efficient attention), NCCL, the optimizer's multi-tensor kernels, copies; the rest elementwise.
KERNEL_CLASSES = (
    ("collective", ("nccl",)),
    # cudnn::fusion: cuDNN's sdpa backward's own passes beside its flash kernel (dO·O per row,
    # dQ's conversion to 16 bits, the GQA heads' reduction): the attention's time.
    ("attention", ("flash", "fmha", "attention", "attn", "cudnn::fusion")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "splitk")),
    ("optimizer", ("adam", "multi_tensor", "multitensor")),
)


def kernel_class(name, cat):
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    n = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in n for k in keys):
            return cls
    return "elementwise"


def reduce_profile(trace_path):
    with open(trace_path) as f:
        tr = json.load(f)
    evs = tr.get("traceEvents", tr) if isinstance(tr, dict) else tr
    windows = {}
    launches = {}
    gpu = {}
    py = {}
    for e in evs:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        name = e.get("name", "")
        if cat == "user_annotation" and name.startswith("zp_"):
            windows.setdefault(name[3:], []).append((e["ts"], e["ts"] + e.get("dur", 0)))
        elif cat in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = (e["ts"], name)
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            corr = (e.get("args") or {}).get("correlation")
            gpu.setdefault(corr, []).append((e["ts"], e["ts"] + e.get("dur", 0), cat, name))
        elif cat == "python_function":
            pass
    phases = {}
    for ph, ws in windows.items():
        host = sum(b - a for a, b in ws)
        ivs = []
        n_kernels = 0
        syncs = 0
        by_class = {}
        by_kernel = {}
        for corr, (ts, rname) in launches.items():
            if any(a <= ts <= b for a, b in ws):
                if "Synchronize" in rname or rname in ("cudaMemcpy", "cudaMemcpyAsync"):
                    syncs += "Synchronize" in rname
                for iv in gpu.get(corr, []):
                    ivs.append(iv[:2])
                    n_kernels += 1
                    dur = (iv[1] - iv[0]) * 1e-6
                    cls = kernel_class(iv[3], iv[2])
                    by_class[cls] = by_class.get(cls, 0.0) + dur
                    k = by_kernel.setdefault(iv[3][:160], [cls, 0, 0.0])
                    k[1] += 1
                    k[2] += dur
        ivs.sort()
        busy, end = 0.0, -1e30
        first, last = None, None
        for a, b in ivs:
            first = a if first is None else first
            last = b if last is None else max(last, b)
            if a > end:
                busy += b - a
                end = b
            elif b > end:
                busy += b - end
                end = b
        phases[ph] = {
            "host_wall_s": host * 1e-6,
            "gpu_busy_s": busy * 1e-6,
            "gpu_span_s": ((last - first) * 1e-6) if first is not None else 0.0,
            "kernels": n_kernels,
            "sync_calls": syncs,
            # GPU time per kernel class (summed durations) and the kernels that took the most,
            # so the compute model is checked class by class, not only phase by phase.
            "by_class_s": by_class,
            "top_kernels": sorted(([n, c, k, t] for n, (c, k, t) in by_kernel.items()), key=lambda x: -x[3])[:80],
        }
    # Python functions of DeepSpeed (with_stack profiles record them as python_function).
    for e in evs:
        if e.get("ph") == "X" and e.get("cat") == "python_function":
            name = e.get("name", "")
            if "deepspeed" not in name:
                continue
            key = name.split("site-packages/")[-1]
            p = py.setdefault(key, [0, 0.0])
            p[0] += 1
            p[1] += e.get("dur", 0) * 1e-6
    hot = sorted(([k, v[0], v[1]] for k, v in py.items()), key=lambda x: -x[2])[:60]
    return phases, hot


# ----------------------------------------------------------------------------------------
# One run


PROBE_OPS = 2000


def host_probe(torch):
    """The host's speed at this moment: microseconds per eager op, from PROBE_OPS in-place adds on
    a 256-element CUDA tensor issued from a Python loop (what DeepSpeed's host work is made of:
    the interpreter, PyTorch's dispatcher and a kernel launch; the kernels themselves take a few
    microseconds and the device keeps up). The median of three blocks; taken before and after a
    run's timed steps, so that a host slowed by something else on the machine shows in the run's
    record (docs/deepspeed_fidelity.md)."""
    x = torch.zeros(256, device="cuda")
    blocks = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(PROBE_OPS):
            x.add_(1.0)
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - t0) / PROBE_OPS * 1e6)
    return statistics.median(blocks)


def time_steps(one_step, run, torch):
    """Phase times (a synchronisation between phases; medians) and the iteration time (none; the
    mean of a block of steps), with the garbage collector collected first and held off; the
    host probe before and after them."""
    gc.collect()
    probe_before = host_probe(torch)
    if not run.get("keep_gc"):
        gc.disable()
    try:
        timed = run.get("timed_steps", 5)
        phs = [one_step(True) for _ in range(timed)]
        iters = run.get("iter_steps", 5)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            one_step(False)
        torch.cuda.synchronize()
        iteration = (time.perf_counter() - t0) / iters
    finally:
        gc.enable()
    probe_after = host_probe(torch)
    return {"phases_s": {k: statistics.median(p[k] for p in phs) for k in ("forward", "backward", "step")},
            "phases_all_s": phs, "iteration_s": iteration, "host_probe_us": [probe_before, probe_after]}


def run_one(run, consts, tmpdir):
    import torch
    import deepspeed

    t_run = time.time()
    model_path = run["model"]
    arch, hf_cfg = load_model_config(model_path, run["attention"])
    micro, seq, gas = run["micro_batch"], run["seq_len"], run.get("gas", 1)
    keep_output = run.get("keep_output", False)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free_before_init = torch.cuda.mem_get_info()[0]
    alloc_before_init = torch.cuda.memory_allocated()

    use_history = run.get("snapshot", True)
    if use_history:  # from before the model exists, so every block carries the frames that allocated it
        torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")
    model, hf_cfg = build_model(model_path, run["attention"])
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = sum(1 for _ in model.parameters())
    n_modules = sum(1 for m in model.modules() if any(True for _ in m.parameters(recurse=False)))
    ds_cfg = ds_config_of(run)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
    del model
    res = {
        "name": run["name"],
        "model": os.path.basename(model_path),
        "arch": arch,
        "attention": run["attention"],
        "dtype": run["dtype"],
        "stage": run["stage"],
        "micro_batch": micro,
        "seq_len": seq,
        "gas": gas,
        "keep_output": keep_output,
        "ds_config": ds_cfg,
        "world_size": world()[1],
        "rank": world()[0],
        "round": run.get("round", 0),
        "params": n_params,
        "param_tensors": n_tensors,
        "param_modules": n_modules,
        "optimizer_class": type(engine.optimizer).__name__,
        "inner_optimizer_class": type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__,
    }

    step_no = [0]

    def one_step(sync_phases, tracker=None, annotate=False):
        """One optimizer step (GAS micro-steps). Returns per-phase seconds when sync_phases."""
        ph = {"forward": 0.0, "backward": 0.0, "step": 0.0}
        rf = torch.profiler.record_function
        for ms in range(gas):
            batch = make_batch(hf_cfg, arch, micro, seq, step_no[0] * gas + ms, None)
            if sync_phases:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if tracker:
                tracker.mark(f"ms{ms}/forward:start")
            if annotate:
                with rf("zp_forward"):
                    out = engine(**batch)
                    loss = out.loss
            else:
                out = engine(**batch)
                loss = out.loss
            if not keep_output:
                del out
            if sync_phases:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            if tracker:
                tracker.mark(f"ms{ms}/backward:start")
            if annotate:
                with rf("zp_backward"):
                    engine.backward(loss)
            else:
                engine.backward(loss)
            if sync_phases:
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if tracker:
                tracker.mark(f"ms{ms}/step:start")
            if annotate:
                with rf("zp_step"):
                    engine.step()
            else:
                engine.step()
            if sync_phases:
                torch.cuda.synchronize()
            t3 = time.perf_counter()
            if tracker:
                tracker.mark(f"ms{ms}/step:end")
            if keep_output:
                del out
            del loss
            ph["forward"] += t1 - t0
            ph["backward"] += t2 - t1
            ph["step"] += t3 - t2
        step_no[0] += 1
        return ph

    warmup = run.get("warmup", 3)
    for _ in range(warmup):
        one_step(True)
    torch.cuda.synchronize()

    # --- memory: one steady-state step with hooks and the allocator's history; not in the
    # time-only rounds (--rounds), which take the phase and iteration times alone
    if not run.get("time_only"):
        tracker = PeakTracker(engine.module)
        gc.collect()
        torch.cuda.synchronize()
        before_snap = torch.cuda.memory._snapshot() if use_history else None
        fence = torch.empty(FENCE_BYTES, dtype=torch.uint8, device="cuda")
        fence_start = fence.data_ptr()
        del fence
        torch.cuda.reset_peak_memory_stats()
        alloc_before = torch.cuda.memory_allocated()
        reserved_before = torch.cuda.memory_reserved()
        tracker.active = True
        one_step(False, tracker)
        tracker.active = False
        torch.cuda.synchronize()
        fence = torch.empty(FENCE_END_BYTES, dtype=torch.uint8, device="cuda")
        fence_end = fence.data_ptr()
        del fence
        peak_hooks = tracker.peak()
        free_after = torch.cuda.mem_get_info()[0]
        # the hooks reset the peak counter at each mark: the interval maximum is the step's
        peak_alloc = max(m[2] for m in tracker.marks) if tracker.marks else torch.cuda.max_memory_allocated()
        res["memory"] = {
            "allocated_before_step": alloc_before,
            "allocated_after_step": torch.cuda.memory_allocated(),
            "reserved_before_step": reserved_before,
            "peak_allocated": peak_alloc,
            "peak_reserved": torch.cuda.max_memory_reserved(),
            "reserved_after_step": torch.cuda.memory_reserved(),
            "device_used_after_step": consts["device_total"] - free_after,
            "device_used_before_init": consts["device_total"] - free_before_init,
            "allocated_before_init": alloc_before_init,
            "peak_between": [peak_hooks[1], peak_hooks[2]],
            "num_alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0),
        }
        tracker.remove()
        if use_history:
            after_snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            res["memory"]["segments_after_step"] = segment_summary(after_snap)
            res["memory"]["segment_allocs"] = segment_allocs(after_snap)
            comp = peak_composition(before_snap, after_snap, fence_start, fence_end)
            if comp is not None:
                p, groups = comp
                res["memory"]["snapshot_peak"] = p
                res["memory"]["at_peak"] = sorted(([k, v[0], v[1]] for k, v in groups.items()), key=lambda x: -x[1])[:80]
            del before_snap, after_snap
            gc.collect()

    # --- time: phases with syncs, then iterations without. Python's garbage collector is
    # collected before and held off during the timed steps: its pauses depend on the training
    # script's objects, not on DeepSpeed, and they land in whichever step they happen to hit.
    res.update(time_steps(one_step, run, torch))

    # --- profiler: GPU vs host per phase, DeepSpeed's Python functions
    if run.get("profile", True):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=run.get("py_stacks", True)) as prof:
            one_step(False, annotate=True)
            torch.cuda.synchronize()
        path = os.path.join(tmpdir, "trace.json")
        prof.export_chrome_trace(path)
        del prof
        phases, hot = reduce_profile(path)
        os.remove(path)
        res["profile"] = {"phases": phases, "deepspeed_python": hot}

    res["skipped_steps"] = int(getattr(engine, "skipped_steps", 0))
    res["global_steps"] = int(getattr(engine, "global_steps", 0))
    res["run_seconds"] = time.time() - t_run
    engine.destroy() if hasattr(engine, "destroy") else None
    del engine, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--matrix", help="JSON file: {defaults: {...}, runs: [{name, model, stage, dtype, ...}]}")
    ap.add_argument("--out", help="folder for runs.jsonl and meta.json")
    ap.add_argument("--only", default="", help="comma-separated run names (or name prefixes)")
    ap.add_argument("--exact", action="store_true", help="--only names are exact (no prefixes)")
    ap.add_argument("--validate-config", nargs="*", default=None, help="check ds_configs with DeepSpeedConfig")
    ap.add_argument("--world-size", type=int, default=1, help="data-parallel size the configs are checked for")
    ap.add_argument("--time-only", action="store_true",
                    help="times only: no memory step, no snapshot, no profile (for repeated rounds)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the whole matrix this many times, one run after another in each round, so that "
                         "a drift of the host's speed spreads over every run instead of landing on a few")
    ap.add_argument("--round-index", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--keep-gc", action="store_true",
                    help="leave Python's garbage collector on during the timed steps (to see what it costs)")
    ap.add_argument("--cpus", default="",
                    help="pin the process to these CPUs (e.g. 2,3 or 2-5): DeepSpeed's host work is single-threaded "
                         "Python, and the same run's times moved 1.2-1.9x between unpinned processes")
    args = ap.parse_args()
    if args.cpus:
        cpus = set()
        for part in args.cpus.split(","):
            a, _, b = part.partition("-")
            try:
                cpus.update(range(int(a), int(b or a) + 1))
            except ValueError:
                print(f"deepspeed_reference: --cpus {args.cpus}: a list of CPU numbers or ranges (2,3 or 2-5)", file=sys.stderr)
                sys.exit(2)
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:
            print(f"deepspeed_reference: --cpus {args.cpus}: {e}", file=sys.stderr)
            sys.exit(2)

    if args.validate_config is not None:
        # Config validation needs no GPU and no process group: on a machine without CUDA,
        # DeepSpeed's CPU accelerator lets it import.
        import torch
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        from deepspeed.runtime.config import DeepSpeedConfig

        # DeepSpeedConfig asks the process group for the rank (the mpu below gives the
        # data-parallel size); one CPU process over gloo is enough.
        for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
            os.environ.setdefault(k, v)
        deepspeed.init_distributed(dist_backend="gloo")

        class DataParallelOf:  # the model-parallel unit DeepSpeedConfig asks for the data-parallel size
            def __init__(self, n):
                self.n = n

            def get_data_parallel_world_size(self):
                return self.n

            def get_model_parallel_world_size(self):
                return 1

        bad = 0
        for p in args.validate_config:
            try:
                DeepSpeedConfig(p, mpu=DataParallelOf(args.world_size))
                log(f"accepted {p}")
            except Exception as e:  # noqa: BLE001
                bad += 1
                log(f"REFUSED {p}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        sys.exit(1 if bad else 0)

    with open(args.matrix) as f:
        mx = json.load(f)
    defaults = mx.get("defaults", {})
    runs = [dict(defaults, **r) for r in mx["runs"]]
    if os.environ.get("ZP_TIMED_STEPS"):  # more timed steps where the host's noise needs them
        for r in runs:
            r["timed_steps"] = int(os.environ["ZP_TIMED_STEPS"])
    if args.time_only:
        for r in runs:
            r.update(time_only=True, snapshot=False, profile=False)
    for r in runs:
        r["keep_gc"] = args.keep_gc
    if args.rounds < 1:
        print(f"deepspeed_reference: --rounds {args.rounds}: at least 1", file=sys.stderr)
        sys.exit(2)
    if args.round_index is not None:  # one run of round K, in a process of its own
        args.rounds = 1
    base = os.path.dirname(os.path.abspath(args.matrix))
    for r in runs:
        if not os.path.isabs(r["model"]):
            r["model"] = os.path.normpath(os.path.join(base, r["model"]))
    if args.only:
        keys = args.only.split(",")
        runs = [r for r in runs if any(r["name"] == k or (not args.exact and r["name"].startswith(k)) for k in keys)]
    if world()[1] > 1:  # one folder per rank: each measures its own memory and times
        args.out = os.path.join(args.out, f"rank{world()[0]}")
    os.makedirs(args.out, exist_ok=True)
    consts = init_process()
    meta = {"versions": versions(), "constants": consts, "date": time.strftime("%Y-%m-%d")}
    if args.round_index is None:
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        log(json.dumps(meta))
    out = open(os.path.join(args.out, "runs.jsonl"), "a")
    tmpdir = tempfile.mkdtemp()
    t0 = time.time()
    budget = float(os.environ.get("ZP_BUDGET_S", "1e9"))
    for rnd in range(args.rounds):
        if time.time() - t0 > budget:
            break
        for r in runs:
            if time.time() - t0 > budget:
                log(f"budget spent: round {rnd}, {r['name']} and later runs not run")
                break
            if r.get("isolate", r["stage"] == 3) and args.round_index is None:
                # DeepSpeed's stage 3 keeps references to its engine after destroy(): run it in a
                # process of its own so that its memory does not stay in the next runs' figures.
                import subprocess

                out.flush()
                env = dict(os.environ, MASTER_PORT=str(int(os.environ["MASTER_PORT"]) + 1 + rnd * len(runs) + runs.index(r)))
                parent_out = os.path.dirname(args.out) if world()[1] > 1 else args.out
                rc = subprocess.call([sys.executable, os.path.abspath(__file__), "--matrix", args.matrix, "--out",
                                      parent_out, "--only", r["name"], "--exact", "--round-index", str(rnd)]
                                     + (["--time-only"] if args.time_only else [])
                                     + (["--keep-gc"] if args.keep_gc else []), env=env)
                if rc != 0:
                    out.write(json.dumps({"name": r["name"], "error": f"child exited with status {rc}"}) + "\n")
                continue
            this_round = rnd if args.round_index is None else args.round_index
            try:
                res = run_one(dict(r, round=this_round), consts, tmpdir)
                m = res.get("memory", {"peak_allocated": float("nan"), "peak_reserved": float("nan")})
                log(f"{r['name']:<28} r{this_round} peak {m['peak_allocated'] / MiB:9.1f} MiB reserved {m['peak_reserved'] / MiB:9.1f} "
                    f"fwd {res['phases_s']['forward'] * 1e3:7.1f} bwd {res['phases_s']['backward'] * 1e3:7.1f} "
                    f"step {res['phases_s']['step'] * 1e3:7.1f} iter {res['iteration_s'] * 1e3:7.1f} ms "
                    f"[{res['optimizer_class']}] {res['run_seconds']:.1f}s")
                res["process_constants"] = consts
            except Exception as e:  # noqa: BLE001
                res = {"name": r["name"], "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
                log(f"{r['name']}: FAILED {res['error']}")
                if world()[1] > 1:  # the other ranks would wait in this run's collectives: end them all
                    out.write(json.dumps(res) + "\n")
                    out.close()
                    os._exit(1)
                import torch

                gc.collect()
                torch.cuda.empty_cache()
            out.write(json.dumps(res) + "\n")
            out.flush()
    out.close()


if __name__ == "__main__":
    main()
