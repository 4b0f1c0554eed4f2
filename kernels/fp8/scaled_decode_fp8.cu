// The FP8 decode product (include/gemmt/fp8_decode.h): a few float8 tokens against a float8
// weight, streamed as kernels/common/decode_core.cuh streams the 16-bit one. A slice is
// still 64 bytes of a W row, which are now 64 elements: a lane's 16 bytes hold 16 of them.
//
// The tensor-core step. sm_90 has no float8 mma.sync of its own: ptxas turns
// mma.sync.m16n8k32.e4m3 into conversions to fp16 and two m16n8k16 fp16 mmas, converting
// both fragments again for every mma. Here the conversion is explicit and done once per
// slice for W (shared by all token tiles) and once per tile for the tokens, then the fp16
// m16n8k16 mma runs four times per slice (k = 4 x 16). Both float8 formats widen to fp16
// exactly (e4m3fn: cvt on sm_89+; e5m2 is the high byte of an fp16), and an fp16 mma forms
// exact products, so nothing is rounded before the float32 accumulation. The four mmas of a
// slice (64 products per output) start from zero and their sum is then added to the
// float32 total (or, with block scales, multiplied by the slice's 128-block scales and
// added), so the accumulation is float32 whatever the tensor cores' own accumulator does
// over a long chain.
//
// The consistent permutation of K: each 32-bit word of a lane's 16 bytes widens to two fp16
// pairs (bytes 0-1, 2-3); mma j (0..3) takes word j of the W rows and of the token, so every
// W byte meets the token byte at the same K position.
//
// The epilogue: the row / column (or tensor) scales, the bias (its own dtype), the
// activation, then one rounding to C's dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/decode_core.cuh"
#include "fp8/decode_epilogue.cuh"
#include "gemmt/activation.h"
#include "gemmt/fp8_decode.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "plan/decode_plan.h"

namespace gemmt {
namespace {

using decode::DecodeCore;
using decode::DecodePlan;
using decode::WSlice;

constexpr int kBlockK = 128;  // K extent of one block scale
constexpr int kMaxTokens = decode::kMaxTokens;

struct Fp8Params {
  DecodeCore core;
  void* c;
  int64_t ldc;
  ScalarType out;
  const float* sa;
  int64_t sa_s0, sa_s1;
  int a_shift;
  const float* sb;
  int64_t sb_s0, sb_s1;
  int b_shift;
  const void* bias;
  ScalarType bias_dtype;
  int64_t bias_stride;
  Activation act;
};

template <bool kE5>
__device__ __forceinline__ void widen16(const uint4& v, uint32_t (&f)[8]) {
  fp8_decode::widen<kE5>(v.x, f[0], f[1]);
  fp8_decode::widen<kE5>(v.y, f[2], f[3]);
  fp8_decode::widen<kE5>(v.z, f[4], f[5]);
  fp8_decode::widen<kE5>(v.w, f[6], f[7]);
}

// kWE5 / kAE5: the weight's / the tokens' format is e5m2 (else e4m3fn). kBlock: per-128-K
// block scales applied in the loop (else the row / column scales in the epilogue).
template <bool kWE5, bool kAE5, bool kBlock>
struct Fp8Op {
  using Elem = uint8_t;
  using Params = Fp8Params;
  // Two CTAs per SM (<= 128 registers), with four slices in flight per warp up to 32 tokens.
  // 64 tokens' accumulators beside the widened W leave room for three slices (124
  // registers, no spills; two CTAs of three slices keep more of W in flight per SM than one
  // of four); with block scales they do not fit (ptxas spills), so those run one CTA per SM
  // with four. The plan is told the CTAs per SM (fp8_decode_run).
  static constexpr int min_blocks(int tiles) { return tiles >= 8 && kBlock ? 1 : 2; }
  static constexpr int in_flight(int tiles) {
    return tiles >= 8 && !kBlock ? 3 : decode::kInFlight;
  }

  template <int kTiles>
  __device__ __forceinline__ static void slice(const Params& p, const WSlice& w, int64_t kk,
                                               int row, int g, int q, float (&acc)[kTiles][4]) {
    uint32_t wl[8], wh[8];
    widen16<kWE5>(w.lo, wl);
    widen16<kWE5>(w.hi, wh);
    // The slice's 128-block scales of this lane's two W rows. A lane past K (k % 64 != 0)
    // holds zeros and reads no scale; kBlock needs k % 128 == 0, so none does there.
    const bool in_k = kk < p.core.k;
    const int64_t kb = kk / kBlockK;  // kk >= 0
    float sb_row[2] = {0.f, 0.f};
    if constexpr (kBlock) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row + 8 * h;
        if (in_k && r < p.core.n)
          sb_row[h] = __ldg(p.sb + kb * p.sb_s0 + (r >> p.b_shift) * p.sb_s1);
      }
    }
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      uint32_t x[8];
      widen16<kAE5>(decode::load_token<uint8_t>(p.core, 8 * t + g, kk), x);
      float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a[4] = {wl[2 * j], wh[2 * j], wl[2 * j + 1], wh[2 * j + 1]};
        decode::mma_16816(part, a, x[2 * j], x[2 * j + 1], static_cast<__half*>(nullptr));
      }
      if constexpr (kBlock) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int token = 8 * t + 2 * q + e;
          float sa = 0.f;
          if (in_k && token < p.core.m)
            sa = __ldg(p.sa + (token >> p.a_shift) * p.sa_s0 + kb * p.sa_s1);
          acc[t][e] = fmaf(part[e] * sb_row[0], sa, acc[t][e]);
          acc[t][2 + e] = fmaf(part[2 + e] * sb_row[1], sa, acc[t][2 + e]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] += part[i];
      }
    }
  }

  template <int kTiles>
  __device__ __forceinline__ static void store(const Params& p, const float (&acc)[kTiles][4],
                                               int row0, int g, int q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + g + 8 * h;
      if (row >= p.core.n) continue;
      const float sb = kBlock ? 1.f : __ldg(p.sb + (row >> p.b_shift) * p.sb_s1);
      const float bias =
          p.bias != nullptr ? fp8_decode::load_bias(p.bias, p.bias_dtype, p.bias_stride, row) : 0.f;
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int token = 8 * t + 2 * q + e;
          if (token >= p.core.m) continue;
          float v = acc[t][2 * h + e];
          if (!kBlock) v = v * __ldg(p.sa + (token >> p.a_shift) * p.sa_s0) * sb;
          v += bias;
          fp8_decode::store_out(p.c, p.out, p.ldc, token, row, apply_activation(p.act, v));
        }
      }
    }
  }
};

