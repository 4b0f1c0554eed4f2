"""Writes the digest of gemmt's headers (include/ and kernels/, every *.h and *.cuh) as a C
header, for kernels/deferred/deferred_loader.cu, which computes the same digest of the sources
it compiles a kernel group from and refuses a group whose headers differ from the module's.

    python cmake/header_digest.py <source root> <output header>

The digest is 64-bit FNV-1a over each header's path (from the root, with a leading "/") and
contents, each followed by a 0xff byte, in the loader's order: folders walked depth first,
entries sorted by name. The output is rewritten only when the digest changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_OFFSET = 1469598103934665603
_PRIME = 1099511628211
_MASK = (1 << 64) - 1


def _add(h: int, data: bytes) -> int:
    for byte in data:
        h = ((h ^ byte) * _PRIME) & _MASK
    return ((h ^ 0xFF) * _PRIME) & _MASK


def _headers(folder: Path) -> list[Path]:
    out: list[Path] = []
    if not folder.is_dir():
        return out
    for name in sorted(os.listdir(folder)):
        path = folder / name
        if path.is_dir():
            out += _headers(path)
        elif name.endswith((".h", ".cuh")) and len(name) > 2:
            out.append(path)
    return out


def digest(root: Path) -> str:
    """The headers' digest as 16 hex digits."""
    h = _OFFSET
    for path in _headers(root / "include") + _headers(root / "kernels"):
        h = _add(h, ("/" + path.relative_to(root).as_posix()).encode())
        h = _add(h, path.read_bytes())
    return f"{h:016x}"


def main(argv: list[str]) -> int:
    root, out = Path(argv[1]), Path(argv[2])
    text = ("// Written by cmake/header_digest.py: the digest of the headers this module was "
            f"built with.\n#pragma once\n#define GEMMT_DEFERRED_HEADER_DIGEST \"{digest(root)}\"\n")
    if not out.is_file() or out.read_text() != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
