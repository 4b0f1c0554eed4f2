// Launches of the Hopper GEMM kernel (kernel.cuh) for one operand kind: the kernel
// parameters from a plan, the cluster shape, and the instances for every operand layout and
// tile width. Included by instances_<kind>.cu only, so each kind's instances compile in their
// own translation unit.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

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
  constexpr int kCacheSize = 64;
  static std::atomic<int> cache[kCacheSize];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return sm_count / 2;
  }
  if (device >= 0 && device < kCacheSize) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(2 * (sm_count / 2 > 0 ? sm_count / 2 : 1));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = TileCfg<kBNWide>::kSmemBytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters < 1) {
    (void)cudaGetLastError();
    return sm_count / 2;  // not cached: a later call may get a real answer
  }
  if (device >= 0 && device < kCacheSize) cache[device].store(clusters, std::memory_order_relaxed);
  return clusters;
}

template <int kKind, bool kAMn, bool kBMn, int kCluster, int kBN>
cudaError_t launch(const Maps& maps, const Params& p, int sm_count, cudaStream_t stream) {
  constexpr auto kernel = sm90_gemm_kernel<kKind, kAMn, kBMn, kCluster, kBN>;
  constexpr int kSmemBytes = TileCfg<kBN>::kSmemBytes;
  GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<kernel>(kSmemBytes));
  int max_clusters = sm_count;
  if constexpr (kCluster > 1) max_clusters = max_pair_clusters(kernel, sm_count);
  if (max_clusters < 1) max_clusters = 1;
  const int total_units = p.tiles_m * p.tiles_n * p.splits;
  const int clusters = total_units < max_clusters ? total_units : max_clusters;

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = kCluster > 1 ? 1 : 0;
  GEMMT_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, maps.a, maps.b, maps.c, p));
  GEMMT_RETURN_LAUNCH_ERROR();
}

template <int kKind, int kCluster, int kBN>
cudaError_t launch_layout(const Plan& plan, const Maps& maps, const Params& p, int sm_count,
                          cudaStream_t stream) {
  if constexpr (kKind == kTF32) {
    if (plan.b_mn) return cudaErrorNotSupported;
    return plan.a_mn ? launch<kKind, true, false, kCluster, kBN>(maps, p, sm_count, stream)
                     : launch<kKind, false, false, kCluster, kBN>(maps, p, sm_count, stream);
  } else {
    if (plan.a_mn) {
      return plan.b_mn ? launch<kKind, true, true, kCluster, kBN>(maps, p, sm_count, stream)
                       : launch<kKind, true, false, kCluster, kBN>(maps, p, sm_count, stream);
    }
    return plan.b_mn ? launch<kKind, false, true, kCluster, kBN>(maps, p, sm_count, stream)
                     : launch<kKind, false, false, kCluster, kBN>(maps, p, sm_count, stream);
  }
}

// The product of a plan for operand kind kKind (plan.kind): kernel parameters, then the
// instance for the plan's layouts, tile width and cluster shape.
template <int kKind>
cudaError_t launch_kind(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                        cudaStream_t stream) {
  const GemmArgs& args = pr.args;
  const int elt = plan.elt;
  const bool split = l.split.splits > 1;
  const SplitPlan& sp = l.split;
  float* partial = l.partial;
  const int cl = l.cluster;
  const bool narrow = plan.bn == kBNNarrow;
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
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.c_pair =
      (reinterpret_cast<uintptr_t>(args.c) % (2 * elt)) == 0 && (args.ldc % 2 == 0 || args.m == 1);
  p.tma_store = l.tma_store ? 1 : 0;
  p.c_trans = pr.c_trans ? 1 : 0;
  p.splits = split ? sp.splits : 1;
  p.kb_per_split = split ? sp.kb_per_split : p.num_kb;
  p.partial = split ? partial : nullptr;
  p.epi = make_epilogue_params(args.epilogue);
  const int sm_count = args.sm_count > 0 ? args.sm_count : 1;
  if (narrow) return launch_layout<kKind, 1, kBNNarrow>(plan, maps, p, sm_count, stream);
  if (plan.bn == kBNMedium) {
    return cl == 2 ? launch_layout<kKind, 2, kBNMedium>(plan, maps, p, sm_count, stream)
                   : launch_layout<kKind, 1, kBNMedium>(plan, maps, p, sm_count, stream);
  }
  if (cl == 2) return launch_layout<kKind, 2, kBNWide>(plan, maps, p, sm_count, stream);
  return launch_layout<kKind, 1, kBNWide>(plan, maps, p, sm_count, stream);
}

}  // namespace
}  // namespace gemmt
