"""Plugins: the pluggy hook specifications, loading the entry points, choosing the backend,
settings read from the environment and how to install what is missing.

``mpcore.plugins`` was a module before it was this package: its public names (those of
:mod:`mpcore.plugins.manager`) are still here."""

from __future__ import annotations

from mpcore.plugins.manager import (
    COMMANDS_GROUP,
    ENTRY_POINT_GROUP,
    PluginError,
    PluginLoadError,
    Plugins,
    command_plugins,
    get_plugins,
    install_kernel_sets,
    plugin_errors,
)

__all__ = ["COMMANDS_GROUP", "ENTRY_POINT_GROUP", "PluginError", "PluginLoadError", "Plugins",
           "command_plugins", "get_plugins", "install_kernel_sets", "plugin_errors"]
