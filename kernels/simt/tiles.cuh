// Device-side building blocks of the SIMT GEMM family (kernels/simt/): element
// conversion, the C epilogue, and the global -> shared tile loaders of the pipelined kernel.
//
// Shared-memory convention used by every tiled kernel here: an operand tile is stored as
// S[k][c] (c = m for A, n for B) in float32, so that at a fixed k a thread's fragment of A
// and of B are both contiguous runs along c and can be read with 16-byte loads. For A this is
// the transpose of the row-major layout, which is why the loaders below write A "transposed".
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cp_async.cuh"
#include "common/gemm_epilogue.cuh"
#include "plan/simt_plan.h"

namespace gemmt {
namespace simt {

// ---- Element types ----------------------------------------------------------------------
// Kernels move 16-bit elements as raw bit patterns (uint16_t) and convert only when a value
// enters arithmetic: this keeps shared memory, vector loads and zero-fill type-agnostic
// (all-zero bits are +0.0 in every format used here).
template <class T>
struct Elem;

template <>
struct Elem<float> {
  using raw = float;
  __device__ __forceinline__ static float to_float(raw v) { return v; }
  __device__ __forceinline__ static raw from_float(float v) { return v; }
};

template <>
struct Elem<__half> {
  using raw = uint16_t;
  __device__ __forceinline__ static float to_float(raw v) {
    return __half2float(__ushort_as_half(v));
  }
  __device__ __forceinline__ static raw from_float(float v) {
    return __half_as_ushort(__float2half_rn(v));
  }
};

template <>
struct Elem<__nv_bfloat16> {
  using raw = uint16_t;
  // bf16 is the top half of a float32: widening is exact and needs no conversion unit.
  __device__ __forceinline__ static float to_float(raw v) {
    return __uint_as_float(static_cast<uint32_t>(v) << 16);
  }
  __device__ __forceinline__ static raw from_float(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

// Eight 16-bit elements packed in a 16-byte vector, widened to float.
template <class T>
__device__ __forceinline__ void unpack8(const uint4& v, float out[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = Elem<T>::to_float(static_cast<uint16_t>(w[i] & 0xffffu));
    out[2 * i + 1] = Elem<T>::to_float(static_cast<uint16_t>(w[i] >> 16));
  }
}

__device__ __forceinline__ uint4 pack8(const uint16_t h[8]) {
  uint4 v;
  v.x = static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
  v.y = static_cast<uint32_t>(h[2]) | (static_cast<uint32_t>(h[3]) << 16);
  v.z = static_cast<uint32_t>(h[4]) | (static_cast<uint32_t>(h[5]) << 16);
  v.w = static_cast<uint32_t>(h[6]) | (static_cast<uint32_t>(h[7]) << 16);
  return v;
}

// ---- Epilogue -----------------------------------------------------------------------------
// Everything a kernel needs to write C = alpha * acc + beta * C. beta == 0 never reads C
// (it may be uninitialised memory holding NaN).
template <class T>
struct OutView {
  typename Elem<T>::raw* c;
  int64_t ldc;
  int64_t m, n;
  float alpha, beta;
  bool vec4;            // c and ldc allow aligned 4-element vector access (16 B fp32, 8 B 16-bit)
  EpilogueView<T> epi;  // bias / activation / pre-activation, (row, col) as C's
  // C stored column-major (element (row, col) at c[col * ldc + row]): the pipelined kernel
  // computing a caller's row-major product transposed (simt_plan.h, swaps_operands).
  bool transposed = false;
};

template <class T>
__device__ __forceinline__ int64_t out_offset(const OutView<T>& o, int64_t row, int64_t col) {
  return o.transposed ? col * o.ldc + row : row * o.ldc + col;
}

// The epilogue of output (row, col) in the caller's coordinates: a transposed C's (row, col) is
// the caller's (col, row), so its bias, pre-activation output and their strides stay the
// caller's.
template <class T>
__device__ __forceinline__ float epilogue_at(const OutView<T>& o, int64_t row, int64_t col,
                                             float r) {
  return o.transposed ? o.epi.apply(col, row, r) : o.epi.apply(row, col, r);
}

template <class T>
__device__ __forceinline__ void store_one(const OutView<T>& o, int64_t row, int64_t col, float v) {
  typename Elem<T>::raw* p = o.c + out_offset(o, row, col);
  float r = o.alpha * v;
  if (o.beta != 0.f) r = fmaf(o.beta, Elem<T>::to_float(*p), r);
  if (o.epi.active) r = epilogue_at(o, row, col, r);
  *p = Elem<T>::from_float(r);
}

// Four consecutive outputs from (row, col): along the row (DOWN false) or down the column
// (DOWN true). When they are adjacent in memory (DOWN == o.transposed) and o.vec4 is set, the
// run starts at a multiple of 4 relative to an aligned base, so one vector access writes them.
template <class T, bool DOWN = false>
__device__ __forceinline__ void store_quad(const OutView<T>& o, int64_t row, int64_t col,
                                           const float v[4]) {
  if (row >= o.m || col >= o.n) return;
  const bool whole = DOWN ? row + 4 <= o.m : col + 4 <= o.n;
  if (o.vec4 && o.transposed == DOWN && whole) {
    typename Elem<T>::raw* p = o.c + out_offset(o, row, col);
    float r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) r[j] = o.alpha * v[j];
    if constexpr (std::is_same<T, float>::value) {
      float4* p4 = reinterpret_cast<float4*>(p);
      if (o.beta != 0.f) {
        const float4 old = *p4;
        r[0] = fmaf(o.beta, old.x, r[0]);
        r[1] = fmaf(o.beta, old.y, r[1]);
        r[2] = fmaf(o.beta, old.z, r[2]);
        r[3] = fmaf(o.beta, old.w, r[3]);
      }
      if (o.epi.active) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          r[j] = epilogue_at(o, row + (DOWN ? j : 0), col + (DOWN ? 0 : j), r[j]);
      }
      *p4 = make_float4(r[0], r[1], r[2], r[3]);
    } else {
      uint2* p2 = reinterpret_cast<uint2*>(p);
      if (o.beta != 0.f) {
        const uint2 old = *p2;
        r[0] = fmaf(o.beta, Elem<T>::to_float(static_cast<uint16_t>(old.x & 0xffffu)), r[0]);
        r[1] = fmaf(o.beta, Elem<T>::to_float(static_cast<uint16_t>(old.x >> 16)), r[1]);
        r[2] = fmaf(o.beta, Elem<T>::to_float(static_cast<uint16_t>(old.y & 0xffffu)), r[2]);
        r[3] = fmaf(o.beta, Elem<T>::to_float(static_cast<uint16_t>(old.y >> 16)), r[3]);
      }
      if (o.epi.active) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          r[j] = epilogue_at(o, row + (DOWN ? j : 0), col + (DOWN ? 0 : j), r[j]);
      }
      uint2 out;
      out.x = static_cast<uint32_t>(Elem<T>::from_float(r[0])) |
              (static_cast<uint32_t>(Elem<T>::from_float(r[1])) << 16);
      out.y = static_cast<uint32_t>(Elem<T>::from_float(r[2])) |
              (static_cast<uint32_t>(Elem<T>::from_float(r[3])) << 16);
      *p2 = out;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (DOWN ? row + j < o.m : col + j < o.n)
      store_one(o, row + (DOWN ? j : 0), col + (DOWN ? 0 : j), v[j]);
  }
}

// Split-k partial tile: raw float sums into workspace[split][m][n], no alpha/beta yet.
__device__ __forceinline__ void store_partial_quad(float* ws, int64_t m, int64_t n, bool vec4,
                                                   int64_t row, int64_t col, const float v[4]) {
  if (row >= m || col >= n) return;
  float* p = ws + row * n + col;
  if (vec4 && col + 4 <= n) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < n) p[j] = v[j];
}

// ---- Grid rasterisation -------------------------------------------------------------------
// Launch order walks GROUP tile-rows of C column by column: the blocks resident at one time
// then share a few A row-panels and B column-panels, so those stay in L2 instead of being
// streamed from DRAM once per tile row.
template <int GROUP>
__device__ __forceinline__ void swizzle_tile(int pid, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int64_t width = static_cast<int64_t>(GROUP) * tiles_n;
  const int group = static_cast<int>(pid / width);
  const int first_m = group * GROUP;
  const int rows = min(tiles_m - first_m, GROUP);
  const int in_group = static_cast<int>(pid - group * width);
  tm = first_m + in_group % rows;
  tn = in_group / rows;
}

// ---- Tile loaders of the pipelined kernel -------------------------------------------------
// A loader fills one operand tile S[BK][PITCH] (BK rows of k, BC used columns of c) from the
// operand whose element (k, c) is at base[c * c_stride + k * k_stride]. The kernel calls load() for
// tile t at the start of the k-tile that precedes its use and store() just before the barrier that
// publishes it. cp.async loaders (float32) write shared memory in load() and have an empty store();
// register-staged loaders (16-bit types, which cp.async cannot widen to float) fetch in load() and
// convert + write in store().
//
// Modes, picked on the host from strides and alignment:
//   kVecC   c is the unit-stride dimension and 16-byte vectors along c are aligned;
//   kVecK   k is the unit-stride dimension (a row-major A, a transposed B): elements are
//           fetched along k and written transposed into S[k][c];
//   kScalar anything else: one element per copy, lanes along c.
// Bounds: an element outside [0, c_ext) x [k_begin, k_end) is written as zero by an ordinary
// shared store, and no copy reads a byte outside the operand (cp_async.cuh says why the
// pipeline protocol covers those stores). Addresses are only formed for elements inside the
// operand: lanes past the c edge are pointed at a valid line.
// (LoadMode: kernels/plan/simt_plan.h; the loaders take it as an int template argument.)

template <int MODE, int BK, int BC, int THREADS, int PITCH>
struct AsyncTileLoader {
  static_assert(BC % 32 == 0 && PITCH % 32 == 4,
                "pitch = 4 (mod 32) keeps the transposed kVecK writes conflict-free");
  // kVecC: a thread owns one 4-float column slot and every VK_STEP-th row of the tile.
  static constexpr int VPR = BC / 4;
  static constexpr int VK_STEP = THREADS / VPR;
  static constexpr int NV = BK * VPR / THREADS;
  // kVecK: one copy instruction of a warp covers 8 consecutive k (a 32-byte sector) of 4
  // lines: 4 cache lines per instruction, where lanes along c would touch 32. In shared
  // memory the lane (kl, rl) writes word kl * PITCH + rl: with PITCH = 4 (mod 32) that is
  // bank 4 * kl + rl, all 32 distinct. A thread owns lines warp * 4 + rl + i * LINE_STEP.
  static constexpr int WARPS = THREADS / 32;
  static constexpr int LINE_STEP = 4 * WARPS;
  static constexpr int NL = BC / LINE_STEP;
  static constexpr int KCH = BK / 8;
  // kScalar: a thread owns one column and every SK_STEP-th row.
  static constexpr int SK_STEP = THREADS / BC;
  static constexpr int NS = BK * BC / THREADS;

