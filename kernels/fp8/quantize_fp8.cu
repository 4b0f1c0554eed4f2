// FP8 quantisation (gemmt::quantize_fp8 and quantize_fp8_with_transpose): amax, scale and the
// saturating cast, bit for bit the CPU reference's (the contract is in gemmt/fp8.h).
//
// Which kernels run, per granularity:
//   row            one pass: a team of threads per row (the narrowest that holds the row in
//                  at most 4 chunks a thread) keeps the row in registers (cols up to 16384)
//                  between its amax and its cast; longer rows are read twice, the second time
//                  mostly from L2.
//   block (1x128)  one pass: 16 threads per 128-element group, 16 rows per CTA, four groups
//                  of those rows per CTA with all their loads issued first (a 2-D grid).
//   block_128x128  one pass: a CTA per 128x128 tile holds the tile in registers.
//   tensor         a contiguous 2-byte x of at most half the L2: one cooperative kernel, the
//                  amax over a grid-wide barrier, then the cast. Otherwise a grid-wide amax
//                  (atomicMax on the float bits of non-negative values, which order as
//                  unsigned integers) into the workspace, then the cast, whose CTAs turn that
//                  amax into the multiplier themselves: no host round trip. The cast walks x
//                  backwards, so that it starts on the part of x the amax pass read last,
//                  which L2 still holds.
// With the transpose, the tile kernel writes qt through a shared-memory tile of the bytes
// (swizzled: no bank conflicts either way), 16 bytes per thread:
//   tensor, 128x128  qt is q transposed (each element keeps its scale);
//   block            one pass: a 128x128 tile holds both the 1x128 groups of q (its rows)
//                    and those of qt (its columns);
//   row              two passes: one tile pass gathers the row and column amaxes into the
//                    workspace, a second (backwards, as the tensor cast) writes q and qt.
// What a thread holds between an amax and its cast is x's own bits (Chunk below), half the
// registers of float values for a 2-byte x: more of x in flight per SM.
//
// Every thread loads 8 consecutive elements of a row at once (16 bytes of bfloat16, two or
// four 16-byte loads for float32 and float64) when x's rows are 16-byte aligned, element by
// element otherwise and at a row's ragged end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "common/cluster.cuh"
#include "common/cp_async.cuh"
#include "common/grid_flags.cuh"
#include "gemmt/arith.h"
#include "gemmt/cuda_check.h"
#include "gemmt/fp8.h"
#include "gemmt/launch.cuh"
#include "gemmt/numeric.cuh"

namespace gemmt {
namespace {

constexpr int kChunk = 8;    // elements a thread moves at once
constexpr int kGroup = 128;  // the 1x128 and 128x128 block edge
constexpr double kAmaxFloor = 1e-12;

// ---- the scalar semantics ----

__device__ __forceinline__ float fp8_top(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? 448.0f : 57344.0f;
}

// The kernels that cast take the format as a template argument (kE5M2): with both
// conversions in one body, the tile kernel built for three CTAs per SM spilled.
template <bool kE5M2>
__device__ __forceinline__ float fp8_top() {
  return kE5M2 ? 57344.0f : 448.0f;
}

// x converted to float as the reference's x.to(float) does. A conversion instruction may
// return the canonical NaN; the reference keeps a NaN's sign, and the sign reaches q's byte.
__device__ __forceinline__ float nan_with_sign(bool negative) {
  return __uint_as_float(0x7fc00000u | (negative ? 0x80000000u : 0u));
}
__device__ __forceinline__ float widen(__half v) {
  const float f = __half2float(v);
  return f == f ? f : nan_with_sign((__half_as_ushort(v) & 0x8000u) != 0);
}
__device__ __forceinline__ float widen(double v) {
  const float f = __double2float_rn(v);
  return v == v ? f : nan_with_sign(__double2hiint(v) < 0);
}

// |v| when finite, else 0: a non-finite element sets no scale.
__device__ __forceinline__ float finite_mag(float v) {
  const float a = fabsf(v);
  return a <= FLT_MAX ? a : 0.0f;
}

// float(fp8_max / max(amax, 1e-12)) at the floor: both operands constants, divided in double
// at compile time and rounded once to float, as the reference does at run time.
constexpr float kFloorMultE4M3 = static_cast<float>(448.0 / kAmaxFloor);
constexpr float kFloorMultE5M2 = static_cast<float>(57344.0 / kAmaxFloor);

// fp8_max / max(amax, 1e-12), divided in double and rounded once to float.
//
// Above the floor the quotient comes from a Newton reciprocal and one residual correction,
// not from the division's instruction sequence, whose out-of-line slow path is a call (the
// tile kernels spilled around it). From the approximation's 2^-20 or so, two Newton steps
// reach the rounding of double; the result is within a few units in the last place of the
// double quotient, and rounds to the same float: fp8_max is 7 * 2^k and amax a float, so
// fp8_max / amax differs from every float midpoint by more than 2^-49 of its value (a
// midpoint has 25 significant bits; fp8_max - amax * midpoint is a nonzero multiple of the
// last place of a product of at most 49 bits, nonzero since 7 * 2^k has 3 of them). amax is
// at most FLT_MAX, so the quotient is a normal float.
__device__ __forceinline__ float scale_mult(float amax, float top) {
  const double a = static_cast<double>(amax);
  if (!(a > kAmaxFloor)) return top == 448.0f ? kFloorMultE4M3 : kFloorMultE5M2;
  double r;
  asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r) : "d"(a));
#pragma unroll
  for (int i = 0; i < 2; ++i) r = fma(r, fma(-a, r, 1.0), r);
  const double t = static_cast<double>(top);
  double q = t * r;
  q = fma(fma(-a, q, t), r, q);
  return __double2float_rn(q);
}

// The dequantisation scale 1 / mult, correctly rounded as the reference's float reciprocal.
__device__ __forceinline__ float dequant_scale(float mult) {
  return __frcp_rn(mult);
}

__device__ __forceinline__ unsigned int byte_of(uint2 b, int e) {
  return ((e < 4 ? b.x : b.y) >> (8 * (e & 3))) & 0xffu;
}

// ---- loads and stores of 8 elements ----

__device__ __forceinline__ int chunk_len(int64_t cols, int64_t c) {
  const int64_t left = cols - c;
  return left >= kChunk ? kChunk : (left > 0 ? static_cast<int>(left) : 0);
}

// Eight elements of x in x's own bits (float64: converted to float already, which is all the
// semantics use of them). Kept this way between a group's amax and its cast, a chunk of
// bfloat16 or float16 occupies 4 registers rather than the 8 of its float values: twice the
// bytes of x in flight for the same registers.
template <typename T>
struct Chunk {
  static constexpr int kWords = kChunk * (sizeof(T) == 2 ? 2 : 4) / 4;
  unsigned int u[kWords];
};

template <typename T>
__device__ __forceinline__ void zero_chunk(Chunk<T>& c) {
#pragma unroll
  for (int i = 0; i < Chunk<T>::kWords; ++i) c.u[i] = 0u;
}

// Element e's bits into a chunk whose words started at 0.
template <typename T>
__device__ __forceinline__ void set_element(Chunk<T>& c, int e, T v) {
  if constexpr (std::is_same_v<T, float>) {
    c.u[e] = __float_as_uint(v);
  } else if constexpr (std::is_same_v<T, double>) {
    c.u[e] = __float_as_uint(widen(v));
  } else {
    unsigned int b;
    if constexpr (std::is_same_v<T, __half>) {
      b = __half_as_ushort(v);
    } else {
      b = __bfloat16_as_ushort(v);
    }
    c.u[e >> 1] |= (e & 1) ? (b << 16) : b;
  }
}

// float(element e), as the reference's x.to(float) gives it (bfloat16: the bits shifted up).
template <typename T>
__device__ __forceinline__ float element(const Chunk<T>& c, int e) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return __uint_as_float(c.u[e]);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const unsigned int w = c.u[e >> 1];
    return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
  } else {
    const unsigned int w = c.u[e >> 1];
    return widen(
        __ushort_as_half(static_cast<unsigned short>((e & 1) ? (w >> 16) : (w & 0xffffu))));
  }
}

// c = p[0..n), the rest 0 (which changes no amax). vec: p is 16-byte aligned.
template <typename T>
__device__ __forceinline__ void load_chunk(const T* p, int n, bool vec, Chunk<T>& c) {
  if (vec && n == kChunk) {
    if constexpr (std::is_same_v<T, double>) {
#pragma unroll
      for (int i = 0; i < kChunk / 2; ++i) {
        const double2 d = reinterpret_cast<const double2*>(p)[i];
        c.u[2 * i] = __float_as_uint(widen(d.x));
        c.u[2 * i + 1] = __float_as_uint(widen(d.y));
      }
    } else {
#pragma unroll
      for (int i = 0; i < Chunk<T>::kWords / 4; ++i) {
        const uint4 w = reinterpret_cast<const uint4*>(p)[i];
        c.u[4 * i] = w.x, c.u[4 * i + 1] = w.y, c.u[4 * i + 2] = w.z, c.u[4 * i + 3] = w.w;
      }
    }
  } else {
    zero_chunk(c);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      if (e < n) set_element(c, e, p[e]);
    }
  }
}

