"""The conformance kit: hold any backend to the contract the built-in ones meet.

A third-party backend author runs it against their backend::

    python -m mpcore.conformance NAME [--quick] [--json] [--only PATTERN]
    mpcore conformance NAME
    mpcore.conformance.check(backend) -> Report

It checks, with the CPU backend as the reference and dtype-aware tolerances:

- the Backend contract: a class attribute ``name``, construction without arguments, a cheap
  (timed) ``unavailable_reason()``, ``devices()`` returning :class:`~mpcore.Device` objects,
  ``policy_support`` returning a :class:`~mpcore.Support` for every policy, every kernel of
  :data:`~mpcore.backend.REQUIRED_KERNELS` present and callable;
- every required kernel's values, dtype and shape on small random inputs, in float32 and (where
  the core calls the kernel in 16 bits, i.e. the op is not *deny* on this backend) float16 and
  bfloat16: broadcasting, Python-scalar operands, reductions over axes with keepdims, matmul
  transposes and batches, shape ops, indexing, image kernels, random kernels (determinism per
  seed, moments), the ``unscale_and_check`` flag on finite/inf/nan inputs; the optional kernels
  a backend provides (fused optimizer updates must honour the flag and leave every buffer
  untouched when it is false);
- gradients of a small MLP and its loss through GradientTape against the CPU backend;
- a short mixed_float16 training run with a LossScaleOptimizer that skips a step with an Inf
  and recovers.

The reference runs the CPU backend's kernels in float64 on the inputs as the tested backend
holds them (rounded to its dtype), so a result is judged at the tolerance of the dtype it is
delivered in, and checking the CPU backend against itself still means something.

Design decision, NumPy: the core (``mpcore/``) has no NumPy-specific code on the paths it uses
at ``import mpcore``. This module is a tool, loaded only when run (``mpcore conformance``,
``python -m mpcore.conformance`` or ``check``), so it imports NumPy and ml_dtypes lazily, inside
the functions that need them: importing it (as ``mpcore.cli`` does, to register the
subcommand) adds no NumPy import of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import itertools
import json
import math
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mpcore.backend import OPTIONAL_KERNELS, REQUIRED_KERNELS, Backend, Device, Support
from mpcore.categories import Category
from mpcore.cli import subcommand
from mpcore.policy import POLICIES

PASS, FAIL, SKIP = "pass", "fail", "skip"
FLOATS = ("float32", "float16", "bfloat16")
LOW = ("float16", "bfloat16")

# (rtol, atol) by the dtype a result is delivered in: about one or two roundings of that dtype
# (the same table the project's own backend-generic tests use).
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (2e-3, 2e-3),
    "bfloat16": (2e-2, 2e-2),
    "float32": (1e-5, 1e-6),
    "float64": (1e-10, 1e-12),
}

#: ``unavailable_reason()`` runs at ``import mpcore``; slower than this is a failure.
CHEAP_SECONDS = 0.25


class CheckFailedError(AssertionError):
    """A check found the backend breaking the contract; the message says where and how."""


class CheckSkippedError(Exception):
    """A check that does not apply to this backend; the message says why."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    group: str
    status: str          # "pass", "fail" or "skip"
    detail: str
    seconds: float
    kernels: tuple[str, ...] = ()


@dataclass
class Report:
    """Every check run against ``backend``, in order."""

    backend: str
    reference: str
    quick: bool
    results: list[CheckResult] = field(default_factory=list)
    only: tuple[str, ...] = ()   # the --only patterns, if the run was filtered

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAIL]

    @property
    def ok(self) -> bool:
        """No check failed, and at least one passed (unless ``only`` chose checks that all
        skip: a filtered run proves only what it selected)."""
        return not self.failures and (bool(self.only)
                                      or any(r.status == PASS for r in self.results))

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in (PASS, FAIL, SKIP)}

    def covered_kernels(self) -> set[str]:
        """Kernels exercised by a check that passed."""
        return {k for r in self.results if r.status == PASS for k in r.kernels}

    def result(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        names = ", ".join(r.name for r in self.results)
        raise KeyError(f"no check named {name!r}; checks: {names}")

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "reference": self.reference, "quick": self.quick,
                "only": list(self.only), "ok": self.ok, "counts": self.counts(),
                "uncovered_required_kernels": sorted(set(REQUIRED_KERNELS)
                                                     - self.covered_kernels()),
                "results": [{**asdict(r), "kernels": list(r.kernels),
                             "seconds": round(r.seconds, 4)} for r in self.results]}

    def format_table(self) -> str:
        width = max([len(r.name) for r in self.results] + [5])
        lines = [f"mpcore conformance: backend {self.backend!r} against {self.reference!r}"
                 f"{' (quick)' if self.quick else ''}", "",
                 f"{'status':<6}  {'check':<{width}}  {'ms':>7}  detail"]
        for r in self.results:
            lines.append(f"{r.status.upper():<6}  {r.name:<{width}}  {r.seconds * 1e3:7.1f}  "
                         f"{r.detail}")
        c = self.counts()
        lines += ["", f"{c[PASS]} passed, {c[FAIL]} failed, {c[SKIP]} skipped: "
                  + ("CONFORMS" if self.ok else "DOES NOT CONFORM")
                  + (f" (only the checks matching {', '.join(self.only)})" if self.only else "")]
        uncovered = sorted(set(REQUIRED_KERNELS) - self.covered_kernels())
        if uncovered and not self.only:
            lines.append("required kernels not proven by a passing check: "
                         + ", ".join(uncovered))
        return "\n".join(lines)


@dataclass(frozen=True)
class _Check:
    name: str
    group: str
    fn: Callable[[_Context], str | None]
    kernels: tuple[str, ...] = ()


# --- the context: both backends, host helpers, comparisons --------------------------------
class _Context:
    def __init__(self, backend: Backend, reference: Backend, quick: bool) -> None:
        import ml_dtypes
        import numpy as np

        self.np = np
        self.be = backend
        self.ref = reference
        self.quick = quick
        self.np_dtypes: dict[str, Any] = {
            "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
            "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
            "int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "bool": np.dtype(np.bool_),
        }
        self._k: dict[str, Callable[..., Any]] | None = None
        self._rk: dict[str, Callable[..., Any]] | None = None

    @property
    def k(self) -> dict[str, Callable[..., Any]]:
        if self._k is None:
            self._k = self.be.kernels()
        return self._k

    @property
    def rk(self) -> dict[str, Callable[..., Any]]:
        if self._rk is None:
            self._rk = self.ref.kernels()
        return self._rk

    def kernel(self, name: str) -> Callable[..., Any]:
        fn = self.k.get(name)
        if fn is None:
            raise CheckSkippedError(f"{name} is not provided (optional: the core composes it from "
                                    "required kernels)")
        return fn

    def rng(self, *key: Any) -> Any:
        # Seeded by the check's own key (crc32, not hash(): that changes per process), so the
        # inputs are the same in every run and one check's never depend on another's.
        return self.np.random.default_rng(zlib.crc32(repr(key).encode()))

    def data(self, shape: tuple[int, ...], low: float = -2.0, high: float = 2.0,
             key: Any = None) -> Any:
        return self.rng("data", shape, low, high, key).uniform(low, high, shape)

    def rounded(self, values: Any, dtype: str) -> Any:
        np = self.np
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(values).astype(self.np_dtypes[dtype]).astype(
                np.float64 if dtype in (*FLOATS, "float64") else self.np_dtypes[dtype])

    def up(self, values: Any, dtype: str) -> Any:
        """``values`` on the tested backend (always from a private host copy: a backend may
        keep the host array as its own, and in-place kernels would then write into it)."""
        np = self.np
        with np.errstate(over="ignore", invalid="ignore"):
            host = np.array(values, dtype=self.np_dtypes[dtype], copy=True)
        return self.be.asarray(host, dtype)

    def ref_up(self, values: Any, dtype: str) -> Any:
        """``values`` as the tested backend holds them in ``dtype``, on the reference, in
        float64 for floating dtypes."""
        np = self.np
        if dtype in FLOATS:
            return self.ref.asarray(np.array(self.rounded(values, dtype), copy=True), "float64")
        return self.ref.asarray(np.array(values, dtype=self.np_dtypes[dtype], copy=True), dtype)

    def host(self, x: Any, who: str) -> Any:
        np = self.np
        out = self.be.to_host(x)
        if not isinstance(out, np.ndarray):
            raise CheckFailedError(f"{who}: to_host returned {type(out).__name__}, not a "
                                   "numpy.ndarray")
        return out

    def ref_host(self, x: Any) -> Any:
        return self.np.asarray(self.ref.to_host(x))

    def flag(self, x: Any, who: str) -> bool:
        h = self.np.asarray(self.host(x, who))
        if h.size != 1:
            raise CheckFailedError(f"{who}: the flag has {h.size} elements, expected one")
        return bool(h.reshape(()))

    def expect(self, got: Any, want: Any, dtype: str, what: str, scale: float = 1.0,
               magnitude: Any = None) -> None:
        """``got`` (a native array of the tested backend) is ``want`` (a host array), with
        dtype name ``dtype``, at that dtype's tolerance times ``scale`` (plus float32's
        resolution of ``magnitude``, the same result on absolute values, for sums)."""
        np = self.np
        h = self.host(got, what)
        if h.dtype != self.np_dtypes[dtype]:
            raise CheckFailedError(f"{what}: returned dtype {h.dtype.name}, expected {dtype}")
        want = np.asarray(want)
        if h.shape != want.shape:
            raise CheckFailedError(f"{what}: returned shape {h.shape}, expected {want.shape}")
        if dtype not in (*FLOATS, "float64"):
            if not np.array_equal(h, want.astype(h.dtype)):
                bad = np.argwhere(h != want.astype(h.dtype))
                i = tuple(bad[0]) if bad.size else ()
                raise CheckFailedError(f"{what}: {len(bad)} of {h.size} values differ; at {i} got "
                                       f"{h[i]!r}, expected {want.astype(h.dtype)[i]!r}")
            return
        g = h.astype(np.float64)
        w = want.astype(np.float64)
        rtol, atol = (t * scale for t in TOLERANCES[dtype])
        limit = atol + rtol * np.abs(w)
        if magnitude is not None:
            limit = limit + 4 * np.finfo(np.float32).eps * np.asarray(magnitude, np.float64)
        with np.errstate(invalid="ignore"):
            same_special = (np.isnan(g) & np.isnan(w)) | ((g == w) & np.isinf(w))
            bad = ~(same_special | (np.abs(g - w) <= limit))
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            raise CheckFailedError(f"{what}: {int(bad.sum())} of {h.size} values outside "
                                   f"rtol={rtol:g} atol={atol:g}; at {i} got {g[i]!r}, "
                                   f"expected {w[i]!r}")

    def ref_call(self, name: str, *args: Any) -> Any:
        return self.ref_host(self.rk[name](*args))

    def low_ok(self, op: str, dtype: str) -> None:
        """Skip a 16-bit case the core never runs on this backend (a *deny* op)."""
        if dtype in LOW and self.be.categories().get(op) == Category.DENY:
            raise CheckSkippedError(f"{op} is a deny op here: the core calls it in float32 only")


