// float64 GEMM, C = alpha * A @ B + beta * C with double accumulation, in two forms that share
// one CTA tile, one shared-memory pipeline and one epilogue:
//   * dmma (sm_80+): the FP64 tensor cores through mma.sync. sm_90 issues m16n8k8, or
//     m16n8k16 where the operands' layouts allow (compute_stage_dmma); sm_80 has only m8n8k4,
//     and issues four of those for each m16n8k8 step (same fragments).
//   * simt: plain double FMAs from the same shared-memory tiles, for GPUs without FP64
//     tensor cores (and as a second, independent float64 path that tests compare against).
//
// One CTA of 8 warps computes a 128x128 tile of C; in the dmma form each warp owns 64x32 of it
// (4 x 4 m16n8 blocks: 64 double accumulators a thread), and the dmma form also has a CTA of 4
// such warps over 128 x 64, two an SM (Cta, launch_dmma). Operand tiles are 16 doubles (128
// bytes) deep along K and flow through a 3-stage cp.async ring of 96 KB: a stage holds 2 k8
// steps, about 1800 cycles of DMMA work on an H100 SM, so two stages in flight cover DRAM
// latency; 96 KB also fits the 99 KB of sm_86/sm_89.
//
// Tiles keep the operand's contiguous direction (kernels/common/tc_operand_tiles.cuh), with
// 16-byte chunks XOR-swizzled by row. ldmatrix has no 64-bit form, so fragments come out
// through plain ld.shared, and mma.sync wants each fragment in consecutive registers: a load
// whose two doubles are not neighbours in the fragment costs register moves (ptxas emitted
// about eight 32-bit moves per DMMA for them). So both the MMA's k order and its row order
// are relabelled, which leaves the product unchanged:
//   * the MMA's k = t and t + 4 of lane t are the tile's k = 2t and 2t + 1, so the MMA's B
//     fragment (two k of one column) is one 16-byte load from a K-major tile;
//   * with an MN-major tile in the MMA's A role, its rows g and g + 8 are the tile's rows
//     2g and 2g + 1, so each half of the A fragment is one 16-byte load.
// The MMA's A role therefore goes to an MN-major operand when there is one, and its B role to
// a K-major one: for C = A @ B with A K-major and B MN-major (row-major torch tensors) the
// kernel computes C^T = B^T A^T tile by tile and writes the transpose. Any other pairing
// falls back to loads plus moves (both K-major) or to 8-byte loads (both MN-major).
// The swizzles keep every fragment load at the minimum number of shared-memory wavefronts
// also when the hardware splits a 16-byte load by quarter warps: an MN-major tile XORs the
// chunk with row & 7, a K-major one with a permutation of row & 7 that puts the rows g and
// g + 1 of a quarter warp in opposite bank halves.
//
// The copy loop keeps one source pointer per operand and thread; interior k-tiles (the whole
// CTA tile in range) issue their cp.async without bounds arithmetic, and only edge k-tiles
// take the checked, zero-filling path. Rows with a unit stride stream by 16-byte cp.async,
// or by 8-byte ones (same tile layout) when the base or leading dimension breaks 16-byte
// alignment (an odd number of columns); only operands without a unit stride are filled
// element by element into the same tiles: every stride runs here. 16-byte copies of K-major
// tiles, which read 128 bytes of each of 128 rows, have the L2 fetch 256-byte blocks, so
// that every other k-tile of those rows is already in L2.
//
// The dmma form launches at most one CTA per SM (two of the 128 x 64 ones), each walking output
// tiles; a CTA issues the first k-tiles of its next tile before the epilogue of the current one.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/cp_async.cuh"
#include "common/gemm_epilogue.cuh"
#include "common/shared_memory.cuh"
#include "common/tc_operand_tiles.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"
#include "plan/fp64_plan.h"