  static_assert(MODE != kVecC || (THREADS % VPR == 0 && NV >= 1), "kVecC tiling");
  static_assert(MODE != kVecK || (BK % 8 == 0 && BC % LINE_STEP == 0 && NL >= 1), "kVecK tiling");
  static_assert(MODE != kScalar || (THREADS % BC == 0 && NS >= 1), "kScalar tiling");

  const float* ptr;  // the thread's first element of the next tile
  int64_t step;      // kVecC / kScalar: between a thread's rows; kVecK: between its lines
  int64_t tile_step;
  int64_t c_rem;  // kVecK: lines of c_ext at or after the thread's first line
  int k_off;      // the thread's first k within a tile
  int bytes;      // kVecC / kScalar: bytes of the thread's column inside c_ext
  bool c_full;    // kVecK: the block's BC lines all lie inside c_ext
  uint32_t smem_off;

  __device__ __forceinline__ void init(const float* b, int64_t c_stride, int64_t k_stride,
                                       int64_t c0, int64_t c_ext, int64_t k_begin, int tid) {
    tile_step = BK * k_stride;
    if constexpr (MODE == kVecC) {
      const int cv = tid % VPR, kr = tid / VPR;
      int64_t c = c0 + 4 * cv;
      const int64_t rem = c_ext - c;
      bytes = rem >= 4 ? 16 : (rem > 0 ? static_cast<int>(rem) * 4 : 0);
      if (rem <= 0) c = c0;
      ptr = b + c + (k_begin + kr) * k_stride;
      step = VK_STEP * k_stride;
      k_off = kr;
      smem_off = static_cast<uint32_t>(kr * PITCH + 4 * cv) * 4u;
    } else if constexpr (MODE == kVecK) {
      const int lane = tid % 32, warp = tid / 32;
      const int kl = lane & 7, line = warp * 4 + (lane >> 3);
      ptr = b + (c0 + line) * c_stride + k_begin + kl;
      step = LINE_STEP * c_stride;
      c_rem = c_ext - (c0 + line);
      c_full = c0 + BC <= c_ext;
      k_off = kl;
      smem_off = static_cast<uint32_t>(kl * PITCH + line) * 4u;
    } else {
      const int cl = tid % BC, kr = tid / BC;
      int64_t c = c0 + cl;
      const bool ok = c < c_ext;
      if (!ok) c = c0;
      bytes = ok ? 4 : 0;
      ptr = b + c * c_stride + (k_begin + kr) * k_stride;
      step = SK_STEP * k_stride;
      k_off = kr;
      smem_off = static_cast<uint32_t>(kr * PITCH + cl) * 4u;
    }
  }

