"""What the OpenCL test modules share: whether the backend works here, and its fixtures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp


def _problem() -> str | None:
    try:
        be = mp.get_backend("opencl")
        be.kernels()
    except Exception as exc:
        return f"opencl backend unavailable: {exc}"
    return None


needs_device = pytest.mark.skipif(_problem() is not None, reason=str(_problem()))


@pytest.fixture
def cl() -> Any:
    be = mp.get_backend("opencl")
    be.kernels()
    return be


@pytest.fixture
def cpu() -> Any:
    return mp.get_backend("cpu").kernels()


def host(be: Any, x: Any) -> np.ndarray:
    return np.asarray(be.to_host(x))
