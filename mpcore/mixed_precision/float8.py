"""FP8 training, emulated: scaling recipes, the public quantise API, and the per-layer scaling
state of the ``mixed_float8`` policy.

>>> import mpcore as mp
>>> codes, amax = quantize(mp.constant([1.0, -3.0, 500.0]), 1.0, "e4m3")
>>> codes.numpy().tolist(), float(amax)      # 500 saturates to 448 (0x7e)
([56, 196, 126], 500.0)
>>> dequantize(codes, 1.0, format="e4m3").numpy().tolist()
[1.0, -3.0, 448.0]

Under ``mixed_float8`` a Dense layer's GEMM runs as Transformer Engine's FP8 GEMMs: inputs
and kernel quantised to e4m3 (scale, saturate, round to nearest even), multiplied with
float32 accumulation; in the backward pass the output gradient is quantised (e5m2 in the
"hybrid" format) and both input gradients are FP8 GEMMs too. Each quantised operand keeps a
scale and an amax history in non-trainable float32 variables (Keras 3's names:
``inputs_scale``, ``inputs_amax_history``, ``kernel_scale``, ``kernel_amax_history``,
``outputs_grad_scale``, ``outputs_grad_amax_history``), updated by ``assign`` on the device,
so a traced step replays the recipe bit for bit.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from mpcore import ops
from mpcore.core import tape as _tape
from mpcore.core.tensor import Tensor, Variable
from mpcore.mixed_precision.recipes import (
    AMAX_COMPUTE_ALGOS,
    FORMATS,
    CurrentScaling,
    DelayedScaling,
    Recipe,
    get,
    serialize,
)
from mpcore.ops.dispatch import autocast_scope
from mpcore.ops.float8 import FORMATS as CODE_FORMATS
from mpcore.ops.float8 import Quantized, float8_format
from mpcore.ops.float8 import scale_tensor as check_scale

__all__ = ["AMAX_COMPUTE_ALGOS", "CODE_FORMATS", "FORMATS", "CurrentScaling", "DelayedScaling",
           "OperandScaling", "Quantized", "Recipe", "dequantize", "get", "quantize",
           "serialize", "states_of"]


def quantize(x: Any, scale: Any, format: str = "e4m3") -> tuple[Tensor, Tensor]:  # noqa: A002
    """``(codes, amax)``: the FP8 codes (a uint8 tensor) of ``x * scale`` saturated to the
    format's range and rounded to nearest even, and ``max(|x|)`` (float32). ``scale`` is a
    multiplier (Transformer Engine's convention; Keras 3 divides by its scale). ``format``:
    "e4m3" (float8_e4m3fn) or "e5m2" (float8_e5m2)."""
    x = x if isinstance(x, Tensor) else ops.constant(x, dtype="float32")
    if x.dtype not in ("float16", "bfloat16", "float32"):
        x = ops.cast(x, "float32")
    return ops.quantize_fp8(x, _scale(scale, x, "float8.quantize"), format)


def dequantize(codes: Any, scale: Any, dtype: str = "float32", *,
               format: str) -> Tensor:  # noqa: A002
    """``decode(codes) * (1 / scale)`` in ``dtype``. ``format`` is required: codes are plain
    bits, and decoding e5m2 codes as e4m3 would be a silent wrong result."""
    # codes kept on the host (a uint8 NumPy array) are taken as quantize takes x; their dtype
    # is checked by the op, which names what it needs
    codes = codes if isinstance(codes, Tensor) else ops.constant(codes)
    return ops.dequantize_fp8(codes, _scale(scale, codes, "float8.dequantize"), format, dtype)


def _scale(scale: Any, like: Tensor, what: str) -> Tensor:
    if isinstance(scale, Tensor):
        return scale if scale.dtype == "float32" else ops.cast(scale, "float32")
    return check_scale(scale, like.backend, what)  # a number: finite and > 0


class OperandScaling:
    """The scaling state of one GEMM operand of a layer: its scale and amax history, as
    non-trainable float32 variables named ``<prefix>_scale`` and ``<prefix>_amax_history``
    (the scale starts at 1, the history at zeros)."""

    def __init__(self, layer: Any, prefix: str, recipe: Recipe, fmt: str) -> None:
        self.recipe = recipe
        self.format = float8_format(fmt)
        self.scale: Variable = layer.add_weight(
            shape=(), initializer="ones", dtype="float32", trainable=False, autocast=False,
            name=f"{prefix}_scale")
        self.amax_history: Variable = layer.add_weight(
            shape=(recipe.amax_history_len,), initializer="zeros", dtype="float32",
            trainable=False, autocast=False, name=f"{prefix}_amax_history")

    def step_scale(self, x: Tensor) -> Tensor:
        """The scale this step quantises ``x`` with: from ``x``'s amax (current scaling) or
        from the amax history (delayed scaling: its max or its most recent entry)."""
        r = self.recipe
        if r.delayed:
            history = self.amax_history
            amax = (ops.max(history) if r.amax_compute_algo == "max"   # type: ignore[union-attr]
                    else ops.reshape(ops.getitem(history, (slice(0, 1),)), ()))
        else:
            amax = ops.cast(ops.max(ops.abs(x)), "float32") if x.size else ops.zeros((),
                                                                                    "float32")
        return ops.fp8_scale(amax, self.scale, self.format, r.margin, r.power_of_two_scales)

    def quantize(self, x: Tensor, update: bool) -> Quantized:
        """``x`` quantised with this step's scale; with ``update``, the scale and the amax
        history (this step's amax rolled in) are assigned to the variables."""
        with autocast_scope(None):   # the amax of the float32 kernel itself, not its bf16 read
            scale = self.step_scale(x)
        codes, amax = ops.quantize_fp8(x, scale, self.format)
        if update:
            self.scale.assign(scale)
            self.amax_history.assign(rolled(self.amax_history, amax))
        return Quantized(codes, scale, self.format)


def rolled(history: Tensor, amax: Tensor) -> Tensor:
    """``history`` with ``amax`` rolled in, Transformer Engine's and Keras 3's ring:
    ``roll(history, -1)`` with ``[0] = amax`` (the oldest entry, at index 1, drops out)."""
    n = history.shape[0]
    parts = [ops.reshape(amax, (1,))]
    if n > 2:
        parts.append(ops.getitem(history, (slice(2, None),)))
    if n > 1:
        parts.append(ops.getitem(history, (slice(0, 1),)))
    return parts[0] if n == 1 else ops.concat(parts)


class Float8Dense:
    """A Dense layer's FP8 GEMM state: the three operands' scaling (inputs, kernel, output
    gradient), made as the layer's variables in ``build``."""

    def __init__(self, layer: Any, recipe: Recipe) -> None:
        fwd, bwd = recipe.forward_format, recipe.backward_format
        self.inputs = OperandScaling(layer, "inputs", recipe, fwd)
        self.kernel = OperandScaling(layer, "kernel", recipe, fwd)
        self.outputs_grad = OperandScaling(layer, "outputs_grad", recipe, bwd)
        self.recipe = recipe
        self.operands = (self.inputs, self.kernel, self.outputs_grad)
        for prefix in ("inputs", "kernel", "outputs_grad"):   # Keras 3's attribute names
            operand = getattr(self, prefix)
            setattr(layer, f"{prefix}_scale", operand.scale)
            setattr(layer, f"{prefix}_amax_history", operand.amax_history)
        # found from the kernel by the optimizer's step under mp.distribution, which sees the
        # trained variables only (weak: the registry keeps no layer alive)
        self._kernel = weakref.ref(layer.kernel)
        _BY_KERNEL[id(layer.kernel)] = weakref.ref(self)

    def dot(self, x: Tensor, kernel: Variable, training: bool | None) -> Tensor:
        """``x @ kernel`` (float32) through FP8 GEMMs, forward and backward. A training call
        (``training=True``, or None while a GradientTape records) keeps its scales and
        amaxes in the variables; inference reads them only (Keras 3's rule)."""
        update = bool(training) if training is not None else bool(_tape.state.tapes)
        x2 = ops.reshape(x, (-1, x.shape[-1])) if x.ndim > 2 else x
        qx = self.inputs.quantize(x2, update)
        qw = self.kernel.quantize(kernel, update)
        grad_state = self.outputs_grad

        def grad_quantizer(g: Tensor) -> Quantized:
            return grad_state.quantize(g, update)

        return ops.float8_dot(x, kernel, qx, qw, grad_quantizer)


_BY_KERNEL: dict[int, weakref.ref[Float8Dense]] = {}


def states_of(variables: Sequence[Variable]) -> list[Float8Dense]:
    """The FP8 state of the layers whose kernels are among ``variables``, in their order
    (the same on every rank of a data-parallel job, as the variables are)."""
    out = []
    for v in variables:
        ref = _BY_KERNEL.get(id(v))
        state = ref() if ref is not None else None
        if state is not None and state._kernel() is v:   # not a reused id of a dead kernel
            out.append(state)
    return out
