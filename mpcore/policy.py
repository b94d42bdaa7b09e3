"""Dtype policies: which dtype a layer computes in and which dtype its variables are stored in.

>>> p = Policy("mixed_float16")
>>> p.compute_dtype, p.variable_dtype
('float16', 'float32')
>>> p
<Policy "mixed_float16">
>>> Policy("mixed_float16", loss_scale=1024).loss_scale
FixedLossScale(1024.0)
>>> Policy.from_config(p.get_config()) == p
True
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from mpcore import loss_scale as _ls

# name -> (compute dtype, variable dtype)
POLICIES: dict[str, tuple[str, str]] = {
    "float16": ("float16", "float16"),
    "bfloat16": ("bfloat16", "bfloat16"),
    "float32": ("float32", "float32"),
    "float64": ("float64", "float64"),
    "mixed_float16": ("float16", "float32"),
    "mixed_bfloat16": ("bfloat16", "float32"),
}
MIXED = frozenset({"mixed_float16", "mixed_bfloat16"})

# Marks "no loss_scale argument was given": mixed_float16 then gets a DynamicLossScale, as in
# TF's experimental Policy. Kept distinct from None, which means "no loss scaling".
_AUTO = "auto"


class Policy:
    """An immutable dtype policy. ``loss_scale`` is "auto" (dynamic for mixed_float16, none
    otherwise), None, "dynamic", a number (fixed scale) or a LossScale."""

    __slots__ = ("_loss_scale", "_loss_scale_arg", "_name")

    def __init__(self, name: str, loss_scale: Any = _AUTO) -> None:
        if not isinstance(name, str):
            raise TypeError(f"policy name must be a string, got {type(name).__name__} {name!r}; "
                            f"valid names: {', '.join(POLICIES)}")
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; valid names: {', '.join(POLICIES)}")
        object.__setattr__(self, "_name", name)
        auto = isinstance(loss_scale, str) and loss_scale == _AUTO
        if auto:
            scale = _ls.DynamicLossScale() if name == "mixed_float16" else None
        else:
            scale = _ls.get(loss_scale)
        object.__setattr__(self, "_loss_scale", scale)
        object.__setattr__(self, "_loss_scale_arg", _AUTO if auto else scale)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("Policy is immutable; create a new one")

    @property
    def name(self) -> str:
        return self._name

    @property
    def compute_dtype(self) -> str:
        return POLICIES[self._name][0]

    @property
    def variable_dtype(self) -> str:
        return POLICIES[self._name][1]

    @property
    def is_mixed(self) -> bool:
        return self._name in MIXED

    @property
    def loss_scale(self) -> _ls.LossScale | None:
        return self._loss_scale

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"name": self._name}
        if self._loss_scale_arg is not _AUTO:
            config["loss_scale"] = (None if self._loss_scale is None
                                    else _ls.serialize(self._loss_scale))
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Policy:
        if not isinstance(config, dict) or "name" not in config:
            raise ValueError(f"a Policy config is a dict with a 'name' key, got {config!r}")
        return cls(config["name"], config.get("loss_scale", _AUTO))

    def _key(self) -> tuple[Any, ...]:
        ls = self._loss_scale
        return (self._name, None if ls is None else (type(ls).__name__,
                                                      tuple(sorted(ls.get_config().items()))))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, ...]:
        return (Policy.from_config, (self.get_config(),))

    def __copy__(self) -> Policy:
        return self

    def __repr__(self) -> str:
        return f'<Policy "{self._name}">'


def get(policy: Policy | str | None) -> Policy:
    """A Policy from a Policy, a name, or None (the current global policy)."""
    if policy is None:
        return global_policy()
    if isinstance(policy, Policy):
        return policy
    return Policy(policy)


_global: Policy = Policy("float32")
_scoped: contextvars.ContextVar[Policy | None] = contextvars.ContextVar("mpcore_policy",
                                                                        default=None)


def global_policy() -> Policy:
    """The policy in force here: the innermost ``policy_scope`` of this context, else the
    process-wide policy (float32 until ``set_global_policy`` is called)."""
    scoped = _scoped.get()
    return _global if scoped is None else scoped


def set_global_policy(policy: Policy | str | None) -> None:
    """Set the process-wide policy; None resets it to float32. A mixed policy logs the
    compatibility check of the current backend, once per policy and backend."""
    global _global
    new = Policy("float32") if policy is None else get(policy)
    _global = new
    if new.is_mixed:
        from mpcore.verdict import log_compatibility_once  # late: verdicts need the registry

        log_compatibility_once(new)


set_policy = set_global_policy


@contextlib.contextmanager
def policy_scope(policy: Policy | str) -> Iterator[Policy]:
    """Use ``policy`` inside the block, in this thread or asyncio task only."""
    resolved = get(policy)
    token = _scoped.set(resolved)
    try:
        yield resolved
    finally:
        _scoped.reset(token)
