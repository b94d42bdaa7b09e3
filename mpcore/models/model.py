"""Model: a functional graph of layers (``mp.Model(inputs, outputs)``) or a subclass with its
own ``call``, with compile, the built-in fused steps, weights, checkpoints and summary. The
loops (fit, evaluate, predict) are in :mod:`mpcore.models.trainer`, the overridable Keras
steps in :mod:`mpcore.models.steps`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcore import callbacks as _callbacks
from mpcore import ops
from mpcore import optimizers as _optimizers
from mpcore.checkpoint import checkpoint as _checkpoint
from mpcore.core.tape import GradientTape
from mpcore.core.tensor import Tensor
from mpcore.layers import added_losses as _added_losses
from mpcore.layers.base import (
    InputLayer,
    KerasTensor,
    Layer,
    flatten,
    map_structure,
    unique_name,
)
from mpcore.losses import losses as _losses
from mpcore.metrics import metrics as _metrics
from mpcore.mixed_precision import trace_hooks as _trace_hooks
from mpcore.models import compile_utils as _compile
from mpcore.models import data as _data
from mpcore.models import graph as _graph
from mpcore.models import step_metrics as _step_metrics
from mpcore.models import summary as _summary
from mpcore.models.trainer import Trainer
from mpcore.optimizers import loss_scale_optimizer as _lso
from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer
from mpcore.tracing.function import function

_REFRESH_S = 0.25  # progress-bar refresh period: each refresh reads the metrics once


class Model(Trainer, Layer):
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
        self._compile_loss: _compile.CompileLoss | None = None
        #: one Mean per output with a loss, ``<output>_loss``, when there are several outputs
        self._output_loss_trackers: list[_metrics.Mean] = []
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
    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, loss_weights: Any = None,
                metrics: Any = None, jit_compile: bool | str = "auto") -> None:
        """Set the optimizer (a name or an Optimizer), the loss (a name, a Loss or a
        function), and the metrics (names, Metrics or functions); for a model of several
        outputs, ``loss``, ``loss_weights`` and ``metrics`` by output as Keras 3 takes them
        (:mod:`mpcore.models.compile_utils`). ``jit_compile=True`` runs
        the steps of fit, evaluate and predict as traced steps (:mod:`mpcore.function`):
        traced once per batch shape (a smaller last batch is a second trace), then replayed,
        bit for bit the same as eagerly; the metrics are computed in the step and added to
        their running values after it. ``"auto"`` (the default, as Keras 3's) does the same,
        but a step that cannot be traced (a loss that reads a tensor on the host, say) runs
        eagerly, with one warning, instead of raising; False runs every step eagerly."""
        if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
            raise ValueError(f"jit_compile must be True, False or 'auto', got {jit_compile!r}")
        opt = _optimizers.get(optimizer)
        policy = self.dtype_policy
        opt = _lso.for_policy(opt, policy)  # the policy's loss scale, any policy's (issue 33)
        names = self._output_names(loss)
        compile_loss = None if loss is None else _compile.CompileLoss(loss, loss_weights, names)
        if compile_loss is None and loss_weights is not None:
            raise ValueError("loss_weights needs a loss")
        compiled = _compile.compile_metrics(metrics, compile_loss, names)
        # Only a compile that fully succeeded replaces the previous one.
        self.optimizer, self.compiled_metrics = opt, compiled
        self._compile_loss = compile_loss
        self.loss = (None if compile_loss is None else compile_loss if len(names) > 1
                     else compile_loss.losses[0])
        self._output_loss_trackers = [] if compile_loss is None else [
            _metrics.Mean(n) for n in compile_loss.output_loss_names]
        self.jit_compile, self._traced = jit_compile, {}
        # what compile was given: Keras 3's compile_config (mpcore.saving.model_config)
        self._compile_args = {"optimizer": optimizer, "loss": loss,
                              "loss_weights": loss_weights, "metrics": metrics,
                              "jit_compile": jit_compile}

    def _require_compiled(self, need_optimizer: bool = True, need_loss: bool = True) -> None:
        # a model whose own train_step computes its loss needs no compiled loss (Keras 3)
        if (need_loss and self.loss is None) or (need_optimizer and self.optimizer is None):
            raise RuntimeError(f"model {self.name!r} must be compiled with a loss (and an "
                               "optimizer) first: model.compile(loss=..., optimizer=...)")

    @property
    def metrics_names(self) -> list[str]:
        return [m.name for m in self._tracked_metrics()]

    def _tracked_metrics(self) -> list[_metrics.Metric]:
        """The loss tracker, each output's loss tracker, the compiled metrics: the logs'
        order."""
        return [self._loss_tracker, *self._output_loss_trackers, *self.compiled_metrics]

    @property
    def output_names(self) -> list[str]:
        """The names of the outputs (their layers'), as Keras 3's ``model.output_names``."""
        return self._output_names(None)

    def _output_names(self, loss: Any) -> list[str]:
        if self._is_graph:
            return [str(kt.name) for kt in self._flat_outputs]
        # a subclassed model's outputs are known at its first call: named by the loss's
        # structure, as Keras names them (a dict's keys, output_1, output_2 ...)
        if isinstance(loss, dict):
            return list(loss)
        if isinstance(loss, (list, tuple)) and len(loss) > 1:
            return [f"output_{i + 1}" for i in range(len(loss))]
        return ["output"]

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
            # which variables train is read inside the step: a change retraces (the key is
            # what this method found just before the call: one walk of the layers a step)
            box: list[Any] = [None]
            traced = self._traced[kind] = function(
                compute, fallback=self.jit_compile == "auto", key=lambda: box[0])
            traced.__name__ = f"the {kind} step of model {self.name!r}"
            traced.compiled, traced.key_box = compiled, box
        variables = self.trainable_variables
        traced.key_box[0] = tuple(map(id, variables))
        if kind in ("train", "custom_train") and self.optimizer is not None and self.built:
            # the slots made before the step, as Keras 3 builds its optimizer: a recorded update
            # that made them would be a first trace run eagerly and traced again
            self.optimizer.build(variables)
        return traced(*args)

    def _batch_step(self, kind: str, compute: Callable[..., Any], x: Any, y: Any,
                    sample_weight: Any) -> Any:
        """``_step`` of the built-in train or test step: without sample weights, on two
        arguments (tensors alone make the traced step's fast signature; an explicit None is a
        value to key)."""
        if sample_weight is None:
            return self._step(kind, compute, x, y)
        return self._step(kind, compute, x, y, sample_weight)

    def _train_compute(self, x: Any, y: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        opt = self.optimizer
        scaled = isinstance(opt, LossScaleOptimizer)
        with GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self._compile_loss(y, y_pred, sample_weight)  # type: ignore[misc]
            loss = _added_losses.with_added(loss, self)  # Layer.add_loss (Keras 3)
            target = opt.get_scaled_loss(loss) if scaled else loss
        variables = self.trainable_variables
        grads = tape.gradient(target, variables)
        if scaled:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, variables))
        self._update_in_step(loss, y, y_pred)
        return loss, y_pred

    def _test_compute(self, x: Any, y: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        y_pred = self(x, training=False)
        loss = self._compile_loss(y, y_pred, sample_weight)  # type: ignore[misc]
        loss = _added_losses.with_added(loss, self)
        self._update_in_step(loss, y, y_pred)
        return loss, y_pred

    def _update_in_step(self, loss: Any, y: Any, y_pred: Any) -> None:
        assert self._compile_loss is not None
        names = self._compile_loss.names
        _step_metrics.update_in_step(
            self._loss_tracker, list(zip(self._output_loss_trackers,
                                         [v for v in self._compile_loss.last if v is not None])),
            self.compiled_metrics, loss, _compile.outputs_list(y, names, "y"),
            _compile.outputs_list(y_pred, names, "the model's outputs"))

    def _train_batch(self, x: Any, y: Any, sample_weight: Any = None) -> Any:
        """The built-in training step: forward, loss, (scaled) gradients, update; updates the
        metrics on the device and returns the (unscaled, float32) loss tensor. A
        ``sample_weight`` weights the loss (Keras 3: ``sum(w * loss) / batch_size``); the
        compiled metrics are unweighted, as Keras 3's ``metrics`` (not ``weighted_metrics``).
        With and without ``sample_weight`` are two signatures of the traced step."""
        loss, y_pred = self._batch_step("train", self._train_compute, x, y, sample_weight)
        self._train_steps += 1
        self._update_after_step(y, y_pred)
        return loss

    def _test_batch(self, x: Any, y: Any, sample_weight: Any = None) -> None:
        """The built-in evaluation step: loss (weighted as in training) and metrics."""
        _, y_pred = self._batch_step("test", self._test_compute, x, y, sample_weight)
        self._update_after_step(y, y_pred)

    def _update_after_step(self, y: Any, y_pred: Any) -> None:
        names = self._compile_loss.names if self._compile_loss is not None else ["output"]
        _step_metrics.update_after_step(self.compiled_metrics,
                                        _compile.outputs_list(y, names, "y"),
                                        _compile.outputs_list(y_pred, names, "outputs"))

    def quantize(self, mode: str, float8_recipe: Any = None) -> None:
        """Keras 3's ``model.quantize("float8")``: every mixed_bfloat16 layer that can (Dense,
        in nested models too) computes its GEMM in FP8 from now on; layers pinned to another
        policy keep it. The traced steps are made again."""
        if mode != "float8":
            raise ValueError(f"quantize mode must be 'float8' (the only one mpcore has), got "
                             f"{mode!r}")
        todo = [la for la in _leaves(self) if callable(getattr(la, "quantize", None))
                and getattr(la, "_float8", True) is None
                and la.dtype_policy.name == "mixed_bfloat16"]
        if not todo:
            raise ValueError(f"model {self.name!r} has no mixed_bfloat16 Dense layer that is not "
                             "in float8 already: quantize('float8') turns those into "
                             "mixed_float8")
        for layer in todo:
            layer.quantize(mode, float8_recipe)
        self._traced = {}

    # --- weights, checkpoints and saving ------------------------------------------------------
    def save_weights(self, filepath: str, overwrite: bool = True) -> None:
        """Write the weights. A path ending in ``.weights.h5`` gets Keras 3's h5 layout (with
        the optimizer's state, as Keras writes it; :mod:`mpcore.saving`); any other path
        mpcore's own checksummed format (:mod:`mpcore.checkpoint`) of the weights alone, no
        optimizer state (to resume training exactly: ``.weights.h5``, ``.keras`` or
        :meth:`save_checkpoint`). Written atomically; under
        a distribution (own format): call it on every rank, rank 0 writes."""
        if str(filepath).endswith(".weights.h5"):
            from mpcore.saving import keras_file
            keras_file.save_weights(self, filepath, overwrite=overwrite)
            return
        _checkpoint.save_weights(self, filepath)

    def load_weights(self, filepath: str) -> None:
        """Load what :meth:`save_weights` wrote, by the same rule of suffixes (a Keras 3
        ``.weights.h5`` file too, and the weights of a ``.keras`` file). Everything is checked
        before anything is assigned."""
        if str(filepath).endswith((".weights.h5", ".keras")):
            from mpcore.saving import keras_file
            keras_file.load_weights(self, filepath)
            return
        _checkpoint.load_weights(self, filepath)

    def save(self, filepath: str, overwrite: bool = True, include_optimizer: bool = True
             ) -> None:
        """Save as a Keras 3 ``.keras`` file (config, weights, optimizer state), which
        ``mp.models.load_model`` and Keras 3's ``keras.models.load_model`` read."""
        from mpcore.saving import keras_file
        keras_file.save_model(self, filepath, overwrite=overwrite,
                          include_optimizer=include_optimizer)

    def get_config(self) -> dict[str, Any]:
        """Keras 3's config: a functional model's layers and connections, a Sequential's
        layers; a subclassed model's name, trainable and dtype (override it to add yours)."""
        if self._is_graph:
            from mpcore.saving import model_config
            return model_config.get_config(self)
        return Layer.get_config(self)

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: dict[str, Any] | None = None
                    ) -> Model:
        from mpcore.saving import model_config
        return model_config.model_from_config(cls, config, custom_objects)

    def get_compile_config(self) -> dict[str, Any] | None:
        """What compile was given (Keras 3's ``compile_config``); None before compile."""
        from mpcore.saving import model_config
        return model_config.get_compile_config(self)

    def compile_from_config(self, config: dict[str, Any]) -> None:
        from mpcore.saving import model_config
        model_config.compile_from_config(self, config)

    def get_build_config(self) -> dict[str, Any]:
        from mpcore.saving import model_config
        return model_config.get_build_config(self)

    def build_from_config(self, config: dict[str, Any]) -> None:
        from mpcore.saving import model_config
        model_config.build_from_config(self, config)

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


def _leaves(model: Any) -> list[Any]:
    """The layers of ``model``, those of nested models in their place."""
    out: list[Any] = []
    for layer in model.layers:
        out.extend(_leaves(layer) if isinstance(layer, Model) else [layer])
    return out
