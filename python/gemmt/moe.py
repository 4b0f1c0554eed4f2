"""gemmt's experts for transformers' mixture-of-experts models.

transformers (5.x) runs the experts of Mixtral, Qwen3-MoE, the DeepSeek-V3 family and every
other model whose experts class is decorated with ``use_experts_implementation`` through a
registry of implementations, chosen with ``model.set_experts_implementation(name)``.
:func:`register_transformers` adds gemmt's to it under the name "gemmt"::

    import gemmt.moe
    gemmt.moe.register_transformers()
    model.set_experts_implementation("gemmt")

transformers stays optional: nothing here imports it until :func:`register_transformers` is
called.

Expert parallelism (the experts split across processes): :func:`expert_parallel_experts`,
defined in :mod:`gemmt.moe_parallel`, and the module :class:`gemmt.nn.ExpertParallelMoE`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gemmt.moe_parallel import expert_parallel_experts
from gemmt.ops import moe_experts, moe_permute, quantize_fp8

__all__ = ["IMPLEMENTATION_NAME", "expert_parallel_experts", "experts_forward",
           "float8_experts", "quantize_experts", "register_transformers"]

IMPLEMENTATION_NAME = "gemmt"


def _unsupported(module: torch.nn.Module) -> str | None:
    """Why ``module``'s experts cannot run on gemmt, or None when they can."""
    if not getattr(module, "has_gate", True):
        return "experts without a gate projection (has_gate=False)"
    if getattr(module, "has_bias", False):
        return "experts with biases (has_bias=True)"
    if not getattr(module, "is_concatenated", True):
        return "an interleaved gate/up layout (is_concatenated=False)"
    if getattr(module, "has_post_expert_norm", False):
        return "a norm after each expert (has_post_expert_norm=True)"
    if getattr(module, "_is_expert_parallel", False):
        return "transformers' expert parallelism"
    act = getattr(module, "act_fn", None)
    if act is None or not (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"):
        return f"the activation {type(act).__name__} (gemmt's experts use SiLU)"
    apply_gate = getattr(type(module), "_apply_gate", None)
    if apply_gate is not None and apply_gate.__module__ != "transformers.integrations.moe":
        return f"a custom gate ({type(module).__name__}._apply_gate)"
    return None


def quantize_experts(w: Tensor) -> tuple[Tensor, Tensor]:
    """A stack of expert weights ``(E, out, in)`` as float8_e4m3fn with one dequantisation
    scale per output row of each expert: ``(E, out, in)`` and ``(E, out)`` float32, what
    :func:`float8_experts` takes."""
    experts, rows, cols = w.shape
    q, scale = quantize_fp8(w.reshape(experts * rows, cols), "row")
    return q.view(experts, rows, cols), scale.view(experts, rows)


def float8_experts(x: Tensor, w_gate_up: Tensor, w_gate_up_scale: Tensor, w_down: Tensor,
                   w_down_scale: Tensor, weights: Tensor, expert_ids: Tensor,
                   token_order: Tensor, offsets: Tensor) -> Tensor:
    """:func:`gemmt.moe_experts` with float8 experts, for inference (not differentiable).

    ``w_gate_up`` ``(E, 2 * I, H)`` and ``w_down`` ``(E, H, I)`` are float8 with a scale per
    output row (:func:`quantize_experts`); the routing arguments are ``moe_experts``'s. Each
    token is quantised once (a scale per token), its rows gathered into expert order as float8
    (half the bytes of bf16), the gate/up product run by :func:`gemmt.scaled_grouped_mm`,
    ``silu(gate) * up`` quantised a row at a time for the down product, whose float32 results
    are weighted and summed per token in float32 and rounded once to ``x``'s dtype. The op
    ``torch.ops.gemmt.moe_experts_float8``; on CUDA its gather and combine are gemmt's kernels.
    """
    return torch.ops.gemmt.moe_experts_float8(x, w_gate_up, w_gate_up_scale, w_down,
                                              w_down_scale, weights, expert_ids, token_order,
                                              offsets)


def experts_forward(self: torch.nn.Module, hidden_states: Tensor, top_k_index: Tensor,
                    top_k_weights: Tensor) -> Tensor:
    """transformers' experts-implementation signature, run by :func:`gemmt.moe_experts`.

    ``hidden_states`` ``(T, H)``, ``top_k_index`` ``(T, top_k)``, ``top_k_weights``
    ``(T, top_k)``; ``self`` is the experts module, whose ``gate_up_proj`` and ``down_proj``
    are used as they are (a transposed view when the module stores them transposed). Experts
    gemmt does not implement (biases, interleaved gate/up, other activations) raise
    NotImplementedError naming what is missing.
    """
    reason = _unsupported(self)
    if reason is not None:
        raise NotImplementedError(f"gemmt experts implementation: {type(self).__name__} has "
                                  f"{reason}, which gemmt does not implement; use another "
                                  f"experts implementation for this model")
    w_gate_up, w_down = self.gate_up_proj, self.down_proj
    if getattr(self, "is_transposed", False):
        w_gate_up, w_down = w_gate_up.transpose(1, 2), w_down.transpose(1, 2)
    token_order, offsets = moe_permute(top_k_index, self.num_experts)
    out = moe_experts(hidden_states.to(w_gate_up.dtype), w_gate_up, w_down, top_k_weights,
                      top_k_index, token_order, offsets)
    return out.to(hidden_states.dtype)


def register_transformers() -> bool:
    """Register :func:`experts_forward` as transformers' experts implementation "gemmt".

    Returns False when transformers, or its experts registry (transformers 5), is not
    installed; True once registered (calling it again is harmless).
    """
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(IMPLEMENTATION_NAME, experts_forward)
    return True
