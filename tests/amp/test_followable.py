"""The rewrite's painted trace must follow the float32 one (issue 18, defect 2): an
allowlisted softmax made the loss take another code path; a step whose path depends on a
dtype is a TraceError that names the cause, or, with fallback (jit_compile="auto"), runs
eagerly with that reason."""

from __future__ import annotations

import re

import numpy as np
import pytest
from amp_models import X, Y, float32_model, rewrite_off  # noqa: F401 - rewrite_off: autouse

import mpcore as mp
from mpcore.amp.lists import AutoMixedPrecisionLists
from mpcore.tracing.function import TraceError

MP = mp.mixed_precision


@pytest.mark.parametrize("jit", [True, "auto"])
def test_an_allowlisted_softmax_trains(jit: bool | str, backend: mp.Backend) -> None:
    """The loss scores from the softmax's logits whatever dtype softmax was painted."""
    model = float32_model()
    opt = MP.enable_mixed_precision_graph_rewrite(
        mp.optimizers.SGD(), dtype="bfloat16",
        lists=AutoMixedPrecisionLists().edit(allowlist_add=["softmax"]))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, jit_compile=jit)
    history = model.fit(X, Y, batch_size=32, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    graph = str(model._traced["train"].graph)
    assert re.search(r"\n  softmax#\d+\(\w+#\d+\) -> bfloat16  \[allowlist", graph)
    assert re.search(r"sparse_softmax_cross_entropy#\d+\(\w+#\d+\) -> float32", graph)


def _branching_step(w: mp.Variable) -> object:
    def step(x: mp.Tensor) -> mp.Tensor:
        m = mp.ops.matmul(x, w)
        # a path chosen by dtype: the painted trace (m in 16 bits) takes the other one
        return mp.ops.exp(m) if m.dtype == "float32" else mp.ops.sigmoid(mp.ops.tanh(m))
    return step


def test_a_step_the_rewrite_cannot_follow_names_the_cause() -> None:
    w = mp.Variable(np.eye(20, dtype=np.float32))
    step = mp.function(_branching_step(w))
    MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype="bfloat16")
    x = mp.constant(X)
    # the float32 pre-pass and the painted trace are one call (issue 34): the first call raises
    with pytest.raises(TraceError, match=r"ran 'tanh' as dtype decision 1 where the float32 "
                                         r"trace had 'exp'.*depends on its input's dtype"):
        step(x)
    assert step.tracing_count == 1


def test_with_fallback_it_runs_eagerly_with_the_reason() -> None:
    w = mp.Variable(np.eye(20, dtype=np.float32))
    step = mp.function(_branching_step(w), fallback=True)
    MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype="bfloat16")
    x = mp.constant(X)
    with pytest.warns(RuntimeWarning, match=r"runs eagerly: the mixed precision graph rewrite "
                                            r"could not follow"):
        step(x)
    assert step.eager_reason is not None
    assert step(x).dtype == "float32"                    # eager steps: float32


def test_a_float16_rewrite_with_a_plain_optimizer_warns_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18, defect 16: compiling with a plain optimizer instead of the one enable_...
    returned trained float16 steps without loss scaling, without a word."""
    from mpcore.amp import rewrite

    monkeypatch.setattr(rewrite, "_unscaled_warned", False)
    MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype="float16")
    model = float32_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.SGD(),
                  jit_compile=True)
    with pytest.warns(UserWarning, match=r"not a LossScaleOptimizer: it trains without loss "
                                         r"scaling.*the optimizer that enable_mixed"):
        model.fit(X, Y, batch_size=32, epochs=1, verbose=0)
    assert rewrite._unscaled_warned
    # the returned optimizer: no warning
    monkeypatch.setattr(rewrite, "_unscaled_warned", False)
    model = float32_model()
    opt = MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype="float16")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, jit_compile=True)
    model.fit(X, Y, batch_size=32, epochs=1, verbose=0)
    assert not rewrite._unscaled_warned


def test_enabling_again_with_other_settings_warns() -> None:
    """Issue 18, defect 17: a second enable_... silently replaced the dtype and the lists."""
    MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype="bfloat16")
    with pytest.warns(UserWarning, match=r"already enabled \(dtype bfloat16, "
                                         r"AutoMixedPrecisionLists\(defaults\)\); this call "
                                         r"replaces them with dtype float16"):
        MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype="float16")
    MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype="float16")  # the same


def test_loss_scale_errors_list_only_what_is_valid() -> None:
    """Issue 18, defect 11: enable_...'s loss_scale error listed None, which it rejects;
    "Dynamic" was rejected."""
    with pytest.raises(ValueError, match=r"valid: 'dynamic', a number > 0, a LossScale "
                                         r"instance$"):
        MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), loss_scale="huge")
    with pytest.raises(ValueError, match=r"needs a loss scale"):
        MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), loss_scale=None)
    for name in ("Dynamic", "DYNAMIC"):
        opt = MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), loss_scale=name)
        assert isinstance(opt.loss_scale, mp.DynamicLossScale)


@pytest.mark.parametrize("name, dtype", [("half", "float16"), ("fp16", "float16"),
                                         ("Float16", "float16"), ("bf16", "bfloat16"),
                                         ("BFloat16", "bfloat16"), (np.float16, "float16")])
def test_dtype_takes_the_usual_names(name: object, dtype: str) -> None:
    """Issue 18, defect 12: "half", "fp16", "bf16" were rejected though the docstring
    promised any numpy-like name; the error now lists the valid ones."""
    with MP.autocast(name) as scope:
        assert scope.dtype == dtype
    MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD(), dtype=name)
    MP.disable_mixed_precision_graph_rewrite()
    with pytest.raises(ValueError, match=r"one of float16, bfloat16 \(also half, fp16, bf16"):
        MP.autocast("fp8")
