// Times the Linear backward's activation pass (grad * act'(z) and the bias column sums) in
// several block shapes of 256 threads: C threads across a row (C packs of 16 bytes) by
// 256 / C rows. Also a flat elementwise pass with no column sums (the ceiling for the
// traffic) and a device-to-device copy, all in the same run. bf16, CUDA events, median of
// 30 after 3 warm-ups. Every shape's output is compared with the first one's.
//
//   act_backward_layout            (built by build.sh)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "../../../tests/cuda/bench_util.cuh"
#include "gemmt/activation.h"
#include "gemmt/types.h"

namespace gemmt {
#define DECLARE_VARIANT(C)                                                                    \
  std::size_t act_ws_##C(ScalarType, int64_t, int64_t, int);                                  \
  cudaError_t act_run_##C(ScalarType, int64_t, int64_t, const void*, const void*, Activation, \
                          void*, void*, void*, int, cudaStream_t);
DECLARE_VARIANT(32)
DECLARE_VARIANT(64)
DECLARE_VARIANT(128)
DECLARE_VARIANT(256)
}  // namespace gemmt

using namespace gemmt;

#define CHECK(x) gemmt_bench::check((x), #x)

// Random bf16 values in [-3, 3): the shared float fill, scaled and rounded.
__global__ void to_bf16(const float* src, __nv_bfloat16* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = __float2bfloat16(3.f * src[i]);
  }
}

static void fill_random_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  float* tmp = nullptr;
  CHECK(cudaMalloc(&tmp, n * sizeof(float)));
  gemmt_bench::fill_random<<<1024, 256>>>(tmp, n, seed);
  to_bf16<<<1024, 256>>>(tmp, p, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(tmp));
}

