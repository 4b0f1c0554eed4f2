// The Linear layer's backward epilogue: grad_preact = grad * act'(z) and the bias gradient
// (its column sums) in one pass over grad and z.
//
// PyTorch runs these as two passes (the activation's backward writes grad_preact, then a
// reduction reads it back for the bias); here the column sums are taken from registers while
// grad_preact is written, so grad_preact is never read again.
//
// Layout: a block is 32 x 8 threads. The 32 threads along x cover 32 packs of columns (16
// bytes each: a strip of 256 bf16 / fp16 columns, 128 float32), the 8 along y take 8
// consecutive rows, so every warp reads and writes 512 contiguous bytes of one row per step.
//
// The grid is persistent and balanced: the work is cut into units of one strip by 8 rows,
// ordered strip by strip, and each of the GPU's resident blocks takes an equal contiguous run
// of units. (A grid of fixed row chunks per strip left a partial last wave: 2048 x 11008 made
// 559 blocks for 528 resident ones, and the chip idled while 31 blocks ran alone.) A block
// keeps float32 column sums for the part of a strip it walks; its 8 row lanes are added in a
// fixed order through shared memory. A strip walked by one block writes its bias gradient
// directly; a strip shared by several blocks gets one partial per block, added in block order
// by a second, small kernel: the result does not depend on scheduling.
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

// An experiment build may set another block shape, of the same 256 threads
// (benchmarks/experiments/act_backward_layout/).
#if defined(GEMMT_ACT_BACKWARD_COL_THREADS)
constexpr int kColThreads = GEMMT_ACT_BACKWARD_COL_THREADS;
#else
constexpr int kColThreads = 32;
#endif
constexpr int kRowThreads = 256 / kColThreads;
constexpr int kBlockThreads = kColThreads * kRowThreads;
// No GPU holds more than 2048 threads per SM, so no more than this many blocks: the bound the
// workspace is sized for before the launch asks the occupancy of its kernel.
constexpr int kMaxBlocksPerSm = 2048 / kBlockThreads;
// Registers capped at 64 so that four blocks share an SM: the erf form of gelu took 73 and ran
// three blocks per SM, leaving too few loads in flight to cover its arithmetic.
constexpr int kMinBlocksPerSm = 4;

// The units of work (a strip of kColThreads packs by kRowThreads rows) and how they are dealt.
// Block b takes units [b * units / blocks, (b + 1) * units / blocks), ordered strip-major.
struct Plan {
  int64_t strips;      // column strips of kColThreads packs
  int64_t steps;       // units per strip: ceil(rows / kRowThreads)
  int64_t units;       // strips * steps
  int64_t blocks;      // the grid, at most units
  int64_t strip_cols;  // columns per strip (and floats per partial slot)
};

__host__ __device__ inline int64_t first_unit(const Plan& p, int64_t block) {
  return block * p.units / p.blocks;
}

// The block whose run holds unit u: the largest b with first_unit(b) <= u.
__host__ __device__ inline int64_t block_of(const Plan& p, int64_t unit) {
  return ((unit + 1) * p.blocks - 1) / p.units;
}

// Strip s is walked by blocks block_of(s * steps) .. block_of((s + 1) * steps - 1). Block b's
// partial for strip s sits in slot b + s: runs are contiguous and ordered, so a later block
// never walks an earlier strip, and no two (block, strip) pairs share a slot.
__host__ __device__ inline bool strip_is_shared(const Plan& p, int64_t strip) {
  return block_of(p, strip * p.steps) != block_of(p, (strip + 1) * p.steps - 1);
}

Plan plan_for(int64_t rows, int64_t cols, int pack, int64_t resident_blocks) {
  Plan p;
  p.strip_cols = int64_t{kColThreads} * pack;
  p.strips = ceil_div(cols, p.strip_cols);
  p.steps = ceil_div(rows, int64_t{kRowThreads});
  p.units = p.strips * p.steps;
  p.blocks = std::max<int64_t>(1, std::min(p.units, resident_blocks));
  return p;
}

