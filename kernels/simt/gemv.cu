// SIMT GEMM family, gemv: m == 1 or n == 1 (a different problem rather than a step up the
// ladder; `auto` picks it for every such product), and float32 products of 2-4 rows, which
// both kernels run against each element of B read once for all of them.
//
// Each output is a dot product of length k, every matrix element
// is used once, so the kernel is bound by DRAM bandwidth: the goal is wide, coalesced loads
// and enough bytes in flight. Both cases are out[r] = sum_p M(r, p) * v(p) with
// M(r, p) = mat[r * s_r + p * s_p]:
//   n == 1: M = A, v = column 0 of B;   m == 1: M = B^T, v = row 0 of A.
// Row-dot kernel (p contiguous, or no unit stride): warps stream along p with 16-byte loads,
//   shuffle-reduce, then warps of one row combine in shared memory in fixed order.
// Column-sweep kernel (r contiguous): a lane owns 1 or 8/4 consecutive rows and walks p, so a
//   warp reads 512 contiguous bytes per step; 8 warps split p and combine in fixed order.
// Long dot products with few outputs additionally split p across blockIdx.y into workspace
// slices, finished by split_k_reduce.cu. The shape (kernel, vector loads, split) is planned by
// plan_gemv in kernels/plan/simt_plan.cpp.
#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"
#include "simt/common.cuh"
#include "simt/launchers.h"

