// Image and volume preprocessing: rgb_to_gray (packed 8-bit RGB/BGR -> 8-bit luma) and
// normalize_volume (uint8 / uint16 -> float32 in [0, 1]).
#include <cstdint>

#include <cuda_runtime.h>

#include "common/elementwise_engine.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/elementwise.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "gemmt/strided_index.cuh"
#include "gemmt/vector_access.cuh"

namespace gemmt {
namespace {

// ---- rgb_to_gray -------------------------------------------------------------------------

constexpr int kWarp = 32;
constexpr int kRgbBlock = 256;
constexpr int kRgbWarpsPerBlock = kRgbBlock / kWarp;
// One 16-byte store of luma per thread, from three 16-byte loads of pixels.
constexpr int kPixelsPerGroup = 16;
constexpr int kVecsPerGroup = 3 * kPixelsPerGroup / kVectorBytes;
constexpr int kRgbStridedPixelsPerThread = 4;

// Channel weights. bgr swaps the weights of bytes 0 and 2 of a pixel instead of the
// channels, so one kernel serves both orders.
struct LumaWeights {
  std::uint32_t first;  // weight of byte 0 of a pixel (299 for RGB, 114 for BGR)
  std::uint32_t last;   // weight of byte 2
  // The same weights as pairs of 16-bit lanes for dp2a (low lane first).
  std::uint32_t first_green;  // (first, 587)
  std::uint32_t last_zero;    // (last, 0)
  std::uint32_t zero_first;   // (0, first)
  std::uint32_t green_last;   // (587, last)
};

constexpr std::uint32_t kGreenWeight = 587;
constexpr std::uint32_t kRoundingBias = 500;

LumaWeights make_luma_weights(bool bgr) {
  LumaWeights w;
  w.first = bgr ? 114u : 299u;
  w.last = bgr ? 299u : 114u;
  w.first_green = w.first | (kGreenWeight << 16);
  w.last_zero = w.last;
  w.zero_first = w.first << 16;
  w.green_last = kGreenWeight | (w.last << 16);
  return w;
}

// floor(num / 1000) for num <= 1000 * 255 + 500 = 255500, as one multiply-high.
// m = ceil(2^32 / 1000) = 4294968 exceeds 2^32 / 1000 by 0.704, so num * m / 2^32 exceeds
// num / 1000 by num * 0.704 / 2^32 <= 4.2e-5. The fractional part of num / 1000 is at most
// 0.999, so the excess never carries it to the next integer and the floor is exact.
__device__ __forceinline__ std::uint32_t div1000(std::uint32_t num) {
  return __umulhi(num, 4294968u);
}

__device__ __forceinline__ std::uint32_t luma(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                              const LumaWeights& w) {
  return div1000(w.first * c0 + kGreenWeight * c1 + w.last * c2 + kRoundingBias);
}

// Luma of the 4 pixels packed in 12 bytes, as the 4 bytes of one word. The bytes are
//   w0 = [p0.0 p0.1 p0.2 p1.0]  w1 = [p1.1 p1.2 p2.0 p2.1]  w2 = [p2.2 p3.0 p3.1 p3.2]
// and dp2a (two 16-bit weights times the low or high byte pair of a word, plus an
// accumulator) covers any pixel with two instructions whatever its alignment, instead of
// three byte extractions and three multiply-adds.
__device__ __forceinline__ std::uint32_t luma4(std::uint32_t w0, std::uint32_t w1, std::uint32_t w2,
                                               const LumaWeights& w) {
  const std::uint32_t bias = kRoundingBias;
  const std::uint32_t p0 = __dp2a_lo(w.first_green, w0, __dp2a_hi(w.last_zero, w0, bias));
  const std::uint32_t p1 = __dp2a_hi(w.zero_first, w0, __dp2a_lo(w.green_last, w1, bias));
  const std::uint32_t p2 = __dp2a_hi(w.first_green, w1, __dp2a_lo(w.last_zero, w2, bias));
  const std::uint32_t p3 = __dp2a_hi(w.green_last, w2, __dp2a_lo(w.zero_first, w2, bias));
  const std::uint32_t lo = __byte_perm(div1000(p0), div1000(p1), 0x0040);
  const std::uint32_t hi = __byte_perm(div1000(p2), div1000(p3), 0x0040);
  return __byte_perm(lo, hi, 0x5410);
}

// Each thread converts a group of 16 pixels (48 bytes in, 16 out). Loading its own 48 bytes
// directly would make every warp-wide 16-byte load touch 32 sectors half-used (a 48-byte
// stride), doubling L1/L2 requests. Instead the warp loads its 1536-byte span with three
// fully coalesced 16-byte loads per lane, and the lanes swap through shared memory: lane l
// then reads 16-byte vectors 3l..3l+2 of the span, a 48-byte stride that maps the 8 lanes
// of each 128-byte shared-memory phase to disjoint banks.
__global__ void __launch_bounds__(kRgbBlock)
    rgb_to_gray_vector_kernel(const std::uint8_t* __restrict__ in, std::uint8_t* __restrict__ out,
                              std::int64_t pixels, LumaWeights w) {
  __shared__ uint4 stage[kRgbWarpsPerBlock][kVecsPerGroup * kWarp];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const std::int64_t groups = pixels / kPixelsPerGroup;
  const std::int64_t in_vecs = groups * kVecsPerGroup;
  const uint4* in_vec = reinterpret_cast<const uint4*>(in);
  uint4* out_vec = reinterpret_cast<uint4*>(out);
  uint4* my_stage = stage[warp];

  const std::int64_t grid_groups = static_cast<std::int64_t>(gridDim.x) * kRgbBlock;
  // Warp-uniform loop (g0 is the warp's first group), so __syncwarp() is reached by all lanes.
#pragma unroll 1
  for (std::int64_t g0 = (static_cast<std::int64_t>(blockIdx.x) * kRgbWarpsPerBlock + warp) * kWarp;
       g0 < groups; g0 += grid_groups) {
    uint4 v[kVecsPerGroup];
#pragma unroll
    for (int k = 0; k < kVecsPerGroup; ++k) {
      const std::int64_t j = g0 * kVecsPerGroup + k * kWarp + lane;
      v[k] = j < in_vecs ? in_vec[j] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kVecsPerGroup; ++k) my_stage[k * kWarp + lane] = v[k];
    __syncwarp();

    const std::int64_t g = g0 + lane;
    if (g < groups) {
      const uint4 a = my_stage[kVecsPerGroup * lane];
      const uint4 b = my_stage[kVecsPerGroup * lane + 1];
      const uint4 c = my_stage[kVecsPerGroup * lane + 2];
      out_vec[g] = make_uint4(luma4(a.x, a.y, a.z, w), luma4(a.w, b.x, b.y, w),
                              luma4(b.z, b.w, c.x, w), luma4(c.y, c.z, c.w, w));
    }
    // The next iteration overwrites the staging area the other lanes may still be reading.
    __syncwarp();
  }

  // Fewer than 16 pixels remain past the last whole group; the grid's first threads finish
  // them.
  const std::int64_t tail_begin = groups * kPixelsPerGroup;
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kRgbBlock + threadIdx.x;
  if (t < pixels - tail_begin) {
    const std::int64_t p = tail_begin + t;
    out[p] = static_cast<std::uint8_t>(luma(in[3 * p], in[3 * p + 1], in[3 * p + 2], w));
  }
}

// Channel c of pixel p is element 3p + c of the layout. When the innermost dimension's size
// is a multiple of 3 (always, for a [..., 3] layout whose coalescing only merged the channel
// dimension with others), a pixel never straddles a row of it, so the other two channels
// sit at +channel_stride and +2 * channel_stride and one index computation per pixel is
// enough. Otherwise every channel's offset is computed.
__global__ void __launch_bounds__(kRgbBlock)
    rgb_to_gray_strided_kernel(StridedPtr<std::uint8_t> in, bool channels_in_row,
                               std::int64_t channel_stride, std::uint8_t* __restrict__ out,
                               std::int64_t pixels, LumaWeights w) {
  constexpr int kU = kRgbStridedPixelsPerThread;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * (kRgbBlock * kU);
#pragma unroll 1
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * (kRgbBlock * kU) + threadIdx.x;
       base < pixels; base += stride) {
    std::uint32_t c[kU][3];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t p = base + u * kRgbBlock;
      if (p < pixels) {
        if (channels_in_row) {
          const std::uint8_t* px = in.ptr + strided_offset(3 * p, in.layout);
          c[u][0] = px[0];
          c[u][1] = px[channel_stride];
          c[u][2] = px[2 * channel_stride];
        } else {
#pragma unroll
          for (int ch = 0; ch < 3; ++ch) c[u][ch] = in[3 * p + ch];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t p = base + u * kRgbBlock;
      if (p < pixels) out[p] = static_cast<std::uint8_t>(luma(c[u][0], c[u][1], c[u][2], w));
    }
  }
}

// ---- normalize_volume --------------------------------------------------------------------

// Correctly rounded division, the same operation as `vol.float() / max_val`.
struct DivideOp {
  float divisor;
  __device__ __forceinline__ float operator()(float v) const { return div_rn(v, divisor); }
};

// The same correctly rounded quotient without div.rn's per-element range check and its
// out-of-line slow path (whose call forces register spills in an unrolled loop). With
// reciprocal = RN(1 / divisor), computed once on the host:
//   q0 = RN(v * reciprocal) is within 2 ulp of v / divisor;
//   one Newton step, q1 = RN(q0 + RN(v - divisor * q0) * reciprocal), is faithful (1 ulp);
//   and by Markstein's theorem, with a faithful q1, an exact remainder (FMA) and a
//   reciprocal within half an ulp, q2 = RN(q1 + (v - divisor * q1) * reciprocal) is
//   RN(v / divisor).
// The theorem needs no overflow or underflow anywhere, which holds for v in [0, 65535] and
// |divisor| in [2^-60, 2^60] (see divisor_allows_reciprocal); other divisors take DivideOp.
// tests/cuda/elementwise_selftest.cu compares every v against IEEE division for divisors
// inside and just outside that range.
struct ReciprocalDivideOp {
  float divisor;
  float reciprocal;
  __device__ __forceinline__ float operator()(float v) const {
    float q = mul_rn(v, reciprocal);
    float r = fma_rn(-divisor, q, v);
    q = fma_rn(r, reciprocal, q);
    r = fma_rn(-divisor, q, v);
    return fma_rn(r, reciprocal, q);
  }
};

inline bool divisor_allows_reciprocal(float divisor) {
  const float magnitude = divisor < 0.0f ? -divisor : divisor;
  // Also false for NaN, 0 and inf.
  return magnitude >= 0x1p-60f && magnitude <= 0x1p60f;
}

// 4 input elements per pack, so each output pack is one 16-byte float4 store and a warp's
// store covers 512 contiguous bytes. (A 16-byte input pack would expand to 32 or 64 bytes
// of output per lane, and each warp-wide store would then hit every sector half-filled.)
// Loads are 4 bytes (uint8) or 8 bytes (uint16) per pack and still fully coalesced. Reads
// are only 1/5 (uint8) or 1/3 (uint16) of the traffic, so 4 packs per thread (16-32 bytes
// of loads, 64 bytes of stores) cover the latency.
constexpr int kNormalizeElems = 4;
constexpr int kNormalizeUnroll = 4;

template <typename T>
cudaError_t normalize_typed(std::int64_t numel, const void* vol, const StridedLayout* layout,
                            float max_val, float* out, cudaStream_t stream) {
  if (divisor_allows_reciprocal(max_val)) {
    // IEEE single division on the host: the correctly rounded reciprocal the proof needs.
    const ReciprocalDivideOp op{max_val, 1.0f / max_val};
    return engine::launch<kNormalizeElems, kNormalizeUnroll, T, float>(op, numel, {vol}, {layout},
                                                                       out, stream);
  }
  // Only for divisors such as 0, inf, NaN or extreme magnitudes. div.rn's slow path is a
  // call, which spills registers across an unrolled body, so one pack per thread here.
  return engine::launch<kNormalizeElems, 1, T, float>(DivideOp{max_val}, numel, {vol}, {layout},
                                                      out, stream);
}

}  // namespace

cudaError_t rgb_to_gray_run(int64_t pixels, const uint8_t* in, const StridedLayout* in_layout,
                            bool bgr, uint8_t* out, cudaStream_t stream) {
  if (pixels < 0) return cudaErrorInvalidValue;
  if (pixels == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr || !layout_is_valid(in_layout)) {
    return cudaErrorInvalidValue;
  }
  const LumaWeights w = make_luma_weights(bgr);

  if (layout_is_contiguous(in_layout) && is_aligned<kVectorBytes>(in) &&
      is_aligned<kVectorBytes>(out)) {
    // One thread per 16-pixel group; at least one block for the < 16 tail pixels.
    const unsigned int grid = grid_1d(pixels / kPixelsPerGroup, kRgbBlock);
    rgb_to_gray_vector_kernel<<<grid, kRgbBlock, 0, stream>>>(in, out, pixels, w);
  } else {
    const StridedPtr<std::uint8_t> in_ptr = make_strided_ptr<std::uint8_t>(in, in_layout);
    bool channels_in_row = true;
    std::int64_t channel_stride = 1;
    if (in_ptr.layout.ndim > 0) {
      const int last = in_ptr.layout.ndim - 1;
      channels_in_row = in_ptr.layout.sizes[last] % 3 == 0;
      channel_stride = in_ptr.layout.strides[last];
    }
    const unsigned int grid = grid_1d(pixels, kRgbBlock * kRgbStridedPixelsPerThread);
    rgb_to_gray_strided_kernel<<<grid, kRgbBlock, 0, stream>>>(in_ptr, channels_in_row,
                                                               channel_stride, out, pixels, w);
  }
  GEMMT_RETURN_LAUNCH_ERROR();
}

cudaError_t normalize_volume_run(ScalarType dtype, int64_t numel, const void* vol,
                                 const StridedLayout* vol_layout, float max_val, float* out,
                                 cudaStream_t stream) {
  switch (dtype) {
    case ScalarType::kUInt8:
      return normalize_typed<std::uint8_t>(numel, vol, vol_layout, max_val, out, stream);
    case ScalarType::kUInt16:
      return normalize_typed<std::uint16_t>(numel, vol, vol_layout, max_val, out, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace gemmt
