"""Shared fixtures: every available backend, the global policy reset, dtype-aware tolerances.

The ``backend`` fixture runs a test on each of cpu, opencl and cuda that works here; the others
are skipped with the reason (an OpenCL backend whose kernels do not load yet is skipped with its
error, CUDA with the backend's own "not available" reason). The backend-generic suites (ops,
gradients, loss scaling) are what every backend is held to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import mpcore as mp

# (rtol, atol) by the dtype a result is delivered in: the conformance kit's table, so the
# project's tests hold the built-in backends to what the kit holds a third party's to.
from mpcore.conformance.harness import TOLERANCES
from mpcore.plugins import registry

BACKEND_NAMES = ("cpu", "opencl", "cuda")

#: The checkout (the README's commands run here) and the shared folder beside it (../shared:
#: the real MNIST files, the PyTorch peer), for tests in any subfolder of tests/.
REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
SHARED_MNIST = SHARED / "data" / "mnist"

NUMPY_DTYPES: dict[str, Any] = {
    "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
    "float64": np.float64,
}

_availability: dict[str, str | None] = {}


def backend_problem(name: str) -> str | None:
    """None when backend ``name`` works here (kernels included), else why not. Cached: an
    OpenCL backend may compile its kernels on first use."""
    if name not in _availability:
        try:
            be = mp.get_backend(name)
            be.kernels()
            be.device()
        except Exception as exc:  # any failure to come up is a reason to skip, shown as is
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if len(first) > 160:
                first = first[:160] + "..."
            _availability[name] = f"{name}: {type(exc).__name__}: {first}"
        else:
            _availability[name] = None
    return _availability[name]


@pytest.fixture(params=BACKEND_NAMES)
def backend(request: pytest.FixtureRequest) -> Iterator[mp.Backend]:
    """Each available backend in turn, made current for the test; the previous one returns."""
    problem = backend_problem(request.param)
    if problem is not None:
        pytest.skip(problem)
    previous, note = registry._current, registry._detection_note
    be = mp.set_backend(request.param)
    try:
        yield be
    finally:
        registry._current, registry._detection_note = previous, note


def available_backends(*names: str) -> list[str]:
    """The backends of ``names`` that work here, for tests parametrized over them (a backend
    that does not work is left out rather than skipped)."""
    return [name for name in names if backend_problem(name) is None]


@pytest.fixture
def host_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every device-to-host read from now on, by backend: the backends' ``to_host``
    (Tensor.numpy, bool(), float() and int() of tensors go through it) and OpenCL's blocking
    ``runtime.read`` (issue 34: a replayed training step makes none)."""
    reads: list[str] = []
    for name in available_backends("cpu", "opencl"):
        be = mp.get_backend(name)
        cls = type(be)
        original = cls.to_host

        def counted(self: object, x: object, _original: Any = original,
                    _name: str = name) -> object:
            reads.append(_name)
            return _original(self, x)

        monkeypatch.setattr(cls, "to_host", counted)
        runtime = getattr(be, "runtime", None)
        if runtime is not None:
            read = runtime.read

            def counted_read(out: object, data: object, _read: Any = read) -> object:
                reads.append("opencl-read")
                return _read(out, data)

            monkeypatch.setattr(runtime, "read", counted_read)
    return reads


@pytest.fixture
def on_cpu() -> Iterator[mp.Backend]:
    """The CPU backend made current, for tests of its own kernels and rewrites (the suite may
    run with MPCORE_BACKEND naming another backend); the previous one returns."""
    previous, note = registry._current, registry._detection_note
    be = mp.set_backend("cpu")
    try:
        yield be
    finally:
        registry._current, registry._detection_note = previous, note


@pytest.fixture(autouse=True)
def _reset_global_policy() -> Iterator[None]:
    yield
    mp.set_global_policy(None)


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (0.0, 0.0))


def check_close(actual: Any, expected: Any, dtype: str, scale: float = 1.0) -> None:
    """Compare a tensor (or array) with a float64 reference at ``dtype``'s tolerance, widened
    by ``scale`` for results that went through several roundings."""
    rtol, atol = tolerance(dtype)
    got = np.asarray(actual).astype(np.float64)
    want = np.asarray(expected, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol * scale, atol=atol * scale)


