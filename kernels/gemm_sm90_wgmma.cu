// Hopper GEMM: TMA loads into a 4-stage shared-memory ring, wgmma.mma_async from shared
// memory, warp specialisation and a persistent tile loop. C = alpha * A @ B + beta * C with
// float32 accumulation; bf16 / fp16 operands (any mix of K-major and MN-major) and float32
// read as tf32. wgmma reads a tf32 operand from shared memory K-major only, so an M-major
// tf32 A is loaded into registers (the register-sourced form) and a row-major B is handled
// by computing C^T = B^T A^T, which turns it into such an A (swap_for_tf32).
//
// CTA = 3 warpgroups. Warpgroup 0 produces: one thread walks the same tile sequence as the
// consumers and keeps the ring full with TMA; its registers are handed to the consumers
// through setmaxnreg. Warpgroups 1 and 2 consume: each owns 64 rows of the 128x256 tile
// (m64n256 wgmma, 128 fp32 accumulators per thread) and writes its rows of C straight from
// registers.
//
// Stage layout (every operand row is 128 bytes, i.e. 128B-swizzle atoms of 8 rows):
//   A K-major : 128 rows (M) x 64 bf16 of K                      one TMA box {64, 128}
//   A MN-major: 2 boxes of 64 rows (K) x 64 bf16 of M, 8 KB each   TMA box {64, 64}
//   B K-major : 256 rows (N) x 64 bf16 of K (two 128-row boxes)   TMA box {64, 128}
//   B MN-major: 4 boxes of 64 rows (K) x 64 bf16 of N              TMA box {64, 64}
// (tf32: 32 fp32 of K per row instead of 64 bf16; an M-major A is 4 boxes of 32 x 32.)
//
// Clusters of two CTAs stacked along M share the B tile: each CTA fetches one half and
// multicasts it to both, which cuts the L2 traffic per CTA from 48 KB to 32 KB a stage. A
// stage can then only be refilled once the consumers of both CTAs have released it, so
// every consumer warp arrives on the empty barrier of each CTA of the cluster.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/gemm_epilogue.cuh"
#include "gemmt/gemm_tc_kind.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "gemmt/shared_memory.cuh"
#include "gemmt/strided_copy.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GEMMT_SM90_DEVICE_CODE 1
#endif

namespace gemmt {
namespace {

constexpr int kBM = 128;
constexpr int kThreads = 384;
constexpr int kABytes = kBM * 128;  // 16 KB
// Output staging for the TMA-store epilogue: per consumer warpgroup two 128B-swizzled boxes
// of 64 rows x 128 bytes, i.e. half of its 64x256 bf16 rows (a quarter for fp32) per round.
constexpr int kCBoxBytes = 64 * 128;
constexpr int kCStageBytes = 2 * kCBoxBytes;

// Two tile widths. The wide 128x256 tile is the fast one whenever C has columns to fill it.
// For N <= 64 (tall-skinny products, the backward of a narrow layer) three quarters of its
// wgmma work would be thrown away, and such products are bound by streaming A instead: the
// 128x64 tile issues m64n64 instructions and spends the smaller stages on a deeper ring
// (24 KB a stage, 8 of them) to keep more of A in flight. It runs as single CTAs with the
// register-to-global epilogue. Small outputs of any width use it too when their wide tiles
// would leave most SMs idle (choose_tile).
template <int kBN>
struct TileCfg {
  static_assert(kBN == 256 || kBN == 64, "tile widths: 256 and 64");
  static constexpr int kStages = kBN == 256 ? 4 : 8;
  static constexpr int kBBytes = kBN * 128;  // 32 KB or 8 KB
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kAcc = kBN / 2;  // fp32 accumulators per consumer thread
  static constexpr int kCBytes = kBN == 256 ? 2 * kCStageBytes : 0;
  static constexpr int kBarrierBytes = 2 * kStages * 8;
  // + 1 KB so the ring can be aligned to the 1024-byte period of the 128B swizzle.
  static constexpr int kSmemBytes = kStages * kStageBytes + kCBytes + kBarrierBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the shared memory of one H100 CTA");
};
constexpr int kBNWide = 256;
constexpr int kBNNarrow = 64;

struct Params {
  int m, n, k;
  int tiles_m;  // in units of kCluster * kBM rows
  int tiles_n;
  int num_kb;
  int group;  // raster group height, in units of tiles_m
  void* c;
  int64_t ldc;
  float alpha, beta;
  int c_pair;     // two adjacent outputs can be written with one aligned store
  int tma_store;  // C goes out through shared memory and TMA (needs 16-byte aligned rows)
  // The kernel computes C^T = B^T A^T (see swap_for_tf32): output (row, col) of the tile
  // grid is C[col * ldc + row].
  int c_trans;
  // Split-k: a unit of work is (tile, k-slice); slice s covers k-blocks
  // [s * kb_per_split, (s + 1) * kb_per_split) and writes its float32 partial tile to
  // partial[(s * m + row) * n + col]. splits == 1: units are tiles and C is written directly.
  int splits;
  int kb_per_split;
  float* partial;
  // Bias / activation / pre-activation output, in the caller's coordinates (C's, not C^T's).
  EpilogueParams epi;
};

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

#if defined(GEMMT_SM90_DEVICE_CODE)

// The tile and the k-block range of work unit u.
struct Unit {
  int tile, split, kb_begin, kb_end;
};

__device__ __forceinline__ Unit unit_of(int u, const Params& p) {
  Unit w;
  w.tile = u / p.splits;
  w.split = u - w.tile * p.splits;
  w.kb_begin = w.split * p.kb_per_split;
  const int end = w.kb_begin + p.kb_per_split;
  w.kb_end = end < p.num_kb ? end : p.num_kb;
  return w;
}

constexpr int kConsumerWarps = 8;
// Box of an MN-major operand: 128 bytes along M/N by the stage's K extent (64 rows of
// 16-bit values, 32 of tf32).
template <int kKind>
constexpr int mn_box_bytes() {
  return kKind == kTF32 ? 32 * 128 : 64 * 128;
}

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::
          : "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void fence_barrier_init() {
  // Makes the initialised barriers visible to the TMA unit and to the peer CTA.
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive_local(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrives on the barrier at the same offset in CTA `cta` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(cta));
  // Default (CTA-scope) release: the only thing ordered is this warp's finished wgmma reads
  // of the stage; a cluster-scope release would cost a GPU-wide MEMBAR per stage.
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void prefetch_tmap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                         int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// Same box written to the same offset (and signalled on the same barrier offset) in every
// CTA of `mask`.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map,
                                                   uint32_t bar, int c0, int c1, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Generic-proxy writes to shared memory become visible to a later TMA read of it.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void tma_store(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until earlier bulk stores of this thread have finished reading shared memory.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Waits until earlier bulk stores of this thread are complete in global memory.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Keeps the compiler from moving accumulator reads or writes across the asynchronous
// wgmma window: the asm claims to read and rewrite every register.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor, 128B swizzle. K-major: sbo = 1024 (next 8-row group),
// lbo unused (the 32-byte K slice never leaves its 128-byte row). MN-major: lbo = distance
// between 64-element M/N column blocks, sbo = 1024 (next 8 rows of K).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (uint64_t{1} << 62);
}

#define GEMMT_ACC8(i)                                                                             \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define GEMMT_ACC128                                                                            \
  GEMMT_ACC8(0), GEMMT_ACC8(8), GEMMT_ACC8(16), GEMMT_ACC8(24), GEMMT_ACC8(32), GEMMT_ACC8(40), \
      GEMMT_ACC8(48), GEMMT_ACC8(56), GEMMT_ACC8(64), GEMMT_ACC8(72), GEMMT_ACC8(80),           \
      GEMMT_ACC8(88), GEMMT_ACC8(96), GEMMT_ACC8(104), GEMMT_ACC8(112), GEMMT_ACC8(120)
#define GEMMT_D128                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "   \
  "%127}"

// One wgmma reading both operands from shared memory: 16-bit types take the two transpose
// flags (MN-major operands); tf32 reads K-major operands only and takes none. P, A, B, TA and
// TB are the PTX operand numbers of the predicate input and the descriptors / flags.
#define GEMMT_WGMMA_16(INSTR, DREGS, ACCS, P, A, B, TA, TB)                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " " DREGS ", " A ", " B \
               ", p, 1, 1, " TA ", " TB ";\n}\n"                                            \
               : ACCS                                                                       \
               : "l"(da), "l"(db), "r"(accumulate), "n"(kTransA), "n"(kTransB))
#define GEMMT_WGMMA_TF32(INSTR, DREGS, ACCS, P, A, B)                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " " DREGS ", " A ", " B \
               ", p, 1, 1;\n}\n"                                                            \
               : ACCS                                                                       \
               : "l"(da), "l"(db), "r"(accumulate))

