"""The Backend base class: what a device plugin provides.

A backend is a subclass of :class:`Backend`, constructed without arguments, with a class attribute
``name``. It says whether it can run here (cheaply: no device is opened to answer), describes its
devices, judges each policy on a device ("supported", "fast", and why), and provides kernels.

Kernels are methods named after ops (``add``, ``matmul``, ``sum`` ...) that take and return the
backend's native arrays. The core casts inputs to the op's compute dtype before calling a kernel
(see :mod:`mpcore.core.categories`), so a kernel receives operands of one dtype and returns that
dtype (comparisons return bool, ``argmax`` int64, ``cast`` its target). Native arrays must expose
``.shape``. Gradients live in the core, written in terms of ops: a backend only writes forward
kernels. :data:`REQUIRED_KERNELS` lists what every backend implements; :data:`OPTIONAL_KERNELS` are
fused versions of composite ops, which the core otherwise builds from the required ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mpcore.core.categories import CATEGORIES, Category

# name -> signature, for the conformance kit and for backend authors.
REQUIRED_KERNELS: dict[str, str] = {
    # host interop and creation
    "asarray": "(value, dtype: str) -> array  # value: scalar, nested list, host or native array",
    "to_host": "(x) -> numpy.ndarray",
    "full": "(shape: tuple, value: float, dtype: str) -> array",
    "cast": "(x, dtype: str) -> array",
    "copy": "(x) -> array",
    "random_uniform": "(shape, dtype, seed: int, minval: float, maxval: float) -> array",
    "random_normal": "(shape, dtype, seed: int, mean: float, stddev: float) -> array",
    # elementwise; binary kernels also accept a Python scalar for one operand
    "add": "(a, b)", "subtract": "(a, b)", "multiply": "(a, b)", "divide": "(a, b)",
    "power": "(a, b)", "maximum": "(a, b)", "minimum": "(a, b)",
    "equal": "(a, b) -> bool", "not_equal": "(a, b) -> bool", "less": "(a, b) -> bool",
    "less_equal": "(a, b) -> bool", "greater": "(a, b) -> bool",
    "greater_equal": "(a, b) -> bool", "logical_and": "(a, b) -> bool",
    "logical_or": "(a, b) -> bool", "logical_not": "(x) -> bool", "isfinite": "(x) -> bool",
    "negative": "(x)", "abs": "(x)", "sign": "(x)", "exp": "(x)", "log": "(x)", "sqrt": "(x)",
    "square": "(x)", "relu": "(x)", "sigmoid": "(x)", "tanh": "(x)", "erf": "(x)",
    "cos": "(x)", "sin": "(x)",
    "where": "(cond, a, b)",
    # reductions: axis is None or a tuple of non-negative ints
    "sum": "(x, axis, keepdims)", "max": "(x, axis, keepdims)", "min": "(x, axis, keepdims)",
    "mean": "(x, axis, keepdims)", "argmax": "(x, axis: int) -> int64",
    # 16-bit inputs accumulate in float32; transposes apply to the last two axes
    "matmul": "(a, b, transpose_a: bool, transpose_b: bool)",
    # shapes and indexing
    "reshape": "(x, shape)", "transpose": "(x, perm)", "broadcast_to": "(x, shape)",
    "concat": "(xs: list, axis: int)", "take": "(x, indices, axis: int)",
    "take_grad": "(g, indices, axis: int, shape) -> zeros(shape) with g added at indices",
    "getitem": "(x, key)  # key: ints, slices, None, Ellipsis (basic indexing only)",
    "getitem_grad": "(g, key, shape) -> zeros(shape) with g written at key",
    "one_hot": "(indices, depth: int, dtype: str)",
    # images, channels last (NHWC); pads = (top, bottom, left, right), computed by the core
    "extract_patches": "(x, kh, kw, stride_h, stride_w, pads) -> (N, OH, OW, kh*kw*C)  # im2col",
    "extract_patches_grad": "(g, x_shape, kh, kw, stride_h, stride_w, pads) -> dx  # col2im",
    "max_pool2d": "(x, ph, pw, stride_h, stride_w, pads) -> y  # padding never wins the max",
    "max_pool2d_grad": "(g, x, y, ph, pw, stride_h, stride_w, pads) -> dx",
    # the multi-tensor loss-scaling kernel: float32 grads * inv_scale, and one device flag
    "unscale_and_check": "(grads: list, inv_scale: float) -> (list of float32, flag)",
}

OPTIONAL_KERNELS: dict[str, str] = {
    "softmax": "(x, axis: int)  # float32",
    "log_softmax": "(x, axis: int)  # float32",
    "sparse_softmax_cross_entropy": "(logits, labels) -> (loss per row, softmax)  # float32",
    "sparse_softmax_cross_entropy_grad": "(probs, labels, g) -> (probs - one_hot(labels)) * "
                                         "g[:, None]  # the fused backward",
    "relu_grad": "(g, y) -> g where y > 0 else 0",
    "relu_grad_bias": "(g, y) -> (relu_grad(g, y), its sum over every axis but the last)"
                      "  # a dense layer's bias gradient; 16-bit: summed in float32, rounded once",
    "bias_add": "(x, bias) -> x + bias over the last axis",
    "batch_norm": "(x, gamma | None, beta | None, epsilon: float) -> (y, mean, var, inv_std)"
                  "  # over every axis but the last; biased variance; statistics float32 (float64"
                  " for float64 x), y in x's dtype (16-bit x: computed in float32, rounded once)",
    "batch_norm_grad": "(dy, x, mean, inv_std, gamma | None) -> (dx, dgamma, dbeta)"
                       "  # dx in x's dtype, dgamma and dbeta in the statistics'",
    "layer_norm": "(x, gamma | None, beta | None, epsilon: float) -> (y, mean, inv_std)"
                  "  # each row over the last axis; biased variance; dtypes as batch_norm's",
    "layer_norm_grad": "(dy, x, mean, inv_std, gamma | None) -> (dx, dgamma, dbeta)",
    "gelu": "(x, approximate: bool) -> (x * Phi(x), saved)  # 16-bit: computed in float32, "
            "rounded once; saved: any native value gelu_grad reuses (Phi(x), say)",
    "gelu_grad": "(g, x, saved, approximate: bool) -> g * d gelu(x)/dx",
    "dense": "(x, w, bias | None, activation: None | 'relu') -> activation(x @ w + bias)"
             "  # 16-bit: bias and activation in float32, rounded once",
    "dropout_mask": "(shape, rate, dtype, seed) -> 0 or 1/(1-rate)",
    # convolution, NHWC images and (kh, kw, C_in, filters) kernels; pads = (top, bottom, left,
    # right) as for extract_patches. The core uses them only where a backend has all three.
    "conv2d": "(x, kernel, stride_h, stride_w, pads) -> y (N, OH, OW, filters)"
              "  # 16-bit: float32 accumulation, rounded once",
    "conv2d_backprop_input": "(dy, kernel, x_shape, stride_h, stride_w, pads) -> dx",
    "conv2d_backprop_filter": "(x, dy, kernel_shape, stride_h, stride_w, pads) -> dkernel",
    "random_permutation": "(n: int, seed: int) -> int64 array, a random order of range(n)",
    # FP8 (mpcore.ops.float8): codes are uint8 arrays of float8_e4m3fn ("e4m3") or float8_e5m2
    # ("e5m2") bits, bit-exact to ml_dtypes; scales are float32 arrays of shape () (multipliers)
    "quantize_fp8": "(x, scale, format) -> (codes, amax)  # codes: x*scale in float32, "
                    "clipped to the format's max, rounded to nearest even; amax: max|x|, float32",
    "dequantize_fp8": "(codes, scale, format, dtype) -> decode(codes) * (1/scale) in dtype",
    "fp8_matmul": "(a, b, a_scale, b_scale, a_format, b_format, transpose_a, transpose_b, "
                  "dtype) -> (decode(a) @ decode(b)) * ((1/a_scale) * (1/b_scale))  # float32 "
                  "accumulation, rounded once to dtype (float32 or bfloat16)",
    "fp8_scale": "(amax, scale, fp8_max: float, margin: int, power_of_two: bool) -> new scale"
                 "  # Transformer Engine's rule; the old scale where amax is 0 or not finite",
    "all_finite": "(xs: list) -> flag",
    # A dynamic loss scale's state on the device (mpcore.ops.loss_scaling): unscale_and_check
    # with the reciprocal read from a float32 array of shape (), and the scale's update from the
    # finite flag, in place: scale and inv_scale float32 (), counters int64 (4,) = good steps,
    # overflows in a row, overflows in a row at the floor (kept once it reaches latch), skipped
    # steps. TF's rule in float32: after `period` finite steps scale *= multiplier where the
    # product is finite (then min with ceiling); at the hysteresis-th overflow in a row
    # scale = max(scale / multiplier, floor); inv_scale = 1 / scale (correctly rounded).
    "unscale_and_check_by": "(grads: list, inv_scale) -> (list of float32, flag)",
    "loss_scale_update": "(scale, inv_scale, counters, flag, period: int, multiplier, floor, "
                         "ceiling, hysteresis: int, latch: int) -> None  # in place",
    # Fused optimizer updates over float32 master weights, in place, returning None. ``flag`` is
    # None or the device bool from unscale_and_check: when it is false the kernel leaves every
    # buffer untouched, so a skipped step needs no host round trip. Hyperparameters are floats;
    # lr is a float or a float32 device scalar (a schedule's rate), read by the kernel.
    "sgd_update": "(var, grad, velocity | None, lr, momentum, nesterov: bool, flag)",
    "rmsprop_update": "(var, grad, ms, mom | None, lr, rho, momentum, epsilon, flag)"
                      "  # Keras: ms = rho*ms + (1-rho)*g^2; var -= lr*g/sqrt(ms+eps)",
    "adam_update": "(var, grad, m, v, rates, beta1, beta2, epsilon, weight_decay, flag)"
                   "  # Keras Adam; rates: float32 (2,) on the device = (alpha, lr*wd) from "
                   "adam_rates; AdamW (decoupled decay var -= rates[1]*var) when wd != 0",
    # Adam's step size from the step count on the device (int64, shape ()): t = iterations+1,
    # alpha = lr*sqrt(1-beta2^t)/(1-beta1^t) and lr*weight_decay in float64 (float32 where the
    # device has none), each rounded once to float32; lr a float or an array of one element
    # (a schedule's rate: float64, float32 where the device has none; a float32 one is widened)
    "adam_rates": "(iterations, lr, beta1, beta2, weight_decay) -> float32 (2,)",
    # the cosine schedules' cosine in one call (else about 80 float64 basic ops): the host's
    # bits, so mpcore.optimizers.cosine_math.cos's algorithm, not the device's libm
    "ieee_cos": "(x: float64 array) -> mpcore.optimizers.cosine_math.cos of each element",
}


@dataclass(frozen=True)
class Device:
    """What a backend knows of one device: enough for the verdict rules, which are pure
    functions of this description (so they can be tested for devices that are not here)."""

    name: str
    vendor: str = ""
    kind: str = "cpu"              # "cpu", "gpu" or "accelerator"
    capability: str = ""           # CUDA compute capability "8.0", "OpenCL 3.0", an ISA level
    features: frozenset[str] = frozenset()   # CPU flags, OpenCL extensions ...
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    index: str = "0"

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "vendor": self.vendor, "kind": self.kind,
                "capability": self.capability, "features": sorted(self.features),
                **dict(self.details)}


@dataclass(frozen=True)
class Support:
    """A backend's judgement of one policy on one device."""

    supported: bool
    fast: bool
    reason: str


