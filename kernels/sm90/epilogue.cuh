// The Hopper GEMM's epilogue: C (or split-k partials) written from the consumer warpgroups'
// accumulators, register-to-global (direct or transposed) or staged through shared memory
// and TMA stores, with alpha, beta and the GemmEpilogue (bias, activation, pre-activation:
// staged stores only; products that cannot be staged take a split or another family).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/shared_memory.cuh"
#include "sm90/config.cuh"
#include "sm90/ptx.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/trace.cuh"

namespace gemmt {
namespace {

#if defined(GEMMT_SM90_DEVICE_CODE)

// C[row, col] and C[row, col + 1] from one accumulator pair.
template <typename T>
__device__ __forceinline__ void store_pair(const Params& p, T* row_ptr, int col, float v0,
                                           float v1) {
  if (col >= p.n) return;
  T* dst = row_ptr + col;
  const bool has_second = col + 1 < p.n;
  store_c_pair(dst, has_second, p.c_pair, v0, v1, p.alpha, p.beta);
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

// Writes the warpgroup's 64 x (2 * kAcc) block (rows row0.., columns n0..) straight from
// registers. Accumulator i of a thread sits at row 16*warp + lane/4 + 8*((i/2)%2) and column
// 8*(i/4) + 2*(lane%4) + i%2 of the block.
template <typename T, int kAcc>
__device__ __forceinline__ void store_block_direct(const Params& p, const float (&acc)[kAcc],
                                                   int row0, int n0, int warp_in_wg, int lane) {
  const int row = row0 + warp_in_wg * 16 + (lane >> 2);
  const int col0 = n0 + 2 * (lane & 3);
  T* const c = static_cast<T*>(p.c);
  if (row < p.m) {
    T* const r0 = c + static_cast<int64_t>(row) * p.ldc;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      store_pair<T>(p, r0, col0 + 8 * j, acc[4 * j], acc[4 * j + 1]);
    }
  }
  if (row + 8 < p.m) {
    T* const r1 = c + static_cast<int64_t>(row + 8) * p.ldc;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      store_pair<T>(p, r1, col0 + 8 * j, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
}

// The same block for a transposed C (Params::c_trans): block element (row, col) goes to
// C[col * ldc + row]. The eight lanes of a quad column hold eight consecutive rows, i.e.
// 8 consecutive elements of one line of C, so each store instruction still fills whole
// 32-byte sectors.
template <typename T, int kAcc>
__device__ __forceinline__ void store_block_transposed(const Params& p, const float (&acc)[kAcc],
                                                       int row0, int n0, int warp_in_wg, int lane) {
  const int row = row0 + warp_in_wg * 16 + (lane >> 2);
  const int col0 = n0 + 2 * (lane & 3);
  T* const c = static_cast<T*>(p.c);
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = col0 + 8 * j + e;
      if (col >= p.n) continue;
      T* const line = c + static_cast<int64_t>(col) * p.ldc;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (row + 8 * h < p.m) {
          store_c_pair(line + row + 8 * h, false, false, acc[4 * j + 2 * h + e], 0.f, p.alpha,
                       p.beta);
        }
      }
    }
  }
}

template <typename T, int kAcc>
__device__ __forceinline__ void store_block(const Params& p, const float (&acc)[kAcc], int row0,
                                            int n0, int warp_in_wg, int lane) {
  if (p.c_trans) {
    store_block_transposed<T, kAcc>(p, acc, row0, n0, warp_in_wg, lane);
  } else {
    store_block_direct<T, kAcc>(p, acc, row0, n0, warp_in_wg, lane);
  }
}

// A split-k slice's block: float32, unscaled, into its slice of the partial buffer (in C's
// orientation, so that one reduction serves both).
template <int kAcc>
__device__ __forceinline__ void store_partial_block(const Params& p, const float (&acc)[kAcc],
                                                    int split, int row0, int n0, int warp_in_wg,
                                                    int lane) {
  Params q = p;
  q.c = p.partial + static_cast<int64_t>(split) * p.m * p.n;
  q.ldc = p.c_trans ? p.m : p.n;
  q.alpha = 1.f;
  q.beta = 0.f;
  q.c_pair = p.n % 2 == 0;
  store_block<float, kAcc>(q, acc, row0, n0, warp_in_wg, lane);
}

// One round of the staged epilogue of a consumer warpgroup: wait until TMA has read the
// buffer of the previous round, fill it, make the writes visible to the async proxy, and
// let one thread hand it to TMA. The global writes then overlap the next tile's main loop;
// only the reuse of the buffer waits for TMA.
// With an activation or a pre-activation output, `post` then rewrites the filled buffer.
template <class Fill, class Post, class Issue>
__device__ __forceinline__ void staged_store_round(int cw, Fill fill, bool has_post, Post post,
                                                   Issue issue) {
  const bool leader = (threadIdx.x & 127) == 0;
  const uint32_t bar_id = 1 + cw;  // 0 is __syncthreads
  if (leader) bulk_wait_read_all();
  GEMMT_TRACE_EPI(8);
  named_barrier_sync(bar_id, 128);
  GEMMT_TRACE_EPI(9);
  fill();
  GEMMT_TRACE_EPI(10);
  if (has_post) {
    named_barrier_sync(bar_id, 128);
    post();
  }
  fence_proxy_async_smem();
  GEMMT_TRACE_EPI(11);
  named_barrier_sync(bar_id, 128);
  if (leader) {
    GEMMT_TRACE_EPI(12);
    issue();
    bulk_commit();
    GEMMT_TRACE_EPI(13);
  }
}

// Two 16-bit values packed in a word, as floats.
template <typename T>
__device__ __forceinline__ void unpack_pair(uint32_t w, float& lo, float& hi) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  } else {
    __half2 h;
    memcpy(&h, &w, 4);
    const float2 v = __half22float2(h);
    lo = v.x;
    hi = v.y;
  }
}

