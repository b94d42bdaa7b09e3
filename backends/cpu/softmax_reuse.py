"""The CPU backend's traced steps: a softmax that the cross-entropy beside it computes too.

A classifier's step takes ``softmax(logits)`` for its predictions and ``sparse_softmax_cross_
entropy(logits, labels)`` for its loss; the second returns the probabilities along with the loss
(its gradient needs them), computed by the same operations in the same order as the first (the
array-library kernels in ``mpcore_xp``; ``tests/backends/cpu`` holds them to the same bits). In
a traced program :func:`reuse_softmax` drops the softmax call and has its readers read the
cross-entropy's probabilities: one call and one pass over the logits fewer, the same bits. It
does so only where both calls are this backend's own kernels (``compile.py`` checks: a plugin
that replaces either may compute them differently), nothing reads the softmax before the
cross-entropy runs, and nothing between the two may write into an array (an optimizer's
in-place update, a call kept whole, an assignment: the logits may be a view of a variable).
Kernels never write into their operands (:func:`mpcore.tracing.program.fold_constants` relies on the
same), so the softmax's readers and the cross-entropy's gradient can share the array; one
softmax per cross-entropy, so that two predictions are never one array.
"""

from __future__ import annotations

from typing import Any

from mpcore.tracing.program import (
    Const,
    KernelCall,
    ListOf,
    Program,
    Slot,
    TupleOf,
    pure,
    step_reads,
    substituted,
)

#: The kernels whose results agree (``softmax(x, axis)`` for the last axis of a matrix).
PAIR = ("softmax", "sparse_softmax_cross_entropy")
#: The axes that are a matrix's last.
LAST_AXIS = (Const(1), Const(-1))


def _softmax_of(step: Any) -> int | None:
    """The slot whose softmax over its last axis ``step`` computes (sparse_softmax_cross_
    entropy's logits are a matrix: axis 1 and -1 are its last), or None."""
    if (type(step) is KernelCall and step.name == PAIR[0] and len(step.inputs) == 2
            and type(step.inputs[0]) is Slot and step.inputs[1] in LAST_AXIS
            and type(step.outputs) is Slot):
        return step.inputs[0].index
    return None


def _probabilities(step: Any, logits: int) -> int | None:
    """The slot of the probabilities ``step`` returns if it is the cross-entropy of
    ``logits``, or None."""
    if (type(step) is KernelCall and step.name == PAIR[1] and step.inputs
            and step.inputs[0] == Slot(logits) and type(step.outputs) in (ListOf, TupleOf)
            and len(step.outputs.items) == 2 and type(step.outputs.items[1]) is Slot):
        return step.outputs.items[1].index
    return None


def reuse_softmax(program: Program) -> Program | None:
    """``program`` without the softmax calls the cross-entropy after them computes too (module
    docstring), or None where there is none. The caller checks that both are the backend's
    own kernels."""
    steps = program.steps
    replacements: dict[int, Slot] = {}
    taken: set[int] = set()                # probabilities already standing for a softmax
    for n, step in enumerate(steps):
        logits = _softmax_of(step)
        if logits is None:
            continue
        out = step.outputs.index
        for later in steps[n + 1:]:
            probs = _probabilities(later, logits)
            if probs is not None:
                if probs not in taken:
                    taken.add(probs)
                    replacements[out] = Slot(probs)
                break
            if out in step_reads(later) or not pure(later):
                break         # read before the cross-entropy has made it, or arrays written
    if not replacements:
        return None
    kept = [step for step in steps
            if _softmax_of(step) is None or step.outputs.index not in replacements]
    return substituted(program, kept, replacements, program.folded)
