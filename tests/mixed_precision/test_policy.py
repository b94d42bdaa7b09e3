"""Policy: names, dtypes, loss-scale defaults, config, equality, copies; the global policy and
its context-local scopes (threads, asyncio tasks); the compatibility log line."""

from __future__ import annotations

import asyncio
import copy
import logging
import pickle
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mpcore as mp
from mpcore.mixed_precision import verdict
from mpcore.mixed_precision.policy import POLICIES

EXPECTED = {
    "float16": ("float16", "float16"),
    "bfloat16": ("bfloat16", "bfloat16"),
    "float32": ("float32", "float32"),
    "float64": ("float64", "float64"),
    "mixed_float16": ("float16", "float32"),
    "mixed_bfloat16": ("bfloat16", "float32"),
    "mixed_float8": ("bfloat16", "float32"),   # FP8 GEMMs, the rest as mixed_bfloat16
}


def test_the_six_names_and_nothing_else() -> None:
    assert set(POLICIES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dtypes_name_and_repr(name: str) -> None:
    p = mp.Policy(name)
    assert p.name == name
    assert (p.compute_dtype, p.variable_dtype) == EXPECTED[name]
    assert repr(p) == f'<Policy "{name}">'
    assert p.is_mixed == name.startswith("mixed_")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_default_loss_scale(name: str) -> None:
    ls = mp.Policy(name).loss_scale
    if name == "mixed_float16":
        assert isinstance(ls, mp.DynamicLossScale)
        assert ls == mp.DynamicLossScale()
        assert ls() == 32768.0
    else:
        assert ls is None


def test_explicit_loss_scales() -> None:
    fixed = mp.Policy("mixed_float16", loss_scale=1024).loss_scale
    assert isinstance(fixed, mp.FixedLossScale)
    assert repr(fixed) == "FixedLossScale(1024.0)"
    assert mp.Policy("mixed_float16", loss_scale=None).loss_scale is None
    assert isinstance(mp.Policy("mixed_bfloat16", loss_scale="dynamic").loss_scale,
                      mp.DynamicLossScale)
    given_scale = mp.DynamicLossScale(initial_loss_scale=8.0, increment_period=3)
    assert mp.Policy("float32", loss_scale=given_scale).loss_scale is given_scale
    with pytest.raises(ValueError, match="loss_scale"):
        mp.Policy("mixed_float16", loss_scale="sometimes")


@pytest.mark.parametrize("loss_scale", ["auto", None, 1024, "dynamic",
                                        mp.DynamicLossScale(4.0, 10, 3.0)])
@pytest.mark.parametrize("name", ["mixed_float16", "float32", "mixed_bfloat16"])
def test_config_round_trip(name: str, loss_scale: object) -> None:
    p = mp.Policy(name, loss_scale=loss_scale)
    q = mp.Policy.from_config(p.get_config())
    assert q == p
    assert hash(q) == hash(p)
    assert q.name == p.name
    assert type(q.loss_scale) is type(p.loss_scale)
    if p.loss_scale is not None:
        assert q.loss_scale.get_config() == p.loss_scale.get_config()


def test_from_config_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="name"):
        mp.Policy.from_config({"compute": "float16"})
    with pytest.raises(ValueError):
        mp.Policy.from_config("mixed_float16")  # type: ignore[arg-type]


def test_equality_and_hash() -> None:
    assert mp.Policy("mixed_float16") == mp.Policy("mixed_float16")
    assert mp.Policy("mixed_float16") != mp.Policy("mixed_bfloat16")
    assert mp.Policy("mixed_float16") != mp.Policy("mixed_float16", loss_scale=None)
    assert mp.Policy("mixed_float16", loss_scale=128) != mp.Policy("mixed_float16",
                                                                   loss_scale=256)
    assert mp.Policy("float32") != "float32"
    assert len({mp.Policy("float32"), mp.Policy("float32"), mp.Policy("float16")}) == 2


def test_immutable() -> None:
    p = mp.Policy("float32")
    with pytest.raises(AttributeError):
        p.name = "float16"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p._name = "float16"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_copy_deepcopy_pickle(name: str) -> None:
    p = mp.Policy(name)
    for q in (copy.copy(p), copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert q == p
        assert q.name == name
        assert repr(q) == repr(p)
        assert type(q.loss_scale) is type(p.loss_scale)
    fixed = mp.Policy(name, loss_scale=512)
    assert pickle.loads(pickle.dumps(fixed)).loss_scale == mp.FixedLossScale(512)


# (None is Keras 3's "the global policy": tests/mixed_precision/test_policy_keras.py)
@pytest.mark.parametrize("bad", [16, 1.5, b"float32", ["float32"], mp.Policy])
def test_non_string_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="string"):
        mp.Policy(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "fp16", "Float32", "mixed_float32", " float32",
                                 "float32 "])
