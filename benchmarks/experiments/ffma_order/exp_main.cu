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

using CfgFat8s4 = PipeConfig<128, 256, 8, 64, 64, 16, 8, 4, 1>;
using CfgFat8s5 = PipeConfig<128, 256, 8, 64, 64, 16, 8, 5, 1>;
using CfgFat16s4 = PipeConfig<128, 256, 16, 64, 64, 16, 8, 4, 1>;

struct K { PipeKernel fn; int threads, smem; };
template <class Cfg, int ORDER, bool SK>
K kern() {
  constexpr PipeKernel f = &gemm_pipelined_kernel<float, Cfg, kVecK, kVecC, true, SK, ORDER>;
  KernelInfo i = kernel_info<f, Cfg::THREADS, Cfg::SMEM_BYTES>();
  CK(i.err);
  cudaFuncAttributes at; CK(cudaFuncGetAttributes(&at, f));
  std::printf("KERNEL bk=%d stages=%d order=%d sk=%d regs=%d blocks/sm=%d\n", Cfg::BK, Cfg::STAGES, ORDER, SK, at.numRegs, i.blocks_per_sm);
  return K{f, Cfg::THREADS, Cfg::SMEM_BYTES};
}

enum { kDP, kTwo, kMerged, kSkOnly, kDpPart };

PipeParams make_params(const GemmArgs& a, const PipePlan& plan, float* ws, int bk) {
  PipeParams p{};
  p.a = a.a; p.sam = a.a_stride_m; p.sak = a.a_stride_k;
  p.b = a.b; p.sbk = a.b_stride_k; p.sbn = a.b_stride_n;
  p.m = a.m; p.n = a.n; p.k = a.k; p.c = a.c; p.ldc = a.ldc; p.alpha = 1.f; p.beta = 0.f;
  p.c_vec4 = true; p.partial = nullptr; p.partial_vec4 = true;
  p.k_per_split = (a.k + bk - 1) / bk * bk;
  p.tiles_m = plan.tiles_m; p.tiles_n = plan.tiles_n;
  const int64_t tiles = int64_t{plan.tiles_m} * plan.tiles_n;
  StreamKParams& s = p.sk;
  s.blocks = plan.sk_blocks;
  s.first_tile = static_cast<int>(tiles - plan.sk_tiles);
  s.k_tiles = static_cast<int>((a.k + bk - 1) / bk);
  s.iters = plan.sk_iters; s.extra = plan.sk_extra;
  s.arrivals = reinterpret_cast<int*>(ws);
  const std::size_t counters = (static_cast<std::size_t>(plan.sk_tiles) * 4 + 255) / 256 * 256;
  s.slots = reinterpret_cast<float*>(reinterpret_cast<char*>(ws) + counters);
  return p;
}

