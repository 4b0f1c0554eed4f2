// Helpers shared by every op wrapper: argument checks with messages that name the op,
// the argument, what was expected and what was given; dtype mapping; launch-status checks.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <sstream>
#include <string>

#include "gemmt/activation.h"
#include "gemmt/deferred.h"
#include "gemmt/device_info.h"
#include "gemmt/gemm_variant.h"
#include "gemmt/types.h"

#ifdef GEMMT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace gemmt::wrapper {

// "a float32 tensor of shape [2, 3] on cpu" — what the user gave, for error messages.
std::string describe(const at::Tensor& t);

std::string dtype_list(std::initializer_list<at::ScalarType> dtypes);

void check_defined(const char* op, const char* arg, const at::Tensor& t);

void check_dtype(const char* op, const char* arg, const at::Tensor& t,
                 std::initializer_list<at::ScalarType> allowed);

void check_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim);

void check_same_shape(const char* op, const char* arg_a, const at::Tensor& a, const char* arg_b,
                      const at::Tensor& b);

void check_same_dtype(const char* op, const char* arg_a, const at::Tensor& a, const char* arg_b,
                      const at::Tensor& b);

// Dequantisation scales' values, on CPU only (a Meta or traced tensor has none): every one
// finite and positive.
void check_scale_values(const char* op, const char* arg, const at::Tensor& s);

void check_same_device(const char* op, const char* arg_a, const at::Tensor& a, const char* arg_b,
                       const at::Tensor& b);

// The reference CPU loops (ops.h, "Reference CPU loops") take CPU tensors only.
void check_cpu_reference(const char* op, const at::Tensor& t);

// Floating dtypes the ops compute in, on CPU and CUDA alike: float32, float16, bfloat16 and
// float64 (what torch.autograd.gradcheck needs).
std::initializer_list<at::ScalarType> float_dtypes_for(const at::Tensor& t);

// act(z) through ATen's activation kernels (torch.nn.functional's formulas, computed in the
// op-math type, one rounding to the dtype) into out, which may be z itself.
void aten_activation_out(Activation act, const at::Tensor& z, at::Tensor out);

// The same as a new tensor (z itself for kNone).
at::Tensor aten_activation(const at::Tensor& z, Activation act);

// act'(z) * g through ATen's differentiable activation backwards: what a backward that is
// itself recorded (create_graph) uses, so that second derivatives exist.
at::Tensor aten_activation_backward(const at::Tensor& g, const at::Tensor& z, Activation act);

// A new contiguous tensor. CUDA outputs come straight from the caching allocator: at::empty
// would be a second trip through the dispatcher on every call, a visible share of a small
// tensor's per-call time. Meta (and CPU) outputs go through at::empty as usual.
at::Tensor new_output(c10::SymIntArrayRef sizes, const at::TensorOptions& options);

ScalarType to_kernel_dtype(at::ScalarType t);

// Rows of t seen as a matrix of its last dimension: the product of the leading sizes (well
// defined also when the last dimension is 0, where reshape(-1, 0) is not).
int64_t leading_rows(const at::Tensor& t);

// Describes a non-contiguous tensor for the strided kernel path: size-1 dimensions are
// dropped and dimensions that are contiguous with each other are merged. Refuses, naming
// the op, a tensor that still has more than kMaxDims dimensions after that.
StridedLayout strided_layout(const char* op, const char* arg, const at::Tensor& t);

#ifdef GEMMT_WITH_CUDA
// nullptr tells a launcher the input is contiguous (vector path when aligned).
struct CudaInput {
  CudaInput(const char* op, const char* arg, const at::Tensor& t)
      : ptr(t.const_data_ptr()), contiguous(t.is_contiguous()) {
    if (!contiguous) layout = strided_layout(op, arg, t);
  }
  const StridedLayout* layout_or_null() const { return contiguous ? nullptr : &layout; }
  const void* ptr;
  bool contiguous;
  StridedLayout layout;
};

inline cudaStream_t stream_for(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

// The SMs gemmt's persistent kernels (the GEMMs, the Linear backward pass) may fill on the
// current device: all of them, less torch's SM carve-out when one is set
// (torch._C._set_sm_carveout_experimental, which cuBLASLt honours as well). A carve-out
// leaves SMs free for kernels that run beside a GEMM, such as NCCL's collectives: a grid
// of one CTA per SM cannot start on SMs those hold, and its statically dealt tiles would
// then wait for them.
int usable_sm_count(const char* op);

// L2 size, DRAM bandwidth (memory clock and bus width) and SM clock of a device, as the
// planners read them (GemmArgs::device): queried once per device and process, then served
// from a cache that any thread may read. A property the runtime does not report stays 0,
// which the planners read as the reference device's.
const DeviceInfo& device_info(int device);

// A launcher's status in words; for a kernel group that could not be compiled or loaded on
// first use (include/gemmt/deferred.h), why.
inline std::string launch_status_text(cudaError_t status) {
  std::string text = cudaGetErrorString(status);
  const char* why = deferred::failure();
  if (status == cudaErrorSharedObjectInitFailed && why[0] != '\0') text += std::string(": ") + why;
  return text;
}

// Turns a launcher's status into an error that names the op.
inline void check_launch(const char* op, cudaError_t status) {
  TORCH_CHECK(status == cudaSuccess, op,
              ": CUDA kernel launch failed: ", launch_status_text(status));
}
#endif

}  // namespace gemmt::wrapper
