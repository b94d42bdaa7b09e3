"""The ``.keras`` file, Keras 3's: a zip of ``metadata.json``, ``config.json`` (the model's
serialized config, :mod:`mpcore.saving.serialization`) and ``model.weights.h5`` (the weights
and the optimizer's state, :mod:`mpcore.saving.weights_h5`); and the ``.weights.h5`` file of
``save_weights``, the same h5 layout alone. No pickle anywhere: loading reads JSON and arrays.

Files are written to a temporary file beside the target and renamed over it, so a failed save
leaves the previous file (or none). A file that cannot be read (not a zip, no config.json, a
damaged weights file) is one ValueError naming the file and what is wrong.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import zipfile
from collections.abc import Callable
from typing import Any

from mpcore.checkpoint import checkpoint as _checkpoint
from mpcore.saving import serialization, weights_h5

CONFIG = "config.json"
METADATA = "metadata.json"
WEIGHTS = "model.weights.h5"
#: ``metadata.json``'s ``keras_version``: the Keras 3 release whose files and loader the
#: tests hold mpcore's to (``tests/saving/data``); Keras reads the field for nothing.
KERAS_FORMAT_VERSION = "3.15.1"


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:    # a dependency of mpcore: only a broken install lacks it
        raise ImportError("saving in Keras' format needs h5py: pip install h5py") from exc
    return h5py


def _atomic(path: str, write: Callable[[Any], None]) -> None:
    """Write through ``write(file)`` atomically, as mpcore's checkpoints are written (a
    temporary file beside ``path``, fsynced, renamed). Under a distribution every rank calls
    it (as save_weights): rank 0 writes, the ranks hold the same state, and every rank waits
    until the file is complete."""
    _checkpoint.write_on_rank_zero(path, write, "model.save/save_weights")


def _check_target(filepath: Any, suffix: str, overwrite: bool) -> str:
    path = os.fspath(filepath)
    if not isinstance(path, str) or not path.endswith(suffix):
        raise ValueError(f"expected a path ending in {suffix!r}, got {filepath!r}")
    if not overwrite and os.path.exists(path):
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    return path


def _weights_bytes(groups: list[weights_h5.Entry]) -> bytes:
    buffer = io.BytesIO()
    with _h5py().File(buffer, "w") as h5:
        weights_h5.write(h5, groups)
    return buffer.getvalue()


# --- models -------------------------------------------------------------------------------------
def save_model(model: Any, filepath: str | os.PathLike[str], overwrite: bool = True,
               include_optimizer: bool = True) -> None:
    """Save ``model`` as a ``.keras`` file Keras 3 can load: its config, compile config,
    weights and (``include_optimizer``) the optimizer's state."""
    path = _check_target(filepath, ".keras", overwrite)
    config = serialization.serialize_keras_object(model)
    if not include_optimizer:
        config.pop("compile_config", None)
    metadata = {"keras_version": KERAS_FORMAT_VERSION,
                "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S"),
                "saved_by": "mpcore"}
    weights = _weights_bytes(weights_h5.entries(model, include_optimizer))

    def write(f: Any) -> None:
        with zipfile.ZipFile(f, "w") as zf:
            zf.writestr(METADATA, json.dumps(metadata))
            zf.writestr(CONFIG, json.dumps(config))
            zf.writestr(WEIGHTS, weights)

    _atomic(path, write)


def load_model(filepath: str | os.PathLike[str], custom_objects: dict[str, Any] | None = None,
               compile: bool = True, safe_mode: bool = True) -> Any:  # noqa: A002 - Keras' name
    """The model a ``.keras`` file holds, its weights loaded, compiled as it was saved
    (``compile=False``: uncompiled) with its optimizer's state. ``safe_mode`` refuses
    lambdas, as Keras 3's (mpcore loads none in any mode)."""
    path = os.fspath(filepath)
    if not str(path).endswith(".keras"):
        raise ValueError(f"load_model reads .keras files, got {filepath!r} (weights files: "
                         "model.load_weights; mpcore checkpoints: model.load_checkpoint)")
    config, weights = _read_archive(path)
    if not compile:
        config = {k: v for k, v in config.items() if k != "compile_config"}
    model = serialization.deserialize_keras_object(config, custom_objects, safe_mode=safe_mode)
    _load_weights_bytes(model, weights, f"{path} ({WEIGHTS})", optimizer=compile)
    return model


