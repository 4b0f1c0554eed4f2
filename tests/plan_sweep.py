"""Every decision of the planners over a sweep of Linear-shaped products, as plain records.

tests/test_plan.py compares these records, for an H100 description, with a snapshot taken at
the commit before the planners read device properties (tests/data/plan_snapshot_h100.json.xz),
so that deriving the planners' constants from the device cannot move any H100 plan. The
records only use planner queries whose arguments that commit already had, plus `device_info`
when given, so the same code wrote the snapshot and checks it:

    git checkout <the base commit> -- kernels/plan pytorch_wrapper include
    cmake --build build/cpu-only -j1
    GEMMT_LIBRARY=$(ls build/cpu-only/_gemmt*.so) PYTHONPATH=python:tests \
        python tests/plan_sweep.py --write tests/data/plan_snapshot_h100.json.xz

(the snapshot in the tree was written that way from commit 3fbb105).
"""

from __future__ import annotations

import argparse
import itertools
import json
import lzma
from pathlib import Path
from typing import Any, Iterator

from gemmt import _native

SMS = 132
# The tiles the snapshot's planner had: the SIMT tiles added since (the 32-row "skinny") are
# left out of the table, which plans them as not compiled, so that the comparison stays one of
# device properties alone (test_plan.py tests the new tiles' choices).
OCCUPANCY = {"large": 2, "medium": 3, "small": 4, "fat": 1, "narrow": 3}
ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# Hidden sizes, (hidden, intermediate) MLP pairs and (hidden, vocabulary) heads of common
# decoder models, the benchmark's and held-out ones: 2048-8192 hidden, 5632-28672
# intermediate, 32000-152064 vocabulary.
HIDDEN = [2048, 3584, 4096, 5120, 6144, 7168, 8192]
MLP = [(2048, 5632), (3584, 18944), (4096, 11008), (4096, 14336), (5120, 13824),
       (6144, 16384), (7168, 18432), (8192, 28672)]
VOCAB = [(4096, 32000), (4096, 128256), (3584, 152064), (5120, 152064), (8192, 128256)]
TOKENS = [1, 2, 3, 4, 8, 16, 32, 48, 64, 65, 96, 100, 128, 129, 160, 192, 200, 256, 320, 384,
          512, 768, 1024, 2048, 4096, 8192]


def layers() -> list[tuple[int, int]]:
    """(in_features, out_features) of every layer of the sweep."""
    out = [(h, h) for h in HIDDEN]
    for h, i in MLP:
        out += [(h, i), (i, h)]
    out += VOCAB
    return out


def products() -> Iterator[tuple[str, int, int, int, str, str]]:
    """(pass, m, n, k, a_layout, b_layout) of the three products of each layer and token
    count: the forward x @ W^T, grad_input g @ W and grad_weight g^T @ x."""
    for (fin, fout), t in itertools.product(layers(), TOKENS):
        yield "fwd", t, fout, fin, "row", "col"
        yield "dgrad", t, fin, fout, "row", "row"
        yield "wgrad", fout, fin, t, "col", "row"


# Odd shapes, layouts and alignments (test_plan.py's grid): staging and in-place reads.
GRID_SHAPES = [(1, 300, 70), (300, 1, 70), (7, 9, 3), (64, 64, 64), (127, 255, 511),
               (1000, 1000, 1000), (256, 256, 65536), (4096, 64, 4096), (4096, 4096, 4096),
               (4097, 4097, 4097), (1024, 1024, 1024)]
GRID_LAYOUTS = ["row", "col", "strided"]
GRID_OFFSETS = [(0, 0, 0), (1, 1, 1)]


def _strides(layout: str, rows: int, cols: int) -> tuple[int, int]:
    return {"row": (cols, 1), "col": (1, rows), "strided": (2 * cols, 2)}[layout]


def _device_kw(device_info: dict[str, int] | None) -> dict[str, Any]:
    return {} if device_info is None else {"device_info": device_info}


