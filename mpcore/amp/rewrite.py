"""``enable_mixed_precision_graph_rewrite``: TF's automatic mixed precision graph rewrite on
mpcore's traced steps.

A float32 model's traced step (``mp.function``, a model's ``fit``/``evaluate``/``predict``
steps) is rewritten per signature, in its first call (issue 34: a step prepared before it runs):

1. a pre-pass traces in float32, as without the rewrite, while the op graph is recorded
   (each op's name, the ops its inputs came from, its output dtype: what the dispatch's
   ``finish`` sees), and each dtype decision of the dispatch is matched to the op it made; the
   painting pass (:mod:`mpcore.amp.painting`) colours the graph. What the pre-pass changed
   (variables, seeds, the Python state of calls kept whole) is put back
   (:mod:`mpcore.tracing.effects`) and its program is not kept;
2. the same call traces again, and each op's dtype decision, identified by its order in
   the deterministic trace and checked against the recorded op name, is its painted dtype:
   16-bit ops cast their float32 inputs (variables included) to 16 bits and float32 ops cast
   16-bit inputs back, so casts appear only at colour boundaries. That program is what later
   calls replay, and the first call returns its result. Ops inside calls kept whole (the
   optimizer's update, loss scaling) are not part of the graph and stay float32; the loss is
   a deny op, and the gradients of float32 variables come back in float32 through the casts'
   gradients. (Where the pre-pass's Python state cannot be put back, it stands as a float32
   step and the next call traces painted.)

``print(fn.graph)`` lists the kernel calls and then every recorded op with its painted dtype
and the rule that decided it.
"""

from __future__ import annotations

import bisect
import logging
import threading
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mpcore.amp.lists import AutoMixedPrecisionLists, current_lists
from mpcore.amp.painting import OpNode, Painting, label, paint
from mpcore.amp.target import check_dtype, device_dtype
from mpcore.core import user_frames as _user_frames
from mpcore.core.tensor import Variable
from mpcore.mixed_precision import amp_hooks as hooks
from mpcore.mixed_precision import trace_hooks
from mpcore.mixed_precision.policy import global_policy, policy_origin
from mpcore.ops import dispatch as _dispatch
from mpcore.optimizers import Optimizer
from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer
from mpcore.plugins import registry
from mpcore.tracing.function import TraceError, in_kept_whole, in_traced_step
from mpcore.tracing.program import KernelCall, WholeCall, step_reads, step_writes

logger = logging.getLogger("mpcore")


@dataclass(frozen=True)
class RewriteConfig:
    """What the enabled rewrite uses: the lists and the dtype (None: the device's fast one)."""

    lists: AutoMixedPrecisionLists
    dtype: str | None

    def key(self) -> tuple[Any, ...]:
        return ("rewrite", self.dtype, self.lists.key())

    def describe(self) -> str:
        return f"dtype {self.dtype or 'of the device'}, {self.lists!r}"


@dataclass(frozen=True)
class Plan:
    """A recorded and painted op graph of one signature of a traced function."""

    nodes: tuple[OpNode, ...]
    painting: Painting
    decisions: tuple[tuple[str, int | None], ...]   # per dtype decision: its op, its node
    dtype: str


