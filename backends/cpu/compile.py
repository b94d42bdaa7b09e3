"""The CPU backend's ``compile_program``: the recorded program, rewritten where the rewrite
gives the same bits with fewer calls, then written as one Python function as the generic replay
is (:meth:`mpcore.program.Program.compile`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore.program import Program

from .grouped_updates import group_updates
from .softmax_reuse import own_kernels, reuse_softmax


def compile_program(backend: Any, program: Program) -> Callable[[list[Any]], Any] | None:
    """``program`` with the softmax its cross-entropy computes too read from there
    (:mod:`.softmax_reuse`) and its small updates grouped (:mod:`.grouped_updates`), or None
    (the generic replay) where neither applies."""
    rewritten = program
    if own_kernels(backend):
        rewritten = reuse_softmax(rewritten) or rewritten
    rewritten = group_updates(rewritten) or rewritten
    return None if rewritten is program else rewritten.compile()
