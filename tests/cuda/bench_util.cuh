// Random operands and CUDA-event timing for the float32 GEMM benchmarks: the SIMT self-test's
// -bench / -sweep and the experiment programs under benchmarks/experiments/.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace gemmt_bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error %s in %s: %s\n", cudaGetErrorName(e), what,
                 cudaGetErrorString(e));
    std::exit(2);
  }
}

// A uniform value in [-1, 1) from a hash of the index: benchmarks never time zeros (an FFMA
// on zeros draws less power, so the clock and the timing would flatter the kernel).
__device__ __forceinline__ float uniform_hash(int64_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

// p[i] = uniform_hash(i, seed), converted to T (float, __half or __nv_bfloat16).
template <class T>
__global__ void fill_random_as(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<T>(uniform_hash(i, seed));
  }
}

__global__ void fill_random(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = uniform_hash(i, seed);
  }
}

// Median milliseconds of `iters` timed launches of `launch` (returning cudaError_t) after
// three warm-up launches.
template <class F>
double median_ms(F&& launch, int iters) {
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "cudaEventCreate");
  check(cudaEventCreate(&t1), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) check(launch(), "warm-up launch");
  std::vector<float> ms(static_cast<std::size_t>(iters));
  for (float& t : ms) {
    check(cudaEventRecord(t0), "cudaEventRecord");
    check(launch(), "timed launch");
    check(cudaEventRecord(t1), "cudaEventRecord");
    check(cudaEventSynchronize(t1), "cudaEventSynchronize");
    check(cudaEventElapsedTime(&t, t0, t1), "cudaEventElapsedTime");
  }
  check(cudaEventDestroy(t0), "cudaEventDestroy");
  check(cudaEventDestroy(t1), "cudaEventDestroy");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace gemmt_bench
