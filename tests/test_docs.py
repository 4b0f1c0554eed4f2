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
        for cited in re.findall(r"(?<!:)benchmarks/results/[^`\s)\]]*", doc.read_text()):
            cited = cited.rstrip(".,;:")
            brace = re.search(r"\{([^}]*)\}", cited)
            options = [cited[:brace.start()] + o + cited[brace.end():]
                       for o in brace.group(1).split(",")] if brace else [cited]
            for path in options:
                assert (REPO_ROOT / path).exists(), f"{doc.name} cites missing {path}"


README = REPO_ROOT / "README.md"
MOVED_DOCS = [REPO_ROOT / "docs" / "building.md", REPO_ROOT / "docs" / "distributed.md"]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_readme_keeps_the_two_setup_commands() -> None:
    text = README.read_text()
    for command in ("bash scripts/setup.sh && python -m gemmt",
                    "bash scripts/setup.sh --test && python -m pytest tests -q"):
        assert f"```bash\n{command}\n```" in text, command


def test_readme_python_snippets_run_on_cpu() -> None:
    # Every Python snippet of the README runs, in order and in one namespace (a later snippet
    # may use what an earlier one made), on CPU tensors. A snippet that truly needs CUDA or
    # transformers would be skipped with its reason; the README has none today, and at least
    # three must run.
    blocks = _python_blocks(README.read_text())
    namespace: dict[str, object] = {}
    ran = 0
    for code in blocks:
        if ".cuda()" in code or "device=\"cuda\"" in code:
            if not torch.cuda.is_available():
                continue  # needs a GPU: run where there is one
        if "import transformers" in code:
            continue  # needs transformers, which the README's set-up does not install
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
        ran += 1
    assert ran >= 3, f"only {ran} README snippets ran"
    # What the snippets claim, checked on their results.
    a, b, c, y = (namespace[k] for k in ("a", "b", "c", "y"))
    torch.testing.assert_close(c, a @ b)
    torch.testing.assert_close(y, a @ b)
    x, layer, z = namespace["x"], namespace["layer"], namespace["z"]
    assert isinstance(layer, gemmt.nn.Linear) and x.grad is not None and x.grad.shape == x.shape
    ref = torch.nn.functional.silu(torch.nn.functional.linear(x, layer.weight, layer.bias))
    torch.testing.assert_close(z, ref)
    model = namespace["model"]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, gemmt.nn.Linear) for m in linears)
    assert namespace["out"].shape == (8, 128)


def test_readme_is_short_and_its_links_exist() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150, "the README grew past 150 lines: move detail to docs/"
    targets = re.findall(r"\]\(([^)#\s]+)\)", text)
    for doc in ("docs/building.md", "docs/distributed.md", "docs/performance.md"):
        assert doc in targets, f"README does not link {doc}"
    for target in targets:
        if "://" not in target:
            assert (REPO_ROOT / target).exists(), f"README links missing {target}"


def test_readme_and_moved_docs_paths_exist() -> None:
    for doc in [README, *MOVED_DOCS]:
        for path in set(PATH.findall(doc.read_text())):
            assert (REPO_ROOT / path).exists(), f"{doc.name} names missing {path}"
