"""Elementwise float32 passes as oneDNN binary primitives with post-op chains.

NumPy runs elementwise work on one thread. Between the GEMMs of a training step, oneDNN's
OpenMP worker spins on the other core waiting for the next parallel region, so a Python thread
cannot use that core either (tried: no gain). A oneDNN primitive runs on that same OpenMP team,
so an update pass through oneDNN gets both cores.

Every operation used here is one IEEE float32 instruction per element (add, mul, div, sqrt),
each rounded once, in the order given, so a chain reproduces NumPy's float32 ufuncs bit for bit.
``linear`` (``alpha * x + beta``) is an FMA in oneDNN; with ``beta = 0`` it equals NumPy's
``x * alpha`` except that a product of -0 comes out +0, so it is only used where ``x`` is known
to be non-negative.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dnnl import DATA_TYPES, Library, _check, _Dims, _ExecArg, _vp, release

# dnnl_alg_kind_t values of oneDNN v3 (dnnl_types.h)
BINARY = {"add": 0x1FFF0, "mul": 0x1FFF1, "div": 0x1FFF4, "sub": 0x1FFF5}
ELTWISE = {"sqrt": 0x25, "linear": 0x26}
_ARG_SRC_0, _ARG_SRC_1, _ARG_DST = 1, 2, 17
_ARG_POST_OP_BASE = 32768  # DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE in oneDNN v3


def _post_op_src1(index: int) -> int:
    """DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1."""
    return _ARG_POST_OP_BASE * (index + 1) | _ARG_SRC_1


#: A post-op: (binary op, "full" | "scalar"): the running value <op> an operand of the full
#: length or of one element; or ("sqrt" | "linear", alpha, beta) applied to the running value.
PostOp = tuple[Any, ...]


@dataclass
class _Chain:
    primitive: Any
    pd: Any
    descs: list[Any]
    mems: list[Any]
    args: Any
    lock: threading.Lock


class BinaryCache:
    """``dst = post_ops(src0 <op> src1)`` over flat float32 arrays, one primitive per problem
    (LRU-cached by length, operation, whether ``src1`` is a one-element scalar, and post-ops).
    A binary post-op takes its own operand, in order, in ``post_operands``."""

    def __init__(self, library: Library, max_entries: int = 64) -> None:
        self.library = library
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[Any, ...], _Chain] = OrderedDict()
        self._lock = threading.Lock()
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def run(self, op: str, src0: np.ndarray, src1: np.ndarray, dst: np.ndarray,
            post_ops: Sequence[PostOp] = (), post_operands: Sequence[np.ndarray] = ()) -> None:
        """Execute on C-contiguous float32 arrays of one length (``src1`` and "scalar" post-op
        operands have one element, broadcast). ``dst`` may be ``src0``, ``src1`` or a post-op
        operand: each element is read before it is written."""
        n = src0.size
        key = (n, op, src1.size == 1 and n != 1, tuple(post_ops))
        chain = self._get(key)
        lib = self.library.lib
        arrays = (src0, src1, dst, *post_operands)
        with chain.lock:
            for mem, arr in zip(chain.mems, arrays):
                _check(lib.dnnl_memory_set_data_handle(mem, arr.ctypes.data),
                       "dnnl_memory_set_data_handle")
            _check(lib.dnnl_primitive_execute(chain.primitive, self.library.stream,
                                              len(chain.mems), chain.args),
                   "dnnl_primitive_execute")
            _check(lib.dnnl_stream_wait(self.library.stream), "dnnl_stream_wait")

    def _get(self, key: tuple[Any, ...]) -> _Chain:
        with self._lock:
            chain = self._entries.get(key)
            if chain is not None:
                self._entries.move_to_end(key)
                return chain
            self.misses += 1
            chain = self._entries[key] = self._create(*key)
            while len(self._entries) > self.max_entries:
                self._destroy(self._entries.popitem(last=False)[1])
            return chain

    def _create(self, n: int, op: str, scalar: bool, post_ops: tuple[PostOp, ...]) -> _Chain:
        lib = self.library.lib
        descs: list[Any] = []
        mems: list[Any] = []
        pd, primitive, attr, ops = _vp(), _vp(), _vp(), _vp()

        def desc(length: int) -> Any:
            md = _vp()
            _check(lib.dnnl_memory_desc_create_with_strides(
                ctypes.byref(md), 1, _Dims(length), DATA_TYPES["float32"], _Dims(1)),
                "dnnl_memory_desc_create_with_strides")
            descs.append(md)
            return md

        try:
            full = desc(n)
            second = desc(1) if scalar else full
            _check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)),
                   "dnnl_primitive_attr_create")
            _check(lib.dnnl_post_ops_create(ctypes.byref(ops)), "dnnl_post_ops_create")
            slots = [(_ARG_SRC_0, full), (_ARG_SRC_1, second), (_ARG_DST, full)]
            for index, post in enumerate(post_ops):
                if post[0] in BINARY:
                    operand = full if post[1] == "full" else desc(1)
                    _check(lib.dnnl_post_ops_append_binary(ops, BINARY[post[0]], operand),
                           "dnnl_post_ops_append_binary")
                    slots.append((_post_op_src1(index), operand))
                else:
                    _check(lib.dnnl_post_ops_append_eltwise(ops, ELTWISE[post[0]], post[1],
                                                            post[2]),
                           "dnnl_post_ops_append_eltwise")
            _check(lib.dnnl_primitive_attr_set_post_ops(attr, ops),
                   "dnnl_primitive_attr_set_post_ops")
            _check(lib.dnnl_binary_primitive_desc_create(
                ctypes.byref(pd), self.library.engine, BINARY[op], full, second, full, attr),
                f"dnnl_binary_primitive_desc_create for {op} {post_ops}")
            _check(lib.dnnl_primitive_create(ctypes.byref(primitive), pd),
                   "dnnl_primitive_create")
            for _, md in slots:
                mem = _vp()
                # DNNL_MEMORY_NONE: the handle is set before each execution
                _check(lib.dnnl_memory_create(ctypes.byref(mem), md, self.library.engine, None),
                       "dnnl_memory_create")
                mems.append(mem)
        except Exception:
            self._destroy(_Chain(primitive, pd, descs, mems, None, threading.Lock()))
            raise
        finally:
            # the primitive descriptor keeps its own copy of the attributes
            if ops:
                lib.dnnl_post_ops_destroy(ops)
            if attr:
                lib.dnnl_primitive_attr_destroy(attr)
        args = (_ExecArg * len(slots))(*(_ExecArg(arg, mem)
                                         for (arg, _), mem in zip(slots, mems)))
        return _Chain(primitive, pd, descs, mems, args, threading.Lock())

    def _destroy(self, chain: _Chain) -> None:
        release(self.library.lib, chain.primitive, chain.pd, chain.mems, chain.descs)
