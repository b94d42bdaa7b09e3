"""``serialize_keras_object`` and ``deserialize_keras_object``, Keras 3's format: an object is
``{"module", "class_name", "config", "registered_name"}`` (plus ``build_config`` for a layer
and ``compile_config`` for a compiled model); plain values, lists and dicts stay themselves.

mpcore's built-ins are written under Keras' public names (:mod:`mpcore.saving.keras_names`),
in Keras' config words (:mod:`mpcore.saving.keras_configs`), so Keras 3 reads them; a custom
class is written under its module and registered name and found again by that name (the
registry, a ``custom_object_scope``, or ``custom_objects=``), never by importing a module the
file names: a config cannot make loading run arbitrary code.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import types
from collections.abc import Callable, Iterator
from typing import Any

from mpcore.saving import keras_names, registration

PLAIN_TYPES = (str, int, float, bool)
#: category -> (the Keras config of a built-in object, the object a Keras config describes).
#: :mod:`mpcore.saving.keras_configs` (layers, optimizers, losses, metrics, the policy) and
#: :mod:`mpcore.saving.model_config` (models) register theirs when imported (the package
#: imports both): they build on this module, which therefore imports neither.
_ADAPTERS: dict[str, tuple[Callable[[Any], dict[str, Any]],
                           Callable[[type, dict[str, Any], Any], Any]]] = {}


def register_adapter(category: str, to_keras: Callable[[Any], dict[str, Any]],
                     from_keras: Callable[[type, dict[str, Any], Any], Any]) -> None:
    _ADAPTERS[category] = (to_keras, from_keras)
_SAFE_MODE: contextvars.ContextVar[bool | None] = contextvars.ContextVar("mpcore_safe_mode",
                                                                         default=None)


@contextlib.contextmanager
def safe_mode_scope(safe_mode: bool = True) -> Iterator[None]:
    """Keras 3's ``SafeModeScope``: the ``safe_mode`` of every deserialization inside."""
    token = _SAFE_MODE.set(bool(safe_mode))
    try:
        yield
    finally:
        _SAFE_MODE.reset(token)


def serialize_keras_object(obj: Any) -> Any:
    """The config that describes ``obj`` (see the module's docstring)."""
    if obj is None or isinstance(obj, PLAIN_TYPES):
        return obj
    if isinstance(obj, (list, tuple)):
        return [serialize_keras_object(x) for x in obj]
    if isinstance(obj, dict):
        return {key: serialize_keras_object(value) for key, value in obj.items()}
    if isinstance(obj, bytes):
        return {"class_name": "__bytes__", "config": {"value": obj.decode("utf-8")}}
    if isinstance(obj, slice):
        return {"class_name": "__slice__", "config": {
            "start": serialize_keras_object(obj.start), "stop": serialize_keras_object(obj.stop),
            "step": serialize_keras_object(obj.step)}}
    if obj is Ellipsis:
        return {"class_name": "__ellipsis__", "config": {}}
    if isinstance(obj, types.FunctionType):
        return _serialize_function(obj)
    name = keras_names.keras_name(obj)
    if name is not None:
        module, class_name = name
        config: dict[str, Any] = {"module": module, "class_name": class_name,
                                  "config": serialize_keras_object(_builtin_config(obj)),
                                  "registered_name": (class_name if class_name == "Functional"
                                                      else None)}
    else:
        if not hasattr(obj, "get_config"):
            raise TypeError(f"cannot serialize {obj!r} of type {type(obj).__name__}: a class "
                            "needs a get_config() method to be saved")
        inner = obj.get_config()
        if not isinstance(inner, dict):
            raise TypeError(f"the get_config() of {obj!r} must return a dict, got {inner!r}")
        _check_init_arguments(obj, inner)
        inner = dict(inner)
        if "dtype" in inner and hasattr(obj, "dtype_policy"):
            inner["dtype"] = keras_names.policy_to_keras(obj.dtype_policy)
        cls = type(obj)
        # Keras writes no module for __main__, which names no module another process has
        config = {"module": None if cls.__module__ == "__main__" else cls.__module__,
                  "class_name": cls.__name__,
                  "config": serialize_keras_object(inner),
                  "registered_name": registration.get_registered_name(cls)}
    _add_build_and_compile_config(obj, config)
    return config


