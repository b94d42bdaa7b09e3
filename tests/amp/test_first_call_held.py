"""What the rewrite's pre-pass copies to put back (``mpcore.tracing.effects.HeldEffects``): the
variables the step writes, each just before its first write, and nothing else; every variable
still, where a call kept whole may write any. The first call must stay what
``test_first_call.py`` holds it to (a painted step, applied once): dropping any written
variable from the copies breaks those tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import test_first_call as first_call
from amp_models import X, Y, float32_model, rewrite_off  # noqa: F401 - rewrite_off: autouse
from conftest import custom_training_step

import mpcore as mp
from mpcore.core.tensor import Variable, live_variables
from mpcore.tracing import effects
from mpcore.tracing.program import IN_PLACE, Assign, KernelCall, VariableRead, leaves

enable = mp.mixed_precision.enable_mixed_precision_graph_rewrite


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[effects.HeldEffects]]:
    """The HeldEffects of each pre-pass from now on, as its state is put back."""
    seen: list[effects.HeldEffects] = []
    restore = effects.HeldEffects.restore

    def spy(self: effects.HeldEffects, watch: Any) -> bool:
        seen.append(self)
        return restore(self, watch)

    monkeypatch.setattr(effects.HeldEffects, "restore", spy)
    yield seen


def _written(program: Any) -> set[Variable]:
    """The variables a program writes: its assignments' and its in-place kernels' operands."""
    out: set[Variable] = set()
    for step in program.steps:
        if type(step) is Assign:
            out.add(step.variable)
        elif type(step) is KernelCall and step.name in IN_PLACE:
            out.update(leaf.variable for node in step.inputs for leaf in leaves(node)
                       if type(leaf) is VariableRead)
    return out


def _nbytes(arrays: Any) -> int:
    return sum(int(a.nbytes) for a in arrays)


def _guide(inner: str, how: str) -> tuple[Callable[[], Any], Any, mp.Model]:
    """The guide's model under the rewrite with ``inner`` (built, so the step creates no
    variable), and its first step: ``fit``'s (train_on_batch) or the guide's custom loop."""
    model = float32_model()
    opt = enable(mp.optimizers.get(inner), dtype="float16")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    model(X[:1])
    opt.build(model.trainable_variables)
    if how == "fit":
        return (lambda: model.train_on_batch(X, Y)), (lambda: model.train_function), model
    step = mp.function(custom_training_step(model, opt))
    x, y = mp.constant(X), mp.constant(Y)
    return (lambda: step(x, y)), (lambda: step), model


@pytest.mark.parametrize("inner, how", [("rmsprop", "fit"), ("adam", "custom"),
                                        ("sgd", "fit")])
def test_the_copies_are_the_variables_the_step_writes(
        inner: str, how: str, held: list[effects.HeldEffects]) -> None:
    first, fn, model = _guide(inner, how)
    before = {v: v.numpy() for v in live_variables()}
    first()
    assert fn().tracing_count == 1 and len(held) == 1
    saved = {variable: copy for variable, copy in held[0].saved.values()}
    assert held[0].copied_all is None
    written = _written(fn().graph)
    # (weights, optimizer slots and step count, the loss scale, the metrics' totals)
    assert set(model.trainable_variables) < written
    assert set(saved) == written
    assert _nbytes(saved.values()) == _nbytes(v.data for v in written)
    # and no variable the first call changed went without a copy
    changed = {v for v, old in before.items() if not np.array_equal(old, v.numpy())}
    assert changed and changed <= set(saved)


def test_an_unrelated_large_variable_is_not_copied(held: list[effects.HeldEffects]) -> None:
    big = Variable(np.ones((1024, 1024), np.float32), name="unrelated")   # 4 MiB
    array = big.data
    first, _, _ = _guide("rmsprop", "fit")
    first()
    assert any(v is big for v in live_variables()) and len(held) == 1
    copies = held[0].saved
    assert id(big) not in copies
    assert _nbytes(c for _, c in copies.values()) < big.data.nbytes // 100
    assert big.data is array                      # put back by nobody: never touched


class _KeptWholeSGD(mp.optimizers.SGD):
    """Names no ``_recorded_hyperparameters``: its update is kept whole, unrecorded."""


def test_a_call_kept_whole_copies_every_variable(held: list[effects.HeldEffects]) -> None:
    big = Variable(np.ones((256, 256), np.float32), name="unrelated")
    model = float32_model()
    opt = enable(_KeptWholeSGD(0.1, momentum=0.9), dtype="bfloat16")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt)
    model(X[:1])
    opt.build(model.trainable_variables)
    weights, state = model.get_weights(), opt.get_state(model.trainable_variables)
    model.train_on_batch(X, Y)
    fn = model.train_function
    assert fn.tracing_count == 1 and "[kept whole]" in str(fn.graph)
    assert held[0].copied_all == "a call kept whole" and id(big) in held[0].saved
    after = model.get_weights(), opt.get_state(model.trainable_variables)
    # the first call was one painted step: a replay from the same state agrees
    model.set_weights(weights)
    opt.set_state(model.trainable_variables, state)
    model.train_on_batch(X, Y)
    assert fn.tracing_count == 1 and opt.iterations == 1
    for a, b in zip(after[0], model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert after[1]["loss_scale_state"] == opt.get_state(model.trainable_variables)[
        "loss_scale_state"]


_FORGOTTEN: dict[str, Callable[[Variable], bool]] = {
    "a weight": lambda v: v.trainable,
    "an optimizer slot": lambda v: v.name.endswith("/velocity"),
    "the loss scale's counters": lambda v: v.name.endswith("loss_scale/counters"),
    "the step count (assigned)": lambda v: v.name.endswith("/iterations"),
}


@pytest.mark.parametrize("dtype, inner, dropout, forgotten", [
    ("float16", "rmsprop", False, "a weight"),
    ("float16", "rmsprop", False, "an optimizer slot"),
    ("float16", "adam", True, "the loss scale's counters"),
    ("bfloat16", "sgd", True, "the step count (assigned)"),
])
def test_the_first_call_tests_fail_if_a_written_variable_is_not_put_back(
        dtype: str, inner: str, dropout: bool, forgotten: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant of HeldEffects that forgets one variable the step writes: the first-call test
    that compares the first call to a replay of its painted program sees it."""
    restore = effects.HeldEffects.restore
    forgot: list[str] = []
    which = _FORGOTTEN[forgotten]

    def forgetful(self: effects.HeldEffects, watch: Any) -> bool:
        key = next((k for k, (v, _) in self.saved.items() if which(v)), None)
        if key is not None:
            forgot.append(self.saved.pop(key)[0].name)
        return restore(self, watch)

    monkeypatch.setattr(effects.HeldEffects, "restore", forgetful)
    with pytest.raises(AssertionError):
        first_call.test_the_first_train_step_is_painted_and_applied_once(
            dtype, inner, dropout, mp.get_backend("cpu"))
    assert len(forgot) == 1


def test_variables_a_call_kept_whole_makes_are_copied_as_made(
        held: list[effects.HeldEffects]) -> None:
    """Its slots, made by the first update inside the call kept whole, which no trace sees
    writing them: copied as they are made (put back to their first value)."""
    model = float32_model()
    opt = enable(_KeptWholeSGD(0.1, momentum=0.9), dtype="bfloat16")
    model(X[:1])
    step = mp.function(custom_training_step(model, opt))
    alive = {id(v): v for v in live_variables()}   # (held: their ids stay theirs)
    step(mp.constant(X), mp.constant(Y))
    made = [v for v, _ in held[0].saved.values() if id(v) not in alive]
    assert made and all(v.name.endswith("/momentum") for v in made)
    assert len(made) == len(model.trainable_variables)
