"""The training loops of a Model, Keras 3's ``fit``, ``evaluate``, ``predict`` and their
``*_on_batch`` forms, over the steps of :mod:`mpcore.models.steps` (the built-in fused steps,
or a model's own ``train_step``/``test_step``/``predict_step``).

Training on a device: ``fit`` moves ``x`` and ``y`` to the backend once and slices batches there
(a shuffled epoch gathers with one ``take`` per batch from a permutation drawn from
``mp.random``). A built-in step makes no host read of its own except the loss-scale update's
single read of the "all finite" flag under mixed_float16; metrics accumulate on the device and
are read when the progress bar refreshes (at most a few times a second) and at the end of each
epoch. An overridden step's returned logs are read at those same moments (and for callbacks that
read per-batch results), the last step's giving the epoch's logs, as Keras 3's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mpcore import arguments as _args
from mpcore import callbacks as _callbacks
from mpcore import ops
from mpcore import random as _random
from mpcore.distribution import results as _global
from mpcore.distribution import sharding as _sharding
from mpcore.layers.base import flatten
from mpcore.models import data as _data
from mpcore.models import progress as _progress
from mpcore.models.steps import Steps, host_logs

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
                       return_dict: bool = False) -> Any:
        """One training step on one batch; returns the loss (and metrics) as Python floats."""
        return self._on_batch("train", x, y, reset_metrics, return_dict)

    def test_on_batch(self, x: Any, y: Any, reset_metrics: bool = True,
                      return_dict: bool = False) -> Any:
        """The loss (and metrics) of one batch, without training, as Python floats."""
        return self._on_batch("test", x, y, reset_metrics, return_dict)

    def _on_batch(self, kind: str, x: Any, y: Any, reset_metrics: bool,
                  return_dict: bool) -> Any:
        custom = self._overrides(f"{kind}_step")
        self._require_compiled(need_optimizer=kind == "train", need_loss=not custom)
        reset_metrics = _args.flag("reset_metrics", reset_metrics)
        return_dict = _args.flag("return_dict", return_dict)
        xd, yd = self._batch(x, y, f"{kind}_on_batch")
        if reset_metrics:
            self.reset_metrics()
        if custom:
            logs = host_logs(self._custom_step(kind, (xd, yd)), f"{kind}_step")
            self._train_steps += kind == "train"
            return logs if return_dict else _values(logs)
        if kind == "train":
            self._train_batch(xd, yd)
        else:
            self._test_batch(xd, yd)
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

    def _xy(self, x: Any, y: Any, what: str) -> tuple[Any, Any, int]:
        """``x`` and ``y`` on the device and their number of samples, which must agree."""
        if x is None or y is None:
            raise ValueError(f"{what} needs x and y")
        xd, yd = self._x(x, what), _data.to_device(y)
        n, n_y = _data.count(xd, "x"), _data.count(yd, "y")
        if n_y != n:
            raise ValueError(f"x has {n} samples but y has {n_y}")
        return xd, yd, n

    def _batch(self, x: Any, y: Any, what: str) -> tuple[Any, Any]:
        xd, yd, n = self._xy(x, y, what)
        if n == 0:
            raise ValueError(f"{what} got no samples")  # as fit and evaluate: no made-up score
        return xd, yd

    # --- fit / evaluate / predict ---------------------------------------------------------
    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: int | str = 1, callbacks: Sequence[_callbacks.Callback] | None = None,
            validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
            initial_epoch: int = 0) -> _callbacks.History:
        """Train for ``epochs`` (from ``initial_epoch``). ``validation_split`` holds out the
        last fraction of the data before shuffling, as Keras; ``verbose``: 0 silent, 1 a
        progress bar during each epoch (tqdm, on a terminal or in a notebook) and its line at
        its end, 2 the line only; on stdout, as Keras prints. Returns the History."""
        custom = self._overrides("train_step")
        self._require_compiled(need_loss=not custom)
        batch_size = _args.batch_size(batch_size)
        epochs = _args.integer("epochs", epochs, 0)
        initial_epoch = _args.integer("initial_epoch", initial_epoch, 0)
        verbose = _args.verbose(verbose)
        validation_split = _args.number("validation_split", validation_split, 0.0, 1.0,
                                        high_open=True)
        shuffle = _args.flag("shuffle", shuffle)
        callbacks = _args.instances("callbacks", callbacks, _callbacks.Callback,
                                    "mp.callbacks.Callback")
        xd, yd, n, val = _data.fit_data(self, x, y, validation_split, validation_data)
        steps = _sharding.plan("fit", n, batch_size, _data.count(val[0], "x") if val else 0,
                               epochs)  # every rank the same data, before the first step
        verbose = _sharding.begin_fit(self, verbose)  # rank 0's weights; rank 0 prints
        history = _callbacks.History()
        cbs = _callbacks.CallbackList([*callbacks, history])  # last, as Keras 3: it sees keys
        # that callbacks add to the epoch's logs (LearningRateScheduler's "learning_rate")
        cbs.set_model(self)
        val_names = [f"val_{k}" for k in self.metrics_names] if val is not None else []
        cbs.set_params({"epochs": epochs, "steps": steps, "batch_size": batch_size,
                        "samples": n, "verbose": verbose,
                        "metrics": [*self.metrics_names, *val_names, "time_per_sample"]})
        self.stop_training = False
        self.history = history
        backend = flatten(xd)[0].backend
        per_batch = _callbacks.per_batch_results(callbacks, _sharding.world_size())
        cbs.on_train_begin()
        resumed = self.__dict__.pop("_initial_epoch", None)  # set by BackupAndRestore
        initial_epoch = initial_epoch if resumed is None else resumed
        step_logs: Any = {}
        for epoch in range(initial_epoch, epochs):
            self.reset_metrics()
            cbs.on_epoch_begin(epoch)
            order = None
            if shuffle:
                with _random.shared():  # the same shuffle on every rank
                    order = ops.random_permutation(n, backend=backend)
            bar = _progress.progress_bar(epoch, epochs, steps) if verbose == 1 else None
            start = last_refresh = time.perf_counter()
            for step in range(steps):
                cbs.on_train_batch_begin(step)
                lo, hi = step * batch_size, min((step + 1) * batch_size, n)
                a, b = _sharding.shard(lo, hi, train=True)  # this rank's rows of the batch
                xb, yb = _data.rows(xd, a, b, order), _data.rows(yd, a, b, order)
                if custom:   # the user's train_step: its returned logs, read when needed
                    step_logs = self._custom_step("train", (xb, yb))
                    self._train_steps += 1
                    results = host_logs(step_logs, "train_step") if per_batch else None
                else:
                    self._train_batch(xb, yb)
                    results = self._results(True) if per_batch else None  # (the bar shows)
                cbs.on_train_batch_end(step, _callbacks.batch_logs(step, hi - lo, results))
                if bar is not None:
                    bar.update(1)
                    now = time.perf_counter()
                    if (now - last_refresh >= _REFRESH_S and step + 1 < steps
                            and _sharding.world_size() == 1):  # a global read needs every rank
                        last_refresh = now
                        now_logs = results or (host_logs(step_logs, "train_step") if custom
                                               else self._results(True))
                        bar.set_postfix_str(_progress.format_logs(now_logs), refresh=True)
                if self.stop_training:
                    break
            backend.synchronize()
            elapsed = time.perf_counter() - start
            logs = host_logs(step_logs, "train_step") if custom else self._results(True)
            if val is not None:
                val_logs = self.evaluate(val[0], val[1], batch_size=batch_size, verbose=0,
                                         return_dict=True, _validate=False)
                logs.update({f"val_{k}": v for k, v in val_logs.items()})
            timing = f"{elapsed:.2f}s, {elapsed / n * 1e6:.0f}us/sample"
            if bar is not None:
                bar.close()      # (it goes: the epoch's line below holds all of its logs)
            if verbose:
                print(_progress.epoch_line(epoch, epochs, timing, logs), flush=True)
            logs["time_per_sample"] = elapsed / n
            cbs.on_epoch_end(epoch, logs)
            if self.stop_training:
                break
        cbs.on_train_end()
        return history

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None,
                 verbose: int | str = 1, return_dict: bool = False,
                 _validate: bool = True) -> Any:
        """The loss (and metrics) over ``x``/``y``: a float, or [loss, *metrics], or a dict."""
        custom = self._overrides("test_step")
        self._require_compiled(need_optimizer=False, need_loss=not custom)
        batch_size = _args.batch_size(batch_size)
        verbose = _sharding.verbosity(_args.verbose(verbose))
        return_dict = _args.flag("return_dict", return_dict)
        xd, yd, n = self._xy(x, y, "evaluate")
        if _validate:  # not fit's validation: its weights are rank 0's already
            _data.validate_labels(self, xd, yd, "y")
            _sharding.begin_evaluate(self)
        if n == 0:
            raise ValueError("evaluate got no samples")
        self.reset_metrics()
        steps = _sharding.plan("evaluate", n, batch_size)
        start = time.perf_counter()
        step_logs: Any = {}
        for step in range(steps):
            lo, hi = _sharding.shard(step * batch_size, min((step + 1) * batch_size, n), False)
            xb, yb = _data.rows(xd, lo, hi, None), _data.rows(yd, lo, hi, None)
            if custom:
                step_logs = self._custom_step("test", (xb, yb))
            else:
                self._test_batch(xb, yb)
        logs = host_logs(step_logs, "test_step") if custom else self._results(True)
        if verbose:
            elapsed = time.perf_counter() - start
            print(f"{steps}/{steps} - {elapsed:.2f}s - {_progress.format_logs(logs)}", flush=True)
        return logs if return_dict else _values(logs)

    def predict(self, x: Any, batch_size: int | None = None, verbose: int | str = 0) -> Any:
        """Outputs for ``x``, batch by batch, as writable host arrays (``verbose``: a line
        with the time taken). Under a distribution: this rank's, on the whole of ``x``."""
        batch_size = _args.batch_size(batch_size)
        verbose = _sharding.verbosity(_args.verbose(verbose))  # rank 0 prints
        return self._predict(self._x(x, "predict"), batch_size, verbose, "predict")

    def predict_on_batch(self, x: Any) -> Any:
        xd = self._x(x, "predict_on_batch")
        return self._predict(xd, max(1, _data.count(xd, "x")), 0, "predict_on_batch")

    def _predict(self, xd: Any, batch_size: int, verbose: int, what: str) -> Any:
        n = _data.count(xd, "x")
        if n == 0:
            raise ValueError(f"{what} got no samples")
        start = time.perf_counter()
        flat = [self._step("predict", self._predict_compute,
                           _data.rows(xd, lo, min(lo + batch_size, n), None))
                for lo in range(0, n, batch_size)]
        # A copy the caller owns, as Keras' (the backend's host view is read-only).
        joined = [ops.concat([f[i] for f in flat], axis=0).numpy().copy()
                  for i in range(len(flat[0]))]
        if verbose:
            steps = len(flat)
            print(f"{steps}/{steps} - {time.perf_counter() - start:.2f}s", flush=True)
        return joined[0] if len(joined) == 1 else joined

    def _predict_compute(self, x: Any) -> list[Any]:
        # predict_step (Keras 3's, overridable) gets (x,), as Keras' data adapters give it:
        # a list of inputs is then never taken for (x, y)
        return flatten(self.predict_step((x,)))
