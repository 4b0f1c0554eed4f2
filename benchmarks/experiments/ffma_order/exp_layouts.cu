#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>
#include "gemm_simt_exp.cu"
using namespace gemmt;
using namespace gemmt::simt;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1);} } while (0)

__global__ void fill_random(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    p[i] = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

using CfgFat4 = PipeConfig<128, 256, 16, 64, 64, 16, 8, 4, 1>;

struct K { PipeKernel fn; int threads, smem; };
template <class Cfg, int AM, int BM, bool INTERIOR, int ORDER>
K kern() {
  constexpr PipeKernel f = &gemm_pipelined_kernel<float, Cfg, AM, BM, INTERIOR, false, ORDER>;
  KernelInfo i = kernel_info<f, Cfg::THREADS, Cfg::SMEM_BYTES>();
  CK(i.err);
  cudaFuncAttributes at; CK(cudaFuncGetAttributes(&at, f));
  std::printf("KERNEL bm=%d bn=%d stages=%d am=%d bm=%d interior=%d order=%d regs=%d\n", Cfg::BM, Cfg::BN, Cfg::STAGES, AM, BM, (int)INTERIOR, ORDER, at.numRegs);
  return K{f, Cfg::THREADS, Cfg::SMEM_BYTES};
}

// A grid of whole tiles (bm x bn) over the product, data-parallel.
cudaError_t launch(const GemmArgs& a, int bm, int bn, K kk) {
  PipeParams p{};
  p.a = a.a; p.sam = a.a_stride_m; p.sak = a.a_stride_k;
  p.b = a.b; p.sbk = a.b_stride_k; p.sbn = a.b_stride_n;
  p.m = a.m; p.n = a.n; p.k = a.k; p.c = a.c; p.ldc = a.ldc; p.alpha = 1.f; p.beta = 0.f;
  p.c_vec4 = true; p.partial = nullptr; p.partial_vec4 = true;
  p.k_per_split = a.k;
  p.tiles_m = static_cast<int>(a.m / bm); p.tiles_n = static_cast<int>(a.n / bn);
  kk.fn<<<static_cast<unsigned>(p.tiles_m * p.tiles_n), kk.threads, kk.smem>>>(p);
  return cudaGetLastError();
}

template <class F>
double median_ms(F&& f, int iters) {
  cudaEvent_t t0, t1; CK(cudaEventCreate(&t0)); CK(cudaEventCreate(&t1));
  for (int i = 0; i < 3; ++i) CK(f());
  std::vector<float> ms(iters);
  for (float& t : ms) { CK(cudaEventRecord(t0)); CK(f()); CK(cudaEventRecord(t1)); CK(cudaEventSynchronize(t1)); CK(cudaEventElapsedTime(&t, t0, t1)); }
  CK(cudaEventDestroy(t0)); CK(cudaEventDestroy(t1));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

typedef int (*CreateFn)(void**);
typedef int (*SgemmFn)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*, float*, int);

struct Layout { const char* name; bool a_t, b_t; };

struct Set { K fat0, fat3, med0, med3; };
template <int AM, int BM>
Set make_set() {
  return Set{kern<CfgFat4, AM, BM, true, 0>(), kern<CfgFat4, AM, BM, true, 3>(),
             kern<CfgMedium, AM, BM, true, 0>(), kern<CfgMedium, AM, BM, true, 3>()};
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  void* h = dlopen("libcublas.so.13", RTLD_NOW);
  if (!h) h = dlopen("libcublas.so", RTLD_NOW);
  if (!h) { std::printf("no cublas: %s\n", dlerror()); return 1; }
  auto create = reinterpret_cast<CreateFn>(dlsym(h, "cublasCreate_v2"));
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "cublasSgemm_v2"));
  void* handle = nullptr;
  if (create(&handle) != 0) { std::printf("cublasCreate failed\n"); return 1; }
  // A row-major (m x k): the loader reads along k (kVecK); A stored transposed: along m (kVecC).
  // B row-major (k x n): along n (kVecC); B stored transposed: along k (kVecK).
  const Set nn = make_set<kVecK, kVecC>(), tn = make_set<kVecC, kVecC>(), nt = make_set<kVecK, kVecK>(),
            tt = make_set<kVecC, kVecK>();
  const K gen3 = kern<CfgFat, kVecK, kVecC, false, 0>(), gen4 = kern<CfgFat4, kVecK, kVecC, false, 0>();
  const Layout layouts[4] = {{"nn", false, false}, {"tn", true, false}, {"nt", false, true}, {"tt", true, true}};
  const Set* sets[4] = {&nn, &tn, &nt, &tt};
  for (int64_t s : {1024, 2048, 4096, 8192}) {
    const int64_t m = s, n = s, k = s;
    float *da, *db, *dc;
    CK(cudaMalloc(&da, m * k * 4)); CK(cudaMalloc(&db, k * n * 4)); CK(cudaMalloc(&dc, m * n * 4));
    fill_random<<<1024, 256>>>(da, m * k, 1u); fill_random<<<1024, 256>>>(db, k * n, 2u); CK(cudaGetLastError());
    std::vector<float> href(m * n), hc(m * n);
    for (int li = 0; li < 4; ++li) {
      const Layout L = layouts[li];
      const Set& S = *sets[li];
      GemmArgs a; a.m = m; a.n = n; a.k = k; a.a = da; a.b = db; a.c = dc; a.ldc = n;
      a.a_stride_m = L.a_t ? 1 : k; a.a_stride_k = L.a_t ? m : 1;
      a.b_stride_k = L.b_t ? 1 : n; a.b_stride_n = L.b_t ? k : 1;
      const float one = 1.f, zero = 0.f;
      struct V { std::string name; std::function<cudaError_t()> f; };
      std::vector<V> vs = {
        {"cublas", [&] { return sgemm(handle, L.b_t ? 1 : 0, L.a_t ? 1 : 0, (int)n, (int)m, (int)k, &one, db, L.b_t ? (int)k : (int)n, da, L.a_t ? (int)m : (int)k, &zero, dc, (int)n) == 0 ? cudaSuccess : cudaErrorUnknown; }},
        {"fat4_o0", [&] { return launch(a, 128, 256, S.fat0); }},
        {"fat4_o3", [&] { return launch(a, 128, 256, S.fat3); }},
        {"med_o0", [&] { return launch(a, 64, 128, S.med0); }},
        {"med_o3", [&] { return launch(a, 64, 128, S.med3); }},
      };
      if (li == 0) {
        vs.push_back({"fatgen3_o0", [&] { return launch(a, 128, 256, gen3); }});
        vs.push_back({"fatgen4_o0", [&] { return launch(a, 128, 256, gen4); }});
      }
      CK(vs[0].f()); CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(href.data(), dc, m * n * 4, cudaMemcpyDeviceToHost));
      for (std::size_t v = 1; v < vs.size(); ++v) {
        CK(cudaMemset(dc, 0xff, m * n * 4));
        CK(vs[v].f()); CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hc.data(), dc, m * n * 4, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (int64_t i = 0; i < m * n; ++i) { const double d = double(hc[i]) - href[i]; num += d * d; den += double(href[i]) * href[i]; }
        std::printf("CHECK %5lld %s %-12s rel=%.3e%s\n", (long long)s, L.name, vs[v].name.c_str(), std::sqrt(num / den), std::sqrt(num / den) < 1e-5 ? "" : " BAD");
      }
      const int iters = s >= 8192 ? 8 : (s >= 4096 ? 15 : 30);
      std::vector<std::vector<double>> t(vs.size());
      for (int r = 0; r < rounds; ++r)
        for (std::size_t v = 0; v < vs.size(); ++v) t[v].push_back(median_ms(vs[v].f, iters));
      for (std::size_t v = 0; v < vs.size(); ++v) {
        std::vector<double> ratio;
        for (int r = 0; r < rounds; ++r) ratio.push_back(t[0][r] / t[v][r]);
        std::vector<double> tt2 = t[v];
        std::sort(tt2.begin(), tt2.end()); std::sort(ratio.begin(), ratio.end());
        std::printf("RES %5lld %s %-12s med %8.4f ms %6.2f TFLOP/s  vs cublas med %.4f [%.4f..%.4f]\n", (long long)s, L.name, vs[v].name.c_str(), tt2[rounds / 2], 2.0 * m * n * k / tt2[rounds / 2] / 1e9, ratio[rounds / 2], ratio.front(), ratio.back());
      }
    }
    CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dc));
  }
  return 0;
}
