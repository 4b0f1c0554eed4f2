// cp.async wrappers shared by the cp.async-pipelined GEMM kernels (kernels/gemm_simt.cu
// through kernels/simt/tiles.cuh, kernels/gemm_sm80_mma.cu) and the grouped Hopper GEMM's
// block scales (sm90/grouped_kernel.cuh). Private to kernels/.
//
// On sm_80+ the copies are asynchronous global -> shared; the fallback for older targets is
// a synchronous copy, which the same wait/__syncthreads protocol keeps correct.
//
// Edge vectors never read a byte outside the operand: rather than a 16-byte cp.async with a
// short src-size (whose 16-byte access still spans the bytes past the operand's end), only
// whole in-range 4-byte words are copied asynchronously and everything else is written with
// ordinary shared stores. Those need no extra synchronisation: they write the stage where its
// copies are issued, so the barrier that freed the stage already orders them after every read
// of its previous tile, and the wait_group + __syncthreads that publishes the stage publishes
// them too. A word gets either a copy or a store, never both, so the two cannot race.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/shared_memory.cuh"

namespace gemmt {

// 16 in-range bytes, bypassing L1 (each byte is used once per block). dst and src 16-byte
// aligned.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst),
               "l"(__cvta_generic_to_global(src))
               : "memory");
#else
  const uint4 v = *static_cast<const uint4*>(src);
  st_shared_v4(dst, v.x, v.y, v.z, v.w);
#endif
}

// As cp_async_16, and the L2 also fetches the rest of the 256-byte block around src: for
// tiles that read 128 bytes of each of many rows (K-major operands), the next k-tile's bytes
// of every row arrive with this one's, in one DRAM access instead of two.
__device__ __forceinline__ void cp_async_16_l2_256(uint32_t dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst),
               "l"(__cvta_generic_to_global(src))
               : "memory");
#else
  cp_async_16(dst, src);
#endif
}

// 8 in-range bytes (cp.async.cg has no 8-byte form). For 8-byte elements whose rows break
// 16-byte alignment: dst and src 8-byte aligned.
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst),
               "l"(__cvta_generic_to_global(src))
               : "memory");
#else
  const uint2 v = *static_cast<const uint2*>(src);
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(dst), "r"(v.x), "r"(v.y) : "memory");
#endif
}

// 4 in-range bytes through L1: the transposing loaders fetch four neighbouring floats of one
// row with four of these, so the second to fourth hit the line the first brought in.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst),
               "l"(__cvta_generic_to_global(src))
               : "memory");
#else
  st_shared_b32(dst, *static_cast<const uint32_t*>(src));
#endif
}

// An edge vector, 0 < src_bytes < 16: whole words asynchronously, the rest by hand, where a
// word the edge cuts (a 16-bit element followed by the end of a row) is read byte by byte.
// Out of line: inlined into every unrolled copy loop, this path that only edge vectors take
// costs the mma.sync kernel up to 50 registers.
inline __device__ __noinline__ void cp_async_16_partial(uint32_t dst, const void* src,
                                                        int src_bytes) {
  const unsigned char* s = static_cast<const unsigned char*>(src);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t d = dst + 4 * w;
    const int b = src_bytes - 4 * w;
    if (b >= 4) {
      cp_async_4(d, s + 4 * w);
    } else {
      uint32_t v = 0;
#pragma unroll
      for (int i = 0; i < 3; ++i)
        if (i < b) v |= static_cast<uint32_t>(s[4 * w + i]) << (8 * i);
      st_shared_b32(d, v);
    }
  }
}

// The 16 bytes at dst get the first src_bytes bytes at src followed by zeros. Full vectors
// (src_bytes >= 16) take one 16-byte copy; src is not dereferenced when src_bytes <= 0.
// src and dst 16-byte aligned.
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, int src_bytes) {
  if (src_bytes >= 16)
    cp_async_16(dst, src);
  else if (src_bytes <= 0)
    st_shared_v4(dst, 0u, 0u, 0u, 0u);
  else
    cp_async_16_partial(dst, src, src_bytes);
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace gemmt
