// The launch of one instance of the grouped GEMM kernel (grouped_kernel.cuh). Included by the
// instance translation units only.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "sm90/grouped_kernel.cuh"
#include "sm90/grouped_launchers.h"

namespace gemmt {
namespace {

template <int kKind, bool kAMn, bool kBMn, int kBN, int kPromote, int kBlock, int kCluster = 1,
          int kPerSm = 1, int kARows = kGgBM>
cudaError_t launch_grouped_instance(const sm90::GroupedLaunch& l, cudaStream_t stream) {
  constexpr auto kernel =
      sm90_grouped_gemm_kernel<kKind, kAMn, kBMn, kBN, kPromote, kBlock, kCluster, kPerSm, kARows>;
  using Cfg = GgCfg<kKind, kBN, kARows>;
  // The ring's depth, the staging buffer and the exchange are launch parameters; the kernel
  // trusts them.
  const bool staged = l.p.store_c != 0;
  const bool exchange = l.p.wg_split_k != 0;
  if (l.a_rows != kARows || (exchange && (kARows != 64 || staged))) return cudaErrorInvalidValue;
  if (staged && (kPerSm != 1 || kBlock == kBlockCols)) return cudaErrorInvalidValue;
  const bool table = l.p.split != static_cast<int>(GroupSplit::kNone);
  constexpr int kScaleBytes = staged_scale_bytes(kBlock);
  if (l.block != (kBlock != kBlockNone)) return cudaErrorInvalidValue;
  const int max_stages =
      kPerSm != 1 ? sm90::kGroupedPairStages
                  : sm90::grouped_ring_stages(kARows, kBN, staged, table, kScaleBytes, exchange);
  if (l.p.stages < 1 || l.p.stages > max_stages) return cudaErrorInvalidValue;
  const int smem = Cfg::smem_bytes(l.p.stages, staged, table, kScaleBytes, exchange);
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(smem));
  if constexpr (kPerSm != 1) GEMMT_RETURN_IF_ERROR(prefer_max_shared_carveout<kernel>());
  if constexpr (kCluster == 1) {
    return launch_programmatic<kernel>(dim3(l.grid), dim3(gg_threads<kPerSm>()), smem, stream, l.a,
                                       l.b, l.c, l.p);
  } else {
    if (l.cluster != kCluster || l.grid % kCluster != 0) return cudaErrorInvalidValue;
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg = cluster_launch_config(dim3(l.grid), dim3(gg_threads<kPerSm>()), smem,
                                                   stream, kCluster, attr);
    // As many pairs as can be resident at once (a GPC's SMs may not pair up): more would run
    // as a second, mostly idle wave of the persistent grid.
    static std::atomic<int> cache[kMaxCachedDevices] = {};
    int pairs = 0;
    const cudaError_t occ = cached_per_device(cache, &pairs, [&](int, int* count) {
      cudaLaunchConfig_t q = cfg;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(count, kernel, &q);
      if (e != cudaSuccess) return e;
      return *count < 1 ? cudaErrorInvalidConfiguration : cudaSuccess;
    });
    if (occ == cudaSuccess && pairs * kCluster < l.grid) {
      cfg.gridDim = dim3(pairs * kCluster);
    } else if (occ != cudaSuccess) {
      (void)cudaGetLastError();
    }
    return cudaLaunchKernelEx(&cfg, kernel, l.a, l.b, l.c, l.p);
  }
}

// Tiles of 64 rows of K-major operands (one FP8 product of few rows) on lone CTAs, or in
// clusters of two or four along M that share B; the loop without promotion (kPromote 0) or with
// one set of partial sums (1).
template <int kKind, int kPromote>
cudaError_t launch_grouped_rows64(const sm90::GroupedLaunch& l, cudaStream_t stream) {
  if (l.a_mn || l.b_mn || l.bn != 128) return cudaErrorInvalidValue;
  switch (l.cluster) {
    case 1:
      return launch_grouped_instance<kKind, false, false, 128, kPromote, kBlockNone, 1, 1, 64>(
          l, stream);
    case 2:
      return launch_grouped_instance<kKind, false, false, 128, kPromote, kBlockNone, 2, 1, 64>(
          l, stream);
    case 4:
      return launch_grouped_instance<kKind, false, false, 128, kPromote, kBlockNone, 4, 1, 64>(
          l, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// The 16-bit instances of one kind and tile width: K-major A with either B, and the M-major A
// with N-major B of a split of the contraction dimension (the per-group weight gradient).
template <int kKind, int kBN>
cudaError_t launch_grouped_16bit(const sm90::GroupedLaunch& l, cudaStream_t stream) {
  if (l.promote != 0 || l.block || l.bn != kBN || l.a_rows != 128) return cudaErrorInvalidValue;
  if constexpr (kBN == 128) {
    // Two CTAs an SM: K-major A (the forward and grad_input layouts).
    if (l.per_sm == 2 && !l.a_mn) {
      return l.b_mn
                 ? launch_grouped_instance<kKind, false, true, 128, 0, kBlockNone, 1, 2>(l, stream)
                 : launch_grouped_instance<kKind, false, false, 128, 0, kBlockNone, 1, 2>(l,
                                                                                          stream);
    }
  }
  if (l.per_sm != 1) return cudaErrorInvalidValue;
  if (!l.a_mn && !l.b_mn)
    return launch_grouped_instance<kKind, false, false, kBN, 0, kBlockNone>(l, stream);
  if (!l.a_mn && l.b_mn)
    return launch_grouped_instance<kKind, false, true, kBN, 0, kBlockNone>(l, stream);
  if (l.a_mn && l.b_mn)
    return launch_grouped_instance<kKind, true, true, kBN, 0, kBlockNone>(l, stream);
  return cudaErrorInvalidValue;
}

// The FP8 instances of one operand pair (one group, CTA pairs): the promoted sum on the
// 128-wide tile from two sets of partial sums (runs of four k-blocks; with block scales of
// 128x128 or 128x1 too, and 128x128 ones on lone CTAs for groups) or on the 192-wide tile from
// one (with 128x128 block scales too, on pairs or, for groups, lone CTAs), fast accumulation on
// the 256- or 128-wide one; and lone CTAs on the 128-wide tile, promoted from one set or not
// (row / column or tensor scales: groups, or one product of at most 128 rows); tiles of 64 rows
// on lone CTAs, pairs or clusters of four, promoted from one set or not (one product of few
// rows).
template <int kKind>
cudaError_t launch_grouped_fp8_kind(const sm90::GroupedLaunch& l, cudaStream_t stream) {
  if (l.a_mn || l.b_mn || l.per_sm != 1) return cudaErrorInvalidValue;
  if (l.block) {
    // Block scales (staged in the ring): two sets of partial sums in runs of four k-blocks;
    // groups (a batch or a split of rows) on lone CTAs, with 128x128 scales of B; or 128x128
    // scales of B on the 192-wide tile of CTA pairs, one set.
    if (l.promote == 1) {
      if (l.bn != 192 || l.p.block_cols) return cudaErrorInvalidValue;
      return l.cluster == 2
                 ? launch_grouped_instance<kKind, false, false, 192, 1, kBlockSquare, 2>(l, stream)
                 : launch_grouped_instance<kKind, false, false, 192, 1, kBlockSquare, 1>(l, stream);
    }
    if (l.promote != 2) return cudaErrorInvalidValue;
    if (l.cluster == 1) {
      return l.p.block_cols
                 ? cudaErrorInvalidValue
                 : launch_grouped_instance<kKind, false, false, 128, 2, kBlockSquare, 1>(l, stream);
    }
    return l.p.block_cols
               ? launch_grouped_instance<kKind, false, false, 128, 2, kBlockCols, 2>(l, stream)
               : launch_grouped_instance<kKind, false, false, 128, 2, kBlockSquare, 2>(l, stream);
  }
  if (l.cluster == 1) {
    // Groups on lone CTAs: the promoted 192-wide tile where the planner takes it.
    if (l.bn == 192) {
      return l.promote == 1
                 ? launch_grouped_instance<kKind, false, false, 192, 1, kBlockNone, 1>(l, stream)
                 : cudaErrorInvalidValue;
    }
    // Lone CTAs (groups, or a product of at most 128 rows): the 128 x 128 tile, its A stages
    // 64 rows deep for one product of at most 64 rows.
    if (l.bn != 128 || l.promote > 1) return cudaErrorInvalidValue;
    if (l.a_rows == 64) {
      return l.promote == 1 ? launch_grouped_rows64<kKind, 1>(l, stream)
                            : launch_grouped_rows64<kKind, 0>(l, stream);
    }
    return l.promote == 1
               ? launch_grouped_instance<kKind, false, false, 128, 1, kBlockNone, 1>(l, stream)
               : launch_grouped_instance<kKind, false, false, 128, 0, kBlockNone, 1>(l, stream);
  }
  if (l.a_rows == 64) {
    // Pairs or clusters of four 64-row tiles (a few rows' product), promoted from one set or
    // not.
    if (l.promote > 1) return cudaErrorInvalidValue;
    return l.promote == 1 ? launch_grouped_rows64<kKind, 1>(l, stream)
                          : launch_grouped_rows64<kKind, 0>(l, stream);
  }
  if (l.promote == 2) {
    return l.bn == 128
               ? launch_grouped_instance<kKind, false, false, 128, 2, kBlockNone, 2>(l, stream)
               : cudaErrorInvalidValue;
  }
  if (l.promote == 1) {
    return l.bn == 192
               ? launch_grouped_instance<kKind, false, false, 192, 1, kBlockNone, 2>(l, stream)
               : cudaErrorInvalidValue;
  }
  if (l.promote != 0) return cudaErrorInvalidValue;
  if (l.bn == 256)
    return launch_grouped_instance<kKind, false, false, 256, 0, kBlockNone, 2>(l, stream);
  return launch_grouped_instance<kKind, false, false, 128, 0, kBlockNone, 2>(l, stream);
}

}  // namespace
}  // namespace gemmt
