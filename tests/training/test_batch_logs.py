"""``on_train_batch_end``'s logs (mp.callbacks.BatchLogs): Keras' keys ("loss" and the metrics'
running results, beside "batch" and "size"), read from the device only when a callback reads
one, and this batch's values even for a callback that keeps them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.callbacks import BatchLogs

RNG = np.random.default_rng(5)
X = RNG.standard_normal((40, 6)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)


def _model(jit: bool) -> mp.Model:
    mp.random.set_seed(3)
    model = mp.Sequential([mp.layers.Dense(8, activation="relu"), mp.layers.Dense(3),
                           mp.layers.Activation("softmax")])
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.SGD(0.1),
                  metrics=["accuracy"], jit_compile=jit)
    return model


class _Reads(mp.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, float]] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen.append({"loss": logs["loss"], "accuracy": logs["accuracy"],
                          "batch": logs["batch"], "size": logs["size"]})


class _Keeps(mp.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Any] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.kept.append(logs)        # read after training, never inside the callback


def _counting_reads(model: mp.Model, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    results = model._results

    def counted(return_dict: bool) -> Any:
        count[0] += 1
        return results(return_dict)

    monkeypatch.setattr(model, "_results", counted)
    return count


@pytest.mark.parametrize("jit", [False, True])
def test_per_batch_logs_hold_the_running_results(jit: bool) -> None:
    model, reads = _model(jit), _Reads()
    history = model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                        callbacks=[reads])
    assert [s["batch"] for s in reads.seen] == [0, 1, 2] * 2
    assert [s["size"] for s in reads.seen] == [16, 16, 8] * 2
    # the last batch's running results are the epoch's
    for epoch, last in enumerate((reads.seen[2], reads.seen[5])):
        assert last["loss"] == history.history["loss"][epoch]
        assert last["accuracy"] == history.history["accuracy"][epoch]
    # the first batch's: that batch's loss alone (a twin model's first step)
    twin = _model(jit)
    first = twin.train_on_batch(X[:16], Y[:16], return_dict=True)
    assert reads.seen[0]["loss"] == pytest.approx(first["loss"], rel=1e-6)
    assert reads.seen[0]["accuracy"] == first["accuracy"]
    assert reads.seen[1]["loss"] != reads.seen[0]["loss"]


def test_results_are_read_only_for_a_callback_that_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(False)
    reads = _counting_reads(model, monkeypatch)
    model.fit(X, Y, batch_size=16, epochs=2, verbose=0,
              callbacks=[mp.callbacks.LambdaCallback(
                  on_train_batch_end=lambda batch, logs: logs["batch"])])
    assert reads[0] == 2                       # the epochs' logs alone
    reads[0] = 0
    model.fit(X, Y, batch_size=16, epochs=2, verbose=0, callbacks=[_Reads(), _Reads()])
    assert reads[0] == 2 + 6                   # one read a batch, shared by both callbacks


@pytest.mark.parametrize("jit", [False, True])
def test_kept_logs_hold_their_own_batchs_results(jit: bool) -> None:
    model, keeps, reads = _model(jit), _Keeps(), _Reads()
    model.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[keeps, reads])
    later = [dict(logs) for logs in keeps.kept]
    assert [d["loss"] for d in later] == [s["loss"] for s in reads.seen]
    assert len({d["loss"] for d in later}) == 3
    keeps2 = _Keeps()
    _model(jit).fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                    callbacks=[keeps2])           # kept and never read inside: read at the end
    assert [logs["loss"] for logs in keeps2.kept] == [s["loss"] for s in reads.seen]


def test_batch_logs_as_a_mapping() -> None:
    reads = [0]

    def read() -> dict[str, float]:
        reads[0] += 1
        return {"loss": 0.5, "accuracy": 0.25}

    logs = BatchLogs(3, 16, ["loss", "accuracy"], read)
    assert list(logs) == ["batch", "size", "loss", "accuracy"] and len(logs) == 4
    assert "loss" in logs and "val_loss" not in logs and reads[0] == 0
    assert repr(logs) == "BatchLogs({'batch': 3, 'size': 16, 'loss': '...', 'accuracy': '...'})"
    assert dict(logs) == {"batch": 3, "size": 16, "loss": 0.5, "accuracy": 0.25}
    assert logs["accuracy"] == 0.25 and reads[0] == 1          # one read for every key
    with pytest.raises(KeyError, match=r"'val_loss'.*'batch', 'size', 'loss', 'accuracy'"):
        logs["val_loss"]
    logs["lr"] = 0.01                                           # callbacks may add keys
    del logs["accuracy"]
    assert dict(logs) == {"batch": 3, "size": 16, "lr": 0.01, "loss": 0.5}
    with pytest.raises(KeyError):
        del logs["accuracy"]
    logs.settle(kept=False)
    assert logs["loss"] == 0.5                                  # read already: still there


def test_a_result_asked_for_after_the_batch_names_what_to_do() -> None:
    logs = BatchLogs(0, 8, ["loss"], lambda: {"loss": 1.0})
    logs.settle(kept=False)                                     # nobody kept or read them
    with pytest.raises(RuntimeError, match=r"after its batch ended.*dict\(logs\)"):
        logs["loss"]


def test_under_a_distribution_per_batch_logs_hold_no_results() -> None:
    logs = BatchLogs(0, 8, ["loss"], None)                      # what fit passes there
    assert dict(logs) == {"batch": 0, "size": 8}
    with pytest.raises(KeyError, match=r"under a distribution.*on_epoch_end"):
        logs["loss"]
