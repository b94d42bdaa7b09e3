"""Every op of mpcore.ops against NumPy (float64 references on the inputs as the tensor holds
them), on every available backend, in float32 and the 16-bit dtypes (the categories, bad input
and random ops: test_ops_rules.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from conftest import NUMPY_DTYPES, check_close, rounded
from op_cases import BINARY, COMPARISONS, FLOATS, UNARY, _erf, data, host, low_or

import mpcore as mp
from mpcore import ops


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(backend: mp.Backend, name: str, dtype: str) -> None:
    ref, (lo, hi), category = UNARY[name]
    x = mp.constant(data((3, 5), lo, hi), dtype=dtype)
    y = getattr(ops, name)(x)
    assert y.backend is backend
    assert y.dtype == low_or(dtype, category)
    assert y.shape == (3, 5)
    check_close(y, ref(host(x)), y.dtype, scale=2.0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("approximate", [False, True])
def test_gelu(backend: mp.Backend, dtype: str, approximate: bool) -> None:
    x = mp.constant(data((4, 6), -4, 4), dtype=dtype)
    y = ops.gelu(x, approximate=approximate)
    v = host(x)
    if approximate:
        want = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    else:
        want = 0.5 * v * (1 + _erf(v / math.sqrt(2)))
    assert y.dtype == dtype
    check_close(y, want, dtype, scale=2.0)




@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_broadcasting(backend: mp.Backend, name: str, dtype: str) -> None:
    ref, category = BINARY[name]
    positive = name in ("power", "divide")
    a = mp.constant(data((3, 4), 0.5 if positive else -2, 2), dtype=dtype)
    b = mp.constant(data((4,), 0.5 if positive else -2, 2.5), dtype=dtype)
    fn = getattr(ops, name)
    for x, y in ((a, b), (b, a)):
        out = fn(x, y)
        assert out.shape == (3, 4)
        assert out.dtype == low_or(dtype, category)
        check_close(out, ref(host(x), host(y)), out.dtype, scale=2.0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_python_scalars(backend: mp.Backend, name: str, dtype: str) -> None:
    ref, category = BINARY[name]
    a = mp.constant(data((2, 3), 0.5, 2), dtype=dtype)
    fn = getattr(ops, name)
    for out, want in ((fn(a, 1.5), ref(host(a), 1.5)), (fn(1.5, a), ref(1.5, host(a))),
                      (fn(a, 2), ref(host(a), 2.0))):
        assert out.dtype == low_or(dtype, category)  # Python scalars are weak
        check_close(out, want, out.dtype, scale=2.0)


def test_operators(backend: mp.Backend) -> None:
    a = mp.constant([[1.0, 2.0], [3.0, 4.0]])
    b = mp.constant([[0.5, -1.0], [2.0, 0.25]])
    va, vb = host(a), host(b)
    cases = [(a + b, va + vb), (a - b, va - vb), (a * b, va * vb), (a / b, va / vb),
             (a ** 2.0, va ** 2), (2.0 ** a, 2.0 ** va), (a @ b, va @ vb), (-a, -va),
             (abs(b), np.abs(vb)), (1.0 - a, 1 - va), (3.0 / a, 3 / va), (a.T, va.T),
             (+a, va), (a[1], va[1]), (a.reshape(4), va.reshape(4)),
             (np.ones((2, 2)) + a, 1 + va)]
    for got, want in cases:
        assert isinstance(got, mp.Tensor)
        check_close(got, want, "float32")
    assert (a == a).numpy().all() and not (a != a).numpy().any()
    assert ((a > b).numpy() == (va > vb)).all() and ((a <= b).numpy() == (va <= vb)).all()
    t = mp.constant([True, False])
    assert (t & ~t).numpy().tolist() == [False, False]
    assert (t | ~t).numpy().tolist() == [True, True]
    assert a.astype("float16").dtype == "float16"
    assert len(a) == 2 and [r.shape for r in a] == [(2,), (2,)]
    assert float(mp.constant(2.5)) == 2.5 and int(mp.constant(3)) == 3
    assert mp.constant(7).item() == 7 and bool(mp.constant(True))




@pytest.mark.parametrize("dtype", [*FLOATS, "int32"])
@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_comparisons(backend: mp.Backend, name: str, dtype: str) -> None:
    a = mp.constant([[1, 2, 3], [4, 5, 6]], dtype=dtype)
    b = mp.constant([3, 2, 4], dtype=dtype)
    out = getattr(ops, name)(a, b)
    assert out.dtype == "bool"
    assert out.numpy().tolist() == COMPARISONS[name](host(a), host(b)).tolist()
    assert getattr(ops, name)(a, 3).numpy().tolist() == COMPARISONS[name](host(a), 3).tolist()


def test_logical_and_isfinite(backend: mp.Backend) -> None:
    p = mp.constant([True, True, False, False])
    q = mp.constant([True, False, True, False])
    assert ops.logical_and(p, q).numpy().tolist() == [True, False, False, False]
    assert ops.logical_or(p, q).numpy().tolist() == [True, True, True, False]
    assert ops.logical_not(p).numpy().tolist() == [False, False, True, True]
    for dtype in FLOATS:
        x = mp.constant([1.0, np.inf, -np.inf, np.nan, 0.0], dtype=dtype)
        out = ops.isfinite(x)
        assert out.dtype == "bool"
        assert out.numpy().tolist() == [True, False, False, False, True]


@pytest.mark.parametrize("dtype", FLOATS)
def test_where_and_clip(backend: mp.Backend, dtype: str) -> None:
    x = mp.constant(data((3, 4)), dtype=dtype)
    y = mp.constant(data((4,), 5, 6), dtype=dtype)
    cond = ops.greater(x, 0.0)
    out = ops.where(cond, x, y)
    assert out.dtype == dtype
    check_close(out, np.where(host(x) > 0, host(x), host(y)), dtype)
    check_close(ops.where(cond, x, 0.0), np.where(host(x) > 0, host(x), 0), dtype)
    clipped = ops.clip_by_value(x, -0.5, 0.5)
    assert clipped.dtype == dtype
    check_close(clipped, np.clip(host(x), -0.5, 0.5), dtype)
    with pytest.raises(TypeError, match="bool"):
        ops.where(x, x, y)


@pytest.mark.parametrize("src", [*FLOATS, "float64", "int32"])
@pytest.mark.parametrize("dst", [*FLOATS, "float64", "int32", "bool"])
def test_cast(backend: mp.Backend, src: str, dst: str) -> None:
    if "float64" in (src, dst) and backend.name != "cpu":
        values = [0.0, 1.0, -2.0, 3.0]
    else:
        values = [0.0, 1.0, -2.0, 3.0, 1.2345678, 65504.0, -0.001]
    x = mp.constant(values, dtype=src)
    y = ops.cast(x, dst)
    assert y.dtype == dst
    want = np.asarray(x.numpy()).astype(np.float64)
    if dst in NUMPY_DTYPES:
        want = rounded(want, dst)
    elif dst == "int32":
        want = np.trunc(want)
    else:
        want = want != 0
    assert np.array_equal(np.asarray(y).astype(np.float64), np.asarray(want, np.float64))
    assert ops.cast(x, src) is x


def test_cast_rounds_to_nearest_even(backend: mp.Backend) -> None:
    x = mp.constant(data((64,), -1e3, 1e3))
    for dtype in ("float16", "bfloat16"):
        got = ops.cast(x, dtype).numpy()
        assert np.array_equal(got, np.asarray(x.numpy()).astype(NUMPY_DTYPES[dtype]))
    big = ops.cast(mp.constant([1e6, -1e6]), "float16")
    assert np.isinf(host(big)).all()  # overflow is inf (then handled by loss scaling)


REDUCTIONS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions(backend: mp.Backend, name: str, dtype: str, axis: Any,
                    keepdims: bool) -> None:
    x = mp.constant(data((3, 4, 5)), dtype=dtype)
    out = getattr(ops, name)(x, axis=axis, keepdims=keepdims)
    category = "deny" if name in ("sum", "mean") else "clear"
    assert out.dtype == low_or(dtype, category)
    want = REDUCTIONS[name](host(x), axis=axis, keepdims=keepdims)
    assert out.shape == np.shape(want)
    check_close(out, want, out.dtype, scale=4.0)


def test_integer_and_bool_reductions(backend: mp.Backend) -> None:
    i = mp.constant([[1, 2], [3, 4]])
    assert i.dtype == "int32"
    assert ops.sum(i).dtype == "int32" and int(ops.sum(i)) == 10
    assert ops.mean(i).dtype == "float32" and float(ops.mean(i)) == 2.5
    assert ops.max(i, axis=0).numpy().tolist() == [3, 4]
    b = mp.constant([True, False, True])
    assert int(ops.sum(b)) == 2


@pytest.mark.parametrize("dtype", [*FLOATS, "int32"])
def test_argmax(backend: mp.Backend, dtype: str) -> None:
    v = np.asarray([[1, 5, 2], [7, 0, 3]])
    x = mp.constant(v, dtype=dtype)
    for axis in (0, 1, -1):
        out = ops.argmax(x, axis=axis)
        assert out.dtype == "int64"
        assert out.numpy().tolist() == np.argmax(v, axis=axis).tolist()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul(backend: mp.Backend, dtype: str, transpose_a: bool, transpose_b: bool) -> None:
    a = mp.constant(data((5, 7) if transpose_a else (7, 5)), dtype=dtype)
    b = mp.constant(data((3, 5) if transpose_b else (5, 3)), dtype=dtype)
    out = ops.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    assert out.dtype == dtype  # an allow op: 16-bit in, 16-bit out
    va, vb = host(a), host(b)
    want = (va.T if transpose_a else va) @ (vb.T if transpose_b else vb)
    check_close(out, want, dtype, scale=2.0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_batched(backend: mp.Backend, dtype: str) -> None:
    a = mp.constant(data((2, 4, 3)), dtype=dtype)
    b = mp.constant(data((2, 3, 5)), dtype=dtype)
    w = mp.constant(data((3, 6)), dtype=dtype)
    check_close(ops.matmul(a, b), host(a) @ host(b), dtype, scale=2.0)
    check_close(ops.matmul(a, w), host(a) @ host(w), dtype, scale=2.0)
    check_close(ops.matmul(b, a, transpose_a=True, transpose_b=True),
                np.swapaxes(host(b), 1, 2) @ np.swapaxes(host(a), 1, 2), dtype, scale=2.0)


def test_matmul_accumulates_16_bit_in_float32(backend: mp.Backend) -> None:
    # a float16 running sum of 4096 ones stalls at 2048 (2049 is not a float16)
    n = 4096
    a = mp.constant(np.ones((1, n)), dtype="float16")
    b = mp.constant(np.ones((n, 1)), dtype="float16")
    assert ops.matmul(a, b).numpy().item() == 4096.0


@pytest.mark.parametrize("dtype", FLOATS)
def test_bias_add_and_relu_grad(backend: mp.Backend, dtype: str) -> None:
    x = mp.constant(data((3, 4)), dtype=dtype)
    bias = mp.constant(data((4,)), dtype=dtype)
    out = ops.bias_add(x, bias)
    assert out.dtype == dtype
    check_close(out, host(x) + host(bias), dtype)
    g = mp.constant(data((3, 4), 1, 2), dtype=dtype)
    y = ops.relu(x)
    check_close(ops.relu_grad(g, y), np.where(host(y) > 0, host(g), 0), dtype)
    with pytest.raises(ValueError, match="bias"):
        ops.bias_add(x, mp.constant(data((3,)), dtype=dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_family(backend: mp.Backend, dtype: str) -> None:
    v = data((4, 6), -5, 5)
    x = mp.constant(v, dtype=dtype)
    xv = host(x)
    for axis in (-1, 0):
        e = np.exp(xv - xv.max(axis=axis, keepdims=True))
        sm = e / e.sum(axis=axis, keepdims=True)
        out = ops.softmax(x, axis=axis)
        assert out.dtype == "float32"
        check_close(out, sm, "float32", scale=2.0)
        lsm = ops.log_softmax(x, axis=axis)
        assert lsm.dtype == "float32"
        check_close(lsm, np.log(sm), "float32", scale=4.0)
    labels = np.asarray([0, 5, 2, 3])
    loss = ops.sparse_softmax_cross_entropy(mp.constant(labels), x)
    assert loss.dtype == "float32" and loss.shape == (4,)
    logp = np.log(np.exp(xv - xv.max(1, keepdims=True)) /
                  np.exp(xv - xv.max(1, keepdims=True)).sum(1, keepdims=True))
    check_close(loss, -logp[np.arange(4), labels], "float32", scale=4.0)


def test_softmax_is_stable_for_large_logits(backend: mp.Backend) -> None:
    x = mp.constant([[1000.0, 0.0, -1000.0], [88.0, 89.0, 90.0]])
    assert np.isfinite(ops.softmax(x).numpy()).all()
    assert np.isfinite(ops.log_softmax(x).numpy()).all()
    loss = ops.sparse_softmax_cross_entropy([2, 2], x)
    check_close(loss, [2000.0, -math.log(1 / (1 + math.exp(-1) + math.exp(-2)))], "float32")


def test_sparse_xent_bad_shapes(backend: mp.Backend) -> None:
    logits = mp.constant(data((3, 4)))
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        ops.sparse_softmax_cross_entropy([0, 1], logits)
    with pytest.raises(TypeError, match="integers"):
        ops.sparse_softmax_cross_entropy([0.0, 1.0, 2.0], logits)


@pytest.mark.parametrize("dtype", [*FLOATS, "int32"])
def test_shape_ops(backend: mp.Backend, dtype: str) -> None:
    v = np.arange(24).reshape(2, 3, 4)
    x = mp.constant(v, dtype=dtype)
    assert ops.shape(x) == (2, 3, 4)
    assert ops.reshape(x, (4, -1)).numpy().astype(np.float64).tolist() == \
        v.reshape(4, -1).tolist()
    assert ops.reshape(x, (2, 3, 4)) is x
    assert np.array_equal(host(ops.transpose(x)), v.transpose())
    assert np.array_equal(host(ops.transpose(x, (1, 0, 2))), v.transpose(1, 0, 2))
    assert np.array_equal(host(ops.transpose(x, (-1, 0, 1))), v.transpose(2, 0, 1))
    assert ops.expand_dims(x, 1).shape == (2, 1, 3, 4)
    assert ops.expand_dims(x, -1).shape == (2, 3, 4, 1)
    assert ops.squeeze(ops.expand_dims(x, 0)).shape == (2, 3, 4)
    assert ops.squeeze(mp.constant(np.zeros((1, 3, 1))), axis=2).shape == (1, 3)
    row = mp.constant(v[0, 0], dtype=dtype)
    assert np.array_equal(host(ops.broadcast_to(row, (2, 3, 4))), np.broadcast_to(v[0, 0],
                                                                                  (2, 3, 4)))
    for out in (ops.reshape(x, (6, 4)), ops.transpose(x), ops.broadcast_to(row, (5, 4))):
        assert out.dtype == dtype
    cat = ops.concat([x, x[:, :1]], axis=1)
    assert cat.dtype == dtype and np.array_equal(host(cat), np.concatenate([v, v[:, :1]], 1))
    st = ops.stack([x, x, x], axis=1)
    assert np.array_equal(host(st), np.stack([v, v, v], axis=1))
    assert np.array_equal(host(ops.stack([x, x], axis=-1)), np.stack([v, v], axis=-1))


def test_concat_promotes_mixed_dtypes(backend: mp.Backend) -> None:
    a = mp.constant([1.0], dtype="float16")
    b = mp.constant([2.0], dtype="float32")
    assert ops.concat([a, b]).dtype == "float32"
    assert ops.concat([a, mp.constant([2.0], dtype="bfloat16")]).dtype == "float32"


@pytest.mark.parametrize("dtype", FLOATS)
def test_take_getitem_one_hot(backend: mp.Backend, dtype: str) -> None:
    v = data((5, 3))
    x = mp.constant(v, dtype=dtype)
    xv = host(x)
    idx = [4, 0, 4, 2]
    assert np.array_equal(host(ops.take(x, idx)), xv[idx])
    assert np.array_equal(host(ops.take(x, mp.constant([2, 0]), axis=1)), xv[:, [2, 0]])
    assert np.array_equal(host(ops.take(x, [[0, 1], [1, 2]], axis=-1)),
                          np.take(xv, [[0, 1], [1, 2]], axis=-1))
    assert ops.take(x, idx).dtype == dtype
    for key in (1, -1, slice(1, 4), (slice(None), 2), (Ellipsis, 1), (None, 2),
                (slice(None, None, 2), slice(1, None))):
        assert np.array_equal(host(x[key]), xv[key]), key
    assert np.array_equal(host(x[mp.constant([3, 1])]), xv[[3, 1]])
    assert np.array_equal(host(x[np.asarray([0, 0])]), xv[[0, 0]])
    with pytest.raises(TypeError, match="integers"):
        ops.take(x, [0.5])
    with pytest.raises(TypeError, match="unsupported index"):
        x[1.5]
    oh = ops.one_hot(mp.constant([0, 2, 1]), 3, dtype=dtype)
    assert oh.dtype == dtype
    assert np.array_equal(host(oh), np.eye(3)[[0, 2, 1]])
    assert ops.one_hot([1], 4).dtype == "float32"


def test_creation(backend: mp.Backend) -> None:
    assert mp.constant(1.5).dtype == "float32"
    assert mp.constant(2).dtype == "int32"
    assert mp.constant(True).dtype == "bool"
    assert mp.constant([[1, 2], [3, 4.5]]).dtype == "float32"
    assert mp.constant(np.zeros(3, np.float16)).dtype == "float16"
    assert mp.constant(np.zeros(3)).dtype == "float64"
    assert mp.constant([1.0], dtype=np.float16).dtype == "float16"
    assert mp.constant([1.0], dtype=float).dtype == "float32"
    assert mp.constant(np.arange(3), dtype="bfloat16").numpy().dtype == NUMPY_DTYPES["bfloat16"]
    for t in (ops.zeros((2, 3)), ops.ones(4, "float16"), ops.full([2], 7.0, "bfloat16")):
        assert t.backend is backend
    assert ops.full([2], 7.0, "bfloat16").numpy().astype(float).tolist() == [7.0, 7.0]
    assert host(ops.zeros((2, 3))).sum() == 0 and host(ops.ones(4, "float16")).sum() == 4
    x = mp.constant([[1.0, 2.0]], dtype="float16")
    assert ops.zeros_like(x).dtype == "float16" and ops.ones_like(x, "float32").shape == (1, 2)
    s = ops.stop_gradient(x)
    assert s is not x and np.array_equal(s.numpy(), x.numpy())
    assert mp.convert_to_tensor(x) is x
    assert mp.constant(x, dtype="float32").dtype == "float32"
    with pytest.raises(TypeError, match="cannot make a tensor"):
        mp.constant(["a", "b"])
    # list(array) holds NumPy scalars: they keep their dtype, as np.array(list(array)) does
    assert mp.constant(list(np.arange(3))).dtype == "int64"
    assert mp.constant(list(np.ones(2, np.float32))).numpy().tolist() == [1.0, 1.0]
    assert mp.constant([1.0, np.float64(2.0)]).dtype == "float32"  # Python floats decide


def test_tensor_numpy_is_read_only(backend: mp.Backend) -> None:
    x = mp.constant([1.0, 2.0])
    with pytest.raises(ValueError):
        x.numpy()[0] = 5.0
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert "shape=(2,)" in repr(x) and "float32" in repr(x)


def test_zero_d_tensors_keep_their_dtype(backend: mp.Backend) -> None:
    for dtype in FLOATS:
        s = mp.constant(3.0, dtype=dtype)
        out = (s * s) * 2.0 + 1.0
        assert out.dtype == dtype
        assert np.asarray(out).dtype == NUMPY_DTYPES[dtype]
        assert float(out) == 19.0
        assert "value=" in repr(out)
