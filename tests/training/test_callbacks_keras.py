"""Keras 3's callbacks in mpcore: LearningRateScheduler, ReduceLROnPlateau, CSVLogger,
TerminateOnNaN, BackupAndRestore, TensorBoard and the per-batch logs, with tests ported from
keras/src/callbacks/*_test.py (each names its source) and mpcore's own: bad input, host reads,
a resumed fit equal to an uninterrupted one (weights, optimizer state, loss scale)."""

from __future__ import annotations

import csv
import glob
import math
import os
import re
import struct
from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore import callbacks
from mpcore.optimizers import schedules

RNG = np.random.default_rng(1337)
X = RNG.random((10, 3)).astype("float32")
Y = np.eye(2, dtype="float32")[RNG.integers(0, 2, 10)]
X_TEST = RNG.random((10, 3)).astype("float32")
Y_TEST = np.eye(2, dtype="float32")[RNG.integers(0, 2, 10)]


def _model(optimizer: Any = "sgd", jit: bool | str = "auto", policy: str = "float32",
           metrics: Any = None) -> mp.Model:
    mp.random.set_seed(7)
    with mp.policy_scope(policy):
        model = mp.Sequential([mp.Input((3,)), mp.layers.Dense(5), mp.layers.Dense(2)])
        model.compile(loss="mse", optimizer=optimizer, metrics=metrics, jit_compile=jit)
    return model


# --- LearningRateScheduler ------------------------------------------------------------------
# Ported from keras/src/callbacks/learning_rate_scheduler_test.py: test_updates_learning_rate,
# test_verbose_logging (printed here: mpcore's callbacks print, as Keras' interactive logging)
def test_scheduler_updates_learning_rate(capsys: pytest.CaptureFixture[str]) -> None:
    model = _model()
    sched = callbacks.LearningRateScheduler(lambda step: 1.0 / (2.0 + step), verbose=1)
    model.fit(X, Y, callbacks=[sched], epochs=1, verbose=0)
    assert model.optimizer.learning_rate == 0.5
    assert "LearningRateScheduler setting learning rate to 0.5" in capsys.readouterr().out


# Ported from learning_rate_scheduler_test.py: test_schedule_dependent_on_previous_learning_rate,
# test_learning_rate_in_history
def test_scheduler_with_the_previous_rate_and_history() -> None:
    model = _model(mp.optimizers.Adam(0.03))
    model.fit(X, Y, callbacks=[callbacks.LearningRateScheduler(lambda step, lr: lr / 2)],
              epochs=2, verbose=0)
    assert model.optimizer.learning_rate == 0.03 / 4.0
    history = _model().fit(X, Y, epochs=1, verbose=0,
                           callbacks=[callbacks.LearningRateScheduler(lambda step, lr: 0.5)])
    assert type(history.history["learning_rate"][0]) is float
    assert history.history["learning_rate"] == [0.5]


# Ported from learning_rate_scheduler_test.py and reduce_lr_on_plateau_test.py:
# test_throws_when_optimizer_has_schedule
@pytest.mark.parametrize("callback", [
    callbacks.LearningRateScheduler(lambda step, lr: lr / 2),
    callbacks.ReduceLROnPlateau(patience=1, factor=0.1, monitor="val_loss", min_delta=100)])
def test_throws_when_optimizer_has_schedule(callback: callbacks.Callback) -> None:
    model = _model(mp.optimizers.Adam(schedules.PolynomialDecay(0.1, decay_steps=10)))
    with pytest.raises(TypeError, match="This optimizer was created with a "
                                        "`LearningRateSchedule`"):
        model.fit(X, Y, validation_data=(X_TEST, Y_TEST), callbacks=[callback], epochs=2,
                  verbose=0)


def _returning(value: Any) -> Any:
    return lambda epoch, lr: value


def test_scheduler_bad_input() -> None:
    with pytest.raises(ValueError, match="schedule must be a function"):
        callbacks.LearningRateScheduler(0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="verbose must be an integer"):
        callbacks.LearningRateScheduler(lambda e: 0.1, verbose="loud")  # type: ignore[arg-type]
    for bad in ("fast", math.nan, -0.1, None):
        with pytest.raises(ValueError, match=r"output of the `schedule` function should be a "
                                             r"float .* Got: .* at epoch 0"):
            _model().fit(X, Y, epochs=1, verbose=0,
                         callbacks=[callbacks.LearningRateScheduler(_returning(bad))])

    def raises_type_error(epoch: int, lr: float) -> float:
        raise TypeError("a bug inside the schedule")

    # not mistaken for a one-argument schedule (Keras retries on any TypeError)
    with pytest.raises(TypeError, match="a bug inside the schedule"):
        _model().fit(X, Y, epochs=1, verbose=0,
                     callbacks=[callbacks.LearningRateScheduler(raises_type_error)])


