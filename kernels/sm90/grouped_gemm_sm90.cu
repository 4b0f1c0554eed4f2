// The grouped and scaled GEMM's host side (the kernel: grouped_kernel.cuh): what it accepts,
// its tensor maps, the tile width and grid, and the launch through the instance units.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/gemm_tc_kind.h"
#include "gemmt/cuda_check.h"
#include "gemmt/gemm.h"
#include "gemmt/grouped_gemm.h"
#include "gemmt/launch.cuh"
#include "plan/grouped_plan.h"
#include "sm90/grouped_launchers.h"
#include "sm90/tensor_map.h"

namespace gemmt {
namespace {

#if defined(GEMMT_HAS_SM90A)
constexpr bool kKernelsBuilt = true;
#else
constexpr bool kKernelsBuilt = false;
#endif

int element_bytes(int kind) {
  return is_fp8_kind(kind) ? 1 : 2;
}

// A 3-D tensor map (inner, outer, batch) with the 128-byte swizzle of the kernel's stages.
bool encode_map_3d(CUtensorMap* map, const void* ptr, int kind, uint64_t inner, uint64_t outer,
                   uint64_t batch, uint64_t outer_stride_bytes, uint64_t batch_stride_bytes,
                   uint32_t box_inner, uint32_t box_outer,
                   CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  PFN_cuTensorMapEncodeTiled_v12000 fn = sm90::tensor_map_encoder();
  if (fn == nullptr) return false;
  const CUtensorMapDataType dtype = kind == kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                    : kind == kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                   : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const cuuint64_t dims[3] = {inner, outer, batch};
  const cuuint64_t strides[2] = {outer_stride_bytes, batch_stride_bytes};
  const cuuint32_t box[3] = {box_inner, box_outer, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return sm90::encode_with_context([&] {
    return fn(map, dtype, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, l2,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  });
}

// An operand as the kernel reads it: `rows` (M of A, N of B) by `depth` (K), element (r, p)
// at ptr[g * sg + r * s_rows + p * s_depth]. K-major when s_depth == 1, else MN-major
// (s_rows == 1). batch: the groups a 3-D operand holds (1 for a 2-D one).
struct OperandView {
  const void* ptr;
  int64_t rows, depth, batch;
  int64_t s_rows, s_depth, sg;
};

bool k_major(const OperandView& v) {
  return v.s_depth == 1 || v.depth <= 1;
}

// The batch stride of a map whose batch is one matrix: any legal value.
uint64_t batch_stride_bytes(const OperandView& v, int elt) {
  if (v.batch > 1) return static_cast<uint64_t>(v.sg) * elt;
  return 16;
}

bool aligned16(int64_t bytes) {
  return bytes % 16 == 0;
}

// Whether the view can be a tensor map of this kernel (16-byte aligned base and strides).
bool mappable(const OperandView& v, int elt, const char** why, const char* name) {
  const int64_t outer_stride = k_major(v) ? v.s_rows : v.s_depth;
  if (!k_major(v) && v.s_rows != 1 && v.rows > 1) {
    *why = "an operand needs a unit stride along K or along M / N";
    return false;
  }
  if (reinterpret_cast<uintptr_t>(v.ptr) % 16 != 0) {
    *why = name;
    return false;
  }
  if (!aligned16(outer_stride * elt) || (v.batch > 1 && !aligned16(v.sg * elt))) {
    *why = name;
    return false;
  }
  return true;
}

bool encode_operand(CUtensorMap* map, const OperandView& v, int kind, int box_rows) {
  const int elt = element_bytes(kind);
  const uint32_t box_k = 128 / elt;  // one 128-byte row of K
  if (k_major(v)) {
    return encode_map_3d(map, v.ptr, kind, v.depth, v.rows, v.batch,
                         static_cast<uint64_t>(v.s_rows) * elt, batch_stride_bytes(v, elt), box_k,
                         box_rows);
  }
  // MN-major: boxes of 64 rows (128 bytes) by the stage's K.
  return encode_map_3d(map, v.ptr, kind, v.rows, v.depth, v.batch,
                       static_cast<uint64_t>(v.s_depth) * elt, batch_stride_bytes(v, elt),
                       128 / elt, box_k);
}

OperandView a_view(const GroupedGemmArgs& x) {
  const bool split_rows = x.split == GroupSplit::kRows;
  const bool two_d = split_rows || x.split == GroupSplit::kDepth;
  return {x.a, x.m, x.k, two_d ? 1 : x.groups, x.a_sm, x.a_sk, x.a_sg};
}

OperandView b_view(const GroupedGemmArgs& x) {
  const bool two_d = x.split == GroupSplit::kCols || x.split == GroupSplit::kDepth;
  return {x.b, x.n, x.k, two_d ? 1 : x.groups, x.b_sn, x.b_sk, x.b_sg};
}

// The translation unit holding the instance of this kind and tile width.
cudaError_t launch_instance(int kind, const sm90::GroupedLaunch& l, cudaStream_t stream) {
  switch (kind) {
    case kBF16:
      return l.bn == 256 ? sm90::grouped_launch_bf16_256(l, stream)
                         : sm90::grouped_launch_bf16_128(l, stream);
    case kF16:
      return l.bn == 256 ? sm90::grouped_launch_f16_256(l, stream)
                         : sm90::grouped_launch_f16_128(l, stream);
    case kE4M3:
      return sm90::grouped_launch_e4m3(l, stream);
    case kE5M2E4M3:
      return sm90::grouped_launch_e5m2_e4m3(l, stream);
    case kE4M3E5M2:
      return sm90::grouped_launch_e4m3_e5m2(l, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// C's 3-D map (columns, rows, matrix) for the staged epilogue: boxes of 16 rows by 64
// columns in the 128-byte swizzle the kernel stages them in. A split of rows or columns writes
// ranges of one C (one matrix); the others one C a group.
bool encode_c_map(CUtensorMap* map, const GroupedGemmArgs& x) {
  const bool one_c = x.split == GroupSplit::kRows || x.split == GroupSplit::kCols;
  const uint64_t batch = one_c ? 1 : static_cast<uint64_t>(x.groups);
  return encode_map_3d(map, x.c, x.out == OutKind::kF16 ? kF16 : kBF16, static_cast<uint64_t>(x.n),
                       static_cast<uint64_t>(x.m), batch, static_cast<uint64_t>(x.ldc) * 2,
                       batch > 1 ? static_cast<uint64_t>(x.c_sg) * 2 : 16, 64, 16,
                       CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

grouped_plan::Shape shape_of(const GroupedGemmArgs& x) {
  return grouped_plan::Shape{x.m, x.n, x.k, x.groups, static_cast<int>(x.split)};
}

// Whether C goes out through shared memory and TMA stores: where it can (a 16-bit C with no
// bias or activation, FP8 scales other than 128x1 scales of B, rows and matrices at 16-byte
// multiples), as grouped_plan::staged_c says for 16-bit operands and always for FP8.
// GEMMT_GROUPED_TMA_STORE=0 / 1 forces either way where it can run (read at each call, for
// A/B runs in one process).
bool use_staged_c(const GroupedGemmArgs& x) {
  if (x.out == OutKind::kF32 || x.bias != nullptr || x.act != Activation::kNone) return false;
  // FP8: its scales are applied in registers before the staging.
  const bool fp8 = is_fp8_kind(x.kind);
  if (!fp8 && x.scale != ScaleKind::kNone) return false;
  if (x.scale == ScaleKind::kBlock && x.b_block_cols) return false;
  if (x.split == GroupSplit::kCols) return false;
  const bool one_c = x.split == GroupSplit::kRows;
  if (reinterpret_cast<uintptr_t>(x.c) % 16 != 0 || (x.ldc * 2) % 16 != 0 || x.ldc < x.n) {
    return false;
  }
  if (!one_c && x.groups > 1 && ((x.c_sg * 2) % 16 != 0 || x.c_sg < x.ldc * x.m)) return false;
  const char* env = std::getenv("GEMMT_GROUPED_TMA_STORE");
  if (env != nullptr && env[0] != '\0') return std::strcmp(env, "0") != 0;
  // FP8: staged wherever it can run (1.02-1.10x on LLM products, H200).
  return fp8 || grouped_plan::staged_c(shape_of(x));
}

// Two CTAs an SM on 128-wide tiles where they can run (16-bit, K-major A, C from registers),
// as grouped_plan::ctas_per_sm says: never where C is staged. GEMMT_GROUPED_PER_SM=1 / 2
// forces either where the two-CTA kernel can run (read at each call, for A/B runs).
bool two_ctas_per_sm(const GroupedGemmArgs& x) {
  if (is_fp8_kind(x.kind) || x.split == GroupSplit::kDepth || x.split == GroupSplit::kCols) {
    return false;
  }
  if (!k_major(a_view(x))) return false;
  const char* env = std::getenv("GEMMT_GROUPED_PER_SM");
  if (env != nullptr && env[0] != '\0') return std::strcmp(env, "2") == 0;
  return grouped_plan::ctas_per_sm(shape_of(x), use_staged_c(x)) == 2;
}

// The promoted FP8 loop's tile: its width and its sets of partial sums. 192 wide with one set
// (each k-block waited for; row / column, tensor or 128x128 block scales), or 128 wide: on CTA
// pairs with two sets (each k-block's products running while the one before it is added to
// the float32 sum), on lone CTAs with one, or two with block scales. The planner weighs the
// widths (grouped_plan::promoted_tile_width for one product on pairs,
// promoted_group_tile_width for groups on lone CTAs); 128x1 scales of B (a scale a column,
// read from the ring at the promotion) and one product on lone CTAs (at most 128 rows) take
// 128. GEMMT_FP8_TILE=128 / 192 forces either width where both can run (read at each call,
// for A/B runs).
struct PromotedTile {
  int sets;
  int bn;
};
PromotedTile promoted_tile(const GroupedGemmArgs& x, int cluster, int a_rows, int sms) {
  const bool block = x.scale == ScaleKind::kBlock;
  const bool groups = x.groups > 1 || x.split != GroupSplit::kNone;
  const PromotedTile narrow{(cluster == 1 || a_rows == 64) && !block ? 1 : 2, 128};
  if ((block && x.b_block_cols) || (cluster == 1 && !groups) || a_rows == 64) return narrow;
  const char* env = std::getenv("GEMMT_FP8_TILE");
  int width = 0;
  if (env != nullptr && std::strcmp(env, "192") == 0) width = 192;
  if (env != nullptr && std::strcmp(env, "128") == 0) width = 128;
  if (width == 0) {
    width = cluster == 1 ? grouped_plan::promoted_group_tile_width(shape_of(x), sms, block)
                         : grouped_plan::promoted_tile_width(shape_of(x), sms, block);
  }
  return width == 128 ? narrow : PromotedTile{1, 192};
}

// The rows of A a stage and a tile hold (grouped_plan::fp8_row_tile): 64 for one FP8 product
// of few rows (row / column or tensor scales), whose ring then holds 8-9 stages instead of 6
// (more of B in flight: the weight streams faster), else 128. GEMMT_FP8_A_ROWS=128 / 64 forces
// either where 64 can run (read at each call, for A/B runs).
int a_stage_rows(const GroupedGemmArgs& x, int sms) {
  if (!is_fp8_kind(x.kind) || x.groups != 1 || x.split != GroupSplit::kNone ||
      x.scale == ScaleKind::kBlock) {
    return 128;
  }
  const char* env = std::getenv("GEMMT_FP8_A_ROWS");
  if (env != nullptr && std::strcmp(env, "128") == 0) return 128;
  if (env != nullptr && std::strcmp(env, "64") == 0) return 64;
  return grouped_plan::fp8_row_tile(shape_of(x), sms);
}

// CTA pairs for FP8 where grouped_plan::fp8_cluster says (block scales: always, their
// instances are pairs); 64-row tiles as grouped_plan::fp8_row_tile_cluster says.
// GEMMT_FP8_CLUSTER=1 / 2 forces either, =4 clusters of four 64-row tiles where they run (read at
// each call, for A/B runs).
int fp8_cluster(const GroupedGemmArgs& x, int sms) {
  if (!is_fp8_kind(x.kind)) return 1;
  if (x.split != GroupSplit::kNone || x.groups != 1) return 1;  // pairs share one product's B
  if (x.scale == ScaleKind::kBlock) return 2;
  const char* env = std::getenv("GEMMT_FP8_CLUSTER");
  if (env != nullptr && std::strcmp(env, "1") == 0) return 1;
  if (env != nullptr && std::strcmp(env, "2") == 0) return 2;
  const bool rows64 = a_stage_rows(x, sms) == 64;
  if (env != nullptr && std::strcmp(env, "4") == 0) return rows64 ? 4 : 2;
  if (rows64) return grouped_plan::fp8_row_tile_cluster(shape_of(x));
  return grouped_plan::fp8_cluster(shape_of(x));
}

// GroupedParams::wg_split_k: 64-row tiles of a product of more than 64 rows deal their
// k-blocks between the consumer warpgroups; over at most 64 rows the second warpgroup idles
// (its ring one stage deeper: sharing ran 0.94-0.96x there, docs/performance.md).
// GEMMT_FP8_WG_SPLIT=1 / 0 forces either (read at each call, for A/B runs).
int wg_split_k(const GroupedGemmArgs& x, int a_rows) {
  if (a_rows != 64) return 0;
  const char* env = std::getenv("GEMMT_FP8_WG_SPLIT");
  if (env != nullptr && std::strcmp(env, "1") == 0) return 1;
  if (env != nullptr && std::strcmp(env, "0") == 0) return 0;
  return x.m > 64 ? 1 : 0;
}

// The ring's depth: as many stages as fit (sm90::grouped_ring_stages). GEMMT_GROUPED_STAGES=n
// caps it (read at each call, for A/B runs).
int ring_stages(int a_rows, int bn, bool staged_c, bool table, int scale_bytes, bool exchange) {
  const int fit = sm90::grouped_ring_stages(a_rows, bn, staged_c, table, scale_bytes, exchange);
  const char* env = std::getenv("GEMMT_GROUPED_STAGES");
  const int cap = env != nullptr ? std::atoi(env) : 0;
  return cap > 0 && cap < fit ? cap : fit;
}

// GroupedParams::a_half: m - 64 for one FP8 product of 65-127 rows on lone CTAs with 128-row
// stages, not cut into k-slices, else 0. Its one 128-row box of A crossed A's end: 65 rows ran
// 1.05-1.21x slower that way than as two boxes on 14336 x 4096 and 28672 x 8192 weights (H200,
// 65-96 rows; level at 127). Cut into k-slices (narrow weights, 8-28 k-blocks a CTA) the two
// boxes read A's shared rows twice from L2 and ran 0.90-1.02x (4096 x 4096 at 65 rows 0.90-0.92),
// so such products keep one box. GEMMT_GROUPED_A_HALF=0 keeps one box everywhere (read at each
// call, for A/B runs).
int a_half_rows(const GroupedGemmArgs& x, int cluster, int a_rows, bool sliced) {
  if (!is_fp8_kind(x.kind) || cluster != 1 || a_rows != 128 || sliced || x.groups != 1 ||
      x.split != GroupSplit::kNone || x.m <= 64 || x.m >= 128) {
    return 0;
  }
  const char* env = std::getenv("GEMMT_GROUPED_A_HALF");
  if (env != nullptr && std::strcmp(env, "0") == 0) return 0;
  return static_cast<int>(x.m) - 64;
}

// The 16-bit tile's width where the planner chooses it (grouped_plan::tile_width);
// GEMMT_GROUPED_TILE=128 / 256 forces either (read at each call, for A/B runs).
int tile_width_16bit(const grouped_plan::Shape& shape, int sms) {
  const char* env = std::getenv("GEMMT_GROUPED_TILE");
  if (env != nullptr && std::strcmp(env, "128") == 0) return 128;
  if (env != nullptr && std::strcmp(env, "256") == 0) return 256;
  return grouped_plan::tile_width(shape, sms);
}

// A split of K zeroes only the rest of the k-step that holds a group's last rows, each
// warpgroup what it reads; GEMMT_GROUPED_FULL_TAIL=1 zeroes the stage to its end, both
// warpgroups together, as before (read at each call, for A/B runs).
int full_k_tail() {
  const char* env = std::getenv("GEMMT_GROUPED_FULL_TAIL");
  return env != nullptr && std::strcmp(env, "1") == 0 ? 1 : 0;
}

// A split of K deals its tiles out deepest group first (GroupedParams::depth_order);
// GEMMT_GROUPED_DEPTH_ORDER=0 deals them in group order (read at each call, for A/B runs).
int depth_order() {
  const char* env = std::getenv("GEMMT_GROUPED_DEPTH_ORDER");
  return env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
}

// The two-set promoted FP8 loop stages a tile's C once the next tile's first k-block is
// issued (GroupedParams::defer_store); GEMMT_FP8_DEFER_STORE=0 stores it at the tile's end
// (read at each call, for A/B runs).
int defer_store() {
  const char* env = std::getenv("GEMMT_FP8_DEFER_STORE");
  return env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
}

// Extents the kernel's 32-bit tile arithmetic takes: a tile origin plus its width (up to 256),
// a depth rounded up to whole k-blocks, stay below 2^31.
constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1024;

bool fits_int(int64_t v) {
  return v >= 0 && v <= kMaxExtent;
}

// K cut into slices of whole k-blocks (count 1: not cut).
struct KSlices {
  int count = 1;
  int depth = 0;
};

// K of `blocks` 128-deep k-blocks cut into at most `want` slices of whole k-blocks, all but the
// last equally deep (count 1: not cut).
KSlices cut_k(int64_t blocks, int64_t want) {
  const int64_t count = std::min<int64_t>(want, blocks);
  if (count <= 1) return {};
  const int64_t per = (blocks + count - 1) / count;
  KSlices ks;
  ks.count = static_cast<int>((blocks + per - 1) / per);
  ks.depth = static_cast<int>(per * 128);
  return ks;
}

// The k-slices of a few-row FP8 product (grouped_plan::fp8_k_slices): one product with row /
// column or tensor scales on lone CTAs (block scales are applied per k-block at the promotion
// and keep their pairs). GEMMT_FP8_SPLITS=n asks for n slices where they can run (read at each
// call, for A/B runs).
KSlices k_slices(const GroupedGemmArgs& x, int sms) {
  KSlices ks;
  if (!is_fp8_kind(x.kind) || x.scale == ScaleKind::kBlock || x.split != GroupSplit::kNone ||
      x.groups != 1 || x.k <= 0 || x.m == 0 || x.n == 0 || fp8_cluster(x, sms) != 1) {
    return ks;
  }
  int want = 0;
  const char* env = std::getenv("GEMMT_FP8_SPLITS");
  if (env != nullptr && env[0] != '\0') want = std::atoi(env);
  if (want <= 0) want = grouped_plan::fp8_k_slices(shape_of(x), sms);
  return cut_k((x.k + 127) / 128, want);
}

std::size_t partial_bytes(const GroupedGemmArgs& x, const KSlices& ks) {
  if (ks.count <= 1) return 0;
  return static_cast<std::size_t>(ks.count) * static_cast<std::size_t>(x.m) *
         static_cast<std::size_t>(x.n) * sizeof(float);
}

cudaError_t sm_count_for(const GroupedGemmArgs& x, int* sms) {
  *sms = x.sm_count;
  if (*sms > 0) return cudaSuccess;
  return current_device_sm_count(sms);
}

// The k-slices this call runs: none without a workspace of the size they need.
KSlices k_slices_with_workspace(const GroupedGemmArgs& x, int sms) {
  const KSlices ks = k_slices(x, sms);
  const bool room = x.workspace != nullptr && x.workspace_bytes >= partial_bytes(x, ks) &&
                    reinterpret_cast<uintptr_t>(x.workspace) % 16 == 0;
  return ks.count > 1 && room ? ks : KSlices{};
}

// C = epilogue(sum of the slices' float32 partial sums), the scales already in them.
cudaError_t reduce_k_slices(const GroupedGemmArgs& x, const KSlices& ks, cudaStream_t stream) {
  GemmArgs r;
  r.m = x.m;
  r.n = x.n;
  r.k = x.k;
  r.c = x.c;
  r.ldc = x.ldc;
  r.dtype = x.out == OutKind::kBF16  ? ScalarType::kBFloat16
            : x.out == OutKind::kF16 ? ScalarType::kFloat16
                                     : ScalarType::kFloat32;
  r.epilogue.bias = x.bias;
  r.epilogue.activation = x.act;
  return gemm_reduce_k_slices(r, static_cast<const float*>(x.workspace), ks.count, stream);
}

// One FP8 product's last round cut along K (GroupedParams::tail_slices; a product of less
// than one round is all tail). GEMMT_FP8_TAIL=0 runs it whole, =n cuts it into n slices
// wherever there is a last round short of a whole one (read at each call, for A/B runs).
struct TailSplit {
  int slices = 1;
  int first = 0;   // the first unit of the tail
  int depth = 0;   // of K, a piece
  int pieces = 0;  // tiles (pairs) in the tail
};

TailSplit tail_split(const GroupedGemmArgs& x, int64_t units, int64_t slots, bool sliced,
                     int cluster) {
  if (!is_fp8_kind(x.kind) || x.groups != 1 || x.split != GroupSplit::kNone || sliced || x.k <= 0 ||
      slots < 1 || units % slots == 0) {
    return {};
  }
  const int64_t blocks = (x.k + 127) / 128;
  // Lone CTAs of less than one round are few-row products, which fp8_k_slices cuts where it
  // pays; the tail's cut of a whole round was measured on CTA pairs (129-256 rows) only.
  int64_t want =
      cluster == 1 && units <= slots ? 1 : grouped_plan::fp8_tail_slices(units, slots, blocks);
  const char* env = std::getenv("GEMMT_FP8_TAIL");
  if (env != nullptr && env[0] != '\0') want = std::atoi(env);
  const KSlices cut = cut_k(blocks, want);
  if (cut.count <= 1) return {};
  TailSplit t;
  t.slices = cut.count;
  t.depth = cut.depth;
  t.pieces = static_cast<int>(units % slots);
  t.first = static_cast<int>(units - t.pieces);
  return t;
}

// The tail's workspace: a slot of float32 sums per giving piece and CTA, then two flags a slot.
std::size_t tail_slots(const TailSplit& t, int cluster) {
  return t.slices <= 1 ? 0
                       : static_cast<std::size_t>(t.pieces) * (t.slices - 1) *
                             static_cast<std::size_t>(cluster);
}
std::size_t tail_partial_bytes(const TailSplit& t, int cluster, int bn) {
  return tail_slots(t, cluster) * 128 * static_cast<std::size_t>(bn) * sizeof(float);
}
std::size_t tail_bytes(const TailSplit& t, int cluster, int bn) {
  return tail_partial_bytes(t, cluster, bn) + tail_slots(t, cluster) * 2 * sizeof(int);
}

// The launch as the plan shapes it: the instance's tile and CTAs, its units (tiles, or tile
// pairs) and the CTAs (pairs) that take them, and how K is cut. with_workspace: only the cuts
// whose workspace x brings (the launch), else every cut the plan makes (its workspace size).
struct Geometry {
  KSlices ks;
  bool promote = false;
  bool two_per_sm = false;
  int cluster = 1;
  PromotedTile pt{0, 128};
  int bn = 128;
  int a_rows = 128;
  int wg_split_k = 0;
  int64_t tiles_m = 0, tiles_n = 0;  // tiles_m counts clusters' rows of tiles on clusters
  int64_t units = 0, slots = 0;
  TailSplit tail;
};

Geometry geometry(const GroupedGemmArgs& x, int sms, bool with_workspace) {
  Geometry g;
  g.promote = is_fp8_kind(x.kind) && (!x.fast_accum || x.scale == ScaleKind::kBlock);
  g.ks = x.k == 0 ? KSlices{} : with_workspace ? k_slices_with_workspace(x, sms) : k_slices(x, sms);
  const bool sliced = g.ks.count > 1;
  grouped_plan::Shape shape = shape_of(x);
  if (sliced) shape.groups = g.ks.count;
  g.two_per_sm = two_ctas_per_sm(x);
  g.cluster = fp8_cluster(x, sms);
  g.a_rows = is_fp8_kind(x.kind) ? a_stage_rows(x, sms) : 128;
  // The promoted FP8 tile as promoted_tile says; fast accumulation on lone CTAs 128 wide (its
  // only instance).
  g.pt = g.promote ? promoted_tile(x, g.cluster, g.a_rows, sms) : PromotedTile{0, 128};
  g.bn = g.promote                                                   ? g.pt.bn
         : is_fp8_kind(x.kind) && (g.cluster == 1 || g.a_rows == 64) ? 128
         : g.two_per_sm                                              ? 128
                                                                     : tile_width_16bit(shape, sms);
  const int64_t unit_rows = static_cast<int64_t>(g.a_rows) * g.cluster;
  g.tiles_m = (x.m + unit_rows - 1) / unit_rows;
  g.tiles_n = (x.n + g.bn - 1) / g.bn;
  // One product of 64-row tiles: a unit (tile or cluster) per row of tiles (of clusters) and
  // column block, and per k-slice.
  const int64_t tiles = g.a_rows == 64 ? g.tiles_m * g.tiles_n * (sliced ? g.ks.count : 1)
                                       : grouped_plan::max_tiles(shape, g.bn);
  g.units = g.cluster == 1 ? tiles : g.tiles_m * g.tiles_n;
  g.slots = static_cast<int64_t>(sms / g.cluster) * (g.two_per_sm ? 2 : 1);
  // The one-set promoted loops carry the hand-over (grouped_kernel.cuh: kTail), but not where
  // the warpgroups share a tile's k-blocks.
  g.wg_split_k = wg_split_k(x, g.a_rows);
  if (tiles > 0 && g.promote && g.pt.sets == 1 && g.wg_split_k == 0)
    g.tail = tail_split(x, g.units, g.slots, sliced, g.cluster);
  const bool room = x.workspace != nullptr &&
                    x.workspace_bytes >= tail_bytes(g.tail, g.cluster, g.bn) &&
                    reinterpret_cast<uintptr_t>(x.workspace) % 16 == 0;
  if (with_workspace && !room) g.tail = TailSplit{};
  return g;
}

}  // namespace

std::size_t grouped_gemm_sm90_workspace_bytes(const GroupedGemmArgs& x) {
  const char* why = nullptr;
  if (!grouped_gemm_sm90_supported(x, &why)) return 0;
  int sms = 0;
  if (sm_count_for(x, &sms) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const Geometry g = geometry(x, sms, false);
  return std::max(partial_bytes(x, g.ks), tail_bytes(g.tail, g.cluster, g.bn));
}

bool grouped_gemm_sm90_supported(const GroupedGemmArgs& x, const char** why) {
  static const char* const kNotBuilt = "the sm_90a kernels are not in this build";
  if (!kKernelsBuilt) {
    *why = kNotBuilt;
    return false;
  }
  if (!fits_int(x.m) || !fits_int(x.n) || !fits_int(x.k) || x.groups < 1) {
    *why = "extents (M, N and K) must be at most 2^31 - 1024 and there must be at least one group";
    return false;
  }
  if (x.split != GroupSplit::kNone && x.groups > kGroupedMaxGroups) {
    *why = "at most 1024 groups when offsets split an extent";
    return false;
  }
  const int elt = element_bytes(x.kind);
  const OperandView a = a_view(x), b = b_view(x);
  if (!mappable(a, elt, why, "a: its base address and strides must be multiples of 16 bytes")) {
    return false;
  }
  if (!mappable(b, elt, why, "b: its base address and strides must be multiples of 16 bytes")) {
    return false;
  }
  const bool one_product = x.split == GroupSplit::kNone && x.groups == 1;
  if (is_fp8_kind(x.kind) && x.split != GroupSplit::kNone && x.split != GroupSplit::kRows) {
    *why = "float8 operands: groups of a batch or a split of the rows (not of K or the columns)";
    return false;
  }
  if (is_fp8_kind(x.kind) && (!k_major(a) || !k_major(b))) {
    *why = "float8 operands must be K-major (a row-major, b column-major)";
    return false;
  }
  // The 16-bit instances: K-major A with either B, M-major A with N-major B.
  if (!k_major(a) && k_major(b)) {
    *why = "an M-major a needs an N-major b (make one of them contiguous)";
    return false;
  }
  // TMA boxes start at 16-byte aligned inner coordinates only, and a split's ranges start
  // anywhere: the split extent must be an operand's outer (strided) dimension.
  if (x.split == GroupSplit::kDepth && x.k > 0 && (k_major(a) || k_major(b))) {
    *why = "a split of the contraction dimension needs an M-major a and an N-major b";
    return false;
  }
  if (x.split == GroupSplit::kRows && !k_major(a)) {
    *why = "a split of the rows needs a K-major a";
    return false;
  }
  if (x.split == GroupSplit::kCols) {
    *why = "a split of the columns runs as the transposed split of rows";
    return false;
  }
  if (x.scale == ScaleKind::kBlock && (x.k % 128 != 0 || (!one_product && x.b_block_cols))) {
    *why = "block scales need K a multiple of 128, and 128x128 scales of b for groups";
    return false;
  }
  if (x.b_block_cols && (x.scale != ScaleKind::kBlock || x.sb_s1 != 1)) {
    *why = "128x1 scales of b: blockwise, with a unit stride along N";
    return false;
  }
  return true;
}

cudaError_t grouped_gemm_sm90(const GroupedGemmArgs& x, cudaStream_t stream,
                              const char** failed_step) {
  const char* unused = nullptr;
  const char** step = failed_step != nullptr ? failed_step : &unused;
  if (!grouped_gemm_sm90_supported(x, step)) return cudaErrorInvalidValue;
  // Nothing to write; or nothing to read (k == 0): the kernel then only stores the epilogue of
  // zero sums, and the maps must still be valid, so they point at C.
  if (x.m == 0 || x.n == 0) return cudaSuccess;
  GroupedGemmArgs y = x;
  if (x.k == 0) {
    y.a = y.b = x.c;
    y.a_sm = y.b_sn = 16;
    y.a_sk = y.b_sk = 1;
    y.a_sg = y.b_sg = 0;
    y.m = y.n = 1;
  }
  int sms = 0;
  GEMMT_RETURN_IF_ERROR(sm_count_for(x, &sms));
  const Geometry geo = geometry(x, sms, true);
  const KSlices ks = geo.ks;
  const bool sliced = ks.count > 1;
  const bool two_per_sm = geo.two_per_sm;
  const int cluster = geo.cluster;
  const int sets = geo.pt.sets;
  const int bn = geo.bn;

  sm90::GroupedLaunch l{};
  OperandView a = a_view(y), b = b_view(y);
  if (x.k == 0) a.depth = b.depth = 8;
  l.a_mn = !k_major(a);
  l.b_mn = !k_major(b);
  l.bn = bn;
  l.promote = sets;
  l.block = x.scale == ScaleKind::kBlock;
  l.cluster = cluster;
  l.per_sm = two_per_sm ? 2 : 1;
  l.a_rows = geo.a_rows;
  const int a_half = a_half_rows(y, cluster, l.a_rows, sliced);
  if (!encode_operand(&l.a, a, x.kind, a_half > 0 ? 64 : l.a_rows)) {
    *step = "encoding the tensor map of a";
    return cudaErrorInvalidValue;
  }
  if (!encode_operand(&l.b, b, x.kind, bn / l.cluster)) {
    *step = "encoding the tensor map of b";
    return cudaErrorInvalidValue;
  }
  sm90::GroupedParams& p = l.p;
  p.split = static_cast<int>(x.split);
  p.a_half = a_half;
  p.wg_split_k = geo.wg_split_k;
  p.groups = x.groups;
  p.offs = x.offs;
  p.m = static_cast<int>(x.m);
  p.n = static_cast<int>(x.n);
  p.k = static_cast<int>(x.k);
  // A pair's units are pairs of tile rows.
  p.tiles_m = static_cast<int>(geo.tiles_m);
  p.tiles_n = static_cast<int>(geo.tiles_n);
  p.c = x.c;
  p.c_sg = x.c_sg;
  p.ldc = x.ldc;
  p.out = static_cast<int>(x.out);
  p.scale = static_cast<int>(x.scale);
  p.sa = x.sa;
  p.sa_s0 = x.sa_s0;
  p.sa_s1 = x.sa_s1;
  p.sa_sg = x.sa_sg;
  p.sb = x.sb;
  p.sb_s0 = x.sb_s0;
  p.sb_s1 = x.sb_s1;
  p.sb_sg = x.sb_sg;
  p.block_cols = x.b_block_cols ? 1 : 0;
  p.bias = x.bias;
  p.bias_sg = x.bias_sg;
  p.act = x.act;
  p.k_slice = 0;
  if (sliced) {
    // A group a slice, each with its float32 partial sums (scaled) in the workspace; the
    // reduction applies the bias and the activation.
    p.groups = ks.count;
    p.k_slice = ks.depth;
    p.c = x.workspace;
    p.c_sg = x.m * x.n;
    p.ldc = x.n;
    p.out = static_cast<int>(OutKind::kF32);
    p.bias = nullptr;
    p.bias_sg = 0;
    p.act = Activation::kNone;
  }
  // The ring at its deepest beside C's staged tile (if any) and the group table (a split of
  // rows, columns or K).
  p.store_c = 0;
  p.full_k_tail = full_k_tail();
  p.depth_order = depth_order();
  p.defer_store = defer_store();
  std::memset(&l.c, 0, sizeof(l.c));
  // A C the driver will not map (strides past its limits) is written from registers.
  if (!two_per_sm && !sliced && p.wg_split_k == 0 && use_staged_c(x) && encode_c_map(&l.c, x)) {
    p.store_c = 1;
  }
  p.stages = two_per_sm
                 ? sm90::kGroupedPairStages
                 : ring_stages(
                       l.a_rows, bn, p.store_c != 0, p.split != static_cast<int>(GroupSplit::kNone),
                       sm90::grouped_scale_bytes(l.block, x.b_block_cols), p.wg_split_k != 0);
  if (geo.units == 0) return cudaSuccess;
  const TailSplit& tail = geo.tail;
  // A cut tail's pieces are units too: a product of less than one round has more of them than
  // tiles, each for a CTA of its own.
  const int64_t work =
      tail.slices > 1 ? tail.first + static_cast<int64_t>(tail.pieces) * tail.slices : geo.units;
  l.grid = static_cast<int>(std::min<int64_t>(work, geo.slots)) * l.cluster;
  p.tail_slices = tail.slices;
  p.tail_first = tail.first;
  p.tail_depth = tail.depth;
  p.tail_partial = nullptr;
  p.tail_flags = nullptr;
  if (tail.slices > 1) {
    auto* ws = static_cast<unsigned char*>(x.workspace);
    p.tail_partial = reinterpret_cast<float*>(ws);
    p.tail_flags = reinterpret_cast<int*>(ws + tail_partial_bytes(tail, cluster, bn));
    *step = "the reset of the split tail's flags";
    GEMMT_RETURN_IF_ERROR(
        cudaMemsetAsync(p.tail_flags, 0, tail_slots(tail, cluster) * 2 * sizeof(int), stream));
  }
  *step = "the launch of the kernel instance";
  GEMMT_RETURN_IF_ERROR(launch_instance(x.kind, l, stream));
  if (!sliced) return cudaSuccess;
  *step = "the reduction of the k-slices";
  return reduce_k_slices(x, ks, stream);
}

}  // namespace gemmt
