"""Distributed scenarios for gemmt, run inside every process of one process group.

``tests/test_distributed.py`` starts ``world_size`` copies of this file (one process group
per world size and backend, shared by every scenario, since starting one costs seconds on
a small machine) and turns each scenario's outcome into a test. Run by hand::

    python tests/distributed_scenarios.py --rank 0 --world-size 1 --store /tmp/s --out /tmp/o

Each rank writes ``rank<r>.json``: per scenario, "ok" or the error with its traceback.
Scenarios run in one order on every rank, since they use collectives; a scenario that
fails on one rank may leave the others waiting in a collective until the process group's
timeout, which the parent bounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import (
    DeviceMesh,
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import gemmt

# float32 on both sides; the sharded model sums in another order.
RTOL, ATOL = 1e-5, 1e-5

SCENARIOS: dict[str, Callable[[Context], None]] = {}


class Context:
    """What every scenario needs: the device, rank, world size and a 1-D mesh of all ranks."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.mesh = init_device_mesh(device, (self.world,))

    def randn(self, *shape: int, seed: int) -> torch.Tensor:
        """The same tensor on every rank (seeded), on this context's device."""
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=gen).to(self.device)


def scenario(fn: Callable[[Context], None]) -> Callable[[Context], None]:
    SCENARIOS[fn.__name__] = fn
    return fn


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if isinstance(actual, DTensor):
        actual = actual.full_tensor()
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def comm_counts(mode: CommDebugMode) -> dict[str, int]:
    """Collectives seen by ``mode``, by short name (all_reduce, all_gather_into_tensor...)."""
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items() if n}


def expect_comms(mode: CommDebugMode, expected: dict[str, int], what: str) -> None:
    got = comm_counts(mode)
    if got != expected:
        raise AssertionError(f"{what}: collectives {got}, expected {expected}")


class MLP(nn.Module):
    """Llama's MLP: ``down(silu(gate(x)) * up(x))``, with gemmt's Linear. ``fused`` puts
    the SiLU in gate's epilogue."""

    def __init__(self, dim: int, hidden: int, bias: bool, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.gate = gemmt.nn.Linear(dim, hidden, bias=bias, activation="silu" if fused else "none")
        self.up = gemmt.nn.Linear(dim, hidden, bias=bias)
        self.down = gemmt.nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(x)
        if not self.fused:
            g = F.silu(g)
        return self.down(g * self.up(x))


TP_PLAN = {"gate": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}


def make_mlp(ctx: Context, bias: bool, fused: bool, seed: int = 0) -> MLP:
    torch.manual_seed(seed)
    return MLP(16, 32, bias, fused).to(ctx.device)


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            for n, p in model.named_parameters()}


# ---------------------------------------------------------------------------------------
# Tensor parallelism


def _tp_mlp(ctx: Context, bias: bool, fused: bool) -> None:
    ref = make_mlp(ctx, bias, fused)
    tp = parallelize_module(make_mlp(ctx, bias, fused), ctx.mesh, TP_PLAN)
    x = ctx.randn(2, 3, 16, seed=1)
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref = ref(x_ref)
    with CommDebugMode() as fwd:
        out_tp = tp(x_tp)
    # One all-reduce: down's partial sums. Everything else stays where the plan put it.
    expect_comms(fwd, {"all_reduce": 1}, "TP MLP forward")
    assert_close(out_tp, out_ref, "TP MLP output")
    grad_out = ctx.randn(*out_ref.shape, seed=2)
    out_ref.backward(grad_out)
    with CommDebugMode() as bwd:
        out_tp.backward(grad_out)
    # x feeds gate and up, each column-wise: each gives a partial gradient of x, reduced
    # where the plan turned x into a DTensor.
    expect_comms(bwd, {"all_reduce": 2}, "TP MLP backward")
    assert_close(x_tp.grad, x_ref.grad, "TP MLP grad of x")
    got = full_grads(tp)
    for name, g in full_grads(ref).items():
        assert_close(got[name], g, f"TP MLP grad of {name}")
    # The plan's shardings, on the parameters and their gradients.
    assert tp.gate.weight.placements == (Shard(0),), tp.gate.weight.placements
    assert tp.down.weight.placements == (Shard(1),), tp.down.weight.placements
    assert tp.down.weight.grad.placements == (Shard(1),), tp.down.weight.grad.placements
    if bias:
        assert tp.up.bias.grad.placements == (Shard(0),), tp.up.bias.grad.placements
        assert tp.down.bias.grad.placements == (Replicate(),), tp.down.bias.grad.placements


