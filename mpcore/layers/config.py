"""Keras 3 arguments mpcore does not implement yet, shared by the layers that take Keras'
full argument lists.

A Keras 3 config holds keys for features mpcore does not implement yet (regularizers,
constraints, synchronized or renormalized statistics). The layers accept those keys at their
"off" value, so that a Keras config builds the layer, and refuse any other value: silently
dropping a regularizer would train a different model.
"""

from __future__ import annotations

from typing import Any


def refuse_unsupported(layer: str, **args: Any) -> None:
    """A NotImplementedError naming the first of ``args`` that is set (not None or False)."""
    for name, value in args.items():
        if value is not None and value is not False:
            raise NotImplementedError(
                f"{layer}: {name}={value!r} is not supported by mpcore; leave it at its "
                f"default ({'False' if name in _FLAGS else 'None'})")


_FLAGS = frozenset({"synchronized", "renorm"})