namespace gemmt {
namespace simt {
namespace {

struct GemvParams {
  const void* mat;
  int64_t s_r, s_p;
  const void* vec;
  int64_t s_v;
  int64_t rows, len;
  void* out;
  int64_t s_out;
  float alpha, beta;
  float* partial;  // [splits][rows] when p is split ([vectors][splits][rows]: GemvRowsParams)
  int64_t p_per_split;
  int rows_per_block;  // row-dot: 1, 2, 4 or 8 rows per 8-warp block
  bool vec16;
  int64_t prefetch_blocks;  // row-dot, sm_90+: L2 prefetch of the rows this many blocks ahead
};

// The gemv kernels' parameters for NV > 1 vectors (rows of A): vector v at vec + v * s_vv,
// its outputs at out + v * s_ov. One vector keeps GemvParams, and with it the code the
// single-vector kernels were measured with.
struct GemvRowsParams : GemvParams {
  int64_t s_vv, s_ov;
};

template <int NV>
using RowdotParams = std::conditional_t<NV == 1, GemvParams, GemvRowsParams>;

template <class P>
constexpr bool kManyVectors = std::is_same<P, GemvRowsParams>::value;

// Where vector `vector`'s partial sum or output for `row` goes.
template <class P>
__device__ __forceinline__ int64_t partial_index(const P& g, int vector, int64_t row) {
  if constexpr (kManyVectors<P>)
    return (static_cast<int64_t>(vector) * gridDim.y + blockIdx.y) * g.rows + row;
  return static_cast<int64_t>(blockIdx.y) * g.rows + row;
}
template <class P>
__device__ __forceinline__ int64_t out_offset(const P& g, int vector, int64_t row) {
  if constexpr (kManyVectors<P>) return row * g.s_out + vector * g.s_ov;
  return row * g.s_out;
}
template <class P, class raw>
__device__ __forceinline__ const raw* vector_at(const P& g, const raw* vec, int vector) {
  if constexpr (kManyVectors<P>) return vec + vector * g.s_vv;
  return vec;
}

// Asks L2 for `bytes` (a multiple of 16) at the 16-byte aligned `p`; nothing before sm_90.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

template <class T, class P = GemvParams>
__device__ __forceinline__ void gemv_finish(const P& g, int vector, int64_t row, float s) {
  if (g.partial != nullptr) {
    g.partial[partial_index(g, vector, row)] = s;
    return;
  }
  auto* o = static_cast<typename Elem<T>::raw*>(g.out) + out_offset(g, vector, row);
  float v = g.alpha * s;
  if (g.beta != 0.f) v = fmaf(g.beta, Elem<T>::to_float(*o), v);
  *o = Elem<T>::from_float(v);
}

template <class T>
__device__ __forceinline__ float dot16(const uint4& a, const uint4& b, float acc) {
  if constexpr (std::is_same<T, float>::value) {
    acc = fmaf(__uint_as_float(a.x), __uint_as_float(b.x), acc);
    acc = fmaf(__uint_as_float(a.y), __uint_as_float(b.y), acc);
    acc = fmaf(__uint_as_float(a.z), __uint_as_float(b.z), acc);
    acc = fmaf(__uint_as_float(a.w), __uint_as_float(b.w), acc);
  } else {
    float fa[8], fb[8];
    unpack8<T>(a, fa);
    unpack8<T>(b, fb);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(fa[i], fb[i], acc);
  }
  return acc;
}

// Row-dot blocks of short rows: the first threads ask L2 for the rows of the block
// g.prefetch_blocks ahead, one unsplit row each (planned only for vec16 rows, so 16-byte
// aligned), rounded down to whole 16-byte units.
template <class raw>
__device__ __forceinline__ void prefetch_rows_ahead(const GemvParams& g) {
  if (g.prefetch_blocks == 0 || threadIdx.x >= static_cast<unsigned>(g.rows_per_block)) return;
  const int64_t ahead =
      (static_cast<int64_t>(blockIdx.x) + g.prefetch_blocks) * g.rows_per_block + threadIdx.x;
  const uint32_t bytes = static_cast<uint32_t>(g.len * sizeof(raw)) & ~15u;
  if (ahead < g.rows && bytes > 0)
    prefetch_l2(static_cast<const raw*>(g.mat) + ahead * g.s_r, bytes);
}

// NV vectors (rows of A) share each pass over a row of the matrix: the row is read once.
template <class T, int NV>
__global__ void __launch_bounds__(256) gemv_rowdot_kernel(const RowdotParams<NV> g) {
  using raw = typename Elem<T>::raw;
  constexpr int VE = 16 / sizeof(raw);
  __shared__ float red[NV][8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wpr = 8 / g.rows_per_block;
  const int row_in_block = warp / wpr, sub = warp % wpr;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * g.rows_per_block + row_in_block;
  const int64_t p0 = static_cast<int64_t>(blockIdx.y) * g.p_per_split;
  const int64_t p1 = min(g.len, p0 + g.p_per_split);
  const raw* mat = static_cast<const raw*>(g.mat);
  const raw* vec = static_cast<const raw*>(g.vec);
  const int stride = wpr * 32;
  float acc[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) acc[v] = 0.f;
  if (row < g.rows && p0 < p1) {
    const raw* mrow = mat + row * g.s_r;
    int64_t tail = p0;
    if (g.vec16) {
      // p0 is a multiple of VE and rows are 16-byte aligned (checked on the host).
      const int64_t nvec = (p1 - p0) / VE;
      const uint4* mv = reinterpret_cast<const uint4*>(mrow + p0);
      const uint4* vv[NV];
#pragma unroll
      for (int v = 0; v < NV; ++v)
        vv[v] = reinterpret_cast<const uint4*>(vector_at(g, vec, v) + p0);
#pragma unroll 4
      for (int64_t i = sub * 32 + lane; i < nvec; i += stride) {
#pragma unroll
        for (int v = 0; v < NV; ++v) acc[v] = dot16<T>(mv[i], vv[v][i], acc[v]);
      }
      tail = p0 + nvec * VE;
    }
    for (int64_t q = tail + sub * 32 + lane; q < p1; q += stride) {
#pragma unroll
      for (int v = 0; v < NV; ++v)
        acc[v] = fmaf(ld<T>(mrow, q * g.s_p), ld<T>(vector_at(g, vec, v), q * g.s_v), acc[v]);
    }
  }
#pragma unroll
  for (int v = 0; v < NV; ++v) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc[v] += __shfl_xor_sync(0xffffffffu, acc[v], off);
    if (lane == 0) red[v][warp] = acc[v];
  }
  __syncthreads();
  if (sub == 0 && lane == 0 && row < g.rows) {
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      float s = 0.f;
      for (int w = 0; w < wpr; ++w) s += red[v][row_in_block * wpr + w];
      gemv_finish<T>(g, v, row, s);
    }
  }
  // Last, with the loads' registers free: the prefetch serves a block that starts later.
  // 16-bit only (plan_gemv): in the float32 instance it cost registers for no use.
  if constexpr (sizeof(raw) == 2) prefetch_rows_ahead<raw>(g);
}

template <class T, bool VEC, int NV>
__global__ void __launch_bounds__(256) gemv_colsweep_kernel(const RowdotParams<NV> g) {
  using raw = typename Elem<T>::raw;
  constexpr int VR = VEC ? 16 / static_cast<int>(sizeof(raw)) : 1;
  __shared__ float red[8][NV][VR][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * 32 + lane) * VR;
  const int64_t p0 = static_cast<int64_t>(blockIdx.y) * g.p_per_split;
  const int64_t p1 = min(g.len, p0 + g.p_per_split);
  const raw* mat = static_cast<const raw*>(g.mat);
  const raw* vec = static_cast<const raw*>(g.vec);
  float acc[NV][VR];
#pragma unroll
  for (int v = 0; v < NV; ++v)
#pragma unroll
    for (int i = 0; i < VR; ++i) acc[v][i] = 0.f;
  if (r0 < g.rows) {
    if (VEC && r0 + VR <= g.rows) {
#pragma unroll 4
      for (int64_t q = p0 + warp; q < p1; q += 8) {
        float x[NV];
#pragma unroll
        for (int v = 0; v < NV; ++v) x[v] = ld<T>(vector_at(g, vec, v), q * g.s_v);
        const raw* src = mat + r0 + q * g.s_p;
        if constexpr (std::is_same<T, float>::value) {
          const float4 m = *reinterpret_cast<const float4*>(src);
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            acc[v][0] = fmaf(m.x, x[v], acc[v][0]);
            acc[v][1] = fmaf(m.y, x[v], acc[v][1]);
            acc[v][2] = fmaf(m.z, x[v], acc[v][2]);
            acc[v][3] = fmaf(m.w, x[v], acc[v][3]);
          }
        } else {
          float f[8];
          unpack8<T>(*reinterpret_cast<const uint4*>(src), f);
#pragma unroll
          for (int v = 0; v < NV; ++v)
#pragma unroll
            for (int i = 0; i < VR; ++i) acc[v][i] = fmaf(f[i % 8], x[v], acc[v][i]);
        }
      }
    } else {
      for (int64_t q = p0 + warp; q < p1; q += 8) {
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          const float x = ld<T>(vector_at(g, vec, v), q * g.s_v);
#pragma unroll
          for (int i = 0; i < VR; ++i)
            if (r0 + i < g.rows)
              acc[v][i] = fmaf(ld<T>(mat, (r0 + i) * g.s_r + q * g.s_p), x, acc[v][i]);
        }
      }
    }
  }
#pragma unroll
  for (int v = 0; v < NV; ++v)
#pragma unroll
    for (int i = 0; i < VR; ++i) red[warp][v][i][lane] = acc[v][i];
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int v = 0; v < NV; ++v) {
#pragma unroll
      for (int i = 0; i < VR; ++i) {
        if (r0 + i >= g.rows) break;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < 8; ++w) s += red[w][v][i][lane];
        gemv_finish<T>(g, v, r0 + i, s);
      }
    }
  }
}

