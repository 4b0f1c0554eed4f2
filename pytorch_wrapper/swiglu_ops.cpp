// swiglu(gate, up) = silu(gate) * up and its backward: argument checks, CPU kernels, CUDA
// launches. float32, float16 and bfloat16 (float64 too on CPU, for gradcheck); any shape,
// gate and up of one shape. The CUDA kernels compute in float and round once. On CPU the
// forward is torch's own composition (ATen's silu, then the product, each rounded to the
// dtype); the backward chains ATen's vectorised ops (on float chunks for float16; bfloat16's:
// its exponential on float chunks, the rest in one pass, below) and rounds once. The plain
// loops stay as the *_cpu_reference functions.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <tuple>

#include "common.h"
#include "cpu_loops.h"
#include "ops.h"

#ifdef GEMMT_WITH_CUDA
#include "gemmt/elementwise.h"
#endif

namespace gemmt::wrapper {
namespace {

constexpr const char* kSwiglu = "gemmt::swiglu";
constexpr const char* kSwigluBackward = "gemmt::swiglu_backward";

// `b` must match `a`: defined, same device, dtype and shape; `a` a floating dtype.
void check_like(const char* op, const char* an, const at::Tensor& a, const char* bn,
                const at::Tensor& b) {
  check_dtype(op, an, a, float_dtypes_for(a));
  check_defined(op, bn, b);
  check_same_device(op, an, a, bn, b);
  check_same_dtype(op, an, a, bn, b);
  check_same_shape(op, an, a, bn, b);
}

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

bool reduced_float(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

at::Tensor flat(const at::Tensor& t) {
  return t.contiguous().view({-1});
}

// out = silu(x) * u, each step rounded to x's type: torch's F.silu(x) * u. For float16 and
// bfloat16 that is two roundings where the reference loop has one (an ulp apart at most), at
// torch's speed: rounded once from float chunks (four more passes converting operands and
// results), the bfloat16 forward ran at 0.74x of torch on a 2-core x86-64 CPU (2^20
// elements: 0.33 ms against 0.245), and two one-pass forms at 0.36 ms and 0.99 ms
// (docs/performance.md). out may not alias x or u.
void swiglu_chain(const at::Tensor& x, const at::Tensor& u, at::Tensor& out) {
  at::silu_out(out, x);
  out.mul_(u);
}

// The bfloat16 backward on CPU takes sigmoid (the exponential) from ATen's vectorised float
// kernel, on a float copy of a chunk of the gate, and does the rest in one pass over the chunk
// that reads the 16-bit inputs and writes both 16-bit gradients: the chain of ATen ops (as for
// float16) spends four more passes converting operands and results. Same float arithmetic, one
// rounding. Measured on a 2-core x86-64 CPU, 2^20 elements: 0.53 ms against the chain's 0.64
// (torch's bf16 ops: 0.52); without the AVX2 form of the loop, 0.99.

// The loops below in an AVX2 form too, picked at load time on CPUs that have it (GCC / Clang
// function multiversioning on x86-64), besides the baseline the build targets.
#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMMT_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GEMMT_CPU_CLONES
#endif

// bfloat16 <-> float as bit operations without branches, so that the loops below vectorise in
// a build without -march flags; round_bf16 rounds to nearest even and keeps a NaN a NaN, as
// c10::BFloat16's constructor does.
inline float bf16_value(c10::BFloat16 v) {
  return c10::bit_cast<float>(static_cast<uint32_t>(v.x) << 16);
}

inline c10::BFloat16 round_bf16(float f) {
  const uint32_t u = c10::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return c10::BFloat16(static_cast<uint16_t>(nan ? 0x7FC0u : rounded), c10::BFloat16::from_bits());
}

// d_gate[i] = round(g u s (1 + x (1 - s))), d_up[i] = round(g x s), with s = sigmoid(x).
GEMMT_CPU_CLONES void swiglu_backward_round(const c10::BFloat16* g, const float* x, const float* s,
                                            const c10::BFloat16* u, c10::BFloat16* d_gate,
                                            c10::BFloat16* d_up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = bf16_value(g[i]), xs = x[i] * s[i];
    d_gate[i] = round_bf16(gi * bf16_value(u[i]) * (s[i] + xs * (1.f - s[i])));
    d_up[i] = round_bf16(gi * xs);
  }
}

// d_gate = silu'(x) * (g * u) and d_up = g * silu(x), as swiglu_chain.
void swiglu_backward_chain(const at::Tensor& g, const at::Tensor& x, const at::Tensor& u,
                           at::Tensor& d_gate, at::Tensor& d_up) {
  at::mul_out(d_gate, g, u);
  at::silu_backward_out(d_gate, d_gate, x);
  at::silu_out(d_up, x);
  d_up.mul_(g);
}

}  // namespace

at::Tensor swiglu_meta(const at::Tensor& gate, const at::Tensor& up) {
  check_like(kSwiglu, "gate", gate, "up", up);
  return new_output(gate.sym_sizes(), gate.options());
}

at::Tensor swiglu_cpu(const at::Tensor& gate, const at::Tensor& up) {
  at::Tensor out = swiglu_meta(gate, up);
  if (out.numel() == 0) return out;
  at::AutoDispatchBelowADInplaceOrView guard;
  swiglu_chain(gate, up, out);
  return out;
}

at::Tensor swiglu_cpu_reference(const at::Tensor& gate, const at::Tensor& up) {
  at::Tensor out = swiglu_meta(gate, up);
  check_cpu_reference(kSwiglu, gate);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, gate.scalar_type(), "gemmt_swiglu", [&] {
        using opmath = at::opmath_type<scalar_t>;
        cpu_binary<scalar_t, scalar_t>(kSwiglu, gate, up, out, [](scalar_t g, scalar_t u) {
          const opmath x = static_cast<opmath>(g);
          return static_cast<scalar_t>(x * sigmoid(x) * static_cast<opmath>(u));
        });
      });
  return out;
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_meta(const at::Tensor& grad,
                                                        const at::Tensor& gate,
                                                        const at::Tensor& up) {
  check_like(kSwigluBackward, "gate", gate, "up", up);
  check_like(kSwigluBackward, "gate", gate, "grad", grad);
  return {new_output(gate.sym_sizes(), gate.options()), new_output(up.sym_sizes(), up.options())};
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_cpu(const at::Tensor& grad,
                                                       const at::Tensor& gate,
                                                       const at::Tensor& up) {
  auto [d_gate, d_up] = swiglu_backward_meta(grad, gate, up);
  if (gate.numel() == 0) return {d_gate, d_up};
  at::AutoDispatchBelowADInplaceOrView guard;
  if (!reduced_float(gate)) {
    swiglu_backward_chain(grad, gate, up, d_gate, d_up);
    return {d_gate, d_up};
  }
  const at::Tensor g = flat(grad), x = flat(gate), u = flat(up);
  if (gate.scalar_type() == at::kBFloat16) {
    const c10::BFloat16 *pg = g.const_data_ptr<c10::BFloat16>(),
                        *pu = u.const_data_ptr<c10::BFloat16>();
    c10::BFloat16 *pdg = d_gate.mutable_data_ptr<c10::BFloat16>(),
                  *pdu = d_up.mutable_data_ptr<c10::BFloat16>();
    float_chunks<2>(x.numel(), [&](int64_t lo, int64_t len, std::array<at::Tensor, 2>& f) {
      at::Tensor &xf = f[0], &sf = f[1];
      xf.copy_(x.narrow(0, lo, len));
      at::sigmoid_out(sf, xf);
      swiglu_backward_round(pg + lo, xf.const_data_ptr<float>(), sf.const_data_ptr<float>(),
                            pu + lo, pdg + lo, pdu + lo, len);
    });
    return {d_gate, d_up};
  }
  const at::Tensor dg = d_gate.view({-1}), du = d_up.view({-1});
  float_chunks<4>(x.numel(), [&](int64_t lo, int64_t len, std::array<at::Tensor, 4>& f) {
    at::Tensor &gf = f[0], &xf = f[1], &uf = f[2], &tf = f[3];
    gf.copy_(g.narrow(0, lo, len));
    xf.copy_(x.narrow(0, lo, len));
    uf.copy_(u.narrow(0, lo, len));
    swiglu_backward_chain(gf, xf, uf, uf, tf);  // d_gate into uf (read before written)
    dg.narrow(0, lo, len).copy_(uf);
    du.narrow(0, lo, len).copy_(tf);
  });
  return {d_gate, d_up};
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_cpu_reference(const at::Tensor& grad,
                                                                 const at::Tensor& gate,
                                                                 const at::Tensor& up) {
  auto [d_gate, d_up] = swiglu_backward_meta(grad, gate, up);
  check_cpu_reference(kSwigluBackward, gate);
  const at::Tensor g = grad.contiguous(), x = gate.contiguous(), u = up.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, x.scalar_type(), "gemmt_swiglu_bwd", [&] {
        using opmath = at::opmath_type<scalar_t>;
        const scalar_t *pg = g.const_data_ptr<scalar_t>(), *px = x.const_data_ptr<scalar_t>(),
                       *pu = u.const_data_ptr<scalar_t>();
        scalar_t *dg = d_gate.mutable_data_ptr<scalar_t>(), *du = d_up.mutable_data_ptr<scalar_t>();
        at::parallel_for(0, x.numel(), kCpuGrain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const opmath gi = pg[i], xi = px[i], ui = pu[i], s = sigmoid(xi);
            dg[i] = static_cast<scalar_t>(gi * ui * s * (opmath(1) + xi * (opmath(1) - s)));
            du[i] = static_cast<scalar_t>(gi * xi * s);
          }
        });
      });
  return {d_gate, d_up};
}

