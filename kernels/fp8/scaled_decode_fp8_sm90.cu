// The FP8 decode product on Hopper (include/gemmt/fp8_decode.h, fp8_decode_wgmma_*): a few
// float8 tokens against a float8 weight W (n x k, K-major), C = act(sa * sb * (a W^T) + bias).
// Its time is W's bytes over the memory bandwidth; the mma.sync kernel
// (scaled_decode_fp8.cu) issues an mma per 8 tokens, so its instruction work grows with the
// tokens, where one wgmma here covers up to 32 (the tokens of 1-32 a product take it; more
// take the Hopper scaled GEMM or the mma.sync kernel).
//
// Roles. W is wgmma's 64-row operand A (output features), the tokens are operand B, padded to
// 16 or 32 columns (the fewer that hold m; TMA fills the rows past m with zeros, without
// reading memory). A stage holds 128 of K (one 128-byte line a row, 128-byte swizzle): 128
// rows of W (16 KB) and the token tile. A CTA is two consumer warpgroups (64 rows of W each,
// sharing the token tile) and a producer warp that keeps a ring of kStages stages full by
// TMA (the grouped kernel's ring: full / empty mbarriers, kernels/sm90/grouped_kernel.cuh).
// Two CTAs fit on an SM, so one's start and reduction overlap the other's streaming.
//
// Accumulation. The tensor cores' float8 sums keep too few bits for float32 output (448 +
// 31 x 2^-6 comes out 448), so the tensor cores get fp16 operands instead: every float8
// value is an fp16 value, fp16 products are exact and fp16 wgmma sums them with float32
// accumulators, as mma.sync does for the mma.sync kernel. W comes from registers: each
// consumer thread loads its fragment bytes from the swizzled stage and widens them; the
// tokens (operand B, from shared memory) are widened once a stage into one fp16 tile both
// warpgroups read. A stage's sums start from zero and join a float32 total when they
// complete, so the tensor cores' accumulator never carries a sum across stages.
// With use_fast_accum (kFast) the caller accepts the tensor cores' float8 sums: float8 wgmma
// reads both operands from the stage as TMA left it (no widening, no fp16 tile, no barrier
// between the warpgroups), a stage's 128-deep sums still joining the float32 total. It takes
// 1-16 tokens: with 32 or 64 token columns it ran slower than the scaled GEMM on weights of
// 16-50 MB (H200: 4096 x 4096 at 32 tokens 13.8 us against 11.5, at 64 20.3 against 12.0).
//
// Work split. K is split over a cluster of up to 8 CTAs (rank r takes k-blocks
// [r kb / cl, (r + 1) kb / cl)) so that even a 4096-row W spreads over the SMs, about one CTA
// an SM (kernels/plan/fp8_decode_plan.cpp); the grid is
// (row blocks of 128) x cl. The partial totals meet in the ring's shared memory, rank 0 adds
// its peers' through distributed shared memory in rank order (deterministic, one launch, no
// workspace: kernels/common/decode_core.cuh does the same) and applies the epilogue: the row
// (token) and column (W row) scales, the bias, the activation, one rounding to C's dtype.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/decode_core.cuh"
#include "common/gemm_tc_kind.h"
#include "common/shared_memory.cuh"
#include "fp8/decode_epilogue.cuh"
#include "gemmt/activation.h"
#include "gemmt/cuda_check.h"
#include "gemmt/fp8_decode.h"
#include "gemmt/launch.cuh"
#include "plan/fp8_decode_plan.h"
#include "sm90/config.cuh"
#include "sm90/ptx.cuh"
#include "sm90/tensor_map.h"

