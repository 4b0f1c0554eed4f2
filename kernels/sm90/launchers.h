// The Hopper GEMM's launchers, one translation unit per operand kind and tile width
// (instances_<kind>_<width>[_pair].cu), called by gemm_sm90.cu with a plan of
// kernels/plan/sm90_plan.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

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

}  // namespace sm90
}  // namespace gemmt
