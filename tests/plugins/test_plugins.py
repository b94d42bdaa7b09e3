"""Plugins through real entry points: a temporary ``*.dist-info`` on PYTHONPATH (nothing is
installed) provides a third-party backend, a broken plugin, and a kernel-set plugin; each is
checked in a fresh interpreter, as a user's process would load it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpcore_cpu import CpuBackend

import mpcore as mp
from mpcore.core.backend import Device
from mpcore.plugins.manager import get_plugins


def make_plugin(root: Path, dist: str, entry: str, module: str, source: str) -> None:
    """A distribution ``dist`` whose entry point ``entry`` (group mpcore) is ``module``."""
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[mpcore]\n{entry} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))


def run(root: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MPCORE_BACKEND", "MPCORE_STRICT_PLUGINS")}
    environ["PYTHONPATH"] = os.pathsep.join([str(root), environ.get("PYTHONPATH", "")])
    environ.update(env)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=environ,
                          timeout=120, cwd=root)


def run_json(root: Path, script: str, **env: str) -> dict:
    proc = run(root, ["-c", textwrap.dedent(script)], **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


THIRD_PARTY = """
    import mpcore
    from mpcore_cpu import CpuBackend

    class MineBackend(CpuBackend):
        name = "mine"
        priority = 10          # below cpu: never auto-detected over it

    @mpcore.hookimpl
    def mpcore_backends():
        return [MineBackend()]
"""

BROKEN = """
    raise ImportError("the vendor driver is missing")
"""

BAD_HOOK = """
    import mpcore

    @mpcore.hookimpl
    def mpcore_backends():
        return ["not a backend"]
"""

DUPLICATE = """
    import mpcore
    from mpcore_cpu import CpuBackend

    @mpcore.hookimpl
    def mpcore_backends():
        return [CpuBackend()]   # "cpu" is taken
"""

COUNTING = """
    import mpcore
    from mpcore_cpu import CpuBackend

    calls = {"matmul": 0, "tanh": 0}

    @mpcore.hookimpl
    def mpcore_kernels(backend):
        if not isinstance(backend, CpuBackend):
            return None

        def matmul(a, b, transpose_a, transpose_b):
            calls["matmul"] += 1
            return CpuBackend.matmul(backend, a, b, transpose_a, transpose_b)

        def tanh(x):
            calls["tanh"] += 1
            return CpuBackend.tanh(backend, x)

        return mpcore.KernelSet(provider="counting", kernels={"matmul": matmul, "tanh": tanh},
                                fast_dtypes=frozenset({"bfloat16"}),
                                reason="counting kernels")
