"""Batched decode (65-256 tokens): gemmt.linear against F.linear (cuBLAS), bf16 and fp16.

    python benchmarks/batched_decode.py --out <folder> [--tag after]

For each weight (out x in features, 16 MB to 1 GB in 16 bits) and token count, times
``gemmt.linear(x, W)`` and ``F.linear(x, W)`` as CUDA graphs of one call on each of several
copies of the weight (together three times L2, so every call streams its weight from DRAM):
``--rounds`` interleaved rounds, medians, random data. Each point also records both relative
errors against a float64 product. fp16 runs on two weights and four token counts.

Writes ``batched_decode_<tag>.json`` under ``--out``. To compare two builds, run it once per
build (``GEMMT_LIBRARY`` names the module) with different tags, alternating the builds; the
default plans alone are timed, since another schedule timed in the same rounds moves them.
``--ab NAME=VALUE`` (repeatable) adds, in the same rounds, gemmt captured with that
environment variable set (a launch knob read when the graph is captured), as ``ab_<VALUE>``;
``--weights 4096x4096,...`` and ``--tokens 136,200`` replace the bf16 sweep's points, and
``--fp16-same`` runs fp16 on them too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F

import gemmt
from gemmt._bench_kit import Replay
from gemmt._env import env_set

WEIGHTS = [(2048, 4096), (4096, 4096), (5120, 5120), (13824, 5120), (4096, 14336),
           (128256, 4096)]  # (out_features, in_features)
TOKENS = [65, 96, 128, 144, 160, 176, 192, 200, 224, 256]
FP16_WEIGHTS = [(4096, 4096), (13824, 5120)]
FP16_TOKENS = [96, 160, 200, 256]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error of got against a float64 want."""
    return ((got.double() - want).norm() / want.norm()).item()


def point(x: torch.Tensor, ws: list[torch.Tensor], rounds: int,
          ab: list[tuple[str, str]]) -> dict[str, float]:
    """gemmt and cuBLAS on x @ W^T over the weight copies: times, ratio, errors; each ``ab``
    knob as one more gemmt contender captured under it."""
    calls = [lambda w=w: gemmt.linear(x, w) for w in ws]
    reps = {"cublas": Replay([lambda w=w: F.linear(x, w) for w in ws]), "gemmt": Replay(calls)}
    for name, value in ab:
        with env_set({name: value}):
            reps[f"ab_{value}"] = Replay(calls)
    t: dict[str, list[float]] = {k: [] for k in reps}
    for _ in range(rounds):
        for k, r in reps.items():
            t[k].append(r.ms())
    us = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    ref = x.double() @ ws[0].double().t()
    out = {"gemmt_us": us["gemmt"], "cublas_us": us["cublas"],
           "ratio": us["cublas"] / us["gemmt"], "rel_err": rel_err(gemmt.linear(x, ws[0]), ref),
           "cublas_rel_err": rel_err(F.linear(x, ws[0]), ref)}
    for name, value in ab:
        with env_set({name: value}):
            out[f"ab_{value}_rel_err"] = rel_err(gemmt.linear(x, ws[0]), ref)
        out[f"ab_{value}_us"] = us[f"ab_{value}"]
        out[f"ab_{value}_ratio"] = us["cublas"] / us[f"ab_{value}"]
    return out


def sweep(rounds: int, ab: list[tuple[str, str]], bf16_weights: list[tuple[int, int]],
          bf16_tokens: list[int],
          fp16: tuple[list[tuple[int, int]], list[int]] = (FP16_WEIGHTS, FP16_TOKENS)
          ) -> list[dict[str, object]]:
    """Every weight and token count given (bf16), and the fp16 weights and tokens."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for dtype, weights, tokens in ((torch.bfloat16, bf16_weights, bf16_tokens),
                                   (torch.float16, *fp16)):
        for fout, fin in weights:
            copies = max(2, math.ceil(3 * l2 / (fout * fin * 2)))
            ws = [(torch.randn(fout, fin, device="cuda") / math.sqrt(fin)).to(dtype)
                  for _ in range(copies)]
            for m in tokens:
                x = torch.randn(m, fin, device="cuda").to(dtype)
                r = {"dtype": str(dtype).removeprefix("torch."), "out_features": fout,
                     "in_features": fin, "tokens": m, **point(x, ws, rounds, ab)}
                rows.append(r)
                print(json.dumps(r), flush=True)
            del ws
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    """Runs the sweep on the current GPU and writes its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the JSON")
    parser.add_argument("--tag", default="new", help="names the build in the file name")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ab", action="append", default=[], metavar="NAME=VALUE",
                        help="one more gemmt contender, captured with NAME=VALUE set")
    parser.add_argument("--weights", default="", help="out x in features, comma-separated")
    parser.add_argument("--tokens", default="", help="token counts, comma-separated")
    parser.add_argument("--fp16-same", action="store_true",
                        help="fp16 on the bf16 sweep's weights and tokens instead of its subset")
    args = parser.parse_args()
    ab = [tuple(a.split("=", 1)) for a in args.ab]
    weights = ([tuple(int(v) for v in w.split("x")) for w in args.weights.split(",")]
               if args.weights else WEIGHTS)
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else TOKENS
    if not torch.cuda.is_available():
        print("batched_decode: needs a CUDA device")
        return 1
    torch.manual_seed(0)
    fp16 = (weights, tokens) if args.fp16_same else (FP16_WEIGHTS, FP16_TOKENS)
    rows = sweep(args.rounds, ab, weights, tokens, fp16)
    os.makedirs(args.out, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "gemmt": gemmt.build_info(), "tag": args.tag,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "rounds": args.rounds, "ab": args.ab, "rows": rows}
    with open(os.path.join(args.out, f"batched_decode_{args.tag}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
