// Planning of the Hopper batched-decode GEMM (kernels/sm90/gemm_sm90_decode_tile.cu): a CTA
// computes 64 weight rows (output features) by a share of the tokens with one consumer
// warpgroup, so that a weight of a few thousand rows is spread over every SM without a split
// of K, and the clusters multicast both operands (the tokens across the feature tiles of a
// cluster, the weight rows across its token tiles), so that L2 delivers each byte once per
// cluster. Plain host C++, tested on CPU (tests/test_plan.py).
#pragma once

#include <cstdint>

#include "gemmt/gemm_args.h"

namespace gemmt {
namespace decode_tile {

constexpr int kFeatures = 64;    // weight rows a CTA: one wgmma's M
constexpr int kMaxTokens = 256;  // m limit of the family
// Instances: tokens a CTA (wgmma N) by 16 up to 192, and 256 (the widths ptx.cuh defines).
constexpr int kMaxWidth = 256;
// A weight of at least this many bytes: the class the rule was measured on (decode against
// weights of 16 MB to 1 GB, each read from DRAM once a step).
constexpr double kMinWeightBytes = 16e6;
constexpr int kMaxStages = 16;
constexpr int kStageABytes = kFeatures * 128;  // 64 weight rows of 128 bytes of K
constexpr int kSmemLimit = 227 * 1024;
constexpr int kBarrierBytes = 2 * kMaxStages * 8;
constexpr int kEpiloguePitch = kFeatures + 4;  // floats a token's staged row (bank spread)

struct Plan {
  int token_tiles = 0;  // CTAs along the tokens
  int step = 0;         // tokens a token tile stores (a multiple of 8)
  int width = 0;        // the instance: tokens a CTA computes (wgmma N, a multiple of 16)
  int cx = 1, cy = 1;   // cluster: feature tiles sharing tokens x token tiles sharing weights
  int b_box = 0;        // token rows each CTA of a cluster row loads for all of them
  int b_rows = 0;       // token rows a stage holds (>= width, >= cx * b_box)
  int stages = 0;
  int feature_tiles = 0;  // ceil(n / 64), padded to a multiple of cx
  int grid = 0;           // CTAs: feature_tiles x token_tiles (padded to cy)
  int smem_bytes = 0;
  double cost = 0.0;  // bytes a busy SM moves, in units of a stage of weight rows
  bool ok() const { return width > 0; }
};

// bf16 / fp16 on sm_90, tokens = A (m x k, K-major), weights = B^T (n x k, K-major), C
// row-major; 16-byte aligned bases and rows, k % 8 == 0, 1 <= m <= kMaxTokens, no bias per
// row. What the kernel can run; whether `auto` picks it is picked() below.
bool supports(const GemmArgs& a);

// The token split, width, cluster and ring for a supported problem (ok() false otherwise):
// the split whose busy SMs move the fewest bytes, counted in waves of CTAs.
Plan plan(const GemmArgs& a);

// Whether gemm_pick takes this family: 65 to 256 tokens against a weight of kMinWeightBytes
// or more, below the roofline's ridge, where the Hopper kernel's 128-row tiles either re-read
// the weight per 128 tokens or need a split of K and its reduction.
bool picked(const GemmArgs& a);

}  // namespace decode_tile
}  // namespace gemmt
