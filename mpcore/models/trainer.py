"""The training loops of a Model, Keras 3's ``fit``, ``evaluate``, ``predict`` and their
``*_on_batch`` forms, over the steps of :mod:`mpcore.models.steps` (the built-in fused steps,
or a model's own ``train_step``/``test_step``/``predict_step``).

The data (arrays, generators, PyDatasets; ``sample_weight``, ``class_weight``, the steps of an
epoch) comes through :mod:`mpcore.models.data_adapters`: arrays are moved to the backend once
and sliced there (a shuffled epoch gathers with one ``take`` per batch from a permutation drawn
from ``mp.random``); a generator's or a PyDataset's batches are loaded on worker threads while
the step runs. A built-in step makes no host read of its own except the loss-scale update's
single read of the "all finite" flag under mixed_float16; metrics accumulate on the device and
are read when the progress bar refreshes (at most a few times a second) and at the end of each
epoch. An overridden step's returned logs are read at those same moments (and for callbacks that
read per-batch results), the last step's giving the epoch's logs, as Keras 3's.
"""

from __future__ import annotations

import time
from collections.abc import Container, Mapping, Sequence
from typing import Any

from mpcore import callbacks as _callbacks
from mpcore import ops
from mpcore.core import arguments as _args
from mpcore.distribution import results as _global
from mpcore.distribution import sharding as _sharding
from mpcore.layers.base import flatten
from mpcore.models import data as _data
from mpcore.models import data_adapters as _adapters
from mpcore.models import progress as _progress
from mpcore.models.steps import Steps, host_logs, pack_x_y_sample_weight

_REFRESH_S = 0.25  # progress-bar refresh period: each refresh reads the metrics once


def _values(logs: dict[str, Any]) -> Any:
    """Keras' non-dict result: the one value, or the list of them."""
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


