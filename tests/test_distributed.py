"""gemmt in PyTorch's distributed stack, across processes: DTensor sharding rules, tensor
parallelism, FSDP2 and both on a 2-D mesh.

The scenarios live in ``distributed_scenarios.py``. For each backend and world size, one
process group of that many processes runs all of them (one start-up instead of one per
test) and each scenario's outcome becomes a test here. gloo runs on CPU with 2 and 4
processes; NCCL runs the same scenarios on GPUs and is skipped without enough of them.
Every launch is bounded: collectives time out inside the workers and the group as a whole
is killed after ``GEMMT_DIST_TIMEOUT`` seconds (default 300).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest
import torch
import torch.distributed as dist

import gemmt
from conftest import HAS_CUDA, REPO_ROOT

if not dist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import distributed_scenarios  # noqa: E402  (needs torch.distributed)

SCENARIO_FILE = Path(distributed_scenarios.__file__).resolve()
GROUP_TIMEOUT_S = float(os.environ.get("GEMMT_DIST_TIMEOUT", "300"))
COLLECTIVE_TIMEOUT_S = 60.0

GROUPS = [("gloo", 2), ("gloo", 4), ("nccl", 2), ("nccl", 4)]


def _skip_reason(backend: str, world: int) -> str | None:
    if backend != "nccl":
        return None
    if not HAS_CUDA:
        return "needs a CUDA device and a CUDA build of gemmt"
    if not dist.is_nccl_available():
        return "this torch has no NCCL"
    if torch.cuda.device_count() < world:
        return f"needs {world} CUDA devices, found {torch.cuda.device_count()}"
    return None


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # The workers import the gemmt this process imported, with the same library.
    package_root = str(Path(gemmt.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root, str(SCENARIO_FILE.parent)] + env.get("PYTHONPATH", "").split(os.pathsep))
    env["GEMMT_LIBRARY"] = gemmt.library_path()
    # One thread each: the workers share the machine's cores.
    env["OMP_NUM_THREADS"] = "1"
    return env


def _launch(backend: str, world: int, folder: Path, timeout_s: float = GROUP_TIMEOUT_S,
            ranks: list[int] | None = None,
            collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
            script: Path = SCENARIO_FILE,
            scenarios: Iterable[str] | None = None) -> dict[str, dict[int, str]]:
    """Run every scenario on ``world`` processes; per scenario, each rank's outcome.

    ``ranks`` starts only those ranks (to test the deadline with a group that cannot form).
    ``script`` is another file of scenarios run by ``distributed_scenarios.main`` (the
    expert-parallel ones of ``moe_parallel_scenarios.py``), ``scenarios`` their names.
    """
    ranks = list(range(world)) if ranks is None else ranks
    names = list(distributed_scenarios.SCENARIOS if scenarios is None else scenarios)
    store = folder / "store"
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    env = _worker_env()
    try:
        for rank in ranks:
            log = open(folder / f"log{rank}.txt", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, str(script), "--rank", str(rank), "--world-size",
                 str(world), "--backend", backend, "--store", str(store), "--out", str(folder),
                 "--timeout", str(collective_timeout_s)],
                stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        # Whatever happened, no worker outlives the launch.
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    outcomes: dict[str, dict[int, str]] = {}
    for rank, proc in zip(ranks, procs):
        path = folder / f"rank{rank}.json"
        results = json.loads(path.read_text()) if path.exists() else {}
        tail = (folder / f"log{rank}.txt").read_text(errors="replace")[-3000:]
        for name in names:
            outcomes.setdefault(name, {})[rank] = results.get(
                name, f"did not finish (exit code {proc.returncode}); log tail:\n{tail}")
    return outcomes


_cache: dict[tuple[str, int], dict[str, dict[int, str]]] = {}


Outcomes = dict[str, dict[int, str]]
Launcher = Callable[[str, int], Outcomes]


def launcher(tmp_path_factory: pytest.TempPathFactory, cache: dict[tuple[str, int], Outcomes],
             prefix: str, **launch_kwargs: Any) -> Launcher:
    """Launches each (backend, world size) group once, on first use, for a scenario file."""
    def get(backend: str, world: int) -> Outcomes:
        key = (backend, world)
        if key not in cache:
            cache[key] = _launch(backend, world,
                                 tmp_path_factory.mktemp(f"{prefix}_{backend}_{world}"),
                                 **launch_kwargs)
        return cache[key]
    return get


def scenario_params(names: Iterable[str]) -> list[object]:
    """One test parameter per (backend, world size, scenario), skipped where the group
    cannot run here."""
    params = []
    names = list(names)
    for backend, world in GROUPS:
        marks = [pytest.mark.cuda] if backend == "nccl" else []
        reason = _skip_reason(backend, world)
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        for name in names:
            params.append(pytest.param(backend, world, name, marks=marks,
                                       id=f"{backend}-{world}-{name}"))
    return params


def assert_every_rank_ok(outcome: dict[int, str]) -> None:
    failed = {rank: text for rank, text in outcome.items() if text != "ok"}
    assert not failed, "\n".join(f"rank {r}:\n{t}" for r, t in sorted(failed.items()))


@pytest.fixture(scope="module")
def group_outcomes(tmp_path_factory: pytest.TempPathFactory) -> Launcher:
    return launcher(tmp_path_factory, _cache, "dist")


@pytest.mark.parametrize(("backend", "world", "scenario"),
                         scenario_params(distributed_scenarios.SCENARIOS))
def test_scenario(group_outcomes: Launcher, backend: str, world: int, scenario: str) -> None:
    assert_every_rank_ok(group_outcomes(backend, world)[scenario])


def test_launch_is_bounded(tmp_path: Path) -> None:
    """A group that cannot form (its second rank never starts, and its collectives would
    wait for ten minutes) is killed at the launch's deadline, and every scenario reports it."""
    start = time.monotonic()
    outcomes = _launch("gloo", 2, tmp_path, timeout_s=10.0, ranks=[0],
                       collective_timeout_s=600.0)
    elapsed = time.monotonic() - start
    assert elapsed < 40.0, elapsed
    for name, by_rank in outcomes.items():
        assert by_rank[0].startswith("did not finish (exit code -9)"), (name, by_rank[0])


