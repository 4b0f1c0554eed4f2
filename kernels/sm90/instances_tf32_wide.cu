// The Hopper GEMM kernel's 128x256 instances for float32 with TF32 allowed operands: every operand
// layout, single CTAs (the CTA pairs: _pair.cu).
#include "sm90/launch.cuh"

namespace gemmt {
namespace sm90 {

template cudaError_t launch_width<kTF32, kBNWide, 1>(const Problem& pr, const Plan& plan,
                                                     const Maps& maps, const Launch& l,
                                                     cudaStream_t stream);

}  // namespace sm90
}  // namespace gemmt
