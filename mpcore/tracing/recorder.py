"""The recorder of a trace: which arrays are slots, inputs, variables or captured constants,
the kernel calls made (through a recording view of each backend's kernel table), and the guards
a trace depends on. :mod:`mpcore.function` installs one per trace."""

from __future__ import annotations

import numbers
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from mpcore.core import user_frames as _user_frames
from mpcore.core.tensor import Tensor, Variable
from mpcore.core.trace_seeds import SEED_COPY, DrawnSeed
from mpcore.core.trace_state import refuse
from mpcore.tracing.program import (
    IN_PLACE,
    Const,
    DictOf,
    KernelCall,
    ListOf,
    Node,
    Op,
    SeedSlot,
    Slot,
    TensorOf,
    TupleOf,
    VariableRead,
    WholeCall,
    constant,
    dict_of,
    reads,
)

#: Kernels that take a seed, and the seed's position among their arguments.
_SEEDED = {"random_uniform": 2, "random_normal": 2, "dropout_mask": 3, "random_permutation": 1}


#: Python values a trace keeps as constants. Exact types: a NumPy scalar (``np.float64`` is a
#: ``float``) is what a kernel returns for a 0-d float64 result on the CPU, a value of the step
#: that each replay computes afresh, never the trace's constant.
_PYTHON_VALUES = frozenset({bool, int, float, str})


