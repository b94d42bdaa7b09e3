"""``mp.debugging.enable_check_numerics()``: the first op whose output holds Inf/NaN raises,
named with its layer and input ranges, and says whether it produced the value or passed it on;
off by default; traced functions run eagerly while it is on."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers


@pytest.fixture
def checking() -> Iterator[None]:
    mp.debugging.enable_check_numerics()
    try:
        yield
    finally:
        mp.debugging.disable_check_numerics()


def test_off_by_default_and_off_again() -> None:
    assert not mp.debugging.check_numerics_enabled()
    assert not np.isfinite(np.asarray(mp.ops.exp(mp.constant([100.0])))).any()
    mp.debugging.enable_check_numerics()
    mp.debugging.disable_check_numerics()
    mp.ops.exp(mp.constant([100.0]))


def test_the_producing_op_is_named(checking: None) -> None:
    x = mp.constant([1.0, 100.0])
    y = mp.ops.multiply(x, 0.5)                    # finite: no error
    with pytest.raises(mp.debugging.NumericsError,
                       match=r"exp gave Inf/NaN .* this op produced them\. Input ranges: "
                             r"float32\[2\] in \[2, 200\]") as err:
        mp.ops.exp(mp.ops.multiply(y, 4.0))
    assert "no layer" in str(err.value)


def test_an_op_handed_a_nan_says_it_passed_it_on(checking: None) -> None:
    with pytest.raises(mp.debugging.NumericsError, match="passed them on"):
        mp.ops.add(mp.constant([np.nan, 1.0]), 1.0)


def test_non_finite_data_is_named_as_the_data(checking: None) -> None:
    model = mp.Sequential([layers.Dense(4, input_shape=(3,)), layers.Dense(2)])
    model.compile(loss="mse", optimizer="sgd")
    x = np.ones((8, 3), np.float32)
    x[2, 1] = np.nan
    with pytest.raises(mp.debugging.NumericsError, match=r"they were in the data passed in"
                       r".* float32\[8, 3\] in \[1, 1\], and 1 Inf/NaN"):
        model.fit(x, np.ones((8, 2), np.float32), epochs=1, verbose=0)


def test_an_input_cast_is_charged_to_the_layer(checking: None) -> None:
    mp.set_global_policy("mixed_float16")
    model = mp.Sequential([layers.Dense(4, input_shape=(3,), name="first")])
    with pytest.raises(mp.debugging.NumericsError, match=r"cast gave Inf/NaN .* in "
                       r"sequential\S* > first; its inputs were finite"):
        model(np.full((2, 3), 1e6, np.float32))        # too big for float16


def test_a_non_finite_weight_is_named(checking: None) -> None:
    model = mp.Sequential([layers.Dense(4, input_shape=(3,)), layers.Dense(2, name="head")])
    model.layers[1].kernel.assign(np.full((4, 2), np.inf, np.float32))
    with pytest.raises(mp.debugging.NumericsError,
                       match=r"in .* > head; .* variable 'head/kernel' already held them"):
        model(np.ones((8, 3), np.float32))


@pytest.mark.usefixtures("on_cpu")   # names the CPU's fused dense op
def test_an_overflowing_dense_layer_is_named(checking: None) -> None:
    mp.set_global_policy("mixed_float16")
    inputs = mp.Input((4,))
    hidden = layers.Dense(3, name="too_big")
    model = mp.Model(inputs, layers.Dense(2, name="fine")(hidden(inputs)))
    hidden.kernel.assign(np.full((4, 3), 6e4, np.float32))   # 4 * 6e4 overflows float16
    with pytest.raises(mp.debugging.NumericsError,
                       match=r"dense gave Inf/NaN in its float16\[2, 3\] output, in "
                             r"\S+ > too_big; its inputs were finite.*keep that layer in "
                             r"float32") as err:
        model(np.ones((2, 4), np.float32))
    assert "float16[4, 3] in [60000, 60000]" in str(err.value)


def test_traced_functions_run_eagerly_while_checking(checking: None) -> None:
    f = mp.function(lambda x: mp.ops.exp(x))
    with pytest.raises(mp.debugging.NumericsError, match="exp gave Inf/NaN"):
        f(mp.constant([1000.0]))
    assert f.tracing_count == 0
