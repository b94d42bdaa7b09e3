"""Keras 3's names for mpcore's classes, both ways: the ``module`` and ``class_name`` a
``.keras`` file gives each built-in object (``keras.layers.Dense``, ``keras.optimizers.Adam``,
``keras.DTypePolicy``, ``keras.Sequential`` ...), and the class a module and class name in a
file written by Keras 3 mean here (``keras.src.layers.core.dense`` is ``keras.layers``).

Only Keras' public modules are written, so Keras 3 reads what mpcore saves; a file may name
Keras' private paths (``keras.src...``), as Keras itself writes for the functional model.

The models sit above this package (their ``save`` and ``get_config`` call it): they register
their classes here when imported (:func:`register`), as ``mpcore.layers.operators`` installs
itself on KerasTensor, so the import order stays acyclic."""

from __future__ import annotations

import functools
import re
from typing import Any

#: The Keras module a category of built-in objects is written under.
MODULES = {"layers": "keras.layers", "optimizers": "keras.optimizers",
           "losses": "keras.losses", "metrics": "keras.metrics", "models": "keras",
           "policy": "keras", "initializers": "keras.initializers",
           "schedules": "keras.optimizers.schedules"}


_REGISTERED: dict[str, dict[str, type]] = {}


def register(category: str, classes: dict[str, type]) -> None:
    """Add built-in classes of a package above this one (``mpcore.models`` registers
    ``Sequential``, ``Functional`` and ``Model``)."""
    _REGISTERED.setdefault(category, {}).update(classes)


def builtins() -> dict[str, dict[str, type]]:
    """Category -> {Keras class name: mpcore class}."""
    table = dict(_builtins_below())
    for category, classes in _REGISTERED.items():
        table[category] = {**table.get(category, {}), **classes}
    return table


def model_class(name: str) -> type:
    """``Sequential`` or ``Model``, as :mod:`mpcore.models` registered them."""
    classes = _REGISTERED.get("models", {})
    if name not in classes:
        raise RuntimeError("mpcore.models has not registered its classes: import mpcore.models")
    return classes[name]


def to_snake_case(name: str) -> str:
    """Keras 3's ``naming.to_snake_case``: ``Conv2D`` -> ``conv2d``, ``MaxPooling2D`` ->
    ``max_pooling2d``."""
    s = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", re.sub(r"\W+", "", name))
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", s).lower()


def policy_to_keras(policy: Any) -> dict[str, Any]:
    """Keras 3's DTypePolicy object. A policy given an explicit loss scale keeps it in its
    config (mpcore's own key: Keras' DTypePolicy has no loss scale and refuses it)."""
    return {"module": MODULES["policy"], "class_name": "DTypePolicy",
            "config": policy.get_config(), "registered_name": None}


@functools.cache
def _builtins_below() -> dict[str, dict[str, type]]:
    """The built-ins of the packages below this one, imported on first use (``import
    mpcore`` loads layers, optimizers, losses and metrics lazily)."""
    from mpcore import layers, optimizers
    from mpcore.layers import merging, pooling
    from mpcore.losses import losses
    from mpcore.metrics import metrics
    from mpcore.mixed_precision.policy import Policy
    from mpcore.optimizers import schedules
    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    layer_classes = [getattr(layers, n) for n in layers.__all__
                     if isinstance(getattr(layers, n), type)
                     and issubclass(getattr(layers, n), layers.Layer)
                     and getattr(layers, n) not in (layers.Layer, layers.KerasTensor)]
    layer_classes += [merging.Merge, pooling.GlobalAveragePooling1D]
    table = {
        "layers": {c.__name__: c for c in layer_classes},
        "optimizers": {c.__name__: c for c in (optimizers.SGD, optimizers.RMSprop,
                                               optimizers.Adam, optimizers.AdamW,
                                               LossScaleOptimizer)},
        "losses": {c.__name__: c for c in vars(losses).values()
                   if isinstance(c, type) and issubclass(c, losses.Loss)
                   and c not in (losses.Loss, losses.LossFunctionWrapper)},
        "metrics": {c.__name__: c for c in vars(metrics).values()
                    if isinstance(c, type) and issubclass(c, metrics.Metric)
                    and c not in (metrics.Metric, metrics.MeanMetricWrapper)},
        "policy": {"DTypePolicy": Policy, "Policy": Policy},
        "schedules": {c.__name__: c for c in vars(schedules).values()
                      if isinstance(c, type) and issubclass(c, schedules.LearningRateSchedule)
                      and c is not schedules.LearningRateSchedule},
    }
    # Keras' aliases that name the same class
    table["layers"].update({"MaxPool2D": layers.MaxPooling2D,
                            "AvgPool2D": layers.AveragePooling2D})
    return table


def category_of_module(module: str | None) -> str | None:
    """The category a Keras module names: ``keras.layers``, ``keras.src.layers.core.dense``
    -> "layers"; ``keras`` -> None (models and the policy share it: the class name decides)."""
    if not module or not (module == "keras" or module.startswith("keras.")):
        return None
    parts = module.split(".")[1:]
    if parts and parts[0] == "src":
        parts = parts[1:]
    if not parts:
        return None
    if parts[0] == "optimizers" and len(parts) > 1 and "schedule" in parts[1]:
        return "schedules"
    if parts[0] in ("models", "trainers"):
        return "models"
    if parts[0] == "dtype_policies":
        return "policy"
    return parts[0] if parts[0] in MODULES else None


def find_builtin(module: str | None, class_name: str) -> type | None:
    """The mpcore class that ``module`` + ``class_name`` (Keras' or mpcore's own) names, or
    None where mpcore has no such built-in."""
    table = builtins()
    category = category_of_module(module)
    if category is not None:
        return table.get(category, {}).get(class_name)
    if module and module.startswith("mpcore"):
        for classes in table.values():
            cls = classes.get(class_name)
            if cls is not None and cls.__module__ == module:
                return cls
    if module in (None, "keras"):
        for category in ("models", "policy"):
            if class_name in table[category]:
                return table[category][class_name]
    return None


def keras_name(obj: Any) -> tuple[str, str] | None:
    """(module, class_name) Keras 3 gives ``obj``'s class, or None when it is not one of
    mpcore's built-ins (a subclass is not: it is the user's, saved under its own module)."""
    cls = type(obj)
    for category, classes in builtins().items():
        for name, known in classes.items():
            if known is cls and name not in ("Model", "Policy", "MaxPool2D", "AvgPool2D"):
                if category == "models" and name == "Functional":
                    if not getattr(obj, "_is_graph", False):
                        return None       # a Model subclass without a graph is the user's
                    return "keras.src.models.functional", "Functional"
                return MODULES[category], name
    return None


def all_builtin_names() -> list[str]:
    """Every built-in class name, for messages."""
    return sorted({name for classes in builtins().values() for name in classes})