#ifdef GEMMT_WITH_CUDA
at::Tensor swiglu_cuda(const at::Tensor& gate, const at::Tensor& up) {
  at::Tensor out = swiglu_meta(gate, up);
  if (out.numel() == 0) return out;
  const at::cuda::CUDAGuard guard(gate.device());
  CudaInput ig(kSwiglu, "gate", gate), iu(kSwiglu, "up", up);
  check_launch(kSwiglu, swiglu_run(to_kernel_dtype(gate.scalar_type()), out.numel(), ig.ptr,
                                   ig.layout_or_null(), iu.ptr, iu.layout_or_null(), out.data_ptr(),
                                   stream_for(gate)));
  return out;
}

namespace {

// The row stride of t seen as rows x cols (its last dimension dense, the others collapsing
// into one row index), or nullopt when t is not such a view.
std::optional<int64_t> row_stride(const at::Tensor& t) {
  const int64_t n = t.dim();
  if (n == 0) return 1;
  const int64_t cols = t.size(n - 1);
  if (cols > 1 && t.stride(n - 1) != 1) return std::nullopt;
  if (n == 1) return cols;
  const int64_t ld = t.size(n - 2) == 1 ? cols : t.stride(n - 2);
  int64_t expected = ld * t.size(n - 2);
  for (int64_t d = n - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) != expected) return std::nullopt;
    expected *= t.size(d);
  }
  return ld;
}

