"""Mixture of experts: grouped_mm against a float64 loop over the groups (and torch's own
_grouped_mm), routing, the expert layer, gradients, opcheck, torch.compile, bad input, and
transformers' MoE models with the "gemmt" experts implementation."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gemmt
from conftest import rel_err
from gemmt.ops import grouped_mm, moe_experts, moe_permute, moe_route

ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def offsets(sizes: list[int]) -> torch.Tensor:
    """int32 cumulative group ends for groups of these sizes."""
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)


def tol(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)


def act_ref(z: torch.Tensor, activation: str) -> torch.Tensor:
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "none": lambda t: t,
        "relu": torch.relu,
        "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        "silu": torch.nn.functional.silu,
    }
    return fns[activation](z)


def ref_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, activation: str = "none") -> torch.Tensor:
    """The definition, one group at a time in float64 (rows/columns of no group are 0)."""
    a, b = a.double(), b.double()
    ends = [] if offs is None else offs.tolist()
    starts = [0] + ends[:-1]
    if a.dim() == 3 and b.dim() == 3:
        out = a @ b
        if bias is not None:
            out = out + bias.double().unsqueeze(1)
    elif a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = a[s:e] @ b[g] + (0 if bias is None else bias[g].double())
    elif a.dim() == 2 and b.dim() == 2:
        out = torch.zeros(len(ends), a.shape[0], b.shape[1], dtype=torch.float64)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[g] = a[:, s:e] @ b[s:e]
    else:
        out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[:, s:e] = a[g] @ b[:, s:e]
    return act_ref(out, activation)


# Group sizes: empty groups first, last and in between; everything in one group; odd sizes;
# rows past the last offset (they belong to no group).
GROUP_CASES = {
    "empty_groups": ([0, 5, 0, 3, 0], 8),
    "all_to_one": ([0, 0, 11, 0], 11),
    "odd": ([1, 7, 3, 13], 24),
    "tail_rows": ([2, 3], 9),
    "one_group": ([6], 6),
}


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("case", sorted(GROUP_CASES))
def test_grouped_mm_2d_3d_matches_loop(case: str, dtype: torch.dtype) -> None:
    sizes, rows = GROUP_CASES[case]
    a = torch.randn(rows, 19).to(dtype)
    b = torch.randn(len(sizes), 19, 13).to(dtype)
    offs = offsets(sizes)
    out = grouped_mm(a, b, offs)
    assert out.shape == (rows, 13) and out.dtype == dtype
    ref = ref_grouped_mm(a, b, offs)
    assert rel_err(out, ref) <= tol(dtype)
    assert torch.all(out[offs[-1]:] == 0)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("activation", gemmt.ACTIVATIONS)
def test_grouped_mm_bias_and_activation(dtype: torch.dtype, activation: str) -> None:
    sizes = [3, 0, 5, 1]
    a, b = torch.randn(9, 10).to(dtype), torch.randn(4, 10, 7).to(dtype)
    bias = torch.randn(4, 7).to(dtype)
    out = grouped_mm(a, b, offsets(sizes), bias, activation=activation)
    ref = ref_grouped_mm(a, b, offsets(sizes), bias, activation)
    assert rel_err(out, ref) <= 2 * tol(dtype)
    a3 = torch.randn(4, 5, 10).to(dtype)
    out3 = grouped_mm(a3, b, None, bias, activation=activation)
    assert rel_err(out3, ref_grouped_mm(a3, b, None, bias, activation)) <= 2 * tol(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_grouped_mm_3d_3d_2d_2d_3d_2d_match_loop(dtype: torch.dtype) -> None:
    a3, b3 = torch.randn(5, 6, 9).to(dtype), torch.randn(5, 9, 4).to(dtype)
    assert rel_err(grouped_mm(a3, b3), ref_grouped_mm(a3, b3)) <= tol(dtype)
    # 2D x 2D: the per-group products over K, empty groups giving zeros.
    sizes = [0, 4, 0, 7, 2, 0]
    offs = offsets(sizes)
    a2, b2 = torch.randn(6, 13).to(dtype), torch.randn(13, 5).to(dtype)
    out = grouped_mm(a2, b2, offs)
    assert out.shape == (6, 6, 5)
    assert rel_err(out, ref_grouped_mm(a2, b2, offs)) <= tol(dtype)
    assert torch.all(out[0] == 0) and torch.all(out[2] == 0) and torch.all(out[5] == 0)
    # 3D x 2D: column groups of b.
    a32, b32 = torch.randn(6, 4, 8).to(dtype), torch.randn(8, 15).to(dtype)
    offs32 = offsets([3, 0, 5, 2, 0, 4])
    out = grouped_mm(a32, b32, offs32)
    assert out.shape == (4, 15)
    assert rel_err(out, ref_grouped_mm(a32, b32, offs32)) <= tol(dtype)


def test_grouped_mm_reads_strided_operands() -> None:
    # transformers stores expert weights as (out, in): the product reads a transposed view.
    w = torch.randn(3, 12, 10)
    a = torch.randn(9, 10)[:, :]
    offs = offsets([4, 0, 5])
    out = grouped_mm(a, w.transpose(1, 2), offs)
    assert rel_err(out, ref_grouped_mm(a, w.transpose(1, 2), offs)) <= 1e-5
    a_t = torch.randn(10, 9).t()
    assert rel_err(grouped_mm(a_t, w.transpose(1, 2), offs),
                   ref_grouped_mm(a_t, w.transpose(1, 2), offs)) <= 1e-5


def test_grouped_mm_out_dtype_float32() -> None:
    a, b = torch.randn(12, 16).bfloat16(), torch.randn(3, 16, 8).bfloat16()
    offs = offsets([4, 4, 4])
    out = grouped_mm(a, b, offs, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    # The operands are exact in float32, so the result is the float32 product.
    assert rel_err(out, ref_grouped_mm(a, b, offs)) <= 1e-5


def _torch_grouped_mm_on_cpu() -> bool:
    try:
        a, b = torch.randn(8, 16), torch.randn(2, 16, 8)
        torch._grouped_mm(a, b, offsets([3, 5]))
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


@pytest.mark.skipif(not _torch_grouped_mm_on_cpu(), reason="this torch has no CPU _grouped_mm")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_matches_torch_grouped_mm(dtype: torch.dtype) -> None:
    # Sizes that meet torch's 16-byte stride rule; groups empty and uneven.
    offs = offsets([0, 16, 3, 0, 13])
    a, b = torch.randn(40, 32).to(dtype), torch.randn(5, 32, 24).to(dtype)
    mine, theirs = grouped_mm(a, b, offs), torch._grouped_mm(a, b, offs)
    # Rows past offs[-1] are unspecified in torch; compare the grouped ones.
    n = int(offs[-1])
    assert rel_err(mine[:n], theirs[:n]) <= tol(dtype)
    a3, b3 = torch.randn(4, 8, 32).to(dtype), torch.randn(4, 32, 16).to(dtype)
    assert rel_err(grouped_mm(a3, b3), torch._grouped_mm(a3, b3)) <= tol(dtype)
    a2, b2 = torch.randn(32, 40).to(dtype).t().contiguous().t(), torch.randn(40, 16).to(dtype)
    mine2, theirs2 = grouped_mm(a2, b2, offsets([8, 0, 24, 8])), None
    try:
        theirs2 = torch._grouped_mm(a2, b2, offsets([8, 0, 24, 8]))
    except RuntimeError:
        pass  # a layout this torch does not take on CPU
    if theirs2 is not None:
        assert rel_err(mine2, theirs2) <= tol(dtype)


# ---- bad input: every error names the op and the argument ----

def _bad_grouped_mm_cases() -> list[tuple[str, Callable[[], Any], str]]:
    a, b = torch.randn(8, 6), torch.randn(3, 6, 4)
    good = offsets([2, 3, 3])
    return [
        ("decreasing", lambda: grouped_mm(a, b, torch.tensor([4, 2, 8], dtype=torch.int32)),
         r"'offs'.*non-decreasing.*offs\[1\] = 2 after offs\[0\] = 4"),
        ("negative", lambda: grouped_mm(a, b, torch.tensor([-1, 2, 8], dtype=torch.int32)),
         r"'offs'.*non-negative"),
        ("past_rows", lambda: grouped_mm(a, b, torch.tensor([2, 5, 9], dtype=torch.int32)),
         r"'offs'.*<= 8.*offs\[2\] = 9"),
        ("past_k", lambda: grouped_mm(torch.randn(4, 6), torch.randn(6, 5),
                                      torch.tensor([3, 7], dtype=torch.int32)),
         r"'offs'.*<= 6"),
        ("int64", lambda: grouped_mm(a, b, good.long()), r"'offs'.*Int.*got.*Long"),
        ("float_offs", lambda: grouped_mm(a, b, good.float()), r"'offs'.*Int"),
        ("offs_2d", lambda: grouped_mm(a, b, good.view(1, 3)), r"'offs'.*1-D"),
        ("offs_count", lambda: grouped_mm(a, b, offsets([4, 4])), r"'offs'.*one offset per group"),
        ("no_offs", lambda: grouped_mm(a, b), r"'offs'.*got None"),
        ("offs_3d3d", lambda: grouped_mm(torch.randn(3, 2, 6), b, good), r"'offs'.*expected None"),
        ("k_mismatch", lambda: grouped_mm(torch.randn(8, 5), b, good),
         r"'a' and 'b'.*contraction"),
        ("groups_3d3d", lambda: grouped_mm(torch.randn(2, 4, 6), b),
         r"'a' and 'b'.*same number of groups"),
        ("dtype_mismatch", lambda: grouped_mm(a.double(), b, good), r"'a' and 'b'.*dtype"),
        ("int_operands", lambda: grouped_mm(a.int(), b.int(), good), r"'a'.*dtype"),
        ("rank_1", lambda: grouped_mm(torch.randn(6), b, good), r"'a'.*2-D or 3-D"),
        ("rank_4", lambda: grouped_mm(a, torch.randn(1, 3, 6, 4), good), r"'b'.*2-D or 3-D"),
        ("bias_shape", lambda: grouped_mm(a, b, good, torch.randn(3, 5)),
         r"'bias'.*\[3, 4\]"),
        ("bias_2d_b", lambda: grouped_mm(torch.randn(4, 6), torch.randn(6, 5), good,
                                         torch.randn(3, 5)), r"'bias'.*3-D"),
        ("bias_dtype", lambda: grouped_mm(a, b, good, torch.randn(3, 4).double()),
         r"'a' and 'bias'.*dtype"),
        ("out_dtype", lambda: grouped_mm(a, b, good, out_dtype=torch.float16), r"'out_dtype'"),
        ("activation", lambda: grouped_mm(a, b, good, activation="tanh"),
         r"'activation'.*'silu'.*got 'tanh'"),
    ]


@pytest.mark.parametrize("case", _bad_grouped_mm_cases(), ids=lambda c: c[0])
def test_grouped_mm_refuses_bad_input(case: tuple[str, Callable[[], Any], str]) -> None:
    _, call, pattern = case
    with pytest.raises(RuntimeError, match=r"gemmt::grouped_mm: .*" + pattern):
        call()


def test_grouped_mm_meta_reads_no_offsets() -> None:
    # Meta tensors have no data: shapes must follow from the operands alone.
    m = "meta"
    offs = torch.empty(3, dtype=torch.int32, device=m)
    assert grouped_mm(torch.empty(10, 6, device=m), torch.empty(3, 6, 4, device=m), offs).shape == (10, 4)
    assert grouped_mm(torch.empty(5, 10, device=m), torch.empty(10, 4, device=m), offs).shape == (3, 5, 4)
    assert grouped_mm(torch.empty(3, 5, 6, device=m), torch.empty(6, 9, device=m), offs).shape == (5, 9)
    out = grouped_mm(torch.empty(3, 5, 6, device=m, dtype=torch.bfloat16),
                     torch.empty(3, 6, 2, device=m, dtype=torch.bfloat16), out_dtype=torch.float32)
    assert out.shape == (3, 5, 2) and out.dtype == torch.float32
    with pytest.raises(RuntimeError, match="gemmt::grouped_mm: .*contraction"):
        grouped_mm(torch.empty(10, 5, device=m), torch.empty(3, 6, 4, device=m), offs)


# ---- gradients ----

def _gradcheck(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> None:
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("activation", ["none", "relu", "gelu_tanh", "silu"])
def test_grouped_mm_gradcheck_2d_3d(activation: str) -> None:
    offs = offsets([3, 0, 4, 1])  # one row past the last offset
    a = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 5, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    _gradcheck(lambda a, b, c: grouped_mm(a, b, offs, c, activation=activation), a, b, bias)


def test_grouped_mm_gradcheck_other_layouts() -> None:
    d = torch.float64
    a3, b3 = torch.randn(3, 4, 5, dtype=d), torch.randn(3, 5, 2, dtype=d)
    bias = torch.randn(3, 2, dtype=d, requires_grad=True)
    _gradcheck(lambda a, b, c: grouped_mm(a, b, None, c), a3.requires_grad_(),
               b3.requires_grad_(), bias)
    offs_k = offsets([2, 0, 5, 1])
    _gradcheck(lambda a, b: grouped_mm(a, b, offs_k), torch.randn(3, 9, dtype=d).requires_grad_(),
               torch.randn(9, 4, dtype=d).requires_grad_())
    offs_n = offsets([2, 0, 3])
    _gradcheck(lambda a, b: grouped_mm(a, b, offs_n),
               torch.randn(3, 4, 5, dtype=d).requires_grad_(),
               torch.randn(5, 6, dtype=d).requires_grad_())


def test_grouped_mm_gradgradcheck() -> None:
    offs = offsets([2, 3])
    a = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    for act in ("none", "silu"):
        assert torch.autograd.gradgradcheck(lambda a, b: grouped_mm(a, b, offs, activation=act),
                                            (a, b))


def test_grouped_mm_backward_with_out_dtype() -> None:
    a = torch.randn(7, 8).bfloat16().requires_grad_()
    b = torch.randn(2, 8, 4).bfloat16().requires_grad_()
    offs = offsets([3, 4])
    out = grouped_mm(a, b, offs, out_dtype=torch.float32)
    g = torch.randn_like(out)
    out.backward(g)
    assert a.grad.dtype == torch.bfloat16 and b.grad.dtype == torch.bfloat16
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref_grouped_mm_autograd = grouped_mm(a64, b64, offs)
    ref_grouped_mm_autograd.backward(g.double())
    assert rel_err(a.grad, a64.grad) <= 1e-2 and rel_err(b.grad, b64.grad) <= 1e-2


@pytest.mark.parametrize("batched", [False, True])
def test_grouped_mm_weight_gradient_keeps_the_weights_layout(batched: bool) -> None:
    # A weight stored (E, N, K) and used as w.transpose(1, 2) gets its gradient in that
    # storage order, so autograd has nothing to copy; its values are the float64 product's.
    e, k, n = 3, 8, 5
    w = torch.randn(e, n, k, dtype=torch.float64, requires_grad=True)
    if batched:
        a = torch.randn(e, 6, k, dtype=torch.float64, requires_grad=True)
        out = grouped_mm(a, w.transpose(1, 2))
    else:
        a = torch.randn(9, k, dtype=torch.float64, requires_grad=True)
        offs = offsets([4, 0, 5])
        out = grouped_mm(a, w.transpose(1, 2), offs)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    assert w.grad.stride() == w.stride(), w.grad.stride()
    w_ref = w.detach().clone().requires_grad_()
    ref = ref_grouped_mm(a.detach(), w_ref.transpose(1, 2), None if batched else offs)
    (ref * g).sum().backward()
    assert rel_err(w.grad, w_ref.grad) <= 1e-12


# ---- routing ----

def ref_route(logits: torch.Tensor, top_k: int, score: str = "softmax", renormalize: bool = True,
              n_group: int = 0, topk_group: int = 0,
              bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token, in Python: the chosen experts (ties to the lowest id) and their weights."""
    s = logits.double()
    scores = s.softmax(-1) if score == "softmax" else s.sigmoid()
    choice = scores + (0 if bias is None else bias.double())
    tokens, experts = logits.shape
    ids = torch.empty(tokens, top_k, dtype=torch.long)
    for t in range(tokens):
        allowed = list(range(experts))
        if n_group:
            per = experts // n_group
            gscore = [sum(sorted(choice[t, g * per:(g + 1) * per].tolist(), reverse=True)[:2])
                      for g in range(n_group)]
            groups = sorted(range(n_group), key=lambda g: (-gscore[g], g))[:topk_group]
            allowed = [e for e in allowed if e // per in groups]
        ids[t] = torch.tensor(sorted(allowed, key=lambda e: (-choice[t, e].item(), e))[:top_k])
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return ids, w


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_moe_route_matches_reference(score: str, renormalize: bool) -> None:
    logits = torch.randn(33, 8)
    r = moe_route(logits, 3, score, renormalize)
    ids, w = ref_route(logits, 3, score, renormalize)
    assert torch.equal(r.expert_ids, ids)
    assert r.weights.dtype == torch.float32 and rel_err(r.weights, w) <= 1e-6
    assert r.offsets.dtype == torch.int32 and r.token_order.dtype == torch.int64
    counts = torch.bincount(ids.flatten(), minlength=8)
    assert torch.equal(r.offsets, counts.cumsum(0).int())
    assert torch.equal(ids.flatten()[r.token_order], ids.flatten().sort(stable=True).values)


def test_moe_route_ties_go_to_the_lowest_expert() -> None:
    logits = torch.zeros(4, 6)
    logits[1, [1, 4]] = 2.0  # a tie for first place
    logits[2] = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0, 3.0])
    logits[3, 5] = -1.0
    r = moe_route(logits, 2)
    assert r.expert_ids.tolist() == [[0, 1], [1, 4], [1, 2], [0, 1]]
    r16 = moe_route(logits.bfloat16(), 3)
    assert r16.expert_ids.tolist() == [[0, 1, 2], [1, 4, 0], [1, 2, 3], [0, 1, 2]]
    # Equal weights for tied experts.
    assert r.weights[1, 0] == r.weights[1, 1] and r.weights[0, 0] == r.weights[0, 1]


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_moe_route_group_limited(score: str) -> None:
    logits = torch.randn(40, 16)
    bias = torch.randn(16) * 0.1
    for bias_arg in (None, bias):
        r = moe_route(logits, 4, score, True, n_group=4, topk_group=2, correction_bias=bias_arg)
        ids, w = ref_route(logits, 4, score, True, 4, 2, bias_arg)
        assert torch.equal(r.expert_ids, ids)
        assert rel_err(r.weights, w) <= 1e-6
        # At most topk_group groups are used by any token.
        assert max(len(set((row // 4).tolist())) for row in r.expert_ids) <= 2


def test_moe_route_group_limits_the_choice() -> None:
    # Expert 0 has the best score, but its group's second expert is poor: group 1 wins.
    logits = torch.tensor([[5.0, -9.0, 4.5, 4.5]])
    r = moe_route(logits, 1, n_group=2, topk_group=1)
    assert r.expert_ids.tolist() == [[2]]
    assert moe_route(logits, 1).expert_ids.tolist() == [[0]]


def test_moe_route_weights_gradcheck() -> None:
    logits = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    for score in ("softmax", "sigmoid"):
        _gradcheck(lambda l: moe_route(l, 2, score).weights, logits)
        _gradcheck(lambda l: moe_route(l, 2, score, False).weights, logits)


@pytest.mark.parametrize("case", [
    ("top_k_large", lambda l: moe_route(l, 9), r"'top_k'.*1 <= top_k <= .*8.*got 9"),
    ("top_k_zero", lambda l: moe_route(l, 0), r"'top_k'"),
    ("score", lambda l: moe_route(l, 2, "relu"), r"'score'.*'softmax' or 'sigmoid'"),
    ("n_group", lambda l: moe_route(l, 2, n_group=3, topk_group=1), r"'n_group'.*divisor"),
    ("topk_group", lambda l: moe_route(l, 2, n_group=4, topk_group=5), r"'topk_group'"),
    ("topk_group_alone", lambda l: moe_route(l, 2, topk_group=1), r"'topk_group'.*n_group is 0"),
    ("top_k_past_groups", lambda l: moe_route(l, 3, n_group=4, topk_group=1),
     r"'top_k'.*at most topk_group"),
    ("bias_shape", lambda l: moe_route(l, 2, correction_bias=torch.zeros(7)),
     r"'correction_bias'.*\[8\]"),
    ("logits_rank", lambda l: moe_route(l[0], 2), r"'logits'.*2-D"),
], ids=lambda c: c[0])
def test_moe_route_refuses_bad_input(case: tuple[str, Callable[[torch.Tensor], Any], str]) -> None:
    _, call, pattern = case
    with pytest.raises(RuntimeError, match=r"gemmt::moe_route: .*" + pattern):
        call(torch.randn(5, 8))


def test_moe_permute() -> None:
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]])
    order, offs = moe_permute(ids, 5)
    assert order.tolist() == [1, 4, 0, 2, 5, 3]
    assert offs.tolist() == [2, 2, 5, 6, 6]
    with pytest.raises(RuntimeError, match=r"gemmt::moe_permute: argument 'expert_ids'.*\[0, num_experts = 3\)"):
        moe_permute(ids, 3)
    with pytest.raises(RuntimeError, match=r"gemmt::moe_permute: argument 'expert_ids'.*dtype"):
        moe_permute(ids.float(), 5)


# ---- the expert layer ----

def ref_experts(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Token by token in float64, gate rows first in w_gate_up (transformers' layout)."""
    x, wgu, wd, w = x.double(), w_gate_up.double(), w_down.double(), weights.double()
    inter = wd.shape[2]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = wgu[e] @ x[t]
            out[t] += w[t, k] * (wd[e] @ (torch.nn.functional.silu(h[:inter]) * h[inter:]))
    return out


def _experts_inputs(tokens: int, hidden: int, inter: int, experts: int, top_k: int,
                    dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    x = torch.randn(tokens, hidden).to(dtype)
    wgu = (torch.randn(experts, 2 * inter, hidden) / hidden**0.5).to(dtype)
    wd = (torch.randn(experts, hidden, inter) / inter**0.5).to(dtype)
    return x, wgu, wd, torch.randn(tokens, experts)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_moe_experts_matches_reference(dtype: torch.dtype) -> None:
    x, wgu, wd, logits = _experts_inputs(29, 12, 10, 6, 2, dtype)
    r = moe_route(logits, 2)
    out = moe_experts(x, wgu, wd, r.weights, r.expert_ids, r.token_order, r.offsets)
    assert out.shape == x.shape and out.dtype == dtype
    ref = ref_experts(x, wgu, wd, r.weights, r.expert_ids)
    assert rel_err(out, ref) <= (1e-12 if dtype == torch.float64 else 1e-5 if dtype == torch.float32
                                 else 2e-2)


def test_moe_experts_all_tokens_to_one_expert_and_empty_experts() -> None:
    x, wgu, wd, _ = _experts_inputs(17, 8, 6, 5, 1, torch.float64)
    logits = torch.full((17, 5), -5.0)
    logits[:, 3] = 5.0
    r = moe_route(logits, 1)
    assert r.offsets.tolist() == [0, 0, 0, 17, 17]
    out = moe_experts(x, wgu, wd, r.weights, r.expert_ids, r.token_order, r.offsets)
    assert rel_err(out, ref_experts(x, wgu, wd, r.weights, r.expert_ids)) <= 1e-12
    # No tokens at all.
    empty = moe_route(torch.randn(0, 5), 2)
    out0 = moe_experts(x[:0], wgu, wd, empty.weights, empty.expert_ids, empty.token_order,
                       empty.offsets)
    assert out0.shape == (0, 8)


def test_moe_experts_gradcheck() -> None:
    x, wgu, wd, logits = _experts_inputs(7, 5, 3, 4, 2, torch.float64)
    inputs = [t.double().requires_grad_() for t in (x, wgu, wd, logits)]

    def layer(x: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor, logits: torch.Tensor
              ) -> torch.Tensor:
        r = moe_route(logits, 2)
        return moe_experts(x, wgu, wd, r.weights, r.expert_ids, r.token_order, r.offsets)

    _gradcheck(layer, *inputs)


def test_moe_experts_backward_matches_reference_in_float32() -> None:
    x, wgu, wd, logits = _experts_inputs(21, 8, 6, 4, 2)
    r = moe_route(logits, 2)
    leaves = [t.clone().requires_grad_() for t in (x, wgu, wd, r.weights)]
    out = moe_experts(*leaves, r.expert_ids, r.token_order, r.offsets)
    g = torch.randn_like(out)
    out.backward(g)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref_experts(*ref_leaves, r.expert_ids).backward(g.double())
    for mine, ref in zip(leaves, ref_leaves):
        assert rel_err(mine.grad, ref.grad) <= 1e-5


def _bad_experts_cases() -> list[tuple[str, Callable[..., Any], str]]:
    def routed(**over: Any) -> Callable[[], Any]:
        x, wgu, wd, logits = _experts_inputs(6, 4, 3, 4, 2)
        r = moe_route(logits, 2)
        args = {"x": x, "w_gate_up": wgu, "w_down": wd, "weights": r.weights,
                "expert_ids": r.expert_ids, "token_order": r.token_order, "offsets": r.offsets}
        fns = {k: v(args) if callable(v) else v for k, v in over.items()}
        args.update(fns)
        return lambda: moe_experts(**args)

    return [
        ("gate_up_shape", routed(w_gate_up=lambda a: a["w_gate_up"][:, :5]), r"'w_gate_up'.*\[E, 2 \* I, H\]"),
        ("down_shape", routed(w_down=lambda a: a["w_down"][:3]), r"'w_down'.*\[E, H, I\]"),
        ("hidden", routed(x=lambda a: a["x"][:, :3]), r"'w_gate_up'"),
        ("dtype", routed(x=lambda a: a["x"].double()), r"'x' and 'w_gate_up'.*dtype"),
        ("weights_shape", routed(weights=lambda a: a["weights"][:5]), r"'weights'.*\[T, top_k\]"),
        ("ids_shape", routed(expert_ids=lambda a: a["expert_ids"][:, :1]), r"'expert_ids'"),
        ("order_len", routed(token_order=lambda a: a["token_order"][:-1]), r"'token_order'.*T \* top_k"),
        ("offsets_dtype", routed(offsets=lambda a: a["offsets"].long()), r"'offsets'.*Int"),
        ("offsets_count", routed(offsets=lambda a: a["offsets"][:3]), r"'offsets'.*one offset per expert"),
        ("offsets_short", routed(offsets=lambda a: a["offsets"].clone().fill_(0)),
         r"'offsets'.*last entry"),
        ("offsets_decrease", routed(offsets=lambda a: torch.tensor([5, 2, 12, 12], dtype=torch.int32)),
         r"'offs(ets)?'.*non-decreasing"),
        ("order_repeats", routed(token_order=lambda a: torch.zeros_like(a["token_order"])),
         r"'token_order'.*permutation"),
        ("order_mismatch", routed(token_order=lambda a: a["token_order"].flip(0)),
         r"'token_order' and 'offsets'"),
        ("ids_range", routed(expert_ids=lambda a: a["expert_ids"] + 4), r"'expert_ids'.*\[0, 4\)"),
    ]


@pytest.mark.parametrize("case", _bad_experts_cases(), ids=lambda c: c[0])
def test_moe_experts_refuses_bad_input(case: tuple[str, Callable[[], Any], str]) -> None:
    _, call, pattern = case
    with pytest.raises(RuntimeError, match=r"gemmt::moe_experts: .*" + pattern):
        call()


def test_moe_experts_checks_routing_when_recording_too() -> None:
    x, wgu, wd, logits = _experts_inputs(6, 4, 3, 4, 2)
    r = moe_route(logits, 2)
    with pytest.raises(RuntimeError, match=r"gemmt::moe_experts: .*'token_order' and 'offsets'"):
        moe_experts(x.requires_grad_(), wgu, wd, r.weights, r.expert_ids, r.token_order.flip(0),
                    r.offsets)


# ---- gemmt.nn.MoE ----

def test_nn_moe_matches_reference_and_trains() -> None:
    moe = gemmt.nn.MoE(12, 8, 6, 2, dtype=torch.float64)
    x = torch.randn(3, 5, 12, dtype=torch.float64, requires_grad=True)
    out = moe(x)
    flat = x.detach().reshape(-1, 12)
    ids, w = ref_route(flat @ moe.gate.weight.detach().T, 2)
    ref = ref_experts(flat, moe.gate_up_proj.detach(), moe.down_proj.detach(), w, ids)
    assert out.shape == x.shape and rel_err(out.reshape(-1, 12), ref) <= 1e-12
    assert not out._is_view()  # FSDP2 hooks module outputs; a view's in-place op drops that
    out.square().sum().backward()
    for p in (x, moe.gate.weight, moe.gate_up_proj, moe.down_proj):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_nn_moe_deepseek_style_routing() -> None:
    moe = gemmt.nn.MoE(8, 4, 8, 2, score="sigmoid", n_group=4, topk_group=2,
                       correction_bias=True, routed_scaling_factor=2.5)
    assert moe.e_score_correction_bias is not None
    moe.e_score_correction_bias.copy_(torch.randn(8))
    x = torch.randn(9, 8)
    out = moe(x)
    ids, w = ref_route(x @ moe.gate.weight.detach().T, 2, "sigmoid", True, 4, 2,
                       moe.e_score_correction_bias)
    ref = ref_experts(x, moe.gate_up_proj.detach(), moe.down_proj.detach(), 2.5 * w, ids)
    assert rel_err(out, ref) <= 1e-5
    with pytest.raises(ValueError, match="gemmt.nn.MoE: argument 'top_k'"):
        gemmt.nn.MoE(8, 4, 4, 5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_nn_moe_under_torch_compile(backend: str) -> None:
    torch._dynamo.reset()
    moe = gemmt.nn.MoE(16, 8, 4, 2)
    x = torch.randn(24, 16)

    def step(module: torch.nn.Module, inp: torch.Tensor) -> list[torch.Tensor]:
        module.zero_grad()
        inp = inp.clone().requires_grad_()
        out = module(inp)
        out.square().sum().backward()
        return [out.detach(), inp.grad] + [p.grad.clone() for p in module.parameters()]

    compiled = torch.compile(moe, backend=backend, fullgraph=True)
    expected, got = step(moe, x), step(compiled, x)
    for e, g in zip(expected, got):
        assert rel_err(g, e) <= 1e-6


# ---- opcheck ----

def opcheck_cases(device: str) -> list[tuple[Any, tuple, dict]]:
    """Collected by test_autograd_opcheck.test_every_registered_op_is_opchecked."""
    g = torch.ops.gemmt

    def rg(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device).requires_grad_()

    offs = offsets([3, 0, 4]).to(device)
    logits = torch.randn(7, 6, device=device)
    r = moe_route(logits, 2)
    cases: list[tuple[Any, tuple, dict]] = [
        (g.grouped_mm, (rg(8, 5), rg(3, 5, 4), offs), {}),
        (g.grouped_mm, (rg(8, 5), rg(3, 5, 4), offs, rg(3, 4)), {"activation": "gelu"}),
        (g.grouped_mm, (rg(3, 2, 5), rg(3, 5, 4)), {}),
        (g.grouped_mm, (rg(4, 7), rg(7, 3), offs), {}),
        (g.grouped_mm, (rg(3, 4, 5), rg(5, 7), offs), {}),
        (g.grouped_mm, (torch.randn(8, 5, device=device).bfloat16().requires_grad_(),
                        torch.randn(3, 5, 4, device=device).bfloat16(), offs),
         {"out_dtype": torch.float32}),
        (g.moe_permute, (torch.randint(0, 5, (6, 2), device=device), 5), {}),
        (g.moe_route, (rg(7, 6), 2), {}),
        (g.moe_route, (rg(7, 8), 3, "sigmoid", True, 4, 2, torch.randn(8, device=device)), {}),
    ]
    cases.append((g.moe_experts, (rg(7, 4), rg(6, 6, 4), rg(6, 4, 3),
                                  r.weights.clone().requires_grad_(), r.expert_ids,
                                  r.token_order, r.offsets), {}))
    return cases


def test_moe_opcheck(device: str) -> None:
    gemmt.build_info()
    for op, args, kwargs in opcheck_cases(device):
        result = torch.library.opcheck(op, args, kwargs)
        failed = {k: v for k, v in result.items() if v != "SUCCESS"}
        assert not failed, (op, failed)


# ---- CUDA: float32 and float64 grouped_mm (the loop of ATen products, offsets read on the
# host) agree with the CPU kernel ----

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grouped_mm_cuda_wide_dtypes_match_cpu(dtype: torch.dtype) -> None:
    offs = offsets([2, 0, 5])
    a, b = torch.randn(9, 8, dtype=dtype), torch.randn(3, 8, 6, dtype=dtype)
    cpu = grouped_mm(a, b, offs)
    cuda = grouped_mm(a.cuda(), b.cuda(), offs.cuda())
    assert cuda.device.type == "cuda"
    assert rel_err(cuda.cpu(), cpu) < (1e-5 if dtype == torch.float32 else 1e-12)


# ---- CUDA routing and expert layer against the CPU reference ----
#
# The CPU ops are the reference: ids, token_order and offsets must agree exactly, weights to
# float rounding. Exact agreement of the ids needs the two devices to order the scores alike,
# so the large float32 cases use logits whose values are well apart (a near-tie of two
# different scores, decided by a last-bit difference between the CPU's and CUDA's exp, is not
# a disagreement about the routing rule). Exact ties (equal logits) are tested on their own.

CUDA_WEIGHT_RTOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _poison_cuda_cache() -> None:
    """Fill free memory of the caching allocator with NaN bytes, so that outputs taken from
    it start as garbage rather than as zeros: 16 MiB of 1 MiB tensors for its pool of small
    blocks and 64 MiB for its pool of large ones."""
    bufs = [torch.empty(1 << 18, device="cuda") for _ in range(16)]
    bufs.append(torch.empty(1 << 24, device="cuda"))
    for b in bufs:
        b.fill_(float("nan"))
    torch.cuda.synchronize()


def _separated_logits(tokens: int, experts: int, dtype: torch.dtype = torch.float32,
                      spacing: float = 0.05) -> torch.Tensor:
    """Per row, a random permutation of well-spread values: any two at least spacing / 5 apart."""
    rank = torch.argsort(torch.rand(tokens, experts), dim=1).double()
    jitter = torch.rand(tokens, experts, dtype=torch.float64) * 0.8 * spacing
    return ((rank - experts / 2) * spacing + jitter).to(dtype)


def _leveled_logits(tokens: int, experts: int, n_group: int) -> torch.Tensor:
    """Logits for group-limited routing with every comparison well apart: each group has a
    level (the groups in a random order per row, `step` apart) and its experts spread below
    the next level, distinct, within 3/4 of a step. Values stay within about +-8, where
    float32 sigmoids are still far from 0 and 1."""
    per = experts // n_group
    step = min(1.5, 12.0 / n_group)
    level = (torch.argsort(torch.rand(tokens, n_group), dim=1).double() - n_group / 2) * step
    spacing = 0.75 * step / per
    rank = torch.argsort(torch.rand(tokens, n_group, per), dim=2).double()
    within = (rank + 0.8 * torch.rand(tokens, n_group, per, dtype=torch.float64)) * spacing
    return (level.unsqueeze(-1) + within).reshape(tokens, experts).float()


def _route_both(logits: torch.Tensor, top_k: int, score: str = "softmax",
                renormalize: bool = True, n_group: int = 0, topk_group: int = 0,
                bias: torch.Tensor | None = None) -> tuple[Any, Any]:
    cpu = moe_route(logits, top_k, score, renormalize, n_group, topk_group, bias)
    _poison_cuda_cache()
    gpu = moe_route(logits.cuda(), top_k, score, renormalize, n_group, topk_group,
                    None if bias is None else bias.cuda())
    return gpu, cpu


def _assert_same_routing(gpu: Any, cpu: Any) -> None:
    assert gpu.expert_ids.is_cuda and gpu.token_order.is_cuda and gpu.offsets.is_cuda
    for name in ("weights", "expert_ids", "token_order", "offsets"):
        g, c = getattr(gpu, name), getattr(cpu, name)
        assert g.dtype == c.dtype and g.shape == c.shape, (name, g.dtype, g.shape, c.shape)
    assert torch.equal(gpu.expert_ids.cpu(), cpu.expert_ids)
    assert torch.equal(gpu.token_order.cpu(), cpu.token_order)
    assert torch.equal(gpu.offsets.cpu(), cpu.offsets)
    rtol = CUDA_WEIGHT_RTOL[cpu.weights.dtype]
    torch.testing.assert_close(gpu.weights.cpu(), cpu.weights, rtol=rtol, atol=1e-30)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 4096])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("top_k", [1, 2, 8])
@pytest.mark.parametrize("experts", [8, 64, 128, 256])
def test_moe_route_cuda_matches_cpu(experts: int, top_k: int, score: str, renormalize: bool,
                                    tokens: int) -> None:
    logits = _separated_logits(tokens, experts)
    _assert_same_routing(*_route_both(logits, top_k, score, renormalize))


@pytest.mark.cuda
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_moe_route_cuda_random_logits(score: str) -> None:
    # Plain normal logits (no spacing), a moderate count of tokens, odd expert counts.
    for tokens, experts, top_k in ((257, 8, 2), (300, 61, 5), (129, 256, 8), (64, 1000, 16)):
        logits = torch.randn(tokens, experts)
        gpu, cpu = _route_both(logits, top_k, score)
        if torch.equal(gpu.expert_ids.cpu(), cpu.expert_ids):
            _assert_same_routing(gpu, cpu)
        else:
            # Only a near-tie (two scores equal to float32 rounding) may be ordered otherwise:
            # the chosen scores, in float64, must then agree slot by slot.
            s = logits.double().softmax(-1) if score == "softmax" else logits.double().sigmoid()
            torch.testing.assert_close(s.gather(1, gpu.expert_ids.cpu()),
                                       s.gather(1, cpu.expert_ids), rtol=1e-6, atol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_moe_route_cuda_logit_dtypes(dtype: torch.dtype) -> None:
    # 16-bit logits are scored in float32, float64 logits in float64.
    logits = _separated_logits(1024, 128, dtype)
    for score in ("softmax", "sigmoid"):
        gpu, cpu = _route_both(logits, 8, score)
        _assert_same_routing(gpu, cpu)
        assert gpu.weights.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


def _strided_cuda(t: torch.Tensor) -> torch.Tensor:
    """The same view of the same values on CUDA: a copy of t's storage, viewed as t is."""
    storage = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype)
    storage.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(t)
    return storage.cuda().as_strided(t.shape, t.stride(), t.storage_offset())


@pytest.mark.cuda
def test_moe_route_cuda_strided_logits() -> None:
    # A transposed view (column stride != 1), a sliced one (storage offset) and a stepped one.
    base = _separated_logits(256, 512)
    for logits in (base.t().contiguous().t(), base[5:200, 3:259], base[::3, ::2]):
        assert not logits.is_contiguous()
        gpu_logits = _strided_cuda(logits)
        assert gpu_logits.stride() == logits.stride()
        _assert_same_routing(moe_route(gpu_logits, 4), moe_route(logits, 4))


@pytest.mark.cuda
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_moe_route_cuda_group_limited(score: str) -> None:
    # DeepSeek-V3's shape: 256 experts in 8 groups, 4 groups kept, top 8.
    logits = _leveled_logits(4096, 256, 8)
    _assert_same_routing(*_route_both(logits, 8, score, True, 8, 4))
    # Other shapes: one expert per group, and every group kept.
    _assert_same_routing(*_route_both(_leveled_logits(512, 64, 64), 6, score, True, 64, 9))
    _assert_same_routing(*_route_both(_leveled_logits(512, 64, 8), 3, score, False, 8, 8))
    # With a correction bias: float64 logits (no near-ties at any scale), and a few float32
    # tokens of random logits.
    bias = torch.randn(256, dtype=torch.float64) * 0.1
    logits64 = torch.randn(4096, 256, dtype=torch.float64)
    gpu, cpu = _route_both(logits64, 8, score, True, 8, 4, bias)
    _assert_same_routing(gpu, cpu)
    gpu, cpu = _route_both(torch.randn(40, 16), 4, score, True, 4, 2, torch.randn(16) * 0.1)
    _assert_same_routing(gpu, cpu)


@pytest.mark.cuda
def test_moe_route_cuda_group_limits_the_choice() -> None:
    # Expert 0 has the best score but its group's second expert is poor: group 1 wins.
    logits = torch.tensor([[5.0, -9.0, 4.5, 4.5]], device="cuda")
    assert moe_route(logits, 1, n_group=2, topk_group=1).expert_ids.tolist() == [[2]]
    assert moe_route(logits, 1).expert_ids.tolist() == [[0]]
    # Against the per-token Python reference, on random logits with and without a bias.
    x = torch.randn(40, 16, dtype=torch.float64)
    bias = torch.randn(16, dtype=torch.float64) * 0.1
    for score in ("softmax", "sigmoid"):
        r = moe_route(x.cuda(), 4, score, True, 4, 2, bias.cuda())
        ids, w = ref_route(x, 4, score, True, 4, 2, bias)
        assert torch.equal(r.expert_ids.cpu(), ids)
        assert rel_err(r.weights, w) <= 1e-12


@pytest.mark.cuda
def test_moe_route_cuda_ties_go_to_the_lowest_expert() -> None:
    logits = torch.zeros(4, 6)
    logits[1, [1, 4]] = 2.0  # a tie for first place
    logits[2] = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0, 3.0])
    logits[3, 5] = -1.0
    r = moe_route(logits.cuda(), 2)
    assert r.expert_ids.tolist() == [[0, 1], [1, 4], [1, 2], [0, 1]]
    r16 = moe_route(logits.bfloat16().cuda(), 3)
    assert r16.expert_ids.tolist() == [[0, 1, 2], [1, 4, 0], [1, 2, 3], [0, 1, 2]]
    assert r.weights[1, 0] == r.weights[1, 1] and r.weights[0, 0] == r.weights[0, 1]
    # Whole rows of ties, 256 experts, both scores, with and without groups: the lowest ids.
    flat = torch.zeros(3, 256)
    flat[1, 200:] = 1.0  # ties among the best 56
    flat[2, ::2] = -float("inf")  # zero scores at the even ids (softmax)
    for score in ("softmax", "sigmoid"):
        for groups in ((0, 0), (8, 4)):
            gpu, cpu = _route_both(flat, 8, score, True, *groups)
            _assert_same_routing(gpu, cpu)
        assert gpu.expert_ids[0].tolist() == list(range(8))
    # Ties in the biased choice with distinct scores: the bias decides, then the index.
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    bias = torch.tensor([3.0, 2.0, 1.0, 0.0])
    gpu, cpu = _route_both(logits, 2, "softmax", True, 0, 0, bias)
    _assert_same_routing(gpu, cpu)


@pytest.mark.cuda
def test_moe_route_cuda_non_finite_logits() -> None:
    # NaN and infinite logits: whatever the reference makes of them, CUDA makes the same.
    logits = torch.randn(6, 16)
    logits[0, 3] = float("nan")
    logits[1] = float("nan")
    logits[2, 5] = float("inf")
    logits[3] = -float("inf")
    logits[4, :8] = -float("inf")
    for score in ("softmax", "sigmoid"):
        gpu, cpu = _route_both(logits, 3, score)
        assert torch.equal(gpu.expert_ids.cpu(), cpu.expert_ids)
        assert torch.equal(gpu.token_order.cpu(), cpu.token_order)
        assert torch.equal(gpu.offsets.cpu(), cpu.offsets)
        torch.testing.assert_close(gpu.weights.cpu(), cpu.weights, rtol=1e-5, atol=1e-30,
                                   equal_nan=True)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 4096])
