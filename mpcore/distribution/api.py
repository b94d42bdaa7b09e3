"""The distribution in force: ``set_distribution(DataParallel())``, Keras 3's names.

Without one (the default) nothing changes: one process trains as before and nothing here
imports an engine. ``DataParallel()`` joins every rank of the job (the MPI world, or the
given communicator) through the engine chosen for the current backend, and
``set_distribution`` makes every rank start from rank 0's ``mp.random`` state, so models
built afterwards get the same initial weights and ``fit`` the same shuffles everywhere (they
draw :func:`mpcore.random.shared` seeds), while other random ops (dropout) draw from the
rank's own stream: the masks are independent over the global batch, as Keras 3's.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from mpcore.core import random as _random
from mpcore.distribution import collectives as _collectives
from mpcore.distribution import faults as _faults

_MASK32 = (1 << 32) - 1


class DataParallel:
    """Data parallelism: every rank holds the whole model and trains on its shard of each
    global batch; gradients are averaged with bucketed, flat all-reduces.

    ``communicator``: the engine's communicator (an ``mpi4py`` ``Comm``; None: every rank of
    the job). ``engine``: ``"mpi"``, ``"nccl"`` or another plugin's (None: the best available
    one for the current backend). ``bucket_bytes``: gradients are packed into flat buffers of
    about this size, one all-reduce each (a larger gradient travels alone, without a copy).

    Decided as Keras 3 and PyTorch DDP do: ``batch_size`` is global and at least the number of
    ranks; every rank passes the same data sizes (checked up front); 16-bit gradients are
    averaged in float32; dropout masks differ between ranks (initial weights and shuffles do
    not); ``fit`` and ``evaluate`` take rank 0's weights first, ``predict`` is local; rank 0
    alone prints and logs; ``save_weights``/``save_checkpoint`` are called on every rank.
    """

    def __init__(self, communicator: Any = None, engine: str | None = None,
                 bucket_bytes: int = 4 << 20) -> None:
        from mpcore.core import arguments as _args
        from mpcore.plugins.registry import get_backend

        self.bucket_bytes = _args.integer("bucket_bytes", bucket_bytes, 1)
        self.timeout = _faults.collective_timeout()
        self.backend = get_backend()
        cls = _collectives.choose(engine, self.backend)
        self.engine: _collectives.Collectives = cls(communicator, self.timeout)
        #: This rank's share of the current global batch, set by ``fit`` for its gradient
        #: weight (None: 1/world_size, the custom loop's equal shards).
        self.batch_fraction: float | None = None
        self._layouts: dict[tuple[int, ...], Any] = {}
        #: The variable sets whose FP8 state the ranks have checked to match.
        self._float8_checked: set[tuple[int, ...]] = set()

    @property
    def rank(self) -> int:
        return self.engine.rank

    @property
    def world_size(self) -> int:
        return self.engine.size

    def synchronize_random(self) -> None:
        """Every rank takes rank 0's ``mp.random`` state (seed and counter)."""
        state = _random.get_state()
        seed = state["seed"]
        values = self.engine.broadcast_values(
            [float(seed >> 32), float(seed & _MASK32), float(state["counter"])])
        _random.set_state({"seed": (int(values[0]) << 32) | int(values[1]),
                           "counter": int(values[2])})

    def broadcast_variables(self, variables: Any, what: str = "the model's variables") -> None:
        """Every rank takes rank 0's values of ``variables``, after checking that every rank
        has the same number of them, of the same shapes and dtypes."""
        variables = list(variables)
        _faults.check_same_tensors(self.engine, what, variables)
        for var in variables:
            var.assign(self.engine.broadcast(var.current_value()))

    def __repr__(self) -> str:
        return (f"DataParallel(engine={self.engine.name!r}, rank={self.rank}, "
                f"world_size={self.world_size})")


_current: DataParallel | None = None


class RankZeroFilter(logging.Filter):
    """Lets through the ``mpcore`` logger's records on rank 0 only (errors on every rank):
    the notices (the compatibility check, MNIST's offline split, a left-out batch) are the
    same on every rank, and N copies of each would bury the output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or rank() == 0


_RANK_ZERO = RankZeroFilter()


def show_warnings_on_rank_zero() -> None:
    """Python warnings are shown by rank 0 only, for the reason of :class:`RankZeroFilter`:
    every rank runs the same program and would print the same warning. The filters still
    apply on every rank before anything is shown, so a warning made an error (``-W error``,
    ``simplefilter("error")``) raises on the rank that hit it. Wraps ``warnings.showwarning``
    once (a ``catch_warnings`` block restores the one it found)."""
    previous = warnings.showwarning
    if getattr(previous, "mpcore_rank_zero", False):
        return

    def showwarning(message: Warning | str, category: type[Warning], filename: str,
                    lineno: int, file: Any = None, line: str | None = None) -> None:
        if rank() == 0:
            previous(message, category, filename, lineno, file, line)

    showwarning.mpcore_rank_zero = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning


def set_distribution(value: DataParallel | None) -> None:
    """Train under ``value`` from now on (None: one process again)."""
    global _current
    if value is not None and not isinstance(value, DataParallel):
        raise TypeError("set_distribution takes an mp.distribution.DataParallel or None, got "
                        f"{type(value).__name__}")
    if value is not None:
        value.synchronize_random()
    # each rank its own stream for dropout's masks (independent over the global batch, as
    # Keras 3 draws one mask for it); initial weights and fit's shuffle draw mp.random.shared
    _random.set_stream(0 if value is None else value.rank)
    logging.getLogger("mpcore").addFilter(_RANK_ZERO)  # once: a logger keeps a set of them
    show_warnings_on_rank_zero()
    _current = value


def distribution() -> DataParallel | None:
    """The distribution in force, or None."""
    return _current


def rank() -> int:
    """This process's rank (0 without a distribution)."""
    return 0 if _current is None else _current.rank


def world_size() -> int:
    """The number of ranks (1 without a distribution)."""
    return 1 if _current is None else _current.world_size