  // Issues the copies of the tile starting at k = tile_k into the stage at stage_addr.
  // FULL: the whole tile lies below k_end; the kernel picks FULL at run time so that interior
  // tiles carry no per-element k checks.
  template <bool FULL>
  __device__ __forceinline__ void load(uint32_t stage_addr, int64_t tile_k, int64_t k_end) {
    const uint32_t dst0 = stage_addr + smem_off;
    const int64_t krem = FULL ? 0 : k_end - tile_k - k_off;  // this thread's k inside k_end
    if constexpr (MODE == kVecC) {
      const float* src = ptr;
      // Interior vectors take one unconditional copy each: a branch per copy in this
      // unrolled loop costs the fp32 kernels several percent.
      if (FULL && bytes == 16) {
#pragma unroll
        for (int e = 0; e < NV; ++e) {
          cp_async_16(dst0 + e * VK_STEP * PITCH * 4, src);
          src += step;
        }
      } else {
#pragma unroll
        for (int e = 0; e < NV; ++e) {
          cp_async_16_zfill(dst0 + e * VK_STEP * PITCH * 4, src,
                            FULL || e * VK_STEP < krem ? bytes : 0);
          src += step;
        }
      }
    } else if constexpr (MODE == kVecK) {
      const float* src = ptr;
      if (FULL && c_full) {
#pragma unroll
        for (int i = 0; i < NL; ++i) {
#pragma unroll
          for (int ch = 0; ch < KCH; ++ch)
            cp_async_4(dst0 + (ch * 8 * PITCH + i * LINE_STEP) * 4, src + ch * 8);
          src += step;
        }
      } else {
        // Edge tile: drop lines past c_ext and k past k_end (their words are zero-filled).
#pragma unroll
        for (int i = 0; i < NL; ++i) {
#pragma unroll
          for (int ch = 0; ch < KCH; ++ch) {
            const uint32_t dst = dst0 + (ch * 8 * PITCH + i * LINE_STEP) * 4;
            if (i * LINE_STEP < c_rem && (FULL || ch * 8 < krem))
              cp_async_4(dst, src + ch * 8);
            else
              st_shared_b32(dst, 0u);
          }
          src += step;
        }
      }
    } else {
      const float* src = ptr;
      if (FULL && bytes != 0) {
#pragma unroll
        for (int e = 0; e < NS; ++e) {
          cp_async_4(dst0 + e * SK_STEP * PITCH * 4, src);
          src += step;
        }
      } else {
#pragma unroll
        for (int e = 0; e < NS; ++e) {
          const uint32_t dst = dst0 + e * SK_STEP * PITCH * 4;
          if (bytes != 0 && (FULL || e * SK_STEP < krem))
            cp_async_4(dst, src);
          else
            st_shared_b32(dst, 0u);
          src += step;
        }
      }
    }
    ptr += (MODE == kVecK) ? static_cast<int64_t>(BK) : tile_step;
  }