// p[0..n) = the first n bytes of b. vec: p is 8-byte aligned.
__device__ __forceinline__ void store8(uint8_t* p, int n, bool vec, uint2 b) {
  if (vec && n == kChunk) {
    *reinterpret_cast<uint2*>(p) = b;
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      if (e < n) p[e] = static_cast<uint8_t>(byte_of(b, e));
    }
  }
}

// ---- amax from x's bits ----
// Without the sign, the bits of one format order as the magnitudes do, with inf and NaN above
// every finite value. The max of the bits is then the amax unless it is non-finite, which
// only a chunk holding an inf or a NaN gives: that chunk takes the element-by-element path.
// For a 2-byte x this is two integer operations per pair of elements.

template <typename T>
__device__ __forceinline__ constexpr unsigned int inf_bits() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return 0x7f80u;
  } else if constexpr (std::is_same_v<T, __half>) {
    return 0x7c00u;
  } else {
    return 0x7f800000u;  // float, and float64 already converted to float
  }
}

// The magnitude whose bits (sign cleared) are m.
template <typename T>
__device__ __forceinline__ float mag_value(unsigned int m) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __uint_as_float(m << 16);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(m)));
  } else {
    return __uint_as_float(m);
  }
}

// Per 16-bit lane unsigned max.
__device__ __forceinline__ unsigned int max_u16x2(unsigned int a, unsigned int b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned int d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return __vmaxu2(a, b);
#endif
}

// The sign-cleared bits of one word: two 16-bit elements, or one float.
template <typename T>
__device__ __forceinline__ unsigned int mag_word(unsigned int w) {
  return w & (sizeof(T) == 2 ? 0x7fff7fffu : 0x7fffffffu);
}

template <typename T>
__device__ __forceinline__ unsigned int max_word(unsigned int a, unsigned int b) {
  if constexpr (sizeof(T) == 2) {
    return max_u16x2(a, b);
  } else {
    return a > b ? a : b;
  }
}

// A word of max_word's results down to one element's bits.
template <typename T>
__device__ __forceinline__ unsigned int fold_word(unsigned int m) {
  if constexpr (sizeof(T) == 2) {
    const unsigned int lo = m & 0xffffu, hi = m >> 16;
    return lo > hi ? lo : hi;
  } else {
    return m;
  }
}

template <typename T>
__device__ __forceinline__ float max_mag_exact(const Chunk<T>& c) {
  float m = 0.0f;
#pragma unroll
  for (int e = 0; e < kChunk; ++e) m = fmaxf(m, finite_mag(element(c, e)));
  return m;
}

// The finite amax of kN chunks.
template <typename T, int kN>
__device__ __forceinline__ float max_mag_chunks(const Chunk<T> (&c)[kN]) {
  unsigned int m = 0u;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
#pragma unroll
    for (int i = 0; i < Chunk<T>::kWords; ++i) m = max_word<T>(m, mag_word<T>(c[j].u[i]));
  }
  m = fold_word<T>(m);
  if (m < inf_bits<T>()) return mag_value<T>(m);
  float r = 0.0f;
#pragma unroll
  for (int j = 0; j < kN; ++j) r = fmaxf(r, max_mag_exact(c[j]));
  return r;
}

template <typename T>
__device__ __forceinline__ float max_mag_chunk(const Chunk<T>& c) {
  unsigned int m = 0u;
#pragma unroll
  for (int i = 0; i < Chunk<T>::kWords; ++i) m = max_word<T>(m, mag_word<T>(c.u[i]));
  m = fold_word<T>(m);
  return m < inf_bits<T>() ? mag_value<T>(m) : max_mag_exact(c);
}

// ---- the cast of a chunk ----
// q's byte is cvt.rn.satfinite(x * mult) with x's sign bit OR-ed in. Saturation to +-fp8_max
// (inf included) is the reference's clamp: no value that the clamp changes rounds to anything
// but fp8_max. Every non-NaN result already carries x's sign (x * mult keeps it, zero
// included); a NaN, which the product turns into the positive canonical NaN, gets it back,
// as in the reference's 0x7f | sign. e4m3 has no other NaN byte than 0x7f; e5m2's conversion
// may give 0x7d or 0x7e, so its NaNs (exponent all ones: satfinite never gives the infinity
// 0x7c) get their mantissa set to 0x7f.

// float(element e) as a factor of the product: a NaN's sign need not survive it (it comes
// from x's bits), so float16 converts without widen's sign repair.
template <typename T>
__device__ __forceinline__ float factor(const Chunk<T>& c, int e) {
  if constexpr (std::is_same_v<T, __half>) {
    const unsigned int w = c.u[e >> 1];
    return __half2float(
        __ushort_as_half(static_cast<unsigned short>((e & 1) ? (w >> 16) : (w & 0xffffu))));
  } else {
    return element(c, e);
  }
}

// The sign bits of elements 4h .. 4h + 3 at bit 7 of bytes 0 .. 3.
template <typename T>
__device__ __forceinline__ unsigned int sign_bytes(const Chunk<T>& c, int h) {
  if constexpr (sizeof(T) == 2) {
    return __byte_perm(c.u[2 * h], c.u[2 * h + 1], 0x7531) & 0x80808080u;
  } else {
    const unsigned int lo = __byte_perm(c.u[4 * h], c.u[4 * h + 1], 0x0073);
    const unsigned int hi = __byte_perm(c.u[4 * h + 2], c.u[4 * h + 3], 0x0073);
    return __byte_perm(lo, hi, 0x5410) & 0x80808080u;
  }
}

__device__ __forceinline__ unsigned int cvt_pair(float a, float b, bool e5m2) {
  return e5m2 ? __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E5M2)
              : __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// Eight elements, element e with multiplier mult[e], packed little-endian (element 0 in the
// low byte).
template <typename T>
__device__ __forceinline__ uint2 quantize_chunk(const Chunk<T>& c, const float (&mult)[kChunk],
                                                bool e5m2) {
  unsigned int w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int e = 4 * h;
    const unsigned int sign = sign_bytes(c, h);
    const unsigned int p0 =
        cvt_pair(mul_rn(factor(c, e), mult[e]), mul_rn(factor(c, e + 1), mult[e + 1]), e5m2);
    const unsigned int p1 = cvt_pair(mul_rn(factor(c, e + 2), mult[e + 2]),
                                     mul_rn(factor(c, e + 3), mult[e + 3]), e5m2);
    unsigned int b = __byte_perm(p0, p1, 0x5410) | sign;
    if (e5m2) {
      // Magnitude byte >= 0x7c (a NaN) carries into bit 7; no carry crosses a byte.
      const unsigned int nan = ((b & 0x7f7f7f7fu) + 0x04040404u) & 0x80808080u;
      b |= (nan >> 7) * 3u;
    }
    w[h] = b;
  }
  return make_uint2(w[0], w[1]);
}

template <typename T>
__device__ __forceinline__ uint2 quantize_chunk(const Chunk<T>& c, float mult, bool e5m2) {
  float m[kChunk];
#pragma unroll
  for (int e = 0; e < kChunk; ++e) m[e] = mult;
  return quantize_chunk(c, m, e5m2);
}

__device__ __forceinline__ void atomic_max_nonneg(unsigned int* slot, float v) {
  // Non-negative floats order as their bit patterns; 0 is the workspace's start value.
  if (v > 0.0f) atomicMax(slot, __float_as_uint(v));
}

// The max of m over a CTA of kThreads threads, returned to thread 0 (after a barrier that
// partial, kThreads / 32 floats of shared memory, needs).
template <int kThreads>
__device__ __forceinline__ float cta_max_to_thread0(float m, float* partial) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, partial[w]);
  }
  return m;
}

// The max of m over a CTA of kThreads threads into *slot (thread 0's atomic).
template <int kThreads>
__device__ __forceinline__ void cta_amax_into(float m, unsigned int* slot, float* partial) {
  m = cta_max_to_thread0<kThreads>(m, partial);
  if (threadIdx.x == 0) atomic_max_nonneg(slot, m);
}

// ---- row: a team of 2^k threads per row ----

