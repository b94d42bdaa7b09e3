"""The painting pass on graphs ported from TensorFlow's ``auto_mixed_precision_test.cc``
(``tensorflow/core/grappler/optimizers``): which op ends in 16 bits. Each test names the TF
test it comes from; TF's node names are kept (allowN, denyN, inferN, clrN), with an mpcore op
of the same category in place of TF's (MatMul -> matmul, Exp -> exp, Relu -> relu, Sqrt ->
sqrt, Tanh -> tanh, Log (an infer op in that test) -> sqrt, SparseMatMul (deny) -> softmax,
ShapeN / IdentityN (clear) -> reshape, AddN (infer) -> add). TF's Identity fetch nodes are
left out: they are not painted."""

from __future__ import annotations

import pytest

from mpcore.amp.lists import AutoMixedPrecisionLists
from mpcore.amp.painting import OpNode, paint


def _paint(spec: list[tuple[str, str, list[str]]], **kw: object) -> dict[str, bool]:
    """{name: painted 16-bit} for nodes given as (name, op, input names); names not in the
    graph (TF's constants and placeholders) are graph inputs."""
    index = {name: i for i, (name, _, _) in enumerate(spec)}
    preserve = set(kw.pop("preserve", ()))  # type: ignore[call-overload]
    dtypes = dict(kw.pop("dtypes", {}))  # type: ignore[call-overload]
    nodes = [OpNode(op, tuple(index[i] for i in ins if i in index), dtypes.get(name, "float32"),
                    name, name in preserve) for name, op, ins in spec]
    painting = paint(nodes, kw.pop("lists", AutoMixedPrecisionLists()))  # type: ignore[arg-type]
    return {name: painting.low[i] for name, i in index.items()}


def test_no_op() -> None:
    """TF: AutoMixedPrecisionTest.NoOp: no allow op, nothing changes."""
    low = _paint([("deny1", "exp", ["input"]), ("clr1", "relu", ["deny1"]),
                  ("infer1", "sqrt", ["clr1"]), ("clr2", "relu", ["infer1"])])
    assert not any(low.values())


def test_simple() -> None:
    """TF: AutoMixedPrecisionTest.Simple."""
    low = _paint([
        ("deny1", "exp", ["input"]), ("clr1", "relu", ["deny1"]),
        ("infer1", "sqrt", ["clr1"]), ("clr2", "relu", ["infer1"]),
        ("allow1", "matmul", ["clr2", "clr2"]), ("clr3", "relu", ["allow1"]),
        ("infer2", "sqrt", ["clr3"]), ("clr4", "relu", ["infer2"]),
        ("deny2", "softmax", ["clr4", "clr4"]), ("clr5", "relu", ["deny2"])])
    assert low == {"deny1": False, "clr1": False, "infer1": False, "clr2": True,
                   "allow1": True, "clr3": True, "infer2": False, "clr4": False,
                   "deny2": False, "clr5": False}


def test_bidirectional_clear_chain() -> None:
    """TF: AutoMixedPrecisionTest.BidirectionalClearChain: allow spreads through clear ops
    upstream and then downstream."""
    low = _paint([
        ("clr1", "relu", ["input"]), ("clr2", "relu", ["input"]),
        ("allow1", "matmul", ["clr1", "clr1"]), ("clr3", "reshape", ["clr1", "clr2"]),
        ("clr4", "relu", ["clr2"])])
    assert all(low.values())


def test_preserve_fetches() -> None:
    """TF: AutoMixedPrecisionTest.PreserveFetches: fetched nodes stay float32."""
    low = _paint([
        ("allow1", "matmul", ["input", "input"]), ("clr1", "relu", ["allow1"]),
        ("infer1", "sqrt", ["clr1"]), ("deny1", "exp", ["infer1"]),
        ("clr2", "relu", ["deny1"]), ("allow2", "matmul", ["clr2", "clr2"]),
        ("clr3", "relu", ["allow2"]), ("deny2", "exp", ["clr3"]),
        ("clr4", "relu", ["deny2"])], preserve={"allow1", "clr2", "clr3"})
    assert low == {"allow1": False, "clr1": False, "infer1": False, "deny1": False,
                   "clr2": False, "allow2": True, "clr3": False, "deny2": False,
                   "clr4": False}


