"""Builds gemmt's sources with setuptools and torch's BuildExtension.

    cd examples/setuptools && python setup.py build_ext --inplace
    python -c "import torch, gemmt_setuptools; ..."      # or torch.ops.load_library(...)

The module compiles the files sources.txt lists, as the CMake build does; use CMake or pip
for the supported package. CUDA kernels are included when torch has CUDA and nvcc is found.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = Path(__file__).resolve().parents[2]
NAME = "gemmt_setuptools"


def load_source_list() -> ModuleType:
    """gemmt's reader of sources.txt, loaded by path: it needs neither gemmt nor torch."""
    path = ROOT / "python" / "gemmt" / "_sources.py"
    spec = importlib.util.spec_from_file_location("gemmt_sources", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rel(paths: list[Path]) -> list[str]:
    return [os.path.relpath(p, Path(__file__).parent) for p in paths]


source_list = load_source_list()
include_dirs = [str(d) for d in source_list.include_dirs(ROOT)]
defines = [f"-DTORCH_EXTENSION_NAME={NAME}", '-DGEMMT_BUILD_SYSTEM="setuptools"']

if torch.version.cuda is not None and CUDA_HOME is not None:
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    cuda_defines = ["-DGEMMT_WITH_CUDA"]
    if "9.0a" in arch:
        cuda_defines.append("-DGEMMT_HAS_SM90A")
    extension = CUDAExtension(
        NAME,
        rel(source_list.sources(ROOT, with_cuda=True)),
        include_dirs=include_dirs,
        extra_compile_args={
            "cxx": ["-O3", *defines, *cuda_defines],
            "nvcc": ["-O3", "--expt-relaxed-constexpr", *defines, *cuda_defines],
        },
    )
else:
    extension = CppExtension(
        NAME, rel(source_list.sources(ROOT, with_cuda=False)), include_dirs=include_dirs, extra_compile_args=["-O3", *defines]
    )

setup(name=NAME, ext_modules=[extension], cmdclass={"build_ext": BuildExtension})
