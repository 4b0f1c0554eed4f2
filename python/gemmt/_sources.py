"""Reads ``sources.txt``, the one list of gemmt's source files, for the Python build routes.

CMake reads the same file (``cmake/GemmtSources.cmake``); :mod:`gemmt.jit` and
``examples/setuptools/setup.py`` call :func:`sources`. This module imports nothing beyond the
standard library, so a ``setup.py`` can load it by path without importing gemmt (and torch).

Each line of ``sources.txt`` is ``<group> <pattern>``; a ``**/`` component matches any depth
of folders, none included, as CMake's ``GLOB_RECURSE`` does.
"""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST = "sources.txt"
_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s+(\S+)$")
# "dir/**/name": name anywhere under dir (the one recursive form CMake's reader accepts too).
_RECURSIVE = re.compile(r"^((?:[^*]*/)?)\*\*/([^/]+)$")


def read_manifest(root: Path) -> list[tuple[str, str]]:
    """The ``(group, pattern)`` lines of ``root/sources.txt``, in file order."""
    path = Path(root) / MANIFEST
    entries: list[tuple[str, str]] = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"{path}:{number}: expected '<group> <pattern>', got {line!r}")
        pattern = match.group(2)
        if "**" in pattern and _RECURSIVE.match(pattern) is None:
            raise ValueError(f"{path}:{number}: '**' must be one folder component followed by "
                             f"a file name pattern, got {pattern!r}")
        entries.append((match.group(1), pattern))
    return entries


def _expand(root: Path, pattern: str) -> list[Path]:
    recursive = _RECURSIVE.match(pattern)
    if recursive is not None:
        base, name = root / recursive.group(1), recursive.group(2)
        return [p for p in base.rglob(name) if p.is_file()] if base.is_dir() else []
    return [p for p in root.glob(pattern) if p.is_file()]


def groups(root: Path) -> dict[str, list[Path]]:
    """Every group of the manifest mapped to its files, sorted, as absolute paths.

    Groups without files are present with an empty list.
    """
    root = Path(root).resolve()
    out: dict[str, list[Path]] = {}
    for group, pattern in read_manifest(root):
        out.setdefault(group, []).extend(_expand(root, pattern))
    return {g: sorted(set(files), key=lambda p: p.as_posix()) for g, files in out.items()}


def check_object_names(files: list[Path]) -> None:
    """Raise when two sources would compile to one object file name in torch's JIT build.

    ``torch.utils.cpp_extension`` names objects after the file name alone (``name.o`` for
    C++, ``name.cuda.o`` for CUDA), so ``kernels/a/x.cu`` and ``kernels/b/x.cu`` would
    overwrite each other there even though CMake builds them apart.
    """
    seen: dict[str, Path] = {}
    for path in files:
        key = path.stem + (".cuda.o" if path.suffix == ".cu" else ".o")
        if key in seen:
            raise ValueError(f"gemmt sources: {seen[key]} and {path} share the object name "
                             f"{key!r}; rename one (file names must be unique across folders)")
        seen[key] = path


# The include path of every source (CMakeLists.txt gives the same folders to its targets):
# the public headers, the kernel layer's private headers, the wrapper's headers.
INCLUDE_DIRS = ("include", "kernels", "pytorch_wrapper")


def include_dirs(root: Path) -> list[Path]:
    """The folders on the include path of a build of ``root``, as absolute paths."""
    return [Path(root).resolve() / d for d in INCLUDE_DIRS]


def sources(root: Path, *, with_cuda: bool) -> list[Path]:
    """The files one extension module compiles.

    The wrapper and the kernel layer's plain C++ (the planners) always; the CUDA kernels
    when ``with_cuda``.
    """
    listed = groups(root)
    files = list(listed.get("wrapper", [])) + list(listed.get("kernel_host", []))
    if with_cuda:
        files += listed.get("kernel_cuda", [])
    check_object_names(files)
    return files
