"""oneDNN kernel provider for the CPU backend: a real bfloat16 GEMM (``pip install -e
".[onednn]"`` in the checkout).

NumPy has no bfloat16 GEMM, so the CPU backend computes bfloat16 matmuls in float32. This plugin
implements the ``mpcore_kernels`` hook for the ``cpu`` backend and replaces its ``matmul`` and
``dense`` kernels for bfloat16 operands with oneDNN's matmul primitive (bfloat16 in, float32
accumulation, bfloat16 out; ``dense`` fuses the bias, and applies relu after the primitive so
that a NaN stays a NaN, as in the CPU kernel: see ``nn.py``), reading transposed operands in
place through strided memory descriptors. float32 operands go to oneDNN as well
(``MPCORE_ONEDNN_FLOAT32=off`` keeps them on NumPy): its f32 brgemm is faster than OpenBLAS on
the train step's larger shapes here, and the fused bias saves a pass per layer; GEMMs of at
most ``linalg.SMALL_GEMM`` multiply-adds stay on NumPy, faster there. With float32 on, the
fused optimizer updates (SGD, RMSprop, Adam) of large float32 weights and a dense layer's relu
backward with its bias gradient also run on oneDNN (binary primitives on its OpenMP team, both
cores, the CPU kernels' results bit for bit; see ``optim.py`` and ``nn.py``). Whenever the
plugin is in use, float32 <-> bfloat16 conversions of the CPU backend run as oneDNN reorders
too, in each direction where a probe finds them bit for bit ``astype`` (``creation.py``: not
float32 -> bfloat16 on CPUs with avx512_bf16, whose conversion flushes subnormals), wrapped
around whatever ``convert`` kernel is installed. oneDNN 3.2 has no float16 matmul without
avx512_fp16 (nor a fast float16 reorder), so float16 (and bfloat16 on a CPU without
avx512_bf16) is multiplied by the float32 GEMM on the CPU backend's float32 copies, rounded
once, exactly as the CPU backend's own kernels do with NumPy.

The plugin also provides the optional ``conv2d``, ``conv2d_backprop_input`` and
``conv2d_backprop_filter`` kernels (``convolution.py``): oneDNN's convolution primitives for
the dtypes its GEMMs take (float32 under ``MPCORE_ONEDNN_FLOAT32``, bfloat16 where it is
enabled), the core's im2col composite for the others (float16) and for any problem oneDNN
fails on (logged, never fatal). With float32 work on oneDNN it also runs ``batch_norm``,
``layer_norm`` and their gradients (``normalization.py``, float32) and ``gelu``/``gelu_grad``
(``eltwise.py``: float32 and the GEMMs' bfloat16), the NumPy kernels elsewhere.

``MPCORE_ONEDNN`` chooses when:

- ``auto`` (default): bfloat16 only when the CPU has ``avx512_bf16`` or ``amx_bf16`` and the
  library loads (elsewhere oneDNN would emulate bfloat16 and be slower than NumPy's float32
  GEMM); float32 whenever the library loads.
- ``force``: whenever the library loads, whatever the CPU (to test correctness anywhere; where
  this oneDNN has no bfloat16 matmul at all, below AVX-512, bfloat16 takes the float32 route).
- ``off``: never.

A library that cannot be found or loaded leaves the CPU backend exactly as it was; why is kept in
:func:`status`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpcore_xp import DTYPES

import mpcore
from mpcore.core.backend import Backend, KernelSet
from mpcore.plugins.settings import env_choice

from .conv import ConvCache
from .convolution import ConvKernels
from .creation import ReorderCache, ReorderCast
from .dnnl import DnnlError, Library, find_library
from .elementwise import BinaryCache
from .eltwise import EltwiseCache, GeluKernels
from .linalg import make_dense, make_matmul, upcasting
from .matmul import MatmulCache
from .nn import make_relu_grad_bias
from .norm import NormCache
from .normalization import NAMES as NORM_NAMES
from .normalization import NormKernels
from .optim import MAKERS as UPDATE_MAKERS

__all__ = ["BF16_FLAGS", "MODES", "DnnlError", "Library", "MatmulCache", "float32_wanted",
           "library", "make_dense", "make_matmul", "mode", "status"]

MODES = ("auto", "force", "off")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")

_library: Library | None = None
_load_error: str | None = None
_status = "not asked yet"


def mode() -> str:
    """The ``MPCORE_ONEDNN`` setting; an unknown value is an error naming the valid ones."""
    return env_choice("MPCORE_ONEDNN", MODES)


def status() -> str:
    """What the last ``mpcore_kernels`` call decided, and why."""
    return _status


def library() -> Library:
    """The loaded library (loaded once per process; a failure is remembered, not retried)."""
    global _library, _load_error
    if _library is None:
        if _load_error is not None:
            raise DnnlError(_load_error)
        try:
            _library = find_library()
        except DnnlError as exc:
            _load_error = str(exc)
            raise
    return _library


def _missing_gemm(lib: Library, dtype: str) -> str | None:
    """None when this oneDNN has a matmul for ``dtype`` on this CPU, else why not (oneDNN
    3.2 has no bfloat16 matmul below AVX-512, even emulated: forced there, bfloat16 takes the
    float32 route)."""
    one = np.ones((1, 1), DTYPES[dtype])
    cache = MatmulCache(lib, max_entries=1)
    try:
        cache.matmul(one, one, dtype)
    except DnnlError as exc:
        reason = str(exc).rsplit(": ", 1)[-1]   # e.g. dnnl_unimplemented
        return f"this oneDNN has no {dtype} matmul at ISA {lib.isa} ({reason})"
    finally:
        cache.clear()
    return None


def float32_wanted() -> bool:
    """``MPCORE_ONEDNN_FLOAT32`` (``on``/``off``, default on): whether float32 work (matmuls and
    the fused optimizer updates) goes to oneDNN too when the plugin is in use. Its brgemm
    kernels beat NumPy's OpenBLAS on the train-step shapes here (see
    benchmarks/train_step.py), and its binary primitives run the updates on both cores.
    GEMMs too small to gain from a launch stay on NumPy (:data:`.linalg.SMALL_GEMM`)."""
    return env_choice("MPCORE_ONEDNN_FLOAT32", ("on", "off")) == "on"


def _conv_kernels(backend: Backend, lib: Library, dtypes: frozenset[str], matmul: Any,
                  alloc: Any) -> ConvKernels | None:
    """The fused convolution kernels on oneDNN for ``dtypes`` (what the GEMMs use: the same
    ISA rules hold for its convolutions), built on the backend's im2col kernels for the rest;
    None for a backend without them."""
    patches = getattr(backend, "extract_patches", None)
    patches_grad = getattr(backend, "extract_patches_grad", None)
    if patches is None or patches_grad is None:
        return None
    return ConvKernels(ConvCache(lib), dtypes, patches, patches_grad, matmul, alloc,
                       getattr(backend, "cast", None))


def _norm_kernels(backend: Backend, lib: Library, dtypes: frozenset[str],
                  alloc: Any) -> NormKernels | None:
    """Batch and layer normalization on oneDNN for float32 and the bfloat16 the GEMMs take,
    float16 through float32 (the ops hand 16-bit inputs over as they are: see
    mpcore.ops.normalization), the backend's
    NumPy kernels for the rest; None for a backend without them or with float32 off."""
    fallback = {name: getattr(backend, name, None) for name in NORM_NAMES}
    if "float32" not in dtypes or any(k is None for k in fallback.values()):
        return None
    return NormKernels(NormCache(lib), frozenset({"float32"}) | (dtypes & {"bfloat16"}),
                       fallback, alloc, getattr(backend, "cast", None))


@mpcore.hookimpl
def mpcore_kernels(backend: Backend) -> KernelSet | None:
    global _status
    if backend.name != "cpu":
        return None
    chosen = mode()
    if chosen == "off":
        _status = "off (MPCORE_ONEDNN=off)"
        return None
    have = [f for f in BF16_FLAGS if f in backend.device().features]
    dtypes = set()
    if have or chosen == "force":
        dtypes.add("bfloat16")
    if float32_wanted():
        dtypes.add("float32")
    if not dtypes:
        # Not even loaded: emulated bfloat16 in oneDNN is slower than NumPy's float32 GEMM.
        _status = (f"not used: this CPU lacks {' and '.join(BF16_FLAGS)} and float32 is off "
                   "(MPCORE_ONEDNN=force uses it anyway)")
        return None
    try:
        lib = library()
    except DnnlError as exc:
        _status = f"not used: {exc}"
        return None
    missing = _missing_gemm(lib, "bfloat16") if "bfloat16" in dtypes else None
    if missing is not None:
        dtypes.discard("bfloat16")
        if not dtypes:
            _status = f"not used: {missing}, and float32 is off"
            return None
    cache = MatmulCache(lib)
    chosen_dtypes = frozenset(dtypes)
    via = upcasting(backend)
    # the CPU backend's recycled output buffers (see mpcore_cpu.pool)
    alloc = getattr(backend, "buffer", None)
    kernels = {"matmul": make_matmul(backend.matmul, cache, chosen_dtypes, via, alloc)}
    dense = getattr(backend, "dense", None)
    if dense is not None:
        kernels["dense"] = make_dense(dense, cache, chosen_dtypes, via, alloc)
    if "float32" in dtypes:
        passes = BinaryCache(lib)
        for name, make in UPDATE_MAKERS.items():
            update = getattr(backend, name, None)
            if update is not None:
                kernels[name] = make(update, passes, alloc)
        relu_grad_bias = getattr(backend, "relu_grad_bias", None)
        if relu_grad_bias is not None:
            kernels["relu_grad_bias"] = make_relu_grad_bias(relu_grad_bias, passes,
                                                            kernels["matmul"], alloc)
    conv = _conv_kernels(backend, lib, chosen_dtypes, kernels["matmul"], alloc)
    if conv is not None:
        kernels.update(conv.table())
    norm = _norm_kernels(backend, lib, chosen_dtypes, alloc)
    if norm is not None:
        kernels.update(norm.table())
        # GELU's eltwise primitives, under the same switch (float32 work on oneDNN), for
        # float32 and the bfloat16 the GEMMs take (float16 through float32)
        own = {name: getattr(backend, name, None) for name in ("gelu", "gelu_grad")}
        if all(own.values()):
            gelu = GeluKernels(EltwiseCache(lib), frozenset({"float32"}) | chosen_dtypes,
                               own, getattr(backend, "cast", None))  # type: ignore[arg-type]
            kernels.update(gelu.table())
    from mpcore_cpu.creation import convert

    # float32 <-> bfloat16 conversions as reorders, whatever the GEMM dtypes: built on the
    # convert kernel already installed (ONNX Runtime's float16 one, if any)
    reorders = ReorderCache(lib)
    wraps = {"convert": lambda previous: ReorderCast(previous or convert, reorders, alloc)}
    if "bfloat16" in dtypes:
        where = "/".join(have) if have else f"no {'/'.join(BF16_FLAGS)}: emulated, forced"
    else:
        why = missing or f"this CPU lacks {' and '.join(BF16_FLAGS)}"
        where = f"float32 only: {why}, so bfloat16 is multiplied by the float32 GEMM"
    _status = f"used: {lib.describe()} ({where}{'' if conv is None else '; convolutions too'})"
    fast = frozenset({"bfloat16"}) if "bfloat16" in dtypes else frozenset()
    return KernelSet(
        provider="mpcore_onednn",
        kernels=kernels,
        wraps=wraps,
        fast_dtypes=fast,
        reason=(f"{lib.describe()}, bfloat16 matmul with float32 accumulation" if fast else
                f"{lib.describe()}, float32 matmul, optimizer updates and relu backward"),
    )
