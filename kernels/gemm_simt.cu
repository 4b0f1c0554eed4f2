// The SIMT GEMM family: C = alpha * A @ B + beta * C with float32 FFMA accumulation for
// float32, float16 and bfloat16 operands, any operand strides, any shape.
//
// The file is a ladder: each kernel adds one idea to the previous one, and the comment at the
// top of each section says what it adds and why that pays.
//   1. naive             one thread per C element, operands straight from global memory
//   2. smem_tiled        32x32 shared-memory tiles: every loaded element is reused 32 times
//   3. register_blocked  128x128 block tile, 8x8 outputs per thread held in registers
//   4. warp_tiled        warp-shaped thread layout, 16-byte shared loads, padded transposed A
//   5. pipelined         multi-stage cp.async pipeline, fragment double buffering, rasterised
//                        grid, tile shape chosen per problem; 5b. the last, partial wave of
//                        tiles as stream-k (even runs of k-tiles across tiles)
//   6. split_k           the pipelined kernel over k-slices + a fixed-order reduction
//   7. gemv              m == 1 or n == 1: bandwidth-bound dot products
// Every kernel converts elements to float on load, accumulates in float with fmaf and rounds
// once when it writes C. Global offsets are 64-bit throughout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/gemm_simt.h"
#include "gemmt/gemm_simt_tiles.cuh"
#include "gemmt/strided_copy.cuh"

namespace gemmt {
namespace simt {
namespace {

// Operands and output of one product, with typed raw pointers.
template <class T>
struct MatArgs {
  using raw = typename Elem<T>::raw;
  const raw* a;
  int64_t sam, sak;
  const raw* b;
  int64_t sbk, sbn;
  int64_t m, n, k;
  OutView<T> out;
};

template <class T>
__device__ __forceinline__ float ld(const typename Elem<T>::raw* p, int64_t off) {
  return Elem<T>::to_float(p[off]);
}

// Four consecutive elements from an address aligned to 4 elements (16 B fp32, 8 B 16-bit).
template <class T>
__device__ __forceinline__ void load_vec4(const typename Elem<T>::raw* p, float v[4]) {
  if constexpr (std::is_same<T, float>::value) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    v[0] = Elem<T>::to_float(static_cast<uint16_t>(q.x & 0xffffu));
    v[1] = Elem<T>::to_float(static_cast<uint16_t>(q.x >> 16));
    v[2] = Elem<T>::to_float(static_cast<uint16_t>(q.y & 0xffffu));
    v[3] = Elem<T>::to_float(static_cast<uint16_t>(q.y >> 16));
  }
}

// =============================================================================================
// 1. Naive: one thread per element of C.
// Every multiply-add needs two global loads, so the kernel runs at memory (or L1/L2) speed,
// far below the FFMA peak. threadIdx.x runs along n so that a warp's loads of B (row-major)
// and stores of C are coalesced; A is a broadcast within the warp.
// =============================================================================================
constexpr int kNaiveTile = 16;

template <class T>
__global__ void __launch_bounds__(kNaiveTile* kNaiveTile)
    gemm_naive_kernel(const MatArgs<T> p, int tiles_n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x / tiles_n) * kNaiveTile + threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x % tiles_n) * kNaiveTile + threadIdx.x;
  if (i >= p.m || j >= p.n) return;
  const auto* a = p.a + i * p.sam;
  const auto* b = p.b + j * p.sbn;
  float acc = 0.f;
  for (int64_t q = 0; q < p.k; ++q) acc = fmaf(ld<T>(a, q * p.sak), ld<T>(b, q * p.sbk), acc);
  store_one(p.out, i, j, acc);
}

// =============================================================================================
// 2. Shared-memory tiling: a 32x32 block stages 32x32 tiles of A and B in shared memory and
// each thread reads its row / column from there, so every global load feeds 32 FMAs instead
// of one. Whichever of a tile's two dimensions is contiguous in global memory runs along
// threadIdx.x, keeping the loads coalesced for both plain and transposed operands; the +1
// padding makes the column-wise shared store of a transposed operand conflict-free (a stride
// of 33 words visits all 32 banks).
// =============================================================================================
constexpr int kSmemTile = 32;

template <class T>
__global__ void __launch_bounds__(kSmemTile* kSmemTile)
    gemm_smem_tiled_kernel(const MatArgs<T> p, int tiles_n, bool a_m_fast, bool b_k_fast) {
  __shared__ float As[kSmemTile][kSmemTile + 1];  // As[m][k]
  __shared__ float Bs[kSmemTile][kSmemTile + 1];  // Bs[k][n]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x / tiles_n) * kSmemTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x % tiles_n) * kSmemTile;
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < p.k; k0 += kSmemTile) {
    {
      const int ml = a_m_fast ? tx : ty, kl = a_m_fast ? ty : tx;
      const int64_t gm = m0 + ml, gk = k0 + kl;
      As[ml][kl] = (gm < p.m && gk < p.k) ? ld<T>(p.a, gm * p.sam + gk * p.sak) : 0.f;
    }
    {
      const int kl = b_k_fast ? tx : ty, nl = b_k_fast ? ty : tx;
      const int64_t gk = k0 + kl, gn = n0 + nl;
      Bs[kl][nl] = (gk < p.k && gn < p.n) ? ld<T>(p.b, gk * p.sbk + gn * p.sbn) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kSmemTile; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
    __syncthreads();
  }
  if (m0 + ty < p.m && n0 + tx < p.n) store_one(p.out, m0 + ty, n0 + tx, acc);
}

// =============================================================================================
// 3. Register blocking: each thread owns an 8x8 block of C in registers. Per k step it reads
// 8 values of A and 8 of B from shared memory and does 64 FMAs, so shared-memory traffic per
// FMA drops 8x versus step 2 and the kernel starts to be limited by arithmetic. A is stored
// transposed (As[k][m]) so that a thread's 8 A values are contiguous like its 8 B values.
// What is still slow: threads of a warp read B 8 words apart (4-way bank conflicts), global
// loads are scalar, and nothing overlaps the loads with the math.
// =============================================================================================
constexpr int kRbM = 128, kRbN = 128, kRbK = 8, kRbT = 8, kRbThreads = 256;

template <class T>
__global__ void __launch_bounds__(kRbThreads)
    gemm_register_blocked_kernel(const MatArgs<T> p, int tiles_n, bool a_k_fast, bool b_k_fast) {
  __shared__ float As[kRbK][kRbM];
  __shared__ float Bs[kRbK][kRbN];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x / tiles_n) * kRbM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x % tiles_n) * kRbN;
  float acc[kRbT][kRbT] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += kRbK) {
#pragma unroll
    for (int e = 0; e < kRbM * kRbK / kRbThreads; ++e) {
      const int idx = tid + e * kRbThreads;
      // Consecutive threads walk the operand's contiguous dimension (coalesced loads).
      const int kl = a_k_fast ? idx % kRbK : idx / kRbM;
      const int ml = a_k_fast ? idx / kRbK : idx % kRbM;
      const int64_t gm = m0 + ml, gk = k0 + kl;
      As[kl][ml] = (gm < p.m && gk < p.k) ? ld<T>(p.a, gm * p.sam + gk * p.sak) : 0.f;
    }
#pragma unroll
    for (int e = 0; e < kRbN * kRbK / kRbThreads; ++e) {
      const int idx = tid + e * kRbThreads;
      const int kl = b_k_fast ? idx % kRbK : idx / kRbN;
      const int nl = b_k_fast ? idx / kRbK : idx % kRbN;
      const int64_t gk = k0 + kl, gn = n0 + nl;
      Bs[kl][nl] = (gk < p.k && gn < p.n) ? ld<T>(p.b, gk * p.sbk + gn * p.sbn) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kRbK; ++kk) {
      float a[kRbT], b[kRbT];
#pragma unroll
      for (int i = 0; i < kRbT; ++i) a[i] = As[kk][ty * kRbT + i];
#pragma unroll
      for (int j = 0; j < kRbT; ++j) b[j] = Bs[kk][tx * kRbT + j];
#pragma unroll
      for (int i = 0; i < kRbT; ++i)
#pragma unroll
        for (int j = 0; j < kRbT; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kRbT; ++i) {
    const int64_t row = m0 + ty * kRbT + i;
    if (row >= p.m) continue;
#pragma unroll
    for (int j = 0; j < kRbT; ++j) {
      const int64_t col = n0 + tx * kRbT + j;
      if (col < p.n) store_one(p.out, row, col, acc[i][j]);
    }
  }
}

// =============================================================================================
// 4. Warp tiling. Same 128x128x8 block tile and 8x8 outputs per thread as step 3, but:
//  * threads are laid out as 4x2 warps of 32x64 outputs, lanes 4 (m) x 8 (n), and a thread's
//    8 rows / 8 columns are two runs of 4 spaced 16 / 32 apart. At a fixed k, the 8 lanes of a
//    quarter-warp then read 8 consecutive float4 of B (128 B, conflict-free) and one float4
//    of A (broadcast), each with one LDS.128: 4 shared loads per 64 FMAs instead of 16;
//  * global loads are 4-element vectors along the operand's contiguous dimension when
//    alignment allows (a scalar path covers any other stride);
//  * A and B rows in shared memory are padded to 132 words. When a row-major A is written
//    transposed, lane pairs cover 8 k of 16 rows; 132 = 4 (mod 32) puts the 4 k of one
//    vector in distinct bank groups, so those scalar stores are conflict-free too.
// =============================================================================================
constexpr int kWtM = 128, kWtN = 128, kWtK = 8, kWtThreads = 256;
constexpr int kWtPad = 4;

// Stages one [kWtK][128] operand tile (element (k, c) at base[c * sc + k * sk]) as floats.
// mode: 0 = 4-vectors along c, 1 = 4-vectors along k (written transposed), 2 = scalar.
template <class T, int PITCH>
__device__ __forceinline__ void warp_tiled_stage(float* S, const typename Elem<T>::raw* base,
                                                 int64_t sc, int64_t sk, int64_t c0, int64_t c_ext,
                                                 int64_t k0, int64_t k_ext, int mode, int tid) {
  float v[4];
  if (mode == 0) {
    const int kl = tid / 32, cl = 4 * (tid % 32);
    const int64_t gk = k0 + kl, gc = c0 + cl;
    if (gk < k_ext && gc + 4 <= c_ext) {
      load_vec4<T>(base + gc + gk * sk, v);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[j] = (gk < k_ext && gc + j < c_ext) ? ld<T>(base, gc + j + gk * sk) : 0.f;
    }
    *reinterpret_cast<float4*>(S + kl * PITCH + cl) = make_float4(v[0], v[1], v[2], v[3]);
  } else if (mode == 1) {
    const int cl = tid / 2, kl = 4 * (tid % 2);
    const int64_t gk = k0 + kl, gc = c0 + cl;
    if (gc < c_ext && gk + 4 <= k_ext) {
      load_vec4<T>(base + gc * sc + gk, v);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[j] = (gc < c_ext && gk + j < k_ext) ? ld<T>(base, gc * sc + gk + j) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) S[(kl + j) * PITCH + cl] = v[j];
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int cl = tid % 128, kl = tid / 128 + 2 * e;
      const int64_t gk = k0 + kl, gc = c0 + cl;
      S[kl * PITCH + cl] = (gc < c_ext && gk < k_ext) ? ld<T>(base, gc * sc + gk * sk) : 0.f;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kWtThreads)
    gemm_warp_tiled_kernel(const MatArgs<T> p, int tiles_n, int a_mode, int b_mode) {
  constexpr int PA = kWtM + kWtPad, PB = kWtN + kWtPad;
  constexpr int WM = 32, WN = 64, LN = 8;
  __shared__ __align__(16) float As[kWtK * PA];
  __shared__ __align__(16) float Bs[kWtK * PB];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / 2, warp_n = warp % 2;
  const int lane_m = lane / LN, lane_n = lane % LN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x / tiles_n) * kWtM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x % tiles_n) * kWtN;
  const int a_off = warp_m * WM + lane_m * 4;
  const int b_off = warp_n * WN + lane_n * 4;
  float acc[8][8] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += kWtK) {
    warp_tiled_stage<T, PA>(As, p.a, p.sam, p.sak, m0, p.m, k0, p.k, a_mode, tid);
    warp_tiled_stage<T, PB>(Bs, p.b, p.sbn, p.sbk, n0, p.n, k0, p.k, b_mode, tid);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kWtK; ++kk) {
      const float4 a0 = *reinterpret_cast<const float4*>(As + kk * PA + a_off);
      const float4 a1 = *reinterpret_cast<const float4*>(As + kk * PA + a_off + 16);
      const float4 b0 = *reinterpret_cast<const float4*>(Bs + kk * PB + b_off);
      const float4 b1 = *reinterpret_cast<const float4*>(Bs + kk * PB + b_off + 32);
      const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = m0 + a_off + (i / 4) * 16 + (i % 4);
#pragma unroll
    for (int jc = 0; jc < 2; ++jc) store_quad(p.out, row, n0 + b_off + jc * 32, &acc[i][jc * 4]);
  }
}

