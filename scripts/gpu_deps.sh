#!/usr/bin/env bash
# Copies the header-only dependencies of the GPU kernel test (Eigen, doctest, and fmt and
# nlohmann/json for core, which the CPU kernels link) from this machine into
# .gpu-deps/include (ignored by git), for a GPU machine that lacks them:
# scripts/gpu_check.sh passes .gpu-deps to CMake when the folder exists.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps/include
cp -r /usr/include/eigen3 .gpu-deps/include/
cp -r /usr/include/doctest .gpu-deps/include/
cp -r /usr/include/fmt .gpu-deps/include/
cp -r /usr/include/nlohmann .gpu-deps/include/
du -sh .gpu-deps
