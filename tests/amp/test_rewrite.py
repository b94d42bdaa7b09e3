"""enable_mixed_precision_graph_rewrite: the seed's example, its errors, what the rewritten
traced step computes in (painted dtypes, casts at boundaries only, float32 variables, loss and
gradients), the eager-step message, forced overflow under float16, and printing the graph."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from amp_models import X, Y, float32_model, rewrite_off  # noqa: F401 - rewrite_off: autouse

import mpcore as mp
from mpcore.amp import rewrite
from mpcore.core.categories import Category
from mpcore.ops import dispatch
from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

enable = mp.mixed_precision.enable_mixed_precision_graph_rewrite
disable = mp.mixed_precision.disable_mixed_precision_graph_rewrite


def _train_graph(model: mp.Model) -> str:
    return str(model.train_function.graph)


@pytest.mark.usefixtures("on_cpu")   # names the CPU's fused dense op
def test_the_seeds_example_word_for_word() -> None:
    mp.random.set_seed(1)
    x_train, y_train = X, Y
    x = X[:8]
    model = float32_model()
    opt = mp.optimizers.SGD()
    opt = mp.mixed_precision.enable_mixed_precision_graph_rewrite(opt, loss_scale="dynamic")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=128, epochs=5)   # traced steps, rewritten
    mp.mixed_precision.disable_mixed_precision_graph_rewrite()

    with mp.mixed_precision.autocast("bfloat16"):           # eager, per op, same lists
        y = model(x)

    assert isinstance(opt, LossScaleOptimizer) and opt.loss_scale() == 2.0**15
    assert "dense(bfloat16[128, 20], bfloat16[20, 32]" in _train_graph(model)
    assert y.dtype == "float32" and y.shape == (8, 4)
    assert all(w.dtype == np.float32 for w in model.get_weights())


def test_the_errors() -> None:
    with pytest.raises(TypeError, match=r"must be an mp.optimizers.Optimizer, got str 'sgd'"):
        enable("sgd")
    with pytest.raises(ValueError, match=r"already a LossScaleOptimizer"):
        enable(mp.LossScaleOptimizer(mp.optimizers.SGD()))
    with pytest.raises(ValueError, match=r"dtype must be one of float16, bfloat16"):
        enable(mp.optimizers.SGD(), dtype="float32")
    with pytest.raises(ValueError, match="invalid loss_scale 'huge'"):
        enable(mp.optimizers.SGD(), loss_scale="huge")
    mp.set_global_policy("mixed_bfloat16")
    with pytest.raises(ValueError,
                       match=r"the policy here is 'mixed_bfloat16' \(the global policy\)"):
        enable(mp.optimizers.SGD())
    mp.set_global_policy(None)
    enable(mp.optimizers.SGD())
    with pytest.raises(ValueError, match=r"'mixed_float16' while the mixed precision graph "
                                         "rewrite is enabled"):
        mp.set_global_policy("mixed_float16")
    assert mp.global_policy().name == "float32"
    disable()
    mp.set_global_policy("mixed_float16")   # allowed again


@pytest.mark.parametrize("loss_scale, expected", [
    ("dynamic", "DynamicLossScale"), (128, "FixedLossScale(128.0)"),
    (mp.FixedLossScale(4), "FixedLossScale(4.0)")])
def test_it_returns_the_optimizer_wrapped(loss_scale: object, expected: str) -> None:
    inner = mp.optimizers.RMSprop()
    opt = enable(inner, loss_scale=loss_scale)
    assert isinstance(opt, LossScaleOptimizer) and opt.inner_optimizer is inner
    assert repr(opt.loss_scale).startswith(expected)


@pytest.mark.usefixtures("on_cpu")   # names the CPU's fused dense op
def test_the_rewritten_step_paints_casts_and_keeps_float32_where_it_must() -> None:
    model = float32_model()
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=enable(mp.optimizers.SGD(0.1), dtype="bfloat16"))
    before = [w.copy() for w in model.get_weights()]
    # the first call records the float32 op graph in a pre-pass whose effects are put back,
    # then traces painted (issue 34): its graph is the painted one
    model.train_on_batch(X, Y)
    fn = model.train_function
    assert "mixed precision graph rewrite (bfloat16)" in str(fn.graph)
    count = fn.tracing_count
    model.train_on_batch(X, Y)          # replayed
    model.train_on_batch(X, Y)
    assert fn.tracing_count == count
    graph = str(fn.graph)
    kernels = graph.split("\n\n")[0].splitlines()
    # the three dense layers (allow) and every gradient matmul in bfloat16
    assert sum(line.startswith("dense(bfloat16") for line in kernels) == 3
    assert all("-> bfloat16" in line for line in kernels if line.startswith("matmul("))
    # softmax, the loss and its mean (deny) in float32
    for op in ("softmax(float32", "sparse_softmax_cross_entropy(float32", "mean(float32"):
        assert any(line.startswith(op) for line in kernels), op
    # each of the 6 float32 variables is cast once to bfloat16, and its gradient back once
    casts = [line for line in kernels if line.startswith("cast(")]
    to_low = [c for c in casts if c.startswith("cast(float32") and "'bfloat16')" in c]
    to_float32 = [c for c in casts if c.startswith("cast(bfloat16") and "'float32')" in c]
    assert len(to_low) + len(to_float32) == len(casts)    # no other casts
    # the input batch, the three kernels and the three biases (two of shape [32])
    for shape, n in {"[128, 20]": 1, "[20, 32]": 1, "[32, 32]": 1, "[32, 4]": 1, "[32]": 2,
                     "[4]": 1}.items():
        assert sum(c.startswith(f"cast(float32{shape}") for c in to_low) == n, shape
    for shape in ("[20, 32]", "[32, 32]", "[32, 4]"):       # the kernels' gradients
        assert sum(c.startswith(f"cast(bfloat16{shape}") for c in to_float32) == 1, shape
    # variables stay float32 and were trained
    after = model.get_weights()
    assert all(w.dtype == np.float32 for w in after)
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))
    # the summary names each op's painted dtype and rule
    assert "mixed precision graph rewrite (bfloat16)" in graph
    assert "dense#0() -> bfloat16  [allowlist: dense is on the allowlist]" in graph
    assert "softmax#" in graph and "[denylist: softmax is on the denylist]" in graph
    assert "[between allow ops: downstream and upstream of allowlist ops]" in graph


def test_the_rewritten_step_tracks_the_float32_step(backend: mp.Backend) -> None:
    losses = {}
    for rewritten in (False, True):
        model = float32_model(seed=3)
        opt = mp.optimizers.SGD(0.05)
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=enable(opt, dtype="bfloat16") if rewritten else opt)
        losses[rewritten] = [model.train_on_batch(X, Y) for _ in range(30)]
        disable()
    np.testing.assert_allclose(losses[True], losses[False], rtol=0.03)
    assert losses[True][-1] < 0.8 * losses[True][0]
    kernels = _train_graph(model).split("\n\n")[0]
    assert "dense(bfloat16" in kernels or "matmul(bfloat16" in kernels


def test_a_traced_function_is_rewritten_and_disable_traces_again() -> None:
    w = mp.Variable(np.eye(20, dtype=np.float32))

    @mp.function
    def step(x: mp.Tensor) -> mp.Tensor:
        return mp.ops.sum(mp.ops.tanh(mp.ops.matmul(mp.ops.matmul(x, w), w)))

    x = mp.constant(X)
    expected = step(x).numpy()
    enable(mp.optimizers.SGD(), dtype="float16")
    results = [step(x).numpy() for _ in range(3)]
    graph = str(step.graph)
    assert graph.count("matmul(float16") == 2 and "sum(float32" in graph
    assert "tanh(float32" in graph           # infer, not between allow ops
    np.testing.assert_allclose(results, [expected] * 3, rtol=1e-2)
    assert graph.count("cast(float32[20, 20], 'float16')") == 1   # w: cast once per step
    disable()
    # the float32 program of the first call is replayed again
    np.testing.assert_array_equal(step(x).numpy(), expected)
    assert step.tracing_count == 2          # float32, then painted (its pre-pass uncounted)


def test_an_eager_step_logs_once_that_the_rewrite_applies_to_traced_steps(
        caplog: pytest.LogCaptureFixture) -> None:
    model = float32_model()
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=enable(mp.optimizers.SGD()), jit_compile=False)
    rewrite._eager_logged = False
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        for _ in range(3):
            model.train_on_batch(X, Y)
    messages = [r.getMessage() for r in caplog.records if "only applies to traced" in
                r.getMessage()]
    assert len(messages) == 1


def test_an_eager_fit_with_a_plain_optimizer_says_so_too(
        caplog: pytest.LogCaptureFixture) -> None:
    # found by a re-trial: compiled with its own optimizer, not the one enable returned
    enable(mp.optimizers.SGD())
    model = float32_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.SGD(),
                  jit_compile=False)
    rewrite._eager_logged = False
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        model.train_on_batch(X, Y)
    assert any("only applies to traced" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("on_cpu")   # names the CPU's fused dense op
def test_forced_overflow_skips_steps_and_recovers() -> None:
    model = float32_model(units=32, seed=4)
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=enable(mp.optimizers.SGD(0.05), dtype="float16"))
    # as the mixed_float16 test: forward finite in float16, gradients times 2**15 overflow
    model.set_weights([w * 8.0 for w in model.get_weights()])
    opt = model.optimizer
    losses = []
    for _ in range(40):
        before, skipped = model.get_weights(), opt.skipped_steps
        losses.append(model.train_on_batch(X[:32], Y[:32]))
        if opt.skipped_steps > skipped:
            for a, b in zip(before, model.get_weights()):
                np.testing.assert_array_equal(a, b)
    assert "dense(float16" in _train_graph(model)
    assert opt.skipped_steps >= 1 and opt.loss_scale() < 2**15
    assert np.isfinite(losses[-1]) and losses[-1] < losses[0]
    assert all(w.dtype == np.float32 for w in model.get_weights())


@pytest.mark.usefixtures("on_cpu")   # names the CPU's fused dense op
def test_edited_lists_and_a_backends_overrides_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_AMP_ALLOWLIST_REMOVE", "dense")
    model = float32_model()
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=enable(mp.optimizers.SGD(), dtype="bfloat16"))
    for _ in range(2):
        model.train_on_batch(X, Y)
    graph = _train_graph(model)
    assert "dense(float32" in graph and "dense#0() -> float32  [dense is on no list" in graph
    assert "matmul(bfloat16" in graph        # the gradient matmuls still are allow ops
    monkeypatch.delenv("MPCORE_AMP_ALLOWLIST_REMOVE")
    disable()

    backend = mp.get_backend()
    monkeypatch.setattr(backend, "category_overrides", {"matmul": Category.DENY})
    model = float32_model()
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=enable(mp.optimizers.SGD(), dtype="bfloat16"))
    for _ in range(2):
        model.train_on_batch(X, Y)
    graph = _train_graph(model)
    kernels = graph.split("\n\n")[0]
    assert "dense(bfloat16" in kernels and "matmul(float32[128, 4], float32[32, 4]" in kernels
    assert "matmul#19(relu_grad_bias#18) -> float32  [deny propagated forward" in graph


def test_eager_dispatch_has_no_hook_when_nothing_is_on() -> None:
    model = float32_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=enable(mp.optimizers.SGD()))
    model.train_on_batch(X, Y)
    assert dispatch.dtype_hook is None       # only a trace of the rewrite installs it
    disable()
    with mp.mixed_precision.autocast("bfloat16"):
        assert dispatch.dtype_hook is not None
    assert dispatch.dtype_hook is None


def test_the_graph_is_the_latest_trace_under_the_rewrite() -> None:
    """Issue 18, defect 10: under the rewrite, graph was None after the first call, and the
    previous signature's program after a first call with a new one."""
    w = mp.Variable(np.ones((20, 3), np.float32))
    f = mp.function(lambda x: mp.ops.tanh(mp.ops.matmul(x, w)))
    enable(mp.optimizers.SGD(), dtype="bfloat16")
    f(mp.constant(X[:4]))       # the pre-pass and the painted trace: the painted program
    assert "matmul(bfloat16[4, 20]" in str(f.graph) and "ops painted bfloat16" in str(f.graph)
    f(mp.constant(X[:5]))
    assert "matmul(bfloat16[5, 20]" in str(f.graph) and "ops painted bfloat16" in str(f.graph)
    model = float32_model()
    assert model.train_function is None                    # public: the traced train step


