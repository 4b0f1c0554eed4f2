"""Typed Python entry points for every gemmt op.

Each function calls ``torch.ops.gemmt.<op>``: the dispatcher picks the CPU or CUDA kernel,
autograd is registered in C++, and the ops work under ``torch.compile``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gemmt import _native

__all__ = ["gemm", "mm", "add", "square", "scale", "rgb_to_gray", "normalize_volume"]

GEMM_VARIANTS: tuple[str, ...] = (
    "auto",
    "naive",
    "smem_tiled",
    "register_blocked",
    "warptiled",
    "pipelined",
    "split_k",
    "gemv",
    "mma_sync",
    "wgmma",
)


def _ops() -> torch._ops._OpNamespace:
    _native.load()
    return torch.ops.gemmt


def gemm(
    c: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0, beta: float = 0.0, *, variant: str = "auto"
) -> None:
    """In place: ``c = alpha * a @ b + beta * c``.

    ``a`` is (M, K), ``b`` is (K, N), ``c`` is (M, N), all float32, float16 or bfloat16
    (float64 too on CPU) on one device; any strides (transposed views need no copy).
    Accumulates in float32. float32 uses exact FP32 arithmetic unless TF32 is allowed
    (``torch.backends.cuda.matmul.allow_tf32`` or a matmul precision below "highest").
    ``variant`` names a specific CUDA kernel (see ``GEMM_VARIANTS``); "auto" picks by shape.
    With ``beta == 0`` the old contents of ``c`` are never read.
    """
    _ops().gemm(c, a, b, alpha, beta, variant=variant)


def mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` as a new tensor; differentiable (backward runs gemmt's own GEMM)."""
    return _ops().mm(a, b)


def add(a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` for tensors of one shape and dtype (float32/16/bf16); differentiable."""
    return _ops().add(a, b)


def square(x: Tensor) -> Tensor:
    """``x * x`` elementwise, any rank; differentiable."""
    return _ops().square(x)


def scale(x: Tensor, factor: float = 2.0) -> Tensor:
    """``x * factor`` elementwise; differentiable."""
    return _ops().scale(x, factor)


def rgb_to_gray(img: Tensor, bgr: bool = False) -> Tensor:
    """uint8 ``[..., H, W, 3]`` to uint8 ``[..., H, W]`` luma.

    ``round(0.299 R + 0.587 G + 0.114 B)`` with halves rounded up (exact integer
    arithmetic). Pass ``bgr=True`` for images in B, G, R order (as OpenCV reads them).
    """
    return _ops().rgb_to_gray(img, bgr)


def normalize_volume(vol: Tensor, max_val: float) -> Tensor:
    """uint16 or uint8 volume of any rank to float32 ``vol / max_val``; ``max_val > 0``."""
    return _ops().normalize_volume(vol, max_val)
