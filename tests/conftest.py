"""Shared fixtures: the devices to test on, float64 references and error measures."""

from __future__ import annotations

import os
from typing import Any
from pathlib import Path

import pytest
import torch

import gemmt

REPO_ROOT = Path(__file__).resolve().parent.parent
HAS_CUDA = torch.cuda.is_available() and bool(gemmt.build_info().get("cuda"))

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device and a CUDA build of gemmt")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)
        # Parametrised over devices: mark CUDA cases so `-m cuda` selects them.
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("device") == "cuda":
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(int(os.environ.get("GEMMT_TEST_SEED", "1234")))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ||out - ref|| / ||ref|| in float64 (NaN fails any bound)."""
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    denom = ref64.norm().item()
    err = (out64 - ref64).norm().item()
    return err / denom if denom > 0 else err


def tol_for(dtype: torch.dtype, allow_tf32: bool = False) -> float:
    """Relative-error bound of a float32-accumulated product in `dtype`."""
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2
    if dtype == torch.float32:
        return 5e-3 if allow_tf32 else 1e-5
    return 1e-12


def divide_ref(vol: torch.Tensor, max_val: float) -> torch.Tensor:
    """IEEE float32 division vol / float32(max_val), correctly rounded.

    The quotient of two float32 values computed in float64 and rounded to float32 is the
    correctly rounded float32 quotient. (PyTorch's CUDA kernel for tensor / scalar multiplies
    by the reciprocal instead, which can be 1 ulp off, so it is not the reference.)
    """
    m = float(torch.tensor(max_val, dtype=torch.float32))
    return (vol.double() / m).float()


class RuleSpec:
    """The two fields of a DTensor spec that gemmt's sharding rules read, for a tensor of
    ``shape`` (tests of the rules without processes)."""

    def __init__(self, *shape: int) -> None:
        from torch.distributed.tensor._dtensor_spec import TensorMeta

        self.placements = ()
        self.tensor_meta = TensorMeta(torch.Size(shape), (1,) * len(shape), torch.float32)


def torch_act(z: torch.Tensor, activation: str) -> torch.Tensor:
    """torch's own form of each of gemmt.ACTIVATIONS."""
    if activation == "relu":
        return torch.relu(z)
    if activation == "gelu":
        return torch.nn.functional.gelu(z)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(z, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(z)
    return z


def randn(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, device=device).to(dtype)


def opcheck_float8(op: Any, args: tuple, kwargs: dict, float8_inputs: bool) -> None:
    """torch.library.opcheck of an op; with float8 inputs its test_schema (which compares the
    inputs before and after the call with torch.allclose, not implemented for float8 on the
    CPU in torch 2.13) is replaced by the same checks made here: no input mutated, the output
    aliasing none."""
    utils = ["test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_dynamic"]
    if float8_inputs:
        utils.remove("test_schema")
        tensors = [t for t in args if isinstance(t, torch.Tensor)]
        before = [t.clone() for t in tensors]
        out = op(*args, **kwargs)

        def raw(t: torch.Tensor) -> torch.Tensor:
            return t.view(torch.uint8) if t.element_size() == 1 else t

        for old, new in zip(before, tensors):
            assert torch.equal(raw(old), raw(new))
            assert out.untyped_storage().data_ptr() != new.untyped_storage().data_ptr()
    result = torch.library.opcheck(op, args, kwargs, test_utils=utils)
    failed = {k: v for k, v in result.items() if v != "SUCCESS"}
    assert not failed, (op, failed)
