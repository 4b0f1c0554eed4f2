// Tensor-core GEMM through mma.sync (sm_80 and later): bf16 / fp16 with m16n8k16 and
// float32-as-tf32 with m16n8k8, float32 accumulation, C = alpha * A @ B + beta * C.
//
// One CTA of 8 warps computes a 128x128 tile of C; each warp owns 64x32 of it. Operand
// tiles are 128 bytes deep along K (64 16-bit or 32 fp32 elements) and flow through a
// 3-stage cp.async ring (96 KB, which still fits the 99 KB of sm_86/sm_89).
//
// Shared-memory tiles keep the operand's own contiguous direction ("K-major" when the
// operand is contiguous along K, "MN-major" when contiguous along M or N) so that global
// loads stay 16-byte vectors whatever the layout. Fragments then come out through
// ldmatrix for K-major tiles, ldmatrix.trans for MN-major 16-bit tiles, and plain 32-bit
// shared loads for MN-major tf32 tiles (ldmatrix cannot transpose 32-bit elements).
//
// Every tile row is a multiple of 128 bytes and each 16-byte chunk is stored at
// (chunk ^ (row & 7)): the eight rows an ldmatrix phase touches then land in eight
// different bank groups, and the cp.async stores of a warp stay conflict-free too.
//
// Operands whose leading dimension or base pointer breaks 16-byte alignment (or that
// have no unit stride at all) take a synchronous element-wise fill of the same tiles,
// so every shape and stride runs here; only the speed differs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cp_async.cuh"
#include "common/gemm_epilogue.cuh"
#include "common/gemm_tc_kind.h"
#include "common/shared_memory.cuh"
#include "common/tc_operand_tiles.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"