def sm90_record(dtype: str, m: int, n: int, k: int, al: str, bl: str, bias: bool,
                device_info: dict[str, int] | None,
                offsets: tuple[int, int, int] = (0, 0, 0)) -> dict[str, Any]:
    """The Hopper planner's decisions for one product (tf32 when dtype is float32); offsets
    in elements."""
    es = ELEM_BYTES[dtype]
    p = _native.load().plan_sm90(
        dtype, m, n, k, _strides(al, m, k), _strides(bl, k, n), n,
        tuple(o * es for o in offsets), SMS,
        allow_tf32=dtype == "float32", bias=bias, **_device_kw(device_info))
    if not p["supported"]:
        return {"supported": False}
    keys = ("streams_single_row", "tile_n", "c_trans", "splits", "kb_per_split", "stream_k",
            "stream_k_tail", "a_staged", "b_staged", "workspace_bytes")
    return {key: p[key] for key in keys}


def simt_record(variant: str, dtype: str, m: int, n: int, k: int, al: str, bl: str,
                device_info: dict[str, int] | None,
                offsets: tuple[int, int, int] = (0, 0, 0)) -> dict[str, Any]:
    """The SIMT planner's decisions for one product; offsets in elements."""
    es = ELEM_BYTES[dtype]
    p = _native.load().plan_simt(
        variant, dtype, m, n, k, _strides(al, m, k), _strides(bl, k, n), n,
        tuple(o * es for o in offsets), SMS,
        OCCUPANCY, "", -1, 9, **_device_kw(device_info))
    keys = ["supported", "error", "wants_split_k", "splits", "workspace_bytes", "staged_b",
            "swapped", "stream_k_blocks", "stream_k_tiles"]
    if variant == "gemv":
        keys += ["colsweep", "rows_per_block", "p_per_split", "prefetch_blocks"]
    else:
        keys += ["tile", "interior", "k_per_split", "stream_k_iters", "stream_k_extra"]
    return {key: p.get(key) for key in keys}


def decode_record(dtype: str, m: int, n: int, k: int,
                  device_info: dict[str, int] | None) -> dict[str, Any]:
    """The decode kernel's plan for tokens (m x k) @ W^T (W: n x k)."""
    p = _native.load().plan_decode(dtype, m, n, k, (k, 1), (1, k), n, (0, 0, 0), SMS, 9,
                                   **_device_kw(device_info))
    return dict(sorted(p.items()))