// The team's multiplier, from its members' amaxes. A team wider than a warp is the whole CTA
// (the launcher sees to it). For a 2-byte x, whose casts are bound by instructions rather
// than memory, its warp 0 alone turns the amax into the multiplier (a reciprocal in double,
// which costs every warp that runs it) and hands it over through partial[kTeamMultSlot];
// for float32 and float64 every warp works it out (that way the float64 kernels hold no
// spills on sm_80).
constexpr int kTeamMultSlot = 16;

template <typename T>
__device__ __forceinline__ float team_mult(float m, int team, float* partial, float top) {
  for (int off = (team < 32 ? team : 32) >> 1; off > 0; off >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  }
  if (team <= 32) return scale_mult(m, top);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = m;
  __syncthreads();
  if constexpr (sizeof(T) != 2) {
    m = partial[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, partial[w]);
    __syncthreads();  // partial is written again by the next row
    return scale_mult(m, top);
  }
  if (threadIdx.x < 32) {
    const int warps = static_cast<int>(blockDim.x >> 5);
    float t = static_cast<int>(threadIdx.x) < warps ? partial[threadIdx.x] : 0.0f;
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, off));
    t = scale_mult(t, top);
    if (threadIdx.x == 0) partial[kTeamMultSlot] = t;
  }
  __syncthreads();
  // The next row's first barrier comes before anything writes partial[kTeamMultSlot] again.
  return partial[kTeamMultSlot];
}

// kIters > 0: the row fits in kIters chunks of 8 per thread, kept in registers; kIters == 0:
// the row is read twice. Teams of up to 512 threads. A register cap (nvcc 12.4 and later)
// rather than launch bounds: 48 registers for a 2-byte x keep five 256-thread CTAs per SM (a
// team of 256, four chunks a thread: rows of 8192), 64 are what float32 and float64 need
// without spilling.
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define GEMMT_QUANT_ROWS_REGISTERS(T) __maxnreg__(sizeof(T) == 2 ? 48 : 64)
#else
#define GEMMT_QUANT_ROWS_REGISTERS(T) __launch_bounds__(512)
#endif
// raw[u] = the chunk at column c0 + u * span of a row of `cols` elements (zeros past its end).
template <typename T, int kN>
__device__ __forceinline__ void load_spaced_chunks(const T* xr, int64_t c0, int64_t span,
                                                   int64_t cols, bool vec_in, Chunk<T> (&raw)[kN]) {
#pragma unroll
  for (int u = 0; u < kN; ++u) {
    const int64_t c = c0 + u * span;
    const int n = chunk_len(cols, c);
    if (n > 0) {
      load_chunk(xr + c, n, vec_in, raw[u]);
    } else {
      zero_chunk(raw[u]);
    }
  }
}

// Chunks a thread loads at once in the rows kernel's two passes over a long row.
template <typename T>
constexpr int row_unroll() {
  return sizeof(T) == 2 ? 4 : sizeof(T) == 4 ? 2 : 1;
}

template <typename T, int kIters, bool kE5M2>
__global__ void GEMMT_QUANT_ROWS_REGISTERS(T)
    quantize_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld,
                         bool vec_in, bool vec_out, int team_log2, uint8_t* __restrict__ q,
                         float* __restrict__ scale) {
  __shared__ float partial[kTeamMultSlot + 1];
  const int team = 1 << team_log2;
  const int teams = static_cast<int>(blockDim.x) >> team_log2;
  const int lane = static_cast<int>(threadIdx.x) & (team - 1);
  const int member = static_cast<int>(threadIdx.x) >> team_log2;
  const float top = fp8_top<kE5M2>();
  constexpr bool e5m2 = kE5M2;
  const int64_t span = static_cast<int64_t>(team) * kChunk;
  // Every thread runs the same number of iterations, so the CTA-wide team's barriers match.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * teams; first < rows;
       first += static_cast<int64_t>(gridDim.x) * teams) {
    const int64_t r = first + member;
    const bool active = r < rows;
    const T* xr = x + (active ? r : 0) * ld;
    uint8_t* qr = q + (active ? r : 0) * cols;
    float m = 0.0f;
    float mult;
    if constexpr (kIters > 0) {
      Chunk<T> raw[kIters];
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int64_t c = it * span + lane * kChunk;
        const int n = active ? chunk_len(cols, c) : 0;
        if (n > 0) {
          load_chunk(xr + c, n, vec_in, raw[it]);
        } else {
          zero_chunk(raw[it]);
        }
      }
      m = max_mag_chunks(raw);
      mult = team_mult<T>(m, team, partial, top);
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int64_t c = it * span + lane * kChunk;
        const int n = active ? chunk_len(cols, c) : 0;
        if (n > 0) store8(qr + c, n, vec_out, quantize_chunk(raw[it], mult, e5m2));
      }
    } else {
      constexpr int kUnroll = row_unroll<T>();
      // Both passes kUnroll chunks a thread at a time; the second finds the row in L2.
      if (active) {
        for (int64_t c0 = lane * kChunk; c0 < cols; c0 += kUnroll * span) {
          Chunk<T> raw[kUnroll];
          load_spaced_chunks(xr, c0, span, cols, vec_in, raw);
          m = fmaxf(m, max_mag_chunks(raw));
        }
      }
      mult = team_mult<T>(m, team, partial, top);
      if (active) {
        for (int64_t c0 = lane * kChunk; c0 < cols; c0 += kUnroll * span) {
          Chunk<T> raw[kUnroll];
          load_spaced_chunks(xr, c0, span, cols, vec_in, raw);
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = c0 + u * span;
            const int n = chunk_len(cols, c);
            if (n > 0) store8(qr + c, n, vec_out, quantize_chunk(raw[u], mult, e5m2));
          }
        }
      }
    }
    if (active && lane == 0) scale[r] = dequant_scale(mult);
  }
}

// ---- block (1x128): 16 threads per group, 16 rows of 128-column slices per CTA ----
// A work item is 16 rows of one 128-column slice (one 16-byte load per thread); a CTA takes
// kBlockItems adjacent items of the same 16 rows and issues all their loads before it reduces
// any: 64 bytes of x in flight per thread, each row read in 1 KB runs. A 2-D grid, x over a
// row tile's runs of items, y over the row tiles (looping past 65535 of them): a thread's row
// pointers are worked out once per CTA and no index takes a 64-bit division. The same work
// on a 1-D grid, each CTA dividing its index into a row tile and a slice, issued so many more
// instructions that it ran at 0.77 of the copy bandwidth (its SMs 77% busy, DRAM 48%).

constexpr int kBlockThreads = 256;
constexpr int kBlockRows = kBlockThreads / (kGroup / kChunk);
constexpr int kBlockItems = 4;
static_assert(kBlockItems <= 16 && (kBlockItems & (kBlockItems - 1)) == 0,
              "a group's lanes share out its items' multipliers");

template <typename T, bool kE5M2>
__global__ void __launch_bounds__(kBlockThreads, 4)
    quantize_blocks_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld,
                           bool vec_in, bool vec_out, uint8_t* __restrict__ q,
                           float* __restrict__ scale) {
  const int lane = threadIdx.x & 15;
  const int sub = threadIdx.x >> 4;
  const int64_t groups = ceil_div(cols, kGroup);
  const int64_t kb0 = static_cast<int64_t>(blockIdx.x) * kBlockItems;
  const int64_t c0 = kb0 * kGroup + lane * kChunk;
  for (int64_t rt = blockIdx.y; rt * kBlockRows < rows; rt += gridDim.y) {
    const int64_t r = rt * kBlockRows + sub;
    const bool active = r < rows;
    const T* xr = x + (active ? r : 0) * ld;
    Chunk<T> raw[kBlockItems];
    int n[kBlockItems];
#pragma unroll
    for (int u = 0; u < kBlockItems; ++u) {
      n[u] = active && kb0 + u < groups ? chunk_len(cols, c0 + u * kGroup) : 0;
      if (n[u] > 0) {
        load_chunk(xr + c0 + u * kGroup, n[u], vec_in, raw[u]);
      } else {
        zero_chunk(raw[u]);
      }
    }
    float m[kBlockItems];
#pragma unroll
    for (int u = 0; u < kBlockItems; ++u) m[u] = max_mag_chunk(raw[u]);
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) {
#pragma unroll
      for (int u = 0; u < kBlockItems; ++u) {
        m[u] = fmaxf(m[u], __shfl_xor_sync(0xffffffffu, m[u], off));
      }
    }
    // The 16 lanes of a group share its items' amaxes: lane u of them works out item u's
    // multiplier (a reciprocal in double) and writes its scale; the others read it.
    float mine = m[0];
#pragma unroll
    for (int u = 1; u < kBlockItems; ++u) mine = (lane & (kBlockItems - 1)) == u ? m[u] : mine;
    mine = scale_mult(mine, fp8_top<kE5M2>());
    if (active && lane < kBlockItems && kb0 + lane < groups) {
      scale[r + (kb0 + lane) * rows] = dequant_scale(mine);
    }
    uint8_t* qr = q + (active ? r : 0) * cols;
#pragma unroll
    for (int u = 0; u < kBlockItems; ++u) {
      const float mult = __shfl_sync(0xffffffffu, mine, (threadIdx.x & 16) | u);
      if (n[u] > 0) {
        store8(qr + c0 + u * kGroup, n[u], vec_out, quantize_chunk(raw[u], mult, kE5M2));
      }
    }
  }
}

