"""A recorded program (what :mod:`mpcore.function` traces) and how it runs.

A program is a list of steps over numbered slots: kernel calls (:class:`KernelCall`), calls kept
whole (:class:`WholeCall`: an optimizer update, a loss-scaling step, a seed drawn from
``mp.random``) and variable assignments (:class:`Assign`). An argument is described by a spec:
``("c", value)`` a constant, ``("s", i)`` slot i, ``("v", variable)`` the variable's array at that
moment, ``("r", i)`` the seed in slot i (drawn by a step of each replay, where the trace drew
it), ``("T", spec, backend, dtype)`` a tensor around an array, and ``("l"/"t"/"d", ...)``
lists, tuples and dicts of specs. ``("w", ref)`` and ``("vw", ref)`` are a constant and a
variable that were arguments of the traced call, held weakly (:func:`weakened`).

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
from dataclasses import dataclass, field
from typing import Any

from mpcore.core.tensor import Tensor, Variable

Spec = tuple[Any, ...]


@dataclass
class KernelCall:
    kernel: Callable[..., Any]
    args: list[Spec]
    out: Spec                       # where the result goes: ("s", i), or a list/tuple of them
    text: str                       # one line of ``Function.graph``
    free: tuple[int, ...] = ()      # slots read for the last time here
    name: str = ""                  # the kernel's name in ``Backend.kernels()``
    dtype: str = ""                 # the dtype of its (first) result


@dataclass
class WholeCall:
    fn: Callable[..., Any]
    args: Spec                      # ("t", [positional args tuple, keyword args dict])
    out: Spec
    text: str
    free: tuple[int, ...] = ()


@dataclass
class Assign:
    variable: Variable | weakref.ref[Variable]   # weak where it is an argument of the call
    value: Spec
    text: str
    free: tuple[int, ...] = ()

    def target(self) -> Variable:
        """The variable assigned (a replay runs only while the call's arguments live)."""
        variable = self.variable
        return variable if isinstance(variable, Variable) else variable()  # type: ignore[return-value]


@dataclass
class Program:
    """One trace: its steps, how many slots they use, where the inputs go and what comes out.
    ``print(program)`` lists the steps, one line each."""

    steps: list[Any]
    slots: int
    inputs: list[int]
    output: Spec
    lines: list[str] = field(default_factory=list)
    #: The indices of the recorded steps :func:`fold_constants` ran once (not replayed).
    folded: set[int] = field(default_factory=set)

    def __str__(self) -> str:
        return "\n".join(f"{line}  (folded: run once)" if n in self.folded else line
                         for n, line in enumerate(self.lines))

    def compile(self) -> Callable[[list[Any]], Any]:
        """The program as one Python function of its inputs' arrays."""
        plan_frees(self)
        return ProgramWriter(self).function()


def leaves(spec: Spec) -> list[Spec]:
    """The specs inside ``spec`` that hold no other (slots, constants, variables, seeds), in
    order, through tensors, lists, tuples and dicts."""
    kind = spec[0]
    if kind == "T":
        return leaves(spec[1])
    if kind == "d":
        return [leaf for s in spec[1].values() for leaf in leaves(s)]
    if kind in ("l", "t"):
        return [leaf for s in spec[1] for leaf in leaves(s)]
    return [spec]


def reads(spec: Spec) -> list[int]:
    """The slots ``spec`` reads."""
    return [leaf[1] for leaf in leaves(spec) if leaf[0] in ("s", "r")]


def step_reads(step: Any) -> list[int]:
    """The slots a step reads (its arguments, or an assignment's value)."""
    if type(step) is KernelCall:
        return [i for a in step.args for i in reads(a)]
    return reads(step.args if type(step) is WholeCall else step.value)


#: Kernels that write into their operands (the fused optimizer updates): never folded.
IN_PLACE = frozenset({"sgd_update", "rmsprop_update", "adam_update"})


def pure(step: Any) -> bool:
    """Whether ``step`` writes into no array: a kernel call other than an in-place update (a
    call kept whole or an assignment may write into variables)."""
    return type(step) is KernelCall and step.name not in IN_PLACE


def _constant(spec: Spec, known: dict[int, Any]) -> bool:
    kind = spec[0]
    if kind == "c":
        # Python values only: an array captured from outside the step may be the caller's
        # (the CPU's constant() does not copy a NumPy array), changed between calls; a replay
        # reads it as it is then, and so must every call that depends on it
        value = spec[1]
        return value is None or isinstance(value, (bool, int, float, str, bytes))
    if kind == "s":
        return spec[1] in known
    if kind in ("l", "t"):
        return all(_constant(s, known) for s in spec[1])
    return False                            # a variable, a fresh seed, a tensor


def evaluate(spec: Spec, env: dict[int, Any]) -> Any:
    """The value ``spec`` stands for, the slots' arrays in ``env`` (what a line written by
    :class:`ProgramWriter` computes; for backends that run a program step by step)."""
    kind = spec[0]
    if kind == "s":
        return env[spec[1]]
    if kind == "c":
        return spec[1]
    if kind == "v":
        return spec[1]._data
    if kind == "w":
        return spec[1]()
    if kind == "vw":
        return spec[1]()._data
    if kind == "r":
        return env[spec[1]]
    if kind == "T":
        return Tensor(evaluate(spec[1], env), spec[2], spec[3])
    if kind == "d":
        return {k: evaluate(v, env) for k, v in spec[1].items()}
    items = [evaluate(s, env) for s in spec[1]]
    return items if kind == "l" else tuple(items)


def bind(spec: Spec, value: Any, env: dict[int, Any]) -> None:
    """Put what a call returned into the slots of ``spec`` (arrays, tensors, lists of them)."""
    kind = spec[0]
    if kind == "s":
        env[spec[1]] = value
    elif kind == "T":
        bind(spec[1], value._data, env)
    elif kind in ("l", "t"):
        for item, v in zip(spec[1], value):
            bind(item, v, env)


def mapped(spec: Spec, leaf: Callable[[Spec], Spec]) -> Spec:
    """``spec`` with ``leaf`` applied to each spec inside it that holds no other (through
    tensors, lists, tuples and dicts, as :func:`leaves` walks them)."""
    kind = spec[0]
    if kind == "T":
        return ("T", mapped(spec[1], leaf), *spec[2:])
    if kind == "d":
        return ("d", {k: mapped(v, leaf) for k, v in spec[1].items()})
    if kind in ("l", "t"):
        return (kind, [mapped(s, leaf) for s in spec[1]])
    return leaf(spec)


def with_reads(step: Any, fn: Callable[[Spec], Spec], variable: Any = None) -> Any:
    """A copy of ``step`` that reads ``fn(spec)`` wherever it read ``spec`` (an assignment's
    variable replaced by ``variable`` where given)."""
    if type(step) is KernelCall:
        return KernelCall(step.kernel, [fn(a) for a in step.args], step.out, step.text,
                          name=step.name, dtype=step.dtype)
    if type(step) is WholeCall:
        return WholeCall(step.fn, fn(step.args), step.out, step.text)
    return Assign(step.variable if variable is None else variable, fn(step.value), step.text)


def substitute(spec: Spec, replacements: dict[int, Spec]) -> Spec:
    """``spec`` with ``replacements[i]`` wherever it reads slot i."""
    return mapped(spec, lambda s: replacements.get(s[1], s) if s[0] == "s" else s)


def substitute_reads(step: Any, replacements: dict[int, Spec]) -> Any:
    """A copy of ``step`` that reads ``replacements[i]`` wherever it read slot i."""
    return with_reads(step, lambda spec: substitute(spec, replacements))


def weakened(program: Program, objects: Collection[int]) -> Program:
    """``program`` holding the objects whose ids are in ``objects`` (the traced call's
    arguments: an optimizer, its variables) through weak references: a traced function keeps
    no argument alive, and its programs for one go when it does (``Function`` drops them)."""
    def leaf(spec: Spec) -> Spec:
        if spec[0] in ("c", "v") and id(spec[1]) in objects:
            return ("w" if spec[0] == "c" else "vw", weakref.ref(spec[1]))
        return spec

    def weak(spec: Spec) -> Spec:
        return mapped(spec, leaf)

    steps = [with_reads(step, weak, weakref.ref(step.variable)
                        if type(step) is Assign and id(step.variable) in objects else None)
             for step in program.steps]
    return Program(steps, program.slots, program.inputs, weak(program.output), program.lines,
                   program.folded)


def substituted(program: Program, steps: list[Any], replacements: dict[int, Spec],
                folded: set[int]) -> Program:
    """``program`` with ``steps`` (of its own) and its output reading ``replacements[i]``
    wherever they read slot i."""
    return Program([substitute_reads(step, replacements) for step in steps], program.slots,
                   program.inputs, substitute(program.output, replacements), program.lines,
                   folded)


def fold_constants(program: Program) -> Program:
    """``program`` with every kernel call whose operands are all constants run once, here, and
    its results read as constants by the steps after it (the seed gradient of the loss and the
    mean's ``1/n`` the backward pass builds from it, a bias gradient's row of ones): a replay
    then makes only the calls whose operands change. Kernels are pure functions of their
    operands, except the in-place updates (:data:`IN_PLACE`), which are never folded; a folded
    result is never written into (an assignment copies its value), so sharing it between
    replays is safe. Constants are Python values (shapes, fill values, dtypes) and the results
    of folded calls; the program's inputs, variables, fresh seeds and arrays captured from
    outside the step never are. ``folded`` on the result holds the indices of the steps folded."""
    known: dict[int, Any] = {}
    steps = []
    folded = set()
    for n, step in enumerate(program.steps):
        if pure(step) and all(_constant(a, known) for a in step.args):
            bind(step.out, step.kernel(*[evaluate(a, known) for a in step.args]), known)
            folded.add(n)
            continue
        steps.append(step)
    if not known:
        return program
    return substituted(program, steps, {i: ("c", value) for i, value in known.items()},
                       folded)


def plan_frees(program: Program) -> None:
    """Release each slot after its last reader (or right after the call that wrote it, where
    nothing reads it)."""
    last: dict[int, int] = {}
    for n, step in enumerate(program.steps):
        if type(step) is not Assign:
            for i in reads(step.out):
                last.setdefault(i, n)
        for i in step_reads(step):
            last[i] = n
    for i in reads(program.output):
        last.pop(i, None)
    frees: dict[int, list[int]] = {}
    for i, n in last.items():
        frees.setdefault(n, []).append(i)
    for n, step in enumerate(program.steps):
        step.free = tuple(frees.get(n, ()))


class ProgramWriter:
    """Writes a program as Python source: slots are locals, everything else a named global.
    A backend's ``compile_program`` may subclass it to write some steps its own way (the
    OpenCL backend writes recorded kernel launches)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.names: dict[str, Any] = {"_Tensor": Tensor}
        self.by_id: dict[int, str] = {}
        self.lines: list[str] = []

    def name(self, prefix: str, value: Any) -> str:
        found = self.by_id.get(id(value))
        if found is None:
            found = self.by_id[id(value)] = f"{prefix}{len(self.names)}"
            self.names[found] = value
        return found

    def expr(self, spec: Spec) -> str:
        kind = spec[0]
        if kind == "s":
            return f"s{spec[1]}"
        if kind == "c":
            value = spec[1]
            if value is None or isinstance(value, bool) or type(value) in (int, str):
                return repr(value)
            return self.name("c", value)
        if kind == "v":
            return f"{self.name('v', spec[1])}._data"
        if kind in ("w", "vw"):
            return f"{self.name('w', spec[1])}()" + ("._data" if kind == "vw" else "")
        if kind == "r":
            return f"s{spec[1]}"
        if kind == "T":
            return f"_Tensor({self.expr(spec[1])}, {self.name('b', spec[2])}, {spec[3]!r})"
        if kind == "d":
            return "{" + ", ".join(f"{k!r}: {self.expr(v)}" for k, v in spec[1].items()) + "}"
        items = ", ".join(self.expr(s) for s in spec[1])
        return f"[{items}]" if kind == "l" else f"({items}{',' if spec[1] else ''})"

    def bind(self, spec: Spec, expr: str) -> None:
        kind = spec[0]
        if kind == "s":
            self.lines.append(f"    s{spec[1]} = {expr}")
        elif kind == "T":
            self.bind(spec[1], f"{expr}._data")
        elif kind in ("l", "t"):
            for j, item in enumerate(spec[1]):
                self.bind(item, f"{expr}[{j}]")

    #: The file name the compiled function reports in tracebacks.
    title = "<mpcore traced step>"

    def write_step(self, n: int, step: Any) -> None:
        """The lines of step ``n`` (a subclass may write some steps its own way)."""
        kind = type(step)
        if kind is Assign:
            var = self.name("v", step.variable)
            if not isinstance(step.variable, Variable):   # weak: an argument of the call
                var += "()"
            self.lines.append(f"    {var}.assign(_Tensor({self.expr(step.value)}, "
                              f"{var}._backend, {var}._dtype))")
            return
        if kind is KernelCall:
            call = (f"{self.name('k', step.kernel)}("
                    f"{', '.join(self.expr(a) for a in step.args)})")
        else:
            args, kwargs = step.args[1]
            fn = self.name("w", step.fn)
            call = (f"{fn}()" if args == ("t", []) and kwargs == ("d", {})
                    else f"{fn}(*{self.expr(args)}, **{self.expr(kwargs)})")
        if step.out[0] == "s":
            self.bind(step.out, call)
        else:
            self.lines.append(f"    _out = {call}")
            self.bind(step.out, "_out")

    def function(self) -> Callable[[list[Any]], Any]:
        program = self.program
        for j, i in enumerate(program.inputs):
            self.lines.append(f"    s{i} = inputs[{j}]")
        for n, step in enumerate(program.steps):
            self.write_step(n, step)
            if step.free:
                self.lines.append("    " + " = ".join(f"s{i}" for i in step.free) + " = None")
        self.lines.append(f"    return {self.expr(program.output)}")
        source = "def replay(inputs):\n" + "\n".join(self.lines) + "\n"
        namespace = dict(self.names)
        exec(compile(source, self.title, "exec"), namespace)
        replay = namespace["replay"]
        replay.source = source
        return replay
