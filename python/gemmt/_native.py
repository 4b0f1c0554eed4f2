"""Finds and loads the compiled extension that registers ``torch.ops.gemmt``.

Only one copy of the library may be loaded per process (it registers the ``gemmt``
namespace). It comes from, in order: ``$GEMMT_LIBRARY`` (path to a built ``_gemmt*.so``),
the extension installed with the package (``pip install``), or a module handed over by
:func:`gemmt.jit.load`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from types import ModuleType
from typing import Callable

import torch  # noqa: F401  (the extension links against torch's libraries)

_lock = threading.Lock()
_module: ModuleType | None = None
# Run once the library is loaded (gemmt.distributed adds its DTensor registration). Modules
# that need to act on load register here, so this loader imports none of them.
_on_load: list[Callable[[], None]] = []

_NOT_BUILT = (
    "gemmt's compiled extension was not found. Build it with "
    "`pip install --no-build-isolation .` in the source tree, point $GEMMT_LIBRARY at a "
    "_gemmt*.so built by CMake, or compile from source with gemmt.jit.load()."
)


def _load_from_path(path: str) -> ModuleType:
    name = os.path.basename(path).split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"gemmt: cannot load the extension at {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load() -> ModuleType:
    """Return the native module, loading it on first use."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            path = os.environ.get("GEMMT_LIBRARY")
            if path:
                _module = _load_from_path(path)
            else:
                try:
                    _module = importlib.import_module("gemmt._gemmt")
                except ImportError as exc:
                    raise ImportError(_NOT_BUILT) from exc
        for callback in list(_on_load):
            callback()
    return _module


def on_load(callback: Callable[[], None]) -> None:
    """Call ``callback`` after the library's first load, or now if it is loaded already."""
    _on_load.append(callback)
    if _module is not None:
        callback()


def is_loaded() -> bool:
    """True once some copy of the library has registered ``torch.ops.gemmt``."""
    return _module is not None


def adopt(module: ModuleType) -> None:
    """Use ``module`` (built by gemmt.jit) as the native module of this process."""
    global _module
    with _lock:
        if _module is not None and _module is not module:
            raise RuntimeError("gemmt: a native library is already loaded in this process")
        _module = module


def library_path() -> str:
    """Filesystem path of the loaded shared library (for ``torch.ops.load_library``)."""
    path = getattr(load(), "__file__", None)
    if not path:
        raise RuntimeError("gemmt: the native module has no file path")
    return str(path)
