#!/usr/bin/env bash
# Set up, build (CI preset: -Werror) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset ci
cmake --build --preset ci -j "$(nproc)"
ctest --preset ci -j "$(nproc)"
# The GPU tests (ctest label gpu) exit as skipped without a GPU; say so where it shows.
if [ -x build-ci/tests/test_kernels_cuda ]; then
  echo "GPU tests (test_kernels_cuda, test_calibration_cuda, test_exec_cuda): $(build-ci/tests/test_kernels_cuda --test-case=__none__ 2>&1 | head -n 1 || true)"
fi
