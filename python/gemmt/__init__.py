"""gemmt: hand-written CUDA kernels for PyTorch.

Ops: :func:`gemm`, :func:`mm`, :func:`linear`, :func:`add`, :func:`square`, :func:`scale`,
:func:`swiglu`, :func:`rgb_to_gray`, :func:`normalize_volume` (every name in
``gemmt.ops.__all__``), also reachable as ``torch.ops.gemmt.<op>``. The opt-in GEMM tuner:
:func:`tune` and the other names of :mod:`gemmt.tuning`.
Importing the package loads the native library, which registers ``torch.ops.gemmt`` (see
:mod:`gemmt._native`; ``GEMMT_AUTOLOAD=0`` defers it for a JIT build of one's own).
"""

from __future__ import annotations

from typing import Any

from gemmt import _native, distributed, nn, ops, tuning
# Every public name of gemmt.ops is a name of the package: a new op is added in ops.py only.
from gemmt.ops import *  # noqa: F401,F403
from gemmt.tuning import *  # noqa: F401,F403

__version__ = "0.1.0"

_native.autoload()

__all__ = ["GEMM_VARIANTS", "build_info", "distributed", "library_path", "nn", "tuning",
           *ops.__all__, *tuning.__all__]


def build_info() -> dict[str, Any]:
    """How the loaded library was built: torch and CUDA versions, architectures, compiler."""
    return dict(_native.load().build_info())


def library_path() -> str:
    """Path of the loaded shared library, usable with ``torch.ops.load_library``."""
    return _native.library_path()


def __getattr__(name: str) -> object:
    # GEMM_VARIANTS comes from the native library (a source checkout imports without one).
    if name == "GEMM_VARIANTS":
        return ops.gemm_variants()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
