"""The OpenCL fused Adam, AdamW and RMSprop updates take ``1 - beta`` (``1 - rho``) and AdamW's
``lr * weight_decay`` from the host, computed in double and rounded once, as the CPU and CUDA
kernels do: computed on the device from float32-rounded betas, ``1 - 0.999`` was 0.0009999871
and the first step's update ~55 ulp from the CPU's (issue 33, item 9)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from opencl_cases import cl, needs_device  # noqa: F401 - cl: fixture

import mpcore as mp

MAKERS = {
    "adam": lambda: mp.optimizers.Adam(0.01),
    "adam_betas": lambda: mp.optimizers.Adam(0.003, beta_1=0.8, beta_2=0.9999),
    "adamw": lambda: mp.optimizers.AdamW(0.01, weight_decay=0.1),
    "rmsprop": lambda: mp.optimizers.RMSprop(0.01),
    "rmsprop_momentum": lambda: mp.optimizers.RMSprop(0.01, rho=0.95, momentum=0.5),
}


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance between ``a`` and ``b`` in float32 units in the last place (the
    integer order of IEEE floats: adjacent floats differ by one)."""
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.max(np.abs(ia - ib)))


def _steps(backend: Any, name: str, w0: np.ndarray, grads: list[np.ndarray]) -> list[np.ndarray]:
    opt = MAKERS[name]()
    var = mp.Variable(w0, backend=backend)
    seen = []
    for g in grads:
        opt.apply_gradients([(mp.constant(g, backend=backend), var)])
        seen.append(var.numpy().copy())
    return seen


@needs_device
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_fused_update_equals_the_cpus_within_two_ulp_at_the_first_steps(cl: Any,  # noqa: F811
                                                                        name: str) -> None:
    rng = np.random.default_rng(33)
    w0 = rng.standard_normal(4096).astype(np.float32)
    grads = [rng.standard_normal(4096).astype(np.float32) for _ in range(3)]
    on_cl = _steps(cl, name, w0, grads)
    on_cpu = _steps(mp.get_backend("cpu"), name, w0, grads)
    for step, (a, b) in enumerate(zip(on_cl, on_cpu), 1):
        assert _ulps(a, b) <= 2, f"step {step}: {_ulps(a, b)} ulp"


def test_the_device_rounding_that_was_the_defect() -> None:
    """Why the constants come from the host: float32 ``1 - 0.999f`` is not float32(1 - 0.999)."""
    on_device = np.float32(1) - np.float32(0.999)
    assert on_device == np.float32(0.0009999871)
    assert on_device != np.float32(1.0 - 0.999)
