"""Traced steps on OpenCL: a program's kernel calls replayed as their recorded launches.

:meth:`OpenCLBackend.compile_program <mpcore_opencl.backend.OpenCLBackend.compile_program>`
returns the runner made here. Its first call runs the program as the generic replay does, one
kernel method per call, while a recorder watches the runtime: for each kernel call it notes
every launch (the ``cl.Kernel``, its global and local sizes and its arguments) and every
allocation, and where each buffer argument comes from: an operand of the call (a slot, a
variable's current array, a constant), an allocation made inside the call, or the device error
record. From then on the runner is one Python function (as
:meth:`mpcore.tracing.program.Program.compile`
writes one) in which each such call is its allocations and its launches, ``k3(queue, (256,),
(256,), n, s2.data, a7)``: none of the kernel method's per-call work (program lookups,
broadcast geometry, scalar conversion, argument checks) is left.

Run as the generic replay runs them, at each replay: calls kept whole (optimizer updates, loss
scaling), variable assignments, and any kernel call the recorder cannot freeze safely: one that
takes a fresh seed or a tensor, touches the host (an upload, a read, a wait), uses a buffer it
cannot place, or returns anything but arrays. Results are bit for bit the generic replay's: the
same kernels run with the same arguments in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyopencl as cl

from mpcore.tracing.program import (
    Composite,
    Const,
    KernelCall,
    Leaf,
    ListOf,
    Node,
    Program,
    ProgramWriter,
    Slot,
    TupleOf,
    VariableRead,
    bind,
    evaluate,
    plan_frees,
    unfold,
)

from .arrays import CLArray

#: Argument nodes a frozen call may take (slots, variables, constants, and lists of them).
_FROZEN_SPECS = frozenset({Slot, VariableRead, Const, ListOf, TupleOf})
#: The runtime methods a recorder wraps while a kernel call runs.
_WATCHED = ("launch", "launch_nd", "allocate", "upload", "read", "finish")


class _RefusedError(Exception):
    """A kernel call that stays on the generic path at each replay (the reason)."""


class _Frozen:
    """One kernel call as recorded: ``events`` are ("alloc", n, nbytes) and ("launch",
    kernel, global size, local size, args), an arg ("buf", source) where it is a buffer;
    ``outputs`` are (slot, shape, dtype, source) or (slot, node) for an operand passed on."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.outputs: list[tuple[Any, ...]] = []


class _Launches:
    """Watches one kernel call: the runtime's launch, launch_nd and allocate record what
    they do, and the host-side calls (upload, read, finish) refuse it."""

    def __init__(self, rt: Any, places: dict[int, Any]) -> None:
        self.rt = rt
        self.places = places              # id(buffer) -> source, from the call's operands
        self.frozen = _Frozen()
        self.refused: str | None = None
        self.allocated = 0
        self.made: list[Any] = []         # held until the call ends: no id is reused meanwhile

    def place(self, arg: Any) -> Any:
        if not isinstance(arg, cl.MemoryObjectHolder):
            return arg
        source = self.places.get(id(arg))
        if source is None:
            if arg is self.rt._errors:
                return ("buf", ("errors",))
            self.refused = "a buffer that is neither an operand nor made by the call"
            return None
        if source == ("ambiguous",):
            self.refused = "one buffer behind two different operands"
        return ("buf", source)

    def __enter__(self) -> _Launches:
        rt, orig_nd, orig_alloc = self.rt, self.rt.launch_nd, self.rt.allocate

        def record(kernel: Any, gsize: Any, lsize: Any, args: tuple[Any, ...]) -> None:
            placed = tuple((1, self.place(a)) if isinstance(a, cl.MemoryObjectHolder)
                           else (0, a) for a in args)
            self.frozen.events.append(("launch", kernel, tuple(gsize),
                                       None if lsize is None else tuple(lsize), placed))

        def launch_nd(kernel: Any, gsize: tuple[int, ...], lsize: Any, *args: Any) -> None:
            record(kernel, gsize, lsize, args)
            orig_nd(kernel, gsize, lsize, *args)

        class _Kernel:   # what Runtime.launch calls: the launch it computed, recorded
            def __init__(self, kernel: Any) -> None:
                self.kernel, self.function_name = kernel, kernel.function_name

            def __call__(self, queue: Any, gsize: Any, lsize: Any, *args: Any) -> None:
                record(self.kernel, gsize, lsize, args)
                self.kernel(queue, gsize, lsize, *args)

        orig_launch = rt.launch

        def launch(kernel: Any, n: int, *args: Any) -> None:
            orig_launch(_Kernel(kernel), n, *args)

        def allocate(nbytes: int) -> Any:
            buf = orig_alloc(nbytes)
            self.made.append(buf)
            self.places[id(buf)] = ("alloc", self.allocated)
            self.frozen.events.append(("alloc", self.allocated, nbytes))
            self.allocated += 1
            return buf

        def host(name: str) -> Callable[..., Any]:
            orig = getattr(rt, name)

            def call(*args: Any) -> Any:
                self.refused = f"it calls the runtime's {name} (host work)"
                return orig(*args)
            return call

        self.saved = {name: rt.__dict__[name] for name in _WATCHED if name in rt.__dict__}
        rt.launch, rt.launch_nd, rt.allocate = launch, launch_nd, allocate
        rt.upload, rt.read, rt.finish = host("upload"), host("read"), host("finish")
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in _WATCHED:         # what was there before (another watcher's) comes back
            self.rt.__dict__.pop(name, None)
        self.rt.__dict__.update(self.saved)