namespace gemmt {
namespace {

constexpr int kElt = 8;
constexpr int kBM = 128;  // the CTA tile along the MMA's A role (or along M, simt form)
constexpr int kBK = 16;   // doubles of K per stage: 128-byte tile rows
constexpr int kStages = 3;
constexpr int kGroupM = fp64_plan::kGroupM;

// The CTA of tile extent kTB along the MMA's B role (128, or 64: cuBLAS DGEMM's shape, two
// CTAs an SM that do not wait on each other's barriers; launch_dmma picks): 2 x kTB / 32 warps
// of 64 x 32.
template <int kTB>
struct Cta {
  static constexpr int kThreads = 2 * kTB;
  static constexpr int kWarpsB = kTB / 32;
  static constexpr int kABytes = kBM * kBK * kElt;  // 16 KB
  static constexpr int kBBytes = kTB * kBK * kElt;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kPerSm = kTB == 64 ? 2 : 1;
};

// The per-thread constants of the unchecked copy path of one operand tile (see Tile).
// How an operand's tiles are filled: 16-byte cp.async (unit stride, 16-byte aligned rows),
// 8-byte cp.async (unit stride, rows that break 16-byte alignment: an odd leading dimension
// or storage offset), or element by element (no unit stride).
enum CopyMode : int { kCopyElements = 0, kCopy8 = 1, kCopy16 = 2 };

struct CopySteps {
  int64_t kt_step;    // bytes from one k-tile to the next
  int64_t pass_step;  // bytes between a thread's successive chunks of one tile
};

struct Params {
  int64_t m, n, k;
  // The operands in the MMA's A and B roles: A and B, or B and A when the kernel computes
  // the transpose (kSwap).
  tc::Operand mma_a, mma_b;
  CopySteps steps_a, steps_b;
  int copy_a, copy_b;  // CopyMode of mma_a and mma_b
  double* c;
  int64_t ldc;
  double alpha, beta;
  bool c_pair;  // two adjacent outputs can be written with one 16-byte store
  int tiles_m, tiles_n;
  EpilogueParams epi;
};

// A tile's geometry: K-major (kMn false) is kExtent rows (M or N) of 16 doubles, MN-major is
// 16 rows (K) of kExtent doubles. The CTA's kThr threads copy it in kPasses passes of
// kRowsPerPass rows. kPlainK: a K-major tile read by 8-byte fragment loads at the MMA's own k
// order (see compute_stage_dmma).
template <bool kMn, bool kPlainK = false, int kExtent = 128, int kThr = 256>
struct Tile {
  static constexpr int kRows = kMn ? kBK : kExtent;
  static constexpr int kRowBytes = kMn ? kExtent * kElt : kBK * kElt;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kRowsPerPass = kThr / kChunksPerRow;
  static constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kPasses * kRowsPerPass == kRows, "tile must split evenly over the CTA");

