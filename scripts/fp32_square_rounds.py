"""Exact float32 squares against cuBLAS over many alternating rounds: the ratio's spread.

    python scripts/fp32_square_rounds.py [--rounds 15] [--sizes 1024 2048 ...] [--out DIR]

`python -m gemmt bench gemm` times each side over three rounds and keeps each side's best
round, which is the right summary of one record but says nothing about how far the ratio moves
when the card's clock and cuBLAS's own figure drift. This script times ``gemmt.gemm`` (auto)
and ``torch.matmul`` (``allow_tf32 = False``) on the same random operands in many rounds,
swapping which side goes first every round, and reports the median, lowest and highest of the
per-round ratios (cuBLAS time / gemmt time). Writes ``fp32_square_rounds_<gpu>_<date>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

import gemmt
from gemmt._timing import median_ms
from gemmt._report import environment, write as _write


def _rounds(m: int, rounds: int) -> dict[str, Any]:
    """Per-round gemmt and cuBLAS medians for one M = N = K problem."""
    a = torch.randn(m, m, device="cuda")
    b = torch.randn(m, m, device="cuda")
    c = torch.empty(m, m, device="cuda")
    ref_out = torch.empty(m, m, device="cuda")

    def ours() -> None:
        gemmt.gemm(c, a, b)

    def ref() -> None:
        torch.matmul(a, b, out=ref_out)

    ours_ms: list[float] = []
    ref_ms: list[float] = []
    for r in range(rounds):
        pair = [(ours, ours_ms), (ref, ref_ms)]
        for fn, sink in pair if r % 2 == 0 else reversed(pair):
            sink.append(median_ms(fn, "cuda", warmup=3, reps=20, budget_s=0.5))
    ratios = [rm / om for om, rm in zip(ours_ms, ref_ms)]
    flops = 2.0 * m * m * m
    return {
        "op": "gemm", "dtype": "float32", "m": m, "n": m, "k": m, "variant": "auto",
        "rounds": rounds,
        "ours_ms": statistics.median(ours_ms), "ref_ms": statistics.median(ref_ms),
        "tflops": flops / statistics.median(ours_ms) / 1e9,
        "ref_tflops": flops / statistics.median(ref_ms) / 1e9,
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
        "ratio_max": max(ratios), "ratios": ratios,
    }


def main(argv: list[str] | None = None) -> int:
    """Times every size, prints one line per size and writes the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 6144, 8192])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    env = environment()
    records = []
    print(f"{'size':>6} {'gemmt TF/s':>11} {'cuBLAS TF/s':>12} {'median':>7} {'min':>6} {'max':>6}")
    for m in args.sizes:
        rec = _rounds(m, args.rounds)
        records.append(rec)
        print(f"{m:>6} {rec['tflops']:>11.1f} {rec['ref_tflops']:>12.1f} "
              f"{rec['ratio_median']:>7.3f} {rec['ratio_min']:>6.3f} {rec['ratio_max']:>6.3f}")
    print(f"wrote {_write(args.out, 'fp32_square_rounds', env, records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
