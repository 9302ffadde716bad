#!/usr/bin/env bash
# Set up, build, and run the main job on the built-in example: plan bert-large on
# 4 x V100-16GB with the example DeepSpeed config as the base (the best stage, buckets
# and micro-batch, and the ds_config to use), then per-stage memory and time at the
# example's own settings, and why stage 2 does not save what one expects.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset default > /dev/null
cmake --build --preset default -j "$(nproc)" --target zeroplan
EXAMPLE=examples/bert_large_ds_config.json
./build/cli/zeroplan plan --model bert-large-uncased --ds-config "$EXAMPLE" \
  --cluster 4xV100-16GB-PCIe --seq-len 128 --out build/best_ds_config.json
./build/cli/zeroplan simulate --model bert-large-uncased --ds-config "$EXAMPLE" \
  --gpus 4 --gpu V100-16GB --stages 0,1,2,3 --micro-batch 64 --seq-len 128
./build/cli/zeroplan explain --model bert-large-uncased --ds-config "$EXAMPLE" \
  --gpus 4 --gpu V100-16GB --micro-batch 64 --seq-len 128 --stage 1 --vs-stage 2