// ---- tensor: grid-wide amax, then the cast ----
// x is seen as `rows` rows of `cols` (the launcher passes a contiguous x as one long row), a
// 2-D grid: y over rows, x over the chunks of 8 within a row.

constexpr int kStreamThreads = 256;
// Chunks loaded at once per thread: 64 bytes of x in flight.
template <typename T>
constexpr int stream_unroll() {
  return sizeof(T) == 2 ? 4 : 2;
}

template <typename T>
__global__ void __launch_bounds__(kStreamThreads)
    tensor_amax_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld, bool vec_in,
                       unsigned int* __restrict__ amax_bits) {
  __shared__ float partial[kStreamThreads / 32];
  constexpr int kUnroll = stream_unroll<T>();
  const int64_t chunks = ceil_div(cols, kChunk);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * ld;
    for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < chunks;
         k += kUnroll * stride) {
      Chunk<T> raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = (k + u * stride) * kChunk;
        const int n = chunk_len(cols, c);
        if (n > 0) {
          load_chunk(xr + c, n, vec_in, raw[u]);
        } else {
          zero_chunk(raw[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) m = fmaxf(m, max_mag_chunk(raw[u]));
    }
  }
  cta_amax_into<kStreamThreads>(m, amax_bits, partial);
}

// A resident grid looping over the chunks: the multiplier (a division in double) is worked
// out once per thread, not once per 8 elements. It walks x backwards, rows and chunks both:
// the amax pass read x forwards, so the end of x is what L2 still holds when this pass
// starts, and some of the second read of x comes from L2 rather than from memory.
template <typename T, bool kE5M2>
__global__ void __launch_bounds__(kStreamThreads)
    tensor_cast_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld, bool vec_in,
                       bool vec_out, const unsigned int* __restrict__ amax_bits,
                       uint8_t* __restrict__ q, float* __restrict__ scale) {
  constexpr int kUnroll = stream_unroll<T>();
  const float top = fp8_top<kE5M2>();
  constexpr bool e5m2 = kE5M2;
  const float mult = scale_mult(__uint_as_float(*amax_bits), top);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) scale[0] = dequant_scale(mult);
  const int64_t chunks = ceil_div(cols, kChunk);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t rf = blockIdx.y; rf < rows; rf += gridDim.y) {
    const int64_t r = rows - 1 - rf;
    const T* xr = x + r * ld;
    uint8_t* qr = q + r * cols;
    for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < chunks;
         k += kUnroll * stride) {
      // Chunk k + u * stride of the forward walk is chunk kr - u * stride from the end.
      const int64_t kr = chunks - 1 - k;
      Chunk<T> raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = (kr - u * stride) * kChunk;  // negative past the start
        const int n = c >= 0 ? chunk_len(cols, c) : 0;
        if (n > 0) {
          load_chunk(xr + c, n, vec_in, raw[u]);
        } else {
          zero_chunk(raw[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = (kr - u * stride) * kChunk;
        const int n = c >= 0 ? chunk_len(cols, c) : 0;
        if (n > 0) store8(qr + c, n, vec_out, quantize_chunk(raw[u], mult, e5m2));
      }
    }
  }
}

// ---- tensor, one kernel, for an x that L2 holds: amax and cast across a grid-wide barrier ----
// For a contiguous, 16-byte aligned 2-byte x of at most half the L2. One CTA per SM, all
// resident (a cooperative launch), takes a contiguous share of x: the first kStashSlabs slabs
// of its share (a slab is a chunk per thread) are copied into shared memory, the rest read for
// their amax only; after a grid-wide barrier (the amax complete) the rest is read again, newest
// first, and cast, then the stash. Against the two-kernel path (a workspace reset, the amax
// kernel, the cast kernel) it is one launch fewer: 1.1-1.3x on inputs of 8 KB-30 MB.
// On inputs larger than L2 it ran 10-13% slower (one 1024-thread CTA an SM keeps less of x in
// flight than the resident grids of the two kernels), and those keep the two kernels.
// An x that eight CTAs' stashes hold (up to 852K elements: a decode step's activations) is one
// cluster's instead, on sm_90: the CTAs' amaxes meet through distributed shared memory
// between two cluster barriers, with no grid-wide barrier and no workspace to reset before
// the launch (16 x 4096 elements: 4.1 us a call either way, without the memset and its
// launch; H200).

constexpr int kFusedThreads = 1024;
constexpr int kStashSlabs = 13;  // 208 KB of shared memory a CTA
constexpr int kFusedUnroll = 4;

struct FusedSync {
  unsigned int amax_bits;  // the workspace's first word, as the two-kernel path
  int arrived;             // CTAs past their amax
};

// The CTA's amax into the grid's, then wait for every CTA's; returns the grid's amax.
__device__ float grid_amax(float m, FusedSync* sync, float* partial) {
  cta_amax_into<kFusedThreads>(m, &sync->amax_bits, partial);
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(&sync->arrived, 1);
    while (ld_acquire_gpu(&sync->arrived) < static_cast<int>(gridDim.x)) {
    }
    // Ordered after every CTA's atomic by the acquire; read from L2, where atomics land.
    partial[0] = __uint_as_float(__ldcg(&sync->amax_bits));
  }
  __syncthreads();
  return partial[0];
}

// The cluster's amax (a grid of one cluster): each CTA's in its partial[0], read by thread 0 of
// every CTA from every peer; the second barrier keeps the peers' shared memory until then.
__device__ float cluster_amax(float m, float* partial) {
  m = cta_max_to_thread0<kFusedThreads>(m, partial);
  if (threadIdx.x == 0) partial[0] = m;
  cluster::barrier();
  if (threadIdx.x == 0) {
    float g = 0.0f;  // as the workspace's atomic from 0 keeps it
    for (uint32_t r = 0; r < gridDim.x; ++r) g = fmaxf(g, cluster::load_peer(partial, r).x);
    partial[4] = g;
  }
  cluster::barrier();
  return partial[4];
}

