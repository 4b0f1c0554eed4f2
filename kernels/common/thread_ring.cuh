// A ring of prefetch stages in shared memory in which every thread copies (cp.async) and
// later reads back only its own 16-byte pieces. For streaming kernels whose threads work on
// what they loaded themselves: the bytes of the next stages stay in flight while a thread
// reduces and stores the current one, without holding them in registers, and no barrier
// orders the ring (a thread's own cp.async.wait_group publishes its pieces to it). Private to
// kernels/.
//
// A stage is refilled only after the thread's reads of it have fed instructions that issued
// before the refill (its values are used before the next stage is requested), so the copy
// cannot overwrite bytes still being read.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cp_async.cuh"
#include "common/shared_memory.cuh"

namespace gemmt {

// kStages stages of kPieces pieces for each of kThreads threads, laid out [stage][piece][thread]:
// a warp's 16-byte copies and reads of one piece cover 512 consecutive bytes (no bank conflicts).
template <int kStages, int kPieces, int kThreads>
struct ThreadRing {
  static constexpr int kBytes = kStages * kPieces * kThreads * 16;

  uint32_t base;  // shared-window address of kBytes bytes, 16-byte aligned

  __device__ __forceinline__ uint32_t piece(int stage, int p) const {
    return base + static_cast<uint32_t>(((stage * kPieces + p) * kThreads + threadIdx.x) * 16);
  }
  __device__ __forceinline__ void fetch(int stage, int p, const void* src) const {
    cp_async_16(piece(stage, p), src);
  }
  __device__ __forceinline__ uint4 read(int stage, int p) const {
    return ld_shared_v4(piece(stage, p));
  }
  // Ends the copies of one stage (possibly none): groups are counted per stage.
  __device__ __forceinline__ static void close_stage() { cp_async_commit(); }
  // The oldest stage's copies have landed once at most kStages - 1 later stages are pending.
  __device__ __forceinline__ static void wait_oldest() { cp_async_wait<kStages - 1>(); }
};

}  // namespace gemmt
