"""Typed Python entry points for every gemmt op.

Each function reaches the op ``gemmt::<op>`` through PyTorch's dispatcher: the dispatcher
picks the CPU or CUDA kernel, autograd is registered in C++, and the ops work under
``torch.compile``. In eager mode the call goes through the extension's own binding, which
enters the same dispatcher from C++ and skips the Python-side op lookup of
``torch.ops.gemmt`` (1-3 us a call, as much as a small kernel takes); under
``torch.compile`` and whenever a ``__torch_function__`` override is present (a tensor
subclass or an active mode, which only the Python layer sees) it goes through
``torch.ops.gemmt``.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor
from torch.overrides import has_torch_function

from gemmt import _native, distributed

__all__ = ["gemm", "mm", "linear", "add", "square", "scale", "swiglu", "rgb_to_gray",
           "normalize_volume", "gemm_variants", "ACTIVATIONS"]


def gemm_variants() -> tuple[str, ...]:
    """The names ``gemm(..., variant=...)`` accepts, "auto" first.

    Read from the native library (``include/gemmt/gemm_variant.h`` is the one list), so this
    loads it if the import did not. ``gemmt.GEMM_VARIANTS`` is the same tuple.
    """
    return tuple(_native.load().gemm_variants())


def __getattr__(name: str) -> object:
    # GEMM_VARIANTS is looked up lazily: a source checkout imports gemmt with no library
    # (gemmt.jit loads its own build later).
    if name == "GEMM_VARIANTS":
        return gemm_variants()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ACTIVATIONS: tuple[str, ...] = ("none", "relu", "gelu", "gelu_tanh", "silu")


def _ops() -> torch._ops._OpNamespace:
    _native.load()
    # The path taken by tensor subclasses: a DTensor argument means DTensor is imported, and
    # gemmt's sharding rules must be registered with it before the call.
    distributed.maybe_register()
    return torch.ops.gemmt


def _binding(args: tuple[object, ...]) -> ModuleType | None:
    """The extension module when a call with these arguments may use its binding, else None.

    Only in eager mode (dynamo traces ``torch.ops`` calls, not extension functions) and with
    no ``__torch_function__`` override among the arguments or active as a mode.
    """
    if torch.compiler.is_compiling() or has_torch_function(args):
        return None
    return _native.load()


def gemm(
    c: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0, beta: float = 0.0, *, variant: str = "auto"
) -> None:
    """In place: ``c = alpha * a @ b + beta * c``.

    ``a`` is (M, K), ``b`` is (K, N), ``c`` is (M, N), all float32, float16 or bfloat16
    (float64 too on CPU) on one device; any strides (transposed views need no copy).
    Accumulates in float32. float32 uses exact FP32 arithmetic unless TF32 is allowed
    (``torch.backends.cuda.matmul.allow_tf32`` or a matmul precision below "highest").
    ``variant`` names a specific CUDA kernel (see :func:`gemm_variants`); "auto" picks by shape.
    With ``beta == 0`` the old contents of ``c`` are never read.
    """
    native = _binding((c, a, b))
    if native is not None:
        native.gemm(c, a, b, alpha, beta, variant=variant)
    else:
        _ops().gemm(c, a, b, alpha, beta, variant=variant)


def mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` as a new tensor; differentiable (backward runs gemmt's own GEMM)."""
    native = _binding((a, b))
    return native.mm(a, b) if native is not None else _ops().mm(a, b)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
           activation: str = "none") -> Tensor:
    """``act(x @ weight.T + bias)``, the forward of a Linear layer; differentiable.

    ``x`` is ``(..., in_features)``, ``weight`` ``(out_features, in_features)``, ``bias``
    ``(out_features,)`` or None; one floating dtype, one device. ``activation`` is one of
    ``ACTIVATIONS``: "none", "relu", "gelu" (erf form), "gelu_tanh" (PyTorch's
    ``approximate="tanh"``) or "silu". On CUDA the bias and the activation are applied in the
    GEMM's epilogue (one pass over the output). The backward runs gemmt's kernels: one fused
    pass for the activation's derivative and the bias gradient, then two products. Second
    derivatives are supported (the backward is recorded with ``create_graph=True``).
    """
    native = _binding((x, weight, bias))
    if native is not None:
        return native.linear(x, weight, bias, activation)
    return _ops().linear(x, weight, bias, activation)


