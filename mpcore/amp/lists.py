"""The op lists of automatic mixed precision, and the three ways a user edits them.

The defaults are the category table of :mod:`mpcore.categories` (after TF's
``auto_mixed_precision_lists.h``): allow, deny, infer and clear. A user edits them without
touching code, as Intel's ITEX and TF itself let one do:

- in Python, ``AutoMixedPrecisionLists().edit(allowlist_add=["tanh"])``, handed to
  ``enable_mixed_precision_graph_rewrite(..., lists=)`` or ``autocast(..., lists=)``;
- with the environment variables ``MPCORE_AMP_ALLOWLIST_ADD``, ``MPCORE_AMP_ALLOWLIST_REMOVE``
  and the same for ``INFERLIST``, ``DENYLIST`` and ``CLEARLIST`` (comma-separated op names);
- with a list file named by ``MPCORE_AMP_LISTS_FILE`` (as Habana's lower-precision and fp32 op
  list files): a JSON object whose keys are the same edits in lower case,
  ``{"allowlist_add": ["tanh"], "denylist_remove": ["sum"]}``.

The file is applied first, then the environment variables. Adding an op to a list takes it out
of the others (an op has one category); removing it leaves it on no list, and an op on no list
is never changed to 16 bits (as an op TF's lists do not name). A backend's
``category_overrides`` (facts about its hardware) are applied last, over any edit.

>>> AutoMixedPrecisionLists().edit(allowlist_add=["tanh"]).category("tanh").value
'allow'
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mpcore.categories import CATEGORIES, Category

LISTS = ("allowlist", "denylist", "inferlist", "clearlist")
_OF_LIST = {"allowlist": Category.ALLOW, "denylist": Category.DENY,
            "inferlist": Category.INFER, "clearlist": Category.CLEAR}
#: The edits, by name: ``allowlist_add`` ... ``clearlist_remove``.
EDITS = tuple(f"{name}_{how}" for name in LISTS for how in ("add", "remove"))
ENV_PREFIX = "MPCORE_AMP_"
LISTS_FILE_ENV = "MPCORE_AMP_LISTS_FILE"


def _check_ops(ops: Iterable[str], where: str) -> list[str]:
    names = [op.strip() for op in ops if op.strip()]
    unknown = sorted(set(names) - CATEGORIES.keys())
    if unknown:
        raise ValueError(f"{where}: unknown op name(s) {', '.join(map(repr, unknown))}; valid "
                         f"names: {', '.join(sorted(CATEGORIES))}")
    return names


@dataclass(frozen=True)
class AutoMixedPrecisionLists:
    """The category of every op for automatic mixed precision (an op may be on no list).
    A frozen value: :meth:`edit` returns a new one."""

    table: Mapping[str, Category | None]

    def __init__(self, table: Mapping[str, Category | None] | None = None) -> None:
        object.__setattr__(self, "table", dict(CATEGORIES if table is None else table))

    def category(self, op: str, overrides: Mapping[str, Category] | None = None
                 ) -> Category | None:
        """The category of ``op``, or None when it is on no list; ``overrides`` (a backend's)
        win over the lists."""
        if overrides and op in overrides:
            return overrides[op]
        return self.table.get(op)

    def ops(self, category: Category) -> frozenset[str]:
        return frozenset(op for op, cat in self.table.items() if cat is category)

    @property
    def allowlist(self) -> frozenset[str]:
        return self.ops(Category.ALLOW)

    @property
    def denylist(self) -> frozenset[str]:
        return self.ops(Category.DENY)

    @property
    def inferlist(self) -> frozenset[str]:
        return self.ops(Category.INFER)

    @property
    def clearlist(self) -> frozenset[str]:
        return self.ops(Category.CLEAR)

    def edit(self, **edits: Iterable[str]) -> AutoMixedPrecisionLists:
        """These lists with ops added to or removed from lists: keywords ``allowlist_add``,
        ``allowlist_remove``, ... ``clearlist_remove``, each a list of op names."""
        table = dict(self.table)
        for key, ops in edits.items():
            if key not in EDITS:
                raise ValueError(f"unknown list edit {key!r}; valid edits: {', '.join(EDITS)}")
            if isinstance(ops, str):
                raise TypeError(f"{key} takes a list of op names, got the string {ops!r}")
            name, how = key.rsplit("_", 1)
            for op in _check_ops(ops, key):
                if how == "add":
                    table[op] = _OF_LIST[name]
                elif table.get(op) is _OF_LIST[name]:
                    table[op] = None
        return AutoMixedPrecisionLists(table)

    def with_env(self, environ: Mapping[str, str] | None = None) -> AutoMixedPrecisionLists:
        """These lists edited by the list file and the environment variables (see the
        module docstring)."""
        env = os.environ if environ is None else environ
        lists = self
        path = env.get(LISTS_FILE_ENV)
        if path:
            lists = lists.edit(**read_lists_file(path))
        edits = {key: env[ENV_PREFIX + key.upper()].split(",") for key in EDITS
                 if env.get(ENV_PREFIX + key.upper())}
        return lists.edit(**edits) if edits else lists

    def key(self) -> tuple[tuple[str, str], ...]:
        """What a traced step's signature holds of these lists (an edit retraces)."""
        return tuple(sorted((op, cat.value if cat else "-") for op, cat in self.table.items()))


def read_lists_file(path: str) -> dict[str, Any]:
    """The edits of a list file (a JSON object of edit name -> op names)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"{LISTS_FILE_ENV}={path!r}: cannot read the list file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{LISTS_FILE_ENV}={path!r}: not JSON ({exc}); write an object such "
                         'as {"allowlist_add": ["tanh"]}') from exc
    if not isinstance(data, dict):
        raise ValueError(f"{LISTS_FILE_ENV}={path!r}: a JSON object of edits is needed, got "
                         f"{type(data).__name__}; valid keys: {', '.join(EDITS)}")
    for key, ops in data.items():
        if key not in EDITS:
            raise ValueError(f"{LISTS_FILE_ENV}={path!r}: unknown key {key!r}; valid keys: "
                             f"{', '.join(EDITS)}")
        if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
            raise ValueError(f"{LISTS_FILE_ENV}={path!r}: {key} must be a list of op names, "
                             f"got {ops!r}")
    return data


def current_lists(lists: AutoMixedPrecisionLists | None = None) -> AutoMixedPrecisionLists:
    """``lists`` as given, else the defaults edited by the list file and the environment."""
    if lists is not None:
        if not isinstance(lists, AutoMixedPrecisionLists):
            raise TypeError("lists must be an mp.mixed_precision.AutoMixedPrecisionLists, got "
                            f"{type(lists).__name__}")
        return lists
    return AutoMixedPrecisionLists().with_env()
