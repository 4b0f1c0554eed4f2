// PTX wrappers of the Hopper GEMM: thread-block clusters, mbarriers, TMA loads and stores,
// bulk-group waits, register reallocation (setmaxnreg), named barriers, and wgmma (shared-
// memory descriptors, fences, the m64n256 ... m64n64 instructions, register-A tf32 and fp16
// forms). Usable by any sm_90a kernel.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/grid_flags.cuh"
#include "sm90/config.cuh"

namespace gemmt {
namespace {

#if defined(GEMMT_SM90_DEVICE_CODE)

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::
          : "memory");
}

// True on one lane of the (fully active) warp, chosen by the hardware; the compiler knows
// the rest of the warp runs the same path around it.
__device__ __forceinline__ bool elect_one() {
  uint32_t elected = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "elect.sync _|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(elected));
  return elected != 0;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void fence_barrier_init() {
  // Makes the initialised barriers visible to the TMA unit and to the peer CTA.
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive_local(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// The arrival on a barrier once every cp.async (common/cp_async.cuh) this thread issued
// before it has landed. The arrival counts against the barrier's expected count (.noinc), so
// the barrier is initialised with one more for each thread that copies.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Arrives on the barrier at the same offset in CTA `cta` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(cta));
  // Default (CTA-scope) release: the only thing ordered is this warp's finished wgmma reads
  // of the stage; a cluster-scope release would cost a GPU-wide MEMBAR per stage.
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// One bounded wait of the hardware's (try_wait returns after a time slice even when the phase
// has not completed): true when the phase with this parity is complete.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

__device__ __forceinline__ void prefetch_tmap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                         int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// A box of a 3-D map (the third coordinate picks a matrix of a batch or a group).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The same for a 3-D map, written to every CTA of `mask` (see tma_load_multicast).
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map,
                                                      uint32_t bar, int c0, int c1, int c2,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}

// Same box written to the same offset (and signalled on the same barrier offset) in every
// CTA of `mask`.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map,
                                                   uint32_t bar, int c0, int c1, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}

// Asks for the line holding p to be brought into L1, without a register to receive it.
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Generic-proxy writes to shared memory become visible to a later TMA read of it.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void tma_store(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}

// A box of a 3-D map written from shared memory (the third coordinate picks the matrix).
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::
          "l"(reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(src)
      : "memory");
}

// Four 8 x 8 matrices of 16-bit values from the accumulator fragment layout (a thread holds
// row lane / 4, columns 2 (lane % 4) and the next, of each): lanes 8i..8i+7 address the rows
// of matrix i.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until earlier bulk stores of this thread have finished reading shared memory.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Waits until earlier bulk stores of this thread are complete in global memory.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Keeps the compiler from moving accumulator reads or writes across the asynchronous
// wgmma window: the asm claims to read and rewrite every register.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor, 128B swizzle. K-major: sbo = 1024 (next 8-row group),
// lbo unused (the 32-byte K slice never leaves its 128-byte row). MN-major: lbo = distance
// between 64-element M/N column blocks, sbo = 1024 (next 8 rows of K).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (uint64_t{1} << 62);
}

#define GEMMT_ACC_AT(i)                                                                           \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define GEMMT_ACC128                                                                              \
  GEMMT_ACC_AT(0), GEMMT_ACC_AT(8), GEMMT_ACC_AT(16), GEMMT_ACC_AT(24), GEMMT_ACC_AT(32),         \
      GEMMT_ACC_AT(40), GEMMT_ACC_AT(48), GEMMT_ACC_AT(56), GEMMT_ACC_AT(64), GEMMT_ACC_AT(72),   \
      GEMMT_ACC_AT(80), GEMMT_ACC_AT(88), GEMMT_ACC_AT(96), GEMMT_ACC_AT(104), GEMMT_ACC_AT(112), \
      GEMMT_ACC_AT(120)
#define GEMMT_D128                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "   \
  "%127}"

// One wgmma reading both operands from shared memory: 16-bit types take the two transpose
// flags (MN-major operands); tf32 reads K-major operands only and takes none. P, A, B, TA and
// TB are the PTX operand numbers of the predicate input and the descriptors / flags.
#define GEMMT_WGMMA_16(INSTR, DREGS, ACCS, P, A, B, TA, TB)                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " " DREGS ", " A ", " B \
               ", p, 1, 1, " TA ", " TB ";\n}\n"                                            \
               : ACCS                                                                       \
               : "l"(da), "l"(db), "r"(accumulate), "n"(kTransA), "n"(kTransB))
