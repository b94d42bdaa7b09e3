"""Averaging gradients over the ranks, and agreeing on the "all finite" flag.

The gradients are grouped into buckets of about ``bucket_bytes`` (in variable order; a
gradient that size or larger is a bucket of its own) and the engine sums every bucket of a step
(``Collectives.allreduce_buckets``), each rank's gradients weighted by its share of the global
batch first (so a sum of finite values cannot overflow): one flat all-reduce per bucket by
default, all of them in one shared-memory exchange with the MPI engine when every rank is on
one node. Before the first bucket of every step, the ranks exchange a
small header (the bucket layout's signature, the loss scale, the step, ``mp.random``'s
counter): ranks that disagree get an error naming each rank's values instead of exchanging
buffers of different sizes (which some MPIs silently corrupt) or drifting apart. A new set of
variables also takes rank 0's values first, so every replica starts from the same weights.

The "all finite" flag is then MIN-all-reduced before the loss scale reads it: every rank skips
the same steps and keeps the same scale.

Under ``mixed_float8`` each trained FP8 layer's scaling state is reconciled first, in one
all-reduce (:func:`reduce_float8_state`): the amax histories MAX-reduced, so the amax every
rank keeps for this step is the largest over the global batch, and the scales MIN-reduced
(the scale of the largest amax; under current scaling recomputed from the global amax). Ranks
whose data differ would otherwise keep different scales, quantise with them under delayed
scaling, and drift apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mpcore import ops
from mpcore.core import random as _random
from mpcore.core.tensor import Tensor, Variable
from mpcore.distribution import api as _api
from mpcore.distribution import faults as _faults
from mpcore.mixed_precision import amp_hooks as _amp

HEADER = ("layout", "loss_scale", "iterations", "random_counter", "rewrite")
STATE_POINT = "the training state (layout, loss scale, step, random counter, graph rewrite)"
TRAINED_VARIABLES = "the variables to train"
FLOAT8_STATE = "the FP8 scaling state (scales and amax histories)"
_faults.known(STATE_POINT, _faults.tensors_point(TRAINED_VARIABLES),
              _faults.tensors_point(FLOAT8_STATE))


@dataclass(frozen=True)
class Layout:
    """Which gradients share a flat buffer, and a signature of their shapes and dtypes."""

    buckets: tuple[tuple[int, ...], ...]
    count: int
    values: int
    signature: float   # 52 bits of a hash: exact in a float64


def plan(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str], itemsizes: Sequence[int],
         bucket_bytes: int) -> Layout:
    """Buckets in order, a new one when the next gradient would overflow ``bucket_bytes`` or
    has another dtype (a flat buffer holds one dtype)."""
    buckets: list[list[int]] = []
    size = 0
    for i, (shape, itemsize) in enumerate(zip(shapes, itemsizes)):
        nbytes = math.prod(shape) * itemsize
        if (not buckets or size + nbytes > bucket_bytes
                or dtypes[buckets[-1][-1]] != dtypes[i]):
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return Layout(tuple(tuple(b) for b in buckets), len(shapes),
                  sum(math.prod(s) for s in shapes), _faults.signature(shapes, dtypes))


def average_gradients(grads: list[Tensor], variables: Sequence[Variable],
                      optimizer: Any) -> list[Tensor]:
    """The mean of ``grads`` over the ranks in each variable's :func:`wire_dtype` (float32
    for a 16-bit variable: the optimizer casts the mean to the variable's dtype), or
    ``grads`` as they are without a distribution."""
    dist = _api.distribution()
    if dist is None or not grads:
        return grads
    grads = [g if g.dtype == wire_dtype(v.dtype) else ops.cast(g, wire_dtype(v.dtype))
             for g, v in zip(grads, variables)]
    key = tuple(id(v) for v in variables)
    layout = dist._layouts.get(key)
    if layout is None:
        layout = _new_layout(dist, grads, variables)
    _check_header(dist, layout, optimizer)
    reduce_float8_state(dist, variables, key)
    fraction = dist.batch_fraction
    dist.batch_fraction = None
    weight = 1.0 / dist.world_size if fraction is None else fraction
    out: list[Tensor | None] = [None] * len(grads)
    # one pass over the gradients in all: the engine weights them as it packs them
    sums = dist.engine.allreduce_buckets([[grads[i] for i in b] for b in layout.buckets],
                                         weight, layout.signature)
    for bucket, totals in zip(layout.buckets, sums):
        for i, total in zip(bucket, totals):
            out[i] = total
    return out  # type: ignore[return-value]


def reduce_float8_state(dist: Any, variables: Sequence[Variable],
                        key: tuple[int, ...]) -> None:
    """The FP8 state of the layers trained here made the same on every rank: each amax
    history MAX-reduced (this step's entry becomes the global amax; the older entries are
    already equal), each scale MIN-reduced (as a MAX of its negation, exact, so the whole
    state travels in one all-reduce). A delayed-scaling step quantised with scales from the
    (agreed) history, so its scale was the same everywhere already; a current-scaling step
    quantised with its own amax's scale, and keeps the scale of the global amax (the
    previous one where that is zero or not finite, as the recipe says). Not a collective
    without FP8 layers."""
    from mpcore.mixed_precision.float8 import states_of

    states = states_of(variables)
    if not states:
        return
    operands = [op for state in states for op in state.operands]
    if key not in dist._float8_checked:   # once per variable set: ranks with other recipes
        _faults.check_same_tensors(        # would exchange buffers of other sizes
            dist.engine, FLOAT8_STATE, [t for op in operands for t in (op.scale,
                                                                        op.amax_history)])
        dist._float8_checked.add(key)
    flat = ops.concat([*(op.amax_history for op in operands),
                       *(ops.reshape(ops.negative(op.scale), (1,)) for op in operands)])
    total = dist.engine.allreduce(flat, "max")
    offset = 0
    histories = []
    for op in operands:
        n = op.amax_history.shape[0]
        histories.append(total[offset:offset + n])
        offset += n
    for i, (op, history) in enumerate(zip(operands, histories)):
        scale = ops.reshape(ops.negative(total[offset + i:offset + i + 1]), ())
        recipe = op.recipe
        if not recipe.delayed:
            scale = ops.fp8_scale(ops.reshape(history[0:1], ()), scale, op.format,
                                  recipe.margin, recipe.power_of_two_scales)
        op.amax_history.assign(history)
        op.scale.assign(scale)


def wire_dtype(dtype: str) -> str:
    """The dtype gradients of a ``dtype`` variable are averaged in: float32 for float16 and
    bfloat16 (pure 16-bit policies), as PyTorch DDP's fp32 communication and Keras' float32
    reductions do: MPI has no 16-bit sum, and a sum of many ranks' 16-bit shares would lose
    bits (bfloat16 keeps 8) or overflow (float16 ends at 65504); the others as they are."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def _new_layout(dist: Any, grads: list[Tensor], variables: Sequence[Variable]) -> Layout:
    layout = plan([g.shape for g in grads], [g.dtype for g in grads],
                  [_itemsize(g.dtype) for g in grads], dist.bucket_bytes)
    dist.broadcast_variables(variables, TRAINED_VARIABLES)  # checks them first
    dist._layouts[tuple(id(v) for v in variables)] = layout
    return layout