// kCluster: launched as one cluster (cluster_amax), else as a cooperative grid (grid_amax).
template <typename T, bool kE5M2, bool kCluster>
__global__ void __launch_bounds__(kFusedThreads, 1)
    tensor_fused_kernel(const T* __restrict__ x, int64_t n, bool vec_out, FusedSync* sync,
                        uint8_t* __restrict__ q, float* __restrict__ scale) {
  static_assert(sizeof(T) == 2, "a chunk of a 2-byte x is one 16-byte copy");
  extern __shared__ __align__(16) unsigned char stash_bytes[];
  __shared__ __align__(16) float partial[kFusedThreads / 32];
  const int64_t chunks = ceil_div(n, kChunk);
  const int64_t share = ceil_div(chunks, static_cast<int64_t>(gridDim.x));
  const int64_t s0 = share * blockIdx.x;
  const int64_t s1 = s0 + share < chunks ? s0 + share : chunks;
  const int64_t slabs = s1 > s0 ? ceil_div(s1 - s0, kFusedThreads) : 0;
  const int stashed = static_cast<int>(slabs < kStashSlabs ? slabs : kStashSlabs);
  // Chunk k of x: its elements (0 past the share), and its slot in the stash.
  auto chunk_at = [&](int64_t j) { return s0 + j * kFusedThreads + threadIdx.x; };
  auto elems = [&](int64_t k) { return k < s1 ? chunk_len(n, k * kChunk) : 0; };
  auto slot = [&](int j) {
    return smem_addr(stash_bytes) + static_cast<uint32_t>((j * kFusedThreads + threadIdx.x) * 16);
  };

  for (int j = 0; j < stashed; ++j) {
    const int64_t k = chunk_at(j);
    if (elems(k) == kChunk) cp_async_16(slot(j), x + k * kChunk);
  }
  cp_async_commit();
  float m = 0.0f;
  for (int64_t j0 = stashed; j0 < slabs; j0 += kFusedUnroll) {
    Chunk<T> raw[kFusedUnroll];
#pragma unroll
    for (int u = 0; u < kFusedUnroll; ++u) {
      const int64_t k = chunk_at(j0 + u);
      const int e = j0 + u < slabs ? elems(k) : 0;
      if (e > 0) {
        load_chunk(x + k * kChunk, e, true, raw[u]);
      } else {
        zero_chunk(raw[u]);
      }
    }
    m = fmaxf(m, max_mag_chunks(raw));
  }
  cp_async_wait<0>();
  auto stashed_chunk = [&](int j, Chunk<T>& c) {
    const int64_t k = chunk_at(j);
    const int e = elems(k);
    if (e == kChunk) {
      const uint4 v = ld_shared_v4(slot(j));
      c.u[0] = v.x, c.u[1] = v.y, c.u[2] = v.z, c.u[3] = v.w;
    } else if (e > 0) {
      load_chunk(x + k * kChunk, e, true, c);
    } else {
      zero_chunk(c);
    }
    return e;
  };
  for (int j = 0; j < stashed; ++j) {
    Chunk<T> c;
    stashed_chunk(j, c);
    m = fmaxf(m, max_mag_chunk(c));
  }

  const float amax = kCluster ? cluster_amax(m, partial) : grid_amax(m, sync, partial);
  const float mult = scale_mult(amax, fp8_top<kE5M2>());
  if (blockIdx.x == 0 && threadIdx.x == 0) scale[0] = dequant_scale(mult);

  // The rest newest first (what L2 holds), then the stash.
  for (int64_t j1 = slabs; j1 > stashed; j1 -= kFusedUnroll) {
    Chunk<T> raw[kFusedUnroll];
    int e[kFusedUnroll];
#pragma unroll
    for (int u = 0; u < kFusedUnroll; ++u) {
      const int64_t j = j1 - 1 - u;
      const int64_t k = chunk_at(j);
      e[u] = j >= stashed ? elems(k) : 0;
      if (e[u] > 0) load_chunk(x + k * kChunk, e[u], true, raw[u]);
    }
#pragma unroll
    for (int u = 0; u < kFusedUnroll; ++u) {
      const int64_t k = chunk_at(j1 - 1 - u);
      if (e[u] > 0) store8(q + k * kChunk, e[u], vec_out, quantize_chunk(raw[u], mult, kE5M2));
    }
  }
  for (int j = 0; j < stashed; ++j) {
    Chunk<T> c;
    const int e = stashed_chunk(j, c);
    if (e > 0) store8(q + chunk_at(j) * kChunk, e, vec_out, quantize_chunk(c, mult, kE5M2));
  }
}

// The one-cluster form where it applies (*launched): a 2-byte x, 16-byte aligned, whose shares
// over at most eight CTAs fit their stashes, on a device with cluster launches (sm_90).
template <typename T, bool kE5M2>
cudaError_t launch_tensor_cluster(const T* x, int64_t n, bool vec_out, uint8_t* q, float* scale,
                                  cudaStream_t stream, bool* launched) {
  constexpr auto kernel = tensor_fused_kernel<T, kE5M2, true>;
  constexpr int64_t kMaxCtas = 8;  // the portable cluster size
  static std::atomic<int> cluster_cache[kMaxCachedDevices] = {};
  int can_cluster = 0;
  GEMMT_RETURN_IF_ERROR(cached_per_device(cluster_cache, &can_cluster, [](int device, int* value) {
    return cudaDeviceGetAttribute(value, cudaDevAttrClusterLaunch, device);
  }));
  const int64_t chunks = ceil_div(n, kChunk);
  const int64_t ctas = std::min<int64_t>(kMaxCtas, ceil_div(chunks, int64_t{kFusedThreads}));
  if (!can_cluster || ctas < 1 || !is_aligned<16>(x)) return cudaSuccess;
  const int64_t slabs = ceil_div(ceil_div(chunks, ctas), int64_t{kFusedThreads});  // a share's
  if (slabs > kStashSlabs) return cudaSuccess;
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(kStashSlabs * kFusedThreads * 16));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned int>(ctas));
  config.blockDim = dim3(kFusedThreads);
  config.dynamicSmemBytes = static_cast<size_t>(slabs) * kFusedThreads * 16;
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned int>(ctas);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, x, n, vec_out,
                                             static_cast<FusedSync*>(nullptr), q, scale);
  if (err == cudaErrorLaunchOutOfResources || err == cudaErrorInvalidClusterSize) {
    (void)cudaGetLastError();  // no room for the cluster (a limited share of the GPU): the grid
    return cudaSuccess;
  }
  *launched = err == cudaSuccess;
  return err;
}

// The one-kernel tensorwise path where it applies (*launched), nothing where it does not: a
// 2-byte x of at most half the L2, 16-byte aligned, on a device with cooperative launches and
// the kernel's 208 KB of shared memory a CTA (the Hopper GPUs; others take the two kernels);
// the one-cluster form first, where it applies.
template <typename T, bool kE5M2>
cudaError_t launch_tensor_fused(const T* x, int64_t n, bool vec_out, void* workspace, uint8_t* q,
                                float* scale, cudaStream_t stream, bool* launched) {
  *launched = false;
  if constexpr (sizeof(T) != 2) {
    return cudaSuccess;
  } else {
    GEMMT_RETURN_IF_ERROR(
        (launch_tensor_cluster<T, kE5M2>(x, n, vec_out, q, scale, stream, launched)));
    if (*launched) return cudaSuccess;
    constexpr auto kernel = tensor_fused_kernel<T, kE5M2, false>;
    constexpr int kSmem = kStashSlabs * kFusedThreads * 16;
    static std::atomic<int> coop_cache[kMaxCachedDevices] = {};
    int sms = 0, coop = 0, smem = 0, l2 = 0, per_sm = 0;
    GEMMT_RETURN_IF_ERROR(cached_per_device(coop_cache, &coop, [](int device, int* value) {
      return cudaDeviceGetAttribute(value, cudaDevAttrCooperativeLaunch, device);
    }));
    GEMMT_RETURN_IF_ERROR(current_device_smem_optin(&smem));
    GEMMT_RETURN_IF_ERROR(current_device_l2_bytes(&l2));
    const bool fits = n * static_cast<int64_t>(sizeof(T)) <= static_cast<int64_t>(l2) / 2;
    if (!coop || smem < kSmem || !fits || !is_aligned<16>(x)) return cudaSuccess;
    GEMMT_RETURN_IF_ERROR(current_device_sm_count(&sms));
    GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(kSmem));
    GEMMT_RETURN_IF_ERROR(resident_blocks_per_sm<kernel>(kFusedThreads, &per_sm, kSmem));
    auto* sync = static_cast<FusedSync*>(workspace);
    GEMMT_RETURN_IF_ERROR(cudaMemsetAsync(sync, 0, sizeof(FusedSync), stream));
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned int>(sms));
    config.blockDim = dim3(kFusedThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    const cudaError_t err = cudaLaunchKernelEx(&config, kernel, x, n, vec_out, sync, q, scale);
    if (err == cudaErrorCooperativeLaunchTooLarge) {
      // Fewer SMs than the device reports are ours (a limited MPS share): the two kernels.
      (void)cudaGetLastError();
      return cudaSuccess;
    }
    *launched = err == cudaSuccess;
    return err;
  }
}

// ---- 128x128 tiles: block_128x128, and every granularity with the transpose ----

enum class TileMode : int {
  kWhole,     // one scale per tile (block_128x128)
  kRowsCols,  // q per 1x128 row segment, qt per 128x1 column segment (block + transpose)
  kGlobal,    // the tensor amax from the workspace (tensor + transpose)
  kAmaxOnly,  // row and column amaxes into the workspace, no output (row + transpose, pass 1)
  kFromAmax,  // q per row, qt per column, amaxes from the workspace (row + transpose, pass 2)
};

constexpr int kTileThreads = 512;
constexpr int kTileRowsPerThread = kGroup * kGroup / (kTileThreads * kChunk);  // 4
constexpr int kTileWarps = kTileThreads / 32;

struct TileParams {
  const void* x;
  int64_t rows, cols, ld;
  bool vec_in, vec_out, vec_out_t, vec16_out_t;
  uint8_t* q;
  float* scale;
  uint8_t* qt;
  float* scale_t;
  unsigned int* row_amax;  // kAmaxOnly, kFromAmax: rows entries; kGlobal: the tensor amax
  unsigned int* col_amax;  // kAmaxOnly, kFromAmax: cols entries
};

// CTAs per SM the tile kernel is built for. Held in x's own bits, a tile of a 2-byte x leaves
// room for a third CTA (40 registers a thread) where one multiplier covers the tile or no
// output is written; more CTAs overlap one tile's reduction and stores with another's loads.
// The per-row and per-column casts keep 8 more multipliers and spill at 40.
template <typename T, TileMode kMode>
constexpr int tile_min_blocks() {
  return sizeof(T) == 2 && (kMode == TileMode::kWhole || kMode == TileMode::kGlobal ||
                            kMode == TileMode::kAmaxOnly)
             ? 3
             : 2;
}

