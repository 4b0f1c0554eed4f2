// Epilogue shared by the tensor-core GEMM kernels: an mma accumulator fragment holds two
// horizontally adjacent outputs, written as one 4-, 8- or 16-byte store when the pair is
// aligned. Arithmetic is in opmath_t<T>: float, or double for float64 outputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemmt/activation.h"
#include "gemmt/gemm.h"
#include "gemmt/numeric.cuh"

namespace gemmt {

// The activation as one out-of-line function per translation unit: inlined at every store of
// every instantiation, erf, tanh and exp multiplied the kernels' code (and ptxas's time) many
// times over, for a path that runs once per output element.
static __device__ __noinline__ float activation_out_of_line(Activation act, float z) {
  return apply_activation(act, z);
}
static __device__ __noinline__ double activation_out_of_line(Activation act, double z) {
  return apply_activation(act, z);
}

// For 16-bit outputs, whose rounding (2^-8 or 2^-11 relative) hides the approximate unit's
// error (about 2^-11), the hot activations in a few instructions each: tanh.approx for the
// tanh GELU, ex2.approx for SiLU. The erf GELU keeps the exact out-of-line form.
__device__ __forceinline__ float tanh_approx(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float activation_16bit_inline(Activation act, float z) {
  using C = act_detail::Constants<float>;
  switch (act) {
    case Activation::kNone:
      return z;
    case Activation::kReLU:
      return z <= 0.f ? 0.f : z;
    case Activation::kGeluTanh: {
      // h (1 + tanh(u)) with h = z / 2 and u = z (a + b z^2): five float operations
      // besides the tanh, where the textbook order takes seven.
      constexpr float kA = C::kSqrt2OverPi, kB = C::kSqrt2OverPi * C::kTanhCubic;
      const float h = 0.5f * z;
      return fmaf(h, tanh_approx(z * fmaf(kB, z * z, kA)), h);
    }
    case Activation::kSilu:
      return __fdividef(z, 1.f + __expf(-z));
    default:
      return activation_out_of_line(act, z);
  }
}

// A GemmEpilogue as the kernels see it: applied to z = alpha * acc + beta * C of output
// (row, col) in the coordinates of the caller's GemmArgs (a kernel that computes C^T maps
// its own coordinates back before calling). `active` is false for a plain product, so the
// common case costs one uniform branch per store, not a kernel instantiation per epilogue.
template <typename T>
struct EpilogueView {
  const T* bias = nullptr;
  T* preact = nullptr;
  int64_t ld_preact = 0;
  Activation act = Activation::kNone;
  bool bias_per_row = false;
  bool active = false;

  // kInline: the tensor-core kernels' hot store paths, where a call per element would cost
  // throughput; elsewhere the activation is one out-of-line call.
  template <bool kInline = false>
  __device__ __forceinline__ opmath_t<T> apply(int64_t row, int64_t col, opmath_t<T> z) const {
    if (bias != nullptr) z += to_opmath(bias[bias_per_row ? row : col]);
    if (preact != nullptr) preact[row * ld_preact + col] = from_opmath<T>(z);
    if (act == Activation::kNone) return z;
    if constexpr (kInline && sizeof(T) == 2) return activation_16bit_inline(act, z);
    return activation_out_of_line(act, z);
  }
};

// The same for a kernel whose element type is only known at run time (one Params struct
// for all dtypes): the pointers stay untyped and the caller names the type at the store.
struct EpilogueParams {
  const void* bias = nullptr;
  void* preact = nullptr;
  int64_t ld_preact = 0;
  Activation act = Activation::kNone;
  bool bias_per_row = false;
  bool active = false;

  template <typename T>
  __host__ __device__ __forceinline__ EpilogueView<T> view() const {
    EpilogueView<T> v;
    v.bias = static_cast<const T*>(bias);
    v.preact = static_cast<T*>(preact);
    v.ld_preact = ld_preact;
    v.act = act;
    v.bias_per_row = bias_per_row;
    v.active = active;
    return v;
  }
};

inline EpilogueParams make_epilogue_params(const GemmEpilogue& e) {
  EpilogueParams p;
  p.bias = e.bias;
  p.preact = e.preact;
  p.ld_preact = e.ld_preact;
  p.act = e.activation;
  p.bias_per_row = e.bias_per_row;
  p.active = !e.empty();
  return p;
}

template <typename T>
inline EpilogueView<T> make_epilogue_view(const GemmEpilogue& e) {
  return make_epilogue_params(e).view<T>();
}

// dst[0] (and dst[1] when has_second) = alpha * v + beta * dst. beta == 0 never reads C,
// which may hold NaN. pair_aligned: dst is aligned for a two-element store.
// With an active epilogue, (row, col) is dst[0]'s position in GemmArgs coordinates and the
// second element is (row, col + 1).
template <typename T>
__device__ __forceinline__ void store_c_pair(T* dst, bool has_second, bool pair_aligned,
                                             opmath_t<T> v0, opmath_t<T> v1, opmath_t<T> alpha,
                                             opmath_t<T> beta,
                                             const EpilogueView<T>& epi = EpilogueView<T>{},
                                             int64_t row = 0, int64_t col = 0) {
  v0 *= alpha;
  v1 *= alpha;
  if (beta != opmath_t<T>(0)) {
    v0 += beta * to_opmath(dst[0]);
    if (has_second) v1 += beta * to_opmath(dst[1]);
  }
  if (epi.active) {
    v0 = epi.apply(row, col, v0);
    if (has_second) v1 = epi.apply(row, col + 1, v1);
  }
  if (has_second && pair_aligned) {
    if constexpr (sizeof(T) == 8) {
      *reinterpret_cast<double2*>(dst) = make_double2(v0, v1);
    } else if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    } else {
      struct alignas(4) Pair {
        T x, y;
      };
      *reinterpret_cast<Pair*>(dst) = Pair{from_opmath<T>(v0), from_opmath<T>(v1)};
    }
  } else {
    dst[0] = from_opmath<T>(v0);
    if (has_second) dst[1] = from_opmath<T>(v1);
  }
}

}  // namespace gemmt