def test_moe_route_cuda_all_to_one_expert_and_empty_experts(tokens: int) -> None:
    logits = torch.full((tokens, 64), -5.0)
    logits[:, 37] = 5.0
    gpu, cpu = _route_both(logits, 1)
    _assert_same_routing(gpu, cpu)
    expected = [0] * 37 + [tokens] * 27
    assert gpu.offsets.tolist() == expected
    assert torch.equal(gpu.token_order.cpu(), torch.arange(tokens))
    # Two busy experts, all others empty.
    logits[:, 3] = 4.0
    gpu, cpu = _route_both(logits, 2, "sigmoid")
    _assert_same_routing(gpu, cpu)
    assert gpu.offsets.tolist() == [0] * 3 + [tokens] * 34 + [2 * tokens] * 27


@pytest.mark.cuda
def test_moe_route_cuda_no_tokens() -> None:
    r = moe_route(torch.randn(0, 32, device="cuda"), 4, "sigmoid", True, 4, 2)
    assert r.weights.shape == (0, 4) and r.expert_ids.shape == (0, 4)
    assert r.token_order.shape == (0,) and r.offsets.tolist() == [0] * 32


@pytest.mark.cuda
def test_moe_route_cuda_refuses_too_many_experts() -> None:
    with pytest.raises(RuntimeError, match=r"gemmt::moe_route: argument 'logits' expected at most"):
        moe_route(torch.randn(2, 4097, device="cuda"), 2)


