"""The editable op lists: the defaults are mpcore's category table, edited in Python, by the
MPCORE_AMP_* environment variables and by a list file; unknown names are errors naming the
valid ones; a backend's category overrides still apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mpcore as mp
from mpcore.amp.lists import AutoMixedPrecisionLists, current_lists
from mpcore.core.categories import CATEGORIES, Category


def test_the_defaults_are_the_category_table() -> None:
    lists = mp.mixed_precision.AutoMixedPrecisionLists()
    assert lists.allowlist == {op for op, c in CATEGORIES.items() if c is Category.ALLOW}
    assert "softmax" in lists.denylist and "add" in lists.inferlist
    assert "reshape" in lists.clearlist


def test_edit_in_python_moves_an_op_between_lists() -> None:
    lists = AutoMixedPrecisionLists().edit(allowlist_add=["tanh"], denylist_remove=["sum"])
    assert lists.category("tanh") is Category.ALLOW and "tanh" not in lists.inferlist
    assert lists.category("sum") is None
    # removing an op from a list it is not on changes nothing
    assert AutoMixedPrecisionLists().edit(allowlist_remove=["exp"]).category("exp") is \
        Category.DENY


def test_environment_variables_edit_the_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_AMP_ALLOWLIST_ADD", "tanh, sigmoid")
    monkeypatch.setenv("MPCORE_AMP_INFERLIST_REMOVE", "add")
    monkeypatch.setenv("MPCORE_AMP_DENYLIST_ADD", "matmul")
    monkeypatch.setenv("MPCORE_AMP_CLEARLIST_REMOVE", "relu")
    lists = current_lists()
    assert lists.category("tanh") is lists.category("sigmoid") is Category.ALLOW
    assert lists.category("add") is None and lists.category("relu") is None
    assert lists.category("matmul") is Category.DENY


def test_a_list_file_edits_the_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "lists.json"
    path.write_text(json.dumps({"allowlist_add": ["gelu"], "clearlist_remove": ["max"]}))
    monkeypatch.setenv("MPCORE_AMP_LISTS_FILE", str(path))
    monkeypatch.setenv("MPCORE_AMP_ALLOWLIST_REMOVE", "gelu")   # the variables come last
    lists = current_lists()
    assert lists.category("max") is None and lists.category("gelu") is None
    monkeypatch.delenv("MPCORE_AMP_ALLOWLIST_REMOVE")
    assert current_lists().category("gelu") is Category.ALLOW


def test_an_unknown_op_name_lists_the_valid_ones(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown op name\(s\) 'MatMul'.*valid names: .*matmul"):
        AutoMixedPrecisionLists().edit(allowlist_add=["MatMul"])
    monkeypatch.setenv("MPCORE_AMP_DENYLIST_ADD", "softmax,no_such_op")
    with pytest.raises(ValueError,
                       match=r"MPCORE_AMP_DENYLIST_ADD: unknown op name.*'no_such_op'"):
        current_lists()
    monkeypatch.delenv("MPCORE_AMP_DENYLIST_ADD")
    path = tmp_path / "lists.json"
    path.write_text(json.dumps({"allowlist_add": ["Conv2D"]}))
    monkeypatch.setenv("MPCORE_AMP_LISTS_FILE", str(path))
    with pytest.raises(ValueError, match=r"'Conv2D'.*valid names"):
        current_lists()


@pytest.mark.parametrize("content, message", [
    ('{"allowlist_plus": ["tanh"]}', "unknown key 'allowlist_plus'; valid keys: allowlist_add"),
    ('["tanh"]', "a JSON object of edits is needed"),
    ('{"allowlist_add": "tanh"}', "must be a list of op names"),
    ("allowlist_add = tanh", "not JSON"),
])
def test_a_bad_list_file_says_what_is_expected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               content: str, message: str) -> None:
    path = tmp_path / "lists.json"
    path.write_text(content)
    monkeypatch.setenv("MPCORE_AMP_LISTS_FILE", str(path))
    with pytest.raises(ValueError, match=message):
        current_lists()
    monkeypatch.setenv("MPCORE_AMP_LISTS_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"cannot read the list file"):
        current_lists()


def test_bad_edits_in_python() -> None:
    with pytest.raises(ValueError, match=r"unknown list edit 'whitelist_add'; valid edits"):
        AutoMixedPrecisionLists().edit(whitelist_add=["tanh"])
    with pytest.raises(TypeError, match=r"a list of op names, got the string 'tanh'"):
        AutoMixedPrecisionLists().edit(allowlist_add="tanh")
    with pytest.raises(TypeError, match=r"AutoMixedPrecisionLists, got dict"):
        current_lists({"allowlist": ["tanh"]})  # type: ignore[arg-type]


def test_a_backends_overrides_win_over_the_lists() -> None:
    lists = AutoMixedPrecisionLists().edit(allowlist_add=["tanh"])
    assert lists.category("tanh", {"tanh": Category.DENY}) is Category.DENY
    assert lists.category("matmul", {"tanh": Category.DENY}) is Category.ALLOW


def test_an_op_on_two_lists_in_one_edit_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18, defect 5: the keyword (or variable) order decided silently which list won."""
    with pytest.raises(ValueError, match=r"'tanh' is in both allowlist_add and denylist_add"):
        AutoMixedPrecisionLists().edit(allowlist_add=["tanh"], denylist_add=["tanh"])
    with pytest.raises(ValueError, match=r"'tanh' is in both allowlist_add and allowlist_remove"):
        AutoMixedPrecisionLists().edit(allowlist_remove=["tanh"], allowlist_add=["tanh"])
    monkeypatch.setenv("MPCORE_AMP_ALLOWLIST_ADD", "tanh")
    monkeypatch.setenv("MPCORE_AMP_DENYLIST_ADD", "tanh")
    with pytest.raises(ValueError, match=r"'tanh' is in both MPCORE_AMP_ALLOWLIST_ADD and "
                                         r"MPCORE_AMP_DENYLIST_ADD"):
        current_lists()


