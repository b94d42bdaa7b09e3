"""The CUDA backend's shape kernels of its own: ``take`` marks an index out of range (CuPy's
wraps it silently) and ``take_grad`` drops it; ``take_grad`` accumulates in float32 through
``cupyx.scatter_add`` (16-bit atomics are slow or missing on older GPUs)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import BF16, F16, F32, F64, LOW

FLOATS = (F16, BF16, F32, F64)


class CudaShape:
    """Mixed into CudaBackend."""

    cp: Any
    cast: Any
    where: Any

    def take(self, x: Any, indices: Any, axis: int) -> Any:
        # CuPy wraps an index out of range, where NumPy raises; raising here would read the
        # device at every take, so such a row reads NaN (0 for integers), as a label out of
        # range gives NaN (TensorFlow's GPU gather gives zeros)
        if x.shape[axis] == 0 and indices.size:  # known on the host: NumPy's error
            raise IndexError("cannot do a non-empty take from an empty axes.")
        out = self.cp.take(x, indices, axis=axis)
        if out.size:
            # a host scalar of out's dtype: no device array to make (nor to copy while a
            # CUDA graph captures); where() selects bfloat16 as raw bits
            fill = out.dtype.type(np.nan if out.dtype in FLOATS else 0)
            out = self.where(self._out_of_range(indices, axis, x.shape), fill, out)
        return out

    def _out_of_range(self, indices: Any, axis: int, shape: tuple[int, ...]) -> Any:
        """Where ``indices`` fall outside ``shape[axis]``, shaped to broadcast against a take's
        result (or its gradient)."""
        n = shape[axis]
        bad = (indices < -n) | (indices >= n)
        return bad.reshape((1,) * axis + bad.shape + (1,) * (len(shape) - axis - 1))

    def take_grad(self, g: Any, indices: Any, axis: int, shape: tuple[int, ...]) -> Any:
        import cupyx

        # float32 accumulation: atomics on 16-bit types are slow or missing on older GPUs
        acc = self.cp.zeros(shape, dtype=F32 if g.dtype in LOW else g.dtype)
        if g.size:
            # an index out of range adds nothing (its row read NaN), as TensorFlow's GPU
            # gather: CuPy's scatter_add would wrap it onto another row
            bad = self._out_of_range(indices, axis, shape)
            g = self.where(bad, g.dtype.type(0), g)
            indices = self.cp.where(bad.reshape(indices.shape), 0, indices)
        cupyx.scatter_add(acc, (slice(None),) * axis + (indices,),
                          self.cast(g, "float32") if g.dtype in LOW else g)
        return acc if acc.dtype == g.dtype else self.cast(acc, g.dtype.name)
