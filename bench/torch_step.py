#!/usr/bin/env python3
"""PyTorch's training step on the shapes `bench/gpu_vs_torch.sh` gives zeroplan: a Hugging Face
model built from its config (random weights), fp32 params under autocast (bf16 or fp16),
fused AdamW, eager or torch.compile. Prints one JSON line: step seconds (median of the
timed steps), tokens/s.

  python3 bench/torch_step.py --model gpt2 --micro-batch 16 --seq 1024 --dtype bf16 [--compile]
"""
import argparse
import json
import statistics
import time

import torch

MODELS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),
    "gpt2-medium": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 1024, "n_layer": 24, "n_head": 16}),
    "bert-large-uncased": ("BertConfig", "BertForMaskedLM",
                           {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                            "intermediate_size": 4096, "vocab_size": 30522}),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--attention", default="eager")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    import transformers
    cfg_name, model_name, over = MODELS[a.model]
    cfg = getattr(transformers, cfg_name)(**over)
    cfg.attn_implementation = a.attention
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=a.dtype == "fp16")
    ids = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=dt):
            loss = model(input_ids=ids, labels=ids).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    run = torch.compile(step) if a.compile else step
    times = []
    for i in range(a.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        if i >= 3:  # warm-up (and compilation)
            times.append(time.perf_counter() - t)
    s = statistics.median(times)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": a.model, "compile": a.compile, "dtype": a.dtype, "step_seconds": s,
                      "tokens_per_s": a.micro_batch * a.seq / s, "params": n,
                      "peak_allocated": torch.cuda.max_memory_allocated(),
                      "peak_reserved": torch.cuda.max_memory_reserved(),
                      # what the driver sees in use after the steps: the context, the libraries'
                      # workspaces and the caching allocator's segments (never returned unasked)
                      "device_used": (lambda f, t: t - f)(*torch.cuda.mem_get_info())}))


if __name__ == "__main__":
    main()
