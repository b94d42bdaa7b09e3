"""Keras 3's automatic config of a layer whose class writes no ``get_config``
(``keras/src/ops/operation.py``): the arguments its ``__init__`` was called with are recorded
when the object is made, and ``get_config`` returns them beside the base config, so a custom
layer ``def __init__(self, factor, **kwargs)`` saves and loads without a ``get_config`` of its
own, as in Keras.

As Keras 3, only for arguments that are all plain values (str, int, float, bool, None, and
lists, tuples and dicts of them): anything else (a layer, an initializer object, an array) has
no config that can be written for certain, so no automatic config is made, and saving such a
layer without a ``get_config`` is refused by :mod:`mpcore.saving` naming the argument. Where
``__init__`` takes no ``**kwargs``, the base keys it does not take (``name``, ``trainable``,
``dtype``) are left out, so ``from_config`` can call it.
"""

from __future__ import annotations

import inspect
from typing import Any

_PLAIN = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def record(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of ``cls(*args, **kwargs)`` by name, where all are plain values; else
    None (no automatic config)."""
    try:
        bound = inspect.signature(cls.__init__).bind_partial(None, *args, **kwargs)
    except TypeError:
        return None   # __init__ itself will raise, with Python's message
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)), None)       # self
    params = inspect.signature(cls.__init__).parameters
    out: dict[str, Any] = {}
    for name, value in arguments.items():
        if params[name].kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif params[name].kind is inspect.Parameter.VAR_POSITIONAL:
            return None       # *args have no names to write
        else:
            out[name] = value
    return out if _plain(out) else None


def extend(layer: Any, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (the base one) with the recorded arguments, Keras 3's ``get_config`` of a
    class that writes none; ``config`` itself where nothing was recorded."""
    recorded = layer.__dict__.get("_auto_config")
    if recorded is None:
        return config
    out = {**config, **recorded}
    params = inspect.signature(type(layer).__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        out = {k: v for k, v in out.items() if k in params}
    return out