#define GEMMT_WGMMA_TF32(INSTR, DREGS, ACCS, P, A, B)                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " " DREGS ", " A ", " B \
               ", p, 1, 1;\n}\n"                                                            \
               : ACCS                                                                       \
               : "l"(da), "l"(db), "r"(accumulate))

#define GEMMT_ACC32 GEMMT_ACC_AT(0), GEMMT_ACC_AT(8), GEMMT_ACC_AT(16), GEMMT_ACC_AT(24)
#define GEMMT_ACC64 \
  GEMMT_ACC32, GEMMT_ACC_AT(32), GEMMT_ACC_AT(40), GEMMT_ACC_AT(48), GEMMT_ACC_AT(56)
#define GEMMT_D32                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define GEMMT_D64                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

#define GEMMT_ACC96 \
  GEMMT_ACC64, GEMMT_ACC_AT(64), GEMMT_ACC_AT(72), GEMMT_ACC_AT(80), GEMMT_ACC_AT(88)
#define GEMMT_D96                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"

// Accumulator lists and register strings of the narrower steps (the trimmed three-quarter
// tile's).
#define GEMMT_ACC8 GEMMT_ACC_AT(0)
#define GEMMT_ACC16 GEMMT_ACC8, GEMMT_ACC_AT(8)
#define GEMMT_ACC24 GEMMT_ACC16, GEMMT_ACC_AT(16)
#define GEMMT_ACC40 GEMMT_ACC32, GEMMT_ACC_AT(32)
#define GEMMT_ACC48 GEMMT_ACC40, GEMMT_ACC_AT(40)
#define GEMMT_ACC56 GEMMT_ACC48, GEMMT_ACC_AT(48)
#define GEMMT_ACC72 GEMMT_ACC64, GEMMT_ACC_AT(64)
#define GEMMT_ACC80 GEMMT_ACC72, GEMMT_ACC_AT(72)
#define GEMMT_ACC88 GEMMT_ACC80, GEMMT_ACC_AT(80)
#define GEMMT_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define GEMMT_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define GEMMT_D24                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23}"
#define GEMMT_D40                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39}"
#define GEMMT_D48                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}"
#define GEMMT_D56                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55}"

#define GEMMT_D72                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71}"
#define GEMMT_D80                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}"
#define GEMMT_D88                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87}"

