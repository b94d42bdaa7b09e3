"""The command line that runs a Python program on ``ranks`` ranks: ``mpiexec -n N python -m
mpi4py ...``. ``-m mpi4py`` makes a rank that raises abort the whole job at once (a plain
``python script.py`` rank gets the same from the MPI engine's ``sys.excepthook``). The
``mpiexec`` next to this Python (a virtual environment's, from the ``mpich`` wheel) is
preferred to the one on ``PATH``."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from mpcore.plugins.extras import install_command


def mpiexec() -> str:
    """The ``mpiexec`` to use, or a clear error saying how to get one."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("no mpiexec found next to this Python or on PATH: "
                                f"{install_command('mpi-mpich')} (MPICH from PyPI), or load "
                                "the site's MPI")
    return found


def command(ranks: int, args: list[str], python: str | None = None) -> list[str]:
    """``mpiexec -n ranks python -m mpi4py *args`` (``args``: a script and its arguments, or
    ``-m module ...``)."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be a whole number >= 1, got {ranks!r}")
    return [mpiexec(), "-n", str(ranks), python or sys.executable, "-m", "mpi4py", *args]


def environment(threads: int | None = None) -> dict[str, str]:
    """This environment, plus what Open MPI needs to start as root and beyond the core count
    (ignored by MPICH); ``threads``: the BLAS/OpenMP threads of each rank."""
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = str(threads)
    return env