// D(64x256, fp32) (+)= A(64xK) * B(Kx256) for one K step (16 for 16-bit types, 8 for tf32).
// `accumulate` == 0 overwrites D, which is how each tile starts without zeroing registers.
template <int kKind, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n256(float (&d)[128], uint64_t da, uint64_t db,
                                              uint32_t accumulate) {
  if constexpr (kKind == kBF16) {
    GEMMT_WGMMA_16("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", GEMMT_D128,
                   GEMMT_ACC128, "%130", "%128", "%129", "%131", "%132");
  } else if constexpr (kKind == kF16) {
    GEMMT_WGMMA_16("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", GEMMT_D128, GEMMT_ACC128,
                   "%130", "%128", "%129", "%131", "%132");
  } else {
    static_assert(kTransA == 0 && kTransB == 0, "tf32 wgmma reads K-major operands only");
    GEMMT_WGMMA_TF32("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", GEMMT_D128,
                     GEMMT_ACC128, "%130", "%128", "%129");
  }
}

#define GEMMT_ACC32 GEMMT_ACC8(0), GEMMT_ACC8(8), GEMMT_ACC8(16), GEMMT_ACC8(24)
#define GEMMT_D32                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// D(64x64, fp32) (+)= A(64xK) * B(Kx64): the narrow tile's step.
template <int kKind, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n64(float (&d)[32], uint64_t da, uint64_t db,
                                             uint32_t accumulate) {
  if constexpr (kKind == kBF16) {
    GEMMT_WGMMA_16("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", GEMMT_D32, GEMMT_ACC32,
                   "%34", "%32", "%33", "%35", "%36");
  } else if constexpr (kKind == kF16) {
    GEMMT_WGMMA_16("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", GEMMT_D32, GEMMT_ACC32,
                   "%34", "%32", "%33", "%35", "%36");
  } else {
    static_assert(kTransA == 0 && kTransB == 0, "tf32 wgmma reads K-major operands only");
    GEMMT_WGMMA_TF32("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", GEMMT_D32, GEMMT_ACC32,
                     "%34", "%32", "%33");
  }
}

// One K step of the consumer's 64 x kBN block.
template <int kKind, int kTransA, int kTransB, int kBN>
__device__ __forceinline__ void wgmma_step(float (&d)[kBN / 2], uint64_t da, uint64_t db,
                                           uint32_t accumulate) {
  if constexpr (kBN == 256) {
    wgmma_m64n256<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else {
    wgmma_m64n64<kKind, kTransA, kTransB>(d, da, db, accumulate);
  }
}

// tf32 with A from registers: each thread holds four elements of the 64x8 A slice (see
// a_fragment_offsets), B comes from shared memory K-major as above.
#define GEMMT_WGMMA_TF32_RS(INSTR, DREGS, ACCS, P, A, B)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " " DREGS ", " A ", " B \
               ", p, 1, 1;\n}\n"                                                            \
               : ACCS                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate))

template <int kBN>
__device__ __forceinline__ void wgmma_step_tf32_rs(float (&d)[kBN / 2], const uint32_t (&a)[4],
                                                   uint64_t db, uint32_t accumulate) {
  if constexpr (kBN == 256) {
    GEMMT_WGMMA_TF32_RS("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", GEMMT_D128,
                        GEMMT_ACC128, "%133", "{%128, %129, %130, %131}", "%132");
  } else {
    GEMMT_WGMMA_TF32_RS("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", GEMMT_D32,
                        GEMMT_ACC32, "%37", "{%32, %33, %34, %35}", "%36");
  }
}

#undef GEMMT_WGMMA_16
#undef GEMMT_WGMMA_TF32
#undef GEMMT_WGMMA_TF32_RS
#undef GEMMT_ACC8
#undef GEMMT_ACC32
#undef GEMMT_ACC128
#undef GEMMT_D32
#undef GEMMT_D128

// ---- tf32 A from registers ----------------------------------------------------------------
// An M-major A stage holds four TMA boxes of 32 rows of M by 32 of K; each K row is 128
// bytes, and the 128B swizzle stores its 16-byte chunk c at c ^ (k % 8). wgmma wants from
// each thread the elements (m, k), (m + 8, k), (m, k + 4), (m + 8, k + 4) of every 64x8
// slice, m = 16 * warp + lane / 4 and k = lane % 4 (the mma.sync m16n8k8 pattern, one per
// warp). The 32 words one such load of a warp reads fall into 16 banks: a 2-way conflict
// on 16 scalar loads a k-block, small next to the 64x256x32 product they feed.
__device__ __forceinline__ uint32_t swizzled_mn_offset(int m, int k) {
  return static_cast<uint32_t>(k * 128 + (((m >> 2) ^ (k & 7)) << 4) + (m & 3) * 4);
}

// Offsets, from the start of a stage, of this thread's four A elements of the first k-step;
// k-step kk adds kk * 8 rows of 128 bytes (k % 8 does not change).
__device__ __forceinline__ void a_fragment_offsets(int cw, int warp, int lane, uint32_t (&off)[4]) {
  constexpr uint32_t kBoxBytes = 32 * 128;
  const uint32_t box = static_cast<uint32_t>(2 * cw + (warp >> 1)) * kBoxBytes;
  const int m = 16 * (warp & 1) + (lane >> 2);
  const int k = lane & 3;
  off[0] = box + swizzled_mn_offset(m, k);
  off[1] = box + swizzled_mn_offset(m + 8, k);
  off[2] = box + swizzled_mn_offset(m, k + 4);
  off[3] = box + swizzled_mn_offset(m + 8, k + 4);
}

// One k-block (four k-steps of 8) with A from registers: load the fragments, then issue and
// commit the group. `frag` must not be written again before this group has completed.
template <int kBN>
__device__ __forceinline__ void tf32_rs_kblock(float (&acc)[kBN / 2], uint32_t (&frag)[4][4],
                                               uint32_t a_stage, const uint32_t (&off)[4],
                                               uint64_t db, bool first) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) frag[kk][j] = ld_shared_b32(a_stage + off[j] + kk * 8 * 128);
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    // A K-step advances 32 bytes along B's K-major rows.
    wgmma_step_tf32_rs<kBN>(acc, frag[kk], db + kk * (32 >> 4), (!first || kk != 0) ? 1u : 0u);
  }
  wgmma_commit();
}

// Grouped raster over the tile grid: `group` tile rows are walked top to bottom before
// moving one tile column right, so the CTAs running at the same time share A and B panels
// in L2.
__device__ __forceinline__ void tile_coords(int t, const Params& p, int& tm, int& tn) {
  const int per_group = p.group * p.tiles_n;
  const int g = t / per_group;
  const int first = g * p.group;
  const int rows = min(p.tiles_m - first, p.group);
  const int r = t - g * per_group;
  tm = first + r % rows;
  tn = r / rows;
}

// C[row, col] and C[row, col + 1] from one accumulator pair.
template <typename T>
__device__ __forceinline__ void store_pair(const Params& p, T* row_ptr, int col, float v0,
                                           float v1) {
  if (col >= p.n) return;
  T* dst = row_ptr + col;
  const bool has_second = col + 1 < p.n;
  store_c_pair(dst, has_second, p.c_pair, v0, v1, p.alpha, p.beta);
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

// Writes the warpgroup's 64 x (2 * kAcc) block (rows row0.., columns n0..) straight from
// registers. Accumulator i of a thread sits at row 16*warp + lane/4 + 8*((i/2)%2) and column
// 8*(i/4) + 2*(lane%4) + i%2 of the block.
template <typename T, int kAcc>
__device__ __forceinline__ void store_block_direct(const Params& p, const float (&acc)[kAcc],
                                                   int row0, int n0, int warp_in_wg, int lane) {
  const int row = row0 + warp_in_wg * 16 + (lane >> 2);
  const int col0 = n0 + 2 * (lane & 3);
  T* const c = static_cast<T*>(p.c);
  if (row < p.m) {
    T* const r0 = c + static_cast<int64_t>(row) * p.ldc;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      store_pair<T>(p, r0, col0 + 8 * j, acc[4 * j], acc[4 * j + 1]);
    }
  }
  if (row + 8 < p.m) {
    T* const r1 = c + static_cast<int64_t>(row + 8) * p.ldc;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      store_pair<T>(p, r1, col0 + 8 * j, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
}

// The same block for a transposed C (Params::c_trans): block element (row, col) goes to
// C[col * ldc + row]. The eight lanes of a quad column hold eight consecutive rows, i.e.
// 8 consecutive elements of one line of C, so each store instruction still fills whole
// 32-byte sectors.
template <typename T, int kAcc>
__device__ __forceinline__ void store_block_transposed(const Params& p, const float (&acc)[kAcc],
                                                       int row0, int n0, int warp_in_wg, int lane) {
  const int row = row0 + warp_in_wg * 16 + (lane >> 2);
  const int col0 = n0 + 2 * (lane & 3);
  T* const c = static_cast<T*>(p.c);
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = col0 + 8 * j + e;
      if (col >= p.n) continue;
      T* const line = c + static_cast<int64_t>(col) * p.ldc;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (row + 8 * h < p.m) {
          store_c_pair(line + row + 8 * h, false, false, acc[4 * j + 2 * h + e], 0.f, p.alpha,
                       p.beta);
        }
      }
    }
  }
}