// wgmma_m64n<N>: D(64xN, fp32) (+)= A(64xK) * B(KxN) for one K step (16 for 16-bit types, 8
// for tf32, 32 for fp8), both operands from shared memory. `accumulate` == 0 overwrites D, which is
// how each tile starts without zeroing registers. NACC = N / 2 accumulators a thread; the strings
// are the PTX operand numbers after them: da, db, the predicate input, the two transpose flags.
// (NACC is pasted, not passed, so that the accumulator list reaches the asm statement as one macro
// argument.)
#define GEMMT_DEFINE_WGMMA(N, NACC, A, B, P, TA, TB)                                             \
  template <int kKind, int kTransA, int kTransB, int kAcc = NACC>                                \
  __device__ __forceinline__ void wgmma_m64n##N(float (&d)[kAcc], uint64_t da, uint64_t db,      \
                                                uint32_t accumulate) {                           \
    static_assert(NACC <= kAcc, "the block's accumulators are the first of d");                  \
    if constexpr (kKind == kBF16) {                                                              \
      GEMMT_WGMMA_16("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16", GEMMT_D##NACC,  \
                     GEMMT_ACC##NACC, P, A, B, TA, TB);                                          \
    } else if constexpr (kKind == kF16) {                                                        \
      GEMMT_WGMMA_16("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16", GEMMT_D##NACC,    \
                     GEMMT_ACC##NACC, P, A, B, TA, TB);                                          \
    } else if constexpr (kKind == kTF32) {                                                       \
      static_assert(kTransA == 0 && kTransB == 0, "tf32 wgmma reads K-major operands only");     \
      GEMMT_WGMMA_TF32("wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32", GEMMT_D##NACC, \
                       GEMMT_ACC##NACC, P, A, B);                                                \
    } else {                                                                                     \
      static_assert(kTransA == 0 && kTransB == 0, "fp8 wgmma reads K-major operands only");      \
      if constexpr (kKind == kE4M3) {                                                            \
        GEMMT_WGMMA_TF32("wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3",             \
                         GEMMT_D##NACC, GEMMT_ACC##NACC, P, A, B);                               \
      } else if constexpr (kKind == kE5M2E4M3) {                                                 \
        GEMMT_WGMMA_TF32("wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e5m2.e4m3",             \
                         GEMMT_D##NACC, GEMMT_ACC##NACC, P, A, B);                               \
      } else {                                                                                   \
        GEMMT_WGMMA_TF32("wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e5m2",             \
                         GEMMT_D##NACC, GEMMT_ACC##NACC, P, A, B);                               \
      }                                                                                          \
    }                                                                                            \
  }

// The wide, three-quarter, medium and narrow tiles' steps.
GEMMT_DEFINE_WGMMA(256, 128, "%128", "%129", "%130", "%131", "%132")
GEMMT_DEFINE_WGMMA(192, 96, "%96", "%97", "%98", "%99", "%100")
GEMMT_DEFINE_WGMMA(128, 64, "%64", "%65", "%66", "%67", "%68")
GEMMT_DEFINE_WGMMA(64, 32, "%32", "%33", "%34", "%35", "%36")
// The trimmed three-quarter tile's (wgmma_step_trimmed).
GEMMT_DEFINE_WGMMA(176, 88, "%88", "%89", "%90", "%91", "%92")
GEMMT_DEFINE_WGMMA(160, 80, "%80", "%81", "%82", "%83", "%84")
GEMMT_DEFINE_WGMMA(144, 72, "%72", "%73", "%74", "%75", "%76")
GEMMT_DEFINE_WGMMA(112, 56, "%56", "%57", "%58", "%59", "%60")
GEMMT_DEFINE_WGMMA(96, 48, "%48", "%49", "%50", "%51", "%52")
GEMMT_DEFINE_WGMMA(80, 40, "%40", "%41", "%42", "%43", "%44")
GEMMT_DEFINE_WGMMA(48, 24, "%24", "%25", "%26", "%27", "%28")
GEMMT_DEFINE_WGMMA(32, 16, "%16", "%17", "%18", "%19", "%20")
GEMMT_DEFINE_WGMMA(16, 8, "%8", "%9", "%10", "%11", "%12")
#undef GEMMT_DEFINE_WGMMA

// One K step of the consumer's 64 x kBN block.
template <int kKind, int kTransA, int kTransB, int kBN>
__device__ __forceinline__ void wgmma_step(float (&d)[kBN / 2], uint64_t da, uint64_t db,
                                           uint32_t accumulate) {
  if constexpr (kBN == 256) {
    wgmma_m64n256<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kBN == 192) {
    wgmma_m64n192<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kBN == 128) {
    wgmma_m64n128<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else {
    wgmma_m64n64<kKind, kTransA, kTransB>(d, da, db, accumulate);
  }
}

// One K step of a consumer's 64 x (2 kAcc) block cut to its first kN columns (sm90::
// trimmed_tile_width): one m64nkN on its first kN / 2 accumulators (fragment order is
// column-block order). They stay elements of the consumer's one array; the accumulators of the
// columns cut off keep whatever they held, lie past C's last column, and no store writes them.
// (Widths over 128 as m64n128 and a second instruction on B's rows from 128 on made ptxas
// serialise the main loop's wgmma, C7511, in three of the four layouts.)
template <int kKind, int kTransA, int kTransB, int kN, int kAcc>
__device__ __forceinline__ void wgmma_step_trimmed(float (&d)[kAcc], uint64_t da, uint64_t db,
                                                   uint32_t accumulate) {
  static_assert(kN % 16 == 0 && kN >= 16 && kN < 2 * kAcc,
                "a trimmed width: by 16, under the block's");
  if constexpr (kN == 16) {
    wgmma_m64n16<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 32) {
    wgmma_m64n32<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 48) {
    wgmma_m64n48<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 64) {
    wgmma_m64n64<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 80) {
    wgmma_m64n80<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 96) {
    wgmma_m64n96<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 112) {
    wgmma_m64n112<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 128) {
    wgmma_m64n128<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 144) {
    wgmma_m64n144<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else if constexpr (kN == 160) {
    wgmma_m64n160<kKind, kTransA, kTransB>(d, da, db, accumulate);
  } else {
    static_assert(kN == 176, "a width defined above");
    wgmma_m64n176<kKind, kTransA, kTransB>(d, da, db, accumulate);
  }
}

// tf32 with A from registers: each thread holds four elements of the 64x8 A slice (see
// a_fragment_offsets), B comes from shared memory K-major as above.
#define GEMMT_WGMMA_TF32_RS(INSTR, DREGS, ACCS, P, A, B)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " " DREGS ", " A ", " B \
               ", p, 1, 1;\n}\n"                                                            \
               : ACCS                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate))

template <int kBN>
__device__ __forceinline__ void wgmma_step_tf32_rs(float (&d)[kBN / 2], const uint32_t (&a)[4],
                                                   uint64_t db, uint32_t accumulate) {
  static_assert(kBN != 192, "the three-quarter tile has no tf32 instances");
  if constexpr (kBN == 256) {
    GEMMT_WGMMA_TF32_RS("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", GEMMT_D128,
                        GEMMT_ACC128, "%133", "{%128, %129, %130, %131}", "%132");
  } else if constexpr (kBN == 128) {
    GEMMT_WGMMA_TF32_RS("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", GEMMT_D64,
                        GEMMT_ACC64, "%69", "{%64, %65, %66, %67}", "%68");
  } else {
    GEMMT_WGMMA_TF32_RS("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", GEMMT_D32,
                        GEMMT_ACC32, "%37", "{%32, %33, %34, %35}", "%36");
  }
}

// fp16 with A from registers: four .f16x2 registers a thread, laid out as mma.sync
// m16n8k16's A fragment within each warp (warp w of the warpgroup holds rows 16 w .. 16 w + 15;
// lane l: a[0] row l / 4, k 2 (l % 4) and the next; a[1] the same 8 rows below; a[2], a[3] the
// same at k + 8). B from shared memory K-major (transpose flag 0). N = 16, 32 or 64: the
// narrower forms let a few tokens cost fewer tensor-core cycles.
#define GEMMT_WGMMA_F16_RS(INSTR, DREGS, ACCS, P, A, B)                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " " DREGS ", " A ", " B \
               ", p, 1, 1, 0;\n}\n"                                                         \
               : ACCS                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate))

template <int kN>
__device__ __forceinline__ void wgmma_f16_rs(float (&d)[kN / 2], const uint32_t (&a)[4],
                                             uint64_t db, uint32_t accumulate) {
  static_assert(kN == 16 || kN == 32 || kN == 64, "register-A fp16 wgmma: N = 16, 32 or 64");
  if constexpr (kN == 64) {
    GEMMT_WGMMA_F16_RS("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", GEMMT_D32, GEMMT_ACC32,
                       "%37", "{%32, %33, %34, %35}", "%36");
  } else if constexpr (kN == 32) {
    GEMMT_WGMMA_F16_RS("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16", GEMMT_D16, GEMMT_ACC16,
                       "%21", "{%16, %17, %18, %19}", "%20");
  } else {
    GEMMT_WGMMA_F16_RS("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16", GEMMT_D8,
                       GEMMT_ACC_AT(0), "%13", "{%8, %9, %10, %11}", "%12");
  }
}

#undef GEMMT_WGMMA_16
#undef GEMMT_WGMMA_TF32
#undef GEMMT_WGMMA_TF32_RS
#undef GEMMT_WGMMA_F16_RS
#undef GEMMT_ACC16
#undef GEMMT_D8
#undef GEMMT_D16
#undef GEMMT_ACC_AT
#undef GEMMT_ACC8
#undef GEMMT_ACC24
#undef GEMMT_ACC40
#undef GEMMT_ACC48
#undef GEMMT_ACC56
#undef GEMMT_D24
#undef GEMMT_D40
#undef GEMMT_D48
#undef GEMMT_D56
#undef GEMMT_D88
#undef GEMMT_ACC88
#undef GEMMT_D80
#undef GEMMT_ACC80
#undef GEMMT_D72
#undef GEMMT_ACC72
#undef GEMMT_ACC32
#undef GEMMT_ACC64
#undef GEMMT_ACC96
#undef GEMMT_ACC128
#undef GEMMT_D32
#undef GEMMT_D64
#undef GEMMT_D96
#undef GEMMT_D128

#endif  // GEMMT_SM90_DEVICE_CODE

}  // namespace
}  // namespace gemmt
