"""gemmt: hand-written CUDA kernels for PyTorch.

Ops: :func:`gemm`, :func:`mm`, :func:`linear`, :func:`add`, :func:`square`, :func:`scale`,
:func:`rgb_to_gray`, :func:`normalize_volume`, also reachable as ``torch.ops.gemmt.<op>``.
The native library loads on first use (see :mod:`gemmt._native`).
"""

from __future__ import annotations

from typing import Any

from gemmt import _native, distributed, nn
from gemmt.ops import (
    ACTIVATIONS,
    GEMM_VARIANTS,
    add,
    gemm,
    linear,
    mm,
    normalize_volume,
    rgb_to_gray,
    scale,
    square,
)

__version__ = "0.1.0"

__all__ = [
    "ACTIVATIONS",
    "GEMM_VARIANTS",
    "add",
    "build_info",
    "distributed",
    "gemm",
    "library_path",
    "linear",
    "mm",
    "nn",
    "normalize_volume",
    "rgb_to_gray",
    "scale",
    "square",
]


def build_info() -> dict[str, Any]:
    """How the loaded library was built: torch and CUDA versions, architectures, compiler."""
    return dict(_native.load().build_info())


def library_path() -> str:
    """Path of the loaded shared library, usable with ``torch.ops.load_library``."""
    return _native.library_path()