def _split(node: Composite, value: Any) -> Any:
    if type(node) not in _FROZEN_SPECS:
        raise _RefusedError(f"an argument of kind {type(node).__name__!r}")
    if not isinstance(value, (list, tuple)) or len(value) != len(node.children()):
        raise _RefusedError("a list argument that is not a list")
    return value


def _leaves(node: Node, value: Any, out: list[tuple[Leaf, Any]]) -> None:
    """(leaf, value) of each operand in ``node``; _RefusedError for nodes a frozen call
    cannot take."""
    for leaf, part in unfold(node, value, _split):
        if type(leaf) not in _FROZEN_SPECS:
            raise _RefusedError(f"an argument of kind {type(leaf).__name__!r}")
        out.append((leaf, part))


def _held(leaf: Leaf) -> Any:
    """The object a variable or constant leaf holds."""
    return leaf.variable if type(leaf) is VariableRead else leaf.value  # type: ignore[attr-defined]


def _key(leaf: Leaf) -> Any:
    """An operand, comparable: the slot, or the variable or constant by identity."""
    return leaf if type(leaf) is Slot else (type(leaf), id(_held(leaf)))


class _Recorder:
    """Runs a program as the generic replay does, recording its freezable kernel calls."""

    def __init__(self, program: Program, rt: Any) -> None:
        self.program, self.rt = program, rt
        self.env: dict[int, Any] = {}
        self.frozen: dict[int, _Frozen] = {}
        self.refused: dict[int, str] = {}

    def run(self, inputs: list[Any]) -> Any:
        for j, i in enumerate(self.program.inputs):
            self.env[i] = inputs[j]
        frees = self.program.frees
        for n, step in enumerate(self.program.steps):
            if type(step) is KernelCall:
                self.kernel_call(n, step)
            else:
                step.run(self.env)
            for i in frees[n]:
                self.env.pop(i, None)
        return evaluate(self.program.output, self.env)

    def kernel_call(self, n: int, step: KernelCall) -> None:
        """Run ``step`` as the generic replay does, recording it where it can be frozen."""
        args = [evaluate(a, self.env) for a in step.inputs]
        operands: list[tuple[Leaf, Any]] = []
        try:
            for node, value in zip(step.inputs, args):
                _leaves(node, value, operands)
        except _RefusedError as exc:
            self.refused[n] = str(exc)
            bind(step.outputs, step.kernel(*args), self.env)
            return
        places: dict[int, Any] = {}
        arrays: dict[int, Leaf] = {}
        for leaf, value in operands:
            if isinstance(value, CLArray):
                seen = places.setdefault(id(value.data), leaf)
                if not isinstance(seen, Leaf) or _key(seen) != _key(leaf):
                    places[id(value.data)] = ("ambiguous",)
                arrays.setdefault(id(value), leaf)
        if self.rt._errors is None:          # made (and zeroed) now, not inside a call
            armed = self.rt._armed
            self.rt.error_record()
            self.rt._armed = armed
        with _Launches(self.rt, places) as watch:
            out = step.kernel(*args)
        try:
            if watch.refused is not None:
                raise _RefusedError(watch.refused)
            outs: list[tuple[Leaf, Any]] = []
            _leaves(step.outputs, out, outs)
            for leaf, value in outs:
                if not isinstance(value, CLArray) or type(leaf) is not Slot:
                    raise _RefusedError("a result that is not an array")
                if id(value) in arrays:
                    watch.frozen.outputs.append((leaf.index, arrays[id(value)]))
                    continue
                source = watch.place(value.data)
                if watch.refused is not None or source[1] == ("errors",):
                    raise _RefusedError("a result in a buffer it cannot place")
                watch.frozen.outputs.append((leaf.index, tuple(value.shape), value.dtype,
                                             source[1]))
        except _RefusedError as exc:
            self.refused[n] = str(exc)
        else:
            self.frozen[n] = watch.frozen
        bind(step.outputs, out, self.env)