// A 16-byte chunk as 16 / sizeof(T) floats, and back (rounded to nearest even).
template <typename T>
__device__ __forceinline__ void unpack_chunk(const uint4& c, float (&f)[16 / sizeof(T)]) {
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 4) {
      f[i] = __uint_as_float(w[i]);
    } else {
      unpack_pair<T>(w[i], f[2 * i], f[2 * i + 1]);
    }
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack_chunk(const float (&f)[16 / sizeof(T)]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 4) {
      w[i] = __float_as_uint(f[i]);
    } else {
      w[i] = pack2<T>(f[2 * i], f[2 * i + 1]);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The activation of the post pass: named at compile time (kAct, an Activation), so that a
// chunk's elements are straight-line code the scheduler can interleave, or (kPostActRuntime)
// the exact out-of-line form, chosen at run time.
constexpr int kPostActRuntime = static_cast<int>(Activation::kCount);

template <int kAct>
__device__ __forceinline__ float post_activation(Activation act, float z) {
  if constexpr (kAct == kPostActRuntime) {
    return activation_out_of_line(act, z);
  } else {
    return activation_16bit_inline(static_cast<Activation>(kAct), z);
  }
}

// Where a thread's post pass reads the bias. The 128 threads of a warpgroup walk the round's
// 2 x 64 x 8 chunks with a stride of 128, so thread t only ever meets chunk t % 8 of each
// box: two 16-byte bias vectors a round. They are prefetched into L1 before the fill, whose
// time hides the latency, and loaded once at the start of the pass (loaded per chunk, every
// pair of chunks waited for one: 3.1 us a round, phase stamps on the H100). Prefetching
// instead of loading keeps the fill, which holds all of the tile's accumulators, from
// holding the bias too (that spilled). `interior`: the round can take
// post_round_interior (the bias, if any, is per column, 16-byte aligned and covers the
// round's columns).
// 16-bit outputs have the bias added by the fill (bias_in_fill), so their post pass has none.
template <typename T>
__host__ __device__ constexpr bool bias_in_fill() {
  return sizeof(T) == 2;
}

template <typename T, int kBoxes = 2>
struct PostBias {
  static constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  static constexpr int kBoxCols = 128 / static_cast<int>(sizeof(T));
  bool interior;

  __device__ __forceinline__ PostBias(const EpilogueParams& e, int cbase, int cols) {
    const T* bias = bias_in_fill<T>() ? nullptr : static_cast<const T*>(e.bias);
    interior =
        bias == nullptr || (!e.bias_per_row && (reinterpret_cast<uintptr_t>(bias) & 15u) == 0 &&
                            cbase + kBoxes * kBoxCols <= cols);
    if (bias != nullptr && interior) {
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) prefetch_l1(at(bias, cbase, b));
    }
  }

  __device__ __forceinline__ static const T* at(const T* bias, int cbase, int b) {
    return bias + cbase + b * kBoxCols + (threadIdx.x & 7) * kPer;
  }

  // Box b's bias as floats (zeros without a bias); interior rounds only.
  __device__ __forceinline__ static void load(const T* bias, int cbase, int b, float (&f)[kPer]) {
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);  // zero bits: +0 in every type
    if (bias != nullptr) raw = __ldg(reinterpret_cast<const uint4*>(at(bias, cbase, b)));
    unpack_chunk<T>(raw, f);
  }
};

