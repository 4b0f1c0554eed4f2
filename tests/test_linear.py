"""gemmt.linear and gemmt.nn.Linear: forward and backward against float64 references,
every activation, bias or none, first and second derivatives, opcheck-style registration,
torch.compile, state_dict compatibility with torch.nn.Linear, and replace_linear."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import gemmt
from conftest import HAS_CUDA, rel_err, tol_for, torch_act

ACTS = list(gemmt.ACTIVATIONS)


@pytest.fixture(autouse=True)
def _library_loaded() -> None:
    gemmt.build_info()  # torch.ops.gemmt is populated once the library is loaded


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
              activation: str) -> torch.Tensor:
    z = x.double() @ w.double().t()
    if b is not None:
        z = z + b.double()
    return torch_act(z, activation)


def make(shape_x: tuple[int, ...], out_f: int, dtype: torch.dtype, device: str,
         bias: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    in_f = shape_x[-1]
    x = torch.randn(*shape_x, device=device).to(dtype)
    w = (torch.randn(out_f, in_f, device=device) / max(in_f, 1) ** 0.5).to(dtype)
    b = torch.randn(out_f, device=device).to(dtype) if bias else None
    return x, w, b


def dtypes_for(device: str) -> list[torch.dtype]:
    if device == "cpu":
        return [torch.float64, torch.float32, torch.bfloat16]
    return [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_matches_reference(device: str, activation: str, bias: bool) -> None:
    for dtype, shape in itertools.product(dtypes_for(device), [(5, 7), (2, 3, 17), (64,)]):
        x, w, b = make(shape, 13, dtype, device, bias)
        out = gemmt.linear(x, w, b, activation)
        assert out.shape == (*shape[:-1], 13) and out.dtype == dtype
        assert rel_err(out, reference(x, w, b, activation)) <= tol_for(dtype), (dtype, shape)


@pytest.mark.parametrize("activation", ACTS)
def test_backward_matches_reference(device: str, activation: str) -> None:
    for dtype in dtypes_for(device):
        x, w, b = make((3, 6, 24), 20, dtype, device)
        leaves = [t.detach().requires_grad_() for t in (x, w, b)]
        g = torch.randn(3, 6, 20, device=device).to(dtype)
        gemmt.linear(*leaves, activation=activation).backward(g)
        refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
        reference(*refs, activation).backward(g.double())
        for got, want in zip(leaves, refs):
            assert got.grad.dtype == dtype
            assert rel_err(got.grad, want.grad) <= 2 * tol_for(dtype), (dtype, activation)


@pytest.mark.parametrize("activation", ACTS)
def test_gradcheck_and_second_derivatives(activation: str) -> None:
    # float64 on CPU: exact enough for finite differences of first and second order.
    x, w, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True)
               for s in ((4, 5), (3, 5), (3,)))
    fn = lambda x, w, b: gemmt.linear(x, w, b, activation)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))
    if activation == "relu":
        # ReLU's second derivative is zero almost everywhere: check the recorded backward
        # runs and agrees with torch's rather than finite differences across kinks.
        gx, = torch.autograd.grad(fn(x, w, b).sum(), x, create_graph=True)
        gx_ref, = torch.autograd.grad(F.relu(F.linear(x, w, b)).sum(), x, create_graph=True)
        torch.testing.assert_close(gx, gx_ref)
    else:
        assert torch.autograd.gradgradcheck(fn, (x, w, b))


def test_second_derivative_of_square() -> None:
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    gx, = torch.autograd.grad(gemmt.square(x).sum(), x, create_graph=True)
    ggx, = torch.autograd.grad(gx.sum(), x)
    torch.testing.assert_close(ggx, torch.full_like(x, 2.0))
    assert torch.autograd.gradgradcheck(gemmt.square, (x,))


def test_frozen_weight_and_input_only(device: str) -> None:
    x, w, b = make((8, 16), 12, torch.float32, device)
    x.requires_grad_()
    gemmt.linear(x, w, b, "silu").sum().backward()
    xr = x.detach().double().requires_grad_()
    reference(xr, w, b, "silu").sum().backward()
    assert rel_err(x.grad, xr.grad) <= 1e-5
    assert w.grad is None


def test_empty_and_degenerate_shapes(device: str) -> None:
    for rows, in_f, out_f in [(0, 5, 3), (4, 0, 3), (4, 5, 0), (1, 1, 1)]:
        x, w, b = make((rows, in_f), out_f, torch.float32, device)
        out = gemmt.linear(x, w, b, "gelu")
        assert out.shape == (rows, out_f)
        if out.numel():
            assert rel_err(out, reference(x, w, b, "gelu")) <= 1e-5


def test_noncontiguous_inputs(device: str) -> None:
    x = torch.randn(10, 40, device=device)[:, ::2]  # (10, 20), column stride 2
    w = torch.randn(20, 30, device=device).t()      # (30, 20), strides (1, 30)
    b = torch.randn(60, device=device)[::2]
    out = gemmt.linear(x, w, b, "relu")
    assert rel_err(out, reference(x, w, b, "relu")) <= 1e-5


def test_bad_inputs_name_the_op_and_argument(device: str) -> None:
    x, w, b = make((4, 5), 3, torch.float32, device)
    cases = [
        (lambda: gemmt.linear(x, w[:, :4]), "x.shape\\[-1\\] == weight.shape\\[1\\]"),
        (lambda: gemmt.linear(x, w, b[:2]), "argument 'bias' expected shape"),
        (lambda: gemmt.linear(x, w.half()), "arguments 'x' and 'weight' expected the same dtype"),
        (lambda: gemmt.linear(x, w, None, "tanh"), "argument 'activation' expected one of"),
        (lambda: gemmt.linear(x, w[0]), "argument 'weight' expected a 2-D tensor"),
        (lambda: gemmt.linear(x.int(), w), "argument 'x' expected dtype"),
    ]
    for fn, pattern in cases:
        with pytest.raises(RuntimeError, match="gemmt::linear.*" + pattern):
            fn()


def test_meta_and_fake_shapes() -> None:
    x = torch.empty(2, 3, 7, device="meta")
    w = torch.empty(5, 7, device="meta")
    assert torch.ops.gemmt.linear(x, w, None, "silu").shape == (2, 3, 5)
    y, z = torch.ops.gemmt.linear_with_preact(x, w, None, "gelu")
    assert y.shape == z.shape == (2, 3, 5)
    g, gb = torch.ops.gemmt.linear_activation_backward(y, z, "gelu", True)
    assert g.shape == (2, 3, 5) and gb.shape == (5,)
    assert torch.ops.gemmt.linear_bias_backward(y).shape == (5,)


def test_fused_backward_pieces_match_torch(device: str) -> None:
    for dtype in dtypes_for(device):
        g = torch.randn(37, 24, device=device).to(dtype)
        z = torch.randn(37, 24, device=device).to(dtype)
        for act in ("relu", "gelu", "gelu_tanh", "silu"):
            gz, gb = torch.ops.gemmt.linear_activation_backward(g, z, act, True)
            zr = z.detach().double().clone().requires_grad_()
            torch_act(zr, act).backward(g.double())
            assert rel_err(gz, zr.grad) <= tol_for(dtype), (dtype, act)
            # The bias gradient sums the rounded grad_preact values, the ones the GEMMs use,
            # and is rounded once to the dtype.
            rounding = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}.get(dtype, 1e-6)
            assert rel_err(gb, gz.double().sum(0)) <= rounding, (dtype, act)
        gb = torch.ops.gemmt.linear_bias_backward(g)
        assert rel_err(gb, g.double().sum(0)) <= tol_for(dtype)


def test_torch_compile_fullgraph_forward_and_backward(device: str) -> None:
    x, w, b = make((6, 16), 8, torch.float32, device)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    eager = [t.clone().requires_grad_() for t in (x, w, b)]

    def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return gemmt.linear(x, w, b, "gelu_tanh").square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled(*leaves).backward()
    step(*eager).backward()
    for got, want in zip(leaves, eager):
        torch.testing.assert_close(got.grad, want.grad)


# ---- gemmt.nn ----

def test_nn_linear_is_a_drop_in(device: str) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Linear(12, 7, device=device)
    mod = gemmt.nn.Linear(12, 7, device=device)
    assert isinstance(mod, torch.nn.Linear)
    assert set(mod.state_dict()) == set(ref.state_dict()) == {"weight", "bias"}
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(3, 12, device=device)
    assert rel_err(mod(x), ref(x)) <= 1e-5
    no_bias = gemmt.nn.Linear(12, 7, bias=False, device=device, dtype=torch.float64)
    assert no_bias.bias is None and no_bias.weight.dtype == torch.float64
    act = gemmt.nn.Linear(12, 7, activation="silu", device=device)
    act.load_state_dict(ref.state_dict())
    assert rel_err(act(x), F.silu(ref(x))) <= 1e-5
    assert "activation=silu" in repr(act)
    with pytest.raises(ValueError, match="argument 'activation' expected one of"):
        gemmt.nn.Linear(2, 2, activation="tanh")


def test_replace_linear_shares_parameters() -> None:
    class Custom(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(16, 4)), Custom(4, 4))
    params = [id(p) for p in model.parameters()]
    keys = list(model.state_dict())
    x = torch.randn(5, 8)
    before = model(x)
    out = gemmt.nn.replace_linear(model)
    assert out is model
    assert type(model[0]) is gemmt.nn.Linear and type(model[2][0]) is gemmt.nn.Linear
    assert type(model[3]) is Custom  # subclasses keep their own forward
    assert [id(p) for p in model.parameters()] == params and list(model.state_dict()) == keys
    torch.testing.assert_close(model(x), before)
    only_first = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    gemmt.nn.replace_linear(only_first, include=lambda name, m: name == "0")
    assert type(only_first[0]) is gemmt.nn.Linear and type(only_first[1]) is torch.nn.Linear


def test_transformers_model_end_to_end() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(config).double().eval()
    ours = transformers.LlamaForCausalLM(config).double().eval()
    ours.load_state_dict(ref.state_dict())
    gemmt.nn.replace_linear(ours)
    assert any(isinstance(m, gemmt.nn.Linear) for m in ours.modules())
    ids = torch.randint(0, 128, (2, 16))
    out_ref = ref(ids, labels=ids)
    out = ours(ids, labels=ids)
    torch.testing.assert_close(out.logits, out_ref.logits)
    out.loss.backward()
    out_ref.loss.backward()
    for (name, p), p_ref in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, msg=name)


# ---- CUDA sweep: many shapes, layouts and dtypes, outputs checked for full coverage ----

def _poison_allocator(nbytes: int) -> None:
    # Fresh outputs come from the caching allocator: hand it NaN-filled blocks first, so an
    # output element the kernels never write shows up as NaN.
    torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")
    torch.cuda.synchronize()


SWEEP_SHAPES = [(1, 64, 32), (2, 4096, 11008), (7, 33, 65), (16, 4096, 4096), (64, 520, 1000),
                (100, 129, 257), (256, 1024, 384), (512, 4096, 11008), (1000, 72, 96),
                (2048, 640, 512), (4096, 256, 1024), (3, 4100, 1030), (65, 11008, 4096),
                (512, 1000, 5000), (144, 1024, 2048)]


def _random_shapes(count: int, seed: int) -> list[tuple[int, int, int]]:
    # M log-uniform over 1..4096; K and N anywhere in 1..3000, so most are odd or not a
    # multiple of 8 (the unaligned paths), a few of them tiny.
    gen = torch.Generator().manual_seed(seed)
    shapes = []
    for _ in range(count):
        m = int(2 ** (torch.rand((), generator=gen).item() * 12))
        k, n = (int(v) for v in torch.randint(1, 3000, (2,), generator=gen))
        shapes.append((m, k, n))
    return shapes


SWEEP_SHAPES += _random_shapes(24, seed=11)
SWEEP_LAYOUTS = [("row", "row"), ("row", "transposed"), ("transposed", "row")]


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "row" else t.t().contiguous().t()


# Rows x columns for the backward pass alone: one row; fewer units than resident blocks
# (each block a strip's part or a whole strip); strips shared by many blocks; blocks that
# start inside a strip and end in the next; odd widths (the scalar form's narrow strips);
# a vocabulary-wide row.
ACT_BACKWARD_SHAPES = [(1, 11008), (7, 256), (9, 264), (300, 4100), (2048, 11008),
                       (4099, 1000), (517, 333), (3, 128256), (8191, 24), (40, 11008)]


@pytest.mark.cuda
def test_cuda_activation_backward_pass_shapes() -> None:
    gen = torch.Generator().manual_seed(5)
    for (rows, cols), act in zip(ACT_BACKWARD_SHAPES, itertools.cycle(ACTS[1:])):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            g = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
            z = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
            _poison_allocator(rows * cols * 8)
            gz, gb = torch.ops.gemmt.linear_activation_backward(g, z, act, True)
            zr = z.double().requires_grad_()
            torch_act(zr, act).backward(g.double())
            where = (rows, cols, act, dtype)
            assert not gz.isnan().any() and not gb.isnan().any(), where
            assert rel_err(gz, zr.grad) <= tol_for(dtype), where
            # Float32 sums of the rounded grad_preact, rounded once to the dtype.
            rounding = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}.get(dtype, 1e-5)
            assert rel_err(gb, gz.double().sum(0)) <= rounding, where
            _poison_allocator(cols * 8)
            assert rel_err(torch.ops.gemmt.linear_bias_backward(g), g.double().sum(0)) <= rounding


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "tf32", "float16", "bfloat16"])
def test_cuda_sweep_forward_backward(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # tf32: float32 tensors with TF32 allowed, which routes products to the tensor-core
    # kernels (and, for a row-major W.T, to the kernel that computes C transposed).
    tf32 = dtype == "tf32"
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    dtype = torch.float32 if tf32 else getattr(torch, dtype)
    tol = tol_for(dtype, allow_tf32=tf32)
    gen = torch.Generator().manual_seed(7)
    for (m, in_f, out_f), act in zip(SWEEP_SHAPES, itertools.cycle(ACTS)):
        for x_layout, w_layout in SWEEP_LAYOUTS:
            x = _laid_out(torch.randn(m, in_f, generator=gen).to(dtype).cuda(), x_layout)
            w_cpu = torch.randn(out_f, in_f, generator=gen) / in_f ** 0.5
            w = _laid_out(w_cpu.to(dtype).cuda(), w_layout)
            b = torch.randn(out_f, generator=gen).to(dtype).cuda()
            _poison_allocator(m * out_f * 8)
            leaves = [t.detach().requires_grad_() for t in (x, w, b)]
            out = gemmt.linear(*leaves, activation=act)
            ref = reference(x, w, b, act)
            where = (m, in_f, out_f, act, x_layout, w_layout)
            assert not out.isnan().any(), where
            assert rel_err(out, ref) <= tol, where
            g = torch.randn(m, out_f, generator=gen).to(dtype).cuda()
            if act == "relu":
                # relu' jumps at 0: where z is within the product's rounding of 0, the kernel
                # and the float64 reference may fall on different sides. No gradient flows
                # there in this check (both sides see the same masked g).
                z = x.double() @ w.double().t() + b.double()
                g = g.masked_fill(z.abs() < 8 * tol * z.abs().mean(), 0)
            out.backward(g)
            refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
            reference(*refs, act).backward(g.double())
            for got, want in zip(leaves, refs):
                assert rel_err(got.grad, want.grad) <= 2 * tol, where


# ---- Gradients near the activations' kinks: no worse than torch's own ---------------------

def _near_zero_case(m: int, in_f: int, out_f: int, dtype: torch.dtype, bias: bool,
                    gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x = torch.randn(m, in_f, generator=gen, device="cuda")
    w = torch.randn(out_f, in_f, generator=gen, device="cuda") / in_f ** 0.5
    x, w = x.to(dtype), w.to(dtype)
    if bias:
        b = torch.randn(out_f, generator=gen, device="cuda").double()
        # Row 0's bias cancels its product: every pre-activation of that row sits within a
        # few roundings of zero, where ReLU's mask and the other activations' slopes turn.
        b[: out_f // 2] = -(x[0].double() @ w[: out_f // 2].double().t())
        return x, w, b.to(dtype)
    # Without a bias, a row of small inputs: its pre-activations sit near zero too.
    x[0] *= 1e-3
    return x, w, None


def _grads(fn, inputs: list[torch.Tensor], g: torch.Tensor) -> list[torch.Tensor]:
    leaves = [t.detach().requires_grad_() for t in inputs]
    fn(*leaves).backward(g)
    return [t.grad for t in leaves]


NEAR_ZERO_SHAPES = [(2 * 257, 5120, 13824), (33, 1024, 4096), (300, 777, 1000), (5, 4096, 11008)]


# float32: the exact-FP32 SIMT kernels add a long K in one running sum per output, where
# cuBLAS cuts it into slices; at K = 13824 (grad_input of a 5120 -> 13824 layer) that leaves
# 2.1x torch's error (1.6e-6 against 7.5e-7, H100) before any activation is involved.
_FP32_LONG_K = pytest.mark.xfail(
    reason="float32 products of a long K: one running sum per output (2.1x torch's error at "
           "K = 13824)", strict=False)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16,
                                   pytest.param(torch.float32, marks=_FP32_LONG_K)])
@pytest.mark.parametrize("bias", [True, False])
def test_cuda_gradients_near_kinks_within_twice_torch(dtype: torch.dtype, bias: bool) -> None:
    # Against a float64 computation on the same (rounded) inputs, gemmt's gradients may be
    # at most twice as far off as torch's own path in the same dtype: a criterion that
    # follows the dtype and the shape instead of a fixed tolerance. (A second rounding of
    # the pre-activation before the bias once flipped float16 ReLU masks: 6x torch's error.)
    gen = torch.Generator(device="cuda").manual_seed(17)
    eps = torch.finfo(dtype).eps
    for (m, in_f, out_f), act in itertools.product(NEAR_ZERO_SHAPES, ACTS):
        x, w, b = _near_zero_case(m, in_f, out_f, dtype, bias, gen)
        inputs = [t for t in (x, w, b) if t is not None]
        g = torch.randn(m, out_f, generator=gen, device="cuda").to(dtype)

        def ours(*t: torch.Tensor) -> torch.Tensor:
            return gemmt.linear(t[0], t[1], t[2] if bias else None, activation=act)

        def theirs(*t: torch.Tensor) -> torch.Tensor:
            return torch_act(F.linear(t[0], t[1], t[2] if bias else None), act)

        def exact(*t: torch.Tensor) -> torch.Tensor:
            return reference(t[0], t[1], t[2] if bias else None, act)

        _poison_allocator(m * out_f * 8)
        got = _grads(ours, inputs, g)
        torch_grads = _grads(theirs, inputs, g)
        want = _grads(exact, [t.double() for t in inputs], g.double())
        for name, mine, tor, ref in zip(("x", "w", "b"), got, torch_grads, want):
            where = (m, in_f, out_f, act, dtype, bias, name)
            assert not mine.isnan().any(), where
            e_ours, e_torch = rel_err(mine, ref), rel_err(tor, ref)
            print(f"near-kink {where}: gemmt {e_ours:.3e} torch {e_torch:.3e}")
            # The floor, far below one rounding of the dtype, covers torch being exact.
            assert e_ours <= 2 * e_torch + 0.05 * eps, (where, e_ours, e_torch)