@dataclass(frozen=True)
class KernelSet:
    """Kernels a plugin adds to (or overrides in) an existing backend, through the hook
    ``mpcore_kernels``. ``fast_dtypes`` names the 16-bit dtypes whose allow-list ops these
    kernels run at hardware speed, so the backend's verdict can say "fast" and why.

    ``wraps`` maps a kernel name to a factory that receives the kernel the table holds when
    this set is installed (the backend's own, an earlier plugin's, or None) and returns one
    that handles part of the work and hands the rest to it. Two providers can then each take
    over a share of one kernel, in whichever order they load: the CPU backend's ``convert``
    gets float16 from ONNX Runtime and bfloat16 from oneDNN."""

    provider: str
    kernels: Mapping[str, Callable[..., Any]]
    fast_dtypes: frozenset[str] = frozenset()
    reason: str = ""
    wraps: Mapping[str, Callable[[Callable[..., Any] | None], Callable[..., Any]]] = field(
        default_factory=dict)


#: Installs the plugins' kernel sets for ``backend`` into its kernel ``table`` and returns
#: the sets it installed.
KernelSetSource = Callable[["Backend", dict[str, Callable[..., Any]]], tuple[KernelSet, ...]]

# The registry, which knows the plugins, sets this when it loads: a Backend (which plugin
# authors subclass) must not import the plugin manager, which loads the backends.
_kernel_set_source: KernelSetSource | None = None


