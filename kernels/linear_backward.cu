// The Linear layer's backward epilogue: grad_preact = grad * act'(z) and the bias gradient
// (its column sums) in one pass over grad and z.
//
// PyTorch runs these as two passes (the activation's backward writes grad_preact, then a
// reduction reads it back for the bias); here the column sums are taken from registers while
// grad_preact is written, so grad_preact is never read again.
//
// Layout: a block is 32 x 8 threads. The 32 threads along x cover 32 packs of columns (16
// bytes each: 256 bf16 / fp16 columns, 128 float32), the 8 along y walk the block's rows 8
// apart, so every warp reads and writes 512 contiguous bytes of one row per step. Each thread
// keeps float32 sums for its pack's columns; the 8 row lanes are added in a fixed order
// through shared memory, and the row chunks (grid.y) in a fixed order by a second, small
// kernel: the result does not depend on scheduling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "gemmt/activation.h"
#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "gemmt/linear.h"
#include "gemmt/numeric.cuh"
#include "gemmt/vector_access.cuh"

namespace gemmt {
namespace {

constexpr int kColThreads = 32;
constexpr int kRowThreads = 8;
// Row chunks per column strip: enough blocks for a few waves of the GPU; each chunk keeps at
// least this many rows so its partial sums are worth their extra read.
constexpr int kBlocksPerSm = 4;
constexpr int64_t kMinRowsPerChunk = 64;
constexpr int kMaxChunks = 1024;

struct Geometry {
  int64_t strips;  // grid.x: column strips of kColThreads packs
  int64_t chunks;  // grid.y: row chunks
  int64_t rows_per_chunk;
};

Geometry geometry(int64_t rows, int64_t cols, int pack, int sm_count) {
  Geometry g;
  g.strips = ceil_div(cols, int64_t{kColThreads} * pack);
  const int64_t wanted = ceil_div(int64_t{kBlocksPerSm} * std::max(sm_count, 1), g.strips);
  const int64_t most = std::max<int64_t>(1, rows / kMinRowsPerChunk);
  g.chunks = std::max<int64_t>(1, std::min<int64_t>({wanted, most, kMaxChunks}));
  // Whole steps of kRowThreads rows per chunk, so each row lane sees the same rows count.
  g.rows_per_chunk = ceil_div(ceil_div(rows, g.chunks), kRowThreads) * kRowThreads;
  g.chunks = ceil_div(rows, g.rows_per_chunk);
  return g;
}

// One pack of a row: a single 16-byte access, or a plain element for the scalar form.
template <typename T, int kPack>
__device__ __forceinline__ void load_row_pack(const T* src, T (&dst)[kPack]) {
  if constexpr (kPack == 1) {
    dst[0] = src[0];
  } else {
    const Pack<T, kPack> p = load_pack<T, kPack>(src);
#pragma unroll
    for (int e = 0; e < kPack; ++e) dst[e] = p.v[e];
  }
}

template <typename T, int kPack>
__device__ __forceinline__ void store_row_pack(T* dst, const T (&src)[kPack]) {
  if constexpr (kPack == 1) {
    dst[0] = src[0];
  } else {
    Pack<T, kPack> p;
#pragma unroll
    for (int e = 0; e < kPack; ++e) p.v[e] = src[e];
    store_pack<T, kPack>(dst, p);
  }
}

// kAct: the activation (an Activation), a template argument so that the derivative of a
// pack's elements is straight-line code (chosen per element at run time, every element sat
// behind its own switch). kNone: the bias sums alone (grad_preact is grad itself).
template <typename T, int kPack, int kAct, bool kSumBias>
__global__ void __launch_bounds__(kColThreads* kRowThreads)
    linear_backward_kernel(const T* __restrict__ grad, const T* __restrict__ preact, int64_t rows,
                           int64_t cols, int64_t rows_per_chunk, T* __restrict__ grad_preact,
                           float* __restrict__ partial, T* __restrict__ bias_grad) {
  constexpr bool kHasPreact = kAct != static_cast<int>(Activation::kNone);
  constexpr bool kWriteGrad = kHasPreact;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x) * kPack;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t row_end = min(rows, row_begin + rows_per_chunk);
  const bool full_pack = col0 + kPack <= cols;
  float sum[kPack];
#pragma unroll
  for (int e = 0; e < kPack; ++e) sum[e] = 0.f;

