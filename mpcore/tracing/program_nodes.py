"""The nodes of a recorded program (:mod:`mpcore.tracing.program`) and the one walker every
pass uses.

A step's arguments are trees of frozen nodes. The leaves say where a value comes from at each
replay: :class:`Const` a value fixed at the trace, :class:`Slot` the array a step before made
(or an input), :class:`VariableRead` a variable's array at that moment, :class:`SeedSlot` the
seed a draw step of each replay drew, and :class:`WeakConst` / :class:`WeakVariableRead` a
constant or variable that was an argument of the traced call, held weakly. The composites
build a value around their children: :class:`TensorOf` a tensor around an array,
:class:`ListOf`, :class:`TupleOf` and :class:`DictOf` the containers.

The steps are :class:`KernelCall` (a backend kernel), :class:`WholeCall` (a call kept whole,
run eagerly at each replay) and :class:`Assign` (a variable assignment). Every node is frozen:
a pass that changes a step builds a new one (``dataclasses.replace``, :meth:`with_operands`).

The walker: :func:`walk` (every node, in order), :func:`leaves`, :func:`reads` (the slots a
tree reads), :func:`fold` (a tree bottom-up: :func:`evaluate`, :func:`mapped`, the
``ProgramWriter``'s source), :func:`unfold` (a value taken apart along a tree: :func:`bind`),
and on steps :func:`step_reads` / :func:`step_writes`. Nothing else looks inside a tree.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from mpcore.core.categories import Category
from mpcore.core.tensor import Tensor, Variable

T = TypeVar("T")
#: Names a writer gives the objects its source refers to: ``name(prefix, obj)``.
Namer = Callable[[str, Any], str]


class Node:
    """An argument of a step (or the program's output): a leaf or a composite."""

    __slots__ = ()


class Leaf(Node):
    """A node that holds no other: where one value comes from at each replay."""

    __slots__ = ()

    def read(self, env: dict[int, Any]) -> Any:
        """The value, the slots' arrays in ``env``."""
        raise NotImplementedError

    def source(self, name: Namer) -> str:
        """The Python expression ``ProgramWriter`` writes for it (slots are locals ``s<i>``)."""
        raise NotImplementedError


class Composite(Node):
    """A node built around its children."""

    __slots__ = ()

    def children(self) -> tuple[Node, ...]:
        raise NotImplementedError

    def with_children(self, children: tuple[Node, ...]) -> Composite:
        raise NotImplementedError

    def build(self, values: list[Any]) -> Any:
        """The value, its children's values given."""
        raise NotImplementedError

    def parts(self, value: Any) -> Sequence[Any]:
        """A value of this shape taken apart: one part per child."""
        raise NotImplementedError

    def source(self, parts: list[str], name: Namer) -> str:
        """The expression built from its children's expressions."""
        raise NotImplementedError

    def part_sources(self, expr: str) -> list[str]:
        """The expressions of the parts of the value of ``expr``."""
        raise NotImplementedError


# --- leaves ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, eq=False)
class Const(Leaf):
    """A value fixed at the trace: a Python value, an object, or an array captured from
    outside the step (read as it is at each replay)."""

    value: Any

    # as a tuple compares: by identity first, then ``==`` (an array is equal to itself)
    def __eq__(self, other: object) -> bool:
        return type(other) is Const and (self.value,) == (other.value,)

    def __hash__(self) -> int:
        return hash((Const, self.value))

    def read(self, env: dict[int, Any]) -> Any:
        return self.value

    def source(self, name: Namer) -> str:
        value = self.value
        if value is None or isinstance(value, bool) or type(value) in (int, str):
            return repr(value)
        return name("c", value)


@dataclass(frozen=True, slots=True)
class _SlotRead(Leaf):
    index: int

    def read(self, env: dict[int, Any]) -> Any:
        return env[self.index]

    def source(self, name: Namer) -> str:
        return f"s{self.index}"


@dataclass(frozen=True, slots=True)
class Slot(_SlotRead):
    """The array in slot ``index``: an input of the step, or what a step before made."""


@dataclass(frozen=True, slots=True)
class SeedSlot(_SlotRead):
    """The seed in slot ``index``, drawn by a step of each replay where the trace drew it."""


@dataclass(frozen=True, slots=True, eq=False)
class VariableRead(Leaf):
    """The variable's array at that point of each replay."""

    variable: Variable

    def __eq__(self, other: object) -> bool:
        return type(other) is VariableRead and self.variable is other.variable

    def __hash__(self) -> int:
        return id(self.variable)

    def read(self, env: dict[int, Any]) -> Any:
        return self.variable._data

    def source(self, name: Namer) -> str:
        return f"{name('v', self.variable)}._data"


@dataclass(frozen=True, slots=True)
class WeakConst(Leaf):
    """A constant that was an argument of the traced call, held weakly
    (:func:`mpcore.tracing.program.weakened`)."""

    ref: weakref.ref[Any]

    def read(self, env: dict[int, Any]) -> Any:
        return self.ref()

    def source(self, name: Namer) -> str:
        return f"{name('w', self.ref)}()"


@dataclass(frozen=True, slots=True)
class WeakVariableRead(Leaf):
    """A variable that was an argument of the traced call, held weakly: its array then."""

    ref: weakref.ref[Variable]

    def read(self, env: dict[int, Any]) -> Any:
        return self.ref()._data  # type: ignore[union-attr]

    def source(self, name: Namer) -> str:
        return f"{name('w', self.ref)}()._data"


# --- composites --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TensorOf(Composite):
    """A tensor of ``backend`` and ``dtype`` around the array ``inner`` stands for."""

    inner: Node
    backend: Any
    dtype: str

    def children(self) -> tuple[Node, ...]:
        return (self.inner,)

    def with_children(self, children: tuple[Node, ...]) -> TensorOf:
        return replace(self, inner=children[0])

    def build(self, values: list[Any]) -> Any:
        return Tensor(values[0], self.backend, self.dtype)

    def parts(self, value: Any) -> Sequence[Any]:
        return (value._data,)

    def source(self, parts: list[str], name: Namer) -> str:
        return f"_Tensor({parts[0]}, {name('b', self.backend)}, {self.dtype!r})"

    def part_sources(self, expr: str) -> list[str]:
        return [f"{expr}._data"]


@dataclass(frozen=True, slots=True)
class _Items(Composite):
    """A list or a tuple of its items' values."""

    items: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.items

    def with_children(self, children: tuple[Node, ...]) -> _Items:
        return type(self)(children)

    def parts(self, value: Any) -> Sequence[Any]:
        return value  # type: ignore[no-any-return]

    def part_sources(self, expr: str) -> list[str]:
        return [f"{expr}[{j}]" for j in range(len(self.items))]


@dataclass(frozen=True, slots=True)
class ListOf(_Items):
    """A list of its items' values."""

    def build(self, values: list[Any]) -> Any:
        return values

    def source(self, parts: list[str], name: Namer) -> str:
        return f"[{', '.join(parts)}]"


@dataclass(frozen=True, slots=True)
class TupleOf(_Items):
    """A tuple of its items' values."""

    def build(self, values: list[Any]) -> Any:
        return tuple(values)

    def source(self, parts: list[str], name: Namer) -> str:
        return f"({', '.join(parts)}{',' if parts else ''})"


@dataclass(frozen=True, slots=True, eq=False)
class DictOf(Composite):
    """A dict of ``keys`` to its items' values (in that order)."""

    keys: tuple[Any, ...]
    items: tuple[Node, ...]

    def __eq__(self, other: object) -> bool:
        return (type(other) is DictOf and self.keys == other.keys
                and self.items == other.items)

    def __hash__(self) -> int:
        return hash((DictOf, self.keys, self.items))

    def children(self) -> tuple[Node, ...]:
        return self.items

    def with_children(self, children: tuple[Node, ...]) -> DictOf:
        return DictOf(self.keys, children)

    def build(self, values: list[Any]) -> Any:
        return dict(zip(self.keys, values))

    def parts(self, value: Any) -> Sequence[Any]:
        return [value[k] for k in self.keys]

    def source(self, parts: list[str], name: Namer) -> str:
        return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(self.keys, parts)) + "}"

    def part_sources(self, expr: str) -> list[str]:
        return [f"{expr}[{k!r}]" for k in self.keys]


