"""A backend that fails when first really used: auto-detection passes over it (reported in the
detection note, ``mpcore info`` and one logged warning); an explicit choice of it raises,
naming the backends here. Real plugins: entry points in a temporary ``*.dist-info`` checked in
fresh interpreters, and plugin objects registered with the plugin manager in this process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHARED_MNIST
from mpcore_cpu import CpuBackend
from test_plugins import make_plugin, run

import mpcore as mp
from mpcore.plugins import registry
from mpcore.plugins.manager import get_plugins

SHARED = SHARED_MNIST

FAILING = """
    import mpcore
    from mpcore_cpu import CpuBackend

    calls = []   # what was asked of the failing backends, to show the import asked nothing

    class BrokenDevices(CpuBackend):
        name = "brokendev"
        priority = 5000

        def devices(self):
            calls.append("brokendev.devices")
            raise RuntimeError("the driver crashed")

    class NoBuild(CpuBackend):
        name = "nobuild"
        priority = 4000

        def _activate(self):
            calls.append("nobuild.kernels")
            raise mpcore.KernelBuildError("program gemm did not build on device X\\n    log line")

    class Fallback(CpuBackend):
        name = "fallback"
        priority = 3000

    class LateBuild(CpuBackend):
        # below cpu: detection never builds its kernels; only `mpcore info --measure` does
        name = "latebuild"
        priority = 1

        def policy_support(self, policy, device):  # from the description, as OpenCL's
            return mpcore.Support(True, True, "judged from the device description")

        def _activate(self):
            calls.append("latebuild.kernels")
            raise mpcore.KernelBuildError("program pack did not build on device Y")

    @mpcore.hookimpl
    def mpcore_backends():
        return [BrokenDevices(), NoBuild(), Fallback(), LateBuild()]
"""


@pytest.fixture
def failing(tmp_path: Path) -> Path:
    make_plugin(tmp_path, "failing_plugin", "failing", "failing_plugin", FAILING)
    return tmp_path


def test_failing_auto_detected_backends_are_passed_over(failing: Path) -> None:
    proc = run(failing, ["-c", """
import json
import mpcore as mp
import failing_plugin
from mpcore.plugins import registry
at_import = list(failing_plugin.calls)
be = mp.get_backend()
total = float(mp.ops.sum(mp.constant([1.0, 2.0])))
verdict = mp.check_policy("mixed_float16")
mp.get_backend(); mp.get_backend()
print(json.dumps({"at_import": at_import, "calls": failing_plugin.calls, "name": be.name,
                  "total": total, "verdict": verdict.backend,
                  "note": registry.detection_note(),
                  "failures": {n: type(registry.failure(n)).__name__
                               for n in ("brokendev", "nobuild", "fallback")}}))
"""])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["at_import"] == []          # import mpcore opened no device, built nothing
    assert out["calls"] == ["brokendev.devices", "nobuild.kernels"]   # each tried once
    assert out["name"] == out["verdict"] == "fallback" and out["total"] == 3.0
    note = out["note"]
    assert note.startswith("auto-detected (highest priority available: 3000)")
    assert "passed over brokendev (failing: RuntimeError: the driver crashed)" in note
    assert ("nobuild (failing: its kernels failed to build: KernelBuildError: program gemm did "
            "not build on device X)") in note
    assert out["failures"] == {"brokendev": "RuntimeError", "nobuild": "KernelBuildError",
                               "fallback": "NoneType"}
    # one warning, naming both failures and what is used instead
    warnings = [line for line in proc.stderr.splitlines() if "passed over" in line]
    assert len(warnings) == 1, proc.stderr
    assert "'brokendev'" in warnings[0] and "'nobuild'" in warnings[0]
    assert "using 'fallback'" in warnings[0]
    assert "Traceback" not in proc.stderr


def test_mpcore_info_shows_a_failing_backend_as_failing_never_as_selected(failing: Path) -> None:
    proc = run(failing, ["-m", "mpcore", "info"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("mpcore backends (selected: fallback; auto-detected")
    selected = [line for line in lines if line.startswith("* ")]
    assert len(selected) == 1 and selected[0].startswith("* fallback: available")
    assert "  brokendev: failing: RuntimeError: the driver crashed" in lines
    assert ("  nobuild: failing: its kernels failed to build: KernelBuildError: program gemm "
            "did not build on device X") in lines
    assert "        log line" in lines         # the rest of a long message, indented
    assert "Traceback" not in proc.stderr

    as_json = json.loads(run(failing, ["-m", "mpcore", "info", "--json"]).stdout)
    assert as_json["selected"] == "fallback" and as_json["error"] is None
    by_name = {b["name"]: b for b in as_json["backends"]}
    assert by_name["fallback"]["status"] == "available" and by_name["fallback"]["available"]
    for name, error in (("brokendev", "RuntimeError: the driver crashed"),
                        ("nobuild", "KernelBuildError: program gemm")):
        entry = by_name[name]
        assert entry["status"] == "failing" and entry["available"] is False
        assert entry["failing"].startswith(error)
        assert entry["reason"].startswith("failing: ")


def test_kernels_that_fail_to_build_under_measure_make_the_backend_failing(failing: Path
                                                                          ) -> None:
    """Before, `mpcore info --measure` showed such a backend as available with two failed
    measurements; its kernels not building is the backend failing, as detection would find."""
    plain = json.loads(run(failing, ["-m", "mpcore", "info", "--json"]).stdout)
    assert {b["name"]: b["status"] for b in plain["backends"]}["latebuild"] == "available"
    proc = run(failing, ["-m", "mpcore", "info", "--json", "--measure"])
    assert proc.returncode == 0, proc.stderr
    by_name = {b["name"]: b for b in json.loads(proc.stdout)["backends"]}
    late = by_name["latebuild"]
    assert late["status"] == "failing" and late["available"] is False
    assert late["failing"] == "KernelBuildError: program pack did not build on device Y"
    assert late["reason"].startswith("failing: its kernels failed to build")
    assert "measured" not in late
    assert set(by_name["fallback"]["measured"]) == {"float16", "bfloat16"}


def test_an_explicit_choice_of_a_failing_backend_raises_naming_the_others(failing: Path
                                                                          ) -> None:
    proc = run(failing, ["-c", """
