"""``mp.utils``, Keras 3's ``keras.utils`` names that training data uses: ``PyDataset`` (and
its older name ``Sequence``), ``unpack_x_y_sample_weight`` and ``pack_x_y_sample_weight``."""

from __future__ import annotations

from mpcore.models.data_adapters.py_dataset import PyDataset, Sequence
from mpcore.models.steps import pack_x_y_sample_weight, unpack_x_y_sample_weight

__all__ = ["PyDataset", "Sequence", "pack_x_y_sample_weight", "unpack_x_y_sample_weight"]
