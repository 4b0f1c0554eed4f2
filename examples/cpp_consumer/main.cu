// C = A @ B on the GPU through gemmt's kernel library (gemmt::kernels), checked against a
// CPU loop. Exit status: 0 the product matches, 1 it does not, 2 no usable GPU or a CUDA error.
#include <cuda_runtime.h>
#include <gemmt/gemm.h>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

bool ok(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
  return false;
}

}  // namespace

int main() {
  constexpr int64_t m = 100, n = 70, k = 300;
  std::vector<float> a(m * k), b(k * n), c(m * n, 0.f), ref(m * n, 0.f);
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<float>((i * 37) % 101) / 101.f - 0.5f;
  for (int64_t i = 0; i < k * n; ++i) b[i] = static_cast<float>((i * 53) % 97) / 97.f - 0.5f;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(a[i * k + p]) * b[p * n + j];
      ref[i * n + j] = static_cast<float>(s);
    }

  int device = 0;
  cudaDeviceProp prop{};
  if (!ok(cudaGetDevice(&device), "cudaGetDevice") ||
      !ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties")) {
    return 2;
  }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  if (!ok(cudaMalloc(&da, a.size() * sizeof(float)), "cudaMalloc") ||
      !ok(cudaMalloc(&db, b.size() * sizeof(float)), "cudaMalloc") ||
      !ok(cudaMalloc(&dc, c.size() * sizeof(float)), "cudaMalloc")) {
    return 2;
  }
  if (!ok(cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice), "copy A") ||
      !ok(cudaMemcpy(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice), "copy B")) {
    return 2;
  }

  // Row-major A (m x k), B (k x n) and C (m x n), as gemm.h describes them.
  gemmt::GemmArgs args;
  args.m = m, args.n = n, args.k = k;
  args.a = da, args.a_stride_m = k, args.a_stride_k = 1;
  args.b = db, args.b_stride_k = n, args.b_stride_n = 1;
  args.c = dc, args.ldc = n;
  args.dtype = gemmt::ScalarType::kFloat32;
  args.sm_count = prop.multiProcessorCount;
  args.cc_major = prop.major, args.cc_minor = prop.minor;

  const gemmt::GemmVariant variant = gemmt::gemm_pick(args);
  void* workspace = nullptr;
  const std::size_t ws_bytes = gemmt::gemm_workspace_bytes(args, variant);
  if (ws_bytes > 0 && !ok(cudaMalloc(&workspace, ws_bytes), "cudaMalloc workspace")) return 2;
  if (!ok(gemmt::gemm_run(args, variant, workspace, nullptr), "gemm_run") ||
      !ok(cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost),
          "cudaMemcpy")) {
    return 2;
  }

  // Exact FP32 products accumulated in float32: well within 1e-4 of the double sum here.
  double worst = 0;
  for (int64_t i = 0; i < m * n; ++i) worst = std::fmax(worst, std::fabs(c[i] - ref[i]));
  std::printf("gemmt %s on %s: %lldx%lldx%lld fp32, max |gpu - cpu| = %.3g\n",
              gemmt::gemm_variant_name(variant), prop.name, static_cast<long long>(m),
              static_cast<long long>(n), static_cast<long long>(k), worst);
  cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(workspace);
  return worst <= 1e-4 ? 0 : 1;
}
