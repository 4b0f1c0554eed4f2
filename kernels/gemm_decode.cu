// Decode-sized products: C (m x n) = A (m x k) @ B (k x n) for m <= 64, both operands
// K-major, bf16 / fp16 on tensor cores. In a Linear layer's decode step A is the few tokens'
// activations and B = W.T, so the product streams the whole weight matrix once while the
// arithmetic is small: its time is the weight's bytes over the memory bandwidth. The
// streaming, the split of K over warps and a cluster, and the deterministic reduction are
// kernels/common/decode_core.cuh; this file is the 16-bit step (mma.sync m16n8k16) and the
// epilogue (alpha, beta, bias, activation, pre-activation).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/decode_core.cuh"
#include "gemmt/activation.h"
#include "gemmt/gemm.h"
#include "gemmt/numeric.cuh"
#include "plan/decode_plan.h"

namespace gemmt {
namespace {

using decode::DecodeCore;
using decode::DecodePlan;
using decode::WSlice;

// The kernel's argument, the same for both element types.
struct HalfParams {
  DecodeCore core;
  void* c;
  int64_t ldc;
  float alpha, beta;
  const void* bias;  // n values (one per column of C)
  Activation act;
  void* preact;
  int64_t ld_preact;
};

template <typename T>
struct HalfOp {
  using Elem = T;
  using Params = HalfParams;
  // 0: no minimum asked of ptxas. Every instance fits two per SM as it is (<= 128
  // registers); asking for it, or for one, changes its allocation.
  static constexpr int min_blocks(int /*tiles*/) { return 0; }
  static constexpr int in_flight(int /*tiles*/) { return decode::kInFlight; }

  // All token tiles' products with one W slice (32 elements). The A fragment of the first
  // k16 half takes W bytes 0-7 of each row, the second half bytes 8-15; each token's 16 bytes
  // split the same way, which is the consistent permutation of K the core describes.
  template <int kTiles>
  __device__ __forceinline__ static void slice(const Params& p, const WSlice& w, int64_t kk,
                                               int /*row*/, int g, int /*q*/,
                                               float (&acc)[kTiles][4]) {
    const uint32_t a0[4] = {w.lo.x, w.hi.x, w.lo.y, w.hi.y};
    const uint32_t a1[4] = {w.lo.z, w.hi.z, w.lo.w, w.hi.w};
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const uint4 xv = decode::load_token<T>(p.core, 8 * t + g, kk);
      decode::mma_16816(acc[t], a0, xv.x, xv.y, static_cast<T*>(nullptr));
      decode::mma_16816(acc[t], a1, xv.z, xv.w, static_cast<T*>(nullptr));
    }
  }

  // C[token][row] for the accumulator acc[t][i]: row g (+8 for i >= 2) of the warp's 16,
  // token 8t + 2q (+1 for odd i).
  template <int kTiles>
  __device__ __forceinline__ static void store(const Params& p, const float (&acc)[kTiles][4],
                                               int row0, int g, int q) {
    T* c = static_cast<T*>(p.c);
    const T* bias = static_cast<const T*>(p.bias);
    T* preact = static_cast<T*>(p.preact);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = row0 + g + 8 * (i >> 1);
        const int token = 8 * t + 2 * q + (i & 1);
        if (row >= p.core.n || token >= p.core.m) continue;
        T* dst = c + static_cast<int64_t>(token) * p.ldc + row;
        float v = p.alpha * acc[t][i];
        if (p.beta != 0.f) v += p.beta * to_float(*dst);  // beta == 0 never reads C
        if (bias != nullptr) v += to_float(bias[row]);
        if (preact != nullptr)
          preact[static_cast<int64_t>(token) * p.ld_preact + row] = from_float<T>(v);
        *dst = from_float<T>(apply_activation(p.act, v));
      }
    }
  }
};

}  // namespace

cudaError_t gemm_decode_run(const GemmArgs& args, cudaStream_t stream) {
  if (!decode::decode_supports(args)) return cudaErrorNotSupported;
  const DecodePlan pl = decode::plan_decode(args);
  HalfParams p;
  p.core.m = static_cast<int>(args.m);
  p.core.n = static_cast<int>(args.n);
  p.core.k = static_cast<int>(args.k);
  p.core.a = args.a;
  p.core.lda = args.a_stride_m;
  p.core.b = args.b;
  p.core.ldb = args.b_stride_n;
  p.core.slices_per_cta = pl.slices_per_cta;
  p.core.cluster = pl.cluster;
  p.c = args.c;
  p.ldc = args.ldc;
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.bias = args.epilogue.bias;
  p.act = args.epilogue.activation;
  p.preact = args.epilogue.preact;
  p.ld_preact = args.epilogue.ld_preact;
  if (args.dtype == ScalarType::kBFloat16) {
    return decode::launch_planned<HalfOp<__nv_bfloat16>>(pl, p, stream);
  }
  return decode::launch_planned<HalfOp<__half>>(pl, p, stream);
}

}  // namespace gemmt
