"""Traced steps on OpenCL (:mod:`mpcore_opencl.replay`): a replay issues the recorded launches
directly and equals eager execution bit for bit (float32, mixed_float16 with loss scaling,
mixed_bfloat16), on the default OpenCL device and, in a subprocess, on every other one here
(Intel's CPU runtime where it is installed); kernel calls it cannot freeze safely (a fresh seed,
an upload) stay on the generic path and stay correct."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    REPO_ROOT,
    backend_problem,
    custom_training_step,
    mlp_and_optimizer,
    spy_on_compile_program,
)

import mpcore as mp
from mpcore.plugins import registry

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
RNG = np.random.default_rng(17)
XS = [RNG.random((32, 20), dtype=np.float32) for _ in range(5)]
YS = [RNG.integers(0, 4, 32) for _ in range(5)]
CHILD = "MPCORE_TEST_OPENCL_TRACED_CHILD"

pytestmark = pytest.mark.skipif(backend_problem("opencl") is not None,
                                reason=str(backend_problem("opencl")))


@pytest.fixture
def cl(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The opencl backend, current; its compile_program's runners are collected in
    ``cl.runners``."""
    previous, note = registry._current, registry._detection_note
    be = mp.set_backend("opencl")
    be.runners = spy_on_compile_program(monkeypatch, be)
    yield be
    del be.runners
    registry._current, registry._detection_note = previous, note


def build(policy: str) -> tuple[mp.Model, Any]:
    return mlp_and_optimizer(policy, hidden=2)


make_step = custom_training_step


class LaunchCount:
    """Counts the launches that go through the runtime (the generic path's)."""

    def __init__(self, rt: Any) -> None:
        self.rt, self.n = rt, 0

    def __enter__(self) -> LaunchCount:
        launch, launch_nd = self.rt.launch, self.rt.launch_nd

        def counted(fn: Any) -> Any:
            def call(*args: Any) -> Any:
                self.n += 1
                return fn(*args)
            return call

        self.rt.launch, self.rt.launch_nd = counted(launch), counted(launch_nd)
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.rt.launch, self.rt.launch_nd


def train(policy: str, traced: bool, rt: Any = None) -> tuple[list[float], list[Any], Any,
                                                              list[int]]:
    model, opt = build(policy)
    step = make_step(model, opt)
    if traced:
        step = mp.function(step)
    losses, counts = [], []
    for x, y in zip(XS, YS):
        xt, yt = mp.constant(x), mp.constant(y)
        if rt is None:
            loss = step(xt, yt)
        else:
            with LaunchCount(rt) as count:
                loss = step(xt, yt)
            counts.append(count.n)
        losses.append(float(np.asarray(loss)))
    return losses, model.get_weights(), opt, counts


