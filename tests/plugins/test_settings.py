"""mpcore.plugins.settings.env_choice: the one parser of every MPCORE_* setting with fixed
values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpcore.plugins.settings import env_choice

CHOICES = ("auto", "force", "off")
NAME = "MPCORE_TEST_SETTING"


@given(st.sampled_from(CHOICES), st.sampled_from([str.lower, str.upper, str.title]),
       st.text(" \t\n", max_size=3), st.text(" \t\n", max_size=3))
def test_valid_values_in_any_case_and_padding(choice: str, case: object, left: str,
                                              right: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(NAME, left + case(choice) + right)  # type: ignore[operator]
        assert env_choice(NAME, CHOICES) == choice


# environment values: no NUL, no surrogates or other control characters
_VALUES = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1)


@given(_VALUES.filter(lambda t: t.strip() and t.strip().lower() not in CHOICES))
def test_anything_else_names_the_variable_the_value_and_the_choices(value: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(NAME, value)
        with pytest.raises(ValueError) as err:
            env_choice(NAME, CHOICES)
    message = str(err.value)
    assert message.startswith(f"{NAME}={value!r} is not valid")
    assert message.endswith("valid values: auto, force, off")


def test_unset_or_blank_gives_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert env_choice(NAME, CHOICES) == "auto"
    assert env_choice(NAME, CHOICES, default="off") == "off"
    monkeypatch.setenv(NAME, "  ")
    assert env_choice(NAME, CHOICES, default="force") == "force"
