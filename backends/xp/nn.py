"""Neural-network kernels shared by the array-library backends: softmax, log-softmax, sparse
softmax cross-entropy, relu's backward pass and the bias add, in the input's dtype.

Their arithmetic runs under :attr:`XpBackend.errstate`: Inf - Inf or Inf * 0 in logits or
gradients is routine in mixed precision training (a loss-scale overflow, caught by the
all-finite check that skips the step), and the array library's warning would point at these
lines, not at anything the user can change."""

from __future__ import annotations

import math
from typing import Any


class NnKernels:
    """Mixed into XpBackend."""

    xp: Any
    errstate: Any
    widened: Any
    narrowed: Any

    def softmax(self, x: Any, axis: int) -> Any:
        xp = self.xp
        with self.errstate():
            z = x - self.max_along(x, axis)
            xp.exp(z, out=z)
            z /= z.sum(axis=axis, keepdims=True)
        return z

    def log_softmax(self, x: Any, axis: int) -> Any:
        xp = self.xp
        with self.errstate():
            z = x - self.max_along(x, axis)
            z -= xp.log(xp.exp(z).sum(axis=axis, keepdims=True))
        return z

    def max_along(self, x: Any, axis: int) -> Any:
        """``x.max(axis=axis, keepdims=True)`` (a backend may take another route to the same
        values: a maximum is exact in any order)."""
        return x.max(axis=axis, keepdims=True)

    def labels_below(self, labels: Any, classes: int) -> bool:
        """Whether every label of the non-empty integer array ``labels`` is in [0, classes)."""
        return bool(labels.min() >= 0 and labels.max() < classes)

    def sparse_softmax_cross_entropy(self, logits: Any, labels: Any) -> tuple[Any, Any]:
        xp = self.xp
        n, classes = logits.shape
        if n and not self.labels_below(labels, classes):
            bad = labels[(labels < 0) | (labels >= classes)][0]
            raise ValueError(f"label {int(bad)} is out of range: labels must be in "
                             f"[0, {classes}) for logits with {classes} classes")
        with self.errstate():
            z = logits - self.max_along(logits, 1)
            probs = xp.exp(z)
            total = probs.sum(axis=1, keepdims=True)
            rows = xp.arange(n)
            loss = xp.log(total[:, 0]) - z[rows, labels]
            probs /= total
        return loss, probs

    def sparse_softmax_cross_entropy_grad(self, probs: Any, labels: Any, g: Any) -> Any:
        # the composite's float32 results: probs - 0 is probs, probs - 1 at the label, times g
        n = probs.shape[0]
        dx = probs.copy()
        with self.errstate():
            if n:
                dx[self.xp.arange(n), labels] -= 1
            dx *= g.astype(probs.dtype, copy=False)[:, None]
        return dx

    def relu_grad(self, g: Any, y: Any) -> Any:
        # a select, not g * (y > 0): an inf or NaN gradient where y <= 0 gives +0 (TF's ReluGrad)
        xp = self.xp
        return xp.where(y > 0, g, xp.zeros((), dtype=g.dtype))

    def bias_add(self, x: Any, bias: Any) -> Any:
        with self.errstate():
            return x + bias

    # --- GELU: one kernel each way, computed in float32 (float64 stays float64) -----------
    def _gelu_parts(self, x: Any, approximate: bool) -> tuple[Any, Any]:
        """(Phi(x) = 0.5 * (1 + erf(x / sqrt 2)), or the tanh form's 0.5 * (1 + t); and t,
        the tanh form's tanh value, else None) for float32 or float64 ``x``, in a few buffers
        (a transformer's GELU activations are its largest arrays); erf through the backend's
        own ``erf`` kernel."""
        xp = self.xp
        ft = x.dtype.type
        if approximate:
            inner = xp.multiply(x, x)
            inner *= ft(0.044715)
            inner += ft(1.0)
            inner *= x
            inner *= ft(math.sqrt(2.0 / math.pi))
            t = xp.tanh(inner, out=inner)
            half = xp.add(t, ft(1.0))
            half *= ft(0.5)
            return half, t
        half = self.erf(xp.multiply(x, ft(1.0 / math.sqrt(2.0))))  # type: ignore[attr-defined]
        half += ft(1.0)
        half *= ft(0.5)
        return half, None

    def gelu(self, x: Any, approximate: bool) -> tuple[Any, Any]:
        """(x * Phi(x) in float32 (float64 stays float64), rounded once to x's dtype; and
        what gelu_grad reuses: Phi(x), or the tanh form's tanh value)."""
        x32 = self.widened(x)
        with self.errstate():
            half, t = self._gelu_parts(x32, approximate)
            y = self.xp.multiply(half, x32)
        return self.narrowed(y, x.dtype), (t if approximate else half)

    def gelu_grad(self, g: Any, x: Any, saved: Any, approximate: bool) -> Any:
        """g * d gelu/dx: Phi(x) + x * phi(x) (exact), or the tanh form's derivative, from
        what gelu saved (no second erf)."""
        xp = self.xp
        x32 = self.widened(x)
        ft = x32.dtype.type
        with self.errstate():
            if approximate:
                t = saved
                d = xp.add(t, ft(1.0))
                d *= ft(0.5)
                # + 0.5 * x * (1 - t^2) * c * (1 + 3k x^2)
                rest = xp.square(t)
                xp.subtract(ft(1.0), rest, out=rest)
                rest *= x32
                rest *= ft(0.5 * math.sqrt(2.0 / math.pi))
                sq = xp.multiply(x32, x32)
                sq *= ft(3.0 * 0.044715)
                sq += ft(1.0)
                rest *= sq
                d += rest
            else:
                d = xp.multiply(x32, x32)
                d *= ft(-0.5)
                xp.exp(d, out=d)
                d *= ft(1.0 / math.sqrt(2.0 * math.pi))
                d *= x32
                d += saved
            d *= self.widened(g)
        return self.narrowed(d, x.dtype)
