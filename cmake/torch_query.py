"""What the CMake configuration needs to know of the interpreter's torch and pybind11, in one
process: each answer used to be its own ``python -c``, and every one of them imported torch
(1-2 s apiece, on every configuration, pip's rebuilds included).

Prints ``KEY=VALUE`` lines (CMakeLists.txt reads them and keeps them in its cache until one
of the files named by the ``*_FILE`` keys changes):

    TORCH_PREFIX    torch.utils.cmake_prefix_path (where TorchConfig.cmake lives)
    TORCH_CUDA      torch.version.cuda, empty for a CPU torch
    TORCH_FILE      torch/version.py: a new torch rewrites it
    PYBIND11_DIR    pybind11's CMake folder
    PYBIND11_FILE   pybind11/__init__.py
    PYBIND11_ABI    torch's pybind11 ABI definitions, NAME=VALUE separated by '|' (CMake's
                    list separator would split the output's lines)
    TOOLCHAIN       python/gemmt/_toolchain.py's warnings for the compilers given as
                    arguments, separated by ' | ' (empty: none)
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path


def main(argv: list[str]) -> int:
    """Prints the answers; argv[0] is the source root, the rest the compilers to check."""
    root = Path(argv[0])
    compilers = [c for c in argv[1:] if c]

    import pybind11
    import torch
    import torch.utils.cpp_extension as ext

    sys.path.insert(0, str(root / "python" / "gemmt"))
    import _toolchain

    # Newer torch releases warn that this is internal (and may drop it): no flags then.
    abi_flags = getattr(ext, "_get_pybind11_abi_build_flags", list)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        abi = [f.replace("-D", "", 1).replace('"', "") for f in abi_flags()]
    messages = _toolchain.check_messages(compilers, _toolchain.loaded_libstdcxx())
    answers = {
        "TORCH_PREFIX": torch.utils.cmake_prefix_path,
        "TORCH_CUDA": torch.version.cuda or "",
        "TORCH_FILE": str(Path(torch.__file__).with_name("version.py")),
        "PYBIND11_DIR": pybind11.get_cmake_dir(),
        "PYBIND11_FILE": pybind11.__file__,
        "PYBIND11_ABI": "|".join(abi),
        "TOOLCHAIN": " | ".join(messages),
    }
    for key, value in answers.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