KernelView = Callable[["Backend", dict[str, Callable[..., Any]]], dict[str, Callable[..., Any]]]
_kernel_view: KernelView | None = None


def set_kernel_view(view: KernelView | None) -> None:
    """Route every ``Backend.kernels()`` through ``view(backend, table)`` (None: the table
    itself). :mod:`mpcore.function` sets it while it traces a step, so the kernel calls of the
    step are recorded whichever op makes them."""
    global _kernel_view
    _kernel_view = view


def set_kernel_set_source(source: KernelSetSource | None) -> None:
    """Where backends get their plugin kernel sets when first activated (None: nowhere, so a
    backend runs its own kernels only). :mod:`mpcore.plugins.registry` sets it to the plugin
    manager."""
    global _kernel_set_source
    _kernel_set_source = source


_NO_DEFAULT: Any = object()


def same_values(given: tuple[Any, ...], bound: tuple[Any, ...]) -> bool:
    """Whether a bound kernel's Python arguments are the ones it was bound to: the same
    objects (a replay passes its program's constants) or equal with the same sign (``-0.0``
    is not ``0.0`` to a kernel)."""
    for a, b in zip(given, bound, strict=True):
        if a is not b and (a != b or math.copysign(1.0, a) != math.copysign(1.0, b)):
            return False
    return True