"""


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    make_plugin(tmp_path, "thirdparty_backend", "mine", "thirdparty_backend", THIRD_PARTY)
    return tmp_path


def test_third_party_backend_is_found_and_usable(plugin_dir: Path) -> None:
    out = run_json(plugin_dir, """
        import json
        import mpcore as mp
        from mpcore.plugins.manager import get_plugins
        names = [b.name for b in mp.backends()]
        auto = mp.get_backend().name
        be = mp.set_backend("mine")
        x = mp.constant([[1.0, 2.0]])
        y = mp.ops.matmul(x * 3.0, mp.ops.transpose(x))
        with mp.GradientTape() as tape:
            tape.watch(x)
            loss = mp.ops.sum(x * x)
        print(json.dumps({"names": names, "auto": auto, "current": mp.get_backend().name,
                          "y_backend": y.backend.name, "y": y.numpy().tolist(),
                          "grad": tape.gradient(loss, x).numpy().tolist(),
                          "origin": get_plugins().backend_origin["mine"],
                          "errors": [e.plugin for e in mp.plugin_errors()],
                          "verdict": mp.check_policy("float32").backend}))
    """)
    assert "mine" in out["names"] and {"cpu", "cuda", "opencl"} <= set(out["names"])
    assert out["auto"] != "mine"
    assert out["current"] == out["y_backend"] == out["verdict"] == "mine"
    assert out["y"] == [[15.0]]
    assert out["grad"] == [[2.0, 4.0]]
    assert out["origin"] == "mine"
    assert "mine" not in out["errors"]


def test_mpcore_backend_env_selects_the_plugin(plugin_dir: Path) -> None:
    out = run_json(plugin_dir, """
        import json, mpcore as mp
        print(json.dumps({"current": mp.get_backend().name}))
    """, MPCORE_BACKEND="mine")
    assert out["current"] == "mine"


def test_failing_plugins_are_recorded_and_others_keep_working(plugin_dir: Path) -> None:
    make_plugin(plugin_dir, "broken_plugin", "broken", "broken_plugin", BROKEN)
    make_plugin(plugin_dir, "bad_hook_plugin", "badhook", "bad_hook_plugin", BAD_HOOK)
    make_plugin(plugin_dir, "duplicate_plugin", "duplicate", "duplicate_plugin", DUPLICATE)
    # an entry point that takes a built-in's name: recorded, the built-in keeps it
    make_plugin(plugin_dir, "aaa_hijack", "cpu", "aaa_hijack", THIRD_PARTY.replace('"mine"',
                                                                                  '"hijack"'))
    out = run_json(plugin_dir, """
        import json, mpcore as mp
        errors = {e.plugin: [e.target, e.error, e.traceback] for e in mp.plugin_errors()}
        mp.set_backend("mine")
        value = float(mp.ops.sum(mp.constant([1.0, 2.0])))
        print(json.dumps({"errors": errors, "value": value,
                          "names": [b.name for b in mp.backends()],
                          "cpu": type(mp.get_backend("cpu")).__module__}))
    """)
    errors = out["errors"]
    assert set(errors) == {"broken", "badhook", "duplicate", "cpu"}
    assert errors["cpu"][0] == "aaa_hijack"
    assert out["cpu"].startswith("mpcore_cpu") and "hijack" not in out["names"]
    assert errors["broken"][0] == "broken_plugin"
    assert errors["broken"][1] == "ImportError: the vendor driver is missing"
    assert "Traceback" in errors["broken"][2]
    assert "not a Backend" in errors["badhook"][1]
    assert "'cpu'" in errors["duplicate"][1] and "already provided" in errors["duplicate"][1]
    assert out["value"] == 3.0
    assert {"mine", "cpu"} <= set(out["names"])

    info = run(plugin_dir, ["-m", "mpcore", "info"])
    assert info.returncode == 0, info.stderr
    assert "plugins that failed to load" in info.stdout
    assert "broken (broken_plugin): ImportError: the vendor driver is missing" in info.stdout
    as_json = json.loads(run(plugin_dir, ["-m", "mpcore", "info", "--json"]).stdout)
    assert {e["plugin"] for e in as_json["plugin_errors"]} == {"broken", "badhook",
                                                                "duplicate", "cpu"}


def test_strict_plugins_make_a_failure_raise(plugin_dir: Path) -> None:
    make_plugin(plugin_dir, "broken_plugin", "broken", "broken_plugin", BROKEN)
    first_use = "import mpcore as mp; mp.backends()"
    imported = run(plugin_dir, ["-c", "import mpcore"], MPCORE_STRICT_PLUGINS="1")
    assert imported.returncode == 0, "import mpcore loads no plugin: " + imported.stderr
    proc = run(plugin_dir, ["-c", first_use], MPCORE_STRICT_PLUGINS="1")
    assert proc.returncode != 0
    assert "PluginLoadError" in proc.stderr
    assert "broken" in proc.stderr and "the vendor driver is missing" in proc.stderr
    relaxed = run(plugin_dir, ["-c", first_use], MPCORE_STRICT_PLUGINS="0")
    assert relaxed.returncode == 0, relaxed.stderr


def test_kernel_set_plugin_overrides_cpu_kernels(tmp_path: Path) -> None:
    make_plugin(tmp_path, "counting_kernels", "counting", "counting_kernels", COUNTING)
    out = run_json(tmp_path, """
        import json, mpcore as mp
        import counting_kernels
        from mpcore.core.backend import Device
        mp.set_backend("cpu")
        be = mp.get_backend()
        x = mp.constant([[1.0, 2.0], [3.0, 4.0]])
        y = mp.ops.matmul(x, x, transpose_b=True)
        z = mp.ops.tanh(x)
        providers = [ks.provider for ks in be.kernel_sets]
        last_matmul = [ks.provider for ks in be.kernel_sets if "matmul" in ks.kernels][-1]
        here = be.device().features
        described = {}
        for feats in ([], ["avx512_bf16"], ["amx_bf16", "avx512f"], ["avx512_fp16"]):
            dev = Device(name="described", features=frozenset(feats))
            s = be.policy_support("mixed_bfloat16", dev)
            described[",".join(feats)] = [s.fast, s.reason]
        v = mp.check_policy("mixed_bfloat16")
        print(json.dumps({"calls": counting_kernels.calls, "providers": providers,
                          "last_matmul": last_matmul, "y": y.numpy().tolist(),
                          "z": z.numpy().tolist(), "described": described,
                          "fast_here": v.fast, "reason_here": v.reason,
                          "bf16_here": bool({"avx512_bf16", "amx_bf16"} & set(here)),
                          "f16": mp.check_policy("mixed_float16").fast}))
    """)
    assert "counting" in out["providers"]
    assert out["calls"]["tanh"] == 1
    if out["last_matmul"] == "counting":  # unless another installed plugin overrides it too
        assert out["calls"]["matmul"] == 1
    assert out["y"] == [[5.0, 11.0], [11.0, 25.0]]
    d = out["described"]
    assert d[""][0] is False and "counting kernels" in d[""][1]
    assert d["avx512_bf16"][0] is True and "avx512_bf16" in d["avx512_bf16"][1]
    assert d["amx_bf16,avx512f"][0] is True
    assert d["avx512_fp16"][0] is False
    assert out["fast_here"] is out["bf16_here"]      # the verdict flips only with the flags
    assert out["f16"] is False                       # the set names bfloat16 only


def test_in_process_registration_and_hook_docs() -> None:
    """``Plugins.register`` adds a plugin object directly; the hooks are documented."""
    import mpcore.plugins.hookspecs as hookspecs

    for hook in (hookspecs.mpcore_backends, hookspecs.mpcore_kernels):
        assert hook.__doc__ and "Return" in hook.__doc__

    class Other(CpuBackend):
        name = "cpu-in-process-test"

    class Plugin:
        @mp.hookimpl
        def mpcore_backends(self) -> list[mp.Backend]:
            return [Other()]

    plugins = get_plugins()
    plugins.register(Plugin(), name="in-process-test")
    try:
        assert "cpu-in-process-test" in [b.name for b in mp.backends()]
        be = mp.get_backend("cpu-in-process-test")
        x = mp.constant([1.0, 2.0], backend=be)
        assert (x + 1.0).backend is be
        assert be.policy_support("float32", Device(name="x")).fast
    finally:
        plugins.manager.unregister(name="in-process-test")
        plugins.backends.pop("cpu-in-process-test", None)
        plugins.backend_origin.pop("cpu-in-process-test", None)
    assert "cpu-in-process-test" not in [b.name for b in mp.backends()]


def test_kernel_sets_wrap_the_kernel_already_installed_and_a_failing_wrap_is_reported(
        ) -> None:
    """Two providers each take a share of one kernel through ``wraps`` (each hands the rest
    to the kernel it wrapped); a wrap that raises is reported and installs nothing."""

    class Target(CpuBackend):
        name = "cpu-wraps-test"

    seen: list[str] = []

    def wrapper(tag: str) -> Any:
        def wrap(previous: Any) -> Any:
            def tanh(x: Any) -> Any:
                seen.append(tag)
                return previous(x)
            return tanh
        return wrap

    def broken(previous: Any) -> Any:
        raise RuntimeError("no such library")

    class Plugin:
        def __init__(self, tag: str, wrap: Any) -> None:
            self.tag, self.wrap = tag, wrap

        @mp.hookimpl
        def mpcore_kernels(self, backend: mp.Backend) -> mp.KernelSet | None:
            if backend.name != Target.name:
                return None
            return mp.KernelSet(provider=f"wraps-{self.tag}", kernels={"exp": lambda x: x},
                                wraps={"tanh": self.wrap})

    plugins = get_plugins()
    names = ["wraps-a", "wraps-b", "wraps-broken"]
    for name, wrap in zip(names, (wrapper("a"), wrapper("b"), broken)):
        plugins.register(Plugin(name.split("-")[1], wrap), name=name)
    errors_before = len(plugins.errors)
    try:
        be = Target()
        out = be.kernels()["tanh"](np.array([0.5], np.float32))
        assert out == np.tanh(np.float32(0.5))
        assert sorted(seen) == ["a", "b"]                       # each share ran once
        assert sorted(ks.provider for ks in be.kernel_sets) == ["wraps-a", "wraps-b"]
        new = plugins.errors[errors_before:]
        assert [(e.plugin, e.target) for e in new] == [("wraps-broken",
                                                        "mpcore_kernels (wraps)")]
        assert "no such library" in new[0].error
    finally:
        for name in names:
            plugins.manager.unregister(name=name)
        del plugins.errors[errors_before:]


def test_builtin_backends_come_from_entry_points() -> None:
    origins = get_plugins().backend_origin
    assert origins["cpu"] == "cpu" and origins["cuda"] == "cuda"
    assert origins["opencl"] == "opencl"
    import mpcore_cpu

    assert isinstance(mp.get_backend("cpu"), mpcore_cpu.CpuBackend)
    assert issubclass(mpcore_cpu.CpuBackend, mp.Backend)
    core = Path(mp.__file__).parent
    for source in core.glob("*.py"):
        text = source.read_text()
        for name in ("mpcore_cpu", "mpcore_cuda", "mpcore_opencl"):
            assert f"import {name}" not in text and f"from {name}" not in text, source


@pytest.mark.parametrize("first", ["mpcore_cpu", "mpcore_opencl", "mpcore_cuda"])
def test_importing_a_plugin_module_before_mpcore_loses_no_backend(first: str) -> None:
    # `import mpcore_cpu` runs `import mpcore`, which loads the plugins while mpcore_cpu is
    # still half-imported: that plugin must be loaded once its import completes.
    code = (f"import {first}\nimport mpcore as mp\n"
            "assert not mp.plugin_errors(), mp.plugin_errors()\n"
            "assert [b.name for b in mp.backends()] == ['cuda', 'opencl', 'cpu']\n"
            "print(mp.get_backend().name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "MPCORE_BACKEND": "cpu"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cpu"
