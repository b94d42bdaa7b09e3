"""Backend detection: priority order, MPCORE_BACKEND, set_backend, clear errors, and an
``import mpcore`` that opens no device."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_plugins import make_plugin, run

import mpcore as mp
from mpcore.plugins import registry
from mpcore.plugins.extras import install_command


def cuda_unavailable() -> str | None:
    return registry.get_plugins().backends["cuda"].unavailable_reason()


def test_env_cpu(tmp_path: Path) -> None:
    proc = run(tmp_path, ["-c", "import mpcore as mp; from mpcore import registry; "
                          "print(mp.get_backend().name, '|', registry.detection_note())"],
               MPCORE_BACKEND="cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "cpu | chosen by MPCORE_BACKEND=cpu"


def test_env_unknown_backend_fails_at_first_use(tmp_path: Path) -> None:
    # the import itself stays cheap and cannot fail (so `mpcore info` can diagnose it); the
    # first use raises, naming the variable, the valid names and the state of each backend
    assert run(tmp_path, ["-c", "import mpcore"], MPCORE_BACKEND="nonexistent").returncode == 0
    proc = run(tmp_path, ["-c", "import mpcore as mp; mp.constant([1.0])"],
               MPCORE_BACKEND="nonexistent")
    assert proc.returncode != 0
    assert ("ValueError: MPCORE_BACKEND=nonexistent: unknown backend 'nonexistent'; registered "
            "backends: cuda, opencl, cpu") in proc.stderr
    for name in ("cpu: available", "cuda", "opencl"):
        assert name in proc.stderr


def test_env_unavailable_cuda_fails_with_install_hint(tmp_path: Path) -> None:
    reason = cuda_unavailable()
    if reason is None:
        pytest.skip("CUDA is available here")
    proc = run(tmp_path, ["-c", "import mpcore as mp; mp.get_backend()"], MPCORE_BACKEND="cuda")
    assert proc.returncode != 0
    assert f"MPCORE_BACKEND=cuda: backend 'cuda' is not available: {reason}" in proc.stderr
    # the pip command only where a GPU lacks CuPy (the reason names the GPU first)
    assert (install_command("cuda") in proc.stderr) == (reason == "CuPy not installed")
    assert "cpu: available" in proc.stderr


def test_set_backend_errors() -> None:
    before = mp.get_backend()
    with pytest.raises(ValueError, match="unknown backend 'tpu'") as info:
        mp.set_backend("tpu")
    for name in ("cpu", "cuda", "opencl"):
        assert f"  {name}:" in str(info.value)
    reason = cuda_unavailable()
    if reason is not None:
        with pytest.raises(RuntimeError, match=re.escape(reason)) as info:
            mp.set_backend("cuda")
        assert "cpu: available" in str(info.value)
    with pytest.raises(TypeError, match="by name"):
        mp.set_backend(3)  # type: ignore[arg-type]
    assert mp.get_backend() is before  # a failed choice changes nothing


def test_env_and_set_backend_take_a_name_in_any_case(tmp_path: Path) -> None:
    proc = run(tmp_path, ["-c", "import mpcore as mp; from mpcore import registry; "
                          "print(mp.get_backend().name, '|', registry.detection_note())"],
               MPCORE_BACKEND=" CPU ")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "cpu | chosen by MPCORE_BACKEND=CPU"
    previous, note = registry._current, registry._detection_note
    try:
        assert mp.set_backend("Cpu") is mp.get_backend("cpu") is mp.get_backend()
    finally:
        registry._current, registry._detection_note = previous, note


_CASES = st.sampled_from([str.lower, str.upper, str.title, str.swapcase])
_BLANKS = st.text(" \t\n", max_size=2)


@given(_CASES, _BLANKS, _BLANKS)
def test_backend_names_match_in_any_case_and_padding(case: object, left: str,
                                                     right: str) -> None:
    for backend in mp.backends():
        if backend.is_available():
            name = left + case(backend.name) + right  # type: ignore[operator]
            assert registry.get_backend(name) is backend


@given(st.text(st.characters(blacklist_categories=("Cs",))))
def test_any_other_name_is_an_error_naming_the_registered_backends(name: str) -> None:
    names = [b.name for b in mp.backends()]
    if name.strip().casefold() in {n.casefold() for n in names}:
        return
    with pytest.raises(ValueError) as info:
        registry.get_backend(name)
    first = str(info.value).splitlines()[0]
    assert first == f"unknown backend {name!r}; registered backends: {', '.join(names)}."


def test_set_backend_and_get_backend(backend: mp.Backend) -> None:
    assert mp.get_backend() is backend
    assert mp.get_backend(backend.name) is backend
    assert mp.constant([1.0]).backend is backend
    assert registry.detection_note() == "chosen by set_backend"


def test_backends_are_listed_by_priority() -> None:
    listed = mp.backends()
    names = [b.name for b in listed]
    assert {"cpu", "cuda", "opencl"} <= set(names)
    priorities = [b.priority for b in listed]
    assert priorities == sorted(priorities, reverse=True)
    by_name = {b.name: b.priority for b in listed}
    assert by_name["cuda"] > by_name["opencl"] > by_name["cpu"]


def test_import_opens_no_device(tmp_path: Path) -> None:
    proc = run(tmp_path, ["-c", """
import sys
import mpcore as mp
[b.auto_select() for b in mp.backends()]  # the choosing step of detection: drivers, no device
heavy = sorted(m for m in ("cupy", "pyopencl", "cupy_backends") if m in sys.modules)
print("loaded:", ",".join(heavy))
"""])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "loaded:"


AUTO = """
    import mpcore
    from mpcore_cpu import CpuBackend

    class Fast(CpuBackend):
        name = "fast"
        priority = 1000

    class Shy(CpuBackend):
        name = "shy"
        priority = 2000

        def auto_select(self):
            return False

    class Absent(CpuBackend):
        name = "absent"
        priority = 3000

        def unavailable_reason(self):
            return "no such card"

    @mpcore.hookimpl
    def mpcore_backends():
        return [Fast(), Shy(), Absent()]
"""


def test_auto_detection_takes_the_highest_available_priority(tmp_path: Path) -> None:
    make_plugin(tmp_path, "auto_plugin", "auto", "auto_plugin", AUTO)
    proc = run(tmp_path, ["-c", "import mpcore as mp; from mpcore import registry; "
                          "print(mp.get_backend().name); print(registry.detection_note())"])
    assert proc.returncode == 0, proc.stderr
    name, note = proc.stdout.strip().splitlines()
    assert name == "fast"
    assert "highest priority available: 1000" in note
    assert "absent (no such card)" in note and "shy (not auto-selected)" in note
    explicit = run(tmp_path, ["-c", "import mpcore as mp; print(mp.get_backend().name)"],
                   MPCORE_BACKEND="shy")
    assert explicit.stdout.strip() == "shy"