class _FastWriter(ProgramWriter):
    """The generic replay's writer, with each frozen kernel call written as its launches."""

    def __init__(self, program: Program, rt: Any, frozen: dict[int, _Frozen]) -> None:
        super().__init__(program)
        self.frozen = frozen
        self.names.update(_q=rt.queue, _rt=rt, _alloc=rt.pool.allocate, _CLArray=CLArray)

    def source_expr(self, source: Any) -> str:
        if isinstance(source, Leaf):          # an operand: a slot's, variable's or constant's
            return f"{source.source(self.name)}.data"
        if source[0] == "alloc":
            return f"a{source[1]}"
        return "_rt.error_record()"           # ("errors",)

    def arg_expr(self, arg: tuple[int, Any]) -> str:
        placed, value = arg
        if placed:
            return self.source_expr(value[1])
        if value is None or isinstance(value, bool) or type(value) in (int, float):
            return repr(value)
        return self.name("c", value)

    def frozen_lines(self, step: KernelCall, frozen: _Frozen) -> None:
        allocs = []
        for event in frozen.events:
            if event[0] == "alloc":
                allocs.append(f"a{event[1]}")
                self.lines.append(f"    a{event[1]} = _alloc({event[2]})")
            else:
                _, kernel, gsize, lsize, args = event
                call_args = ", ".join(["_q", repr(gsize), repr(lsize),
                                       *(self.arg_expr(a) for a in args)])
                self.lines.append(f"    {self.name('k', kernel)}({call_args})")
        for out in frozen.outputs:
            if len(out) == 2:
                self.lines.append(f"    s{out[0]} = {self.expr(out[1])}")
            else:
                slot, shape, dtype, source = out
                self.lines.append(f"    s{slot} = _CLArray(_rt, {shape!r}, "
                                  f"{self.name('c', dtype)}, {self.source_expr(source)})")
        if allocs:
            self.lines.append("    " + " = ".join(allocs) + " = None")

    title = "<mpcore traced step (OpenCL launches)>"

    def write_step(self, n: int, step: Any) -> None:
        if type(step) is KernelCall and n in self.frozen:
            self.frozen_lines(step, self.frozen[n])
        else:
            super().write_step(n, step)


def compile_program(rt: Any, program: Program) -> Callable[[list[Any]], Any] | None:
    """The runner of ``program`` on runtime ``rt``: its first call records (and is a generic
    replay), the later ones replay the recorded launches. None where the program has no kernel
    call (nothing to gain)."""
    if not any(type(step) is KernelCall for step in program.steps):
        return None
    plan_frees(program)
    state: dict[str, Any] = {"fast": None}

    def run(inputs: list[Any]) -> Any:
        fast = state["fast"]
        if fast is not None:
            return fast(inputs)
        recorder = _Recorder(program, rt)
        out = recorder.run(inputs)
        fast = state["fast"] = _FastWriter(program, rt, recorder.frozen).function()
        run.frozen = sorted(recorder.frozen)       # type: ignore[attr-defined]
        run.refused = recorder.refused             # type: ignore[attr-defined]
        run.source = fast.source                   # type: ignore[attr-defined]
        return out

    run.frozen = None                              # type: ignore[attr-defined]
    run.refused = None                             # type: ignore[attr-defined]
    run.opencl_launches = True                     # type: ignore[attr-defined]
    return run
