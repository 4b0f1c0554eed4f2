// The tensors of a decode-sized gemmt::scaled_mm as the FP8 decode kernel takes them: the
// weight read where it lies (no copy: a copy would cost as much as the product), the few
// token rows made contiguous when they are not, the scales through their strides.
#include "fp8_decode_cuda.h"

#ifdef GEMMT_WITH_CUDA
#include <cstdlib>
#include <string_view>

#include "common.h"
#include "gemmt/fp8_decode.h"

namespace gemmt::wrapper {
namespace {

// Which decode kernel takes a product, from GEMMT_FP8_DECODE (read on every call, a few
// hundred nanoseconds against a product's microseconds, so that one process can time every
// path):
//   auto (default)  the mma.sync kernel (fp8_decode_*, W widened to fp16 in registers, float32
//                   sums): tensorwise / rowwise scales up to 16 tokens, block scales up to 64
//                   (it takes every pairing torch accepts, the Hopper GEMM one); more tokens go
//                   to the Hopper scaled GEMM. On an H200 it streams W at 1.10-1.24x gemmt's
//                   bf16 decode for 1-4 tokens and 0.82-0.84x at 16, and falls behind the
//                   Hopper scaled GEMM from 32 tokens on.
//   wgmma           tensorwise / rowwise scales, 1-64 tokens, on sm_90: the Hopper kernel
//                   (fp8_decode_wgmma_*: float8 wgmma on W as it is, no conversion; 1.31-1.33x
//                   the bf16 decode, median). Opt-in: its sums are the tensor cores' float8
//                   sums (1e-5 to 5e-5 relative error with float32 output, 12-23x the
//                   float32-grade bound tests/test_fp8_decode.py holds the kernels to). Where it
//                   cannot run, as auto.
//   wgmma16         the same products on the Hopper kernel's fp16 path (fp8_decode_wgmma_f16_run:
//                   W widened into wgmma's register operand, the tokens into an fp16 tile, fp16
//                   wgmma with float32 sums): float32-grade like the mma.sync kernel, with the
//                   Hopper kernel's TMA ring and split K. Where it cannot run, as auto.
//   mma (always)    the mma.sync kernel up to 64 tokens in every scaling.
//   off             neither decode kernel.
enum class DecodeRoute { kAuto, kWgmma, kWgmma16, kMma, kOff };

DecodeRoute decode_route() {
  const char* env = std::getenv("GEMMT_FP8_DECODE");
  const std::string_view mode = env == nullptr ? std::string_view() : std::string_view(env);
  if (mode.empty() || mode == "auto") return DecodeRoute::kAuto;
  if (mode == "wgmma") return DecodeRoute::kWgmma;
  if (mode == "wgmma16") return DecodeRoute::kWgmma16;
  if (mode == "mma" || mode == "always") return DecodeRoute::kMma;
  if (mode == "off") return DecodeRoute::kOff;
  TORCH_CHECK(
      false,
      "gemmt::scaled_mm: GEMMT_FP8_DECODE expected auto, wgmma, mma, always, off or wgmma16, "
      "got '",
      mode, "'");
  return DecodeRoute::kOff;
}

}  // namespace

std::optional<at::Tensor> scaled_mm_decode_cuda(const char* op, const at::Tensor& a_in,
                                                const at::Tensor& b, const at::Tensor& sa,
                                                const at::Tensor& sb,
                                                const std::optional<at::Tensor>& bias,
                                                at::ScalarType out_dtype, Activation act,
                                                const Fp8Scaling& scaling) {
  const int64_t m = a_in.size(0), k = a_in.size(1), n = b.size(1);
  constexpr int64_t kAlign = 16;
  constexpr int64_t kMaxTokens = 64;
  const DecodeRoute route = decode_route();
  if (route == DecodeRoute::kOff) return std::nullopt;
  if (m < 1 || m > kMaxTokens || n < 1 || k < kAlign) return std::nullopt;
  const bool block = scaling.kind == 2;
  // The mma.sync kernel's reach when the Hopper kernel does not take the product.
  const int64_t mma_max = route == DecodeRoute::kMma || block ? kMaxTokens : 16;
  // The weight must already be K-major with aligned rows (b = W.t(), W contiguous).
  if (b.stride(0) != 1 || (n > 1 && b.stride(1) % kAlign != 0)) return std::nullopt;
  // The tokens are small: made contiguous when their rows are not aligned K-major ones.
  const bool a_ok = a_in.stride(1) == 1 && (m == 1 || a_in.stride(0) % kAlign == 0) &&
                    reinterpret_cast<uintptr_t>(a_in.const_data_ptr()) % kAlign == 0;
  const at::Tensor a = a_ok ? a_in : a_in.contiguous();

  Fp8DecodeArgs x;
  x.a_e5m2 = a.scalar_type() == at::kFloat8_e5m2;
  x.b_e5m2 = b.scalar_type() == at::kFloat8_e5m2;
  x.m = m, x.n = n, x.k = k;
  x.a = a.const_data_ptr();
  x.lda = m > 1 ? a.stride(0) : k;
  x.w = b.const_data_ptr();
  x.ldw = n > 1 ? b.stride(1) : k;
  x.ldc = n;
  x.out = to_kernel_dtype(out_dtype);
  x.sa = sa.const_data_ptr<float>();
  x.sb = sb.const_data_ptr<float>();
  if (scaling.kind == 2) {
    x.scale = Fp8DecodeScale::kBlock;
    x.sa_s0 = sa.stride(0), x.sa_s1 = sa.stride(1);
    x.sb_s0 = sb.stride(0), x.sb_s1 = sb.stride(1);
    x.a_shift = scaling.a_square_blocks ? 7 : 0;
    x.b_shift = scaling.b_square_blocks ? 7 : 0;
  } else if (scaling.kind == 1) {
    x.sa_s0 = sa.stride(0);
    x.sb_s1 = sb.stride(1);
  }
  if (bias.has_value() && bias->defined()) {
    x.bias = bias->const_data_ptr();
    x.bias_dtype = to_kernel_dtype(bias->scalar_type());
    x.bias_stride = bias->stride(0);
  }
  x.act = act;
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(a.get_device());
  x.cc_major = prop->major;
  x.sm_count = usable_sm_count(op);
  const bool hopper = route == DecodeRoute::kWgmma || route == DecodeRoute::kWgmma16;
  const bool wgmma = hopper && !block && fp8_decode_wgmma_supported(x);
  if (!wgmma && (m > mma_max || !fp8_decode_supported(x))) return std::nullopt;

  at::Tensor out = at::empty({m, n}, a.options().dtype(out_dtype));
  x.c = out.data_ptr();
  const cudaStream_t stream = stream_for(a);
  if (!wgmma) {
    check_launch(op, fp8_decode_run(x, stream));
  } else if (route == DecodeRoute::kWgmma16) {
    check_launch(op, fp8_decode_wgmma_f16_run(x, stream));
  } else {
    check_launch(op, fp8_decode_wgmma_run(x, stream));
  }
  return out;
}

}  // namespace gemmt::wrapper
#endif  // GEMMT_WITH_CUDA
