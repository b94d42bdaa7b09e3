"""Traced steps on CUDA: a program's capturable runs of kernel calls replayed as CUDA graphs.

:meth:`CudaBackend.compile_program <mpcore_cuda.backend.CudaBackend.compile_program>` returns what
is made here. :func:`mpcore_cuda.graph_plan.plan` splits the program into *segments* (runs of
kernel calls a graph may hold) and *host steps* (run at each replay as the default replay runs
them: calls kept whole, assignments, seeded kernels, host-array uploads, cuBLAS GEMMs, plugins'
kernels). A :class:`GraphRunner` captures each segment with CuPy's stream capture at its first run
(the first replay) and launches the graph from then on; the results are bit for bit the default
replay's, because the same kernels run on the same values in the same order. Where no segment is
possible the default replay (``Program.compile``) runs, with ``captured = False`` and the
``reason`` on it; ``MPCORE_CUDA_GRAPHS=0`` (or ``backend.graphs = False``) turns capture off, and
so does ``CUPY_ENABLE_UMP=1`` (CuPy then wraps host arrays as device arrays without a copy: a graph
would keep pointers to host memory). A call on another device or stream than the runner's first, or
one re-entered from a host step, runs the default replay; calls from several threads take turns
(the buffers are the runner's). Every decision is logged on the ``mpcore_cuda.graphs`` logger
(INFO).

What a graph needs, and how the runner keeps it true:

- *Pointers are frozen.* A segment's inputs made outside it (the step's inputs, what a host
  step returned) are copied at each replay into fixed buffers the runner owns, before the
  launch; inputs another segment's graph made are its held arrays, read in place. The arrays a
  segment leaves to later steps are held by the runner: the graph writes them at each launch.
- *Variables are read in place.* A graph reads the arrays the variables had at its capture.
  Optimizer updates write those arrays in place, but ``Variable.assign`` (a checkpoint restore,
  ``set_weights``) gives a variable a new array: before each launch the runner checks that
  every variable the segment reads still has its captured array, and captures again where one
  does not; a segment whose variables change at every step (more than ``MAX_RECAPTURES``
  times) leaves those kernel calls on the host. A program that assigns a variable keeps the
  kernels that read it on the host from the start (the plan).
- *Outputs do not alias.* An output array that lives in graph memory (a held array or a
  buffer, or a view of one) is copied before it is returned: the next launch overwrites it.
  Host steps get the held arrays themselves and must not keep them past the step (none of
  mpcore's does: the optimizer and loss-scaling steps read them at once).
- *Memory is private.* Every allocation made while capturing comes from a ``MemoryPool`` that
  belongs to the runner and lives as long as it does, so no block a graph uses is handed to
  other code. Blocks a graph used as scratch may go to the runner's later captures, which is
  safe because all its graphs launch in program order on one stream (a call on another
  stream runs the default replay). The pool's raw allocator raises instead of letting CuPy
  free the pool's cached blocks on an out-of-memory retry (that would free memory a graph
  uses); the capture then fails and the segment stays on the host. Capture runs in CuPy's
  default *relaxed* mode, in which the pool may still call ``cudaMalloc`` while capturing.
- *Host work cannot be captured.* The plan keeps the known cases on the host; beyond them, a
  capture records device work only: a kernel call that
  synchronizes or reads the device raises (CuPy and CUDA refuse it), so does a cuBLAS call
  (CuPy refuses cuBLAS while capturing), and an upload of host data through CuPy's pinned
  staging buffer raises too (the runner installs a pinned allocator that refuses while it
  captures: a graph would copy from a staging buffer CuPy recycles). The failing step joins
  the host steps, the segment is split around it and captured again, in the same call;
  nothing ran during the failed capture, so nothing runs twice. While capturing, CuPy's
  pinned allocator is set to that guard and afterwards back to CuPy's default pinned pool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from mpcore.tracing.program import (
    KernelCall,
    Node,
    Program,
    Slot,
    fold,
    plan_frees,
    reads,
)

from .graph_plan import Plan, Segment, own_kernel, plan, variables_read

logger = logging.getLogger("mpcore_cuda.graphs")

#: ``MPCORE_CUDA_GRAPHS=0`` (or off, false, no) turns capture off.
ENV = "MPCORE_CUDA_GRAPHS"
CUBLAS = ("it calls cuBLAS, which CuPy refuses while a stream captures "
          "(cupy_backends.cuda.libs.cublas.setStream)")
#: Kernels of this backend known to call cuBLAS on every route (others are found capturing).
FP8_GEMM = ("it calls cuBLAS (emulated: CuPy's matmul) or cuBLASLt (native: its workspace and "
            "plans are the backend's, not the graph's)")
UNCAPTURABLE = {"matmul": CUBLAS, "dense": CUBLAS, "fp8_matmul": FP8_GEMM}
#: Kernels defined in these packages are audited for graph capture; others are not trusted.
TRUSTED = own_kernel(("mpcore_cuda", "mpcore_xp"))
#: cudaErrorMemoryAllocation (driver_types.h; CuPy 14 does not export the name).
_CUDA_ERROR_MEMORY_ALLOCATION = 2
#: How many times a segment is captured again because a variable's array changed.
MAX_RECAPTURES = 3


def disabled_reason(backend: Any) -> str | None:
    """Why capture is off (the env variable, ``backend.graphs``), or None."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return f"{ENV}={value} turns CUDA graphs off"
    if not getattr(backend, "graphs", True):
        return "the backend's `graphs` option is False"
    if os.environ.get("CUPY_ENABLE_UMP", "0").strip() not in ("", "0"):
        # CuPy then wraps host arrays as device arrays without a copy: a graph would keep
        # pointers to host memory that Python frees
        return "CUPY_ENABLE_UMP is set (uploads are zero-copy views of host memory)"
    return None


