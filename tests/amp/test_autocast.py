"""autocast: the lists' decision made op by op, eagerly (allow ops in 16 bits, deny ops in
float32, infer and clear ops follow their inputs), context-local, on float32 models only."""

from __future__ import annotations

import contextvars
import threading

import numpy as np
import pytest
from amp_models import X, float32_model, rewrite_off  # noqa: F401 - rewrite_off: autouse

import mpcore as mp
from mpcore.amp.lists import AutoMixedPrecisionLists

autocast = mp.mixed_precision.autocast


def test_allow_ops_go_to_16_bits_deny_ops_stay_float32_others_follow() -> None:
    a, b = mp.constant(X[:4, :4]), mp.Variable(np.eye(4, dtype=np.float32))
    with autocast("bfloat16"):
        m = mp.ops.matmul(a, b)                 # allow
        t = mp.ops.tanh(m)                      # infer: follows its bfloat16 input
        r = mp.ops.relu(t)                      # clear: follows
        mixed = mp.ops.add(t, a)                # infer on bfloat16 and float32: float32
        s = mp.ops.softmax(r)                   # deny
        total = mp.ops.sum(r)                   # deny
    assert (m.dtype, t.dtype, r.dtype, mixed.dtype) == ("bfloat16",) * 3 + ("float32",)
    assert s.dtype == total.dtype == "float32"
    assert b.dtype == "float32"                 # the variable itself is untouched
    np.testing.assert_allclose(m.numpy().astype(np.float32), X[:4, :4], rtol=1e-2)
    assert mp.ops.matmul(a, b).dtype == "float32"        # outside: float32 again


def test_a_float32_model_runs_its_dense_layers_in_16_bits() -> None:
    model = float32_model()
    expected = model(X).numpy()
    with autocast("float16"):
        out = model(X)
        hidden = model.get_layer("dense_1")(mp.constant(X))
    assert hidden.dtype == "float16" and out.dtype == "float32"
    np.testing.assert_allclose(out.numpy(), expected, atol=2e-3)
    assert all(w.dtype == np.float32 for w in model.get_weights())


def test_gradients_flow_and_float32_variables_get_float32_gradients() -> None:
    w = mp.Variable(np.full((20, 3), 0.1, np.float32))
    with autocast("bfloat16"), mp.GradientTape() as tape:
        loss = mp.ops.mean(mp.ops.square(mp.ops.matmul(mp.constant(X), w)))
    grad = tape.gradient(loss, w)
    assert loss.dtype == "float32" and grad.dtype == "float32"
    with mp.GradientTape() as tape:
        ref = mp.ops.mean(mp.ops.square(mp.ops.matmul(mp.constant(X), w)))
    np.testing.assert_allclose(grad.numpy(), tape.gradient(ref, w).numpy(), rtol=0.05,
                               atol=1e-3)


def test_it_is_context_local_and_nests() -> None:
    a = mp.constant(X[:4, :4])
    seen: dict[str, str] = {}

    def other() -> None:
        seen["thread"] = mp.ops.matmul(a, a).dtype

    with autocast("bfloat16"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=30)
        with autocast("float16"):
            assert mp.ops.matmul(a, a).dtype == "float16"
        assert mp.ops.matmul(a, a).dtype == "bfloat16"
        ctx = contextvars.Context()
        assert ctx.run(lambda: mp.ops.matmul(a, a).dtype) == "float32"
    assert seen == {"thread": "float32"}


def test_edited_lists_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    a = mp.constant(X[:4, :4])
    with autocast("bfloat16", lists=AutoMixedPrecisionLists().edit(allowlist_add=["tanh"])):
        assert mp.ops.tanh(a).dtype == "bfloat16"
    monkeypatch.setenv("MPCORE_AMP_ALLOWLIST_REMOVE", "matmul")
    with autocast("bfloat16"):
        assert mp.ops.matmul(a, a).dtype == "float32"


def test_a_traced_step_inside_is_not_replayed_outside() -> None:
    w = mp.Variable(np.eye(20, dtype=np.float32))

    @mp.function
    def step(x: mp.Tensor) -> mp.Tensor:
        return mp.ops.matmul(x, w)

    x = mp.constant(X)
    with autocast("bfloat16"):
        assert step(x).dtype == step(x).dtype == "bfloat16"
    assert step(x).dtype == "float32"


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"dtype must be one of float16, bfloat16.*'int8'"), \
            autocast("int8"):
        pass
    mp.set_global_policy("mixed_float16")
    with pytest.raises(ValueError, match=r"autocast runs float32 models.*'mixed_float16'"), \
            autocast("bfloat16"):
        pass


def test_a_weight_cast_cached_before_a_trace_is_not_replayed_stale() -> None:
    """A variable's cast cached eagerly (Variable.read_as) must not be captured by a trace as
    a constant: after the variable changes, a replay casts its new value."""
    w = mp.Variable(np.eye(4, dtype=np.float32))
    x = mp.constant(np.ones((2, 4), np.float32))
    step = mp.function(lambda x: mp.ops.matmul(x, w))
    with autocast("bfloat16"):
        mp.ops.matmul(x, w)                       # caches w in bfloat16
        np.testing.assert_array_equal(step(x).numpy().astype(np.float32), np.ones((2, 4)))
        w.assign(w * 2.0)
        np.testing.assert_array_equal(step(x).numpy().astype(np.float32), np.full((2, 4), 2))
    # the same for a mixed policy layer's weight read
    with mp.policy_scope("mixed_bfloat16"):
        dense = mp.layers.Dense(4, use_bias=False, kernel_initializer="ones")
        traced = mp.function(lambda x: dense(x))
        dense(x)
        first = traced(x).numpy().astype(np.float32)
        dense.kernel.assign(dense.kernel * 2.0)
        np.testing.assert_array_equal(traced(x).numpy().astype(np.float32), 2 * first)
