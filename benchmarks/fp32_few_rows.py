"""float32 products of few rows against long weights: gemmt against cuBLAS (TF32 off).

    python benchmarks/fp32_few_rows.py --out <folder> [--tag new] [--short-k]

For each weight (k x n from 1024 x 4096 to 4096 x 128256) and row count (2-48), times
``gemmt.gemm(c, x, W)`` and ``torch.matmul(x, W, out=c)`` with ``W`` row-major (``a @ W``,
layout ``kn``) and as the transpose of an n x k matrix (``x @ W.t()``, layout ``nk``): CUDA
events, warm-up, ``--rounds`` interleaved rounds of ``--reps`` calls each, medians; random
data. Each point also records the relative error against a float64 product. ``--short-k``
times short-k products with A row-major and column-major instead (the pipelined kernel's two
A loader modes).

Writes ``fp32_rows_<tag>.json`` (or ``fp32_short_k_<tag>.json``) under ``--out``. To compare
two builds, run it once per build (``GEMMT_LIBRARY`` names the module) with different tags.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import gemmt
from gemmt._bench_kit import interleaved_ms

WEIGHTS = [(4096, 4096), (4096, 11008), (11008, 4096), (2048, 8192), (5120, 5120),
           (14336, 4096), (1024, 4096), (28672, 4096), (128256, 4096)]  # (n, k)
ROWS = [2, 4, 8, 16, 24, 32, 48]
SHORT_K = [(3000, 5000, 700), (3000, 5000, 1024), (3000, 5000, 4096), (4096, 4096, 704),
           (2048, 8192, 512)]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error of got against a float64 want."""
    return ((got.double() - want).norm() / want.norm()).item()


def race(x: torch.Tensor, w: torch.Tensor, rounds: int, reps: int) -> dict[str, float]:
    """gemmt and torch on c = x @ w: times, their ratio (torch over gemmt) and gemmt's error."""
    c = torch.full((x.shape[0], w.shape[1]), float("nan"), device="cuda")
    gemmt.gemm(c, x, w)
    err = rel_err(c, x.double() @ w.double())
    t = interleaved_ms({"torch": lambda: torch.matmul(x, w, out=c),
                        "gemmt": lambda: gemmt.gemm(c, x, w)}, "cuda", rounds=rounds, reps=reps,
                       budget_s=float("inf"), queued=False)
    return {"torch_ms": t["torch"], "gemmt_ms": t["gemmt"], "ratio": t["torch"] / t["gemmt"],
            "rel_err": err}


def few_rows(rounds: int, reps: int) -> list[dict[str, object]]:
    """Every weight, layout and row count."""
    rows = []
    for n, k in WEIGHTS:
        for layout in ("kn", "nk"):
            w = (torch.randn(k, n, device="cuda") if layout == "kn"
                 else torch.randn(n, k, device="cuda").t())
            for m in ROWS:
                r = {"m": m, "n": n, "k": k, "layout": layout,
                     **race(torch.randn(m, k, device="cuda"), w, rounds, reps)}
                rows.append(r)
                print(json.dumps(r), flush=True)
    return rows


def short_k(rounds: int, reps: int) -> list[dict[str, object]]:
    """Short-k products with A row-major and column-major."""
    rows = []
    for m, n, k in SHORT_K:
        w = torch.randn(k, n, device="cuda")
        for a_layout in ("row", "col"):
            x = (torch.randn(m, k, device="cuda") if a_layout == "row"
                 else torch.randn(k, m, device="cuda").t())
            r = {"m": m, "n": n, "k": k, "a": a_layout, **race(x, w, rounds, reps)}
            rows.append(r)
            print(json.dumps(r), flush=True)
    return rows


def main() -> int:
    """Runs the sweep on the current GPU and writes its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the JSON")
    parser.add_argument("--tag", default="new", help="names the build in the file name")
    parser.add_argument("--short-k", action="store_true", help="the short-k A-layout check")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("fp32_few_rows: needs a CUDA device")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    rows = short_k(args.rounds, args.reps) if args.short_k else few_rows(args.rounds, args.reps)
    os.makedirs(args.out, exist_ok=True)
    name = f"fp32_{'short_k' if args.short_k else 'rows'}_{args.tag}.json"
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "gemmt": gemmt.build_info(), "tag": args.tag, "rows": rows}
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
