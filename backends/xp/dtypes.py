"""The array dtype of every mpcore dtype name, for NumPy and for the libraries that take NumPy's
dtypes (CuPy, oneDNN's and ONNX Runtime's wrappers): the one table the backends share.

bfloat16 comes from ml_dtypes, which NumPy and CuPy 14 both understand.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from mpcore.core.dtypes import ALL

#: mpcore dtype name -> NumPy dtype.
DTYPES: dict[str, Any] = {
    name: np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name) for name in ALL}
F16, BF16, F32, F64 = (DTYPES[n] for n in ("float16", "bfloat16", "float32", "float64"))
#: The 16-bit floating dtypes: computed through float32 where a library lacks 16-bit math.
LOW = frozenset({F16, BF16})
I64 = DTYPES["int64"]
