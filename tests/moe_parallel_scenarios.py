"""Expert-parallel scenarios, run inside every process of one process group.

``tests/test_moe_parallel.py`` starts ``world_size`` copies of this file through the launcher
of ``tests/test_distributed.py``; ``distributed_scenarios.main`` runs the scenarios and writes
each rank's outcomes. Every rank builds the same full layer and tokens (seeded), runs the
single-process reference on all of them, then its own share through the expert-parallel
path, and compares the output and every gradient with its share of the reference's. Run by
hand::

    python tests/moe_parallel_scenarios.py --rank 0 --world-size 1 --store /tmp/s --out /tmp/o
"""

from __future__ import annotations

import os
import re
import sys
from typing import Callable

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import distributed_scenarios  # noqa: E402
import gemmt  # noqa: E402
from distributed_scenarios import Context  # noqa: E402
from gemmt.moe_parallel import expert_parallel_experts  # noqa: E402

SCENARIOS: dict[str, Callable[[Context], None]] = {}

H, I = 16, 12  # hidden and intermediate sizes: small, the grouped products are not timed here


def scenario(fn: Callable[[Context], None]) -> Callable[[Context], None]:
    SCENARIOS[fn.__name__] = fn
    return fn


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    denom = ref64.norm().item()
    err = (out64 - ref64).norm().item()
    return err / denom if denom > 0 else err


