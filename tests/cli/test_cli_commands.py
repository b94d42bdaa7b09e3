"""Subcommands of ``mpcore`` come from plugins through the ``mpcore_commands`` hook: a plugin
on the manager or behind an entry point of the group ``mpcore.commands`` adds one, the built-in
``demo`` and ``conformance`` come the same way, a broken command plugin is reported and the
others work, and ``import mpcore`` loads no plugin."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mpcore as mp
from mpcore.cli import app as cli
from mpcore.plugins.manager import COMMANDS_GROUP, command_plugins


class _Hello:
    @mp.hookimpl
    def mpcore_commands(self, subcommands: object) -> None:
        def configure(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("--name", default="world")

        def run(args: argparse.Namespace) -> int:
            print(f"hello {args.name}")
            return 7

        subcommands.add("hello-test", "say hello", run, configure)  # type: ignore[attr-defined]


class _Raises:
    @mp.hookimpl
    def mpcore_commands(self, subcommands: object) -> None:
        subcommands.add("half-added-test", "never seen", lambda args: 0)  # type: ignore
        raise RuntimeError("the plugin broke")


class _TakesDemo:
    @mp.hookimpl
    def mpcore_commands(self, subcommands: object) -> None:
        subcommands.add("demo", "an impostor", lambda args: 0)  # type: ignore[attr-defined]


@pytest.fixture
def registered() -> object:
    """Register plugin objects on the shared manager for one test, then remove them and the
    failures they caused."""
    plugins = command_plugins()
    names: list[str] = []
    errors_before = len(plugins.errors)

    def register(plugin: object, name: str) -> None:
        plugins.manager.register(plugin, name=name)
        names.append(name)

    yield register
    for name in names:
        plugins.manager.unregister(name=name)
    del plugins.errors[errors_before:]


def test_a_plugin_on_the_manager_adds_a_subcommand(registered: object,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    registered(_Hello(), "hello-test")  # type: ignore[operator]
    assert cli.main(["hello-test", "--name", "mpcore"]) == 7
    assert capsys.readouterr().out == "hello mpcore\n"
    assert cli.main([]) == 2
    listing = capsys.readouterr().out
    for name in ("info", "demo", "conformance", "hello-test"):
        assert name in listing
    found, failures = cli.commands()
    assert failures == []
    assert list(found)[:3] == ["info", "conformance", "demo"]  # mpcore's own first
    assert found["hello-test"].plugin == "hello-test"
    assert found["demo"].plugin == "demo" and found["conformance"].plugin == "conformance"


def test_a_broken_command_plugin_is_reported_and_the_others_work(
        registered: object, capsys: pytest.CaptureFixture[str]) -> None:
    registered(_TakesDemo(), "takes-demo-test")  # type: ignore[operator]
    registered(_Raises(), "raises-test")  # type: ignore[operator]
    registered(_Hello(), "hello-test")  # type: ignore[operator]
    assert cli.main(["hello-test"]) == 7
    err = capsys.readouterr().err
    assert ("mpcore: plugin 'raises-test' (mpcore_commands) failed: RuntimeError: the plugin "
            "broke; its commands are left out") in err
    assert ("plugin 'takes-demo-test' (mpcore_commands) failed: ValueError: command name "
            "'demo' is already provided by plugin 'demo'") in err
    found, failures = cli.commands()
    assert [(e.plugin, e.target) for e in failures] == [
        ("takes-demo-test", "mpcore_commands"), ("raises-test", "mpcore_commands")]
    assert "half-added-test" not in found  # nothing of a plugin that raised is kept
    assert found["demo"].plugin == "demo"  # the first keeps the name
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--help"])
    assert exit_info.value.code == 0
    errors = [(e.plugin, e.target) for e in mp.plugin_errors()]
    # reported once however often the command runs in this process
    assert errors.count(("raises-test", "mpcore_commands")) == 1
    assert errors.count(("takes-demo-test", "mpcore_commands")) == 1


def test_add_checks_its_arguments() -> None:
    from mpcore.cli.commands import Subcommands

    subcommands = Subcommands("p", {})
    with pytest.raises(ValueError, match="is not a word"):
        subcommands.add("two words", "x", lambda args: 0)
    with pytest.raises(TypeError, match="must be callables"):
        subcommands.add("x", "x", "not callable")  # type: ignore[arg-type]
    subcommands.add("x", "x", lambda args: 0)
    with pytest.raises(ValueError, match="already provided by plugin 'p'"):
        subcommands.add("x", "again", lambda args: 0)


# --- through entry points, in fresh interpreters ------------------------------------------
HELLO = """
    import mpcore

    @mpcore.hookimpl
    def mpcore_commands(subcommands):
        subcommands.add("hello", "say hello", lambda args: print("hello from a plugin") or 0)
