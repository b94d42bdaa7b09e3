"""MultiHeadAttention: forward passes and gradients against a float64 NumPy reference written
from the math, its mixed precision rule, masks, dropout, the functional API and traced
training, its config, its errors. Keras 3's own tests, ported, are in test_attention_keras.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import check_close, rounded

import mpcore as mp
from mpcore import layers

RNG = np.random.default_rng(7)
B, T, S, D, H, K = 2, 3, 4, 5, 2, 3


# --- the float64 reference ------------------------------------------------------------------
def reference(q: np.ndarray, v: np.ndarray, k: np.ndarray | None, w: list[np.ndarray],
              mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per head softmax(Q K^T / sqrt(key_dim) + mask) V, then the output projection; ``mask``
    broadcasts to (B, H, T, S) (1 attends). Returns (output, probabilities)."""
    k = v if k is None else k
    wq, bq, wk, bk, wv, bv, wo, bo = (np.asarray(a, np.float64) for a in w)
    qp = np.einsum("btd,dhk->bhtk", q, wq) + bq[None, :, None, :]
    kp = np.einsum("bsd,dhk->bhsk", k, wk) + bk[None, :, None, :]
    vp = np.einsum("bsd,dhk->bhsk", v, wv) + bv[None, :, None, :]
    scores = np.einsum("bhtk,bhsk->bhts", qp, kp) / np.sqrt(wq.shape[-1])
    if mask is not None:
        scores = scores + (1.0 - mask) * -1e9
    e = np.exp(scores - scores.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    context = np.einsum("bhts,bhsv->bthv", probs, vp)
    return np.einsum("bthv,hvo->bto", context, wo) + bo, probs


def data(t: int = T, s: int = S) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (RNG.normal(size=(B, t, D)).astype(np.float32),
            RNG.normal(size=(B, s, D)).astype(np.float32),
            RNG.normal(size=(B, s, D)).astype(np.float32))


def built(**kwargs: Any) -> layers.MultiHeadAttention:
    """A layer with random (nonzero) biases too, so the reference checks where they go."""
    mha = layers.MultiHeadAttention(H, K, **kwargs)
    mha.build((B, T, D), (B, S, D), (B, S, D))
    mha.set_weights([RNG.normal(size=w.shape) * 0.5 for w in mha.weights])
    return mha


# --- forward and backward against the reference ------------------------------------------
def test_forward_matches_reference_in_float32(backend: mp.Backend) -> None:
    mha = built()
    q, v, k = data()
    mask = (RNG.random((B, T, S)) > 0.3).astype(np.float64)
    mask[:, :, 0] = 1    # every query attends somewhere
    out, scores = mha(q, v, k, attention_mask=mask, return_attention_scores=True)
    want, probs = reference(q, v, k, mha.get_weights(), mask[:, None])
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(scores), probs, rtol=1e-5, atol=1e-6)
    assert out.dtype == scores.dtype == "float32"


@pytest.mark.parametrize("policy,low", [("mixed_float16", "float16"),
                                        ("mixed_bfloat16", "bfloat16")])
def test_forward_under_mixed_policies(backend: mp.Backend, policy: str, low: str) -> None:
    mp.set_global_policy(policy)
    mha = built()
    q, v, k = data()
    out, scores = mha(q, v, k, use_causal_mask=True, return_attention_scores=True)
    # the reference sees what the layer sees: inputs and weights rounded to 16 bits
    w = [rounded(a, low) for a in mha.get_weights()]
    want, probs = reference(rounded(q, low), rounded(v, low), rounded(k, low), w,
                            np.tril(np.ones((T, S))))
    assert out.dtype == low and scores.dtype == "float32"
    assert all(x.dtype == "float32" for x in mha.weights)
    # a few 16-bit roundings (projections, probabilities, context) between input and output
    check_close(out, want, low, scale=4)
    check_close(scores, probs, low, scale=2)


