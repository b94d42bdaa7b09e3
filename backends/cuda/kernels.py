"""The CUDA source of the backend's RawModule kernels (``kernels.cu``) and its instantiations.

Everything here is importable without CuPy: the NVRTC compile test uses :data:`SOURCE` and
:func:`name_expressions` on machines without a GPU; :func:`module` builds the CuPy RawModule
(compiled once per process and cached on disk by CuPy) when the backend first runs a kernel.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

from mpcore_xp import DTYPES

#: NumPy dtype name -> the C type kernels.cu uses for it (16-bit types are raw bits).
CTYPES: dict[str, str] = {
    "float32": "float", "float64": "double", "float16": "mp_half", "bfloat16": "mp_bf16",
}
#: NumPy dtype -> its C type: the dtypes the templates are instantiated for.
CTYPE: dict[Any, str] = {DTYPES[name]: ctype for name, ctype in CTYPES.items()}
KERNEL_FLOATS = frozenset(CTYPE)
_FLOATS3 = ("float", "mp_half", "mp_bf16")
_FLOATS4 = (*_FLOATS3, "double")

#: Unary kernel opcodes (template argument OP of ``unary``).
UNARY_OPS: dict[str, int] = {"relu": 0, "sigmoid": 1, "erf": 2}

#: Non-template kernels (``extern "C"``), looked up by name.
PLAIN_KERNELS: tuple[str, ...] = ("sgd_update", "rmsprop_update", "adam_update",
                                   "adam_rates", "loss_scale_update", "transpose_u8")

#: NVRTC options, the same for the RawModule and the compile test (CuPy's default standard).
OPTIONS: tuple[str, ...] = ("--std=c++14",)

#: Tensors per launch of the multi-tensor ``unscale_check`` kernel.
MULTI_TENSOR = 8

#: Threads per block of every launch.
BLOCK = 256
_MAX_GRID = 1 << 20  # grid-stride kernels: more blocks than this only adds scheduling cost


def grid(n: int) -> tuple[int]:
    """The grid of a grid-stride kernel over ``n`` elements."""
    return (max(1, min((n + BLOCK - 1) // BLOCK, _MAX_GRID)),)

#: kernels.cu, then fp8.cu (the FP8 encoder, which uses kernels.cu's loads): one unit.
SOURCE: str = "\n".join(resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
                        for name in ("kernels.cu", "fp8.cu"))


def name_expressions() -> list[str]:
    """Every template instantiation the backend launches (all of them are compiled)."""
    names = [f"cast_kernel<{a}, {b}>" for a in _FLOATS3 for b in _FLOATS3 if a != b]
    names += [f"unary<{t}, {op}>" for t in _FLOATS4 for op in UNARY_OPS.values()]
    for kernel in ("bias_add", "relu_grad", "one_hot", "im2col", "col2im", "maxpool",
                   "maxpool_grad", "rand_uniform", "rand_normal", "dropout_mask",
                   "unscale_check"):
        names += [f"{kernel}<{t}>" for t in _FLOATS4]
    names += [f"quantize_fp8<{t}>" for t in _FLOATS3]
    for kernel in ("softmax_rows", "xent_fwd", "xent_bwd"):
        names += [f"{kernel}<{t}>" for t in ("float", "double")]
    return names


def template(kernel: str, *types: str) -> str:
    """The name expression of ``kernel`` instantiated for ``types`` (C type names or ints)."""
    return f"{kernel}<{', '.join(types)}>"


@lru_cache(maxsize=1)
def module() -> Any:
    """The compiled RawModule (needs CuPy and a device)."""
    import cupy

    return cupy.RawModule(code=SOURCE, options=OPTIONS, name_expressions=name_expressions())


_functions: dict[str, Any] = {}


def function(name: str) -> Any:
    """A kernel by name expression (templates) or plain name (``extern "C"`` kernels)."""
    fn = _functions.get(name)
    if fn is None:
        fn = _functions[name] = module().get_function(name)
    return fn
