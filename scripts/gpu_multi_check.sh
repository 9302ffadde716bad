#!/usr/bin/env bash
# On a machine with N >= 2 GPUs of one host (N = every visible GPU, or $ZEROPLAN_GPUS), in one
# call: ZeRO 0-3 measured by zeroplan's CUDA executor with NCCL against the prediction for the
# same cluster, and what calibration on that machine buys.
#
#   1. `mpirun -np N zeroplan collectives --measure --device cuda` (all-reduce, reduce-scatter,
#      all-gather, fp32, 8 B - 1 GiB, factor 2 by default) beside `zeroplan collectives` for N
#      ranks of the cluster preset: time and bus bandwidth per size, the error per size;
#      nccl-tests format in sweep.txt.
#   2. `mpirun -np N zeroplan train --device cuda` of bert-large (examples/
#      bert_large_ds_config.json's settings, micro-batch 64, seq 128) and GPT-2 XL (1.5B,
#      micro-batch 4, seq 1024, bf16) at stages 0-3, overlap_comm on and off, a few steps each;
#      `zeroplan compare` of rank 0 with `zeroplan simulate` for the same rank: bytes per
#      category (exact, as on one GPU), reserved, per collective; time per phase.
#   3. `zeroplan calibrate` from the sweep and the stage 0 and 1 runs (--out profile.json), then
#      the other runs predicted again with --profile: the time errors before and after.
#
# Binaries built elsewhere (ZEROPLAN_GPU_BIN, default .gpu-bundle, with scripts/gpu_bundle_env.sh's
# data_dir). Results under $OUT (else DIR/multi): sweep.txt, sweep_table.txt, train/NAME.rank*.json,
# pred/NAME.json, compare/NAME.txt, calibrate.txt, profile.json, summary.txt.
# ZEROPLAN_MULTI_RUNS=NAME,... runs only those rows of the matrix; ZEROPLAN_SWEEP_MAX (default 1G).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$(cd "${ZEROPLAN_GPU_BIN:-.gpu-bundle}" && pwd)
ZP=$BIN/zeroplan
RES=${OUT:-$BIN/multi}
mkdir -p "$RES/train" "$RES/pred" "$RES/compare" "$RES/configs" "$RES/pred_profile"
BUNDLE=$BIN
# shellcheck source=scripts/gpu_bundle_env.sh
. scripts/gpu_bundle_env.sh || exit 1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
N=${ZEROPLAN_GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
CLUSTER=${ZEROPLAN_CLUSTER:-8xH200-141GB-NVSwitch}
nvidia-smi -L
nvidia-smi topo -m > "$RES/topology.txt" 2>&1
[ "$N" -ge 2 ] || { echo "needs 2 or more GPUs, found $N"; exit 2; }
MPI="mpirun --oversubscribe -np $N -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
rc=0

# ---- 1. the collective sweep
$MPI "$ZP" collectives --measure --device cuda --cluster "$CLUSTER" --min 8 --max "${ZEROPLAN_SWEEP_MAX:-1G}" \
  --ops all_reduce,reduce_scatter,all_gather --out "$RES/sweep.txt" > "$RES/sweep_table.txt" 2>&1 || rc=1
tail -n 1 "$RES/sweep_table.txt"

# ---- 2. ZeRO 0-3, overlap on and off
# name model seq micro dtype stage overlap
MATRIX="
bertl-s0      bert-large-uncased 128  64 fp16 0 true
bertl-s1      bert-large-uncased 128  64 fp16 1 true
bertl-s1-no   bert-large-uncased 128  64 fp16 1 false
bertl-s2      bert-large-uncased 128  64 fp16 2 true
bertl-s2-no   bert-large-uncased 128  64 fp16 2 false
bertl-s3      bert-large-uncased 128  64 fp16 3 true
bertl-s3-no   bert-large-uncased 128  64 fp16 3 false
xl-s0         gpt2-xl            1024 4  bf16 0 true
xl-s1         gpt2-xl            1024 4  bf16 1 true
xl-s2         gpt2-xl            1024 4  bf16 2 true
xl-s2-no      gpt2-xl            1024 4  bf16 2 false
xl-s3         gpt2-xl            1024 4  bf16 3 true
xl-s3-no      gpt2-xl            1024 4  bf16 3 false
"
summary="$RES/summary.txt"
: > "$summary"
while read -r name model seq micro dtype stage overlap; do
  [ -z "$name" ] && continue
  if [ -n "${ZEROPLAN_MULTI_RUNS:-}" ] && [[ ",$ZEROPLAN_MULTI_RUNS," != *",$name,"* ]]; then continue; fi
  cfg="$RES/configs/$name.json"
  echo "{\"train_micro_batch_size_per_gpu\": $micro, \"gradient_accumulation_steps\": 1, \"$dtype\": {\"enabled\": true},
 \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4, \"weight_decay\": 0.01}}, \"gradient_clipping\": 1.0,
 \"zero_optimization\": {\"stage\": $stage, \"overlap_comm\": $overlap, \"reduce_bucket_size\": 5e8,
   \"allgather_bucket_size\": 5e8, \"contiguous_gradients\": true}}" > "$cfg"
  t0=$(date +%s)
  if ! timeout 300 $MPI "$ZP" train --model "$model" --ds-config "$cfg" --seq-len "$seq" --steps 4 --device cuda --attention sdpa \
      --workspaces-of H200-141GB \
      --quiet --out "$RES/train/$name.json" > "$RES/train/$name.log" 2>&1; then
    rc=1
    echo "$name: train failed ($(tail -n 1 "$RES/train/$name.log"))" | tee -a "$summary"
    continue
  fi
  "$ZP" simulate --model "$model" --ds-config "$cfg" --cluster "$CLUSTER" --gpus "$N" --rank 0 --seq-len "$seq" \
    --attention sdpa --json > "$RES/pred/$name.json" 2> "$RES/pred/$name.log" || rc=1
  "$ZP" compare --predicted "$RES/pred/$name.json" --measured "$RES/train/$name.rank0.json" > "$RES/compare/$name.txt" 2>&1 || rc=1
  echo "$name ($(( $(date +%s) - t0 )) s):" >> "$summary"
  grep -E "peak allocated|reserved|forward|backward|  step|iteration|^memory:|^communication:" "$RES/compare/$name.txt" | head -n 12 | sed 's/^/  /' >> "$summary"
done <<< "$MATRIX"

# ---- 3. calibration: the sweep and the stage 0 and 1 runs fitted, the others predicted again
fit_runs=()
for f in "$RES"/train/*-s0.rank0.json "$RES"/train/*-s1.rank0.json; do [ -f "$f" ] && fit_runs+=(--train-out "$f"); done
if [ -f "$RES/sweep.txt" ] && [ ${#fit_runs[@]} -gt 0 ]; then
  "$ZP" calibrate --cluster "$CLUSTER" --nccl-tests "$RES/sweep.txt" "${fit_runs[@]}" --report --out "$RES/profile.json" \
    > "$RES/calibrate.txt" 2>&1 || rc=1
  for f in "$RES"/configs/*.json; do
    name=$(basename "$f" .json)
    [ -f "$RES/train/$name.rank0.json" ] || continue
    read -r model seq <<< "$(awk -v n="$name" '$1 == n {print $2, $3}' <<< "$MATRIX")"
    "$ZP" simulate --model "$model" --ds-config "$f" --cluster "$CLUSTER" --gpus "$N" --rank 0 --seq-len "$seq" \
      --attention sdpa --profile "$RES/profile.json" --json > "$RES/pred_profile/$name.json" 2>/dev/null &&
      "$ZP" compare --predicted "$RES/pred_profile/$name.json" --measured "$RES/train/$name.rank0.json" \
        > "$RES/compare/$name.profile.txt" 2>&1
  done
fi
cat "$summary"
exit $rc
