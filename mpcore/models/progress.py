"""What fit and evaluate print: logs as one line, and tqdm's progress bar for an epoch."""

from __future__ import annotations

import sys
from typing import Any


def format_logs(logs: dict[str, float]) -> str:
    return " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())


def progress_bar(epoch: int, epochs: int, steps: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=steps, desc=f"Epoch {epoch + 1}/{epochs}", unit="step",
                dynamic_ncols=True, leave=True, file=sys.stderr)

