// The tensors of a decode-sized gemmt::scaled_mm as the FP8 decode kernels take them: a
// K-major weight read where it lies (a copy would cost as much as the product; another
// layout is copied at each call), the few token rows made contiguous when they are not, the scales
// through their strides.
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
//   auto (default)  on compute capability 9.0, tensorwise / rowwise scales, 1-32 tokens: the
//                   Hopper kernel (fp8_decode_wgmma_*: a TMA ring and split K, W widened into
//                   fp16 wgmma's register operand, float32 sums; 1.36-1.65x gemmt's bf16
//                   decode, medians by token count, on an H200). Otherwise the mma.sync kernel
//                   (fp8_decode_*, W widened to fp16 in registers, float32 sums; every pairing
//                   torch accepts): block scales up to 64 tokens, tensorwise / rowwise up to 16
//                   (it falls behind the Hopper scaled GEMM from 32 tokens on). More tokens go
//                   to the Hopper scaled GEMM.
//   wgmma           the Hopper kernel wherever it can run, else the mma.sync kernel up to 64
//                   tokens (both float32-grade).
//   mma (always)    the mma.sync kernel up to 64 tokens in every scaling.
//   off             neither decode kernel.
// With use_fast_accum on compute capability 9.0, tensorwise / rowwise products of 1-16 tokens
// take the Hopper kernel's float8 form (float8 wgmma on the stages as they landed; auto and
// wgmma), and auto sends 17-64 tokens to the Hopper scaled GEMM, which ran them faster than
// either form of the decode kernel (H200, weights of 16-235 MB). GEMMT_FP8_DECODE_FAST=0 routes
// such products as without use_fast_accum, for A/B runs.
enum class DecodeRoute { kAuto, kWgmma, kMma, kOff };

// A 0 / 1 setting, read on every call; unset or empty: fallback.
bool decode_flag(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  const std::string_view v(env);
  TORCH_CHECK(v == "0" || v == "1", "gemmt::scaled_mm: ", name, " expected 0 or 1, got '", v, "'");
  return v == "1";
}

// GEMMT_FP8_DECODE_SPLIT=1..8 fixes the Hopper kernel's CTAs along K (read on every call, so
// that one process can time each split); unset or 0: its planner's.
int decode_split() {
  const char* env = std::getenv("GEMMT_FP8_DECODE_SPLIT");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  TORCH_CHECK(*end == '\0' && v >= 0 && v <= 8,
              "gemmt::scaled_mm: GEMMT_FP8_DECODE_SPLIT expected an integer from 0 to 8, got '",
              env, "'");
  return static_cast<int>(v);
}

DecodeRoute decode_route() {
  const char* env = std::getenv("GEMMT_FP8_DECODE");
  const std::string_view mode = env == nullptr ? std::string_view() : std::string_view(env);
  if (mode.empty() || mode == "auto") return DecodeRoute::kAuto;
  if (mode == "wgmma") return DecodeRoute::kWgmma;
  if (mode == "mma" || mode == "always") return DecodeRoute::kMma;
  if (mode == "off") return DecodeRoute::kOff;
  TORCH_CHECK(false,
              "gemmt::scaled_mm: GEMMT_FP8_DECODE expected auto, wgmma, mma, always or off, got '",
              mode, "'");
  return DecodeRoute::kOff;
}

}  // namespace

std::optional<at::Tensor> scaled_mm_decode_cuda(const char* op, const at::Tensor& a_in,
                                                const at::Tensor& b_in, const at::Tensor& sa,
                                                const at::Tensor& sb,
                                                const std::optional<at::Tensor>& bias,
                                                at::ScalarType out_dtype, Activation act,
                                                const Fp8Scaling& scaling, bool fast_accum) {
  const int64_t m = a_in.size(0), k = a_in.size(1), n = b_in.size(1);
  constexpr int64_t kAlign = 16;
  constexpr int64_t kMaxTokens = 64;
  const DecodeRoute route = decode_route();
  if (route == DecodeRoute::kOff) return std::nullopt;
  if (m < 1 || m > kMaxTokens || n < 1 || k < kAlign) return std::nullopt;
  const bool block = scaling.kind == 2;
  const bool hopper = route == DecodeRoute::kWgmma || route == DecodeRoute::kAuto;
  const int cc_major = at::cuda::getDeviceProperties(a_in.get_device())->major;
  constexpr int64_t kFastFormTokens = 16;
  const bool fast_form =
      hopper && fast_accum && !block && cc_major == 9 && decode_flag("GEMMT_FP8_DECODE_FAST", true);
  if (fast_form && m > kFastFormTokens && route == DecodeRoute::kAuto) return std::nullopt;
  // The mma.sync kernel's reach when the Hopper kernel does not take the product.
  const int64_t mma_max =
      route == DecodeRoute::kMma || route == DecodeRoute::kWgmma || block ? kMaxTokens : 16;
  // The weight K-major with aligned rows (b = W.t(), W contiguous) is read where it lies.
  // Another layout is copied into that one first: the Hopper scaled GEMM would copy it too,
  // and then run 128-row tiles for a few tokens.
  const bool b_ok = b_in.stride(0) == 1 && (n == 1 || b_in.stride(1) % kAlign == 0) &&
                    reinterpret_cast<uintptr_t>(b_in.const_data_ptr()) % kAlign == 0;
  const at::Tensor b = b_ok ? b_in : b_in.t().contiguous().t();
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
  x.cc_major = cc_major;
  x.sm_count = usable_sm_count(op);
  x.k_split = decode_split();
  x.fast_accum = fast_form && m <= kFastFormTokens;
  const bool wgmma = hopper && !block && fp8_decode_wgmma_supported(x);
  if (!wgmma && (m > mma_max || !fp8_decode_supported(x))) return std::nullopt;

  at::Tensor out = at::empty({m, n}, a.options().dtype(out_dtype));
  x.c = out.data_ptr();
  const cudaStream_t stream = stream_for(a);
  check_launch(op, wgmma ? fp8_decode_wgmma_run(x, stream) : fp8_decode_run(x, stream));
  return out;
}

}  // namespace gemmt::wrapper
#endif  // GEMMT_WITH_CUDA
