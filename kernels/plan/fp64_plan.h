// Planning of the float64 GEMM's tensor-core form (kernels/fp64/gemm_fp64.cu): the CTA's tile
// extent along the MMA's B role. Plain host C++, tested on CPU.
#pragma once

#include <cstdint>

namespace gemmt {
namespace fp64_plan {

// Rows of tiles visited together, so that concurrently running CTAs share panels of A and B
// in L2.
constexpr int kGroupM = 8;

// 64 (a 128 x 64 CTA of 4 warps, two an SM, cuBLAS DGEMM's shape for this layout) or 128 (a
// 128 x 128 CTA of 8 warps, one an SM). swap: the kernel computes C^T (A K-major and B
// MN-major: row-major tensors), where the 128-wide tile reads fewer bytes a flop. Measured on
// an H200 against cuBLAS in one process, three runs (benchmarks/results/h200_gemm_fp64/
// ab_fp64_cta_h200_2026-11-29.json): without the swap the two CTAs an SM, which do not wait on
// each other's barriers, gave at 4096^3 0.78-0.80 (nt), 0.79-0.80 (tn) and 0.76-0.77 (tt) of
// cuBLAS against 0.74-0.76, 0.74-0.80 and 0.72-0.74, and 0.98 against 0.91-0.92 at
// 4095 x 4097 x 1000 (tt); with the swap 128 x 128 stayed 1-5% ahead where its tiles fill the
// SMs (4096^3, 4095 x 4097 x 1000, 6000^3, 8192^3; 2048^3 and 3000 x 5000 x 700 went either
// way or behind) and fell behind where they do not (1000^3: 0.43-0.47 against 0.52-0.56).
// narrow_per_sm: how many 128 x 64 CTAs one SM of the device holds (2 on the H100 and H200; 1
// where 228 KB of shared memory is not there, such as the 100 KB of sm_86 / sm_89, where a lone
// 4-warp CTA would leave half of an SM's warps idle): below 2, 128.
int dmma_cta_width(int64_t m, int64_t n, bool swap, int sm_count, int narrow_per_sm);

}  // namespace fp64_plan
}  // namespace gemmt
