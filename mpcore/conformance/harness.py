"""Running checks on a backend: the :class:`Context` a check receives (the tested backend, the
reference, seeded inputs, dtype-aware comparisons) and :func:`run_checks`, which turns every
check's outcome, a crash included, into a :class:`~mpcore.conformance.report.CheckResult`.

:data:`TOLERANCES` is the one tolerance table: the kit judges results with it, and the
project's own backend-generic tests import it from here.
"""

from __future__ import annotations

import fnmatch
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mpcore.conformance.report import FAIL, PASS, SKIP, CheckResult, Report
from mpcore.core.backend import Backend
from mpcore.core.categories import Category

FLOATS = ("float32", "float16", "bfloat16")
LOW = ("float16", "bfloat16")

# (rtol, atol) by the dtype a result is delivered in: about one or two roundings of that dtype
# (tests/conftest.py imports it: the project's backend-generic tests judge by it too).
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (2e-3, 2e-3),
    "bfloat16": (2e-2, 2e-2),
    "float32": (1e-5, 1e-6),
    "float64": (1e-10, 1e-12),
}


class CheckFailedError(AssertionError):
    """A check found the backend breaking the contract; the message says where and how."""


class CheckSkippedError(Exception):
    """A check that does not apply to this backend; the message says why."""


@dataclass(frozen=True)
class Check:
    """One named check: ``fn(ctx)`` raises to fail or skip, else returns a detail (or None);
    ``kernels`` are the kernels a pass proves."""

    name: str
    group: str
    fn: Callable[[Context], str | None]
    kernels: tuple[str, ...] = ()


class Context:
    """What a check works with: the tested backend and the reference, their kernel tables,
    seeded inputs and comparisons at the tolerance of the dtype a result is delivered in."""

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



def selected(name: str, only: Sequence[str] | None) -> bool:
    """Whether check ``name`` runs under ``only``: it contains one of the strings or matches
    one as an fnmatch pattern (all run when ``only`` is empty)."""
    return not only or any(p in name or fnmatch.fnmatchcase(name, p) for p in only)


def run_checks(backend: Backend, reference: Backend, checks: Iterable[Check], *, quick: bool,
               only: Sequence[str] | None = None) -> Report:
    """Run ``checks`` in order on ``backend`` against ``reference``, keeping those whose names
    contain one of ``only``'s strings or match it as an fnmatch pattern. Never raises for a
    broken backend: every problem is a failed check in the report."""
    report = Report(backend.name, reference.name, quick, only=tuple(only or ()))
    ctx = Context(backend, reference, quick)
    gate: str | None = None  # once the contract rules out kernels, the rest is skipped
    gate_all = False         # ... and for a backend that is not available, the contract too
    for spec in checks:
        if not selected(spec.name, only):
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