def _check_init_arguments(obj: Any, config: dict[str, Any]) -> None:
    """Refuse, at save time, a config that ``cls(**config)`` could not rebuild because a
    required ``__init__`` argument is missing (a custom layer that keeps the base
    ``get_config``): the file would be written and only its load would fail."""
    cls = type(obj)
    owner = next((k for k in cls.__mro__ if "from_config" in vars(k)), None)
    if owner is not None and not owner.__module__.startswith("mpcore."):
        return   # the class rebuilds itself in its own from_config
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    missing = [p.name for p in params
               if p.kind in kinds and p.default is inspect.Parameter.empty
               and p.name not in config]
    if missing:
        raise NotImplementedError(
            f"{cls.__name__} has arguments {missing} in __init__() that its get_config() does "
            f"not return, so a saved {cls.__name__} could not be rebuilt: override "
            f"get_config() to return them ({{**super().get_config(), {missing[0]!r}: ...}})")


def _serialize_function(fn: Any) -> Any:
    if fn.__name__ == "<lambda>":
        raise ValueError("cannot save a lambda: mpcore never writes code into a file (Keras "
                         "would marshal its bytecode); use a named function registered with "
                         "mp.saving.register_keras_serializable()")
    registered = registration.registered_name_or_none(fn)
    if registered is None and (fn.__module__ or "").startswith("mpcore."):
        return fn.__name__     # a built-in function (an activation, a loss): by its name
    # the user's: by its registered name, else its own (then custom_objects must give it)
    name = registered or fn.__name__
    return {"module": None if fn.__module__ == "__main__" else fn.__module__,
            "class_name": "function", "config": name, "registered_name": name}


def _builtin_config(obj: Any) -> dict[str, Any]:
    adapter = _ADAPTERS.get(_builtin_category(type(obj)) or "")
    return adapter[0](obj) if adapter is not None else dict(obj.get_config())


def _add_build_and_compile_config(obj: Any, config: dict[str, Any]) -> None:
    from mpcore.layers import InputLayer, Layer

    if hasattr(obj, "get_compile_config"):       # a model (Keras 3's hooks)
        config["build_config"] = obj.get_build_config()
        compile_config = obj.get_compile_config()
        if compile_config is not None:
            config["compile_config"] = serialize_keras_object(compile_config)
    elif (isinstance(obj, Layer) and not isinstance(obj, InputLayer) and obj.built
          and obj._build_shape is not None
          and len(inspect.signature(obj.build).parameters) == 1):
        # a build of several shapes (MultiHeadAttention's query, value, key) has Keras' own
        # build_config; without one, the layer builds at its first call, as it does in a model
        config["build_config"] = {"input_shape": list(obj._build_shape)}


# --- deserialization ----------------------------------------------------------------------------
def deserialize_keras_object(config: Any, custom_objects: dict[str, Any] | None = None,
                             safe_mode: bool = True) -> Any:
    """The object ``config`` describes. A class is found, in this order, in
    ``custom_objects``, the custom_object_scopes, the registry (by ``registered_name``, then
    class name), then among mpcore's built-ins by Keras' module and class name. An unknown
    class is an error that names it and the two ways to make it known."""
    scoped = _SAFE_MODE.get()
    safe_mode = scoped if scoped is not None else safe_mode
    if config is None or isinstance(config, PLAIN_TYPES):
        if isinstance(config, str):
            found = registration.get_registered_object(config, custom_objects)
            if found is not None:
                return found
        return config
    if isinstance(config, (list, tuple)):
        return [deserialize_keras_object(x, custom_objects, safe_mode) for x in config]
    if not isinstance(config, dict):
        raise TypeError(f"cannot deserialize {config!r}: expected a dict, list or plain value")
    if "class_name" not in config or "config" not in config:
        return {key: deserialize_keras_object(value, custom_objects, safe_mode)
                for key, value in config.items()}
    class_name = config["class_name"]
    inner = config["config"] if config["config"] is not None else {}
    if class_name == "__lambda__":
        if safe_mode:
            raise ValueError(
                "Requested the deserialization of a Python lambda. This carries a potential "
                "risk of arbitrary code execution and thus it is disallowed by default "
                "(safe_mode=True). mpcore never loads lambdas: replace it with a named "
                "function registered with mp.saving.register_keras_serializable()")
        raise NotImplementedError("mpcore does not load Python lambdas, even with "
                                  "safe_mode=False: it would have to run marshalled bytecode")
    if class_name in ("__tensor__", "__numpy__"):
        from mpcore import ops
        return ops.constant(inner["value"], dtype=inner["dtype"])
    if class_name == "__bytes__":
        return inner["value"].encode("utf-8")
    if class_name == "__ellipsis__":
        return Ellipsis
    if class_name == "__slice__":
        return slice(*(deserialize_keras_object(inner[k], custom_objects, safe_mode)
                       for k in ("start", "stop", "step")))
    if class_name == "function":
        if not isinstance(inner, str) or not inner:
            raise TypeError(f"Expected 'config' to be a non-null str for a function, got "
                            f"{inner!r}. Full config: {config}")
        return _find(inner, config.get("registered_name"), config.get("module"),
                     custom_objects, "function")
    cls = _find(class_name, config.get("registered_name"), config.get("module"),
                custom_objects, "class")
    if not isinstance(inner, dict):
        raise TypeError(f"the config of {class_name!r} must be a dict, got {inner!r}")
    with registration.custom_object_scope(custom_objects), safe_mode_scope(safe_mode):
        instance = _instantiate(cls, inner, custom_objects, config)
        build_config = config.get("build_config")
        if build_config:
            if hasattr(instance, "build_from_config"):
                instance.build_from_config(build_config)
            elif not getattr(instance, "built", True):
                build_from_config(instance, build_config)
        compile_config = config.get("compile_config")
        if compile_config and hasattr(instance, "compile_from_config"):
            instance.compile_from_config(compile_config)
    return instance


