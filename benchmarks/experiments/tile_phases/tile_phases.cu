// Where the wide tile's fixed cost per tile goes (docs/performance.md, "Linear layers": about
// 3.6 us per 128x256 tile besides 0.65 us per k-block). This program compiles its own
// instance of the Hopper kernel with GEMMT_SM90_TRACE, which makes one thread per warpgroup
// stamp the SM clock at the phases of each unit (kernels/sm90/kernel.cuh), and runs bf16
// C = A B^T with both operands K-major on the shape of the performance notes, 11008 x 4096 x K,
// as 128x256 tiles in CTA pairs with the staged (TMA) store.
//
// Consumer slots: 0 unit start, 1 first stage full, 5 fifth stage full (the first one the
// producer refilled for this unit), 2 last k-block issued, 3 accumulators complete,
// 4 C stored. Producer slots: 0 unit start, 1 first empty stage, 2 last load issued.
// Slots 6 / 7: global timer at the warpgroup's start and end. The staged store's rounds
// (epilogue.cuh: staged_store_round), from the warpgroup's leader, slots 8.. for the first
// round and 16.. for the second: + 0 previous round read by TMA, + 1 barrier, + 2 filled,
// + 3 proxy fence, + 4 barrier, + 5 TMA store issued. K = 4096 also runs with the fused
// epilogue of a Linear forward: bias and gelu_tanh, with and without the pre-activation
// output (the post pass runs between the fill and the proxy fence). With --direct each
// shape also runs with the register-to-global store (Params::tma_store = 0), and K = 1024
// on a grid for half the SMs (does the store slow down with every SM storing at once?).
// Each shape also prints a hash of C from one launch over NaN-poisoned memory, so that an
// experiment form of the kernel can be checked against the committed one bit for bit
// (8c7b8d2:benchmarks/experiments/epilogue_variants/).
// With --stream-k each shape runs as the launcher spreads it (SkSpread::kAuto: the last
// waves' k-blocks in one range per cluster) beside whole tiles, with a breakdown by unit
// index (a stream-k piece's epilogue holds the taker's wait for its givers).
//
// Build and run (sm_90a): the CMake target tile_phases (-DGEMMT_BUILD_SELFTESTS=ON), or
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -DGEMMT_HAS_SM90A -Iinclude \
//     -Ikernels benchmarks/experiments/tile_phases/tile_phases.cu -o tile_phases
//   ./tile_phases [M N [--direct | --stream-k [K]]]
#define GEMMT_SM90_TRACE 1

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "sm90/launch.cuh"
#include "sm90/tensor_map.h"

