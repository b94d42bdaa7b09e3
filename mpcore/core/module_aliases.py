"""The module paths of mpcore before its modules moved into packages (issue 34), kept working.

``import mpcore.policy``, ``from mpcore.loss_scale import DynamicLossScale`` and
``mpcore.tensor.host_read_guard = ...`` give THE module of the new path, never a copy: the
module-level hooks that tracing sets by assignment (``loss_scale.read_hook``,
``tensor.host_read_guard``, ``random.state_read_hook``) must be one object whatever path set
them. ``install()`` (called by ``mpcore/__init__``) puts a finder on ``sys.meta_path`` that
answers an old name with a loader handing back the new module (imported on first use, so an
old path costs what the new one costs), and registers the old names of the modules that
``import mpcore`` has already loaded, so importing those never rebinds an attribute of
``mpcore`` (``mpcore.function`` stays the decorator ``mp.function``).

Old names that are packages now (``mpcore.plugins``, ``mpcore.cli``, ``mpcore.losses``,
``mpcore.metrics``, ``mpcore.checkpoint``) are not here: the package is the old path, and its
``__init__`` re-exports the old module's public names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

#: old module -> new module (the one table of the moves)
ALIASES: dict[str, str] = {
    "mpcore.tensor": "mpcore.core.tensor",
    "mpcore.tape": "mpcore.core.tape",
    "mpcore.dtypes": "mpcore.core.dtypes",
    "mpcore.categories": "mpcore.core.categories",
    "mpcore.random": "mpcore.core.random",
    "mpcore.naming": "mpcore.core.naming",
    "mpcore.user_frames": "mpcore.core.user_frames",
    "mpcore.arguments": "mpcore.core.arguments",
    "mpcore.backend": "mpcore.core.backend",
    "mpcore.hookspecs": "mpcore.plugins.hookspecs",
    "mpcore.registry": "mpcore.plugins.registry",
    "mpcore.settings": "mpcore.plugins.settings",
    "mpcore.extras": "mpcore.plugins.extras",
    "mpcore.policy": "mpcore.mixed_precision.policy",
    "mpcore.verdict": "mpcore.mixed_precision.verdict",
    "mpcore.loss_scale": "mpcore.mixed_precision.loss_scale",
    "mpcore.function": "mpcore.tracing.function",
    "mpcore.recorder": "mpcore.tracing.recorder",
    "mpcore.program": "mpcore.tracing.program",
    "mpcore.program_nodes": "mpcore.tracing.program_nodes",
    "mpcore.trace_arguments": "mpcore.tracing.signature",
    "mpcore.trace_outputs": "mpcore.tracing.outputs",
    "mpcore.trace_hooks": "mpcore.mixed_precision.trace_hooks",
    "mpcore.trace_python_state": "mpcore.tracing.python_state",
    "mpcore.trace_reach": "mpcore.tracing.reach",
    "mpcore.trace_seeds": "mpcore.core.trace_seeds",
    "mpcore.trace_state": "mpcore.core.trace_state",
    "mpcore.trace_effects": "mpcore.tracing.effects",
    "mpcore.clipping": "mpcore.optimizers.clipping",
    "mpcore.hyperparameters": "mpcore.optimizers.hyperparameters",
    "mpcore.optimizer_gradients": "mpcore.optimizers.gradients",
    "mpcore.loss_scale_optimizer": "mpcore.optimizers.loss_scale_optimizer",
    "mpcore.commands": "mpcore.cli.commands",
    "mpcore.demo": "mpcore.cli.demo",
    "mpcore.demo_report": "mpcore.cli.demo_report",
    "mpcore.train": "mpcore.amp.train",
    # modules of packages that moved to break a cycle between packages
    "mpcore.amp.hooks": "mpcore.mixed_precision.amp_hooks",
    "mpcore.debugging.scopes": "mpcore.layers.scopes",
}


class _AliasLoader(importlib.abc.Loader):
    """Hands back the module of the new path; running it again would make a second copy."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # the import system has just set the module's __spec__ to the old name's: put back
        # the module's own (pickle, runpy and reload read it)
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = ALIASES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


FINDER = _AliasFinder()


def install() -> None:
    """Answer the old names from now on (once per process), and register those already loaded."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, FINDER)
    for old, new in ALIASES.items():
        module = sys.modules.get(new)
        if module is not None and old not in sys.modules:
            sys.modules[old] = module
            # as before the move, ``mp.policy`` is the module once loaded (never rebinding
            # a name mpcore defines: ``mp.function`` stays the decorator)
            parent = sys.modules.get("mpcore")
            leaf = old.rpartition(".")[2]
            if parent is not None and leaf not in vars(parent):
                setattr(parent, leaf, module)