  // Byte offset of 16-byte chunk `chunk` of row `row`. The 16-byte fragment loads of a
  // quarter warp read rows g and g + 1 (g even) of a K-major tile at chunks t (t < 4):
  // mapping row & 7 to 0 4 1 5 2 6 3 7 sends those two rows to opposite bank halves. The
  // 8-byte loads of a half warp (kPlainK) read rows g < 4 (or g >= 4) at chunks 0 and 1:
  // 0 2 4 6 1 3 5 7 keeps those four rows apart. MN-major fragment loads read rows 2t (or
  // 2t + 1) at chunks g and g + 1, which plain row & 7 already separates.
  static __device__ __forceinline__ uint32_t chunk_offset(int row, int chunk) {
    const int r = row & 7;
    const int perm = kMn ? r : kPlainK ? (((r & 3) << 1) | (r >> 2)) : (((r & 1) << 2) | (r >> 1));
    return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ perm) << 4));
  }

  // Byte offset of element (x, p): x along M or N (0..127), p along K (0..kBK-1).
  static __device__ __forceinline__ uint32_t offset(int x, int p) {
    if constexpr (kMn) {
      return chunk_offset(p, x >> 1) + ((x & 1) << 3);
    } else {
      return chunk_offset(x, p >> 1) + ((p & 1) << 3);
    }
  }

  // The copy-loop constants of an operand whose outer stride (in elements) is `os`.
  static CopySteps steps(int64_t os) {
    CopySteps s;
    s.kt_step = (kMn ? kBK * os : kBK) * kElt;  // K-major tiles advance along the inner index
    s.pass_step = static_cast<int64_t>(kRowsPerPass) * os * kElt;
    return s;
  }

  // Thread tid's first chunk at k-tile 0 of the tile whose M or N origin is x0. Only
  // dereferenced on the unchecked path, where every chunk is in range.
  // With 8-byte copies the thread starts at element `chunk` of the row (load_fast).
  static __device__ __forceinline__ const uint8_t* first_source(const tc::Operand& op, int64_t x0,
                                                                int copy, int tid) {
    const int64_t row = tid / kChunksPerRow;
    const int64_t inner = (tid % kChunksPerRow) * (copy == kCopy16 ? 16 / kElt : 1);
    const int64_t outer0 = kMn ? row : x0 + row;
    const int64_t inner0 = kMn ? x0 + inner : inner;
    return op.ptr + (outer0 * op.outer_stride + inner0) * kElt;
  }

  // The unchecked copy: every element of the tile is in range. With 8-byte copies a thread
  // copies elements `ch` and `ch + kChunksPerRow` of its rows, so that each copy instruction of
  // a warp reads one contiguous run of every row it touches (half a row); the pair of
  // instructions fills the same chunks as the 16-byte form, at the same row swizzle, and a
  // warp's stores still cover each bank at most twice per 256 bytes.
  static __device__ __forceinline__ void load_fast(uint32_t tile, const uint8_t* src,
                                                   const CopySteps& s, int copy, int tid) {
    const int row = tid / kChunksPerRow;
    const int ch = tid % kChunksPerRow;
    if (copy == kCopy16) {
      // K-major tiles ask the L2 for the whole 256-byte block: the next k-tile of each row.
      if (!kMn) {
#pragma unroll
        for (int it = 0; it < kPasses; ++it) {
          cp_async_16_l2_256(tile + chunk_offset(row + it * kRowsPerPass, ch),
                             src + it * s.pass_step);
        }
      } else {
#pragma unroll
        for (int it = 0; it < kPasses; ++it) {
          cp_async_16(tile + chunk_offset(row + it * kRowsPerPass, ch), src + it * s.pass_step);
        }
      }
    } else {
      const uint32_t half = static_cast<uint32_t>(ch & 1) * kElt;
#pragma unroll
      for (int it = 0; it < kPasses; ++it) {
        const int r = row + it * kRowsPerPass;
        const uint8_t* const p = src + it * s.pass_step;
        cp_async_8(tile + chunk_offset(r, ch >> 1) + half, p);
        cp_async_8(tile + chunk_offset(r, (ch >> 1) + kChunksPerRow / 2) + half, p + kRowBytes / 2);
      }
    }
  }

  // The checked copy (edge tiles, operands without 16-byte vectors): out-of-range elements
  // are zero; operands without vectors are read element by element into the same layout.
  static __device__ __forceinline__ void load_checked(uint32_t tile, const tc::Operand& op,
                                                      int copy, int64_t outer0, int64_t inner0,
                                                      int tid) {
    constexpr int kVec = 16 / kElt;
    const int row0 = tid / kChunksPerRow;
    const int ch = tid % kChunksPerRow;
    const int64_t in = inner0 + static_cast<int64_t>(ch) * kVec;
    if (copy == kCopy8) {
      // load_fast's element order; an element out of range is a zero store (8-byte elements
      // are either wholly in range or not at all).
      const uint32_t half = static_cast<uint32_t>(ch & 1) * kElt;
#pragma unroll
      for (int it = 0; it < kPasses; ++it) {
        const int row = row0 + it * kRowsPerPass;
        const int64_t o = outer0 + row;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = ch + e * kChunksPerRow;  // element of the tile row
          const int64_t i = inner0 + c;
          const uint32_t dst = tile + chunk_offset(row, c >> 1) + half;
          if (o < op.outer_size && i < op.inner_size) {
            cp_async_8(dst, op.ptr + (o * op.outer_stride + i) * kElt);
          } else {
            asm volatile("st.shared.v2.u32 [%0], {%1, %1};\n" ::"r"(dst), "r"(0u) : "memory");
          }
        }
      }
    } else if (copy == kCopy16) {
#pragma unroll
      for (int it = 0; it < kPasses; ++it) {
        const int row = row0 + it * kRowsPerPass;
        const int64_t o = outer0 + row;
        const int64_t rem = op.inner_size - in;
        int bytes = 0;
        const uint8_t* src = op.ptr;  // never read when bytes == 0
        if (o < op.outer_size && rem > 0) {
          bytes = static_cast<int>(rem < kVec ? rem : kVec) * kElt;
          src = op.ptr + (o * op.outer_stride + in) * kElt;
        }
        cp_async_16_zfill(tile + chunk_offset(row, ch), src, bytes);
      }
    } else {
#pragma unroll 1
      for (int it = 0; it < kPasses; ++it) {
        const int row = row0 + it * kRowsPerPass;
        const int64_t o = outer0 + row;
        uint2 w[kVec] = {};
        if (o < op.outer_size) {
          const int64_t row_off = o * op.outer_stride;
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            if (in + e < op.inner_size) {
              w[e] = reinterpret_cast<const uint2*>(op.ptr)[row_off + (in + e) * op.inner_stride];
            }
          }
        }
        st_shared_v4(tile + chunk_offset(row, ch), w[0].x, w[0].y, w[1].x, w[1].y);
      }
    }
  }
};

