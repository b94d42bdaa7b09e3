"""The pluggy hooks a plugin may implement (project name ``mpcore``).

A plugin is a module registered under an entry-point group: ``mpcore`` for backends and kernel
sets (loaded when a backend is first needed), ``mpcore.commands`` for subcommands of the
``mpcore`` command (loaded only by that command). mpcore loads each one and registers it with
its plugin manager. Implementations are marked with :data:`mpcore.hookimpl`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from mpcore.cli.commands import Subcommands
    from mpcore.core.backend import Backend, KernelSet
    from mpcore.distribution.collectives import Collectives

hookspec = pluggy.HookspecMarker("mpcore")
hookimpl = pluggy.HookimplMarker("mpcore")


@hookspec
def mpcore_backends() -> list[Backend]:
    """Return the backends this plugin provides, as instances.

    Called once when mpcore loads its plugins (at ``import mpcore``). Constructing a backend
    must be cheap: no device is opened, nothing is compiled. Every plugin's list is
    concatenated; two backends with the same ``name`` are an error reported for the later
    plugin.
    """


@hookspec
def mpcore_kernels(backend: Backend) -> KernelSet | None:
    """Return kernels to add to, or override in, ``backend`` (or None to leave it alone).

    Called once per backend, when the backend is first used (its kernel table is built). Use
    it to give an existing backend a faster kernel, for example a oneDNN bfloat16 matmul for
    the ``cpu`` backend, without replacing the backend. The KernelSet's ``fast_dtypes`` lets
    the backend's verdict say that a 16-bit policy now runs fast, and why.

    A hook that raises is reported as its plugin's failure and the backend runs without it;
    one that raises :class:`mpcore.plugins.settings.SettingError` (what ``env_choice`` raises
    for a bad ``MPCORE_*`` value) fails the backend's first use with that message instead, so that a
    mistyped setting is never silently ignored.
    """


@hookspec
def mpcore_collectives() -> list[type[Collectives]]:
    """Return the collectives engines this plugin provides, as classes (subclasses of
    :class:`mpcore.distribution.Collectives`, each with its ``name``).

    Called when a ``DataParallel`` distribution is made, to choose its engine (by name, or
    the available one of highest ``priority`` for the backend). Returning a class must be
    cheap: the engine's library (mpi4py, NCCL) is imported when the class is instantiated.
    """


@hookspec
def mpcore_commands(subcommands: Subcommands) -> None:
    """Add subcommands to the ``mpcore`` command: call ``subcommands.add(name, help_text, run,
    configure)`` once per command, where ``run(args) -> int`` gets the parsed arguments and
    returns the exit status and ``configure(parser)`` adds its arguments to its
    ``argparse.ArgumentParser``.

    Called each time the ``mpcore`` command starts, for the plugins of the entry-point group
    ``mpcore.commands`` (and any plugin already registered). ``mpcore demo`` and ``mpcore
    conformance`` come in this way too. A plugin whose hook raises, or that adds a name another
    plugin took, is reported (``mpcore info``, :func:`mpcore.plugin_errors`) and its commands are
    left out; the others still work.
    """
