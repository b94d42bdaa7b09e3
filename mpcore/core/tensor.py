"""Tensors and Variables: a backend's native array with its backend and dtype name.

A Tensor is immutable. A Variable is a Tensor whose value can be replaced (``assign``) or updated
in place by a backend's optimizer kernel; it is float32 by default and keeps a per-step cache of
its casts, so a float32 weight read in float16 is cast once per step however often it is read.
What a Variable hands out (``numpy()``, ``value()``) is a copy, as Keras/TF's: a saved value
never changes with training.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mpcore.core import dtypes as _dtypes

if TYPE_CHECKING:
    from mpcore.core.backend import Backend


#: Set by :mod:`mpcore.function` while it traces a step: called before every host read of a
#: tensor (a traced step must not depend on one), and when a Variable is created or assigned.
host_read_guard: Callable[[Tensor], None] | None = None
#: (the variable, "create" or "assign", the array an assignment replaced or None)
variable_hook: Callable[[Variable, str, Any], None] | None = None


class Tensor:
    """A value on a backend. Arithmetic operators dispatch to :mod:`mpcore.ops` and are recorded
    by an active GradientTape. ``numpy.asarray(t)`` and ``t.numpy()`` copy it to the host."""

    __slots__ = ("__weakref__", "_backend", "_data", "_dtype")

    # NumPy defers to our reflected operators (array + tensor -> Tensor.__radd__).
    __array_ufunc__ = None

    def __init__(self, data: Any, backend: Backend, dtype: str) -> None:
        self._data = data
        self._backend = backend
        self._dtype = dtype

    # --- description --------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return _dtypes.named(self._dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def ndim(self) -> int:
        return len(self._data.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self._data.shape:
            n *= d
        return n

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def data(self) -> Any:
        """The backend's native array (read-only by convention). Ops hand it to kernels
        inside traced steps too, so a host read of it there is not refused: a replay would
        reuse the trace's value (use ``numpy()``, which is refused)."""
        return self._data

    def numpy(self) -> Any:
        if host_read_guard is not None:
            host_read_guard(self)
        return self._backend.to_host(self._data)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        host = self.numpy()
        return host if dtype is None else host.astype(dtype)

    def item(self) -> Any:
        return self.numpy().item()

    def __bool__(self) -> bool:
        return bool(self.numpy())

    def __float__(self) -> float:
        return float(self.numpy())

    def __int__(self) -> int:
        return int(self.numpy())

    def __index__(self) -> int:
        if not _dtypes.is_integer(self._dtype):
            raise TypeError(f"only integer tensors can be used as an index, not {self._dtype}")
        return int(self.numpy())

    def __len__(self) -> int:
        if not self._data.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return (f"<mp.{type(self).__name__} shape={self.shape} dtype={self._dtype} "
                f"backend={self._backend.name} value={self.numpy()!r}>")

    # Elementwise equality (as TF's tensors): hash by identity so tensors can key dicts.
    __hash__ = object.__hash__

    # --- conversion ---------------------------------------------------------------------
    def astype(self, dtype: Any) -> Tensor:
        return _ops.cast(self, dtype)

    def reshape(self, *shape: Any) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _ops.reshape(self, shape)

    @property
    def T(self) -> Tensor:  # noqa: N802 - NumPy's name
        return _ops.transpose(self)

    # --- operators ----------------------------------------------------------------------
    def __add__(self, other: Any) -> Tensor:
        return _ops.add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return _ops.add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return _ops.subtract(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return _ops.subtract(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return _ops.multiply(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return _ops.multiply(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return _ops.divide(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _ops.divide(other, self)

    def __pow__(self, other: Any) -> Tensor:
        return _ops.power(self, other)

    def __rpow__(self, other: Any) -> Tensor:
        return _ops.power(other, self)

    def __matmul__(self, other: Any) -> Tensor:
        return _ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return _ops.matmul(other, self)

    def __neg__(self) -> Tensor:
        return _ops.negative(self)

    def __pos__(self) -> Tensor:
        return self

    def __abs__(self) -> Tensor:
        return _ops.abs(self)

    def __eq__(self, other: Any) -> Tensor:  # type: ignore[override]
        return _ops.equal(self, other)

    def __ne__(self, other: Any) -> Tensor:  # type: ignore[override]
        return _ops.not_equal(self, other)

    def __lt__(self, other: Any) -> Tensor:
        return _ops.less(self, other)

    def __le__(self, other: Any) -> Tensor:
        return _ops.less_equal(self, other)

    def __gt__(self, other: Any) -> Tensor:
        return _ops.greater(self, other)

    def __ge__(self, other: Any) -> Tensor:
        return _ops.greater_equal(self, other)

    def __and__(self, other: Any) -> Tensor:
        return _ops.logical_and(self, other)

    def __or__(self, other: Any) -> Tensor:
        return _ops.logical_or(self, other)

    def __invert__(self) -> Tensor:
        return _ops.logical_not(self)

    def __getitem__(self, key: Any) -> Tensor:
        return _ops.getitem(self, key)


_live_variables: weakref.WeakSet[Variable] = weakref.WeakSet()


def live_variables() -> list[Variable]:
    """Every Variable that is still referenced somewhere (a traced step reads them by name)."""
    return list(_live_variables)


class Variable(Tensor):
    """A mutable float32 (by default) value that optimizers update."""

    __slots__ = ("_cast_cache", "_version", "autocast", "name", "trainable")

    _counter = 0

    def __init__(self, initial_value: Any, dtype: Any = None, trainable: bool = True,
                 name: str | None = None, backend: Backend | str | None = None,
                 autocast: bool = True) -> None:
        if callable(initial_value) and not isinstance(initial_value, Tensor):
            initial_value = initial_value()
        if dtype is None:
            dtype = _default_variable_dtype(initial_value)
        value = _ops.constant(initial_value, dtype=dtype, backend=backend)
        be = value._backend
        # Own the array: optimizer kernels update it in place.
        super().__init__(be.kernels()["copy"](value._data), be, value._dtype)
        if name is None:
            Variable._counter += 1
            name = f"Variable_{Variable._counter}"
        self.name = name
        self.trainable = bool(trainable)
        # read in the compute dtype by ops inside a mixed layer's call (Keras 3's autocast);
        # False for state kept in float32 whatever the policy (BatchNorm's moving statistics)
        self.autocast = bool(autocast)
        self._version = 0
        self._cast_cache: tuple[Any, Tensor] | None = None
        _live_variables.add(self)
        if variable_hook is not None:
            variable_hook(self, "create", None)

    def assign(self, value: Any) -> Variable:
        """Replace the value (same shape; cast to this variable's dtype)."""
        new = _ops.constant(value, dtype=self._dtype, backend=self._backend)
        if new.shape != self.shape:
            raise ValueError(f"cannot assign a value of shape {new.shape} to variable "
                             f"{self.name!r} of shape {self.shape}")
        data = new._data
        if new is value or data is getattr(value, "_data", None) or not isinstance(value, Tensor):
            # Never alias another tensor's array, nor a caller's host array (which may be
            # read-only, and which in-place optimizer kernels would otherwise write into).
            data = self._backend.kernels()["copy"](data)
        old, self._data = self._data, data
        self.mark_updated()
        if variable_hook is not None:
            variable_hook(self, "assign", old)
        return self

    def adopt(self, data: Any) -> None:
        """Take ``data`` as the value, without a copy: for a traced step's replay, whose
        program made ``data`` with the ``copy`` kernel for this variable alone (as ``assign``
        would copy it; mpcore.tracing.program.ProgramWriter.adopt_copies)."""
        old, self._data = self._data, data
        self.mark_updated()
        if variable_hook is not None:
            variable_hook(self, "assign", old)

    def assign_add(self, delta: Any) -> Variable:
        return self.assign(_ops.add(self.current_value(), delta))

    def assign_sub(self, delta: Any) -> Variable:
        return self.assign(_ops.subtract(self.current_value(), delta))

    def numpy(self) -> Any:
        """A writable host copy that the caller owns: later updates never show through."""
        if host_read_guard is not None:
            host_read_guard(self)
        be = self._backend
        # Of a device copy, which nothing else can reach: the backend's read-only host view of
        # it (the CPU's) may be made writable, and it keeps the backend's copy alignment.
        host = be.to_host(be.kernels()["copy"](self._data))
        try:
            host.flags.writeable = True
        except ValueError:  # a backend's host array that cannot be made writable
            host = host.copy()
        return host

    def value(self) -> Tensor:
        """A snapshot (a device copy): later assignments and in-place updates do not change
        it."""
        return Tensor(self._backend.kernels()["copy"](self._data), self._backend, self._dtype)

    read_value = value

    def current_value(self) -> Tensor:
        """The value without a copy, for a read that is done before the next update (the
        optimizers' composite path, ``assign_add``): an in-place update would change it."""
        return Tensor(self._data, self._backend, self._dtype)

    def mark_updated(self) -> None:
        """Call after updating ``data`` in place (optimizer kernels do): drops cached casts."""
        self._version += 1
        self._cast_cache = None

    def read_as(self, dtype: str) -> Tensor:
        """This variable in ``dtype``, cast once per value and tape (the layers' weight read)."""
        if dtype == self._dtype:
            return self
        key = (dtype, self._version, _tape.generation())
        cached = self._cast_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        cast = _ops.cast(self, dtype)
        self._cast_cache = (key, cast)
        return cast

    def __repr__(self) -> str:
        return (f"<mp.Variable {self.name!r} shape={self.shape} dtype={self._dtype} "
                f"backend={self._backend.name} value={self.numpy()!r}>")

    def __getstate__(self) -> dict[str, Any]:
        return {"value": self.numpy(), "dtype": self._dtype, "name": self.name,
                "trainable": self.trainable, "backend": self._backend.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        Variable.__init__(self, state["value"], dtype=state["dtype"], name=state["name"],
                          trainable=state["trainable"], backend=state["backend"])


def _default_variable_dtype(value: Any) -> str | None:
    """Python numbers make float32 variables (Keras' floatx); typed values keep their dtype."""
    if isinstance(value, Tensor) or hasattr(value, "dtype"):
        return None
    return "float32"


from mpcore import ops as _ops  # noqa: E402 - ops needs Tensor defined first
from mpcore.core import tape as _tape  # noqa: E402
