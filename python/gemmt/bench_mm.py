"""``python -m gemmt bench mm``: ``gemmt.mm`` under autograd, and single products, against torch.

Two sections, each timed against PyTorch in the same run (CUDA events, warm-up, medians of
interleaved rounds, random data):

* ``autograd``: forward + backward of ``mm`` for every operand layout (``a @ b``,
  ``a @ W.t()``, ``a.t() @ b``, ``a.t() @ W.t()``) on Llama-sized products, and the same
  product through ``gemm`` inside a custom ``torch.autograd.Function``, against
  ``torch.matmul`` with the same leaves and against the same Function on ``torch.mm``. The
  ratio is torch's time over gemmt's.
* ``points``: single forward products of held-out shapes and layouts (float16 with a
  transposed A, float32 with TF32 off and on, a 32-row float32 product).

Results go to ``<out>/mm_<gpu>_<date>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
from typing import Callable

import torch

import gemmt
from gemmt._report import plot_ratios

LAYOUTS = ("nn", "nt", "tn", "tt")
AUTOGRAD_SHAPES = [(2048, 11008, 4096), (2048, 4096, 11008), (2048, 4096, 4096),
                   (1024, 14336, 4096), (4096, 4096, 1024)]
POINTS = [
    # (label, dtype, m, n, k, a transposed, tf32)
    ("fp16 6000^3, A transposed", torch.float16, 6000, 6000, 6000, True, False),
    ("fp32 3000x5000x700", torch.float32, 3000, 5000, 700, False, False),
    ("fp32 32x4096x4096", torch.float32, 32, 4096, 4096, False, False),
    # the class of the last: float32 with few rows against a long weight
    ("fp32 8x4096x4096", torch.float32, 8, 4096, 4096, False, False),
    ("fp32 16x4096x11008", torch.float32, 16, 4096, 11008, False, False),
    ("fp32 32x11008x4096", torch.float32, 32, 11008, 4096, False, False),
    ("tf32 2048x8192x1024", torch.float32, 2048, 8192, 1024, False, True),
    ("bf16 4096^3", torch.bfloat16, 4096, 4096, 4096, False, False),
]


def _product_function(mm_into: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object],
                      name: str) -> type[torch.autograd.Function]:
    """A user's custom Function whose forward and backward write products in place with
    ``mm_into(c, a, b)``; its gradients keep the operands' layouts (a transposed leaf gets a
    transposed gradient, so autograd copies nothing)."""

    class _Product(torch.autograd.Function):
        @staticmethod
        def forward(ctx: torch.autograd.function.FunctionCtx, a: torch.Tensor,  # type: ignore[override]
                    b: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(a, b)
            c = a.new_empty(a.shape[0], b.shape[1])
            mm_into(c, a, b)
            return c

        @staticmethod
        def backward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                     g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a, b = ctx.saved_tensors  # type: ignore[attr-defined]
            ga = a.new_empty(a.shape[1], a.shape[0]).t() if a.stride(0) == 1 else torch.empty_like(a)
            gb = b.new_empty(b.shape[1], b.shape[0]).t() if b.stride(0) == 1 else torch.empty_like(b)
            mm_into(ga, g, b.t())
            mm_into(gb, a.t(), g)
            return ga, gb

    _Product.__name__ = _Product.__qualname__ = name
    return _Product


# The same Function body on gemmt's and on torch's product: the ratio of the two is gemmt's
# share; against torch.matmul's C++ autograd it also carries the Python Function's own cost,
# which decides small products (the CPU then sets the pace).
_GemmProduct = _product_function(lambda c, a, b: gemmt.gemm(c, a, b), "_GemmProduct")
_TorchProduct = _product_function(lambda c, a, b: torch.mm(a, b, out=c), "_TorchProduct")


def _leaves(m: int, n: int, k: int, layout: str, dtype: torch.dtype
            ) -> tuple[torch.Tensor, torch.Tensor, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    """Leaf tensors and a function giving the (m, k) and (k, n) operands in the layout."""
    a_t, b_t = layout[0] == "t", layout[1] == "t"
    a_leaf = torch.randn(k, m, device="cuda", dtype=dtype) if a_t else torch.randn(
        m, k, device="cuda", dtype=dtype)
    b_leaf = torch.randn(n, k, device="cuda", dtype=dtype) if b_t else torch.randn(
        k, n, device="cuda", dtype=dtype)
    b_leaf /= k ** 0.5
    a_leaf.requires_grad_()
    b_leaf.requires_grad_()

    def operands() -> tuple[torch.Tensor, torch.Tensor]:
        return (a_leaf.t() if a_t else a_leaf), (b_leaf.t() if b_t else b_leaf)

    return a_leaf, b_leaf, operands


def _interleaved_ms(fns: dict[str, Callable[[], object]], rounds: int = 15, reps: int = 5
                    ) -> dict[str, float]:
    """Median time per call of each function, over rounds that take turns between them."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / reps)
    return {name: statistics.median(s) for name, s in samples.items()}


