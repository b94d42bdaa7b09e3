"""The backward walk: from the recorded nodes of a tape to the gradients of its sources.

It walks the tape backwards, calls each op's registered gradient (:data:`GRADIENTS`, filled by
the family modules), casts each gradient to its input's dtype (a float32 variable read in
float16 gets a float32 gradient through the cast's gradient) and sums the gradients of inputs
used more than once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from mpcore.core.tape import Node
from mpcore.core.tensor import Tensor
from mpcore.ops.creation import constant, ones_like
from mpcore.ops.dispatch import GRADIENTS, cast
from mpcore.ops.elementwise import add


def backprop(nodes: list[Node], targets: list[Tensor], seeds: list[Tensor | None],
             sources: list[Tensor]) -> list[Tensor | None]:
    source_ids = {id(s) for s in sources}
    # Only nodes downstream of a source matter; only their inputs need gradients.
    relevant = set(source_ids)
    for node in nodes:
        for i in node.input_ids:
            if i in relevant:
                relevant.add(id(node.output))
                break
    grads: dict[int, Tensor] = {}
    for target, seed in zip(targets, seeds):
        if not isinstance(target, Tensor):
            raise TypeError(f"gradient target must be a tensor, got {target!r}")
        g = ones_like(target) if seed is None else constant(seed, dtype=target.dtype,
                                                            backend=target.backend)
        _accumulate(grads, id(target), g)
    for node in reversed(nodes):
        out_id = id(node.output)
        if out_id not in relevant:
            continue
        g = grads.get(out_id) if out_id in source_ids else grads.pop(out_id, None)
        if g is None:
            continue
        if node_scope is None:
            _backward(node, g, relevant, grads)
        else:
            with node_scope(node):
                _backward(node, g, relevant, grads)
    return [grads.get(id(s)) for s in sources]


#: Set by ``mp.debugging.inspect_numerics``: a context each node's backward ops run in, so the
#: inspector knows which forward op (and layer) a gradient op belongs to.
node_scope: Callable[[Node], AbstractContextManager[None]] | None = None


def _backward(node: Node, g: Tensor, relevant: set[int], grads: dict[int, Tensor]) -> None:
    fn = GRADIENTS.get(node.op)
    if fn is None:
        raise NotImplementedError(f"no gradient is defined for op {node.op!r}")
    needs = tuple(i is not None and i in relevant for i in node.input_ids)
    for iid, need, x, gx in zip(node.input_ids, needs, node.inputs, fn(node, g, needs)):
        if not need or gx is None:
            continue
        if gx._dtype != x._dtype:
            gx = cast(gx, x._dtype)
        _accumulate(grads, iid, gx)  # type: ignore[arg-type]


def _accumulate(grads: dict[int, Tensor], key: int, g: Tensor) -> None:
    prev = grads.get(key)
    grads[key] = g if prev is None else add(prev, g)
