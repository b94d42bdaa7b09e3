"""The dense layer's kernel composed of the backend's own matmul, bias_add and relu (a backend
with a fused GEMM epilogue overrides it)."""

from __future__ import annotations

from typing import Any


class LinalgKernels:
    """Mixed into XpBackend, whose subclass provides ``matmul``."""

    matmul: Any
    bias_add: Any
    relu: Any

    def dense(self, x: Any, w: Any, bias: Any, activation: str | None) -> Any:
        # Not fused: a 16-bit result is rounded after the GEMM and again after the bias.
        if activation not in (None, "relu"):
            raise ValueError(f"dense: unknown activation {activation!r}; use None or 'relu'")
        flat = x.reshape(-1, x.shape[-1]) if x.ndim > 2 else x
        z = self.matmul(flat, w, False, False)
        if bias is not None:
            z = self.bias_add(z, bias)
        if activation == "relu":
            z = self.relu(z)
        return z.reshape(*x.shape[:-1], w.shape[-1]) if x.ndim > 2 else z
