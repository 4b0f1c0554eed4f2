"""``python -m gemmt bench tune``: the GEMM tuner against the untuned plans and cuBLAS.

Sections (``--sections``, comma separated; both by default):

* ``decode``: ``linear(x, W)`` for 1..256 tokens over weights of 16 MB to 1 GB, bf16 and
  fp16. Several copies of each weight (more bytes than three times the L2 cache) are used in
  turn, so every call streams its weight from HBM.
* ``prefill``: Linear forward products of Llama-style layers at 512, 2048 and 4096 tokens,
  bf16.

Each point is tuned once (its cost in seconds is recorded from ``gemmt.tuning_stats()``),
then three CUDA graphs of the same calls are timed in alternating rounds: the tuned plan,
the untuned (default) plan and torch's ``F.linear`` (cuBLAS). Ratios are torch time over
gemmt time (above 1: gemmt faster). The JSON also holds each point's winning plan and every
schedule the tuner timed for it (``timed``: name and us, the default first).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import gemmt
from gemmt import tuning
from gemmt._report import environment, write as _write
from gemmt._report import plot_ratios
from gemmt._report import progress as _progress
from gemmt._report import sections_of
from gemmt.bench_linear import L2_BYTES, _Replay

SECTIONS = ("decode", "prefill")
# (out_features, in_features): weights of 16 MB, 32 MB, 52 MB, 140 MB and 1 GB in 16 bits.
DECODE_WEIGHTS = [(2048, 4096), (4096, 4096), (5120, 5120), (13824, 5120), (128256, 4096)]
# 160 is in swap_for_batched_decode's class (129-192 tokens); --quick takes every other count.
DECODE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 100, 128, 160, 200, 256]
PREFILL_LAYERS = [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 14336), (14336, 4096)]
PREFILL_TOKENS = [512, 2048, 4096]


def _three_way(tuned: _Replay, untuned: _Replay, ref: _Replay, rounds: int) -> tuple[float, ...]:
    """Median ms of each, over alternating rounds (drift lands on all three alike)."""
    t, u, r = [], [], []
    for _ in range(rounds):
        t.append(tuned.ms())
        u.append(untuned.ms())
        r.append(ref.ms())
    return statistics.median(t), statistics.median(u), statistics.median(r)


def _point(section: str, x: torch.Tensor, ws: list[torch.Tensor], rounds: int) -> dict[str, Any]:
    before = len(gemmt.tuning_stats()["problems"])
    with gemmt.tune(True):
        tuned = _Replay([lambda w=w: gemmt.linear(x, w) for w in ws])  # tunes, then captures
    problems = gemmt.tuning_stats()["problems"][before:]
    with gemmt.tune(False):
        untuned = _Replay([lambda w=w: gemmt.linear(x, w) for w in ws])
    ref = _Replay([lambda w=w: F.linear(x, w) for w in ws])
    t_ms, u_ms, r_ms = _three_way(tuned, untuned, ref, rounds)
    with gemmt.tune(True):
        tuned_out = gemmt.linear(x, ws[0])
    with gemmt.tune(False):
        untuned_out = gemmt.linear(x, ws[0])
    diff = (tuned_out.double() - untuned_out.double()).norm().item()
    scale = max(untuned_out.double().norm().item(), 1e-30)
    return dict(section=section, dtype=str(x.dtype).replace("torch.", ""), tokens=x.shape[0],
                in_features=ws[0].shape[1], out_features=ws[0].shape[0], weight_copies=len(ws),
                tuned_us=t_ms * 1e3, untuned_us=u_ms * 1e3, cublas_us=r_ms * 1e3,
                tuned_vs_cublas=r_ms / t_ms, untuned_vs_cublas=r_ms / u_ms,
                tuned_vs_untuned=u_ms / t_ms,
                tuning_seconds=sum(p["seconds"] for p in problems),
                candidates=sum(p["candidates"] for p in problems),
                rejected=sum(p["rejected"] for p in problems),
                winner=problems[0]["winner"] if problems else None,
                timed=problems[0]["timed"] if problems else [],
                tuned_untuned_rel_diff=diff / scale)


def plot(doc: dict[str, Any], path: Path) -> None:
    """Tuned and untuned against cuBLAS at every point (weight, dtype, tokens)."""
    recs = doc["records"]
    labels = [f"{r['section'][:3]} {r['dtype'][:4]} {r['out_features']}x{r['in_features']} "
              f"m={r['tokens']}" for r in recs]
    plot_ratios(labels, {"tuned": [r["tuned_vs_cublas"] for r in recs],
                         "untuned": [r["untuned_vs_cublas"] for r in recs]},
                f"linear with the tuner, against cuBLAS, on {doc['environment']['device_name']}",
                path, ylabel="cuBLAS time / gemmt time")


def run_decode(quick: bool) -> list[dict[str, Any]]:
    weights = DECODE_WEIGHTS[::2] if quick else DECODE_WEIGHTS
    tokens = DECODE_TOKENS[::2] if quick else DECODE_TOKENS
    out = []
    for dtype in (torch.bfloat16, torch.float16):
        for fout, fin in _progress(weights, f"decode {dtype}"):
            wbytes = fin * fout * 2
            copies = max(2, math.ceil(3 * L2_BYTES / wbytes))
            ws = [(torch.randn(fout, fin, device="cuda") / math.sqrt(fin)).to(dtype)
                  for _ in range(copies)]
            for m in tokens:
                x = torch.randn(m, fin, device="cuda").to(dtype)
                out.append(_point("decode", x, ws, rounds=5))
            del ws
            torch.cuda.empty_cache()
    return out


def run_prefill(quick: bool) -> list[dict[str, Any]]:
    layers = PREFILL_LAYERS[:2] if quick else PREFILL_LAYERS
    out = []
    for fin, fout in _progress(layers, "prefill"):
        w = (torch.randn(fout, fin, device="cuda") / math.sqrt(fin)).to(torch.bfloat16)
        for m in PREFILL_TOKENS:
            x = torch.randn(m, fin, device="cuda").to(torch.bfloat16)
            out.append(_point("prefill", x, [w], rounds=5))
    return out


def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sec in SECTIONS:
        rs = [r for r in records if r["section"] == sec]
        if not rs:
            continue
        tuned = [r["tuned_vs_cublas"] for r in rs]
        untuned = [r["untuned_vs_cublas"] for r in rs]
        secs = [r["tuning_seconds"] for r in rs if r["winner"] is not None]
        out[sec] = dict(points=len(rs), tuned_min=min(tuned), tuned_median=statistics.median(tuned),
                        untuned_min=min(untuned), untuned_median=statistics.median(untuned),
                        tuned_below_1=sum(v < 1.0 for v in tuned),
                        untuned_below_0_97=sum(v < 0.97 for v in untuned),
                        tuning_seconds_per_shape_mean=statistics.mean(secs) if secs else 0.0,
                        tuning_seconds_per_shape_max=max(secs) if secs else 0.0,
                        tuning_seconds_total=sum(secs))
    return out


def run(out_dir: Path, quick: bool = False, sections: str = ",".join(SECTIONS)) -> int:
    """Entry point of ``python -m gemmt bench tune``."""
    wanted, known = sections_of(sections, SECTIONS)
    if not known:
        return 2
    env = environment()
    previous = gemmt.tuning_state()
    gemmt.clear_tuning_cache()
    gemmt.reset_tuning_stats()
    records: list[dict[str, Any]] = []
    try:
        if "decode" in wanted:
            records += run_decode(quick)
        if "prefill" in wanted:
            records += run_prefill(quick)
    finally:
        tuning._configure(previous["mode"], previous["cache"])
    summary = _summary(records)
    path = _write(out_dir, "tune", env, records, {"summary": summary})
    try:
        plot({"environment": env, "records": records}, path.with_suffix(".png"))
    except ImportError:
        print("matplotlib missing: no plot")
    for r in records:
        print(f"{r['section']:8s}{r['dtype']:9s}{r['in_features']:>7}{r['out_features']:>7}"
              f"{r['tokens']:>6}  tuned {r['tuned_us']:9.1f} us  untuned {r['untuned_us']:9.1f} us"
              f"  cuBLAS {r['cublas_us']:9.1f} us  tuned/cuBLAS {r['tuned_vs_cublas']:.3f}"
              f"  untuned/cuBLAS {r['untuned_vs_cublas']:.3f}  tuning {r['tuning_seconds']:.2f} s"
              f"  {r['winner']}")
    for sec, s in summary.items():
        print(f"summary {sec}: {s}")
    print(f"wrote {path}")
    return 0
