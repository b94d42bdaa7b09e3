"""Settings read from environment variables (``MPCORE_*``), for the core and for plugins.

A setting with a fixed set of values is read through :func:`env_choice`, so every one of them
treats case and blanks alike and fails the same way on a bad value: a :class:`SettingError` (a
ValueError) that names the variable, the value given and the valid ones.

A bad value is the user's mistake, not a plugin's failure: a plugin hook that raises a
SettingError is not recorded and passed over like a broken plugin (which would leave a kernel
provider silently off, and its verdict advising to install what is installed) but fails the
backend's first use, with the message, as a bad ``MPCORE_OPENCL_HALF`` fails the OpenCL backend.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


class SettingError(ValueError):
    """An ``MPCORE_*`` environment variable holds a value that is not valid; the message names
    the variable, the value and the valid values."""


def env_choice(name: str, choices: Sequence[str], default: str | None = None) -> str:
    """The value of the environment variable ``name``, lower-cased and stripped, which must be
    one of ``choices``; unset or blank gives ``default`` (the first choice when None)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower() or (choices[0] if default is None else default)
    if value not in choices:
        raise SettingError(f"{name}={raw!r} is not valid; valid values: {', '.join(choices)}")
    return value