// =============================================================================================
// 5. Pipelined: the fast SIMT kernel.
// Over step 4 it adds:
//  * a STAGES-deep ring of shared-memory tiles filled by cp.async (float32) or by register-
//    staged loads (16-bit types, which must be widened on the way): the loads of tile t+2
//    are in flight while tile t is multiplied, so global latency is hidden by the math
//    instead of by other warps, and one barrier per k-tile suffices;
//  * fragment double buffering: the shared loads of k-step kk+1 are issued before the FMAs
//    of step kk, so their latency overlaps arithmetic even at 4 warps per block;
//  * 128 (large tile) accumulators per thread: per k step a thread issues 6 LDS.128 for 128
//    FFMA, which keeps shared-memory bandwidth and issue slots below the FFMA rate;
//  * a grouped launch order for L2 reuse, and a tile shape chosen per problem on the host;
//  * for problems that are whole tiles, an interior instance with branch-free copies that
//    the compiler interleaves with the FFMAs (gemm_pipelined_kernel's INTERIOR).
// =============================================================================================
// A thread's fragment of one operand at one k: N floats in runs of 4, run q at src + q * STEP
// (16-byte shared loads).
template <int N, int STEP>
__device__ __forceinline__ void load_fragment(float* dst, const float* src) {
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 v = *reinterpret_cast<const float4*>(src + q * STEP);
    dst[4 * q] = v.x;
    dst[4 * q + 1] = v.y;
    dst[4 * q + 2] = v.z;
    dst[4 * q + 3] = v.w;
  }
}

template <int BM_, int BN_, int BK_, int WM_, int WN_, int TM_, int TN_, int STAGES_, int MINB_>
struct PipeConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, TM = TM_, TN = TN_;
  static constexpr int STAGES = STAGES_, MIN_BLOCKS = MINB_;
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int LM = WM / TM, LN = WN / TN;  // lanes along m and n inside a warp
  // +4 words per shared row: 16-byte aligned rows, and the transposing loaders' lane pattern
  // lands in distinct banks (see AsyncTileLoader).
  static constexpr int PA = BM + 4, PB = BN + 4;
  static constexpr int STAGE_FLOATS = BK * (PA + PB);
  static constexpr int SMEM_BYTES = STAGES * STAGE_FLOATS * 4;
  static_assert(LM * LN == 32, "a warp is 32 lanes");
  static_assert(TM % 4 == 0 && TN % 4 == 0, "fragments are read as float4");
  static_assert(STAGES >= 2, "the ring needs a stage to fill while one is read");
};

// Large: 2x2 warps of 64x64, 16x8 per thread. For big problems: best FFMA : LDS ratio.
using CfgLarge = PipeConfig<128, 128, 16, 64, 64, 16, 8, 3, 2>;
// Medium: 2x2 warps of 32x64, 8x8 per thread; twice the tiles of Large for mid-size shapes.
using CfgMedium = PipeConfig<64, 128, 16, 32, 64, 8, 8, 3, 3>;
// Small: 2x2 warps of 32x32, 8x4 per thread; fills the GPU when C has few 128x128 tiles.
using CfgSmall = PipeConfig<64, 64, 16, 32, 32, 8, 4, 3, 4>;
// Fat: 128x256, 2x4 warps of 64x64, 16x8 per thread, 8 warps in one block per SM. Float32
// only. On an H100 it is the fastest shape for large C (48.4 TFLOP/s at 8192^3 against 46.8
// for Large): one block of 8 warps keeps the same FFMA : LDS ratio as Large while each B
// panel is loaded once for 256 columns. Wide (8x8 per thread, 8 warps), Tall (256x128) and a
// 4-stage Large were measured as well and lost everywhere to one of these four.
using CfgFat = PipeConfig<128, 256, 16, 64, 64, 16, 8, 3, 1>;
// Fat's interior instances keep four stages (98 KiB): with a single block per SM no other
// block hides a late tile, and one more tile in flight paid 0.5-1.5% on the 2048-8192
// squares (H100). The general instances ran slower with four (under 1% in the experiment,
// 2-4% in the self-test sweep), and a k-tile of 8 with 5 stages (half the unrolled loop) lost
// 1-2% in both.
using CfgFatInterior = PipeConfig<128, 256, 16, 64, 64, 16, 8, 4, 1>;
// Narrow: 128x64, 4x1 warps of 32x64, 8x8 per thread (Medium turned on its side). Float32
// only. For n <= 64 (tall-skinny products, usually split over k) every other shape wastes
// columns or, as Small, pays Small's low FFMA : LDS ratio.
using CfgNarrow = PipeConfig<128, 64, 16, 32, 64, 8, 8, 3, 3>;

constexpr int kRasterGroup = 8;

// Stream-k (ladder step 5b): the last, partly filled wave of a data-parallel grid idles the
// SMs it does not reach (at 4096^3 the 128x256 tile makes 512 tiles, 3.88 waves of 132 SMs:
// 4 waves' time for 3.88 waves' work). The stream-k form of the pipelined kernel instead
// deals the k-tiles of the last tiles out evenly to one full wave of blocks, each a
// contiguous run that may start and end inside a tile; the tiles before them run as
// ordinary data-parallel blocks. A tile covered by several blocks is finished by exactly one
// of them: each other contributor publishes its raw sums to a workspace slot and counts
// itself in; the tile's first contributor, when it finds everyone else in, adds their slots
// to its registers, otherwise the last to arrive adds all slots. Either way the sums are
// added in contributor order, so results do not depend on timing, and no block ever waits
// for another.
struct StreamKParams {
  int first_tile;  // launch-order index of the first stream-k tile
  int k_tiles;     // k-tiles per output tile
  int64_t iters;   // k-tiles of each block; the first `extra` blocks take one more
  int64_t extra;
  float* slots;   // [blocks][2] slots of THREADS * TM * TN floats, thread-major
  int* arrivals;  // per stream-k tile: contributors that published; zero at launch

  __device__ __forceinline__ int64_t begin(int64_t block) const {
    return block * iters + min(block, extra);
  }
  __device__ __forceinline__ int block_of(int64_t it) const {
    const int64_t longer = extra * (iters + 1);
    return static_cast<int>(it < longer ? it / (iters + 1) : extra + (it - longer) / iters);
  }
  // A block's slot 0 holds the tile its run starts in, slot 1 the tile its run ends in.
  __device__ __forceinline__ int slot_of(int block, int tile) const {
    return begin(block) / k_tiles == tile ? 0 : 1;
  }
};

struct PipeParams {
  const void* a;
  int64_t sam, sak;
  const void* b;
  int64_t sbk, sbn;
  int64_t m, n, k;
  void* c;
  int64_t ldc;
  float alpha, beta;
  bool c_vec4;
  float* partial;       // split-k: [splits][m][n] float32 slices; nullptr writes C directly
  bool partial_vec4;    // n % 4 == 0: slice rows are 16-byte aligned
  int64_t k_per_split;  // multiple of BK
  int tiles_m, tiles_n;
  StreamKParams sk;    // the stream-k form only
  EpilogueParams epi;  // applied where C is written (split-k: by the reduction)
};

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The workspace slots of the stream-k form: one thread's TM x TN sums as TM * TN / 4
// 16-byte words, word w of thread t at w * THREADS + t, so every store and load is
// coalesced and the reading block uses the same thread -> accumulator map.
template <class Cfg>
struct StreamKSlots {
  static constexpr int TM = Cfg::TM, TN = Cfg::TN, THREADS = Cfg::THREADS;

  __device__ __forceinline__ static float4* slot(const StreamKParams& s, int block, int idx) {
    return reinterpret_cast<float4*>(s.slots) +
           (static_cast<int64_t>(block) * 2 + idx) * (TM * TN / 4) * THREADS + threadIdx.x;
  }

  __device__ __forceinline__ static void publish(const StreamKParams& s, int tile,
                                                 const float (&acc)[TM][TN]) {
    float4* dst = slot(s, blockIdx.x, s.slot_of(blockIdx.x, tile));
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int q = 0; q < TN / 4; ++q)
        __stcg(dst + (i * (TN / 4) + q) * THREADS,
               make_float4(acc[i][4 * q], acc[i][4 * q + 1], acc[i][4 * q + 2], acc[i][4 * q + 3]));
  }

  // acc += the slots of contributors first .. last, in that order.
  __device__ __forceinline__ static void add(const StreamKParams& s, int tile, int first, int last,
                                             float (&acc)[TM][TN]) {
    for (int b = first; b <= last; ++b) {
      const float4* src = slot(s, b, s.slot_of(b, tile));
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int q = 0; q < TN / 4; ++q) {
          const float4 v = __ldcg(src + (i * (TN / 4) + q) * THREADS);
          acc[i][4 * q] += v.x;
          acc[i][4 * q + 1] += v.y;
          acc[i][4 * q + 2] += v.z;
          acc[i][4 * q + 3] += v.w;
        }
    }
  }
};

// A stream-k block's share of a tile it covers only in part (`head`: its run covers the
// tile's first k-tile, so it is the tile's first contributor). Returns true when this block
// finishes the tile: acc then holds the tile's whole sums, to be written to C.
template <class Cfg>
__device__ __forceinline__ bool streamk_share(const StreamKParams& s, int tile, bool head,
                                              float (&acc)[Cfg::TM][Cfg::TN]) {
  using Slots = StreamKSlots<Cfg>;
  __shared__ int finish;
  const int64_t t0 = static_cast<int64_t>(tile) * s.k_tiles;
  const int first = s.block_of(t0), last = s.block_of(t0 + s.k_tiles - 1);
  int* arrivals = s.arrivals + tile;
  if (head) {
    // The head's run ends in this tile, so it usually finishes last: then nothing needs
    // publishing, and its registers are contributor 0's sums.
    if (threadIdx.x == 0) finish = load_acquire(arrivals) == last - first;
    __syncthreads();
    if (finish) {
      Slots::add(s, tile, first + 1, last, acc);
      return true;
    }
  }
  Slots::publish(s, tile, acc);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) finish = atomicAdd(arrivals, 1) == last - first;
  __syncthreads();
  if (!finish) return false;
  __threadfence();
  // -0 is the exact identity of float addition, so this equals the head's in-place sum.
