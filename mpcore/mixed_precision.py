"""Keras-style module: ``from mpcore import mixed_precision`` gives the policy and loss-scale
names of ``tf.keras.mixed_precision``.

Setting the global policy is where the policy meets the hardware: a mixed policy logs the
current backend's compatibility check here, so :mod:`mpcore.policy` stays a value module that
loads no backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpcore.loss_scale import DynamicLossScale, FixedLossScale, LossScale
from mpcore.policy import Policy, global_policy, policy_scope, set_global
from mpcore.verdict import check_policy, log_compatibility_once

if TYPE_CHECKING:
    from mpcore.loss_scale_optimizer import LossScaleOptimizer


def set_global_policy(policy: Policy | str | None) -> None:
    """Set the process-wide policy; None resets it to float32. A mixed policy logs the
    compatibility check of the current backend, once per policy and backend."""
    new = set_global(policy)
    if new.is_mixed:
        log_compatibility_once(new)


set_policy = set_global_policy


def __getattr__(name: str) -> Any:
    # The optimizers load on first use: `import mpcore` takes set_global_policy from here and
    # stays cheap.
    if name == "LossScaleOptimizer":
        from mpcore.loss_scale_optimizer import LossScaleOptimizer

        globals()[name] = LossScaleOptimizer
        return LossScaleOptimizer
    raise AttributeError(f"module 'mpcore.mixed_precision' has no attribute {name!r}")


__all__ = ["DynamicLossScale", "FixedLossScale", "LossScale", "LossScaleOptimizer", "Policy",
           "check_policy",
           "global_policy", "policy_scope", "set_global_policy", "set_policy"]