def bind_call(fn: Callable[..., Any], *args: Any) -> Callable[..., Any] | None:
    """``fn.bind(*args)`` where ``fn`` has a ``bind`` (a method ``m`` of an object with a
    ``bind_m``: that), else None.

    A kernel (or any callable a kernel calls through, such as the CPU backend's ``convert``)
    may offer ``bind(*args)``: given the operands of one call, it returns a callable with the
    same signature and results that does the work for operands like these with less per-call
    work (a GEMM primitive resolved once, memory handles kept), or None where it would gain
    nothing. A traced step replays the bound callable (:meth:`Backend.bind_kernel`). A trace's
    signature fixes the operands' shapes and dtypes and the call's constant arguments; it does
    not fix the arrays themselves (new inputs, variables reassigned, recycled buffers), their
    strides and contiguity, a seed (drawn again at each replay: a bound kernel must take
    it as an argument, never keep the trace's), nor the step's finite flag.
    What it assumed beyond the fixed part it checks at each call, falling back to the unbound
    kernel where that differs."""
    bind = getattr(fn, "bind", None)
    if bind is None:
        owner, name = getattr(fn, "__self__", None), getattr(fn, "__name__", None)
        bind = None if owner is None or name is None else getattr(owner, f"bind_{name}", None)
    return None if bind is None else bind(*args)  # type: ignore[no-any-return]


class BackendUnavailableError(RuntimeError):
    """Raised when a backend is asked to do work it cannot do here."""


class KernelBuildError(BackendUnavailableError):
    """Raised when a backend's kernels do not build on its device (a driver that compiles a
    program without the kernels asked for, or rejects it): the message names the device, the
    driver and what the build said. ``mpcore info`` shows such a backend as failing to build its
    kernels, and auto-detection passes over it."""