@scenario
def tp_mlp(ctx: Context) -> None:
    _tp_mlp(ctx, bias=False, fused=False)


@scenario
def tp_mlp_bias_fused_silu(ctx: Context) -> None:
    _tp_mlp(ctx, bias=True, fused=True)


@scenario
def tp_mlp_sequence_parallel(ctx: Context) -> None:
    """Sequence parallelism: activations sharded on the sequence dim between the blocks.
    The plan's styles gather and reduce-scatter; the gemmt ops see the TP layouts."""
    plan = {"gate": ColwiseParallel(input_layouts=Shard(1)),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))}
    ref = make_mlp(ctx, bias=True, fused=True)
    sp = parallelize_module(make_mlp(ctx, bias=True, fused=True), ctx.mesh, plan)
    x = ctx.randn(2, 2 * ctx.world, 16, seed=23)
    x_ref = x.clone().requires_grad_()
    x_sp = x.chunk(ctx.world, dim=1)[ctx.rank].clone().requires_grad_()
    with CommDebugMode() as fwd:
        out = sp(x_sp)
    # gate and up each gather the sequence; down reduce-scatters its partial sums.
    expect_comms(fwd, {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 1}, "SP forward")
    out_ref = ref(x_ref)
    assert_close(out, out_ref.chunk(ctx.world, dim=1)[ctx.rank], "SP output")
    grad_out = ctx.randn(*out_ref.shape, seed=24)
    out_ref.backward(grad_out)
    out.backward(grad_out.chunk(ctx.world, dim=1)[ctx.rank])
    assert_close(x_sp.grad, x_ref.grad.chunk(ctx.world, dim=1)[ctx.rank], "SP grad of x")
    got = full_grads(sp)
    for name, g in full_grads(ref).items():
        assert_close(got[name], g, f"SP grad of {name}")


@scenario
def tp_rowwise_activation_refused(ctx: Context) -> None:
    layer = parallelize_module(gemmt.nn.Linear(16, 8, activation="relu").to(ctx.device),
                               ctx.mesh, RowwiseParallel())
    # RowwiseParallel takes this rank's shard of the input features.
    x = ctx.randn(4, 16, seed=3).chunk(ctx.world, dim=-1)[ctx.rank]
    try:
        layer(x)
    except RuntimeError as exc:
        text = str(exc)
        for part in ("gemmt.linear: no sharding rule", "activation='relu'",
                     "x=S(1), weight=S(1)", "column-wise: x=R, weight=S(0)",
                     "only for activation='none'", "DTensor.redistribute"):
            if part not in text:
                raise AssertionError(f"error lacks {part!r}:\n{text}") from exc
        return
    raise AssertionError("row-wise Linear with an activation ran")


# ---------------------------------------------------------------------------------------
# Placements and collectives of the rules


def _dt(ctx: Context, t: torch.Tensor, placement: object) -> DTensor:
    return distribute_tensor(t, ctx.mesh, [placement])


@scenario
def mm_rules(ctx: Context) -> None:
    a, b = ctx.randn(8, 12, seed=4), ctx.randn(12, 8, seed=5)
    R, P = Replicate(), Partial()
    cases = [  # a, b -> output
        (R, R, R), (Shard(0), R, Shard(0)), (R, Shard(1), Shard(1)), (Shard(1), Shard(0), P),
        # Replicate b is sliced locally to Shard(1): no data moves.
        (R, Shard(0), P),
    ]
    for pa, pb, pout in cases:
        da, db = _dt(ctx, a, pa), _dt(ctx, b, pb)
        with CommDebugMode() as mode:
            out = gemmt.mm(da, db)
        expect_comms(mode, {}, f"mm({pa}, {pb})")
        if out.placements != (pout,):
            raise AssertionError(f"mm({pa}, {pb}) gave {out.placements}, expected {pout}")
        assert_close(out, a @ b, f"mm({pa}, {pb})")
    # A partial sum in a: the products sum to the product, still Partial.
    pa = DTensor.from_local(a / ctx.world, ctx.mesh, [P])
    db = _dt(ctx, b, R)
    with CommDebugMode() as mode:
        out = gemmt.mm(pa, db)
    expect_comms(mode, {}, "mm(Partial, Replicate)")
    assert out.placements == (P,), out.placements
    assert_close(out, a @ b, "mm(Partial, Replicate)")


