"""The ``mpcore`` command: ``mpcore info`` (backends, devices, verdicts) and more.

Every other subcommand comes from a plugin through the ``mpcore_commands`` hook (see
:mod:`mpcore.plugins.hookspecs`): ``mpcore demo`` and ``mpcore conformance`` are entry points of the
group ``mpcore.commands`` like a third party's, so this module names no other module.

``mpcore info`` lists every registered backend, available, not available (why) or failing (how
it failed when first used), its devices, and for each policy whether it is supported and fast
and why; the backend auto-detection chose; and every plugin that failed to load. ``--json``
prints the same for machines; ``--measure`` adds the measured 16-bit vs float32 matmul speed of
every available backend (or the error of a measurement that failed). It is the diagnosis
command, so a wrong configuration (a bad ``MPCORE_BACKEND``) is shown, with every backend, and
ends in exit code 1, not in a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from mpcore.cli.commands import Command, Subcommands
from mpcore.mixed_precision.policy import POLICIES
from mpcore.plugins.extras import installed_version
from mpcore.plugins.manager import COMMANDS_GROUP, PluginError, command_plugins
from mpcore.plugins.settings import SettingError

INFO_HELP = "backends, devices and policy verdicts"


def info_report(measure: bool = False) -> dict[str, Any]:
    """Everything ``mpcore info`` shows, as a dict. It never raises for a backend: a choice
    that cannot be honoured is ``error``, a backend that fails is ``failing``, a measurement
    that fails is that measurement's ``error``."""
    from mpcore.plugins import registry
    from mpcore.plugins.manager import get_plugins, plugin_errors

    report: dict[str, Any] = {"backends": [], "selected": None, "selection": "", "error": None,
                              "plugin_errors": []}
    _select(report)
    origins = get_plugins().backend_origin
    for backend in registry.backends():
        report["backends"].append(_describe(backend, origins.get(backend.name, "?"), measure))
    if report["selected"] is not None and registry.failure(report["selected"]) is not None:
        _select(report)  # describing it found the selected backend failing: choose again
    report["plugin_errors"] = [{"plugin": e.plugin, "target": e.target, "error": e.error}
                               for e in plugin_errors()]
    return report


def _select(report: dict[str, Any]) -> None:
    from mpcore.plugins import registry

    try:
        report["selected"] = registry.get_backend().name
        report["selection"] = registry.detection_note()
        report["error"] = None
    except Exception as exc:  # a bad MPCORE_BACKEND, or nothing works: the rest still shows
        report["selected"], report["selection"], report["error"] = None, "", str(exc)


def _describe(backend: Any, plugin: str, measure: bool) -> dict[str, Any]:
    from mpcore.plugins import registry

    entry: dict[str, Any] = {"name": backend.name, "priority": backend.priority,
                             "plugin": plugin, "status": "not available", "available": False,
                             "reason": None, "devices": [], "policies": {}}
    reason = backend.unavailable_reason()
    if reason is not None:
        entry["reason"] = reason
        entry["install"] = backend.install_advice()
        return entry
    devices: list[dict[str, Any]] = []
    policies: dict[str, Any] = {}
    if registry.failure(backend) is None:
        try:
            devices = [d.describe() for d in backend.devices()]
            device = backend.device()
            policies = {p: backend.policy_support(p, device) for p in POLICIES}
        except Exception as exc:  # a backend that breaks while describing itself is failing
            registry.record_failure(backend, exc)
    measured = _measure(backend) if measure and registry.failure(backend) is None else None
    exc = registry.failure(backend)
    if exc is not None:
        entry.update(status="failing", failing=f"{type(exc).__name__}: {exc}",
                     reason=registry.status(backend))
        return entry
    entry.update(status="available", available=True, devices=devices, policies={
        p: {"supported": s.supported, "fast": s.fast, "reason": s.reason}
        for p, s in policies.items()})
    if measured is not None:
        entry["measured"] = measured
    return entry


def _measure(backend: Any) -> dict[str, dict[str, Any]]:
    """dtype -> the measured matmul speeds, or the error of a measurement that failed."""
    from mpcore.core.backend import KernelBuildError
    from mpcore.mixed_precision.verdict import measure_matmul_speed
    from mpcore.plugins import registry

    measured: dict[str, dict[str, Any]] = {}
    for dtype in ("float16", "bfloat16"):
        try:
            m = measure_matmul_speed(backend, dtype)
        except KernelBuildError as exc:  # not the measurement: the backend is failing
            registry.record_failure(backend, exc)
            return measured
        except Exception as exc:  # reported as a failed measurement, the rest stays
            measured[dtype] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        measured[dtype] = {"n": m.n, "gflops": round(m.gflops, 1),
                           "float32_gflops": round(m.float32_gflops, 1),
                           "speedup": round(m.speedup, 3)}
    return measured


def _indented(text: str, indent: str) -> str:
    """The first line of ``text``, then the others indented (a long error, a build log)."""
    first, *rest = text.strip().splitlines() or [""]
    return "\n".join([first, *(indent + line for line in rest)])