// ---- Host side ----------------------------------------------------------------------------

// Whether the code this device runs was generated for compute capability 8.9 or later (the
// float8 conversions): a build for 8.0 (with or without its PTX) has only the trap.
bool device_code_has_fp8() {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  int version = 0;
  const cudaError_t err = cached_per_device(cache, &version, [](int, int* value) {
    cudaFuncAttributes attr{};
    const cudaError_t e =
        cudaFuncGetAttributes(&attr, decode::decode_kernel<Fp8Op<false, false, false>, 1, 8>);
    *value = attr.ptxVersion;
    return e;
  });
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return version >= 89;
}

template <bool kWE5, bool kAE5>
cudaError_t launch_formats(const DecodePlan& pl, const Fp8Params& p, bool block,
                           cudaStream_t stream) {
  if (block) return decode::launch_planned<Fp8Op<kWE5, kAE5, true>>(pl, p, stream);
  return decode::launch_planned<Fp8Op<kWE5, kAE5, false>>(pl, p, stream);
}

}  // namespace

bool fp8_decode_supported(const Fp8DecodeArgs& x, const char** why) {
  using fp8_decode::refuse;
  if (!fp8_decode::common_args_supported(x, kMaxTokens, why)) return false;
  if (x.scale == Fp8DecodeScale::kBlock && x.k % kBlockK != 0) {
    return refuse(why, "block scales with k not a multiple of 128");
  }
  // Rows may overlap (a stride of 0 included): the operands are only read.
  if ((x.m > 1 && (x.lda % 16 != 0 || x.lda < 0)) || (x.n > 1 && (x.ldw % 16 != 0 || x.ldw < 0))) {
    return refuse(why, "operand rows not 16-byte aligned");
  }
  if (x.a_shift < 0 || x.a_shift > 30 || x.b_shift < 0 || x.b_shift > 30) {
    return refuse(why, "scale block shifts outside 0..30");
  }
  if (!device_code_has_fp8()) {
    return refuse(why, "the kernels were not compiled for compute capability 8.9 or later");
  }
  return true;
}

cudaError_t fp8_decode_run(const Fp8DecodeArgs& x, cudaStream_t stream) {
  if (!fp8_decode_supported(x)) return cudaErrorNotSupported;
  const int64_t slices = (x.k + decode::kSliceBytes - 1) / decode::kSliceBytes;
  DecodePlan pl = decode::plan_decode_slices(x.m, x.n, slices, x.sm_count, x.cc_major);
  const bool block = x.scale == Fp8DecodeScale::kBlock;
  const int resident = block ? Fp8Op<false, false, true>::min_blocks(pl.tiles)
                             : Fp8Op<false, false, false>::min_blocks(pl.tiles);
  if (resident != decode::kCtasPerSm) {
    pl = decode::plan_decode_slices(x.m, x.n, slices, x.sm_count, x.cc_major, resident);
  }
  Fp8Params p;
  p.core.m = static_cast<int>(x.m);
  p.core.n = static_cast<int>(x.n);
  p.core.k = static_cast<int>(x.k);
  p.core.a = x.a;
  p.core.lda = x.m > 1 ? x.lda : x.k;
  p.core.b = x.w;
  p.core.ldb = x.n > 1 ? x.ldw : x.k;
  p.core.slices_per_cta = pl.slices_per_cta;
  p.core.cluster = pl.cluster;
  p.c = x.c;
  p.ldc = x.ldc;
  p.out = x.out;
  p.sa = x.sa;
  p.sa_s0 = x.sa_s0;
  p.sa_s1 = x.sa_s1;
  p.a_shift = x.a_shift;
  p.sb = x.sb;
  p.sb_s0 = x.sb_s0;
  p.sb_s1 = x.sb_s1;
  p.b_shift = x.b_shift;
  p.bias = x.bias;
  p.bias_dtype = x.bias_dtype;
  p.bias_stride = x.bias_stride;
  p.act = x.act;
  if (x.b_e5m2) return launch_formats<true, false>(pl, p, block, stream);
  if (x.a_e5m2) return launch_formats<false, true>(pl, p, block, stream);
  return launch_formats<false, false>(pl, p, block, stream);
}

}  // namespace gemmt
