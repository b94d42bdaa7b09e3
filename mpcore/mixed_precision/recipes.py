"""FP8 scaling recipes: how each GEMM operand's scale is chosen (Transformer Engine's recipes,
``transformer_engine/common/recipe/__init__.py``).

>>> CurrentScaling()
CurrentScaling(format='hybrid', power_of_two_scales=True, margin=0)
>>> DelayedScaling(amax_history_len=16).forward_format, DelayedScaling().backward_format
('e4m3', 'e5m2')
>>> DelayedScaling.from_config(DelayedScaling(margin=1).get_config())
DelayedScaling(amax_history_len=1024, amax_compute_algo='max', margin=1, format='hybrid')

Scales are multipliers, as in Transformer Engine: ``codes = saturate(x * scale)``, and the
scale that maps an amax to the format's largest value is ``fp8_max / amax / 2**margin``.
(Keras 3 stores the reciprocal and divides.) Recipes are plain values: the state a recipe
keeps (a scale and an amax history per operand) lives in a layer's variables.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

#: recipe format -> (format of the forward operands, format of the output gradients):
#: Transformer Engine's Format.HYBRID and Format.E4M3.
FORMATS: dict[str, tuple[str, str]] = {"hybrid": ("e4m3", "e5m2"), "e4m3": ("e4m3", "e4m3")}
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
#: The largest margin (a power-of-two exponent) a recipe takes: 2**127 is float32's largest.
MAX_MARGIN = 127


def _check_common(owner: str, fmt: Any, margin: Any) -> None:
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValueError(f"{owner}: format must be one of {', '.join(map(repr, FORMATS))}, "
                         f"got {fmt!r}")
    if isinstance(margin, bool) or not isinstance(margin, int) or not 0 <= margin <= MAX_MARGIN:
        raise ValueError(f"{owner}: margin must be an int in [0, {MAX_MARGIN}] (the scale is "
                         f"divided by 2**margin), got {margin!r}")


class _Recipe:
    """What the recipes share: formats and serialization."""

    format: str
    margin: int
    #: Whether scales are rounded down to powers of two (then scaling is exact).
    power_of_two_scales: bool
    #: How many amaxes the recipe remembers per operand.
    amax_history_len: int
    #: Whether a step's scale comes from earlier steps' amaxes (else from its own).
    delayed: ClassVar[bool]

    @property
    def forward_format(self) -> str:
        """The format of the forward GEMM operands (inputs and kernel)."""
        return FORMATS[self.format][0]

    @property
    def backward_format(self) -> str:
        """The format of the output gradients in the backward GEMMs."""
        return FORMATS[self.format][1]

    def get_config(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        return cls(**config)


@dataclass(frozen=True)
class CurrentScaling(_Recipe):
    """Per-tensor current scaling (Transformer Engine's ``Float8CurrentScaling``): each GEMM
    operand's scale comes from its own amax in this step, rounded down to a power of two by
    default (so ``x * scale`` is exact and only the FP8 rounding remains)."""

    format: str = "hybrid"
    power_of_two_scales: bool = True
    margin: int = 0

    delayed: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_common("CurrentScaling", self.format, self.margin)
        if not isinstance(self.power_of_two_scales, bool):
            raise ValueError(f"CurrentScaling: power_of_two_scales must be a bool, got "
                             f"{self.power_of_two_scales!r}")

    @property
    def amax_history_len(self) -> int:   # type: ignore[override]
        return 1


@dataclass(frozen=True)
class DelayedScaling(_Recipe):
    """Delayed scaling (Transformer Engine's ``DelayedScaling``): a step's scale comes from the
    amaxes of the ``amax_history_len`` steps before it (their max, or the most recent), so it
    is known before the step reads its data. A zero or non-finite amax keeps the previous
    scale. After a step the layer keeps the scale that step used and the history with this
    step's amax rolled in (Keras 3's bookkeeping, TE's ring: ``roll(-1)``, then ``[0] =
    amax``)."""

    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    margin: int = 0
    format: str = "hybrid"

    delayed: ClassVar[bool] = True
    power_of_two_scales: ClassVar[bool] = False   # type: ignore[misc]  # TE's: not rounded

    def __post_init__(self) -> None:
        _check_common("DelayedScaling", self.format, self.margin)
        n = self.amax_history_len
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"DelayedScaling: amax_history_len must be a positive int, got "
                             f"{n!r}")
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"DelayedScaling: amax_compute_algo must be one of "
                             f"{', '.join(map(repr, AMAX_COMPUTE_ALGOS))}, got "
                             f"{self.amax_compute_algo!r}")


Recipe = CurrentScaling | DelayedScaling
_CLASSES: dict[str, type[Any]] = {"CurrentScaling": CurrentScaling,
                                  "DelayedScaling": DelayedScaling}


def serialize(recipe: Recipe) -> dict[str, Any]:
    return {"class_name": type(recipe).__name__, "config": recipe.get_config()}


def get(recipe: Any) -> Recipe:
    """A recipe from a recipe, a serialized one (``{"class_name": ..., "config": ...}``) or
    None (the default, ``CurrentScaling()``)."""
    if recipe is None:
        return CurrentScaling()
    if isinstance(recipe, (CurrentScaling, DelayedScaling)):
        return recipe
    if isinstance(recipe, dict) and recipe.get("class_name") in _CLASSES:
        return _CLASSES[recipe["class_name"]].from_config(dict(recipe.get("config", {})))
    raise ValueError(f"float8_recipe must be a CurrentScaling, a DelayedScaling, a serialized "
                     f"one ({{'class_name': 'DelayedScaling', 'config': {{...}}}}) or None, got "
                     f"{recipe!r}")
