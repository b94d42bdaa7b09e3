"""Policies as Keras 3's ``DTypePolicy`` and the TF 2.1-2.3 guide spell them (issue 33, item 7):
``DTypePolicy(None)`` takes the global policy, any dtype name is a policy, and the old names
(``mp.mixed_precision.experimental``, ``mp.train.experimental``) are the same objects. Cases
ported from Keras 3's ``keras/src/dtype_policies/dtype_policy_test.py`` ("Keras 3") name the
case they come from."""

from __future__ import annotations

import pickle

import pytest

import mpcore as mp
from mpcore import mixed_precision

DTypePolicy = mixed_precision.DTypePolicy


def test_dtype_policy_is_keras_3s_name() -> None:
    assert DTypePolicy is mp.Policy is mp.DTypePolicy


@pytest.mark.parametrize("name, compute, variable", [
    ("float32", "float32", "float32"), ("float16", "float16", "float16"),
    ("bfloat16", "bfloat16", "bfloat16"), ("mixed_float16", "float16", "float32"),
    ("mixed_bfloat16", "bfloat16", "float32")])
def test_initialization_from_global(name: str, compute: str, variable: str) -> None:
    """Keras 3 test_initialization_from_global: DTypePolicy(name=None) is the global one's."""
    mp.set_global_policy(name)
    for policy in (DTypePolicy(name=None), DTypePolicy(None), DTypePolicy()):
        assert (policy.name, policy.compute_dtype, policy.variable_dtype) == (name, compute,
                                                                              variable)


def test_none_takes_the_policy_of_a_scope() -> None:
    with mp.policy_scope("mixed_bfloat16"):
        assert DTypePolicy(None).name == "mixed_bfloat16"
    assert DTypePolicy(None).name == "float32"


@pytest.mark.parametrize("name", ["uint8", "int32", "int64", "float64", "bool"])
def test_properties_of_any_dtype_name(name: str) -> None:
    """Keras 3 test_properties_uint8, for every dtype mpcore names."""
    policy = DTypePolicy(name)
    assert (policy.name, policy.compute_dtype, policy.variable_dtype) == (name, name, name)
    assert policy.loss_scale is None and not policy.is_mixed
    assert repr(policy) == f'<Policy "{name}">'
    assert DTypePolicy.from_config(policy.get_config()) == policy
    assert pickle.loads(pickle.dumps(policy)) == policy


def test_an_integer_policy_keeps_integer_inputs_and_refuses_a_loss_scale() -> None:
    assert DTypePolicy("int32").compute_dtype_for("int64") == "int64"
    with pytest.raises(ValueError, match="policy 'int32' computes in int32, which has no "
                                         "gradients to scale"):
        DTypePolicy("int32", loss_scale="dynamic")


def test_properties_mixed() -> None:
    """Keras 3 test_properties_mixed_float16, test_properties_mixed_bfloat16."""
    assert (DTypePolicy("mixed_float16").compute_dtype,
            DTypePolicy("mixed_float16").variable_dtype) == ("float16", "float32")
    assert (DTypePolicy("mixed_bfloat16").compute_dtype,
            DTypePolicy("mixed_bfloat16").variable_dtype) == ("bfloat16", "float32")


@pytest.mark.parametrize("name", ["invalid_name", "", "@mixed_float16!", "mixed_float16" * 100,
                                  "mixed_float15", "mixed_int32"])
def test_invalid_names_say_what_is_valid(name: str) -> None:
    """Keras 3 test_initialization_invalid_name and the edge cases (empty, special characters,
    very long, almost valid): the error names the valid choices."""
    with pytest.raises(ValueError, match=r"unknown policy .*valid names: float16, .*"
                                         r"mixed_bfloat16, mixed_float8, or another dtype "
                                         r"name \(int8"):
        DTypePolicy(name)


def test_initialization_non_string_name() -> None:
    """Keras 3 test_initialization_non_string_name."""
    with pytest.raises(TypeError, match="policy name must be a string"):
        DTypePolicy(123)  # type: ignore[arg-type]


def test_eq() -> None:
    """Keras 3 test_eq."""
    assert DTypePolicy("mixed_bfloat16") == DTypePolicy("mixed_bfloat16")
    assert DTypePolicy("mixed_bfloat16") != DTypePolicy("mixed_float16")
    assert DTypePolicy("int32") != DTypePolicy("float32")


def test_set_policy_multiple_times() -> None:
    """Keras 3 test_set_policy_multiple_times (and mpcore's None, the DESIGN's reset)."""
    mp.set_global_policy("mixed_float16")
    assert mp.global_policy().name == "mixed_float16"
    mp.set_global_policy("float32")
    assert mp.global_policy().name == "float32"
    mp.set_global_policy("int32")
    assert mp.global_policy().name == "int32"
    mp.set_global_policy(None)
    assert mp.global_policy().name == "float32"


def test_the_tf_2_1_guides_names() -> None:
    """``from tensorflow.keras.mixed_precision import experimental as mixed_precision`` of the
    TF 2.1-2.3 guide, with ``import mpcore as mp`` in its place."""
    from mpcore.mixed_precision import experimental as old

    assert old is mp.mixed_precision.experimental
    assert old.Policy is mp.Policy and old.LossScaleOptimizer is mp.LossScaleOptimizer
    policy = old.Policy("mixed_float16", loss_scale="dynamic")
    old.set_policy(policy)
    assert old.global_policy() is policy and mp.global_policy() is policy
    opt = old.LossScaleOptimizer(mp.optimizers.SGD(), loss_scale="dynamic")
    assert opt.dynamic
    assert old.DynamicLossScale is mp.DynamicLossScale
    assert old.FixedLossScale is mp.FixedLossScale


def test_tf_train_experimental_graph_rewrite_alias() -> None:
    """``tf.train.experimental.enable_mixed_precision_graph_rewrite`` of TF 1.14-2.3."""
    rewrite = mp.train.experimental
    assert (rewrite.enable_mixed_precision_graph_rewrite
            is mp.mixed_precision.enable_mixed_precision_graph_rewrite)
    assert (rewrite.disable_mixed_precision_graph_rewrite
            is mp.mixed_precision.disable_mixed_precision_graph_rewrite)
    opt = rewrite.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD())
    try:
        assert isinstance(opt, mp.LossScaleOptimizer)
    finally:
        rewrite.disable_mixed_precision_graph_rewrite()
