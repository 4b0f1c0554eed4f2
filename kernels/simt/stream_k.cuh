// SIMT GEMM ladder, step 5b: the stream-k form of the pipelined kernel (ladder_5_pipelined.cuh).
//
// Adds over step 5: the last, partly filled wave of tiles is dealt out as even runs of k-tiles
// to one full wave of blocks. Measured on an H100 (docs/performance.md): worth a few percent
// where the last wave is partial (3.88 waves of the 128x256 tile at 4096^3); the planner
// (kernels/plan/simt_plan.cpp) decides per problem.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/grid_flags.cuh"

namespace gemmt {
namespace simt {
namespace {

// Stream-k (ladder step 5b): the last, partly filled wave of a data-parallel grid idles the
// SMs it does not reach (at 4096^3 the 128x256 tile makes 512 tiles, 3.88 waves of 132 SMs:
// 4 waves' time for 3.88 waves' work). The stream-k form of the pipelined kernel instead
// deals the k-tiles of the last tiles out evenly to one full wave of blocks, each a
// contiguous run that may start and end inside a tile; the tiles before them run as
// ordinary data-parallel blocks. A tile covered by several blocks is finished by exactly one
// of them: each other contributor publishes its raw sums to a workspace slot and counts
// itself in; the tile's first contributor, when it finds everyone else in, adds their slots
// to its registers, otherwise the last to arrive adds all slots. Either way the sums are
// added in contributor order, so results do not depend on timing, and no block ever waits
// for another.
struct StreamKParams {
  int first_tile;  // launch-order index of the first stream-k tile
  int k_tiles;     // k-tiles per output tile
  int64_t iters;   // k-tiles of each block; the first `extra` blocks take one more
  int64_t extra;
  float* slots;   // [blocks][2] slots of THREADS * TM * TN floats, thread-major
  int* arrivals;  // per stream-k tile: contributors that published; zero at launch

  __device__ __forceinline__ int64_t begin(int64_t block) const {
    return block * iters + min(block, extra);
  }
  __device__ __forceinline__ int block_of(int64_t it) const {
    const int64_t longer = extra * (iters + 1);
    return static_cast<int>(it < longer ? it / (iters + 1) : extra + (it - longer) / iters);
  }
  // A block's slot 0 holds the tile its run starts in, slot 1 the tile its run ends in.
  __device__ __forceinline__ int slot_of(int block, int tile) const {
    return begin(block) / k_tiles == tile ? 0 : 1;
  }
};

// The workspace slots of the stream-k form: one thread's TM x TN sums as TM * TN / 4
// 16-byte words, word w of thread t at w * THREADS + t, so every store and load is
// coalesced and the reading block uses the same thread -> accumulator map.
template <class Cfg>
struct StreamKSlots {
  static constexpr int TM = Cfg::TM, TN = Cfg::TN, THREADS = Cfg::THREADS;

  __device__ __forceinline__ static float4* slot(const StreamKParams& s, int block, int idx) {
    return reinterpret_cast<float4*>(s.slots) +
           (static_cast<int64_t>(block) * 2 + idx) * (TM * TN / 4) * THREADS + threadIdx.x;
  }

  __device__ __forceinline__ static void publish(const StreamKParams& s, int tile,
                                                 const float (&acc)[TM][TN]) {
    float4* dst = slot(s, blockIdx.x, s.slot_of(blockIdx.x, tile));
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int q = 0; q < TN / 4; ++q)
        __stcg(dst + (i * (TN / 4) + q) * THREADS,
               make_float4(acc[i][4 * q], acc[i][4 * q + 1], acc[i][4 * q + 2], acc[i][4 * q + 3]));
  }

  // acc += the slots of contributors first .. last, in that order.
  __device__ __forceinline__ static void add(const StreamKParams& s, int tile, int first, int last,
                                             float (&acc)[TM][TN]) {
    for (int b = first; b <= last; ++b) {
      const float4* src = slot(s, b, s.slot_of(b, tile));
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int q = 0; q < TN / 4; ++q) {
          const float4 v = __ldcg(src + (i * (TN / 4) + q) * THREADS);
          acc[i][4 * q] += v.x;
          acc[i][4 * q + 1] += v.y;
          acc[i][4 * q + 2] += v.z;
          acc[i][4 * q + 3] += v.w;
        }
    }
  }
};

// A stream-k block's share of a tile it covers only in part (`head`: its run covers the
// tile's first k-tile, so it is the tile's first contributor). Returns true when this block
// finishes the tile: acc then holds the tile's whole sums, to be written to C.
template <class Cfg>
__device__ __forceinline__ bool streamk_share(const StreamKParams& s, int tile, bool head,
                                              float (&acc)[Cfg::TM][Cfg::TN]) {
  using Slots = StreamKSlots<Cfg>;
  __shared__ int finish;
  const int64_t t0 = static_cast<int64_t>(tile) * s.k_tiles;
  const int first = s.block_of(t0), last = s.block_of(t0 + s.k_tiles - 1);
  int* arrivals = s.arrivals + tile;
  if (head) {
    // The head's run ends in this tile, so it usually finishes last: then nothing needs
    // publishing, and its registers are contributor 0's sums.
    if (threadIdx.x == 0) finish = ld_acquire_gpu(arrivals) == last - first;
    __syncthreads();
    if (finish) {
      Slots::add(s, tile, first + 1, last, acc);
      return true;
    }
  }
  Slots::publish(s, tile, acc);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) finish = atomicAdd(arrivals, 1) == last - first;
  __syncthreads();
  if (!finish) return false;
  __threadfence();
  // -0 is the exact identity of float addition, so this equals the head's in-place sum.
#pragma unroll
  for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = -0.f;
  Slots::add(s, tile, first, last, acc);
  return true;
}

}  // namespace
}  // namespace simt
}  // namespace gemmt