namespace gemmt {
namespace {

constexpr int kBM = 128;
constexpr int kBN = 128;
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kTileBytes = 128 * 128;  // one operand tile: 128 (M or N) x 128 bytes of K
constexpr int kStageBytes = 2 * kTileBytes;
constexpr int kSmemBytes = kStages * kStageBytes;
// Rows of 128x128 tiles visited together, so that concurrently running CTAs share
// panels of A and B in L2.
constexpr int kGroupM = 8;

using tc::Operand;
using tc::swz;

struct Params {
  int64_t m, n, k;
  Operand a, b;
  void* c;
  int64_t ldc;
  float alpha, beta;
  bool c_pair;  // two adjacent outputs can be written with one aligned store
  int tiles_m, tiles_n;
  EpilogueParams epi;
};

template <int K>
struct KindTraits;
template <>
struct KindTraits<kBF16> {
  using T = __nv_bfloat16;
  static constexpr int kElt = 2;
};
template <>
struct KindTraits<kF16> {
  using T = __half;
  static constexpr int kElt = 2;
};
template <>
struct KindTraits<kTF32> {
  using T = float;
  static constexpr int kElt = 4;
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <int kKind>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kKind == kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (kKind == kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

template <int kKind, bool kAMn, bool kBMn>
struct TileShape {
  static constexpr int kElt = KindTraits<kKind>::kElt;
  static constexpr int kBK = 128 / kElt;  // K elements per stage
  // K-major tile: 128 rows (M or N) of 128 bytes. MN-major tile: kBK rows (K) of 128 elements.
  static constexpr int kARows = kAMn ? kBK : kBM;
  static constexpr int kARowBytes = kAMn ? kBM * kElt : 128;
  static constexpr int kBRows = kBMn ? kBK : kBN;
  static constexpr int kBRowBytes = kBMn ? kBN * kElt : 128;
};

template <int kKind, bool kAMn, bool kBMn>
__device__ __forceinline__ void load_stage(uint32_t stage, const Params& p, int64_t m0, int64_t n0,
                                           int64_t k0, int tid) {
  using S = TileShape<kKind, kAMn, kBMn>;
  if constexpr (kAMn) {
    tc::load_tile<S::kElt, S::kARows, S::kARowBytes, kThreads>(stage, p.a, k0, m0, tid);
  } else {
    tc::load_tile<S::kElt, S::kARows, S::kARowBytes, kThreads>(stage, p.a, m0, k0, tid);
  }
  if constexpr (kBMn) {
    tc::load_tile<S::kElt, S::kBRows, S::kBRowBytes, kThreads>(stage + kTileBytes, p.b, k0, n0,
                                                               tid);
  } else {
    tc::load_tile<S::kElt, S::kBRows, S::kBRowBytes, kThreads>(stage + kTileBytes, p.b, n0, k0,
                                                               tid);
  }
}

// One stage = four MMA k-steps of 32 bytes of K each (k16 for 16-bit types, k8 for tf32).
template <int kKind, bool kAMn, bool kBMn>
__device__ __forceinline__ void compute_stage(uint32_t sA, uint32_t sB, float (&acc)[4][4][4],
                                              int warp_m, int warp_n, int lane) {
  using S = TileShape<kKind, kAMn, kBMn>;
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    uint32_t af[4][4];
    uint32_t bf[4][2];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const int mb = warp_m * 64 + mi * 16;
      if constexpr (!kAMn) {
        // Matrices (rows 0-7 | 8-15) x (k chunk 0 | 1), in a0..a3 order.
        const int row = mb + (lane & 15);
        const int ch = ks * 2 + (lane >> 4);
        ldmatrix_x4(af[mi], sA + swz<128>(row, ch));
      } else if constexpr (kKind != kTF32) {
        // Stored [k][m]: transposing 8x8 blocks yields the row-major A fragment.
        const int krow = ks * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int ch = (mb >> 3) + ((lane >> 3) & 1);
        ldmatrix_x4_trans(af[mi], sA + swz<S::kARowBytes>(krow, ch));
      } else {
        const int k_lo = ks * 8 + t;
        const int m_lo = mb + g;
        af[mi][0] = ld_shared_b32(sA + swz<S::kARowBytes>(k_lo, m_lo >> 2) + ((m_lo & 3) << 2));
        af[mi][1] =
            ld_shared_b32(sA + swz<S::kARowBytes>(k_lo, (m_lo + 8) >> 2) + ((m_lo & 3) << 2));
        af[mi][2] = ld_shared_b32(sA + swz<S::kARowBytes>(k_lo + 4, m_lo >> 2) + ((m_lo & 3) << 2));
        af[mi][3] =
            ld_shared_b32(sA + swz<S::kARowBytes>(k_lo + 4, (m_lo + 8) >> 2) + ((m_lo & 3) << 2));
      }
    }
#pragma unroll
    for (int nj2 = 0; nj2 < 2; ++nj2) {
      const int nb = warp_n * 32 + nj2 * 16;
      if constexpr (kBMn && kKind == kTF32) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = nb + h * 8 + g;
          const int k_lo = ks * 8 + t;
          bf[nj2 * 2 + h][0] =
              ld_shared_b32(sB + swz<S::kBRowBytes>(k_lo, n >> 2) + ((n & 3) << 2));
          bf[nj2 * 2 + h][1] =
              ld_shared_b32(sB + swz<S::kBRowBytes>(k_lo + 4, n >> 2) + ((n & 3) << 2));
        }
      } else {
        uint32_t r[4];
        if constexpr (!kBMn) {
          // Stored [n][k]: matrices (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi).
          const int row = nb + (lane & 7) + ((lane >> 4) << 3);
          const int ch = ks * 2 + ((lane >> 3) & 1);
          ldmatrix_x4(r, sB + swz<128>(row, ch));
        } else {
          // Stored [k][n]: same four matrices, transposed on the way out.
          const int krow = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          const int ch = (nb >> 3) + (lane >> 4);
          ldmatrix_x4_trans(r, sB + swz<S::kBRowBytes>(krow, ch));
        }
        bf[nj2 * 2][0] = r[0];
        bf[nj2 * 2][1] = r[1];
        bf[nj2 * 2 + 1][0] = r[2];
        bf[nj2 * 2 + 1][1] = r[3];
      }
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) mma<kKind>(acc[mi][nj], af[mi], bf[nj]);
    }
  }
}

// Writes C[row, col] and C[row, col + 1] (the pair an accumulator fragment holds).
template <typename T>
__device__ __forceinline__ void store_pair(const Params& p, int64_t row, int64_t col, float v0,
                                           float v1) {
  if (row >= p.m || col >= p.n) return;
  T* dst = static_cast<T*>(p.c) + row * p.ldc + col;
  const bool has_second = col + 1 < p.n;
  store_c_pair(dst, has_second, p.c_pair, v0, v1, p.alpha, p.beta, p.epi.view<T>(), row, col);
}

