#!/usr/bin/env bash
# The one packer of GPU binaries built elsewhere (the CUDA toolkit compiles and links without
# a GPU): the GPU binaries a build has (zeroplan, test_kernels_cuda, test_exec_cuda,
# test_calibration_cuda, zeroplan_bench_cuda; zeroplan required), stripped, with the
# non-system libraries zeroplan links in lib/ (fmt, OpenMPI and what it links: used only where
# the GPU machine lacks them, so its own MPI stays with its mpirun; NCCL, cuBLASLt, cuDNN,
# NVRTC and the CUDA runtime come from the GPU machine), gzipped into one file (about 22 MB for a full
# build, 54 MB unpacked). The binaries read their data (models/catalog, sim/*.json) from the
# source folder they were built in: the file `data_dir` names it. On the GPU machine,
# scripts/gpu_bundle_env.sh (sourced by every gpu_*.sh script) unpacks the file next to it and
# links that folder to the checkout.
#
#   cmake --preset ci -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build --preset ci
#   bash scripts/gpu_bundle.sh [BUILD_DIR] [OUT_FILE]   # default build-ci, .gpu-bundle/bundle.tgz
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-ci}
out=${2:-.gpu-bundle/bundle.tgz}
[ -x "$build/cli/zeroplan" ] || { echo "gpu_bundle: $build/cli/zeroplan is missing (build with CUDA first)" >&2; exit 2; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for f in cli/zeroplan tests/test_kernels_cuda tests/test_exec_cuda tests/test_calibration_cuda bench/zeroplan_bench_cuda; do
  [ -x "$build/$f" ] && strip -o "$stage/$(basename "$f")" "$build/$f"
done
ldd "$build/cli/zeroplan" | awk '/=> \// {print $3}' |
  grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl\.so|librt\.so|libcuda|libcudart|libcublas|libnccl|libcudnn|libnvrtc' |
  { mkdir -p "$stage/lib"; xargs -r -I{} cp -L {} "$stage/lib/"; }
pwd > "$stage/data_dir"
mkdir -p "$(dirname "$out")"
tar czf "$out" -C "$stage" .
ls -l "$out"
