"""Modules: :class:`Linear`, a drop-in for :class:`torch.nn.Linear` that runs gemmt's
kernels, and :func:`replace_linear`, which swaps the Linear layers of an existing model.
FP8: :class:`Float8Linear` (defined in ``gemmt._float8``) and :func:`convert_to_float8`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from gemmt._float8 import FLOAT8_RECIPES, Float8Linear, float8_eligible
from gemmt._shapes import unfold_rows
from gemmt.ops import ACTIVATIONS, linear

__all__ = ["Linear", "replace_linear"]
__all__ += ["Float8Linear", "convert_to_float8", "float8_eligible", "FLOAT8_RECIPES"]


def _check_activation(activation: str) -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"gemmt.nn.Linear: argument 'activation' expected one of {', '.join(ACTIVATIONS)}, "
            f"got {activation!r}")
    return activation


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose forward is :func:`gemmt.linear`.

    Same constructor, parameters (``weight`` of shape ``(out_features, in_features)``,
    ``bias``), initialisation and ``state_dict`` keys as ``torch.nn.Linear``, so checkpoints
    load either way and code that checks ``isinstance(m, torch.nn.Linear)`` (tensor
    parallelism, FSDP wrapping policies) treats it as one. The keyword ``activation`` fuses an
    activation into the product's epilogue: ``Linear(4096, 11008, activation="silu")``
    computes ``silu(x @ W.T + b)`` in one pass.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 *, activation: str = "none") -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = _check_activation(activation)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch.nn.Linear's name
        return linear(input, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text if self.activation == "none" else f"{text}, activation={self.activation}"

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, activation: str = "none") -> Linear:
        """A gemmt Linear that shares ``module``'s parameters, buffers and hooks (no copy):
        an optimizer built on the old parameters keeps updating the new layer."""
        if not isinstance(module, torch.nn.Linear):
            raise TypeError(f"gemmt.nn.Linear.from_linear: argument 'module' expected a "
                            f"torch.nn.Linear, got {type(module).__name__}")
        new = cls.__new__(cls)
        new.__dict__.update(module.__dict__)
        new.activation = _check_activation(activation)
        return new


def replace_linear(model: torch.nn.Module,
                   include: Callable[[str, torch.nn.Linear], bool] | None = None
                   ) -> torch.nn.Module:
    """Swap, in place, every ``torch.nn.Linear`` inside ``model`` for a :class:`Linear` that
    shares its parameters, and return ``model``.

    Only layers whose type is exactly ``torch.nn.Linear`` are swapped: subclasses (quantised
    or otherwise specialised layers) keep their own forward. ``include(name, module)`` can
    narrow the choice further (names as in ``model.named_modules()``). The parameters, their
    names and the ``state_dict`` stay the same. When ``model`` is itself a
    ``torch.nn.Linear``, a new :class:`Linear` sharing its parameters is returned instead.
    """
    if type(model) is torch.nn.Linear:
        return Linear.from_linear(model) if include is None or include("", model) else model
    targets: list[tuple[torch.nn.Module, str, torch.nn.Linear]] = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            if type(child) is not torch.nn.Linear:
                continue
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if include is None or include(full, child):
                targets.append((parent, child_name, child))
    for parent, child_name, child in targets:
        setattr(parent, child_name, Linear.from_linear(child))
    return model


def convert_to_float8(model: torch.nn.Module, recipe: str = "tensorwise",
                      inference: bool = False,
                      include: Callable[[str, torch.nn.Linear], bool] | None = None,
                      fast_accum: bool | None = None) -> torch.nn.Module:
    """Swap, in place, the Linear layers of ``model`` for :class:`Float8Linear` layers that
    share their parameters, and return ``model``.

    Converted: modules whose type is exactly ``torch.nn.Linear`` or :class:`gemmt.nn.Linear`
    (whose fused activation is kept) and that :func:`float8_eligible` accepts: both feature
    counts multiples of 16, of 128 for "blockwise". Other layers (the usual odd-sized output
    heads, subclasses with their own forward) are left as they are. ``include(name, module)``
    narrows the choice further (names as in ``model.named_modules()``). ``recipe``,
    ``inference`` and ``fast_accum`` are :class:`Float8Linear`'s. When ``model`` is itself such a Linear, the new
    layer is returned.
    """
    if recipe not in FLOAT8_RECIPES:
        raise ValueError(f"gemmt.nn.convert_to_float8: argument 'recipe' expected one of "
                         f"{', '.join(FLOAT8_RECIPES)}, got {recipe!r}")

    def wanted(name: str, module: torch.nn.Module) -> bool:
        return (type(module) in (torch.nn.Linear, Linear)
                and float8_eligible(module, recipe)  # type: ignore[arg-type]
                and (include is None or include(name, module)))  # type: ignore[arg-type]

    if wanted("", model):
        return Float8Linear.from_linear(model, recipe, inference,  # type: ignore[arg-type]
                                        fast_accum=fast_accum)
    targets: list[tuple[torch.nn.Module, str, torch.nn.Linear]] = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if wanted(full, child):
                targets.append((parent, child_name, child))  # type: ignore[arg-type]
    for parent, child_name, child in targets:
        setattr(parent, child_name,
                Float8Linear.from_linear(child, recipe, inference, fast_accum=fast_accum))
    return model

# ---- Mixture of experts ----

import math  # noqa: E402 - kept with the section that uses it

from gemmt.moe import float8_experts, quantize_experts  # noqa: E402
from gemmt.moe_parallel import expert_parallel_experts  # noqa: E402
from gemmt.ops import MoERouting, moe_experts, moe_route  # noqa: E402

__all__ += ["MoE", "ExpertParallelMoE", "Float8MoE"]


def _route(module: MoE | ExpertParallelMoE | Float8MoE, flat: Tensor) -> tuple[MoERouting, Tensor]:
    """The router of both MoE modules: ``moe_route`` on the gate's logits, and the routing
    weights scaled by ``routed_scaling_factor``."""
    logits = linear(flat, module.gate.weight)
    routing = moe_route(logits, module.top_k, module.score, module.renormalize, module.n_group,
                        module.topk_group, module.e_score_correction_bias)
    weights = routing.weights
    if module.routed_scaling_factor != 1.0:
        weights = weights * module.routed_scaling_factor
    return routing, weights


def _check_router_args(name: str, num_experts: int, top_k: int, score: str) -> None:
    """The router arguments every MoE layer takes, refused with the layer's name."""
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"{name}: argument 'top_k' expected 1 <= top_k <= num_experts "
                         f"({num_experts}), got {top_k}")
    if score not in ("softmax", "sigmoid"):
        raise ValueError(f"{name}: argument 'score' expected 'softmax' or 'sigmoid', got "
                         f"{score!r}")


