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
__all__ += ["scaled_mm", "quantize_fp8", "quantize_fp8_with_transpose", "FP8_GRANULARITIES"]


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


FP8_GRANULARITIES: tuple[str, ...] = ("tensor", "row", "block", "block_128x128")


def scaled_mm(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, bias: Tensor | None = None,
              out_dtype: torch.dtype = torch.bfloat16, activation: str = "none",
              use_fast_accum: bool = False) -> Tensor:
    """``act(dequant(a) @ dequant(b) + bias)`` for float8 operands, as ``out_dtype``.

    ``a`` is (M, K) and ``b`` (K, N), each ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
    The scales are dequantisation scales (``float(a) * scale_a`` is ``a``'s real value), float32,
    finite and positive, in the shapes ``torch._scaled_mm`` takes, so that a call can move from
    one to the other unchanged:

    - tensorwise: one element each; K a multiple of 16;
    - rowwise: ``scale_a`` (M, 1), ``scale_b`` (1, N); K a multiple of 16;
    - blockwise, K a multiple of 128 and KB = K / 128, the three pairings torch 2.13 accepts:
      1x128 blocks of ``a`` with 128x128 blocks of ``b`` (``scale_a`` (M, KB), ``scale_b``
      (KB, ceil(N/128))), 1x128 with 128x1 (``scale_b`` (KB, N)), and 128x128 with 128x1
      (``scale_a`` (ceil(M/128), KB)). torch's CUDA kernels want the 1x128 ``scale_a``
      column-major (strides (1, M)) and the 128x128 ``scale_b`` as the transpose of a
      contiguous (ceil(N/128), KB) tensor; :func:`quantize_fp8` returns them that way. Any
      layout with a unit stride along one dimension is accepted.

    torch 2.13's CPU ``torch._scaled_mm`` implements the tensorwise and rowwise modes only;
    its blockwise modes exist on CUDA (sm_90 and later) only.

    ``bias`` is (N,), float32, float16 or bfloat16; ``activation`` one of ``ACTIVATIONS``;
    ``out_dtype`` bfloat16, float16 or float32. The product is accumulated in float32, the
    scales, bias and activation applied in float32, and the result rounded once. Blockwise:
    each 128-wide slice of K is summed in float32 with its scales applied, so the error does
    not grow with K. ``use_fast_accum`` is accepted for compatibility and has no effect on
    the CPU reference.

    Implemented on CPU (the reference) and on CUDA: 1-64 rows of ``a`` against a K-major
    ``b`` (``W.t()``) run on the FP8 decode kernel (compute capability 8.9+, float32
    accumulation, ``use_fast_accum`` ignored), everything else on the Hopper kernel (sm_90a;
    other GPUs raise). Not differentiable: train through :class:`gemmt.nn.Float8Linear`.
    """
    return _ops().scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum)


