"""mpcore_nccl: the ``nccl`` collectives engine (CuPy's NCCL, bootstrapped over MPI), a plugin
of the entry-point group ``mpcore``. Chosen before ``mpi`` for CUDA arrays where NCCL is
installed (``pip install nvidia-nccl-cu12``; ``cupy-cuda12x[ctk]`` does not pull it in)."""

from __future__ import annotations

from mpcore.plugins.hookspecs import hookimpl


@hookimpl
def mpcore_collectives() -> list[type]:
    from mpcore_nccl.engine import NcclCollectives

    return [NcclCollectives]
