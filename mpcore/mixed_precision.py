"""Keras-style module: ``from mpcore import mixed_precision`` gives the policy and loss-scale
names of ``tf.keras.mixed_precision``."""

from mpcore.loss_scale import DynamicLossScale, FixedLossScale, LossScale
from mpcore.loss_scale_optimizer import LossScaleOptimizer
from mpcore.policy import Policy, global_policy, policy_scope, set_global_policy, set_policy
from mpcore.verdict import check_policy

__all__ = ["DynamicLossScale", "FixedLossScale", "LossScale", "LossScaleOptimizer", "Policy",
           "check_policy",
           "global_policy", "policy_scope", "set_global_policy", "set_policy"]
