#!/usr/bin/env bash
# On a machine with a CUDA GPU: the measurements of calibration's held-out check against
# zeroplan's own CUDA executor (docs/calibration.md, "Held out on the CUDA executor").
#
#   1. `zeroplan train --device cuda` for a matrix of runs (GPT-2 at stages 0-3, other
#      micro-batches and GAS, overlap off, fp16, eager attention; GPT-2 medium, BERT-large and a
#      300M Llama), each writing its per-event CUDA-event times (--out);
#   2. `zeroplan calibrate --device cuda` micro-benchmarks of GPT-2's, BERT-large's and the
#      Llama's ops, saved with --save-observations so that the fit can be redone anywhere;
#   3. the fit on the micro-benchmarks and GPT-2's stage 0 and 1 runs, every other run held out,
#      reported per phase (calibrate --report).
#
# Binaries built elsewhere (ZEROPLAN_GPU_BIN, default .gpu-bundle: zeroplan and the libraries
# it links, see scripts/gpu_calibrate.sh --bundle). Results go to DIR/heldout: train/NAME.json,
# configs/NAME.json, device_observations.json, calibrate.txt, calibrate.json, profile.json;
# with $OUT set, those files and heldout_runs.tar.gz (train/ and configs/) are copied there.
# ZEROPLAN_HELDOUT_RUNS=NAME,... runs only those rows of the matrix.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$(cd "${ZEROPLAN_GPU_BIN:-.gpu-bundle}" && pwd)
ZP=$BIN/zeroplan
RES=$BIN/heldout
mkdir -p "$RES/train" "$RES/configs"
BUNDLE=$BIN
# shellcheck source=scripts/gpu_bundle_env.sh
. scripts/gpu_bundle_env.sh || exit 1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
nvidia-smi -L

# name model seq micro gas stage dtype attention overlap
MATRIX="
gpt2-s0        gpt2                 1024 8  1 0 bf16 sdpa  true
gpt2-s1        gpt2                 1024 8  1 1 bf16 sdpa  true
gpt2-s2        gpt2                 1024 8  1 2 bf16 sdpa  true
gpt2-s3        gpt2                 1024 8  1 3 bf16 sdpa  true
gpt2-s1-mb4    gpt2                 1024 4  1 1 bf16 sdpa  true
gpt2-s2-gas2   gpt2                 1024 4  2 2 bf16 sdpa  true
gpt2-s2-nooverlap gpt2              1024 8  1 2 bf16 sdpa  false
gpt2-s1-fp16   gpt2                 1024 8  1 1 fp16 sdpa  true
gpt2-s1-eager  gpt2                 1024 8  1 1 bf16 eager true
gpt2m-s1       gpt2-medium          1024 8  1 1 bf16 sdpa  true
bertl-s0       bert-large-uncased   128  64 1 0 bf16 sdpa  true
bertl-s2       bert-large-uncased   128  64 1 2 bf16 sdpa  true
llama-s1       tests/data/deepspeed/llama-300m.json 1024 8 1 1 bf16 sdpa true
llama-s3       tests/data/deepspeed/llama-300m.json 1024 8 1 3 bf16 sdpa true
"
want=",${ZEROPLAN_HELDOUT_RUNS:-},"
status=0
while read -r name model seq mb gas stage dt att overlap; do
  [ -z "$name" ] && continue
  if [ "$want" != ",," ] && [[ "$want" != *",$name,"* ]]; then continue; fi
  cfg=$RES/configs/$name.json
  echo "{\"train_micro_batch_size_per_gpu\": $mb, \"gradient_accumulation_steps\": $gas, \"$dt\": {\"enabled\": true}," \
       "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4, \"weight_decay\": 0.01}}," \
       "\"zero_optimization\": {\"stage\": $stage, \"overlap_comm\": $overlap}}" > "$cfg"
  start=$(date +%s%N)
  if timeout 240 "$ZP" train --model "$model" --ds-config "$cfg" --seq-len "$seq" --attention "$att" --steps 5 \
      --device cuda --quiet --out "$RES/train/$name.json" > "$RES/train/$name.log" 2>&1; then
    printf '%-20s ok   %6d ms\n' "$name" $(( ($(date +%s%N) - start) / 1000000 ))
  else
    printf '%-20s FAILED (log: train/%s.log)\n' "$name" "$name"; tail -n 3 "$RES/train/$name.log"; status=1
  fi
done <<< "$MATRIX"

# The micro-benchmarks of each model's ops at its runs' shape, saved.
obs=()
for m in "gpt2 1024 8 gpt2-s1" "bert-large-uncased 128 64 bertl-s2" "tests/data/deepspeed/llama-300m.json 1024 8 llama-s1"; do
  read -r model seq mb cfgname <<< "$m"
  tag=$(basename "$model" .json)
  "$ZP" calibrate --device cuda --model "$model" --ds-config "$RES/configs/$cfgname.json" --seq-len "$seq" \
    --micro-batch "$mb" --budget 1 --save-observations "$RES/device_observations_$tag.json" \
    > "$RES/device_calibrate_$tag.txt" 2>&1 || status=1
  tail -n 3 "$RES/device_calibrate_$tag.txt"
  obs+=(--observations "$RES/device_observations_$tag.json")
done

# The held-out check (the same command runs anywhere on the saved files): fitted on the
# micro-benchmarks and GPT-2's runs at stages 0 and 1, every other run held out.
args=()
for f in "$RES"/train/*.json; do args+=(--train-out "$f"); done
"$ZP" calibrate "${obs[@]}" "${args[@]}" --fit-where 'source=device;source=train,run=gpt2-s0|gpt2-s1' --report \
  --out "$RES/profile.json" > "$RES/calibrate.txt" 2> "$RES/calibrate.err" || status=1
"$ZP" calibrate "${obs[@]}" "${args[@]}" --fit-where 'source=device;source=train,run=gpt2-s0|gpt2-s1' --json \
  > "$RES/calibrate.json" 2>/dev/null || status=1
sed -n '/held-out runs/,/^$/p' "$RES/calibrate.txt"
cat "$RES/calibrate.err"
if [ -n "${OUT:-}" ]; then
  cp "$RES"/calibrate.txt "$RES"/calibrate.json "$OUT"/
  cp "$RES"/profile.json "$OUT"/ 2>/dev/null
  tar czf "$OUT/heldout_runs.tar.gz" -C "$RES" train configs device_observations_gpt2.json \
    device_observations_bert-large-uncased.json device_observations_llama-300m.json device_calibrate_gpt2.txt
fi
exit $status