#pragma unroll
  for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = -0.f;
  Slots::add(s, tile, first, last, acc);
  return true;
}

// INTERIOR instances serve problems whose every block and k-range is whole tiles (float32,
// vector loader modes; the host checks): their copies carry no bound checks or branches, and
// their FFMAs run column by column (see the inner loop). On an H100 squares of 1024-8192
// ran 2-4% faster than with the general instance for the 128x256 tile, 5-10% for 64x128.
// STREAMK instances are the stream-k form (see StreamKParams): the block loops over the runs
// of its k-tiles, one per tile it touches. The data-parallel form (STREAMK false) is the
// same code without the loop; keeping one body keeps its machine code exactly as tuned.
template <class T, class Cfg, int AMODE, int BMODE, bool INTERIOR, bool STREAMK = false>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    gemm_pipelined_kernel(const PipeParams p) {
  using raw = typename Elem<T>::raw;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, TM = Cfg::TM, TN = Cfg::TN;
  constexpr int LM = Cfg::LM, LN = Cfg::LN, PA = Cfg::PA, PB = Cfg::PB;
  constexpr int STAGES = Cfg::STAGES, THREADS = Cfg::THREADS;
  constexpr int STAGE_FLOATS = Cfg::STAGE_FLOATS, B_OFF = BK * PA;
  constexpr bool kAsync = std::is_same<T, float>::value;
  // Column snake against plain column order, interior instances, H100 squares 2048-8192:
  // 128x256 tile 1-2.5% faster with B read along n, 0-1.5% slower with B read along k;
  // 64x128 tile at most 1% faster, and 3-26% slower with A read along m (the order meets
  // the loaders' code, which ptxas schedules among the FFMAs).
  constexpr bool kColumnSnake = std::is_same<Cfg, CfgFatInterior>::value && BMODE == kVecC;
  static_assert(!INTERIOR || kAsync, "interior instances are float32 (cp.async) only");
  static_assert(!STREAMK || kAsync, "stream-k instances are float32 (cp.async) only");
  using LoaderA = std::conditional_t<kAsync, AsyncTileLoader<AMODE, BK, BM, THREADS, PA>,
                                     RegTileLoader<T, AMODE, BK, BM, THREADS, PA>>;
  using LoaderB = std::conditional_t<kAsync, AsyncTileLoader<BMODE, BK, BN, THREADS, PB>,
                                     RegTileLoader<T, BMODE, BK, BN, THREADS, PB>>;

  extern __shared__ __align__(16) float smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
  const int lane_m = lane / LN, lane_n = lane % LN;

  // Stream-k: this block's k-tiles [it, it_end) of the stream-k tiles, taken one tile's run
  // per pass of the loop.
  [[maybe_unused]] int64_t it = 0, it_end = 0;
  if constexpr (STREAMK) {
    it = p.sk.begin(blockIdx.x);
    it_end = p.sk.begin(static_cast<int64_t>(blockIdx.x) + 1);
  }
  do {
    int tm, tn;
    int64_t k_begin, k_end;
    [[maybe_unused]] int sk_tile = 0;
    [[maybe_unused]] bool sk_head = true, sk_whole = true;
    const int split = blockIdx.z;
    if constexpr (STREAMK) {
      sk_tile = static_cast<int>(it / p.sk.k_tiles);
      const int64_t t0 = static_cast<int64_t>(sk_tile) * p.sk.k_tiles, t1 = t0 + p.sk.k_tiles;
      const int64_t run_end = min(it_end, t1);
      swizzle_tile<kRasterGroup>(p.sk.first_tile + sk_tile, p.tiles_m, p.tiles_n, tm, tn);
      k_begin = (it - t0) * BK;
      k_end = min(p.k, (run_end - t0) * BK);
      sk_head = it == t0;
      sk_whole = sk_head && run_end == t1;
      it = run_end;
      __syncthreads();  // the previous run's last shared-memory reads precede this prologue
    } else {
      swizzle_tile<kRasterGroup>(blockIdx.x, p.tiles_m, p.tiles_n, tm, tn);
      k_begin = split * p.k_per_split;
      k_end = min(p.k, k_begin + p.k_per_split);
    }
    const int num_kt = k_end > k_begin ? static_cast<int>((k_end - k_begin + BK - 1) / BK) : 0;

    LoaderA la;
    LoaderB lb;
    la.init(static_cast<const raw*>(p.a), p.sam, p.sak, static_cast<int64_t>(tm) * BM, p.m, k_begin,
            tid);
    lb.init(static_cast<const raw*>(p.b), p.sbn, p.sbk, static_cast<int64_t>(tn) * BN, p.n, k_begin,
            tid);
    const uint32_t smem0 = smem_addr(smem);

    // Issues the loads of the next tile (at k = tile_k) into the stage at byte address
    // stage_addr. Only the last tile of a slice can cross k_end; the others take the
    // check-free path.
    int64_t tile_k = k_begin;
    auto load_tile = [&](uint32_t stage_addr) {
      if (tile_k + BK <= k_end) {
        la.template load<true>(stage_addr, tile_k, k_end);
        lb.template load<true>(stage_addr + B_OFF * 4, tile_k, k_end);
      } else {
        la.template load<false>(stage_addr, tile_k, k_end);
        lb.template load<false>(stage_addr + B_OFF * 4, tile_k, k_end);
      }
      tile_k += BK;
    };
    auto load_interior_tile = [&](uint32_t stage_addr, int tile) {
      if constexpr (INTERIOR) {
        la.load_interior(stage_addr, tile);
        lb.load_interior(stage_addr + B_OFF * 4, tile);
      }
    };

    // Prologue: tiles 0 .. STAGES-2 into stages 0 .. STAGES-2, one commit group per tile
    // (empty groups included), so that "group g complete" always means "tile g landed".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < num_kt) {
        if constexpr (INTERIOR) {
          load_interior_tile(smem0 + s * STAGE_FLOATS * 4, s);
        } else {
          load_tile(smem0 + s * STAGE_FLOATS * 4);
          la.store(smem + s * STAGE_FLOATS);
          lb.store(smem + s * STAGE_FLOATS + B_OFF);
        }
      }
      cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    float af[2][TM], bf[2][TN];
    const int a_off = warp_m * Cfg::WM + lane_m * 4;
    const int b_off = B_OFF + warp_n * Cfg::WN + lane_n * 4;
    auto load_frags = [&](float* fa, float* fb, const float* stage, int kk) {
      load_fragment<TM, LM * 4>(fa, stage + kk * PA + a_off);
      load_fragment<TN, LN * 4>(fb, stage + kk * PB + b_off);
    };

    // Invariants at the top of k-tile kt: stage kt % STAGES holds tile kt (published by the
    // last barrier), fragments of its k-step 0 are in af[0] / bf[0], and write_stage =
    // (kt - 1) % STAGES is the stage every thread finished reading before that barrier.
    int read_stage = 0, write_stage = STAGES - 1;
    const float* rd = smem;
    load_frags(af[0], bf[0], rd, 0);
    for (int kt = 0; kt < num_kt; ++kt) {
      const bool more = kt + STAGES - 1 < num_kt;
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        if (kk == BK - 1) {
          // All fragments of this tile are in registers. Publish tile kt + STAGES - 1
          // (register-staged loaders write it now), wait for this thread's copies of tile
          // kt + 1, and let one barrier both publish those and release stage kt % STAGES.
          if (more) {
            la.store(smem + write_stage * STAGE_FLOATS);
            lb.store(smem + write_stage * STAGE_FLOATS + B_OFF);
          }
          write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
          cp_async_wait<STAGES - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
          rd = smem + read_stage * STAGE_FLOATS;
        }
        // Next k step's fragments (k-step 0 of the next tile when kk == BK - 1; on the last
        // tile that read is of a stale stage and is never used).
        load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], rd, (kk + 1) % BK);
        if (kk == 0) {
          // Refill the stage released by the previous barrier with tile kt + STAGES - 1.
          // Interior instances clamp instead of branching: past the slice's last tile they copy
          // that tile again into the free stage, which is never read.
          if constexpr (INTERIOR)
            load_interior_tile(smem0 + write_stage * STAGE_FLOATS * 4,
                               min(kt + STAGES - 1, num_kt - 1));
          else if (more)
            load_tile(smem0 + write_stage * STAGE_FLOATS * 4);
          cp_async_commit();
        }
        // The FFMA order decides how ptxas allocates registers and schedules the copies among
        // the FFMAs, which moved the H100 rate by up to 26% between orders: row by row was
        // measured fastest for the general instances, column by column for the interior
        // ones, except a column snake (down column 0, up column 1, ...) for the 128x256
        // interior tile when B is read along n (benchmarks/experiments/ffma_order).
        if constexpr (INTERIOR) {
#pragma unroll
          for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int r = 0; r < TM; ++r) {
              const int i = kColumnSnake && j % 2 == 1 ? TM - 1 - r : r;
              acc[i][j] = fmaf(af[kk & 1][i], bf[kk & 1][j], acc[i][j]);
            }
        } else {
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(af[kk & 1][i], bf[kk & 1][j], acc[i][j]);
        }
      }
    }
    cp_async_wait<0>();

    bool write_c = true;
    if constexpr (STREAMK)
      if (!sk_whole) write_c = streamk_share<Cfg>(p.sk, sk_tile, sk_head, acc);
    const int64_t row0 = static_cast<int64_t>(tm) * BM + a_off;
    const int64_t col0 = static_cast<int64_t>(tn) * BN + warp_n * Cfg::WN + lane_n * 4;
    if (p.partial != nullptr) {
      float* ws = p.partial + static_cast<int64_t>(split) * p.m * p.n;
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const int64_t row = row0 + (i / 4) * LM * 4 + (i % 4);
#pragma unroll
        for (int q = 0; q < TN / 4; ++q)
          store_partial_quad(ws, p.m, p.n, p.partial_vec4, row, col0 + q * LN * 4, &acc[i][4 * q]);
      }
    } else if (write_c) {
      const OutView<T> out{static_cast<raw*>(p.c), p.ldc, p.m, p.n, p.alpha, p.beta, p.c_vec4,
                           p.epi.view<T>()};
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const int64_t row = row0 + (i / 4) * LM * 4 + (i % 4);
#pragma unroll
        for (int q = 0; q < TN / 4; ++q) store_quad(out, row, col0 + q * LN * 4, &acc[i][4 * q]);
      }
    }
  } while (STREAMK && it < it_end);
}

