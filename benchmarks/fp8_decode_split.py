"""FP8 products of few tokens: every split of K against the planner's.

    python benchmarks/fp8_decode_split.py --out <folder> [--tag run1] [--rounds 9]
        [--knob decode|gemm] [--scaling tensor|row] [--tokens 1,16,32] [--splits 0,1,2,3,4,5,6,8]
        [--ab NAME=VALUE[,NAME=VALUE]] ... [--fast-accum]

For each weight (out x in features, float8) and token count, times ``scaled_mm`` with each
split of K (0 is the planner's choice): with ``--knob decode`` the decode kernel's CTAs along K
(``GEMMT_FP8_DECODE_SPLIT``; 1-32 tokens) beside the Hopper scaled GEMM that takes the product
without a decode kernel (``GEMMT_FP8_DECODE=off``); with ``--knob gemm`` the scaled GEMM's
k-slices (``GEMMT_FP8_SPLITS``; 33-128 tokens). Also ``torch._scaled_mm`` and gemmt's bf16
product on the same weight, and with each ``--ab`` the planner's split under more settings of
the wrapper's (an A/B of a kernel form in the same process, timed as ``ab:<settings>``);
``--fast-accum`` runs gemmt's and torch's FP8 products with ``use_fast_accum=True``,
each as a CUDA graph of one call on each of several weight copies (together past twice the
L2, so every call streams its weight from memory), in interleaved rounds, medians. A device copy
of the same bytes gives the bandwidth the weight stream is held against. The profiler's
kernel durations of one plain call of each (the kernels alone, without the gaps between
them) separate a kernel's own time from what a stream of them costs.

Writes ``fp8_decode_split_<tag>.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
from pathlib import Path
from typing import Callable

import torch

import gemmt
from gemmt._bench_kit import Replay, gpu_busy_ms
from gemmt._env import env_set

WEIGHTS = [(4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (8192, 8192),
           (28672, 8192)]  # (out_features, in_features)
TOKENS = {"decode": [1, 16, 32], "gemm": [33, 48, 64, 96, 128]}
SPLITS = [0, 1, 2, 3, 4, 5, 6, 8]
KNOBS = {"decode": "GEMMT_FP8_DECODE_SPLIT", "gemm": "GEMMT_FP8_SPLITS"}
F8 = torch.float8_e4m3fn


def quantize(t: torch.Tensor, scaling: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 quantisation of a row-major matrix: (q, dequantisation scale), one scale or one
    a row ((rows, 1))."""
    amax = t.abs().amax() if scaling == "tensor" else t.abs().amax(1, keepdim=True)
    scale = amax.float().clamp(min=1e-12) / 448.0
    return (t.float() / scale).to(F8), scale


def with_env(calls: list[Callable[[], object]], env: dict[str, str]) -> Replay:
    """The calls captured with settings of the wrapper's (read per call) fixed."""
    with env_set(env):
        return Replay(calls)


def kernel_us(calls: list[Callable[[], object]]) -> list[float]:
    """Profiler durations (us) of the kernels of one plain call of each."""
    _, _, events = gpu_busy_ms(lambda: [c() for c in calls])
    return [float(ev["dur"]) for ev in events]