def _init_router_and_experts(module: torch.nn.Module, hidden_size: int, intermediate_size: int,
                             num_experts: int, experts_held: int, correction_bias: bool,
                             factory: dict[str, Any]) -> None:
    """The router over all ``num_experts`` and the weights of the ``experts_held`` experts
    this module computes (uninitialised: reset_parameters draws them)."""
    module.gate = torch.nn.Linear(hidden_size, num_experts, bias=False, **factory)
    module.gate_up_proj = torch.nn.Parameter(
        torch.empty(experts_held, 2 * intermediate_size, hidden_size, **factory))
    module.down_proj = torch.nn.Parameter(
        torch.empty(experts_held, hidden_size, intermediate_size, **factory))
    if correction_bias:
        module.register_buffer("e_score_correction_bias",
                               torch.zeros(num_experts, device=factory["device"],
                                           dtype=torch.float32))
    else:
        module.e_score_correction_bias = None


class MoE(torch.nn.Module):
    """A mixture-of-experts feed-forward layer: a router and SwiGLU experts.

    Each token's ``top_k`` experts are chosen by :func:`gemmt.moe_route` from the logits of
    ``gate`` (a bias-free ``torch.nn.Linear(hidden_size, num_experts)``) and run by
    :func:`gemmt.moe_experts`. The expert weights use transformers' layout:
    ``gate_up_proj`` ``(num_experts, 2 * intermediate_size, hidden_size)`` (gate rows first,
    then up rows) and ``down_proj`` ``(num_experts, hidden_size, intermediate_size)``.

    ``score``, ``renormalize``, ``n_group`` and ``topk_group`` are :func:`gemmt.moe_route`'s;
    ``correction_bias=True`` adds the buffer ``e_score_correction_bias`` (DeepSeek-V3's
    load-balancing bias, zeros until set) and ``routed_scaling_factor`` multiplies the
    routing weights. Input ``(..., hidden_size)``, output of the same shape and dtype.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 *, score: str = "softmax", renormalize: bool = True, n_group: int = 0,
                 topk_group: int = 0, correction_bias: bool = False,
                 routed_scaling_factor: float = 1.0, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        _check_router_args("gemmt.nn.MoE", num_experts, top_k, score)
        factory = {"device": device, "dtype": dtype}
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k = num_experts, top_k
        self.score, self.renormalize = score, renormalize
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor = routed_scaling_factor
        _init_router_and_experts(self, hidden_size, intermediate_size, num_experts, num_experts,
                                 correction_bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each expert's matrices drawn as ``torch.nn.Linear`` draws its weight."""
        self.gate.reset_parameters()
        with torch.no_grad():
            for weight, fan_in in ((self.gate_up_proj, self.hidden_size),
                                   (self.down_proj, self.intermediate_size)):
                bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                weight.uniform_(-bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.hidden_size)
        routing, weights = _route(self, flat)
        out = moe_experts(flat, self.gate_up_proj, self.down_proj, weights, routing.expert_ids,
                          routing.token_order, routing.offsets)
        return unfold_rows(out, x.shape)

    def extra_repr(self) -> str:
        text = (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, score={self.score}")
        if self.n_group:
            text += f", n_group={self.n_group}, topk_group={self.topk_group}"
        return text


class Float8MoE(torch.nn.Module):
    """:class:`MoE` for inference with float8 experts: :meth:`from_moe` keeps the layer's
    router and quantises its expert weights once (e4m3, a scale per output row of each
    expert); each call quantises the tokens (a scale per token) and runs the experts with
    :func:`gemmt.moe.float8_experts` (FP8 grouped products, :func:`gemmt.scaled_grouped_mm`).

    The weights are buffers, not parameters, and the layer is not differentiable: convert a
    trained layer for serving. Input ``(..., hidden_size)``, output of the same shape and dtype.
    """

    def __init__(self, moe: MoE) -> None:
        super().__init__()
        for name in ("hidden_size", "intermediate_size", "num_experts", "top_k", "score",
                     "renormalize", "n_group", "topk_group", "routed_scaling_factor"):
            setattr(self, name, getattr(moe, name))
        self.gate = moe.gate
        bias = moe.e_score_correction_bias
        if bias is not None:
            self.register_buffer("e_score_correction_bias", bias.detach().clone())
        else:
            self.e_score_correction_bias = None
        with torch.no_grad():
            for name in ("gate_up_proj", "down_proj"):
                q, scale = quantize_experts(getattr(moe, name).detach())
                self.register_buffer(f"{name}_fp8", q)
                self.register_buffer(f"{name}_scale", scale)

    @classmethod
    def from_moe(cls, moe: MoE) -> Float8MoE:
        """The float8 inference form of ``moe`` (which is left unchanged)."""
        return cls(moe)

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("gemmt.nn.Float8MoE: inference only (its float8 experts are not "
                               "differentiable); call it under torch.no_grad() or on a "
                               "detached input")
        flat = x.reshape(-1, self.hidden_size)
        routing, weights = _route(self, flat)
        out = float8_experts(flat, self.gate_up_proj_fp8, self.gate_up_proj_scale,
                             self.down_proj_fp8, self.down_proj_scale, weights,
                             routing.expert_ids, routing.token_order, routing.offsets)
        return unfold_rows(out, x.shape)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, experts=float8_e4m3fn")


class ExpertParallelMoE(torch.nn.Module):
    """:class:`MoE` with its experts split across the ranks of a process group (expert
    parallelism): rank ``r`` of ``W`` holds experts ``[r * E / W, (r + 1) * E / W)``.

    Each rank runs the module on its own tokens. The router ``gate`` (and the buffer
    ``e_score_correction_bias``) is replicated: it routes over all ``num_experts`` experts,
    and must be the same on every rank (:meth:`from_moe` copies one; otherwise seed every
    rank alike or load the same checkpoint). ``gate_up_proj`` ``(E / W, 2 * I, H)`` and
    ``down_proj`` ``(E / W, H, I)`` hold the local experts only. The experts run through
    :func:`gemmt.moe_parallel.expert_parallel_experts` (all-to-all of the routed tokens), so
    every rank of ``group`` must call forward, and backward, together.

    Gradients: the local experts' are complete (they include every rank's tokens); the
    router's cover this rank's tokens only, and are summed over the ranks as data-parallel
    gradients are (an all-reduce, DDP or FSDP on the router). The other arguments are
    :class:`MoE`'s; ``num_experts`` must be a multiple of the group's size.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 *, group: Any = None, score: str = "softmax", renormalize: bool = True,
                 n_group: int = 0, topk_group: int = 0, correction_bias: bool = False,
                 routed_scaling_factor: float = 1.0, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        import torch.distributed as dist

        name = "gemmt.nn.ExpertParallelMoE"
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(f"{name}: needs an initialised torch.distributed process group "
                               f"(torch.distributed.init_process_group)")
        world = dist.get_world_size(group)
        if num_experts < 1 or num_experts % world:
            raise ValueError(f"{name}: argument 'num_experts' expected a positive multiple of "
                             f"the group's size ({world}), so that every rank holds as many "
                             f"experts, got {num_experts}")
        _check_router_args(name, num_experts, top_k, score)
        factory = {"device": device, "dtype": dtype}
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), world
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k = num_experts, top_k
        self.num_local_experts = num_experts // world
        self.first_expert = self.rank * self.num_local_experts
        self.score, self.renormalize = score, renormalize
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor = routed_scaling_factor
        _init_router_and_experts(self, hidden_size, intermediate_size, num_experts,
                                 self.num_local_experts, correction_bias, factory)
        self.reset_parameters()

    reset_parameters = MoE.reset_parameters

    @classmethod
    def from_moe(cls, moe: MoE, group: Any = None) -> ExpertParallelMoE:
        """This rank's shard of ``moe``: a copy of its router (and correction bias) and of
        the experts this rank holds in a group of ``group``'s size. ``moe`` is left as it
        is; called on every rank with the same ``moe``, the ranks together compute what
        ``moe`` computes on all their tokens."""
        if not isinstance(moe, MoE):
            raise TypeError(f"gemmt.nn.ExpertParallelMoE.from_moe: argument 'moe' expected a "
                            f"gemmt.nn.MoE, got {type(moe).__name__}")
        import torch.distributed as dist

        world = dist.get_world_size(group) if dist.is_initialized() else 0
        if world and moe.num_experts % world:
            raise ValueError(f"gemmt.nn.ExpertParallelMoE.from_moe: argument 'moe' expected "
                             f"a number of experts divisible by the group's size ({world}), "
                             f"got {moe.num_experts} experts")
        weight = moe.gate_up_proj
        new = cls(moe.hidden_size, moe.intermediate_size, moe.num_experts, moe.top_k,
                  group=group, score=moe.score, renormalize=moe.renormalize,
                  n_group=moe.n_group, topk_group=moe.topk_group,
                  correction_bias=moe.e_score_correction_bias is not None,
                  routed_scaling_factor=moe.routed_scaling_factor, device=weight.device,
                  dtype=weight.dtype)
        local = slice(new.first_expert, new.first_expert + new.num_local_experts)
        with torch.no_grad():
            new.gate.weight.copy_(moe.gate.weight)
            new.gate_up_proj.copy_(moe.gate_up_proj[local])
            new.down_proj.copy_(moe.down_proj[local])
            if moe.e_score_correction_bias is not None:
                new.e_score_correction_bias.copy_(moe.e_score_correction_bias)
        return new

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.hidden_size)
        routing, weights = _route(self, flat)
        out = expert_parallel_experts(flat, weights, routing.expert_ids, self.gate_up_proj,
                                      self.down_proj, self.group)
        return unfold_rows(out, x.shape)

    def extra_repr(self) -> str:
        text = (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, score={self.score}, "
                f"local experts [{self.first_expert}, "
                f"{self.first_expert + self.num_local_experts}) of rank {self.rank}/"
                f"{self.world_size}")
        if self.n_group:
            text += f", n_group={self.n_group}, topk_group={self.topk_group}"
        return text