  // Copies tile `tile` of the slice (k = k_begin + tile * BK) for a block whose tiles all lie
  // inside the operand (host-checked: c_ext and the slice are whole tiles, vector modes
  // only). No bound checks and no branches: the copies join the FFMA stream in one basic
  // block instead of a branchy run between barriers. Never advances ptr.
  __device__ __forceinline__ void load_interior(uint32_t stage_addr, int tile) const {
    static_assert(MODE != kScalar, "interior tiles are copied with vector modes only");
    const uint32_t dst0 = stage_addr + smem_off;
    if constexpr (MODE == kVecC) {
      const float* src = ptr + static_cast<int64_t>(tile) * tile_step;
#pragma unroll
      for (int e = 0; e < NV; ++e) cp_async_16(dst0 + e * VK_STEP * PITCH * 4, src + e * step);
    } else {
      const float* src = ptr + static_cast<int64_t>(tile) * BK;
#pragma unroll
      for (int i = 0; i < NL; ++i)
#pragma unroll
        for (int ch = 0; ch < KCH; ++ch)
          cp_async_4(dst0 + (ch * 8 * PITCH + i * LINE_STEP) * 4, src + i * step + ch * 8);
    }
  }

  __device__ __forceinline__ void store(float*) {}
};

// Register-staged loader for 16-bit element types: global loads into registers in load(),
// widening to float and shared stores in store(). Vector modes need 16-byte alignment.
template <class T, int MODE, int BK, int BC, int THREADS, int PITCH>
struct RegTileLoader {
  using raw = uint16_t;
  // kVecC: 8-element vectors along c.
  static constexpr int VPR = BC / 8;
  static constexpr int VK_STEP = THREADS / VPR;
  static constexpr int NV = BK * VPR / THREADS;
  // kVecK: 8-element vectors along k; lanes run along c so the transposed shared stores of a
  // warp hit 32 consecutive words.
  static constexpr int QK_STEP = THREADS / BC;  // 8-deep k chunks between a thread's vectors
  static constexpr int NQ = BK * BC / (8 * THREADS);
  // kScalar.
  static constexpr int SK_STEP = THREADS / BC;
  static constexpr int NS = BK * BC / THREADS;