__device__ __forceinline__ double ld_shared_f64(uint32_t addr) {
  double v;
  asm volatile("ld.shared.f64 %0, [%1];\n" : "=d"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void ld_shared_v2_f64(uint32_t addr, double& x, double& y) {
  asm volatile("ld.shared.v2.f64 {%0, %1}, [%2];\n" : "=d"(x), "=d"(y) : "r"(addr));
}

// Elements (x, p) and (x, p + 1) of a tile kExtent wide, p even: one 16-byte load in a K-major
// tile.
template <bool kMn, int kExtent = 128>
__device__ __forceinline__ void load_k_pair(uint32_t tile, int x, int p, double& v0, double& v1) {
  if constexpr (kMn) {
    using T = Tile<true, false, kExtent>;
    v0 = ld_shared_f64(tile + T::offset(x, p));
    v1 = ld_shared_f64(tile + T::offset(x, p + 1));
  } else {
    ld_shared_v2_f64(tile + Tile<false>::offset(x, p), v0, v1);
  }
}

// d += a * b for one 16x8x8 block, fragments as mma.m16n8k8.f64 lays them out: a = {(g, t),
// (g + 8, t), (g, t + 4), (g + 8, t + 4)}, b = {(t, g), (t + 4, g)}, d = {(g, 2t), (g, 2t + 1),
// (g + 8, 2t), (g + 8, 2t + 1)} for lane 4g + t.
__device__ __forceinline__ void dmma_16x8x8(double (&d)[4], const double (&a)[4],
                                            const double (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // m8n8k4: a = (g, t), b = (t, g), d = {(g, 2t), (g, 2t + 1)}. Rows g and g + 8 are two
  // 8x8 blocks, k 0-3 and 4-7 two steps.
#pragma unroll
  for (int kh = 0; kh < 2; ++kh) {
#pragma unroll
    for (int mh = 0; mh < 2; ++mh) {
      asm volatile(
          "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
          : "+d"(d[2 * mh]), "+d"(d[2 * mh + 1])
          : "d"(a[2 * kh + mh]), "d"(b[kh]));
    }
  }
#else
  // Never launched below sm_80 (gemm_fp64_dmma_supports).
  __trap();
#endif
}

// d += a * b for one 16x8x16 block: a_lo and b[0..1] are the fragments of dmma_16x8x8 for the
// MMA's k slots 0 and 1 of each lane, a_hi and b[2..3] those of slots 2 and 3 (mma.m16n8k16.f64:
// lane 4g + t holds k = t + 4q in A's and B's slot q alike, so any one relabelling of the tile's
// k serves both operands). sm_90 issues one DMMA.16x8x16, half the instructions of two
// m16n8k8; sm_80 runs the two k8 halves.
__device__ __forceinline__ void dmma_16x8x16(double (&d)[4], const double (&a_lo)[4],
                                             const double (&a_hi)[4], const double (&b)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, {%0, %1, %2, %3};\n"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a_lo[0]), "d"(a_lo[1]), "d"(a_lo[2]), "d"(a_lo[3]), "d"(a_hi[0]), "d"(a_hi[1]),
        "d"(a_hi[2]), "d"(a_hi[3]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
#else
  const double b_lo[2] = {b[0], b[1]};
  const double b_hi[2] = {b[2], b[3]};
  dmma_16x8x8(d, a_lo, b_lo);
  dmma_16x8x8(d, a_hi, b_hi);
#endif
}

// The MMA's A fragment of the 16-row block at tile row x0 for the k8 step at tile k = p0
// (see the file comment for the relabelling).
template <bool kMn>
__device__ __forceinline__ void load_a_fragment(uint32_t tile, int x0, int p0, int g, int t,
                                                double (&a)[4]) {
  if constexpr (kMn) {
    // Rows g and g + 8 are the tile's rows 2g and 2g + 1: one 16-byte load per k.
    ld_shared_v2_f64(tile + Tile<true>::offset(x0 + 2 * g, p0 + 2 * t), a[0], a[1]);
    ld_shared_v2_f64(tile + Tile<true>::offset(x0 + 2 * g, p0 + 2 * t + 1), a[2], a[3]);
  } else {
    load_k_pair<false>(tile, x0 + g, p0 + 2 * t, a[0], a[2]);
    load_k_pair<false>(tile, x0 + g + 8, p0 + 2 * t, a[1], a[3]);
  }
}

// The tile row (within its 16-row block) of the MMA's row g (half 0) or g + 8 (half 1).
template <bool kMn>
__device__ __forceinline__ int a_row(int g, int half) {
  return kMn ? 2 * g + half : g + 8 * half;
}

// Both roles K-major: no relabelling puts a whole A fragment half in one 16-byte load, so
// every fragment element is one 8-byte load at the MMA's own k order (Tile<false, true>).
// A warp's 8-byte load then covers all 32 banks of each half warp: no moves, no conflicts.
__device__ __forceinline__ void compute_stage_dmma_plain_k(uint32_t sA, uint32_t sB,
                                                           double (&acc)[4][4][4], int warp_m,
                                                           int warp_n, int lane) {
  using T = Tile<false, true>;
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int ks = 0; ks < kBK / 8; ++ks) {
    const int p = ks * 8 + t;
    double bf[4][2];
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      const int x = warp_n * 32 + nj * 8 + g;
      bf[nj][0] = ld_shared_f64(sB + T::offset(x, p));
      bf[nj][1] = ld_shared_f64(sB + T::offset(x, p + 4));
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const int x = warp_m * 64 + mi * 16 + g;
      double af[4];
      af[0] = ld_shared_f64(sA + T::offset(x, p));
      af[1] = ld_shared_f64(sA + T::offset(x + 8, p));
      af[2] = ld_shared_f64(sA + T::offset(x, p + 4));
      af[3] = ld_shared_f64(sA + T::offset(x + 8, p + 4));
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) dmma_16x8x8(acc[mi][nj], af, bf[nj]);
    }
  }
}

// One stage of the dmma form for the warp's 4 x 4 blocks. sA and sB are the tiles in the MMA's
// A and B roles, 128 and kTB wide. With an MN-major A role and a K-major B role (the relabelled
// 16-byte loads), one m16n8k16 step: the tile's k of each lane are the same loads as two k8
// steps' (so the swizzles keep them conflict-free), in half the DMMA instructions; 4096^3
// products ran 1-6% faster (H200). In the other pairings it ran 0-4% slower than two k8
// steps (docs/performance.md), which they keep.
template <bool kAMn, bool kBMn, int kTB>
__device__ __forceinline__ void compute_stage_dmma(uint32_t sA, uint32_t sB, double (&acc)[4][4][4],
                                                   int warp_m, int warp_n, int lane) {
  if constexpr (!kAMn && !kBMn) {
    compute_stage_dmma_plain_k(sA, sB, acc, warp_m, warp_n, lane);
    return;
  }
  const int g = lane >> 2;
  const int t = lane & 3;
  if constexpr (kAMn && !kBMn) {
    static_assert(kBK == 16, "one m16n8k16 step a stage");
    // B's fragments for the stage, then A's block by block.
    double bf[4][4];
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      const int x = warp_n * 32 + nj * 8 + g;
      load_k_pair<kBMn, kTB>(sB, x, 2 * t, bf[nj][0], bf[nj][1]);
      load_k_pair<kBMn, kTB>(sB, x, 8 + 2 * t, bf[nj][2], bf[nj][3]);
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      double lo[4], hi[4];
      load_a_fragment<kAMn>(sA, warp_m * 64 + mi * 16, 0, g, t, lo);
      load_a_fragment<kAMn>(sA, warp_m * 64 + mi * 16, 8, g, t, hi);
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) dmma_16x8x16(acc[mi][nj], lo, hi, bf[nj]);
    }
    return;
  }
