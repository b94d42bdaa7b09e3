"""Checkpoint integrity: a SHA-256 over everything restored (one flipped bit anywhere is an error
naming the file, never a silent load), truncated files, old checksum-less files, missing keys."""

from __future__ import annotations

import logging
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpcore as mp
from mpcore import layers
from mpcore.checkpoint import checkpoint

RNG = np.random.default_rng(7)
X = RNG.standard_normal((16, 10)).astype(np.float32)
Y = RNG.integers(0, 3, 16)


def trained_model(policy: str = "float32", seed: int = 0) -> mp.Model:
    mp.set_global_policy(policy)
    mp.random.set_seed(seed)
    model = mp.Sequential([mp.Input((10,)), layers.Dense(8, activation="relu"), layers.Dense(3),
                           layers.Activation("softmax", dtype="float32")])
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.Adam(0.01))
    for i in range(0, 16, 8):
        model.train_on_batch(X[i:i + 8], Y[i:i + 8])
    return model


def first_slot(model: mp.Model) -> np.ndarray:
    state = model.optimizer.get_state(model.trainable_variables)
    state = state.get("inner", state)
    return np.asarray(next(iter(state["slots"][0].values())))


def flip_bit(path: Path, needle: bytes, bit: int) -> None:
    """Flip ``bit`` of the first byte where ``needle`` sits in ``path`` (it must occur once)."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, "needle must occur exactly once"
    data[at + bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def assert_same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("part", ["weights", "optimizer slot", "loss scale", "metadata"])
def test_one_flipped_bit_is_an_error_naming_the_file(tmp_path: Path, part: str) -> None:
    model = trained_model("mixed_float16")
    # a loss-scale state unlike its config's initial value, so its bytes occur once
    model.optimizer.loss_scale.load_state_dict({"current_loss_scale": 1234.5,
                                                "num_good_steps": 7})
    path = tmp_path / "run.mpck"
    model.save_checkpoint(str(path), note="half way")
    # bit 30 of a float32 is its top exponent bit: 0.081 becomes ~2.8e37, the case
    needle, bit = {
        "weights": (model.get_weights()[0][:1].tobytes(), 30),
        "optimizer slot": (first_slot(model)[:1].tobytes(), 30),
        "loss scale": (struct.pack(">d", 1234.5), 1),
        "metadata": (b"half way", 0),
    }[part]
    flip_bit(path, needle, bit)
    fresh = trained_model("mixed_float16", seed=3)
    before = fresh.get_weights()
    with pytest.raises(ValueError, match="checksum") as info:
        fresh.load_checkpoint(str(path))
    assert str(path) in str(info.value)
    assert_same(fresh.get_weights(), before)  # nothing was restored from the damaged file


def test_weights_file_has_a_checksum_too(tmp_path: Path) -> None:
    model = trained_model()
    path = tmp_path / "w.weights"
    model.save_weights(str(path))
    flip_bit(path, model.get_weights()[0][:1].tobytes(), 30)
    with pytest.raises(ValueError, match="checksum") as info:
        trained_model(seed=1).load_weights(str(path))
    assert str(path) in str(info.value)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, mp.Model, Path]:
    folder = tmp_path_factory.mktemp("saved")
    model = trained_model()
    model.save_checkpoint(str(folder / "c.mpck"), note="x")
    return (folder / "c.mpck").read_bytes(), trained_model(seed=5), folder


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_single_bit_flip_or_truncation_is_a_clear_error(
        saved: tuple[bytes, mp.Model, Path], data: st.DataObject) -> None:
    good, model, folder = saved
    damaged = bytearray(good)
    if data.draw(st.booleans(), label="truncate"):
        damaged = damaged[:data.draw(st.integers(0, len(good) - 1), label="length")]
    else:
        bit = data.draw(st.integers(0, 8 * len(good) - 1), label="bit")
        damaged[bit // 8] ^= 1 << (bit % 8)
    path = folder / "damaged.mpck"
    path.write_bytes(bytes(damaged))
    with pytest.raises(ValueError) as info:
        model.load_checkpoint(str(path))
    assert str(path) in str(info.value)


def test_old_checksumless_file_still_loads_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = trained_model("mixed_float16")
    path = tmp_path / "new.mpck"
    model.save_checkpoint(str(path), epoch=2)
    old = tmp_path / "old.mpck"  # what mpcore wrote before checksums: the bare pickle
    old.write_bytes(pickle.dumps(checkpoint.read(path, checkpoint.FORMAT),
                                 protocol=pickle.HIGHEST_PROTOCOL))
    fresh = trained_model("mixed_float16", seed=9)
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        assert fresh.load_checkpoint(str(old)) == {"epoch": 2}
    assert_same(fresh.get_weights(), model.get_weights())
    assert str(old) in caplog.text and "no checksum" in caplog.text


@pytest.mark.parametrize("container", ["checksummed", "old"])
def test_missing_keys_are_named(tmp_path: Path, container: str) -> None:
    model = trained_model()
    path = tmp_path / "partial.mpck"
    payload = {"format": checkpoint.FORMAT, "version": checkpoint.VERSION,
               "values": model.get_weights(), "random": mp.random.get_state()}
    if container == "old":
        path.write_bytes(pickle.dumps(payload))
    else:
        checkpoint.atomic_write(path, payload)
    with pytest.raises(ValueError, match=r"missing.*'extra', 'names', 'optimizer', "
                                         r"'train_step'") as info:
        model.load_checkpoint(str(path))
    assert str(path) in str(info.value)


def test_names_and_values_must_pair_up(tmp_path: Path) -> None:
    model = trained_model()
    path = tmp_path / "w.weights"
    checkpoint.atomic_write(path, {"format": checkpoint.WEIGHTS_FORMAT,
                                   "version": checkpoint.VERSION, "names": ["only_one"],
                                   "values": model.get_weights()})
    with pytest.raises(ValueError, match="1 names and 4 values") as info:
        model.load_weights(str(path))
    assert str(path) in str(info.value)
