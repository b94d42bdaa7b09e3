"""Saving as Keras 3 does (``mp.saving``, Keras' ``keras.saving``): ``.keras`` files
(``save_model``, ``load_model``), ``.weights.h5`` files, and Keras 3's serialization of
objects to configs with custom objects found by registration.

Files: ``registration`` (custom objects), ``serialization`` (``serialize_keras_object``,
``deserialize_keras_object``), ``keras_names`` and ``keras_configs`` (Keras' names and config
words for mpcore's classes), ``model_config`` (functional and Sequential configs, compile
configs), ``weights_h5`` (Keras' h5 layout), ``keras_file`` (the zip).
"""

# keras_configs and model_config register their adapters with serialization when imported
from mpcore.saving import keras_configs, model_config  # noqa: F401
from mpcore.saving.keras_file import load_model, load_weights, save_model, save_weights
from mpcore.saving.registration import (
    CustomObjectScope,
    custom_object_scope,
    get_custom_objects,
    get_registered_name,
    get_registered_object,
    register_keras_serializable,
)
from mpcore.saving.serialization import deserialize_keras_object, serialize_keras_object

__all__ = ["CustomObjectScope", "custom_object_scope", "deserialize_keras_object",
           "get_custom_objects", "get_registered_name", "get_registered_object",
           "load_model", "load_weights", "register_keras_serializable", "save_model",
           "save_weights", "serialize_keras_object"]

# The models register their classes here (keras_names.register) when imported: the public
# package brings them in, so that mp.saving.load_model finds Sequential and Functional in a
# process that has not imported them yet.
import mpcore.models  # noqa: F401