#pragma unroll
  for (int ks = 0; ks < kBK / 8; ++ks) {
    const int p0 = ks * 8;
    // B's fragments for the step, then A's block by block: with 128 registers of
    // accumulators, all of A's 16 doubles at once would leave too few for addresses.
    double bf[4][2];
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      load_k_pair<kBMn, kTB>(sB, warp_n * 32 + nj * 8 + g, p0 + 2 * t, bf[nj][0], bf[nj][1]);
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      double af[4];
      load_a_fragment<kAMn>(sA, warp_m * 64 + mi * 16, p0, g, t, af);
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) dmma_16x8x8(acc[mi][nj], af, bf[nj]);
    }
  }
}

// The simt form: thread (tm, tn) of a 16 x 16 grid owns rows tm + 16 i (i < 8) and column
// pairs 2 tn + 32 j (j < 4) of the CTA tile, in acc[i][j][0..1].
template <bool kAMn, bool kBMn>
__device__ __forceinline__ void compute_stage_simt(uint32_t sA, uint32_t sB, double (&acc)[8][4][2],
                                                   int tid) {
  const int tm = tid >> 4;
  const int tn = tid & 15;
#pragma unroll 2
  for (int p = 0; p < kBK; ++p) {
    double a[8];
    double b[4][2];
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = ld_shared_f64(sA + Tile<kAMn>::offset(tm + 16 * i, p));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int x = 2 * tn + 32 * j;
      b[j][0] = ld_shared_f64(sB + Tile<kBMn>::offset(x, p));
      b[j][1] = ld_shared_f64(sB + Tile<kBMn>::offset(x + 1, p));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[i][j][0] = fma(a[i], b[j][0], acc[i][j][0]);
        acc[i][j][1] = fma(a[i], b[j][1], acc[i][j][1]);
      }
    }
  }
}

// Writes C[row, col] and C[row, col + 1].
__device__ __forceinline__ void store_pair(const Params& p, int64_t row, int64_t col, double v0,
                                           double v1) {
  if (row >= p.m || col >= p.n) return;
  double* dst = p.c + row * p.ldc + col;
  store_c_pair<double>(dst, col + 1 < p.n, p.c_pair, v0, v1, p.alpha, p.beta, p.epi.view<double>(),
                       row, col);
}