template <typename T, int kAcc>
__device__ __forceinline__ void store_block(const Params& p, const float (&acc)[kAcc], int row0,
                                            int n0, int warp_in_wg, int lane) {
  if (p.c_trans) {
    store_block_transposed<T, kAcc>(p, acc, row0, n0, warp_in_wg, lane);
  } else {
    store_block_direct<T, kAcc>(p, acc, row0, n0, warp_in_wg, lane);
  }
}

// A split-k slice's block: float32, unscaled, into its slice of the partial buffer (in C's
// orientation, so that one reduction serves both).
template <int kAcc>
__device__ __forceinline__ void store_partial_block(const Params& p, const float (&acc)[kAcc],
                                                    int split, int row0, int n0, int warp_in_wg,
                                                    int lane) {
  Params q = p;
  q.c = p.partial + static_cast<int64_t>(split) * p.m * p.n;
  q.ldc = p.c_trans ? p.m : p.n;
  q.alpha = 1.f;
  q.beta = 0.f;
  q.c_pair = p.n % 2 == 0;
  store_block<float, kAcc>(q, acc, row0, n0, warp_in_wg, lane);
}

// One round of the staged epilogue of a consumer warpgroup: wait until TMA has read the
// buffer of the previous round, fill it, make the writes visible to the async proxy, and
// let one thread hand it to TMA. The global writes then overlap the next tile's main loop;
// only the reuse of the buffer waits for TMA.
// With an activation or a pre-activation output, `post` then rewrites the filled buffer.
template <class Fill, class Post, class Issue>
__device__ __forceinline__ void staged_store_round(int cw, Fill fill, bool has_post, Post post,
                                                   Issue issue) {
  const bool leader = (threadIdx.x & 127) == 0;
  const uint32_t bar_id = 1 + cw;  // 0 is __syncthreads
  if (leader) bulk_wait_read_all();
  named_barrier_sync(bar_id, 128);
  fill();
  if (has_post) {
    named_barrier_sync(bar_id, 128);
    post();
  }
  fence_proxy_async_smem();
  named_barrier_sync(bar_id, 128);
  if (leader) {
    issue();
    bulk_commit();
  }
}

// The epilogue (bias, pre-activation output, activation) over one staged round: two
// 128B-swizzled boxes of 64 lines, whose line r holds C row rbase + r and 16-byte chunk c of
// box b holds the C columns from cbase + b * (128 / sizeof(T)) + c * (16 / sizeof(T)). The
// fill has applied alpha and beta and rounded to T. One rolled loop over 16-byte chunks, so
// the epilogue's code exists once per kernel instead of once per accumulator, and the fill
// keeps its short dependency chains (a bias load there waited behind every shared store).
// A 16-byte chunk as 16 / sizeof(T) floats, and back (rounded to nearest even).
template <typename T>
__device__ __forceinline__ void unpack_chunk(const uint4& c, float (&f)[16 / sizeof(T)]) {
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 4) {
      f[i] = __uint_as_float(w[i]);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      __half2 h;
      memcpy(&h, &w[i], 4);
      const float2 v = __half22float2(h);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack_chunk(const float (&f)[16 / sizeof(T)]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 4) {
      w[i] = __float_as_uint(f[i]);
    } else {
      w[i] = pack2<T>(f[2 * i], f[2 * i + 1]);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The epilogue (bias, pre-activation output, activation) over one staged round: two
// 128B-swizzled boxes of 64 lines, whose line r holds C row rbase + r and 16-byte chunk c of
// box b holds the C columns from cbase + b * (128 / sizeof(T)) + c * (16 / sizeof(T)). The
// fill has applied alpha and beta and rounded to T. One rolled loop over 16-byte chunks (two
// in flight), so the epilogue's code exists once per kernel instead of once per accumulator;
// the bias and the pre-activation move as 16-byte vectors where aligned.
template <typename T>
__device__ __forceinline__ void epilogue_post_round(const EpilogueParams& e, uint32_t buf,
                                                    int rbase, int cbase, int rows, int cols) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  constexpr int kBoxCols = 128 / static_cast<int>(sizeof(T));
  const EpilogueView<T> v = e.view<T>();
  const bool bias_vec =
      v.bias != nullptr && !v.bias_per_row && (reinterpret_cast<uintptr_t>(v.bias) & 15u) == 0;
  const bool pre_vec = v.preact != nullptr && (reinterpret_cast<uintptr_t>(v.preact) & 15u) == 0 &&
                       (v.ld_preact * static_cast<int64_t>(sizeof(T))) % 16 == 0;
#pragma unroll 2
  for (int q = threadIdx.x & 127; q < 2 * 64 * 8; q += 128) {
    const int b = q >> 9, r = (q >> 3) & 63, c = q & 7;
    const int row = rbase + r;
    const int col0 = cbase + b * kBoxCols + c * kPer;
    if (row >= rows || col0 >= cols) continue;
    const bool full = col0 + kPer <= cols;
    const uint32_t addr = buf + b * kCBoxBytes + r * 128 + ((c ^ (r & 7)) << 4);
    float z[kPer];
    unpack_chunk<T>(ld_shared_v4(addr), z);
    if (v.bias != nullptr) {
      if (bias_vec && full) {
        float bz[kPer];
        unpack_chunk<T>(__ldg(reinterpret_cast<const uint4*>(v.bias + col0)), bz);
#pragma unroll
        for (int i = 0; i < kPer; ++i) z[i] += bz[i];
      } else {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          if (col0 + i < cols) z[i] += to_float(v.bias[v.bias_per_row ? row : col0 + i]);
        }
      }
    }
    if (v.preact != nullptr) {
      T* dst = v.preact + static_cast<int64_t>(row) * v.ld_preact + col0;
      if (pre_vec && full) {
        *reinterpret_cast<uint4*>(dst) = pack_chunk<T>(z);
      } else {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          if (col0 + i < cols) dst[i] = from_float<T>(z[i]);
        }
      }
    }
    if (v.act != Activation::kNone) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if constexpr (sizeof(T) == 2) {
          z[i] = activation_16bit_inline(v.act, z[i]);
        } else {
          z[i] = activation_out_of_line(v.act, z[i]);
        }
      }
    }
    const uint4 out = pack_chunk<T>(z);
    st_shared_v4(addr, out.x, out.y, out.z, out.w);
  }
}

__device__ __forceinline__ bool has_post_pass(const EpilogueParams& e) {
  return e.active;
}

// The wide tile's block through shared memory: each round fills two 128B-swizzled 64-row
// boxes of the warpgroup's staging buffer, which TMA writes out, clipping the edges.
template <typename T>
__device__ __forceinline__ void store_block_tma(const Params& p, const CUtensorMap* map,
                                                const float (&acc)[128], uint32_t buf, int row0,
                                                int n0, int warp_in_wg, int lane, int cw) {
  constexpr int kElt = static_cast<int>(sizeof(T));
  constexpr int kBoxCols = 128 / kElt;
  constexpr int kRoundCols = 2 * kBoxCols;
  constexpr int kRounds = kBNWide / kRoundCols;
  constexpr int kGroupsPerRound = kRoundCols / 8;  // accumulator column groups of 8
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int rd = 0; rd < kRounds; ++rd) {
    auto fill = [&] {
#pragma unroll
      for (int jj = 0; jj < kGroupsPerRound; ++jj) {
        const int j = rd * kGroupsPerRound + jj;
        const int box = (jj * 8) / kBoxCols;
        const int byte_in_row = ((jj * 8) % kBoxCols + 2 * t) * kElt;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp_in_wg * 16 + g + 8 * h;
          float v0 = acc[4 * j + 2 * h] * p.alpha;
          float v1 = acc[4 * j + 2 * h + 1] * p.alpha;
          if (p.beta != 0.f) {  // beta == 0 must not read C: it may hold NaN
            const int gr = row0 + r;
            const int gc = n0 + 8 * j + 2 * t;
            if (gr < p.m && gc < p.n) {
              const T* src = static_cast<const T*>(p.c) + static_cast<int64_t>(gr) * p.ldc + gc;
              v0 += p.beta * to_float(*(src));
              if (gc + 1 < p.n) v1 += p.beta * to_float(*(src + 1));
            }
          }
          const uint32_t addr = buf + box * kCBoxBytes + r * 128 +
                                ((((byte_in_row >> 4) ^ (r & 7))) << 4) + (byte_in_row & 15);
          if constexpr (kElt == 4) {
            st_shared_v2_f32(addr, v0, v1);
          } else {
            st_shared_b32(addr, pack2<T>(v0, v1));
          }
        }
      }
    };
    auto issue = [&] {
      if (row0 >= p.m) return;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int col = n0 + rd * kRoundCols + b * kBoxCols;
        if (col < p.n) tma_store(map, buf + b * kCBoxBytes, col, row0);
      }
    };
    auto post = [&] { epilogue_post_round<T>(p.epi, buf, row0, n0 + rd * kRoundCols, p.m, p.n); };
    staged_store_round(cw, fill, has_post_pass(p.epi), post, issue);
  }
}