def test_unknown_name_lists_the_valid_ones(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        mp.Policy(bad)
    assert repr(bad) in str(info.value)
    for name in EXPECTED:
        assert name in str(info.value)


@given(st.one_of(st.text(max_size=20), st.sampled_from(sorted(EXPECTED))))
def test_any_text_is_a_valid_name_or_a_listed_error(text: str) -> None:
    try:
        p = mp.Policy(text)
    except ValueError as exc:
        assert text not in EXPECTED
        message = str(exc)
        assert all(name in message for name in EXPECTED)
    else:
        assert text in EXPECTED or text in mp.dtypes.ALL   # Keras 3: any dtype name is one
        assert p.name == text
        assert mp.Policy.from_config(p.get_config()) == p
        assert pickle.loads(pickle.dumps(p)) == p


# --- the global policy ------------------------------------------------------------------
def test_set_global_policy_and_alias() -> None:
    assert mp.global_policy() == mp.Policy("float32")
    mp.set_global_policy("float16")
    assert mp.global_policy().name == "float16"
    mp.set_policy(mp.Policy("bfloat16"))
    assert mp.global_policy().name == "bfloat16"
    mp.set_global_policy(None)
    assert mp.global_policy() == mp.Policy("float32")
    with pytest.raises(ValueError, match="mixed_float16"):
        mp.set_global_policy("half")
    assert mp.global_policy().name == "float32"  # a failed set changes nothing


def test_policy_scope_restores_on_exit_and_on_exception() -> None:
    mp.set_global_policy("float64")
    with mp.policy_scope("float16") as p:
        assert p == mp.Policy("float16")
        assert mp.global_policy().name == "float16"
        with mp.policy_scope(mp.Policy("bfloat16")):
            assert mp.global_policy().name == "bfloat16"
        assert mp.global_policy().name == "float16"
    assert mp.global_policy().name == "float64"
    with pytest.raises(KeyError), mp.policy_scope("float16"):
        raise KeyError("boom")
    assert mp.global_policy().name == "float64"


def test_policy_scope_is_thread_local() -> None:
    names = ["float16", "bfloat16"]
    barrier = threading.Barrier(2)
    seen: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            with mp.policy_scope(name):
                barrier.wait(timeout=10)  # both scopes are open at once
                seen[name] = [mp.global_policy().name]
                barrier.wait(timeout=10)
                seen[name].append(mp.global_policy().name)
            seen[name].append(mp.global_policy().name)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors
    for name in names:
        assert seen[name] == [name, name, "float32"]
    assert mp.global_policy().name == "float32"


def test_policy_scope_is_task_local() -> None:
    async def work(name: str, started: asyncio.Event, other: asyncio.Event) -> list[str]:
        with mp.policy_scope(name):
            started.set()
            await other.wait()  # the other task is inside its own scope now
            await asyncio.sleep(0)
            inside = mp.global_policy().name
        return [inside, mp.global_policy().name]

    async def main() -> list[list[str]]:
        a, b = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(work("float16", a, b), work("bfloat16", b, a))

    assert asyncio.run(main()) == [["float16", "float32"], ["bfloat16", "float32"]]


def test_mixed_precision_module_gives_the_same_objects() -> None:
    from mpcore import mixed_precision

    assert mp.mixed_precision is mixed_precision
    for name in ("Policy", "global_policy", "set_global_policy", "set_policy", "policy_scope",
                 "LossScale", "FixedLossScale", "DynamicLossScale", "check_policy"):
        assert getattr(mixed_precision, name) is getattr(mp, name), name


def test_compatibility_check_logged_once(caplog: pytest.LogCaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdict, "_logged", set())
    caplog.set_level(logging.INFO, logger="mpcore")
    mp.set_global_policy("float32")
    assert not [r for r in caplog.records if "compatibility check" in r.getMessage()]
    mp.set_global_policy("mixed_float16")
    mp.set_global_policy("float32")
    mp.set_global_policy("mixed_float16")
    records = [r for r in caplog.records if "compatibility check" in r.getMessage()]
    assert len(records) == 1
    message = records[0].getMessage()
    assert message.startswith("Mixed precision compatibility check (mixed_float16): ")
    first = message.splitlines()[0]
    assert first.endswith(("OK", "WARNING"))
    assert len(message.splitlines()) >= 2  # the reason follows
    support = mp.get_backend().policy_support("mixed_float16", mp.get_backend().device())
    assert first.endswith("OK") == support.fast
    assert records[0].levelno == (logging.INFO if support.fast else logging.WARNING)
    mp.set_global_policy("mixed_bfloat16")
    records = [r for r in caplog.records if "compatibility check" in r.getMessage()]
    assert len(records) == 2
    assert "(mixed_bfloat16)" in records[1].getMessage()