  if (col0 < cols) {
#pragma unroll 4
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowThreads) {
      const int64_t off = r * cols + col0;
      T g[kPack], z[kPack];
      if (full_pack) {
        load_row_pack<T, kPack>(grad + off, g);
        if constexpr (kHasPreact) load_row_pack<T, kPack>(preact + off, z);
      } else {
#pragma unroll
        for (int e = 0; e < kPack; ++e) {
          const bool in = col0 + e < cols;
          g[e] = in ? grad[off + e] : from_float<T>(0.f);
          if constexpr (kHasPreact) z[e] = in ? preact[off + e] : from_float<T>(0.f);
        }
      }
      T out[kPack];
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        float v = to_float(g[e]);
        if constexpr (kHasPreact) {
          v *= activation_derivative(static_cast<Activation>(kAct), to_float(z[e]));
        }
        out[e] = from_float<T>(v);
        // The bias gradient adds the rounded values, the ones the GEMMs see.
        if constexpr (kSumBias) sum[e] += to_float(out[e]);
      }
      if constexpr (kWriteGrad) {
        if (full_pack) {
          store_row_pack<T, kPack>(grad_preact + off, out);
        } else {
#pragma unroll
          for (int e = 0; e < kPack; ++e) {
            if (col0 + e < cols) grad_preact[off + e] = out[e];
          }
        }
      }
    }
  }
  if constexpr (kSumBias) {
    // Row lanes 1..7 hand their sums to lane 0 of their column, which adds them in order.
    __shared__ float lanes[kRowThreads][kColThreads * kPack];
#pragma unroll
    for (int e = 0; e < kPack; ++e) lanes[threadIdx.y][threadIdx.x * kPack + e] = sum[e];
    __syncthreads();
    if (threadIdx.y == 0 && col0 < cols) {
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        float s = lanes[0][threadIdx.x * kPack + e];
#pragma unroll
        for (int y = 1; y < kRowThreads; ++y) s += lanes[y][threadIdx.x * kPack + e];
        if (col0 + e < cols) {
          if (gridDim.y == 1) {
            bias_grad[col0 + e] = from_float<T>(s);
          } else {
            partial[static_cast<int64_t>(blockIdx.y) * cols + col0 + e] = s;
          }
        }
      }
    }
  }
}

// bias_grad[j] = sum over chunks c, in order, of partial[c][j].
template <typename T>
__global__ void __launch_bounds__(256)
    sum_chunks_kernel(const float* __restrict__ partial, int64_t chunks, int64_t cols,
                      T* __restrict__ bias_grad) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.f;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c * cols + j];
  bias_grad[j] = from_float<T>(s);
}

template <typename T, int kPack, int kAct, bool kSumBias>
cudaError_t launch_pass(const Geometry& g, const T* grad, const T* preact, int64_t rows,
                        int64_t cols, T* grad_preact, float* partial, T* bias_grad,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(g.strips), static_cast<unsigned>(g.chunks));
  const dim3 block(kColThreads, kRowThreads);
  linear_backward_kernel<T, kPack, kAct, kSumBias><<<grid, block, 0, stream>>>(
      grad, preact, rows, cols, g.rows_per_chunk, grad_preact, partial, bias_grad);
  GEMMT_RETURN_IF_ERROR(cudaGetLastError());
  if (!kSumBias || g.chunks == 1) return cudaSuccess;
  sum_chunks_kernel<T><<<grid_1d(cols, 256), 256, 0, stream>>>(partial, g.chunks, cols, bias_grad);
  GEMMT_RETURN_LAUNCH_ERROR();
}

