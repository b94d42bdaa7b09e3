"""Creation: tensors from values, filled tensors, random tensors, one-hot rows.

None of these is recorded on a tape: their results are constants (``stop_gradient`` makes one
of any tensor).
"""

from __future__ import annotations

import numbers
from typing import Any

from mpcore.core import arguments as _args
from mpcore.core import dtypes as _dt
from mpcore.core import random as _random
from mpcore.core.tensor import Tensor
from mpcore.core.trace_seeds import given_seed
from mpcore.core.trace_state import local
from mpcore.plugins import registry

TensorLike = Any  # a Tensor, a Python number or nested list, or a host/native array


def infer_dtype(value: Any) -> str:
    """The dtype a tensor made from ``value`` gets: its own where it has one; else float32 for
    Python floats, int32 for ints and bool for bools (as in TF)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return _dt.canonical(dtype)
    kinds: set[type] = set()
    leaf_dtypes: set[str] = set()

    def scan(v: Any) -> None:
        if isinstance(v, (list, tuple)):
            for item in v:
                scan(item)
        else:
            kinds.add(type(v))
            # NumPy scalars (``list(array)``) carry a dtype; np.float32 is no Python float
            leaf = getattr(v, "dtype", None)
            leaf_dtypes.add("" if leaf is None else _dt.canonical(leaf))

    scan(value)
    if len(leaf_dtypes) == 1 and "" not in leaf_dtypes:
        return leaf_dtypes.pop()  # a list of like NumPy scalars keeps their dtype, as np.array
    if any(issubclass(k, numbers.Real) and not issubclass(k, numbers.Integral) for k in kinds):
        return "float32"
    if kinds and all(issubclass(k, bool) for k in kinds):
        return "bool"
    if all(issubclass(k, numbers.Integral) for k in kinds):
        return "int32"
    raise TypeError(f"cannot make a tensor from {type(value).__name__} {value!r}; expected "
                    "numbers, nested lists of numbers, arrays or tensors")


def resolve_backend(backend: Any) -> Any:
    """A backend from None (the current one), a name, or a backend."""
    if backend is None:
        return registry.get_backend()
    if isinstance(backend, str):
        return registry.get_backend(backend)
    return backend


def constant(value: TensorLike, dtype: Any = None, backend: Any = None) -> Tensor:
    """A tensor holding ``value`` on ``backend`` (default: the current backend). Python floats
    become float32 and ints int32 (as in TF); arrays keep their dtype unless ``dtype`` is
    given."""
    if isinstance(value, Tensor):
        be = value._backend if backend is None else resolve_backend(backend)
        dt = value._dtype if dtype is None else _dt.canonical(dtype)
        if be is value._backend:
            if dt == value._dtype:
                if type(value) is Tensor:  # immutable: nothing to copy
                    return value
                # a Variable (or a recorded read of one) is updated in place: snapshot it, as
                # tf.constant(variable) does, or the "constant" would change with training
                return Tensor(be.kernels()["copy"](value._data), be, dt)
            return Tensor(be.kernels()["cast"](value._data, dt), be, dt)
        return Tensor(be.kernels()["asarray"](value.numpy(), dt), be, dt)
    be = resolve_backend(backend)
    dt = infer_dtype(value) if dtype is None else _dt.canonical(dtype)
    return Tensor(be.kernels()["asarray"](value, dt), be, dt)


convert_to_tensor = constant


def shape_tuple(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    try:
        return tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"a shape is an int or a sequence of ints, got {shape!r}") from None


def full(shape: Any, value: float, dtype: Any = "float32", backend: Any = None) -> Tensor:
    be = resolve_backend(backend)
    dt = _dt.canonical(dtype)
    return Tensor(be.kernels()["full"](shape_tuple(shape), value, dt), be, dt)


def zeros(shape: Any, dtype: Any = "float32", backend: Any = None) -> Tensor:
    return full(shape, 0, dtype, backend)


def ones(shape: Any, dtype: Any = "float32", backend: Any = None) -> Tensor:
    return full(shape, 1, dtype, backend)


def zeros_like(x: Tensor, dtype: Any = None) -> Tensor:
    return full(x.shape, 0, dtype or x.dtype, x.backend)


def ones_like(x: Tensor, dtype: Any = None) -> Tensor:
    return full(x.shape, 1, dtype or x.dtype, x.backend)


def stop_gradient(x: TensorLike) -> Tensor:
    """The same value, invisible to GradientTape."""
    x = x if isinstance(x, Tensor) else constant(x)
    return Tensor(x._data, x._backend, x._dtype)


def index_tensor(indices: Any, be: Any, op: str) -> Tensor:
    """``indices`` as an integer tensor on ``be``; anything else is a TypeError naming ``op``."""
    idx = indices if isinstance(indices, Tensor) else constant(indices, backend=be)
    if not _dt.is_integer(idx._dtype):
        raise TypeError(f"{op}: indices must be integers, got {idx._dtype}")
    return idx


def one_hot(indices: Any, depth: int, dtype: Any = "float32") -> Tensor:
    be = indices._backend if isinstance(indices, Tensor) else registry.get_backend()
    idx = index_tensor(indices, be, "one_hot")
    dt = _dt.canonical(dtype)
    return Tensor(be.kernels()["one_hot"](idx._data, int(depth), dt), be, dt)


def random_uniform(shape: Any, minval: float = 0.0, maxval: float = 1.0, dtype: Any = "float32",
                   seed: int | None = None, backend: Any = None) -> Tensor:
    """Uniform values in [minval, maxval). ``seed=None`` draws the next seed from
    ``mp.random`` (so ``mp.random.set_seed`` makes runs repeatable)."""
    be = resolve_backend(backend)
    dt = _dt.canonical(dtype)
    s = _random.next_seed() if seed is None else given_seed(seed)
    return Tensor(be.kernels()["random_uniform"](shape_tuple(shape), dt, s, float(minval),
                                                 float(maxval)), be, dt)


def random_normal(shape: Any, mean: float = 0.0, stddev: float = 1.0, dtype: Any = "float32",
                  seed: int | None = None, backend: Any = None) -> Tensor:
    be = resolve_backend(backend)
    dt = _dt.canonical(dtype)
    s = _random.next_seed() if seed is None else given_seed(seed)
    return Tensor(be.kernels()["random_normal"](shape_tuple(shape), dt, s, float(mean),
                                                float(stddev)), be, dt)


def random_permutation(n: int, seed: int | None = None, backend: Any = None) -> Tensor:
    """A random order of ``range(n)`` as int64 (``fit``'s shuffle). ``seed=None`` draws the next
    seed of ``mp.random``. Drawn by the backend's optional ``random_permutation`` kernel where it
    has one (the built-in backends all draw NumPy's PCG64 permutation on the host, so the order is
    the same on every backend, and much faster than a shuffle in Python), else by Python's
    ``random.Random(seed).shuffle``."""
    n = _args.integer("n of random_permutation", n, 0)
    be = resolve_backend(backend)
    s = (_random.next_seed() if seed is None else
         given_seed(seed, lambda v: _args.integer("seed of random_permutation", v, 0)))
    kernel = be.kernels().get("random_permutation")
    if kernel is not None:
        return Tensor(kernel(n, s), be, "int64")
    import random as _pyrandom

    recorder = local.recorder
    if recorder is not None and not recorder.whole_depth:
        # the order is computed here, in Python: a replay would reuse the trace's, which is
        # every order there is for n <= 1 (the seed's draw is replayed all the same)
        if n <= 1:
            recorder.drawn_spec(s)
        elif recorder.drew(s):
            recorder.refuse_seed(
                f"backend {be.name!r} has no random_permutation kernel: a traced step cannot "
                "draw a random permutation on it (a replay would reuse the first call's). "
                "Draw it outside the step, or call the function without mp.function.")
        else:
            recorder.seed_spec(s)           # a plain int equal to a drawn seed: refused
    order = list(range(n))
    _pyrandom.Random(s).shuffle(order)
    return Tensor(be.kernels()["asarray"](order, "int64"), be, "int64")
