"""``mpcore info`` and ``python -m mpcore info``: the table and its JSON twin."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from mpcore_cpu import CpuBackend

import mpcore as mp
from mpcore.cli.app import format_info, info_report, main
from mpcore.mixed_precision.policy import POLICIES
from mpcore.plugins.extras import install_command
from mpcore.plugins.manager import get_plugins


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    # (MPCORE_BACKEND as the suite runs with it: the in-process facts compared are its)
    return subprocess.run(args, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


@pytest.fixture(scope="module")
def table() -> str:
    proc = run([sys.executable, "-m", "mpcore", "info"])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def report() -> dict:
    proc = run([sys.executable, "-m", "mpcore", "info", "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_table_lists_every_backend(table: str) -> None:
    first = table.splitlines()[0]
    assert first.startswith("mpcore backends (selected: ")
    for b in mp.backends():
        line = next(x for x in table.splitlines() if x[2:].startswith(f"{b.name}: "))
        reason = b.unavailable_reason()
        if reason is None:
            assert "available" in line
        else:
            assert f"not available: {reason}" in line
            if b.install_advice():
                assert f"(install with {b.install_advice()})" in line
            else:
                assert "install with" not in line


def test_table_marks_the_selected_backend_and_shows_policies(table: str) -> None:
    selected = next(x for x in table.splitlines() if x.startswith("* "))
    assert selected[2:].startswith(mp.get_backend().name + ":")
    assert f"selected: {mp.get_backend().name};" in table.splitlines()[0]
    cpu = mp.get_backend("cpu")
    s = cpu.policy_support("mixed_bfloat16", cpu.device())
    assert s.reason in table
    for policy in POLICIES:
        assert any(line.strip().startswith(policy + " ") for line in table.splitlines())
    assert f"device 0: {cpu.device().name}" in table


def _stable(reason: str) -> str:
    """A verdict's reason without the OpenCL half-kernel timings, which each process measures
    for itself on a device with cl_khr_fp16 (mpcore_opencl.half: Intel's CPU runtime)."""
    return re.sub(r"MPCORE_OPENCL_HALF=auto measured .*? kernels run",
                  "MPCORE_OPENCL_HALF=auto measured ...", reason)


def test_json_has_the_same_facts(report: dict, table: str) -> None:
    assert report["selected"] == mp.get_backend().name
    assert report["selection"] and report["selection"] in table.splitlines()[0]
    names = [b["name"] for b in report["backends"]]
    assert names == [b.name for b in mp.backends()]
    for entry in report["backends"]:
        be = mp.get_backend(entry["name"]) if entry["available"] else None
        if entry["name"] == "cuda" and not entry["available"]:
            # a pip command only where a GPU lacks CuPy (the reason names the GPU first)
            assert entry["install"] == (install_command("cuda")
                                        if entry["reason"] == "CuPy not installed" else "")
        if be is None:
            assert entry["reason"]
            continue
        assert set(entry["policies"]) == set(POLICIES)
        device = be.device()
        for policy, verdict in entry["policies"].items():
            s = be.policy_support(policy, device)
            assert verdict["supported"] == s.supported and verdict["fast"] == s.fast
            assert _stable(verdict["reason"]) == _stable(s.reason)
        assert device.name in [d["name"] for d in entry["devices"]]  # not always the first
    assert report["plugin_errors"] == [{"plugin": e.plugin, "target": e.target,
                                        "error": e.error} for e in mp.plugin_errors()]


def test_console_script() -> None:
    exe = shutil.which("mpcore")
    if exe is None:
        pytest.skip("the mpcore console script is not on PATH")
    proc = run([exe, "info", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["selected"] == mp.get_backend().name


def test_in_process_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == format_info(info_report()).strip()
    assert main([]) == 2  # no command: help
    with pytest.raises(SystemExit):
        main(["no-such-command"])


class _MeasureFails(CpuBackend):
    """A backend whose float16 measurement fails (its timer, say) and the rest works."""

    name = "cpu-measure-fails-test"
    priority = 1  # never auto-detected

    def measure_matmul(self, dtype: str, n: int = 1024, repeats: int = 5) -> float:
        if dtype == "float16":
            raise RuntimeError("the timer is gone")
        return super().measure_matmul(dtype, n, repeats)


class _Plugin:
    @mp.hookimpl
    def mpcore_backends(self) -> list[mp.Backend]:
        return [_MeasureFails()]


def test_measure_option(monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    from mpcore.mixed_precision import verdict

    real = verdict.measure_matmul_speed
    monkeypatch.setattr(verdict, "measure_matmul_speed",
                        lambda be, dtype, n=1024: real(be, dtype, 128))
    plugins = get_plugins()
    plugins.register(_Plugin(), name="measure-fails-test")
    try:
        report = info_report(measure=True)
        assert main(["info", "--measure"]) == 0
        table = capsys.readouterr().out
    finally:
        plugins.manager.unregister(name="measure-fails-test")
        plugins.backends.pop(_MeasureFails.name, None)
        plugins.backend_origin.pop(_MeasureFails.name, None)
    cpu = next(b for b in report["backends"] if b["name"] == "cpu")
    assert set(cpu["measured"]) == {"float16", "bfloat16"}
    assert all(m["gflops"] > 0 and m["n"] == 128 for m in cpu["measured"].values())
    assert "measured bfloat16 matmul (n=128)" in format_info(report)
    # a failed measurement is reported as one, next to the intact devices and verdicts
    failing = next(b for b in report["backends"] if b["name"] == _MeasureFails.name)
    assert failing["status"] == "available" and failing["available"]
    assert failing["devices"] == cpu["devices"] and set(failing["policies"]) == set(POLICIES)
    assert failing["measured"]["float16"] == {"error": "RuntimeError: the timer is gone"}
    assert failing["measured"]["bfloat16"]["n"] == 128
    block = table[table.index(f"  {_MeasureFails.name}: available"):].splitlines()
    assert "    measured float16 matmul: failed: RuntimeError: the timer is gone" in block
    assert any(line.startswith("    mixed_bfloat16 ") for line in block)
    assert any(line.startswith("    device 0: ") for line in block)


def test_a_bad_mpcore_backend_is_shown_with_every_backend() -> None:
    proc = run([sys.executable, "-m", "mpcore", "info"], MPCORE_BACKEND="nonsense")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["mpcore backends (selected: none)",
                         "error: MPCORE_BACKEND=nonsense: unknown backend 'nonsense'; "
                         "registered backends: cuda, opencl, cpu."]
    for b in mp.backends():
        assert any(line[2:].startswith(f"{b.name}: ") for line in lines), b.name
    assert not [line for line in lines if line.startswith("* ")]
    as_json = run([sys.executable, "-m", "mpcore", "info", "--json"], MPCORE_BACKEND="nonsense")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["selected"] is None and "unknown backend 'nonsense'" in report["error"]
    assert [b["name"] for b in report["backends"]] == [b.name for b in mp.backends()]
    assert any(b["available"] and b["policies"] for b in report["backends"])


def test_a_backend_name_in_any_case() -> None:
    proc = run([sys.executable, "-m", "mpcore", "info", "--json"], MPCORE_BACKEND="CPU")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["selected"] == "cpu"
