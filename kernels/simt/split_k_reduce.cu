// SIMT GEMM ladder, step 6: split-k's reduction, and C = beta * C.
//
// Adds over step 5: when C has too few tiles to fill the GPU but k is long, the pipelined
// kernel runs over k-slices (blockIdx.z) into float32 partial tiles in a workspace; the
// kernels here add the slices in slice order (deterministic, no atomics), apply alpha and beta
// and round once. Every split-k path (SIMT, wgmma, gemv) finishes here. The planner
// (kernels/plan/simt_plan.cpp) decides the slice count from its cost model.
#include <cuda_runtime.h>

#include <algorithm>

#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "simt/common.cuh"
#include "simt/launchers.h"

namespace gemmt {
namespace simt {
namespace {

// 6. Split-k: when C has too few tiles to fill the GPU but k is long, the pipelined kernel
// runs over `splits` k-slices (blockIdx.z) and writes float32 partial tiles to a workspace;
// this kernel then adds the slices in slice order (deterministic, no atomics), applies
// alpha / beta and rounds once. The same reduction finishes the split gemv.
// Output element (r, c) is out[r * ld + c * cs]; slice s element (r, c) is
// ws[(s * rows + r) * cols + c].
template <class T>
__global__ void __launch_bounds__(256)
    reduce_slices_kernel(const float* __restrict__ ws, int splits, int64_t rows, int64_t cols,
                         typename Elem<T>::raw* out, int64_t ld, int64_t cs, float alpha,
                         float beta, const EpilogueView<T> epi) {
  grid_dependency_wait();  // launched programmatically: reduce_slices_typed
  allow_dependent_launch();
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (col >= cols) return;
  const int64_t slice = rows * cols;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* src = ws + r * cols + col;
    float s = 0.f;
    for (int q = 0; q < splits; ++q) s += src[q * slice];
    typename Elem<T>::raw* o = out + r * ld + col * cs;
    float v = alpha * s;
    if (beta != 0.f) v = fmaf(beta, Elem<T>::to_float(*o), v);
    if (epi.active) v = epi.apply(r, col, v);  // only matrix outputs (cs == 1) carry one
    *o = Elem<T>::from_float(v);
  }
}

// The same for matrix outputs whose rows hold whole quads (n % 4 == 0), over the flattened
// output: a thread adds four neighbouring columns of every slice with 16-byte loads, so a
// narrow output (n = 64) keeps every lane busy where the kernel above idles three in four.
// A small output has few threads, each walking many slices, so the loop loads 16 slices
// before adding them, letting the compiler keep several loads in flight per thread (an
// unroll of 4 took 17 us for 256x256 from 64 slices, against 9.6 for the kernel above).
// Slices are still added in order, so both kernels round alike.
constexpr int kReduceThreads = 128;
constexpr int kReduceUnroll = 16;

template <class T>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_slice_quads_kernel(const float* __restrict__ ws, int splits, const OutView<T> o) {
  grid_dependency_wait();  // launched programmatically: reduce_slices_typed
  allow_dependent_launch();
  const int64_t slice = o.m * o.n;
  const int64_t quads = slice / 4;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kReduceThreads + threadIdx.x; i < quads;
       i += static_cast<int64_t>(gridDim.x) * kReduceThreads) {
    const float* src = ws + 4 * i;
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    int q = 0;
    for (; q + kReduceUnroll <= splits; q += kReduceUnroll) {
      float4 v[kReduceUnroll];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u)
        v[u] = __ldg(reinterpret_cast<const float4*>(src + (q + u) * slice));
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
        s[0] += v[u].x;
        s[1] += v[u].y;
        s[2] += v[u].z;
        s[3] += v[u].w;
      }
    }
    for (; q < splits; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(src + q * slice));
      s[0] += v.x;
      s[1] += v.y;
      s[2] += v.z;
      s[3] += v.w;
    }
    store_quad(o, 4 * i / o.n, 4 * i % o.n, s);
  }
}

// C = beta * C over rows x cols (element (r, c) at out[r * ld + c * cs]); beta == 0 stores
// zeros without reading, so NaN in C does not survive.
template <class T>
__global__ void __launch_bounds__(256)
    scale_kernel(typename Elem<T>::raw* out, int64_t rows, int64_t cols, int64_t ld, int64_t cs,
                 float beta, const EpilogueView<T> epi, bool column) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (col >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    typename Elem<T>::raw* o = out + r * ld + col * cs;
    float v = beta == 0.f ? 0.f : beta * Elem<T>::to_float(*o);
    // A single column is walked as one row: element `col` is C's (col, 0).
    if (epi.active) v = column ? epi.apply(col, 0, v) : epi.apply(r, col, v);
    *o = Elem<T>::from_float(v);
  }
}

