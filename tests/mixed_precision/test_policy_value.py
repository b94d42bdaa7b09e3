"""Policy as a pure value: a frozen dataclass that owns the input-cast rule and loads nothing of
the hardware; setting the global policy (the Keras-style module) is what logs the check."""

from __future__ import annotations

import dataclasses
import logging

import pytest

import mpcore as mp
from mpcore import layers, mixed_precision
from mpcore.core import dtypes
from mpcore.mixed_precision import policy, verdict
from mpcore.mixed_precision.policy import POLICIES


def test_policy_is_a_frozen_dataclass() -> None:
    p = mp.Policy("mixed_bfloat16")
    assert dataclasses.is_dataclass(p)
    names = {f.name for f in dataclasses.fields(p)}
    assert {"name", "loss_scale", "compute_dtype", "variable_dtype"} <= names
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.compute_dtype = "float32"  # type: ignore[misc]


def test_a_dynamic_scale_s_running_state_does_not_change_equality() -> None:
    p = mp.Policy("mixed_float16")
    before = hash(p)
    p.loss_scale.update(False)  # halves the scale: state, not config
    assert p.loss_scale() == 2.0**14
    assert p == mp.Policy("mixed_float16") and hash(p) == before


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("dtype", dtypes.ALL)
def test_floating_inputs_take_the_compute_dtype_and_others_keep_theirs(name: str,
                                                                      dtype: str) -> None:
    p = mp.Policy(name)
    expected = p.compute_dtype if dtype in dtypes.FLOATING else dtype
    assert p.compute_dtype_for(dtype) == expected


class _Identity(layers.Layer):
    def call(self, inputs: object) -> object:
        return inputs


def test_layers_cast_their_inputs_by_the_policy_s_rule() -> None:
    layer = _Identity(dtype="mixed_bfloat16")
    out = layer([mp.constant([1.0, 2.0]), mp.constant([1, 2], dtype="int32"),
                 mp.constant([1.0], dtype="float64")])
    assert [t.dtype for t in out] == ["bfloat16", "int32", "bfloat16"]
    assert mp.Model._autocast is False  # a model leaves the casting to its layers


def test_setting_the_policy_state_alone_logs_nothing(caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdict, "_logged", set())
    caplog.set_level(logging.INFO, logger="mpcore")
    assert policy.set_global("mixed_float16") == mp.Policy("mixed_float16")
    assert mp.global_policy().name == "mixed_float16"
    assert not [r for r in caplog.records if "compatibility check" in r.getMessage()]
    mixed_precision.set_global_policy("mixed_float16")
    assert [r for r in caplog.records if "compatibility check" in r.getMessage()]
    assert mp.set_global_policy is mixed_precision.set_global_policy
    assert mp.set_policy is mixed_precision.set_policy


def test_the_loss_scale_optimizer_loads_on_first_use() -> None:
    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    assert mixed_precision.LossScaleOptimizer is LossScaleOptimizer
    assert "LossScaleOptimizer" in mixed_precision.__all__
    with pytest.raises(AttributeError, match="no_such_name"):
        mixed_precision.no_such_name  # noqa: B018
