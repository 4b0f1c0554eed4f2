"""DTensor sharding rules for gemmt's ops, so that they run inside PyTorch's distributed stack
(DTensor, tensor parallelism with ``parallelize_module``, FSDP2's ``fully_shard``).

Each op gets a list of *rules*: for one mesh dimension, the placements its tensor inputs may
have and the placements of its outputs that follow. DTensor expands the rules over every
dimension of the mesh (``torch.distributed.tensor.experimental.register_sharding``) and runs
gemmt's kernel on the local shards.

FP8 (``scaled_mm``, ``quantize_fp8``, ``quantize_fp8_with_transpose``): see ``_fp8_rules``;
scales split with the rows or columns they belong to, never across a 128-block.

The GEMM family (``x`` is ``(..., K)``, ``weight`` ``(N, K)``, ``a`` ``(M, K)``, ``b``
``(K, N)``):

============  ==============================  ==============================  ==========
rule          linear (x, weight, bias)        mm (a, b)                       output
============  ==============================  ==============================  ==========
replicated    Replicate, Replicate, Replicate Replicate, Replicate            Replicate
column-wise   Replicate, Shard(0), Shard(0)   Replicate, Shard(1)             Shard(-1)
row-wise      Shard(-1), Shard(1), Partial    Shard(1), Shard(0)              Partial
batch         Shard(d), Replicate, Replicate  Shard(0), Replicate             Shard(d)
partial       Partial in x or in weight, the other and bias as in row-wise    Partial
============  ==============================  ==============================  ==========

``d`` is any leading dimension of ``x``. Row-wise and partial make partial sums, which DTensor
reduces when the output is redistributed; they hold only for ``activation="none"`` (an
activation of a partial sum is not the sum of the activations), so with an activation they
are not offered. The bias of a partial sum must be added once: it takes the Partial
placement, which DTensor derives from a replicated bias without communication (the bias stays
on one rank, zeros on the others). ``gemm`` (in place, ``c = alpha a @ b + beta c``) has the
rules of ``mm`` with ``c`` in the output's placement; ``c`` is never redistributed, since the
op writes into it. The elementwise ops keep any sharding; the linear ones (``add``, ``scale``,
``square_backward`` in its gradient) also keep Partial.

Inputs that match no rule are refused with an error that lists the rules, instead of being
gathered silently. DTensor may still move an input to a rule when that moves no data between
ranks (Replicate to Shard or to Partial is a local slice); any redistribution that needs a
collective (all-gather, all-reduce, all-to-all) must be asked for explicitly with
``DTensor.redistribute``.

The rules are registered when gemmt's library is loaded in a process that has imported
``torch.distributed.tensor``, or on the first gemmt call with a DTensor argument; calling
:func:`register` does it explicitly (needed only to call ``torch.ops.gemmt`` directly on
DTensors in a process that imported DTensor after gemmt's first call).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from gemmt import _native

if TYPE_CHECKING:
    from torch.distributed.tensor import DeviceMesh
    from torch.distributed.tensor.placement_types import Placement

__all__ = ["Rule", "ShardingRuleError", "check_inputs", "is_registered", "leave_process_group",
           "maybe_register", "register", "rules_for"]

_lock = threading.Lock()
_registered = False
_auto_failed = False


class ShardingRuleError(RuntimeError):
    """DTensor inputs of a gemmt op that none of its sharding rules accepts without moving
    data between ranks. DTensor reports it inside its own RuntimeError."""


@dataclass(frozen=True)
class Rule:
    """One sharding rule for one mesh dimension.

    ``outputs`` has one placement per output, ``inputs`` one per argument of the op's schema
    (None for an argument that is not a tensor, or an optional tensor that is absent).
    """

    name: str
    outputs: tuple[Placement | None, ...]
    inputs: tuple[Placement | None, ...]


def leave_process_group(completed: bool) -> None:
    """End a worker's use of the default process group (the last call of a torchrun worker).

    A model sharded with ``fully_shard`` or ``parallelize_module`` holds its process groups
    and the tensors of its collectives in reference cycles, so it outlives the function that
    built it until a garbage collection. Left to the interpreter's exit, it is freed while
    the interpreter is torn down, and with gloo that aborted a process now and then
    ("terminate called without an active exception", SIGABRT) after every step had run
    correctly. So: collect it now; then, if this rank ``completed`` its work, wait at a
    barrier until every rank has (rank 0 may still be checking results while the others are
    done, and a peer that tears down early can abort the others); then destroy the group.
    A rank that failed skips the barrier, which its peers might never reach.
    """
    import torch.distributed as dist

    gc.collect()
    if completed:
        dist.barrier()
    dist.destroy_process_group()


def is_registered() -> bool:
    """True once the rules are registered with DTensor in this process."""
    return _registered


def maybe_register() -> None:
    """Register the rules if DTensor is in use in this process (its module is imported).

    Cheap when there is nothing to do: a flag and a ``sys.modules`` lookup, so the native
    loader and the ops' non-fast path can call it every time.
    """
    global _auto_failed
    if _registered or _auto_failed or "torch.distributed.tensor" not in sys.modules:
        return
    # Inside a torch.compile trace the registration (a lock, a module import) cannot be
    # traced; the eager call that precedes any compiled one, or the library's load, does it.
    if torch.compiler.is_compiling():
        return
    try:
        register()
    except Exception as exc:  # noqa: BLE001 - plain tensors must keep working
        # Called from the loader and from every op call: a failure here (a torch release
        # that moved what the rules need) must not break gemmt on plain tensors. DTensor
        # calls then fail with DTensor's "no sharding strategy" error; register() raises.
        _auto_failed = True
        warnings.warn(f"gemmt: DTensor sharding rules were not registered: {exc}",
                      RuntimeWarning, stacklevel=2)


def register() -> bool:
    """Register the sharding rules of every gemmt op with DTensor; idempotent.

    Returns False when this torch has no ``torch.distributed`` (then there is no DTensor to
    register with). Loads gemmt's native library.
    """
    global _registered
    if _registered:
        return True
    if not torch.distributed.is_available():
        return False
    # Outside the lock: the library's first load registers the rules itself (through
    # maybe_register) when DTensor is imported, and would wait on this lock otherwise.
    _native.load()
    with _lock:
        if not _registered:
            _register_all()
            _registered = True
    return True


# ----------------------------------------------------------------------------------------
# Rules


def _placements() -> tuple[type, type, type]:
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Partial, Replicate, Shard


def _tensor_ndim(arg: Any) -> int:
    meta = getattr(arg, "tensor_meta", None)
    if meta is None:
        raise ShardingRuleError("gemmt.distributed: a DTensor input has no shape information")
    return len(meta.shape)


def _elementwise_rules(ndims: Sequence[int | None], linear_in: Sequence[bool],
                       shard_dims: int, n_outputs: int = 1) -> list[Rule]:
    """Rules of an op whose output element i depends only on input element i.

    ``ndims`` gives each argument's rank (None: not a tensor). Any of the first
    ``shard_dims`` dims may be sharded, in every tensor alike (``rgb_to_gray`` drops its last
    input dim, which therefore stays whole). ``linear_in[i]`` says the op is linear in
    argument i: then a Partial there, with the other tensors replicated or themselves linear
    and Partial, gives a Partial output.
    """
    Partial, Replicate, Shard = _placements()
    rules = [Rule("replicated", (Replicate(),) * n_outputs,
                  tuple(None if n is None else Replicate() for n in ndims))]
    for d in range(shard_dims):
        rules.append(Rule(f"sharded on dim {d}", (Shard(d),) * n_outputs,
                          tuple(None if n is None else Shard(d) for n in ndims)))
    if any(linear_in):
        rules.append(Rule("partial", (Partial(),) * n_outputs, tuple(
            None if n is None else (Partial() if ok else Replicate())
            for n, ok in zip(ndims, linear_in))))
    return rules


def _linear_rules(x: Any, weight: Any, bias: Any, activation: str,
                  n_outputs: int = 1) -> list[Rule]:
    """Rules of ``act(x @ weight.T + bias)`` (``linear``, and ``linear_with_preact`` with
    the pre-activation as a second output in the same placement)."""
    Partial, Replicate, Shard = _placements()
    nd = _tensor_ndim(x)
    has_bias = bias is not None
    R, P = Replicate(), Partial()

    def rule(name: str, out: Placement, px: Placement, pw: Placement,
             pb: Placement) -> Rule:
        return Rule(name, (out,) * n_outputs, (px, pw, pb if has_bias else None, None))

    rules = [
        rule("replicated", R, R, R, R),
        rule("column-wise", Shard(nd - 1), R, Shard(0), Shard(0)),
    ]
    rules += [rule(f"batch (x sharded on dim {d})", Shard(d), Shard(d), R, R)
              for d in range(nd - 1)]
    if activation == "none":
        # Partial sums; the bias is added on one rank only (Partial), the activation would
        # not commute with the sum.
        rules += [
            rule("row-wise", P, Shard(nd - 1), Shard(1), P),
            rule("partial x", P, P, R, P),
            rule("partial weight", P, R, P, P),
        ]
    return rules


def _mm_rules(out_is_input: bool) -> list[Rule]:
    """Rules of ``a @ b``; with ``out_is_input`` (gemm: c, a, b, alpha, beta, variant),
    ``c`` is an input in the output's placement and the op returns nothing."""
    Partial, Replicate, Shard = _placements()
    R, P = Replicate(), Partial()
    table = [
        ("replicated", R, R, R),
        ("row-split a", Shard(0), Shard(0), R),
        ("column-split b", Shard(1), R, Shard(1)),
        ("split K", P, Shard(1), Shard(0)),
        ("partial a", P, P, R),
        ("partial b", P, R, P),
    ]
    if out_is_input:
        return [Rule(name, (), (out, pa, pb, None, None, None)) for name, out, pa, pb in table]
    return [Rule(name, (out,), (pa, pb)) for name, out, pa, pb in table]


