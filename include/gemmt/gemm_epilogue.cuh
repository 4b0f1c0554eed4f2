// Epilogue shared by the tensor-core GEMM kernels: an mma accumulator fragment holds two
// horizontally adjacent outputs, written as one 4- or 8-byte store when the pair is aligned.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemmt/numeric.cuh"

namespace gemmt {

// dst[0] (and dst[1] when has_second) = alpha * v + beta * dst. beta == 0 never reads C,
// which may hold NaN. pair_aligned: dst is aligned for a two-element store.
template <typename T>
__device__ __forceinline__ void store_c_pair(T* dst, bool has_second, bool pair_aligned, float v0,
                                             float v1, float alpha, float beta) {
  v0 *= alpha;
  v1 *= alpha;
  if (beta != 0.f) {
    v0 += beta * to_float(dst[0]);
    if (has_second) v1 += beta * to_float(dst[1]);
  }
  if (has_second && pair_aligned) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    } else {
      struct alignas(4) Pair {
        T x, y;
      };
      *reinterpret_cast<Pair*>(dst) = Pair{from_float<T>(v0), from_float<T>(v1)};
    }
  } else {
    dst[0] = from_float<T>(v0);
    if (has_second) dst[1] = from_float<T>(v1);
  }
}

}  // namespace gemmt
