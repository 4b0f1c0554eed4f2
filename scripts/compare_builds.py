"""Times the 16-bit GEMM class in two builds of gemmt, alternating processes.

    python scripts/compare_builds.py --before <module.so> --after <module.so> --out <file.json>

Two builds cannot share a process (both register ``torch.ops.gemmt``), so each round starts
one process per build (``GEMMT_LIBRARY`` names the module), in alternating order. A process
times every point's ``gemmt.mm`` and ``torch.mm`` (cuBLAS) in interleaved rounds, as CUDA
graphs over copies of B that together exceed L2 where B is small, and checks gemmt's result
against a float64 product. The report gives, per point, the median time of each build over
the rounds, after / before, and each build's ratio to cuBLAS from its own processes.

The points cover what the Hopper kernel's plans reach: the four operand layouts of ``a @ b``
(nn, nt, tn, tt: B or A given as a transposed view) on products that take each tile width
(wide, medium, three-quarter, narrow), CTA pairs and stream-k, the swapped small-M and
batched-decode forms, and a fused bias + GELU epilogue.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from typing import Any

# (label, dtype name, m, n, k)
SHAPES = [
    ("wide-pairs", "bfloat16", 8192, 8192, 8192),
    ("training", "bfloat16", 2048, 11008, 4096),
    ("odd-square", "float16", 6000, 6000, 6000),
    ("short-k", "bfloat16", 4096, 4096, 1024),
    ("ping-pong", "bfloat16", 4096, 4096, 512),
    ("ping-pong", "float16", 8192, 4096, 384),
    ("prefill-odd-tokens", "bfloat16", 777, 4096, 4096),
    ("batched-decode", "bfloat16", 200, 4096, 4096),
    ("batched-decode", "float16", 160, 14336, 4096),
    ("small-m", "bfloat16", 32, 4096, 4096),
    ("narrow-n", "bfloat16", 4096, 64, 4096),
    ("tail-wave", "bfloat16", 1536, 5120, 5120),
]
LAYOUTS = ("nn", "nt", "tn", "tt")


def _operands(dtype: Any, m: int, n: int, k: int, layout: str, copies: int) -> tuple[Any, list[Any]]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)

    def make(rows: int, cols: int, transposed: bool) -> Any:
        if transposed:
            return torch.randn(cols, rows, device="cuda", dtype=dtype, generator=g).t()
        return torch.randn(rows, cols, device="cuda", dtype=dtype, generator=g)

    a = make(m, k, layout[0] == "t") / k**0.5
    bs = [make(k, n, layout[1] == "t") for _ in range(copies)]
    return a, bs


def _child(points: list[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    import torch

    import gemmt
    from gemmt._bench_kit import Replay, l2_bytes

    l2 = l2_bytes("cuda")
    out = []
    for pt in points:
        dtype = getattr(torch, pt["dtype"])
        m, n, k = pt["m"], pt["n"], pt["k"]
        b_bytes = k * n * dtype.itemsize
        copies = max(1, min(16, -(-3 * l2 // b_bytes))) if b_bytes < 3 * l2 else 1
        a, bs = _operands(dtype, m, n, k, pt["layout"], copies)
        bias = torch.randn(n, device="cuda", dtype=dtype) if pt["epilogue"] else None
        cs = [torch.empty(m, n, device="cuda", dtype=dtype) for _ in bs]

        def ours(b: Any, c: Any) -> Any:
            if bias is None:
                return gemmt.gemm(c, a, b)
            return gemmt.linear(a, b.t(), bias, "gelu_tanh")

        def ref(b: Any, c: Any) -> Any:
            if bias is None:
                return torch.mm(a, b, out=c)
            return torch.nn.functional.gelu(torch.addmm(bias, a, b), approximate="tanh")

        cs[0].fill_(float("nan"))
        got = ours(bs[0], cs[0])
        got = cs[0] if got is None else got
        want = a.double() @ bs[0].double()
        if bias is not None:
            want = torch.nn.functional.gelu(want + bias.double(), approximate="tanh")
        err = ((got.double() - want).norm() / want.norm()).item()
        mine = Replay([lambda b=b, c=c: ours(b, c) for b, c in zip(bs, cs)])
        theirs = Replay([lambda b=b, c=c: ref(b, c) for b, c in zip(bs, cs)])
        t_ours, t_ref = [], []
        for _ in range(rounds):
            t_ours.append(mine.ms())
            t_ref.append(theirs.ms())
        out.append({**pt, "gemmt_ms": statistics.median(t_ours),
                    "cublas_ms": statistics.median(t_ref), "rel_err": err})
        del mine, theirs, a, bs, cs
        torch.cuda.empty_cache()
    return out


def _points() -> list[dict[str, Any]]:
    pts = [{"label": lab, "dtype": dt, "m": m, "n": n, "k": k, "layout": lay, "epilogue": False}
           for lab, dt, m, n, k in SHAPES for lay in LAYOUTS]
    pts.append({"label": "bias-gelu", "dtype": "bfloat16", "m": 2048, "n": 4096, "k": 4096,
                "layout": "nt", "epilogue": True})
    return pts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="the first build's module (GEMMT_LIBRARY)")
    ap.add_argument("--after", help="the second build's module")
    ap.add_argument("--before-python", default=None,
                    help="the first build's gemmt package folder (its tree's python/)")
    ap.add_argument("--after-python", default=None, help="the same for the second build")
    ap.add_argument("--out", help="JSON report")
    ap.add_argument("--rounds", type=int, default=3, help="processes per build")
    ap.add_argument("--inner", type=int, default=9, help="timed rounds within a process")
    ap.add_argument("--only", default=None,
                    help="comma-separated labels of the points to time (default: all)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        points = json.loads(sys.stdin.read())
        json.dump(_child(points, args.inner), sys.stdout)
        return 0
    if not (args.before and args.after and args.out):
        ap.error("--before, --after and --out are required")
    points = _points()
    if args.only:
        wanted = set(args.only.split(","))
        points = [p for p in points if p["label"] in wanted]
    runs: dict[str, list[list[dict[str, Any]]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for name in order:
            env = dict(os.environ, GEMMT_LIBRARY=getattr(args, name))
            python_dir = getattr(args, f"{name}_python")
            if python_dir:
                env["PYTHONPATH"] = os.pathsep.join([python_dir, env.get("PYTHONPATH", "")])
            proc = subprocess.run([sys.executable, __file__, "--child", "--inner", str(args.inner)],
                                  input=json.dumps(points), capture_output=True, text=True,
                                  env=env, check=False)
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            runs[name].append(json.loads(proc.stdout))
            print(f"round {r + 1}: {name} done", file=sys.stderr)
    rows = []
    for i, pt in enumerate(points):
        row: dict[str, Any] = dict(pt)
        for name in runs:
            ms = [run[i]["gemmt_ms"] for run in runs[name]]
            ref = [run[i]["cublas_ms"] for run in runs[name]]
            row[f"{name}_ms"] = statistics.median(ms)
            row[f"{name}_vs_cublas"] = statistics.median(r / g for r, g in zip(ref, ms))
            row[f"{name}_rel_err"] = max(run[i]["rel_err"] for run in runs[name])
            row[f"{name}_runs"] = [{"gemmt_ms": run[i]["gemmt_ms"], "cublas_ms": run[i]["cublas_ms"]}
                                   for run in runs[name]]
        row["after_over_before_time"] = row["after_ms"] / row["before_ms"]
        rows.append(row)
        print(f"{pt['label']:>20} {pt['dtype']:>8} {pt['m']}x{pt['n']}x{pt['k']} {pt['layout']}"
              f"{' +gelu' if pt['epilogue'] else ''}: before {row['before_ms'] * 1e3:8.1f} us"
              f" ({row['before_vs_cublas']:.3f}) after {row['after_ms'] * 1e3:8.1f} us"
              f" ({row['after_vs_cublas']:.3f})  after/before {row['after_over_before_time']:.3f}"
              f"  err {row['after_rel_err']:.1e}")
    speed = [r["before_ms"] / r["after_ms"] for r in rows]
    summary = {"points": len(rows), "speed_after_over_before_median": statistics.median(speed),
               "min": min(speed), "max": max(speed)}
    print(json.dumps(summary))
    import torch  # only for the record of the environment

    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "date": datetime.date.today().isoformat(),
                   "summary": summary, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