template <int kKind, bool kAMn, bool kBMn>
__global__ void __launch_bounds__(kThreads, 1) sm80_gemm_kernel(const Params p) {
  using T = typename KindTraits<kKind>::T;
  using S = TileShape<kKind, kAMn, kBMn>;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_base = smem_addr(smem);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp >> 2;  // 0..1
  const int warp_n = warp & 3;   // 0..3

  const tc::TileIndex tile = tc::grouped_tile(blockIdx.x, p.tiles_m, p.tiles_n, kGroupM);
  const int64_t m0 = static_cast<int64_t>(tile.m) * kBM;
  const int64_t n0 = static_cast<int64_t>(tile.n) * kBN;

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  const int64_t ktiles = (p.k + S::kBK - 1) / S::kBK;
  tc::cp_async_ring<kStages>(
      ktiles,
      [&](int slot, auto kt) {
        load_stage<kKind, kAMn, kBMn>(smem_base + static_cast<uint32_t>(slot) * kStageBytes, p, m0,
                                      n0, kt * S::kBK, tid);
      },
      [&](int slot) {
        const uint32_t stage = smem_base + static_cast<uint32_t>(slot) * kStageBytes;
        compute_stage<kKind, kAMn, kBMn>(stage, stage + kTileBytes, acc, warp_m, warp_n, lane);
      });

  tc::for_each_mma_pair(
      acc, m0 + warp_m * 64, n0 + warp_n * 32, lane,
      [&](int64_t row, int64_t col, float v0, float v1) { store_pair<T>(p, row, col, v0, v1); });
}

// ---- Host side ---------------------------------------------------------------------

template <int kKind, bool kAMn, bool kBMn>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  constexpr auto kernel = sm80_gemm_kernel<kKind, kAMn, kBMn>;
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(kSmemBytes));
  const unsigned grid = static_cast<unsigned>(p.tiles_m) * static_cast<unsigned>(p.tiles_n);
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <int kKind>
cudaError_t launch_kind(const Params& p, bool a_mn, bool b_mn, cudaStream_t stream) {
  if (a_mn) {
    return b_mn ? launch<kKind, true, true>(p, stream) : launch<kKind, true, false>(p, stream);
  }
  return b_mn ? launch<kKind, false, true>(p, stream) : launch<kKind, false, false>(p, stream);
}

}  // namespace

bool gemm_sm80_supports(const GemmArgs& args) {
  if (tc_kind_of(args) < 0) return false;
  if (args.cc_major < 8) return false;
  if (args.m < 1 || args.n < 1 || args.k < 0) return false;
  if (args.a == nullptr || args.b == nullptr || args.c == nullptr) return false;
  if (args.ldc < args.n && args.m > 1) return false;
  const int64_t tiles_m = (args.m + kBM - 1) / kBM;
  const int64_t tiles_n = (args.n + kBN - 1) / kBN;
  // The raster works in 32-bit tile indices.
  if (tiles_m * tiles_n > INT32_MAX - kGroupM * tiles_n) return false;
  return true;
}

cudaError_t gemm_sm80_run(const GemmArgs& args, cudaStream_t stream) {
  if (!gemm_sm80_supports(args)) return cudaErrorNotSupported;
  const int kind = tc_kind_of(args);
  const int elt = static_cast<int>(element_size(args.dtype));
  Params p;
  p.m = args.m;
  p.n = args.n;
  p.k = args.k;
  bool a_mn, b_mn;
  p.a = tc::describe_operand(args.a, args.m, args.a_stride_m, args.k, args.a_stride_k, elt, &a_mn);
  p.b = tc::describe_operand(args.b, args.n, args.b_stride_n, args.k, args.b_stride_k, elt, &b_mn);
  p.c = args.c;
  p.ldc = args.ldc;
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.epi = make_epilogue_params(args.epilogue);
  p.c_pair =
      (reinterpret_cast<uintptr_t>(args.c) % (2 * elt)) == 0 && (args.ldc % 2 == 0 || args.m == 1);
  p.tiles_m = static_cast<int>((args.m + kBM - 1) / kBM);
  p.tiles_n = static_cast<int>((args.n + kBN - 1) / kBN);
  switch (kind) {
    case kBF16:
      return launch_kind<kBF16>(p, a_mn, b_mn, stream);
    case kF16:
      return launch_kind<kF16>(p, a_mn, b_mn, stream);
    default:
      return launch_kind<kTF32>(p, a_mn, b_mn, stream);
  }
}

}  // namespace gemmt