// C = alpha * (sum of `splits` float32 slices [splits][m][n]) + beta * C. The quad kernel
// needs 16-byte aligned slices: the workspaces planned here are, a caller's buffer passed to
// gemm_reduce_k_slices may not be.
// Both are programmatic launches (gemmt/launch.cuh): behind a split GEMM that lets its
// dependents launch early (the Hopper kernel does), their blocks are placed on the SMs the
// GEMM leaves free and wait there for its end, instead of being launched after it; and the
// kernel after them may place its blocks while they run.
template <class T>
cudaError_t reduce_slices_typed(const GemmArgs& a, const float* slices, int splits,
                                cudaStream_t stream) {
  if (a.n % 4 == 0 && is_aligned(slices, 16)) {
    const int64_t blocks = std::min<int64_t>(ceil_div(a.m * a.n / 4, kReduceThreads), 16384);
    GEMMT_RETURN_IF_ERROR(launch_programmatic<reduce_slice_quads_kernel<T>>(
        dim3(static_cast<unsigned>(blocks)), dim3(kReduceThreads), 0, stream, slices, splits,
        make_out<T>(a)));
    GEMMT_RETURN_LAUNCH_ERROR();
  }
  const int64_t gx = ceil_div(a.n, 256);
  if (gx > kMaxGridX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(std::min<int64_t>(a.m, 65535)));
  GEMMT_RETURN_IF_ERROR(launch_programmatic<reduce_slices_kernel<T>>(
      grid, dim3(256), 0, stream, slices, splits, a.m, a.n,
      static_cast<typename Elem<T>::raw*>(a.c), a.ldc, int64_t{1}, a.alpha, a.beta,
      make_epilogue_view<T>(a.epilogue)));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <class T>
cudaError_t scale_typed(const GemmArgs& a, cudaStream_t stream) {
  // A single column is walked as one row with column stride ldc so that threads, not the
  // 65535-limited grid.y, cover its length.
  const bool col = a.n == 1;
  const int64_t rows = col ? 1 : a.m, cols = col ? a.m : a.n;
  const int64_t ld = col ? 0 : a.ldc, cs = col ? a.ldc : 1;
  const int64_t gx = ceil_div(cols, 256);
  if (gx > kMaxGridX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  scale_kernel<T><<<grid, 256, 0, stream>>>(static_cast<typename Elem<T>::raw*>(a.c), rows, cols,
                                            ld, cs, a.beta, make_epilogue_view<T>(a.epilogue), col);
  GEMMT_RETURN_LAUNCH_ERROR();
}

}  // namespace

cudaError_t reduce_slices(const GemmArgs& a, const float* slices, int splits, cudaStream_t stream) {
  return with_simt_type(a.dtype, [&](auto tag) {
    return reduce_slices_typed<typename decltype(tag)::type>(a, slices, splits, stream);
  });
}

cudaError_t reduce_vector_slices(ScalarType t, const float* ws, int splits, int64_t cols, void* out,
                                 int64_t cs, float alpha, float beta, cudaStream_t stream) {
  // Outputs as one row of `cols` columns with column stride cs.
  const int64_t gx = ceil_div(cols, 256);
  if (gx > kMaxGridX) return cudaErrorInvalidValue;
  return with_simt_type(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    GEMMT_RETURN_IF_ERROR(launch_programmatic<reduce_slices_kernel<T>>(
        dim3(static_cast<unsigned>(gx)), dim3(256), 0, stream, ws, splits, int64_t{1}, cols,
        static_cast<typename Elem<T>::raw*>(out), int64_t{0}, cs, alpha, beta, EpilogueView<T>{}));
    GEMMT_RETURN_LAUNCH_ERROR();
  });
}

}  // namespace simt

cudaError_t gemm_reduce_k_slices(const GemmArgs& args, const float* slices, int splits,
                                 cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  if (slices == nullptr || splits < 1) return cudaErrorInvalidValue;
  switch (args.dtype) {
    case ScalarType::kFloat32:
      return simt::reduce_slices_typed<float>(args, slices, splits, stream);
    case ScalarType::kFloat16:
      return simt::reduce_slices_typed<__half>(args, slices, splits, stream);
    case ScalarType::kBFloat16:
      return simt::reduce_slices_typed<__nv_bfloat16>(args, slices, splits, stream);
    default:
      return cudaErrorNotSupported;
  }
}

cudaError_t gemm_scale_c(const GemmArgs& args, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  switch (args.dtype) {
    case ScalarType::kFloat32:
      return simt::scale_typed<float>(args, stream);
    case ScalarType::kFloat16:
      return simt::scale_typed<__half>(args, stream);
    case ScalarType::kBFloat16:
      return simt::scale_typed<__nv_bfloat16>(args, stream);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace gemmt
