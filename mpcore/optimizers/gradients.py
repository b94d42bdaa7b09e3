"""What an optimizer does with (gradient, variable) pairs before its update: tf-keras'
``compute_gradients`` (the pairs from a loss), and the split of the pairs into the gradients
and variables to update, with Keras 3's warning for the variables left without a gradient
(a layer not on the loss's path, a loss that forgot an output: silently frozen weights)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mpcore.core import user_frames as _user_frames
from mpcore.core.tape import GradientTape
from mpcore.core.tensor import Tensor, Variable

VarList = Sequence[Variable] | Callable[[], Sequence[Variable]]


def compute_gradients(loss: Any, var_list: VarList, tape: GradientTape | None = None
                      ) -> list[tuple[Tensor | None, Variable]]:
    """tf-keras' ``Optimizer.compute_gradients``: the (gradient, variable) pairs of ``loss`` (a
    callable taking no arguments, or a tensor computed under ``tape``). ``var_list`` may be a
    callable, called after the loss, for variables the loss's first call creates."""
    if not callable(loss) and tape is None:
        raise ValueError("`tape` is required when a `Tensor` loss is passed. "
                         f"Received: loss={loss}, tape={tape}.")
    if tape is None:
        tape = GradientTape()
    if callable(loss):
        with tape:
            if not callable(var_list):
                tape.watch(list(var_list))
            loss = loss()
            if callable(var_list):
                var_list = var_list()
    variables = list(var_list() if callable(var_list) else var_list)
    return list(zip(tape.gradient(loss, variables), variables))


def split_grads_and_vars(grads_and_vars: Iterable[tuple[Tensor | None, Variable]]
                         ) -> tuple[list[Tensor], list[Variable]]:
    """The gradients and their variables, pairs whose gradient is None left out (and named in
    Keras 3's warning)."""
    grads, variables, missing = [], [], []
    for grad, var in grads_and_vars:
        if not isinstance(var, Variable):
            raise TypeError(f"apply_gradients takes (gradient, Variable) pairs, got a "
                            f"{type(var).__name__} as the variable")
        if grad is None:
            missing.append(var.name)
            continue
        grads.append(grad)
        variables.append(var)
    if missing:
        warnings.warn(f"Gradients do not exist for variables {missing} when minimizing the "
                      "loss. If using `model.compile()`, did you forget to provide a `loss` "
                      "argument?", UserWarning, stacklevel=_user_frames.stacklevel())
    return grads, variables


def same_tensors(given: Sequence[Tensor], unscaled: Sequence[Tensor]) -> bool:
    """Whether ``given`` are the tensors get_unscaled_gradients returned: the same objects, or
    wrappers of the same device buffers (a traced step's replay rewraps them). Identity, not
    values: comparing values would be a host read every step."""
    return len(given) == len(unscaled) and all(
        a is b or a._data is b._data for a, b in zip(given, unscaled))