// The ceiling: grad * (z > 0) over flat 16-byte packs, four packs in flight per thread.
__global__ void flat_relu_backward(const uint4* g, const uint4* z, uint4* out, int64_t packs) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i0 = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i0 < packs; i0 += 4 * stride) {
    uint4 gv[4], zv[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t i = i0 + u * stride;
      if (i < packs) {
        gv[u] = __ldg(g + i);
        zv[u] = __ldg(z + i);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t i = i0 + u * stride;
      if (i >= packs) continue;
      const uint32_t* gw = &gv[u].x;
      const uint32_t* zw = &zv[u].x;
      uint32_t o[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t m = 0;
        if ((zw[k] & 0x8000u) == 0 && (zw[k] & 0x7fffu) != 0) m |= 0xffffu;
        if ((zw[k] & 0x80000000u) == 0 && (zw[k] & 0x7fff0000u) != 0) m |= 0xffff0000u;
        o[k] = gw[k] & m;
      }
      out[i] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

// Median microseconds of 30 timed calls after three warm-ups (tests/cuda/bench_util.cuh).
static float median_us(const std::function<void()>& fn) {
  return static_cast<float>(1e3 * gemmt_bench::median_ms(
                                      [&] {
                                        fn();
                                        return cudaGetLastError();
                                      },
                                      30));
}

using RunFn = cudaError_t (*)(ScalarType, int64_t, int64_t, const void*, const void*, Activation,
                              void*, void*, void*, int, cudaStream_t);
using WsFn = std::size_t (*)(ScalarType, int64_t, int64_t, int);

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t copy_bytes = int64_t{1} << 29;
  void *cs, *cd;
  CHECK(cudaMalloc(&cs, copy_bytes));
  CHECK(cudaMalloc(&cd, copy_bytes));
  const float copy_us =
      median_us([&] { CHECK(cudaMemcpyAsync(cd, cs, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbps = 2.0 * copy_bytes / copy_us / 1e3;
  std::printf("copy %.0f GB/s (bytes read + written)\n", copy_gbps);
  CHECK(cudaFree(cs));
  CHECK(cudaFree(cd));

  struct Variant {
    int cols;
    RunFn run;
    WsFn ws;
  };
  const Variant variants[] = {{32, act_run_32, act_ws_32},
                              {64, act_run_64, act_ws_64},
                              {128, act_run_128, act_ws_128},
                              {256, act_run_256, act_ws_256}};
  const int64_t shapes[][2] = {{2048, 11008}, {8192, 11008}, {2048, 14336}, {4096, 4096}};
  const Activation acts[] = {Activation::kReLU, Activation::kGeluTanh, Activation::kSilu};
  const char* act_names[] = {"relu", "gelu_tanh", "silu"};
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], cols = sh[1], n = rows * cols;
    __nv_bfloat16 *g, *z, *out, *ref, *bias, *bias_ref;
    CHECK(cudaMalloc(&g, n * 2));
    CHECK(cudaMalloc(&z, n * 2));
    CHECK(cudaMalloc(&out, n * 2));
    CHECK(cudaMalloc(&ref, n * 2));
    CHECK(cudaMalloc(&bias, cols * 2));
    CHECK(cudaMalloc(&bias_ref, cols * 2));
    fill_random_bf16(g, n, 1u);
    fill_random_bf16(z, n, 2u);
    std::size_t ws_bytes = 0;
    for (const auto& v : variants)
      ws_bytes = std::max(ws_bytes, v.ws(ScalarType::kBFloat16, rows, cols, sms));
    void* ws;
    CHECK(cudaMalloc(&ws, ws_bytes + 16));
    const double bytes = 3.0 * n * 2;
    const float flat = median_us([&] {
      flat_relu_backward<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(g),
                                           reinterpret_cast<const uint4*>(z),
                                           reinterpret_cast<uint4*>(out), n / 8);
    });
    std::printf("%lld x %lld flat relu (no sums)      %8.1f us  %.2f of copy\n",
                static_cast<long long>(rows), static_cast<long long>(cols), flat,
                bytes / flat / 1e3 / copy_gbps);
    for (int a = 0; a < 3; ++a) {
      for (int sums = 0; sums < 2; ++sums) {
        for (const auto& v : variants) {
          CHECK(cudaMemset(out, 0xff, n * 2));
          CHECK(cudaMemset(bias, 0xff, cols * 2));
          void* bg = sums ? bias : nullptr;
          auto call = [&] {
            CHECK(v.run(ScalarType::kBFloat16, rows, cols, g, z, acts[a], out, bg, ws, sms, 0));
          };
          call();
          CHECK(cudaDeviceSynchronize());
          // Compare with the first shape's output: grad_preact bit for bit, the sums by
          // relative difference (the order of the float additions differs).
          double diff = 0, bias_diff = 0;
          if (v.cols == 32) {
            CHECK(cudaMemcpy(ref, out, n * 2, cudaMemcpyDeviceToDevice));
            CHECK(cudaMemcpy(bias_ref, bias, cols * 2, cudaMemcpyDeviceToDevice));
          } else {
            std::vector<uint16_t> o(n), r(n);
            CHECK(cudaMemcpy(o.data(), out, n * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(r.data(), ref, n * 2, cudaMemcpyDeviceToHost));
            int64_t mismatch = 0;
            for (int64_t i = 0; i < n; ++i) mismatch += o[i] != r[i];
            diff = static_cast<double>(mismatch);
            if (sums) {
              std::vector<__nv_bfloat16> bo(cols), br(cols);
              CHECK(cudaMemcpy(bo.data(), bias, cols * 2, cudaMemcpyDeviceToHost));
              CHECK(cudaMemcpy(br.data(), bias_ref, cols * 2, cudaMemcpyDeviceToHost));
              double num = 0, den = 0;
              for (int64_t j = 0; j < cols; ++j) {
                const double x = __bfloat162float(bo[j]), y = __bfloat162float(br[j]);
                num += (x - y) * (x - y);
                den += y * y;
              }
              bias_diff = std::sqrt(num / std::max(den, 1e-30));
            }
          }
          const float us = median_us(call);
          std::printf(
              "%lld x %lld %-9s sums=%d cols_threads=%3d %8.1f us  %.2f of copy  "
              "mismatches vs 32: %.0f  bias rel diff vs 32: %.1e\n",
              static_cast<long long>(rows), static_cast<long long>(cols), act_names[a], sums,
              v.cols, us, bytes / us / 1e3 / copy_gbps, diff, bias_diff);
        }
      }
    }
    CHECK(cudaFree(g));
    CHECK(cudaFree(z));
    CHECK(cudaFree(out));
    CHECK(cudaFree(ref));
    CHECK(cudaFree(bias));
    CHECK(cudaFree(bias_ref));
    CHECK(cudaFree(ws));
  }
  return 0;
}
