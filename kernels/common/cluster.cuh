// Thread-block cluster primitives (sm_90): a CTA's rank, a barrier of every thread of the
// cluster, and a read of a peer CTA's shared memory. Callers launch clusters only on sm_90, so
// other targets never reach them (and compile them out).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gemmt {
namespace cluster {

__device__ __forceinline__ uint32_t rank() {
  uint32_t r = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}

// Every thread of every CTA of the cluster arrives (release) and waits (acquire): also a
// barrier of the CTA's own threads.
__device__ __forceinline__ void barrier() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
#endif
}

// Four floats at the same shared-memory offset (16-byte aligned) in CTA `peer` of the cluster.
__device__ __forceinline__ float4 load_peer(const float* local, uint32_t peer) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if __CUDA_ARCH__ >= 900
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(peer));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#else
  (void)local;
  (void)peer;
#endif
  return v;
}

}  // namespace cluster
}  // namespace gemmt