def cuda_plan(program: Program, refused: dict[int, str] | None = None) -> Plan:
    """The plan of ``program`` with this backend's rules."""
    return plan(program, uncapturable=UNCAPTURABLE, trusted=TRUSTED, refused=refused)


def compile_program(backend: Any, program: Program) -> Callable[[list[Any]], Any]:
    """A :class:`GraphRunner`, or the default replay (with ``captured = False`` and the
    ``reason``) where capture is off or nothing in the program can be captured."""
    why = disabled_reason(backend)
    found = None if why is not None else cuda_plan(program)
    if found is not None:
        why = found.reason
    if why is None and found is not None:
        runner = GraphRunner(backend, program, found)
        logger.info("traced step on CUDA: %s", found.summary())
        return runner
    replay: Any = program.compile()
    replay.captured, replay.reason, replay.plan = False, why, found
    logger.info("traced step on CUDA: the default replay (%s)", why)
    return replay


class _RefusedError(Exception):
    """Steps a capture found it cannot hold, and why."""

    def __init__(self, steps: list[int], reason: str) -> None:
        super().__init__(reason)
        self.steps, self.reason = steps, reason


class _HostUploadError(RuntimeError):
    """Raised by the pinned-memory guard: an upload of host data while capturing."""


class _Captured:
    """One segment's graph and what it points to."""

    def __init__(self, graph: Any, buffers: dict[int, Any], direct: dict[int, Any],
                 variables: list[tuple[Any, Any]], held: dict[int, Any]) -> None:
        self.graph, self.buffers, self.direct = graph, buffers, direct
        self.variables, self.held = variables, held

    def stale_variables(self) -> list[Any]:
        return [var for var, data in self.variables if var._data is not data]

    def stale_inputs(self, env: dict[int, Any]) -> bool:
        return any(env[slot] is not array for slot, array in self.direct.items())


def _run_step(step: Any, env: dict[int, Any], free: tuple[int, ...] = ()) -> None:
    """One step as the default replay runs it (``Program.compile`` writes the same calls),
    then the slots ``free`` dropped."""
    step.run(env)
    for i in free:
        env.pop(i, None)


_guard = threading.local()


@contextlib.contextmanager
def _no_host_uploads(cp: Any) -> Iterator[None]:
    """Refuse CuPy's pinned staging allocations (uploads of host data) in this thread."""
    default = cp.get_default_pinned_memory_pool().malloc

    def guard(size: int) -> Any:
        if getattr(_guard, "capturing", False):
            raise _HostUploadError("an upload of host data (a graph would copy from a staging "
                                   "buffer that CuPy recycles)")
        return default(size)

    _guard.capturing = True
    cp.cuda.set_pinned_memory_allocator(guard)
    try:
        yield
    finally:
        _guard.capturing = False
        cp.cuda.set_pinned_memory_allocator(default)


def _abandon(stream: Any) -> None:
    """End a failed capture (CUDA then reports it invalidated, or returns a graph to drop)."""
    with contextlib.suppress(Exception):
        stream.end_capture()


