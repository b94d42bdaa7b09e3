"""Where an op ran: the layer path the numerics tools name (``dense_1``, or ``loss``).

Layers enter :func:`layer_scope` only while a numerics tool watches the ops (``watching()``),
so training pays one ``is None`` test per layer call for it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from mpcore.ops import dispatch as _dispatch

_layers: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("mpcore_layers",
                                                                          default=())


def watching() -> bool:
    """Whether a numerics tool (check_numerics, the inspector) watches every op now."""
    return _dispatch.numerics_check is not None


@contextlib.contextmanager
def layer_scope(name: str) -> Iterator[None]:
    """Name the layer whose ops run inside."""
    token = _layers.set((*_layers.get(), name))
    try:
        yield
    finally:
        _layers.reset(token)


def layer_path() -> tuple[str, ...]:
    """The layers the current op runs in, outermost first."""
    return _layers.get()
