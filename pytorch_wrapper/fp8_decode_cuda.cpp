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

// The most tokens the decode kernel takes. It widens each float8 element to fp16 for
// mma.sync, so its work grows with the tokens while the weight's bytes do not: on an H200 it
// streams W at 1.10-1.24x gemmt's bf16 decode for 1-4 tokens, 0.82-0.84x at 16, and falls
// behind the Hopper scaled GEMM (wgmma on float8, 0.62-0.88x bf16) from 32 tokens on. Block
// scales stay on it up to 64 tokens: it takes every pairing torch accepts, the Hopper path
// one. GEMMT_FP8_DECODE=off never takes it, =always takes it up to 64 tokens (A/B timing).
int64_t decode_max_tokens(const Fp8Scaling& scaling) {
  // Read on every call (a few hundred nanoseconds against a product's microseconds), so
  // that one process can time both paths.
  const char* env = std::getenv("GEMMT_FP8_DECODE");
  const std::string_view mode = env == nullptr ? std::string_view() : std::string_view(env);
  if (mode == "off") return 0;
  if (mode == "always" || scaling.kind == 2) return 64;
  TORCH_CHECK(mode.empty() || mode == "auto",
              "gemmt::scaled_mm: GEMMT_FP8_DECODE expected auto, off or always, got '", mode, "'");
  return 16;
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
  if (m < 1 || m > decode_max_tokens(scaling) || n < 1 || k < kAlign) return std::nullopt;
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
  if (!fp8_decode_supported(x)) return std::nullopt;

  at::Tensor out = at::empty({m, n}, a.options().dtype(out_dtype));
  x.c = out.data_ptr();
  check_launch(op, fp8_decode_run(x, stream_for(a)));
  return out;
}

}  // namespace gemmt::wrapper
#endif  // GEMMT_WITH_CUDA
