// Instances of the pipelined SIMT kernel for bfloat16: the Large and Small tiles (16-bit inputs
// usually go to the tensor-core families, so their SIMT build keeps two shapes).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

PipeKernel pipe_kernel_bf16(PipeTile tile, LoadMode a, LoadMode b) {
  switch (tile) {
    case PipeTile::kLarge:
      return pipe_kernel_of<__nv_bfloat16, PipeTile::kLarge, false>(a, b, false);
    case PipeTile::kSmall:
      return pipe_kernel_of<__nv_bfloat16, PipeTile::kSmall, false>(a, b, false);
    default:
      return PipeKernel{};
  }
}

}  // namespace simt
}  // namespace gemmt