// kAMn / kBMn: the layouts of the tiles in the MMA's A and B roles (for the simt form, of A
// and B). kSwap: those roles hold B and A, and the accumulators are tiles of C^T. kTB: the
// CTA tile along the B role (Cta; the simt form: 128).
template <bool kTensorCores, bool kAMn, bool kBMn, bool kSwap, int kTB>
__global__ void __launch_bounds__(Cta<kTB>::kThreads, Cta<kTB>::kPerSm)
    fp64_gemm_kernel(const Params p) {
  static_assert(!kSwap || (kTensorCores && kAMn), "the transposed form needs an MN-major A role");
  static_assert(kTensorCores || kTB == 128, "the simt form's thread grid covers 128 x 128");
  using C = Cta<kTB>;
  constexpr bool kPlainK = kTensorCores && !kAMn && !kBMn;  // compute_stage_dmma_plain_k
  using TA = Tile<kAMn, kPlainK, kBM, C::kThreads>;
  using TB = Tile<kBMn, kPlainK, kTB, C::kThreads>;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_base = smem_addr(smem);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  static_assert((C::kWarpsB & (C::kWarpsB - 1)) == 0, "a power of two of warps along B");
  const int warp_m = warp >> (C::kWarpsB == 4 ? 2 : 1);  // 0..1, along the MMA's A role
  const int warp_n = warp & (C::kWarpsB - 1);            // along its B role

  // The CTA walks the output tiles blockIdx.x, blockIdx.x + gridDim.x, ... (one tile each when
  // the grid covers them all). Before a tile's epilogue, which works from registers and global
  // memory only, the CTA issues the first k-tiles of its next tile, so their DRAM latency runs
  // under the stores instead of after them.
  const int64_t tiles = static_cast<int64_t>(p.tiles_m) * p.tiles_n;
  const int64_t ktiles = (p.k + kBK - 1) / kBK;
  const int64_t a_extent = kSwap ? p.n : p.m;
  const int64_t b_extent = kSwap ? p.m : p.n;

  // The per-tile copy state: origins along the MMA's A and B roles, how many
  // k-tiles skip the bounds arithmetic (all whole ones when the CTA tile is in range and both
  // operands stream by cp.async), and each thread's first source chunk.
  struct TileState {
    int64_t a0, b0, full_ktiles;
    const uint8_t* src_a;
    const uint8_t* src_b;
  };
  auto start_tile = [&](int64_t t) {
    const tc::TileIndex tile = tc::grouped_tile(static_cast<int>(t), p.tiles_m, p.tiles_n, kGroupM);
    // C's tile is kBM x kTB, or kTB x kBM when the roles hold B and A.
    const int64_t m0 = static_cast<int64_t>(tile.m) * (kSwap ? kTB : kBM);
    const int64_t n0 = static_cast<int64_t>(tile.n) * (kSwap ? kBM : kTB);
    TileState s;
    s.a0 = kSwap ? n0 : m0;
    s.b0 = kSwap ? m0 : n0;
    const bool interior = p.copy_a != kCopyElements && p.copy_b != kCopyElements &&
                          s.a0 + kBM <= a_extent && s.b0 + kTB <= b_extent;
    s.full_ktiles = interior ? p.k / kBK : 0;
    s.src_a = TA::first_source(p.mma_a, s.a0, p.copy_a, tid);
    s.src_b = TB::first_source(p.mma_b, s.b0, p.copy_b, tid);
    return s;
  };
  auto load = [&](const TileState& s, int slot, int64_t kt) {
    const uint32_t stage = smem_base + static_cast<uint32_t>(slot) * C::kStageBytes;
    if (kt < s.full_ktiles) {
      TA::load_fast(stage, s.src_a + kt * p.steps_a.kt_step, p.steps_a, p.copy_a, tid);
      TB::load_fast(stage + C::kABytes, s.src_b + kt * p.steps_b.kt_step, p.steps_b, p.copy_b, tid);
    } else {
      const int64_t k0 = kt * kBK;
      TA::load_checked(stage, p.mma_a, p.copy_a, kAMn ? k0 : s.a0, kAMn ? s.a0 : k0, tid);
      TB::load_checked(stage + C::kABytes, p.mma_b, p.copy_b, kBMn ? k0 : s.b0, kBMn ? s.b0 : k0,
                       tid);
    }
  };
  // Fills ring slots 0 .. kStages - 2 with a tile's first k-tiles.
  auto prologue = [&](const TileState& s) {
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < ktiles) load(s, st, st);
      cp_async_commit();
    }
  };

  // 64 accumulators a thread in either form, arranged as the form writes them out.
  using Acc = std::conditional_t<kTensorCores, double[4][4][4], double[8][4][2]>;
  Acc acc;
  double* const acc_flat = &acc[0][0][0];

  int64_t t = blockIdx.x;
  TileState cur = start_tile(t);
  prologue(cur);
