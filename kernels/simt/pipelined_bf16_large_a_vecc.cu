// Instances of the pipelined SIMT kernel: bfloat16, PipeTile::kLarge, A read in 16-byte vectors
// along M (kVecC). (16-bit inputs usually go to the tensor-core families, so their SIMT build keeps
// two shapes, Large and Small.)
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

template PipeKernel pipe_kernel_a<ScalarType::kBFloat16, PipeTile::kLarge, false, kVecC>(
    LoadMode b, bool stream_k);

}  // namespace simt
}  // namespace gemmt
