// The elementwise engine behind kernels/elementwise.cu and kernels/image.cu.
//
// out[i] = round_to<TOut>(op(opmath(in_0[i]), ..., opmath(in_{k-1}[i]))) for i < numel, with a
// functor `op` on opmath values (float32, or double for float64 inputs). Two kernels:
//   * vector: every pointer 16-byte aligned and every input contiguous. Each thread moves
//     packs of kElems elements (one load per input, one store per pack), kUnroll packs in
//     flight, and the last numel % kElems elements go through a scalar step in the same
//     launch.
//   * rows: the vector kernel on row views, inputs whose rows are dense and 16-byte aligned
//     but spaced by a row stride (the halves of a fused gate/up product, a column slice).
//     A pack's address is row * ld + column, so they move at the contiguous speed.
//   * strided: anything else (a storage offset that breaks alignment, non-contiguous views).
//     One element at a time, offsets through the StridedLayout, 64-bit throughout.
//
// Launch configuration (chosen for H100: 132 SMs, HBM3 at ~3.35 TB/s):
//   * 256 threads per block: 8 blocks fill an SM's 2048 threads, so occupancy is limited by
//     registers only, and a block is small enough that the last partial wave is short.
//   * The grid covers the tensor in one pass; the loop is grid-stride only for tensors past
//     the gridDim.x limit. Every block does the same amount of work and the hardware block
//     scheduler balances the tail, with no occupancy query on the launch path. A persistent
//     grid would save block launches, but at >10^4 blocks each moving 16-48 KB that cost
//     hides behind the other resident blocks.
//   * Callers pick kUnroll so that each thread keeps 16-64 bytes of loads in flight. Little's
//     law at ~3.35 TB/s and ~800 ns DRAM latency asks for ~20 KB of reads in flight per SM
//     for a copy-like op (less when writes dominate the traffic); 1024+ resident threads x
//     32-64 B is several times that, so bandwidth does not hinge on full occupancy.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/strided_index.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/elementwise.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "gemmt/vector_access.cuh"

namespace gemmt {
namespace engine {

constexpr int kBlock = 256;
constexpr int kStridedElemsPerThread = 4;
// Lets the vector kernels use up to 64 registers: with the default budget the compiler
// trades the later packs' loads for registers and issues them only after the first store,
// i.e. one DRAM round trip later. 4+ resident blocks (>= 1024 threads) still keep several
// times the needed bytes in flight.
constexpr int kVectorMinBlocksPerSm = 4;

template <typename T, int kArity>
struct PtrArray {
  const T* ptr[kArity];
};

// Where pack p of input a starts, in elements: at p * kElems in a dense tensor; at
// row * ld[a] + column in a row view.
template <int kElems>
struct DensePacks {
  static constexpr bool kDense = true;
  __device__ __forceinline__ std::int64_t operator()(int, std::int64_t p) const {
    return p * kElems;
  }
};

template <int kElems, int kArity>
struct RowPacks {
  static constexpr bool kDense = false;
  std::int64_t packs_per_row;
  std::int64_t ld[kArity];
  __device__ __forceinline__ std::int64_t operator()(int a, std::int64_t p) const {
    std::int64_t row, col;
    divmod_index(p, packs_per_row, &row, &col);
    return row * ld[a] + col * kElems;
  }
};

template <typename T, int kArity>
struct StridedArray {
  StridedPtr<T> in[kArity];
};

template <typename TOut, class Op, typename TIn, int kArity>
__device__ __forceinline__ TOut apply_op(const Op& op, const TIn (&x)[kArity]) {
  static_assert(kArity == 1 || kArity == 2, "unary or binary ops only");
  if constexpr (kArity == 1) {
    return from_opmath<TOut>(op(to_opmath(x[0])));
  } else {
    return from_opmath<TOut>(op(to_opmath(x[0]), to_opmath(x[1])));
  }
}

// kUnroll packs per input at pack indices base + u * kBlock: each unrolled step is one
// coalesced span per block, and all loads are issued before the first result is needed.
// Only the grid's last group of packs can run past the end; that one is guarded, the rest
// is straight-line code, so the compiler cannot turn the bound checks into branches that
// separate (and serialise) the loads.
template <bool kGuarded, int kElems, int kUnroll, class Op, typename TIn, typename TOut, int kArity,
          class Packs>
__device__ __forceinline__ void process_packs(const Op& op, const PtrArray<TIn, kArity>& in,
                                              const Packs& at, TOut* __restrict__ out,
                                              std::int64_t base, std::int64_t packs) {
  Pack<TIn, kElems> v[kUnroll][kArity];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const std::int64_t i = base + u * kBlock;
    if (!kGuarded || i < packs) {
#pragma unroll
      for (int a = 0; a < kArity; ++a) v[u][a] = load_pack<TIn, kElems>(in.ptr[a] + at(a, i));
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const std::int64_t i = base + u * kBlock;
    if (!kGuarded || i < packs) {
      Pack<TOut, kElems> r;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        TIn x[kArity];
#pragma unroll
        for (int a = 0; a < kArity; ++a) x[a] = v[u][a].v[e];
        r.v[e] = apply_op<TOut>(op, x);
      }
      store_pack<TOut, kElems>(out + i * kElems, r);
    }
  }
}

template <int kElems, int kUnroll, class Op, typename TIn, typename TOut, int kArity, class Packs>
__global__ void __launch_bounds__(kBlock, kVectorMinBlocksPerSm)
    vector_kernel(Op op, PtrArray<TIn, kArity> in, Packs at, TOut* __restrict__ out,
                  std::int64_t numel) {
  const std::int64_t packs = numel / kElems;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * (kBlock * kUnroll);

  // Not unrolled: the grid normally covers the tensor, so the body runs once, and unrolling
  // would make every thread compute a 64-bit trip count first.
#pragma unroll 1
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * (kBlock * kUnroll) + threadIdx.x;
       base < packs; base += stride) {
    if (base + (kUnroll - 1) * kBlock < packs) {
      process_packs<false, kElems, kUnroll>(op, in, at, out, base, packs);
    } else {
      process_packs<true, kElems, kUnroll>(op, in, at, out, base, packs);
    }
  }

