"""The conformance kit: hold any backend to the contract the built-in ones meet.

A third-party backend author runs it against their backend::

    python -m mpcore.conformance NAME [--quick] [--json] [--only PATTERN]
    mpcore conformance NAME
    mpcore.conformance.check(backend) -> Report

It checks, with the CPU backend as the reference and dtype-aware tolerances:

- the Backend contract: a class attribute ``name``, construction without arguments, a cheap
  (timed) ``unavailable_reason()``, ``devices()`` returning :class:`~mpcore.Device` objects,
  ``policy_support`` returning a :class:`~mpcore.Support` for every policy, every kernel of
  :data:`~mpcore.core.backend.REQUIRED_KERNELS` present and callable;
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

The modules, one concept each: ``report`` (results, the table and JSON), ``harness`` (the
context a check gets, the tolerance table, running checks), ``contract``, ``kernels`` (the
required array kernels), ``training_kernels`` (random, loss scaling, the optional fused
kernels), ``training`` (gradients, a training run), ``plan`` (every check in order, and
:func:`check`), ``cli`` (``mpcore conformance``, registered through the ``mpcore_commands``
hook like any plugin's command).

Design decision, NumPy: the core (``mpcore/``) has no NumPy-specific code on the paths it uses
at ``import mpcore``. This package is a tool, loaded only when run (``mpcore conformance``,
``python -m mpcore.conformance`` or ``check``), so it imports NumPy and ml_dtypes lazily, inside
the functions that need them: importing it (as the ``mpcore`` command does, to register the
subcommand) adds no NumPy import of its own.
"""

from __future__ import annotations

# CHEAP_SECONDS is read here for show: the contract checks use
# mpcore.conformance.contract.CHEAP_SECONDS, which is the one to change.
from mpcore.conformance.contract import CHEAP_SECONDS
from mpcore.conformance.harness import (
    FLOATS,
    LOW,
    TOLERANCES,
    Check,
    CheckFailedError,
    CheckSkippedError,
    Context,
    run_checks,
)
from mpcore.conformance.plan import check, check_names
from mpcore.conformance.report import FAIL, PASS, SKIP, CheckResult, Report

__all__ = [
    "CHEAP_SECONDS", "FAIL", "FLOATS", "LOW", "PASS", "SKIP", "TOLERANCES", "Check",
    "CheckFailedError", "CheckResult", "CheckSkippedError", "Context", "Report", "check",
    "check_names", "run_checks",
]
