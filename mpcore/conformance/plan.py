"""Which checks run, in which order, and :func:`check`, the kit's entry point in Python.

The plan is one list so that a reader sees every check at a glance: the contract first (a
backend that breaks it has its kernel checks skipped), then the required kernels, the kernels
a training step relies on, gradients and a training run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import mpcore.conformance.contract as contract
import mpcore.conformance.float8 as float8
import mpcore.conformance.kernels as kernels
import mpcore.conformance.layers as layers
import mpcore.conformance.schedules as schedules
import mpcore.conformance.training as training
import mpcore.conformance.training_kernels as training_kernels
from mpcore.conformance.harness import FLOATS, Check, run_checks, selected
from mpcore.conformance.report import Report
from mpcore.core.backend import Backend


def checks(quick: bool) -> Iterator[Check]:
    """Every check, in the order they run."""
    c = Check
    yield c("contract.name", "contract", contract.check_name)
    yield c("contract.constructor", "contract", contract.check_constructor)
    yield c("contract.unavailable_reason", "contract", contract.check_unavailable_reason)
    yield c("contract.devices", "contract", contract.check_devices)
    yield c("contract.policy_support", "contract", contract.check_policy_support)
    yield c("contract.required_kernels", "contract", contract.check_required_kernels)
    yield c("contract.optional_kernels", "contract", contract.check_optional_kernels)
    k = kernels
    yield c("creation.asarray", "creation", k.check_asarray, ("asarray", "to_host"))
    yield c("creation.full", "creation", k.check_full, ("full",))
    yield c("creation.cast", "creation", k.check_cast, ("cast",))
    yield c("creation.copy", "creation", k.check_copy, ("copy",))
    for dtype in FLOATS:
        for name in k.UNARY:
            yield c(f"unary.{name}[{dtype}]", "elementwise", k.check_unary(name, dtype), (name,))
    for dtype in (*FLOATS, "int32"):
        for name in k.BINARY:
            if dtype == "int32" and name in ("divide", "power"):
                continue
            yield c(f"binary.{name}[{dtype}]", "elementwise", k.check_binary(name, dtype),
                    (name,))
        yield c(f"compare[{dtype}]", "elementwise", k.check_comparison(dtype), k.COMPARISONS)
    yield c("logical", "elementwise", k.check_logical,
            ("logical_and", "logical_or", "logical_not"))
    yield c("isfinite", "elementwise", k.check_isfinite, ("isfinite",))
    for dtype in FLOATS:
        yield c(f"where[{dtype}]", "elementwise", k.check_where(dtype), ("where",))
    for name in ("sum", "mean", "max", "min"):
        for dtype in (*FLOATS, "int32"):
            if dtype == "int32" and name == "mean":
                continue
            yield c(f"reduce.{name}[{dtype}]", "reductions", k.check_reduction(name, dtype),
                    (name,))
    for dtype in FLOATS:
        yield c(f"reduce.argmax[{dtype}]", "reductions", k.check_argmax(dtype), ("argmax",))
        yield c(f"matmul[{dtype}]", "matmul", k.check_matmul(dtype), ("matmul",))
        yield c(f"shapes[{dtype}]", "shapes", k.check_shapes(dtype),
                ("reshape", "transpose", "broadcast_to", "concat"))
        yield c(f"take[{dtype}]", "indexing", k.check_take(dtype), ("take", "take_grad"))
        yield c(f"getitem[{dtype}]", "indexing", k.check_getitem(dtype),
                ("getitem", "getitem_grad"))
    yield c("one_hot", "indexing", k.check_one_hot, ("one_hot",))
    for dtype in FLOATS:
        yield c(f"image.patches[{dtype}]", "images", k.check_patches(dtype),
                ("extract_patches", "extract_patches_grad"))
        yield c(f"image.max_pool[{dtype}]", "images", k.check_pool(dtype),
                ("max_pool2d", "max_pool2d_grad"))
    t = training_kernels
    for kind in ("random_uniform", "random_normal"):
        for dtype in FLOATS:
            yield c(f"random.{kind.split('_')[1]}[{dtype}]", "random",
                    t.check_random(kind, dtype), (kind,))
    yield c("loss_scale.unscale_and_check", "loss scaling", t.check_unscale_and_check,
            ("unscale_and_check",))
    yield c("optional.unscale_and_check_by", "optional", t.check_unscale_and_check_by,
            ("unscale_and_check_by",))
    yield c("optional.loss_scale_update", "optional", t.check_loss_scale_update,
            ("loss_scale_update",))
    yield c("optional.adam_rates", "optional", t.check_adam_rates, ("adam_rates",))
    yield c("optional.ieee_cos", "optional", schedules.check_ieee_cos, ("ieee_cos",))
    yield c("optional.all_finite", "optional", t.check_all_finite, ("all_finite",))
    yield c("optional.softmax", "optional", t.check_softmaxes, ("softmax", "log_softmax"))
    yield c("optional.sparse_softmax_cross_entropy", "optional", t.check_xent,
            ("sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_grad"))
    for dtype in FLOATS:
        yield c(f"optional.relu_grad_bias_add[{dtype}]", "optional",
                t.check_relu_grad_bias_add(dtype), ("relu_grad", "relu_grad_bias", "bias_add"))
    for dtype in FLOATS:
        yield c(f"optional.dense[{dtype}]", "optional", t.check_dense(dtype), ("dense",))
    yield c("optional.batch_norm", "optional", layers.check_batch_norm_kernels,
            ("batch_norm", "batch_norm_grad"))
    yield c("optional.layer_norm", "optional", layers.check_layer_norm_kernels,
            ("layer_norm", "layer_norm_grad"))
    for dtype in FLOATS:
        yield c(f"optional.gelu[{dtype}]", "optional", layers.check_gelu_kernels(dtype),
                ("gelu", "gelu_grad"))
    for dtype in FLOATS:
        yield c(f"optional.conv2d[{dtype}]", "optional", t.check_conv2d(dtype),
                ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"))
    for dtype in FLOATS:
        yield c(f"optional.quantize_fp8[{dtype}]", "fp8", float8.check_quantize(dtype),
                ("quantize_fp8",))
        yield c(f"optional.dequantize_fp8[{dtype}]", "fp8", float8.check_dequantize(dtype),
                ("dequantize_fp8",))
    for dtype in ("float32", "bfloat16"):
        yield c(f"optional.fp8_gemm[{dtype}]", "fp8", float8.check_fp8_matmul(dtype),
                ("fp8_matmul",))
    yield c("optional.fp8_scale", "fp8", float8.check_fp8_scale, ("fp8_scale",))
    yield c("optional.dropout_mask", "optional", t.check_dropout_mask, ("dropout_mask",))
    yield c("optional.random_permutation", "optional", t.check_random_permutation,
            ("random_permutation",))
    for name in ("sgd_update", "rmsprop_update", "adam_update"):
        yield c(f"optional.{name}", "optional", t.check_optimizer(name), (name,))
    for dtype in FLOATS:
        yield c(f"autodiff.mlp[{dtype}]", "autodiff", training.check_gradients(dtype))
    for name in layers.CASE_NAMES:
        for dtype in FLOATS:
            yield c(f"layers.{name}[{dtype}]", "layers", layers.check_layer(name, dtype))
    yield c("training.mixed_float16_skip_and_recover", "training", training.check_training)
    yield c("training.cosine_schedules", "training", schedules.check_cosine_schedules,
            ("add", "subtract", "multiply", "divide", "abs", "where", "take"))


def check_names(quick: bool = False) -> list[str]:
    """The name of every check, in the order they run."""
    return [c.name for c in checks(quick)]


def _resolve(backend: Backend | str) -> Backend:
    if isinstance(backend, Backend):
        return backend
    from mpcore.plugins.registry import backends, find_backend

    found = find_backend(backend)      # any case, as MPCORE_BACKEND
    if found is None:
        # in the order mpcore info and the registry's errors list them: by priority
        raise ValueError(f"unknown backend {backend!r}; registered backends: "
                         f"{', '.join(b.name for b in backends()) or 'none'}.")
    return found


def check(backend: Backend | str, *, reference: Backend | str = "cpu", quick: bool = False,
          only: Sequence[str] | None = None) -> Report:
    """Run the conformance checks on ``backend`` (an instance or a registered name) against
    ``reference``; ``only`` keeps the checks whose names contain one of its strings
    (``"matmul"``, ``"[bfloat16]"``) or match it as an fnmatch pattern (``"reduce.*[[]int32]"``).
    Never raises for a broken backend: every problem is a failed check in the report; a
    string of ``only`` that selects no check is a ValueError (a typo would otherwise run
    nothing and report that the backend conforms)."""
    tested, ref = _resolve(backend), _resolve(reference)
    plan = list(checks(quick))
    _check_only(only or (), [spec.name for spec in plan])
    return run_checks(tested, ref, plan, quick=quick, only=only)


def _check_only(only: Sequence[str], names: list[str]) -> None:
    unmatched = [p for p in only if not any(selected(name, [p]) for name in names)]
    if unmatched:
        families = dict.fromkeys(re.split(r"[.\[]", name, maxsplit=1)[0] for name in names)
        raise ValueError(f"--only {', '.join(map(repr, unmatched))} matches no check; a check "
                         "name contains or matches the pattern, and check names start with "
                         f"{', '.join(families)} (`mpcore conformance NAME --list` lists all "
                         f"{len(names)})")
