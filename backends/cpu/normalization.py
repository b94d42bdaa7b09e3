"""The CPU backend's fused batch and layer normalization (channels last): the forward pass in
a few passes over the input, and the closed-form backward pass, instead of a dozen composite
ops each allocating and sweeping a full-size array.

Reductions go over a 2-D (rows, channels) view: NumPy reduces axis 0 of a C-contiguous array
row by row into a channels-wide accumulator, vectorised across the channels. Sums of products
(the variance, ``sum(dy * x_hat)``) use ``einsum``, which reduces without the product's
temporary array.
"""

from __future__ import annotations

import numpy as np

from .elementwise import quiet


class CpuNormalization:
    """Mixed into CpuBackend."""

    def batch_norm(self, x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None,
                   epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        dt = x.dtype
        c = x.shape[-1]
        x2 = np.ascontiguousarray(x).reshape(-1, c)
        n = dt.type(x2.shape[0])
        with quiet():
            mu = np.add.reduce(x2, axis=0, dtype=dt) / n
            y = np.subtract(x2, mu)
            var = np.einsum("ij,ij->j", y, y) / n
            inv = (1.0 / np.sqrt(var + dt.type(epsilon))).astype(dt, copy=False)
            scale = inv if gamma is None else inv * gamma
            np.multiply(y, scale, out=y)
            if beta is not None:
                np.add(y, beta, out=y)
        return y.reshape(x.shape), mu.astype(dt, copy=False), var.astype(dt, copy=False), inv

    def batch_norm_grad(self, dy: np.ndarray, x: np.ndarray, mean: np.ndarray,
                        inv_std: np.ndarray, gamma: np.ndarray | None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dt = x.dtype
        c = x.shape[-1]
        x2 = np.ascontiguousarray(x).reshape(-1, c)
        g2 = np.ascontiguousarray(dy).reshape(-1, c)
        n = dt.type(x2.shape[0])
        with quiet():
            dbeta = np.add.reduce(g2, axis=0, dtype=dt)
            x_hat = np.subtract(x2, mean)
            np.multiply(x_hat, inv_std, out=x_hat)
            dgamma = np.einsum("ij,ij->j", g2, x_hat)
            # dx = gamma * inv * (dy - dbeta/n - x_hat * dgamma/n), in place in x_hat
            np.multiply(x_hat, dgamma / n, out=x_hat)
            np.subtract(g2, x_hat, out=x_hat)
            np.subtract(x_hat, dbeta / n, out=x_hat)
            scale = inv_std if gamma is None else inv_std * gamma
            np.multiply(x_hat, scale, out=x_hat)
        return x_hat.reshape(x.shape), dgamma.astype(dt, copy=False), dbeta

    def layer_norm(self, x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None,
                   epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dt = x.dtype
        c = x.shape[-1]
        x2 = np.ascontiguousarray(x).reshape(-1, c)
        n = dt.type(c)
        with quiet():
            mu = np.add.reduce(x2, axis=1, dtype=dt) / n
            y = np.subtract(x2, mu[:, None])
            var = np.einsum("ij,ij->i", y, y) / n
            inv = (1.0 / np.sqrt(var + dt.type(epsilon))).astype(dt, copy=False)
            np.multiply(y, inv[:, None], out=y)
            if gamma is not None:
                np.multiply(y, gamma, out=y)
            if beta is not None:
                np.add(y, beta, out=y)
        return y.reshape(x.shape), mu.astype(dt, copy=False), inv

    def layer_norm_grad(self, dy: np.ndarray, x: np.ndarray, mean: np.ndarray,
                        inv_std: np.ndarray, gamma: np.ndarray | None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dt = x.dtype
        c = x.shape[-1]
        x2 = np.ascontiguousarray(x).reshape(-1, c)
        g2 = np.ascontiguousarray(dy).reshape(-1, c)
        n = dt.type(c)
        with quiet():
            x_hat = np.subtract(x2, mean[:, None])
            np.multiply(x_hat, inv_std[:, None], out=x_hat)
            dbeta = np.add.reduce(g2, axis=0, dtype=dt)
            dgamma = np.einsum("ij,ij->j", g2, x_hat)
            dyg = g2 * gamma if gamma is not None else g2.copy()
            a = np.add.reduce(dyg, axis=1, dtype=dt) / n
            b = np.einsum("ij,ij->i", dyg, x_hat) / n
            # dx = inv * (dyg - a - x_hat * b), in place in x_hat
            np.multiply(x_hat, b[:, None], out=x_hat)
            np.subtract(dyg, x_hat, out=x_hat)
            np.subtract(x_hat, a[:, None], out=x_hat)
            np.multiply(x_hat, inv_std[:, None], out=x_hat)
        return x_hat.reshape(x.shape), dgamma.astype(dt, copy=False), dbeta
