"""Callbacks for ``Model.fit``, Keras 3's names and behaviour: History, ModelCheckpoint,
EarlyStopping, LambdaCallback, LearningRateScheduler, ReduceLROnPlateau, CSVLogger,
TerminateOnNaN, BackupAndRestore, TensorBoard; and mpcore's LossScaleHistory and
LossScaleMonitor.

``logs`` hold Python floats (already read from the device), so callbacks add no host reads of
their own except where they say so. As Keras does, ``fit`` reads the loss and metrics for
``on_train_batch_end``'s logs only where a callback has that hook (:func:`reads_batch_results`:
a host read per batch). ``fit`` lists the keys its epoch logs will hold in ``params["metrics"]``
(as Keras 2), so a callback checks the keys it needs at ``on_train_begin``, before any
training. One module per callback family, as Keras' ``keras/src/callbacks/``; every name is
exported here (``mp.callbacks.X``, ``from mpcore.callbacks import X``).
"""

from mpcore.callbacks.backup_and_restore import BackupAndRestore
from mpcore.callbacks.base import (
    Callback,
    CallbackList,
    EarlyStopping,
    History,
    LambdaCallback,
    LossScaleHistory,
    LossScaleMonitor,
    ModelCheckpoint,
    batch_logs,
    per_batch_results,
    reads_batch_results,
)
from mpcore.callbacks.csv_logger import CSVLogger
from mpcore.callbacks.learning_rate import LearningRateScheduler, ReduceLROnPlateau
from mpcore.callbacks.tensorboard import TensorBoard
from mpcore.callbacks.terminate_on_nan import TerminateOnNaN

__all__ = ["BackupAndRestore", "CSVLogger", "Callback", "CallbackList", "EarlyStopping",
           "History", "LambdaCallback", "LearningRateScheduler", "LossScaleHistory",
           "LossScaleMonitor", "ModelCheckpoint", "ReduceLROnPlateau", "TensorBoard",
           "TerminateOnNaN", "batch_logs", "per_batch_results", "reads_batch_results"]