cudaError_t launch(const GemmArgs& a, const PipePlan& plan, float* ws, K dp, K sk, int mode, int bk) {
  PipeParams p = make_params(a, plan, ws, bk);
  const int64_t tiles = int64_t{plan.tiles_m} * plan.tiles_n;
  if (mode == kDP) {
    dp.fn<<<static_cast<unsigned>(tiles), dp.threads, dp.smem>>>(p);
    return cudaGetLastError();
  }
  if (mode != kDpPart && !(mode == kTwo && plan.sk_blocks == 0)) {
    cudaError_t e = cudaMemsetAsync(p.sk.arrivals, 0, static_cast<std::size_t>(plan.sk_tiles) * 4, 0);
    if (e) return e;
    const int64_t grid = mode == kMerged ? plan.sk_blocks + tiles - plan.sk_tiles : plan.sk_blocks;
    sk.fn<<<static_cast<unsigned>(grid), sk.threads, sk.smem>>>(p);
    e = cudaGetLastError();
    if (e || mode != kTwo) return e;
  }
  if (tiles == plan.sk_tiles) return cudaSuccess;
  dp.fn<<<static_cast<unsigned>(tiles - plan.sk_tiles), dp.threads, dp.smem>>>(p);
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

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  void* h = dlopen("libcublas.so.13", RTLD_NOW);
  if (!h) h = dlopen("libcublas.so", RTLD_NOW);
  if (!h) { std::printf("no cublas: %s\n", dlerror()); return 1; }
  auto create = reinterpret_cast<CreateFn>(dlsym(h, "cublasCreate_v2"));
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "cublasSgemm_v2"));
  void* handle = nullptr;
  if (create(&handle) != 0) { std::printf("cublasCreate failed\n"); return 1; }
  int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  K f0 = kern<CfgFat, 0, false>(), f3 = kern<CfgFat, 3, false>(), f8 = kern<CfgFat, 8, false>(),
    f9 = kern<CfgFat, 9, false>(), f10 = kern<CfgFat, 10, false>(), f3s4 = kern<CfgFat16s4, 3, false>(),
    f3bk8s5 = kern<CfgFat8s5, 3, false>();
  K fsk0 = kern<CfgFat, 0, true>(), fsk3 = kern<CfgFat, 3, true>(), fsk3s4 = kern<CfgFat16s4, 3, true>();
  K m0 = kern<CfgMedium, 0, false>(), m3 = kern<CfgMedium, 3, false>(), m1 = kern<CfgMedium, 1, false>();
  K msk0 = kern<CfgMedium, 0, true>(), msk3 = kern<CfgMedium, 3, true>();
  for (int64_t s : {1024, 2048, 4096, 6144, 8192}) {
    const int64_t m = s, n = s, k = s;
    float *da, *db, *dc, *dref;
    CK(cudaMalloc(&da, m * k * 4)); CK(cudaMalloc(&db, k * n * 4)); CK(cudaMalloc(&dc, m * n * 4)); CK(cudaMalloc(&dref, m * n * 4));
    fill_random<<<1024, 256>>>(da, m * k, 1u); fill_random<<<1024, 256>>>(db, k * n, 2u); CK(cudaGetLastError());
    GemmArgs a; a.m = m; a.n = n; a.k = k; a.a = da; a.a_stride_m = k; a.a_stride_k = 1; a.b = db; a.b_stride_k = n; a.b_stride_n = 1;
    a.c = dc; a.ldc = n; a.sm_count = sms;
    PipePlan pdp = plan_pipelined<float>(a, false, 3, true, 0);
    PipePlan psk = plan_pipelined<float>(a, false, 3, true, 1);
    PipePlan pauto = plan_pipelined<float>(a, false, 3, true, -1);
    PipePlan mdp = plan_pipelined<float>(a, false, 1, true, 0);
    PipePlan msk = plan_pipelined<float>(a, false, 1, true, 1);
    PipePlan mauto = plan_pipelined<float>(a, false, 1, true, -1);
    std::printf("SIZE %lld fat sk forced %d/%d auto %d/%d; medium sk forced %d/%d auto %d/%d\n", (long long)s, psk.sk_tiles, psk.sk_blocks, pauto.sk_tiles, pauto.sk_blocks, msk.sk_tiles, msk.sk_blocks, mauto.sk_tiles, mauto.sk_blocks);
    float* ws = nullptr;
    CK(cudaMalloc(&ws, std::max(streamk_workspace_bytes(psk), streamk_workspace_bytes(msk)) + 1024));
    struct V { std::string name; std::function<cudaError_t()> f; };
    const float one = 1.f, zero = 0.f;
    std::vector<V> vs = {
      {"cublas", [&] { return sgemm(handle, 0, 0, (int)n, (int)m, (int)k, &one, db, (int)n, da, (int)k, &zero, dc, (int)n) == 0 ? cudaSuccess : cudaErrorUnknown; }},
      {"fat_dp_o0", [&] { return launch(a, pdp, ws, f0, f0, kDP, 16); }},
      {"fat_dp_o3", [&] { return launch(a, pdp, ws, f3, f3, kDP, 16); }},
      {"fat_dp_o8", [&] { return launch(a, pdp, ws, f8, f8, kDP, 16); }},
      {"fat_dp_o9", [&] { return launch(a, pdp, ws, f9, f9, kDP, 16); }},
      {"fat_dp_o10", [&] { return launch(a, pdp, ws, f10, f10, kDP, 16); }},
      {"fat_dp_o3s4", [&] { return launch(a, pdp, ws, f3s4, f3s4, kDP, 16); }},
      {"fat_dp_o3bk8s5", [&] { return launch(a, pdp, ws, f3bk8s5, f3bk8s5, kDP, 8); }},
      {"fat_skauto_o0", [&] { return launch(a, pauto, ws, f0, fsk0, kTwo, 16); }},
      {"fat_skauto_o3", [&] { return launch(a, pauto, ws, f3, fsk3, kTwo, 16); }},
      {"fat_skauto_o3s4", [&] { return launch(a, pauto, ws, f3s4, fsk3s4, kTwo, 16); }},
      {"fat_skforced_o0", [&] { return launch(a, psk, ws, f0, fsk0, kTwo, 16); }},
      {"fat_skforced_o3", [&] { return launch(a, psk, ws, f3, fsk3, kTwo, 16); }},
      {"fat_skforced_o3s4", [&] { return launch(a, psk, ws, f3s4, fsk3s4, kTwo, 16); }},
      {"fat_skinst_dp_o0", [&] { PipePlan q = psk; q.sk_tiles = 0; q.sk_blocks = 0; return launch(a, q, ws, f0, fsk0, kMerged, 16); }},
      {"fat_skinst_dp_o3", [&] { PipePlan q = psk; q.sk_tiles = 0; q.sk_blocks = 0; return launch(a, q, ws, f3, fsk3, kMerged, 16); }},
      {"med_dp_o0", [&] { return launch(a, mdp, ws, m0, m0, kDP, 16); }},
      {"med_dp_o1", [&] { return launch(a, mdp, ws, m1, m1, kDP, 16); }},
      {"med_dp_o3", [&] { return launch(a, mdp, ws, m3, m3, kDP, 16); }},
      {"med_skforced_o0", [&] { return launch(a, msk, ws, m0, msk0, kTwo, 16); }},
      {"med_skforced_o3", [&] { return launch(a, msk, ws, m3, msk3, kTwo, 16); }},
    };
    // correctness: every full variant bit-identical to production DP (same k order per element)
    CK(vs[0].f()); CK(cudaMemcpy(dref, dc, m * n * 4, cudaMemcpyDeviceToDevice)); CK(cudaDeviceSynchronize());
    std::vector<float> href(m * n), hc(m * n);
    CK(cudaMemcpy(href.data(), dref, m * n * 4, cudaMemcpyDeviceToHost));
    for (std::size_t v = 1; v < vs.size(); ++v) {
      
      CK(cudaMemset(dc, 0xff, m * n * 4));
      CK(vs[v].f()); CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(hc.data(), dc, m * n * 4, cudaMemcpyDeviceToHost));
      const bool same = std::memcmp(hc.data(), href.data(), m * n * 4) == 0;
      double num = 0, den = 0; for (int64_t i = 0; i < m * n; ++i) { double d = double(hc[i]) - href[i]; num += d * d; den += double(href[i]) * href[i]; }
      if (!same) std::printf("CHECK %lld %-18s rel=%.3e vs cublas\n", (long long)s, vs[v].name.c_str(), std::sqrt(num / den));
      std::printf("CHECK %lld %-18s %s\n", (long long)s, vs[v].name.c_str(), same ? "identical-to-cublas" : "differs-from-cublas");
    }
    const int iters = s >= 8192 ? 8 : (s >= 4096 ? 15 : 30);
    std::vector<std::vector<double>> t(vs.size());
    for (int r = 0; r < rounds; ++r)
      for (std::size_t v = 0; v < vs.size(); ++v) t[v].push_back(median_ms(vs[v].f, iters));
    for (std::size_t v = 0; v < vs.size(); ++v) {
      std::vector<double> ratio;
      for (int r = 0; r < rounds; ++r) ratio.push_back(t[0][r] / t[v][r]);
      std::vector<double> tt = t[v];
      std::sort(tt.begin(), tt.end()); std::sort(ratio.begin(), ratio.end());
      std::printf("RES %5lld %-18s med %8.4f ms %6.2f TFLOP/s  vs cublas med %.4f [%.4f..%.4f]\n", (long long)s, vs[v].name.c_str(), tt[rounds / 2], 2.0 * m * n * k / tt[rounds / 2] / 1e9, ratio[rounds / 2], ratio.front(), ratio.back());
    }
    CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dc)); CK(cudaFree(dref)); CK(cudaFree(ws));
  }
  return 0;
}
