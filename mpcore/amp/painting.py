"""TF's ``auto_mixed_precision`` pass on a recorded op graph: which op goes to 16 bits.

A port of the painting in TensorFlow's grappler optimizer
(``tensorflow/core/grappler/optimizers/auto_mixed_precision.cc``), on mpcore's op graph (what
the dispatch's ``finish`` sees: op name, the ops that produced its inputs, its output dtype).
Only float32 ops are processed (an op whose trace output is another dtype keeps it), and an op
may be marked ``preserve`` (as TF's fetch nodes): it stays float32. The passes, in TF's order:

1. allowlist ops go to 16 bits (``AddAllowlistOps``);
2. deny spreads forward from denylist ops through clear and infer ops, up to the last
   deny/infer op of the path (``PropagateDenyFwdThroughClearAndInfer``);
3. clear and infer ops that are both downstream and upstream of allow ops, and not deny, go to
   16 bits (``AddClearAndInferToAllowIfBetweenAllow``);
4. clear ops connected to 16-bit ops through clear ops go to 16 bits
   (``PropagateAllowThroughClear``).

Not ported: TF's data-structure passes (``ForceColorMatchBetweenTensorListOps``, the
recurrent-edge and existing-cast passes): mpcore's traces hold no tensor lists, loops or
graph-level casts of float32 models. Casts are not painted here: the dispatch inserts them at
the color boundaries when the painted graph is traced (:mod:`mpcore.amp.rewrite`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from mpcore.amp.lists import AutoMixedPrecisionLists
from mpcore.core.categories import Category

ALLOW, DENY, INFER, CLEAR = Category.ALLOW, Category.DENY, Category.INFER, Category.CLEAR


@dataclass(frozen=True)
class OpNode:
    """One op of a recorded graph: its name, the nodes its inputs came from (graph inputs,
    variables and constants are not nodes), and the dtype it produced in the float32 trace."""

    op: str
    inputs: tuple[int, ...] = ()
    dtype: str = "float32"
    name: str = ""
    preserve: bool = False


@dataclass(frozen=True)
class Painting:
    """Per node: whether it goes to 16 bits, and which rule decided."""

    low: tuple[bool, ...]
    reasons: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.low)


def _dfs(roots: Iterable[int], edges: Callable[[int], Iterable[int]],
         enter: Callable[[int], bool], visit: Callable[[int], None]) -> None:
    """TF's DfsTypeTraversal: pre-order, each node once, entering a node only where
    ``enter`` says so (roots included)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        i = stack.pop()
        if i in seen or not enter(i):
            continue
        seen.add(i)
        visit(i)
        stack.extend(j for j in edges(i) if j not in seen)


def paint(nodes: Sequence[OpNode], lists: AutoMixedPrecisionLists,
          overrides: dict[str, Category] | None = None) -> Painting:
    """Colour ``nodes`` (a DAG, inputs listed by index) by TF's passes (module docstring)."""
    n = len(nodes)
    cat = [lists.category(node.op, overrides) for node in nodes]
    outputs: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        for j in node.inputs:
            outputs[j].append(i)

    def ins(i: int) -> Iterable[int]:
        return nodes[i].inputs

    def outs(i: int) -> Iterable[int]:
        return outputs[i]

    def both(i: int) -> Iterable[int]:
        return (*nodes[i].inputs, *outputs[i])

    process = [not node.preserve and node.dtype == "float32" for node in nodes]
    reason: dict[int, str] = {}

    # 1. AddAllowlistOps
    allow = {i for i in range(n) if process[i] and cat[i] is ALLOW}
    for i in allow:
        reason[i] = f"allowlist: {nodes[i].op} is on the allowlist"

    # 2. PropagateDenyFwdThroughClearAndInfer
    deny: set[int] = set()
    upstream: set[int] = set()
    for root in range(n):
        if cat[root] in (DENY, INFER):
            _dfs([root], ins, lambda i, r=root: i == r or (i not in upstream
                                                          and cat[i] is CLEAR),
                 upstream.add)
    for root in range(n):
        if root in deny or cat[root] is not DENY:
            continue

        def mark(i: int, r: int = root) -> None:
            if i not in deny:
                deny.add(i)
                reason[i] = (f"denylist: {nodes[i].op} is on the denylist" if i == r else
                             f"deny propagated forward from {label(nodes, r)}")

        _dfs([root], outs, lambda i, r=root: i == r or (i not in deny and i in upstream), mark)

    # 3. AddClearAndInferToAllowIfBetweenAllow
    downstream: set[int] = set()
    for root in range(n):
        if process[root] and cat[root] is ALLOW:
            _dfs([root], outs, lambda i, r=root: i == r or (
                i not in downstream and cat[i] is not ALLOW and i not in deny and process[i]
                and cat[i] in (CLEAR, INFER)), downstream.add)
    up_of_allow: set[int] = set()
    for root in range(n):
        if not process[root] or root in up_of_allow or cat[root] is not ALLOW:
            continue

        def between(i: int) -> None:
            up_of_allow.add(i)
            if i not in allow:
                allow.add(i)
                reason[i] = "between allow ops: downstream and upstream of allowlist ops"

        _dfs([root], ins, lambda i, r=root: i == r or (i not in up_of_allow
                                                      and i in downstream), between)

    # 4. PropagateAllowThroughClear
    cleared: set[int] = set()
    for root in range(n):
        if not process[root] or root in cleared or root not in allow:
            continue

        def through(i: int, r: int = root) -> None:
            cleared.add(i)
            if i not in allow:
                allow.add(i)
                reason[i] = f"clear op connected to 16-bit {label(nodes, r)}"

        _dfs([root], both, lambda i, r=root: i == r or (
            i not in allow and i not in deny and process[i] and cat[i] is CLEAR), through)

    reasons = []
    for i, node in enumerate(nodes):
        if i in reason:
            reasons.append(reason[i])
        elif not process[i]:
            reasons.append("preserved" if node.preserve else f"{node.dtype} in the trace: kept")
        elif cat[i] is None:
            reasons.append(f"{node.op} is on no list: not painted 16-bit")
        elif cat[i] is INFER:
            reasons.append("infer op not between allow ops: float32")
        else:
            reasons.append("clear op not connected to 16-bit ops: float32")
    return Painting(tuple(i in allow for i in range(n)), tuple(reasons))


def label(nodes: Sequence[OpNode], i: int) -> str:
    """How a node is named in a reason: its name, else op#index."""
    return nodes[i].name or f"{nodes[i].op}#{i}"
