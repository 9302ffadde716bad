#!/usr/bin/env bash
# On a machine with a CUDA GPU: the executor's GPU checks and its benchmark, on binaries
# built elsewhere (the CUDA toolkit compiles and links without a GPU):
#   test_kernels_cuda (every kernel against its CPU twin), test_exec_cuda (train --device
#   cuda against --device cpu: 20 steps per family and stage, bytes, driver memory, several
#   ranks on one GPU; under ZEROPLAN_POISON_FRESH=1, so a gradient a kernel claims to write
#   whole and does not shows as NaN), zeroplan_bench_cuda when the bundle has it (kernel throughput, the
#   LM head staged and not) beside bench/torch_gemm_probe.py (PyTorch's times for the same
#   products), then bench/gpu_vs_torch.sh (tokens/s beside PyTorch eager and torch.compile).
#
#   cmake --preset ci -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build --preset ci
#   bash scripts/gpu_bundle.sh        # .gpu-bundle/bundle.tgz: the binaries and their libraries
#   # on the GPU machine (the bundle is unpacked into .gpu-bundle when its binaries are not there):
#   bash scripts/gpu_exec_check.sh [quick]
#
# ZEROPLAN_GPU_BIN=DIR (default .gpu-bundle) holds the binaries; logs go to $OUT (else
# DIR/logs). The exit status is the tests' (0: every GPU test passed).
# ZEROPLAN_EXEC_CUDA_ARGS passes doctest options to test_exec_cuda, to split its cases over
# runs: e.g. '-tc=*checkpoint*,*offload*,*overlap*,*collectives*'.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$(cd "${ZEROPLAN_GPU_BIN:-.gpu-bundle}" && pwd)
LOGS=${OUT:-$BIN/logs}
mkdir -p "$LOGS"
BUNDLE=$BIN
. scripts/gpu_bundle_env.sh || exit 1
export ZEROPLAN_BIN=$BIN/zeroplan OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi -L
rc=0
if [ "${1:-}" != quick ]; then
  timeout 300 "$BIN/test_kernels_cuda" > "$LOGS/test_kernels_cuda.txt" 2>&1 || rc=1
  tail -n 3 "$LOGS/test_kernels_cuda.txt"
fi
set -f  # the filter's '*' are doctest's, not the shell's
ZEROPLAN_POISON_FRESH=1 timeout 500 "$BIN/test_exec_cuda" -s ${ZEROPLAN_EXEC_CUDA_ARGS:-} > "$LOGS/test_exec_cuda.txt" 2>&1 || rc=1
set +f
grep -E "worst relative|ERROR|FAILED|test cases|assertions" "$LOGS/test_exec_cuda.txt" | sed 's/^.*MESSAGE: //' | head -60
if [ -x "$BIN/zeroplan_bench_cuda" ] && [ "${1:-}" != quick ]; then
  timeout 150 "$BIN/zeroplan_bench_cuda" > "$LOGS/bench_kernels_cuda.txt" 2>&1
  grep -E "ceiling|lm_head" "$LOGS/bench_kernels_cuda.txt"
  grep -E "sdpa (fwd|bwd) bf16|cross_entropy|dropout|layernorm|multi_|148 " "$LOGS/bench_kernels_cuda.txt"
  (cd bench && timeout 120 python3 torch_gemm_probe.py && timeout 120 python3 torch_sdpa_probe.py) 2>&1 |
    tee "$LOGS/torch_probes.txt"
fi
ZEROPLAN=$BIN/zeroplan timeout 300 bash bench/gpu_vs_torch.sh ${1:-} | tee "$LOGS/gpu_vs_torch.txt"
exit $rc