// t itself when it is a row view, else a contiguous copy; *ld its row stride.
at::Tensor as_rows(const at::Tensor& t, int64_t* ld) {
  if (const std::optional<int64_t> s = row_stride(t)) {
    *ld = *s;
    return t;
  }
  at::Tensor c = t.contiguous();
  *ld = c.dim() == 0 ? 1 : c.size(-1);
  return c;
}

}  // namespace

void swiglu_backward_cuda_into(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                               at::Tensor& d_gate, at::Tensor& d_up) {
  if (gate.numel() == 0) return;
  const at::cuda::CUDAGuard guard(gate.device());
  SwigluBackwardRows r;
  r.cols = gate.dim() == 0 ? 1 : gate.size(-1);
  r.rows = gate.numel() / r.cols;
  // Inputs that are not row views are read from contiguous copies (kept alive to the launch).
  const at::Tensor g = as_rows(grad, &r.ld_grad), x = as_rows(gate, &r.ld_gate),
                   u = as_rows(up, &r.ld_up);
  const std::optional<int64_t> ld_dg = row_stride(d_gate), ld_du = row_stride(d_up);
  TORCH_CHECK(ld_dg.has_value() && ld_du.has_value(), kSwigluBackward,
              ": the outputs must be row views (a dense last dimension), got d_gate ",
              describe(d_gate), " and d_up ", describe(d_up));
  r.grad = g.const_data_ptr(), r.gate = x.const_data_ptr(), r.up = u.const_data_ptr();
  r.d_gate = d_gate.data_ptr(), r.d_up = d_up.data_ptr();
  r.ld_d_gate = *ld_dg, r.ld_d_up = *ld_du;
  check_launch(kSwigluBackward,
               swiglu_backward_run(to_kernel_dtype(gate.scalar_type()), r, stream_for(gate)));
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_cuda(const at::Tensor& grad,
                                                        const at::Tensor& gate,
                                                        const at::Tensor& up) {
  auto [d_gate, d_up] = swiglu_backward_meta(grad, gate, up);
  swiglu_backward_cuda_into(grad, gate, up, d_gate, d_up);
  return {d_gate, d_up};
}
#endif

}  // namespace gemmt::wrapper
