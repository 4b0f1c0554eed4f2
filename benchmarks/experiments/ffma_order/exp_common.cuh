// Shared by the experiment programs (exp_main.cu, exp_layouts.cu): the kernel file with its
// variant parameter (gemm_simt_exp.cu, written by make_variants.py), error checks, operands,
// cuBLAS loaded at run time and the timing report (random values and CUDA-event timing come
// from tests/cuda/bench_util.cuh, as in the SIMT self-test's benchmarks).
#pragma once
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.cuh"  // tests/cuda: random operands, timing
#include "gemm_simt_exp.cu"

using namespace gemmt;
using namespace gemmt::simt;
using gemmt_bench::fill_random;
using gemmt_bench::median_ms;

#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// Random A (m x k), B (k x n) and an output C (m x n) on the device.
struct Operands {
  float *a = nullptr, *b = nullptr, *c = nullptr;
  Operands(int64_t m, int64_t n, int64_t k) {
    CK(cudaMalloc(&a, m * k * 4));
    CK(cudaMalloc(&b, k * n * 4));
    CK(cudaMalloc(&c, m * n * 4));
    fill_random<<<1024, 256>>>(a, m * k, 1u);
    fill_random<<<1024, 256>>>(b, k * n, 2u);
    CK(cudaGetLastError());
  }
  ~Operands() {
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;
};

// The product C = A @ B of `ops` (m = n = k = s); a_t / b_t: A / B stored transposed.
inline GemmArgs square_args(const Operands& ops, int64_t s, bool a_t, bool b_t) {
  GemmArgs g;
  g.m = g.n = g.k = s;
  g.a = ops.a;
  g.b = ops.b;
  g.c = ops.c;
  g.ldc = s;
  g.a_stride_m = a_t ? 1 : s;
  g.a_stride_k = a_t ? s : 1;
  g.b_stride_k = b_t ? 1 : s;
  g.b_stride_n = b_t ? s : 1;
  CK(cudaDeviceGetAttribute(&g.sm_count, cudaDevAttrMultiProcessorCount, 0));
  return g;
}

// One kernel instance with its launch shape.
struct K {
  PipeKernel fn;
  int threads, smem;
};

// Raises the instance's shared-memory limit and prints its register count.
template <PipeKernel F, class Cfg>
K register_kernel(const char* what) {
  const KernelInfo i = kernel_info<F, Cfg::THREADS, Cfg::SMEM_BYTES>();
  CK(i.err);
  cudaFuncAttributes at;
  CK(cudaFuncGetAttributes(&at, F));
  std::printf("KERNEL %s regs=%d blocks/sm=%d\n", what, at.numRegs, i.blocks_per_sm);
  return K{F, Cfg::THREADS, Cfg::SMEM_BYTES};
}

// The kernel parameters of a product, with tiles_m x tiles_n tiles and k in one slice of
// whole k-tiles of bk (stream-k fields left to the caller).
inline PipeParams whole_tile_params(const GemmArgs& a, int tiles_m, int tiles_n, int bk) {
  PipeParams p{};
  p.a = a.a;
  p.sam = a.a_stride_m;
  p.sak = a.a_stride_k;
  p.b = a.b;
  p.sbk = a.b_stride_k;
  p.sbn = a.b_stride_n;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.c = a.c;
  p.ldc = a.ldc;
  p.alpha = 1.f;
  p.beta = 0.f;
  p.c_vec4 = true;
  p.partial_vec4 = true;
  p.k_per_split = (a.k + bk - 1) / bk * bk;
  p.tiles_m = tiles_m;
  p.tiles_n = tiles_n;
  return p;
}

// cublasSgemm (plain FP32), loaded at run time so that the programs build without cuBLAS.
struct Cublas {
  using CreateFn = int (*)(void**);
  using SgemmFn = int (*)(void*, int, int, int, int, int, const float*, const float*, int,
                          const float*, int, const float*, float*, int);
  void* handle = nullptr;
  SgemmFn sgemm = nullptr;

  static Cublas load() {
    void* h = dlopen("libcublas.so.13", RTLD_NOW);
    if (!h) h = dlopen("libcublas.so", RTLD_NOW);
    if (!h) {
      std::printf("no cublas: %s\n", dlerror());
      std::exit(1);
    }
    Cublas c;
    auto create = reinterpret_cast<CreateFn>(dlsym(h, "cublasCreate_v2"));
    c.sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "cublasSgemm_v2"));
    if (create == nullptr || c.sgemm == nullptr || create(&c.handle) != 0) {
      std::printf("cublasCreate failed\n");
      std::exit(1);
    }
    return c;
  }

  // Row-major C (m x n) = A @ B, as the column-major C^T = B^T A^T (op 1 = transposed).
  cudaError_t run(int op_b, int op_a, int64_t m, int64_t n, int64_t k, const float* b, int64_t ldb,
                  const float* a, int64_t lda, float* c) const {
    const float one = 1.f, zero = 0.f;
    return sgemm(handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                 &one, b, static_cast<int>(ldb), a, static_cast<int>(lda), &zero, c,
                 static_cast<int>(n)) == 0
               ? cudaSuccess
               : cudaErrorUnknown;
  }
};

struct Variant {
  std::string name;
  std::function<cudaError_t()> f;
};

// Output of variant v (run once on a NaN-poisoned C of `count` floats) against the reference
// output `ref` (host copy): bitwise equality and Frobenius relative error.
struct Comparison {
  bool same;
  double rel;
};
inline Comparison compare_output(const Variant& v, float* c, const std::vector<float>& ref) {
  const std::size_t count = ref.size();
  std::vector<float> out(count);
  CK(cudaMemset(c, 0xff, count * 4));
  CK(v.f());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(out.data(), c, count * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const double d = double(out[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return Comparison{std::memcmp(out.data(), ref.data(), count * 4) == 0, std::sqrt(num / den)};
}

// The reference output: variant 0 run once, copied to the host.
inline std::vector<float> reference_output(const Variant& v, const float* c, std::size_t count) {
  std::vector<float> ref(count);
  CK(v.f());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(ref.data(), c, count * 4, cudaMemcpyDeviceToHost));
  return ref;
}

// Times every variant in `rounds` interleaved rounds and prints, per variant, its median time
// and its median (lowest, highest) per-round ratio to variant 0, the reference.
inline void report(const char* label, int name_width, const std::vector<Variant>& vs, int rounds,
                   int iters, double flops) {
  std::vector<std::vector<double>> t(vs.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t v = 0; v < vs.size(); ++v) t[v].push_back(median_ms(vs[v].f, iters));
  for (std::size_t v = 0; v < vs.size(); ++v) {
    std::vector<double> ratio;
    for (int r = 0; r < rounds; ++r) ratio.push_back(t[0][r] / t[v][r]);
    std::vector<double> tv = t[v];
    std::sort(tv.begin(), tv.end());
    std::sort(ratio.begin(), ratio.end());
    std::printf("RES %s %-*s med %8.4f ms %6.2f TFLOP/s  vs cublas med %.4f [%.4f..%.4f]\n", label,
                name_width, vs[v].name.c_str(), tv[rounds / 2], flops / tv[rounds / 2] / 1e9,
                ratio[rounds / 2], ratio.front(), ratio.back());
  }
}
