"""The CPU backend's traced steps: an optimizer's updates of small variables run as one.

A traced step replays an optimizer's update variable by variable, as the eager step runs it. For
a small variable (a bias, a 64 x 64 layer) each update is about nine NumPy passes whose cost is
the calls, not the elements. :func:`group_updates` replaces each run of consecutive updates of
small float32 variables with the same kernel, hyperparameters and finite-check flag by one
:class:`UpdateGroup`, which gathers the variables, gradients and slots into flat buffers, runs
the passes once over all of them and copies the variables and slots back (the multi-tensor
updates of apex and of torch's ``foreach`` optimizers, for the same reason). Each pass is
elementwise, so every element goes through the same float32 operations in the same order as
alone: the results are the eager step's bits. Large variables keep their own kernel (oneDNN's
threaded passes where it has them): copying them would cost more than a call saves. The
buffers are one per thread, shared by its groups, and a group's total is capped, so a replay
keeps at most a few MB (:data:`GROUP_MAX_ELEMENTS`) for them whatever the model, as the eager
kernels' blocks bound their scratch.

Before it gathers, a group checks what it assumes of the arrays it is given: float32,
contiguous, the recorded sizes, and no gradient and no two variables or slots sharing memory
(a gathered update reads every gradient before it writes any variable). Where one does not
hold, or another thread is running the same group, it runs each member's own kernel in order,
as the plain replay would.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpcore_xp import F32

from mpcore.tracing.function import value_key
from mpcore.tracing.program import (
    NONE,
    Const,
    KernelCall,
    ListOf,
    Node,
    Op,
    Program,
    Slot,
    VariableRead,
)

from .optim import _rmsprop, _rmsprop_constants, _sgd, _sgd_constants

#: Variables of at most this many elements are gathered (a larger one's copies in and out
#: cost more than the calls a group saves; it keeps its own kernel).
GATHER_MAX_ELEMENTS = 1 << 14
#: The most elements one group gathers (each thread's buffer is at most 6 rows of this).
GROUP_MAX_ELEMENTS = 1 << 17


@dataclass(frozen=True)
class UpdateForm:
    """Where an update kernel's arguments are: ``state`` the arrays it updates in place (the
    variable, then its slots, which may be None), ``grad`` the gradient, ``hyper`` the Python
    hyperparameters, ``flag`` the finite-check flag. ``body(state, grad, scratch, hyper)``
    runs the update on flat arrays."""

    arity: int
    state: tuple[int, ...]
    grad: int
    hyper: tuple[int, ...]
    flag: int
    body: Callable[[list[np.ndarray | None], np.ndarray, list[np.ndarray], tuple[Any, ...]],
                   None]


def _rmsprop_body(state: list[np.ndarray | None], grad: np.ndarray,
                  scratch: list[np.ndarray], hyper: tuple[Any, ...]) -> None:
    var, ms, mom = state
    assert var is not None and ms is not None
    _rmsprop(var, grad, ms, mom, scratch[0], scratch[1], _rmsprop_constants(*hyper))


def _sgd_body(state: list[np.ndarray | None], grad: np.ndarray, scratch: list[np.ndarray],
              hyper: tuple[Any, ...]) -> None:
    var, velocity = state
    lr, momentum, nesterov = hyper
    _sgd(var, grad, velocity, scratch[0], scratch[1], _sgd_constants(lr, momentum), nesterov)


#: The updates a group can run, by kernel name (their CPU kernels' argument order).
FORMS = {
    # rmsprop_update(var, grad, ms, mom, lr, rho, momentum, epsilon, flag)
    "rmsprop_update": UpdateForm(9, (0, 2, 3), 1, (4, 5, 6, 7), 8, _rmsprop_body),
    # sgd_update(var, grad, velocity, lr, momentum, nesterov, flag)
    "sgd_update": UpdateForm(7, (0, 2), 1, (3, 4, 5), 6, _sgd_body),
}


def _member_key(step: Any, groupable: Collection[str]) -> tuple[Any, ...] | None:
    """What a step must share with its neighbours to run in one group with them, or None
    where it cannot be a member."""
    if type(step) is not KernelCall or step.name not in groupable:
        return None
    form = FORMS[step.name]
    args = step.inputs
    if len(args) != form.arity or type(args[form.grad]) is not Slot:
        return None
    first = args[form.state[0]]
    if type(first) is not VariableRead:
        return None
    var = first.variable
    if var.dtype != "float32" or var.size > GATHER_MAX_ELEMENTS:
        return None
    present = []
    for i in form.state:
        node = args[i]
        if _absent(node) and i != form.state[0]:
            present.append(False)
        elif (type(node) is VariableRead and node.variable.shape == var.shape
              and node.variable.dtype == "float32"):
            present.append(True)
        else:
            return None
    hyper = [args[i] for i in form.hyper]
    if any(type(node) is not Const for node in hyper):
        return None
    return (step.name, tuple(present), tuple(value_key(node.value) for node in hyper),
            args[form.flag])


#: Each thread's gathering buffer, shared by its groups (one runs at a time in a thread).
_work = threading.local()


def _thread_buffer(need: int) -> np.ndarray:
    """This thread's buffer, of at least ``need`` float32 (a fresh array of a group's size at
    every call would be mapped and faulted in by the C library at every step)."""
    buffer = getattr(_work, "buffer", None)
    if buffer is None or buffer.size < need:
        buffer = _work.buffer = np.empty(need, F32)
    return buffer


def _absent(node: Node) -> bool:
    """Whether ``node`` is an update's missing slot (None; a captured array is a constant too)."""
    return type(node) is Const and node.value is None


