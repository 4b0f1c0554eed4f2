"""Where an FP8 training step's time goes: the CUDA kernels of one forward + backward step
of the four-block MLP stack that ``python -m gemmt bench fp8 --only train`` times (4096 ->
14336 -> 4096, SiLU, residual, 8192 tokens, bf16 master weights), for bf16 eager torch,
``gemmt.nn.convert_to_float8`` per recipe and torchao's compiled Float8Linear (when torchao
imports), from ``torch.profiler``.

    python benchmarks/profile_fp8_train.py --out <folder> [--tokens 8192] [--steps 5]
        [--variants bf16_eager,gemmt_tensorwise,...]

Writes ``profile_fp8_train_<tokens>.json`` under ``--out``: per variant the step's time (CUDA
events, median of the steps), the kernels' summed time a step, the share of it in GEMMs,
and each kernel's time and launches a step, longest first.
"""

from __future__ import annotations

import argparse
import copy
from typing import Callable

import torch

import gemmt
from gemmt.bench_fp8 import TORCHAO_RECIPES, TRAIN_RECIPES, _Block, _torchao_model, train_step
from profile_moe_layer import environment, kernels_of, write_json

# Kernel names of the products: gemmt's Hopper kernels, cuBLAS(Lt)'s and CUTLASS's (not
# "gemm" alone: every gemmt kernel's namespace has it).
_GEMM_MARKS = ("gemm_kernel", "nvjet", "cutlass", "xmma", "decode_kernel", "decode_wgmma_kernel",
               "gemv")


def _is_gemm(name: str) -> bool:
    low = name.lower()
    return any(mark in low for mark in _GEMM_MARKS)


def main() -> int:
    """Profiles every variant's training step and writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the JSON")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--variants", default="", help="comma-separated subset")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_fp8_train: needs a CUDA device")
        return 1
    torch.manual_seed(0)
    dim, hidden, blocks = 4096, 14336, 4
    base = torch.nn.Sequential(*[_Block(dim, hidden, "cuda") for _ in range(blocks)])
    x = torch.randn(args.tokens, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(args.tokens, dim, device="cuda", dtype=torch.bfloat16)
    builders: dict[str, Callable[[], torch.nn.Module]] = {"bf16_eager": lambda: base}
    for recipe in TRAIN_RECIPES:
        builders[f"gemmt_{recipe}"] = lambda recipe=recipe: gemmt.nn.convert_to_float8(
            copy.deepcopy(base), recipe=recipe)
    for recipe in TORCHAO_RECIPES:
        builders[f"torchao_{recipe}_compiled"] = lambda recipe=recipe: _torchao_model(base,
                                                                                     recipe)
    wanted = [v for v in args.variants.split(",") if v] or list(builders)
    doc: dict[str, object] = {
        **environment(),
        "config": {"dim": dim, "hidden": hidden, "blocks": blocks, "tokens": args.tokens},
        "steps": args.steps, "variants": {}}
    for name in wanted:
        try:
            model = builders[name]()
            fn = train_step(model, x, g)
            for _ in range(3):  # compile, plan and allocate outside the profile
                fn()
            res = kernels_of(fn, args.steps)
        except Exception as exc:  # noqa: BLE001 - recorded, the other variants still run
            doc["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"{name}: {doc['variants'][name]['error']}")
            continue
        res["gemm_ms"] = sum(r["ms"] for r in res["kernels"] if _is_gemm(r["kernel"]))
        res["other_ms"] = res["kernels_ms"] - res["gemm_ms"]
        doc["variants"][name] = res
        print(f"{name}: step {res['step_ms']:.3f} ms, kernels {res['kernels_ms']:.3f} ms "
              f"(GEMMs {res['gemm_ms']:.3f}, other {res['other_ms']:.3f})")
        for r in res["kernels"][:14]:
            print(f"    {r['ms']:8.3f} ms {r['launches']:5.1f}x  {r['kernel'][:110]}")
        del model, fn
        torch.cuda.empty_cache()
    write_json(doc, args.out, f"profile_fp8_train_{args.tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
