// Launches of the Hopper GEMM kernel (kernel.cuh): the kernel parameters from a plan, the
// cluster shape, and the instances of one kind, tile width and cluster shape (the 128x192
// tile for 16-bit kinds only): one for every operand layout (16-bit), or one a layout (tf32).
// Included by the instances_*.cu files only, so each (kind, width, cluster) compiles in its own
// translation unit.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>

#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "sm90/kernel.cuh"
#include "sm90/launchers.h"

namespace gemmt {
namespace {

using sm90::Launch;
using sm90::Maps;
using sm90::Plan;
using sm90::Problem;
using sm90::SplitPlan;

// How many 2-CTA clusters of this kernel fit on the device at once; the answer depends only
// on the device (every instantiation has the same block size and one CTA per SM).
template <typename Kernel>
int max_pair_clusters(Kernel kernel, int sm_count) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  int clusters = 0;
  const cudaError_t err = cached_per_device(cache, &clusters, [&](int, int* count) {
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg =
        cluster_launch_config(dim3(2 * (sm_count / 2 > 0 ? sm_count / 2 : 1)), dim3(kThreads),
                              TileCfg<kBNWide>::kSmemBytes, nullptr, 2, attr);
    const cudaError_t e = cudaOccupancyMaxActiveClusters(count, kernel, &cfg);
    if (e != cudaSuccess) return e;
    return *count < 1 ? cudaErrorInvalidConfiguration : cudaSuccess;
  });
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return sm_count / 2;  // not cached: a later call may get a real answer
  }
  return clusters;
}

// How a wide-tile launch spreads stream-k (SplitPlan::stream_k, sk_clusters): over every
// cluster that fits but at most two per unit of work, so that a tile is cut in three at
// most (kAuto; taken with two waves of tiles or more, where that is every cluster: every
// whole wave but the last runs as tiles); the partial last wave alone over every cluster
// that fits (kTail: the whole waves run as tiles, and a tile of the tail is cut into as
// many pieces as its k-blocks fill ranges); over every cluster that fits, which cuts the
// tiles of a small product into many pieces (kAll, tests); over clusters for two thirds of
// the units, so that small products are cut in two (kFewer, tests).
enum class SkSpread : int { kOff = 0, kAuto = 1, kAll = 2, kFewer = 3, kTail = 4 };

// Stream-k over `clusters` clusters: every whole wave of units but the last (kTail: every
// whole wave) runs as usual, the rest are spread by k-blocks, one equal range per cluster,
// at least one k-block each (fewer clusters otherwise). Nothing to spread when the units
// come to whole waves, or when the k-blocks would not fit the kernel's 32-bit count;
// `clusters` then drops to the units.
template <int kCluster, int kBN>
cudaError_t plan_stream_k(Params& p, bool stream_k, bool tail, int& clusters, cudaStream_t stream) {
  const int total_units = p.tiles_m * p.tiles_n * p.splits;
  p.sk_dp_units = total_units;
  p.sk_kb_total = 0;
  const bool whole_waves = total_units >= clusters && total_units % clusters == 0;
  const int waves = total_units / clusters;
  const int dp_units = (tail ? waves : (waves > 0 ? waves - 1 : 0)) * clusters;
  const int64_t sk_kb = static_cast<int64_t>(total_units - dp_units) * p.num_kb;
  // Behind whole waves, a last wave of fewer k-blocks than clusters runs as whole tiles.
  // Shrinking the grid to the k-blocks would deal the whole waves over fewer clusters,
  // unevenly, while the scheduler starts every cluster's range after an equal share of them
  // (scheduler.cuh: unit_at): a cluster with one tile more would skip its piece, and the
  // tile's last piece would wait for it forever.
  const bool small_tail = tail && dp_units > 0 && sk_kb < clusters;
  if (!stream_k || p.partial == nullptr || p.splits != 1 || whole_waves || small_tail ||
      sk_kb > INT32_MAX) {
    clusters = std::min(clusters, total_units);
    return cudaSuccess;
  }
  if (sk_kb < clusters) clusters = static_cast<int>(sk_kb);
  p.sk_dp_units = dp_units;
  p.sk_kb_total = static_cast<int>(sk_kb);
  // One slot per CTA, then two flags per slot (epilogue.cuh: sk_flag).
  const int64_t slots = static_cast<int64_t>(clusters) * kCluster;
  int* flags = reinterpret_cast<int*>(p.partial + slots * kBM * kBN);
  return cudaMemsetAsync(flags, 0, static_cast<size_t>(slots) * 2 * sizeof(int), stream);
}