// The same for a transposed float C (Params::c_trans): block row r is C column row0 + r and
// block column c is C row n0 + c. A round covers 64 block columns, i.e. 64 lines of C, in two
// boxes of 32 block rows (128 bytes of a line each). The lanes of a warp write eight
// consecutive floats of four lines at a time; with the swizzle those land in 32 different
// banks.
__device__ __forceinline__ void store_block_tma_transposed(const Params& p, const CUtensorMap* map,
                                                           const float (&acc)[128], uint32_t buf,
                                                           int row0, int n0, int warp_in_wg,
                                                           int lane, int cw) {
  constexpr int kLinesPerRound = 64;
  constexpr int kRounds = kBNWide / kLinesPerRound;
  const int g = lane >> 2;
  const int t = lane & 3;
  const uint32_t box = buf + (warp_in_wg >> 1) * kCBoxBytes;
  const float* c = static_cast<const float*>(p.c);
#pragma unroll
  for (int rd = 0; rd < kRounds; ++rd) {
    auto fill = [&] {
#pragma unroll
      for (int jj = 0; jj < kLinesPerRound / 8; ++jj) {
        const int j = rd * (kLinesPerRound / 8) + jj;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int line = 8 * jj + 2 * t + e;  // line of C within the round, row of the box
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = warp_in_wg * 16 + g + 8 * h;
            const int rb = r & 31;  // float within the 128-byte line of the box
            float v = acc[4 * j + 2 * h + e] * p.alpha;
            if (p.beta != 0.f) {
              const int gc = row0 + r;
              const int gl = n0 + 8 * j + 2 * t + e;
              if (gc < p.m && gl < p.n) v += p.beta * c[static_cast<int64_t>(gl) * p.ldc + gc];
            }
            st_shared_f32(box + line * 128 + (((rb >> 2) ^ (line & 7)) << 4) + (rb & 3) * 4, v);
          }
        }
      }
    };
    auto issue = [&] {
      const int line0 = n0 + rd * kLinesPerRound;
      if (line0 >= p.n) return;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int col = row0 + 32 * b;
        if (col < p.m) tma_store(map, buf + b * kCBoxBytes, col, line0);
      }
    };
    // Box line l is C row n0 + rd * 64 + l; box b covers C columns row0 + 32 b ...
    auto post = [&] {
      epilogue_post_round<float>(p.epi, buf, n0 + rd * kLinesPerRound, row0, p.n, p.m);
    };
    staged_store_round(cw, fill, has_post_pass(p.epi), post, issue);
  }
}

#endif  // GEMMT_SM90_DEVICE_CODE

template <int kKind, bool kAMn, bool kBMn, int kCluster, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_gemm_kernel(const __grid_constant__ CUtensorMap tma_a,
                     const __grid_constant__ CUtensorMap tma_b,
                     const __grid_constant__ CUtensorMap tma_c, const Params p) {
#if defined(GEMMT_SM90_DEVICE_CODE)
  using T = typename KindTraits<kKind>::T;
  using Cfg = TileCfg<kBN>;
  constexpr int kStages = Cfg::kStages;
  constexpr int kBBytes = Cfg::kBBytes;
  constexpr int kBK = kKind == kTF32 ? 32 : 64;               // 128 bytes of K per stage row
  constexpr int kMnRows = 128 / static_cast<int>(sizeof(T));  // M/N extent of an MN-major box
  constexpr int kMnBox = mn_box_bytes<kKind>();
  // tf32 with an M-major A: A goes through registers (the only transposable tf32 operand).
  constexpr bool kARegs = kKind == kTF32 && kAMn;
  static_assert(kCluster == 1 || kBN == kBNWide, "only the wide tile runs in CTA pairs");
  static_assert(!(kKind == kTF32 && kBMn), "tf32 wgmma reads B K-major only");

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Both CTAs of a cluster compute the same offsets, which multicast relies on.
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t smem_a = base;
  const uint32_t smem_b = base + kStages * kABytes;
  const uint32_t smem_c = smem_b + kStages * kBBytes;
  const uint32_t bars = smem_c + Cfg::kCBytes;
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (kStages + s); };

  const int wg = threadIdx.x >> 7;
  const int warp_in_wg = (threadIdx.x >> 5) & 3;
  const int lane = threadIdx.x & 31;
  uint32_t rank = 0;
  if constexpr (kCluster > 1) rank = cluster_ctarank();

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), 1);  // the producer's arrive.expect_tx; bytes do the rest
      mbar_init(empty_bar(s), kConsumerWarps * kCluster);
    }
    fence_barrier_init();
  }
  // The peer may multicast into our ring or arrive on our barriers only after they exist.
  if constexpr (kCluster > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }

  const int num_clusters = gridDim.x / kCluster;
  const int cluster_id = blockIdx.x / kCluster;
  const int total_units = p.tiles_m * p.tiles_n * p.splits;

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (warp_in_wg == 0 && lane == 0) {
      prefetch_tmap(&tma_a);
      prefetch_tmap(&tma_b);
      int stage = 0;
      uint32_t phase = 0;
      for (int u = cluster_id; u < total_units; u += num_clusters) {
        const Unit w = unit_of(u, p);
        int tm, tn;
        tile_coords(w.tile, p, tm, tn);
        const int m0 = (tm * kCluster + static_cast<int>(rank)) * kBM;
        const int n0 = tn * kBN;
        for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
          // Parity trick: on the first lap the "previous" phase counts as complete.
          mbar_wait(empty_bar(stage), phase ^ 1u);
          const uint32_t fb = full_bar(stage);
          mbar_arrive_expect_tx(fb, Cfg::kStageBytes);
          const int k0 = kb * kBK;
          const uint32_t sa = smem_a + stage * kABytes;
          const uint32_t sb = smem_b + stage * kBBytes;
          if constexpr (!kAMn) {
            tma_load(sa, &tma_a, fb, k0, m0);
          } else {
#pragma unroll
            for (int q = 0; q < kBM / kMnRows; ++q) {
              tma_load(sa + q * kMnBox, &tma_a, fb, m0 + q * kMnRows, k0);
            }
          }
          if constexpr (!kBMn) {
            if constexpr (kBN == kBNNarrow) {
              tma_load(sb, &tma_b, fb, k0, n0);  // one box of 64 rows
            } else if constexpr (kCluster == 1) {
              tma_load(sb, &tma_b, fb, k0, n0);
              tma_load(sb + kBBytes / 2, &tma_b, fb, k0, n0 + kBN / 2);
            } else {
              tma_load_multicast(sb + rank * (kBBytes / 2), &tma_b, fb, k0,
                                 n0 + static_cast<int>(rank) * (kBN / 2), 0x3);
            }
          } else {
#pragma unroll
            for (int j = 0; j < kBN / 64; ++j) {
              if constexpr (kCluster == 1) {
                tma_load(sb + j * kMnBox, &tma_b, fb, n0 + 64 * j, k0);
              } else {
                if ((j >> 1) == static_cast<int>(rank)) {
                  tma_load_multicast(sb + j * kMnBox, &tma_b, fb, n0 + 64 * j, k0, 0x3);
                }
              }
            }
          }
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
    __syncwarp();
  } else {
    setmaxnreg_inc<232>();
    const int cw = wg - 1;  // which 64-row half of the tile this warpgroup owns
    // A K-step advances 32 bytes along a K-major row, or 16 rows (2 KB) of an MN-major box.
    constexpr uint32_t kAStep = (kAMn ? 16 * 128 : 32) >> 4;
    constexpr uint32_t kBStep = (kBMn ? 16 * 128 : 32) >> 4;
    constexpr uint32_t kALbo = kAMn ? kMnBox : 16;
    constexpr uint32_t kBLbo = kBMn ? kMnBox : 16;
    float acc[Cfg::kAcc];
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.f;
    // Hands stage s back to the producer(s): one arrive per warp on each CTA of the cluster.
    auto release = [&](int s) {
      if constexpr (kCluster == 1) {
        if (lane == 0) mbar_arrive_local(empty_bar(s));
      } else {
        if (lane < kCluster) mbar_arrive_cluster(empty_bar(s), lane);
      }
    };
    // Register-sourced A: this thread's four offsets into the stage (see a_fragment_offsets).
    uint32_t a_off[4] = {0, 0, 0, 0};
    if constexpr (kARegs) a_fragment_offsets(cw, warp_in_wg, lane, a_off);
    int stage = 0;
    uint32_t phase = 0;
    for (int u = cluster_id; u < total_units; u += num_clusters) {
      const Unit w = unit_of(u, p);
      int tm, tn;
      tile_coords(w.tile, p, tm, tn);
      const int m0 = (tm * kCluster + static_cast<int>(rank)) * kBM;
      const int n0 = tn * kBN;
      int prev_stage = 0;
      // Called once k-block kb's group is issued: every group but that one has then finished
      // reading its stage, so the previous stage goes back to the producer.
      auto retire_previous = [&](int kb) {
        if (kb > w.kb_begin) {
          wgmma_wait<1>();
          release(prev_stage);
        }
        prev_stage = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      };
      if constexpr (kARegs) {
        // The fragments of k-block kb are loaded while the group of kb - 1 still reads its
        // own, so two register sets alternate and the loop runs two k-blocks per trip.
        uint32_t frag0[4][4], frag1[4][4];
        for (int kb2 = w.kb_begin; kb2 < w.kb_end; kb2 += 2) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int kb = kb2 + h;
            if (kb >= w.kb_end) break;
            mbar_wait(full_bar(stage), phase);
            const uint64_t db = make_desc(smem_b + stage * kBBytes, kBLbo, 1024);
            tf32_rs_kblock<kBN>(acc, h == 0 ? frag0 : frag1, smem_a + stage * kABytes, a_off, db,
                                kb == w.kb_begin);
            retire_previous(kb);
          }
        }
      } else {
        for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
          mbar_wait(full_bar(stage), phase);
          // Rows 64*cw.. of the A tile: 8 KB into the stage in both layouts.
          const uint64_t da = make_desc(smem_a + stage * kABytes + cw * (kABytes / 2), kALbo, 1024);
          const uint64_t db = make_desc(smem_b + stage * kBBytes, kBLbo, 1024);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            wgmma_step<kKind, kAMn ? 1 : 0, kBMn ? 1 : 0, kBN>(
                acc, da + kk * kAStep, db + kk * kBStep, (kb != w.kb_begin || kk != 0) ? 1u : 0u);
          }
          wgmma_commit();
          retire_previous(kb);
        }
      }
      wgmma_wait<0>();
      fence_accumulators(acc);
      if (w.kb_end > w.kb_begin) release(prev_stage);

      if (p.splits > 1) {
        store_partial_block(p, acc, w.split, m0 + cw * 64, n0, warp_in_wg, lane);
      } else if (kBN == kBNWide && p.tma_store) {
        if constexpr (kBN == kBNWide) {
          const uint32_t buf = smem_c + cw * kCStageBytes;
          if (kARegs && p.c_trans) {
            store_block_tma_transposed(p, &tma_c, acc, buf, m0 + cw * 64, n0, warp_in_wg, lane, cw);
          } else {
            store_block_tma<T>(p, &tma_c, acc, buf, m0 + cw * 64, n0, warp_in_wg, lane, cw);
          }
        }
      } else {
        store_block<T>(p, acc, m0 + cw * 64, n0, warp_in_wg, lane);
      }
      fence_accumulators(acc);
    }
    // Shared memory must outlive the last TMA store's reads; global completion before exit.
    if (kBN == kBNWide && p.tma_store && (threadIdx.x & 127) == 0) bulk_wait_all();
  }
  // No CTA may leave while its peer can still arrive on its barriers.
  if constexpr (kCluster > 1) cluster_sync();