  static_assert(MODE != kVecC || (THREADS % VPR == 0 && NV >= 1), "kVecC tiling");
  static_assert(MODE != kVecK || (BK % 8 == 0 && THREADS % BC == 0 && NQ >= 1), "kVecK tiling");
  static_assert(MODE != kScalar || (THREADS % BC == 0 && NS >= 1), "kScalar tiling");

  static constexpr int NREG = MODE == kScalar ? NS : (MODE == kVecC ? NV : NQ);

  const raw* ptr;
  int64_t k_step, tile_step;
  int64_t k_off;
  int c_valid;   // elements of this thread's line / vector inside c_ext (0..8, or 0/1)
  int smem_off;  // in floats
  uint4 vreg[MODE == kScalar ? 1 : NREG];
  uint32_t sreg[MODE == kScalar ? NS : 1];

  __device__ __forceinline__ void init(const raw* b, int64_t c_stride, int64_t k_stride, int64_t c0,
                                       int64_t c_ext, int64_t k_begin, int tid) {
    tile_step = BK * k_stride;
    if constexpr (MODE == kVecC) {
      const int cv = tid % VPR, kr = tid / VPR;
      const int64_t c = c0 + 8 * cv;
      const int64_t rem = c_ext - c;
      c_valid = rem >= 8 ? 8 : (rem > 0 ? static_cast<int>(rem) : 0);
      ptr = b + c + (k_begin + kr) * k_stride;
      k_step = VK_STEP * k_stride;
      k_off = kr;
      smem_off = kr * PITCH + 8 * cv;
    } else if constexpr (MODE == kVecK) {
      const int cl = tid % BC, kq = tid / BC;
      const int64_t c = c0 + cl;
      c_valid = c < c_ext ? 1 : 0;
      ptr = b + c * c_stride + k_begin + 8 * kq;
      k_step = 8 * QK_STEP;
      k_off = 8 * kq;
      smem_off = 8 * kq * PITCH + cl;
    } else {
      const int cl = tid % BC, kr = tid / BC;
      const int64_t c = c0 + cl;
      c_valid = c < c_ext ? 1 : 0;
      ptr = b + c * c_stride + (k_begin + kr) * k_stride;
      k_step = SK_STEP * k_stride;
      k_off = kr;
      smem_off = kr * PITCH + cl;
    }
  }