@scenario
def linear_rules(ctx: Context) -> None:
    n = ctx.world  # every sharded dim a multiple of the world size
    x, w, b = ctx.randn(n, 2 * n, 3 * n, seed=6), ctx.randn(2 * n, 3 * n, seed=7), ctx.randn(
        2 * n, seed=8)
    R, P = Replicate(), Partial()
    cases = [  # x, weight, bias, activation -> output
        (R, R, R, "gelu", R),
        (R, Shard(0), Shard(0), "silu", Shard(2)),
        (Shard(0), R, R, "relu", Shard(0)),
        (Shard(1), R, R, "gelu_tanh", Shard(1)),
        (Shard(2), Shard(1), R, "none", P),  # bias R -> Partial: added on one rank
    ]
    act = {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
           "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
    for px, pw, pb, activation, pout in cases:
        what = f"linear({px}, {pw}, {pb}, {activation})"
        dx, dw, db = _dt(ctx, x, px), _dt(ctx, w, pw), _dt(ctx, b, pb)
        with CommDebugMode() as mode:
            out = gemmt.linear(dx, dw, db, activation)
        expect_comms(mode, {}, what)
        if out.placements != (pout,):
            raise AssertionError(f"{what} gave {out.placements}, expected {pout}")
        with CommDebugMode() as mode:
            full = out.full_tensor()
        expect_comms(mode, {"all_reduce": 1} if pout == P else
                     {} if pout == R else {"all_gather_into_tensor": 1}, f"{what} gather")
        assert_close(full, act[activation](x @ w.T + b), what)
    # DTensor caches sharding decisions by placements: the activation must be part of the
    # key, or the row-wise decision of the "none" call above would be reused here. Given
    # positionally and by keyword (which DTensor keys separately).
    dx, dw, db = _dt(ctx, x, Shard(2)), _dt(ctx, w, Shard(1)), _dt(ctx, b, R)
    for call in (lambda: gemmt.linear(dx, dw, db, "relu"),
                 lambda: torch.ops.gemmt.linear(dx, dw, db, activation="gelu"),
                 lambda: torch.ops.gemmt.linear(dx, dw, bias=db, activation="silu")):
        try:
            call()
        except RuntimeError as exc:
            if "only for activation='none'" not in str(exc):
                raise AssertionError(f"unclear error: {exc}") from exc
        else:
            raise AssertionError("row-wise linear with an activation reused a cached decision")
    out = torch.ops.gemmt.linear(dx, dw, bias=db, activation="none")
    assert out.placements == (P,), out.placements
    assert_close(out, x @ w.T + b, "row-wise linear, keyword arguments")
    # A partial sum in, a partial sum out (no activation); the bias still counted once.
    dx = _dt(ctx, x, Shard(2)).redistribute(ctx.mesh, [R])
    xp = DTensor.from_local(dx.to_local() / ctx.world, ctx.mesh, [P])
    dw, db = _dt(ctx, w, R), _dt(ctx, b, R)
    with CommDebugMode() as mode:
        out = gemmt.linear(xp, dw, db)
    expect_comms(mode, {}, "linear(Partial x)")
    assert out.placements == (P,), out.placements
    assert_close(out, x @ w.T + b, "linear(Partial x)")


@scenario
def linear_backward_rules(ctx: Context) -> None:
    x, w, b = ctx.randn(6, 12, seed=9), ctx.randn(8, 12, seed=10), ctx.randn(8, seed=11)
    R = Replicate()
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    F.gelu(xr @ wr.T + br).square().sum().backward()
    for px, pw, pb in [(R, Shard(0), Shard(0)), (Shard(0), R, R)]:
        dx, dw, db = (_dt(ctx, t, p).requires_grad_() for t, p in ((x, px), (w, pw), (b, pb)))
        out = gemmt.linear(dx, dw, db, "gelu")
        loss = gemmt.square(out).sum()
        loss.backward()
        what = f"linear backward ({px}, {pw}, {pb})"
        assert_close(dx.grad, xr.grad, f"{what}: grad x")
        assert_close(dw.grad, wr.grad, f"{what}: grad weight")
        assert_close(db.grad, br.grad, f"{what}: grad bias")


@scenario
def linear_double_backward(ctx: Context) -> None:
    """Second derivatives (create_graph): the recorded backward of linear runs on DTensors."""
    x, w, b = ctx.randn(6, 12, seed=25), ctx.randn(8, 12, seed=26), ctx.randn(8, seed=27)
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    (gxr,) = torch.autograd.grad(F.silu(xr @ wr.T + br).sum(), xr, create_graph=True)
    gxr.square().sum().backward()
    R = Replicate()
    for px, pw, pb in [(R, Shard(0), Shard(0)), (Shard(0), R, R)]:
        dx, dw, db = (_dt(ctx, t, p).requires_grad_() for t, p in ((x, px), (w, pw), (b, pb)))
        (gx,) = torch.autograd.grad(gemmt.linear(dx, dw, db, "silu").sum(), dx,
                                    create_graph=True)
        gx.square().sum().backward()
        what = f"double backward ({px}, {pw}, {pb})"
        assert_close(dw.grad, wr.grad, f"{what}: grad weight")
        assert_close(db.grad, br.grad, f"{what}: grad bias")


@scenario
def elementwise_rules(ctx: Context) -> None:
    a, b = ctx.randn(4, 6, seed=12), ctx.randn(4, 6, seed=13)
    P = Partial()
    for p in (Replicate(), Shard(0), Shard(1)):
        da, db = _dt(ctx, a, p), _dt(ctx, b, p)
        with CommDebugMode() as mode:
            outs = {"add": gemmt.add(da, db), "scale": gemmt.scale(da, 3.0),
                    "square": gemmt.square(da)}
        expect_comms(mode, {}, f"elementwise on {p}")
        for name, out in outs.items():
            assert out.placements == (p,), (name, p, out.placements)
        assert_close(outs["add"], a + b, f"add on {p}")
        assert_close(outs["scale"], a * 3.0, f"scale on {p}")
        assert_close(outs["square"], a * a, f"square on {p}")
    pa = DTensor.from_local(a / ctx.world, ctx.mesh, [P])
    pb = DTensor.from_local(b / ctx.world, ctx.mesh, [P])
    out = gemmt.scale(gemmt.add(pa, pb), 2.0)
    assert out.placements == (P,), out.placements
    assert_close(out, (a + b) * 2.0, "add and scale of partial sums")
    # Image ops: any dim but the channels.
    gen = torch.Generator().manual_seed(22)
    img = torch.randint(0, 256, (2 * ctx.world, 5, 3), generator=gen, dtype=torch.uint8).to(
        ctx.device)
    gray = gemmt.rgb_to_gray(_dt(ctx, img, Shard(0)))
    assert gray.placements == (Shard(0),), gray.placements
    assert torch.equal(gray.full_tensor(), gemmt.rgb_to_gray(img))
    vol = gemmt.normalize_volume(_dt(ctx, img, Shard(1)), 255.0)
    assert vol.placements == (Shard(1),), vol.placements
    assert torch.equal(vol.full_tensor(), gemmt.normalize_volume(img, 255.0))
    try:
        gemmt.rgb_to_gray(_dt(ctx, img, Shard(2)))
    except RuntimeError as exc:
        if "gemmt.rgb_to_gray: no sharding rule" not in str(exc):
            raise AssertionError(f"unclear error: {exc}") from exc
    else:
        raise AssertionError("rgb_to_gray sharded on its channels ran")
    try:
        gemmt.square(pa)
    except RuntimeError as exc:
        if "gemmt.square: no sharding rule" not in str(exc) or "x=P(sum)" not in str(exc):
            raise AssertionError(f"unclear error: {exc}") from exc
    else:
        raise AssertionError("square of a partial sum ran")


@scenario
def gemm_in_place(ctx: Context) -> None:
    a, b, c = ctx.randn(8, 12, seed=14), ctx.randn(12, 6, seed=15), ctx.randn(8, 6, seed=16)
    expected = 2.0 * a @ b - 0.5 * c
    for pc, pa, pb in [(Shard(0), Shard(0), Replicate()), (Shard(1), Replicate(), Shard(1))]:
        dc = _dt(ctx, c, pc)
        local = dc.to_local()
        da, db = _dt(ctx, a, pa), _dt(ctx, b, pb)
        with CommDebugMode() as mode:
            gemmt.gemm(dc, da, db, 2.0, -0.5)
        expect_comms(mode, {}, f"gemm into {pc}")
        if dc.to_local().data_ptr() != local.data_ptr() or dc.placements != (pc,):
            raise AssertionError("gemm did not write into c's own shard")
        assert_close(dc, expected, f"gemm into {pc}")
    # c replicated, a product split over K: the result would be a partial sum, which c,
    # written in place, cannot become.
    try:
        gemmt.gemm(_dt(ctx, c, Replicate()), _dt(ctx, a, Shard(1)), _dt(ctx, b, Shard(0)))
    except RuntimeError as exc:
        if "gemmt.gemm: no sharding rule" not in str(exc):
            raise AssertionError(f"unclear error: {exc}") from exc
    else:
        raise AssertionError("gemm into a replicated c from split-K inputs ran")


@scenario
def no_rule_is_an_error(ctx: Context) -> None:
    # Batch-sharded x and column-sharded weight: either would have to be gathered.
    x, w = ctx.randn(4, 8, seed=17), ctx.randn(6, 8, seed=18)
    dx, dw = _dt(ctx, x, Shard(0)), _dt(ctx, w, Shard(0))
    with CommDebugMode() as mode:
        try:
            gemmt.linear(dx, dw)
        except RuntimeError as exc:
            text = str(exc)
            for part in ("gemmt.linear: no sharding rule", "x=S(0), weight=S(0)",
                         "row-wise: x=S(1), weight=S(1) -> P(sum)", "DTensor.redistribute"):
                if part not in text:
                    raise AssertionError(f"error lacks {part!r}:\n{text}") from exc
        else:
            raise AssertionError("linear(Shard(0), Shard(0)) ran")
    expect_comms(mode, {}, "refused linear")
    # Batch rule, but fewer rows than ranks: DTensor skips a rule that leaves a rank an
    # empty shard and would gather instead.
    small = _dt(ctx, ctx.randn(ctx.world - 1, 8, seed=21), Shard(0))
    dw = _dt(ctx, w, Replicate())
    with CommDebugMode() as mode:
        try:
            gemmt.linear(small, dw)
        except RuntimeError as exc:
            if "fewer elements than shards" not in str(exc):
                raise AssertionError(f"unclear error: {exc}") from exc
        else:
            raise AssertionError("linear of a batch smaller than the mesh ran")
    expect_comms(mode, {}, "refused small batch")
    try:
        gemmt.mm(_dt(ctx, x, Shard(0)), _dt(ctx, w.T.contiguous(), Shard(1)))
    except RuntimeError as exc:
        if "gemmt.mm: no sharding rule" not in str(exc):
            raise AssertionError(f"unclear error: {exc}") from exc
    else:
        raise AssertionError("mm(Shard(0), Shard(1)) ran")


# ---------------------------------------------------------------------------------------
# FSDP2, alone and with tensor parallelism


def _train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]
           ) -> list[torch.Tensor]:
    """A few SGD steps with momentum (its buffer is optimizer state, sharded like the
    parameters under FSDP2). Plain SGD rather than Adam: Adam divides each gradient by its
    own magnitude, which turns the rounding of a near-zero gradient (summed in another order
    when sharded) into a visible difference of the update."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, target in batches:
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _check_steps(ctx: Context, model: nn.Module, tp_mesh: DeviceMesh | None,
                 dp_mesh: DeviceMesh) -> None:
    """Training steps of ``model`` under FSDP2 (and TP) match those of one process."""
    from torch.distributed.fsdp import fully_shard

    ref = make_mlp(ctx, bias=True, fused=True)
    batches = [(ctx.randn(8, 3, 16, seed=19 + 2 * i), ctx.randn(8, 3, 16, seed=20 + 2 * i))
               for i in range(2)]
    ref_losses = _train(ref, batches)
    if tp_mesh is not None:
        parallelize_module(model, tp_mesh, TP_PLAN)
    for layer in (model.gate, model.up, model.down):
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    # Each data-parallel rank trains on its part of the batch; FSDP averages the gradients,
    # which is the full batch's gradient of a mean loss.
    dp_rank, dp_size = dp_mesh.get_local_rank(), dp_mesh.size()
    losses = _train(model, [(x.chunk(dp_size)[dp_rank], t.chunk(dp_size)[dp_rank])
                            for x, t in batches])
    for step, (loss, ref_loss) in enumerate(zip(losses, ref_losses)):
        dist.all_reduce(loss, group=dp_mesh.get_group())
        assert_close(loss / dp_size, ref_loss, f"loss of step {step}")
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor), (name, type(p))
        assert_close(p.full_tensor(), ref_params[name].detach(), f"updated {name}")


@scenario
def fsdp_step(ctx: Context) -> None:
    _check_steps(ctx, make_mlp(ctx, bias=True, fused=True), None, ctx.mesh)


@scenario
def tp_fsdp_2d_step(ctx: Context) -> None:
    if ctx.world % 2 or ctx.world < 4:
        return  # a 2-D mesh needs 2 x 2 ranks at least
    mesh = init_device_mesh(ctx.device, (ctx.world // 2, 2), mesh_dim_names=("dp", "tp"))
    _check_steps(ctx, make_mlp(ctx, bias=True, fused=True), mesh["tp"], mesh["dp"])


def _float8_mlp(ctx: Context, recipe: str) -> nn.Module:
    """The MLP with every Linear a ``Float8Linear`` of ``recipe``, the same initial weights on
    every rank (blockwise contracts 128-wide blocks, so its features are multiples of 128)."""
    torch.manual_seed(5)
    dim, hidden = (128, 256) if recipe == "blockwise" else (16, 32)
    mlp = MLP(dim, hidden, bias=True, fused=True).to(ctx.device)
    return gemmt.nn.convert_to_float8(mlp, recipe)


@scenario
def fsdp_float8_step(ctx: Context) -> None:
    """Float8Linear layers under FSDP2, every recipe: two SGD steps with each rank on its part
    of the batch equal those of one process that runs the same parts one after the other and
    averages their gradients. Both quantise each part on its own (dynamic scales: the amax of
    that part's activations and gradients) and the weight whole (FSDP2 gathers it for the
    forward), so they differ only in the order the parts' gradients are summed. The parts'
    losses are divided by the world size, a power of two, which leaves every FP8 value of
    the backward as it is (only the scales move)."""
    from torch.distributed.fsdp import fully_shard

    dp = ctx.world
    rank = ctx.mesh.get_local_rank()
    for recipe in gemmt.nn.FLOAT8_RECIPES:
        ref, model = _float8_mlp(ctx, recipe), _float8_mlp(ctx, recipe)
        if not all(isinstance(m, gemmt.nn.Float8Linear) for m in (ref.gate, ref.up, ref.down)):
            raise AssertionError(f"{recipe}: the MLP's layers were not converted")
        dim = ref.gate.in_features
        batches = [(ctx.randn(2 * dp, 3, dim, seed=60 + 2 * i),
                    ctx.randn(2 * dp, 3, dim, seed=61 + 2 * i)) for i in range(2)]
        opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        ref_losses = []
        for x, target in batches:
            total = torch.zeros((), device=ctx.device)
            for xc, tc in zip(x.chunk(dp), target.chunk(dp)):
                loss = F.mse_loss(ref(xc), tc) / dp
                loss.backward()
                total += loss.detach()
            opt.step()
            opt.zero_grad()
            ref_losses.append(total)
        for layer in (model.gate, model.up, model.down):
            fully_shard(layer, mesh=ctx.mesh)
        fully_shard(model, mesh=ctx.mesh)
        losses = _train(model, [(x.chunk(dp)[rank], t.chunk(dp)[rank]) for x, t in batches])
        for step, (loss, ref_loss) in enumerate(zip(losses, ref_losses)):
            dist.all_reduce(loss)
            assert_close(loss / dp, ref_loss, f"{recipe}: loss of step {step}")
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            assert isinstance(p, DTensor), (recipe, name, type(p))
            assert_close(p.full_tensor(), ref_params[name].detach(), f"{recipe}: updated {name}")


# ---------------------------------------------------------------------------------------


@scenario
def grouped_mm_rules(ctx: Context) -> None:
    n = ctx.world  # every sharded dim a multiple of the world size
    R, P = Replicate(), Partial()
    offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32, device=ctx.device)
    a, b = ctx.randn(11, 4 * n, seed=40), ctx.randn(4, 4 * n, 2 * n, seed=41)
    bias = ctx.randn(4, 2 * n, seed=42)
    d_offs = _dt(ctx, offs, R)
    cases = [  # a, b, bias -> output (the bias's placement as DTensor is given it)
        (R, R, R, R), (R, Shard(2), Shard(1), Shard(1)), (Shard(1), Shard(1), R, P),
    ]
    for pa, pb, pbias, pout in cases:
        da, db, dbias = _dt(ctx, a, pa), _dt(ctx, b, pb), _dt(ctx, bias, pbias)
        with CommDebugMode() as mode:
            out = gemmt.grouped_mm(da, db, d_offs, dbias)
        what = f"grouped_mm({pa}, {pb}, bias {pbias})"
        expect_comms(mode, {}, what)
        if out.placements != (pout,):
            raise AssertionError(f"{what} gave {out.placements}, expected {pout}")
        assert_close(out, gemmt.grouped_mm(a, b, offs, bias), what)
    # Two 3-D operands split by group.
    a3, b3 = ctx.randn(2 * n, 3, 5, seed=43), ctx.randn(2 * n, 5, 4, seed=44)
    da3, db3 = _dt(ctx, a3, Shard(0)), _dt(ctx, b3, Shard(0))
    with CommDebugMode() as mode:
        out = gemmt.grouped_mm(da3, db3)
    expect_comms(mode, {}, "grouped_mm by group")
    assert out.placements == (Shard(0),), out.placements
    assert_close(out, gemmt.grouped_mm(a3, b3), "grouped_mm by group")


def main(argv: list[str] | None = None,
         scenarios: dict[str, Callable[[Context], None]] | None = None) -> int:
    """Run ``scenarios`` (default: this file's) in this process, one rank of the group."""
    scenarios = SCENARIOS if scenarios is None else scenarios
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--store", required=True, help="path of the FileStore shared by ranks")
    parser.add_argument("--out", required=True, help="folder for rank<r>.json")
    parser.add_argument("--timeout", type=float, default=60.0, help="collective timeout (s)")
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    args = parser.parse_args(argv)

    device = "cuda" if args.backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(args.rank % torch.cuda.device_count())
    store = dist.FileStore(args.store, args.world_size)
    dist.init_process_group(args.backend, store=store, rank=args.rank,
                            world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.timeout))
    results: dict[str, str] = {}
    out = Path(args.out) / f"rank{args.rank}.json"
    completed = False
    try:
        ctx = Context(device)
        for name, fn in scenarios.items():
            if args.only and name not in args.only:
                continue
            try:
                fn(ctx)
                results[name] = "ok"
            except Exception:  # reported per scenario, the others still run
                results[name] = traceback.format_exc()
            out.write_text(json.dumps(results, indent=1))
        completed = True
    finally:
        out.write_text(json.dumps(results, indent=1))
        gemmt.distributed.leave_process_group(completed)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