#endif  // GEMMT_SM90_DEVICE_CODE
}

// ---- Host side ---------------------------------------------------------------------

// Geometry of one operand as a 2-D tensor map: dim 0 is the contiguous one.
struct MapShape {
  uint64_t dims[2];
  uint64_t stride_bytes;  // of dim 1
  uint32_t box[2];
};

struct Plan {
  int kind;
  int elt;
  int bn;  // tile width: kBNWide or kBNNarrow
  bool a_mn, b_mn;
  MapShape a, b;
};

// Rows of a K-major B box: half the wide tile (two boxes, or one per CTA of a pair), the
// whole narrow one.
uint32_t b_box_rows(int bn) {
  return bn == kBNWide ? kBNWide / 2 : kBNNarrow;
}

// Fills `shape` for an operand contiguous along the dimension of size `inner` whose other
// dimension (`outer`) has element stride `outer_stride`. False when TMA cannot take it.
bool map_shape(int64_t inner, int64_t outer, int64_t outer_stride, int elt, uint32_t box_inner,
               uint32_t box_outer, MapShape* shape) {
  uint64_t stride_bytes;
  if (outer == 1) {
    // The stride of a single row is never used, but the encoder still checks it.
    stride_bytes = static_cast<uint64_t>((inner * elt + 15) / 16 * 16);
  } else {
    if (outer_stride < inner) return false;  // overlapping rows (broadcast views)
    stride_bytes = static_cast<uint64_t>(outer_stride) * elt;
    if (stride_bytes % 16 != 0 || stride_bytes >= (uint64_t{1} << 40)) return false;
  }
  shape->dims[0] = static_cast<uint64_t>(inner);
  shape->dims[1] = static_cast<uint64_t>(outer);
  shape->stride_bytes = stride_bytes;
  shape->box[0] = box_inner;
  shape->box[1] = box_outer;
  return true;
}

// An operand of mn rows (M for A, N for B) and k columns, element (r, p) at
// ptr[r * stride_mn + p * stride_k], as a tensor map: K-major (box of 128 bytes of K by
// box_rows rows) or, when mn_ok, MN-major (boxes of 128 bytes along M/N by the stage's K).
// False when TMA cannot read it in place (base or row stride not 16-byte aligned, no unit
// stride, overlapping rows). mn_ok: 16-bit operands, and tf32 A (read through registers).
bool map_operand(const void* ptr, int64_t stride_k, int64_t stride_mn, int64_t mn, int64_t k,
                 int kind, uint32_t box_rows, bool mn_ok, MapShape* shape, bool* mn_major) {
  if (!aligned16(ptr)) return false;
  const int elt = kind == kTF32 ? 4 : 2;
  const uint32_t row_elts = 128u / elt;
  if (stride_k == 1 && map_shape(k, mn, stride_mn, elt, row_elts, box_rows, shape)) {
    *mn_major = false;
    return true;
  }
  if (mn_ok && stride_mn == 1 && map_shape(mn, k, stride_k, elt, row_elts, row_elts, shape)) {
    *mn_major = true;
    return true;
  }
  return false;
}

bool map_a(const GemmArgs& args, int kind, MapShape* shape, bool* mn_major) {
  return map_operand(args.a, args.a_stride_k, args.a_stride_m, args.m, args.k, kind, kBM, true,
                     shape, mn_major);
}

// bn: the tile width, which sets the rows of a K-major box (any width serves as a probe of
// whether TMA can read B in place).
bool map_b(const GemmArgs& args, int kind, int bn, MapShape* shape, bool* mn_major) {
  return map_operand(args.b, args.b_stride_k, args.b_stride_n, args.n, args.k, kind, b_box_rows(bn),
                     kind != kTF32, shape, mn_major);
}

// Split-k for outputs with too few tiles to occupy the GPU: the persistent CTAs take
// (tile, k-slice) units, each slice writes a float32 partial tile, and one pass adds the
// slices in order (deterministic) and applies alpha, beta and the rounding. A slice keeps
// at least kMinKbPerSplit k-blocks so the ring reaches a steady state.
constexpr int kMinKbPerSplit = 4;
constexpr int kMaxSplits = 64;

struct SplitPlan {
  int splits = 1;
  int kb_per_split = 0;
};

int64_t k_blocks(const GemmArgs& args) {
  const int64_t per_kb = 128 / static_cast<int64_t>(element_size(args.dtype));
  return (args.k + per_kb - 1) / per_kb;
}

int64_t tile_count(const GemmArgs& args, int bn) {
  return ((args.m + kBM - 1) / kBM) * ((args.n + bn - 1) / bn);
}

// The plan for (at most) `splits` slices: equal slices, none empty.
SplitPlan split_plan(const GemmArgs& args, int64_t splits) {
  SplitPlan sp;
  const int64_t num_kb = k_blocks(args);
  sp.kb_per_split = static_cast<int>(num_kb);
  if (splits > num_kb) splits = num_kb;
  if (splits < 2) return sp;
  const int64_t per = (num_kb + splits - 1) / splits;
  sp.kb_per_split = static_cast<int>(per);
  sp.splits = static_cast<int>((num_kb + per - 1) / per);
  return sp;
}

