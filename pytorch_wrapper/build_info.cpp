// What this binary was built with, as JSON, so Python can report it without parsing.
#include <torch/version.h>

#include <sstream>

#include "gemmt/deferred.h"
#include "ops.h"

#ifdef GEMMT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef GEMMT_CUDA_ARCHITECTURES
#define GEMMT_CUDA_ARCHITECTURES ""
#endif
#ifndef GEMMT_BUILD_SYSTEM
#define GEMMT_BUILD_SYSTEM "unknown"
#endif
#ifndef GEMMT_VERSION
#define GEMMT_VERSION "0.0.0"
#endif

namespace gemmt::wrapper {

std::string build_info_json() {
  std::ostringstream s;
  s << "{\"version\": \"" << GEMMT_VERSION << "\"";
  s << ", \"build_system\": \"" << GEMMT_BUILD_SYSTEM << "\"";
  s << ", \"torch_version\": \"" << TORCH_VERSION << "\"";
#ifdef GEMMT_WITH_CUDA
  s << ", \"cuda\": true, \"cuda_version\": \"" << CUDART_VERSION / 1000 << "."
    << (CUDART_VERSION % 1000) / 10 << "\"";
  s << ", \"cuda_architectures\": \"" << GEMMT_CUDA_ARCHITECTURES << "\"";
#ifdef GEMMT_HAS_SM90A
  s << ", \"sm90a_kernels\": true";
#else
  s << ", \"sm90a_kernels\": false";
#endif
  s << ", \"deferred_groups\": \"" << deferred::groups() << "\"";
#else
  s << ", \"cuda\": false, \"cuda_version\": null, \"cuda_architectures\": \"\"";
  s << ", \"sm90a_kernels\": false, \"deferred_groups\": \"\"";
#endif
#if defined(__clang__)
  s << ", \"compiler\": \"clang " << __clang_major__ << "." << __clang_minor__ << "\"";
#elif defined(__GNUC__)
  s << ", \"compiler\": \"gcc " << __GNUC__ << "." << __GNUC_MINOR__ << "." << __GNUC_PATCHLEVEL__
    << "\"";
#else
  s << ", \"compiler\": \"unknown\"";
#endif
#ifdef __CUDACC_VER_MAJOR__
  s << ", \"nvcc\": \"" << __CUDACC_VER_MAJOR__ << "." << __CUDACC_VER_MINOR__ << "\"";
#endif
  s << "}";
  return s.str();
}

}  // namespace gemmt::wrapper
