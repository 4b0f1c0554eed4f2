// The Hopper GEMM's fixed shapes and its kernel parameters (kernels/sm90/). The device-side
// headers of this folder compile to code only for sm_90a (GEMMT_SM90_DEVICE_CODE).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gemm_epilogue.cuh"
#include "common/gemm_tc_kind.h"
#include "plan/sm90_plan.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GEMMT_SM90_DEVICE_CODE 1
#endif

namespace gemmt {
namespace {

using sm90::kBM;
using sm90::kBNMedium;
using sm90::kBNNarrow;
using sm90::kBNThreeQuarter;
using sm90::kBNWide;
constexpr int kThreads = 384;
constexpr int kABytes = kBM * 128;  // 16 KB
// Output staging for the TMA-store epilogue: per consumer warpgroup two 128B-swizzled boxes
// of 64 rows x 128 bytes, i.e. half of its 64x256 bf16 rows (a quarter for fp32) per round;
// one box on the 128x192 tile, whose fifth stage takes the room of the second.
constexpr int kCBoxBytes = 64 * 128;
constexpr int kCStageBytes = 2 * kCBoxBytes;

// The wide tile's ring depth. An experiment build may set another: three stages (tile_phases,
// H100) ran its main loop 9% slower at K = 4096, which rules out giving a stage to a
// whole-tile output buffer.
#if defined(GEMMT_SM90_WIDE_STAGES)
constexpr int kWideStages = GEMMT_SM90_WIDE_STAGES;
#else
constexpr int kWideStages = 4;
#endif

// Four tile widths. The wide 128x256 tile is the fast one whenever C has columns to fill it
// and enough tiles to fill the SMs evenly. For N <= 64 (tall-skinny products, the backward of
// a narrow layer) three quarters of its wgmma work would be thrown away, and such products
// are bound by streaming A instead: the 128x64 tile issues m64n64 instructions and spends
// the smaller stages on a deeper ring (24 KB a stage, 8 of them) to keep more of A in
// flight. It runs as single CTAs with the register-to-global epilogue. Between them, the
// 128x128 tile (m64n128, 32 KB stages, 6 of them, the staged store of the wide tile, CTA
// pairs) halves the wave quantum where the wide tiles of an output come to one or two
// uneven waves (512 tokens against an 11008-wide weight: 172 wide tiles on 132 SMs) and
// streams a weight through twice as many SMs at 128-256 tokens. It runs ping-pong: each
// consumer warpgroup owns whole tiles (both 64-row halves, 128 accumulators a thread, as
// on the wide tile) and the two take turns, so one stores its tile while the other
// computes; on the wide tile both warpgroups share every tile and the tensor cores wait
// while C is stored. The 128x192 tile (16-bit only) runs like the wide one, m64n192 and 96
// accumulators a thread: where 172 wide tiles come to two uneven waves (512 tokens against
// an 11008-wide weight), its 232 fill the second wave three quarters, and a wave took 0.78
// of the wide one's time (H100). A stage holds about three quarters of the wide tile's
// k-block time, so it gets a fifth 40 KB stage to keep as much time in flight (three wide
// stages ran the main loop 9% slower than four); the room comes from staging C one box a
// round instead of two. choose_tile weighs the four.
template <int kBN>
struct TileCfg {
  static_assert(kBN == 256 || kBN == 192 || kBN == 128 || kBN == 64,
                "tile widths: 256, 192, 128 and 64");
  // Five stages on the 128x192 tile, whatever an experiment gives the wide one: six would not
  // fit beside its staging box.
  static constexpr int kStages = kBN == 256 ? kWideStages : (kBN == 192 ? 5 : (kBN == 128 ? 6 : 8));
  static constexpr int kBBytes = kBN * 128;  // 32, 24, 16 or 8 KB
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kAcc = kBN / 2;  // fp32 accumulators per consumer thread
  static constexpr bool kStagedStore = kBN != 64;
  static constexpr int kCBoxes = kBN == 192 ? 1 : 2;  // staging boxes a warpgroup fills a round
  static constexpr int kCWgBytes = kCBoxes * kCBoxBytes;
  static constexpr int kCBytes = kStagedStore ? 2 * kCWgBytes : 0;
  // full and empty per stage, and the ping-pong turn barriers of the two consumers
  static constexpr int kBarrierBytes = (2 * kStages + 2) * 8;
  // + 1 KB so the ring can be aligned to the 1024-byte period of the 128B swizzle.
  static constexpr int kSmemBytes = kStages * kStageBytes + kCBytes + kBarrierBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the shared memory of one H100 CTA");
};

struct Params {
  int m, n, k;
  int tiles_m;  // in units of kCluster * kBM rows
  int tiles_n;
  int num_kb;
  int group;                // raster group height, in units of tiles_m
  uint32_t stage_tx_bytes;  // what a stage's TMA loads deliver (sm90::stage_tx_bytes)
  void* c;
  int64_t ldc;
  float alpha, beta;
  uint8_t c_pair;     // two adjacent outputs can be written with one aligned store
  uint8_t tma_store;  // C goes out through shared memory and TMA (needs 16-byte aligned rows)
  // The operands' layouts (M-major A, N-major B), read by the instances that serve every
  // layout (kAnyLayout).
  uint8_t a_mn, b_mn;
  // The kernel computes C^T = B^T A^T (see swap_for_tf32): output (row, col) of the tile
  // grid is C[col * ldc + row].
  int c_trans;
  // Split-k: a unit of work is (tile, k-slice); slice s covers k-blocks
  // [s * kb_per_split, (s + 1) * kb_per_split) and writes its float32 partial tile to
  // partial[(s * m + row) * n + col]. splits == 1: units are tiles and C is written directly.
  int splits;
  int kb_per_split;
  // First row of the last 128-row tile, when that tile is moved up to end at row m (every
  // operand row it reads then exists: TMA boxes that cross the end of A ran the narrow tile
  // of a 200-token batched decode 1.5x slower than 256 tokens); INT_MAX leaves tiles in place.
  int last_m0;
  float* partial;
  // Stream-k (splits == 1 only): units [0, sk_dp_units) are whole tiles, dealt round-robin
  // to the clusters; the k-blocks of the remaining tiles, sk_kb_total of them, are cut into
  // one equal range per cluster (scheduler.cuh). sk_dp_units == total units: no stream-k.
  // Its workspace is `partial`: a kBM x kBN float32 slot per CTA of the grid (in fragment
  // order), then two int flags per slot, zeroed by the launch (epilogue.cuh: sk_flag).
  // (Params stays at 128 bytes: at 152, nvcc stopped keeping the fields in registers and
  // reloaded them from parameter memory at every use, which slowed short-k products ~10%.)
  int sk_dp_units;
  int sk_kb_total;
  // Bias / activation / pre-activation output, in the caller's coordinates (C's, not C^T's).
  EpilogueParams epi;
};

static_assert(sizeof(Params) <= 128,
              "Params beyond 128 bytes is read from parameter memory at every use");

template <int K>
struct KindTraits;
template <>
struct KindTraits<kBF16> {
  using T = __nv_bfloat16;
};
template <>
struct KindTraits<kF16> {
  using T = __half;
};
template <>
struct KindTraits<kTF32> {
  using T = float;
};

// The operand layouts an instance's main loops serve: one, fixed at compile time (the bits
// kLayoutAMn, an M-major A, and kLayoutBMn, an N-major B), or all four, taken per launch from
// Params::a_mn / b_mn (kAnyLayout). The 16-bit kinds use kAnyLayout: their four main loops then
// share one epilogue, which is most of the kernel's code and of its compile time (one kernel
// instead of four per kind, tile width and cluster shape).
constexpr int kLayoutAMn = 1;
constexpr int kLayoutBMn = 2;
constexpr int kAnyLayout = 4;

constexpr int kConsumerWarps = 8;
// Box of an MN-major operand: 128 bytes along M/N by the stage's K extent (64 rows of
// 16-bit values, 32 of tf32).
template <int kKind>
constexpr int mn_box_bytes() {
  return kKind == kTF32 ? 32 * 128 : 64 * 128;
}

}  // namespace
}  // namespace gemmt