# --- ReduceLROnPlateau ----------------------------------------------------------------------
def _plateau_fit(epochs: int, **kwargs: Any) -> mp.Model:
    model = _model(mp.optimizers.Adam(0.1))
    model.fit(X, Y, validation_data=(X_TEST, Y_TEST), epochs=epochs, verbose=0,
              callbacks=[callbacks.ReduceLROnPlateau(**kwargs)])
    return model


# Ported from keras/src/callbacks/reduce_lr_on_plateau_test.py: test_reduces_lr_with_model_fit,
# test_verbose_logging, test_honors_min_lr, test_cooldown
def test_reduce_lr_on_plateau(capsys: pytest.CaptureFixture[str]) -> None:
    common = {"patience": 1, "factor": 0.1, "monitor": "val_loss"}
    model = _plateau_fit(2, min_delta=100, verbose=1, **common)
    assert model.optimizer.learning_rate == pytest.approx(0.01)
    assert "ReduceLROnPlateau reducing learning rate to 0.01" in capsys.readouterr().out
    assert _plateau_fit(4, min_delta=10, min_lr=0.005,
                        **common).optimizer.learning_rate == 0.005
    # with a cooldown of 2 epochs, the rate is reduced every other epoch: twice in 4
    cooled = _plateau_fit(4, min_delta=100, cooldown=2, **common)
    assert cooled.optimizer.learning_rate == pytest.approx(0.001)


# Ported from reduce_lr_on_plateau_test.py: test_state_reset_across_fit_calls
def test_reduce_lr_state_resets_across_fit_calls() -> None:
    reduce_lr = callbacks.ReduceLROnPlateau(patience=1, factor=0.1, monitor="loss",
                                            min_delta=0, cooldown=2)
    reduce_lr.set_model(_model())
    reduce_lr.on_train_begin()
    reduce_lr.best, reduce_lr.wait, reduce_lr.cooldown_counter = 0.5, 3, 2
    reduce_lr.on_train_begin()
    assert reduce_lr.best is None
    assert (reduce_lr.wait, reduce_lr.cooldown_counter) == (0, 0)


def test_reduce_lr_bad_input_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"does not support a factor >= 1.0"):
        callbacks.ReduceLROnPlateau(factor=1.0)
    with pytest.raises(ValueError, match="patience must be an integer >= 0, got -1"):
        callbacks.ReduceLROnPlateau(patience=-1)
    with pytest.raises(ValueError, match="mode must be auto, min or max, got 'lowest'"):
        callbacks.ReduceLROnPlateau(mode="lowest")
    with pytest.raises(ValueError, match="cooldown must be an integer >= 0"):
        callbacks.ReduceLROnPlateau(cooldown=0.5)
    with pytest.raises(ValueError, match="min_lr must be"):
        callbacks.ReduceLROnPlateau(min_lr=-1.0)
    # before any training: the keys fit's logs will hold
    with pytest.raises(ValueError, match=r"monitors 'val_acc', which fit's logs will not hold; "
                                         r"available: loss, val_loss"):
        _model().fit(X, Y, validation_data=(X_TEST, Y_TEST), epochs=1, verbose=0,
                     callbacks=[callbacks.ReduceLROnPlateau(monitor="val_acc")])


# --- CSVLogger ------------------------------------------------------------------------------
# Ported from keras/src/callbacks/csv_logger_test.py: test_CSVLogger (cases 1-3; mpcore's logs
# also hold time_per_sample, so each row has one field more than Keras')
def test_csv_logger(tmp_path: Any) -> None:
    path, sep = str(tmp_path / "log.tsv"), "\t"
    fit = {"validation_data": (X_TEST, Y_TEST), "batch_size": 4, "verbose": 0}
    _model(metrics=["accuracy"]).fit(X, Y, callbacks=[callbacks.CSVLogger(path, separator=sep)],
                                epochs=1, **fit)
    with open(path) as f:
        assert csv.Sniffer().sniff(f.read()).delimiter == sep
    model = _model(metrics=["accuracy"])
    cbks = [callbacks.CSVLogger(path, separator=sep, append=True)]
    model.fit(X, Y, callbacks=cbks, epochs=1, **fit)      # appends, no second header
    history = model.fit(X, Y, callbacks=cbks, epochs=2, **fit)  # the object reused
    with open(path) as f:
        lines = f.readlines()
    assert all(line.count(sep) == 5 for line in lines)
    assert len(lines) == 5
    assert len(re.findall("epoch", " ".join(lines))) == 1
    rows = list(csv.DictReader(open(path), delimiter=sep))   # noqa: SIM115
    assert [r["epoch"] for r in rows] == ["0", "0", "0", "1"]
    assert float(rows[-1]["val_loss"]) == history.history["val_loss"][-1]


