// The activations a GEMM epilogue can apply (gemmt::linear), and their derivatives. One
// definition serves the CUDA epilogues, the fused backward kernel and the CPU kernels, so
// every path computes the same function: float32 arithmetic on the float32 pre-activation,
// with the same formulas PyTorch uses (erf GELU, the tanh approximation, x * sigmoid(x)).
#pragma once

#include <math.h>

#include <string_view>
#include <type_traits>

#if defined(__CUDACC__)
#define GEMMT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GEMMT_HOST_DEVICE inline
#endif

namespace gemmt {

enum class Activation : int {
  kNone = 0,
  kReLU = 1,
  kGelu = 2,      // x * Phi(x), Phi the normal CDF (erf form)
  kGeluTanh = 3,  // PyTorch's approximate="tanh"
  kSilu = 4,      // x * sigmoid(x)
  kCount = 5,
};

// User-facing names, indexed by Activation.
inline constexpr const char* kActivationNames[] = {"none", "relu", "gelu", "gelu_tanh", "silu"};
static_assert(sizeof(kActivationNames) / sizeof(kActivationNames[0]) ==
              static_cast<int>(Activation::kCount));

inline bool activation_from_name(std::string_view name, Activation* out) {
  for (int i = 0; i < static_cast<int>(Activation::kCount); ++i) {
    if (name == kActivationNames[i]) {
      *out = static_cast<Activation>(i);
      return true;
    }
  }
  return false;
}

inline const char* activation_name(Activation a) {
  const int i = static_cast<int>(a);
  return (i >= 0 && i < static_cast<int>(Activation::kCount)) ? kActivationNames[i] : "unknown";
}

namespace act_detail {
// float and double overloads of the math functions, callable from host and device code
// (PyTorch's CPU kernels for float64 tensors compute in double; gradcheck runs there).
GEMMT_HOST_DEVICE float erf_of(float v) {
  return erff(v);
}
GEMMT_HOST_DEVICE double erf_of(double v) {
  return erf(v);
}
GEMMT_HOST_DEVICE float tanh_of(float v) {
  return tanhf(v);
}
GEMMT_HOST_DEVICE double tanh_of(double v) {
  return tanh(v);
}
GEMMT_HOST_DEVICE float exp_of(float v) {
  return expf(v);
}
GEMMT_HOST_DEVICE double exp_of(double v) {
  return exp(v);
}

template <typename F>
struct Constants {
  static constexpr F kSqrtHalf = F(0.70710678118654752440);     // 1 / sqrt(2)
  static constexpr F kInvSqrt2Pi = F(0.39894228040143267794);   // 1 / sqrt(2 pi)
  static constexpr F kSqrt2OverPi = F(0.79788456080286535588);  // sqrt(2 / pi)
  static constexpr F kTanhCubic = F(0.044715);
};
}  // namespace act_detail

// act(z) in F (float, or double for float64 tensors). ReLU keeps NaN, as torch.relu does:
// `z <= 0` is false for NaN.
template <typename F>
GEMMT_HOST_DEVICE F apply_activation(Activation a, F z) {
  using C = act_detail::Constants<F>;
  using namespace act_detail;
  switch (a) {
    case Activation::kReLU:
      return z <= F(0) ? F(0) : z;
    case Activation::kGelu:
      return F(0.5) * z * (F(1) + erf_of(z * C::kSqrtHalf));
    case Activation::kGeluTanh:
      return F(0.5) * z * (F(1) + tanh_of(C::kSqrt2OverPi * (z + C::kTanhCubic * z * z * z)));
    case Activation::kSilu:
      return z / (F(1) + exp_of(-z));
    default:
      return z;
  }
}

// Calls f(std::integral_constant<Activation, A>{}) with A the value of `a` (kNone for a value
// outside the enumeration), so that a kernel can be instantiated per activation and its
// elementwise code be straight-line instead of a switch per element.
template <typename F>
GEMMT_HOST_DEVICE decltype(auto) with_activation(Activation a, F&& f) {
  switch (a) {
    case Activation::kReLU:
      return f(std::integral_constant<Activation, Activation::kReLU>{});
    case Activation::kGelu:
      return f(std::integral_constant<Activation, Activation::kGelu>{});
    case Activation::kGeluTanh:
      return f(std::integral_constant<Activation, Activation::kGeluTanh>{});
    case Activation::kSilu:
      return f(std::integral_constant<Activation, Activation::kSilu>{});
    default:
      return f(std::integral_constant<Activation, Activation::kNone>{});
  }
}

// d act / dz at z.
template <typename F>
GEMMT_HOST_DEVICE F activation_derivative(Activation a, F z) {
  using C = act_detail::Constants<F>;
  using namespace act_detail;
  switch (a) {
    case Activation::kReLU:
      return z > F(0) ? F(1) : F(0);
    case Activation::kGelu:
      return F(0.5) * (F(1) + erf_of(z * C::kSqrtHalf)) +
             z * C::kInvSqrt2Pi * exp_of(F(-0.5) * z * z);
    case Activation::kGeluTanh: {
      const F z2 = z * z;
      const F t = tanh_of(C::kSqrt2OverPi * (z + C::kTanhCubic * z2 * z));
      return F(0.5) * (F(1) + t) +
             F(0.5) * z * (F(1) - t * t) * C::kSqrt2OverPi * (F(1) + F(3) * C::kTanhCubic * z2);
    }
    case Activation::kSilu: {
      const F s = F(1) / (F(1) + exp_of(-z));
      return s * (F(1) + z * (F(1) - s));
    }
    default:
      return F(1);
  }
}

}  // namespace gemmt
