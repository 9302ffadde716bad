#!/usr/bin/env bash
# zeroplan train --device cuda beside PyTorch (eager and torch.compile) on the same shapes,
# dtype and optimizer, stage 0, one GPU; one line per model with tokens/s, MFU and the
# ratio. Runs on the GPU machine in one call; results to $OUT (else ./bench-out).
#
#   ZEROPLAN=path/to/zeroplan bash bench/gpu_vs_torch.sh [quick]
#   ZEROPLAN_BENCH_CASES='bert-large-uncased 64 128 fp16' ...  # some rows only (';' between rows)
#   ZEROPLAN_BENCH_FLAGS='...'  # zeroplan train's kernel variants (default --fused-gelu --fused-loss
#                               # --fused-residual-norm --fused-mlp: GPT-2's gelu_new as one op, the loss
#                               # as one cross entropy on the 16-bit logits, dropout + residual sum +
#                               # LayerNorm as one op, as torch.compile fuses them, and GPT-2's MLP with
#                               # the GELU as its products' cuBLASLt epilogues; '' for HF's graph)
#   ZEROPLAN_BENCH_ATTENTION='own cudnn'  # zeroplan's fused attention kernels, a row each
#                               # (train --attention-kernel; default cudnn, the flash kernels PyTorch's
#                               # sdpa runs on Hopper: 16-bit cases, a build with cuDNN; 'own' for fp32
#                               # rows or a build without it, whose zeroplan cells are otherwise nan);
#                               # PyTorch runs once per model
# The four rows take about eight minutes on an H200 (torch.compile's compilation most of it).
# MFU counts 6 · params · tokens (the model FLOPs of a training step, without attention's)
# against the H200's dense peak (989 TFLOP/s bf16/fp16, sim/device.cpp's figure); MFU+attn adds
# attention's 12 · layers · hidden · seq per token, as PaLM's appendix B and nanoGPT count it
# (the full T×T scores, causal or not). Memory, in
# GiB as the driver sees it: zeroplan's peak (cudaMemGetInfo after every allocation: context,
# libraries, reserved segments, scratch) beside PyTorch's device use after its steps (context,
# libraries and the caching allocator's segments, which it keeps).
set -uo pipefail
cd "$(dirname "$0")/.."
ZP=${ZEROPLAN:-build/cli/zeroplan}
OUTDIR=${OUT:-bench-out}
mkdir -p "$OUTDIR"
PEAK=989e12
CASES=("gpt2 16 1024 bf16" "gpt2-medium 16 1024 bf16" "bert-large-uncased 64 128 bf16" "bert-large-uncased 64 128 fp16")
[ "${1:-}" = quick ] && CASES=("gpt2 16 1024 bf16")
[ -n "${ZEROPLAN_BENCH_CASES:-}" ] && IFS=';' read -r -a CASES <<< "$ZEROPLAN_BENCH_CASES"
ATTN=(${ZEROPLAN_BENCH_ATTENTION:-cudnn})
printf '%-20s %-5s %-5s %12s %12s %12s %8s %9s %8s %8s %9s %9s %9s\n' model dtype attn zeroplan_tok/s eager_tok/s compile_tok/s zp_MFU MFU+attn vs_eager vs_compile zp_GiB eager_GiB comp_GiB
for c in "${CASES[@]}"; do
  set -- $c
  m=$1 mb=$2 seq=$3 dt=$4
  cfg=$OUTDIR/ds_${m}_$dt.json
  echo "{\"train_micro_batch_size_per_gpu\": $mb, \"$dt\": {\"enabled\": true}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}, \"zero_optimization\": {\"stage\": 0}}" > "$cfg"
  e=$(python3 bench/torch_step.py --model "$m" --micro-batch "$mb" --seq "$seq" --dtype "$dt" --attention sdpa 2>>"$OUTDIR/torch.log" | tail -1)
  k=$(python3 bench/torch_step.py --model "$m" --micro-batch "$mb" --seq "$seq" --dtype "$dt" --attention sdpa --compile 2>>"$OUTDIR/torch.log" | tail -1)
  for ak in "${ATTN[@]}"; do
  run=zp_${m}_$dt$([ "$ak" = own ] || echo "_$ak")
  "$ZP" train --model "$m" --ds-config "$cfg" --seq-len "$seq" --steps 6 --device cuda --attention sdpa --quiet \
    --attention-kernel "$ak" ${ZEROPLAN_BENCH_FLAGS---fused-gelu --fused-loss --fused-residual-norm --fused-mlp} \
    --out "$OUTDIR/$run.json" > "$OUTDIR/$run.log" 2>&1
  zp=$(python3 -c "import json;d=json.load(open('$OUTDIR/$run.json'));print(d['step_seconds'])" 2>/dev/null || echo nan)
  zpmem=$(python3 -c "import json;d=json.load(open('$OUTDIR/$run.json'));print(d['driver_memory']['peak'])" 2>/dev/null || echo nan)
  python3 - "$m" "$dt" "$mb" "$seq" "$zp" "$e" "$k" "$PEAK" "$zpmem" "$ak" <<'PY'
import json, sys
m, dt, mb, seq, zp, e, k, peak, zpmem, ak = sys.argv[1:]
tok = int(mb) * int(seq)
def tps(j):
    try: return json.loads(j)["tokens_per_s"]
    except Exception: return float("nan")
def params(j):
    try: return json.loads(j)["params"]
    except Exception: return float("nan")
z = tok / float(zp) if zp not in ("nan", "0", "0.0") else float("nan")
te, tk = tps(e), tps(k)
mfu = 6 * params(e) * z / float(peak)
cat = json.load(open(f"models/catalog/{m}.json"))
layers = cat.get("n_layer", cat.get("num_hidden_layers", 0))
hidden = cat.get("n_embd", cat.get("hidden_size", 0))
mfu_attn = (6 * params(e) + 12 * layers * hidden * int(seq)) * z / float(peak)
def used(j):  # GiB the driver saw in use after PyTorch's steps
    try: return json.loads(j)["device_used"] / 2**30
    except Exception: return float("nan")
zg = float(zpmem) / 2**30 if zpmem != "nan" else float("nan")  # zeroplan: the driver's peak
print(f"{m:<20} {dt:<5} {ak:<5} {z:12.0f} {te:12.0f} {tk:12.0f} {100*mfu:7.1f}% {100*mfu_attn:8.1f}% {z/te:8.2f} {z/tk:8.2f} {zg:9.2f} {used(e):9.2f} {used(k):9.2f}")
PY
  done
done
