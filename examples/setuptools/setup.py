"""Builds gemmt's sources with setuptools and torch's BuildExtension.

    cd examples/setuptools && python setup.py build_ext --inplace
    python -c "import torch, gemmt_setuptools; ..."      # or torch.ops.load_library(...)

The module compiles the very files the CMake build compiles; use CMake or pip for the
supported package. CUDA kernels are included when torch has CUDA and nvcc is found.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = Path(__file__).resolve().parents[2]
NAME = "gemmt_setuptools"


def rel(paths: list[Path]) -> list[str]:
    return [os.path.relpath(p, Path(__file__).parent) for p in sorted(paths)]


# The planners (kernels/plan/*.cpp) are plain C++ and part of every build.
wrapper_sources = rel(list((ROOT / "pytorch_wrapper").glob("*.cpp"))) + rel(
    list((ROOT / "kernels" / "plan").glob("*.cpp"))
)
kernel_sources = rel(list((ROOT / "kernels").rglob("*.cu")))
include_dirs = [str(ROOT / "include"), str(ROOT / "kernels"), str(ROOT / "pytorch_wrapper")]
defines = [f"-DTORCH_EXTENSION_NAME={NAME}", '-DGEMMT_BUILD_SYSTEM="setuptools"']

if torch.version.cuda is not None and CUDA_HOME is not None:
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    cuda_defines = ["-DGEMMT_WITH_CUDA"]
    if "9.0a" in arch:
        cuda_defines.append("-DGEMMT_HAS_SM90A")
    extension = CUDAExtension(
        NAME,
        wrapper_sources + kernel_sources,
        include_dirs=include_dirs,
        extra_compile_args={
            "cxx": ["-O3", *defines, *cuda_defines],
            "nvcc": ["-O3", "--expt-relaxed-constexpr", *defines, *cuda_defines],
        },
    )
else:
    extension = CppExtension(
        NAME, wrapper_sources, include_dirs=include_dirs, extra_compile_args=["-O3", *defines]
    )

setup(name=NAME, ext_modules=[extension], cmdclass={"build_ext": BuildExtension})
