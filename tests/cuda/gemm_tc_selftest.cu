// Standalone check of the tensor-core GEMM family (kernels/gemm_sm80_mma.cu and
// kernels/sm90/) against a double-precision CPU reference, plus a throughput
// report. Exits 0 when every supported configuration passes, 1 on any mismatch, 2 on a
// CUDA error and 3 when a kernel does not finish (a pipeline deadlock would look like that).
//
//   nvcc -std=c++17 -O2 -Iinclude -DGEMMT_HAS_SM90A -gencode arch=compute_90a,code=sm_90a \
//        tests/cuda/gemm_tc_selftest.cu build/<dir>/libgemmt_kernels.a build/<dir>/libgemmt_plan.a
//        \ -o gemm_tc_selftest
//
// Options: --quick (skip the largest shapes), --no-perf, --perf-only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gemmt/gemm.h"
#include "gemmt/gemm_tc_hooks.h"

using gemmt::GemmArgs;
using gemmt::ScalarType;

namespace {

#define CHECK_CUDA(expr)                                                                     \
  do {                                                                                       \
    cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__, \
                   __LINE__, #expr);                                                         \
      std::fflush(stderr);                                                                   \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

constexpr double kHangSeconds = 60.0;

// Waits for `stream` but gives up (and ends the process) if the work never completes.
void wait_or_die(cudaStream_t stream, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      std::printf("FAIL: %s: %s (%s)\n", what.c_str(), cudaGetErrorName(e), cudaGetErrorString(e));
      std::fflush(stdout);
      std::exit(2);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > kHangSeconds) {
      std::printf("FAIL: TIMEOUT after %.0f s: %s (kernel never finished: likely a deadlock)\n", s,
                  what.c_str());
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Copies go through the stream the kernels run on: a plain cudaMemcpy from pageable memory
// may return before its DMA lands, and nothing would order it against that stream.
void copy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform() {  // [-1, 1)
    return static_cast<float>((next() >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}
float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_f16_bits(float f) {
  const __half h = __float2half_rn(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float f16_bits_to_f32(uint16_t b) {
  __half h;
  std::memcpy(&h, &b, 2);
  return __half2float(h);
}

struct DtypeInfo {
  ScalarType type;
  const char* name;
  int elt;
  double tol;
};

const DtypeInfo kDtypes[] = {
    {ScalarType::kBFloat16, "bf16", 2, 1e-2},
    {ScalarType::kFloat16, "fp16", 2, 1e-2},
    {ScalarType::kFloat32, "tf32", 4, 5e-3},
};

// Device-resident values plus their exact float images for the reference.
struct HostBuf {
  std::vector<uint8_t> bits;
  std::vector<float> vals;
};

HostBuf make_random(const DtypeInfo& dt, int64_t count, Rng& rng) {
  HostBuf h;
  h.bits.resize(static_cast<size_t>(count) * dt.elt);
  h.vals.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const float f = rng.uniform();
    if (dt.elt == 4) {
      std::memcpy(&h.bits[i * 4], &f, 4);
      h.vals[i] = f;
    } else if (dt.type == ScalarType::kBFloat16) {
      const uint16_t b = f32_to_bf16_bits(f);
      std::memcpy(&h.bits[i * 2], &b, 2);
      h.vals[i] = bf16_bits_to_f32(b);
    } else {
      const uint16_t b = f32_to_f16_bits(f);
      std::memcpy(&h.bits[i * 2], &b, 2);
      h.vals[i] = f16_bits_to_f32(b);
    }
  }
  return h;
}

void fill_nan(const DtypeInfo& dt, std::vector<uint8_t>& bits) {
  if (dt.elt == 4) {
    const uint32_t nan = 0x7FC00000u;
    for (size_t i = 0; i + 4 <= bits.size(); i += 4) std::memcpy(&bits[i], &nan, 4);
  } else {
    const uint16_t nan = dt.type == ScalarType::kBFloat16 ? 0x7FC0 : 0x7E00;
    for (size_t i = 0; i + 2 <= bits.size(); i += 2) std::memcpy(&bits[i], &nan, 2);
  }
}

double read_val(const DtypeInfo& dt, const std::vector<uint8_t>& bits, int64_t idx) {
  if (dt.elt == 4) {
    float f;
    std::memcpy(&f, &bits[idx * 4], 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, &bits[idx * 2], 2);
  return dt.type == ScalarType::kBFloat16 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
}

struct Shape {
  int64_t m, n, k;
  bool big;
};

struct Layout {
  bool a_col;  // A column-major (a_stride_m == 1)
  bool b_col;  // B column-major (b_stride_k == 1)
  const char* name;
};

const Layout kLayouts[] = {
    {false, false, "A row/B row"},
    {false, true, "A row/B col"},
    {true, false, "A col/B row"},
    {true, true, "A col/B col"},
};

// sm90 is what gemm_sm90_run does (CTA pairs with B multicast when the M tile count is even,
// TMA-store epilogue when C rows are 16-byte aligned); the two others pin single CTAs with
// either epilogue, so a failure can be pinned on the multicast or on the store path. The
// last seven are gemm_sm90_run with the tile width pinned to 256, 128 or 64, stream-k on wide
// tiles, spread over clusters for two thirds of the tiles so that even small products have
// tiles cut in two, or over every cluster that fits, so that small products have tiles cut
// into many pieces (pieces in the middle of a tile, several givers per taker), the width
// pinned to 192 (16-bit only), and stream-k on the partial last wave alone (the whole waves
// as tiles; under one wave, every tile cut). The cost model picks among the widths and
// schedules; each must be right wherever it runs.
enum Path {
  kSm80 = 0,
  kSm90Auto = 1,
  kSm90Direct = 2,
  kSm90Tma = 3,
  kSm90Wide = 4,
  kSm90Medium = 5,
  kSm90Narrow = 6,
  kSm90StreamK = 7,
  kSm90StreamKAll = 8,
  kSm90ThreeQuarter = 9,
  kSm90StreamKTail = 10,
  kNumPaths = 11
};
const char* kPathNames[] = {"sm80",   "sm90",    "sm90-c1d", "sm90-c1t", "sm90-w",  "sm90-m",
                            "sm90-n", "sm90-sk", "sm90-ska", "sm90-3q",  "sm90-skt"};

bool pinned_width(Path p) {
  return p == kSm90Wide || p == kSm90Medium || p == kSm90Narrow || p == kSm90StreamK ||
         p == kSm90StreamKAll || p == kSm90ThreeQuarter || p == kSm90StreamKTail;
}

// The pinned widths apply to outputs wider than the narrow tile (after the tf32 C^T swap the
// output's width is m); narrower ones always run narrow. The 128x192 tile is 16-bit only.
bool path_applies(Path p, const GemmArgs& a) {
  if (!pinned_width(p)) return true;
  if (p == kSm90ThreeQuarter && a.dtype == gemmt::ScalarType::kFloat32) return false;
  return a.m > 64 && a.n > 64;
}

// The pinned sm90 variants run the kernel alone (no staging copy, no split-k), so they skip
// operands that gemm_sm90_run first stages in its workspace.
bool path_supported(Path p, const GemmArgs& a) {
  if (p == kSm80) return gemmt::gemm_sm80_supports(a);
  if (p == kSm90Auto || pinned_width(p)) return gemmt::gemm_sm90_supports(a);
  return gemmt::detail::gemm_sm90_variant_supports(a);
}

// A device workspace of at least `bytes`, grown on demand and kept for the whole run (the
// self-test is single-threaded; the previous buffer is freed only after the stream drains).
void* workspace(std::size_t bytes, cudaStream_t s) {
  static void* buf = nullptr;
  static std::size_t size = 0;
  if (bytes > size) {
    if (buf != nullptr) {
      CHECK_CUDA(cudaStreamSynchronize(s));
      CHECK_CUDA(cudaFree(buf));
    }
    CHECK_CUDA(cudaMalloc(&buf, bytes));
    size = bytes;
  }
  return buf;
}

cudaError_t run_path(Path p, const GemmArgs& a, cudaStream_t s) {
  switch (p) {
    case kSm80:
      return gemmt::gemm_sm80_run(a, s);
    case kSm90Auto:
      return gemmt::gemm_sm90_run(a, workspace(gemmt::gemm_sm90_workspace_bytes(a), s), s);
    case kSm90Direct:
      return gemmt::detail::gemm_sm90_run_variant(a, s, gemmt::detail::Sm90Cluster::kSingle,
                                                  gemmt::detail::Sm90Store::kDirect);
    case kSm90Wide:
    case kSm90Medium:
    case kSm90Narrow:
    case kSm90StreamK:
    case kSm90StreamKAll:
    case kSm90StreamKTail:
    case kSm90ThreeQuarter: {
      const bool sk = p == kSm90StreamK || p == kSm90StreamKAll || p == kSm90StreamKTail;
      const int bn = p == kSm90Wide || sk     ? 256
                     : p == kSm90ThreeQuarter ? 192
                     : p == kSm90Medium       ? 128
                                              : 64;
      const int splits = p == kSm90StreamK       ? -2
                         : p == kSm90StreamKAll  ? -3
                         : p == kSm90StreamKTail ? -4
                                                 : 0;
      void* ws = workspace(gemmt::detail::gemm_sm90_split_workspace_bytes(a, splits, bn), s);
      return gemmt::detail::gemm_sm90_run_splits(a, splits, bn, ws, s);
    }
    default:
      return gemmt::detail::gemm_sm90_run_variant(a, s, gemmt::detail::Sm90Cluster::kSingle,
                                                  gemmt::detail::Sm90Store::kTma);
  }
}

// Indices to check along one output dimension: everything for small problems, otherwise
// both ends, the neighbourhoods of warpgroup / tile / cluster boundaries and random picks.
std::vector<int64_t> pick(int64_t size, bool full, Rng& rng) {
  constexpr size_t kSamples = 96;
  std::vector<int64_t> v;
  if (full || size <= static_cast<int64_t>(kSamples)) {
    for (int64_t i = 0; i < size; ++i) v.push_back(i);
    return v;
  }
  const int64_t edges[] = {0, 1, 7, 8, 63, 64, 127, 128, 191, 255, 256, 383, 511, 512};
  for (int64_t e : edges) {
    if (e < size) v.push_back(e);
    if (size - 1 - e >= 0) v.push_back(size - 1 - e);
  }
  while (v.size() < kSamples) v.push_back(rng.below(size));
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

struct Stats {
  int passed = 0, failed = 0, unsupported = 0;
};

struct Ctx {
  cudaDeviceProp prop;
  cudaStream_t stream;
  Stats stats[3][kNumPaths];  // per dtype, per path
};

GemmArgs base_args(const Ctx& ctx, const DtypeInfo& dt) {
  GemmArgs a;
  a.dtype = dt.type;
  a.allow_tf32 = true;
  a.sm_count = ctx.prop.multiProcessorCount;
  a.cc_major = ctx.prop.major;
  a.cc_minor = ctx.prop.minor;
  return a;
}

// base_args for an m x n x k product on dense operands at a, b and c: A column-major when
// a_col (else row-major), B likewise, C row-major.
GemmArgs dense_args(const Ctx& ctx, const DtypeInfo& dt, int64_t m, int64_t n, int64_t k,
                    const void* a, bool a_col, const void* b, bool b_col, void* c) {
  GemmArgs args = base_args(ctx, dt);
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = a;
  args.a_stride_m = a_col ? 1 : k;
  args.a_stride_k = a_col ? m : 1;
  args.b = b;
  args.b_stride_k = b_col ? 1 : n;
  args.b_stride_n = b_col ? k : 1;
  args.c = c;
  args.ldc = n;
  return args;
}

void test_shape(Ctx& ctx, int dti, const Shape& sh, uint64_t seed) {
  const DtypeInfo& dt = kDtypes[dti];
  const int64_t m = sh.m, n = sh.n, k = sh.k;
  const int64_t ldc = n + 8;  // padding columns must come back untouched
  Rng rng(seed);
  HostBuf A = make_random(dt, m * k, rng);
  HostBuf B = make_random(dt, k * n, rng);
  HostBuf C0 = make_random(dt, m * ldc, rng);
  std::vector<uint8_t> c_nan(static_cast<size_t>(m * ldc) * dt.elt);
  fill_nan(dt, c_nan);
  // Padding of the beta != 0 input is NaN too: nothing may read or write it.
  for (int64_t i = 0; i < m; ++i)
    std::memcpy(&C0.bits[(i * ldc + n) * dt.elt], &c_nan[0], static_cast<size_t>(8 * dt.elt));

  void *dA, *dB, *dC;
  CHECK_CUDA(cudaMalloc(&dA, A.bits.size()));
  CHECK_CUDA(cudaMalloc(&dB, B.bits.size()));
  CHECK_CUDA(cudaMalloc(&dC, c_nan.size()));
  copy_sync(dA, A.bits.data(), A.bits.size(), cudaMemcpyHostToDevice, ctx.stream);
  copy_sync(dB, B.bits.data(), B.bits.size(), cudaMemcpyHostToDevice, ctx.stream);
  std::vector<uint8_t> out(c_nan.size());

  const bool full = m * n * k <= (int64_t{1} << 26);
  const std::vector<int64_t> rows = pick(m, full, rng);
  const std::vector<int64_t> cols = pick(n, full, rng);

  for (const Layout& lay : kLayouts) {
    const int64_t sam = lay.a_col ? 1 : k, sak = lay.a_col ? m : 1;
    const int64_t sbk = lay.b_col ? 1 : n, sbn = lay.b_col ? k : 1;
    // Gather the sampled rows of A and columns of B once (contiguous along K).
    std::vector<float> ar(rows.size() * k), bc(cols.size() * k);
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t p = 0; p < k; ++p) ar[r * k + p] = A.vals[rows[r] * sam + p * sak];
    for (size_t c = 0; c < cols.size(); ++c)
      for (int64_t p = 0; p < k; ++p) bc[c * k + p] = B.vals[p * sbk + cols[c] * sbn];
    std::vector<double> dot(rows.size() * cols.size()), mag(rows.size() * cols.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      for (size_t c = 0; c < cols.size(); ++c) {
        const float* x = &ar[r * k];
        const float* y = &bc[c * k];
        double s = 0, s2 = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double prod = static_cast<double>(x[p]) * y[p];
          s += prod;
          s2 += prod * prod;
        }
        dot[r * cols.size() + c] = s;
        mag[r * cols.size() + c] = std::sqrt(s2);
      }
    }

    for (int bcase = 0; bcase < 2; ++bcase) {
      const float alpha = bcase == 0 ? 1.0f : 1.5f;
      const float beta = bcase == 0 ? 0.0f : 0.5f;
      GemmArgs args = base_args(ctx, dt);
      args.m = m;
      args.n = n;
      args.k = k;
      args.a = dA;
      args.a_stride_m = sam;
      args.a_stride_k = sak;
      args.b = dB;
      args.b_stride_k = sbk;
      args.b_stride_n = sbn;
      args.c = dC;
      args.ldc = ldc;
      args.alpha = alpha;
      args.beta = beta;
      const std::vector<uint8_t>& c_init = bcase == 0 ? c_nan : C0.bits;

      for (int pi = 0; pi < kNumPaths; ++pi) {
        const Path path = static_cast<Path>(pi);
        if (!path_applies(path, args)) continue;
        Stats& st = ctx.stats[dti][pi];
        char what[256];
        std::snprintf(what, sizeof what, "%s %-8s %lldx%lldx%lld %s alpha=%.1f beta=%.1f", dt.name,
                      kPathNames[pi], (long long)m, (long long)n, (long long)k, lay.name, alpha,
                      beta);
        if (!path_supported(path, args)) {
          const cudaError_t e = run_path(path, args, ctx.stream);
          if (e != cudaErrorNotSupported) {
            std::printf("FAIL: %s: supports() is false but run returned %s\n", what,
                        cudaGetErrorName(e));
            ++st.failed;
          } else {
            ++st.unsupported;
          }
          continue;
        }
        copy_sync(dC, c_init.data(), c_init.size(), cudaMemcpyHostToDevice, ctx.stream);
        const cudaError_t e = run_path(path, args, ctx.stream);
        if (e != cudaSuccess) {
          std::printf("FAIL: %s: launch returned %s (%s)\n", what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
          ++st.failed;
          continue;
        }
        wait_or_die(ctx.stream, what);
        copy_sync(out.data(), dC, out.size(), cudaMemcpyDeviceToHost, ctx.stream);

        double worst = 0;
        int64_t bad = 0, wi = -1, wj = -1;
        double w_got = 0, w_ref = 0;
        for (size_t r = 0; r < rows.size(); ++r) {
          const int64_t i = rows[r];
          for (size_t c = 0; c < cols.size(); ++c) {
            const int64_t j = cols[c];
            const double c0 = bcase == 0 ? 0.0 : read_val(dt, C0.bits, i * ldc + j);
            const double ref = alpha * dot[r * cols.size() + c] + beta * c0;
            const double scale =
                std::fabs(alpha) * mag[r * cols.size() + c] + std::fabs(beta * c0) + std::fabs(ref);
            const double got = read_val(dt, out, i * ldc + j);
            double err = std::fabs(got - ref) / (scale > 0 ? scale : 1.0);
            if (!std::isfinite(got)) err = INFINITY;
            if (err > dt.tol) ++bad;
            if (!(err <= worst)) {
              worst = err;
              wi = i;
              wj = j;
              w_got = got;
              w_ref = ref;
            }
          }
          // The padding columns of every checked row must still hold the initial bits.
          if (std::memcmp(&out[(i * ldc + n) * dt.elt], &c_init[(i * ldc + n) * dt.elt],
                          static_cast<size_t>(8 * dt.elt)) != 0) {
            ++bad;
            if (worst <= dt.tol) {
              wi = i;
              wj = n;
              worst = INFINITY;
            }
          }
        }
        if (bad == 0) {
          ++st.passed;
        } else {
          ++st.failed;
          std::printf(
              "FAIL: %s: %lld bad of %zu checked, worst rel err %.3g at (%lld,%lld) got %.6g ref "
              "%.6g\n",
              what, (long long)bad, rows.size() * cols.size(), worst, (long long)wi, (long long)wj,
              w_got, w_ref);
        }
      }
    }
  }
  std::printf("  done %s %lldx%lldx%lld (%s check)\n", dt.name, (long long)m, (long long)n,
              (long long)k, full ? "full" : "sampled");
  std::fflush(stdout);
  CHECK_CUDA(cudaFree(dA));
  CHECK_CUDA(cudaFree(dB));
  CHECK_CUDA(cudaFree(dC));
}

// Timed runs per median (--runs N; fewer under a profiler).
int g_timed_runs = 20;

// Median time of g_timed_runs launches of `run` after up to 3 warm-ups, in milliseconds.
template <class Run>
double median_ms(Ctx& ctx, const char* what, Run run) {
  for (int i = 0; i < std::min(3, g_timed_runs); ++i) CHECK_CUDA(run());
  wait_or_die(ctx.stream, what);
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < g_timed_runs; ++i) {
    CHECK_CUDA(cudaEventRecord(e0, ctx.stream));
    CHECK_CUDA(run());
    CHECK_CUDA(cudaEventRecord(e1, ctx.stream));
    wait_or_die(ctx.stream, what);
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median throughput of a square product in TFLOP/s; negative when unsupported.
double bench(Ctx& ctx, Path path, const DtypeInfo& dt, int64_t s, bool a_col, bool b_col, void* dA,
             void* dB, void* dC) {
  GemmArgs args = dense_args(ctx, dt, s, s, s, dA, a_col, dB, b_col, dC);
  args.alpha = 1.f;
  args.beta = 0.f;
  if (!path_supported(path, args)) return -1;
  char what[160];
  std::snprintf(what, sizeof what, "bench %s %s %lld^3", kPathNames[path], dt.name, (long long)s);
  const double med = median_ms(ctx, what, [&] { return run_path(path, args, ctx.stream); });
  return 2.0 * static_cast<double>(s) * s * s / (med * 1e-3) / 1e12;
}

// Random m x k and k x n operands and an m x n output on the device, for the sweeps (the
// layout is the caller's: the same buffers serve either orientation).
struct SweepOperands {
  void *a = nullptr, *b = nullptr, *c = nullptr;
  SweepOperands(const Ctx& ctx, const DtypeInfo& dt, int64_t m, int64_t n, int64_t k,
                uint64_t seed) {
    CHECK_CUDA(cudaMalloc(&a, static_cast<size_t>(m * k) * dt.elt));
    CHECK_CUDA(cudaMalloc(&b, static_cast<size_t>(k * n) * dt.elt));
    CHECK_CUDA(cudaMalloc(&c, static_cast<size_t>(m * n) * dt.elt));
    Rng rng(seed);
    HostBuf ha = make_random(dt, m * k, rng);
    HostBuf hb = make_random(dt, k * n, rng);
    copy_sync(a, ha.bits.data(), ha.bits.size(), cudaMemcpyHostToDevice, ctx.stream);
    copy_sync(b, hb.bits.data(), hb.bits.size(), cudaMemcpyHostToDevice, ctx.stream);
  }
  ~SweepOperands() {
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaFree(c));
  }
};

// What gemm_sm90_run picks for the product's k: stream-k (on the last two waves or on the
// last alone), k-slices, or whole tiles.
const char* auto_schedule(const GemmArgs& args) {
  if (gemmt::detail::gemm_sm90_auto_stream_k(args)) {
    return gemmt::detail::gemm_sm90_auto_stream_k_tail(args) ? "sk-tail" : "stream-k";
  }
  return gemmt::detail::gemm_sm90_auto_splits(args) > 1 ? "split" : "whole";
}

// Times gemm_sm90_run on the shapes where split-k is in play with every split count, to fit
// the cost model in kernels/plan/sm90_plan.cpp: one "TCSWEEP" line per (shape, splits).
void run_split_sweep(Ctx& ctx) {
  struct Mnk {
    int64_t m, n, k;
  };
  const Mnk shapes[] = {
      {1000, 1000, 1000},  {8192, 64, 8192},   {4096, 64, 4096},    {256, 256, 65536},
      {127, 8192, 511},    {1024, 1024, 8192}, {512, 512, 16384},   {2048, 512, 4096},
      {2048, 2048, 2048},  {8192, 32, 8192},   {1024, 64, 65536},   {512, 11008, 4096},
      {512, 4096, 11008},  {512, 28672, 8192}, {2048, 11008, 4096}, {512, 4096, 4096},
      {512, 4096, 128256}, {11008, 4096, 512}, {32000, 4096, 512},  {4096, 11008, 2048},
      {8192, 4096, 4096},  {2048, 4096, 4096}, {512, 14336, 4096},  {2048, 32000, 4096}};
  // -1: stream-k (wide tiles only)
  const int candidates[] = {-1, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
  std::printf("\nSplit-k sweep (gemm_sm90_run, A and B row-major, median of 20):\n");
  for (int dti : {0, 2}) {
    const DtypeInfo& dt = kDtypes[dti];
    for (const Mnk& sh : shapes) {
      const SweepOperands ops(ctx, dt, sh.m, sh.n, sh.k, 77 + sh.m + sh.n + sh.k);
      void *dA = ops.a, *dB = ops.b, *dC = ops.c;
      const GemmArgs args = dense_args(ctx, dt, sh.m, sh.n, sh.k, dA, false, dB, false, dC);
      if (!gemmt::gemm_sm90_supports(args)) continue;
      const bool auto_sk = gemmt::detail::gemm_sm90_auto_stream_k(args);
      const int auto_splits = auto_sk ? -1 : gemmt::detail::gemm_sm90_auto_splits(args);
      const int auto_bn = gemmt::detail::gemm_sm90_auto_tile_n(args);
      const int64_t num_kb = (sh.k * dt.elt + 127) / 128;
      for (int bn : {256, 192, 128, 64}) {
        if (bn > 64 && sh.n <= 64) continue;
        if (bn == 192 && dt.elt == 4) continue;  // 16-bit only
        const int64_t tiles = ((sh.m + 127) / 128) * ((sh.n + bn - 1) / bn);
        for (int s : candidates) {
          if (s > 1 && (s > num_kb / 2 || tiles * s > 4 * ctx.prop.multiProcessorCount)) continue;
          if (s < 0 && (bn != 256 || tiles <= ctx.prop.multiProcessorCount)) continue;
          void* ws =
              workspace(gemmt::detail::gemm_sm90_split_workspace_bytes(args, s, bn), ctx.stream);
          char what[160];
          std::snprintf(what, sizeof what, "sweep %s %lldx%lldx%lld bn=%d splits=%d", dt.name,
                        (long long)sh.m, (long long)sh.n, (long long)sh.k, bn, s);
          const double ms = median_ms(ctx, what, [&] {
            return gemmt::detail::gemm_sm90_run_splits(args, s, bn, ws, ctx.stream);
          });
          std::printf(
              "TCSWEEP %-4s %5lld x %5lld x %5lld bn=%3d splits=%2d %9.4f ms %7.1f "
              "TFLOP/s%s\n",
              dt.name, (long long)sh.m, (long long)sh.n, (long long)sh.k, bn, s, ms,
              2.0 * sh.m * sh.n * sh.k / (ms * 1e-3) / 1e12,
              (s == auto_splits && bn == auto_bn) ? "  <- auto" : "");
          std::fflush(stdout);
        }
      }
      if (auto_splits > 1 && auto_splits > num_kb / 2) {
        std::printf("TCSWEEP %-4s %5lld x %5lld x %5lld auto bn=%d splits=%d (not swept)\n",
                    dt.name, (long long)sh.m, (long long)sh.n, (long long)sh.k, auto_bn,
                    auto_splits);
      }
      CHECK_CUDA(cudaStreamSynchronize(ctx.stream));
    }
  }
}

// The training products of Linear layers (forward x @ W^T: A row-major, B column-major;
// grad_input g @ W: both row-major; grad_weight g^T @ x: A column-major, B row-major) timed
// whole-tile, stream-k, on the medium and 128x192 tiles, and as wide or medium tiles in two
// k-slices, to fit the cost model in kernels/plan/sm90_plan.cpp: one "SKSWEEP" line per
// (shape, layout, schedule).
void run_stream_k_sweep(Ctx& ctx, int64_t only_m = 0, int64_t only_n = 0, int64_t only_k = 0) {
  struct Mnk {
    int64_t m, n, k;
  };
  const Mnk shapes[] = {{512, 11008, 4096},
                        {2048, 11008, 4096},
                        {11008, 4096, 2048},
                        {512, 4096, 11008},
                        {11008, 4096, 512},
                        {2048, 4096, 11008},
                        {512, 14336, 4096},
                        {2048, 14336, 4096},
                        {14336, 4096, 2048},
                        {512, 28672, 8192},
                        {2048, 32000, 4096},
                        {4096, 32000, 2048},
                        {8192, 11008, 4096},
                        {512, 4096, 4096},
                        {1024, 4096, 4096},
                        // a 2 x 512-token training step's layer
                        {1024, 11008, 4096},
                        {1024, 4096, 11008},
                        {11008, 4096, 1024},
                        {4096, 11008, 1024},
                        {1024, 14336, 4096},
                        {1024, 28672, 8192},
                        // decode-sized batches (forward layout only): under one wave of tiles
                        {256, 11008, 4096},
                        {256, 14336, 4096},
                        {256, 4096, 11008},
                        {256, 28672, 8192},
                        {256, 8192, 28672},
                        {256, 32000, 4096},
                        {128, 11008, 4096},
                        {128, 4096, 11008},
                        {128, 28672, 8192}};
  const Layout layouts[] = {kLayouts[1], kLayouts[0], kLayouts[2]};
  struct Sched {
    int bn, splits;
    const char* name;
  };
  const Sched scheds[] = {{0, 0, "auto"},     {256, 1, "wide"},     {256, -1, "stream-k"},
                          {128, 1, "medium"}, {192, 1, "3/4"},      {256, -3, "sk-all"},
                          {256, 2, "wide/2"}, {128, 2, "medium/2"}, {256, -4, "sk-tail"}};
  std::printf("\nStream-k sweep (gemm_sm90_run, Linear layouts, median of 20):\n");
  for (int dti : {0, 2}) {
    const DtypeInfo& dt = kDtypes[dti];
    for (const Mnk& sh0 : shapes) {
      const Mnk sh = only_m > 0 ? Mnk{only_m, only_n, only_k} : sh0;
      if (only_m > 0 && (&sh0 != &shapes[0] || dti != 0)) continue;
      if (dti == 2 && sh.m != 2048) continue;  // tf32: a few shapes
      const SweepOperands ops(ctx, dt, sh.m, sh.n, sh.k, 91 + sh.m + sh.n + sh.k);
      void *dA = ops.a, *dB = ops.b, *dC = ops.c;
      for (const Layout& lay : layouts) {
        if (sh.m <= 256 && &lay != &layouts[0]) continue;
        const GemmArgs args =
            dense_args(ctx, dt, sh.m, sh.n, sh.k, dA, lay.a_col, dB, lay.b_col, dC);
        if (!gemmt::gemm_sm90_supports(args)) continue;
        const int auto_bn = gemmt::detail::gemm_sm90_auto_tile_n(args);
        for (const Sched& sc : scheds) {
          if (sc.bn == 192 && dt.elt == 4) continue;  // 16-bit only
          if (!gemmt::detail::gemm_sm90_forced_supports(args, sc.bn,
                                                        gemmt::detail::Sm90Orientation::kAuto)) {
            continue;
          }
          void* ws = workspace(
              gemmt::detail::gemm_sm90_split_workspace_bytes(args, sc.splits, sc.bn), ctx.stream);
          char what[160];
          std::snprintf(what, sizeof what, "sk-sweep %s %lldx%lldx%lld %s %s", dt.name,
                        (long long)sh.m, (long long)sh.n, (long long)sh.k, lay.name, sc.name);
          const double ms = median_ms(ctx, what, [&] {
            return gemmt::detail::gemm_sm90_run_splits(args, sc.splits, sc.bn, ws, ctx.stream);
          });
          std::printf("SKSWEEP %-4s %5lld x %5lld x %5lld %-12s %-8s %9.4f ms %7.1f TFLOP/s",
                      dt.name, (long long)sh.m, (long long)sh.n, (long long)sh.k, lay.name, sc.name,
                      ms, 2.0 * sh.m * sh.n * sh.k / (ms * 1e-3) / 1e12);
          if (sc.bn == 0) std::printf("  (bn=%d %s)", auto_bn, auto_schedule(args));
          std::printf("\n");
          std::fflush(stdout);
        }
      }
      CHECK_CUDA(cudaStreamSynchronize(ctx.stream));
    }
  }
}

// The schedules of the wide-tile products where stream-k is in play, timed against each
// other in alternating rounds (the order rotated every round, so that a drift of the clock
// over the run weighs on all alike): whole wide tiles, stream-k on the last two waves and on
// the last alone, and the medium and 128x192 tiles the planner falls back on. Products: the
// Linear training products of the benchmark (512, 1024, 2048 and 8192 tokens) whose wide
// tiles come to more than one wave with the last one not whole, then layers the benchmark
// does not hold (other hidden and intermediate sizes and token counts, vocabulary
// projections) with long k. One "SKAB" line per product: the median over the rounds of each
// schedule, and the planner's choice.
struct AbProduct {
  const char* what;  // fwd x @ W^T (A row, B col), dgrad g @ W (A row, B row), wgrad g^T @ x
  int64_t tokens, in, out;
};

// --sk-ab-tail: only the products the planner runs as stream-k on the last wave alone.
bool g_ab_tail_only = false;
// Products with fewer waves of wide tiles than this are skipped (--sk-ab-many-waves: 5).
int g_ab_min_waves = 0;

void time_schedules(Ctx& ctx, const AbProduct& pr, int rounds, bool only_stream_k_shapes) {
  const DtypeInfo& dt = kDtypes[0];  // bf16
  const bool fwd = !std::strcmp(pr.what, "fwd"), wgrad = !std::strcmp(pr.what, "wgrad");
  const int64_t m = wgrad ? pr.out : pr.tokens;
  const int64_t n = fwd ? pr.out : pr.in;
  const int64_t k = fwd ? pr.in : (wgrad ? pr.tokens : pr.out);
  const bool a_col = wgrad, b_col = fwd;
  const int sms = ctx.prop.multiProcessorCount;
  const int64_t tiles = ((m + 127) / 128) * ((n + 255) / 256);
  if (only_stream_k_shapes && (tiles <= sms || tiles % sms == 0)) return;
  if (tiles < static_cast<int64_t>(g_ab_min_waves) * sms) return;
  if (g_ab_tail_only) {
    // The plan depends on the operands' addresses only through their alignment: planned on
    // stand-in addresses, before the operands are made.
    void* const aligned = reinterpret_cast<void*>(uintptr_t{1} << 20);
    const GemmArgs probe = dense_args(ctx, dt, m, n, k, aligned, a_col, aligned, b_col, aligned);
    if (!gemmt::detail::gemm_sm90_auto_stream_k_tail(probe)) return;
  }
  const SweepOperands ops(ctx, dt, m, n, k, 5 + m + n + k);
  const GemmArgs args = dense_args(ctx, dt, m, n, k, ops.a, a_col, ops.b, b_col, ops.c);
  if (!gemmt::gemm_sm90_supports(args) || gemmt::detail::gemm_sm90_auto_swaps(args)) return;
  struct Sched {
    int bn, splits;
    const char* name;
  };
  const Sched scheds[] = {{256, 1, "whole"},
                          {256, -1, "stream-k"},
                          {128, 1, "medium"},
                          {192, 1, "3/4"},
                          {256, -4, "sk-tail"}};
  constexpr int kScheds = 5;
  std::size_t ws_bytes = 0;
  for (const Sched& sc : scheds) {
    ws_bytes =
        std::max(ws_bytes, gemmt::detail::gemm_sm90_split_workspace_bytes(args, sc.splits, sc.bn));
  }
  void* ws = workspace(ws_bytes, ctx.stream);
  std::vector<double> ms[kScheds];
  for (int r = 0; r < rounds; ++r) {
    for (int j = 0; j < kScheds; ++j) {
      const int i = (j + r) % kScheds;
      char what[160];
      std::snprintf(what, sizeof what, "sk-ab %s %lld %lld->%lld %s", pr.what, (long long)pr.tokens,
                    (long long)pr.in, (long long)pr.out, scheds[i].name);
      ms[i].push_back(median_ms(ctx, what, [&] {
        return gemmt::detail::gemm_sm90_run_splits(args, scheds[i].splits, scheds[i].bn, ws,
                                                   ctx.stream);
      }));
    }
  }
  double med[kScheds];
  for (int i = 0; i < kScheds; ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    med[i] = ms[i][ms[i].size() / 2];
  }
  const int auto_bn = gemmt::detail::gemm_sm90_auto_tile_n(args);
  std::printf(
      "SKAB %-5s %5lld %6lld->%-6lld %6lld x %6lld x %6lld waves %6.2f whole %8.4f stream-k "
      "%8.4f medium %8.4f 3/4 %8.4f sk-tail %8.4f ms sk/whole %.4f planner bn=%d %s\n",
      pr.what, (long long)pr.tokens, (long long)pr.in, (long long)pr.out, (long long)m,
      (long long)n, (long long)k, static_cast<double>(tiles) / sms, med[0], med[1], med[2], med[3],
      med[4], med[1] / med[0], auto_bn, auto_schedule(args));
  std::fflush(stdout);
}

// --sk-ab-short-k: products with 4 to 12 k-blocks, where the planner takes the medium tile
// from 5 to 8 (short_k_ping_pong): grad_weight products over 256 to 768 tokens for the
// benchmark's weights and held-out ones (both operands MN-major), then the forward and
// grad_input products of layers with 320 to 768 input or output features (K-major A).
bool g_ab_short_k = false;

void run_short_k_ab(Ctx& ctx, int rounds) {
  const int64_t weights[][2] = {{4096, 11008}, {11008, 4096}, {4096, 14336}, {14336, 4096},
                                {8192, 28672}, {28672, 8192}, {4096, 32000}, {5120, 13824},
                                {13824, 5120}, {3584, 18944}, {18944, 3584}, {7168, 18432},
                                {18432, 7168}, {4096, 4096},  {8192, 8192}};
  for (int64_t t : {256, 320, 384, 512, 768}) {
    for (const auto& w : weights)
      time_schedules(ctx, AbProduct{"wgrad", t, w[0], w[1]}, rounds, false);
  }
  for (int64_t narrow : {320, 384, 512, 768}) {
    for (int64_t t : {4096, 8192}) {
      for (int64_t wide : {2048, 4096, 11008}) {
        time_schedules(ctx, AbProduct{"fwd", t, narrow, wide}, rounds, false);
        time_schedules(ctx, AbProduct{"dgrad", t, wide, narrow}, rounds, false);
      }
    }
  }
}

// --sk-ab-many-waves: products with five waves of wide tiles or more (stream_k_tail_only
// stops there) and a partial last wave, over 2048, 4096 and 8192 tokens, for the benchmark's
// weights and held-out ones: is spreading the last wave alone still worth its hand-overs?
bool g_ab_many_waves = false;

void run_many_waves_ab(Ctx& ctx, int rounds) {
  const int64_t weights[][2] = {{4096, 11008}, {11008, 4096}, {4096, 14336}, {14336, 4096},
                                {8192, 28672}, {28672, 8192}, {4096, 32000}, {5120, 13824},
                                {13824, 5120}, {3584, 18944}, {18944, 3584}, {7168, 18432}};
  g_ab_min_waves = 5;
  for (int64_t t : {2048, 4096, 8192}) {
    for (const auto& w : weights) {
      for (const char* what : {"fwd", "dgrad", "wgrad"}) {
        time_schedules(ctx, AbProduct{what, t, w[0], w[1]}, rounds, true);
      }
    }
  }
  g_ab_min_waves = 0;
}

// --sk-ab-attention: the attention projections, which the Linear benchmark does not cover:
// square weights of hidden sizes 4096 to 8192 and the narrow k / v projections of grouped
// attention (1024 outputs), over 512 to 4096 tokens, single waves of tiles included.
bool g_ab_attention = false;

void run_attention_ab(Ctx& ctx, int rounds) {
  const int64_t weights[][2] = {
      {4096, 4096}, {4096, 1024}, {5120, 5120}, {8192, 8192}, {8192, 1024}};
  for (int64_t t : {512, 1024, 2048, 4096}) {
    for (const auto& w : weights) {
      for (const char* what : {"fwd", "dgrad", "wgrad"}) {
        time_schedules(ctx, AbProduct{what, t, w[0], w[1]}, rounds, false);
      }
    }
  }
}

// --sk-ab-max-tokens T: the default list's products over at most T tokens only.
int64_t g_ab_max_tokens = 0;

void run_stream_k_ab(Ctx& ctx, int rounds) {
  std::printf("\nSchedules A/B (bf16, %d rotating rounds of medians of %d):\n", rounds,
              g_timed_runs);
  if (g_ab_short_k) {
    run_short_k_ab(ctx, rounds);
    return;
  }
  if (g_ab_many_waves) {
    run_many_waves_ab(ctx, rounds);
    return;
  }
  if (g_ab_attention) {
    run_attention_ab(ctx, rounds);
    return;
  }
  const int64_t weights[][2] = {{4096, 11008}, {11008, 4096}, {4096, 14336}, {14336, 4096},
                                {8192, 28672}, {28672, 8192}, {4096, 32000}};
  for (int64_t t : {512, 1024, 2048, 8192}) {
    if (g_ab_max_tokens > 0 && t > g_ab_max_tokens) continue;
    for (const auto& w : weights) {
      for (const char* what : {"fwd", "dgrad", "wgrad"}) {
        time_schedules(ctx, AbProduct{what, t, w[0], w[1]}, rounds, true);
      }
    }
  }
  // Elsewhere: hidden 5120 / 3584 / 6144 / 7168 with their intermediate sizes, a 5120-wide
  // vocabulary projection's grad_input, and a grad_weight over 16384 tokens.
  const AbProduct held_out[] = {
      {"fwd", 2048, 13824, 5120},   {"dgrad", 2048, 5120, 13824},  {"fwd", 2048, 27648, 5120},
      {"dgrad", 2048, 5120, 32000}, {"fwd", 1536, 16384, 6144},    {"fwd", 3072, 16384, 6144},
      {"fwd", 4096, 18944, 3584},   {"fwd", 6144, 18432, 7168},    {"dgrad", 1536, 7168, 18432},
      {"fwd", 512, 7168, 18432},    {"wgrad", 16384, 5120, 13824}, {"fwd", 1024, 4096, 14336},
      {"fwd", 3072, 5120, 13824},   {"fwd", 6144, 5120, 13824}};
  for (const AbProduct& pr : held_out) {
    if (g_ab_max_tokens == 0 || pr.tokens <= g_ab_max_tokens)
      time_schedules(ctx, pr, rounds, false);
  }
}

// Decode-sized products (m tokens against a weight W of n x k, x @ W^T) in both orientations
// and several split counts, weights rotated through buffers larger than L2 together so that
// every product reads W from DRAM: one "DECODESWEEP" line per configuration, with the
// weight's streaming rate. Fits the swap rule and split model of kernels/plan/sm90_plan.cpp.
void run_decode_sweep(Ctx& ctx) {
  using gemmt::detail::Sm90Orientation;
  struct Weight {
    int64_t k, n;
  };
  const Weight weights[] = {{4096, 11008}, {11008, 4096}, {4096, 14336}, {14336, 4096},
                            {8192, 28672}, {28672, 8192}, {4096, 32000}, {4096, 4096}};
  const int64_t tokens[] = {2, 16, 64, 128, 192, 256};
  const DtypeInfo& dt = kDtypes[0];  // bf16
  std::printf("\nDecode sweep (bf16 x @ W^T, W from DRAM, median of 20):\n");
  for (const Weight& w : weights) {
    const size_t w_bytes = static_cast<size_t>(w.k * w.n) * dt.elt;
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{200} << 20) / w_bytes + 1));
    std::vector<void*> dW(copies);
    Rng rng(5 + w.k + w.n);
    HostBuf hw = make_random(dt, w.k * w.n, rng);
    for (void*& p : dW) {
      CHECK_CUDA(cudaMalloc(&p, w_bytes));
      copy_sync(p, hw.bits.data(), w_bytes, cudaMemcpyHostToDevice, ctx.stream);
    }
    void *dX, *dC;
    CHECK_CUDA(cudaMalloc(&dX, static_cast<size_t>(256 * w.k) * dt.elt));
    CHECK_CUDA(cudaMalloc(&dC, static_cast<size_t>(256 * w.n) * dt.elt));
    HostBuf hx = make_random(dt, 256 * w.k, rng);
    copy_sync(dX, hx.bits.data(), hx.bits.size(), cudaMemcpyHostToDevice, ctx.stream);
    for (int64_t m : tokens) {
      GemmArgs args = base_args(ctx, dt);
      args.m = m;
      args.n = w.n;
      args.k = w.k;
      args.a = dX;
      args.a_stride_m = w.k;
      args.a_stride_k = 1;
      args.b_stride_k = 1;  // W^T: B's column j is W's row j
      args.b_stride_n = w.k;
      args.c = dC;
      args.ldc = w.n;
      args.b = dW[0];
      if (!gemmt::gemm_sm90_supports(args)) continue;
      const bool auto_swap = gemmt::detail::gemm_sm90_auto_swaps(args);
      const int auto_splits = gemmt::detail::gemm_sm90_auto_splits(args);
      const int auto_bn = gemmt::detail::gemm_sm90_auto_tile_n(args);
      struct Config {
        Sm90Orientation orient;
        int bn, splits;
        const char* name;
      };
      const Config configs[] = {{Sm90Orientation::kAuto, 0, 0, "auto"},
                                {Sm90Orientation::kAsGiven, 0, 0, "given"},
                                {Sm90Orientation::kAsGiven, 64, 1, "given"},
                                {Sm90Orientation::kAsGiven, 64, 2, "given"},
                                {Sm90Orientation::kAsGiven, 64, 3, "given"},
                                {Sm90Orientation::kAsGiven, 64, 4, "given"},
                                {Sm90Orientation::kAsGiven, 128, 0, "given"},
                                {Sm90Orientation::kAsGiven, 128, 1, "given"},
                                {Sm90Orientation::kAsGiven, 128, 2, "given"},
                                {Sm90Orientation::kAsGiven, 256, 1, "given"},
                                {Sm90Orientation::kAsGiven, 256, 2, "given"},
                                {Sm90Orientation::kAsGiven, 256, 0, "given"},
                                {Sm90Orientation::kSwapped, 0, 0, "swapped"},
                                {Sm90Orientation::kSwapped, 0, 1, "swapped"},
                                {Sm90Orientation::kSwapped, 0, 2, "swapped"},
                                {Sm90Orientation::kSwapped, 0, 4, "swapped"}};
      for (const Config& c : configs) {
        if (c.orient == Sm90Orientation::kSwapped && m > 64) continue;
        if (!gemmt::detail::gemm_sm90_forced_supports(args, c.bn, c.orient)) continue;
        void* ws = workspace(
            gemmt::detail::gemm_sm90_split_workspace_bytes(args, c.splits, c.bn, c.orient),
            ctx.stream);
        int next = 0;
        char what[160];
        std::snprintf(what, sizeof what, "decode %lldx%lldx%lld %s bn=%d splits=%d", (long long)m,
                      (long long)w.n, (long long)w.k, c.name, c.bn, c.splits);
        const double ms = median_ms(ctx, what, [&] {
          GemmArgs a = args;
          a.b = dW[next];
          next = (next + 1) % copies;
          return gemmt::detail::gemm_sm90_run_splits(a, c.splits, c.bn, ws, ctx.stream, c.orient);
        });
        std::printf(
            "DECODESWEEP k=%5lld n=%6lld m=%3lld %-7s bn=%3d splits=%d %8.2f us %6.0f GB/s%s\n",
            (long long)w.k, (long long)w.n, (long long)m, c.name, c.bn, c.splits, ms * 1e3,
            static_cast<double>(w_bytes) / (ms * 1e-3) / 1e9,
            c.orient == Sm90Orientation::kAuto ? (auto_swap ? "  (auto: swapped" : "  (auto: given")
                                               : "");
        if (c.orient == Sm90Orientation::kAuto) {
          std::printf(", bn=%d splits=%d)\n", auto_bn, auto_splits);
        }
        std::fflush(stdout);
      }
    }
    CHECK_CUDA(cudaStreamSynchronize(ctx.stream));
    for (void* p : dW) CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFree(dX));
    CHECK_CUDA(cudaFree(dC));
  }
}

void run_perf(Ctx& ctx) {
  const int64_t sizes[] = {4096, 8192};
  std::printf("\nThroughput (median of 20, TFLOP/s; '-' = not supported here):\n");
  for (int dti = 0; dti < 3; ++dti) {
    const DtypeInfo& dt = kDtypes[dti];
    for (int64_t s : sizes) {
      const size_t bytes = static_cast<size_t>(s * s) * dt.elt;
      void *dA, *dB, *dC;
      CHECK_CUDA(cudaMalloc(&dA, bytes));
      CHECK_CUDA(cudaMalloc(&dB, bytes));
      CHECK_CUDA(cudaMalloc(&dC, bytes));
      Rng rng(1234 + s);
      HostBuf h = make_random(dt, s * s, rng);
      copy_sync(dA, h.bits.data(), bytes, cudaMemcpyHostToDevice, ctx.stream);
      copy_sync(dB, h.bits.data(), bytes, cudaMemcpyHostToDevice, ctx.stream);
      for (const Layout& lay : kLayouts) {
        // Keep the report short: every layout for bf16 8192 and for tf32 (each tf32 layout
        // takes a different path), the torch.matmul case otherwise.
        const bool torch_case = !lay.a_col && !lay.b_col;
        if (!(torch_case || dt.elt == 4 || (dti == 0 && s == 8192))) continue;
        std::printf("  %-4s %5lld^3 %-12s", dt.name, (long long)s, lay.name);
        // The pinned tile widths are timed by the split sweep, not here.
        for (int pi = 0; pi < kSm90Wide; ++pi) {
          const double tf =
              bench(ctx, static_cast<Path>(pi), dt, s, lay.a_col, lay.b_col, dA, dB, dC);
          if (tf < 0) {
            std::printf("  %s: %7s", kPathNames[pi], "-");
          } else {
            std::printf("  %s: %7.1f", kPathNames[pi], tf);
          }
        }
        std::printf("\n");
        std::fflush(stdout);
      }
      CHECK_CUDA(cudaFree(dA));
      CHECK_CUDA(cudaFree(dB));
      CHECK_CUDA(cudaFree(dC));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, perf = true, tests = true, sweep = false, decode_sweep = false;
  bool sk_sweep = false;
  int sk_ab_rounds = 0;
  int64_t sk_shape[3] = {0, 0, 0};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--sweep")) sweep = true;
    if (!std::strcmp(argv[i], "--decode-sweep")) decode_sweep = true;
    if (!std::strcmp(argv[i], "--sk-sweep")) sk_sweep = true;
    // --sk-shape M N K: the stream-k sweep on that one shape (bf16, all layouts)
    if (!std::strcmp(argv[i], "--sk-shape") && i + 3 < argc) {
      sk_sweep = true;
      sk_shape[0] = std::atoll(argv[i + 1]);
      sk_shape[1] = std::atoll(argv[i + 2]);
      sk_shape[2] = std::atoll(argv[i + 3]);
      i += 3;
      tests = perf = false;
    }
    // --sk-ab R: the wide-tile schedules against each other in R rotating rounds (tests off)
    if (!std::strcmp(argv[i], "--sk-ab") && i + 1 < argc) {
      sk_ab_rounds = std::max(1, std::atoi(argv[++i]));
      tests = perf = false;
    }
    if (!std::strcmp(argv[i], "--sk-ab-tail")) g_ab_tail_only = true;
    if (!std::strcmp(argv[i], "--sk-ab-short-k")) g_ab_short_k = true;
    if (!std::strcmp(argv[i], "--sk-ab-many-waves")) g_ab_many_waves = true;
    if (!std::strcmp(argv[i], "--sk-ab-attention")) g_ab_attention = true;
    if (!std::strcmp(argv[i], "--sk-ab-max-tokens") && i + 1 < argc) {
      g_ab_max_tokens = std::atoll(argv[++i]);
    }
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc)
      g_timed_runs = std::max(1, std::atoi(argv[++i]));
    if (!std::strcmp(argv[i], "--no-perf")) perf = false;
    if (!std::strcmp(argv[i], "--perf-only")) tests = false;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  Ctx ctx;
  CHECK_CUDA(cudaGetDeviceProperties(&ctx.prop, 0));
  CHECK_CUDA(cudaStreamCreate(&ctx.stream));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", ctx.prop.name, ctx.prop.major, ctx.prop.minor,
              ctx.prop.multiProcessorCount);

  const Shape shapes[] = {
      {128, 256, 64, false},
      {4096, 4096, 4096, true},
      {1000, 1000, 1000, false},
      {127, 8192, 511, false},
      {8192, 64, 8192, true},
      {1, 512, 512, false},
      {129, 257, 65, false},
      {200, 328, 136, false},  // ragged tiles; odd k: staged
      {256, 256, 16384, false},
      {300, 130, 4099, false},  // split-k (the latter staged too)
      {200, 64, 300, false},
      {130, 33, 2000, false},  // narrow tile (N <= 64)
      {333, 1, 520, false},
      {2048, 48, 8192, false},  // narrow, with split-k
      {64, 300, 1000, false},
      {48, 2048, 8192, false},  // tf32 C^T with the narrow tile
      {520, 1032, 96, false},   // tf32 C^T, ragged, 3 k-blocks
      // Stream-k on the last wave alone (sm90-skt): 1.25 waves of single CTAs (an odd count
      // of 128-row tiles) with ranges of a quarter tile, and 1.95 waves of CTA pairs; and a
      // last wave of one tile of 8 k-blocks, fewer than the clusters (runs as whole tiles).
      {640, 8448, 1024, true},
      {768, 11008, 2048, true},
      {256, 17152, 512, true},
  };
  if (tests) {
    uint64_t seed = 1;
    for (int dti = 0; dti < 3; ++dti) {
      for (const Shape& sh : shapes) {
        ++seed;
        if (quick && sh.big) continue;
        test_shape(ctx, dti, sh, seed);
      }
    }
  }

  int passed = 0, failed = 0;
  if (tests) {
    std::printf("\nSummary (configurations passed / failed / not supported):\n");
    for (int dti = 0; dti < 3; ++dti) {
      for (int pi = 0; pi < kNumPaths; ++pi) {
        const Stats& s = ctx.stats[dti][pi];
        std::printf("  %-4s %-8s %4d / %4d / %4d\n", kDtypes[dti].name, kPathNames[pi], s.passed,
                    s.failed, s.unsupported);
        passed += s.passed;
        failed += s.failed;
      }
    }
  }
  if (perf) run_perf(ctx);
  if (sweep) run_split_sweep(ctx);
  if (decode_sweep) run_decode_sweep(ctx);
  if (sk_sweep) run_stream_k_sweep(ctx, sk_shape[0], sk_shape[1], sk_shape[2]);
  if (sk_ab_rounds > 0) run_stream_k_ab(ctx, sk_ab_rounds);
  CHECK_CUDA(cudaStreamDestroy(ctx.stream));
  if (tests) {
    std::printf("\n%d passed, %d failed\n", passed, failed);
    std::printf("%s\n", failed == 0 ? "PASS" : "FAIL");
  }
  return failed == 0 ? 0 : 1;
}
