"""The configs of models, Keras 3's: a functional model lists its layers, each with the calls
(``inbound_nodes``) that connect it, every input a ``__keras_tensor__`` naming the layer,
node and output it comes from (``keras_history``); a Sequential lists its layers; a compiled
model adds its ``compile_config`` (optimizer, loss, metrics), from which a loaded model is
compiled again."""

from __future__ import annotations

from typing import Any

from mpcore.layers.base import InputLayer, KerasTensor, Layer, Node
from mpcore.layers.symbolic import flatten, map_structure
from mpcore.saving import keras_configs, keras_names, keras_ops, serialization


def get_config(model: Any) -> dict[str, Any]:
    """A built-in model's config: Sequential's or a functional model's."""
    if isinstance(model, keras_names.model_class("Sequential")):
        return _sequential_config(model)
    return _functional_config(model)


def _sequential_config(model: Any) -> dict[str, Any]:
    layers = list(model.layers)
    if model._input_tensor is not None:
        layers.insert(0, model._input_tensor._node.layer)
    config: dict[str, Any] = {
        "name": model.name, "trainable": model.trainable,
        "dtype": keras_names.policy_to_keras(model.dtype_policy),
        "layers": [serialization.serialize_keras_object(layer) for layer in layers]}
    if model._input_tensor is not None:
        config["build_input_shape"] = list(model._input_tensor.shape)
    return config


def keras_order(model: Any) -> list[Layer]:
    """A functional model's layers in Keras 3's order (``ops.function.map_graph``): by depth
    from the inputs, and at one depth in the order a depth-first walk from the outputs first
    meets them. The weights file names layers by class and this position (``dense``,
    ``dense_1``), so two Dense layers in another order would swap their weights."""
    inputs = list(model._flat_inputs)
    input_ids = {id(kt) for kt in inputs}
    finished: set[int] = set()
    ordered: list[Node] = []                 # nodes from the inputs to the outputs
    first_seen: dict[int, int] = {}          # layer -> its index in the walk
    layers: dict[int, Layer] = {}

    def visit(kt: KerasTensor) -> None:
        node = kt._node
        if node is None or id(node) in finished:
            return
        is_input = isinstance(node.layer, InputLayer)
        if not is_input and id(kt) in input_ids:
            finished.add(id(node))
            return
        first_seen.setdefault(id(node.layer), len(first_seen))
        layers[id(node.layer)] = node.layer
        if not is_input:
            for parent in node.flat_inputs:
                visit(parent)
        finished.add(id(node))
        ordered.append(node)

    for kt in flatten(model._graph_outputs):
        visit(kt)
    node_depth: dict[int, int] = {}
    layer_depth: dict[int, int] = {}
    in_graph = {id(n) for n in ordered}
    for node in reversed(ordered):
        depth = node_depth.setdefault(id(node), 0)
        depth = max(depth, layer_depth.get(id(node.layer), 0))
        layer_depth[id(node.layer)] = node_depth[id(node)] = depth
        for parent in node.flat_inputs:
            if parent._node is not None and id(parent._node) in in_graph:
                node_depth[id(parent._node)] = max(depth + 1,
                                                   node_depth.get(id(parent._node), 0))
    for kt in inputs:                        # inputs the outputs do not read
        layer = kt._node.layer
        if id(layer) not in layer_depth:
            layer_depth[id(layer)], first_seen[id(layer)] = 0, -1
            layers[id(layer)] = layer
    return [layers[i] for i in sorted(layer_depth,
                                       key=lambda i: (-layer_depth[i], first_seen[i]))]


def _model_nodes(model: Any) -> dict[int, list[Node]]:
    """Each layer's calls inside ``model``, in the order the layer saw them (a layer shared
    with another model has calls outside it, which the config must not count)."""
    inside = {id(node) for node in model._nodes}
    inside |= {id(kt._node) for kt in model._flat_inputs}
    return {id(layer): [n for n in layer._inbound_nodes if id(n) in inside]
            for layer in model.layers}