def _linear_activation_backward_rules(grad: Any, preact: Any, activation: str,
                                      bias_grad: bool) -> list[Rule]:
    """``(act'(z) * g, its sum over every dim but the last)``: elementwise in the first
    output; the second is sharded when the last dim is, a partial sum when a summed dim is.
    Both are linear in ``g``."""
    Partial, Replicate, Shard = _placements()
    nd = _tensor_ndim(grad)
    R, P = Replicate(), Partial()
    rules = [Rule("replicated", (R, R), (R, R, None, None))]
    for d in range(nd):
        gb = Shard(0) if d == nd - 1 else P
        rules.append(Rule(f"sharded on dim {d}", (Shard(d), gb),
                          (Shard(d), Shard(d), None, None)))
    rules.append(Rule("partial grad", (P, P), (P, R, None, None)))
    return rules


def _linear_bias_backward_rules(grad: Any) -> list[Rule]:
    """The sum of ``grad`` over every dim but the last."""
    Partial, Replicate, Shard = _placements()
    nd = _tensor_ndim(grad)
    rules = [Rule("replicated", (Replicate(),), (Replicate(),))]
    for d in range(nd):
        rules.append(Rule(f"sharded on dim {d}", (Shard(0) if d == nd - 1 else Partial(),),
                          (Shard(d),)))
    rules.append(Rule("partial grad", (Partial(),), (Partial(),)))
    return rules


