"""The arithmetic of the cosine schedules, the same bits on the host and on every device: a
cosine built from IEEE basic operations, and CosineDecayRestarts' restart tables (issue 34,
item 1).

Why not ``math.cos``: a schedule's rate is computed on the host (``schedule(step)``,
``optimizer.learning_rate``, an update kept whole) and on the device (a recorded step,
:mod:`mpcore.optimizers.device_schedules`), and the two must agree bit for bit. libm's ``cos``,
NumPy's float64 ``cos`` (a SIMD routine where the CPU has one) and OpenCL's double ``cos`` are
each accurate to about an ulp but are not the same function. :func:`cos` is one algorithm
written once over a small table of primitives (:class:`Primitives`): ``+ - *`` (Python's
operators, on floats or on tensors, where each is a separate kernel call, so nothing fuses two
roundings into one), ``abs``, ``floor`` (exact; an int64 cast on the device), ``where`` and
``equal``. Every one of them is correctly rounded or exact in IEEE float64 on the host, NumPy,
OpenCL (``cl_khr_fp64``) and CUDA, so :data:`HOST` (Python floats) and the device's ops (float64
tensors of shape (1,)) compute the same bits.

The algorithm (the classic one of Cody and Waite, and of fdlibm): ``k``, the nearest multiple
of pi/2; ``r = |x| - k*pi/2`` in two doubles, pi/2 split in four parts (33, 33, 33 and 53 bits:
``k*P1``, ``k*P2``, ``k*P3`` are exact for ``k < 2**20``); then cos(r) or sin(r) by the Taylor
series of degree 16 and 17 in ``r`` (terms below 2**-60 of the result on ``|r| <= pi/4``) with
the tail of ``r`` as a first-order correction, and the sign of the quadrant. Coefficients are
``1/n!`` rounded to float64, the parts of pi/2 its binary digits
(``tests/optimizers/test_cosine_math.py`` derives them again from Machin's formula).

Accuracy: at most 1 ulp from ``math.cos`` (glibc's, correctly rounded in practice) on
``[0, pi]`` and on ``[0, 1e5]`` (measured on 400 000 points and held by a property test), about
one result in 30 differing in its last bit. Keras computes ``cos(pi * fraction)`` with its
backend's cosine; the schedules' rates therefore differ from Keras' by at most an ulp of the
cosine (2**-53 absolute), scaled by the schedule's constants. Arguments beyond ``2**20 * pi/2``
(no schedule makes them) lose accuracy gradually but stay the same bits everywhere.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

#: pi/2 in parts: 33, 33 and 33 leading bits (exact products with k < 2**20), then the rest
#: rounded to float64.
P1 = float.fromhex("0x1.921fb54400000p+0")
P2 = float.fromhex("0x1.0b4611a600000p-34")
P3 = float.fromhex("0x1.3198a2e000000p-69")
P4 = float.fromhex("0x1.b839a252049c1p-104")
#: 2/pi rounded to float64 (only chooses k: any rounding of it gives a valid reduction)
TWO_OVER_PI = float.fromhex("0x1.45f306dc9c883p-1")
#: Below this every float64 is exact as an int64, above it every float64 is an integer.
EXACT = float(2**52)


def _inverse_factorial(n: int) -> float:
    return float(Fraction(1, math.factorial(n)))   # correctly rounded


#: cos(h) = 1 - h^2/2 + h^4 * C(h^2), C(z) = 1/4! - z/6! + ... + z^6/16! (Horner from the end)
COS_TERMS = tuple((-1) ** j * _inverse_factorial(2 * j + 4) for j in range(7))
#: sin(h) = h + h^3 * S(h^2), S(z) = -1/3! + z/5! - ... + z^7/17!
SIN_TERMS = tuple((-1) ** (j + 1) * _inverse_factorial(2 * j + 3) for j in range(8))


class Primitives(Protocol):
    """What :func:`cos` needs beyond ``+ - *`` and ``abs``: on the host, Python's; on the
    device, float64 ops (:mod:`mpcore.optimizers.device_schedules`)."""

    def floor(self, x: Any) -> Any:
        """``floor(x)`` for ``x >= 0`` (exact; ``x`` itself from 2**52 on)."""

    def where(self, condition: Any, a: Any, b: Any) -> Any: ...

    def equal(self, a: Any, b: Any) -> Any: ...

    def fused_cos(self, x: Any) -> Any:
        """:func:`cos` of ``x`` in one step where one computes it (a backend's ``ieee_cos``
        kernel), else None (the algorithm's basic operations, one by one)."""


class _Host:
    """The primitives in Python floats."""

    @staticmethod
    def floor(x: float) -> float:
        # as the device's int64 cast: truncation below 2**52, x itself above (and for NaN)
        return float(math.trunc(x)) if x < EXACT else x

    @staticmethod
    def where(condition: bool, a: float, b: float) -> float:
        return a if condition else b

    @staticmethod
    def equal(a: float, b: float) -> bool:
        return a == b

    @staticmethod
    def fused_cos(x: float) -> None:
        return None


HOST = _Host()


def _horner(z: Any, terms: tuple[float, ...]) -> Any:
    p: Any = terms[-1]
    for c in reversed(terms[:-1]):
        p = p * z + c
    return p


def cos(x: Any, m: Primitives = HOST) -> Any:
    """cos(x) in IEEE basic operations, the same bits for Python floats (``m`` = :data:`HOST`)
    and float64 tensors (the device's primitives). See the module's docstring."""
    fused = m.fused_cos(x)
    if fused is not None:
        return fused
    a = abs(x)
    k = m.floor(a * TWO_OVER_PI + 0.5)          # the nearest multiple of pi/2
    # r = a - k*pi/2 = h + l: the first part's difference is exact (Sterbenz), the second's
    # rounding error is kept (TwoSum), the last two parts are below the result's ulp
    hi = a - k * P1
    t = k * P2
    s = hi - t
    back = s - hi
    err = (hi - (s - back)) - (t + back)
    lo = (err - k * P3) - k * P4
    h = s + lo
    tail = lo - (h - s)
    z = h * h
    hz = 0.5 * z
    # cos(h + l) = (1 - hz) + (h^4 C(z) - h*l); 1 - hz's rounding error is recovered exactly
    w = 1.0 - hz
    cosine = w + (((1.0 - w) - hz) + (z * (z * _horner(z, COS_TERMS)) - h * tail))
    # sin(h + l) = h + (h^3 S(z) + l * (1 - hz))
    sine = h + ((h * z) * _horner(z, SIN_TERMS) + (tail - hz * tail))
    quadrant = k - 4.0 * m.floor(k * 0.25)
    return m.where(m.equal(quadrant, 0.0), cosine,
                   m.where(m.equal(quadrant, 1.0), -sine,
                           m.where(m.equal(quadrant, 2.0), -cosine, sine)))


def cosine_decayed(fraction: Any, alpha: float, m: Primitives = HOST) -> Any:
    """Keras' ``(1 - alpha) * 0.5 * (1 + cos(pi * fraction)) + alpha``, the constant factor
    folded as Python folds it (left to right)."""
    return (1 - alpha) * 0.5 * (1.0 + cos(math.pi * fraction, m)) + alpha


# --- CosineDecayRestarts ----------------------------------------------------------------
#: The most entries a restart table may have (its device copy is 8 bytes an entry; the
#: boundaries are compared with the fraction at each step).
MAX_TABLE = 2**16


def power(base: float, exponent: int) -> float:
    """``base ** exponent`` as Python computes it, inf where Python raises OverflowError
    (Keras' float arithmetic gives inf there)."""
    try:
        return base ** exponent
    except OverflowError:
        return math.copysign(math.inf, base) if exponent % 2 else math.inf


def period_start(t_mul: float, restart: int) -> float:
    """Keras' ``(1 - t_mul**restart) / (1 - t_mul)``: the fraction at which restart number
    ``restart`` begins (in first periods), for ``t_mul != 1``."""
    return (1.0 - power(t_mul, restart)) / (1.0 - t_mul)


def restart_index(fraction: float, t_mul: float) -> int | None:
    """The restart that ``fraction`` (steps over first_decay_steps) falls in, for
    ``t_mul != 1``: the largest ``i`` with ``period_start(t_mul, i) <= fraction``. Keras'
    ``floor(log(1 - fraction*(1 - t_mul)) / log(t_mul))`` is the first guess; its rounding can
    put a step on a boundary in the period before (``log(243)/log(3)`` is 4.999...), which this
    corrects. None past the last restart of a ``t_mul < 1`` (Keras' formula is NaN there)."""
    arg = 1.0 - fraction * (1.0 - t_mul)
    if not arg > 0.0:
        return None
    i = max(0, math.floor(math.log(arg) / math.log(t_mul)))
    while i > 0 and period_start(t_mul, i) > fraction:
        i -= 1
    while period_start(t_mul, i + 1) <= fraction:
        if period_start(t_mul, i + 1) == period_start(t_mul, i):
            return None   # t_mul < 1: the starts stop growing before the fraction
        i += 1
    return i


@dataclass(frozen=True, eq=False)
class RestartTables:
    """CosineDecayRestarts' values by restart index, for the device to gather from (and the
    host to read: the same numbers): ``starts[i]`` = ``period_start(t_mul, i)``,
    ``lengths[i]`` = ``t_mul ** i`` (t_mul != 1), ``peaks[i]`` = ``m_mul ** i`` (None where
    m_mul is 1). For t_mul == 1 only ``peaks``, up to an index from which every power is the
    same (0, 1 or inf), which :meth:`peak` clamps to."""

    t_mul: float
    m_mul: float
    starts: tuple[float, ...] = ()
    #: ``starts[1:]``, what the device compares the fraction with
    boundaries: tuple[float, ...] = ()
    lengths: tuple[float, ...] = ()
    peaks: tuple[float, ...] | None = None
    #: device copies, by (name, backend): made once (mpcore.optimizers.device_schedules)
    on_device: dict[tuple[str, Any], Any] = field(default_factory=dict)

    def index(self, fraction: float) -> int:
        """The restart of ``fraction`` (t_mul != 1): how many starts after the first are at or
        below it, as the device counts them."""
        return bisect.bisect_right(self.boundaries, fraction)

    def peak(self, restart: int) -> float:
        assert self.peaks is not None
        return self.peaks[min(restart, len(self.peaks) - 1)]


@functools.lru_cache(maxsize=64)
def restart_tables(first_decay_steps: float, t_mul: float, m_mul: float
                   ) -> RestartTables | str:
    """The tables of a CosineDecayRestarts for every step an int64 counts, or why there are
    none (a sentence for ``why_not``)."""
    peaks: tuple[float, ...] | None = None
    if t_mul == 1.0:
        if m_mul != 1.0:
            if not m_mul >= 0.0:
                return (f"m_mul={m_mul} < 0 with t_mul=1: its powers alternate in sign without "
                        "end, so no finite table holds m_mul**restart")
            values = [1.0, m_mul]         # (0.0 ** 0 is 1.0 in Python, as in Keras)
            while values[-1] not in (0.0, math.inf):
                if len(values) > MAX_TABLE:
                    return (f"m_mul={m_mul} with t_mul=1: m_mul**restart reaches 0 or inf only "
                            f"after more than {MAX_TABLE} restarts, and the device has no pow "
                            "that is the same bits as the host's")
                values.append(power(m_mul, len(values)))
            peaks = tuple(values)
        return RestartTables(t_mul, m_mul, peaks=peaks)
    if t_mul < 1.0:
        return (f"t_mul={t_mul} < 1: the periods shrink toward a last step "
                "(first_decay_steps / (1 - t_mul)) past which the schedule has no value (Keras: "
                "NaN); not recorded")
    # every fraction an int64 step gives is below the last start
    top = 2.0**63 / first_decay_steps
    starts = [period_start(t_mul, 0)]
    while starts[-1] <= top:
        if len(starts) > MAX_TABLE:
            return (f"t_mul={t_mul}: more than {MAX_TABLE} restarts fit in the steps an int64 "
                    "counts, too many for the device's table of period starts")
        starts.append(period_start(t_mul, len(starts)))
    # (a pow that is not monotone would make the host's bisect and the device's count differ)
    if any(b < a for a, b in itertools.pairwise(starts)):
        return f"t_mul={t_mul}: the period starts are not increasing in float64"
    lengths = tuple(power(t_mul, i) for i in range(len(starts)))
    if m_mul != 1.0:
        peaks = tuple(power(m_mul, i) for i in range(len(starts)))
    return RestartTables(t_mul, m_mul, tuple(starts), tuple(starts[1:]), lengths, peaks)
