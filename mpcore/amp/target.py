"""Which 16-bit dtype automatic mixed precision uses on a device: the fast one, by the
backend's own verdict (:func:`mpcore.check_policy`).

float16 where the verdict on ``mixed_float16`` is fast (CUDA with compute capability 7.0 and
up, OpenCL devices with fast half), else bfloat16 where ``mixed_bfloat16`` is fast (CPUs with
avx512_bf16 or AMX). Where neither is fast it still works, in bfloat16 where that is supported
(no loss scale needed, float32's range) and float16 otherwise, and says why once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from mpcore.core import dtypes as _dt
from mpcore.mixed_precision.verdict import Verdict, check_policy

logger = logging.getLogger("mpcore")

LOW_DTYPES = ("float16", "bfloat16")


def choose_dtype(float16: Verdict, bfloat16: Verdict) -> tuple[str, str | None]:
    """The 16-bit dtype for a device, from its verdicts on mixed_float16 and mixed_bfloat16,
    and, where it is not fast, why (a pure function: testable for devices not present)."""
    if float16.fast:
        return "float16", None
    if bfloat16.fast:
        return "bfloat16", None
    for verdict, dtype in ((bfloat16, "bfloat16"), (float16, "float16")):
        if verdict.supported:
            return dtype, (f"neither 16-bit dtype is fast on {verdict.backend} "
                           f"({verdict.device}); using {dtype}, which runs but is not fast: "
                           f"{verdict.reason}")
    raise ValueError(f"automatic mixed precision: {float16.backend} ({float16.device}) "
                     f"supports neither 16-bit dtype: {float16.reason} {bfloat16.reason}")


#: The short names PyTorch and mixed precision configs use (torch.half, "fp16", "bf16").
ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16"}


def check_dtype(dtype: Any) -> str:
    """A user's ``dtype=``: float16 or bfloat16, by name (any case), alias (:data:`ALIASES`)
    or dtype object (``np.float16``)."""
    name: str | None
    if isinstance(dtype, str) and dtype.lower() in ALIASES:
        name = ALIASES[dtype.lower()]
    else:
        try:
            name = _dt.canonical(dtype.lower() if isinstance(dtype, str) else dtype)
        except (TypeError, ValueError):
            name = None
    if name not in LOW_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(LOW_DTYPES)} (also "
                         f"{', '.join(ALIASES)}, or a dtype object such as np.float16; or "
                         f"None: the device's fast one), got {dtype!r}")
    return name


_chosen: dict[str, str] = {}
_lock = threading.Lock()


def device_dtype(backend: Any) -> str:
    """The 16-bit dtype for ``backend``'s device (cached per backend; a dtype that is not
    fast is logged once, with the verdict's reason)."""
    found = _chosen.get(backend.name)
    if found is not None:
        return found
    dtype, why = choose_dtype(check_policy("mixed_float16", backend),
                              check_policy("mixed_bfloat16", backend))
    with _lock:
        if backend.name not in _chosen:
            _chosen[backend.name] = dtype
            if why is not None:
                logger.warning("Automatic mixed precision: %s", why)
    return _chosen[backend.name]
