"""The guide's tensor-core tip: under float16 compute, NVIDIA tensor cores are used fully only
when a Dense layer's units and a Conv2D layer's filters and channels are multiples of 8.

Layers call it through ``backend.layer_hint(layer_name, dims, policy)`` (a no-op on other
backends), so the core never imports this package.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any


class TensorCoreWarning(UserWarning):
    """A layer dimension keeps float16 matmuls off the fast tensor-core path."""


_warned: set[tuple[str, tuple[str, ...]]] = set()
_lock = threading.Lock()


def _policy_compute(policy: Any) -> str:
    if isinstance(policy, str):
        from mpcore.mixed_precision.policy import POLICIES

        return POLICIES[policy][0] if policy in POLICIES else policy
    return str(getattr(policy, "compute_dtype", ""))


def check_tensor_core_dims(layer_name: str, dims: Mapping[str, int] | Sequence[int],
                           policy: Any) -> list[str]:
    """Warn (once per layer and set of dimensions) when a dimension of ``layer_name`` is not a
    multiple of 8 under a float16-compute ``policy`` (a Policy or its name). ``dims`` names the
    dimensions ({"units": 4095}) or lists them. Returns the offending "name=value" strings."""
    if _policy_compute(policy) != "float16":
        return []
    items = dims.items() if isinstance(dims, Mapping) else (
        (f"dim{i}", d) for i, d in enumerate(dims))
    bad = tuple(f"{name}={int(value)}" for name, value in items if int(value) % 8)
    if not bad:
        return []
    key = (layer_name, bad)
    with _lock:
        if key in _warned:
            return list(bad)
        _warned.add(key)
    warnings.warn(f"layer {layer_name!r}: {', '.join(bad)} not a multiple of 8. With float16 "
                  "compute, NVIDIA tensor cores run a matmul at full speed only when its "
                  "dimensions are multiples of 8 (Dense units, Conv2D filters and input "
                  "channels, and the batch size): consider rounding them up",
                  TensorCoreWarning, stacklevel=3)
    return list(bad)


def reset_warnings() -> None:
    """Forget which layers were warned about (for tests)."""
    with _lock:
        _warned.clear()
