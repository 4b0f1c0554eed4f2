"""Where the MoE layer's time goes: the CUDA kernels of one forward + backward step of
``gemmt.nn.MoE`` and of the torch layer ``python -m gemmt bench moe`` races it against
(``torch._grouped_mm``), from ``torch.profiler``.

    python benchmarks/profile_moe_layer.py --out <folder> [--config mixtral|qwen3_30b]
        [--tokens 4096] [--steps 5] [--forward] [--model-decode]

Writes ``profile_moe_layer_<config>_<tokens>.json`` under ``--out``: per side the step's time
(CUDA events, median of the steps), the kernels' summed time a step, and each kernel's time a
step and launches a step, longest first. ``--forward`` profiles the forward alone (no
gradients; ``..._forward.json``); ``--model-decode`` the decode step of ``python -m gemmt bench
moe``'s transformers model of that configuration (``--tokens`` sequences of one token, no
cache) with gemmt's and the ``grouped_mm`` experts implementation
(``profile_moe_model_decode_<config>_<tokens>.json``), with the host's operators by self CPU
time a step. Each also gives the expert weights' bytes over the step's time, the rate a
weight-streaming step would need.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
from typing import Any, Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import gemmt
from gemmt._timing import median_ms
from gemmt.bench_moe import LAYERS, torch_moe


def step_fn(moe: gemmt.nn.MoE, layer: Callable[[gemmt.nn.MoE, torch.Tensor], torch.Tensor],
            x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    """One training step of ``layer``: the gradients cleared, forward, backward."""
    params = [*moe.parameters(), x]

    def run() -> None:
        for p in params:
            p.grad = None
        layer(moe, x).backward(g)
    return run


def forward_fn(moe: gemmt.nn.MoE, layer: Callable[[gemmt.nn.MoE, torch.Tensor], torch.Tensor],
               x: torch.Tensor) -> Callable[[], None]:
    """One forward of ``layer`` without gradients."""
    def run() -> None:
        with torch.no_grad():
            layer(moe, x)
    return run


def model_decode_fns(config: str, sequences: int) -> tuple[dict[str, Callable[[], None]], int]:
    """The transformers model of ``bench moe`` for ``config``: its decode step (``sequences``
    sequences of one token, no cache) under gemmt's and the grouped_mm experts implementation,
    and the bytes of its expert weights."""
    import transformers as tf

    import gemmt.moe
    from gemmt.bench_moe import _build_model, _model_builders

    if not gemmt.moe.register_transformers():
        raise RuntimeError("transformers has no experts registry")
    name = {"mixtral": "mixtral_like", "qwen3_30b": "qwen3_moe_like"}[config]
    build = dict(_model_builders(tf, False))[name]
    model = _build_model(build, "cuda").eval()
    ids = torch.randint(0, model.config.vocab_size, (sequences, 1), device="cuda")
    expert_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                       if "experts" in n)

    def side(impl: str) -> Callable[[], None]:
        def run() -> None:
            model.set_experts_implementation(impl)
            with torch.no_grad():
                model(ids, use_cache=False)
        return run
    return {"gemmt": side("gemmt"), "grouped_mm": side("grouped_mm")}, expert_bytes


def host_ops(fn: Callable[[], None], steps: int) -> list[dict[str, Any]]:
    """The host's side of ``fn``: the operators with the most self CPU time a step (the
    profiler's own cost inflates each; their shares are what to read)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:30]
    return [{"op": e.key[:120], "self_cpu_ms": e.self_cpu_time_total / 1e3 / steps,
             "calls": e.count / steps} for e in rows]


def kernels_of(fn: Callable[[], None], steps: int, host: bool = False) -> dict[str, Any]:
    """``fn``'s step time (median of ``steps``, after warm-up) and its kernels' time a step;
    with ``host``, also :func:`host_ops`."""
    step_ms = median_ms(fn, "cuda", reps=steps, budget_s=float("inf"))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    us: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            us[e.name] += e.time_range.elapsed_us()
            calls[e.name] += 1
    rows = sorted(({"kernel": n[:160], "ms": us[n] / 1e3 / steps, "launches": calls[n] / steps}
                   for n in us), key=lambda r: -r["ms"])
    doc = {"step_ms": step_ms, "kernels_ms": sum(r["ms"] for r in rows), "kernels": rows}
    if host:
        doc["host_ops"] = host_ops(fn, steps)
    return doc


def environment() -> dict[str, Any]:
    """The GPU, the versions and the date a profile was taken with."""
    return {"gpu": torch.cuda.get_device_name(), "torch_version": torch.__version__,
            "cuda": torch.version.cuda, "gemmt": gemmt.build_info(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write_json(doc: dict[str, Any], out: str, name: str) -> None:
    """``doc`` as ``<out>/<name>.json``, compact."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))


def main() -> int:
    """Profiles both layers on one configuration and writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the JSON")
    parser.add_argument("--config", default="mixtral", choices=[c[0] for c in LAYERS])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--forward", action="store_true", help="the forward alone")
    parser.add_argument("--model-decode", action="store_true",
                        help="the transformers model's decode step instead of the layer")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_moe_layer: needs a CUDA device")
        return 1
    name, hidden, inter, experts, top_k = next(c for c in LAYERS if c[0] == args.config)
    torch.manual_seed(0)
    config = {"name": name, "hidden": hidden, "intermediate": inter, "experts": experts,
              "top_k": top_k, "tokens": args.tokens}
    if args.model_decode:
        sides, expert_bytes = model_decode_fns(name, args.tokens)
        out_name = f"profile_moe_model_decode_{name}_{args.tokens}"
    else:
        moe = gemmt.nn.MoE(hidden, inter, experts, top_k, device="cuda", dtype=torch.bfloat16)
        expert_bytes = sum(p.numel() * p.element_size() for n, p in moe.named_parameters()
                           if "proj" in n)
        x = torch.randn(args.tokens, hidden, device="cuda", dtype=torch.bfloat16,
                        requires_grad=not args.forward)
        if args.forward:
            sides = {"gemmt": forward_fn(moe, lambda m, t: m(t), x),
                     "torch": forward_fn(moe, torch_moe, x)}
        else:
            g = torch.randn(args.tokens, hidden, device="cuda", dtype=torch.bfloat16)
            sides = {"gemmt": step_fn(moe, lambda m, t: m(t), x, g),
                     "torch": step_fn(moe, torch_moe, x, g)}
        out_name = f"profile_moe_layer_{name}_{args.tokens}" + ("_forward" if args.forward else "")
    doc = {**environment(), "config": config, "steps": args.steps,
           "forward_only": args.forward or args.model_decode, "expert_bytes": expert_bytes,
           **{s: kernels_of(fn, args.steps, host=args.model_decode) for s, fn in sides.items()}}
    for s in sides:
        doc[s]["expert_tb_per_s"] = expert_bytes / (doc[s]["step_ms"] * 1e-3) / 1e12
        top = ", ".join(f"{r['kernel'][:50]} {r['ms']:.3f}" for r in doc[s]["kernels"][:8])
        print(f"{s}: step {doc[s]['step_ms']:.3f} ms, kernels {doc[s]['kernels_ms']:.3f} ms, "
              f"expert bytes / step {doc[s]['expert_tb_per_s']:.2f} TB/s: {top}")
        for r in doc[s].get("host_ops", [])[:15]:
            print(f"  host {r['op'][:60]:60s} {r['self_cpu_ms']:.3f} ms x{r['calls']:.0f}")
    write_json(doc, args.out, out_name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