def _autograd_rows(dtype: torch.dtype) -> list[dict[str, object]]:
    rows = []
    for (m, n, k) in AUTOGRAD_SHAPES:
        for layout in LAYOUTS:
            a_leaf, b_leaf, operands = _leaves(m, n, k, layout, dtype)
            g = torch.randn(m, n, device="cuda", dtype=dtype)

            def step(product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[], None]:
                def run() -> None:
                    a_leaf.grad = None
                    b_leaf.grad = None
                    a, b = operands()
                    product(a, b).backward(g)
                return run

            times = _interleaved_ms({
                "torch": step(torch.matmul),
                "mm": step(gemmt.mm),
                "gemm_function": step(_GemmProduct.apply),
                "torch_function": step(_TorchProduct.apply),
            })
            row = {"m": m, "n": n, "k": k, "layout": layout, "dtype": str(dtype).split(".")[1],
                   **{f"{name}_ms": t for name, t in times.items()},
                   "mm_vs_torch": times["torch"] / times["mm"],
                   "gemm_function_vs_torch": times["torch"] / times["gemm_function"],
                   "gemm_function_vs_torch_function":
                       times["torch_function"] / times["gemm_function"]}
            rows.append(row)
            print(f"  {m}x{n}x{k} {layout} {row['dtype']}: torch {times['torch']:.3f} ms, "
                  f"mm {times['mm']:.3f} ms ({row['mm_vs_torch']:.3f}x), gemm in a Function "
                  f"{times['gemm_function']:.3f} ms ({row['gemm_function_vs_torch']:.3f}x; "
                  f"{row['gemm_function_vs_torch_function']:.3f}x torch.mm in the same Function)")
    return rows


def _point_rows() -> list[dict[str, object]]:
    rows = []
    for label, dtype, m, n, k, a_t, tf32 in POINTS:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(k, m, device="cuda", dtype=dtype).t() if a_t else torch.randn(
            m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        c = torch.empty(m, n, device="cuda", dtype=dtype)
        times = _interleaved_ms({"torch": lambda: torch.matmul(a, b, out=c),
                                 "gemmt": lambda: gemmt.gemm(c, a, b)}, rounds=21, reps=10)
        row = {"label": label, "m": m, "n": n, "k": k, "a_transposed": a_t, "tf32": tf32,
               "dtype": str(dtype).split(".")[1], "torch_ms": times["torch"],
               "gemmt_ms": times["gemmt"], "gemmt_vs_torch": times["torch"] / times["gemmt"],
               "tflops": 2 * m * n * k / times["gemmt"] / 1e9}
        rows.append(row)
        print(f"  {label}: torch {times['torch']:.3f} ms, gemmt {times['gemmt']:.3f} ms "
              f"({row['gemmt_vs_torch']:.3f}x)")
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def plot(doc: dict, path: str) -> None:
    """mm and gemm-in-a-Function under autograd, and the single products, against torch."""
    rows = doc["autograd"]
    labels = [f"{r['m']}x{r['n']}x{r['k']} {r['layout']} {r['dtype'][:4]}" for r in rows]
    labels += [p["label"] for p in doc["points"]]
    mm = [r["mm_vs_torch"] for r in rows] + [p["gemmt_vs_torch"] for p in doc["points"]]
    fn = [r["gemm_function_vs_torch"] for r in rows] + [float("nan")] * len(doc["points"])
    same = [r.get("gemm_function_vs_torch_function", float("nan")) for r in rows]
    same += [float("nan")] * len(doc["points"])
    plot_ratios(labels, {"mm (autograd) / gemm (single products)": mm,
                         "gemm in a custom Function (vs torch.matmul)": fn,
                         "gemm in a custom Function (vs torch.mm in the same Function)": same},
                f"mm forward + backward and single products on {doc['gpu']}", path)


def run(out_dir: str, quick: bool = False) -> int:
    """Runs both sections on the current GPU and writes their JSON; returns an exit code."""
    if not torch.cuda.is_available():
        print("bench mm: needs a CUDA device")
        return 1
    torch.manual_seed(0)
    print("mm / gemm under autograd, forward + backward, against torch.matmul:")
    autograd = []
    for dtype in ((torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)):
        autograd += _autograd_rows(dtype)
    print("single products:")
    points = _point_rows()
    ratios = [r["mm_vs_torch"] for r in autograd]
    fn_ratios = [r["gemm_function_vs_torch"] for r in autograd]
    same_fn = [r["gemm_function_vs_torch_function"] for r in autograd]
    summary = {"mm_median": statistics.median(ratios), "mm_min": min(ratios),
               "gemm_function_median": statistics.median(fn_ratios),
               "gemm_function_min": min(fn_ratios),
               "gemm_function_vs_torch_function_median": statistics.median(same_fn),
               "gemm_function_vs_torch_function_min": min(same_fn)}
    print("summary:", json.dumps(summary))
    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    result = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda,
              "gemmt": gemmt.build_info(), "date": date, "summary": summary,
              "autograd": autograd, "points": points}
    os.makedirs(out_dir, exist_ok=True)
    slug = gpu.lower().replace(" ", "_")
    path = os.path.join(out_dir, f"mm_{slug}_{date}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    try:
        plot(result, path[: -len(".json")] + ".png")
    except ImportError:
        print("matplotlib missing: no plot")
    print("wrote", path)
    return 0