@pytest.mark.parametrize("policy", POLICIES)
def test_replayed_launches_equal_eager_bit_for_bit(cl: Any, policy: str) -> None:
    eager_losses, eager_weights, eager_opt, _ = train(policy, traced=False)
    losses, weights, opt, counts = train(policy, traced=True, rt=cl.runtime)
    assert losses == eager_losses
    for a, b in zip(weights, eager_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    if policy == "mixed_float16":
        assert opt.loss_scale.state_dict() == eager_opt.loss_scale.state_dict()
    # compile_program's runner ran the replays: it froze the forward and backward kernels
    # (the dropout mask takes a fresh seed: it stays a call), and from the second replay on
    # they launch without the runtime's launch methods (what remains: the optimizer's
    # in-place updates and the mask)
    assert len(cl.runners) == 1 and cl.runners[0] is not None
    runner = cl.runners[0]
    assert len(runner.frozen) >= 15
    # (the optimizer's in-place updates, recorded kernel by kernel, return no array: calls)
    assert set(runner.refused.values()) <= {"an argument of kind 'SeedSlot'",
                                            "a result that is not an array"}
    # call 1 makes the optimizer's slots (Adam is recorded: run eagerly), 2 traces, 3 records,
    # 4 and 5 replay the launches
    record, fast = counts[2], counts[3:]
    assert fast == [fast[0]] * len(fast) and fast[0] < record / 2, counts


def test_calls_that_touch_the_host_stay_calls_and_stay_correct(cl: Any) -> None:
    mp.set_global_policy("float32")
    v = mp.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))

    def step(x: mp.Tensor) -> mp.Tensor:
        fixed = mp.ops.take(x, [2, 0], axis=1)           # constant indices: uploaded once
        picked = mp.ops.take(fixed, mp.ops.random_permutation(2), axis=1)  # fresh
        v.assign(v * 2.0)                                 # then read by a frozen call
        flat = mp.ops.reshape(v + x, (6,))                # a view of a frozen result
        return mp.ops.sum(picked) + flat

    def run(traced: bool) -> list[np.ndarray]:
        v.assign(np.arange(6, dtype=np.float32).reshape(2, 3))
        f = mp.function(step) if traced else step
        return [np.asarray(f(mp.constant(RNG.random((2, 3), dtype=np.float32) + i)))
                for i in range(4)]

    state = RNG.bit_generator.state
    eager = run(False)
    RNG.bit_generator.state = state
    traced = run(True)
    for a, b in zip(traced, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    runner = cl.runners[-1]
    # the permutation takes a fresh seed (and uploads): a call at each replay; the constant
    # indices' upload was folded into the program once
    assert list(runner.refused.values()) == ["an argument of kind 'SeedSlot'"]
    assert runner.frozen


def test_constants_identity_results_empty_arrays_and_one_array_twice(cl: Any) -> None:
    mp.set_global_policy("float32")
    c = mp.constant(np.arange(3, dtype=np.float32))     # a captured constant: its own buffer

    def step(a: mp.Tensor, b: mp.Tensor) -> tuple[mp.Tensor, ...]:
        empty = mp.ops.zeros((0, 3))
        return (mp.ops.exp(a * b + c), mp.ops.concat([a, b, a], 0), mp.ops.cast(a, "float32"),
                mp.ops.sum(empty))

    f = mp.function(step)
    for i in range(5):
        x = mp.constant(RNG.random(3, dtype=np.float32))
        y = x if i % 2 else mp.constant(RNG.random(3, dtype=np.float32))
        for got, want in zip(f(x, y), step(x, y), strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert len(cl.runners) == 2                          # x twice is a signature of its own
    # the empty zeros and their sum have constant operands: folded once, not replayed
    assert all(len(r.frozen) == 4 and not r.refused for r in cl.runners)


def test_every_launch_goes_through_the_runtime() -> None:
    """The recorder sees launches through Runtime.launch and launch_nd only: a kernel module
    that used the queue itself would be left out of a replay."""
    package = REPO_ROOT / "backends" / "opencl"
    users = sorted(p.name for p in package.glob("*.py") if re.search(r"\.queue\b", p.read_text())
                   and p.name not in ("runtime.py", "replay.py"))
    assert users == []


def _other_devices() -> list[str]:
    if os.environ.get(CHILD):
        return []
    try:
        be = mp.get_backend("opencl")
    except mp.BackendUnavailableError:   # PyOpenCL not installed: the tests above skip too
        return []
    current = be.device().index
    return [d.index for d in be.devices() if d.index != current]


@pytest.mark.parametrize("index", _other_devices() or [None])
def test_on_the_other_opencl_devices(index: str | None) -> None:
    """The tests above on each other OpenCL device (Intel's CPU runtime, when installed), in a
    subprocess: the registered backend keeps its device for the life of a process."""
    if index is None:
        pytest.skip("one OpenCL device here")
    env = {**os.environ, "MPCORE_OPENCL_DEVICE": index, CHILD: "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(Path(__file__).relative_to(REPO_ROOT)), "-k", "not other"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b6 passed", proc.stdout), proc.stdout[-2000:]
