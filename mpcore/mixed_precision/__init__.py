"""Keras-style module: ``from mpcore import mixed_precision`` gives the policy and loss-scale
names of ``tf.keras.mixed_precision``.

Setting the global policy is where the policy meets the hardware: a mixed policy logs the
current backend's compatibility check here, so :mod:`mpcore.mixed_precision.policy` stays a
value module that loads no backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpcore.mixed_precision import loss_scale as _loss_scale
from mpcore.mixed_precision.loss_scale import DynamicLossScale, FixedLossScale, LossScale
from mpcore.mixed_precision.policy import Policy, global_policy, policy_scope, set_global
from mpcore.mixed_precision.verdict import check_policy, log_compatibility_once
from mpcore.ops import loss_scaling as _loss_scaling

# a dynamic scale's device side (its variables and update kernel), wired here, above both
# (policy.py and loss_scale.py are value modules that reach no op)
_loss_scale.device = _loss_scaling

#: Keras 3's name for a Policy (``keras.DTypePolicy``, ``keras.mixed_precision.DTypePolicy``).
DTypePolicy = Policy

if TYPE_CHECKING:
    from mpcore.amp.autocast import autocast
    from mpcore.amp.lists import AutoMixedPrecisionLists
    from mpcore.amp.rewrite import (
        disable_mixed_precision_graph_rewrite,
        enable_mixed_precision_graph_rewrite,
    )
    from mpcore.mixed_precision import float8
    from mpcore.mixed_precision.recipes import CurrentScaling, DelayedScaling
    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    experimental: Any   # a module made on first use (_experimental)


def set_global_policy(policy: Policy | str | None) -> None:
    """Set the process-wide policy; None resets it to float32. A mixed policy logs the
    compatibility check of the current backend, once per policy and backend."""
    if policy is not None and _rewrite_enabled():
        candidate = policy if isinstance(policy, Policy) else Policy(policy)
        if candidate.name != "float32":
            raise ValueError(
                f"cannot set the global policy to {candidate.name!r} while the mixed precision "
                "graph rewrite is enabled: both would change dtypes. Call "
                "disable_mixed_precision_graph_rewrite() first, or keep float32")
    if policy is not None and _autocast_on():
        candidate = policy if isinstance(policy, Policy) else Policy(policy)
        if candidate.name != "float32":
            raise ValueError(
                f"cannot set the global policy to {candidate.name!r} inside an autocast block: "
                "both would change dtypes. Leave the block first, or keep float32")
    new = set_global(policy)
    if new.is_mixed:
        log_compatibility_once(new)


set_policy = set_global_policy


def _rewrite_enabled() -> bool:
    import sys

    rewrite = sys.modules.get("mpcore.amp.rewrite")
    return rewrite is not None and rewrite.is_enabled()


def _autocast_on() -> bool:
    import sys

    hooks = sys.modules.get("mpcore.mixed_precision.amp_hooks")
    return hooks is not None and hooks.autocast_on()


def _experimental() -> Any:
    """TF 2.1-2.3's ``tf.keras.mixed_precision.experimental``, which the guide of that time
    imports (``from tensorflow.keras.mixed_precision import experimental as mixed_precision``):
    the same objects under the old names (``set_policy``, ``Policy`` with ``loss_scale``, the
    LossScaleOptimizer with TF 2.3's ``loss_scale`` argument)."""
    import types

    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    module = types.ModuleType(f"{__name__}.experimental", _experimental.__doc__)
    for name, value in (("Policy", Policy), ("DynamicLossScale", DynamicLossScale),
                        ("FixedLossScale", FixedLossScale), ("LossScale", LossScale),
                        ("LossScaleOptimizer", LossScaleOptimizer),
                        ("global_policy", global_policy), ("set_policy", set_policy),
                        ("set_global_policy", set_global_policy)):
        setattr(module, name, value)
    return module


#: Names that load on first use, and their modules: `import mpcore` takes set_global_policy
#: from here and stays cheap.
_LAZY = {
    "LossScaleOptimizer": "mpcore.optimizers.loss_scale_optimizer",
    "enable_mixed_precision_graph_rewrite": "mpcore.amp.rewrite",
    "disable_mixed_precision_graph_rewrite": "mpcore.amp.rewrite",
    "autocast": "mpcore.amp.autocast",
    "AutoMixedPrecisionLists": "mpcore.amp.lists",
    "CurrentScaling": "mpcore.mixed_precision.recipes",
    "DelayedScaling": "mpcore.mixed_precision.recipes",
}


def __getattr__(name: str) -> Any:
    if name == "experimental":
        globals()[name] = value = _experimental()
        return value
    if name == "float8":   # the FP8 module loads ops: on first use, not at import mpcore
        import importlib

        return importlib.import_module("mpcore.mixed_precision.float8")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mpcore.mixed_precision' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["AutoMixedPrecisionLists", "CurrentScaling", "DTypePolicy", "DelayedScaling",
           "DynamicLossScale", "FixedLossScale", "LossScale", "LossScaleOptimizer", "Policy",
           "autocast", "check_policy", "disable_mixed_precision_graph_rewrite",
           "enable_mixed_precision_graph_rewrite", "experimental", "float8", "global_policy",
           "policy_scope", "set_global_policy", "set_policy"]
