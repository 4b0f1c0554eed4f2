"""Benchmarks: the GEMM ladder and tensor-core paths against cuBLAS (``torch.matmul``), and
the memory-bound ops against the device-to-device copy bandwidth, measured in the same run.

Every time is the median of CUDA-event timings after warm-up, on random data. Results go to
``<out>/<suite>_<gpu>_<date>.json`` with a PNG plot beside, and a table on stdout.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

import gemmt
from gemmt import _native
from gemmt._report import environment, write as _write
from gemmt._report import plot_ratios
from gemmt._report import progress as _progress
from gemmt._timing import median_ms, per_call_us_many


def _paired_ms(ours: Callable[[], object], ref: Callable[[], object],
               rounds: int = 3) -> tuple[float, float]:
    """Median times of ``ours`` and ``ref`` measured in alternating rounds; each keeps its
    best round, so neither side pays for a cold cache or a clock ramp the other skipped."""
    o, r = [], []
    for _ in range(rounds):
        o.append(median_ms(ours, "cuda", warmup=5, reps=30, budget_s=1.0))
        r.append(median_ms(ref, "cuda", warmup=5, reps=30, budget_s=1.0))
    return min(o), min(r)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    d = ref.double()
    return ((out.double() - d).norm() / d.norm()).item()


# ---- GEMM ---------------------------------------------------------------------------------
FP32_LADDER = ["naive", "smem_tiled", "register_blocked", "warp_tiled", "pipelined", "auto"]
TC_VARIANTS = ["mma_sync", "wgmma", "auto"]
FP64_VARIANTS = ["dmma", "auto"]


def _operands(m: int, n: int, k: int, dtype: torch.dtype, layout: str):
    # float32 draws rounded to the dtype (float64 drawn in float64: full-precision operands).
    draw = torch.float64 if dtype == torch.float64 else torch.float32

    def mat(rows: int, cols: int, t: str) -> torch.Tensor:
        if t == "t":
            return torch.randn(cols, rows, device="cuda", dtype=draw).to(dtype).t()
        return torch.randn(rows, cols, device="cuda", dtype=draw).to(dtype)

    return mat(m, k, layout[0]), mat(k, n, layout[1])


def _gemm_cases(quick: bool) -> list[dict[str, Any]]:
    squares = [1024, 2048, 4096] if quick else [1024, 2048, 4096, 6144, 8192]
    awkward = [
        (4097, 4097, 4097, "nn"), (1000, 1000, 1000, "nn"), (127, 8192, 511, "nn"),
        (8192, 64, 8192, "nn"), (256, 256, 65536, "nn"), (1, 4096, 4096, "nn"),
        (4096, 1, 4096, "nn"), (4096, 4096, 4096, "tn"), (4096, 4096, 4096, "nt"),
        (4096, 4096, 4096, "tt"),
    ]
    if quick:
        awkward = awkward[:3]
    cases: list[dict[str, Any]] = []
    for s in squares:
        for v in FP32_LADDER:
            # The first rungs are far too slow to time at the largest sizes; they teach,
            # and 4096 shows the gap.
            if v in ("naive", "smem_tiled") and s > 4096:
                continue
            cases.append(dict(dtype="float32", m=s, n=s, k=s, layout="nn", variant=v))
    for m, n, k, lay in awkward:
        cases.append(dict(dtype="float32", m=m, n=n, k=k, layout=lay, variant="auto"))
    tc_sizes = [2048, 4096] if quick else [2048, 4096, 8192]
    for dt in ("bfloat16", "float16", "tf32"):
        for s in tc_sizes:
            for v in TC_VARIANTS:
                cases.append(dict(dtype=dt, m=s, n=s, k=s, layout="nn", variant=v))
        for m, n, k, lay in awkward:
            cases.append(dict(dtype=dt, m=m, n=n, k=k, layout=lay, variant="auto"))
    return cases + _fp64_cases(quick)


def _fp64_cases(quick: bool) -> list[dict[str, Any]]:
    """float64 against cuBLAS DGEMM: the squares (4096^3 is the reference point), the
    transposed layouts at 4096, an awkward shape, and the SIMT double kernel once."""
    cases: list[dict[str, Any]] = []
    for s in ([4096] if quick else [2048, 4096, 8192]):
        for v in FP64_VARIANTS:
            cases.append(dict(dtype="float64", m=s, n=s, k=s, layout="nn", variant=v))
    for lay in ("tn", "nt", "tt"):
        cases.append(dict(dtype="float64", m=4096, n=4096, k=4096, layout=lay, variant="auto"))
    cases.append(dict(dtype="float64", m=4097, n=4097, k=4097, layout="nn", variant="auto"))
    cases.append(dict(dtype="float64", m=2048, n=2048, k=2048, layout="nn", variant="simt_fp64"))
    return cases


def _run_gemm_case(case: dict[str, Any]) -> dict[str, Any]:
    dt = case["dtype"]
    tf32 = dt == "tf32"
    dtype = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16, "float64": torch.float64}[dt]
    torch.backends.cuda.matmul.allow_tf32 = tf32
    m, n, k = case["m"], case["n"], case["k"]
    a, b = _operands(m, n, k, dtype, case["layout"])
    c = torch.empty(m, n, device="cuda", dtype=dtype)
    rec = dict(case, op="gemm")
    try:
        c.fill_(float("nan"))  # every element must be written
        gemmt.gemm(c, a, b, variant=case["variant"])
        torch.cuda.synchronize()
        # Float64 reference on at most 512 evenly spaced rows (every row for small m).
        rows = torch.linspace(0, m - 1, min(m, 512), device="cuda").round().long().unique()
        ref = a[rows].double() @ b.double()
        rec["rel_err"] = _rel_err(c[rows], ref)
        rec["rel_err_rows_checked"] = int(rows.numel())
        rec["all_written"] = bool(not c.isnan().any().item())
        ours, ref_ms = _paired_ms(lambda: gemmt.gemm(c, a, b, variant=case["variant"]),
                                  lambda: torch.matmul(a, b, out=c))
    except RuntimeError as exc:
        rec.update(error=str(exc).splitlines()[0], ours_ms=None)
        ours = None
        ref_ms = median_ms(lambda: torch.matmul(a, b, out=c), "cuda", warmup=5, reps=30,
                           budget_s=1.0)
    flop = 2.0 * m * n * k
    rec.update(ours_ms=ours, ref_ms=ref_ms, ref_tflops=flop / ref_ms / 1e9)
    if ours is not None:
        rec.update(tflops=flop / ours / 1e9, ratio=ref_ms / ours)
    torch.backends.cuda.matmul.allow_tf32 = False
    return rec


# ---- memory-bound ops ---------------------------------------------------------------------
def _memory_cases(quick: bool) -> list[tuple[str, str, Callable[[], dict[str, Any]]]]:
    n = 1 << (26 if quick else 28)  # 2^28 float32 = 1 GiB per tensor
    cases: list[tuple[str, str, Callable[[], dict[str, Any]]]] = []

    def elementwise(op: str, dtype: torch.dtype) -> Callable[[], dict[str, Any]]:
        def make() -> dict[str, Any]:
            x = torch.randn(n, device="cuda").to(dtype)
            y = torch.randn(n, device="cuda").to(dtype)
            es = x.element_size()
            table = {
                "add": (lambda: gemmt.add(x, y), lambda: torch.add(x, y), 3 * es * n),
                "square": (lambda: gemmt.square(x), lambda: torch.square(x), 2 * es * n),
                "scale": (lambda: gemmt.scale(x, 2.0), lambda: x * 2.0, 2 * es * n),
                "square_backward": (lambda: torch.ops.gemmt.square_backward(y, x),
                                    lambda: y * (2 * x), 3 * es * n),
                # One pass against eager's two (silu, then the product).
                "swiglu": (lambda: gemmt.swiglu(x, y), lambda: F.silu(x) * y, 3 * es * n),
            }
            ours, ref, nbytes = table[op]
            # Bit-exact ops only: square_backward and swiglu round differently from eager.
            exact = torch.equal(ours(), ref()) if op in ("add", "square", "scale") else None
            return dict(ours=ours, ref=ref, bytes=nbytes, numel=n, shape=[n], exact=exact)

        return make

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for op in ("add", "square", "scale", "square_backward", "swiglu"):
            cases.append((op, str(dtype).replace("torch.", ""), elementwise(op, dtype)))

    def gray() -> dict[str, Any]:
        h, w = (8192, 8192) if quick else (16384, 16384)
        img = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device="cuda")

        def ref() -> torch.Tensor:
            r, g, b = img[..., 0], img[..., 1], img[..., 2]
            return (0.299 * r + 0.587 * g + 0.114 * b).round().to(torch.uint8)

        diff = (gemmt.rgb_to_gray(img).int() - ref().int()).abs().max().item()
        return dict(ours=lambda: gemmt.rgb_to_gray(img), ref=ref, bytes=4 * h * w,
                    numel=h * w, shape=[h, w, 3], max_abs_diff_vs_torch=diff)

    def volume() -> dict[str, Any]:
        shape = (128, 512, 1024) if quick else (512, 512, 1024)
        vol = torch.randint(0, 65536, shape, dtype=torch.int32, device="cuda").to(torch.uint16)
        ours, ref = (lambda: gemmt.normalize_volume(vol, 4095.0)), (lambda: vol.float() / 4095.0)
        numel = vol.numel()
        # Correctly rounded (torch's CUDA kernel multiplies by 1/max_val instead).
        exact = torch.equal(ours(), (vol.double() / 4095.0).float())
        return dict(ours=ours, ref=ref, bytes=6 * numel, numel=numel, shape=list(shape),
                    exact=exact)

    cases.append(("rgb_to_gray", "uint8", gray))
    cases.append(("normalize_volume", "uint16", volume))
    return cases


def _copy_gbps(nbytes: int) -> float:
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), "cuda", warmup=5, reps=50, budget_s=2.0)
    return 2 * nbytes / ms / 1e6


def _small_call_overhead() -> dict[str, Any]:
    """Host time per call of 1-element ops, and where it goes.

    ``ours_us`` / ``ref_us`` compare ``torch.ops.gemmt.add`` with ``torch.add``. The
    breakdown times the same 1-element add through every entry point, including
    ``torch.ops.aten.add.Tensor``, which takes PyTorch's own add through the same Python
    ``torch.ops`` call path as a custom op: the difference between it and ``torch.add`` is
    the cost of that path alone.
    """
    x, y = torch.randn(1, device="cuda"), torch.randn(1, device="cuda")
    native = _native.load()
    paths: dict[str, Any] = {
        "torch.add": lambda: torch.add(x, y),
        "torch.ops.aten.add.Tensor": lambda: torch.ops.aten.add.Tensor(x, y),
        "torch.ops.gemmt.add": lambda: torch.ops.gemmt.add(x, y),
        "torch.ops.gemmt.add.default": lambda: torch.ops.gemmt.add.default(x, y),
        "gemmt.add": lambda: gemmt.add(x, y),
        "gemmt._gemmt.add (pybind)": lambda: native.add(x, y),
        "torch.square": lambda: torch.square(x),
        "torch.ops.gemmt.square": lambda: torch.ops.gemmt.square(x),
    }
    breakdown = per_call_us_many(paths, "cuda")
    ours, ref = breakdown["torch.ops.gemmt.add"], breakdown["torch.add"]
    return dict(op="add", dtype="float32", numel=1, ours_us=ours, ref_us=ref, ratio=ours / ref,
                breakdown_us=breakdown,
                note="host time per call, back-to-back calls, 1-element tensors")


# ---- driver -------------------------------------------------------------------------------
def _plot_gemm(records: list[dict[str, Any]], path: Path) -> None:
    """TFLOP/s against size for every variant and cuBLAS (one panel per dtype), and the
    ratio to cuBLAS of ``auto`` on the awkward shapes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = ["float32", "bfloat16", "float16", "tf32"]
    fig, axes = plt.subplots(1, 5, figsize=(28, 5))
    for ax, dt in zip(axes, dtypes):
        # The ladder sizes: squares timed with more than the auto variant (1000^3 and
        # 4097^3 belong to the awkward shapes, panel 5).
        ladder = {r["m"] for r in records if r["dtype"] == dt and r["variant"] != "auto"}
        sq = [r for r in records if r["dtype"] == dt and r["m"] == r["n"] == r["k"]
              and r["m"] in ladder and r["layout"] == "nn" and r.get("tflops")]
        for v in sorted({r["variant"] for r in sq}, key=lambda s: (s == "auto", s)):
            pts = sorted((r["m"], r["tflops"]) for r in sq if r["variant"] == v)
            ax.plot(*zip(*pts), marker="o", label=f"gemmt {v}")
        ref: dict[int, list[float]] = {}
        for r in sq:
            ref.setdefault(r["m"], []).append(r["ref_tflops"])
        pts = sorted((s, statistics.median(v)) for s, v in ref.items())
        if pts:
            ax.plot(*zip(*pts), "k--", marker="s", label="cuBLAS (torch.matmul)")
        ax.set_title(f"{dt} GEMM, M=N=K")
        ax.set_xlabel("size")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[4]
    awkward = [r for r in records if r["variant"] == "auto" and r.get("ratio")
               and not (r["m"] == r["n"] == r["k"] and r["layout"] == "nn"
                        and r["m"] in {q["m"] for q in records if q["variant"] != "auto"})]
    shapes = sorted({(r["m"], r["n"], r["k"], r["layout"]) for r in awkward})
    width = 0.8 / len(dtypes)
    for i, dt in enumerate(dtypes):
        got = {(r["m"], r["n"], r["k"], r["layout"]): r["ratio"] for r in awkward
               if r["dtype"] == dt}
        ax.bar([x + (i - 1.5) * width for x in range(len(shapes))],
               [got.get(sh, 0.0) for sh in shapes], width=width, label=dt)
    ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.set_xticks(range(len(shapes)), [f"{m}x{n}x{k}\n{lay}" for m, n, k, lay in shapes],
                  fontsize=6, rotation=60)
    ax.set_ylabel("cuBLAS time / gemmt time")
    ax.set_title("awkward shapes (auto), ratio to cuBLAS")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _plot_memory(records: list[dict[str, Any]], copy_gbps: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['op']}\n{r['dtype']}" for r in records]
    fig, ax = plt.subplots(figsize=(max(10, len(records) * 0.8), 5))
    xs = range(len(records))
    ax.bar([x - 0.2 for x in xs], [r["gbps"] for r in records], width=0.4, label="gemmt")
    ax.bar([x + 0.2 for x in xs], [r["ref_gbps"] for r in records], width=0.4,
           label="PyTorch eager")
    ax.axhline(copy_gbps, color="k", ls="--", label=f"D2D copy {copy_gbps:.0f} GB/s")
    ax.axhline(0.92 * copy_gbps, color="r", ls=":", label="92% of copy")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_fp64(records: list[dict[str, Any]], path: Path) -> None:
    """The float64 cases' ratio to cuBLAS DGEMM, one bar per shape, layout and variant."""
    done = [r for r in records if r.get("ratio")]
    labels = [f"{r['m']}x{r['n']}x{r['k']} {r['layout']} {r['variant']}" for r in done]
    plot_ratios(labels, {"gemmt / cuBLAS DGEMM": [r["ratio"] for r in done]},
                f"float64 GEMM on {done[0]['device_name'] if done else '?'}", path,
                ylabel="cuBLAS time / gemmt time")