@pytest.fixture
def assert_close() -> Callable[..., None]:
    return check_close


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` as ``dtype`` would hold them, back in float64 (the reference's inputs)."""
    with np.errstate(over="ignore"):  # beyond a 16-bit range is inf, as in the backends
        return np.asarray(values).astype(NUMPY_DTYPES[dtype]).astype(np.float64)


def train_guide_on_mnist(policy: str | mp.Policy, data: Any) -> tuple[Any, float]:
    """The guide's model (64 units) trained on ``data`` with ``policy`` on the current backend
    (5 epochs, batch 128, validation_split 0.2, seed 0): the model and its test accuracy."""
    from mpcore.cli import demo

    mp.random.set_seed(0)
    with mp.policy_scope(policy):
        model = demo.build_model(64)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.RMSprop(),
                  metrics=["accuracy"])
    x = data.x_train.reshape(len(data.x_train), 784).astype("float32") / 255
    xt = data.x_test.reshape(len(data.x_test), 784).astype("float32") / 255
    model.fit(x, data.y_train, batch_size=128, epochs=5, validation_split=0.2, verbose=0)
    return model, model.evaluate(xt, data.y_test, verbose=0)[1]


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, except that a NaN only needs to stay a NaN of the same sign."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    bits = f"u{got.itemsize}"
    assert np.array_equal(np.ascontiguousarray(got).view(bits)[~nan],
                          np.ascontiguousarray(want).view(bits)[~nan])
    assert np.isnan(got[nan]).all()
    assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))


def small_classifier(seed: int = 5, jit_compile: bool | str = "auto") -> Any:
    """8 inputs, Dense(16, relu), a 3-class softmax, SGD(0.1), sparse cross-entropy and
    accuracy: the model of the data tests (generators, PyDataset, sample weights)."""
    import mpcore as mp
    from mpcore import layers

    mp.random.set_seed(seed)
    inputs = mp.Input((8,))
    x = layers.Dense(16, activation="relu")(inputs)
    model = mp.Model(inputs, layers.Dense(3, activation="softmax")(x))
    model.compile(optimizer=mp.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=jit_compile)
    return model


def mlp_and_optimizer(policy: str, seed: int = 3, hidden: int = 1) -> tuple[Any, Any]:
    """A small softmax MLP (20 inputs, Dropout, 4 classes) under ``policy``, and Adam, wrapped
    in a LossScaleOptimizer for mixed_float16: the model of the traced-step tests."""
    from mpcore import layers

    mp.set_global_policy(policy)
    mp.random.set_seed(seed)
    inputs = mp.Input((20,))
    x = layers.Dense(16, activation="relu")(inputs)
    x = layers.Dropout(0.25)(x)
    for _ in range(hidden - 1):
        x = layers.Dense(16, activation="relu")(x)
    x = layers.Dense(4)(x)
    model = mp.Model(inputs, layers.Activation("softmax", dtype="float32")(x))
    opt = mp.optimizers.Adam(0.01)
    if policy == "mixed_float16":
        opt = mp.mixed_precision.LossScaleOptimizer(opt)
    return model, opt


def custom_training_step(model: Any, opt: Any) -> Callable[[Any, Any], Any]:
    """The guide's custom training step (tape, loss scaling where ``opt`` does it, update)."""
    loss_fn = mp.losses.SparseCategoricalCrossentropy()
    scaled = isinstance(opt, mp.mixed_precision.LossScaleOptimizer)

    def step(x: Any, y: Any) -> Any:
        with mp.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            target = opt.get_scaled_loss(loss) if scaled else loss
        grads = tape.gradient(target, model.trainable_variables)
        if scaled:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def spy_on_compile_program(monkeypatch: pytest.MonkeyPatch, be: mp.Backend) -> list[Any]:
    """The runners ``be.compile_program`` makes from now on (its own method, called as
    usual), appended to the list returned."""
    made: list[Any] = []
    compile_program = type(be).compile_program

    def spy(program: Any) -> Any:
        runner = compile_program(be, program)
        made.append(runner)
        return runner

    monkeypatch.setattr(be, "compile_program", spy)
    return made
