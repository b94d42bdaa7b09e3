"""``mp.debugging.inspect_numerics``: one float32 step of a model watched op by op. The cases
the issue names: the producing op when a layer overflows (a Dense whose kernel is scaled up, an
``exp`` of large values), the layer whose gradients underflow in float16, and bad arguments."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

import mpcore as mp
from mpcore.cli.demo import build_model
from mpcore.debugging import NumericsReport

UNITS = 16


def guide_model(policy: str | None = None, units: int = UNITS) -> Any:
    """The guide's model (784-units-units-10, a float32 softmax), compiled."""
    if policy is not None:
        mp.set_global_policy(policy)
    mp.random.set_seed(0)
    model = build_model(units)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.RMSprop())
    return model


def batch(n: int = 32, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return ((rng.random((n, 784), dtype=np.float32) * scale).astype(np.float32),
            rng.integers(0, 10, n).astype(np.int32))


def weights(model: Any) -> list[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in model.weights]


def scale_kernel(model: Any, layer: str, factor: float) -> None:
    kernel = next(v for v in model.weights if v.name == f"{layer}/kernel")
    kernel.assign(kernel.numpy() * np.float32(factor))


def test_a_healthy_model(backend: mp.Backend) -> None:
    model = guide_model()
    report = mp.debugging.inspect_numerics(model, *batch())
    assert report.first_nonfinite is None
    assert [(s.layer, s.phase) for s in report.layers] == [
        ("dense_1", "forward"), ("dense_2", "forward"), ("dense_logits", "forward"),
        ("loss", "backward"), ("dense_logits", "backward"), ("dense_2", "backward"),
        ("dense_1", "backward")]
    assert {r.phase for r in report.ops} == {"forward", "backward"}
    assert all(r.dtype == "float32" for r in report.ops)
    half, bf16 = report.loss_scale_windows["float16"], report.loss_scale_windows["bfloat16"]
    # the loss gradient starts at 1: the largest float16 scale is TF's initial 2**15
    assert half.max_scale_log2 == 15 and half.settle_scale_log2 == 15
    assert half.scaling_needed and not half.empty
    assert not bf16.scaling_needed
    assert report.keep_float32("float16") == report.keep_float32("bfloat16") == []
    assert report.suggested_dtypes["float16"] == {
        "dense_1": "float16", "dense_2": "float16", "dense_logits": "float16"}


def test_the_step_changes_nothing_and_runs_in_float32() -> None:
    model = guide_model("mixed_float16")
    before = weights(model)
    policies = [layer.dtype_policy for layer in model.layers]
    report = mp.debugging.inspect_numerics(model, *batch())
    assert all(r.dtype == "float32" for r in report.ops)
    assert [layer.dtype_policy for layer in model.layers] == policies
    for got, want in zip(weights(model), before):
        np.testing.assert_array_equal(got, want)
    assert model.optimizer.iterations == 0
    assert not mp.debugging.watching()      # the hooks are gone again


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NumPy's, for the Inf it computes
def test_a_dense_scaled_up_is_named_as_the_producer(backend: mp.Backend) -> None:
    model = guide_model()
    kernel = next(v for v in model.weights if v.name == "dense_2/kernel")
    kernel.assign(np.full(kernel.shape, 1e38, np.float32))   # overflows float32 itself
    report = mp.debugging.inspect_numerics(model, *batch())
    first = report.first_nonfinite
    assert first is not None
    # a fused dense kernel on cpu; matmul, bias_add, relu on opencl
    assert (first.layer, first.phase, first.op) in {("dense_2", "forward", "dense"),
                                                    ("dense_2", "forward", "matmul")}
    assert "max |x|" in first.input_ranges[0]
    later = [r for r in report.ops if r.index > first.index and r.measurement.nonfinite]
    assert later and not any(r.produced_nonfinite for r in later)  # they only passed it on
    assert f"First op to produce Inf/NaN: {first.op} (op #{first.index}" in str(report)
    assert "in layer 'dense_2'" in str(report)


def test_a_float16_overflow_is_found_without_any_inf() -> None:
    model = guide_model()
    scale_kernel(model, "dense_1", 1e6)        # fine in float32, too big for float16
    report = mp.debugging.inspect_numerics(model, *batch())
    assert report.first_nonfinite is None
    assert report.layer("dense_1").fractions["float16"].overflow > 0
    assert report.layer("dense_1").fractions["bfloat16"].overflow == 0
    assert "dense_1" in report.keep_float32("float16")
    assert report.keep_float32("bfloat16") == []


class Exponential(mp.layers.Layer):
    def call(self, inputs: Any) -> Any:
        return mp.ops.exp(mp.ops.multiply(inputs, 100.0))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_exp_of_large_values_is_named() -> None:
    inputs = mp.Input(shape=(784,))
    x = mp.layers.Dense(8, name="dense_in")(inputs)
    x = Exponential(name="blow_up")(x)
    model = mp.Model(inputs, mp.layers.Dense(10, name="head")(x))
    report = mp.debugging.inspect_numerics(
        model, *batch(), loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True))
    first = report.first_nonfinite
    assert first is not None and (first.op, first.layer) == ("exp", "blow_up")