def _grouped_mm_rules(a: Any, b: Any, offs: Any, bias: Any, activation: str) -> list[Rule]:
    """Rules of ``grouped_mm``. The offsets index the grouped dimension (rows of a 2-D ``a``
    over a 3-D ``b``, the contraction of two 2-D operands, the columns of a 2-D ``b`` under
    a 3-D ``a``), so that dimension stays whole and the offsets replicated. A 3-D ``b``'s
    columns may be split (the output's and the bias's columns with them), two 3-D operands
    by group, and the contraction dimension of a 3-D ``b`` into partial sums (no activation;
    the bias then Partial, added once). Two 2-D operands: the columns of ``b``."""
    Partial, Replicate, Shard = _placements()
    R, P = Replicate(), Partial()
    na, nb = _tensor_ndim(a), _tensor_ndim(b)
    out_nd = 3 if na == nb else 2

    def rule(name: str, out: Placement, pa: Placement, pb: Placement, pbias: Placement
             ) -> Rule:
        return Rule(name, (out,), (pa, pb, None if offs is None else R,
                                   None if bias is None else pbias, None, None))

    rules = [rule("replicated", R, R, R, R)]
    if nb == 3:
        rules.append(rule("column-wise", Shard(out_nd - 1), R, Shard(2), Shard(1)))
        if na == 3:
            rules.append(rule("by group", Shard(0), Shard(0), Shard(0), Shard(0)))
        if activation == "none":
            rules.append(rule("split K", P, Shard(na - 1), Shard(1), P))
    elif na == 2:
        rules.append(rule("column-wise", Shard(2), R, Shard(1), R))
    return rules


