#!/usr/bin/env bash
# DeepSpeed's reference measurements on the GPU machine (tools/README.md says how the wheels are built).
#
#   WHEELS=.whl OUT=/some/dir bash scripts/gpu_deepspeed_reference.sh [FULL_RUNS] [SECONDS]
#
# 1. installs DeepSpeed and its pure-Python dependencies from wheels copied there (no internet);
# 2. measures FULL_RUNS (comma-separated names of tools/deepspeed_matrix.json, "" for none) in
#    full: memory, snapshot, profile and times, into $OUT/ds;
# 3. spends what is left of SECONDS (default 540, under a 10-minute job limit) on time-only rounds of the whole matrix into
#    $OUT/ds_time: every run once per round, so that the host's drift spreads over all runs.
#    Each round's lines carry "round"; tools/deepspeed_compare.py --timing pools them.
# TIME_FIRST (names) are timed once before the rounds: what an earlier job did not reach.
# CPUS (default 2-3; empty: unpinned) pins each measuring process to those CPUs: DeepSpeed's host
# work is single-threaded Python, and unpinned processes timed the same run 1.2-1.9x apart.
# FusedAdam's JIT build is kept in $TORCH_EXTENSIONS_DIR (default .gpu-deps/torch_extensions) and
# copied to $OUT, so that a later job can bring it along instead of building it again.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT must name the output folder}"
WHEELS=${WHEELS:-.whl}
FULL=${1:-}
SECONDS_TOTAL=${2:-540}
CPUS=${CPUS-2-3}
PIN=()
[[ -n "$CPUS" ]] && PIN=(--cpus "$CPUS")
start=$(date +%s)
export TORCH_CUDA_ARCH_LIST=9.0  # DeepSpeed 0.19 cannot parse the "9.0a" some images set
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.gpu-deps/torch_extensions}
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1} MASTER_PORT=${MASTER_PORT:-29600}
mkdir -p "$TORCH_EXTENSIONS_DIR" "$OUT"
python3 -m pip install -q --no-index --find-links "$WHEELS" deepspeed==0.19.8 2>&1 | tail -3
python3 -c 'import deepspeed, transformers, torch; print("deepspeed", deepspeed.__version__, "transformers", transformers.__version__, "torch", torch.__version__)'
for name in ${FULL//,/ }; do  # each in a process of its own (stage 3 keeps its engine alive)
  python3 tools/deepspeed_reference.py "${PIN[@]}" --matrix tools/deepspeed_matrix.json --out "$OUT/ds" --only "$name" --exact
done
if [[ -n "${TIME_FIRST:-}" ]]; then  # these once, before the rounds (what an earlier job did not reach)
  python3 tools/deepspeed_reference.py "${PIN[@]}" --matrix tools/deepspeed_matrix.json --out "$OUT/ds_time" --time-only \
    --only "$TIME_FIRST" --exact
fi
left=$(( SECONDS_TOTAL - ($(date +%s) - start) ))
if (( left > 60 )); then
  ZP_BUDGET_S=$(( left - 45 )) python3 tools/deepspeed_reference.py "${PIN[@]}" --matrix tools/deepspeed_matrix.json \
    --out "$OUT/ds_time" --time-only --rounds 50
fi
tar czf "$OUT/torch_extensions.tar.gz" -C "$TORCH_EXTENSIONS_DIR" . 2>/dev/null || true
echo "gpu_deepspeed_reference: $(( $(date +%s) - start )) s"