class Trainer(Steps):
    """Mixed into Model: fit, evaluate, predict and the on-batch forms."""

    _loss_tracker: Any
    compiled_metrics: list[Any]
    metrics_names: list[str]
    _tracked_metrics: Any
    stop_training: bool
    history: Any
    _train_steps: int
    _is_graph: bool
    _graph_inputs: Any
    name: str

    def train_on_batch(self, x: Any, y: Any, reset_metrics: bool = True,
                       return_dict: bool = False, sample_weight: Any = None,
                       class_weight: Mapping[int, float] | None = None) -> Any:
        """One training step on one batch (weighted by ``sample_weight``, or by
        ``class_weight`` from the labels); returns the loss (and metrics) as Python floats."""
        return self._on_batch("train", x, y, reset_metrics, return_dict, sample_weight,
                              class_weight)

    def test_on_batch(self, x: Any, y: Any, reset_metrics: bool = True,
                      return_dict: bool = False, sample_weight: Any = None) -> Any:
        """The loss (and metrics) of one batch, without training, as Python floats."""
        return self._on_batch("test", x, y, reset_metrics, return_dict, sample_weight, None)

    def _on_batch(self, kind: str, x: Any, y: Any, reset_metrics: bool, return_dict: bool,
                  sample_weight: Any, class_weight: Any) -> Any:
        custom = self._overrides(f"{kind}_step")
        self._require_compiled(need_optimizer=kind == "train", need_loss=not custom)
        reset_metrics = _args.flag("reset_metrics", reset_metrics)
        return_dict = _args.flag("return_dict", return_dict)
        what = f"{kind}_on_batch"
        if x is None or y is None:
            raise ValueError(f"{what} needs x and y")
        data = _adapters.arrays(self, x, y, sample_weight, class_weight, what)
        if data[3] == 0:
            raise ValueError(f"{what} got no samples")  # as fit and evaluate: no made-up score
        if reset_metrics:
            self.reset_metrics()
        logs = self._run_step(kind, data, custom, what)
        if custom:
            self._train_steps += kind == "train"
            logs = host_logs(logs, f"{kind}_step")
            return logs if return_dict else _values(logs)
        return self._results(return_dict)

    def reset_metrics(self) -> None:
        for metric in self._tracked_metrics():
            metric.reset_state()

    def _results(self, return_dict: bool) -> Any:
        """The loss and metrics (under a distribution, over every rank's samples)."""
        logs = dict(zip(self.metrics_names,
                        _global.results(self._tracked_metrics())))
        return logs if return_dict else _values(logs)

    # --- data -----------------------------------------------------------------------------
    def _x(self, x: Any, what: str) -> Any:
        """``x`` on the device, a dict matched to the inputs by name first (on the host)."""
        if x is None:
            raise ValueError(f"{what} needs x")
        if self._is_graph:
            x = _data.match_inputs(x, self._graph_inputs, self.name)
        return _data.to_device(x)

    def _run_step(self, kind: str, batch: _adapters.Batch, custom: bool, what: str) -> Any:
        """One train or test step on a batch: the user's step gets Keras' packed data (its
        logs are returned), the built-in one x, y and the sample weights."""
        xb, yb, swb, _ = batch
        if custom:
            return self._custom_step(kind, pack_x_y_sample_weight(xb, yb, swb))
        if yb is None:
            raise ValueError(f"{what} needs labels: the data's batches hold x only; give "
                             "(x, y) or (x, y, sample_weight) batches")
        if kind == "train":
            self._train_batch(xb, yb, swb)
        else:
            self._test_batch(xb, yb, swb)
        return None

    # --- fit / evaluate / predict ---------------------------------------------------------
    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: int | str = "auto",
            callbacks: Sequence[_callbacks.Callback] | None = None,
            validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
            class_weight: Mapping[int, float] | None = None, sample_weight: Any = None,
            initial_epoch: int = 0, steps_per_epoch: int | None = None,
            validation_steps: int | None = None, validation_batch_size: int | None = None,
            validation_freq: int | Container[int] = 1) -> _callbacks.History:
        """Train for ``epochs`` (from ``initial_epoch``), Keras 3's signature. ``x``: arrays
        (with ``y``, ``sample_weight`` or ``class_weight``), a generator or a
        ``mp.utils.PyDataset`` yielding ``(x, y)`` or ``(x, y, sample_weight)`` batches
        (:mod:`mpcore.models.data_adapters`); ``steps_per_epoch`` batches an epoch (default:
        one pass). ``validation_split`` holds out the last fraction of the arrays before
        shuffling, as Keras; ``validation_data``: ``(x, y)``, ``(x, y, sample_weight)``, a
        generator or a PyDataset, evaluated every ``validation_freq`` epochs (or at the epochs
        listed). ``verbose``: 0 silent, 1 a progress bar during each epoch (tqdm, on a terminal
        or in a notebook) and its line at its end, 2 the line only; on stdout, as Keras
        prints. Returns the History."""
        custom = self._overrides("train_step")
        self._require_compiled(need_loss=not custom)
        batch_size = None if batch_size is None else _args.batch_size(batch_size)
        epochs = _args.integer("epochs", epochs, 0)
        initial_epoch = _args.integer("initial_epoch", initial_epoch, 0)
        verbose = _args.verbose(verbose)
        validation_split = _args.number("validation_split", validation_split, 0.0, 1.0,
                                        high_open=True)
        shuffle = _args.flag("shuffle", shuffle)
        callbacks = _args.instances("callbacks", callbacks, _callbacks.Callback,
                                    "mp.callbacks.Callback")
        steps_per_epoch = _optional_integer("steps_per_epoch", steps_per_epoch)
        validation_steps = _optional_integer("validation_steps", validation_steps)
        validation_batch_size = (None if validation_batch_size is None else
                                 _args.integer("validation_batch_size", validation_batch_size, 1))
        validation_freq = _validation_freq(validation_freq)
        train, val_arrays, val_iter = _adapters.fit_data(
            self, x, y, sample_weight, class_weight, batch_size, validation_split,
            validation_data, shuffle, steps_per_epoch, validation_steps, epochs, not custom)
        try:
            if (val_iter is not None and not val_iter.adapter.restartable
                    and validation_steps is None
                    and sum(_validates(e, validation_freq)
                            for e in range(initial_epoch, epochs)) > 1):
                raise ValueError("validation_data is a generator, which cannot restart: give "
                                 "validation_steps (the batches of each validation), or a "
                                 "PyDataset, or arrays")
            return self._fit_epochs(train, val_arrays, val_iter, custom, batch_size, epochs,
                                    verbose, callbacks, initial_epoch, validation_steps,
                                    validation_batch_size, validation_freq)
        finally:
            train.adapter.close()
            if val_iter is not None:
                val_iter.adapter.close()

    def _fit_epochs(self, train: _adapters.EpochIterator, val_arrays: Any,
                    val_iter: _adapters.EpochIterator | None, custom: bool,
                    batch_size: int | None, epochs: int, verbose: int,
                    callbacks: list[_callbacks.Callback], initial_epoch: int,
                    validation_steps: int | None, validation_batch_size: int | None,
                    validation_freq: Any) -> _callbacks.History:
        verbose = _sharding.begin_fit(self, verbose)  # rank 0's weights; rank 0 prints
        history = _callbacks.History()
        cbs = _callbacks.CallbackList([*callbacks, history])  # last, as Keras 3: it sees keys
        # that callbacks add to the epoch's logs (LearningRateScheduler's "learning_rate")
        cbs.set_model(self)
        validating = val_arrays is not None or val_iter is not None
        val_names = [f"val_{k}" for k in self.metrics_names] if validating else []
        cbs.set_params({"epochs": epochs, "steps": train.num_batches,
                        "batch_size": getattr(train.adapter, "batch_size", batch_size),
                        "samples": train.adapter.samples, "verbose": verbose,
                        "metrics": [*self.metrics_names, *val_names, "time_per_sample"]})
        self.stop_training = False
        self.history = history
        per_batch = _callbacks.per_batch_results(callbacks, _sharding.world_size())
        cbs.on_train_begin()
        resumed = self.__dict__.pop("_initial_epoch", None)  # set by BackupAndRestore
        initial_epoch = initial_epoch if resumed is None else resumed
        step_logs: Any = {}
        for epoch in range(initial_epoch, epochs):
            self.reset_metrics()
            cbs.on_epoch_begin(epoch)
            train.on_epoch_begin()
            steps = train.num_batches   # None: a generator's first epoch (tqdm counts only)
            bar = _progress.progress_bar(epoch, epochs, steps) if verbose == 1 else None
            start = last_refresh = time.perf_counter()
            samples = taken = 0
            for step, batch in train.batches():
                cbs.on_train_batch_begin(step)
                taken, samples = taken + 1, samples + batch[3]
                if custom:   # the user's train_step: its returned logs, read when needed
                    step_logs = self._run_step("train", batch, True, "fit")
                    self._train_steps += 1
                    results = host_logs(step_logs, "train_step") if per_batch else None
                else:
                    self._run_step("train", batch, False, "fit")
                    results = self._results(True) if per_batch else None  # (the bar shows)
                cbs.on_train_batch_end(step, _callbacks.batch_logs(step, batch[3], results))
                if bar is not None:
                    bar.update(1)
                    now = time.perf_counter()
                    if (now - last_refresh >= _REFRESH_S and (steps is None or step + 1 < steps)
                            and _sharding.world_size() == 1):  # a global read needs every rank
                        last_refresh = now
                        now_logs = results or (host_logs(step_logs, "train_step") if custom
                                               else self._results(True))
                        bar.set_postfix_str(_progress.format_logs(now_logs), refresh=True)
                if self.stop_training:
                    break
            train.on_epoch_end()
            if taken == 0:  # the data ran out before this epoch (warned): nothing to log
                if bar is not None:
                    bar.close()
                break
            self._backend_of(batch).synchronize()
            elapsed = time.perf_counter() - start
            # a traced step reads nothing back: the loss scale's "stuck at its floor" warning
            # is decided here, once per epoch (one host read)
            getattr(self.optimizer, "check_loss_scale", lambda: None)()
            logs = host_logs(step_logs, "train_step") if custom else self._results(True)
            if validating and _validates(epoch, validation_freq):
                if val_iter is not None:
                    val_logs = self._evaluate_epoch(val_iter, self._overrides("test_step"), 0,
                                                    "validation_data")
                else:
                    vx, vy, vsw, _ = val_arrays
                    val_logs = self.evaluate(vx, vy, batch_size=validation_batch_size or
                                             batch_size, verbose=0, sample_weight=vsw,
                                             steps=validation_steps, return_dict=True,
                                             _validate=False)
                logs.update({f"val_{k}": v for k, v in val_logs.items()})
            timing = f"{elapsed:.2f}s, {elapsed / samples * 1e6:.0f}us/sample"
            if bar is not None:
                bar.close()      # (it goes: the epoch's line below holds all of its logs)
            if verbose:
                print(_progress.epoch_line(epoch, epochs, timing, logs), flush=True)
            logs["time_per_sample"] = elapsed / samples
            cbs.on_epoch_end(epoch, logs)
            if train.exhausted:  # a generator that ran out: warned, training stops
                self.stop_training = True
            if self.stop_training:
                break
        cbs.on_train_end()
        return history

    @staticmethod
    def _backend_of(batch: _adapters.Batch) -> Any:
        return flatten(batch[0])[0].backend

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None,
                 verbose: int | str = "auto", sample_weight: Any = None,
                 steps: int | None = None, return_dict: bool = False,
                 _validate: bool = True) -> Any:
        """The loss (and metrics) over ``x``/``y`` (weighted by ``sample_weight``), or over a
        generator's or a PyDataset's batches (``steps`` of them, default: one pass): a
        float, or [loss, *metrics], or a dict."""
        custom = self._overrides("test_step")
        self._require_compiled(need_optimizer=False, need_loss=not custom)
        batch_size = None if batch_size is None else _args.batch_size(batch_size)
        verbose = _sharding.verbosity(_args.verbose(verbose))
        return_dict = _args.flag("return_dict", return_dict)
        steps = _optional_integer("steps", steps)
        if _adapters.is_arrays(x):
            if x is None or (y is None and not custom):
                raise ValueError("evaluate needs x and y")
            data = _adapters.arrays(self, x, y, sample_weight, None, "evaluate")
            if _validate:  # not fit's validation: its weights are rank 0's already
                if data[1] is not None:
                    _data.validate_labels(self, data[0], data[1], "y")
                _sharding.begin_evaluate(self)
            n = data[3]
            if n == 0:
                raise ValueError("evaluate got no samples")
            size = batch_size or (max(1, -(-n // steps)) if steps else 32)
            adapter: _adapters.DataAdapter = _adapters.array_adapter(
                data, size, steps, False, False, _sharding.plan("evaluate", n, size))
        else:
            adapter = _adapters.get_adapter(self, x, y, sample_weight, None, batch_size, steps,
                                            False, False, "evaluate")
        try:
            logs = self._evaluate_epoch(_adapters.EpochIterator(adapter, steps, "evaluate"),
                                        custom, verbose, "evaluate")
        finally:
            adapter.close()
        return logs if return_dict else _values(logs)

    def _evaluate_epoch(self, epochs: _adapters.EpochIterator, custom: bool, verbose: int,
                        what: str) -> dict[str, Any]:
        """One epoch of ``epochs`` through the test step: the loss and metrics."""
        self.reset_metrics()
        start = time.perf_counter()
        step_logs: Any = {}
        taken = 0
        epochs.on_epoch_begin()
        for _, batch in epochs.batches():
            taken += 1
            logs = self._run_step("test", batch, custom, what)
            step_logs = logs if custom else step_logs
        epochs.on_epoch_end()
        if taken == 0:
            raise ValueError(f"{what} got no batches: the data ran out")
        logs = host_logs(step_logs, "test_step") if custom else self._results(True)
        if verbose:
            elapsed = time.perf_counter() - start
            print(f"{taken}/{taken} - {elapsed:.2f}s - {_progress.format_logs(logs)}",
                  flush=True)
        return logs

    def predict(self, x: Any, batch_size: int | None = None, verbose: int | str = 0,
                steps: int | None = None) -> Any:
        """Outputs for ``x`` (arrays, a generator or a PyDataset; ``steps`` batches, default
        all), batch by batch, as writable host arrays (``verbose``: a line with the time
        taken). Under a distribution: this rank's, on the whole of ``x``."""
        batch_size = None if batch_size is None else _args.batch_size(batch_size)
        verbose = _sharding.verbosity(_args.verbose(verbose))  # rank 0 prints
        steps = _optional_integer("steps", steps)
        if _adapters.is_arrays(x):
            xd = self._x(x, "predict")
            data = (xd, None, None, _data.count(xd, "x"))
            if data[3] == 0:
                raise ValueError("predict got no samples")
            adapter: _adapters.DataAdapter = _adapters.array_adapter(
                data, batch_size, steps, False, False, shard=False)
        else:
            adapter = _adapters.get_adapter(self, x, None, None, None, batch_size, steps,
                                            False, False, "predict")
        try:
            return self._predict(_adapters.EpochIterator(adapter, steps, "predict"), verbose)
        finally:
            adapter.close()

    def predict_on_batch(self, x: Any) -> Any:
        xd = self._x(x, "predict_on_batch")
        n = _data.count(xd, "x")
        if n == 0:
            raise ValueError("predict_on_batch got no samples")
        adapter = _adapters.array_adapter((xd, None, None, n), n, None, False, False,
                                          shard=False)
        return self._predict(_adapters.EpochIterator(adapter, None, "predict_on_batch"), 0)

    def _predict(self, epochs: _adapters.EpochIterator, verbose: int) -> Any:
        start = time.perf_counter()
        epochs.on_epoch_begin()
        flat = [self._step("predict", self._predict_compute, batch[0])
                for _, batch in epochs.batches()]
        epochs.on_epoch_end()
        if not flat:
            raise ValueError("predict got no batches: the data ran out")
        # A copy the caller owns, as Keras' (the backend's host view is read-only).
        joined = [ops.concat([f[i] for f in flat], axis=0).numpy().copy()
                  for i in range(len(flat[0]))]
        if verbose:
            count = len(flat)
            print(f"{count}/{count} - {time.perf_counter() - start:.2f}s", flush=True)
        return joined[0] if len(joined) == 1 else joined

    def _predict_compute(self, x: Any) -> list[Any]:
        # predict_step (Keras 3's, overridable) gets (x,), as Keras' data adapters give it:
        # a list of inputs is then never taken for (x, y)
        return flatten(self.predict_step((x,)))


def _optional_integer(name: str, value: Any) -> int | None:
    return None if value is None else _args.integer(name, value, 1)


def _validation_freq(value: Any) -> int | Container[int]:
    """Keras' ``validation_freq``: an integer >= 1 (every that many epochs) or a container of
    the (1-based) epochs to validate after."""
    if _args.is_integer(value) and value >= 1:
        return int(value)
    if isinstance(value, (list, tuple, set, frozenset, range)) and all(
            _args.is_integer(v) for v in value):
        return value
    raise ValueError("validation_freq must be an integer >= 1 or a list of epochs (1-based), "
                     f"got {value!r}")


def _validates(epoch: int, freq: int | Container[int]) -> bool:
    """Whether fit validates after (0-based) ``epoch``, as Keras' ``_should_eval``."""
    if isinstance(freq, int):
        return (epoch + 1) % freq == 0
    return epoch + 1 in freq