#: The value a step returns that nothing reads (and an absent argument).
NONE = Const(None)


def dict_of(mapping: dict[Any, Node]) -> DictOf:
    return DictOf(tuple(mapping), tuple(mapping.values()))


# --- the walker ----------------------------------------------------------------------------
def walk(node: Node) -> Iterator[Node]:
    """Every node of the tree, ``node`` first, then its children's trees in order."""
    stack = [node]
    while stack:
        top = stack.pop()
        yield top
        if isinstance(top, Composite):
            stack.extend(reversed(top.children()))


def leaves(node: Node) -> list[Leaf]:
    """The leaves of the tree, in order (through tensors, lists, tuples and dicts)."""
    return [n for n in walk(node) if isinstance(n, Leaf)]


def reads(node: Node) -> list[int]:
    """The slots the tree reads (arrays and drawn seeds)."""
    return [n.index for n in walk(node) if type(n) is Slot or type(n) is SeedSlot]


def fold(node: Node, leaf: Callable[[Leaf], T],
         combine: Callable[[Composite, list[T]], T]) -> T:
    """The tree folded bottom-up: ``leaf(l)`` for each leaf, ``combine(c, folded children)``
    for each composite."""
    if isinstance(node, Composite):
        return combine(node, [fold(c, leaf, combine) for c in node.children()])
    return leaf(node)  # type: ignore[arg-type]