namespace gemmt {
namespace {

#if defined(GEMMT_HAS_SM90A)
constexpr bool kWgmmaDecodeBuilt = true;
#else
constexpr bool kWgmmaDecodeBuilt = false;
#endif

constexpr int kWdBM = fp8_decode_plan::kRows;  // W rows of a CTA: two warpgroups of 64
constexpr int kWdTokens = 32;                  // the most token columns of the widened form's wgmma
constexpr int kWdFastTokens = 16;              // and of the float8 form's (use_fast_accum)
constexpr int kWdBK = fp8_decode_plan::kBlockK;  // K of a stage: one 128-byte line a row
constexpr int kWdWBytes = kWdBM * kWdBK;         // 16 KB
constexpr int kWdStages = 4;
constexpr int kWdConsumerWarps = 8;
constexpr int kWdConsumers = 32 * kWdConsumerWarps;
constexpr int kWdThreads = kWdConsumers + 32;  // two warpgroups + the producer warp
constexpr int kWdMaxCluster = fp8_decode_plan::kMaxSplit;

// Shared memory of an instance. kN: token columns of its wgmmas (rows of the token tile a
// stage); after the ring, unless kFast, the one fp16 copy of a stage's token tile, two
// 64-column panels (K 0-63 and 64-127, 128 bytes a row each).
template <int kN, bool kFast>
struct WdSmem {
  static constexpr int kTBytes = kN * kWdBK;  // float8 token tile of a stage
  static constexpr int kRing = kWdStages * (kWdWBytes + kTBytes);
  static constexpr int kPanel = kN * kWdBK;  // one fp16 panel: kN rows x 64 elements
  static constexpr int kT16 = kFast ? 0 : 2 * kPanel;
  static constexpr int kUsed = kRing + kT16;
  static constexpr int kBarBytes = 2 * kWdStages * 8;
  // + 1 KB to align the ring to the swizzle's 1024-byte period. The barriers live in that
  // slack: before the aligned base when at least kBarBytes lie there, else after kUsed (then
  // at least 1024 - kBarBytes bytes lie there), so they cost no shared memory of their own.
  static constexpr int kBytes = kUsed + 1024;
  static_assert(kBarBytes <= 512, "the barriers fit on one side of the alignment slack");
  // The consumers' partial totals, laid over the ring once it is drained.
  static_assert(2 * 128 * (kN / 2) * 4 <= kRing, "partial sums fit in the ring");
  // Two CTAs an SM (228 KB of shared memory, 1 KB reserved a CTA).
  static_assert(2 * (kBytes + 1024) <= 228 * 1024, "two CTAs fit on an SM");
};

struct WdParams {
  int m, n, k;
  int kblocks;  // ceil(k / 128)
  int cluster;  // CTAs along K
  void* c;
  int64_t ldc;
  ScalarType out;
  const float* sa;
  int64_t sa_s0;
  const float* sb;
  int64_t sb_s1;
  const void* bias;
  ScalarType bias_dtype;
  int64_t bias_stride;
  Activation act;
};

#if defined(GEMMT_SM90_DEVICE_CODE)
// mbar_wait (sm90/ptx.cuh) with a bound: a load that never lands (a tensor map the driver
// accepted but the copy engine cannot serve) stops the kernel with an error after about
// four seconds instead of hanging the process. A healthy wait lasts microseconds.
__device__ __forceinline__ void wd_wait(uint32_t bar, uint32_t parity) {
  const long long start = clock64();
  while (!mbar_try_wait(bar, parity)) {
    if (clock64() - start > (8ll << 30)) __trap();
  }
}
#endif

#if defined(GEMMT_SM90_DEVICE_CODE)
// The token tile: the stage's float8 tile (kN rows, 128-byte swizzled lines)
// widened into the fp16 buffer (two panels of kN rows x 64 elements, same swizzle), with K
// permuted as the W fragments are (see the consumer loop): fp16 column 16 s + 8 hi + 2 q + e
// of a row takes its float8 byte 32 q + 4 s + 2 hi + e. A task is 8 rows x one half of K (steps
// s = 4 h .. 4 h + 3); lane (tt, sp) reads the word at byte 32 q + 16 h + 4 sp of row tt for
// q = 0..3 (chunks 2 q + h: 32 different banks a load) and writes two 16-byte chunks of fp16
// panel h (chunks 2 sp, 2 sp + 1: eight different chunks each quarter-warp).
template <bool kE5, int kN>
__device__ __forceinline__ void wd_widen_tokens(uint32_t src, uint32_t dst, int warp, int lane) {
  constexpr int kTasks = kN / 4;
  const int tt = lane >> 2, sp = lane & 3;
#pragma unroll
  for (int i = 0; i < (kTasks + kWdConsumerWarps - 1) / kWdConsumerWarps; ++i) {
    const int task = warp + kWdConsumerWarps * i;
    if (task >= kTasks) break;
    const int h = task & 1;
    const int t = 8 * (task >> 1) + tt;
    const uint32_t from = src + t * kWdBK + 4 * sp;
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      fp8_decode::widen<kE5>(ld_shared_b32(from + (((2 * q + h) ^ tt) << 4)), lo[q], hi[q]);
    }
    const uint32_t to = dst + h * (kN * kWdBK) + t * kWdBK;
    st_shared_v4(to + (((2 * sp) ^ tt) << 4), lo[0], lo[1], lo[2], lo[3]);
    st_shared_v4(to + (((2 * sp + 1) ^ tt) << 4), hi[0], hi[1], hi[2], hi[3]);
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
#endif

#if defined(GEMMT_SM90_DEVICE_CODE)
// The ring's shared-memory addresses: W's stages, the float8 token tiles, the fp16 token tile
// (the widened form's) and the full / empty barriers.
struct WdRing {
  uint32_t w, t, t16, bars;
  __device__ __forceinline__ uint32_t full(int s) const { return bars + 8u * s; }
  __device__ __forceinline__ uint32_t empty(int s) const { return bars + 8u * (kWdStages + s); }
};

// A walk around the ring: the stage and the parity its barriers are at.
struct WdStage {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++stage == kWdStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// The widened form's consumers: the float32 totals of this rank's k-blocks in acc.
template <int kKind, int kN>
__device__ __forceinline__ void wd_consume_widened(const WdRing& ring, int kb_first, int kb_last,
                                                   int warp, int lane, float (&acc)[kN / 2]) {
  using Smem = WdSmem<kN, false>;
  // fp16 wgmma, A = W from registers. The fragment of step s (k16) of a thread (g = lane / 4,
  // q = lane % 4) is rows r = 16 (warp % 4) + g and r + 8 of its warpgroup's 64, at four K
  // positions each: 2 q, 2 q + 1 (registers a[0], a[1] for the two rows) and 2 q + 8,
  // 2 q + 9 (a[2], a[3]). K is permuted (both operands alike, so the sum is unchanged) so
  // that these are one 32-bit word of the row: bytes 32 q + 4 s .. + 3, low pair then high
  // pair. A thread's eight steps are then bytes 32 q .. 32 q + 31 of its two rows, two
  // 16-byte loads a row (chunks 2 q, 2 q + 1, swizzled by r % 8 = g: a quarter-warp's loads
  // fall in eight different chunks).
  constexpr bool kWE5 = kKind == kE5M2E4M3;
  constexpr bool kAE5 = kKind == kE4M3E5M2;
  const int cw = warp >> 2;
  const int g = lane >> 2, q = lane & 3;
  const uint32_t w_row = static_cast<uint32_t>((64 * cw + 16 * (warp & 3) + g) * kWdBK);
  const uint32_t chunk0 = static_cast<uint32_t>(((2 * q) ^ g) << 4);
  const uint32_t chunk1 = static_cast<uint32_t>(((2 * q + 1) ^ g) << 4);
  const uint64_t db = make_desc(ring.t16, 16, 1024);
  WdStage at;
  float part[kN / 2];
  for (int kb = kb_first; kb < kb_last; ++kb, at.next()) {
    const int stage = at.stage;
    wd_wait(ring.full(stage), at.phase);
    // Both warpgroups' products of the previous stage have completed (each waited for its
    // own): the one fp16 token tile may be rewritten. One tile shared by the warpgroups,
    // widened by all eight warps, rather than one each: half the widening and half the
    // shared memory (a second 16 KB would cost a ring stage or the second CTA an SM), for a
    // barrier both take anyway (they consume the same stages).
    named_barrier_sync(2, kWdConsumers);
    wd_widen_tokens<kAE5, kN>(ring.t + stage * Smem::kTBytes, ring.t16, warp, lane);
    // The tile's stores, generic proxy, before the wgmmas read it through the async proxy.
    fence_proxy_async_smem();
    const uint32_t ws = ring.w + stage * kWdWBytes + w_row;
    // The eight steps' W words loaded and widened together (16 registers of fragments held
    // until their wgmmas complete).
    uint4 w8[2][2];  // [row r, r + 8][chunk 2 q, 2 q + 1]
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint32_t chunk = c == 0 ? chunk0 : chunk1;
      w8[0][c] = ld_shared_v4(ws + chunk);
      w8[1][c] = ld_shared_v4(ws + 8 * kWdBK + chunk);
    }
    uint32_t a[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      fp8_decode::widen<kWE5>(word_of(w8[0][i >> 2], i & 3), a[i][0], a[i][2]);
      fp8_decode::widen<kWE5>(word_of(w8[1][i >> 2], i & 3), a[i][1], a[i][3]);
    }
    named_barrier_sync(2, kWdConsumers);  // the fp16 token tile is complete
    // Every byte of the stage is in registers or the fp16 tile: the producer may refill it
    // while the products run.
    if (lane == 0) mbar_arrive_local(ring.empty(stage));
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      // Step st: fp16 columns 16 st .. 16 st + 15, panel st / 4, 32 bytes a step along its
      // line.
      const uint64_t d = db + (st >> 2) * (Smem::kPanel >> 4) + (st & 3) * (32 >> 4);
      wgmma_f16_rs<kN>(part, a[st], d, st != 0 ? 1u : 0u);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(part);
    // The stage's 128 products a sum, summed from zero on the tensor cores, join the float32
    // total: the tensor cores' accumulator never carries a sum across stages.
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) acc[i] += part[i];
  }
}

// The float8 form's consumers (use_fast_accum): each warpgroup's 64 rows of W and the token
// tile read by float8 wgmma where TMA put them (K-major, 128-byte swizzle, four k32 steps of
// 32 bytes a stage); a stage's sums from zero, added to the float32 totals in acc.
template <int kKind, int kN>
__device__ __forceinline__ void wd_consume_fp8(const WdRing& ring, int kb_first, int kb_last,
                                               int warp, int lane, float (&acc)[kN / 2]) {
  static_assert(kN == kWdFastTokens, "the float8 form's one width");
  using Smem = WdSmem<kN, true>;
  constexpr uint32_t kStep = 32 >> 4;  // a k32 step along the 128-byte line, in 16 bytes
  const uint32_t cw = static_cast<uint32_t>(warp >> 2);
  const uint64_t dw = make_desc(ring.w + cw * (64 * kWdBK), 16, 1024);
  const uint64_t dt = make_desc(ring.t, 16, 1024);
  WdStage at;
  float part[kN / 2];
  for (int kb = kb_first; kb < kb_last; ++kb, at.next()) {
    const int stage = at.stage;
    wd_wait(ring.full(stage), at.phase);
    const uint64_t ws = dw + static_cast<uint32_t>(stage * (kWdWBytes >> 4));
    const uint64_t ts = dt + static_cast<uint32_t>(stage * (Smem::kTBytes >> 4));
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < kWdBK / 32; ++st) {
      wgmma_m64n16<kKind, 0, 0>(part, ws + st * kStep, ts + st * kStep, st != 0 ? 1u : 0u);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(part);
    // The wgmmas have read the stage: the producer may refill it.
    if (lane == 0) mbar_arrive_local(ring.empty(stage));
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) acc[i] += part[i];
  }
}
#endif

// kKind: the operand pair (A = W's format, B = the tokens'), gemm_tc_kind.h. kN: token
// columns of the wgmmas (16 or 32, the fewer that hold m; 16 with kFast). kFast: the float8
// form (use_fast_accum), else the widened one.
template <int kKind, int kN, bool kFast>
__device__ __forceinline__ void wd_body(const CUtensorMap* tma_w, const CUtensorMap* tma_t,
                                        const WdParams& p) {
#if defined(GEMMT_SM90_DEVICE_CODE)
  using Smem = WdSmem<kN, kFast>;
  constexpr int kAcc = kN / 2;  // float32 sums a consumer thread holds
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  WdRing ring;
  ring.w = base;
  ring.t = base + kWdStages * kWdWBytes;
  ring.t16 = base + Smem::kRing;
  ring.bars = base - raw >= static_cast<uint32_t>(Smem::kBarBytes) ? base - Smem::kBarBytes
                                                                   : base + Smem::kUsed;

  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0);
  const int lane = threadIdx.x & 31;
  const int rank = p.cluster > 1 ? static_cast<int>(cluster_ctarank()) : 0;
  const int row_block = static_cast<int>(blockIdx.x) / p.cluster;
  const int kb_first = static_cast<int>(static_cast<int64_t>(rank) * p.kblocks / p.cluster);
  const int kb_last = static_cast<int>(static_cast<int64_t>(rank + 1) * p.kblocks / p.cluster);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kWdStages; ++s) {
      mbar_init(ring.full(s), 1);
      mbar_init(ring.empty(s), kWdConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();
  // A programmatic launch (gemmt/launch.cuh) may start this block before the previous kernel
  // has finished: no global access above this line.
  grid_dependency_wait();
  allow_dependent_launch();

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  if (warp == kWdConsumerWarps) {
    // The producer: one elected lane issues the loads of this rank's k-blocks.
    const bool leader = elect_one();
    if (leader) {
      prefetch_tmap(tma_w);
      prefetch_tmap(tma_t);
    }
    WdStage at;
    for (int kb = kb_first; kb < kb_last; ++kb, at.next()) {
      const int stage = at.stage;
      wd_wait(ring.empty(stage), at.phase ^ 1u);
      if (leader) {
        const uint32_t fb = ring.full(stage);
        mbar_arrive_expect_tx(fb, kWdWBytes + Smem::kTBytes);
        tma_load(ring.w + stage * kWdWBytes, tma_w, fb, kb * kWdBK, row_block * kWdBM);
        tma_load(ring.t + stage * Smem::kTBytes, tma_t, fb, kb * kWdBK, 0);
      }
      __syncwarp();
    }
  } else if constexpr (kFast) {
    wd_consume_fp8<kKind, kN>(ring, kb_first, kb_last, warp, lane, acc);
  } else {
    wd_consume_widened<kKind, kN>(ring, kb_first, kb_last, warp, lane, acc);
  }

  const bool consumer = warp < kWdConsumerWarps;
  const int tid = static_cast<int>(threadIdx.x);  // 0..255 on the consumers
  if (p.cluster > 1) {
    // The ring is drained: every load was waited for by both warpgroups, whose products have
    // completed. Its first kN KB take this CTA's partial totals, a float4 per thread and
    // group of four, interleaved so that a warp's stores are contiguous. Group j holds
    // tokens 8 j .. 8 j + 7 only: the groups past m are padding and cross no CTA.
    float* const partial = reinterpret_cast<float*>(smem_raw + (base - smem_addr(smem_raw)));
    if (consumer) {
      named_barrier_sync(1, 32 * kWdConsumerWarps);
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j) {
        if (8 * j >= p.m) break;
        *reinterpret_cast<float4*>(partial + (j * 256 + tid) * 4) =
            make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
    cluster_sync();  // every rank's totals are in its shared memory
    if (rank == 0 && consumer) {
      for (int r = 1; r < p.cluster; ++r) {
#pragma unroll
        for (int j = 0; j < kAcc / 4; ++j) {
          if (8 * j >= p.m) break;
          const float4 v =
              cluster::load_peer(partial + (j * 256 + tid) * 4, static_cast<uint32_t>(r));
          acc[4 * j] += v.x;
          acc[4 * j + 1] += v.y;
          acc[4 * j + 2] += v.z;
          acc[4 * j + 3] += v.w;
        }
      }
    }
    cluster_sync();  // the peers' shared memory outlives rank 0's reads
  }
  if (rank != 0 || !consumer) return;

  // The epilogue from the accumulator layout: acc[4 j + 2 h + e] is W row (output column)
  // 16 w + g + 8 h of the warpgroup's 64 and token (output row) 8 j + 2 q + e.
  const int g = lane >> 2, q = lane & 3;
  const int row_base = row_block * kWdBM + (warp >> 2) * 64 + (warp & 3) * 16 + g;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_base + 8 * h;
    if (row >= p.n) continue;
    const float sb = __ldg(p.sb + static_cast<int64_t>(row) * p.sb_s1);
    const float bias =
        p.bias != nullptr ? fp8_decode::load_bias(p.bias, p.bias_dtype, p.bias_stride, row) : 0.f;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int token = 8 * j + 2 * q + e;
        if (token >= p.m) continue;
        float v = acc[4 * j + 2 * h + e];
        v = v * __ldg(p.sa + static_cast<int64_t>(token) * p.sa_s0) * sb;
        v += bias;
        fp8_decode::store_out(p.c, p.out, p.ldc, token, row, apply_activation(p.act, v));
      }
    }
  }
