"""Shape and indexing kernels shared by the array-library backends (views where the library
makes them; tensors are immutable, so a view is never written through)."""

from __future__ import annotations

from typing import Any


class ShapeKernels:
    """Mixed into XpBackend."""

    xp: Any

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.xp.reshape(x, shape)

    def transpose(self, x: Any, perm: tuple[int, ...]) -> Any:
        return self.xp.transpose(x, perm)

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.xp.broadcast_to(x, shape)

    def concat(self, xs: list[Any], axis: int) -> Any:
        return self.xp.concatenate(xs, axis=axis)

    def take(self, x: Any, indices: Any, axis: int) -> Any:
        return self.xp.take(x, indices, axis=axis)

    def take_grad(self, g: Any, indices: Any, axis: int, shape: tuple[int, ...]) -> Any:
        # add.at: repeated indices accumulate (a fancy-index += would keep only the last)
        out = self.xp.zeros(shape, dtype=g.dtype)
        self.xp.add.at(out, (slice(None),) * axis + (indices,), g)
        return out

    def getitem(self, x: Any, key: tuple[Any, ...]) -> Any:
        # asarray: NumPy returns a scalar for an integer key, kernels return arrays
        return self.xp.asarray(x[key])

    def getitem_grad(self, g: Any, key: tuple[Any, ...], shape: tuple[int, ...]) -> Any:
        out = self.xp.zeros(shape, dtype=g.dtype)
        out[key] = g
        return out
