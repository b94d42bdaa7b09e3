"""Keras 3's CSVLogger: one row per epoch of the epoch's logs, streamed to a CSV file."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from typing import IO, Any

from mpcore.callbacks.base import Callback
from mpcore.core import arguments as _args


class CSVLogger(Callback):
    """Write ``epoch`` and the epoch's logs (sorted keys) to ``filename`` after each epoch,
    flushed at once. ``append=True`` continues an existing file (its header is written only
    if the file is empty), for a resumed run. As in Keras, when the logs hold no ``val_`` key
    the columns also name ``val_<key>`` for each key, filled with "NA", so runs with and
    without validation share a header."""

    reads_batch_results = False

    def __init__(self, filename: str | os.PathLike[str], separator: str = ",",
                 append: bool = False) -> None:
        super().__init__()
        if not isinstance(separator, str) or len(separator) != 1:
            # the csv module's rule: a one-character string
            raise ValueError(f"separator must be a one-character string such as ',' or '\\t', "
                             f"got {separator!r}")
        self.sep = separator
        self.filename = os.fspath(filename)
        self.append = _args.flag("append", append)
        self.writer: csv.DictWriter[str] | None = None
        self.keys: list[str] | None = None
        self.append_header = True
        self.csv_file: IO[str] | None = None

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        if self.append:
            if os.path.exists(self.filename):
                with open(self.filename, encoding="utf-8") as f:
                    self.append_header = not f.readline()
            mode = "a"
        else:
            mode = "w"
        self._close()
        self.csv_file = open(self.filename, mode, newline="", encoding="utf-8")  # noqa: SIM115
        self.writer = None
        self.keys = None

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        logs = logs or {}
        if self.csv_file is None:
            raise RuntimeError("CSVLogger: on_epoch_end before on_train_begin (give the "
                               "callback to fit, which calls both)")
        if self.keys is None:
            self.keys = sorted(logs)
            if self.keys and not any(k.startswith("val_") for k in self.keys):
                self.keys.extend(f"val_{k}" for k in list(self.keys))
        if self.writer is None:
            sep = self.sep

            class Dialect(csv.excel):
                delimiter = sep

            self.writer = csv.DictWriter(self.csv_file, fieldnames=["epoch", *self.keys],
                                         dialect=Dialect)
            if self.append_header:
                self.writer.writeheader()
        row: dict[str, Any] = {"epoch": epoch}
        row.update((key, _cell(logs.get(key, "NA"))) for key in self.keys)
        self.writer.writerow(row)
        self.csv_file.flush()

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self._close()
        self.writer = None

    def _close(self) -> None:
        if self.csv_file is not None and not self.csv_file.closed:
            self.csv_file.close()


def _cell(value: Any) -> Any:
    """A log value as Keras writes it: a string or a number as is, a 1-D sequence as
    ``"[a, b]"`` in quotes."""
    if isinstance(value, str) or getattr(value, "ndim", None) == 0:
        return value
    if isinstance(value, Iterable):
        return f'"[{", ".join(map(str, value))}]"'
    return value
