"""What fit and evaluate print: logs as one line, and tqdm's progress bar for an epoch."""

from __future__ import annotations

import sys
from typing import Any


def format_logs(logs: dict[str, float]) -> str:
    return " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())


def progress_bar(epoch: int, epochs: int, steps: int) -> Any:
    """tqdm's bar for an epoch on stderr, or None where stderr is not a terminal (a log file,
    a pipe, CI): a bar redrawn with carriage returns is a run of copies there, so ``fit``
    prints one line per epoch instead (:func:`epoch_line`), as Keras' Progbar does off a
    terminal. A notebook gets tqdm's widget."""
    from tqdm.auto import tqdm

    if not (tqdm.__module__.startswith("tqdm.notebook") or _terminal(sys.stderr)):
        return None
    return tqdm(total=steps, desc=f"Epoch {epoch + 1}/{epochs}", unit="step",
                dynamic_ncols=True, leave=True, file=sys.stderr)


def epoch_line(epoch: int, epochs: int, timing: str, logs: dict[str, float]) -> str:
    """An epoch's summary on one line (``verbose=2``, or ``verbose=1`` off a terminal)."""
    return f"Epoch {epoch + 1}/{epochs} - {timing} - {format_logs(logs)}"


def _terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):   # no isatty, or a closed stream
        return False
