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

    def softmax(self, x: Any, axis: int) -> Any:
        xp = self.xp
        with self.errstate():
            z = x - x.max(axis=axis, keepdims=True)
            xp.exp(z, out=z)
            z /= z.sum(axis=axis, keepdims=True)
        return z

    def log_softmax(self, x: Any, axis: int) -> Any:
        xp = self.xp
        with self.errstate():
            z = x - x.max(axis=axis, keepdims=True)
            z -= xp.log(xp.exp(z).sum(axis=axis, keepdims=True))
        return z

    def sparse_softmax_cross_entropy(self, logits: Any, labels: Any) -> tuple[Any, Any]:
        xp = self.xp
        n, classes = logits.shape
        if n and (labels.min() < 0 or labels.max() >= classes):
            bad = labels[(labels < 0) | (labels >= classes)][0]
            raise ValueError(f"label {int(bad)} is out of range: labels must be in "
                             f"[0, {classes}) for logits with {classes} classes")
        with self.errstate():
            z = logits - logits.max(axis=1, keepdims=True)
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
    def gelu(self, x: Any, approximate: bool) -> tuple[Any, Any]:
        """(x * Phi(x) in x's dtype, and what gelu_grad reuses: Phi(x) or tanh's value);
        erf through the backend's own ``erf`` kernel."""
        xp = self.xp
        x32 = x if x.dtype == xp.float64 else x.astype(xp.float32)
        with self.errstate():
            if approximate:
                t = xp.tanh(x32 * math.sqrt(2.0 / math.pi) * (1.0 + 0.044715 * x32 * x32))
                half, saved = 0.5 * (1.0 + t), t
            else:
                half = 0.5 * (1.0 + self.erf(x32 * (1.0 / math.sqrt(2.0))))  # type: ignore[attr-defined]
                saved = half
            y = half * x32
        return y.astype(x.dtype), saved

    def gelu_grad(self, g: Any, x: Any, saved: Any, approximate: bool) -> Any:
        """g times gelu's derivative, from what :meth:`gelu` saved."""
        xp = self.xp
        x32 = x if x.dtype == xp.float64 else x.astype(xp.float32)
        with self.errstate():
            if approximate:
                t = saved
                d = 0.5 * (1.0 + t) + 0.5 * x32 * (1.0 - t * t) * math.sqrt(2.0 / math.pi) * (
                    1.0 + 3 * 0.044715 * x32 * x32)
            else:
                d = saved + x32 * xp.exp(-0.5 * x32 * x32) * (1.0 / math.sqrt(2.0 * math.pi))
            out = d * g.astype(x32.dtype)
        return out.astype(x.dtype)
