// The GEMM kernels a user can name (gemm(..., variant="...")). Free of CUDA headers so
// that CPU-only builds parse the same names.
#pragma once

#include <string_view>

namespace gemmt {

// Every kernel a user can name. kAuto lets gemm_pick() choose by shape, dtype and GPU.
enum class GemmVariant : int {
  kAuto = 0,
  kNaive,            // one thread per output element, straight from global memory
  kSmemTiled,        // square shared-memory tiles: each loaded element reused TILE times
  kRegisterBlocked,  // each thread computes a TMxTN micro-tile from registers
  kWarpTiled,        // warp-level tiles, vector loads, transposed A in shared memory
  kPipelined,        // warp tiles + multi-stage cp.async pipeline (the fast SIMT kernel)
  kSplitK,           // pipelined kernel over k-slices, deterministic reduction in a workspace
  kGemv,             // m == 1 or n == 1: one warp per output, memory-bound
  kMmaSync,          // tensor cores through mma.sync (sm_80+): bf16, fp16, tf32
  kWgmma,            // Hopper: TMA + wgmma, warp-specialised, persistent (sm_90a)
  kDecode,           // m <= 64 (decode steps): streams B through mma.sync, split-k in a cluster
  kDmma,             // float64 on the FP64 tensor cores through mma.sync (sm_80+)
  kSimtFp64,         // float64 with double FMAs on any GPU: the same tiles and pipeline as kDmma
  kCount,
};

// User-facing names, indexed by GemmVariant. Header-only so CPU-only builds share them.
inline constexpr const char* kGemmVariantNames[] = {
    "auto", "naive",    "smem_tiled", "register_blocked", "warp_tiled", "pipelined", "split_k",
    "gemv", "mma_sync", "wgmma",      "decode",           "dmma",       "simt_fp64"};
static_assert(sizeof(kGemmVariantNames) / sizeof(kGemmVariantNames[0]) ==
              static_cast<int>(GemmVariant::kCount));

inline const char* gemm_variant_name(GemmVariant v) {
  int i = static_cast<int>(v);
  return (i >= 0 && i < static_cast<int>(GemmVariant::kCount)) ? kGemmVariantNames[i] : "unknown";
}

// Parses a name such as "pipelined"; returns false when unknown.
inline bool gemm_variant_from_name(std::string_view name, GemmVariant* out) {
  for (int i = 0; i < static_cast<int>(GemmVariant::kCount); ++i) {
    if (name == kGemmVariantNames[i]) {
      *out = static_cast<GemmVariant>(i);
      return true;
    }
  }
  return false;
}

}  // namespace gemmt