def test_registration_is_lazy_and_idempotent() -> None:
    """``import gemmt`` does not import DTensor; the rules are registered once DTensor and
    the library are both loaded, and registering again changes nothing."""
    code = (
        "import sys, gemmt\n"
        "assert 'torch.distributed.tensor' not in sys.modules, 'import gemmt pulled DTensor in'\n"
        "gemmt.mm(__import__('torch').ones(2, 2), __import__('torch').ones(2, 2))\n"
        "assert not gemmt.distributed.is_registered()\n"
        "import torch.distributed.tensor\n"
        "from torch.distributed.tensor import DTensor\n"
        "gemmt.distributed.maybe_register()\n"
        "assert gemmt.distributed.is_registered()\n"
        "prop = DTensor._op_dispatcher.sharding_propagator\n"
        "import torch\n"
        "assert torch.ops.gemmt.linear.default in prop.op_strategy_funcs\n"
        "before = dict(prop.op_strategy_funcs)\n"
        "assert gemmt.distributed.register()\n"
        "assert dict(prop.op_strategy_funcs) == before\n"
        "print('ok')\n")
    # And the other order: DTensor imported first, then an explicit register() as the
    # library's first use (the loader registers too, from inside register()).
    code_explicit = (
        "import torch.distributed.tensor, gemmt\n"
        "assert gemmt.distributed.register() and gemmt.distributed.is_registered()\n"
        "print('ok')\n")
    env = _worker_env()
    for source in (code, code_explicit):
        out = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_dtensor_host_path_is_lean(tmp_path: Path) -> None:
    """A tensor-parallel layer with small shards is bound by the host, and every DTensor
    dispatch costs tens of microseconds of Python: gemmt's ops take DTensor's flat (no
    pytree) argument path, and a Linear's forward and backward on 2-D DTensors dispatch no
    more DTensor calls than torch's Linear does (no reshape that changes nothing)."""
    code = """
import os, json, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(os.environ["STORE"], 1), rank=0,
                        world_size=1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.profiler import ProfilerActivity, profile
import gemmt
gemmt.distributed.register()
prop = DTensor._op_dispatcher.sharding_propagator
pytree = [n for n in gemmt.distributed._OPS
          if prop.op_to_schema_info[getattr(torch.ops.gemmt, n).default].needs_pytree]
mesh = init_device_mesh("cpu", (1,))
x = distribute_tensor(torch.randn(8, 16), mesh, [Replicate()]).requires_grad_()
w = distribute_tensor(torch.randn(32, 16), mesh, [Shard(0)]).requires_grad_()
counts = {}
for name, fn in (("torch", lambda: torch.nn.functional.linear(x, w)),
                 ("gemmt", lambda: gemmt.linear(x, w)),
                 ("gemmt_silu", lambda: gemmt.linear(x, w, None, "silu"))):
    fn().sum().backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn().sum().backward()
    counts[name] = sum(1 for e in prof.events() if e.name == "PythonSubclass")
print(json.dumps({"pytree": pytree, "counts": counts}))
dist.destroy_process_group()
"""
    env = _worker_env()
    env["STORE"] = str(tmp_path / "store")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["pytree"] == [], result
    counts = result["counts"]
    assert counts["torch"] > 0, counts  # the profiler sees DTensor's dispatches at all
    assert counts["gemmt"] <= counts["torch"] - 3, counts
    assert counts["gemmt_silu"] <= counts["torch"] - 2, counts


