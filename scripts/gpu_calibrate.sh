#!/usr/bin/env bash
# On a machine with CUDA GPUs: build zeroplan with the CUDA backend (sm_90 unless
# ZEROPLAN_CUDA_ARCH says otherwise), run the `gpu`-labelled calibration test, then
# `zeroplan calibrate --device cuda` for a model, writing the cluster profile and the report.
# Logs and the profile go to $OUT when it is set, else to <build>/calibration.
#
#   bash scripts/gpu_calibrate.sh                     # build here, test, calibrate GPT-2
#   ZEROPLAN_CALIBRATE_ARGS='--model gpt2-medium --seq-len 1024 --budget 5' bash scripts/gpu_calibrate.sh
#   bash scripts/gpu_calibrate.sh --bundle            # on a build machine: .gpu-bundle/bundle.tgz for a GPU machine
#   ZEROPLAN_GPU_BUNDLE=.gpu-bundle bash scripts/gpu_calibrate.sh   # on the GPU machine: run the bundle
#
# The bundle (scripts/gpu_bundle.sh) is the zeroplan binary, its GPU test and the non-system
# libraries they link (fmt, OpenMPI), for a GPU machine without the CLI's build dependencies;
# NCCL, cuBLASLt and the CUDA runtime are taken from that machine (the CUDA toolkit, or the
# nvidia-* Python wheels PyTorch brings). NVLink multicast stays off (NCCL_NVLS_ENABLE=0) unless the caller sets it.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${ZEROPLAN_GPU_BUILD:-build-gpu-cli}
ARCH=${ZEROPLAN_CUDA_ARCH:-90}
ARGS=${ZEROPLAN_CALIBRATE_ARGS:---model gpt2 --seq-len 1024 --micro-batch 8 --budget 2}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

build() {
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZEROPLAN_WERROR=ON -DZEROPLAN_NATIVE=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > "$1/build.log" 2>&1 &&
    cmake --build "$BUILD" -j "$(nproc)" --target zeroplan test_calibration_cuda >> "$1/build.log" 2>&1
}

if [ "${1:-}" = "--bundle" ]; then
  mkdir -p .gpu-bundle
  build .gpu-bundle || { tail -n 40 .gpu-bundle/build.log; exit 1; }
  rm -f .gpu-bundle/build.log
  bash scripts/gpu_bundle.sh "$BUILD" .gpu-bundle/bundle.tgz || exit 1
  echo "gpu_calibrate: bundle in .gpu-bundle (carry it and the repository; run with ZEROPLAN_GPU_BUNDLE=.gpu-bundle)"
  exit 0
fi

LOGS=${OUT:-$BUILD/calibration}
mkdir -p "$LOGS"
{ nvidia-smi; nvcc --version; } > "$LOGS/machine.txt" 2>&1
head -n 12 "$LOGS/machine.txt"
if [ -n "${ZEROPLAN_GPU_BUNDLE:-}" ]; then
  BIN=$ZEROPLAN_GPU_BUNDLE/zeroplan
  TEST=$ZEROPLAN_GPU_BUNDLE/test_calibration_cuda
  BUNDLE=$ZEROPLAN_GPU_BUNDLE
  # shellcheck source=scripts/gpu_bundle_env.sh
  . scripts/gpu_bundle_env.sh || exit 1
else
  start=$(date +%s)
  build "$LOGS" || { tail -n 60 "$LOGS/build.log"; echo "gpu_calibrate: BUILD FAILED (log: $LOGS/build.log)"; exit 1; }
  echo "gpu_calibrate: built for sm_$ARCH in $(( $(date +%s) - start )) s"
  BIN=$BUILD/cli/zeroplan
  TEST=$BUILD/tests/test_calibration_cuda
fi

TEST=$(realpath "$TEST")
(cd tests && "$TEST") > "$LOGS/gpu_test.log" 2>&1
status=$?
echo "gpu_calibrate: test_calibration_cuda exited $status (log: $LOGS/gpu_test.log)"
tail -n 4 "$LOGS/gpu_test.log"

# shellcheck disable=SC2086
"$BIN" calibrate --device cuda $ARGS --out "$LOGS/profile.json" --report > "$LOGS/calibrate.txt" 2> "$LOGS/calibrate.err"
cal=$?
echo "gpu_calibrate: calibrate exited $cal (report: $LOGS/calibrate.txt, profile: $LOGS/profile.json)"
head -n 40 "$LOGS/calibrate.txt"
tail -n 5 "$LOGS/calibrate.err"
[ $status -eq 0 ] && [ $cal -eq 0 ]