# --- contract -----------------------------------------------------------------------------
def _contract_name(ctx: _Context) -> str:
    cls = type(ctx.be)
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise CheckFailedError(f"{cls.__name__}.name must be a non-empty str class attribute, got "
                               f"{name!r}")
    if "name" in vars(ctx.be):
        raise CheckFailedError(f"{cls.__name__} sets name on the instance; it must be a class "
                               "attribute (the registry reads it before construction)")
    if not isinstance(cls.priority, int):
        raise CheckFailedError(f"{cls.__name__}.priority must be an int, got {cls.priority!r}")
    if not isinstance(cls.install_hint, str):
        raise CheckFailedError(f"{cls.__name__}.install_hint must be a str")
    return f"name {name!r}, priority {cls.priority}"


def _contract_constructor(ctx: _Context) -> str:
    cls = type(ctx.be)
    t0 = time.perf_counter()
    try:
        fresh = cls()
    except TypeError as exc:
        raise CheckFailedError(f"{cls.__name__}() must work without arguments: {exc}") from exc
    took = time.perf_counter() - t0
    if fresh.name != ctx.be.name:
        raise CheckFailedError(f"a fresh {cls.__name__}() is named {fresh.name!r}, not "
                               f"{ctx.be.name!r}")
    if took > CHEAP_SECONDS:
        raise CheckFailedError(f"{cls.__name__}() took {took * 1e3:.0f} ms; construction runs at "
                               f"import mpcore and must not open a device (limit "
                               f"{CHEAP_SECONDS * 1e3:.0f} ms)")
    return f"{took * 1e3:.2f} ms"


def _contract_unavailable_reason(ctx: _Context) -> str:
    fresh = type(ctx.be)()
    timings = []
    for _ in range(3):  # the first call on a fresh instance counts: that is import mpcore's
        t0 = time.perf_counter()
        reason = fresh.unavailable_reason()
        timings.append(time.perf_counter() - t0)
        if reason is not None and not isinstance(reason, str):
            raise CheckFailedError(f"unavailable_reason() returned {reason!r}; expected None or a "
                                   "str saying why")
    if max(timings) > CHEAP_SECONDS:
        raise CheckFailedError(f"unavailable_reason() took {max(timings) * 1e3:.0f} ms; it runs "
                               "at import mpcore and must be cheap (limit "
                               f"{CHEAP_SECONDS * 1e3:.0f} ms, no device opened, nothing "
                               "compiled)")
    if ctx.be.unavailable_reason() is not None:
        raise CheckFailedError(f"backend is not available here: {ctx.be.unavailable_reason()}; "
                               "its kernels cannot be checked")
    return f"first call {timings[0] * 1e3:.2f} ms, then {min(timings[1:]) * 1e3:.3f} ms"


def _contract_devices(ctx: _Context) -> str:
    devices = ctx.be.devices()
    if not isinstance(devices, list) or not devices:
        raise CheckFailedError(f"devices() must return a non-empty list, got {devices!r}")
    for d in devices:
        if not isinstance(d, Device):
            raise CheckFailedError(f"devices() returned {type(d).__name__}, not mpcore.Device")
        if not d.name or not isinstance(d.name, str):
            raise CheckFailedError(f"a device has no name: {d!r}")
        if d.kind not in ("cpu", "gpu", "accelerator"):
            raise CheckFailedError(f"device {d.name!r} has kind {d.kind!r}; expected cpu, gpu or "
                                   "accelerator")
        if not isinstance(d.features, frozenset):
            raise CheckFailedError(f"device {d.name!r}: features must be a frozenset")
        json.dumps(d.describe(), default=str)
    current = ctx.be.device()
    if current not in devices:
        raise CheckFailedError(f"device() returned {current.name!r}, which devices() does not list")
    return f"{len(devices)} device(s); computing on {current.name!r}"


def _contract_policy_support(ctx: _Context) -> str:
    device = ctx.be.device()
    fast = []
    for policy in POLICIES:
        s = ctx.be.policy_support(policy, device)
        if not isinstance(s, Support):
            raise CheckFailedError(f"policy_support({policy!r}) returned {type(s).__name__}, not "
                                   "mpcore.Support")
        if not isinstance(s.supported, bool) or not isinstance(s.fast, bool):
            raise CheckFailedError(f"policy_support({policy!r}): supported/fast must be bools")
        if not isinstance(s.reason, str) or not s.reason.strip():
            raise CheckFailedError(f"policy_support({policy!r}) gives no reason; say why")
        if s.fast and not s.supported:
            raise CheckFailedError(f"policy_support({policy!r}) says fast but not supported")
        if s.fast:
            fast.append(policy)
    if not ctx.be.policy_support("float32", device).supported:
        raise CheckFailedError("float32 must be supported")
    ok, text = ctx.be.compatibility_message("mixed_float16")
    if not isinstance(ok, bool) or not isinstance(text, str) or not text:
        raise CheckFailedError("compatibility_message('mixed_float16') must return (bool, text)")
    return "fast: " + (", ".join(fast) or "none")


def _contract_required_kernels(ctx: _Context) -> str:
    missing = ctx.be.missing_kernels()
    if missing:
        raise CheckFailedError("required kernels missing or not callable: " + ", ".join(missing))
    table = ctx.be.kernels()
    absent = [k for k in REQUIRED_KERNELS if not callable(table.get(k))]
    if absent:
        raise CheckFailedError("kernels() lacks required kernels: " + ", ".join(absent))
    return f"all {len(REQUIRED_KERNELS)} present"


def _contract_optional_kernels(ctx: _Context) -> str:
    table = ctx.be.kernels()
    have = [k for k in OPTIONAL_KERNELS if callable(table.get(k))]
    return f"{len(have)} of {len(OPTIONAL_KERNELS)}: " + (", ".join(have) or "none")