def point(n: int, k: int, m: int, ws: list[tuple[torch.Tensor, torch.Tensor]],
          wb: list[torch.Tensor], rounds: int, splits: list[int], knob: str,
          scaling: str, abs_: list[str], fast: bool = False) -> dict[str, object]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq, sx = quantize(x, scaling)
    gemmt_calls = [lambda q=q, s=s: torch.ops.gemmt.scaled_mm(xq, q.t(), sx, s.t(), None,
                                                               torch.bfloat16, "none", fast)
                   for q, s in ws]
    torch_calls = [lambda q=q, s=s: torch._scaled_mm(xq, q.t(), scale_a=sx, scale_b=s.t(),
                                                     out_dtype=torch.bfloat16,
                                                     use_fast_accum=fast)
                   for q, s in ws]
    bf16_calls = [lambda w=w: gemmt.mm(x, w.t()) for w in wb]
    # The scaled GEMM's k-slices are timed without the decode kernel, which would take 1-32
    # tokens.
    base = {"GEMMT_FP8_DECODE": "off"} if knob == "gemm" else {}
    reps: dict[str, Replay] = {
        f"split{s}": with_env(gemmt_calls, {**base, KNOBS[knob]: str(s)}) for s in splits}
    for ab in abs_:
        env = dict(item.split("=", 1) for item in ab.split(","))
        reps[f"ab:{ab}"] = with_env(gemmt_calls, {**base, **env})
    if knob == "decode":
        reps["scaled_gemm"] = with_env(gemmt_calls, {"GEMMT_FP8_DECODE": "off"})
    else:
        reps["default"] = Replay(gemmt_calls)  # the decode kernel where it takes the product
    reps["torch"] = Replay(torch_calls)
    reps["gemmt_bf16"] = Replay(bf16_calls)
    samples: dict[str, list[float]] = {name: [] for name in reps}
    for r in range(rounds):
        names = list(reps)
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            samples[name].append(reps[name].ms() * 1e3)
    us = {name: statistics.median(v) for name, v in samples.items()}
    want = (xq.double() * sx.double()) @ (ws[0][0].double() * ws[0][1].double()).t()
    got = torch.ops.gemmt.scaled_mm(xq, ws[0][0].t(), sx, ws[0][1].t(), None, torch.bfloat16,
                                    "none", fast)
    err = ((got.double() - want).norm() / want.norm()).item()
    best = min([s for s in splits if s > 0] or [0], key=lambda s: us[f"split{s}"])
    return {"out_features": n, "in_features": k, "tokens": m, "us": us,
            "best_split": best, "auto_over_best": us[f"split{best}"] / us["split0"],
            "auto_vs_torch": us["torch"] / us["split0"],
            "best_vs_torch": us["torch"] / us[f"split{best}"],
            "auto_vs_bf16": us["gemmt_bf16"] / us["split0"],
            "best_vs_bf16": us["gemmt_bf16"] / us[f"split{best}"],
            "auto_vs_scaled_gemm": us.get("scaled_gemm", us["split0"]) / us["split0"],
            "rel_err": err,
            "kernel_us_auto": kernel_us(gemmt_calls),
            "kernel_us_torch": kernel_us(torch_calls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="run")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--knob", choices=sorted(KNOBS), default="decode")
    ap.add_argument("--scaling", choices=["tensor", "row"], default="tensor")
    ap.add_argument("--ab", action="append", default=[],
                    help="NAME=VALUE[,NAME=VALUE]: also time the planner's split so (repeatable)")
    ap.add_argument("--fast-accum", action="store_true",
                    help="use_fast_accum=True for gemmt's and torch's FP8 products")
    ap.add_argument("--tokens", default=None, help="default: 1,16,32 (decode), 33-128 (gemm)")
    ap.add_argument("--splits", default=",".join(map(str, SPLITS)),
                    help="splits to time; 0 (the planner's) is always timed")
    args = ap.parse_args()
    tokens = ([int(t) for t in args.tokens.split(",")] if args.tokens else TOKENS[args.knob])
    splits = sorted({0, *(int(s) for s in args.splits.split(","))})
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    records = []
    src = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy = Replay([lambda: dst.copy_(src)])
    copy_gbps = 2 * src.numel() / statistics.median(copy.ms() for _ in range(9)) / 1e6
    del src, dst
    for n, k in WEIGHTS:
        copies = max(2, math.ceil(2 * l2 / (n * k)))
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16).mul_(k ** -0.5)
              for _ in range(copies)]
        ws = [quantize(w, args.scaling) for w in wb]
        for m in tokens:
            rec = point(n, k, m, ws, wb, args.rounds, splits, args.knob, args.scaling, args.ab,
                        args.fast_accum)
            rec["weight_copies"] = copies
            rec["auto_vs_copy"] = n * k / rec["us"]["split0"] / 1e3 / copy_gbps
            records.append(rec)
            print(f"{n}x{k} m={m}: " + " ".join(f"{a}={b:.1f}" for a, b in rec["us"].items())
                  + f" best={rec['best_split']} copy={rec['auto_vs_copy']:.3f}", flush=True)
        del wb, ws
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"device_name": props.name, "sm_count": props.multi_processor_count, "l2_bytes": l2,
           "torch_version": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "copy_gbps": copy_gbps, "knob": args.knob, "scaling": args.scaling, "ab": args.ab,
           "use_fast_accum": args.fast_accum,
           "splits": splits, "records": records}
    path = out / f"fp8_decode_split_{args.tag}.json"
    path.write_text(json.dumps(doc, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
