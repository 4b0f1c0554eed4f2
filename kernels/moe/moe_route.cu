// The top-k router of the mixture-of-experts layer: one warp per token, the token's scores in
// shared memory. Each lane owns the experts e with e % 32 == lane and keeps the best of them
// not yet chosen; a round of the top-k is one warp-wide arg-max of those candidates, after
// which only the winner's lane looks at its experts again. The choices come out in the order
// of a stable descending sort (torch.sort(stable=True, descending=True)): larger first, NaN
// above every number, equal values by lower index. That is the CPU reference's order, so the
// ids agree with it exactly wherever the scores do.
#include <cstdint>

#include <cuda_runtime.h>

#include "gemmt/cuda_check.h"
#include "gemmt/launch.cuh"
#include "gemmt/moe.h"
#include "gemmt/numeric.cuh"

namespace gemmt {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxRouteWarps = 4;
// Dynamic shared memory a block gets without opting in.
constexpr std::size_t kDefaultSmem = 48 * 1024;

__device__ __forceinline__ float neg_inf(float) {
  return __int_as_float(0xff800000);
}
__device__ __forceinline__ double neg_inf(double) {
  return __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
}
__device__ __forceinline__ float exp_of(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_of(double x) {
  return exp(x);
}
template <typename S>
__device__ __forceinline__ bool is_nan(S v) {
  return v != v;
}

// An expert (or group) and its value; index -1 is "none", below everything.
template <typename S>
struct Cand {
  S v;
  int i;
};

// a before b in a stable descending sort.
template <typename S>
__device__ __forceinline__ bool before(const Cand<S>& a, const Cand<S>& b) {
  if (b.i < 0) return a.i >= 0;
  if (a.i < 0) return false;
  const bool an = is_nan(a.v), bn = is_nan(b.v);
  if (an != bn) return an;
  if (!an && a.v != b.v) return a.v > b.v;
  return a.i < b.i;
}

// The first of the warp's candidates; every lane gets it (the order is total, so the
// butterfly agrees everywhere).
template <typename S>
__device__ __forceinline__ Cand<S> warp_first(Cand<S> c) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) {
    const Cand<S> o{__shfl_xor_sync(kFullMask, c.v, off), __shfl_xor_sync(kFullMask, c.i, off)};
    if (before(o, c)) c = o;
  }
  return c;
}

// The first of this lane's entries of arr[0, n) that come after `last` (all of them when
// last is none): the entries before it have been chosen already.
template <typename S>
__device__ __forceinline__ Cand<S> lane_first(const S* arr, int n, int lane, const Cand<S>& last) {
  Cand<S> best{S(0), -1};
  for (int j = lane; j < n; j += kWarp) {
    const Cand<S> c{arr[j], j};
    if (last.i >= 0 && !before(last, c)) continue;
    if (before(c, best)) best = c;
  }
  return best;
}

// Chooses the first `count` entries of arr[0, n) in order, calling on_choice(r, winner) for
// each (uniformly on every lane); returns the last one chosen.
template <typename S, typename F>
__device__ __forceinline__ Cand<S> choose_first(const S* arr, int n, int count, int lane,
                                                F&& on_choice) {
  Cand<S> mine = lane_first(arr, n, lane, Cand<S>{S(0), -1});
  Cand<S> win{S(0), -1};
  for (int r = 0; r < count; ++r) {
    win = warp_first(mine);
    on_choice(r, win);
    if (mine.i == win.i) mine = lane_first(arr, n, lane, win);
  }
  return win;
}

// max that propagates NaN, as ATen's vectorised maximum does in the CPU softmax.
template <typename S>
__device__ __forceinline__ S max_nan(S a, S b) {
  return (is_nan(a) || a > b) ? a : (is_nan(b) ? b : (b > a ? b : a));
}