// A round whose 64 lines and 2 * 128 bytes of columns all lie inside C, with an aligned
// pre-activation if any. The thread's chunks are one column chunk of lines r0 + 16 i of each
// box, all under the same swizzle (16 i keeps the line mod 8). A box's four chunks are read
// together and are then independent straight-line work, so the pass runs at the issue rate
// of its arithmetic instead of at the latency of one chunk after another. The boxes take
// turns: unrolled over both, the pass held too much beside the next round's accumulators
// and spilled.
template <typename T, int kBoxes, int kAct>
__device__ __forceinline__ void post_round_interior(const EpilogueView<T>& v, uint32_t buf,
                                                    int rbase, int cbase) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  constexpr int kBoxCols = 128 / static_cast<int>(sizeof(T));
  constexpr int kChunks = 4;  // of a box, per thread
  const int c = threadIdx.x & 7;
  const int r0 = (threadIdx.x & 127) >> 3;
  const uint32_t base = buf + r0 * 128 + ((c ^ (r0 & 7)) << 4);
  auto addr = [&](int b, int i) { return base + b * kCBoxBytes + i * 16 * 128; };
#pragma unroll 1
  for (int b = 0; b < kBoxes; ++b) {
    uint4 raw[kChunks];
#pragma unroll
    for (int i = 0; i < kChunks; ++i) raw[i] = ld_shared_v4(addr(b, i));
    float bz[kPer];
    PostBias<T, kBoxes>::load(v.bias, cbase, b, bz);
    float z[kChunks][kPer];
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      unpack_chunk<T>(raw[i], z[i]);
#pragma unroll
      for (int e = 0; e < kPer; ++e) z[i][e] += bz[e];
    }
    if (v.preact != nullptr) {
      T* dst = v.preact + static_cast<int64_t>(rbase + r0) * v.ld_preact + cbase + b * kBoxCols +
               c * kPer;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(16 * i) * v.ld_preact) =
            pack_chunk<T>(z[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if constexpr (kAct != static_cast<int>(Activation::kNone)) {
#pragma unroll
        for (int e = 0; e < kPer; ++e) z[i][e] = post_activation<kAct>(v.act, z[i][e]);
      }
      const uint4 out = pack_chunk<T>(z[i]);
      st_shared_v4(addr(b, i), out.x, out.y, out.z, out.w);
    }
  }
}

