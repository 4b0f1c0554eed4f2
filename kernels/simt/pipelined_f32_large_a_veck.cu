// Instances of the pipelined SIMT kernel: float32, PipeTile::kLarge, A read in vectors along K
// (kVecK).
#include "simt/pipelined_instances.cuh"

namespace gemmt {
namespace simt {

template PipeKernel pipe_kernel_a<ScalarType::kFloat32, PipeTile::kLarge, false, kVecK,
                                  LoaderSet::kVector>(LoadMode b, bool stream_k);

}  // namespace simt
}  // namespace gemmt
