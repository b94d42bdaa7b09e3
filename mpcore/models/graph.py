"""The order in which a functional model calls its layers: the nodes between its inputs and
outputs, each after the nodes it reads from."""

from __future__ import annotations

from collections.abc import Sequence

from mpcore.layers.base import InputLayer, KerasTensor, Node


def ordered_nodes(flat_in: Sequence[KerasTensor], flat_out: Sequence[KerasTensor]
                  ) -> list[Node]:
    """Every node the outputs depend on, in call order; an error for an input the model
    does not take."""
    input_ids = {id(kt) for kt in flat_in}
    order: list[Node] = []
    seen: set[int] = set()

    def visit(kt: KerasTensor) -> None:
        node = kt._node
        assert node is not None
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node.layer, InputLayer):
            if id(kt) not in input_ids:
                raise ValueError(f"the outputs depend on input {kt.name!r}, which is not "
                                 "among the model's inputs")
            return
        for parent in node.flat_inputs:
            visit(parent)
        order.append(node)

    for kt in flat_out:
        visit(kt)
    return order