def test_csv_logger_without_validation_writes_na_and_checks_separator(tmp_path: Any) -> None:
    path = str(tmp_path / "log.csv")
    _model().fit(X, Y, epochs=2, verbose=0, callbacks=[callbacks.CSVLogger(path)])
    rows = list(csv.DictReader(open(path)))   # noqa: SIM115
    assert list(rows[0]) == ["epoch", "loss", "time_per_sample", "val_loss",
                             "val_time_per_sample"]
    assert rows[1]["val_loss"] == "NA"
    with pytest.raises(ValueError, match="separator must be a one-character string"):
        callbacks.CSVLogger(path, separator="::")


# --- TerminateOnNaN -------------------------------------------------------------------------
def _exploding_model() -> mp.Model:
    mp.random.set_seed(3)
    big = mp.layers.initializers.Constant(1e5)
    model = mp.Sequential([mp.Input((3,))] + [
        mp.layers.Dense(2, activation="relu", kernel_initializer=big) for _ in range(5)]
        + [mp.layers.Dense(2)])
    model.compile(loss="mean_squared_error", optimizer="sgd")
    return model


# Ported from keras/src/callbacks/terminate_on_nan_test.py: test_TerminateOnNaN, and from
# csv_logger_test.py: test_stop_training_csv
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_terminate_on_nan_stops_after_the_first_epoch(tmp_path: Any,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    path = str(tmp_path / "log.csv")
    history = _exploding_model().fit(
        X, Y, batch_size=4, validation_data=(X_TEST, Y_TEST), epochs=20, verbose=0,
        callbacks=[callbacks.TerminateOnNaN(), callbacks.CSVLogger(path)])
    loss = history.history["loss"]
    assert len(loss) == 1 and not math.isfinite(loss[0])
    assert "Invalid loss, terminating training" in capsys.readouterr().out
    rows = list(csv.DictReader(open(path)))   # noqa: SIM115
    assert len(rows) == 1 and not math.isfinite(float(rows[0]["loss"]))


# Ported from terminate_on_nan_test.py: test_terminate_on_nan_raise_error_raises_error,
# test_raise_error_terminate_does_not_trigger_on_train_end,
# test_raise_error_terminate_preserves_backup
def test_terminate_on_nan_raise_error(tmp_path: Any) -> None:
    class Tracking(callbacks.Callback):
        reads_batch_results = False
        train_end_called = False

        def on_train_end(self, logs: Any = None) -> None:
            self.train_end_called = True

    model = mp.Sequential([mp.Input((1,)), mp.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.array([[1.0], [2.0]], "float32"), np.array([[np.inf], [np.inf]], "float32")
    tracking, backup = Tracking(), callbacks.BackupAndRestore(str(tmp_path / "b"), save_freq=1)
    with pytest.raises(RuntimeError, match="NaN or Inf loss encountered at batch 0"):
        model.fit(x, y, epochs=1, batch_size=1, verbose=0,
                  callbacks=[tracking, backup, callbacks.TerminateOnNaN(raise_error=True)])
    assert not tracking.train_end_called
    assert os.path.exists(tmp_path / "b" / "latest.mpck")
    with pytest.raises(ValueError, match="raise_error must be True or False"):
        callbacks.TerminateOnNaN(raise_error="yes")  # type: ignore[arg-type]


# --- per-batch logs -------------------------------------------------------------------------
@pytest.mark.parametrize("jit", [False, True])
def test_batch_logs_hold_the_loss_as_a_float_only_where_read(jit: bool) -> None:
    seen: list[Any] = []
    model = _model(jit=jit)
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0, callbacks=[callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(logs))])
    assert [type(logs["loss"]) for logs in seen] == [float] * 3
    epoch_level = [callbacks.LearningRateScheduler(lambda e: 0.01),
                   callbacks.ReduceLROnPlateau(monitor="loss"),
                   callbacks.CSVLogger(os.devnull), callbacks.BackupAndRestore("unused"),
                   callbacks.LossScaleMonitor()]
    # these add no host read per batch; TerminateOnNaN needs the loss at each batch (Keras')
    assert not callbacks.reads_batch_results(epoch_level)
    assert callbacks.reads_batch_results([*epoch_level, callbacks.TerminateOnNaN()])


# --- BackupAndRestore -----------------------------------------------------------------------
class _Interrupting(callbacks.Callback):
    """Ported from keras/src/callbacks/backup_and_restore_test.py: InterruptingCallback."""

    reads_batch_results = False

    def __init__(self, steps_int: int | None = None, epoch_int: int | None = None) -> None:
        super().__init__()
        self.batch_count = self.epoch_count = 0
        self.steps_int, self.epoch_int = steps_int, epoch_int

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.epoch_count += 1
        if self.epoch_int is not None and self.epoch_count == self.epoch_int:
            raise RuntimeError("EpochInterruption")

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batch_count += 1
        if self.steps_int is not None and self.batch_count == self.steps_int:
            raise RuntimeError("StepsInterruption")


# Ported from backup_and_restore_test.py: test_save_freq_unknown_error,
# test_backup_dir_empty_error
def test_backup_bad_input() -> None:
    for bad in ("batch", 0.15, 0, True):
        with pytest.raises(ValueError, match="Invalid value for argument `save_freq`"):
            callbacks.BackupAndRestore(backup_dir="backup_dir", save_freq=bad)  # type: ignore
    with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
        callbacks.BackupAndRestore(backup_dir="")
    with pytest.raises(ValueError, match="delete_checkpoint must be True or False"):
        callbacks.BackupAndRestore("b", delete_checkpoint=None)  # type: ignore[arg-type]


# Ported from backup_and_restore_test.py: test_best_case_epoch and test_best_case_step (the
# epochs a resumed fit runs); mpcore's addition: the resumed run ends exactly where an
# uninterrupted one does (weights, optimizer state, loss scale, shuffles)
@pytest.mark.parametrize(("policy", "jit"), [("float32", False), ("mixed_float16", True)])
def test_backup_resumes_an_interrupted_fit_exactly(tmp_path: Any, policy: str,
                                                   jit: bool) -> None:
    def make() -> mp.Model:
        opt = mp.optimizers.Adam(schedules.ExponentialDecay(0.01, 3, 0.9))
        return _model(opt, jit=jit, policy=policy)

    fit = {"batch_size": 4, "epochs": 5, "verbose": 0}
    reference = make()
    reference.fit(X, Y, **fit)

    backup_dir = str(tmp_path / "subdir")
    model = make()
    cbk = callbacks.BackupAndRestore(backup_dir=backup_dir, save_freq="epoch")
    with pytest.raises(RuntimeError, match="EpochInterruption"):
        model.fit(X, Y, callbacks=[cbk, _Interrupting(epoch_int=2)], **fit)
    assert cbk._current_epoch == 2 and os.path.exists(backup_dir)
    # a later fit trains on in between (as a crashed process would have): the backup wins
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    hist = model.fit(X, Y, callbacks=[cbk], **fit)
    assert hist.epoch == [2, 3, 4] and cbk._current_epoch == 5
    assert not os.path.exists(backup_dir)           # delete_checkpoint=True
    assert model.optimizer.iterations == reference.optimizer.iterations == 15
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(a, b)
    if policy == "mixed_float16":
        assert model.optimizer.loss_scale() == reference.optimizer.loss_scale()
        assert (model.optimizer.loss_scale.state_dict()
                == reference.optimizer.loss_scale.state_dict())
    for a, b in zip(model.optimizer.variables(), reference.optimizer.variables()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_backup_every_n_batches_restarts_the_epoch(tmp_path: Any) -> None:
    backup_dir = str(tmp_path / "b")
    model = _model()
    cbk = callbacks.BackupAndRestore(backup_dir, save_freq=1, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="StepsInterruption"):
        model.fit(X, Y, batch_size=4, epochs=2, verbose=0,
                  callbacks=[cbk, _Interrupting(steps_int=2)])
    assert cbk._current_epoch == 0
    saved = model.get_weights()
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0, shuffle=False)   # moves the weights
    seen: list[Any] = []
    restored = callbacks.LambdaCallback(
        on_train_begin=lambda logs: seen.append([w.copy() for w in model.get_weights()]))
    hist = model.fit(X, Y, batch_size=4, epochs=5, verbose=0, callbacks=[cbk, restored])
    assert hist.epoch == [0, 1, 2, 3, 4]
    for a, b in zip(seen[0], saved):
        np.testing.assert_array_equal(a, b)
    assert os.path.exists(os.path.join(backup_dir, "latest.mpck"))   # delete_checkpoint=False


def test_backup_needs_a_built_model(tmp_path: Any) -> None:
    built = _model()
    built.save_checkpoint(str(tmp_path / "latest.mpck"), epoch=1)
    unbuilt = mp.Sequential([mp.layers.Dense(2)])
    unbuilt.compile(loss="mse", optimizer="sgd")
    with pytest.raises(ValueError, match="must be built before you call `fit"):
        unbuilt.fit(X, Y, epochs=1, verbose=0,
                    callbacks=[callbacks.BackupAndRestore(str(tmp_path))])


# --- TensorBoard ----------------------------------------------------------------------------
def _events(folder: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from the event files in ``folder`` (TFRecord framing: length,
    its CRC, the Event proto, its CRC), read with tensorboardX's own proto."""
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        data = open(path, "rb").read()   # noqa: SIM115
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 16 + length
            for value in event.summary.value:
                number = (value.simple_value if value.HasField("simple_value")
                          else value.tensor.float_val[0])
                out.setdefault(value.tag, []).append((event.step, number))
    return out


# Ported from keras/src/callbacks/tensorboard_test.py: test_TensorBoard_basic,
# test_TensorBoard_learning_rate_schedules (epoch_learning_rate); mpcore's: the values
def test_tensorboard_epoch_scalars(tmp_path: Any) -> None:
    pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
    logdir = str(tmp_path / "logs")
    model = _model(mp.optimizers.SGD(schedules.CosineDecay(0.01, 1)))
    history = model.fit(X, Y, batch_size=4, epochs=2, validation_data=(X_TEST, Y_TEST),
                        verbose=0, callbacks=[callbacks.TensorBoard(log_dir=logdir)])
    train, val = _events(os.path.join(logdir, "train")), _events(os.path.join(logdir,
                                                                              "validation"))
    assert set(train) == {"epoch_loss", "epoch_learning_rate", "epoch_time_per_sample"}
    assert set(val) == {"epoch_loss"}
    np.testing.assert_allclose([v for _, v in train["epoch_loss"]], history.history["loss"],
                               rtol=1e-6)
    np.testing.assert_allclose([v for _, v in val["epoch_loss"]], history.history["val_loss"],
                               rtol=1e-6)
    assert [s for s, _ in train["epoch_loss"]] == [0, 1]
    assert [v for _, v in train["epoch_learning_rate"]] == [0.0, 0.0]   # decayed by step 1


# Ported from tensorboard_test.py: test_TensorBoard_batch_metrics; mpcore's: the loss scale
def test_tensorboard_batch_scalars_and_loss_scale(tmp_path: Any) -> None:
    pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
    logdir = str(tmp_path / "logs")
    model = _model(policy="mixed_float16")
    board = callbacks.TensorBoard(log_dir=logdir, update_freq=1)
    assert callbacks.reads_batch_results([board])
    assert not callbacks.reads_batch_results([callbacks.TensorBoard(logdir)])
    model.fit(X, Y, batch_size=4, epochs=2, verbose=0, callbacks=[board])
    train = _events(os.path.join(logdir, "train"))
    assert {"batch_loss", "batch_learning_rate", "batch_loss_scale", "epoch_loss",
            "epoch_loss_scale", "epoch_learning_rate"} <= set(train)
    assert [s for s, _ in train["batch_loss"]] == [1, 2, 3, 4, 5, 6]
    assert train["epoch_loss_scale"] == [(0, 32768.0), (1, 32768.0)]
    # (event files hold float32)
    assert [v for _, v in train["epoch_learning_rate"]] == [pytest.approx(0.01)] * 2


def test_tensorboard_bad_input() -> None:
    pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
    with pytest.raises(ValueError, match="update_freq must be 'epoch', 'batch' or an integer"):
        callbacks.TensorBoard(update_freq="step")
    with pytest.raises(ValueError, match=r"does not support profile_batch .* supported: "
                                         "log_dir, histogram_freq"):
        callbacks.TensorBoard(profile_batch=5)
