// Instances of the pipelined SIMT kernel: bfloat16, PipeTile::kLarge, A read in vectors along K
// (kVecK).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

template PipeKernel pipe_kernel_a<ScalarType::kBFloat16, PipeTile::kLarge, false, kVecK>(
    LoadMode b, bool stream_k);

}  // namespace simt
}  // namespace gemmt