// Partial sums (opmath values: float, double for float64) the workspace holds.
int64_t workspace_floats(const Plan& p) {
  return (p.blocks + p.strips) * p.strip_cols;
}

// A strip is shared exactly when a block's run starts inside it, so the blocks' first units
// answer for every strip: at most one look per block (a few thousand strips of one
// vocabulary-wide row would otherwise be walked on every call), and none with one unit per
// strip.
bool any_strip_shared(const Plan& p) {
  if (p.steps == 1) return false;
  if (p.blocks > p.strips) return true;  // two runs start in one strip
  for (int64_t b = 1; b < p.blocks; ++b) {
    if (first_unit(p, b) % p.steps != 0) return true;
  }
  return false;
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

// grad_preact for rows [row_begin, row_end) of one pack of columns, with the pack's column
// sums added to `sum`. The row lanes step kRowThreads rows apart.
template <typename T, int kPack, int kAct, bool kSumBias>
__device__ __forceinline__ void walk_rows(const T* __restrict__ grad, const T* __restrict__ preact,
                                          int64_t cols, int64_t col0, int64_t row_begin,
                                          int64_t row_end, T* __restrict__ grad_preact,
                                          opmath_t<T> (&sum)[kPack]) {
  using F = opmath_t<T>;
  constexpr bool kHasPreact = kAct != static_cast<int>(Activation::kNone);
  const bool full_pack = col0 + kPack <= cols;
#pragma unroll 4
  for (int64_t r = row_begin; r < row_end; r += kRowThreads) {
    const int64_t off = r * cols + col0;
    T g[kPack], z[kPack];
    if (full_pack) {
      load_row_pack<T, kPack>(grad + off, g);
      if constexpr (kHasPreact) load_row_pack<T, kPack>(preact + off, z);
    } else {
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        const bool in = col0 + e < cols;
        g[e] = in ? grad[off + e] : from_opmath<T>(F(0));
        if constexpr (kHasPreact) z[e] = in ? preact[off + e] : from_opmath<T>(F(0));
      }
    }
    T out[kPack];
#pragma unroll
    for (int e = 0; e < kPack; ++e) {
      F v = to_opmath(g[e]);
      if constexpr (kHasPreact) {
        v *= activation_derivative(static_cast<Activation>(kAct), to_opmath(z[e]));
      }
      out[e] = from_opmath<T>(v);
      // The bias gradient adds the rounded values, the ones the GEMMs see.
      if constexpr (kSumBias) sum[e] += to_opmath(out[e]);
    }
    if constexpr (kHasPreact) {
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

// kAct: the activation (an Activation), a template argument so that the derivative of a
// pack's elements is straight-line code (chosen per element at run time, every element sat
// behind its own switch). kNone: the bias sums alone (grad_preact is grad itself).
template <typename T, int kPack, int kAct, bool kSumBias>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    linear_backward_kernel(const T* __restrict__ grad, const T* __restrict__ preact, int64_t rows,
                           int64_t cols, Plan plan, T* __restrict__ grad_preact,
                           opmath_t<T>* __restrict__ partial, T* __restrict__ bias_grad) {
  using F = opmath_t<T>;
  constexpr int kStripCols = kColThreads * kPack;
  __shared__ F lanes[kSumBias ? kRowThreads : 1][kStripCols];
  grid_dependency_wait();  // launched programmatically: launch_pass
  allow_dependent_launch();
  const int64_t block = blockIdx.x;
  const int64_t end = first_unit(plan, block + 1);
  for (int64_t unit = first_unit(plan, block); unit < end;) {
    // The part of one strip this block walks: units [step0, step1) of strip s.
    const int64_t s = unit / plan.steps;
    const int64_t step0 = unit - s * plan.steps;
    const int64_t step1 = min(plan.steps, step0 + (end - unit));
    unit += step1 - step0;
    const int64_t col0 = (s * kColThreads + threadIdx.x) * kPack;
    F sum[kPack];
#pragma unroll
    for (int e = 0; e < kPack; ++e) sum[e] = F(0);
    if (col0 < cols) {
      walk_rows<T, kPack, kAct, kSumBias>(grad, preact, cols, col0,
                                          step0 * kRowThreads + threadIdx.y,
                                          min(rows, step1 * kRowThreads), grad_preact, sum);
    }
    if constexpr (kSumBias) {
      // Row lanes 1..7 hand their sums to lane 0 of their column, which adds them in order.
#pragma unroll
      for (int e = 0; e < kPack; ++e) lanes[threadIdx.y][threadIdx.x * kPack + e] = sum[e];
      __syncthreads();
      if (threadIdx.y == 0 && col0 < cols) {
        const bool whole_strip = step0 == 0 && step1 == plan.steps;
        F* slot = partial + (block + s) * kStripCols + threadIdx.x * kPack;
#pragma unroll
        for (int e = 0; e < kPack; ++e) {
          F t = lanes[0][threadIdx.x * kPack + e];
#pragma unroll
          for (int y = 1; y < kRowThreads; ++y) t += lanes[y][threadIdx.x * kPack + e];
          if (col0 + e < cols) {
            if (whole_strip) {
              bias_grad[col0 + e] = from_opmath<T>(t);
            } else {
              slot[e] = t;
            }
          }
        }
      }
      __syncthreads();  // lanes is refilled for the next strip
    }
  }
}

// bias_grad[j] for the columns of shared strips: the partials of the strip's blocks, added in
// block order. Columns of strips walked by one block were written by it.
template <typename T>
__global__ void __launch_bounds__(256)
    sum_partials_kernel(const opmath_t<T>* __restrict__ partial, Plan plan, int64_t cols,
                        T* __restrict__ bias_grad) {
  grid_dependency_wait();  // the partials of the pass launched just before
  allow_dependent_launch();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  const int64_t s = j / plan.strip_cols;
  if (!strip_is_shared(plan, s)) return;
  const int64_t first = block_of(plan, s * plan.steps);
  const int64_t last = block_of(plan, (s + 1) * plan.steps - 1);
  const int64_t lane = j - s * plan.strip_cols;
  opmath_t<T> t = 0;
  for (int64_t b = first; b <= last; ++b) t += partial[(b + s) * plan.strip_cols + lane];
  bias_grad[j] = from_opmath<T>(t);
}

template <typename T, int kPack, int kAct, bool kSumBias>
cudaError_t launch_pass(int64_t rows, int64_t cols, int sm_count, const T* grad, const T* preact,
                        T* grad_preact, opmath_t<T>* partial, T* bias_grad, cudaStream_t stream) {
  constexpr auto kKernel = linear_backward_kernel<T, kPack, kAct, kSumBias>;
  int resident = 0;
  GEMMT_RETURN_IF_ERROR(resident_blocks_per_sm<kKernel>(kBlockThreads, &resident));
  resident = std::min(resident, kMaxBlocksPerSm);
  const Plan plan = plan_for(rows, cols, kPack, int64_t{resident} * std::max(sm_count, 1));
  // Both kernels are programmatic launches (gemmt/launch.cuh): each one's blocks are placed
  // as the previous kernel's leave, and wait for its results before reading.
  const dim3 block(kColThreads, kRowThreads);
  GEMMT_RETURN_IF_ERROR(launch_programmatic<kKernel>(dim3(static_cast<unsigned>(plan.blocks)),
                                                     block, 0, stream, grad, preact, rows, cols,
                                                     plan, grad_preact, partial, bias_grad));
  GEMMT_RETURN_IF_ERROR(cudaGetLastError());
  if constexpr (kSumBias) {
    if (any_strip_shared(plan)) {
      GEMMT_RETURN_IF_ERROR(launch_programmatic<sum_partials_kernel<T>>(
          dim3(grid_1d(cols, 256)), dim3(256), 0, stream, static_cast<const opmath_t<T>*>(partial), plan,
          cols, bias_grad));
    }
  }
  GEMMT_RETURN_LAUNCH_ERROR();
}

// grad_preact for activation kAct, with the bias sums when bias_grad is given.
template <typename T, int kPack, int kAct>
cudaError_t run_activation(int64_t rows, int64_t cols, int sm_count, const T* grad, const T* preact,
                           T* grad_preact, opmath_t<T>* partial, T* bias_grad, cudaStream_t stream) {
  if (bias_grad == nullptr) {
    return launch_pass<T, kPack, kAct, false>(rows, cols, sm_count, grad, preact, grad_preact,
                                              partial, nullptr, stream);
  }
  return launch_pass<T, kPack, kAct, true>(rows, cols, sm_count, grad, preact, grad_preact, partial,
                                           bias_grad, stream);
}

// The kernel forms a Linear backward needs: with an activation, grad_preact (one form per
// activation) with or without the bias sums; without one, the bias sums alone (grad_preact
// is grad itself).
template <typename T, int kPack>
cudaError_t run_typed(int64_t rows, int64_t cols, int sm_count, const T* grad, const T* preact,
                      Activation act, T* grad_preact, opmath_t<T>* partial, T* bias_grad,
                      cudaStream_t stream) {
  if (act == Activation::kNone || grad_preact == nullptr) {
    if (bias_grad == nullptr) return cudaSuccess;
    return launch_pass<T, kPack, static_cast<int>(Activation::kNone), true>(
        rows, cols, sm_count, grad, nullptr, nullptr, partial, bias_grad, stream);
  }
  return with_activation(act, [&](auto a) -> cudaError_t {
    constexpr Activation kA = decltype(a)::value;
    if constexpr (kA == Activation::kNone) {
      return cudaErrorInvalidValue;  // not an Activation (kNone is taken above)
    } else {
      return run_activation<T, kPack, static_cast<int>(kA)>(
          rows, cols, sm_count, grad, preact, grad_preact, partial, bias_grad, stream);
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
  // Sized for full packs and the most blocks any GPU holds; the launch's plan (its kernel's
  // real occupancy, or the scalar form's narrower strips) never needs more.
  const int pack = kVectorBytes / static_cast<int>(element_size(dtype));
  const Plan p = plan_for(rows, cols, pack, int64_t{kMaxBlocksPerSm} * std::max(sm_count, 1));
  const std::size_t acc_bytes = dtype == ScalarType::kFloat64 ? sizeof(double) : sizeof(float);
  return static_cast<std::size_t>(workspace_floats(p)) * acc_bytes;
}

cudaError_t linear_backward_run(ScalarType dtype, int64_t rows, int64_t cols, const void* grad,
                                const void* preact, Activation activation, void* grad_preact,
                                void* bias_grad, void* workspace, int sm_count,
                                cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (activation != Activation::kNone && grad_preact != nullptr && preact == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (bias_grad != nullptr && workspace == nullptr) return cudaErrorInvalidValue;
  return dispatch_float_or_double_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kFull = kPackElems<T>;
    const T* gp = static_cast<const T*>(grad);
    const T* zp = static_cast<const T*>(preact);
    T* out = static_cast<T*>(grad_preact);
    T* bg = static_cast<T*>(bias_grad);
    opmath_t<T>* partial = static_cast<opmath_t<T>*>(workspace);
    if (pack_for<T>(cols, grad, preact, grad_preact) == kFull) {
      return run_typed<T, kFull>(rows, cols, sm_count, gp, zp, activation, out, partial, bg,
                                 stream);
    }
    return run_typed<T, 1>(rows, cols, sm_count, gp, zp, activation, out, partial, bg, stream);
  });
}

}  // namespace gemmt
