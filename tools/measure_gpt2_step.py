#!/usr/bin/env python3
"""Measure the forward and forward+backward time of GPT-2 124M on one CUDA GPU.

The model is Hugging Face transformers' GPT2LMHeadModel built from a
GPT2Config with random weights (nothing is downloaded), on the GPU, cast as a
whole to torch.bfloat16 (no mixed precision, no optimizer), in train mode, with
the "sdpa" attention implementation. Variants:

  hf_sdpa             default GPT2Config (vocab 50257, gelu_new, dropouts 0.1)
  efficient_eager     gelu_pytorch_tanh, vocab padded to 50304, dropouts 0.0
  efficient_compiled  as efficient_eager, the model wrapped in torch.compile

One training step is: zero the gradients (set_to_none), loss =
model(input_ids=x, labels=x).loss, loss.backward(), with x random token ids in
[0, 50257) of shape (micro_batch, seq). CUDA events are recorded before the
forward, after the forward has returned the loss (forward_ms) and after the
backward (fwd_bwd_ms); the device is synchronized after every step. After the
warm-up steps (more for the compiled model, whose first steps compile) the
median of the measured steps is reported, with every sample. Peak memory is
torch.cuda.max_memory_allocated() after a reset before each variant. Each
variant gets a fresh model; memory is freed between variants. The JSON file is
rewritten after each variant, so a run stopped early keeps what it measured.

MFU = (6*P*tokens + 12*L*h*s*tokens) / (fwd_bwd_s * peak), P the number of
unique parameters (the tied LM head counted once), tokens = micro_batch * seq,
peak = 989.4e12 FLOP/s (H100/H200 SXM dense bf16).

Usage:
    python3 tools/measure_gpt2_step.py --out gpt2_step.json
"""
import argparse
import gc
import json
import statistics
import time

import torch
import torch._dynamo
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

PEAK_FLOPS = 989.4e12
MFU_FORMULA = ("(6*P*tokens + 12*L*h*s*tokens) / (fwd_bwd_ms/1000 * 989.4e12), "
               "P = unique parameters (tied LM head once), tokens = micro_batch*seq")

BASE = dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
EFFICIENT = dict(activation_function="gelu_pytorch_tanh", vocab_size=50304,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def build(cfg_kwargs):
    config = GPT2Config(**BASE, **cfg_kwargs, attn_implementation="sdpa")
    with torch.device("cuda"):
        model = GPT2LMHeadModel(config)
    model.to(dtype=torch.bfloat16)
    model.train()
    return model


def step(model, x, events):
    model.zero_grad(set_to_none=True)
    events[0].record()
    loss = model(input_ids=x, labels=x).loss
    events[1].record()
    loss.backward()
    events[2].record()
    torch.cuda.synchronize()
    return loss


def measure(name, cfg_kwargs, micro_batch, seq, compile_model, warmup, iters):
    res = dict(variant=name, micro_batch=micro_batch, seq=seq,
               config=dict(BASE, **cfg_kwargs), torch_compile=compile_model)
    model = compiled = x = None
    try:
        torch.cuda.reset_peak_memory_stats()
        model = build(cfg_kwargs)
        res["attn_implementation"] = model.config._attn_implementation
        params = sum(p.numel() for p in model.parameters())  # unique tensors
        res["params"] = params
        compiled = torch.compile(model) if compile_model else model
        x = torch.randint(0, 50257, (micro_batch, seq), device="cuda")
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        t0 = time.time()
        for _ in range(warmup):
            step(compiled, x, events)
        res["warmup_steps"] = warmup
        res["warmup_s"] = round(time.time() - t0, 2)
        fwd, fb = [], []
        for _ in range(iters):
            loss = step(compiled, x, events)
            fwd.append(events[0].elapsed_time(events[1]))
            fb.append(events[0].elapsed_time(events[2]))
        res["loss_last"] = loss.detach().item()
        res["forward_ms"] = statistics.median(fwd)
        res["fwd_bwd_ms"] = statistics.median(fb)
        res["forward_samples_ms"] = fwd
        res["fwd_bwd_samples_ms"] = fb
        L, h = BASE["n_layer"], BASE["n_embd"]
        tokens = micro_batch * seq
        flops = 6 * params * tokens + 12 * L * h * seq * tokens
        res["flops_per_step"] = flops
        res["mfu"] = flops / (res["fwd_bwd_ms"] / 1000 * PEAK_FLOPS)
        res["tokens_per_s"] = tokens / (res["fwd_bwd_ms"] / 1000)
        res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    except torch.cuda.OutOfMemoryError as e:
        res["error"] = "OOM: " + str(e)[:500]
    except Exception as e:  # compile failures are recorded, not fatal
        res["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
    del model, compiled, x
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile-warmup", type=int, default=6)
    ap.add_argument("--time-budget-s", type=float, default=200,
                    help="skip remaining variants once this much time has passed")
    args = ap.parse_args()

    start = time.time()
    out = dict(torch=torch.__version__, transformers=transformers.__version__,
               cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0),
               dtype="bfloat16 (whole model)", peak_flops=PEAK_FLOPS,
               mfu_formula=MFU_FORMULA, results=[])
    plan = [("hf_sdpa", {}, 16, False),
            ("efficient_eager", EFFICIENT, 16, False),
            ("efficient_eager", EFFICIENT, 32, False),
            ("efficient_compiled", EFFICIENT, 16, True),
            ("efficient_compiled", EFFICIENT, 32, True)]
    for name, cfg, mb, comp in plan:
        if time.time() - start > args.time_budget_s:
            r = dict(variant=name, micro_batch=mb, error="skipped: time budget")
        else:
            warmup = args.compile_warmup if comp else args.warmup
            r = measure(name, cfg, mb, args.seq, comp, warmup, args.iters)
        out["results"].append(r)
        out["elapsed_s"] = round(time.time() - start, 1)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"{name:20s} mb={mb:2d} fwd={r.get('forward_ms', float('nan')):7.2f} ms "
              f"fwd+bwd={r.get('fwd_bwd_ms', float('nan')):7.2f} ms "
              f"mfu={r.get('mfu', float('nan')):.3f} "
              f"peak={r.get('peak_allocated_bytes', 0) / 2**30:.1f} GiB "
              f"{r.get('error', '')[:200]}", flush=True)


if __name__ == "__main__":
    main()