def _scaled_grouped_mm_rules(a: Any, b: Any, scale_a: Any, scale_b: Any, offs: Any, bias: Any,
                             activation: str) -> list[Rule]:
    """Rules of ``scaled_grouped_mm``: those of ``grouped_mm``, each scale placed with the
    extent it scales (a 3-D ``b``'s columns, the groups) and replicated under a split of K
    (a partial sum's scaled terms add up to the scaled sum). Two 2-D operands, whose scales
    hold a set a group end to end, run replicated only; block scales (as many dimensions as
    their operand) replicated or by group, where no 128-block is cut."""
    Replicate, Shard = _placements()[1:]
    R = Replicate()
    scales = {"replicated": (R, R), "column-wise": (R, Shard(1)),
              "by group": (Shard(0), Shard(0)), "split K": (R, R)}
    both_2d = _tensor_ndim(a) == 2 and _tensor_ndim(b) == 2
    block = _tensor_ndim(scale_a) == _tensor_ndim(a)
    rules = []
    for r in _grouped_mm_rules(a, b, offs, bias, activation):
        if (both_2d and r.name != "replicated") or (block and r.name not in ("replicated",
                                                                              "by group")):
            continue
        pa, pb, poffs, pbias = r.inputs[:4]
        rules.append(Rule(r.name, r.outputs,
                          (pa, pb, *scales[r.name], poffs, pbias, None, None, None)))
    return rules


