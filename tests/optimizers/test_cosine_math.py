"""The cosine schedules' arithmetic (mpcore.optimizers.cosine_math): the cosine of IEEE basic
operations against math.cos (at most 1 ulp, held by a property test over [0, pi], the schedule
fractions and far beyond), its constants derived again from pi, and CosineDecayRestarts' exact
restart index and tables."""

from __future__ import annotations

import math
import random
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpcore.optimizers import cosine_math as cm

#: The most the cosine differs from math.cos (glibc's, correctly rounded in practice), in
#: ulps of math.cos's value: measured 1.0 on 400 000 points of [0, pi] and on [0, 1e5].
MAX_ULPS = 1.0


def _ulps(got: float, want: float) -> float:
    return 0.0 if got == want else abs(got - want) / math.ulp(want)


def _pi() -> Fraction:
    """pi to 110 digits by Machin's formula, 16 atan(1/5) - 4 atan(1/239)."""
    def atan_inverse(n: int) -> Decimal:
        x = Decimal(1) / n
        term, total, k = x, x, 1
        while abs(term) > Decimal(10) ** -112:
            term *= -x * x
            k += 2
            total += term / k
        return total

    with localcontext() as ctx:
        ctx.prec = 120
        return Fraction(16 * atan_inverse(5) - 4 * atan_inverse(239))


def test_the_constants_are_pi_over_2_in_parts_and_inverse_factorials() -> None:
    half_pi = _pi() / 2
    rest = half_pi
    for part in (cm.P1, cm.P2, cm.P3):
        # the 33 leading bits of what is left (k * part is exact for k < 2**20)
        top = Fraction(2) ** (math.floor(math.log2(rest)) - 32)
        assert Fraction(part) == math.floor(rest / top) * top
        rest -= Fraction(part)
    assert float(rest) == cm.P4
    assert float(1 / half_pi) == cm.TWO_OVER_PI
    cos_terms = [Fraction((-1) ** j, math.factorial(2 * j + 4)) for j in range(7)]
    sin_terms = [Fraction((-1) ** (j + 1), math.factorial(2 * j + 3)) for j in range(8)]
    assert tuple(map(float, cos_terms)) == cm.COS_TERMS
    assert tuple(map(float, sin_terms)) == cm.SIN_TERMS


@settings(max_examples=3000, deadline=None)
@given(st.floats(0.0, math.pi))
def test_cos_is_within_an_ulp_of_math_cos_on_0_to_pi(x: float) -> None:
    assert _ulps(cm.cos(x), math.cos(x)) <= MAX_ULPS
    assert cm.cos(-x) == cm.cos(x)


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 10**7), st.integers(1, 10**7))
def test_cos_of_a_schedule_fraction(step: int, steps: int) -> None:
    # what the schedules take the cosine of: pi * (step / steps), the fraction within [0, 1]
    x = math.pi * (min(step, steps) / steps)
    assert _ulps(cm.cos(x), math.cos(x)) <= MAX_ULPS


def test_cos_on_awkward_points_and_far_arguments() -> None:
    points = [0.0, 5e-324, 1e-300, 1e-8, math.pi / 4, math.pi / 2, math.pi, 2 * math.pi,
              math.nextafter(math.pi / 2, 0), math.nextafter(math.pi / 2, 4),
              math.nextafter(math.pi, 0), math.nextafter(math.pi, 4)]
    rng = random.Random(0)
    points += [rng.uniform(0, 1e5) for _ in range(20000)]
    points += [math.pi * i / 997 for i in range(998)]
    differ = 0
    for x in points:
        got, want = cm.cos(x), math.cos(x)
        assert _ulps(got, want) <= MAX_ULPS, x
        differ += got != want
    assert differ < len(points) / 10
    assert math.isnan(cm.cos(math.inf)) and math.isnan(cm.cos(math.nan))


def _keras_restart(fraction: float, t_mul: float) -> int:
    return math.floor(math.log(1.0 - fraction * (1.0 - t_mul)) / math.log(t_mul))


@pytest.mark.parametrize("t_mul", [2.0, 3.0, 1.5, 0.5, 0.9])
def test_restart_index_is_exact_where_keras_log_formula_slips(t_mul: float) -> None:
    slips = 0
    for restart in range(0, 40 if t_mul > 1 else 12):
        start = cm.period_start(t_mul, restart)
        for fraction in (start, math.nextafter(start, math.inf),
                         math.nextafter(start, -math.inf)):
            if fraction < 0:
                continue
            want = max(i for i in range(restart + 2) if cm.period_start(t_mul, i) <= fraction)
            assert cm.restart_index(fraction, t_mul) == want, (restart, fraction)
            slips += _keras_restart(fraction, t_mul) != want
    if t_mul == 3.0:
        assert slips > 0      # log(243) / log(3) = 4.999...: Keras starts period 5 a step late
    assert cm.restart_index(2.0, 0.5) is None       # past the last restart of t_mul < 1


def test_restart_tables_and_why_there_are_none() -> None:
    tables = cm.restart_tables(10.0, 2.0, 0.5)
    assert isinstance(tables, cm.RestartTables) and tables.peaks is not None
    assert tables.starts[:4] == (-0.0, 1.0, 3.0, 7.0) and tables.boundaries == tables.starts[1:]
    assert tables.lengths[:3] == (1.0, 2.0, 4.0) and tables.peaks[:3] == (1.0, 0.5, 0.25)
    assert tables.starts[-1] > 2.0**63 / 10.0 >= tables.starts[-2]   # every int64 step
    for fraction in (0.0, 0.99, 1.0, 6.5, 7.0, 1e17):
        assert tables.index(fraction) == cm.restart_index(fraction, 2.0)
    flat = cm.restart_tables(10.0, 1.0, 0.5)
    assert isinstance(flat, cm.RestartTables) and flat.peaks is not None
    assert flat.peaks[-1] == 0.0 and flat.peak(10**15) == 0.0 == 0.5**10**15
    assert flat.peak(3) == 0.125
    grows = cm.restart_tables(10.0, 1.0, 2.0)
    assert isinstance(grows, cm.RestartTables) and grows.peak(5000) == math.inf
    assert cm.power(2.0, 5000) == math.inf and cm.power(-2.0, 5001) == -math.inf
    assert cm.restart_tables(10.0, 1.0, 1.0).peaks is None     # type: ignore[union-attr]
    assert "t_mul=0.5 < 1" in str(cm.restart_tables(10.0, 0.5, 1.0))
    assert "more than 65536 restarts" in str(cm.restart_tables(10.0, 1.0001, 1.0))
    assert "m_mul=0.99 with t_mul=1" in str(cm.restart_tables(10.0, 1.0, 0.99))
    assert "m_mul=-0.5 < 0" in str(cm.restart_tables(10.0, 1.0, -0.5))
