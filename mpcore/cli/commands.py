"""What a plugin's ``mpcore_commands`` hook receives (:class:`Subcommands`) and what each
``add`` makes of it (:class:`Command`): a subcommand of the ``mpcore`` command, named, with
its help line, the function that adds its arguments and the one that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


@dataclass(frozen=True)
class Command:
    name: str
    help_text: str
    run: Run
    configure: Configure
    plugin: str    # the plugin that added it ("mpcore" for the built-in ``info``)


class Subcommands:
    """The commands one plugin adds. Nothing is taken until its hook returns, so a plugin that
    raises halfway leaves no command behind."""

    def __init__(self, plugin: str, taken: Mapping[str, Command]) -> None:
        self.plugin = plugin
        self._taken = taken
        self.added: dict[str, Command] = {}

    def add(self, name: str, help_text: str, run: Run,
            configure: Configure | None = None) -> None:
        """Add ``mpcore NAME``: ``configure(parser)`` adds its arguments, ``run(args)`` returns
        its exit status. A name already taken is an error (the first plugin keeps it)."""
        if not isinstance(name, str) or not name or name.startswith("-") or " " in name:
            raise ValueError(f"command name {name!r} is not a word")
        if not callable(run) or (configure is not None and not callable(configure)):
            raise TypeError(f"command {name!r}: run and configure must be callables")
        owner = self._taken.get(name) or self.added.get(name)
        if owner is not None:
            raise ValueError(f"command name {name!r} is already provided by plugin "
                             f"{owner.plugin!r}")
        self.added[name] = Command(name, help_text, run, configure or _no_arguments,
                                   self.plugin)
