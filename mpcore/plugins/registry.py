"""Which backends exist and which one computes: auto-detection, MPCORE_BACKEND, set_backend.

The choice has two steps. Choosing is cheap: each backend's ``auto_select()`` looks for drivers
and packages without opening a device, and the highest ``priority`` that says yes wins (cuda
300, an OpenCL GPU 200, cpu 100). The chosen backend is then proved on its first real use (the
first ``get_backend()`` after ``import mpcore``): its devices are described and its kernels
activated. An auto-detected backend that fails there is passed over for the next by priority;
its failure is kept for the process and reported (the detection note, ``mpcore info``, one
logged warning). A backend chosen by name (``MPCORE_BACKEND``, ``set_backend``; any case) that
is unknown, unavailable or failing raises an error naming the backends here and how to install
a missing one. Once a backend works, ``get_backend()`` returns it without asking it anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

from mpcore.core.backend import (
    Backend,
    BackendUnavailableError,
    KernelBuildError,
    set_kernel_set_source,
)
from mpcore.plugins.manager import get_plugins, install_kernel_sets
from mpcore.plugins.settings import SettingError

logger = logging.getLogger("mpcore")

# Every backend, however it was constructed, gets its plugins' kernel sets when first activated.
set_kernel_set_source(install_kernel_sets)

_current: Backend | None = None    # the backend ops run on, once it has worked
_detection_note: str = ""
_failures: dict[str, Exception] = {}  # backend name -> how it failed on first use
_lock = threading.RLock()


def backends() -> list[Backend]:
    """Every registered backend, available or not, highest priority first."""
    return sorted(get_plugins().backends.values(), key=lambda b: (-b.priority, b.name))


def failure(backend: Backend | str) -> Exception | None:
    """How ``backend`` failed when first really used in this process, or None."""
    return _failures.get(backend if isinstance(backend, str) else backend.name)


def describe_failure(exc: BaseException) -> str:
    """A backend's failure in the words of ``mpcore info`` and of the errors: the exception,
    and for a :class:`~mpcore.KernelBuildError` that the kernels failed to build."""
    text = f"{type(exc).__name__}: {exc}".rstrip()
    return f"its kernels failed to build: {text}" if isinstance(exc, KernelBuildError) else text


def record_failure(backend: Backend, exc: Exception) -> None:
    """Keep how ``backend`` failed in real use (``mpcore info`` describing its devices, say):
    detection passes over it from now on, and if it was the current backend the next
    ``get_backend()`` chooses again."""
    global _current
    with _lock:
        _failures[backend.name] = exc
        if _current is backend:
            _current = None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def status(backend: Backend) -> str:
    """"available", "not available: why (install with ...)" or "failing: how"."""
    reason = backend.unavailable_reason()
    if reason is not None:
        advice = backend.install_advice()
        hint = f" (install with {advice})" if advice else ""
        return f"not available: {reason}{hint}"
    exc = _failures.get(backend.name)
    return "available" if exc is None else f"failing: {describe_failure(exc)}"


def _describe_choices(shy: frozenset[str] = frozenset()) -> str:
    """A line per backend: its :func:`status`; for the names in ``shy``, backends that work
    but that auto-detection does not choose, how to choose one."""
    lines = []
    for b in backends():
        state = _first_line(status(b))
        if b.name in shy and state == "available":
            state = f"available but not auto-selected (MPCORE_BACKEND={b.name} chooses it)"
        lines.append(f"  {b.name}: {state}")
    return "\n".join(lines) if lines else "  (no backend is registered: is mpcore installed?)"


def find_backend(name: str) -> Backend | None:
    """The registered backend called ``name`` (any case, blanks ignored), available or not;
    None where there is none."""
    registered = get_plugins().backends
    found = registered.get(name)
    if found is None:
        wanted = name.strip().casefold()
        found = next((b for n, b in registered.items() if n.casefold() == wanted), None)
    return found


def _lookup(name: str | Backend, source: str = "") -> Backend:
    """The registered backend called ``name`` (any case, blanks ignored), if it is available;
    ``source`` ("MPCORE_BACKEND=x: ") starts the error messages."""
    if isinstance(name, Backend):
        return name
    if not isinstance(name, str):
        raise TypeError(f"a backend is chosen by name, got {name!r}")
    backend = find_backend(name)
    if backend is None:
        names = ", ".join(b.name for b in backends())
        raise ValueError(f"{source}unknown backend {name!r}; registered backends: {names}.\n"
                         f"Backends here:\n{_describe_choices()}")
    reason = backend.unavailable_reason()
    if reason is not None:
        advice = backend.install_advice()
        hint = f"; install with {advice}" if advice else ""
        raise BackendUnavailableError(
            f"{source}backend {backend.name!r} is not available: {reason}{hint}.\n"
            f"Backends here:\n{_describe_choices()}")
    return backend


def _prove(backend: Backend) -> Exception | None:
    """Use ``backend`` for real once (devices, its device, its kernels); how it failed, or None.
    A failure is kept: a backend is not tried twice."""
    if backend.name not in _failures:
        try:
            backend.devices()
            backend.device()
            backend.kernels()
        except Exception as exc:  # whatever breaks a backend must not break the choice
            _failures[backend.name] = exc
    return _failures.get(backend.name)


def _chosen(backend: Backend, source: str, undo: str) -> Backend:
    """``backend``, chosen by name, once it works; else an error naming the backends here."""
    exc = _prove(backend)
    if exc is None:
        return backend
    kind = KernelBuildError if isinstance(exc, KernelBuildError) else BackendUnavailableError
    raise kind(f"{source}backend {backend.name!r} fails on first use: {describe_failure(exc)}\n"
               f"Backends here:\n{_describe_choices()}\n{undo}") from exc


def _auto_detect() -> tuple[Backend, str]:
    skipped: list[str] = []
    shy: set[str] = set()  # available, but auto-detection does not choose them
    passed_over: list[str] = []
    new_failures = [b.name for b in backends() if b.name not in _failures]
    for backend in backends():
        if not backend.auto_select():
            reason = backend.unavailable_reason()
            if reason is None:
                shy.add(backend.name)
            skipped.append(f"{backend.name} ({reason or 'not auto-selected'})")
            continue
        exc = _prove(backend)
        if exc is not None:
            passed_over.append(f"{backend.name} (failing: {_first_line(describe_failure(exc))})")
            continue
        why = f"auto-detected (highest priority available: {backend.priority})"
        if passed_over:
            why += "; passed over " + ", ".join(passed_over)
        if skipped:
            why += "; skipped " + ", ".join(skipped)
        _warn_passed_over([n for n in new_failures if n in _failures], backend)
        return backend, why
    # (no warning for the failures: the error lists every backend, those failing included)
    # "works here" would contradict a backend listed as available but never auto-selected
    head = ("no mpcore backend could be auto-detected (one that is not auto-selected may "
            "work: choose it with MPCORE_BACKEND)" if shy else "no mpcore backend works here")
    # a bad MPCORE_* value first: it is the user's one-character fix, which the paragraph
    # about detection below buried (a typo in MPCORE_CPU_POOL_MB read as "no backend")
    bad = [f"{exc} (it stops the {b.name} backend)" for b in backends()
           if isinstance(exc := _failures.get(b.name), SettingError)]
    first = "".join(f"{line}\n" for line in bad)
    raise BackendUnavailableError(f"{first}{head}:\n{_describe_choices(frozenset(shy))}")


def _warn_passed_over(names: list[str], used: Backend) -> None:
    """One warning for the backends that failed in this detection."""
    if not names:
        return
    instead = f"using {used.name!r}, the next by priority"
    failed = "; ".join(f"{n!r} ({describe_failure(_failures[n])})" for n in names)
    logger.warning("mpcore: %s: auto-detection passed over what failed on first use (`mpcore "
                   "info` lists every backend): %s", instead, failed)


def _settle() -> Backend:
    global _current, _detection_note
    with _lock:
        if _current is not None:
            return _current
        env = os.environ.get("MPCORE_BACKEND", "").strip()
        if env:
            source = f"MPCORE_BACKEND={env}: "
            backend = _chosen(_lookup(env, source), source,
                              "Choose one that works, or unset MPCORE_BACKEND to auto-detect.")
            note = f"chosen by MPCORE_BACKEND={env}"
        else:
            backend, note = _auto_detect()
        _current, _detection_note = backend, note
        return backend


def get_backend(name: str | Backend | None = None) -> Backend:
    """The backend named ``name`` (any case), or the current one: chosen and proved on first
    use, then returned as is (ops call this for every op)."""
    if name is not None:
        return _lookup(name)
    if _current is not None:
        return _current
    return _settle()


def set_backend(name: str | Backend) -> Backend:
    """Compute on ``name`` (any case) from now on, once it works (its devices are described
    and its kernels activated now, not at the first op); raises naming the backends here
    otherwise, and then changes nothing."""
    global _current, _detection_note
    with _lock:
        backend = _chosen(_lookup(name), "", "Choose one that works.")
        _current, _detection_note = backend, "chosen by set_backend"
    return backend


def detection_note() -> str:
    """Why the current backend was chosen, and what detection passed over or skipped."""
    get_backend()
    return _detection_note


@contextlib.contextmanager
def backend_scope(name: str | Backend) -> Iterator[Backend]:
    """Compute on ``name`` inside the block (as :func:`set_backend`), then on the backend that
    was current before: what builds layers on a chosen backend (the conformance kit's layer
    checks) without changing the caller's choice."""
    global _current, _detection_note
    previous, note = _current, _detection_note
    backend = set_backend(name)
    try:
        yield backend
    finally:
        with _lock:
            _current, _detection_note = previous, note