def quantize_fp8(x: Tensor, granularity: str = "tensor",
                 dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[Tensor, Tensor]:
    """Quantise a 2-D float tensor to float8 with amax scaling; returns ``(q, scale)``.

    ``x`` is (M, K), float32, float16, bfloat16 or float64. Per group of elements the
    quantisation factor is ``fp8_max / max(amax, 1e-12)`` (computed in float64, rounded to
    float32: torchao's ``amax_to_scale``), ``q = clamp(x * factor, -fp8_max, fp8_max)`` cast to
    ``dtype`` (a saturating cast, as torchao's ``to_fp8_saturated``), and ``scale`` is the
    dequantisation scale ``1 / factor`` (float32), ready for :func:`scaled_mm`. fp8_max is 448
    for float8_e4m3fn and 57344 for float8_e5m2. Groups (``granularity``):

    - "tensor": one group; ``scale`` has shape ();
    - "row": one group per row; ``scale`` (M, 1);
    - "block": 1x128 blocks along K (the last one may be partial); ``scale`` (M, ceil(K/128)),
      column-major as torch's CUDA kernels take it;
    - "block_128x128": 128x128 blocks; ``scale`` (ceil(M/128), ceil(K/128)), contiguous. For a
      weight ``w`` (N, K) used as ``b = q.t()``, pass ``scale.t()`` as ``scale_b``.

    An all-zero group gets the factor fp8_max / 1e-12 and quantises to zeros (torchao's
    convention). Non-finite elements do not set the scale: the amax is taken over the finite
    elements, +-inf saturates to +-fp8_max and NaN stays NaN. (torchao takes the amax over all
    elements, so one inf gives its whole group a zero factor and an infinite scale.)
    """
    q, scale = _ops().quantize_fp8(x, granularity, dtype)
    return q, scale


def quantize_fp8_with_transpose(
        x: Tensor, granularity: str = "tensor", dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``quantize_fp8(x)`` and ``quantize_fp8(x.t())`` in one call: ``(q, scale, qt, scale_t)``.

    ``qt`` is the (K, M) transpose, contiguous, quantised along the other dimension: per column
    of ``x`` for "row", in 1x128 blocks along M for "block". For "tensor" and "block_128x128"
    every element keeps its scale, so ``qt`` is ``q.t()`` bit for bit and ``scale_t`` is
    ``scale`` (transposed for blocks). A linear layer's backward needs these transposes: the
    input gradient multiplies by the weight along its other dimension, the weight gradient
    contracts the activations and output gradients over the tokens.
    """
    q, scale, qt, scale_t = _ops().quantize_fp8_with_transpose(x, granularity, dtype)
    return q, scale, qt, scale_t

# ---- Mixture of experts ----
# No extension bindings for these: they go through torch.ops.gemmt (the dispatcher's Python
# entry), whose per-call cost is small beside a grouped product.

from typing import NamedTuple  # noqa: E402 - kept with the section that uses it

__all__ += ["grouped_mm", "scaled_grouped_mm", "moe_permute", "moe_route", "moe_experts",
            "MoERouting"]


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
    ``bias``; each backward product is a grouped product of another layout. On CUDA, 16-bit
    operands run the Hopper grouped GEMM (the offsets stay on the GPU: no host synchronisation,
    capturable in a CUDA graph); float32 and float64 run a loop of ATen products.
    """
    return _ops().grouped_mm(a, b, offs, bias, out_dtype, activation)


def scaled_grouped_mm(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor,
                      offs: Tensor | None = None, bias: Tensor | None = None,
                      out_dtype: torch.dtype | None = None, activation: str = "none",
                      use_fast_accum: bool = False) -> Tensor:
    """:func:`grouped_mm` of float8 operands with row scales, as ``torch._scaled_grouped_mm``.

    ``a`` and ``b`` are float8_e4m3fn or float8_e5m2 (not both e5m2) in the layouts of
    :func:`grouped_mm`; element ``(r, c)`` of a group's product is
    ``sum_k float(a[r, k]) * float(b[k, c]) * scale_a[r] * scale_b[c]`` with the group's scales,
    then ``bias`` and ``activation`` as in :func:`grouped_mm`. The scales are float32
    dequantisation scales: a 2-D operand's is 1-D over its scaled extent (the rows of ``a``, the
    columns of ``b``; one such set per group when both operands are 2-D), a 3-D operand's is
    ``(G, extent)``. ``out_dtype`` is bfloat16 (the default), float16 or float32.

    On a Hopper GPU the FP8 tensor cores run it from K-major operands (``a`` row-major, ``b``
    column-major, as ``torch._scaled_grouped_mm`` wants; other layouts are copied), the sums
    promoted to float32 every 128 of K unless ``use_fast_accum``; the offsets stay on the GPU.
    The 2-D x 2-D layout (a split of K) runs on bfloat16 copies of the operands, which hold
    every float8 value exactly. Not differentiable.
    """
    return _ops().scaled_grouped_mm(a, b, scale_a, scale_b, offs, bias, out_dtype, activation,
                                    use_fast_accum)


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
