#!/usr/bin/env bash
# Packs the GPU binaries of a build (zeroplan, the GPU tests, the kernel benchmark) with the
# libraries a GPU machine may lack (libfmt) into one gzipped file, for
# scripts/gpu_exec_check.sh on a machine with a CUDA GPU (stripped, about 54 MB; gzipped,
# about 18 MB). The binaries keep the data folder they were built with (models/catalog,
# sim/*.json); the file `data_dir` in the bundle names it, and scripts/gpu_bundle_env.sh links
# it to the checkout on the GPU machine.
#
#   cmake --preset ci -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build --preset ci
#   bash scripts/gpu_bundle.sh [BUILD_DIR] [OUT_FILE]   # default build-ci, .gpu-bundle/bundle.tgz
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-ci}
out=${2:-.gpu-bundle/bundle.tgz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for f in cli/zeroplan tests/test_exec_cuda tests/test_calibration_cuda tests/test_kernels_cuda bench/zeroplan_bench_cuda; do
  [ -x "$build/$f" ] || { echo "gpu_bundle: $build/$f is missing (build with CUDA first)" >&2; exit 2; }
  strip -o "$stage/$(basename "$f")" "$build/$f"
done
fmt=$(ldd "$build/cli/zeroplan" | awk '/libfmt/ {print $3}')
[ -n "$fmt" ] && cp "$fmt" "$stage/"
pwd > "$stage/data_dir"
mkdir -p "$(dirname "$out")"
tar czf "$out" -C "$stage" .
ls -l "$out"