namespace {

using gemmt::kBNWide;
using gemmt::kTraceSlots;
using gemmt::kTraceUnits;
using gemmt::Params;
using gemmt::sm90::Maps;

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// A bf16 operand's tensor map (the launcher's encoder): `inner` elements per row, rows `pitch`
// elements apart, boxes of box_inner x box_outer.
CUtensorMap tensor_map(const void* ptr, uint64_t inner, uint64_t outer, uint64_t pitch,
                       uint32_t box_inner, uint32_t box_outer) {
  gemmt::sm90::MapShape shape;
  shape.dims[0] = inner;
  shape.dims[1] = outer;
  shape.stride_bytes = pitch * 2;
  shape.box[0] = box_inner;
  shape.box[1] = box_outer;
  CUtensorMap map;
  if (!gemmt::sm90::encode_map(&map, ptr, shape, gemmt::kBF16)) {
    std::fprintf(stderr, "tensor map encoding failed\n");
    std::exit(1);
  }
  return map;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

// grid_sms: the SM count the launch sizes its grid for (fewer than the device's: a
// half-size grid shows whether the store's time depends on how many SMs store at once).
// epi_kind: 0 none, 1 bias + gelu_tanh, 2 the same and the pre-activation output.
// sk_ws: the stream-k workspace (nullptr: whole tiles only).
void run_shape(int m, int n, int k, const void* a, const void* b, void* c, int sms, bool tma,
               int grid_sms, int epi_kind = 0, const void* bias = nullptr, void* preact = nullptr,
               float* sk_ws = nullptr) {
  Maps maps;
  std::memset(&maps, 0, sizeof(maps));
  maps.a = tensor_map(a, k, m, k, 64, 128);
  maps.b = tensor_map(b, k, n, k, 64, 128);
  maps.c = tensor_map(c, n, m, n, 64, 64);
  Params p;
  std::memset(&p, 0, sizeof(p));
  p.m = m;
  p.n = n;
  p.k = k;
  p.tiles_m = (m + 255) / 256;
  p.tiles_n = (n + kBNWide - 1) / kBNWide;
  p.num_kb = (k + 63) / 64;
  p.group = 8;
  p.stage_tx_bytes = 128 * 128 + kBNWide * 128;
  p.c = c;
  p.ldc = n;
  p.alpha = 1.f;
  p.beta = 0.f;
  p.c_pair = 1;
  p.tma_store = tma ? 1 : 0;
  p.splits = 1;
  p.kb_per_split = p.num_kb;
  p.epi = gemmt::EpilogueParams();
  if (epi_kind > 0) {
    p.epi.bias = bias;
    p.epi.act = gemmt::Activation::kGeluTanh;
    p.epi.active = true;
    if (epi_kind == 2) {
      p.epi.preact = preact;
      p.epi.ld_preact = n;
    }
  }
  p.partial = sk_ws;
  const gemmt::SkSpread spread = sk_ws != nullptr ? gemmt::SkSpread::kAuto : gemmt::SkSpread::kOff;
  auto launch = [&] {
    CHECK(
        (gemmt::launch<gemmt::kBF16, gemmt::kAnyLayout, 2, kBNWide>(maps, p, grid_sms, spread, 0)));
  };

  // Untraced time: median of 30 launches between events.
  unsigned long long* null_trace = nullptr;
  CHECK(cudaMemcpyToSymbol(gemmt::g_trace, &null_trace, sizeof(null_trace)));
  for (int i = 0; i < 5; ++i) launch();
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> times;
  for (int i = 0; i < 30; ++i) {
    CHECK(cudaEventRecord(e0));
    launch();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms * 1e3);
  }
  const double t_us = median(times);
  // A hash of C from one launch over poisoned (0xff: NaN) memory, so that builds with
  // different store paths can be compared bit for bit.
  CHECK(cudaMemset(c, 0xff, static_cast<size_t>(m) * n * 2));
  launch();
  CHECK(cudaDeviceSynchronize());
  {
    std::vector<uint16_t> h(static_cast<size_t>(m) * n);
    CHECK(cudaMemcpy(h.data(), c, h.size() * 2, cudaMemcpyDeviceToHost));
    uint64_t hash = 1469598103934665603ull;
    size_t nans = 0;
    for (uint16_t x : h) {
      hash = (hash ^ x) * 1099511628211ull;
      nans += (x & 0x7f80u) == 0x7f80u && (x & 0x7fu) != 0;
    }
    std::printf("C hash %016llx, NaN outputs %zu (%d x %d x %d; the phases follow)\n",
                static_cast<unsigned long long>(hash), nans, m, n, k);
  }

  // Traced launch.
  const int ctas = sms;  // at most one CTA per SM; unused rows stay zero
  const size_t words = static_cast<size_t>(ctas) * 3 * kTraceUnits * kTraceSlots;
  unsigned long long* d_trace = nullptr;
  CHECK(cudaMalloc(&d_trace, words * sizeof(unsigned long long)));
  CHECK(cudaMemset(d_trace, 0, words * sizeof(unsigned long long)));
  CHECK(cudaMemcpyToSymbol(gemmt::g_trace, &d_trace, sizeof(d_trace)));
  launch();
  CHECK(cudaDeviceSynchronize());
  std::vector<unsigned long long> tr(words);
  CHECK(cudaMemcpy(tr.data(), d_trace, words * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpyToSymbol(gemmt::g_trace, &null_trace, sizeof(null_trace)));
  CHECK(cudaFree(d_trace));
  auto at = [&](int cta, int wg, int unit, int slot) {
    return tr[((static_cast<size_t>(cta) * 3 + wg) * kTraceUnits + unit) * kTraceSlots + slot];
  };

  // Clock rate from the consumers' own span: clock64 from the first unit's start to the
  // last unit's end against the global timer from start to end.
  // Staged-store sub-phases: [round][step], step 0 from the accumulators' completion.
  std::vector<double> sub[2][6], after_rounds;
  std::vector<double> ghz, restart, refill, mainloop, drain, epi, gap, per_kb, prod_wait,
      start_skew, tail, units_per_cta;
  std::vector<double> by_unit_loop[kTraceUnits], by_unit_epi[kTraceUnits];
  unsigned long long g_first = ~0ull, g_last = 0;
  for (int cta = 0; cta < ctas; ++cta) {
    for (int wg = 1; wg <= 2; ++wg) {
      if (at(cta, wg, 0, 6) == 0) continue;
      g_first = std::min(g_first, at(cta, wg, 0, 6));
      g_last = std::max(g_last, at(cta, wg, 0, 7));
    }
  }
  for (int cta = 0; cta < ctas; ++cta) {
    for (int wg = 1; wg <= 2; ++wg) {
      if (at(cta, wg, 0, 6) == 0) continue;
      int units = 0;
      while (units < kTraceUnits && at(cta, wg, units, 4) != 0) ++units;
      if (units == 0) continue;
      units_per_cta.push_back(units);
      const double ns = static_cast<double>(at(cta, wg, 0, 7) - at(cta, wg, 0, 6));
      const double cyc = static_cast<double>(at(cta, wg, units - 1, 4) - at(cta, wg, 0, 0));
      ghz.push_back(cyc / ns);
      start_skew.push_back((at(cta, wg, 0, 6) - g_first) * 1e-3);
      tail.push_back((g_last - at(cta, wg, 0, 7)) * 1e-3);
      for (int u = 0; u < units; ++u) {
        restart.push_back(at(cta, wg, u, 1) - at(cta, wg, u, 0));
        if (p.num_kb > 4) refill.push_back(at(cta, wg, u, 5) - at(cta, wg, u, 1));
        mainloop.push_back(at(cta, wg, u, 2) - at(cta, wg, u, 1));
        drain.push_back(at(cta, wg, u, 3) - at(cta, wg, u, 2));
        epi.push_back(at(cta, wg, u, 4) - at(cta, wg, u, 3));
        per_kb.push_back(static_cast<double>(at(cta, wg, u, 3) - at(cta, wg, u, 1)) / p.num_kb);
        by_unit_loop[u].push_back(at(cta, wg, u, 2) - at(cta, wg, u, 1));
        by_unit_epi[u].push_back(at(cta, wg, u, 4) - at(cta, wg, u, 3));
        if (u + 1 < units) gap.push_back(at(cta, wg, u + 1, 0) - at(cta, wg, u, 4));
        if (tma && at(cta, wg, u, 21) != 0) {
          unsigned long long prev = at(cta, wg, u, 3);
          for (int r = 0; r < 2; ++r) {
            for (int st = 0; st < 6; ++st) {
              const unsigned long long now = at(cta, wg, u, 8 + 8 * r + st);
              sub[r][st].push_back(static_cast<double>(now - prev));
              prev = now;
            }
          }
          after_rounds.push_back(static_cast<double>(at(cta, wg, u, 4) - prev));
        }
      }
    }
    if (at(cta, 0, 0, 2) != 0) {
      for (int u = 1; u < kTraceUnits && at(cta, 0, u, 2) != 0; ++u) {
        prod_wait.push_back(at(cta, 0, u, 1) - at(cta, 0, u, 0));
      }
    }
  }
  const double f = median(ghz) * 1e3;  // cycles per us
  auto us = [&](const std::vector<double>& v) { return median(v) / f; };
  std::printf(
      "\n=== %d x %d x %d bf16, A and B K-major, 128x256 tiles in CTA pairs, %s, grid "
      "for %d SMs ===\n",
      m, n, k, tma ? "staged (TMA) store" : "register-to-global store", grid_sms);
  if (epi_kind > 0) {
    std::printf("epilogue: bias + gelu_tanh%s\n", epi_kind == 2 ? " + pre-activation output" : "");
  }
  std::printf("kernel %.1f us (median of 30, untraced); traced span %.1f us; clock %.3f GHz\n",
              t_us, (g_last - g_first) * 1e-3, f * 1e-3);
  std::printf("units per consumer warpgroup: median %.0f (min %.0f, max %.0f)\n",
              median(units_per_cta), percentile(units_per_cta, 0.0),
              percentile(units_per_cta, 1.0));
  std::printf(
      "per unit (median, us): restart %.3f | main loop %.3f | drain %.3f | epilogue %.3f | "
      "gap %.3f\n",
      us(restart), us(mainloop), us(drain), us(epi), us(gap));
  std::printf("per unit (p90, us):    restart %.3f | main loop %.3f | drain %.3f | epilogue %.3f\n",
              percentile(restart, 0.9) / f, percentile(mainloop, 0.9) / f,
              percentile(drain, 0.9) / f, percentile(epi, 0.9) / f);
  if (!refill.empty()) {
    std::printf(
        "first stage full -> fifth stage full: median %.3f us (4 k-blocks at the unit's "
        "rate: %.3f)\n",
        us(refill), 4 * us(per_kb));
  }
  if (sk_ws != nullptr) {
    // Stream-k pieces are shorter than a tile, so the per-k-block figure below is not theirs.
    std::printf(
        "stream-k (the launcher's kAuto spread); by unit index (median us over the "
        "warpgroups that have it):\n");
    for (int u = 0; u < kTraceUnits && !by_unit_loop[u].empty(); ++u) {
      std::printf(
          "  unit %d: %zu warpgroups, main loop %.3f (max %.3f), epilogue %.3f (max %.3f)\n", u,
          by_unit_loop[u].size(), us(by_unit_loop[u]), percentile(by_unit_loop[u], 1.0) / f,
          us(by_unit_epi[u]), percentile(by_unit_epi[u], 1.0) / f);
    }
  }
  std::printf("per k-block (first stage full -> accumulators complete): %.3f us\n", us(per_kb));
  std::printf("fixed per unit (restart + drain - one k-block + epilogue + gap): %.3f us\n",
              us(restart) + us(drain) - us(per_kb) + us(epi) + us(gap));
  if (!sub[0][0].empty()) {
    const char* names[6] = {"TMA read of the previous round",
                            "barrier",
                            "fill",
                            "proxy fence",
                            "barrier",
                            "TMA issue + commit"};
    for (int r = 0; r < 2; ++r) {
      std::printf("staged round %d (median us):", r + 1);
      for (int st = 0; st < 6; ++st) std::printf(" %s %.3f |", names[st], us(sub[r][st]));
      std::printf("\n");
    }
    std::printf("after the rounds: %.3f us\n", us(after_rounds));
  }
  std::printf("producer: unit start -> first empty stage, median %.3f us\n", us(prod_wait));
  std::printf(
      "warpgroup start skew: median %.2f us, max %.2f us; end before kernel end: median "
      "%.2f us, max %.2f us\n",
      median(start_skew), percentile(start_skew, 1.0), median(tail), percentile(tail, 1.0));
}

}  // namespace

int main(int argc, char** argv) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int m = argc > 1 ? std::atoi(argv[1]) : 11008;
  const int n = argc > 2 ? std::atoi(argv[2]) : 4096;
  // A fifth argument runs that one K instead of 512 .. 4096 (and no epilogue runs).
  const int k_only = argc > 4 ? std::atoi(argv[4]) : 0;
  const int kmax = std::max(4096, k_only);
  // --direct: also the register-to-global store, and a half-size grid at K = 1024.
  const bool direct = argc > 3 && std::strcmp(argv[3], "--direct") == 0;
  const bool stream_k = argc > 3 && std::strcmp(argv[3], "--stream-k") == 0;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto upload = [&](size_t count) {
    std::vector<__nv_bfloat16> h(count);
    for (auto& x : h) x = __float2bfloat16(u(rng));
    void* d = nullptr;
    CHECK(cudaMalloc(&d, count * 2));
    CHECK(cudaMemcpy(d, h.data(), count * 2, cudaMemcpyHostToDevice));
    return d;
  };
  void* a = upload(static_cast<size_t>(m) * kmax);
  void* b = upload(static_cast<size_t>(n) * kmax);
  void* c = nullptr;
  CHECK(cudaMalloc(&c, static_cast<size_t>(m) * n * 2));
  void* preact = nullptr;
  CHECK(cudaMalloc(&preact, static_cast<size_t>(m) * n * 2));
  void* bias = upload(static_cast<size_t>(n));
  float* sk_ws = nullptr;
  if (stream_k) {  // one 128 x 256 float32 slot per CTA, then two flags per slot
    const size_t slots = static_cast<size_t>(sms);
    CHECK(cudaMalloc(&sk_ws, slots * 128 * kBNWide * sizeof(float) + slots * 2 * sizeof(int)));
  }
  const std::vector<int> ks =
      k_only > 0 ? std::vector<int>{k_only} : std::vector<int>{512, 1024, 2048, 4096};
  for (int k : ks) {
    run_shape(m, n, k, a, b, c, sms, true, sms);
    if (stream_k) run_shape(m, n, k, a, b, c, sms, true, sms, 0, nullptr, nullptr, sk_ws);
    if (direct) run_shape(m, n, k, a, b, c, sms, false, sms);
    if (direct && k == 1024) run_shape(m, n, k, a, b, c, sms, true, sms / 2);
  }
  if (k_only > 0) return 0;
  run_shape(m, n, 4096, a, b, c, sms, true, sms, 1, bias, preact);
  run_shape(m, n, 4096, a, b, c, sms, true, sms, 2, bias, preact);
  return 0;
}
