"""Kernel providers keep the CPU kernels' semantics for non-finite values (issue 15).

Every kernel a provider installs on the CPU backend (enumerated from its kernel sets, so a new
one cannot be left out) is fed NaN of both signs, +Inf, -Inf and signed zeros in each dtype it
takes, and its results are compared with the plain CPU backend's (no providers): bit for bit
(a NaN's payload aside, its sign not) where the provider promises the CPU kernel's bits, and
the pattern of NaN, +Inf and -Inf where the results may differ in rounding (GEMMs, sums).
Each provider is checked as the settings choose it: oneDNN forced and automatic (float32 work
on), ONNX Runtime, and all of them together; a provider that cannot load here is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import assert_same_bits
from mpcore_cpu import CpuBackend

import mpcore as mp
from mpcore.plugins import registry

#: the CPU backend current, whatever MPCORE_BACKEND says (its own kernels are tested)
pytestmark = pytest.mark.usefixtures("on_cpu")

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float32": F32, "float16": F16, "bfloat16": BF16}
NAN = np.float32(np.nan)

#: name -> the settings that choose the provider(s), and the provider(s) they must install
CONFIGS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "onednn-force": ({"MPCORE_ONEDNN": "force", "MPCORE_ONEDNN_FLOAT32": "on",
                      "MPCORE_ONNXRUNTIME": "off"}, ("mpcore_onednn",)),
    "onednn-auto": ({"MPCORE_ONEDNN": "auto", "MPCORE_ONEDNN_FLOAT32": "on",
                     "MPCORE_ONNXRUNTIME": "off"}, ("mpcore_onednn",)),
    "onnxruntime": ({"MPCORE_ONEDNN": "off", "MPCORE_ONNXRUNTIME": "auto"},
                    ("mpcore_onnxruntime",)),
    "all": ({"MPCORE_ONEDNN": "force", "MPCORE_ONEDNN_FLOAT32": "on",
             "MPCORE_ONNXRUNTIME": "auto"}, ("mpcore_onednn", "mpcore_onnxruntime")),
}
_OFF = {"MPCORE_ONEDNN": "off", "MPCORE_ONNXRUNTIME": "off"}


def _skip_unless_loadable(providers: tuple[str, ...]) -> None:
    if "mpcore_onednn" in providers:
        import mpcore_onednn

        try:
            mpcore_onednn.library()
        except mpcore_onednn.DnnlError as exc:
            pytest.skip(f"oneDNN cannot be loaded here: {exc}")
    if "mpcore_onnxruntime" in providers:
        pytest.importorskip("onnxruntime")


def _backends(monkeypatch: pytest.MonkeyPatch, config: str) -> tuple[CpuBackend, CpuBackend]:
    """(the CPU backend with the config's providers, the plain CPU backend)."""
    settings, providers = CONFIGS[config]
    _skip_unless_loadable(providers)
    if "mpcore_onednn" in providers:   # the small cases' GEMMs on oneDNN too, not NumPy
        import mpcore_onednn.linalg

        monkeypatch.setattr(mpcore_onednn.linalg, "SMALL_GEMM", 0)
    for name, value in _OFF.items():
        monkeypatch.setenv(name, value)
    plain = CpuBackend()
    plain.kernels()
    assert plain.kernel_sets == ()
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    backend = CpuBackend()
    assert {s.provider for s in backend.kernel_sets} == set(providers)
    return backend, plain


# --- inputs ----------------------------------------------------------------------------------
def _normal(shape: tuple[int, ...], seed: int, dtype: np.dtype = F32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape, dtype=np.float32) + 0.25).astype(dtype)


def _sprinkle(a: np.ndarray, seed: int, values: tuple[float, ...] = (
        np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0), count: int = 600) -> np.ndarray:
    """``a`` (float32) with ``count`` of ``values`` at random places."""
    rng = np.random.default_rng(seed)
    flat = a.reshape(-1)
    where = rng.choice(flat.size, min(count, flat.size), replace=False)
    flat[where] = rng.choice(np.array(values, np.float32), len(where))
    return a


