"""The contract checks: what the registry and the core expect of a Backend class before
any kernel runs (a class attribute ``name``, construction without arguments, a cheap
``unavailable_reason()``, :class:`~mpcore.Device` objects, a :class:`~mpcore.Support` with a
reason for every policy, every required kernel present and callable)."""

from __future__ import annotations

import json
import time

from mpcore.conformance.harness import CheckFailedError, Context
from mpcore.core.backend import OPTIONAL_KERNELS, REQUIRED_KERNELS, Device, Support
from mpcore.mixed_precision.policy import POLICIES

#: ``unavailable_reason()`` runs at ``import mpcore``; slower than this is a failure.
CHEAP_SECONDS = 0.25


def check_name(ctx: Context) -> str:
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
    advice = ctx.be.install_advice()
    if not isinstance(advice, str):
        raise CheckFailedError(f"{cls.__name__}.install_advice() must return a str (\"\" for "
                               f"none), got {advice!r}")
    return f"name {name!r}, priority {cls.priority}"


def check_constructor(ctx: Context) -> str:
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


def check_unavailable_reason(ctx: Context) -> str:
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


def check_devices(ctx: Context) -> str:
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


def check_policy_support(ctx: Context) -> str:
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


def check_required_kernels(ctx: Context) -> str:
    missing = ctx.be.missing_kernels()
    if missing:
        raise CheckFailedError("required kernels missing or not callable: " + ", ".join(missing))
    table = ctx.be.kernels()
    absent = [k for k in REQUIRED_KERNELS if not callable(table.get(k))]
    if absent:
        raise CheckFailedError("kernels() lacks required kernels: " + ", ".join(absent))
    return f"all {len(REQUIRED_KERNELS)} present"


def check_optional_kernels(ctx: Context) -> str:
    table = ctx.be.kernels()
    have = [k for k in OPTIONAL_KERNELS if callable(table.get(k))]
    return f"{len(have)} of {len(OPTIONAL_KERNELS)}: " + (", ".join(have) or "none")