@pytest.mark.parametrize("name", ["MPCORE_AMP_ALLOWLIST_ADDD", "MPCORE_AMP_ALLOW_ADD",
                                  "mpcore_amp_allowlist_add"])
def test_a_misspelt_variable_is_an_error_listing_the_valid_ones(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Issue 18, defect 6: a misspelt MPCORE_AMP_* variable was ignored without a word."""
    monkeypatch.setenv(name, "tanh")
    with pytest.raises(ValueError, match=rf"unknown environment variable\(s\) {name}; valid "
                                         r"MPCORE_AMP_\* variables: MPCORE_AMP_ALLOWLIST_ADD"):
        current_lists()


def test_errors_name_the_variable_or_the_file(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """Issue 18, defect 7: an unknown op name did not say where it came from."""
    monkeypatch.setenv("MPCORE_AMP_ALLOWLIST_ADD", "foo")
    with pytest.raises(ValueError, match=r"^MPCORE_AMP_ALLOWLIST_ADD: unknown op name\(s\) 'foo'"):
        current_lists()
    monkeypatch.delenv("MPCORE_AMP_ALLOWLIST_ADD")
    path = tmp_path / "lists.json"
    path.write_text(json.dumps({"denylist_add": ["nope"]}))
    monkeypatch.setenv("MPCORE_AMP_LISTS_FILE", str(path))
    with pytest.raises(ValueError, match=rf"denylist_add of the list file '{path}'.*'nope'"):
        current_lists()


def test_bad_values_in_python_are_clear_errors() -> None:
    """Issue 18, defect 8: an int op name, None, string categories and hash() failed badly."""
    with pytest.raises(TypeError, match=r"allowlist_add takes a list of op names \(strings\), "
                                        r"got 1 \(int\)"):
        AutoMixedPrecisionLists().edit(allowlist_add=[1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"allowlist_add takes a list of op names, got None"):
        AutoMixedPrecisionLists().edit(allowlist_add=None)  # type: ignore[arg-type]
    assert AutoMixedPrecisionLists({"dense": "deny"}).category("dense") is Category.DENY
    with pytest.raises(ValueError, match=r"unknown op name\(s\) 'dense_op'"):
        AutoMixedPrecisionLists({"dense_op": "deny"})
    with pytest.raises(ValueError, match=r"'tanh' has the category 'white'; valid categories: "
                                         r"allow, deny, infer, clear or None"):
        AutoMixedPrecisionLists({"tanh": "white"})
    edited = AutoMixedPrecisionLists().edit(allowlist_add=["tanh"])
    assert hash(edited) == hash(AutoMixedPrecisionLists().edit(allowlist_add=["tanh"]))
    assert hash(edited) != hash(AutoMixedPrecisionLists())


def test_the_repr_is_short() -> None:
    """Issue 18, defect 19: the repr printed the whole table (~2,500 characters)."""
    assert repr(AutoMixedPrecisionLists()) == "AutoMixedPrecisionLists(defaults)"
    assert repr(AutoMixedPrecisionLists().edit(allowlist_add=["tanh"])) == \
        "AutoMixedPrecisionLists(tanh=allow)"