class UnknownObjectError(TypeError):
    """A class or function of a config that is neither built in nor registered (a TypeError,
    as Keras raises)."""


def _find(name: str, registered_name: str | None, module: str | None,
          custom_objects: dict[str, Any] | None, kind: str) -> Any:
    for key in (registered_name, name):
        found = registration.get_registered_object(key, custom_objects)
        if found is not None:
            return found
    if kind == "class":
        builtin = keras_names.find_builtin(module, name)
        if builtin is not None:
            return builtin
    elif module == "builtins" or (module or "").startswith("keras"):
        from mpcore.layers import activations
        from mpcore.losses import losses
        found = getattr(activations, name, None) or getattr(losses, name, None)
        if isinstance(found, types.FunctionType):
            return found
    where = f" (module {module!r})" if module else ""
    raise UnknownObjectError(
        f"Could not locate {kind} {name!r}{where}: it is not one of mpcore's built-ins. If "
        f"it is a custom {kind}, register it with "
        f"@mp.saving.register_keras_serializable(package=...) before loading, or pass it "
        f"as custom_objects={{{(registered_name or name)!r}: {name}}}")


def _instantiate(cls: Any, inner: dict[str, Any], custom_objects: dict[str, Any] | None,
                 full: dict[str, Any]) -> Any:
    if isinstance(cls, types.FunctionType):
        return cls
    adapter = _ADAPTERS.get(_builtin_category(cls) or "")
    try:
        if adapter is not None:
            return adapter[1](cls, inner, custom_objects)
        if not hasattr(cls, "from_config"):
            raise TypeError(f"cannot rebuild {cls!r}: it has no from_config() method")
        return cls.from_config(inner)
    except UnknownObjectError:
        # a class missing from the registry (of a layer inside this model) says all there is
        # to say; the wrapper below would blame get_config() and print the whole model's config
        raise
    except TypeError as exc:
        raise TypeError(f"{getattr(cls, '__name__', cls)} could not be rebuilt from its config "
                        f"({exc}); a get_config() that returns layers or other objects needs "
                        f"a from_config() that deserializes them. Config: {full}") from exc


def _builtin_category(cls: Any) -> str | None:
    for category, classes in keras_names.builtins().items():
        if any(known is cls for known in classes.values()):
            return category
    return None


def build_from_config(obj: Any, build_config: dict[str, Any]) -> None:
    """Keras 3's ``build_from_config``: build with the saved input shape."""
    shape = build_config.get("input_shape")
    if shape is None:
        return
    if isinstance(shape, list) and shape and isinstance(shape[0], list):
        obj.build([tuple(s) for s in shape])
    else:
        obj.build(tuple(shape))
    obj.built = True
    obj._build_shape = tuple(shape) if not (shape and isinstance(shape[0], list)) else None
