"""Which backends exist and which one computes: auto-detection, MPCORE_BACKEND, set_backend.

Auto-detection must be cheap (it runs at ``import mpcore``): it asks each backend's
``auto_select()``, which looks for drivers and packages without opening a device, and takes the
highest ``priority`` that says yes (cuda 300, an OpenCL GPU 200, cpu 100).
"""

from __future__ import annotations

import os

from mpcore.backend import Backend
from mpcore.plugins import get_plugins

_current: Backend | None = None
_detection_note: str = ""


def backends() -> list[Backend]:
    """Every registered backend, available or not, highest priority first."""
    return sorted(get_plugins().backends.values(), key=lambda b: (-b.priority, b.name))


def _describe_choices() -> str:
    lines = []
    for b in backends():
        reason = b.unavailable_reason()
        if reason is None:
            lines.append(f"  {b.name}: available")
        else:
            hint = f" (install with {b.install_hint})" if b.install_hint else ""
            lines.append(f"  {b.name}: not available: {reason}{hint}")
    return "\n".join(lines) if lines else "  (no backend is registered: is mpcore installed?)"


def _lookup(name: str) -> Backend:
    if isinstance(name, Backend):
        return name
    if not isinstance(name, str):
        raise TypeError(f"a backend is chosen by name, got {name!r}")
    registered = get_plugins().backends
    if name not in registered:
        raise ValueError(f"unknown backend {name!r}; registered backends:\n{_describe_choices()}")
    backend = registered[name]
    reason = backend.unavailable_reason()
    if reason is not None:
        hint = f"; install with {backend.install_hint}" if backend.install_hint else ""
        raise RuntimeError(f"backend {name!r} is not available: {reason}{hint}.\n"
                           f"Backends here:\n{_describe_choices()}")
    return backend


def detect() -> tuple[Backend, str]:
    """The backend to use when nobody chose one, and a sentence saying why."""
    env = os.environ.get("MPCORE_BACKEND", "").strip()
    if env:
        return _lookup(env), f"chosen by MPCORE_BACKEND={env}"
    skipped = []
    for backend in backends():
        if backend.auto_select():
            why = f"auto-detected (highest priority available: {backend.priority})"
            if skipped:
                why += "; skipped " + ", ".join(skipped)
            return backend, why
        reason = backend.unavailable_reason() or "not auto-selected"
        skipped.append(f"{backend.name} ({reason})")
    raise RuntimeError("no mpcore backend is available here:\n" + _describe_choices())


def get_backend(name: str | None = None) -> Backend:
    """The backend named ``name``, or the current one (detected on first use)."""
    global _current, _detection_note
    if name is not None:
        return _lookup(name)
    if _current is None:
        _current, _detection_note = detect()
    return _current


def set_backend(name: str | Backend) -> Backend:
    """Compute on ``name`` from now on; raises naming the available backends otherwise."""
    global _current, _detection_note
    backend = _lookup(name)  # type: ignore[arg-type]
    backend.kernels()  # fail now, not at the first op, if its kernels cannot load
    _current, _detection_note = backend, "chosen by set_backend"
    return backend


def detection_note() -> str:
    get_backend()
    return _detection_note