def _functional_config(model: Any) -> dict[str, Any]:
    nodes = _model_nodes(model)

    def history(kt: KerasTensor, endpoint: bool = False) -> list[Any]:
        node = kt._node
        assert node is not None
        index = next(i for i, n in enumerate(nodes[id(node.layer)]) if n is node)
        if endpoint:
            index += _first_node(node.layer)
        slot = next(i for i, t in enumerate(node.flat_outputs) if t is kt)
        return [node.layer.name, index, slot]

    def endpoint(kt: KerasTensor) -> list[Any]:
        return history(kt, endpoint=True)

    def tensor(x: Any) -> Any:
        if not isinstance(x, KerasTensor):
            return serialization.serialize_keras_object(x)
        return {"class_name": "__keras_tensor__",
                "config": {"shape": list(x.shape), "dtype": x.dtype,
                           "keras_history": history(x)}}

    layers = []
    for layer in keras_order(model):
        if keras_ops.is_operator(layer):      # x + y: Keras' operation, its operands as args
            entry = keras_ops.entry(layer)
            inbound = [{"args": keras_ops.node_args(layer, node.inputs, tensor,
                                                    serialization.serialize_keras_object),
                        "kwargs": {}} for node in nodes[id(layer)]]
        else:
            entry = serialization.serialize_keras_object(layer)
            inbound = [] if isinstance(layer, InputLayer) else [
                {"args": map_structure(tensor, [node.inputs, *node.args]),
                 "kwargs": map_structure(tensor, dict(node.kwargs))}
                for node in nodes[id(layer)]]
        entry["name"], entry["inbound_nodes"] = layer.name, inbound
        layers.append(entry)
    config = {"name": model.name, "trainable": model.trainable, "layers": layers,
              "input_layers": map_structure(endpoint, model._graph_inputs),
              "output_layers": map_structure(endpoint, model._graph_outputs)}
    if model.dtype_policy.name != "float32" or not model.dtype_policy.loss_scale_is_default:
        # the model's own policy decides whether compile adds loss scaling; Keras passes
        # the keys it does not know to the model's constructor, which takes dtype
        config["dtype"] = keras_names.policy_to_keras(model.dtype_policy)
    return config


def _first_node(layer: Any) -> int:
    """Keras' ``input_layers``/``output_layers`` count a functional model's own (input to
    output) node as its node 0, so its calls as a layer of another model start at 1 there
    (``functional_from_config``'s ``get_tensor``); the nodes' arguments count from 0."""
    return int(getattr(layer, "_is_graph", False)
               and not isinstance(layer, keras_names.model_class("Sequential")))


def from_config(cls: type, config: dict[str, Any],
                custom_objects: dict[str, Any] | None) -> Any:
    """The model a Sequential or functional config describes."""
    if issubclass(cls, keras_names.model_class("Sequential")):
        return _sequential_from_config(cls, config, custom_objects)
    return _functional_from_config(cls, config, custom_objects)


def _sequential_from_config(cls: type, config: dict[str, Any],
                            custom_objects: dict[str, Any] | None) -> Any:
    kwargs: dict[str, Any] = {"name": config.get("name")}
    if config.get("dtype") is not None:
        kwargs["dtype"] = keras_configs.policy_from_keras(config["dtype"])
    model = cls(**kwargs)
    for layer_config in config.get("layers", []):
        model.add(serialization.deserialize_keras_object(layer_config, custom_objects))
    shape = config.get("build_input_shape")
    if not model._is_graph and shape is not None and model.layers:
        model.build(tuple(shape))
    model.trainable = bool(config.get("trainable", True))
    return model