// The epilogue (bias, pre-activation output, activation) over one staged round: kBoxes (two,
// or one on the 128x192 tile) 128B-swizzled boxes of 64 lines, whose line r holds C row rbase + r
// and 16-byte chunk c of box b holds the C columns from cbase + b * (128 / sizeof(T)) + c * (16 /
// sizeof(T)). The fill has applied alpha and beta (and, for 16-bit T, the bias) and rounded to T.
// Interior rounds take post_round_interior; the others (edges, a per-row or unaligned bias or
// pre-activation) one rolled loop over 16-byte chunks that checks each, so that general code exists
// once per kernel and activation.
template <typename T, int kBoxes, int kAct>
__device__ __forceinline__ void epilogue_post_round_with(const EpilogueParams& e,
                                                         const PostBias<T, kBoxes>& pb,
                                                         uint32_t buf, int rbase, int cbase,
                                                         int rows, int cols) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  constexpr int kBoxCols = 128 / static_cast<int>(sizeof(T));
  EpilogueView<T> v = e.view<T>();
  if constexpr (bias_in_fill<T>()) v.bias = nullptr;
  const bool bias_vec =
      v.bias != nullptr && !v.bias_per_row && (reinterpret_cast<uintptr_t>(v.bias) & 15u) == 0;
  const bool pre_vec = v.preact != nullptr && (reinterpret_cast<uintptr_t>(v.preact) & 15u) == 0 &&
                       (v.ld_preact * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  if (pb.interior && rbase + 64 <= rows && cbase + kBoxes * kBoxCols <= cols &&
      (v.preact == nullptr || pre_vec)) {
    post_round_interior<T, kBoxes, kAct>(v, buf, rbase, cbase);
    return;
  }
#pragma unroll 2
  for (int q = threadIdx.x & 127; q < kBoxes * 64 * 8; q += 128) {
    const int b = q >> 9, r = (q >> 3) & 63, c = q & 7;
    const int row = rbase + r;
    const int col0 = cbase + b * kBoxCols + c * kPer;
    if (row >= rows || col0 >= cols) continue;
    const bool full = col0 + kPer <= cols;
    const uint32_t addr = buf + b * kCBoxBytes + r * 128 + ((c ^ (r & 7)) << 4);
    float z[kPer];
    unpack_chunk<T>(ld_shared_v4(addr), z);
    if (v.bias != nullptr) {
      if (bias_vec && full) {
        float bz[kPer];
        unpack_chunk<T>(__ldg(reinterpret_cast<const uint4*>(v.bias + col0)), bz);
#pragma unroll
        for (int i = 0; i < kPer; ++i) z[i] += bz[i];
      } else {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          if (col0 + i < cols) z[i] += to_float(v.bias[v.bias_per_row ? row : col0 + i]);
        }
      }
    }
    if (v.preact != nullptr) {
      T* dst = v.preact + static_cast<int64_t>(row) * v.ld_preact + col0;
      if (pre_vec && full) {
        *reinterpret_cast<uint4*>(dst) = pack_chunk<T>(z);
      } else {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          if (col0 + i < cols) dst[i] = from_float<T>(z[i]);
        }
      }
    }
    if constexpr (kAct != static_cast<int>(Activation::kNone)) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) z[i] = post_activation<kAct>(v.act, z[i]);
    }
    const uint4 out = pack_chunk<T>(z);
    st_shared_v4(addr, out.x, out.y, out.z, out.w);
  }
}

// The post pass, one instance per activation: 16-bit outputs take the hot activations
// inline (activation_16bit_inline), float outputs the exact out-of-line forms. (Chosen per
// element instead, the activation put each element of a chunk behind its own branches and
// call site: 32 of each per kernel.)
template <typename T, int kBoxes>
__device__ __forceinline__ void epilogue_post_round(const EpilogueParams& e,
                                                    const PostBias<T, kBoxes>& pb, uint32_t buf,
                                                    int rbase, int cbase, int rows, int cols) {
  constexpr int kNone = static_cast<int>(Activation::kNone);
  if (e.act == Activation::kNone) {
    epilogue_post_round_with<T, kBoxes, kNone>(e, pb, buf, rbase, cbase, rows, cols);
  } else if constexpr (sizeof(T) == 2) {
    with_activation(e.act, [&](auto a) {
      constexpr Activation kA = decltype(a)::value;
      constexpr int kForm = kA == Activation::kGelu ? kPostActRuntime : static_cast<int>(kA);
      if constexpr (kA != Activation::kNone) {  // taken above
        epilogue_post_round_with<T, kBoxes, kForm>(e, pb, buf, rbase, cbase, rows, cols);
      }
    });
  } else {
    epilogue_post_round_with<T, kBoxes, kPostActRuntime>(e, pb, buf, rbase, cbase, rows, cols);
  }
}

__device__ __forceinline__ bool has_post_pass(const EpilogueParams& e) {
  return e.active;
}

// Whether the staged store of a block applies the epilogue in its fill (store_block_tma)
// instead of in a post pass over the filled buffer. The post pass reads the buffer back,
// converts, and writes it again after a barrier; on the wide tile, whose two warpgroups
// both wait for the epilogue while the tensor cores idle, that cost 1.5 us a round with
// bias and gelu_tanh (phase stamps, H100). In the fill, each thread's 64 (32 on the 128x192
// tile) accumulators of a round are independent work. Taken for 16-bit wide and 128x192
// tiles with no pre-activation output (its 16-byte stores need the post pass's layout),
// beta == 0, a per-column bias aligned for pair loads and an even n, and an activation
// fill_takes names.
constexpr int kFillPlain = -1;

