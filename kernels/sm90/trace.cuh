// Phase stamps of the Hopper GEMM kernel, for experiment builds only.
#pragma once

#include <cstdint>

#include "sm90/config.cuh"

namespace gemmt {
namespace {

// Defined by benchmarks/experiments/tile_phases, which compiles its own instance of this
// kernel: the first thread of each warpgroup (the others return at once) records the SM clock at
// the phases of each of its first kTraceUnits units (slots: see that program), so a tile's fixed
// cost can be split into the ring restart, the main loop and the epilogue. Without GEMMT_SM90_TRACE
// the stamps are empty statements and the kernel is unchanged.
#if defined(GEMMT_SM90_TRACE)
constexpr int kTraceUnits = 48;
constexpr int kTraceSlots = 24;
__device__ unsigned long long* g_trace = nullptr;
#endif
#if defined(GEMMT_SM90_TRACE) && defined(GEMMT_SM90_DEVICE_CODE)
__device__ __forceinline__ void trace_stamp(int unit, int slot) {
  unsigned long long* t = g_trace;
  if ((threadIdx.x & 127) != 0 || t == nullptr || unit >= kTraceUnits) return;
  // Slots 6 and 7 (the kernel's start and end) read the global timer, in ns and common to
  // all SMs; the others the SM's clock.
  unsigned long long now;
  if (slot == 6 || slot == 7) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)::"memory");
  } else {
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(now)::"memory");
  }
  const int wg = threadIdx.x >> 7;
  t[((blockIdx.x * 3 + wg) * kTraceUnits + unit) * kTraceSlots + slot] = now;
}
// The unit a warpgroup is storing, for the stamps of the staged store (epilogue.cuh).
__device__ __forceinline__ int* trace_unit_of_warpgroup() {
  __shared__ int unit[3];
  return &unit[threadIdx.x >> 7];
}
#define GEMMT_TRACE(unit, slot) trace_stamp(unit, slot)
#define GEMMT_TRACE_SET_UNIT(unit) \
  ((threadIdx.x & 127) == 0 ? (void)(*trace_unit_of_warpgroup() = (unit)) : (void)0)
// Staged-store rounds: slots 8.. for a unit's first round, 16.. for its second.
__device__ __forceinline__ void trace_epilogue_stamp(int slot) {
  if ((threadIdx.x & 127) != 0) return;
  const int unit = *trace_unit_of_warpgroup();
  unsigned long long* t = g_trace;
  if (t == nullptr || unit >= kTraceUnits) return;
  const int wg = threadIdx.x >> 7;
  const unsigned long long* row = t + ((blockIdx.x * 3 + wg) * kTraceUnits + unit) * kTraceSlots;
  trace_stamp(unit, row[slot] != 0 ? slot + 8 : slot);
}
#define GEMMT_TRACE_EPI(slot) trace_epilogue_stamp(slot)
#else
#define GEMMT_TRACE(unit, slot) ((void)0)
#define GEMMT_TRACE_SET_UNIT(unit) ((void)0)
#define GEMMT_TRACE_EPI(slot) ((void)0)
#endif

}  // namespace
}  // namespace gemmt