def test_the_layer_whose_gradients_underflow_in_float16() -> None:
    # tiny inputs: only dense_1's kernel gradient (inputs x upstream gradient) is tiny
    model = guide_model()
    report = mp.debugging.inspect_numerics(model, *batch(scale=1e-6))
    backward = {s.layer: s.fractions["float16"].underflow for s in report.layers
                if s.phase == "backward"}
    assert max(backward, key=backward.__getitem__) == "dense_1"
    assert backward["dense_1"] > 0.3
    assert report.layer("dense_1", "backward").fractions["bfloat16"].underflow == 0


@pytest.mark.usefixtures("on_cpu")   # names the CPU's fused dense op
def test_json_and_table() -> None:
    report = mp.debugging.inspect_numerics(guide_model(), *batch(),
                                           dtypes=("float16", "float8_e5m2"))
    data = json.loads(report.to_json())
    assert data["dtypes"] == ["float16", "float8_e5m2"]
    assert data["first_nonfinite"] is None
    assert len(data["ops"]) == len(report.ops)
    assert data["loss_scale_windows"]["float16"]["max_scale_log2"] == 15
    assert data["suggested_dtypes"]["float8_e5m2"]["dense_1"] in ("float8_e5m2", "float32")
    text = str(report)
    for needle in ("dense_1", "backward", "float8_e5m2", "safe loss scales",
                   "Suggested compute dtype per layer"):
        assert needle in text
    assert "bfloat16" not in text
    assert "#0 dense" in report.table(ops=True) and "#0 dense" not in text


def test_plot(tmp_path: Any) -> None:
    path = tmp_path / "numerics.png"
    mp.debugging.inspect_numerics(guide_model(), *batch()).plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_window_from_known_gradients() -> None:
    from mpcore.debugging import formats
    from mpcore.debugging.report import OpRecord, loss_scale_window

    # 1000 values of 2**-20 and one of 2**-40, largest 2**-4; float16: max 65504 (2**15.99),
    # normal from 2**-14
    values = np.array([2.0 ** -20] * 1000 + [2.0 ** -40, 2.0 ** -4], np.float32)
    fmt = formats.FORMATS["float16"]
    record = OpRecord(0, "backward", "matmul", "dense", "float32", (1002,), "allow",
                      formats.measure(values, [fmt]))
    window = loss_scale_window(fmt, [record])
    assert window.max_scale_log2 == 19          # 2**-4 * 2**19 = 2**15 < 65504 < 2**16
    assert window.min_scale_log2 == 6           # 2**-20 * 2**6 = 2**-14; the one 2**-40 is
    assert window.settle_scale_log2 == 19       # within the 0.1% tolerance
    assert math.isclose(window.headroom_log2, math.log2(65504 / 2 ** -4))
    assert window.underflow_at_settle == pytest.approx(1 / 1002)
    assert window.describe() == "2^6 .. 2^19"


