"""Expert parallelism (``gemmt.moe_parallel``, ``gemmt.nn.ExpertParallelMoE``) across
processes: the outputs and gradients of the expert-parallel layer equal those of the
single-process ``moe_experts`` / ``gemmt.nn.MoE`` on the full weights.

The scenarios live in ``moe_parallel_scenarios.py`` and run through the launcher of
``test_distributed.py``: one process group per backend and world size runs all of them, and
each scenario's outcome becomes a test. gloo on CPU with 2 and 4 processes; NCCL on GPUs,
skipped without enough of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gemmt
import gemmt.moe
import gemmt.moe_parallel

if not dist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import moe_parallel_scenarios  # noqa: E402
from test_distributed import (  # noqa: E402
    Launcher, Outcomes, assert_every_rank_ok, launcher, scenario_params)

SCENARIO_FILE = Path(moe_parallel_scenarios.__file__).resolve()

_cache: dict[tuple[str, int], Outcomes] = {}


@pytest.fixture(scope="module")
def group_outcomes(tmp_path_factory: pytest.TempPathFactory) -> Launcher:
    return launcher(tmp_path_factory, _cache, "moe_ep", script=SCENARIO_FILE,
                    scenarios=moe_parallel_scenarios.SCENARIOS)


@pytest.mark.parametrize(("backend", "world", "scenario"),
                         scenario_params(moe_parallel_scenarios.SCENARIOS))
def test_scenario(group_outcomes: Launcher, backend: str, world: int, scenario: str) -> None:
    assert_every_rank_ok(group_outcomes(backend, world)[scenario])


def test_exported_names() -> None:
    assert gemmt.moe.expert_parallel_experts is gemmt.moe_parallel.expert_parallel_experts
    assert "expert_parallel_experts" in gemmt.moe.__all__
    assert "ExpertParallelMoE" in gemmt.nn.__all__


@pytest.mark.parametrize(("tokens", "num_experts", "top_k", "world"),
                         [(37, 16, 8, 4), (20, 8, 2, 2), (9, 4, 1, 4), (0, 8, 2, 2), (5, 6, 6, 3)])
def test_dispatch_sends_each_token_once_per_rank(tokens: int, num_experts: int, top_k: int,
                                                 world: int) -> None:
    """The dispatch plan (gemmt/moe_parallel.py: _dispatch_plan) sends a token's row to each
    rank holding one of its experts exactly once, grouped by rank, and points every slot at
    its token's row on its rank."""
    e_local = num_experts // world
    gen = torch.Generator().manual_seed(tokens + top_k)
    ids = torch.rand(tokens, num_experts, generator=gen).topk(top_k, dim=1).indices
    order, _ = gemmt.moe_permute(ids, num_experts)
    flat = ids.reshape(-1)
    mp = gemmt.moe_parallel
    per_rank, row_of_slot, row, tok = mp._dispatch_plan(order, flat, top_k, e_local, world)
    send = mp._rows_to_send(int(per_rank.sum()), row, tok)
    dest = flat.index_select(0, order.long()) // e_local
    token = order.long() // top_k
    want = {r: sorted({int(t) for t, d in zip(token, dest) if int(d) == r})
            for r in range(world)}
    assert per_rank.tolist() == [len(want[r]) for r in range(world)]
    first = [sum(len(want[q]) for q in range(r)) for r in range(world)]
    for r in range(world):
        assert send[first[r]:first[r] + len(want[r])].tolist() == want[r], r
    rows = torch.tensor([first[int(d)] for d in dest], dtype=torch.long) + row_of_slot
    assert torch.equal(send.index_select(0, rows), token)
    assert int(per_rank.sum()) <= tokens * min(top_k, world)
    if tokens and top_k > world:
        assert int(per_rank.sum()) < ids.numel()  # fewer rows than slots


def test_module_needs_a_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(RuntimeError, match=r"^gemmt\.nn\.ExpertParallelMoE: needs an "
                                           r"initialised torch\.distributed process group"):
        gemmt.nn.ExpertParallelMoE(8, 4, 4, 2)


def test_one_process_group_equals_moe_experts(tmp_path: Path) -> None:
    """A group of one: every expert is local and the all-to-all sends to itself; the result
    and the gradients are those of moe_experts exactly (float64), also with no tokens."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for tokens in (9, 0):
            x = torch.randn(tokens, 8, dtype=torch.float64, requires_grad=True)
            w_gate_up = torch.randn(4, 12, 8, dtype=torch.float64, requires_grad=True)
            w_down = torch.randn(4, 8, 6, dtype=torch.float64, requires_grad=True)
            routing = gemmt.moe_route(torch.randn(tokens, 4, dtype=torch.float64), 2)
            weights = routing.weights.detach().requires_grad_()
            inputs = (x, weights, w_gate_up, w_down)
            ref = gemmt.moe_experts(x, w_gate_up, w_down, weights, routing.expert_ids,
                                    routing.token_order, routing.offsets)
            out = gemmt.moe.expert_parallel_experts(x, weights, routing.expert_ids, w_gate_up,
                                                    w_down)
            assert out.shape == (tokens, 8)
            assert torch.equal(out, ref)
            grad = torch.randn_like(ref)
            for got, want in zip(torch.autograd.grad(out, inputs, grad),
                                 torch.autograd.grad(ref, inputs, grad)):
                assert torch.equal(got, want)
    finally:
        dist.destroy_process_group()
