"""Data-parallel training over the ranks of an MPI (or NCCL) job, Keras 3's way::

    # launched as: mpiexec -n 2 python -m mpi4py train.py
    import mpcore as mp
    mp.distribution.set_distribution(mp.distribution.DataParallel())
    model = build_model(); model.compile(...)
    model.fit(x_train, y_train, batch_size=8192, epochs=5)   # batch_size is global

One concept per module: :mod:`~mpcore.distribution.api` (the distribution in force),
:mod:`~mpcore.distribution.collectives` (the engine plugin point),
:mod:`~mpcore.distribution.gradients` (bucketed averaging, the agreed finite flag),
:mod:`~mpcore.distribution.sharding` (batches per rank), :mod:`~mpcore.distribution.results`
(global metrics), :mod:`~mpcore.distribution.faults` (deadlines, disagreements) and
:mod:`~mpcore.distribution.launch` (the ``mpiexec`` command line). ``import mpcore`` imports
no engine: mpi4py is imported when a ``DataParallel`` is made.
"""

from __future__ import annotations

from mpcore.distribution.api import (
    DataParallel,
    distribution,
    rank,
    set_distribution,
    world_size,
)
from mpcore.distribution.collectives import Collectives
from mpcore.distribution.faults import DistributionError

__all__ = ["Collectives", "DataParallel", "DistributionError", "distribution", "rank",
           "set_distribution", "world_size"]
