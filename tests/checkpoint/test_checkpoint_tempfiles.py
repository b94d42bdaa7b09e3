"""Checkpoint files on disk: saves killed by SIGKILL leave temporary files that a later save in
the folder removes (a live concurrent save's are kept), files honour the umask as np.save, and
a path that cannot be saved to is an error naming it (not the temporary file) and why."""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mpcore as mp
from mpcore import layers
from mpcore.checkpoint import checkpoint

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL and umask are POSIX")

DEADLINE_S = 60.0

# A save that stalls in the middle of pickling (the weights are being written) until killed.
STALLED_SAVE = """
import sys, time
import mpcore as mp
from mpcore import layers
from mpcore.checkpoint import checkpoint

class Stall:
    def __reduce__(self):
        print("saving", flush=True)
        time.sleep(300)
        raise RuntimeError("was not killed")

mp.random.set_seed(0)
model = mp.Sequential([mp.Input((10,)), layers.Dense(3)])
checkpoint.save(sys.argv[1], model, stall=Stall())
"""


def start_stalled_saves(paths: list[Path]) -> list[subprocess.Popen[str]]:
    """Child processes, each stalled mid-save of its path once this returns."""
    procs = [subprocess.Popen([sys.executable, "-c", STALLED_SAVE, str(p)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in paths]
    deadline = time.monotonic() + DEADLINE_S
    for proc in procs:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = proc.stdout.readline() if ready else ""
        if line != "saving\n":
            for p in procs:
                p.kill()
            errors = [p.communicate(timeout=DEADLINE_S)[1] for p in procs]
            pytest.fail(f"a child did not reach the middle of its save: {line!r} {errors}")
    return procs


def temporaries(folder: Path) -> set[str]:
    return {name for name in os.listdir(folder) if name.endswith(".tmp")}


def small_model() -> mp.Model:
    mp.random.set_seed(1)
    return mp.Sequential([mp.Input((10,)), layers.Dense(3)])


def test_later_save_removes_temporaries_of_killed_saves_but_not_live_ones(
        tmp_path: Path) -> None:
    target = tmp_path / "model.mpck"
    killed = start_stalled_saves([target, target, tmp_path / "ckpt-3.mpck"])
    for proc in killed:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == -signal.SIGKILL
    stale = temporaries(tmp_path)
    assert len(stale) == 3
    # what is not certainly an mpcore temporary of a dead save stays: another tool's file, a
    # save of another machine sharing the folder (its PID means nothing here)
    foreign = {".model.mpck.abcd1234.tmp", f".model.mpck.mpcore.elsewhere.{killed[0].pid}."
                                           "0123abcd.tmp"}
    for name in foreign:
        (tmp_path / name).write_bytes(b"not ours")
    [live] = start_stalled_saves([target])
    try:
        live_files = temporaries(tmp_path) - stale - foreign
        assert len(live_files) == 1
        model = small_model()
        model.save_weights(str(target))
        assert temporaries(tmp_path) == live_files | foreign
        other = small_model()
        other.load_weights(str(target))
        assert live.poll() is None  # the concurrent save was left alone
    finally:
        live.kill()
        live.communicate(timeout=DEADLINE_S)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_honour_the_umask_like_np_save(tmp_path: Path, umask: int) -> None:
    model = small_model()
    old = os.umask(umask)
    try:
        model.save_weights(str(tmp_path / "w.weights"))
        checkpoint.save(str(tmp_path / "c.mpck"), model)
        np.save(tmp_path / "reference.npy", np.zeros(3))
    finally:
        os.umask(old)
    expected = stat.S_IMODE((tmp_path / "reference.npy").stat().st_mode)
    assert expected == 0o666 & ~umask
    for name in ("w.weights", "c.mpck"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected, name


def test_a_path_that_cannot_be_saved_to_is_named_with_the_problem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(IsADirectoryError) as info:
        model.save_weights(str(tmp_path))
    assert str(info.value) == (f"cannot save to {str(tmp_path)!r}: it is a folder; give a file "
                               f"name in it, e.g. {str(tmp_path / 'weights.mpcore')!r}")
    (tmp_path / "a-file").write_text("")
    inside = str(tmp_path / "a-file" / "ckpt")
    with pytest.raises(NotADirectoryError) as info:
        model.save_checkpoint(inside)
    assert str(info.value) == (f"cannot save to {inside!r}: {str(tmp_path / 'a-file')!r}, "
                               "where it would go, is a file, not a folder")

    def refused(target: str) -> tuple[int, str]:   # as in /proc, or a read-only folder
        raise PermissionError(13, "Permission denied", target + ".x.tmp")

    target = str(tmp_path / "ckpt")
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "_create_temporary", refused)
        with pytest.raises(PermissionError) as info:
            model.save_checkpoint(target)
    assert info.value.errno == 13
    assert str(info.value) == (f"cannot save to {target!r}: cannot create a file in its folder "
                               f"{str(tmp_path)!r}: Permission denied")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", full)
        with pytest.raises(OSError) as info:
            model.save_weights(target)
    assert str(info.value) == (f"cannot save to {target!r}: writing it failed: No space left "
                               "on device")
    assert sorted(os.listdir(tmp_path)) == ["a-file"]   # no temporary file left behind
