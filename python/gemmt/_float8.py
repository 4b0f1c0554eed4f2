"""FP8 Linear layers: :class:`Float8Linear` (exported by :mod:`gemmt.nn`, with
``convert_to_float8``; see docs/fp8.md).

Every product runs through :func:`gemmt.scaled_mm` on operands quantised by
:func:`gemmt.quantize_fp8_with_transpose`: the forward ``x @ W.T``, and in training both
backward products, ``grad_x = grad_y @ W`` and ``grad_W = grad_y.T @ x``, on the quantised
output gradient. The master weight stays in its own (high) precision.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from gemmt._shapes import unfold_rows
from gemmt.ops import ACTIVATIONS, quantize_fp8, quantize_fp8_with_transpose, scaled_mm

__all__ = ["Float8Linear", "float8_eligible", "FLOAT8_RECIPES"]

FLOAT8_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise", "blockwise")
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _Recipe(NamedTuple):
    x: str  # granularity of the activations (and of their transpose, for grad_W)
    w: str  # granularity of the weight (and of its transpose, for grad_x)
    grad: str  # granularity of the output gradient (and of its transpose)
    grad_dtype: torch.dtype  # the output gradient's float8 format
    align: int  # every contracted dimension: a multiple of this
    fast_forward: bool  # the forward product's default accumulation (torchao's choice)


_RECIPES: dict[str, _Recipe] = {
    # torchao's tensorwise default: e4m3 forward, e5m2 gradients (their wider range); the
    # forward product with the tensor cores' own accumulation, the gradients' promoted.
    "tensorwise": _Recipe("tensor", "tensor", "tensor", torch.float8_e5m2, 16, True),
    # Per-row scales cover the range; e4m3 everywhere, as torchao's rowwise recipe.
    "rowwise": _Recipe("row", "row", "row", torch.float8_e4m3fn, 16, True),
    # 1x128 activations and gradients, 128x128 weights, all e4m3 (DeepSeek-V3's recipe); every
    # 128-deep block summed in float32 with its scales.
    "blockwise": _Recipe("block", "block_128x128", "block", torch.float8_e4m3fn, 128, False),
}


def _recipe(recipe: str) -> _Recipe:
    if recipe not in _RECIPES:
        raise ValueError(f"gemmt.nn.Float8Linear: argument 'recipe' expected one of "
                         f"{', '.join(FLOAT8_RECIPES)}, got {recipe!r}")
    return _RECIPES[recipe]


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _pad_rows(t: Tensor, rows: int) -> Tensor:
    # Zero rows change no amax and add nothing to a product contracted over the rows.
    return t if t.shape[0] == rows else F.pad(t, (0, 0, 0, rows - t.shape[0]))


def _first_rows(scale: Tensor, rows: int) -> Tensor:
    return scale if scale.dim() == 0 else scale[:rows]


def _activate(z: Tensor, activation: str) -> Tensor:
    if activation == "relu":
        return F.relu(z)
    if activation == "gelu":
        return F.gelu(z)
    if activation == "gelu_tanh":
        return F.gelu(z, approximate="tanh")
    if activation == "silu":
        return F.silu(z)
    return z


class _Float8LinearFunction(torch.autograd.Function):
    """``x @ W.T + b`` with all three products in FP8 (x is 2-D).

    Saved for backward: the quantised transposes of x and W (half the bytes of bf16), which
    the weight and input gradients multiply by.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor, weight: Tensor,
                bias: Tensor | None, recipe: str, grad_dtype: torch.dtype,
                fast_accum: bool) -> Tensor:
        r = _RECIPES[recipe]
        rows = x.shape[0]
        # grad_W contracts over the tokens: pad them to the alignment the product needs.
        padded = _round_up(rows, r.align)
        xq, xs, xqt, xst = quantize_fp8_with_transpose(_pad_rows(x, padded), r.x)
        wq, ws, wqt, wst = quantize_fp8_with_transpose(weight, r.w)
        z = scaled_mm(xq[:rows], wq.t(), _first_rows(xs, rows), ws.t(), bias, out_dtype=x.dtype,
                      use_fast_accum=fast_accum)
        ctx.save_for_backward(xqt, xst, wqt, wst)
        ctx.recipe = recipe
        ctx.grad_dtype = grad_dtype
        ctx.x_dtype = x.dtype
        ctx.w_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return z

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None]:
        xqt, xst, wqt, wst = ctx.saved_tensors
        r = _RECIPES[ctx.recipe]
        rows = grad.shape[0]
        padded = xqt.shape[1]
        gq, gs, gqt, gst = quantize_fp8_with_transpose(_pad_rows(grad, padded), r.grad,
                                                       ctx.grad_dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            # (M, N) @ (N, K): W itself, read through its quantised transpose.
            grad_x = scaled_mm(gq[:rows], wqt.t(), _first_rows(gs, rows), wst.t(),
                               out_dtype=ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            # (N, M) @ (M, K), contracted over the (padded) tokens.
            grad_w = scaled_mm(gqt, xqt.t(), gst, xst.t(), out_dtype=ctx.w_dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None


class Float8Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose products run in FP8 through :func:`gemmt.scaled_mm`.

    Same parameters, initialisation and ``state_dict`` as ``torch.nn.Linear``: the weight
    (and bias) stay in their own dtype, float32, float16 or bfloat16, and the layer quantises
    on the fly, per ``recipe``:

    - "tensorwise": one scale per tensor; gradients in float8_e5m2;
    - "rowwise": one scale per row of the activations and of the weight (per token, per
      output channel), and per row of each transposed operand in the backward; e4m3;
    - "blockwise": 1x128 blocks of the activations and gradients, 128x128 blocks of the
      weight; e4m3.

    ``grad_dtype`` overrides the recipe's float8 format for the output gradient.
    ``fast_accum`` sets how the forward product (``x @ W.T``) accumulates: True, the tensor
    cores' own FP8 accumulation (faster; its error grows with ``in_features``); False, each
    128-deep block summed in float32. The default, None, is torchao's for the recipe: True for
    "tensorwise" and "rowwise", False for "blockwise" (whose blocks are always summed in
    float32). The two backward products are always summed in float32.
    ``in_features`` and ``out_features`` must be multiples of 16 (128 for "blockwise"): each
    is contracted by one of the three products. Training runs the forward and both backward
    products in FP8 (dynamic scaling: each call quantises with the current amax); the bias
    gradient is a float32 sum. With ``inference=True`` the weight is quantised once (again
    after ``load_state_dict``, a move with ``.to()``, or :meth:`requantize_weight`) and only
    the activations are quantised per call; such a layer has no backward. ``activation`` (one
    of ``gemmt.ACTIVATIONS``) is fused into the product when no gradient is recorded.

    Runs wherever :func:`gemmt.scaled_mm` does: on CPU (the reference) and on Hopper GPUs.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 *, recipe: str = "tensorwise", inference: bool = False,
                 activation: str = "none", grad_dtype: torch.dtype | None = None,
                 fast_accum: bool | None = None) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self._configure(recipe, inference, activation, grad_dtype, fast_accum)

    def _configure(self, recipe: str, inference: bool, activation: str,
                   grad_dtype: torch.dtype | None, fast_accum: bool | None = None) -> None:
        r = _recipe(recipe)
        if activation not in ACTIVATIONS:
            raise ValueError(f"gemmt.nn.Float8Linear: argument 'activation' expected one of "
                             f"{', '.join(ACTIVATIONS)}, got {activation!r}")
        if grad_dtype not in (None, torch.float8_e4m3fn, torch.float8_e5m2):
            raise ValueError(f"gemmt.nn.Float8Linear: argument 'grad_dtype' expected None, "
                             f"torch.float8_e4m3fn or torch.float8_e5m2, got {grad_dtype}")
        for name in ("in_features", "out_features"):
            size = getattr(self, name)
            if size % r.align:
                raise ValueError(f"gemmt.nn.Float8Linear: {name} expected a multiple of "
                                 f"{r.align} for recipe {recipe!r}, got {size}")
        self.recipe = recipe
        self.inference = bool(inference)
        self.activation = activation
        self.grad_dtype = r.grad_dtype if grad_dtype is None else grad_dtype
        if fast_accum not in (None, True, False):
            raise ValueError(f"gemmt.nn.Float8Linear: argument 'fast_accum' expected None, True "
                             f"or False, got {fast_accum!r}")
        self.fast_accum = r.fast_forward if fast_accum is None else bool(fast_accum)
        self._weight_fp8: tuple[Tensor, Tensor] | None = None
        if self.inference and self.weight.device.type != "meta":
            self.requantize_weight()

    def requantize_weight(self) -> None:
        """Quantise the current weight for ``inference=True`` (done once, and after each
        ``load_state_dict`` or move; call it after changing the weight in place)."""
        with torch.no_grad():
            self._weight_fp8 = quantize_fp8(self.weight.detach(), _RECIPES[self.recipe].w)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Float8Linear:
        super()._apply(fn, recurse)
        self._weight_fp8 = None  # quantised again, where the weight now lives, on next use
        return self

    def _load_from_state_dict(self, *args: object, **kwargs: object) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._weight_fp8 = None

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch.nn.Linear's name
        if input.shape[-1:] != (self.in_features,):
            raise ValueError(f"gemmt.nn.Float8Linear: input expected last dimension "
                             f"{self.in_features}, got shape {tuple(input.shape)}")
        if input.dtype not in _FLOAT_DTYPES or self.weight.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"gemmt.nn.Float8Linear: input and weight expected float32, float16 "
                            f"or bfloat16, got {input.dtype} and {self.weight.dtype}")
        r = _RECIPES[self.recipe]
        x = input.reshape(-1, self.in_features)
        records = torch.is_grad_enabled() and (
            input.requires_grad or self.weight.requires_grad
            or (self.bias is not None and self.bias.requires_grad))
        if self.inference:
            if torch.is_grad_enabled() and input.requires_grad:
                raise RuntimeError("gemmt.nn.Float8Linear: a layer made with inference=True has "
                                   "no backward, but the input requires grad; use "
                                   "inference=False to train, or run under torch.no_grad()")
            if self._weight_fp8 is None:
                self.requantize_weight()
            assert self._weight_fp8 is not None
            wq, ws = self._weight_fp8
            y = self._product(x, wq, ws, self.bias.detach() if self.bias is not None else None)
        elif records:
            z = _Float8LinearFunction.apply(x, self.weight, self.bias, self.recipe,
                                            self.grad_dtype, self.fast_accum)
            y = _activate(z, self.activation)
        else:
            wq, ws = quantize_fp8(self.weight, r.w)
            y = self._product(x, wq, ws, self.bias)
        return unfold_rows(y, (*input.shape[:-1], self.out_features))

    def _product(self, x: Tensor, wq: Tensor, ws: Tensor, bias: Tensor | None) -> Tensor:
        xq, xs = quantize_fp8(x, _RECIPES[self.recipe].x)
        return scaled_mm(xq, wq.t(), xs, ws.t(), bias, out_dtype=x.dtype,
                         activation=self.activation, use_fast_accum=self.fast_accum)

    def extra_repr(self) -> str:
        text = f"{super().extra_repr()}, recipe={self.recipe}, fast_accum={self.fast_accum}"
        if self.inference:
            text += ", inference=True"
        return text if self.activation == "none" else f"{text}, activation={self.activation}"

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, recipe: str = "tensorwise",
                    inference: bool = False, activation: str | None = None,
                    grad_dtype: torch.dtype | None = None,
                    fast_accum: bool | None = None) -> Float8Linear:
        """A Float8Linear sharing ``module``'s parameters (no copy), so an optimizer built on
        them keeps training the new layer. ``activation`` defaults to the module's own (a
        :class:`gemmt.nn.Linear` may carry one), else "none"."""
        if not isinstance(module, torch.nn.Linear):
            raise TypeError(f"gemmt.nn.Float8Linear.from_linear: argument 'module' expected a "
                            f"torch.nn.Linear, got {type(module).__name__}")
        new = cls.__new__(cls)
        new.__dict__.update(module.__dict__)
        if activation is None:
            activation = getattr(module, "activation", "none")
        new._configure(recipe, inference, activation, grad_dtype, fast_accum)
        return new


def float8_eligible(module: torch.nn.Linear, recipe: str = "tensorwise") -> bool:
    """Whether :func:`convert_to_float8` converts this layer: both ``in_features`` and
    ``out_features`` multiples of 16 (128 for "blockwise"), weight float32/16/bf16."""
    align = _recipe(recipe).align
    return (module.in_features % align == 0 and module.out_features % align == 0
            and module.weight.dtype in _FLOAT_DTYPES)