def test_gradients_match_float64_finite_differences(backend: mp.Backend) -> None:
    mha = built()
    q, v, k = data()
    mask = np.ones((B, 1, T, S))
    mask[0, 0, 1, 2] = 0
    r = RNG.normal(size=(B, T, D))
    tq, tv, tk = mp.constant(q), mp.constant(v), mp.constant(k)
    with mp.GradientTape() as tape:
        for t in (tq, tv, tk):
            tape.watch(t)
        loss = mp.ops.sum(mp.ops.multiply(mha(tq, tv, tk, attention_mask=mask),
                                          mp.constant(r.astype(np.float32))))
    grads = tape.gradient(loss, [tq, tv, tk, *mha.trainable_weights])
    args = [q.astype(np.float64), v.astype(np.float64), k.astype(np.float64),
            *mha.get_weights()]

    def f(values: list[np.ndarray]) -> float:
        return float((reference(values[0], values[1], values[2], values[3:], mask)[0]
                      * r).sum())

    for i, (arg, grad) in enumerate(zip(args, grads, strict=True)):
        arg = np.asarray(arg, np.float64)
        numeric = np.zeros_like(arg)
        for j in np.ndindex(arg.shape):
            eps = 1e-6
            plus = [a if n != i else a.copy() for n, a in enumerate(args)]
            minus = [a if n != i else a.copy() for n, a in enumerate(args)]
            plus[i] = np.asarray(plus[i], np.float64)
            minus[i] = np.asarray(minus[i], np.float64)
            plus[i][j] += eps
            minus[i][j] -= eps
            numeric[j] = (f(plus) - f(minus)) / (2 * eps)
        np.testing.assert_allclose(np.asarray(grad), numeric, rtol=2e-4, atol=2e-5,
                                   err_msg=f"gradient {i}")


