"""Models: ``mp.Model`` (functional or subclassed) and ``mp.Sequential``; ``load_model`` and
``save_model`` (Keras 3's ``.keras`` files, :mod:`mpcore.saving`)."""

from typing import Any

from mpcore.models.model import Model
from mpcore.models.sequential import Sequential
from mpcore.saving import keras_names as _keras_names

# saving sits below the models: they tell it their Keras names (keras.Sequential, Functional)
_keras_names.register("models", {"Sequential": Sequential, "Functional": Model, "Model": Model})


def load_model(filepath: Any, custom_objects: dict[str, Any] | None = None,
               compile: bool = True, safe_mode: bool = True) -> Any:  # noqa: A002 - Keras' name
    """Keras 3's ``keras.models.load_model``: see :func:`mpcore.saving.load_model`."""
    from mpcore.saving import keras_file
    return keras_file.load_model(filepath, custom_objects=custom_objects, compile=compile,
                             safe_mode=safe_mode)


def save_model(model: Model, filepath: Any, overwrite: bool = True, **kwargs: Any) -> None:
    """Keras 3's ``keras.models.save_model``: see :func:`mpcore.saving.save_model`."""
    from mpcore.saving import keras_file
    keras_file.save_model(model, filepath, overwrite=overwrite, **kwargs)


__all__ = ["Model", "Sequential", "load_model", "save_model"]
