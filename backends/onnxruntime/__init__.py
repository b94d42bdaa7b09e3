"""ONNX Runtime kernel provider for the CPU backend: fast float16 conversions
(``pip install -e ".[onnxruntime]"`` in the checkout).

On a CPU, mixed_float16 multiplies 16-bit values with float32 GEMMs (no CPU here has a float16
GEMM that beats that), so a training step is bound by float16 <-> float32 conversions, which
NumPy does in software. This plugin implements the ``mpcore_kernels`` hook for the ``cpu``
backend and gives it a ``convert`` kernel that runs them through ONNX Runtime's vectorised
``Cast`` (see :mod:`mpcore_onnxruntime.creation`): bit for bit the same values, many times faster,
and float16 ``add``/``subtract``/``multiply`` of large arrays computed in float32 between two
such conversions (:mod:`mpcore_onnxruntime.arithmetic`), the bits NumPy's float16 loops give.
The guide's MLP in mixed_float16 then trains at 0.80-0.86x of its float32 speed on the CPU,
instead of 0.55x (``benchmarks/compare.py``).

``MPCORE_ONNXRUNTIME=auto`` (default) uses it whenever ``onnxruntime`` is installed; ``off``
never. ``onnxruntime`` is imported only when the first large conversion runs, not at ``import
mpcore``.
"""

from __future__ import annotations

import importlib.util

import mpcore
from mpcore.core.backend import Backend, KernelSet
from mpcore.plugins.extras import install_command
from mpcore.plugins.settings import env_choice

from . import arithmetic
from .creation import MIN_ELEMENTS, FastCast, cast_model

__all__ = ["MIN_ELEMENTS", "MODES", "FastCast", "cast_model", "mode", "status"]

MODES = ("auto", "off")
_status = "not asked yet"


def mode() -> str:
    """The ``MPCORE_ONNXRUNTIME`` setting; an unknown value is an error naming the valid ones."""
    return env_choice("MPCORE_ONNXRUNTIME", MODES)


def status() -> str:
    """What the last ``mpcore_kernels`` call decided, and why."""
    return _status


@mpcore.hookimpl
def mpcore_kernels(backend: Backend) -> KernelSet | None:
    global _status
    if backend.name != "cpu":
        return None
    if mode() == "off":
        _status = "off (MPCORE_ONNXRUNTIME=off)"
        return None
    if importlib.util.find_spec("onnxruntime") is None:
        _status = f"not used: onnxruntime is not installed ({install_command('onnxruntime')})"
        return None
    from mpcore_cpu.creation import convert

    alloc = getattr(backend, "buffer", None)  # the CPU backend's recycled output buffers
    _status = "used: float16 <-> float32 conversions through ONNX Runtime's Cast"
    return KernelSet(
        provider="mpcore_onnxruntime",
        kernels={},
        # built on the convert kernel already installed (oneDNN's bfloat16 one, if any)
        wraps={"convert": lambda previous: FastCast(previous or convert, alloc),
               **arithmetic.wraps(lambda: backend.cast)},
        reason="ONNX Runtime's vectorised float16 <-> float32 conversions",
    )
