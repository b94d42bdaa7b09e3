"""Layers pass their matmul dimensions to the backend when they build (the CUDA backend turns
them into the guide's tensor-core tip)."""

from __future__ import annotations

import warnings

import pytest

import mpcore as mp


def test_dense_and_conv_report_their_dimensions(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = mp.get_backend()
    calls: list[tuple[str, dict[str, int], str]] = []
    monkeypatch.setattr(backend, "layer_hint",
                        lambda name, dims, policy: calls.append((name, dict(dims), policy.name)),
                        raising=False)
    with mp.policy_scope("mixed_float16"):
        mp.layers.Dense(4095, name="wide")(mp.ops.zeros((2, 12)))
        mp.layers.Conv2D(6, 3, name="conv")(mp.ops.zeros((1, 5, 5, 3)))
    assert calls == [("wide", {"input units": 12, "units": 4095}, "mixed_float16"),
                     ("conv", {"channels": 3, "filters": 6}, "mixed_float16")]


def test_cuda_backend_turns_the_hint_into_the_tensor_core_tip() -> None:
    from mpcore_cuda import CudaBackend, TensorCoreWarning
    from mpcore_cuda.tensor_cores import reset_warnings

    reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CudaBackend().layer_hint("dense_1", {"units": 4095}, mp.Policy("mixed_float16"))
        CudaBackend().layer_hint("dense_2", {"units": 4096}, mp.Policy("mixed_float16"))
        CudaBackend().layer_hint("dense_3", {"units": 4095}, mp.Policy("float32"))
    tips = [w for w in caught if issubclass(w.category, TensorCoreWarning)]
    assert len(tips) == 1 and "dense_1" in str(tips[0].message)
    assert "units=4095" in str(tips[0].message)
