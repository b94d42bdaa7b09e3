"""Loss scaling: unscale every gradient and check that all are finite, with one device flag
and no host read (the flag gates the optimizer update on the device)."""

from __future__ import annotations

from collections.abc import Sequence

from mpcore.core.tensor import Tensor


def unscale_and_check(grads: Sequence[Tensor | None],
                      inv_scale: float) -> tuple[list[Tensor | None], Tensor | None]:
    """Every gradient times ``inv_scale``, in float32, and one device flag that is true when
    all of them are finite: one multi-tensor kernel, no host read. None stays None."""
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads), None
    be = present[0]._backend
    outs, flag = be.kernels()["unscale_and_check"]([g._data for g in present], float(inv_scale))
    it = iter(outs)
    result = [None if g is None else Tensor(next(it), be, "float32") for g in grads]
    return result, Tensor(flag, be, "bool")


def all_finite(xs: Sequence[Tensor]) -> Tensor:
    """A device flag: are all values of all tensors finite?"""
    tensors = [x for x in xs if x is not None]
    if not tensors:
        raise ValueError("all_finite needs at least one tensor")
    be = tensors[0]._backend
    kernel = be.kernels().get("all_finite")
    if kernel is not None:
        return Tensor(kernel([t._data for t in tensors]), be, "bool")
    return unscale_and_check(tensors, 1.0)[1]  # type: ignore[return-value]