def test_rules_without_processes() -> None:
    """The rule tables themselves: row-wise only without activation, the bias of a partial
    sum Partial, and every op's rules covering each of its arguments."""
    pytest.importorskip("torch.distributed.tensor")
    from torch.distributed.tensor import Partial, Replicate, Shard
    from conftest import RuleSpec as Spec

    x, w, b = Spec(2, 3, 8), Spec(4, 8), Spec(4)
    rules = {r.name: r for r in gemmt.distributed.rules_for("linear", x, w, b, "none")}
    assert rules["row-wise"].inputs == (Shard(2), Shard(1), Partial(), None)
    assert rules["row-wise"].outputs == (Partial(),)
    assert rules["column-wise"].inputs == (Replicate(), Shard(0), Shard(0), None)
    assert rules["column-wise"].outputs == (Shard(2),)
    assert rules["batch (x sharded on dim 1)"].outputs == (Shard(1),)
    # With an activation, no partial sums anywhere.
    for activation in ("relu", "gelu", "gelu_tanh", "silu"):
        for rule in gemmt.distributed.rules_for("linear", x, w, None, activation):
            assert Partial() not in rule.inputs + rule.outputs, (activation, rule)
    bias_bwd = {r.inputs[0]: r.outputs[0]
                for r in gemmt.distributed.rules_for("linear_bias_backward", Spec(6, 4))}
    assert bias_bwd[Shard(0)] == Partial() and bias_bwd[Shard(1)] == Shard(0)
    # square is not linear: a partial sum is not accepted.
    assert all(Partial() not in r.inputs for r in gemmt.distributed.rules_for("square", x))
    with pytest.raises(KeyError, match="no sharding rules for op 'nope'"):
        gemmt.distributed.rules_for("nope")


def test_every_registered_op_has_rules() -> None:
    """A new op needs sharding rules (``gemmt/distributed.py``) to run on DTensors."""
    gemmt.build_info()
    registered = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
                  if s.name.startswith("gemmt::")}
    assert registered == set(gemmt.distributed._OPS)


def test_mlp_scaling_benchmark_runs_on_cpu(tmp_path: Path) -> None:
    """``benchmarks/mlp_tp_scaling.py`` (the GPU scaling figure) in its CPU form: one and two
    gloo processes, gemmt's block against torch's, a report with both timings and errors."""
    script = REPO_ROOT / "benchmarks" / "mlp_tp_scaling.py"
    out = subprocess.run(
        [sys.executable, str(script), "--device", "cpu", "--gpus", "1,2", "--dim", "32",
         "--hidden", "96", "--tokens", "64", "--rounds", "2", "--steps", "1", "--warmup", "1",
         "--out", str(tmp_path)],
        env=_worker_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "mlp_tp_scaling.json").read_text())
    assert [r["gpus"] for r in report["runs"]] == [1, 2]
    for run in report["runs"]:
        assert run["max_rel_err"] < 1e-5, run  # float32 on CPU
        for impl in ("torch", "gemmt"):
            assert run[impl]["step_ms"] > 0 and len(run[impl]["rounds_ms"]) == 2
    assert report["runs"][0]["gemmt"]["speedup"] == 1.0


@pytest.mark.parametrize("mode", ["tp", "fsdp"])
def test_training_example_matches_one_process(tmp_path: Path, mode: str) -> None:
    """``examples/distributed/train_mlp.py`` under torchrun (2 gloo processes): every step's
    loss equals the one-process model's, and the parameters agree to float32 rounding."""
    script = REPO_ROOT / "examples" / "distributed" / "train_mlp.py"
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--standalone", str(script), "--mode", mode, "--steps", "3", "--optim", "sgd"],
        env={**_worker_env(), "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
        timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines()
            if line.strip() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2], out.stdout
    for step, loss, ref_loss, diff, _ms in rows:
        assert loss == ref_loss, (step, loss, ref_loss)
        assert float(diff) < 1e-6, (step, diff)


def test_leave_process_group_frees_cycles_then_destroys(tmp_path: Path) -> None:
    """A one-process gloo group: leave_process_group collects garbage held in reference cycles
    (as a sharded model holds its process groups) before it destroys the group."""
    import gc
    import weakref

    class Holder:
        pass

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    gc.disable()  # no automatic collection between the cycle's release and the call
    try:
        held = Holder()
        held.self = held  # a cycle: only the garbage collector frees it
        held.group = dist.group.WORLD
        alive = weakref.ref(held)
        del held
        assert alive() is not None
        gemmt.distributed.leave_process_group(True)
        assert alive() is None
        assert not dist.is_initialized()
    finally:
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()