#pragma unroll 1
  for (;;) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc_flat[i] = 0.0;
    // A ring of kStages shared-memory stages filled by cp.async, kStages - 1 k-tiles in
    // flight ahead of the one being computed.
    int slot = 0;
    int next_slot = kStages - 1;
#pragma unroll 1
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      cp_async_wait<kStages - 2>();
      // Publishes k-tile kt to every warp and proves that all warps are done with the slot the
      // prefetch below overwrites (it was consumed in iteration kt - 1).
      __syncthreads();
      if (kt + kStages - 1 < ktiles) load(cur, next_slot, kt + kStages - 1);
      cp_async_commit();
      const uint32_t stage = smem_base + static_cast<uint32_t>(slot) * C::kStageBytes;
      if constexpr (kTensorCores) {
        compute_stage_dmma<kAMn, kBMn, kTB>(stage, stage + C::kABytes, acc, warp_m, warp_n, lane);
      } else {
        compute_stage_simt<kAMn, kBMn>(stage, stage + C::kABytes, acc, tid);
      }
      slot = slot == kStages - 1 ? 0 : slot + 1;
      next_slot = next_slot == kStages - 1 ? 0 : next_slot + 1;
    }
    // Only empty groups can be pending here (the loop issues no k-tile past the last).
    cp_async_wait<0>();

    const int64_t a0 = cur.a0;
    const int64_t b0 = cur.b0;
    t += gridDim.x;
    // The simt form (GPUs without FP64 tensor cores) runs one tile a CTA: carrying the next
    // tile's copy state through its epilogue costs it spills.
    const bool more = kTensorCores && t < tiles;
    if (more) {
      // Every warp is done reading the ring before the next tile's first k-tiles overwrite it.
      __syncthreads();
      cur = start_tile(t);
      prologue(cur);
    }

    if constexpr (kTensorCores) {
      const int g = lane >> 2;
      const int tq = lane & 3;
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
          const double (&d)[4] = acc[mi][nj];
          const int64_t x = a0 + warp_m * 64 + mi * 16;  // the block's first A-role row
          const int64_t y = b0 + warp_n * 32 + nj * 8 + 2 * tq;
          if constexpr (kSwap) {
            // d[h] and d[h + 2] are A-role rows 2g and 2g + 1 (columns of C) of B-role column
            // y + h (a row of C): neighbours in C's row.
            store_pair(p, y, x + 2 * g, d[0], d[2]);
            store_pair(p, y + 1, x + 2 * g, d[1], d[3]);
          } else {
            store_pair(p, x + a_row<kAMn>(g, 0), y, d[0], d[1]);
            store_pair(p, x + a_row<kAMn>(g, 1), y, d[2], d[3]);
          }
        }
      }
    } else {
      const int tm = tid >> 4;
      const int tn = tid & 15;
      const int64_t m0 = kSwap ? b0 : a0;
      const int64_t n0 = kSwap ? a0 : b0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          store_pair(p, m0 + tm + 16 * i, n0 + 2 * tn + 32 * j, acc[i][j][0], acc[i][j][1]);
        }
      }
    }
    if (!more) break;
  }
}

// ---- Host side ---------------------------------------------------------------------

template <bool kTensorCores, bool kAMn, bool kBMn, bool kSwap, int kTB>
cudaError_t launch(Params p, cudaStream_t stream) {
  using C = Cta<kTB>;
  constexpr auto kernel = fp64_gemm_kernel<kTensorCores, kAMn, kBMn, kSwap, kTB>;
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(C::kSmemBytes));
  p.steps_a = Tile<kAMn, false, kBM, C::kThreads>::steps(p.mma_a.outer_stride);
  p.steps_b = Tile<kBMn, false, kTB, C::kThreads>::steps(p.mma_b.outer_stride);
  // C's tiles: kBM x kTB, or kTB x kBM when the roles hold B and A.
  p.tiles_m = static_cast<int>((p.m + (kSwap ? kTB : kBM) - 1) / (kSwap ? kTB : kBM));
  p.tiles_n = static_cast<int>((p.n + (kSwap ? kBM : kTB) - 1) / (kSwap ? kBM : kTB));
  const int64_t tiles = static_cast<int64_t>(p.tiles_m) * p.tiles_n;
  int64_t grid = tiles;
  if (kTensorCores) {
    // kPerSm CTAs an SM (what the kernel's shared memory and registers allow), walking tiles.
    int sms = 0;
    GEMMT_RETURN_IF_ERROR(current_device_sm_count(&sms));
    if (sms > 0 && static_cast<int64_t>(sms) * C::kPerSm < grid) grid = sms * C::kPerSm;
  }
  kernel<<<static_cast<unsigned>(grid), C::kThreads, C::kSmemBytes, stream>>>(p);
  GEMMT_RETURN_LAUNCH_ERROR();
}

