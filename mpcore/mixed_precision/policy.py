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
from dataclasses import dataclass, field
from typing import Any

from mpcore.core import dtypes as _dtypes
from mpcore.mixed_precision import loss_scale as _ls

# name -> (compute dtype, variable dtype)
POLICIES: dict[str, tuple[str, str]] = {
    "float16": ("float16", "float16"),
    "bfloat16": ("bfloat16", "bfloat16"),
    "float32": ("float32", "float32"),
    "float64": ("float64", "float64"),
    "mixed_float16": ("float16", "float32"),
    "mixed_bfloat16": ("bfloat16", "float32"),
    # FP8 GEMMs (Dense) through quantise -> FP8 GEMM -> float32; the rest in bfloat16
    "mixed_float8": ("bfloat16", "float32"),
}
MIXED = frozenset({"mixed_float16", "mixed_bfloat16", "mixed_float8"})
#: Keras 3's names of the same policies (its quantized dtype policies).
ALIASES = {"float8_from_mixed_bfloat16": "mixed_float8"}
#: What a policy may be named, for messages: Keras 3 takes any dtype name too ("int32").
_VALID = (f"{', '.join(POLICIES)}, or another dtype name "
          f"({', '.join(d for d in _dtypes.ALL if d not in POLICIES)})")

# Marks "no loss_scale argument was given": mixed_float16 then gets a DynamicLossScale, as in
# TF's experimental Policy. Kept distinct from None, which means "no loss scaling".
_AUTO = "auto"


