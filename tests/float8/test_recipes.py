"""Scaling recipes, the mixed_float8 policy and its verdicts: values, configs, errors that name
the valid choices, and honest "emulated" reasons per device (pure functions)."""

from __future__ import annotations

import pickle

import pytest
from mpcore_cpu.rules import cpu_policy_support
from mpcore_cuda.rules import compatibility_check, cuda_policy_support

import mpcore as mp
from mpcore.core.backend import Device
from mpcore.mixed_precision import CurrentScaling, DelayedScaling, recipes


def test_defaults_follow_transformer_engine() -> None:
    # transformer_engine/common/recipe/__init__.py: DelayedScaling(margin=0, HYBRID, 1024, "max")
    d = DelayedScaling()
    assert (d.amax_history_len, d.amax_compute_algo, d.margin, d.format) == (1024, "max", 0,
                                                                           "hybrid")
    assert (d.forward_format, d.backward_format, d.power_of_two_scales) == ("e4m3", "e5m2",
                                                                            False)
    c = CurrentScaling()
    assert (c.format, c.power_of_two_scales, c.margin, c.amax_history_len) == ("hybrid", True,
                                                                               0, 1)
    assert CurrentScaling(format="e4m3").backward_format == "e4m3"


@pytest.mark.parametrize("recipe", [CurrentScaling(), CurrentScaling("e4m3", False, 3),
                                    DelayedScaling(), DelayedScaling(16, "most_recent", 2,
                                                                     "e4m3")])
def test_configs_round_trip(recipe: object) -> None:
    assert type(recipe).from_config(recipe.get_config()) == recipe  # type: ignore[attr-defined]
    assert recipes.get(recipes.serialize(recipe)) == recipe  # type: ignore[arg-type]
    assert pickle.loads(pickle.dumps(recipe)) == recipe


@pytest.mark.parametrize(("make", "message"), [
    (lambda: DelayedScaling(amax_compute_algo="mean"), "'max', 'most_recent'"),
    (lambda: DelayedScaling(format="e5m2"), "'hybrid', 'e4m3'"),
    (lambda: DelayedScaling(amax_history_len=0), "positive int"),
    (lambda: CurrentScaling(margin=-1), r"int in \[0, 127\]"),
    (lambda: CurrentScaling(power_of_two_scales="yes"), "must be a bool"),
    (lambda: recipes.get("delayed"), "CurrentScaling, a DelayedScaling"),
])
def test_bad_recipes_name_the_valid_choices(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_the_policy() -> None:
    p = mp.Policy("mixed_float8")
    assert (p.compute_dtype, p.variable_dtype, p.is_mixed, p.loss_scale) == (
        "bfloat16", "float32", True, None)
    assert p.float8_recipe == CurrentScaling()
    q = mp.Policy("mixed_float8", float8_recipe=DelayedScaling(16))
    assert q != p and q == mp.Policy("mixed_float8", float8_recipe=DelayedScaling(16))
    assert mp.Policy.from_config(q.get_config()) == q
    assert pickle.loads(pickle.dumps(q)).float8_recipe == DelayedScaling(16)
    assert mp.Policy("mixed_bfloat16").float8_recipe is None
    with pytest.raises(ValueError, match="is for the policy 'mixed_float8'"):
        mp.Policy("mixed_bfloat16", float8_recipe=DelayedScaling())
    with mp.policy_scope("mixed_float8"):
        assert mp.layers.Dense(2).dtype_policy.name == "mixed_float8"


def test_the_module_paths() -> None:
    assert mp.mixed_precision.float8.DelayedScaling is DelayedScaling
    from mpcore.mixed_precision import Policy, set_global_policy  # the old names still there

    assert Policy is mp.Policy and callable(set_global_policy)


# --- verdicts: pure functions of the device ---------------------------------------------
@pytest.mark.parametrize(("cc", "text"), [
    ("7.5", "compute capability 7.5 < 8.9 has no FP8 tensor cores"),
    ("8.0", "compute capability 8.0 < 8.9 has no FP8 tensor cores"),
    ("8.9", "emulated: cuBLASLt unavailable: libcublasLt not found"),
    ("9.0", "emulated: cuBLASLt unavailable: libcublasLt not found"),
])
def test_cuda_says_fp8_is_emulated_and_why(cc: str, text: str) -> None:
    missing = "cuBLASLt unavailable: libcublasLt not found; tried nothing"
    s = cuda_policy_support("mixed_float8", cc, cublaslt=missing)
    assert s.supported and not s.fast and text in s.reason
    assert "other ops as mixed_bfloat16" in s.reason
    ok, message = compatibility_check("mixed_float8", [Device("H100", capability="9.0",
                                                              kind="gpu")], cublaslt=missing)
    assert not ok and "H100, compute capability 9.0" in message and "not found" in message


@pytest.mark.parametrize("cc", ["8.9", "9.0", "10.0"])
def test_cuda_says_fp8_is_native_where_cublaslt_loads(cc: str) -> None:
    s = cuda_policy_support("mixed_float8", cc, cublaslt=None)
    assert s.supported and s.fast and "native: FP8 GEMMs through cuBLASLt" in s.reason
    assert "multiples of 16 run emulated" in s.reason
    ok, message = compatibility_check("mixed_float8", [Device("H100", capability=cc,
                                                              kind="gpu")])
    assert ok and "run natively (cuBLASLt)" in message
    ok, message = compatibility_check("mixed_float8", [Device("H100", capability=cc, kind="gpu"),
                                                       Device("A100", capability="8.0",
                                                              kind="gpu")])
    assert not ok and "emulated on some or all GPUs" in message


def test_cpu_and_opencl_say_emulated() -> None:
    s = cpu_policy_support("mixed_float8", frozenset({"avx512_bf16"}))
    assert s.supported and not s.fast and "emulated" in s.reason and "ml_dtypes" in s.reason
    from mpcore_opencl.rules import opencl_policy_support

    o = opencl_policy_support("mixed_float8", Device("Arc A770", kind="gpu"))
    assert not o.fast and "OpenCL C has no FP8 type" in o.reason


def test_check_policy_on_the_current_backend() -> None:
    v = mp.check_policy("mixed_float8")
    assert v.supported and not v.fast and "emulated" in v.reason.lower()
