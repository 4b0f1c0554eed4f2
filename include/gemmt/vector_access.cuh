// 16-byte (and narrower) register packs for vectorised global-memory access.
//
// A Pack<T, N> is N elements of T held in registers and moved with a single load or store
// instruction of sizeof(T) * N bytes (4, 8 or 16). The caller must guarantee that the
// address is aligned to that size: check base pointers once on the host with is_aligned()
// and keep every offset a multiple of N elements.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

#include "gemmt/arith.h"

namespace gemmt {

// The widest access a thread can issue as one instruction (LDG.128 / STG.128).
constexpr int kVectorBytes = 16;

// Elements of T that fill one 16-byte access.
template <typename T>
constexpr int kPackElems = kVectorBytes / static_cast<int>(sizeof(T));

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

namespace detail {
// A plain integer vector of the pack's width: loads and stores go through it so that the
// compiler sees a single native access whatever T is (a struct of __half would otherwise be
// free to be split into narrower accesses).
template <int kBytes>
struct RawVector;
template <>
struct RawVector<4> {
  using type = unsigned int;
};
template <>
struct RawVector<8> {
  using type = uint2;
};
template <>
struct RawVector<16> {
  using type = uint4;
};
}  // namespace detail

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  using Raw = typename detail::RawVector<sizeof(T) * N>::type;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  Pack<T, N> out;
  // A bit-cast between registers; memcpy keeps it free of aliasing-rule trouble and
  // compiles to nothing.
  std::memcpy(&out, &raw, sizeof(raw));
  return out;
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& pack) {
  using Raw = typename detail::RawVector<sizeof(T) * N>::type;
  Raw raw;
  std::memcpy(&raw, &pack, sizeof(raw));
  *reinterpret_cast<Raw*>(p) = raw;
}

// V elements as one access: a pack where V > 1, one element (V == 1) for data whose rows are
// not aligned for packs, so that one kernel body serves both.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_elems(const T* p) {
  if constexpr (V == 1) {
    Pack<T, 1> out;
    out.v[0] = *p;
    return out;
  } else {
    return load_pack<T, V>(p);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_elems(T* p, const Pack<T, V>& x) {
  if constexpr (V == 1) {
    *p = x.v[0];
  } else {
    store_pack<T, V>(p, x);
  }
}

}  // namespace gemmt
