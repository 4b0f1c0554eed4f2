// Grid sizing and device properties shared by the launchers.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/arith.h"

namespace gemmt {

// Blocks for `work` items when one block takes `per_block` of them in one pass. Never 0
// (a launch with an empty grid is an error), never above `cap`; a kernel launched with a
// capped grid must loop grid-stride over the rest.
inline unsigned int grid_1d(std::int64_t work, std::int64_t per_block,
                            std::int64_t cap = kMaxGridX) {
  std::int64_t blocks = work > 0 ? ceil_div(work, per_block) : 1;
  if (cap > kMaxGridX) cap = kMaxGridX;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

// Device ordinals below this keep their answers in the per-device caches of this file.
constexpr int kMaxCachedDevices = 64;

// A positive per-device answer asked of the driver once: `query(device, &value)` runs on the
// current device's first call and its answer is kept in `cache` (a slot per ordinal); a
// failed query or an answer below 1 is not kept. Racing first callers both store the same
// value, which is harmless.
template <typename Query>
cudaError_t cached_per_device(std::atomic<int> (&cache)[kMaxCachedDevices], int* value,
                              Query&& query) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool cacheable = device >= 0 && device < kMaxCachedDevices;
  if (cacheable) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) {
      *value = known;
      return cudaSuccess;
    }
  }
  int answer = 0;
  err = query(device, &answer);
  if (err != cudaSuccess) return err;
  if (cacheable && answer > 0) cache[device].store(answer, std::memory_order_relaxed);
  *value = answer;
  return cudaSuccess;
}

// Number of SMs of the current device; the attribute query costs a driver round trip.
inline cudaError_t current_device_sm_count(int* sm_count) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  return cached_per_device(cache, sm_count, [](int device, int* count) {
    return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  });
}

// Raises the dynamic shared-memory limit of kKernel to `bytes`, with the driver call made
// once per device rather than on every launch: the attribute belongs to the per-device
// function object and stays set for the life of the context, and a product of a few
// microseconds should not pay a driver call for it each time. Racing first callers both set
// the same value, which is harmless.
template <auto kKernel>
cudaError_t allow_dynamic_smem(int bytes) {
  static std::atomic<int> granted[kMaxCachedDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool cached = device >= 0 && device < kMaxCachedDevices;
  if (cached && granted[device].load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
  err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && cached) granted[device].store(bytes, std::memory_order_relaxed);
  return err;
}

// Blocks of kKernel (static shared memory only) that one SM holds at once with `threads`
// threads each, cached per device: a launcher that sizes a persistent grid asks on every
// launch, and the answer never changes for a device's function object.
template <auto kKernel>
cudaError_t resident_blocks_per_sm(int threads, int* blocks) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  return cached_per_device(cache, blocks, [threads](int, int* count) {
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(count, kKernel, threads, 0);
    if (err != cudaSuccess) return err;
    return *count < 1 ? cudaErrorInvalidConfiguration : cudaSuccess;
  });
}

}  // namespace gemmt
