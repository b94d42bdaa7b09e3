"""``mp.utils``, Keras 3's ``keras.utils`` names: what training data uses (``PyDataset``, its
older name ``Sequence``, ``unpack_x_y_sample_weight``, ``pack_x_y_sample_weight``) and the
custom-object registry of :mod:`mpcore.saving` (``register_keras_serializable``,
``custom_object_scope``, ...), which Keras 3 exports here too."""

from __future__ import annotations

from mpcore.models.data_adapters.py_dataset import PyDataset, Sequence
from mpcore.models.steps import pack_x_y_sample_weight, unpack_x_y_sample_weight
from mpcore.saving.registration import (
    CustomObjectScope,
    custom_object_scope,
    get_custom_objects,
    get_registered_name,
    get_registered_object,
    register_keras_serializable,
)
from mpcore.saving.serialization import deserialize_keras_object, serialize_keras_object

__all__ = ["CustomObjectScope", "PyDataset", "Sequence", "custom_object_scope",
           "deserialize_keras_object", "get_custom_objects", "get_registered_name",
           "get_registered_object", "pack_x_y_sample_weight", "register_keras_serializable",
           "serialize_keras_object", "unpack_x_y_sample_weight"]
