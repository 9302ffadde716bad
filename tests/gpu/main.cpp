// Entry point of the GPU tests: without a usable CUDA device they print "skipped: no GPU"
// and exit 77, which ctest (SKIP_RETURN_CODE) reports as skipped rather than failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("skipped: no GPU (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("GPU: %s, compute capability %d.%d, %d multiprocessors\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount);
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
}