def _itemsize(dtype: str) -> int:
    return 8 if dtype in ("float64", "int64") else 2 if dtype in ("float16", "bfloat16") else 4


def _check_header(dist: Any, layout: Layout, optimizer: Any) -> None:
    scale = getattr(optimizer, "loss_scale", None)
    values = [layout.signature, float(scale()) if scale is not None else 0.0,
              float(optimizer.iterations), float(_random.get_state()["counter"]),
              _rewrite_state()]
    _faults.agree(dist.engine, STATE_POINT, HEADER, values)


def _rewrite_state() -> float:
    """0 without the mixed precision graph rewrite, else a digest of its dtype and lists: a
    rank that rewrites its steps while another does not would average 16-bit-computed
    gradients with float32 ones."""
    config = _amp.rewrite
    return 0.0 if config is None else _faults.digest(repr(config.key()))


def agree_finite(flag: Tensor) -> Tensor:
    """``flag`` ("all finite") ANDed over the ranks (a MIN all-reduce), or ``flag`` as it
    is without a distribution."""
    dist = _api.distribution()
    if dist is None:
        return flag
    ok = dist.engine.allreduce_values([1.0 if bool(flag) else 0.0], "min")[0]
    return ops.constant(ok > 0.5, dtype="bool", backend=flag.backend)