// Estimated time, in microseconds, of the product with `splits` slices. The main kernel
// runs ceil(units / SMs) waves of units of kb_per_split k-blocks plus a fixed cost per unit
// (filling the ring, the epilogue) and can be no faster than reading A and B once from
// memory; a split adds the reduction pass, which reads every partial and writes C. The
// constants are per-SM times of one k-block measured on H100 (gemm_tc_selftest -sweep).
// DRAM is streamed at its full rate only with loads in flight from about half of the SMs
// or more: with fewer busy SMs the memory floor rises in proportion. Without that term the
// model stops at 48 units for 256x256x65536 (24 slices), where 64 units (32 slices) measured
// 11% faster; 1024x64x65536 likewise runs fastest at 64 units.
double split_cost_us(const GemmArgs& args, int bn, const SplitPlan& sp) {
  constexpr double kKbUsWide = 0.56;          // 128x256x(128 B of K): tensor-core bound
  constexpr double kKbUsNarrow = 0.20;        // 128x64x(128 B of K), 16-bit
  constexpr double kKbUsNarrowTf32 = 0.35;    // the same in tf32 (A often through registers)
  constexpr double kUnitFixedKb = 3.0;        // ring fill and epilogue, in k-blocks
  constexpr double kBytesPerUs = 2.6e6;       // DRAM, bytes per microsecond
  constexpr double kStreamingSmShare = 0.48;  // busy SMs that reach kBytesPerUs
  constexpr double kReduceFixedUs = 3.0;      // the extra launch and its tail
  const double sms = args.sm_count > 0 ? args.sm_count : 1;
  const double units = static_cast<double>(tile_count(args, bn)) * sp.splits;
  const double waves = std::ceil(units / sms);
  const double kb_us =
      bn == kBNWide ? kKbUsWide : (tc_kind_of(args) == kTF32 ? kKbUsNarrowTf32 : kKbUsNarrow);
  const double elt = static_cast<double>(element_size(args.dtype));
  const double operand_bytes = (static_cast<double>(args.m) + args.n) * args.k * elt;
  const double compute = waves * (sp.kb_per_split + kUnitFixedKb) * kb_us;
  // A product of one M tile (a decode-sized x against a weight) only streams B: DRAM's rate
  // needs nearly every SM loading, and SMs idle in the last wave of units stream nothing.
  // (Measured on H100: 4096x11008 weights with m <= 64 ran at 0.47-0.74 of cuBLAS on 64-wide
  // tiles in 1.3 waves, which the 48% rule below rated as full speed.)
  const double stream_share = args.m <= kBM
                                  ? units / (waves * sms)
                                  : std::min(1.0, std::min(units, sms) / (kStreamingSmShare * sms));
  double t = std::max(compute, operand_bytes / (kBytesPerUs * stream_share));
  if (sp.splits > 1) {
    const double mn = static_cast<double>(args.m) * args.n;
    const double c_bytes = mn * elt * (args.beta != 0.f ? 2.0 : 1.0);
    t += (mn * 4.0 * sp.splits + c_bytes) / kBytesPerUs + kReduceFixedUs;
  }
  return t;
}

struct TileChoice {
  int bn = kBNWide;
  SplitPlan sp;
  double us = 0.0;
};

// The split count with the lowest estimated time for tiles bn wide (1 when C alone has
// tiles for at least half of the SMs).
TileChoice best_splits(const GemmArgs& args, int bn) {
  const int64_t tiles = tile_count(args, bn);
  const int64_t sms = args.sm_count > 0 ? args.sm_count : 1;
  TileChoice best;
  best.bn = bn;
  best.sp = split_plan(args, 1);
  best.us = split_cost_us(args, bn, best.sp);
  if (tiles * 2 > sms) return best;
  int64_t max_splits = std::min<int64_t>(kMaxSplits, k_blocks(args) / kMinKbPerSplit);
  for (int64_t s = 2; s <= max_splits; ++s) {
    const SplitPlan sp = split_plan(args, s);
    if (sp.splits != s) continue;  // rounds to a count already tried
    const double t = split_cost_us(args, bn, sp);
    if (t < best.us) {
      best.us = t;
      best.sp = sp;
    }
  }
  return best;
}

// Tile width and split count of the kernel's problem. Outputs up to 64 wide take the narrow
// tile. Wider ones take the wide tile (twice the tensor-core work per byte of shared memory
// read) unless it leaves more than half of the SMs idle and the narrow tile, four times as
// many of them and unsplit, is modelled faster than the wide one with its best split:
// 1000^3 runs as 32 wide or 128 narrow tiles. A split narrow tile is not considered: in the
// H100 sweeps (gemm_tc_selftest --sweep) it was within 3% of the best wide split or behind
// it, but for one shape in one run (tf32 512x512x16384) that the next run did not repeat.
// The model is evaluated several times per product (planning, workspace, launch), so its
// last answer is kept per thread.
TileChoice choose_tile(const GemmArgs& args) {
  struct Key {
    int64_t m = -1, n = -1, k = -1;
    int dtype = -1, sms = -1;
    bool beta = false;
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && dtype == o.dtype && sms == o.sms && beta == o.beta;
    }
  };
  thread_local Key last_key;
  thread_local TileChoice last;
  const Key key{args.m,        args.n,          args.k, static_cast<int>(args.dtype),
                args.sm_count, args.beta != 0.f};
  if (key == last_key) return last;
  TileChoice best;
  if (args.n <= kBNNarrow) {
    best = best_splits(args, kBNNarrow);
  } else {
    best = best_splits(args, kBNWide);
    const int64_t sms = args.sm_count > 0 ? args.sm_count : 1;
    if (tile_count(args, kBNWide) * 2 <= sms) {
      TileChoice narrow;
      narrow.bn = kBNNarrow;
      narrow.sp = split_plan(args, 1);
      narrow.us = split_cost_us(args, kBNNarrow, narrow.sp);
      if (narrow.us < best.us) best = narrow;
    }
  }
  last_key = key;
  last = best;
  return best;
}

std::size_t partial_bytes(const GemmArgs& args, const SplitPlan& sp) {
  if (sp.splits < 2) return 0;
  const std::size_t b = static_cast<std::size_t>(sp.splits) * static_cast<std::size_t>(args.m) *
                        static_cast<std::size_t>(args.n) * sizeof(float);
  return (b + 255) / 256 * 256;
}

// What the kernel runs: the caller's product, or (c_trans) C^T = B^T A^T on the same memory.
struct Problem {
  GemmArgs args;
  bool c_trans = false;
  int bn = kBNWide;  // tile width (choose_tile unless a benchmark forces one)
};

// tf32 wgmma reads B K-major only, while a @ b with a row-major b (the common case) has B
// contiguous along N. Read the other way round, that B is an M-major A of C^T = B^T A^T,
// which the register-sourced form takes in place, and a row-major A is a K-major B: the
// product runs with no copy and writes C transposed. Not for narrow outputs (they would
// become 64-row tiles of a 128-row CTA; their B is small to copy), nor when A is M-major
// (then A already goes through registers and only B is copied).
bool swap_for_tf32(const GemmArgs& args) {
  if (tc_kind_of(args) != kTF32 || args.n <= kBNNarrow) return false;
  MapShape probe;
  bool mn = false;
  if (map_b(args, kTF32, kBNNarrow, &probe, &mn)) return false;
  if (map_a(args, kTF32, &probe, &mn) && mn) return false;
  return map_operand(args.b, args.b_stride_k, args.b_stride_n, args.n, args.k, kTF32, kBM, true,
                     &probe, &mn) &&
         mn;
}

Problem problem_for(const GemmArgs& args) {
  Problem pr;
  pr.args = args;
  if (!swap_for_tf32(args)) {
    pr.bn = choose_tile(pr.args).bn;
    return pr;
  }
  GemmArgs& t = pr.args;
  t.m = args.n;
  t.n = args.m;
  t.a = args.b;
  t.a_stride_m = args.b_stride_n;
  t.a_stride_k = args.b_stride_k;
  t.b = args.a;
  t.b_stride_n = args.a_stride_m;
  t.b_stride_k = args.a_stride_k;
  pr.c_trans = true;
  pr.bn = choose_tile(pr.args).bn;
  return pr;
}

bool make_plan(const Problem& pr, Plan* plan) {
#if !defined(GEMMT_HAS_SM90A)
  (void)pr;
  (void)plan;
  return false;
#else
  const GemmArgs& args = pr.args;
  if (args.cc_major != 9 || args.cc_minor != 0) return false;
  // Largest m, n, k accepted: TMA coordinates and tile origins are 32-bit signed.
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1024;
  const int kind = tc_kind_of(args);
  if (kind < 0) return false;
  if (args.m < 1 || args.n < 1 || args.k < 1) return false;
  if (args.m > kMaxDim || args.n > kMaxDim || args.k > kMaxDim) return false;
  if (args.a == nullptr || args.b == nullptr || args.c == nullptr) return false;
  // The lines of C (rows, or columns of the tile grid when transposed) must not overlap.
  if (pr.c_trans ? (args.ldc < args.m && args.n > 1) : (args.ldc < args.n && args.m > 1)) {
    return false;
  }
  const int elt = static_cast<int>(element_size(args.dtype));
  Plan pl;
  pl.kind = kind;
  pl.elt = elt;
  pl.bn = pr.bn;
  if (!map_a(args, kind, &pl.a, &pl.a_mn) || !map_b(args, kind, pl.bn, &pl.b, &pl.b_mn)) {
    return false;
  }
  // Tile indices are 32-bit.
  const int64_t tiles = ((args.m + kBM - 1) / kBM) * ((args.n + pl.bn - 1) / pl.bn);
  if (tiles > INT32_MAX / 2) return false;
  if (plan != nullptr) *plan = pl;
  return true;
#endif
}