def sweep(device_info: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """Every record of the sweep, keyed by a readable name of the query."""
    out: dict[str, dict[str, Any]] = {}
    for pas, m, n, k, al, bl in products():
        name = f"{pas} {m}x{n}x{k}"
        for dtype in ("bfloat16", "float16", "float32"):
            out[f"sm90 {dtype} {name}"] = sm90_record(dtype, m, n, k, al, bl, False, device_info)
        if pas == "fwd":
            out[f"sm90 bfloat16 bias {name}"] = sm90_record("bfloat16", m, n, k, al, bl, True,
                                                           device_info)
        out[f"simt pipelined float32 {name}"] = simt_record("pipelined", "float32", m, n, k,
                                                           al, bl, device_info)
        if -(-m // 128) * -(-n // 128) * 2 <= SMS and k >= 4096:
            out[f"simt split_k float32 {name}"] = simt_record("split_k", "float32", m, n, k,
                                                             al, bl, device_info)
        if m == 1:
            for dtype in ("bfloat16", "float32"):
                out[f"simt gemv {dtype} {name}"] = simt_record("gemv", dtype, m, n, k, al, bl,
                                                              device_info)
        if pas == "fwd" and m <= 64:
            out[f"decode bfloat16 {name}"] = decode_record("bfloat16", m, n, k, device_info)
    for (m, n, k), al, bl, off in itertools.product(GRID_SHAPES, GRID_LAYOUTS, GRID_LAYOUTS,
                                                    GRID_OFFSETS):
        name = f"grid {m}x{n}x{k} {al} {bl} {off}"
        for dtype in ("bfloat16", "float32"):
            out[f"sm90 {dtype} {name}"] = sm90_record(dtype, m, n, k, al, bl, False,
                                                      device_info, off)
        for variant in ("pipelined", "split_k") + (("gemv",) if 1 in (m, n) else ()):
            for dtype in ("float32", "float16"):
                out[f"simt {variant} {dtype} {name}"] = simt_record(
                    variant, dtype, m, n, k, al, bl, device_info, off)
    return out


# Hopper planner rules added after the snapshot, which move the plans of their own class:
# tests/test_plan.py leaves their records out of the comparison (and tests each rule).
LATER_SM90_RULES = ("swap_for_batched_decode", "narrow_split_search", "small_m_given_one_wave")


def later_rule_records(device_info: dict[str, int] | None = None) -> dict[str, str]:
    """The keys of the sm90 records of the sweep that a rule of LATER_SM90_RULES decides, each
    with the rule's name (the first of them that decides it)."""
    lib = _native.load()
    out: dict[str, str] = {}

    def decided(dtype: str, m: int, n: int, k: int, al: str, bl: str, bias: bool,
                off: tuple[int, int, int] = (0, 0, 0)) -> str | None:
        for rule in LATER_SM90_RULES:
            if lib.plan_rule_applies(rule, dtype, m, n, k, _strides(al, m, k), _strides(bl, k, n),
                                     n, off, SMS, bias=bias, **_device_kw(device_info)):
                return rule
        return None

    for pas, m, n, k, al, bl in products():
        name = f"{pas} {m}x{n}x{k}"
        for dtype in ("bfloat16", "float16"):
            rule = decided(dtype, m, n, k, al, bl, False)
            if rule:
                out[f"sm90 {dtype} {name}"] = rule
        rule = decided("bfloat16", m, n, k, al, bl, True) if pas == "fwd" else None
        if rule:
            out[f"sm90 bfloat16 bias {name}"] = rule
    for (m, n, k), al, bl, off in itertools.product(GRID_SHAPES, GRID_LAYOUTS, GRID_LAYOUTS,
                                                    GRID_OFFSETS):
        for dtype in ("bfloat16", "float32"):
            rule = decided(dtype, m, n, k, al, bl, False, off)
            if rule:
                out[f"sm90 {dtype} grid {m}x{n}x{k} {al} {bl} {off}"] = rule
    return out


def write(path: Path, records: dict[str, dict[str, Any]]) -> None:
    """The records as xz-compressed JSON, one record a line (sorted, so diffs stay local)."""
    lines = [json.dumps([key, records[key]], separators=(",", ":")) for key in sorted(records)]
    path.write_bytes(lzma.compress(("\n".join(lines) + "\n").encode(), preset=9))


def read(path: Path) -> dict[str, dict[str, Any]]:
    """The records of a file `write` made."""
    out: dict[str, dict[str, Any]] = {}
    for line in lzma.decompress(path.read_bytes()).decode().splitlines():
        key, rec = json.loads(line)
        out[key] = rec
    return out


RULES_BEGIN = "<!-- planner-rules: begin (generated by python tests/plan_sweep.py --rules) -->"
RULES_END = "<!-- planner-rules: end -->"


def rules_markdown(rules: list[dict[str, Any]]) -> str:
    """The rule table (the plan_rules binding) as the markdown docs/architecture.md holds
    between RULES_BEGIN and RULES_END."""
    lines = [RULES_BEGIN, "",
             "| Rule | Planner | Shape class | Decision | Why | Gain measured (H100) | Results "
             "| Device properties read | Status | Tuner's winners (h100_tune, h200_tune) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rules:
        cells = [f"`{r['name']}`", f"{r['planner']}: `{r['applied_in']}`", r["shape_class"],
                 r["decision"], r["reason"], r["gain"], r["results"], r["device"],
                 "measured" if r["measured"] else "**to be measured**", r["tuner"]]
        for c in cells:
            if "|" in c or "\n" in c:
                raise ValueError(f"rule {r['name']}: a cell holds '|' or a line break: {c!r}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", RULES_END]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="snapshot file to write")
    parser.add_argument("--rules", action="store_true",
                        help="print the rule table's markdown for docs/architecture.md")
    args = parser.parse_args()
    if args.rules:
        print(rules_markdown(_native.load().plan_rules()))
    if args.write is not None:
        records = sweep()
        write(args.write, records)
        print(f"{len(records)} records written to {args.write}")


if __name__ == "__main__":
    main()
