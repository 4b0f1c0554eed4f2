// The Hopper GEMM's launchers, one translation unit per operand kind and tile width
// (instances_<kind>_<width>[_pair].cu), called by gemm_sm90.cu with a plan of
// kernels/plan/sm90_plan.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/gemm_tc_kind.h"
#include "plan/sm90_plan.h"

namespace gemmt {
namespace sm90 {

// The operands' tensor maps; c is only encoded (and read) when the launch stores C by TMA.
struct Maps {
  CUtensorMap a, b, c;
};

// What the launch decides besides the plan.
struct Launch {
  int cluster = 1;         // CTAs per cluster: 2 multicasts each B tile to a pair
  bool tma_store = false;  // C goes out through shared memory and TMA
  SplitPlan split;         // k-slices; more than one needs `partial`
  float* partial = nullptr;
  bool shift_last_tile = true;  // the last 128-row tile ends at row m (sm90::last_tile_row)
};

// The instances of one operand kind (TcKind), tile width (kBNWide ... kBNNarrow) and cluster
// shape (1: single CTAs, 2: CTA pairs; l.cluster must match), for every operand layout. Each
// is its own translation unit: instances_<kind>_<width>.cu for single CTAs and
// instances_<kind>_<width>_pair.cu for pairs (no pairs for the narrow tile; the 128x192 width
// for 16-bit kinds only). The pairs are a translation unit of their own because each of the
// two halves was the longest step of the build.
template <int kKind, int kBN, int kCluster>
cudaError_t launch_width(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                         cudaStream_t stream);

// The instances of the plan's tile width and the launch's cluster shape.
template <int kKind, int kBN>
cudaError_t launch_cluster(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                           cudaStream_t stream) {
  if constexpr (kBN == kBNNarrow) {
    return sm90::launch_width<kKind, kBN, 1>(pr, plan, maps, l, stream);
  } else {
    return l.cluster == 2 ? sm90::launch_width<kKind, kBN, 2>(pr, plan, maps, l, stream)
                          : sm90::launch_width<kKind, kBN, 1>(pr, plan, maps, l, stream);
  }
}

// The instances of the plan's kind and tile width (instances_<kind>_<width>[_pair].cu).
template <int kKind>
cudaError_t launch_kind(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                        cudaStream_t stream) {
  switch (plan.bn) {
    case kBNNarrow:
      return launch_cluster<kKind, kBNNarrow>(pr, plan, maps, l, stream);
    case kBNMedium:
      return launch_cluster<kKind, kBNMedium>(pr, plan, maps, l, stream);
    case kBNThreeQuarter:
      if constexpr (kKind == kTF32) {
        return cudaErrorNotSupported;  // 16-bit only (the planner never picks it for tf32)
      } else {
        return launch_cluster<kKind, kBNThreeQuarter>(pr, plan, maps, l, stream);
      }
    default:
      return launch_cluster<kKind, kBNWide>(pr, plan, maps, l, stream);
  }
}

// launch_kind<kTF32> in its own translation unit (launch_tf32.cu), with the TF32 instances: the
// kernels a build may compile on first use (include/gemmt/deferred.h).
cudaError_t launch_tf32(const Problem& pr, const Plan& plan, const Maps& maps, const Launch& l,
                        cudaStream_t stream);

}  // namespace sm90
}  // namespace gemmt
