"""The template backend: its kernels against float64 references, its verdict rule on described
devices, and the conformance kit."""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

import ml_dtypes
import mpcore.conformance
import numpy as np
import pytest
from mpcore import Device

if importlib.util.find_spec("mpcore_template") is None:  # a checkout, not pip installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpcore_template import (
    TemplateBackend,
    template_device,
    template_policy_support,
)
from mpcore_template.backend import BLOCK

BACKEND = TemplateBackend()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_blocked_matmul_crosses_panels(dtype: type, transpose_a: bool, transpose_b: bool) -> None:
    rng = np.random.default_rng(0)
    k = 2 * BLOCK + 37  # three panels, the last one partial
    a = rng.uniform(-1, 1, (2, k, 5) if transpose_a else (2, 5, k)).astype(dtype)
    b = rng.uniform(-1, 1, (2, 3, k) if transpose_b else (2, k, 3)).astype(dtype)
    got = BACKEND.matmul(a, b, transpose_a, transpose_b)
    a64 = np.swapaxes(a, -1, -2) if transpose_a else a
    b64 = np.swapaxes(b, -1, -2) if transpose_b else b
    want = np.matmul(a64.astype(np.float64), b64.astype(np.float64))
    assert got.dtype == np.dtype(dtype) and got.shape == (2, 5, 3)
    # float32 accumulation, one rounding to the output dtype at the end
    rounding = 2.0 ** -np.finfo(dtype).nmant if dtype is not ml_dtypes.bfloat16 else 2.0 ** -7
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rounding, atol=1e-4 * k**0.5)


def test_sigmoid_and_tanh_round_once() -> None:
    x = np.linspace(-8, 8, 101).astype(np.float16)
    x64 = x.astype(np.float64)
    for got, ref in ((BACKEND.sigmoid(x), 1 / (1 + np.exp(-x64))), (BACKEND.tanh(x), np.tanh(x64))):
        assert got.dtype == np.float16
        # computed in float32, rounded once: within half a float16 ulp of the exact value
        half_ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64) / 2
        assert np.all(np.abs(got.astype(np.float64) - ref) <= half_ulp * 1.01)


def test_rule_is_a_pure_function_of_the_description() -> None:
    plain = Device(name="plain", features=frozenset())
    bf16 = Device(name="Sapphire Rapids", features=frozenset({"amx_bf16", "avx512_bf16"}))
    assert template_policy_support("float32", plain) == template_policy_support("float32", bf16)
    assert template_policy_support("float32", plain).fast
    for policy in ("mixed_float16", "mixed_bfloat16", "float16", "bfloat16"):
        s = template_policy_support(policy, plain)
        assert s.supported and not s.fast and "float32" in s.reason
    s = template_policy_support("mixed_bfloat16", bf16)
    assert not s.fast and "avx512_bf16/amx_bf16" in s.reason and "Sapphire Rapids" in s.reason
    with pytest.raises(ValueError, match="mixed_float16"):
        template_policy_support("mixed_float8", plain)


def test_device_and_selection() -> None:
    device = template_device()
    assert BACKEND.devices() == [device] and device.name.startswith("template")
    assert device.details["matmul_block"] == BLOCK
    assert BACKEND.is_available() and not BACKEND.auto_select()


def test_conformance_kit_passes() -> None:
    report = mpcore.conformance.check(BACKEND, quick=True)
    assert report.ok, report.format_table()
    assert report.result("matmul[bfloat16]").status == "pass"


def test_entry_point_when_installed() -> None:
    eps = [ep for ep in entry_points(group="mpcore") if ep.name == "template"]
    if not eps:
        pytest.skip("not installed: pip install -e examples/backend_template")
    assert eps[0].value == "mpcore_template"
    import mpcore as mp

    assert mp.get_backend("template").name == "template"
