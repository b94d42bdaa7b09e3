"""Loading plugins: entry points of the groups ``mpcore`` and ``mpcore.commands``, one at a
time, onto one plugin manager.

A plugin that fails to import is recorded with its error (``mpcore info`` shows it) and the
others keep working; ``MPCORE_STRICT_PLUGINS=1`` turns such a failure into an exception. A
hook that raises :class:`~mpcore.plugins.settings.SettingError` (a bad ``MPCORE_*`` value) is not a
failure of its plugin: the error reaches the user (see :mod:`mpcore.plugins.settings`). The
built-in backends are found the same way as a third party's: nothing here names them.

Design decision, how built-in commands are found: ``mpcore demo`` and ``mpcore conformance``
are entry points of the group ``mpcore.commands`` in mpcore's own pyproject.toml, found as a
third party's command is, rather than a built-in module list (llm's ``DEFAULT_PLUGINS``): the
backends already work this way, so one mechanism covers both, a third party's command cannot
be told from a built-in one, and nothing in the core names a module. The group is separate
from ``mpcore`` so that only the ``mpcore`` command loads command plugins: ``import mpcore``
loads no plugin, and a training process that loads the backends imports no command.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

import pluggy

from mpcore.plugins import hookspecs
from mpcore.plugins.settings import SettingError, env_choice

if TYPE_CHECKING:
    from mpcore.core.backend import Backend, KernelSet

ENTRY_POINT_GROUP = "mpcore"
COMMANDS_GROUP = "mpcore.commands"


@dataclass(frozen=True)
class PluginError:
    plugin: str      # the entry point's name
    target: str      # what it points at ("mpcore_cuda", "pkg.module:obj")
    error: str       # "ExceptionType: message"
    traceback: str


class PluginLoadError(RuntimeError):
    """Raised instead of recording a failure when MPCORE_STRICT_PLUGINS=1."""


def _strict() -> bool:
    return env_choice("MPCORE_STRICT_PLUGINS", ("0", "1")) == "1"


class Plugins:
    """The plugin manager, the loaded plugins, the failures, and the backends they gave."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager("mpcore")
        self.manager.add_hookspecs(hookspecs)
        self.errors: list[PluginError] = []
        self.backends: dict[str, Backend] = {}
        self.backend_origin: dict[str, str] = {}
        self.pending: list[EntryPoint] = []
        self.loaded_groups: set[str] = set()
        self.builtin: set[str] = set()   # the plugins mpcore's own distribution declares
        self.load_errors: dict[str, list[PluginError]] = {}  # group -> its plugins' failures

    def _fail(self, plugin: str, target: str, exc: BaseException) -> None:
        if _strict():
            raise PluginLoadError(f"mpcore plugin {plugin!r} ({target}) failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
        self.errors.append(PluginError(plugin, target, f"{type(exc).__name__}: {exc}",
                                       traceback.format_exc()))

    def report_failure(self, plugin: str, target: str, exc: BaseException) -> PluginError:
        """Record a plugin's failure found outside loading (a hook that raised), once."""
        error = f"{type(exc).__name__}: {exc}"
        for e in self.errors:
            if (e.plugin, e.target, e.error) == (plugin, target, error):
                return e  # the same hook failing again (the command run twice in a process)
        self._fail(plugin, target, exc)
        return self.errors[-1]

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        # checked before anything loads: read only when a plugin fails, a mistyped value
        # would pass unnoticed until then
        _strict()
        self.loaded_groups.add(group)
        errors_before = len(self.errors)
        dist_names: dict[int, str] = {}

        def dist_name(ep: EntryPoint) -> str:
            # A distribution's name is parsed from its METADATA on every access: once each.
            dist = getattr(ep, "dist", None)
            if id(dist) not in dist_names:
                dist_names[id(dist)] = getattr(dist, "name", None) or ""
            return dist_names[id(dist)]

        def load_order(ep: EntryPoint) -> tuple[bool, str]:
            # mpcore's own plugins first, then the others by name: metadata is found in
            # sys.path and directory order, and on a name clash the first plugin keeps it.
            return (dist_name(ep) != "mpcore", ep.name)

        seen: set[str] = set()
        for ep in sorted(entry_points(group=group), key=load_order):
            key = f"{dist_name(ep)}:{ep.name}"
            if key in seen:  # the same distribution found twice on sys.path
                continue
            seen.add(key)
            if dist_name(ep) == "mpcore":
                self.builtin.add(ep.name)
            self._load(ep)
        self.load_errors[group] = self.errors[errors_before:]

    def _load(self, ep: EntryPoint) -> None:
        try:
            if _initializing(ep.module):
                # A plugin module imported first runs `import mpcore` at its top, which lands
                # here while that module is half-imported: finish loading it later.
                self.pending.append(ep)
                return
            plugin = ep.load()
            if not self.manager.is_registered(plugin):  # a module may be in both groups
                self.manager.register(plugin, name=ep.name)
        except Exception as exc:  # a broken plugin must not take the others down
            self._fail(ep.name, ep.value, exc)
            return
        if ep.group == ENTRY_POINT_GROUP:  # a command plugin's backends come through there
            self._collect_backends(ep.name, ep.value, plugin)

    def load_pending(self) -> None:
        """Load the plugins that were mid-import when the others were loaded."""
        waiting, self.pending = self.pending, []
        for ep in waiting:
            self._load(ep)

    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object directly (tests, embedding applications)."""
        self.manager.register(plugin, name=name)
        self._collect_backends(name, name, plugin)

    def _collect_backends(self, name: str, target: str, plugin: object) -> None:
        from mpcore.core.backend import Backend

        impl = getattr(plugin, "mpcore_backends", None)
        if impl is None:
            return
        try:
            found = list(impl() or [])
            for backend in found:
                if not isinstance(backend, Backend):
                    raise TypeError(f"mpcore_backends returned {backend!r}, not a Backend")
                if not backend.name:
                    raise ValueError(f"{type(backend).__name__} has no name")
                if backend.name in self.backends:
                    raise ValueError(f"backend name {backend.name!r} is already provided by "
                                     f"plugin {self.backend_origin[backend.name]!r}")
        except Exception as exc:
            self._fail(name, target, exc)
            return
        for backend in found:
            self.backends[backend.name] = backend
            self.backend_origin[backend.name] = name

    def kernel_sets_for(self, backend: Backend) -> list[KernelSet]:
        sets = []
        for impl in self.manager.hook.mpcore_kernels.get_hookimpls():
            try:
                result = impl.function(backend=backend)
            except SettingError:
                raise  # the user's mistake: their setting must not be silently ignored
            except Exception as exc:
                self._fail(impl.plugin_name, "mpcore_kernels", exc)
                continue
            if result is not None:
                sets.append(result)
        return sets


_plugins: Plugins | None = None


def _shared() -> Plugins:
    global _plugins
    if _plugins is None:
        _plugins = Plugins()
    return _plugins


def get_plugins() -> Plugins:
    """The plugin manager with the backend plugins (group ``mpcore``) loaded."""
    plugins = _shared()
    if ENTRY_POINT_GROUP not in plugins.loaded_groups:
        plugins.load_entry_points(ENTRY_POINT_GROUP)
    elif plugins.pending:
        plugins.load_pending()
    return plugins


def command_plugins() -> Plugins:
    """The plugin manager with the command plugins (group ``mpcore.commands``) loaded; the
    backend plugins are not loaded for this."""
    plugins = _shared()
    if COMMANDS_GROUP not in plugins.loaded_groups:
        plugins.load_entry_points(COMMANDS_GROUP)
    return plugins


def _initializing(module_name: str) -> bool:
    module = sys.modules.get(module_name)
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def install_kernel_sets(backend: Backend, table: dict[str, Any]) -> tuple[KernelSet, ...]:
    """Put the plugins' kernel sets for ``backend`` into its kernel ``table``, in load order:
    a set's ``kernels`` replace entries, then its ``wraps`` build on the entry the table holds
    (the backend's own kernel or an earlier set's, None where there is none). A set whose wrap
    raises is reported like a plugin that fails to import and leaves the table as it was."""
    plugins = get_plugins()
    installed = []
    for kernel_set in plugins.kernel_sets_for(backend):
        staged = {**table, **kernel_set.kernels}
        try:
            for name, wrap in kernel_set.wraps.items():
                staged[name] = wrap(staged.get(name))
        except Exception as exc:
            plugins._fail(kernel_set.provider, "mpcore_kernels (wraps)", exc)
            continue
        table.clear()
        table.update(staged)
        installed.append(kernel_set)
    return tuple(installed)


def plugin_errors() -> list[PluginError]:
    return list(get_plugins().errors)
