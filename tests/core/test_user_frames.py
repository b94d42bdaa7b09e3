"""Warnings raised deep inside mpcore name the user's line (the first frame outside mpcore and
its plugins), not a line of mpcore: a trial found the graph rewrite's warning pointing into
mpcore/amp/rewrite.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpcore as mp
from mpcore.core import user_frames


def test_stacklevel_names_the_first_frame_outside_mpcore() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("here", UserWarning, stacklevel=user_frames.stacklevel())
    assert caught[0].filename == __file__


def test_a_loss_scale_optimizer_warning_from_fit_names_the_fit_call() -> None:
    mp.set_global_policy("float32")
    model = mp.Sequential([mp.layers.Dense(3)])
    opt = mp.mixed_precision.LossScaleOptimizer(mp.optimizers.SGD())
    model.compile(loss="mse", optimizer=opt, jit_compile=False)
    x = np.ones((4, 2), np.float32)
    model.fit(x, np.ones((4, 3), np.float32), verbose=0)   # builds it
    with pytest.warns(UserWarning, match="You forgot to call") as caught:
        with mp.GradientTape() as tape:
            loss = mp.ops.mean(model(mp.constant(x)))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
    assert caught[0].filename == __file__


def test_the_rewrite_warning_names_the_fit_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpcore.amp import rewrite

    monkeypatch.setattr(rewrite, "_unscaled_warned", False)
    mp.set_global_policy("float32")
    mp.mixed_precision.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype="float16")
    try:
        model = mp.Sequential([mp.Input((4,)), mp.layers.Dense(3)])
        model.compile(loss="mse", optimizer=mp.optimizers.SGD(), jit_compile=True)
        with pytest.warns(UserWarning, match="not a LossScaleOptimizer") as caught:
            model.fit(np.ones((8, 4), np.float32), np.ones((8, 3), np.float32), batch_size=4,
                      verbose=0)
        assert [w.filename for w in caught if "LossScale" in str(w.message)] == [__file__]
    finally:
        mp.mixed_precision.disable_mixed_precision_graph_rewrite()


def test_a_users_single_file_module_named_mpcore_something_is_the_users(
        tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-trial: importing a user's mpcore_helpers.py made its folder count as mpcore's."""
    import importlib
    import sys

    (tmp_path / "mpcore_helpers.py").write_text(  # type: ignore[operator]
        "import warnings\nfrom mpcore import user_frames\n"
        "def warn():\n"
        "    warnings.warn('here', UserWarning, stacklevel=user_frames.stacklevel())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    helpers = importlib.import_module("mpcore_helpers")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            helpers.warn()
        assert caught[0].filename.endswith("mpcore_helpers.py")
    finally:
        sys.modules.pop("mpcore_helpers", None)
