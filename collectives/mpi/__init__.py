"""mpcore_mpi: the ``mpi`` collectives engine (mpi4py), a plugin of the entry-point group
``mpcore``. Importing this module imports neither mpi4py nor NumPy: the engine is loaded when
a distribution asks for it."""

from __future__ import annotations

from typing import Any

from mpcore.plugins.hookspecs import hookimpl


def __getattr__(name: str) -> Any:
    if name == "MpiCollectives":
        from mpcore_mpi.engine import MpiCollectives

        return MpiCollectives
    raise AttributeError(f"module 'mpcore_mpi' has no attribute {name!r}")


@hookimpl
def mpcore_collectives() -> list[type]:
    from mpcore_mpi.engine import MpiCollectives

    return [MpiCollectives]