class Backend:
    """Base class of every backend (see the module docstring for the kernel contract)."""

    name: ClassVar[str] = ""
    #: Auto-detection picks the available, auto-selectable backend with the highest priority.
    priority: ClassVar[int] = 0
    #: How a user gets what this backend needs, shown when it is unavailable.
    install_hint: ClassVar[str] = ""
    #: Exceptions to :data:`mpcore.core.categories.CATEGORIES` for this hardware.
    category_overrides: ClassVar[Mapping[str, Category]] = {}

    _kernel_table: dict[str, Callable[..., Any]] | None = None
    _kernel_sets: tuple[KernelSet, ...] = ()
    _categories: dict[str, Category] | None = None

    # --- availability and devices -------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here, or None. Must be cheap: no device is opened,
        nothing compiled (it runs at ``import mpcore``)."""
        return None

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def auto_select(self) -> bool:
        """Whether auto-detection may choose this backend (it must be available)."""
        return self.is_available()

    def devices(self) -> list[Device]:
        """Every device this backend can see (may open the driver, not a context)."""
        raise NotImplementedError

    def device(self) -> Device:
        """The device this backend computes on."""
        devices = self.devices()
        if not devices:
            raise BackendUnavailableError(f"backend {self.name!r} sees no device")
        return devices[0]

    def policy_support(self, policy: str, device: Device) -> Support:
        """Can ``policy`` run on ``device``, fast, and why. Subclasses delegate to a pure rule
        function of the device description."""
        if policy in ("float32", "float64"):
            return Support(True, True, f"{policy} runs natively")
        return Support(False, False, f"backend {self.name!r} does not declare {policy}")

    def compatibility_message(self, policy: str) -> tuple[bool, str]:
        """(ok, text) for the log line "Mixed precision compatibility check (<policy>): ...".
        The default judges the current device; CUDA overrides it to speak of every GPU."""
        support = self.policy_support(policy, self.device())
        return support.fast, support.reason

    def compile_program(self, program: Any) -> Callable[[list[Any]], Any] | None:
        """A faster way to run a traced step (``program``: an
        :class:`mpcore.tracing.program.Program` of kernel calls on this backend), as ``run(input
        arrays) -> outputs``, or None for the generic replay (``Program.compile``: one Python call
        per kernel). A backend may fuse elementwise chains, preallocate buffers or capture a device
        graph here."""
        return None

    def bind_kernel(self, name: str, kernel: Callable[..., Any],
                    args: tuple[Any, ...]) -> Callable[..., Any] | None:
        """What a traced step replays for this call of kernel ``name`` (the table's
        ``kernel``, called with ``args`` while tracing): a callable bound to operands like
        these (:func:`bind_call`), or None for the kernel itself: the kernel's own ``bind``,
        or for a kernel method ``m`` of a backend, its ``bind_m``."""
        return bind_call(kernel, *args)

    def synchronize(self) -> None:
        """Wait until queued device work is done (for timing). Synchronous backends: no-op."""

    def layer_hint(self, layer_name: str, dims: Any, policy: Any) -> None:
        """Called by layers when they build, with their matmul dimensions ({"units": 64}) and
        policy, so a backend can give hardware advice (CUDA: the tensor-core multiple-of-8
        tip). Default: nothing."""

    # --- kernels ------------------------------------------------------------------------
    def kernels(self) -> dict[str, Callable[..., Any]]:
        """The kernel table: this class's kernel methods, then plugins' KernelSets on top."""
        if self._kernel_table is None:
            self._activate()
        assert self._kernel_table is not None
        if _kernel_view is not None:
            return _kernel_view(self, self._kernel_table)
        return self._kernel_table

    def kernel(self, name: str, default: Any = _NO_DEFAULT) -> Callable[..., Any]:
        """The kernel ``name`` of the kernel table (activating the backend on first use). One
        the table lacks raises KeyError, or gives ``default`` where one is passed, as
        ``backend.kernel("dense", None)`` for an optional fused kernel."""
        found = self.kernels().get(name, default)
        if found is _NO_DEFAULT:
            raise KeyError(f"backend {self.name!r} has no kernel {name!r}")
        return found

    @property
    def kernel_sets(self) -> tuple[KernelSet, ...]:
        """The plugin kernel sets installed on this backend (activates it)."""
        self.kernels()
        return self._kernel_sets

    def categories(self) -> dict[str, Category]:
        if self._categories is None:
            self._categories = {**CATEGORIES, **self.category_overrides}
        return self._categories

    def install_advice(self) -> str:
        """What to install for this backend to come up here, shown with its unavailable
        reason: ``install_hint``, or "" where installing would change nothing (CUDA without a
        usable GPU)."""
        return self.install_hint

    def missing_kernels(self) -> list[str]:
        return [k for k in REQUIRED_KERNELS if not callable(getattr(self, k, None))]

    def _activate(self) -> None:
        reason = self.unavailable_reason()
        if reason is not None:
            advice = self.install_advice()
            raise BackendUnavailableError(f"backend {self.name!r} is not available: {reason}"
                                     + (f" (install with {advice})" if advice else ""))
        missing = self.missing_kernels()
        if missing:
            raise NotImplementedError(f"backend {self.name!r} lacks required kernels: "
                                      + ", ".join(missing))
        table = {name: getattr(self, name) for name in (*REQUIRED_KERNELS, *OPTIONAL_KERNELS)
                 if callable(getattr(self, name, None))}
        source = _kernel_set_source
        self._kernel_sets = () if source is None else source(self, table)
        self.categories()
        self._kernel_table = table

    def fast_dtypes_from_plugins(self) -> dict[str, str]:
        """dtype -> reason, for 16-bit dtypes a plugin kernel set runs at hardware speed."""
        out: dict[str, str] = {}
        for kernel_set in self.kernel_sets:
            for dtype in kernel_set.fast_dtypes:
                out[dtype] = kernel_set.reason or f"kernels from {kernel_set.provider}"
        return out

    # --- measurement --------------------------------------------------------------------
    def measure_matmul(self, dtype: str, n: int = 1024, repeats: int = 5) -> float:
        """GFLOP/s of an n x n matmul in ``dtype`` on this backend (best of ``repeats``)."""
        k = self.kernels()
        a = k["random_uniform"]((n, n), dtype, 1, -1.0, 1.0)
        b = k["random_uniform"]((n, n), dtype, 2, -1.0, 1.0)
        k["matmul"](a, b, False, False)  # warm-up: compile, allocate, pick algorithms
        self.synchronize()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            k["matmul"](a, b, False, False)
            self.synchronize()
            best = min(best, time.perf_counter() - t0)
        return 2.0 * n**3 / best / 1e9

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
