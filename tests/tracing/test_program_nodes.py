"""The typed program's nodes (mpcore.tracing.program_nodes) and the one walker every pass
uses: leaves, reads, fold/unfold (evaluate, bind, the writer's source), mapped,
constant-ness; nodes are frozen, and a pass builds new ones."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpcore as mp
from mpcore.core.categories import DENY, INFER
from mpcore.tracing.program import (
    NONE,
    Assign,
    Const,
    DictOf,
    KernelCall,
    Leaf,
    ListOf,
    Node,
    Op,
    Program,
    ProgramWriter,
    SeedSlot,
    Slot,
    TensorOf,
    TupleOf,
    VariableRead,
    WeakConst,
    WeakVariableRead,
    WholeCall,
    bind,
    constant,
    evaluate,
    leaves,
    mapped,
    reads,
    step_reads,
    step_writes,
    walk,
)

VAR = mp.Variable(np.arange(3, dtype=np.float32))


# --- a reference: the walks written out on a plain description of the tree --------------------
# A tree is drawn as a plain structure and turned into nodes; the reference walks the plain one.
def _leaf() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(lambda i: ("slot", i), st.integers(0, 20)),
        st.builds(lambda i: ("seed", i), st.integers(0, 20)),
        st.builds(lambda v: ("const", v), st.one_of(st.none(), st.integers(), st.floats(
            allow_nan=False), st.text(max_size=3), st.booleans())),
        st.just(("var",)),
    )


TREES = st.recursive(_leaf(), lambda inner: st.one_of(
    st.builds(lambda xs: ("list", xs), st.lists(inner, max_size=4)),
    st.builds(lambda xs: ("tuple", xs), st.lists(inner, max_size=4)),
    st.builds(lambda d: ("dict", d), st.dictionaries(st.text("abc", max_size=2), inner,
                                                     max_size=3)),
    st.builds(lambda x: ("tensor", x), inner),
), max_leaves=12)


def to_node(tree: Any) -> Node:
    kind = tree[0]
    if kind == "slot":
        return Slot(tree[1])
    if kind == "seed":
        return SeedSlot(tree[1])
    if kind == "const":
        return Const(tree[1])
    if kind == "var":
        return VariableRead(VAR)
    if kind == "tensor":
        return TensorOf(to_node(tree[1]), "backend", "float32")
    if kind == "dict":
        return DictOf(tuple(tree[1]), tuple(to_node(v) for v in tree[1].values()))
    items = tuple(to_node(t) for t in tree[1])
    return ListOf(items) if kind == "list" else TupleOf(items)


def ref_leaves(tree: Any) -> list[Any]:
    kind = tree[0]
    if kind == "tensor":
        return ref_leaves(tree[1])
    if kind == "dict":
        return [leaf for t in tree[1].values() for leaf in ref_leaves(t)]
    if kind in ("list", "tuple"):
        return [leaf for t in tree[1] for leaf in ref_leaves(t)]
    return [tree]


def ref_value(tree: Any, env: dict[int, Any]) -> Any:
    kind = tree[0]
    if kind in ("slot", "seed"):
        return env[tree[1]]
    if kind == "const":
        return tree[1]
    if kind == "var":
        return "VAR's array"
    if kind == "tensor":
        return ("T", ref_value(tree[1], env))
    if kind == "dict":
        return {k: ref_value(t, env) for k, t in tree[1].items()}
    items = [ref_value(t, env) for t in tree[1]]
    return items if kind == "list" else tuple(items)


def plain(value: Any) -> Any:
    """A value evaluate gave, with its tensors as ("T", array) (comparable to ref_value)."""
    if value is VAR._data:
        return "VAR's array"
    if isinstance(value, mp.Tensor):
        return ("T", plain(value._data))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return value


@settings(max_examples=200, deadline=None)
@given(TREES)
def test_leaves_reads_and_evaluate_equal_the_reference(tree: Any) -> None:
    node = to_node(tree)
    want = ref_leaves(tree)
    assert leaves(node) == [to_node(t) for t in want]
    assert reads(node) == [t[1] for t in want if t[0] in ("slot", "seed")]
    assert all(isinstance(n, Node) for n in walk(node))
    assert sum(isinstance(n, Leaf) for n in walk(node)) == len(want)
    env = {i: f"array{i}" for i in range(21)}
    assert plain(evaluate(node, env)) == ref_value(tree, env)
    # mapped with the identity rebuilds an equal tree; a slot shift moves every read
    assert mapped(node, lambda leaf: leaf) == node
    shifted = mapped(node, lambda leaf: Slot(leaf.index + 100) if type(leaf) is Slot else leaf)
    assert reads(shifted) == [t[1] + (100 if t[0] == "slot" else 0) for t in want
                              if t[0] in ("slot", "seed")]


@settings(max_examples=100, deadline=None)
@given(TREES)
def test_the_writers_source_computes_what_evaluate_does(tree: Any) -> None:
    node = to_node(tree)
    writer = ProgramWriter(Program([], 0, [], node))
    source = writer.expr(node)
    env = {i: f"array{i}" for i in range(21)}
    names = dict(writer.names, **{f"s{i}": v for i, v in env.items()})
    assert plain(eval(source, names)) == plain(evaluate(node, env))


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.builds(lambda i: ("slot", i), st.integers(0, 9)), lambda inner: st.one_of(
    st.builds(lambda xs: ("list", xs), st.lists(inner, max_size=3)),
    st.builds(lambda xs: ("tuple", xs), st.lists(inner, max_size=3)),
    st.builds(lambda x: ("tensor", x), inner)), max_leaves=8))
def test_bind_puts_each_part_in_its_slot(tree: Any) -> None:
    node = to_node(tree)

    def value_of(t: Any) -> Any:
        if t[0] == "slot":
            return f"v{t[1]}"
        if t[0] == "tensor":
            return mp.Tensor(value_of(t[1]), None, "float32")
        items = [value_of(x) for x in t[1]]
        return items if t[0] == "list" else tuple(items)

    env: dict[int, Any] = {}
    bind(node, value_of(tree), env)
    assert env == {t[1]: f"v{t[1]}" for t in ref_leaves(tree)}


def test_constant_is_python_values_and_known_slots_in_lists_and_tuples() -> None:
    assert constant(TupleOf((Const(1), Const("x"), ListOf((Const(None), Slot(3))))), {3})
    assert not constant(Slot(3), set())
    for node in (Const(np.ones(2)), VariableRead(VAR), SeedSlot(0),
                 TensorOf(Const(1), None, "float32"), DictOf(("a",), (Const(1),))):
        assert not constant(node, {0})


def test_const_compares_as_a_tuple_would() -> None:
    a = np.ones(3)
    assert Const(a) == Const(a) and Const(1) == Const(True) and Const(1) in (Const(-1), Const(1))
    assert Const(1) != Slot(1) and Slot(1) == Slot(1) and hash(Slot(2)) == hash(Slot(2))
    assert VariableRead(VAR) == VariableRead(VAR)
    assert VariableRead(VAR) != VariableRead(mp.Variable(VAR.numpy()))
    with pytest.raises(TypeError):
        hash(Const([1]))


def _steps() -> list[Any]:
    call = KernelCall(Op("add", np.add), (Slot(0), Const(1.0)), Slot(1), "add", "float32")
    whole = WholeCall(print, TupleOf((Slot(1),)), DictOf(("sep",), (Const(""),)), NONE, "w")
    assign = Assign(VAR, Slot(1), "assign")
    return [call, whole, assign]


@pytest.mark.parametrize("node", [
    Const(1), Slot(0), SeedSlot(0), VariableRead(VAR), WeakConst(weakref.ref(VAR)),
    WeakVariableRead(weakref.ref(VAR)), TensorOf(Slot(0), None, "float32"),
    ListOf((Slot(0),)), TupleOf(()), DictOf((), ()), Op("add", np.add), *_steps(),
], ids=lambda n: type(n).__name__)
def test_every_node_is_frozen(node: Any) -> None:
    field = dataclasses.fields(node)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(node, field, None)


def test_steps_say_what_they_read_and_write_and_are_rebuilt_not_changed() -> None:
    call, whole, assign = _steps()
    assert [step_reads(s) for s in (call, whole, assign)] == [[0], [1], [1]]
    assert [step_writes(s) for s in (call, whole, assign)] == [[1], [], []]
    assert (call.name, call.kernel, call.dtype, call.category, call.constant) == (
        "add", np.add, "float32", None, False)
    moved = call.with_operands(lambda n: Slot(5) if n == Slot(0) else n)
    assert moved is not call and moved.inputs == (Slot(5), Const(1.0)) and call.inputs[0] == Slot(0)
    assert moved.op is call.op and moved.text == call.text
    assert whole.with_operands(lambda n: n).operands == whole.operands
    assert assign.with_operands(lambda n: Slot(7)).value == Slot(7)
    env = {0: np.float32(2.0)}
    call.run(env)
    assert env[1] == 3.0


def test_a_recorded_call_carries_its_category_and_constant_ness() -> None:
    mp.set_global_policy("float32")
    f = mp.function(lambda x: mp.ops.add(x, mp.ops.exp(mp.ops.full((2,), 0.5))))
    x = mp.constant(np.ones(2, np.float32))
    f(x)
    calls = [s for s in f.graph.steps if type(s) is KernelCall]
    by_name = {s.name: s for s in calls}
    assert by_name["exp"].category is DENY and by_name["add"].category is INFER
    assert by_name["full"].constant and by_name["exp"].constant and not by_name["add"].constant
    assert by_name["add"].dtype == "float32"
    assert str(by_name["exp"].category.value) in by_name["exp"].text
