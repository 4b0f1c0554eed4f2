"""gemmt._toolchain: which compilers a build may use (those linking the process's libstdc++),
checked with stand-in compilers that report another GCC install's library."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from gemmt import _toolchain

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def other_install(tmp_path: Path) -> Path:
    """An empty stand-in for another GCC install's libstdc++, inside tmp_path."""
    lib = tmp_path / "opt" / "gcc" / "lib64" / "libstdc++.so"
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.touch()
    return lib


def fake_compiler(tmp_path: Path, name: str, libstdcxx: Path) -> str:
    """A script answering -print-file-name=libstdc++.so with ``libstdcxx`` (an existing
    file, which it only names)."""
    assert libstdcxx.exists(), libstdcxx
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\necho "{libstdcxx}"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_the_process_has_a_libstdcxx() -> None:
    loaded = _toolchain.loaded_libstdcxx()
    assert loaded is not None and os.path.isfile(loaded), loaded


def test_a_compiler_of_another_install_is_replaced(tmp_path: Path) -> None:
    loaded = _toolchain.loaded_libstdcxx()
    lib = other_install(tmp_path)
    other = fake_compiler(tmp_path, "g++", lib)
    same = fake_compiler(tmp_path, "g++-same", Path(loaded))
    assert _toolchain.mismatched([other, same], loaded) == [(other, os.path.realpath(lib))]
    env = {"CXX": other, "CUDAHOSTCXX": other, "CC": same}
    system_ok = not _toolchain.mismatched([_toolchain.SYSTEM_COMPILERS["CXX"]], loaded)
    got = _toolchain.replacements(env, loaded)
    if system_ok:
        assert got == {"CXX": "/usr/bin/g++", "CUDAHOSTCXX": "/usr/bin/g++"}
    else:  # nothing better to offer: the variables stay, CMake warns
        assert got == {}
    assert _toolchain.replacements({"CXX": same}, loaded) == {}
    assert _toolchain.replacements({}, loaded) == {}


def test_a_compiler_that_cannot_name_its_libstdcxx_counts_as_foreign(tmp_path: Path) -> None:
    # A wrapper script around another install's driver answers with the bare name.
    loaded = _toolchain.loaded_libstdcxx()
    wrapper = tmp_path / "g++"
    wrapper.write_text('#!/bin/sh\necho "libstdc++.so"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    assert _toolchain.compiler_libstdcxx(str(wrapper)) is None
    assert _toolchain.mismatched([str(wrapper)], loaded) == [
        (str(wrapper), "a libstdc++ it does not name")]
    # Not installed: nothing to say about it.
    assert _toolchain.mismatched([str(tmp_path / "absent-g++")], loaded) == []


def test_script_prints_exports_and_warnings(tmp_path: Path) -> None:
    other = fake_compiler(tmp_path, "g++", other_install(tmp_path))
    script = REPO_ROOT / "python" / "gemmt" / "_toolchain.py"
    env = {**os.environ, "CXX": other}
    env.pop("CUDAHOSTCXX", None)
    env.pop("CC", None)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, check=True)
    loaded = _toolchain.loaded_libstdcxx()
    if not _toolchain.mismatched(["/usr/bin/g++"], loaded):
        assert out.stdout.strip() == "export CXX=/usr/bin/g++", out
        assert "does not link the libstdc++" in out.stderr
    check = subprocess.run([sys.executable, str(script), "--check", other], capture_output=True,
                           text=True, check=True)
    assert other in check.stdout and "would crash" in check.stdout, check.stdout
