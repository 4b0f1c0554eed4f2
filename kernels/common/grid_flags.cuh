// Flags in global memory that CTAs of one grid publish to and await (stream-k partial sums, the
// grid-wide barrier of the one-kernel tensorwise quantisation). Private to kernels/.
#pragma once

#include <cuda_runtime.h>

namespace gemmt {

__device__ __forceinline__ void st_release_gpu(int* flag, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}

__device__ __forceinline__ int ld_acquire_gpu(const int* flag) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

}  // namespace gemmt
