// Operand tiles of the mma.sync GEMMs (gemm_sm80_mma.cu, kernels/fp64/): how an operand of any
// strides is described, and how one tile of it is copied into swizzled shared memory.
//
// A tile is kRows rows of kRowBytes bytes (a multiple of 128). The rows run along the
// operand's "outer" direction and the bytes of a row along its contiguous "inner" one, so
// global loads stay 16-byte vectors whatever the layout (K-major: rows along M or N, bytes
// along K; MN-major: rows along K, bytes along M or N). Each 16-byte chunk of a row is
// stored at (chunk ^ (row & 7)), which spreads the 8 rows a fragment load touches over the
// bank groups and keeps a warp's cp.async stores conflict-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cp_async.cuh"
#include "common/shared_memory.cuh"
#include "gemmt/arith.h"

namespace gemmt {
namespace tc {

struct Operand {
  const uint8_t* ptr;
  // The tile row direction ("outer") and the contiguous direction ("inner").
  int64_t outer_size, outer_stride;
  int64_t inner_size, inner_stride;
  bool vec;  // 16-byte cp.async allowed: inner_stride == 1 and everything 16-byte aligned
};

// Byte offset of 16-byte chunk `chunk` of tile row `row` (rows of kRowBytes bytes).
template <int kRowBytes>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// Fills one operand tile of kRows rows x kRowBytes bytes with the kThreads threads of the CTA.
// Tile row r is the operand's outer index outer0 + r; bytes along a row follow the contiguous
// inner index from inner0. Out-of-range elements are zero. Operands without 16-byte vectors
// (op.vec false) are read element by element, synchronously, into the same layout.
template <int kElt, int kRows, int kRowBytes, int kThreads>
__device__ __forceinline__ void load_tile(uint32_t tile, const Operand& op, int64_t outer0,
                                          int64_t inner0, int tid) {
  static_assert(kElt == 2 || kElt == 4 || kElt == 8, "16-, 32- or 64-bit elements");
  constexpr int kVec = 16 / kElt;
  constexpr int kChunksPerRow = kRowBytes / 16;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile must split evenly over the CTA");
  if (op.vec) {
#pragma unroll
    for (int it = 0; it < kChunks / kThreads; ++it) {
      const int c = tid + it * kThreads;
      const int row = c / kChunksPerRow;
      const int ch = c % kChunksPerRow;
      const int64_t o = outer0 + row;
      const int64_t in = inner0 + static_cast<int64_t>(ch) * kVec;
      const int64_t rem = op.inner_size - in;
      int bytes = 0;
      const uint8_t* src = op.ptr;  // never read when bytes == 0
      if (o < op.outer_size && rem > 0) {
        bytes = static_cast<int>(rem < kVec ? rem : kVec) * kElt;
        src = op.ptr + (o * op.outer_stride + in) * kElt;
      }
      // Edge chunks (bytes < 16, a 16-bit row may end mid-word) copy only in-range bytes.
      cp_async_16_zfill(tile + swz<kRowBytes>(row, ch), src, bytes);
    }
  } else {
#pragma unroll 1
    for (int it = 0; it < kChunks / kThreads; ++it) {
      const int c = tid + it * kThreads;
      const int row = c / kChunksPerRow;
      const int ch = c % kChunksPerRow;
      const int64_t o = outer0 + row;
      const int64_t in = inner0 + static_cast<int64_t>(ch) * kVec;
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (o < op.outer_size) {
        const int64_t row_off = o * op.outer_stride;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          if (in + e < op.inner_size) {
            const int64_t idx = row_off + (in + e) * op.inner_stride;
            if constexpr (kElt == 2) {
              const uint32_t v = reinterpret_cast<const uint16_t*>(op.ptr)[idx];
              w[e >> 1] |= v << ((e & 1) * 16);
            } else if constexpr (kElt == 4) {
              w[e] = reinterpret_cast<const uint32_t*>(op.ptr)[idx];
            } else {
              const uint2 v = reinterpret_cast<const uint2*>(op.ptr)[idx];
              w[2 * e] = v.x;
              w[2 * e + 1] = v.y;
            }
          }
        }
      }
      st_shared_v4(tile + swz<kRowBytes>(row, ch), w[0], w[1], w[2], w[3]);
    }
  }
}

// Picks the shared-memory arrangement of one operand whose element (x, p) — x along M or
// N, p along K — lives at ptr[x * stride_x + p * stride_k], elements of `elt` bytes.
// *mn_major says whether the tile is stored contiguous along M/N.
inline Operand describe_operand(const void* ptr, int64_t size_x, int64_t stride_x, int64_t size_k,
                                int64_t stride_k, int elt, bool* mn_major) {
  const int64_t vec = 16 / elt;
  const bool base_ok = is_aligned(ptr, 16);
  const bool k_vec = base_ok && stride_k == 1 && (size_x == 1 || stride_x % vec == 0);
  const bool x_vec = base_ok && stride_x == 1 && (size_k == 1 || stride_k % vec == 0);
  bool mn;
  bool vec_ok;
  if (k_vec) {
    mn = false;
    vec_ok = true;
  } else if (x_vec) {
    mn = true;
    vec_ok = true;
  } else {
    // Element-wise fill: put the unit-stride direction (if any) along tile rows so that
    // neighbouring threads still read neighbouring addresses.
    mn = stride_x == 1 && stride_k != 1;
    vec_ok = false;
  }
  Operand op;
  op.ptr = static_cast<const uint8_t*>(ptr);
  op.vec = vec_ok;
  if (mn) {
    op.outer_size = size_k;
    op.outer_stride = stride_k;
    op.inner_size = size_x;
    op.inner_stride = stride_x;
  } else {
    op.outer_size = size_x;
    op.outer_stride = stride_x;
    op.inner_size = size_k;
    op.inner_stride = stride_k;
  }
  *mn_major = mn;
  return op;
}

// The CTA's output tile under a grouped raster: consecutive CTAs walk down group_m tile rows
// before moving right, so that the B tiles a group reads stay in L2.
struct TileIndex {
  int m, n;
};

__device__ __forceinline__ TileIndex grouped_tile(int tile, int tiles_m, int tiles_n, int group_m) {
  const int per_group = group_m * tiles_n;
  const int group = tile / per_group;
  const int first_m = group * group_m;
  const int rows_in_group = min(tiles_m - first_m, group_m);
  const int in_group = tile - group * per_group;
  return {first_m + in_group % rows_in_group, in_group / rows_in_group};
}

// The kernels' main loop: a ring of kStages shared-memory stages filled by cp.async, kStages - 1
// k-tiles in flight ahead of the one being computed. load(slot, ktile) issues k-tile `ktile`
// (an int in the prologue, int64_t after)
// into ring slot `slot`; compute(slot) consumes a filled slot.
template <int kStages, class Load, class Compute>
__device__ __forceinline__ void cp_async_ring(int64_t ktiles, Load load, Compute compute) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load(s, s);
    cp_async_commit();
  }
#pragma unroll 1
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    // Publishes k-tile kt to every warp and proves that all warps are done with the slot the
    // prefetch below overwrites (it was consumed in iteration kt - 1).
    __syncthreads();
    const int64_t next = kt + kStages - 1;
    if (next < ktiles) load(static_cast<int>(next % kStages), next);
    cp_async_commit();
    compute(static_cast<int>(kt % kStages));
  }
  cp_async_wait<0>();
}

// Hands each accumulator pair of a warp's 64 x 32 block of m16n8 fragments (4 x 4 of them, c0 c1
// on row g and c2 c3 on row g + 8 of each) to store(row, col, v0, v1).
template <typename Acc, class Store>
__device__ __forceinline__ void for_each_mma_pair(const Acc (&acc)[4][4][4], int64_t row0,
                                                  int64_t col0, int lane, Store store) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
    const int64_t row = row0 + mi * 16 + g;
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      const int64_t col = col0 + nj * 8 + 2 * t;
      store(row, col, acc[mi][nj][0], acc[mi][nj][1]);
      store(row + 8, col, acc[mi][nj][2], acc[mi][nj][3]);
    }
  }
}

}  // namespace tc
}  // namespace gemmt