def _functional_from_config(cls: type, config: dict[str, Any],
                            custom_objects: dict[str, Any] | None) -> Any:
    created: dict[str, Any] = {}
    outputs: dict[str, list[Any]] = {}
    pending: list[tuple[Any, dict[str, Any]]] = []
    for entry in config["layers"]:
        if keras_ops.is_keras_operation(entry):
            # made at its call: an operator layer is its operands (a constant, a key)
            name = entry.get("name") or entry["config"]["name"]
            layer = _Operation(entry["class_name"], name)
        else:
            layer = serialization.deserialize_keras_object(entry, custom_objects)
            name = entry.get("name", layer.name)
        if name in created:
            raise ValueError(f"the model config names layer {name!r} twice")
        created[name] = layer
        outputs[name] = [layer.tensor] if isinstance(layer, InputLayer) else []
        pending += [(layer, node) for node in entry.get("inbound_nodes", [])]

    def resolve(x: Any) -> Any:
        if isinstance(x, dict) and x.get("class_name") not in (None, "__keras_tensor__"):
            return serialization.deserialize_keras_object(x, custom_objects)
        if isinstance(x, dict) and x.get("class_name") == "__keras_tensor__":
            name, node_index, slot = x["config"]["keras_history"]
            if name not in outputs:
                raise ValueError(f"a node reads layer {name!r}, which the config lacks")
            if node_index >= len(outputs[name]):
                raise _NotYetError
            return flatten(outputs[name][node_index])[slot]
        if isinstance(x, list):
            return [resolve(v) for v in x]
        if isinstance(x, dict):
            return {k: resolve(v) for k, v in x.items()}
        return serialization.deserialize_keras_object(x, custom_objects)

    # Keras' order: each node once the nodes it reads are made (layers may be listed before
    # the layers they read from when a model reuses layers)
    while pending:
        remaining = []
        for layer, node in pending:
            try:
                args = resolve(list(node.get("args", [])))
                kwargs = resolve(dict(node.get("kwargs", {})))
            except _NotYetError:
                remaining.append((layer, node))
                continue
            if isinstance(layer, _Operation):
                out = keras_ops.call(layer.class_name, layer.name, args)
            else:
                out = layer(*args, **_call_kwargs(layer, kwargs))
            outputs[_name_of(created, layer)].append(out)
        if len(remaining) == len(pending):
            raise ValueError("the model config's nodes read each other in a cycle, or read "
                             "nodes no layer makes: " + ", ".join(
                                 layer.name for layer, _ in remaining))
        pending = remaining

    def endpoint(triple: Any) -> Any:
        if isinstance(triple, list) and len(triple) == 3 and isinstance(triple[0], str):
            name, node_index, slot = triple
            return flatten(outputs[name][node_index - _first_node(created[name])])[slot]
        if isinstance(triple, list):
            return [endpoint(t) for t in triple]
        return {k: endpoint(v) for k, v in triple.items()}

    extra: dict[str, Any] = {}
    if config.get("dtype") is not None:
        extra["dtype"] = keras_configs.policy_from_keras(config["dtype"])
    model = cls(inputs=endpoint(config["input_layers"]),
                outputs=endpoint(config["output_layers"]), name=config.get("name"), **extra)
    model.trainable = bool(config.get("trainable", True))
    return model


class _Operation:
    """A Keras operation of the config, made into mpcore's operator at its call."""

    def __init__(self, class_name: str, name: str) -> None:
        self.class_name, self.name = class_name, name


class _NotYetError(Exception):
    """A node reads a node not made yet."""


def _name_of(created: dict[str, Any], layer: Any) -> str:
    return next(name for name, known in created.items() if known is layer)


def _call_kwargs(layer: Layer, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A node's keyword arguments without Keras' ``mask=None`` and other arguments set to
    None that mpcore's ``call`` does not take (None means "not given" there)."""
    import inspect

    params = inspect.signature(layer.call).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in kwargs.items() if v is not None or k in params or takes_any}


# --- build and compile ------------------------------------------------------------------------
def get_build_config(model: Any) -> dict[str, Any]:
    if model._is_graph:
        if (isinstance(model, keras_names.model_class("Sequential"))
                and model._input_tensor is not None):
            return {"input_shape": list(model._input_tensor.shape)}
        return {"input_shape": None}
    shape = model._build_shape
    return {"input_shape": None if shape is None else list(shape)}


