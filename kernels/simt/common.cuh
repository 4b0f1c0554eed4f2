// What the SIMT ladder kernels (kernels/simt/ladder_*.cu) share: the typed operands of one
// product and the element loads. Every kernel converts elements to float on load,
// accumulates in float with fmaf and rounds once when it writes C; global offsets are 64-bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gemmt/gemm.h"
#include "gemmt/numeric.cuh"
#include "plan/simt_plan.h"
#include "simt/tiles.cuh"

namespace gemmt {
namespace simt {
namespace {

// Operands and output of one product, with typed raw pointers.
template <class T>
struct MatArgs {
  using raw = typename Elem<T>::raw;
  const raw* a;
  int64_t sam, sak;
  const raw* b;
  int64_t sbk, sbn;
  int64_t m, n, k;
  OutView<T> out;
};

template <class T>
__device__ __forceinline__ float ld(const typename Elem<T>::raw* p, int64_t off) {
  return Elem<T>::to_float(p[off]);
}

// Four consecutive elements from an address aligned to 4 elements (16 B fp32, 8 B 16-bit).
template <class T>
__device__ __forceinline__ void load_vec4(const typename Elem<T>::raw* p, float v[4]) {
  if constexpr (std::is_same<T, float>::value) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    v[0] = Elem<T>::to_float(static_cast<uint16_t>(q.x & 0xffffu));
    v[1] = Elem<T>::to_float(static_cast<uint16_t>(q.x >> 16));
    v[2] = Elem<T>::to_float(static_cast<uint16_t>(q.y & 0xffffu));
    v[3] = Elem<T>::to_float(static_cast<uint16_t>(q.y >> 16));
  }
}

// C allows aligned 4-element vector access (OutView::vec4): runs of 4 along its rows, or, for a
// column-major C (the transposed run), down its columns; either way ldc apart.
inline bool out_vec4(const GemmArgs& a, bool column_major = false) {
  const int64_t lines = column_major ? a.n : a.m;
  return is_aligned(a.c, static_cast<std::size_t>(4 * elem_bytes(a.dtype))) &&
         (lines == 1 || a.ldc % 4 == 0);
}

template <class T>
OutView<T> make_out(const GemmArgs& a) {
  OutView<T> o;
  o.c = static_cast<typename Elem<T>::raw*>(a.c);
  o.ldc = a.ldc;
  o.m = a.m;
  o.n = a.n;
  o.alpha = a.alpha;
  o.beta = a.beta;
  o.vec4 = out_vec4(a);
  o.epi = make_epilogue_view<T>(a.epilogue);
  return o;
}

template <class T>
MatArgs<T> make_mat(const GemmArgs& a) {
  using raw = typename Elem<T>::raw;
  return MatArgs<T>{static_cast<const raw*>(a.a),
                    a.a_stride_m,
                    a.a_stride_k,
                    static_cast<const raw*>(a.b),
                    a.b_stride_k,
                    a.b_stride_n,
                    a.m,
                    a.n,
                    a.k,
                    make_out<T>(a)};
}

// Calls fn(TypeTag<T>{}) for the element type T of a SIMT dtype (float, __half,
// __nv_bfloat16); cudaErrorNotSupported for any other dtype.
template <class Fn>
cudaError_t with_simt_type(ScalarType t, Fn&& fn) {
  if (!simt_dtype_ok(t)) return cudaErrorNotSupported;
  return dispatch_float_dtype(t, fn);
}

}  // namespace
}  // namespace simt
}  // namespace gemmt