// Calls launch(count, params) with the plan's vector count as a compile-time constant and the
// parameters of that count: one vector GemvParams, 2-4 (float32 only, gemv_takes_few_rows)
// GemvRowsParams.
template <class T, class Launch>
cudaError_t with_vector_count(const GemvParams& g, const GemvPlan& pl, Launch&& launch) {
  if (pl.vecs == 1) {
    launch(std::integral_constant<int, 1>{}, g);
    return cudaSuccess;
  }
  if constexpr (std::is_same<T, float>::value) {
    GemvRowsParams r;
    static_cast<GemvParams&>(r) = g;
    r.s_vv = pl.s_vv;
    r.s_ov = pl.s_ov;
    switch (pl.vecs) {
      case 2:
        launch(std::integral_constant<int, 2>{}, r);
        return cudaSuccess;
      case 3:
        launch(std::integral_constant<int, 3>{}, r);
        return cudaSuccess;
      case 4:
        launch(std::integral_constant<int, 4>{}, r);
        return cudaSuccess;
      default:
        break;
    }
  }
  return cudaErrorInvalidValue;
}

template <class T>
cudaError_t run_gemv_typed(const GemmArgs& a, const GemvPlan& pl, float* workspace,
                           cudaStream_t stream) {
  GemvParams g{};
  g.mat = pl.mat;
  g.s_r = pl.s_r;
  g.s_p = pl.s_p;
  g.vec = pl.vec;
  g.s_v = pl.s_v;
  g.rows = pl.rows;
  g.len = pl.len;
  g.out = a.c;
  g.s_out = pl.s_out;
  g.alpha = a.alpha;
  g.beta = a.beta;
  g.partial = nullptr;
  g.p_per_split = pl.p_per_split;
  g.rows_per_block = pl.rows_per_block;
  g.vec16 = pl.vec16;
  g.prefetch_blocks = pl.prefetch_blocks;
  if (pl.blocks_x > kMaxGridX) return cudaErrorInvalidValue;
  if (pl.splits > 1) {
    if (workspace == nullptr) return cudaErrorInvalidValue;
    g.partial = workspace;
  }
  const dim3 grid(static_cast<unsigned>(pl.blocks_x), static_cast<unsigned>(pl.splits));
  if (pl.colsweep) {
    GEMMT_RETURN_IF_ERROR(with_vector_count<T>(g, pl, [&](auto nv, const auto& params) {
      if (g.vec16)
        gemv_colsweep_kernel<T, true, decltype(nv)::value><<<grid, 256, 0, stream>>>(params);
      else
        gemv_colsweep_kernel<T, false, decltype(nv)::value><<<grid, 256, 0, stream>>>(params);
    }));
  } else {
    GEMMT_RETURN_IF_ERROR(with_vector_count<T>(g, pl, [&](auto nv, const auto& params) {
      gemv_rowdot_kernel<T, decltype(nv)::value><<<grid, 256, 0, stream>>>(params);
    }));
  }
  GEMMT_RETURN_IF_ERROR(cudaGetLastError());
  if (pl.splits > 1) {
    // Each vector's slices are [splits][rows] of the workspace, its outputs a row of C.
    for (int v = 0; v < pl.vecs; ++v) {
      GEMMT_RETURN_IF_ERROR(reduce_vector_slices(
          a.dtype, workspace + static_cast<int64_t>(v) * pl.splits * pl.rows, pl.splits, pl.rows,
          static_cast<char*>(a.c) +
              v * pl.s_ov * static_cast<int64_t>(sizeof(typename Elem<T>::raw)),
          pl.s_out, a.alpha, a.beta, stream));
    }
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t run_gemv(const GemmArgs& a, const GemvPlan& plan, float* workspace,
                     cudaStream_t stream) {
  return with_simt_type(a.dtype, [&](auto tag) {
    return run_gemv_typed<typename decltype(tag)::type>(a, plan, workspace, stream);
  });
}

}  // namespace simt
}  // namespace gemmt
