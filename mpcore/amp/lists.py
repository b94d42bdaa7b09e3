"""The op lists of automatic mixed precision, and the three ways a user edits them.

The defaults are the category table of :mod:`mpcore.core.categories` (after TF's
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

Within one source (one ``edit`` call, the file, the variables), an op added to two lists, or
added to a list and removed from it, is an error: which won would depend on the order. Errors
name their source (the keyword, the variable, or the file and its key), and a variable that
starts with ``MPCORE_AMP_`` but is not one of :data:`ENV_VARIABLES` is an error (a misspelt
edit would otherwise be ignored). Op names: the category table's, and :data:`UNLISTED` (ops a
painted step shows that no list names by default).

>>> AutoMixedPrecisionLists().edit(allowlist_add=["tanh"]).category("tanh").value
'allow'
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mpcore.core.categories import CATEGORIES, Category

LISTS = ("allowlist", "denylist", "inferlist", "clearlist")
_OF_LIST = {"allowlist": Category.ALLOW, "denylist": Category.DENY,
            "inferlist": Category.INFER, "clearlist": Category.CLEAR}
#: The edits, by name: ``allowlist_add`` ... ``clearlist_remove``.
EDITS = tuple(f"{name}_{how}" for name in LISTS for how in ("add", "remove"))
#: Ops a painted step can show that the category table (and TF's lists) do not name: on no
#: list by default, but a user may put them on one, as any op the summary names.
UNLISTED = frozenset({"full", "copy", "convert", "dropout_mask", "random_normal",
                      "random_uniform", "sparse_softmax_cross_entropy_grad",
                      "unscale_and_check", "unscale_and_check_by", "loss_scale_update",
                      "all_finite", "sgd_update", "rmsprop_update", "adam_update",
                      "adam_rates"})
#: Every op name the lists take.
KNOWN = frozenset(CATEGORIES) | UNLISTED
ENV_PREFIX = "MPCORE_AMP_"
LISTS_FILE_ENV = "MPCORE_AMP_LISTS_FILE"


def _check_ops(ops: Any, where: str) -> list[str]:
    if ops is None or isinstance(ops, (str, bytes)) or not isinstance(ops, Iterable):
        raise TypeError(f"{where} takes a list of op names, got {ops!r}")
    bad = [op for op in ops if not isinstance(op, str)]
    if bad:
        raise TypeError(f"{where} takes a list of op names (strings), got {bad[0]!r} "
                        f"({type(bad[0]).__name__})")
    names = [op.strip() for op in ops if op.strip()]
    unknown = sorted(set(names) - KNOWN)
    if unknown:
        raise ValueError(f"{where}: unknown op name(s) {', '.join(map(repr, unknown))}; valid "
                         f"names: {', '.join(sorted(KNOWN))}")
    return names


def _category(value: Any, op: str) -> Category | None:
    """A table entry as a Category ("deny" or Category.DENY), or None: on no list."""
    if value is None or isinstance(value, Category):
        return value
    try:
        return Category(value)
    except ValueError:
        raise ValueError(f"AutoMixedPrecisionLists: {op!r} has the category {value!r}; valid "
                         f"categories: {', '.join(c.value for c in Category)} or None") from None


def _conflicts(edits: Mapping[str, list[str]], where: Callable[[str], str]) -> None:
    """An op added to two lists, or added to a list and removed from it, in one edit: which
    one wins would depend on the order of the keywords, so it is an error."""
    added: dict[str, str] = {}
    for key, ops in edits.items():
        if key.endswith("_add"):
            for op in ops:
                clash = added.setdefault(op, key)
                if clash != key:
                    raise ValueError(f"{op!r} is in both {where(clash)} and {where(key)}: an "
                                     "op has one category; name it in one of them")
    for key, ops in edits.items():
        add = key.replace("_remove", "_add")
        for op in ops:
            if key.endswith("_remove") and added.get(op) == add:
                raise ValueError(f"{op!r} is in both {where(add)} and {where(key)}: name it "
                                 "in one of them")


def _env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


#: Every MPCORE_AMP_* variable mpcore reads (another, a misspelling, is an error).
ENV_VARIABLES = (*(_env_name(key) for key in EDITS), LISTS_FILE_ENV)


@dataclass(frozen=True)
class AutoMixedPrecisionLists:
    """The category of every op for automatic mixed precision (an op may be on no list).
    A frozen, hashable value: :meth:`edit` returns a new one. ``table`` maps op names to a
    Category, its value ("allow", "deny", "infer", "clear") or None (on no list)."""

    table: Mapping[str, Category | None]

    def __init__(self, table: Mapping[str, Category | str | None] | None = None) -> None:
        if table is not None and not isinstance(table, Mapping):
            raise TypeError("AutoMixedPrecisionLists takes a mapping of op name -> category, "
                            f"got {type(table).__name__}")
        source = CATEGORIES if table is None else table
        _check_ops(list(source), "AutoMixedPrecisionLists")
        object.__setattr__(self, "table", {op: _category(c, op) for op, c in source.items()})

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        # the whole table is ~2,500 characters: show how it differs from the defaults
        changes = [f"{op}={cat.value if cat else None}" for op, cat in sorted(self.table.items())
                   if CATEGORIES.get(op) is not cat]
        changes += [f"{op}=None" for op in sorted(CATEGORIES.keys() - self.table.keys())]
        return f"AutoMixedPrecisionLists({', '.join(changes) or 'defaults'})"

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
        ``allowlist_remove``, ... ``clearlist_remove``, each a list of op names. An op added
        to two lists, or added to and removed from one, is an error (order would decide)."""
        return self._edit(edits, lambda key: key)

    def _edit(self, edits: Mapping[str, Any], where: Callable[[str], str]
              ) -> AutoMixedPrecisionLists:
        """``edit``, with ``where(key)`` naming where each edit came from in errors."""
        checked: dict[str, list[str]] = {}
        for key, ops in edits.items():
            if key not in EDITS:
                raise ValueError(f"unknown list edit {key!r}; valid edits: {', '.join(EDITS)}")
            if isinstance(ops, str):
                raise TypeError(f"{where(key)} takes a list of op names, got the string {ops!r}")
            checked[key] = _check_ops(ops, where(key))
        _conflicts(checked, where)
        table = dict(self.table)
        for key, names in checked.items():
            name, how = key.rsplit("_", 1)
            for op in names:
                if how == "add":
                    table[op] = _OF_LIST[name]
                elif table.get(op) is _OF_LIST[name]:
                    table[op] = None
        return AutoMixedPrecisionLists(table)

    def with_env(self, environ: Mapping[str, str] | None = None) -> AutoMixedPrecisionLists:
        """These lists edited by the list file and the environment variables (see the
        module docstring). A variable that starts with MPCORE_AMP_ (in any case) but is not
        one of :data:`ENV_VARIABLES` is an error: a misspelt edit would be ignored."""
        env = os.environ if environ is None else environ
        unknown = sorted(name for name in env if name.upper().startswith(ENV_PREFIX)
                         and name not in ENV_VARIABLES)
        if unknown:
            raise ValueError(f"unknown environment variable(s) {', '.join(unknown)}; valid "
                             f"MPCORE_AMP_* variables: {', '.join(ENV_VARIABLES)}")
        lists = self
        path = env.get(LISTS_FILE_ENV)
        if path:
            lists = lists._edit(read_lists_file(path),
                                lambda key: f"{key} of the list file {path!r} ({LISTS_FILE_ENV})")
        edits = {key: env[_env_name(key)].split(",") for key in EDITS if env.get(_env_name(key))}
        return lists._edit(edits, _env_name) if edits else lists

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