def add(a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` for tensors of one shape and dtype (float32/16/bf16); differentiable."""
    native = _binding((a, b))
    return native.add(a, b) if native is not None else _ops().add(a, b)


def square(x: Tensor) -> Tensor:
    """``x * x`` elementwise, any rank; differentiable."""
    native = _binding((x,))
    return native.square(x) if native is not None else _ops().square(x)


def scale(x: Tensor, factor: float = 2.0) -> Tensor:
    """``x * factor`` elementwise; differentiable."""
    native = _binding((x,))
    return native.scale(x, factor) if native is not None else _ops().scale(x, factor)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` elementwise (the gated MLP activation); differentiable.

    ``gate`` and ``up`` share shape, dtype (float32, float16, bfloat16; float64 too on CPU)
    and device. Computed in float32 and rounded once to the dtype.
    """
    return _ops().swiglu(gate, up)


def rgb_to_gray(img: Tensor, bgr: bool = False) -> Tensor:
    """uint8 ``[..., H, W, 3]`` to uint8 ``[..., H, W]`` luma.

    ``round(0.299 R + 0.587 G + 0.114 B)`` with halves rounded up (exact integer
    arithmetic). Pass ``bgr=True`` for images in B, G, R order (as OpenCV reads them).
    """
    native = _binding((img,))
    return native.rgb_to_gray(img, bgr) if native is not None else _ops().rgb_to_gray(img, bgr)


def normalize_volume(vol: Tensor, max_val: float) -> Tensor:
    """uint16 or uint8 volume of any rank to float32 ``vol / max_val``; ``max_val > 0``."""
    native = _binding((vol,))
    if native is not None:
        return native.normalize_volume(vol, max_val)
    return _ops().normalize_volume(vol, max_val)


# ---- Mixture of experts ----
# No extension bindings for these: they go through torch.ops.gemmt (the dispatcher's Python
# entry), whose per-call cost is small beside a grouped product.

from typing import NamedTuple  # noqa: E402 - kept with the section that uses it

__all__ += ["grouped_mm", "moe_permute", "moe_route", "moe_experts", "MoERouting"]


def grouped_mm(a: Tensor, b: Tensor, offs: Tensor | None = None, bias: Tensor | None = None,
               out_dtype: torch.dtype | None = None, activation: str = "none") -> Tensor:
    """Grouped matrix products with the layouts and offsets of ``torch._grouped_mm``.

    ``offs`` holds int32 cumulative group *end* offsets: group ``i`` spans
    ``[offs[i-1], offs[i])`` (``offs[-1]`` taken as 0) of the grouped dimension. Layouts:

    - ``a (M, K)``, ``b (G, K, N)``, ``offs (G,)`` over the rows of ``a`` -> ``(M, N)``: the
      rows of each group times their expert's matrix (tokens sorted by expert).
    - ``a (G, M, K)``, ``b (G, K, N)``, no ``offs`` -> ``(G, M, N)``: a batched product.
    - ``a (M, K)``, ``b (K, N)``, ``offs (G,)`` over ``K`` -> ``(G, M, N)``: one product per
      group of the contraction dimension (the per-expert weight gradient).
    - ``a (G, M, K)``, ``b (K, N)``, ``offs (G,)`` over the columns of ``b`` -> ``(M, N)``.

    Groups may be empty. Rows (or columns) past ``offs[-1]`` belong to no group and are 0.
    ``bias`` ``(G, N)`` (3-D ``b`` only) is added to each group's rows, then ``activation``
    (one of ``ACTIVATIONS``) is applied. ``out_dtype`` may be float32 for float16/bfloat16
    operands. float32, float16, bfloat16 and float64. Differentiable in ``a``, ``b`` and
    ``bias``; each backward product is a grouped product of another layout.
    Only a CPU implementation exists so far: CUDA tensors are refused.
    """
    return _ops().grouped_mm(a, b, offs, bias, out_dtype, activation)


class MoERouting(NamedTuple):
    """What :func:`moe_route` returns.

    ``weights`` ``(T, top_k)`` float32 (float64 for float64 logits), each token's routing
    weights, best expert first; ``expert_ids`` ``(T, top_k)`` int64; ``token_order``
    ``(T * top_k,)`` int64, the flattened ``(token, k)`` slots sorted by expert (stable);
    ``offsets`` ``(num_experts,)`` int32, cumulative slot counts per expert.
    """

    weights: Tensor
    expert_ids: Tensor
    token_order: Tensor
    offsets: Tensor


def moe_route(logits: Tensor, top_k: int, score: str = "softmax", renormalize: bool = True,
              n_group: int = 0, topk_group: int = 0,
              correction_bias: Tensor | None = None) -> MoERouting:
    """Choose each token's ``top_k`` experts from router ``logits`` ``(T, num_experts)``.

    ``score`` is "softmax" (Mixtral, Qwen-MoE) or "sigmoid" (DeepSeek-V3). With
    ``n_group > 0`` the routing is group-limited (DeepSeek-V3): the experts form ``n_group``
    equal groups, a group scores the sum of its two best experts, and only the experts of the
    ``topk_group`` best groups may be chosen. ``correction_bias`` ``(num_experts,)`` is added
    to the scores for the choice only; the weights are the unbiased scores of the chosen
    experts, divided by their sum when ``renormalize``. Scores are computed in float32. Ties
    go to the lowest expert id. ``weights`` is differentiable in ``logits``.
    """
    w, ids, order, offs = _ops().moe_route(logits, top_k, score, renormalize, n_group,
                                           topk_group, correction_bias)
    return MoERouting(w, ids, order, offs)


def moe_permute(expert_ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor]:
    """``(token_order, offsets)`` for routing decisions ``expert_ids`` ``(T, top_k)``.

    ``token_order`` (int64, ``T * top_k``) lists the flattened ``(token, k)`` slots sorted by
    expert, stably; ``offsets`` (int32, ``num_experts``) are the cumulative slot counts, the
    ``offs`` of :func:`grouped_mm`.
    """
    order, offs = _ops().moe_permute(expert_ids, num_experts)
    return order, offs


def moe_experts(x: Tensor, w_gate_up: Tensor, w_down: Tensor, weights: Tensor,
                expert_ids: Tensor, token_order: Tensor, offsets: Tensor) -> Tensor:
    """The routed experts of a mixture-of-experts layer, ``(T, H)`` from ``x`` ``(T, H)``.

    For every token ``t`` and slot ``k``, with ``e = expert_ids[t, k]``:
    ``out[t] += weights[t, k] * (silu(x[t] @ G_e.T) * (x[t] @ U_e.T)) @ w_down[e].T``,
    where ``w_gate_up[e]`` is ``(2 * I, H)`` with the gate rows ``G_e`` first and the up rows
    ``U_e`` after them, and ``w_down[e]`` is ``(H, I)``: the layout of transformers' experts
    modules (Mixtral, Qwen3-MoE, DeepSeek-V3). ``token_order`` and ``offsets`` come from
    :func:`moe_route` or :func:`moe_permute`. The combine sums in float32. Differentiable in
    ``x``, both weights and ``weights``.
    """
    return _ops().moe_experts(x, w_gate_up, w_down, weights, expert_ids, token_order, offsets)