// grad_preact for activation kAct, with the bias sums when bias_grad is given.
template <typename T, int kPack, int kAct>
cudaError_t run_activation(const Geometry& g, const T* grad, const T* preact, int64_t rows,
                           int64_t cols, T* grad_preact, float* partial, T* bias_grad,
                           cudaStream_t stream) {
  if (bias_grad == nullptr) {
    return launch_pass<T, kPack, kAct, false>(g, grad, preact, rows, cols, grad_preact, partial,
                                              nullptr, stream);
  }
  return launch_pass<T, kPack, kAct, true>(g, grad, preact, rows, cols, grad_preact, partial,
                                           bias_grad, stream);
}

// The kernel forms a Linear backward needs: with an activation, grad_preact (one form per
// activation) with or without the bias sums; without one, the bias sums alone (grad_preact
// is grad itself).
template <typename T, int kPack>
cudaError_t run_typed(const Geometry& g, const T* grad, const T* preact, Activation act,
                      int64_t rows, int64_t cols, T* grad_preact, float* partial, T* bias_grad,
                      cudaStream_t stream) {
  if (act == Activation::kNone || grad_preact == nullptr) {
    if (bias_grad == nullptr) return cudaSuccess;
    return launch_pass<T, kPack, static_cast<int>(Activation::kNone), true>(
        g, grad, nullptr, rows, cols, nullptr, partial, bias_grad, stream);
  }
  return with_activation(act, [&](auto a) -> cudaError_t {
    constexpr Activation kA = decltype(a)::value;
    if constexpr (kA == Activation::kNone) {
      return cudaErrorInvalidValue;  // not an Activation (kNone is taken above)
    } else {
      return run_activation<T, kPack, static_cast<int>(kA)>(
          g, grad, preact, rows, cols, grad_preact, partial, bias_grad, stream);
    }
  });
}

template <typename T>
int pack_for(int64_t cols, const void* grad, const void* preact, const void* grad_preact) {
  constexpr int kFull = kPackElems<T>;
  const bool vec = cols % kFull == 0 && is_aligned<kVectorBytes>(grad) &&
                   is_aligned<kVectorBytes>(preact) && is_aligned<kVectorBytes>(grad_preact);
  return vec ? kFull : 1;
}

}  // namespace

std::size_t linear_backward_workspace_bytes(ScalarType dtype, int64_t rows, int64_t cols,
                                            int sm_count) {
  if (rows <= 0 || cols <= 0) return 0;
  const int pack = kVectorBytes / static_cast<int>(element_size(dtype));
  const Geometry g = geometry(rows, cols, pack, sm_count);
  return g.chunks > 1 ? static_cast<std::size_t>(g.chunks * cols) * sizeof(float) : 0;
}

cudaError_t linear_backward_run(ScalarType dtype, int64_t rows, int64_t cols, const void* grad,
                                const void* preact, Activation activation, void* grad_preact,
                                void* bias_grad, void* workspace, int sm_count,
                                cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (activation != Activation::kNone && grad_preact != nullptr && preact == nullptr) {
    return cudaErrorInvalidValue;
  }
  return dispatch_float_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kFull = kPackElems<T>;
    // The workspace is sized for full packs; the scalar form then uses the same chunks.
    const Geometry g = geometry(rows, cols, kFull, sm_count);
    if (g.chunks > 1 && bias_grad != nullptr && workspace == nullptr) {
      return cudaErrorInvalidValue;
    }
    const T* gp = static_cast<const T*>(grad);
    const T* zp = static_cast<const T*>(preact);
    T* out = static_cast<T*>(grad_preact);
    T* bg = static_cast<T*>(bias_grad);
    float* partial = static_cast<float*>(workspace);
    if (pack_for<T>(cols, grad, preact, grad_preact) == kFull) {
      return run_typed<T, kFull>(g, gp, zp, activation, rows, cols, out, partial, bg, stream);
    }
    Geometry scalar = g;
    scalar.strips = ceil_div(cols, kColThreads);
    return run_typed<T, 1>(scalar, gp, zp, activation, rows, cols, out, partial, bg, stream);
  });
}

}  // namespace gemmt