class Recorder:
    def __init__(self) -> None:
        self.steps: list[Any] = []
        self.slot_of: dict[int, int] = {}
        self.slots = 0
        # arrays that cannot be watched by a weak reference, held so that no id is reused
        self.pinned: list[Any] = []
        self.variable_of: dict[int, Variable] = {}
        #: arrays a variable held until an assignment in the step: (array, variable, assign)
        self.retired: dict[int, tuple[Any, Variable, Any]] = {}
        self.pending: list[int] = []
        self.created: list[str] = []
        #: whether a created variable is trainable (a weight of a model built by this call,
        #: drawn from mp.random), not state that starts from a constant (an optimizer's slots
        #: and step count, made by its first update)
        self.created_trainable = False
        #: the seeds drawn in the step (mp.random.next_seed), by id: (the seed, its draw's slot)
        self.seeds: dict[int, tuple[int, int]] = {}
        #: their values (a plain int equal to one, given to a random op, is refused)
        self.seed_values: set[int] = set()
        #: ids of the drawn seeds that went where a replay follows them
        self.consumed: set[int] = set()
        #: whether this is the function's first trace (see :meth:`refuse_seed`)
        self.first = True
        #: the first seed use of a first trace that a replay could not follow (refused at
        #: its end where the trace is kept)
        self.seed_refused: str | None = None
        self.whole_depth = 0
        self.kernel_depth = 0
        self.fallback = False
        self.refused: str | None = None
        self.tables: dict[int, dict[str, Callable[..., Any]]] = {}
        #: the backends whose kernels the trace called (their compile_program may run it)
        self.backends: dict[int, Any] = {}
        #: checks whose values the trace depends on (see ``function.kept_whole``), in order
        self.guards: dict[Callable[[], Any], None] = {}
        #: the Python state the step can reach, as it was (trace_python_state.StateWatch)
        self.state: Any = None
        #: a pre-pass's state to put back (trace_effects.HeldEffects), or None
        self.held: Any = None
        #: slots whose array is the same at every replay (results of constant kernel calls)
        self.constant_slots: set[int] = set()

    # slots ---------------------------------------------------------------------------------
    def new_slot(self, array: Any) -> int:
        i = self.slots
        self.slots += 1
        key = id(array)
        self.slot_of[key] = i
        try:
            # an array that dies during the trace is read by no later call; its id may then be
            # reused by a new array, which must get a slot of its own
            weakref.finalize(array, self.slot_of.pop, key, None)
        except TypeError:
            self.pinned.append(array)
        return i

    def spec(self, value: Any) -> Node:
        if isinstance(value, (list, tuple)):
            items = tuple(self.spec(v) for v in value)
            return ListOf(items) if isinstance(value, list) else TupleOf(items)
        if value is None or type(value) in _PYTHON_VALUES or type(value) is DrawnSeed:
            # a drawn seed given as it is to any kernel (constant(s), full(shape, s)): the
            # replay's draw, not the trace's value
            seed = self.drawn_spec(value) if type(value) is DrawnSeed else None
            return Const(value) if seed is None else seed
        # a variable's array first: an array assigned in the step is a slot too, but an
        # update in place after the assignment writes the variable's (a replay's assignment
        # copies, as the eager one did)
        variable = self.variable_of.get(id(value))
        if variable is not None and variable._data is value:
            return VariableRead(variable)
        slot = self.slot_of.get(id(value))
        if slot is not None:
            return Slot(slot)
        retired = self.retired.get(id(value))
        if retired is not None and retired[0] is value and retired[2] is not None:
            return Slot(self._read_before(value, *retired[1:]))
        return Const(value)                    # captured from outside the step

    def retire(self, array: Any, variable: Variable, assign: Any) -> None:
        """``array`` was ``variable``'s until ``assign`` (a step of this trace) replaced it;
        ``assign`` None: a call kept whole replaced it, the step :meth:`anchor` names next."""
        if array is None or id(array) in self.retired:
            return                  # (in a call kept whole: only the array it found counts)
        self.retired[id(array)] = (array, variable, assign)
        if assign is None:
            self.pending.append(id(array))

    def anchor(self, step: Any) -> None:
        """``step`` is the call kept whole that replaced the pending arrays."""
        for key in self.pending:
            array, variable, _ = self.retired[key]
            self.retired[key] = (array, variable, step)
        self.pending.clear()

    def _read_before(self, array: Any, variable: Variable, assign: Any) -> int:
        """A slot for ``array``, written by a step just before ``assign`` that reads the
        variable's array at that point of each replay."""
        at = next(n for n, step in enumerate(self.steps) if step is assign)
        slot = self.new_slot(array)
        self.steps.insert(at, WholeCall(_array_of, TupleOf((Const(variable),)), DictOf((), ()),
                                        Slot(slot), f"read {variable.name} before it is "
                                                    "assigned  [on each replay]"))
        return slot

    def draw(self, seed: int, draw: Callable[[], int]) -> None:
        """The step drew ``seed`` (a new object): each replay calls ``draw()`` here, in the
        same order among the step's other draws, and where ``seed`` itself went (a random
        kernel, a call kept whole, the outputs) the replay's draw goes."""
        slot = self.slots
        self.slots += 1
        self.seeds[id(seed)] = (seed, slot)
        self.seed_values.add(int(seed))
        self.steps.append(WholeCall(draw, TupleOf(()), DictOf((), ()), Slot(slot),
                                    f"s{slot} = mp.random.next_seed()  [on each replay]"))

    def drew(self, value: Any) -> bool:
        """Whether ``value`` is a seed this trace drew (that object, not an equal int)."""
        entry = self.seeds.get(id(value))
        return entry is not None and entry[0] is value

    def drawn_spec(self, value: Any) -> Node | None:
        """``SeedSlot(slot)`` for a seed this trace drew (that object), which a replay then
        follows there; None for anything else."""
        if not self.drew(value):
            return None
        self.consumed.add(id(value))
        return SeedSlot(self.seeds[id(value)][1])

    def seed_spec(self, value: Any) -> Node | None:
        """:meth:`drawn_spec`, where ``value`` is given to a random op or a call kept whole:
        a plain int equal to a drawn seed is refused there (see mpcore.core.trace_seeds)."""
        seed = self.drawn_spec(value)
        if seed is not None:
            return seed
        if (self.seed_values and isinstance(value, numbers.Integral)
                and not isinstance(value, bool) and int(value) in self.seed_values):
            self.refuse_seed(SEED_COPY)
        return None

    def refuse_seed(self, message: str) -> None:
        """A use of a seed that a replay could not follow. In a first trace, noted and refused
        at its end where the trace is kept: a first call that creates variables is never
        replayed, and may use a seed so (only the end of the call tells). In a later trace,
        refused here, before the step's later effects (one that creates variables is refused
        anyway)."""
        if not self.first:
            refuse(message)
        elif self.seed_refused is None:
            self.seed_refused = message

    def unfollowed_seeds(self) -> bool:
        """Whether a seed this trace drew went nowhere a replay follows it."""
        return bool(self.seeds.keys() - self.consumed)

    def bind(self, value: Any) -> Node:
        """Slots for what a call returned (arrays, or lists/tuples of them)."""
        if isinstance(value, (list, tuple)):
            items = tuple(self.bind(v) for v in value)
            return ListOf(items) if isinstance(value, list) else TupleOf(items)
        if value is None or type(value) in _PYTHON_VALUES:
            return Const(value)
        slot = self.slot_of.get(id(value))
        return Slot(slot if slot is not None else self.new_slot(value))

    # tensors in the arguments of a call kept whole --------------------------------------------
    def tensor_spec(self, value: Any) -> Node:
        if isinstance(value, numbers.Integral):
            seed = self.seed_spec(value)    # a drawn seed returned or given to a call kept whole
            if seed is not None:
                return seed
        if isinstance(value, Variable):
            return Const(value)
        if isinstance(value, Tensor):
            return TensorOf(self.spec(value._data), value._backend, value._dtype)
        if isinstance(value, dict):
            return dict_of({k: self.tensor_spec(v) for k, v in value.items()})
        if isinstance(value, (list, tuple)):
            items = tuple(self.tensor_spec(v) for v in value)
            return ListOf(items) if isinstance(value, list) else TupleOf(items)
        return Const(value)

    def tensor_bind(self, value: Any) -> Node:
        if isinstance(value, Variable):
            return Const(value)
        if isinstance(value, Tensor):
            return TensorOf(self.bind(value._data), value._backend, value._dtype)
        if isinstance(value, (list, tuple)):
            items = tuple(self.tensor_bind(v) for v in value)
            return ListOf(items) if isinstance(value, list) else TupleOf(items)
        return Const(value)

    def _distinct(self, out: Any, args: tuple[Any, ...], copy: Callable[..., Any]) -> Any:
        """``out``, with each result the trace already knows as another value copied. The
        trace tells a step's values apart by their arrays, and NumPy gives a 0-d boolean result
        as one of two shared objects (``np.True_``, ``np.False_``): two flags of a step would
        be one slot, read as the first at every replay (a wrong result, silently). A kernel
        that returns one of its own operands (a no-op cast) is not such a case."""
        if isinstance(out, (list, tuple)):
            items = [self._distinct(o, args, copy) for o in out]
            return items if type(out) is list else tuple(items) if type(out) is tuple else out
        if id(out) not in self.slot_of and id(out) not in self.variable_of:
            return out
        operands = {id(a) for a in args}
        operands.update(id(x) for a in args if isinstance(a, (list, tuple)) for x in a)
        return out if id(out) in operands else copy(out)

    def _writing(self, args: Sequence[Any]) -> None:
        """Tell the pre-pass's held effects which variables' arrays are among ``args`` (an
        in-place kernel's operands, lists of them included): it may write any of them."""
        for a in args:
            if isinstance(a, (list, tuple)):
                self._writing(a)
                continue
            variable = self.variable_of.get(id(a))
            if variable is not None and variable._data is a:
                self.held.writing(variable)

    # the kernel table while tracing -----------------------------------------------------------
    def table(self, backend: Any, table: dict[str, Callable[..., Any]]) -> dict[str, Any]:
        if self.whole_depth:
            return table
        view = self.tables.get(id(table))
        if view is None:
            copy = table.get("copy")
            view = {name: self._recording(backend, name, kernel, copy)
                    for name, kernel in table.items()}
            self.tables[id(table)] = view
        return view

    def _recording(self, backend: Any, name: str, kernel: Callable[..., Any],
                   copy: Callable[..., Any] | None) -> Any:
        seed_at = _SEEDED.get(name)
        in_place = name in IN_PLACE

        def call(*args: Any) -> Any:
            if in_place and self.held is not None and not self.whole_depth:
                # a pre-pass: the variables this kernel writes into, saved before it does
                # (also called by another kernel; inside a call kept whole, every variable
                # was saved as the call began)
                self._writing(args)
            if self.whole_depth or self.kernel_depth:
                # inside a call kept whole, or a kernel calling another through the table
                # (the CPU's 16-bit bias gradient sums with the matmul kernel): the outer call
                # is the step; recording the inner one too would replay it twice, the second
                # time on the trace's arrays
                return kernel(*args)
            specs = [self.spec(a) for a in args]
            if seed_at is not None and len(args) > seed_at:
                seed = self.seed_spec(args[seed_at])
                if seed is not None:
                    specs[seed_at] = seed
            # the kernel gets plain ints (Python computing with a drawn seed is refused; a
            # kernel's own work with it is the step's, and gets the replay's seed)
            args = tuple(int(a) if type(a) is DrawnSeed else a for a in args)
            self.kernel_depth += 1
            try:
                out = kernel(*args)
            finally:
                self.kernel_depth -= 1
            if copy is not None:
                out = self._distinct(out, args, copy)
            self.backends.setdefault(id(backend), backend)
            shown = [_FreshSeed(spec.index) if type(spec) is SeedSlot else a
                     for a, spec in zip(args, specs)]
            category = backend.categories().get(name)
            constant_call = not in_place and all(
                constant(s, self.constant_slots) for s in specs)
            outputs = self.bind(out)
            if constant_call:
                self.constant_slots.update(reads(outputs))
            self.steps.append(KernelCall(Op(name, _bound(backend, name, kernel, args)),
                                         tuple(specs), outputs,
                                         _describe(name, shown, out, category),
                                         _dtype_name(out), category, constant_call))
            return out

        return call


