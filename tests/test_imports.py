"""The modules of the gemmt package import one another without circles: every import of a
submodule, at module level or inside a function, is an edge, and the edges form no cycle.
(The package itself, ``import gemmt``, is left out: every submodule is loaded through it.)

Two circles once existed, ``_native`` <-> ``distributed`` and ``bench`` <-> ``bench_linear``;
they are named below so that a failure says which came back."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "python" / "gemmt"


def _submodules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | {"_gemmt"}


def _imports(path: Path, submodules: set[str]) -> set[str]:
    """The gemmt submodules that ``path`` imports anywhere in its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "gemmt" and len(parts) > 1:
                    found.add(parts[1])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path.name}: relative import (the graph reads absolute ones)")
            parts = (node.module or "").split(".")
            if parts[0] != "gemmt":
                continue
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found |= {a.name for a in node.names if a.name in submodules}
    return found & submodules


def _graph() -> dict[str, set[str]]:
    subs = _submodules()
    return {p.stem: _imports(p, subs) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_graph_sees_the_known_edges() -> None:
    # The parser finds real imports, so an empty graph cannot pass the checks below.
    graph = _graph()
    assert "_native" in graph["distributed"]
    assert "_report" in graph["bench"] and "_report" in graph["bench_linear"]
    assert "bench_linear" in graph["bench"]


def test_native_does_not_import_distributed() -> None:
    graph = _graph()
    assert "distributed" not in graph["_native"], "_native imports distributed again"


def test_bench_linear_does_not_import_bench() -> None:
    graph = _graph()
    assert "bench" not in graph["bench_linear"], "bench_linear imports bench again"


def test_no_import_cycle_in_the_package() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_loading_the_library_registers_the_sharding_rules_in_a_fresh_process() -> None:
    # The loader no longer imports distributed; its on-load hook must still give DTensor the
    # rules when the library loads in a process that uses DTensor.
    if not torch.distributed.is_available():
        pytest.skip("this torch has no torch.distributed")
    code = (
        "import torch.distributed.tensor\n"
        "import gemmt, gemmt._native as n\n"
        "assert gemmt.distributed.maybe_register in n._on_load, n._on_load\n"
        "gemmt.build_info()\n"
        "assert gemmt.distributed.is_registered()\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE.parent), env.get("PYTHONPATH")]))
    # The source tree's package holds no built extension: the child loads this process's.
    import gemmt

    env["GEMMT_LIBRARY"] = gemmt.library_path()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
