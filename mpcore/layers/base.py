"""Layer, the symbolic KerasTensor, Input and InputLayer.

Dtype rules (the Keras mixed precision guide's):

- A layer holds a ``dtype_policy``: the global policy when it is constructed, or ``dtype=`` (a
  policy name such as ``"float32"`` / ``"mixed_float16"`` or a :class:`~mpcore.Policy`).
- ``__call__`` casts floating inputs to the layer's ``compute_dtype``; integer and bool inputs are
  never cast (they are labels or indices).
- Variables are created in ``variable_dtype`` and read inside ``call`` with
  ``Variable.read_as(compute_dtype)``, which casts once per value and tape, so a float32 weight
  read in float16 is cast once per training step however often it is read.

Calling a layer on a :class:`KerasTensor` (what :func:`Input` returns) builds the layer and
records a :class:`Node` of the functional graph. The output's shape and dtype are found by running
the layer once on a batch of one zero example (outside any GradientTape): one code path for the
symbolic and the eager call, so they can never disagree. Only the batch axis may be None.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Iterator, Sequence
from typing import Any

from mpcore import ops
from mpcore.core import dtypes as _dtypes
from mpcore.core import random as _random
from mpcore.core import tape as _tape
from mpcore.core.tensor import Tensor, Variable
from mpcore.layers import added_losses as _added_losses
from mpcore.layers import auto_config as _auto_config
from mpcore.layers import scopes as _scopes
from mpcore.layers.symbolic import KerasTensor, Node, Shape, flatten, is_symbolic, map_structure
from mpcore.mixed_precision import amp_hooks as _amp
from mpcore.mixed_precision import policy as _policy
from mpcore.ops.dispatch import autocast_scope

_NAME_COUNTS: dict[str, int] = {}


_LOW = _dtypes.LOW_PRECISION


def unique_name(base: str) -> str:
    """``base``, then ``base_1``, ``base_2`` ... (Keras' layer naming)."""
    n = _NAME_COUNTS.get(base, 0)
    _NAME_COUNTS[base] = n + 1
    return base if n == 0 else f"{base}_{n}"


def _snake(name: str) -> str:
    """Keras 3's ``to_snake_case``: ``Conv2D`` -> ``conv2d``, ``MaxPooling2D`` ->
    ``max_pooling2d`` (a digit does not start a word)."""
    s = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", re.sub(r"\W+", "", name))
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", s).lower()


@contextlib.contextmanager
def no_tapes() -> Iterator[None]:
    """Run ops invisible to every active GradientTape (shape inference)."""
    state = _tape.state
    saved = state.tapes
    state.tapes = []
    state.generation += 1
    try:
        yield
    finally:
        state.tapes = saved
        state.generation += 1


def _policy_from(dtype: Any) -> _policy.Policy:
    if dtype is None or isinstance(dtype, _policy.Policy):
        return _policy.get(dtype)
    if isinstance(dtype, str):
        return _policy.Policy(dtype)
    if isinstance(dtype, dict):   # a config's "dtype": {"name": ...}, or Keras 3's nesting
        inner = dtype.get("config", dtype)
        return _policy.Policy.from_config(inner)
    return _policy.Policy(_dtypes.canonical(dtype))


# --- Layer --------------------------------------------------------------------------------
class Layer:
    """Base class of layers (and of Model). Subclasses implement ``build(input_shape)`` (create
    weights with :meth:`add_weight`) and ``call(inputs, training=None)``."""

    #: Whether __call__ casts floating inputs to the compute dtype (Model: no, its layers do).
    _autocast = True
    #: Set by the first call (a layer without weights builds in a traced step): every later
    #: call finds them so and leaves them, so a replay that does not set them changes nothing
    #: eager execution would (mpcore.tracing.python_state).
    _trace_set_once_attributes = ("built", "_build_shape")
    #: Written by build (the input rule) and by calls on KerasTensors (the functional graph's
    #: nodes), never by a call on tensors: not watched in a traced step, whose walk of a
    #: large model they would lengthen by a quarter.
    _trace_ignored_attributes = ("_input_rule", "_inbound_nodes",
                                 "_losses")  # read in the same step (added_losses.py)

    def __new__(cls, *args: Any, **kwargs: Any) -> Layer:
        layer = super().__new__(cls)
        # Keras 3's automatic config for classes that write no get_config (auto_config.py)
        object.__setattr__(layer, "_auto_config", _auto_config.record(cls, args, kwargs))
        return layer

    def __init__(self, *, name: str | None = None, dtype: Any = None, trainable: bool = True,
                 input_shape: Sequence[int | None] | None = None,
                 input_dim: int | None = None) -> None:
        object.__setattr__(self, "_layers", [])
        object.__setattr__(self, "_losses", [])
        self.name = name if name is not None else unique_name(_snake(type(self).__name__))
        self._dtype_policy = _policy_from(dtype)
        self.trainable = bool(trainable)
        self.built = False
        self._weights: list[Variable] = []
        self._build_shape: Shape | None = None
        # (min rank, exact rank or None, {axis: size}): what build() fixed about the input
        self._input_rule: tuple[int, int | None, dict[int, int]] | None = None
        if input_dim is not None:
            input_shape = (input_dim,)
        self._input_shape_arg: Shape | None = (None if input_shape is None
                                               else tuple(input_shape))
        call_params = inspect.signature(self.call).parameters
        self._call_takes_training = "training" in call_params
        #: the name of call's first argument, by which __call__ also takes it (Keras 3's)
        self._first_arg = next(iter(call_params), "inputs")
        self._inbound_nodes: list[Node] = []

    def __setattr__(self, key: str, value: Any) -> None:
        # Track sublayers assigned as attributes, so their weights are the model's weights.
        if isinstance(value, Layer):
            layers = self.__dict__.get("_layers")
            if layers is not None and all(value is not x for x in layers):
                layers.append(value)
        object.__setattr__(self, key, value)

    # --- dtype policy -----------------------------------------------------------------
    @property
    def dtype_policy(self) -> _policy.Policy:
        return self._dtype_policy

    @property
    def compute_dtype(self) -> str:
        return self._dtype_policy.compute_dtype

    @property
    def variable_dtype(self) -> str:
        return self._dtype_policy.variable_dtype

    @property
    def dtype(self) -> str:
        """The variable dtype (as Keras' ``layer.dtype``)."""
        return self._dtype_policy.variable_dtype

    # --- weights ----------------------------------------------------------------------
    def add_weight(self, shape: Any = None, initializer: Any = None, dtype: Any = None,
                   trainable: bool = True, autocast: bool = True, regularizer: Any = None,
                   constraint: Any = None, aggregation: str = "none",
                   name: str | None = None) -> Variable:
        """A Variable of ``shape`` (a scalar by default) in the variable dtype (or ``dtype``),
        named ``"<layer>/<name>"``: Keras 3's signature. ``initializer`` defaults to
        ``"glorot_uniform"`` for floating weights and ``"zeros"`` for others, as Keras';
        ``autocast=False`` keeps the weight in its own dtype when an op reads it inside a mixed
        layer's ``call`` (state such as BatchNorm's moving statistics). tf-keras' (and mpcore's
        earlier) order with the name first, ``add_weight("kernel", (3, 4), "zeros")``, works
        too. Regularizers and constraints are not supported yet: passing one is an error."""
        from mpcore.layers import initializers

        if isinstance(shape, str):
            # the earlier order, add_weight(name, shape, initializer="zeros", trainable, dtype):
            # its arguments arrived one place to the right
            name, shape, initializer = shape, initializer, "zeros" if dtype is None else dtype
            dtype, autocast = (None, True) if isinstance(autocast, bool) else (autocast, True)
        if regularizer is not None or constraint is not None:
            raise NotImplementedError(f"layer {self.name!r}: add_weight's regularizer and "
                                      "constraint are not supported by mpcore yet")
        if aggregation not in ("none", "mean", "sum", "only_first_replica"):
            raise ValueError(f"add_weight: aggregation must be one of none, mean, sum, "
                             f"only_first_replica, got {aggregation!r}")
        dt = self.variable_dtype if dtype is None else _dtypes.canonical(dtype)
        if initializer is None:
            initializer = "glorot_uniform" if dt in _dtypes.FLOATING_SET else "zeros"
        if name is None:
            name = "variable" if not self._weights else f"variable_{len(self._weights)}"
        dims = () if shape is None else tuple(int(d) for d in shape)
        init = initializers.get(initializer)
        with _random.shared():  # every rank of a distribution draws the same initial weights
            value = init(dims, dt)
        var = Variable(value, dtype=dt, trainable=bool(trainable), name=f"{self.name}/{name}",
                       autocast=autocast)
        self._weights.append(var)
        return var

    def _sublayers(self) -> list[Layer]:
        return list(self._layers)

    def add_loss(self, loss: Any) -> None:
        """Keras 3's: a loss computed in ``call``, added to the model's loss in training."""
        _added_losses.add(self, loss)

    @property
    def losses(self) -> list[Tensor]:
        """The losses this layer and those below it added in the last forward pass."""
        return _added_losses.collect(self)

    @property
    def weights(self) -> list[Variable]:
        out: list[Variable] = []
        seen: set[int] = set()
        for v in self._all_weights():
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    variables = weights

    def _all_weights(self) -> Iterator[Variable]:
        yield from self._weights
        for layer in self._sublayers():
            yield from layer._all_weights()

    @property
    def trainable_weights(self) -> list[Variable]:
        out: list[Variable] = []
        if self.trainable:
            self._collect_trainable(out, set())
        return out

    def _collect_trainable(self, out: list[Variable], seen: set[int]) -> None:
        # one walk and one set for the whole tree (a traced step reads this at every call)
        for v in self._weights:
            if v.trainable and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        for layer in self._sublayers():
            if layer.trainable:
                layer._collect_trainable(out, seen)

    trainable_variables = trainable_weights

    @property
    def non_trainable_weights(self) -> list[Variable]:
        trainable = {id(v) for v in self.trainable_weights}
        return [v for v in self.weights if id(v) not in trainable]

    non_trainable_variables = non_trainable_weights

    def count_params(self) -> int:
        return sum(v.size for v in self.weights)

    def get_weights(self) -> list[Any]:
        """Writable host copies of the weights (as Keras'): later updates never show
        through."""
        return [v.numpy() for v in self.weights]

    def set_weights(self, weights: Sequence[Any]) -> None:
        own = self.weights
        weights = list(weights)
        if len(weights) != len(own):
            raise ValueError(f"layer {self.name!r} has {len(own)} weights "
                             f"({', '.join(v.name for v in own) or 'none'}), got {len(weights)}")
        for var, value in zip(own, weights):
            shape = tuple(getattr(value, "shape", ()) or ops.constant(value).shape)
            if shape != var.shape:
                raise ValueError(f"weight {var.name!r} has shape {var.shape}, got a value of "
                                 f"shape {shape}")
        for var, value in zip(own, weights):
            var.assign(value)

    # --- building and calling -----------------------------------------------------------
    def build(self, input_shape: Any) -> None:
        """Create weights for inputs of ``input_shape`` (the batch axis may be None)."""

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement call()")

    def _expect_input(self, min_ndim: int, ndim: int | None = None,
                      axes: dict[int, int] | None = None) -> None:
        self._input_rule = (min_ndim, ndim, dict(axes or {}))

    def _check_input(self, shape: Shape) -> None:
        rule = self._input_rule
        if rule is None:
            return
        min_ndim, ndim, axes = rule
        where = f"layer {self.name!r} ({type(self).__name__})"
        if ndim is not None and len(shape) != ndim:
            raise ValueError(f"{where} expects inputs of rank {ndim}, got shape {shape}")
        if len(shape) < min_ndim:
            raise ValueError(f"{where} expects inputs of rank >= {min_ndim}, got shape {shape}")
        for axis, size in axes.items():
            got = shape[axis]
            if got is not None and got != size:
                built = f" (built for {self._build_shape})" if self._build_shape else ""
                raise ValueError(f"{where} expects axis {axis} of its input to be {size}"
                                 f"{built}, got input shape {shape}")

    def _maybe_build(self, shape: Any, args: tuple[Any, ...] = (),
                     kwargs: dict[str, Any] | None = None) -> None:
        """Build for the first call. A ``build`` taking more shapes than the first
        (``build(query_shape, value_shape, key_shape=None)``) gets the shape of each call
        argument named so (``value``, ``key``), or None where the call has none: Keras 3's
        rule for layers called on several tensors."""
        if self.built:
            return
        params = list(inspect.signature(self.build).parameters)
        extra: dict[str, Any] = {}
        if len(params) > 1:
            names = list(inspect.signature(self.call).parameters)[1:]
            given = {**dict(zip(names, args)), **(kwargs or {})}
            for p in params[1:]:
                if p.endswith("_shape"):
                    value = given.get(p[:-len("_shape")])
                    extra[p] = getattr(value, "shape", None)
        self.build(shape, **extra)
        self.built = True
        self._build_shape = shape if isinstance(shape, tuple) else None

    def _autocast_inputs(self, inputs: Any, extra: bool = False) -> Any:
        """``inputs`` with floating tensors in the compute dtype. The first argument's leaves
        all become tensors; in the call's other arguments (``extra``) only tensors and arrays
        are converted, so flags and sizes stay Python values (Keras 3's ``convert_input``)."""
        policy = self._dtype_policy
        if policy.is_mixed and _amp.deciding() and not extra:
            _amp.refuse_mixed_layer(self.name, policy.name)

        def convert(x: Any) -> Any:
            if x is None:
                return None
            if extra and not isinstance(x, Tensor) and not (
                    hasattr(x, "__array__") and hasattr(x, "dtype")):
                return x
            t = x if isinstance(x, Tensor) else ops.constant(x)
            if self._autocast:
                target = policy.compute_dtype_for(t.dtype)
                # under autocast or the graph rewrite, a 16-bit activation goes on to the
                # ops, whose own decisions cast it where needed (no cast pair per layer)
                if target != t.dtype and not (t.dtype in _LOW and _amp.deciding()):
                    t = ops.cast(t, target)
            return t

        return map_structure(convert, inputs)

    def __call__(self, *args: Any, training: bool | None = None, **kwargs: Any) -> Any:
        """Call the layer: ``layer(x)``, ``merge([a, b])``, ``mha(query, value, ...)``; the
        first argument also by the name ``call`` gives it (``mha(query=q, value=v)``), as
        Keras 3. ``training`` reaches ``call`` where its signature takes it. A KerasTensor
        anywhere in the arguments makes a node of the functional graph instead."""
        first = self._first_arg
        if args:
            if first in kwargs:
                raise TypeError(f"layer {self.name!r} ({type(self).__name__}) got its first "
                                f"argument, {first!r}, twice: positionally and by name")
            inputs, args = args[0], args[1:]
        elif first in kwargs:
            inputs = kwargs.pop(first)
        else:
            raise TypeError(f"layer {self.name!r} ({type(self).__name__}) was called without "
                            f"its first argument, {first!r}")
        if is_symbolic([inputs, list(args), kwargs]):
            return self._symbolic_call(inputs, args, kwargs)
        if _scopes.watching():    # the layer's input casts count as the layer's ops too
            with _scopes.layer_scope(self.name):
                return self._eager_call(inputs, args, training, kwargs)
        return self._eager_call(inputs, args, training, kwargs)

    def _eager_call(self, inputs: Any, args: tuple[Any, ...], training: bool | None,
                    kwargs: dict[str, Any]) -> Any:
        inputs = self._autocast_inputs(inputs)
        if args:
            args = self._autocast_inputs(args, extra=True)
        if kwargs:
            kwargs = self._autocast_inputs(kwargs, extra=True)
        flat = flatten(inputs)
        shape = flat[0].shape if len(flat) == 1 and isinstance(flat[0], Tensor) else None
        if not self.built:  # a list of one tensor builds as a list (a merge layer's [x])
            self._maybe_build(shape if shape is not None and isinstance(inputs, Tensor) else
                              map_structure(lambda t: getattr(t, "shape", None), inputs),
                              args, kwargs)
        if shape is not None:
            self._check_input(shape)
        if self._call_takes_training:
            kwargs["training"] = training
        policy = self._dtype_policy
        with (autocast_scope(policy.compute_dtype if policy.is_mixed else None),
              _added_losses.call_scope(self)):
            return self.call(inputs, *args, **kwargs)

    def _symbolic_call(self, inputs: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
        flat = flatten(inputs)
        single = len(flat) == 1 and isinstance(flat[0], KerasTensor)
        if not self.built:
            self._maybe_build(flat[0].shape if isinstance(inputs, KerasTensor) else map_structure(
                lambda k: getattr(k, "shape", None), inputs), args, kwargs)
        if single:
            self._check_input(flat[0].shape)

        def dummy(x: Any) -> Any:
            if not isinstance(x, KerasTensor):
                return x
            return ops.zeros(tuple(1 if d is None else d for d in x.shape), x.dtype)

        with no_tapes():
            out = self.__call__(map_structure(dummy, inputs), *map_structure(dummy, list(args)),
                                training=False, **map_structure(dummy, kwargs))
        outputs = map_structure(
            lambda t: KerasTensor((None, *t.shape[1:]), t.dtype, name=self.name), out)
        node = Node(self, inputs, outputs, tuple(args), kwargs)
        for kt in node.flat_outputs:
            kt._node = node
        self._inbound_nodes.append(node)
        return outputs

    @property
    def output(self) -> Any:
        if not self._inbound_nodes:
            raise AttributeError(f"layer {self.name!r} has not been called on a KerasTensor")
        return self._inbound_nodes[0].outputs

    @property
    def output_shape(self) -> Any:
        return map_structure(lambda kt: kt.shape, self.output)

    def get_config(self) -> dict[str, Any]:
        config = {"name": self.name, "trainable": self.trainable,
                  "dtype": self._dtype_policy.get_config()}
        if type(self).get_config is Layer.get_config:   # the class writes none: Keras 3's
            return _auto_config.extend(self, config)     # automatic one
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Layer:
        """The layer ``get_config`` describes (its ``dtype`` entry, a Policy config, becomes
        the layer's policy): ``type(layer).from_config(layer.get_config())``."""
        return cls(**config)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Keras 3 marks a layer built when its build() returns, also when build() is called
        # directly (its tests do), so the first call does not build (and add weights) again.
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("build")
        if own is None or getattr(own, "_marks_built", False):
            return

        @functools.wraps(own)
        def build(self: Layer, *args: Any, **kw: Any) -> None:
            own(self, *args, **kw)
            self.built = True
            if args and isinstance(args[0], tuple):   # what build_config saves (Keras 3)
                self._build_shape = args[0]

        build._marks_built = True  # type: ignore[attr-defined]
        cls.build = build  # type: ignore[method-assign]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}, built={self.built}>"


# --- Input --------------------------------------------------------------------------------
class InputLayer(Layer):
    """The source of a functional graph: holds the input's shape and dtype."""

    def __init__(self, shape: Sequence[int | None] | None = None, batch_size: int | None = None,
                 dtype: Any = None, name: str | None = None,
                 input_shape: Sequence[int | None] | None = None) -> None:
        shape = shape if shape is not None else input_shape
        if shape is None:
            raise ValueError("InputLayer needs a shape (without the batch axis), e.g. (784,)")
        if isinstance(shape, int):
            shape = (shape,)
        dims = tuple(shape)
        for d in dims:
            if d is not None and (not isinstance(d, int) or d < 1):
                raise ValueError(f"Input shape entries must be positive ints or None, got "
                                 f"{tuple(shape)}")
        super().__init__(name=name or unique_name("input_layer"))
        self.input_dtype = "float32" if dtype is None else _dtypes.canonical(dtype)
        self.batch_shape: Shape = (batch_size, *dims)
        self.built = True
        tensor = KerasTensor(self.batch_shape, self.input_dtype, name=self.name)
        node = Node(self, [], tensor)
        tensor._node = node
        self._inbound_nodes.append(node)
        self.tensor = tensor

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        return inputs


def Input(shape: Sequence[int | None] | int | None = None,  # noqa: N802 - Keras' name
          batch_size: int | None = None, dtype: Any = None, name: str | None = None) -> KerasTensor:
    """A symbolic input of ``shape`` (without the batch axis), dtype float32 by default."""
    return InputLayer(shape, batch_size=batch_size, dtype=dtype, name=name).tensor