// 6. Split-k: when C has too few tiles to fill the GPU but k is long, the pipelined kernel
// runs over `splits` k-slices (blockIdx.z) and writes float32 partial tiles to a workspace;
// this kernel then adds the slices in slice order (deterministic, no atomics), applies
// alpha / beta and rounds once. The same reduction finishes the split gemv.
// Output element (r, c) is out[r * ld + c * cs]; slice s element (r, c) is
// ws[(s * rows + r) * cols + c].
// =============================================================================================
template <class T>
__global__ void __launch_bounds__(256)
    reduce_slices_kernel(const float* __restrict__ ws, int splits, int64_t rows, int64_t cols,
                         typename Elem<T>::raw* out, int64_t ld, int64_t cs, float alpha,
                         float beta, const EpilogueView<T> epi) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (col >= cols) return;
  const int64_t slice = rows * cols;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* src = ws + r * cols + col;
    float s = 0.f;
    for (int q = 0; q < splits; ++q) s += src[q * slice];
    typename Elem<T>::raw* o = out + r * ld + col * cs;
    float v = alpha * s;
    if (beta != 0.f) v = fmaf(beta, Elem<T>::to_float(*o), v);
    if (epi.active) v = epi.apply(r, col, v);  // only matrix outputs (cs == 1) carry one
    *o = Elem<T>::from_float(v);
  }
}

// The same for matrix outputs whose rows hold whole quads (n % 4 == 0), over the flattened
// output: a thread adds four neighbouring columns of every slice with 16-byte loads, so a
// narrow output (n = 64) keeps every lane busy where the kernel above idles three in four.
// A small output has few threads, each walking many slices, so the loop loads 16 slices
// before adding them, letting the compiler keep several loads in flight per thread (an
// unroll of 4 took 17 us for 256x256 from 64 slices, against 9.6 for the kernel above).
// Slices are still added in order, so both kernels round alike.
constexpr int kReduceThreads = 128;
constexpr int kReduceUnroll = 16;

template <class T>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_slice_quads_kernel(const float* __restrict__ ws, int splits, const OutView<T> o) {
  const int64_t slice = o.m * o.n;
  const int64_t quads = slice / 4;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kReduceThreads + threadIdx.x; i < quads;
       i += static_cast<int64_t>(gridDim.x) * kReduceThreads) {
    const float* src = ws + 4 * i;
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    int q = 0;
    for (; q + kReduceUnroll <= splits; q += kReduceUnroll) {
      float4 v[kReduceUnroll];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u)
        v[u] = __ldg(reinterpret_cast<const float4*>(src + (q + u) * slice));
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
        s[0] += v[u].x;
        s[1] += v[u].y;
        s[2] += v[u].z;
        s[3] += v[u].w;
      }
    }
    for (; q < splits; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(src + q * slice));
      s[0] += v.x;
      s[1] += v.y;
      s[2] += v.z;
      s[3] += v.w;
    }
    store_quad(o, 4 * i / o.n, 4 * i % o.n, s);
  }
}

// C = beta * C over rows x cols (element (r, c) at out[r * ld + c * cs]); beta == 0 stores
// zeros without reading, so NaN in C does not survive.
template <class T>
__global__ void __launch_bounds__(256)
    scale_kernel(typename Elem<T>::raw* out, int64_t rows, int64_t cols, int64_t ld, int64_t cs,
                 float beta, const EpilogueView<T> epi, bool column) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (col >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    typename Elem<T>::raw* o = out + r * ld + col * cs;
    float v = beta == 0.f ? 0.f : beta * Elem<T>::to_float(*o);
    // A single column is walked as one row: element `col` is C's (col, 0).
    if (epi.active) v = column ? epi.apply(col, 0, v) : epi.apply(r, col, v);
    *o = Elem<T>::from_float(v);
  }
}

// =============================================================================================
// 7. GEMV (m == 1 or n == 1). Each output is a dot product of length k, every matrix element
// is used once, so the kernel is bound by DRAM bandwidth: the goal is wide, coalesced loads
// and enough bytes in flight. Both cases are out[r] = sum_p M(r, p) * v(p) with
// M(r, p) = mat[r * s_r + p * s_p]:
//   n == 1: M = A, v = column 0 of B;   m == 1: M = B^T, v = row 0 of A.
// Row-dot kernel (p contiguous, or no unit stride): warps stream along p with 16-byte loads,
//   shuffle-reduce, then warps of one row combine in shared memory in fixed order.
// Column-sweep kernel (r contiguous): a lane owns 1 or 8/4 consecutive rows and walks p, so a
//   warp reads 512 contiguous bytes per step; 8 warps split p and combine in fixed order.
// Long dot products with few outputs additionally split p across blockIdx.y into workspace
// slices, finished by reduce_slices_kernel.
// =============================================================================================
struct GemvParams {
  const void* mat;
  int64_t s_r, s_p;
  const void* vec;
  int64_t s_v;
  int64_t rows, len;
  void* out;
  int64_t s_out;
  float alpha, beta;
  float* partial;  // [splits][rows] when p is split
  int64_t p_per_split;
  int rows_per_block;  // row-dot: 1, 2, 4 or 8 rows per 8-warp block
  bool vec16;
};

template <class T>
__device__ __forceinline__ void gemv_finish(const GemvParams& g, int64_t row, float s) {
  if (g.partial != nullptr) {
    g.partial[static_cast<int64_t>(blockIdx.y) * g.rows + row] = s;
    return;
  }
  auto* o = static_cast<typename Elem<T>::raw*>(g.out) + row * g.s_out;
  float v = g.alpha * s;
  if (g.beta != 0.f) v = fmaf(g.beta, Elem<T>::to_float(*o), v);
  *o = Elem<T>::from_float(v);
}

template <class T>
__device__ __forceinline__ float dot16(const uint4& a, const uint4& b, float acc) {
  if constexpr (std::is_same<T, float>::value) {
    acc = fmaf(__uint_as_float(a.x), __uint_as_float(b.x), acc);
    acc = fmaf(__uint_as_float(a.y), __uint_as_float(b.y), acc);
    acc = fmaf(__uint_as_float(a.z), __uint_as_float(b.z), acc);
    acc = fmaf(__uint_as_float(a.w), __uint_as_float(b.w), acc);
  } else {
    float fa[8], fb[8];
    unpack8<T>(a, fa);
    unpack8<T>(b, fb);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(fa[i], fb[i], acc);
  }
  return acc;
}

