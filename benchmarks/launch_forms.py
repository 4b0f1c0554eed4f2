"""The grouped / scaled Hopper GEMM's launch forms against torch, in one process.

    python benchmarks/launch_forms.py grouped|fp8 --out <folder> [--form NAME:VAR=VALUE,...]
        [--only LAYOUT|SCALING] [--quick] [--fast-accum]

``grouped``: ``torch.ops.gemmt.grouped_mm`` against ``torch._grouped_mm`` on the shapes of
``python -m gemmt bench moe`` (Mixtral-, DBRX-, Qwen3- and DeepSeek-V3-like experts, 2-8192
rows a group, balanced and Zipf routing), forward, grad_input and grad_weight layouts.
``fp8``: ``gemmt.scaled_mm`` against ``torch._scaled_mm`` (e4m3, bf16 out, summed in float32;
both with the tensor cores' own accumulation under ``--fast-accum``) on the 21 Linear products
of ``python -m gemmt bench fp8 --quick``, tensorwise, rowwise and blockwise (``--only
blockwise_1x128`` adds the 1x128 x 128x1 pairing of the blockwise weight gradient). Each
point times torch, gemmt's planned launch and gemmt under each ``--form`` (its launch switches
set for the call: ``GEMMT_GROUPED_PER_SM``, ``GEMMT_GROUPED_TMA_STORE``, ``GEMMT_FP8_TILE``,
...) in interleaved rounds of CUDA events, random data, and records torch's time over each
(above 1: gemmt faster). Without ``--form`` the forms that decide the
planner's choices are timed. ``--quick`` takes the benchmarks' quick shapes; ``--heldout``
shapes neither benchmark times (other MoE models' experts, other Linear widths, token counts
that are not powers of two), to check that what holds on the benchmarks' shapes holds on the
class; ``--planned`` times the planned launch alone against torch.

Writes ``launch_forms_<suite>_<tag>.json`` under ``--out`` and prints each form's median and
worst ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
from typing import Any, Callable

import torch

import gemmt
from gemmt import _bench_kit as kit
from gemmt._env import env_set
from gemmt.bench_fp8 import LAYERS
from gemmt.bench_moe import GROUPED, QUICK_GROUPED, group_counts

# The forms the planner chooses between (grouped_plan.h), timed when no --form is given.
DEFAULT_FORMS = {
    "grouped": {"one_cta_staged": {"GEMMT_GROUPED_PER_SM": "1", "GEMMT_GROUPED_TMA_STORE": "1"},
                "one_cta_registers": {"GEMMT_GROUPED_PER_SM": "1",
                                      "GEMMT_GROUPED_TMA_STORE": "0"},
                "two_ctas": {"GEMMT_GROUPED_PER_SM": "2"},
                "tile128": {"GEMMT_GROUPED_TILE": "128"},
                "tile256": {"GEMMT_GROUPED_TILE": "256"}},
    "fp8": {"tile128_two_sets": {"GEMMT_FP8_TILE": "128"},
            "tile192_one_set": {"GEMMT_FP8_TILE": "192"}},
}
DEVICE = "cuda"
FP8_TOKENS = 8192
# Shapes the benchmarks do not time: (name, experts, hidden, intermediate, rows a group) of
# OLMoE-, Qwen2-MoE-, Mixtral-8x22B-, gpt-oss-20B- and DeepSeek-V2-Lite-like experts ...
HELDOUT_GROUPED = [
    ("olmoe", 64, 2048, 1024, [4, 64, 512]),
    ("qwen2_moe", 60, 2048, 1408, [8, 128, 1024]),
    ("mixtral_8x22b", 8, 6144, 16384, [64, 2048]),
    ("gpt_oss_20b", 32, 2880, 2880, [16, 256, 2048]),
    ("deepseek_v2_lite", 64, 2048, 1408, [32, 320]),
]
# ... and (out_features, in_features) of Qwen2.5-7B / 32B-, Mistral-Nemo- and Gemma-like Linear
# layers at token counts that are not powers of two (the weight gradient's K is the tokens:
# taken where it is a multiple of 16, of 128 with block scales).
HELDOUT_LAYERS = [(18944, 3584), (3584, 18944), (27648, 5120), (5120, 27648), (5120, 5120),
                  (14336, 5120), (3072, 3072)]
HELDOUT_TOKENS = [3000, 6144]
# blockwise_1x128: 1x128 scales on both operands along K, B's as 128x1 of (K, N) (the blockwise
# layer's weight gradient pairing); not in the default run.
FP8_MODES = {"tensorwise": ("tensor", "tensor"), "rowwise": ("row", "row"),
             "blockwise": ("block", "block_128x128"), "blockwise_1x128": ("block", "block")}
DEFAULT_FP8_MODES = ("tensorwise", "rowwise", "blockwise")


def parse_form(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:VAR=VALUE,VAR=VALUE`` as (NAME, {VAR: VALUE})."""
    name, _, assignments = text.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    if not name or not env:
        raise argparse.ArgumentTypeError(f"a form is NAME:VAR=VALUE[,VAR=VALUE], got {text!r}")
    return name, env


