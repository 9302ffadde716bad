#!/usr/bin/env python3
"""Hugging Face parity: the same weights and the same batch in transformers (PyTorch) and in
`zeroplan train`, one step, fp32: the loss and every parameter gradient compared.

For each tiny model of the catalogue (dropout off), transformers builds the model from the
same config.json with seeded random weights and saves them as safetensors; zeroplan trains
one step from them (`--init-weights`) with SGD at a learning rate of 2^16 and writes the
weights after it (`--save-weights`) and its batch (`--save-batch`), so its gradient is
(w0 - w1) / lr; transformers runs the forward and backward on that batch. Prints one line
per model with the loss difference and the worst gradient error, and (--golden DIR) writes
what the CI test tests/test_hf_parity.cpp checks zeroplan against on the CPU: the config,
the weights, the batch, transformers' loss and gradients.

  python3 tools/hf_parity.py --zeroplan build/cli/zeroplan [--golden DIR]
Needs torch, transformers and safetensors (the GPU machine has them; CPU wheels suffice).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

LR = 65536.0
# (loss, gradient) relative bounds: fp32 differs in summation order only; bf16 rounds every
# tensor, on each side in its own order (the bound is what was measured, with margin).
TOL = {"fp32": (1e-5, 1e-5), "bf16": (1e-4, 1e-2)}
CASES = [("tiny-gpt2", "eager"), ("tiny-gpt2", "sdpa"), ("tiny-llama", "eager"), ("tiny-llama", "sdpa"),
         ("tiny-bert", "eager"), ("tiny-bert", "sdpa")]
DROPOUT_KEYS = ["attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout", "hidden_dropout_prob",
                "attention_probs_dropout_prob", "attention_dropout", "classifier_dropout"]


def rel(a, b):
    d = torch.linalg.vector_norm(a.double() - b.double()).item()
    n = torch.linalg.vector_norm(b.double()).item()
    return d / n if n > 0 else d


def run(zp, model, attention, work, golden, dtype="fp32"):
    import transformers
    from safetensors.torch import load_file, save_file
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "models", "catalog", model + ".json")) as f:
        cfg = json.load(f)
    for k in DROPOUT_KEYS:
        if k in cfg and cfg[k] is not None:
            cfg[k] = 0.0
    d = os.path.join(work, f"{model}-{attention}")
    os.makedirs(d, exist_ok=True)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    hf_cfg = transformers.AutoConfig.from_pretrained(d)
    hf_cfg._attn_implementation = attention
    torch.manual_seed(0)
    arch = cfg["architectures"][0]
    m = getattr(transformers, arch)(hf_cfg).float().train()
    if dtype == "bf16":  # DeepSpeed's bf16: the module cast to bf16 (weights rounded once, here)
        m = m.to(torch.bfloat16)
    w0 = {n: p.detach().clone().contiguous() for n, p in m.named_parameters()}
    save_file(w0, os.path.join(d, "weights.safetensors"))
    ds = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": LR}},
          "zero_optimization": {"stage": 0}}
    if dtype == "bf16":
        ds["bf16"] = {"enabled": True}
    with open(os.path.join(d, "ds_config.json"), "w") as f:
        json.dump(ds, f)
    cmd = [zp, "train", "--model", cfg_path, "--ds-config", os.path.join(d, "ds_config.json"), "--steps", "1",
           "--seq-len", "16", "--attention", attention, "--quiet", "--init-weights", os.path.join(d, "weights.safetensors"),
           "--save-weights", os.path.join(d, "after.safetensors"), "--save-batch", os.path.join(d, "batch.json"),
           "--out", os.path.join(d, "out.json")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{model} {attention}: zeroplan failed: {r.stdout}{r.stderr}")
        return False
    zp_loss = json.load(open(os.path.join(d, "out.json")))["losses"][0]
    w1 = load_file(os.path.join(d, "after.safetensors"))
    batch = json.load(open(os.path.join(d, "batch.json")))
    inputs = {k: torch.tensor(v["micro_batches"][0], dtype=torch.long).reshape(v["shape"]) for k, v in batch.items()}
    if arch.endswith("CausalLM") or arch == "GPT2LMHeadModel":
        # zeroplan's labels are the next tokens already (the shift transformers does inside).
        labels = inputs.pop("labels")
        logits = m(**inputs).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100)
    else:
        loss = m(**inputs).loss
    loss.backward()
    worst, worst_name = 0.0, ""
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().contiguous() for n, p in m.named_parameters()}
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads.values()])).item()
    zero_grad = []
    dsum = 0.0
    for n, g_hf in grads.items():
        g_zp = (w0[n].double() - w1[n].double()) / LR  # bf16: w1 is rounded to bf16, |LR·g| >> |w0|
        dsum += torch.linalg.vector_norm(g_zp - g_hf.double()).item() ** 2
        if torch.linalg.vector_norm(g_hf.double()).item() < 1e-6 * total:
            # A gradient that is zero in exact arithmetic (BERT's key biases: softmax ignores a
            # constant per row) is rounding noise on both sides: compared against the whole
            # gradient's norm instead.
            zero_grad.append(n)
            e = torch.linalg.vector_norm(g_zp - g_hf.double()).item() / total
        else:
            e = rel(g_zp, g_hf)
        if e > worst:
            worst, worst_name = e, n
    dl = abs(zp_loss - loss.item()) / abs(loss.item())
    whole = dsum ** 0.5 / total  # the whole gradient's relative error
    # bf16 is judged on the whole gradient: a tensor whose gradient is a difference of nearly
    # equal terms (BERT's next-sentence bias: two terms of about 0.49 whose bf16 roundings,
    # 2^-9, are 15% of their difference) is off by that much on both sides against the exact
    # value, so its per-tensor error measures bf16, not the model.
    ok = dl <= TOL[dtype][0] and (worst if dtype == "fp32" else whole) <= TOL[dtype][1]
    print(f"{model:<11} {attention:<6} {dtype:<5} loss hf {loss.item():.7f} zeroplan {zp_loss:.7f} (rel {dl:.1e}); "
          f"whole gradient rel error {whole:.1e}, worst tensor {worst:.1e} ({worst_name}); {len(grads)} tensors"
          f"{f' ({len(zero_grad)} zero in exact arithmetic)' if zero_grad else ''}  {'OK' if ok else 'FAIL'}")
    if golden and dtype == "fp32":  # per model: the inputs once, transformers' results per attention
        g = os.path.join(golden, model)
        os.makedirs(g, exist_ok=True)
        for name in ["config.json", "ds_config.json", "weights.safetensors", "batch.json"]:
            with open(os.path.join(d, name), "rb") as src, open(os.path.join(g, name), "wb") as dst:
                dst.write(src.read())
        save_file(grads, os.path.join(g, f"grads.{attention}.safetensors"))
        ref_path = os.path.join(g, "reference.json")
        ref = json.load(open(ref_path)) if os.path.exists(ref_path) else {}
        ref.update({"lr": LR, "torch": torch.__version__, "transformers": transformers.__version__})
        ref.setdefault("loss", {})[attention] = loss.item()
        with open(ref_path, "w") as f:
            json.dump(ref, f, indent=1)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zeroplan", required=True)
    ap.add_argument("--golden", help="write the fp32 reference data for tests/test_hf_parity.cpp here")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ok = True
    with tempfile.TemporaryDirectory() as work:
        for dtype in (["fp32", "bf16"] if a.dtype == "both" else [a.dtype]):
            for model, attention in CASES:
                ok = run(a.zeroplan, model, attention, os.path.join(work, dtype), a.golden, dtype) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
