"""The mixed precision categories of the ops, dtype promotion, bad input and the random
ops, on every available backend (the ops themselves against NumPy: test_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import NUMPY_DTYPES, check_close
from mpcore_cpu import CpuBackend
from op_cases import BINARY, COMPARISONS, FLOATS, UNARY, data, host

import mpcore as mp
from mpcore import ops
from mpcore.core.categories import ALLOW, CATEGORIES, CLEAR, DENY, INFER


# --- categories -------------------------------------------------------------------------
def test_category_table_is_complete_for_the_ops() -> None:
    for name in [*UNARY, *BINARY, *COMPARISONS, "matmul", "sum", "mean", "max", "min",
                 "softmax", "log_softmax", "sparse_softmax_cross_entropy", "reshape", "concat"]:
        if name in ("reciprocal", "rsqrt"):
            continue  # composites of divide and sqrt
        assert name in CATEGORIES, name
    assert CATEGORIES["matmul"] is ALLOW
    for name in ("exp", "log", "power", "softmax", "sum", "mean",
                 "sparse_softmax_cross_entropy"):
        assert CATEGORIES[name] is DENY
    assert CATEGORIES["add"] is INFER and CATEGORIES["reshape"] is CLEAR


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_categories_on_16_bit_inputs(backend: mp.Backend, low: str) -> None:
    x = mp.constant(data((3, 3), 0.5, 2), dtype=low)
    labels = mp.constant([0, 1, 2])
    assert ops.matmul(x, x).dtype == low                                    # allow
    for out in (ops.exp(x), ops.log(x), ops.power(x, 2.0), ops.power(x, x), ops.softmax(x),
                ops.log_softmax(x), ops.sum(x), ops.mean(x, axis=0),
                ops.sparse_softmax_cross_entropy(labels, x), ops.erf(x)):
        assert out.dtype == "float32"                                        # deny
    for out in (ops.add(x, x), ops.multiply(x, x), ops.tanh(x), ops.sigmoid(x), ops.sqrt(x),
                ops.relu(x), ops.maximum(x, x), ops.max(x), ops.reshape(x, (9,)),
                ops.transpose(x), ops.getitem(x, 0), ops.negative(x)):
        assert out.dtype == low                                              # infer / clear


def test_promotion_rules(backend: mp.Backend) -> None:
    h = mp.constant([1.0, 2.0], dtype="float16")
    f = mp.constant([1.0, 2.0], dtype="float32")
    b = mp.constant([1.0, 2.0], dtype="bfloat16")
    i = mp.constant([1, 2])
    assert (h + f).dtype == "float32" and (f * h).dtype == "float32"
    assert ops.matmul(ops.reshape(h, (1, 2)), ops.reshape(f, (2, 1))).dtype == "float32"
    assert (h + b).dtype == "float32"                 # no common 16-bit type
    assert (h * 2.0).dtype == "float16" and (2.0 * h).dtype == "float16"
    assert (b * 2).dtype == "bfloat16"
    assert (i * 2).dtype == "int32" and (i * 2).numpy().tolist() == [2, 4]
    assert (i * 2.5).dtype == "float32" and (i * 2.5).numpy().tolist() == [2.5, 5.0]
    assert (i + h).dtype == "float16"                 # floats win over integers
    assert (i / 2).dtype == "float32"                 # division is floating
    assert ops.exp(i).dtype == "float32"
    assert ops.where(ops.greater(h, 1.0), h, f).dtype == "float32"


class _DenyMatmulCpu(CpuBackend):
    name = "cpu-deny-matmul"
    category_overrides = {"matmul": DENY, "exp": INFER}


def test_backend_category_overrides() -> None:
    be = _DenyMatmulCpu()
    x = mp.constant(data((2, 2), 0.5, 1), dtype="float16", backend=be)
    assert x.backend is be
    out = ops.matmul(x, x)
    assert out.dtype == "float32"                     # the backend made matmul deny
    check_close(out, host(x) @ host(x), "float32")
    assert ops.exp(x).dtype == "float16"              # ... and exp infer
    assert ops.log(x).dtype == "float32"              # the rest of the table holds
    cpu = CpuBackend()
    assert ops.matmul(mp.constant(host(x), "float16", cpu), mp.constant(host(x), "float16",
                                                                          cpu)).dtype == "float16"


# --- bad input --------------------------------------------------------------------------
def test_shape_errors_name_the_shapes(backend: mp.Backend) -> None:
    a = mp.constant(np.zeros((2, 3)))
    b = mp.constant(np.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        ops.matmul(a, b)
    with pytest.raises(ValueError, match=r"inner dimensions differ: \(1,\) @ \(2, 3\)"):
        ops.matmul(mp.constant([1.0]), a)          # a vector, as NumPy's: (1,) against 2
    with pytest.raises(ValueError, match="rank >= 1"):
        ops.matmul(mp.constant(1.0), a)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        ops.concat([a, b], axis=0)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 2\)"):
        ops.reshape(a, (4, 2))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        ops.reshape(a, (4, -1))
    with pytest.raises(ValueError, match="broadcast"):
        ops.broadcast_to(a, (3, 3))
    with pytest.raises(ValueError, match="axis"):
        ops.sum(a, axis=2)
    with pytest.raises(ValueError, match="permutation"):
        ops.transpose(a, (0, 0))
    with pytest.raises(ValueError, match="not 1"):
        ops.squeeze(a, axis=0)
    with pytest.raises(ValueError, match="at least one"):
        ops.concat([])


def test_unknown_dtype_lists_valid_ones(backend: mp.Backend) -> None:
    for call in (lambda: mp.constant([1.0], dtype="float8"),
                 lambda: ops.cast(mp.constant([1.0]), "half"),
                 lambda: ops.zeros((2,), dtype="fp16")):
        with pytest.raises(ValueError, match=r"valid dtypes: .*float16.*bfloat16.*float32"):
            call()
    with pytest.raises(TypeError, match="valid dtypes"):
        mp.constant([1.0], dtype=object())


def test_mixing_backends_raises(backend: mp.Backend) -> None:
    other = _DenyMatmulCpu()
    a = mp.constant([[1.0, 2.0]])
    b = mp.constant([[1.0, 2.0]], backend=other)
    with pytest.raises(ValueError, match="different backends"):
        a + b
    with pytest.raises(ValueError, match="different backends"):
        ops.matmul(a, ops.transpose(b))
    with pytest.raises(ValueError, match="different backends"):
        ops.concat([a, b])
    with pytest.raises(ValueError, match="different backends"):
        ops.where(ops.greater(a, 0.0), a, b)
    moved = mp.constant(b, backend=backend.name)
    assert moved.backend is backend
    check_close(a + moved, [[2.0, 4.0]], "float32")


# --- random -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
def test_random_is_seeded(backend: mp.Backend, dtype: str) -> None:
    u1 = ops.random_uniform((64, 32), -2.0, 3.0, dtype=dtype, seed=42)
    u2 = ops.random_uniform((64, 32), -2.0, 3.0, dtype=dtype, seed=42)
    u3 = ops.random_uniform((64, 32), -2.0, 3.0, dtype=dtype, seed=43)
    assert u1.dtype == dtype and u1.shape == (64, 32)
    assert np.array_equal(u1.numpy(), u2.numpy())
    assert not np.array_equal(u1.numpy(), u3.numpy())
    v = host(u1)
    assert v.min() >= -2.0 and v.max() <= 3.0 and abs(v.mean() - 0.5) < 0.15
    n1 = ops.random_normal((20000,), 1.0, 2.0, dtype=dtype, seed=7)
    assert np.array_equal(n1.numpy(), ops.random_normal((20000,), 1.0, 2.0, dtype=dtype,
                                                        seed=7).numpy())
    w = host(n1)
    assert abs(w.mean() - 1.0) < 0.05 and abs(w.std() - 2.0) < 0.05


def test_set_seed_makes_runs_repeatable(backend: mp.Backend) -> None:
    def run() -> list[np.ndarray]:
        mp.random.set_seed(1234)
        return [ops.random_uniform((5,)).numpy(), ops.random_normal((5,)).numpy(),
                ops.dropout_mask((50,), 0.5).numpy()]

    first, second = run(), run()
    for a, b in zip(first, second):
        assert np.array_equal(a, b)
    assert not np.array_equal(first[0], ops.random_uniform((5,)).numpy())
    mp.random.set_seed(99)
    assert not np.array_equal(ops.random_uniform((5,)).numpy(), first[0])
    state = mp.random.get_state()
    a = ops.random_uniform((5,)).numpy()
    mp.random.set_state(state)
    assert np.array_equal(ops.random_uniform((5,)).numpy(), a)
    with pytest.raises(TypeError):
        mp.random.set_seed(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
@pytest.mark.parametrize("dtype", FLOATS)
def test_dropout_mask(backend: mp.Backend, rate: float, dtype: str) -> None:
    mask = ops.dropout_mask((200, 100), rate, dtype=dtype, seed=3)
    assert mask.dtype == dtype
    v = host(mask)
    scale = float(np.asarray(1 / (1 - rate), dtype=NUMPY_DTYPES[dtype]))
    assert set(np.unique(v).tolist()) <= {0.0, scale}
    keep = (v != 0).mean()
    assert abs(keep - (1 - rate)) < 0.015  # 20,000 draws: ~5 standard deviations
    assert np.array_equal(mask.numpy(), ops.dropout_mask((200, 100), rate, dtype=dtype,
                                                         seed=3).numpy())
    x = mp.constant(np.ones((200, 100)), dtype=dtype)
    dropped = host(ops.dropout(x, rate, seed=3))
    assert np.array_equal(dropped, v)
    assert abs(dropped.mean() - 1.0) < 0.05 + 0.05 * rate / (1 - rate)
    assert ops.dropout(x, 0.0) is x
    with pytest.raises(ValueError, match="rate"):
        ops.dropout_mask((2,), 1.0)


# --- loss-scaling kernels ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
def test_unscale_and_check(backend: mp.Backend, dtype: str) -> None:
    g1 = mp.constant(data((3, 4)) * 1024, dtype=dtype)
    g2 = mp.constant(data((5,)) * 1024, dtype="float32")
    outs, flag = ops.unscale_and_check([g1, None, g2], 1 / 1024)
    assert outs[1] is None
    assert [o.dtype for o in outs if o is not None] == ["float32", "float32"]
    check_close(outs[0], host(g1) / 1024, "float32")
    check_close(outs[2], host(g2) / 1024, "float32")
    assert flag.dtype == "bool" and bool(flag) is True
    for bad in (np.inf, -np.inf, np.nan):
        v = data((3, 4))
        v[1, 2] = bad
        _, flag = ops.unscale_and_check([g2, mp.constant(v, dtype=dtype)], 0.5)
        assert bool(flag) is False
    huge = mp.constant([3e38, 3e38])  # finite values whose sum overflows
    assert bool(ops.unscale_and_check([huge], 1.0)[1]) is True
    assert bool(ops.all_finite([huge, g1])) is True
    assert bool(ops.all_finite([mp.constant([np.nan], dtype=dtype)])) is False
    assert ops.unscale_and_check([None], 1.0) == ([None], None)
    with pytest.raises(ValueError):
        ops.all_finite([])
