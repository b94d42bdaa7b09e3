"""``autocast``: automatic mixed precision op by op, eagerly, as PyTorch's ``torch.autocast``.

Inside ``with mp.mixed_precision.autocast("bfloat16"):`` every op of a float32 model decides
its dtype from the same lists as the graph rewrite (:mod:`mpcore.amp.lists`): allow ops compute
in the 16-bit dtype (their float32 inputs, variables included, are cast), deny ops in float32,
and infer, clear and unlisted ops in the promoted dtype of their inputs. A layer lets a 16-bit
input through instead of casting it back to its float32 compute dtype.

Where it differs from the graph rewrite: it decides each op from its own inputs, as it runs,
without seeing the graph. So an infer op after an allow op runs in 16 bits even when no allow
op follows it (the rewrite keeps such an op float32), an infer op fed a float32 and a 16-bit
tensor runs in float32, and the deny propagation and the clear-op painting of the rewrite do
not happen. It applies to eager code and to steps traced inside the scope (their signature
holds the scope, so a step traced inside is not replayed outside). It is context-local, like
``policy_scope``.

It is for float32 models only, and refuses what would also set dtypes, rather than silently
overriding it: a mixed global policy or ``policy_scope`` when the block is entered,
``set_global_policy`` to a mixed policy inside it, a layer whose own policy is mixed (its
``dtype=``, or built under a mixed ``policy_scope``) called inside it, and the mixed precision
graph rewrite (enabled when the block is entered, or enabled inside it). PyTorch's autocast
has no layer policies to weigh against; a Keras layer's mixed policy is the user's explicit
choice of its dtypes, so mpcore makes the conflict an error, as it does for the global policy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mpcore.amp.lists import AutoMixedPrecisionLists, current_lists
from mpcore.amp.target import check_dtype, device_dtype
from mpcore.core.categories import Category
from mpcore.mixed_precision import amp_hooks as hooks
from mpcore.mixed_precision.policy import global_policy, policy_origin
from mpcore.plugins import registry

_FLOATS = frozenset({"float16", "bfloat16", "float32"})


@dataclass(frozen=True)
class AutocastScope:
    """The decisions of one ``autocast`` block."""

    dtype: str
    lists: AutoMixedPrecisionLists

    def decide(self, op: str, backend: Any, dtype: str, float_only: bool) -> str | None:
        if dtype not in _FLOATS:
            return None                         # integers, bools, float64: the category rule
        category = self.lists.category(op, backend.category_overrides)
        if category is Category.ALLOW:
            return self.dtype
        if category is Category.DENY:
            return "float32"
        return dtype

    def key(self) -> tuple[Any, ...]:
        return ("autocast", self.dtype, self.lists.key())


def autocast(dtype: Any = None, *, lists: AutoMixedPrecisionLists | None = None
             ) -> contextlib.AbstractContextManager[AutocastScope]:
    """Run the ops of this block with per-op mixed precision (module docstring). ``dtype``:
    float16 or bfloat16 (default: the current device's fast one, by its verdict); ``lists``:
    the op lists (default: mpcore's, edited by ``MPCORE_AMP_*`` when the block is entered).
    A bad ``dtype`` or ``lists`` is an error here, not only when the block is entered."""
    low = None if dtype is None else check_dtype(dtype)
    chosen = None if lists is None else current_lists(lists)
    return _block(low, chosen)


@contextlib.contextmanager
def _block(low: str | None, lists: AutoMixedPrecisionLists | None) -> Iterator[AutocastScope]:
    policy = global_policy()
    if policy.name != "float32":
        raise ValueError(f"autocast runs float32 models in mixed precision, but the policy is "
                         f"{policy.name!r} ({policy_origin()}), which already sets the dtypes; "
                         "use one of them (mp.set_global_policy(None) or "
                         "policy_scope('float32') for autocast)")
    if hooks.rewrite is not None:
        raise ValueError("autocast and the mixed precision graph rewrite both change dtypes, "
                         "and the rewrite is enabled: use one of them "
                         "(disable_mixed_precision_graph_rewrite() first for autocast)")
    scope = AutocastScope(device_dtype(registry.get_backend()) if low is None else low,
                          current_lists(lists))
    token = hooks.enter_scope(scope)
    try:
        yield scope
    finally:
        hooks.exit_scope(token)