template <class T>
__global__ void __launch_bounds__(256) gemv_rowdot_kernel(const GemvParams g) {
  using raw = typename Elem<T>::raw;
  constexpr int VE = 16 / sizeof(raw);
  __shared__ float red[8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wpr = 8 / g.rows_per_block;
  const int row_in_block = warp / wpr, sub = warp % wpr;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * g.rows_per_block + row_in_block;
  const int64_t p0 = static_cast<int64_t>(blockIdx.y) * g.p_per_split;
  const int64_t p1 = min(g.len, p0 + g.p_per_split);
  const raw* mat = static_cast<const raw*>(g.mat);
  const raw* vec = static_cast<const raw*>(g.vec);
  const int stride = wpr * 32;
  float acc = 0.f;
  if (row < g.rows && p0 < p1) {
    const raw* mrow = mat + row * g.s_r;
    int64_t tail = p0;
    if (g.vec16) {
      // p0 is a multiple of VE and rows are 16-byte aligned (checked on the host).
      const int64_t nvec = (p1 - p0) / VE;
      const uint4* mv = reinterpret_cast<const uint4*>(mrow + p0);
      const uint4* vv = reinterpret_cast<const uint4*>(vec + p0);
#pragma unroll 4
      for (int64_t i = sub * 32 + lane; i < nvec; i += stride) acc = dot16<T>(mv[i], vv[i], acc);
      tail = p0 + nvec * VE;
    }
    for (int64_t q = tail + sub * 32 + lane; q < p1; q += stride)
      acc = fmaf(ld<T>(mrow, q * g.s_p), ld<T>(vec, q * g.s_v), acc);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) red[warp] = acc;
  __syncthreads();
  if (sub == 0 && lane == 0 && row < g.rows) {
    float s = 0.f;
    for (int w = 0; w < wpr; ++w) s += red[row_in_block * wpr + w];
    gemv_finish<T>(g, row, s);
  }
}

template <class T, bool VEC>
__global__ void __launch_bounds__(256) gemv_colsweep_kernel(const GemvParams g) {
  using raw = typename Elem<T>::raw;
  constexpr int VR = VEC ? 16 / static_cast<int>(sizeof(raw)) : 1;
  __shared__ float red[8][VR][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * 32 + lane) * VR;
  const int64_t p0 = static_cast<int64_t>(blockIdx.y) * g.p_per_split;
  const int64_t p1 = min(g.len, p0 + g.p_per_split);
  const raw* mat = static_cast<const raw*>(g.mat);
  const raw* vec = static_cast<const raw*>(g.vec);
  float acc[VR];
#pragma unroll
  for (int i = 0; i < VR; ++i) acc[i] = 0.f;
  if (r0 < g.rows) {
    if (VEC && r0 + VR <= g.rows) {
#pragma unroll 4
      for (int64_t q = p0 + warp; q < p1; q += 8) {
        const float x = ld<T>(vec, q * g.s_v);
        const raw* src = mat + r0 + q * g.s_p;
        if constexpr (std::is_same<T, float>::value) {
          const float4 v = *reinterpret_cast<const float4*>(src);
          acc[0] = fmaf(v.x, x, acc[0]);
          acc[1] = fmaf(v.y, x, acc[1]);
          acc[2] = fmaf(v.z, x, acc[2]);
          acc[3] = fmaf(v.w, x, acc[3]);
        } else {
          float f[8];
          unpack8<T>(*reinterpret_cast<const uint4*>(src), f);
#pragma unroll
          for (int i = 0; i < VR; ++i) acc[i] = fmaf(f[i % 8], x, acc[i]);
        }
      }
    } else {
      for (int64_t q = p0 + warp; q < p1; q += 8) {
        const float x = ld<T>(vec, q * g.s_v);
#pragma unroll
        for (int i = 0; i < VR; ++i)
          if (r0 + i < g.rows) acc[i] = fmaf(ld<T>(mat, (r0 + i) * g.s_r + q * g.s_p), x, acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < VR; ++i) red[warp][i][lane] = acc[i];
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < VR; ++i) {
      if (r0 + i >= g.rows) break;
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) s += red[w][i][lane];
      gemv_finish<T>(g, r0 + i, s);
    }
  }
}

// =============================================================================================
// Host side
// =============================================================================================
constexpr int64_t kMaxGridX = 2147483647;
constexpr int kMaxSplits = 64;
constexpr std::size_t kMaxSplitWorkspace = std::size_t(256) << 20;

bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

template <class T>
OutView<T> make_out(const GemmArgs& a) {
  const std::size_t vbytes = 4 * sizeof(typename Elem<T>::raw);
  OutView<T> o;
  o.c = static_cast<typename Elem<T>::raw*>(a.c);
  o.ldc = a.ldc;
  o.m = a.m;
  o.n = a.n;
  o.alpha = a.alpha;
  o.beta = a.beta;
  o.vec4 = aligned(a.c, vbytes) && (a.m == 1 || a.ldc % 4 == 0);
  o.epi = make_epilogue_view<T>(a.epilogue);
  return o;
}

template <class T>
MatArgs<T> make_mat(const GemmArgs& a) {
  using raw = typename Elem<T>::raw;
  return MatArgs<T>{static_cast<const raw*>(a.a),
                    a.a_stride_m,
                    a.a_stride_k,
                    static_cast<const raw*>(a.b),
                    a.b_stride_k,
                    a.b_stride_n,
                    a.m,
                    a.n,
                    a.k,
                    make_out<T>(a)};
}

// ---- Steps 1-4 -------------------------------------------------------------------------------
template <class T>
cudaError_t run_naive(const GemmArgs& a, cudaStream_t stream) {
  const int64_t tn = ceil_div(a.n, kNaiveTile), tiles = ceil_div(a.m, kNaiveTile) * tn;
  if (tiles > kMaxGridX) return cudaErrorInvalidValue;
  gemm_naive_kernel<T><<<static_cast<unsigned>(tiles), dim3(kNaiveTile, kNaiveTile), 0, stream>>>(
      make_mat<T>(a), static_cast<int>(tn));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <class T>
cudaError_t run_smem_tiled(const GemmArgs& a, cudaStream_t stream) {
  const int64_t tn = ceil_div(a.n, kSmemTile), tiles = ceil_div(a.m, kSmemTile) * tn;
  if (tiles > kMaxGridX) return cudaErrorInvalidValue;
  const bool a_m_fast = a.a_stride_m == 1 && a.a_stride_k != 1;
  const bool b_k_fast = a.b_stride_k == 1 && a.b_stride_n != 1;
  gemm_smem_tiled_kernel<T>
      <<<static_cast<unsigned>(tiles), dim3(kSmemTile, kSmemTile), 0, stream>>>(
          make_mat<T>(a), static_cast<int>(tn), a_m_fast, b_k_fast);
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <class T>
cudaError_t run_register_blocked(const GemmArgs& a, cudaStream_t stream) {
  const int64_t tn = ceil_div(a.n, kRbN), tiles = ceil_div(a.m, kRbM) * tn;
  if (tiles > kMaxGridX) return cudaErrorInvalidValue;
  const bool a_k_fast = a.a_stride_k == 1 && a.a_stride_m != 1;
  const bool b_k_fast = a.b_stride_k == 1 && a.b_stride_n != 1;
  gemm_register_blocked_kernel<T><<<static_cast<unsigned>(tiles), kRbThreads, 0, stream>>>(
      make_mat<T>(a), static_cast<int>(tn), a_k_fast, b_k_fast);
  GEMMT_RETURN_LAUNCH_ERROR();
}

// Loader mode of a warp-tiled operand: 4-element vectors need the base and the other
// dimension's stride aligned to 4 elements.
template <class T>
int warp_tiled_mode(const void* base, int64_t sc, int64_t sk) {
  const std::size_t vbytes = 4 * sizeof(typename Elem<T>::raw);
  if (!aligned(base, vbytes)) return 2;
  if (sc == 1 && sk % 4 == 0) return 0;
  if (sk == 1 && sc % 4 == 0) return 1;
  return 2;
}

template <class T>
cudaError_t run_warp_tiled(const GemmArgs& a, cudaStream_t stream) {
  const int64_t tn = ceil_div(a.n, kWtN), tiles = ceil_div(a.m, kWtM) * tn;
  if (tiles > kMaxGridX) return cudaErrorInvalidValue;
  const int am = warp_tiled_mode<T>(a.a, a.a_stride_m, a.a_stride_k);
  const int bm = warp_tiled_mode<T>(a.b, a.b_stride_n, a.b_stride_k);
  gemm_warp_tiled_kernel<T><<<static_cast<unsigned>(tiles), kWtThreads, 0, stream>>>(
      make_mat<T>(a), static_cast<int>(tn), am, bm);
  GEMMT_RETURN_LAUNCH_ERROR();
}

// ---- Step 5/6: pipelined kernel instances and planning ---------------------------------------
using PipeKernel = void (*)(PipeParams);

struct KernelInfo {
  cudaError_t err = cudaErrorInvalidDeviceFunction;
  int blocks_per_sm = 0;
};

// Raises the dynamic shared-memory limit of one kernel instance and records its occupancy,
// once per device (the attribute belongs to the per-device function object).
template <auto K, int THREADS, int SMEM>
KernelInfo kernel_info() {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static KernelInfo info[kMaxDevices];
  auto query = [] {
    KernelInfo r;
    r.err = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    if (r.err == cudaSuccess)
      r.err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, K, THREADS, SMEM);
    if (r.err == cudaSuccess && r.blocks_per_sm < 1) r.err = cudaErrorInvalidConfiguration;
    return r;
  };
  int dev = 0;
  const cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) {
    KernelInfo r;
    r.err = e;
    return r;
  }
  if (dev < 0 || dev >= kMaxDevices) return query();
  std::call_once(once[dev], [&] { info[dev] = query(); });
  return info[dev];
}

struct PipeEntry {
  PipeKernel fn = nullptr;
  KernelInfo info;
  PipeKernel sk_fn = nullptr;  // the stream-k form of the same instance, if built
  KernelInfo sk_info;
  int bm = 0, bn = 0, bk = 0, stages = 0, threads = 0, smem = 0;
  double efficiency = 1.0;  // relative FFMA efficiency of the tile shape at full occupancy
  double lone_rate = 0.5;   // FFMA rate, relative to full occupancy, of one 4-warp block alone
  bool interior = false;    // the whole-tiles instance (gemm_pipelined_kernel's INTERIOR)
};

// Stream-k instances exist for the float32 shapes that serve large products (Medium, Fat)
// in vector loader modes: the cases whose last wave matters, at a bounded build time.
template <class T, class Cfg, int AM, int BMD>
constexpr bool kHasStreamK =
    std::is_same<T, float>::value && AM != kScalar && BMD != kScalar &&
    (std::is_same<Cfg, CfgFat>::value || std::is_same<Cfg, CfgFatInterior>::value ||
     std::is_same<Cfg, CfgMedium>::value);

template <class T, class Cfg, int AM, int BMD, bool INTERIOR = false>
PipeEntry make_entry(double eff) {
  constexpr PipeKernel fn = &gemm_pipelined_kernel<T, Cfg, AM, BMD, INTERIOR>;
  PipeEntry e;
  e.fn = fn;
  e.info = kernel_info<fn, Cfg::THREADS, Cfg::SMEM_BYTES>();
  if constexpr (kHasStreamK<T, Cfg, AM, BMD>) {
    constexpr PipeKernel sk = &gemm_pipelined_kernel<T, Cfg, AM, BMD, INTERIOR, true>;
    e.sk_fn = sk;
    e.sk_info = kernel_info<sk, Cfg::THREADS, Cfg::SMEM_BYTES>();
  }
  e.interior = INTERIOR;
  e.bm = Cfg::BM;
  e.bn = Cfg::BN;
  e.bk = Cfg::BK;
  e.stages = Cfg::STAGES;
  e.threads = Cfg::THREADS;
  e.smem = Cfg::SMEM_BYTES;
  e.efficiency = eff;
  return e;
}

template <class T, class Cfg>
PipeEntry entry_for_modes(int am, int bm, double eff) {
  switch (am * 3 + bm) {
    case 0:
      return make_entry<T, Cfg, kVecC, kVecC>(eff);
    case 1:
      return make_entry<T, Cfg, kVecC, kVecK>(eff);
    case 2:
      return make_entry<T, Cfg, kVecC, kScalar>(eff);
    case 3:
      return make_entry<T, Cfg, kVecK, kVecC>(eff);
    case 4:
      return make_entry<T, Cfg, kVecK, kVecK>(eff);
    case 5:
      return make_entry<T, Cfg, kVecK, kScalar>(eff);
    case 6:
      return make_entry<T, Cfg, kScalar, kVecC>(eff);
    case 7:
      return make_entry<T, Cfg, kScalar, kVecK>(eff);
    default:
      return make_entry<T, Cfg, kScalar, kScalar>(eff);
  }
}

// The interior instance of Cfg for float32 operands in vector modes; none otherwise.
template <class T, class Cfg>
PipeEntry interior_entry(int am, int bm, double eff) {
  if constexpr (std::is_same<T, float>::value) {
    switch (am * 3 + bm) {
      case 0:
        return make_entry<T, Cfg, kVecC, kVecC, true>(eff);
      case 1:
        return make_entry<T, Cfg, kVecC, kVecK, true>(eff);
      case 3:
        return make_entry<T, Cfg, kVecK, kVecC, true>(eff);
      case 4:
        return make_entry<T, Cfg, kVecK, kVecK, true>(eff);
      default:
        break;
    }
  }
  return PipeEntry{};
}

// Configurations 0-2 serve every dtype; 3 (Fat) and 4 (Narrow) are float32 only.
constexpr int kNumPipeConfigs = 5;

// Relative FFMA efficiencies of the tile shapes at full occupancy, fitted to H100 timings of
// every shape on square, long-k, tall-skinny and non-multiple problems (the self-test's
// -sweep); together with the wave model of plan_pipelined they pick the fastest measured
// shape, or one within 5%, on each of them.
// Interior instances exist for the two shapes that serve large squares (Medium, Fat). For
// Large the interior form measured from 1% faster to 2% slower than the general one on the
// 2048-8192 squares, for Small the same, so neither has one. The efficiencies below are the
// general ones raised by what the self-test's -sweep measured on an H100 (Fat's interior
// instance 2-4% faster than its general one, Medium's 5-10%). Medium's interior instance
// matched Fat's on the self-test's 6144^3 and 8192^3 but ran 4% slower at 8192^3 in the
// Python benchmark (longer sustained load), so the model keeps Fat for large squares.
// Fat's four-stage, column-snake interior instance now runs 5-7% ahead of its general one;
// its efficiency was left at 1.05, under which the planner still picked the fastest
// measured plan on every square of the sweep (Medium at 1024^3, Fat from 2048^3).
template <class T>
PipeEntry pipe_interior_entry(int cfg, int am, int bm) {
  if (cfg == 1) return interior_entry<T, CfgMedium>(am, bm, 0.97);
  if (cfg == 3) return interior_entry<T, CfgFatInterior>(am, bm, 1.05);
  return PipeEntry{};
}

template <class T>
PipeEntry pipe_entry(int cfg, int am, int bm) {
  switch (cfg) {
    case 0:
      return entry_for_modes<T, CfgLarge>(am, bm, 1.0);
    case 1:
      // 16-bit inputs are usually served by the tensor-core family, so their SIMT build
      // keeps two shapes (less code, shorter compile).
      if constexpr (std::is_same<T, float>::value)
        return entry_for_modes<T, CfgMedium>(am, bm, 0.9);
      else
        return PipeEntry{};
    case 2:
      return entry_for_modes<T, CfgSmall>(am, bm, 0.6);
    case 3:
      if constexpr (std::is_same<T, float>::value)
        return entry_for_modes<T, CfgFat>(am, bm, 1.02);
      else
        return PipeEntry{};
    case 4:
      if constexpr (std::is_same<T, float>::value)
        return entry_for_modes<T, CfgNarrow>(am, bm, 0.9);
      else
        return PipeEntry{};
    default:
      return PipeEntry{};
  }
}

// Loader mode of one operand (element (k, c) at base[c * sc + k * sk], c_ext x k_ext).
// A stride of an extent-1 dimension is never used, so it does not block a vector mode.
template <class T>
int pipe_mode(const void* base, int64_t sc, int64_t sk, int64_t c_ext, int64_t k_ext) {
  const int64_t es = static_cast<int64_t>(sizeof(typename Elem<T>::raw));
  const bool a16 = aligned(base, 16);
  const bool c_unit = sc == 1 || c_ext == 1;
  const bool k_unit = sk == 1 || k_ext == 1;
  if (c_unit && a16 && (k_ext == 1 || (sk * es) % 16 == 0)) return kVecC;
  if (k_unit) {
    if (std::is_same<T, float>::value) return kVecK;  // 4-byte copies: no alignment needed
    if (a16 && (c_ext == 1 || (sc * es) % 16 == 0)) return kVecK;
  }
  return kScalar;
}

struct PipePlan {
  PipeEntry entry;
  int splits = 1;
  int64_t k_per_split = 0;
  int tiles_m = 0, tiles_n = 0;
  // Stream-k (5b): the last sk_tiles tiles in launch order run on sk_blocks blocks of
  // sk_iters k-tiles (sk_extra of them one more); 0 blocks: data-parallel only.
  int sk_tiles = 0, sk_blocks = 0;
  int64_t sk_iters = 0, sk_extra = 0;
  cudaError_t err = cudaErrorNotSupported;
};

// Stream-k workspace: the arrival counters, then two partial-sum slots per block.
std::size_t streamk_workspace_bytes(const PipePlan& pl) {
  if (pl.sk_blocks == 0) return 0;
  const std::size_t counters = (static_cast<std::size_t>(pl.sk_tiles) * 4 + 255) / 256 * 256;
  return counters + static_cast<std::size_t>(pl.sk_blocks) * 2 * pl.entry.bm * pl.entry.bn * 4;
}

// FFMA rate of one 4-warp block alone on an SM, relative to full occupancy. Self-test sweep
// at 1024^3 on an H100, where each of 128 blocks has an SM to itself: 0.66-0.69 for the
// 8x8-per-thread shapes (Medium, Narrow), 0.5 for Large.
double lone_block_rate(int cfg) {
  return cfg == 1 || cfg == 4 ? 0.67 : 0.5;
}

// Modelled time of `blocks` equal blocks of `work` FFMA-slots each. Equal blocks advance in
// waves of sms * blocks_per_sm; a wave whose SMs hold r blocks of w warps runs at
// min(1, lone_rate * r * w / 4) of the full rate: fewer than 8 resident warps cannot hide
// the FFMA and shared-load latencies.
double wave_cost(const PipeEntry& e, double blocks, double work, double sms) {
  const double bps = std::max(1, e.info.blocks_per_sm);
  const double warps = e.threads / 32.0;
  auto wave = [&](double r) { return r * work / std::min(1.0, e.lone_rate * r * warps / 4.0); };
  const double full = std::floor(blocks / (sms * bps));
  const double rem = blocks - full * sms * bps;
  return full * wave(bps) + (rem > 0 ? wave(std::ceil(rem / sms)) : 0.0);
}

// Stream-k costs beyond the FFMAs, in the same SM-cycle units: a block publishes one slot
// and the finishing block reads the others at ~32 B/clk/SM (the slots stay in L2), plus a
// fixed cost: the counter reset, a second launch, two pipeline fills per block and the
// finishing block's wait for its slot reads. The fixed cost is fitted to an H100 self-test
// sweep (stream-k against data-parallel, same tile): the model's predicted gain exceeded
// the measured one by 14-17 us on 1024^3, 127x8192x511 and 4096^3.
constexpr double kStreamKFixedCost = 24000.0;
constexpr double kStreamKBytesPerClk = 32.0;
// A stream-k block's run is at least this many k-tiles (its pipeline must fill).
constexpr int64_t kStreamKMinIters = 4;
// Stream-k runs start at different k, so blocks running at the same time no longer share A
// and B panels through L2. When the operands exceed L2 a block streams its panels from DRAM,
// needing (bm + bn) * 4 * 128 * efficiency / (bm * bn) bytes per SM clock at the FFMA rate:
// 6.3 for the 128x256 tile, 11.6 for 64x128. The sweep measured the 64x128 tile's stream-k
// part ~30% slower than data-parallel at 8192^3 (6144^3: ~10%), the 128x256 one at full
// rate: the model caps DRAM at 8 B/clk/SM and scales runs that need more.
constexpr double kStreamKDramBytesPerClk = 8.0;
constexpr double kL2Bytes = 40.0 * (1 << 20);

// The cheapest stream-k split of a problem of `tiles` tiles of k_tiles k-tiles each, if any
// beats `cost` (the data-parallel one); force: take the cheapest possible split regardless.
// Candidates: the last partial wave's tiles, or those plus one full wave (longer runs, fewer
// contributors per tile), dealt to one full wave of blocks.
void consider_stream_k(const PipeEntry& e, int64_t tiles, int64_t k_tiles, double sms,
                       double operand_bytes, bool force, double& cost, PipePlan& plan) {
  if (e.sk_fn == nullptr || e.sk_info.err != cudaSuccess) return;
  PipeEntry sk = e;
  sk.info = e.sk_info;
  const int64_t wave = static_cast<int64_t>(sms) * std::max(1, sk.info.blocks_per_sm);
  const int64_t rem = tiles % wave;
  const double tile_work =
      static_cast<double>(e.bm) * e.bn * e.bk * k_tiles / (128.0 * e.efficiency);
  const double slot_cycles = 4.0 * e.bm * e.bn / kStreamKBytesPerClk;
  const double dram_need = (e.bm + e.bn) * 4.0 * 128.0 * e.efficiency / (e.bm * e.bn);
  const double slowdown = operand_bytes > kL2Bytes && dram_need > kStreamKDramBytesPerClk
                              ? dram_need / kStreamKDramBytesPerClk
                              : 1.0;
  bool found = false;
  for (const int64_t sk_tiles : {rem, rem + wave}) {
    if (rem == 0 || sk_tiles > tiles) continue;
    const int64_t total = sk_tiles * k_tiles;
    const int64_t blocks = std::min(wave, force ? total : total / kStreamKMinIters);
    if (blocks < 1 || (!force && blocks <= sk_tiles)) continue;
    const int64_t iters = total / blocks, extra = total % blocks;
    const double run = tile_work * (iters + (extra ? 1 : 0)) / k_tiles * slowdown;
    const double c = wave_cost(e, static_cast<double>(tiles - sk_tiles), tile_work, sms) +
                     wave_cost(sk, static_cast<double>(blocks), run, sms) +
                     slot_cycles * (1.0 + std::ceil(static_cast<double>(k_tiles) / iters)) +
                     kStreamKFixedCost;
    if ((force && !found) || c < cost) {
      found = true;
      cost = c;
      plan.sk_tiles = static_cast<int>(sk_tiles);
      plan.sk_blocks = static_cast<int>(blocks);
      plan.sk_iters = iters;
      plan.sk_extra = extra;
    }
  }
}

// Picks the tile shape (and, when allowed, the number of k-slices) with the lowest modelled
// time: wave_cost of blocks of bm * bn * kps / efficiency FFMA-slots. A split adds the
// workspace traffic (written by the GEMM, read by the reduction) at ~12 B/clk/SM and a launch.
// Without a split, the last wave may run as stream-k (stream_k < 0: when the model prefers
// it; 0: never; > 0: whenever the shape has a stream-k kernel and a partial last wave).
// only_cfg >= 0 restricts the choice to that configuration (benchmarks of each shape). A
// shape that tiles the problem exactly competes with its interior instance (if any), unless
// allow_interior is false (benchmarks of the general instance).
template <class T>
PipePlan plan_pipelined_uncached(const GemmArgs& a, bool allow_split, int only_cfg,
                                 bool allow_interior, int stream_k) {
  PipePlan best;
  const int am = pipe_mode<T>(a.a, a.a_stride_m, a.a_stride_k, a.m, a.k);
  const int bmode = pipe_mode<T>(a.b, a.b_stride_n, a.b_stride_k, a.n, a.k);
  const double sms = std::max(1, a.sm_count);
  const double es = static_cast<double>(sizeof(typename Elem<T>::raw));
  double best_cost = 0.0;
  const int cfg_begin = only_cfg >= 0 ? only_cfg : 0;
  const int cfg_end = only_cfg >= 0 ? std::min(only_cfg + 1, kNumPipeConfigs) : kNumPipeConfigs;
  for (int cfg = cfg_begin; cfg < cfg_end; ++cfg) {
    PipeEntry e = pipe_entry<T>(cfg, am, bmode);
    if (e.fn == nullptr) continue;
    // Whole tiles everywhere: every block lies inside C and, k being a multiple of the
    // k-tile, so does every k-slice (k_per_split below is a multiple of it).
    if (allow_interior && a.k > 0 && a.m % e.bm == 0 && a.n % e.bn == 0 && a.k % e.bk == 0) {
      const PipeEntry ie = pipe_interior_entry<T>(cfg, am, bmode);
      if (ie.fn != nullptr && ie.info.err == cudaSuccess) e = ie;
    }
    if (e.info.err != cudaSuccess) {
      if (best.err == cudaErrorNotSupported) best.err = e.info.err;
      continue;
    }
    e.lone_rate = lone_block_rate(cfg);
    const int64_t tm = ceil_div(a.m, e.bm), tn = ceil_div(a.n, e.bn);
    if (tm * tn > kMaxGridX) continue;
    const int64_t k_tiles = std::max<int64_t>(1, ceil_div(a.k, e.bk));
    int max_splits = 1;
    if (allow_split) {
      // Each slice keeps >= 16 k-tiles so the pipeline reaches steady state, and the
      // workspace stays bounded.
      const int64_t by_k = std::max<int64_t>(1, k_tiles / 16);
      const int64_t by_ws = std::max<int64_t>(
          1, static_cast<int64_t>(kMaxSplitWorkspace / (4 * static_cast<std::size_t>(a.m) *
                                                        static_cast<std::size_t>(a.n))));
      max_splits = static_cast<int>(std::min<int64_t>({kMaxSplits, by_k, by_ws}));
    }
    int prev_splits = 0;
    for (int s = 1; s <= max_splits; ++s) {
      const int64_t kps = ceil_div(k_tiles, s) * e.bk;
      const int splits = static_cast<int>(ceil_div(a.k, kps));
      if (splits == prev_splits) continue;
      prev_splits = splits;
      const double blocks = static_cast<double>(tm * tn) * splits;
      double cost = wave_cost(e, blocks,
                              static_cast<double>(e.bm) * e.bn * kps / (128.0 * e.efficiency), sms);
      PipePlan cand;
      if (splits > 1) {
        const double mn = static_cast<double>(a.m) * static_cast<double>(a.n);
        cost += (splits * mn * 8.0 + mn * es * 2.0) / (12.0 * sms) + 4000.0;
      } else if (stream_k != 0 && a.k > 0) {
        const double operand_bytes =
            es * (static_cast<double>(a.m) * a.k + static_cast<double>(a.k) * a.n);
        consider_stream_k(e, tm * tn, k_tiles, sms, operand_bytes, stream_k > 0, cost, cand);
      }
      if (best.err != cudaSuccess || cost < best_cost) {
        best_cost = cost;
        best = cand;
        best.entry = e;
        best.splits = splits;
        best.k_per_split = splits > 1 ? kps : std::max<int64_t>(a.k, 1);
        best.tiles_m = static_cast<int>(tm);
        best.tiles_n = static_cast<int>(tn);
        best.err = cudaSuccess;
      }
    }
  }
  // k_per_split must be a whole number of k-tiles for every slice but the last.
  if (best.err == cudaSuccess && best.splits == 1)
    best.k_per_split = ceil_div(std::max<int64_t>(a.k, 1), best.entry.bk) * best.entry.bk;
  return best;
}

// plan_pipelined_uncached, remembered per thread for the last problem: a call plans once for
// its workspace size and again to launch, and with split-k the search (every tile shape times
// every slice count) costs about as much host time as a small product's kernels.
template <class T>
PipePlan plan_pipelined(const GemmArgs& a, bool allow_split, int only_cfg = -1,
                        bool allow_interior = true, int stream_k = -1) {
  struct Key {
    int64_t m = -1, n = -1, k = -1;
    int am = -1, bm = -1, sms = -1, device = -1, only_cfg = -2, stream_k = -2;
    bool allow_split = false, allow_interior = false;
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && am == o.am && bm == o.bm && sms == o.sms &&
             device == o.device && only_cfg == o.only_cfg && stream_k == o.stream_k &&
             allow_split == o.allow_split && allow_interior == o.allow_interior;
    }
  };
  thread_local Key last_key;
  thread_local PipePlan last;
  Key key;
  key.m = a.m;
  key.n = a.n;
  key.k = a.k;
  key.am = pipe_mode<T>(a.a, a.a_stride_m, a.a_stride_k, a.m, a.k);
  key.bm = pipe_mode<T>(a.b, a.b_stride_n, a.b_stride_k, a.n, a.k);
  key.sms = a.sm_count;
  key.only_cfg = only_cfg;
  key.allow_split = allow_split;
  key.allow_interior = allow_interior;
  key.stream_k = stream_k;
  if (cudaGetDevice(&key.device) != cudaSuccess)
    return plan_pipelined_uncached<T>(a, allow_split, only_cfg, allow_interior, stream_k);
  if (key == last_key) return last;
  last = plan_pipelined_uncached<T>(a, allow_split, only_cfg, allow_interior, stream_k);
  last_key = last.err == cudaSuccess ? key : Key{};
  return last;
}