class _Session:
    """The rewrite of one trace: recording the op graph (no plan yet) or applying a plan."""

    def __init__(self, store: dict[Any, Plan], signature: Any, config: RewriteConfig,
                 backend: Any) -> None:
        self.store, self.signature, self.config, self.backend = store, signature, config, backend
        self.plan = store.get(signature)
        self.recorder: Any = None
        #: per dtype decision of the float32 trace: its op, and how many kernel calls the
        #: trace had made before it (its kernel is the first of its name from there on)
        self.decisions: list[tuple[str, int]] = []
        self.count = 0
        #: the painted trace lost its way and was refused (jit_compile="auto"): float32 on
        self.lost = False

    @property
    def pre_pass(self) -> bool:
        """Whether this trace only records the float32 op graph: its effects are put back
        and the painted trace follows in the same call (:mod:`mpcore.tracing.effects`)."""
        return self.plan is None

    def begin(self, recorder: Any) -> None:
        self.recorder = recorder
        hooks.begin_session(self)
        if self.plan is not None:       # the painted trace: one cast per tensor and dtype
            self.casts: dict[tuple[int, str], tuple[Any, Any]] = {}
            _dispatch.cast_hook = self.share_cast

    def end(self) -> None:
        if self.plan is not None:
            _dispatch.cast_hook = None
            self.casts = {}
        hooks.end_session()

    def share_cast(self, x: Any, dtype: str) -> Any:
        """``x`` cast to ``dtype``, the same cast for every op of the painted graph that
        reads it so (the logits read by softmax and by the loss: one cast, not two). Calls
        kept whole cast for themselves: a replay runs them again, eagerly, and could not
        see a cast of the graph. ``x`` is held so that its id is not reused in the trace."""
        if in_kept_whole() or isinstance(x, Variable):   # a variable: assigned in the step
            return _dispatch.cast(x, dtype)
        key = (id(x), dtype)
        hit = self.casts.get(key)
        if hit is None or hit[0] is not x:
            hit = self.casts[key] = (x, _dispatch.cast(x, dtype))
        return hit[1]

    def decide(self, op: str, backend: Any, dtype: str, float_only: bool) -> str | None:
        if in_kept_whole() or self.lost:
            return None
        if self.plan is None:
            self.decisions.append((op, len(self.recorder.steps)))
            return None
        k = self.count
        self.count += 1
        decisions = self.plan.decisions
        if k >= len(decisions) or decisions[k][0] != op:
            return self._lost(k, op, decisions[k][0] if k < len(decisions) else
                              "the end of the trace")
        node = decisions[k][1]
        if node is None or dtype == "float64" or (dtype not in _FLOATING and not float_only):
            return None                 # not a float32 op of the graph: the category rule
        return self.plan.dtype if self.plan.painting.low[node] else "float32"

    def _lost(self, k: int, op: str, found: str) -> None:
        """The painted trace took another path than the float32 one: most often an op (or
        a layer, a loss) that chooses its code path by its input's dtype, given a 16-bit
        input by the painting. Under ``jit_compile="auto"`` the step falls back to eager
        float32 steps, with the reason; otherwise it is a TraceError."""
        why = (f"the mixed precision graph rewrite could not follow this step: its painted "
               f"trace ran {op!r} as dtype decision {k} where the float32 trace had {found!r} "
               "(an op whose code path depends on its input's dtype, given a 16-bit input by "
               "the painting, or a step that does not run the same ops on every call). Take "
               "the op off the allowlist, or disable the rewrite for this step")
        if self.recorder.fallback:
            self.recorder.refused = self.recorder.refused or why
            self.lost = True
            return None
        raise TraceError(why)

    # the end of a trace ---------------------------------------------------------------------
    def keep(self) -> bool:
        if self.plan is not None:
            return True
        nodes, at_step = op_graph(self.recorder.steps)
        overrides = dict(self.backend.category_overrides)
        dtype = self.config.dtype or device_dtype(self.backend)
        self._check_update(dtype)
        self.store[self.signature] = Plan(tuple(nodes),
                                          paint(nodes, self.config.lists, overrides),
                                          match_decisions(self.decisions, nodes, at_step),
                                          dtype)
        return False

    def _check_update(self, dtype: str) -> None:
        """A float16 step whose update is a plain optimizer's trains without loss scaling
        (small gradients flush to zero): TF wraps the optimizer for the user; here the user
        must compile with the one enable_mixed_precision_graph_rewrite returned. Said once."""
        global _unscaled_warned
        if dtype != "float16" or _unscaled_warned:
            return
        # a plain update kept whole, or recorded kernel by kernel (then its per-step part is
        # a call of the optimizer's bound finish_recorded_update)
        updates = {getattr(step.fn, "__wrapped__", step.fn) for step in self.recorder.steps
                   if type(step) is WholeCall}
        # a LossScaleOptimizer's step recorded kernel by kernel: its unscaling kernel
        scaled = _SCALED_UPDATE in updates or any(
            type(step) is KernelCall and step.name in _SCALING_KERNELS
            for step in self.recorder.steps)
        if updates & _PLAIN_UPDATES and not scaled:
            _unscaled_warned = True
            warnings.warn(
                "the mixed precision graph rewrite runs this step in float16, but its optimizer "
                "is not a LossScaleOptimizer: it trains without loss scaling, and small "
                "gradients underflow to zero. Compile with the optimizer that "
                "enable_mixed_precision_graph_rewrite returned", UserWarning,
                stacklevel=_user_frames.stacklevel())

    def describe(self) -> list[str]:
        plan = self.plan
        if plan is None:        # this trace recorded the op graph; the store holds its plan
            n = len(self.store[self.signature].nodes)
            return ["", f"mixed precision graph rewrite: this float32 trace recorded the op "
                    f"graph ({n} ops); the next call with this signature traces it painted"]
        ran, inserted = align(plan.nodes, op_graph(self.recorder.steps)[0])
        low = sum(plan.painting.low)
        lines = ["", f"mixed precision graph rewrite ({plan.dtype}): {low} of {len(plan.nodes)} "
                 f"ops painted {plan.dtype}, {inserted} casts inserted at the colour boundaries"]
        for i, node in enumerate(plan.nodes):
            painted = plan.dtype if plan.painting.low[i] else node.dtype
            ins = ", ".join(label(plan.nodes, j) for j in node.inputs)
            # the column is the dtype the op ran in; an op that makes no dtype decision of its
            # own (a fill, a fused kernel's part) takes its dtype from elsewhere
            note = ("" if ran[i] in (None, painted) else
                    f"; painted {painted}, but it makes no dtype decision of its own: ran in "
                    f"{ran[i]}")
            lines.append(f"  {label(plan.nodes, i)}({ins}) -> {ran[i] or painted}  "
                         f"[{plan.painting.reasons[i]}{note}]")
        return lines

    def ran(self) -> list[str | None]:
        """The dtype each node of the plan produced in the painted trace."""
        assert self.plan is not None
        return align(self.plan.nodes, op_graph(self.recorder.steps)[0])[0]