def unfold(node: Node, value: T, split: Callable[[Composite, T], Sequence[T]]
           ) -> list[tuple[Leaf, T]]:
    """``value`` taken apart along the tree: each leaf with its part (``split(c, v)``: the
    parts of ``v`` for the children of ``c``)."""
    if isinstance(node, Composite):
        return [pair for child, part in zip(node.children(), split(node, value))
                for pair in unfold(child, part, split)]
    return [(node, value)]  # type: ignore[list-item]


def mapped(node: Node, fn: Callable[[Leaf], Node]) -> Node:
    """The tree with ``fn(leaf)`` in place of each leaf (the same node where nothing in it
    changed)."""
    def combine(c: Composite, children: list[Node]) -> Node:
        return c if _same(children, c.children()) else c.with_children(tuple(children))

    return fold(node, fn, combine)


def _same(new: Sequence[Any], old: Sequence[Any]) -> bool:
    return all(a is b for a, b in zip(new, old))


def evaluate(node: Node, env: dict[int, Any]) -> Any:
    """The value the tree stands for, the slots' arrays in ``env`` (what a line written by
    ``ProgramWriter`` computes; for backends that run a program step by step)."""
    if type(node) is Slot:
        return env[node.index]
    return fold(node, lambda leaf: leaf.read(env), _build)


def _build(node: Composite, values: list[Any]) -> Any:
    return node.build(values)


def _parts(node: Composite, value: Any) -> Sequence[Any]:
    return node.parts(value)


def bind(node: Node, value: Any, env: dict[int, Any]) -> None:
    """Put what a call returned into the slots of the tree (arrays, tensors, lists of them)."""
    if type(node) is Slot:
        env[node.index] = value
        return
    for leaf, part in unfold(node, value, _parts):
        if type(leaf) is Slot:
            env[leaf.index] = part


def constant(node: Node, known: set[int] | dict[int, Any]) -> bool:
    """Whether the tree's value is the same at every replay: Python values (never an array
    captured from outside the step: it may be the caller's, changed between calls) and the
    slots in ``known``, in lists and tuples."""
    for n in walk(node):
        kind = type(n)
        if kind is Const:
            value = n.value  # type: ignore[attr-defined]
            if not (value is None or isinstance(value, (bool, int, float, str, bytes))):
                return False
        elif kind is Slot:
            if n.index not in known:  # type: ignore[attr-defined]
                return False
        elif kind is not ListOf and kind is not TupleOf:
            return False                # a variable, a fresh seed, a tensor, a dict
    return True


