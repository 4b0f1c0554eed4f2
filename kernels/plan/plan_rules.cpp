// The planners' rule table (see plan_rules.h). The numbers are those of the comments at each
// rule's definition and of docs/performance.md; the results folders are named with the commit
// that added them, so that they can be found in the history once the tree no longer holds them.
#include "plan/plan_rules.h"

#include <cstring>

#include "plan/simt_plan.h"
#include "plan/sm90_plan.h"

namespace gemmt {
namespace {

bool is_16_bit(const GemmArgs& a) {
  return a.dtype == ScalarType::kFloat16 || a.dtype == ScalarType::kBFloat16;
}

bool gemv_prefetches(const GemmArgs& a) {
  if (!(a.m == 1 || a.n == 1) || !is_16_bit(a)) return false;
  return simt::plan_gemv(a).prefetch_blocks > 0;
}

bool gemv_shares_rows(const GemmArgs& a) {
  if (!(a.m == 1 || a.n == 1)) return false;
  const simt::GemvPlan g = simt::plan_gemv(a);
  return !g.colsweep && g.rows_per_block < 8;
}

bool small_m_given(const GemmArgs& a) {
  return is_16_bit(a) && a.n > sm90::kBNNarrow && sm90::small_m_given_one_wave(a);
}

bool stages_b_16_bit(const GemmArgs& a) {
  return a.dtype != ScalarType::kFloat32 && simt::stages_b(a);
}

bool stages_b_float32(const GemmArgs& a) {
  return a.dtype == ScalarType::kFloat32 && simt::stages_b(a);
}

constexpr PlanRule kRules[] = {
    {"swap_for_small_m", "sm90", "problem_for",
     "16-bit x @ W^T or g @ W with m <= 64 tokens and n > 64, where the swapped problem is "
     "supported, but not 33-64 tokens of a plain product whose narrow tiles as given fit one "
     "wave (small_m_given_one_wave)",
     "run C^T = W x^T: the weight is the 128-row A, the tokens the narrow tile's columns",
     "as given, twice as many 64-wide tiles stream half the weight a stage, and the second "
     "consumer warpgroup computes rows that do not exist",
     "decode of 4096 x 11008 weights: 0.47-0.74 of cuBLAS before; 0.96-1.2 of the copy "
     "bandwidth after",
     "h100_2026-11-25_decode_swap (47295f1); rule f2b0c05", "-", true, &sm90::swap_for_small_m,
     "(d) mixed. h100_tune decides 16 points: the winner keeps it at 10, takes the product as "
     "given at 4, neither at 2; the product as given timed at 16. h200_tune decides 58 points: "
     "the winner keeps it at 56, takes the product as given at 2; the product as given timed "
     "at 58. As given won by 5-12% at 4-64 tokens through 5120 x 5120 on the H100 (both "
     "dtypes) and by 0-9% at some of 2-64 tokens through 2048- to 5120-row weights on the "
     "H200; elsewhere the swap held. The exception (33-64 tokens, one wave of narrow tiles) "
     "took the 64-token points out of the class: the tuner, timing weights that stay in L2, "
     "had them level (2048 and 4096 rows) or swapped 3% ahead (5120 x 5120); streamed from "
     "DRAM, as given won (ab_small_m_orientation_h200_2026-11-30.json)"},
    {"small_m_given_one_wave", "sm90", "problem_for (swap_for_small_m)",
     "16-bit x @ W^T or g @ W with 33 <= m <= 64 tokens and n > 64, no epilogue, whose "
     "64-wide tiles as given fit one wave (ceil(n / 64) <= SMs: up to 8448 rows on 132 SMs)",
     "keep the product as given (an exception to swap_for_small_m): narrow tiles, in the "
     "model's k-slices",
     "as given, the narrow tiles take the weight in k-slices over all SMs; swapped, the 128-row "
     "tiles need twice the slices and their reduction",
     "H200, weights streamed from DRAM, 33-64 tokens through eight weights of 2048 x 4096 to "
     "13824 x 5120, bf16 and fp16, against swapping every one in the same process: median "
     "0.940 -> 0.976 of cuBLAS; 3584 x 3584 at 40-56 tokens 0.94-0.98 -> 1.02-1.04, 4096 x "
     "4096 at 56 / 64 0.81 / 0.79 -> 0.92 / 0.91, 6144 and 8192 x 4096 0.83-0.93 -> "
     "0.92-1.03, 4096 x 14336 0.93-0.97 -> 0.97-1.05; 5120 x 5120 within 3% either way",
     "h200_tune/ab_small_m_orientation_h200_2026-11-30.json", "SM count", true, &small_m_given,
     "(d) mixed. h100_tune decides 4 points: the winner keeps it at 4, takes the plan without "
     "it at 0; the plan without it timed at 4. h200_tune decides 6 points: the winner keeps it "
     "at 5, takes the plan without it at 1; the plan without it timed at 6. The sweeps' one "
     "token count in its class is 64; the tuner times weights that stay in L2, where the two "
     "orientations ran within 1% at 2048 and 4096 rows and the swap 3% ahead at 5120 x 5120 "
     "(bf16), the one winner it contradicts"},
    {"swap_for_batched_decode", "sm90", "problem_for",
     "16-bit x @ W^T or g @ W with 129 <= m <= 192 tokens and n > 256, where the swapped "
     "problem is supported on the three-quarter tile, except where the product as given runs "
     "on narrow tiles filling 84% of a wave, unsplit or in k-slices within one wave "
     "(given_narrow_fills_the_gpu: weights of 3584 x 3584 to 4096 x 4096, or 2048 x 4096 in "
     "two slices)",
     "run C^T = W x^T on the three-quarter tile: one column of tiles holds every token and "
     "computes only the columns they fill (trimmed_tile_width); the model's split for it",
     "as given, the tokens are two 128-row tiles, the second 1-64 rows full, so half of its "
     "tensor-core work or more is spent on rows that do not exist",
     "H200, 129-192 tokens over six weights of 16 MB to 1 GB (26 points, bf16 and fp16, two "
     "runs): median (worst) 0.67 (0.45) of cuBLAS before, 0.89 (0.66) after, 1.19x faster "
     "(1.06-1.67x), e.g. 144 x 4096 x 4096 34.1 -> 21.4 us; swapped, 65-128 and 193-256 "
     "tokens lost to the product as given on either tile. Once the last tile ends at row m "
     "(last_tile_row), 4096 x 4096 as given (2 x 64 narrow tiles, unsplit) ran 1.05-1.16x "
     "the swapped speed at 136-192 tokens (1.02-1.13x once B's boxes no longer cross either: "
     "second_b_box; 4096 x 2048 1.18-1.32x); 2048 x 4096 (as given in 4 slices) 0.98-1.09x, "
     "3072 x 4096 (96 tiles) 0.98-1.03x, 4096 x 14336 0.89-1.02x, the 5120-wide and "
     "128256-row weights 0.71-0.90x: they swap; 2048 x 4096 as given in two slices "
     "(narrow_split_search) 1.03-1.12x at 136-192 tokens, 3584 x 3584 unsplit 1.02-1.09x",
     "h200_tune/ab_batched_decode_h200_2026-11-29.json, ab_last_tile_h200_2026-11-29.json, "
     "ab_second_b_box_h200_2026-11-29.json, heldout_decode_h200_2026-11-29.json",
     "SM count", true, &sm90::swap_for_batched_decode,
     "(b) not contradicted, its alternative untimed. h100_tune in class at 0 points, deciding "
     "none. h200_tune decides 6 points: the winner keeps it at 6, takes the plan without it at "
     "0; the plan without it timed at 0. The sweeps' one token count in its class is 160 (H200 "
     "only); 2048 x 4096 now runs as given there (given_narrow_fills_the_gpu)"},
    {"swap_for_tf32", "sm90", "problem_for",
     "tf32, n > 64, B not K-major (a row-major b), A not M-major",
     "run C^T = B^T A^T: B becomes an M-major A read through registers, A a K-major B",
     "tf32 wgmma reads B K-major only; swapped, neither operand is copied",
     "not timed on its own: it removes the staging pass over B, a bandwidth-bound copy of a "
     "few percent of the product",
     "rule 1e32938", "-", true, &sm90::swap_for_tf32,
     "(a) decides none of the tuned plans. h100_tune in class at 0 points, deciding none. "
     "h200_tune in class at 0 points, deciding none"},
    {"streams_single_row", "sm90", "gemm_pick (kernels/gemm_dispatch.cu)",
     "16-bit m == 1 without epilogue, a weight of at least 8192 rows from DRAM (over the L2 "
     "budget), unsplit, whose 128-row tiles fill their last wave to 80% or more",
     "the wgmma kernel's swapped narrow tile instead of gemv",
     "the narrow tile streams such a weight faster; a second wave under 80% full or a weight "
     "of 32 MB or less loses",
     "1-5% faster than gemv on the 8 of 22 weights it admits; 6-9% slower on the two with a "
     "second wave 9-12% full",
     "h100_2026-11-27_gemv_rows (0b950b5)", "L2 size", true, &sm90::streams_single_row,
     "(d) mixed. h100_tune decides 2 points: the winner keeps it at 0, takes gemv at 2; gemv "
     "timed at 2. h200_tune decides 4 points: the winner keeps it at 4, takes gemv at 0; gemv "
     "timed at 4. gemv, with its L2 prefetch, won 1 x 4096 -> 128256 by 1.3-2.4% on the H100 "
     "(whose sweep, run with --quick, has no 13824- or 14336-row weight); the H200 kept the "
     "narrow tile at 5120 -> 13824 and 4096 -> 128256"},
    {"narrow_weight_stream", "sm90", "choose_tile",
     "16-bit, m <= 128 (one row of tiles), a weight from DRAM (over the L2 budget), narrow "
     "tiles for at most half of the SMs, at least 8 k-blocks",
     "the narrow tile in two k-slices, whatever the model says",
     "each narrow stage carries the tokens' 128 rows beside 8 KB of weight, so the weight "
     "needs every SM; the model prices the two slices as unsplit",
     "128 tokens, 4096 x 11008 and 4096 x 14336: 49.5 and 58.3 us against 53.4-54.1 and "
     "61.8-62.5 us unsplit; decode 128 tokens 0.90-0.92 to 1.03-1.06 of cuBLAS",
     "gemm_tc_selftest --decode-sweep in docs/performance.md; rule 32cc471", "L2 size", true,
     &sm90::narrow_weight_stream,
     "(a) decides none of the tuned plans. h100_tune in class at 0 points, deciding none. "
     "h200_tune in class at 0 points, deciding none"},
    {"narrow_split_search", "sm90", "choose_tile",
     "16-bit, wide tiles for at most half of the SMs (outside narrow_weight_stream), where the "
     "model prices the narrow tile at its best k-split (more than one slice) below the wider "
     "tiles",
     "weigh the narrow tile at its best split against the wider tiles at theirs (it was "
     "weighed whole)",
     "weighed whole, the narrow tile lost to medium tiles in six slices that ran slower",
     "2048 x 4096 weight at 100-256 tokens (H200): 1.10-1.20x the planner's earlier plan, the "
     "fastest schedule the tuner timed at each of those points",
     "h200_tune/tune_nvidia_h200_2026-11-29.json (every schedule timed)",
     "SM count, L2 size, "
     "DRAM bandwidth",
     true, &sm90::narrow_split_search,
     "(b) not contradicted, its alternative untimed. h100_tune decides 4 points: the winner "
     "keeps it at 4, takes the plan without it at 0; the plan without it timed at 0. h200_tune "
     "decides 14 points: the winner keeps it at 14, takes the plan without it at 0; the plan "
     "without it timed at 0. Where it decides, every winner ran narrow tiles in k-slices (on "
     "the H100 in 4 where the rule takes 3)"},
    {"batched_decode_roofline", "sm90", "best_splits (split_search_open)",
     "16-bit, 64 < m <= 256 tokens, a weight from DRAM (over the L2 budget), m under the "
     "roofline's ridge (ridge_tokens: 380 on the H100, 266 on the H200); the same with the "
     "tokens as n, as a swapped product has them (swap_for_batched_decode)",
     "open the k-split search even where the tiles fill half of the SMs; the model, priced "
     "with the device's DRAM rate and streaming share, picks the split",
     "m tokens do m FLOPs per weight byte (2m per 2-byte element), so under the ridge the "
     "floor is streaming the weight once and a plan that leaves SMs idle (2 x 40 tiles of a "
     "5120-wide weight on 132 SMs) misses it; the faster the DRAM, the more CTAs must stream "
     "it. On the H200 e.g. 200 x 7168 -> 18432 to 128x192 tiles in 2 slices (the H100 keeps whole "
     "tiles)",
     "to be measured (H100 0.67-0.97 and H200 0.65-0.81 of cuBLAS at 200 tokens before)",
     "issue 50, item 4", "L2 size, DRAM bandwidth, SM clock, SM count", false,
     &sm90::batched_decode_roofline,
     "(a) decides none of the tuned plans. h100_tune in class at 8 points, deciding none. "
     "h200_tune in class at 24 points, deciding none. Where in class the model's plan stayed "
     "unsplit, so the open search changed nothing; at 200 tokens through 5120 x 5120 the H200's "
     "winner was the swapped wide tile in 3 slices, 6-7% faster"},
    {"no_split_past_half_the_sms", "sm90", "best_splits (split_search_open)",
     "products whose tiles at the chosen width fill more than half of the SMs (outside "
     "batched_decode_roofline)",
     "no k-split, even for a product that streams one operand",
     "slices stream a weight slower than whole tiles do",
     "86 narrow tiles of an 11008-row weight: 2.2 TB/s unsplit, 2.0 in 3 slices; 112 of a "
     "14336-row one: 2.3-2.4 against 1.9-2.2 in 7",
     "gemm_tc_selftest --decode-sweep; rule f2b0c05", "SM count", true,
     &sm90::no_split_past_half_the_sms,
     "(b) not contradicted, its alternative untimed. h100_tune decides 16 points: the winner "
     "keeps it at 14, takes a split there at 0, neither at 2; a split there timed at 0. "
     "h200_tune decides 51 points: the winner keeps it at 51, takes a split there at 0; a "
     "split there timed at 0. The tuner splits only tile widths whose tiles fill at most half "
     "of the SMs, the same bound, so it cannot test the rule"},
    {"stream_k_from_two_waves", "sm90", "best_splits (stream_k_cost_us, kStreamKMargin)",
     "wide tiles of at least two waves with a partial last wave",
     "stream-k where the model prices it 3% or more below whole tiles",
     "under two waves the spread desyncs the CTA pairs sharing a weight column; the margin "
     "stands for the pieces' lower rate, which the model leaves out",
     "stream-k parts ran at 1.1-1.5 times their whole-tile time; 2048 x 8192 x 28672, "
     "modelled at 0.974, ran 16-21% slower as stream-k; 2048 x 11008 x 4096 (5.2 waves) gains",
     "h100_2026-11-27_stream_k_schedules (cb65e3a); rule d290f74", "SM count", true,
     &sm90::stream_k_from_two_waves,
     "(b) not contradicted, its alternative untimed. h100_tune decides 2 points: the winner keeps "
     "it at 2, takes whole wide tiles at 0; whole wide tiles timed at 0. h200_tune decides 6 "
     "points: the winner keeps it at 6, takes whole wide tiles at 0; whole wide tiles timed at 0. "
     "The tuner times stream-k there but not whole 256-wide tiles; outside the class (512 x 4096 "
     "-> 14336, 1.7 waves) the H200 took stream-k on the last wave, 0.3% faster when re-timed"},
    {"stream_k_tail_only", "sm90", "best_splits",
     "stream-k products of two to five waves of wide tiles",
     "spread the partial last wave alone; whole waves run as tiles",
     "each tile of the last wave is cut in two at most, and the whole waves keep their "
     "operand reuse",
     "faster on 14 of 16 products, by up to 15% (1536 x 7168 x 18432); 2048 tokens through "
     "5120 -> 13824 and its backward 8-9%",
     "h100_2026-11-27_stream_k_tail (8c4dd9f)", "SM count", true, &sm90::stream_k_tail_only,
     "(a) decides none of the tuned plans. h100_tune in class at 26 points, deciding none. "
     "h200_tune in class at 105 points, deciding none. No default plan of the sweeps runs "
     "stream-k under five waves"},
    {"long_k_last_wave", "sm90", "best_splits",
     "16-bit, 5 to 32 waves of wide tiles, 128 to 320 k-blocks (K 8192-20480), last wave 40% "
     "to 90% full",
     "stream-k on the last wave alone, whatever the model says",
     "the whole tiles' last wave idles (1 - fill) of a long unit, the spread one cuts each "
     "tile in two at most",
     "0.985 of the planner's choice (median of 19, 17 faster); bench linear prefill 0.987-1.052 "
     "to 1.009-1.064 of cuBLAS",
     "h100_2026-11-27_last_wave_long_k (e153bf7)", "SM count", true, &sm90::long_k_last_wave,
     "(a) decides none of the tuned plans. h100_tune in class at 0 points, deciding none. "
     "h200_tune in class at 0 points, deciding none"},
    {"short_k_ping_pong", "sm90", "choose_tile",
     "16-bit, 5 to 8 k-blocks (K 320-512), medium tiles for two waves or more",
     "the ping-pong medium tile, whatever the model says",
     "with a short k the epilogue weighs as much as the main loop; the medium tile stores one "
     "tile while the other warpgroup computes the next",
     "grad_weight 0.92-0.98 of the wide tiles' time (112 of 120 faster); bench linear "
     "512-token grad_weight 0.96-1.05 to 1.03-1.22 of cuBLAS",
     "h100_2026-11-27_short_k_medium (f05de3e)", "SM count", true, &sm90::short_k_ping_pong,
     "(a) decides none of the tuned plans. h100_tune in class at 0 points, deciding none. "
     "h200_tune in class at 0 points, deciding none"},
    {"epilogue_takes_medium", "sm90", "problem_for",
     "a product with an epilogue that the model gives unsplit narrow tiles",
     "the medium tile instead",
     "only the staged store of the wider tiles (or a split's reduction) applies an epilogue; "
     "the narrow plan would hand the product to a slower family",
     "keeps fused-epilogue products on the Hopper kernel (no separate timing)", "rule 8783a0c", "-",
     true, &sm90::epilogue_takes_medium,
     "(a) decides none of the tuned plans. h100_tune in class at 0 points, deciding none. "
     "h200_tune in class at 0 points, deciding none"},
    {"stage_k_major_b_16_bit", "simt", "stages_b",
     "16-bit pipelined products (tensor cores unavailable) with a K-major B and m >= 2048",
     "copy B N-major into the workspace first",
     "a K-major B is the SIMT kernel's slowest read; the copy pays from m = 2048",
     "at 4096^3 a K-major B ran at 0.84 of cuBLAS, an N-major one at 0.94; the copy costs "
     "about 4% of the product at m = 2048",
     "rule 149ffa8", "-", true, &stages_b_16_bit,
     "(a) decides none of the tuned plans (the sweeps' products run on the Hopper kernel). "
     "h100_tune in class at 4 points, deciding none. h200_tune in class at 10 points, deciding "
     "none"},
    {"stage_k_major_b_float32", "simt", "stages_b",
     "float32 with a K-major B where the copy's share, kStageCopyCost / m (82 on the H100), is "
     "under the in-place penalty (6% at a power-of-two k, 10% elsewhere)",
     "copy B N-major into the workspace first",
     "the copy's share falls as 1/m; reading B in place costs a fixed share of the rate",
     "held out (11 weights and token counts) the faster way within 1% in two runs",
     "h100_2026-11-27_k_major_b (d5c871f)", "DRAM bandwidth, SM clock", true, &stages_b_float32,
     "(a) decides none of the tuned plans (the sweeps' products run on the Hopper kernel). "
     "h100_tune in class at 0 points, deciding none. h200_tune in class at 0 points, deciding "
     "none"},
    {"swap_k_major_b", "simt", "plan_simt (swaps_operands)",
     "float32 pipelined with a K-major B whose A is M-major, or K-major with m < n and the "
     "transposed copy paying; not for at most 32 rows where the 32-row tile exists (they run "
     "as they lie: 1.5-1.6x faster at 4-32 rows x 28672 / 128256 x 4096, H200)",
     "run C^T = B^T A^T, C stored column-major, copying x (m x k) instead of W",
     "the kernel reads a K-major A at full rate; only a K-major B costs it",
     "0.95-1.00 of the N-major rate on 30 of 32 products (0.86-0.96 before); fp32 median "
     "0.970-0.971 of cuBLAS",
     "h100_2026-11-27_swapped_k_major (2062256); rule 9abe35d", "DRAM bandwidth, SM clock", true,
     &simt::swaps_operands,
     "(a) decides none of the tuned plans (the sweeps' products run on the Hopper kernel). "
     "h100_tune in class at 0 points, deciding none. h200_tune in class at 0 points, deciding "
     "none"},
    {"simt_split_k", "simt", "simt_wants_split_k (gemm_pick)",
     "k >= 4096 and at most half as many 128x128 tiles as SMs, or any width for float32 of at "
     "most 32 rows split on the 32x256 tile, where the split-k planner gives more than one "
     "slice",
     "the split-k variant instead of the pipelined kernel",
     "few tiles leave SMs idle unless k is cut; elsewhere the pipelined kernel with a "
     "stream-k last wave is faster",
     "letting the model alone decide made 1024^3 float32 give up its faster stream-k wave",
     "docs/performance.md, One split-k policy; rule 586d477", "SM count", true,
     &simt::simt_split_k_class,
     "(a) decides none of the tuned plans (the sweeps' products run on the Hopper kernel). "
     "h100_tune in class at 22 points, deciding none. h200_tune in class at 66 points, "
     "deciding none"},
    {"gemv_l2_prefetch", "simt", "plan_gemv (gemv_prefetch_blocks)",
     "16-bit row-dot gemv on sm_90+, unsplit, blocks of at most 16 KB, a matrix over the L2 "
     "budget",
     "each block has L2 prefetch the rows 8 x SMs blocks ahead (at most a third of L2)",
     "short blocks end after a DRAM latency or two and their registers hold too few loads "
     "to keep DRAM busy between blocks",
     "1.0-3.8% faster on 4096 x 14336 / 32000 / 128256 and 8192 x 8192 / 28672; a lead of "
     "16 x 132 blocks ran 20-51% slower",
     "h100_2026-11-27_gemv_rows/4_prefetch (0b950b5); rule dbb0b49", "L2 size, SM count", true,
     &gemv_prefetches,
     "(a) decides none of the tuned plans. h100_tune in class at 0 points, deciding none. "
     "h200_tune in class at 0 points, deciding none. The H100's gemv winners at 1 x 4096 -> "
     "128256 prefetch under it"},
    {"gemv_warps_per_row", "simt", "plan_gemv (gemv_warps_per_row)",
     "row-dot gemv with dot products of 2048 elements or more",
     "2, 4 or 8 warps share a row (k >= 2048, 4096, 8192)",
     "each lane still streams several vectors of a long row",
     "a rule of at least eight vectors a lane ran over 0.3% slower on 19 of 32 weights, by up "
     "to 7%",
     "h100_2026-11-27_gemv_rows (0b950b5)", "-", true, &gemv_shares_rows,
     "(b) not contradicted, its alternative untimed. h100_tune decides 4 points: the winner "
     "keeps it at 4, takes one warp a row at 0; one warp a row timed at 0. h200_tune decides 6 "
     "points: the winner keeps it at 1, takes one warp a row at 0, neither at 5; one warp a "
     "row timed at 0. The tuner times gemv in one form only; on the H200 the Hopper kernel won "
     "5 of the 6 one-token products it decides"},
};

}  // namespace

const PlanRule* plan_rules(std::size_t* count) {
  *count = sizeof(kRules) / sizeof(kRules[0]);
  return kRules;
}

const PlanRule* find_plan_rule(const char* name) {
  for (const PlanRule& r : kRules) {
    if (std::strcmp(r.name, name) == 0) return &r;
  }
  return nullptr;
}

}  // namespace gemmt
