"""The ``mpcore`` command: ``app`` (``main``, ``mpcore info``), ``commands`` (what a
subcommand plugin provides), and the built-in subcommand ``demo`` (the guide's demo, with
``demo_report``), found through the entry-point group ``mpcore.commands`` like a third party's.

``mpcore.cli`` was a module before it was this package: ``main``, ``info_report``,
``format_info`` and ``INFO_HELP`` are still here. Its function ``commands()`` is now
``mpcore.cli.app.commands`` (``mpcore.cli.commands`` is the module)."""

from __future__ import annotations

from mpcore.cli.app import INFO_HELP, format_info, info_report, main

__all__ = ["INFO_HELP", "format_info", "info_report", "main"]
