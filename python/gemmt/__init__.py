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

__all__ = ["GEMM_VARIANTS", "build_info", "distributed", "library_path", "nn",
           "prepare_kernels", "tuning",
           *ops.__all__, *tuning.__all__]


def build_info() -> dict[str, Any]:
    """How the loaded library was built: torch and CUDA versions, architectures, compiler."""
    return dict(_native.load().build_info())


def prepare_kernels(groups: list[str] | None = None) -> dict[str, float]:
    """Compile and load now the kernel groups this build compiles on first use.

    A CUDA build leaves rarely used kernels (``build_info()["deferred_groups"]``: FP8, the
    16-bit grouped GEMM, TF32, float64, the 16-bit SIMT instances, the float32 SIMT instances
    for operands that are not 16-byte aligned, the named decode kernel, the SIMT ladder) out of
    the install; each compiles on its first call into a cache (``GEMMT_CACHE_DIR``, default
    ``~/.cache/gemmt``) and loads from there afterwards. Call this (or ``python -m gemmt
    prepare``) to pay that once ahead, e.g. in a container image. The groups build side by side.

    Returns the seconds each group took (near zero when cached). Raises ``RuntimeError`` naming
    the group and the reason when one cannot be compiled or loaded.
    """
    from concurrent.futures import ThreadPoolExecutor
    import time

    lib = _native.load()
    listed = [g for g in str(build_info().get("deferred_groups", "")).split(",") if g]
    wanted = listed if groups is None else list(groups)
    unknown = [g for g in wanted if g not in listed]
    if unknown:
        raise ValueError(f"gemmt.prepare_kernels: groups {unknown} are not compiled on first use "
                         f"in this build (those are {listed})")

    def one(group: str) -> tuple[str, float]:
        start = time.perf_counter()
        why = lib.load_kernel_group(group)
        if why is not None:
            raise RuntimeError(f"gemmt.prepare_kernels: kernel group '{group}': {why}")
        return group, time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=max(1, len(wanted))) as pool:
        return dict(pool.map(one, wanted))


def library_path() -> str:
    """Path of the loaded shared library, usable with ``torch.ops.load_library``."""
    return _native.library_path()


def __getattr__(name: str) -> object:
    # GEMM_VARIANTS comes from the native library (a source checkout imports without one).
    if name == "GEMM_VARIANTS":
        return ops.gemm_variants()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