def align(planned: Sequence[OpNode], painted: Sequence[OpNode]) -> tuple[list[str | None], int]:
    """The dtype each planned node produced in the painted trace, and how many casts were
    inserted. The painted trace's kernel calls are the float32 trace's with casts inserted,
    and with the kernels a backend's kernel calls for 16-bit operands only (skipped here)."""
    ran: list[str | None] = [None] * len(planned)
    i = inserted = 0
    for node in painted:
        if i < len(planned) and node.op == planned[i].op:
            ran[i] = node.dtype
            i += 1
        elif node.op == "cast":
            inserted += 1
    return ran, inserted


def op_graph(steps: list[Any]) -> tuple[list[OpNode], list[int]]:
    """The op graph of a recorded program: one node per kernel call (calls kept whole are not
    part of it), linked by the slots one call writes and another reads; and the step index
    of each node."""
    nodes: list[OpNode] = []
    at_step: list[int] = []
    producer: dict[int, int] = {}
    for n, step in enumerate(steps):
        if type(step) is not KernelCall:
            continue
        i = len(nodes)
        ins = tuple(dict.fromkeys(producer[slot] for slot in step_reads(step)
                                  if slot in producer))
        nodes.append(OpNode(step.name, ins, step.dtype or "float32", f"{step.name}#{i}"))
        at_step.append(n)
        for slot in step_writes(step):
            producer[slot] = i
    return nodes, at_step


def match_decisions(decisions: list[tuple[str, int]], nodes: list[OpNode],
                    at_step: list[int]) -> tuple[tuple[str, int | None], ...]:
    """Each dtype decision's node: the first kernel call of the decision's op made after it
    and not taken by a later decision (so a composite op whose own kernel never runs, only
    its parts', gets none, and its parts get theirs)."""
    by_name: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        by_name.setdefault(node.op, []).append(i)
    taken: set[int] = set()
    matched: list[int | None] = [None] * len(decisions)
    for k in range(len(decisions) - 1, -1, -1):
        op, position = decisions[k]
        candidates = by_name.get(op, [])
        j = bisect.bisect_left([at_step[i] for i in candidates], position)
        while j < len(candidates) and candidates[j] in taken:
            j += 1
        if j < len(candidates):
            matched[k] = candidates[j]
            taken.add(candidates[j])
    return tuple((op, node) for (op, _), node in zip(decisions, matched))


_FLOATING = frozenset({"float16", "bfloat16", "float32"})

_plans: weakref.WeakKeyDictionary[Any, dict[Any, Plan]] = weakref.WeakKeyDictionary()
_state_lock = threading.Lock()


def _trace_hook(fn: Any, signature: Any) -> _Session | None:
    config = hooks.rewrite
    if config is None:
        return None
    with _state_lock:
        store = _plans.setdefault(fn, {})
    return _Session(store, signature, config, registry.get_backend())


# --- the public functions -----------------------------------------------------------------------
class _RewrittenOptimizer(LossScaleOptimizer):
    """The LossScaleOptimizer the rewrite returns: it says once that an eager step is not
    rewritten (as TF does)."""

    def apply_gradients(self, grads_and_vars: Any) -> bool:  # type: ignore[override]
        if hooks.rewrite is not None and not in_traced_step():
            _log_eager_once()
        return super().apply_gradients(grads_and_vars)