// A driver entry point, fetched through the runtime so that nothing links libcuda; nullptr
// when the driver does not have it.
void* driver_entry_point(const char* name) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &status);
#else
  cudaError_t err = cudaGetDriverEntryPoint(name, &ptr, cudaEnableDefault, &status);
#endif
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
    if (err != cudaSuccess) (void)cudaGetLastError();
    return nullptr;
  }
  return ptr;
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(
      driver_entry_point("cuTensorMapEncodeTiled"));
  return fn;
}

// Tensor maps are encoded by the driver, which refuses to work for a thread that has no
// current context (CUDA_ERROR_INVALID_CONTEXT). The runtime makes its primary context
// current only at a thread's first runtime call that needs one, so a thread whose first CUDA
// work is a gemmt product has none: the autograd engine's worker thread, or any thread
// started after the library's kernel attributes were set (those calls happen once per
// process). cudaSetDevice binds the primary context of the current device.
cudaError_t bind_current_context() {
  static const auto get_current =
      reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(driver_entry_point("cuCtxGetCurrent"));
  CUcontext ctx = nullptr;
  if (get_current != nullptr && get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr) {
    return cudaSuccess;
  }
  int device = 0;
  GEMMT_RETURN_IF_ERROR(cudaGetDevice(&device));
  return cudaSetDevice(device);
}

bool encode(CUtensorMap* map, const void* ptr, const MapShape& s, int kind) {
  PFN_cuTensorMapEncodeTiled_v12000 fn = tensor_map_encoder();
  if (fn == nullptr) return false;
  const CUtensorMapDataType dtype = kind == kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                    : kind == kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const cuuint64_t dims[2] = {s.dims[0], s.dims[1]};
  const cuuint64_t strides[1] = {s.stride_bytes};
  const cuuint32_t box[2] = {s.box[0], s.box[1]};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = fn(map, dtype, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// How many 2-CTA clusters of this kernel fit on the device at once; the answer depends only
// on the device (every instantiation has the same block size and shared memory).
template <typename Kernel>
int max_pair_clusters(Kernel kernel, int sm_count) {
  constexpr int kCacheSize = 64;
  static std::atomic<int> cache[kCacheSize];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return sm_count / 2;
  }
  if (device >= 0 && device < kCacheSize) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(2 * (sm_count / 2 > 0 ? sm_count / 2 : 1));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = TileCfg<kBNWide>::kSmemBytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters < 1) {
    (void)cudaGetLastError();
    return sm_count / 2;  // not cached: a later call may get a real answer
  }
  if (device >= 0 && device < kCacheSize) cache[device].store(clusters, std::memory_order_relaxed);
  return clusters;
}

struct Maps {
  CUtensorMap a, b, c;  // c is only encoded (and read) when Params::tma_store is set
};

template <int kKind, bool kAMn, bool kBMn, int kCluster, int kBN>
cudaError_t launch(const Maps& maps, const Params& p, int sm_count, cudaStream_t stream) {
  constexpr auto kernel = sm90_gemm_kernel<kKind, kAMn, kBMn, kCluster, kBN>;
  constexpr int kSmemBytes = TileCfg<kBN>::kSmemBytes;
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(kSmemBytes));
  int max_clusters = sm_count;
  if constexpr (kCluster > 1) max_clusters = max_pair_clusters(kernel, sm_count);
  if (max_clusters < 1) max_clusters = 1;
  const int total_units = p.tiles_m * p.tiles_n * p.splits;
  const int clusters = total_units < max_clusters ? total_units : max_clusters;

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = kCluster > 1 ? 1 : 0;
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, maps.a, maps.b, maps.c, p));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <int kKind, int kCluster, int kBN>
cudaError_t launch_layout(const Plan& plan, const Maps& maps, const Params& p, int sm_count,
                          cudaStream_t stream) {
  if constexpr (kKind == kTF32) {
    if (plan.b_mn) return cudaErrorNotSupported;
    return plan.a_mn ? launch<kKind, true, false, kCluster, kBN>(maps, p, sm_count, stream)
                     : launch<kKind, false, false, kCluster, kBN>(maps, p, sm_count, stream);
  } else {
    if (plan.a_mn) {
      return plan.b_mn ? launch<kKind, true, true, kCluster, kBN>(maps, p, sm_count, stream)
                       : launch<kKind, true, false, kCluster, kBN>(maps, p, sm_count, stream);
    }
    return plan.b_mn ? launch<kKind, false, true, kCluster, kBN>(maps, p, sm_count, stream)
                     : launch<kKind, false, false, kCluster, kBN>(maps, p, sm_count, stream);
  }
}

template <int kCluster, int kBN>
cudaError_t launch_kind(const Plan& plan, const Maps& maps, const Params& p, int sm_count,
                        cudaStream_t stream) {
  switch (plan.kind) {
    case kBF16:
      return launch_layout<kBF16, kCluster, kBN>(plan, maps, p, sm_count, stream);
    case kF16:
      return launch_layout<kF16, kCluster, kBN>(plan, maps, p, sm_count, stream);
    default:
      return launch_layout<kTF32, kCluster, kBN>(plan, maps, p, sm_count, stream);
  }
}

}  // namespace

namespace {

// C as a {n, m} tensor with 64-row boxes of 128 bytes, the staging layout of the epilogue
// (transposed: C's lines are the tile grid's columns). False when TMA cannot write C.
bool c_tma_shape(const Problem& pr, MapShape* shape) {
  const GemmArgs& args = pr.args;
  const int elt = static_cast<int>(element_size(args.dtype));
  const int64_t c_inner = pr.c_trans ? args.m : args.n;
  const int64_t c_outer = pr.c_trans ? args.n : args.m;
  return aligned16(args.c) &&
         map_shape(c_inner, c_outer, args.ldc, elt, 128u / static_cast<uint32_t>(elt), 64, shape);
}

// Launches the product for arguments make_plan accepts. cluster: 0 automatic, 1 single
// CTAs, 2 B-multicast pairs (granted only when the 128-row tile count is even and there is
// no split: a pair needs both of its M tiles). store: 0 automatic, 1 direct register-to-
// global stores, 2 TMA stores (granted only when C rows are 16-byte aligned). sp.splits > 1
// needs `partial` (partial_bytes) and adds the reduction pass.
cudaError_t run_planned(const Problem& pr, cudaStream_t stream, int cluster, int store,
                        const SplitPlan& sp, float* partial) {
  const GemmArgs& args = pr.args;
  Plan plan;
  if (!make_plan(pr, &plan)) return cudaErrorNotSupported;
  const bool split = sp.splits > 1;
  if (split && partial == nullptr) return cudaErrorInvalidValue;
  const int elt = plan.elt;
  GEMMT_RETURN_IF_ERROR(bind_current_context());
  Maps maps;
  std::memset(&maps, 0, sizeof(maps));
  if (!encode(&maps.a, args.a, plan.a, plan.kind) || !encode(&maps.b, args.b, plan.b, plan.kind)) {
    return cudaErrorNotSupported;
  }
  MapShape c_shape;
  const bool c_tma_ok = !split && store != 1 && plan.bn == kBNWide && c_tma_shape(pr, &c_shape) &&
                        encode(&maps.c, args.c, c_shape, plan.kind);
  // The kernel applies an epilogue only on the staged path (a split's reduction applies it).
  if (!args.epilogue.empty() && !split && !c_tma_ok) return cudaErrorNotSupported;
  const int64_t tiles_m128 = (args.m + kBM - 1) / kBM;
  const bool narrow = plan.bn == kBNNarrow;
  const int cl = (cluster == 1 || split || narrow || tiles_m128 % 2 != 0) ? 1 : 2;
  Params p;
  p.m = static_cast<int>(args.m);
  p.n = static_cast<int>(args.n);
  p.k = static_cast<int>(args.k);
  p.tiles_m = static_cast<int>(tiles_m128 / cl);
  p.tiles_n = static_cast<int>((args.n + plan.bn - 1) / plan.bn);
  p.num_kb = static_cast<int>((args.k + (128 / elt) - 1) / (128 / elt));
  p.group = 16 / cl;  // 2048 rows of C per raster group
  p.c = args.c;
  p.ldc = args.ldc;
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.c_pair =
      (reinterpret_cast<uintptr_t>(args.c) % (2 * elt)) == 0 && (args.ldc % 2 == 0 || args.m == 1);
  p.tma_store = c_tma_ok ? 1 : 0;
  p.c_trans = pr.c_trans ? 1 : 0;
  p.splits = split ? sp.splits : 1;
  p.kb_per_split = split ? sp.kb_per_split : p.num_kb;
  p.partial = split ? partial : nullptr;
  p.epi = make_epilogue_params(args.epilogue);
  const int sm_count = args.sm_count > 0 ? args.sm_count : 1;
  cudaError_t launched;
  if (narrow) {
    launched = launch_kind<1, kBNNarrow>(plan, maps, p, sm_count, stream);
  } else if (cl == 2) {
    launched = launch_kind<2, kBNWide>(plan, maps, p, sm_count, stream);
  } else {
    launched = launch_kind<1, kBNWide>(plan, maps, p, sm_count, stream);
  }
  GEMMT_RETURN_IF_ERROR(launched);
  if (!split) return cudaSuccess;
  // The slices are in C's orientation; the reduction writes C as the caller described it.
  GemmArgs out = args;
  if (pr.c_trans) std::swap(out.m, out.n);
  return gemm_reduce_k_slices(out, partial, sp.splits, stream);
}

}  // namespace

