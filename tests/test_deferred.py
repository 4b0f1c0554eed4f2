"""Kernel groups compiled on first use (include/gemmt/deferred.h).

On the CPU: the compile command a group's library is built with is the kernel library's own,
and a deferred group's files leave the install-time build. On the GPU (a build that defers
groups): a group compiles once into the cache and gives torch's results, later processes load
it without compiling, concurrent first uses compile it once, and a group that cannot be
compiled fails with an error that names the group and the reason.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gemmt
from conftest import HAS_CUDA, REPO_ROOT
from gemmt import _sources

CMAKE = shutil.which("cmake")
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def config_macros(header: Path) -> dict[str, str]:
    """The string macros of gemmt_deferred_config.h, unescaped."""
    out = {}
    for line in header.read_text().splitlines():
        m = re.match(r'#define (GEMMT_DEFERRED_\w+) (".*")$', line)
        if m:
            out[m.group(1)] = ast.literal_eval(m.group(2))
    return out


def configure_kernels(build: Path, groups: str, *extra: str) -> None:
    """Configures the kernel library alone (sm_80 and sm_90a) with `groups` deferred."""
    subprocess.run(
        [CMAKE, "-S", str(REPO_ROOT), "-B", str(build), "-G", "Ninja", "-DGEMMT_KERNELS_ONLY=ON",
         "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CUDA_ARCHITECTURES=80-real;90a",
         f"-DCMAKE_CUDA_COMPILER={NVCC}", f"-DGEMMT_DEFERRED_GROUPS={groups}", *extra],
        check=True, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.skipif(CMAKE is None or NVCC is None or shutil.which("ninja") is None,
                    reason="needs cmake, ninja and nvcc")
def test_group_libraries_compile_with_the_kernel_librarys_command(tmp_path: Path) -> None:
    build = tmp_path / "build"
    configure_kernels(build, "fp8;tf32;ladder", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON")
    macros = config_macros(build / "generated" / "gemmt_deferred_config.h")
    flags = macros["GEMMT_DEFERRED_FLAGS"].split("\n")[:-1]
    split = macros["GEMMT_DEFERRED_SPLIT_FLAG"]
    assert macros["GEMMT_DEFERRED_GROUP_LIST"] == "fp8,tf32,ladder"
    commands = {Path(e["file"]).resolve(): shlex.split(e["command"])
                for e in json.loads((build / "compile_commands.json").read_text())}
    groups = _sources.groups(REPO_ROOT)
    deferred = {p.resolve() for g in ("fp8", "tf32", "ladder") for p in groups[f"deferred_{g}"]}
    listed = {line.split(":", 1)[1] for line in macros["GEMMT_DEFERRED_FILES"].split("\n") if line}
    assert listed == {p.relative_to(REPO_ROOT).as_posix() for p in deferred}
    # The deferred files leave the library; every other kernel file stays in it.
    for path in groups["kernel_cuda"]:
        assert (path.resolve() in commands) == (path.resolve() not in deferred), path
    # The loader's command: the same arguments as the library's objects, file and paths aside.
    for rel in ("kernels/gemm_dispatch.cu", "kernels/sm90/instances_bf16_narrow.cu"):
        args = commands[(REPO_ROOT / rel).resolve()]
        kept = [a for a in args[1:] if not a.startswith("-I")]
        for drop in ("-o", "-c", "-x"):
            i = kept.index(drop)
            del kept[i:i + 2]
        expected = list(flags)
        if split and not rel.startswith("kernels/sm90/instances_"):
            expected.append(split)
        assert kept == expected, rel


DRIVER = r"""
#include <cstdio>
#include "gemmt/deferred.h"
int main(int argc, char** argv) {
  const bool ok = gemmt::deferred::load(argv[1]);
  std::printf("%d %s\n", ok ? 1 : 0, gemmt::deferred::failure());
  return 0;
}
"""


@pytest.mark.slow
@pytest.mark.skipif(CMAKE is None or NVCC is None or shutil.which("ninja") is None,
                    reason="needs cmake, ninja and nvcc")
def test_a_group_is_refused_when_the_headers_are_not_the_modules(tmp_path: Path) -> None:
    build = tmp_path / "build"
    configure_kernels(build, "ladder", f"-DPython_EXECUTABLE={sys.executable}")
    objects = [f"CMakeFiles/gemmt_kernels.dir/kernels/deferred/{n}.cu.o"
               for n in ("deferred_loader", "deferred_trampolines")]
    subprocess.run(["ninja", "-C", str(build), *objects], check=True, capture_output=True)
    # The digest the build wrote is the one cmake/header_digest.py gives for the tree.
    sys.path.insert(0, str(REPO_ROOT / "cmake"))
    try:
        import header_digest
    finally:
        sys.path.pop(0)
    written = (build / "generated" / "gemmt_header_digest.h").read_text()
    assert f'"{header_digest.digest(REPO_ROOT)}"' in written
    (tmp_path / "driver.cpp").write_text(DRIVER)
    subprocess.run([NVCC, "-std=c++17", f"-I{REPO_ROOT / 'include'}", str(tmp_path / "driver.cpp"),
                    *[str(build / o) for o in objects], "-ldl", "-o", str(tmp_path / "driver")],
                   check=True, capture_output=True)
    tree = tmp_path / "tree"
    for part in ("include", "kernels"):
        shutil.copytree(REPO_ROOT / part, tree / part)
    shutil.copy(REPO_ROOT / "sources.txt", tree)

    def load(**env: str) -> str:
        run_env = {**os.environ, "GEMMT_SOURCE_DIR": str(tree),
                   "GEMMT_CACHE_DIR": str(tmp_path / "cache"), **env}
        return subprocess.run([str(tmp_path / "driver"), "ladder"], capture_output=True,
                              text=True, env=run_env, check=True).stdout

    # The same headers pass the check (the build then stops at the missing compiler).
    same = load(GEMMT_NVCC=str(tmp_path / "no-such-nvcc"))
    assert same.startswith("0 ") and "cannot run the CUDA compiler" in same, same
    # An edited header is refused, whatever the compiler.
    with open(tree / "kernels" / "sm90" / "launchers.h", "a") as f:
        f.write("// edited\n")
    edited = load()
    assert edited.startswith("0 ") and "not the ones the module was built with" in edited, edited
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.so"))


def test_every_deferred_file_is_a_kernel_file() -> None:
    groups = _sources.groups(REPO_ROOT)
    kernel = set(groups["kernel_cuda"]) | set(groups["kernel_host"])
    names = [g for g in groups if g.startswith("deferred_")]
    assert "deferred_support" in names
    seen: set[Path] = set()
    for name in names:
        files = set(groups[name])
        assert files, f"{name} lists no file"
        assert files <= kernel, f"{name}: {sorted(map(str, files - kernel))}"
        if name != "deferred_support":
            assert not files & seen, f"{name} shares files with another group"
            seen |= files


# ---- On the GPU, with a build that defers groups -----------------------------------------

def deferred_groups() -> list[str]:
    return [g for g in str(gemmt.build_info().get("deferred_groups", "")).split(",") if g]


needs_deferral = pytest.mark.skipif(
    not HAS_CUDA or not {"fp64", "ladder", "tf32"} <= set(deferred_groups()),
    reason="needs a CUDA build that compiles the fp64, ladder and tf32 groups on first use")

SCRIPT = r"""
import sys, torch, gemmt
torch.manual_seed(0)
a = torch.randn(300, 200, device="cuda", dtype=torch.float64)
b = torch.randn(200, 100, device="cuda", dtype=torch.float64)
err = ((gemmt.mm(a, b) - a @ b).norm() / (a @ b).norm()).item()
assert err < 1e-12, err
c = torch.full((300, 100), float("nan"), device="cuda")
a32, b32 = a.float(), b.float()
gemmt.gemm(c, a32, b32, variant=sys.argv[1])
ref = a @ b
err = ((c.double() - ref).norm() / ref.norm()).item()
assert err < 1e-5, err
if len(sys.argv) > 2:
    torch.backends.cuda.matmul.allow_tf32 = True
    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 384, device="cuda")
    ref = a.double() @ b.double()
    err = ((gemmt.mm(a, b).double() - ref).norm() / ref.norm()).item()
    assert err < 5e-3, err
