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