def test_already_16_bit_ops_are_not_processed() -> None:
    """TF: AutoMixedPrecisionTest.AlreadyFp16: only float32 ops are painted; a float32 relu
    after the existing cast back to float32 stays float32."""
    low = _paint([
        ("cst1", "cast", ["input"]), ("allow1", "matmul", ["cst1", "cst1"]),
        ("clr1", "relu", ["allow1"]), ("cst2", "cast", ["clr1"]), ("clr2", "relu", ["cst2"])],
        dtypes={"cst1": "float16", "allow1": "float16", "clr1": "float16"})
    assert low == {"cst1": False, "allow1": False, "clr1": False, "cst2": False,
                   "clr2": False}


def test_repeated_and_list_type_attrs() -> None:
    """TF: AutoMixedPrecisionTest.RepeatedAndListTypeAttrs: a clear op fed three times by one
    allow op and an infer op between allow ops."""
    low = _paint([
        ("allow1", "matmul", ["input", "input"]), ("clr1", "reshape", ["allow1"]),
        ("infer1", "add", ["clr1", "clr1", "clr1"]), ("allow2", "matmul", ["infer1"])])
    assert all(low.values())


@pytest.mark.parametrize("infer", ["tanh", "sqrt", "sigmoid", "square"])
def test_simple_unary_infer_op(infer: str) -> None:
    """TF: AutoMixedPrecisionTest's TestSimpleUnaryInferOp (Sqrt, Tanh, Sigmoid, Square ...):
    an infer op between two allow ops goes to 16 bits."""
    low = _paint([("allow1", "matmul", ["input", "eye"]), ("infer1", infer, ["allow1"]),
                  ("allow2", "matmul", ["infer1", "eye"])])
    assert low == {"allow1": True, "infer1": True, "allow2": True}


def test_deny_propagates_forward_to_the_last_infer_op() -> None:
    """TF's comment on PropagateDenyFwdThroughClearAndInfer: deny -> infer -> clear -> infer
    -> clear -> allow -> infer becomes deny deny deny deny, clear, allow, infer; the clear op
    before the allow op is then painted by PropagateAllowThroughClear."""
    spec = [("deny", "exp", ["input"]), ("infer1", "sqrt", ["deny"]),
            ("clr1", "relu", ["infer1"]), ("infer2", "tanh", ["clr1"]),
            ("clr2", "relu", ["infer2"]), ("allow", "matmul", ["clr2"]),
            ("infer3", "tanh", ["allow"])]
    nodes = [OpNode(op, tuple(i for i, (n, _, _) in enumerate(spec) if n in ins), "float32",
                    name) for name, op, ins in spec]
    painting = paint(nodes, AutoMixedPrecisionLists())
    assert painting.low == (False, False, False, False, True, True, False)
    assert painting.reasons[2] == "deny propagated forward from deny"
    assert painting.reasons[4] == "clear op connected to 16-bit allow"
    assert painting.reasons[6] == "infer op not between allow ops: float32"


def test_edited_lists_change_the_painting() -> None:
    """exp moved to the allowlist and relu taken off the clearlist: relu then stays float32."""
    lists = AutoMixedPrecisionLists().edit(allowlist_add=["exp"], clearlist_remove=["relu"])
    low = _paint([("deny1", "exp", ["input"]), ("clr1", "relu", ["deny1"]),
                  ("allow1", "matmul", ["clr1"])], lists=lists)
    assert low == {"deny1": True, "clr1": False, "allow1": True}
