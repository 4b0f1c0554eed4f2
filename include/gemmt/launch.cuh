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

// Number of SMs of the current device. The attribute query costs a driver round trip, so
// the answer is cached per device ordinal; racing first callers both store the same value,
// which is harmless.
inline cudaError_t current_device_sm_count(int* sm_count) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= 0 && device < kMaxCachedDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) {
      *sm_count = cached;
      return cudaSuccess;
    }
  }
  int count = 0;
  err = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  if (device >= 0 && device < kMaxCachedDevices) {
    cache[device].store(count, std::memory_order_relaxed);
  }
  *sm_count = count;
  return cudaSuccess;
}

// Raises the dynamic shared-memory limit of kKernel to `bytes`, with the driver call made
// once per device rather than on every launch: the attribute belongs to the per-device
// function object and stays set for the life of the context, and a product of a few
// microseconds should not pay a driver call for it each time. Racing first callers both set
// the same value, which is harmless.
template <auto kKernel>
cudaError_t allow_dynamic_smem(int bytes) {
  constexpr int kMaxCachedDevices = 64;
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
// threads each, cached per device like allow_dynamic_smem: a launcher that sizes a persistent
// grid asks on every launch, and the answer never changes for a device's function object.
template <auto kKernel>
cudaError_t resident_blocks_per_sm(int threads, int* blocks) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool cached = device >= 0 && device < kMaxCachedDevices;
  if (cached) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) {
      *blocks = known;
      return cudaSuccess;
    }
  }
  int count = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, kKernel, threads, 0);
  if (err != cudaSuccess) return err;
  if (count < 1) return cudaErrorInvalidConfiguration;
  if (cached) cache[device].store(count, std::memory_order_relaxed);
  *blocks = count;
  return cudaSuccess;
}

}  // namespace gemmt
