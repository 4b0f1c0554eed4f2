// rgb_to_gray (uint8 [..., H, W, 3] -> uint8 [..., H, W]) and normalize_volume
// (uint8/uint16 of any rank -> float32 vol / max_val).
#include <cmath>

#include "common.h"
#include "cpu_loops.h"
#include "ops.h"

#ifdef GEMMT_WITH_CUDA
#include "gemmt/elementwise.h"
#endif

namespace gemmt::wrapper {
namespace {

constexpr const char* kRgbToGray = "gemmt::rgb_to_gray";
constexpr const char* kNormalizeVolume = "gemmt::normalize_volume";

// Integer luma with halves rounded up: exact, and identical on CPU and CUDA.
inline uint8_t luma(uint32_t r, uint32_t g, uint32_t b) {
  return static_cast<uint8_t>((299u * r + 587u * g + 114u * b + 500u) / 1000u);
}

// A dense image's pixels in one flat loop, the channel order fixed at compile time so that the
// compiler can vectorise the three-way deinterleave.
template <bool kBgr>
void rgb_to_gray_dense(const uint8_t* src, uint8_t* dst, int64_t pixels) {
  at::parallel_for(0, pixels, kCpuGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* px = src + 3 * i;
      dst[i] = kBgr ? luma(px[2], px[1], px[0]) : luma(px[0], px[1], px[2]);
    }
  });
}

}  // namespace

at::Tensor rgb_to_gray_meta(const at::Tensor& img, bool /*bgr*/) {
  check_dtype(kRgbToGray, "img", img, {at::kByte});
  TORCH_CHECK(img.dim() >= 3, kRgbToGray,
              ": argument 'img' expected a tensor of shape [..., H, W, 3] (at least 3-D), got ",
              describe(img));
  TORCH_CHECK(img.sym_size(-1) == 3, kRgbToGray,
              ": argument 'img' expected the last dimension to be 3 (channels), got ",
              describe(img));
  auto sizes = img.sym_sizes();
  return new_output(sizes.slice(0, sizes.size() - 1), img.options());
}

// An integer loop over pixels (ATen has no kernel for this formula; torch's equivalent makes
// several float passes). A dense image runs flat; any other layout takes the reference loop,
// which walks a strided view of channel 0 through a cursor (0.85-0.87x torch on a dense
// 480 x 270 image, 2 threads, before the flat loop).
at::Tensor rgb_to_gray_cpu(const at::Tensor& img, bool bgr) {
  check_cpu_reference(kRgbToGray, img);
  if (!img.is_contiguous()) return rgb_to_gray_cpu_reference(img, bgr);
  at::Tensor out = rgb_to_gray_meta(img, bgr);
  const uint8_t* src = img.const_data_ptr<uint8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  if (bgr) {
    rgb_to_gray_dense<true>(src, dst, out.numel());
  } else {
    rgb_to_gray_dense<false>(src, dst, out.numel());
  }
  return out;
}

at::Tensor rgb_to_gray_cpu_reference(const at::Tensor& img, bool bgr) {
  at::Tensor out = rgb_to_gray_meta(img, bgr);
  check_cpu_reference(kRgbToGray, img);
  // Iterate over pixels through the view of channel 0; the channel stride steps to G and B.
  const at::Tensor pixels = img.select(-1, 0);
  const int64_t cs = img.stride(-1);
  const int64_t r = bgr ? 2 * cs : 0, b = bgr ? 0 : 2 * cs;
  cpu_unary<uint8_t, uint8_t>(kRgbToGray, pixels, out, [&](const uint8_t& p) {
    const uint8_t* px = &p;
    return luma(px[r], px[cs], px[b]);
  });
  return out;
}

at::Tensor normalize_volume_meta(const at::Tensor& vol, double max_val) {
  check_dtype(kNormalizeVolume, "vol", vol, {at::kUInt16, at::kByte});
  TORCH_CHECK(max_val > 0.0, kNormalizeVolume,
              ": argument 'max_val' expected a positive number, got ", max_val);
  return new_output(vol.sym_sizes(), vol.options().dtype(at::kFloat));
}

// ATen's kernels in place: the conversion into the float32 output, then its division by
// float32(max_val), correctly rounded as in the reference loop. The loop, one pass but built for
// the baseline instruction set, divides four floats at a time; ATen's kernels dispatch to the
// CPU's widest (AVX-512 here): 0.30 -> 0.15 ms on 2M elements, 112 -> 75 ms on 64M (2 threads;
// torch's vol.float() / max_val 0.16 and 142 ms, its two passes into a new tensor each).
at::Tensor normalize_volume_cpu(const at::Tensor& vol, double max_val) {
  at::Tensor out = normalize_volume_meta(vol, max_val);
  check_cpu_reference(kNormalizeVolume, vol);
  out.copy_(vol);
  out.div_(at::Scalar(static_cast<float>(max_val)));
  return out;
}

at::Tensor normalize_volume_cpu_reference(const at::Tensor& vol, double max_val) {
  at::Tensor out = normalize_volume_meta(vol, max_val);
  check_cpu_reference(kNormalizeVolume, vol);
  const float m = static_cast<float>(max_val);
  if (vol.scalar_type() == at::kByte) {
    cpu_unary<uint8_t, float>(kNormalizeVolume, vol, out,
                              [m](uint8_t v) { return static_cast<float>(v) / m; });
  } else {
    cpu_unary<uint16_t, float>(kNormalizeVolume, vol, out,
                               [m](uint16_t v) { return static_cast<float>(v) / m; });
  }
  return out;
}

#ifdef GEMMT_WITH_CUDA
at::Tensor rgb_to_gray_cuda(const at::Tensor& img, bool bgr) {
  at::Tensor out = rgb_to_gray_meta(img, bgr);
  if (out.numel() == 0) return out;
  const at::cuda::CUDAGuard guard(img.device());
  CudaInput in(kRgbToGray, "img", img);
  check_launch(kRgbToGray, rgb_to_gray_run(out.numel(), static_cast<const uint8_t*>(in.ptr),
                                           in.layout_or_null(), bgr,
                                           out.mutable_data_ptr<uint8_t>(), stream_for(img)));
  return out;
}

at::Tensor normalize_volume_cuda(const at::Tensor& vol, double max_val) {
  at::Tensor out = normalize_volume_meta(vol, max_val);
  if (out.numel() == 0) return out;
  const at::cuda::CUDAGuard guard(vol.device());
  CudaInput in(kNormalizeVolume, "vol", vol);
  check_launch(kNormalizeVolume,
               normalize_volume_run(to_kernel_dtype(vol.scalar_type()), out.numel(), in.ptr,
                                    in.layout_or_null(), static_cast<float>(max_val),
                                    out.mutable_data_ptr<float>(), stream_for(vol)));
  return out;
}
#endif

}  // namespace gemmt::wrapper
