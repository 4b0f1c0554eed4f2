"""sources.txt is the one source list: CMake and the Python build routes read the same files
from it, files in subfolders are found, and the pip sdist carries it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from gemmt import _sources, jit

CMAKE = shutil.which("cmake")


def cmake_listing(root: Path) -> list[tuple[str, str]]:
    """(group, relative path) pairs as cmake/GemmtSources.cmake lists them for `root`."""
    proc = subprocess.run(
        [CMAKE, f"-DGEMMT_SOURCE_ROOT={root}", "-P", str(REPO_ROOT / "cmake" / "GemmtSources.cmake")],
        capture_output=True, text=True, check=True,
    )
    return [tuple(line.split(" ", 1)) for line in proc.stderr.splitlines() if line.strip()]


def python_listing(root: Path) -> list[tuple[str, str]]:
    root = root.resolve()
    return [(group, p.relative_to(root).as_posix())
            for group, files in _sources.groups(root).items() for p in files]


@pytest.mark.skipif(CMAKE is None, reason="needs cmake")
def test_cmake_and_python_read_the_same_sources() -> None:
    listed = python_listing(REPO_ROOT)
    assert listed == cmake_listing(REPO_ROOT)
    on_disk = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "kernels").rglob("*.cu")}
    assert {path for group, path in listed if group == "kernel_cuda"} == on_disk
    assert any(group == "wrapper" and path == "pytorch_wrapper/registration.cpp"
               for group, path in listed)


@pytest.mark.skipif(CMAKE is None, reason="needs cmake")
def test_files_in_subfolders_are_found_by_every_reader(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "sources.txt", tmp_path)
    files = ["kernels/a.cu", "kernels/gemm/sm90/b.cu", "kernels/plan/c.cpp", "kernels/d.cuh",
             "pytorch_wrapper/e.cpp", "pytorch_wrapper/extra/f.cpp"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    expected = [("kernel_cuda", "kernels/a.cu"), ("kernel_cuda", "kernels/gemm/sm90/b.cu"),
                ("kernel_host", "kernels/plan/c.cpp"), ("wrapper", "pytorch_wrapper/e.cpp"),
                # compiled into each library of kernels compiled on first use, too
                ("deferred_support", "kernels/plan/c.cpp")]
    assert python_listing(tmp_path) == expected
    assert cmake_listing(tmp_path) == expected
    with_cuda = [p.relative_to(tmp_path.resolve()).as_posix()
                 for p in _sources.sources(tmp_path, with_cuda=True)]
    assert with_cuda == ["pytorch_wrapper/e.cpp", "kernels/plan/c.cpp", "kernels/a.cu",
                         "kernels/gemm/sm90/b.cu"]
    # The planners are plain C++: CPU-only builds compile (and test) them too.
    cpu_only = [p.relative_to(tmp_path.resolve()).as_posix()
                for p in _sources.sources(tmp_path, with_cuda=False)]
    assert cpu_only == ["pytorch_wrapper/e.cpp", "kernels/plan/c.cpp"]


def test_jit_compiles_what_the_list_says() -> None:
    listed = _sources.groups(jit.source_root())
    assert jit.sources(with_cuda=False) == [
        str(p) for p in listed["wrapper"] + listed.get("kernel_host", [])]
    with_cuda = jit.sources(with_cuda=True)
    # The tree the loader compiles: the checkout, or the copy an installed package carries.
    for cu in (Path(jit.source_root()) / "kernels").rglob("*.cu"):
        assert str(cu.resolve()) in with_cuda, cu


def test_object_name_clash_is_refused(tmp_path: Path) -> None:
    # torch's JIT names objects after the file name alone.
    a, b = tmp_path / "x" / "k.cu", tmp_path / "y" / "k.cu"
    with pytest.raises(ValueError, match="share the object name 'k.cuda.o'"):
        _sources.check_object_names([a, b])
    _sources.check_object_names([tmp_path / "k.cu", tmp_path / "k.cpp"])  # k.cuda.o, k.o


def test_malformed_manifest_lines_are_refused(tmp_path: Path) -> None:
    (tmp_path / "sources.txt").write_text("kernel_cuda kernels/**/sub/**/*.cu\n")
    with pytest.raises(ValueError, match="'\\*\\*' must be one folder component"):
        _sources.read_manifest(tmp_path)
    (tmp_path / "sources.txt").write_text("just-one-field\n")
    with pytest.raises(ValueError, match="expected '<group> <pattern>'"):
        _sources.read_manifest(tmp_path)


def test_sdist_carries_the_source_list(tmp_path: Path) -> None:
    pytest.importorskip("scikit_build_core")
    proc = subprocess.run(
        [sys.executable, "-c",
         f"from scikit_build_core.build import build_sdist; print(build_sdist({str(tmp_path)!r}))"],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    sdist = tmp_path / proc.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = {"sources.txt", "cmake/GemmtSources.cmake", "python/gemmt/_sources.py"}
    needed |= {p for _, p in python_listing(REPO_ROOT)}
    assert needed <= names, sorted(needed - names)


def _build_report() -> object:
    spec = importlib.util.spec_from_file_location(
        "build_report", REPO_ROOT / "scripts" / "build_report.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_compile_seconds_table_names_listed_sources_longest_first() -> None:
    """cmake/compile_seconds.txt, which orders the targets' sources, names files of sources.txt
    (a renamed file would silently fall to the end of the build order), longest first."""
    listed = {path for _, path in python_listing(REPO_ROOT)}
    rows = [line.split(" ", 1) for line in
            (REPO_ROOT / "cmake" / "compile_seconds.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert len(rows) > 40
    seconds = [float(s) for s, _ in rows]
    assert seconds == sorted(seconds, reverse=True)
    assert {path for _, path in rows} <= listed, sorted({p for _, p in rows} - listed)


def test_build_report_writes_the_table_from_ninja_log(tmp_path: Path) -> None:
    (tmp_path / ".ninja_log").write_text(
        "# ninja log v6\n"
        "0\t4000\t0\tCMakeFiles/gemmt_kernels.dir/kernels/a.cu.o\tx\n"
        "100\t9100\t0\tCMakeFiles/_gemmt.dir/pytorch_wrapper/b.cpp.o\tx\n"
        "200\t2200\t0\tCMakeFiles/_gemmt.dir/cmake_pch.hxx.gch\tx\n"
        "9100\t9600\t0\t_gemmt.so\tx\n")
    report = _build_report()
    steps, wall = report.ninja_times(str(tmp_path))
    assert wall == pytest.approx(9.6)
    assert steps[0] == (9.0, "CMakeFiles/_gemmt.dir/pytorch_wrapper/b.cpp.o", 0.1)
    report.write_weights(str(tmp_path / "table.txt"), steps)
    rows = [line for line in (tmp_path / "table.txt").read_text().splitlines()
            if not line.startswith("#")]
    assert rows == ["9.0 pytorch_wrapper/b.cpp", "4.0 kernels/a.cu"]


@pytest.mark.skipif(CMAKE is None, reason="needs cmake")
def test_cmake_orders_sources_by_the_table(tmp_path: Path) -> None:
    """gemmt_longest_first: the table's files first in its order, the others after in theirs."""
    (tmp_path / "cmake").mkdir()
    (tmp_path / "cmake" / "compile_seconds.txt").write_text(
        "# seconds\n9.0 kernels/c.cu\n5.0 kernels/gone.cu\n3.0 kernels/a.cu\n")
    script = tmp_path / "order.cmake"
    script.write_text(
        f'include("{(REPO_ROOT / "cmake" / "GemmtSources.cmake").as_posix()}")\n'
        f'set(root "{tmp_path.as_posix()}")\n'
        'set(files "${root}/kernels/a.cu;${root}/kernels/b.cu;${root}/kernels/c.cu;'
        '${root}/kernels/d.cu")\n'
        'gemmt_longest_first(files "${root}")\n'
        'foreach(f IN LISTS files)\n  message(NOTICE "${f}")\nendforeach()\n')
    proc = subprocess.run([CMAKE, "-P", str(script)], capture_output=True, text=True, check=True)
    order = [Path(line).name for line in proc.stderr.splitlines() if line.strip()]
    assert order == ["c.cu", "a.cu", "b.cu", "d.cu"]
