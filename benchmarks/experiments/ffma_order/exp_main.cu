// Runs 1-2 of the FFMA-order experiment (see README.md): the 128x256 and 64x128 interior
// kernels, nn layout, data-parallel and stream-k, against cublasSgemm.
#include "exp_common.cuh"

using CfgFat8s4 = PipeConfig<128, 256, 8, 64, 64, 16, 8, 4, 1>;
using CfgFat8s5 = PipeConfig<128, 256, 8, 64, 64, 16, 8, 5, 1>;
using CfgFat16s4 = PipeConfig<128, 256, 16, 64, 64, 16, 8, 4, 1>;

template <class Cfg, int ORDER, bool SK>
K kern() {
  char what[96];
  std::snprintf(what, sizeof what, "bk=%d stages=%d order=%d sk=%d", Cfg::BK, Cfg::STAGES, ORDER,
                static_cast<int>(SK));
  return register_kernel<&gemm_pipelined_kernel<float, Cfg, kVecK, kVecC, true, SK, ORDER>, Cfg>(
      what);
}

// kDP: one data-parallel grid; kTwo: stream-k launch, then the grid of the other tiles;
// kMerged: one stream-k launch whose blocks after the stream-k ones run whole tiles.
enum { kDP, kTwo, kMerged };

PipeParams make_params(const GemmArgs& a, const PipePlan& plan, float* ws, int bk) {
  PipeParams p = whole_tile_params(a, plan.tiles_m, plan.tiles_n, bk);
  StreamKParams& s = p.sk;
  s.blocks = plan.sk_blocks;
  s.first_tile = plan.tiles_m * plan.tiles_n - plan.sk_tiles;
  s.k_tiles = static_cast<int>((a.k + bk - 1) / bk);
  s.iters = plan.sk_iters;
  s.extra = plan.sk_extra;
  s.arrivals = reinterpret_cast<int*>(ws);
  const std::size_t counters = (static_cast<std::size_t>(plan.sk_tiles) * 4 + 255) / 256 * 256;
  s.slots = reinterpret_cast<float*>(reinterpret_cast<char*>(ws) + counters);
  return p;
}

cudaError_t launch(const GemmArgs& a, const PipePlan& plan, float* ws, K dp, K sk, int mode,
                   int bk) {
  const PipeParams p = make_params(a, plan, ws, bk);
  const int64_t tiles = int64_t{plan.tiles_m} * plan.tiles_n;
  if (mode == kDP) {
    dp.fn<<<static_cast<unsigned>(tiles), dp.threads, dp.smem>>>(p);
    return cudaGetLastError();
  }
  if (!(mode == kTwo && plan.sk_blocks == 0)) {
    cudaError_t e =
        cudaMemsetAsync(p.sk.arrivals, 0, static_cast<std::size_t>(plan.sk_tiles) * 4, 0);
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

// The stream-k instance alone on every tile, as whole tiles (its main loop timed by itself).
cudaError_t whole_tiles_on_streamk_instance(const GemmArgs& a, PipePlan plan, float* ws, K dp,
                                            K sk) {
  plan.sk_tiles = 0;
  plan.sk_blocks = 0;
  return launch(a, plan, ws, dp, sk, kMerged, 16);
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const Cublas cublas = Cublas::load();

  K f0 = kern<CfgFat, 0, false>(), f3 = kern<CfgFat, 3, false>(), f8 = kern<CfgFat, 8, false>(),
    f9 = kern<CfgFat, 9, false>(), f10 = kern<CfgFat, 10, false>(),
    f3s4 = kern<CfgFat16s4, 3, false>(), f3bk8s5 = kern<CfgFat8s5, 3, false>();
  K fsk0 = kern<CfgFat, 0, true>(), fsk3 = kern<CfgFat, 3, true>(),
    fsk3s4 = kern<CfgFat16s4, 3, true>();
  K m0 = kern<CfgMedium, 0, false>(), m3 = kern<CfgMedium, 3, false>(),
    m1 = kern<CfgMedium, 1, false>();
  K msk0 = kern<CfgMedium, 0, true>(), msk3 = kern<CfgMedium, 3, true>();
  for (int64_t s : {1024, 2048, 4096, 6144, 8192}) {
    const int64_t m = s, n = s, k = s;
    const Operands ops(m, n, k);
    float *da = ops.a, *db = ops.b, *dc = ops.c;
    const GemmArgs a = square_args(ops, s, false, false);
    const PipePlan pdp = plan_pipelined<float>(a, false, 3, true, 0);
    const PipePlan psk = plan_pipelined<float>(a, false, 3, true, 1);
    const PipePlan pauto = plan_pipelined<float>(a, false, 3, true, -1);
    const PipePlan mdp = plan_pipelined<float>(a, false, 1, true, 0);
    const PipePlan msk = plan_pipelined<float>(a, false, 1, true, 1);
    const PipePlan mauto = plan_pipelined<float>(a, false, 1, true, -1);
    std::printf("SIZE %lld fat sk forced %d/%d auto %d/%d; medium sk forced %d/%d auto %d/%d\n",
                static_cast<long long>(s), psk.sk_tiles, psk.sk_blocks, pauto.sk_tiles,
                pauto.sk_blocks, msk.sk_tiles, msk.sk_blocks, mauto.sk_tiles, mauto.sk_blocks);
    float* ws = nullptr;
    CK(cudaMalloc(&ws,
                  std::max(streamk_workspace_bytes(psk), streamk_workspace_bytes(msk)) + 1024));
    const std::vector<Variant> vs = {
        {"cublas", [&] { return cublas.run(0, 0, m, n, k, db, n, da, k, dc); }},
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
        {"fat_skinst_dp_o0", [&] { return whole_tiles_on_streamk_instance(a, psk, ws, f0, fsk0); }},
        {"fat_skinst_dp_o3", [&] { return whole_tiles_on_streamk_instance(a, psk, ws, f3, fsk3); }},
        {"med_dp_o0", [&] { return launch(a, mdp, ws, m0, m0, kDP, 16); }},
        {"med_dp_o1", [&] { return launch(a, mdp, ws, m1, m1, kDP, 16); }},
        {"med_dp_o3", [&] { return launch(a, mdp, ws, m3, m3, kDP, 16); }},
        {"med_skforced_o0", [&] { return launch(a, msk, ws, m0, msk0, kTwo, 16); }},
        {"med_skforced_o3", [&] { return launch(a, msk, ws, m3, msk3, kTwo, 16); }},
    };
    // Every data-parallel variant adds each element's products in k order with FMAs, as
    // cuBLAS's FP32 kernel does: bit-identical outputs; stream-k ones differ by the order of
    // the partial sums. Outputs are NaN-poisoned before each checked run.
    const std::vector<float> href = reference_output(vs[0], dc, m * n);
    for (std::size_t v = 1; v < vs.size(); ++v) {
      const Comparison cmp = compare_output(vs[v], dc, href);
      const bool same = cmp.same;
      if (!same)
        std::printf("CHECK %lld %-18s rel=%.3e vs cublas\n", static_cast<long long>(s),
                    vs[v].name.c_str(), cmp.rel);
      std::printf("CHECK %lld %-18s %s\n", static_cast<long long>(s), vs[v].name.c_str(),
                  same ? "identical-to-cublas" : "differs-from-cublas");
    }
    char label[32];
    std::snprintf(label, sizeof label, "%5lld", static_cast<long long>(s));
    report(label, 18, vs, rounds, s >= 8192 ? 8 : (s >= 4096 ? 15 : 30), 2.0 * m * n * k);
    CK(cudaFree(ws));
  }
  return 0;
}