template <int kKind, int kLayouts, int kCluster, int kBN>
cudaError_t launch(const Maps& maps, Params p, int sm_count, SkSpread sk, cudaStream_t stream) {
  constexpr auto kernel = sm90_gemm_kernel<kKind, kLayouts, kCluster, kBN>;
  constexpr int kSmemBytes = TileCfg<kBN>::kSmemBytes;
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(kSmemBytes));
  int max_clusters = sm_count;
  if constexpr (kCluster > 1) max_clusters = max_pair_clusters(kernel, sm_count);
  // The stream-k workspace holds one slot per SM, two at least (sm90::sk_slots).
  max_clusters = std::max(1, std::min(max_clusters, sm_count / kCluster));
  const int total_units = p.tiles_m * p.tiles_n * p.splits;
  // A stream-k tile's last piece waits for the others, which needs every CTA resident at
  // once: the grid never exceeds what fits (max_pair_clusters, or one CTA per SM). Stream-k
  // runs on the wide tile only.
  const bool stream_k = kBN == kBNWide && sk != SkSpread::kOff;
  int clusters = max_clusters;
  if (stream_k && sk == SkSpread::kAuto) {
    clusters = std::min(max_clusters, 2 * total_units);
  } else if (stream_k && sk == SkSpread::kFewer) {
    clusters = std::max(1, std::min(std::min(max_clusters, total_units), 2 * total_units / 3));
  }
  GEMMT_RETURN_IF_ERROR(
      (plan_stream_k<kCluster, kBN>(p, stream_k, sk == SkSpread::kTail, clusters, stream)));

  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg =
      cluster_launch_config(dim3(static_cast<unsigned>(clusters * kCluster)), dim3(kThreads),
                            kSmemBytes, stream, kCluster, attr);
  add_programmatic_launch<kernel>(cfg, attr);
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, maps.a, maps.b, maps.c, p));
  GEMMT_RETURN_LAUNCH_ERROR();
}

// The instance for the plan's operand layouts: the one kernel of a 16-bit kind, which serves
// them all (kAnyLayout), or tf32's for its layout.
template <int kKind, int kCluster, int kBN>
cudaError_t launch_layout(const Plan& plan, const Maps& maps, const Params& p, int sm_count,
                          SkSpread skc, cudaStream_t stream) {
  if constexpr (kKind == kTF32) {
    if (plan.b_mn) return cudaErrorNotSupported;
    return plan.a_mn ? launch<kKind, kLayoutAMn, kCluster, kBN>(maps, p, sm_count, skc, stream)
                     : launch<kKind, 0, kCluster, kBN>(maps, p, sm_count, skc, stream);
  } else {
    return launch<kKind, kAnyLayout, kCluster, kBN>(maps, p, sm_count, skc, stream);
  }
}

// The kernel parameters of a plan for operand kind kKind (plan.kind), and how its stream-k
// (if any) spreads.
template <int kKind>
Params params_of(const Problem& pr, const Plan& plan, const Launch& l, SkSpread* skc) {
  const GemmArgs& args = pr.args;
  const int elt = plan.elt;
  const bool split = l.split.splits > 1;
  const SplitPlan& sp = l.split;
  float* partial = l.partial;
  const int cl = l.cluster;
  const int64_t tiles_m128 = (args.m + kBM - 1) / kBM;
  Params p;
  p.m = static_cast<int>(args.m);
  p.n = static_cast<int>(args.n);
  p.k = static_cast<int>(args.k);
  p.tiles_m = static_cast<int>(tiles_m128 / cl);
  p.tiles_n = static_cast<int>((args.n + plan.bn - 1) / plan.bn);
  p.num_kb = static_cast<int>((args.k + (128 / elt) - 1) / (128 / elt));
  p.group = 16 / cl;  // 2048 rows of C per raster group
  p.stage_tx_bytes = sm90::stage_tx_bytes(plan);
  p.c = args.c;
  p.ldc = args.ldc;
  p.alpha = static_cast<float>(args.alpha);
  p.beta = static_cast<float>(args.beta);
  p.c_pair =
      (reinterpret_cast<uintptr_t>(args.c) % (2 * elt)) == 0 && (args.ldc % 2 == 0 || args.m == 1);
  p.tma_store = l.tma_store ? 1 : 0;
  p.a_mn = plan.a_mn ? 1 : 0;
  p.b_mn = plan.b_mn ? 1 : 0;
  p.c_trans = pr.c_trans ? 1 : 0;
  p.splits = split ? sp.splits : 1;
  p.kb_per_split = split ? sp.kb_per_split : p.num_kb;
  p.last_m0 = l.shift_last_tile ? sm90::last_tile_row(pr, plan) : std::numeric_limits<int>::max();
  const bool sk = sp.stream_k && !split && partial != nullptr;
  p.partial = split || sk ? partial : nullptr;
  p.epi = make_epilogue_params(args.epilogue);
  *skc = !sk                    ? SkSpread::kOff
         : sp.sk_clusters == -1 ? SkSpread::kFewer
         : sp.sk_clusters == -2 ? SkSpread::kAll
         : sp.sk_clusters == 1  ? SkSpread::kTail
                                : SkSpread::kAuto;
  return p;
}

}  // namespace

namespace sm90 {

// The product of a plan whose tile width is kBN and whose launch has kCluster CTAs per
// cluster: the instance for its layouts. Defined for every (kind, width, cluster) the kernels
// have, each in its own translation unit (instances_<kind>_<width>[_pair].cu), so that a
// parallel build compiles them side by side.
template <int kKind, int kBN, int kCluster>
cudaError_t launch_width(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                         cudaStream_t stream) {
  static_assert(kCluster == 1 || (kCluster == 2 && kBN != kBNNarrow),
                "the narrow tile runs in single CTAs only");
  if (l.cluster != kCluster) return cudaErrorInvalidConfiguration;
  SkSpread skc = SkSpread::kOff;
  const Params p = params_of<kKind>(pr, plan, l, &skc);
  const int sm_count = pr.args.sm_count > 0 ? pr.args.sm_count : 1;
  return launch_layout<kKind, kCluster, kBN>(plan, maps, p, sm_count, skc, stream);
}

}  // namespace sm90
}  // namespace gemmt
