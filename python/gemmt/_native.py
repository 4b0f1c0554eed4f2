"""Finds and loads the compiled extension that registers ``torch.ops.gemmt``.

Only one copy of the library may be loaded per process (it registers the ``gemmt``
namespace). It comes from, in order: ``$GEMMT_LIBRARY`` (path to a built ``_gemmt*.so``),
a gemmt library that a bare ``torch.ops.load_library(path)`` loaded already (the same file
is then imported as the module, so its ops are not registered twice), the extension
installed with the package (``pip install``), or a module handed over by
:func:`gemmt.jit.load`.

``import gemmt`` loads it (:func:`autoload`), so ``torch.ops.gemmt.*`` exists as soon as
the package is imported, as with PyTorch's own kernel packages. ``GEMMT_AUTOLOAD=0`` skips
that, for a process that will build and load its own copy with :func:`gemmt.jit.load`.
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


def _library_loaded_by_torch() -> str | None:
    """Path of a gemmt library that ``torch.ops.load_library`` loaded into this process.

    Such a library has registered ``torch.ops.gemmt`` already; importing any other file
    would register the namespace a second time, which the dispatcher refuses.
    """
    for path in getattr(torch.ops, "loaded_libraries", ()):
        name = os.path.basename(str(path))
        if name.startswith("_gemmt") or name.startswith("gemmt"):
            if hasattr(torch.ops.gemmt, "gemm"):
                return str(path)
    return None


def _find_and_load() -> ModuleType:
    path = os.environ.get("GEMMT_LIBRARY") or _library_loaded_by_torch()
    if path:
        return _load_from_path(path)
    try:
        return importlib.import_module("gemmt._gemmt")
    except ImportError as exc:
        raise ImportError(_NOT_BUILT) from exc


def load() -> ModuleType:
    """Return the native module, loading it on first use."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            _module = _find_and_load()
        for callback in list(_on_load):
            callback()
    return _module


def on_load(callback: Callable[[], None]) -> None:
    """Call ``callback`` after the library's first load, or now if it is loaded already."""
    _on_load.append(callback)
    if _module is not None:
        callback()


def autoload() -> None:
    """Load the library at ``import gemmt`` where one is there to load.

    A source checkout with no built extension (the JIT way in) imports without one: its ops
    appear when :func:`gemmt.jit.load` hands its build over. ``GEMMT_AUTOLOAD=0`` skips the
    load. Any other failure (a library built for another torch, say) is raised here, at the
    import, rather than at some later first call.
    """
    if os.environ.get("GEMMT_AUTOLOAD", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    explicit = os.environ.get("GEMMT_LIBRARY") or _library_loaded_by_torch()
    if not explicit and importlib.util.find_spec("gemmt._gemmt") is None:
        return
    load()


def is_loaded() -> bool:
    """True once some copy of the library has registered ``torch.ops.gemmt``."""
    return _module is not None


def adopt(module: ModuleType) -> None:
    """Use ``module`` (built by gemmt.jit) as the native module of this process."""
    global _module
    with _lock:
        if _module is not None and _module is not module:
            raise RuntimeError("gemmt: a native library is already loaded in this process")
        first = _module is None
        _module = module
        if first:
            for callback in list(_on_load):
                callback()


def library_path() -> str:
    """Filesystem path of the loaded shared library (for ``torch.ops.load_library``)."""
    path = getattr(load(), "__file__", None)
    if not path:
        raise RuntimeError("gemmt: the native module has no file path")
    return str(path)