def run_gemm(out_dir: Path, quick: bool, fp64_only: bool = False) -> list[dict[str, Any]]:
    """The GEMM suite (``fp64_only``: just its float64 cases, suite name ``gemm_fp64``)."""
    env = environment()
    suite = "gemm_fp64" if fp64_only else "gemm"
    cases = _fp64_cases(quick) if fp64_only else _gemm_cases(quick)
    records = [_run_gemm_case(c) for c in _progress(cases, suite)]
    path = _write(out_dir, suite, env, records)
    try:
        if fp64_only:
            plot_fp64(records, path.with_suffix(".png"))
        else:
            _plot_gemm(records, path.with_suffix(".png"))
    except ImportError:
        print("matplotlib missing: no plot")
    print(f"\n{'dtype':<9}{'m':>6}{'n':>6}{'k':>7}{'lay':>4} {'variant':<17}{'gemmt TF/s':>11}"
          f"{'cuBLAS TF/s':>12}{'ratio':>7}{'rel err':>10}")
    for r in records:
        tf = f"{r['tflops']:.1f}" if r.get("tflops") else r.get("error", "-")[:30]
        ratio = f"{r['ratio']:.3f}" if r.get("ratio") else "-"
        err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else "-"
        print(f"{r['dtype']:<9}{r['m']:>6}{r['n']:>6}{r['k']:>7}{r['layout']:>4} "
              f"{r['variant']:<17}{tf:>11}{r['ref_tflops']:>12.1f}{ratio:>7}{err:>10}")
    for r in records:
        if (r["dtype"], r["m"], r["n"], r["k"], r["layout"], r["variant"]) == (
                "float64", 4096, 4096, 4096, "nn", "auto"):
            ratio = f"{r['ratio']:.3f}" if r.get("ratio") else r.get("error", "-")
            print(f"float64 4096^3: gemmt / cuBLAS DGEMM (torch.matmul) = {ratio}")
    print(f"wrote {path}")
    return records


