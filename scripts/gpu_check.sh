#!/usr/bin/env bash
# On a machine with a CUDA GPU: build the CUDA kernels, their GPU test and their benchmark
# (for sm_90 unless ZEROPLAN_CUDA_ARCH says otherwise), run the `gpu`-labelled tests, then
# the benchmark. Logs (nvidia-smi, build, tests, benchmark) go to $OUT when it is set, else
# to <build>/logs. The exit status is the tests' (0: every GPU test passed).
#
#   bash scripts/gpu_check.sh
#   ZEROPLAN_CUDA_ARCH=90        architectures to build for (CMAKE_CUDA_ARCHITECTURES)
#   ZEROPLAN_GPU_BUILD=build-gpu the build folder
#   ZEROPLAN_GPU_BIN=DIR         run test_kernels_cuda and zeroplan_bench_cuda found in DIR
#                                (built elsewhere) instead of building
#   ZEROPLAN_TEST_ARGS=...       doctest arguments, e.g. --test-case='sdpa*'
#   ZEROPLAN_BENCH_ARGS=--quick  smaller shapes, fewer repetitions; ZEROPLAN_BENCH=0 skips it
#   ZEROPLAN_SANITIZE=1          run the tests under compute-sanitizer (memcheck) as well
#
# Only core and the kernels are configured (-DZEROPLAN_KERNELS_ONLY=ON): the CLI's
# dependencies (Boost, CLI11, MPI) need not be installed. Eigen, doctest, fmt and
# nlohmann/json are used header-only: when the machine lacks them, `bash scripts/gpu_deps.sh`
# on a machine that has them copies their headers into .gpu-deps/, which this script passes
# to CMake.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${ZEROPLAN_GPU_BUILD:-build-gpu}
ARCH=${ZEROPLAN_CUDA_ARCH:-90}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
{ nvidia-smi; nvcc --version; cmake --version; } > "$LOGS/machine.txt" 2>&1
head -n 12 "$LOGS/machine.txt"

if [ -n "${ZEROPLAN_GPU_BIN:-}" ]; then
  TEST_BIN=$ZEROPLAN_GPU_BIN/test_kernels_cuda
  BENCH_BIN=$ZEROPLAN_GPU_BIN/zeroplan_bench_cuda
  echo "gpu_check: using the binaries in $ZEROPLAN_GPU_BIN"
else
  PREFIX=()
  [ -d .gpu-deps ] && PREFIX=("-DCMAKE_PREFIX_PATH=$PWD/.gpu-deps")
  GEN=()
  command -v ninja > /dev/null && GEN=(-G Ninja)
  # A build folder configured from another checkout cannot be reused here: start afresh.
  if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$PWD\$" "$BUILD/CMakeCache.txt"; then
    echo "gpu_check: $BUILD was configured elsewhere; reconfiguring it"
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  fi
  start=$(date +%s)
  if ! { cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DZEROPLAN_KERNELS_ONLY=ON \
           -DZEROPLAN_WERROR=ON -DZEROPLAN_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${PREFIX[@]}" &&
         cmake --build "$BUILD" -j "$(nproc)" --target test_kernels_cuda zeroplan_bench_cuda; } \
       > "$LOGS/build.log" 2>&1; then
    tail -n 60 "$LOGS/build.log"
    echo "gpu_check: BUILD FAILED (log: $LOGS/build.log)"
    exit 1
  fi
  echo "gpu_check: built for sm_$ARCH in $(( $(date +%s) - start )) s"
  TEST_BIN=$BUILD/tests/test_kernels_cuda
  BENCH_BIN=$BUILD/bench/zeroplan_bench_cuda
fi

# The GPU tests (ctest label `gpu`: this one executable).
start=$(date +%s)
# shellcheck disable=SC2086
"$TEST_BIN" --duration=true ${ZEROPLAN_TEST_ARGS:-} > "$LOGS/gpu_tests.log" 2>&1
status=$?
echo "gpu_check: tests exited $status after $(( $(date +%s) - start )) s (log: $LOGS/gpu_tests.log)"
if [ $status -ne 0 ]; then
  grep -E "ERROR|FAILED|element|relative|error" "$LOGS/gpu_tests.log" | head -n 80
fi
tail -n 4 "$LOGS/gpu_tests.log"

if [ "${ZEROPLAN_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  # shellcheck disable=SC2086
  compute-sanitizer --tool memcheck --print-limit 20 "$TEST_BIN" ${ZEROPLAN_TEST_ARGS:-} > "$LOGS/memcheck.log" 2>&1
  echo "gpu_check: compute-sanitizer exited $? (log: $LOGS/memcheck.log)"
  grep -E "ERROR SUMMARY|Invalid|out of bounds" "$LOGS/memcheck.log" | head -n 20
fi

if [ "${ZEROPLAN_BENCH:-1}" != 0 ]; then
  # shellcheck disable=SC2086
  "$BENCH_BIN" ${ZEROPLAN_BENCH_ARGS:-} > "$LOGS/bench.log" 2>&1
  echo "gpu_check: benchmark exited $? (log: $LOGS/bench.log)"
  cat "$LOGS/bench.log"
fi
exit $status
