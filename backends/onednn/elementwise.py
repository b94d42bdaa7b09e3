"""Elementwise float32 passes as oneDNN binary primitives with post-op chains.

NumPy runs elementwise work on one thread. Between the GEMMs of a training step, oneDNN's
OpenMP worker spins on the other core waiting for the next parallel region, so a Python thread
cannot use that core either (tried: no gain). A oneDNN primitive runs on that same OpenMP team,
so an update pass through oneDNN gets both cores.

Every operation offered here is one IEEE float32 instruction per element (add, sub, mul, div,
sqrt), each rounded once, in the order given, so a chain reproduces NumPy's float32 ufuncs bit for
bit; ``max`` and ``gt`` (1.0 or 0.0) round nothing (see nn.py for their NaN rules). (oneDNN's
``linear`` eltwise is an FMA, which would not: it is deliberately absent; a product by a
hyperparameter is a binary post-op with a one-element operand.)
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .dnnl import Entry, Library, PrimitiveCache, _check, _ExecArg, _vp

# dnnl_alg_kind_t values of oneDNN v3 (dnnl_types.h)
BINARY = {"add": 0x1FFF0, "mul": 0x1FFF1, "max": 0x1FFF2, "div": 0x1FFF4, "sub": 0x1FFF5,
          "gt": 0x1FFF7}
ELTWISE = {"sqrt": 0x25}
_ARG_SRC_0, _ARG_SRC_1, _ARG_DST = 1, 2, 17
_ARG_POST_OP_BASE = 32768  # DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE in oneDNN v3


def _post_op_src1(index: int) -> int:
    """DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1."""
    return _ARG_POST_OP_BASE * (index + 1) | _ARG_SRC_1


#: A post-op: (binary op, "full" | "scalar"): the running value <op> an operand of the full
#: length or of one element; or ("sqrt",) applied to the running value.
PostOp = tuple[str, ...]


class BinaryCache(PrimitiveCache):
    """``dst = post_ops(src0 <op> src1)`` over flat arrays, one primitive per problem
    (LRU-cached by length, operation, whether ``src1`` is a one-element scalar, post-ops and
    dtype). A binary post-op takes its own operand, in order, in ``post_operands``."""

    def __init__(self, library: Library, max_entries: int = 64) -> None:
        super().__init__(library, max_entries)

    def run(self, op: str, src0: np.ndarray, src1: np.ndarray, dst: np.ndarray,
            post_ops: Sequence[PostOp] = (), post_operands: Sequence[np.ndarray] = (),
            dtype: str = "float32") -> None:
        """Execute on C-contiguous arrays of one length and of ``dtype`` ("float32" or
        "bfloat16"; oneDNN computes in float32 and rounds the result once), and one-element
        float32 arrays for ``src1`` and "scalar" post-op operands, broadcast. ``dst`` may be
        ``src0``, ``src1`` or a post-op operand: each element is read before it is written."""
        n = src0.size
        key = (n, op, src1.size == 1 and n != 1, tuple(post_ops), dtype)
        entry = self._get(key, lambda: self._create(*key))
        self._execute(entry, (src0, src1, dst, *post_operands))

    def bind(self, op: str, n: int, scalar: bool, post_ops: Sequence[PostOp] = (),
             dtype: str = "float32") -> Callable[..., None]:
        """:meth:`run` for one problem on a primitive of its own (outside the LRU, freed with
        the function returned): ``run(src0, src1, dst, *post_operands)`` on C-contiguous arrays
        of ``n`` elements, of any shape (the caller checks), ``src1`` of one element where
        ``scalar``. The same array objects at every call (a hyperparameter's one-element
        array, a variable) keep their memory handles."""
        entry = self._create(n, op, scalar and n != 1, tuple(post_ops), dtype)
        execute = self._execute

        def run(src0: np.ndarray, src1: np.ndarray, dst: np.ndarray,
                *post_operands: np.ndarray) -> None:
            execute(entry, (src0, src1, dst, *post_operands))

        finalizer = weakref.finalize(run, self._destroy, entry)
        finalizer.atexit = False      # (the process's end frees the library with it)
        return run

    def _create(self, n: int, op: str, scalar: bool, post_ops: tuple[PostOp, ...],
                dtype: str) -> Entry:
        lib = self.library.lib
        descs: list[Any] = []
        mems: list[Any] = []
        pd, primitive, attr, ops = _vp(), _vp(), _vp(), _vp()

        def desc(length: int, kind: str = "float32") -> Any:
            descs.append(self._desc((length,), kind))
            return descs[-1]

        try:
            full = desc(n, dtype)
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
                    _check(lib.dnnl_post_ops_append_eltwise(ops, ELTWISE[post[0]], 0.0, 0.0),
                           "dnnl_post_ops_append_eltwise")
            _check(lib.dnnl_primitive_attr_set_post_ops(attr, ops),
                   "dnnl_primitive_attr_set_post_ops")
            _check(lib.dnnl_binary_primitive_desc_create(
                ctypes.byref(pd), self.library.engine, BINARY[op], full, second, full, attr),
                f"dnnl_binary_primitive_desc_create for {op} {post_ops}")
            _check(lib.dnnl_primitive_create(ctypes.byref(primitive), pd),
                   "dnnl_primitive_create")
            for _, md in slots:
                mems.append(self._memory(md))
        except Exception:
            self._destroy(Entry(primitive, pd, descs, mems, None, "", threading.Lock()))
            raise
        finally:
            # the primitive descriptor keeps its own copy of the attributes
            if ops:
                lib.dnnl_post_ops_destroy(ops)
            if attr:
                lib.dnnl_primitive_attr_destroy(attr)
        args = (_ExecArg * len(slots))(*(_ExecArg(arg, mem)
                                         for (arg, _), mem in zip(slots, mems)))
        return Entry(primitive, pd, descs, mems, args, "", threading.Lock())
