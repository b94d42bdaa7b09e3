"""Settings read from environment variables (``MPCORE_*``), for the core and for plugins.

A setting with a fixed set of values is read through :func:`env_choice`, so every one of them
treats case and blanks alike and fails the same way on a bad value: a ValueError that names the
variable, the value given and the valid ones.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def env_choice(name: str, choices: Sequence[str], default: str | None = None) -> str:
    """The value of the environment variable ``name``, lower-cased and stripped, which must be
    one of ``choices``; unset or blank gives ``default`` (the first choice when None)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower() or (choices[0] if default is None else default)
    if value not in choices:
        raise ValueError(f"{name}={raw!r} is not valid; valid values: {', '.join(choices)}")
    return value
