"""Each pass over a typed program, on small programs built by hand: constant folding, weakening,
slot substitution, the frees, the writer (one line per step), the amp op graph, the CPU's
softmax reuse and grouped updates, the CUDA graph plan and OpenCL's operand walk. A pass
builds new steps and never changes the program it was given."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.amp.rewrite import op_graph
from mpcore.tracing.program import (
    NONE,
    Assign,
    Const,
    DictOf,
    KernelCall,
    ListOf,
    Op,
    Program,
    SeedSlot,
    Slot,
    TensorOf,
    TupleOf,
    VariableRead,
    WeakConst,
    WeakVariableRead,
    WholeCall,
    fold_constants,
    plan_frees,
    substituted,
    weakened,
)


def call(name: str, kernel: Any, inputs: tuple[Any, ...], out: Any, constant: bool = False
         ) -> KernelCall:
    return KernelCall(Op(name, kernel), inputs, out, name, constant=constant)


def snapshot(program: Program) -> list[tuple[Any, ...]]:
    """What a pass must leave as it was: each step object and its fields."""
    return [(s, *(getattr(s, f) for f in s.__dataclass_fields__)) for s in program.steps]


def unchanged(program: Program, before: list[tuple[Any, ...]]) -> bool:
    return snapshot(program) == before


def test_fold_constants_runs_constant_calls_once_and_reads_their_results() -> None:
    full = call("full", lambda shape, v: np.full(shape, v, np.float32), (TupleOf((Const(2),)),
                Const(3.0)), Slot(1), constant=True)
    add = call("add", np.add, (Slot(0), Slot(1)), Slot(2))
    program = Program([full, add], 3, [0], Slot(2), ["full", "add"])
    before = snapshot(program)
    folded = fold_constants(program)
    assert unchanged(program, before) and program.folded == set()
    assert folded.folded == {0} and [s.name for s in folded.steps] == ["add"]
    operand = folded.steps[0].inputs[1]
    assert type(operand) is Const and operand.value.tolist() == [3.0, 3.0]
    x = np.ones(2, np.float32)
    assert folded.compile()([x]).tolist() == [4.0, 4.0]
    # nothing constant: the same program back
    assert fold_constants(Program([add], 3, [0, 1], Slot(2))).steps == [add]


def test_weakened_holds_the_calls_arguments_weakly_and_the_rest_as_they_were() -> None:
    class Box:
        pass

    box, var, kept = Box(), mp.Variable(np.ones(2, np.float32)), mp.Variable(np.ones(2))
    steps = [call("id", lambda *a: a[1], (Const(box), VariableRead(var), VariableRead(kept)),
                  Slot(0)),
             Assign(var, Slot(0), "assign var"),
             WholeCall(print, TupleOf((Const(box),)), DictOf((), ()), NONE, "whole")]
    program = Program(steps, 1, [], TupleOf((Slot(0), Const(box))))
    before = snapshot(program)
    weak = weakened(program, {id(box), id(var)})
    assert unchanged(program, before)
    k, a, w = weak.steps
    assert [type(n) for n in k.inputs] == [WeakConst, WeakVariableRead, VariableRead]
    assert isinstance(a.variable, weakref.ref) and a.target() is var
    assert type(w.args.items[0]) is WeakConst and type(weak.output.items[1]) is WeakConst
    out = weak.compile()([])
    assert out[1] is box and np.asarray(var.numpy()).tolist() == [1.0, 1.0]
    del program, steps, before, k, a, w, out
    ref = weakref.ref(box)
    del box
    gc.collect()
    assert ref() is None          # the weak program keeps no argument alive


def test_substituted_and_plan_frees_build_new_steps() -> None:
    neg = call("negative", np.negative, (Slot(0),), Slot(1))
    add = call("add", np.add, (Slot(1), Slot(0)), Slot(2))
    program = Program([neg, add], 3, [0], Slot(2))
    before = snapshot(program)
    sub = substituted(program, [add], {1: Slot(0)}, set())
    assert unchanged(program, before) and sub.steps[0].inputs == (Slot(0), Slot(0))
    plan_frees(program)
    assert program.frees == [(), (1, 0)] and unchanged(program, before)


@pytest.mark.usefixtures("on_cpu")      # (the generic replay's writer)
def test_the_compiled_program_is_one_line_per_step() -> None:
    mp.set_global_policy("float32")
    f = mp.function(lambda x: mp.ops.exp(mp.ops.negative(mp.ops.add(x, x))))
    x = mp.constant(np.ones(3, np.float32))
    f(x)
    runner, = f.runners()
    body = runner.source.splitlines()[1:]
    steps = f.graph.steps
    assert [line.strip().split(" = ")[0] for line in body[1:1 + 2 * len(steps):2]] == [
        f"s{i}" for i in (1, 2, 3)]
    assert len(body) == 1 + 2 * len(steps) + 1          # input, steps and frees, return
    np.testing.assert_array_equal(np.asarray(f(x)), np.exp(-(np.ones(3) * 2)).astype(np.float32))


def test_the_amp_op_graph_links_calls_by_the_slots_they_write_and_read() -> None:
    steps = [call("matmul", None, (Slot(0), Slot(1)), Slot(2)),
             WholeCall(print, TupleOf(()), DictOf((), ()), NONE, "whole"),
             call("softmax", None, (Slot(2), Const(-1)), Slot(3)),
             call("add", None, (ListOf((Slot(3), Slot(2))),), TupleOf((Slot(4), Slot(5))))]
    nodes, at = op_graph(steps)
    assert [(n.op, n.inputs) for n in nodes] == [("matmul", ()), ("softmax", (0,)),
                                                  ("add", (1, 0))]
    assert at == [0, 2, 3]


def test_the_cpu_passes_keep_the_steps_they_do_not_change() -> None:
    from mpcore_cpu.softmax_reuse import reuse_softmax

    kernels = mp.get_backend("cpu").kernels()
    other = call("exp", kernels["exp"], (Slot(1),), Slot(6))
    steps = [call("softmax", kernels["softmax"], (Slot(0), Const(-1)), Slot(2)), other,
             call("sparse_softmax_cross_entropy", kernels["sparse_softmax_cross_entropy"],
                  (Slot(0), Slot(1)), TupleOf((Slot(3), Slot(4)))),
             call("argmax", kernels["argmax"], (Slot(2), Const(1)), Slot(5))]
    program = Program(steps, 7, [0, 1], TupleOf((Slot(5), Slot(6))))
    before = snapshot(program)
    rewritten = reuse_softmax(program)
    assert rewritten is not None and unchanged(program, before)
    assert rewritten.steps[0] is other                    # untouched: the same node
    assert rewritten.steps[2].inputs[0] == Slot(4)


def test_the_cuda_plan_reads_the_node_types() -> None:
    from mpcore_cuda import graph_plan as gp

    k = lambda *a: None  # noqa: E731
    seeded = call("dropout_mask", k, (Slot(0), SeedSlot(1)), Slot(2))
    weak = call("exp", k, (WeakConst(weakref.ref(k)),), Slot(3))
    tensor = call("exp", k, (TensorOf(Slot(0), None, "float32"),), Slot(4))
    host = call("add", k, (Slot(0), Const(np.ones(3))), Slot(5))
    reason = [gp.step_reason(s, set(), {}, lambda s: True) for s in (seeded, weak, tensor, host)]
    assert reason == [gp.SEED, "an argument of kind 'WeakConst', which a graph cannot hold",
                      None, gp.UPLOAD]


def test_opencl_walks_a_calls_operands_through_lists_only() -> None:
    pytest.importorskip("pyopencl")
    from mpcore_opencl import replay

    var = mp.Variable(np.ones(2, np.float32))
    out: list[Any] = []
    replay._leaves(ListOf((Slot(0), TupleOf((VariableRead(var), Const(2))))), ["a", ("b", 2)],
                   out)
    assert out == [(Slot(0), "a"), (VariableRead(var), "b"), (Const(2), 2)]
    assert replay._key(Slot(3)) == Slot(3)
    assert replay._key(VariableRead(var)) == replay._key(VariableRead(var))
    for node, value, why in [(TensorOf(Slot(0), None, "float32"), None, "'TensorOf'"),
                             (ListOf((SeedSlot(1),)), [3], "'SeedSlot'"),
                             (ListOf((Slot(0),)), 5, "not a list")]:
        with pytest.raises(replay._RefusedError, match=why):
            replay._leaves(node, value, [])
