// Instantiates the pipelined kernel (ladder_5_pipelined.cuh) for one dtype and tile shape and
// answers for its instances: included by the pipelined_<dtype>_<tile>.cu translation units
// only, so each compiles its own share of the instances.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

#include "simt/ladder_5_pipelined.cuh"
#include "simt/launchers.h"

namespace gemmt {
namespace simt {
namespace {

template <class T>
constexpr ScalarType kDtypeOf = std::is_same<T, float>::value    ? ScalarType::kFloat32
                                : std::is_same<T, __half>::value ? ScalarType::kFloat16
                                                                 : ScalarType::kBFloat16;

// Raises the dynamic shared-memory limit of one kernel instance and records its occupancy,
// once per device (the attribute belongs to the per-device function object). call_once makes
// the answer visible to every thread that asks later.
template <auto K, int THREADS, int SMEM>
PipeKernel kernel_info() {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static PipeKernel info[kMaxDevices];
  auto query = [] {
    PipeKernel r;
    r.fn = reinterpret_cast<const void*>(K);
    cudaError_t err = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, K, THREADS, SMEM);
    if (err == cudaSuccess && r.blocks_per_sm < 1) err = cudaErrorInvalidConfiguration;
    r.error = static_cast<int>(err);
    return r;
  };
  int dev = 0;
  const cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) {
    PipeKernel r;
    r.error = static_cast<int>(e);
    return r;
  }
  if (dev < 0 || dev >= kMaxDevices) return query();
  std::call_once(once[dev], [&] { info[dev] = query(); });
  return info[dev];
}

template <class T, PipeTile TILE, int AM, int BM, bool INTERIOR, bool STREAMK, LoaderSet SET>
PipeKernel instance() {
  if constexpr (pipe_instance_built(kDtypeOf<T>, TILE, static_cast<LoadMode>(AM),
                                    static_cast<LoadMode>(BM), INTERIOR, STREAMK) &&
                in_loader_set(SET, AM, BM)) {
    using Cfg = CfgOf<TILE, INTERIOR>;
    constexpr auto fn = &gemm_pipelined_kernel<T, Cfg, AM, BM, INTERIOR, STREAMK>;
    return kernel_info<fn, Cfg::THREADS, Cfg::SMEM_BYTES>();
  } else {
    return PipeKernel{};
  }
}

template <class T, PipeTile TILE, int AM, int BM, bool INTERIOR, LoaderSet SET>
PipeKernel instance(bool stream_k) {
  return stream_k ? instance<T, TILE, AM, BM, INTERIOR, true, SET>()
                  : instance<T, TILE, AM, BM, INTERIOR, false, SET>();
}

// The instance of (T, TILE, INTERIOR) in SET and A's loader mode AM for B's loader mode b.
template <class T, PipeTile TILE, bool INTERIOR, int AM, LoaderSet SET>
PipeKernel pipe_kernel_of_a(LoadMode b, bool stream_k) {
  return with_load_mode(b, [&](auto bm) {
    return instance<T, TILE, AM, decltype(bm)::value, INTERIOR, SET>(stream_k);
  });
}

// The instance of (T, TILE, INTERIOR) in SET for the loader modes a and b; an empty
// PipeKernel when it is not compiled here (pipe_instance_built, in_loader_set).
template <class T, PipeTile TILE, bool INTERIOR, LoaderSet SET = LoaderSet::kAll>
PipeKernel pipe_kernel_of(LoadMode a, LoadMode b, bool stream_k) {
  return with_load_mode(a, [&](auto am) {
    return pipe_kernel_of_a<T, TILE, INTERIOR, decltype(am)::value, SET>(b, stream_k);
  });
}

}  // namespace

// The instances of one A loader mode (launchers.h: pipe_kernel_a), explicitly instantiated by
// the pipelined_<dtype>_<tile>_a_<mode>.cu translation units.
template <ScalarType kT, PipeTile kTile, bool kInterior, int kAMode, LoaderSet kSet>
PipeKernel pipe_kernel_a(LoadMode b, bool stream_k) {
  using T =
      std::conditional_t<kT == ScalarType::kFloat32, float,
                         std::conditional_t<kT == ScalarType::kFloat16, __half, __nv_bfloat16>>;
  return pipe_kernel_of_a<T, kTile, kInterior, kAMode, kSet>(b, stream_k);
}

}  // namespace simt
}  // namespace gemmt
