// Run 3 of the FFMA-order experiment (see README.md): the 128x256 (four stages) and 64x128
// interior kernels with FFMA orders 0 and 3 in every operand layout, and the 128x256 general
// kernel with three and four stages, data-parallel, against cublasSgemm in the same layout.
#include "exp_common.cuh"

using CfgFat4 = PipeConfig<128, 256, 16, 64, 64, 16, 8, 4, 1>;

template <class Cfg, int AM, int BM, bool INTERIOR, int ORDER>
K kern() {
  char what[96];
  std::snprintf(what, sizeof what, "bm=%d bn=%d stages=%d am=%d bm=%d interior=%d order=%d",
                Cfg::BM, Cfg::BN, Cfg::STAGES, AM, BM, static_cast<int>(INTERIOR), ORDER);
  return register_kernel<&gemm_pipelined_kernel<float, Cfg, AM, BM, INTERIOR, false, ORDER>, Cfg>(
      what);
}

// A data-parallel grid of whole bm x bn tiles.
cudaError_t launch(const GemmArgs& a, int bm, int bn, K kk) {
  const PipeParams p = whole_tile_params(a, static_cast<int>(a.m / bm), static_cast<int>(a.n / bn),
                                         static_cast<int>(a.k));
  kk.fn<<<static_cast<unsigned>(p.tiles_m * p.tiles_n), kk.threads, kk.smem>>>(p);
  return cudaGetLastError();
}

struct Layout {
  const char* name;
  bool a_t, b_t;
};

struct Set {
  K fat0, fat3, med0, med3;
};
template <int AM, int BM>
Set make_set() {
  return Set{kern<CfgFat4, AM, BM, true, 0>(), kern<CfgFat4, AM, BM, true, 3>(),
             kern<CfgMedium, AM, BM, true, 0>(), kern<CfgMedium, AM, BM, true, 3>()};
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const Cublas cublas = Cublas::load();
  // A row-major (m x k): the loader reads along k (kVecK); A stored transposed: along m (kVecC).
  // B row-major (k x n): along n (kVecC); B stored transposed: along k (kVecK).
  const Set nn = make_set<kVecK, kVecC>(), tn = make_set<kVecC, kVecC>(),
            nt = make_set<kVecK, kVecK>(), tt = make_set<kVecC, kVecK>();
  const K gen3 = kern<CfgFat, kVecK, kVecC, false, 0>(),
          gen4 = kern<CfgFat4, kVecK, kVecC, false, 0>();
  const Layout layouts[4] = {
      {"nn", false, false}, {"tn", true, false}, {"nt", false, true}, {"tt", true, true}};
  const Set* sets[4] = {&nn, &tn, &nt, &tt};
  for (int64_t s : {1024, 2048, 4096, 8192}) {
    const int64_t m = s, n = s, k = s;
    const Operands ops(m, n, k);
    float *da = ops.a, *db = ops.b, *dc = ops.c;
    for (int li = 0; li < 4; ++li) {
      const Layout L = layouts[li];
      const Set& S = *sets[li];
      const GemmArgs a = square_args(ops, s, L.a_t, L.b_t);
      std::vector<Variant> vs = {
          {"cublas",
           [&] {
             return cublas.run(L.b_t ? 1 : 0, L.a_t ? 1 : 0, m, n, k, db, L.b_t ? k : n, da,
                               L.a_t ? m : k, dc);
           }},
          {"fat4_o0", [&] { return launch(a, 128, 256, S.fat0); }},
          {"fat4_o3", [&] { return launch(a, 128, 256, S.fat3); }},
          {"med_o0", [&] { return launch(a, 64, 128, S.med0); }},
          {"med_o3", [&] { return launch(a, 64, 128, S.med3); }},
      };
      if (li == 0) {
        vs.push_back({"fatgen3_o0", [&] { return launch(a, 128, 256, gen3); }});
        vs.push_back({"fatgen4_o0", [&] { return launch(a, 128, 256, gen4); }});
      }
      // Relative error against cuBLAS in the same layout, outputs NaN-poisoned first.
      const std::vector<float> href = reference_output(vs[0], dc, m * n);
      for (std::size_t v = 1; v < vs.size(); ++v) {
        const double rel = compare_output(vs[v], dc, href).rel;
        std::printf("CHECK %5lld %s %-12s rel=%.3e%s\n", static_cast<long long>(s), L.name,
                    vs[v].name.c_str(), rel, rel < 1e-5 ? "" : " BAD");
      }
      char label[32];
      std::snprintf(label, sizeof label, "%5lld %s", static_cast<long long>(s), L.name);
      report(label, 12, vs, rounds, s >= 8192 ? 8 : (s >= 4096 ? 15 : 30), 2.0 * m * n * k);
    }
  }
  return 0;
}