// The activations the fill applies: for bf16 every one with an inline form (not the erf
// GELU); for fp16 gelu_tanh and silu. (With all four, fp16's single-CTA wide instances
// spilled 20 bytes; bias alone and ReLU keep the post pass there.)
template <typename T>
__host__ __device__ constexpr bool fill_takes(Activation a) {
  return a != Activation::kGelu && (std::is_same<T, __nv_bfloat16>::value ||
                                    a == Activation::kGeluTanh || a == Activation::kSilu);
}

// The wide and three-quarter tiles' blocks (128 and 96 accumulators a thread).
template <typename T, int kAcc>
constexpr bool fill_epilogue_compiled() {
  return sizeof(T) == 2 && (kAcc == 128 || kAcc == 96);
}

template <typename T, int kAcc>
__device__ __forceinline__ bool fill_epilogue(const Params& p) {
  if constexpr (!fill_epilogue_compiled<T, kAcc>()) {
    return false;
  } else {
    const EpilogueParams& e = p.epi;
    return e.active && e.preact == nullptr && !e.bias_per_row && p.beta == 0.f &&
           fill_takes<T>(e.act) && p.n % 2 == 0 && (reinterpret_cast<uintptr_t>(e.bias) & 3u) == 0;
  }
}

// The bias columns of a tile, asked into L1 when its main loop starts, so that the
// epilogue's bias loads (fill or post pass) find them there tens of microseconds later.
template <typename T, int kBN>
__device__ __forceinline__ void prefetch_tile_bias(const Params& p, int n0) {
  constexpr int kLineCols = 128 / static_cast<int>(sizeof(T));
  constexpr int kLines = kBN / kLineCols;
  const T* bias = static_cast<const T*>(p.epi.bias);
  const int i = threadIdx.x & 127;
  if (bias != nullptr && !p.epi.bias_per_row && i < kLines && n0 + i * kLineCols < p.n) {
    prefetch_l1(bias + n0 + i * kLineCols);
  }
}

// The per-column bias of an accumulator pair's columns gc and gc + 1 (gc even), zero past
// the edge: one 4-byte load where the pair is aligned (`pairs`: n even, bias 4-byte aligned).
template <typename T>
__device__ __forceinline__ void fill_bias_cols(const T* bias, int n, bool pairs, int gc,
                                               float (&b)[2]) {
  if (pairs && gc < n) {
    unpack_pair<T>(__ldg(reinterpret_cast<const unsigned int*>(bias + gc)), b[0], b[1]);
  } else {
    b[0] = gc < n ? to_float(bias[gc]) : 0.f;
    b[1] = gc + 1 < n ? to_float(bias[gc + 1]) : 0.f;
  }
}