// What a pipelined plan launches, for SimtPlan (the workspace of its stream-k part only).
SimtPlan describe(const PipePlan& pp) {
  SimtPlan sp;
  sp.block_m = pp.entry.bm;
  sp.block_n = pp.entry.bn;
  sp.block_k = pp.entry.bk;
  sp.stages = pp.entry.stages;
  sp.threads = pp.entry.threads;
  sp.interior = pp.entry.interior;
  sp.splits = pp.splits;
  sp.stream_k_blocks = pp.sk_blocks;
  sp.stream_k_tiles = pp.sk_tiles;
  sp.workspace_bytes = streamk_workspace_bytes(pp);
  return sp;
}

// C = alpha * (sum of `splits` float32 slices [splits][m][n]) + beta * C. The quad kernel
// needs 16-byte aligned slices: the workspaces planned here are, a caller's buffer passed to
// gemm_reduce_k_slices may not be.
template <class T>
cudaError_t reduce_slices(const GemmArgs& a, const float* slices, int splits, cudaStream_t stream) {
  if (a.n % 4 == 0 && aligned(slices, 16)) {
    const int64_t blocks = std::min<int64_t>(ceil_div(a.m * a.n / 4, kReduceThreads), 16384);
    reduce_slice_quads_kernel<T><<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(
        slices, splits, make_out<T>(a));
    GEMMT_RETURN_LAUNCH_ERROR();
  }
  const int64_t gx = ceil_div(a.n, 256);
  if (gx > kMaxGridX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(std::min<int64_t>(a.m, 65535)));
  reduce_slices_kernel<T>
      <<<grid, 256, 0, stream>>>(slices, splits, a.m, a.n, static_cast<typename Elem<T>::raw*>(a.c),
                                 a.ldc, 1, a.alpha, a.beta, make_epilogue_view<T>(a.epilogue));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <class T>
cudaError_t run_pipelined(const GemmArgs& a, const PipePlan& plan, float* workspace,
                          cudaStream_t stream) {
  if (plan.err != cudaSuccess) return plan.err;
  PipeParams p{};
  p.a = a.a;
  p.sam = a.a_stride_m;
  p.sak = a.a_stride_k;
  p.b = a.b;
  p.sbk = a.b_stride_k;
  p.sbn = a.b_stride_n;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.c = a.c;
  p.ldc = a.ldc;
  p.alpha = a.alpha;
  p.beta = a.beta;
  p.c_vec4 = make_out<T>(a).vec4;
  p.epi = make_epilogue_params(a.epilogue);
  p.partial = plan.splits > 1 ? workspace : nullptr;
  p.partial_vec4 = a.n % 4 == 0;
  p.k_per_split = plan.k_per_split;
  p.tiles_m = plan.tiles_m;
  p.tiles_n = plan.tiles_n;
  if ((plan.splits > 1 || plan.sk_blocks > 0) && workspace == nullptr) return cudaErrorInvalidValue;
  const int64_t tiles = static_cast<int64_t>(plan.tiles_m) * plan.tiles_n;
  if (plan.sk_blocks > 0) {
    // The stream-k blocks take the last sk_tiles tiles of the launch order; the
    // data-parallel grid below covers the ones before.
    StreamKParams& s = p.sk;
    s.first_tile = static_cast<int>(tiles - plan.sk_tiles);
    s.k_tiles = static_cast<int>(ceil_div(a.k, plan.entry.bk));
    s.iters = plan.sk_iters;
    s.extra = plan.sk_extra;
    s.arrivals = reinterpret_cast<int*>(workspace);
    const std::size_t counters = (static_cast<std::size_t>(plan.sk_tiles) * 4 + 255) / 256 * 256;
    s.slots = reinterpret_cast<float*>(reinterpret_cast<char*>(workspace) + counters);
    GEMMT_RETURN_IF_ERROR(
        cudaMemsetAsync(s.arrivals, 0, static_cast<std::size_t>(plan.sk_tiles) * 4, stream));
    plan.entry.sk_fn<<<plan.sk_blocks, plan.entry.threads, plan.entry.smem, stream>>>(p);
    GEMMT_RETURN_IF_ERROR(cudaGetLastError());
    if (tiles == plan.sk_tiles) return cudaSuccess;
  }
  const dim3 grid(static_cast<unsigned>(tiles - plan.sk_tiles), 1,
                  static_cast<unsigned>(plan.splits));
  plan.entry.fn<<<grid, plan.entry.threads, plan.entry.smem, stream>>>(p);
  GEMMT_RETURN_IF_ERROR(cudaGetLastError());
  if (plan.splits > 1) return reduce_slices<T>(a, workspace, plan.splits, stream);
  return cudaSuccess;
}

// ---- Step 7: gemv planning ------------------------------------------------------------------
struct GemvPlan {
  GemvParams g;
  bool colsweep = false;
  int splits = 1;
  int64_t blocks_x = 0;
};

template <class T>
GemvPlan plan_gemv(const GemmArgs& a) {
  GemvPlan pl;
  GemvParams& g = pl.g;
  if (a.n == 1) {
    g.mat = a.a;
    g.s_r = a.a_stride_m;
    g.s_p = a.a_stride_k;
    g.vec = a.b;
    g.s_v = a.b_stride_k;
    g.rows = a.m;
    g.s_out = a.ldc;
  } else {
    g.mat = a.b;
    g.s_r = a.b_stride_n;
    g.s_p = a.b_stride_k;
    g.vec = a.a;
    g.s_v = a.a_stride_k;
    g.rows = a.n;
    g.s_out = 1;
  }
  g.len = a.k;
  g.out = a.c;
  g.alpha = a.alpha;
  g.beta = a.beta;
  g.partial = nullptr;
  const int64_t es = static_cast<int64_t>(sizeof(typename Elem<T>::raw));
  const int64_t ve = 16 / es;
  const int64_t rows = g.rows, len = g.len;
  const auto sabs = [](int64_t v) { return v < 0 ? -v : v; };
  pl.colsweep = rows > 1 && (len == 1 || (g.s_p != 1 && sabs(g.s_r) <= sabs(g.s_p)));
  int64_t min_chunk;
  if (pl.colsweep) {
    g.vec16 = g.s_r == 1 && aligned(g.mat, 16) && (len == 1 || (g.s_p * es) % 16 == 0);
    g.rows_per_block = 0;
    pl.blocks_x = ceil_div(rows, 32 * (g.vec16 ? ve : 1));
    min_chunk = 64;  // 8 warps x 8 steps
  } else {
    g.vec16 = (len == 1 || g.s_p == 1) && (len == 1 || g.s_v == 1) && aligned(g.mat, 16) &&
              aligned(g.vec, 16) && (rows == 1 || (g.s_r * es) % 16 == 0);
    // Warps per row grow with the dot length so each lane still streams several vectors.
    const int wpr = len >= 8192 ? 8 : len >= 4096 ? 4 : len >= 2048 ? 2 : 1;
    g.rows_per_block = 8 / wpr;
    pl.blocks_x = ceil_div(rows, g.rows_per_block);
    min_chunk = 8192;
  }
  // Enough blocks for ~4 per SM keeps DRAM busy; split p only to reach that.
  const int64_t target = 4 * static_cast<int64_t>(std::max(1, a.sm_count));
  int64_t splits = 1;
  if (pl.blocks_x < target) {
    splits = std::min(ceil_div(target, pl.blocks_x), std::max<int64_t>(1, len / min_chunk));
    splits = std::min<int64_t>(splits, 65535);
  }
  // p_per_split: a multiple of 256 (covers every vector width) so slices start aligned.
  int64_t pps = splits > 1 ? ceil_div(ceil_div(len, splits), 256) * 256 : std::max<int64_t>(len, 1);
  splits = splits > 1 ? ceil_div(len, pps) : 1;
  if (splits <= 1) {
    splits = 1;
    pps = std::max<int64_t>(len, 1);
  }
  g.p_per_split = pps;
  pl.splits = static_cast<int>(splits);
  return pl;
}

template <class T>
cudaError_t run_gemv(const GemmArgs& a, float* workspace, cudaStream_t stream) {
  GemvPlan pl = plan_gemv<T>(a);
  if (pl.blocks_x > kMaxGridX) return cudaErrorInvalidValue;
  if (pl.splits > 1) {
    if (workspace == nullptr) return cudaErrorInvalidValue;
    pl.g.partial = workspace;
  }
  const dim3 grid(static_cast<unsigned>(pl.blocks_x), static_cast<unsigned>(pl.splits));
  if (pl.colsweep) {
    if (pl.g.vec16)
      gemv_colsweep_kernel<T, true><<<grid, 256, 0, stream>>>(pl.g);
    else
      gemv_colsweep_kernel<T, false><<<grid, 256, 0, stream>>>(pl.g);
  } else {
    gemv_rowdot_kernel<T><<<grid, 256, 0, stream>>>(pl.g);
  }
  GEMMT_RETURN_IF_ERROR(cudaGetLastError());
  if (pl.splits > 1) {
    // Outputs as one row of `rows` columns with column stride s_out.
    const int64_t gx = ceil_div(pl.g.rows, 256);
    if (gx > kMaxGridX) return cudaErrorInvalidValue;
    reduce_slices_kernel<T><<<static_cast<unsigned>(gx), 256, 0, stream>>>(
        workspace, pl.splits, 1, pl.g.rows, static_cast<typename Elem<T>::raw*>(a.c), 0, pl.g.s_out,
        a.alpha, a.beta, EpilogueView<T>{});
    GEMMT_RETURN_LAUNCH_ERROR();
  }
  return cudaSuccess;
}

// ---- Entry points ---------------------------------------------------------------------------
bool dtype_ok(ScalarType t) {
  return t == ScalarType::kFloat32 || t == ScalarType::kFloat16 || t == ScalarType::kBFloat16;
}

// ---- K-major B (a @ b.t()) for the pipelined kernel ----
// The pipelined kernel reads a K-major B through transposing shared-memory stores; at 4096^3
// that layout ran at 0.84 of cuBLAS against 0.94 for an N-major B. When m is large enough
// that one pass over B costs a few percent of the product (2 * 4 * k * n bytes against
// 2 * m * n * k FLOPs: ~4% at m = 2048), B is first copied N-major, rows padded to 16 bytes,
// into the front of the workspace and the kernel runs on the copy. Split-k partials follow.
constexpr int64_t kStageBMinM = 2048;

template <class T>
constexpr int64_t raw_bytes() {
  return static_cast<int64_t>(sizeof(typename Elem<T>::raw));
}

template <class T>
int64_t staged_b_pitch(const GemmArgs& a) {
  return copy_pitch(a.n, raw_bytes<T>());
}

template <class T>
std::size_t staged_b_bytes(const GemmArgs& a) {
  return copy_bytes(a.k, a.n, raw_bytes<T>());
}

template <class T>
bool stages_b(const GemmArgs& a) {
  return a.m >= kStageBMinM && a.n >= 4 && a.k > 1 && a.n <= kCopyMaxLen &&
         pipe_mode<T>(a.b, a.b_stride_n, a.b_stride_k, a.n, a.k) == kVecK;
}

// The arguments of the product on the copy of B at `ws` (a placeholder while planning).
GemmArgs with_staged_b(const GemmArgs& a, const void* ws, int64_t pitch) {
  GemmArgs s = a;
  s.b = ws;
  s.b_stride_k = pitch;
  s.b_stride_n = 1;
  return s;
}

// The pipelined plan (k-slices when allowed) for the arguments the kernel will see.
template <class T>
PipePlan plan_pipelined_staged(const GemmArgs& a, bool allow_split) {
  if (!stages_b<T>(a)) return plan_pipelined<T>(a, allow_split);
  return plan_pipelined<T>(with_staged_b(a, planning_workspace(), staged_b_pitch<T>(a)),
                           allow_split);
}

template <class T>
cudaError_t run_pipelined_staged(const GemmArgs& a, bool allow_split, void* workspace,
                                 cudaStream_t stream) {
  if (!stages_b<T>(a)) {
    return run_pipelined<T>(a, plan_pipelined<T>(a, allow_split), static_cast<float*>(workspace),
                            stream);
  }
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const int64_t pitch = staged_b_pitch<T>(a);
  GEMMT_RETURN_IF_ERROR(copy_2d_bits(static_cast<int>(raw_bytes<T>()), a.b, a.b_stride_k,
                                     a.b_stride_n, a.k, a.n, workspace, pitch, stream));
  const GemmArgs s = with_staged_b(a, workspace, pitch);
  float* partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + staged_b_bytes<T>(a));
  return run_pipelined<T>(s, plan_pipelined<T>(s, allow_split), partial, stream);
}

