"""Traced steps on OpenCL: a program's kernel calls replayed as their recorded launches.

:meth:`OpenCLBackend.compile_program <mpcore_opencl.backend.OpenCLBackend.compile_program>`
returns the runner made here. Its first call runs the program as the generic replay does, one
kernel method per call, while a recorder watches the runtime: for each kernel call it notes
every launch (the ``cl.Kernel``, its global and local sizes and its arguments) and every
allocation, and where each buffer argument comes from: an operand of the call (a slot, a
variable's current array, a constant), an allocation made inside the call, or the device error
record. From then on the runner is one Python function (as :meth:`mpcore.program.Program.compile`
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

from mpcore.core.tensor import Tensor
from mpcore.tracing.program import (
    Assign,
    KernelCall,
    Program,
    ProgramWriter,
    Spec,
    WholeCall,
    bind,
    evaluate,
    plan_frees,
)

from .arrays import CLArray

#: Argument specs a frozen call may take (slots, variables, constants, and lists of them).
_FROZEN_SPECS = frozenset("svclt")
#: The runtime methods a recorder wraps while a kernel call runs.
_WATCHED = ("launch", "launch_nd", "allocate", "upload", "read", "finish")


class _RefusedError(Exception):
    """A kernel call that stays on the generic path at each replay (the reason)."""


class _Frozen:
    """One kernel call as recorded: ``events`` are ("alloc", n, nbytes) and ("launch",
    kernel, global size, local size, args), an arg ("buf", source) where it is a buffer;
    ``outputs`` are (slot, shape, dtype, source) or (slot, spec) for an operand passed on."""

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


def _leaves(spec: Spec, value: Any, out: list[tuple[Spec, Any]]) -> None:
    """(spec, value) of each operand in ``spec``; _RefusedError for specs a frozen call cannot
    take."""
    kind = spec[0]
    if kind not in _FROZEN_SPECS:
        raise _RefusedError(f"an argument of kind {kind!r}")
    if kind in ("l", "t"):
        if not isinstance(value, (list, tuple)) or len(value) != len(spec[1]):
            raise _RefusedError("a list argument that is not a list")
        for s, v in zip(spec[1], value):
            _leaves(s, v, out)
    else:
        out.append((spec, value))


def _key(spec: Spec) -> tuple[Any, ...]:
    return ("s", spec[1]) if spec[0] == "s" else (spec[0], id(spec[1]))


class _Recorder:
    """Runs a program as the generic replay does, recording its freezable kernel calls."""

    def __init__(self, program: Program, rt: Any) -> None:
        self.program, self.rt = program, rt
        self.env: dict[int, Any] = {}
        self.frozen: dict[int, _Frozen] = {}
        self.refused: dict[int, str] = {}

    def value(self, spec: Spec) -> Any:
        return evaluate(spec, self.env)

    def bind(self, spec: Spec, value: Any) -> None:
        bind(spec, value, self.env)

    def run(self, inputs: list[Any]) -> Any:
        for j, i in enumerate(self.program.inputs):
            self.env[i] = inputs[j]
        for n, step in enumerate(self.program.steps):
            kind = type(step)
            if kind is KernelCall:
                self.bind(step.out, self.kernel_call(n, step))
            elif kind is WholeCall:
                args, kwargs = self.value(step.args[1][0]), self.value(step.args[1][1])
                self.bind(step.out, step.fn(*args, **kwargs))
            else:
                assert kind is Assign
                var = step.target()
                var.assign(Tensor(self.value(step.value), var._backend, var._dtype))
            for i in step.free:
                self.env.pop(i, None)
        return self.value(self.program.output)

    def kernel_call(self, n: int, step: KernelCall) -> Any:
        args = [self.value(a) for a in step.args]
        operands: list[tuple[Spec, Any]] = []
        try:
            for spec, value in zip(step.args, args):
                _leaves(spec, value, operands)
        except _RefusedError as exc:
            self.refused[n] = str(exc)
            return step.kernel(*args)
        places: dict[int, Any] = {}
        arrays: dict[int, Spec] = {}
        for spec, value in operands:
            if isinstance(value, CLArray):
                seen = places.setdefault(id(value.data), _key(spec))
                if seen != _key(spec):
                    places[id(value.data)] = ("ambiguous",)
                arrays.setdefault(id(value), spec)
        if self.rt._errors is None:          # made (and zeroed) now, not inside a call
            armed = self.rt._armed
            self.rt.error_record()
            self.rt._armed = armed
        with _Launches(self.rt, places) as watch:
            out = step.kernel(*args)
        try:
            if watch.refused is not None:
                raise _RefusedError(watch.refused)
            outs: list[tuple[Spec, Any]] = []
            _leaves(step.out, out, outs)
            for spec, value in outs:
                if not isinstance(value, CLArray):
                    raise _RefusedError("a result that is not an array")
                if id(value) in arrays:
                    watch.frozen.outputs.append((spec[1], arrays[id(value)]))
                    continue
                source = watch.place(value.data)
                if watch.refused is not None or source[1][0] == "errors":
                    raise _RefusedError("a result in a buffer it cannot place")
                watch.frozen.outputs.append((spec[1], tuple(value.shape), value.dtype,
                                             source[1]))
        except _RefusedError as exc:
            self.refused[n] = str(exc)
        else:
            self.frozen[n] = watch.frozen
        return out


class _FastWriter(ProgramWriter):
    """The generic replay's writer, with each frozen kernel call written as its launches."""

    def __init__(self, program: Program, rt: Any, frozen: dict[int, _Frozen]) -> None:
        super().__init__(program)
        self.frozen = frozen
        self._objects: dict[tuple[Any, ...], Any] = {}
        self.names.update(_q=rt.queue, _rt=rt, _alloc=rt.pool.allocate, _CLArray=CLArray)

    def source_expr(self, source: tuple[Any, ...]) -> str:
        kind = source[0]
        if kind == "alloc":
            return f"a{source[1]}"
        if kind == "errors":
            return "_rt.error_record()"
        if kind == "s":
            return f"s{source[1]}.data"
        # a variable or a constant array: found again by its id in the step's operands
        return f"{self.name('v' if kind == 'v' else 'c', self._objects[source])}" + (
            "._data.data" if kind == "v" else ".data")

    def arg_expr(self, arg: tuple[int, Any]) -> str:
        placed, value = arg
        if placed:
            return self.source_expr(value[1])
        if value is None or isinstance(value, bool) or type(value) in (int, float):
            return repr(value)
        return self.name("c", value)

    def frozen_lines(self, step: KernelCall, frozen: _Frozen) -> None:
        self._objects = {_key(s): s[1] for s in _operand_specs(step) if s[0] in "vc"}
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


def _operand_specs(step: KernelCall) -> list[Spec]:
    out: list[Spec] = []

    def walk(spec: Spec) -> None:
        if spec[0] in ("l", "t"):
            for s in spec[1]:
                walk(s)
        else:
            out.append(spec)
    for a in step.args:
        walk(a)
    return out


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
