"""Baseline of the Linear-layer products before the Linear work: gemmt.mm on the views a
Linear layer uses against cuBLAS (torch.matmul on the same views), in the three training
layouts, plus the decode shapes with weights rotated past L2, and the cuBLAS kernel each
case runs (its name carries cuBLAS's tile and split choice).

python benchmarks/experiments/linear_baseline/explore.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import gemmt

LAYER_SHAPES = [(4096, 11008), (11008, 4096), (4096, 14336), (14336, 4096), (8192, 28672),
                (28672, 8192), (4096, 32000), (4096, 128256)]  # (in, out)
TOKENS = [512, 2048, 8192]
DECODE_M = [1, 2, 4, 8, 16, 32, 64, 128, 256]
DECODE_W = [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 1024), (4096, 14336),
            (4096, 32000)]  # (in, out)


def events_ms(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def paired(ours, ref, iters: int, rounds: int = 7) -> tuple[float, float]:
    for _ in range(3):
        ours(), ref()
    torch.cuda.synchronize()
    o, r = [], []
    for _ in range(rounds):
        o.append(events_ms(ours, iters))
        r.append(events_ms(ref, iters))
    return statistics.median(o), statistics.median(r)


def kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"][:4]


def operands(case: str, tokens: int, fin: int, fout: int, dtype):
    """(a, b) such that a @ b is the product of one training layout."""
    r = lambda *s: torch.randn(*s, device="cuda").to(dtype)  # noqa: E731
    if case == "fwd":      # x @ W.T
        return r(tokens, fin), r(fout, fin).t()
    if case == "dgrad":    # g @ W
        return r(tokens, fout), r(fout, fin)
    return r(tokens, fout).t(), r(tokens, fin)  # wgrad: g.T @ x


def prefill(dtypes, out: list) -> None:
    for dtype in dtypes:
        for fin, fout in LAYER_SHAPES:
            for tokens in TOKENS:
                for case in ("fwd", "dgrad", "wgrad"):
                    a, b = operands(case, tokens, fin, fout, dtype)
                    m, k, n = a.shape[0], a.shape[1], b.shape[1]
                    c1 = torch.empty(m, n, device="cuda", dtype=dtype)
                    c2 = torch.empty_like(c1)
                    ours = lambda: gemmt.gemm(c1, a, b)  # noqa: E731
                    ref = lambda: torch.matmul(a, b, out=c2)  # noqa: E731
                    flops = 2.0 * m * n * k
                    iters = max(3, min(50, int(2e12 / flops)))
                    to, tr = paired(ours, ref, iters)
                    err = ((c1.double() - c2.double()).norm() / c2.double().norm()).item()
                    rec = dict(dtype=str(dtype).split(".")[-1], fin=fin, fout=fout, tokens=tokens,
                               case=case, m=m, n=n, k=k, gemmt_ms=to, cublas_ms=tr,
                               ratio=tr / to, tflops_cublas=flops / tr / 1e9,
                               diff_vs_cublas=err, cublas_kernels=kernel_names(ref),
                               gemmt_kernels=kernel_names(ours))
                    out.append(rec)
                    print(f"{rec['dtype']:8s} {case:5s} in={fin:6d} out={fout:6d} T={tokens:5d} "
                          f"m={m:6d} n={n:6d} k={k:6d} gemmt {to*1e3:8.1f}us cublas "
                          f"{tr*1e3:8.1f}us ratio {tr/to:5.3f}  {rec['cublas_kernels'][0][:90]}",
                          flush=True)


def copy_bandwidth() -> float:
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = statistics.median(events_ms(lambda: dst.copy_(src), 5) for _ in range(9))
    return 2 * src.numel() * 4 / ms / 1e6  # GB/s, read + write


def decode(out: list, bw: float) -> None:
    dtype = torch.bfloat16
    for fin, fout in DECODE_W:
        wbytes = fin * fout * 2
        copies = max(2, -(-(200 << 20) // wbytes))
        ws = [torch.randn(fout, fin, device="cuda").to(dtype) for _ in range(copies)]
        for m in DECODE_M:
            x = torch.randn(m, fin, device="cuda").to(dtype)
            i = [0]

            def ours():
                w = ws[i[0] % copies]
                i[0] += 1
                return gemmt.mm(x, w.t())

            def ref():
                w = ws[i[0] % copies]
                i[0] += 1
                return torch.matmul(x, w.t())

            to, tr = paired(ours, ref, copies * 4)
            moved = wbytes + (m * fin + m * fout) * 2
            rec = dict(fin=fin, fout=fout, m=m, gemmt_us=to * 1e3, cublas_us=tr * 1e3,
                       ratio=tr / to, gemmt_bw_share=moved / to / 1e6 / bw,
                       cublas_bw_share=moved / tr / 1e6 / bw,
                       cublas_kernels=kernel_names(ref), gemmt_kernels=kernel_names(ours))
            out.append(rec)
            print(f"decode in={fin:6d} out={fout:6d} M={m:4d} gemmt {to*1e3:7.1f}us cublas "
                  f"{tr*1e3:7.1f}us ratio {tr/to:5.3f} bw gemmt {rec['gemmt_bw_share']:.2f} "
                  f"cublas {rec['cublas_bw_share']:.2f}  {rec['cublas_kernels'][:2]}", flush=True)
        del ws


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--fp16", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "gemmt": gemmt.build_info()}
    bw = copy_bandwidth()
    res["copy_gbps"] = bw
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    res["decode"] = []
    decode(res["decode"], bw)
    res["prefill"] = []
    prefill([torch.bfloat16] + ([torch.float16] if args.fp16 else []), res["prefill"])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "linear_baseline.json").write_text(json.dumps(res, indent=1))
    ratios = [r["ratio"] for r in res["prefill"]]
    print(f"prefill ratio median {statistics.median(ratios):.3f} min {min(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
