"""The planners of kernels/plan/ on CPU. The SIMT planner (simt_plan.cpp): what it chooses for shapes, strides,
alignments and dtypes, the workspace it asks for, that it only ever picks a compiled kernel
instance, that its answer does not depend on which thread asks or on its per-thread cache,
and that `supported` and the run path come from the same plan.

The planner sees the compiled kernels through their occupancy; the tests give it the
occupancy each tile shape is compiled for (its __launch_bounds__ minimum), on a 132-SM GPU.
"""

from __future__ import annotations

import itertools
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gemmt import _native

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plan_sweep  # noqa: E402  (tests/plan_sweep.py: the sweep and the snapshot's reader)
import tune_evidence  # noqa: E402  (tests/tune_evidence.py: the tuner's winners, replayed)

SMS = 132
OCCUPANCY = {"large": 2, "medium": 3, "small": 4, "fat": 1, "narrow": 3, "skinny": 3}
ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
SIMT_VARIANTS = ["naive", "smem_tiled", "register_blocked", "warp_tiled", "pipelined", "split_k",
                 "gemv"]
# Block tile of each tile shape (kPipeShapes).
TILE_SHAPES = {"large": (128, 128), "medium": (64, 128), "small": (64, 64), "fat": (128, 256),
               "narrow": (128, 64), "skinny": (32, 256)}


def plan(variant: str, dtype: str, m: int, n: int, k: int, *, a_layout: str = "row",
         b_layout: str = "row", offsets: tuple[int, int, int] = (0, 0, 0), device: int = -1,
         occupancy: dict[str, int] | None = None, refuse: str = "", cc_major: int = 0,
         device_info: dict[str, int] | None = None) -> dict[str, Any]:
    """The plan for an m x k by k x n product; layouts 'row' (unit stride along the second
    dimension), 'col' (transposed view) or 'strided' (no unit stride); offsets in elements;
    device_info: the device's description (None: unknown, read as the H100's)."""

    def strides(layout: str, rows: int, cols: int) -> tuple[int, int]:
        if layout == "row":
            return (cols, 1)
        if layout == "col":
            return (1, rows)
        return (2 * cols, 2)

    es = ELEM_BYTES.get(dtype, 1)
    return _native.load().plan_simt(
        variant, dtype, m, n, k, strides(a_layout, m, k), strides(b_layout, k, n), n,
        tuple(o * es for o in offsets), SMS, occupancy or OCCUPANCY, refuse, device, cc_major,
        device_info or {})


SHAPES = [(1, 1, 1), (1, 300, 70), (300, 1, 70), (7, 9, 3), (64, 64, 64), (127, 255, 511),
          (1024, 1024, 1024), (256, 256, 65536), (4096, 64, 4096), (4096, 4096, 4096),
          (2048, 2048, 0), (0, 5, 5)]
LAYOUTS = ["row", "col", "strided"]
OFFSETS = [(0, 0, 0), (1, 1, 1)]


def _cases():
    for dtype, (m, n, k), al, bl, off in itertools.product(
            ELEM_BYTES, SHAPES, LAYOUTS, LAYOUTS, OFFSETS):
        yield dtype, m, n, k, al, bl, off