class GraphRunner:
    """Runs a program with its segments as CUDA graphs (see the module docstring).
    ``captured``: whether graphs run (False once the runner has given up: ``reason`` says
    why); ``plan``: the current plan (``plan.host``: each host step and why)."""

    def __init__(self, backend: Any, program: Program, found: Plan) -> None:
        plan_frees(program)
        self.cp = backend.cp
        self.program, self.plan = program, found
        self.reason: str | None = None
        self.refused: dict[int, str] = {}
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self.buffers: dict[int, Any] = {}
        self.recaptures: dict[tuple[int, int], int] = {}
        self.launches = 0
        self._pool: Any = None
        self._stream: Any = None
        self._stream_ptr: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._inside = threading.local()
        self._graph_memory: set[int] = set()
        self._default: Callable[[list[Any]], Any] | None = None
        self._warned_stream = False

    @property
    def captured(self) -> bool:
        return self.reason is None and bool(self.graphs)

    def default(self, inputs: list[Any]) -> Any:
        """The default replay (``Program.compile``)."""
        if self._default is None:
            self._default = self.program.compile()
        return self._default(inputs)

    def __call__(self, inputs: list[Any]) -> Any:
        if self.reason is not None:
            return self.default(inputs)
        cuda = self.cp.cuda
        where = (cuda.runtime.getDevice(), cuda.get_current_stream().ptr)
        if self._stream_ptr is None:
            self._stream_ptr = where
        elif where != self._stream_ptr:
            # the graphs' pointers are on their device, and their buffers are ordered on
            # their stream only
            if not self._warned_stream:
                self._warned_stream = True
                logger.info("traced step on CUDA: called on another device or stream than "
                            "its graphs'; such calls run the default replay")
            return self.default(inputs)
        if getattr(self._inside, "call", False):     # re-entered from one of its host steps
            return self.default(inputs)
        # one call at a time: the buffers and held arrays are the runner's, not the call's
        with self._lock:
            self._inside.call = True
            try:
                env: dict[int, Any] = {}
                for j, i in enumerate(self.program.inputs):
                    env[i] = inputs[j]
                self._run_pieces(self.plan.pieces, env)
                return self._output(self.program.output, env)
            finally:
                self._inside.call = False

    # --- running ------------------------------------------------------------------------------
    def _run_pieces(self, pieces: list[Segment | int], env: dict[int, Any]) -> None:
        steps = self.program.steps
        for piece in pieces:
            if isinstance(piece, Segment):
                self._run_segment(piece, env)
            else:
                _run_step(steps[piece], env, self.program.frees[piece])

    def _run_segment(self, seg: Segment, env: dict[int, Any]) -> None:
        cap = self.graphs.get(seg.key)
        if cap is not None:
            stale = cap.stale_variables()
            if stale:
                count = self.recaptures[seg.key] = self.recaptures.get(seg.key, 0) + 1
                if count > MAX_RECAPTURES:
                    names = {id(v) for v in stale}
                    self._refuse(seg, [n for n in range(seg.start, seg.stop)
                                       if _reads_any(self.program.steps[n], names)],
                                 f"it reads a variable whose array was replaced {count} times "
                                 "between replays (assign)", env)
                    return
            if stale or cap.stale_inputs(env):
                self._drop(seg.key)
                cap = None
        if cap is None:
            try:
                cap = self._capture(seg, env)
            except _RefusedError as exc:
                self._refuse(seg, exc.steps, exc.reason, env)
                return
        for slot, buf in cap.buffers.items():
            _copy_into(buf, env[slot])
        cap.graph.launch()
        self.launches += 1
        env.update(cap.held)
        frees = self.program.frees
        for n in range(seg.start, seg.stop):
            for i in frees[n]:
                env.pop(i, None)

    def _refuse(self, seg: Segment, steps: list[int], reason: str, env: dict[int, Any]) -> None:
        """Put ``steps`` on the host, plan again, and run the segment's range the new way."""
        for n in steps:
            self.refused[n] = reason
        self._drop(seg.key)
        self.plan = cuda_plan(self.program, self.refused)
        logger.info("traced step on CUDA: steps %s stay on the host (%s); now %s", steps,
                    reason, self.plan.summary())
        if not self.plan.segments:
            self.reason = self.plan.reason
            self.graphs.clear()
        self._run_pieces(self.plan.within(seg.start, seg.stop), env)

    def _drop(self, key: tuple[int, int]) -> None:
        self.graphs.pop(key, None)
        self._graph_memory = {id(a.data.mem) for c in self.graphs.values()
                              for a in (*c.held.values(), *c.buffers.values())
                              if isinstance(a, self.cp.ndarray)}

    def _output(self, node: Node, env: dict[int, Any]) -> Any:
        """The program's output; arrays in graph memory are copied (the next launch writes
        them)."""
        def leaf(node: Any) -> Any:
            value = node.read(env)
            if (type(node) is Slot and isinstance(value, self.cp.ndarray)
                    and id(value.data.mem) in self._graph_memory):
                return value.copy()
            return value

        return fold(node, leaf, lambda composite, values: composite.build(values))

    # --- capturing ----------------------------------------------------------------------------
    def _raw_malloc(self, size: int) -> Any:
        cp = self.cp
        try:
            return cp.cuda.memory._malloc(size)
        except cp.cuda.runtime.CUDARuntimeError as exc:
            if exc.status == _CUDA_ERROR_MEMORY_ALLOCATION:
                # not a CUDARuntimeError: CuPy's pool would free its cached blocks and retry
                raise MemoryError(f"out of device memory for a CUDA graph's pool ({size} "
                                  "bytes)") from None
            raise

    def _capture(self, seg: Segment, env: dict[int, Any]) -> _Captured:
        cp = self.cp
        if self._pool is None:
            self._pool = cp.cuda.MemoryPool(allocator=self._raw_malloc)
            self._pool.set_limit(size=0)      # no limit: reaching one frees cached blocks
            self._stream = cp.cuda.Stream(non_blocking=True)
        steps = self.program.steps
        held = {id(a) for c in self.graphs.values() for a in c.held.values()}
        local: dict[int, Any] = {}
        buffers: dict[int, Any] = {}
        direct: dict[int, Any] = {}
        for slot in seg.inputs:
            value = env[slot]
            if not isinstance(value, cp.ndarray):
                first = next(n for n in range(seg.start, seg.stop)
                             if _reads_slot(steps[n], slot))
                raise _RefusedError([first], f"it reads a host value ({type(value).__name__}) "
                                        "made at each replay")
            if id(value) in held:
                direct[slot] = local[slot] = value
                continue
            buf = self.buffers.get(slot)
            if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                with cp.cuda.using_allocator(self._pool.malloc):
                    buf = cp.empty(value.shape, dtype=value.dtype)
                self.buffers[slot] = buf
            buffers[slot] = local[slot] = buf
        variables = [(var, var._data) for var in seg.variables]
        stream = self._stream
        n = seg.start
        with stream, cp.cuda.using_allocator(self._pool.malloc), _no_host_uploads(cp):
            stream.begin_capture()            # relaxed mode: the pool may cudaMalloc
            try:
                for n in range(seg.start, seg.stop):
                    _run_step(steps[n], local, self.program.frees[n])
            except Exception as exc:
                _abandon(stream)
                raise _RefusedError([n], f"refused while capturing: {type(exc).__name__}: {exc}"
                               ) from exc
            except BaseException:
                _abandon(stream)
                raise
            try:
                graph = stream.end_capture()
            except Exception as exc:          # invalidated by something that did not raise
                raise _RefusedError(list(range(seg.start, seg.stop)),
                               f"the capture failed: {type(exc).__name__}: {exc}") from exc
        cap = _Captured(graph, buffers, direct, variables,
                        {slot: local[slot] for slot in seg.outputs})
        self.graphs[seg.key] = cap
        self._graph_memory |= {id(a.data.mem) for a in (*cap.held.values(), *buffers.values())
                               if isinstance(a, cp.ndarray)}
        logger.info("traced step on CUDA: captured steps %d-%d as a graph", seg.start,
                    seg.stop - 1)
        return cap


def _copy_into(buf: Any, src: Any) -> None:
    """``buf[...] = src`` on the current stream; a plain device copy where the layouts match
    (any dtype: bfloat16 included)."""
    if src.flags.c_contiguous and src.dtype == buf.dtype and src.shape == buf.shape:
        if src.nbytes:
            buf.data.copy_from_device_async(src.data, src.nbytes)
    else:
        buf[...] = src


def _reads_slot(step: Any, slot: int) -> bool:
    return isinstance(step, KernelCall) and any(slot in reads(a) for a in step.inputs)


def _reads_any(step: Any, variable_ids: set[int]) -> bool:
    return isinstance(step, KernelCall) and any(
        id(v) in variable_ids for a in step.inputs for v in variables_read(a))