// A wide, three-quarter or medium tile's block (2 * kAcc columns) through shared memory:
// each round fills kBoxes 128B-swizzled 64-row boxes of the warpgroup's staging buffer
// (TileCfg::kCBoxes), which TMA writes out, clipping the edges.
template <typename T, int kBoxes, int kAcc>
__device__ __forceinline__ void store_block_tma(const Params& p, const CUtensorMap* map,
                                                const float (&acc)[kAcc], uint32_t buf, int row0,
                                                int n0, int warp_in_wg, int lane, int cw) {
  constexpr int kElt = static_cast<int>(sizeof(T));
  constexpr int kBoxCols = 128 / kElt;
  constexpr int kRoundCols = kBoxes * kBoxCols;
  constexpr int kRounds = 2 * kAcc / kRoundCols;
  static_assert(kRounds * kRoundCols == 2 * kAcc, "a block is a whole number of rounds");
  constexpr int kGroupsPerRound = kRoundCols / 8;  // accumulator column groups of 8
  const int g = lane >> 2;
  const int t = lane & 3;
  // This thread's two rows (r and r + 8, both = g mod 8) and the byte of its column pair
  // within a 16-byte chunk; a group's chunk is then a constant plus t's, XORed with g by the
  // 128B swizzle, so each store's address is one XOR and one add from these (an address
  // rebuilt per store was a dozen integer instructions, 64 times a tile).
  const int t_byte = 2 * t * kElt;
  uint32_t row_base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_base[h] = buf + static_cast<uint32_t>((warp_in_wg * 16 + g + 8 * h) * 128 + (t_byte & 15));
  }
  auto chunk_offset = [&](int jj) {
    const int chunk = (((jj * 8) % kBoxCols) * kElt + t_byte) >> 4;
    return static_cast<uint32_t>(((chunk ^ g) << 4) + ((jj * 8) / kBoxCols) * kCBoxBytes);
  };
  // One round's values into the buffer. kBeta is a compile-time copy of beta != 0: tested
  // per column pair, it put a branch between every two stores and cut the fill into 64
  // basic blocks, which ran at a fraction of the issue rate (phase stamps on the H100:
  // about 0.8 us of the wide tile's 2.9 us epilogue went to the two fills).
  //
  // kAct (an Activation, or kFillPlain): the bias and the activation applied right here, on
  // the accumulators, where 32-64 independent values a thread keep the arithmetic at its issue
  // rate and no barrier or second pass over shared memory is needed (see fill_epilogue).
  //
  // kBias (16-bit T, outside the in-fill epilogue): the bias added here too, on the float
  // values, before their one rounding to T; the post pass then applies the activation and
  // writes the pre-activation from what is in the buffer. (Added in the post pass, the bias
  // met values already rounded to T: a second rounding that moved pre-activations near zero
  // across it, and with them ReLU's mask. float16 ReLU gradients came out 6x less accurate
  // than torch's.)
  const T* const bias = static_cast<const T*>(p.epi.bias);
  const bool bias_pairs =
      p.n % 2 == 0 && (reinterpret_cast<uintptr_t>(bias) & 3u) == 0 && !p.epi.bias_per_row;
  auto fill_round = [&](int rd, auto beta_tag, auto act_tag, auto bias_tag) {
    constexpr bool kBeta = decltype(beta_tag)::value;
    constexpr int kAct = decltype(act_tag)::value;
    constexpr bool kBias = decltype(bias_tag)::value;
#pragma unroll
    for (int jj = 0; jj < kGroupsPerRound; ++jj) {
      const int j = rd * kGroupsPerRound + jj;
      const uint32_t off = chunk_offset(jj);
      float bias_pair[2] = {0.f, 0.f};
      if constexpr (kAct != kFillPlain) {
        // The pair's two bias values in one 4-byte load (an even column of an even-width C).
        uint32_t raw = 0u;
        if (bias != nullptr) {
          raw = __ldg(reinterpret_cast<const unsigned int*>(bias + n0 + 8 * j + 2 * t));
        }
        if constexpr (kElt == 2) unpack_pair<T>(raw, bias_pair[0], bias_pair[1]);
      } else if constexpr (kBias) {
        if (!p.epi.bias_per_row)
          fill_bias_cols<T>(bias, p.n, bias_pairs, n0 + 8 * j + 2 * t, bias_pair);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v0 = acc[4 * j + 2 * h] * p.alpha;
        float v1 = acc[4 * j + 2 * h + 1] * p.alpha;
        if constexpr (kBeta) {  // beta == 0 must not read C: it may hold NaN
          const int gr = row0 + warp_in_wg * 16 + g + 8 * h;
          const int gc = n0 + 8 * j + 2 * t;
          if (gr < p.m && gc < p.n) {
            const T* src = static_cast<const T*>(p.c) + static_cast<int64_t>(gr) * p.ldc + gc;
            v0 += p.beta * to_float(*(src));
            if (gc + 1 < p.n) v1 += p.beta * to_float(*(src + 1));
          }
        }
        if constexpr (kAct != kFillPlain) {
          v0 = post_activation<kAct>(Activation::kNone, v0 + bias_pair[0]);
          v1 = post_activation<kAct>(Activation::kNone, v1 + bias_pair[1]);
        } else if constexpr (kBias) {
          if (p.epi.bias_per_row) {
            const int gr = row0 + warp_in_wg * 16 + g + 8 * h;
            const float rb = gr < p.m ? to_float(bias[gr]) : 0.f;
            v0 += rb;
            v1 += rb;
          } else {
            v0 += bias_pair[0];
            v1 += bias_pair[1];
          }
        }
        const uint32_t addr = row_base[h] + off;
        if constexpr (kElt == 4) {
          st_shared_v2_f32(addr, v0, v1);
        } else {
          st_shared_b32(addr, pack2<T>(v0, v1));
        }
      }
    }
  };
  const bool epi_in_fill = fill_epilogue<T, kAcc>(p);
  using Plain = std::integral_constant<int, kFillPlain>;
  const bool plain_bias = bias_in_fill<T>() && bias != nullptr;
