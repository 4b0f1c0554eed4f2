// The Hopper GEMM kernel's 128x192 instances for float16 operands: every operand layout,
// CTA pairs (single CTAs: the file without _pair).
#include "sm90/launch.cuh"

namespace gemmt {
namespace sm90 {

template cudaError_t launch_width<kF16, kBNThreeQuarter, 2>(const Problem& pr, const Plan& plan,
                                                            const Maps& maps, const Launch& l,
                                                            cudaStream_t stream);

}  // namespace sm90
}  // namespace gemmt
