// Planning of the Hopper cluster decode GEMM (kernels/sm90/decode_cluster.cu): C = x @ W^T for
// 1 to 256 tokens, with the weight as the wgmma M operand (128-row tiles of W), all tokens in
// one N tile, and K split across a thread-block cluster whose partial sums meet in
// distributed shared memory. Plain host C++: tests/test_plan.py checks it on CPU.
//
// Why it exists (H200, 132 SMs, 4.8 TB/s; `python -m gemmt bench tune`): the persistent
// wgmma kernel reaches the weight's HBM rate only with most SMs streaming, and a weight of
// 2048-5120 rows is 16-40 tiles of 128 rows. To occupy the SMs it splits K into slices that
// each write a float32 partial of C to global memory, and a second kernel adds them: a fixed
// 3-5 us (launch, tail, the round trip) on products of 9-20 us, and at 200 tokens against a
// 5120 x 5120 weight 3 slices move 12 MB of partials twice beside the 52 MB weight. Unsplit,
// 40 CTAs cannot pull 4.8 TB/s. Here every CTA of a cluster streams 1/cluster of the K range
// of one W tile with 4-8 stages (64-128 KB of W) in flight, and the partials never leave the
// chip: one launch, no workspace.
#pragma once

#include <cstdint>

#include "gemmt/gemm_args.h"

namespace gemmt {
namespace decode_cluster {

constexpr int kTileRows = 128;  // rows of W per CTA (two consumer warpgroups of 64)
constexpr int kBlockK = 64;     // K elements per stage (128 bytes of a 16-bit row)
constexpr int kMaxTokens = 256; // wgmma's widest N
constexpr int kMaxCluster = 8;  // portable cluster size
// A CTA keeps at least this many k-blocks, so that its ring passes its fill and the fixed
// costs (cluster barriers, the DSMEM reduction) stay small beside the streaming.
constexpr int kMinKbPerCta = 4;

struct Plan {
  int bn = 0;        // token tile: 64, 128, 192 or 256 (the smallest holding every token)
  int tiles = 0;     // 128-row tiles of W
  int cluster = 1;   // CTAs along K per tile
  int kb_per_cta = 0;
  int num_kb = 0;
  int ctas = 0;      // tiles * cluster
  int stages = 0;    // ring depth of the bn instance
};

// The ring depth of each token tile: stages of 16 KB of W plus bn rows of 128 bytes of tokens,
// as many as fit beside the barriers in 227 KB (the DSMEM reduction reuses the ring).
int stages_for(int bn);

// bf16 / fp16 on sm_90, 1 <= m <= 256 tokens, x K-major (a_stride_k == 1), W^T K-major
// (b_stride_k == 1), rows 16-byte aligned, k % 8 == 0, bias per column only.
bool supports(const GemmArgs& a);

// The plan: the smallest token tile, then the largest cluster (<= 8) whose tiles * cluster
// CTAs fit in one wave of sm_count SMs (one CTA per SM) with at least kMinKbPerCta k-blocks
// each; the cluster is then trimmed so that no CTA is left without k-blocks. Clusters must
// fit in one GPC, so on a device 132 SMs do not hold 132 / cl clusters of every size:
// `active` (may be null), indexed by cluster size 1..8, is how many clusters of that size the
// device keeps resident at once (the launcher asks cudaOccupancyMaxActiveClusters), and a
// cluster size is taken only when the tiles' clusters all fit.
Plan plan(const GemmArgs& a, const int* active = nullptr);

// Where the new decode schedule is the untuned choice (GEMMT_DECODE_SCHEDULE=new): the
// product is supported and either needs a K split to occupy the SMs (cluster >= 2), which the
// persistent kernel pays for with a second kernel and a workspace round trip, or has more than
// 64 tokens on a weight of at most one wave of tiles, where the persistent kernel runs the
// tokens as the M operand in 128-row tiles (two rows of tiles read W twice at 129-256 tokens)
// or splits. Weights of more than one wave of tiles (a 128k vocabulary) stay on the
// persistent kernel, which streams them at 0.99-1.10 of cuBLAS already.
bool wanted(const GemmArgs& a);

// Which decode schedule gemm_sm90_run uses, read from GEMMT_DECODE_SCHEDULE at every call so
// that one process can time both: "new" routes the products `wanted` accepts to the cluster
// kernel; "old" (the default, and any other value) keeps the persistent kernel's plans.
bool schedule_new();

}  // namespace decode_cluster
}  // namespace gemmt