template <typename S>
__device__ __forceinline__ S warp_max_nan(S v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = max_nan(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

template <typename S>
__device__ __forceinline__ S warp_sum(S v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = add_rn(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// The score of one logit: softmax as exp(x - max) * (1 / sum), the CPU softmax's form;
// sigmoid as 1 / (1 + exp(-x)). Pinned roundings, so that recomputing a chosen expert's
// score gives the bits it was chosen on.
template <typename S>
__device__ __forceinline__ S score_of(S x, bool softmax, S max, S inv_sum) {
  if (softmax) return mul_rn(exp_of(add_rn(x, -max)), inv_sum);
  return div_rn(S(1), add_rn(S(1), exp_of(-x)));
}

template <typename T>
__global__ void __launch_bounds__(kMaxRouteWarps* kWarp)
    moe_route_kernel(const T* __restrict__ logits, std::int64_t row_stride, std::int64_t col_stride,
                     const opmath_t<T>* __restrict__ bias, MoeRouteArgs args,
                     opmath_t<T>* __restrict__ weights, std::int64_t* __restrict__ ids) {
  using S = opmath_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int experts = static_cast<int>(args.experts), groups = static_cast<int>(args.n_group),
            top_k = static_cast<int>(args.top_k);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  S* vals = reinterpret_cast<S*>(smem_raw) + static_cast<std::size_t>(warp) * (experts + groups);
  S* group_score = vals + experts;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * warps;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * warps + warp; t < args.tokens;
       t += step) {
    const T* row = logits + t * row_stride;
    __syncwarp();  // the previous token's cross-lane reads are done
    S max = neg_inf(S(0));
    for (int e = lane; e < experts; e += kWarp) {
      const S x = to_opmath(row[e * col_stride]);
      vals[e] = x;
      max = max_nan(max, x);
    }
    S inv_sum = S(1);
    if (args.softmax) {
      max = warp_max_nan(max);
      S sum = S(0);
      for (int e = lane; e < experts; e += kWarp) sum = add_rn(sum, exp_of(add_rn(vals[e], -max)));
      inv_sum = div_rn(S(1), warp_sum(sum));
    }
    // The choice: scores plus the correction bias (which steers the choice, not the weights).
    for (int e = lane; e < experts; e += kWarp) {
      const S s = score_of(vals[e], args.softmax, max, inv_sum);
      vals[e] = bias != nullptr ? add_rn(s, bias[e]) : s;
    }
    if (groups > 0) {
      // Group-limited routing: a group's score is the sum of its two first entries; the
      // experts outside the topk_group first groups are set to -inf, as the reference's
      // masked_fill does (so they still rank, by index, among other -inf entries).
      const int per = experts / groups;
      __syncwarp();
      for (int g = lane; g < groups; g += kWarp) {
        Cand<S> b1{S(0), -1}, b2{S(0), -1};
        for (int e = g * per; e < (g + 1) * per; ++e) {
          const Cand<S> c{vals[e], e};
          if (before(c, b1)) {
            b2 = b1;
            b1 = c;
          } else if (before(c, b2)) {
            b2 = c;
          }
        }
        group_score[g] = per >= 2 ? add_rn(b1.v, b2.v) : b1.v;
      }
      const Cand<S> last = choose_first(group_score, groups, static_cast<int>(args.topk_group),
                                        lane, [](int, const Cand<S>&) {});
      __syncwarp();
      for (int e = lane; e < experts; e += kWarp) {
        const int g = e / per;
        const Cand<S> c{group_score[g], g};
        if (g != last.i && !before(c, last)) vals[e] = neg_inf(S(0));
      }
    }
    // vals[e] is read and written by lane e % 32 alone from here on.
    S* w_row = weights + t * top_k;
    std::int64_t* id_row = ids + t * top_k;
    S sum = S(0);
    choose_first(vals, experts, top_k, lane, [&](int r, const Cand<S>& win) {
      if (lane == 0) {
        const S w = score_of(to_opmath(row[win.i * col_stride]), args.softmax, max, inv_sum);
        id_row[r] = win.i;
        w_row[r] = w;
        sum = add_rn(sum, w);
      }
    });
    if (args.renormalize && lane == 0) {
      // The floor keeps all-underflowed sigmoid scores from dividing 0 by 0; NaN stays NaN.
      const S floor = static_cast<S>(1.17549435e-38f);
      const S denom = sum < floor ? floor : sum;
      for (int r = 0; r < top_k; ++r) w_row[r] = div_rn(w_row[r], denom);
    }
  }
}

}  // namespace

cudaError_t moe_route_run(ScalarType logits_dtype, const void* logits, std::int64_t row_stride,
                          std::int64_t col_stride, const void* correction_bias,
                          const MoeRouteArgs& args, void* weights, std::int64_t* expert_ids,
                          cudaStream_t stream) {
  const bool grouped_ok = args.n_group == 0
                              ? args.topk_group == 0
                              : (args.n_group > 0 && args.experts % args.n_group == 0 &&
                                 args.topk_group >= 1 && args.topk_group <= args.n_group);
  if (args.tokens < 0 || args.experts < 1 || args.experts > kMoeRouteMaxExperts || args.top_k < 1 ||
      args.top_k > args.experts || !grouped_ok) {
    return cudaErrorInvalidValue;
  }
  if (args.tokens == 0) return cudaSuccess;
  return dispatch_float_or_double_dtype(logits_dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    using S = opmath_t<T>;
    const std::size_t per_warp = static_cast<std::size_t>(args.experts + args.n_group) * sizeof(S);
    int warps = static_cast<int>(kDefaultSmem / per_warp);
    warps = warps < 1 ? 1 : (warps > kMaxRouteWarps ? kMaxRouteWarps : warps);
    const std::size_t smem = per_warp * warps;
    if (smem > kDefaultSmem)
      GEMMT_RETURN_IF_ERROR(allow_dynamic_smem<moe_route_kernel<T>>(static_cast<int>(smem)));
    moe_route_kernel<T><<<grid_1d(args.tokens, warps), warps * kWarp, smem, stream>>>(
        static_cast<const T*>(logits), row_stride, col_stride,
        static_cast<const S*>(correction_bias), args, static_cast<S*>(weights), expert_ids);
    GEMMT_RETURN_LAUNCH_ERROR();
  });
}

}  // namespace gemmt