#pragma unroll
  for (int rd = 0; rd < kRounds; ++rd) {
    // Rounds whose columns all lie in C; an edge round leaves its epilogue to the post pass,
    // whose loads are checked.
    const bool in_fill = epi_in_fill && n0 + (rd + 1) * kRoundCols <= p.n;
    auto fill = [&] {
      if (in_fill) {
        if constexpr (fill_epilogue_compiled<T, kAcc>()) {
          with_activation(p.epi.act, [&](auto a) {
            constexpr Activation kA = decltype(a)::value;
            if constexpr (fill_takes<T>(kA)) {
              fill_round(rd, std::false_type{}, std::integral_constant<int, static_cast<int>(kA)>{},
                         std::false_type{});
            }
          });
        }
      } else if (plain_bias) {
        if constexpr (bias_in_fill<T>()) {
          if (p.beta != 0.f) {
            fill_round(rd, std::true_type{}, Plain{}, std::true_type{});
          } else {
            fill_round(rd, std::false_type{}, Plain{}, std::true_type{});
          }
        }
      } else if (p.beta != 0.f) {
        fill_round(rd, std::true_type{}, Plain{}, std::false_type{});
      } else {
        fill_round(rd, std::false_type{}, Plain{}, std::false_type{});
      }
    };
    auto issue = [&] {
      if (row0 >= p.m) return;
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        const int col = n0 + rd * kRoundCols + b * kBoxCols;
        if (col < p.n) tma_store(map, buf + b * kCBoxBytes, col, row0);
      }
    };
    const int cbase = n0 + rd * kRoundCols;
    const PostBias<T, kBoxes> pb(p.epi, cbase, p.n);
    auto post = [&] { epilogue_post_round<T>(p.epi, pb, buf, row0, cbase, p.m, p.n); };
    staged_store_round(cw, fill, has_post_pass(p.epi) && !in_fill, post, issue);
  }
}

// The same for a transposed float C (Params::c_trans): block row r is C column row0 + r and
// block column c is C row n0 + c. A round covers 64 block columns, i.e. 64 lines of C, in two
// boxes of 32 block rows (128 bytes of a line each). The lanes of a warp write eight
// consecutive floats of four lines at a time; with the swizzle those land in 32 different
// banks.
template <int kAcc>
__device__ __forceinline__ void store_block_tma_transposed(const Params& p, const CUtensorMap* map,
                                                           const float (&acc)[kAcc], uint32_t buf,
                                                           int row0, int n0, int warp_in_wg,
                                                           int lane, int cw) {
  constexpr int kLinesPerRound = 64;
  constexpr int kRounds = 2 * kAcc / kLinesPerRound;
  const int g = lane >> 2;
  const int t = lane & 3;
  const uint32_t box = buf + (warp_in_wg >> 1) * kCBoxBytes;
  const float* c = static_cast<const float*>(p.c);
#pragma unroll
  for (int rd = 0; rd < kRounds; ++rd) {
    auto fill = [&] {
#pragma unroll
      for (int jj = 0; jj < kLinesPerRound / 8; ++jj) {
        const int j = rd * (kLinesPerRound / 8) + jj;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int line = 8 * jj + 2 * t + e;  // line of C within the round, row of the box
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = warp_in_wg * 16 + g + 8 * h;
            const int rb = r & 31;  // float within the 128-byte line of the box
            float v = acc[4 * j + 2 * h + e] * p.alpha;
            if (p.beta != 0.f) {
              const int gc = row0 + r;
              const int gl = n0 + 8 * j + 2 * t + e;
              if (gc < p.m && gl < p.n) v += p.beta * c[static_cast<int64_t>(gl) * p.ldc + gc];
            }
            st_shared_f32(box + line * 128 + (((rb >> 2) ^ (line & 7)) << 4) + (rb & 3) * 4, v);
          }
        }
      }
    };
    auto issue = [&] {
      const int line0 = n0 + rd * kLinesPerRound;
      if (line0 >= p.n) return;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int col = row0 + 32 * b;
        if (col < p.m) tma_store(map, buf + b * kCBoxBytes, col, line0);
      }
    };
    // Box line l is C row n0 + rd * 64 + l; box b covers C columns row0 + 32 b ...
    const PostBias<float> pb(p.epi, row0, p.m);
    auto post = [&] {
      epilogue_post_round<float>(p.epi, pb, buf, n0 + rd * kLinesPerRound, row0, p.n, p.m);
    };
    staged_store_round(cw, fill, has_post_pass(p.epi), post, issue);
  }
}

