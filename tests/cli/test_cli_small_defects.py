"""Smaller defects of the command line and the documents (issue 33, item 10): a reader that
leaves (``| head``) ends the command quietly, a bad MPCORE_* value comes before the paragraph
about detection, ``mpcore demo --ranks`` beyond the cores says so, and the READMEs say what is
true (the settings table, where plugins load)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mpcore.cli import demo

ROOT = Path(__file__).resolve().parents[2]


def test_a_reader_that_leaves_ends_the_command_without_a_traceback() -> None:
    """``mpcore conformance cpu --json | head`` ended in a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "mpcore", "conformance", "cpu", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()                      # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait() == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_a_bad_setting_comes_before_the_detection_paragraph() -> None:
    code = ("import mpcore as mp\n"
            "try:\n    mp.get_backend()\n"
            "except mp.BackendUnavailableError as exc:\n    print(exc)\n")
    env = {**os.environ, "MPCORE_CPU_POOL_MB": "1O24"}
    env.pop("MPCORE_BACKEND", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    if "no mpcore backend" not in out:
        pytest.skip("another backend was auto-detected here: the cpu backend's failure is "
                    "then a warning")
    first = out.splitlines()[0]
    assert first.startswith("MPCORE_CPU_POOL_MB='1O24' is not valid; valid values: a whole "
                            "number of MB >= 0")
    assert first.endswith("(it stops the cpu backend)")


def _launch(ranks: int, cores: int, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, str]]:
    from mpcore.distribution import launch

    ran: dict[str, Any] = {}
    monkeypatch.setattr(demo, "usable_cores", lambda: cores)
    monkeypatch.setattr(launch, "mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(subprocess, "run", lambda cmd, env, check: ran.update(env=env)
                        or subprocess.CompletedProcess(cmd, 0))
    args = argparse.Namespace(ranks=ranks, rewrite=False, units=8, policy="float32", epochs=1,
                              batch_size=64, plot=None, seed=0, verbose=0, inspect=False)
    monkeypatch.setattr(demo, "_job_arguments", lambda args: [])
    assert demo._launch(args) == 0
    return capsys.readouterr().err, ran["env"]


def test_more_ranks_than_cores_is_warned_naming_the_core_count(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    err, env = _launch(64, 2, monkeypatch, capsys)
    assert err.startswith("mpcore demo: warning: --ranks 64 on 2 cores: 64 processes share "
                          "them")
    assert "slower than --ranks 2" in err
    assert env["OMP_NUM_THREADS"] == "1"


def test_ranks_within_the_cores_are_not_warned(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    err, env = _launch(2, 2, monkeypatch, capsys)
    assert "warning" not in err and env["OMP_NUM_THREADS"] == "1"


def test_the_readme_settings_table_has_every_setting_the_code_reads() -> None:
    readme = (ROOT / "README.md").read_text()
    table = [line for line in readme.splitlines() if line.startswith("| `MPCORE_")]
    assert any(line.startswith("| `MPCORE_MNIST_MIRRORS` |") for line in table)
    assert "a couple of minutes" not in readme     # 6.5 measured on 2 cores


def test_the_backend_templates_readme_says_where_plugins_load() -> None:
    text = (ROOT / "examples" / "backend_template" / "README.md").read_text()
    assert "it runs at `import mpcore`" not in text
    assert "not at\n   `import mpcore`" in text
    code = "import sys, mpcore\nprint(sorted(m for m in sys.modules if m.startswith('mpcore_')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"                   # no plugin module is imported by import mpcore
