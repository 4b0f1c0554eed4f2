"""Just-in-time builds from source with ``torch.utils.cpp_extension``.

:func:`load` compiles the files ``sources.txt`` lists, as the CMake and pip builds do
(cached by torch under ``~/.cache/torch_extensions`` or ``$TORCH_EXTENSIONS_DIR``). :func:`load_inline` compiles a user's prototype from strings
with gemmt's ``include/`` headers on the include path.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Sequence

import torch
import torch.utils.cpp_extension as cpp_extension

from gemmt import _native, _sources, _toolchain
from gemmt._env import env_set


def source_root() -> Path:
    """Directory holding ``sources.txt``, ``include/``, ``kernels/`` and ``pytorch_wrapper/``.

    A source checkout (``python/gemmt`` beside ``kernels/``) or the copy installed with
    the package (``gemmt/_src``).
    """
    here = Path(__file__).resolve().parent
    for root in (here.parent.parent, here / "_src"):
        if (root / _sources.MANIFEST).is_file() and (root / "kernels").is_dir():
            return root
    raise FileNotFoundError("gemmt.jit: cannot find gemmt's sources (sources.txt, kernels/)")


def include_dir() -> Path:
    """The ``include/`` directory with gemmt's shared headers (``gemmt/*.h``, ``*.cuh``)."""
    return source_root() / "include"


def cuda_available_for_build() -> bool:
    """True when torch has CUDA and nvcc can be found (CUDA_HOME)."""
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _arch_flags() -> tuple[list[str], bool]:
    """nvcc -gencode flags and whether sm_90a (the wgmma kernels) is among them."""
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(" ", ";")
    archs = [a for a in arch_list.split(";") if a]
    if not archs and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        archs = [f"{major}.{minor}" + ("a" if (major, minor) == (9, 0) else "")]
    if not archs:
        archs = ["8.0", "9.0a"]
    flags, has90a = [], False
    for arch in archs:
        ptx = arch.endswith("+PTX")
        num = arch.replace("+PTX", "").replace(".", "")
        has90a |= num == "90a"
        code = f"[sm_{num},compute_{num}]" if ptx else f"sm_{num}"
        flags.append(f"-gencode=arch=compute_{num},code={code}")
    return flags, has90a


def _size_flags() -> list[str]:
    """nvcc flags of the CMake build: compressed cubins (nvcc 12.8 and later), split
    compilation (12.1 and later), and line tables only with ``GEMMT_LINEINFO=1``."""
    flags = ["-lineinfo"] if os.environ.get("GEMMT_LINEINFO", "0") == "1" else []
    cuda = torch.version.cuda or ""
    try:
        major, minor = (int(v) for v in cuda.split(".")[:2])
    except ValueError:
        return flags
    cores = os.cpu_count() or 1
    if (major, minor) >= (12, 1) and cores > 1:
        # One translation unit optimised in several threads: the same code, sooner. Each
        # thread costs CPU time while the other files wait for cores, so as many as the CMake
        # build gives (CMakeLists.txt, GEMMT_SPLIT_COMPILE): a sixteenth of the cores, 2 to 8.
        flags.append(f"--split-compile={max(2, min(8, cores // 16))}")
    if (major, minor) >= (12, 8):
        flags.append("--compress-mode=size")
    return flags


@contextlib.contextmanager
def _matching_compilers() -> Iterator[None]:
    """$CC / $CXX / $CUDAHOSTCXX set, for the build only, to compilers that link the
    process's libstdc++ where the given ones do not (``gemmt._toolchain``)."""
    with env_set(_toolchain.replacements()):
        yield


def sources(with_cuda: bool) -> list[str]:
    """Every source file of the library for this kind of build (as ``sources.txt`` lists)."""
    return [str(p) for p in _sources.sources(source_root(), with_cuda=with_cuda)]


def load(
    *,
    name: str = "gemmt_jit",
    with_cuda: bool | None = None,
    verbose: bool = False,
    build_directory: str | None = None,
) -> ModuleType:
    """Compile gemmt from source (cached) and load it as this process's native library.

    After this, ``torch.ops.gemmt.*`` and the ``gemmt.*`` functions use the JIT build.
    ``with_cuda`` defaults to :func:`cuda_available_for_build`. Raises if another copy of
    the library is already loaded (one per process: it registers the ``gemmt`` namespace).
    """
    if _native.is_loaded():
        raise RuntimeError(
            "gemmt.jit.load: a gemmt library is already loaded in this process (importing "
            "gemmt loads the installed one); set GEMMT_AUTOLOAD=0 before the import, or call "
            "gemmt.jit.load() in a process without an installed gemmt"
        )
    if with_cuda is None:
        with_cuda = cuda_available_for_build()
    root = source_root()
    defines = ['-DGEMMT_BUILD_SYSTEM=\\"jit\\"', f"-DTORCH_EXTENSION_NAME={name}"]
    cuda_flags: list[str] = []
    if with_cuda:
        arch_flags, has90a = _arch_flags()
        defines.append("-DGEMMT_WITH_CUDA")
        if has90a:
            defines.append("-DGEMMT_HAS_SM90A")
        arch_names = ",".join(f.split("arch=compute_")[1].split(",")[0] for f in arch_flags)
        defines.append(f'-DGEMMT_CUDA_ARCHITECTURES=\\"{arch_names}\\"')
        # As the CMake build: compressed cubins (nvcc 12.8+), line info only when asked.
        cuda_flags = ["-O3", "--expt-relaxed-constexpr", *_size_flags(), *arch_flags, *defines]
    with _matching_compilers():
        module = cpp_extension.load(
            name=name,
            sources=sources(with_cuda),
            extra_include_paths=[str(d) for d in _sources.include_dirs(root)],
            extra_cflags=["-O3", *defines],
            extra_cuda_cflags=cuda_flags,
            with_cuda=with_cuda,
            build_directory=build_directory,
            verbose=verbose,
        )
    _native.adopt(module)
    return module


def load_inline(
    name: str,
    cpp_sources: str | Sequence[str],
    cuda_sources: str | Sequence[str] | None = None,
    functions: str | Sequence[str] | None = None,
    **kwargs: Any,
) -> ModuleType:
    """``torch.utils.cpp_extension.load_inline`` with gemmt's headers on the include path.

    Prototype a kernel as strings and ``#include "gemmt/vector_access.cuh"`` (or any other
    header of gemmt's ``include/``) to reuse the library's vector loads and checks.
    """
    include_paths = [str(include_dir()), *kwargs.pop("extra_include_paths", [])]
    with _matching_compilers():
        return cpp_extension.load_inline(
            name=name,
            cpp_sources=cpp_sources,
            cuda_sources=cuda_sources,
            functions=functions,
            extra_include_paths=include_paths,
            **kwargs,
        )