# --- steps -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Op:
    """A kernel: its name in ``Backend.kernels()`` and what a replay calls (maybe bound)."""

    name: str
    kernel: Callable[..., Any]


@dataclass(frozen=True, eq=False)
class KernelCall:
    """A backend kernel called on ``inputs``, its result put where ``outputs`` says (slots,
    or a list/tuple of them). ``dtype``: its (first) result's; ``category``: the op's mixed
    precision category on the backend, where it has one; ``constant``: every operand is a
    Python value or the result of a constant call, and the kernel writes no operand, so
    :func:`mpcore.tracing.program.fold_constants` runs it once. ``text``: its line of
    ``Function.graph``."""

    op: Op
    inputs: tuple[Node, ...]
    outputs: Node
    text: str
    dtype: str = ""
    category: Category | None = None
    constant: bool = False

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def kernel(self) -> Callable[..., Any]:
        return self.op.kernel

    @property
    def operands(self) -> tuple[Node, ...]:
        """The trees the step reads."""
        return self.inputs

    def with_operands(self, fn: Callable[[Node], Node]) -> KernelCall:
        """The step reading ``fn(tree)`` in place of each tree it reads (itself where that
        changes none)."""
        inputs = tuple(fn(a) for a in self.inputs)
        return self if _same(inputs, self.inputs) else replace(self, inputs=inputs)

    def run(self, env: dict[int, Any]) -> None:
        bind(self.outputs, self.op.kernel(*[evaluate(a, env) for a in self.inputs]), env)


@dataclass(frozen=True, eq=False)
class WholeCall:
    """A call kept whole: ``fn(*args, **kwargs)`` run eagerly at each replay (an optimizer
    update, a loss-scaling step, a seed's draw)."""

    fn: Callable[..., Any]
    args: TupleOf
    kwargs: DictOf
    outputs: Node
    text: str

    @property
    def operands(self) -> tuple[Node, ...]:
        return (self.args, self.kwargs)

    def with_operands(self, fn: Callable[[Node], Node]) -> WholeCall:
        args, kwargs = fn(self.args), fn(self.kwargs)
        if args is self.args and kwargs is self.kwargs:
            return self
        return replace(self, args=args, kwargs=kwargs)

    def run(self, env: dict[int, Any]) -> None:
        bind(self.outputs, self.fn(*evaluate(self.args, env), **evaluate(self.kwargs, env)),
             env)


@dataclass(frozen=True, eq=False)
class Assign:
    """``variable.assign(value)`` (``variable`` weak where it is an argument of the call)."""

    variable: Variable | weakref.ref[Variable]
    value: Node
    text: str

    def target(self) -> Variable:
        """The variable assigned (a replay runs only while the call's arguments live)."""
        variable = self.variable
        return variable if isinstance(variable, Variable) else variable()  # type: ignore[return-value]

    @property
    def operands(self) -> tuple[Node, ...]:
        return (self.value,)

    def with_operands(self, fn: Callable[[Node], Node]) -> Assign:
        value = fn(self.value)
        return self if value is self.value else replace(self, value=value)

    def run(self, env: dict[int, Any]) -> None:
        var = self.target()
        var.assign(Tensor(evaluate(self.value, env), var._backend, var._dtype))


Step = KernelCall | WholeCall | Assign


def step_reads(step: Step) -> list[int]:
    """The slots a step reads (its arguments, or an assignment's value)."""
    return [i for a in step.operands for i in reads(a)]


def step_writes(step: Step) -> list[int]:
    """The slots a step writes (an assignment writes a variable, no slot)."""
    return [] if type(step) is Assign else reads(step.outputs)  # type: ignore[union-attr]