// The copy mode of an operand described by tc::describe_operand: its element-wise fallback
// still streams by 8-byte cp.async when the tile rows run along a unit stride.
int copy_mode(const tc::Operand& op) {
  if (op.vec) return kCopy16;
  const bool unit = op.inner_stride == 1 || op.inner_size == 1;
  const bool aligned = reinterpret_cast<uintptr_t>(op.ptr) % kElt == 0;
  return unit && aligned ? kCopy8 : kCopyElements;
}

// The dmma form's CTA along the B role (kernels/plan/fp64_plan.h); GEMMT_FP64_TILE=64 or 128
// (read at every call) forces one. kNarrow: the 128 x 64 instance, whose residency (two an SM
// on the H100 / H200, one where shared memory is short) the plan needs.
template <bool kSwap, auto kNarrow>
bool narrow_cta(const Params& p) {
  const char* v = std::getenv("GEMMT_FP64_TILE");
  if (v != nullptr && std::strcmp(v, "64") == 0) return true;
  if (v != nullptr && std::strcmp(v, "128") == 0) return false;
  int sms = 0, per_sm = 0;
  constexpr int kThreads = Cta<64>::kThreads;
  constexpr int kSmem = Cta<64>::kSmemBytes;
  if (current_device_sm_count(&sms) != cudaSuccess ||
      allow_dynamic_smem<kNarrow>(kSmem) != cudaSuccess ||
      resident_blocks_per_sm<kNarrow>(kThreads, &per_sm, kSmem) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;  // the 128 x 128 CTA, which every device here runs one an SM
  }
  return fp64_plan::dmma_cta_width(p.m, p.n, kSwap, sms, per_sm) == 64;
}

template <bool kAMn, bool kBMn, bool kSwap>
cudaError_t launch_dmma(Params& p, cudaStream_t stream) {
  constexpr auto kNarrow = fp64_gemm_kernel<true, kAMn, kBMn, kSwap, 64>;
  return narrow_cta<kSwap, kNarrow>(p) ? launch<true, kAMn, kBMn, kSwap, 64>(p, stream)
                                       : launch<true, kAMn, kBMn, kSwap, 128>(p, stream);
}

// p.mma_a and p.mma_b hold A and B on entry.
cudaError_t launch_layout(bool tensor_cores, Params& p, bool a_mn, bool b_mn, cudaStream_t stream) {
  if (!tensor_cores) {
    if (a_mn) {
      return b_mn ? launch<false, true, true, false, 128>(p, stream)
                  : launch<false, true, false, false, 128>(p, stream);
    }
    return b_mn ? launch<false, false, true, false, 128>(p, stream)
                : launch<false, false, false, false, 128>(p, stream);
  }
  if (a_mn) {
    return b_mn ? launch_dmma<true, true, false>(p, stream)
                : launch_dmma<true, false, false>(p, stream);
  }
  if (b_mn) {
    // A K-major and B MN-major: B takes the MMA's A role (see the file comment).
    const tc::Operand a = p.mma_a;
    p.mma_a = p.mma_b;
    p.mma_b = a;
    const int copy = p.copy_a;
    p.copy_a = p.copy_b;
    p.copy_b = copy;
    return launch_dmma<true, false, true>(p, stream);
  }
  return launch_dmma<false, false, false>(p, stream);
}

}  // namespace

cudaError_t gemm_fp64_run(const GemmArgs& args, bool tensor_cores, cudaStream_t stream) {
  if (!(tensor_cores ? gemm_fp64_dmma_supports(args) : gemm_fp64_simt_supports(args))) {
    return cudaErrorNotSupported;
  }
  Params p;
  p.m = args.m;
  p.n = args.n;
  p.k = args.k;
  bool a_mn = false, b_mn = false;
  p.mma_a =
      tc::describe_operand(args.a, args.m, args.a_stride_m, args.k, args.a_stride_k, kElt, &a_mn);
  p.mma_b =
      tc::describe_operand(args.b, args.n, args.b_stride_n, args.k, args.b_stride_k, kElt, &b_mn);
  p.c = static_cast<double*>(args.c);
  p.ldc = args.ldc;
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.epi = make_epilogue_params(args.epilogue);
  p.c_pair =
      (reinterpret_cast<uintptr_t>(args.c) % (2 * kElt)) == 0 && (args.ldc % 2 == 0 || args.m == 1);
  p.copy_a = copy_mode(p.mma_a);
  p.copy_b = copy_mode(p.mma_b);
  return launch_layout(tensor_cores, p, a_mn, b_mn, stream);
}

}  // namespace gemmt