import mpcore as mp
try:
    mp.set_backend("BrokenDev")
except mp.BackendUnavailableError as exc:
    print("SET:", exc)
be = mp.get_backend()
print("NOW:", be.name)
try:
    mp.set_backend("brokendev")   # a failure is kept: not tried again, the same error
except mp.BackendUnavailableError as exc:
    print("AGAIN:", type(exc).__name__)
"""])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "SET: backend 'brokendev' fails on first use: RuntimeError: the driver crashed" in out
    assert "  fallback: available" in out and "  cpu: available" in out
    assert "  brokendev: failing: RuntimeError: the driver crashed" in out
    assert "NOW: fallback" in out and "AGAIN: BackendUnavailableError" in out

    env = run(failing, ["-c", "import mpcore as mp; mp.get_backend()"], MPCORE_BACKEND="nobuild")
    assert env.returncode != 0
    lines = env.stderr.strip().splitlines()
    error = next(line for line in reversed(lines) if line.startswith("mpcore.core.backend.Kernel"))
    assert ("MPCORE_BACKEND=nobuild: backend 'nobuild' fails on first use: its kernels failed "
            "to build: KernelBuildError: program gemm") in error
    assert "  fallback: available" in env.stderr
    assert "unset MPCORE_BACKEND" in env.stderr

    info = run(failing, ["-m", "mpcore", "info"], MPCORE_BACKEND="nobuild")
    assert info.returncode == 1 and "Traceback" not in info.stderr
    lines = info.stdout.splitlines()
    assert lines[0] == "mpcore backends (selected: none)"
    assert lines[1].startswith("error: MPCORE_BACKEND=nobuild: backend 'nobuild' fails")
    assert not [line for line in lines if line.startswith("* ")]
    for name in ("brokendev", "nobuild", "fallback", "cpu", "cuda", "opencl"):
        assert any(line[2:].startswith(f"{name}: ") for line in lines), name


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared MNIST files are not here")
def test_mpcore_demo_runs_on_the_next_backend(failing: Path) -> None:
    proc = run(failing, ["-m", "mpcore", "demo", "--epochs", "1", "--units", "8",
                         "--batch-size", "2048", "--verbose", "0"], MPCORE_DATA_DIR=str(SHARED))
    assert proc.returncode == 0, proc.stderr
    assert "Backend: fallback (auto-detected" in proc.stdout
    assert "passed over brokendev (failing: RuntimeError: the driver crashed)" in proc.stdout
    assert "Results on fallback" in proc.stdout
    assert "Traceback" not in proc.stderr


class _Broken(CpuBackend):
    name = "broken-in-process-test"
    priority = 9000

    def device(self) -> mp.Device:
        raise RuntimeError("no device answers")


class _Working(CpuBackend):
    name = "working-in-process-test"
    priority = 8000


class _Plugin:
    @mp.hookimpl
    def mpcore_backends(self) -> list[mp.Backend]:
        return [_Broken(), _Working()]


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The two backends above, registered as a plugin object, with the detection state of
    this process put back afterwards (auto-detection: whatever MPCORE_BACKEND the suite runs
    with is unset)."""
    monkeypatch.delenv("MPCORE_BACKEND", raising=False)
    plugins = get_plugins()
    saved = registry._current, registry._detection_note, dict(registry._failures)
    plugins.register(_Plugin(), name="fallback-in-process-test")
    registry._current = None
    try:
        yield
    finally:
        plugins.manager.unregister(name="fallback-in-process-test")
        for name in (_Broken.name, _Working.name):
            plugins.backends.pop(name, None)
            plugins.backend_origin.pop(name, None)
        registry._current, registry._detection_note = saved[0], saved[1]
        registry._failures.clear()
        registry._failures.update(saved[2])


def test_a_registered_plugin_object_that_fails_is_passed_over(
        registered: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.delenv("MPCORE_BACKEND", raising=False)
    with caplog.at_level("WARNING", logger="mpcore"):
        be = mp.get_backend()
        assert mp.get_backend() is be
        assert (mp.constant([1.0]) + 1.0).backend is be
    assert be.name == _Working.name
    assert isinstance(registry.failure(_Broken.name), RuntimeError)
    assert registry.failure(_Working.name) is None
    assert f"passed over {_Broken.name} (failing: RuntimeError: no device answers)" in (
        registry.detection_note())
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    with pytest.raises(mp.BackendUnavailableError, match="no device answers") as info:
        mp.set_backend(_Broken.name.upper())
    assert f"  {_Working.name}: available" in str(info.value)
    assert mp.get_backend() is be


def test_the_per_op_path_asks_nothing_of_the_backend_once_it_works(registered: None) -> None:
    mp.get_backend()
    calls: list[str] = []
    working = get_plugins().backends[_Working.name]

    def counted(name: str) -> None:
        original = getattr(working, name)
        setattr(working, name, lambda *a: calls.append(name) or original(*a))

    for name in ("unavailable_reason", "auto_select", "devices", "device"):
        counted(name)
    for _ in range(100):
        assert registry.get_backend() is working
    assert calls == []
