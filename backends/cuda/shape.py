"""The CUDA backend's one shape kernel of its own: ``take_grad`` accumulates in float32 through
``cupyx.scatter_add`` (16-bit atomics are slow or missing on older GPUs)."""

from __future__ import annotations

from typing import Any

from mpcore_xp import F32, LOW


class CudaShape:
    """Mixed into CudaBackend."""

    cp: Any
    cast: Any

    def take_grad(self, g: Any, indices: Any, axis: int, shape: tuple[int, ...]) -> Any:
        import cupyx

        # float32 accumulation: atomics on 16-bit types are slow or missing on older GPUs
        acc = self.cp.zeros(shape, dtype=F32 if g.dtype in LOW else g.dtype)
        cupyx.scatter_add(acc, (slice(None),) * axis + (indices,),
                          self.cast(g, "float32") if g.dtype in LOW else g)
        return acc if acc.dtype == g.dtype else self.cast(acc, g.dtype.name)
