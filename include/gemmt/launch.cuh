// Grid sizing and device properties shared by the launchers.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <utility>

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

// Bytes of L2 of the current device, asked of the driver once per device.
inline cudaError_t current_device_l2_bytes(int* bytes) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  return cached_per_device(cache, bytes, [](int device, int* value) {
    return cudaDeviceGetAttribute(value, cudaDevAttrL2CacheSize, device);
  });
}

// The most shared memory a CTA of the current device may opt in to, asked once per device.
inline cudaError_t current_device_smem_optin(int* bytes) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  return cached_per_device(cache, bytes, [](int device, int* value) {
    return cudaDeviceGetAttribute(value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
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

// All of the unified L1 as shared memory for kKernel, set once per device: a hint the driver
// may otherwise settle below what two resident CTAs of a large-shared-memory kernel need.
template <auto kKernel>
cudaError_t prefer_max_shared_carveout() {
  static std::atomic<int> done[kMaxCachedDevices] = {};
  int unused = 0;
  return cached_per_device(done, &unused, [](int, int* value) {
    *value = 1;
    return cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
  });
}

// Blocks of kKernel that one SM holds at once with `threads` threads and `dynamic_smem` bytes
// of dynamic shared memory each (a kernel above 48 KB must have been granted them first:
// allow_dynamic_smem), cached per device: a launcher that sizes a persistent grid asks on every
// launch, and the answer never changes for a device's function object and its one size.
template <auto kKernel>
cudaError_t resident_blocks_per_sm(int threads, int* blocks, std::size_t dynamic_smem = 0) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  return cached_per_device(cache, blocks, [threads, dynamic_smem](int, int* count) {
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(count, kKernel, threads, dynamic_smem);
    if (err != cudaSuccess) return err;
    return *count < 1 ? cudaErrorInvalidConfiguration : cudaSuccess;
  });
}

// ---- Programmatic dependent launch (compute capability 9.0 and later) ---------------------
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may have its
// blocks placed while the kernel before it in the stream is still finishing, so that its
// launch and set-up (barrier initialisation, cluster handshake) overlap that kernel's last
// blocks instead of following its completion. Such a kernel calls grid_dependency_wait()
// before its first access to global memory, reads and writes alike: the wait returns once the
// previous kernel has completed and its writes are visible (and at once for a launch without
// the attribute). allow_dependent_launch() lets the next kernel's blocks be placed as this
// one's leave; it is issued early by gemmt's kernels, whose grids are resident at once or
// close to it, and never weakens the next kernel's own wait.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches ask for programmatic dependent launch on the current device: compute
// capability 9.0 or later, unless the environment sets GEMMT_PDL=0 (read once; for timing a
// build with and without it in separate processes).
inline bool programmatic_launch_enabled() {
  static const bool allowed = [] {
    const char* v = std::getenv("GEMMT_PDL");
    return v == nullptr || !(v[0] == '0' && v[1] == '\0');
  }();
  if (!allowed) return false;
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  int major = 0;
  const cudaError_t err = cached_per_device(cache, &major, [](int device, int* value) {
    return cudaDeviceGetAttribute(value, cudaDevAttrComputeCapabilityMajor, device);
  });
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 9;
}

// Whether kKernel's code on the current device has its grid_dependency_wait(): code built for
// compute capability 9.0 or later does; code JIT-compiled from older PTX (a build for 8.0+PTX
// run on a Hopper GPU) was compiled without it and must not be launched programmatically.
template <auto kKernel>
bool kernel_waits_for_grid_dependency() {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  int ptx_version = 0;
  const cudaError_t err = cached_per_device(cache, &ptx_version, [](int, int* value) {
    cudaFuncAttributes attr{};
    const cudaError_t e = cudaFuncGetAttributes(&attr, kKernel);
    *value = attr.ptxVersion;
    return e;
  });
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return ptx_version >= 90;
}

// Appends the programmatic-serialization attribute to cfg (whose attrs point at `attrs`, an
// array with room for one more) when programmatic_launch_enabled() and kKernel waits for it.
template <auto kKernel>
void add_programmatic_launch(cudaLaunchConfig_t& cfg, cudaLaunchAttribute* attrs) {
  if (!programmatic_launch_enabled() || !kernel_waits_for_grid_dependency<kKernel>()) return;
  cudaLaunchAttribute& a = attrs[cfg.numAttrs];
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  cfg.numAttrs += 1;
}

// A launch configuration of `grid` blocks in clusters of `cluster` along x (no attribute for
// clusters of one); `attrs` has room for the cluster attribute and one more.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, std::size_t smem,
                                                cudaStream_t stream, int cluster,
                                                cudaLaunchAttribute* attrs) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  return cfg;
}

// kKernel<<<grid, block, smem, stream>>>(args...), as a programmatic launch where enabled: the
// kernel must call grid_dependency_wait() before it touches global memory.
template <auto kKernel, typename... Args>
cudaError_t launch_programmatic(dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  add_programmatic_launch<kKernel>(cfg, attr);
  return cudaLaunchKernelEx(&cfg, kKernel, std::forward<Args>(args)...);
}

}  // namespace gemmt
