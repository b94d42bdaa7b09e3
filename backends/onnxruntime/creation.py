"""float16 <-> float32 conversions through ONNX Runtime's ``Cast`` operator.

NumPy converts float16 in software, one element at a time; ONNX Runtime's CPU ``Cast`` runs
MLAS's vectorised converters (F16C / AVX-512 where the CPU has them) on its thread pool, many
times faster (benchmarks/ measures it), bit for bit what ``astype`` gives. Nothing here knows
about mpcore tensors: :class:`FastCast` converts NumPy arrays.

The model is one ``Cast`` node with a 1-D input of symbolic length, written out as ONNX
protobuf bytes by the few lines of encoder below (the ``onnx`` package is not needed for a
single node). Sessions are made on first use, one per direction; outputs are written into
arrays the caller allocates (the CPU backend's recycled buffers) through IO binding.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from mpcore_xp import F16, F32

from mpcore.core.backend import bind_call

#: ONNX TensorProto.DataType codes of the dtypes converted here.
ONNX_TYPES = {F32: 1, F16: 10}
#: Smaller conversions stay on NumPy: the fixed cost of a session run is what NumPy's
#: element-by-element loop takes for a few thousand elements.
MIN_ELEMENTS = 1 << 14
#: The ONNX opset and IR version of the model (Cast-19 exists since ONNX Runtime 1.15).
OPSET, IR_VERSION = 19, 9


# --- a minimal protobuf encoder: just what ModelProto needs here -----------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _text(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def cast_model(src: np.dtype, dst: np.dtype) -> bytes:
    """The serialized ONNX model ``y = Cast(x, to=dst)`` for 1-D ``x`` of dtype ``src``
    (field numbers from onnx.proto: ModelProto, GraphProto, NodeProto, AttributeProto,
    ValueInfoProto, TypeProto.Tensor, TensorShapeProto)."""

    def value_info(name: str, dtype: np.dtype) -> bytes:
        shape = _bytes(2, _bytes(1, _text(2, "n")))              # one dim, dim_param "n"
        tensor = _int(1, ONNX_TYPES[dtype]) + shape             # elem_type, shape
        return _text(1, name) + _bytes(2, _bytes(1, tensor))     # name, type.tensor_type

    attribute = _text(1, "to") + _int(3, ONNX_TYPES[dst]) + _int(20, 2)  # name, i, type=INT
    node = _text(1, "x") + _text(2, "y") + _text(4, "Cast") + _bytes(5, attribute)
    graph = (_bytes(1, node) + _text(2, "mpcore_cast") + _bytes(11, value_info("x", src))
             + _bytes(12, value_info("y", dst)))
    opset = _text(1, "") + _int(2, OPSET)
    return _int(1, IR_VERSION) + _bytes(8, opset) + _bytes(7, graph)


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class FastCast:
    """Converts contiguous float32 <-> float16 arrays of at least :data:`MIN_ELEMENTS`
    through ONNX Runtime; everything else through ``fallback``. ``alloc(shape, dtype)`` gives
    the (C-contiguous, uninitialised) result arrays."""

    def __init__(self, fallback: Callable[[np.ndarray, Any], np.ndarray],
                 alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None = None,
                 threads: int | None = None) -> None:
        self.fallback = fallback
        self.alloc = alloc or np.empty
        self.threads = threads or _threads()
        self._sessions: dict[tuple[np.dtype, np.dtype], Any] = {}
        self._lock = threading.Lock()
        self.calls = 0  # conversions ONNX Runtime made (for tests and diagnostics)

    def session(self, src: np.dtype, dst: np.dtype) -> Any:
        """The inference session converting ``src`` to ``dst`` (made once)."""
        key = (src, dst)
        sess = self._sessions.get(key)
        if sess is None:
            with self._lock:
                sess = self._sessions.get(key)
                if sess is None:
                    import onnxruntime as ort

                    options = ort.SessionOptions()
                    options.intra_op_num_threads = self.threads
                    # Idle pool threads must not spin: the next kernel is usually a GEMM
                    # whose own threads need every core.
                    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                    options.log_severity_level = 3
                    sess = ort.InferenceSession(cast_model(src, dst), options,
                                                providers=["CPUExecutionProvider"])
                    self._sessions[key] = sess
        return sess

    def _pair(self, x: np.ndarray, dtype: np.dtype) -> bool:
        """Whether this converts ``x``'s dtype and size to ``dtype`` (its layout aside)."""
        src = x.dtype
        return (src != dtype and src in ONNX_TYPES and dtype in ONNX_TYPES
                and x.size >= MIN_ELEMENTS)

    def bind(self, x: np.ndarray, dtype: Any) -> Callable[[np.ndarray, Any], np.ndarray]:
        """For a traced step (``mpcore.core.backend.bind_call``): where this never takes arrays
        of ``x``'s dtype and size (fixed by the trace), the fallback's converter, bound in
        turn; else this one, which decides on each call's layout."""
        if self._pair(x, np.dtype(dtype)):
            return self
        return bind_call(self.fallback, x, dtype) or self.fallback

    def __call__(self, x: np.ndarray, dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        if not (self._pair(x, dtype) and x.flags.c_contiguous):
            return self.fallback(x, dtype)
        src = x.dtype
        sess = self.session(src, dtype)
        out = self.alloc(x.shape, dtype)
        binding = sess.io_binding()
        binding.bind_cpu_input("x", x.reshape(-1))
        binding.bind_output("y", "cpu", 0, dtype, (x.size,), out.ctypes.data)
        sess.run_with_iobinding(binding)
        self.calls += 1
        return out