namespace detail {

// Variant knobs for tests and benchmarks (see run_planned); no staging, no split-k.
cudaError_t gemm_sm90_run_variant(const GemmArgs& args, cudaStream_t stream, int cluster,
                                  int store) {
  return run_planned(problem_for(args), stream, cluster, store, SplitPlan{1, 0}, nullptr);
}

bool gemm_sm90_variant_supports(const GemmArgs& args) {
  return make_plan(problem_for(args), nullptr);
}

}  // namespace detail

// ---- Operands TMA cannot read in place ----------------------------------------------------
// TMA needs 16-byte aligned bases and row strides, which a view at an odd offset or with an
// odd leading dimension (a 4097-wide matrix of 16-bit values) does not have, and tf32 wgmma
// reads B K-major only (a row-major B is usually read in place through swap_for_tf32, but
// not always). Such an operand is first rewritten K-major, rows padded to 16 bytes, into the
// workspace by one bandwidth-bound pass (a few percent of the product's time at the sizes
// where wgmma pays), then the product runs on the copy.
namespace {

struct Staging {
  bool a = false, b = false;
};

// Which operands of the kernel's problem TMA cannot read in place and must be staged.
Staging staging_for(const GemmArgs& args) {
  Staging st;
  const int kind = tc_kind_of(args);
  if (kind < 0 || args.m < 1 || args.n < 1 || args.k < 1) return st;
  MapShape probe;
  bool mn = false;
  st.a = !map_a(args, kind, &probe, &mn);
  st.b = !map_b(args, kind, kBNNarrow, &probe, &mn);
  return st;
}

// Workspace layout: [staged A][staged B][split-k partials], each 256-byte aligned.
struct Workspace {
  std::size_t a_bytes = 0, b_bytes = 0, partial_bytes = 0;
  std::size_t total() const { return a_bytes + b_bytes + partial_bytes; }
};

Workspace workspace_for(const GemmArgs& args, const Staging& st, const SplitPlan& sp) {
  const int64_t elt = static_cast<int64_t>(element_size(args.dtype));
  Workspace w;
  w.a_bytes = st.a ? copy_bytes(args.m, args.k, elt) : 0;
  w.b_bytes = st.b ? copy_bytes(args.n, args.k, elt) : 0;
  w.partial_bytes = partial_bytes(args, sp);
  return w;
}

// The arguments of the product on the staged copies; `ws` may be a placeholder (planning).
GemmArgs staged_args(const GemmArgs& args, const Staging& st, char* ws) {
  GemmArgs s = args;
  const int64_t elt = static_cast<int64_t>(element_size(args.dtype));
  const int64_t pitch = copy_pitch(args.k, elt);
  if (st.a) {
    s.a = ws;
    s.a_stride_m = pitch;
    s.a_stride_k = 1;
    ws += copy_bytes(args.m, args.k, elt);
  }
  if (st.b) {
    s.b = ws;
    s.b_stride_n = pitch;
    s.b_stride_k = 1;
  }
  return s;
}

cudaError_t stage_k_major(const GemmArgs& args, const void* in, int64_t s_r, int64_t s_p,
                          int64_t rows, void* out, cudaStream_t stream) {
  const int64_t elt = static_cast<int64_t>(element_size(args.dtype));
  return copy_2d_bits(static_cast<int>(elt), in, s_r, s_p, rows, args.k, out,
                      copy_pitch(args.k, elt), stream);
}

// Largest staging pass accepted (copy_2d's grid).
bool staging_fits(const GemmArgs& args, const Staging& st) {
  return !(st.a || st.b) || args.k <= kCopyMaxLen;
}

}  // namespace

namespace {

SplitPlan split_plan_or_auto(const Problem& pr, int splits);

bool problem_supported(const Problem& pr) {
  // An epilogue needs the staged store (wide tiles, TMA-writable C) or a split, whose
  // reduction applies it; other such products go to a family that stores element-wise.
  if (!pr.args.epilogue.empty() && split_plan_or_auto(pr, 0).splits <= 1) {
    MapShape c_shape;
    if (pr.bn != kBNWide || !c_tma_shape(pr, &c_shape)) return false;
  }
  const Staging st = staging_for(pr.args);
  if (!(st.a || st.b)) return make_plan(pr, nullptr);
  Problem staged = pr;
  staged.args = staged_args(pr.args, st, planning_workspace());
  return staging_fits(pr.args, st) && make_plan(staged, nullptr);
}

// The kernel's problem with tile width bn (0: the model's).
Problem problem_with(const GemmArgs& args, int bn) {
  Problem pr = problem_for(args);
  if (bn == kBNWide || bn == kBNNarrow) pr.bn = bn;
  return pr;
}

// `splits` k-slices, or (0) the model's count for the problem's tile width.
SplitPlan split_plan_or_auto(const Problem& pr, int splits) {
  if (splits > 0) return split_plan(pr.args, splits);
  const TileChoice c = choose_tile(pr.args);
  return c.bn == pr.bn ? c.sp : best_splits(pr.args, pr.bn).sp;
}

std::size_t workspace_bytes_with(const GemmArgs& args, int splits, int bn) {
  const Problem pr = problem_with(args, bn);
  if (!problem_supported(pr)) return 0;
  return workspace_for(pr.args, staging_for(pr.args), split_plan_or_auto(pr, splits)).total();
}

// Stages what must be staged, then runs the product with `splits` k-slices and tiles bn
// wide (0: chosen by the cost model).
cudaError_t run_with(const GemmArgs& args, int splits, int bn, void* workspace,
                     cudaStream_t stream) {
  const Problem pr = problem_with(args, bn);
  if (!problem_supported(pr)) return cudaErrorNotSupported;
  const GemmArgs& t = pr.args;
  const Staging st = staging_for(t);
  const SplitPlan sp = split_plan_or_auto(pr, splits);
  const Workspace w = workspace_for(t, st, sp);
  if (w.total() > 0 && workspace == nullptr) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  Problem staged = pr;
  staged.args = staged_args(t, st, ws);
  if (st.a) {
    GEMMT_RETURN_IF_ERROR(stage_k_major(t, t.a, t.a_stride_m, t.a_stride_k, t.m,
                                        const_cast<void*>(staged.args.a), stream));
  }
  if (st.b) {
    GEMMT_RETURN_IF_ERROR(stage_k_major(t, t.b, t.b_stride_n, t.b_stride_k, t.n,
                                        const_cast<void*>(staged.args.b), stream));
  }
  float* partial =
      w.partial_bytes > 0 ? reinterpret_cast<float*>(ws + w.a_bytes + w.b_bytes) : nullptr;
  return run_planned(staged, stream, 0, 0, sp, partial);
}

}  // namespace

bool gemm_sm90_supports(const GemmArgs& args) {
  return problem_supported(problem_for(args));
}

std::size_t gemm_sm90_workspace_bytes(const GemmArgs& args) {
  return workspace_bytes_with(args, 0, 0);
}

cudaError_t gemm_sm90_run(const GemmArgs& args, void* workspace, cudaStream_t stream) {
  return run_with(args, 0, 0, workspace, stream);
}

namespace detail {

std::size_t gemm_sm90_split_workspace_bytes(const GemmArgs& args, int splits, int bn) {
  return workspace_bytes_with(args, splits, bn);
}

cudaError_t gemm_sm90_run_splits(const GemmArgs& args, int splits, int bn, void* workspace,
                                 cudaStream_t stream) {
  return run_with(args, splits, bn, workspace, stream);
}

int gemm_sm90_auto_splits(const GemmArgs& args) {
  const Problem pr = problem_for(args);
  return split_plan_or_auto(pr, 0).splits;
}

int gemm_sm90_auto_tile_n(const GemmArgs& args) {
  return problem_for(args).bn;
}

}  // namespace detail

}  // namespace gemmt
