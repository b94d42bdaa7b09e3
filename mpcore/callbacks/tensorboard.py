"""Keras 3's TensorBoard callback, writing event files with tensorboardX (the ``tensorboard``
extra: ``pip install -e ".[tensorboard]"`` in the checkout; no TensorFlow needed).

Where Keras writes, with the same tags: ``<log_dir>/train`` gets ``epoch_<key>`` for each
training log key and ``epoch_learning_rate`` at step ``epoch``; ``<log_dir>/validation`` gets
``epoch_<key>`` for each ``val_<key>``. mpcore adds ``epoch_loss_scale`` when the optimizer is a
LossScaleOptimizer (the loss scale after the epoch's last step). With ``update_freq="batch"``
or an integer N, ``batch_<key>``, ``batch_learning_rate`` (and ``batch_loss_scale``) go to
``train`` every N batches, at the count of batches since ``fit`` began; only then does ``fit``
read the loss and metrics at each batch end (a host read per batch).
"""

from __future__ import annotations

import os
import time
from typing import Any

from mpcore.callbacks.base import Callback
from mpcore.core import arguments as _args
from mpcore.plugins.extras import install_command

_UNSUPPORTED = {"write_images": False, "profile_batch": 0, "embeddings_freq": 0,
                "embeddings_metadata": None}


def _writer_class() -> Any:
    try:
        from tensorboardX import SummaryWriter
    except ImportError as exc:
        raise ImportError("mp.callbacks.TensorBoard writes its event files with tensorboardX, "
                          f"which is not installed: {install_command('tensorboard')} (or "
                          f"pip install tensorboardX) ({exc})") from exc
    return SummaryWriter


class TensorBoard(Callback):
    """Scalars for TensorBoard (see the module's docstring for the tags). ``histogram_freq``
    N > 0 also writes a histogram of each weight every N epochs (one host read per weight).
    ``write_graph`` is accepted and writes nothing (Keras 3 documents it as not supported);
    ``write_steps_per_second`` adds ``epoch_steps_per_second`` (and ``batch_steps_per_second``).
    Images, profiling and embeddings are not supported: setting them is an error."""

    def __init__(self, log_dir: str | os.PathLike[str] = "logs", histogram_freq: int = 0,
                 write_graph: bool = True, write_images: bool = False,
                 write_steps_per_second: bool = False, update_freq: str | int = "epoch",
                 profile_batch: int = 0, embeddings_freq: int = 0,
                 embeddings_metadata: Any = None) -> None:
        super().__init__()
        self._writer_class = _writer_class()   # a missing writer fails here, not mid-fit
        given = {"write_images": write_images, "profile_batch": profile_batch,
                 "embeddings_freq": embeddings_freq, "embeddings_metadata": embeddings_metadata}
        for name, value in given.items():
            if value != _UNSUPPORTED[name]:
                raise ValueError(f"mp.callbacks.TensorBoard does not support {name} (got "
                                 f"{value!r}); supported: log_dir, histogram_freq, "
                                 "write_steps_per_second, update_freq")
        if update_freq == "batch":
            update_freq = 1
        if update_freq != "epoch" and (isinstance(update_freq, bool)
                                       or not isinstance(update_freq, int) or update_freq < 1):
            raise ValueError(f"update_freq must be 'epoch', 'batch' or an integer >= 1 (a "
                             f"number of batches), got {update_freq!r}")
        self.log_dir = os.fspath(log_dir)
        self.histogram_freq = _args.integer("histogram_freq", histogram_freq, 0)
        self.write_graph = _args.flag("write_graph", write_graph)
        self.write_steps_per_second = _args.flag("write_steps_per_second",
                                                 write_steps_per_second)
        self.update_freq: str | int = update_freq
        # per-batch results are read from the device only for a batch-level update_freq
        self.reads_batch_results = update_freq != "epoch"
        self._writers: dict[str, Any] = {}
        self._global_train_batch = 0
        self._epoch_start = self._batch_start = 0.0
        self._epoch_iterations = 0

    def _writer(self, which: str) -> Any:
        if which not in self._writers:
            folder = os.path.join(self.log_dir, which)
            self._writers[which] = self._writer_class(logdir=folder)
        return self._writers[which]

    def _extras(self) -> dict[str, float]:
        """The learning rate and, under loss scaling, the loss scale (host values)."""
        opt = getattr(self.model, "optimizer", None)
        out: dict[str, float] = {}
        if opt is None:
            return out
        if hasattr(opt, "learning_rate"):
            out["learning_rate"] = float(opt.learning_rate)
        scale = getattr(opt, "loss_scale", None)
        if scale is not None:
            out["loss_scale"] = float(scale())
        return out

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._global_train_batch = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._epoch_start = time.perf_counter()
        self._epoch_iterations = int(getattr(self.model.optimizer, "iterations", 0))

    def on_train_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self._global_train_batch += 1
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        if self.update_freq == "epoch" or self._global_train_batch % int(self.update_freq):
            return
        step = self._global_train_batch
        writer = self._writer("train")
        values = {k: v for k, v in (logs or {}).items() if k not in ("batch", "size")}
        values.update(self._extras())
        if self.write_steps_per_second:
            values["steps_per_second"] = 1.0 / max(time.perf_counter() - self._batch_start,
                                                   1e-9)
        for name, value in values.items():
            writer.add_scalar(f"batch_{name}", float(value), step)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        logs = logs or {}
        train = {k: v for k, v in logs.items() if not k.startswith("val_")}
        train.update(self._extras())
        if self.write_steps_per_second:
            done = int(getattr(self.model.optimizer, "iterations", 0)) - self._epoch_iterations
            train["steps_per_second"] = done / max(time.perf_counter() - self._epoch_start,
                                                   1e-9)
        writer = self._writer("train")
        for name, value in train.items():
            writer.add_scalar(f"epoch_{name}", float(value), epoch)
        val = {k[4:]: v for k, v in logs.items() if k.startswith("val_")}
        if val:
            vwriter = self._writer("validation")
            for name, value in val.items():
                vwriter.add_scalar(f"epoch_{name}", float(value), epoch)
            vwriter.flush()
        if self.histogram_freq and epoch % self.histogram_freq == 0:
            for var in self.model.weights:
                writer.add_histogram(var.name.replace(":", "_") + "/histogram", var.numpy(),
                                     epoch)
        writer.flush()   # an epoch's values are on disk for a TensorBoard watching the run

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
