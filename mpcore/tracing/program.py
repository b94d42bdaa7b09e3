"""A recorded program (what :mod:`mpcore.function` traces) and how it runs.

A program is a list of steps over numbered slots: kernel calls (:class:`KernelCall`), calls kept
whole (:class:`WholeCall`: an optimizer update, a loss-scaling step, a seed drawn from
``mp.random``) and variable assignments (:class:`Assign`). Their arguments are trees of frozen
nodes (:mod:`mpcore.tracing.program_nodes`: :class:`Const`, :class:`Slot`, :class:`VariableRead`,
:class:`SeedSlot`, :class:`TensorOf`, :class:`ListOf`, :class:`TupleOf`, :class:`DictOf`, and
the call's arguments held weakly, :class:`WeakConst` and :class:`WeakVariableRead`:
:func:`weakened`), walked by that module's walker only.

:meth:`Program.compile` turns the steps into the source of one Python function, each slot a
local variable and each step one line (``s7 = k3(s2, s5, c1)``), so a replay costs one call per
kernel and nothing else. Each slot is dropped after its last reader, so a replay holds no more
memory than the eager step it stands for (and the CPU backend's buffer pool hands the same
buffers out again at the next replay). A backend may compile a program its own way
(``Backend.compile_program``); this is what runs where it does not.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

from mpcore.core.tensor import Tensor, Variable
from mpcore.tracing.program_nodes import (
    NONE,
    Assign,
    Composite,
    Const,
    DictOf,
    KernelCall,
    Leaf,
    ListOf,
    Node,
    Op,
    SeedSlot,
    Slot,
    Step,
    TensorOf,
    TupleOf,
    VariableRead,
    WeakConst,
    WeakVariableRead,
    WholeCall,
    bind,
    constant,
    dict_of,
    evaluate,
    fold,
    leaves,
    mapped,
    reads,
    step_reads,
    step_writes,
    unfold,
    walk,
)

__all__ = ["IN_PLACE", "NONE", "Assign", "Composite", "Const", "DictOf", "KernelCall", "Leaf",
           "ListOf", "Node", "Op", "Program", "ProgramWriter", "SeedSlot", "Slot", "Step",
           "TensorOf", "TupleOf", "VariableRead", "WeakConst", "WeakVariableRead", "WholeCall",
           "bind", "constant", "dict_of", "evaluate", "fold", "fold_constants", "leaves",
           "mapped", "plan_frees", "pure", "reads", "step_reads", "step_writes", "substitute",
           "substituted", "unfold", "walk", "weakened"]


@dataclass
class Program:
    """One trace: its steps, how many slots they use, where the inputs go and what comes out.
    ``print(program)`` lists the steps, one line each.

    The steps are frozen; what is computed about them from the whole program lives here:
    ``folded`` (which recorded steps :func:`fold_constants` ran once) and ``frees`` (the slots
    each step reads for the last time, :func:`plan_frees`). A step does not know its
    neighbours: a pass that drops or rewrites one step would leave another's frees stale, and
    one step node is shared by the recorded program and the programs passes make from it,
    whose frees differ."""

    steps: list[Step]
    slots: int
    inputs: list[int]
    output: Node
    lines: list[str] = field(default_factory=list)
    #: The indices of the recorded steps :func:`fold_constants` ran once (not replayed).
    folded: set[int] = field(default_factory=set)
    #: For each step, the slots read for the last time there (:func:`plan_frees`).
    frees: list[tuple[int, ...]] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(f"{line}  (folded: run once)" if n in self.folded else line
                         for n, line in enumerate(self.lines))

    def compile(self, adopt_copies: bool = False) -> Callable[[list[Any]], Any]:
        """The program as one Python function of its inputs' arrays; ``adopt_copies``: see
        :class:`ProgramWriter` (a backend whose ``copy`` kernel returns a new array at every
        call says so)."""
        return ProgramWriter(self, adopt_copies).function()


#: Kernels that write into their operands (the fused optimizer updates, the loss scale's
#: update): never folded.
IN_PLACE = frozenset({"sgd_update", "rmsprop_update", "adam_update", "loss_scale_update"})


def pure(step: Step) -> bool:
    """Whether ``step`` writes into no array: a kernel call other than an in-place update (a
    call kept whole or an assignment may write into variables)."""
    return type(step) is KernelCall and step.name not in IN_PLACE


def substitute(node: Node, replacements: dict[int, Node]) -> Node:
    """``node`` with ``replacements[i]`` wherever it reads slot i."""
    return mapped(node, lambda leaf: replacements.get(leaf.index, leaf)
                  if type(leaf) is Slot else leaf)


def weakened(program: Program, objects: Collection[int]) -> Program:
    """``program`` holding the objects whose ids are in ``objects`` (the traced call's
    arguments: an optimizer, its variables) through weak references: a traced function keeps
    no argument alive, and its programs for one go when it does (``Function`` drops them)."""
    def leaf(node: Leaf) -> Node:
        if type(node) is Const and id(node.value) in objects:
            return WeakConst(weakref.ref(node.value))
        if type(node) is VariableRead and id(node.variable) in objects:
            return WeakVariableRead(weakref.ref(node.variable))
        return node

    def weak(node: Node) -> Node:
        return mapped(node, leaf)

    steps = []
    for step in program.steps:
        step = step.with_operands(weak)
        if type(step) is Assign and id(step.variable) in objects:
            step = replace(step, variable=weakref.ref(step.variable))  # type: ignore[arg-type]
        steps.append(step)
    return Program(steps, program.slots, program.inputs, weak(program.output), program.lines,
                   program.folded)


def substituted(program: Program, steps: list[Step], replacements: dict[int, Node],
                folded: set[int]) -> Program:
    """``program`` with ``steps`` (of its own) and its output reading ``replacements[i]``
    wherever they read slot i."""
    def sub(node: Node) -> Node:
        return substitute(node, replacements)

    return Program([step.with_operands(sub) for step in steps], program.slots,
                   program.inputs, sub(program.output), program.lines, folded)


def fold_constants(program: Program) -> Program:
    """``program`` with every kernel call whose operands are all constants (``constant``, as
    the recorder marks it) run once, here, and its results read as constants by the steps
    after it (the seed gradient of the loss and the mean's ``1/n`` the backward pass builds
    from it, a bias gradient's row of ones): a replay then makes only the calls whose operands
    change. Kernels are pure functions of their operands, except the in-place updates
    (:data:`IN_PLACE`), which are never folded; a folded result is never written into (an
    assignment copies its value), so sharing it between replays is safe. Constants are Python
    values (shapes, fill values, dtypes) and the results of folded calls; the program's
    inputs, variables, fresh seeds and arrays captured from outside the step never are.
    ``folded`` on the result holds the indices of the steps folded. (The recorder marks a
    call ``constant`` as it records it, with :func:`mpcore.tracing.program_nodes.constant`.)"""
    known: dict[int, Any] = {}
    steps = []
    folded = set()
    for n, step in enumerate(program.steps):
        if type(step) is KernelCall and step.constant:
            step.run(known)
            folded.add(n)
            continue
        steps.append(step)
    if not known:
        return program
    return substituted(program, steps, {i: Const(value) for i, value in known.items()},
                       folded)


def plan_frees(program: Program) -> None:
    """Release each slot after its last reader (or right after the call that wrote it, where
    nothing reads it): ``program.frees``."""
    last: dict[int, int] = {}
    for n, step in enumerate(program.steps):
        for i in step_writes(step):
            last.setdefault(i, n)
        for i in step_reads(step):
            last[i] = n
    for i in reads(program.output):
        last.pop(i, None)
    frees: list[list[int]] = [[] for _ in program.steps]
    for i, n in last.items():
        frees[n].append(i)
    program.frees = [tuple(f) for f in frees]


def adoptable(program: Program) -> frozenset[int]:
    """The slots an assignment may take as they are (``ProgramWriter``'s ``adopt_copies``):
    each written by one step, a ``copy`` kernel call, and read by one, an assignment; neither
    an input nor an output of the program."""
    writers: dict[int, list[Step]] = {}
    readers: dict[int, list[Step]] = {}
    for step in program.steps:
        for i in step_writes(step):
            writers.setdefault(i, []).append(step)
        for i in step_reads(step):
            readers.setdefault(i, []).append(step)
    kept = set(program.inputs) | set(reads(program.output))
    return frozenset(
        i for i, written in writers.items()
        if i not in kept and len(written) == 1 and type(written[0]) is KernelCall
        and written[0].name == "copy" and type(written[0].outputs) is Slot
        and [type(r) for r in readers.get(i, [])] == [Assign])


class ProgramWriter:
    """Writes a program as Python source: slots are locals, everything else a named global.
    A backend's ``compile_program`` may subclass it to write some steps its own way (the
    OpenCL backend writes recorded kernel launches).

    ``adopt_copies``: an assignment of a value that the step's ``copy`` kernel made for it (as
    ``Variable.assign`` does while tracing) and that nothing else reads hands that array to the
    variable (``Variable.adopt``), instead of copying it a second time (:func:`adoptable`):
    only where the backend's ``copy`` returns a new array at every call (the CPU's; not a
    replay that writes into buffers it keeps, as OpenCL's recorded launches and CUDA graphs
    do)."""

    def __init__(self, program: Program, adopt_copies: bool = False) -> None:
        self.program = program
        #: the slots whose assignments adopt their array
        self.adopted = adoptable(program) if adopt_copies else frozenset()
        self.names: dict[str, Any] = {"_Tensor": Tensor}
        self.by_id: dict[int, str] = {}
        self.lines: list[str] = []

    def name(self, prefix: str, value: Any) -> str:
        found = self.by_id.get(id(value))
        if found is None:
            found = self.by_id[id(value)] = f"{prefix}{len(self.names)}"
            self.names[found] = value
        return found

    def expr(self, node: Node) -> str:
        name = self.name
        return fold(node, lambda leaf: leaf.source(name),
                    lambda composite, parts: composite.source(parts, name))

    def bind(self, node: Node, expr: str) -> None:
        for leaf, part in unfold(node, expr, lambda c, e: c.part_sources(e)):
            if type(leaf) is Slot:
                self.lines.append(f"    s{leaf.index} = {part}")

    #: The file name the compiled function reports in tracebacks.
    title = "<mpcore traced step>"

    def write_step(self, n: int, step: Step) -> None:
        """The lines of step ``n`` (a subclass may write some steps its own way)."""
        if type(step) is Assign:
            var = self.name("v", step.variable)
            if not isinstance(step.variable, Variable):   # weak: an argument of the call
                var += "()"
            if type(step.value) is Slot and step.value.index in self.adopted:
                self.lines.append(f"    {var}.adopt({self.expr(step.value)})")
                return
            self.lines.append(f"    {var}.assign(_Tensor({self.expr(step.value)}, "
                              f"{var}._backend, {var}._dtype))")
            return
        if type(step) is KernelCall:
            call = (f"{self.name('k', step.kernel)}("
                    f"{', '.join(self.expr(a) for a in step.inputs)})")
        else:
            fn = self.name("w", step.fn)
            call = (f"{fn}()" if not step.args.items and not step.kwargs.items
                    else f"{fn}(*{self.expr(step.args)}, **{self.expr(step.kwargs)})")
        if type(step.outputs) is Slot:
            self.bind(step.outputs, call)
        else:
            self.lines.append(f"    _out = {call}")
            self.bind(step.outputs, "_out")

    def function(self) -> Callable[[list[Any]], Any]:
        program = self.program
        plan_frees(program)
        for j, i in enumerate(program.inputs):
            self.lines.append(f"    s{i} = inputs[{j}]")
        for n, step in enumerate(program.steps):
            self.write_step(n, step)
            if program.frees[n]:
                self.lines.append("    " + " = ".join(f"s{i}" for i in program.frees[n])
                                  + " = None")
        self.lines.append(f"    return {self.expr(program.output)}")
        source = "def replay(inputs):\n" + "\n".join(self.lines) + "\n"
        namespace = dict(self.names)
        exec(compile(source, self.title, "exec"), namespace)
        replay = namespace["replay"]
        replay.source = source
        return replay