template <class T>
SimtPlan plan_for(const GemmArgs& a, GemmVariant v) {
  SimtPlan sp;
  switch (v) {
    case GemmVariant::kNaive:
      sp.block_m = sp.block_n = kNaiveTile;
      sp.threads = kNaiveTile * kNaiveTile;
      break;
    case GemmVariant::kSmemTiled:
      sp.block_m = sp.block_n = sp.block_k = kSmemTile;
      sp.threads = kSmemTile * kSmemTile;
      break;
    case GemmVariant::kRegisterBlocked:
      sp.block_m = kRbM;
      sp.block_n = kRbN;
      sp.block_k = kRbK;
      sp.threads = kRbThreads;
      break;
    case GemmVariant::kWarpTiled:
      sp.block_m = kWtM;
      sp.block_n = kWtN;
      sp.block_k = kWtK;
      sp.threads = kWtThreads;
      break;
    case GemmVariant::kPipelined:
    case GemmVariant::kSplitK: {
      if (a.k == 0) break;
      const PipePlan pp = plan_pipelined_staged<T>(a, v == GemmVariant::kSplitK);
      if (pp.err != cudaSuccess) break;
      sp = describe(pp);
      if (stages_b<T>(a)) sp.workspace_bytes += staged_b_bytes<T>(a);
      if (pp.splits > 1)
        sp.workspace_bytes += static_cast<std::size_t>(pp.splits) * static_cast<std::size_t>(a.m) *
                              static_cast<std::size_t>(a.n) * sizeof(float);
      break;
    }
    case GemmVariant::kGemv: {
      if (a.k == 0) break;
      const GemvPlan gp = plan_gemv<T>(a);
      sp.threads = 256;
      sp.splits = gp.splits;
      if (gp.splits > 1)
        sp.workspace_bytes = static_cast<std::size_t>(gp.splits) *
                             static_cast<std::size_t>(gp.g.rows) * sizeof(float);
      break;
    }
    default:
      break;
  }
  return sp;
}