_eager_logged = False
_unscaled_warned = False
#: the update methods a step's kept-whole calls name (see _Session._check_update)
_PLAIN_UPDATES = {Optimizer.apply_gradients.__wrapped__,        # type: ignore[attr-defined]
                  Optimizer.finish_recorded_update}
_SCALED_UPDATE = LossScaleOptimizer.apply_gradients.__wrapped__  # type: ignore[attr-defined]
_SCALING_KERNELS = frozenset({"unscale_and_check", "unscale_and_check_by",
                              "loss_scale_update"})


def _log_eager_once() -> None:
    global _eager_logged
    if not _eager_logged:
        _eager_logged = True
        logger.warning("The mixed precision graph rewrite only applies to traced steps "
                       "(mp.function, and Model.fit with jit_compile 'auto' or True); this "
                       "eager step runs in float32")


def enable_mixed_precision_graph_rewrite(opt: Optimizer, loss_scale: Any = "dynamic", *,
                                         dtype: Any = None,
                                         lists: AutoMixedPrecisionLists | None = None
                                         ) -> LossScaleOptimizer:
    """Rewrite traced steps of float32 models to mixed precision, as TF's
    ``tf.train.experimental.enable_mixed_precision_graph_rewrite``; returns ``opt`` wrapped in
    a LossScaleOptimizer with ``loss_scale`` ("dynamic", a number or a LossScale).
    ``dtype``: float16 or bfloat16 (default: the current device's fast one, by its verdict);
    ``lists``: the op lists (default: mpcore's, edited by ``MPCORE_AMP_*``).

    Compile with the optimizer returned: a float16 step with another is warned about once (it
    trains without loss scaling). For float32 models only: a mixed policy here (global or a
    ``policy_scope``), an open ``autocast`` block, or a layer with its own mixed policy in a
    traced step is an error. Enabling it again with another dtype or lists warns: the new
    ones apply to every traced step, also those compiled with the first optimizer."""
    if not isinstance(opt, Optimizer):
        raise TypeError("enable_mixed_precision_graph_rewrite: opt must be an "
                        f"mp.optimizers.Optimizer, got {type(opt).__name__} {opt!r}")
    if isinstance(opt, LossScaleOptimizer):
        raise ValueError("enable_mixed_precision_graph_rewrite: opt is already a "
                         "LossScaleOptimizer; pass its inner_optimizer")
    if loss_scale is None:
        raise ValueError("enable_mixed_precision_graph_rewrite needs a loss scale: 'dynamic', "
                         "a number or a LossScale")
    policy = global_policy()
    if policy.name != "float32":
        scoped = policy_origin() != "the global policy"
        raise ValueError(
            "enable_mixed_precision_graph_rewrite rewrites float32 models, but the policy "
            f"here is {policy.name!r} ({policy_origin()}): the policy and the rewrite would "
            "both change dtypes. Use one: "
            f"{'leave the policy_scope' if scoped else 'mp.set_global_policy(None)'} first, "
            "or keep the policy without the rewrite")
    if hooks.autocast_on():
        raise ValueError("enable_mixed_precision_graph_rewrite inside an autocast block: both "
                         "change dtypes; use one of them")
    config = RewriteConfig(current_lists(lists), None if dtype is None else check_dtype(dtype))
    wrapped = _RewrittenOptimizer(opt, loss_scale)
    if hooks.rewrite is not None and hooks.rewrite != config:
        warnings.warn(
            f"enable_mixed_precision_graph_rewrite: the rewrite was already enabled "
            f"({hooks.rewrite.describe()}); this call replaces them with {config.describe()} "
            "for every traced step, also those of models compiled with the first call's "
            "optimizer. Call disable_mixed_precision_graph_rewrite() first to make that "
            "explicit", UserWarning, stacklevel=2)
    hooks.rewrite = config
    trace_hooks.trace_hook = _trace_hook
    trace_hooks.eager_step_hook = _log_eager_once
    return wrapped


def disable_mixed_precision_graph_rewrite() -> None:
    """Stop rewriting (a no-op when not enabled): traced steps replay their float32 programs,
    or trace one where they have none (the rewrite's programs stay cached under its
    signature, for when it is enabled again with the same lists and dtype)."""
    hooks.rewrite = None
    trace_hooks.trace_hook = None
    trace_hooks.eager_step_hook = None


def is_enabled() -> bool:
    return hooks.rewrite is not None