def under(env: dict[str, str], fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` called with the environment variables ``env`` set."""
    def run() -> object:
        with env_set(env):
            return fn()
    return run


def race(point: dict[str, Any], ours: Callable[[], object], theirs: Callable[[], object],
         forms: dict[str, dict[str, str]], rounds: int) -> dict[str, Any]:
    """One point: torch, the planned launch and each form, timed in the same rounds (a side
    that raises is left out, its ratio None and its error recorded)."""
    fns = {"torch": theirs, "planned": ours, **{n: under(e, ours) for n, e in forms.items()}}
    ms, errors = kit.time_candidates(fns, DEVICE, rounds=rounds, budget_s=1.5)
    ratios = {n: kit.ratio(ms["torch"], t) for n, t in ms.items() if n != "torch"}
    # The planned result against torch's (relative, Frobenius): a wrong answer shows here.
    diff = (kit.rel_diff(ours(), theirs()) if ms["planned"] is not None
            and ms["torch"] is not None else None)
    row = {**point, "torch_ms": ms["torch"], **ratios, "rel_diff_vs_torch": diff, "ms": ms,
           "errors": errors}
    print(row, flush=True)
    return row


def grouped_points(configs: list[tuple[str, int, int, int, list[int]]],
                   forms: dict[str, dict[str, str]], rounds: int,
                   only: list[str]) -> list[dict[str, Any]]:
    """The grouped suite's points (group sizes drawn as ``bench moe`` draws them), of the
    layouts in ``only`` (all where empty)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, experts, hidden, inter, tokens in configs:
        for tpe in tokens:
            for routing in ("balanced", "zipf"):
                counts = group_counts(experts, tpe, routing, gen)
                m = sum(counts)
                offs = torch.tensor(counts).cumsum(0).to(torch.int32).to(DEVICE)
                w = torch.randn(experts, inter, hidden, device=DEVICE,
                                dtype=torch.bfloat16) * hidden ** -0.5
                x = torch.randn(m, hidden, device=DEVICE, dtype=torch.bfloat16)
                g = torch.randn(m, inter, device=DEVICE, dtype=torch.bfloat16)
                for layout, a, b in (("forward", x, w.transpose(1, 2)), ("grad_input", g, w),
                                     ("grad_weight", g.t(), x)):
                    if only and layout not in only:
                        continue
                    point = {"config": name, "rows_a_group": tpe, "routing": routing,
                             "layout": layout}
                    rows.append(race(point,
                                     lambda a=a, b=b: torch.ops.gemmt.grouped_mm(a, b, offs),
                                     lambda a=a, b=b: torch._grouped_mm(a, b, offs),
                                     forms, rounds))
    return rows


def fp8_products(layers: list[tuple[int, int]], tokens: list[int], block_k: bool
                 ) -> list[tuple[str, tuple[int, int, int]]]:
    """(layout, (M, N, K)) of each layer's forward and backward products at each token count;
    the weight gradient's only where its K (the tokens) is a multiple of 16 (128 where
    ``block_k``)."""
    out = []
    for t in tokens:
        for n_out, k_in in layers:
            out += [("forward", (t, n_out, k_in)), ("grad_input", (t, k_in, n_out))]
            if t % (128 if block_k else 16) == 0:
                out.append(("grad_weight", (n_out, k_in, t)))
    return out


def fp8_points(forms: dict[str, dict[str, str]], rounds: int, only: list[str],
               fast_accum: bool = False, heldout: bool = False,
               tokens: list[int] | None = None) -> list[dict[str, Any]]:
    """The FP8 suite's points, operands quantised by ``quantize_fp8`` in each scaling of
    ``only`` (all where empty); both libraries asked for ``fast_accum``; ``tokens`` in place
    of the suite's token counts."""
    torch.manual_seed(0)
    rows = []
    layers, counts = (HELDOUT_LAYERS, HELDOUT_TOKENS) if heldout else (LAYERS, [FP8_TOKENS])
    tokens = tokens or counts
    for mode, (gran_a, gran_b) in FP8_MODES.items():
        if mode not in (only or DEFAULT_FP8_MODES):
            continue
        block_k = "block" in gran_a or "block" in gran_b
        for layout, (m, n, k) in fp8_products(layers, tokens, block_k):
            a, sa = gemmt.quantize_fp8(torch.randn(m, k, device=DEVICE), gran_a)
            wq, sw = gemmt.quantize_fp8(torch.randn(n, k, device=DEVICE), gran_b)
            b, sb = wq.t(), sw.t()
            point = {"mode": mode, "layout": layout, "m": m, "n": n, "k": k,
                     "use_fast_accum": fast_accum}
            rows.append(race(
                point,
                lambda a=a, b=b, sa=sa, sb=sb: gemmt.scaled_mm(
                    a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum),
                lambda a=a, b=b, sa=sa, sb=sb: torch._scaled_mm(
                    a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum),
                forms, rounds))
    return rows


def summary(rows: list[dict[str, Any]], key: str,
            names: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each contender's median and worst ratio over the points of each value of ``key`` (the
    grouped layouts, the FP8 scalings), and how many points it ran."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for value in dict.fromkeys(r[key] for r in rows):
        some = [r for r in rows if r[key] == value]
        out[value] = {}
        for n in names:
            got = [r[n] for r in some if r[n] is not None]
            out[value][n] = {"median": statistics.median(got) if got else None,
                             "worst": min(got) if got else None, "points": len(got)}
    return out


def main() -> int:
    """Runs one suite on the current GPU and writes its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(DEFAULT_FORMS))
    parser.add_argument("--out", required=True, help="folder for the JSON")
    parser.add_argument("--tag", default="new", help="names the run in the file name")
    parser.add_argument("--form", action="append", default=[], type=parse_form,
                        metavar="NAME:VAR=VALUE,...", help="one more gemmt contender")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="the quick grouped shapes")
    parser.add_argument("--heldout", action="store_true",
                        help="shapes the benchmarks do not time (HELDOUT_GROUPED / _LAYERS)")
    parser.add_argument("--tokens", type=lambda t: [int(v) for v in t.split(",")],
                        help="fp8: these token counts (comma separated) instead of the suite's")
    parser.add_argument("--planned", action="store_true",
                        help="the planned launch alone against torch (no forms)")
    parser.add_argument("--only", action="append", default=[], metavar="LAYOUT|SCALING",
                        help="only these grouped layouts / FP8 scalings (repeatable)")
    parser.add_argument("--fast-accum", action="store_true",
                        help="fp8: both libraries with the tensor cores' own accumulation")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("launch_forms: needs a CUDA device")
        return 1
    forms = {} if args.planned else dict(args.form) or DEFAULT_FORMS[args.suite]
    configs = HELDOUT_GROUPED if args.heldout else QUICK_GROUPED if args.quick else GROUPED
    rows = (grouped_points(configs, forms, args.rounds, args.only)
            if args.suite == "grouped"
            else fp8_points(forms, args.rounds, args.only, args.fast_accum, args.heldout,
                            args.tokens))
    names = ["planned", *forms]
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "gemmt": gemmt.build_info(), "suite": args.suite,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "rounds": args.rounds, "heldout": args.heldout, "forms": forms,
           "ratios": "torch time / gemmt time",
           "summary": summary(rows, "layout" if args.suite == "grouped" else "mode", names),
           "rows": rows}
    for group, by_name in doc["summary"].items():
        for name, s in by_name.items():
            print(f"{group} {name}: median {kit.fmt(s['median'])}, worst {kit.fmt(s['worst'])}"
                  f" over {s['points']} points")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"launch_forms_{args.suite}_{args.tag}.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