  template <bool FULL>
  __device__ __forceinline__ void load(uint32_t, int64_t tile_k, int64_t k_end) {
    const int64_t krem = FULL ? 0 : k_end - tile_k - k_off;
    if constexpr (MODE == kVecC) {
#pragma unroll
      for (int e = 0; e < NV; ++e) {
        const raw* src = ptr + e * k_step;
        const bool k_ok = FULL || e * VK_STEP < krem;
        if (k_ok && c_valid == 8) {
          vreg[e] = *reinterpret_cast<const uint4*>(src);
        } else {
          raw h[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) h[j] = (k_ok && j < c_valid) ? src[j] : raw(0);
          vreg[e] = pack8(h);
        }
      }
    } else if constexpr (MODE == kVecK) {
#pragma unroll
      for (int e = 0; e < NQ; ++e) {
        const raw* src = ptr + e * k_step;
        const int64_t kr = FULL ? 8 : krem - e * 8 * QK_STEP;  // k elements left in this vector
        if (c_valid && kr >= 8) {
          vreg[e] = *reinterpret_cast<const uint4*>(src);
        } else {
          raw h[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) h[j] = (c_valid && j < kr) ? src[j] : raw(0);
          vreg[e] = pack8(h);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < NS; ++e) {
        const bool ok = c_valid && (FULL || e * SK_STEP < krem);
        sreg[e] = ok ? ptr[e * k_step] : raw(0);
      }
    }
    ptr += tile_step;
  }

  __device__ __forceinline__ void store(float* stage) {
    float* dst = stage + smem_off;
    if constexpr (MODE == kVecC) {
#pragma unroll
      for (int e = 0; e < NV; ++e) {
        float f[8];
        unpack8<T>(vreg[e], f);
        float4* d = reinterpret_cast<float4*>(dst + e * VK_STEP * PITCH);
        d[0] = make_float4(f[0], f[1], f[2], f[3]);
        d[1] = make_float4(f[4], f[5], f[6], f[7]);
      }
    } else if constexpr (MODE == kVecK) {
#pragma unroll
      for (int e = 0; e < NQ; ++e) {
        float f[8];
        unpack8<T>(vreg[e], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) dst[(e * 8 * QK_STEP + j) * PITCH] = f[j];
      }
    } else {
#pragma unroll
      for (int e = 0; e < NS; ++e)
        dst[e * SK_STEP * PITCH] = Elem<T>::to_float(static_cast<raw>(sreg[e]));
    }
  }
};

}  // namespace simt
}  // namespace gemmt
