"""The CPU backend's gather gradient: ``take_grad`` along axis 0 (an Embedding's gradient) as a
segmented sum of the rows sorted by index, instead of ``np.add.at``, NumPy's unbuffered
scatter, which handles one element at a time (3 ms for a 2048 x 128 gradient, a few percent of
a small transformer's step).

``np.add.reduceat`` sums each index's rows pairwise rather than one after the other as the
scatter does, so a repeated index's sum can differ from ``np.add.at``'s in the last bits (it
is the more accurate of the two); a step and its traced replays use this same kernel, so they
stay bit for bit equal. 16-bit gradients (and other kernels' dtypes) keep the shared kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class CpuIndexing:
    """Mixed into CpuBackend, ahead of the shared kernels."""

    def take_grad(self, g: Any, indices: Any, axis: int, shape: tuple[int, ...]) -> Any:
        if (axis != 0 or type(g) is not np.ndarray or type(indices) is not np.ndarray
                or indices.size < 2 or g.dtype not in (np.float32, np.float64)):
            return super().take_grad(g, indices, axis, shape)  # type: ignore[misc]
        flat = indices.reshape(-1)
        if flat.min() < 0 or flat.max() >= shape[0]:
            # out of range (or negative, wrapping): the shared kernel's behaviour and errors
            return super().take_grad(g, indices, axis, shape)  # type: ignore[misc]
        rows = g.reshape(flat.size, -1)
        order = np.argsort(flat, kind="stable")
        ids = flat[order]
        starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
        out = np.zeros((shape[0], rows.shape[1]), dtype=g.dtype)
        out[ids[starts]] = np.add.reduceat(rows[order], starts, axis=0)
        return out.reshape(shape)
