"""Which steps of a traced program a CUDA graph may hold, and how the program splits into
captured segments (pure functions of a :class:`mpcore.tracing.program.Program`: no CuPy here, so the
CPU suite tests them on programs traced on the cpu backend).

A graph replays the device work recorded while it was captured, with the arguments it had
then: a pointer, a scalar, a seed are frozen in it. So a step may be captured only where the
default replay would call it with the same values at every step, and where it does no host
work (which a capture cannot record). Everything else is a *host step*, run at each replay as
:meth:`Program.compile` runs it, between the captured segments:

- a call kept whole (an optimizer update, the loss-scaling steps): Python state that changes
  from step to step, and the loss-scale update's host read of the all-finite flag; a seed's
  draw from ``mp.random`` is one too;
- a variable assignment: it replaces the variable's array and drops its cached casts;
- a kernel call that takes a drawn seed (a ``SeedSlot``, drawn by a host step of each replay):
  dropout must draw new numbers at each replay, and a graph would freeze the seed of its
  capture;
- a kernel call that reads a variable the program assigns: the assignment gives the variable
  a new array at each replay, and a graph would read the array of its capture;
- a kernel call with a host array among its constants (``mp.constant(numpy_array)`` in the
  step): it uploads the array at each replay, which a graph would turn into a copy from a
  staging buffer that CuPy recycles;
- a kernel the backend names as uncapturable (``uncapturable``: the GEMMs, since CuPy refuses
  cuBLAS calls while a stream captures);
- a kernel from outside the backend's own modules (a plugin's ``KernelSet``): nothing tells
  whether it keeps Python state or uploads host data, so it is not trusted in a graph (the
  CUDA backend's own kernels and ``mpcore_xp``'s were read for this: no Python state, no
  device array cached by a kernel for later calls; ``_true_flag`` is made by optimizer
  updates, which are host steps);
- an argument of a kind a graph cannot hold (anything but slots, variables, constants, tensors
  and lists or tuples of them);
- whatever the runner finds out while capturing (``refused``: a kernel that synchronizes, reads
  the device, uploads from the host, or calls a library CuPy will not capture).

A run of capturable steps shorter than ``min_kernels`` kernel calls stays on the host too (a
graph launch costs about what one kernel launch does).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpcore.core.trace_seeds import replay_draw
from mpcore.tracing.program import (
    Assign,
    Const,
    KernelCall,
    ListOf,
    Node,
    Program,
    SeedSlot,
    Slot,
    TensorOf,
    TupleOf,
    VariableRead,
    WholeCall,
    leaves,
    reads,
    step_reads,
    step_writes,
    walk,
)

#: Argument node types a captured kernel call may take (see ``mpcore.tracing.program_nodes``).
CAPTURABLE_SPECS = frozenset({Slot, VariableRead, Const, ListOf, TupleOf, TensorOf})

WHOLE = ("kept whole: it runs Python at each replay (optimizer state, the loss-scale update "
         "and its host read of the all-finite flag)")
ASSIGN = "a variable assignment: it replaces the variable's array and drops its cached casts"
SEED = "it takes a seed drawn at each replay (a graph would freeze the seed)"
DRAW = "it draws a seed from mp.random at each replay (host work)"
SHORT = "a run of capturable kernels too short to gain from a graph"
UPLOAD = ("it uploads a host array at each replay (a graph would copy from a staging buffer "
          "that CuPy recycles)")


def host_array(value: Any) -> bool:
    """Whether ``value`` is a host (NumPy-like) array of one dimension or more: it has the CPU
    array interface and not CUDA's. (A 0-d one is uploaded as a kernel's scalar argument.)"""
    return (hasattr(value, "__array_interface__")
            and not hasattr(value, "__cuda_array_interface__")
            and getattr(value, "ndim", 0) > 0)


def constants(node: Node) -> list[Any]:
    """The values of the :class:`Const` leaves of ``node``."""
    return [leaf.value for leaf in leaves(node) if type(leaf) is Const]


@dataclass(frozen=True, eq=False)
class Segment:
    """Steps ``start`` to ``stop - 1``, captured as one graph. ``inputs``: the slots they read
    that are made before ``start`` (copied into the runner's fixed buffers before each launch,
    unless another segment's graph made them); ``outputs``: the slots they make that a later
    step or the program's output reads (the runner holds their arrays: the graph writes them
    at each launch); ``variables``: the variables they read (their arrays must not change)."""

    start: int
    stop: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    variables: tuple[Any, ...]

    @property
    def key(self) -> tuple[int, int]:
        return self.start, self.stop


@dataclass
class Plan:
    """How a program runs: ``pieces`` in order, a :class:`Segment` or the index of a host
    step; ``host``: why each host step is one; ``reason``: why nothing is captured (None when
    something is)."""

    pieces: list[Segment | int]
    host: dict[int, str] = field(default_factory=dict)
    reason: str | None = None

    @property
    def segments(self) -> list[Segment]:
        return [p for p in self.pieces if isinstance(p, Segment)]

    def within(self, start: int, stop: int) -> list[Segment | int]:
        """The pieces that begin in steps ``start`` to ``stop - 1`` (after a capture refused a
        step of a segment, the new plan's pieces for that segment's steps)."""
        return [p for p in self.pieces
                if start <= (p.start if isinstance(p, Segment) else p) < stop]

    def summary(self) -> str:
        """One line: what is captured, and the host steps grouped by reason."""
        if self.reason is not None:
            return f"not captured: {self.reason}"
        kernels = sum(s.stop - s.start for s in self.segments)
        by_reason: dict[str, list[int]] = {}
        for n, why in sorted(self.host.items()):
            by_reason.setdefault(why, []).append(n)
        host = "; ".join(f"steps {ns}: {why}" for why, ns in by_reason.items())
        return (f"{len(self.segments)} captured segment(s) of {kernels} step(s)"
                + (f"; on the host: {host}" if host else ""))


def spec_kinds(node: Node) -> set[type[Node]]:
    """Every node type inside ``node``."""
    return {type(n) for n in walk(node)}


def variables_read(node: Node) -> list[Any]:
    """The variables ``node`` reads through a :class:`VariableRead` leaf."""
    return [leaf.variable for leaf in leaves(node) if type(leaf) is VariableRead]


def own_kernel(modules: Collection[str]) -> Callable[[KernelCall], bool]:
    """A trust test: the kernel is defined in one of ``modules`` (packages, by prefix)."""
    prefixes = tuple(modules)

    def trusted(step: KernelCall) -> bool:
        module = getattr(step.kernel, "__module__", None) or ""
        return any(module == p or module.startswith(p + ".") for p in prefixes)

    return trusted


def step_reason(step: Any, assigned: Collection[int], uncapturable: Mapping[str, str],
                trusted: Callable[[KernelCall], bool],
                is_host_array: Callable[[Any], bool] = host_array) -> str | None:
    """Why ``step`` must run on the host at each replay, or None where a graph may hold it.
    ``assigned``: ids of the variables the program assigns."""
    if type(step) is WholeCall:
        return DRAW if step.fn is replay_draw else WHOLE
    if type(step) is Assign:
        return ASSIGN
    if type(step) is not KernelCall:
        return f"an unknown kind of step ({type(step).__name__})"
    kinds: set[type[Node]] = set()
    for a in step.inputs:
        kinds |= spec_kinds(a)
    if SeedSlot in kinds:
        return SEED
    odd = sorted(kind.__name__ for kind in kinds - CAPTURABLE_SPECS)
    if odd:
        return f"an argument of kind {odd[0]!r}, which a graph cannot hold"
    for a in step.inputs:
        for var in variables_read(a):
            if id(var) in assigned:
                return (f"it reads variable {getattr(var, 'name', '?')!r}, which the program "
                        "assigns (a new array at each replay)")
    if any(is_host_array(c) for a in step.inputs for c in constants(a)):
        return UPLOAD
    if step.name in uncapturable:
        return uncapturable[step.name]
    if not trusted(step):
        module = getattr(step.kernel, "__module__", None)
        return (f"kernel {step.name!r} comes from {module!r}, outside the backend: nothing "
                "tells whether it keeps host state or uploads host data")
    return None


def segment(program: Program, start: int, stop: int) -> Segment:
    """The :class:`Segment` of steps ``start`` to ``stop - 1``: what it reads from before it,
    what it leaves to the steps after it, which variables it reads."""
    steps = program.steps
    made: set[int] = set()
    inputs: list[int] = []
    variables: dict[int, Any] = {}
    for step in steps[start:stop]:
        for i in step_reads(step):
            if i not in made and i not in inputs:
                inputs.append(i)
        for a in step.operands:
            for var in variables_read(a):
                variables.setdefault(id(var), var)
        made.update(step_writes(step))
    later: set[int] = set(reads(program.output))
    for step in steps[stop:]:
        later.update(step_reads(step))
    outputs = tuple(i for i in sorted(made) if i in later)
    return Segment(start, stop, tuple(inputs), outputs, tuple(variables.values()))


def plan(program: Program, *, uncapturable: Mapping[str, str] | None = None,
         trusted: Callable[[KernelCall], bool] | None = None,
         refused: Mapping[int, str] | None = None, min_kernels: int = 2,
         is_host_array: Callable[[Any], bool] = host_array) -> Plan:
    """Split ``program`` into captured segments and host steps (see the module docstring).
    ``refused``: steps found uncapturable while capturing, with why."""
    uncapturable = uncapturable or {}
    trusted = trusted or (lambda step: True)
    refused = refused or {}
    assigned = {id(s.target()) for s in program.steps if type(s) is Assign}
    host: dict[int, str] = {}
    for n, step in enumerate(program.steps):
        why = refused.get(n) or step_reason(step, assigned, uncapturable, trusted,
                                            is_host_array)
        if why is not None:
            host[n] = why
    pieces: list[Segment | int] = []
    n, count = 0, len(program.steps)
    while n < count:
        if n in host:
            pieces.append(n)
            n += 1
            continue
        stop = n
        while stop < count and stop not in host:
            stop += 1
        if stop - n >= min_kernels:
            pieces.append(segment(program, n, stop))
        else:
            for m in range(n, stop):
                host[m] = SHORT
                pieces.append(m)
        n = stop
    out = Plan(pieces, host)
    if not out.segments:
        kernels = sum(type(s) is KernelCall for s in program.steps)
        out.reason = ("the program has no kernel call" if not kernels else
                      f"no run of {min_kernels} or more capturable kernel calls ("
                      + "; ".join(sorted({why for why in host.values()})) + ")")
    return out