def check(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """float64: equal to rounding of a few ulps; float32 and bfloat16: within the relative
    error of a float32-accumulated product in that dtype (NaN fails every bound)."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected "
                             f"{tuple(expected.shape)}")
    if dtype == torch.float64:
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12,
                                   msg=lambda m: f"{what}: {m}")
        return
    bound = 1e-5 if dtype == torch.float32 else 1e-2
    err = rel_err(actual, expected)
    if not err <= bound:
        raise AssertionError(f"{what}: relative error {err:.3g} above {bound:g}")


def shares(tokens: list[int], rank: int) -> slice:
    """The rows of the full batch that ``rank`` holds when rank r holds ``tokens[r]``."""
    start = sum(tokens[:rank])
    return slice(start, start + tokens[rank])


def route(total: int, num_experts: int, top_k: int, seed: int,
          allowed: list[int] | None = None, skew: float = 0.0) -> torch.Tensor:
    """``(total, top_k)`` distinct experts per token drawn from ``allowed`` (all by default),
    lower ids favoured by ``skew``."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(total, num_experts, generator=gen, dtype=torch.float64)
    scores -= skew * torch.arange(num_experts, dtype=torch.float64) / num_experts
    if allowed is not None:
        mask = torch.full((num_experts,), float("-inf"), dtype=torch.float64)
        mask[allowed] = 0.0
        scores += mask
    return scores.topk(top_k, dim=1).indices


def run_case(ctx: Context, tokens: list[int], num_experts: int, ids: torch.Tensor,
             dtype: torch.dtype, seed: int, what: str) -> dict[str, int]:
    """Reference (``moe_experts`` on all tokens and experts) against the expert-parallel layer
    on this rank's tokens and experts: output, and gradients of x, weights and both local
    expert weights. Returns how many slots this rank's experts received."""
    total, top_k = ids.shape
    e_local = num_experts // ctx.world
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(total, H, generator=gen, dtype=torch.float64)
    w_gate_up = torch.randn(num_experts, 2 * I, H, generator=gen, dtype=torch.float64) / H**0.5
    w_down = torch.randn(num_experts, H, I, generator=gen, dtype=torch.float64) / I**0.5
    weights = torch.rand(total, top_k, generator=gen, dtype=torch.float64) + 0.1
    grad_out = torch.randn(total, H, generator=gen, dtype=torch.float64)
    wdtype = torch.float64 if dtype == torch.float64 else torch.float32
    dev = ctx.device

    def leaf(t: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        return t.to(dev, dt, copy=True).requires_grad_()

    full = [leaf(x, dtype), leaf(weights, wdtype), leaf(w_gate_up, dtype), leaf(w_down, dtype)]
    ids_dev = ids.to(dev)
    order, offsets = gemmt.moe_permute(ids_dev, num_experts)
    ref = gemmt.moe_experts(full[0], full[2], full[3], full[1], ids_dev, order, offsets)
    ref.backward(grad_out.to(dev, dtype))

    mine, experts = shares(tokens, ctx.rank), slice(ctx.rank * e_local, (ctx.rank + 1) * e_local)
    local = [leaf(x[mine], dtype), leaf(weights[mine], wdtype),
             leaf(w_gate_up[experts], dtype), leaf(w_down[experts], dtype)]
    out = expert_parallel_experts(local[0], local[1], ids_dev[mine], local[2], local[3])
    if out.dtype != dtype:
        raise AssertionError(f"{what}: output dtype {out.dtype}, expected {dtype}")
    check(out, ref[mine], dtype, f"{what}: output")
    out.backward(grad_out[mine].to(dev, dtype))
    expected = [full[0].grad[mine], full[1].grad[mine], full[2].grad[experts],
                full[3].grad[experts]]
    for name, t, g in zip(("x", "weights", "w_gate_up_local", "w_down_local"), local, expected):
        check(t.grad, g, dtype, f"{what}: gradient of {name}")
    received = int(((ids >= experts.start) & (ids < experts.stop)).sum())
    return {"received": received}


DTYPES = (torch.float64, torch.float32, torch.bfloat16)


@scenario
def uneven_routing(ctx: Context) -> None:
    """Skewed routing, uneven token counts per rank, one rank with no tokens, top_k 2; every
    dtype."""
    tokens = [7, 0, 12, 3][:ctx.world] if ctx.world > 1 else [9]
    if ctx.world == 2:
        tokens = [11, 0]
    num_experts = 4 * ctx.world
    ids = route(sum(tokens), num_experts, 2, seed=1, skew=0.6)
    for dtype in DTYPES:
        run_case(ctx, tokens, num_experts, ids, dtype, seed=2, what=f"uneven {dtype}")


@scenario
def rank_receives_nothing(ctx: Context) -> None:
    """No token is routed to the last rank's experts: it receives no rows and runs its experts
    on none (its expert gradients are zeros)."""
    tokens = [5 + r for r in range(ctx.world)]
    num_experts = 2 * ctx.world
    ids = route(sum(tokens), num_experts, 2, seed=3,
                allowed=list(range(num_experts - 2)) if ctx.world > 1 else None)
    got = run_case(ctx, tokens, num_experts, ids, torch.float64, seed=4, what="last rank idle")
    if ctx.world > 1 and ctx.rank == ctx.world - 1 and got["received"] != 0:
        raise AssertionError(f"the last rank received {got['received']} slots, expected none")


@scenario
def all_tokens_to_one_rank(ctx: Context) -> None:
    """Every slot goes to rank 1's experts (rank 0's with one process): top_k 1 to a single
    expert, top_k 2 to two experts of that rank."""
    target = min(1, ctx.world - 1)
    e_local = 2
    num_experts = e_local * ctx.world
    tokens = [4] * ctx.world
    for top_k in (1, 2):
        ids = route(sum(tokens), num_experts, top_k, seed=5,
                    allowed=[target * e_local + j for j in range(top_k)])
        for dtype in (torch.float64, torch.bfloat16):
            run_case(ctx, tokens, num_experts, ids, dtype, seed=6,
                     what=f"all to rank {target}, top_k {top_k}, {dtype}")


@scenario
def top_k_1_and_8(ctx: Context) -> None:
    """top_k 1 over 2 experts per rank; top_k 8 over 16 experts in all."""
    tokens = [3 + 2 * r for r in range(ctx.world)]
    ids = route(sum(tokens), 2 * ctx.world, 1, seed=7)
    run_case(ctx, tokens, 2 * ctx.world, ids, torch.float64, seed=8, what="top_k 1")
    num_experts = 16 if 16 % ctx.world == 0 else 8 * ctx.world
    ids = route(sum(tokens), num_experts, 8, seed=9, skew=0.3)
    for dtype in DTYPES:
        run_case(ctx, tokens, num_experts, ids, dtype, seed=10, what=f"top_k 8 {dtype}")


def _module_case(ctx: Context, dtype: torch.dtype, kwargs: dict[str, object]) -> None:
    torch.manual_seed(11)
    num_experts = 4 * ctx.world
    moe = gemmt.nn.MoE(H, I, num_experts, 2, dtype=dtype, device=ctx.device, **kwargs)
    if moe.e_score_correction_bias is not None:
        moe.e_score_correction_bias.copy_(torch.linspace(-0.1, 0.1, num_experts))
    ep = gemmt.nn.ExpertParallelMoE.from_moe(moe)
    e_local = num_experts // ctx.world
    experts = slice(ctx.rank * e_local, (ctx.rank + 1) * e_local)
    if ep.gate_up_proj.shape != (e_local, 2 * I, H) or ep.down_proj.shape != (e_local, H, I):
        raise AssertionError(f"local expert shapes {tuple(ep.gate_up_proj.shape)}, "
                             f"{tuple(ep.down_proj.shape)}")
    tokens = [6, 1, 9, 4][:ctx.world] if ctx.world > 2 else [6, 9][:ctx.world]
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(1, sum(tokens), H, generator=gen).to(ctx.device, dtype)
    grad_out = torch.randn(1, sum(tokens), H, generator=gen).to(ctx.device, dtype)
    x_ref = x.clone().requires_grad_()
    ref = moe(x_ref)
    ref.backward(grad_out)
    mine = shares(tokens, ctx.rank)
    x_mine = x[:, mine].clone().requires_grad_()
    out = ep(x_mine)
    out.backward(grad_out[:, mine])
    what = f"ExpertParallelMoE {dtype} {kwargs}"
    check(out, ref[:, mine], dtype, f"{what}: output")
    check(x_mine.grad, x_ref.grad[:, mine], dtype, f"{what}: gradient of x")
    check(ep.gate_up_proj.grad, moe.gate_up_proj.grad[experts], dtype,
          f"{what}: gradient of gate_up_proj")
    check(ep.down_proj.grad, moe.down_proj.grad[experts], dtype,
          f"{what}: gradient of down_proj")
    # The router sees this rank's tokens only: its gradients sum over the ranks.
    router = ep.gate.weight.grad.clone()
    dist.all_reduce(router)
    check(router, moe.gate.weight.grad, dtype, f"{what}: gradient of the router (summed)")


@scenario
def module_matches_moe(ctx: Context) -> None:
    """gemmt.nn.ExpertParallelMoE.from_moe on every rank equals the MoE it was cut from:
    softmax routing in float32 and float64, DeepSeek-style group-limited sigmoid routing
    with a correction bias and a scaling factor in float64."""
    _module_case(ctx, torch.float32, {})
    _module_case(ctx, torch.float64, {})
    _module_case(ctx, torch.float64, {"score": "sigmoid", "n_group": 2, "topk_group": 1,
                                      "correction_bias": True,
                                      "routed_scaling_factor": 2.5})


def expect_error(fn: Callable[[], object], kind: type[Exception], pattern: str,
                 what: str) -> None:
    try:
        fn()
    except kind as exc:
        if not re.search(pattern, str(exc)):
            raise AssertionError(f"{what}: message {str(exc)!r} does not match {pattern!r}")
        return
    raise AssertionError(f"{what}: no {kind.__name__} raised")


@scenario
def bad_input_raises_on_every_rank(ctx: Context) -> None:
    """Arguments refused on one rank make every rank raise (nobody is left waiting in an
    all-to-all), with messages naming the function and the argument; the group then still
    works."""
    dev = ctx.device
    e_local = 2
    num_experts = e_local * ctx.world
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(5, H, generator=gen, dtype=torch.float64).to(dev)
    weights = torch.rand(5, 2, generator=gen, dtype=torch.float64).to(dev)
    wgu = torch.randn(e_local, 2 * I, H, generator=gen, dtype=torch.float64).to(dev)
    wd = torch.randn(e_local, H, I, generator=gen, dtype=torch.float64).to(dev)
    good = route(5, num_experts, 2, seed=14 + ctx.rank).to(dev)
    name = r"^gemmt\.expert_parallel_experts: "
    last = ctx.world - 1

    for bad_id in (num_experts, -1):
        ids = good.clone()
        if ctx.rank == 0:
            ids[3, 1] = bad_id
        expect_error(lambda: expert_parallel_experts(x, weights, ids, wgu, wd), ValueError,
                     name + r"argument 'expert_ids' expected values in \[0, "
                     + f"{num_experts}" + r"\).*\{0: 1\}", f"expert id {bad_id} on rank 0")

    # A shape refused on the last rank: it names the argument, the others name that rank.
    bad_wd = wd[:, :, :-1] if ctx.rank == last else wd
    if ctx.rank == last:
        expect_error(lambda: expert_parallel_experts(x, weights, good, wgu, bad_wd),
                     ValueError, name + r"argument 'w_gate_up_local' expected shape",
                     "mismatched expert weights")
    else:
        expect_error(lambda: expert_parallel_experts(x, weights, good, wgu, bad_wd),
                     RuntimeError, name + rf"the arguments of rank\(s\) \[{last}\]",
                     "a peer's mismatched expert weights")
    if ctx.rank == last:
        expect_error(lambda: expert_parallel_experts(x, weights[:, :1], good, wgu, wd),
                     ValueError, name + r"argument 'expert_ids' expected the shape of "
                     r"'weights'", "ids and weights of different shapes")
    else:
        expect_error(lambda: expert_parallel_experts(x, weights, good, wgu, wd),
                     RuntimeError, name + r"the arguments of rank", "a peer's bad shapes")

    # Ranks that hold different numbers of experts.
    if ctx.world > 1:
        more = torch.cat([wgu, wgu[:1]]) if ctx.rank == 0 else wgu
        more_d = torch.cat([wd, wd[:1]]) if ctx.rank == 0 else wd
        expect_error(lambda: expert_parallel_experts(x, weights, good % e_local, more, more_d),
                     ValueError, name + r"argument 'w_gate_up_local' expected the same number "
                     r"of local experts", "ranks with different expert counts")

    # Experts that do not divide among the ranks.
    moe = gemmt.nn.MoE(H, I, 2 * ctx.world + 1, 2, device=dev)
    if ctx.world > 1:
        expect_error(lambda: gemmt.nn.ExpertParallelMoE.from_moe(moe), ValueError,
                     r"^gemmt\.nn\.ExpertParallelMoE\.from_moe: argument 'moe' expected a "
                     r"number of experts divisible by the group's size", "from_moe, 2W+1")
        expect_error(lambda: gemmt.nn.ExpertParallelMoE(H, I, 2 * ctx.world + 1, 2),
                     ValueError, r"^gemmt\.nn\.ExpertParallelMoE: argument 'num_experts' "
                     r"expected a positive multiple of the group's size", "constructor, 2W+1")
    expect_error(lambda: gemmt.nn.ExpertParallelMoE.from_moe(torch.nn.Linear(2, 2)),
                 TypeError, r"from_moe: argument 'moe' expected a gemmt.nn.MoE", "not a MoE")

    # The group is still in step: a valid call gives the reference's answer.
    tokens = [5] * ctx.world
    ids = route(sum(tokens), num_experts, 2, seed=15)
    run_case(ctx, tokens, num_experts, ids, torch.float64, seed=16, what="after the errors")


if __name__ == "__main__":
    sys.exit(distributed_scenarios.main(scenarios=SCENARIOS))