@pytest.mark.parametrize("dtypes, match", [
    (("float16", "float8"), "unknown dtype 'float8' for inspect_numerics: choose from "
                            "float16, bfloat16, float8_e4m3fn, float8_e5m2"),
    ((), "needs at least one dtype"),
    (("float16", "float16"), "name one twice"),
])
def test_bad_dtypes(dtypes: tuple[str, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mp.debugging.inspect_numerics(guide_model(), *batch(), dtypes=dtypes)


def test_a_model_without_a_loss() -> None:
    inputs = mp.Input(shape=(784,))
    model = mp.Model(inputs, mp.layers.Dense(10)(inputs))
    with pytest.raises(ValueError, match="has no compiled loss; pass loss="):
        mp.debugging.inspect_numerics(model, *batch())
    report = mp.debugging.inspect_numerics(model, *batch(), dtypes="bfloat16",
                                           loss="sparse_categorical_crossentropy")
    assert isinstance(report, NumericsReport) and report.dtypes == ("bfloat16",)


# --- found by a new-user trial --------------------------------------------------------------
def test_an_unbuilt_mixed_model_is_built_first_and_inspected_in_float32() -> None:
    mp.set_global_policy("mixed_float16")
    model = mp.Sequential([mp.layers.Dense(16, activation="relu", name="hidden"),
                           mp.layers.Dropout(0.5, name="drop"),
                           mp.layers.LayerNormalization(name="norm"),
                           mp.layers.Dense(10, activation="softmax", dtype="float32",
                                       name="out")])
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
    report = mp.debugging.inspect_numerics(model, *batch())
    assert {r.dtype for r in report.ops} == {"float32"}
    assert {s.layer for s in report.layers} <= {"hidden", "drop", "norm", "loss"}
    # "out" is pinned to float32 in a mixed model: not in the 16-bit figures, kept float32
    assert report.pinned == ["out"] and "out" in report.keep_float32("float16")
    assert report.suggested_dtypes["float8_e4m3fn"]["out"] == "float32"
    assert "Pinned to float32 (dtype='float32'), left out of the 16-bit figures: out" \
        in str(report)


def test_nan_in_the_data_is_named_as_the_origin() -> None:
    x, y = batch()
    x[3, 4] = np.nan
    report = mp.debugging.inspect_numerics(guide_model(), x, y)
    assert report.first_nonfinite is None
    assert report.data_nonfinite == 1
    assert report.nonfinite_origin() == "the input data (1 Inf/NaN values)"
    assert "they came in with the input data (1 Inf/NaN values)" in str(report)
    # no dtype is the cure: no suggestion, and no loss-scale window
    assert report.suggested_dtypes["bfloat16"]["dense_1"] is None
    assert report.keep_float32("bfloat16") == []
    assert report.loss_scale_windows["float16"].describe().startswith(
        "none: the float32 backward pass holds")


@pytest.mark.filterwarnings("error::RuntimeWarning")   # NumPy's own warnings stay inside
def test_a_float32_overflow_is_counted_everywhere() -> None:
    model = guide_model()
    kernel = next(v for v in model.weights if v.name == "dense_2/kernel")
    kernel.assign(np.full(kernel.shape, 1e38, np.float32))
    report = mp.debugging.inspect_numerics(model, *batch())
    assert report.layer("dense_2").nonfinite > 0
    assert report.suggested_dtypes["float16"]["dense_2"] is None
    window = report.loss_scale_windows["float16"]
    assert window.nonfinite > 0 and window.settle_scale_log2 is None
    text = str(report)
    assert "Inf/NaN" in text.splitlines()[4] and "- (Inf/NaN in float32)" in text


def test_the_loss_gradient_is_measured_on_every_backend(backend: mp.Backend) -> None:
    # OpenCL's fused cross-entropy gradient was invisible to the inspector
    report = mp.debugging.inspect_numerics(guide_model(), *batch())
    assert any(r.phase == "backward" and r.layer == "loss" and r.shape == (32, 10)
               for r in report.ops)


class TwoInputs(mp.Model):
    def __init__(self) -> None:
        super().__init__()
        self.head = mp.layers.Dense(10, name="head")

    def call(self, inputs: Any, training: bool = False) -> Any:
        return self.head(mp.ops.add(inputs[0], inputs[1]))


def test_a_model_of_two_inputs_takes_what_fit_takes() -> None:
    x, y = batch()
    model = TwoInputs()
    model.compile(loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer="sgd")
    report = mp.debugging.inspect_numerics(model, [x, x], y)
    assert report.batch == 32 and report.layer("head").ops >= 1


def test_columns_never_run_together() -> None:
    model = guide_model()
    scale_kernel(model, "dense_1", 1e6)
    for line in str(mp.debugging.inspect_numerics(model, *batch())).splitlines():
        assert "e-040" not in line and "e+000" not in line


@pytest.mark.parametrize("model, match", [(None, "needs an mp.Model .* got NoneType"),
                                          ("model", "got str"), (len, "got builtin_function")])
def test_what_is_not_a_model(model: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        mp.debugging.inspect_numerics(model, *batch(), loss="mse")


def test_more_bad_arguments() -> None:
    model = guide_model()
    with pytest.raises(ValueError, match="dtypes must be a name or a tuple of names from "
                                         "float16, bfloat16"):
        mp.debugging.inspect_numerics(model, *batch(), dtypes=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got no samples"):
        mp.debugging.inspect_numerics(model, *batch(0))
    report = mp.debugging.inspect_numerics(model, *batch(), dtypes=("float16",))
    with pytest.raises(ValueError, match="bfloat16 was not inspected; this report has: "
                                         "float16"):
        report.keep_float32("bfloat16")
