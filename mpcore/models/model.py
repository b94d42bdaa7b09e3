"""Model: a functional graph of layers (``mp.Model(inputs, outputs)``) or a subclass with its
own ``call``, plus the Keras training API: compile, fit, evaluate, predict, train_on_batch,
summary, weights and checkpoints.

Training on a device: ``fit`` moves ``x`` and ``y`` to the backend once and slices batches there
(a shuffled epoch gathers with one ``take`` per batch from a permutation drawn from
``mp.random``). A step makes no host read of its own except the loss-scale update's single read
of the "all finite" flag under mixed_float16; metrics accumulate on the device and are read when
the progress bar refreshes (at most a few times a second) and at the end of each epoch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from mpcore import arguments as _args
from mpcore import callbacks as _callbacks
from mpcore import checkpoint as _checkpoint
from mpcore import loss_scale_optimizer as _lso
from mpcore import losses as _losses
from mpcore import metrics as _metrics
from mpcore import ops
from mpcore import optimizers as _optimizers
from mpcore import random as _random
from mpcore import trace_hooks as _trace_hooks
from mpcore.distribution import results as _global
from mpcore.distribution import sharding as _sharding
from mpcore.function import function
from mpcore.layers.base import (
    InputLayer,
    KerasTensor,
    Layer,
    flatten,
    map_structure,
    unique_name,
)
from mpcore.loss_scale_optimizer import LossScaleOptimizer
from mpcore.models import data as _data
from mpcore.models import graph as _graph
from mpcore.models import progress as _progress
from mpcore.models import step_metrics as _step_metrics
from mpcore.models import summary as _summary
from mpcore.tape import GradientTape
from mpcore.tensor import Tensor

_REFRESH_S = 0.25  # progress-bar refresh period: each refresh reads the metrics once


class Model(Layer):
    """``Model(inputs=..., outputs=...)`` over KerasTensors, or subclass it and write
    ``call``. The model's own ``dtype_policy`` (the global policy when it is created) decides
    whether ``compile`` adds loss scaling: a mixed_float16 model gets a LossScaleOptimizer
    (with the policy's loss scale, dynamic by default), a mixed_bfloat16 one does not."""

    _autocast = False

    def __init__(self, inputs: Any = None, outputs: Any = None, name: str | None = None,
                 **kwargs: Any) -> None:
        default = "functional" if inputs is not None else "model"
        super().__init__(name=name or unique_name(default), **kwargs)
        self._is_graph = False
        self.optimizer: Any = None
        self.loss: _losses.Loss | None = None
        self.compiled_metrics: list[_metrics.Metric] = []
        self._loss_tracker = _metrics.Mean("loss")
        self.stop_training = False
        self.history: _callbacks.History | None = None
        self._train_steps = 0
        self.jit_compile: bool | str = "auto"
        self._traced: dict[str, Any] = {}
        if inputs is not None or outputs is not None:
            if inputs is None or outputs is None:
                raise ValueError("a functional Model needs both inputs= and outputs=")
            self._init_graph(inputs, outputs)

    # --- the graph ----------------------------------------------------------------------
    def _init_graph(self, inputs: Any, outputs: Any) -> None:
        flat_in = flatten(inputs)
        for kt in flat_in:
            if not isinstance(kt, KerasTensor) or not isinstance(
                    getattr(kt._node, "layer", None), InputLayer):
                raise TypeError(f"Model inputs must come from mp.Input(...), got {kt!r}")
        flat_out = flatten(outputs)
        for kt in flat_out:
            if not isinstance(kt, KerasTensor):
                raise TypeError(f"Model outputs must be KerasTensors (a layer called on an "
                                f"Input), got {type(kt).__name__}")
        order = _graph.ordered_nodes(flat_in, flat_out)
        self._graph_inputs, self._flat_inputs = inputs, flat_in
        self._graph_outputs, self._flat_outputs = outputs, flat_out
        self._nodes = order
        layers: list[Layer] = [kt._node.layer for kt in flat_in]  # type: ignore[union-attr]
        for node in order:
            if all(node.layer is not x for x in layers):
                layers.append(node.layer)
        self._layers = layers
        self._is_graph = True
        self.built = True

    @property
    def layers(self) -> list[Layer]:
        return list(self._layers)

    def get_layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise ValueError(f"no layer {name!r} in model {self.name!r}; layers: "
                         f"{', '.join(x.name for x in self.layers)}")

    @property
    def inputs(self) -> list[KerasTensor]:
        return list(self._flat_inputs) if self._is_graph else []

    @property
    def outputs(self) -> list[KerasTensor]:
        return list(self._flat_outputs) if self._is_graph else []

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        if not self._is_graph:
            raise NotImplementedError(f"model {self.name!r} has no graph: create it with "
                                      "Model(inputs, outputs) or subclass Model and write call()")
        flat = flatten(_data.match_inputs(inputs, self._graph_inputs, self.name))
        if len(flat) != len(self._flat_inputs):
            raise ValueError(f"model {self.name!r} takes {len(self._flat_inputs)} input(s) "
                             f"({', '.join(str(k.name) for k in self._flat_inputs)}), got "
                             f"{len(flat)}")
        values: dict[int, Tensor] = {}
        for kt, t in zip(self._flat_inputs, flat):
            if not isinstance(t, Tensor):
                t = ops.constant(t)
            if len(t.shape) != len(kt.shape) or any(
                    want is not None and want != got for want, got in zip(kt.shape, t.shape)):
                raise ValueError(f"model {self.name!r}: input {kt.name!r} expects shape "
                                 f"{kt.shape}, got {t.shape}")
            if t.dtype != kt.dtype:
                t = ops.cast(t, kt.dtype)
            values[id(kt)] = t
        for node in self._nodes:
            out = node.call(lambda k: values[id(k)], training)
            for kt, t in zip(node.flat_outputs, flatten(out)):
                values[id(kt)] = t
        return map_structure(lambda k: values[id(k)], self._graph_outputs)

    # --- compile --------------------------------------------------------------------------
    def compile(self, optimizer: Any = "rmsprop", loss: Any = None,
                metrics: Sequence[Any] | None = None, jit_compile: bool | str = "auto") -> None:
        """Set the optimizer (a name or an Optimizer), the loss (a name, a Loss or a
        function) and the metrics (names, Metrics or functions). ``jit_compile=True`` runs
        the steps of fit, evaluate and predict as traced steps (:mod:`mpcore.function`):
        traced once per batch shape (a smaller last batch is a second trace), then replayed,
        bit for bit the same as eagerly; the metrics are computed in the step and added to
        their running values after it. ``"auto"`` (the default, as Keras 3's) does the same,
        but a step that cannot be traced (a loss that reads a tensor on the host, say) runs
        eagerly, with one warning, instead of raising; False runs every step eagerly."""
        if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
            raise ValueError(f"jit_compile must be True, False or 'auto', got {jit_compile!r}")
        if isinstance(metrics, str) or callable(metrics):  # a Metric is callable too
            metrics = [metrics]  # a lone metric, not a sequence of them (nor of letters)
        if metrics is not None and not isinstance(metrics, (list, tuple)):
            raise ValueError("metrics must be a metric (a name, an mp.metrics.Metric or a "
                             f"function) or a list of them, got {metrics!r}")
        opt = _optimizers.get(optimizer)
        policy = self.dtype_policy
        opt = _lso.for_policy(opt, policy)  # the policy's loss scale, any policy's (issue 33)
        loss_obj = None if loss is None else _losses.get(loss)
        compiled = [_metrics.get(m, loss_obj) for m in (metrics or [])]
        names = [m.name for m in compiled]
        if len(set(names)) != len(names) or "loss" in names:
            raise ValueError(f"metric names must be unique and not 'loss', got {names}")
        # Only a compile that fully succeeded replaces the previous one.
        self.optimizer, self.loss, self.compiled_metrics = opt, loss_obj, compiled
        self.jit_compile, self._traced = jit_compile, {}

    def _require_compiled(self, need_optimizer: bool = True) -> None:
        if self.loss is None or (need_optimizer and self.optimizer is None):
            raise RuntimeError(f"model {self.name!r} must be compiled with a loss (and an "
                               "optimizer) first: model.compile(loss=..., optimizer=...)")

    @property
    def metrics_names(self) -> list[str]:
        return ["loss", *(m.name for m in self.compiled_metrics)]

    @property
    def train_function(self) -> Any:
        """The traced train step (``print(model.train_function.graph)``), Keras' attribute;
        None before ``fit`` with ``jit_compile``."""
        return self._traced.get("train")

    # --- one step -------------------------------------------------------------------------
    def _step(self, kind: str, compute: Callable[..., Any], *args: Any) -> Any:
        """``compute(*args)``, traced and replayed under ``jit_compile``."""
        if not self.jit_compile:
            if _trace_hooks.eager_step_hook is not None:   # the graph rewrite says it skips us
                _trace_hooks.eager_step_hook()
            return compute(*args)
        traced = self._traced.get(kind)
        # what compile set, each object by identity: one replaced after compile, a new step
        compiled = (self.optimizer, self.loss, *self.compiled_metrics)
        if traced is None or len(traced.compiled) != len(compiled) or any(
                a is not b for a, b in zip(traced.compiled, compiled)):
            # which variables train is read inside the step: a change retraces
            traced = self._traced[kind] = function(
                compute, fallback=self.jit_compile == "auto",
                key=lambda: tuple(id(v) for v in self.trainable_variables))
            traced.__name__ = f"the {kind} step of model {self.name!r}"
            traced.compiled = compiled
        return traced(*args)

    def _train_compute(self, x: Any, y: Any) -> tuple[Any, Any]:
        opt = self.optimizer
        scaled = isinstance(opt, LossScaleOptimizer)
        with GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss(y, y_pred)  # type: ignore[misc]
            target = opt.get_scaled_loss(loss) if scaled else loss
        variables = self.trainable_variables
        grads = tape.gradient(target, variables)
        if scaled:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, variables))
        first = flatten(y_pred)[0]
        _step_metrics.update_in_step(self._loss_tracker, self.compiled_metrics, loss, y, first)
        return loss, first

    def _test_compute(self, x: Any, y: Any) -> tuple[Any, Any]:
        outputs = self(x, training=False)
        loss, y_pred = self.loss(y, outputs), flatten(outputs)[0]  # type: ignore[misc]
        _step_metrics.update_in_step(self._loss_tracker, self.compiled_metrics, loss, y, y_pred)
        return loss, y_pred

    def train_step(self, x: Any, y: Any) -> Any:
        """Forward, loss, (scaled) gradients, update; updates the metrics on the device and
        returns the (unscaled, float32) loss tensor."""
        loss, y_pred = self._step("train", self._train_compute, x, y)
        self._train_steps += 1
        _step_metrics.update_after_step(self.compiled_metrics, y, y_pred)
        return loss

    def train_on_batch(self, x: Any, y: Any, reset_metrics: bool = True,
                       return_dict: bool = False) -> Any:
        """One training step on one batch; returns the loss (and metrics) as Python floats."""
        self._require_compiled()
        reset_metrics = _args.flag("reset_metrics", reset_metrics)
        return_dict = _args.flag("return_dict", return_dict)
        xd, yd = self._batch(x, y, "train_on_batch")
        if reset_metrics:
            self.reset_metrics()
        self.train_step(xd, yd)
        return self._results(return_dict)

    def test_step(self, x: Any, y: Any) -> None:
        _, y_pred = self._step("test", self._test_compute, x, y)
        _step_metrics.update_after_step(self.compiled_metrics, y, y_pred)

    def test_on_batch(self, x: Any, y: Any, reset_metrics: bool = True,
                      return_dict: bool = False) -> Any:
        """The loss (and metrics) of one batch, without training, as Python floats."""
        self._require_compiled(need_optimizer=False)
        reset_metrics = _args.flag("reset_metrics", reset_metrics)
        return_dict = _args.flag("return_dict", return_dict)
        xd, yd = self._batch(x, y, "test_on_batch")
        if reset_metrics:
            self.reset_metrics()
        self.test_step(xd, yd)
        return self._results(return_dict)

    def reset_metrics(self) -> None:
        self._loss_tracker.reset_state()
        for metric in self.compiled_metrics:
            metric.reset_state()

    def _results(self, return_dict: bool) -> Any:
        """The loss and metrics (under a distribution, over every rank's samples)."""
        logs = dict(zip(self.metrics_names,
                        _global.results([self._loss_tracker, *self.compiled_metrics])))
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

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
        self._require_compiled()
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
                self.train_step(_data.rows(xd, a, b, order), _data.rows(yd, a, b, order))
                results = self._results(True) if per_batch else None   # (the bar shows them)
                cbs.on_train_batch_end(step, _callbacks.batch_logs(step, hi - lo, results))
                if bar is not None:
                    bar.update(1)
                    now = time.perf_counter()
                    if (now - last_refresh >= _REFRESH_S and step + 1 < steps
                            and _sharding.world_size() == 1):  # a global read needs every rank
                        last_refresh = now
                        bar.set_postfix_str(_progress.format_logs(results or self._results(True)),
                                            refresh=True)
                if self.stop_training:
                    break
            backend.synchronize()
            elapsed = time.perf_counter() - start
            logs = self._results(True)
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
        self._require_compiled(need_optimizer=False)
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
        for step in range(steps):
            lo, hi = _sharding.shard(step * batch_size, min((step + 1) * batch_size, n), False)
            self.test_step(_data.rows(xd, lo, hi, None), _data.rows(yd, lo, hi, None))
        logs = self._results(True)
        if verbose:
            elapsed = time.perf_counter() - start
            print(f"{steps}/{steps} - {elapsed:.2f}s - {_progress.format_logs(logs)}", flush=True)
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

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
        return flatten(self(x, training=False))

    # --- weights and checkpoints ------------------------------------------------------------
    def save_weights(self, filepath: str) -> None:
        """Write the weights atomically (see :mod:`mpcore.checkpoint`). Under a distribution:
        call it on every rank; rank 0 writes, the others wait for the file."""
        _checkpoint.save_weights(self, filepath)

    def load_weights(self, filepath: str) -> None:
        _checkpoint.load_weights(self, filepath)

    def save_checkpoint(self, filepath: str, **extra: Any) -> None:
        """Weights, optimizer slots and iterations, loss-scale state, the step count and
        ``mp.random``'s state, written atomically; ``extra`` values are stored alongside.
        Under a distribution: call it on every rank; rank 0 writes, the others wait."""
        _checkpoint.save(filepath, self, **extra)

    def load_checkpoint(self, filepath: str) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote (compile the model first); returns the
        ``extra`` values."""
        return _checkpoint.restore(filepath, self)

    # --- summary ----------------------------------------------------------------------------
    def summary(self, print_fn: Callable[[str], Any] | None = None, line_length: int = 88) -> None:
        """Print the layers, their output shapes, dtype policies and parameter counts, in lines
        of ``line_length`` characters."""
        _summary.summary(self, print_fn, line_length)