def _read_archive(path: str) -> tuple[dict[str, Any], bytes]:
    try:
        with zipfile.ZipFile(path, "r") as zf:
            names = zf.namelist()
            missing = [n for n in (CONFIG, WEIGHTS) if n not in names]
            if missing:
                raise ValueError(f"{path} is not a complete .keras file: it lacks "
                                 f"{', '.join(missing)} (it holds {', '.join(names) or 'nothing'})")
            raw_config = zf.read(CONFIG)
            weights = zf.read(WEIGHTS)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{path} is not a .keras file (a zip archive): {exc}") from None
    try:
        config = json.loads(raw_config)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {CONFIG} is not valid JSON ({exc})") from None
    if not isinstance(config, dict) or "class_name" not in config:
        raise ValueError(f"{path}: {CONFIG} does not describe a model (no class_name)")
    return config, weights


def _read_h5(source: Any, where: str) -> dict[str, list[Any]]:
    h5py = _h5py()
    try:
        with h5py.File(source, "r") as h5:
            return weights_h5.read(h5)
    except (OSError, KeyError, RuntimeError) as exc:
        raise ValueError(f"{where} is not a readable weights file (damaged or truncated?): "
                         f"{exc}") from None


def _load_weights_bytes(model: Any, data: bytes, where: str, optimizer: bool) -> None:
    _load_stored(model, _read_h5(io.BytesIO(data), where), where, optimizer)


def _load_stored(model: Any, stored: dict[str, list[Any]], where: str,
                 optimizer: bool) -> None:
    groups = weights_h5.entries(model, include_optimizer=False)
    opt = getattr(model, "optimizer", None)
    saved_opt = {p for p in stored if p == "optimizer" or p.startswith("optimizer/")}
    if optimizer and opt is not None and saved_opt:
        groups += _optimizer_groups(opt, model.trainable_variables, stored)
    else:
        stored = {p: v for p, v in stored.items() if p not in saved_opt}
    weights_h5.assign(weights_h5.plan(groups, stored, where))


def _optimizer_groups(opt: Any, var_list: list[Any], stored: dict[str, list[Any]]
                      ) -> list[weights_h5.Entry]:
    """The optimizer's groups to read, also across a LossScaleOptimizer and a plain one (a
    mixed_float16 run continued in float32, or the reverse: the inner optimizer's state)."""
    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    scaled_file = "optimizer/inner_optimizer" in stored
    if isinstance(opt, LossScaleOptimizer) and not scaled_file:
        return weights_h5.optimizer_entries(opt.inner_optimizer, var_list, "optimizer")
    if not isinstance(opt, LossScaleOptimizer) and scaled_file:
        stored.pop("optimizer")
        return weights_h5.optimizer_entries(opt, var_list, "optimizer/inner_optimizer")
    return weights_h5.optimizer_entries(opt, var_list, "optimizer")


# --- weights ------------------------------------------------------------------------------------
def save_weights(model: Any, filepath: str | os.PathLike[str], overwrite: bool = True) -> None:
    """The model's weights (and its optimizer's state, as Keras 3 writes them) in a
    ``.weights.h5`` file."""
    path = _check_target(filepath, ".weights.h5", overwrite)
    data = _weights_bytes(weights_h5.entries(model))
    _atomic(path, lambda f: f.write(data))


def load_weights(model: Any, filepath: str | os.PathLike[str]) -> None:
    """Load a ``.weights.h5`` file (Keras 3's or mpcore's), or the weights of a ``.keras``
    file, into ``model``, and its optimizer's state when the model is compiled and the file
    has it. Everything is checked before anything is assigned."""
    path = os.fspath(filepath)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no weights file {path}")
    if path.endswith(".keras"):         # Keras 3 reads the weights of a whole-model file too
        _, weights = _read_archive(path)
        _load_weights_bytes(model, weights, f"{path} ({WEIGHTS})", optimizer=True)
        return
    _load_stored(model, _read_h5(path, path), path, optimizer=True)