def get_compile_config(model: Any) -> dict[str, Any] | None:
    """What ``compile`` was given (Keras 3's ``compile_config``); None for a model never
    compiled. The optimizer is the one training uses, with its hyperparameters as they are
    now, and the LossScaleOptimizer compile added for a mixed_float16 model: written so,
    Keras 3 rebuilds the same optimizer (and reads its state) whatever its global policy."""
    args = getattr(model, "_compile_args", None)
    if args is None or model.optimizer is None:
        return None
    return {"optimizer": serialization.serialize_keras_object(model.optimizer),
            "loss": serialization.serialize_keras_object(args["loss"]),
            "loss_weights": serialization.serialize_keras_object(args["loss_weights"]),
            "metrics": serialization.serialize_keras_object(args["metrics"]),
            "weighted_metrics": None, "run_eagerly": False, "steps_per_execution": 1,
            "jit_compile": args["jit_compile"]}


_COMPILE_KEYS = ("optimizer", "loss", "loss_weights", "metrics", "weighted_metrics",
                 "run_eagerly", "steps_per_execution", "jit_compile", "auto_scale_loss")


def compile_from_config(model: Any, config: dict[str, Any]) -> None:
    """Compile ``model`` as ``config`` (a ``compile_config``) says."""
    unknown = sorted(set(config) - set(_COMPILE_KEYS))
    if unknown:
        raise ValueError(f"unknown compile_config keys {unknown}; valid: "
                         f"{', '.join(_COMPILE_KEYS)}")
    if config.get("weighted_metrics"):
        raise NotImplementedError("compile_config: weighted_metrics is not supported by "
                                  "mpcore yet; load with compile=False and compile the model")
    if config.get("steps_per_execution", 1) != 1:
        raise NotImplementedError("compile_config: steps_per_execution other than 1 is not "
                                  "supported by mpcore; load with compile=False")
    scoped = serialization.deserialize_keras_object
    jit = config.get("jit_compile", "auto")
    try:
        model.compile(optimizer=scoped(config.get("optimizer", "rmsprop")),
                      loss=scoped(config.get("loss")),
                      loss_weights=scoped(config.get("loss_weights")),
                      metrics=scoped(config.get("metrics")),
                      jit_compile=jit if isinstance(jit, bool) or jit == "auto" else "auto")
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise type(exc)(f"model {model.name!r} was saved compiled, and mpcore cannot compile "
                        f"it as saved: {exc}. Load it with compile=False and compile it "
                        "yourself") from exc


def model_from_config(cls: type, config: dict[str, Any],
                      custom_objects: dict[str, Any] | None) -> Any:
    """``Model.from_config``: a Sequential or functional config (its layers), else the
    subclass's own arguments (``cls(**config)``)."""
    from mpcore.saving import registration

    with registration.custom_object_scope(custom_objects):
        if issubclass(cls, keras_names.model_class("Sequential")) or all(
                k in config for k in ("layers", "input_layers", "output_layers")):
            return from_config(cls, config, custom_objects)
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras_configs.policy_from_keras(config["dtype"])
        return cls(**config)


def build_from_config(model: Any, config: dict[str, Any]) -> None:
    """Build a model as Keras 3 does: a graph is built already; a subclassed model is called
    once on zeros of the saved input shape (batch of one), which creates its variables."""
    from mpcore import ops

    shape = config.get("input_shape")
    if model._is_graph or shape is None or (model.built and model.weights):
        return
    if shape and isinstance(shape[0], list):
        raise NotImplementedError("building a subclassed model of several inputs from its "
                                  "config is not supported; build it before loading weights")
    model(ops.zeros(tuple(1 if d is None else d for d in shape), "float32"))


serialization.register_adapter("models", get_config, from_config)
