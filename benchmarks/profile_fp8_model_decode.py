"""Where a converted model's decode step goes: the CUDA kernels of one forward of the
Llama-shaped model that ``python -m gemmt bench fp8 --only model`` times (hidden 4096, 4
layers, 16 sequences x 1 token, no cache), in bf16 torch and converted by
``gemmt.nn.convert_to_float8(inference=True)`` per recipe, from ``torch.profiler``.

    python benchmarks/profile_fp8_model_decode.py --out <folder> [--steps 10]
        [--recipes tensorwise,rowwise]

Writes ``profile_fp8_model_decode.json`` under ``--out``: per variant the step's time (the
median of eager steps; the benchmark replays CUDA graphs), the kernels' summed time and count
a step, the share in the products, and each kernel's time and launches a step, longest
first.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import torch

from gemmt.bench_fp8 import MODEL, _convert_model, _infer, llama_model
from profile_fp8_train import _is_gemm
from profile_moe_layer import environment, kernels_of, write_json


def main() -> int:
    """Profiles the bf16 model and each recipe's converted copy; writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the JSON")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--recipes", default="tensorwise,rowwise")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_fp8_model_decode: needs a CUDA device")
        return 1
    ref = llama_model(MODEL, "cuda")
    ids = torch.randint(0, MODEL["vocab"], MODEL["decode"], device="cuda")
    models: dict[str, Callable[[], torch.nn.Module]] = {"bf16_torch": lambda: ref}
    for recipe in filter(None, args.recipes.split(",")):
        models[f"gemmt_{recipe}"] = lambda recipe=recipe: _convert_model(ref, recipe, True)
    doc: dict[str, Any] = {**environment(), "config": MODEL, "steps": args.steps,
                           "variants": {}}
    for name, build in models.items():
        model = build()
        fn = lambda model=model: _infer(model, ids)  # noqa: E731
        for _ in range(3):  # plans, allocations and first launches outside the profile
            fn()
        res = kernels_of(fn, args.steps)
        res["gemm_ms"] = sum(r["ms"] for r in res["kernels"] if _is_gemm(r["kernel"]))
        res["other_ms"] = res["kernels_ms"] - res["gemm_ms"]
        res["launches"] = sum(r["launches"] for r in res["kernels"])
        doc["variants"][name] = res
        print(f"{name}: step {res['step_ms']:.3f} ms, kernels {res['kernels_ms']:.3f} ms in "
              f"{res['launches']:.0f} launches (GEMMs {res['gemm_ms']:.3f}, other "
              f"{res['other_ms']:.3f})", flush=True)
        if model is not ref:
            del model
            torch.cuda.empty_cache()
    write_json(doc, args.out, "profile_fp8_model_decode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