def _array_of(variable: Variable) -> Any:
    return variable._data


def _bound(backend: Any, name: str, kernel: Callable[..., Any],
           args: Sequence[Any]) -> Callable[..., Any]:
    """What a replay calls for this call of ``kernel``: what the backend binds it to for
    operands like these (``Backend.bind_kernel``), or the kernel itself. A bind that fails
    is reported and the kernel replays unbound."""
    binder = getattr(backend, "bind_kernel", None)
    if binder is None:
        return kernel
    try:
        bound = binder(name, kernel, tuple(args))
    except Exception as exc:   # a plugin's bug: the step still replays, unbound
        warnings.warn(f"backend {getattr(backend, 'name', backend)!r} could not bind kernel "
                      f"{name!r} for a traced step ({type(exc).__name__}: {exc}); it replays "
                      "unbound", RuntimeWarning, stacklevel=_user_frames.stacklevel())
        return kernel
    return kernel if bound is None else bound


def _dtype_name(out: Any) -> str:
    first = out[0] if isinstance(out, (list, tuple)) and out else out
    dtype = getattr(first, "dtype", None)
    return "" if dtype is None else str(getattr(dtype, "name", dtype))


class _FreshSeed:
    """Shown in a graph line where a replay reads the seed its draw step drew (the trace's
    value would mislead)."""

    def __init__(self, slot: int) -> None:
        self.slot = slot


def _describe(name: str, args: Sequence[Any], out: Any, category: Any) -> str:
    def of(x: Any) -> str:
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is not None and dtype is not None:
            return f"{dtype}{list(shape)}"
        if isinstance(x, _FreshSeed):
            return f"<seed s{x.slot}>"
        if isinstance(x, list):
            return "[" + ", ".join(of(v) for v in x) + "]"
        if isinstance(x, tuple):
            return "(" + ", ".join(of(v) for v in x) + ("," if len(x) == 1 else "") + ")"
        return repr(x) if isinstance(x, (int, float, bool, str, type(None))) else type(x).__name__

    cat = category.value if category is not None else "-"
    return f"{name}({', '.join(of(a) for a in args)}) -> {of(out)}  [{cat}]"
