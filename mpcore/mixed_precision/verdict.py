"""``check_policy``: will this policy run, and fast, on this backend's device, and why.

The judgement is the backend's pure rule function of its device description; ``measure=True``
adds a measurement (a 16-bit vs a float32 matmul on the device), because "fast" is a claim
a user should be able to check.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from mpcore.core.backend import Backend
from mpcore.mixed_precision.policy import Policy, get
from mpcore.plugins import registry

logger = logging.getLogger("mpcore")


@dataclass(frozen=True)
class Measurement:
    """Matmul speed of the policy's compute dtype against float32, on one device."""

    n: int
    dtype: str
    gflops: float
    float32_gflops: float

    @property
    def speedup(self) -> float:
        return self.gflops / self.float32_gflops if self.float32_gflops else float("nan")

    def __str__(self) -> str:
        return (f"{self.dtype} matmul {self.gflops:.1f} GFLOP/s vs float32 "
                f"{self.float32_gflops:.1f} GFLOP/s ({self.speedup:.2f}x, n={self.n})")


@dataclass(frozen=True)
class Verdict:
    policy: str
    backend: str
    device: str
    supported: bool
    fast: bool
    reason: str
    measured: Measurement | None = None

    def __str__(self) -> str:
        state = "fast" if self.fast else ("supported, not fast" if self.supported
                                          else "not supported")
        text = f"{self.policy} on {self.backend} ({self.device}): {state}. {self.reason}"
        if self.measured is not None:
            text += f" Measured: {self.measured}."
        return text


def measure_matmul_speed(backend: Backend, dtype: str, n: int = 1024) -> Measurement:
    low = backend.measure_matmul(dtype, n)
    f32 = low if dtype == "float32" else backend.measure_matmul("float32", n)
    return Measurement(n, dtype, low, f32)


def check_policy(policy: Policy | str, backend: Backend | str | None = None,
                 measure: bool = False, n: int = 1024) -> Verdict:
    """Judge ``policy`` on ``backend`` (the current one by default)."""
    p = get(policy)
    be = registry.get_backend(backend) if isinstance(backend, str) else (
        backend or registry.get_backend())
    device = be.device()
    support = be.policy_support(p.name, device)
    measured = None
    if measure and support.supported:
        measured = measure_matmul_speed(be, p.compute_dtype, n)
    return Verdict(p.name, be.name, device.name, support.supported, support.fast,
                   support.reason, measured)


_logged: set[tuple[str, str]] = set()
_log_lock = threading.Lock()


def compatibility_message(policy: Policy | str, backend: Backend | None = None) -> str:
    p = get(policy)
    be = backend or registry.get_backend()
    ok, text = be.compatibility_message(p.name)
    return f"Mixed precision compatibility check ({p.name}): {'OK' if ok else 'WARNING'}\n{text}"


def log_compatibility_once(policy: Policy) -> None:
    """Log the compatibility check of ``policy`` on the current backend, once per process."""
    be = registry.get_backend()
    key = (policy.name, be.name)
    with _log_lock:
        if key in _logged:
            return
        _logged.add(key)
    try:
        message = compatibility_message(policy, be)
    except Exception as exc:  # a check that cannot run must not stop set_global_policy
        logger.warning("Mixed precision compatibility check (%s): could not run: %s",
                       policy.name, exc)
        return
    if message.split("\n", 1)[0].endswith("OK"):
        logger.info(message)
    else:
        logger.warning(message)
