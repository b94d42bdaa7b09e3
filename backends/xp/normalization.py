"""Fused batch and layer normalization kernels shared by the array-library backends (channels
last): the forward pass in a few passes over the input, and the closed-form backward pass,
instead of a dozen composite ops each allocating and sweeping a full-size array.

Reductions go over a 2-D (rows, channels) view: NumPy reduces axis 0 of a C-contiguous array
row by row into a channels-wide accumulator, vectorised across the channels. Sums of products
(the variance, ``sum(dy * x_hat)``) use ``einsum``, which reduces without the product's
temporary array (CuPy has the same routines). A 16-bit input is converted to float32 as it is
read and the output rounded once back to its dtype; statistics and parameter gradients are
float32 (float64 for float64 inputs).
"""

from __future__ import annotations

from typing import Any


class NormalizationKernels:
    """Mixed into XpBackend."""

    xp: Any
    errstate: Any
    widened: Any
    narrowed: Any

    def batch_norm(self, x: Any, gamma: Any | None, beta: Any | None,
                   epsilon: float) -> tuple[Any, Any, Any, Any]:
        xp = self.xp
        out_dtype, x = x.dtype, self.widened(x)
        dt = x.dtype
        c = x.shape[-1]
        x2 = xp.ascontiguousarray(x).reshape(-1, c)
        n = dt.type(x2.shape[0])
        with self.errstate():
            mu = xp.sum(x2, axis=0, dtype=dt) / n
            y = xp.subtract(x2, mu)
            var = xp.einsum("ij,ij->j", y, y) / n
            inv = (1.0 / xp.sqrt(var + dt.type(epsilon))).astype(dt, copy=False)
            scale = inv if gamma is None else inv * gamma
            xp.multiply(y, scale, out=y)
            if beta is not None:
                xp.add(y, beta, out=y)
        return (self.narrowed(y.reshape(x.shape), out_dtype), mu.astype(dt, copy=False),
                var.astype(dt, copy=False), inv)

    def _rows(self, dy: Any, x: Any) -> tuple[Any, Any, Any]:
        """``x`` and ``dy`` as (rows, channels) views (contiguous, in the statistics' dtype),
        and that dtype."""
        xp = self.xp
        c = x.shape[-1]
        x, dy = self.widened(x), self.widened(dy)
        return (xp.ascontiguousarray(x).reshape(-1, c), xp.ascontiguousarray(dy).reshape(-1, c),
                x.dtype)

    def batch_norm_grad(self, dy: Any, x: Any, mean: Any,
                        inv_std: Any, gamma: Any | None
                        ) -> tuple[Any, Any, Any]:
        xp = self.xp
        x2, g2, dt = self._rows(dy, x)
        n = dt.type(x2.shape[0])
        with self.errstate():
            dbeta = xp.sum(g2, axis=0, dtype=dt)
            x_hat = xp.subtract(x2, mean)
            xp.multiply(x_hat, inv_std, out=x_hat)
            dgamma = xp.einsum("ij,ij->j", g2, x_hat)
            # dx = gamma * inv * (dy - dbeta/n - x_hat * dgamma/n), in place in x_hat
            xp.multiply(x_hat, dgamma / n, out=x_hat)
            xp.subtract(g2, x_hat, out=x_hat)
            xp.subtract(x_hat, dbeta / n, out=x_hat)
            scale = inv_std if gamma is None else inv_std * gamma
            xp.multiply(x_hat, scale, out=x_hat)
        return (self.narrowed(x_hat.reshape(x.shape), x.dtype), dgamma.astype(dt, copy=False),
                dbeta)

    def layer_norm(self, x: Any, gamma: Any | None, beta: Any | None,
                   epsilon: float) -> tuple[Any, Any, Any]:
        xp = self.xp
        out_dtype, x = x.dtype, self.widened(x)
        dt = x.dtype
        c = x.shape[-1]
        x2 = xp.ascontiguousarray(x).reshape(-1, c)
        n = dt.type(c)
        with self.errstate():
            mu = xp.sum(x2, axis=1, dtype=dt) / n
            y = xp.subtract(x2, mu[:, None])
            var = xp.einsum("ij,ij->i", y, y) / n
            inv = (1.0 / xp.sqrt(var + dt.type(epsilon))).astype(dt, copy=False)
            xp.multiply(y, inv[:, None], out=y)
            if gamma is not None:
                xp.multiply(y, gamma, out=y)
            if beta is not None:
                xp.add(y, beta, out=y)
        return self.narrowed(y.reshape(x.shape), out_dtype), mu.astype(dt, copy=False), inv

    def layer_norm_grad(self, dy: Any, x: Any, mean: Any,
                        inv_std: Any, gamma: Any | None
                        ) -> tuple[Any, Any, Any]:
        xp = self.xp
        x2, g2, dt = self._rows(dy, x)
        n = dt.type(x2.shape[1])
        with self.errstate():
            x_hat = xp.subtract(x2, mean[:, None])
            xp.multiply(x_hat, inv_std[:, None], out=x_hat)
            dbeta = xp.sum(g2, axis=0, dtype=dt)
            dgamma = xp.einsum("ij,ij->j", g2, x_hat)
            dyg = g2 * gamma if gamma is not None else g2.copy()
            a = xp.sum(dyg, axis=1, dtype=dt) / n
            b = xp.einsum("ij,ij->i", dyg, x_hat) / n
            # dx = inv * (dyg - a - x_hat * b), in place in x_hat
            xp.multiply(x_hat, b[:, None], out=x_hat)
            xp.subtract(dyg, x_hat, out=x_hat)
            xp.subtract(x_hat, a[:, None], out=x_hat)
            xp.multiply(x_hat, inv_std[:, None], out=x_hat)
        return (self.narrowed(x_hat.reshape(x.shape), x.dtype), dgamma.astype(dt, copy=False),
                dbeta)