@dataclass(frozen=True, repr=False)
class Policy:
    """An immutable dtype policy, a plain value as jmp's ``Policy``: it names the dtypes and the
    loss scale, and owns the rule for casting inputs, but never touches tensors or backends.

    ``loss_scale`` is given as "auto" (dynamic for mixed_float16, none otherwise), None,
    "dynamic", a number (fixed scale), a serialized config or a LossScale; the policy then holds
    the LossScale, or None. Two policies are equal when their names and the class and config of
    their loss scales are (a dynamic scale's running state does not count).

    As Keras 3's ``DTypePolicy``: a name of None takes the name of the policy in force here
    (``global_policy()``, with its default loss scale), and any dtype name is a policy that
    computes and stores in that dtype (``Policy("int32")``, ``Policy("float64")``); a loss scale
    is refused for a policy that does not compute in a floating dtype."""

    name: str = None  # type: ignore[assignment]  # None: the global policy's (Keras 3)
    loss_scale: Any = field(default=_AUTO, compare=False)
    #: mixed_float8's scaling recipe (mp.mixed_precision.CurrentScaling() by default)
    float8_recipe: Any = field(default=None, compare=False)
    compute_dtype: str = field(init=False, compare=False)
    variable_dtype: str = field(init=False, compare=False)
    # what equality and hashing compare of the loss scale: its class and config
    _loss_scale_key: tuple[Any, ...] | None = field(init=False)
    # whether loss_scale was left "auto": get_config then omits it, so a round trip keeps it so
    _loss_scale_auto: bool = field(init=False, compare=False)
    # what equality compares of the FP8 recipe: its class and config
    _recipe_key: tuple[Any, ...] | None = field(init=False)

    def __post_init__(self) -> None:
        name = self.name
        if name is None:   # Keras 3's DTypePolicy(None): the policy in force here
            name = global_policy().name
            object.__setattr__(self, "name", name)
        if isinstance(name, str) and name in ALIASES:
            name = ALIASES[name]
            object.__setattr__(self, "name", name)
        if not isinstance(name, str):
            raise TypeError(f"policy name must be a string, got {type(name).__name__} {name!r}; "
                            f"valid names: {_VALID}")
        if name == "float8_from_float32":
            # a Keras 3 name that the README says mpcore refuses: say why, not "unknown"
            raise ValueError("Keras' 'float8_from_float32' (FP8 GEMMs in a float32 model) is "
                             "not supported: use 'mixed_float8' (Keras' "
                             "'float8_from_mixed_bfloat16'), or quantize('float8') a "
                             f"mixed_bfloat16 model; valid names: {_VALID}")
        if name not in POLICIES and name not in _dtypes.ALL:
            raise ValueError(f"unknown policy {name!r}; valid names: {_VALID}")
        auto = isinstance(self.loss_scale, str) and self.loss_scale == _AUTO
        if auto:
            scale = _ls.DynamicLossScale() if name == "mixed_float16" else None
        else:
            scale = _ls.get(self.loss_scale)
        compute, variable = POLICIES.get(name, (name, name))
        if scale is not None and not _dtypes.is_floating(compute):
            raise ValueError(f"policy {name!r} computes in {compute}, which has no gradients to "
                             f"scale: give it loss_scale=None (got {self.loss_scale!r})")
        key = None if scale is None else (type(scale).__name__,
                                          tuple(sorted(scale.get_config().items())))
        recipe = recipe_key = None
        if name == "mixed_float8":
            from mpcore.mixed_precision import recipes  # loads after this module: no cycle

            recipe = recipes.get(self.float8_recipe)
            recipe_key = (type(recipe).__name__, tuple(sorted(recipe.get_config().items())))
        elif self.float8_recipe is not None:
            raise ValueError(f"float8_recipe is for the policy 'mixed_float8', not {name!r}")
        for attr, value in (("loss_scale", scale), ("compute_dtype", compute),
                            ("variable_dtype", variable), ("_loss_scale_key", key),
                            ("_loss_scale_auto", auto), ("float8_recipe", recipe),
                            ("_recipe_key", recipe_key)):
            object.__setattr__(self, attr, value)

    @property
    def is_mixed(self) -> bool:
        return self.name in MIXED

    @property
    def loss_scale_is_default(self) -> bool:
        """Whether ``loss_scale`` was left to the policy (a dynamic scale for mixed_float16,
        none otherwise) rather than given: compile then trains a copy (see
        :func:`mpcore.optimizers.loss_scale_optimizer.for_policy`)."""
        return self._loss_scale_auto

    def compute_dtype_for(self, dtype: str) -> str:
        """The dtype a layer casts an input of ``dtype`` to: floating inputs take the compute
        dtype, integers and bools keep their own (labels and indices pass through).

        >>> Policy("mixed_float16").compute_dtype_for("float32")
        'float16'
        >>> Policy("mixed_float16").compute_dtype_for("int64")
        'int64'

        It answers with a dtype name rather than casting a tensor itself, so that the policy
        stays a value free of ops and backends: the layer does the cast, the policy only says
        what to cast to, and the rule is testable on names alone."""
        return self.compute_dtype if _dtypes.is_floating(dtype) else dtype

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"name": self.name}
        if not self._loss_scale_auto:
            config["loss_scale"] = (None if self.loss_scale is None
                                    else _ls.serialize(self.loss_scale))
        if self.float8_recipe is not None:
            from mpcore.mixed_precision import recipes

            config["float8_recipe"] = recipes.serialize(self.float8_recipe)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Policy:
        if not isinstance(config, dict) or "name" not in config:
            raise ValueError(f"a Policy config is a dict with a 'name' key, got {config!r}")
        return cls(config["name"], config.get("loss_scale", _AUTO),
                   config.get("float8_recipe"))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Policy.from_config, (self.get_config(),))

    def __copy__(self) -> Policy:
        return self

    def __repr__(self) -> str:
        return f'<Policy "{self.name}">'


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


def policy_origin() -> str:
    """Where the policy in force here comes from, for messages: "a policy_scope" or "the
    global policy"."""
    return "the global policy" if _scoped.get() is None else "a policy_scope"


def set_global(policy: Policy | str | None) -> Policy:
    """Make ``policy`` the process-wide policy (None: float32) and return it. Only the state:
    :func:`mpcore.mixed_precision.set_global_policy` also logs the compatibility check."""
    global _global
    _global = Policy("float32") if policy is None else get(policy)
    return _global


@contextlib.contextmanager
def policy_scope(policy: Policy | str) -> Iterator[Policy]:
    """Use ``policy`` inside the block, in this thread or asyncio task only."""
    resolved = get(policy)
    token = _scoped.set(resolved)
    try:
        yield resolved
    finally:
        _scoped.reset(token)
