"""The GPU checklist runner (backends/cuda/checklist.py) on the CPU: its plan names tests,
markers and benchmark flags that exist, its budget and limits hold with real processes (a
check past its limit is killed with its children), and its fallback site makes the checkout
importable, plugins included, without pip."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from mpcore_cuda import checklist
from mpcore_cuda.checklist import Check

ROOT = Path(__file__).resolve().parents[3]
PY = sys.executable


def _module(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plan_names_paths_markers_and_flags_that_exist() -> None:
    bench = _module(ROOT / "benchmarks" / "cuda_train_step.py")
    profile = _module(ROOT / "benchmarks" / "cuda_profile.py")
    pyproject = (ROOT / "pyproject.toml").read_text()
    checks = checklist.plan(PY, checklist.PEER)
    assert len({c.log for c in checks}) + 1 <= 8        # the logs and summary.json come back
    for check in checks:
        args = check.argv[1:] if check.argv[0] == PY else check.argv
        if args[:2] == ("-m", "pytest"):
            for arg in args:
                if arg.startswith("tests/"):
                    assert (ROOT / arg).exists(), (check.name, arg)
            if "-m" in args[2:]:
                marker = args[2:][args[2:].index("-m") + 1]
                assert f'"{marker}: ' in pyproject, (check.name, marker)
        elif args[:1] == ("benchmarks/cuda_train_step.py",):
            options = bench.parser().parse_args(list(args[1:]))  # exits on an unknown flag
            assert options.backend == "cuda"
        elif args[:1] == ("benchmarks/cuda_profile.py",):
            options = profile.parser().parse_args(list(args[1:]))
            assert options.backend == "cuda"
        elif args[:2] == ("-m", "mpcore_cuda.fp8_check"):
            from mpcore_cuda import fp8_check

            fp8_check.parser().parse_args(list(args[2:]))      # exits on an unknown flag
        elif args[:2] != ("-m", "mpcore"):
            assert check.argv == ("nvidia-smi",), check
    assert {"MPCORE_BACKEND": "cuda", "MPCORE_CUDA_GRAPHS": "0"} in [c.env for c in checks]
    assert "fp8 gemms" in [c.name for c in checks]
    against = [c for c in checklist.plan(PY, None) if c.name.startswith("bench vs torch")]
    assert len(against) == 2
    assert all("--no-peer" in c.argv and "--peer" not in c.argv for c in against)


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path: Path) -> None:
    proc = subprocess.run([PY, str(ROOT / "backends" / "cuda" / "checklist.py"), "--dry-run",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("nvidia-smi [info.log, 20 s]: nvidia-smi")
    assert any(ln.startswith("traced steps, graphs off [traced.log, 90 s]: MPCORE_BACKEND=cuda "
                             "MPCORE_CUDA_GRAPHS=0 ") for ln in lines)
    assert not (tmp_path / "out").exists()


def test_only_runs_the_checks_named_and_refuses_an_unknown_name(tmp_path: Path) -> None:
    script = str(ROOT / "backends" / "cuda" / "checklist.py")
    proc = subprocess.run([PY, script, "--dry-run", "--only", "mpcore info", "suite on cuda"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [ln.split(" [")[0] for ln in proc.stdout.splitlines()] == ["mpcore info",
                                                                      "suite on cuda"]
    bad = subprocess.run([PY, script, "--dry-run", "--only", "suite"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "no check named 'suite'; the checks: 'nvidia-smi'" in bad.stderr


def test_carried_wheels_are_installed_without_an_index(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import zipfile

    folder = tmp_path / "wheels"
    folder.mkdir()
    with zipfile.ZipFile(folder / "tiny_mod-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("tiny_mod.py", "VALUE = 42\n")
        info = "tiny_mod-1.0.dist-info"
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tiny-mod\nVersion: 1.0\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    paths = checklist.carried_wheels(folder, tmp_path / "site")
    assert paths and all(p.startswith(str(tmp_path / "site")) for p in paths)
    proc = subprocess.run([PY, "-c", "import tiny_mod; print(tiny_mod.VALUE)"], text=True,
                          capture_output=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
                          timeout=60, check=False)
    assert proc.stdout == "42\n", proc.stderr
    assert checklist.carried_wheels(tmp_path / "absent", tmp_path / "site2") == []
    (folder / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    assert checklist.carried_wheels(folder, tmp_path / "site3") == []
    assert "carried wheels not installed" in capsys.readouterr().err


def _python(code: str, name: str, limit_s: int = 30, log: str = "a") -> Check:
    return Check(name, log, limit_s, (PY, "-c", code))


def test_outcomes_and_logs_of_real_processes(tmp_path: Path) -> None:
    checks = [_python("print('first'); print('all good')", "ok"),
              _python("import sys; print('broken'); sys.exit(3)", "fails"),
              Check("missing", "b", 30, (str(tmp_path / "no-such-program"),))]
    outcomes = checklist.run_all(checks, 120, tmp_path)
    assert [(o.name, o.status, o.returncode) for o in outcomes] == [
        ("ok", "passed", 0), ("fails", "failed", 3), ("missing", "failed", None)]
    assert outcomes[0].last_line == "all good" and outcomes[1].last_line == "broken"
    log = (tmp_path / "a.log").read_text()                    # both appended to one log
    assert log.index("=== ok: ") < log.index("first") < log.index("=== fails: ")
    assert "could not start" in (tmp_path / "b.log").read_text()


def test_a_check_past_its_limit_is_killed_with_its_children(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(child)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
            "time.sleep(60)")
    start = time.monotonic()
    (outcome,) = checklist.run_all([_python(code, "sleeper", limit_s=3)], 60, tmp_path)
    assert outcome.status == "timed out" and outcome.returncode is None
    assert outcome.last_line == "started"
    assert time.monotonic() - start < 20
    pid = int(child.read_text())
    for _ in range(50):          # the group got SIGTERM: the child is gone (or a zombie)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(
            f"/proc/{pid}/stat").exists() else "Z"
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the check's child {pid} outlived it")


def test_the_budget_limits_each_check_and_skips_the_rest(tmp_path: Path) -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    limits = []

    def fake_run(check: Check, limit_s: float, out: Path, env: object) -> checklist.Outcome:
        limits.append(limit_s)
        now[0] += {"a": 40.0, "b": 50.0}.get(check.name, 1.0)
        return checklist.Outcome(check.name, "passed", 1.0, 0)

    checks = [Check(n, "x", 60, ("true",)) for n in "abcd"]
    original = checklist.run_check
    checklist.run_check = fake_run  # type: ignore[assignment]
    try:
        outcomes = checklist.run_all(checks, 100, tmp_path, clock=clock)
    finally:
        checklist.run_check = original  # type: ignore[assignment]
    assert limits == [60, 60]          # then 10 s left: under MIN_LIMIT_S
    assert [o.status for o in outcomes] == ["passed", "passed", "not run", "not run"]
    assert outcomes[2].last_line == "the budget was spent"
    assert checklist.MIN_LIMIT_S > 10


@pytest.mark.skipif(sys.version_info < (3, 11), reason="link_site reads pyproject.toml with "
                    "tomllib (Python 3.11+; the GPU image has 3.12)")
def test_the_link_site_makes_the_checkout_importable_with_its_plugins(tmp_path: Path) -> None:
    site = checklist.link_site(ROOT, tmp_path / "site")
    info = site / "mpcore-0.1.0.dist-info"
    points = (info / "entry_points.txt").read_text()
    assert "[mpcore]\ncpu = mpcore_cpu\n" in points and "[console_scripts]\n" in points
    assert (site / "mpcore_cpu").resolve() == (ROOT / "backends" / "cpu").resolve()
    # -S: no .pth files, so not the editable install's finder; the site first, then the
    # environment's other packages (NumPy, pluggy)
    packages = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{packages}"}
    env.pop("MPCORE_BACKEND", None)
    code = ("import json, mpcore as mp, mpcore_cpu, mpcore_cuda.checklist as c; "
            "print(json.dumps([mpcore_cpu.__file__, c.__file__, mp.get_backend('cpu').name, "
            "sorted(b.name for b in mp.backends())]))")
    proc = subprocess.run([PY, "-S", "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cpu_file, checklist_file, name, backends = json.loads(proc.stdout.splitlines()[-1])
    assert cpu_file.startswith(str(site)) and checklist_file.startswith(str(site))
    assert name == "cpu" and {"cpu", "cuda", "opencl"} <= set(backends)
