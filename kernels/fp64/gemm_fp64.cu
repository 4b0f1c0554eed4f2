// float64 GEMM, C = alpha * A @ B + beta * C with double accumulation, in two forms that share
// one CTA tile, one shared-memory pipeline and one epilogue:
//   * dmma (sm_80+): the FP64 tensor cores through mma.sync. sm_90 issues m16n8k8; sm_80
//     has only m8n8k4, and issues four of those for each m16n8k8 step (same fragments).
//   * simt: plain double FMAs from the same shared-memory tiles, for GPUs without FP64
//     tensor cores (and as a second, independent float64 path that tests compare against).
//
// One CTA of 8 warps computes a 128x128 tile of C; in the dmma form each warp owns 64x32 of it
// (4 x 4 m16n8 blocks: 64 double accumulators a thread). Operand tiles are 16 doubles (128
// bytes) deep along K and flow through a 3-stage cp.async ring of 96 KB: a stage holds 2 k8
// steps, about 1800 cycles of DMMA work on an H100 SM, so two stages in flight cover DRAM
// latency; 96 KB also fits the 99 KB of sm_86/sm_89.
//
// Tiles keep the operand's contiguous direction (kernels/common/tc_operand_tiles.cuh), with
// 16-byte chunks XOR-swizzled by row. ldmatrix has no 64-bit form, so fragments come out
// through plain ld.shared. The k index inside a k8 step is relabelled: the MMA's k = t (and
// t + 4) of lane t is the tile's k = 2t (and 2t + 1) for both operands, which leaves the
// product unchanged and puts a lane's two k values of a K-major tile in one 16-byte load.
// With the swizzle, a warp's fragment loads then take the minimum number of shared-memory
// wavefronts: K-major tiles 4 per 16-byte load (512 bytes), MN-major tiles 2 per 8-byte
// load (256 bytes; the rows 2t of the four lanes of a group fall in two bank halves).
//
// Operands whose base or leading dimension breaks 16-byte alignment, or that have no unit
// stride, are filled element by element into the same tiles: every stride runs here.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cp_async.cuh"
#include "common/gemm_epilogue.cuh"
#include "common/shared_memory.cuh"
#include "common/tc_operand_tiles.cuh"
#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"

namespace gemmt {
namespace {

constexpr int kElt = 8;
constexpr int kBM = 128;
constexpr int kBN = 128;
constexpr int kBK = 16;  // doubles of K per stage: 128-byte tile rows
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kTileBytes = 128 * kBK * kElt;  // 16 KB: 128 (M or N) x 16 (K) doubles
constexpr int kStageBytes = 2 * kTileBytes;
constexpr int kSmemBytes = kStages * kStageBytes;
// Rows of 128x128 tiles visited together, so that concurrently running CTAs share panels of
// A and B in L2.
constexpr int kGroupM = 8;

struct Params {
  int64_t m, n, k;
  tc::Operand a, b;
  double* c;
  int64_t ldc;
  double alpha, beta;
  bool c_pair;  // two adjacent outputs can be written with one 16-byte store
  int tiles_m, tiles_n;
  EpilogueParams epi;
};

// A tile's geometry: K-major (kMn false) is 128 rows (M or N) of 16 doubles, MN-major is 16
// rows (K) of 128 doubles.
template <bool kMn>
struct Tile {
  static constexpr int kRows = kMn ? kBK : 128;
  static constexpr int kRowBytes = kMn ? 128 * kElt : kBK * kElt;