#endif  // GEMMT_SM90_DEVICE_CODE
}

template <int kKind, int kN, bool kFast>
__global__ void __launch_bounds__(kWdThreads, 2)
    fp8_decode_wgmma_kernel(const __grid_constant__ CUtensorMap tma_w,
                            const __grid_constant__ CUtensorMap tma_t, const WdParams p) {
  wd_body<kKind, kN, kFast>(&tma_w, &tma_t, p);
}

// ---- Host side ----------------------------------------------------------------------------

// A 2-D map of float8 rows (`rows` of `k` bytes, `stride` bytes apart) in boxes of
// `box_rows` x 128 bytes with the 128-byte swizzle; rows and K past the ends read as zeros.
bool encode_rows(CUtensorMap* map, const void* ptr, int64_t k, int64_t rows, int64_t stride,
                 uint32_t box_rows) {
  PFN_cuTensorMapEncodeTiled_v12000 fn = sm90::tensor_map_encoder();
  if (fn == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kWdBK), box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  return sm90::encode_with_context([&] {
    return fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(ptr), dims, strides, box,
              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
              CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  });
}

template <auto kernel, int kSmemBytes>
cudaError_t launch_kernel(const CUtensorMap& w, const CUtensorMap& t, const WdParams& p, int ctas,
                          cudaStream_t stream) {
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(kSmemBytes));
  // Two CTAs an SM.
  GEMMT_RETURN_IF_ERROR(prefer_max_shared_carveout<kernel>());
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg = cluster_launch_config(
      dim3(static_cast<unsigned>(ctas)), dim3(kWdThreads), kSmemBytes, stream, p.cluster, attr);
  add_programmatic_launch<kernel>(cfg, attr);
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, w, t, p));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <int kKind, int kN, bool kFast>
cudaError_t launch_columns(const CUtensorMap& w, const CUtensorMap& t, const WdParams& p, int ctas,
                           cudaStream_t stream) {
  return launch_kernel<fp8_decode_wgmma_kernel<kKind, kN, kFast>, WdSmem<kN, kFast>::kBytes>(
      w, t, p, ctas, stream);
}