print("ok")
"""


def run_script(cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True,
                          env={**os.environ, "GEMMT_CACHE_DIR": str(cache), **env}, timeout=900)


@pytest.mark.cuda
@needs_deferral
def test_first_use_compiles_once_and_later_processes_load(tmp_path: Path) -> None:
    first = run_script(tmp_path, "naive", "tf32")
    assert first.returncode == 0, first.stderr
    for group in ("fp64", "ladder", "tf32"):
        assert f"compiling the '{group}' kernels" in first.stderr
        assert list(tmp_path.glob(f"kernels-*/libgemmt_{group}.so")), group
    again = run_script(tmp_path, "warp_tiled", "tf32")
    assert again.returncode == 0, again.stderr
    assert "compiling" not in again.stderr


@pytest.mark.cuda
@needs_deferral
def test_concurrent_first_uses_compile_once(tmp_path: Path) -> None:
    env = {**os.environ, "GEMMT_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, "smem_tiled"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    stderr = "".join(err for _, err in outs)
    assert stderr.count("compiling the 'fp64' kernels") == 1
    assert stderr.count("compiling the 'ladder' kernels") == 1


@pytest.mark.cuda
@needs_deferral
def test_a_group_that_cannot_compile_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_script(tmp_path, "naive", GEMMT_NVCC=str(tmp_path / "no-such-nvcc"))
    assert proc.returncode != 0
    assert "RuntimeError" in proc.stderr
    assert "kernel group 'fp64'" in proc.stderr and "GEMMT_NVCC" in proc.stderr
    assert "Segmentation" not in proc.stderr


@pytest.mark.cuda
@needs_deferral
def test_prepare_kernels_loads_the_groups() -> None:
    took = gemmt.prepare_kernels(["fp64", "ladder"])
    assert set(took) == {"fp64", "ladder"}
    with pytest.raises(ValueError, match="not compiled on first use"):
        gemmt.prepare_kernels(["no_such_group"])


@pytest.mark.cuda
@needs_deferral
def test_a_bare_load_library_finds_the_groups() -> None:
    # No gemmt package in the process: the library finds the sources beside itself (an
    # install's gemmt/_src) or in the tree it was built from.
    script = (
        "import torch\n"
        f"torch.ops.load_library({gemmt.library_path()!r})\n"
        "a = torch.randn(65, 33, device='cuda', dtype=torch.float64)\n"
        "b = torch.randn(33, 17, device='cuda', dtype=torch.float64)\n"
        "err = ((torch.ops.gemmt.mm(a, b) - a @ b).norm() / (a @ b).norm()).item()\n"
        "assert err < 1e-12, err\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=900, env={k: v for k, v in os.environ.items()
                                            if k not in ("PYTHONPATH", "GEMMT_SOURCE_DIR")})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
