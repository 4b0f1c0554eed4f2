// Planning of the Hopper FP8 decode kernel (kernels/fp8/scaled_decode_fp8_sm90.cu): how many
// CTAs split K. Plain host C++, tested on CPU.
#pragma once

#include <cstdint>

namespace gemmt {
namespace fp8_decode_plan {

constexpr int kRows = 128;            // W rows a CTA streams
constexpr int kBlockK = 128;          // K of a ring stage
constexpr int kMaxSplit = 8;          // CTAs along K: one cluster, at most the portable size
constexpr int kMinBlocksPerRank = 4;  // k-blocks a rank streams at least

// CTAs along K (a cluster) for an n x k weight on sm_count SMs: the most that keep the grid
// within 1.25 CTAs an SM. Two of these CTAs on one SM stream less than two on two SMs, so a
// grid of about one CTA an SM wins; the quarter over it pays where W has few rows of CTAs
// and a long K. Measured on an H200 (132 SMs), every split of six weights at 1, 16 and 32
// tokens (benchmarks/results/h200_fp8/fp8_decode_split_h200_2026-11-29_run1.json): 14336 x
// 4096 ran 20.1 us on one CTA a row block (112 CTAs) against 21.9 on two (224), 8192 x 8192
// 23.4 on two (128) against 25.4 on three (192), 4096 x 4096 best on five (160); every grid
// of 240 or more CTAs from a split ran 1.2-1.6x slower than the best. The float8 form
// (use_fast_accum: float8 wgmma on the stages as they landed, no widening) keeps the grid
// within one CTA an SM: its CTAs stream faster, and the splits past that ran 4-8% slower
// (H200, fp8_decode_split_fast_h200_2026-11-30.json, 1 and 16 tokens: 4096 x 4096 8.3-8.7 us
// on three or four against 8.9-9.0 on five, 6144 x 4096 11.2 on two against 11.7-11.8 on
// three, 4096 x 14336 20.5 on four against 21.1-21.4 on five).
int k_split(int64_t n, int64_t k, int sm_count, bool float8_form = false);

}  // namespace fp8_decode_plan
}  // namespace gemmt