def rules_for(op_name: str, *args: Any) -> list[Rule]:
    """The rules of ``gemmt::<op_name>`` for its arguments in schema order, every argument
    given (DTensor specs, or anything with ``placements`` and ``tensor_meta``, for tensors).

    Each rule has one input placement per argument of the schema.
    """
    nd = [_tensor_ndim(a) if _is_tensor_arg(a) else None for a in args]
    if op_name == "mm":
        return _mm_rules(out_is_input=False)
    if op_name == "gemm":
        return _mm_rules(out_is_input=True)
    if op_name in ("linear", "linear_with_preact"):
        x, weight, bias, activation = args
        return _linear_rules(x, weight, bias, activation,
                             n_outputs=2 if op_name == "linear_with_preact" else 1)
    if op_name == "linear_activation_backward":
        return _linear_activation_backward_rules(*args)
    if op_name == "linear_bias_backward":
        return _linear_bias_backward_rules(*args)
    if op_name == "add":
        return _elementwise_rules(nd, (True, True), nd[0] or 0)
    if op_name in ("scale", "square_backward"):
        # x * factor; 2 * grad * x: linear in the first argument.
        return _elementwise_rules(nd, (True, False), nd[0] or 0)
    if op_name == "swiglu":
        # silu(gate) * up: linear in up.
        return _elementwise_rules(nd, (False, True), nd[0] or 0)
    if op_name == "swiglu_backward":
        # (grad * up * silu'(gate), grad * silu(gate)): not linear in (grad, up) jointly.
        return _elementwise_rules(nd, (False, False, False), nd[0] or 0, n_outputs=2)
    if op_name in ("square", "normalize_volume"):
        return _elementwise_rules(nd, (False,) * len(nd), nd[0] or 0)
    if op_name == "rgb_to_gray":
        # [..., H, W, 3] -> [..., H, W]: any dim but the channels may be sharded.
        return _elementwise_rules(nd, (False, False), (nd[0] or 1) - 1)
    if op_name in _FP8_OPS:
        return _fp8_rules(op_name, *args)
    if op_name == "grouped_mm":
        a, b, offs, bias, _, activation = args
        return _grouped_mm_rules(a, b, offs, bias, activation)
    if op_name == "scaled_grouped_mm":
        a, b, scale_a, scale_b, offs, bias, _, activation, _ = args
        return _scaled_grouped_mm_rules(a, b, scale_a, scale_b, offs, bias, activation)
    if op_name in ("moe_permute", "moe_route", "moe_experts", "moe_experts_float8"):
        # A token's slots are ordered across the whole batch (token_order, offsets), so
        # the routing data and the expert layer run on replicated tensors only.
        R = _placements()[1]()
        n_outputs = {"moe_permute": 2, "moe_route": 4, "moe_experts": 1,
                     "moe_experts_float8": 1}[op_name]
        return [Rule("replicated", (R,) * n_outputs, tuple(None if n is None else R for n in nd))]
    raise KeyError(f"gemmt.distributed: no sharding rules for op {op_name!r}")


def _is_tensor_arg(arg: Any) -> bool:
    return hasattr(arg, "placements")


# Every op with rules. Their argument names come from the registered schemas.
_OPS: tuple[str, ...] = (
    "mm", "gemm", "linear", "linear_with_preact", "linear_activation_backward",
    "linear_bias_backward", "add", "scale", "square", "square_backward", "normalize_volume",
    "rgb_to_gray", "swiglu", "swiglu_backward",
    "grouped_mm", "scaled_grouped_mm", "moe_permute", "moe_route", "moe_experts",
    "moe_experts_float8",
)

# FP8 (scaled_mm and the quantize ops; rules in _fp8_rules below).
_FP8_OPS: tuple[str, ...] = ("scaled_mm", "quantize_fp8", "quantize_fp8_with_transpose")
_OPS += _FP8_OPS


def _normalize(p: Placement, ndim: int) -> Placement:
    _, _, Shard = _placements()
    if isinstance(p, Shard) and p.dim < 0:
        return Shard(p.dim + ndim)
    return p


def _moves_no_data(current: Placement, wanted: Placement) -> bool:
    """True when DTensor can turn ``current`` into ``wanted`` locally on every rank
    (a replicated tensor is sliced, or kept on one rank for Partial)."""
    _, Replicate, _ = _placements()
    return current == wanted or isinstance(current, Replicate)


def _describe(rule: Rule, names: Sequence[str]) -> str:
    ins = ", ".join(f"{n}={p}" for n, p in zip(names, rule.inputs) if p is not None)
    outs = ", ".join(str(p) for p in rule.outputs) or "c unchanged"
    return f"{rule.name}: {ins} -> {outs}"


def _accepts(rule: Rule, current: Sequence[Placement | None], exact: bool) -> bool:
    for cur, want in zip(current, rule.inputs):
        if (cur is None) != (want is None):
            return False
        if cur is not None and not (cur == want if exact else _moves_no_data(cur, want)):
            return False
    return True


def _shardable(spec: Any, placements: Sequence[Placement], mesh: DeviceMesh) -> bool:
    """DTensor's own condition on a rule's input: every sharded dim has at least one
    element per shard. It skips rules that fail it, even for inputs already so sharded."""
    _, _, Shard = _placements()
    shape = spec.tensor_meta.shape
    shards = [1] * len(shape)
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            shards[p.dim] *= mesh.size(mesh_dim)
    return all(size >= n for size, n in zip(shape, shards))