def test_every_problem_gets_a_consistent_plan() -> None:
    """Enumerates shapes x layouts x alignments x dtypes x variants against the plan."""
    checked = 0
    for dtype, m, n, k, al, bl, off in _cases():
        kw = dict(a_layout=al, b_layout=bl, offsets=off)
        split = plan("split_k", dtype, m, n, k, **kw)
        for variant in SIMT_VARIANTS:
            p = plan(variant, dtype, m, n, k, **kw)
            expect_supported = variant != "gemv" or m == 1 or n == 1
            assert p["supported"] == expect_supported, (variant, dtype, m, n, k, al, bl, off)
            if not expect_supported:
                continue
            assert p["error"] == 0, (variant, dtype, m, n, k, p)
            checked += 1
            if m == 0 or n == 0 or k == 0:
                assert p["workspace_bytes"] == 0
                continue
            if variant in ("pipelined", "split_k"):
                # Never a kernel instance that is not compiled.
                assert p["instance_built"], (variant, dtype, m, n, k, al, bl, off, p)
                bm, bn = TILE_SHAPES[p["tile"]]
                assert (p["block_m"], p["block_n"]) == (bm, bn)
                # A swapped plan tiles C^T (n x m); only float32 with a K-major B swaps.
                pm, pn = (n, m) if p["swapped"] else (m, n)
                if p["swapped"]:
                    assert variant == "pipelined" and dtype == "float32"
                    assert bl == "col" or 1 in (n, k)  # a K-major B (or a vector)
                    assert al != "strided" and p["a_mode"] == "vec_k"
                assert p["tiles_m"] * bm >= pm and p["tiles_n"] * bn >= pn
                assert (p["splits"] - 1) * p["k_per_split"] < k <= p["splits"] * p["k_per_split"]
                assert p["k_per_split"] % p["block_k"] == 0 or p["splits"] == 1
                if p["interior"]:
                    assert pm % bm == 0 and pn % bn == 0 and k % p["block_k"] == 0
                assert p["stream_k_tiles"] <= p["tiles_m"] * p["tiles_n"]
                if dtype != "float32":
                    assert p["tile"] in ("large", "small") and not p["interior"]
                    assert p["stream_k_blocks"] == 0
                if variant == "pipelined":
                    assert p["splits"] == 1
            if variant == "split_k":
                # auto takes split-k only where it pays (few 128x128 tiles, long k) and where
                # the planner then really splits.
                few_tiles = -(-m // 128) * -(-n // 128) * 2 <= SMS and k >= 4096
                assert split["wants_split_k"] == (few_tiles and p["splits"] > 1)
    assert checked > 1000


def test_uint8_is_refused_by_every_variant() -> None:
    for variant in SIMT_VARIANTS:
        assert not plan(variant, "uint8", 64, 1, 64)["supported"]


def test_unaligned_16_bit_operands_use_no_vector_loads() -> None:
    p = plan("pipelined", "bfloat16", 512, 512, 512, offsets=(1, 1, 0))
    assert (p["a_mode"], p["b_mode"]) == ("scalar", "scalar")
    q = plan("pipelined", "bfloat16", 512, 512, 512)
    assert (q["a_mode"], q["b_mode"]) == ("vec_k", "vec_c")


def test_choices_match_the_measured_fastest_tiles() -> None:
    """The shapes docs/performance.md reports as fastest on an H100 for float32 squares."""
    small = plan("pipelined", "float32", 1024, 1024, 1024)
    assert (small["tile"], small["interior"]) == ("medium", True)
    for size in (2048, 4096, 8192):
        big = plan("pipelined", "float32", size, size, size)
        assert (big["tile"], big["interior"]) == ("fat", True), size


def test_few_float32_rows_take_the_32_row_tile() -> None:
    """A float32 product of at most 32 rows against a long weight is FFMA-bound, and the
    64-row tiles spend half their FFMAs or more on rows past m: split-k runs it on the
    32 x 256 tile, whose blocks do the same work as the 64 x 128 tile's with half as many of
    them. From 33 rows, and for layouts that need scalar loads, the 64-row tiles."""
    for m in (2, 8, 16, 24, 32):
        for n, k in ((4096, 4096), (4096, 11008), (2048, 8192)):
            p = plan("split_k", "float32", m, n, k)
            assert p["wants_split_k"] and p["tile"] == "skinny" and p["splits"] > 1, (m, n, k)
            assert p["tiles_m"] == 1 and p["tiles_n"] * 256 >= n
    for m in (33, 48, 64):
        assert plan("split_k", "float32", m, 4096, 4096)["tile"] == "medium", m
    assert plan("split_k", "float32", 32, 4096, 4096, a_layout="strided")["tile"] != "skinny"
    # Without the tile (a device table that leaves it out), the 64-row tile as before.
    old = {key: v for key, v in OCCUPANCY.items() if key != "skinny"}
    assert plan("split_k", "float32", 32, 4096, 4096, occupancy=old)["tile"] == "medium"
    # 16-bit operands have no such tile.
    assert plan("split_k", "bfloat16", 32, 4096, 4096)["tile"] != "skinny"


def test_gemv_takes_two_to_four_float32_rows_against_a_unit_stride_weight() -> None:
    """float32 with 2-4 rows: gemv reads each element of the weight once for all of them,
    the row-dot kernel for x @ W.T (W's rows contiguous) and the column sweep for a @ W (its
    split workspace holds a slice set per row of x); not with 5 rows, a weight without a
    unit stride, or 16-bit operands (the tensor-core kernels)."""
    for m in (2, 3, 4):
        p = plan("gemv", "float32", m, 4096, 4096, b_layout="col")
        assert p["supported"] and not p["colsweep"] and p["rows_per_block"] > 0, m
        q = plan("gemv", "float32", m, 256, 65536, b_layout="col")
        assert q["splits"] > 1 and q["workspace_bytes"] == q["splits"] * m * 256 * 4, (m, q)
        r = plan("gemv", "float32", m, 4096, 4096, b_layout="row")
        assert r["supported"] and r["colsweep"], m
        assert r["splits"] > 1 and r["workspace_bytes"] == r["splits"] * m * 4096 * 4, (m, r)
    assert not plan("gemv", "float32", 5, 4096, 4096, b_layout="col")["supported"]
    assert not plan("gemv", "float32", 3, 4096, 4096, b_layout="strided")["supported"]
    assert not plan("gemv", "bfloat16", 3, 4096, 4096, b_layout="col")["supported"]


def test_a_k_major_float32_weight_is_copied_where_that_costs_less() -> None:
    """A K-major float32 B whose product is not run transposed (here: m >= n) is copied
    N-major before the product where the copy (about 8% of the product at m = 1024, falling as
    1/m) costs less than reading B in place (6% at a power-of-two k, 10% at other k; H100,
    docs/performance.md)."""
    def staged(m: int, n: int, k: int) -> bool:
        p = plan("pipelined", "float32", m, n, k, b_layout="col")
        assert not p["swapped"], (m, n, k)
        assert p["b_mode"] == ("vec_c" if p["staged_b"] else "vec_k")
        if p["staged_b"]:
            assert p["workspace_bytes"] >= n * k * 4
        return bool(p["staged_b"])

    for m, k in ((1367, 4096), (1400, 8192), (2048, 4096), (8192, 11008), (840, 3000)):
        assert staged(m, m, k), (m, k)
    for m, k in ((1280, 4096), (1366, 8192), (800, 3000), (512, 11008)):
        assert not staged(m, m, k), (m, k)
    assert staged(8192, 4096, 11008) and staged(4096, 4096, 28672)
    assert not plan("pipelined", "float32", 2048, 11008, 4096)["staged_b"]  # N-major already
    # 16-bit operands keep the 2048-row rule, and never swap.
    b16 = plan("pipelined", "bfloat16", 1536, 4096, 11008, b_layout="col")
    assert not b16["staged_b"] and not b16["swapped"]
    assert plan("pipelined", "bfloat16", 2048, 4096, 11008, b_layout="col")["staged_b"]


def test_x_at_w_t_in_float32_copies_the_smaller_operand() -> None:
    """x @ W.T in float32 with fewer tokens than outputs runs transposed (C^T = W @ x^T, C
    written column-major), so that the operand copied for the kernel is x (m x k), not W
    (n x k); where x is M-major already, nothing is copied at all."""
    for m, n, k in ((512, 11008, 4096), (2048, 11008, 4096), (2048, 4096, 11008),
                    (2048, 128256, 4096), (64, 1000, 520),
                    (200, 1030, 333), (384, 3000, 777)):  # the last three: test_gemm.py
        p = plan("pipelined", "float32", m, n, k, b_layout="col")
        assert p["swapped"] and p["staged_b"], (m, n, k)
        assert (p["a_mode"], p["b_mode"]) == ("vec_k", "vec_c")
        pitch = (m + 3) // 4 * 4
        assert p["workspace_bytes"] >= k * pitch * 4
        assert p["tiles_m"] * p["block_m"] >= n and p["tiles_n"] * p["block_n"] >= m
    # At most 32 rows: as they lie, W read in place, nothing copied (on the 32-row tile where
    # its 32 x 256 tiles fill the SMs; 16 x 4096 x 4096 goes to split-k on it under `auto`);
    # on a device without that tile, transposed and x copied as above.
    without = {key: v for key, v in OCCUPANCY.items() if key != "skinny"}
    for m, n, k in ((16, 4096, 4096), (4, 28672, 4096), (32, 128256, 4096)):
        p = plan("pipelined", "float32", m, n, k, b_layout="col")
        assert not p["swapped"] and not p["staged_b"], (m, n, k)
        assert p["tile"] == ("medium" if n == 4096 else "skinny"), (m, n, k)
        assert (p["a_mode"], p["b_mode"]) == ("vec_k", "vec_k")
        q = plan("pipelined", "float32", m, n, k, b_layout="col", occupancy=without)
        assert q["swapped"] and q["staged_b"], (m, n, k)
    # An M-major x: both operands are read as they lie once transposed.
    q = plan("pipelined", "float32", 2048, 11008, 4096, a_layout="col", b_layout="col")
    assert q["swapped"] and not q["staged_b"] and (q["a_mode"], q["b_mode"]) == ("vec_k", "vec_c")
    # Not transposed: at least as many tokens as outputs, outputs too few for the copy of x to
    # pay (82 / n above the in-place cost), too few tokens to copy (m < 4), split-k, 16-bit.
    assert not plan("pipelined", "float32", 4096, 4096, 4096, b_layout="col")["swapped"]
    assert not plan("pipelined", "float32", 100, 600, 4096, b_layout="col")["swapped"]
    assert not plan("pipelined", "float32", 3, 4096, 4096, b_layout="col")["swapped"]
    assert not plan("split_k", "float32", 256, 1024, 65536, b_layout="col")["swapped"]
    assert not plan("pipelined", "float32", 512, 11008, 4096)["swapped"]  # W.T N-major


def test_one_split_k_policy() -> None:
    """auto runs split-k exactly when the planner gives kSplitK more than one slice."""
    long_k = plan("split_k", "float32", 256, 256, 65536)
    assert long_k["wants_split_k"] and long_k["splits"] > 1
    square = plan("split_k", "float32", 4096, 4096, 4096)
    assert not square["wants_split_k"] and square["splits"] == 1


def test_workspace_sizes() -> None:
    m, n, k = 256, 256, 65536
    p = plan("split_k", "float32", m, n, k)
    assert p["workspace_bytes"] == p["splits"] * m * n * 4
    # A K-major 16-bit B with m >= 2048 is copied N-major (rows padded to 16 bytes) first.
    m, n, k = 2048, 100, 304
    s = plan("pipelined", "float16", m, n, k, b_layout="col")
    assert s["staged_b"] and s["b_mode"] == "vec_c"
    pitch = (n + 7) // 8 * 8
    assert s["workspace_bytes"] == (k * pitch * 2 + 255) // 256 * 256
    # Stream-k: 256-byte-rounded arrival counters, then two slots of a tile per block.
    sk = plan("pipelined", "float32", 4096, 4096, 4096)
    if sk["stream_k_blocks"]:
        counters = (sk["stream_k_tiles"] * 4 + 255) // 256 * 256
        slots = sk["stream_k_blocks"] * 2 * sk["block_m"] * sk["block_n"] * 4
        assert sk["workspace_bytes"] == counters + slots
    else:
        assert sk["workspace_bytes"] == 0
    # A long gemv splits its dot products into float32 slices.
    g = plan("gemv", "float32", 1, 64, 1 << 20)
    assert g["splits"] > 1 and g["workspace_bytes"] == g["splits"] * 64 * 4
    assert plan("gemv", "float32", 1, 4096, 64)["workspace_bytes"] == 0


def test_plans_are_deterministic_and_the_cache_changes_nothing() -> None:
    for dtype, m, n, k, al, bl, off in itertools.islice(_cases(), 0, None, 7):
        for variant in ("pipelined", "split_k", "gemv"):
            kw = dict(a_layout=al, b_layout=bl, offsets=off)
            fresh = plan(variant, dtype, m, n, k, **kw)
            assert plan(variant, dtype, m, n, k, **kw) == fresh
            # Cached (device 0), twice: the second call is served from the cache.
            assert plan(variant, dtype, m, n, k, device=0, **kw) == fresh
            assert plan(variant, dtype, m, n, k, device=0, **kw) == fresh


def test_a_refused_instance_is_planned_around() -> None:
    """A tile whose instances the device refuses is skipped; when all are, the plan carries
    the device's error (the run reports it) and the variant stays supported."""
    p = plan("pipelined", "float32", 4096, 4096, 4096, refuse="fat")
    assert p["error"] == 0 and p["tile"] != "fat"
    q = plan("pipelined", "float32", 4096, 4096, 4096, refuse="fat",
             occupancy={**OCCUPANCY, "fat": 1})
    assert q == p


def test_plans_agree_from_any_thread() -> None:
    """Every thread gets the plan a fresh single-threaded call gets, with its own cache, while
    others plan different problems against other devices at the same time."""
    problems = [("pipelined", "float32", 4096, 4096, 4096), ("split_k", "float32", 256, 256, 65536),
                ("pipelined", "bfloat16", 1000, 3000, 700), ("gemv", "float16", 1, 5000, 9000),
                ("split_k", "float32", 4096, 64, 4096)]
    devices = {0: OCCUPANCY, 1: {**OCCUPANCY, "fat": 2, "medium": 4}}
    expected = {(d, p): plan(*p, occupancy=occ) for d, occ in devices.items() for p in problems}
    failures: list[str] = []

    def worker(seed: int) -> None:
        for i in range(60):
            prob = problems[(seed + i) % len(problems)]
            d = (seed + i // 3) % 2
            got = plan(*prob, device=d, occupancy=devices[d])
            if got != expected[(d, prob)]:
                failures.append(f"thread {seed}: {prob} on device {d}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        plan("fast", "float32", 8, 8, 8)
    with pytest.raises(ValueError, match="dtype must be"):
        plan("naive", "int4", 8, 8, 8)


def decode(m: int, n: int, k: int, *, dtype: str = "bfloat16", cc_major: int = 9,
           offsets: tuple[int, int, int] = (0, 0, 0), a_k_major: bool = True) -> dict[str, Any]:
    """The decode planner's answer for tokens (m x k, K-major) @ W.T (W: n x k)."""
    a_strides = (k, 1) if a_k_major else (1, m)
    return _native.load().plan_decode(dtype, m, n, k, a_strides, (1, k), n, offsets, SMS,
                                      cc_major)


def test_decode_takes_only_what_its_kernel_reads() -> None:
    assert decode(8, 4096, 4096)["supported"]
    assert not decode(65, 4096, 4096)["supported"]  # m limit
    assert not decode(8, 4096, 4100)["supported"]  # k % 8
    assert not decode(8, 4096, 4096, dtype="float32")["supported"]
    assert not decode(8, 4096, 4096, cc_major=7)["supported"]
    assert not decode(8, 4096, 4096, offsets=(2, 0, 0))["supported"]  # 16-byte rows
    assert not decode(8, 4096, 4096, a_k_major=False)["supported"]


@pytest.mark.parametrize("m", [1, 3, 8, 9, 33, 64])
@pytest.mark.parametrize("n,k", [(4096, 4096), (11008, 4096), (512, 8192), (96, 64)])
@pytest.mark.parametrize("cc_major", [8, 9])
def test_decode_plan_covers_the_problem(m: int, n: int, k: int, cc_major: int) -> None:
    p = decode(m, n, k, cc_major=cc_major)
    assert p["supported"]
    assert p["tiles"] * 8 >= m and p["tiles"] in (1, 2, 4, 8)
    assert p["row_warps"] in (8, 4, 2)
    assert p["cluster"] * p["slices_per_cta"] * p["slice_k"] >= k
    blocks = -(-n // (16 * p["row_warps"]))
    assert p["ctas"] == blocks * p["cluster"]
    # Clusters need sm_90.
    assert p["cluster"] == 1 or cc_major >= 9
    assert decode(m, n, k, cc_major=cc_major) == p


def sm90(m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = "row",
         b_layout: str = "row", offsets: tuple[int, int, int] = (0, 0, 0), **kw: Any
         ) -> dict[str, Any]:
    """The Hopper planner's answer for an m x k by k x n product (layouts as in plan())."""
    def strides(layout: str, rows: int, cols: int) -> tuple[int, int]:
        return {"row": (cols, 1), "col": (1, rows), "strided": (2 * cols, 2)}[layout]
    es = ELEM_BYTES.get(dtype, 4)
    return _native.load().plan_sm90(dtype, m, n, k, strides(a_layout, m, k),
                                    strides(b_layout, k, n), n, tuple(o * es for o in offsets),
                                    SMS, **kw)


def test_sm90_takes_tensor_core_problems_on_hopper_only() -> None:
    assert sm90(4096, 4096, 4096)["supported"]
    assert not sm90(4096, 4096, 4096, cc_major=8)["supported"]
    assert not sm90(4096, 4096, 4096, kernels_built=False)["supported"]
    assert not sm90(4096, 4096, 4096, dtype="float32")["supported"]
    assert sm90(4096, 4096, 4096, dtype="float32", allow_tf32=True)["supported"]


def test_sm90_cta_pairs() -> None:
    """CTA pairs (cluster_ctas) where the 128-row tiles pair up, there is no k-split and the tile
    is wider than the narrow one (narrow pairs ran slower: docs/performance.md)."""
    assert sm90(4096, 4096, 4096)["cluster"] == 2
    assert sm90(4096 + 128, 4096, 4096)["cluster"] == 1  # 33 rows of tiles
    p = sm90(2048, 64, 1024)
    assert p["tile_n"] == 64 and p["splits"] > 1 and p["cluster"] == 1
    for m in (136, 200, 256):  # batched decode as given, on narrow tiles
        p = sm90(m, 4096, 4096, b_layout="col")
        assert (p["tile_n"], p["splits"], p["c_trans"], p["cluster"]) == (64, 1, False, 1), m
    p = sm90(1024, 40, 512)
    assert p["tile_n"] == 64 and p["splits"] == 1 and p["cluster"] == 1
    p = sm90(256, 4096, 4096, b_layout="col", tile_n=128, splits=1, orient=1)
    assert p["tile_n"] == 128 and p["cluster"] == 2
    p = sm90(256, 4096, 4096, b_layout="col", tile_n=128, splits=2, orient=1)
    assert p["splits"] == 2 and p["cluster"] == 1


def test_sm90_last_tile_ends_at_the_last_row() -> None:
    """Rows not a multiple of 128: the last 128-row tile is moved up to end at row m, so its
    A boxes never cross A's end (last_tile_row), where C is not read, there is more than one
    tile and TMA accepts the box start; in the kernel's orientation (C^T: the weight's rows)."""
    assert sm90(200, 4096, 4096, b_layout="col")["last_tile_row"] == 72
    assert sm90(300, 4096, 4096)["last_tile_row"] == 172
    assert sm90(4097, 4097, 4097)["last_tile_row"] == 3969
    for m in (100, 128, 256, 4096):  # one tile, or whole tiles
        assert sm90(m, 4096, 4096)["last_tile_row"] == -1, m
    # beta != 0: the rows two tiles share would be read after one of them wrote them.
    assert sm90(200, 4096, 4096, beta=1.0)["last_tile_row"] == -1
    # An M-major A read in place (its column stride a 16-byte multiple, so m - 128 rows are
    # too) moves with it.
    p = sm90(296, 4096, 4096, a_layout="col")
    assert p["a_mn_major"] and p["last_tile_row"] == 168
    # Swapped (C^T = W x^T): the kernel's rows are the weight's.
    p = sm90(16, 4100, 4096, b_layout="col")
    assert p["c_trans"] and p["last_tile_row"] == 4100 - 128
    assert sm90(144, 5120, 5120, b_layout="col")["last_tile_row"] == -1
    # 144 tokens through 4096 x 4096 run as given (given_narrow_fills_the_gpu): rows 16..143.
    assert sm90(144, 4096, 4096, b_layout="col")["last_tile_row"] == 16


def test_sm90_choices() -> None:
    big = sm90(4096, 4096, 4096)
    assert (big["tile_n"], big["splits"], big["workspace_bytes"]) == (256, 1, 0)
    assert not big["a_staged"] and not big["b_staged"] and not big["c_trans"]
    assert sm90(4096, 64, 4096)["tile_n"] == 64
    # tf32 with a row-major B runs as C^T = B^T A^T, reading both operands in place.
    tf32 = sm90(4096, 4096, 4096, dtype="float32", allow_tf32=True)
    assert tf32["c_trans"] and not tf32["a_staged"] and not tf32["b_staged"]


def test_sm90_workspace_is_staging_plus_partials() -> None:
    def copy_bytes(rows: int, length: int, es: int) -> int:
        pitch = -(-length * es // 16) * 16 // es
        return -(-rows * pitch * es // 256) * 256

    long_k = sm90(256, 256, 65536)
    assert long_k["splits"] > 1
    partial = -(-long_k["splits"] * 256 * 256 * 4 // 256) * 256
    assert long_k["workspace_bytes"] == partial
    odd = sm90(1000, 1000, 1000, offsets=(1, 0, 0))
    assert odd["a_staged"] and not odd["b_staged"] and odd["planned"]
    expect = copy_bytes(1000, 1000, 2)
    if odd["splits"] > 1:
        expect += -(-odd["splits"] * 1000 * 1000 * 4 // 256) * 256
    assert odd["workspace_bytes"] == expect


def test_sm90_every_supported_problem_has_a_plan_the_launcher_accepts() -> None:
    """Enumerates shapes x layouts x alignments x dtypes: whatever the planner supports, the
    staged problem has tensor maps (make_plan) and its split covers k."""
    count = 0
    for dtype, (m, n, k), al, bl, off in itertools.product(
            ["bfloat16", "float16", "float32"], SHAPES, LAYOUTS, LAYOUTS, OFFSETS):
        if 0 in (m, n, k):
            continue
        p = sm90(m, n, k, dtype=dtype, a_layout=al, b_layout=bl, offsets=off,
                 allow_tf32=dtype == "float32")
        if not p["supported"]:
            continue
        count += 1
        assert p["planned"], (dtype, m, n, k, al, bl, off)
        assert p["splits"] * p["kb_per_split"] >= p["k_blocks"]
        assert (p["splits"] - 1) * p["kb_per_split"] < p["k_blocks"]
        assert p["tile_n"] in ((64, 128, 256) if dtype == "float32" else (64, 128, 192, 256))
        assert sm90(m, n, k, dtype=dtype, a_layout=al, b_layout=bl, offsets=off,
                    allow_tf32=dtype == "float32") == p
    assert count > 100


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 2, 16, 64])
def test_sm90_decode_products_run_swapped(dtype: str, m: int) -> None:
    """x @ W.T with a few tokens runs as W x^T: the weight is the 128-row A, the tokens the
    narrow tile's columns, and a box only moves the tokens' own rows (rounded up to 8)."""
    p = sm90(m, 11008, 4096, dtype=dtype, b_layout="col")
    assert p["c_trans"] and p["tile_n"] == 64 and p["planned"]
    assert not p["a_mn_major"] and not p["b_mn_major"]
    rows = -(-m // 8) * 8
    assert (p["a_box_rows"], p["b_box_rows"]) == (128, rows)
    assert p["stage_tx_bytes"] == 128 * 128 + rows * 128


def test_sm90_swap_rule_limits() -> None:
    # 65-128 and 193 or more tokens, a narrow weight, or fp32: as given. (129-192 tokens run
    # swapped on the three-quarter tile: swap_for_batched_decode.)
    for m in (65, 128, 193, 256):
        assert not sm90(m, 11008, 4096, b_layout="col")["c_trans"], m
    for m in (129, 192):
        p = sm90(m, 11008, 4096, b_layout="col")
        assert p["c_trans"] and p["tile_n"] == 192, m
        assert not sm90(m, 256, 4096, b_layout="col")["c_trans"], m
    assert not sm90(16, 64, 4096, b_layout="col")["c_trans"]
    assert not sm90(16, 11008, 4096, dtype="float32", allow_tf32=True, b_layout="col")["c_trans"]
    # Where the product as given runs unsplit on narrow tiles that fill 84% of a wave or more
    # (4096 rows: 2 x 64 tiles on 132 SMs; 3584 rows: 2 x 56), it stays as given
    # (given_narrow_fills_the_gpu); 3072 rows (96 tiles) and a 5120 x 5120 weight (128-wide
    # tiles as given) still swap.
    for m in (129, 144, 192):
        for n, k, swaps in ((4096, 4096, False), (4096, 2048, False), (3584, 3584, False),
                            (3072, 4096, True), (5120, 5120, True)):
            p = sm90(m, n, k, b_layout="col")
            assert p["c_trans"] == swaps, (m, n, k)
            if not swaps:
                assert (p["tile_n"], p["splits"]) == (64, 1), (m, n, k)
    # On 160 SMs the same 128 tiles fill 0.8 of a wave: swapped.
    wide_gpu = _native.load().plan_sm90("bfloat16", 144, 4096, 4096, (4096, 1), (1, 4096), 4096,
                                        (0, 0, 0), 160)
    assert wide_gpu["c_trans"] and wide_gpu["tile_n"] == 192
    # The transposed 16-bit store does not apply an epilogue: a bias keeps the product as
    # given unless the swapped plan splits k (the reduction applies it), and as given it
    # takes a wider tile, whose staged store applies it, where an unsplit narrow one would not.
    for m, n, k in [(16, 32000, 4096), (16, 11008, 4096), (4, 4096, 14336), (128, 11008, 4096)]:
        p = sm90(m, n, k, b_layout="col", bias=True)
        assert p["supported"], (m, n, k)
        assert not p["c_trans"] or p["splits"] > 1, (m, n, k, p)
        assert p["tile_n"] in (128, 192, 256) or p["splits"] > 1, (m, n, k, p)


def test_gemv_prefetches_short_rows_on_hopper() -> None:
    """The row-dot gemv kernel has L2 prefetch the block 8 x 132 ahead where a block is
    16-bit rows of at most 16 KB, unsplit, of a matrix larger than 40 MiB, on sm_90+;
    nothing elsewhere."""
    def pf(dtype: str, n: int, k: int, cc_major: int = 9, **kw: Any) -> int:
        p = plan("gemv", dtype, 1, n, k, b_layout="col", cc_major=cc_major, **kw)
        assert p["supported"] and not p["colsweep"]
        return p["prefetch_blocks"]

    for n, k in [(8192, 8192), (11008, 4096), (128256, 4096), (28672, 8192), (16384, 2048)]:
        assert pf("bfloat16", n, k) == 8 * SMS, (n, k)
        assert pf("float16", n, k) == 8 * SMS, (n, k)
    # Longer blocks (a 14336 or 3584 row; four of 2056 elements), 32 MiB or less,
    # float32, pre-Hopper, a split row, rows not 16-byte aligned.
    for n, k in [(4096, 14336), (18944, 3584), (16384, 2056), (8192, 2048), (4096, 4096),
                 (4096, 1024)]:
        assert pf("bfloat16", n, k) == 0, (n, k)
    assert pf("float32", 16384, 2048) == 0
    assert pf("bfloat16", 8192, 8192, cc_major=8) == 0
    assert pf("bfloat16", 16, 1 << 20) == 0
    assert plan("gemv", "bfloat16", 1, 8192, 4096, b_layout="col", offsets=(1, 1, 0),
                cc_major=9)["prefetch_blocks"] == 0


def test_sm90_single_token_streams_weights_that_fill_waves() -> None:
    """m == 1: the narrow tile takes the weights from DRAM whose 128-row tiles fill their last
    wave of the 132 SMs to 80% or more; gemv keeps the rest (gemm_pick asks this)."""
    def takes(n: int, k: int, **kw: Any) -> bool:
        return bool(sm90(1, n, k, b_layout="col", **kw)["streams_single_row"])

    for n, k in [(14336, 4096), (13824, 5120), (16384, 6144), (32000, 4096), (28672, 8192),
                 (128256, 4096), (152064, 3584)]:
        assert takes(n, k), (n, k)
        assert takes(n, k, dtype="float16"), (n, k)
    # A second wave 12% / 9% full, fewer tiles than 80% of one wave, fewer than 8192 rows, a
    # weight L2 holds, a split plan, more than one token, an epilogue, tf32.
    for n, k in [(18944, 3584), (18432, 7168), (11008, 4096), (4096, 14336), (8192, 2048),
                 (2048, 8192), (5632, 2048)]:
        assert not takes(n, k), (n, k)
    assert not sm90(2, 14336, 4096, b_layout="col")["streams_single_row"]
    assert not takes(14336, 4096, bias=True)
    assert not takes(14336, 4096, dtype="float32", allow_tf32=True)
    # On fewer SMs the same weight makes other waves: 112 tiles on 100 SMs leave a second 12%.
    p = _native.load().plan_sm90("bfloat16", 1, 14336, 4096, (4096, 1), (1, 4096), 14336,
                                 (0, 0, 0), 100)
    assert not p["streams_single_row"]


def test_sm90_boxes_stop_at_the_operand() -> None:
    small_m = sm90(100, 4096, 4096)  # B row-major: MN-major boxes, not trimmed
    assert not small_m["c_trans"] and small_m["b_mn_major"]
    assert small_m["a_box_rows"] == 104
    assert small_m["stage_tx_bytes"] == 104 * 128 + small_m["tile_n"] * 128
    # The decode layout of the backward (g @ W, W row-major) swaps too: W becomes an
    # M-major A, read in place.
    grad_in = sm90(20, 4096, 4096)
    assert grad_in["c_trans"] and grad_in["a_mn_major"] and grad_in["b_box_rows"] == 24
    big = sm90(4096, 4096, 4096, b_layout="col")
    assert (big["a_box_rows"], big["b_box_rows"]) == (128, 128)
    assert big["stage_tx_bytes"] == 48 * 1024
    narrow = sm90(4096, 40, 4096, b_layout="col")
    assert narrow["tile_n"] == 64 and narrow["b_box_rows"] == 40
    assert narrow["stage_tx_bytes"] == 128 * 128 + 40 * 128
    # The medium tile loads B in two 64-row boxes (one per CTA of a pair), or MN-major in two
    # boxes of 64 columns.
    medium = sm90(4096, 4096, 4096, b_layout="col", tile_n=128)
    assert medium["tile_n"] == 128 and medium["b_box_rows"] == 64
    assert medium["stage_tx_bytes"] == 32 * 1024
    medium_mn = sm90(4096, 4096, 4096, tile_n=128)
    assert medium_mn["b_mn_major"] and medium_mn["stage_tx_bytes"] == 32 * 1024
    short_n = sm90(4096, 100, 4096, b_layout="col", tile_n=128)
    assert short_n["b_box_rows"] == 64 and short_n["stage_tx_bytes"] == 32 * 1024


def test_sm90_medium_tile_where_wide_tiles_fill_the_sms_unevenly() -> None:
    """512 tokens against an 11008-wide weight: 172 wide tiles are two waves on 132 SMs, the
    second a third full; medium tiles or a split fill them evenly. Square products that fill
    the SMs keep the wide tile, and any forced width is planned."""
    assert sm90(512, 11008, 4096, b_layout="col")["tile_n"] != 256 or \
        sm90(512, 11008, 4096, b_layout="col")["splits"] > 1
    for s in (4096, 8192):
        assert sm90(s, s, s)["tile_n"] == 256
    for bn in (64, 128, 192, 256):
        p = sm90(1000, 1000, 1000, tile_n=bn)
        assert p["tile_n"] == bn and p["planned"]
    # An epilogue stays on a tile whose store applies it.
    p = sm90(300, 4096, 4096, b_layout="col", bias=True)
    assert p["tile_n"] in (128, 192, 256) or p["splits"] > 1


def test_sm90_three_quarter_tile_for_uneven_waves_of_wide_tiles() -> None:
    """256 and 512 tokens against an 11008-wide weight: 86 and 172 wide tiles leave 46 SMs
    idle or the second of two waves a third full; 116 and 232 tiles of 128 x 192 come to one
    and two waves of three quarters of the wide tile's length. Its B loads are two boxes of
    96 rows (one per CTA of a pair), or three of 64 columns MN-major."""
    for m in (256, 512):
        for b_layout in ("col", "row"):
            for dtype in ("bfloat16", "float16"):
                p = sm90(m, 11008, 4096, dtype=dtype, b_layout=b_layout)
                assert (p["tile_n"], p["splits"], p["stream_k"]) == (192, 1, False), (m, p)
                assert p["planned"] and p["workspace_bytes"] == 0
                assert p["stage_tx_bytes"] == 128 * 128 + 192 * 128
                if b_layout == "col":
                    assert p["b_box_rows"] == 96
                # The fused epilogue is applied by its staged store.
                assert sm90(m, 11008, 4096, dtype=dtype, b_layout=b_layout,
                            bias=True)["tile_n"] == 192
    # Squares, 1024 tokens and more keep the wide tile (stream-k for 2048 x 11008), and so
    # do 512 tokens against a 14336-wide weight (224 wide tiles against 300 of 128 x 192).
    for m, n in [(4096, 4096), (8192, 8192), (1024, 11008), (2048, 11008), (8192, 11008),
                 (512, 14336)]:
        assert sm90(m, n, 4096, b_layout="col")["tile_n"] == 256, (m, n)
    # tf32 has no instances of it: never chosen, and a forced width falls back to the model's.
    tf32 = dict(dtype="float32", allow_tf32=True, b_layout="col")
    assert sm90(512, 11008, 4096, **tf32)["tile_n"] != 192
    assert sm90(1000, 1000, 1000, tile_n=192, **tf32)["tile_n"] != 192


def test_sm90_stream_k_evens_out_the_last_wave() -> None:
    """2048 tokens through a 4096 -> 11008 layer: 688 wide tiles are 5.2 waves on 132 SMs, so
    the last wave and the remainder are spread over all SMs by k-blocks (stream-k), with its
    workspace: a float32 wide tile and two flags per slot, one slot per SM. Products whose
    tiles come to whole waves, or to fewer than two waves, stay whole-tile."""
    p = sm90(2048, 11008, 4096, b_layout="col")
    assert (p["tile_n"], p["splits"], p["stream_k"]) == (256, 1, True)
    assert not p["stream_k_tail"]  # 5.2 waves: the last two are spread
    slots = SMS
    assert p["workspace_bytes"] == -(-(slots * 128 * 256 * 4 + slots * 2 * 4) // 256) * 256
    # An epilogue is applied by the tile's last piece, on the staged store.
    assert sm90(2048, 11008, 4096, b_layout="col", bias=True)["stream_k"]
    whole_waves = sm90(128 * SMS // 4, 1024, 4096)  # 4 x 33 = 132 wide tiles per wave
    assert not whole_waves["stream_k"] and whole_waves["workspace_bytes"] == 0
    assert not sm90(1000, 1000, 1000)["stream_k"]  # 32 wide tiles
    assert not sm90(4096, 4096, 4096)["stream_k"]  # 3.9 waves: nothing to gain
    for bn in (64, 128):
        assert not sm90(2048, 11008, 4096, b_layout="col", tile_n=bn)["stream_k"]


def test_sm90_stream_k_spreads_the_last_wave_alone_under_five_waves() -> None:
    """Between two and five waves of wide tiles, where stream-k runs, the whole waves run as
    tiles and the partial last wave alone is spread (2048 tokens through a 5120 -> 13824
    layer, 2.42 waves, 1024 through a 4096 -> 11008 one, 2.61), with the same workspace;
    from five waves on (2048 x 11008 x 4096, 5.2) the last two are spread, as before."""
    for m, n, k in [(2048, 5120, 13824), (2048, 5120, 27648), (1024, 11008, 4096),
                    (512, 28672, 8192), (1536, 7168, 18432)]:
        p = sm90(m, n, k, b_layout="col")
        assert (p["tile_n"], p["stream_k"], p["stream_k_tail"]) == (256, True, True), (m, n, k)
        assert p["workspace_bytes"] == sm90(2048, 11008, 4096, b_layout="col")["workspace_bytes"]
    for m, n, k in [(2048, 11008, 4096), (2048, 32000, 4096), (4096, 13824, 5120)]:
        p = sm90(m, n, k, b_layout="col")
        assert p["stream_k"] and not p["stream_k_tail"], (m, n, k)
    assert not sm90(4096, 4096, 4096)["stream_k_tail"]


def test_sm90_long_k_spreads_the_last_wave_alone_from_five_waves() -> None:
    """From five to 32 waves of wide tiles, a 16-bit product with 128 to 320 k-blocks (K of
    8192 to 20480) and a last wave 40% to 90% full spreads that wave alone: the 8192-token forward
    and grad_input products of 4096 <-> 11008 and 4096 <-> 14336 layers (7.8 waves), the
    2048-token ones of an 8192 <-> 28672 layer (13.6), grad_weight over 8192 tokens (10.4 and
    13.6), held-out 7168 <-> 18432 and 3584 <-> 18944 layers. Not with 64 k-blocks, K of 28672,
    a last wave under 40% full, more waves, or tf32."""
    tail = [(8192, 4096, 11008, "row", "col"), (8192, 4096, 11008, "row", "row"),
            (8192, 4096, 14336, "row", "col"), (8192, 4096, 14336, "row", "row"),
            (2048, 28672, 8192, "row", "col"), (2048, 28672, 8192, "row", "row"),
            (11008, 4096, 8192, "col", "row"), (4096, 11008, 8192, "col", "row"),
            (14336, 4096, 8192, "col", "row"), (4096, 7168, 18432, "row", "row"),
            (8192, 3584, 18944, "row", "col")]
    for m, n, k, a, b in tail:
        for dtype in ("bfloat16", "float16"):
            p = sm90(m, n, k, dtype=dtype, a_layout=a, b_layout=b)
            assert (p["tile_n"], p["splits"], p["stream_k"], p["stream_k_tail"]) == (
                256, 1, True, True), (m, n, k, a, b, dtype)
            assert p["workspace_bytes"] == sm90(2048, 11008, 4096, b_layout="col")[
                "workspace_bytes"]
    # 64 k-blocks (8192 x 11008 x 4096, 20.9 waves, 85% full), K of 28672 (7.8 waves), a last
    # wave 30% full (54.3 waves), 121 waves (a 128256-entry vocabulary's grad_weight), tf32.
    for m, n, k in [(8192, 11008, 4096), (8192, 4096, 28672), (8192, 28672, 8192),
                    (128256, 4096, 8192)]:
        assert not sm90(m, n, k, b_layout="col")["stream_k_tail"], (m, n, k)
    assert not sm90(8192, 4096, 11008, dtype="float32", allow_tf32=True,
                    b_layout="col")["stream_k_tail"]


def test_sm90_short_k_runs_ping_pong_medium_tiles() -> None:
    """A grad_weight g^T @ x over 320 to 512 tokens (5 to 8 k-blocks) runs on the ping-pong
    medium tile, which stores one tile while the other warpgroup computes; over 256 tokens
    or fewer (writing C bounds both tiles), from 768 tokens on, and with too few tiles for
    two each per SM, the cost model's choice stands."""
    for tokens in (320, 384, 512):
        for out_f, in_f in [(11008, 4096), (4096, 11008), (28672, 8192), (13824, 5120)]:
            for dtype in ("bfloat16", "float16"):
                p = sm90(out_f, in_f, tokens, dtype=dtype, a_layout="col")
                assert (p["tile_n"], p["splits"], p["stream_k"]) == (128, 1, False), (
                    tokens, out_f, in_f, dtype)
    for tokens in (128, 256, 768, 1024, 2048):
        assert sm90(11008, 4096, tokens, a_layout="col")["tile_n"] == 256, tokens
    # 4096 x 1024 x 512: 256 medium tiles, under two a CTA on 132 SMs.
    assert sm90(4096, 1024, 512, a_layout="col")["tile_n"] != 128
    # tf32 keeps the cost model.
    assert sm90(11008, 4096, 512, dtype="float32", allow_tf32=True, a_layout="col",
                )["tile_n"] == sm90(11008, 4096, 1024, dtype="float32", allow_tf32=True,
                                     a_layout="col")["tile_n"]


def test_sm90_stream_k_not_under_two_waves() -> None:
    """Under two waves of wide tiles stream-k would cut every tile: 512 tokens desync the two
    CTA pairs that share a weight column, and even 256 tokens (one pair per column, 86 tiles)
    streamed the weight slower from all 132 SMs than as whole tiles from 86 on H100."""
    for m in (128, 256, 512):
        for n in (11008, 14336):
            assert not sm90(m, n, 4096, b_layout="col")["stream_k"], (m, n)


def test_sm90_narrow_slices_stream_a_weight_for_one_row_of_tiles() -> None:
    # 65-128 tokens against a weight from DRAM that fits twice over in 64-wide tiles: the
    # narrow tile in two k-slices, so that every SM streams the weight.
    for m, n, k in [(128, 4096, 11008), (128, 4096, 14336), (65, 4096, 11008)]:
        p = sm90(m, n, k, b_layout="col")
        assert (p["tile_n"], p["splits"], p["c_trans"]) == (64, 2, False), (m, n, k, p)
        assert sm90(m, n, k, b_layout="col", bias=True)["splits"] == 2
    # Not with two rows of tiles, a weight that L2 holds, too many narrow tiles, or tf32.
    assert sm90(256, 4096, 11008, b_layout="col")["tile_n"] != 64
    assert not (sm90(128, 4096, 4096, b_layout="col")["tile_n"] == 64
                and sm90(128, 4096, 4096, b_layout="col")["splits"] == 2)
    assert sm90(128, 11008, 4096, b_layout="col")["tile_n"] == 128
    tf32 = sm90(128, 4096, 11008, dtype="float32", allow_tf32=True, b_layout="col")
    assert not (tf32["tile_n"] == 64 and tf32["splits"] == 2)


# ---- Plans from device properties ------------------------------------------------------------
# Devices as the CUDA runtime describes them (gemmt/device_info.h): tests/tune_evidence.py's.
H100, H200 = tune_evidence.H100, tune_evidence.H200
SNAPSHOT = Path(__file__).resolve().parent / "data" / "plan_snapshot_h100.json.xz"


@pytest.mark.parametrize("description", [H100, None], ids=["h100", "unknown"])
def test_h100_plans_match_the_snapshot(description: dict[str, int] | None) -> None:
    """Every decision of the three planners over the Linear-shaped sweep (tests/plan_sweep.py:
    28 layers of 2048-8192 hidden, 5632-28672 intermediate and 32000-152064 vocabulary sizes,
    26 token counts from 1 to 8192, forward / grad_input / grad_weight, bf16, fp16, fp32 and
    tf32, and an odd-layout grid) is the one the planners made before they read device
    properties, for an H100's description and for a device that reports none."""
    expected = plan_sweep.read(SNAPSHOT)
    got = plan_sweep.sweep(description)
    assert len(expected) > 10000 and got.keys() == expected.keys()
    # Rules added since the snapshot move their own class on purpose; each has its own test.
    later = plan_sweep.later_rule_records(description)
    # The two rules of before small_m_given_one_wave within the bound they always had; that rule
    # (33-64 tokens against weights of at most 64 x SMs rows) within one of its own.
    older = [rule for rule in later.values() if rule != "small_m_given_one_wave"]
    assert 50 < len(older) < 500
    assert 50 < len(later) - len(older) < 300
    moved = [f"{key}: {expected[key]} -> {got[key]}" for key in expected
             if got[key] != expected[key] and key not in later]
    assert not moved, f"{len(moved)} plans moved, e.g. " + "; ".join(moved[:3])
    # Each rule's records carry its decision: the swapped three-quarter tile, or narrow tiles in
    # k-slices.
    decision = {"swap_for_batched_decode": lambda p: p["c_trans"] and p["tile_n"] == 192,
                "narrow_split_search": lambda p: p["tile_n"] == 64 and p["splits"] > 1,
                "small_m_given_one_wave": lambda p: not p["c_trans"]}
    assert set(later.values()) <= set(decision)
    assert all(decision[rule](got[key]) for key, rule in later.items()), [
        (key, rule, got[key]) for key, rule in later.items() if not decision[rule](got[key])][:3]


@pytest.mark.parametrize("device_info", [H100, H200], ids=["h100", "h200"])
def test_batched_decode_stays_given_where_narrow_slices_fill_a_wave(device_info: dict[str, int]
                                                                    ) -> None:
    """160 tokens (swap_for_batched_decode's class): through 2048 x 4096 the narrow tiles as
    given, in two k-slices (128 units on 132 SMs), run instead of the swapped three-quarter tile
    (given_narrow_fills_the_gpu counts the slices); 4096 x 4096 stays as given unsplit (2 x 64
    tiles), and the weights whose given plan does not fill a wave swap."""
    def plan(n: int, k: int) -> tuple[bool, int, int]:
        p = sm90(160, n, k, b_layout="col", device_info=device_info)
        return p["c_trans"], p["tile_n"], p["splits"]

    assert plan(2048, 4096) == (False, 64, 2)
    assert plan(4096, 4096) == (False, 64, 1)
    for n, k in [(3072, 4096), (5120, 5120), (11008, 4096)]:
        transposed, tile_n, _ = plan(n, k)
        assert transposed and tile_n == 192, (n, k)


def test_h200_description_moves_the_bandwidth_bound_plans() -> None:
    """With 1.43x the H100's bandwidth: the DRAM model's rate and streaming share rise (0.48
    to 0.69 of the SMs must stream), so decode products of 1-64 tokens split the weight over
    more CTAs, and batched decode of 65-256 tokens, under the roofline's ridge, opens the
    split search (batched_decode_roofline). L2 size and clocks are the H100's: what depends
    on them alone does not move."""
    for m in (1, 16, 32):
        h100 = sm90(m, 4096, 4096, b_layout="col", device_info=H100)
        h200 = sm90(m, 4096, 4096, b_layout="col", device_info=H200)
        assert (h100["c_trans"], h100["tile_n"], h100["splits"]) == (True, 64, 2), m
        assert (h200["c_trans"], h200["tile_n"], h200["splits"]) == (True, 64, 3), m
        assert h200["workspace_bytes"] > h100["workspace_bytes"]
    # 33-64 tokens stay as given there (small_m_given_one_wave): 64 narrow tiles.
    for info in (H100, H200):
        p = sm90(64, 4096, 4096, b_layout="col", device_info=info)
        assert not p["c_trans"] and p["tile_n"] == 64
    # 8192 x 8192 weights: one slice on the H100, two on the H200.
    assert sm90(16, 8192, 8192, b_layout="col", device_info=H100)["splits"] == 1
    assert sm90(16, 8192, 8192, b_layout="col", device_info=H200)["splits"] == 2
    # Batched decode: 200 tokens against a 7168 -> 18432 weight (192 tiles of 128x192, more
    # than half of the SMs): the H100 keeps whole tiles, the H200 splits k in two; 129
    # tokens through a 5120 x 5120 weight run swapped on 40 three-quarter tiles
    # (swap_for_batched_decode), in 2 slices on the H100 and 3 on the H200.
    assert (sm90(200, 18432, 7168, b_layout="col", device_info=H100)["splits"]) == 1
    p = sm90(200, 18432, 7168, b_layout="col", device_info=H200)
    assert (p["tile_n"], p["splits"]) == (192, 2)
    for info, splits in ((H100, 2), (H200, 3)):
        q = sm90(129, 5120, 5120, b_layout="col", device_info=info)
        assert (q["c_trans"], q["tile_n"], q["splits"]) == (True, 192, splits)
    # The SIMT planner's copy of a K-major float32 B pays from fewer rows (82 / m at the
    # H100's ratio of FFMA to DRAM rate, 57 / m at the H200's).
    assert not plan("pipelined", "float32", 1280, 1280, 4096, b_layout="col",
                    device_info=H100)["staged_b"]
    assert plan("pipelined", "float32", 1280, 1280, 4096, b_layout="col",
                device_info=H200)["staged_b"]
    # Same L2: the one-token rule and gemv's prefetch are unchanged.
    for n, k in [(14336, 4096), (18944, 3584), (8192, 2048)]:
        assert (sm90(1, n, k, b_layout="col", device_info=H200)["streams_single_row"]
                == sm90(1, n, k, b_layout="col", device_info=H100)["streams_single_row"])
    assert plan("gemv", "bfloat16", 1, 8192, 8192, b_layout="col", cc_major=9,
                device_info=H200)["prefetch_blocks"] == 8 * SMS


def test_l2_size_sets_what_comes_from_dram() -> None:
    """A weight counts as streamed from DRAM above the same share of any GPU's L2 (40 MB of
    the H100's 50 MiB): with 256 MiB of L2 a 117 MB weight is L2's, with 25 MiB a 34 MB one
    is DRAM's. gemv's prefetch lead stays within a third of L2."""
    big_l2 = {**H100, "l2_bytes": 256 << 20}
    small_l2 = {**H100, "l2_bytes": 25 << 20}
    assert sm90(1, 14336, 4096, b_layout="col", device_info=H100)["streams_single_row"]
    assert not sm90(1, 14336, 4096, b_layout="col", device_info=big_l2)["streams_single_row"]
    # 128 tokens against a 4096 x 4096 weight (34 MB): L2's on an H100, DRAM's with 25 MiB,
    # where narrow_weight_stream takes it.
    assert sm90(128, 4096, 4096, b_layout="col", device_info=H100)["splits"] == 1
    p = sm90(128, 4096, 4096, b_layout="col", device_info=small_l2)
    assert (p["tile_n"], p["splits"]) == (64, 2)
    # gemv: 8 x 132 blocks of 16 KB (17 MB) ahead with 50 MiB; with 20 MiB a third of it holds
    # 3 blocks a SM; a 32 MB matrix is prefetched once L2 is too small to hold it.
    def lead(n: int, k: int, info: dict[str, int]) -> int:
        return plan("gemv", "bfloat16", 1, n, k, b_layout="col", cc_major=9,
                    device_info=info)["prefetch_blocks"]
    assert lead(8192, 8192, {**H100, "l2_bytes": 20 << 20}) == 3 * SMS
    assert lead(8192, 2048, H100) == 0
    assert lead(8192, 2048, {**H100, "l2_bytes": 20 << 20}) == 3 * SMS
    assert lead(8192, 8192, {**H100, "l2_bytes": 2 << 20}) == 0


def test_sm_clock_and_bandwidth_set_the_ridge() -> None:
    """batched_decode_roofline's class ends at the ridge, tokens = tensor-core FLOP rate over
    DRAM byte rate: 380 tokens on the H100 by the model's rates; with three times the
    bandwidth it falls to 127, below 200 tokens, and with half the SM clock too to 63."""
    def applies(m: int, info: dict[str, int]) -> bool:
        return _native.load().plan_rule_applies(
            "batched_decode_roofline", "bfloat16", m, 18432, 7168, (7168, 1), (1, 7168), 18432,
            (0, 0, 0), SMS, device_info=info)
    fast_dram = {**H100, "memory_clock_khz": 3 * H100["memory_clock_khz"]}
    assert applies(200, H100) and applies(256, H200)
    assert applies(120, fast_dram) and not applies(200, fast_dram)
    assert not applies(100, {**fast_dram, "sm_clock_khz": H100["sm_clock_khz"] // 2})


def test_device_info_is_checked() -> None:
    with pytest.raises(ValueError, match="unknown key 'l2'"):
        sm90(64, 4096, 4096, device_info={"l2": 1})
    with pytest.raises(ValueError, match="memory_bus_bits'\\] must be between 0 and 2\\^40"):
        plan("pipelined", "float32", 64, 64, 64, device_info={"memory_bus_bits": -1})
    with pytest.raises(ValueError, match="must fit in 32 bits"):
        _native.load().plan_decode("bfloat16", 8, 64, 64, (64, 1), (1, 64), 64, (0, 0, 0), SMS, 9,
                                   device_info={"sm_clock_khz": 1 << 33})
    # A clock without its bus width says nothing about bandwidth: the H100's is used.
    half = {"memory_clock_khz": H200["memory_clock_khz"]}
    assert sm90(16, 4096, 4096, b_layout="col", device_info=half) == sm90(
        16, 4096, 4096, b_layout="col", device_info=H100)


def test_plan_caches_tell_devices_apart() -> None:
    """The per-thread plan caches key on the device description: the same product asked for
    an H100, then an H200, then an H100 again gets each device's plan."""
    for _ in range(2):
        assert sm90(16, 4096, 4096, b_layout="col", device_info=H100)["splits"] == 2
        assert sm90(16, 4096, 4096, b_layout="col", device_info=H200)["splits"] == 3
    for _ in range(2):
        assert not plan("pipelined", "float32", 1280, 1280, 4096, b_layout="col", device=0,
                        device_info=H100)["staged_b"]
        assert plan("pipelined", "float32", 1280, 1280, 4096, b_layout="col", device=0,
                    device_info=H200)["staged_b"]


# ---- The rule table --------------------------------------------------------------------------
ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def test_rule_table_is_listed_in_the_architecture_doc() -> None:
    """docs/architecture.md's "Planner rules" list is the table in kernels/plan/plan_rules.cpp
    (regenerate it with `python tests/plan_sweep.py --rules`)."""
    rules = _native.load().plan_rules()
    text = ARCHITECTURE.read_text()
    begin, end = text.find(plan_sweep.RULES_BEGIN), text.find(plan_sweep.RULES_END)
    assert 0 <= begin < end, "docs/architecture.md lacks the planner-rules markers"
    listed = text[begin:end + len(plan_sweep.RULES_END)]
    assert listed == plan_sweep.rules_markdown(rules), (
        "docs/architecture.md's planner rules differ from kernels/plan/plan_rules.cpp; "
        "regenerate them with `python tests/plan_sweep.py --rules`")
    names = [r["name"] for r in rules]
    assert len(names) == len(set(names)) and all(r["shape_class"] and r["decision"] and
                                                 r["gain"] and r["results"] and r["tuner"]
                                                 for r in rules)
    assert [r["name"] for r in rules if not r["measured"]] == ["batched_decode_roofline"]


def applies(name: str, m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = "row",
            b_layout: str = "row", **kw: Any) -> bool:
    """Whether the product is in the named rule's class (plan_rule_applies)."""
    def strides(layout: str, rows: int, cols: int) -> tuple[int, int]:
        return {"row": (cols, 1), "col": (1, rows)}[layout]
    return _native.load().plan_rule_applies(name, dtype, m, n, k, strides(a_layout, m, k),
                                            strides(b_layout, k, n), n, (0, 0, 0), SMS, **kw)


def _sm90_rule(name: str, case: dict[str, Any], inside: bool) -> dict[str, Any]:
    """The Hopper plan of a rule test's case, checking that the rule's predicate says
    `inside` for it."""
    kw = {key: case[key] for key in case if key not in ("m", "n", "k")}
    assert applies(name, case["m"], case["n"], case["k"], **kw) == inside, (name, case)
    return sm90(case["m"], case["n"], case["k"], **kw)


# Each rule of the table: a product inside its class and one just outside, and the test of
# the plan's decision: (inside, outside, decided(plan) -> bool).
W_T = dict(b_layout="col")
RULE_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], Any]] = {
    "swap_for_small_m": (dict(m=64, n=11008, k=4096, **W_T), dict(m=65, n=11008, k=4096, **W_T),
                         lambda p: p["c_trans"]),
    "small_m_given_one_wave": (dict(m=48, n=4096, k=4096, **W_T), dict(m=32, n=4096, k=4096, **W_T),
                               lambda p: not p["c_trans"]),
    "swap_for_batched_decode": (dict(m=129, n=11008, k=4096, **W_T),
                                dict(m=193, n=11008, k=4096, **W_T),
                                lambda p: p["c_trans"] and p["tile_n"] == 192),
    "swap_for_tf32": (dict(m=4096, n=4096, k=4096, dtype="float32", allow_tf32=True),
                      dict(m=4096, n=64, k=4096, dtype="float32", allow_tf32=True),
                      lambda p: p["c_trans"]),
    "streams_single_row": (dict(m=1, n=14336, k=4096, **W_T), dict(m=1, n=8192, k=2048, **W_T),
                           lambda p: p["streams_single_row"]),
    "narrow_weight_stream": (dict(m=128, n=4096, k=11008, **W_T),
                             dict(m=129, n=4096, k=11008, **W_T),
                             lambda p: (p["tile_n"], p["splits"]) == (64, 2)),
    "narrow_split_search": (dict(m=128, n=2048, k=4096, device_info=H200, **W_T),
                            dict(m=128, n=4096, k=4096, device_info=H200, **W_T),
                            lambda p: (p["tile_n"], p["splits"] > 1) == (64, True)),
    "batched_decode_roofline": (
        dict(m=200, n=18432, k=7168, device_info=H200, **W_T),
        dict(m=257, n=18432, k=7168, device_info=H200, **W_T),
        lambda p: p["splits"] > 1 and -(-p["m"] // 128) * -(-p["n"] // p["tile_n"]) * 2 > SMS),
    "no_split_past_half_the_sms": (dict(m=2048, n=11008, k=4096, **W_T),
                                   dict(m=256, n=256, k=65536),
                                   lambda p: p["splits"] == 1),
    "stream_k_from_two_waves": (dict(m=2048, n=11008, k=4096, **W_T),
                                dict(m=8448, n=1024, k=4096),  # 264 tiles: whole waves
                                lambda p: p["stream_k"]),
    "stream_k_tail_only": (dict(m=1024, n=11008, k=4096, **W_T),
                           dict(m=2048, n=11008, k=4096, **W_T),  # 5.2 waves
                           lambda p: p["stream_k_tail"]),
    "long_k_last_wave": (dict(m=8192, n=4096, k=11008, **W_T),
                         dict(m=8192, n=11008, k=4096, **W_T),  # 64 k-blocks
                         lambda p: p["stream_k_tail"]),
    "short_k_ping_pong": (dict(m=11008, n=4096, k=512, a_layout="col"),
                          dict(m=11008, n=4096, k=576, a_layout="col"),  # 9 k-blocks
                          lambda p: p["tile_n"] == 128),
    "epilogue_takes_medium": (dict(m=128, n=4096, k=4096, bias=True),
                              dict(m=128, n=4096, k=4096),  # no epilogue: the narrow tile
                              lambda p: p["tile_n"] == 128),
}


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_sm90_rule_decides_inside_its_class_only(name: str) -> None:
    inside, outside, decided = RULE_CASES[name]
    for case, expect in ((inside, True), (outside, False)):
        p = _sm90_rule(name, case, expect)
        assert p["supported"], (name, case)
        p = {**p, "m": case["m"], "n": case["n"]}
        assert decided(p) == expect, (name, case, p)


def test_simt_rules_decide_inside_their_class_only() -> None:
    """The SIMT planner's rules: staging a K-major B (16-bit from 2048 rows; float32 where the
    copy's share is under the in-place penalty), the transposed float32 x @ W^T, split-k for
    few tiles and a long k, gemv's L2 prefetch and its warps per row."""
    def both(name: str, variant: str, dtype: str, m: int, n: int, k: int, **kw: Any
             ) -> tuple[bool, dict[str, Any]]:
        lay = {key: kw[key] for key in ("a_layout", "b_layout") if key in kw}
        return (applies(name, m, n, k, dtype=dtype, **lay),
                plan(variant, dtype, m, n, k, cc_major=9, **kw))

    inside, p = both("stage_k_major_b_16_bit", "pipelined", "bfloat16", 2048, 4096, 11008,
                     b_layout="col")
    assert inside and p["staged_b"]
    inside, p = both("stage_k_major_b_16_bit", "pipelined", "bfloat16", 2047, 4096, 11008,
                     b_layout="col")
    assert not inside and not p["staged_b"]
    inside, p = both("stage_k_major_b_float32", "pipelined", "float32", 1367, 1367, 4096,
                     b_layout="col")
    assert inside and p["staged_b"] and not p["swapped"]
    inside, p = both("stage_k_major_b_float32", "pipelined", "float32", 1366, 1366, 4096,
                     b_layout="col")
    assert not inside and not p["staged_b"]
    inside, p = both("swap_k_major_b", "pipelined", "float32", 512, 11008, 4096, b_layout="col")
    assert inside and p["swapped"]
    inside, p = both("swap_k_major_b", "pipelined", "float32", 512, 11008, 4096)
    assert not inside and not p["swapped"]
    inside, p = both("simt_split_k", "split_k", "float32", 256, 256, 4096)
    assert inside and p["wants_split_k"]
    inside, p = both("simt_split_k", "split_k", "float32", 256, 256, 4088)
    assert not inside and not p["wants_split_k"]
    inside, p = both("gemv_l2_prefetch", "gemv", "bfloat16", 1, 8192, 8192, b_layout="col")
    assert inside and p["prefetch_blocks"] == 8 * SMS
    inside, p = both("gemv_l2_prefetch", "gemv", "bfloat16", 1, 8192, 2048, b_layout="col")
    assert not inside and p["prefetch_blocks"] == 0  # 32 MB: L2's
    inside, p = both("gemv_warps_per_row", "gemv", "bfloat16", 1, 4096, 2048, b_layout="col")
    assert inside and p["rows_per_block"] == 4
    inside, p = both("gemv_warps_per_row", "gemv", "bfloat16", 1, 4096, 2040, b_layout="col")
    assert not inside and p["rows_per_block"] == 8


def test_every_rule_has_a_test() -> None:
    simt_tested = {"stage_k_major_b_16_bit", "stage_k_major_b_float32", "swap_k_major_b",
                   "simt_split_k", "gemv_l2_prefetch", "gemv_warps_per_row"}
    names = {r["name"] for r in _native.load().plan_rules()}
    assert names == set(RULE_CASES) | simt_tested
    with pytest.raises(ValueError, match="no planner rule named 'fast_path'"):
        applies("fast_path", 8, 8, 8)


# ---- The rule table against the tuner's measured winners -----------------------------------
# Each rule's class on the committed tune sweeps (benchmarks/results/h100_tune/, h200_tune/;
# tests/tune_evidence.py): (a) it decides none of the default plans there, (b) every winner
# where it decides keeps its decision, (c) every winner takes the plan without it (then the rule
# is to be retired and its class given the model's plan), (d) both. A results refresh that moves
# a rule to another class fails here: update the table's `tuner` entries (and this list) from
# `python tests/tune_evidence.py`, and retire a rule that lands in (c) on both GPUs.
TUNED_CLASSES = {
    "swap_for_small_m": "d", "small_m_given_one_wave": "d", "swap_for_batched_decode": "b",
    "swap_for_tf32": "a",
    "streams_single_row": "d",
    "narrow_weight_stream": "a", "narrow_split_search": "b", "batched_decode_roofline": "a",
    "no_split_past_half_the_sms": "b", "stream_k_from_two_waves": "b",
    "stream_k_tail_only": "a", "long_k_last_wave": "a", "short_k_ping_pong": "a",
    "epilogue_takes_medium": "a", "stage_k_major_b_16_bit": "a",
    "stage_k_major_b_float32": "a", "swap_k_major_b": "a", "simt_split_k": "a",
    "gemv_l2_prefetch": "a", "gemv_warps_per_row": "b",
}


def test_the_tuners_candidates_are_replayed_on_cpu() -> None:
    """The replay behind the rules' classes: at every point of both tune sweeps the candidate
    list rebuilt from the CPU plan bindings has as many schedules as the tuner timed (none was
    rejected or failed) and holds the winner, and the forced plans resolve."""
    count = 0
    for gpu in tune_evidence.GPUS:
        for p in tune_evidence.points(gpu):
            cands = tune_evidence.candidates(p)
            assert len(cands) == p.candidates, (str(p), cands)
            # A winner recorded as the forced form of what is now the default plan (a rule
            # added since the sweep moved the default onto it) is that default.
            assert p.winner in cands or (
                p.winner.startswith("wgmma:") and "wgmma" in cands
                and tune_evidence.resolve(p, p.winner) == tune_evidence.resolve(p, "wgmma")), (
                str(p), p.winner)
            assert tune_evidence.resolve(p, p.winner) is not None, (str(p), p.winner)
            count += 1
    assert count >= 100


def test_rule_table_states_the_tuners_winners() -> None:
    """Each rule's `tuner` entry starts with the class and counts the replayed sweeps give,
    and no rule is contradicted by the winners wherever it decides (class c)."""
    rules = _native.load().plan_rules()
    assert {r["name"] for r in rules} == set(TUNED_CLASSES)
    for r in rules:
        tallies = tune_evidence.tally(r["name"])
        cls = tune_evidence.classify(tallies)
        assert cls == TUNED_CLASSES[r["name"]], (r["name"], cls, tallies)
        assert cls != "c", f"{r['name']}: the tuner's winners take the plan without it everywhere"
        expected = tune_evidence.sentence(r["name"], tallies)
        assert r["tuner"].startswith(expected), (r["name"], r["tuner"], expected)
    # The mixed rules' evidence: as given won at 4 and 16 tokens through 5120 x 5120 on the H100,
    # and gemv won the one-token 4096 -> 128256 product there while the H200 kept the narrow tile.
    swap = tune_evidence.tally("swap_for_small_m")
    assert (swap["H100"].kept, swap["H100"].without) == (10, 4)
    single = tune_evidence.tally("streams_single_row")
    assert (single["H100"].without, single["H200"].kept) == (2, 4)


def test_sm90_plans_with_forced_schedules() -> None:
    """plan_sm90's splits and orient resolve the tuner's forced schedules as the launcher runs
    them (problem_with, split_plan_or_auto)."""
    auto = sm90(16, 11008, 4096, b_layout="col")
    assert auto["c_trans"]
    given = sm90(16, 11008, 4096, b_layout="col", orient=1)
    assert not given["c_trans"]
    assert sm90(16, 11008, 4096, b_layout="col", orient=2) == auto
    three = sm90(16, 11008, 4096, b_layout="col", splits=3)
    assert (three["c_trans"], three["splits"], three["kb_per_split"]) == (True, 3, 22)
    sk = sm90(2048, 4096, 4096, b_layout="col", tile_n=256, splits=-4)
    assert sk["stream_k"] and sk["stream_k_tail"] and sk["workspace_bytes"] > 0
    assert not sm90(2048, 4096, 4096, b_layout="col", tile_n=128, splits=-1)["stream_k"]
    with pytest.raises(ValueError, match="argument 'orient' expected 0"):
        sm90(16, 4096, 4096, orient=3)
    with pytest.raises(ValueError, match="argument 'splits' expected"):
        sm90(16, 4096, 4096, splits=-5)


def test_the_reference_device_is_the_h100_described_here() -> None:
    assert _native.load().reference_device_info() == H100


@pytest.mark.cuda
def test_device_info_reads_the_gpu_once_per_device() -> None:
    """On a GPU: what the wrapper fills GemmArgs::device with is plausible for a data-center
    GPU of this decade, the same from every thread and call, and plannable. (On the H100 the
    planners' constants were fitted on it equals the reference description; printed so that a
    run on another GPU records its description.)"""
    import torch

    lib = _native.load()
    for dev in range(torch.cuda.device_count()):
        info = lib.device_info(dev)
        print(f"device {dev} ({torch.cuda.get_device_name(dev)}): {info}")
        assert (1 << 20) <= info["l2_bytes"] <= (1 << 30), info
        bandwidth = 2e3 * info["memory_clock_khz"] * info["memory_bus_bits"] / 8
        assert 1e11 <= bandwidth <= 2e13, info
        assert 5e5 <= info["sm_clock_khz"] <= 5e6, info
        if "H100 80GB HBM3" in torch.cuda.get_device_name(dev):
            assert info == H100, info
        results: list[dict[str, int]] = []
        threads = [threading.Thread(target=lambda: results.append(lib.device_info(dev)))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [info] * 8
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        p = lib.plan_sm90("bfloat16", 16, 4096, 4096, (4096, 1), (1, 4096), 4096, (0, 0, 0), sms,
                          device_info=info)
        assert p["supported"] and p["c_trans"]
    with pytest.raises(ValueError, match="must be a CUDA device index"):
        lib.device_info(torch.cuda.device_count())


# ---- the grouped / scaled Hopper GEMM's planner (kernels/plan/grouped_plan.cpp) ----

@pytest.mark.parametrize("m,n,k,groups,split,tile", [
    (8192, 28672, 8192, 1, 0, 256),    # a large FP8 product fills the SMs with wide tiles
    (16, 8192, 8192, 1, 0, 128),       # decode: too few wide tiles, narrower ones stream B
    (4096, 128, 4096, 1, 0, 128),      # an output of 128 columns
    (64 * 256, 7168, 2048, 64, 1, 256),  # 64 experts of 256 tokens, 7168 wide
    (64 * 256, 2048, 7168, 64, 1, 256),  # the same 2048 wide: C staged, one CTA, 256 wide
    # Groups that stream their weights (at most 32 rows a group on average): each takes a
    # row of tiles, so the 256-wide tile's 32 KB stages fill the SMs (grouped_plan.h).
    (128 * 2, 768, 2048, 128, 1, 256),   # 128 experts of 2 tokens: 384 wide tiles
    (8 * 8, 28672, 4096, 8, 1, 256),     # Mixtral-like gate/up at decode (8 rows a group)
    (8 * 8, 4096, 14336, 8, 1, 256),     # its down product: 128 wide tiles, 97% of the SMs
    (4 * 8, 4096, 14336, 4, 1, 128),     # 4 experts: 64 wide tiles, half the SMs
    (60 * 8, 1408, 2048, 60, 1, 128),    # 1408 columns: 256-wide tiles compute 9% more
    (64 * 64, 1024, 2048, 64, 1, 128),   # 64 rows a group: counted as one product, 128 tiles
    (64 * 32, 2880, 2880, 64, 1, 256),   # 32 rows a group, 2880 columns (4% more at 256)
])
def test_grouped_plan_tile_width(m: int, n: int, k: int, groups: int, split: int,
                                 tile: int) -> None:
    plan = _native.load().plan_grouped(m, n, k, groups, split, 132)
    assert plan["tile_n"] == tile


@pytest.mark.parametrize("m,n,k,groups,split,per_sm,staged", [
    (128 * 256, 1536, 2048, 128, 1, 1, True),   # Qwen3-like gate/up: staged, one CTA
    (128 * 256, 2048, 768, 128, 1, 1, True),    # Qwen3-like down
    (64 * 128, 2048, 7168, 64, 1, 1, True),     # DeepSeek-V3-like
    (128 * 16, 768, 2048, 128, 1, 1, False),    # 16 rows a group: C from registers
    (128 * 32, 768, 2048, 128, 1, 1, False),    # 32 rows a group, the boundary
    (128 * 33, 768, 2048, 128, 1, 1, True),     # 33 rows a group
    (8 * 16, 14336, 4096, 8, 1, 1, False),      # Mixtral-like, 16 rows a group, N >= 4096
    (8 * 512, 28672, 4096, 8, 1, 1, True),      # Mixtral-like gate/up
    (2048, 4096, 16384, 8, 3, 1, True),         # weight gradient (split of K)
    (4096, 2048, 1024, 1, 0, 1, False),         # one dense product below N 4096: neither
    (4096, 8192, 1024, 1, 0, 1, True),          # one dense product of N >= 4096
])
def test_grouped_plan_ctas_and_epilogue(m: int, n: int, k: int, groups: int, split: int,
                                        per_sm: int, staged: bool) -> None:
    # The shape rules measured on an H200 (grouped_plan.h): C staged past 32 rows a group.
    plan = _native.load().plan_grouped(m, n, k, groups, split, 132)
    assert plan["ctas_per_sm"] == per_sm and plan["staged_c"] == staged


@pytest.mark.parametrize("m,n,groups,per_sm", [
    (128 * 256, 1536, 128, 2),   # more than 32 rows a group below N 4096: two CTAs
    (128 * 32, 768, 128, 1),     # at most 32 rows a group: one
    (8 * 512, 4096, 8, 1),       # N >= 4096: one
])
def test_grouped_plan_two_ctas_only_without_staged_c(m: int, n: int, groups: int,
                                                     per_sm: int) -> None:
    # Where C cannot be staged (a bias, an activation, a fused epilogue), two CTAs an SM
    # overlap one's register epilogue with the other's products; never beside staged stores.
    lib = _native.load()
    assert lib.plan_grouped(m, n, 2048, groups, 1, 132, c_stageable=False)["ctas_per_sm"] == per_sm
    assert lib.plan_grouped(m, n, 2048, groups, 1, 132)["ctas_per_sm"] == 1


@pytest.mark.parametrize("m,n,k,tile,block_tile", [
    (8192, 28672, 8192, 192, 192),  # 109 / 73 waves: 192 wide, 0.4% more area at 11/10 the rate
    (8192, 4096, 4096, 192, 192),   # 16 / 11 waves: 3% more area, at 11/10 the rate
    (4096, 4096, 4096, 192, 192),   # 8 / 5 1/3 rounds: the 192-wide tile's last cut in three
    (4096, 4096, 512, 128, 192),    # 8 / 6 rounds: too few k-blocks to cut the last round
    (8192, 6144, 4096, 192, 192),   # 32 columns of 192 fill their waves
    (8192, 8192, 8192, 192, 192),
    (256, 256, 4096, 192, 192),     # one round either way: the 192-wide one cut in four along K
])
def test_grouped_plan_promoted_fp8_tile(m: int, n: int, k: int, tile: int,
                                        block_tile: int) -> None:
    # Waves of CTA pairs times the width, the 192-wide tile at 11/10 of the rate (8/7 with
    # block scales): grouped_plan.h.
    plan = _native.load().plan_grouped(m, n, k, 1, 0, 132)
    assert plan["fp8_promoted_tile_n"] == tile
    assert plan["fp8_promoted_tile_n_block"] == block_tile


@pytest.mark.parametrize("m,n,groups,split,tile,block_tile", [
    (8192, 28672, 8, 1, 192, 192),   # 1024 rows an expert: 124 / 83 waves of lone CTAs
    (4096, 4096, 8, 0, 192, 192),    # a batch of 8: 63 / 43 waves
    (8192, 1536, 128, 1, 128, 128),  # 64 rows an expert: the weights stream, more tiles
    (8192, 256, 8, 1, 128, 128),     # 192 columns would waste a third of their second tile
])
def test_grouped_plan_promoted_fp8_group_tile(m: int, n: int, groups: int, split: int,
                                              tile: int, block_tile: int) -> None:
    # Groups on lone CTAs: 128 below 256 rows a group, else waves of the list's tiles at most
    # times the width, 192 at 11/10 the rate (8/7 with block scales): grouped_plan.h.
    plan = _native.load().plan_grouped(m, n, 4096, groups, split, 132)
    assert plan["fp8_group_tile_n"] == tile
    assert plan["fp8_group_tile_n_block"] == block_tile


@pytest.mark.parametrize("m,cluster,tile", [
    (1, 1, 128), (64, 1, 128), (128, 1, 128),  # a pair's second CTA would have no rows
    (129, 2, 192), (8192, 2, 192),             # pairs sharing B, the planner's promoted tile
])
def test_grouped_plan_fp8_cluster(m: int, cluster: int, tile: int) -> None:
    plan = _native.load().plan_grouped(m, 28672, 8192, 1, 0, 132)
    assert plan["fp8_cluster"] == cluster and plan["fp8_promoted_tile_n"] == tile


@pytest.mark.parametrize("m,n,k,rows", [
    (1, 28672, 8192, 64), (64, 4096, 4096, 64),  # at most 64 rows: 64-row stages, lone CTAs
    (200, 3072, 3072, 64),   # 96 tiles of 64 rows in one round; 128-row pairs would fill 48 SMs
    (100, 5120, 5120, 128),  # 65-128 rows: lone 128-row tiles cut along K
    (129, 3072, 3072, 64),   # 72 tiles of 64 rows, 48 of 128 rows in pairs
    (256, 4096, 8192, 64),   # 128 tiles of 64 rows still one round
    (200, 3584, 18944, 128),  # 148 k-blocks: 64-row tiles read too much of L2 a flop
    (384, 3072, 3072, 128),  # 144 tiles of 64 rows: two rounds
    (200, 18944, 3584, 128),  # 148 column blocks: the 128-row tiles already fill the SMs
    (8192, 4096, 4096, 128),
])
def test_grouped_plan_fp8_row_tile(m: int, n: int, k: int, rows: int) -> None:
    # grouped_plan.h: over 128 rows, 64-row tiles where one round of them holds every tile,
    # the 128-row tiles would fill less than half of the 132 SMs, and K is at most 8192.
    assert _native.load().plan_grouped(m, n, k, 1, 0, 132)["fp8_row_tile"] == rows


@pytest.mark.parametrize("m,cluster", [(1, 1), (64, 1), (65, 2), (128, 2), (129, 4), (256, 4)])
def test_grouped_plan_fp8_row_tile_cluster(m: int, cluster: int) -> None:
    # grouped_plan.h: 64-row tiles alone up to 64 rows, in pairs up to 128, in fours beyond.
    assert _native.load().plan_grouped(m, 3072, 3072, 1, 0, 132)["fp8_row_tile_cluster"] == cluster


@pytest.mark.parametrize("m,n,k,slices", [
    (64, 4096, 4096, 4),     # 32 tiles: four slices of 8 k-blocks on 128 SMs
    (128, 4096, 14336, 4),
    (64, 8192, 8192, 2),     # 64 tiles: two slices fill a wave
    (48, 6144, 4096, 2),     # 48 tiles: three would be measured slower
    (100, 1024, 1024, 1),    # 8 k-blocks: too few to cut
    (64, 14336, 4096, 1),    # 112 tiles nearly fill the SMs already
    (128, 28672, 8192, 1),   # two waves of tiles: the partials would cost more than they save
    (129, 4096, 4096, 1),    # CTA pairs, no slices
    (64, 4096, 256, 1),      # two k-blocks: too few to cut
])
def test_grouped_plan_fp8_k_slices(m: int, n: int, k: int, slices: int) -> None:
    assert _native.load().plan_grouped(m, n, k, 1, 0, 132)["fp8_k_slices"] == slices


def test_grouped_plan_fp8_k_slices_bounds() -> None:
    # At most 4 slices, each of at least 8 whole k-blocks, every unit in one wave; never beside
    # CTA pairs or groups.
    plan = _native.load().plan_grouped
    for m in (1, 33, 64, 128, 129, 4096):
        for n in (256, 1024, 4096, 6144, 14336, 28672):
            for k in (128, 512, 1000, 2048, 4096, 8192, 14336):
                s = plan(m, n, k, 1, 0, 132)["fp8_k_slices"]
                blocks, tiles = -(-k // 128), -(-m // 128) * -(-n // 128)
                assert 1 <= s <= 4
                assert s == 1 or (m <= 128 and blocks // s >= 8 and tiles * s <= 132)
                assert plan(m, n, k, 4, 0, 132)["fp8_k_slices"] == 1


@pytest.mark.parametrize("units,slots,k_blocks,slices", [
    (228, 66, 148, 2),     # 3000 x 3584 x 18944 on 192-wide pairs: 30 pairs left, two apiece
    (540, 66, 48, 4),      # 5120 x 5120 x 6144: 12 pairs left, four pieces of 12 k-blocks
    (66, 66, 64, 1),       # one round: nothing left over
    (60, 66, 148, 1),      # fewer units than CTAs, but more than half of them
    (19, 66, 148, 3),      # 200 x 3584 x 18944 on 192-wide pairs: one round, a third full
    (27, 66, 40, 2),       # 200 x 5120 x 5120
    (132, 66, 64, 1),      # whole rounds
    (100, 66, 64, 1),      # 34 left, more than half a round
    (140, 132, 7, 1),      # a piece would hold fewer than four k-blocks
    (140, 132, 11, 2),     # ... two pieces of at least four
    (30 * 132 + 10, 132, 64, 1),  # 31 rounds: a split would save under 3%
])
def test_fp8_tail_slices(units: int, slots: int, k_blocks: int, slices: int) -> None:
    assert _native.load().plan_fp8_tail_slices(units, slots, k_blocks) == slices


def test_fp8_tail_slices_bounds() -> None:
    # 1-4 pieces, each of at least four k-blocks; the pieces of the last round (all units
    # where they fill less than one) never need more CTAs than a round has.
    plan = _native.load().plan_fp8_tail_slices
    for slots in (33, 57, 66, 114, 132):
        for units in range(1, 6 * slots, 7):
            for k_blocks in (1, 4, 8, 16, 32, 148):
                s = plan(units, slots, k_blocks)
                assert 1 <= s <= 4
                assert s == 1 or (k_blocks // s >= 4 and (units % slots) * s <= slots)


def test_grouped_plan_tile_bound_covers_every_split() -> None:
    lib = _native.load()
    # Rows split over 64 groups: each group may add a partial tile row, plus the rows past
    # the last offset (written as zeros).
    plan = lib.plan_grouped(1000, 512, 256, 64, 1, 132)
    tn = -(-512 // plan["tile_n"])
    assert plan["max_tiles"] == (-(-1000 // 128) + 64 + 1) * tn
    # Contraction split: one full output per group.
    plan = lib.plan_grouped(256, 384, 5000, 8, 3, 132)
    assert plan["max_tiles"] == 8 * 2 * -(-384 // plan["tile_n"])
    # Nothing to write.
    assert lib.plan_grouped(0, 512, 256, 4, 1, 132)["max_tiles"] == 0


# ---- The float64 tensor-core kernel's CTA (kernels/plan/fp64_plan.cpp) --------------------------
def test_fp64_cta_width() -> None:
    """128 x 64 CTAs (two an SM) for the layouts without the swap at every size, and for the
    swapped form (row-major A and B) only where its 128 x 128 tiles would not fill the SMs."""
    plan = _native.load().plan_fp64
    for m, n in [(1, 1), (1000, 1000), (4096, 4096), (8192, 8192)]:
        assert plan(m, n, False, 132)["cta_width"] == 64
    assert plan(4096, 4096, True, 132)["cta_width"] == 128
    assert plan(1000, 1000, True, 132)["cta_width"] == 64
    # The boundary: 11 x 12 = 132 tiles fill 132 SMs, 11 x 11 = 121 do not; 108 SMs (an A100)
    # take the 121.
    assert plan(11 * 128, 12 * 128 - 1, True, 132)["cta_width"] == 128
    assert plan(11 * 128, 11 * 128, True, 132)["cta_width"] == 64
    assert plan(11 * 128, 11 * 128, True, 108)["cta_width"] == 128
    # Where one SM holds a single 128 x 64 CTA (shared memory short of two), always 128.
    for swap in (False, True):
        assert plan(1000, 1000, swap, 132, 1)["cta_width"] == 128


# ---- The Hopper FP8 decode kernel's split of K (kernels/plan/fp8_decode_plan.cpp) ----------------
def test_fp8_decode_split() -> None:
    """About one CTA an SM: the most CTAs along K that keep the grid within 1.25 CTAs an SM,
    at most 8 (a cluster), each with at least 4 k-blocks of 128."""
    split = _native.load().plan_fp8_decode_split
    # The weights of the H200 sweep (132 SMs) and the splits that ran fastest there.
    assert split(4096, 4096, 132) == 5      # 32 row blocks: 160 CTAs
    assert split(4096, 14336, 132) == 5
    assert split(8192, 8192, 132) == 2      # 64 row blocks: 128 CTAs, not 192
    assert split(14336, 4096, 132) == 1     # 112 CTAs, not 224
    assert split(28672, 8192, 132) == 1
    for n, k in [(4096, 4096), (6144, 4096), (8192, 8192), (4096, 14336), (1000, 4752)]:
        for sms in (78, 114, 132, 144):
            s = split(n, k, sms)
            rows = -(-n // 128)
            assert 1 <= s <= 8
            assert s == 1 or rows * s <= sms * 5 // 4
            assert s == 1 or (k + 127) // 128 >= 4 * s
    # Short K caps the split; a weight with more row blocks than SMs is never split.
    assert split(1024, 512, 132) == 1
    assert split(1024, 1024, 132) == 2
    assert split(40000, 8192, 132) == 1
    # The float8 form (use_fast_accum) within one CTA an SM: the splits that ran fastest for
    # it on the H200 (132 SMs).
    assert split(4096, 4096, 132, True) == 4     # 128 CTAs, not 160
    assert split(6144, 4096, 132, True) == 2     # 96, not 144
    assert split(4096, 14336, 132, True) == 4
    assert split(8192, 8192, 132, True) == 2
    assert split(14336, 4096, 132, True) == 1
    for n, k in [(4096, 4096), (6144, 4096), (8192, 8192), (4096, 14336), (1000, 4752)]:
        for sms in (78, 114, 132, 144):
            s = split(n, k, sms, True)
            assert 1 <= s <= split(n, k, sms)
            assert s == 1 or -(-n // 128) * s <= sms