# --- creation -----------------------------------------------------------------------------
def _asarray(ctx: _Context) -> None:
    np = ctx.np
    cases: list[tuple[Any, str]] = [
        ([[1.0, -2.5], [0.0, 65504.0]], "float32"), ([[1.0, -2.5], [0.0, 65504.0]], "float16"),
        ([[1.0, -2.5], [0.0, 256.0]], "bfloat16"), ([3, -7, 0], "int32"),
        ([2**40, -1], "int64"), ([True, False, True], "bool"), (2.5, "float32"),
        (np.arange(6.0).reshape(2, 3), "float16"), ([], "float32")]
    for value, dtype in cases:
        want = np.asarray(value, dtype=ctx.np_dtypes[dtype])
        ctx.expect(ctx.be.asarray(value, dtype), want, dtype, f"asarray({value!r}, {dtype})")


def _full(ctx: _Context) -> None:
    np = ctx.np
    for dtype in (*FLOATS, "int32", "bool"):
        for shape, value in (((2, 3), 1.5 if dtype in FLOATS else 1), ((), 0), ((0, 4), 7)):
            want = np.full(shape, value, dtype=ctx.np_dtypes[dtype])
            ctx.expect(ctx.k["full"](shape, value, dtype), want, dtype,
                       f"full({shape}, {value}, {dtype})")


def _cast(ctx: _Context) -> None:
    values = [0.0, 1.0, -2.0, 3.0, 1.2345678, -0.001, 250.0, 65504.0, 1e5, -1e5, 3.0e-5]
    dtypes = (*FLOATS, "int32", "bool")
    for src in dtypes:
        vals = [v for v in values if abs(v) < 2e4] if src in ("int32", "bool") else values
        with ctx.np.errstate(over="ignore"):  # 1e5 is inf in float16, on purpose
            host = ctx.np.asarray(vals, dtype=ctx.np_dtypes[src]) if src != "bool" else \
                ctx.np.asarray([v != 0 for v in vals])
        x = ctx.up(host, src)
        rx = ctx.rk["asarray"](host, src)
        for dst in dtypes:
            if src in FLOATS and dst == "int32":
                continue  # out-of-range float -> int is undefined behaviour in C
            ctx.expect(ctx.k["cast"](x, dst), ctx.ref_call("cast", rx, dst), dst,
                       f"cast {src} -> {dst}")


def _copy(ctx: _Context) -> None:
    for dtype in (*FLOATS, "int32", "bool"):
        host = ctx.data((3, 4), key=dtype) > 0 if dtype == "bool" else ctx.data((3, 4), key=dtype)
        x = ctx.up(host, dtype)
        y = ctx.k["copy"](x)
        if y is x:
            raise CheckFailedError(f"copy[{dtype}] returned its input; it must be a new array "
                                   "(Variables own theirs and kernels update them in place)")
        ctx.expect(y, ctx.host(x, "copy"), dtype, f"copy[{dtype}]")


# --- elementwise --------------------------------------------------------------------------
# kernel -> (input range, tolerance scale)
UNARY: dict[str, tuple[tuple[float, float], float]] = {
    "negative": ((-3, 3), 1), "abs": ((-3, 3), 1), "sign": ((-3, 3), 1),
    "exp": ((-3, 3), 4), "log": ((0.1, 5), 4), "sqrt": ((0.1, 5), 2), "square": ((-3, 3), 2),
    "relu": ((-3, 3), 1), "sigmoid": ((-6, 6), 4), "tanh": ((-3, 3), 4), "erf": ((-3, 3), 4),
}
BINARY: dict[str, tuple[tuple[float, float], float]] = {
    "add": ((-2, 2), 2), "subtract": ((-2, 2), 2), "multiply": ((-2, 2), 2),
    "divide": ((0.5, 2), 2), "power": ((0.5, 2), 4), "maximum": ((-2, 2), 1),
    "minimum": ((-2, 2), 1),
}
COMPARISONS = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")


def _unary(name: str, dtype: str) -> Callable[[_Context], None]:
    (lo, hi), scale = UNARY[name]

    def run(ctx: _Context) -> None:
        ctx.low_ok(name, dtype)
        host = ctx.data((3, 5), lo, hi, key=name)
        if name in ("sign", "relu", "abs"):
            host[0, :3] = (0.0, -0.0, 1.0)
        want = ctx.ref_call(name, ctx.ref_up(host, dtype))
        ctx.expect(ctx.k[name](ctx.up(host, dtype)), want, dtype, f"{name}[{dtype}]", scale)
        if dtype == "float32" and name in ("negative", "abs", "relu", "sign", "exp", "sqrt",
                                           "tanh"):
            special = ctx.np.asarray([ctx.np.inf, -ctx.np.inf, ctx.np.nan, 0.0])
            if name == "sqrt":
                special = special[[0, 3]]
            ctx.expect(ctx.k[name](ctx.up(special, dtype)),
                       ctx.ref_call(name, ctx.ref_up(special, dtype)), dtype,
                       f"{name}[{dtype}] on inf/nan", scale)

    return run


def _binary(name: str, dtype: str) -> Callable[[_Context], None]:
    (lo, hi), scale = BINARY[name]

    def run(ctx: _Context) -> None:
        ctx.low_ok(name, dtype)
        k, rk = ctx.k[name], ctx.rk[name]
        integer = dtype == "int32"

        def make(shape: tuple[int, ...], key: str) -> Any:
            d = ctx.data(shape, lo, hi + 0.5, key=(name, key))
            return ctx.np.round(d * 3) if integer else d

        shapes = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((3, 1), (1, 4)),
                  ((2, 3, 4), (3, 1)), ((), (2, 3))]
        for sa, sb in shapes:
            a, b = make(sa, "a"), make(sb, "b")
            want = ctx.ref_host(rk(ctx.ref_up(a, dtype), ctx.ref_up(b, dtype)))
            ctx.expect(k(ctx.up(a, dtype), ctx.up(b, dtype)), want, dtype,
                       f"{name}[{dtype}] {sa} with {sb}", scale)
        a = make((2, 3), "s")
        scalars: tuple[float | int, ...] = (2, 3) if integer else (1.5, 2, 0.25)
        for s in scalars:
            ra = ctx.ref_up(a, dtype)
            ctx.expect(k(ctx.up(a, dtype), s), ctx.ref_host(rk(ra, s)), dtype,
                       f"{name}[{dtype}](x, Python scalar {s!r})", scale)
            ctx.expect(k(s, ctx.up(a, dtype)), ctx.ref_host(rk(s, ra)), dtype,
                       f"{name}[{dtype}](Python scalar {s!r}, x)", scale)

    return run


