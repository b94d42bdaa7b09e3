"""mpcore: mixed precision training (16-bit compute, 32-bit variables, loss scaling) on any
hardware, through backends that plug in with pluggy.

``import mpcore as mp`` loads no plugin and opens no device. At first use (the first op, or
``mp.get_backend()``) the backend plugins (entry-point group ``mpcore``) are loaded and a backend
is picked by priority (cuda, an OpenCL GPU, cpu) and proved. ``MPCORE_BACKEND=name`` or
``mp.set_backend(name)`` overrides the choice; ``mpcore info`` shows it. The architecture, and
which files to touch to add an op or a backend: ``docs/architecture.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

from mpcore import ops
from mpcore.core import dtypes, random
from mpcore.core import module_aliases as _module_aliases
from mpcore.core.backend import (
    Backend,
    BackendUnavailableError,
    Device,
    KernelBuildError,
    KernelSet,
    Support,
)
from mpcore.core.tape import GradientTape
from mpcore.core.tensor import Tensor, Variable
from mpcore.mixed_precision import DTypePolicy, set_global_policy, set_policy
from mpcore.mixed_precision.loss_scale import DynamicLossScale, FixedLossScale, LossScale
from mpcore.mixed_precision.policy import Policy, global_policy, policy_scope
from mpcore.mixed_precision.verdict import Measurement, Verdict, check_policy
from mpcore.plugins.hookspecs import hookimpl
from mpcore.plugins.manager import plugin_errors
from mpcore.plugins.registry import backends, get_backend, set_backend
from mpcore.tracing.function import Function, TraceError, function

__version__ = "0.1.0"

constant = ops.constant
convert_to_tensor = ops.constant

# Heavier parts load on first use, so `import mpcore` stays cheap.
_LAZY_MODULES = {
    "layers": "mpcore.layers", "models": "mpcore.models", "optimizers": "mpcore.optimizers",
    "losses": "mpcore.losses", "metrics": "mpcore.metrics", "datasets": "mpcore.datasets",
    "callbacks": "mpcore.callbacks", "checkpoint": "mpcore.checkpoint",
    "debugging": "mpcore.debugging", "distribution": "mpcore.distribution",
    "train": "mpcore.amp.train",   # tf.train.experimental.enable_mixed_precision_graph_rewrite
    "utils": "mpcore.utils",   # keras.utils: PyDataset, (un)pack_x_y_sample_weight
    "saving": "mpcore.saving",
}
_LAZY_ATTRS: dict[str, tuple[str, str]] = {
    "Model": ("mpcore.models", "Model"), "Sequential": ("mpcore.models", "Sequential"),
    "Input": ("mpcore.layers", "Input"),
    "LossScaleOptimizer": ("mpcore.optimizers.loss_scale_optimizer", "LossScaleOptimizer"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        module = importlib.import_module(_LAZY_MODULES[name])
        globals()[name] = module
        return module
    if f"mpcore.{name}" in _module_aliases.ALIASES:   # a module's old path, e.g. mp.policy
        module = importlib.import_module(f"mpcore.{name}")
        globals()[name] = module
        return module
    if name in _LAZY_ATTRS:
        module_name, attr = _LAZY_ATTRS[name]
        value = getattr(importlib.import_module(module_name), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mpcore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_ATTRS))


__all__ = [
    "Backend", "BackendUnavailableError", "DTypePolicy", "Device", "DynamicLossScale",
    "FixedLossScale",
    "Function", "GradientTape", "KernelBuildError", "KernelSet", "LossScale", "Measurement",
    "Policy", "Support", "Tensor", "TraceError", "Variable", "Verdict", "backends",
    "check_policy", "constant", "convert_to_tensor", "dtypes", "function", "get_backend",
    "global_policy", "hookimpl", "ops", "plugin_errors", "policy_scope", "random",
    "set_backend", "set_global_policy", "set_policy",
]

# Nothing is detected here: the backend is chosen and proved at first use (get_backend), so
# `import mpcore` opens no device and a bad MPCORE_BACKEND cannot stop `mpcore info`.
# The module paths of before issue 34 (mpcore.<module>: policy, loss_scale ...) keep working, as
# the same module objects; installed last, so the modules loaded above keep mpcore's names.
_module_aliases.install()
