"""The C++ compilers a build of gemmt may use: those whose libstdc++ is the process's.

The module is loaded into a Python process that already holds one libstdc++ (the one torch
links). Code compiled by a g++ from another GCC install carries that install's libstdc++
inline code, and against the process's library it crashes at the first formatted message
(a segmentation fault inside ``std::ostream``, in ``build_info()``). Some images point
``$CC``, ``$CXX`` and ``$CUDAHOSTCXX`` at such a second install. This module finds the
compilers of those variables that do not link the loaded libstdc++ (another file, or one
they cannot name) and, where the system's ``gcc``/``g++`` link it, names them as
replacements.

Run as a script (``python python/gemmt/_toolchain.py``) it prints ``export VAR=...`` lines
for a shell to evaluate (``scripts/setup.sh``); ``--check COMPILER...`` prints one warning
line per compiler that does not match (the CMake build shows them). The JIT build applies
the replacements while it compiles.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# The variables a build reads its compilers from: torch's extension builder (CC for nvcc's
# -ccbin, CXX), CMake (CXX, CUDAHOSTCXX).
COMPILER_VARS = ("CC", "CXX", "CUDAHOSTCXX")
SYSTEM_COMPILERS = {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++", "CUDAHOSTCXX": "/usr/bin/g++"}


def loaded_libstdcxx() -> str | None:
    """Real path of the libstdc++ this process has loaded once torch is imported (Linux)."""
    import torch  # noqa: F401  (torch brings the process's libstdc++ in)

    maps = Path("/proc/self/maps")
    if not maps.is_file():
        return None
    for line in maps.read_text().splitlines():
        path = line.split()[-1]
        if "/libstdc++.so" in path:
            return os.path.realpath(path)
    return None


def compiler_libstdcxx(compiler: str) -> str | None:
    """Real path of the libstdc++ a GCC-style compiler links, or None if it does not say."""
    exe = shutil.which(compiler)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-print-file-name=libstdc++.so"], capture_output=True,
                             text=True, timeout=60, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    # A compiler that does not know the library echoes the bare name back.
    return os.path.realpath(out) if os.path.isabs(out) and os.path.exists(out) else None


def mismatched(compilers: list[str], loaded: str | None) -> list[tuple[str, str]]:
    """(compiler, its libstdc++) for each installed compiler that does not link ``loaded``:
    another file, or none it can name (a wrapper script around another install's driver,
    as on the images this guards against, answers with the bare name)."""
    if loaded is None:
        return []
    out = []
    for compiler in compilers:
        if shutil.which(compiler) is None:
            continue
        lib = compiler_libstdcxx(compiler)
        if lib != loaded:
            out.append((compiler, lib or "a libstdc++ it does not name"))
    return out


def replacements(env: dict[str, str] | None = None,
                 loaded: str | None = None) -> dict[str, str]:
    """New values for the compiler variables of ``env`` (default: os.environ) whose compiler
    does not link the process's libstdc++, where the system compiler links it.
    ``loaded`` defaults to :func:`loaded_libstdcxx`."""
    env = dict(os.environ) if env is None else env
    loaded = loaded_libstdcxx() if loaded is None else loaded
    out: dict[str, str] = {}
    for var in COMPILER_VARS:
        value = env.get(var, "")
        if not value or not mismatched([value], loaded):
            continue
        system = SYSTEM_COMPILERS[var]
        if os.path.exists(system) and not mismatched([system], loaded):
            out[var] = system
    return out


def check_messages(compilers: list[str], loaded: str | None) -> list[str]:
    """One warning line per compiler of ``compilers`` that does not link ``loaded`` (what
    ``--check`` prints, and what the CMake configuration shows through cmake/torch_query.py)."""
    return [f"{compiler} links {lib}, but torch's process loads {loaded}: the module "
            "would crash at its first formatted message. Build with a compiler of the "
            "system's GCC, e.g. CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++."
            for compiler, lib in mismatched(compilers, loaded)]


def _main(argv: list[str]) -> int:
    loaded = loaded_libstdcxx()
    if argv[:1] == ["--check"]:
        for line in check_messages(argv[1:], loaded):
            print(line)
        return 0
    for var, value in replacements(loaded=loaded).items():
        print(f"{var} ({os.environ[var]}) does not link the libstdc++ of torch's process "
              f"({loaded}); building with {value}", file=sys.stderr)
        print(f"export {var}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