def _owner(a: np.ndarray) -> int:
    # NumPy points every view at the array that owns the memory
    return id(a if a.base is None else a.base)


class UpdateGroup:
    """Consecutive updates of one kind, run as one over gathered buffers (module docstring).
    Called as ``group(states, grads, flag)``: ``states`` the arrays the members update in
    place, member by member (its variable, then the slots it has), ``grads`` their gradients.
    """

    def __init__(self, name: str, members: Sequence[KernelCall],
                 input_grads: Sequence[int] = ()) -> None:
        self.form = form = FORMS[name]
        first = members[0].inputs
        self.hyper = tuple(first[i].value for i in form.hyper)
        #: Which of the form's state arguments the members have (an absent slot is None).
        self.present = [not _absent(first[i]) for i in form.state]
        self.kinds = sum(self.present)
        #: Each member's own kernel (what the plain replay calls): the fallback.
        self.kernels = [m.kernel for m in members]
        self.sizes = [_updated(m).size for m in members]
        self.total = sum(self.sizes)
        bounds = np.cumsum([0, *self.sizes]).tolist()
        self.spans = list(itertools.pairwise(bounds))
        #: Which gradients are the step's inputs (any array at each call; the others are
        #: results of the program's kernels, laid out alike at every replay).
        self.input_grads = tuple(input_grads)
        self.gathered = 0          # calls that ran gathered (the others: member by member)
        self._seen: list[int] | None = None
        #: The state arrays accepted last: held, so that no other array can take one's id
        #: while ``_seen`` names it (an assignment may free a variable's old array).
        self._held: list[np.ndarray] = []
        self._owners: set[int] = set()
        #: The thread buffer the views below are of (rows: the gradients, each kind of state,
        #: two of scratch).
        self._buffer: np.ndarray | None = None
        self._grad_row: Any = None
        self._state_rows: list[np.ndarray] = []
        self._body_state: list[np.ndarray | None] = []
        self._scratch: list[np.ndarray] = []
        self._copy_pairs: list[tuple[np.ndarray, np.ndarray]] = []
        self._lock = threading.Lock()

    def __call__(self, states: list[np.ndarray], grads: list[np.ndarray], flag: Any) -> None:
        # the checks' caches are this group's: a concurrent replay of the step runs unbatched
        if not self._lock.acquire(blocking=False):
            return self._one_by_one(states, grads, flag)
        try:
            return self._gathered(states, grads, flag)
        finally:
            self._lock.release()

    def _gathered(self, states: list[np.ndarray], grads: list[np.ndarray], flag: Any) -> None:
        seen = list(map(id, states))
        if seen != self._seen and not self._accept(states, grads, seen):
            return self._one_by_one(states, grads, flag)
        owners = self._owners
        for j in self.input_grads:
            if _owner(grads[j]) in owners:
                return self._one_by_one(states, grads, flag)
        buffer = _thread_buffer((self.kinds + 3) * self.total)
        if buffer is not self._buffer:
            self._views(buffer)
        try:
            # "no" casting: a gradient of another dtype is not this program's (and the output's
            # length one of another total size)
            np.concatenate(grads, axis=None, out=self._grad_row, casting="no")
        except (TypeError, ValueError):
            return self._one_by_one(states, grads, flag)
        if flag is not None and not bool(flag):
            return None
        self.gathered += 1
        kinds = self.kinds
        for k, row in enumerate(self._state_rows):
            np.concatenate(states[k::kinds], axis=None, out=row)
        self.form.body(self._body_state, self._grad_row, self._scratch, self.hyper)
        for target, source in self._copy_pairs:
            np.copyto(target, source)
        return None

    def _views(self, buffer: np.ndarray) -> None:
        kinds = self.kinds
        rows = buffer[:(kinds + 3) * self.total].reshape(kinds + 3, self.total)
        self._grad_row, self._state_rows = rows[0], list(rows[1:1 + kinds])
        full = iter(self._state_rows)
        self._body_state = [next(full) if p else None for p in self.present]
        self._scratch = [rows[-2], rows[-1]]
        # (a state array, flat, and its part of its row) for the copies back
        self._copy_pairs = [(a.reshape(-1), rows[1 + j % kinds, lo:hi])
                            for j, a in enumerate(self._held)
                            for lo, hi in [self.spans[j // kinds]]]
        self._buffer = buffer

    def _one_by_one(self, states: list[np.ndarray], grads: list[np.ndarray], flag: Any) -> None:
        form, kinds = self.form, self.kinds
        for m, (kernel, grad) in enumerate(zip(self.kernels, grads, strict=True)):
            own = iter(states[m * kinds:(m + 1) * kinds])
            args: list[Any] = [None] * form.arity
            for i, present in zip(form.state, self.present, strict=True):
                args[i] = next(own) if present else None
            for i, value in zip(form.hyper, self.hyper, strict=True):
                args[i] = value
            args[form.grad], args[form.flag] = grad, flag
            kernel(*args)

    def _accept(self, states: list[np.ndarray], grads: list[np.ndarray],
                seen: list[int]) -> bool:
        """Whether the gathered update gives what the members' kernels would for these state
        arrays (the variables' and slots' own: the same objects from step to step, so this
        runs when one changes) and gradients like these (whether a kernel's result is a view
        of a variable is the program's, the same at every replay)."""
        self._seen, self._held, self._buffer = None, [], None
        kinds = self.kinds
        if len(states) != kinds * len(self.sizes):
            return False
        owners = set()
        for j, a in enumerate(states):
            if not (type(a) is np.ndarray and a.dtype == F32
                    and a.size == self.sizes[j // kinds] and a.flags.c_contiguous
                    and a.flags.writeable):
                return False
            owners.add(_owner(a))
        if len(owners) != len(states) or any(_owner(g) in owners for g in grads):
            return False        # two of them share memory: the order of reads would show
        self._seen, self._held, self._owners = seen, list(states), owners
        return True


def _group_step(name: str, members: list[KernelCall], inputs: Collection[int]) -> KernelCall:
    form = FORMS[name]
    states = ListOf(tuple(m.inputs[i] for m in members for i in form.state
                          if not _absent(m.inputs[i])))
    grads = ListOf(tuple(m.inputs[form.grad] for m in members))
    text = f"{name} x{len(members)} (grouped)"
    given = [j for j, m in enumerate(members) if m.inputs[form.grad].index in inputs]
    return KernelCall(Op(f"grouped {name}", UpdateGroup(name, members, given)),
                      (states, grads, members[0].inputs[form.flag]), NONE, text)


def group_updates(program: Program, groupable: Collection[str] = tuple(FORMS)
                  ) -> Program | None:
    """``program`` with each run of two or more updates (of the kernels named in
    ``groupable``: those the backend runs with the bodies in :data:`FORMS`) replaced by one
    :class:`UpdateGroup` step, or None where there is no such run."""
    steps: list[Any] = []
    inputs = set(program.inputs)
    run: list[KernelCall] = []
    key: tuple[Any, ...] | None = None
    elements = 0                           # in the run
    grouped = False

    def close() -> None:
        nonlocal grouped
        if len(run) > 1 and _distinct(run):
            steps.append(_group_step(run[0].name, run, inputs))
            grouped = True
        else:
            steps.extend(run)
        run.clear()

    for step in program.steps:
        member = _member_key(step, groupable)
        size = 0 if member is None else _updated(step).size
        if member is None or member != key or elements + size > GROUP_MAX_ELEMENTS:
            close()
            elements = 0
        key = member
        if member is None:
            steps.append(step)
        else:
            run.append(step)
            elements += size
    close()
    if not grouped:
        return None
    return dataclasses.replace(program, steps=steps)


def _distinct(run: list[KernelCall]) -> bool:
    """No variable updated twice in the run (a second update must see the first's result)."""
    form = FORMS[run[0].name]
    variables = [m.inputs[i].variable for m in run for i in form.state
                 if type(m.inputs[i]) is VariableRead]
    return len({id(v) for v in variables}) == len(variables)


def _updated(step: KernelCall) -> Any:
    """The variable a member's update updates."""
    return step.inputs[FORMS[step.name].state[0]].variable
