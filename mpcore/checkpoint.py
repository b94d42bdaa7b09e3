"""Checkpoints: weights, optimizer slots and iterations, loss-scale state, the training step and
epoch, and ``mp.random``'s state, so a resumed run repeats an uninterrupted one exactly (dropout
masks and shuffles included).

The file is a pickle of plain Python values and the host arrays the backend hands out
(``t.numpy()``), so the core needs no array library to write it. It is written atomically: to a
temporary file in the same folder, flushed and fsynced, then ``os.replace``-d over the target,
so a crash mid-write leaves the previous file (or none), never a broken one. Only load
checkpoints you trust: unpickling runs code.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from typing import Any

from mpcore import random as _random

FORMAT = "mpcore.checkpoint"
WEIGHTS_FORMAT = "mpcore.weights"
VERSION = 1


def atomic_write(path: str | os.PathLike[str], payload: Any) -> None:
    """Pickle ``payload`` to ``path`` atomically (temp file + fsync + os.replace)."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(path: str | os.PathLike[str], expected: str) -> dict[str, Any]:
    with open(os.fspath(path), "rb") as f:
        try:
            data = pickle.load(f)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
            raise ValueError(f"{os.fspath(path)!r} is not an {expected} file (it does not "
                             f"unpickle: {exc})") from exc
    if not isinstance(data, dict) or data.get("format") != expected:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{os.fspath(path)!r} is not an {expected} file (found {found!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"{os.fspath(path)!r} has version {data.get('version')!r}; this "
                         f"mpcore reads version {VERSION}")
    return data


def _check_weights(model: Any, names: list[str], values: list[Any], path: str) -> None:
    own = model.weights
    if len(values) != len(own):
        raise ValueError(f"{path!r} holds {len(values)} weights, model {model.name!r} has "
                         f"{len(own)}")
    for var, name, value in zip(own, names, values):
        if tuple(value.shape) != var.shape:
            raise ValueError(f"weight {name!r} in {path!r} has shape {tuple(value.shape)}, "
                             f"model weight {var.name!r} has shape {var.shape}")


def save_weights(model: Any, path: str | os.PathLike[str]) -> None:
    atomic_write(path, {"format": WEIGHTS_FORMAT, "version": VERSION,
                        "names": [v.name for v in model.weights],
                        "values": model.get_weights()})


def load_weights(model: Any, path: str | os.PathLike[str]) -> None:
    data = read(path, WEIGHTS_FORMAT)
    _check_weights(model, data["names"], data["values"], os.fspath(path))
    model.set_weights(data["values"])


def save(path: str | os.PathLike[str], model: Any, optimizer: Any = None,
         **extra: Any) -> None:
    """Write a full checkpoint of ``model`` (and ``optimizer``, by default the model's)."""
    opt = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    payload = {
        "format": FORMAT, "version": VERSION,
        "names": [v.name for v in model.weights], "values": model.get_weights(),
        "optimizer": None if opt is None else opt.get_state(model.trainable_variables),
        "random": _random.get_state(),
        "train_step": getattr(model, "_train_steps", 0),
        "extra": extra,
    }
    atomic_write(path, payload)


def restore(path: str | os.PathLike[str], model: Any, optimizer: Any = None) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save` into ``model`` (built, with the same
    architecture) and its optimizer; restores ``mp.random``'s state. Returns ``extra``."""
    data = read(path, FORMAT)
    _check_weights(model, data["names"], data["values"], os.fspath(path))
    opt = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if data["optimizer"] is not None and opt is None:
        raise ValueError(f"{os.fspath(path)!r} holds optimizer state but the model has no "
                         "optimizer: compile it (or pass optimizer=) before restoring")
    model.set_weights(data["values"])
    if data["optimizer"] is not None:
        opt.set_state(model.trainable_variables, data["optimizer"])
    _random.set_state(data["random"])
    if hasattr(model, "_train_steps"):
        model._train_steps = int(data["train_step"])
    return dict(data["extra"])