"""

BACKEND_AND_COMMAND = """
    import mpcore
    from mpcore_cpu import CpuBackend

    class Both(CpuBackend):
        name = "both-test"
        priority = 1

    @mpcore.hookimpl
    def mpcore_backends():
        return [Both()]

    @mpcore.hookimpl
    def mpcore_commands(subcommands):
        subcommands.add("both", "from a backend plugin", lambda args: print("both") or 0)
"""


def make_dist(root: Path, dist: str, groups: dict[str, dict[str, str]],
              modules: dict[str, str]) -> None:
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
        for group, entries in groups.items()))
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MPCORE_BACKEND", "MPCORE_STRICT_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=root)


def test_command_plugins_through_entry_points(tmp_path: Path) -> None:
    make_dist(tmp_path, "hello_command", {COMMANDS_GROUP: {"hello": "hello_command"}},
              {"hello_command": HELLO})
    make_dist(tmp_path, "broken_command", {COMMANDS_GROUP: {"broken": "broken_command"}},
              {"broken_command": "raise ImportError('a dependency is missing')\n"})
    make_dist(tmp_path, "both_plugin", {"mpcore": {"both": "both_plugin"},
                                        COMMANDS_GROUP: {"both": "both_plugin"}},
              {"both_plugin": BACKEND_AND_COMMAND})
    proc = run(tmp_path, "-m", "mpcore", "hello")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello from a plugin\n"
    assert ("mpcore: plugin 'broken' (broken_command) failed: ImportError: a dependency is "
            "missing") in proc.stderr
    assert run(tmp_path, "-m", "mpcore", "both").stdout == "both\n"

    listing = run(tmp_path, "-m", "mpcore", "--help").stdout
    for name in ("info", "demo", "conformance", "hello", "both"):
        assert f"\n    {name} " in listing or f"\n    {name}\n" in listing, listing
    assert "``" not in listing                          # plain text, not the docstring's reST
    assert run(tmp_path, "-m", "mpcore", "--version").stdout == f"mpcore {mp.__version__}\n"
    bogus = run(tmp_path, "-m", "mpcore", "demo", "--bogus")    # the subcommand's usage
    assert bogus.returncode == 2 and "\nusage: mpcore demo " in bogus.stderr  # (after a plugin)
    assert bogus.stderr.endswith("mpcore demo: error: unrecognized arguments: --bogus\n")
    early = run(tmp_path, "-m", "mpcore", "--bogus", "info")      # mpcore's own usage
    assert early.returncode == 2 and "\nusage: mpcore [-h] [--version] COMMAND" in early.stderr
    assert early.stderr.endswith("mpcore: error: unrecognized arguments: --bogus\n")

    info = run(tmp_path, "-m", "mpcore", "info", "--json")
    assert info.returncode == 0, info.stderr
    report = json.loads(info.stdout)
    assert [(e["plugin"], e["target"]) for e in report["plugin_errors"]] == [
        ("broken", "broken_command")]
    # a module in both groups is registered once and its backend still comes in
    both = next(b for b in report["backends"] if b["name"] == "both-test")
    assert both["plugin"] == "both" and both["available"] is True


def test_import_mpcore_loads_no_plugin_and_training_loads_no_command() -> None:
    code = textwrap.dedent("""
        import sys
        import mpcore as mp

        def loaded(*prefixes):
            return sorted(m for m in sys.modules if m.startswith(prefixes))

        commands = ("mpcore.cli.demo", "mpcore.conformance")
        assert loaded("mpcore_", *commands) == [], loaded("mpcore_", *commands)
        mp.get_backend("cpu")
        assert loaded(*commands) == [], loaded(*commands)
        from mpcore.cli import app as cli
        cli.commands()
        print(loaded(*commands))
    """)
    env = {k: v for k, v in os.environ.items() if k != "MPCORE_BACKEND"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.strip()
    assert "'mpcore.cli.demo'" in loaded and "'mpcore.conformance.cli'" in loaded
