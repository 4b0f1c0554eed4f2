"""Expert parallelism: the experts of a mixture-of-experts layer split across the processes of
a ``torch.distributed`` group, tokens exchanged with all-to-all.

Rank ``r`` of a group of ``W`` holds experts ``[r * E_local, (r + 1) * E_local)``. Each rank
routes its own tokens; :func:`expert_parallel_experts` sends every routed ``(token, k)`` slot
to the rank holding its expert, runs the experts there with gemmt's grouped products and
sends the results back, where each token's ``top_k`` results are combined as
:func:`gemmt.moe_experts` combines them. :class:`gemmt.nn.ExpertParallelMoE` is the module.

A token goes to each rank that holds one or more of its experts once, however many of its
``top_k`` experts live there; the receiver hands the row to each of them. The results come
back one per slot, so that the combine sums them in :func:`gemmt.moe_experts`' order.

One host synchronisation per forward: the all-to-all of the tokens has uneven splits, and
their sizes (how many rows and slots each rank sends to each other rank) must be known on the
host to size the receive buffers. The backward reuses the splits of the forward and
synchronises nothing.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from gemmt.ops import grouped_mm, moe_permute, swiglu

__all__ = ["expert_parallel_experts"]

_NAME = "gemmt.expert_parallel_experts"

# Columns of the metadata each rank sends every other rank in the counts exchange: slots,
# distinct token rows, out-of-range ids, local experts, hidden size, refused arguments.
_COUNT, _ROWS, _INVALID, _LOCAL_EXPERTS, _HIDDEN, _REFUSED = range(6)
_META = 6


def _exchange(x: Tensor, out_splits: Sequence[int], in_splits: Sequence[int],
              group: Any) -> Tensor:
    """All-to-all of the rows of ``x``: ``in_splits[r]`` rows to rank r, ``out_splits[r]``
    rows from rank r."""
    import torch.distributed as dist

    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """:func:`_exchange` with a backward: the gradient rows go back the way they came."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, out_splits: list[int], in_splits: list[int],
                group: Any) -> Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        return _AllToAll.apply(grad, in_splits, out_splits, ctx.group), None, None, None


