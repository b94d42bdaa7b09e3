"""``on_train_batch_end``'s logs: as Keras gives them, a dict with the loss's and metrics'
running results beside "batch" and "size", read at each batch's end only where a callback has
that hook (a host read per batch), and not at all otherwise."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.callbacks import CallbackList, batch_logs, per_batch_results, reads_batch_results

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


class _Keeps(mp.callbacks.Callback):
    """Keeps the logs themselves and a deep copy, read only after training."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Any] = []
        self.copies: list[Any] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.kept.append(logs)
        self.copies.append(copy.deepcopy(logs))


class _Resets(mp.callbacks.Callback):
    """The Keras idiom for per-batch metrics: reset after each batch."""

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.model.reset_metrics()


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
    model, keeps = _model(jit), _Keeps()
    history = model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                        callbacks=[keeps])
    seen = keeps.kept
    assert all(type(logs) is dict for logs in seen)
    assert [s["batch"] for s in seen] == [0, 1, 2] * 2
    assert [s["size"] for s in seen] == [16, 16, 8] * 2
    assert seen == keeps.copies                  # kept logs are that batch's values
    # the last batch's running results are the epoch's
    for epoch, last in enumerate((seen[2], seen[5])):
        assert last["loss"] == history.history["loss"][epoch]
        assert last["accuracy"] == history.history["accuracy"][epoch]
    # the first batch's: that batch's loss alone (a twin model's first step)
    first = _model(jit).train_on_batch(X[:16], Y[:16], return_dict=True)
    assert seen[0]["loss"] == pytest.approx(first["loss"], rel=1e-6)
    assert seen[0]["accuracy"] == first["accuracy"]
    assert len({s["loss"] for s in seen}) == 6


def test_results_are_read_only_where_a_callback_has_the_batch_hook(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(False)
    reads = _counting_reads(model, monkeypatch)
    fit = dict(x=X, y=Y, batch_size=16, epochs=2, verbose=0)
    model.fit(**fit, callbacks=[mp.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: None),
                                mp.callbacks.LossScaleMonitor()])
    assert reads[0] == 2                       # the epochs' logs alone
    for callbacks in ([mp.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: None)],
                      [_Keeps(), _Keeps()], [CallbackList([_Keeps()])]):
        reads[0] = 0
        model.fit(**fit, callbacks=callbacks)
        assert reads[0] == 2 + 6               # one read a batch, however many read them


@pytest.mark.parametrize("jit", [False, True])
def test_a_batchs_logs_are_read_before_any_callback_runs(jit: bool) -> None:
    model, keeps = _model(jit), _Keeps()
    model.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[_Resets(), keeps])      # resets before the keeper's hook
    # each batch's own results: the running mean restarted at every batch
    twin = _model(jit)
    for logs, lo in zip(keeps.kept, (0, 16, 32)):
        alone = twin.train_on_batch(X[lo:lo + 16], Y[lo:lo + 16], return_dict=True)
        assert logs["loss"] == pytest.approx(alone["loss"], rel=1e-6)
        assert logs["accuracy"] == alone["accuracy"]


def test_reads_batch_results() -> None:
    class Records(mp.callbacks.Callback):
        reads_batch_results = False

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None: ...

    assert not reads_batch_results([])
    assert not reads_batch_results([mp.callbacks.EarlyStopping(), Records(),
                                    mp.callbacks.LossScaleHistory(),
                                    mp.callbacks.LambdaCallback(on_epoch_end=print)])
    assert reads_batch_results([_Keeps()])
    assert reads_batch_results([mp.callbacks.LambdaCallback(on_train_batch_end=print)])
    assert reads_batch_results([CallbackList([Records(), CallbackList([_Resets()])])])

    class ReadsLosses(mp.callbacks.LossScaleMonitor):   # its own hook: the flag is not its
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            super().on_train_batch_end(batch, logs)

    assert not reads_batch_results([mp.callbacks.LossScaleMonitor()])
    assert reads_batch_results([ReadsLosses()])


def test_no_per_batch_results_under_a_distribution(caplog: pytest.LogCaptureFixture) -> None:
    """A rank's callbacks may differ, and the results are a read every rank makes at once."""
    with caplog.at_level("WARNING", logger="mpcore"):
        assert not per_batch_results([_Keeps()], world_size=2)
    assert "no loss or metrics under a distribution" in caplog.text
    caplog.clear()
    assert per_batch_results([_Keeps()], world_size=1)
    assert not per_batch_results([_Resets.__base__()], world_size=2) and not caplog.text


def test_batch_logs() -> None:
    assert batch_logs(3, 16, None) == {"batch": 3, "size": 16}
    assert batch_logs(3, 16, {"loss": 0.5, "size": 0.25}) == {"batch": 3, "size": 0.25,
                                                              "loss": 0.5}
