"""A mistyped MPCORE_* value is an error naming the variable and its valid values, wherever it
is read: the CPU backend's own setting and its kernel providers' fail its first use (as a bad
MPCORE_OPENCL_HALF fails the OpenCL backend's), never leaving the backend or a provider
silently off; MPCORE_STRICT_PLUGINS is checked before any plugin loads."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from mpcore_cpu import CpuBackend

from mpcore.plugins import registry
from mpcore.plugins.manager import Plugins, get_plugins
from mpcore.plugins.settings import SettingError

POOL_VALUES = "a whole number of MB >= 0 (default 1024; 0 turns the pool off)"


def run_mpcore(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MPCORE_BACKEND", "MPCORE_STRICT_PLUGINS")}
    return subprocess.run([sys.executable, "-m", "mpcore", *args], capture_output=True,
                          text=True, timeout=120, env={**environ, **env})


@pytest.mark.parametrize(("name", "value", "valid"), [
    ("MPCORE_CPU_POOL_MB", "abc", POOL_VALUES),
    ("MPCORE_CPU_POOL_MB", "-1", POOL_VALUES),
    ("MPCORE_ONEDNN", "bogus", "auto, force, off"),
    ("MPCORE_ONEDNN_FLOAT32", "maybe", "on, off"),
    ("MPCORE_ONNXRUNTIME", "bogus", "auto, off"),
])
def test_a_bad_cpu_setting_fails_the_backends_first_use(monkeypatch: pytest.MonkeyPatch,
                                                        name: str, value: str,
                                                        valid: str) -> None:
    provider = {"MPCORE_ONEDNN": "onednn", "MPCORE_ONEDNN_FLOAT32": "onednn",
                "MPCORE_ONNXRUNTIME": "onnxruntime"}.get(name)
    if provider is not None and not get_plugins().manager.has_plugin(provider):
        pytest.skip(f"the {provider} provider is not registered here")
    errors_before = list(get_plugins().errors)
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as info:
        CpuBackend().kernels()
    assert str(info.value) == f"{name}={value!r} is not valid; valid values: {valid}"
    # the user's mistake, not a plugin failure left for `mpcore info` alone to show
    assert get_plugins().errors == errors_before


class _Shy(CpuBackend):
    name = "shy-settings-test"
    priority = 2000

    def auto_select(self) -> bool:
        return False


class _Broken(CpuBackend):
    name = "broken-settings-test"
    priority = 1000

    def devices(self) -> list:
        raise SettingError("MPCORE_X='y' is not valid; valid values: a, b")


@pytest.fixture
def fresh_detection(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(registry, "_failures", {})
    monkeypatch.setattr(registry, "_current", None)
    yield


def test_nothing_auto_detected_says_how_to_choose_what_is_not_auto_selected(
        monkeypatch: pytest.MonkeyPatch, fresh_detection: None) -> None:
    monkeypatch.setattr(registry, "backends", lambda: [_Shy(), _Broken()])
    with pytest.raises(RuntimeError) as info:
        registry._auto_detect()
    assert str(info.value) == (   # the bad setting first (issue 33)
        "MPCORE_X='y' is not valid; valid values: a, b (it stops the broken-settings-test "
        "backend)\n"
        "no mpcore backend could be auto-detected (one that is not auto-selected may work: "
        "choose it with MPCORE_BACKEND):\n"
        "  shy-settings-test: available but not auto-selected "
        "(MPCORE_BACKEND=shy-settings-test chooses it)\n"
        "  broken-settings-test: failing: SettingError: MPCORE_X='y' is not valid; valid "
        "values: a, b")


def test_nothing_that_works_is_said_so_when_nothing_else_is_available(
        monkeypatch: pytest.MonkeyPatch, fresh_detection: None) -> None:
    monkeypatch.setattr(registry, "backends", lambda: [_Broken()])
    with pytest.raises(RuntimeError) as info:
        registry._auto_detect()
    assert str(info.value) == (   # the bad setting first (issue 33)
        "MPCORE_X='y' is not valid; valid values: a, b (it stops the broken-settings-test "
        "backend)\n"
        "no mpcore backend works here:\n"
        "  broken-settings-test: failing: SettingError: MPCORE_X='y' is not valid; valid "
        "values: a, b")


@pytest.mark.parametrize("value", ["yes", "true", "2", "on"])
def test_strict_plugins_takes_0_or_1_and_is_checked_before_loading(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MPCORE_STRICT_PLUGINS", value)
    plugins = Plugins()
    with pytest.raises(SettingError) as info:
        plugins.load_entry_points()
    assert str(info.value) == (f"MPCORE_STRICT_PLUGINS={value!r} is not valid; "
                               "valid values: 0, 1")
    assert plugins.loaded_groups == set() and plugins.backends == {}


def test_the_commands_show_a_bad_setting_in_one_line() -> None:
    strict = run_mpcore("info", MPCORE_STRICT_PLUGINS="yes")
    assert strict.returncode == 1 and strict.stdout == ""
    assert strict.stderr == "mpcore: MPCORE_STRICT_PLUGINS='yes' is not valid; valid values: 0, 1\n"
    # (no GPU: a working CUDA backend would be auto-detected over the failing cpu)
    pool = run_mpcore("demo", "--epochs", "1", MPCORE_CPU_POOL_MB="abc", CUDA_VISIBLE_DEVICES="")
    assert pool.returncode == 1 and pool.stdout == "" and "Traceback" not in pool.stderr
    assert (f"\n  cpu: failing: SettingError: MPCORE_CPU_POOL_MB='abc' is not valid; valid "
            f"values: {POOL_VALUES}\n") in pool.stderr
    chosen = run_mpcore("demo", "--epochs", "1", MPCORE_BACKEND="cpu",
                        MPCORE_ONNXRUNTIME="bogus")
    assert chosen.returncode == 1 and "Traceback" not in chosen.stderr
    assert chosen.stderr.startswith(
        "mpcore demo: MPCORE_BACKEND=cpu: backend 'cpu' fails on first use: SettingError: "
        "MPCORE_ONNXRUNTIME='bogus' is not valid; valid values: auto, off\n")