def test_every_op_of_the_summary_can_go_on_a_list_and_the_column_is_what_ran(
        backend: mp.Backend) -> None:
    """Issue 18, defect 9: 'full' and 'sparse_softmax_cross_entropy_grad' were shown but
    refused by the lists, and 'full#18() -> float32 [...; ran in bfloat16]' contradicted
    itself: the column now shows the dtype the op ran in."""
    from mpcore.amp.lists import AutoMixedPrecisionLists

    lists = AutoMixedPrecisionLists().edit(denylist_add=["full"],
                                           inferlist_add=["sparse_softmax_cross_entropy_grad"])
    assert lists.category("full") is Category.DENY
    model = float32_model()
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=enable(mp.optimizers.SGD(), dtype="bfloat16"), jit_compile=True)
    model.fit(X, Y, batch_size=32, epochs=2, verbose=0)
    painted = _train_graph(model).split("\n\n")[1].splitlines()
    if backend.name == "cpu":
        assert any("makes no dtype decision of its own" in line for line in painted)  # full
    for line in painted[1:]:
        op = line.split("#")[0].strip()
        AutoMixedPrecisionLists().edit(allowlist_add=[op])    # every op shown is a list name
        if "ran in" in line:
            ran = line.split("ran in ")[1].rstrip("]")
            assert f"-> {ran}  [" in line


def test_a_tensor_read_in_float32_by_two_ops_is_cast_once(backend: mp.Backend) -> None:
    """Issue 18, defect 15: the logits were cast back to float32 once per reader (softmax,
    the cross-entropy); TF shares one cast per output, and so does the painted trace now."""
    w = mp.Variable(np.ones((20, 3), np.float32))
    g = mp.function(lambda x: (lambda y: mp.ops.softmax(y) + mp.ops.exp(y))(
        mp.ops.matmul(x, w)))
    enable(mp.optimizers.SGD(), dtype="bfloat16")
    x = mp.constant(X)
    g(x)                                   # float32: records the op graph
    g(x)                                   # painted: softmax and exp read y in float32
    kernels = str(g.graph).split("\n\n")[0].splitlines()
    assert sum(line.startswith("cast(bfloat16[128, 3], 'float32')") for line in kernels) == 1
    np.testing.assert_allclose(g(x).numpy(), (lambda y: np.exp(y) / np.exp(y).sum(1, keepdims=True)
                                              + np.exp(y))(X @ np.ones((20, 3))), rtol=0.05)
