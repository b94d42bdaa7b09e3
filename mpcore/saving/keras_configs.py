"""The configs of mpcore's built-in classes in Keras 3's words, both ways.

Writing: a layer's ``dtype`` becomes Keras' ``DTypePolicy`` object, an initializer object
becomes Keras' ``{"module": "keras.initializers", ...}``, an InputLayer writes ``batch_shape``.
Reading: Keras writes keys for features mpcore does not implement (regularizers, constraints,
EMA, dilation ...). A key at its "off" value is dropped; any other value is refused with an
error naming it, since silently dropping a regularizer or an EMA would load a different model.
"""

from __future__ import annotations

from typing import Any

from mpcore.core.arguments import accepted_arguments
from mpcore.saving import keras_names, registration, serialization

# Keras 3 arguments mpcore does not implement, with the values that mean "not used".
_OFF: dict[str, tuple[Any, ...]] = {
    **dict.fromkeys(("kernel_regularizer", "bias_regularizer", "activity_regularizer",
                     "kernel_constraint", "bias_constraint", "quantization_config",
                     "lora_rank", "lora_alpha", "noise_shape", "ema_overwrite_frequency",
                     "loss_scale_factor", "ignore_class", "flash_attention",
                     "renorm_clipping"), (None,)),
    "data_format": ("channels_last", None), "dilation_rate": ([1, 1], (1, 1), 1),
    "groups": (1,), "use_ema": (False,), "amsgrad": (False,), "centered": (False,),
    "sparse": (False,), "ragged": (False,), "optional": (False,), "label_smoothing": (0, 0.0),
    "use_gate": (False,), "sliding_window": (None,), "weight_decay": (None,),
    "axis": (-1,), "dtype": (None, "float32"), "lora_enabled": (False,),
}
# keys whose value does not matter once another key turns the feature off
_IGNORED_WHEN = {"ema_momentum": ("use_ema", False), "renorm_momentum": ("renorm", False)}

_INITIALIZERS = {"GlorotUniform": "glorot_uniform", "GlorotNormal": "glorot_normal",
                 "HeUniform": "he_uniform", "HeNormal": "he_normal", "Zeros": "zeros",
                 "Ones": "ones", "RandomUniform": "random_uniform",
                 "RandomNormal": "random_normal"}


