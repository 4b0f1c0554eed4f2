"""Shape helpers shared by the modules."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def unfold_rows(y: Tensor, shape: Sequence[int]) -> Tensor:
    """``y``, a 2-D result computed on an input's rows, in the input's batch shape ``shape``,
    as a tensor of its own rather than a view (as torch.matmul folds batch dimensions): FSDP2
    hooks each module's output for the backward, and an in-place op on a view, such as a
    residual add, would drop that hook."""
    if tuple(y.shape) == tuple(shape):
        return y
    return torch.ops.aten._unsafe_view(y, list(shape))
