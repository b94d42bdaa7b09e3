"""Checkpoints (``mp.checkpoint``): a model's whole training state in one checksummed file, so
a resumed run repeats an uninterrupted one; the names of :mod:`mpcore.checkpoint.checkpoint`.

A package of its own, not part of ``saving/``: ``Model.save_weights`` and ``BackupAndRestore``
use it, and ``saving/`` (Keras' formats) sits above ``models/`` (it registers the models'
classes), so ``saving/checkpoint`` would make ``models`` and ``saving`` import each other."""

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
