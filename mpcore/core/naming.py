"""Looking things up by name (losses, metrics, optimizers), with errors that list the choices."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


def by_name(kind: str, table: Mapping[str, T], name: str, also_valid: Iterable[str] = ()) -> T:
    """``table[name.lower()]``, or a ValueError naming every valid name."""
    key = name.lower()
    if key not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid names: "
                         f"{', '.join([*also_valid, *sorted(table)])}")
    return table[key]