def _gemm_operands(dtype: np.dtype, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """GEMM operands whose non-finite results do not depend on the order of summation:
    moderate finite values (no overflow), NaN and infinities of both signs in rows of ``a``
    and columns of ``b``, and an inf meeting a zero."""
    a, b = _normal((m, k), 1), _normal((k, n), 2)
    a[0, 3] = NAN
    a[1, 2], a[2, 5] = np.inf, -np.inf
    a[3, 0], a[3, 1] = np.inf, -np.inf           # a row of NaN
    a[4, 6] = -np.nan
    b[4, 1] = NAN
    b[7, 2], b[8, 3] = np.inf, -np.inf
    b[2, 4] = 0.0                                 # inf * 0 in row 1
    return a.astype(dtype), b.astype(dtype)


# --- the cases: kernel name -> (dtypes, a function of (dtype) giving argument tuples) --------
Cases = Callable[[np.dtype], Iterator[tuple[Any, ...]]]


def _matmul(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    a, b = _gemm_operands(dtype, 40, 24, 36)
    yield a, b, False, False
    yield np.ascontiguousarray(a.T), np.ascontiguousarray(b.T), True, True
    yield a[None].repeat(2, 0), b[None].repeat(2, 0), False, False   # batched


def _dense(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x, w = _gemm_operands(dtype, 40, 24, 36)
    bias = _normal((36,), 3)
    bias[5], bias[6], bias[7], bias[8] = NAN, np.inf, -np.inf, -np.nan
    x[10] = 0.0        # a row of zeros: its pre-activations are the bias, -0 and -inf too
    bias[9] = -0.0
    for activation in (None, "relu"):
        yield x, w, None, activation
        yield x, w, bias.astype(dtype), activation
        yield x.reshape(4, 10, 24), w, bias.astype(dtype), activation


def _relu_grad_bias(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    shape = (512, 256)      # at least the size the providers take
    y = _sprinkle(np.maximum(_normal(shape, 4) - 0.25, 0), 5, count=4000)
    g = _sprinkle(_normal(shape, 6), 7, values=(0.0, -0.0), count=2000)
    yield g.astype(dtype), y.astype(dtype)                  # y non-finite, g finite
    yield _sprinkle(g.copy(), 8, count=50).astype(dtype), y.astype(dtype)
    yield _sprinkle(g.copy(), 9, values=(np.inf,), count=1).astype(dtype), y.astype(dtype)


def _state(seed: int, count: int) -> list[np.ndarray]:
    """var, grad and ``count - 2`` optimizer slots (the last one >= 0: second moments)."""
    shape = (512, 256)
    arrays = [_sprinkle(_normal(shape, seed + i) * 0.1, seed + 10 + i, count=300)
              for i in range(count)]
    if count > 2:
        arrays[-1] = np.abs(arrays[-1])
    return arrays


def _sgd(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    yield *_state(20, 2), None, 0.05, 0.0, False, None
    yield *_state(30, 3), 0.01, 0.9, False, None
    yield *_state(40, 3), 0.01, 0.9, True, None


def _rmsprop(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    yield *_state(50, 3), None, 1e-3, 0.9, 0.0, 1e-7, None


def _adam(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    rates = CpuBackend().adam_rates       # (alpha, lr*wd) at steps 3 and 1
    yield (*_state(60, 4), rates(np.array(2, np.int64), 1e-3, 0.9, 0.999, 0.0), 0.9, 0.999,
           1e-7, 0.0, None)
    yield (*_state(70, 4), rates(np.array(0, np.int64), 1e-3, 0.9, 0.999, 0.004), 0.9, 0.999,
           1e-7, 0.004, None)                                              # AdamW


def _unscale(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    for inv_scale in (2.0**-15, 4.0):
        big = _sprinkle(_normal((512, 256), 80) * 1e4, 81, count=40).astype(dtype)
        yield [big, _sprinkle(_normal((8, 8), 82), 83, count=3).astype(dtype)], inv_scale
        yield [(_normal((512, 256), 84) * 100).astype(dtype)], inv_scale   # all finite


def _specials(dtype: np.dtype) -> np.ndarray:
    """Every special value of ``dtype`` (NaNs with payloads and both signs, infinities,
    signed zeros, subnormals, the largest finite values and, for float32, values that round
    to a 16-bit dtype's subnormals, ties and overflow), tiled past the providers' sizes."""
    if dtype == F32:
        bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345, 0x7FFFFFFF,
                         0x7F800000, 0xFF800000, 0x00000000, 0x80000000, 0x00000001,
                         0x80000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x807F8000,
                         0x007F7FFF, 0x7F7FFFFF, 0xFF7F8000, 0x477FF000, 0x47800000,
                         0x33800000, 0x33000001, 0x387FC000, 0x3F808000, 0x3F818000],
                        np.uint32).view(F32)
    else:
        every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        bits = every.view(dtype)
    noise = _normal((1 << 16,), 90, dtype)
    return np.concatenate([np.tile(bits, max(1, (1 << 15) // bits.size)), noise])


def _convert(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x = _specials(dtype)
    for target in DTYPES.values():
        if target != dtype:
            yield x, target
            yield x[: 1 << 10], target   # small: the fallback's share


def _conv_operands(dtype: np.dtype, dy_shape: tuple[int, ...] = (2, 5, 4, 32),
                   dy_finite: bool = False, x_shape: tuple[int, ...] = (2, 9, 8, 16)
                   ) -> tuple[np.ndarray, ...]:
    """An image and an output gradient with NaN, infinities and signed zeros, and a finite
    kernel. Where a non-finite kernel weight or output gradient meets the padding, the
    composite multiplies it by the padding's zeros (NaN) and oneDNN, which never reads the
    padding, does not: such cases are left out (the step's other gradients are non-finite
    anyway: the center tap of every window is inside the image)."""
    x = _sprinkle(_normal(x_shape, 11), 12, count=12).astype(dtype)
    w = _normal((3, 3, 16, 32), 13).astype(dtype)
    dy = _normal(dy_shape, 14)
    dy = (dy if dy_finite else _sprinkle(dy, 15, count=12)).astype(dtype)
    return x, w, dy


def _conv2d(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x, w, _ = _conv_operands(dtype)
    yield x, w, 2, 2, (1, 1, 0, 1)          # "same", strided
    yield x, w, 1, 1, (0, 0, 0, 0)          # "valid"


def _conv2d_backprop_input(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x, w, dy = _conv_operands(dtype)
    yield dy, w, x.shape, 2, 2, (1, 1, 0, 1)


def _conv2d_backprop_filter(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    # "valid", every pixel in some window: oneDNN's bfloat16 kernel multiplies a pixel no
    # window reads (an inf there: NaN) where the composite never reads it
    x, w, dy = _conv_operands(dtype, (2, 4, 4, 32), x_shape=(2, 9, 9, 16))
    yield x, dy, w.shape, 2, 2, (0, 0, 0, 0)
    x, w, dy = _conv_operands(dtype, dy_finite=True)
    yield x, dy, w.shape, 2, 2, (1, 1, 0, 1)            # padded, non-finite image only


def _norm_operands(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """An input of ``dtype`` with a few NaN and infinities (most channels and rows left
    finite), a gradient likewise, and finite float32 gamma and beta."""
    x = _sprinkle(_normal(shape, 21), 22, count=6).astype(dtype)
    dy = _sprinkle(_normal(shape, 23), 24, count=6).astype(dtype)
    return x, dy, _normal(shape[-1:], 25), _normal(shape[-1:], 26)


def _binary(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    # large enough for the ONNX Runtime provider's float32 route (float16), with every kind
    # of non-finite value, overflow (6e4 + 6e4 in float16) and a broadcast operand
    from mpcore_onnxruntime import MIN_ELEMENTS

    a = _sprinkle(_normal((MIN_ELEMENTS // 64, 64), 31), 32)
    b = _sprinkle(_normal((MIN_ELEMENTS // 64, 64), 33), 34)
    a[0, :4], b[0, :4] = 6e4, [6e4, -6e4, 1e-7, 3.0]
    yield a.astype(dtype), b.astype(dtype)
    yield a.astype(dtype), b[:1].astype(dtype)


def _batch_norm(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x, _, gamma, beta = _norm_operands(dtype, (8, 5, 5, 16))
    yield x, gamma, beta, 1e-3
    yield x, None, None, 1e-3


def _batch_norm_grad(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x, dy, gamma, beta = _norm_operands(dtype, (8, 5, 5, 16))
    _, mean, _, inv = CpuBackend().batch_norm(x, gamma, beta, 1e-3)
    yield dy, x, mean, inv, gamma
    yield dy, x, mean, inv, None


def _layer_norm(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x, _, gamma, beta = _norm_operands(dtype, (40, 24))
    yield x, gamma, beta, 1e-3
    yield x, None, None, 1e-3


def _layer_norm_grad(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x, dy, gamma, beta = _norm_operands(dtype, (40, 24))
    _, mean, inv = CpuBackend().layer_norm(x, gamma, beta, 1e-3)
    yield dy, x, mean, inv, gamma
    yield dy, x, mean, inv, None


def _gelu(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    # NaN and large finite inputs: oneDNN's gelu(+inf) is NaN where NumPy's is +inf (both
    # non-finite; see mpcore_onednn.eltwise)
    x = np.linspace(-6, 6, 64).astype(dtype)
    x[[3, 40]] = np.nan
    x[[10, 50]] = [-3e4, 3e4]
    for approximate in (False, True):
        yield x, approximate


def _gelu_grad(dtype: np.dtype) -> Iterator[tuple[Any, ...]]:
    x = np.linspace(-6, 6, 64).astype(dtype)
    x[7] = np.nan
    g = np.cos(np.arange(64)).astype(dtype)
    g[[2, 20, 30]] = [np.nan, np.inf, -np.inf]
    for approximate in (False, True):
        yield g, x, CpuBackend().gelu(x, approximate)[1], approximate


def _reference(plain: CpuBackend, name: str) -> Any:
    """The plain CPU backend's kernel; for a fused kernel it lacks (the convolutions), the
    core's composite on its kernels (the provider's own fallback, given no dtype for oneDNN)."""
    kernel = plain.kernels().get(name) or getattr(plain, name, None)   # convert: a method
    if kernel is not None:
        return kernel
    from mpcore_onednn.convolution import ConvKernels

    return ConvKernels(None, frozenset(), plain.extract_patches,  # type: ignore[arg-type]
                       plain.extract_patches_grad, plain.kernels()["matmul"]).table()[name]


CASES: dict[str, tuple[tuple[str, ...], Cases]] = {
    "matmul": (("float32", "float16", "bfloat16"), _matmul),
    "dense": (("float32", "float16", "bfloat16"), _dense),
    "relu_grad_bias": (("float32", "float16", "bfloat16"), _relu_grad_bias),
    "sgd_update": (("float32",), _sgd),            # fused updates: float32 master weights
    "rmsprop_update": (("float32",), _rmsprop),
    "adam_update": (("float32",), _adam),
    "unscale_and_check": (("float32", "float16", "bfloat16"), _unscale),
    "convert": (("float32", "float16", "bfloat16"), _convert),
    "conv2d": (("float32", "float16", "bfloat16"), _conv2d),
    "conv2d_backprop_input": (("float32", "float16", "bfloat16"), _conv2d_backprop_input),
    "conv2d_backprop_filter": (("float32", "float16", "bfloat16"), _conv2d_backprop_filter),
    # the normalization ops hand their kernels 16-bit inputs as they are (float16 runs on
    # oneDNN's float32 primitives; bfloat16 ones exist where the GEMMs take bfloat16)
    "batch_norm": (("float32", "float16"), _batch_norm),
    "batch_norm_grad": (("float32", "float16"), _batch_norm_grad),
    "layer_norm": (("float32", "float16"), _layer_norm),
    "layer_norm_grad": (("float32", "float16"), _layer_norm_grad),
    "gelu": (("float32", "float16", "bfloat16"), _gelu),
    "gelu_grad": (("float32", "float16", "bfloat16"), _gelu_grad),
    # ONNX Runtime's float16 arithmetic through float32 (float32 keeps NumPy's loop)
    "add": (("float16", "float32"), _binary),
    "subtract": (("float16", "float32"), _binary),
    "multiply": (("float16", "float32"), _binary),
}
#: How each kernel's results are compared with the CPU kernel's: "bits" (a NaN's payload
#: aside), "bits-nan" (where an operation meets two NaNs, IEEE 754 leaves open which one it
#: returns, so the order of operands decides a NaN's sign), "pattern" (NaN, +Inf and -Inf
#: alone: GEMMs and sums round in their own order). relu_grad_bias: its gradient; its bias
#: gradient is a sum.
MODES = {"add": "bits-nan", "subtract": "bits-nan", "multiply": "bits-nan",
         "matmul": "pattern", "dense": "pattern", "relu_grad_bias": "bits",
         "sgd_update": "bits-nan", "rmsprop_update": "bits-nan", "adam_update": "bits-nan",
         "unscale_and_check": "bits", "convert": "bits", "conv2d": "pattern",
         "conv2d_backprop_input": "pattern", "conv2d_backprop_filter": "pattern",
         "batch_norm": "pattern", "batch_norm_grad": "pattern", "layer_norm": "pattern",
         "layer_norm_grad": "pattern", "gelu": "pattern", "gelu_grad": "pattern"}


def _result(name: str, result: Any) -> Any:
    """What is compared of a kernel's result: gelu's output, not what it keeps for gelu_grad
    (each implementation keeps its own: NumPy Phi(x), oneDNN nothing)."""
    return result[0] if name == "gelu" else result


# --- comparing ------------------------------------------------------------------------------
def _arrays(result: Any) -> list[np.ndarray]:
    """The arrays in a kernel's result or arguments, in order."""
    if isinstance(result, (tuple, list)):
        return [a for r in result for a in _arrays(r)]
    return [result] if isinstance(result, (np.ndarray, np.generic)) else []


def _same_bits_but_nan_signs(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    bits = f"u{got.itemsize}"
    assert np.array_equal(got[~nan].view(bits), want[~nan].view(bits))


def _same_pattern(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.dtype == bool:
        assert np.array_equal(got, want), what
        return
    wide_got, wide_want = got.astype(np.float64), want.astype(np.float64)
    for test in (np.isnan, np.isposinf, np.isneginf):
        bad = np.flatnonzero(test(wide_got) != test(wide_want))
        assert not bad.size, (f"{what}: {test.__name__} differs at {bad.size} places, e.g. "
                              f"{wide_got.reshape(-1)[bad[0]]} for {wide_want.reshape(-1)[bad[0]]}")


def _compare(name: str, index: int, got: np.ndarray, want: np.ndarray, what: str) -> None:
    mode = MODES[name] if name != "relu_grad_bias" or index == 0 else "pattern"
    if mode == "bits":
        assert_same_bits(got, want)
    elif mode == "bits-nan":
        _same_bits_but_nan_signs(got, want)
    else:
        _same_pattern(got, want, what)


def _copies(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.copy() if isinstance(a, np.ndarray)
                 else [g.copy() for g in a] if isinstance(a, list) else a for a in args)


def _runs(kernel: Any) -> int:
    """How many times ``kernel`` (or, for a wrapped chain, any link of it) ran on its
    provider: oneDNN primitive executions (through its cache, or on primitives of its own:
    SGD's and RMSprop's ``passes``) or conversions made."""
    total = 0
    while kernel is not None:
        cache = getattr(kernel, "cache", None)
        if cache is not None:
            total += cache.hits + cache.misses
        passes = getattr(kernel, "passes", None)
        if passes is not None:
            total += passes.runs
        total += getattr(kernel, "calls", 0)
        kernel = getattr(kernel, "fallback", None)
    return total


def _installed(backend: CpuBackend) -> set[str]:
    return {name for s in backend.kernel_sets for name in (*s.kernels, *s.wraps)}


@pytest.mark.parametrize("config", CONFIGS)
def test_every_provider_kernel_has_a_nonfinite_case(monkeypatch: pytest.MonkeyPatch,
                                                    config: str) -> None:
    backend, _ = _backends(monkeypatch, config)
    missing = _installed(backend) - set(CASES)
    assert not missing, f"kernels without a non-finite case here: {sorted(missing)}"


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("config", CONFIGS)
def test_provider_kernels_keep_the_cpu_kernels_nonfinite_values(
        monkeypatch: pytest.MonkeyPatch, config: str, name: str) -> None:
    backend, plain = _backends(monkeypatch, config)
    if name not in _installed(backend):
        pytest.skip(f"{config} installs no {name} kernel")
    kernel = backend.kernels()[name]
    reference = _reference(plain, name)
    dtypes, cases = CASES[name]
    ran = []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        calls = list(cases(dtype))
        kernel(*_copies(calls[0]))        # first use: probes, primitive creation
        before = _runs(kernel)
        for index, args in enumerate(calls):
            ours, theirs = _copies(args), _copies(args)
            with np.errstate(all="ignore"):   # signalling NaNs, overflow: on purpose
                got = _arrays(_result(name, kernel(*ours))) + _arrays(ours)
                want = _arrays(_result(name, reference(*theirs))) + _arrays(theirs)
                for i, (g, w) in enumerate(zip(got, want)):
                    _compare(name, i, g, w, f"{name} {dtype_name} call {index} array {i}")
        if _runs(kernel) > before:
            ran.append(dtype_name)
    assert ran, f"{name} never ran on {config}'s provider: the comparison proved nothing"


# --- the model-level regression (issue 15 item 2) -------------------------------------------
@pytest.fixture
def provider_backend(request: pytest.FixtureRequest,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[CpuBackend]:
    backend, _ = _backends(monkeypatch, request.param)
    previous, note = registry._current, registry._detection_note
    mp.set_backend(backend)
    try:
        yield backend
    finally:
        registry._current, registry._detection_note = previous, note


@pytest.mark.parametrize("provider_backend", ["onednn-force", "onednn-auto"], indirect=True)
@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_a_nan_input_makes_a_nan_loss_and_prediction(provider_backend: CpuBackend,
                                                     policy: str) -> None:
    """One NaN in ``x`` of Dense(8, relu) -> Dense(3) -> softmax: the loss of the epoch is
    NaN and the NaN row's prediction is NaN, as on the plain CPU backend (the fused relu
    must not turn the NaN pre-activation into 0)."""
    mp.random.set_seed(0)
    with mp.policy_scope(policy):
        inputs = mp.Input(shape=(4,))
        hidden = mp.layers.Dense(8, activation="relu")(inputs)
        logits = mp.layers.Dense(3)(hidden)
        outputs = mp.layers.Activation("softmax", dtype="float32")(logits)
        model = mp.Model(inputs=inputs, outputs=outputs)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.SGD(0.1))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    x[3, 1] = np.nan
    y = rng.integers(0, 3, 16)
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isnan(history.history["loss"][0])
    probs = model.predict(x, verbose=0)
    assert np.isnan(probs[3]).all()
    assert np.isfinite(np.delete(probs, 3, axis=0)).all()