template <class T>
cudaError_t run_typed(const GemmArgs& a, GemmVariant v, void* workspace, cudaStream_t stream) {
  switch (v) {
    case GemmVariant::kNaive:
      return run_naive<T>(a, stream);
    case GemmVariant::kSmemTiled:
      return run_smem_tiled<T>(a, stream);
    case GemmVariant::kRegisterBlocked:
      return run_register_blocked<T>(a, stream);
    case GemmVariant::kWarpTiled:
      return run_warp_tiled<T>(a, stream);
    case GemmVariant::kPipelined:
    case GemmVariant::kSplitK:
      return run_pipelined_staged<T>(a, v == GemmVariant::kSplitK, workspace, stream);
    case GemmVariant::kGemv:
      return run_gemv<T>(a, static_cast<float*>(workspace), stream);
    default:
      return cudaErrorNotSupported;
  }
}

template <class T>
cudaError_t scale_typed(const GemmArgs& a, cudaStream_t stream) {
  // A single column is walked as one row with column stride ldc so that threads, not the
  // 65535-limited grid.y, cover its length.
  const bool col = a.n == 1;
  const int64_t rows = col ? 1 : a.m, cols = col ? a.m : a.n;
  const int64_t ld = col ? 0 : a.ldc, cs = col ? a.ldc : 1;
  const int64_t gx = ceil_div(cols, 256);
  if (gx > kMaxGridX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  scale_kernel<T><<<grid, 256, 0, stream>>>(static_cast<typename Elem<T>::raw*>(a.c), rows, cols,
                                            ld, cs, a.beta, make_epilogue_view<T>(a.epilogue), col);
  GEMMT_RETURN_LAUNCH_ERROR();
}

bool config_hook_ok(const GemmArgs& args) {
  return args.dtype == ScalarType::kFloat32 && args.m > 0 && args.n > 0 && args.k > 0;
}

}  // namespace
}  // namespace simt

cudaError_t gemm_reduce_k_slices(const GemmArgs& args, const float* slices, int splits,
                                 cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  if (slices == nullptr || splits < 1) return cudaErrorInvalidValue;
  switch (args.dtype) {
    case ScalarType::kFloat32:
      return simt::reduce_slices<float>(args, slices, splits, stream);
    case ScalarType::kFloat16:
      return simt::reduce_slices<__half>(args, slices, splits, stream);
    case ScalarType::kBFloat16:
      return simt::reduce_slices<__nv_bfloat16>(args, slices, splits, stream);
    default:
      return cudaErrorNotSupported;
  }
}

namespace detail {

int gemm_simt_pipelined_config_count() {
  return simt::kNumPipeConfigs;
}

SimtPlan gemm_simt_plan_pipelined_config(const GemmArgs& args, int config, bool allow_interior,
                                         int stream_k) {
  if (!simt::config_hook_ok(args) || config < 0 || config >= simt::kNumPipeConfigs)
    return SimtPlan{};
  const simt::PipePlan pp =
      simt::plan_pipelined<float>(args, false, config, allow_interior, stream_k);
  return pp.err == cudaSuccess ? simt::describe(pp) : SimtPlan{};
}

cudaError_t gemm_simt_run_pipelined_config(const GemmArgs& args, int config, void* workspace,
                                           cudaStream_t stream, bool allow_interior, int stream_k) {
  if (!simt::config_hook_ok(args)) return cudaErrorNotSupported;
  if (config < 0 || config >= simt::kNumPipeConfigs) return cudaErrorInvalidValue;
  const simt::PipePlan pp =
      simt::plan_pipelined<float>(args, false, config, allow_interior, stream_k);
  if (pp.err != cudaSuccess) return pp.err;
  return simt::run_pipelined<float>(args, pp, static_cast<float*>(workspace), stream);
}

}  // namespace detail

bool gemm_simt_supports(const GemmArgs& args, GemmVariant v) {
  if (!simt::dtype_ok(args.dtype)) return false;
  if (args.m < 0 || args.n < 0 || args.k < 0) return false;
  switch (v) {
    case GemmVariant::kNaive:
    case GemmVariant::kSmemTiled:
    case GemmVariant::kRegisterBlocked:
    case GemmVariant::kWarpTiled:
    case GemmVariant::kPipelined:
    case GemmVariant::kSplitK:
      return true;
    case GemmVariant::kGemv:
      return args.m == 1 || args.n == 1;
    default:
      return false;
  }
}

SimtPlan gemm_simt_plan(const GemmArgs& args, GemmVariant v) {
  if (!gemm_simt_supports(args, v) || args.m == 0 || args.n == 0) return SimtPlan{};
  switch (args.dtype) {
    case ScalarType::kFloat32:
      return simt::plan_for<float>(args, v);
    case ScalarType::kFloat16:
      return simt::plan_for<__half>(args, v);
    default:
      return simt::plan_for<__nv_bfloat16>(args, v);
  }
}

int gemm_simt_pick_splits(const GemmArgs& args) {
  return std::max(1, gemm_simt_plan(args, GemmVariant::kSplitK).splits);
}

std::size_t gemm_simt_workspace_bytes(const GemmArgs& args, GemmVariant v) {
  return gemm_simt_plan(args, v).workspace_bytes;
}

cudaError_t gemm_simt_run(const GemmArgs& args, GemmVariant v, void* workspace,
                          cudaStream_t stream) {
  if (!gemm_simt_supports(args, v)) return cudaErrorNotSupported;
  if (args.m == 0 || args.n == 0) return cudaSuccess;
  if (args.k == 0) return gemm_scale_c(args, stream);
  switch (args.dtype) {
    case ScalarType::kFloat32:
      return simt::run_typed<float>(args, v, workspace, stream);
    case ScalarType::kFloat16:
      return simt::run_typed<__half>(args, v, workspace, stream);
    default:
      return simt::run_typed<__nv_bfloat16>(args, v, workspace, stream);
  }
}

cudaError_t gemm_scale_c(const GemmArgs& args, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  switch (args.dtype) {
    case ScalarType::kFloat32:
      return simt::scale_typed<float>(args, stream);
    case ScalarType::kFloat16:
      return simt::scale_typed<__half>(args, stream);
    case ScalarType::kBFloat16:
      return simt::scale_typed<__nv_bfloat16>(args, stream);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace gemmt
