"""The CPU backend's ``compile_program``: the recorded program, rewritten where the rewrite
gives the same bits with fewer calls, then written as one Python function as the generic replay
is (:meth:`mpcore.tracing.program.Program.compile`).

Both rewrites stand for particular kernels (the CPU backend's own softmax and cross-entropy,
its own SGD and RMSprop bodies), so they apply only where the kernel table holds those: a
plugin's kernel, or a subclass's override, may compute something else. A provider that wraps
an update and hands arrays of fewer than ``calls_original_below`` elements to the kernel it
wraps (``original``), as oneDNN's do, leaves the small ones to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore.tracing.program import Program

from .grouped_updates import FORMS, GATHER_MAX_ELEMENTS, group_updates
from .softmax_reuse import PAIR, reuse_softmax


def runs_cpu_kernel(backend: Any, name: str, elements: int = 0) -> bool:
    """Whether ``backend``'s kernel ``name`` is the CPU backend's own for arrays of at most
    ``elements`` elements (0: of any size, no wrapper in between)."""
    from .backend import CpuBackend  # (the backend module imports this one)

    own = getattr(CpuBackend, name, None)
    kernel = backend.kernels().get(name)
    while kernel is not None:
        if getattr(kernel, "__func__", None) is own and getattr(kernel, "__self__", None) \
                is backend:
            return True
        if not elements or getattr(kernel, "calls_original_below", 0) <= elements:
            return False
        kernel = getattr(kernel, "original", None)
    return False


def compile_program(backend: Any, program: Program) -> Callable[[list[Any]], Any] | None:
    """``program`` with the softmax its cross-entropy computes too read from there
    (:mod:`.softmax_reuse`) and its small updates grouped (:mod:`.grouped_updates`), written
    as the generic replay is, with the variables adopting their copies (ProgramWriter's
    ``adopt_copies``)."""
    rewritten = program
    if all(runs_cpu_kernel(backend, name) for name in PAIR):
        rewritten = reuse_softmax(rewritten) or rewritten
    groupable = {name for name in FORMS
                 if runs_cpu_kernel(backend, name, GATHER_MAX_ELEMENTS)}
    if groupable:
        rewritten = group_updates(rewritten, groupable) or rewritten
    # (the CPU's copy kernel returns a new array at every call: assignments adopt them)
    return rewritten.compile(adopt_copies=True)
