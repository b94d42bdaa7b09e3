"""What fit and evaluate print: logs as one line, and tqdm's progress bar for an epoch."""

from __future__ import annotations

import sys
from typing import Any


def format_logs(logs: dict[str, float]) -> str:
    return " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())


def progress_bar(epoch: int, epochs: int, steps: int | None) -> Any:
    """tqdm's bar for an epoch on stdout (where Keras prints), gone when it closes: ``fit``
    then prints the epoch's line (:func:`epoch_line`), which a bar as wide as the terminal
    would cut. None where stdout is not a terminal (a log file, a pipe, CI: a bar redrawn with
    carriage returns is a run of copies there), as Keras' Progbar decides. A notebook gets
    tqdm's widget. ``steps`` None (a generator's first epoch): a bar that counts steps."""
    from tqdm.auto import tqdm

    # (tqdm.auto's class in a notebook is tqdm.auto.tqdm, a subclass of tqdm.notebook's)
    notebook = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)
    if not (notebook or _terminal(sys.stdout)):
        return None
    return tqdm(total=steps, desc=f"Epoch {epoch + 1}/{epochs}", unit="step",
                dynamic_ncols=True, leave=False, file=sys.stdout)


def epoch_line(epoch: int, epochs: int, timing: str, logs: dict[str, float]) -> str:
    """An epoch's summary on one line (``verbose`` 1 and 2, at the epoch's end)."""
    return f"Epoch {epoch + 1}/{epochs} - {timing} - {format_logs(logs)}"


def _terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):   # no isatty, or a closed stream
        return False
