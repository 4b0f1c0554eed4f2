"""Modules: :class:`Linear`, a drop-in for :class:`torch.nn.Linear` that runs gemmt's
kernels, and :func:`replace_linear`, which swaps the Linear layers of an existing model.
FP8: :class:`Float8Linear` (defined in ``gemmt._float8``) and :func:`convert_to_float8`.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from gemmt._float8 import FLOAT8_RECIPES, Float8Linear, float8_eligible
from gemmt.ops import ACTIVATIONS, linear

__all__ = ["Linear", "replace_linear"]
__all__ += ["Float8Linear", "convert_to_float8", "float8_eligible", "FLOAT8_RECIPES"]


def _check_activation(activation: str) -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"gemmt.nn.Linear: argument 'activation' expected one of {', '.join(ACTIVATIONS)}, "
            f"got {activation!r}")
    return activation


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose forward is :func:`gemmt.linear`.

    Same constructor, parameters (``weight`` of shape ``(out_features, in_features)``,
    ``bias``), initialisation and ``state_dict`` keys as ``torch.nn.Linear``, so checkpoints
    load either way and code that checks ``isinstance(m, torch.nn.Linear)`` (tensor
    parallelism, FSDP wrapping policies) treats it as one. The keyword ``activation`` fuses an
    activation into the product's epilogue: ``Linear(4096, 11008, activation="silu")``
    computes ``silu(x @ W.T + b)`` in one pass.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 *, activation: str = "none") -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = _check_activation(activation)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch.nn.Linear's name
        return linear(input, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text if self.activation == "none" else f"{text}, activation={self.activation}"

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, activation: str = "none") -> Linear:
        """A gemmt Linear that shares ``module``'s parameters, buffers and hooks (no copy):
        an optimizer built on the old parameters keeps updating the new layer."""
        if not isinstance(module, torch.nn.Linear):
            raise TypeError(f"gemmt.nn.Linear.from_linear: argument 'module' expected a "
                            f"torch.nn.Linear, got {type(module).__name__}")
        new = cls.__new__(cls)
        new.__dict__.update(module.__dict__)
        new.activation = _check_activation(activation)
        return new


def replace_linear(model: torch.nn.Module,
                   include: Callable[[str, torch.nn.Linear], bool] | None = None
                   ) -> torch.nn.Module:
    """Swap, in place, every ``torch.nn.Linear`` inside ``model`` for a :class:`Linear` that
    shares its parameters, and return ``model``.

    Only layers whose type is exactly ``torch.nn.Linear`` are swapped: subclasses (quantised
    or otherwise specialised layers) keep their own forward. ``include(name, module)`` can
    narrow the choice further (names as in ``model.named_modules()``). The parameters, their
    names and the ``state_dict`` stay the same. When ``model`` is itself a
    ``torch.nn.Linear``, a new :class:`Linear` sharing its parameters is returned instead.
    """
    if type(model) is torch.nn.Linear:
        return Linear.from_linear(model) if include is None or include("", model) else model
    targets: list[tuple[torch.nn.Module, str, torch.nn.Linear]] = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            if type(child) is not torch.nn.Linear:
                continue
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if include is None or include(full, child):
                targets.append((parent, child_name, child))
    for parent, child_name, child in targets:
        setattr(parent, child_name, Linear.from_linear(child))
    return model


def convert_to_float8(model: torch.nn.Module, recipe: str = "tensorwise",
                      inference: bool = False,
                      include: Callable[[str, torch.nn.Linear], bool] | None = None
                      ) -> torch.nn.Module:
    """Swap, in place, the Linear layers of ``model`` for :class:`Float8Linear` layers that
    share their parameters, and return ``model``.

    Converted: modules whose type is exactly ``torch.nn.Linear`` or :class:`gemmt.nn.Linear`
    (whose fused activation is kept) and that :func:`float8_eligible` accepts: both feature
    counts multiples of 16, of 128 for "blockwise". Other layers (the usual odd-sized output
    heads, subclasses with their own forward) are left as they are. ``include(name, module)``
    narrows the choice further (names as in ``model.named_modules()``). ``recipe`` and
    ``inference`` are :class:`Float8Linear`'s. When ``model`` is itself such a Linear, the new
    layer is returned.
    """
    if recipe not in FLOAT8_RECIPES:
        raise ValueError(f"gemmt.nn.convert_to_float8: argument 'recipe' expected one of "
                         f"{', '.join(FLOAT8_RECIPES)}, got {recipe!r}")

    def wanted(name: str, module: torch.nn.Module) -> bool:
        return (type(module) in (torch.nn.Linear, Linear)
                and float8_eligible(module, recipe)  # type: ignore[arg-type]
                and (include is None or include(name, module)))  # type: ignore[arg-type]

    if wanted("", model):
        return Float8Linear.from_linear(model, recipe, inference)  # type: ignore[arg-type]
    targets: list[tuple[torch.nn.Module, str, torch.nn.Linear]] = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if wanted(full, child):
                targets.append((parent, child_name, child))  # type: ignore[arg-type]
    for parent, child_name, child in targets:
        setattr(parent, child_name, Float8Linear.from_linear(child, recipe, inference))
    return model
