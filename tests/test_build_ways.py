"""The four ways in: plain CMake, torch.ops.load_library, pip, and JIT (plus setuptools).

Each runs in a fresh interpreter. Builds are slow (marked `slow`); set
GEMMT_TEST_CMAKE_BUILD to a finished CMake build directory to reuse it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gemmt
from conftest import HAS_CUDA, REPO_ROOT
from helpers_build import run_python, smoke


def _cmake_build(tmp_path: Path) -> Path:
    prebuilt = os.environ.get("GEMMT_TEST_CMAKE_BUILD")
    if prebuilt:
        return Path(prebuilt)
    build = tmp_path / "cmake-build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    # CPU-only keeps this test quick; the GPU script builds the CUDA flavour the same way.
    cfg = ["cmake", "-S", str(REPO_ROOT), "-B", str(build), *gen, "-DGEMMT_CUDA=OFF",
           f"-DPython_EXECUTABLE={sys.executable}"]
    subprocess.run(cfg, check=True, capture_output=True, text=True)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)], check=True,
                   capture_output=True, text=True)
    return build


@pytest.mark.slow
def test_plain_cmake_module_and_load_library(tmp_path: Path) -> None:
    build = _cmake_build(tmp_path)
    libs = glob.glob(str(build / "_gemmt*.so"))
    assert len(libs) == 1, libs
    cuda = bool(os.environ.get("GEMMT_TEST_CMAKE_BUILD")) and HAS_CUDA
    # 1. Import the module straight from build/ and call .gemm(c, a, b).
    out = run_python(
        f"import sys, torch; sys.path.insert(0, {str(build)!r}); import _gemmt\n"
        "a, b = torch.randn(64, 32), torch.randn(32, 16); c = torch.empty(64, 16)\n"
        "_gemmt.gemm(c, a, b); assert torch.allclose(c, a @ b, atol=1e-4)\n"
        "x = torch.randn(5, requires_grad=True); _gemmt.square(x).sum().backward()\n"
        "assert torch.allclose(x.grad, 2 * x.detach())\n"
        "info = _gemmt.build_info(); assert info['build_system'] == 'cmake', info\n"
        "print('MODULE-OK')"
    )
    assert "MODULE-OK" in out
    # 2. A bare torch.ops.load_library: every op, autograd and Meta, no Python package.
    out = run_python(f"import torch; torch.ops.load_library({libs[0]!r})\n" + smoke(cuda))
    assert "SMOKE-OK" in out


def test_load_library_of_installed_extension() -> None:
    path = gemmt.library_path()
    out = run_python(f"import torch; torch.ops.load_library({path!r})\n" + smoke(HAS_CUDA))
    assert "SMOKE-OK" in out


def _library_env() -> dict[str, str]:
    # A source checkout on PYTHONPATH with $GEMMT_LIBRARY naming its build: the child needs
    # the same library (run_python drops the variable, as an installed package needs none).
    return {"GEMMT_LIBRARY": os.environ["GEMMT_LIBRARY"]} if "GEMMT_LIBRARY" in os.environ else {}


def test_import_registers_ops() -> None:
    # torch.ops.gemmt.* exists right after `import gemmt`, before any gemmt.* call, and a
    # compiled function whose first gemmt call is traced finds it too.
    out = run_python(
        "import torch, gemmt\n"
        "y = torch.ops.gemmt.linear(torch.randn(2, 3), torch.randn(4, 3), None, 'none')\n"
        "assert y.shape == (2, 4)\n"
        "print('IMPORT-OK')\n",
        env=_library_env(),
    )
    assert "IMPORT-OK" in out
    out = run_python(
        "import torch, gemmt\n"
        "f = torch.compile(lambda x, w: torch.ops.gemmt.linear(x, w, None, 'relu'), backend='eager')\n"
        "x, w = torch.randn(5, 8), torch.randn(3, 8)\n"
        "assert torch.allclose(f(x, w), torch.relu(x @ w.t()), atol=1e-5)\n"
        "print('COMPILE-OK')\n",
        env=_library_env(),
    )
    assert "COMPILE-OK" in out


def test_load_library_then_import_keeps_one_copy() -> None:
    # A bare load_library first, then the package: the package adopts that very file (a
    # second file would register the namespace twice, which the dispatcher refuses).
    path = gemmt.library_path()
    out = run_python(
        f"import torch; torch.ops.load_library({path!r})\n"
        "import gemmt, os\n"
        f"assert os.path.samefile(gemmt.library_path(), {path!r})\n"
        "assert torch.allclose(gemmt.mm(torch.eye(3), torch.ones(3, 2)), torch.ones(3, 2))\n"
        "print('ONE-COPY-OK')\n"
    )
    assert "ONE-COPY-OK" in out


def test_autoload_can_be_deferred() -> None:
    out = run_python(
        "import torch, gemmt\n"
        "from gemmt import _native\n"
        "assert not _native.is_loaded() and not hasattr(torch.ops.gemmt, 'mm')\n"
        "assert gemmt.mm(torch.eye(2), torch.eye(2)).shape == (2, 2)\n"
        "assert _native.is_loaded()\n"
        "print('DEFER-OK')\n",
        env={"GEMMT_AUTOLOAD": "0", **_library_env()},
    )
    assert "DEFER-OK" in out


def test_installed_package_reports_its_build() -> None:
    info = gemmt.build_info()
    assert info["torch_version"].split("+")[0] == torch.__version__.split("+")[0]
    for key in ("cuda", "cuda_version", "cuda_architectures", "compiler", "build_system"):
        assert key in info
    if HAS_CUDA:
        assert info["cuda"] and info["cuda_architectures"]


@pytest.mark.slow
def test_jit_load_and_load_inline(tmp_path: Path) -> None:
    code = (
        "import torch, gemmt, gemmt.jit\n"
        f"m = gemmt.jit.load(build_directory={str(tmp_path)!r})\n"
        "assert m.build_info()['build_system'] == 'jit'\n"
        "a, b = torch.randn(20, 30), torch.randn(30, 10); c = torch.empty(20, 10)\n"
        "m.gemm(c, a, b); assert torch.allclose(c, a @ b, atol=1e-4)\n"
        "assert torch.allclose(gemmt.mm(a, b), a @ b, atol=1e-4)\n"
        + smoke(HAS_CUDA)
        + "src = '#include <gemmt/types.h>\\n"
        "int64_t elem_bytes(int64_t t) { return (int64_t)gemmt::element_size("
        "static_cast<gemmt::ScalarType>(t)); }'\n"
        f"inl = gemmt.jit.load_inline('gemmt_inline_probe', src, functions=['elem_bytes'], "
        f"build_directory={str(tmp_path)!r})\n"
        "assert inl.elem_bytes(0) == 4 and inl.elem_bytes(2) == 2\n"
        "print('JIT-OK')\n"
    )
    os.makedirs(tmp_path, exist_ok=True)
    # gemmt is installed here, and importing it loads that build: the JIT way asks for no
    # load at import, as its docs say.
    assert "JIT-OK" in run_python(code, env={"GEMMT_AUTOLOAD": "0"})


@pytest.mark.slow
def test_setuptools_example(tmp_path: Path) -> None:
    example = REPO_ROOT / "examples" / "setuptools"
    build = tmp_path / "st"
    proc = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(build), "--build-temp",
         str(tmp_path / "tmp")],
        cwd=example, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    libs = glob.glob(str(build / "gemmt_setuptools*.so"))
    assert libs, list(build.iterdir())
    out = run_python(f"import torch; torch.ops.load_library({libs[0]!r})\n" + smoke(HAS_CUDA))
    assert "SMOKE-OK" in out
