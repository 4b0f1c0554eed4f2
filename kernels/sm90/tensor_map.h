// Tensor maps of the Hopper GEMM's operands (host code): the driver's encoder, fetched
// through the runtime so that nothing links libcuda. Used by the launcher (gemm_sm90.cu) and
// by benchmarks/experiments/tile_phases.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "common/gemm_tc_kind.h"
#include "plan/sm90_plan.h"

namespace gemmt {
namespace sm90 {

// A driver entry point; nullptr when the driver does not have it.
inline void* driver_entry_point(const char* name) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &status);
#else
  cudaError_t err = cudaGetDriverEntryPoint(name, &ptr, cudaEnableDefault, &status);
#endif
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
    if (err != cudaSuccess) (void)cudaGetLastError();
    return nullptr;
  }
  return ptr;
}

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(
      driver_entry_point("cuTensorMapEncodeTiled"));
  return fn;
}

// Runs `encode` (a tensor-map encoding, which returns whether the driver took it), retried once
// after making the current device's primary context current: the encoder is a driver call and
// needs a context on the calling thread, which a thread that has made no runtime call yet (an
// autograd backward thread) may not have.
template <typename Encode>
bool encode_with_context(Encode&& encode) {
  if (encode()) return true;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return encode();
}

// The 2-D map of an operand of kind `kind` (gemm_tc_kind.h) with the 128-byte swizzle the
// kernel's stages and staging buffers use; false when the driver refuses it.
inline bool encode_map(CUtensorMap* map, const void* ptr, const MapShape& s, int kind) {
  PFN_cuTensorMapEncodeTiled_v12000 fn = tensor_map_encoder();
  if (fn == nullptr) return false;
  const CUtensorMapDataType dtype = kind == kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                    : kind == kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const cuuint64_t dims[2] = {s.dims[0], s.dims[1]};
  const cuuint64_t strides[1] = {s.stride_bytes};
  const cuuint32_t box[2] = {s.box[0], s.box[1]};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode_with_context([&] {
    return fn(map, dtype, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
              CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  });
}

}  // namespace sm90
}  // namespace gemmt