# --- masks ---------------------------------------------------------------------------------
def test_causal_mask_gives_future_positions_zero_probability(backend: mp.Backend) -> None:
    mha = built()
    x = data(t=4, s=4)[0]
    out, scores = mha(x, x, use_causal_mask=True, return_attention_scores=True)
    p = np.asarray(scores)
    assert p.shape == (B, H, 4, 4)
    assert (p[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
    want, _ = reference(x, x, None, mha.get_weights(), np.tril(np.ones((4, 4))))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


def test_causal_mask_with_t_not_s_is_lower_triangular_as_keras() -> None:
    mha = built()
    q, v, _ = data(t=T, s=S)
    _, scores = mha(q, v, use_causal_mask=True, return_attention_scores=True)
    zero = np.asarray(scores)[..., ~np.tril(np.ones((T, S), bool))]
    assert (zero == 0).all() and scores.shape == (B, H, T, S)


def test_masks_combine_by_and() -> None:
    mha = built()
    q, v, k = data()
    qm = np.array([[1, 1, 0], [1, 1, 1]], bool)
    vm = np.array([[1, 1, 1, 0], [1, 0, 1, 1]], bool)
    am = np.ones((B, T, S), bool)
    am[0, 0, 1] = False
    out = mha(q, v, k, query_mask=qm, value_mask=vm, attention_mask=am, use_causal_mask=True)
    manual = am & qm[:, :, None] & vm[:, None, :] & np.tril(np.ones((T, S), bool))
    same = mha(q, v, k, attention_mask=manual)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(same))
    # key_mask is ANDed as value_mask is
    np.testing.assert_array_equal(np.asarray(mha(q, v, k, key_mask=vm)),
                                  np.asarray(mha(q, v, k, value_mask=vm)))


@pytest.mark.parametrize("shape", [(T, S), (1, T, S), (B, T, S), (B, 1, T, S), (B, H, T, S),
                                   (1, 1, 1, S), (B, T, 1)])
def test_attention_mask_broadcasts(shape: tuple[int, ...]) -> None:
    mha = built()
    q, v, k = data()
    mask = (RNG.random(shape) > 0.4).astype(np.float32)
    mask[..., 0] = 1
    out = mha(q, v, k, attention_mask=mask)
    full = np.broadcast_to(mask if len(shape) == 4 else mask.reshape(
        (1,) * (3 - len(shape)) + shape)[:, None], (B, H, T, S))
    want, _ = reference(q, v, k, mha.get_weights(), full)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


# --- dropout, dtypes, functional use, training --------------------------------------------
def test_dropout_only_in_training() -> None:
    mha = built(dropout=0.5)
    q, v, k = data()
    base = np.asarray(mha(q, v, k))
    np.testing.assert_array_equal(np.asarray(mha(q, v, k, training=False)), base)
    trained = [np.asarray(mha(q, v, k, training=True)) for _ in range(2)]
    assert not np.allclose(trained[0], base) and not np.allclose(trained[0], trained[1])
    # the scores returned are the probabilities before dropout (Keras')
    _, scores = mha(q, v, k, training=True, return_attention_scores=True)
    np.testing.assert_allclose(np.asarray(scores).sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("policy,out_dtype", [("float32", "float32"),
                                              ("mixed_float16", "float16"),
                                              ("mixed_bfloat16", "bfloat16")])
def test_dtypes_under_each_policy(policy: str, out_dtype: str) -> None:
    mp.set_global_policy(policy)
    mha = layers.MultiHeadAttention(H, K)
    q, v, _ = data()
    out, scores = mha(q, v, return_attention_scores=True)
    assert (out.dtype, scores.dtype) == (out_dtype, "float32")
    assert {w.dtype for w in mha.weights} == {"float32"}
    x = mp.Input((T, D))
    sym = mha(x, x, return_attention_scores=True)
    assert (sym[0].dtype, sym[1].dtype) == (out_dtype, "float32")


def test_weights_names_shapes_and_order_are_keras() -> None:
    mha = layers.MultiHeadAttention(H, K, value_dim=4, output_shape=(6,))
    mha(*data()[:2])
    assert [(w.name, w.shape) for w in mha.weights] == [
        ("query/kernel", (D, H, K)), ("query/bias", (H, K)),
        ("key/kernel", (D, H, K)), ("key/bias", (H, K)),
        ("value/kernel", (D, H, 4)), ("value/bias", (H, 4)),
        ("attention_output/kernel", (H, 4, 6)), ("attention_output/bias", (6,))]
    assert mha.name == "multi_head_attention" or mha.name.startswith("multi_head_attention_")
    no_bias = layers.MultiHeadAttention(H, K, use_bias=False)
    no_bias(*data()[:2])
    assert [w.name for w in no_bias.weights] == ["query/kernel", "key/kernel", "value/kernel",
                                                 "attention_output/kernel"]


def _causal_model(seed: int) -> mp.Model:
    mp.random.set_seed(seed)
    x = mp.Input((T, D))
    y = layers.MultiHeadAttention(H, K, dropout=0.1)(x, x, use_causal_mask=True)
    return mp.Model(x, layers.Dense(D)(y))


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_functional_fit_eager_and_traced_give_the_same_bits(backend: mp.Backend,
                                                            policy: str) -> None:
    mp.set_global_policy(policy)
    x = RNG.normal(size=(16, T, D)).astype(np.float32)
    y = RNG.normal(size=(16, T, D)).astype(np.float32)
    weights = []
    for jit in (False, True):
        model = _causal_model(seed=5)
        model.compile(loss="mse", optimizer=mp.optimizers.Adam(0.01), jit_compile=jit)
        mp.random.set_seed(11)    # the same dropout masks in both runs
        history = model.fit(x, y, batch_size=4, epochs=2, verbose=0)
        assert history.history["loss"][-1] < history.history["loss"][0]
        weights.append(model.get_weights())
        assert bool(model._traced) is jit    # the second run replays a traced step
    assert len(weights[0]) == 10
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_get_config_round_trip() -> None:
    mha = layers.MultiHeadAttention(3, 4, value_dim=5, dropout=0.25, use_bias=False,
                                    output_shape=7, attention_axes=-2, seed=3,
                                    kernel_initializer="he_normal", name="attn",
                                    dtype="mixed_bfloat16")
    config = mha.get_config()
    assert list(config) == ["name", "trainable", "dtype", "num_heads", "key_dim", "value_dim",
                            "dropout", "use_bias", "output_shape", "attention_axes",
                            "kernel_initializer", "bias_initializer", "kernel_regularizer",
                            "bias_regularizer", "activity_regularizer", "kernel_constraint",
                            "bias_constraint", "seed"]
    assert config["output_shape"] == (7,) and config["attention_axes"] == (-2,)
    again = layers.MultiHeadAttention.from_config(config)
    assert again.get_config() == config
    assert again.dtype_policy == mp.Policy("mixed_bfloat16")


@pytest.mark.parametrize("policy,low", [("mixed_float16", "float16"),
                                        ("mixed_bfloat16", "bfloat16")])
def test_precision_rule_gemms_16_bit_scores_float32(on_cpu: mp.Backend, policy: str, low: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The projections and probs @ V reach the GEMM kernels in 16 bits, Q K^T in float32, and
    softmax runs on float32 scores (issue 32's rule)."""
    mp.set_global_policy(policy)
    mha = built()
    q, v, k = data()
    kernels = on_cpu.kernels()
    seen: list[tuple[str, tuple[str, ...]]] = []
    for name in ("matmul", "dense", "softmax"):
        if name in kernels:
            def spy(*args: Any, _name: str = name, _kernel: Any = kernels[name]) -> Any:
                seen.append((_name, tuple(str(a.dtype) for a in args[:2]
                                          if hasattr(a, "dtype"))))
                return _kernel(*args)
            monkeypatch.setitem(kernels, name, spy)
    mha(q, v, k)
    gemms = [dtypes for op, dtypes in seen if op in ("matmul", "dense")]
    assert len(gemms) == 6     # four projections, Q K^T and probs @ V
    assert sorted(gemms).count(("float32", "float32")) == 1
    assert all(set(d) == {low} for d in gemms if d != ("float32", "float32"))
    softmax = [dtypes for op, dtypes in seen if op == "softmax"]
    assert softmax in ([], [("float32",)])    # a fused kernel, or composed float32 ops


# --- bad input -----------------------------------------------------------------------------
def test_bad_input_errors_name_what_was_expected() -> None:
    with pytest.raises(ValueError, match="dropout must be a float in"):
        layers.MultiHeadAttention(2, 2, dropout=1.0)
    with pytest.raises(ValueError, match="attention_axes must be an int"):
        layers.MultiHeadAttention(2, 2, attention_axes="1")
    with pytest.raises(NotImplementedError, match="kernel_regularizer"):
        layers.MultiHeadAttention(2, 2, kernel_regularizer="l2")
    q, v, k = data()
    with pytest.raises(ValueError, match=r"query must have rank >= 3 .*got shape \(2, 5\)"):
        layers.MultiHeadAttention(2, 2)(q[:, 0], v)
    with pytest.raises(ValueError, match="query, value and key must have the same rank"):
        layers.MultiHeadAttention(2, 2)(q, v[:, :, None])
    with pytest.raises(ValueError, match="attention_axes must be distinct axes among"):
        layers.MultiHeadAttention(2, 2, attention_axes=2)(q, v)
    mha = built()
    with pytest.raises(ValueError, match="must be equal"):
        mha(q, v, k[:, :2])
    with pytest.raises(ValueError, match=r"was built for query of rank 3 with 5 features"):
        mha(q[..., :4], v)
    with pytest.raises(ValueError, match="must agree on the batch axis"):
        mha(q[:1], v)
    with pytest.raises(ValueError, match=r"attention_mask must broadcast to \(2, 3, 4\).*"
                                         r"\(2, 2, 3, 4\).*got a mask of shape"):
        mha(q, v, attention_mask=np.ones((B, S, T)))
    with pytest.raises(ValueError, match="attention_mask must broadcast"):
        mha(q, v, attention_mask=np.ones((B, 3, T, S)))
    with pytest.raises(ValueError, match="attention_mask must broadcast"):
        mha(q, v, attention_mask=np.ones((S,)))
    with pytest.raises(ValueError, match=r"value_mask must have shape \(batch, S\)"):
        mha(q, v, value_mask=np.ones((B, T)))
    x4 = RNG.normal(size=(2, 3, 4, D)).astype(np.float32)
    with pytest.raises(NotImplementedError, match="use_causal_mask needs attention over axis"):
        layers.MultiHeadAttention(2, 2)(x4, x4, use_causal_mask=True)


def test_high_rank_attention_is_the_rank_3_attention_per_slice() -> None:
    """attention_axes=(2,) on (B, X, T, dim) attends within each X slice: the same as the
    rank-3 layer (same weights) on each slice; and the scores are Keras' (B, X, H, T, S)."""
    mha3 = built()
    mha4 = layers.MultiHeadAttention(H, K, attention_axes=(2,))
    q = RNG.normal(size=(B, 2, T, D)).astype(np.float32)
    v = RNG.normal(size=(B, 2, S, D)).astype(np.float32)
    mha4(q, v)
    mha4.set_weights(mha3.get_weights())
    out, scores = mha4(q, v, return_attention_scores=True)
    assert out.shape == (B, 2, T, D) and scores.shape == (B, 2, H, T, S)
    for x in range(2):
        o, s = mha3(q[:, x], v[:, x], return_attention_scores=True)
        np.testing.assert_allclose(np.asarray(out)[:, x], np.asarray(o), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(scores)[:, x], np.asarray(s), rtol=1e-5,
                                   atol=1e-7)