def run_memory(out_dir: Path, quick: bool) -> list[dict[str, Any]]:
    env = environment()
    copy = _copy_gbps(1 << (28 if quick else 30))
    records = []
    for op, dt, make in _progress(_memory_cases(quick), "memory"):
        case = make()
        ours, ref = _paired_ms(case.pop("ours"), case.pop("ref"))
        nbytes = case["bytes"]
        rec = dict(op=op, dtype=dt, ours_ms=ours, ref_ms=ref, gbps=nbytes / ours / 1e6,
                   ref_gbps=nbytes / ref / 1e6, copy_gbps=copy, **case)
        rec["fraction_of_copy"] = rec["gbps"] / copy
        rec["speedup_vs_torch"] = ref / ours
        records.append(rec)
        torch.cuda.empty_cache()
    small = _small_call_overhead()
    path = _write(out_dir, "memory", env, records, {"copy_gbps": copy, "small_tensor": small})
    try:
        _plot_memory(records, copy, path.with_suffix(".png"))
    except ImportError:
        print("matplotlib missing: no plot")
    print(f"\ncopy bandwidth (same run): {copy:.0f} GB/s")
    print(f"{'op':<18}{'dtype':<10}{'GB/s':>8}{'of copy':>9}{'torch GB/s':>11}{'vs torch':>9}")
    for r in records:
        print(f"{r['op']:<18}{r['dtype']:<10}{r['gbps']:>8.0f}{r['fraction_of_copy']:>9.3f}"
              f"{r['ref_gbps']:>11.0f}{r['speedup_vs_torch']:>8.2f}x")
    print(f"1-element add: gemmt {small['ours_us']:.2f} us/call, torch.add "
          f"{small['ref_us']:.2f} us/call, ratio {small['ratio']:.2f}")
    for name, us in small["breakdown_us"].items():
        print(f"  {name:<30}{us:8.2f} us/call")
    for r in records:
        if (r["dtype"], r["m"], r["n"], r["k"], r["layout"], r["variant"]) == (
                "float64", 4096, 4096, 4096, "nn", "auto"):
            ratio = f"{r['ratio']:.3f}" if r.get("ratio") else r.get("error", "-")
            print(f"float64 4096^3: gemmt / cuBLAS DGEMM (torch.matmul) = {ratio}")
    print(f"wrote {path}")
    return records


def run(suite: str, out: str, quick: bool = False,
        sections: str = "prefill,fp32,decode,fused,model", tokens: str = "512,2048,8192") -> int:
    """Entry point of ``python -m gemmt bench``; ``sections`` and ``tokens`` (the prefill
    section's token counts) apply to the linear suite."""
    if not torch.cuda.is_available():
        print("the benchmarks need a CUDA device")
        return 1
    out_dir = Path(out)
    if suite in ("gemm", "all"):
        run_gemm(out_dir, quick)
    if suite == "gemm_fp64":
        run_gemm(out_dir, quick, fp64_only=True)
    if suite in ("memory", "all"):
        run_memory(out_dir, quick)
    if suite in ("linear", "all"):
        from gemmt import bench_linear

        return bench_linear.run(out_dir, quick, sections, tokens)
    return 0
