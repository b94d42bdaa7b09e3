"""The CUDA graph plan on real programs traced on the cpu backend (it runs anywhere): which
steps a graph may hold and why the others stay on the host, how a program splits into
segments and what crosses their borders, and the fallback to the default replay. The graphs
themselves run on a GPU only: test_cuda_graphs.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import custom_training_step, mlp_and_optimizer
from mpcore_cuda import CudaBackend, graphs
from mpcore_cuda import graph_plan as gp

import mpcore as mp
from mpcore.tracing.program import (
    Assign,
    Const,
    KernelCall,
    ListOf,
    Program,
    SeedSlot,
    Slot,
    TensorOf,
    TupleOf,
    VariableRead,
    WeakVariableRead,
    WholeCall,
    evaluate,
    leaves,
    reads,
    step_reads,
    step_writes,
)

#: The cpu backend's own kernels play the part of the CUDA backend's (audited) ones; plugin
#: kernels (the oneDNN GEMMs, where that plugin is installed) stay untrusted. The ONNX
#: Runtime plugin is off here: its float16 arithmetic (a wrapper over the CPU's own kernels,
#: which CUDA does not have) would put every float16 multiply on the host.
CPU_OWN = gp.own_kernel(("mpcore_cpu", "mpcore_xp"))
RNG = np.random.default_rng(4)


@pytest.fixture(autouse=True)
def _cpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    from mpcore_cpu import CpuBackend

    previous = mp.get_backend()
    monkeypatch.setenv("MPCORE_ONNXRUNTIME", "off")
    mp.set_backend(CpuBackend())
    yield
    mp.set_backend(previous.name)
    mp.set_global_policy(None)


def traced(fn: Any, *args: Any, calls: int = 2) -> Program:
    f = mp.function(fn)
    for _ in range(calls):
        f(*args)
    assert f.graph is not None
    return f.graph


def training_program(policy: str) -> Program:
    model, opt = mlp_and_optimizer(policy)
    step = mp.function(custom_training_step(model, opt))
    for _ in range(2):
        step(mp.constant(RNG.random((8, 20), dtype=np.float32)),
             mp.constant(RNG.integers(0, 4, 8)))
    assert step.graph is not None
    return step.graph


def cuda_rules(program: Program, **kw: Any) -> gp.Plan:
    return gp.plan(program, uncapturable=graphs.UNCAPTURABLE, trusted=CPU_OWN, **kw)


def check_cover(program: Program, plan: gp.Plan) -> None:
    """The pieces cover every step once, in order; segments hold no host step and at least
    two kernel calls; their borders are what the steps read and leave."""
    order: list[int] = []
    for piece in plan.pieces:
        if isinstance(piece, gp.Segment):
            assert piece.stop - piece.start >= 2
            assert not set(range(piece.start, piece.stop)) & set(plan.host)
            order.extend(range(piece.start, piece.stop))
        else:
            assert piece in plan.host
            order.append(piece)
    assert order == list(range(len(program.steps)))
    for seg in plan.segments:
        inside = program.steps[seg.start:seg.stop]
        made = {i for s in inside for i in step_writes(s)}
        read_inside = {i for s in inside for i in step_reads(s)}
        before = set(program.inputs) | {i for s in program.steps[:seg.start]
                                        for i in step_writes(s)}
        assert set(seg.inputs) <= read_inside & before
        assert read_inside - made <= set(seg.inputs)
        after = set(reads(program.output)) | {
            i for s in program.steps[seg.stop:] for i in step_reads(s)}
        assert set(seg.outputs) == made & after


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_a_training_step_splits_around_its_host_steps(policy: str) -> None:
    program = training_program(policy)
    plan = cuda_rules(program)
    check_cover(program, plan)
    assert plan.reason is None and plan.segments
    for n, step in enumerate(program.steps):
        if type(step) is WholeCall:       # optimizer update, loss scaling: Python each step
            assert plan.host[n] == (gp.DRAW if "next_seed()" in step.text else gp.WHOLE)
        elif type(step) is Assign:
            continue
        elif step.name == "dropout_mask":  # the seed drawn at each replay
            assert plan.host[n] == gp.SEED
        elif step.name in ("matmul", "dense"):    # (a host array argument: an upload first)
            assert plan.host[n] in (graphs.CUBLAS, gp.UPLOAD)
    # what a host step makes at each replay (the dropout mask, the gradients' scale) is an
    # input of any segment that reads it: copied into the runner's buffer before each launch
    for seg in plan.segments:
        for n in range(seg.start, seg.stop):
            for i in step_reads(program.steps[n]):
                maker = next((m for m, s in enumerate(program.steps[:n])
                              if i in step_writes(s)), None)
                if maker is not None and maker in plan.host:
                    assert i in seg.inputs
    # segments that read the weights list those variables (checked before each launch)
    assert any(seg.variables for seg in plan.segments) or policy == "float32"
    # (Adam and the loss scale are recorded kernel by kernel: nothing need be kept whole)
    assert "captured segment(s)" in plan.summary()


def test_the_loss_scale_read_is_a_border_in_mixed_float16() -> None:
    program = training_program("mixed_float16")
    plan = cuda_rules(program)
    scale = next((n for n, s in enumerate(program.steps)
                  if type(s) is WholeCall and "_scale_of" in s.text), None)
    if scale is None:   # the LossScaleOptimizer recorded kernel by kernel: the scale's
        # variable is read live by the kernels (a 'v' operand), never frozen
        assert any(type(leaf) is VariableRead
                   and leaf.variable.name == "loss_scale/dynamic_scale"
                   for s in program.steps if type(s) is KernelCall
                   for a in s.inputs for leaf in leaves(a))
        return
    assert plan.host[scale] == gp.WHOLE
    # the scale is the loss scale's variable (read live at each replay: issue 34) or, cast to
    # the loss's dtype, an input of the segment after it (copied in at each replay): never
    # frozen
    out = program.steps[scale].outputs
    scale_slots = set(step_writes(program.steps[scale]))
    assert (isinstance(out, Const) and isinstance(out.value, mp.Variable)) or any(
        scale_slots & set(seg.inputs) for seg in plan.segments if seg.start > scale)


def test_kernels_reading_an_assigned_variable_stay_on_the_host() -> None:
    v = mp.Variable(np.ones(4, np.float32))

    def step(x: Any) -> Any:
        v.assign(mp.ops.exp(mp.ops.add(x, v)))
        return mp.ops.sum(mp.ops.multiply(mp.ops.add(v, x), x))

    program = traced(step, mp.constant(np.arange(4, dtype=np.float32)))
    plan = cuda_rules(program)
    check_cover(program, plan)
    kinds = [type(s).__name__ for s in program.steps]
    assert "Assign" in kinds
    for n, s in enumerate(program.steps):
        if type(s) is Assign:
            assert plan.host[n] == gp.ASSIGN
        elif any(var is v for a in s.inputs for var in gp.variables_read(a)):
            assert "which the program assigns" in plan.host[n]


def test_a_refused_step_splits_its_segment() -> None:
    x = mp.constant(RNG.random((4, 4), dtype=np.float32))
    program = traced(lambda t: mp.ops.sum(mp.ops.tanh(mp.ops.exp(mp.ops.negative(
        mp.ops.square(mp.ops.abs(t)))))), x)
    whole = cuda_rules(program)
    assert [(s.start, s.stop) for s in whole.segments] == [(0, len(program.steps))]
    split = cuda_rules(program, refused={2: "refused while capturing: a test"})
    check_cover(program, split)
    assert [(s.start, s.stop) for s in split.segments] == [(0, 2), (3, len(program.steps))]
    assert split.host == {2: "refused while capturing: a test"}
    # the second segment reads what the first left: the first holds it for the host step,
    # which hands its own result to the second
    assert step_writes(program.steps[1])[0] in split.segments[0].outputs
    assert split.segments[1].inputs == tuple(step_writes(program.steps[2]))
    # the runner then runs the new pieces of the refused segment's steps, in order
    assert split.within(0, len(program.steps)) == split.pieces
    inner = split.within(1, len(program.steps))
    assert inner[0] == 2 and isinstance(inner[1], gp.Segment) and len(inner) == 2
    # refusing next to a border leaves a run too short to capture
    short = cuda_rules(program, refused={1: "x"})
    assert short.host[0] == gp.SHORT


def test_untrusted_kernels_stay_on_the_host() -> None:
    x = mp.constant(RNG.random((4, 4), dtype=np.float32))
    program = traced(lambda t: mp.ops.sum(mp.ops.cast(mp.ops.exp(t), "float16")), x)
    plan = gp.plan(program, trusted=gp.own_kernel(("mpcore_cuda", "mpcore_xp")))
    cast = next(n for n, s in enumerate(program.steps) if s.name == "cast")
    module = program.steps[cast].kernel.__module__
    assert module.startswith("mpcore_cpu") and module in plan.host[cast]


def test_programs_with_nothing_to_capture_say_why() -> None:
    x = mp.constant(np.ones(3, np.float32))
    assert gp.plan(traced(lambda t: t, x)).reason == "the program has no kernel call"
    one = gp.plan(traced(lambda t: mp.ops.exp(t), x))
    assert one.segments == [] and one.reason is not None and gp.SHORT in one.reason
    assert one.summary().startswith("not captured: no run of 2")
    mp.random.set_seed(1)
    drop = traced(lambda t: mp.ops.dropout(t, 0.5), mp.constant(np.ones(64, np.float32)))
    plan = gp.plan(drop)
    assert plan.reason is not None and gp.SEED in plan.reason


def _cpu_replay_matches(runner: Any, fn: Any, x: Any) -> None:
    out = runner([x._data])
    np.testing.assert_array_equal(np.asarray(out), np.asarray(fn(x)))


def test_compile_program_falls_back_to_the_default_replay(monkeypatch: Any) -> None:
    """Where nothing can be captured, or capture is off, the CUDA backend's compile_program
    returns the default replay, saying why (no CuPy needed on this path)."""
    x = mp.constant(np.arange(6, dtype=np.float32))
    single = lambda t: mp.ops.exp(t)  # noqa: E731
    be = CudaBackend()
    replay = be.compile_program(traced(single, x))
    assert replay.captured is False and gp.SHORT in replay.reason
    _cpu_replay_matches(replay, single, x)

    chain = lambda t: mp.ops.sum(mp.ops.exp(mp.ops.negative(t)))  # noqa: E731
    monkeypatch.setenv(graphs.ENV, "0")
    off = be.compile_program(traced(chain, x))
    assert off.captured is False and off.reason == f"{graphs.ENV}=0 turns CUDA graphs off"
    _cpu_replay_matches(off, chain, x)
    monkeypatch.delenv(graphs.ENV)
    monkeypatch.setattr(be, "graphs", False)
    assert "graphs` option is False" in be.compile_program(traced(chain, x)).reason
    monkeypatch.setattr(be, "graphs", True)
    monkeypatch.setenv("CUPY_ENABLE_UMP", "1")
    assert "CUPY_ENABLE_UMP" in be.compile_program(traced(chain, x)).reason


def test_spec_helpers() -> None:
    v = mp.Variable([1.0])
    spec = ListOf((Slot(1), TensorOf(VariableRead(v), None, "float32"),
                   TupleOf((SeedSlot(3), Const(2)))))
    assert gp.spec_kinds(spec) == {ListOf, Slot, TensorOf, VariableRead, TupleOf, SeedSlot, Const}
    assert gp.variables_read(spec) == [v]


def test_a_host_array_constant_is_an_upload_on_the_host() -> None:
    x = mp.constant(np.ones(4, np.float32))
    program = traced(lambda t: mp.ops.add(mp.ops.exp(mp.ops.negative(t)),
                                          mp.constant(np.arange(4.0, dtype=np.float32))), x)
    plan = gp.plan(program)
    upload = next(n for n, s in enumerate(program.steps) if s.name == "asarray")
    assert plan.host[upload] == gp.UPLOAD
    assert gp.host_array(np.zeros(2)) and not gp.host_array(np.float32(1.0))
    assert not gp.host_array(np.zeros(())) and not gp.host_array([1.0, 2.0])


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_host_steps_run_as_the_default_replay(monkeypatch: Any, policy: str) -> None:
    """The runner's host-step interpreter (``graphs._run_step``) on every step of a training
    program, in place of the cpu backend's compile_program: bit for bit the eager steps."""
    from mpcore.tracing.program import plan_frees

    def interpret(program: Program) -> Any:
        plan_frees(program)

        def run(inputs: list[Any]) -> Any:
            env = dict(zip(program.inputs, inputs, strict=True))
            for step in program.steps:
                graphs._run_step(step, env)
            return evaluate(program.output, env)
        return run

    monkeypatch.setattr(mp.get_backend("cpu"), "compile_program", interpret)
    xs = [RNG.random((8, 20), dtype=np.float32) for _ in range(5)]
    ys = [RNG.integers(0, 4, 8) for _ in range(5)]
    results = []
    for traced_step in (False, True):
        model, opt = mlp_and_optimizer(policy)
        step = custom_training_step(model, opt)
        if traced_step:
            step = mp.function(step)
        losses = [float(np.asarray(step(mp.constant(x), mp.constant(y))))
                  for x, y in zip(xs, ys)]
        results.append((losses, model.get_weights()))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_variable_passed_as_an_argument_stays_on_the_host() -> None:
    """A program holds the variables of its call's arguments weakly (``WeakVariableRead``): a graph
    would bake in the array the variable had at the capture, so those kernels stay on the
    host, run as the default replay, which reads the variable at each replay."""
    v = mp.Variable(np.ones(4, np.float32))
    x = mp.constant(np.ones(4, np.float32))
    program = traced(lambda var, t: mp.ops.exp(mp.ops.add(mp.ops.multiply(var, t), t)), v, x)
    multiply = next(n for n, s in enumerate(program.steps) if s.name == "multiply")
    assert type(program.steps[multiply].inputs[0]) is WeakVariableRead
    plan = gp.plan(program, trusted=CPU_OWN)
    assert plan.host[multiply] == ("an argument of kind 'WeakVariableRead', which a graph "
                                   "cannot hold")