// ---- Stream-k fix-up (scheduler.cuh: unit_at) ----------------------------------------------
// The pieces of a stream-k tile meet through float32 slots in the workspace: every piece
// but the last stores its accumulators in its CTA's slot (a cluster gives at most once, so
// the slot is the CTA's own) and raises a flag; the last piece's warpgroup waits for each
// giver's flag in turn and adds its slot before storing C. A slot holds the accumulators in
// fragment order (float4 q of consumer thread i at float4 q * 256 + i), not in C's layout:
// each warp's store and load then covers 512 contiguous bytes, with all of a thread's loads
// in flight at once, so a hand-over costs about two L2 passes over the tile instead of a
// scattered copy.
template <int kCluster>
__device__ __forceinline__ int sk_slot(int cluster, uint32_t rank) {
  return cluster * kCluster + static_cast<int>(rank);
}

// A slot's float4 q of consumer thread ct (0..255) lies at q * 256 + ct.
template <int kAcc>
__device__ __forceinline__ float4* sk_fragment(const Params& p, int slot) {
  return reinterpret_cast<float4*>(p.partial + static_cast<int64_t>(slot) * (2 * 128 * kAcc));
}

// The flags, two per slot (one per consumer warpgroup), follow the slots of all the grid's
// CTAs (launch.cuh zeroes them).
template <int kAcc>
__device__ __forceinline__ int* sk_flag(const Params& p, int slot, int cw) {
  const int64_t slots = static_cast<int64_t>(gridDim.x);
  return reinterpret_cast<int*>(p.partial + slots * (2 * 128 * kAcc)) + 2 * slot + cw;
}

// A warpgroup's accumulators into `slot` (consumer thread ct's fragments), then its `flag`
// raised once the whole warpgroup's stores are visible to the GPU. bar: a named barrier of
// the warpgroup's 128 threads. (Also the grouped kernel's split tail: grouped_kernel.cuh.)
template <int kAcc>
__device__ __forceinline__ void fixup_give(float4* slot, int ct, int* flag,
                                           const float (&acc)[kAcc], uint32_t bar) {
  float4* dst = slot + ct;
#pragma unroll
  for (int q = 0; q < kAcc / 4; ++q) {
    __stcg(dst + q * 256, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
  }
  named_barrier_sync(bar, 128);  // the warpgroup's stores are issued...
  if ((ct & 127) == 0) {
    __threadfence();  // ...and visible to the GPU before the flag
    st_release_gpu(flag, 1);
  }
}

// Waits for `flag`, then adds `slot`'s fragments of consumer thread ct to acc.
template <int kAcc>
__device__ __forceinline__ void fixup_take(const float4* slot, int ct, const int* flag,
                                           float (&acc)[kAcc], uint32_t bar) {
  if ((ct & 127) == 0) {
    while (ld_acquire_gpu(flag) == 0) __nanosleep(64);
  }
  named_barrier_sync(bar, 128);
  const float4* src = slot + ct;
  // Eight loads in flight per thread: the registers beside 128 accumulators allow no more.
  constexpr int kBatch = kAcc / 4 < 8 ? kAcc / 4 : 8;
#pragma unroll
  for (int q0 = 0; q0 < kAcc / 4; q0 += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) v[j] = __ldcg(src + (q0 + j) * 256);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      float* a = &acc[4 * (q0 + j)];
      a[0] += v[j].x;
      a[1] += v[j].y;
      a[2] += v[j].z;
      a[3] += v[j].w;
    }
  }
}

template <int kAcc>
__device__ __forceinline__ void sk_give(const Params& p, const float (&acc)[kAcc], int slot,
                                        int cw) {
  fixup_give<kAcc>(sk_fragment<kAcc>(p, slot), static_cast<int>(threadIdx.x) - 128,
                   sk_flag<kAcc>(p, slot, cw), acc, 1 + cw);
}

template <int kAcc>
__device__ __forceinline__ void sk_take(const Params& p, float (&acc)[kAcc], int slot, int cw) {
  fixup_take<kAcc>(sk_fragment<kAcc>(p, slot), static_cast<int>(threadIdx.x) - 128,
                   sk_flag<kAcc>(p, slot, cw), acc, 1 + cw);
}

#endif  // GEMMT_SM90_DEVICE_CODE

}  // namespace
}  // namespace gemmt
