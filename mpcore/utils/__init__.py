"""``mp.utils``, Keras 3's ``keras.utils`` names: what training data uses (``PyDataset``, its
older name ``Sequence``, ``unpack_x_y_sample_weight``, ``pack_x_y_sample_weight``) and the
custom-object registry of :mod:`mpcore.saving` (``register_keras_serializable``,
``custom_object_scope``, ...), which Keras 3 exports here too, and ``set_random_seed``."""

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


def set_random_seed(seed: int) -> None:
    """Keras 3's ``keras.utils.set_random_seed``: seeds Python's ``random``, NumPy's global
    generator (as Keras does, for user code that draws from them) and mpcore's own stream
    (``mp.random.set_seed``: initializers, dropout, shuffles)."""
    import random

    import numpy

    from mpcore.core import random as _random

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"Expected `seed` argument to be an integer. Received: seed={seed!r}")
    random.seed(seed)
    numpy.random.seed(seed % 2**32)
    _random.set_seed(seed)

__all__ = ["CustomObjectScope", "PyDataset", "Sequence", "custom_object_scope",
           "deserialize_keras_object", "get_custom_objects", "get_registered_name",
           "get_registered_object", "pack_x_y_sample_weight", "register_keras_serializable",
           "serialize_keras_object", "set_random_seed", "unpack_x_y_sample_weight"]
