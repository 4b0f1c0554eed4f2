"""The docs stay true to the tree: docs/adding-an-op.md quotes code that is in the files it
names, every path it names exists, and its op is registered and tested; every result file the
docs cite is committed."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import gemmt
from conftest import REPO_ROOT

WALKTHROUGH = REPO_ROOT / "docs" / "adding-an-op.md"
# A path of the tree in backticks: a known top-level folder, then anything without spaces.
PATH = re.compile(r"`((?:kernels|include|pytorch_wrapper|python|tests|docs|benchmarks|scripts|"
                  r"examples|cmake)/[^`\s*{}]+|sources\.txt)`")


def excerpts(text: str) -> list[tuple[str, str]]:
    """(path, code) for every fenced block introduced by a line "File: `path`"."""
    found = re.findall(r"^File: `([^`]+)`\n```[a-z]*\n(.*?)^```", text, re.M | re.S)
    assert found, "no excerpts found: the 'File: `path`' convention changed?"
    return found


def lines(text: str) -> str:
    # Indentation aside (an excerpt may be shown less indented than in its file).
    return "\n".join(line.strip() for line in text.strip().splitlines())


def test_walkthrough_excerpts_are_in_their_files() -> None:
    for path, code in excerpts(WALKTHROUGH.read_text()):
        source = lines((REPO_ROOT / path).read_text())
        # "..." lines separate excerpts taken from different places of one file.
        for chunk in re.split(r"^\.\.\.\n", code, flags=re.M):
            assert chunk.strip() and lines(chunk) in source, f"{path} no longer contains:\n{chunk}"


def test_walkthrough_paths_exist() -> None:
    paths = set(PATH.findall(WALKTHROUGH.read_text()))
    assert {"kernels/swiglu.cu", "pytorch_wrapper/registration.cpp", "tests/test_swiglu.py"} <= paths
    for path in paths:
        assert (REPO_ROOT / path).exists(), path


def test_walkthrough_op_is_registered_and_tested() -> None:
    gemmt.build_info()  # load the library
    schemas = {s.name: str(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith("gemmt::")}
    text = WALKTHROUGH.read_text()
    for name in ("gemmt::swiglu", "gemmt::swiglu_backward"):
        assert name in schemas, name
        # The schema the doc quotes is the registered one.
        assert schemas[name].replace("gemmt::", "") in text, schemas[name]
    assert "swiglu" in gemmt.__all__ and callable(gemmt.swiglu)
    tests = (REPO_ROOT / "tests" / "test_swiglu.py").read_text()
    for kind in ("gradcheck", "opcheck", "pytest.mark.cuda"):
        assert kind in tests, kind


def test_cited_result_files_exist() -> None:
    # Paths such as benchmarks/results/gemm_..._2026-11-24.{json,png}; braces expand. A path
    # after "<commit>:" names a file in git history (`git show 8c1bd2e:benchmarks/...`).
    for doc in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        for cited in re.findall(r"(?<!:)benchmarks/results/[^`\s)]*", doc.read_text()):
            cited = cited.rstrip(".,;:")
            brace = re.search(r"\{([^}]*)\}", cited)
            options = [cited[:brace.start()] + o + cited[brace.end():]
                       for o in brace.group(1).split(",")] if brace else [cited]
            for path in options:
                assert (REPO_ROOT / path).exists(), f"{doc.name} cites missing {path}"