@pytest.mark.cuda
def test_moe_route_cuda_weights_backward() -> None:
    logits = torch.randn(64, 32, dtype=torch.float64)
    for score in ("softmax", "sigmoid"):
        grads = []
        for dev in ("cpu", "cuda"):
            leaf = logits.detach().to(dev).requires_grad_()
            r = moe_route(leaf, 4, score)
            (r.weights * torch.arange(4, dtype=torch.float64, device=dev)).sum().backward()
            grads.append(leaf.grad.cpu())
        assert rel_err(grads[1], grads[0]) <= 1e-12


@pytest.mark.cuda
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("experts", [8, 64, 128, 256])
def test_moe_permute_cuda_matches_cpu(experts: int, index_dtype: torch.dtype) -> None:
    shapes = [(1, 1), (1, 8), (3, 2), (4096, 1), (4096, 2), (4096, 8), (1023, 33)]
    for shape in shapes:
        ids = torch.randint(0, experts, shape).to(index_dtype)
        # Skewed loads too: half the slots on three experts.
        skewed = torch.where(torch.rand(shape) < 0.5, ids % 3, ids)
        for case in (ids, skewed):
            order, offs = moe_permute(case, experts)
            _poison_cuda_cache()
            g_order, g_offs = moe_permute(case.cuda(), experts)
            assert g_order.dtype == torch.int64 and g_offs.dtype == torch.int32
            assert torch.equal(g_order.cpu(), order), shape
            assert torch.equal(g_offs.cpu(), offs), shape