// Per thread, the finite maxes of its 4 rows of 8 and of its 8 columns of 4, from the bits
// as max_mag_chunk does (for a 2-byte x a word's max holds two columns).
template <typename T>
__device__ __forceinline__ void tile_amax(const Chunk<T> (&raw)[kTileRowsPerThread],
                                          float (&rmax)[kTileRowsPerThread],
                                          float (&cmax)[kChunk]) {
  constexpr int kWords = Chunk<T>::kWords;
  unsigned int col[kWords];
  unsigned int all = 0u;
#pragma unroll
  for (int i = 0; i < kTileRowsPerThread; ++i) {
    unsigned int r = 0u;
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      const unsigned int a = mag_word<T>(raw[i].u[k]);
      r = max_word<T>(r, a);
      col[k] = i == 0 ? a : max_word<T>(col[k], a);
    }
    r = fold_word<T>(r);
    rmax[i] = mag_value<T>(r);
    all = r > all ? r : all;
  }
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    if constexpr (sizeof(T) == 2) {
      cmax[2 * k] = mag_value<T>(col[k] & 0xffffu);
      cmax[2 * k + 1] = mag_value<T>(col[k] >> 16);
    } else {
      cmax[k] = mag_value<T>(col[k]);
    }
  }
  if (all >= inf_bits<T>()) {
    // An inf or a NaN among the 32 elements: the finite ones, element by element.
#pragma unroll
    for (int e = 0; e < kChunk; ++e) cmax[e] = 0.0f;
#pragma unroll
    for (int i = 0; i < kTileRowsPerThread; ++i) {
      rmax[i] = 0.0f;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const float a = finite_mag(element(raw[i], e));
        rmax[i] = fmaxf(rmax[i], a);
        cmax[e] = fmaxf(cmax[e], a);
      }
    }
  }
}

// Where word w (rows 4 w .. 4 w + 3 of the tile) of qt's row j sits in qt_tile[j]: XOR-ed
// with bits of j, so that the 32 lanes of a warp storing one word each (16 columns 8 apart,
// two values of w) hit 32 different banks, and the 16-byte reads of a row stay whole.
__device__ __forceinline__ int qt_swizzle(int j) {
  return ((j >> 3) & 15) << 1;
}

// Thread (ty, tx) of the 32 x 16 grid holds rows 4 ty .. 4 ty + 3 and columns 8 tx .. 8 tx + 7
// of the tile: for each of its 8 columns, 4 consecutive rows, one 32-bit word of qt.
template <typename T, TileMode kMode, bool kTranspose, bool kE5M2>
__global__ void __launch_bounds__(kTileThreads, tile_min_blocks<T, kMode>())
    quantize_tiles_kernel(TileParams p) {
  constexpr bool kSameScale = kMode == TileMode::kWhole || kMode == TileMode::kGlobal;
  constexpr bool kPerRowCol = kMode == TileMode::kRowsCols || kMode == TileMode::kFromAmax;
  constexpr bool kTileReduce = kMode == TileMode::kRowsCols || kMode == TileMode::kAmaxOnly;
  __shared__ float col_part[kTileWarps][kGroup];
  __shared__ float row_val[kGroup];  // row amax, then row multiplier
  __shared__ float col_val[kGroup];  // column amax, then column multiplier
  __shared__ float tile_part[kTileWarps];
  __shared__ __align__(16) unsigned int qt_tile[kTranspose ? kGroup : 1][kGroup / 4];

  const T* __restrict__ x = static_cast<const T*>(p.x);
  const int tx = threadIdx.x & 15;
  const int ty = threadIdx.x >> 4;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const float top = fp8_top<kE5M2>();
  constexpr bool e5m2 = kE5M2;
  const int64_t row_tiles = ceil_div(p.rows, kGroup);
  const int64_t col_tiles = ceil_div(p.cols, kGroup);

  float global_mult = 0.0f;
  if constexpr (kMode == TileMode::kGlobal) {
    global_mult = scale_mult(__uint_as_float(p.row_amax[0]), top);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      const float s = dequant_scale(global_mult);
      p.scale[0] = s;
      p.scale_t[0] = s;
    }
  }

  // The second pass over x (the tensor amax, the row and column amaxes came first) walks the
  // tiles backwards, starting where the first pass ended: on what L2 still holds of x.
  constexpr bool kBackwards = kMode == TileMode::kGlobal || kMode == TileMode::kFromAmax;
  const int64_t tiles = row_tiles * col_tiles;
  for (int64_t wf = blockIdx.x; wf < tiles; wf += gridDim.x) {
    const int64_t w = kBackwards ? tiles - 1 - wf : wf;
    const int64_t rb = w / col_tiles;
    const int64_t kb = w - rb * col_tiles;
    const int64_t r0 = rb * kGroup;
    const int64_t c0 = kb * kGroup;
    const int64_t c = c0 + tx * kChunk;
    const int ncol = chunk_len(p.cols, c);

    Chunk<T> raw[kTileRowsPerThread];
    float rmax[kTileRowsPerThread];
    float cmax[kChunk];  // over the thread's 4 rows
#pragma unroll
    for (int i = 0; i < kTileRowsPerThread; ++i) {
      const int64_t r = r0 + ty * kTileRowsPerThread + i;
      const int n = r < p.rows ? ncol : 0;
      if (n > 0) {
        load_chunk(x + r * p.ld + c, n, p.vec_in, raw[i]);
      } else {
        zero_chunk(raw[i]);
      }
    }
    if constexpr (kTileReduce) tile_amax(raw, rmax, cmax);

    float mult = global_mult;
    if constexpr (kMode == TileMode::kWhole) {
      float m = max_mag_chunks(raw);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      if (lane == 0) tile_part[warp] = m;
      __syncthreads();
      m = tile_part[0];
#pragma unroll
      for (int i = 1; i < kTileWarps; ++i) m = fmaxf(m, tile_part[i]);
      mult = scale_mult(m, top);
      if (threadIdx.x == 0) {
        const float s = dequant_scale(mult);
        p.scale[rb * col_tiles + kb] = s;
        if constexpr (kTranspose) p.scale_t[kb * row_tiles + rb] = s;
      }
    }
    if constexpr (kTileReduce) {
      // Rows: the 16 lanes of a half-warp share them. Columns: the warp's two halves, then
      // the 16 warps through shared memory.
#pragma unroll
      for (int i = 0; i < kTileRowsPerThread; ++i) {
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) {
          rmax[i] = fmaxf(rmax[i], __shfl_xor_sync(0xffffffffu, rmax[i], off));
        }
      }
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        cmax[e] = fmaxf(cmax[e], __shfl_xor_sync(0xffffffffu, cmax[e], 16));
        if (lane < 16) col_part[warp][tx * kChunk + e] = cmax[e];
      }
      if (tx == 0) {
#pragma unroll
        for (int i = 0; i < kTileRowsPerThread; ++i) row_val[ty * kTileRowsPerThread + i] = rmax[i];
      }
      __syncthreads();
      if (threadIdx.x < kGroup) {
        float m = col_part[0][threadIdx.x];
        for (int i = 1; i < kTileWarps; ++i) m = fmaxf(m, col_part[i][threadIdx.x]);
        col_val[threadIdx.x] = m;
      }
      __syncthreads();
    }
    if constexpr (kMode == TileMode::kAmaxOnly) {
      if (threadIdx.x < kGroup) {
        const int64_t r = r0 + threadIdx.x;
        if (r < p.rows) atomic_max_nonneg(p.row_amax + r, row_val[threadIdx.x]);
      } else if (threadIdx.x < 2 * kGroup) {
        const int64_t cc = c0 + threadIdx.x - kGroup;
        if (cc < p.cols) atomic_max_nonneg(p.col_amax + cc, col_val[threadIdx.x - kGroup]);
      }
    }
    if constexpr (kPerRowCol) {
      // Multipliers of the tile's 128 rows and 128 columns, one division each, and their
      // scales: a row's by the tile that owns it, a column's likewise.
      if (threadIdx.x < kGroup) {
        const int i = threadIdx.x;
        const int64_t r = r0 + i;
        float amax = 0.0f;
        if constexpr (kMode == TileMode::kRowsCols) amax = row_val[i];
        if constexpr (kMode == TileMode::kFromAmax) {
          amax = r < p.rows ? __uint_as_float(p.row_amax[r]) : 0.0f;
        }
        const float m = scale_mult(amax, top);
        row_val[i] = m;
        if (r < p.rows) {
          if constexpr (kMode == TileMode::kRowsCols) p.scale[r + kb * p.rows] = dequant_scale(m);
          if constexpr (kMode == TileMode::kFromAmax) {
            if (kb == 0) p.scale[r] = dequant_scale(m);
          }
        }
      } else if (threadIdx.x < 2 * kGroup) {
        const int j = threadIdx.x - kGroup;
        const int64_t cc = c0 + j;
        float amax = 0.0f;
        if constexpr (kMode == TileMode::kRowsCols) amax = col_val[j];
        if constexpr (kMode == TileMode::kFromAmax) {
          amax = cc < p.cols ? __uint_as_float(p.col_amax[cc]) : 0.0f;
        }
        const float m = scale_mult(amax, top);
        col_val[j] = m;
        if (cc < p.cols) {
          if constexpr (kMode == TileMode::kRowsCols) {
            p.scale_t[cc + rb * p.cols] = dequant_scale(m);
          }
          if constexpr (kMode == TileMode::kFromAmax) {
            if (rb == 0) p.scale_t[cc] = dequant_scale(m);
          }
        }
      }
      __syncthreads();
    }

    if constexpr (kMode != TileMode::kAmaxOnly) {
      float col_mult[kChunk];
      if constexpr (kPerRowCol) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) col_mult[e] = col_val[tx * kChunk + e];
      }
      uint2 bt[kTileRowsPerThread];  // the bytes of qt, still in q's orientation
      // A 2-byte x's shared-scale tile is cast whole before any of it is stored: built for
      // three CTAs per SM (40 registers), the interleaved order spilled.
      constexpr bool kCastFirst = kSameScale && sizeof(T) == 2;
      if constexpr (kCastFirst) {
#pragma unroll
        for (int i = 0; i < kTileRowsPerThread; ++i) bt[i] = quantize_chunk(raw[i], mult, e5m2);
      }