def keep_supported(cls: type, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the keys ``cls`` does not take that are at their off value. A key
    it does not name but may take through ``**kwargs`` (a layer pops Keras' ``rms_scaling``
    itself) is passed on for the class to judge; any other is a NotImplementedError."""
    accepted = accepted_arguments(cls)
    if accepted is None:
        return dict(config)
    out = {}
    for key, value in config.items():
        if key in accepted:
            out[key] = value
            continue
        gate = _IGNORED_WHEN.get(key)
        if gate is not None and config.get(gate[0], gate[1]) == gate[1]:
            continue
        if key in _OFF:
            if any(_is_off(value, off) for off in _OFF[key]):
                continue
            raise NotImplementedError(
                f"{cls.__name__}: {key}={value!r} is not supported by mpcore (only "
                f"{' or '.join(repr(v) for v in _OFF[key])}); the saved object cannot be "
                "loaded without changing what it computes")
        out[key] = value
    return out


def _is_off(value: Any, off: Any) -> bool:
    if isinstance(off, bool) or isinstance(value, bool) or off is None:
        return value is off       # 1 is not False, 0 is not None
    return bool(value == off)


# --- initializers -------------------------------------------------------------------------------
def initializer_to_keras(init: Any) -> Any:
    """A name stays a name (Keras takes ``"glorot_uniform"``); mpcore's initializer objects
    become Keras' serialized initializers."""
    from mpcore.layers import initializers as inits

    if init is None or isinstance(init, str):
        return init
    module = keras_names.MODULES["initializers"]
    if isinstance(init, inits.VarianceScaling):
        config = {"scale": init.scale, "mode": init.mode, "distribution": init.distribution,
                  "seed": init.seed}
        return {"module": module, "class_name": "VarianceScaling", "config": config,
                "registered_name": None}
    if isinstance(init, inits.Constant):
        name = {inits.Zeros: "Zeros", inits.Ones: "Ones"}.get(type(init), "Constant")
        config = {} if name != "Constant" else {"value": init.value}
        return {"module": module, "class_name": name, "config": config,
                "registered_name": None}
    for cls in (inits.RandomUniform, inits.RandomNormal):
        if type(init) is cls:
            return {"module": module, "class_name": cls.__name__,
                    "config": dict(vars(init)), "registered_name": None}
    return serialization.serialize_keras_object(init)


def initializer_from_keras(config: Any, custom_objects: dict[str, Any] | None) -> Any:
    """A Keras initializer config as mpcore takes it: a name where it has no settings."""
    from mpcore.layers import initializers as inits

    if not isinstance(config, dict) or "class_name" not in config:
        return config
    name, inner = config["class_name"], dict(config.get("config") or {})
    inner = {k: v for k, v in inner.items()
             if not (k in ("input_axes", "output_axes") and v is None)}
    if name in _INITIALIZERS and not any(v is not None for v in inner.values()):
        return _INITIALIZERS[name]
    builtin = {"VarianceScaling": inits.VarianceScaling, "Constant": inits.Constant,
               "RandomUniform": inits.RandomUniform, "RandomNormal": inits.RandomNormal,
               "GlorotUniform": inits.GlorotUniform, "GlorotNormal": inits.GlorotNormal,
               "HeUniform": inits.HeUniform, "HeNormal": inits.HeNormal}
    if keras_names.category_of_module(config.get("module")) == "initializers" and name in builtin:
        return builtin[name](**inner)
    return serialization.deserialize_keras_object(config, custom_objects)


# --- layers -------------------------------------------------------------------------------------
def layer_to_keras(layer: Any) -> dict[str, Any]:
    """A built-in layer's config as Keras 3 writes it."""
    from mpcore.layers import InputLayer

    if isinstance(layer, InputLayer):
        return {"batch_shape": list(layer.batch_shape), "dtype": layer.input_dtype,
                "sparse": False, "ragged": False, "name": layer.name, "optional": False}
    config = dict(layer.get_config())
    config["dtype"] = serialization.serialize_keras_object(layer.dtype_policy)
    activation = getattr(layer, "activation", None)
    if "activation" in config and callable(activation) and not _builtin_activation(activation):
        # a custom activation: by its registered name, as Keras 3 writes a function
        config["activation"] = serialization.serialize_keras_object(activation)
    for key, value in config.items():
        if key.endswith("_initializer"):
            config[key] = initializer_to_keras(value)
        elif isinstance(value, tuple):
            config[key] = list(value)
    return config


def layer_from_keras(cls: type, config: dict[str, Any],
                     custom_objects: dict[str, Any] | None) -> Any:
    """The built-in layer a Keras 3 config describes."""
    from mpcore.layers import InputLayer

    config = dict(config)
    if cls is InputLayer:
        shape = config.get("batch_shape", config.get("batch_input_shape"))
        if shape is None:
            shape = [None, *config.get("shape", [])]
        keep_supported(InputLayer, {k: v for k, v in config.items()
                                    if k not in ("batch_shape", "batch_input_shape", "shape",
                                                 "batch_size")})
        return InputLayer(tuple(shape[1:]), batch_size=shape[0], dtype=config.get("dtype"),
                          name=config.get("name"))
    if "dtype" in config:
        config["dtype"] = policy_from_keras(config["dtype"])
    for key, value in config.items():
        if key.endswith("_initializer"):
            config[key] = initializer_from_keras(value, custom_objects)
        elif key == "activation" and isinstance(value, (dict, str)):
            found = (serialization.deserialize_keras_object(value, custom_objects)
                     if isinstance(value, dict) else
                     registration.get_registered_object(value, custom_objects))
            if found is not None:
                config[key] = found
    return cls.from_config(keep_supported(cls, config))


def _builtin_activation(fn: Any) -> bool:
    from mpcore.layers import activations

    try:
        return activations.get(activations.name_of(fn)) is fn
    except (ValueError, TypeError):
        return False


def policy_from_keras(value: Any) -> Any:
    """A layer's ``dtype`` entry: a DTypePolicy object, a policy config, a name or None."""
    from mpcore.mixed_precision.policy import Policy

    if isinstance(value, dict):
        inner = value.get("config", value)
        return Policy.from_config({k: v for k, v in inner.items() if k != "shared_object_id"})
    return value


policy_to_keras = keras_names.policy_to_keras


# --- optimizers ---------------------------------------------------------------------------------
def optimizer_to_keras(optimizer: Any) -> dict[str, Any]:
    """An optimizer's config as Keras 3 writes it: a schedule as Keras' serialized schedule,
    a LossScaleOptimizer as Keras' (inner optimizer, initial scale, growth steps)."""
    from mpcore.mixed_precision import loss_scale as _ls
    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    if isinstance(optimizer, LossScaleOptimizer):
        scale = optimizer.loss_scale
        inner = serialization.serialize_keras_object(optimizer.inner_optimizer)
        if isinstance(scale, _ls.DynamicLossScale) and _keras_dynamic(scale):
            return {"name": optimizer.name, "inner_optimizer": inner,
                    "initial_scale": scale.initial_loss_scale,
                    "dynamic_growth_steps": scale.increment_period}
        # a fixed scale or other dynamic settings: mpcore's own key (Keras refuses it by name)
        return {"name": optimizer.name, "inner_optimizer": inner,
                "loss_scale": _ls.serialize(scale)}
    config = dict(optimizer.get_config())
    lr = config.get("learning_rate")
    if isinstance(lr, dict) and lr.get("registered_name") is None:
        config["learning_rate"] = {**lr, "module": keras_names.MODULES["schedules"]}
    return config


def _keras_dynamic(scale: Any) -> bool:
    """Whether a DynamicLossScale is one Keras 3's LossScaleOptimizer can express."""
    config = scale.get_config()
    return (config["multiplier"] == 2.0 and config["min_loss_scale"] == 1.0
            and config["max_loss_scale"] is None and config["hysteresis"] == 1)


def optimizer_from_keras(cls: type, config: dict[str, Any],
                         custom_objects: dict[str, Any] | None) -> Any:
    from mpcore.mixed_precision import loss_scale as _ls
    from mpcore.optimizers import schedules
    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    config = dict(config)
    if cls is LossScaleOptimizer:
        inner = serialization.deserialize_keras_object(config.pop("inner_optimizer"),
                                                       custom_objects)
        if isinstance(inner, dict) and "class_name" in inner:   # mpcore's get_config form
            from mpcore.optimizers import by_class_name
            inner = by_class_name(inner["class_name"]).from_config(inner["config"])
        if "loss_scale" in config:
            return LossScaleOptimizer(inner, _ls.get(config["loss_scale"], allow_none=False),
                                      name=config.get("name"))
        if not config.pop("dynamic", True):
            raise ValueError("LossScaleOptimizer: dynamic=False is not a Keras 3 setting; "
                             "save a fixed loss scale as loss_scale")
        return LossScaleOptimizer(inner, dynamic=True,
                                  initial_scale=config.get("initial_scale", 2.0**15),
                                  dynamic_growth_steps=config.get("dynamic_growth_steps", 2000),
                                  name=config.get("name"))
    lr = config.get("learning_rate")
    if isinstance(lr, dict):
        if keras_names.category_of_module(lr.get("module")) == "schedules":
            lr = {**lr, "module": "mpcore.optimizers.schedules"}
        config["learning_rate"] = schedules.deserialize(lr, custom_objects)
    return cls(**keep_supported(cls, config))


def _plain_from_keras(cls: type, config: dict[str, Any],
                      custom_objects: dict[str, Any] | None) -> Any:
    """A loss or a metric: its constructor's arguments, Keras' extra keys dropped."""
    return cls(**keep_supported(cls, config))


def _policy_from_config(cls: type, config: dict[str, Any],
                        custom_objects: dict[str, Any] | None) -> Any:
    return policy_from_keras({"config": config})


serialization.register_adapter("layers", layer_to_keras, layer_from_keras)
serialization.register_adapter("optimizers", optimizer_to_keras, optimizer_from_keras)
serialization.register_adapter("policy", lambda policy: policy.get_config(),
                               _policy_from_config)
for _category in ("losses", "metrics"):
    serialization.register_adapter(_category, lambda obj: dict(obj.get_config()),
                                   _plain_from_keras)