  // Fewer than kElems elements remain past the last whole pack; the grid's first threads
  // finish them. (Row views are taken only when every row is whole packs.)
  if constexpr (!Packs::kDense) return;
  const std::int64_t tail_begin = packs * kElems;
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (t < numel - tail_begin) {
    const std::int64_t i = tail_begin + t;
    TIn x[kArity];
#pragma unroll
    for (int a = 0; a < kArity; ++a) x[a] = in.ptr[a][i];
    out[i] = apply_op<TOut>(op, x);
  }
}

template <class Op, typename TIn, typename TOut, int kArity>
__global__ void __launch_bounds__(kBlock)
    strided_kernel(Op op, StridedArray<TIn, kArity> in, TOut* __restrict__ out,
                   std::int64_t numel) {
  constexpr int kU = kStridedElemsPerThread;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * (kBlock * kU);
#pragma unroll 1
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * (kBlock * kU) + threadIdx.x;
       base < numel; base += stride) {
    TIn x[kU][kArity];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t i = base + u * kBlock;
      if (i < numel) {
#pragma unroll
        for (int a = 0; a < kArity; ++a) x[u][a] = in.in[a][i];
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t i = base + u * kBlock;
      if (i < numel) out[i] = apply_op<TOut>(op, x[u]);
    }
  }
}

// True when every input is a row view (layout_rows) of the output's columns, with 16-byte
// aligned rows of whole packs: then rows holds the packs' row length and strides.
template <int kElems, int kArity>
bool row_views(const StridedLayout* const (&layouts)[kArity], const void* const (&inputs)[kArity],
               const void* out, std::int64_t numel, RowPacks<kElems, kArity>* rows) {
  std::int64_t cols = 0;
  for (int a = 0; a < kArity; ++a) {
    if (layouts[a] != nullptr && layouts[a]->ndim > 0) cols = layouts[a]->sizes[layouts[a]->ndim - 1];
  }
  if (cols <= 0 || cols % kElems != 0 || numel % cols != 0 || !is_aligned<kVectorBytes>(out)) {
    return false;
  }
  for (int a = 0; a < kArity; ++a) {
    std::int64_t ld = 0;
    if (!is_aligned<kVectorBytes>(inputs[a]) || !layout_rows(layouts[a], cols, &ld) ||
        ld % kElems != 0) {
      return false;
    }
    rows->ld[a] = ld;
  }
  rows->packs_per_row = cols / kElems;
  return true;
}

// Validates the arguments, picks the vector, row or strided kernel and launches it.
// kElems * sizeof(TIn) and kElems * sizeof(TOut) must each be 4, 8 or 16 bytes.
template <int kElems, int kUnroll, typename TIn, typename TOut, int kArity, class Op>
cudaError_t launch(const Op& op, std::int64_t numel, const void* const (&inputs)[kArity],
                   const StridedLayout* const (&layouts)[kArity], void* out, cudaStream_t stream) {
  static_assert(kElems * sizeof(TIn) <= kVectorBytes && kElems * sizeof(TOut) <= kVectorBytes,
                "a pack moves at most 16 bytes");
  if (numel < 0) return cudaErrorInvalidValue;
  if (numel == 0) return cudaSuccess;
  if (out == nullptr) return cudaErrorInvalidValue;
  bool vector_path = is_aligned<kVectorBytes>(out);
  for (int a = 0; a < kArity; ++a) {
    if (inputs[a] == nullptr || !layout_is_valid(layouts[a])) return cudaErrorInvalidValue;
    vector_path =
        vector_path && is_aligned<kVectorBytes>(inputs[a]) && layout_is_contiguous(layouts[a]);
  }

  TOut* out_t = static_cast<TOut*>(out);
  PtrArray<TIn, kArity> in{};
  for (int a = 0; a < kArity; ++a) in.ptr[a] = static_cast<const TIn*>(inputs[a]);
  const unsigned int vector_grid = grid_1d(numel / kElems, kBlock * kUnroll);
  RowPacks<kElems, kArity> rows{};
  if (vector_path) {
    vector_kernel<kElems, kUnroll>
        <<<vector_grid, kBlock, 0, stream>>>(op, in, DensePacks<kElems>{}, out_t, numel);
  } else if (row_views(layouts, inputs, out, numel, &rows)) {
    vector_kernel<kElems, kUnroll><<<vector_grid, kBlock, 0, stream>>>(op, in, rows, out_t, numel);
  } else {
    StridedArray<TIn, kArity> strided{};
    for (int a = 0; a < kArity; ++a) strided.in[a] = make_strided_ptr<TIn>(inputs[a], layouts[a]);
    const unsigned int grid = grid_1d(numel, kBlock * kStridedElemsPerThread);
    strided_kernel<<<grid, kBlock, 0, stream>>>(op, strided, out_t, numel);
  }
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace engine
}  // namespace gemmt
