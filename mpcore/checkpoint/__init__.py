"""Checkpoints (``mp.checkpoint``): a model's whole training state in one checksummed file, so
a resumed run repeats an uninterrupted one; the names of :mod:`mpcore.checkpoint.checkpoint`.

A package of its own beside ``saving/``: ``saving/`` is Keras 3's formats (``.keras``,
``.weights.h5``, configs), this is mpcore's own file of the whole training state (slots, loss
scale, seeds, step), which ``Model.save``/``load_weights`` and ``BackupAndRestore`` use and
``saving/`` borrows only for its atomic writes; ``mp.checkpoint`` was a module of its own."""

from __future__ import annotations

from mpcore.checkpoint.checkpoint import (
    FORMAT,
    HEADER,
    MAGIC,
    REQUIRED,
    VERSION,
    WEIGHTS_FORMAT,
    atomic_write,
    load_weights,
    logger,
    read,
    remove_stale_temporaries,
    restore,
    save,
    save_weights,
    write_file,
    write_on_rank_zero,
)

__all__ = ["FORMAT", "HEADER", "MAGIC", "REQUIRED", "VERSION", "WEIGHTS_FORMAT", "atomic_write",
           "load_weights", "logger", "read", "remove_stale_temporaries", "restore", "save",
           "save_weights", "write_file", "write_on_rank_zero"]
