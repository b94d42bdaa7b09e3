"""Where a warning should point: the first frame of the caller's code, outside mpcore and its
plugins. A warning raised deep inside a traced step or a fit (the graph rewrite's, the loss
scale's) would otherwise name a line of mpcore, which tells the user nothing; Python 3.12's
``skip_file_prefixes`` does this, and mpcore supports 3.10."""

from __future__ import annotations

import os
import sys


def _internal_dirs() -> tuple[str, ...]:
    # mpcore and every top-level mpcore_* package (the built-in plugins, and third parties')
    dirs = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        # packages only: a user's own single-file module may be named mpcore_something
        if (path and "." not in name and hasattr(module, "__path__")
                and (name == "mpcore" or name.startswith("mpcore_"))):
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def _internal(filename: str, dirs: tuple[str, ...]) -> bool:
    # a traced step's replay is compiled code named "<mpcore traced step>" (program.py): it
    # is mpcore's too, else a warning from a call it replays names that pseudo-file
    return filename.startswith("<mpcore") or os.path.abspath(filename).startswith(dirs)


def stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the function that calls this one, so
    that the warning names the first frame outside mpcore (1 if there is none)."""
    internal = _internal_dirs()
    frame = sys._getframe(1)
    level = 1
    while frame is not None and _internal(frame.f_code.co_filename, internal):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 1