def _comparison(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        np = ctx.np
        a = np.asarray([[1, 2, 3], [4, 5, 6]], dtype=np.float64)
        b = np.asarray([3, 2, 4], dtype=np.float64)
        special = np.asarray([np.nan, 1.0, np.inf, -np.inf])
        for name in COMPARISONS:
            k, rk = ctx.k[name], ctx.rk[name]
            ctx.expect(k(ctx.up(a, dtype), ctx.up(b, dtype)),
                       ctx.ref_host(rk(ctx.ref_up(a, dtype), ctx.ref_up(b, dtype))), "bool",
                       f"{name}[{dtype}] (2, 3) with (3,)")
            ctx.expect(k(ctx.up(a, dtype), 3), ctx.ref_host(rk(ctx.ref_up(a, dtype), 3)),
                       "bool", f"{name}[{dtype}](x, Python scalar 3)")
            ctx.expect(k(3, ctx.up(a, dtype)), ctx.ref_host(rk(3, ctx.ref_up(a, dtype))),
                       "bool", f"{name}[{dtype}](Python scalar 3, x)")
            if dtype in FLOATS:
                ctx.expect(k(ctx.up(special, dtype), ctx.up(special[::-1], dtype)),
                           ctx.ref_host(rk(ctx.ref_up(special, dtype),
                                           ctx.ref_up(special[::-1], dtype))),
                           "bool", f"{name}[{dtype}] with nan and inf")

    return run


def _logical(ctx: _Context) -> None:
    np = ctx.np
    p = np.asarray([[True, True, False, False]])
    q = np.asarray([[True], [False]])
    for name in ("logical_and", "logical_or"):
        ctx.expect(ctx.k[name](ctx.up(p, "bool"), ctx.up(q, "bool")),
                   ctx.ref_call(name, ctx.ref_up(p, "bool"), ctx.ref_up(q, "bool")), "bool",
                   f"{name} (1, 4) with (2, 1)")
    ctx.expect(ctx.k["logical_not"](ctx.up(p, "bool")), ~p, "bool", "logical_not")


def _isfinite(ctx: _Context) -> None:
    np = ctx.np
    x = np.asarray([[1.0, np.inf, -np.inf], [np.nan, 0.0, -3.5]])
    for dtype in FLOATS:
        ctx.expect(ctx.k["isfinite"](ctx.up(x, dtype)), np.isfinite(x), "bool",
                   f"isfinite[{dtype}]")


def _where(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        x = ctx.data((3, 4), key="where-x")
        cond = x > 0
        for sa, sb in (((3, 4), (3, 4)), ((3, 4), (4,)), ((1, 4), ())):
            a, b = ctx.data(sa, key="where-a"), ctx.data(sb, 5, 6, key="where-b")
            want = ctx.ref_call("where", ctx.ref_up(cond, "bool"), ctx.ref_up(a, dtype),
                                ctx.ref_up(b, dtype))
            ctx.expect(ctx.k["where"](ctx.up(cond, "bool"), ctx.up(a, dtype), ctx.up(b, dtype)),
                       want, dtype, f"where[{dtype}] cond (3, 4), {sa}, {sb}")

    return run


# --- reductions ---------------------------------------------------------------------------
AXES: tuple[tuple[int, ...] | None, ...] = (None, (0,), (1,), (2,), (0, 2))


def _reduction(name: str, dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        ctx.low_ok(name, dtype)
        np = ctx.np
        if dtype == "int32":
            host = np.round(ctx.data((2, 3, 4), -50, 50, key=name))
        else:
            host = ctx.data((2, 3, 4), key=name)
        for axis in AXES:
            for keepdims in (False, True):
                x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
                want = ctx.ref_call(name, rx, axis, keepdims)
                mag = (ctx.ref_call(name, ctx.ref_up(np.abs(host), dtype), axis, keepdims)
                       if name in ("sum", "mean") else None)
                ctx.expect(ctx.k[name](x, axis, keepdims), want, dtype,
                           f"{name}[{dtype}] axis={axis} keepdims={keepdims}", 2, mag)

    return run


def _argmax(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        np = ctx.np
        # distinct values exactly representable in every dtype: no ties to break
        host = ctx.rng("argmax").permutation(24).reshape(2, 3, 4).astype(np.float64) - 12
        for axis in (0, 1, 2):
            ctx.expect(ctx.k["argmax"](ctx.up(host, dtype), axis), np.argmax(host, axis),
                       "int64", f"argmax[{dtype}] axis={axis}")

    return run


# --- matmul -------------------------------------------------------------------------------
def _matmul(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        np = ctx.np
        # odd sizes catch a swapped dimension; square ones a transpose ignored where shapes
        # cannot tell
        sizes = [(5, 7, 3) if ctx.quick else (17, 33, 9), (4, 4, 4)]
        for (m, k, n), batch in itertools.product(sizes, ((), (2,))):
            for ta in (False, True):
                for tb in (False, True):
                    sa = (*batch, *((k, m) if ta else (m, k)))
                    sb = (*batch, *((n, k) if tb else (k, n)))
                    a, b = ctx.data(sa, key=("mm-a", sa)), ctx.data(sb, key=("mm-b", sb))
                    want = ctx.ref_call("matmul", ctx.ref_up(a, dtype), ctx.ref_up(b, dtype),
                                        ta, tb)
                    mag = ctx.ref_call("matmul", ctx.ref_up(np.abs(a), dtype),
                                       ctx.ref_up(np.abs(b), dtype), ta, tb)
                    ctx.expect(ctx.k["matmul"](ctx.up(a, dtype), ctx.up(b, dtype), ta, tb),
                               want, dtype,
                               f"matmul[{dtype}] {sa}{'^T' if ta else ''} @ "
                               f"{sb}{'^T' if tb else ''}", 2, mag)

    return run


# --- shapes and indexing ------------------------------------------------------------------
def _shapes(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        np = ctx.np
        host = ctx.data((2, 3, 4), key="shapes")
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        for shape in ((6, 4), (4, 6), (24,), (2, 12), (1, 2, 3, 4)):
            ctx.expect(ctx.k["reshape"](x, shape), ctx.ref_call("reshape", rx, shape), dtype,
                       f"reshape[{dtype}] (2, 3, 4) -> {shape}")
        for perm in ((2, 0, 1), (0, 2, 1), (1, 0, 2), (0, 1, 2)):
            ctx.expect(ctx.k["transpose"](x, perm), ctx.ref_call("transpose", rx, perm), dtype,
                       f"transpose[{dtype}] perm={perm}")
        # a transposed view fed to another kernel must read in the logical order
        t = ctx.k["transpose"](x, (2, 0, 1))
        ctx.expect(ctx.k["reshape"](t, (4, 6)),
                   ctx.ref_call("reshape", ctx.rk["transpose"](rx, (2, 0, 1)), (4, 6)), dtype,
                   f"reshape[{dtype}] of a transpose")
        for src, shape in (((4,), (3, 4)), ((3, 1), (3, 4)), ((), (2, 2)), ((1, 4), (2, 3, 4))):
            h = ctx.data(src, key=("bc", src))
            ctx.expect(ctx.k["broadcast_to"](ctx.up(h, dtype), shape),
                       ctx.ref_call("broadcast_to", ctx.ref_up(h, dtype), shape), dtype,
                       f"broadcast_to[{dtype}] {src} -> {shape}")
        parts = [ctx.data((2, 3), key="c0"), ctx.data((1, 3), key="c1"),
                 ctx.data((3, 3), key="c2")]
        ctx.expect(ctx.k["concat"]([ctx.up(p, dtype) for p in parts], 0),
                   np.concatenate([ctx.rounded(p, dtype) for p in parts], 0), dtype,
                   f"concat[{dtype}] axis 0 of (2, 3), (1, 3), (3, 3)")
        parts = [ctx.data((2, 1, 4), key="d0"), ctx.data((2, 3, 4), key="d1")]
        ctx.expect(ctx.k["concat"]([ctx.up(p, dtype) for p in parts], 1),
                   np.concatenate([ctx.rounded(p, dtype) for p in parts], 1), dtype,
                   f"concat[{dtype}] axis 1 of (2, 1, 4), (2, 3, 4)")

    return run


def _take(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        host = ctx.data((5, 3), key="take")
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        cases = (([4, 0, 0, 2], "int32", 0), ([2, 0], "int64", 1), ([[1, 3], [0, 4]], "int32", 0))
        for idx, idt, axis in cases:
            want = ctx.ref_call("take", rx, ctx.ref_up(idx, idt), axis)
            ctx.expect(ctx.k["take"](x, ctx.up(idx, idt), axis), want, dtype,
                       f"take[{dtype}] indices {idx} ({idt}) axis={axis}")
        # repeated indices must accumulate, not overwrite
        g = ctx.data((4, 3), key="take-g")
        for idx, idt in (([4, 0, 0, 2], "int32"), ([1, 1, 1, 1], "int64")):
            want = ctx.ref_call("take_grad", ctx.ref_up(g, dtype), ctx.ref_up(idx, idt), 0,
                                (5, 3))
            ctx.expect(ctx.k["take_grad"](ctx.up(g, dtype), ctx.up(idx, idt), 0, (5, 3)), want,
                       dtype, f"take_grad[{dtype}] indices {idx} axis=0 (repeats accumulate)",
                       2)
        g = ctx.data((5, 2), key="take-g1")
        want = ctx.ref_call("take_grad", ctx.ref_up(g, dtype), ctx.ref_up([2, 2], "int32"), 1,
                            (5, 3))
        ctx.expect(ctx.k["take_grad"](ctx.up(g, dtype), ctx.up([2, 2], "int32"), 1, (5, 3)),
                   want, dtype, f"take_grad[{dtype}] indices [2, 2] axis=1", 2)

    return run


GETITEM_KEYS: tuple[tuple[Any, ...], ...] = (
    (1,), (slice(1, None),), (slice(None, None, 2), slice(1, 3)), (Ellipsis, 0),
    (None, slice(None), -1), (slice(None, None, -1),), (-1, slice(None), 2),
    (slice(0, 0),), (0, 1, 2),
)


def _getitem(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        host = ctx.data((3, 4, 5), key="getitem")
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        for key in GETITEM_KEYS:
            want = ctx.ref_call("getitem", rx, key)
            ctx.expect(ctx.k["getitem"](x, key), want, dtype, f"getitem[{dtype}] key={key}")
            g = ctx.data(want.shape, key=("gi", key))
            ctx.expect(ctx.k["getitem_grad"](ctx.up(g, dtype), key, (3, 4, 5)),
                       ctx.ref_call("getitem_grad", ctx.ref_up(g, dtype), key, (3, 4, 5)),
                       dtype, f"getitem_grad[{dtype}] key={key}")

    return run


def _one_hot(ctx: _Context) -> None:
    for dtype in FLOATS:
        for idx, idt in (([0, 2, 1, 3], "int32"), ([[3, 0], [1, 1]], "int64")):
            want = ctx.ref_call("one_hot", ctx.ref_up(idx, idt), 4, dtype)
            ctx.expect(ctx.k["one_hot"](ctx.up(idx, idt), 4, dtype), want, dtype,
                       f"one_hot indices {idx} ({idt}) depth 4 -> {dtype}")


# --- images -------------------------------------------------------------------------------
IMAGE_CASES = ((3, 2, 1, 1, (0, 0, 0, 0)), (3, 3, 2, 2, (1, 1, 0, 1)), (2, 2, 2, 1, (0, 1, 1, 0)))


def _image_input(ctx: _Context, shape: tuple[int, ...]) -> Any:
    # distinct small integers: exact in every dtype, so the max of a window is unique
    np = ctx.np
    n = math.prod(shape)
    return (ctx.rng("image", shape).permutation(n) - n // 2).astype(np.float64).reshape(shape)


def _geometry(size: tuple[int, int], window: tuple[int, int], strides: tuple[int, int],
              pads: tuple[int, int, int, int]) -> tuple[int, int]:
    oh = (size[0] + pads[0] + pads[1] - window[0]) // strides[0] + 1
    ow = (size[1] + pads[2] + pads[3] - window[1]) // strides[1] + 1
    return oh, ow


def _patches(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        shape = (2, 5, 6, 3)
        host = _image_input(ctx, shape)
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        for kh, kw, sh, sw, pads in IMAGE_CASES:
            what = f"[{dtype}] window {kh}x{kw} strides {sh}x{sw} pads {pads}"
            want = ctx.ref_call("extract_patches", rx, kh, kw, sh, sw, pads)
            ctx.expect(ctx.k["extract_patches"](x, kh, kw, sh, sw, pads), want, dtype,
                       "extract_patches" + what)
            g = ctx.data(want.shape, key=("col2im", kh, kw, sh, sw, pads))
            ctx.expect(ctx.k["extract_patches_grad"](ctx.up(g, dtype), shape, kh, kw, sh, sw,
                                                     pads),
                       ctx.ref_call("extract_patches_grad", ctx.ref_up(g, dtype), shape, kh, kw,
                                    sh, sw, pads), dtype, "extract_patches_grad" + what, 4)

    return run


def _pool(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        shape = (2, 5, 6, 3)
        host = _image_input(ctx, shape)
        x, rx = ctx.up(host, dtype), ctx.ref_up(host, dtype)
        for ph, pw, sh, sw, pads in IMAGE_CASES:
            what = f"[{dtype}] pool {ph}x{pw} strides {sh}x{sw} pads {pads}"
            want = ctx.ref_call("max_pool2d", rx, ph, pw, sh, sw, pads)
            y = ctx.k["max_pool2d"](x, ph, pw, sh, sw, pads)
            ctx.expect(y, want, dtype, "max_pool2d" + what)
            g = ctx.data(want.shape, key=("pool-g", ph, pw, sh, sw, pads))
            ctx.expect(ctx.k["max_pool2d_grad"](ctx.up(g, dtype), x, y, ph, pw, sh, sw, pads),
                       ctx.ref_call("max_pool2d_grad", ctx.ref_up(g, dtype), rx,
                                    ctx.rk["max_pool2d"](rx, ph, pw, sh, sw, pads), ph, pw, sh,
                                    sw, pads), dtype, "max_pool2d_grad" + what, 2)

    return run


# --- random -------------------------------------------------------------------------------
def _moments(ctx: _Context, values: Any, mean: float, std: float, what: str) -> None:
    np = ctx.np
    v = np.asarray(values, dtype=np.float64).ravel()
    n = v.size
    got_mean, got_std = float(v.mean()), float(v.std())
    # 6 standard errors: a correct generator fails this about once in 10^9 runs
    if abs(got_mean - mean) > 6 * std / math.sqrt(n) + 0.01 * std:
        raise CheckFailedError(f"{what}: mean {got_mean:.4f} over {n} samples, expected {mean:.4f}")
    if abs(got_std - std) > 6 * std * math.sqrt(2.0 / n) + 0.01 * std:
        raise CheckFailedError(f"{what}: standard deviation {got_std:.4f} over {n} samples, "
                               f"expected {std:.4f}")


def _random(kind: str, dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        np = ctx.np
        n = 4096 if ctx.quick else 65536
        shape = (n // 64, 64)
        k = ctx.k[kind]
        p, q = (-2.0, 3.0) if kind == "random_uniform" else (1.0, 2.0)
        what = f"{kind}[{dtype}] seed 7"
        a = ctx.host(k(shape, dtype, 7, p, q), what)
        if a.dtype != ctx.np_dtypes[dtype] or a.shape != shape:
            raise CheckFailedError(f"{what}: returned {a.dtype.name} {a.shape}, expected {dtype} "
                                   f"{shape}")
        b = ctx.host(k(shape, dtype, 7, p, q), what)
        if not np.array_equal(a, b):
            raise CheckFailedError(f"{what}: two calls with the same seed differ (a seed must make "
                                   "a run repeatable)")
        c = ctx.host(k(shape, dtype, 8, p, q), what)
        if np.array_equal(a, c):
            raise CheckFailedError(f"{what}: seeds 7 and 8 give the same values")
        v = a.astype(np.float64)
        if not np.isfinite(v).all():
            raise CheckFailedError(f"{what}: non-finite values")
        if kind == "random_uniform":
            if v.min() < p or v.max() > q:
                raise CheckFailedError(f"{what}: values outside [{p}, {q}): min {v.min()}, max "
                                  f"{v.max()}")
            _moments(ctx, v, (p + q) / 2, (q - p) / math.sqrt(12), what)
            lo_half = float((v < (p + q) / 2).mean())
            if abs(lo_half - 0.5) > 6 * 0.5 / math.sqrt(v.size):
                raise CheckFailedError(f"{what}: {lo_half:.3f} of the values in the lower half")
        else:
            _moments(ctx, v, p, q, what)
            within = float((np.abs(v - p) < q).mean())  # 68.3% within one sigma
            if abs(within - 0.6827) > 0.03:
                raise CheckFailedError(f"{what}: {within:.3f} of the values within one standard "
                                       "deviation, expected 0.683 (not a normal distribution?)")
        small = ctx.host(k((3,), dtype, 7, p, q), what)
        if small.shape != (3,):
            raise CheckFailedError(f"{kind}[{dtype}] shape (3,): returned {small.shape}")

    return run


# --- loss scaling -------------------------------------------------------------------------
def _unscale_and_check(ctx: _Context) -> None:
    np = ctx.np
    k = ctx.k["unscale_and_check"]
    grads = [(ctx.data((3, 4), -300, 300, key="u0"), "float32"),
             (ctx.data((5,), -300, 300, key="u1"), "float16"),
             (ctx.data((2, 2), -300, 300, key="u2"), "bfloat16")]

    def run(items: list[tuple[Any, str]], inv: float, expect: bool, what: str) -> None:
        outs, flag = k([ctx.up(g, dt) for g, dt in items], inv)
        if len(outs) != len(items):
            raise CheckFailedError(f"unscale_and_check {what}: {len(outs)} outputs for "
                                   f"{len(items)} gradients")
        if ctx.flag(flag, f"unscale_and_check {what}") is not expect:
            raise CheckFailedError(f"unscale_and_check {what}: flag is {not expect}, expected "
                                   f"{expect}")
        for i, ((g, dt), out) in enumerate(zip(items, outs)):
            with np.errstate(over="ignore"):  # the overflow cases expect inf here
                want = (ctx.rounded(g, dt) * np.float32(inv)).astype(np.float32)
            ctx.expect(out, want, "float32", f"unscale_and_check {what}: gradient {i} ({dt})",
                       2)

    run(grads, 1.0 / 1024, True, "on finite float32/float16/bfloat16 gradients")
    run(grads, 1.0, True, "with inv_scale 1")
    for i, bad in ((0, np.inf), (1, np.nan), (2, -np.inf), (1, np.inf)):
        items = [(g.copy(), dt) for g, dt in grads]
        items[i][0].flat[1] = bad
        run(items, 1.0 / 1024, False, f"with {bad} in gradient {i} ({items[i][1]})")
    # finite values whose sum overflows float32 are still finite
    huge = [(np.asarray([3.0e38, 3.0e38, -1.0]), "float32")]
    run(huge, 1.0, True, "on finite values whose sum overflows")


def _all_finite(ctx: _Context) -> None:
    np = ctx.np
    k = ctx.kernel("all_finite")
    xs = [ctx.data((3, 4), key="af0"), ctx.data((5,), key="af1")]
    for dt in FLOATS:
        if not ctx.flag(k([ctx.up(x, dt) for x in xs]), f"all_finite[{dt}]"):
            raise CheckFailedError(f"all_finite[{dt}] on finite values: false")
        for bad in (np.inf, np.nan):
            ys = [x.copy() for x in xs]
            ys[1][2] = bad
            if ctx.flag(k([ctx.up(y, dt) for y in ys]), f"all_finite[{dt}]"):
                raise CheckFailedError(f"all_finite[{dt}] with {bad}: true")
    if not ctx.flag(k([ctx.up([3.0e38, 3.0e38], "float32")]), "all_finite"):
        raise CheckFailedError("all_finite on finite values whose sum overflows: false")


# --- optional fused kernels ---------------------------------------------------------------
def _softmaxes(ctx: _Context) -> None:
    done = []
    for name in ("softmax", "log_softmax"):
        if ctx.k.get(name) is None:
            continue
        host = ctx.data((4, 6), -5, 5, key=name)
        host[0, 0] = 80.0  # exp overflows float32 here unless the max is subtracted
        for axis in (1, 0):
            ctx.expect(ctx.k[name](ctx.up(host, "float32"), axis),
                       ctx.ref_call(name, ctx.ref_up(host, "float32"), axis), "float32",
                       f"{name} axis={axis}", 4)
        done.append(name)
    if not done:
        raise CheckSkippedError("softmax and log_softmax are not provided (optional)")


def _xent(ctx: _Context) -> None:
    fwd = ctx.kernel("sparse_softmax_cross_entropy")
    logits = ctx.data((6, 5), -4, 4, key="xent")
    labels = [0, 4, 2, 2, 1, 3]
    loss, probs = fwd(ctx.up(logits, "float32"), ctx.up(labels, "int32"))
    rl, rp = ctx.rk["sparse_softmax_cross_entropy"](ctx.ref_up(logits, "float32"),
                                                    ctx.ref_up(labels, "int32"))
    ctx.expect(loss, ctx.ref_host(rl), "float32", "sparse_softmax_cross_entropy loss", 4)
    ctx.expect(probs, ctx.ref_host(rp), "float32", "sparse_softmax_cross_entropy softmax", 4)
    grad = ctx.k.get("sparse_softmax_cross_entropy_grad")
    if grad is not None:
        g = ctx.data((6,), 0.5, 2, key="xent-g")
        want = ctx.rounded(ctx.host(probs, "probs"), "float32")
        want[range(6), labels] -= 1.0
        want *= ctx.rounded(g, "float32")[:, None]
        ctx.expect(grad(probs, ctx.up(labels, "int32"), ctx.up(g, "float32")), want, "float32",
                   "sparse_softmax_cross_entropy_grad", 4)


def _relu_grad_bias_add(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        done = []
        if ctx.k.get("relu_grad") is not None:
            g, y = ctx.data((3, 4), key="rg-g"), ctx.data((3, 4), key="rg-y")
            y[0, 0] = 0.0
            ctx.expect(ctx.k["relu_grad"](ctx.up(g, dtype), ctx.up(y, dtype)),
                       ctx.rounded(g, dtype) * (ctx.rounded(y, dtype) > 0), dtype,
                       f"relu_grad[{dtype}]")
            done.append("relu_grad")
        if ctx.k.get("relu_grad_bias") is not None:
            for shape in ((5, 4), (2, 3, 4)):
                g, y = ctx.data(shape, key="rgb-g"), ctx.data(shape, key="rgb-y")
                y.reshape(-1)[0] = 0.0
                want = ctx.rounded(g, dtype) * (ctx.rounded(y, dtype) > 0)
                got = ctx.k["relu_grad_bias"](ctx.up(g, dtype), ctx.up(y, dtype))
                if not isinstance(got, tuple) or len(got) != 2:
                    raise CheckFailedError("relu_grad_bias must return (relu_grad, bias grad)")
                ctx.expect(got[0], want, dtype, f"relu_grad_bias[{dtype}] {shape}: relu_grad")
                rows = want.reshape(-1, shape[-1])
                ctx.expect(got[1], rows.sum(axis=0), dtype,
                           f"relu_grad_bias[{dtype}] {shape}: bias grad", 2,
                           magnitude=abs(rows).sum(axis=0))
            done.append("relu_grad_bias")
        if ctx.k.get("bias_add") is not None:
            for shape in ((3, 4), (2, 3, 4)):
                x, b = ctx.data(shape, key="ba-x"), ctx.data((4,), key="ba-b")
                ctx.expect(ctx.k["bias_add"](ctx.up(x, dtype), ctx.up(b, dtype)),
                           ctx.ref_call("add", ctx.ref_up(x, dtype), ctx.ref_up(b, dtype)),
                           dtype, f"bias_add[{dtype}] {shape} + (4,)", 2)
            done.append("bias_add")
        if not done:
            raise CheckSkippedError("relu_grad, relu_grad_bias and bias_add are not provided "
                                    "(optional)")

    return run


def _dense(dtype: str) -> Callable[[_Context], None]:
    def run(ctx: _Context) -> None:
        np = ctx.np
        k = ctx.kernel("dense")
        w = ctx.data((7, 3), key="dense-w")
        b = ctx.data((3,), key="dense-b")
        for shape in ((5, 7), (2, 3, 7)):
            x = ctx.data(shape, key=("dense-x", shape))
            z = ctx.rounded(x, dtype) @ ctx.rounded(w, dtype)
            mag = np.abs(ctx.rounded(x, dtype)) @ np.abs(ctx.rounded(w, dtype))
            for bias in (None, b):
                for activation in (None, "relu"):
                    want = z if bias is None else z + ctx.rounded(bias, dtype)
                    if activation == "relu":
                        want = np.maximum(want, 0.0)
                    got = k(ctx.up(x, dtype), ctx.up(w, dtype),
                            None if bias is None else ctx.up(bias, dtype), activation)
                    ctx.expect(got, want, dtype,
                               f"dense[{dtype}] x {shape} bias={bias is not None} "
                               f"activation={activation}", 2, mag)

    return run


def _dropout_mask(ctx: _Context) -> None:
    np = ctx.np
    k = ctx.kernel("dropout_mask")
    n = 4096 if ctx.quick else 65536
    for dtype in FLOATS:
        for rate in (0.25, 0.5):
            what = f"dropout_mask[{dtype}] rate={rate}"
            a = ctx.host(k((n,), rate, dtype, 3), what)
            if a.dtype != ctx.np_dtypes[dtype] or a.shape != (n,):
                raise CheckFailedError(f"{what}: returned {a.dtype.name} {a.shape}")
            keep = ctx.rounded(1.0 / (1.0 - rate), dtype)
            v = a.astype(np.float64)
            if not np.all((v == 0) | (v == keep)):
                raise CheckFailedError(f"{what}: values other than 0 and {keep}")
            frac = float((v == 0).mean())
            if abs(frac - rate) > 6 * math.sqrt(rate * (1 - rate) / n):
                raise CheckFailedError(f"{what}: {frac:.3f} of the values dropped")
            if not np.array_equal(a, ctx.host(k((n,), rate, dtype, 3), what)):
                raise CheckFailedError(f"{what}: the same seed gives different masks")


# name -> (slots: name -> None-able, hyperparameter variants)
def _optimizer(name: str) -> Callable[[_Context], str]:
    def run(ctx: _Context) -> str:
        np = ctx.np
        k = ctx.kernel(name)
        shape = (4, 5)
        var0 = ctx.data(shape, key=(name, "var"))
        grad0 = ctx.data(shape, -0.5, 0.5, key=(name, "grad"))
        slot0 = {"velocity": ctx.data(shape, -0.1, 0.1, key=(name, "vel")),
                 "ms": ctx.data(shape, 0.01, 0.2, key=(name, "ms")),
                 "mom": ctx.data(shape, -0.1, 0.1, key=(name, "mom")),
                 "m": ctx.data(shape, -0.1, 0.1, key=(name, "m")),
                 "v": ctx.data(shape, 0.01, 0.2, key=(name, "v"))}
        variants: list[tuple[str, list[str | None], tuple[Any, ...]]]
        if name == "sgd_update":
            variants = [("plain", [None], (0.1, 0.0, False)),
                        ("momentum", ["velocity"], (0.1, 0.9, False)),
                        ("nesterov", ["velocity"], (0.1, 0.9, True))]
        elif name == "rmsprop_update":
            variants = [("plain", ["ms", None], (0.01, 0.9, 0.0, 1e-7)),
                        ("momentum", ["ms", "mom"], (0.01, 0.9, 0.5, 1e-7))]
        else:
            variants = [("adam", ["m", "v"], (0.01, 0.9, 0.999, 1e-7, 3, 0.0)),
                        ("adamw", ["m", "v"], (0.01, 0.9, 0.999, 1e-7, 3, 0.01))]
        ok_flag = ctx.k["unscale_and_check"]([ctx.up(grad0, "float32")], 1.0)[1]
        bad_flag = ctx.k["unscale_and_check"]([ctx.up([np.inf], "float32")], 1.0)[1]
        for label, slots, hyper in variants:
            for flag_name, flag in (("None", None), ("true", ok_flag), ("false", bad_flag)):
                what = f"{name} {label} flag={flag_name}"
                var = ctx.up(var0, "float32")
                grad = ctx.up(grad0, "float32")
                bufs = [None if s is None else ctx.up(slot0[s], "float32") for s in slots]
                rvar = ctx.ref.asarray(np.array(var0, np.float32), "float32")
                rbufs = [None if s is None else ctx.ref.asarray(np.array(slot0[s], np.float32),
                                                                "float32") for s in slots]
                out = k(var, grad, *bufs, *hyper, flag)
                if out is not None:
                    raise CheckFailedError(f"{what}: returned {type(out).__name__}; fused updates "
                                           "work in place and return None")
                if flag_name == "false":
                    wants = [var0, *[slot0[s] for s in slots if s is not None]]
                    grad_after = ctx.host(grad, what)
                    if not np.array_equal(grad_after, grad0.astype(np.float32)):
                        raise CheckFailedError(f"{what}: the gradient buffer changed")
                else:
                    ctx.rk[name](rvar, ctx.ref.asarray(np.array(grad0, np.float32), "float32"),
                                 *rbufs, *hyper, None)
                    wants = [ctx.ref_host(rvar), *[ctx.ref_host(b) for b in rbufs
                                                   if b is not None]]
                gots = [var, *[b for b in bufs if b is not None]]
                labels = ["var", *[s for s in slots if s is not None]]
                for buf, want, lab in zip(gots, wants, labels):
                    if flag_name == "false":
                        h = ctx.host(buf, what)
                        if not np.array_equal(h, np.asarray(want, np.float32)):
                            raise CheckFailedError(f"{what}: {lab} changed although the flag is "
                                                   "false (a skipped step must leave every buffer "
                                                   "untouched)")
                    else:
                        ctx.expect(buf, want, "float32", f"{what}: {lab}", 8)
        return f"{len(variants)} variants x flag None/true/false"

    return run


# --- autodiff and training ----------------------------------------------------------------
def _mlp_grads(be: Backend, host: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Gradients of a small MLP's loss on ``be``: the weights are ``dtype`` Variables read in
    ``dtype`` (float16/bfloat16: float32 Variables read through a cast, as layers do)."""
    from mpcore import ops
    from mpcore.tape import GradientTape
    from mpcore.tensor import Variable

    var_dtype = "float32" if dtype in LOW else dtype
    ws = {n: Variable(host[n], dtype=var_dtype, backend=be, name=n)
          for n in ("w1", "b1", "w2", "b2")}
    x = ops.constant(host["x"], dtype=dtype, backend=be)
    labels = ops.constant(host["labels"], dtype="int32", backend=be)
    with GradientTape() as tape:
        w = {n: v.read_as(dtype) for n, v in ws.items()}
        h = ops.relu(ops.bias_add(ops.matmul(x, w["w1"]), w["b1"]))
        h = ops.tanh(h) * 0.5 + h * 0.5
        logits = ops.add(ops.matmul(h, w["w2"]), w["b2"])
        loss = ops.mean(ops.sparse_softmax_cross_entropy(labels, logits))
        loss = loss + 0.1 * ops.mean(ops.sigmoid(ops.cast(logits, "float32")))
        loss = loss + 1e-3 * ops.sum(ops.square(ops.cast(ws["w1"], "float32")))
    grads = tape.gradient(loss, list(ws.values()))
    return {"loss": loss.numpy(), **{n: g.numpy() for n, g in zip(ws, grads)},
            "dtypes": [g.dtype for g in grads]}


def _mlp_inputs(ctx: _Context) -> dict[str, Any]:
    rng = ctx.rng("mlp")
    return {"x": rng.uniform(-1, 1, (8, 6)), "labels": rng.integers(0, 3, (8,)),
            "w1": rng.normal(0, 0.5, (6, 5)), "b1": rng.normal(0, 0.1, (5,)),
            "w2": rng.normal(0, 0.5, (5, 3)), "b2": rng.normal(0, 0.1, (3,))}


# float32: several roundings per gradient; 16-bit: the forward pass rounds every activation
MLP_TOLERANCE = {"float32": (1e-4, 1e-5), "float16": (2e-2, 5e-3), "bfloat16": (1e-1, 3e-2)}


def _gradients(dtype: str) -> Callable[[_Context], str]:
    def run(ctx: _Context) -> str:
        np = ctx.np
        host = _mlp_inputs(ctx)
        if dtype in LOW:
            host["x"] = ctx.rounded(host["x"], dtype)
        got = _mlp_grads(ctx.be, host, dtype)
        want = _mlp_grads(ctx.ref, host, "float64")
        if got["dtypes"] != ["float32"] * 4:
            raise CheckFailedError(f"gradients of float32 variables came back {got['dtypes']}, "
                                   "expected float32")
        rtol, atol = MLP_TOLERANCE[dtype]
        worst = 0.0
        for n in ("loss", "w1", "b1", "w2", "b2"):
            g = np.asarray(got[n], np.float64)
            w = np.asarray(want[n], np.float64)
            if g.shape != w.shape:
                raise CheckFailedError(f"gradient of {n}: shape {g.shape}, expected {w.shape}")
            err = np.abs(g - w) - (atol + rtol * np.abs(w))
            if (err > 0).any() or not np.isfinite(g).all():
                i = tuple(np.argwhere(~(err <= 0))[0]) if g.ndim else ()
                raise CheckFailedError(f"MLP {'loss' if n == 'loss' else 'gradient of ' + n} "
                                       f"[{dtype}]: at {i} got {g[i]!r}, reference (CPU, float64) "
                                       f"{w[i]!r} (rtol={rtol:g} atol={atol:g})")
            scale = float(np.abs(w).max()) or 1.0
            worst = max(worst, float(np.abs(g - w).max()) / scale)
        return f"max error {worst:.2e} of the largest gradient"

    return run


def _training(ctx: _Context) -> str:
    """mixed_float16 training with a dynamic loss scale: one batch carries an Inf, that step
    is skipped (weights untouched, scale halved) and training goes on."""
    np = ctx.np
    from mpcore.loss_scale import DynamicLossScale
    from mpcore.loss_scale_optimizer import LossScaleOptimizer
    from mpcore.optimizers import SGD

    host = _mlp_inputs(ctx)
    steps = 6 if ctx.quick else 20
    bad_step = 2

    def train(be: Backend) -> tuple[list[float], list[bool], list[float], bool, int]:
        from mpcore import ops
        from mpcore.tape import GradientTape
        from mpcore.tensor import Variable

        ws = [Variable(host[n], dtype="float32", backend=be, name=n)
              for n in ("w1", "b1", "w2", "b2")]
        opt = LossScaleOptimizer(SGD(0.5, momentum=0.5),
                                 DynamicLossScale(initial_loss_scale=2.0**15))
        labels = ops.constant(host["labels"], dtype="int32", backend=be)
        losses, applied, scales = [], [], []
        untouched = True
        for step in range(steps):
            xs = np.array(host["x"])
            if step == bad_step:
                xs[3, 2] = np.inf
            x = ops.constant(xs, dtype="float16", backend=be)
            before = [np.array(v.numpy(), copy=True) for v in ws]
            # The Inf batch is deliberate: NumPy-based kernels may warn about inf - inf there.
            with np.errstate(all="ignore") if step == bad_step else contextlib.nullcontext():
                with GradientTape() as tape:
                    w1, b1, w2, b2 = (v.read_as("float16") for v in ws)
                    h = ops.relu(ops.bias_add(ops.matmul(x, w1), b1))
                    logits = ops.bias_add(ops.matmul(h, w2), b2)
                    loss = ops.mean(ops.sparse_softmax_cross_entropy(labels, logits))
                    scaled = opt.get_scaled_loss(loss)
                grads = opt.get_unscaled_gradients(tape.gradient(scaled, ws))
                applied.append(bool(opt.apply_gradients(zip(grads, ws))))
            scales.append(opt.loss_scale())
            if step == bad_step:
                untouched = all(np.array_equal(b, v.numpy()) for b, v in zip(before, ws))
            losses.append(float(loss.numpy()))
        return losses, applied, scales, untouched, opt.skipped_steps

    losses, applied, scales, untouched, skipped = train(ctx.be)
    # the root cause first: weights written on a skipped step poison every later step
    if not untouched:
        raise CheckFailedError(f"step {bad_step} had an Inf gradient but the weights changed")
    want_applied = [s != bad_step for s in range(steps)]
    if applied != want_applied:
        raise CheckFailedError(f"steps applied {applied}, expected only step {bad_step} (the Inf "
                               "batch) skipped")
    if skipped != 1 or scales[bad_step] != 2.0**14 or scales[bad_step - 1] != 2.0**15:
        raise CheckFailedError(f"loss scales {scales}, skipped_steps {skipped}: expected the scale "
                               "to halve once, at the Inf step")
    if not losses[-1] < losses[0]:
        raise CheckFailedError(f"the loss did not decrease after the skipped step: {losses}")
    ref_losses, *_ = train(ctx.ref)
    finite = [i for i in range(steps) if i != bad_step]
    for i in finite:
        if abs(losses[i] - ref_losses[i]) > 2e-2 * abs(ref_losses[i]) + 2e-3:
            raise CheckFailedError(f"loss at step {i}: {losses[i]:.5f}, CPU reference "
                                   f"{ref_losses[i]:.5f} (same data, same float16 compute)")
    return f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, step {bad_step} skipped, scale 2^14"


# --- the plan -----------------------------------------------------------------------------
def _plan(quick: bool) -> Iterator[_Check]:
    c = _Check
    yield c("contract.name", "contract", _contract_name)
    yield c("contract.constructor", "contract", _contract_constructor)
    yield c("contract.unavailable_reason", "contract", _contract_unavailable_reason)
    yield c("contract.devices", "contract", _contract_devices)
    yield c("contract.policy_support", "contract", _contract_policy_support)
    yield c("contract.required_kernels", "contract", _contract_required_kernels)
    yield c("contract.optional_kernels", "contract", _contract_optional_kernels)
    yield c("creation.asarray", "creation", _asarray, ("asarray", "to_host"))
    yield c("creation.full", "creation", _full, ("full",))
    yield c("creation.cast", "creation", _cast, ("cast",))
    yield c("creation.copy", "creation", _copy, ("copy",))
    for dtype in FLOATS:
        for name in UNARY:
            yield c(f"unary.{name}[{dtype}]", "elementwise", _unary(name, dtype), (name,))
    for dtype in (*FLOATS, "int32"):
        for name in BINARY:
            if dtype == "int32" and name in ("divide", "power"):
                continue
            yield c(f"binary.{name}[{dtype}]", "elementwise", _binary(name, dtype), (name,))
        yield c(f"compare[{dtype}]", "elementwise", _comparison(dtype), COMPARISONS)
    yield c("logical", "elementwise", _logical, ("logical_and", "logical_or", "logical_not"))
    yield c("isfinite", "elementwise", _isfinite, ("isfinite",))
    for dtype in FLOATS:
        yield c(f"where[{dtype}]", "elementwise", _where(dtype), ("where",))
    for name in ("sum", "mean", "max", "min"):
        for dtype in (*FLOATS, "int32"):
            if dtype == "int32" and name == "mean":
                continue
            yield c(f"reduce.{name}[{dtype}]", "reductions", _reduction(name, dtype), (name,))
    for dtype in FLOATS:
        yield c(f"reduce.argmax[{dtype}]", "reductions", _argmax(dtype), ("argmax",))
        yield c(f"matmul[{dtype}]", "matmul", _matmul(dtype), ("matmul",))
        yield c(f"shapes[{dtype}]", "shapes", _shapes(dtype),
                ("reshape", "transpose", "broadcast_to", "concat"))
        yield c(f"take[{dtype}]", "indexing", _take(dtype), ("take", "take_grad"))
        yield c(f"getitem[{dtype}]", "indexing", _getitem(dtype), ("getitem", "getitem_grad"))
    yield c("one_hot", "indexing", _one_hot, ("one_hot",))
    for dtype in FLOATS:
        yield c(f"image.patches[{dtype}]", "images", _patches(dtype),
                ("extract_patches", "extract_patches_grad"))
        yield c(f"image.max_pool[{dtype}]", "images", _pool(dtype),
                ("max_pool2d", "max_pool2d_grad"))
    for kind in ("random_uniform", "random_normal"):
        for dtype in FLOATS:
            yield c(f"random.{kind.split('_')[1]}[{dtype}]", "random", _random(kind, dtype),
                    (kind,))
    yield c("loss_scale.unscale_and_check", "loss scaling", _unscale_and_check,
            ("unscale_and_check",))
    yield c("optional.all_finite", "optional", _all_finite, ("all_finite",))
    yield c("optional.softmax", "optional", _softmaxes, ("softmax", "log_softmax"))
    yield c("optional.sparse_softmax_cross_entropy", "optional", _xent,
            ("sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_grad"))
    for dtype in FLOATS:
        yield c(f"optional.relu_grad_bias_add[{dtype}]", "optional", _relu_grad_bias_add(dtype),
                ("relu_grad", "relu_grad_bias", "bias_add"))
    for dtype in FLOATS:
        yield c(f"optional.dense[{dtype}]", "optional", _dense(dtype), ("dense",))
    yield c("optional.dropout_mask", "optional", _dropout_mask, ("dropout_mask",))
    for name in ("sgd_update", "rmsprop_update", "adam_update"):
        yield c(f"optional.{name}", "optional", _optimizer(name), (name,))
    for dtype in FLOATS:
        yield c(f"autodiff.mlp[{dtype}]", "autodiff", _gradients(dtype))
    yield c("training.mixed_float16_skip_and_recover", "training", _training)


def check_names(quick: bool = False) -> list[str]:
    """The name of every check, in the order they run."""
    return [c.name for c in _plan(quick)]


def _resolve(backend: Backend | str) -> Backend:
    if isinstance(backend, Backend):
        return backend
    from mpcore.plugins import get_plugins

    registered = get_plugins().backends
    if backend not in registered:
        raise ValueError(f"unknown backend {backend!r}; registered backends: "
                         f"{', '.join(sorted(registered)) or 'none'}")
    return registered[backend]


def check(backend: Backend | str, *, reference: Backend | str = "cpu", quick: bool = False,
          only: Sequence[str] | None = None) -> Report:
    """Run the conformance checks on ``backend`` (an instance or a registered name) against
    ``reference``; ``only`` keeps the checks whose names contain one of its strings
    (``"matmul"``, ``"[bfloat16]"``) or match it as an fnmatch pattern (``"reduce.*[[]int32]"``).
    Never raises for a broken backend: every problem is a failed check in the report."""
    be = _resolve(backend)
    ref = _resolve(reference)
    report = Report(be.name, ref.name, quick, only=tuple(only or ()))
    ctx = _Context(be, ref, quick)
    gate: str | None = None  # once the contract rules out kernels, the rest is skipped
    gate_all = False         # ... and for a backend that is not available, the contract too
    for spec in _plan(quick):
        if only and not any(p in spec.name or fnmatch.fnmatchcase(spec.name, p) for p in only):
            continue
        if gate is not None and (spec.group != "contract" or gate_all):
            report.results.append(CheckResult(spec.name, spec.group, SKIP, gate, 0.0,
                                              spec.kernels))
            continue
        t0 = time.perf_counter()
        try:
            detail = spec.fn(ctx) or ""
            status = PASS
        except CheckSkippedError as exc:
            status, detail = SKIP, str(exc)
        except CheckFailedError as exc:
            status, detail = FAIL, str(exc)
        except Exception as exc:  # a crashing kernel is a finding, reported with its check
            status, detail = FAIL, f"raised {type(exc).__name__}: {exc}".splitlines()[0]
        took = time.perf_counter() - t0
        report.results.append(CheckResult(spec.name, spec.group, status, detail, took,
                                          spec.kernels))
        if status == FAIL and spec.name in ("contract.unavailable_reason",
                                            "contract.required_kernels"):
            gate = f"not run: {spec.name} failed"
            gate_all = spec.name == "contract.unavailable_reason"
    return report


# --- command line -------------------------------------------------------------------------
def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("backend", help="the registered backend name to check")
    parser.add_argument("--reference", default="cpu", help="reference backend (default: cpu)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller inputs and samples (a few seconds)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--only", action="append", metavar="PATTERN",
                        help="run only checks whose name contains or matches PATTERN "
                             "(repeatable)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")


@subcommand("conformance", "check a backend against the kernel and plugin contract",
            _configure)
def _run(args: argparse.Namespace) -> int:
    if args.list:
        print("\n".join(check_names(args.quick)))
        return 0
    try:
        report = check(args.backend, reference=args.reference, quick=args.quick,
                       only=args.only)
    except ValueError as exc:
        print(f"mpcore conformance: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format_table())
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpcore.conformance",
                                     description="Check an mpcore backend against the contract "
                                                 "(the CPU backend is the reference).")
    _configure(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