@pytest.mark.cuda
def test_moe_permute_cuda_edge_cases() -> None:
    def same(ids: torch.Tensor, experts: int) -> None:
        order, offs = moe_permute(ids, experts)
        g_order, g_offs = moe_permute(_strided_cuda(ids), experts)
        assert torch.equal(g_order.cpu(), order) and torch.equal(g_offs.cpu(), offs)

    same(torch.tensor([[2, 0], [2, 3], [0, 2]]), 5)  # the CPU test's example
    same(torch.full((4096, 8), 7), 8)  # every slot on one expert
    same(torch.full((4096, 8), 0), 300)  # on the first, 299 empty
    same(torch.randint(0, 4, (777, 3)) * 50, 200)  # mostly empty experts
    same(torch.randint(0, 16, (100, 4)).t(), 16)  # a transposed (non-contiguous) view
    same(torch.randint(0, 16, (0, 4)), 16)  # no slots: zero offsets
    same(torch.randint(0, 6, (2048,)), 6)  # 1-D ids
    same(torch.randint(0, 256, (131072, 8)), 256)  # 2^20 slots: many chunks
    same(torch.randint(0, 5000, (4096, 8)), 5000)  # more experts than a scan tile
    # One chunk of slots (at most 1024) over fewer than 4096 experts takes one block for the
    # count, the scan and the scatter; these sit on both sides of those bounds.
    same(torch.randint(0, 64, (1024,)), 64)
    same(torch.randint(0, 64, (1025,)), 64)
    same(torch.randint(0, 4096, (300, 3)), 4096)
    same(torch.full((32, 8), 5), 4095)