def format_info(report: dict[str, Any]) -> str:
    if report["selected"] is None:
        lines = ["mpcore backends (selected: none)"]
        if report.get("error"):  # its first line; the rest lists the backends, as below
            lines.append("error: " + report["error"].strip().splitlines()[0])
    else:
        lines = [f"mpcore backends (selected: {report['selected']}; {report['selection']})"]
    lines.append("")
    for b in report["backends"]:
        mark = "*" if b["name"] == report["selected"] and b["available"] else " "
        if b.get("status") == "failing":
            lines.append(f"{mark} {b['name']}: " + _indented(b["reason"], "    "))
            continue
        if not b["available"]:
            hint = f" (install with {b['install']})" if b.get("install") else ""
            lines.append(f"{mark} {b['name']}: not available: {b['reason']}{hint}")
            continue
        lines.append(f"{mark} {b['name']}: available (plugin {b['plugin']}, "
                     f"priority {b['priority']})")
        for d in b["devices"]:
            feats = ", ".join(d.get("features", [])) or "-"
            lines.append(f"    device {d['index']}: {d['name']} [{d['kind']}, {d['vendor']}, "
                         f"{d['capability']}] features: {feats}")
        width = max(len(p) for p in b["policies"]) if b["policies"] else 0
        for policy, s in b["policies"].items():
            state = "fast" if s["fast"] else ("supported" if s["supported"] else "unsupported")
            lines.append(f"    {policy:<{width}}  {state:<11}  {s['reason']}")
        for dtype, m in b.get("measured", {}).items():
            if "error" in m:
                lines.append(f"    measured {dtype} matmul: failed: "
                             + _indented(m["error"], "      "))
                continue
            lines.append(f"    measured {dtype} matmul (n={m['n']}): {m['gflops']} GFLOP/s vs "
                         f"float32 {m['float32_gflops']} GFLOP/s = {m['speedup']}x")
    if report["plugin_errors"]:
        lines += ["", "plugins that failed to load:"]
        lines += [f"  {e['plugin']} ({e['target']}): {e['error']}"
                  for e in report["plugin_errors"]]
    return "\n".join(lines)


def _configure_info(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--measure", action="store_true",
                        help="time 16-bit vs float32 matmuls on every available backend")


def _info(args: argparse.Namespace) -> int:
    report = info_report(measure=args.measure)
    print(json.dumps(report, indent=2) if args.json else format_info(report))
    return 0 if report["selected"] is not None else 1  # nothing can compute as configured


def commands() -> tuple[dict[str, Command], list[PluginError]]:
    """``info``, then the commands every plugin adds through the ``mpcore_commands`` hook,
    mpcore's own plugins first (on a name clash the first keeps the name); and the failures
    of the command plugins: one that does not load, or whose hook raises or clashes, is left
    out and the others stay."""
    plugins = command_plugins()
    found = {"info": Command("info", INFO_HELP, _info, _configure_info, "mpcore")}
    failures = list(plugins.load_errors.get(COMMANDS_GROUP, []))
    impls = sorted(plugins.manager.hook.mpcore_commands.get_hookimpls(),
                   key=lambda impl: impl.plugin_name not in plugins.builtin)
    for impl in impls:
        subcommands = Subcommands(impl.plugin_name, found)
        try:
            impl.function(subcommands=subcommands)
        except Exception as exc:  # a broken command plugin must not take the others down
            failures.append(plugins.report_failure(impl.plugin_name, "mpcore_commands", exc))
            continue
        found.update(subcommands.added)
    return found, failures


def main(argv: Sequence[str] | None = None) -> int:
    try:
        available, failures = commands()
    except SettingError as exc:  # a bad MPCORE_STRICT_PLUGINS: one line, not a traceback
        print(f"mpcore: {exc}", file=sys.stderr)
        return 1
    for e in failures:
        print(f"mpcore: plugin {e.plugin!r} ({e.target}) failed: {e.error}; its commands are "
              "left out (mpcore info lists every plugin failure)", file=sys.stderr)
    parser = argparse.ArgumentParser(
        prog="mpcore", description="mixed precision training on any hardware: mpcore info "
        "(backends, devices, verdicts), and the commands of plugins")
    parser.add_argument("--version", action="version", version=f"mpcore {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for command in available.values():
        parsers[command.name] = sub.add_parser(command.name, help=command.help_text,
                                               description=command.help_text)
        command.configure(parsers[command.name])
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # the usage of the parser the arguments were given to: the subcommand's for those after
        # its name (argparse would print the top-level one), mpcore's for those before it (the
        # top level has no option taking a value, so the name is the first bare word)
        at = argv.index(args.command) if args.command in argv else len(argv)
        early = any(u in argv[:at] for u in unknown)
        (parser if early or args.command is None else parsers[args.command]).error(
            f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return available[args.command].run(args)
    except SettingError as exc:  # a bad MPCORE_* value found while the command ran
        print(f"mpcore {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of our output left (``mpcore conformance cpu --json | head``): stop quietly,
    as a Unix tool does, instead of a traceback. Python's recipe: stdout goes to devnull, so
    that the flush at exit does not raise again; 1, as Python exits on EPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


if __name__ == "__main__":
    sys.exit(main())