def check_inputs(op_name: str, names: Sequence[str], args: Sequence[Any],
                 rules: Sequence[Rule], exact: bool = False) -> None:
    """Raise :class:`ShardingRuleError` unless, on every mesh dimension, some rule takes the
    inputs (``args`` in schema order) as they are or by local slicing alone (with ``exact``,
    only as they are), and DTensor will run the rules so chosen."""
    mesh = next(a for a in args if _is_tensor_arg(a)).mesh
    current = [[_normalize(a.placements[m], _tensor_ndim(a)) if _is_tensor_arg(a) else None
                for a in args] for m in range(mesh.ndim)]
    flags = "".join(f", {n}={a!r}" for n, a in zip(names, args) if isinstance(a, (str, bool)))
    advice = ("Redistribute the inputs to one of them with DTensor.redistribute, or compute "
              "on full_tensor(): gemmt's ops do not gather or reduce their inputs implicitly.")
    listing = "\n  ".join(_describe(r, names) for r in rules)
    activation = dict(zip(names, args)).get("activation")
    if op_name.startswith("linear") and activation not in (None, "none"):
        listing += ("\n(row-wise and partial inputs hold only for activation='none': the "
                    "activation of a partial sum is not the sum of the activations; apply it "
                    "after the reduction)")
    per_dim = [[r for r in rules if _accepts(r, cur, exact)] for cur in current]
    for mesh_dim, accepted in enumerate(per_dim):
        if not accepted:
            got = ", ".join(f"{n}={p}" for n, p in zip(names, current[mesh_dim])
                            if p is not None)
            raise ShardingRuleError(
                f"gemmt.{op_name}: no sharding rule accepts the DTensor inputs on mesh "
                f"dimension {mesh_dim} ({got}{flags}) without moving data between ranks. "
                f"Rules for these arguments, per mesh dimension:\n  {listing}\n{advice}")
    for combo in itertools.product(*per_dim):
        if all(_shardable(a, [r.inputs[i] for r in combo], mesh)
               for i, a in enumerate(args) if _is_tensor_arg(a)):
            return
    shapes = ", ".join(f"{n}={list(a.tensor_meta.shape)} {a.placements}"
                       for n, a in zip(names, args) if _is_tensor_arg(a))
    raise ShardingRuleError(
        f"gemmt.{op_name}: the DTensor inputs ({shapes}) match the rules "
        f"{', '.join(repr(r[0].name) for r in per_dim)}, but a sharded dim of an input has "
        f"fewer elements than shards, and DTensor does not run a rule that leaves a rank an "
        f"empty shard. Rules, per mesh dimension:\n  {listing}\n{advice}")


def _strategy_fn(op_name: str, schema: torch.FunctionSchema
                 ) -> Callable[..., list[tuple[list[Any], list[Any]]]]:
    names = [arg.name for arg in schema.arguments]
    defaults = {arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()}
    # gemm writes into c: DTensor must not redistribute any input (a redistributed c is a
    # copy, and the result would be lost), so only exact matches are accepted. DTensor
    # prefers a rule that needs no redistribution when one exists.
    exact = op_name == "gemm"

    def strategy(*args: Any, **kwargs: Any) -> list[tuple[list[Any], list[Any]]]:
        given = dict(zip(names, args), **kwargs)
        full = [given.get(n, defaults.get(n)) for n in names]
        rules = rules_for(op_name, *full)
        check_inputs(op_name, names, full, rules, exact=exact)
        # DTensor lists the input placements in the order the call gave the arguments.
        order = [names.index(n) for n in given]
        return [(list(r.outputs), [r.inputs[i] for i in order]) for r in rules]

    strategy.__name__ = f"gemmt_{op_name}_sharding"
    return strategy