#pragma unroll
      for (int i = 0; i < kTileRowsPerThread; ++i) {
        const int row = ty * kTileRowsPerThread + i;
        const int64_t r = r0 + row;
        const float m = kSameScale ? mult : row_val[row];
        const uint2 b = kCastFirst ? bt[i] : quantize_chunk(raw[i], m, e5m2);
        const int n = r < p.rows ? ncol : 0;
        if (n > 0) store8(p.q + r * p.cols + c, n, p.vec_out, b);
        if constexpr (kTranspose) {
          if constexpr (kSameScale) {
            bt[i] = b;
          } else {
            bt[i] = quantize_chunk(raw[i], col_mult, e5m2);
          }
        }
      }
      if constexpr (kTranspose) {
        // A 4 x 4 byte transpose of each half of bt: word e holds byte e of bt[0..3], the
        // column's 4 rows in order.
        unsigned int word[kChunk];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned int r0w = h == 0 ? bt[0].x : bt[0].y;
          const unsigned int r1w = h == 0 ? bt[1].x : bt[1].y;
          const unsigned int r2w = h == 0 ? bt[2].x : bt[2].y;
          const unsigned int r3w = h == 0 ? bt[3].x : bt[3].y;
          const unsigned int lo01 = __byte_perm(r0w, r1w, 0x5140);  // a0 b0 a1 b1
          const unsigned int hi01 = __byte_perm(r0w, r1w, 0x7362);  // a2 b2 a3 b3
          const unsigned int lo23 = __byte_perm(r2w, r3w, 0x5140);
          const unsigned int hi23 = __byte_perm(r2w, r3w, 0x7362);
          word[4 * h + 0] = __byte_perm(lo01, lo23, 0x5410);
          word[4 * h + 1] = __byte_perm(lo01, lo23, 0x7632);
          word[4 * h + 2] = __byte_perm(hi01, hi23, 0x5410);
          word[4 * h + 3] = __byte_perm(hi01, hi23, 0x7632);
        }
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          const int j = tx * kChunk + e;
          qt_tile[j][ty ^ qt_swizzle(j)] = word[e];
        }
        __syncthreads();
        // Eight lanes per row of qt (a column of the tile), 16 bytes (16 rows of x) each: a
        // warp writes 4 rows of qt at once, the CTA 64.
        const int piece = lane & 7;
        const int64_t rr = r0 + piece * 16;
        for (int j = warp * 4 + (lane >> 3); j < kGroup; j += kTileWarps * 4) {
          const int64_t cc = c0 + j;
          if (cc >= p.cols) continue;
          const int sw = qt_swizzle(j);
          uint4 got = *reinterpret_cast<const uint4*>(&qt_tile[j][4 * (piece ^ (sw >> 2))]);
          if (sw & 2) got = make_uint4(got.z, got.w, got.x, got.y);
          uint8_t* dst = p.qt + cc * p.rows + rr;
          if (p.vec16_out_t && rr + 16 <= p.rows) {
            *reinterpret_cast<uint4*>(dst) = got;
          } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const unsigned int gw = k == 0 ? got.x : k == 1 ? got.y : k == 2 ? got.z : got.w;
              const int64_t rk = rr + 4 * k;
              if (p.vec_out_t && rk + 4 <= p.rows) {
                *reinterpret_cast<unsigned int*>(dst + 4 * k) = gw;
              } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  if (rk + i < p.rows) dst[4 * k + i] = static_cast<uint8_t>(gw >> (8 * i));
                }
              }
            }
          }
        }
      }
    }
    __syncthreads();  // the shared arrays are filled again by the next tile
  }
}

// ---- empty inputs: the scales of amax 0 ----

__global__ void fill_empty_scales_kernel(float* scale, int64_t n, float* scale_t, int64_t n_t,
                                         Fp8Format format) {
  const float s = dequant_scale(scale_mult(0.0f, fp8_top(format)));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < (n > n_t ? n : n_t); i += stride) {
    if (i < n) scale[i] = s;
    if (i < n_t) scale_t[i] = s;
  }
}

// ---- launchers ----

constexpr size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

template <TileMode kMode, bool kTranspose, typename T, bool kE5M2>
cudaError_t launch_tiles(const TileParams& p, cudaStream_t stream) {
  const int64_t tiles = ceil_div(p.rows, kGroup) * ceil_div(p.cols, kGroup);
  quantize_tiles_kernel<T, kMode, kTranspose, kE5M2>
      <<<grid_1d(tiles, 1), kTileThreads, 0, stream>>>(p);
  GEMMT_RETURN_LAUNCH_ERROR();
}

// Rows of up to 16384 elements stay in registers: 8 per thread per iteration, teams of up to
// 512 threads, up to 4 iterations.
template <typename T, bool kE5M2>
cudaError_t launch_rows(const Fp8QuantizeArgs& a, int64_t ld, bool vec_in, bool vec_out,
                        cudaStream_t stream) {
  const int64_t chunks = ceil_div(a.cols, kChunk);
  // The narrowest team whose threads hold at most 4 chunks (64 bytes of a 2-byte x in flight
  // each): rows of up to 16384 elements stay in registers, longer ones are read twice.
  int team = 1;
  while (team < 512 && team * 4 < chunks) team *= 2;
  const int iters = team * 4 >= chunks ? static_cast<int>(ceil_div(chunks, team)) : 0;
  int team_log2 = 0;
  while ((1 << team_log2) < team) ++team_log2;
  // A team wider than a warp is the whole CTA (team_mult's barriers); narrower ones share one.
  const int threads = team > 32 ? team : 256;
  const unsigned int grid = grid_1d(a.rows, threads / team);
  const T* x = static_cast<const T*>(a.x);
  auto run = [&](auto kernel) {
    kernel<<<grid, threads, 0, stream>>>(x, a.rows, a.cols, ld, vec_in, vec_out, team_log2, a.q,
                                         a.scale);
  };
  switch (iters) {
    case 1:
      run(quantize_rows_kernel<T, 1, kE5M2>);
      break;
    case 2:
      run(quantize_rows_kernel<T, 2, kE5M2>);
      break;
    case 3:
      run(quantize_rows_kernel<T, 3, kE5M2>);
      break;
    case 4:
      run(quantize_rows_kernel<T, 4, kE5M2>);
      break;
    default:
      run(quantize_rows_kernel<T, 0, kE5M2>);
      break;
  }
  GEMMT_RETURN_LAUNCH_ERROR();
}

// CTAs of kKernel (kStreamThreads threads each) resident per SM, asked of the runtime once
// per device.
template <auto kKernel>
cudaError_t stream_ctas_per_sm(int* ctas) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  return cached_per_device(cache, ctas, [](int /*device*/, int* n) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, kKernel, kStreamThreads, 0);
  });
}

