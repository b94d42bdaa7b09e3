"""The check of the learning-rate schedules a recorded step computes on the device
(:mod:`mpcore.optimizers.device_schedules`): CosineDecay's and CosineDecayRestarts' rates are
the host's bit for bit. Their cosine is IEEE basic operations in float64 ops
(:mod:`mpcore.optimizers.cosine_math`) and their restarts a count against a table and a
gather, so this holds a backend's float64 ``add``, ``subtract``, ``multiply``, ``divide``
(correctly rounded, never fused into one rounding), ``abs``, ``where``, comparisons, ``cast``
to and from int64, ``sum`` of 0s and 1s and ``take`` to IEEE: a backend that breaks it would
give eager steps and a traced step's replays other rates than ``optimizer.learning_rate``."""

from __future__ import annotations

from typing import Any

from mpcore.conformance.harness import CheckFailedError, CheckSkippedError, Context

#: steps to 400 in the full run (40 in the quick one), restarts' boundaries, far steps
FAR_STEPS = (999, 1000, 1001, 121, 363, 364, 531441, 797161, 10**6 + 3, 12345678, 2**40)


def check_cosine_schedules(ctx: Context) -> str:
    np = ctx.np
    from mpcore import ops
    from mpcore.core.tensor import Variable
    from mpcore.optimizers import device_schedules
    from mpcore.optimizers import schedules as s

    cases = [s.CosineDecay(0.1, 1000), s.CosineDecay(0.1, 7, alpha=0.1),
             s.CosineDecay(0.01, 6, warmup_target=0.05, warmup_steps=3),
             s.CosineDecayRestarts(0.1, 7, t_mul=1.0, m_mul=0.5, alpha=0.1),
             s.CosineDecayRestarts(1.0, 1, t_mul=3.0, m_mul=0.9)]
    why = device_schedules.why_not(cases[0], ctx.be)
    if why is not None:
        raise CheckSkippedError(f"not computed on this device: {why}")
    steps = (*range(40 if ctx.quick else 400), *FAR_STEPS)
    it = Variable(ops.constant(0, "int64", backend=ctx.be), dtype="int64")
    for schedule in cases:
        for step in steps:
            it.assign(ops.constant(step, "int64", backend=ctx.be))
            got = np.asarray(ctx.host(device_schedules.device_rate(schedule, it).data,
                                      "schedule rate"))
            want = np.array([schedule(step)], np.float64)
            if got.dtype != np.float64 or got.tobytes() != want.tobytes():
                raise CheckFailedError(
                    f"{schedule!r} at step {step}: the device rate is {got!r}, the host's "
                    f"{want!r}; float64 add/subtract/multiply/divide must round each result "
                    "once, as IEEE 754 (no fused multiply-add), and abs/where/comparisons/"
                    "cast/sum/take be exact")
    return f"{len(cases)} schedules at {len(steps)} steps, bit for bit"


def _cos_arguments(np: Any) -> Any:
    """ieee_cos's arguments: the schedules' (pi times a fraction in [0, 1], and far beyond
    for a restart's), signed zeros, negatives, huge values, infinities and NaN."""
    fractions = np.linspace(0.0, 1.0, 257)
    special = [0.0, -0.0, 1e-300, -1e-300, 0.5, -2.5, 1e5, 3.0e9, 1e300, np.inf, -np.inf,
               np.nan, np.pi, np.pi / 2, np.pi / 4, 2.0**20 * np.pi / 2]
    return np.concatenate([np.pi * fractions, special]).astype(np.float64)


def check_ieee_cos(ctx: Context) -> str:
    """``ieee_cos`` is :func:`mpcore.optimizers.cosine_math.cos` bit for bit (NaN for NaN),
    element by element, for a (1,) array (a schedule's rate) and for a longer one."""
    np = ctx.np
    from mpcore.optimizers.cosine_math import cos

    k = ctx.kernel("ieee_cos")
    x = _cos_arguments(np)
    cases = [("an array", x), *((f"x[{i}:{i + 1}]", x[i:i + 1]) for i in (0, 100, 256))]
    for label, args in cases:
        want = np.array([cos(v) for v in args.tolist()], np.float64)
        got = np.asarray(ctx.host(k(ctx.up(args, "float64")), "ieee_cos"))
        if got.dtype != np.float64 or got.shape != want.shape:
            raise CheckFailedError(f"ieee_cos of {label} is {got.dtype} of shape {got.shape}, "
                                   f"expected float64 of shape {want.shape}")
        same = (got.view(np.uint64) == want.view(np.uint64)) | (np.isnan(got)
                                                                 & np.isnan(want))
        if not same.all():
            bad = int(np.flatnonzero(~same)[0])
            raise CheckFailedError(
                f"ieee_cos of {label}: element {bad} is {got[bad]!r} where "
                f"mpcore.optimizers.cosine_math.cos gives {want[bad]!r}; the kernel must run "
                "that algorithm's IEEE basic operations in its order (not libm's cos)")
    return f"{x.size} arguments bit for bit"