  // Byte offset of element (x, p): x along M or N (0..127), p along K (0..kBK-1).
  static __device__ __forceinline__ uint32_t offset(int x, int p) {
    if constexpr (kMn) {
      return tc::swz<kRowBytes>(p, x >> 1) + ((x & 1) << 3);
    } else {
      return tc::swz<kRowBytes>(x, p >> 1) + ((p & 1) << 3);
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

// Elements (x, p) and (x, p + 1) of a tile, p even: one 16-byte load in a K-major tile.
template <bool kMn>
__device__ __forceinline__ void load_k_pair(uint32_t tile, int x, int p, double& v0, double& v1) {
  if constexpr (kMn) {
    v0 = ld_shared_f64(tile + Tile<true>::offset(x, p));
    v1 = ld_shared_f64(tile + Tile<true>::offset(x, p + 1));
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

// One stage of the dmma form: kBK / 8 steps of k8 for the warp's 4 x 4 blocks.
template <bool kAMn, bool kBMn>
__device__ __forceinline__ void compute_stage_dmma(uint32_t sA, uint32_t sB, double (&acc)[4][4][4],
                                                   int warp_m, int warp_n, int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int ks = 0; ks < kBK / 8; ++ks) {
    // The MMA's k = t and t + 4 are the tile's k = 2t and 2t + 1 (see the file comment).
    const int p = ks * 8 + 2 * t;
    // B's fragments for the step, then A's block by block: with 128 registers of
    // accumulators, all of A's 16 doubles at once would leave too few for addresses.
    double bf[4][2];
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      load_k_pair<kBMn>(sB, warp_n * 32 + nj * 8 + g, p, bf[nj][0], bf[nj][1]);
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const int x = warp_m * 64 + mi * 16 + g;
      double af[4];
      load_k_pair<kAMn>(sA, x, p, af[0], af[2]);
      load_k_pair<kAMn>(sA, x + 8, p, af[1], af[3]);
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

template <bool kAMn, bool kBMn>
__device__ __forceinline__ void load_stage(uint32_t stage, const Params& p, int64_t m0, int64_t n0,
                                           int64_t k0, int tid) {
  using TA = Tile<kAMn>;
  using TB = Tile<kBMn>;
  if constexpr (kAMn) {
    tc::load_tile<kElt, TA::kRows, TA::kRowBytes, kThreads>(stage, p.a, k0, m0, tid);
  } else {
    tc::load_tile<kElt, TA::kRows, TA::kRowBytes, kThreads>(stage, p.a, m0, k0, tid);
  }
  if constexpr (kBMn) {
    tc::load_tile<kElt, TB::kRows, TB::kRowBytes, kThreads>(stage + kTileBytes, p.b, k0, n0, tid);
  } else {
    tc::load_tile<kElt, TB::kRows, TB::kRowBytes, kThreads>(stage + kTileBytes, p.b, n0, k0, tid);
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

template <bool kTensorCores, bool kAMn, bool kBMn>
__global__ void __launch_bounds__(kThreads, 1) fp64_gemm_kernel(const Params p) {
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

  // 64 accumulators a thread in either form, arranged as the form writes them out.
  using Acc = std::conditional_t<kTensorCores, double[4][4][4], double[8][4][2]>;
  Acc acc;
  double* const acc_flat = &acc[0][0][0];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc_flat[i] = 0.0;

  const int64_t ktiles = (p.k + kBK - 1) / kBK;
  tc::cp_async_ring<kStages>(
      ktiles,
      [&](int slot, auto kt) {
        load_stage<kAMn, kBMn>(smem_base + static_cast<uint32_t>(slot) * kStageBytes, p, m0, n0,
                               kt * kBK, tid);
      },
      [&](int slot) {
        const uint32_t stage = smem_base + static_cast<uint32_t>(slot) * kStageBytes;
        if constexpr (kTensorCores) {
          compute_stage_dmma<kAMn, kBMn>(stage, stage + kTileBytes, acc, warp_m, warp_n, lane);
        } else {
          compute_stage_simt<kAMn, kBMn>(stage, stage + kTileBytes, acc, tid);
        }
      });

  if constexpr (kTensorCores) {
    tc::for_each_mma_pair(
        acc, m0 + warp_m * 64, n0 + warp_n * 32, lane,
        [&](int64_t row, int64_t col, double v0, double v1) { store_pair(p, row, col, v0, v1); });
  } else {
    const int tm = tid >> 4;
    const int tn = tid & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        store_pair(p, m0 + tm + 16 * i, n0 + 2 * tn + 32 * j, acc[i][j][0], acc[i][j][1]);
      }
    }
  }
}

// ---- Host side ---------------------------------------------------------------------

template <bool kTensorCores, bool kAMn, bool kBMn>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  constexpr auto kernel = fp64_gemm_kernel<kTensorCores, kAMn, kBMn>;
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(kSmemBytes));
  const unsigned grid = static_cast<unsigned>(p.tiles_m) * static_cast<unsigned>(p.tiles_n);
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <bool kTensorCores>
cudaError_t launch_layout(const Params& p, bool a_mn, bool b_mn, cudaStream_t stream) {
  if (a_mn) {
    return b_mn ? launch<kTensorCores, true, true>(p, stream)
                : launch<kTensorCores, true, false>(p, stream);
  }
  return b_mn ? launch<kTensorCores, false, true>(p, stream)
              : launch<kTensorCores, false, false>(p, stream);
}

}  // namespace

bool gemm_fp64_simt_supports(const GemmArgs& args) {
  if (args.dtype != ScalarType::kFloat64) return false;
  if (args.m < 1 || args.n < 1 || args.k < 0) return false;
  // With k == 0, A and B are empty tensors, whose data pointers may be null: C = beta * C.
  if (args.c == nullptr || (args.k > 0 && (args.a == nullptr || args.b == nullptr))) return false;
  if (args.ldc < args.n && args.m > 1) return false;
  const int64_t tiles_m = (args.m + kBM - 1) / kBM;
  const int64_t tiles_n = (args.n + kBN - 1) / kBN;
  // The raster works in 32-bit tile indices.
  return tiles_m * tiles_n <= INT32_MAX - kGroupM * tiles_n;
}

bool gemm_fp64_dmma_supports(const GemmArgs& args) {
  return args.cc_major >= 8 && gemm_fp64_simt_supports(args);
}

cudaError_t gemm_fp64_run(const GemmArgs& args, bool tensor_cores, cudaStream_t stream) {
  if (!(tensor_cores ? gemm_fp64_dmma_supports(args) : gemm_fp64_simt_supports(args))) {
    return cudaErrorNotSupported;
  }
  Params p;
  p.m = args.m;
  p.n = args.n;
  p.k = args.k;
  bool a_mn = false, b_mn = false;
  p.a = tc::describe_operand(args.a, args.m, args.a_stride_m, args.k, args.a_stride_k, kElt, &a_mn);
  p.b = tc::describe_operand(args.b, args.n, args.b_stride_n, args.k, args.b_stride_k, kElt, &b_mn);
  p.c = static_cast<double*>(args.c);
  p.ldc = args.ldc;
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.epi = make_epilogue_params(args.epilogue);
  p.c_pair =
      (reinterpret_cast<uintptr_t>(args.c) % (2 * kElt)) == 0 && (args.ldc % 2 == 0 || args.m == 1);
  p.tiles_m = static_cast<int>((args.m + kBM - 1) / kBM);
  p.tiles_n = static_cast<int>((args.n + kBN - 1) / kBN);
  return tensor_cores ? launch_layout<true>(p, a_mn, b_mn, stream)
                      : launch_layout<false>(p, a_mn, b_mn, stream);
}

}  // namespace gemmt