// A tensor kernel's 2-D grid, x over a row's chunks and y over the rows, every thread
// looping: as many CTAs as are resident at once on the whole GPU, no more. Every CTA has the
// same share of x, so a CTA left for a second wave would double the time of its share.
template <auto kKernel>
cudaError_t resident_stream_grid(int64_t rows, int64_t cols, dim3* grid) {
  int sms = 0, per_sm = 0;
  GEMMT_RETURN_IF_ERROR(current_device_sm_count(&sms));
  GEMMT_RETURN_IF_ERROR(stream_ctas_per_sm<kKernel>(&per_sm));
  const int64_t target = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  const int64_t gx = grid_1d(ceil_div(ceil_div(cols, kChunk), kStreamThreads), 1, target);
  int64_t gy = target / gx;
  if (gy > rows) gy = rows;
  if (gy > 65535) gy = 65535;
  if (gy < 1) gy = 1;
  *grid = dim3(static_cast<unsigned int>(gx), static_cast<unsigned int>(gy));
  return cudaSuccess;
}

template <typename T, bool kE5M2>
cudaError_t run_typed(const Fp8QuantizeArgs& a, cudaStream_t stream) {
  const bool transpose = a.qt != nullptr;
  const T* x = static_cast<const T*>(a.x);
  const int64_t ld = a.rows > 1 ? a.ld : a.cols;
  const bool vec_in = is_aligned<16>(x) && (a.rows == 1 || (ld * sizeof(T)) % 16 == 0);
  const bool vec_out = is_aligned<8>(a.q) && (a.rows == 1 || a.cols % kChunk == 0);
  const bool vec_out_t = transpose && is_aligned<4>(a.qt) && (a.cols == 1 || a.rows % 4 == 0);
  const bool vec16_out_t = transpose && is_aligned<16>(a.qt) && (a.cols == 1 || a.rows % 16 == 0);

  TileParams tp{};
  tp.x = x;
  tp.rows = a.rows, tp.cols = a.cols, tp.ld = ld;
  tp.vec_in = vec_in, tp.vec_out = vec_out, tp.vec_out_t = vec_out_t;
  tp.vec16_out_t = vec16_out_t;
  tp.q = a.q, tp.scale = a.scale, tp.qt = a.qt, tp.scale_t = a.scale_t;

  switch (a.granularity) {
    case Fp8Granularity::kTensor: {
      if (!transpose && ld == a.cols) {
        bool launched = false;
        GEMMT_RETURN_IF_ERROR((launch_tensor_fused<T, kE5M2>(
            x, a.rows * a.cols, is_aligned<8>(a.q), a.workspace, a.q, a.scale, stream, &launched)));
        if (launched) return cudaSuccess;
      }
      auto* amax = static_cast<unsigned int*>(a.workspace);
      GEMMT_RETURN_IF_ERROR(cudaMemsetAsync(amax, 0, sizeof(unsigned int), stream));
      // A contiguous x is one long row: no row loop, and the 2-D grid stays small.
      const bool flat = ld == a.cols;
      const int64_t rows = flat ? 1 : a.rows;
      const int64_t cols = flat ? a.rows * a.cols : a.cols;
      const int64_t fld = flat ? cols : ld;
      const bool fvec_in = is_aligned<16>(x) && (rows == 1 || (fld * sizeof(T)) % 16 == 0);
      const bool fvec_out = is_aligned<8>(a.q) && (rows == 1 || cols % kChunk == 0);
      dim3 grid;
      GEMMT_RETURN_IF_ERROR(resident_stream_grid<tensor_amax_kernel<T>>(rows, cols, &grid));
      tensor_amax_kernel<T><<<grid, kStreamThreads, 0, stream>>>(x, rows, cols, fld, fvec_in, amax);
      GEMMT_RETURN_IF_ERROR(cudaGetLastError());
      if (transpose) {
        tp.row_amax = amax;
        return launch_tiles<TileMode::kGlobal, true, T, kE5M2>(tp, stream);
      }
      GEMMT_RETURN_IF_ERROR(
          (resident_stream_grid<tensor_cast_kernel<T, kE5M2>>(rows, cols, &grid)));
      tensor_cast_kernel<T, kE5M2><<<grid, kStreamThreads, 0, stream>>>(
          x, rows, cols, fld, fvec_in, fvec_out, amax, a.q, a.scale);
      GEMMT_RETURN_LAUNCH_ERROR();
    }
    case Fp8Granularity::kRow: {
      if (!transpose) return launch_rows<T, kE5M2>(a, ld, vec_in, vec_out, stream);
      auto* ws = static_cast<unsigned char*>(a.workspace);
      tp.row_amax = reinterpret_cast<unsigned int*>(ws);
      tp.col_amax = reinterpret_cast<unsigned int*>(ws + align16(a.rows * sizeof(unsigned int)));
      GEMMT_RETURN_IF_ERROR(cudaMemsetAsync(a.workspace, 0, a.workspace_bytes, stream));
      GEMMT_RETURN_IF_ERROR((launch_tiles<TileMode::kAmaxOnly, false, T, false>(tp, stream)));
      return launch_tiles<TileMode::kFromAmax, true, T, kE5M2>(tp, stream);
    }
    case Fp8Granularity::kBlock: {
      if (transpose) return launch_tiles<TileMode::kRowsCols, true, T, kE5M2>(tp, stream);
      const int64_t row_tiles = ceil_div(a.rows, kBlockRows);
      const dim3 grid(static_cast<unsigned int>(ceil_div(ceil_div(a.cols, kGroup), kBlockItems)),
                      static_cast<unsigned int>(row_tiles < 65535 ? row_tiles : 65535));
      quantize_blocks_kernel<T, kE5M2><<<grid, kBlockThreads, 0, stream>>>(
          x, a.rows, a.cols, ld, vec_in, vec_out, a.q, a.scale);
      GEMMT_RETURN_LAUNCH_ERROR();
    }
    case Fp8Granularity::kBlock128x128:
      if (transpose) return launch_tiles<TileMode::kWhole, true, T, kE5M2>(tp, stream);
      return launch_tiles<TileMode::kWhole, false, T, kE5M2>(tp, stream);
  }
  return cudaErrorInvalidValue;
}

bool valid_granularity(Fp8Granularity g) {
  return g == Fp8Granularity::kTensor || g == Fp8Granularity::kRow || g == Fp8Granularity::kBlock ||
         g == Fp8Granularity::kBlock128x128;
}

}  // namespace

size_t quantize_fp8_workspace_bytes(Fp8Granularity granularity, int64_t rows, int64_t cols,
                                    bool with_transpose) {
  if (granularity == Fp8Granularity::kTensor) return 16;
  if (granularity == Fp8Granularity::kRow && with_transpose && rows > 0 && cols > 0) {
    return align16(static_cast<size_t>(rows) * sizeof(unsigned int)) +
           align16(static_cast<size_t>(cols) * sizeof(unsigned int));
  }
  return 0;
}

cudaError_t quantize_fp8_run(const Fp8QuantizeArgs& a, cudaStream_t stream) {
  // An empty tensor may have a null data pointer: pointers are checked where data exists.
  const bool transpose = a.qt != nullptr || a.scale_t != nullptr;
  if (a.rows < 0 || a.cols < 0 || !valid_granularity(a.granularity) ||
      (a.format != Fp8Format::kE4M3 && a.format != Fp8Format::kE5M2)) {
    return cudaErrorInvalidValue;
  }
  if (a.rows == 0 || a.cols == 0) {
    int64_t n = 0, n_t = 0;
    if (a.granularity == Fp8Granularity::kTensor) {
      n = 1, n_t = transpose ? 1 : 0;
    } else if (a.granularity == Fp8Granularity::kRow) {
      n = a.rows, n_t = transpose ? a.cols : 0;
    }
    if ((n > 0 && a.scale == nullptr) || (n_t > 0 && a.scale_t == nullptr)) {
      return cudaErrorInvalidValue;
    }
    const int64_t most = n > n_t ? n : n_t;
    if (most == 0) return cudaSuccess;
    fill_empty_scales_kernel<<<grid_1d(most, 256), 256, 0, stream>>>(a.scale, n, a.scale_t, n_t,
                                                                     a.format);
    GEMMT_RETURN_LAUNCH_ERROR();
  }
  if (a.x == nullptr || a.q == nullptr || a.scale == nullptr ||
      (transpose && (a.qt == nullptr || a.scale_t == nullptr)) || (a.rows > 1 && a.ld < a.cols) ||
      a.workspace_bytes < quantize_fp8_workspace_bytes(a.granularity, a.rows, a.cols, transpose) ||
      (a.workspace_bytes > 0 && a.workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return dispatch_float_or_double_dtype(a.x_dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return a.format == Fp8Format::kE5M2 ? run_typed<T, true>(a, stream)
                                        : run_typed<T, false>(a, stream);
  });
}

}  // namespace gemmt