// Token columns of the wgmmas: the fewer of 16 and 32 that hold m (the token tile's TMA box
// has as many rows).
int token_columns(int64_t m) {
  return m <= 16 ? 16 : 32;
}

template <int kKind>
cudaError_t launch_kind(const CUtensorMap& w, const CUtensorMap& t, const WdParams& p, int ctas,
                        bool fast, cudaStream_t stream) {
  if (fast) return launch_columns<kKind, kWdFastTokens, true>(w, t, p, ctas, stream);
  if (p.m <= 16) return launch_columns<kKind, 16, false>(w, t, p, ctas, stream);
  return launch_columns<kKind, 32, false>(w, t, p, ctas, stream);
}

cudaError_t run_path(const Fp8DecodeArgs& x, cudaStream_t stream) {
  if (!fp8_decode_wgmma_supported(x)) return cudaErrorNotSupported;
  CUtensorMap map_w, map_t;
  if (!encode_rows(&map_w, x.w, x.k, x.n, x.n > 1 ? x.ldw : x.k, kWdBM) ||
      !encode_rows(&map_t, x.a, x.k, x.m, x.m > 1 ? x.lda : x.k,
                   static_cast<uint32_t>(token_columns(x.m)))) {
    return cudaErrorNotSupported;
  }
  WdParams p;
  p.m = static_cast<int>(x.m);
  p.n = static_cast<int>(x.n);
  p.k = static_cast<int>(x.k);
  p.kblocks = static_cast<int>((x.k + kWdBK - 1) / kWdBK);
  p.cluster = x.k_split > 0 ? static_cast<int>(std::min<int64_t>(
                                  {static_cast<int64_t>(x.k_split), kWdMaxCluster, p.kblocks}))
                            : fp8_decode_plan::k_split(x.n, x.k, x.sm_count, x.fast_accum);
  p.c = x.c;
  p.ldc = x.ldc;
  p.out = x.out;
  p.sa = x.sa;
  p.sa_s0 = x.sa_s0;
  p.sb = x.sb;
  p.sb_s1 = x.sb_s1;
  p.bias = x.bias;
  p.bias_dtype = x.bias_dtype;
  p.bias_stride = x.bias_stride;
  p.act = x.act;
  const int64_t ctas = (x.n + kWdBM - 1) / kWdBM * p.cluster;
  if (ctas > kMaxGridX) return cudaErrorNotSupported;
  const int n_ctas = static_cast<int>(ctas);
  if (x.b_e5m2) return launch_kind<kE5M2E4M3>(map_w, map_t, p, n_ctas, x.fast_accum, stream);
  if (x.a_e5m2) return launch_kind<kE4M3E5M2>(map_w, map_t, p, n_ctas, x.fast_accum, stream);
  return launch_kind<kE4M3>(map_w, map_t, p, n_ctas, x.fast_accum, stream);
}

}  // namespace

bool fp8_decode_wgmma_supported(const Fp8DecodeArgs& x, const char** why) {
  using fp8_decode::refuse;
  if (!kWgmmaDecodeBuilt) return refuse(why, "the sm_90a kernels are not in this build");
  if (x.cc_major != 9) return refuse(why, "wgmma needs compute capability 9.0");
  if (x.scale != Fp8DecodeScale::kRowCol) return refuse(why, "block scales");
  if (!fp8_decode::common_args_supported(x, x.fast_accum ? kWdFastTokens : kWdTokens, why)) {
    return false;
  }
  // Tensor maps: 16-byte multiples as row strides, rows that do not overlap.
  if ((x.m > 1 && (x.lda % 16 != 0 || x.lda < x.k)) ||
      (x.n > 1 && (x.ldw % 16 != 0 || x.ldw < x.k))) {
    return refuse(why, "operand rows not 16-byte aligned or overlapping");
  }
  if (x.sm_count < 1) return refuse(why, "no SM count");
  return true;
}

cudaError_t fp8_decode_wgmma_run(const Fp8DecodeArgs& x, cudaStream_t stream) {
  return run_path(x, stream);
}

}  // namespace gemmt