def _register_all() -> None:
    from torch.distributed.tensor.experimental import register_sharding

    # linear's rules depend on its activation, a string. DTensor caches a decision by the
    # input placements and the call's other arguments, so a row-wise call without activation
    # does not decide for one with it (tests/distributed_scenarios.py checks this, since
    # register_sharding declares only int arguments as part of the key).
    propagator = _sharding_propagator()
    for op_name in _OPS:
        overload = getattr(torch.ops.gemmt, op_name).default
        register_sharding(overload)(_strategy_fn(op_name, overload._schema))
        # register_sharding asks DTensor to flatten every call's arguments with pytree, which
        # keeps the op off DTensor's native dispatch path; no gemmt op takes a list of
        # tensors, so the flat form holds. (Host time per call is what bounds a
        # tensor-parallel layer once its shards are small.)
        info = getattr(propagator, "op_to_schema_info", {}).get(overload)
        if info is not None and getattr(info, "needs_pytree", False):
            propagator.op_to_schema_info[overload] = dataclasses.replace(info, needs_pytree=False)


def _sharding_propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def _fp8_scale_split(shape: tuple[int, ...], rows: int) -> str:
    """How a scaled_mm scale of this shape splits with its operand's rows (M of a; N of b,
    with scale_b's shape reversed): "one" (a single value), "rows" (one per row: (M, 1)),
    "row blocks" (one per row and 128-slice of K: split with the rows, not along K), or
    "blocks" (one per 128 rows: a shard boundary need not fall on a block's, so not split)."""
    if len(shape) != 2:
        return "one"
    if shape[0] == rows:
        return "rows" if shape[1] == 1 else "row blocks"
    return "one" if shape == (1, 1) else "blocks"


def _fp8_rules(op_name: str, *args: Any) -> list[Rule]:
    """scaled_mm: replicated; a split by rows (with a per-row scale_a); b split by columns
    (with a per-column scale_b); K split into partial sums, for tensorwise and rowwise scales
    without activation. quantize_fp8: replicated, and for "row" and "block" granularity x
    split by rows (each group lies within a row). The amax of a tensorwise or 128x128 group,
    and of a column for the transposed output, spans the shards: replicated only."""
    Partial, Replicate, Shard = _placements()
    R, P = Replicate(), Partial()
    if op_name == "scaled_mm":
        a, b, scale_a, scale_b, bias, _, activation, _ = args
        m, n = a.tensor_meta.shape[0], b.tensor_meta.shape[1]
        sa = _fp8_scale_split(tuple(scale_a.tensor_meta.shape), m)
        # scale_b is (1, N), (KB, N) or (KB, NB): its columns go with b's.
        sb = _fp8_scale_split(tuple(scale_b.tensor_meta.shape)[::-1], n)
        has_bias = bias is not None

        def rule(name: str, out: Placement, pa: Placement, pb: Placement, psa: Placement,
                 psb: Placement, pbias: Placement) -> Rule:
            return Rule(name, (out,), (pa, pb, psa, psb, pbias if has_bias else None,
                                       None, None, None))

        rules = [rule("replicated", R, R, R, R, R, R)]
        if sa != "blocks":
            rules.append(rule("row-split a", Shard(0), Shard(0), R,
                              R if sa == "one" else Shard(0), R, R))
        if sb != "blocks":
            rules.append(rule("column-split b", Shard(1), R, Shard(1), R,
                              R if sb == "one" else Shard(1), Shard(0)))
        if activation == "none" and sa in ("one", "rows") and sb in ("one", "rows"):
            rules.append(rule("split K", P, Shard(1), Shard(0), R, R, P))
        return rules
    x, granularity, _ = args
    n_out = 2 if op_name == "quantize_fp8" else 4
    rules = [Rule("replicated", (R,) * n_out, (R, None, None))]
    if op_name == "quantize_fp8" and granularity in ("row", "block"):
        rules.append(Rule("row-split x", (Shard(0), Shard(0)), (Shard(0), None, None)))
    return rules


# DTensor in use already when the library loads: give it gemmt's rules once the ops exist.
_native.on_load(maybe_register)
