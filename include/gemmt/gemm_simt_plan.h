// What the SIMT GEMM family launches for a problem, as reported to the dispatcher, tests and
// benchmarks (gemm_simt_plan in gemmt/gemm_simt.h). Free of CUDA headers.
#pragma once

#include <cstddef>

namespace gemmt {

// What gemm_simt_run will launch for (args, v): the block tile of the main kernel, the
// number of k-slices (split-k and the split gemv; 1 otherwise) and the workspace it needs.
struct SimtPlan {
  int block_m = 0, block_n = 0, block_k = 0;  // 0 for kernels without a block tile (gemv)
  int stages = 0;                             // shared-memory stages (pipelined, split-k)
  int threads = 0;                            // threads per block of the main kernel
  int splits = 1;
  bool interior = false;  // the whole-tiles instance of the pipelined kernel
  // Stream-k: the last stream_k_tiles tiles run on stream_k_blocks blocks that share out
  // their k-tiles evenly (0: every tile is one block).
  int stream_k_blocks = 0, stream_k_tiles = 0;
  std::size_t workspace_bytes = 0;
};

}  // namespace gemmt