@pytest.mark.cuda
def test_moe_permute_cuda_out_of_range_ids_stay_in_bounds() -> None:
    # Unchecked on CUDA (the check would need the host): such slots go after every expert's,
    # in slot order, and offsets count the valid slots only.
    ids = torch.tensor([[1, -1], [0, 9], [1, 0], [4, 2]])
    order, offs = moe_permute(ids.cuda(), 4)
    assert order.tolist() == [2, 5, 0, 4, 7, 1, 3, 6]
    assert offs.tolist() == [2, 4, 5, 5]
    # The same on the one-block path's far side and on the chunked path.
    for slots, experts in ((1000, 4095), (1000, 4096), (5000, 16)):
        flat = torch.randint(-3, experts + 3, (slots,))
        valid = (flat >= 0) & (flat < experts)
        key = torch.where(valid, flat, experts)  # out-of-range slots last, in slot order
        expected = torch.sort(key, stable=True).indices
        order, offs = moe_permute(flat.cuda(), experts)
        assert torch.equal(order.cpu(), expected), (slots, experts)
        counts = torch.bincount(flat[valid], minlength=experts)
        assert torch.equal(offs.cpu(), counts.cumsum(0).to(torch.int32)), (slots, experts)


@pytest.mark.cuda
def test_moe_routing_cuda_runs_without_host_sync_and_in_a_cuda_graph() -> None:
    logits = _separated_logits(512, 64).cuda()
    ids = torch.randint(0, 64, (512, 4), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe_route(logits, 4, "sigmoid", True, 8, 4)
        moe_permute(ids, 64)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    static = logits.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe_route(static, 4)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_route(static, 4)
    fresh = _separated_logits(512, 64)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    _assert_same_routing(captured, moe_route(fresh, 4))


@pytest.mark.cuda
@pytest.mark.parametrize("tokens,hidden,inter,experts,top_k",
                         [(32, 256, 384, 8, 2), (32, 128, 64, 64, 8), (200, 256, 128, 16, 4)])
def test_moe_layer_decode_runs_without_host_sync_and_in_a_cuda_graph(
        tokens: int, hidden: int, inter: int, experts: int, top_k: int) -> None:
    # A decode server captures its step in a graph: the layer's forward may not read the routing
    # back to the host, and a replay on new tokens (so a new routing) must give what a call does.
    torch.manual_seed(0)
    moe = gemmt.nn.MoE(hidden, inter, experts, top_k, device="cuda", dtype=torch.bfloat16)
    static = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            moe(static)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            moe(static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = moe(static)
        fresh = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        static.copy_(fresh)
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected = moe(fresh)
    assert torch.equal(captured, expected)


# The expert layer on CUDA needs grouped_mm's CUDA kernel as well.

def _experts_cuda_vs_cpu(x: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor, r: Any,
                         dtype: torch.dtype) -> None:
    cpu = moe_experts(x, wgu, wd, r.weights, r.expert_ids, r.token_order, r.offsets)
    c = [t.cuda() for t in (x, wgu, wd, r.weights, r.expert_ids, r.token_order, r.offsets)]
    _poison_cuda_cache()
    gpu = moe_experts(*c)
    assert gpu.is_cuda and gpu.dtype == dtype and gpu.shape == x.shape
    ref = ref_experts(x, wgu, wd, r.weights, r.expert_ids)
    bound = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2e-2)
    assert rel_err(gpu, ref) <= bound
    assert rel_err(gpu, cpu) <= bound


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_moe_experts_cuda_matches_cpu(dtype: torch.dtype) -> None:
    # top_k 10 takes several chunks of the combine's slots; hidden 12 its one-element path.
    for tokens, hidden, inter, experts, top_k in ((29, 12, 10, 6, 2), (257, 64, 32, 16, 4),
                                                   (1, 16, 8, 8, 8), (33, 40, 24, 16, 10)):
        x, wgu, wd, logits = _experts_inputs(tokens, hidden, inter, experts, top_k, dtype)
        r = moe_route(logits, top_k)
        _experts_cuda_vs_cpu(x, wgu, wd, r, dtype)


@pytest.mark.cuda
def test_moe_experts_cuda_layouts_and_routing_edge_cases() -> None:
    d = torch.float64
    x, wgu, wd, _ = _experts_inputs(17, 8, 6, 5, 1, d)
    logits = torch.full((17, 5), -5.0)
    logits[:, 3] = 5.0
    _experts_cuda_vs_cpu(x, wgu, wd, moe_route(logits, 1), d)  # one expert, four empty
    # Strided x, weights stored transposed and viewed back, int32 token_order.
    x, wgu, wd, logits = _experts_inputs(33, 16, 8, 4, 2, d)
    r = moe_route(logits, 2)
    xs = torch.randn(33, 40, dtype=d)[:, 5:21]
    wgu_t = wgu.transpose(1, 2).contiguous().transpose(1, 2)
    wd_t = wd.transpose(1, 2).contiguous().transpose(1, 2)
    cpu = moe_experts(xs, wgu_t, wd_t, r.weights, r.expert_ids, r.token_order.int(), r.offsets)
    gpu = moe_experts(_strided_cuda(xs), _strided_cuda(wgu_t), _strided_cuda(wd_t),
                      r.weights.cuda(), r.expert_ids.cuda(), r.token_order.int().cuda(),
                      r.offsets.cuda())
    assert rel_err(gpu, cpu) <= 1e-12
    assert rel_err(gpu, ref_experts(xs, wgu, wd, r.weights, r.expert_ids)) <= 1e-12
    # No tokens.
    empty = moe_route(torch.randn(0, 4, device="cuda"), 2)
    out0 = moe_experts(x[:0].cuda(), wgu.cuda(), wd.cuda(), empty.weights, empty.expert_ids,
                       empty.token_order, empty.offsets)
    assert out0.shape == (0, 16)


@pytest.mark.cuda
def test_moe_experts_cuda_backward_matches_cpu() -> None:
    x, wgu, wd, logits = _experts_inputs(45, 16, 12, 6, 2, torch.float64)
    # float64 routing too: float32 scores differ between the devices' softmax kernels at 1e-8.
    logits = logits.double()
    grads: list[list[torch.Tensor]] = []
    for dev in ("cpu", "cuda"):
        # Detached first: on the CPU .to() would return the tensor itself, whose flag would
        # then make the CUDA copies non-leaves.
        leaves = [t.detach().to(dev).requires_grad_() for t in (x, wgu, wd, logits)]
        r = moe_route(leaves[3], 2)
        out = moe_experts(leaves[0], leaves[1], leaves[2], r.weights, r.expert_ids,
                          r.token_order, r.offsets)
        g = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
        out.backward(g.to(dev))
        missing = [name for name, t in zip(("x", "w_gate_up", "w_down", "logits"), leaves)
                   if t.grad is None]
        assert not missing, f"{dev}: no gradient reached {missing}"
        grads.append([t.grad.cpu() for t in leaves])
    for cpu_g, gpu_g in zip(*grads):
        assert rel_err(gpu_g, cpu_g) <= 1e-12


# The recorded layer on CUDA for 16-bit tensors: gemmt's gather and combine kernels as autograd
# nodes (the combine's backward is moe_combine_backward.cu, the gather's the combine kernel
# with unit weights); GEMMT_MOE_FUSED_BACKWARD=0 records the ATen composite instead. Both are
# measured against the float64 composite on the CPU: the new path's error may be at most
# twice the composite's own 16-bit error.

_FUSED_ENV = "GEMMT_MOE_FUSED_BACKWARD"


def _routing_logits(kind: str, tokens: int, experts: int) -> torch.Tensor:
    """Router logits: random, or skewed so that some experts get no token and one many, or
    every token to expert 3 first."""
    logits = torch.randn(tokens, experts)
    if kind == "uneven":
        logits[:, 0] -= 50.0  # never chosen
        logits[:, experts - 1] -= 50.0  # never chosen
        logits[:, 2] += 2.0  # most tokens
    elif kind == "one_expert":
        logits = torch.full((tokens, experts), -5.0)
        logits[:, 3] = 5.0
    return logits


def _recorded_experts(x: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor, weights: torch.Tensor,
                      r: Any, g: torch.Tensor, device: str
                      ) -> tuple[torch.Tensor, list[torch.Tensor], Any]:
    """The layer's output, recorded, and the gradients of (x, w_gate_up, w_down, weights) for
    the output gradient g (fresh leaves on `device`), and the output's grad_fn."""
    leaves = [t.detach().to(device).requires_grad_() for t in (x, wgu, wd, weights)]
    if device == "cuda":
        _poison_cuda_cache()
    out = moe_experts(*leaves, r.expert_ids.to(device), r.token_order.to(device),
                      r.offsets.to(device))
    grad_fn = out.grad_fn
    out.backward(g.to(device))
    grads = [t.grad for t in leaves]
    missing = [n for n, t in zip(("x", "w_gate_up", "w_down", "weights"), grads) if t is None]
    assert not missing, f"no gradient reached {missing}"
    return out.detach(), grads, grad_fn


_FUSED_CASES = [
    # (routing, tokens, hidden, intermediate, experts, top_k)
    ("random", 257, 64, 32, 16, 4),
    ("uneven", 300, 64, 48, 8, 2),  # two experts get no token
    ("one_expert", 65, 64, 32, 6, 1),  # every token to one expert, five empty
    ("random", 129, 128, 32, 8, 1),  # top-1
    ("random", 97, 64, 32, 16, 8),  # top-8: one pass of the kernel's eight slots
    ("random", 33, 64, 16, 32, 12),  # top-12: two passes
    ("random", 53, 12, 10, 6, 2),  # hidden 12: rows not 16-byte multiples (element path)
    ("uneven", 41, 20, 16, 5, 3),  # hidden 20, empty experts
    ("random", 1, 16, 8, 8, 8),  # one token
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", _FUSED_CASES, ids=lambda c: "-".join(map(str, c)))
def test_moe_experts_cuda_fused_backward_matches_float64(case: tuple, dtype: torch.dtype,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    kind, tokens, hidden, inter, experts, top_k = case
    x, wgu, wd, _ = _experts_inputs(tokens, hidden, inter, experts, top_k, dtype)
    r = moe_route(_routing_logits(kind, tokens, experts), top_k)
    if kind != "random":
        counts = torch.diff(r.offsets, prepend=r.offsets.new_zeros(1))
        assert (counts == 0).any(), "the routing was meant to leave experts empty"
    weights = r.weights.clone()
    g = torch.randn(tokens, hidden).to(dtype)
    ref_out, ref, _ = _recorded_experts(x.double(), wgu.double(), wd.double(), weights.double(),
                                        r, g.double(), "cpu")
    monkeypatch.setenv(_FUSED_ENV, "0")
    _, old, old_fn = _recorded_experts(x, wgu, wd, weights, r, g, "cuda")
    monkeypatch.setenv(_FUSED_ENV, "1")
    out, new, new_fn = _recorded_experts(x, wgu, wd, weights, r, g, "cuda")
    # The switch picks the path: gemmt's combine node, or the composite's last step.
    assert "MoeCombineFunction" in new_fn.name(), new_fn.name()
    assert "MoeCombineFunction" not in old_fn.name(), old_fn.name()
    assert rel_err(out, ref_out) <= 2e-2
    for name, mine, theirs, exact in zip(("x", "w_gate_up", "w_down", "weights"), new, old, ref):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert torch.isfinite(mine).all(), f"{name}: non-finite gradient (an unwritten element?)"
        e_new, e_old = rel_err(mine, exact), rel_err(theirs, exact)
        assert e_new <= 2 * e_old + 1e-6, f"{name}: {e_new:.3e} vs the composite's {e_old:.3e}"
        assert e_new <= 2e-2, f"{name}: {e_new:.3e}"
        assert rel_err(mine, theirs) <= 2e-2, name


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moe_experts_cuda_fused_forward_is_the_no_grad_forward(dtype: torch.dtype,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setenv(_FUSED_ENV, "1")
    for kind, tokens, hidden, inter, experts, top_k in _FUSED_CASES:
        x, wgu, wd, _ = _experts_inputs(tokens, hidden, inter, experts, top_k, dtype)
        r = moe_route(_routing_logits(kind, tokens, experts).cuda(), top_k)
        args = [t.cuda() for t in (x, wgu, wd)] + [r.weights, r.expert_ids, r.token_order,
                                                    r.offsets]
        with torch.no_grad():
            plain = moe_experts(*args)
        _poison_cuda_cache()
        recorded = moe_experts(args[0].requires_grad_(), *args[1:])
        assert recorded.requires_grad
        assert torch.equal(recorded.detach(), plain), (kind, tokens, hidden, top_k)


@pytest.mark.cuda
def test_moe_experts_cuda_fused_backward_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_FUSED_ENV, "1")
    for kind, tokens, hidden, inter, experts, top_k in (("random", 2048, 256, 64, 16, 8),
                                                         ("uneven", 1500, 136, 40, 8, 2),
                                                         ("random", 300, 12, 10, 6, 3)):
        x, wgu, wd, _ = _experts_inputs(tokens, hidden, inter, experts, top_k, torch.bfloat16)
        r = moe_route(_routing_logits(kind, tokens, experts), top_k)
        g = torch.randn(tokens, hidden).bfloat16()
        _, first, _ = _recorded_experts(x, wgu, wd, r.weights, r, g, "cuda")
        _, second, _ = _recorded_experts(x, wgu, wd, r.weights, r, g, "cuda")
        for name, a, b in zip(("x", "w_gate_up", "w_down", "weights"), first, second):
            assert torch.equal(a, b), f"{name}: two runs differ ({kind}, top_k {top_k})"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moe_experts_cuda_fused_backward_reaches_the_router(dtype: torch.dtype,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    tokens, hidden, inter, experts, top_k = 200, 64, 32, 16, 4
    x, wgu, wd, logits = _experts_inputs(tokens, hidden, inter, experts, top_k, dtype)
    g = torch.randn(tokens, hidden)

    def run(device: str, to: torch.dtype) -> list[torch.Tensor]:
        leaves = [t.detach().to(device, to).requires_grad_() for t in (x, wgu, wd)]
        # float64 scores on both devices: the same experts chosen, no near-tie decided by
        # rounding.
        lg = logits.detach().to(device, torch.float64).requires_grad_()
        r = moe_route(lg, top_k)
        out = moe_experts(*leaves, r.weights, r.expert_ids, r.token_order, r.offsets)
        out.backward(g.to(device, to))
        assert all(t.grad is not None for t in (*leaves, lg))
        return [t.grad for t in (*leaves, lg)]

    ref = run("cpu", torch.float64)
    monkeypatch.setenv(_FUSED_ENV, "0")
    old = run("cuda", dtype)
    monkeypatch.setenv(_FUSED_ENV, "1")
    new = run("cuda", dtype)
    for name, mine, theirs, exact in zip(("x", "w_gate_up", "w_down", "logits"), new, old, ref):
        assert torch.isfinite(mine).all(), name
        e_new, e_old = rel_err(mine, exact), rel_err(theirs, exact)
        assert e_new <= 2 * e_old + 1e-6, f"{name}: {e_new:.3e} vs the composite's {e_old:.3e}"
        assert rel_err(mine, theirs) <= 2e-2, name


@pytest.mark.cuda
def test_moe_experts_cuda_fused_partial_gradients_and_wide_dtypes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_FUSED_ENV, "1")
    tokens, hidden, inter, experts, top_k = 120, 64, 32, 8, 2
    x, wgu, wd, logits = _experts_inputs(tokens, hidden, inter, experts, top_k, torch.bfloat16)
    r = moe_route(logits.cuda(), top_k)
    xc, wguc, wdc = x.cuda(), wgu.cuda(), wd.cuda()
    g = torch.randn(tokens, hidden, device="cuda").bfloat16()
    ref = [t.detach().double().requires_grad_() for t in (x, wgu, wd, r.weights.cpu())]
    ref_experts(*ref, r.expert_ids.cpu()).backward(g.double().cpu())
    # Only the routing weights need a gradient: the kernel computes grad_weights alone.
    w = r.weights.detach().clone().requires_grad_()
    out = moe_experts(xc, wguc, wdc, w, r.expert_ids, r.token_order, r.offsets)
    assert "MoeCombineFunction" in out.grad_fn.name()
    out.backward(g)
    assert rel_err(w.grad, ref[3].grad) <= 2e-2
    # Only x: grad_o alone, then the gather's backward.
    xl = xc.clone().requires_grad_()
    moe_experts(xl, wguc, wdc, r.weights, r.expert_ids, r.token_order, r.offsets).backward(g)
    assert rel_err(xl.grad, ref[0].grad) <= 2e-2
    # A strided x (every other column of a wider tensor) and an expanded output gradient.
    wide = torch.randn(tokens, 2 * hidden, device="cuda").bfloat16()
    xs = wide[:, ::2].requires_grad_()
    out = moe_experts(xs, wguc, wdc, r.weights, r.expert_ids, r.token_order, r.offsets)
    out.sum().backward()
    monkeypatch.setenv(_FUSED_ENV, "0")
    xs0 = wide[:, ::2].detach().requires_grad_()
    moe_experts(xs0, wguc, wdc, r.weights, r.expert_ids, r.token_order, r.offsets).sum().backward()
    assert rel_err(xs.grad, xs0.grad) <= 2e-2
    monkeypatch.setenv(_FUSED_ENV, "1")
    # float32 keeps the composite.
    x32 = xc.float().requires_grad_()
    out32 = moe_experts(x32, wguc.float(), wdc.float(), r.weights, r.expert_ids, r.token_order,
                        r.offsets)
    assert "MoeCombineFunction" not in out32.grad_fn.name()


@pytest.mark.cuda
def test_moe_experts_cuda_fused_double_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens, hidden, inter, experts, top_k = 64, 32, 16, 4, 2
    x, wgu, wd, logits = _experts_inputs(tokens, hidden, inter, experts, top_k, torch.bfloat16)
    r = moe_route(logits.cuda(), top_k)
    g = torch.randn(tokens, hidden, device="cuda").bfloat16()

    def second_order(flag: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        monkeypatch.setenv(_FUSED_ENV, flag)
        leaves = [t.cuda().requires_grad_() for t in (x, wgu, wd)]
        w = r.weights.detach().clone().requires_grad_()
        out = moe_experts(*leaves, w, r.expert_ids, r.token_order, r.offsets)
        first = torch.autograd.grad(out, [*leaves, w], g, create_graph=True)
        penalty = sum((t.float() ** 2).sum() for t in first)
        second = torch.autograd.grad(penalty, [*leaves, w])
        return [t.detach() for t in first], list(second)

    first1, second1 = second_order("1")
    first0, second0 = second_order("0")
    for a, b in zip(first1, first0):
        assert rel_err(a, b) <= 2e-2
    for a, b in zip(second1, second0):
        assert torch.isfinite(a).all()
        assert rel_err(a, b) <= 5e-2


@pytest.mark.cuda
def test_moe_experts_cuda_fused_under_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    # Fake tensors have no memory: tracing records the composite, and the compiled backward
    # agrees with the eager one.
    monkeypatch.setenv(_FUSED_ENV, "1")
    tokens, hidden, inter, experts, top_k = 96, 64, 32, 8, 2
    x, wgu, wd, logits = _experts_inputs(tokens, hidden, inter, experts, top_k, torch.bfloat16)
    r = moe_route(logits.cuda(), top_k)

    def layer(x: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor, w: torch.Tensor
              ) -> torch.Tensor:
        return moe_experts(x, wgu, wd, w, r.expert_ids, r.token_order, r.offsets)

    grads = []
    for fn in (layer, torch.compile(layer, backend="aot_eager", fullgraph=True)):
        leaves = [t.detach().cuda().requires_grad_() for t in (x, wgu, wd, r.weights)]
        (fn(*leaves).float() ** 2).sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert rel_err(a, b) <= 2e-2


@pytest.mark.cuda
def test_nn_moe_cuda_matches_cpu() -> None:
    moe = gemmt.nn.MoE(16, 8, 8, 2, score="sigmoid", n_group=4, topk_group=2,
                       correction_bias=True, routed_scaling_factor=2.5, dtype=torch.float64)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    ref = moe(x)
    out = moe.cuda()(x.cuda())
    assert rel_err(out, ref) <= 1e-12


# ---- transformers ----

class _OpCounter(TorchDispatchMode):
    """Counts the calls of each op that reaches the dispatcher's Python key."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        name = func._schema.name
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _tiny_models() -> list[tuple[str, Callable[[], Any]]]:
    tf = pytest.importorskip("transformers")
    common = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)

    def mixtral() -> Any:
        return tf.MixtralForCausalLM(tf.MixtralConfig(
            intermediate_size=24, num_local_experts=6, num_experts_per_tok=2, **common))

    def qwen3_moe() -> Any:
        return tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
            intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
            decoder_sparse_step=1, head_dim=8, **common))

    def deepseek_v3() -> Any:
        return tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
            intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8,
            num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
            first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=8, **{**common, "num_key_value_heads": 4}))

    return [("mixtral", mixtral), ("qwen3_moe", qwen3_moe), ("deepseek_v3", deepseek_v3)]


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "deepseek_v3"])
def test_transformers_models_with_gemmt_experts(name: str) -> None:
    import gemmt.moe

    build = dict(_tiny_models())[name]
    assert gemmt.moe.register_transformers()
    torch.manual_seed(0)
    model = build().float().eval()
    with torch.no_grad():
        for p in model.parameters():  # random weights everywhere (some start at zero)
            p.normal_(0, 0.05)
    ids = torch.randint(0, 97, (2, 11))
    model.set_experts_implementation("eager")
    eager = model(ids).logits
    model.set_experts_implementation("gemmt")
    assert model.config._experts_implementation == "gemmt"
    with _OpCounter() as counter:
        out = model(ids).logits
    # Parameters that require grad: moe_experts runs as its recorded pieces.
    gemmt_ops = {k: v for k, v in counter.calls.items() if k.startswith("gemmt::")}
    # Two products per MoE layer (DeepSeek-V3's first layer is dense here).
    assert gemmt_ops.get("gemmt::grouped_mm", 0) >= 2 and "gemmt::moe_permute" in gemmt_ops, gemmt_ops
    assert rel_err(out, eager) <= 1e-5
    # Gradients too: a training step's loss backward through gemmt's experts.
    model.train()
    model.zero_grad()
    model(ids, labels=ids).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.set_experts_implementation("eager")
    model.zero_grad()
    model(ids, labels=ids).loss.backward()
    experts_grads = [n for n in grads if "gate_up_proj" in n]
    assert experts_grads
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert rel_err(grads[n], p.grad) <= 1e-4, n


def test_transformers_unsupported_experts_are_refused() -> None:
    tf = pytest.importorskip("transformers")
    import gemmt.moe

    assert gemmt.moe.register_transformers()
    model = tf.GptOssForCausalLM(tf.GptOssConfig(
        vocab_size=97, hidden_size=32, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2, layer_types=["full_attention"]))
    model.set_experts_implementation("gemmt")
    with pytest.raises(NotImplementedError, match="gemmt experts implementation: GptOssExperts"):
        model(torch.randint(0, 97, (1, 5)))


# ---- DTensor sharding rules ----

def test_grouped_mm_sharding_rules() -> None:
    pytest.importorskip("torch.distributed.tensor")
    from torch.distributed.tensor import Partial, Replicate, Shard
    from conftest import RuleSpec as Spec

    R = Replicate()
    rules_for = gemmt.distributed.rules_for
    a, b, offs, bias = Spec(10, 8), Spec(3, 8, 6), Spec(3), Spec(3, 6)
    rules = {r.name: r for r in rules_for("grouped_mm", a, b, offs, bias, None, "none")}
    assert rules["column-wise"].inputs == (R, Shard(2), R, Shard(1), None, None)
    assert rules["column-wise"].outputs == (Shard(1),)
    assert rules["split K"].inputs == (Shard(1), Shard(1), R, Partial(), None, None)
    assert rules["split K"].outputs == (Partial(),)
    # The grouped (token) dimension is never split: the offsets index it whole.
    assert all(r.inputs[0] != Shard(0) for r in rules.values())
    with_act = rules_for("grouped_mm", a, b, offs, None, None, "silu")
    assert all(Partial() not in r.inputs + r.outputs for r in with_act)
    three = {r.name: r for r in rules_for("grouped_mm", Spec(3, 4, 8), b, None, None, None, "none")}
    assert three["by group"].inputs == (Shard(0), Shard(0), None, None, None, None)
    assert three["column-wise"].outputs == (Shard(2),)
    assert three["split K"].inputs[:2] == (Shard(2), Shard(1))
    two = {r.name for r in rules_for("grouped_mm", Spec(3, 4, 8), Spec(8, 9), offs, None, None,
                                     "none")}
    assert two == {"replicated"}
    for op, args in (("moe_permute", (Spec(4, 2), 6)),
                     ("moe_route", (Spec(4, 6), 2, "softmax", True, 0, 0, None))):
        (only,) = rules_for(op, *args)
        assert only.name == "replicated"


@pytest.mark.cuda
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_grouped_mm_cuda_empty_contraction(activation: str) -> None:
    """K = 0 on the GPU (an expert-parallel rank that received no tokens: its weight gradient
    sums over none): every product is zero and C = act(bias) in the groups, zeros elsewhere,
    in every layout, and the backward of a forward with no rows gives zero weight gradients."""
    dt, dev = torch.bfloat16, "cuda"
    out = grouped_mm(torch.randn(16, 0, dtype=dt, device=dev),
                     torch.randn(0, 24, dtype=dt, device=dev),
                     torch.zeros(3, dtype=torch.int32, device=dev))
    assert out.shape == (3, 16, 24) and torch.equal(out, torch.zeros_like(out))
    bias = torch.randn(3, 24, dtype=dt)
    offs = offsets([4, 0, 3])  # rows 7-9 belong to no group
    cases = [(torch.randn(10, 0, dtype=dt), torch.randn(3, 0, 24, dtype=dt), offs),
             (torch.randn(3, 5, 0, dtype=dt), torch.randn(3, 0, 24, dtype=dt), None)]
    for a, b, o in cases:
        got = grouped_mm(a.to(dev), b.to(dev), None if o is None else o.to(dev),
                         bias=bias.to(dev), activation=activation)
        want = act_ref(ref_grouped_mm(a, b, o, bias), activation)
        assert got.shape == want.shape
        assert rel_err(got.cpu(), want) < tol(dt), (a.shape, b.shape)
    x = torch.randn(0, 16, dtype=dt, device=dev, requires_grad=True)
    w = torch.randn(3, 16, 24, dtype=dt, device=dev, requires_grad=True)
    y = grouped_mm(x, w, torch.zeros(3, dtype=torch.int32, device=dev))
    y.sum().backward()
    assert w.grad is not None and torch.equal(w.grad, torch.zeros_like(w))
    assert x.grad is not None and x.grad.shape == x.shape