def _dispatch_plan(order: Tensor, ids: Tensor, top_k: int, e_local: int, world: int
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The rows to send for the slots in ``order`` (sorted by global expert, so by destination
    rank): each token once per destination rank, grouped by rank, tokens ascending within a
    rank. ``ids`` are the slots' global expert ids (flattened ``(T, top_k)``).

    Returns the rows each rank gets (``(world,)``), each slot's row among those sent to its
    rank, and for every slot (in ``(rank, token)`` order) its row among all rows sent and its
    token, from which :func:`_rows_to_send` lists the rows once their count is known. Only
    operations of fixed size: no host synchronisation.
    """
    tokens = max(ids.numel() // max(top_k, 1), 1)
    slot_token = order.long() // top_k
    slot_dest = ids.index_select(0, order) // e_local
    keys, perm = torch.sort(slot_dest * tokens + slot_token, stable=True)
    first = torch.ones_like(keys, dtype=torch.bool)
    first[1:] = keys[1:] != keys[:-1]
    row = torch.cumsum(first, 0) - 1
    rows_per_rank = torch.zeros(world, dtype=torch.long, device=keys.device)
    rows_per_rank.scatter_add_(0, keys // tokens, first.long())
    row_of_slot = torch.empty_like(row).scatter_(0, perm, row)
    first_row = torch.cumsum(rows_per_rank, 0) - rows_per_rank
    return rows_per_rank, row_of_slot - first_row.index_select(0, slot_dest), row, keys % tokens


def _rows_to_send(rows: int, row: Tensor, token: Tensor) -> Tensor:
    """The token of each of the ``rows`` rows to send (slots of one row write the same
    token)."""
    return torch.empty(rows, dtype=torch.long, device=token.device).scatter_(0, row, token)


def _local_problem(x: Tensor, weights: Tensor, expert_ids: Tensor, w_gate_up: Tensor,
                   w_down: Tensor) -> str | None:
    """Why this rank's arguments are refused, or None. Checked before any collective and
    reported through the counts exchange, so that every rank raises instead of the others
    waiting in an all-to-all that this rank never joins."""
    if x.dim() != 2:
        return f"argument 'x' expected a 2-D tensor (T, H), got shape {tuple(x.shape)}"
    if not x.is_floating_point():
        return f"argument 'x' expected a floating dtype, got {x.dtype}"
    if w_gate_up.dim() != 3 or w_down.dim() != 3:
        return (f"arguments 'w_gate_up_local' and 'w_down_local' expected 3-D tensors "
                f"(E_local, 2 * I, H) and (E_local, H, I), got shapes "
                f"{tuple(w_gate_up.shape)} and {tuple(w_down.shape)}")
    e_local, hidden, inter = w_gate_up.shape[0], x.shape[1], w_down.shape[2]
    if e_local < 1:
        return "argument 'w_gate_up_local' expected at least one expert, got none"
    if tuple(w_gate_up.shape[1:]) != (2 * inter, hidden):
        return (f"argument 'w_gate_up_local' expected shape (E_local, 2 * I, H) = "
                f"({e_local}, {2 * inter}, {hidden}) (H = x.shape[1], I = "
                f"w_down_local.shape[2]), got {tuple(w_gate_up.shape)}")
    if tuple(w_down.shape[:2]) != (e_local, hidden):
        return (f"argument 'w_down_local' expected shape (E_local, H, I) = ({e_local}, "
                f"{hidden}, {inter}) (E_local = w_gate_up_local.shape[0]), got "
                f"{tuple(w_down.shape)}")
    for name, w in (("w_gate_up_local", w_gate_up), ("w_down_local", w_down)):
        if w.dtype != x.dtype or w.device != x.device:
            return (f"argument '{name}' expected the dtype and device of 'x' ({x.dtype}, "
                    f"{x.device}), got {w.dtype}, {w.device}")
    if weights.dim() != 2 or weights.shape[0] != x.shape[0]:
        return (f"argument 'weights' expected shape (T, top_k) with T = x.shape[0] = "
                f"{x.shape[0]}, got {tuple(weights.shape)}")
    if not weights.is_floating_point() or weights.device != x.device:
        return (f"argument 'weights' expected a floating tensor on {x.device}, got "
                f"{weights.dtype} on {weights.device}")
    if expert_ids.shape != weights.shape:
        return (f"argument 'expert_ids' expected the shape of 'weights' "
                f"{tuple(weights.shape)}, got {tuple(expert_ids.shape)}")
    if expert_ids.dtype not in (torch.int32, torch.int64) or expert_ids.device != x.device:
        return (f"argument 'expert_ids' expected int32 or int64 on {x.device}, got "
                f"{expert_ids.dtype} on {expert_ids.device}")
    return None


def expert_parallel_experts(x: Tensor, weights: Tensor, expert_ids: Tensor,
                            w_gate_up_local: Tensor, w_down_local: Tensor,
                            group: Any = None) -> Tensor:
    """:func:`gemmt.moe_experts` with the experts split across the ranks of ``group``.

    Every rank of ``group`` (the default group when None) calls this together with its own
    tokens: ``x`` ``(T, H)`` (T may differ between ranks, and be 0), ``weights`` and
    ``expert_ids`` ``(T, top_k)``, the routing of those tokens over all ``E = W * E_local``
    experts of the group. ``w_gate_up_local`` ``(E_local, 2 * I, H)`` and ``w_down_local``
    ``(E_local, H, I)`` are this rank's experts, global ids ``[rank * E_local,
    (rank + 1) * E_local)``, in :func:`gemmt.moe_experts`' layout (gate rows before up rows).

    Returns ``(T, H)`` in ``x``'s dtype: for each slot ``(t, k)`` the expert
    ``expert_ids[t, k]`` (wherever it lives) computes ``down(silu(gate) * up)`` of ``x[t]``,
    and ``out[t]`` is the ``weights``-weighted sum of the token's ``top_k`` results, summed in
    float32 (float64 for float64 ``x``) in the order :func:`gemmt.moe_experts` sums them,
    rounded once. Differentiable in ``x``, ``weights`` and the local expert weights; the
    backward exchanges the gradients with the same splits, so every rank must run it (the
    same inputs requiring gradients on every rank).

    Data flow: the slots are sorted by global expert (:func:`gemmt.moe_permute`), which sorts
    them by destination rank; the per-rank counts (with checks of the arguments) go through
    one ``all_to_all_single`` and are read on the host, the only synchronisation; each
    token's row follows once per destination rank (``_dispatch_plan``), and each slot's
    local expert id and row index with it, with uneven splits; the receiver hands every slot
    its row, groups the slots by local expert (``moe_permute``) and runs ``grouped_mm``,
    ``swiglu``, ``grouped_mm``; the slots' results return with the reverse splits and are
    combined on the tokens' rank.

    Bad arguments on any rank (shapes, dtypes, an expert id outside ``[0, E)``, ranks that
    disagree on ``E_local`` or ``H``) raise on every rank after the counts exchange, so no
    rank is left waiting in a collective.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    problem = _local_problem(x, weights, expert_ids, w_gate_up_local, w_down_local)
    device = x.device
    meta = torch.zeros(world, _META, dtype=torch.int64, device=device)
    if problem is None:
        tokens, top_k = weights.shape
        e_local = w_gate_up_local.shape[0]
        num_experts = world * e_local
        ids = expert_ids.reshape(-1).long()
        valid = (ids >= 0) & (ids < num_experts)
        # Out-of-range ids are reported below, after the exchange; until then they are
        # placed on expert 0 so that moe_permute accepts them.
        placed = torch.where(valid, ids, 0)
        order, offsets = moe_permute(placed.view(tokens, top_k), num_experts)
        ends = offsets.view(world, e_local)[:, -1].long()
        meta[:, _COUNT] = ends - torch.cat([ends.new_zeros(1), ends[:-1]])
        rows_per_rank, row_of_slot, slot_row, slot_token_sorted = _dispatch_plan(
            order, placed, top_k, e_local, world)
        meta[:, _ROWS] = rows_per_rank
        meta[:, _INVALID] = (~valid).sum()
        meta[:, _LOCAL_EXPERTS] = e_local
        meta[:, _HIDDEN] = x.shape[1]
    else:
        meta[:, _REFUSED] = 1
    recv_meta = _exchange(meta, [1] * world, [1] * world, group)
    # The one host synchronisation: the splits of the token exchange.
    host = torch.stack([meta[:, _COUNT], meta[:, _ROWS], *recv_meta.unbind(1)]).tolist()
    send_counts, send_rows = host[0], host[1]
    recv_counts, recv_rows = host[2 + _COUNT], host[2 + _ROWS]
    host = host[2:]
    if problem is not None:
        raise ValueError(f"{_NAME}: {problem}")
    refused = [r for r, bad in enumerate(host[_REFUSED]) if bad]
    if refused:
        raise RuntimeError(f"{_NAME}: the arguments of rank(s) {refused} of the group were "
                           f"refused (see the error there); every rank stops")
    shapes = set(zip(host[_LOCAL_EXPERTS], host[_HIDDEN]))
    if len(shapes) != 1:
        raise ValueError(
            f"{_NAME}: argument 'w_gate_up_local' expected the same number of local experts "
            f"and hidden size on every rank, got (E_local, H) per rank "
            f"{list(zip(host[_LOCAL_EXPERTS], host[_HIDDEN]))}")
    invalid = host[_INVALID]
    if any(invalid):
        bad = {r: n for r, n in enumerate(invalid) if n}
        raise ValueError(f"{_NAME}: argument 'expert_ids' expected values in [0, {num_experts})"
                         f" (E = world size {world} x E_local {e_local}), got out-of-range ids "
                         f"(count per rank: {bad})")

    # Dispatch: each token's row once per destination rank; for each slot, its expert's id
    # on the receiving rank and the index of its row among those its source sent there.
    slot_token = order // top_k
    send_tokens = _rows_to_send(sum(send_rows), slot_row, slot_token_sorted)
    recv_x = _AllToAll.apply(x.index_select(0, send_tokens), recv_rows, send_rows, group)
    slot_info = torch.stack([ids.index_select(0, order) % e_local, row_of_slot], 1)
    recv_info = _exchange(slot_info, recv_counts, send_counts, group)
    recv_local = recv_info[:, 0].contiguous()
    # The counts already on the device (a tensor made from the host lists would be copied
    # with a stream synchronisation); sized from the host lists: no synchronisation.
    rows_from = recv_meta[:, _ROWS]
    first_row = rows_from.cumsum(0) - rows_from
    slot_source = torch.arange(world, device=device).repeat_interleave(
        recv_meta[:, _COUNT], output_size=sum(recv_counts))
    sent_x = recv_x.index_select(0, recv_info[:, 1] + first_row.index_select(0, slot_source))

    # The local experts. Each source's rows arrive sorted by expert; a stable sort groups
    # them across sources.
    local_order, local_offsets = moe_permute(recv_local.view(-1, 1), e_local)
    inter = w_down_local.shape[2]
    h = grouped_mm(sent_x.index_select(0, local_order), w_gate_up_local.transpose(1, 2),
                   local_offsets)
    act = swiglu(h.narrow(1, 0, inter), h.narrow(1, inter, inter))
    done = grouped_mm(act, w_down_local.transpose(1, 2), local_offsets)
    back_to_arrival = torch.empty_like(local_order)
    back_to_arrival[local_order] = torch.arange(local_order.numel(), device=device)
    results = _AllToAll.apply(done.index_select(0, back_to_arrival), send_counts, recv_counts,
                              group)

    # Combine on the tokens' rank: the slots come back in `order`, the order moe_experts
    # sums them in.
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = weights.reshape(-1).index_select(0, order).to(acc)
    out = torch.zeros(tokens, x.shape[1], dtype=acc, device=device)
    return out.index_add(0, slot_token, results.to(acc) * w.unsqueeze(1)).to(x.dtype)
