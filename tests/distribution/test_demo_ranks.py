"""``mpcore demo --ranks N``: what it hands each rank, and what it settles before starting
``mpiexec`` (no job is started here)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from mpcore.cli import demo


def job_arguments(*argv: str) -> list[str]:
    parser = argparse.ArgumentParser()
    demo._configure(parser)
    return demo._job_arguments(parser.parse_args(list(argv)))


def test_every_option_reaches_the_ranks() -> None:
    args = job_arguments("--ranks", "2", "--rewrite", "--units", "8", "--epochs", "1")
    assert "--rewrite" in args and args[args.index("--units") + 1] == "8"
    assert "--rewrite" not in job_arguments("--ranks", "2")


def test_a_bad_collective_timeout_is_one_line_before_the_job_starts() -> None:
    for bad in ("inf", "soon"):
        env = {**os.environ, "MPCORE_COLLECTIVE_TIMEOUT": bad, "MPCORE_BACKEND": "cpu"}
        proc = subprocess.run([sys.executable, "-m", "mpcore", "demo", "--ranks", "2",
                               "--epochs", "1"], capture_output=True, text=True, timeout=120,
                              env=env, check=False)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr == ("mpcore demo: MPCORE_COLLECTIVE_TIMEOUT must be a finite "
                               f"number of seconds > 0, got {bad!r} (unset: 300)\n")


def test_a_bad_amp_list_edit_is_one_line_before_the_job_starts() -> None:
    env = {**os.environ, "MPCORE_AMP_ALLOWLIST_ADD": "foo", "MPCORE_BACKEND": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "mpcore", "demo", "--ranks", "2", "--rewrite",
                           "--epochs", "1"], capture_output=True, text=True, timeout=120,
                          env=env, check=False)
    assert proc.returncode == 1 and proc.stdout == ""   # mpiexec never started
    assert proc.stderr.startswith("mpcore demo: ") and proc.stderr.count("\n") == 1
    assert "MPCORE_AMP_ALLOWLIST_ADD" in proc.stderr and "'foo'" in proc.stderr
